/* SPDX-License-Identifier: MIT */
/*
 * context/rawfuncs.c: test helpers beside the Stream and Event objects:
 * raw streams and events made and destroyed with no cudamem object, a
 * capture begun as another library begins one, and a gate, a host
 * function that holds a stream's worker until the test opens it.  No
 * cudamem state is kept for any of them.
 *
 * Locks and the GIL: a gate's mutex guards its two flags; it is taken by
 * the host function on the driver's thread (without the GIL) and by
 * _raw_gate_open, never across a driver or Python call.  The waits
 * (stream and event synchronisations) run with the GIL released
 * (CM_CU_NOGIL).
 */
#include "context/stream.h"

#include <pthread.h>
#include <stdlib.h>

PyDoc_STRVAR(cm_raw_stream_create_doc,
"_raw_stream_create(flags=0)\n--\n\n"
"cuStreamCreate in the current context; the raw handle (tests only).");

static PyObject *
cm_raw_stream_create_fn(PyObject *mod, PyObject *args)
{
    unsigned int flags = 0;
    CUstream s = NULL;

    (void)mod;
    if (!PyArg_ParseTuple(args, "|I:_raw_stream_create", &flags)
        || cm_context_current() == NULL
        || CM_CU(StreamCreate, (&s, flags)) < 0) {
        return NULL;
    }
    return PyLong_FromVoidPtr((void *)s);
}

PyDoc_STRVAR(cm_raw_stream_destroy_doc,
"_raw_stream_destroy(handle)\n--\n\ncuStreamDestroy (tests only).");

