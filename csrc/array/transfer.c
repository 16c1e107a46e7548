/* SPDX-License-Identifier: MIT */
/*
 * array/transfer.c: copies between device arrays and the host
 * (copy_to_device, copy_to_host and their helpers).
 *
 * Locks and the GIL: no lock.  The GIL is held but around the driver
 * calls that can wait: the pinned buffer of a copy between two devices'
 * arrays is allocated and freed without it (CM_CU_NOGIL,
 * CM_DRIVER_BEGIN_NOGIL), as is a synchronous peer copy; they touch only
 * C locals.  The copies themselves go through cm_copy / cm_copy_host
 * (copy.c), which decide the GIL; cm_host_side tells cm_copy_host
 * whether the host side is cudamem's page-locked memory (CM_HOST_LOCKED).
 */
#include "array/devicearray.h"

#include <numpy/arrayscalars.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* Copies                                                              */
/* ------------------------------------------------------------------ */

/* dst <- src through a pinned host buffer laid out like src: src's
 * device fills it with its context current, then dst's empties it with
 * dst's current (the caller's).  Complete when it returns. */
int
cm_copy_via_host(cm_da *dst, cm_da *src, CUstream h, int async)
{
    Py_ssize_t tstrides[NPY_MAXDIMS];
    Py_ssize_t first;
    Py_ssize_t bytes;
    CUcontext prev;
    cm_view dv;
    cm_view sv;
    cm_view tmp;
    void *buf = NULL;
    int err;
    int rc = -1;

    cm_da_view(dst, &dv);
    cm_da_view(src, &sv);
    bytes = cm_layout_compact_like(sv.ndim, sv.shape, sv.strides,
                                   sv.itemsize, tstrides, &first);
    /* Work queued on h before the copy comes first. */
    if (async && cm_stream_wait(h) < 0) {
        return -1;
    }
    if (cm_context_enter(src->ctx, &prev) < 0) {
        return -1;
    }
    CM_CU_NOGIL(err, MemHostAlloc,
                (&buf, (size_t)bytes, CU_MEMHOSTALLOC_PORTABLE));
    if (err < 0) {
        cm_context_leave(src->ctx, prev);
        return -1;
    }
    tmp.addr = (uintptr_t)buf + (uintptr_t)first;
    tmp.ndim = sv.ndim;
    tmp.shape = sv.shape;
    tmp.strides = tstrides;
    tmp.itemsize = sv.itemsize;
    tmp.device = 0;
    err = cm_copy(&tmp, &sv, NULL, 0);
    cm_context_leave(src->ctx, prev);
    if (err < 0) {
        goto out_free_buf;
    }
    if (cm_copy(&dv, &tmp, h, async) < 0
        || (async && cm_stream_wait(h) < 0)) {
        goto out_free_buf;
    }
    rc = 0;
out_free_buf:
    CM_DRIVER_BEGIN_NOGIL
    (void)CM_CU_RAW(MemFreeHost, (buf));
    CM_DRIVER_END_NOGIL
    return rc;
}

int
cm_wait_other_default(cm_context *src, CUstream h)
{
    CUcontext prev;
    CUevent ev = NULL;
    int rc;

    if (cm_context_enter(src, &prev) < 0) {
        return -1;
    }
    rc = CM_CU(EventCreate, (&ev, CU_EVENT_DISABLE_TIMING));
    if (rc == 0) {
        rc = CM_CU(EventRecord, (ev, NULL));
    }
    cm_context_leave(src, prev);
    if (rc == 0) {
        rc = CM_CU(StreamWaitEvent, (h, ev, 0));
    }
    if (ev != NULL) {
        /* The driver keeps it until the wait is over. */
        (void)CM_CU_RAW(EventDestroy, (ev));
    }
    return rc;
}

/* dst <- src, arrays of two devices, dst's context current: a peer copy
 * (peer access enabled on first need) when the devices have peer access,
 * else staged through pinned host memory. */
