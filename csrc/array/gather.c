/* SPDX-License-Identifier: MIT */
/*
 * array/gather.c: the internal kernels of NumPy's advanced indexing on
 * device arrays (cudamem/_index.py plans an indexing operation; these
 * run it, stream-ordered on the array's stream).
 *
 * Four kernels, in one CUDA C program compiled with NVRTC (nvrtc.c, its
 * disk cache) once per context, as the copy kernel of kernels.c is; on
 * the simulator the same element code (ixcode.h) runs as host functions
 * in stream order, queued only once every range they touch is known to
 * lie in live allocations:
 * - cm_ix_run: gather (result <- array) or scatter (array <- value)
 *   through up to 8 broadcast index sources; integer indices are
 *   bounds-checked on the device, a bad one flagged, never followed;
 * - cm_ixm_count, cm_ixm_scan, cm_ixm_write: a device boolean mask's
 *   nonzero elements as byte offsets into the array, in C order (a count
 *   per chunk of 4096 elements, a block of 256 threads a chunk and 16
 *   elements a thread, one 16-byte load where the mask is contiguous; an
 *   exclusive scan of the counts by one block; then the write, each
 *   thread from its place in its block's prefix sum).  The count is read
 *   back: the one host synchronisation a device mask costs.
 *
 * Owns: a small table of loaded programs per context (GIL-guarded).
 *
 * Locks and the GIL: no lock; the GIL guards the table.  Compilation
 * (kernels.c's cm_kernel_build), the first launch of a program (lazy
 * loading may wait for the device) and the read-backs of the error flag
 * and the mask's count (CM_CU_NOGIL) run without it, touching only C
 * locals; the table is searched again after, as it may have moved.
 */
#include "array/devicearray.h"

#include <stdlib.h>
#include <string.h>

#ifndef CM_FN
#define CM_FN static inline
#endif
/* The host runs one element at a time: the first flag wins. */
#define CM_IX_FLAG(err, axis, value)                                   \
    do {                                                               \
        if ((err)[0] == 0) {                                           \
            (err)[0] = (unsigned long long)(axis);                     \
            (err)[1] = (unsigned long long)(value);                    \
        }                                                              \
    } while (0)

#include "array/ixcode.h"

#define CM_IX_MAXDIM 32
#define CM_IX_MAXSRC 8
#define CM_IX_MAXB 16
#define CM_IX_OFF_ARRAY 20
#define CM_IX_OFF_OTHER 21
#define CM_IXM_CHUNK 4096    /* mask elements per block: 256 x 16 */

_Static_assert(sizeof(cm_ixdesc) + 3 * sizeof(void *) <= 4096,
               "the kernel's parameters fit the classic 4 KiB limit");

/* ------------------------------------------------------------------ */
/* The CUDA C program                                                  */
/* ------------------------------------------------------------------ */

static const char cm_ix_prefix[] =
    "#define CM_FN __device__ static inline\n"
    "#define CM_IX_FLAG(err, axis, value) do { if (atomicCAS((err), 0ULL, "
    "(unsigned long long)(axis)) == 0ULL) { (err)[1] = "
    "(unsigned long long)(value); } } while (0)\n"
    "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700\n"
    "#define CM_GRID_CONST __grid_constant__\n"
    "#else\n"
    "#define CM_GRID_CONST\n"
    "#endif\n";

