/* SPDX-License-Identifier: MIT */
/*
 * devicearray.c: device arrays and the copies between them and the host.
 *
 * Owns DeviceNDArrayBase, DeviceNDArray and DeviceRecord, the module
 * functions that make them (device_array, device_array_like, to_device,
 * the CUDA Array Interface import) and the copy engine.  The layout math
 * (contiguity, byte span, indexing) and the copy engine work on plain
 * descriptors (cm_view) so the host-backed arrays reuse them.
 *
 * An array holds a strong reference to the object that keeps its memory
 * alive (gpu_data: an AutoFreePointer, or a foreign CAI object) and to its
 * bound stream; it never frees memory itself.
 *
 * Also the hooks through which the files that extend device arrays
 * (dlpack.c, the features layer) see one: cm_da_describe,
 * cm_da_bound_stream, cm_da_activate_ctx, cm_da_wrap.
 *
 * Locks and the GIL: no lock; the GIL is held throughout (its one driver
 * call, a context query, is CM_CU_RAW, which yields the GIL only while
 * Python callbacks are in flight).
 */
#include "array/devicearray.h"

#include <numpy/arrayscalars.h>

#include <stdlib.h>
#include <string.h>

#include <sys/mman.h>
#include <unistd.h>

cm_array_upcalls cm_array_up;


int
cm_da_check(PyObject *o)
{
    return PyObject_TypeCheck(o, ST->DeviceNDArrayBase_type);
}

int
cm_devicearray_pointer(PyObject *o, CUdeviceptr *ptr)
{
    if (!cm_da_check(o)) {
        return 0;
    }
    *ptr = ((cm_da *)o)->ptr;
    return 1;
}

cm_context *
cm_devicearray_context(PyObject *o)
{
    return ((cm_da *)o)->ctx;
}

void
cm_da_view(cm_da *a, cm_view *v)
{
    v->addr = (uintptr_t)a->ptr;
    v->ndim = a->ndim;
    v->shape = a->shape;
    v->strides = a->strides;
    v->itemsize = PyDataType_ELSIZE(a->dtype);
    v->device = 1;
}

void
cm_nd_view(PyArrayObject *arr, cm_view *v)
{
    v->addr = (uintptr_t)PyArray_DATA(arr);
    v->ndim = PyArray_NDIM(arr);
    v->shape = PyArray_SHAPE(arr);
    v->strides = PyArray_STRIDES(arr);
    v->itemsize = PyArray_ITEMSIZE(arr);
    v->device = 0;
}

PyObject *
cm_ssize_tuple(int n, const Py_ssize_t *v)
{
    PyObject *t = PyTuple_New(n);
    int i;

    if (t == NULL) {
        return NULL;
    }
    for (i = 0; i < n; i++) {
        PyObject *x = PyLong_FromSsize_t(v[i]);

        if (x == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, x);
    }
    return t;
}

/* The owner's device address, for DeviceNDArray(..., gpu_data=owner). */
int
cm_owner_ptr(PyObject *owner, CUdeviceptr *p)
{
    uintptr_t u = 0;

    if (Py_IS_TYPE(owner, ST->Mem_type)) {
        *p = ((cm_mem *)owner)->ptr;
        return 0;
    }
    if (cm_pointer_attr(owner, "device_pointer", &u) < 0) {
        return -1;
    }
    *p = (CUdeviceptr)u;
    return 0;
}

/* 0 if a's memory is still allocated; -1 with ValueError when its
 * DeviceAllocation (or that of the array it views, as as_cuda_array
 * makes) was freed with free(), its IPC mapping (IpcMemory) was
 * closed, or its mapped() registration was closed. */
int
cm_da_alive(cm_da *a)
{
    PyObject *g = a->gpu_data;

    /* The usual owner, a DeviceAllocation, is tested first: the subtype
     * test of a view's owner costs a walk of the owner type's MRO. */
    if (g == NULL) {
        return 0;
    }
    if (!Py_IS_TYPE(g, ST->Mem_type)) {
        if (cm_da_check(g)) {
            g = ((cm_da *)g)->gpu_data;
        }
        if (g != NULL && cm_array_up.ipc_mem_closed(g)) {
            PyErr_SetString(PyExc_ValueError,
                            "the array's device memory was unmapped "
                            "(its IPC handle was closed)");
            return -1;
        }
        if (g != NULL && cm_hostreg_closed(g)) {
            PyErr_SetString(PyExc_ValueError,
                            "the array's host memory is no longer mapped "
                            "(its mapped() block has ended)");
            return -1;
        }
        if (g == NULL || !Py_IS_TYPE(g, ST->Mem_type)) {
            return 0;
        }
    }
    if (((cm_mem *)g)->freed) {
        PyErr_SetString(PyExc_ValueError,
                        "the array's device memory was freed "
                        "(DeviceAllocation.free())");
        return -1;
    }
    return 0;
}

