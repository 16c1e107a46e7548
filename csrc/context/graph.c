/* SPDX-License-Identifier: MIT */
/*
 * context/graph.c: stream capture and graph launch.  Owns the
 * process-wide record of the captures cudamem began (a count, a count of
 * the global-mode ones, the capturing stream handles and each capture's
 * graph pool, opaque here: memory/pool/graph/gpool.c's, in atomics:
 * no lock, read without a driver call on every synchronous path; and
 * what each keeps for its Graph, cm_capture_keep, under the GIL), the
 * Stream methods begin_capture / end_capture / is_capturing, the
 * private functions the Python Graph class (cudamem/graphs.py) calls,
 * and the checks that refuse, with StreamCaptureError and before any
 * driver call, work that must happen now on a capturing stream
 * (docs/design.md, "Capture-aware synchronous work").  It also says
 * what cudamem's background work may do meanwhile, without a driver
 * call: cm_capture_restricted (whether the calling thread may make a
 * potentially unsafe call: a query of an ordinary event or stream, a
 * free, a synchronisation) and cm_capture_stream_known; and when the
 * last capture ends, it runs the releases the captures held back.
 *
 * Locks and the GIL: no lock.  A capture is recorded and forgotten with
 * the GIL held; the atomics make the record safe to read from any
 * thread, with or without the GIL (the release queue's flush reads it
 * without).  Which thread began a capture is kept per slot, and a count
 * of its own in a thread-local variable.  The GIL is released around
 * cuGraphInstantiateWithFlags (the capture already forgotten),
 * cuGraphUpload, cuGraphLaunch and the wait of close() for the last
 * launch's event (CM_CU_NOGIL), which touch no Python object and no
 * slot, and around any driver call while Python callbacks are in flight
 * (CM_CU, CM_CU_RAW).
 */
#include "context/stream.h"

#include <stdatomic.h>

/* The most captures cudamem tracks at once. */
#define CM_CAP_SLOTS 64

/* Captures cudamem began and has not ended. */
static atomic_int cm_cap_count;

/* Of those, the ones in global mode. */
static atomic_int cm_cap_global;

/* Their streams' handles (0: a free slot) and modes. */
static _Atomic(uintptr_t) cm_cap_handle[CM_CAP_SLOTS];

static int cm_cap_mode[CM_CAP_SLOTS];

/* Their graph pools (opaque: memory/pool/graph/gpool.c's), set before the
 * capture begins and read while it is in progress; and the Python
 * GraphPool objects that keep them (strong; GIL). */
static void *_Atomic cm_cap_pool[CM_CAP_SLOTS];

static PyObject *cm_cap_pyref[CM_CAP_SLOTS];

/* What each capture used that a replay will touch (cm_capture_keep): a
 * dict from the object's address to the object (strong; GIL), or NULL;
 * handed to the Graph at end_capture, dropped when the capture is
 * forgotten otherwise. */
static PyObject *cm_cap_held[CM_CAP_SLOTS];

/* How many times each slot was taken, which tells a capture from a
 * later one in the same slot. */
static atomic_uint cm_cap_use[CM_CAP_SLOTS];

/* The newest capture this thread began and has not ended, as its slot
 * and that slot's generation (-1: none): allocations for the default
 * stream on this thread go to its graph pool while it is in progress. */
static _Thread_local int cm_cap_thread_slot = -1;

static _Thread_local unsigned cm_cap_thread_use;
/* The thread that began each one (the address of its cm_cap_mine; 0 for
 * a relaxed capture, which restricts no thread), and its context's gen. */
static _Atomic(uintptr_t) cm_cap_owner[CM_CAP_SLOTS];

static unsigned long cm_cap_gen[CM_CAP_SLOTS];

/* The captures in global or thread-local mode this thread began and
 * cudamem has not forgotten, as far as this thread knows (one forgotten
 * by another thread, its stream dropped there, is found by a scan). */
static _Thread_local int cm_cap_mine;

static void cm_cap_count_in(int slot, cm_stream *s);
static PyObject *cm_cap_forget(int slot);
static void cm_capture_release_held(void);

_Thread_local int cm_capture_adapter_depth;

static const char *const cm_cap_mode_names[] = {
    "global", "thread_local", "relaxed"
};