static const char cm_ix_kernels[] =
    "extern \"C\" __global__ void\n"
    "cm_ix_run(unsigned char *arr, unsigned char *other,\n"
    "          unsigned long long *err, const CM_GRID_CONST cm_ixdesc d)\n"
    "{\n"
    "    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    long long step = (long long)gridDim.x * blockDim.x;\n"
    "    for (; i < d.n; i += step) {\n"
    "        cm_ix_element(arr, other, err, &d, i);\n"
    "    }\n"
    "}\n"
    /* The mask kernels run blocks of 256 threads, a block a chunk of
     * 4096 elements, 16 a thread.  cm_ixm_scan_block: a block's
     * exclusive prefix sum of v, its total in *total. */
    "__device__ static long long\n"
    "cm_ixm_scan_block(long long v, long long *warps, long long *total)\n"
    "{\n"
    "    int lane = threadIdx.x & 31;\n"
    "    int w = threadIdx.x >> 5;\n"
    "    long long x = v;\n"
    "    long long y;\n"
    "    for (int d = 1; d < 32; d <<= 1) {\n"
    "        y = __shfl_up_sync(0xffffffffu, x, d);\n"
    "        if (lane >= d) {\n"
    "            x += y;\n"
    "        }\n"
    "    }\n"
    "    if (lane == 31) {\n"
    "        warps[w] = x;\n"
    "    }\n"
    "    __syncthreads();\n"
    "    if (w == 0) {\n"
    "        long long s = lane < 8 ? warps[lane] : 0;\n"
    "        for (int d = 1; d < 8; d <<= 1) {\n"
    "            y = __shfl_up_sync(0xffffffffu, s, d);\n"
    "            if (lane >= d) {\n"
    "                s += y;\n"
    "            }\n"
    "        }\n"
    "        if (lane < 8) {\n"
    "            warps[lane] = s;\n"
    "        }\n"
    "    }\n"
    "    __syncthreads();\n"
    "    y = (w > 0 ? warps[w - 1] : 0) + x - v;\n"
    "    *total = warps[7];\n"
    "    __syncthreads();\n"
    "    return y;\n"
    "}\n"
    /* cm_ixm_bits, with one 16-byte load where the mask is contiguous
     * there: a byte's top bit set when it is nonzero, then gathered. */
    "__device__ static unsigned int\n"
    "cm_ixm_nz4(unsigned int x)\n"
    "{\n"
    "    unsigned int t = (((x & 0x7f7f7f7fu) + 0x7f7f7f7fu) | x)"
    " & 0x80808080u;\n"
    "    return ((t >> 7) & 1u) | ((t >> 14) & 2u) | ((t >> 21) & 4u)"
    " | ((t >> 28) & 8u);\n"
    "}\n"
    "__device__ static unsigned int\n"
    "cm_ixm_bits_dev(const unsigned char *mask, const cm_ixmdesc *m,\n"
    "                long long e0)\n"
    "{\n"
    "    if (m->ndim == 1 && m->ms[0] == 1 && e0 + 16 <= m->n\n"
    "        && ((unsigned long long)(mask + e0) & 15ull) == 0) {\n"
    "        uint4 v = *(const uint4 *)(mask + e0);\n"
    "        return cm_ixm_nz4(v.x) | (cm_ixm_nz4(v.y) << 4)\n"
    "               | (cm_ixm_nz4(v.z) << 8) | (cm_ixm_nz4(v.w) << 12);\n"
    "    }\n"
    "    return cm_ixm_bits(mask, m, e0);\n"
    "}\n"
    "extern \"C\" __global__ void\n"
    "cm_ixm_count(const unsigned char *mask, long long *counts,\n"
    "             const CM_GRID_CONST cm_ixmdesc m)\n"
    "{\n"
    "    __shared__ long long warps[8];\n"
    "    long long total;\n"
    "    for (long long c = blockIdx.x; c < m.nchunks; c += gridDim.x) {\n"
    "        unsigned int bits = cm_ixm_bits_dev(\n"
    "            mask, &m, c * m.chunk + 16LL * threadIdx.x);\n"
    "        (void)cm_ixm_scan_block(__popc(bits), warps, &total);\n"
    "        if (threadIdx.x == 0) {\n"
    "            counts[c] = total;\n"
    "        }\n"
    "    }\n"
    "}\n"
    /* One block: each thread sums a run of the counts, the block scans
     * the sums, each writes its run's exclusive prefix. */
    "extern \"C\" __global__ void\n"
    "cm_ixm_scan(long long *counts, long long nchunks)\n"
    "{\n"
    "    __shared__ long long warps[8];\n"
    "    long long per = (nchunks + 255) / 256;\n"
    "    long long lo = (long long)threadIdx.x * per;\n"
    "    long long hi = lo + per < nchunks ? lo + per : nchunks;\n"
    "    long long s = 0;\n"
    "    long long total;\n"
    "    long long t;\n"
    "    if (blockIdx.x != 0) {\n"
    "        return;\n"
    "    }\n"
    "    for (long long c = lo; c < hi; c++) {\n"
    "        s += counts[c];\n"
    "    }\n"
    "    s = cm_ixm_scan_block(s, warps, &total);\n"
    "    if (threadIdx.x == 0) {\n"
    "        counts[nchunks] = total;\n"
    "    }\n"
    "    for (long long c = lo; c < hi; c++) {\n"
    "        t = counts[c];\n"
    "        counts[c] = s;\n"
    "        s += t;\n"
    "    }\n"
    "}\n"
    "extern \"C\" __global__ void\n"
    "cm_ixm_write(const unsigned char *mask, const long long *counts,\n"
    "             long long *out, const CM_GRID_CONST cm_ixmdesc m)\n"
    "{\n"
    "    __shared__ long long warps[8];\n"
    "    long long total;\n"
    "    for (long long c = blockIdx.x; c < m.nchunks; c += gridDim.x) {\n"
    "        long long e0 = c * m.chunk + 16LL * threadIdx.x;\n"
    "        unsigned int bits = cm_ixm_bits_dev(mask, &m, e0);\n"
    "        long long pos = counts[c]\n"
    "            + cm_ixm_scan_block(__popc(bits), warps, &total);\n"
    "        cm_ixm_put(out, pos, bits, &m, e0);\n"
    "    }\n"
    "}\n";

enum { CM_IXK_RUN, CM_IXK_COUNT, CM_IXK_SCAN, CM_IXK_WRITE, CM_IXK_N };

static const char *const cm_ixk_names[CM_IXK_N] = {
    "cm_ix_run", "cm_ixm_count", "cm_ixm_scan", "cm_ixm_write",
};

/* The program loaded in one context generation. */
typedef struct {
    unsigned long gen;          /* cm_context.gen it was loaded in */
    CUmodule module;            /* never unloaded: lives with the context */
    CUfunction fn[CM_IXK_N];    /* its kernels */
    int launched[CM_IXK_N];     /* launched once: its code is loaded */
} cm_ixprog;

#define CM_IXPROG_MAX 8
static cm_ixprog cm_ixprogs[CM_IXPROG_MAX];   /* NOTE: GIL held */
static int cm_ixprogs_n;

/* The whole program's source text; malloc'd, or NULL (no memory). */
static char *
cm_ix_source(void)
{
    size_t n = strlen(cm_ix_prefix) + strlen(cm_ixcode_src)
               + strlen(cm_ix_kernels) + 4;
    char *src = malloc(n);

    if (src != NULL) {
        snprintf(src, n, "%s%s\n%s", cm_ix_prefix, cm_ixcode_src,
                 cm_ix_kernels);
    }
    return src;
}

/* The program of ctx (current), loaded on first use; NULL with an
 * exception. */
