/* SPDX-License-Identifier: MIT */
/*
 * stream.c: streams, events and host callbacks.
 *
 * So far it owns only the resolution of stream arguments, which every
 * enqueueing call shares: 0 / None / False mean "no stream given", and any
 * object with __cuda_stream__ (the cuda.core protocol) gives its handle.
 *
 * Locking: none; GIL held throughout.
 */
#include "cm.h"

static PyObject *cm_str_cuda_stream;   /* interned "__cuda_stream__" */

int
cm_stream_resolve(PyObject *obj, CUstream *handle)
{
    PyObject *meth;
    PyObject *t;
    unsigned long long h;

    *handle = 0;
    if (obj == Py_None || obj == Py_False
        || (PyLong_CheckExact(obj) && PyLong_AsLong(obj) == 0)) {
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
    if (h == (unsigned long long)-1 && PyErr_Occurred()) {
        return -1;
    }
    *handle = (CUstream)(uintptr_t)h;
    return 1;
}

int
cm_on_driver_thread(void)
{
    /* Placeholder until host callbacks land: none run yet. */
    return 0;
}

PyObject *
cm_stream_external(CUstream handle)
{
    /* Placeholder until the Stream type lands: the bare handle. */
    return PyLong_FromVoidPtr((void *)handle);
}

int
cm_stream_init(PyObject *mod, cm_state *st)
{
    (void)mod;
    (void)st;
    cm_str_cuda_stream = PyUnicode_InternFromString("__cuda_stream__");
    return cm_str_cuda_stream == NULL ? -1 : 0;
}