/* Make the context of a's memory current (or the thread's default). */
int
cm_da_activate(cm_da *a)
{
    if (cm_da_alive(a) < 0) {
        return -1;
    }
    if (a->ctx != NULL) {
        return cm_context_activate(a->ctx);
    }
    return cm_context_current() == NULL ? -1 : 0;
}

/* Make a's context current for one operation; *prev as for
 * cm_context_enter (NULL when a has no context of its own). */
int
cm_da_enter(cm_da *a, CUcontext *prev)
{
    *prev = NULL;
    if (cm_da_alive(a) < 0) {
        return -1;
    }
    if (a->ctx != NULL) {
        return cm_context_enter(a->ctx, prev);
    }
    return cm_context_current() == NULL ? -1 : 0;
}

void
cm_da_leave(cm_da *a, CUcontext prev)
{
    if (a->ctx != NULL) {
        cm_context_leave(a->ctx, prev);
    }
}

/* The context that memory at ptr kept alive by gpu_data lives in: a
 * cudamem allocation's, else what the driver says of the address, else
 * the current one (if any).  Borrowed or NULL; never raises. */
static cm_context *
cm_owner_context(PyObject *gpu_data, CUdeviceptr ptr)
{
    CUcontext cur = NULL;
    cm_context *c;

    if (Py_IS_TYPE(gpu_data, ST->Mem_type)) {
        return ((cm_mem *)gpu_data)->ctx;
    }
    if (cm_da_check(gpu_data)) {
        return ((cm_da *)gpu_data)->ctx;
    }
    c = cm_context_of_pointer(ptr);
    if (c != NULL) {
        return c;
    }
    if (CM_CU_RAW(CtxGetCurrent, (&cur)) != CUDA_SUCCESS) {
        return NULL;
    }
    return cm_context_of_handle(cur);
}

/* A new array of type tp over a layout.  gpu_data NULL: allocate the
 * span (nothing when empty) and place the first element; else ptr is the
 * first element's address in memory that gpu_data keeps alive.  stream
 * NULL means 0.  Steals nothing. */
PyObject *
cm_da_make_in(PyTypeObject *tp, cm_context *hint, int ndim,
              const Py_ssize_t *shape, const Py_ssize_t *strides,
              PyArray_Descr *dtype, CUdeviceptr ptr, PyObject *gpu_data,
              PyObject *stream)
{
    cm_da *a;
    cm_context *ctx;
    CUdeviceptr base = 0;
    int i;

    if (cm_check_size(ndim, shape, PyDataType_ELSIZE(dtype)) < 0
        || cm_check_span(ndim, shape, strides, PyDataType_ELSIZE(dtype))
               < 0) {
        return NULL;
    }
    a = PyObject_GC_New(cm_da, tp);
    if (a == NULL) {
        return NULL;
    }
    a->vectorcall = NULL;
    a->ndim = ndim;
    a->shape = a->dims_inline;
    a->shape_t = NULL;
    a->strides_t = NULL;
    a->dtype = (PyArray_Descr *)Py_NewRef(dtype);
    a->gpu_data = NULL;
    a->stream = Py_NewRef(stream != NULL ? stream : cm_zero);
    a->ctx = NULL;
    a->weakreflist = NULL;
    a->cai_typestr = NULL;
    a->cai_data = NULL;
    a->gpu_shown = NULL;
    a->gpu_foreign = 0;
    a->ptr = 0;
    if (ndim > CM_DA_INLINE) {
        a->shape = PyMem_Malloc(2 * ndim * sizeof(Py_ssize_t));
        if (a->shape == NULL) {
            a->strides = NULL;
            Py_DECREF(a);
            return PyErr_NoMemory();
        }
    }
    a->strides = a->shape + ndim;
    a->size = 1;
    for (i = 0; i < ndim; i++) {
        a->shape[i] = shape[i];
        a->strides[i] = strides[i];
        a->size *= shape[i];
    }
    a->alloc_size = cm_layout_span(ndim, shape, strides, PyDataType_ELSIZE(dtype),
                                   &a->lo);
    cm_layout_flags(ndim, shape, strides, PyDataType_ELSIZE(dtype), &a->c_contig,
                    &a->f_contig);
    PyObject_GC_Track(a);
    if (a->size == 0 || PyDataType_ELSIZE(dtype) == 0) {
        /* No bytes (no elements, or elements of no size): no memory. */
        a->alloc_size = 0;
        a->lo = 0;
        a->gpu_data = Py_NewRef(Py_None);
        return (PyObject *)a;
    }
    if (gpu_data == NULL) {
        ctx = cm_context_current();
        if (ctx == NULL) {
            Py_DECREF(a);
            return NULL;
        }
        a->gpu_data = cm_mem_alloc_for(ctx, (size_t)a->alloc_size,
                                       a->stream, &base);
        if (a->gpu_data == NULL) {
            Py_DECREF(a);
            return NULL;
        }
        a->ctx = (cm_context *)Py_NewRef(ctx);
        a->ptr = base - (CUdeviceptr)a->lo;
        return (PyObject *)a;
    }
    a->gpu_data = Py_NewRef(gpu_data);
    a->ptr = ptr;
    if (hint == NULL) {
        hint = cm_owner_context(gpu_data, ptr);
    }
    a->ctx = (cm_context *)Py_XNewRef(hint);
    return (PyObject *)a;
}

