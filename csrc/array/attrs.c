/* SPDX-License-Identifier: MIT */
/*
 * array/attrs.c: the attributes of device arrays (the CUDA Array
 * Interface export among them) and indexing.
 */
#include "array/devicearray.h"

#include <numpy/arrayscalars.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* Attributes                                                          */
/* ------------------------------------------------------------------ */

/* The shape tuple (strides 0) or the strides tuple (1), made on first
 * use (most arrays never show theirs); borrowed, or NULL with an
 * exception. */
PyObject *
cm_da_dims_tuple(cm_da *a, int strides)
{
    PyObject **slot = strides ? &a->strides_t : &a->shape_t;

    if (*slot == NULL) {
        *slot = cm_ssize_tuple(a->ndim, strides ? a->strides : a->shape);
    }
    return *slot;
}

PyObject *
cm_da_get_shape(PyObject *self, void *unused)
{
    (void)unused;
    return Py_XNewRef(cm_da_dims_tuple((cm_da *)self, 0));
}

PyObject *
cm_da_get_strides(PyObject *self, void *unused)
{
    (void)unused;
    return Py_XNewRef(cm_da_dims_tuple((cm_da *)self, 1));
}

PyObject *
cm_da_get_ndim(PyObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromLong(((cm_da *)self)->ndim);
}

PyObject *
cm_da_get_size(PyObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromSsize_t(((cm_da *)self)->size);
}

PyObject *
cm_da_get_dtype(PyObject *self, void *unused)
{
    (void)unused;
    return Py_NewRef(((cm_da *)self)->dtype);
}

PyObject *
cm_da_get_itemsize(PyObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromSsize_t(PyDataType_ELSIZE(((cm_da *)self)->dtype));
}

PyObject *
cm_da_get_nbytes(PyObject *self, void *unused)
{
    cm_da *a = (cm_da *)self;

    (void)unused;
    return PyLong_FromSsize_t(a->size * PyDataType_ELSIZE(a->dtype));
}

PyObject *
cm_da_get_alloc_size(PyObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromSsize_t(((cm_da *)self)->alloc_size);
}

/* What gpu_data shows for a (numba's DeviceNDArray.gpu_data): the
 * memory object when the array spans all of it; else a pointer to the
 * bytes the array spans, from the memory object's view(); for an array
 * over foreign memory (a CUDA Array Interface import) a MemoryPointer
 * over those bytes whose owner is the foreign object.  New reference, or
 * NULL with an exception. */
static PyObject *
cm_da_make_shown(cm_da *a)
{
    PyObject *g = a->gpu_data;
    PyObject *o;
    cm_context *ctx;
    CUdeviceptr low;
    uintptr_t base = 0;
    Py_ssize_t span = a->alloc_size;
    Py_ssize_t size;

    if (span == 0 || a->ptr == 0) {
        return Py_NewRef(g);
    }
    low = (CUdeviceptr)((long long)a->ptr + (long long)a->lo);
    if (a->gpu_foreign || g == Py_None) {
        ctx = a->ctx != NULL ? a->ctx : cm_context_current();
        if (ctx == NULL || CM_REGISTERED(MemoryPointer) == NULL) {
            return NULL;
        }
        return PyObject_CallFunction(cm_st->MemoryPointer, "OKnO", ctx,
                                     (unsigned long long)low, span, g);
    }
    if (Py_IS_TYPE(g, ST->Mem_type)) {
        base = (uintptr_t)((cm_mem *)g)->ptr;
        size = (Py_ssize_t)((cm_mem *)g)->size;
    }
    else {
        /* Any other memory object with numba's pointer interface; one
         * without it is shown as it is. */
        if (cm_pointer_attr(g, "device_pointer", &base) < 0
            || (o = PyObject_GetAttrString(g, "size")) == NULL) {
            goto err_attr;
        }
        size = PyNumber_AsSsize_t(o, PyExc_OverflowError);
        Py_DECREF(o);
        if (size == -1 && PyErr_Occurred()) {
            goto err_attr;
        }
    }
    if ((uintptr_t)low == base && span == size) {
        return Py_NewRef(g);
    }
    if ((uintptr_t)low < base
        || (uintptr_t)low - base + (uintptr_t)span > (uintptr_t)size) {
        return Py_NewRef(g);
    }
    o = PyObject_CallMethod(g, "view", "nn", (Py_ssize_t)(low - base),
                            (Py_ssize_t)(low - base) + span);
    if (o == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        return Py_NewRef(g);
    }
    return o;
err_attr:
    if (PyErr_ExceptionMatches(PyExc_AttributeError)
        || PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        return Py_NewRef(g);
    }
    return NULL;
}

