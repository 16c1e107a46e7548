/* SPDX-License-Identifier: MIT */
/*
 * kernels.c: cudamem's internal kernels.
 *
 * One operation serves element assignment with broadcasting and casting,
 * transposition, and every device-to-device copy the driver's copy calls
 * cannot express: an N-d strided copy with a cast, dst[i] = cast(src[i])
 * over a shape, with byte strides on both sides (zero strides on the
 * source broadcast it).  On a GPU it is a CUDA C kernel compiled with
 * NVRTC (nvrtc.c) per (destination type, source type) pair on first
 * use, for the device's architecture, cached on disk; on the
 * simulator the same conversion code (convert.h) runs as a host function
 * in stream order.
 *
 * Owns: a small in-memory table of loaded kernels per context.
 *
 * Locks and the GIL: no lock; the GIL guards the table.  NVRTC's
 * compilation (Py_BEGIN_ALLOW_THREADS around cm_nvrtc_compile_nogil),
 * the module's load and a kernel's first launch (lazy loading may wait
 * for the device) run without it (CM_CU_NOGIL), on local data only; the
 * table is searched again after, as it may have moved.
 */
#include "array/array.h"
#include "array/convert.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* The strided copy-and-cast kernel                                    */
/* ------------------------------------------------------------------ */

/* The kernel's parameter block; the same layout as cm_kdesc in the CUDA
 * source below. */
typedef struct {
    long long n;                       /* number of elements */
    int ndim;                          /* dimensions used */
    long long shape[CM_KMAXDIM];       /* extents */
    long long ds[CM_KMAXDIM];          /* destination byte strides */
    long long ss[CM_KMAXDIM];          /* source byte strides */
} cm_kdesc;

static const char cm_kernel_prefix[] =
    "#define CM_FN __device__ static inline\n"
    "#define CM_T_BOOL 0\n#define CM_T_I8 1\n#define CM_T_U8 2\n"
    "#define CM_T_I16 3\n#define CM_T_U16 4\n#define CM_T_I32 5\n"
    "#define CM_T_U32 6\n#define CM_T_I64 7\n#define CM_T_U64 8\n"
    "#define CM_T_F16 9\n#define CM_T_F32 10\n#define CM_T_F64 11\n"
    "#define CM_T_C64 12\n#define CM_T_C128 13\n";

static const char cm_kernel_body[] =
    "struct cm_kdesc {\n"
    "    long long n; int ndim; long long shape[32];\n"
    "    long long ds[32]; long long ss[32];\n"
    "};\n"
    "extern \"C\" __global__ void\n"
    "cm_copy_cast(unsigned char *dst, const unsigned char *src, "
    "cm_kdesc d)\n"
    "{\n"
    "    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    long long step = (long long)gridDim.x * blockDim.x;\n"
    "    for (; i < d.n; i += step) {\n"
    "        long long rem = i;\n"
    "        long long doff = 0;\n"
    "        long long soff = 0;\n"
    "        for (int k = d.ndim - 1; k >= 0; k--) {\n"
    "            long long ix = rem % d.shape[k];\n"
    "            rem /= d.shape[k];\n"
    "            doff += ix * d.ds[k];\n"
    "            soff += ix * d.ss[k];\n"
    "        }\n"
    "        CM_ELEMENT(dst + doff, src + soff);\n"
    "    }\n"
    "}\n";

/* A loaded kernel: per context generation and (dst, src, itemsize). */
typedef struct {
    unsigned long gen;      /* cm_context.gen it was loaded in */
    int dst_type;           /* CM_T_* */
    int src_type;           /* CM_T_* */
    int itemsize;           /* for CM_T_BYTES, else 0 */
    CUmodule module;        /* never unloaded: lives with the context */
    CUfunction fn;          /* cm_copy_cast */
    int launched;           /* launched once: its code is on the device */
} cm_kentry;

#define CM_KCACHE 64
static cm_kentry cm_kcache[CM_KCACHE];   /* NOTE: GIL held */
static int cm_kcache_n;

