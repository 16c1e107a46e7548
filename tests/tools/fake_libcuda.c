/* SPDX-License-Identifier: MIT */
/*
 * fake_libcuda.c: the driver entry points benchmarks/bare_driver.c
 * resolves, on host memory, so that the program runs whole without a GPU
 * (tests/tools/test_bare_driver.py loads it through
 * CUDAMEM_DRIVER_LIBRARY).  "Device" memory is malloc'd; copies are
 * memcpy; a stream is a counter.  It checks what a driver checks here:
 * a current context on the calling thread, a known pointer to free,
 * copies within an allocation.
 *
 * FAKE_CUDA_STATS=1: at unload, one line on stderr with the counts
 * (allocations, frees, the most allocations alive at once, those still
 * alive, streams still alive, copies, synchronizations).
 * FAKE_CUDA_FAIL_COPY=N: the N-th host-to-device copy (from 1) fails
 * with CUDA_ERROR_LAUNCH_FAILED.
 * FAKE_CUDA_QUERY_LOCKED=1: cuPointerGetAttribute answers every address
 * as page-locked host memory (else as unknown: pageable).
 *
 * The counts also tell the calls apart: synchronous copies (scopies),
 * copies on CU_STREAM_LEGACY (legacy), synchronizations of
 * CU_STREAM_LEGACY (legacy_syncs) and pointer queries (queries); and the
 * page-locked host buffers made and freed (host_allocs, host_frees).
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct fake_ctx *CUcontext;
typedef struct fake_stream *CUstream;
typedef int CUpointer_attribute;

#define FAKE_STREAM_LEGACY ((CUstream)0x1)
#define FAKE_ATTR_MEMORY_TYPE 2
#define FAKE_MEMORYTYPE_HOST 1

#define OK 0
#define ERR_INVALID_VALUE 1
#define ERR_NOT_INITIALIZED 3
#define ERR_INVALID_CONTEXT 201
#define ERR_LAUNCH_FAILED 719

#define FAKE_MAX_LIVE 4096

struct fake_ctx {
    int device;
};

struct fake_stream {
    unsigned int flags;
};

static struct fake_ctx fake_primary = {0};
static int fake_inited;
static __thread CUcontext fake_current;

static pthread_mutex_t fake_mu = PTHREAD_MUTEX_INITIALIZER;
/* NOTE: fake_mu guards every field below. */
static struct {
    void *p;
    size_t size;
} fake_live[FAKE_MAX_LIVE];
static long fake_nlive;
static long fake_allocs;
static long fake_frees;
static long fake_max_live;
static long fake_streams;
static long fake_htod;
static long fake_copies;
static long fake_syncs;
static long fake_scopies;
static long fake_legacy;
static long fake_legacy_syncs;
static long fake_queries;
static long fake_host_allocs;
static long fake_host_frees;

static CUresult
fake_ready(void)
{
    if (!fake_inited) {
        return ERR_NOT_INITIALIZED;
    }
    return fake_current == NULL ? ERR_INVALID_CONTEXT : OK;
}

/* The allocation holding [p, p + n), or -1; fake_mu held. */
static long
fake_find(uintptr_t p, size_t n)
{
    long i;

    for (i = 0; i < fake_nlive; i++) {
        uintptr_t b = (uintptr_t)fake_live[i].p;

        if (p >= b && p + n <= b + fake_live[i].size) {
            return i;
        }
    }
    return -1;
}

CUresult
cuInit(unsigned int flags)
{
    if (flags != 0) {
        return ERR_INVALID_VALUE;
    }
    fake_inited = 1;
    return OK;
}

CUresult
cuDeviceGet(CUdevice *dev, int ordinal)
{
    if (!fake_inited) {
        return ERR_NOT_INITIALIZED;
    }
    if (ordinal != 0) {
        return ERR_INVALID_VALUE;
    }
    *dev = 0;
    return OK;
}

CUresult
cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev)
{
    if (!fake_inited) {
        return ERR_NOT_INITIALIZED;
    }
    if (dev != 0) {
        return ERR_INVALID_VALUE;
    }
    *ctx = &fake_primary;
    return OK;
}

CUresult
cuCtxSetCurrent(CUcontext ctx)
{
    fake_current = ctx;
    return OK;
}