PyObject *
cm_da_get_gpu_data(PyObject *self, void *unused)
{
    cm_da *a = (cm_da *)self;

    (void)unused;
    if (a->gpu_shown == NULL) {
        a->gpu_shown = cm_da_make_shown(a);
    }
    return Py_XNewRef(a->gpu_shown);
}

PyObject *
cm_da_get_stream(PyObject *self, void *unused)
{
    (void)unused;
    return Py_NewRef(((cm_da *)self)->stream);
}

int
cm_da_set_stream(PyObject *self, PyObject *value, void *unused)
{
    CUstream h;

    (void)unused;
    if (value == NULL) {
        PyErr_SetString(PyExc_TypeError, "cannot delete the stream");
        return -1;
    }
    if (cm_stream_resolve(value, &h) < 0) {
        return -1;
    }
    Py_SETREF(((cm_da *)self)->stream, Py_NewRef(value));
    return 0;
}

PyObject *
cm_da_get_ctypes_ptr(PyObject *self, void *unused)
{
    cm_da *a = (cm_da *)self;
    PyObject *ctypes;
    PyObject *r;

    (void)unused;
    ctypes = PyImport_ImportModule("ctypes");
    if (ctypes == NULL) {
        return NULL;
    }
    if (a->ptr == 0) {
        r = PyObject_CallMethod(ctypes, "c_void_p", "i", 0);
    }
    else {
        r = PyObject_CallMethod(ctypes, "c_size_t", "K",
                                (unsigned long long)a->ptr);
    }
    Py_DECREF(ctypes);
    return r;
}

PyObject *
cm_da_get_flags(PyObject *self, void *unused)
{
    cm_da *a = (cm_da *)self;

    (void)unused;
    return Py_BuildValue("{sOsO}", "C_CONTIGUOUS",
                         a->c_contig ? Py_True : Py_False, "F_CONTIGUOUS",
                         a->f_contig ? Py_True : Py_False);
}

