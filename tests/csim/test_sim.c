/* SPDX-License-Identifier: MIT */
/*
 * test_sim.c: standalone tests of the CPU simulator (csrc/sim/): devices
 * and initialisation, contexts, memory, copies, fork and IPC.  Streams,
 * events, host functions and stream-ordered pools are in
 * test_sim_streams.c; what both use (expect_abort, the gate) in
 * csim_sim.h.
 *
 * Build and run with tests/csim/Makefile (`make -C tests/csim check`),
 * which links sim.c directly under ASan+UBSan and under TSan.
 *
 * Each group runs in its own child process, because the simulator reads
 * its environment once, at cuInit, and cannot be initialised again after
 * a fork; the parent never calls cuInit.
 */
#include "csim_sim.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* Groups                                                              */
/* ------------------------------------------------------------------ */

static void
group_init_and_devices(void)
{
    const char *s = NULL;
    int v = 0, n = 0;
    char name[64], bus[32];
    CUdevice dev = -1;
    CUuuid u1, u2;
    size_t total = 0;
    unsigned int flags = 1;
    int active = 1;

    /* Before cuInit. */
    EXPECT(cu.DeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT(cu.MemAlloc(NULL, 1), CUDA_ERROR_NOT_INITIALIZED);
    OK(cu.DriverGetVersion(&v));
    CHECK(v == 13000);
    OK(cu.GetErrorName(CUDA_ERROR_INVALID_VALUE, &s));
    CHECK(s && strcmp(s, "CUDA_ERROR_INVALID_VALUE") == 0);
    OK(cu.GetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &s));
    CHECK(s && strcmp(s, "out of memory") == 0);
    OK(cu.GetErrorName(CUDA_ERROR_CONTEXT_IS_DESTROYED, &s));
    CHECK(s && strcmp(s, "CUDA_ERROR_CONTEXT_IS_DESTROYED") == 0);
    OK(cu.GetErrorName(CUDA_ERROR_UNKNOWN, &s));
    OK(cu.GetErrorName(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, &s));
    EXPECT(cu.GetErrorName((CUresult)12345, &s), CUDA_ERROR_INVALID_VALUE);
    CHECK(s == NULL);
    s = "x";
    EXPECT(cu.GetErrorString((CUresult)12345, &s), CUDA_ERROR_INVALID_VALUE);
    CHECK(s == NULL);
    EXPECT(cu.Init(1), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.DeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
    OK(cu.Init(0));
    OK(cu.Init(0));

    OK(cu.DeviceGetCount(&n));
    CHECK(n == 2);
    OK(cu.DeviceGet(&dev, 1));
    CHECK(dev == 1);
    EXPECT(cu.DeviceGet(&dev, 2), CUDA_ERROR_INVALID_DEVICE);
    EXPECT(cu.DeviceGet(&dev, -1), CUDA_ERROR_INVALID_DEVICE);
    OK(cu.DeviceGetName(name, sizeof(name), 0));
    CHECK(strcmp(name, "cudamem simulator") == 0);
    EXPECT(cu.DeviceGetName(name, sizeof(name), 5), CUDA_ERROR_INVALID_DEVICE);
    OK(cu.DeviceGetPCIBusId(bus, sizeof(bus), 1));
    CHECK(strcmp(bus, "0000:02:00.0") == 0);
    OK(cu.DeviceGetUuid(&u1, 0));
    OK(cu.DeviceGetUuid(&u2, 0));
    CHECK(memcmp(&u1, &u2, sizeof(u1)) == 0);
    OK(cu.DeviceGetUuid(&u2, 1));
    CHECK(memcmp(&u1, &u2, sizeof(u1)) != 0);
    OK(cu.DeviceTotalMem(&total, 0));
    CHECK(total == ((size_t)1 << 30));

    OK(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0));
    CHECK(v == 132);
    OK(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                             0));
    CHECK(v == 9);
    OK(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                             0));
    CHECK(v == 0);
    OK(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 0));
    CHECK(v == 32);
    OK(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, 0));
    CHECK(v == 2147483647);
    OK(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 1));
    CHECK(v == 2);
    OK(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 0));
    CHECK(v == 1);
    OK(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS,
                             0));
    CHECK(v == 0);
    v = 7;
    OK(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_WIDTH,
                             0));
    CHECK(v == 0);
    EXPECT(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX, 0),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 9),
           CUDA_ERROR_INVALID_DEVICE);

    OK(cu.DeviceCanAccessPeer(&v, 0, 1));
    CHECK(v == 1);
    OK(cu.DeviceCanAccessPeer(&v, 1, 1));
    CHECK(v == 0);
    OK(cu.DevicePrimaryCtxGetState(0, &flags, &active));
    CHECK(flags == 0 && active == 0);
    /* Not modelled: left NULL for the caller to report. */
    CHECK(cu.LaunchKernel == NULL);
    CHECK(cu.ModuleLoadData == NULL);

    /* The profiler calls do nothing, but need a current context. */
    EXPECT(cu.ProfilerStart(), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cu.ProfilerStop(), CUDA_ERROR_INVALID_CONTEXT);
    retain_and_push(0);
    OK(cu.ProfilerStart());
    OK(cu.ProfilerStop());
    OK(cu.DevicePrimaryCtxReset(0));
    EXPECT(cu.ProfilerStart(), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    EXPECT(cu.ProfilerStop(), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    OK(cu.CtxPopCurrent(NULL));
    EXPECT(cu.ProfilerStop(), CUDA_ERROR_INVALID_CONTEXT);
    OK(cu.DevicePrimaryCtxRelease(0));
}

/* A stream of a context that a reset has destroyed, with work queued
 * before the reset. */
static CUstream
stream_of_reset_context(void)
{
    CUdeviceptr d;
    CUstream s;

    OK(cu.Init(0));
    retain_and_push(0);
    OK(cu.MemAlloc(&d, 1000));
    OK(cu.StreamCreate(&s, 0));
    OK(cu.MemsetD8Async(d, 1, 1000, s));
    OK(cu.DevicePrimaryCtxReset(0));
    return s;
}

static void
abort_query_stream_of_reset_context(void)
{
    CUstream s = stream_of_reset_context();

    abort_expect("stream handle %p is not a live stream: the driver would "
                 "crash here", (void *)s);
    (void)cu.StreamQuery(s);
}

static void
abort_destroy_stream_of_reset_context(void)
{
    CUstream s = stream_of_reset_context();

    abort_expect("cuStreamDestroy of %p, not a live stream: the driver "
                 "would crash here", (void *)s);
    (void)cu.StreamDestroy(s);
}

static void *
reset_thread(void *p)
{
    CUresult *rc = p;

    *rc = cu.DevicePrimaryCtxReset(0);
    return NULL;
}

/* While a reset waits for its context's streams to drain, their handles
 * still name streams, but streams that take no more work. */
static void
check_reset_while_draining(void)
{
    CUresult rc = CUDA_ERROR_UNKNOWN;
    CUdevice dev = -1;
    unsigned int flags;
    int active = 1;
    pthread_t th;
    CUstream s;
    gate g;
    gate g2;

    retain_and_push(0);
    OK(cu.StreamCreate(&s, 0));
    gate_init(&g);
    gate_init(&g2);
    OK(cu.LaunchHostFunc(s, gate_fn, &g));
    gate_wait_entered(&g);
    CHECK(pthread_create(&th, NULL, reset_thread, &rc) == 0);
    /* The reset takes the context off the device first (under the
     * simulator's lock, which it keeps until it waits for s). */
    while (active) {
        OK(cu.DevicePrimaryCtxGetState(0, &flags, &active));
        if (active) {
            sleep_ms(1);
        }
    }
    EXPECT(cu.CtxGetDevice(&dev), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    EXPECT(cu.StreamQuery(s), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cu.StreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cu.LaunchHostFunc(s, gate_fn, &g2), CUDA_ERROR_INVALID_HANDLE);
    gate_open(&g);
    CHECK(pthread_join(th, NULL) == 0);
    OK(rc);
    gate_fini(&g);
    gate_fini(&g2);
    OK(cu.CtxPopCurrent(NULL));
    OK(cu.DevicePrimaryCtxRelease(0));
}

static void
group_contexts(void)
{
    CUcontext c0, c1, cur, old, c0b;
    CUdevice dev = -1;
    CUdeviceptr d;
    CUstream s;
    size_t freeb, total;
    int active = 0;
    unsigned int flags;

    expect_abort(abort_query_stream_of_reset_context);
    expect_abort(abort_destroy_stream_of_reset_context);

    OK(cu.Init(0));
    OK(cu.CtxGetCurrent(&cur));
    CHECK(cur == NULL);
    EXPECT(cu.CtxGetDevice(&dev), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cu.MemAlloc(&d, 16), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cu.CtxPopCurrent(&old), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cu.CtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cu.DevicePrimaryCtxRelease(0), CUDA_ERROR_INVALID_CONTEXT);

    OK(cu.DevicePrimaryCtxRetain(&c0, 0));
    OK(cu.DevicePrimaryCtxRetain(&c0b, 0));
    CHECK(c0 == c0b);
    OK(cu.DevicePrimaryCtxRetain(&c1, 1));
    CHECK(c0 != c1);
    OK(cu.DevicePrimaryCtxGetState(0, &flags, &active));
    CHECK(active == 1);
    EXPECT(cu.CtxPushCurrent((CUcontext)(void *)&dev),
           CUDA_ERROR_INVALID_CONTEXT);

    OK(cu.CtxPushCurrent(c0));
    OK(cu.CtxPushCurrent(c1));
    OK(cu.CtxGetDevice(&dev));
    CHECK(dev == 1);
    OK(cu.CtxPopCurrent(&old));
    CHECK(old == c1);
    OK(cu.CtxGetCurrent(&cur));
    CHECK(cur == c0);
    OK(cu.CtxSetCurrent(c1));           /* replaces the top */
    OK(cu.CtxGetCurrent(&cur));
    CHECK(cur == c1);
    OK(cu.CtxSetCurrent(NULL));         /* pops */
    OK(cu.CtxGetCurrent(&cur));
    CHECK(cur == NULL);
    OK(cu.CtxSetCurrent(NULL));         /* no-op on an empty stack */
    OK(cu.CtxSetCurrent(c0));           /* pushes on an empty stack */

    /* Peers. */
    OK(cu.CtxEnablePeerAccess(c1, 0));
    EXPECT(cu.CtxEnablePeerAccess(c1, 0),
           CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
    EXPECT(cu.CtxEnablePeerAccess(c0, 0), CUDA_ERROR_INVALID_DEVICE);
    EXPECT(cu.CtxEnablePeerAccess(c1, 1), CUDA_ERROR_INVALID_VALUE);

    /* Reset destroys: memory back, stale handles detected (its streams
     * are no longer streams: the driver would crash on them, see
     * abort_query_stream_of_reset_context). */
    OK(cu.MemAlloc(&d, 1000));
    OK(cu.StreamCreate(&s, 0));
    OK(cu.MemsetD8Async(d, 1, 1000, s));
    OK(cu.MemGetInfo(&freeb, &total));
    CHECK(total - freeb == 1024);
    OK(cu.DevicePrimaryCtxReset(0));
    OK(cu.DevicePrimaryCtxGetState(0, &flags, &active));
    CHECK(active == 0);
    EXPECT(cu.CtxGetDevice(&dev), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    EXPECT(cu.MemAlloc(&d, 16), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    EXPECT(cu.StreamCreate(&s, 0), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    EXPECT(cu.CtxPushCurrent(c0), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    OK(cu.CtxGetCurrent(&cur));
    CHECK(cur == c0);
    /* A new retain makes a new context with all memory free, under the
     * same handle, as the driver does: the thread that kept the old one
     * current uses the new one without a push. */
    OK(cu.DevicePrimaryCtxRetain(&c0b, 0));
    CHECK(c0b == c0);
    OK(cu.CtxGetDevice(&dev));
    CHECK(dev == 0);
    OK(cu.MemGetInfo(&freeb, &total));
    CHECK(freeb == total);
    OK(cu.CtxPopCurrent(&old));
    CHECK(old == c0);
    OK(cu.CtxPushCurrent(c0b));
    EXPECT(cu.MemFree(d), CUDA_ERROR_INVALID_VALUE);
    /* The peer access went with the old context. */
    OK(cu.CtxSetCurrent(c1));
    OK(cu.CtxEnablePeerAccess(c0b, 0));
    OK(cu.CtxPopCurrent(NULL));

    /* Releases: three retains of device 0 (one before reset), one of 1. */
    OK(cu.DevicePrimaryCtxRelease(0));
    OK(cu.DevicePrimaryCtxRelease(0));
    OK(cu.DevicePrimaryCtxGetState(0, &flags, &active));
    CHECK(active == 1);
    OK(cu.DevicePrimaryCtxRelease(0));  /* to 0: destroyed */
    OK(cu.DevicePrimaryCtxGetState(0, &flags, &active));
    CHECK(active == 0);
    EXPECT(cu.DevicePrimaryCtxRelease(0), CUDA_ERROR_INVALID_CONTEXT);
    OK(cu.DevicePrimaryCtxRelease(1));

    check_reset_while_draining();
}

static void
group_memory(void)
{
    CUdeviceptr d, d2, m, base = 0, dp = 0;
    size_t freeb, total, size = 0, sz;
    char *h = NULL, *reg;
    unsigned int u = 9;
    CUcontext ctx, pc = NULL;
    void *hp = NULL;
    int ord = -1;
    CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, 0};

    OK(cu.Init(0));
    ctx = retain_and_push(0);
    OK(cu.MemGetInfo(&freeb, &total));
    CHECK(total == 1048576 && freeb == total);
    EXPECT(cu.MemAlloc(&d, 0), CUDA_ERROR_INVALID_VALUE);
    OK(cu.MemAlloc(&d, 1));
    CHECK(d % 256 == 0);
    OK(cu.MemGetInfo(&freeb, &total));
    CHECK(freeb == total - 256);
    EXPECT(cu.MemAlloc(&d2, 1048576), CUDA_ERROR_OUT_OF_MEMORY);
    OK(cu.MemAlloc(&d2, 1048576 - 256));
    OK(cu.MemGetInfo(&freeb, &total));
    CHECK(freeb == 0);
    EXPECT(cu.MemAlloc(&m, 1), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT(cu.MemFree(d2 + 8), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemFree(0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemFree((CUdeviceptr)(uintptr_t)&size),
           CUDA_ERROR_INVALID_VALUE);
    OK(cu.MemFree(d2));
    EXPECT(cu.MemFree(d2), CUDA_ERROR_INVALID_VALUE);   /* double free */
    OK(cu.MemGetAddressRange(&base, &size, d + 0));
    CHECK(base == d && size == 1);
    EXPECT(cu.MemGetAddressRange(&base, &size, d + 1), CUDA_ERROR_NOT_FOUND);

    /* Managed. */
    EXPECT(cu.MemAllocManaged(&m, 100, 4), CUDA_ERROR_INVALID_VALUE);
    OK(cu.MemAllocManaged(&m, 100, CU_MEM_ATTACH_GLOBAL));
    OK(cu.MemGetInfo(&freeb, &total));
    CHECK(freeb == total - 512);
    OK(cu.PointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_IS_MANAGED, m + 5));
    CHECK(u == 1);
    OK(cu.PointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, m));
    CHECK(u == CU_MEMORYTYPE_DEVICE);
    OK(cu.PointerGetAttribute(&hp, CU_POINTER_ATTRIBUTE_HOST_POINTER, m));
    CHECK(hp == (void *)(uintptr_t)m);
    OK(cu.MemPrefetchAsync(m, 100, loc, 0, NULL));
    EXPECT(cu.MemPrefetchAsync(m, 101, loc, 0, NULL),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemPrefetchAsync(d, 1, loc, 0, NULL), CUDA_ERROR_INVALID_VALUE);
    OK(cu.MemAdvise(m, 50, CU_MEM_ADVISE_SET_READ_MOSTLY, loc));
    EXPECT(cu.MemAdvise(d, 1, CU_MEM_ADVISE_SET_READ_MOSTLY, loc),
           CUDA_ERROR_INVALID_VALUE);
    loc.id = 7;
    EXPECT(cu.MemPrefetchAsync(m, 100, loc, 0, NULL),
           CUDA_ERROR_INVALID_VALUE);
    OK(cu.MemFree(m));

    /* Pointer attributes of device memory. */
    OK(cu.PointerGetAttribute(&pc, CU_POINTER_ATTRIBUTE_CONTEXT, d));
    CHECK(pc == ctx);
    OK(cu.PointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d));
    CHECK(u == CU_MEMORYTYPE_DEVICE);
    OK(cu.PointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_IS_MANAGED, d));
    CHECK(u == 0);
    OK(cu.PointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d));
    CHECK(ord == 0);
    EXPECT(cu.PointerGetAttribute(&hp, CU_POINTER_ATTRIBUTE_HOST_POINTER, d),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.PointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                  (CUdeviceptr)(uintptr_t)&u),
           CUDA_ERROR_INVALID_VALUE);

    /* Pinned host memory. */
    EXPECT(cu.MemHostAlloc((void **)&h, 64, 8), CUDA_ERROR_INVALID_VALUE);
    OK(cu.MemHostAlloc((void **)&h, 4096, CU_MEMHOSTALLOC_DEVICEMAP));
    OK(cu.MemGetInfo(&freeb, &total));
    CHECK(freeb == total - 256);        /* not charged */
    OK(cu.MemHostGetDevicePointer(&dp, h + 10, 0));
    CHECK(dp == (CUdeviceptr)(uintptr_t)(h + 10));
    OK(cu.PointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dp));
    CHECK(u == CU_MEMORYTYPE_HOST);
    OK(cu.PointerGetAttribute(&sz, CU_POINTER_ATTRIBUTE_RANGE_SIZE, dp));
    CHECK(sz == 4096);
    OK(cu.PointerGetAttribute(&base, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                              dp));
    CHECK(base == (CUdeviceptr)(uintptr_t)h);
    EXPECT(cu.MemHostRegister(h + 100, 10, 0),
           CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    /* Copies into pinned memory through its device pointer. */
    OK(cu.MemsetD8(dp, 0x5a, 16));
    CHECK(h[10] == 0x5a && h[25] == 0x5a && h[26] != 0x5a - 1000);
    EXPECT(cu.MemsetD8(dp, 0, 4096), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemFreeHost(h + 1), CUDA_ERROR_INVALID_VALUE);
    OK(cu.MemFreeHost(h));
    EXPECT(cu.MemFreeHost(h), CUDA_ERROR_INVALID_VALUE);

    /* Registered host memory. */
    reg = malloc(1000);
    EXPECT(cu.MemHostGetDevicePointer(&dp, reg, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemHostRegister(reg, 1000, 0x100), CUDA_ERROR_INVALID_VALUE);
    OK(cu.MemHostRegister(reg + 100, 500, CU_MEMHOSTREGISTER_DEVICEMAP));
    EXPECT(cu.MemHostRegister(reg, 101, 0),
           CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    EXPECT(cu.MemHostRegister(reg + 599, 10, 0),
           CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    OK(cu.MemHostRegister(reg, 100, 0));        /* adjacent is fine */
    OK(cu.MemHostRegister(reg + 600, 400, 0));
    OK(cu.MemHostGetDevicePointer(&dp, reg + 150, 0));
    CHECK(dp == (CUdeviceptr)(uintptr_t)(reg + 150));
    OK(cu.PointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_MAPPED, dp));
    CHECK(u == 1);
    EXPECT(cu.MemHostUnregister(reg + 150),
           CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    OK(cu.MemHostUnregister(reg + 100));
    EXPECT(cu.MemHostUnregister(reg + 100),
           CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    OK(cu.MemHostUnregister(reg));
    OK(cu.MemHostUnregister(reg + 600));
    free(reg);

    OK(cu.MemFree(d));
    OK(cu.CtxPopCurrent(NULL));
    OK(cu.DevicePrimaryCtxRelease(0));
}

static void
group_copies(void)
{
    CUdeviceptr d, e;
    unsigned char src[256], dst[256], grid[8][16], out[8][16];
    unsigned char cube[3][4][8], cout[3][4][8];
    CUDA_MEMCPY2D p2;
    CUDA_MEMCPY3D p3;
    int i, x, y, z, ok;

    OK(cu.Init(0));
    retain_and_push(0);
    for (i = 0; i < 256; i++) {
        src[i] = (unsigned char)i;
    }
    OK(cu.MemAlloc(&d, 256));
    OK(cu.MemAlloc(&e, 256));
    OK(cu.MemcpyHtoD(d, src, 256));
    OK(cu.MemcpyDtoD(e, d, 256));
    memset(dst, 0, sizeof(dst));
    OK(cu.MemcpyDtoH(dst, e, 256));
    CHECK(memcmp(src, dst, 256) == 0);
    OK(cu.MemcpyHtoD(d, src, 0));               /* size 0: no-op */
    OK(cu.MemcpyHtoD(0, NULL, 0));
    EXPECT(cu.MemcpyHtoD(d, src, 257), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemcpyHtoD(d + 1, src, 256), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemcpyDtoH(dst, d + 200, 57), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemcpyDtoD(e, (CUdeviceptr)(uintptr_t)src, 16),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemcpyHtoD((CUdeviceptr)(uintptr_t)dst, src, 16),
           CUDA_ERROR_INVALID_VALUE);
    OK(cu.MemsetD8(d, 0xab, 256));
    OK(cu.MemcpyDtoH(dst, d, 256));
    CHECK(dst[0] == 0xab && dst[255] == 0xab);
    EXPECT(cu.MemsetD8(d + 1, 0, 256), CUDA_ERROR_INVALID_VALUE);

    /* 2D: host 8x16 grid -> device rows of pitch 32 -> host. */
    for (y = 0; y < 8; y++) {
        for (x = 0; x < 16; x++) {
            grid[y][x] = (unsigned char)(y * 16 + x);
        }
    }
    OK(cu.MemsetD8(d, 0, 256));
    memset(&p2, 0, sizeof(p2));
    p2.srcMemoryType = CU_MEMORYTYPE_HOST;
    p2.srcHost = grid;
    p2.srcPitch = 16;
    p2.srcXInBytes = 4;
    p2.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    p2.dstDevice = d;
    p2.dstPitch = 32;
    p2.WidthInBytes = 12;
    p2.Height = 8;
    OK(cu.Memcpy2D(&p2));
    OK(cu.MemcpyDtoH(dst, d, 256));
    ok = 1;
    for (y = 0; y < 8; y++) {
        for (x = 0; x < 32; x++) {
            int want = x < 12 ? y * 16 + x + 4 : 0;
            ok &= dst[y * 32 + x] == want;
        }
    }
    CHECK(ok);
    /* Back with UNIFIED on both sides, into a strided host grid. */
    memset(out, 0, sizeof(out));
    memset(&p2, 0, sizeof(p2));
    p2.srcMemoryType = CU_MEMORYTYPE_UNIFIED;
    p2.srcDevice = d;
    p2.srcPitch = 32;
    p2.dstMemoryType = CU_MEMORYTYPE_UNIFIED;
    p2.dstDevice = (CUdeviceptr)(uintptr_t)out;
    p2.dstPitch = 16;
    p2.dstY = 1;
    p2.WidthInBytes = 12;
    p2.Height = 7;
    OK(cu.Memcpy2DAsync(&p2, NULL));
    OK(cu.StreamSynchronize(NULL));
    CHECK(out[0][0] == 0 && out[1][0] == 4 && out[7][11] == 6 * 16 + 15);
    /* Validation. */
    p2.srcPitch = 11;
    EXPECT(cu.Memcpy2D(&p2), CUDA_ERROR_INVALID_VALUE);
    p2.srcPitch = 32;
    p2.Height = 9;                      /* 9 rows of 32 do not fit */
    p2.dstY = 0;
    p2.dstDevice = (CUdeviceptr)(uintptr_t)grid;
    p2.dstPitch = 12;
    EXPECT(cu.Memcpy2D(&p2), CUDA_ERROR_INVALID_VALUE);
    p2.Height = 7;
    p2.srcMemoryType = CU_MEMORYTYPE_ARRAY;
    EXPECT(cu.Memcpy2D(&p2), CUDA_ERROR_NOT_SUPPORTED);
    p2.srcMemoryType = (CUmemorytype)9;
    EXPECT(cu.Memcpy2D(&p2), CUDA_ERROR_INVALID_VALUE);

    /* 3D: a 3x4x8 host cube into device slices of 5 rows of pitch 10. */
    for (z = 0; z < 3; z++) {
        for (y = 0; y < 4; y++) {
            for (x = 0; x < 8; x++) {
                cube[z][y][x] = (unsigned char)(z * 100 + y * 10 + x);
            }
        }
    }
    memset(&p3, 0, sizeof(p3));
    p3.srcMemoryType = CU_MEMORYTYPE_HOST;
    p3.srcHost = cube;
    p3.srcPitch = 8;
    p3.srcHeight = 4;
    p3.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    p3.dstDevice = e;
    p3.dstPitch = 10;
    p3.dstHeight = 5;
    p3.WidthInBytes = 8;
    p3.Height = 4;
    p3.Depth = 3;
    OK(cu.MemsetD8(e, 0xee, 256));
    OK(cu.Memcpy3D(&p3));
    OK(cu.MemcpyDtoH(dst, e, 256));
    CHECK(dst[0] == 0 && dst[8] == 0xee && dst[10] == 10);
    CHECK(dst[50 + 3 * 10 + 7] == 137 && dst[40] == 0xee);
    /* And back, with offsets on the device side. */
    memset(cout, 0, sizeof(cout));
    memset(&p3, 0, sizeof(p3));
    p3.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    p3.srcDevice = e;
    p3.srcPitch = 10;
    p3.srcHeight = 5;
    p3.srcY = 1;
    p3.srcZ = 1;
    p3.srcXInBytes = 2;
    p3.dstMemoryType = CU_MEMORYTYPE_HOST;
    p3.dstHost = cout;
    p3.dstPitch = 8;
    p3.dstHeight = 4;
    p3.WidthInBytes = 6;
    p3.Height = 3;
    p3.Depth = 2;
    OK(cu.Memcpy3DAsync(&p3, NULL));
    OK(cu.CtxSynchronize());
    CHECK(cout[0][0][0] == 112 && cout[1][2][5] == 237);
    p3.srcHeight = 3;                   /* < Height + srcY */
    EXPECT(cu.Memcpy3D(&p3), CUDA_ERROR_INVALID_VALUE);
    p3.srcHeight = 5;
    p3.Depth = 5;                       /* runs past the allocation */
    EXPECT(cu.Memcpy3D(&p3), CUDA_ERROR_INVALID_VALUE);
    p3.Depth = 2;
    p3.srcLOD = 1;
    EXPECT(cu.Memcpy3D(&p3), CUDA_ERROR_INVALID_VALUE);

    OK(cu.MemFree(d));
    OK(cu.MemFree(e));
    OK(cu.CtxPopCurrent(NULL));
    OK(cu.DevicePrimaryCtxRelease(0));
}

static void
group_fork(void)
{
    pid_t pid;
    int status = 0, n;

    OK(cu.Init(0));
    retain_and_push(0);
    pid = fork();
    if (pid == 0) {
        int bad = 0;
        CUdeviceptr d;
        bad |= cu.Init(0) != CUDA_ERROR_NOT_INITIALIZED;
        bad |= cu.DeviceGetCount(&n) != CUDA_ERROR_NOT_INITIALIZED;
        bad |= cu.MemAlloc(&d, 16) != CUDA_ERROR_NOT_INITIALIZED;
        _exit(bad);
    }
    CHECK(pid > 0);
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    OK(cu.DeviceGetCount(&n));
    OK(cu.CtxPopCurrent(NULL));
    OK(cu.DevicePrimaryCtxRelease(0));
}

/* ------------------------------------------------------------------ */
/* IPC: an exporter and an importer process                            */
/* ------------------------------------------------------------------ */

/* Read exactly n bytes from fd; 0 or -1. */
static int
read_full(int fd, void *buf, size_t n)
{
    size_t got = 0;
    ssize_t r;

    while (got < n) {
        r = read(fd, (char *)buf + got, n - got);
        if (r <= 0) {
            return -1;
        }
        got += (size_t)r;
    }
    return 0;
}

/* The importer: gets two handles (live, then freed), checks each. */
static void
ipc_importer(int rfd, int wfd)
{
    CUipcMemHandle h;
    CUipcMemHandle bad;
    CUdeviceptr d = 0;
    CUdeviceptr d2 = 0;
    CUdeviceptr base = 0;
    size_t size = 0;
    unsigned char buf[5000];
    char ok = 1;
    size_t i;

    OK(cu.Init(0));
    retain_and_push(0);
    CHECK(read_full(rfd, &h, sizeof(h)) == 0);
    EXPECT(cu.IpcOpenMemHandle(NULL, h, 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.IpcOpenMemHandle(&d, h, 2), CUDA_ERROR_INVALID_VALUE);
    memset(&bad, 0, sizeof(bad));
    EXPECT(cu.IpcOpenMemHandle(&d, bad, 1), CUDA_ERROR_INVALID_VALUE);
    OK(cu.IpcOpenMemHandle(&d, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    /* A second open counts and gives the same pointer. */
    OK(cu.IpcOpenMemHandle(&d2, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    CHECK(d == d2);
    OK(cu.MemGetAddressRange(&base, &size, d + 10));
    CHECK(base == d && size == sizeof(buf));
    OK(cu.MemcpyDtoH(buf, d, sizeof(buf)));
    for (i = 0; i < sizeof(buf); i++) {
        CHECK(buf[i] == (unsigned char)(i * 7));
    }
    OK(cu.MemsetD8(d + 100, 0xAB, 50));
    EXPECT(cu.MemFree(d), CUDA_ERROR_INVALID_VALUE);
    OK(cu.IpcCloseMemHandle(d));
    OK(cu.MemcpyDtoH(buf, d, 1));   /* still open once */
    OK(cu.IpcCloseMemHandle(d));
    EXPECT(cu.IpcCloseMemHandle(d), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemcpyDtoH(buf, d, 1), CUDA_ERROR_INVALID_VALUE);
    CHECK(write(wfd, &ok, 1) == 1);
    /* The second handle's allocation was freed before it was sent. */
    CHECK(read_full(rfd, &h, sizeof(h)) == 0);
    EXPECT(cu.IpcOpenMemHandle(&d, h, 1), CUDA_ERROR_INVALID_VALUE);
    ok = failures == 0;
    CHECK(write(wfd, &ok, 1) == 1);
}

static void
group_ipc(void)
{
    int to_child[2];
    int to_parent[2];
    CUipcMemHandle h;
    CUipcMemHandle h2;
    CUdeviceptr d = 0;
    CUdeviceptr m = 0;
    CUdeviceptr e = 0;
    unsigned char buf[5000];
    char ok = 0;
    size_t i;
    pid_t pid;
    int status = 0;

    CHECK(pipe(to_child) == 0 && pipe(to_parent) == 0);
    pid = fork();
    if (pid == 0) {
        /* Forked before cuInit: a fresh simulator of its own. */
        close(to_child[1]);
        close(to_parent[0]);
        ipc_importer(to_child[0], to_parent[1]);
        exit(failures ? 1 : 0);
    }
    close(to_child[0]);
    close(to_parent[1]);
    OK(cu.Init(0));
    retain_and_push(0);
    EXPECT(cu.IpcGetMemHandle(&h, 0), CUDA_ERROR_INVALID_VALUE);
    OK(cu.MemAlloc(&d, sizeof(buf)));
    for (i = 0; i < sizeof(buf); i++) {
        buf[i] = (unsigned char)(i * 7);
    }
    OK(cu.MemcpyHtoD(d, buf, sizeof(buf)));
    EXPECT(cu.IpcGetMemHandle(NULL, d), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.IpcGetMemHandle(&h, d + 1), CUDA_ERROR_INVALID_VALUE);
    OK(cu.MemAllocManaged(&m, 64, CU_MEM_ATTACH_GLOBAL));
    EXPECT(cu.IpcGetMemHandle(&h, m), CUDA_ERROR_INVALID_VALUE);
    OK(cu.IpcGetMemHandle(&h, d));
    /* Exporting again gives the same handle; contents stayed. */
    OK(cu.IpcGetMemHandle(&h2, d));
    CHECK(memcmp(&h, &h2, sizeof(h)) == 0);
    memset(buf, 0, sizeof(buf));
    OK(cu.MemcpyDtoH(buf, d, sizeof(buf)));
    CHECK(buf[4999] == (unsigned char)(4999 * 7));
    /* Not in the process that exported it. */
    EXPECT(cu.IpcOpenMemHandle(&e, h, 1), CUDA_ERROR_INVALID_CONTEXT);
    CHECK(write(to_child[1], &h, sizeof(h)) == (ssize_t)sizeof(h));
    CHECK(read_full(to_parent[0], &ok, 1) == 0 && ok);
    /* The importer's write is visible here. */
    OK(cu.MemcpyDtoH(buf, d, sizeof(buf)));
    CHECK(buf[99] == (unsigned char)(99 * 7) && buf[100] == 0xAB
          && buf[149] == 0xAB && buf[150] == (unsigned char)(150 * 7));
    OK(cu.MemFree(d));
    OK(cu.MemFree(m));
    /* A freed allocation's handle. */
    OK(cu.MemAlloc(&d, 100));
    OK(cu.IpcGetMemHandle(&h, d));
    OK(cu.MemFree(d));
    CHECK(write(to_child[1], &h, sizeof(h)) == (ssize_t)sizeof(h));
    CHECK(read_full(to_parent[0], &ok, 1) == 0 && ok);
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* ------------------------------------------------------------------ */
/* Driver                                                              */
/* ------------------------------------------------------------------ */

static const group groups[] = {
    {"init_and_devices", group_init_and_devices, "CUDAMEM_SIM_DEVICES=2", 0},
    {"contexts", group_contexts, "CUDAMEM_SIM_DEVICES=2", 0},
    {"memory", group_memory, "CUDAMEM_SIM_MEMORY=1048576", 0},
    {"copies", group_copies, NULL, 0},
    {"fork", group_fork, NULL, 0},
    {"ipc", group_ipc, NULL, 0},
};


int
main(int argc, char **argv)
{
    return run_sim_groups(groups, sizeof(groups) / sizeof(groups[0]), argc,
                          argv);
}
