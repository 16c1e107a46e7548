/* SPDX-License-Identifier: MIT */
/*
 * array/copy.c: the copy engine: joins the two sides of a copy into one
 * layout and issues the fewest driver copies (1-D, 2-D or 3-D pieces), the
 * internal kernel, or host packing for a strided host side.
 *
 * Locks and the GIL: no lock of its own (cm_host_pageable takes the host
 * registry's lock inside cm_hostmem_registered, alone and around no
 * driver call).  Called with the GIL; this file decides where a copy's
 * driver calls run without it: the direct route (cm_copy_direct) and
 * cm_copy_pageable drop it (CM_DRIVER_BEGIN_NOGIL) around the pieces,
 * touching only the joint layout and plan (C locals) and the copy's
 * bytes, and cm_stream_wait drops it (CM_CU_NOGIL).  The keep-GIL route
 * (cm_copy_keeps_gil: page-locked memory while cm_keep_gil_now, a short
 * host-to-device copy while cm_keep_gil_auto_now) enqueues with it kept
 * (CM_CU_RAW still yields it while Python callbacks are in flight).  A
 * direct asynchronous copy into host memory the caller could not place
 * writes the thread-local hint cm_done_hint (its stream).  The staging
 * pipeline and the internal kernel handle the GIL themselves.
 */
#include "array/devicearray.h"

#include <numpy/arrayscalars.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>


/* How a joint layout is issued: an inner run of width bytes, up to two
 * pitched dimensions (y, z) and a loop over the remaining ones. */
typedef struct {
    Py_ssize_t width;
    int has_y;
    int has_z;
    int y;                     /* joint dimension of the pitched rows */
    int z;                     /* joint dimension of the pitched slices */
    int nloop;                 /* loop dimensions are joint dims 0..nloop-1 */
    Py_ssize_t pieces;         /* product of the loop dimensions */
} cm_plan;

/* cm_joint_build's step: the extents of v that are not 1, and their
 * strides, into shape[] and strides[]; their count.  Multiplies *count by
 * every extent of v when count is not NULL. */
static inline int
cm_joint_squeeze(const cm_view *v, Py_ssize_t *shape, Py_ssize_t *strides,
                 Py_ssize_t *count)
{
    int n = 0;
    int i;

    for (i = 0; i < v->ndim; i++) {
        if (v->shape[i] != 1) {
            shape[n] = v->shape[i];
            strides[n++] = v->strides[i];
        }
        if (count != NULL) {
            *count *= v->shape[i];
        }
    }
    return n;
}

/* cm_joint_build's step: the n squeezed dimensions into j, but for those
 * where both sides stay put (zero strides).  0, or -1 with ValueError
 * where only the destination stays put. */
static inline int
cm_joint_moving(cm_joint *j, int n, const Py_ssize_t *shape,
                const Py_ssize_t *dst_strides, const Py_ssize_t *src_strides)
{
    int i;

    for (i = 0; i < n; i++) {
        if (dst_strides[i] == 0 && src_strides[i] == 0) {
            continue;
        }
        if (dst_strides[i] == 0) {
            PyErr_SetString(PyExc_ValueError,
                            "copy: the destination has a zero stride "
                            "(a broadcast view) where the source has not; "
                            "it cannot be written element by element");
            return -1;
        }
        j->shape[j->ndim] = shape[i];
        j->ds[j->ndim] = dst_strides[i];
        j->ss[j->ndim] = src_strides[i];
        j->ndim++;
    }
    return 0;
}

/* cm_joint_build's step: make the key side (the destination when
 * key_is_dst, else the source) ascend in memory, both sides' first
 * elements moved to the other end of each flipped dimension. */
