/* SPDX-License-Identifier: MIT */
/*
 * array/functions.c: the module functions that make device arrays
 * (device_array, device_array_like, to_device, as_cuda_array, ...).
 */
#include "array/devicearray.h"

#include <numpy/arrayscalars.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* Module functions                                                    */
/* ------------------------------------------------------------------ */

/* Parse the shape / strides / order triple of device_array and the
 * constructor into shape[] and strides[]; ndim or -1.  order NULL: the
 * strides must be given (the constructor). */
int
cm_parse_layout(PyObject *shape_o, PyObject *strides_o, PyObject *order_o,
                Py_ssize_t itemsize, Py_ssize_t *shape, Py_ssize_t *strides)
{
    int ndim = cm_parse_shape(shape_o, shape);
    int given;
    int n;

    if (ndim < 0) {
        return -1;
    }
    given = strides_o != NULL && strides_o != Py_None;
    if (given) {
        given = PyObject_IsTrue(strides_o);
        if (given < 0) {
            return -1;
        }
    }
    if (!given && order_o != NULL) {
        const char *o = NULL;

        if (ndim > 0) {
            o = PyUnicode_Check(order_o) ? PyUnicode_AsUTF8(order_o) : NULL;
            if (o == NULL || (strcmp(o, "C") != 0 && strcmp(o, "F") != 0)) {
                PyErr_Clear();
                PyErr_SetString(PyExc_ValueError, "must be either C/F order");
                return -1;
            }
        }
        cm_layout_compact(ndim, shape, itemsize, o != NULL && o[0] == 'F',
                          strides);
        return ndim;
    }
    if (strides_o == NULL || strides_o == Py_None) {
        if (order_o == NULL && ndim == 0 && strides_o != NULL) {
            return 0;
        }
        PyErr_SetString(PyExc_TypeError,
                        "strides must be an int or a sequence of ints");
        return -1;
    }
    if (PyLong_Check(strides_o) || PyArray_IsScalar(strides_o, Integer)) {
        if (cm_as_ssize(strides_o, &strides[0]) < 0) {
            return -1;
        }
        n = 1;
    }
    else {
        n = cm_parse_shape_signed(strides_o, strides);
        if (n < 0) {
            return -1;
        }
    }
    if (n != ndim) {
        PyErr_SetString(PyExc_ValueError, "strides not match ndim");
        return -1;
    }
    return ndim;
}

const char cm_device_array_doc[] = PyDoc_STR(
"device_array(shape, dtype=np.float64, strides=None, order='C', "
"stream=0)\n--\n\n"
"An uninitialised device array, like numpy.empty.\n\n"
"Notes\n-----\n"
"numba rejects NumPy integer scalars as the shape and does not validate\n"
"negative dimensions; cudamem accepts the former and raises ValueError\n"
"for negative dimensions and sizes that overflow.");

PyObject *
cm_device_array(PyObject *mod, PyObject *const *args, Py_ssize_t nargs,
                PyObject *kwnames)
{
    static const int names[] = {K_SHAPE, K_DTYPE, K_STRIDES, K_ORDER,
                                K_STREAM};
    Py_ssize_t shape[NPY_MAXDIMS];
    Py_ssize_t strides[NPY_MAXDIMS];
    PyArray_Descr *dt;
    PyObject *p[5];
    PyObject *r = NULL;
    CUstream h;
    int ndim;

    (void)mod;
    if (cm_parse("device_array", args, nargs, kwnames, names, 5, 1, p) < 0) {
        return NULL;
    }
    dt = cm_parse_dtype(p[1]);
    if (dt == NULL) {
        return NULL;
    }
    ndim = cm_parse_layout(p[0], p[2], p[3] != NULL ? p[3] : cm_str_C,
                           PyDataType_ELSIZE(dt), shape, strides);
    if (ndim >= 0 && (p[4] == NULL || cm_stream_resolve(p[4], &h) >= 0)) {
        r = cm_da_make(ST->DeviceNDArray_type, ndim, shape, strides, dt, 0,
                       NULL, p[4]);
    }
    Py_DECREF(dt);
    return r;
}

