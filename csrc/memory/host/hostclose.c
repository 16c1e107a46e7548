/* SPDX-License-Identifier: MIT */
/*
 * memory/host/hostclose.c: page-locked, mapped and managed host memory across
 * close() and Device.reset(): copied aside before the primary context is
 * reset and put back at the same addresses after.
 *
 * Locks and the GIL: takes no lock; the GIL guards the list of live
 * owners and the saved runs (cm_hr_pending).  The save gives up the GIL
 * (CM_DRIVER_BEGIN_NOGIL) around cuCtxSynchronize only, repeated while
 * Python callbacks are in flight, and lists the owners again after it.
 * The fault handler (cm_hr_fault) runs on whatever thread faults, with or
 * without the GIL, and touches only atomics, the published ranges and
 * its thread's own last retry.  The restore may sleep, GIL held, up to
 * about a second in all while a mapping another thread made in the hole
 * is there (cm_hr_claim); the test aid's thread touches only its page.
 */
#include "memory/host/host.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* Host memory across close()                                          */
/* ------------------------------------------------------------------ */

/* Resetting a primary context unmaps its page-locked, mapped and managed
 * memory, and NumPy arrays still pointing there would fault.  Before the
 * reset the pages of each live owner of the context are copied (merged
 * into runs: the driver packs small allocations into shared pages);
 * after it an anonymous mapping with the copy is put at the same address
 * if nothing is mapped there, and unmapped when the run's last owner
 * goes.  The arrays keep their contents as ordinary pageable memory. */

typedef struct {
    uintptr_t a;              /* first page */
    uintptr_t b;              /* past the last page */
    cm_hostmem *m;
} cm_hspan;

/* NOTE: guarded by the GIL.  Runs saved, waiting for the reset to end. */
static cm_hrescue **cm_hr_pending;
static Py_ssize_t cm_hr_npending;

/* Other threads may touch these pages without the GIL all along (NumPy
 * releases it around its loops, a[:] = 1 included).  From the save to the
 * restore the runs are read-only, then unmapped by the reset: a thread
 * that faults on one meanwhile waits in cm_hr_fault until the restore has
 * put the pages back, then its access is retried.  A fault taken during
 * a window whose handler runs only after it closed, even after later
 * windows opened, is retried once.
 * Any other fault goes to the handler that was there before.  The
 * handler touches atomics, the published ranges and its thread's own
 * last retry only. */
typedef struct {
    Py_ssize_t n;             /* runs */
    uintptr_t *start;         /* [k]: first byte of run k */
    size_t *len;              /* [k]: its bytes */
} cm_hr_ranges;

static cm_hr_ranges *cm_hr_win;       /* the last window's runs */
/* The runs of the windows before it, the latest CM_HR_KEEP: a thread
 * that faulted during one may run its handler only after later windows
 * replaced cm_hr_win (descheduled between its fault and its handler,
 * under load; seen on the simulator, 2 cores, three suites at once). */
#define CM_HR_KEEP 64
static cm_hr_ranges *cm_hr_past[CM_HR_KEEP];
static unsigned cm_hr_next;           /* the slot the next one takes */
static int cm_hr_window;              /* 1 from save to restore */
static unsigned long cm_hr_serial;    /* windows opened so far */
static int cm_hr_in_fault;            /* threads inside cm_hr_fault */
static struct sigaction cm_hr_old_segv;
static struct sigaction cm_hr_old_bus;
/* The access this thread last retried: (address, window). */
static __thread uintptr_t cm_hr_retried_addr
    __attribute__((tls_model("initial-exec")));
static __thread unsigned long cm_hr_retried_serial
    __attribute__((tls_model("initial-exec")));

static int
cm_hr_in_ranges(const cm_hr_ranges *w, uintptr_t p)
{
    Py_ssize_t k;

    for (k = 0; w != NULL && k < w->n; k++) {
        if (p >= w->start[k] && p - w->start[k] < w->len[k]) {
            return 1;
        }
    }
    return 0;
}

