/* SPDX-License-Identifier: MIT */
/*
 * context/callbacks.c: driver threads and deferred releases, the cache of
 * idle streams, host calls, add_callback and the GIL-free completion
 * path behind async_done() and await event.
 *
 * Two ways of running host code after a stream's preceding work:
 *
 * - add_callback: a Python callable run on the driver's callback thread,
 *   which takes the GIL (PyGILState_Ensure) unless the interpreter is
 *   exiting;
 * - the GIL-free completion path behind Stream.async_done() and
 *   `await event`: the host function only appends a record to a per-loop
 *   notifier and signals its eventfd (a pipe off Linux); the asyncio loop
 *   reads the fd and resolves the futures on its own thread.
 *
 * It also owns the recycling of stream handles: a stream made by cudamem
 * that is idle when its Stream object goes (cuStreamQuery succeeds) is
 * not destroyed but kept on its context's list (cm_context.stream_cache,
 * at most CUDA_STREAM_CACHE_SIZE of them), and a later stream() of that
 * context with the same flags and priority takes it instead of calling
 * cuStreamCreate.  Idle means all its work, host callbacks included, has
 * finished; a callback or asyncio waiter of cudamem's holds a strong
 * reference to its Stream until it has run, so none is pending then.
 * The lists are emptied, their streams destroyed, by close, reset and
 * the exit hook; a forked child neither keeps nor takes a handle.
 *
 * Locks and the GIL: everything Python runs with the GIL held.  One lock:
 * each notifier's pthread mutex (cm_mu_lock), which guards its list of
 * completed waiters; the driver thread takes it without the GIL
 * (cm_waiter_run) and the loop thread with it (_drain); no other lock
 * nests in it and nothing under it calls Python or the driver (only the
 * fd's write).  The kept streams are guarded by the GIL: taking and
 * keeping one never release it (CM_CU_RAW_HELD; nothing is kept while
 * Python callbacks are in flight), and emptying a list takes its entries
 * out before the GIL is released around the destroys
 * (CM_DRIVER_BEGIN_NOGIL).  The GIL is also released around the enqueue
 * of a waiter (the driver owns it from then on) and while the exit hook
 * waits for the callbacks inside.  A Python callback runs on the driver
 * thread, which has no GIL until cm_pycall_run takes it.
 */
#include "context/stream.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/uio.h>


/* asyncio.get_running_loop, and the WeakKeyDictionary loop -> notifier;
 * both made on first use, kept in the module state. */
#define cm_get_running_loop (cm_st->get_running_loop)
#define cm_notifiers (cm_st->notifiers)

/* ------------------------------------------------------------------ */
/* Driver threads, interpreter exit and deferred releases              */
/* ------------------------------------------------------------------ */

/* How deep the calling thread is inside a cudamem host callback. */
static _Thread_local int cm_driver_depth;

/* NOTE: both read and written with sequentially consistent atomics: a
 * callback increments cm_callbacks_inside, then reads cm_exiting; the
 * atexit hook sets cm_exiting, then waits for cm_callbacks_inside to
 * drain.  So no callback touches Python once finalisation may start. */
static int cm_exiting;
static int cm_callbacks_inside;

int
cm_on_driver_thread(void)
{
    return cm_driver_depth > 0;
}

/* Called on a driver thread before taking the GIL: 1 if Python may be
 * entered (then cm_python_leave must follow), 0 if the interpreter is
 * exiting and the callback must do nothing. */
static int
cm_python_enter(void)
{
    __atomic_add_fetch(&cm_callbacks_inside, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&cm_exiting, __ATOMIC_SEQ_CST) || Py_IsFinalizing()) {
        __atomic_sub_fetch(&cm_callbacks_inside, 1, __ATOMIC_SEQ_CST);
        return 0;
    }
    return 1;
}

static void
cm_python_leave(void)
{
    __atomic_sub_fetch(&cm_callbacks_inside, 1, __ATOMIC_SEQ_CST);
}

/* Release a stream or event handle of ctx through the context's queue of
 * pending destroys (docs/api.md#deferred-deallocation): it is destroyed
 * when the queue flushes, never on a driver callback thread, where the
 * driver forbids API calls.  A dead context or a forked child frees
 * nothing.  GIL held; never fails. */