/* Read shape, strides, dtype and contiguity of any array-like. */
static int
cm_describe(PyObject *ary, int *ndim, Py_ssize_t *shape, Py_ssize_t *strides,
            PyArray_Descr **dtype, int *c, int *f)
{
    PyObject *v = NULL;
    PyObject *flags;

    if (cm_da_check(ary)) {
        cm_da *a = (cm_da *)ary;

        *ndim = a->ndim;
        memcpy(shape, a->shape, a->ndim * sizeof(Py_ssize_t));
        memcpy(strides, a->strides, a->ndim * sizeof(Py_ssize_t));
        *dtype = (PyArray_Descr *)Py_NewRef(a->dtype);
        *c = a->c_contig;
        *f = a->f_contig;
        return 0;
    }
    if (PyArray_Check(ary)) {
        PyArrayObject *a = (PyArrayObject *)ary;

        *ndim = PyArray_NDIM(a);
        /* Element by element: a 0-d array's are NULL, no memcpy source. */
        for (int i = 0; i < *ndim; i++) {
            shape[i] = PyArray_DIMS(a)[i];
            strides[i] = PyArray_STRIDES(a)[i];
        }
        if (PyDataType_REFCHK(PyArray_DESCR(a))) {
            PyErr_SetString(PyExc_TypeError,
                            "device arrays cannot hold Python objects");
            return -1;
        }
        *dtype = (PyArray_Descr *)Py_NewRef(PyArray_DESCR(a));
        *c = PyArray_IS_C_CONTIGUOUS(a);
        *f = PyArray_IS_F_CONTIGUOUS(a);
        return 0;
    }
    *dtype = NULL;
    if ((v = PyObject_GetAttr(ary, cm_kw[K_SHAPE])) == NULL
        || (*ndim = cm_parse_shape(v, shape)) < 0) {
        goto err;
    }
    Py_SETREF(v, PyObject_GetAttr(ary, cm_kw[K_STRIDES]));
    if (v == NULL || cm_parse_shape_signed(v, strides) != *ndim) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError, "strides not match ndim");
        }
        goto err;
    }
    Py_SETREF(v, PyObject_GetAttr(ary, cm_kw[K_DTYPE]));
    if (v == NULL || (*dtype = cm_parse_dtype(v)) == NULL) {
        goto err;
    }
    Py_CLEAR(v);
    flags = PyObject_GetAttrString(ary, "flags");
    if (flags == NULL) {
        goto err;
    }
    v = PyMapping_GetItemString(flags, "C_CONTIGUOUS");
    *c = v != NULL && PyObject_IsTrue(v) == 1;
    Py_XDECREF(v);
    v = PyMapping_GetItemString(flags, "F_CONTIGUOUS");
    *f = v != NULL && PyObject_IsTrue(v) == 1;
    Py_XDECREF(v);
    Py_DECREF(flags);
    PyErr_Clear();
    return 0;
err:
    Py_XDECREF(v);
    Py_CLEAR(*dtype);
    return -1;
}

/* The layout of a new array like one with these strides: contiguous (F
 * only when F- and not C-contiguous) when contiguous or ndim <= 1, else
 * following the order of the strides. */
static void
cm_like_strides(int ndim, const Py_ssize_t *shape, const Py_ssize_t *src,
                Py_ssize_t itemsize, int c, int f, Py_ssize_t *strides)
{
    Py_ssize_t first;

    if (c || f || ndim <= 1) {
        cm_layout_compact(ndim, shape, itemsize, f && !c, strides);
        return;
    }
    {
        int perm[NPY_MAXDIMS];
        Py_ssize_t sd = itemsize;
        int i;

        (void)first;
        cm_layout_order(ndim, src, perm);
        for (i = ndim - 1; i >= 0; i--) {
            strides[perm[i]] = sd;
            sd *= shape[perm[i]] > 0 ? shape[perm[i]] : 1;
        }
    }
}