static inline void
cm_joint_ascend(cm_joint *j, Py_ssize_t *key_strides,
                Py_ssize_t *other_strides, int key_is_dst)
{
    int i;

    for (i = 0; i < j->ndim; i++) {
        if (key_strides[i] < 0) {
            Py_ssize_t n1 = j->shape[i] - 1;

            if (key_is_dst) {
                j->dst += (uintptr_t)(n1 * key_strides[i]);
                j->src += (uintptr_t)(n1 * other_strides[i]);
            }
            else {
                j->src += (uintptr_t)(n1 * key_strides[i]);
                j->dst += (uintptr_t)(n1 * other_strides[i]);
            }
            key_strides[i] = -key_strides[i];
            other_strides[i] = -other_strides[i];
        }
    }
}

/* cm_joint_build's step: sort the dimensions outermost first by the key
 * side's stride (insertion, stable). */
static inline void
cm_joint_sort(cm_joint *j, Py_ssize_t *key_strides,
              Py_ssize_t *other_strides)
{
    int i;
    int k;

    for (i = 1; i < j->ndim; i++) {
        Py_ssize_t sh = j->shape[i];
        Py_ssize_t a = key_strides[i];
        Py_ssize_t b = other_strides[i];

        for (k = i; k > 0 && key_strides[k - 1] < a; k--) {
            j->shape[k] = j->shape[k - 1];
            key_strides[k] = key_strides[k - 1];
            other_strides[k] = other_strides[k - 1];
        }
        j->shape[k] = sh;
        key_strides[k] = a;
        other_strides[k] = b;
    }
}

/* cm_joint_build's step: merge an outer dimension into the inner one
 * where both sides continue evenly. */
static inline void
cm_joint_merge(cm_joint *j)
{
    int i;
    int k;

    for (i = j->ndim - 2; i >= 0; i--) {
        if (j->ds[i] == j->shape[i + 1] * j->ds[i + 1]
            && j->ss[i] == j->shape[i + 1] * j->ss[i + 1]) {
            j->shape[i] *= j->shape[i + 1];
            j->ds[i] = j->ds[i + 1];
            j->ss[i] = j->ss[i + 1];
            for (k = i + 1; k < j->ndim - 1; k++) {
                j->shape[k] = j->shape[k + 1];
                j->ds[k] = j->ds[k + 1];
                j->ss[k] = j->ss[k + 1];
            }
            j->ndim--;
        }
    }
}

/* The joint layout of a copy from src to dst (same shape once size-1
 * dimensions are dropped, same itemsize): the dimensions that move, the
 * key side ascending, sorted outermost first, merged where both sides
 * continue evenly.  0, or -1 with ValueError. */
static int
cm_joint_build(cm_joint *j, const cm_view *dst, const cm_view *src,
               int key_is_dst)
{
    Py_ssize_t dst_shape[NPY_MAXDIMS];
    Py_ssize_t dst_strides[NPY_MAXDIMS];
    Py_ssize_t src_shape[NPY_MAXDIMS];
    Py_ssize_t src_strides[NPY_MAXDIMS];
    Py_ssize_t *key_strides;
    Py_ssize_t *other_strides;
    int nd;
    int ns;

    j->itemsize = dst->itemsize;
    j->dst = dst->addr;
    j->src = src->addr;
    j->dst_dev = dst->device;
    j->src_dev = src->device;
    j->count = 1;
    nd = cm_joint_squeeze(dst, dst_shape, dst_strides, &j->count);
    ns = cm_joint_squeeze(src, src_shape, src_strides, NULL);
    if (nd != ns
        || memcmp(dst_shape, src_shape, nd * sizeof(Py_ssize_t)) != 0
        || dst->itemsize != src->itemsize) {
        PyErr_SetString(PyExc_ValueError,
                        "copy: the arrays differ in shape or itemsize");
        return -1;
    }
    j->ndim = 0;
    if (j->count == 0) {
        return 0;
    }
    if (cm_joint_moving(j, nd, dst_shape, dst_strides, src_strides) < 0) {
        return -1;
    }
    key_strides = key_is_dst ? j->ds : j->ss;
    other_strides = key_is_dst ? j->ss : j->ds;
    cm_joint_ascend(j, key_strides, other_strides, key_is_dst);
    cm_joint_sort(j, key_strides, other_strides);
    cm_joint_merge(j);
    return 0;
}

