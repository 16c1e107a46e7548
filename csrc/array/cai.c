/* SPDX-License-Identifier: MIT */
/*
 * array/cai.c: the CUDA Array Interface import (foreign objects as
 * device arrays).
 *
 * Locks and the GIL: no lock; the GIL is held but around the
 * synchronisation on the dict's stream (CM_CU_NOGIL, cm_cai_stream),
 * which touches only the stream handle.
 */
#include "array/devicearray.h"

#include <numpy/arrayscalars.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* CUDA Array Interface import                                         */
/* ------------------------------------------------------------------ */

/* config.CUDA_ARRAY_INTERFACE_SYNC (the config module as the package
 * registered it), read at each use; 1, 0 or -1. */
int
cm_config_cai_sync(void)
{
    PyObject *config = CM_REGISTERED(config);
    PyObject *v;
    int r;

    if (config == NULL) {
        return -1;
    }
    v = PyObject_GetAttr(config, cm_str_sync_cfg);
    if (v == NULL) {
        return -1;
    }
    r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* Whether the current context's device reaches pageable host memory
 * (HMM or ATS), where any mapped address of the process is device
 * memory too. */
static int
cm_pageable_access(void)
{
    cm_context *ctx = cm_context_current();
    int v = 0;

    if (ctx == NULL) {
        PyErr_Clear();
        return 0;
    }
    return CM_CU_RAW(DeviceGetAttribute,
                     (&v, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS,
                      ctx->device->handle)) == CUDA_SUCCESS && v != 0;
}

/* 0 if memory cudamem did not allocate, that an array spans, may be
 * used by the device: p, the address given, lies inside an allocation
 * the driver knows, of any kind and from any library (device, managed,
 * page-locked or mapped host memory, IPC mappings), and the span, bytes
 * [p + lo, p + lo + n) (lo <= 0 < n), fits inside it; or, where the
 * device reaches pageable memory, the span is mapped memory of this
 * process.  Else -1 with ValueError: what names the address's source,
 * reach what spans it, for the messages.  One pointer query
 * (cuPointerGetAttributes answers for unknown addresses without
 * failing); the driver's range query where that entry point fails. */
int
cm_check_extent(CUdeviceptr p, Py_ssize_t lo, size_t n, const char *what,
                const char *reach)
{
    CUpointer_attribute attrs[3] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                    CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                    CU_POINTER_ATTRIBUTE_RANGE_SIZE};
    unsigned int type = 0;
    CUdeviceptr base = 0;
    size_t size = 0;
    void *data[3] = {&type, &base, &size};
    CUdeviceptr start = p - (CUdeviceptr)(-lo);
    long page;
    uintptr_t first;
    char hex[24];

    if (CM_CU_RAW(PointerGetAttributes, (3, attrs, data, p))
            != CUDA_SUCCESS) {
        /* No answer for unknown memory: check the fit where known. */
        type = 0;
        if (CM_CU_RAW(MemGetAddressRange, (&base, &size, p))
                != CUDA_SUCCESS) {
            return 0;
        }
        type = CU_MEMORYTYPE_DEVICE;
    }
    if (type == 0) {
        page = sysconf(_SC_PAGESIZE);
        first = (uintptr_t)start & ~(uintptr_t)(page > 0 ? page - 1 : 0);
        /* msync fails with ENOMEM where a page of the range is unmapped. */
        if (cm_pageable_access()
            && msync((void *)first, (size_t)(start - first) + n, MS_ASYNC)
                   == 0) {
            return 0;
        }
        snprintf(hex, sizeof(hex), "0x%llx", (unsigned long long)p);
        PyErr_Format(PyExc_ValueError,
                     "%s: pointer %s is in no live CUDA allocation "
                     "(never allocated, or freed)", what, hex);
        return -1;
    }
    if (size > 0 && (start < base || n > size
                     || start - base > size - n)) {
        snprintf(hex, sizeof(hex), "0x%llx", (unsigned long long)base);
        PyErr_Format(PyExc_ValueError,
                     "%s outside the allocation the pointer is in "
                     "(%zu bytes at %s)", reach, size, hex);
        return -1;
    }
    return 0;
}