int
cm_handle_release(cm_context *ctx, int is_event, void *handle)
{
    cm_ctx_up.ctx_release(ctx, is_event ? CM_REL_EVENT : CM_REL_STREAM,
                   (uintptr_t)handle, 0);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Recycling: idle streams kept per context                            */
/* ------------------------------------------------------------------ */

/* How many idle streams a context keeps (config.CUDA_STREAM_CACHE_SIZE,
 * 0..CM_STREAM_CACHE_MAX); 0 destroys every dropped stream. */
static int cm_stream_cache_cap = CM_STREAM_CACHE_MAX;

/* Keep the handle of s (a stream cudamem made, being deallocated) on its
 * context's list if it is idle and there is room: 1 if kept, 0 if the
 * caller must release it.  Not on a driver callback thread (the driver
 * forbids the query there), while a capture forbids this thread the
 * query (the stream goes the deferred way), in a dead context, a forked
 * child or once the exit hook ran.  GIL held; never blocks, never
 * raises. */
int
cm_stream_cache_put(cm_stream *s)
{
    cm_context *ctx = s->ctx;
    cm_stream_slot *slot;
    CUcontext cur = NULL;
    CUcontext popped;
    CUresult rc;
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    int pushed = 0;
    int relaxed;

    /* The cache is checked, then filled: the GIL stays held between,
     * and while Python callbacks are in flight nothing is cached (the
     * stream is destroyed instead). */
    if (ctx->n_stream_cache >= cm_stream_cache_cap || !ctx->alive
        || cm_forked || __atomic_load_n(&cm_exiting, __ATOMIC_SEQ_CST)
        || cm_on_driver_thread() || cm_gil_yield_needed()
        || cm_capture_restricted()) {
        return 0;
    }
    if (CM_CU_RAW_HELD(CtxGetCurrent, (&cur)) != CUDA_SUCCESS
        || cur != ctx->handle) {
        if (CM_CU_RAW_HELD(CtxPushCurrent, (ctx->handle)) != CUDA_SUCCESS) {
            return 0;
        }
        pushed = 1;
    }
    /* A capture another library began, which cudamem does not know of:
     * a capturing stream is not idle (its query would be refused and
     * that capture invalidated), and the query of an idle one runs in
     * the relaxed capture mode, which a global-mode capture would refuse
     * too. */
    rc = CM_CU_RAW_HELD(StreamIsCapturing, (s->handle, &status));
    if (rc == CUDA_SUCCESS && status == CU_STREAM_CAPTURE_STATUS_NONE) {
        cm_capture_relax_held(&relaxed);
        rc = CM_CU_RAW_HELD(StreamQuery, (s->handle));
        cm_capture_unrelax_held(relaxed);
    }
    else if (rc == CUDA_SUCCESS) {
        rc = CUDA_ERROR_NOT_READY;
    }
    if (pushed) {
        (void)CM_CU_RAW_HELD(CtxPopCurrent, (&popped));
    }
    if (rc != CUDA_SUCCESS) {
        return 0;  /* busy (CUDA_ERROR_NOT_READY) or failed: destroy it */
    }
    slot = &ctx->stream_cache[ctx->n_stream_cache++];
    slot->handle = s->handle;
    slot->flags = s->flags;
    slot->priority = s->priority;
    return 1;
}

/* Take the newest kept stream of ctx made with flags and priority, or
 * NULL if none.  GIL held. */
CUstream
cm_stream_cache_take(cm_context *ctx, unsigned int flags, int priority)
{
    cm_stream_slot *c = ctx->stream_cache;
    CUstream h;
    int i;

    if (cm_forked) {
        return NULL;
    }
    for (i = ctx->n_stream_cache - 1; i >= 0; i--) {
        if (c[i].flags == flags && c[i].priority == priority) {
            h = c[i].handle;
            memmove(&c[i], &c[i + 1],
                    (size_t)(ctx->n_stream_cache - 1 - i) * sizeof(*c));
            ctx->n_stream_cache--;
            return h;
        }
    }
    return NULL;
}

void
cm_stream_cache_clear(cm_context *ctx)
{
    cm_stream_slot slots[CM_STREAM_CACHE_MAX];
    CUcontext h = ctx->handle;
    CUcontext cur = NULL;
    CUcontext popped;
    CUresult rc;
    CUresult first = CUDA_SUCCESS;
    const char *fn = "cuStreamDestroy";
    int n = ctx->n_stream_cache;
    int pushed = 0;
    int i;

    /* Taken out first: other threads may keep and take streams of ctx
     * while the GIL is released below.  A forked child only forgets. */
    memcpy(slots, ctx->stream_cache, (size_t)n * sizeof(slots[0]));
    ctx->n_stream_cache = 0;
    if (n == 0 || cm_forked) {
        return;
    }
    CM_DRIVER_BEGIN_NOGIL
    if (CM_CU_RAW(CtxGetCurrent, (&cur)) != CUDA_SUCCESS || cur != h) {
        first = CM_CU_RAW(CtxPushCurrent, (h));
        pushed = first == CUDA_SUCCESS;
        fn = "cuCtxPushCurrent";
    }
    for (i = 0; (cur == h || pushed) && i < n; i++) {
        rc = CM_CU_RAW(StreamDestroy, (slots[i].handle));
        if (rc != CUDA_SUCCESS && first == CUDA_SUCCESS) {
            first = rc;  /* reported below; the rest are still destroyed */
            fn = "cuStreamDestroy";
        }
    }
    if (pushed) {
        (void)CM_CU_RAW(CtxPopCurrent, (&popped));
    }
    CM_DRIVER_END_NOGIL
    if (first != CUDA_SUCCESS) {
        PyObject *exc = PyErr_GetRaisedException();

        cm_raise_cu(first, fn);
        PyErr_WriteUnraisable((PyObject *)ctx);
        PyErr_SetRaisedException(exc);
    }
}

const char cm_set_stream_cache_size_doc[] = PyDoc_STR(
"_set_stream_cache_size(size)\n--\n\n"
"How many idle dropped streams each context keeps for reuse "
"(config.CUDA_STREAM_CACHE_SIZE, 0 to 16); 0 destroys every dropped "
"stream.  Streams kept already stay until reused or destroyed with their "
"context.");

PyObject *
cm_set_stream_cache_size(PyObject *mod, PyObject *arg)
{
    long n = PyLong_AsLong(arg);

    (void)mod;
    if (n == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (n < 0 || n > CM_STREAM_CACHE_MAX) {
        PyErr_Format(PyExc_ValueError,
                     "CUDA_STREAM_CACHE_SIZE must be between 0 and %d, not "
                     "%ld", CM_STREAM_CACHE_MAX, n);
        return NULL;
    }
    cm_stream_cache_cap = (int)n;
    Py_RETURN_NONE;
}

const char cm_stream_cache_doc[] = PyDoc_STR(
"_stream_cache(ctx)\n--\n\n"
"The handles (ints) of the idle streams ctx keeps for reuse, oldest "
"first (tests only).");

PyObject *
cm_stream_cache_fn(PyObject *mod, PyObject *arg)
{
    cm_context *ctx = (cm_context *)arg;
    PyObject *r;
    PyObject *h;
    int i;

    (void)mod;
    if (!PyObject_TypeCheck(arg, cm_st->Context_type)) {
        PyErr_Format(PyExc_TypeError, "expected a Context, got %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    r = PyList_New(ctx->n_stream_cache);
    if (r == NULL) {
        return NULL;
    }
    for (i = 0; i < ctx->n_stream_cache; i++) {
        h = PyLong_FromVoidPtr((void *)ctx->stream_cache[i].handle);
        if (h == NULL) {
            Py_DECREF(r);
            return NULL;
        }
        PyList_SET_ITEM(r, i, h);  /* steals h */
    }
    return r;
}

const char cm_callbacks_atexit_doc[] = PyDoc_STR(
"_callbacks_atexit()\n--\n\n"
"Registered with atexit: from now on host callbacks do not enter Python "
"and dropped streams are not kept; waits (up to 10 s, GIL released) for "
"the callbacks already inside, then destroys the streams every context "
"keeps for reuse.");

PyObject *
cm_callbacks_atexit(PyObject *mod, PyObject *unused)
{
    cm_context *live[CM_MAX_DEVICES];
    int n;
    int i;

    (void)mod;
    (void)unused;
    __atomic_store_n(&cm_exiting, 1, __ATOMIC_SEQ_CST);
    Py_BEGIN_ALLOW_THREADS
    for (i = 0; i < 10000
                && __atomic_load_n(&cm_callbacks_inside, __ATOMIC_SEQ_CST);
         i++) {
        usleep(1000);
    }
    Py_END_ALLOW_THREADS
    /* Held across the GIL releases inside: another thread may close a
     * context meanwhile. */
    n = cm_context_live(live);
    for (i = 0; i < n; i++) {
        Py_INCREF(live[i]);
    }
    for (i = 0; i < n; i++) {
        cm_stream_cache_clear(live[i]);
        Py_DECREF(live[i]);
    }
    Py_RETURN_NONE;
}

static void CUDA_CB
cm_hostcall_stream_cb(CUstream stream, CUresult status, void *data)
{
    cm_hostcall *hc = data;

    (void)stream;
    hc->run(hc, status);
}

static void CUDA_CB
cm_hostcall_fn(void *data)
{
    cm_hostcall *hc = data;

    hc->run(hc, CUDA_SUCCESS);
}

/* Enqueue hc on stream h: cuStreamAddCallback (which reports the stream's
 * status), else cuLaunchHostFunc.  Runs without the GIL; on success the
 * driver owns hc until it has run.  *fn names the entry point used. */
CUresult
cm_hostcall_enqueue(CUstream h, cm_hostcall *hc, const char **fn)
{
    if (cm_cu.StreamAddCallback != NULL) {
        *fn = "cuStreamAddCallback";
        return CM_CU_CALL_(StreamAddCallback,
                           (h, cm_hostcall_stream_cb, hc, 0));
    }
    *fn = "cuLaunchHostFunc";
    return CM_CU_RAW(LaunchHostFunc, (h, cm_hostcall_fn, hc));
}

/* Report the exception a callback raised: a warning, as in numba, or an
 * unraisable report when the warning itself fails or the exception is not
 * an Exception.  GIL held. */
static void
cm_pycall_report(PyObject *callback)
{
    PyObject *exc = PyErr_GetRaisedException();

    if (exc != NULL && PyErr_GivenExceptionMatches(exc, PyExc_Exception)) {
        if (PyErr_WarnFormat(PyExc_UserWarning, 1,
                             "Exception in stream callback: %S", exc) == 0) {
            Py_DECREF(exc);
            return;
        }
        Py_DECREF(exc);
        PyErr_WriteUnraisable(callback);
        return;
    }
    PyErr_SetRaisedException(exc);
    PyErr_WriteUnraisable(callback);
}

/* Drop a record's references and free it.  GIL held. */
void
cm_pycall_free(cm_pycall *pc)
{
    Py_DECREF(pc->stream);
    Py_DECREF(pc->callback);
    Py_DECREF(pc->arg);
    PyMem_RawFree(pc);
}

/* On the driver thread, without the GIL. */
void
cm_pycall_run(cm_hostcall *hc, CUresult status)
{
    cm_pycall *pc = (cm_pycall *)hc;
    cm_context *c = ((cm_stream *)pc->stream)->ctx;
    PyGILState_STATE gil;
    PyObject *r;

    if (!cm_python_enter()) {
        (void)__atomic_fetch_sub(&cm_pycb_live, 1, __ATOMIC_RELEASE);
        return;  /* the interpreter is exiting: leak the record */
    }
    gil = PyGILState_Ensure();
    if (c != NULL) {
        c->pycalls--;
    }
    cm_driver_depth++;
    r = PyObject_CallFunction(pc->callback, "OiO", pc->stream, (int)status,
                              pc->arg);
    if (r == NULL) {
        cm_pycall_report(pc->callback);
    }
    else {
        Py_DECREF(r);
    }
    cm_pycall_free(pc);
    cm_driver_depth--;
    PyGILState_Release(gil);
    /* Only now: the GIL was taken back and forth until here. */
    (void)__atomic_fetch_sub(&cm_pycb_live, 1, __ATOMIC_RELEASE);
    cm_python_leave();
}

/* ------------------------------------------------------------------ */
/* The GIL-free completion path: a notifier per asyncio loop           */
/* ------------------------------------------------------------------ */

typedef struct cm_waiter cm_waiter;

/* One asyncio loop's notifier: an fd registered with loop.add_reader and
 * the list of completed waiters that the loop thread drains. */
typedef struct {
    PyObject_HEAD
    int rfd;              /* read end; the loop watches it */
    int wfd;              /* write end (the same fd for an eventfd) */
    pthread_mutex_t lock; /* guards done_head/done_tail */
    cm_waiter *done_head; /* NOTE: guarded by lock; completed, FIFO */
    cm_waiter *done_tail; /* NOTE: guarded by lock */
} cm_notifier;

/* A future waiting for a stream's work.  Made and freed with the GIL on
 * the loop thread; in between, only the driver thread touches it (through
 * the notifier, under its lock). */
struct cm_waiter {
    cm_hostcall hc;
    cm_waiter *next;          /* NOTE: guarded by notifier->lock */
    cm_notifier *notifier;    /* strong: keeps the fd open */
    PyObject *future;         /* strong */
    PyObject *result;         /* strong: the Stream or Event */
    CUresult status;          /* set by the driver thread */
};

/* Wake the loop.  A full pipe already has a wake-up pending. */
static void
cm_notifier_signal(cm_notifier *n)
{
#ifdef __linux__
    uint64_t one = 1;

    while (write(n->wfd, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
#else
    char one = 1;

    while (write(n->wfd, &one, 1) < 0 && errno == EINTR) {
    }
#endif
}

/* Consume pending wake-ups (non-blocking). */
static void
cm_notifier_consume(cm_notifier *n)
{
    char buf[64];

    for (;;) {
        ssize_t k = read(n->rfd, buf, sizeof(buf));

        if (k > 0) {
            continue;
        }
        if (k < 0 && errno == EINTR) {
            continue;
        }
        break;
    }
}

/* On the driver thread, without the GIL: hand the waiter to its loop. */
static void
cm_waiter_run(cm_hostcall *hc, CUresult status)
{
    cm_waiter *w = (cm_waiter *)hc;
    cm_notifier *n = w->notifier;
    int was_empty;

    w->status = status;
    w->next = NULL;
    cm_mu_lock(&n->lock);
    was_empty = n->done_head == NULL;
    if (was_empty) {
        n->done_head = w;
    }
    else {
        n->done_tail->next = w;
    }
    n->done_tail = w;
    /* Signal under the lock: once it is released the loop may drain w
     * and drop the last reference to n, closing the fd.  A non-empty list
     * has a wake-up pending already. */
    if (was_empty) {
        cm_notifier_signal(n);
    }
    cm_mu_unlock(&n->lock);
}

/* Drop a waiter's references and free it.  GIL held. */
static void
cm_waiter_free(cm_waiter *w)
{
    Py_DECREF(w->future);
    Py_DECREF(w->result);
    Py_DECREF(w->notifier);
    PyMem_RawFree(w);
}

/* Resolve w's future, unless it is already done (cancelled).  GIL held,
 * loop thread; 0, or -1 with an exception. */
static int
cm_waiter_resolve(cm_waiter *w)
{
    PyObject *r;
    PyObject *exc;
    int done;

    r = PyObject_CallMethodNoArgs(w->future, cm_str_done);
    if (r == NULL) {
        return -1;
    }
    done = PyObject_IsTrue(r);
    Py_DECREF(r);
    if (done != 0) {
        return done < 0 ? -1 : 0;
    }
    if (w->status == CUDA_SUCCESS) {
        r = PyObject_CallMethodOneArg(w->future, cm_str_set_result,
                                      w->result);
    }
    else {
        PyObject *msg = PyUnicode_FromFormat("Stream error %d",
                                             (int)w->status);

        if (msg == NULL) {
            return -1;
        }
        exc = PyObject_CallOneArg(PyExc_Exception, msg);
        Py_DECREF(msg);
        if (exc == NULL) {
            return -1;
        }
        r = PyObject_CallMethodOneArg(w->future, cm_str_set_exception, exc);
        Py_DECREF(exc);
    }
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

PyDoc_STRVAR(cm_notifier_drain_doc,
"_drain($self, /)\n--\n\n"
"Called by the asyncio loop when the fd is readable: resolve the futures "
"of every completed waiter, in completion order.");

static PyObject *
cm_notifier_drain(PyObject *self, PyObject *unused)
{
    cm_notifier *n = (cm_notifier *)self;
    cm_waiter *w;
    cm_waiter *next;

    (void)unused;
    /* Consume first: a waiter added after the list is taken signals
     * again, one added before is in the list. */
    cm_notifier_consume(n);
    cm_mu_lock(&n->lock);
    w = n->done_head;
    n->done_head = NULL;
    n->done_tail = NULL;
    cm_mu_unlock(&n->lock);
    Py_INCREF(self);  /* the waiters may hold the last references */
    for (; w != NULL; w = next) {
        next = w->next;
        if (cm_waiter_resolve(w) < 0) {
            PyErr_WriteUnraisable(w->future);
        }
        cm_waiter_free(w);
    }
    Py_DECREF(self);
    Py_RETURN_NONE;
}

static int
cm_notifier_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static void
cm_notifier_dealloc(PyObject *self)
{
    cm_notifier *n = (cm_notifier *)self;
    PyTypeObject *tp = Py_TYPE(self);

    PyObject_GC_UnTrack(self);
    /* Every waiter holds a reference, so none is left in the list. */
    if (n->rfd >= 0) {
        close(n->rfd);
    }
    if (n->wfd >= 0 && n->wfd != n->rfd) {
        close(n->wfd);
    }
    pthread_mutex_destroy(&n->lock);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyMethodDef cm_notifier_methods[] = {
    {"_drain", cm_notifier_drain, METH_NOARGS, cm_notifier_drain_doc},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot cm_notifier_slots[] = {
    {Py_tp_dealloc, cm_notifier_dealloc},
    {Py_tp_traverse, cm_notifier_traverse},
    {Py_tp_methods, cm_notifier_methods},
    {0, NULL},
};

PyType_Spec cm_notifier_spec = {
    .name = "cudamem._core._LoopNotifier",
    .basicsize = sizeof(cm_notifier),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC
             | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = cm_notifier_slots,
};

/* A new notifier with its fd open and registered with loop.  New
 * reference, or NULL with an exception. */
static cm_notifier *
cm_notifier_new(PyObject *loop)
{
    cm_notifier *n;
    PyObject *drain;
    PyObject *r;
#ifndef __linux__
    int fds[2];
#endif

    n = PyObject_GC_New(cm_notifier, cm_notifier_type);
    if (n == NULL) {
        return NULL;
    }
    n->rfd = -1;
    n->wfd = -1;
    n->done_head = NULL;
    n->done_tail = NULL;
    pthread_mutex_init(&n->lock, NULL);
    PyObject_GC_Track(n);
#ifdef __linux__
    n->rfd = n->wfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (n->rfd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        goto err_decref;
    }
#else
    if (pipe(fds) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        goto err_decref;
    }
    n->rfd = fds[0];
    n->wfd = fds[1];
    if (fcntl(n->rfd, F_SETFL, O_NONBLOCK) < 0
        || fcntl(n->wfd, F_SETFL, O_NONBLOCK) < 0
        || fcntl(n->rfd, F_SETFD, FD_CLOEXEC) < 0
        || fcntl(n->wfd, F_SETFD, FD_CLOEXEC) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        goto err_decref;
    }
#endif
    drain = PyObject_GetAttr((PyObject *)n, cm_str_drain);
    if (drain == NULL) {
        goto err_decref;
    }
    r = PyObject_CallMethod(loop, "add_reader", "iO", n->rfd, drain);
    Py_DECREF(drain);
    if (r == NULL) {
        goto err_decref;
    }
    Py_DECREF(r);
    return n;

err_decref:
    Py_DECREF(n);
    return NULL;
}

/* The notifier of loop, made on first use.  New reference, or NULL with
 * an exception. */
static cm_notifier *
cm_notifier_for_loop(PyObject *loop)
{
    PyObject *n;

    if (cm_notifiers == NULL) {
        PyObject *weakref = PyImport_ImportModule("weakref");

        if (weakref == NULL) {
            return NULL;
        }
        cm_notifiers = PyObject_CallMethod(weakref, "WeakKeyDictionary",
                                           NULL);
        Py_DECREF(weakref);
        if (cm_notifiers == NULL) {
            return NULL;
        }
    }
    n = PyObject_CallMethod(cm_notifiers, "get", "O", loop);
    if (n == NULL) {
        return NULL;
    }
    if (n != Py_None) {
        return (cm_notifier *)n;
    }
    Py_DECREF(n);
    n = (PyObject *)cm_notifier_new(loop);
    if (n == NULL) {
        return NULL;
    }
    if (PyObject_SetItem(cm_notifiers, loop, n) < 0) {
        Py_DECREF(n);
        return NULL;
    }
    return (cm_notifier *)n;
}

/* The running asyncio loop of this thread.  New reference, or NULL with
 * RuntimeError when none runs. */
PyObject *
cm_running_loop(void)
{
    if (cm_get_running_loop == NULL) {
        PyObject *asyncio = PyImport_ImportModule("asyncio");

        if (asyncio == NULL) {
            return NULL;
        }
        cm_get_running_loop = PyObject_GetAttrString(asyncio,
                                                     "get_running_loop");
        Py_DECREF(asyncio);
        if (cm_get_running_loop == NULL) {
            return NULL;
        }
    }
    return PyObject_CallNoArgs(cm_get_running_loop);
}

/* A future of the running loop that resolves to result once the work
 * queued so far on stream h (of ctx) is done, or, with wait_event, once
 * that event has completed.  The driver thread never takes the GIL for
 * it.  New reference, or NULL with an exception. */
PyObject *
cm_future_after(PyObject *loop, cm_context *ctx, CUstream h,
                CUevent wait_event, PyObject *result)
{
    PyObject *fut = NULL;
    cm_notifier *n = NULL;
    cm_waiter *w = NULL;
    CUstream helper = NULL;
    const char *fn = "cuStreamCreate";
    CUresult rc;

    fut = PyObject_CallMethodNoArgs(loop, cm_str_create_future);
    if (fut == NULL) {
        return NULL;
    }
    n = cm_notifier_for_loop(loop);
    if (n == NULL) {
        goto err_decref_future;
    }
    if (cm_context_activate(ctx) < 0) {
        goto err_decref_notifier;
    }
    w = PyMem_RawMalloc(sizeof(*w));
    if (w == NULL) {
        PyErr_NoMemory();
        goto err_decref_notifier;
    }
    w->hc.run = cm_waiter_run;
    w->next = NULL;
    w->notifier = n;                        /* the reference moves to w */
    w->future = Py_NewRef(fut);
    w->result = Py_NewRef(result);
    w->status = CUDA_SUCCESS;
    n = NULL;
    CM_DRIVER_BEGIN_NOGIL
    if (wait_event == NULL) {
        rc = cm_hostcall_enqueue(h, &w->hc, &fn);
    }
    else {
        /* A private stream waits for the event; destroying it at once is
         * safe, the driver keeps it until its work has run. */
        rc = CM_CU_RAW(StreamCreate, (&helper, CU_STREAM_NON_BLOCKING));
        if (rc == CUDA_SUCCESS) {
            fn = "cuStreamWaitEvent";
            rc = CM_CU_RAW(StreamWaitEvent, (helper, wait_event, 0));
            if (rc == CUDA_SUCCESS) {
                rc = cm_hostcall_enqueue(helper, &w->hc, &fn);
            }
            (void)CM_CU_RAW(StreamDestroy, (helper));
        }
    }
    CM_DRIVER_END_NOGIL
    if (rc != CUDA_SUCCESS) {
        cm_raise_cu(rc, fn);
        goto err_free_waiter;
    }
    return fut;

err_free_waiter:
    cm_waiter_free(w);
err_decref_notifier:
    Py_XDECREF(n);
err_decref_future:
    Py_DECREF(fut);
    return NULL;
}