static void
cm_plan_make(const cm_joint *j, cm_plan *p)
{
    int n = j->ndim;
    int y;
    int z;
    int i;

    p->width = j->itemsize;
    p->has_y = 0;
    p->has_z = 0;
    p->y = -1;
    p->z = -1;
    if (n > 0 && j->ds[n - 1] == j->itemsize
        && j->ss[n - 1] == j->itemsize) {
        p->width = j->shape[n - 1] * j->itemsize;
        n--;
    }
    y = n - 1;
    if (y >= 0 && j->ds[y] >= p->width && j->ss[y] >= p->width
        && j->ds[y] < ((Py_ssize_t)1 << 31)
        && j->ss[y] < ((Py_ssize_t)1 << 31)) {
        p->has_y = 1;
        p->y = y;
        n--;
        z = n - 1;
        if (z >= 0 && j->ss[z] > 0 && j->ds[z] > 0
            && j->ds[z] % j->ds[y] == 0
            && j->ss[z] % j->ss[y] == 0
            && j->ds[z] / j->ds[y] >= j->shape[y]
            && j->ss[z] / j->ss[y] >= j->shape[y]) {
            p->has_z = 1;
            p->z = z;
            n--;
        }
    }
    p->nloop = n;
    p->pieces = 1;
    for (i = 0; i < n; i++) {
        p->pieces *= j->shape[i];
    }
}

/* Issue one piece: width bytes, or a 2-D / 3-D pitched block. */
static CUresult
cm_piece(const cm_joint *j, const cm_plan *p, uintptr_t d, uintptr_t s,
         CUstream stream, int async, const char **fn)
{
    int y = p->y;

    if (!p->has_y) {
        if (j->dst_dev && j->src_dev) {
            *fn = async ? "cuMemcpyDtoDAsync" : "cuMemcpyDtoD";
            return async ? CM_CU_RAW(MemcpyDtoDAsync, (d, s, p->width,
                                                       stream))
                         : CM_CU_RAW(MemcpyDtoD, (d, s, p->width));
        }
        if (j->dst_dev) {
            *fn = async ? "cuMemcpyHtoDAsync" : "cuMemcpyHtoD";
            return async ? CM_CU_RAW(MemcpyHtoDAsync,
                                     (d, (const void *)s, p->width, stream))
                         : CM_CU_RAW(MemcpyHtoD,
                                     (d, (const void *)s, p->width));
        }
        *fn = async ? "cuMemcpyDtoHAsync" : "cuMemcpyDtoH";
        return async ? CM_CU_RAW(MemcpyDtoHAsync,
                                 ((void *)d, s, p->width, stream))
                     : CM_CU_RAW(MemcpyDtoH, ((void *)d, s, p->width));
    }
    if (!p->has_z) {
        CUDA_MEMCPY2D c;

        memset(&c, 0, sizeof(c));
        c.srcMemoryType = j->src_dev ? CU_MEMORYTYPE_DEVICE
                                     : CU_MEMORYTYPE_HOST;
        c.srcDevice = (CUdeviceptr)s;
        c.srcHost = (const void *)s;
        c.srcPitch = (size_t)j->ss[y];
        c.dstMemoryType = j->dst_dev ? CU_MEMORYTYPE_DEVICE
                                     : CU_MEMORYTYPE_HOST;
        c.dstDevice = (CUdeviceptr)d;
        c.dstHost = (void *)d;
        c.dstPitch = (size_t)j->ds[y];
        c.WidthInBytes = (size_t)p->width;
        c.Height = (size_t)j->shape[y];
        *fn = async ? "cuMemcpy2DAsync" : "cuMemcpy2D";
        return async ? CM_CU_RAW(Memcpy2DAsync, (&c, stream))
                     : CM_CU_RAW(Memcpy2D, (&c));
    }
    else {
        CUDA_MEMCPY3D c;
        int z = p->z;

        memset(&c, 0, sizeof(c));
        c.srcMemoryType = j->src_dev ? CU_MEMORYTYPE_DEVICE
                                     : CU_MEMORYTYPE_HOST;
        c.srcDevice = (CUdeviceptr)s;
        c.srcHost = (const void *)s;
        c.srcPitch = (size_t)j->ss[y];
        c.srcHeight = (size_t)(j->ss[z] / j->ss[y]);
        c.dstMemoryType = j->dst_dev ? CU_MEMORYTYPE_DEVICE
                                     : CU_MEMORYTYPE_HOST;
        c.dstDevice = (CUdeviceptr)d;
        c.dstHost = (void *)d;
        c.dstPitch = (size_t)j->ds[y];
        c.dstHeight = (size_t)(j->ds[z] / j->ds[y]);
        c.WidthInBytes = (size_t)p->width;
        c.Height = (size_t)j->shape[y];
        c.Depth = (size_t)j->shape[z];
        *fn = async ? "cuMemcpy3DAsync" : "cuMemcpy3D";
        return async ? CM_CU_RAW(Memcpy3DAsync, (&c, stream))
                     : CM_CU_RAW(Memcpy3D, (&c));
    }
}