static PyObject *
cm_raw_stream_destroy_fn(PyObject *mod, PyObject *arg)
{
    void *s = PyLong_AsVoidPtr(arg);

    (void)mod;
    if ((s == NULL && PyErr_Occurred())
        || CM_CU(StreamDestroy, ((CUstream)s)) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cm_raw_begin_capture_doc,
"_raw_begin_capture(handle, mode, /)\n--\n\n"
"cuStreamBeginCapture of a raw stream, as another library begins one, "
"without cudamem's record of its captures (tests only).");

static PyObject *
cm_raw_begin_capture_fn(PyObject *mod, PyObject *args)
{
    unsigned long long h;
    int mode;

    (void)mod;
    if (!PyArg_ParseTuple(args, "Ki:_raw_begin_capture", &h, &mode)
        || CM_CU(StreamBeginCapture,
                 ((CUstream)(uintptr_t)h, (CUstreamCaptureMode)mode)) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cm_raw_capture_mode_doc,
"_raw_capture_mode(mode, /)\n--\n\n"
"cuThreadExchangeStreamCaptureMode: the calling thread's capture "
"interaction mode set to mode; the mode it had (tests only).");

static PyObject *
cm_raw_capture_mode_fn(PyObject *mod, PyObject *arg)
{
    long v = PyLong_AsLong(arg);
    CUstreamCaptureMode m;

    (void)mod;
    if (v == -1 && PyErr_Occurred()) {
        return NULL;
    }
    m = (CUstreamCaptureMode)v;
    if (CM_CU(ThreadExchangeStreamCaptureMode, (&m)) < 0) {
        return NULL;
    }
    return PyLong_FromLong((long)m);
}

PyDoc_STRVAR(cm_raw_stream_sync_doc,
"_raw_stream_synchronize(handle)\n--\n\n"
"cuStreamSynchronize with the GIL released (tests only).");

static PyObject *
cm_raw_stream_sync_fn(PyObject *mod, PyObject *arg)
{
    void *s = PyLong_AsVoidPtr(arg);
    int err;

    (void)mod;
    if ((s == NULL && PyErr_Occurred()) || cm_context_current() == NULL) {
        return NULL;
    }
    CM_CU_NOGIL(err, StreamSynchronize, ((CUstream)s));
    if (err < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cm_raw_event_create_doc,
"_raw_event_create(flags=0)\n--\n\n"
"cuEventCreate in the current context; the raw handle (benchmarks only).");

static PyObject *
cm_raw_event_create_fn(PyObject *mod, PyObject *args)
{
    unsigned int flags = 0;
    CUevent e = NULL;

    (void)mod;
    if (!PyArg_ParseTuple(args, "|I:_raw_event_create", &flags)
        || cm_context_current() == NULL
        || CM_CU(EventCreate, (&e, flags)) < 0) {
        return NULL;
    }
    return PyLong_FromVoidPtr((void *)e);
}

PyDoc_STRVAR(cm_raw_event_destroy_doc,
"_raw_event_destroy(handle)\n--\n\ncuEventDestroy (benchmarks only).");

static PyObject *
cm_raw_event_destroy_fn(PyObject *mod, PyObject *arg)
{
    void *e = PyLong_AsVoidPtr(arg);

    (void)mod;
    if ((e == NULL && PyErr_Occurred())
        || CM_CU(EventDestroy, ((CUevent)e)) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cm_raw_event_record_sync_doc,
"_raw_event_record_sync(event, stream)\n--\n\n"
"cuEventRecord, then cuEventSynchronize with the GIL released, as\n"
"Event.record and Event.synchronize do (benchmarks only).");

static PyObject *
cm_raw_event_record_sync_fn(PyObject *mod, PyObject *args)
{
    void *e;
    void *s;
    PyObject *eo;
    PyObject *so;
    int err;

    (void)mod;
    if (!PyArg_ParseTuple(args, "OO:_raw_event_record_sync", &eo, &so)) {
        return NULL;
    }
    e = PyLong_AsVoidPtr(eo);
    if (e == NULL && PyErr_Occurred()) {
        return NULL;
    }
    s = PyLong_AsVoidPtr(so);
    if ((s == NULL && PyErr_Occurred())
        || CM_CU(EventRecord, ((CUevent)e, (CUstream)s)) < 0) {
        return NULL;
    }
    CM_CU_NOGIL(err, EventSynchronize, ((CUevent)e));
    if (err < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* A host function that waits until opened; freed by whichever of the
 * host function and _raw_gate_open comes last. */
typedef struct {
    pthread_mutex_t mu;   /* guards the two flags */
    pthread_cond_t cv;    /* signalled when opened */
    int open;             /* _raw_gate_open was called */
    int refs;             /* the host function and the opener */
} cm_gate;

static void
cm_gate_unref(cm_gate *g)
{
    int last;

    cm_mu_lock(&g->mu);
    last = --g->refs == 0;
    cm_mu_unlock(&g->mu);
    if (last) {
        pthread_cond_destroy(&g->cv);
        pthread_mutex_destroy(&g->mu);
        free(g);
    }
}

static void CUDA_CB
cm_gate_fn(void *arg)
{
    cm_gate *g = arg;

    cm_mu_lock(&g->mu);
    while (!g->open) {
        pthread_cond_wait(&g->cv, &g->mu);
    }
    cm_mu_unlock(&g->mu);
    cm_gate_unref(g);
}

PyDoc_STRVAR(cm_raw_gate_doc,
"_raw_gate(handle)\n--\n\n"
"Hold the stream with that raw handle until _raw_gate_open(gate) (a host "
"function that waits); the gate (tests only).");

static PyObject *
cm_raw_gate_fn(PyObject *mod, PyObject *arg)
{
    void *s = PyLong_AsVoidPtr(arg);
    cm_gate *g;

    (void)mod;
    if ((s == NULL && PyErr_Occurred()) || cm_context_current() == NULL) {
        return NULL;
    }
    g = calloc(1, sizeof(*g));
    if (g == NULL) {
        return PyErr_NoMemory();
    }
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->refs = 2;
    if (CM_CU(LaunchHostFunc, ((CUstream)s, cm_gate_fn, g)) < 0) {
        pthread_cond_destroy(&g->cv);
        pthread_mutex_destroy(&g->mu);
        free(g);
        return NULL;
    }
    return PyLong_FromVoidPtr(g);
}

PyDoc_STRVAR(cm_raw_gate_open_doc,
"_raw_gate_open(gate)\n--\n\nLet a _raw_gate's stream go on (once).");

static PyObject *
cm_raw_gate_open_fn(PyObject *mod, PyObject *arg)
{
    cm_gate *g = PyLong_AsVoidPtr(arg);

    (void)mod;
    if (g == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError, "not a gate");
        }
        return NULL;
    }
    cm_mu_lock(&g->mu);
    g->open = 1;
    pthread_cond_broadcast(&g->cv);
    cm_mu_unlock(&g->mu);
    cm_gate_unref(g);
    Py_RETURN_NONE;
}

static PyMethodDef cm_raw_functions[] = {
    {"_raw_stream_create", cm_raw_stream_create_fn, METH_VARARGS,
     cm_raw_stream_create_doc},
    {"_raw_begin_capture", cm_raw_begin_capture_fn, METH_VARARGS,
     cm_raw_begin_capture_doc},
    {"_raw_capture_mode", cm_raw_capture_mode_fn, METH_O,
     cm_raw_capture_mode_doc},
    {"_raw_stream_destroy", cm_raw_stream_destroy_fn, METH_O,
     cm_raw_stream_destroy_doc},
    {"_raw_stream_synchronize", cm_raw_stream_sync_fn, METH_O,
     cm_raw_stream_sync_doc},
    {"_raw_event_create", cm_raw_event_create_fn, METH_VARARGS,
     cm_raw_event_create_doc},
    {"_raw_event_destroy", cm_raw_event_destroy_fn, METH_O,
     cm_raw_event_destroy_doc},
    {"_raw_event_record_sync", cm_raw_event_record_sync_fn, METH_VARARGS,
     cm_raw_event_record_sync_doc},
    {"_raw_gate", cm_raw_gate_fn, METH_O, cm_raw_gate_doc},
    {"_raw_gate_open", cm_raw_gate_open_fn, METH_O, cm_raw_gate_open_doc},
    {NULL, NULL, 0, NULL},
};

int
cm_rawfuncs_init(PyObject *mod)
{
    return PyModule_AddFunctions(mod, cm_raw_functions);
}