/* Whether p is in the runs of one of the earlier windows kept. */
static int
cm_hr_in_past(uintptr_t p)
{
    int k;

    for (k = 0; k < CM_HR_KEEP; k++) {
        if (cm_hr_in_ranges(__atomic_load_n(&cm_hr_past[k], __ATOMIC_SEQ_CST),
                            p)) {
            return 1;
        }
    }
    return 0;
}

static void
cm_hr_fault(int sig, siginfo_t *si, void *uc)
{
    struct sigaction *old = sig == SIGBUS ? &cm_hr_old_bus
                                          : &cm_hr_old_segv;
    struct timespec ts = {0, 50000};
    int saved_errno = errno;
    uintptr_t p = si != NULL ? (uintptr_t)si->si_addr : 0;
    unsigned long serial;
    int retry = 0;

    (void)__atomic_fetch_add(&cm_hr_in_fault, 1, __ATOMIC_SEQ_CST);
    serial = __atomic_load_n(&cm_hr_serial, __ATOMIC_SEQ_CST);
    if (si != NULL && si->si_code > 0
        && cm_hr_in_ranges(__atomic_load_n(&cm_hr_win, __ATOMIC_SEQ_CST),
                           p)) {
        if (__atomic_load_n(&cm_hr_window, __ATOMIC_SEQ_CST)) {
            while (__atomic_load_n(&cm_hr_window, __ATOMIC_SEQ_CST)) {
                (void)nanosleep(&ts, NULL);
            }
            retry = 1;
        }
        else {
            retry = cm_hr_retried_addr != p
                    || cm_hr_retried_serial != serial;
        }
        cm_hr_retried_addr = p;
        cm_hr_retried_serial = serial;
    }
    else if (si != NULL && si->si_code > 0 && cm_hr_in_past(p)) {
        /* A fault of an earlier window whose handler runs only now: its
         * pages were put back since; the access runs again, once. */
        retry = cm_hr_retried_addr != p || cm_hr_retried_serial != serial;
        cm_hr_retried_addr = p;
        cm_hr_retried_serial = serial;
    }
    (void)__atomic_fetch_sub(&cm_hr_in_fault, 1, __ATOMIC_SEQ_CST);
    errno = saved_errno;
    if (retry) {
        return;     /* the pages are back: the access runs again */
    }
    if (old->sa_flags & SA_SIGINFO) {
        if (old->sa_sigaction != NULL) {
            old->sa_sigaction(sig, si, uc);
            return;
        }
    }
    else if (old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN) {
        old->sa_handler(sig);
        return;
    }
    /* The default action: the access faults again and kills. */
    (void)signal(sig, SIG_DFL);
}

/* Put cm_hr_fault in front of the SIGSEGV and SIGBUS handlers, unless it
 * is there already (a handler installed since, faulthandler's say, is
 * chained to). */
static void
cm_hr_install(void)
{
    struct sigaction sa;
    struct sigaction cur;
    int sigs[2] = {SIGSEGV, SIGBUS};
    struct sigaction *olds[2] = {&cm_hr_old_segv, &cm_hr_old_bus};
    int k;

    for (k = 0; k < 2; k++) {
        if (sigaction(sigs[k], NULL, &cur) != 0
            || ((cur.sa_flags & SA_SIGINFO)
                && cur.sa_sigaction == cm_hr_fault)) {
            continue;
        }
        memset(&sa, 0, sizeof(sa));
        sa.sa_sigaction = cm_hr_fault;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        *olds[k] = cur;
        (void)sigaction(sigs[k], &sa, NULL);
    }
}

/* Wait until no thread is inside the fault handler. */
static void
cm_hr_drain_faults(void)
{
    struct timespec ts = {0, 50000};

    while (__atomic_load_n(&cm_hr_in_fault, __ATOMIC_SEQ_CST) != 0) {
        (void)nanosleep(&ts, NULL);
    }
}

/* Open the window over the runs that spans sp[0..n) (sorted) merge into
 * (GIL held): 0, or -1 when
 * memory is short (nothing is saved then). */