static cm_ixprog *
cm_ix_program(cm_context *ctx)
{
    cm_ixprog *p;
    CUmodule mod = NULL;
    CUfunction fn[CM_IXK_N];
    char *src;
    int rc;
    int i;

    for (i = 0; i < cm_ixprogs_n; i++) {
        if (cm_ixprogs[i].gen == ctx->gen) {
            return &cm_ixprogs[i];
        }
    }
    src = cm_ix_source();
    if (src == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    rc = cm_kernel_build(ctx, src, "cudamem_index.cu", &mod);
    free(src);
    if (rc < 0) {
        return NULL;
    }
    for (i = 0; i < CM_IXK_N; i++) {
        if (CM_CU(ModuleGetFunction, (&fn[i], mod, cm_ixk_names[i])) < 0) {
            (void)CM_CU_RAW(ModuleUnload, (mod));
            return NULL;
        }
    }
    if (cm_ixprogs_n == CM_IXPROG_MAX) {
        /* Forget the oldest; its module stays loaded with its context. */
        memmove(cm_ixprogs, cm_ixprogs + 1,
                (CM_IXPROG_MAX - 1) * sizeof(cm_ixprog));
        cm_ixprogs_n--;
    }
    p = &cm_ixprogs[cm_ixprogs_n++];
    memset(p, 0, sizeof(*p));
    p->gen = ctx->gen;
    p->module = mod;
    memcpy(p->fn, fn, sizeof(fn));
    return p;
}

/* Launch kernel k of ctx's program (ctx current) over `threads` threads
 * on stream; 0 or -1. */
static int
cm_ix_launch(cm_context *ctx, int k, long long threads, void **params,
             CUstream stream)
{
    cm_ixprog *p = cm_ix_program(ctx);
    unsigned long gen = ctx->gen;
    long long blocks = (threads + 255) / 256;
    CUfunction fn;
    int rc;
    int i;

    if (p == NULL) {
        return -1;
    }
    if (blocks < 1) {
        blocks = 1;
    }
    if (blocks > (1LL << 20)) {
        blocks = 1LL << 20;      /* the loops stride over the rest */
    }
    fn = p->fn[k];
    if (p->launched[k]) {
        return CM_CU(LaunchKernel, (fn, (unsigned int)blocks, 1, 1, 256, 1,
                                    1, 0, stream, params, NULL));
    }
    /* The first launch loads the kernel's code (lazy loading), which can
     * wait for the device and so for a host callback that needs the GIL:
     * it runs without it. */
    CM_CU_NOGIL(rc, LaunchKernel, (fn, (unsigned int)blocks, 1, 1, 256, 1,
                                   1, 0, stream, params, NULL));
    /* Found again: the table may have moved meanwhile. */
    for (i = 0; rc == 0 && i < cm_ixprogs_n; i++) {
        if (cm_ixprogs[i].gen == gen) {
            cm_ixprogs[i].launched[k] = 1;
        }
    }
    return rc;
}

/* ------------------------------------------------------------------ */
/* The simulator's host functions                                      */
/* ------------------------------------------------------------------ */

/* What one host function runs (freed by it). */
typedef struct {
    int kind;                   /* CM_IXK_* */
    cm_ixdesc d;                /* cm_ix_run */
    cm_ixmdesc m;               /* the mask kernels */
    unsigned char *arr;         /* array side / the mask */
    unsigned char *other;       /* other side */
    unsigned long long *err;    /* flag, or NULL */
    long long *counts;          /* chunk counts (nchunks + 1) */
    long long *out;             /* mask offsets */
} cm_ixhost;

static void CUDA_CB
cm_ixhost_run(void *arg)
{
    cm_ixhost *h = arg;
    unsigned int bits;
    long long i;
    long long e0;
    long long s = 0;
    long long t;

    switch (h->kind) {
    case CM_IXK_RUN:
        for (i = 0; i < h->d.n; i++) {
            cm_ix_element(h->arr, h->other, h->err, &h->d, i);
        }
        break;
    case CM_IXK_COUNT:
        /* the kernels' threads in turn: 16 elements each */
        for (i = 0; i < h->m.nchunks; i++) {
            s = 0;
            for (e0 = i * h->m.chunk; e0 < (i + 1) * h->m.chunk
                                      && e0 < h->m.n; e0 += 16) {
                s += __builtin_popcount(cm_ixm_bits(h->arr, &h->m, e0));
            }
            h->counts[i] = s;
        }
        break;
    case CM_IXK_SCAN:
        for (i = 0; i < h->m.nchunks; i++) {
            t = h->counts[i];
            h->counts[i] = s;
            s += t;
        }
        h->counts[h->m.nchunks] = s;
        break;
    default:
        for (i = 0; i < h->m.nchunks; i++) {
            s = h->counts[i];
            for (e0 = i * h->m.chunk; e0 < (i + 1) * h->m.chunk
                                      && e0 < h->m.n; e0 += 16) {
                bits = cm_ixm_bits(h->arr, &h->m, e0);
                cm_ixm_put(h->out, s, bits, &h->m, e0);
                s += __builtin_popcount(bits);
            }
        }
        break;
    }
    free(h);
}

/* Queue h on stream once its n ranges lie in live allocations; frees h
 * when it cannot be queued.  0 or -1. */
static int
cm_ixhost_queue(cm_ixhost *h, CUstream stream, int n,
                const uintptr_t *start, const size_t *len)
{
    CUresult rc = CM_GIL_YIELD(cm_cu.sim_launch_checked(stream,
                                                        cm_ixhost_run, h, 0,
                                                        n, start, len));

    if (rc != CUDA_SUCCESS) {
        free(h);
    }
    return cm_cu_check(rc, "cuLaunchHostFunc");
}

/* ------------------------------------------------------------------ */
/* Flag words                                                          */
/* ------------------------------------------------------------------ */

/* Where a kernel that checks device-held indices reports a bad one: a
 * word pair in page-locked host memory that the device maps, so that no
 * memset and no copy back is needed (the host clears it before the
 * launch and reads it after the stream is done).  One page per context
 * generation, its pairs taken and given back with the GIL held. */
#define CM_IXF_PAIRS 256
#define CM_IXF_PAGES 8

typedef struct {
    unsigned long gen;          /* the context's gen; 0: empty */
    unsigned long long *host;   /* CM_IXF_PAIRS pairs */
    CUdeviceptr dev;            /* the same, on the device */
    unsigned char busy[CM_IXF_PAIRS];   /* NOTE: GIL held */
} cm_ixflags;

static cm_ixflags cm_ixf[CM_IXF_PAGES];     /* NOTE: GIL held */

/* A cleared flag pair of ctx (current): its slot in *slot, its host and
 * device addresses; 0, or -1 when none can be had (no exception: the
 * caller uses a device word instead). */
static int
cm_ixf_take(cm_context *ctx, int *page, int *slot,
            unsigned long long **host, CUdeviceptr *dev)
{
    cm_ixflags *f = NULL;
    void *buf = NULL;
    CUdeviceptr d = 0;
    CUresult rc;
    int i;

    if (cm_forked) {
        return -1;
    }
    for (i = 0; i < CM_IXF_PAGES; i++) {
        if (cm_ixf[i].gen != 0 && cm_ixf[i].gen != ctx->gen
            && !cm_context_gen_live(cm_ixf[i].gen)) {
            cm_ixf[i].gen = 0;     /* gone with its context */
        }
        if (cm_ixf[i].gen == ctx->gen) {
            f = &cm_ixf[i];
            break;
        }
    }
    if (f == NULL) {
        for (i = 0; i < CM_IXF_PAGES && cm_ixf[i].gen != 0; i++) {
        }
        if (i == CM_IXF_PAGES) {
            return -1;
        }
        rc = CM_CU_RAW(MemHostAlloc, (&buf, CM_IXF_PAIRS * 16,
                                      CU_MEMHOSTALLOC_DEVICEMAP
                                      | CU_MEMHOSTALLOC_PORTABLE));
        if (rc == CUDA_SUCCESS) {
            rc = CM_CU_RAW(MemHostGetDevicePointer, (&d, buf, 0));
            if (rc != CUDA_SUCCESS) {
                (void)CM_CU_RAW(MemFreeHost, (buf));
            }
        }
        /* The GIL may have been released meanwhile: is the page free? */
        if (rc != CUDA_SUCCESS || cm_ixf[i].gen != 0) {
            if (rc == CUDA_SUCCESS) {
                (void)CM_CU_RAW(MemFreeHost, (buf));
            }
            return -1;
        }
        f = &cm_ixf[i];
        f->gen = ctx->gen;
        f->host = buf;
        f->dev = d;
        memset(f->busy, 0, sizeof(f->busy));
    }
    for (i = 0; i < CM_IXF_PAIRS && f->busy[i]; i++) {
    }
    if (i == CM_IXF_PAIRS) {
        return -1;
    }
    f->busy[i] = 1;
    *page = (int)(f - cm_ixf);
    *slot = i;
    *host = f->host + 2 * i;
    *dev = f->dev + (CUdeviceptr)(16 * i);
    (*host)[0] = 0;
    (*host)[1] = 0;
    return 0;
}

/* Give a pair back (its kernel has run, or never will). */
static void
cm_ixf_give(int page, int slot)
{
    cm_ixf[page].busy[slot] = 0;
}

/* ------------------------------------------------------------------ */
/* Arguments                                                           */
/* ------------------------------------------------------------------ */

/* A tuple of n ints (n <= max) into v; n or -1 with an exception. */
static int
cm_ix_ints(PyObject *t, const char *what, int max, long long *v)
{
    Py_ssize_t n;
    Py_ssize_t i;

    if (!PyTuple_Check(t) || (n = PyTuple_GET_SIZE(t)) > max) {
        PyErr_Format(PyExc_ValueError, "%s: a tuple of at most %d ints",
                     what, max);
        return -1;
    }
    for (i = 0; i < n; i++) {
        v[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(t, i));
        if (v[i] == -1 && PyErr_Occurred()) {
            return -1;
        }
    }
    return (int)n;
}

/* A live device array argument (borrowed), or NULL with an exception. */
static cm_da *
cm_ix_array(PyObject *o, const char *what)
{
    if (!cm_da_check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be a device array", what);
        return NULL;
    }
    return cm_da_alive((cm_da *)o) < 0 ? NULL : (cm_da *)o;
}

/* The bytes of [p + lo, p + hi) that an element of size elem at p,
 * walked over shape with byte strides st, touches. */
static void
cm_ix_range(CUdeviceptr p, int n, const long long *shape,
            const long long *st, long long elem, uintptr_t *start,
            size_t *len)
{
    long long lo = 0;
    long long hi = elem;
    int i;

    for (i = 0; i < n; i++) {
        if (shape[i] == 0) {
            *start = (uintptr_t)p;
            *len = 0;
            return;
        }
        if (st[i] < 0) {
            lo += (shape[i] - 1) * st[i];
        }
        else {
            hi += (shape[i] - 1) * st[i];
        }
    }
    *start = (uintptr_t)((long long)p + lo);
    *len = (size_t)(hi - lo);
}

/* The largest unit (8, 4, 2 or 1 bytes) dividing every value. */
static int
cm_ix_unit(const long long *v, int n)
{
    unsigned long long bits = 8;
    int i;

    for (i = 0; i < n; i++) {
        bits |= (unsigned long long)v[i];
    }
    return (int)(bits & (~bits + 1));
}

/* The array's memory as the kernel reads or writes it: [*start, +*len). */
static void
cm_ix_span(cm_da *a, uintptr_t *start, size_t *len)
{
    *start = (uintptr_t)((long long)a->ptr + a->lo);
    *len = (size_t)a->alloc_size;
}

/* ------------------------------------------------------------------ */
/* _ix_run                                                             */
/* ------------------------------------------------------------------ */

PyDoc_STRVAR(cm_ix_run_doc,
"_ix_run(arr, other, aoff, shape, astrides, ostrides, bpos, sources, "
"scatter, check, stream)\n--\n\n"
"Run one planned indexing operation (cudamem._index plans it): over "
"the iteration space `shape`, element i moves between the array (its "
"element (0, ..., 0) plus aoff bytes, astrides) and `other` (ostrides): "
"other <- arr, or arr <- other with scatter.  Dimensions [bpos, bpos + "
"nb) are walked by the index sources, each a tuple (type, array, len, "
"axis, astride, bstrides): integer indices of the dtype's width "
"(type 1..8) bounds-checked against len and stepping astride bytes, or "
"int64 byte offsets into the array (20) or the other side (21).  "
"Stream-ordered on the effective stream; waits for it when there is "
"none, or with check (integer indices held on the device: a bad one "
"raises IndexError with NumPy's message after the kernel ran, and was "
"never followed).");

/* Run d between arr (its element (0, ..., 0) at abase) and other (at
 * obase), srcs being the index sources' arrays, on h (of ctx, current):
 * the kernel, or the simulator's host function.  check: read back the
 * flag of device-held indices (waiting for h) and raise NumPy's
 * IndexError for a bad one; without it, wait only when synchronous.
 * Notes the uses of every array when async.  0 or -1. */
static int
cm_ix_exec(cm_context *ctx, cm_ixdesc *d, cm_da *arr, CUdeviceptr abase,
           cm_da *other, CUdeviceptr obase, cm_da *const *srcs, int check,
           CUstream h, int async, PyObject *sobj)
{
    uintptr_t rs[CM_IX_MAXSRC + 3];
    size_t rl[CM_IX_MAXSRC + 3];
    unsigned long long word[2] = {0, 0};
    unsigned long long *flag = word;
    PyObject *errown = NULL;
    CUdeviceptr errp = 0;
    void *params[4];
    long long itemsize = (long long)d->unit * d->nunits;
    int page = -1;
    int slot = -1;
    int rc = -1;
    int n;
    int j;

    if (check && cm_ixf_take(ctx, &page, &slot, &flag, &errp) < 0) {
        /* No mapped pair: a device word, cleared and read back. */
        flag = word;
        errown = cm_mem_alloc_on(ctx, 16, async ? h : NULL, &errp);
        if (errown == NULL || CM_CU(MemsetD8Async, (errp, 0, 16, h)) < 0) {
            goto out;
        }
    }
    if (cm_driver_backend() == CM_BACKEND_SIM) {
        cm_ixhost *hf = malloc(sizeof(*hf));

        if (hf == NULL) {
            PyErr_NoMemory();
            goto out;
        }
        hf->kind = CM_IXK_RUN;
        hf->d = *d;
        hf->arr = (unsigned char *)(uintptr_t)abase;
        hf->other = (unsigned char *)(uintptr_t)obase;
        hf->err = (unsigned long long *)(uintptr_t)errp;
        n = 0;
        cm_ix_span(arr, &rs[n], &rl[n]);
        n++;
        cm_ix_range(obase, d->ndim, d->shape, d->os, itemsize, &rs[n],
                    &rl[n]);
        n++;
        for (j = 0; j < d->nsrc; j++) {
            cm_ix_span(srcs[j], &rs[n], &rl[n]);
            n++;
        }
        rs[n] = (uintptr_t)errp;
        rl[n++] = errp != 0 ? 16 : 0;
        if (cm_ixhost_queue(hf, h, n, rs, rl) < 0) {
            goto out;
        }
    }
    else {
        params[0] = &abase;
        params[1] = &obase;
        params[2] = &errp;
        params[3] = d;
        if (cm_ix_launch(ctx, CM_IXK_RUN, d->n, params, h) < 0) {
            goto out;
        }
    }
    if (check) {
        if (errown != NULL) {
            CM_CU_NOGIL(n, MemcpyDtoHAsync, (word, errp, 16, h));
            if (n < 0) {
                goto out;
            }
        }
        if (cm_stream_wait(h) < 0) {
            goto out;
        }
        if (flag[0] != 0) {
            long long len = 0;

            for (j = 0; j < d->nsrc; j++) {
                if (d->src[j].axis + 1 == (long long)flag[0]) {
                    len = d->src[j].len;
                }
            }
            PyErr_Format(PyExc_IndexError,
                         "index %lld is out of bounds for axis %d with "
                         "size %lld", (long long)flag[1],
                         (int)flag[0] - 1, len);
            goto out;
        }
    }
    else if (!async && cm_stream_wait(h) < 0) {
        goto out;
    }
    if (async) {
        if (cm_da_used_on(arr, 1, h, sobj) < 0
            || cm_da_used_on(other, 1, h, sobj) < 0) {
            goto out;
        }
        for (j = 0; j < d->nsrc; j++) {
            if (cm_da_used_on(srcs[j], 1, h, sobj) < 0) {
                goto out;
            }
        }
    }
    rc = 0;
out:
    if (slot >= 0) {
        /* Its kernel ran (the stream was waited for), or was never
         * queued; after a failed wait the pair stays taken. */
        if (rc == 0 || PyErr_ExceptionMatches(PyExc_IndexError)) {
            cm_ixf_give(page, slot);
        }
    }
    Py_XDECREF(errown);
    return rc;
}

static PyObject *
cm_ix_run_body(cm_da *arr, cm_da *other, long long aoff, PyObject *shape,
               PyObject *ast, PyObject *ost, int bpos, PyObject *sources,
               int scatter, int check, PyObject *stream)
{
    cm_ixdesc *d;
    cm_da *srcs[CM_IX_MAXSRC];
    long long st[CM_IX_MAXB];
    long long align[CM_IX_MAXDIM * 2 + CM_IX_MAXSRC + 3];
    cm_context *ctx;
    PyObject *sobj = NULL;
    PyObject *r = NULL;
    CUdeviceptr abase;
    CUdeviceptr obase;
    CUstream h;
    long long itemsize = PyDataType_ELSIZE(arr->dtype);
    Py_ssize_t nsrc;
    int async;
    int nal = 0;
    int n;
    int i;
    int j;

    d = calloc(1, sizeof(*d));
    if (d == NULL) {
        return PyErr_NoMemory();
    }
    if ((d->ndim = cm_ix_ints(shape, "shape", CM_IX_MAXDIM, d->shape)) < 0
        || cm_ix_ints(ast, "astrides", CM_IX_MAXDIM, d->as) != d->ndim
        || cm_ix_ints(ost, "ostrides", CM_IX_MAXDIM, d->os) != d->ndim) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError,
                            "shape and strides differ in length");
        }
        goto out_desc;
    }
    if (!PyTuple_Check(sources)
        || (nsrc = PyTuple_GET_SIZE(sources)) > CM_IX_MAXSRC) {
        PyErr_SetString(PyExc_ValueError,
                        "sources: a tuple of at most 8 index sources");
        goto out_desc;
    }
    if (PyDataType_ELSIZE(other->dtype) != itemsize) {
        PyErr_SetString(PyExc_ValueError,
                        "the two sides differ in itemsize");
        goto out_desc;
    }
    d->n = 1;
    for (i = 0; i < d->ndim; i++) {
        if (d->shape[i] < 0) {
            PyErr_SetString(PyExc_ValueError, "negative extent");
            goto out_desc;
        }
        d->n *= d->shape[i];
        align[nal++] = d->as[i];
        align[nal++] = d->os[i];
    }
    d->nsrc = (int)nsrc;
    d->bpos = bpos;
    d->nb = -1;
    d->scatter = scatter;
    for (j = 0; j < d->nsrc; j++) {
        PyObject *t = PyTuple_GET_ITEM(sources, j);
        cm_ixsrc *s = &d->src[j];
        long long v[3];

        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 6) {
            PyErr_SetString(PyExc_ValueError,
                            "an index source is a 6-tuple");
            goto out_desc;
        }
        s->type = PyLong_AsLong(PyTuple_GET_ITEM(t, 0));
        v[0] = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 2));
        v[1] = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 3));
        v[2] = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 4));
        if (PyErr_Occurred()
            || (srcs[j] = cm_ix_array(PyTuple_GET_ITEM(t, 1), "an index "
                                      "source")) == NULL
            || (n = cm_ix_ints(PyTuple_GET_ITEM(t, 5), "bstrides",
                               CM_IX_MAXB, st)) < 0) {
            goto out_desc;
        }
        if (d->nb < 0) {
            d->nb = n;
        }
        if (n != d->nb || bpos < 0 || bpos + n > d->ndim) {
            PyErr_SetString(PyExc_ValueError,
                            "index sources disagree on the B dimensions");
            goto out_desc;
        }
        if (s->type == CM_IX_OFF_ARRAY || s->type == CM_IX_OFF_OTHER) {
            if (cm_elem_type_of(srcs[j]->dtype) != CM_T_I64) {
                PyErr_SetString(PyExc_TypeError,
                                "byte offsets must be int64");
                goto out_desc;
            }
        }
        else if (s->type != cm_elem_type_of(srcs[j]->dtype)
                 || s->type < CM_T_I8 || s->type > CM_T_U64) {
            PyErr_SetString(PyExc_TypeError,
                            "an index source's type is not its dtype's");
            goto out_desc;
        }
        s->p = (const unsigned char *)(uintptr_t)srcs[j]->ptr;
        s->len = v[0];
        s->axis = (int)v[1];
        s->astride = v[2];
        memcpy(s->st, st, sizeof(long long) * (size_t)n);
        align[nal++] = s->astride;
    }
    if (d->nb < 0) {
        d->nb = 0;
    }
    abase = (CUdeviceptr)((long long)arr->ptr + aoff);
    obase = other->ptr;
    align[nal++] = itemsize;
    align[nal++] = (long long)abase;
    align[nal++] = (long long)obase;
    d->unit = cm_ix_unit(align, nal);
    d->nunits = (int)(itemsize / d->unit);
    if (d->n == 0 || itemsize == 0) {
        r = Py_NewRef(Py_None);
        goto out_desc;
    }
    async = cm_effective_stream_obj(stream, arr->stream, &h, &sobj);
    if (async < 0 || (ctx = cm_context_current()) == NULL
        || cm_ix_exec(ctx, d, arr, abase, other, obase, srcs, check, h,
                      async, sobj) < 0) {
        goto out_desc;
    }
    r = Py_NewRef(Py_None);