/* Every piece of the plan, in order.  Pure C: runs without the GIL. */
static CUresult
cm_pieces_run(const cm_joint *j, const cm_plan *p, CUstream stream,
              int async, const char **fn)
{
    Py_ssize_t idx[NPY_MAXDIMS];
    Py_ssize_t n;
    CUresult rc;
    int i;

    for (i = 0; i < p->nloop; i++) {
        idx[i] = 0;
    }
    for (n = 0; n < p->pieces; n++) {
        uintptr_t d = j->dst;
        uintptr_t s = j->src;

        for (i = 0; i < p->nloop; i++) {
            d += (uintptr_t)(idx[i] * j->ds[i]);
            s += (uintptr_t)(idx[i] * j->ss[i]);
        }
        rc = cm_piece(j, p, d, s, stream, async, fn);
        if (rc != CUDA_SUCCESS) {
            return rc;
        }
        for (i = p->nloop - 1; i >= 0; i--) {
            if (++idx[i] < j->shape[i]) {
                break;
            }
            idx[i] = 0;
        }
    }
    return CUDA_SUCCESS;
}

/* Host to host, any layouts (the joint layout of two host views). */
static void
cm_host_copy(const cm_joint *j)
{
    Py_ssize_t idx[NPY_MAXDIMS];
    Py_ssize_t width = j->itemsize;
    Py_ssize_t inner = 1;
    Py_ssize_t total;
    Py_ssize_t n;
    Py_ssize_t e;
    int nl = j->ndim;
    int i;

    if (nl > 0 && j->ds[nl - 1] == j->itemsize
        && j->ss[nl - 1] == j->itemsize) {
        width = j->shape[nl - 1] * j->itemsize;
        nl--;
    }
    else if (nl > 0) {
        inner = j->shape[nl - 1];
        nl--;
    }
    total = 1;
    for (i = 0; i < nl; i++) {
        total *= j->shape[i];
    }
    for (i = 0; i < nl; i++) {
        idx[i] = 0;
    }
    for (n = 0; n < total; n++) {
        char *d = (char *)j->dst;
        const char *s = (const char *)j->src;

        for (i = 0; i < nl; i++) {
            d += idx[i] * j->ds[i];
            s += idx[i] * j->ss[i];
        }
        if (inner == 1) {
            memcpy(d, s, (size_t)width);
        }
        else {
            for (e = 0; e < inner; e++) {
                memcpy(d + e * j->ds[nl], s + e * j->ss[nl],
                       (size_t)width);
            }
        }
        for (i = nl - 1; i >= 0; i--) {
            if (++idx[i] < j->shape[i]) {
                break;
            }
            idx[i] = 0;
        }
    }
}