const char cm_device_array_like_doc[] = PyDoc_STR(
"device_array_like(ary, stream=0)\n--\n\n"
"An uninitialised device array with the shape and dtype of ``ary`` (a\n"
"host or device array), laid out like it (NumPy's keep order).");

PyObject *
cm_device_array_like(PyObject *mod, PyObject *const *args, Py_ssize_t nargs,
                     PyObject *kwnames)
{
    static const int names[] = {K_ARY, K_STREAM};
    Py_ssize_t shape[NPY_MAXDIMS];
    Py_ssize_t src[NPY_MAXDIMS];
    Py_ssize_t strides[NPY_MAXDIMS];
    PyArray_Descr *dt;
    PyObject *p[2];
    PyObject *r;
    CUstream h;
    int ndim;
    int c;
    int f;

    (void)mod;
    if (cm_parse("device_array_like", args, nargs, kwnames, names, 2, 1, p)
            < 0
        || (p[1] != NULL && cm_stream_resolve(p[1], &h) < 0)
        || cm_describe(p[0], &ndim, shape, src, &dt, &c, &f) < 0) {
        return NULL;
    }
    cm_like_strides(ndim, shape, src, PyDataType_ELSIZE(dt), c, f, strides);
    r = cm_da_make(ST->DeviceNDArray_type, ndim, shape, strides, dt, 0, NULL,
                   p[1]);
    Py_DECREF(dt);
    return r;
}

int
cm_layout_parse(PyObject *shape_o, PyObject *dtype_o, PyObject *strides_o,
                PyObject *order_o, Py_ssize_t *shape, Py_ssize_t *strides,
                PyArray_Descr **dtype)
{
    int ndim;

    if (shape_o == NULL) {
        PyErr_SetString(PyExc_TypeError, "missing required argument "
                                         "'shape'");
        return -1;
    }
    *dtype = cm_parse_dtype(dtype_o);
    if (*dtype == NULL) {
        return -1;
    }
    ndim = cm_parse_layout(shape_o, strides_o,
                           order_o != NULL ? order_o : cm_str_C,
                           PyDataType_ELSIZE(*dtype), shape, strides);
    if (ndim < 0
        || cm_check_size(ndim, shape, PyDataType_ELSIZE(*dtype)) < 0
        || cm_check_span(ndim, shape, strides, PyDataType_ELSIZE(*dtype))
               < 0) {
        Py_CLEAR(*dtype);
        return -1;
    }
    return ndim;
}

int
cm_layout_like(PyObject *ary, Py_ssize_t *shape, Py_ssize_t *strides,
               PyArray_Descr **dtype)
{
    Py_ssize_t src[NPY_MAXDIMS];
    int ndim;
    int c;
    int f;

    if (cm_describe(ary, &ndim, shape, src, dtype, &c, &f) < 0) {
        return -1;
    }
    cm_like_strides(ndim, shape, src, PyDataType_ELSIZE(*dtype), c, f,
                    strides);
    return ndim;
}

PyObject *
cm_devicearray_new(int ndim, const Py_ssize_t *shape,
                   const Py_ssize_t *strides, PyArray_Descr *dtype,
                   CUdeviceptr ptr, PyObject *gpu_data, PyObject *stream)
{
    return cm_da_make(ST->DeviceNDArray_type, ndim, shape, strides, dtype,
                      ptr, gpu_data != NULL ? gpu_data : Py_None, stream);
}

