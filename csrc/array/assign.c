/* SPDX-License-Identifier: MIT */
/*
 * array/assign.c: assignment into device arrays: host values of
 * asynchronous assignments, kept alive until the copy has run.
 *
 * Locks and the GIL: no lock; the GIL guards the table of page-locked
 * buffers (cm_hv).  A slot being filled, or taken and not yet queued, is
 * marked busy, since the driver calls between may let go of the GIL:
 * cm_hostval_fill and a buffer's replacement drop it
 * (CM_DRIVER_BEGIN_NOGIL) around the allocation and free, touching only
 * C locals, and an event query (CM_CU_RAW) may yield it; a query's
 * answer is used only if the slot's use count did not move meanwhile.
 * The synchronous memset and the broadcast's upload drop it too
 * (CM_CU_NOGIL).  While a CUDA graph capture forbids this thread the
 * event query (cm_capture_restricted), a buffer is reused only if a
 * context-wide synchronize tells it is free, and no buffer is made.
 */
#include "array/devicearray.h"

#include <numpy/arrayscalars.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define CM_HV_SCAN 16                  /* idle ones looked for per call */
#define CM_HV_MAX ((size_t)64 << 20)   /* larger values: synchronous */
#define CM_HV_TOTAL ((size_t)256 << 20) /* the most all buffers hold */

typedef struct {
    unsigned long gen;    /* the context's gen; 0: slot empty */
    int busy;             /* taken: between cm_hostval_take and
                           * cm_hostval_queued, or being (re)filled */
    unsigned long uses;   /* times taken: an event query made with the
                           * GIL released speaks of the use it began in */
    void *buf;            /* cuMemHostAlloc'd, mapped */
    CUdeviceptr dptr;     /* its address on the device */
    size_t cap;           /* bytes */
    CUevent ev;           /* recorded after the last copy from buf */
    unsigned long mark;   /* cm_ctx_sync_mark after ev's record */
} cm_hostval;

/* The slots, a fixed table: the GIL may be released in the middle of a
 * take (driver calls), so a slot's address must not move and a slot in
 * use is marked busy rather than trusted to the GIL. */
static cm_hostval cm_hv[CM_HV_SLOTS];
static int cm_hv_n;            /* slots used so far */
static int cm_hv_next;         /* where the next search starts: the slot
                                * after the last one used, the oldest in a
                                * stream's order */
static size_t cm_hv_bytes;     /* bytes the buffers hold */

/* Fill the empty slot i (marked busy) with a buffer of at least n bytes
 * of ctx; 0 or -1 (the slot left empty).  Releases the GIL. */
static int
cm_hostval_fill(cm_context *ctx, int i, size_t n)
{
    void *buf = NULL;
    CUdeviceptr dptr = 0;
    CUevent ev = NULL;
    size_t cap;
    CUresult rc;

    for (cap = 4096; cap < n; cap *= 2) {
    }
    CM_DRIVER_BEGIN_NOGIL
    rc = CM_CU_RAW(MemHostAlloc, (&buf, cap,
                                  CU_MEMHOSTALLOC_DEVICEMAP
                                  | CU_MEMHOSTALLOC_PORTABLE));
    if (rc == CUDA_SUCCESS) {
        rc = CM_CU_RAW(MemHostGetDevicePointer, (&dptr, buf, 0));
    }
    if (rc == CUDA_SUCCESS) {
        rc = CM_CU_RAW(EventCreate, (&ev, CU_EVENT_DISABLE_TIMING));
    }
    if (rc != CUDA_SUCCESS && buf != NULL) {
        (void)CM_CU_RAW(MemFreeHost, (buf));
    }
    CM_DRIVER_END_NOGIL
    if (rc != CUDA_SUCCESS) {
        return -1;
    }
    cm_hv[i].buf = buf;
    cm_hv[i].dptr = dptr;
    cm_hv[i].ev = ev;
    cm_hv[i].cap = cap;
    cm_hv[i].gen = ctx->gen;
    cm_hv_bytes += cap;
    return 0;
}

/* A page-locked buffer of at least n bytes of ctx (current) that no
 * queued copy reads any more, holding a copy of data: its slot index,
 * marked busy until cm_hostval_queued, or -1 when none can be had (the
 * caller then copies synchronously; no exception is set).  While a
 * capture forbids this thread the event query and the allocation, only
 * a buffer that a context-wide synchronize since its last use tells is
 * free. */