/* Wait for stream (GIL released); 0 or -1. */
int
cm_stream_wait(CUstream stream)
{
    int err;

    CM_CU_NOGIL(err, StreamSynchronize, (stream));
    return err;
}

static int cm_copy_impl(const cm_view *dst, const cm_view *src,
                        CUstream stream, int async, int may_stage,
                        int host);

/* Copy through a compact host buffer laid out like key (a view of the
 * same shape as dst and src): first src into the buffer, then the buffer
 * into dst.  The device side of each step is issued as it is. */
static int
cm_copy_staged(const cm_view *dst, const cm_view *src, const cm_view *key,
               CUstream stream, int async)
{
    Py_ssize_t tstrides[NPY_MAXDIMS];
    Py_ssize_t first;
    Py_ssize_t bytes;
    cm_view tmp;
    char *buf;
    int rc = -1;

    bytes = cm_layout_compact_like(key->ndim, key->shape, key->strides,
                                   key->itemsize, tstrides, &first);
    buf = PyMem_RawMalloc(bytes > 0 ? (size_t)bytes : 1);
    if (buf == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    tmp.addr = (uintptr_t)(buf + first);
    tmp.ndim = key->ndim;
    tmp.shape = key->shape;
    tmp.strides = tstrides;
    tmp.itemsize = key->itemsize;
    tmp.device = 0;
    if (cm_copy_impl(&tmp, src, stream, async, 0, CM_HOST_OTHER) < 0) {
        goto out_free_buf;
    }
    if (async && src->device && cm_stream_wait(stream) < 0) {
        goto out_free_buf;
    }
    /* A device-to-device copy staged in src's order may need the host
     * buffer reordered for dst: one more (host-only) staging. */
    if (cm_copy_impl(dst, &tmp, stream, async,
                     src->device && dst->device, CM_HOST_OTHER) < 0) {
        goto out_free_buf;
    }
    if (async && dst->device && cm_stream_wait(stream) < 0) {
        goto out_free_buf;
    }
    rc = 0;
out_free_buf:
    PyMem_RawFree(buf);
    return rc;
}

/* The raw element type that moves itemsize bytes unchanged. */
int
cm_raw_type(Py_ssize_t itemsize)
{
    switch (itemsize) {
    case 1: return CM_T_U8;
    case 2: return CM_T_U16;
    case 4: return CM_T_U32;
    case 8: return CM_T_U64;
    default: return CM_T_BYTES;
    }
}

/* A device-to-device copy (with a cast when the types differ) by the
 * internal kernel, over a joint layout; waits for it unless async. */
static int
cm_copy_by_kernel(const cm_joint *j, int dst_type, int src_type,
                  CUstream stream, int async)
{
    cm_copy_desc d;
    cm_context *ctx = cm_context_current();
    int i;

    if (ctx == NULL) {
        return -1;
    }
    d.ndim = j->ndim;
    for (i = 0; i < j->ndim; i++) {
        d.shape[i] = j->shape[i];
        d.dst_strides[i] = j->ds[i];
        d.src_strides[i] = j->ss[i];
    }
    d.dst = (CUdeviceptr)j->dst;
    d.src = (CUdeviceptr)j->src;
    d.dst_type = dst_type;
    d.src_type = src_type;
    d.itemsize = (int)j->itemsize;
    if (cm_copy_kernel(ctx, &d, stream) < 0) {
        return -1;
    }
    return async ? 0 : cm_stream_wait(stream);
}

/* Hand a copy between host and device memory to the staging pipeline
 * (staging.c); 1 when it took it, 0 when not, -1 on error.  host: the
 * CM_HOST_* of the copy; only with CM_HOST_UNKNOWN (plain device memory
 * of cudamem's managers) may a copy to the device return before its
 * last chunks land, as the asynchronous call of cm_copy_pageable does. */
static int
cm_copy_try_staging(const cm_joint *j, CUstream stream, int async, int host)
{
    cm_xfer x;

    x.htod = j->dst_dev;
    x.ndim = j->ndim;
    x.shape = j->shape;
    x.hstrides = j->dst_dev ? j->ss : j->ds;
    x.dstrides = j->dst_dev ? j->ds : j->ss;
    x.host = j->dst_dev ? j->src : j->dst;
    x.dev = (CUdeviceptr)(j->dst_dev ? j->dst : j->src);
    x.itemsize = j->itemsize;
    x.early = host == CM_HOST_UNKNOWN;
    return cm_staging_copy(&x, stream, async);
}

/* Whether host memory [p, p + n) is pageable: no part of it registered
 * by cudamem (pinned(), mapped()), and its first and last bytes unknown
 * to the driver (cuPointerGetAttribute fails with
 * CUDA_ERROR_INVALID_VALUE for memory that is not page-locked, mapped,
 * managed or device memory).  Any other answer, an error included, is
 * "not known pageable".  The GIL released. */
static int
cm_host_pageable(uintptr_t p, size_t n)
{
    unsigned int type;     /* a CUmemorytype */
    uintptr_t last = p + n - 1;

    if (cm_hostmem_registered(p, p + n)) {
        return 0;
    }
    if (CM_CU_RAW(PointerGetAttribute,
                  (&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)p))
        != CUDA_ERROR_INVALID_VALUE) {
        return 0;
    }
    /* A registration covers whole pages: within one page, one answer. */
    if ((p >> 12) != (last >> 12)
        && CM_CU_RAW(PointerGetAttribute,
                     (&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                      (CUdeviceptr)last)) != CUDA_ERROR_INVALID_VALUE) {
        return 0;
    }
    return 1;
}