PyObject *
cm_da_get_cai(PyObject *self, void *unused)
{
    cm_da *a = (cm_da *)self;
    PyObject *d;
    PyObject *v;
    CUstream h;
    int r;

    (void)unused;
    /* Freed or unmapped memory is not handed to other libraries. */
    if (cm_da_alive(a) < 0) {
        return NULL;
    }
    d = PyDict_New();
    if (d == NULL) {
        return NULL;
    }
    if ((v = cm_da_dims_tuple(a, 0)) == NULL
        || PyDict_SetItem(d, ST->str_shape, v) < 0
        || (v = a->c_contig ? Py_None : cm_da_dims_tuple(a, 1)) == NULL
        || PyDict_SetItem(d, ST->str_strides, v) < 0) {
        goto err_dict;
    }
    /* The data pair and the typestr never change: made once. */
    if (a->cai_data == NULL) {
        a->cai_data = Py_BuildValue("(KO)", (unsigned long long)a->ptr,
                                    Py_False);
        if (a->cai_data == NULL) {
            goto err_dict;
        }
    }
    if (a->cai_typestr == NULL) {
        a->cai_typestr = PyObject_GetAttrString((PyObject *)a->dtype, "str");
        if (a->cai_typestr == NULL) {
            goto err_dict;
        }
    }
    if (PyDict_SetItem(d, ST->str_data, a->cai_data) < 0
        || PyDict_SetItem(d, ST->str_typestr, a->cai_typestr) < 0) {
        goto err_dict;
    }
    if (PyDataType_HASFIELDS(a->dtype)) {
        v = PyObject_GetAttrString((PyObject *)a->dtype, "descr");
        if (v == NULL || PyDict_SetItem(d, ST->str_descr, v) < 0) {
            Py_XDECREF(v);
            goto err_dict;
        }
        Py_DECREF(v);
    }
    if (PyDict_SetItem(d, ST->str_version, cm_three) < 0) {
        goto err_dict;
    }
    r = cm_effective_stream(NULL, a->stream, &h);
    if (r < 0) {
        goto err_dict;
    }
    if (r == 0) {
        v = Py_NewRef(Py_None);
    }
    else if (h == NULL) {
        /* The default stream exports the handle of its mode. */
        v = PyLong_FromLong(cm_driver_per_thread() ? 2 : 1);
    }
    else {
        v = PyLong_FromVoidPtr((void *)h);
    }
    if (v == NULL || PyDict_SetItem(d, ST->str_stream, v) < 0) {
        Py_XDECREF(v);
        goto err_dict;
    }
    Py_DECREF(v);
    return d;
err_dict:
    Py_DECREF(d);
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Indexing                                                            */
/* ------------------------------------------------------------------ */

/* How cm_layout_index takes one element of a key. */
enum {
    CM_IX_INT, CM_IX_SLICE, CM_IX_NEW, CM_IX_ELLIPSIS, CM_IX_ADVANCED,
    CM_IX_BAD
};

/* The kind of key element e (CM_IX_*); an integer's value in *i.  -1 with
 * an exception only when e's __index__ fails for a reason other than not
 * being an integer. */
static int
cm_index_kind(PyObject *e, Py_ssize_t *i)
{
    PyObject *cai = NULL;

    if (PySlice_Check(e)) {
        return CM_IX_SLICE;
    }
    if (e == Py_None) {
        return CM_IX_NEW;
    }
    if (e == Py_Ellipsis) {
        return CM_IX_ELLIPSIS;
    }
    /* Booleans index as 0-d boolean arrays in NumPy, never as 0 / 1. */
    if (PyBool_Check(e) || PyArray_IsScalar(e, Bool)) {
        return CM_IX_ADVANCED;
    }
    /* Arrays (0-d integer ones too: NumPy indexes with their value but
     * copies), lists and nested tuples are index arrays. */
    if (PyArray_Check(e) || PyList_Check(e) || PyTuple_Check(e)
        || cm_da_check(e)) {
        return CM_IX_ADVANCED;
    }
    if (PyIndex_Check(e)) {
        /* An index beyond Py_ssize_t is out of range: IndexError. */
        *i = PyNumber_AsSsize_t(e, PyExc_IndexError);
        if (*i == -1 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_IndexError)) {
                return -1;
            }
            PyErr_Clear();
            *i = PY_SSIZE_T_MAX;
        }
        return CM_IX_INT;
    }
    /* Anything else: an index array if it has the CUDA Array Interface
     * (cudamem._index decides), else not an index. */
    if (PyObject_GetOptionalAttr(e, cm_str_cai, &cai) < 0) {
        PyErr_Clear();
    }
    if (cai == NULL) {
        return CM_IX_BAD;
    }
    Py_DECREF(cai);
    return CM_IX_ADVANCED;
}

/* Apply a basic index (ints, slices, Ellipsis, None and tuples of them)
 * to a layout, NumPy's way.  Fills the result layout (up to
 * NPY_MAXDIMS dimensions), the byte offset of its first element and
 * whether it selects one element (every dimension indexed by an int, no
 * Ellipsis or None).  0; 1 when the key has an advanced element (index
 * arrays, lists, booleans: cudamem._index takes it; nothing filled); -1
 * with NumPy's IndexError. */