static int
cm_hr_open_window(const cm_hspan *sp, Py_ssize_t n)
{
    cm_hr_ranges *w = PyMem_RawMalloc(sizeof(*w));
    cm_hr_ranges *old;
    Py_ssize_t i;
    Py_ssize_t j;

    if (w == NULL) {
        return -1;
    }
    w->n = 0;
    w->start = PyMem_RawMalloc((size_t)n * sizeof(*w->start));
    w->len = PyMem_RawMalloc((size_t)n * sizeof(*w->len));
    if (w->start == NULL || w->len == NULL) {
        PyMem_RawFree(w->start);
        PyMem_RawFree(w->len);
        PyMem_RawFree(w);
        return -1;
    }
    for (i = 0; i < n; i = j) {
        uintptr_t end = sp[i].b;

        for (j = i + 1; j < n && sp[j].a <= end; j++) {
            end = sp[j].b > end ? sp[j].b : end;
        }
        w->start[w->n] = sp[i].a;
        w->len[w->n] = end - sp[i].a;
        w->n++;
    }
    cm_hr_install();
    old = __atomic_exchange_n(&cm_hr_win, w, __ATOMIC_SEQ_CST);
    /* The last window's runs join the earlier ones kept; the oldest of
     * those goes. */
    old = __atomic_exchange_n(&cm_hr_past[cm_hr_next++ % CM_HR_KEEP], old,
                              __ATOMIC_SEQ_CST);
    (void)__atomic_fetch_add(&cm_hr_serial, 1, __ATOMIC_SEQ_CST);
    /* A handler still reading the ranges that go is done before they go
     * (and none waits while the window is shut). */
    cm_hr_drain_faults();
    __atomic_store_n(&cm_hr_window, 1, __ATOMIC_SEQ_CST);
    if (old != NULL) {
        PyMem_RawFree(old->start);
        PyMem_RawFree(old->len);
        PyMem_RawFree(old);
    }
    return 0;
}

static int
cm_hspan_cmp(const void *x, const void *y)
{
    uintptr_t a = ((const cm_hspan *)x)->a;
    uintptr_t b = ((const cm_hspan *)y)->a;

    return a < b ? -1 : a > b;
}

/* Copy run [a, b) of spans sp[i..j) aside; on failure their owners are
 * left as they are (their memory goes with the context). */
static void
cm_hr_save_run(cm_hspan *sp, Py_ssize_t i, Py_ssize_t j)
{
    cm_hrescue *r = PyMem_RawMalloc(sizeof(*r));
    uintptr_t b = sp[i].b;
    Py_ssize_t k;

    for (k = i; k < j; k++) {
        b = sp[k].b > b ? sp[k].b : b;
    }
    if (r == NULL) {
        return;
    }
    r->start = sp[i].a;
    r->len = b - sp[i].a;
    r->save = mmap(NULL, r->len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r->save == MAP_FAILED) {
        PyMem_RawFree(r);
        return;
    }
    r->refs = j - i;
    for (k = i; k < j; k++) {
        sp[k].m->rescue = r;
    }
    cm_hr_pending[cm_hr_npending++] = r;
    /* Writers without the GIL now wait for the restore (a mapping of the
     * driver's that refuses this just keeps its late writes out of the
     * copy). */
    (void)mprotect((void *)r->start, r->len, PROT_READ);
    memcpy(r->save, (void *)r->start, r->len);
}

/* Whether an owner of context a loses its memory when closing context b
 * is reset: a is b, or a live Context of the same primary context (a
 * thread may have made one while close() released the GIL).  Owners of
 * dead contexts are not: their memory went before (a new primary context
 * may have the old one's handle). */
static int
cm_hm_same_primary(cm_context *a, cm_context *b)
{
    return a == b || (a->alive && a->device == b->device
                      && a->handle == b->handle);
}