/* The slot of capturing handle h, or -1. */
static int
cm_cap_find(CUstream h)
{
    int i;

    for (i = 0; i < CM_CAP_SLOTS; i++) {
        if (atomic_load(&cm_cap_handle[i]) == (uintptr_t)h) {
            return i;
        }
    }
    return -1;
}

int
cm_capture_keep(CUstream h, PyObject *o)
{
    PyObject *key;
    int slot;
    int r;

    if (o == NULL || o == Py_None || !cm_capture_any()
        || cm_stream_handle_is_default(h)
        || (slot = cm_cap_find(h)) < 0) {
        return 0;
    }
    if (cm_cap_held[slot] == NULL
        && (cm_cap_held[slot] = PyDict_New()) == NULL) {
        return -1;
    }
    key = PyLong_FromVoidPtr(o);
    if (key == NULL) {
        return -1;
    }
    r = PyDict_SetItem(cm_cap_held[slot], key, o);
    Py_DECREF(key);
    return r;
}

int
cm_capture_any(void)
{
    return atomic_load_explicit(&cm_cap_count, memory_order_relaxed) != 0;
}

void *
cm_capture_pool(CUstream h)
{
    int i;

    if (cm_stream_handle_is_default(h)) {
        i = cm_cap_thread_slot;
        if (i < 0 || atomic_load(&cm_cap_handle[i]) == 0
            || atomic_load(&cm_cap_use[i]) != cm_cap_thread_use) {
            return NULL;
        }
        return atomic_load(&cm_cap_pool[i]);
    }
    i = cm_cap_find(h);
    return i < 0 ? NULL : atomic_load(&cm_cap_pool[i]);
}

/* The C graph pool of a cudamem.GraphPool (its _capsule), checked to be
 * ctx's; NULL with an exception. */
static void *
cm_graph_pool_ptr(PyObject *pool, cm_context *ctx)
{
    PyObject *cap = PyObject_GetAttrString(pool, "_capsule");
    void *gp;

    if (cap == NULL || !PyCapsule_IsValid(cap, "cudamem.graph_pool")) {
        Py_XDECREF(cap);
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError,
                     "pool must be a cudamem.GraphPool (a graph's .pool), "
                     "not %.100s", Py_TYPE(pool)->tp_name);
        return NULL;
    }
    if (PyCapsule_GetContext(cap) != (void *)ctx) {
        Py_DECREF(cap);
        PyErr_SetString(PyExc_ValueError,
                        "the graph pool belongs to another device's "
                        "context than the capturing stream");
        return NULL;
    }
    gp = PyCapsule_GetPointer(cap, "cudamem.graph_pool");
    Py_DECREF(cap);
    return gp;
}

/* Raise StreamCaptureError: what cannot run while stream (a description)
 * captures, and what to do instead. */
static int
cm_capture_raise(const char *what, const char *stream, const char *instead)
{
    PyObject *cls = CM_REGISTERED(StreamCaptureError);
    PyObject *msg;
    PyObject *exc;

    if (cls == NULL) {
        return -1;
    }
    msg = PyUnicode_FromFormat("%s cannot run while %s is capturing a CUDA "
                               "graph: %s", what, stream, instead);
    if (msg == NULL) {
        return -1;
    }
    exc = PyObject_CallOneArg(cls, msg);
    Py_DECREF(msg);
    if (exc != NULL) {
        PyErr_SetObject(cls, exc);
        Py_DECREF(exc);
    }
    return -1;
}

int
cm_capture_refuse_sync(const char *what)
{
    if (atomic_load_explicit(&cm_cap_global, memory_order_relaxed) == 0) {
        return 0;
    }
    return cm_capture_raise(
        what, "a stream (in global mode)",
        "a synchronous call uses the legacy default stream, which would "
        "join or invalidate the capture; use an asynchronous copy on the "
        "capturing stream into pinned memory (cudamem.pinned_array), or "
        "end the capture first");
}

int
cm_capture_refuse_ctx(const char *what)
{
    if (!cm_capture_any()) {
        return 0;
    }
    return cm_capture_raise(
        what, "a stream of this process",
        "synchronising a context waits on its capturing streams; "
        "synchronise the streams that are not capturing, or end the "
        "capture first");
}