int
cm_layout_index(int ndim, const Py_ssize_t *shape,
                const Py_ssize_t *strides, PyObject *item, int *ondim,
                Py_ssize_t *oshape, Py_ssize_t *ostrides,
                Py_ssize_t *offset, int *all_int)
{
    PyObject *const *items;
    Py_ssize_t ival[NPY_MAXDIMS];
    signed char kind[NPY_MAXDIMS];
    Py_ssize_t n;
    Py_ssize_t k;
    int used = 0;
    int ell = -1;
    int extra = 0;
    int out = 0;
    int ints = 0;
    int ax = 0;
    int j;

    if (PyTuple_Check(item)) {
        items = &PyTuple_GET_ITEM(item, 0);
        n = PyTuple_GET_SIZE(item);
    }
    else {
        items = &item;
        n = 1;
    }
    if (n > NPY_MAXDIMS) {
        PyErr_SetString(PyExc_IndexError, "too many indices for array");
        return -1;
    }
    for (k = 0; k < n; k++) {
        int t = cm_index_kind(items[k], &ival[k]);

        if (t < 0) {
            return -1;
        }
        kind[k] = (signed char)t;
        if (t == CM_IX_ADVANCED) {
            return 1;
        }
        if (t == CM_IX_BAD) {
            PyErr_SetString(PyExc_IndexError,
                            "only integers, slices (`:`), ellipsis (`...`), "
                            "numpy.newaxis (`None`) and integer or boolean "
                            "arrays are valid indices");
            return -1;
        }
        if (t == CM_IX_ELLIPSIS) {
            if (ell >= 0) {
                PyErr_SetString(PyExc_IndexError,
                                "an index can only have a single ellipsis "
                                "('...')");
                return -1;
            }
            ell = (int)k;
        }
        used += t == CM_IX_INT || t == CM_IX_SLICE;
        extra += t == CM_IX_NEW;
    }
    if (used > ndim) {
        PyErr_Format(PyExc_IndexError,
                     "too many indices for array: array is %d-dimensional, "
                     "but %d were indexed", ndim, used);
        return -1;
    }
    if (ndim - used + used + extra > NPY_MAXDIMS) {
        PyErr_Format(PyExc_IndexError,
                     "the result would have more than %d dimensions",
                     NPY_MAXDIMS);
        return -1;
    }
    *offset = 0;
    for (k = 0; k < n; k++) {
        switch (kind[k]) {
        case CM_IX_SLICE: {
            Py_ssize_t start;
            Py_ssize_t stop;
            Py_ssize_t step;
            Py_ssize_t len;

            if (PySlice_Unpack(items[k], &start, &stop, &step) < 0) {
                return -1;
            }
            len = PySlice_AdjustIndices(shape[ax], &start, &stop, step);
            if (len > 0) {
                *offset += start * strides[ax];
            }
            else {
                step = 1;     /* NumPy's stride for an empty slice */
            }
            oshape[out] = len;
            /* A length-1 dimension is never stepped: NumPy's product,
             * wrapping where it does not fit. */
            ostrides[out] = (Py_ssize_t)((size_t)strides[ax]
                                         * (size_t)step);
            out++;
            ax++;
            break;
        }
        case CM_IX_INT: {
            Py_ssize_t i = ival[k];

            if (i < 0 && i != PY_SSIZE_T_MIN) {
                i += shape[ax];
            }
            if (i < 0 || i >= shape[ax]) {
                PyErr_Format(PyExc_IndexError,
                             "index %zd is out of bounds for axis %d with "
                             "size %zd", ival[k], ax, shape[ax]);
                return -1;
            }
            *offset += i * strides[ax];
            ints++;
            ax++;
            break;
        }
        case CM_IX_NEW:
            oshape[out] = 1;
            ostrides[out] = 0;
            out++;
            break;
        default:     /* the Ellipsis: the dimensions no index names */
            for (j = 0; j < ndim - used; j++) {
                oshape[out] = shape[ax];
                ostrides[out] = strides[ax];
                out++;
                ax++;
            }
            break;
        }
    }
    if (ell < 0) {
        for (; ax < ndim; ax++) {
            oshape[out] = shape[ax];
            ostrides[out] = strides[ax];
            out++;
        }
    }
    *ondim = out;
    *all_int = ints == ndim && ell < 0 && extra == 0;
    return 0;
}

/* Read one element at addr as a NumPy scalar (a blocking copy). */
PyObject *
cm_read_scalar(CUdeviceptr addr, PyArray_Descr *dtype, PyObject *stream,
               PyObject *bound)
{
    char small[64];
    char *buf = small;
    PyObject *r = NULL;
    cm_view dv;
    cm_view sv;
    CUstream h;
    int async;

    async = cm_effective_stream(stream, bound, &h);
    if (async < 0) {
        return NULL;
    }
    if (PyDataType_ELSIZE(dtype) > (Py_ssize_t)sizeof(small)) {
        buf = PyMem_Malloc(PyDataType_ELSIZE(dtype));
        if (buf == NULL) {
            return PyErr_NoMemory();
        }
    }
    dv.addr = (uintptr_t)buf;
    dv.ndim = 0;
    dv.shape = NULL;
    dv.strides = NULL;
    dv.itemsize = PyDataType_ELSIZE(dtype);
    dv.device = 0;
    sv = dv;
    sv.addr = (uintptr_t)addr;
    sv.device = 1;
    if (cm_copy(&dv, &sv, h, async) < 0
        || (async && cm_stream_wait(h) < 0)) {
        goto out_buf;
    }
    r = PyArray_Scalar(buf, dtype, NULL);
out_buf:
    if (buf != small) {
        PyMem_Free(buf);
    }
    return r;
}