/* cm_from_cai's step: the dict's 'version' (0 to 3) and, from version 1,
 * no 'mask'.  0, or -1 with an exception. */
static int
cm_cai_version(PyObject *desc)
{
    PyObject *v;
    Py_ssize_t version;

    v = PyDict_GetItemWithError(desc, ST->str_version);
    if (v == NULL || v == Py_None) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError,
                            "__cuda_array_interface__ has no 'version'");
        }
        return -1;
    }
    if (!PyLong_Check(v)) {
        PyErr_SetString(PyExc_TypeError,
                        "__cuda_array_interface__ 'version' must be an int");
        return -1;
    }
    version = PyLong_AsSsize_t(v);
    if (version == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (version > 3 || version < 0) {
        PyErr_Format(PyExc_ValueError,
                     "__cuda_array_interface__ 'version' %zd is not "
                     "supported (0 to 3 are)", version);
        return -1;
    }
    v = PyDict_GetItemWithError(desc, ST->str_mask);
    if (v == NULL && PyErr_Occurred()) {
        return -1;
    }
    if (version >= 1 && v != NULL && v != Py_None) {
        PyErr_SetString(PyExc_NotImplementedError,
                        "Masked arrays are not supported");
        return -1;
    }
    return 0;
}

/* cm_from_cai's step: the dict's 'shape' into shape[] (NPY_MAXDIMS
 * entries).  ndim, or -1 with an exception. */
static int
cm_cai_shape(PyObject *desc, Py_ssize_t *shape)
{
    PyObject *v;
    Py_ssize_t n;
    int ndim;
    int i;

    v = PyDict_GetItemWithError(desc, ST->str_shape);
    if (v == NULL || !PyTuple_Check(v)) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError,
                            "__cuda_array_interface__ 'shape' must be a "
                            "tuple of ints");
        }
        return -1;
    }
    n = PyTuple_GET_SIZE(v);
    if (n > NPY_MAXDIMS) {
        PyErr_SetString(PyExc_ValueError,
                        "__cuda_array_interface__ 'shape' has too many "
                        "dimensions");
        return -1;
    }
    ndim = (int)n;
    for (i = 0; i < ndim; i++) {
        if (cm_as_ssize(PyTuple_GET_ITEM(v, i), &shape[i]) < 0) {
            return -1;
        }
        if (shape[i] < 0) {
            PyErr_SetString(PyExc_ValueError,
                            "__cuda_array_interface__ 'shape' has a "
                            "negative dimension");
            return -1;
        }
    }
    return ndim;
}

/* cm_from_cai's step: the dtype of the dict's 'typestr' ('descr' for
 * structured types); no Python objects.  A new reference, or NULL with an
 * exception. */
static PyArray_Descr *
cm_cai_dtype(PyObject *desc)
{
    PyArray_Descr *dtype = NULL;
    PyObject *v;
    PyObject *d;

    v = PyDict_GetItemWithError(desc, ST->str_typestr);
    if (v == NULL || !PyUnicode_Check(v)) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError,
                            "__cuda_array_interface__ 'typestr' must be a "
                            "str");
        }
        return NULL;
    }
    d = PyDict_GetItemWithError(desc, ST->str_descr);
    if (d == NULL && PyErr_Occurred()) {
        return NULL;
    }
    if (!PyArray_DescrConverter(v, &dtype)) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError,
                     "__cuda_array_interface__ 'typestr' %R is not a data "
                     "type", v);
        return NULL;
    }
    if (d != NULL && PyList_Check(d) && PyDataType_ELSIZE(dtype) > 0
        && dtype->type_num == NPY_VOID && !PyDataType_HASFIELDS(dtype)) {
        PyArray_Descr *full = NULL;

        if (PyArray_DescrConverter(d, &full)
            && PyDataType_ELSIZE(full) == PyDataType_ELSIZE(dtype)) {
            Py_SETREF(dtype, full);
        }
        else {
            Py_XDECREF(full);
            PyErr_Clear();
        }
    }
    if (PyDataType_REFCHK(dtype)) {
        PyErr_SetString(PyExc_ValueError,
                        "__cuda_array_interface__ 'typestr' describes "
                        "Python objects");
        Py_DECREF(dtype);
        return NULL;
    }
    return dtype;
}