int
cm_capture_refuse_stream(CUstream h, int external, const char *what)
{
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    char name[64];

    if (cm_stream_handle_is_default(h)) {
        return cm_capture_refuse_sync(what);
    }
    if (!(cm_capture_any() && cm_cap_find(h) >= 0)) {
        if (!external || CM_CU_RAW(StreamIsCapturing, (h, &st))
                             != CUDA_SUCCESS
            || st == CU_STREAM_CAPTURE_STATUS_NONE) {
            return 0;
        }
    }
    snprintf(name, sizeof(name), "stream %" PRIuPTR, (uintptr_t)h);
    return cm_capture_raise(
        what, name,
        "it would wait on the stream or run host code in the graph; use "
        "an asynchronous copy on that stream into or out of pinned memory, "
        "or end the capture first");
}

int
cm_capture_refuse_unsafe(const char *what)
{
    if (!cm_capture_restricted()) {
        return 0;
    }
    return cm_capture_raise(
        what, "a stream (in global mode, or on this thread)",
        "the driver forbids waits and queries of streams and events then, "
        "and would invalidate the capture; wait after end_capture(), or "
        "capture in mode='thread_local' from another thread, or in "
        "mode='relaxed'");
}

/* ------------------------------------------------------------------ */
/* Stream methods                                                      */
/* ------------------------------------------------------------------ */

/* The CU_STREAM_CAPTURE_MODE_* mode names, or -1 with ValueError. */
static int
cm_capture_mode(PyObject *mode)
{
    int i;

    if (PyUnicode_Check(mode)) {
        for (i = 0; i < 3; i++) {
            if (PyUnicode_CompareWithASCIIString(mode, cm_cap_mode_names[i])
                == 0) {
                return i;
            }
        }
    }
    PyErr_Format(PyExc_ValueError,
                 "mode must be 'global', 'thread_local' or 'relaxed', "
                 "not %R", mode);
    return -1;
}

static PyObject *
cm_begin_capture_run(cm_stream *s, int mode, PyObject *pool)
{
    int slot;
    void *gp;

    if (cm_stream_handle_is_default(s->handle)) {
        PyErr_SetString(PyExc_ValueError,
                        "the default stream cannot capture; capture on a "
                        "stream made by cudamem.stream()");
        return NULL;
    }
    if (cm_cap_find(s->handle) >= 0) {
        PyErr_Format(PyExc_RuntimeError, "%R is already capturing",
                     (PyObject *)s);
        return NULL;
    }
    /* Before the capture is claimed and counted, and only where this
     * thread may make such calls: the kernel's load is a call a capture
     * would forbid, and it gives up the GIL. */
    if (!cm_capture_restricted()) {
        cm_kcopy_prepare(s->ctx);
    }
    for (slot = 0; slot < CM_CAP_SLOTS; slot++) {
        uintptr_t zero = 0;

        if (atomic_compare_exchange_strong(&cm_cap_handle[slot], &zero,
                                           (uintptr_t)s->handle)) {
            break;
        }
    }
    if (slot == CM_CAP_SLOTS) {
        PyErr_Format(PyExc_RuntimeError, "more than %d captures at once",
                     CM_CAP_SLOTS);
        return NULL;
    }
    if (pool == NULL) {
        PyObject *cls = CM_REGISTERED(GraphPool);

        pool = cls == NULL ? NULL
                           : PyObject_CallOneArg(cls, (PyObject *)s->ctx);
    }
    else {
        Py_INCREF(pool);
    }
    if (pool == NULL || (gp = cm_graph_pool_ptr(pool, s->ctx)) == NULL) {
        Py_XDECREF(pool);
        atomic_store(&cm_cap_handle[slot], 0);
        return NULL;
    }
    atomic_store(&cm_cap_pool[slot], gp);
    cm_cap_pyref[slot] = pool;
    cm_cap_thread_slot = slot;
    cm_cap_thread_use = atomic_fetch_add(&cm_cap_use[slot], 1) + 1;
    /* Counted before the driver begins it: background work that reads
     * the counts from then on makes no call the capture forbids. */
    cm_cap_mode[slot] = mode;
    cm_cap_count_in(slot, s);
    if (CM_CU(StreamBeginCapture, (s->handle, (CUstreamCaptureMode)mode))
        < 0) {
        Py_XDECREF(cm_cap_forget(slot));
        cm_capture_release_held();
        return NULL;
    }
    Py_RETURN_NONE;
}