int
cm_kernel_build(cm_context *ctx, const char *src, const char *name,
                CUmodule *out)
{
    static const char *const opts[] = {"--std=c++17", "-default-device"};
    cm_nvrtc_req req;
    cm_nvrtc_result res;
    CUmodule mod = NULL;
    int status;
    int err;

    if (cm_nvrtc_ensure() < 0) {
        return -1;
    }
    memset(&req, 0, sizeof(req));
    req.src = src;
    req.name = name;
    req.major = ctx->device->cc_major;
    req.minor = ctx->device->cc_minor;
    req.n_opts = 2;
    req.opts = opts;
    Py_BEGIN_ALLOW_THREADS
    status = cm_nvrtc_compile_nogil(&req, &res);
    Py_END_ALLOW_THREADS
    if (status != CM_NVRTC_OK) {
        if (status == CM_NVRTC_ENOMEM) {
            PyErr_NoMemory();
        }
        else {
            PyErr_Format(PyExc_RuntimeError,
                         "NVRTC failed (%s) compiling %s:\n%s",
                         res.error != NULL ? res.error : "?", req.name,
                         res.log != NULL ? res.log : "");
        }
        cm_nvrtc_result_clear(&res, 0);
        return -1;
    }
    CM_CU_NOGIL(err, ModuleLoadData, (&mod, res.image));
    cm_nvrtc_result_clear(&res, 0);
    if (err < 0) {
        return -1;
    }
    *out = mod;
    return 0;
}

/* The kernel for this conversion in ctx (current), and in *launched
 * whether it was launched before; 0 or -1. */
