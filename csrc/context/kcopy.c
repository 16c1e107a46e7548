/* SPDX-License-Identifier: MIT */
/*
 * context/kcopy.c: small copies recorded as kernel nodes while cudamem
 * captures a stream.  A graph replays a copy node in about 4-6 µs on an
 * H200 whatever its size, a kernel node that moves the same bytes in
 * about 1.5 µs (tools/graph_probe.py, docs/performance.md "Graphs").  So
 * while a stream cudamem began capturing records an asynchronous copy of
 * at most CUDAMEM_CAPTURE_KERNEL_COPY_MAX bytes in one contiguous run
 * between cudamem's own page-locked memory (cuMemHostAlloc'd: under
 * unified addressing the device reads and writes it at an address the
 * driver gives, CU_POINTER_ATTRIBUTE_DEVICE_POINTER) and device memory,
 * array/copy.c records this file's kernel instead of a copy node.
 *
 * The kernel is a few lines of PTX kept below (its CUDA C source beside
 * it), loaded with cuModuleLoadData: no NVRTC, no toolkit.  It is loaded
 * into a context when a capture begins there, before the driver begins
 * it (a module load or a lazy kernel load while a global capture runs
 * could invalidate it), and only on a thread that may make such calls;
 * a copy in a capture whose context has no kernel loaded, or whose
 * host side the driver gives no device address for, stays a copy node.
 * A copy recorded right after another on the same stream joins that
 * one's node instead where it can (context/kbatch.c, which also records
 * every such copy on the simulator: a host function, its ranges checked
 * to lie in live memory the device can reach, which a capture records
 * and a replay runs).
 *
 * Locks and the GIL: no lock.  The switch and the count are atomics;
 * the context's kernel fields are written with the GIL held.  The module
 * load (the driver compiles the PTX) runs with the GIL released, on
 * local data only.
 */
#include "context/stream.h"
#include "driver/bytesize.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* CUDAMEM_CAPTURE_KERNEL_COPY_MAX, bytes (0: off; 4 KiB by default);
 * _capture_kernel_copy changes it. */
static _Atomic size_t cm_kcopy_max_bytes = 4096;

/* Copies recorded as kernels since import. */
static atomic_size_t cm_kcopy_count;

/* The kernel's CUDA C source:
 *
 * extern "C" __global__ void
 * cm_kcopy(unsigned char *dst, const unsigned char *src,
 *          unsigned long long n)
 * {
 *     unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x
 *                            + threadIdx.x;
 *     unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
 *
 *     if ((((unsigned long long)dst | (unsigned long long)src | n) & 3)
 *         == 0) {
 *         unsigned int *d = (unsigned int *)dst;
 *         const unsigned int *s = (const unsigned int *)src;
 *
 *         for (n >>= 2; i < n; i += step) {
 *             d[i] = s[i];
 *         }
 *     }
 *     else {
 *         for (; i < n; i += step) {
 *             dst[i] = src[i];
 *         }
 *     }
 * }
 *
 * and its PTX (nvcc -ptx -arch=compute_75 -O3, the ISA version and target
 * lowered to what the instructions need, so that older drivers load it). */
