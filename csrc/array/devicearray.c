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
 * Locking: none of its own; the GIL is held except around driver calls
 * that can wait, which touch only C locals.
 */
#include "array/array.h"

#include <numpy/arrayscalars.h>

#include <stdlib.h>
#include <string.h>

#include <sys/mman.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* Layout math                                                         */
/* ------------------------------------------------------------------ */

void
cm_layout_flags(int ndim, const Py_ssize_t *shape,
                const Py_ssize_t *strides, Py_ssize_t itemsize,
                int *c_contig, int *f_contig)
{
    Py_ssize_t sd;
    int i;
    int c = 1;
    int f = 1;

    for (i = 0; i < ndim; i++) {
        if (shape[i] == 0) {
            *c_contig = 1;
            *f_contig = 1;
            return;
        }
    }
    sd = itemsize;
    for (i = ndim - 1; i >= 0; i--) {
        if (shape[i] != 1) {
            if (strides[i] != sd) {
                c = 0;
            }
            sd *= shape[i];
        }
    }
    sd = itemsize;
    for (i = 0; i < ndim; i++) {
        if (shape[i] != 1) {
            if (strides[i] != sd) {
                f = 0;
            }
            sd *= shape[i];
        }
    }
    *c_contig = c;
    *f_contig = f;
}

Py_ssize_t
cm_layout_span(int ndim, const Py_ssize_t *shape, const Py_ssize_t *strides,
               Py_ssize_t itemsize, Py_ssize_t *lo)
{
    Py_ssize_t low = 0;
    Py_ssize_t high = 0;
    int i;

    *lo = 0;
    for (i = 0; i < ndim; i++) {
        if (shape[i] == 0) {
            return 0;
        }
    }
    for (i = 0; i < ndim; i++) {
        Py_ssize_t reach = (shape[i] - 1) * strides[i];

        if (reach < 0) {
            low += reach;
        }
        else {
            high += reach;
        }
    }
    *lo = low;
    return high - low + itemsize;
}

/* Whether the layout without its zero-stride dimensions (the "core") is
 * C- or F-contiguous. */
static int
cm_layout_core_contiguous(int ndim, const Py_ssize_t *shape,
                          const Py_ssize_t *strides, Py_ssize_t itemsize,
                          int *c_out, int *f_out)
{
    Py_ssize_t sh[NPY_MAXDIMS];
    Py_ssize_t st[NPY_MAXDIMS];
    int n = 0;
    int i;
    int c;
    int f;

    for (i = 0; i < ndim; i++) {
        if (strides[i] != 0 || shape[i] == 0) {
            sh[n] = shape[i];
            st[n] = strides[i];
            n++;
        }
    }
    if (n == 0) {
        c = f = 1;                       /* no core: both */
    }
    else {
        cm_layout_flags(n, sh, st, itemsize, &c, &f);
    }
    if (c_out != NULL) {
        *c_out = c;
    }
    if (f_out != NULL) {
        *f_out = f;
    }
    return c || f;
}

/* Compact strides for shape in C (fortran = 0) or F order. */
static void
cm_layout_compact(int ndim, const Py_ssize_t *shape, Py_ssize_t itemsize,
                  int fortran, Py_ssize_t *strides)
{
    Py_ssize_t sd = itemsize;
    int i;

    if (fortran) {
        for (i = 0; i < ndim; i++) {
            strides[i] = sd;
            sd *= shape[i] > 0 ? shape[i] : 1;
        }
    }
    else {
        for (i = ndim - 1; i >= 0; i--) {
            strides[i] = sd;
            sd *= shape[i] > 0 ? shape[i] : 1;
        }
    }
}

/* Dimension indices ordered by descending |stride| (stable): the
 * keep-order permutation of NumPy's empty_like. */
static void
cm_layout_order(int ndim, const Py_ssize_t *strides, int *perm)
{
    int i;
    int j;

    for (i = 0; i < ndim; i++) {
        perm[i] = i;
    }
    for (i = 1; i < ndim; i++) {
        int p = perm[i];
        Py_ssize_t a = strides[p] < 0 ? -strides[p] : strides[p];

        for (j = i; j > 0; j--) {
            Py_ssize_t b = strides[perm[j - 1]];

            b = b < 0 ? -b : b;
            if (b >= a) {
                break;
            }
            perm[j] = perm[j - 1];
        }
        perm[j] = p;
    }
}

/* Compact strides following key's dimension order and signs; zero where
 * key has a zero stride.  Returns the bytes needed and, in *first, the
 * offset of the first logical element in such a buffer. */
static Py_ssize_t
cm_layout_compact_like(int ndim, const Py_ssize_t *shape,
                       const Py_ssize_t *key, Py_ssize_t itemsize,
                       Py_ssize_t *strides, Py_ssize_t *first)
{
    int perm[NPY_MAXDIMS];
    Py_ssize_t sd = itemsize;
    int i;

    *first = 0;
    cm_layout_order(ndim, key, perm);
    for (i = ndim - 1; i >= 0; i--) {
        int d = perm[i];

        if (key[d] == 0 || shape[d] == 1) {
            strides[d] = 0;
            continue;
        }
        strides[d] = key[d] < 0 ? -sd : sd;
        if (key[d] < 0) {
            *first += (shape[d] - 1) * sd;
        }
        sd *= shape[d];
    }
    return sd;
}

/* ------------------------------------------------------------------ */
/* The copy engine                                                     */
/* ------------------------------------------------------------------ */

/* Two views walked together: dst and src strides per joint dimension,
 * with size-1 dimensions dropped, dimensions both sides broadcast
 * dropped, the key side's strides made positive, sorted outermost first
 * by the key side's stride and adjacent dimensions merged. */
typedef struct {
    int ndim;
    Py_ssize_t shape[NPY_MAXDIMS];
    Py_ssize_t ds[NPY_MAXDIMS];
    Py_ssize_t ss[NPY_MAXDIMS];
    uintptr_t dst;
    uintptr_t src;
    int dst_dev;
    int src_dev;
    Py_ssize_t itemsize;
    Py_ssize_t count;          /* elements */
} cm_joint;

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