int
cm_hostmem_context_save(cm_context *ctx)
{
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    cm_hostmem *m;
    cm_hspan *sp;
    Py_ssize_t n = 0;
    Py_ssize_t i;
    Py_ssize_t j;
    int pushed;
    int tries;

    /* The pool's free blocks go first (the reset would free their memory
     * too, unless another user keeps the primary context). */
    if (cm_hpool_trim_as(ctx, 1) < 0) {
        PyErr_WriteUnraisable((PyObject *)ctx);
    }
    for (m = cm_hm_live; m != NULL && n == 0; m = m->next) {
        n += cm_hm_same_primary(m->ctx, ctx) && m->rescue == NULL;
    }
    if (n == 0 || cm_hr_pending != NULL) {
        return 0;
    }
    /* Work still queued may write the memory (or, managed, hold it on the
     * device), and the reset, made with the GIL held, must not wait for a
     * callback that needs it: let all of it finish.  Other threads may
     * queue more meanwhile, so this repeats (a few times at most), and
     * the owners are listed after.  A failed context keeps its pages. */
    for (tries = 0;; tries++) {
        CM_DRIVER_BEGIN_NOGIL
        if (cm_ctx_enter(ctx->handle, &pushed) == CUDA_SUCCESS) {
            (void)CM_CU_RAW(CtxSynchronize, ());
            cm_ctx_leave(pushed);
        }
        CM_DRIVER_END_NOGIL
        if (ctx->pycalls <= 0) {
            break;
        }
        if (tries == 100) {
            return 0;   /* callbacks keep coming: do without */
        }
    }
    n = 0;
    for (m = cm_hm_live; m != NULL; m = m->next) {
        n += cm_hm_same_primary(m->ctx, ctx) && m->rescue == NULL;
    }
    if (n == 0) {
        return 0;
    }
    sp = PyMem_RawMalloc((size_t)n * sizeof(*sp));
    cm_hr_pending = PyMem_RawMalloc((size_t)n * sizeof(*cm_hr_pending));
    if (sp == NULL || cm_hr_pending == NULL) {
        PyMem_RawFree(sp);
        PyMem_RawFree(cm_hr_pending);
        cm_hr_pending = NULL;
        return 0;
    }
    cm_hr_npending = 0;
    n = 0;
    for (m = cm_hm_live; m != NULL; m = m->next) {
        if (cm_hm_same_primary(m->ctx, ctx) && m->rescue == NULL) {
            sp[n].a = m->host & ~(pg - 1);
            sp[n].b = (m->host + m->size + pg - 1) & ~(pg - 1);
            sp[n].m = m;
            n++;
        }
    }
    qsort(sp, (size_t)n, sizeof(*sp), cm_hspan_cmp);
    if (cm_hr_open_window(sp, n) < 0) {
        PyMem_RawFree(sp);
        PyMem_RawFree(cm_hr_pending);
        cm_hr_pending = NULL;
        return 0;
    }
    for (i = 0; i < n; i = j) {
        uintptr_t end = sp[i].b;

        for (j = i + 1; j < n && sp[j].a <= end; j++) {
            end = sp[j].b > end ? sp[j].b : end;
        }
        cm_hr_save_run(sp, i, j);
    }
    PyMem_RawFree(sp);
    if (cm_hr_npending == 0) {
        __atomic_store_n(&cm_hr_window, 0, __ATOMIC_SEQ_CST);
        cm_hr_drain_faults();
        PyMem_RawFree(cm_hr_pending);
        cm_hr_pending = NULL;
        return 0;
    }
    return 1;
}

/* Whether [a, a + len) is mapped all through, read-only, as the save
 * left the driver's pages (the driver kept them through the reset),
 * from /proc/self/maps; 0 when any of it is unmapped or mapped
 * otherwise (another mapping took part of the hole), or unknown. */
static int
cm_hr_still_saved(uintptr_t a, size_t len)
{
    FILE *f = fopen("/proc/self/maps", "r");
    uintptr_t end = a + len;
    uintptr_t at = a;
    char line[512];
    int ok = 0;

    if (f == NULL) {
        return 0;
    }
    while (at < end && fgets(line, sizeof(line), f) != NULL) {
        unsigned long lo, hi;
        char perms[8];

        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3
            || hi <= at) {
            continue;
        }
        if (lo > at || perms[0] != 'r' || perms[1] != '-') {
            break;
        }
        at = hi;
    }
    ok = at >= end;
    fclose(f);
    return ok;
}