out_desc:
    free(d);
    return r;
}

/* arr[idx] for one integer index array held on the device (the common
 * gather, planned here rather than in cudamem._index): a new array of
 * shape idx.shape + arr.shape[1:].  *handled 0 (and NULL, no exception)
 * leaves the key to cudamem._index. */
PyObject *
cm_ix_take(cm_da *arr, cm_da *idx, PyObject *stream, int *handled)
{
    Py_ssize_t shape[CM_IX_MAXDIM];
    Py_ssize_t strides[CM_IX_MAXDIM];
    long long align[CM_IX_MAXDIM * 2 + 4];
    cm_ixdesc *d = NULL;
    cm_da *out = NULL;
    cm_context *ctx;
    PyObject *bound;
    PyObject *sobj = NULL;
    CUstream h;
    long long itemsize = PyDataType_ELSIZE(arr->dtype);
    int type = cm_elem_type_of(idx->dtype);
    int ndim = idx->ndim + arr->ndim - 1;
    int async;
    int nal = 0;
    int i;

    *handled = 0;
    if (type < CM_T_I8 || type > CM_T_U64 || idx->ndim < 1
        || idx->ndim > CM_IX_MAXB || arr->ndim < 1 || ndim > CM_IX_MAXDIM
        || itemsize == 0 || (idx->size > 0 && arr->size == 0)) {
        return NULL;
    }
    *handled = 1;
    if (cm_da_alive(idx) < 0) {
        return NULL;
    }
    for (i = 0; i < idx->ndim; i++) {
        shape[i] = idx->shape[i];
    }
    for (i = 1; i < arr->ndim; i++) {
        shape[idx->ndim + i - 1] = arr->shape[i];
    }
    cm_layout_compact(ndim, shape, (Py_ssize_t)itemsize, 0, strides);
    bound = cm_pick_stream(stream, arr);
    if (bound == NULL) {
        return NULL;
    }
    out = (cm_da *)cm_da_make_in(cm_st->DeviceNDArray_type, NULL, ndim,
                                 shape, strides, arr->dtype, 0, NULL,
                                 bound);
    if (out == NULL || out->size == 0) {
        return (PyObject *)out;
    }
    d = calloc(1, sizeof(*d));
    if (d == NULL) {
        PyErr_NoMemory();
        goto err_out;
    }
    d->n = out->size;
    d->ndim = ndim;
    d->nsrc = 1;
    d->bpos = 0;
    d->nb = idx->ndim;
    for (i = 0; i < ndim; i++) {
        d->shape[i] = shape[i];
        d->as[i] = i < idx->ndim ? 0 : arr->strides[i - idx->ndim + 1];
        d->os[i] = strides[i];
        align[nal++] = d->as[i];
        align[nal++] = d->os[i];
    }
    d->src[0].type = type;
    d->src[0].p = (const unsigned char *)(uintptr_t)idx->ptr;
    d->src[0].len = arr->shape[0];
    d->src[0].astride = arr->strides[0];
    d->src[0].axis = 0;
    for (i = 0; i < idx->ndim; i++) {
        d->src[0].st[i] = idx->shape[i] == 1 ? 0 : idx->strides[i];
    }
    align[nal++] = arr->strides[0];
    align[nal++] = itemsize;
    align[nal++] = (long long)arr->ptr;
    align[nal++] = (long long)out->ptr;
    d->unit = cm_ix_unit(align, nal);
    d->nunits = (int)(itemsize / d->unit);
    async = cm_effective_stream_obj(stream, arr->stream, &h, &sobj);
    if (async < 0 || (ctx = cm_context_current()) == NULL
        || cm_ix_exec(ctx, d, arr, arr->ptr, out, out->ptr, &idx, 1, h,
                      async, sobj) < 0) {
        goto err_out;
    }
    free(d);
    return (PyObject *)out;
err_out:
    free(d);
    Py_XDECREF(out);
    return NULL;
}