CUresult
cuStreamCreate(CUstream *s, unsigned int flags)
{
    CUresult rc = fake_ready();

    if (rc != OK) {
        return rc;
    }
    *s = malloc(sizeof(**s));
    if (*s == NULL) {
        return ERR_INVALID_VALUE;
    }
    (*s)->flags = flags;
    pthread_mutex_lock(&fake_mu);
    fake_streams++;
    pthread_mutex_unlock(&fake_mu);
    return OK;
}

CUresult
cuStreamDestroy_v2(CUstream s)
{
    if (s == NULL) {
        return ERR_INVALID_VALUE;
    }
    free(s);
    pthread_mutex_lock(&fake_mu);
    fake_streams--;
    pthread_mutex_unlock(&fake_mu);
    return OK;
}

CUresult
cuStreamSynchronize(CUstream s)
{
    CUresult rc = fake_ready();

    if (rc != OK || s == NULL) {
        return rc != OK ? rc : ERR_INVALID_VALUE;
    }
    pthread_mutex_lock(&fake_mu);
    fake_syncs++;
    fake_legacy_syncs += s == FAKE_STREAM_LEGACY;
    pthread_mutex_unlock(&fake_mu);
    return OK;
}

CUresult
cuMemAlloc_v2(CUdeviceptr *p, size_t size)
{
    CUresult rc = fake_ready();
    void *m;

    if (rc != OK) {
        return rc;
    }
    if (size == 0) {
        return ERR_INVALID_VALUE;
    }
    m = malloc(size);
    if (m == NULL) {
        return 2;   /* CUDA_ERROR_OUT_OF_MEMORY */
    }
    pthread_mutex_lock(&fake_mu);
    if (fake_nlive == FAKE_MAX_LIVE) {
        pthread_mutex_unlock(&fake_mu);
        free(m);
        return 2;
    }
    fake_live[fake_nlive].p = m;
    fake_live[fake_nlive].size = size;
    fake_nlive++;
    fake_allocs++;
    if (fake_nlive > fake_max_live) {
        fake_max_live = fake_nlive;
    }
    pthread_mutex_unlock(&fake_mu);
    *p = (CUdeviceptr)(uintptr_t)m;
    return OK;
}

CUresult
cuMemFree_v2(CUdeviceptr p)
{
    CUresult rc = fake_ready();
    long i;

    if (rc != OK) {
        return rc;
    }
    pthread_mutex_lock(&fake_mu);
    i = fake_find((uintptr_t)p, 1);
    if (i < 0 || fake_live[i].p != (void *)(uintptr_t)p) {
        pthread_mutex_unlock(&fake_mu);
        return ERR_INVALID_VALUE;
    }
    free(fake_live[i].p);
    fake_live[i] = fake_live[--fake_nlive];
    fake_frees++;
    pthread_mutex_unlock(&fake_mu);
    return OK;
}

CUresult
cuMemHostAlloc(void **p, size_t size, unsigned int flags)
{
    CUresult rc = fake_ready();

    if (rc != OK) {
        return rc;
    }
    (void)flags;
    *p = malloc(size);
    if (*p == NULL) {
        return 2;
    }
    pthread_mutex_lock(&fake_mu);
    fake_host_allocs++;
    pthread_mutex_unlock(&fake_mu);
    return OK;
}

CUresult
cuMemFreeHost(void *p)
{
    free(p);
    pthread_mutex_lock(&fake_mu);
    fake_host_frees++;
    pthread_mutex_unlock(&fake_mu);
    return OK;
}

/* A copy between host memory and a live allocation; sync: made by a
 * synchronous call (s unused). */
static CUresult
fake_copy(void *dst, const void *src, uintptr_t dev, size_t n, CUstream s,
          int htod, int sync)
{
    CUresult rc = fake_ready();
    const char *fail = getenv("FAKE_CUDA_FAIL_COPY");
    long nth;

    if (rc != OK) {
        return rc;
    }
    if (!sync && s == NULL) {
        return ERR_INVALID_VALUE;
    }
    pthread_mutex_lock(&fake_mu);
    if (fake_find(dev, n) < 0) {
        pthread_mutex_unlock(&fake_mu);
        return ERR_INVALID_VALUE;
    }
    fake_copies++;
    fake_scopies += sync;
    fake_legacy += !sync && s == FAKE_STREAM_LEGACY;
    nth = htod ? ++fake_htod : 0;
    pthread_mutex_unlock(&fake_mu);
    if (htod && fail != NULL && nth == atol(fail)) {
        return ERR_LAUNCH_FAILED;
    }
    memcpy(dst, src, n);
    return OK;
}

