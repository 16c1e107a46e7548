/* SPDX-License-Identifier: MIT */
/*
 * stream.c: streams, events, host callbacks and the asyncio bridge.
 *
 * Owns the Stream and Event types and their factory functions, the
 * resolution of stream arguments that every enqueueing call shares, and
 * two ways of running host code after a stream's preceding work:
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
 * Locking: everything Python runs with the GIL held.  A notifier's list of
 * completed records is guarded by its pthread mutex, which the driver
 * thread takes without the GIL and the loop thread takes with it; nothing
 * under it calls Python or the driver.  Streams and events give their
 * handles back through the context's queue of pending destroys
 * (memory.c), which never flushes on a driver callback thread.  The kept
 * streams are guarded by the GIL: taking and keeping one never release
 * it (only cuStreamQuery and context push / pop run meanwhile), and
 * emptying a list takes its entries out before the GIL is released
 * around the destroys.
 */
#include "runtime/runtime.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/uio.h>
#endif

/* interned strings, made once in init */
static PyObject *cm_str_cuda_stream;     /* "__cuda_stream__" */
static PyObject *cm_str_stream;          /* "stream" */
static PyObject *cm_str_callback;        /* "callback" */
static PyObject *cm_str_arg;             /* "arg" */
static PyObject *cm_str_timing;          /* "timing" */
static PyObject *cm_str_ptr;             /* "ptr" */
static PyObject *cm_str_evtstart;        /* "evtstart" */
static PyObject *cm_str_evtend;          /* "evtend" */
static PyObject *cm_str_done;            /* "done" */
static PyObject *cm_str_set_result;      /* "set_result" */
static PyObject *cm_str_set_exception;   /* "set_exception" */
static PyObject *cm_str_create_future;   /* "create_future" */
static PyObject *cm_str_await;           /* "__await__" */
static PyObject *cm_str_drain;           /* "_drain" */

/* asyncio.get_running_loop, and the WeakKeyDictionary loop -> notifier;
 * both made on first use, kept for the life of the process. */
static PyObject *cm_get_running_loop;
static PyObject *cm_notifiers;

static PyTypeObject *cm_autosync_type;   /* the auto_synchronize() helper */
static PyTypeObject *cm_notifier_type;   /* one per asyncio loop */

/* ------------------------------------------------------------------ */
/* Argument binding                                                    */
/* ------------------------------------------------------------------ */

/* Bind METH_FASTCALL | METH_KEYWORDS arguments to names (interned).
 * out[i] receives a borrowed reference, or keeps what the caller preset
 * (a default, or NULL for a required argument).  The first nrequired names
 * are required.  0, or -1 with TypeError. */