static int
cm_hostval_take(cm_context *ctx, const void *data, size_t n)
{
    int i;
    int k;
    int empty = -1;
    int spare = -1;
    cm_hostval *v;
    unsigned long use;
    unsigned long spare_use = 0;
    CUresult rc;
    int restricted = cm_capture_restricted();

    if (n > CM_HV_MAX || cm_forked) {
        return -1;
    }
    for (k = 0; k < cm_hv_n && k < CM_HV_SCAN; k++) {
        i = (cm_hv_next + k) % cm_hv_n;
        v = &cm_hv[i];
        if (v->busy) {
            continue;
        }
        if (v->gen != 0 && v->gen != ctx->gen
            && !cm_context_gen_live(v->gen)) {
            v->gen = 0;        /* its context is gone, and the memory */
            cm_hv_bytes -= v->cap;
        }
        if (v->gen == 0) {
            if (empty < 0) {
                empty = i;
            }
            continue;
        }
        if (v->gen != ctx->gen) {
            continue;
        }
        if (restricted) {
            if (v->cap >= n && cm_ctx_synced_since(ctx, v->mark)) {
                v->busy = 1;
                v->uses++;
                goto found;
            }
            continue;
        }
        use = v->uses;
        rc = CM_CU_RAW(EventQuery, (v->ev));
        /* The GIL may have been released: another thread may have taken
         * it meanwhile, and even used it and recorded its event again
         * (then the answer is about the old record). */
        if (rc != CUDA_SUCCESS || v->busy || v->gen != ctx->gen
            || v->uses != use) {
            continue;
        }
        if (v->cap >= n) {
            v->busy = 1;
            v->uses++;
            goto found;
        }
        spare = i;
        spare_use = use;
    }
    if (restricted) {
        return -1;         /* a new buffer would be an allocation */
    }
    if (empty >= 0 && (cm_hv[empty].busy || cm_hv[empty].gen != 0)) {
        empty = -1;        /* another thread took it meanwhile */
    }
    if (empty < 0 && cm_hv_n < CM_HV_SLOTS
        && cm_hv_bytes + n <= CM_HV_TOTAL) {
        empty = cm_hv_n++;
        cm_hv[empty].gen = 0;
        cm_hv[empty].busy = 0;
    }
    if (empty < 0 && (spare < 0 || cm_hv[spare].busy
                      || cm_hv[spare].gen != ctx->gen
                      || cm_hv[spare].uses != spare_use)) {
        return -1;          /* none, or the idle one was taken meanwhile */
    }
    if (empty < 0) {
        /* An idle buffer too small: replaced by a larger one. */
        void *old;

        i = spare;
        v = &cm_hv[i];
        v->busy = 1;
        v->uses++;
        old = v->buf;
        v->gen = 0;
        cm_hv_bytes -= v->cap;
        (void)CM_CU_RAW(EventDestroy, (v->ev));
        CM_DRIVER_BEGIN_NOGIL
        (void)CM_CU_RAW(MemFreeHost, (old));
        CM_DRIVER_END_NOGIL
        empty = i;
    }
    i = empty;
    cm_hv[i].busy = 1;
    cm_hv[i].uses++;
    if (cm_hostval_fill(ctx, i, n) < 0) {
        cm_hv[i].busy = 0;
        return -1;
    }
found:
    memcpy(cm_hv[i].buf, data, n);
    cm_hv_next = (i + 1) % cm_hv_n;
    return i;
}

/* The copies from slot i are queued on h (of ctx): it is reusable once
 * they ran, and free for another take now.  0, or -1 with an exception
 * (then the stream is waited for). */
static int
cm_hostval_queued(const cm_context *ctx, int i, CUstream h)
{
    if (CM_CU(EventRecord, (cm_hv[i].ev, h)) < 0) {
        PyObject *exc = PyErr_GetRaisedException();

        /* Nothing will say when it is free: let the copy land. */
        (void)cm_stream_wait(h);
        PyErr_SetRaisedException(exc);
        cm_hv[i].busy = 0;
        return -1;
    }
    /* Recorded in a capture, the event never answers and a graph reads
     * the buffer at each launch: no synchronize tells it free either. */
    cm_hv[i].mark = cm_capture_stream_known(h) ? ULONG_MAX
                                               : cm_ctx_sync_mark(ctx);
    cm_hv[i].busy = 0;
    return 0;
}