CUresult
cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
    return fake_copy((void *)(uintptr_t)dst, src, (uintptr_t)dst, n, s, 1,
                     0);
}

CUresult
cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
    return fake_copy(dst, (const void *)(uintptr_t)src, (uintptr_t)src, n,
                     s, 0, 0);
}

CUresult
cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    return fake_copy((void *)(uintptr_t)dst, src, (uintptr_t)dst, n, NULL,
                     1, 1);
}

CUresult
cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    return fake_copy(dst, (const void *)(uintptr_t)src, (uintptr_t)src, n,
                     NULL, 0, 1);
}

/* The unified entry points: the side that is a live allocation is the
 * device's. */
static CUresult
fake_copy_any(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s,
              int sync)
{
    long i;

    pthread_mutex_lock(&fake_mu);
    i = fake_find((uintptr_t)dst, n);
    pthread_mutex_unlock(&fake_mu);
    return fake_copy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src,
                     i >= 0 ? (uintptr_t)dst : (uintptr_t)src, n, s, i >= 0,
                     sync);
}

CUresult
cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    return fake_copy_any(dst, src, n, s, 0);
}

CUresult
cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    return fake_copy_any(dst, src, n, NULL, 1);
}

/* The memory type only: page-locked host memory under
 * FAKE_CUDA_QUERY_LOCKED=1, device memory for a live allocation, else
 * unknown to the driver (pageable host memory). */
CUresult
cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr p)
{
    const char *locked = getenv("FAKE_CUDA_QUERY_LOCKED");
    CUresult rc = fake_ready();
    long i;

    if (rc != OK) {
        return rc;
    }
    if (data == NULL || attr != FAKE_ATTR_MEMORY_TYPE) {
        return ERR_INVALID_VALUE;
    }
    pthread_mutex_lock(&fake_mu);
    fake_queries++;
    i = fake_find((uintptr_t)p, 1);
    pthread_mutex_unlock(&fake_mu);
    if (locked != NULL && strcmp(locked, "1") == 0) {
        *(unsigned int *)data = FAKE_MEMORYTYPE_HOST;
        return OK;
    }
    if (i >= 0) {
        *(unsigned int *)data = 2;   /* CU_MEMORYTYPE_DEVICE */
        return OK;
    }
    return ERR_INVALID_VALUE;
}

CUresult
cuGetErrorName(CUresult rc, const char **name)
{
    switch (rc) {
    case OK: *name = "CUDA_SUCCESS"; return OK;
    case ERR_INVALID_VALUE: *name = "CUDA_ERROR_INVALID_VALUE"; return OK;
    case 2: *name = "CUDA_ERROR_OUT_OF_MEMORY"; return OK;
    case ERR_NOT_INITIALIZED: *name = "CUDA_ERROR_NOT_INITIALIZED"; return OK;
    case ERR_INVALID_CONTEXT: *name = "CUDA_ERROR_INVALID_CONTEXT"; return OK;
    case ERR_LAUNCH_FAILED: *name = "CUDA_ERROR_LAUNCH_FAILED"; return OK;
    default: *name = NULL; return ERR_INVALID_VALUE;
    }
}

__attribute__((destructor)) static void
fake_report(void)
{
    const char *on = getenv("FAKE_CUDA_STATS");

    if (on == NULL || strcmp(on, "1") != 0) {
        return;
    }
    fprintf(stderr,
            "fake_cuda: allocs=%ld frees=%ld max_live=%ld live=%ld "
            "streams=%ld copies=%ld syncs=%ld scopies=%ld legacy=%ld "
            "legacy_syncs=%ld queries=%ld host_allocs=%ld host_frees=%ld\n",
            fake_allocs, fake_frees, fake_max_live, fake_nlive, fake_streams,
            fake_copies, fake_syncs, fake_scopies, fake_legacy,
            fake_legacy_syncs, fake_queries, fake_host_allocs,
            fake_host_frees);
}