static const char cm_kcopy_ptx[] =
    ".version 7.0\n"
    ".target sm_52\n"
    ".address_size 64\n"
    ".visible .entry cm_kcopy(\n"
    "    .param .u64 cm_kcopy_param_0,\n"
    "    .param .u64 cm_kcopy_param_1,\n"
    "    .param .u64 cm_kcopy_param_2\n"
    ")\n"
    "{\n"
    "    .reg .pred %p<6>;\n"
    "    .reg .b16 %rs<2>;\n"
    "    .reg .b32 %r<6>;\n"
    "    .reg .b64 %rd<25>;\n"
    "    ld.param.u64 %rd11, [cm_kcopy_param_0];\n"
    "    ld.param.u64 %rd12, [cm_kcopy_param_1];\n"
    "    ld.param.u64 %rd10, [cm_kcopy_param_2];\n"
    "    cvta.to.global.u64 %rd1, %rd11;\n"
    "    cvta.to.global.u64 %rd2, %rd12;\n"
    "    mov.u32 %r1, %ctaid.x;\n"
    "    mov.u32 %r2, %ntid.x;\n"
    "    mul.wide.u32 %rd13, %r1, %r2;\n"
    "    mov.u32 %r3, %tid.x;\n"
    "    cvt.u64.u32 %rd14, %r3;\n"
    "    add.s64 %rd23, %rd13, %rd14;\n"
    "    mov.u32 %r4, %nctaid.x;\n"
    "    mul.wide.u32 %rd4, %r4, %r2;\n"
    "    or.b64 %rd15, %rd12, %rd11;\n"
    "    or.b64 %rd16, %rd15, %rd10;\n"
    "    and.b64 %rd17, %rd16, 3;\n"
    "    setp.eq.s64 %p1, %rd17, 0;\n"
    "    @%p1 bra WORDS;\n"
    "    setp.ge.u64 %p2, %rd23, %rd10;\n"
    "    @%p2 bra DONE;\n"
    "BYTES:\n"
    "    add.s64 %rd18, %rd2, %rd23;\n"
    "    ld.global.u8 %rs1, [%rd18];\n"
    "    add.s64 %rd19, %rd1, %rd23;\n"
    "    st.global.u8 [%rd19], %rs1;\n"
    "    add.s64 %rd23, %rd23, %rd4;\n"
    "    setp.lt.u64 %p3, %rd23, %rd10;\n"
    "    @%p3 bra BYTES;\n"
    "    bra.uni DONE;\n"
    "WORDS:\n"
    "    shr.u64 %rd7, %rd10, 2;\n"
    "    setp.ge.u64 %p4, %rd23, %rd7;\n"
    "    @%p4 bra DONE;\n"
    "WORD:\n"
    "    shl.b64 %rd20, %rd23, 2;\n"
    "    add.s64 %rd21, %rd2, %rd20;\n"
    "    ld.global.u32 %r5, [%rd21];\n"
    "    add.s64 %rd22, %rd1, %rd20;\n"
    "    st.global.u32 [%rd22], %r5;\n"
    "    add.s64 %rd23, %rd23, %rd4;\n"
    "    setp.lt.u64 %p5, %rd23, %rd7;\n"
    "    @%p5 bra WORD;\n"
    "DONE:\n"
    "    ret;\n"
    "}\n";

/* The threads of a block, and the most blocks a copy gets (a copy this
 * small is bound by the bus's latency, not by threads). */
#define CM_KCOPY_THREADS 256
#define CM_KCOPY_BLOCKS 32

size_t
cm_kcopy_max(void)
{
    return atomic_load_explicit(&cm_kcopy_max_bytes, memory_order_relaxed);
}

void
cm_kcopy_prepare(cm_context *ctx)
{
    CUmodule mod = NULL;
    CUfunction fn = NULL;
    void *kbatch;
    CUresult rc;
    int regs = 0;

    if (cm_kcopy_max() == 0 || ctx->kcopy_gen == ctx->gen) {
        return;
    }
    if (cm_driver_backend() == CM_BACKEND_SIM) {
        ctx->kcopy = NULL;
        ctx->kbatch = NULL;
        ctx->kcopy_gen = ctx->gen;
        return;
    }
    /* The driver compiles the PTX: the GIL goes meanwhile. */
    CM_DRIVER_BEGIN_NOGIL
    rc = CM_CU_RAW(ModuleLoadData, (&mod, cm_kcopy_ptx));
    if (rc == CUDA_SUCCESS) {
        rc = CM_CU_RAW(ModuleGetFunction, (&fn, mod, "cm_kcopy"));
    }
    /* Asking for an attribute loads the kernel now (lazy loading would
     * load it at its first launch, inside the capture). */
    if (rc == CUDA_SUCCESS) {
        rc = CM_CU_RAW(FuncGetAttribute,
                       (&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, fn));
    }
    if (rc != CUDA_SUCCESS && mod != NULL) {
        (void)CM_CU_RAW(ModuleUnload, (mod));
    }
    kbatch = rc == CUDA_SUCCESS ? cm_kbatch_load() : NULL;
    CM_DRIVER_END_NOGIL
    /* Unavailable (an old driver, a failed load): copy nodes, and no
     * second try in this context.  The module, when loaded, goes with
     * its context. */
    ctx->kcopy = rc == CUDA_SUCCESS ? fn : NULL;
    ctx->kbatch = kbatch;
    ctx->kcopy_gen = ctx->gen;
}

/* The device's address of host memory at p (cudamem's page-locked
 * memory), or 0 when the driver gives none. */
static CUdeviceptr
cm_kcopy_device_address(uintptr_t p)
{
    CUdeviceptr d = 0;

    if (CM_CU_RAW(PointerGetAttribute,
                  (&d, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, (CUdeviceptr)p))
        != CUDA_SUCCESS) {
        return 0;
    }
    return d;
}