static PyObject *
cm_ix_run_fn(PyObject *mod, PyObject *args)
{
    PyObject *arr_o;
    PyObject *other_o;
    PyObject *shape;
    PyObject *ast;
    PyObject *ost;
    PyObject *sources;
    PyObject *stream;
    cm_da *arr;
    cm_da *other;
    long long aoff;
    int bpos;
    int scatter;
    int check;
    PyObject *r;

    (void)mod;
    if (!PyArg_ParseTuple(args, "OOLOOOiOppO:_ix_run", &arr_o, &other_o,
                          &aoff, &shape, &ast, &ost, &bpos, &sources,
                          &scatter, &check, &stream)
        || (arr = cm_ix_array(arr_o, "arr")) == NULL
        || (other = cm_ix_array(other_o, "other")) == NULL) {
        return NULL;
    }
    CM_ENTERED(cm_da_enter, cm_da_leave, arr, r, NULL,
               cm_ix_run_body(arr, other, aoff, shape, ast, ost, bpos,
                              sources, scatter, check,
                              stream == Py_None ? NULL : stream));
    return r;
}

/* ------------------------------------------------------------------ */
/* _ix_mask                                                            */
/* ------------------------------------------------------------------ */

/* Merge the mask's axes where both the mask and the array step evenly
 * from one into the next, and drop extents of 1, so that the kernels
 * walk a C-contiguous mask of a contiguous array as one dimension (no
 * division per element, and the mask read 16 bytes at a time). */
