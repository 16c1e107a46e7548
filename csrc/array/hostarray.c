/* SPDX-License-Identifier: MIT */
/*
 * array/hostarray.c: the arrays on host allocations (pinned_array,
 * mapped_array, managed_array and their like-forms) and the device view
 * of a mapped or managed array.  They build on the host allocations of
 * memory/host/host.h and the layout rules of the device arrays.
 */
#include "array/array.h"
#include "memory/host/host.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* Arrays on host allocations                                          */
/* ------------------------------------------------------------------ */

/* Where an empty array's data points: never read or written. */
static _Alignas(64) char cm_empty_data[64];

/* The NumPy subclass for arrays of kind (mapped or managed), as
 * cudamem._hostmem registered it (an ndarray subclass, checked then).
 * Borrowed, or NULL. */
static PyTypeObject *
cm_hm_subtype(int kind)
{
    return (PyTypeObject *)(kind == CM_HM_MAPPED
                                ? CM_REGISTERED(MappedNDArray)
                                : CM_REGISTERED(ManagedNDArray));
}

/* An array of type subtype over m's memory with this layout; lo is the
 * offset of the layout's lowest byte (the allocation's first). */
static PyObject *
cm_hm_wrap(cm_hostmem *m, PyTypeObject *subtype, int ndim,
           const Py_ssize_t *shape, const Py_ssize_t *strides,
           PyArray_Descr *dtype, Py_ssize_t lo)
{
    PyObject *arr;
    char *data = m->host ? (char *)m->host - lo : cm_empty_data;

    Py_INCREF(dtype);
    /* Steals dtype even on failure. */
    arr = PyArray_NewFromDescr(subtype, dtype, ndim, (npy_intp *)shape,
                               (npy_intp *)strides, data,
                               NPY_ARRAY_WRITEABLE, NULL);
    if (arr == NULL) {
        return NULL;
    }
    /* Steals the new owner reference even on failure. */
    if (PyArray_SetBaseObject((PyArrayObject *)arr, Py_NewRef(m)) < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    PyArray_UpdateFlags((PyArrayObject *)arr, NPY_ARRAY_UPDATE_ALL);
    return arr;
}

/* Allocate the layout's span as kind and wrap it. */
static PyObject *
cm_hm_make(int kind, int ndim, const Py_ssize_t *shape,
           const Py_ssize_t *strides, PyArray_Descr *dtype,
           unsigned int flags, PyObject *stream)
{
    PyTypeObject *subtype = &PyArray_Type;
    Py_ssize_t lo;
    Py_ssize_t span;
    cm_hostmem *m;
    PyObject *r;

    if (kind != CM_HM_PINNED && (subtype = cm_hm_subtype(kind)) == NULL) {
        return NULL;
    }
    span = cm_layout_span(ndim, shape, strides, PyDataType_ELSIZE(dtype),
                          &lo);
    m = cm_hm_new(kind, (size_t)span, flags, stream);
    if (m == NULL) {
        return NULL;
    }
    r = cm_hm_wrap(m, subtype, ndim, shape, strides, dtype, lo);
    Py_DECREF(m);
    return r;
}

/* A flag argument: absent is dflt; else its truth. */
static int
cm_hm_bool_arg(PyObject *o, int dflt)
{
    return o == NULL ? dflt : PyObject_IsTrue(o);
}

static const char cm_pinned_array_doc[] = PyDoc_STR(
"pinned_array(shape, dtype=np.float64, strides=None, order='C')\n--\n\n"
"An uninitialised NumPy array in page-locked host memory\n"
"(cuMemHostAlloc).  Its base is the HostAllocation that owns the memory;\n"
"the memory is released when the last array using it goes.\n\n"
"Notes\n-----\n"
"numba does not retry after out-of-memory here; cudamem flushes its\n"
"pending frees and retries once.  The memory comes from the pinned pool\n"
"(CUDAMEM_PINNED_POOL=0 turns it off); see pinned_pool_stats.");

static PyObject *
cm_pinned_array(PyObject *mod, PyObject *const *args, Py_ssize_t nargs,
                PyObject *kwnames)
{
    PyObject *kwl[4] = {cm_hm_kw[KW_SHAPE], cm_hm_kw[KW_DTYPE],
                        cm_hm_kw[KW_STRIDES], cm_hm_kw[KW_ORDER]};
    Py_ssize_t shape[NPY_MAXDIMS];
    Py_ssize_t strides[NPY_MAXDIMS];
    PyArray_Descr *dt = NULL;
    PyObject *p[4];
    PyObject *r;
    int ndim;

    (void)mod;
    if (cm_argparse("pinned_array", args, nargs, kwnames, kwl, 4, 1, p) < 0
        || (ndim = cm_layout_parse(p[0], p[1], p[2], p[3], shape, strides,
                                   &dt)) < 0) {
        return NULL;
    }
    r = cm_hm_make(CM_HM_PINNED, ndim, shape, strides, dt, 0, NULL);
    Py_DECREF(dt);
    return r;
}

static const char cm_pinned_array_like_doc[] = PyDoc_STR(
"pinned_array_like(ary)\n--\n\n"
"An uninitialised pinned array with the shape and dtype of ``ary``, laid\n"
"out like it (as device_array_like).");

static PyObject *
cm_pinned_array_like(PyObject *mod, PyObject *ary)
{
    Py_ssize_t shape[NPY_MAXDIMS];
    Py_ssize_t strides[NPY_MAXDIMS];
    PyArray_Descr *dt = NULL;
    PyObject *r;
    int ndim;

    (void)mod;
    ndim = cm_layout_like(ary, shape, strides, &dt);
    if (ndim < 0) {
        return NULL;
    }
    r = cm_hm_make(CM_HM_PINNED, ndim, shape, strides, dt, 0, NULL);
    Py_DECREF(dt);
    return r;
}

/* The cuMemHostAlloc flags of a mapped allocation; -1 on error. */
static long
cm_mapped_flags(PyObject *portable, PyObject *wc)
{
    int pt = cm_hm_bool_arg(portable, 0);
    int w = pt < 0 ? -1 : cm_hm_bool_arg(wc, 0);

    if (pt < 0 || w < 0) {
        return -1;
    }
    return CU_MEMHOSTALLOC_DEVICEMAP | (pt ? CU_MEMHOSTALLOC_PORTABLE : 0)
           | (w ? CU_MEMHOSTALLOC_WRITECOMBINED : 0);
}

static const char cm_mapped_array_doc[] = PyDoc_STR(
"mapped_array(shape, dtype=np.float64, strides=None, order='C', "
"stream=0, portable=False, wc=False)\n--\n\n"
"An uninitialised MappedNDArray: host memory mapped into the device's\n"
"address space (cuMemHostAlloc with DEVICEMAP), a NumPy array on the\n"
"host and, through __cuda_array_interface__, a device array.\n\n"
"Notes\n-----\n"
"numba ignores ``portable`` and ``wc``; cudamem passes them to the\n"
"driver (CU_MEMHOSTALLOC_PORTABLE, CU_MEMHOSTALLOC_WRITECOMBINED).");

static PyObject *
cm_mapped_array(PyObject *mod, PyObject *const *args, Py_ssize_t nargs,
                PyObject *kwnames)
{
    PyObject *kwl[7] = {cm_hm_kw[KW_SHAPE], cm_hm_kw[KW_DTYPE],
                        cm_hm_kw[KW_STRIDES], cm_hm_kw[KW_ORDER],
                        cm_hm_kw[KW_STREAM], cm_hm_kw[KW_PORTABLE],
                        cm_hm_kw[KW_WC]};
    Py_ssize_t shape[NPY_MAXDIMS];
    Py_ssize_t strides[NPY_MAXDIMS];
    PyArray_Descr *dt = NULL;
    PyObject *p[7];
    PyObject *stream;
    PyObject *r;
    long flags;
    int ndim;

    (void)mod;
    if (cm_argparse("mapped_array", args, nargs, kwnames, kwl, 7, 1, p) < 0
        || (stream = cm_hm_stream_arg(p[4])) == NULL
        || (flags = cm_mapped_flags(p[5], p[6])) < 0
        || (ndim = cm_layout_parse(p[0], p[1], p[2], p[3], shape, strides,
                                   &dt)) < 0) {
        return NULL;
    }
    r = cm_hm_make(CM_HM_MAPPED, ndim, shape, strides, dt,
                   (unsigned int)flags, stream);
    Py_DECREF(dt);
    return r;
}

static const char cm_mapped_array_like_doc[] = PyDoc_STR(
"mapped_array_like(ary, stream=0, portable=False, wc=False)\n--\n\n"
"An uninitialised MappedNDArray with the shape and dtype of ``ary``, laid\n"
"out like it.  ``portable`` and ``wc`` are honoured (numba ignores\n"
"them).");

static PyObject *
cm_mapped_array_like(PyObject *mod, PyObject *const *args,
                     Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *kwl[4] = {cm_hm_kw[KW_ARY], cm_hm_kw[KW_STREAM],
                        cm_hm_kw[KW_PORTABLE], cm_hm_kw[KW_WC]};
    Py_ssize_t shape[NPY_MAXDIMS];
    Py_ssize_t strides[NPY_MAXDIMS];
    PyArray_Descr *dt = NULL;
    PyObject *p[4];
    PyObject *stream;
    PyObject *r;
    long flags;
    int ndim;

    (void)mod;
    if (cm_argparse("mapped_array_like", args, nargs, kwnames, kwl, 4, 1,
                    p) < 0
        || (stream = cm_hm_stream_arg(p[1])) == NULL
        || (flags = cm_mapped_flags(p[2], p[3])) < 0
        || (ndim = cm_layout_like(p[0], shape, strides, &dt)) < 0) {
        return NULL;
    }
    r = cm_hm_make(CM_HM_MAPPED, ndim, shape, strides, dt,
                   (unsigned int)flags, stream);
    Py_DECREF(dt);
    return r;
}

static const char cm_managed_array_doc[] = PyDoc_STR(
"managed_array(shape, dtype=np.float64, strides=None, order='C', "
"stream=0, attach_global=True)\n--\n\n"
"An uninitialised ManagedNDArray in managed (unified) memory\n"
"(cuMemAllocManaged with CU_MEM_ATTACH_GLOBAL, or CU_MEM_ATTACH_HOST\n"
"when ``attach_global`` is false), usable from host and device.");

static PyObject *
cm_managed_array(PyObject *mod, PyObject *const *args, Py_ssize_t nargs,
                 PyObject *kwnames)
{
    PyObject *kwl[6] = {cm_hm_kw[KW_SHAPE], cm_hm_kw[KW_DTYPE],
                        cm_hm_kw[KW_STRIDES], cm_hm_kw[KW_ORDER],
                        cm_hm_kw[KW_STREAM], cm_hm_kw[KW_ATTACH_GLOBAL]};
    Py_ssize_t shape[NPY_MAXDIMS];
    Py_ssize_t strides[NPY_MAXDIMS];
    PyArray_Descr *dt = NULL;
    PyObject *p[6];
    PyObject *stream;
    PyObject *r;
    int glob;
    int ndim;

    (void)mod;
    if (cm_argparse("managed_array", args, nargs, kwnames, kwl, 6, 1, p)
            < 0
        || (stream = cm_hm_stream_arg(p[4])) == NULL
        || (glob = cm_hm_bool_arg(p[5], 1)) < 0
        || (ndim = cm_layout_parse(p[0], p[1], p[2], p[3], shape, strides,
                                   &dt)) < 0) {
        return NULL;
    }
    r = cm_hm_make(CM_HM_MANAGED, ndim, shape, strides, dt,
                   glob ? CU_MEM_ATTACH_GLOBAL : CU_MEM_ATTACH_HOST,
                   stream);
    Py_DECREF(dt);
    return r;
}

static const char cm_device_view_doc[] = PyDoc_STR(
"_device_view(ary)\n--\n\n"
"A DeviceNDArray over the device side of a mapped or managed array (or\n"
"a view of one), bound to its allocation's stream.  AttributeError when\n"
"the array's memory is not mapped or managed memory; ValueError when its\n"
"context was closed.");

static PyObject *
cm_device_view_fn(PyObject *mod, PyObject *arg)
{
    PyArrayObject *a = (PyArrayObject *)arg;
    cm_hostmem *m;
    CUdeviceptr d = 0;

    (void)mod;
    if (!PyArray_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "expected a NumPy array, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    m = cm_hm_find(arg);
    if (PyArray_SIZE(a) == 0) {
        return cm_devicearray_new(PyArray_NDIM(a), PyArray_SHAPE(a),
                                  PyArray_STRIDES(a), PyArray_DESCR(a), 0,
                                  NULL, m != NULL ? m->stream : NULL);
    }
    if (m == NULL || m->kind == CM_HM_PINNED || m->host == 0) {
        PyErr_SetString(PyExc_AttributeError,
                        "this array is not in mapped or managed memory (the "
                        "results of NumPy operations are ordinary host "
                        "arrays)");
        return NULL;
    }
    if (!m->ctx->alive) {
        PyErr_Format(PyExc_ValueError,
                     "the context of this %s array was closed: it has no "
                     "device side, and its memory is ordinary host memory "
                     "now", cm_hm_kind_names[m->kind]);
        return NULL;
    }
    if (cm_host_devptr(m, (uintptr_t)PyArray_DATA(a), &d) < 0) {
        return NULL;
    }
    return cm_devicearray_new(PyArray_NDIM(a), PyArray_SHAPE(a),
                              PyArray_STRIDES(a), PyArray_DESCR(a), d,
                              (PyObject *)m, m->stream);
}


static PyMethodDef cm_hostarray_functions[] = {
    {"pinned_array", (PyCFunction)(void (*)(void))cm_pinned_array,
     METH_FASTCALL | METH_KEYWORDS, cm_pinned_array_doc},
    {"pinned_array_like", cm_pinned_array_like, METH_O,
     cm_pinned_array_like_doc},
    {"mapped_array", (PyCFunction)(void (*)(void))cm_mapped_array,
     METH_FASTCALL | METH_KEYWORDS, cm_mapped_array_doc},
    {"mapped_array_like", (PyCFunction)(void (*)(void))cm_mapped_array_like,
     METH_FASTCALL | METH_KEYWORDS, cm_mapped_array_like_doc},
    {"managed_array", (PyCFunction)(void (*)(void))cm_managed_array,
     METH_FASTCALL | METH_KEYWORDS, cm_managed_array_doc},
    {"_device_view", cm_device_view_fn, METH_O, cm_device_view_doc},
    {NULL, NULL, 0, NULL},
};

int
cm_hostarray_init(PyObject *mod, cm_state *st)
{
    (void)st;
    return PyModule_AddFunctions(mod, cm_hostarray_functions);
}
