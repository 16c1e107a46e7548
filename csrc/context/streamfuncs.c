/* SPDX-License-Identifier: MIT */
/*
 * context/streamfuncs.c: the module-level stream, event and graph
 * functions (stream(), event(), external_stream(), ...), and the init of
 * streams and events.
 *
 * Locks and the GIL: no lock.  The GIL is released around cuStreamCreate
 * (CM_CU_NOGIL: the context held by a reference, which a close on
 * another thread may take away from the registry meanwhile), around the
 * destroy of a stream whose object could not be made
 * (CM_DRIVER_BEGIN_NOGIL), and around any driver call while Python
 * callbacks are in flight (CM_CU).
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

/* ------------------------------------------------------------------ */
/* Module-level functions                                              */
/* ------------------------------------------------------------------ */

/* A new Stream made with flags (and priority 0) in ctx, which is
 * current: a kept idle stream of that context made the same way if there
 * is one, else a new one from cuStreamCreate.  New reference, or NULL. */
PyObject *
cm_stream_make_in(cm_context *ctx, unsigned int flags)
{
    cm_stream *s = NULL;
    CUstream h;
    int err;

    /* Alive when found, and no release of the GIL until cuStreamCreate
     * counts as in flight, so a close of the context on another thread
     * destroys the new stream with it, after the call.  Held: the
     * context may be closed, and let go of, before the Stream holds it. */
    Py_INCREF(ctx);
    h = cm_stream_cache_take(ctx, flags, 0);
    if (h == NULL) {
        CM_CU_NOGIL(err, StreamCreate, (&h, flags));
        if (err < 0) {
            goto out;
        }
    }
    s = (cm_stream *)cm_stream_new(ctx, h, CM_STREAM_USER, NULL);
    if (s == NULL) {
        if (ctx->alive) {  /* else the close destroyed it */
            CM_DRIVER_BEGIN_NOGIL
            (void)CM_CU_RAW(StreamDestroy, (h));
            CM_DRIVER_END_NOGIL
        }
        goto out;
    }
    s->flags = flags;
out:
    Py_DECREF(ctx);
    return (PyObject *)s;
}

/* cm_stream_make_in the current context. */
static PyObject *
cm_stream_make(unsigned int flags)
{
    cm_context *ctx = cm_context_current();

    return ctx == NULL ? NULL : cm_stream_make_in(ctx, flags);
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

PyDoc_STRVAR(cm_gil_yield_hold_doc,
"_gil_yield_hold(n)\n--\n\n"
"Tests only: count n more Python callbacks as in flight (n may be "
"negative to give them back; the count never goes below 0), so that every "
"driver call releases the GIL as it does while callbacks are in flight.  A "
"reset that drops queued callbacks leaves the count up for good on a GPU; "
"the simulator runs every callback, so tests use this to reach that "
"state.  Returns the count.");

static PyObject *
cm_gil_yield_hold_fn(PyObject *mod, PyObject *arg)
{
    long n = PyLong_AsLong(arg);
    long now;

    (void)mod;
    if (n == -1 && PyErr_Occurred()) {
        return NULL;
    }
    now = __atomic_load_n(&cm_pycb_live, __ATOMIC_ACQUIRE);
    if (n < -now) {
        n = -now;
    }
    now = __atomic_add_fetch(&cm_pycb_live, n, __ATOMIC_ACQ_REL);
    return PyLong_FromLong(now);
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
    {"_gil_yield_hold", cm_gil_yield_hold_fn, METH_O, cm_gil_yield_hold_doc},
    {"_set_stream_cache_size", cm_set_stream_cache_size, METH_O,
     cm_set_stream_cache_size_doc},
    {"_graph_launch", (PyCFunction)(void (*)(void))cm_graph_launch,
     METH_FASTCALL,
     "_graph_launch(exec, ctx, gen, stream, upload, done, /)\n"
     "--\n\n"
     "cuGraphLaunch (or cuGraphUpload) of exec on stream (None: the "
     "default stream), then the event done recorded after the launch "
     "(True; an upload: False); StreamCaptureError, before any driver "
     "call, where the stream captures; for cudamem.Graph."},
    {"_graph_destroy", (PyCFunction)(void (*)(void))cm_graph_destroy,
     METH_FASTCALL,
     "_graph_destroy(exec, ctx, gen, /)\n--\n\n"
     "cuGraphExecDestroy, unless the context is gone; for cudamem.Graph."},
    {"_graph_settle", (PyCFunction)(void (*)(void))cm_graph_settle,
     METH_FASTCALL,
     "_graph_settle(done, ctx, gen, launched, /)\n--\n\n"
     "Wait for the event done (if launched) and destroy it: False, doing "
     "nothing, where a capture forbids this thread the wait; for "
     "cudamem.Graph."},
    {"_capture_counts", cm_capture_counts, METH_NOARGS,
     "_capture_counts($module, /)\n--\n\n"
     "(captures, global-mode captures) cudamem began and has not ended "
     "(tests)."},
    {NULL, NULL, 0, NULL},
};

/* ------------------------------------------------------------------ */
/* Init                                                                */
/* ------------------------------------------------------------------ */

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
    if (cm_kcopy_init(mod) < 0) {
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
    /* Private helper types, kept in the module state; the module keeps
     * a reference as attributes too. */
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
    if (PyModule_AddFunctions(mod, cm_stream_functions) < 0
        || cm_rawfuncs_init(mod) < 0) {
        return -1;
    }
    return cm_stream_register_atexit(mod);
}