PyObject *
cm_stream_begin_capture(PyObject *self, PyObject *const *args,
                        Py_ssize_t nargs, PyObject *kwnames)
{
    static PyObject *names[2];
    PyObject *out[2] = {NULL, NULL};
    PyObject *r;
    int mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

    if (names[0] == NULL) {
        names[0] = PyUnicode_InternFromString("mode");
        names[1] = PyUnicode_InternFromString("pool");
        if (names[0] == NULL || names[1] == NULL) {
            return NULL;
        }
    }
    if (cm_bind_args("begin_capture", args, nargs, kwnames, names, 2, 0,
                     out) < 0) {
        return NULL;
    }
    if (out[0] != NULL && (mode = cm_capture_mode(out[0])) < 0) {
        return NULL;
    }
    CM_IN_CONTEXT(((cm_stream *)self)->ctx, r, NULL,
                  cm_begin_capture_run((cm_stream *)self, mode,
                                       out[1] == Py_None ? NULL : out[1]));
    return r;
}

/* End s's capture and instantiate its graph: (exec handle, event
 * handle) ints, or NULL.  Forgets the capture whatever the driver
 * answers; *pool and *held (new references or NULL): its GraphPool and
 * what it used. */
static PyObject *
cm_end_capture_run(cm_stream *s, PyObject **pool, PyObject **held)
{
    CUgraph g = NULL;
    CUgraphExec x = NULL;
    CUevent done = NULL;
    PyObject *r;
    CUresult rc;
    int slot = cm_cap_find(s->handle);
    int err;

    rc = CM_CU_RAW(StreamEndCapture, (s->handle, &g));
    if (slot >= 0 && rc != CUDA_ERROR_ILLEGAL_STATE
        && rc != CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD) {
        *held = cm_cap_held[slot];
        cm_cap_held[slot] = NULL;
        *pool = cm_cap_forget(slot);
        cm_capture_release_held();
    }
    if (rc == CUDA_ERROR_ILLEGAL_STATE && slot < 0) {
        PyErr_Format(PyExc_RuntimeError,
                     "%R is not capturing: call begin_capture() first",
                     (PyObject *)s);
        return NULL;
    }
    if (cm_cu_check(rc, "cuStreamEndCapture") < 0) {
        return NULL;
    }
    /* Instantiation takes as long as the graph is large: GIL released. */
    CM_CU_NOGIL(err, GraphInstantiateWithFlags, (&x, g, 0));
    (void)CM_CU_RAW(GraphDestroy, (g));
    if (err < 0) {
        return NULL;
    }
    /* The event each launch records after itself, which close() waits
     * for (cm_graph_settle). */
    if (CM_CU(EventCreate, (&done, CU_EVENT_DISABLE_TIMING)) < 0) {
        (void)CM_CU_RAW(GraphExecDestroy, (x));
        return NULL;
    }
    r = Py_BuildValue("NN", PyLong_FromVoidPtr((void *)x),
                      PyLong_FromVoidPtr((void *)done));
    if (r == NULL) {
        (void)CM_CU_RAW(GraphExecDestroy, (x));
        (void)CM_CU_RAW(EventDestroy, (done));
    }
    return r;
}

