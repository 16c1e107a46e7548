/* SPDX-License-Identifier: MIT */
/*
 * array/argparse.c: argument parsing of the array functions (fast-call
 * keywords, shape / dtype / strides / order rules).
 */
#include "array/devicearray.h"

#include <numpy/arrayscalars.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>


const char *const cm_kw_text[K_N_NAMES] = {
    "shape", "strides", "dtype", "order", "stream", "gpu_data", "ary",
    "obj", "copy", "to", "sync", "owner", "desc", "axis", "section",
    "item", "key", "value", "axes",
};

_Static_assert(K_N_NAMES == CM_ARRAY_KW_N,
               "cm_state.kw holds one entry per K_* name");

/* cm_argparse with names given as indices into cm_kw. */
int
cm_parse(const char *fname, PyObject *const *args, Py_ssize_t nargs,
         PyObject *kwnames, const int *names, int n, int nreq,
         PyObject **out)
{
    PyObject *kwlist[K_N_NAMES];
    int i;

    /* Positional arguments alone, as many as required or more and no
     * more than there are names: no name is needed. */
    if (kwnames == NULL && nargs >= nreq && nargs <= n) {
        for (i = 0; i < n; i++) {
            out[i] = i < nargs ? args[i] : NULL;
        }
        return 0;
    }
    for (i = 0; i < n; i++) {
        kwlist[i] = cm_kw[names[i]];
    }
    return cm_argparse(fname, args, nargs, kwnames, kwlist, n, nreq, out);
}

/* Whether obj is a Python or NumPy float, or a floating ndarray. */
static int
cm_is_floatish(PyObject *obj)
{
    if (PyFloat_Check(obj) || PyArray_IsScalar(obj, Floating)) {
        return 1;
    }
    return PyArray_Check(obj)
           && PyArray_ISFLOAT((PyArrayObject *)obj);
}

/* One dimension or stride from an integer-like object; one beyond
 * Py_ssize_t is a ValueError, as in NumPy. */
int
cm_as_ssize(PyObject *o, Py_ssize_t *v)
{
    PyObject *i = PyNumber_Index(o);

    if (i == NULL) {
        return -1;
    }
    *v = PyLong_AsSsize_t(i);
    Py_DECREF(i);
    if (*v == -1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_SetString(PyExc_ValueError,
                            "Maximum allowed dimension exceeded");
        }
        return -1;
    }
    return 0;
}

/* Parse a shape argument (an int, a NumPy integer, or an iterable of
 * them) into shape[]; the number of dimensions, or -1.  allow_neg: leave
 * negative entries to the caller (reshape's -1). */
static int
cm_parse_shape_ex(PyObject *obj, Py_ssize_t *shape, int allow_neg)
{
    PyObject *seq;
    Py_ssize_t n;
    Py_ssize_t i;

    if (cm_is_floatish(obj)) {
        PyErr_SetString(PyExc_TypeError,
                        "shape must be an integer or tuple of integers");
        return -1;
    }
    if (PyLong_Check(obj) || PyArray_IsScalar(obj, Integer)
        || (PyArray_Check(obj) && PyArray_NDIM((PyArrayObject *)obj) == 0
            && PyArray_ISINTEGER((PyArrayObject *)obj))) {
        if (cm_as_ssize(obj, &shape[0]) < 0) {
            return -1;
        }
        n = 1;
        goto check;
    }
    seq = PySequence_Fast(obj, "shape must be an integer or tuple of "
                               "integers");
    if (seq == NULL) {
        return -1;
    }
    n = PySequence_Fast_GET_SIZE(seq);
    if (n > NPY_MAXDIMS) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError,
                     "maximum supported dimension for an ndarray is "
                     "currently %d, found %zd", NPY_MAXDIMS, n);
        return -1;
    }
    for (i = 0; i < n; i++) {
        PyObject *e = PySequence_Fast_GET_ITEM(seq, i);

        if (cm_is_floatish(e)) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_TypeError,
                            "shape elements must be integers, got float");
            return -1;
        }
        if (cm_as_ssize(e, &shape[i]) < 0) {
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
check:
    for (i = 0; i < n && !allow_neg; i++) {
        if (shape[i] < 0) {
            PyErr_SetString(PyExc_ValueError,
                            "negative dimensions are not allowed");
            return -1;
        }
    }
    return (int)n;
}

int
cm_parse_shape(PyObject *obj, Py_ssize_t *shape)
{
    return cm_parse_shape_ex(obj, shape, 0);
}

int
cm_parse_shape_signed(PyObject *obj, Py_ssize_t *shape)
{
    return cm_parse_shape_ex(obj, shape, 1);
}

/* Fail with ValueError where NumPy refuses the shape: when the product
 * of the non-zero extents times itemsize overflows, even if another
 * extent is 0 (an empty array NumPy could not make cannot be copied
 * back).  A zero itemsize counts as 1, so that the element count fits. */
int
cm_check_size(int ndim, const Py_ssize_t *shape, Py_ssize_t itemsize)
{
    Py_ssize_t total = itemsize > 0 ? itemsize : 1;
    int i;

    for (i = 0; i < ndim; i++) {
        if (shape[i] == 0) {
            continue;
        }
        if (total > PY_SSIZE_T_MAX / shape[i]) {
            PyErr_SetString(PyExc_ValueError,
                            "array is too big; `arr.size * "
                            "arr.dtype.itemsize` is larger than the "
                            "maximum possible size.");
            return -1;
        }
        total *= shape[i];
    }
    return 0;
}

int
cm_layout_check(int ndim, const Py_ssize_t *shape,
                const Py_ssize_t *strides, Py_ssize_t itemsize)
{
    return cm_check_size(ndim, shape, itemsize) < 0
           || cm_check_span(ndim, shape, strides, itemsize) < 0 ? -1 : 0;
}

/* 0 if the byte span of a layout fits in Py_ssize_t (so that
 * cm_layout_span cannot overflow), else -1 with ValueError. */
int
cm_check_span(int ndim, const Py_ssize_t *shape, const Py_ssize_t *strides,
              Py_ssize_t itemsize)
{
    Py_ssize_t low = 0;
    Py_ssize_t high = itemsize;
    Py_ssize_t reach;
    int i;

    for (i = 0; i < ndim; i++) {
        if (shape[i] == 0) {
            return 0;
        }
    }
    for (i = 0; i < ndim; i++) {
        if (__builtin_mul_overflow(shape[i] - 1, strides[i], &reach)
            || (reach < 0 ? __builtin_add_overflow(low, reach, &low)
                          : __builtin_add_overflow(high, reach, &high))
            || __builtin_sub_overflow(high, low, &reach)) {
            PyErr_SetString(PyExc_ValueError,
                            "strides reach outside the address space: the "
                            "array's byte span does not fit in a signed "
                            "64-bit integer");
            return -1;
        }
    }
    return 0;
}

/* A new dtype reference from a dtype argument (NULL: float64). */
PyArray_Descr *
cm_parse_dtype(PyObject *obj)
{
    PyArray_Descr *d = NULL;

    if (obj == NULL) {
        return PyArray_DescrFromType(NPY_FLOAT64);
    }
    if (!PyArray_DescrConverter(obj, &d)) {
        return NULL;
    }
    if (PyDataType_REFCHK(d)) {
        Py_DECREF(d);
        PyErr_SetString(PyExc_TypeError,
                        "device arrays cannot hold Python objects");
        return NULL;
    }
    return d;
}