static void
cm_ixm_merge(cm_ixmdesc *m)
{
    int nd = 0;
    int k;

    if (m->n == 0) {
        return;
    }
    for (k = 0; k < m->ndim; k++) {
        if (m->shape[k] == 1) {
            continue;
        }
        if (nd > 0 && m->ms[nd - 1] == m->ms[k] * m->shape[k]
            && m->as[nd - 1] == m->as[k] * m->shape[k]) {
            m->shape[nd - 1] *= m->shape[k];
        }
        else {
            m->shape[nd] = m->shape[k];
            nd++;
        }
        m->ms[nd - 1] = m->ms[k];
        m->as[nd - 1] = m->as[k];
    }
    if (nd == 0) {
        /* one element */
        m->shape[0] = 1;
        m->ms[0] = 0;
        m->as[0] = 0;
        nd = 1;
    }
    m->ndim = nd;
}

PyDoc_STRVAR(cm_ix_mask_doc,
"_ix_mask(mask, astrides, stream)\n--\n\n"
"The nonzero elements of a device boolean mask, in C order, as a new "
"int64 device array of byte offsets sum(index[k] * astrides[k]) into "
"the array the mask indexes.  Counting them is the one host "
"synchronisation: the call waits for the effective stream (of the "
"mask) once, to learn the result's length.");