static int
cm_joint_build(cm_joint *j, const cm_view *dst, const cm_view *src,
               int key_is_dst)
{
    Py_ssize_t dsh[NPY_MAXDIMS];
    Py_ssize_t dst_[NPY_MAXDIMS];
    Py_ssize_t ssh[NPY_MAXDIMS];
    Py_ssize_t sst[NPY_MAXDIMS];
    Py_ssize_t *ks;
    Py_ssize_t *os;
    int nd = 0;
    int ns = 0;
    int i;
    int k;

    j->itemsize = dst->itemsize;
    j->dst = dst->addr;
    j->src = src->addr;
    j->dst_dev = dst->device;
    j->src_dev = src->device;
    j->count = 1;
    for (i = 0; i < dst->ndim; i++) {
        if (dst->shape[i] != 1) {
            dsh[nd] = dst->shape[i];
            dst_[nd++] = dst->strides[i];
        }
        j->count *= dst->shape[i];
    }
    for (i = 0; i < src->ndim; i++) {
        if (src->shape[i] != 1) {
            ssh[ns] = src->shape[i];
            sst[ns++] = src->strides[i];
        }
    }
    if (nd != ns || memcmp(dsh, ssh, nd * sizeof(Py_ssize_t)) != 0
        || dst->itemsize != src->itemsize) {
        PyErr_SetString(PyExc_ValueError,
                        "copy: the arrays differ in shape or itemsize");
        return -1;
    }
    j->ndim = 0;
    if (j->count == 0) {
        return 0;
    }
    for (i = 0; i < nd; i++) {
        if (dst_[i] == 0 && sst[i] == 0) {
            continue;
        }
        if (dst_[i] == 0) {
            PyErr_SetString(PyExc_ValueError,
                            "copy: the destination has a zero stride "
                            "(a broadcast view) where the source has not; "
                            "it cannot be written element by element");
            return -1;
        }
        j->shape[j->ndim] = dsh[i];
        j->ds[j->ndim] = dst_[i];
        j->ss[j->ndim] = sst[i];
        j->ndim++;
    }
    ks = key_is_dst ? j->ds : j->ss;
    os = key_is_dst ? j->ss : j->ds;
    /* Make the key side ascend in memory. */
    for (i = 0; i < j->ndim; i++) {
        if (ks[i] < 0) {
            Py_ssize_t n1 = j->shape[i] - 1;

            if (key_is_dst) {
                j->dst += (uintptr_t)(n1 * ks[i]);
                j->src += (uintptr_t)(n1 * os[i]);
            }
            else {
                j->src += (uintptr_t)(n1 * ks[i]);
                j->dst += (uintptr_t)(n1 * os[i]);
            }
            ks[i] = -ks[i];
            os[i] = -os[i];
        }
    }
    /* Sort outermost first by the key side's stride (insertion, stable). */
    for (i = 1; i < j->ndim; i++) {
        Py_ssize_t sh = j->shape[i];
        Py_ssize_t a = ks[i];
        Py_ssize_t b = os[i];

        for (k = i; k > 0 && ks[k - 1] < a; k--) {
            j->shape[k] = j->shape[k - 1];
            ks[k] = ks[k - 1];
            os[k] = os[k - 1];
        }
        j->shape[k] = sh;
        ks[k] = a;
        os[k] = b;
    }
    /* Merge an outer dimension into the inner one where both sides
     * continue evenly. */
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

    memset(idx, 0, sizeof(idx));
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
    memset(idx, 0, sizeof(idx));
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
static int
cm_stream_wait(CUstream stream)
{
    int err;

    CM_CU_NOGIL(err, StreamSynchronize, (stream));
    return err;
}

static int cm_copy_impl(const cm_view *dst, const cm_view *src,
                        CUstream stream, int async, int may_stage);

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
    if (cm_copy_impl(&tmp, src, stream, async, 0) < 0) {
        goto out_free_buf;
    }
    if (async && src->device && cm_stream_wait(stream) < 0) {
        goto out_free_buf;
    }
    /* A device-to-device copy staged in src's order may need the host
     * buffer reordered for dst: one more (host-only) staging. */
    if (cm_copy_impl(dst, &tmp, stream, async,
                     src->device && dst->device) < 0) {
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
static int
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
 * (staging.c); 1 when it took it, 0 when not, -1 on error. */
static int
cm_copy_try_staging(const cm_joint *j, CUstream stream, int async)
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
    return cm_staging_copy(&x, stream, async);
}

static int
cm_copy_impl(const cm_view *dst, const cm_view *src, CUstream stream,
             int async, int may_stage)
{
    cm_joint j;
    cm_plan p;
    const char *fn = "cuMemcpy";
    CUresult rc;

    if (cm_joint_build(&j, dst, src, dst->device || !src->device) < 0) {
        return -1;
    }
    if (j.count == 0) {
        return 0;
    }
    if (!dst->device && !src->device) {
        cm_host_copy(&j);
        return 0;
    }
    if (dst->device != src->device) {
        /* Large pageable transfers go through the staging pipeline. */
        int r = cm_copy_try_staging(&j, stream, async);

        if (r != 0) {
            return r < 0 ? -1 : 0;
        }
    }
    cm_plan_make(&j, &p);
    if (p.pieces > 1 && dst->device && src->device
        && j.ndim <= CM_KMAXDIM) {
        /* No 2-D / 3-D copy expresses it: the internal kernel does. */
        int t = cm_raw_type(j.itemsize);

        return cm_copy_by_kernel(&j, t, t, stream, async);
    }
    if (p.pieces > 1 && may_stage) {
        /* Make the host side follow the device side's layout (or, past
         * the kernel's dimension limit, stage a device-to-device copy
         * through the host). */
        return cm_copy_staged(dst, src, src->device ? src : dst, stream,
                              async);
    }
    CM_DRIVER_BEGIN_NOGIL
    rc = cm_pieces_run(&j, &p, stream, async, &fn);
    CM_DRIVER_END_NOGIL
    return cm_cu_check(rc, fn);
}

int
cm_copy(const cm_view *dst, const cm_view *src, CUstream stream, int async)
{
    return cm_copy_impl(dst, src, stream, async, 1);
}

/* ------------------------------------------------------------------ */
/* Argument parsing                                                    */
/* ------------------------------------------------------------------ */

enum {
    K_SHAPE, K_STRIDES, K_DTYPE, K_ORDER, K_STREAM, K_GPU_DATA, K_ARY,
    K_OBJ, K_COPY, K_TO, K_SYNC, K_OWNER, K_DESC, K_AXIS, K_SECTION,
    K_ITEM, K_KEY, K_VALUE, K_AXES, K_N_NAMES
};

static const char *const cm_kw_text[K_N_NAMES] = {
    "shape", "strides", "dtype", "order", "stream", "gpu_data", "ary",
    "obj", "copy", "to", "sync", "owner", "desc", "axis", "section",
    "item", "key", "value", "axes",
};

static PyObject *cm_kw[K_N_NAMES];          /* interned keyword names */
static PyObject *cm_str_cuda_memory;        /* "__cuda_memory__" */
static PyObject *cm_str_cai;                /* "__cuda_array_interface__" */
static PyObject *cm_str_sync_cfg;           /* "CUDA_ARRAY_INTERFACE_SYNC" */
static PyObject *cm_api_split;              /* cudamem._api._split */
static PyObject *cm_zero;                   /* the int 0 */
static PyObject *cm_three;                  /* the int 3 (CAI version) */
static PyObject *cm_str_C;                  /* "C" */

int
cm_argparse(const char *fname, PyObject *const *args, Py_ssize_t nargs,
            PyObject *kwnames, PyObject *const *kwlist, int n, int nreq,
            PyObject **out)
{
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    Py_ssize_t k;
    int i;

    if (nargs > n) {
        PyErr_Format(PyExc_TypeError,
                     "%s() takes at most %d positional arguments (%zd "
                     "given)", fname, n, nargs);
        return -1;
    }
    for (i = 0; i < n; i++) {
        out[i] = i < nargs ? args[i] : NULL;
    }
    for (k = 0; k < nkw; k++) {
        PyObject *kw = PyTuple_GET_ITEM(kwnames, k);

        for (i = 0; i < n; i++) {
            if (kw == kwlist[i]) {
                break;
            }
        }
        if (i == n) {
            for (i = 0; i < n; i++) {
                if (PyUnicode_Compare(kw, kwlist[i]) == 0) {
                    break;
                }
            }
        }
        if (i == n) {
            PyErr_Format(PyExc_TypeError,
                         "%s() got an unexpected keyword argument '%U'",
                         fname, kw);
            return -1;
        }
        if (out[i] != NULL) {
            PyErr_Format(PyExc_TypeError,
                         "%s() got multiple values for argument '%U'",
                         fname, kw);
            return -1;
        }
        out[i] = args[nargs + k];
    }
    for (i = 0; i < nreq; i++) {
        if (out[i] == NULL) {
            PyErr_Format(PyExc_TypeError,
                         "%s() missing required argument '%U'", fname,
                         kwlist[i]);
            return -1;
        }
    }
    return 0;
}

/* cm_argparse with names given as indices into cm_kw. */
static int
cm_parse(const char *fname, PyObject *const *args, Py_ssize_t nargs,
         PyObject *kwnames, const int *names, int n, int nreq,
         PyObject **out)
{
    PyObject *kwlist[K_N_NAMES];
    int i;

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
static int
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

static int
cm_parse_shape(PyObject *obj, Py_ssize_t *shape)
{
    return cm_parse_shape_ex(obj, shape, 0);
}

static int
cm_parse_shape_signed(PyObject *obj, Py_ssize_t *shape)
{
    return cm_parse_shape_ex(obj, shape, 1);
}

/* Fail with ValueError where NumPy refuses the shape: when the product
 * of the non-zero extents times itemsize overflows, even if another
 * extent is 0 (an empty array NumPy could not make cannot be copied
 * back).  A zero itemsize counts as 1, so that the element count fits. */
static int
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

static int cm_check_span(int ndim, const Py_ssize_t *shape,
                         const Py_ssize_t *strides, Py_ssize_t itemsize);

int
cm_layout_check(int ndim, const Py_ssize_t *shape,
                const Py_ssize_t *strides, Py_ssize_t itemsize)
{
    return cm_check_size(ndim, shape, itemsize) < 0
           || cm_check_span(ndim, shape, strides, itemsize) < 0 ? -1 : 0;
}

/* 0 if the byte span of a layout fits in Py_ssize_t (so that
 * cm_layout_span cannot overflow), else -1 with ValueError. */
static int
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
static PyArray_Descr *
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

/* ------------------------------------------------------------------ */
/* The array object                                                    */
/* ------------------------------------------------------------------ */

#define CM_DA_INLINE 4

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int ndim;
    Py_ssize_t *shape;         /* ndim entries: dims_inline or heap */
    Py_ssize_t *strides;       /* ndim entries after shape */
    Py_ssize_t dims_inline[2 * CM_DA_INLINE];
    PyObject *shape_t;         /* tuple of shape, made on first use */
    PyObject *strides_t;       /* tuple of strides, likewise */
    PyArray_Descr *dtype;      /* strong */
    CUdeviceptr ptr;           /* first logical element; 0 when empty */
    Py_ssize_t size;           /* elements */
    Py_ssize_t alloc_size;     /* byte span */
    Py_ssize_t lo;             /* offset of the span's lowest byte */
    int c_contig;              /* NumPy-1.19 flags */
    int f_contig;
    PyObject *gpu_data;        /* strong: keeps the memory alive, or None */
    PyObject *stream;          /* strong: bound stream (0 or a stream) */
    cm_context *ctx;           /* strong or NULL: the context of the
                                * memory's device (NULL: empty, or not
                                * known), made current around every
                                * operation */
    PyObject *cai_typestr;     /* strong or NULL: dtype.str, made on the
                                * first CAI export */
    PyObject *cai_data;        /* strong or NULL: (ptr, False), likewise */
    PyObject *weakreflist;
} cm_da;

/* The module state for slots and functions. */
#define ST cm_st

static int
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

static void
cm_da_view(cm_da *a, cm_view *v)
{
    v->addr = (uintptr_t)a->ptr;
    v->ndim = a->ndim;
    v->shape = a->shape;
    v->strides = a->strides;
    v->itemsize = PyDataType_ELSIZE(a->dtype);
    v->device = 1;
}

static void
cm_nd_view(PyArrayObject *arr, cm_view *v)
{
    v->addr = (uintptr_t)PyArray_DATA(arr);
    v->ndim = PyArray_NDIM(arr);
    v->shape = PyArray_SHAPE(arr);
    v->strides = PyArray_STRIDES(arr);
    v->itemsize = PyArray_ITEMSIZE(arr);
    v->device = 0;
}

static PyObject *
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
static int
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
static int
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
        if (g != NULL && cm_ipc_mem_closed(g)) {
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
static int
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
static int
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

static void
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
static PyObject *
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
static PyObject *
cm_da_make(PyTypeObject *tp, int ndim, const Py_ssize_t *shape,
           const Py_ssize_t *strides, PyArray_Descr *dtype, CUdeviceptr ptr,
           PyObject *gpu_data, PyObject *stream)
{
    return cm_da_make_in(tp, NULL, ndim, shape, strides, dtype, ptr,
                         gpu_data, stream);
}

/* A view of a: same memory and owner, new layout, bound to stream (NULL:
 * a's stream).  offset: bytes from a's first element. */
static PyObject *
cm_da_subview(cm_da *a, PyTypeObject *tp, int ndim, const Py_ssize_t *shape,
              const Py_ssize_t *strides, PyArray_Descr *dtype,
              Py_ssize_t offset, PyObject *stream)
{
    Py_ssize_t n = 1;
    int i;

    for (i = 0; i < ndim; i++) {
        n *= shape[i];
    }
    return cm_da_make_in(tp, a->ctx, ndim, shape, strides, dtype,
                         n == 0 ? 0 : a->ptr + (CUdeviceptr)offset,
                         a->gpu_data, stream != NULL ? stream : a->stream);
}

static int
cm_da_traverse(PyObject *self, visitproc visit, void *arg)
{
    cm_da *a = (cm_da *)self;

    Py_VISIT(Py_TYPE(self));
    Py_VISIT(a->gpu_data);
    Py_VISIT(a->stream);
    Py_VISIT(a->ctx);
    return 0;
}

static int
cm_da_clear(PyObject *self)
{
    cm_da *a = (cm_da *)self;

    Py_CLEAR(a->gpu_data);
    Py_CLEAR(a->stream);
    Py_CLEAR(a->ctx);
    return 0;
}

static void
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
static int
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

static int
cm_effective_stream(PyObject *arg, PyObject *bound, CUstream *h)
{
    return cm_effective_stream_obj(arg, bound, h, NULL);
}

/* Note that async work just queued on h (from stream object sobj) used
 * a's memory, so that its release waits for it (cm_mem_note_use); a
 * no-op for synchronous work, which has completed.  0 or -1. */
static int
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
static PyObject *
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
 * copies between any layouts): TypeError on dtype, ValueError on shape. */
static int
cm_check_compatible(PyArray_Descr *d1, int n1, const Py_ssize_t *s1,
                    PyArray_Descr *d2, int n2, const Py_ssize_t *s2)
{
    PyObject *t1;
    PyObject *t2;
    int eq = PyObject_RichCompareBool((PyObject *)d1, (PyObject *)d2, Py_EQ);

    if (eq < 0) {
        return -1;
    }
    if (!eq) {
        PyErr_Format(PyExc_TypeError, "incompatible dtype: %S vs. %S", d1,
                     d2);
        return -1;
    }
    if (cm_same_core_shape(n1, s1, n2, s2)) {
        return 0;
    }
    t1 = cm_ssize_tuple(n1, s1);
    t2 = cm_ssize_tuple(n2, s2);
    if (t1 != NULL && t2 != NULL) {
        PyErr_Format(PyExc_ValueError, "incompatible shape: %R vs. %R", t1,
                     t2);
    }
    Py_XDECREF(t1);
    Py_XDECREF(t2);
    return -1;
}

/* ------------------------------------------------------------------ */
/* CUDA Array Interface import                                         */
/* ------------------------------------------------------------------ */

/* config.CUDA_ARRAY_INTERFACE_SYNC, read at each use; 1, 0 or -1. */
static int
cm_config_cai_sync(void)
{
    PyObject *v;
    int r;

    if (ST->config == NULL) {
        ST->config = PyImport_ImportModule("cudamem.config");
        if (ST->config == NULL) {
            return -1;
        }
    }
    v = PyObject_GetAttr(ST->config, cm_str_sync_cfg);
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
static int
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

/* A DeviceNDArray view over the memory a CAI dict describes, owned by
 * owner (may be NULL).  Synchronises on the dict's stream when sync and
 * config.CUDA_ARRAY_INTERFACE_SYNC are both true. */
static PyObject *
cm_from_cai(PyObject *desc, PyObject *owner, int sync)
{
    Py_ssize_t shape[NPY_MAXDIMS];
    Py_ssize_t strides[NPY_MAXDIMS];
    PyArray_Descr *dtype = NULL;
    PyObject *bound = NULL;
    PyObject *res = NULL;
    PyObject *v;
    PyObject *d;
    PyObject *data;
    unsigned long long ptr;
    Py_ssize_t version;
    Py_ssize_t lo;
    Py_ssize_t span;
    Py_ssize_t n;
    CUstream h = NULL;
    int ndim;
    int i;
    int err;

    if (!PyDict_Check(desc)) {
        PyErr_Format(PyExc_TypeError,
                     "__cuda_array_interface__ must be a dict, not %.100s",
                     Py_TYPE(desc)->tp_name);
        return NULL;
    }
    if (cm_context_current() == NULL) {
        return NULL;
    }
    v = PyDict_GetItemWithError(desc, ST->str_version);
    if (v == NULL || v == Py_None) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError,
                            "__cuda_array_interface__ has no 'version'");
        }
        return NULL;
    }
    if (!PyLong_Check(v)) {
        PyErr_SetString(PyExc_TypeError,
                        "__cuda_array_interface__ 'version' must be an int");
        return NULL;
    }
    version = PyLong_AsSsize_t(v);
    if (version == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (version > 3 || version < 0) {
        PyErr_Format(PyExc_ValueError,
                     "__cuda_array_interface__ 'version' %zd is not "
                     "supported (0 to 3 are)", version);
        return NULL;
    }
    v = PyDict_GetItemWithError(desc, ST->str_mask);
    if (v == NULL && PyErr_Occurred()) {
        return NULL;
    }
    if (version >= 1 && v != NULL && v != Py_None) {
        PyErr_SetString(PyExc_NotImplementedError,
                        "Masked arrays are not supported");
        return NULL;
    }
    /* shape */
    v = PyDict_GetItemWithError(desc, ST->str_shape);
    if (v == NULL || !PyTuple_Check(v)) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError,
                            "__cuda_array_interface__ 'shape' must be a "
                            "tuple of ints");
        }
        return NULL;
    }
    n = PyTuple_GET_SIZE(v);
    if (n > NPY_MAXDIMS) {
        PyErr_SetString(PyExc_ValueError,
                        "__cuda_array_interface__ 'shape' has too many "
                        "dimensions");
        return NULL;
    }
    ndim = (int)n;
    for (i = 0; i < ndim; i++) {
        if (cm_as_ssize(PyTuple_GET_ITEM(v, i), &shape[i]) < 0) {
            return NULL;
        }
        if (shape[i] < 0) {
            PyErr_SetString(PyExc_ValueError,
                            "__cuda_array_interface__ 'shape' has a "
                            "negative dimension");
            return NULL;
        }
    }
    /* typestr (descr for structured types) */
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
        goto out_dtype;
    }
    /* strides */
    v = PyDict_GetItemWithError(desc, ST->str_strides);
    if (v == NULL && PyErr_Occurred()) {
        goto out_dtype;
    }
    if (v == NULL || v == Py_None) {
        cm_layout_compact(ndim, shape, PyDataType_ELSIZE(dtype), 0, strides);
    }
    else {
        if (!PyTuple_Check(v) || PyTuple_GET_SIZE(v) != ndim) {
            PyErr_SetString(PyExc_ValueError,
                            "__cuda_array_interface__ 'strides' must be "
                            "None or a tuple of ints as long as 'shape'");
            goto out_dtype;
        }
        for (i = 0; i < ndim; i++) {
            if (cm_as_ssize(PyTuple_GET_ITEM(v, i), &strides[i]) < 0) {
                goto out_dtype;
            }
        }
    }
    if (cm_check_size(ndim, shape, PyDataType_ELSIZE(dtype)) < 0
        || cm_check_span(ndim, shape, strides, PyDataType_ELSIZE(dtype))
               < 0) {
        goto out_dtype;
    }
    /* data */
    data = PyDict_GetItemWithError(desc, ST->str_data);
    if (data == NULL || !PyTuple_Check(data) || PyTuple_GET_SIZE(data) != 2
        || !PyLong_Check(PyTuple_GET_ITEM(data, 0))) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError,
                            "__cuda_array_interface__ 'data' must be a "
                            "tuple (pointer: int, read_only: bool)");
        }
        goto out_dtype;
    }
    ptr = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(data, 0));
    if (ptr == (unsigned long long)-1 && PyErr_Occurred()) {
        goto out_dtype;
    }
    span = cm_layout_span(ndim, shape, strides, PyDataType_ELSIZE(dtype), &lo);
    if (span > 0) {
        if (ptr == 0) {
            PyErr_SetString(PyExc_ValueError,
                            "__cuda_array_interface__ 'data' is a NULL "
                            "pointer for a non-empty array");
            goto out_dtype;
        }
        if ((unsigned long long)(-lo) > ptr
            || ptr + (unsigned long long)(span + lo) < ptr) {
            PyErr_SetString(PyExc_ValueError,
                            "__cuda_array_interface__ 'strides' reach "
                            "outside the address space");
            goto out_dtype;
        }
        /* The view must lie in live memory the device can use. */
        if (cm_check_extent((CUdeviceptr)ptr, lo, (size_t)span,
                            "__cuda_array_interface__ 'data'",
                            "__cuda_array_interface__ 'strides' reach")
                < 0) {
            goto out_dtype;
        }
    }
    /* stream */
    v = PyDict_GetItemWithError(desc, ST->str_stream);
    if (v == NULL && PyErr_Occurred()) {
        goto out_dtype;
    }
    if (v != NULL && v != Py_None) {
        void *hp;
        int want;

        if (!PyLong_Check(v)) {
            PyErr_SetString(PyExc_TypeError,
                            "__cuda_array_interface__ 'stream' must be an "
                            "int or None");
            goto out_dtype;
        }
        hp = PyLong_AsVoidPtr(v);
        if (hp == NULL && PyErr_Occurred()) {
            goto out_dtype;
        }
        h = (CUstream)hp;
        bound = cm_stream_external(h);
        if (bound == NULL) {
            goto out_dtype;
        }
        want = sync ? cm_config_cai_sync() : 0;
        if (want < 0) {
            goto out_bound;
        }
        if (want) {
            CM_CU_NOGIL(err, StreamSynchronize, (h));
            if (err < 0) {
                goto out_bound;
            }
        }
    }
    res = cm_da_make(ST->DeviceNDArray_type, ndim, shape, strides, dtype,
                     (CUdeviceptr)ptr, owner != NULL ? owner : Py_None,
                     bound);