static int
cm_copy_across(cm_da *dst, cm_da *src, CUstream h, int async)
{
    size_t n;
    int can;
    int err;
    cm_view dv;
    cm_view sv;

    if (!src->ctx->alive) {
        return cm_context_activate(src->ctx);  /* raises */
    }
    can = cm_context_can_access_peer(dst->ctx, src->ctx->device->id);
    if (can < 0) {
        return -1;
    }
    if (!can) {
        return cm_copy_via_host(dst, src, h, async);
    }
    if (cm_context_enable_peer(dst->ctx, src->ctx) < 0
        || cm_wait_other_default(src->ctx, h) < 0) {
        return -1;
    }
    if ((dst->c_contig && src->c_contig)
        || (dst->f_contig && src->f_contig)) {
        /* One block of bytes on each side, in the same order. */
        n = (size_t)dst->size * (size_t)PyDataType_ELSIZE(dst->dtype);
        if (async) {
            return CM_CU(MemcpyPeerAsync,
                         (dst->ptr, dst->ctx->handle, src->ptr,
                          src->ctx->handle, n, h));
        }
        CM_CU_NOGIL(err, MemcpyPeer,
                    (dst->ptr, dst->ctx->handle, src->ptr,
                     src->ctx->handle, n));
        return err;
    }
    /* Other layouts: dst's device reads src's memory through the peer
     * mapping (2-D / 3-D copies or the internal kernel). */
    cm_da_view(dst, &dv);
    cm_da_view(src, &sv);
    return cm_copy(&dv, &sv, h, async);
}

/* self <- ary (host array, cudamem array or CAI object). */
/* The CM_HOST_* of a copy between the host array arr and the device
 * array d (cm_copy_host): cudamem's page-locked memory of d's context,
 * else unknown where d's memory is plain device memory from one of
 * cudamem's own managers (a copy into managed or mapped memory, or
 * memory of a plugin or another library, keeps the synchronous call). */
static int
cm_host_side(PyObject *arr, cm_da *d)
{
    if (cm_hostmem_page_locked(arr, d->ctx)) {
        return CM_HOST_LOCKED;
    }
    if (d->gpu_data != NULL && Py_IS_TYPE(d->gpu_data, ST->Mem_type)
        && ((cm_mem *)d->gpu_data)->mm != NULL
        && ((cm_mem *)d->gpu_data)->mm->kind != CM_MM_PLUGIN) {
        return CM_HOST_UNKNOWN;
    }
    return CM_HOST_OTHER;
}

/* Whether cm_stream_resolve of o runs no Python code (a cudamem Stream,
 * None, False, an int; NULL: no argument), so that a context made
 * current before it is still current after it. */
static int
cm_stream_plain(PyObject *o)
{
    return o == NULL || o == Py_None || o == Py_False || cm_stream_check(o)
           || PyLong_CheckExact(o);
}

/* A copy's uses noted (cm_da_used_on) on dst and src (NULL: host
 * memory), rc the copy's result, which is returned: -1 where a note
 * failed.  A failed copy's uses are noted too (a part of it may have
 * been queued), its exception kept. */
static int
cm_da_copy_noted(cm_da *dst, cm_da *src, int early, CUstream h,
                 PyObject *sobj, int rc)
{
    PyObject *et = NULL;
    PyObject *ev = NULL;
    PyObject *tb = NULL;
    int failed = rc < 0;

    if (failed) {
        PyErr_Fetch(&et, &ev, &tb);
    }
    if (cm_da_used_on(dst, early, h, sobj) < 0
        || (src != NULL && cm_da_used_on(src, early, h, sobj) < 0)) {
        if (failed) {
            PyErr_Clear();
        }
        rc = -1;
    }
    if (failed) {
        PyErr_Restore(et, ev, tb);
    }
    return rc;
}