/* cm_da_make_in, the context found from the owner. */
PyObject *
cm_da_make(PyTypeObject *tp, int ndim, const Py_ssize_t *shape,
           const Py_ssize_t *strides, PyArray_Descr *dtype, CUdeviceptr ptr,
           PyObject *gpu_data, PyObject *stream)
{
    return cm_da_make_in(tp, NULL, ndim, shape, strides, dtype, ptr,
                         gpu_data, stream);
}

/* A view of a: same memory and owner, new layout, bound to stream (NULL:
 * a's stream).  offset: bytes from a's first element. */
PyObject *
cm_da_subview(cm_da *a, PyTypeObject *tp, int ndim, const Py_ssize_t *shape,
              const Py_ssize_t *strides, PyArray_Descr *dtype,
              Py_ssize_t offset, PyObject *stream)
{
    Py_ssize_t n = 1;
    int i;

    PyObject *r;

    for (i = 0; i < ndim; i++) {
        n *= shape[i];
    }
    r = cm_da_make_in(tp, a->ctx, ndim, shape, strides, dtype,
                      n == 0 ? 0 : a->ptr + (CUdeviceptr)offset,
                      a->gpu_data, stream != NULL ? stream : a->stream);
    if (r != NULL) {
        ((cm_da *)r)->gpu_foreign = a->gpu_foreign;
    }
    return r;
}

int
cm_da_traverse(PyObject *self, visitproc visit, void *arg)
{
    cm_da *a = (cm_da *)self;

    Py_VISIT(Py_TYPE(self));
    Py_VISIT(a->gpu_data);
    Py_VISIT(a->gpu_shown);
    Py_VISIT(a->stream);
    Py_VISIT(a->ctx);
    return 0;
}

int
cm_da_clear(PyObject *self)
{
    cm_da *a = (cm_da *)self;

    Py_CLEAR(a->gpu_data);
    Py_CLEAR(a->gpu_shown);
    Py_CLEAR(a->stream);
    Py_CLEAR(a->ctx);
    return 0;
}

void
cm_da_dealloc(PyObject *self)
{
    cm_da *a = (cm_da *)self;
    PyTypeObject *tp = Py_TYPE(self);

    PyObject_GC_UnTrack(self);
    if (a->weakreflist != NULL) {
        PyObject_ClearWeakRefs(self);
    }
    Py_CLEAR(a->shape_t);
    Py_CLEAR(a->strides_t);
    Py_CLEAR(a->cai_typestr);
    Py_CLEAR(a->cai_data);
    Py_CLEAR(a->dtype);
    Py_CLEAR(a->stream);
    Py_CLEAR(a->gpu_shown);
    Py_CLEAR(a->gpu_data);
    Py_CLEAR(a->ctx);
    if (a->shape != a->dims_inline) {
        PyMem_Free(a->shape);
    }
    tp->tp_free(self);
    Py_DECREF(tp);
}

/* The effective stream of a call: the stream argument if truthy, else
 * the array's bound stream.  1 (async on *h), 0 (synchronous) or -1.
 * *obj (when obj is not NULL) gets the object the stream came from
 * (borrowed). */
int
cm_effective_stream_obj(PyObject *arg, PyObject *bound, CUstream *h,
                        PyObject **obj)
{
    int r;

    if (arg != NULL) {
        r = cm_stream_resolve(arg, h);
        if (r != 0) {
            if (obj != NULL) {
                *obj = arg;
            }
            return r;
        }
    }
    if (obj != NULL) {
        *obj = bound;
    }
    return cm_stream_resolve(bound, h);
}