/* cm_from_cai's step: the dict's 'strides' into strides[] (compact when
 * absent or None), then the layout's size and span checked.  0, or -1
 * with an exception. */
static int
cm_cai_strides(PyObject *desc, int ndim, const Py_ssize_t *shape,
               Py_ssize_t itemsize, Py_ssize_t *strides)
{
    PyObject *v;
    int i;

    v = PyDict_GetItemWithError(desc, ST->str_strides);
    if (v == NULL && PyErr_Occurred()) {
        return -1;
    }
    if (v == NULL || v == Py_None) {
        cm_layout_compact(ndim, shape, itemsize, 0, strides);
    }
    else {
        if (!PyTuple_Check(v) || PyTuple_GET_SIZE(v) != ndim) {
            PyErr_SetString(PyExc_ValueError,
                            "__cuda_array_interface__ 'strides' must be "
                            "None or a tuple of ints as long as 'shape'");
            return -1;
        }
        for (i = 0; i < ndim; i++) {
            if (cm_as_ssize(PyTuple_GET_ITEM(v, i), &strides[i]) < 0) {
                return -1;
            }
        }
    }
    if (cm_check_size(ndim, shape, itemsize) < 0
        || cm_check_span(ndim, shape, strides, itemsize) < 0) {
        return -1;
    }
    return 0;
}

/* cm_from_cai's step: the pointer of the dict's 'data' into *ptr, and,
 * when the layout spans bytes, the check that they lie in live memory
 * the device can use.  0, or -1 with an exception. */
static int
cm_cai_data(PyObject *desc, int ndim, const Py_ssize_t *shape,
            const Py_ssize_t *strides, Py_ssize_t itemsize,
            unsigned long long *ptr)
{
    PyObject *data;
    Py_ssize_t lo;
    Py_ssize_t span;

    data = PyDict_GetItemWithError(desc, ST->str_data);
    if (data == NULL || !PyTuple_Check(data) || PyTuple_GET_SIZE(data) != 2
        || !PyLong_Check(PyTuple_GET_ITEM(data, 0))) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError,
                            "__cuda_array_interface__ 'data' must be a "
                            "tuple (pointer: int, read_only: bool)");
        }
        return -1;
    }
    *ptr = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(data, 0));
    if (*ptr == (unsigned long long)-1 && PyErr_Occurred()) {
        return -1;
    }
    span = cm_layout_span(ndim, shape, strides, itemsize, &lo);
    if (span > 0) {
        if (*ptr == 0) {
            PyErr_SetString(PyExc_ValueError,
                            "__cuda_array_interface__ 'data' is a NULL "
                            "pointer for a non-empty array");
            return -1;
        }
        if ((unsigned long long)(-lo) > *ptr
            || *ptr + (unsigned long long)(span + lo) < *ptr) {
            PyErr_SetString(PyExc_ValueError,
                            "__cuda_array_interface__ 'strides' reach "
                            "outside the address space");
            return -1;
        }
        /* The view must lie in live memory the device can use. */
        if (cm_check_extent((CUdeviceptr)*ptr, lo, (size_t)span,
                            "__cuda_array_interface__ 'data'",
                            "__cuda_array_interface__ 'strides' reach")
                < 0) {
            return -1;
        }
    }
    return 0;
}

/* cm_from_cai's step: the dict's 'stream': *bound a new reference to the
 * external stream object, or NULL when absent or None; synchronised when
 * sync and config.CUDA_ARRAY_INTERFACE_SYNC are both true.  0, or -1 with
 * an exception (*bound then NULL). */