PyObject *
cm_stream_end_capture(PyObject *self, PyObject *unused)
{
    cm_stream *s = (cm_stream *)self;
    PyObject *cls;
    PyObject *x;
    PyObject *r;
    PyObject *pool = NULL;
    PyObject *held = NULL;

    (void)unused;
    cls = CM_REGISTERED(Graph);
    if (cls == NULL) {
        return NULL;
    }
    CM_IN_CONTEXT(s->ctx, x, NULL, cm_end_capture_run(s, &pool, &held));
    if (!cm_capture_any()) {
        /* Graph pools retired meanwhile give their memory back now. */
        cm_ctx_up.graph_pools_tidy();
    }
    if (x == NULL) {
        Py_XDECREF(pool);
        Py_XDECREF(held);
        return NULL;
    }
    /* The graph keeps what its capture used: the memory a replay reads
     * and writes stays the program's until the graph is closed. */
    r = PyObject_CallFunction(cls, "OOkOOO", PyTuple_GET_ITEM(x, 0),
                              (PyObject *)s->ctx, s->ctx->gen,
                              pool != NULL ? pool : Py_None,
                              held != NULL ? held : Py_None,
                              PyTuple_GET_ITEM(x, 1));
    Py_XDECREF(pool);
    Py_XDECREF(held);
    if (r == NULL) {
        /* The executable graph would be lost: destroy it. */
        PyObject *et, *ev, *tb;
        CUgraphExec h;
        CUevent e;

        PyErr_Fetch(&et, &ev, &tb);
        h = (CUgraphExec)PyLong_AsVoidPtr(PyTuple_GET_ITEM(x, 0));
        e = (CUevent)PyLong_AsVoidPtr(PyTuple_GET_ITEM(x, 1));
        if (h != NULL) {
            (void)CM_CU_RAW(GraphExecDestroy, (h));
        }
        if (e != NULL) {
            (void)CM_CU_RAW(EventDestroy, (e));
        }
        PyErr_Clear();
        PyErr_Restore(et, ev, tb);
    }
    Py_DECREF(x);
    return r;
}

static PyObject *
cm_is_capturing_run(cm_stream *s)
{
    CUstreamCaptureStatus st;

    if (s->kind != CM_STREAM_EXTERNAL
        && !cm_stream_handle_is_default(s->handle)) {
        if (!cm_capture_any()) {
            Py_RETURN_FALSE;
        }
        return PyBool_FromLong(cm_cap_find(s->handle) >= 0);
    }
    if (CM_CU(StreamIsCapturing, (s->handle, &st)) < 0) {
        return NULL;
    }
    return PyBool_FromLong(st != CU_STREAM_CAPTURE_STATUS_NONE);
}

PyObject *
cm_stream_is_capturing(PyObject *self, PyObject *unused)
{
    PyObject *r;

    (void)unused;
    CM_IN_CONTEXT(((cm_stream *)self)->ctx, r, NULL,
                  cm_is_capturing_run((cm_stream *)self));
    return r;
}

/* ------------------------------------------------------------------ */
/* What cudamem.Graph calls                                            */
/* ------------------------------------------------------------------ */

/* Parse (exec, ctx, gen[, stream]) and check the context is live. */
static int
cm_graph_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want,
              CUgraphExec *x, cm_context **ctx)
{
    unsigned long gen;

    if (nargs != want) {
        PyErr_SetString(PyExc_TypeError, "wrong number of arguments");
        return -1;
    }
    *x = (CUgraphExec)PyLong_AsVoidPtr(args[0]);
    gen = PyLong_AsUnsignedLong(args[2]);
    if (PyErr_Occurred()) {
        return -1;
    }
    if (!PyObject_TypeCheck(args[1], cm_st->Context_type)) {
        PyErr_SetString(PyExc_TypeError, "expected a Context");
        return -1;
    }
    *ctx = (cm_context *)args[1];
    if (!cm_context_gen_live(gen)) {
        PyErr_SetString(PyExc_ValueError,
                        "the graph's context was closed or reset: the "
                        "graph is gone with it");
        return -1;
    }
    return 0;
}

/* Whether h (of stream object obj) captures: a capture cudamem began,
 * or, on an external stream or the per-thread default stream, one
 * another library began (a driver call, on those streams only, as
 * is_capturing() asks).  -1 on error. */
static int
cm_graph_launch_captured(PyObject *obj, CUstream h)
{
    CUstreamCaptureStatus st;

    if (cm_capture_any() && cm_cap_find(h) >= 0) {
        return 1;
    }
    if (h == NULL || h == CU_STREAM_LEGACY) {
        return 0;                    /* the legacy stream never captures */
    }
    if (cm_stream_check(obj)
        && ((cm_stream *)obj)->kind != CM_STREAM_EXTERNAL
        && !cm_stream_handle_is_default(h)) {
        return 0;                    /* one of cudamem's: the slots say */
    }
    if (CM_CU(StreamIsCapturing, (h, &st)) < 0) {
        return -1;
    }
    return st != CU_STREAM_CAPTURE_STATUS_NONE;
}