static int
cm_assign_broadcast(const cm_view *lhs, PyArrayObject *host,
                    const Py_ssize_t *rstrides, CUstream h, int async)
{
    cm_context *ctx = cm_context_current();
    PyObject *tmp_owner;
    CUdeviceptr tmp = 0;
    size_t nbytes = (size_t)PyArray_NBYTES(host);
    int t = cm_raw_type(lhs->itemsize);
    int err;
    int rc;

    if (ctx == NULL) {
        return -1;
    }
    if (async) {
        /* The kernel reads the value from a mapped page-locked copy whose
         * reuse waits for the stream: no allocation, no wait. */
        int slot = cm_hostval_take(ctx, PyArray_DATA(host), nbytes);

        if (slot >= 0) {
            rc = cm_assign_by_kernel(lhs, t, cm_hv[slot].dptr, rstrides, t,
                                     h, async);
            if (cm_hostval_queued(ctx, slot, h) < 0) {
                rc = -1;
            }
            return rc;
        }
    }
    /* Allocated for h: its release is ordered after the kernel. */
    tmp_owner = cm_mem_alloc_on(ctx, nbytes, async ? h : NULL, &tmp);
    if (tmp_owner == NULL) {
        return -1;
    }
    if (async) {
        err = CM_CU(MemcpyHtoDAsync, (tmp, PyArray_DATA(host), nbytes, h));
        /* The host value may be a temporary: let the upload land. */
        if (err == 0) {
            err = cm_stream_wait(h);
        }
    }
    else {
        CM_CU_NOGIL(err, MemcpyHtoD, (tmp, PyArray_DATA(host), nbytes));
    }
    rc = err < 0 ? -1
                 : cm_assign_by_kernel(lhs, t, tmp, rstrides, t, h, async);
    Py_DECREF(tmp_owner);
    return rc;
}

static int cm_assign(const cm_view *lhs, PyArray_Descr *dtype,
                     PyObject *value, CUstream h, int async);

/* cm_assign's step: the right-hand side as an array: a device array (a
 * cudamem one or a CAI view), a NumPy array, or value converted (to dtype
 * when structured).  A new reference, or NULL with an exception. */
static PyObject *
cm_assign_rhs(PyArray_Descr *dtype, PyObject *value)
{
    PyObject *rhs = (PyObject *)cm_as_device_source(value);

    if (rhs == NULL) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        if (PyArray_Check(value)) {
            rhs = Py_NewRef(value);
        }
        else if (PyDataType_HASFIELDS(dtype)) {
            Py_INCREF(dtype);
            rhs = PyArray_FromAny(value, dtype, 0, 0, 0, NULL);
        }
        else {
            rhs = PyArray_FromAny(value, NULL, 0, 0, 0, NULL);
        }
    }
    return rhs;
}

/* cm_assign's step: rhs broadcast against lhs: its strides padded on the
 * left to lhs->ndim entries in rstrides[], 0 where it broadcasts.  The
 * padding (the dimensions lhs has in front of rhs's), or -1 with
 * ValueError. */
static int
cm_assign_broadcast_strides(const cm_view *lhs, PyObject *rhs,
                            Py_ssize_t *rstrides)
{
    const Py_ssize_t *rshape;
    const Py_ssize_t *rst;
    int rndim;
    int pad;
    int i;

    if (cm_da_check(rhs)) {
        rndim = ((cm_da *)rhs)->ndim;
        rshape = ((cm_da *)rhs)->shape;
        rst = ((cm_da *)rhs)->strides;
    }
    else {
        rndim = PyArray_NDIM((PyArrayObject *)rhs);
        rshape = PyArray_SHAPE((PyArrayObject *)rhs);
        rst = PyArray_STRIDES((PyArrayObject *)rhs);
    }
    if (rndim > lhs->ndim) {
        PyErr_Format(PyExc_ValueError, "Can't assign %d-D array to %d-D self",
                     rndim, lhs->ndim);
        return -1;
    }
    pad = lhs->ndim - rndim;
    for (i = 0; i < lhs->ndim; i++) {
        Py_ssize_t r = i < pad ? 1 : rshape[i - pad];

        if (r != 1 && r != lhs->shape[i]) {
            PyErr_Format(PyExc_ValueError,
                         "Can't copy sequence with size %zd to array axis "
                         "%d with dimension %zd", r, i, lhs->shape[i]);
            return -1;
        }
        rstrides[i] = (r == 1) ? 0 : rst[i - pad];
    }
    return pad;
}