static int
cm_cai_stream(PyObject *desc, int sync, PyObject **bound)
{
    PyObject *v;
    CUstream h = NULL;
    int err;

    *bound = NULL;
    v = PyDict_GetItemWithError(desc, ST->str_stream);
    if (v == NULL && PyErr_Occurred()) {
        return -1;
    }
    if (v != NULL && v != Py_None) {
        void *hp;
        int want;

        if (!PyLong_Check(v)) {
            PyErr_SetString(PyExc_TypeError,
                            "__cuda_array_interface__ 'stream' must be an "
                            "int or None");
            return -1;
        }
        hp = PyLong_AsVoidPtr(v);
        if (hp == NULL && PyErr_Occurred()) {
            return -1;
        }
        h = (CUstream)hp;
        *bound = cm_stream_external(h);
        if (*bound == NULL) {
            return -1;
        }
        want = sync ? cm_config_cai_sync() : 0;
        if (want < 0) {
            Py_CLEAR(*bound);
            return -1;
        }
        if (want) {
            CM_CU_NOGIL(err, StreamSynchronize, (h));
            if (err < 0) {
                Py_CLEAR(*bound);
                return -1;
            }
        }
    }
    return 0;
}

/* A DeviceNDArray view over the memory a CAI dict describes, owned by
 * owner (may be NULL).  Synchronises on the dict's stream when sync and
 * config.CUDA_ARRAY_INTERFACE_SYNC are both true. */
PyObject *
cm_from_cai(PyObject *desc, PyObject *owner, int sync)
{
    Py_ssize_t shape[NPY_MAXDIMS];
    Py_ssize_t strides[NPY_MAXDIMS];
    PyArray_Descr *dtype;
    PyObject *bound = NULL;
    PyObject *res = NULL;
    unsigned long long ptr;
    int ndim;

    if (!PyDict_Check(desc)) {
        PyErr_Format(PyExc_TypeError,
                     "__cuda_array_interface__ must be a dict, not %.100s",
                     Py_TYPE(desc)->tp_name);
        return NULL;
    }
    if (cm_context_current() == NULL || cm_cai_version(desc) < 0) {
        return NULL;
    }
    ndim = cm_cai_shape(desc, shape);
    if (ndim < 0) {
        return NULL;
    }
    dtype = cm_cai_dtype(desc);
    if (dtype == NULL) {
        return NULL;
    }
    if (cm_cai_strides(desc, ndim, shape, PyDataType_ELSIZE(dtype), strides)
            < 0
        || cm_cai_data(desc, ndim, shape, strides, PyDataType_ELSIZE(dtype),
                       &ptr) < 0
        || cm_cai_stream(desc, sync, &bound) < 0) {
        goto out_dtype;
    }
    res = cm_da_make(ST->DeviceNDArray_type, ndim, shape, strides, dtype,
                     (CUdeviceptr)ptr, owner != NULL ? owner : Py_None,
                     bound);
    if (res != NULL) {
        /* gpu_data shows a MemoryPointer that the owner keeps alive. */
        ((cm_da *)res)->gpu_foreign = 1;
    }
    Py_XDECREF(bound);
out_dtype:
    Py_DECREF(dtype);
    return res;
}

/* A cm_da for a device-side source: a cudamem array (new reference to
 * it) or any CAI object (a synchronised view); NULL without an exception
 * when obj is neither. */
cm_da *
cm_as_device_source(PyObject *obj)
{
    PyObject *cai;
    PyObject *r;

    /* A plain NumPy array first: the host side of most copies. */
    if (PyArray_CheckExact(obj)) {
        return NULL;
    }
    if (cm_da_check(obj)) {
        if (cm_da_alive((cm_da *)obj) < 0) {
            return NULL;
        }
        return (cm_da *)Py_NewRef(obj);
    }
    if (PyArray_Check(obj)) {
        return NULL;
    }
    if (PyObject_GetOptionalAttr(obj, cm_str_cai, &cai) < 0) {
        return NULL;
    }
    if (cai == NULL || cai == Py_None) {
        Py_XDECREF(cai);
        return NULL;
    }
    r = cm_from_cai(cai, obj, 1);
    Py_DECREF(cai);
    return (cm_da *)r;
}