static int
cm_kernel_get(cm_context *ctx, int dst_t, int src_t, int itemsize,
              CUfunction *out, int *launched)
{
    cm_kentry *e;
    char *src = NULL;
    char defs[160];
    size_t n;
    int i;
    CUmodule mod = NULL;
    CUfunction fn = NULL;

    for (i = 0; i < cm_kcache_n; i++) {
        e = &cm_kcache[i];
        if (e->gen == ctx->gen && e->dst_type == dst_t
            && e->src_type == src_t && e->itemsize == itemsize) {
            *out = e->fn;
            *launched = e->launched;
            return 0;
        }
    }
    if (dst_t == CM_T_BYTES) {
        snprintf(defs, sizeof(defs),
                 "#define CM_ELEMENT(dp, sp) for (int b_ = 0; b_ < %d; "
                 "b_++) { (dp)[b_] = (sp)[b_]; }\n", itemsize);
    }
    else {
        snprintf(defs, sizeof(defs),
                 "#define CM_ELEMENT(dp, sp) cm_store(%d, (dp), "
                 "cm_load(%d, (sp)))\n", dst_t, src_t);
    }
    n = strlen(cm_kernel_prefix) + strlen(cm_convert_src) + strlen(defs)
        + strlen(cm_kernel_body) + 4;
    src = malloc(n);
    if (src == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    snprintf(src, n, "%s%s\n%s%s", cm_kernel_prefix, cm_convert_src, defs,
             cm_kernel_body);
    i = cm_kernel_build(ctx, src, "cudamem_copy_cast.cu", &mod);
    free(src);
    if (i < 0) {
        return -1;
    }
    if (CM_CU(ModuleGetFunction, (&fn, mod, "cm_copy_cast")) < 0) {
        (void)CM_CU_RAW(ModuleUnload, (mod));
        return -1;
    }
    if (cm_kcache_n == CM_KCACHE) {
        /* Forget the oldest; its module stays loaded with its context. */
        memmove(cm_kcache, cm_kcache + 1,
                (CM_KCACHE - 1) * sizeof(cm_kentry));
        cm_kcache_n--;
    }
    e = &cm_kcache[cm_kcache_n++];
    e->gen = ctx->gen;
    e->dst_type = dst_t;
    e->src_type = src_t;
    e->itemsize = itemsize;
    e->module = mod;
    e->fn = fn;
    e->launched = 0;
    *out = fn;
    *launched = 0;
    return 0;
}

/* The simulator's copy: a host function run in stream order. */
typedef struct {
    cm_kdesc k;            /* extents and strides */
    unsigned char *dst;    /* destination element (0, ..., 0) */
    const unsigned char *src;  /* source element (0, ..., 0) */
    int dst_type;          /* CM_T_* */
    int src_type;          /* CM_T_* */
    int itemsize;          /* for CM_T_BYTES */
} cm_host_copy;

static void CUDA_CB
cm_host_copy_run(void *arg)
{
    cm_host_copy *c = arg;
    long long i;
    long long rem;
    long long doff;
    long long soff;
    long long ix;
    int k;

    for (i = 0; i < c->k.n; i++) {
        rem = i;
        doff = 0;
        soff = 0;
        for (k = c->k.ndim - 1; k >= 0; k--) {
            ix = rem % c->k.shape[k];
            rem /= c->k.shape[k];
            doff += ix * c->k.ds[k];
            soff += ix * c->k.ss[k];
        }
        if (c->dst_type == CM_T_BYTES) {
            memcpy(c->dst + doff, c->src + soff, (size_t)c->itemsize);
        }
        else {
            cm_store(c->dst_type, c->dst + doff,
                     cm_load(c->src_type, c->src + soff));
        }
    }
}

/* The bytes one element of a CM_T_* type occupies. */
static size_t
cm_elem_size(int t, int itemsize)
{
    switch (t) {
    case CM_T_BYTES: return (size_t)itemsize;
    case CM_T_BOOL: case CM_T_I8: case CM_T_U8: return 1;
    case CM_T_I16: case CM_T_U16: case CM_T_F16: return 2;
    case CM_T_I32: case CM_T_U32: case CM_T_F32: return 4;
    case CM_T_C128: return 16;
    default: return 8;
    }
}

/* The bytes one side of k touches: [*start, *start + *len), from the
 * element (0, ..., 0) at p with byte strides st.  0, or -1 when the
 * range does not fit in the address space. */
static int
cm_side_range(const cm_kdesc *k, const long long *st, CUdeviceptr p,
              size_t elem, uintptr_t *start, size_t *len)
{
    long long lo = 0;
    long long hi = (long long)elem;
    long long reach;
    int i;

    for (i = 0; i < k->ndim; i++) {
        if (__builtin_mul_overflow(k->shape[i] - 1, st[i], &reach)
            || (reach < 0 ? __builtin_add_overflow(lo, reach, &lo)
                          : __builtin_add_overflow(hi, reach, &hi))) {
            return -1;
        }
    }
    if (0ULL - (unsigned long long)lo > p
        || (unsigned long long)hi - (unsigned long long)lo
               > UINTPTR_MAX - (p + (unsigned long long)lo)) {
        return -1;
    }
    *start = (uintptr_t)(p + (unsigned long long)lo);
    *len = (size_t)((unsigned long long)hi - (unsigned long long)lo);
    return 0;
}

/* Queue c on the simulator once both of its ranges are known to lie in
 * live allocations (the driver's answer otherwise); 0 or -1. */
static int
cm_host_copy_launch(cm_host_copy *c, CUstream stream)
{
    uintptr_t start[2];
    size_t len[2];
    CUresult rc;

    if (cm_side_range(&c->k, c->k.ds, (CUdeviceptr)(uintptr_t)c->dst,
                      cm_elem_size(c->dst_type, c->itemsize), &start[0],
                      &len[0]) < 0
        || cm_side_range(&c->k, c->k.ss, (CUdeviceptr)(uintptr_t)c->src,
                         cm_elem_size(c->src_type, c->itemsize), &start[1],
                         &len[1]) < 0) {
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    else {
        /* The simulator runs (and a capture records) its own copy of c. */
        rc = CM_GIL_YIELD(cm_cu.sim_launch_checked(stream,
                                                   cm_host_copy_run, c,
                                                   sizeof(*c), 2, start,
                                                   len));
    }
    return cm_cu_check(rc, "cuLaunchHostFunc");
}

int
cm_copy_kernel(cm_context *ctx, const cm_copy_desc *d, CUstream stream)
{
    cm_kdesc k;
    CUfunction fn;
    CUdeviceptr dst = d->dst;
    CUdeviceptr src = d->src;
    void *params[3];
    long long blocks;
    CUcontext prev;
    int rc = -1;
    int launched = 0;
    int i;

    if (d->ndim < 0 || d->ndim > CM_KMAXDIM) {
        PyErr_Format(PyExc_ValueError,
                     "arrays of more than %d dimensions cannot be copied "
                     "on the device", CM_KMAXDIM);
        return -1;
    }
    if ((d->dst_type == CM_T_BYTES) != (d->src_type == CM_T_BYTES)
        || (d->dst_type == CM_T_BYTES && d->itemsize <= 0)) {
        PyErr_SetString(PyExc_TypeError,
                        "cannot convert between a structured or opaque "
                        "dtype and a numeric one");
        return -1;
    }
    memset(&k, 0, sizeof(k));
    k.n = 1;
    k.ndim = d->ndim;
    for (i = 0; i < d->ndim; i++) {
        k.shape[i] = d->shape[i];
        k.ds[i] = d->dst_strides[i];
        k.ss[i] = d->src_strides[i];
        k.n *= d->shape[i];
    }
    if (k.n == 0) {
        return 0;
    }
    if (cm_context_enter(ctx, &prev) < 0) {
        return -1;
    }
    if (cm_driver_backend() == CM_BACKEND_SIM) {
        cm_host_copy *c = malloc(sizeof(*c));

        if (c == NULL) {
            PyErr_NoMemory();
            goto out_leave;
        }
        c->k = k;
        c->dst = (unsigned char *)(uintptr_t)dst;
        c->src = (const unsigned char *)(uintptr_t)src;
        c->dst_type = d->dst_type;
        c->src_type = d->src_type;
        c->itemsize = d->itemsize;
        rc = cm_host_copy_launch(c, stream);
        free(c);
        goto out_leave;
    }
    if (cm_kernel_get(ctx, d->dst_type, d->src_type,
                      d->dst_type == CM_T_BYTES ? d->itemsize : 0,
                      &fn, &launched) < 0) {
        goto out_leave;
    }
    params[0] = &dst;
    params[1] = &src;
    params[2] = &k;
    blocks = (k.n + 255) / 256;
    if (blocks > 65535) {
        blocks = 65535;
    }
    if (launched) {
        rc = CM_CU(LaunchKernel, (fn, (unsigned int)blocks, 1, 1, 256, 1,
                                  1, 0, stream, params, NULL));
    }
    else {
        /* The first launch loads the kernel's code (lazy loading), which
         * can wait for the device and so for a host callback that needs
         * the GIL: it runs without it. */
        CM_CU_NOGIL(rc, LaunchKernel, (fn, (unsigned int)blocks, 1, 1, 256,
                                       1, 1, 0, stream, params, NULL));
        /* Found again: the cache may have moved meanwhile. */
        for (i = 0; rc == 0 && i < cm_kcache_n; i++) {
            if (cm_kcache[i].fn == fn) {
                cm_kcache[i].launched = 1;
            }
        }
    }
out_leave:
    cm_context_leave(ctx, prev);
    return rc;
}

int
cm_elem_type_of(PyArray_Descr *dt)
{
    if (!PyArray_ISNBO(dt->byteorder)) {
        return CM_T_BYTES;
    }
    switch (dt->type_num) {
    case NPY_BOOL: return CM_T_BOOL;
    case NPY_BYTE: return CM_T_I8;
    case NPY_UBYTE: return CM_T_U8;
    case NPY_SHORT: return CM_T_I16;
    case NPY_USHORT: return CM_T_U16;
    case NPY_HALF: return CM_T_F16;
    case NPY_FLOAT: return CM_T_F32;
    case NPY_DOUBLE: return CM_T_F64;
    case NPY_CFLOAT: return CM_T_C64;
    case NPY_CDOUBLE: return CM_T_C128;
    default: break;
    }
    if (PyTypeNum_ISINTEGER(dt->type_num)) {
        int size = (int)PyDataType_ELSIZE(dt);
        int sgn = PyTypeNum_ISSIGNED(dt->type_num);

        switch (size) {
        case 1: return sgn ? CM_T_I8 : CM_T_U8;
        case 2: return sgn ? CM_T_I16 : CM_T_U16;
        case 4: return sgn ? CM_T_I32 : CM_T_U32;
        case 8: return sgn ? CM_T_I64 : CM_T_U64;
        default: break;
        }
    }
    return CM_T_BYTES;
}

int
cm_kernels_init(PyObject *mod, cm_state *st)
{
    (void)mod;
    (void)st;
    return 0;
}