static PyObject *
cm_graph_launch_run(CUgraphExec x, CUstream h, int upload, CUevent done,
                    PyObject *obj)
{
    char name[64];
    int err;
    int captured = cm_graph_launch_captured(obj, h);

    if (captured < 0) {
        return NULL;
    }
    if (captured) {
        /* The driver refuses a graph's launch or upload into a capture
         * (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, on an H100 with CUDA
         * 13.0), which may end the capture: refused here first, and the
         * capture goes on. */
        snprintf(name, sizeof(name), "stream %" PRIuPTR, (uintptr_t)h);
        cm_capture_raise(
            upload ? "Graph.upload()" : "Graph.launch()", name,
            "the driver does not record a graph's launch into a capture; "
            "launch it before begin_capture() or after end_capture(), or "
            "make its work again inside this capture");
        return NULL;
    }
    if (upload) {
        CM_CU_NOGIL(err, GraphUpload, (x, h));
        if (err < 0) {
            return NULL;
        }
        Py_RETURN_FALSE;
    }
    CM_CU_NOGIL(err, GraphLaunch, (x, h));
    if (err < 0) {
        return NULL;
    }
    /* After the launch, for close() to wait on (launches of one graph
     * run one after another: the last one's end is all of theirs). */
    if (CM_CU(EventRecord, (done, h)) < 0) {
        return NULL;
    }
    Py_RETURN_TRUE;
}

/* _graph_launch(exec, ctx, gen, stream, upload, done): whether the
 * event done was recorded after the launch. */
PyObject *
cm_graph_launch(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    CUgraphExec x;
    cm_context *ctx;
    CUstream h = NULL;
    CUevent done;
    PyObject *r;
    int upload;

    (void)mod;
    if (cm_graph_args(args, nargs, 6, &x, &ctx) < 0
        || (upload = PyObject_IsTrue(args[4])) < 0) {
        return NULL;
    }
    done = (CUevent)PyLong_AsVoidPtr(args[5]);
    if (done == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError, "the graph has no event");
        }
        return NULL;
    }
    if (args[3] != Py_None) {
        if (cm_stream_resolve(args[3], &h) < 0) {
            return NULL;
        }
        if (cm_stream_check(args[3])
            && ((cm_stream *)args[3])->ctx != ctx) {
            PyErr_Format(PyExc_ValueError,
                         "%R belongs to another device's context than the "
                         "graph; launch it on a stream of the device it "
                         "was captured on", args[3]);
            return NULL;
        }
    }
    if (!upload && cm_stream_handle_is_default(h)
        && cm_capture_refuse_sync("Graph.launch() on the default stream")
               < 0) {
        return NULL;
    }
    CM_IN_CONTEXT(ctx, r, NULL,
                  cm_graph_launch_run(x, h, upload, done, args[3]));
    return r;
}

static PyObject *
cm_graph_settle_run(CUevent done, int launched)
{
    int err;
    int relaxed;

    if (launched) {
        if (cm_capture_restricted()) {
            /* A capture cudamem began forbids this thread the wait:
             * later. */
            Py_RETURN_FALSE;
        }
        /* In the relaxed mode: a global-mode capture another library
         * began, which cudamem does not know of, is not invalidated by
         * a wait for an event it has nothing to do with. */
        cm_capture_relax_always(&relaxed);
        CM_CU_NOGIL(err, EventSynchronize, (done));
        cm_capture_unrelax(relaxed);
        if (err < 0) {
            /* The launch failed (an error of the context's, which
             * close() raises): the event goes all the same. */
            (void)CM_CU_RAW(EventDestroy, (done));
            return NULL;
        }
    }
    if (CM_CU(EventDestroy, (done)) < 0) {
        return NULL;
    }
    Py_RETURN_TRUE;
}

/* _graph_settle(done, ctx, gen, launched): wait for the graph's last
 * launch (if launched) and destroy its event.  False, doing nothing,
 * where a capture forbids this thread the wait; True once done, or when
 * the context is gone (its work and events with it). */