/* cm_assign's step: the strides of host, the host copy of the right-hand
 * side, where rstrides[] does not broadcast. */
static void
cm_assign_restride(PyArrayObject *host, int pad, int ndim,
                   Py_ssize_t *rstrides)
{
    const Py_ssize_t *rst = PyArray_STRIDES(host);
    int i;

    for (i = pad; i < ndim; i++) {
        if (rstrides[i] != 0) {
            rstrides[i] = rst[i - pad];
        }
    }
}

/* cm_assign's step: whether the device array d is another device's that
 * the current context cannot map (the assignment then goes via the host);
 * where it can, peer access is enabled and h waits for d's context's
 * default stream.  1, 0, or -1 with an exception. */
static int
cm_assign_is_far(cm_da *d, CUstream h)
{
    int far = 0;
    cm_context *cur;

    if (d->ctx != NULL) {
        cur = cm_context_current();
        if (cur == NULL) {
            return -1;
        }
        if (cur != d->ctx) {
            far = cm_context_can_access_peer(cur, d->ctx->device->id);
            if (far < 0 || (far && (cm_context_enable_peer(cur, d->ctx)
                                        < 0
                                    || cm_wait_other_default(d->ctx, h)
                                           < 0))) {
                return -1;
            }
            far = !far;
        }
    }
    return far;
}

/* cm_assign's step for a device array d (*rhs) another device's context
 * cannot map: *rhs replaced by its host copy, made in d's context, then
 * assigned synchronously (after the work queued on h).  0 or -1. */
static int
cm_assign_via_host(const cm_view *lhs, PyArray_Descr *dtype,
                   PyObject **rhs, CUstream h, int async)
{
    cm_da *d = (cm_da *)*rhs;
    PyArrayObject *host;
    CUcontext prev;
    cm_view rv;

    cm_da_view(d, &rv);
    if (cm_context_enter(d->ctx, &prev) < 0) {
        return -1;
    }
    host = cm_view_to_host(&rv, d->dtype, NULL, 0);
    cm_context_leave(d->ctx, prev);
    if (host == NULL) {
        return -1;
    }
    Py_SETREF(*rhs, (PyObject *)host);
    /* The host copy is gone when this returns: no async copy from
     * it, but after the work already queued on h. */
    if (async && cm_stream_wait(h) < 0) {
        return -1;
    }
    return cm_assign(lhs, dtype, *rhs, h, 0);
}

/* What cm_assign_from_device returns when the assignment goes on from a
 * host copy. */
#define CM_ASSIGN_ON_HOST 1

/* cm_assign's step for a device array on the right (*rhs): via the host
 * when far, a copy when the dtypes are equal, the casting kernel for two
 * numeric dtypes; 0 or -1 when done.  Else (a cast on the host)
 * CM_ASSIGN_ON_HOST with *rhs replaced by its host copy and rstrides[]
 * its strides. */
static int
cm_assign_from_device(const cm_view *lhs, PyArray_Descr *dtype,
                      PyObject **rhs, Py_ssize_t *rstrides, int pad,
                      CUstream h, int async)
{
    cm_da *d = (cm_da *)*rhs;
    PyArrayObject *host;
    cm_view rv;
    int eq = cm_da_alive(d) < 0
             ? -1 : PyObject_RichCompareBool((PyObject *)d->dtype,
                                             (PyObject *)dtype, Py_EQ);
    /* another device's array that this one cannot map: via the host */
    int far;

    if (eq < 0) {
        return -1;
    }
    far = cm_assign_is_far(d, h);
    if (far < 0) {
        return -1;
    }
    if (far) {
        return cm_assign_via_host(lhs, dtype, rhs, h, async);
    }
    if (eq) {
        cm_da_view(d, &rv);
        rv.ndim = lhs->ndim;
        rv.shape = lhs->shape;
        rv.strides = rstrides;
        return cm_copy(lhs, &rv, h, async);
    }
    /* Another numeric dtype: the kernel casts on the device. */
    if (cm_elem_type_of(d->dtype) != CM_T_BYTES
        && cm_elem_type_of(dtype) != CM_T_BYTES
        && lhs->ndim <= CM_KMAXDIM) {
        return cm_assign_by_kernel(lhs, cm_elem_type_of(dtype),
                                   (CUdeviceptr)d->ptr, rstrides,
                                   cm_elem_type_of(d->dtype), h, async);
    }
    /* Anything else: cast on the host. */
    cm_da_view(d, &rv);
    host = cm_view_to_host(&rv, d->dtype, h, async);
    if (host == NULL) {
        return -1;
    }
    Py_SETREF(*rhs, (PyObject *)host);
    cm_assign_restride(host, pad, lhs->ndim, rstrides);
    return CM_ASSIGN_ON_HOST;
}

