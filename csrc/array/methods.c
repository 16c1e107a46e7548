/* SPDX-License-Identifier: MIT */
/*
 * array/methods.c: the methods of DeviceNDArrayBase and DeviceNDArray.
 */
#include "array/devicearray.h"

#include <numpy/arrayscalars.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* Methods                                                             */
/* ------------------------------------------------------------------ */

const char cm_da_copy_to_host_doc[] = PyDoc_STR(
"copy_to_host($self, /, ary=None, stream=0)\n--\n\n"
"Copy the array to the host and return the host array.\n\n"
"Into ``ary`` when given (same dtype, same shape once size-1 dimensions\n"
"are dropped; returns ``ary``), else into a new array with this array's\n"
"strides (C-contiguous when some stride is negative).  Asynchronous on\n"
"``stream`` if truthy, else on the bound stream if it is a stream object,\n"
"else synchronous.\n\n"
"Notes\n-----\n"
"numba refuses negative strides and destinations laid out differently;\n"
"cudamem copies between any layouts (2-D / 3-D copies, or through a\n"
"host buffer), writing only the elements of the destination view.  A\n"
"copy staged through a host buffer completes before it returns.\n\n"
CM_DOC_STAGED);

PyObject *
cm_da_copy_to_host(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                   PyObject *kwnames)
{
    static const int names[] = {K_ARY, K_STREAM};
    PyObject *a[2];

    if (cm_parse("copy_to_host", args, nargs, kwnames, names, 2, 0, a) < 0) {
        return NULL;
    }
    return cm_da_copy_to_host_impl((cm_da *)self, a[0], a[1]);
}

const char cm_da_copy_to_device_doc[] = PyDoc_STR(
"copy_to_device($self, ary, stream=0)\n--\n\n"
"Copy ``ary`` (a host array, a device array or any object with\n"
"``__cuda_array_interface__``) into this array.\n\n"
"The dtypes must be equal (TypeError) and the shapes equal once size-1\n"
"dimensions are dropped (ValueError).  Sync or async as for\n"
"copy_to_host.\n\n"
"Notes\n-----\n"
"numba requires contiguous arrays with equal strides and refuses\n"
"CAI-only sources; cudamem copies between any layouts (zero strides on\n"
"the source only) and wraps CAI sources without a copy.  Device-to-device\n"
"copies that no 2-D / 3-D copy expresses are staged through the host for\n"
"now, and complete before returning.\n\n"
CM_DOC_STAGED);

