/* SPDX-License-Identifier: MIT */
/*
 * array/record.c: DeviceRecord, a device array of one structured item.
 */
#include "array/devicearray.h"

#include <numpy/arrayscalars.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* DeviceRecord                                                        */
/* ------------------------------------------------------------------ */

/* The dtype and offset of field key of a structured dtype (borrowed), or
 * NULL with KeyError. */
PyArray_Descr *
cm_record_field(PyArray_Descr *dt, PyObject *key, Py_ssize_t *offset)
{
    PyObject *fields = PyDataType_FIELDS(dt);
    PyObject *f;

    f = (PyUnicode_Check(key) && fields != NULL && fields != Py_None)
            ? PyDict_GetItemWithError(fields, key) : NULL;
    if (f == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetObject(PyExc_KeyError, key);
        }
        return NULL;
    }
    *offset = PyLong_AsSsize_t(PyTuple_GET_ITEM(f, 1));
    if (*offset == -1 && PyErr_Occurred()) {
        return NULL;
    }
    return (PyArray_Descr *)PyTuple_GET_ITEM(f, 0);
}

static PyObject *
cm_rec_getitem_impl_run(cm_da *self, PyObject *key, PyObject *stream)
{
    PyArray_Descr *ft;
    PyObject *bound;
    Py_ssize_t offset;

    ft = cm_record_field(self->dtype, key, &offset);
    if (ft == NULL) {
        return NULL;
    }
    bound = cm_pick_stream(stream, self);
    if (bound == NULL) {
        return NULL;
    }
    if (PyDataType_HASSUBARRAY(ft)) {
        PyArray_ArrayDescr *sub = PyDataType_SUBARRAY(ft);
        Py_ssize_t shape[NPY_MAXDIMS];
        Py_ssize_t strides[NPY_MAXDIMS];
        int ndim = cm_parse_shape(sub->shape, shape);

        if (ndim < 0) {
            return NULL;
        }
        cm_layout_compact(ndim, shape, PyDataType_ELSIZE(sub->base), 0, strides);
        return cm_da_subview(self, ST->DeviceNDArray_type, ndim, shape,
                             strides, sub->base, offset, bound);
    }
    if (PyDataType_HASFIELDS(ft)) {
        return cm_da_subview(self, ST->DeviceRecord_type, 0, NULL, NULL, ft,
                             offset, bound);
    }
    if (cm_da_activate(self) < 0) {
        return NULL;
    }
    return cm_read_scalar(self->ptr + (CUdeviceptr)offset, ft, stream,
                          self->stream);
}

/* cm_rec_getitem_impl_run with the array's context current. */
static PyObject *
cm_rec_getitem_impl(cm_da *self, PyObject *key, PyObject *stream)
{
    PyObject *r;

    CM_ENTERED(cm_da_enter, cm_da_leave, self, r, NULL,
               cm_rec_getitem_impl_run(self, key, stream));
    return r;
}

static int
cm_rec_setitem_impl_run(cm_da *self, PyObject *key, PyObject *value,
                        PyObject *stream)
{
    PyArray_Descr *ft;
    PyArrayObject *tmp;
    Py_ssize_t offset;
    cm_view dv;
    cm_view sv;
    CUstream h;
    int async;
    int rc = -1;

    async = cm_effective_stream(stream, self->stream, &h);
    if (async < 0) {
        return -1;
    }
    ft = cm_record_field(self->dtype, key, &offset);
    if (ft == NULL || cm_da_activate(self) < 0) {
        return -1;
    }
    Py_INCREF(ft);
    tmp = (PyArrayObject *)PyArray_NewFromDescr(&PyArray_Type, ft, 0, NULL,
                                                NULL, NULL, 0, NULL);
    if (tmp == NULL) {
        return -1;
    }
    if (PyArray_CopyObject(tmp, value) < 0) {
        goto out_tmp;
    }
    sv.addr = (uintptr_t)PyArray_DATA(tmp);
    sv.ndim = 0;
    sv.shape = NULL;
    sv.strides = NULL;
    sv.itemsize = PyDataType_ELSIZE(ft);
    sv.device = 0;
    dv = sv;
    dv.addr = (uintptr_t)self->ptr + (uintptr_t)offset;
    dv.device = 1;
    if (cm_copy(&dv, &sv, h, async) < 0) {
        goto out_tmp;
    }
    /* tmp is a temporary: let the copy land; unbound calls sync. */
    rc = cm_stream_wait(async ? h : NULL);
out_tmp:
    Py_DECREF(tmp);
    return rc;
}

/* cm_rec_setitem_impl_run with the array's context current. */
static int
cm_rec_setitem_impl(cm_da *self, PyObject *key, PyObject *value,
                    PyObject *stream)
{
    int r;

    CM_ENTERED(cm_da_enter, cm_da_leave, self, r, -1,
               cm_rec_setitem_impl_run(self, key, value, stream));
    return r;
}

PyObject *
cm_rec_subscript(PyObject *self, PyObject *key)
{
    return cm_rec_getitem_impl((cm_da *)self, key, NULL);
}

int
cm_rec_ass_subscript(PyObject *self, PyObject *key, PyObject *value)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_TypeError, "record fields cannot be deleted");
        return -1;
    }
    return cm_rec_setitem_impl((cm_da *)self, key, value, NULL);
}

const char cm_rec_getitem_doc[] = PyDoc_STR(
"getitem($self, item, /, stream=0)\n--\n\n"
"Field ``item``: a host scalar, a nested DeviceRecord view or a\n"
"subarray DeviceNDArray view.");

PyObject *
cm_rec_getitem(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
               PyObject *kwnames)
{
    static const int names[] = {K_ITEM, K_STREAM};
    PyObject *a[2];

    if (cm_parse("getitem", args, nargs, kwnames, names, 2, 1, a) < 0) {
        return NULL;
    }
    return cm_rec_getitem_impl((cm_da *)self, a[0], a[1]);
}

const char cm_rec_setitem_doc[] = PyDoc_STR(
"setitem($self, key, value, stream=0)\n--\n\n"
"Write field ``key`` (value converted on the host, then uploaded).");

PyObject *
cm_rec_setitem(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
               PyObject *kwnames)
{
    static const int names[] = {K_KEY, K_VALUE, K_STREAM};
    PyObject *a[3];

    if (cm_parse("setitem", args, nargs, kwnames, names, 3, 2, a) < 0
        || cm_rec_setitem_impl((cm_da *)self, a[0], a[1], a[2]) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}