static PyObject *
cm_da_getitem_impl_run(cm_da *self, PyObject *item, PyObject *stream)
{
    Py_ssize_t shape[NPY_MAXDIMS];
    Py_ssize_t strides[NPY_MAXDIMS];
    Py_ssize_t offset;
    PyObject *bound;
    int ndim;
    int all_int;
    int adv;

    adv = cm_layout_index(self->ndim, self->shape, self->strides, item,
                          &ndim, shape, strides, &offset, &all_int);
    if (adv < 0) {
        return NULL;
    }
    if (adv) {
        /* Index arrays: a new array, gathered on the device. */
        if (cm_da_alive(self) < 0) {
            return NULL;
        }
        if (cm_da_check(item)) {
            int handled;
            PyObject *r = cm_ix_take(self, (cm_da *)item, stream, &handled);

            if (handled) {
                return r;
            }
        }
        if (CM_REGISTERED(index_getitem) == NULL) {
            return NULL;
        }
        return PyObject_CallFunctionObjArgs(
            cm_st->index_getitem, (PyObject *)self, item,
            stream != NULL ? stream : Py_None, NULL);
    }
    bound = cm_pick_stream(stream, self);
    if (bound == NULL) {
        return NULL;
    }
    if (all_int && PyDataType_HASFIELDS(self->dtype)) {
        return cm_da_subview(self, ST->DeviceRecord_type, 0, NULL, NULL,
                             self->dtype, offset, bound);
    }
    if (all_int) {
        if (cm_da_activate(self) < 0) {
            return NULL;
        }
        return cm_read_scalar(self->ptr + (CUdeviceptr)offset, self->dtype,
                              stream, self->stream);
    }
    return cm_da_subview(self, ST->DeviceNDArray_type, ndim, shape, strides,
                         self->dtype, offset, bound);
}

/* cm_da_getitem_impl_run with the array's context current. */
PyObject *
cm_da_getitem_impl(cm_da *self, PyObject *item, PyObject *stream)
{
    PyObject *r;

    CM_ENTERED(cm_da_enter, cm_da_leave, self, r, NULL,
               cm_da_getitem_impl_run(self, item, stream));
    return r;
}

PyObject *
cm_da_subscript(PyObject *self, PyObject *item)
{
    return cm_da_getitem_impl((cm_da *)self, item, NULL);
}

/* Fill the device view lhs (dtype) from value with numba's broadcasting
 * rules; host values are cast with NumPy's unsafe casting. */
/* lhs = cast(src) elementwise by the internal kernel; src strides are
 * per lhs dimension (0 broadcasts).  Waits for it unless async. */
int
cm_assign_by_kernel(const cm_view *lhs, int dst_type, CUdeviceptr src,
                    const Py_ssize_t *src_strides, int src_type,
                    CUstream h, int async)
{
    cm_copy_desc d;
    cm_context *ctx = cm_context_current();
    int i;

    if (ctx == NULL) {
        return -1;
    }
    d.ndim = lhs->ndim;
    for (i = 0; i < lhs->ndim; i++) {
        d.shape[i] = lhs->shape[i];
        d.dst_strides[i] = lhs->strides[i];
        d.src_strides[i] = src_strides[i];
    }
    d.dst = (CUdeviceptr)lhs->addr;
    d.src = src;
    d.dst_type = dst_type;
    d.src_type = src_type;
    d.itemsize = (int)lhs->itemsize;
    if (cm_copy_kernel(ctx, &d, h) < 0) {
        return -1;
    }
    return async ? 0 : cm_stream_wait(h);
}