int
cm_effective_stream(PyObject *arg, PyObject *bound, CUstream *h)
{
    return cm_effective_stream_obj(arg, bound, h, NULL);
}

/* Note that async work just queued on h (from stream object sobj) used
 * a's memory, so that its release waits for it (cm_mem_note_use); a
 * no-op for async 0 (work that has completed; a synchronous copy that
 * may return before it has run passes 1).  0 or -1. */
int
cm_da_used_on(cm_da *a, int async, CUstream h, PyObject *sobj)
{
    if (!async || a->gpu_data == NULL) {
        return 0;
    }
    if (cm_stream_handle_is_default(h)) {
        sobj = NULL;
    }
    return cm_mem_note_use(a->gpu_data, h, sobj);
}

int
cm_devicearray_owner(PyObject *o, PyObject **owner)
{
    if (!cm_da_check(o)) {
        return 0;
    }
    *owner = ((cm_da *)o)->gpu_data;
    return 1;
}

/* The stream a view made with a stream argument is bound to. */
PyObject *
cm_pick_stream(PyObject *arg, cm_da *a)
{
    CUstream h;
    int r;

    if (arg == NULL) {
        return a->stream;
    }
    r = cm_stream_resolve(arg, &h);
    if (r < 0) {
        return NULL;
    }
    return r ? arg : a->stream;
}

/* ------------------------------------------------------------------ */
/* Compatibility checks                                                */
/* ------------------------------------------------------------------ */

/* Whether two shapes agree once their size-1 dimensions are dropped. */
static int
cm_same_core_shape(int n1, const Py_ssize_t *s1, int n2,
                   const Py_ssize_t *s2)
{
    int i = 0;
    int k = 0;

    for (;;) {
        while (i < n1 && s1[i] == 1) {
            i++;
        }
        while (k < n2 && s2[k] == 1) {
            k++;
        }
        if (i == n1 || k == n2) {
            return i == n1 && k == n2;
        }
        if (s1[i++] != s2[k++]) {
            return 0;
        }
    }
}

/* numba's check_array_compatibility without the strides rule (cudamem
 * copies between any layouts): TypeError on dtype, ValueError on shape,
 * with numba's words followed by which is which (the device array, then
 * other: "the source" or "the destination"). */
int
cm_check_compatible(PyArray_Descr *d1, int n1, const Py_ssize_t *s1,
                    PyArray_Descr *d2, int n2, const Py_ssize_t *s2,
                    const char *other)
{
    PyObject *t1;
    PyObject *t2;
    int eq = PyObject_RichCompareBool((PyObject *)d1, (PyObject *)d2, Py_EQ);

    if (eq < 0) {
        return -1;
    }
    if (!eq) {
        PyErr_Format(PyExc_TypeError,
                     "incompatible dtype: %S vs. %S (the device array vs. "
                     "%s)", d1, d2, other);
        return -1;
    }
    if (cm_same_core_shape(n1, s1, n2, s2)) {
        return 0;
    }
    t1 = cm_ssize_tuple(n1, s1);
    t2 = cm_ssize_tuple(n2, s2);
    if (t1 != NULL && t2 != NULL) {
        PyErr_Format(PyExc_ValueError,
                     "incompatible shape: %R vs. %R (the device array vs. "
                     "%s)", t1, t2, other);
    }
    Py_XDECREF(t1);
    Py_XDECREF(t2);
    return -1;
}

/* ------------------------------------------------------------------ */
/* Hooks for the files that extend device arrays                       */
/* ------------------------------------------------------------------ */

int
cm_da_describe(PyObject *obj, cm_da_desc *d)
{
    cm_da *a = (cm_da *)obj;

    if (!cm_da_check(obj)) {
        return 0;
    }
    cm_da_view(a, &d->view);
    d->dtype = a->dtype;
    d->stream = a->stream;
    d->gpu_data = a->gpu_data;
    d->ctx = a->ctx;
    return 1;
}

int
cm_da_bound_stream(PyObject *obj, CUstream *h)
{
    return cm_effective_stream(NULL, ((cm_da *)obj)->stream, h);
}

int
cm_da_activate_ctx(PyObject *obj)
{
    return cm_da_activate((cm_da *)obj);
}

PyObject *
cm_da_wrap(int ndim, const Py_ssize_t *shape, const Py_ssize_t *strides,
           PyArray_Descr *dtype, CUdeviceptr ptr, PyObject *owner,
           PyObject *stream)
{
    return cm_da_make(ST->DeviceNDArray_type, ndim, shape, strides, dtype,
                      ptr, owner, stream);
}