/* A synchronous copy of one piece between host memory the caller could
 * not place (CM_HOST_UNKNOWN) and plain device memory, made as mode
 * (CM_SYNC_ASYNC or CM_SYNC_ASYNC_WAIT) says where the host side proves
 * pageable: the ...Async call on the default stream the synchronous
 * call would use (legacy, or per-thread), which the driver returns from
 * once it has taken a pageable source or filled a pageable destination
 * (see docs/design.md, "Synchronous copies of pageable memory"); with
 * CM_SYNC_ASYNC_WAIT a copy into the host then synchronizes that
 * stream.  Elsewhere the synchronous call, as cm_copy_impl makes it. */
static int
cm_copy_pageable(const cm_joint *j, const cm_plan *p, int mode)
{
    CUstream s = cm_driver_per_thread() ? CU_STREAM_PER_THREAD
                                        : CU_STREAM_LEGACY;
    uintptr_t host = j->dst_dev ? j->src : j->dst;
    const char *fn = "cuMemcpy";
    CUresult rc;

    CM_DRIVER_BEGIN_NOGIL
    if (cm_host_pageable(host, (size_t)p->width)) {
        rc = cm_pieces_run(j, p, s, 1, &fn);
        if (rc == CUDA_SUCCESS && !j->dst_dev
            && mode == CM_SYNC_ASYNC_WAIT) {
            fn = "cuStreamSynchronize";
            rc = CM_CU_RAW(StreamSynchronize, (s));
        }
    }
    else {
        rc = cm_pieces_run(j, p, NULL, 0, &fn);
    }
    CM_DRIVER_END_NOGIL
    return cm_cu_check(rc, fn);
}

/* Whether an asynchronous copy of one piece between the host and a
 * device keeps the GIL around its driver call (host: CM_HOST_*): one
 * from or into page-locked memory while cm_keep_gil_now says so; a
 * host-to-device one of at most CM_SHORT_HTOD_BYTES, one row, from
 * memory that may be pageable (the driver takes it into its staging
 * memory and returns) while cm_keep_gil_auto_now says so. */
