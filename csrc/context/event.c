/* SPDX-License-Identifier: MIT */
/*
 * context/event.c: the Event type: record, wait, synchronize, query,
 * elapsed_time and `await event` (the factory is streamfuncs.c's).
 *
 * Locks and the GIL: no lock.  The GIL is released around
 * cuEventSynchronize (CM_CU_NOGIL: the handle read before, no Python
 * object touched) and around any driver call while Python callbacks are
 * in flight (CM_CU, CM_CU_RAW).
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
    PyObject *r;

    CM_IN_CONTEXT(((cm_event *)self)->ctx, r, NULL,
                  cm_event_record_run(self, args, nargs, kwnames));
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
    PyObject *r;

    CM_IN_CONTEXT(((cm_event *)self)->ctx, r, NULL,
                  cm_event_wait_run(self, args, nargs, kwnames));
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
        || cm_capture_refuse_unsafe("Event.synchronize()") < 0
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
    PyObject *r;

    /* Before any driver call: on the callback thread even the context
     * lookup is refused, with a less telling error. */
    if (cm_check_not_in_callback("synchronize") < 0) {
        return NULL;
    }
    CM_IN_CONTEXT(((cm_event *)self)->ctx, r, NULL,
                  cm_event_synchronize_run(self, unused));
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
    if (cm_capture_refuse_unsafe("Event.query()") < 0
        || cm_context_activate(e->ctx) < 0) {
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
    PyObject *r;

    CM_IN_CONTEXT(((cm_event *)self)->ctx, r, NULL,
                  cm_event_query_run(self, unused));
    return r;
}

/* Milliseconds between two events; NULL with CudaAPIError (named by the
 * driver: CUDA_ERROR_INVALID_HANDLE for a non-timing event,
 * CUDA_ERROR_NOT_READY for one not complete) or TypeError. */
PyObject *
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
    if (cm_capture_refuse_unsafe("await of an Event") < 0
        || cm_context_activate(e->ctx) < 0) {
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

PyType_Spec cm_event_spec = {
    .name = "cudamem.Event",
    .basicsize = sizeof(cm_event),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC
             | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = cm_event_slots,
};