out_bound:
    Py_XDECREF(bound);
out_dtype:
    Py_DECREF(dtype);
    return res;
}

/* A cm_da for a device-side source: a cudamem array (new reference to
 * it) or any CAI object (a synchronised view); NULL without an exception
 * when obj is neither. */
static cm_da *
cm_as_device_source(PyObject *obj)
{
    PyObject *cai;
    PyObject *r;

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

/* ------------------------------------------------------------------ */
/* Copies                                                              */
/* ------------------------------------------------------------------ */

/* dst <- src through a pinned host buffer laid out like src: src's
 * device fills it with its context current, then dst's empties it with
 * dst's current (the caller's).  Complete when it returns. */
static int
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
    Py_BEGIN_ALLOW_THREADS
    (void)CM_CU_RAW(MemFreeHost, (buf));
    Py_END_ALLOW_THREADS
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
    if (cm_context_enable_peer(dst->ctx, src->ctx) < 0) {
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
static int
cm_da_copy_from_run(cm_da *self, PyObject *ary, PyObject *stream)
{
    cm_view dv;
    cm_view sv;
    PyObject *src;
    PyObject *sobj = NULL;
    CUstream h;
    int async;
    int rc = -1;

    async = cm_effective_stream_obj(stream, self->stream, &h, &sobj);
    if (async < 0) {
        return -1;
    }
    src = (PyObject *)cm_as_device_source(ary);
    if (src == NULL) {
        if (PyErr_Occurred()) {
            return -1;
        }
        src = PyArray_FromAny(ary, NULL, 0, 0, 0, NULL);
        if (src == NULL) {
            return -1;
        }
        cm_nd_view((PyArrayObject *)src, &sv);
        if (PyArray_SIZE((PyArrayObject *)src) == 0) {
            rc = 0;
            goto out_src;
        }
        if (cm_check_compatible(self->dtype, self->ndim, self->shape,
                                PyArray_DESCR((PyArrayObject *)src),
                                sv.ndim, sv.shape) < 0) {
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
                                s->dtype, s->ndim, s->shape) < 0) {
            goto out_src;
        }
        if (s->ctx != NULL && self->ctx != NULL && s->ctx != self->ctx) {
            rc = cm_copy_across(self, s, h, async);
            if (cm_da_used_on(s, async, h, sobj) < 0
                || cm_da_used_on(self, async, h, sobj) < 0) {
                rc = -1;
            }
            goto out_src;
        }
        cm_da_view(s, &sv);
    }
    if (cm_da_activate(self) < 0) {
        goto out_src;
    }
    cm_da_view(self, &dv);
    rc = cm_copy(&dv, &sv, h, async);
    if (cm_da_used_on(self, async, h, sobj) < 0
        || (cm_da_check(src)
            && cm_da_used_on((cm_da *)src, async, h, sobj) < 0)) {
        rc = -1;
    }
out_src:
    Py_DECREF(src);
    return rc;
}

/* cm_da_copy_from_run with the array's context current. */
static int
cm_da_copy_from(cm_da *self, PyObject *ary, PyObject *stream)
{
    CUcontext prev;
    int r;

    if (cm_da_enter(self, &prev) < 0) {
        return -1;
    }
    r = cm_da_copy_from_run(self, ary, stream);
    cm_da_leave(self, prev);
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
            if (cm_copy(&dv, &sv, h, async) < 0) {
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
    if (cm_copy(&dv, &sv, h, async) < 0) {
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
    if (async < 0 || cm_da_activate(self) < 0
        || cm_da_used_on(self, async, h, sobj) < 0) {
        return NULL;
    }
    if (ary == NULL || ary == Py_None) {
        return cm_da_to_new_host(self, h, async);
    }
    if (self->ndim == 0 && PyArray_IsScalar(ary, Void)) {
        PyVoidScalarObject *vs = (PyVoidScalarObject *)ary;

        if (cm_check_compatible(self->dtype, 0, NULL, vs->descr, 0, NULL)
            < 0) {
            return NULL;
        }
        dv.addr = (uintptr_t)vs->obval;
        dv.ndim = 0;
        dv.shape = NULL;
        dv.strides = NULL;
        dv.itemsize = PyDataType_ELSIZE(self->dtype);
        dv.device = 0;
        cm_da_view(self, &sv);
        if (cm_copy(&dv, &sv, h, async) < 0) {
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
                            PyArray_SHAPE(dst)) < 0) {
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
    if (cm_copy(&dv, &sv, h, async) < 0) {
        return NULL;
    }
    return Py_NewRef(ary);
}

/* cm_da_copy_to_host_impl_run with the array's context current. */
static PyObject *
cm_da_copy_to_host_impl(cm_da *self, PyObject *ary, PyObject *stream)
{
    CUcontext prev;
    PyObject *r;

    if (cm_da_enter(self, &prev) < 0) {
        return NULL;
    }
    r = cm_da_copy_to_host_impl_run(self, ary, stream);
    cm_da_leave(self, prev);
    return r;
}

/* A new C-contiguous host copy of a device view with dtype; waits for an
 * async copy to land. */
static PyArrayObject *
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

/* ------------------------------------------------------------------ */
/* Attributes                                                          */
/* ------------------------------------------------------------------ */

/* The shape tuple (strides 0) or the strides tuple (1), made on first
 * use (most arrays never show theirs); borrowed, or NULL with an
 * exception. */
static PyObject *
cm_da_dims_tuple(cm_da *a, int strides)
{
    PyObject **slot = strides ? &a->strides_t : &a->shape_t;

    if (*slot == NULL) {
        *slot = cm_ssize_tuple(a->ndim, strides ? a->strides : a->shape);
    }
    return *slot;
}

static PyObject *
cm_da_get_shape(PyObject *self, void *unused)
{
    (void)unused;
    return Py_XNewRef(cm_da_dims_tuple((cm_da *)self, 0));
}

static PyObject *
cm_da_get_strides(PyObject *self, void *unused)
{
    (void)unused;
    return Py_XNewRef(cm_da_dims_tuple((cm_da *)self, 1));
}

static PyObject *
cm_da_get_ndim(PyObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromLong(((cm_da *)self)->ndim);
}

static PyObject *
cm_da_get_size(PyObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromSsize_t(((cm_da *)self)->size);
}

static PyObject *
cm_da_get_dtype(PyObject *self, void *unused)
{
    (void)unused;
    return Py_NewRef(((cm_da *)self)->dtype);
}

static PyObject *
cm_da_get_itemsize(PyObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromSsize_t(PyDataType_ELSIZE(((cm_da *)self)->dtype));
}

static PyObject *
cm_da_get_nbytes(PyObject *self, void *unused)
{
    cm_da *a = (cm_da *)self;

    (void)unused;
    return PyLong_FromSsize_t(a->size * PyDataType_ELSIZE(a->dtype));
}

static PyObject *
cm_da_get_alloc_size(PyObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromSsize_t(((cm_da *)self)->alloc_size);
}

static PyObject *
cm_da_get_gpu_data(PyObject *self, void *unused)
{
    (void)unused;
    return Py_NewRef(((cm_da *)self)->gpu_data);
}

static PyObject *
cm_da_get_stream(PyObject *self, void *unused)
{
    (void)unused;
    return Py_NewRef(((cm_da *)self)->stream);
}

static int
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

static PyObject *
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

static PyObject *
cm_da_get_flags(PyObject *self, void *unused)
{
    cm_da *a = (cm_da *)self;

    (void)unused;
    return Py_BuildValue("{sOsO}", "C_CONTIGUOUS",
                         a->c_contig ? Py_True : Py_False, "F_CONTIGUOUS",
                         a->f_contig ? Py_True : Py_False);
}

static PyObject *
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

/* Apply a basic index (ints and slices) to a layout, numba's way.  Fills
 * the result layout, the byte offset of its first element and whether
 * every dimension was indexed by an integer. */
static int
cm_layout_index(int ndim, const Py_ssize_t *shape,
                const Py_ssize_t *strides, PyObject *item, int *ondim,
                Py_ssize_t *oshape, Py_ssize_t *ostrides,
                Py_ssize_t *offset, int *all_int)
{
    PyObject *const *items;
    Py_ssize_t n;
    Py_ssize_t k;
    int out = 0;
    int ints = 0;

    if (PyTuple_Check(item)) {
        items = &PyTuple_GET_ITEM(item, 0);
        n = PyTuple_GET_SIZE(item);
    }
    else {
        items = &item;
        n = 1;
    }
    if (n > ndim) {
        PyErr_Format(PyExc_IndexError, "%zd extra indices given",
                     n - ndim);
        return -1;
    }
    *offset = 0;
    for (k = 0; k < n; k++) {
        PyObject *e = items[k];

        if (PySlice_Check(e)) {
            Py_ssize_t start;
            Py_ssize_t stop;
            Py_ssize_t step;
            Py_ssize_t len;

            if (PySlice_Unpack(e, &start, &stop, &step) < 0) {
                return -1;
            }
            len = PySlice_AdjustIndices(shape[k], &start, &stop, step);
            if (len > 0) {
                *offset += start * strides[k];
            }
            oshape[out] = len;
            ostrides[out] = strides[k] * step;
            out++;
        }
        else if (PyIndex_Check(e) && !PyArray_Check(e)) {
            /* An index beyond Py_ssize_t is out of range: IndexError. */
            Py_ssize_t i = PyNumber_AsSsize_t(e, PyExc_IndexError);

            if (i == -1 && PyErr_Occurred()) {
                return -1;
            }
            if (i < 0) {
                i += shape[k];
            }
            if (i < 0 || i >= shape[k]) {
                PyErr_SetNone(PyExc_IndexError);
                return -1;
            }
            *offset += i * strides[k];
            ints++;
        }
        else {
            PyErr_Format(PyExc_TypeError,
                         "only integers and slices are valid device array "
                         "indices, not %.100s", Py_TYPE(e)->tp_name);
            return -1;
        }
    }
    for (; k < ndim; k++) {
        oshape[out] = shape[k];
        ostrides[out] = strides[k];
        out++;
    }
    *ondim = out;
    *all_int = ints == ndim;
    return 0;
}

/* Read one element at addr as a NumPy scalar (a blocking copy). */
static PyObject *
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

    if (cm_layout_index(self->ndim, self->shape, self->strides, item, &ndim,
                        shape, strides, &offset, &all_int) < 0) {
        return NULL;
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
static PyObject *
cm_da_getitem_impl(cm_da *self, PyObject *item, PyObject *stream)
{
    CUcontext prev;
    PyObject *r;

    if (cm_da_enter(self, &prev) < 0) {
        return NULL;
    }
    r = cm_da_getitem_impl_run(self, item, stream);
    cm_da_leave(self, prev);
    return r;
}

static PyObject *
cm_da_subscript(PyObject *self, PyObject *item)
{
    return cm_da_getitem_impl((cm_da *)self, item, NULL);
}

/* Fill the device view lhs (dtype) from value with numba's broadcasting
 * rules; host values are cast with NumPy's unsafe casting. */
/* lhs = cast(src) elementwise by the internal kernel; src strides are
 * per lhs dimension (0 broadcasts).  Waits for it unless async. */
static int
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

/* lhs = host broadcast over lhs (rstrides: host's strides per lhs
 * dimension, 0 where it broadcasts): one upload of the compact host
 * value into a temporary device buffer, then the kernel.  The temporary's
 * free is deferred, so it outlives the kernel. */
/* ------------------------------------------------------------------ */
/* Host values of asynchronous assignments                             */
/* ------------------------------------------------------------------ */

/* d[...] = value on a stream must not wait for the stream, yet the host
 * value (often a temporary) must outlive the copy that reads it.  It is
 * copied into one of these page-locked buffers, which is handed out
 * again only once an event recorded after that copy has completed.
 * Buffers belong to one primary context (gen): those of a context that
 * was closed or reset went with it and are forgotten without a driver
 * call.  GIL held throughout. */
#define CM_HV_SLOTS 1024                /* at most this many buffers */
#define CM_HV_SCAN 16                  /* idle ones looked for per call */
#define CM_HV_MAX ((size_t)64 << 20)   /* larger values: synchronous */
#define CM_HV_TOTAL ((size_t)256 << 20) /* the most all buffers hold */

typedef struct {
    unsigned long gen;    /* the context's gen; 0: slot empty */
    void *buf;            /* cuMemHostAlloc'd, mapped */
    CUdeviceptr dptr;     /* its address on the device */
    size_t cap;           /* bytes */
    CUevent ev;           /* recorded after the last copy from buf */
} cm_hostval;

static cm_hostval *cm_hv;      /* cm_hv_n slots, grown on need */
static int cm_hv_n;
static int cm_hv_next;         /* where the next search starts: the slot
                                * after the last one used, the oldest in a
                                * stream's order */
static size_t cm_hv_bytes;     /* bytes the buffers hold */

/* A page-locked buffer of at least n bytes of ctx (current) that no
 * queued copy reads any more, holding a copy of data: its slot index, or
 * -1 when none can be had (the caller then copies synchronously; no
 * exception is set). */
static int
cm_hostval_take(cm_context *ctx, const void *data, size_t n)
{
    int i;
    int k;
    int empty = -1;
    int spare = -1;
    cm_hostval *v;
    size_t cap;
    CUresult rc;

    if (n > CM_HV_MAX || cm_forked) {
        return -1;
    }
    for (k = 0; k < cm_hv_n && k < CM_HV_SCAN; k++) {
        i = (cm_hv_next + k) % cm_hv_n;
        v = &cm_hv[i];
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
        if (v->gen != ctx->gen
            || CM_CU_RAW(EventQuery, (v->ev)) != CUDA_SUCCESS) {
            continue;
        }
        if (v->cap >= n) {
            goto found;
        }
        spare = i;
    }
    if (empty < 0 && cm_hv_n < CM_HV_SLOTS
        && cm_hv_bytes + n <= CM_HV_TOTAL) {
        cm_hostval *nv = PyMem_Realloc(cm_hv, (size_t)(cm_hv_n + 1)
                                              * sizeof(*nv));

        if (nv != NULL) {
            cm_hv = nv;
            empty = cm_hv_n++;
            cm_hv[empty].gen = 0;
        }
    }
    if (empty < 0 && spare < 0) {
        return -1;
    }
    if (empty < 0) {
        /* An idle buffer too small: replaced by a larger one. */
        i = spare;
        v = &cm_hv[i];
        (void)CM_CU_RAW(EventDestroy, (v->ev));
        Py_BEGIN_ALLOW_THREADS
        (void)CM_CU_RAW(MemFreeHost, (v->buf));
        Py_END_ALLOW_THREADS
        v->gen = 0;
        cm_hv_bytes -= v->cap;
        empty = i;
    }
    i = empty;
    v = &cm_hv[i];
    for (cap = 4096; cap < n; cap *= 2) {
    }
    CM_DRIVER_BEGIN_NOGIL
    rc = CM_CU_RAW(MemHostAlloc, (&v->buf, cap,
                                  CU_MEMHOSTALLOC_DEVICEMAP
                                  | CU_MEMHOSTALLOC_PORTABLE));
    CM_DRIVER_END_NOGIL
    if (rc != CUDA_SUCCESS) {
        return -1;
    }
    if (CM_CU_RAW(MemHostGetDevicePointer, (&v->dptr, v->buf, 0))
        != CUDA_SUCCESS) {
        Py_BEGIN_ALLOW_THREADS
        (void)CM_CU_RAW(MemFreeHost, (v->buf));
        Py_END_ALLOW_THREADS
        return -1;
    }
    if (CM_CU_RAW(EventCreate, (&v->ev, CU_EVENT_DISABLE_TIMING))
        != CUDA_SUCCESS) {
        Py_BEGIN_ALLOW_THREADS
        (void)CM_CU_RAW(MemFreeHost, (v->buf));
        Py_END_ALLOW_THREADS
        return -1;
    }
    v->cap = cap;
    v->gen = ctx->gen;
    cm_hv_bytes += cap;
found:
    memcpy(cm_hv[i].buf, data, n);
    cm_hv_next = (i + 1) % cm_hv_n;
    return i;
}

/* The copies from slot i are queued on h: it is reusable once they ran.
 * 0, or -1 with an exception (then the stream is waited for). */
static int
cm_hostval_queued(int i, CUstream h)
{
    if (CM_CU(EventRecord, (cm_hv[i].ev, h)) < 0) {
        PyObject *exc = PyErr_GetRaisedException();

        /* Nothing will say when it is free: let the copy land. */
        (void)cm_stream_wait(h);
        PyErr_SetRaisedException(exc);
        return -1;
    }
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
            if (cm_hostval_queued(slot, h) < 0) {
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

static int
cm_assign(const cm_view *lhs, PyArray_Descr *dtype, PyObject *value,
          CUstream h, int async)
{
    Py_ssize_t rstrides[NPY_MAXDIMS];
    PyObject *rhs = NULL;
    PyArrayObject *host = NULL;
    cm_view rv;
    const Py_ssize_t *rshape;
    const Py_ssize_t *rst;
    Py_ssize_t size = 1;
    int rndim;
    int pad;
    int i;
    int rc = -1;

    for (i = 0; i < lhs->ndim; i++) {
        size *= lhs->shape[i];
    }
    rhs = (PyObject *)cm_as_device_source(value);
    if (rhs == NULL) {
        if (PyErr_Occurred()) {
            return -1;
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
        if (rhs == NULL) {
            return -1;
        }
    }
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
        goto out_rhs;
    }
    pad = lhs->ndim - rndim;
    for (i = 0; i < lhs->ndim; i++) {
        Py_ssize_t r = i < pad ? 1 : rshape[i - pad];

        if (r != 1 && r != lhs->shape[i]) {
            PyErr_Format(PyExc_ValueError,
                         "Can't copy sequence with size %zd to array axis "
                         "%d with dimension %zd", r, i, lhs->shape[i]);
            goto out_rhs;
        }
        rstrides[i] = (r == 1) ? 0 : rst[i - pad];
    }
    if (size == 0) {
        rc = 0;
        goto out_rhs;
    }
    if (cm_da_check(rhs)) {
        cm_da *d = (cm_da *)rhs;
        int eq = cm_da_alive(d) < 0
                 ? -1 : PyObject_RichCompareBool((PyObject *)d->dtype,
                                                 (PyObject *)dtype, Py_EQ);
        /* another device's array that this one cannot map: via the host */
        int far = 0;
        cm_context *cur;
        CUcontext prev;

        if (eq < 0) {
            goto out_rhs;
        }
        if (d->ctx != NULL) {
            cur = cm_context_current();
            if (cur == NULL) {
                goto out_rhs;
            }
            if (cur != d->ctx) {
                far = cm_context_can_access_peer(cur, d->ctx->device->id);
                if (far < 0 || (far && cm_context_enable_peer(cur, d->ctx)
                                       < 0)) {
                    goto out_rhs;
                }
                far = !far;
            }
        }
        if (far) {
            cm_da_view(d, &rv);
            if (cm_context_enter(d->ctx, &prev) < 0) {
                goto out_rhs;
            }
            host = cm_view_to_host(&rv, d->dtype, NULL, 0);
            cm_context_leave(d->ctx, prev);
            if (host == NULL) {
                goto out_rhs;
            }
            Py_SETREF(rhs, (PyObject *)host);
            host = NULL;
            /* The host copy is gone when this returns: no async copy from
             * it, but after the work already queued on h. */
            if (async && cm_stream_wait(h) < 0) {
                goto out_rhs;
            }
            rc = cm_assign(lhs, dtype, rhs, h, 0);
            goto out_rhs;
        }
        if (eq) {
            cm_da_view(d, &rv);
            rv.ndim = lhs->ndim;
            rv.shape = lhs->shape;
            rv.strides = rstrides;
            rc = cm_copy(lhs, &rv, h, async);
            goto out_rhs;
        }
        /* Another numeric dtype: the kernel casts on the device. */
        if (cm_elem_type_of(d->dtype) != CM_T_BYTES
            && cm_elem_type_of(dtype) != CM_T_BYTES
            && lhs->ndim <= CM_KMAXDIM) {
            rc = cm_assign_by_kernel(lhs, cm_elem_type_of(dtype),
                                     (CUdeviceptr)d->ptr, rstrides,
                                     cm_elem_type_of(d->dtype), h, async);
            goto out_rhs;
        }
        /* Anything else: cast on the host. */
        cm_da_view(d, &rv);
        host = cm_view_to_host(&rv, d->dtype, h, async);
        if (host == NULL) {
            goto out_rhs;
        }
        Py_SETREF(rhs, (PyObject *)host);
        rst = PyArray_STRIDES(host);
        for (i = pad; i < lhs->ndim; i++) {
            if (rstrides[i] != 0) {
                rstrides[i] = rst[i - pad];
            }
        }
    }
    Py_INCREF(dtype);
    /* Steals the dtype reference. */
    host = (PyArrayObject *)PyArray_FromArray(
        (PyArrayObject *)rhs, dtype,
        NPY_ARRAY_FORCECAST | NPY_ARRAY_C_CONTIGUOUS);
    if (host == NULL) {
        goto out_rhs;
    }
    rst = PyArray_STRIDES(host);
    for (i = pad; i < lhs->ndim; i++) {
        if (rstrides[i] != 0) {
            rstrides[i] = rst[i - pad];
        }
    }
    if (PyArray_SIZE(host) == 1) {
        /* One value: a memset when all its bytes agree and lhs is one
         * contiguous run. */
        const unsigned char *b = PyArray_DATA(host);
        Py_ssize_t lo;
        Py_ssize_t span = cm_layout_span(lhs->ndim, lhs->shape,
                                         lhs->strides, lhs->itemsize, &lo);
        int c;
        int f;
        int same = 1;

        for (i = 1; i < lhs->itemsize; i++) {
            same &= b[i] == b[0];
        }
        cm_layout_flags(lhs->ndim, lhs->shape, lhs->strides, lhs->itemsize,
                        &c, &f);
        if (same && (c || f)) {
            CUdeviceptr p = (CUdeviceptr)lhs->addr + (CUdeviceptr)lo;
            int err;

            if (async) {
                rc = CM_CU(MemsetD8Async, (p, b[0], (size_t)span, h));
            }
            else {
                CM_CU_NOGIL(err, MemsetD8, (p, b[0], (size_t)span));
                rc = err;
            }
            goto out_host;
        }
    }
    if (PyArray_SIZE(host) < size && lhs->ndim <= CM_KMAXDIM) {
        /* Broadcast: upload the value once, then the kernel spreads it. */
        rc = cm_assign_broadcast(lhs, host, rstrides, h, async);
        goto out_host;
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
            goto out_host;
        }
        if (slot >= 0) {
            rv.addr = (uintptr_t)cm_hv[slot].buf;
            rc = cm_copy(lhs, &rv, h, async);
            if (cm_hostval_queued(slot, h) < 0) {
                rc = -1;
            }
            goto out_host;
        }
    }
    rc = cm_copy(lhs, &rv, h, async);
    /* The host side may be a temporary: let the copy land first. */
    if (rc == 0 && async) {
        rc = cm_stream_wait(h);
    }
out_host:
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

    async = cm_effective_stream_obj(stream, self->stream, &h, &sobj);
    if (async < 0) {
        return -1;
    }
    if (cm_layout_index(self->ndim, self->shape, self->strides, key, &ndim,
                        shape, strides, &offset, &all_int) < 0
        || cm_da_activate(self) < 0) {
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
static int
cm_da_setitem_impl(cm_da *self, PyObject *key, PyObject *value,
                   PyObject *stream)
{
    CUcontext prev;
    int r;

    if (cm_da_enter(self, &prev) < 0) {
        return -1;
    }
    r = cm_da_setitem_impl_run(self, key, value, stream);
    cm_da_leave(self, prev);
    return r;
}

static int
cm_da_ass_subscript(PyObject *self, PyObject *key, PyObject *value)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_TypeError,
                        "device array elements cannot be deleted");
        return -1;
    }
    return cm_da_setitem_impl((cm_da *)self, key, value, NULL);
}

static Py_ssize_t
cm_da_length(PyObject *self)
{
    cm_da *a = (cm_da *)self;

    if (a->ndim == 0) {
        PyErr_SetString(PyExc_IndexError, "tuple index out of range");
        return -1;
    }
    return a->shape[0];
}

/* ------------------------------------------------------------------ */
/* Methods                                                             */
/* ------------------------------------------------------------------ */

PyDoc_STRVAR(cm_da_copy_to_host_doc,
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
"Large copies of pageable host memory may go through the staging\n"
"pipeline (see the README: CUDAMEM_STAGING).  Such a copy has completed\n"
"when it returns, also an asynchronous one (issued on its stream after\n"
"the work queued there); the driver's own asynchronous copies of\n"
"pageable memory likewise return only once the host memory is consumed\n"
"or filled.");

static PyObject *
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

PyDoc_STRVAR(cm_da_copy_to_device_doc,
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
"Large copies of pageable host memory may go through the staging\n"
"pipeline (see the README: CUDAMEM_STAGING).  Such a copy has completed\n"
"when it returns, also an asynchronous one (issued on its stream after\n"
"the work queued there); the driver's own asynchronous copies of\n"
"pageable memory likewise return only once the host memory is consumed\n"
"or filled.");

static PyObject *
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

PyDoc_STRVAR(cm_da_getitem_doc,
"getitem($self, item, /, stream=0)\n--\n\n"
"``self[item]`` with the view bound to (or the element read on)\n"
"``stream``.");

static PyObject *
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

PyDoc_STRVAR(cm_da_setitem_doc,
"setitem($self, key, value, stream=0)\n--\n\n"
"``self[key] = value`` on ``stream``.  Without any stream (argument or\n"
"bound) the call is synchronous.\n\n"
"Notes\n-----\n"
"numba runs a broadcasting kernel.  cudamem copies instead: the value is\n"
"cast on the host with NumPy's unsafe casting and broadcast by a strided\n"
"copy (a memset when every byte agrees); a device value of another dtype\n"
"is brought to the host first.  Host values are waited for on the\n"
"stream, since they may be temporaries.");

static PyObject *
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

PyDoc_STRVAR(cm_da_bind_doc,
"bind($self, /, stream=0)\n--\n\n"
"A new view of the same memory (same gpu_data) bound to ``stream``.");

static PyObject *
cm_da_bind(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
           PyObject *kwnames)
{
    static const int names[] = {K_STREAM};
    cm_da *a = (cm_da *)self;
    PyObject *s[1];
    CUstream h;

    if (cm_parse("bind", args, nargs, kwnames, names, 1, 0, s) < 0) {
        return NULL;
    }
    if (s[0] != NULL && cm_stream_resolve(s[0], &h) < 0) {
        return NULL;
    }
    return cm_da_make_in(Py_TYPE(self), a->ctx, a->ndim, a->shape,
                         a->strides, a->dtype, a->ptr, a->gpu_data,
                         s[0] != NULL ? s[0] : cm_zero);
}

static PyObject *
cm_da_is_c_contiguous(PyObject *self, PyObject *unused)
{
    (void)unused;
    return PyBool_FromLong(((cm_da *)self)->c_contig);
}

static PyObject *
cm_da_is_f_contiguous(PyObject *self, PyObject *unused)
{
    (void)unused;
    return PyBool_FromLong(((cm_da *)self)->f_contig);
}

static PyObject *
cm_da_as_cuda_arg(PyObject *self, PyObject *unused)
{
    (void)unused;
    return Py_NewRef(((cm_da *)self)->gpu_data);
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

PyDoc_STRVAR(cm_da_reshape_doc,
"reshape($self, /, *newshape, order='C')\n--\n\n"
"A view with a new shape; the array must be contiguous.\n\n"
"Notes\n-----\n"
"numba's view drops the bound stream; cudamem's keeps it.");

static PyObject *
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

PyDoc_STRVAR(cm_da_ravel_doc,
"ravel($self, /, order='C', stream=0)\n--\n\n"
"A 1-D view of a contiguous array, bound to ``stream`` (or the array's\n"
"stream).");

static PyObject *
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

PyDoc_STRVAR(cm_da_view_doc,
"view($self, dtype, /)\n--\n\n"
"The same bytes seen as ``dtype`` (same gpu_data and stream).  With a\n"
"different itemsize the array must be C-contiguous; the last dimension\n"
"is rescaled.");

static PyObject *
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

PyDoc_STRVAR(cm_da_squeeze_doc,
"squeeze($self, /, axis=None, stream=0)\n--\n\n"
"A view without the size-1 axes (or only those in ``axis``), bound to\n"
"``stream`` (or the array's stream).");

static PyObject *
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

PyDoc_STRVAR(cm_da_split_doc,
"split($self, section, /, stream=0)\n--\n\n"
"A generator of consecutive 1-D views of ``section`` elements (the last\n"
"may be shorter), bound to ``stream`` (or the array's stream).  Errors\n"
"(not 1-D, not unit stride) appear when it is iterated.");

static PyObject *
cm_da_split(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
            PyObject *kwnames)
{
    static const int names[] = {K_SECTION, K_STREAM};
    PyObject *p[2];

    if (cm_parse("split", args, nargs, kwnames, names, 2, 1, p) < 0) {
        return NULL;
    }
    if (cm_api_split == NULL) {
        PyObject *m = PyImport_ImportModule("cudamem._api");

        if (m == NULL) {
            return NULL;
        }
        cm_api_split = PyObject_GetAttrString(m, "_split");
        Py_DECREF(m);
        if (cm_api_split == NULL) {
            return NULL;
        }
    }
    return PyObject_CallFunctionObjArgs(cm_api_split, self, p[0],
                                        p[1] != NULL ? p[1] : cm_zero, NULL);
}

PyDoc_STRVAR(cm_da_transpose_doc,
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
    CUcontext prev;
    PyObject *r;

    if (cm_da_enter(a, &prev) < 0) {
        return NULL;
    }
    r = cm_da_transpose_impl_run(a, axes);
    cm_da_leave(a, prev);
    return r;
}

static PyObject *
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

static PyObject *
cm_da_get_T(PyObject *self, void *unused)
{
    (void)unused;
    return cm_da_transpose_impl((cm_da *)self, NULL);
}

PyDoc_STRVAR(cm_da_array_doc,
"__array__($self, /, dtype=None, copy=None)\n--\n\n"
"A host copy (copy_to_host), cast to ``dtype`` when given.  ``copy=False``\n"
"raises ValueError: a copy is always made.");

static PyObject *
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

/* ------------------------------------------------------------------ */
/* DeviceRecord                                                        */
/* ------------------------------------------------------------------ */

/* The dtype and offset of field key of a structured dtype (borrowed), or
 * NULL with KeyError. */
static PyArray_Descr *
cm_record_field(PyArray_Descr *dt, PyObject *key, Py_ssize_t *offset)
{
    PyObject *fields = PyDataType_FIELDS(dt);
    PyObject *f;

    f = (PyUnicode_Check(key) && fields != NULL && fields != Py_None)
            ? PyDict_GetItemWithError(fields, key) : NULL;
    if (f == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetObject(PyExc_KeyError, key);
        }
        return NULL;
    }
    *offset = PyLong_AsSsize_t(PyTuple_GET_ITEM(f, 1));
    if (*offset == -1 && PyErr_Occurred()) {
        return NULL;
    }
    return (PyArray_Descr *)PyTuple_GET_ITEM(f, 0);
}

static PyObject *
cm_rec_getitem_impl_run(cm_da *self, PyObject *key, PyObject *stream)
{
    PyArray_Descr *ft;
    PyObject *bound;
    Py_ssize_t offset;

    ft = cm_record_field(self->dtype, key, &offset);
    if (ft == NULL) {
        return NULL;
    }
    bound = cm_pick_stream(stream, self);
    if (bound == NULL) {
        return NULL;
    }
    if (PyDataType_HASSUBARRAY(ft)) {
        PyArray_ArrayDescr *sub = PyDataType_SUBARRAY(ft);
        Py_ssize_t shape[NPY_MAXDIMS];
        Py_ssize_t strides[NPY_MAXDIMS];
        int ndim = cm_parse_shape(sub->shape, shape);

        if (ndim < 0) {
            return NULL;
        }
        cm_layout_compact(ndim, shape, PyDataType_ELSIZE(sub->base), 0, strides);
        return cm_da_subview(self, ST->DeviceNDArray_type, ndim, shape,
                             strides, sub->base, offset, bound);
    }
    if (PyDataType_HASFIELDS(ft)) {
        return cm_da_subview(self, ST->DeviceRecord_type, 0, NULL, NULL, ft,
                             offset, bound);
    }
    if (cm_da_activate(self) < 0) {
        return NULL;
    }
    return cm_read_scalar(self->ptr + (CUdeviceptr)offset, ft, stream,
                          self->stream);
}

/* cm_rec_getitem_impl_run with the array's context current. */
static PyObject *
cm_rec_getitem_impl(cm_da *self, PyObject *key, PyObject *stream)
{
    CUcontext prev;
    PyObject *r;

    if (cm_da_enter(self, &prev) < 0) {
        return NULL;
    }
    r = cm_rec_getitem_impl_run(self, key, stream);
    cm_da_leave(self, prev);
    return r;
}

static int
cm_rec_setitem_impl_run(cm_da *self, PyObject *key, PyObject *value,
                        PyObject *stream)
{
    PyArray_Descr *ft;
    PyArrayObject *tmp;
    Py_ssize_t offset;
    cm_view dv;
    cm_view sv;
    CUstream h;
    int async;
    int rc = -1;

    async = cm_effective_stream(stream, self->stream, &h);
    if (async < 0) {
        return -1;
    }
    ft = cm_record_field(self->dtype, key, &offset);
    if (ft == NULL || cm_da_activate(self) < 0) {
        return -1;
    }
    Py_INCREF(ft);
    tmp = (PyArrayObject *)PyArray_NewFromDescr(&PyArray_Type, ft, 0, NULL,
                                                NULL, NULL, 0, NULL);
    if (tmp == NULL) {
        return -1;
    }
    if (PyArray_CopyObject(tmp, value) < 0) {
        goto out_tmp;
    }
    sv.addr = (uintptr_t)PyArray_DATA(tmp);
    sv.ndim = 0;
    sv.shape = NULL;
    sv.strides = NULL;
    sv.itemsize = PyDataType_ELSIZE(ft);
    sv.device = 0;
    dv = sv;
    dv.addr = (uintptr_t)self->ptr + (uintptr_t)offset;
    dv.device = 1;
    if (cm_copy(&dv, &sv, h, async) < 0) {
        goto out_tmp;
    }
    /* tmp is a temporary: let the copy land; unbound calls sync. */
    rc = cm_stream_wait(async ? h : NULL);
out_tmp:
    Py_DECREF(tmp);
    return rc;
}

/* cm_rec_setitem_impl_run with the array's context current. */
static int
cm_rec_setitem_impl(cm_da *self, PyObject *key, PyObject *value,
                    PyObject *stream)
{
    CUcontext prev;
    int r;

    if (cm_da_enter(self, &prev) < 0) {
        return -1;
    }
    r = cm_rec_setitem_impl_run(self, key, value, stream);
    cm_da_leave(self, prev);
    return r;
}

static PyObject *
cm_rec_subscript(PyObject *self, PyObject *key)
{
    return cm_rec_getitem_impl((cm_da *)self, key, NULL);
}

static int
cm_rec_ass_subscript(PyObject *self, PyObject *key, PyObject *value)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_TypeError, "record fields cannot be deleted");
        return -1;
    }
    return cm_rec_setitem_impl((cm_da *)self, key, value, NULL);
}

PyDoc_STRVAR(cm_rec_getitem_doc,
"getitem($self, item, /, stream=0)\n--\n\n"
"Field ``item``: a host scalar, a nested DeviceRecord view or a\n"
"subarray DeviceNDArray view.");

static PyObject *
cm_rec_getitem(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
               PyObject *kwnames)
{
    static const int names[] = {K_ITEM, K_STREAM};
    PyObject *a[2];

    if (cm_parse("getitem", args, nargs, kwnames, names, 2, 1, a) < 0) {
        return NULL;
    }
    return cm_rec_getitem_impl((cm_da *)self, a[0], a[1]);
}

PyDoc_STRVAR(cm_rec_setitem_doc,
"setitem($self, key, value, stream=0)\n--\n\n"
"Write field ``key`` (value converted on the host, then uploaded).");

static PyObject *
cm_rec_setitem(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
               PyObject *kwnames)
{
    static const int names[] = {K_KEY, K_VALUE, K_STREAM};
    PyObject *a[3];

    if (cm_parse("setitem", args, nargs, kwnames, names, 3, 2, a) < 0
        || cm_rec_setitem_impl((cm_da *)self, a[0], a[1], a[2]) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ */
/* Module functions                                                    */
/* ------------------------------------------------------------------ */

/* Parse the shape / strides / order triple of device_array and the
 * constructor into shape[] and strides[]; ndim or -1.  order NULL: the
 * strides must be given (the constructor). */
static int
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

PyDoc_STRVAR(cm_device_array_doc,
"device_array(shape, dtype=np.float64, strides=None, order='C', "
"stream=0)\n--\n\n"
"An uninitialised device array, like numpy.empty.\n\n"
"Notes\n-----\n"
"numba rejects NumPy integer scalars as the shape and does not validate\n"
"negative dimensions; cudamem accepts the former and raises ValueError\n"
"for negative dimensions and sizes that overflow.");

static PyObject *
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

PyDoc_STRVAR(cm_device_array_like_doc,
"device_array_like(ary, stream=0)\n--\n\n"
"An uninitialised device array with the shape and dtype of ``ary`` (a\n"
"host or device array), laid out like it (NumPy's keep order).");

static PyObject *
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

PyDoc_STRVAR(cm_to_device_doc,
"to_device(obj, stream=0, copy=True, to=None)\n--\n\n"
"A device copy of ``obj``, or ``obj`` itself when it is device memory, or\n"
"a zero-copy view of an object with ``__cuda_array_interface__``; with\n"
"``to``, copy into it and return it.  Keeps F order and broadcast zero\n"
"strides (only the core is allocated).\n\n"
"Notes\n-----\n"
"numba rejects non-contiguous host arrays; cudamem copies them into a\n"
"C-contiguous (F-contiguous for F-ordered sources) device array.\n\n"
"Large copies of pageable host memory may go through the staging\n"
"pipeline (see the README: CUDAMEM_STAGING).  Such a copy has completed\n"
"when it returns, also an asynchronous one (issued on its stream after\n"
"the work queued there); the driver's own asynchronous copies of\n"
"pageable memory likewise return only once the host memory is consumed\n"
"or filled.");

static PyObject *
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
    return cm_to_device_impl(p[0], p[1], copy, p[3]);
}

PyDoc_STRVAR(cm_is_cuda_array_doc,
"is_cuda_array(obj)\n--\n\n"
"Whether ``obj`` has ``__cuda_array_interface__`` (not validated).");

static PyObject *
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

PyDoc_STRVAR(cm_as_cuda_array_doc,
"as_cuda_array(obj, sync=True)\n--\n\n"
"A DeviceNDArray view of ``obj``'s ``__cuda_array_interface__`` that\n"
"keeps ``obj`` alive.");

static PyObject *
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

PyDoc_STRVAR(cm_from_cai_doc,
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

static PyObject *
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

static PyObject *
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

static PyObject *
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
static PyObject *
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

static PyObject *
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

/* ------------------------------------------------------------------ */
/* Types                                                               */
/* ------------------------------------------------------------------ */

#define CM_FAST (METH_FASTCALL | METH_KEYWORDS)

static PyGetSetDef cm_base_getset[] = {
    {"shape", cm_da_get_shape, NULL, "The shape, a tuple of ints.", NULL},
    {"strides", cm_da_get_strides, NULL, "The strides in bytes.", NULL},
    {"ndim", cm_da_get_ndim, NULL, "The number of dimensions.", NULL},
    {"size", cm_da_get_size, NULL, "The number of elements.", NULL},
    {"dtype", cm_da_get_dtype, NULL, "The numpy.dtype.", NULL},
    {"itemsize", cm_da_get_itemsize, NULL, "Bytes per element.", NULL},
    {"nbytes", cm_da_get_nbytes, NULL, "itemsize * size.", NULL},
    {"alloc_size", cm_da_get_alloc_size, NULL,
     "The byte span from the lowest to the highest element.", NULL},
    {"gpu_data", cm_da_get_gpu_data, NULL,
     "The object that keeps the memory alive (None when empty).", NULL},
    {"stream", cm_da_get_stream, cm_da_set_stream,
     "The bound stream: 0 or a stream object.", NULL},
    {"device_ctypes_pointer", cm_da_get_ctypes_ptr, NULL,
     "The device address as a ctypes value.", NULL},
    {"flags", cm_da_get_flags, NULL,
     "A new dict {'C_CONTIGUOUS': bool, 'F_CONTIGUOUS': bool}.", NULL},
    {"__cuda_array_interface__", cm_da_get_cai, NULL,
     "The CUDA Array Interface (version 3), a new dict each time.\n\n"
     "Notes: numba exports strides None for broadcast arrays and stream 0\n"
     "for the default stream; cudamem exports the real strides and 1\n"
     "(legacy) or 2 (per-thread).  Structured dtypes carry 'descr'.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(cm_da_as_cuda_arg_doc,
"as_cuda_arg($self, /)\n--\n\nThe gpu_data object.");

static PyMethodDef cm_base_methods[] = {
    {"copy_to_host", (PyCFunction)(void (*)(void))cm_da_copy_to_host,
     CM_FAST, cm_da_copy_to_host_doc},
    {"copy_to_device", (PyCFunction)(void (*)(void))cm_da_copy_to_device,
     CM_FAST, cm_da_copy_to_device_doc},
    {"bind", (PyCFunction)(void (*)(void))cm_da_bind, CM_FAST,
     cm_da_bind_doc},
    {"as_cuda_arg", cm_da_as_cuda_arg, METH_NOARGS, cm_da_as_cuda_arg_doc},
    {"__dlpack__", (PyCFunction)(void (*)(void))cm_dlpack_export, CM_FAST,
     cm_dlpack_export_doc},
    {"__dlpack_device__", cm_dlpack_device, METH_NOARGS,
     cm_dlpack_device_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef cm_da_members[] = {
    {"__weaklistoffset__", Py_T_PYSSIZET, offsetof(cm_da, weakreflist),
     Py_READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(cm_base_doc,
"What device arrays and device records share: layout attributes, the\n"
"copies and the CUDA Array Interface.\n\n"
"Notes\n-----\n"
"Unlike numba's, these arrays set neither __cuda_memory__ nor\n"
"__cuda_ndarray__: numba takes those to mean one of its own arrays and\n"
"reads its internals, so a numba kernel would refuse a cudamem array.\n"
"Without them numba kernels accept cudamem arrays directly, through\n"
"__cuda_array_interface__.  cudamem recognises its arrays by type\n"
"(to_device(d) is d), and still honours a truthy __cuda_memory__ on\n"
"other objects.");

static PyType_Slot cm_base_slots[] = {
    {Py_tp_doc, (void *)cm_base_doc},
    {Py_tp_dealloc, cm_da_dealloc},
    {Py_tp_traverse, cm_da_traverse},
    {Py_tp_clear, cm_da_clear},
    {Py_tp_getset, cm_base_getset},
    {Py_tp_methods, cm_base_methods},
    {Py_tp_members, cm_da_members},
    {0, NULL},
};

static PyType_Spec cm_base_spec = {
    .name = "cudamem.DeviceNDArrayBase",
    .basicsize = sizeof(cm_da),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE
             | Py_TPFLAGS_IMMUTABLETYPE
             | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = cm_base_slots,
};

PyDoc_STRVAR(cm_da_is_c_doc,
"is_c_contiguous($self, /)\n--\n\nWhether the array is C-contiguous.");
PyDoc_STRVAR(cm_da_is_f_doc,
"is_f_contiguous($self, /)\n--\n\nWhether the array is F-contiguous.");

PyDoc_STRVAR(cm_da_get_ipc_handle_doc,
"get_ipc_handle($self, /)\n--\n\n"
"An IpcArrayHandle for this array: picklable, opened in another process\n"
"with open() or a with block (see cudamem.IpcArrayHandle).");

static PyMethodDef cm_da_methods[] = {
    {"getitem", (PyCFunction)(void (*)(void))cm_da_getitem, CM_FAST,
     cm_da_getitem_doc},
    {"setitem", (PyCFunction)(void (*)(void))cm_da_setitem, CM_FAST,
     cm_da_setitem_doc},
    {"reshape", (PyCFunction)(void (*)(void))cm_da_reshape, CM_FAST,
     cm_da_reshape_doc},
    {"ravel", (PyCFunction)(void (*)(void))cm_da_ravel, CM_FAST,
     cm_da_ravel_doc},
    {"view", cm_da_view_meth, METH_O, cm_da_view_doc},
    {"squeeze", (PyCFunction)(void (*)(void))cm_da_squeeze, CM_FAST,
     cm_da_squeeze_doc},
    {"split", (PyCFunction)(void (*)(void))cm_da_split, CM_FAST,
     cm_da_split_doc},
    {"transpose", (PyCFunction)(void (*)(void))cm_da_transpose, CM_FAST,
     cm_da_transpose_doc},
    {"is_c_contiguous", cm_da_is_c_contiguous, METH_NOARGS, cm_da_is_c_doc},
    {"is_f_contiguous", cm_da_is_f_contiguous, METH_NOARGS, cm_da_is_f_doc},
    {"__array__", (PyCFunction)(void (*)(void))cm_da_array, CM_FAST,
     cm_da_array_doc},
    {"get_ipc_handle", cm_ipc_get_handle, METH_NOARGS,
     cm_da_get_ipc_handle_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef cm_da_getset[] = {
    {"T", cm_da_get_T, NULL, "transpose()", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(cm_da_doc,
"DeviceNDArray(shape, strides, dtype, stream=0, gpu_data=None)\n--\n\n"
"An array in device memory.  Without gpu_data (and when not empty) the\n"
"byte span is allocated; with it, gpu_data's device_pointer is the\n"
"lowest byte of the span and gpu_data is kept alive.");

static PyType_Slot cm_da_slots[] = {
    {Py_tp_doc, (void *)cm_da_doc},
    {Py_tp_new, cm_da_new},
    {Py_tp_dealloc, cm_da_dealloc},
    {Py_tp_traverse, cm_da_traverse},
    {Py_tp_clear, cm_da_clear},
    {Py_tp_methods, cm_da_methods},
    {Py_tp_getset, cm_da_getset},
    {Py_mp_subscript, cm_da_subscript},
    {Py_mp_ass_subscript, cm_da_ass_subscript},
    {Py_mp_length, cm_da_length},
    {Py_sq_item, cm_da_sq_item},
    {0, NULL},
};

static PyType_Spec cm_da_spec = {
    .name = "cudamem.DeviceNDArray",
    .basicsize = sizeof(cm_da),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE
             | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = cm_da_slots,
};

static PyMethodDef cm_rec_methods[] = {
    {"getitem", (PyCFunction)(void (*)(void))cm_rec_getitem, CM_FAST,
     cm_rec_getitem_doc},
    {"setitem", (PyCFunction)(void (*)(void))cm_rec_setitem, CM_FAST,
     cm_rec_setitem_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(cm_rec_doc,
"DeviceRecord(dtype, stream=0, gpu_data=None)\n--\n\n"
"A structured scalar (0-d record) in device memory: new memory, or the\n"
"first ``dtype.itemsize`` bytes of ``gpu_data``.  Indexing by field\n"
"name reads a host scalar, a nested record view or a subarray view;\n"
"assignment writes the field.");

static PyType_Slot cm_rec_slots[] = {
    {Py_tp_doc, (void *)cm_rec_doc},
    {Py_tp_new, cm_rec_new},
    {Py_tp_dealloc, cm_da_dealloc},
    {Py_tp_traverse, cm_da_traverse},
    {Py_tp_clear, cm_da_clear},
    {Py_tp_methods, cm_rec_methods},
    {Py_mp_subscript, cm_rec_subscript},
    {Py_mp_ass_subscript, cm_rec_ass_subscript},
    {0, NULL},
};

static PyType_Spec cm_rec_spec = {
    .name = "cudamem.DeviceRecord",
    .basicsize = sizeof(cm_da),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC
             | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = cm_rec_slots,
};

static PyMethodDef cm_devicearray_functions[] = {
    {"device_array", (PyCFunction)(void (*)(void))cm_device_array, CM_FAST,
     cm_device_array_doc},
    {"device_array_like", (PyCFunction)(void (*)(void))cm_device_array_like,
     CM_FAST, cm_device_array_like_doc},
    {"to_device", (PyCFunction)(void (*)(void))cm_to_device, CM_FAST,
     cm_to_device_doc},
    {"is_cuda_array", cm_is_cuda_array, METH_O, cm_is_cuda_array_doc},
    {"as_cuda_array", (PyCFunction)(void (*)(void))cm_as_cuda_array,
     CM_FAST, cm_as_cuda_array_doc},
    {"from_cuda_array_interface",
     (PyCFunction)(void (*)(void))cm_from_cuda_array_interface, CM_FAST,
     cm_from_cai_doc},
    {NULL, NULL, 0, NULL},
};

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

PyTypeObject *
cm_make_type(PyObject *mod, PyType_Spec *spec, PyTypeObject *base)
{
    PyTypeObject *tp = (PyTypeObject *)PyType_FromModuleAndSpec(
        mod, spec, (PyObject *)base);

    if (tp == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(mod, strchr(spec->name, '.') + 1,
                              (PyObject *)tp) < 0) {
        Py_DECREF(tp);
        return NULL;
    }
    return tp;
}

int
cm_devicearray_init(PyObject *mod, cm_state *st)
{
    int i;

    for (i = 0; i < K_N_NAMES; i++) {
        cm_kw[i] = PyUnicode_InternFromString(cm_kw_text[i]);
        if (cm_kw[i] == NULL) {
            return -1;
        }
    }
    cm_str_cuda_memory = PyUnicode_InternFromString("__cuda_memory__");
    cm_str_cai = PyUnicode_InternFromString("__cuda_array_interface__");
    cm_str_sync_cfg = PyUnicode_InternFromString("CUDA_ARRAY_INTERFACE_SYNC");
    cm_zero = PyLong_FromLong(0);
    cm_three = PyLong_FromLong(3);
    cm_str_C = PyUnicode_InternFromString("C");
    if (cm_str_cuda_memory == NULL || cm_str_cai == NULL
        || cm_str_sync_cfg == NULL || cm_zero == NULL || cm_three == NULL
        || cm_str_C == NULL) {
        return -1;
    }
    st->DeviceNDArrayBase_type = cm_make_type(mod, &cm_base_spec, NULL);
    if (st->DeviceNDArrayBase_type == NULL) {
        return -1;
    }
    /* numba's class attributes: code written for numba tests them
     * (is_device_memory).  numba-cuda's kernels type arguments through
     * the CUDA Array Interface, which cudamem's arrays export. */
    if (PyDict_SetItemString(st->DeviceNDArrayBase_type->tp_dict,
                             "__cuda_memory__", Py_True) < 0
        || PyDict_SetItemString(st->DeviceNDArrayBase_type->tp_dict,
                                "__cuda_ndarray__", Py_True) < 0) {
        return -1;
    }
    PyType_Modified(st->DeviceNDArrayBase_type);
    st->DeviceNDArray_type = cm_make_type(mod, &cm_da_spec,
                                          st->DeviceNDArrayBase_type);
    if (st->DeviceNDArray_type == NULL) {
        return -1;
    }
    st->DeviceNDArray_type->tp_vectorcall = cm_da_vectorcall;
    st->DeviceRecord_type = cm_make_type(mod, &cm_rec_spec,
                                         st->DeviceNDArrayBase_type);
    if (st->DeviceRecord_type == NULL) {
        return -1;
    }
    return PyModule_AddFunctions(mod, cm_devicearray_functions);
}