/* cm_assign's step for one host value (host, of dtype): a memset when
 * all its bytes agree and lhs is one contiguous run.  1 with *rc the
 * result when it did, else 0. */
static int
cm_assign_memset(const cm_view *lhs, PyArrayObject *host, CUstream h,
                 int async, int *rc)
{
    const unsigned char *b = PyArray_DATA(host);
    Py_ssize_t lo;
    Py_ssize_t span = cm_layout_span(lhs->ndim, lhs->shape,
                                     lhs->strides, lhs->itemsize, &lo);
    int c;
    int f;
    int same = 1;
    int i;

    for (i = 1; i < lhs->itemsize; i++) {
        same &= b[i] == b[0];
    }
    cm_layout_flags(lhs->ndim, lhs->shape, lhs->strides, lhs->itemsize,
                    &c, &f);
    if (same && (c || f)) {
        CUdeviceptr p = (CUdeviceptr)lhs->addr + (CUdeviceptr)lo;
        int err;

        if (async) {
            *rc = CM_CU(MemsetD8Async, (p, b[0], (size_t)span, h));
        }
        else {
            CM_CU_NOGIL(err, MemsetD8, (p, b[0], (size_t)span));
            *rc = err;
        }
        return 1;
    }
    return 0;
}

/* cm_assign's step for a host value (host, of dtype, C-contiguous; size
 * the elements of lhs): a broadcast by the kernel, or a copy, from a
 * page-locked copy of the value when async.  0 or -1. */
static int
cm_assign_from_host(const cm_view *lhs, PyArrayObject *host,
                    const Py_ssize_t *rstrides, Py_ssize_t size, CUstream h,
                    int async)
{
    cm_view rv;
    int rc;

    if (PyArray_SIZE(host) < size && lhs->ndim <= CM_KMAXDIM) {
        /* Broadcast: upload the value once, then the kernel spreads it. */
        return cm_assign_broadcast(lhs, host, rstrides, h, async);
    }
    cm_nd_view(host, &rv);
    rv.ndim = lhs->ndim;
    rv.shape = lhs->shape;
    rv.strides = rstrides;
    if (async) {
        /* From a page-locked copy of the value, whose reuse waits for
         * the stream: no wait here. */
        cm_context *ctx = cm_context_current();
        int slot = ctx == NULL ? -1
                   : cm_hostval_take(ctx, PyArray_DATA(host),
                                     (size_t)PyArray_NBYTES(host));

        if (ctx == NULL) {
            return -1;
        }
        if (slot >= 0) {
            rv.addr = (uintptr_t)cm_hv[slot].buf;
            rc = cm_copy(lhs, &rv, h, async);
            if (cm_hostval_queued(ctx, slot, h) < 0) {
                rc = -1;
            }
            return rc;
        }
    }
    rc = cm_copy(lhs, &rv, h, async);
    /* The host side may be a temporary: let the copy land first. */
    if (rc == 0 && async) {
        rc = cm_stream_wait(h);
    }
    return rc;
}