static int
cm_copy_keeps_gil(const cm_joint *j, const cm_plan *p, int host)
{
    if (host == CM_HOST_LOCKED) {
        return cm_keep_gil_now();
    }
    return host == CM_HOST_UNKNOWN && j->dst_dev && !p->has_y
           && (size_t)j->count * (size_t)j->itemsize <= CM_SHORT_HTOD_BYTES
           && cm_keep_gil_auto_now();
}

/* The routes of a copy (cm_copy_impl), in the order they are tried. */
enum cm_copy_route {
    CM_ROUTE_NONE,       /* no element to copy */
    CM_ROUTE_HOST,       /* host to host: memcpy (cm_host_copy) */
    CM_ROUTE_PIPELINE,   /* between the host, not cudamem's page-locked
                          * memory, and a device: offered to the staging
                          * pipeline first, which may decline */
    CM_ROUTE_KERNEL,     /* device to device in several pieces: the
                          * internal kernel */
    CM_ROUTE_STAGED,     /* several pieces otherwise: through a compact
                          * host buffer (cm_copy_staged) */
    CM_ROUTE_PAGEABLE,   /* a synchronous copy of one piece with a host
                          * side that may be pageable: cm_copy_pageable */
    CM_ROUTE_KEEP_GIL,   /* one asynchronous enqueue, the GIL kept */
    CM_ROUTE_DIRECT      /* the driver copies, the GIL released */
};

/* The route of a copy over the joint layout j of dst and src (count
 * known), with the plan of the routes past the pipeline made into *p.
 * piped: the staging pipeline declined it already (CM_ROUTE_PIPELINE is
 * not given again).  *mode: the direction's cm_sync_copy_call value, for
 * CM_ROUTE_PAGEABLE. */
static inline enum cm_copy_route
cm_copy_route_of(const cm_view *dst, const cm_view *src, const cm_joint *j,
                 cm_plan *p, int async, int may_stage, int host, int piped,
                 int *mode)
{
    if (!piped) {
        if (j->count == 0) {
            return CM_ROUTE_NONE;
        }
        if (!dst->device && !src->device) {
            return CM_ROUTE_HOST;
        }
        /* Large pageable transfers go through the staging pipeline;
         * cudamem's own page-locked memory goes direct without asking
         * (the pipeline's own check would find it page-locked, at the
         * cost of a context query, a registry lookup, a pointer query
         * and, on a stream, a capture query). */
        if (dst->device != src->device && host != CM_HOST_LOCKED) {
            return CM_ROUTE_PIPELINE;
        }
    }
    cm_plan_make(j, p);
    if (p->pieces > 1 && dst->device && src->device
        && j->ndim <= CM_KMAXDIM) {
        /* No 2-D / 3-D copy expresses it: the internal kernel does. */
        return CM_ROUTE_KERNEL;
    }
    if (p->pieces > 1 && may_stage) {
        /* Make the host side follow the device side's layout (or, past
         * the kernel's dimension limit, stage a device-to-device copy
         * through the host). */
        return CM_ROUTE_STAGED;
    }
    if (!async && host == CM_HOST_UNKNOWN && p->pieces == 1 && !p->has_y
        && dst->device != src->device
        && (size_t)p->width <= __atomic_load_n(&cm_sync_async_max,
                                               __ATOMIC_RELAXED)
        && (*mode = __atomic_load_n(
                &cm_sync_copy_call[src->device ? CM_SYNC_DTOH : CM_SYNC_HTOD],
                __ATOMIC_RELAXED)) != CM_SYNC_CALL) {
        return CM_ROUTE_PAGEABLE;
    }
    if (async && p->pieces == 1 && dst->device != src->device
        && cm_copy_keeps_gil(j, p, host)) {
        return CM_ROUTE_KEEP_GIL;
    }
    return CM_ROUTE_DIRECT;
}

/* The driver copies of the plan, the GIL released; an asynchronous copy
 * into host memory the caller could not place leaves stream in
 * cm_done_hint (the thread's hint for the next completion wait). */