/* Whether obj has a truthy __cuda_memory__; 1, 0 or -1. */
static int
cm_is_cuda_memory(PyObject *obj)
{
    PyObject *v;
    int r;

    if (cm_da_check(obj)) {
        return 1;
    }
    if (PyArray_CheckExact(obj) || PyLong_CheckExact(obj)
        || PyFloat_CheckExact(obj) || PyList_CheckExact(obj)) {
        return 0;
    }
    if (PyObject_GetOptionalAttr(obj, cm_str_cuda_memory, &v) < 0) {
        return -1;
    }
    if (v == NULL) {
        return 0;
    }
    r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

static PyObject *
cm_to_device_impl(PyObject *obj, PyObject *stream, int copy, PyObject *to)
{
    Py_ssize_t shape[NPY_MAXDIMS];
    Py_ssize_t strides[NPY_MAXDIMS];
    PyArrayObject *arr;
    PyObject *cai;
    PyObject *r;
    CUstream h;
    int ndim;
    int c;
    int f;
    int isdev;

    if (stream != NULL && cm_stream_resolve(stream, &h) < 0) {
        return NULL;
    }
    if (to != NULL && to != Py_None) {
        if (copy) {
            if (cm_da_check(to)) {
                if (cm_da_copy_from((cm_da *)to, obj, stream) < 0) {
                    return NULL;
                }
            }
            else {
                r = PyObject_CallMethod(to, "copy_to_device", "OO", obj,
                                        stream != NULL ? stream : cm_zero);
                if (r == NULL) {
                    return NULL;
                }
                Py_DECREF(r);
            }
        }
        return Py_NewRef(to);
    }
    isdev = cm_is_cuda_memory(obj);
    if (isdev < 0) {
        return NULL;
    }
    if (isdev) {
        return Py_NewRef(obj);
    }
    if (!PyArray_Check(obj)) {
        if (PyObject_GetOptionalAttr(obj, cm_str_cai, &cai) < 0) {
            return NULL;
        }
        if (cai != NULL) {
            r = cm_from_cai(cai, obj, 1);
            Py_DECREF(cai);
            return r;
        }
    }
    if (cm_context_current() == NULL) {
        return NULL;
    }
    if (PyArray_IsScalar(obj, Void)) {
        PyVoidScalarObject *vs = (PyVoidScalarObject *)obj;
        cm_view dv;
        cm_view sv;
        int async;

        r = cm_da_make(ST->DeviceRecord_type, 0, NULL, NULL, vs->descr, 0,
                       NULL, stream);
        if (r == NULL || !copy) {
            return r;
        }
        async = cm_effective_stream(NULL, ((cm_da *)r)->stream, &h);
        cm_da_view((cm_da *)r, &dv);
        sv = dv;
        sv.addr = (uintptr_t)vs->obval;
        sv.device = 0;
        if (async < 0 || cm_copy(&dv, &sv, h, async) < 0) {
            Py_DECREF(r);
            return NULL;
        }
        return r;
    }
    arr = (PyArrayObject *)PyArray_FromAny(obj, NULL, 0, 0, 0, NULL);
    if (arr == NULL) {
        return NULL;
    }
    if (PyDataType_REFCHK(PyArray_DESCR(arr))) {
        Py_DECREF(arr);
        PyErr_SetString(PyExc_TypeError,
                        "device arrays cannot hold Python objects");
        return NULL;
    }
    ndim = PyArray_NDIM(arr);
    /* Element by element: a 0-d array's are NULL, no memcpy source. */
    for (int i = 0; i < ndim; i++) {
        shape[i] = PyArray_DIMS(arr)[i];
    }
    if (cm_layout_core_contiguous(ndim, shape, PyArray_STRIDES(arr),
                                  PyArray_ITEMSIZE(arr), &c, &f)) {
        for (int i = 0; i < ndim; i++) {
            strides[i] = PyArray_STRIDES(arr)[i];
        }
    }
    else {
        /* Not contiguous: F-contiguous when the source is F-ordered
         * (strides ascending), else C-contiguous. */
        int perm[NPY_MAXDIMS];
        int fortran = ndim > 1;
        int i;

        cm_layout_order(ndim, PyArray_STRIDES(arr), perm);
        for (i = 0; i < ndim; i++) {
            fortran &= perm[i] == ndim - 1 - i;
        }
        cm_layout_compact(ndim, shape, PyArray_ITEMSIZE(arr), fortran,
                          strides);
    }
    r = cm_da_make(ST->DeviceNDArray_type, ndim, shape, strides,
                   PyArray_DESCR(arr), 0, NULL, stream);
    if (r != NULL && copy && cm_da_copy_from((cm_da *)r, (PyObject *)arr,
                                             stream) < 0) {
        Py_CLEAR(r);
    }
    Py_DECREF(arr);
    return r;
}

const char cm_to_device_doc[] = PyDoc_STR(
"to_device(obj, stream=0, copy=True, to=None)\n--\n\n"
"A device copy of ``obj``, or ``obj`` itself when it is device memory, or\n"
"a zero-copy view of an object with ``__cuda_array_interface__``; with\n"
"``to``, copy into it and return it.  Keeps F order and broadcast zero\n"
"strides (only the core is allocated).\n\n"
"Notes\n-----\n"
"numba rejects non-contiguous host arrays; cudamem copies them into a\n"
"C-contiguous (F-contiguous for F-ordered sources) device array.\n\n"
CM_DOC_STAGED);

PyObject *
cm_to_device(PyObject *mod, PyObject *const *args, Py_ssize_t nargs,
             PyObject *kwnames)
{
    static const int names[] = {K_OBJ, K_STREAM, K_COPY, K_TO};
    PyObject *p[4];
    int copy = 1;

    (void)mod;
    if (cm_parse("to_device", args, nargs, kwnames, names, 4, 1, p) < 0) {
        return NULL;
    }
    if (p[2] != NULL && (copy = PyObject_IsTrue(p[2])) < 0) {
        return NULL;
    }
    if (cm_capture_any() && copy
        && (p[1] == NULL || PyObject_Not(p[1]) == 1)
        && cm_capture_refuse_sync("to_device() without a stream") < 0) {
        /* Before the allocation: the whole call is synchronous. */
        return NULL;
    }
    return cm_to_device_impl(p[0], p[1], copy, p[3]);
}

const char cm_is_cuda_array_doc[] = PyDoc_STR(
"is_cuda_array(obj)\n--\n\n"
"Whether ``obj`` has ``__cuda_array_interface__`` (not validated).");

PyObject *
cm_is_cuda_array(PyObject *mod, PyObject *obj)
{
    PyObject *v;

    (void)mod;
    if (PyObject_GetOptionalAttr(obj, cm_str_cai, &v) < 0) {
        return NULL;
    }
    Py_XDECREF(v);
    return PyBool_FromLong(v != NULL);
}

const char cm_as_cuda_array_doc[] = PyDoc_STR(
"as_cuda_array(obj, sync=True)\n--\n\n"
"A DeviceNDArray view of ``obj``'s ``__cuda_array_interface__`` that\n"
"keeps ``obj`` alive.");

PyObject *
cm_as_cuda_array(PyObject *mod, PyObject *const *args, Py_ssize_t nargs,
                 PyObject *kwnames)
{
    static const int names[] = {K_OBJ, K_SYNC};
    PyObject *p[2];
    PyObject *cai;
    PyObject *r;
    int sync = 1;

    (void)mod;
    if (cm_parse("as_cuda_array", args, nargs, kwnames, names, 2, 1, p) < 0
        || (p[1] != NULL && (sync = PyObject_IsTrue(p[1])) < 0)) {
        return NULL;
    }
    if (PyObject_GetOptionalAttr(p[0], cm_str_cai, &cai) < 0) {
        return NULL;
    }
    if (cai == NULL || cai == Py_None) {
        Py_XDECREF(cai);
        PyErr_SetString(PyExc_TypeError,
                        "*obj* doesn't implement the cuda array interface.");
        return NULL;
    }
    r = cm_from_cai(cai, p[0], sync);
    Py_DECREF(cai);
    return r;
}

const char cm_from_cai_doc[] = PyDoc_STR(
"from_cuda_array_interface(desc, owner=None, sync=True)\n--\n\n"
"A DeviceNDArray view of the memory a CUDA Array Interface dict\n"
"describes, keeping ``owner`` alive.  A ``stream`` in the dict becomes\n"
"the bound (external) stream, synchronised once when ``sync`` and\n"
"``config.CUDA_ARRAY_INTERFACE_SYNC`` are both true.\n\n"
"Notes\n-----\n"
"cudamem validates the dict: missing version (TypeError), version above\n"
"3, negative shapes, shapes NumPy refuses, unknown typestr, a non-empty\n"
"array's pointer in no live allocation the driver knows (of any library;\n"
"a NULL pointer is fine for an empty array) and strides outside the\n"
"allocation (ValueError).  A structured ``descr`` is honoured.");

PyObject *
cm_from_cuda_array_interface(PyObject *mod, PyObject *const *args,
                             Py_ssize_t nargs, PyObject *kwnames)
{
    static const int names[] = {K_DESC, K_OWNER, K_SYNC};
    PyObject *p[3];
    int sync = 1;

    (void)mod;
    if (cm_parse("from_cuda_array_interface", args, nargs, kwnames, names, 3,
                 1, p) < 0
        || (p[2] != NULL && (sync = PyObject_IsTrue(p[2])) < 0)) {
        return NULL;
    }
    return cm_from_cai(p[0], p[1] == Py_None ? NULL : p[1], sync);
}

/* DeviceNDArray(shape, strides, dtype, stream=0, gpu_data=None) */
/* 0 if the memory gpu_data holds (a DeviceAllocation's size, else its
 * int ``size`` attribute in bytes, where it has one) covers span bytes;
 * else -1 with ValueError. */
static int
cm_gpu_data_fits(PyObject *gpu_data, Py_ssize_t span)
{
    Py_ssize_t have = -1;

    if (Py_IS_TYPE(gpu_data, ST->Mem_type)) {
        have = (Py_ssize_t)((cm_mem *)gpu_data)->size;
    }
    else {
        PyObject *name = PyUnicode_InternFromString("size");
        PyObject *v = NULL;
        int rc = name == NULL ? -1
                              : PyObject_GetOptionalAttr(gpu_data, name, &v);

        Py_XDECREF(name);
        if (rc < 0) {
            return -1;
        }
        if (v != NULL && PyLong_Check(v)) {
            have = PyLong_AsSsize_t(v);
            if (have == -1 && PyErr_Occurred()) {
                PyErr_Clear();
            }
        }
        Py_XDECREF(v);
    }
    if (have >= 0 && span > have) {
        PyErr_Format(PyExc_ValueError,
                     "the layout spans %zd bytes; gpu_data holds %zd",
                     span, have);
        return -1;
    }
    return 0;
}

PyObject *
cm_da_vectorcall(PyObject *type, PyObject *const *args, size_t nargsf,
                 PyObject *kwnames)
{
    static const int names[] = {K_SHAPE, K_STRIDES, K_DTYPE, K_STREAM,
                                K_GPU_DATA};
    Py_ssize_t shape[NPY_MAXDIMS];
    Py_ssize_t strides[NPY_MAXDIMS];
    PyArray_Descr *dt;
    PyObject *p[5];
    PyObject *r = NULL;
    Py_ssize_t lo;
    Py_ssize_t span;
    CUdeviceptr ptr = 0;
    CUstream h;
    int ndim;

    if (cm_parse("DeviceNDArray", args, PyVectorcall_NARGS(nargsf), kwnames,
                 names, 5, 3, p) < 0) {
        return NULL;
    }
    dt = cm_parse_dtype(p[2]);
    if (dt == NULL) {
        return NULL;
    }
    ndim = cm_parse_layout(p[0], p[1], NULL, PyDataType_ELSIZE(dt), shape, strides);
    if (ndim < 0 || (p[3] != NULL && cm_stream_resolve(p[3], &h) < 0)) {
        goto out_dt;
    }
    if (p[4] == Py_None) {
        p[4] = NULL;
    }
    if (p[4] != NULL) {
        if (cm_owner_ptr(p[4], &ptr) < 0
            || cm_check_size(ndim, shape, PyDataType_ELSIZE(dt)) < 0
            || cm_check_span(ndim, shape, strides, PyDataType_ELSIZE(dt))
                   < 0) {
            goto out_dt;
        }
        span = cm_layout_span(ndim, shape, strides, PyDataType_ELSIZE(dt),
                              &lo);
        if (cm_gpu_data_fits(p[4], span) < 0) {
            goto out_dt;
        }
        /* Memory cudamem did not allocate must be live device memory. */
        if (span > 0 && PyDataType_ELSIZE(dt) > 0
            && !Py_IS_TYPE(p[4], ST->Mem_type)
            && cm_check_extent(ptr, 0, (size_t)span, "gpu_data",
                               "the layout over gpu_data reaches") < 0) {
            goto out_dt;
        }
        ptr -= (CUdeviceptr)lo;
    }
    r = cm_da_make((PyTypeObject *)type, ndim, shape, strides, dt, ptr, p[4],
                   p[3]);
out_dt:
    Py_DECREF(dt);
    return r;
}

PyObject *
cm_da_new(PyTypeObject *tp, PyObject *args, PyObject *kwds)
{
    PyObject *const *items = &PyTuple_GET_ITEM(args, 0);
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    PyObject *stack[8];
    PyObject *kwnames = NULL;
    PyObject *r;
    Py_ssize_t nk = kwds == NULL ? 0 : PyDict_GET_SIZE(kwds);
    Py_ssize_t pos = 0;
    Py_ssize_t i;
    PyObject *k;
    PyObject *v;

    if (n + nk > 8) {
        PyErr_SetString(PyExc_TypeError, "DeviceNDArray: too many arguments");
        return NULL;
    }
    for (i = 0; i < n; i++) {
        stack[i] = items[i];
    }
    if (nk > 0) {
        kwnames = PyTuple_New(nk);
        if (kwnames == NULL) {
            return NULL;
        }
        i = 0;
        while (PyDict_Next(kwds, &pos, &k, &v)) {
            PyTuple_SET_ITEM(kwnames, i, Py_NewRef(k));
            stack[n + i] = v;
            i++;
        }
    }
    r = cm_da_vectorcall((PyObject *)tp, stack, (size_t)n, kwnames);
    Py_XDECREF(kwnames);
    return r;
}

/* DeviceRecord(dtype, stream=0, gpu_data=None): the DeviceNDArray
 * constructor with shape and strides (). */
PyObject *
cm_rec_new(PyTypeObject *tp, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"dtype", "stream", "gpu_data", NULL};
    PyObject *stack[5];
    PyObject *dtype;
    PyObject *stream = cm_zero;
    PyObject *gpu_data = Py_None;
    PyObject *empty;
    PyObject *r;

    (void)tp;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|OO:DeviceRecord", kwlist,
                                     &dtype, &stream, &gpu_data)) {
        return NULL;
    }
    empty = PyTuple_New(0);
    if (empty == NULL) {
        return NULL;
    }
    stack[0] = empty;
    stack[1] = empty;
    stack[2] = dtype;
    stack[3] = stream;
    stack[4] = gpu_data;
    r = cm_da_vectorcall((PyObject *)ST->DeviceRecord_type, stack, 5, NULL);
    Py_DECREF(empty);
    return r;
}

PyObject *
cm_da_sq_item(PyObject *self, Py_ssize_t i)
{
    PyObject *k = PyLong_FromSsize_t(i);
    PyObject *r;

    if (k == NULL) {
        return NULL;
    }
    r = cm_da_getitem_impl((cm_da *)self, k, NULL);
    Py_DECREF(k);
    return r;
}