static int
cm_assign(const cm_view *lhs, PyArray_Descr *dtype, PyObject *value,
          CUstream h, int async)
{
    Py_ssize_t rstrides[NPY_MAXDIMS];
    PyObject *rhs;
    PyArrayObject *host;
    Py_ssize_t size = 1;
    int pad;
    int i;
    int rc = -1;

    for (i = 0; i < lhs->ndim; i++) {
        size *= lhs->shape[i];
    }
    rhs = cm_assign_rhs(dtype, value);
    if (rhs == NULL) {
        return -1;
    }
    pad = cm_assign_broadcast_strides(lhs, rhs, rstrides);
    if (pad < 0) {
        goto out_rhs;
    }
    if (size == 0) {
        rc = 0;
        goto out_rhs;
    }
    if (cm_da_check(rhs)) {
        rc = cm_assign_from_device(lhs, dtype, &rhs, rstrides, pad, h,
                                   async);
        if (rc != CM_ASSIGN_ON_HOST) {
            goto out_rhs;
        }
        rc = -1;
    }
    Py_INCREF(dtype);
    /* Steals the dtype reference. */
    host = (PyArrayObject *)PyArray_FromArray(
        (PyArrayObject *)rhs, dtype,
        NPY_ARRAY_FORCECAST | NPY_ARRAY_C_CONTIGUOUS);
    if (host == NULL) {
        goto out_rhs;
    }
    cm_assign_restride(host, pad, lhs->ndim, rstrides);
    if (PyArray_SIZE(host) != 1
        || !cm_assign_memset(lhs, host, h, async, &rc)) {
        rc = cm_assign_from_host(lhs, host, rstrides, size, h, async);
    }
    Py_DECREF(host);
out_rhs:
    Py_DECREF(rhs);
    return rc;
}

static int
cm_da_setitem_impl_run(cm_da *self, PyObject *key, PyObject *value,
                       PyObject *stream)
{
    Py_ssize_t shape[NPY_MAXDIMS];
    Py_ssize_t strides[NPY_MAXDIMS];
    Py_ssize_t offset;
    cm_view lhs;
    PyObject *sobj = NULL;
    CUstream h;
    int ndim;
    int all_int;
    int async;
    int adv;

    async = cm_effective_stream_obj(stream, self->stream, &h, &sobj);
    if (async < 0) {
        return -1;
    }
    adv = cm_layout_index(self->ndim, self->shape, self->strides, key,
                          &ndim, shape, strides, &offset, &all_int);
    if (adv < 0) {
        return -1;
    }
    if (adv) {
        /* Index arrays: scattered on the device. */
        PyObject *r;

        if (CM_REGISTERED(index_setitem) == NULL || cm_da_alive(self) < 0) {
            return -1;
        }
        r = PyObject_CallFunctionObjArgs(cm_st->index_setitem,
                                         (PyObject *)self, key, value,
                                         stream != NULL ? stream : Py_None,
                                         NULL);
        Py_XDECREF(r);
        return r == NULL ? -1 : 0;
    }
    if (cm_da_activate(self) < 0) {
        return -1;
    }
    lhs.addr = (uintptr_t)self->ptr + (uintptr_t)offset;
    lhs.ndim = ndim;
    lhs.shape = shape;
    lhs.strides = strides;
    lhs.itemsize = PyDataType_ELSIZE(self->dtype);
    lhs.device = 1;
    if (cm_assign(&lhs, self->dtype, value, h, async) < 0) {
        return -1;
    }
    if (async && (cm_da_used_on(self, async, h, sobj) < 0
                  || (cm_da_check(value)
                      && cm_da_used_on((cm_da *)value, async, h, sobj)
                         < 0))) {
        return -1;
    }
    /* No stream at all: synchronous, as one default-stream sync. */
    return async ? 0 : cm_stream_wait(NULL);
}

/* cm_da_setitem_impl_run with the array's context current. */
int
cm_da_setitem_impl(cm_da *self, PyObject *key, PyObject *value,
                   PyObject *stream)
{
    int r;

    CM_ENTERED(cm_da_enter, cm_da_leave, self, r, -1,
               cm_da_setitem_impl_run(self, key, value, stream));
    return r;
}

int
cm_da_ass_subscript(PyObject *self, PyObject *key, PyObject *value)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_TypeError,
                        "device array elements cannot be deleted");
        return -1;
    }
    return cm_da_setitem_impl((cm_da *)self, key, value, NULL);
}

Py_ssize_t
cm_da_length(PyObject *self)
{
    cm_da *a = (cm_da *)self;

    if (a->ndim == 0) {
        PyErr_SetString(PyExc_IndexError, "tuple index out of range");
        return -1;
    }
    return a->shape[0];
}