static PyObject *
cm_ix_mask_body(cm_da *mask, PyObject *ast, PyObject *stream)
{
    cm_ixmdesc *m;
    cm_context *ctx;
    PyObject *counts = NULL;
    PyObject *outown = NULL;
    PyObject *res = NULL;
    PyObject *sobj = NULL;
    PyArray_Descr *i64;
    Py_ssize_t rshape;
    Py_ssize_t rstride = 8;
    CUdeviceptr cp = 0;
    CUdeviceptr op = 0;
    CUdeviceptr mp = mask->ptr;
    CUstream h;
    uintptr_t rs[3];
    size_t rl[3];
    void *params[4];
    long long total = 0;
    int async;
    int kind;
    int err;
    int i;

    m = calloc(1, sizeof(*m));
    if (m == NULL) {
        return PyErr_NoMemory();
    }
    if (cm_elem_type_of(mask->dtype) != CM_T_BOOL
        || mask->ndim > CM_IX_MAXDIM
        || cm_ix_ints(ast, "astrides", CM_IX_MAXDIM, m->as) != mask->ndim) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError,
                            "a boolean mask of at most 32 dimensions and "
                            "one array stride per mask dimension");
        }
        goto out_desc;
    }
    m->ndim = mask->ndim;
    m->n = 1;
    for (i = 0; i < m->ndim; i++) {
        m->shape[i] = mask->shape[i];
        m->ms[i] = mask->strides[i];
        m->n *= m->shape[i];
    }
    cm_ixm_merge(m);
    m->chunk = CM_IXM_CHUNK;
    m->nchunks = (m->n + m->chunk - 1) / m->chunk;
    async = cm_effective_stream_obj(stream, mask->stream, &h, &sobj);
    if (async < 0 || (ctx = cm_context_current()) == NULL) {
        goto out_desc;
    }
    i64 = PyArray_DescrFromType(NPY_INT64);
    if (m->n > 0) {
        counts = cm_mem_alloc_on(ctx, (size_t)(m->nchunks + 1) * 8,
                                 async ? h : NULL, &cp);
        if (counts == NULL) {
            goto out_dtype;
        }
        for (kind = CM_IXK_COUNT; kind <= CM_IXK_SCAN; kind++) {
            if (cm_driver_backend() == CM_BACKEND_SIM) {
                cm_ixhost *hf = malloc(sizeof(*hf));

                if (hf == NULL) {
                    PyErr_NoMemory();
                    goto out_counts;
                }
                hf->kind = kind;
                hf->m = *m;
                hf->arr = (unsigned char *)(uintptr_t)mp;
                hf->counts = (long long *)(uintptr_t)cp;
                cm_ix_span(mask, &rs[0], &rl[0]);
                rs[1] = (uintptr_t)cp;
                rl[1] = (size_t)(m->nchunks + 1) * 8;
                if (cm_ixhost_queue(hf, h, 2, rs, rl) < 0) {
                    goto out_counts;
                }
                continue;
            }
            if (kind == CM_IXK_COUNT) {
                params[0] = &mp;
                params[1] = &cp;
                params[2] = m;
                err = cm_ix_launch(ctx, kind, m->nchunks * 256, params, h);
            }
            else {
                /* one block of 256 threads */
                params[0] = &cp;
                params[1] = &m->nchunks;
                err = cm_ix_launch(ctx, kind, 256, params, h);
            }
            if (err < 0) {
                goto out_counts;
            }
        }
        /* The count: the one wait. */
        CM_CU_NOGIL(err, MemcpyDtoHAsync,
                    (&total, cp + (CUdeviceptr)(m->nchunks * 8), 8, h));
        if (err < 0 || cm_stream_wait(h) < 0) {
            goto out_counts;
        }
    }
    if (total > 0) {
        outown = cm_mem_alloc_on(ctx, (size_t)total * 8, async ? h : NULL,
                                 &op);
        if (outown == NULL) {
            goto out_counts;
        }
        if (cm_driver_backend() == CM_BACKEND_SIM) {
            cm_ixhost *hf = malloc(sizeof(*hf));

            if (hf == NULL) {
                PyErr_NoMemory();
                goto out_out;
            }
            hf->kind = CM_IXK_WRITE;
            hf->m = *m;
            hf->arr = (unsigned char *)(uintptr_t)mp;
            hf->counts = (long long *)(uintptr_t)cp;
            hf->out = (long long *)(uintptr_t)op;
            cm_ix_span(mask, &rs[0], &rl[0]);
            rs[1] = (uintptr_t)cp;
            rl[1] = (size_t)(m->nchunks + 1) * 8;
            rs[2] = (uintptr_t)op;
            rl[2] = (size_t)total * 8;
            if (cm_ixhost_queue(hf, h, 3, rs, rl) < 0) {
                goto out_out;
            }
        }
        else {
            params[0] = &mp;
            params[1] = &cp;
            params[2] = &op;
            params[3] = m;
            if (cm_ix_launch(ctx, CM_IXK_WRITE, m->nchunks * 256, params,
                             h) < 0) {
                goto out_out;
            }
        }
        if (!async && cm_stream_wait(h) < 0) {
            goto out_out;
        }
    }
    rshape = (Py_ssize_t)total;
    res = cm_da_make_in(cm_st->DeviceNDArray_type, ctx, 1, &rshape,
                        &rstride, i64, op, outown,
                        async ? mask->stream : NULL);
    if (res != NULL && async && cm_da_used_on(mask, 1, h, sobj) < 0) {
        Py_CLEAR(res);
    }