int
cm_kcopy_record(cm_context *ctx, CUdeviceptr dst, int dst_host,
                CUdeviceptr src, int src_host, size_t n, CUstream h)
{
    unsigned long long nn = n;
    void *params[3];
    unsigned int blocks;
    int ord = -1;
    int r;

    if (n == 0 || n > cm_kcopy_max() || ctx->kcopy_gen != ctx->gen) {
        return 0;
    }
    /* The device side must be memory of this context's device (a kernel
     * reaching another device's memory without peer access would fault
     * the context; a copy node has no such limit). */
    if (CM_CU_RAW(PointerGetAttribute,
                  (&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                   dst_host ? src : dst)) != CUDA_SUCCESS
        || ord != ctx->device->id) {
        return 0;
    }
    if (dst_host && (dst = cm_kcopy_device_address((uintptr_t)dst)) == 0) {
        return 0;
    }
    if (src_host && (src = cm_kcopy_device_address((uintptr_t)src)) == 0) {
        return 0;
    }
    /* Into the stream's open batch (context/kbatch.c), where it can. */
    r = cm_kbatch_join(ctx, (uintptr_t)dst, dst_host, (uintptr_t)src, n, h);
    if (r < 0) {
        return -1;
    }
    if (r == 0) {
        if (cm_driver_backend() != CM_BACKEND_SIM) {
            if (ctx->kcopy == NULL) {
                return 0;
            }
            params[0] = &dst;
            params[1] = &src;
            params[2] = &nn;
            blocks = (unsigned int)((n / 4 + CM_KCOPY_THREADS - 1)
                                    / CM_KCOPY_THREADS);
            if (blocks == 0) {
                blocks = 1;
            }
            if (blocks > CM_KCOPY_BLOCKS) {
                blocks = CM_KCOPY_BLOCKS;
            }
            if (CM_CU(LaunchKernel, ((CUfunction)ctx->kcopy, blocks, 1, 1,
                                     CM_KCOPY_THREADS, 1, 1, 0, h, params,
                                     NULL)) < 0) {
                return -1;
            }
        }
        /* The simulator records it there; on the driver the batch opens
         * with the node just recorded. */
        if (cm_kbatch_open(ctx, (uintptr_t)dst, dst_host, (uintptr_t)src,
                           n, h) < 0) {
            return -1;
        }
    }
    atomic_fetch_add_explicit(&cm_kcopy_count, 1, memory_order_relaxed);
    return 1;
}

PyDoc_STRVAR(cm_kcopy_fn_doc,
"_capture_kernel_copy(nbytes=None, /)\n--\n\n"
"The largest copy between cudamem's page-locked memory and device memory\n"
"that a capture cudamem began records as a kernel node rather than a copy\n"
"node (0: none), and how many copies were recorded so: (nbytes, count)\n"
"before the call.  Sets the size when given.  A new process reads it from\n"
"CUDAMEM_CAPTURE_KERNEL_COPY_MAX (bytes, with an optional K, M or G).");

static PyObject *
cm_kcopy_fn(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    size_t old = cm_kcopy_max();
    size_t n;

    (void)mod;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError,
                        "_capture_kernel_copy takes at most one argument");
        return NULL;
    }
    if (nargs == 1 && args[0] != Py_None) {
        n = PyLong_AsSize_t(args[0]);
        if (n == (size_t)-1 && PyErr_Occurred()) {
            if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
                PyErr_SetString(PyExc_ValueError,
                                "_capture_kernel_copy: nbytes must be an "
                                "int from 0 to 2**64-1");
            }
            return NULL;
        }
        atomic_store(&cm_kcopy_max_bytes, n);
    }
    return Py_BuildValue("nn", (Py_ssize_t)(old > PY_SSIZE_T_MAX
                                            ? PY_SSIZE_T_MAX : old),
                         (Py_ssize_t)atomic_load(&cm_kcopy_count));
}

static PyMethodDef cm_kcopy_methods[] = {
    {"_capture_kernel_copy", (PyCFunction)(void (*)(void))cm_kcopy_fn,
     METH_FASTCALL, cm_kcopy_fn_doc},
    {NULL, NULL, 0, NULL},
};

int
cm_kcopy_init(PyObject *mod)
{
    const char *v = getenv("CUDAMEM_CAPTURE_KERNEL_COPY_MAX");

    if (v != NULL && v[0] != '\0') {
        unsigned long long m;

        if (cm_parse_bytes(v, (unsigned long long)(SIZE_MAX - 1), &m) < 0) {
            PyErr_Format(PyExc_ValueError,
                         "CUDAMEM_CAPTURE_KERNEL_COPY_MAX=%.100s: a byte "
                         "count (digits, then an optional K, M or G)", v);
            return -1;
        }
        atomic_store(&cm_kcopy_max_bytes, (size_t)m);
    }
    if (cm_kbatch_init(mod) < 0) {
        return -1;
    }
    return PyModule_AddFunctions(mod, cm_kcopy_methods);
}