static inline int
cm_copy_direct(const cm_joint *j, const cm_plan *p, CUstream stream,
               int async, int host, int dst_device)
{
    const char *fn = "cuMemcpy";
    CUresult rc;

    CM_DRIVER_BEGIN_NOGIL
    rc = cm_pieces_run(j, p, stream, async, &fn);
    CM_DRIVER_END_NOGIL
    if (host == CM_HOST_UNKNOWN && async && !dst_device) {
        cm_done_hint = stream;
    }
    return cm_cu_check(rc, fn);
}

static int
cm_copy_impl(const cm_view *dst, const cm_view *src, CUstream stream,
             int async, int may_stage, int host)
{
    cm_joint j;
    cm_plan p;
    const char *fn = "cuMemcpy";
    CUresult rc;
    int mode;
    int piped;
    int t;
    int r;
    enum cm_copy_route route;

    if (!async && (dst->device || src->device)
        && cm_capture_refuse_sync("a synchronous copy") < 0) {
        return -1;
    }
    if (cm_joint_build(&j, dst, src, dst->device || !src->device) < 0) {
        return -1;
    }
    /* Once the pipeline declines, the route past it. */
    for (piped = 0;; piped = 1) {
        route = cm_copy_route_of(dst, src, &j, &p, async, may_stage, host,
                                 piped, &mode);
        if (route != CM_ROUTE_PIPELINE) {
            break;
        }
        r = cm_copy_try_staging(&j, stream, async, host);
        if (r != 0) {
            return r < 0 ? -1 : 0;
        }
    }
    /* While cudamem captures: a small copy with cudamem's page-locked
     * memory becomes a kernel node (context/kcopy.c), which a replay runs
     * in a third of a copy node's time. */
    if ((route == CM_ROUTE_KEEP_GIL || route == CM_ROUTE_DIRECT)
        && host == CM_HOST_LOCKED && async && cm_capture_any()
        && p.pieces == 1 && !p.has_y && !p.has_z
        && cm_capture_stream_known(stream)) {
        cm_context *ctx = cm_context_current();

        r = ctx == NULL ? -1
                        : cm_kcopy_record(ctx, (CUdeviceptr)j.dst,
                                          !dst->device, (CUdeviceptr)j.src,
                                          !src->device, (size_t)p.width,
                                          stream);
        if (r != 0) {
            return r < 0 ? -1 : 0;
        }
    }
    switch (route) {
    case CM_ROUTE_NONE:
    case CM_ROUTE_PIPELINE:    /* not left the loop with */
        return 0;
    case CM_ROUTE_HOST:
        cm_host_copy(&j);
        return 0;
    case CM_ROUTE_KERNEL:
        t = cm_raw_type(j.itemsize);
        return cm_copy_by_kernel(&j, t, t, stream, async);
    case CM_ROUTE_STAGED:
        return cm_copy_staged(dst, src, src->device ? src : dst, stream,
                              async);
    case CM_ROUTE_PAGEABLE:
        return cm_copy_pageable(&j, &p, mode);
    case CM_ROUTE_KEEP_GIL:
        /* One enqueue that returns at once: the GIL kept (CM_CU_RAW
         * still gives it up while callbacks are in flight). */
        rc = cm_pieces_run(&j, &p, stream, async, &fn);
        return cm_cu_check(rc, fn);
    case CM_ROUTE_DIRECT:
        break;
    }
    return cm_copy_direct(&j, &p, stream, async, host, dst->device);
}

int
cm_copy(const cm_view *dst, const cm_view *src, CUstream stream, int async)
{
    return cm_copy_impl(dst, src, stream, async, 1, CM_HOST_OTHER);
}

int
cm_copy_host(const cm_view *dst, const cm_view *src, CUstream stream,
             int async, int host)
{
    return cm_copy_impl(dst, src, stream, async, 1, host);
}