out_out:
    Py_XDECREF(outown);
out_counts:
    Py_XDECREF(counts);
out_dtype:
    Py_DECREF(i64);
out_desc:
    free(m);
    return res;
}

static PyObject *
cm_ix_mask_fn(PyObject *mod, PyObject *args)
{
    PyObject *mask_o;
    PyObject *ast;
    PyObject *stream;
    cm_da *mask;
    PyObject *r;

    (void)mod;
    if (!PyArg_ParseTuple(args, "OOO:_ix_mask", &mask_o, &ast, &stream)
        || (mask = cm_ix_array(mask_o, "mask")) == NULL) {
        return NULL;
    }
    CM_ENTERED(cm_da_enter, cm_da_leave, mask, r, NULL,
               cm_ix_mask_body(mask, ast,
                               stream == Py_None ? NULL : stream));
    return r;
}

/* ------------------------------------------------------------------ */
/* _ix_source                                                          */
/* ------------------------------------------------------------------ */

PyDoc_STRVAR(cm_ix_source_doc,
"_ix_source()\n--\n\n"
"The CUDA C source of the indexing kernels, as NVRTC compiles it (for "
"the tests that compile it for a given architecture).");

static PyObject *
cm_ix_source_fn(PyObject *mod, PyObject *unused)
{
    char *src = cm_ix_source();
    PyObject *r;

    (void)mod;
    (void)unused;
    if (src == NULL) {
        return PyErr_NoMemory();
    }
    r = PyUnicode_FromString(src);
    free(src);
    return r;
}

static PyMethodDef cm_gather_functions[] = {
    {"_ix_run", cm_ix_run_fn, METH_VARARGS, cm_ix_run_doc},
    {"_ix_mask", cm_ix_mask_fn, METH_VARARGS, cm_ix_mask_doc},
    {"_ix_source", cm_ix_source_fn, METH_NOARGS, cm_ix_source_doc},
    {NULL, NULL, 0, NULL},
};

int
cm_gather_init(PyObject *mod, cm_state *st)
{
    (void)st;
    return PyModule_AddFunctions(mod, cm_gather_functions);
}