PyObject *
cm_graph_settle(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    CUgraphExec done;
    cm_context *ctx;
    PyObject *r;
    int launched;

    (void)mod;
    if (cm_graph_args(args, nargs, 4, &done, &ctx) < 0) {
        if (PyErr_ExceptionMatches(PyExc_ValueError)) {
            PyErr_Clear();
            Py_RETURN_TRUE;
        }
        return NULL;
    }
    if ((launched = PyObject_IsTrue(args[3])) < 0) {
        return NULL;
    }
    CM_IN_CONTEXT(ctx, r, NULL,
                  cm_graph_settle_run((CUevent)done, launched));
    return r;
}

static PyObject *
cm_graph_destroy_run(CUgraphExec x)
{
    CUresult rc;
    int relaxed;

    /* The H200 refuses it while a capture forbids unsafe calls: made in
     * the relaxed capture mode (it joins no capture), always, since a
     * capture another library began in global mode forbids it too and
     * cudamem does not know of that one. */
    cm_capture_relax_always(&relaxed);
    rc = CM_CU_RAW(GraphExecDestroy, (x));
    cm_capture_unrelax(relaxed);
    if (cm_cu_check(rc, "cuGraphExecDestroy") < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* _graph_destroy(exec, ctx, gen): nothing to do once the context is
 * gone (its graphs went with it). */
PyObject *
cm_graph_destroy(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    CUgraphExec x;
    cm_context *ctx;
    PyObject *r;

    (void)mod;
    if (cm_graph_args(args, nargs, 3, &x, &ctx) < 0) {
        if (PyErr_ExceptionMatches(PyExc_ValueError)) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        return NULL;
    }
    CM_IN_CONTEXT(ctx, r, NULL, cm_graph_destroy_run(x));
    return r;
}

/* _capture_counts(): (captures, global-mode captures) cudamem began. */
PyObject *
cm_capture_counts(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    return Py_BuildValue("ii", atomic_load(&cm_cap_count),
                         atomic_load(&cm_cap_global));
}

/* ------------------------------------------------------------------ */
/* What background work may do while captures are in progress          */
/* ------------------------------------------------------------------ */

/* Count the capture of slot (its handle and mode set) as s's, begun by
 * this thread. */
static void
cm_cap_count_in(int slot, cm_stream *s)
{
    int mode = cm_cap_mode[slot];

    cm_cap_gen[slot] = s->ctx->gen;
    if (mode != CU_STREAM_CAPTURE_MODE_RELAXED) {
        atomic_store(&cm_cap_owner[slot], (uintptr_t)&cm_cap_mine);
        cm_cap_mine++;
    }
    atomic_fetch_add(&cm_cap_count, 1);
    if (mode == CU_STREAM_CAPTURE_MODE_GLOBAL) {
        atomic_fetch_add(&cm_cap_global, 1);
    }
}

/* Forget the capture of slot: it ended, failed to begin, or its stream
 * or context is gone.  The GraphPool it held (a new reference, or NULL).
 * GIL held. */
static PyObject *
cm_cap_forget(int slot)
{
    uintptr_t h = atomic_load(&cm_cap_handle[slot]);
    uintptr_t owner = atomic_load(&cm_cap_owner[slot]);
    int mode = cm_cap_mode[slot];
    PyObject *pool = cm_cap_pyref[slot];
    PyObject *held = cm_cap_held[slot];

    if (h == 0) {
        return NULL;
    }
    atomic_store(&cm_cap_owner[slot], 0);
    cm_cap_pyref[slot] = NULL;
    cm_cap_held[slot] = NULL;
    atomic_store(&cm_cap_pool[slot], NULL);
    if (cm_cap_thread_slot == slot) {
        cm_cap_thread_slot = -1;
    }
    if (!atomic_compare_exchange_strong(&cm_cap_handle[slot], &h, 0)) {
        Py_XDECREF(held);
        return pool;
    }
    if (owner == (uintptr_t)&cm_cap_mine && cm_cap_mine > 0) {
        cm_cap_mine--;
    }
    if (mode == CU_STREAM_CAPTURE_MODE_GLOBAL) {
        atomic_fetch_sub(&cm_cap_global, 1);
    }
    atomic_fetch_sub(&cm_cap_count, 1);
    /* Let go of last, the slot consistent: the objects' deallocation
     * may call back into cudamem. */
    Py_XDECREF(held);
    return pool;
}

/* Whether a capture this thread began in global or thread-local mode is
 * still recorded (the slots scanned; cm_cap_mine set to what they say). */
static int
cm_cap_mine_check(void)
{
    int n = 0;
    int i;

    if (cm_capture_any()) {
        for (i = 0; i < CM_CAP_SLOTS; i++) {
            if (atomic_load_explicit(&cm_cap_owner[i],
                                     memory_order_relaxed)
                == (uintptr_t)&cm_cap_mine) {
                n++;
            }
        }
    }
    cm_cap_mine = n;
    return n != 0;
}

int
cm_capture_restricted(void)
{
    if (atomic_load_explicit(&cm_cap_global, memory_order_relaxed) != 0) {
        return 1;
    }
    return cm_cap_mine != 0 && cm_cap_mine_check();
}

int
cm_capture_stream_known(CUstream h)
{
    return cm_capture_any() && !cm_stream_handle_is_default(h)
           && cm_cap_find(h) >= 0;
}

/* When no capture cudamem knows of is left: the releases the captures
 * held back run now, in every live context.  GIL held; never raises. */
static void
cm_capture_release_held(void)
{
    cm_context *live[CM_MAX_DEVICES];
    PyObject *exc;
    int n;
    int i;

    if (cm_capture_any()) {
        return;
    }
    exc = PyErr_GetRaisedException();
    /* Graph pools whose retirement waited give their memory back. */
    cm_ctx_up.graph_pools_tidy();
    n = cm_context_live(live);
    for (i = 0; i < n; i++) {
        if (cm_ctx_up.ctx_flush_held(live[i]) < 0) {
            PyErr_WriteUnraisable((PyObject *)live[i]);
        }
    }
    PyErr_SetRaisedException(exc);
}

/* The slot of a capture of ctx's stream h, or -1.  A handle alone does
 * not say it: a stream of a closed context keeps its Stream object after
 * the handle went, and a new stream may get the same handle. */
static int
cm_cap_find_in(const cm_context *ctx, CUstream h)
{
    int i;

    if (!cm_capture_any() || !ctx->alive) {
        return -1;
    }
    for (i = 0; i < CM_CAP_SLOTS; i++) {
        if (atomic_load(&cm_cap_handle[i]) == (uintptr_t)h
            && cm_cap_gen[i] == ctx->gen) {
            return i;
        }
    }
    return -1;
}

int
cm_capture_stream_of(const cm_context *ctx, CUstream h)
{
    return !cm_stream_handle_is_default(h) && cm_cap_find_in(ctx, h) >= 0;
}

int
cm_capture_stream_gone(cm_context *ctx, CUstream h)
{
    CUcontext prev;
    CUgraph g = NULL;
    int slot;

    slot = cm_cap_find_in(ctx, h);
    if (slot < 0) {
        return 0;
    }
    /* Ended in the driver first, its graph discarded: nobody can end it
     * any more.  From another thread than the one that began it (not
     * relaxed) the driver refuses; the queued destroy then takes it. */
    if (ctx->alive) {
        if (cm_context_enter(ctx, &prev) == 0) {
            if (CM_CU_RAW(StreamEndCapture, (h, &g)) == CUDA_SUCCESS
                && g != NULL) {
                (void)CM_CU_RAW(GraphDestroy, (g));
            }
            cm_context_leave(ctx, prev);
        }
        else {
            PyErr_Clear();
        }
    }
    Py_XDECREF(cm_cap_forget(slot));
    /* Run the queued destroy, and what waited with it, unless another
     * capture forbids that. */
    if (ctx->alive && !cm_capture_restricted()
        && cm_ctx_up.ctx_flush(ctx) < 0) {
        PyErr_WriteUnraisable((PyObject *)ctx);
    }
    cm_capture_release_held();
    return 1;
}

void
cm_capture_context_gone(unsigned long gen)
{
    int i;

    if (!cm_capture_any()) {
        return;
    }
    for (i = 0; i < CM_CAP_SLOTS; i++) {
        if (atomic_load(&cm_cap_handle[i]) != 0 && cm_cap_gen[i] == gen) {
            Py_XDECREF(cm_cap_forget(i));
        }
    }
    cm_capture_release_held();
}