static int
cm_da_copy_from_run(cm_da *self, PyObject *ary, PyObject *stream)
{
    cm_view dv;
    cm_view sv;
    PyObject *src;
    PyObject *sobj = NULL;
    CUstream h;
    int async;
    int src_da;
    int host;
    int early;
    int rc = -1;
    /* Whether Python code may run before the copy (a stream's
     * __cuda_stream__, a source's __cuda_array_interface__ or
     * __array__), which could leave another context current. */
    int reenter = !cm_stream_plain(stream) || !cm_stream_plain(self->stream)
                  || !(PyArray_Check(ary) || cm_da_check(ary));

    async = cm_effective_stream_obj(stream, self->stream, &h, &sobj);
    if (async < 0) {
        return -1;
    }
    src = (PyObject *)cm_as_device_source(ary);
    /* A device array (cudamem's, or one made from a CUDA Array Interface
     * source), else a NumPy array below. */
    src_da = src != NULL;
    if (src == NULL) {
        if (PyErr_Occurred()) {
            return -1;
        }
        if (PyArray_Check(ary)) {
            /* What PyArray_FromAny gives an array with no dtype or flags
             * asked for (itself, subclass kept), without its dtype and
             * shape discovery: a few hundred instructions a copy. */
            Py_INCREF(ary);
            src = ary;
        }
        else if ((src = PyArray_FromAny(ary, NULL, 0, 0, 0, NULL)) == NULL) {
            return -1;
        }
        cm_nd_view((PyArrayObject *)src, &sv);
        if (PyArray_SIZE((PyArrayObject *)src) == 0) {
            rc = 0;
            goto out_src;
        }
        if (cm_check_compatible(self->dtype, self->ndim, self->shape,
                                PyArray_DESCR((PyArrayObject *)src),
                                sv.ndim, sv.shape, "the source") < 0) {
            goto out_src;
        }
    }
    else {
        cm_da *s = (cm_da *)src;

        if (s->size == 0) {
            rc = 0;
            goto out_src;
        }
        if (cm_check_compatible(self->dtype, self->ndim, self->shape,
                                s->dtype, s->ndim, s->shape,
                                "the source") < 0) {
            goto out_src;
        }
        if (s->ctx != NULL && self->ctx != NULL && s->ctx != self->ctx) {
            rc = cm_copy_across(self, s, h, async);
            /* Device to device: even a synchronous copy may return
             * before it has run (below). */
            rc = cm_da_copy_noted(self, s, 1, h, sobj, rc);
            goto out_src;
        }
        cm_da_view(s, &sv);
    }
    /* cm_da_copy_from made self's context current; again only where
     * Python code ran since. */
    if (reenter && cm_da_activate(self) < 0) {
        goto out_src;
    }
    cm_da_view(self, &dv);
    host = src_da ? CM_HOST_OTHER : cm_host_side(src, self);
    rc = cm_copy_host(&dv, &sv, h, async, host);
    /* A capture's graph keeps the host memory it copies from. */
    if (rc == 0 && async && !src_da && cm_capture_keep(h, src) < 0) {
        rc = -1;
    }
    /* A synchronous copy may return before its bytes land, its work
     * left on the default stream (h): from memory that may be pageable
     * (the staging pipeline's last chunks, the driver's own staging) and
     * device to device (the driver's copy).  The memory's release waits
     * for that stream as for asynchronous work: a pool block allocated
     * for another stream and freed at once is not handed out there
     * before the copy has run.  Nothing to note where the memory was
     * allocated for the default stream (cm_mem_note_use). */
    early = async || src_da || host == CM_HOST_UNKNOWN;
    rc = cm_da_copy_noted(self, src_da ? (cm_da *)src : NULL, early, h,
                          sobj, rc);
out_src:
    Py_DECREF(src);
    return rc;
}

/* cm_da_copy_from_run with the array's context current. */
int
cm_da_copy_from(cm_da *self, PyObject *ary, PyObject *stream)
{
    int r;

    CM_ENTERED(cm_da_enter, cm_da_leave, self, r, -1,
               cm_da_copy_from_run(self, ary, stream));
    return r;
}

/* A new host array holding a copy of self (copy_to_host() without a
 * destination). */
static PyObject *
cm_da_to_new_host(cm_da *self, CUstream h, int async)
{
    PyArrayObject *res;
    PyArrayObject *buf;
    cm_view dv;
    cm_view sv;
    Py_ssize_t one = 1;
    int i;
    int negative = 0;

    for (i = 0; i < self->ndim; i++) {
        negative |= self->strides[i] < 0;
    }
    if (self->size == 0 || negative) {
        Py_INCREF(self->dtype);
        res = (PyArrayObject *)PyArray_NewFromDescr(
            &PyArray_Type, self->dtype, self->ndim, self->shape, NULL, NULL,
            0, NULL);
        if (res == NULL) {
            return NULL;
        }
        if (self->size > 0) {
            cm_nd_view(res, &dv);
            cm_da_view(self, &sv);
            if (cm_copy(&dv, &sv, h, async) < 0
                || (async && cm_capture_keep(h, (PyObject *)res) < 0)) {
                Py_DECREF(res);
                return NULL;
            }
        }
        return (PyObject *)res;
    }
    /* Same strides as self over a byte buffer of the span, filled by one
     * copy of the span (gaps included). */
    buf = (PyArrayObject *)PyArray_SimpleNew(1, &self->alloc_size,
                                             NPY_UINT8);
    if (buf == NULL) {
        return NULL;
    }
    Py_INCREF(self->dtype);
    res = (PyArrayObject *)PyArray_NewFromDescr(
        &PyArray_Type, self->dtype, self->ndim, self->shape, self->strides,
        PyArray_DATA(buf), NPY_ARRAY_WRITEABLE, NULL);
    if (res == NULL) {
        Py_DECREF(buf);
        return NULL;
    }
    /* Steals buf even on failure. */
    if (PyArray_SetBaseObject(res, (PyObject *)buf) < 0) {
        Py_DECREF(res);
        return NULL;
    }
    PyArray_UpdateFlags(res, NPY_ARRAY_UPDATE_ALL);
    dv.addr = (uintptr_t)PyArray_DATA(res);
    dv.ndim = 1;
    dv.shape = &self->alloc_size;
    dv.strides = &one;
    dv.itemsize = 1;
    dv.device = 0;
    sv = dv;
    sv.addr = (uintptr_t)self->ptr;
    sv.device = 1;
    if (cm_copy_host(&dv, &sv, h, async,
                     cm_host_side((PyObject *)res, self)) < 0
        || (async && cm_capture_keep(h, (PyObject *)res) < 0)) {
        Py_DECREF(res);
        return NULL;
    }
    return (PyObject *)res;
}