/* Test aid (_restore_hole_taken): milliseconds for which the next
 * restore finds the first page of its first run taken by a mapping a
 * thread then unmaps, as one of a thread ending may be; 0: none. */
static long cm_hr_test_taken_ms;

static void *
cm_hr_test_untake(void *arg)
{
    struct timespec t;
    void **a = arg;

    t.tv_sec = (time_t)((long)(uintptr_t)a[1] / 1000);
    t.tv_nsec = ((long)(uintptr_t)a[1] % 1000) * 1000000L;
    nanosleep(&t, NULL);
    (void)munmap(a[0], (size_t)sysconf(_SC_PAGESIZE));
    free(a);
    return NULL;
}

static void
cm_hr_test_take(uintptr_t start)
{
    long ms = cm_hr_test_taken_ms;
    void **a;
    void *p;
    pthread_t t;

    cm_hr_test_taken_ms = 0;
    p = mmap((void *)start, (size_t)sysconf(_SC_PAGESIZE),
             PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (p != (void *)start) {
        if (p != MAP_FAILED) {
            (void)munmap(p, (size_t)sysconf(_SC_PAGESIZE));
        }
        return;
    }
    a = malloc(2 * sizeof(*a));
    if (a == NULL) {
        (void)munmap(p, (size_t)sysconf(_SC_PAGESIZE));
        return;
    }
    a[0] = p;
    a[1] = (void *)(uintptr_t)ms;
    if (pthread_create(&t, NULL, cm_hr_test_untake, a) != 0) {
        (void)munmap(p, (size_t)sysconf(_SC_PAGESIZE));
        free(a);
        return;
    }
    (void)pthread_detach(t);
}

PyDoc_STRVAR(cm_hr_test_doc,
"_restore_hole_taken(ms, /)\n--\n\n"
"Test aid: the next put-back of host memory after a reset (close())\n"
"finds the first page of its first run taken by another mapping, which a\n"
"thread unmaps ms milliseconds later.");

static PyObject *
cm_hr_test_fn(PyObject *mod, PyObject *arg)
{
    long ms = PyLong_AsLong(arg);

    (void)mod;
    if (ms == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (ms < 0 || ms > 10000) {
        PyErr_SetString(PyExc_ValueError,
                        "_restore_hole_taken: ms from 0 to 10000");
        return NULL;
    }
    cm_hr_test_taken_ms = ms;
    Py_RETURN_NONE;
}

static PyMethodDef cm_hostclose_functions[] = {
    {"_restore_hole_taken", cm_hr_test_fn, METH_O, cm_hr_test_doc},
    {NULL, NULL, 0, NULL},
};

int
cm_hostclose_add_functions(PyObject *mod)
{
    return PyModule_AddFunctions(mod, cm_hostclose_functions);
}

/* Put the saved run r back at its address: the mapping claimed (PROT_NONE,
 * never over another), or MAP_FAILED.  A mapping that took part of the
 * hole between the reset and now (a thread's stack or its sanitizer's
 * pages, made and gone as a thread ends) is waited out, up to about a
 * second; the driver's own pages, kept through the reset, are not. */
static void *
cm_hr_claim(cm_hrescue *r)
{
    struct timespec ms = {0, 1000000};
    void *p = MAP_FAILED;
    int tries;

    for (tries = 0; tries < 1000; tries++) {
        p = mmap((void *)r->start, r->len, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        if (p != MAP_FAILED || errno != EEXIST
            || cm_hr_still_saved(r->start, r->len)) {
            break;
        }
        nanosleep(&ms, NULL);
    }
    return p;
}

void
cm_hostmem_context_restore(cm_context *ctx)
{
    Py_ssize_t i;

    (void)ctx;
    if (cm_hr_pending == NULL) {
        return;
    }
    if (cm_hr_test_taken_ms > 0 && cm_hr_npending > 0) {
        cm_hr_test_take(cm_hr_pending[0]->start);
    }
    /* First every run goes back, then the window closes: a thread
     * waiting in the fault handler retries only once all are back. */
    for (i = 0; i < cm_hr_npending; i++) {
        cm_hrescue *r = cm_hr_pending[i];
        void *p;

        if (r->refs == 0) {
            continue;
        }
        /* Claimed inaccessible first, so that a thread reaching these
         * pages before the copy is in place faults and waits rather than
         * seeing (or writing into) fresh zero pages; the copy then
         * replaces the claim in one step. */
        p = cm_hr_claim(r);
        if (p == (void *)r->start) {
            if (mremap(r->save, r->len, r->len,
                       MREMAP_MAYMOVE | MREMAP_FIXED, p) == MAP_FAILED) {
                (void)mprotect(p, r->len, PROT_READ | PROT_WRITE);
                memcpy(p, r->save, r->len);
                (void)munmap(r->save, r->len);
            }
            r->save = NULL;
            continue;
        }
        /* Something is still mapped there (the driver kept the memory),
         * or a kernel without MAP_FIXED_NOREPLACE put it elsewhere: the
         * owners keep what is there, writable again. */
        if (p != MAP_FAILED) {
            (void)munmap(p, r->len);
        }
        (void)mprotect((void *)r->start, r->len, PROT_READ | PROT_WRITE);
    }
    /* Threads waiting in the fault handler retry now. */
    __atomic_store_n(&cm_hr_window, 0, __ATOMIC_SEQ_CST);
    for (i = 0; i < cm_hr_npending; i++) {
        cm_hrescue *r = cm_hr_pending[i];
        cm_hostmem *m;

        if (r->refs == 0) {
            /* Its arrays went while the context was being reset. */
            (void)munmap(r->save, r->len);
            PyMem_RawFree(r);
            continue;
        }
        if (r->save == NULL) {
            continue;   /* back in place */
        }
        (void)munmap(r->save, r->len);
        for (m = cm_hm_live; m != NULL; m = m->next) {
            if (m->rescue == r) {
                m->rescue = NULL;
            }
        }
        PyMem_RawFree(r);
    }
    PyMem_RawFree(cm_hr_pending);
    cm_hr_pending = NULL;
    cm_hr_npending = 0;
}

/* A new owner of size bytes of kind in the current context.  Size 0
 * allocates nothing. */
cm_hostmem *
cm_hm_new(int kind, size_t size, unsigned int flags, PyObject *stream)
{
    cm_context *ctx = cm_context_current();
    cm_hostmem *m;
    int err;

    if (ctx == NULL) {
        return NULL;
    }
    m = cm_hm_empty(ctx, kind, size, flags, stream);
    if (m == NULL) {
        return NULL;
    }
    if (size == 0) {
        return m;
    }
    err = cm_mm_uses_plugin(ctx) ? cm_hm_alloc_plugin(m) : cm_hm_alloc_default(m);
    if (err < 0) {
        Py_DECREF(m);
        return NULL;
    }
    if (m->plugin_mem == NULL && m->host != 0) {
        cm_hm_link(m);
    }
    return m;
}

static int
cm_hm_getbuffer(PyObject *self, Py_buffer *view, int flags)
{
    cm_hostmem *m = (cm_hostmem *)self;

    return PyBuffer_FillInfo(view, self, (void *)m->host,
                             m->host ? (Py_ssize_t)m->size : 0, 0, flags);
}

static PyObject *
cm_hm_get_host(PyObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromSize_t(((cm_hostmem *)self)->host);
}

static PyObject *
cm_hm_get_dptr(PyObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromUnsignedLongLong(((cm_hostmem *)self)->dptr);
}

static PyObject *
cm_hm_get_dptr_value(PyObject *self, void *unused)
{
    cm_hostmem *m = (cm_hostmem *)self;

    (void)unused;
    if (m->dptr == 0) {
        Py_RETURN_NONE;
    }
    return PyLong_FromUnsignedLongLong(m->dptr);
}

static PyObject *
cm_hm_get_handle(PyObject *self, void *unused)
{
    cm_hostmem *m = (cm_hostmem *)self;

    (void)unused;
    return PyLong_FromSize_t(m->kind == CM_HM_MANAGED ? (size_t)m->dptr
                                                      : m->host);
}

static PyObject *
cm_hm_get_size(PyObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromSize_t(((cm_hostmem *)self)->size);
}

static PyObject *
cm_hm_get_kind(PyObject *self, void *unused)
{
    (void)unused;
    return PyUnicode_FromString(
        cm_hm_kind_names[((cm_hostmem *)self)->kind]);
}

static PyObject *
cm_hm_get_flags(PyObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromUnsignedLong(((cm_hostmem *)self)->flags);
}

static PyObject *
cm_hm_get_pooled(PyObject *self, void *unused)
{
    (void)unused;
    return PyBool_FromLong(((cm_hostmem *)self)->block != NULL);
}

static PyObject *
cm_hm_get_context(PyObject *self, void *unused)
{
    (void)unused;
    return Py_NewRef(((cm_hostmem *)self)->ctx);
}

static PyObject *
cm_hm_get_owner(PyObject *self, void *unused)
{
    cm_hostmem *m = (cm_hostmem *)self;

    (void)unused;
    return Py_NewRef(m->plugin_mem != NULL ? m->plugin_mem : self);
}

static PyObject *
cm_hm_get_stream(PyObject *self, void *unused)
{
    (void)unused;
    return Py_NewRef(((cm_hostmem *)self)->stream);
}

static int
cm_hm_set_stream(PyObject *self, PyObject *value, void *unused)
{
    CUstream h;

    (void)unused;
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete stream");
        return -1;
    }
    if (value == Py_None) {
        value = cm_hm_zero;
    }
    else if (cm_stream_resolve(value, &h) < 0) {
        return -1;
    }
    Py_SETREF(((cm_hostmem *)self)->stream, Py_NewRef(value));
    return 0;
}

static PyGetSetDef cm_hm_getset[] = {
    {"host_pointer", cm_hm_get_host, NULL, "The host address, as an int.",
     NULL},
    {"device_pointer", cm_hm_get_dptr, NULL,
     "The device address (0 for pinned memory).", NULL},
    {"device_pointer_value", cm_hm_get_dptr_value, NULL,
     "The device address, or None.", NULL},
    {"handle", cm_hm_get_handle, NULL,
     "The host address (the managed address for managed memory).", NULL},
    {"size", cm_hm_get_size, NULL, "Bytes allocated for the arrays.", NULL},
    {"kind", cm_hm_get_kind, NULL, "'pinned', 'mapped' or 'managed'.",
     NULL},
    {"flags", cm_hm_get_flags, NULL,
     "The cuMemHostAlloc (or cuMemAllocManaged) flags used.", NULL},
    {"pooled", cm_hm_get_pooled, NULL,
     "Whether the memory is a block of the pinned pool.", NULL},
    {"context", cm_hm_get_context, NULL, "The Context it belongs to.",
     NULL},
    {"owner", cm_hm_get_owner, NULL,
     "What owns the memory: this object, or a plugin's pointer.", NULL},
    {"stream", cm_hm_get_stream, cm_hm_set_stream,
     "The stream arrays on this memory are bound to.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef cm_hm_members[] = {
    {"__weaklistoffset__", Py_T_PYSSIZET,
     offsetof(cm_hostmem, weakreflist), Py_READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(cm_hm_doc,
"One page-locked, mapped or managed host allocation: the base of the\n"
"arrays made on it, and a buffer over its bytes.  Its memory is released\n"
"(through the context's deferred queue, or back to the pinned pool) when\n"
"the last array goes.");

static PyType_Slot cm_hm_slots[] = {
    {Py_tp_doc, (void *)cm_hm_doc},
    {Py_tp_dealloc, cm_hm_dealloc},
    {Py_tp_traverse, cm_hm_traverse},
    {Py_tp_clear, cm_hm_clear},
    {Py_tp_getset, cm_hm_getset},
    {Py_tp_members, cm_hm_members},
    {Py_bf_getbuffer, cm_hm_getbuffer},
    {0, NULL},
};

PyType_Spec cm_hm_spec = {
    .name = "cudamem.HostAllocation",
    .basicsize = sizeof(cm_hostmem),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC
             | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = cm_hm_slots,
};