static int
cm_bind_args(const char *fname, PyObject *const *args, Py_ssize_t nargs,
             PyObject *kwnames, PyObject *const *names, Py_ssize_t nnames,
             Py_ssize_t nrequired, PyObject **out)
{
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    Py_ssize_t i;
    Py_ssize_t j;
    PyObject *key;

    if (nargs > nnames) {
        PyErr_Format(PyExc_TypeError,
                     "%s() takes at most %zd argument%s (%zd given)",
                     fname, nnames, nnames == 1 ? "" : "s", nargs);
        return -1;
    }
    for (i = 0; i < nargs; i++) {
        out[i] = args[i];
    }
    for (j = 0; j < nkw; j++) {
        key = PyTuple_GET_ITEM(kwnames, j);
        for (i = 0; i < nnames; i++) {
            if (key == names[i] || PyUnicode_Compare(key, names[i]) == 0) {
                break;
            }
        }
        if (i == nnames) {
            PyErr_Format(PyExc_TypeError,
                         "%s() got an unexpected keyword argument '%U'",
                         fname, key);
            return -1;
        }
        if (i < nargs) {
            PyErr_Format(PyExc_TypeError,
                         "%s() got multiple values for argument '%U'",
                         fname, key);
            return -1;
        }
        out[i] = args[nargs + j];
    }
    for (i = 0; i < nrequired; i++) {
        if (out[i] == NULL) {
            PyErr_Format(PyExc_TypeError,
                         "%s() missing required argument '%U'", fname,
                         names[i]);
            return -1;
        }
    }
    return 0;
}

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
static int
cm_handle_release(cm_context *ctx, int is_event, void *handle)
{
    cm_ctx_release(ctx, is_event ? CM_REL_EVENT : CM_REL_STREAM,
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
 * forbids the query there), in a dead context, a forked child or once
 * the exit hook ran.  GIL held; never blocks, never raises. */
static int
cm_stream_cache_put(cm_stream *s)
{
    cm_context *ctx = s->ctx;
    cm_stream_slot *slot;
    CUcontext cur = NULL;
    CUcontext popped;
    CUresult rc;
    int pushed = 0;

    if (ctx->n_stream_cache >= cm_stream_cache_cap || !ctx->alive
        || cm_forked || __atomic_load_n(&cm_exiting, __ATOMIC_SEQ_CST)
        || cm_on_driver_thread()) {
        return 0;
    }
    if (CM_CU_RAW(CtxGetCurrent, (&cur)) != CUDA_SUCCESS
        || cur != ctx->handle) {
        if (CM_CU_RAW(CtxPushCurrent, (ctx->handle)) != CUDA_SUCCESS) {
            return 0;
        }
        pushed = 1;
    }
    rc = CM_CU_RAW(StreamQuery, (s->handle));
    if (pushed) {
        (void)CM_CU_RAW(CtxPopCurrent, (&popped));
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
static CUstream
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
    Py_BEGIN_ALLOW_THREADS
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
    Py_END_ALLOW_THREADS
    if (first != CUDA_SUCCESS) {
        PyObject *exc = PyErr_GetRaisedException();

        cm_raise_cu(first, fn);
        PyErr_WriteUnraisable((PyObject *)ctx);
        PyErr_SetRaisedException(exc);
    }
}

PyDoc_STRVAR(cm_set_stream_cache_size_doc,
"_set_stream_cache_size(size)\n--\n\n"
"How many idle dropped streams each context keeps for reuse "
"(config.CUDA_STREAM_CACHE_SIZE, 0 to 16); 0 destroys every dropped "
"stream.  Streams kept already stay until reused or destroyed with their "
"context.");

static PyObject *
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

PyDoc_STRVAR(cm_stream_cache_doc,
"_stream_cache(ctx)\n--\n\n"
"The handles (ints) of the idle streams ctx keeps for reuse, oldest "
"first (tests only).");

static PyObject *
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

PyDoc_STRVAR(cm_callbacks_atexit_doc,
"_callbacks_atexit()\n--\n\n"
"Registered with atexit: from now on host callbacks do not enter Python "
"and dropped streams are not kept; waits (up to 10 s, GIL released) for "
"the callbacks already inside, then destroys the streams every context "
"keeps for reuse.");

static PyObject *
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

/* ------------------------------------------------------------------ */
/* Host calls: C records run by the driver after a stream's work       */
/* ------------------------------------------------------------------ */

/* The head of every record handed to the driver: what to run, with the
 * stream's status (CUDA_SUCCESS, or the error that stopped the stream). */
typedef struct cm_hostcall cm_hostcall;
struct cm_hostcall {
    void (*run)(cm_hostcall *hc, CUresult status);
};

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
static CUresult
cm_hostcall_enqueue(CUstream h, cm_hostcall *hc, const char **fn)
{
    if (cm_cu.StreamAddCallback != NULL) {
        *fn = "cuStreamAddCallback";
        return cm_cu.StreamAddCallback(h, cm_hostcall_stream_cb, hc, 0);
    }
    *fn = "cuLaunchHostFunc";
    return CM_CU_RAW(LaunchHostFunc, (h, cm_hostcall_fn, hc));
}

/* ------------------------------------------------------------------ */
/* add_callback: Python callables on the driver thread                 */
/* ------------------------------------------------------------------ */

/* A Python callback in flight; holds its references until it has run. */
typedef struct {
    cm_hostcall hc;
    PyObject *stream;     /* strong */
    PyObject *callback;   /* strong */
    PyObject *arg;        /* strong */
} cm_pycall;

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
static void
cm_pycall_free(cm_pycall *pc)
{
    Py_DECREF(pc->stream);
    Py_DECREF(pc->callback);
    Py_DECREF(pc->arg);
    PyMem_RawFree(pc);
}

/* On the driver thread, without the GIL. */
static void
cm_pycall_run(cm_hostcall *hc, CUresult status)
{
    cm_pycall *pc = (cm_pycall *)hc;
    cm_context *c = ((cm_stream *)pc->stream)->ctx;
    PyGILState_STATE gil;
    PyObject *r;

    if (!cm_python_enter()) {
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
    pthread_mutex_lock(&n->lock);
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
    pthread_mutex_unlock(&n->lock);
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
    pthread_mutex_lock(&n->lock);
    w = n->done_head;
    n->done_head = NULL;
    n->done_tail = NULL;
    pthread_mutex_unlock(&n->lock);
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

static PyType_Spec cm_notifier_spec = {
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
static PyObject *
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
static PyObject *
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

/* ------------------------------------------------------------------ */
/* Stream                                                              */
/* ------------------------------------------------------------------ */

/* A new Stream object for handle h of ctx.  New reference, or NULL. */
static PyObject *
cm_stream_new(cm_context *ctx, CUstream h, cm_stream_kind kind,
              PyObject *owner)
{
    cm_stream *s = PyObject_GC_New(cm_stream, cm_st->Stream_type);

    if (s == NULL) {
        return NULL;
    }
    s->handle = h;
    s->ctx = (cm_context *)Py_NewRef(ctx);
    s->kind = kind;
    s->flags = 0;
    s->priority = 0;
    s->owner = Py_XNewRef(owner);
    s->weakreflist = NULL;
    PyObject_GC_Track(s);
    return (PyObject *)s;
}

static int
cm_stream_traverse(PyObject *self, visitproc visit, void *arg)
{
    cm_stream *s = (cm_stream *)self;

    Py_VISIT(Py_TYPE(self));
    Py_VISIT(s->ctx);
    Py_VISIT(s->owner);
    return 0;
}

static int
cm_stream_clear(PyObject *self)
{
    Py_CLEAR(((cm_stream *)self)->owner);
    return 0;
}

static void
cm_stream_dealloc(PyObject *self)
{
    cm_stream *s = (cm_stream *)self;
    PyTypeObject *tp = Py_TYPE(self);
    PyObject *exc = PyErr_GetRaisedException();

    PyObject_GC_UnTrack(self);
    if (s->weakreflist != NULL) {
        PyObject_ClearWeakRefs(self);
    }
    /* An idle stream is kept for reuse, else destroyed.  Reported
     * against the type: self, at refcount 0, must not reach the
     * unraisable hook, which would take and drop a reference. */
    if (s->kind == CM_STREAM_USER && !Py_IsFinalizing()
        && !cm_stream_cache_put(s)
        && cm_handle_release(s->ctx, 0, s->handle) < 0) {
        PyErr_WriteUnraisable((PyObject *)tp);
    }
    Py_CLEAR(s->owner);
    Py_CLEAR(s->ctx);
    tp->tp_free(self);
    Py_DECREF(tp);
    PyErr_SetRaisedException(exc);
}

/* Refuse a call that waits on the device from inside a host callback:
 * the driver forbids it and the stream could never finish. */
static int
cm_check_not_in_callback(const char *what)
{
    if (cm_on_driver_thread()) {
        PyErr_Format(PyExc_RuntimeError,
                     "%s() cannot be called from a stream callback: the "
                     "driver forbids CUDA calls there", what);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(cm_stream_synchronize_doc,
"synchronize($self, /)\n--\n\n"
"Wait until all work queued on the stream is done.  The GIL is released "
"while waiting, so host callbacks can run.");

static PyObject *
cm_stream_synchronize_run(PyObject *self, PyObject *unused)
{
    cm_stream *s = (cm_stream *)self;
    CUstream h = s->handle;
    int err;

    (void)unused;
    if (cm_check_not_in_callback("synchronize") < 0
        || cm_context_activate(s->ctx) < 0) {
        return NULL;
    }
    CM_CU_NOGIL(err, StreamSynchronize, (h));
    if (err < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* cm_stream_synchronize_run with the object's context current. */
static PyObject *
cm_stream_synchronize(PyObject *self, PyObject *unused)
{
    cm_context *c = ((cm_stream *)self)->ctx;
    CUcontext prev;
    PyObject *r;

    /* Before any driver call: on the callback thread even the context
     * lookup is refused, with a less telling error. */
    if (cm_check_not_in_callback("synchronize") < 0) {
        return NULL;
    }
    if (c == NULL) {
        return cm_stream_synchronize_run(self, unused);
    }
    if (cm_context_enter(c, &prev) < 0) {
        return NULL;
    }
    r = cm_stream_synchronize_run(self, unused);
    cm_context_leave(c, prev);
    return r;
}

PyDoc_STRVAR(cm_stream_query_doc,
"query($self, /)\n--\n\n"
"True if all work queued on the stream is done, else False.");

static PyObject *
cm_stream_query_run(PyObject *self, PyObject *unused)
{
    cm_stream *s = (cm_stream *)self;
    CUresult rc;

    (void)unused;
    if (cm_context_activate(s->ctx) < 0) {
        return NULL;
    }
    rc = CM_CU_RAW(StreamQuery, (s->handle));
    if (rc == CUDA_SUCCESS) {
        Py_RETURN_TRUE;
    }
    if (rc == CUDA_ERROR_NOT_READY) {
        Py_RETURN_FALSE;
    }
    cm_raise_cu(rc, "cuStreamQuery");
    return NULL;
}

/* cm_stream_query_run with the object's context current. */
static PyObject *
cm_stream_query(PyObject *self, PyObject *unused)
{
    cm_context *c = ((cm_stream *)self)->ctx;
    CUcontext prev;
    PyObject *r;

    if (c == NULL) {
        return cm_stream_query_run(self, unused);
    }
    if (cm_context_enter(c, &prev) < 0) {
        return NULL;
    }
    r = cm_stream_query_run(self, unused);
    cm_context_leave(c, prev);
    return r;
}

PyDoc_STRVAR(cm_stream_add_callback_doc,
"add_callback($self, callback, arg=None)\n--\n\n"
"Call callback(stream, status, arg) on a driver thread once the work "
"queued so far is done.  status is the stream's CUresult as an int (0 on "
"success).  The callback takes the GIL; it must not call CUDA.  An "
"exception it raises becomes a warning.  The stream, callback and arg "
"are kept alive until it has run.");

static PyObject *
cm_stream_add_callback_run(PyObject *self, PyObject *const *args,
                           Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *const names[2] = {cm_str_callback, cm_str_arg};
    PyObject *vals[2] = {NULL, Py_None};
    cm_stream *s = (cm_stream *)self;
    CUstream h = s->handle;
    cm_pycall *pc;
    const char *fn = NULL;
    CUresult rc;

    if (cm_bind_args("add_callback", args, nargs, kwnames, names, 2, 1,
                     vals) < 0) {
        return NULL;
    }
    if (!PyCallable_Check(vals[0])) {
        PyErr_Format(PyExc_TypeError,
                     "add_callback(): callback must be callable, not "
                     "%.100s", Py_TYPE(vals[0])->tp_name);
        return NULL;
    }
    if (cm_context_activate(s->ctx) < 0) {
        return NULL;
    }
    pc = PyMem_RawMalloc(sizeof(*pc));
    if (pc == NULL) {
        return PyErr_NoMemory();
    }
    pc->hc.run = cm_pycall_run;
    pc->stream = Py_NewRef(self);
    pc->callback = Py_NewRef(vals[0]);
    pc->arg = Py_NewRef(vals[1]);
    /* Counted before it can run (it may run before the enqueue returns). */
    if (s->ctx != NULL) {
        s->ctx->pycalls++;
    }
    /* The GIL is released: a callback already running may be waiting for
     * it while the driver holds locks this enqueue needs. */
    CM_DRIVER_BEGIN_NOGIL
    rc = cm_hostcall_enqueue(h, &pc->hc, &fn);
    CM_DRIVER_END_NOGIL
    if (rc != CUDA_SUCCESS) {
        if (s->ctx != NULL) {
            s->ctx->pycalls--;
        }
        cm_pycall_free(pc);
        cm_raise_cu(rc, fn);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* cm_stream_add_callback_run with the object's context current. */
static PyObject *
cm_stream_add_callback(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                       PyObject *kwnames)
{
    cm_context *c = ((cm_stream *)self)->ctx;
    CUcontext prev;
    PyObject *r;

    if (c == NULL) {
        return cm_stream_add_callback_run(self, args, nargs, kwnames);
    }
    if (cm_context_enter(c, &prev) < 0) {
        return NULL;
    }
    r = cm_stream_add_callback_run(self, args, nargs, kwnames);
    cm_context_leave(c, prev);
    return r;
}

PyDoc_STRVAR(cm_stream_async_done_doc,
"async_done($self, /)\n--\n\n"
"An asyncio Future of the running loop that resolves to the stream once "
"the work queued so far is done (Exception('Stream error <status>') if "
"the stream failed).  RuntimeError without a running loop.\n\n"
"Notes\n-----\n"
"Unlike numba, the driver thread never takes the GIL: it only signals an "
"fd that the loop reads, and the future is resolved on the loop's "
"thread.  Cancelling the future is harmless.");

static PyObject *
cm_stream_async_done(PyObject *self, PyObject *unused)
{
    cm_stream *s = (cm_stream *)self;
    PyObject *loop;
    PyObject *fut;

    (void)unused;
    loop = cm_running_loop();
    if (loop == NULL) {
        return NULL;
    }
    fut = cm_future_after(loop, s->ctx, s->handle, NULL, self);
    Py_DECREF(loop);
    return fut;
}

PyDoc_STRVAR(cm_stream_wait_event_doc,
"wait_event($self, event, /)\n--\n\n"
"Make later work on this stream wait until event has completed (on the "
"device; the host does not block).");

static PyObject *
cm_stream_wait_event_run(PyObject *self, PyObject *event)
{
    cm_stream *s = (cm_stream *)self;

    if (!cm_event_check(event)) {
        PyErr_Format(PyExc_TypeError,
                     "wait_event() expects an Event, not %.100s",
                     Py_TYPE(event)->tp_name);
        return NULL;
    }
    if (cm_context_activate(s->ctx) < 0
        || CM_CU(StreamWaitEvent,
                 (s->handle, ((cm_event *)event)->handle, 0)) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* cm_stream_wait_event_run with the object's context current. */
static PyObject *
cm_stream_wait_event(PyObject *self, PyObject *event)
{
    cm_context *c = ((cm_stream *)self)->ctx;
    CUcontext prev;
    PyObject *r;

    if (c == NULL) {
        return cm_stream_wait_event_run(self, event);
    }
    if (cm_context_enter(c, &prev) < 0) {
        return NULL;
    }
    r = cm_stream_wait_event_run(self, event);
    cm_context_leave(c, prev);
    return r;
}

PyDoc_STRVAR(cm_stream_cuda_stream_doc,
"__cuda_stream__($self, /)\n--\n\n"
"The cuda.core stream protocol: (0, handle).");

static PyObject *
cm_stream_cuda_stream(PyObject *self, PyObject *unused)
{
    (void)unused;
    return Py_BuildValue("(iK)", 0, (unsigned long long)(uintptr_t)
                         ((cm_stream *)self)->handle);
}

PyDoc_STRVAR(cm_stream_auto_synchronize_doc,
"auto_synchronize($self, /)\n--\n\n"
"A context manager that yields the stream and synchronises it on exit.\n\n"
"Notes\n-----\n"
"Unlike numba, it synchronises on exit by exception too.");

static PyObject *
cm_stream_auto_synchronize(PyObject *self, PyObject *unused);

static PyObject *
cm_stream_int(PyObject *self)
{
    return PyLong_FromVoidPtr((void *)((cm_stream *)self)->handle);
}

static PyObject *
cm_stream_repr(PyObject *self)
{
    cm_stream *s = (cm_stream *)self;
    unsigned long long h = (unsigned long long)(uintptr_t)s->handle;

    switch (s->kind) {
    case CM_STREAM_DEFAULT:
        return PyUnicode_FromString("<Default CUDA stream>");
    case CM_STREAM_LEGACY:
        return PyUnicode_FromString("<Legacy default CUDA stream>");
    case CM_STREAM_PER_THREAD:
        return PyUnicode_FromString("<Per-thread default CUDA stream>");
    case CM_STREAM_EXTERNAL:
        return PyUnicode_FromFormat("<External CUDA stream %llu>", h);
    case CM_STREAM_USER:
    default:
        return PyUnicode_FromFormat("<CUDA stream %llu>", h);
    }
}

static PyObject *
cm_stream_get_handle(PyObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromVoidPtr((void *)((cm_stream *)self)->handle);
}

static PyObject *
cm_stream_get_external(PyObject *self, void *unused)
{
    (void)unused;
    return PyBool_FromLong(((cm_stream *)self)->kind == CM_STREAM_EXTERNAL);
}

static PyGetSetDef cm_stream_getset[] = {
    {"handle", cm_stream_get_handle, NULL,
     "The CUstream as an int: 0 default, 1 legacy, 2 per-thread.", NULL},
    {"external", cm_stream_get_external, NULL,
     "Whether cudamem wraps a stream it does not own.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef cm_stream_methods[] = {
    {"synchronize", cm_stream_synchronize, METH_NOARGS,
     cm_stream_synchronize_doc},
    {"auto_synchronize", cm_stream_auto_synchronize, METH_NOARGS,
     cm_stream_auto_synchronize_doc},
    {"query", cm_stream_query, METH_NOARGS, cm_stream_query_doc},
    {"add_callback", (PyCFunction)(void (*)(void))cm_stream_add_callback,
     METH_FASTCALL | METH_KEYWORDS, cm_stream_add_callback_doc},
    {"async_done", cm_stream_async_done, METH_NOARGS,
     cm_stream_async_done_doc},
    {"wait_event", cm_stream_wait_event, METH_O, cm_stream_wait_event_doc},
    {"__cuda_stream__", cm_stream_cuda_stream, METH_NOARGS,
     cm_stream_cuda_stream_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef cm_stream_members[] = {
    {"__weaklistoffset__", Py_T_PYSSIZET,
     offsetof(cm_stream, weakreflist), Py_READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(cm_stream_doc,
"A CUDA stream.  Made by stream(), default_stream(), "
"legacy_default_stream(), per_thread_default_stream() and "
"external_stream(); always truthy; equal only to itself.  When the last "
"reference to a stream made by stream() goes, the stream is kept for "
"reuse by a later stream() if it is idle, else destroyed (work already "
"queued still runs).");

static PyType_Slot cm_stream_slots[] = {
    {Py_tp_doc, (void *)cm_stream_doc},
    {Py_tp_dealloc, cm_stream_dealloc},
    {Py_tp_traverse, cm_stream_traverse},
    {Py_tp_clear, cm_stream_clear},
    {Py_tp_repr, cm_stream_repr},
    {Py_nb_int, cm_stream_int},
    {Py_tp_getset, cm_stream_getset},
    {Py_tp_methods, cm_stream_methods},
    {Py_tp_members, cm_stream_members},
    {0, NULL},
};

static PyType_Spec cm_stream_spec = {
    .name = "cudamem.Stream",
    .basicsize = sizeof(cm_stream),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC
             | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = cm_stream_slots,
};

/* ------------------------------------------------------------------ */
/* auto_synchronize(): the context manager                             */
/* ------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *stream;     /* strong */
} cm_autosync;

static PyObject *
cm_stream_auto_synchronize(PyObject *self, PyObject *unused)
{
    cm_autosync *a;

    (void)unused;
    a = PyObject_GC_New(cm_autosync, cm_autosync_type);
    if (a == NULL) {
        return NULL;
    }
    a->stream = Py_NewRef(self);
    PyObject_GC_Track(a);
    return (PyObject *)a;
}

static PyObject *
cm_autosync_enter(PyObject *self, PyObject *unused)
{
    (void)unused;
    return Py_NewRef(((cm_autosync *)self)->stream);
}

static PyObject *
cm_autosync_exit(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *r;

    (void)args;
    (void)nargs;
    r = cm_stream_synchronize(((cm_autosync *)self)->stream, NULL);
    if (r == NULL) {
        return NULL;
    }
    Py_DECREF(r);
    Py_RETURN_FALSE;  /* never swallows the exception */
}

static int
cm_autosync_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(((cm_autosync *)self)->stream);
    return 0;
}

static int
cm_autosync_clear(PyObject *self)
{
    Py_CLEAR(((cm_autosync *)self)->stream);
    return 0;
}

static void
cm_autosync_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);

    PyObject_GC_UnTrack(self);
    cm_autosync_clear(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyMethodDef cm_autosync_methods[] = {
    {"__enter__", cm_autosync_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))cm_autosync_exit,
     METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot cm_autosync_slots[] = {
    {Py_tp_dealloc, cm_autosync_dealloc},
    {Py_tp_traverse, cm_autosync_traverse},
    {Py_tp_clear, cm_autosync_clear},
    {Py_tp_methods, cm_autosync_methods},
    {0, NULL},
};

static PyType_Spec cm_autosync_spec = {
    .name = "cudamem._core._AutoSynchronize",
    .basicsize = sizeof(cm_autosync),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC
             | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = cm_autosync_slots,
};

/* ------------------------------------------------------------------ */
/* Event                                                               */
/* ------------------------------------------------------------------ */

static int
cm_event_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(((cm_event *)self)->ctx);
    return 0;
}

static void
cm_event_dealloc(PyObject *self)
{
    cm_event *e = (cm_event *)self;
    PyTypeObject *tp = Py_TYPE(self);
    PyObject *exc = PyErr_GetRaisedException();

    PyObject_GC_UnTrack(self);
    if (e->weakreflist != NULL) {
        PyObject_ClearWeakRefs(self);
    }
    /* Reported against the type, as in cm_stream_dealloc. */
    if (e->ctx != NULL && !Py_IsFinalizing()
        && cm_handle_release(e->ctx, 1, e->handle) < 0) {
        PyErr_WriteUnraisable((PyObject *)tp);
    }
    Py_CLEAR(e->ctx);
    tp->tp_free(self);
    Py_DECREF(tp);
    PyErr_SetRaisedException(exc);
}

/* Resolve an Event method's stream argument: None and 0 are handle 0
 * (docs/api.md#stream-arguments).  0, or -1 with TypeError. */
static int
cm_event_stream_arg(PyObject *obj, CUstream *h)
{
    return cm_stream_resolve(obj, h) < 0 ? -1 : 0;
}

PyDoc_STRVAR(cm_event_record_doc,
"record($self, /, stream=0)\n--\n\n"
"Record the event on stream (0 or None: the default stream).\n\n"
"Notes\n-----\n"
"None is accepted as 0; numba raises TypeError for it.");

static PyObject *
cm_event_record_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                    PyObject *kwnames)
{
    cm_event *e = (cm_event *)self;
    PyObject *sobj = Py_None;
    CUstream h;

    if (cm_bind_args("record", args, nargs, kwnames, &cm_str_stream, 1, 0,
                     &sobj) < 0
        || cm_event_stream_arg(sobj, &h) < 0
        || cm_context_activate(e->ctx) < 0
        || CM_CU(EventRecord, (e->handle, h)) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* cm_event_record_run with the object's context current. */
static PyObject *
cm_event_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                PyObject *kwnames)
{
    cm_context *c = ((cm_event *)self)->ctx;
    CUcontext prev;
    PyObject *r;

    if (c == NULL) {
        return cm_event_record_run(self, args, nargs, kwnames);
    }
    if (cm_context_enter(c, &prev) < 0) {
        return NULL;
    }
    r = cm_event_record_run(self, args, nargs, kwnames);
    cm_context_leave(c, prev);
    return r;
}

PyDoc_STRVAR(cm_event_wait_doc,
"wait($self, /, stream=0)\n--\n\n"
"Make later work on stream wait for this event (on the device; the host "
"does not block).  None is accepted as 0.");

static PyObject *
cm_event_wait_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                  PyObject *kwnames)
{
    cm_event *e = (cm_event *)self;
    PyObject *sobj = Py_None;
    CUstream h;

    if (cm_bind_args("wait", args, nargs, kwnames, &cm_str_stream, 1, 0,
                     &sobj) < 0
        || cm_event_stream_arg(sobj, &h) < 0
        || cm_context_activate(e->ctx) < 0
        || CM_CU(StreamWaitEvent, (h, e->handle, 0)) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* cm_event_wait_run with the object's context current. */
static PyObject *
cm_event_wait(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
              PyObject *kwnames)
{
    cm_context *c = ((cm_event *)self)->ctx;
    CUcontext prev;
    PyObject *r;

    if (c == NULL) {
        return cm_event_wait_run(self, args, nargs, kwnames);
    }
    if (cm_context_enter(c, &prev) < 0) {
        return NULL;
    }
    r = cm_event_wait_run(self, args, nargs, kwnames);
    cm_context_leave(c, prev);
    return r;
}

PyDoc_STRVAR(cm_event_synchronize_doc,
"synchronize($self, /)\n--\n\n"
"Wait until the event has completed, with the GIL released.");

static PyObject *
cm_event_synchronize_run(PyObject *self, PyObject *unused)
{
    cm_event *e = (cm_event *)self;
    CUevent h = e->handle;
    int err;

    (void)unused;
    if (cm_check_not_in_callback("synchronize") < 0
        || cm_context_activate(e->ctx) < 0) {
        return NULL;
    }
    CM_CU_NOGIL(err, EventSynchronize, (h));
    if (err < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* cm_event_synchronize_run with the object's context current. */
static PyObject *
cm_event_synchronize(PyObject *self, PyObject *unused)
{
    cm_context *c = ((cm_event *)self)->ctx;
    CUcontext prev;
    PyObject *r;

    /* Before any driver call: on the callback thread even the context
     * lookup is refused, with a less telling error. */
    if (cm_check_not_in_callback("synchronize") < 0) {
        return NULL;
    }
    if (c == NULL) {
        return cm_event_synchronize_run(self, unused);
    }
    if (cm_context_enter(c, &prev) < 0) {
        return NULL;
    }
    r = cm_event_synchronize_run(self, unused);
    cm_context_leave(c, prev);
    return r;
}

PyDoc_STRVAR(cm_event_query_doc,
"query($self, /)\n--\n\n"
"True if the event has completed, False if not yet.");

static PyObject *
cm_event_query_run(PyObject *self, PyObject *unused)
{
    cm_event *e = (cm_event *)self;
    CUresult rc;

    (void)unused;
    if (cm_context_activate(e->ctx) < 0) {
        return NULL;
    }
    rc = CM_CU_RAW(EventQuery, (e->handle));
    if (rc == CUDA_SUCCESS) {
        Py_RETURN_TRUE;
    }
    if (rc == CUDA_ERROR_NOT_READY) {
        Py_RETURN_FALSE;
    }
    cm_raise_cu(rc, "cuEventQuery");
    return NULL;
}

/* cm_event_query_run with the object's context current. */
static PyObject *
cm_event_query(PyObject *self, PyObject *unused)
{
    cm_context *c = ((cm_event *)self)->ctx;
    CUcontext prev;
    PyObject *r;

    if (c == NULL) {
        return cm_event_query_run(self, unused);
    }
    if (cm_context_enter(c, &prev) < 0) {
        return NULL;
    }
    r = cm_event_query_run(self, unused);
    cm_context_leave(c, prev);
    return r;
}

/* Milliseconds between two events; NULL with CudaAPIError (named by the
 * driver: CUDA_ERROR_INVALID_HANDLE for a non-timing event,
 * CUDA_ERROR_NOT_READY for one not complete) or TypeError. */
static PyObject *
cm_elapsed(PyObject *start, PyObject *end)
{
    float ms = 0.0f;

    if (!cm_event_check(start) || !cm_event_check(end)) {
        PyErr_Format(PyExc_TypeError,
                     "elapsed time needs two Events, not %.100s and %.100s",
                     Py_TYPE(start)->tp_name, Py_TYPE(end)->tp_name);
        return NULL;
    }
    if (cm_context_activate(((cm_event *)start)->ctx) < 0
        || CM_CU(EventElapsedTime, (&ms, ((cm_event *)start)->handle,
                                    ((cm_event *)end)->handle)) < 0) {
        return NULL;
    }
    return PyFloat_FromDouble((double)ms);
}

PyDoc_STRVAR(cm_event_elapsed_time_doc,
"elapsed_time($self, evtend, /)\n--\n\n"
"Milliseconds (float) from this event to evtend; both must have been "
"created with timing and have completed.");

static PyObject *
cm_event_elapsed_time(PyObject *self, PyObject *evtend)
{
    return cm_elapsed(self, evtend);
}

/* `await event`: the event itself once it has completed.  The driver
 * thread never takes the GIL for it. */
static PyObject *
cm_event_await(PyObject *self)
{
    cm_event *e = (cm_event *)self;
    PyObject *loop = NULL;
    PyObject *fut = NULL;
    PyObject *r;
    PyObject *it = NULL;
    CUresult rc;

    loop = cm_running_loop();
    if (loop == NULL) {
        return NULL;
    }
    if (cm_context_activate(e->ctx) < 0) {
        goto out_decref_loop;
    }
    rc = CM_CU_RAW(EventQuery, (e->handle));
    if (rc == CUDA_SUCCESS) {
        fut = PyObject_CallMethodNoArgs(loop, cm_str_create_future);
        if (fut == NULL) {
            goto out_decref_loop;
        }
        r = PyObject_CallMethodOneArg(fut, cm_str_set_result, self);
        if (r == NULL) {
            goto out_decref_future;
        }
        Py_DECREF(r);
    }
    else if (rc == CUDA_ERROR_NOT_READY) {
        fut = cm_future_after(loop, e->ctx, NULL, e->handle, self);
        if (fut == NULL) {
            goto out_decref_loop;
        }
    }
    else {
        cm_raise_cu(rc, "cuEventQuery");
        goto out_decref_loop;
    }
    it = PyObject_CallMethodNoArgs(fut, cm_str_await);

out_decref_future:
    Py_DECREF(fut);
out_decref_loop:
    Py_DECREF(loop);
    return it;
}

static PyObject *
cm_event_get_handle(PyObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromVoidPtr((void *)((cm_event *)self)->handle);
}

static PyObject *
cm_event_repr(PyObject *self)
{
    cm_event *e = (cm_event *)self;

    return PyUnicode_FromFormat("<CUDA event %p%s>", (void *)e->handle,
                                e->timing ? "" : " (no timing)");
}

static PyGetSetDef cm_event_getset[] = {
    {"handle", cm_event_get_handle, NULL, "The CUevent, as an int.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef cm_event_methods[] = {
    {"record", (PyCFunction)(void (*)(void))cm_event_record,
     METH_FASTCALL | METH_KEYWORDS, cm_event_record_doc},
    {"wait", (PyCFunction)(void (*)(void))cm_event_wait,
     METH_FASTCALL | METH_KEYWORDS, cm_event_wait_doc},
    {"synchronize", cm_event_synchronize, METH_NOARGS,
     cm_event_synchronize_doc},
    {"query", cm_event_query, METH_NOARGS, cm_event_query_doc},
    {"elapsed_time", cm_event_elapsed_time, METH_O,
     cm_event_elapsed_time_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef cm_event_members[] = {
    {"__weaklistoffset__", Py_T_PYSSIZET,
     offsetof(cm_event, weakreflist), Py_READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(cm_event_doc,
"A CUDA event, made by event().  Awaitable: `await ev` returns ev once "
"it has completed.  Destroyed when its last reference goes.");

static PyType_Slot cm_event_slots[] = {
    {Py_tp_doc, (void *)cm_event_doc},
    {Py_tp_dealloc, cm_event_dealloc},
    {Py_tp_traverse, cm_event_traverse},
    {Py_tp_repr, cm_event_repr},
    {Py_am_await, cm_event_await},
    {Py_tp_getset, cm_event_getset},
    {Py_tp_methods, cm_event_methods},
    {Py_tp_members, cm_event_members},
    {0, NULL},
};

static PyType_Spec cm_event_spec = {
    .name = "cudamem.Event",
    .basicsize = sizeof(cm_event),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC
             | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = cm_event_slots,
};

/* ------------------------------------------------------------------ */
/* Module-level functions                                              */
/* ------------------------------------------------------------------ */

/* A new Stream made with flags (and priority 0) in the current context:
 * a kept idle stream of that context made the same way if there is one,
 * else a new one from cuStreamCreate.  New reference, or NULL. */
static PyObject *
cm_stream_make(unsigned int flags)
{
    cm_context *ctx;
    cm_stream *s;
    CUstream h;
    int err;

    ctx = cm_context_current();
    if (ctx == NULL) {
        return NULL;
    }
    h = cm_stream_cache_take(ctx, flags, 0);
    if (h == NULL) {
        CM_CU_NOGIL(err, StreamCreate, (&h, flags));
        if (err < 0) {
            return NULL;
        }
    }
    s = (cm_stream *)cm_stream_new(ctx, h, CM_STREAM_USER, NULL);
    if (s == NULL) {
        CM_DRIVER_BEGIN_NOGIL
        (void)CM_CU_RAW(StreamDestroy, (h));
        CM_DRIVER_END_NOGIL
        return NULL;
    }
    s->flags = flags;
    return (PyObject *)s;
}

PyDoc_STRVAR(cm_stream_fn_doc,
"stream()\n--\n\n"
"A new stream (cuStreamCreate, flags 0: it synchronises with the legacy "
"default stream), in the current context.\n\n"
"Notes\n-----\n"
"When a stream made here is dropped while idle (all its work done), "
"cudamem keeps it, up to config.CUDA_STREAM_CACHE_SIZE (16) per context, "
"and a later stream() in that context hands it out again instead of "
"creating one; a busy stream is destroyed once its work is done, as in "
"numba.  So the handle of a new stream may equal that of a dead one: do "
"not use a handle, or an external_stream() of it, after its Stream is "
"gone.  Kept streams are destroyed by close(), by reset of the device or "
"context, and at exit; CUDA_STREAM_CACHE_SIZE = 0 keeps none.");

static PyObject *
cm_stream_fn(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    return cm_stream_make(CU_STREAM_DEFAULT);
}

PyDoc_STRVAR(cm_stream_with_flags_doc,
"_stream_with_flags(flags)\n--\n\n"
"stream() with cuStreamCreate's flags (CU_STREAM_NON_BLOCKING is 1); kept "
"and reused among streams of the same flags (tests only).");

static PyObject *
cm_stream_with_flags_fn(PyObject *mod, PyObject *arg)
{
    unsigned long flags = PyLong_AsUnsignedLong(arg);

    (void)mod;
    if (flags == (unsigned long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    if (flags > UINT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "flags out of range");
        return NULL;
    }
    return cm_stream_make((unsigned int)flags);
}

/* A Stream of a fixed special handle in the current context. */
static PyObject *
cm_special_stream(CUstream h, cm_stream_kind kind)
{
    cm_context *ctx = cm_context_current();

    return ctx == NULL ? NULL : cm_stream_new(ctx, h, kind, NULL);
}

PyDoc_STRVAR(cm_default_stream_doc,
"default_stream()\n--\n\n"
"The default stream (handle 0): the legacy default stream, or the "
"per-thread one when CUDAMEM_PER_THREAD_DEFAULT_STREAM (or numba's or "
"cuda-python's variable) is set.  A new object on each call.");

static PyObject *
cm_default_stream_fn(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    return cm_special_stream(NULL, CM_STREAM_DEFAULT);
}

PyDoc_STRVAR(cm_legacy_default_stream_doc,
"legacy_default_stream()\n--\n\n"
"The legacy default stream (CU_STREAM_LEGACY, handle 1).");

static PyObject *
cm_legacy_default_stream_fn(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    return cm_special_stream(CU_STREAM_LEGACY, CM_STREAM_LEGACY);
}

PyDoc_STRVAR(cm_per_thread_default_stream_doc,
"per_thread_default_stream()\n--\n\n"
"The per-thread default stream (CU_STREAM_PER_THREAD, handle 2).");

static PyObject *
cm_per_thread_default_stream_fn(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    return cm_special_stream(CU_STREAM_PER_THREAD, CM_STREAM_PER_THREAD);
}

PyObject *
cm_stream_external_owned(CUstream handle, PyObject *owner)
{
    cm_context *ctx;

    if (cm_stream_handle_check((uintptr_t)handle, "external stream") < 0) {
        return NULL;
    }
    ctx = cm_context_current();
    if (ctx == NULL) {
        return NULL;
    }
    return cm_stream_new(ctx, handle, CM_STREAM_EXTERNAL, owner);
}

PyObject *
cm_stream_external(CUstream handle)
{
    return cm_stream_external_owned(handle, NULL);
}

PyDoc_STRVAR(cm_external_stream_doc,
"external_stream(ptr)\n--\n\n"
"A Stream wrapping the CUstream ptr (an int) that cudamem does not own: "
"it is never destroyed.  0, 1 and 2 name the default streams.  The\n"
"driver reads the object at any other handle without a check, so a ptr\n"
"that is unaligned or whose memory cannot be read raises ValueError\n"
"(numba accepts it and the first use crashes); a readable address that\n"
"is not a live stream (one destroyed, or any other pointer) cannot be\n"
"told apart, and passing one is the caller's error, as in every CUDA\n"
"library.");

static PyObject *
cm_external_stream_fn(PyObject *mod, PyObject *const *args,
                      Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *ptr = NULL;
    unsigned long long h;

    (void)mod;
    if (cm_bind_args("external_stream", args, nargs, kwnames, &cm_str_ptr,
                     1, 1, &ptr) < 0) {
        return NULL;
    }
    if (!PyLong_Check(ptr)) {
        PyErr_SetString(PyExc_TypeError,
                        "ptr for external stream must be an int");
        return NULL;
    }
    h = PyLong_AsUnsignedLongLong(ptr);
    if (h == (unsigned long long)-1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_SetString(PyExc_OverflowError,
                            "ptr for external stream must be a "
                            "non-negative int below 2**64");
        }
        return NULL;
    }
    return cm_stream_external((CUstream)(uintptr_t)h);
}

PyDoc_STRVAR(cm_event_fn_doc,
"event(timing=True)\n--\n\n"
"A new event in the current context; without timing it is cheaper and "
"serves only for ordering (CU_EVENT_DISABLE_TIMING).");

static PyObject *
cm_event_fn(PyObject *mod, PyObject *const *args, Py_ssize_t nargs,
            PyObject *kwnames)
{
    PyObject *tobj = Py_True;
    cm_context *ctx;
    cm_event *e;
    int timing;

    (void)mod;
    if (cm_bind_args("event", args, nargs, kwnames, &cm_str_timing, 1, 0,
                     &tobj) < 0
        || (timing = PyObject_IsTrue(tobj)) < 0
        || (ctx = cm_context_current()) == NULL) {
        return NULL;
    }
    e = PyObject_GC_New(cm_event, cm_st->Event_type);
    if (e == NULL) {
        return NULL;
    }
    e->handle = NULL;
    e->ctx = (cm_context *)Py_NewRef(ctx);
    e->timing = timing;
    e->weakreflist = NULL;
    PyObject_GC_Track(e);
    if (CM_CU(EventCreate, (&e->handle, timing ? CU_EVENT_DEFAULT
                                               : CU_EVENT_DISABLE_TIMING))
        < 0) {
        e->handle = NULL;
        Py_DECREF(e);
        return NULL;
    }
    return (PyObject *)e;
}

PyDoc_STRVAR(cm_event_elapsed_time_fn_doc,
"event_elapsed_time(evtstart, evtend)\n--\n\n"
"Milliseconds (float) between two completed timing events.");

static PyObject *
cm_event_elapsed_time_fn(PyObject *mod, PyObject *const *args,
                         Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *const names[2] = {cm_str_evtstart, cm_str_evtend};
    PyObject *vals[2] = {NULL, NULL};

    (void)mod;
    if (cm_bind_args("event_elapsed_time", args, nargs, kwnames, names, 2, 2,
                     vals) < 0) {
        return NULL;
    }
    return cm_elapsed(vals[0], vals[1]);
}

static PyMethodDef cm_stream_functions[] = {
    {"stream", cm_stream_fn, METH_NOARGS, cm_stream_fn_doc},
    {"default_stream", cm_default_stream_fn, METH_NOARGS,
     cm_default_stream_doc},
    {"legacy_default_stream", cm_legacy_default_stream_fn, METH_NOARGS,
     cm_legacy_default_stream_doc},
    {"per_thread_default_stream", cm_per_thread_default_stream_fn,
     METH_NOARGS, cm_per_thread_default_stream_doc},
    {"external_stream", (PyCFunction)(void (*)(void))cm_external_stream_fn,
     METH_FASTCALL | METH_KEYWORDS, cm_external_stream_doc},
    {"event", (PyCFunction)(void (*)(void))cm_event_fn,
     METH_FASTCALL | METH_KEYWORDS, cm_event_fn_doc},
    {"event_elapsed_time",
     (PyCFunction)(void (*)(void))cm_event_elapsed_time_fn,
     METH_FASTCALL | METH_KEYWORDS, cm_event_elapsed_time_fn_doc},
    {"_callbacks_atexit", cm_callbacks_atexit, METH_NOARGS,
     cm_callbacks_atexit_doc},
    {"_stream_with_flags", cm_stream_with_flags_fn, METH_O,
     cm_stream_with_flags_doc},
    {"_stream_cache", cm_stream_cache_fn, METH_O, cm_stream_cache_doc},
    {"_set_stream_cache_size", cm_set_stream_cache_size, METH_O,
     cm_set_stream_cache_size_doc},
    {NULL, NULL, 0, NULL},
};

/* ------------------------------------------------------------------ */
/* Stream arguments                                                    */
/* ------------------------------------------------------------------ */

/* NOTE: guarded by the GIL.  Handles that passed the check lately: the
 * check is a system call (a microsecond or more), and a foreign stream
 * object is often passed to call after call. */
#define CM_HANDLES_OK 4
static uintptr_t cm_handles_ok[CM_HANDLES_OK];
static unsigned cm_handles_next;

int
cm_stream_handle_check(uintptr_t h, const char *what)
{
    char byte[sizeof(void *)];
    struct iovec local = {byte, sizeof(byte)};
    struct iovec remote = {(void *)h, sizeof(byte)};
    ssize_t n;
    int i;

    if (h <= (uintptr_t)CU_STREAM_PER_THREAD) {
        return 0;
    }
    for (i = 0; i < CM_HANDLES_OK; i++) {
        if (cm_handles_ok[i] == h) {
            return 0;
        }
    }
    if (h % sizeof(void *) != 0) {
        goto bad;
    }
    /* Reading through the kernel fails with EFAULT instead of faulting. */
    n = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
    if (n == (ssize_t)sizeof(byte)) {
        cm_handles_ok[cm_handles_next++ % CM_HANDLES_OK] = h;
        return 0;
    }
    if (n < 0 && (errno == ENOSYS || errno == EPERM)) {
        /* Reading one's own memory is forbidden here: ask only whether
         * the page is mapped. */
        long pg = sysconf(_SC_PAGESIZE);
        unsigned char vec;

        if (pg > 0 && mincore((void *)(h & ~(uintptr_t)(pg - 1)),
                              (size_t)pg, &vec) == 0) {
            cm_handles_ok[cm_handles_next++ % CM_HANDLES_OK] = h;
            return 0;
        }
    }
bad:
    PyErr_Format(PyExc_ValueError,
                 "%s: %p is not a stream handle (no stream object can be "
                 "at that address)", what, (void *)h);
    return -1;
}

int
cm_stream_resolve(PyObject *obj, CUstream *handle)
{
    PyObject *meth;
    PyObject *t;
    unsigned long long h;
    int overflow;

    if (cm_stream_check(obj)) {
        cm_stream *s = (cm_stream *)obj;

        /* A stream of a closed context names a destroyed driver stream:
         * the driver would read freed memory. */
        if (!s->ctx->alive && s->handle != NULL
            && s->handle != CU_STREAM_LEGACY
            && s->handle != CU_STREAM_PER_THREAD) {
            *handle = 0;
            PyErr_SetString(PyExc_ValueError,
                            "the stream belongs to a closed context");
            return -1;
        }
        *handle = s->handle;
        return 1;
    }
    *handle = 0;
    if (obj == Py_None || obj == Py_False) {
        return 0;
    }
    if (PyLong_CheckExact(obj)
        && PyLong_AsLongAndOverflow(obj, &overflow) == 0 && !overflow) {
        return 0;
    }
    if (PyObject_GetOptionalAttr(obj, cm_str_cuda_stream, &meth) < 0) {
        return -1;
    }
    if (meth == NULL) {
        PyErr_Format(PyExc_TypeError,
                     "Expected a Stream object or 0, got %.100s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    t = PyObject_CallNoArgs(meth);
    Py_DECREF(meth);
    if (t == NULL) {
        return -1;
    }
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 2
        || !PyLong_Check(PyTuple_GET_ITEM(t, 1))) {
        Py_DECREF(t);
        PyErr_Format(PyExc_TypeError,
                     "%.100s.__cuda_stream__() must return (version, "
                     "handle)", Py_TYPE(obj)->tp_name);
        return -1;
    }
    h = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, 1));
    Py_DECREF(t);
    if ((h == (unsigned long long)-1 && PyErr_Occurred())
        || cm_stream_handle_check((uintptr_t)h, "__cuda_stream__()") < 0) {
        return -1;
    }
    *handle = (CUstream)(uintptr_t)h;
    return 1;
}

/* ------------------------------------------------------------------ */
/* Init                                                                */
/* ------------------------------------------------------------------ */

static int
cm_stream_intern(PyObject **slot, const char *s)
{
    *slot = PyUnicode_InternFromString(s);
    return *slot == NULL ? -1 : 0;
}

/* Register _callbacks_atexit with atexit. */
static int
cm_stream_register_atexit(PyObject *mod)
{
    PyObject *atexit;
    PyObject *fn;
    PyObject *r;

    fn = PyObject_GetAttrString(mod, "_callbacks_atexit");
    if (fn == NULL) {
        return -1;
    }
    atexit = PyImport_ImportModule("atexit");
    if (atexit == NULL) {
        Py_DECREF(fn);
        return -1;
    }
    r = PyObject_CallMethod(atexit, "register", "O", fn);
    Py_DECREF(atexit);
    Py_DECREF(fn);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

int
cm_stream_init(PyObject *mod, cm_state *st)
{
    if (cm_stream_intern(&cm_str_cuda_stream, "__cuda_stream__") < 0
        || cm_stream_intern(&cm_str_stream, "stream") < 0
        || cm_stream_intern(&cm_str_callback, "callback") < 0
        || cm_stream_intern(&cm_str_arg, "arg") < 0
        || cm_stream_intern(&cm_str_timing, "timing") < 0
        || cm_stream_intern(&cm_str_ptr, "ptr") < 0
        || cm_stream_intern(&cm_str_evtstart, "evtstart") < 0
        || cm_stream_intern(&cm_str_evtend, "evtend") < 0
        || cm_stream_intern(&cm_str_done, "done") < 0
        || cm_stream_intern(&cm_str_set_result, "set_result") < 0
        || cm_stream_intern(&cm_str_set_exception, "set_exception") < 0
        || cm_stream_intern(&cm_str_create_future, "create_future") < 0
        || cm_stream_intern(&cm_str_await, "__await__") < 0
        || cm_stream_intern(&cm_str_drain, "_drain") < 0) {
        return -1;
    }
    st->Stream_type = (PyTypeObject *)PyType_FromModuleAndSpec(
        mod, &cm_stream_spec, NULL);
    if (st->Stream_type == NULL
        || PyModule_AddObjectRef(mod, "Stream",
                                 (PyObject *)st->Stream_type) < 0) {
        return -1;
    }
    st->Event_type = (PyTypeObject *)PyType_FromModuleAndSpec(
        mod, &cm_event_spec, NULL);
    if (st->Event_type == NULL
        || PyModule_AddObjectRef(mod, "Event",
                                 (PyObject *)st->Event_type) < 0) {
        return -1;
    }
    /* Private helper types live as long as the process (one interpreter);
     * the module keeps a reference as attributes too. */
    cm_autosync_type = (PyTypeObject *)PyType_FromModuleAndSpec(
        mod, &cm_autosync_spec, NULL);
    if (cm_autosync_type == NULL
        || PyModule_AddObjectRef(mod, "_AutoSynchronize",
                                 (PyObject *)cm_autosync_type) < 0) {
        return -1;
    }
    cm_notifier_type = (PyTypeObject *)PyType_FromModuleAndSpec(
        mod, &cm_notifier_spec, NULL);
    if (cm_notifier_type == NULL
        || PyModule_AddObjectRef(mod, "_LoopNotifier",
                                 (PyObject *)cm_notifier_type) < 0) {
        return -1;
    }
    if (PyModule_AddFunctions(mod, cm_stream_functions) < 0) {
        return -1;
    }
    return cm_stream_register_atexit(mod);
}