PyObject *
cm_da_copy_to_device(PyObject *self, PyObject *const *args,
                     Py_ssize_t nargs, PyObject *kwnames)
{
    static const int names[] = {K_ARY, K_STREAM};
    PyObject *a[2];

    if (cm_parse("copy_to_device", args, nargs, kwnames, names, 2, 1, a) < 0
        || cm_da_copy_from((cm_da *)self, a[0], a[1]) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

const char cm_da_getitem_doc[] = PyDoc_STR(
"getitem($self, item, /, stream=0)\n--\n\n"
"``self[item]`` with the result bound to (or the element read on)\n"
"``stream``.\n\n"
"NumPy's indexing.  Basic indexing (integers, slices with any step,\n"
"``...``, ``None``) gives a view, or reads one element as a NumPy\n"
"scalar.  Advanced indexing (integer arrays as NumPy arrays, lists or\n"
"device arrays; boolean masks on the host or the device; boolean\n"
"scalars; mixed with the above as NumPy mixes them) gives a new\n"
"C-contiguous device array, gathered by an internal kernel in order on\n"
"the stream.  Errors are NumPy's: IndexError for an index out of range,\n"
"also for indices held on the device, which the kernel checks (a bad\n"
"one is reported after the kernel ran, never followed).\n\n"
"Notes\n-----\n"
"numba takes integers and slices only.  Host synchronisation: a\n"
"boolean mask held on the device is counted on the device and the count\n"
"read back (the result's shape depends on it): that is the one host\n"
"synchronisation it costs.  Integer indices held on the device are\n"
"checked by the kernel, so that read waits for its stream before it\n"
"returns; with host indices it does not (without any stream it is\n"
"synchronous, as every copy is).");

PyObject *
cm_da_getitem(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
              PyObject *kwnames)
{
    static const int names[] = {K_ITEM, K_STREAM};
    PyObject *a[2];

    if (cm_parse("getitem", args, nargs, kwnames, names, 2, 1, a) < 0) {
        return NULL;
    }
    return cm_da_getitem_impl((cm_da *)self, a[0], a[1]);
}

const char cm_da_setitem_doc[] = PyDoc_STR(
"setitem($self, key, value, stream=0)\n--\n\n"
"``self[key] = value`` on ``stream``.  Without any stream (argument or\n"
"bound) the call is synchronous.\n\n"
"Keys are NumPy's (see getitem): with index arrays or boolean masks the\n"
"value (broadcast and cast as NumPy does) is scattered by an internal\n"
"kernel, and where the indices repeat a position the last value is the\n"
"one written, as in NumPy (positions are made unique on the host, so\n"
"integer indices held on the device are read back first; a lone device\n"
"mask costs one synchronisation, its count).\n\n"
"Notes\n-----\n"
"numba runs a broadcasting kernel.  cudamem copies instead: the value is\n"
"cast on the host with NumPy's unsafe casting and broadcast by a strided\n"
"copy (a memset when every byte agrees); a device value of another dtype\n"
"is brought to the host first.  Host values are waited for on the\n"
"stream, since they may be temporaries.");

PyObject *
cm_da_setitem(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
              PyObject *kwnames)
{
    static const int names[] = {K_KEY, K_VALUE, K_STREAM};
    PyObject *a[3];

    if (cm_parse("setitem", args, nargs, kwnames, names, 3, 2, a) < 0
        || cm_da_setitem_impl((cm_da *)self, a[0], a[1], a[2]) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

const char cm_da_bind_doc[] = PyDoc_STR(
"bind($self, /, stream=0)\n--\n\n"
"A new view of the same memory (same gpu_data) bound to ``stream``.");

PyObject *
cm_da_bind(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
           PyObject *kwnames)
{
    static const int names[] = {K_STREAM};
    cm_da *a = (cm_da *)self;
    PyObject *s[1];
    PyObject *r;
    CUstream h;

    if (cm_parse("bind", args, nargs, kwnames, names, 1, 0, s) < 0) {
        return NULL;
    }
    if (s[0] != NULL && cm_stream_resolve(s[0], &h) < 0) {
        return NULL;
    }
    r = cm_da_make_in(Py_TYPE(self), a->ctx, a->ndim, a->shape,
                      a->strides, a->dtype, a->ptr, a->gpu_data,
                      s[0] != NULL ? s[0] : cm_zero);
    if (r != NULL) {
        /* The same memory object, as numba's bind passes gpu_data on. */
        ((cm_da *)r)->gpu_foreign = a->gpu_foreign;
        ((cm_da *)r)->gpu_shown = Py_XNewRef(a->gpu_shown);
    }
    return r;
}

PyObject *
cm_da_is_c_contiguous(PyObject *self, PyObject *unused)
{
    (void)unused;
    return PyBool_FromLong(((cm_da *)self)->c_contig);
}

PyObject *
cm_da_is_f_contiguous(PyObject *self, PyObject *unused)
{
    (void)unused;
    return PyBool_FromLong(((cm_da *)self)->f_contig);
}

PyObject *
cm_da_as_cuda_arg(PyObject *self, PyObject *unused)
{
    return cm_da_get_gpu_data(self, unused);
}

/* The order argument of reshape / ravel as 'C', 'F' or 'A'; 0 on error. */
static int
cm_parse_order(PyObject *o)
{
    const char *s;

    if (o == NULL) {
        return 'C';
    }
    s = PyUnicode_Check(o) ? PyUnicode_AsUTF8(o) : NULL;
    if (s == NULL || s[0] == '\0' || s[1] != '\0'
        || strchr("CFA", s[0]) == NULL) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "order not C|F|A");
        return 0;
    }
    return s[0];
}

const char cm_da_reshape_doc[] = PyDoc_STR(
"reshape($self, /, *newshape, order='C')\n--\n\n"
"A view with a new shape; the array must be contiguous.\n\n"
"Notes\n-----\n"
"numba's view drops the bound stream; cudamem's keeps it.");

PyObject *
cm_da_reshape(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
              PyObject *kwnames)
{
    cm_da *a = (cm_da *)self;
    Py_ssize_t shape[NPY_MAXDIMS];
    Py_ssize_t strides[NPY_MAXDIMS];
    Py_ssize_t known = 1;
    PyObject *shp;
    PyObject *order_o = NULL;
    Py_ssize_t k;
    int ndim;
    int unknown = -1;
    int order;
    int i;

    for (k = 0; kwnames != NULL && k < PyTuple_GET_SIZE(kwnames); k++) {
        PyObject *kw = PyTuple_GET_ITEM(kwnames, k);

        if (PyUnicode_Compare(kw, cm_kw[K_ORDER]) != 0) {
            PyErr_Format(PyExc_TypeError, "unknown keyword arguments %R",
                         kwnames);
            return NULL;
        }
        order_o = args[nargs + k];
    }
    order = cm_parse_order(order_o);
    if (order == 0) {
        return NULL;
    }
    if (nargs == 1 && (PyTuple_Check(args[0]) || PyList_Check(args[0]))) {
        shp = Py_NewRef(args[0]);
    }
    else {
        shp = PyTuple_New(nargs);
        if (shp == NULL) {
            return NULL;
        }
        for (k = 0; k < nargs; k++) {
            PyTuple_SET_ITEM(shp, k, Py_NewRef(args[k]));
        }
    }
    ndim = cm_parse_shape_signed(shp, shape);
    Py_DECREF(shp);
    if (ndim < 0) {
        return NULL;
    }
    for (i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            if (unknown >= 0) {
                PyErr_SetString(PyExc_ValueError,
                                "can only specify one unknown dimension");
                return NULL;
            }
            unknown = i;
        }
        else {
            known *= shape[i];
        }
    }
    if (unknown >= 0) {
        if (known == 0 || a->size % known != 0) {
            PyErr_SetString(PyExc_ValueError,
                            "cannot infer valid shape for unknown "
                            "dimension");
            return NULL;
        }
        shape[unknown] = a->size / known;
        known = a->size;
    }
    if (known != a->size) {
        PyErr_SetString(PyExc_ValueError,
                        "reshape changes the size of the array");
        return NULL;
    }
    if (!a->c_contig && !a->f_contig) {
        PyErr_SetString(PyExc_NotImplementedError,
                        "operation requires copying");
        return NULL;
    }
    if (order == 'A') {
        order = a->f_contig ? 'F' : 'C';
    }
    /* numba's rule: order is the layout of the view over the same bytes
     * (a C array's order='F' reshape reads them in Fortran order), not
     * NumPy's reading order. */
    cm_layout_compact(ndim, shape, PyDataType_ELSIZE(a->dtype), order == 'F',
                      strides);
    return cm_da_subview(a, ST->DeviceNDArray_type, ndim, shape, strides,
                         a->dtype, 0, NULL);
}

const char cm_da_ravel_doc[] = PyDoc_STR(
"ravel($self, /, order='C', stream=0)\n--\n\n"
"A 1-D view of a contiguous array, bound to ``stream`` (or the array's\n"
"stream).");

PyObject *
cm_da_ravel(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
            PyObject *kwnames)
{
    static const int names[] = {K_ORDER, K_STREAM};
    cm_da *a = (cm_da *)self;
    PyObject *p[2];
    PyObject *bound;
    Py_ssize_t stride;
    int order;
    int ok;

    if (cm_parse("ravel", args, nargs, kwnames, names, 2, 0, p) < 0) {
        return NULL;
    }
    order = cm_parse_order(p[0]);
    if (order == 0) {
        return NULL;
    }
    ok = (order == 'C' && a->c_contig) || (order == 'F' && a->f_contig)
         || (order == 'A' && (a->c_contig || a->f_contig)) || a->ndim <= 1;
    if (!ok || (a->ndim <= 1 && !a->c_contig)) {
        PyErr_SetString(PyExc_NotImplementedError,
                        "ravel on non-contiguous array");
        return NULL;
    }
    bound = cm_pick_stream(p[1], a);
    if (bound == NULL) {
        return NULL;
    }
    stride = PyDataType_ELSIZE(a->dtype);
    return cm_da_subview(a, ST->DeviceNDArray_type, 1, &a->size, &stride,
                         a->dtype, 0, bound);
}

const char cm_da_view_doc[] = PyDoc_STR(
"view($self, dtype, /)\n--\n\n"
"The same bytes seen as ``dtype`` (same gpu_data and stream).  With a\n"
"different itemsize the array must be C-contiguous; the last dimension\n"
"is rescaled.");

PyObject *
cm_da_view_meth(PyObject *self, PyObject *arg)
{
    cm_da *a = (cm_da *)self;
    Py_ssize_t shape[NPY_MAXDIMS];
    Py_ssize_t strides[NPY_MAXDIMS];
    PyArray_Descr *dt;
    PyObject *r = NULL;
    Py_ssize_t old = PyDataType_ELSIZE(a->dtype);
    Py_ssize_t bytes;

    dt = cm_parse_dtype(arg);
    if (dt == NULL) {
        return NULL;
    }
    memcpy(shape, a->shape, a->ndim * sizeof(Py_ssize_t));
    memcpy(strides, a->strides, a->ndim * sizeof(Py_ssize_t));
    if (PyDataType_ELSIZE(dt) != old) {
        if (a->ndim == 0) {
            PyErr_SetString(PyExc_ValueError,
                            "Changing the dtype of a 0d array is only "
                            "supported if the itemsize is unchanged");
            goto out_dt;
        }
        if (!a->c_contig) {
            PyErr_SetString(PyExc_ValueError,
                            "To change to a dtype of a different size, the "
                            "array must be C-contiguous");
            goto out_dt;
        }
        bytes = shape[a->ndim - 1] * old;
        if (PyDataType_ELSIZE(dt) == 0 || bytes % PyDataType_ELSIZE(dt) != 0) {
            PyErr_SetString(PyExc_ValueError,
                            "When changing to a larger dtype, its size must "
                            "be a divisor of the total size in bytes of the "
                            "last axis of the array.");
            goto out_dt;
        }
        shape[a->ndim - 1] = bytes / PyDataType_ELSIZE(dt);
        strides[a->ndim - 1] = PyDataType_ELSIZE(dt);
    }
    r = cm_da_subview(a, Py_TYPE(self), a->ndim, shape, strides, dt, 0,
                      NULL);
out_dt:
    Py_DECREF(dt);
    return r;
}

const char cm_da_squeeze_doc[] = PyDoc_STR(
"squeeze($self, /, axis=None, stream=0)\n--\n\n"
"A view without the size-1 axes (or only those in ``axis``), bound to\n"
"``stream`` (or the array's stream).");

PyObject *
cm_da_squeeze(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
              PyObject *kwnames)
{
    static const int names[] = {K_AXIS, K_STREAM};
    cm_da *a = (cm_da *)self;
    Py_ssize_t shape[NPY_MAXDIMS];
    Py_ssize_t strides[NPY_MAXDIMS];
    char drop[NPY_MAXDIMS];
    PyObject *p[2];
    PyObject *bound;
    int ndim = 0;
    int i;

    if (cm_parse("squeeze", args, nargs, kwnames, names, 2, 0, p) < 0) {
        return NULL;
    }
    memset(drop, 0, sizeof(drop));
    if (p[0] == NULL || p[0] == Py_None) {
        for (i = 0; i < a->ndim; i++) {
            drop[i] = a->shape[i] == 1;
        }
    }
    else {
        PyObject *seq = PyTuple_Check(p[0]) || PyList_Check(p[0])
                            ? PySequence_Fast(p[0], "axis")
                            : PyTuple_Pack(1, p[0]);
        Py_ssize_t k;

        if (seq == NULL) {
            return NULL;
        }
        for (k = 0; k < PySequence_Fast_GET_SIZE(seq); k++) {
            Py_ssize_t ax;

            if (cm_as_ssize(PySequence_Fast_GET_ITEM(seq, k), &ax) < 0) {
                Py_DECREF(seq);
                return NULL;
            }
            if (ax < 0) {
                ax += a->ndim;
            }
            if (ax < 0 || ax >= a->ndim) {
                Py_DECREF(seq);
                PyErr_Format(PyExc_IndexError,
                             "axis is out of bounds for an array of "
                             "dimension %d", a->ndim);
                return NULL;
            }
            if (a->shape[ax] != 1) {
                Py_DECREF(seq);
                PyErr_SetString(PyExc_ValueError,
                                "cannot select an axis to squeeze out which "
                                "has size not equal to one");
                return NULL;
            }
            drop[ax] = 1;
        }
        Py_DECREF(seq);
    }
    for (i = 0; i < a->ndim; i++) {
        if (!drop[i]) {
            shape[ndim] = a->shape[i];
            strides[ndim++] = a->strides[i];
        }
    }
    bound = cm_pick_stream(p[1], a);
    if (bound == NULL) {
        return NULL;
    }
    return cm_da_subview(a, ST->DeviceNDArray_type, ndim, shape, strides,
                         a->dtype, 0, bound);
}

const char cm_da_split_doc[] = PyDoc_STR(
"split($self, section, /, stream=0)\n--\n\n"
"A generator of consecutive 1-D views of ``section`` elements (the last\n"
"may be shorter), bound to ``stream`` (or the array's stream).  Errors\n"
"(not 1-D, not unit stride) appear when it is iterated.");

PyObject *
cm_da_split(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
            PyObject *kwnames)
{
    static const int names[] = {K_SECTION, K_STREAM};
    PyObject *p[2];
    PyObject *fn;

    if (cm_parse("split", args, nargs, kwnames, names, 2, 1, p) < 0) {
        return NULL;
    }
    /* cudamem._api._split, as the package registered it */
    fn = CM_REGISTERED(api_split);
    if (fn == NULL) {
        return NULL;
    }
    return PyObject_CallFunctionObjArgs(fn, self, p[0],
                                        p[1] != NULL ? p[1] : cm_zero, NULL);
}

const char cm_da_transpose_doc[] = PyDoc_STR(
"transpose($self, /, axes=None)\n--\n\n"
"Axes equal to ``range(ndim)`` give ``self``.  A 2-D array gives a new\n"
"C-contiguous array of the transposed shape, bound to the array's\n"
"stream.\n\n"
"Notes\n-----\n"
"numba fills the result with a transpose kernel.  Until cudamem's kernel\n"
"path lands the result is filled by a strided device-to-device copy,\n"
"staged through the host (it completes before returning).");

static PyObject *
cm_da_transpose_impl_run(cm_da *a, PyObject *axes)
{
    Py_ssize_t shape[2];
    Py_ssize_t strides[2];
    cm_da *res;
    cm_view dv;
    cm_view sv;
    CUstream h;
    int async;
    int identity = 0;
    int i;

    if (axes != NULL && axes != Py_None) {
        PyObject *seq = PySequence_Fast(axes, "axes must be a sequence");
        Py_ssize_t n;
        char seen[NPY_MAXDIMS];
        int perm = 1;

        if (seq == NULL) {
            return NULL;
        }
        n = PySequence_Fast_GET_SIZE(seq);
        identity = n == a->ndim && n > 0;
        memset(seen, 0, sizeof(seen));
        for (i = 0; i < n; i++) {
            Py_ssize_t v;

            if (cm_as_ssize(PySequence_Fast_GET_ITEM(seq, i), &v) < 0) {
                Py_DECREF(seq);
                return NULL;
            }
            identity &= v == i;
            if (v < 0 || v >= a->ndim || v >= NPY_MAXDIMS || seen[v]) {
                perm = 0;
            }
            else {
                seen[v] = 1;
            }
        }
        perm &= n == a->ndim;
        Py_DECREF(seq);
        if (identity) {
            return Py_NewRef(a);
        }
        if (a->ndim == 2 && !perm) {
            PyErr_Format(PyExc_ValueError, "invalid axes list %R", axes);
            return NULL;
        }
    }
    if (a->ndim != 2) {
        PyErr_SetString(PyExc_NotImplementedError,
                        "transposing a non-2D DeviceNDArray isn't "
                        "supported");
        return NULL;
    }
    shape[0] = a->shape[1];
    shape[1] = a->shape[0];
    cm_layout_compact(2, shape, PyDataType_ELSIZE(a->dtype), 0, strides);
    if (cm_da_activate(a) < 0) {
        return NULL;
    }
    res = (cm_da *)cm_da_make(ST->DeviceNDArray_type, 2, shape, strides,
                              a->dtype, 0, NULL, a->stream);
    if (res == NULL) {
        return NULL;
    }
    async = cm_effective_stream(NULL, a->stream, &h);
    if (async < 0) {
        Py_DECREF(res);
        return NULL;
    }
    cm_da_view(res, &dv);
    cm_da_view(a, &sv);
    strides[0] = a->strides[1];
    strides[1] = a->strides[0];
    sv.shape = shape;
    sv.strides = strides;
    if (cm_copy(&dv, &sv, h, async) < 0) {
        Py_DECREF(res);
        return NULL;
    }
    return (PyObject *)res;
}

/* cm_da_transpose_impl_run with the array's context current. */
static PyObject *
cm_da_transpose_impl(cm_da *a, PyObject *axes)
{
    PyObject *r;

    CM_ENTERED(cm_da_enter, cm_da_leave, a, r, NULL,
               cm_da_transpose_impl_run(a, axes));
    return r;
}

PyObject *
cm_da_transpose(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                PyObject *kwnames)
{
    static const int names[] = {K_AXES};
    PyObject *p[1];

    if (cm_parse("transpose", args, nargs, kwnames, names, 1, 0, p) < 0) {
        return NULL;
    }
    return cm_da_transpose_impl((cm_da *)self, p[0]);
}

PyObject *
cm_da_get_T(PyObject *self, void *unused)
{
    (void)unused;
    return cm_da_transpose_impl((cm_da *)self, NULL);
}

const char cm_da_array_doc[] = PyDoc_STR(
"__array__($self, /, dtype=None, copy=None)\n--\n\n"
"A host copy (copy_to_host), cast to ``dtype`` when given.  ``copy=False``\n"
"raises ValueError: a copy is always made.");

PyObject *
cm_da_array(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
            PyObject *kwnames)
{
    static const int names[] = {K_DTYPE, K_COPY};
    PyObject *p[2];
    PyObject *host;

    if (cm_parse("__array__", args, nargs, kwnames, names, 2, 0, p) < 0) {
        return NULL;
    }
    if (p[1] == Py_False) {
        PyErr_SetString(PyExc_ValueError,
                        "`copy=False` is not supported. A copy is always "
                        "created.");
        return NULL;
    }
    host = cm_da_copy_to_host_impl((cm_da *)self, NULL, NULL);
    if (host == NULL || p[0] == NULL || p[0] == Py_None) {
        return host;
    }
    Py_SETREF(host, PyObject_CallMethod(host, "astype", "O", p[0]));
    return host;
}