static PyObject *
cm_da_copy_to_host_impl_run(cm_da *self, PyObject *ary, PyObject *stream)
{
    PyArrayObject *dst;
    cm_view dv;
    cm_view sv;
    PyObject *sobj = NULL;
    CUstream h;
    int async;

    async = cm_effective_stream_obj(stream, self->stream, &h, &sobj);
    /* The caller made self's context current; again only where a
     * stream's __cuda_stream__ may have changed it. */
    if (async < 0
        || ((!cm_stream_plain(stream) || !cm_stream_plain(self->stream))
            && cm_da_activate(self) < 0)
        || cm_da_used_on(self, async, h, sobj) < 0) {
        return NULL;
    }
    if (ary == NULL || ary == Py_None) {
        return cm_da_to_new_host(self, h, async);
    }
    if (self->ndim == 0 && PyArray_IsScalar(ary, Void)) {
        PyVoidScalarObject *vs = (PyVoidScalarObject *)ary;

        if (cm_check_compatible(self->dtype, 0, NULL, vs->descr, 0, NULL,
                                "the destination") < 0) {
            return NULL;
        }
        dv.addr = (uintptr_t)vs->obval;
        dv.ndim = 0;
        dv.shape = NULL;
        dv.strides = NULL;
        dv.itemsize = PyDataType_ELSIZE(self->dtype);
        dv.device = 0;
        cm_da_view(self, &sv);
        if (cm_copy(&dv, &sv, h, async) < 0
            || (async && cm_capture_keep(h, ary) < 0)) {
            return NULL;
        }
        return Py_NewRef(ary);
    }
    if (!PyArray_Check(ary)) {
        PyErr_Format(PyExc_TypeError,
                     "copy_to_host: ary must be a numpy.ndarray, not %.100s",
                     Py_TYPE(ary)->tp_name);
        return NULL;
    }
    dst = (PyArrayObject *)ary;
    if (cm_check_compatible(self->dtype, self->ndim, self->shape,
                            PyArray_DESCR(dst), PyArray_NDIM(dst),
                            PyArray_SHAPE(dst), "the destination") < 0) {
        return NULL;
    }
    if (self->size == 0) {
        return Py_NewRef(ary);
    }
    if (!PyArray_ISWRITEABLE(dst)) {
        PyErr_SetString(PyExc_ValueError,
                        "copy_to_host: the destination array is read-only");
        return NULL;
    }
    cm_nd_view(dst, &dv);
    cm_da_view(self, &sv);
    if (cm_copy_host(&dv, &sv, h, async, cm_host_side(ary, self)) < 0
        || (async && cm_capture_keep(h, ary) < 0)) {
        return NULL;
    }
    return Py_NewRef(ary);
}

/* cm_da_copy_to_host_impl_run with the array's context current. */
PyObject *
cm_da_copy_to_host_impl(cm_da *self, PyObject *ary, PyObject *stream)
{
    PyObject *r;

    CM_ENTERED(cm_da_enter, cm_da_leave, self, r, NULL,
               cm_da_copy_to_host_impl_run(self, ary, stream));
    return r;
}

/* A new C-contiguous host copy of a device view with dtype; waits for an
 * async copy to land. */
PyArrayObject *
cm_view_to_host(const cm_view *v, PyArray_Descr *dtype, CUstream h,
                int async)
{
    PyArrayObject *res;
    cm_view dv;

    Py_INCREF(dtype);
    res = (PyArrayObject *)PyArray_NewFromDescr(
        &PyArray_Type, dtype, v->ndim, (npy_intp *)v->shape, NULL, NULL, 0,
        NULL);
    if (res == NULL) {
        return NULL;
    }
    cm_nd_view(res, &dv);
    if (cm_copy(&dv, v, h, async) < 0
        || (async && cm_stream_wait(h) < 0)) {
        Py_DECREF(res);
        return NULL;
    }
    return res;
}
