/* SPDX-License-Identifier: MIT */
/*
 * context/stream.c: the Stream type: its methods (synchronize, query,
 * add_callback, async_done, wait_event, __cuda_stream__, and the capture
 * methods graph.c defines), its dealloc, which keeps an idle stream for
 * reuse (callbacks.c) or gives its handle back through the context's
 * queue of pending destroys (memory/memory.c), and the context manager
 * of auto_synchronize().  The refusal of a wait from inside a host
 * callback (cm_check_not_in_callback) is here too; the factories are
 * streamfuncs.c's.
 *
 * Locks and the GIL: no lock.  Everything Python runs with the GIL held.
 * The GIL is released around cuStreamSynchronize (CM_CU_NOGIL: the
 * handle read before, no Python object touched), around the enqueue of
 * an add_callback record (CM_DRIVER_BEGIN_NOGIL: a callback already
 * running may be waiting for the GIL while the driver holds the locks the
 * enqueue needs; the record is counted in cm_pycb_live first and holds
 * its references), and around any driver call while Python callbacks are
 * in flight (CM_CU).  The queue of pending destroys never flushes on a
 * driver callback thread.
 */
#include "context/stream.h"

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

/* ------------------------------------------------------------------ */
/* Stream                                                              */
/* ------------------------------------------------------------------ */

/* A new Stream object for handle h of ctx.  New reference, or NULL. */
PyObject *
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
    /* An idle stream is kept for reuse, else destroyed; one dropped
     * while it captures is destroyed, and cudamem forgets its capture.
     * Reported against the type: self, at refcount 0, must not reach
     * the unraisable hook, which would take and drop a reference. */
    if (s->kind == CM_STREAM_USER && !Py_IsFinalizing()) {
        int capturing = cm_capture_stream_of(s->ctx, s->handle);

        if ((capturing || !cm_stream_cache_put(s))
            && cm_handle_release(s->ctx, 0, s->handle) < 0) {
            PyErr_WriteUnraisable((PyObject *)tp);
        }
        if (capturing) {
            (void)cm_capture_stream_gone(s->ctx, s->handle);
        }
    }
    Py_CLEAR(s->owner);
    Py_CLEAR(s->ctx);
    tp->tp_free(self);
    Py_DECREF(tp);
    PyErr_SetRaisedException(exc);
}

/* Refuse a call that waits on the device from inside a host callback:
 * the driver forbids it and the stream could never finish. */
int
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
        || cm_capture_refuse_stream(h, s->kind == CM_STREAM_EXTERNAL,
                                    "Stream.synchronize()") < 0
        || cm_capture_refuse_unsafe("Stream.synchronize()") < 0
        || cm_context_activate(s->ctx) < 0) {
        return NULL;
    }
    /* Under contention, a stream that a copy into pageable memory left
     * done costs no hand-over of the GIL (any other answer of the query:
     * the synchronize tells it).  Not while a capture forbids the
     * query. */
    if (h == cm_done_hint && h != NULL) {
        cm_done_hint = NULL;
        if (cm_keep_gil_auto_now() && !cm_capture_restricted()
            && CM_CU_RAW(StreamQuery, (h)) == CUDA_SUCCESS) {
            Py_RETURN_NONE;
        }
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
    PyObject *r;

    /* Before any driver call: on the callback thread even the context
     * lookup is refused, with a less telling error. */
    if (cm_check_not_in_callback("synchronize") < 0) {
        return NULL;
    }
    CM_IN_CONTEXT(((cm_stream *)self)->ctx, r, NULL,
                  cm_stream_synchronize_run(self, unused));
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
    if (cm_capture_refuse_unsafe("Stream.query()") < 0
        || cm_context_activate(s->ctx) < 0) {
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
    PyObject *r;

    CM_IN_CONTEXT(((cm_stream *)self)->ctx, r, NULL,
                  cm_stream_query_run(self, unused));
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
    (void)__atomic_fetch_add(&cm_pycb_live, 1, __ATOMIC_ACQ_REL);
    /* The GIL is released: a callback already running may be waiting for
     * it while the driver holds locks this enqueue needs. */
    CM_DRIVER_BEGIN_NOGIL
    rc = cm_hostcall_enqueue(h, &pc->hc, &fn);
    CM_DRIVER_END_NOGIL
    if (rc != CUDA_SUCCESS) {
        if (s->ctx != NULL) {
            s->ctx->pycalls--;
        }
        (void)__atomic_fetch_sub(&cm_pycb_live, 1, __ATOMIC_RELEASE);
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
    PyObject *r;

    CM_IN_CONTEXT(((cm_stream *)self)->ctx, r, NULL,
                  cm_stream_add_callback_run(self, args, nargs, kwnames));
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
    PyObject *r;

    CM_IN_CONTEXT(((cm_stream *)self)->ctx, r, NULL,
                  cm_stream_wait_event_run(self, event));
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
    {"begin_capture", (PyCFunction)(void (*)(void))cm_stream_begin_capture,
     METH_FASTCALL | METH_KEYWORDS,
     "begin_capture($self, /, mode='global', pool=None)\n--\n\n"
     "Begin capturing a CUDA graph: stream-ordered work on this stream is "
     "recorded instead of run.  mode: 'global', 'thread_local' or "
     "'relaxed'.  pool: the cudamem.GraphPool allocations for this stream "
     "come from during the capture (None: a new one)."},
    {"end_capture", cm_stream_end_capture, METH_NOARGS,
     "end_capture($self, /)\n--\n\n"
     "End the capture begun on this stream; returns a cudamem.Graph."},
    {"is_capturing", cm_stream_is_capturing, METH_NOARGS,
     "is_capturing($self, /)\n--\n\n"
     "Whether the stream is capturing (for an external stream, a capture "
     "another library began counts)."},
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

PyType_Spec cm_stream_spec = {
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

PyType_Spec cm_autosync_spec = {
    .name = "cudamem._core._AutoSynchronize",
    .basicsize = sizeof(cm_autosync),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC
             | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = cm_autosync_slots,
};
