/* SPDX-License-Identifier: MIT */
/*
 * test_vmm.c: standalone tests of the simulator's virtual memory
 * management (csrc/sim/vmm.c): every call's success path, the driver's
 * errors for misuse, aliasing, memory accounting, and VMM memory seen by
 * copies, memsets, kernels, pointer queries, peers and another process.
 *
 * Build and run with tests/csim/Makefile (`make -C tests/csim check`),
 * under ASan+UBSan and under TSan.  Each group runs in a child process
 * of its own, as in test_sim.c: the simulator reads its environment once,
 * at cuInit.
 */
#include "csim_check.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define G ((size_t)2 << 20)


/* Properties of a pinned allocation on dev with handle types types. */
static CUmemAllocationProp
prop_on(int dev, unsigned int types)
{
    CUmemAllocationProp p;

    memset(&p, 0, sizeof(p));
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev;
    p.requestedHandleTypes = (CUmemAllocationHandleType)types;
    return p;
}

/* Read-write access for device dev over [p, p + n). */
static CUresult
grant(CUdeviceptr p, size_t n, int dev)
{
    CUmemAccessDesc d;

    memset(&d, 0, sizeof(d));
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = dev;
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return cu.MemSetAccess(p, n, &d, 1);
}

/* The access flags device dev has at p (or ~0 on failure). */
static unsigned long long
access_of(CUdeviceptr p, int dev)
{
    CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, dev};
    unsigned long long f = ~0ull;

    OK(cu.MemGetAccess(&f, &loc, p));
    return f;
}

static size_t
free_bytes(void)
{
    size_t fr = 0, total = 0;

    OK(cu.MemGetInfo(&fr, &total));
    return fr;
}

/* ------------------------------------------------------------------ */
/* Properties, granularity, reservations                               */
/* ------------------------------------------------------------------ */

/* A host function that holds its stream until vmm_gate_open is set. */
static int vmm_gate_open;

static void CUDA_CB
vmm_gate(void *arg)
{
    (void)arg;
    while (!__atomic_load_n(&vmm_gate_open, __ATOMIC_ACQUIRE)) {
        usleep(100);
    }
}

static void
group_props(void)
{
    CUmemAllocationProp p = prop_on(0, 0);
    CUmemAllocationProp q;
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr r = 0;
    CUdeviceptr r2 = 0;
    CUdeviceptr d = 0;
    size_t g = 0;
    int v = 0;

    OK(cu.Init(0));
    OK(cu.DeviceGetAttribute(
        &v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
    CHECK(v == 1);
    OK(cu.DeviceGetAttribute(
        &v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
        0));
    CHECK(v == 1);
    OK(cu.MemGetAllocationGranularity(&g, &p,
                                      CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CHECK(g == G);
    OK(cu.MemGetAllocationGranularity(&g, &p,
                                      CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    CHECK(g == G);
    EXPECT(cu.MemGetAllocationGranularity(
               &g, &p, (CUmemAllocationGranularity_flags)7),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemGetAllocationGranularity(
               NULL, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemGetAllocationGranularity(
               &g, NULL, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
           CUDA_ERROR_INVALID_VALUE);
    /* Bad properties, at the granularity query and at create. */
    q = p;
    q.location.id = 3;
    EXPECT(cu.MemGetAllocationGranularity(&g, &q,
                                          CU_MEM_ALLOC_GRANULARITY_MINIMUM),
           CUDA_ERROR_INVALID_DEVICE);
    EXPECT(cu.MemCreate(&h, G, &q, 0), CUDA_ERROR_INVALID_DEVICE);
    q.location.id = -1;
    EXPECT(cu.MemCreate(&h, G, &q, 0), CUDA_ERROR_INVALID_DEVICE);
    q = p;
    q.location.type = CU_MEM_LOCATION_TYPE_HOST;
    EXPECT(cu.MemCreate(&h, G, &q, 0), CUDA_ERROR_NOT_SUPPORTED);
    q.location.type = CU_MEM_LOCATION_TYPE_INVALID;
    EXPECT(cu.MemCreate(&h, G, &q, 0), CUDA_ERROR_INVALID_VALUE);
    q.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
    EXPECT(cu.MemCreate(&h, G, &q, 0), CUDA_ERROR_INVALID_VALUE);
    q = p;
    q.type = CU_MEM_ALLOCATION_TYPE_INVALID;
    EXPECT(cu.MemCreate(&h, G, &q, 0), CUDA_ERROR_INVALID_VALUE);
    q.type = CU_MEM_ALLOCATION_TYPE_MANAGED;
    EXPECT(cu.MemCreate(&h, G, &q, 0), CUDA_ERROR_NOT_SUPPORTED);
    q = p;
    q.requestedHandleTypes = CU_MEM_HANDLE_TYPE_WIN32;
    EXPECT(cu.MemCreate(&h, G, &q, 0), CUDA_ERROR_INVALID_VALUE);
    q.requestedHandleTypes = (CUmemAllocationHandleType)0x40;
    EXPECT(cu.MemCreate(&h, G, &q, 0), CUDA_ERROR_INVALID_VALUE);
    q.requestedHandleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
    EXPECT(cu.MemCreate(&h, G, &q, 0), CUDA_ERROR_NOT_SUPPORTED);
    q = p;
    q.allocFlags.usage = CU_MEM_CREATE_USAGE_TILE_POOL;
    EXPECT(cu.MemCreate(&h, G, &q, 0), CUDA_ERROR_NOT_SUPPORTED);
    q.allocFlags.usage = 0x100;
    EXPECT(cu.MemCreate(&h, G, &q, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemCreate(&h, G + 4096, &p, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemCreate(&h, 0, &p, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemCreate(&h, G, &p, 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemCreate(NULL, G, &p, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemCreate(&h, G, NULL, 0), CUDA_ERROR_INVALID_VALUE);

    /* A handle's properties read back; unknown handles are refused. */
    OK(cu.MemCreate(&h, G, &p, 0));
    memset(&q, 0xff, sizeof(q));
    OK(cu.MemGetAllocationPropertiesFromHandle(&q, h));
    CHECK(q.type == CU_MEM_ALLOCATION_TYPE_PINNED
          && q.location.type == CU_MEM_LOCATION_TYPE_DEVICE
          && q.location.id == 0 && q.requestedHandleTypes == 0);
    EXPECT(cu.MemGetAllocationPropertiesFromHandle(NULL, h),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemGetAllocationPropertiesFromHandle(&q, h + 1000),
           CUDA_ERROR_INVALID_VALUE);
    OK(cu.MemRelease(h));
    EXPECT(cu.MemRelease(h), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemGetAllocationPropertiesFromHandle(&q, h),
           CUDA_ERROR_INVALID_VALUE);

    /* Reservations: sizes and addresses at the granularity. */
    EXPECT(cu.MemAddressReserve(NULL, G, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemAddressReserve(&r, 0, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemAddressReserve(&r, G + 4096, 0, 0, 0),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemAddressReserve(&r, G, 3 * G, 0, 0),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemAddressReserve(&r, G, 0, 4096, 0),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemAddressReserve(&r, G, 0, 0, 1), CUDA_ERROR_INVALID_VALUE);
    OK(cu.MemAddressReserve(&r, 4 * G, 0, 0, 0));
    CHECK(r != 0 && r % G == 0);
    OK(cu.MemAddressReserve(&r2, G, 8 * G, 0, 0));
    CHECK(r2 % (8 * G) == 0);
    CHECK(r2 + G <= r || r + 4 * G <= r2);
    /* Not in the cuMemAlloc arena, and the other way round. */
    retain_and_push(0);
    OK(cu.MemAlloc(&d, 4096));
    CHECK(d + 4096 <= r || r + 4 * G <= d);
    CHECK(d + 4096 <= r2 || r2 + G <= d);
    OK(cu.MemFree(d));
    /* Freed only whole, at its base and size. */
    EXPECT(cu.MemAddressFree(r, 2 * G), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemAddressFree(r + G, 3 * G), CUDA_ERROR_INVALID_VALUE);
    OK(cu.MemAddressFree(r, 4 * G));
    EXPECT(cu.MemAddressFree(r, 4 * G), CUDA_ERROR_INVALID_VALUE);
    /* A free hint is taken. */
    OK(cu.MemAddressReserve(&d, 4 * G, 0, r, 0));
    CHECK(d == r);
    OK(cu.MemAddressFree(d, 4 * G));
    OK(cu.MemAddressFree(r2, G));
}

/* ------------------------------------------------------------------ */
/* Mapping, access, copies, accounting                                 */
/* ------------------------------------------------------------------ */

static int kernel_runs;

/* A stand-in kernel: adds 1 to the first byte it is given. */
static void CUDA_CB
bump(void *data)
{
    ((unsigned char *)data)[0]++;
    kernel_runs++;
}

static void
group_map(void)
{
    CUmemAllocationProp p = prop_on(0, 0);
    CUmemGenericAllocationHandle h1 = 0, h2 = 0, h3 = 0, hb = 0, hr = 0;
    CUmemAccessDesc d;
    CUdeviceptr r = 0, r2 = 0, base = 0, dev = 0, big = 0;
    CUpointer_attribute attrs[6] = {
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        CU_POINTER_ATTRIBUTE_MAPPED,
        CU_POINTER_ATTRIBUTE_MAPPING_SIZE,
        CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
    };
    unsigned int type = 7, mapped = 7;
    CUdeviceptr start = 0;
    size_t rsize = 0, msize = 0, size = 0, free0;
    unsigned long long types = 7, id = 0;
    void *data[6] = {&type, &start, &rsize, &mapped, &msize, &types};
    void *mbase = NULL;
    CUcontext ctx = (CUcontext)&d;
    CUipcMemHandle ipc;
    unsigned char buf[256], back[256];
    unsigned char *host;
    uintptr_t kstart;
    size_t klen;
    int ord = -1;
    size_t i;

    OK(cu.Init(0));
    retain_and_push(0);
    OK(cu.MemAlloc(&dev, 4096));
    free0 = free_bytes();
    CHECK(free0 == 16 * G - 4096);

    OK(cu.MemAddressReserve(&r, 8 * G, 0, 0, 0));
    OK(cu.MemAddressReserve(&r2, 2 * G, 0, 0, 0));
    OK(cu.MemCreate(&h1, G, &p, 0));
    OK(cu.MemCreate(&h2, G, &p, 0));
    OK(cu.MemCreate(&h3, 2 * G, &p, 0));
    /* cuMemCreate charges the device, as cuMemAlloc does. */
    CHECK(free_bytes() == free0 - 4 * G);
    /* 12 granules left of 16: one more of 13 does not fit. */
    EXPECT(cu.MemCreate(&hb, 13 * G, &p, 0), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(free_bytes() == free0 - 4 * G);
    EXPECT(cu.MemAlloc(&big, 12 * G - 4095), CUDA_ERROR_OUT_OF_MEMORY);

    /* cuMemMap's misuse. */
    EXPECT(cu.MemMap(r + 4096, G, 0, h1, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemMap(r, G + 4096, 0, h1, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemMap(r, G, 4096, h1, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemMap(r, G, G, h1, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemMap(r, 2 * G, 0, h1, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemMap(r, G, 0, h1, 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemMap(r, G, 0, h1 + 1000, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemMap(r, 0, 0, h1, 0), CUDA_ERROR_INVALID_VALUE);
    /* Past the reservation's end, or outside any. */
    EXPECT(cu.MemMap(r2 + G, 2 * G, 0, h3, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemMap(dev & ~(CUdeviceptr)(G - 1), G, 0, h1, 0),
           CUDA_ERROR_INVALID_VALUE);

    /* h1 and h2 side by side, h3 after a hole of one granule. */
    OK(cu.MemMap(r, G, 0, h1, 0));
    OK(cu.MemMap(r + G, G, 0, h2, 0));
    OK(cu.MemMap(r + 3 * G, 2 * G, 0, h3, 0));
    /* Over a mapped range, wholly or in part. */
    EXPECT(cu.MemMap(r, G, 0, h2, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemMap(r + 2 * G, 2 * G, 0, h3, 0), CUDA_ERROR_INVALID_VALUE);
    /* Mapping takes no more device memory. */
    CHECK(free_bytes() == free0 - 4 * G);

    /* No access before cuMemSetAccess: copies, memsets, kernels fail. */
    memset(buf, 0x5a, sizeof(buf));
    CHECK(access_of(r, 0) == CU_MEM_ACCESS_FLAGS_PROT_NONE);
    EXPECT(cu.MemcpyHtoD(r, buf, sizeof(buf)), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemcpyDtoH(buf, r, sizeof(buf)), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemsetD8(r, 1, 16), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemsetD8Async(r, 1, 16, NULL), CUDA_ERROR_INVALID_VALUE);
    kstart = (uintptr_t)r;
    klen = 1;
    EXPECT(cm_sim_launch_checked(NULL, bump, (void *)r, 0, 1, &kstart,
                                 &klen),
           CUDA_ERROR_INVALID_VALUE);

    /* cuMemSetAccess's misuse. */
    memset(&d, 0, sizeof(d));
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = 0;
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
    EXPECT(cu.MemSetAccess(r, G, &d, 1), CUDA_ERROR_NOT_SUPPORTED);
    d.flags = (CUmemAccess_flags)7;
    EXPECT(cu.MemSetAccess(r, G, &d, 1), CUDA_ERROR_INVALID_VALUE);
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    d.location.id = 5;
    EXPECT(cu.MemSetAccess(r, G, &d, 1), CUDA_ERROR_INVALID_DEVICE);
    d.location.id = 0;
    d.location.type = CU_MEM_LOCATION_TYPE_INVALID;
    EXPECT(cu.MemSetAccess(r, G, &d, 1), CUDA_ERROR_INVALID_VALUE);
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    EXPECT(cu.MemSetAccess(r, G, NULL, 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemSetAccess(r, G, &d, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemSetAccess(r, 4096, &d, 1), CUDA_ERROR_INVALID_VALUE);
    /* Over the hole; over unreserved memory. */
    EXPECT(grant(r, 4 * G, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(grant(r + 2 * G, G, 0), CUDA_ERROR_INVALID_VALUE);
    /* Half of h3's mapping: the simulator cannot split it. */
    EXPECT(grant(r + 3 * G, G, 0), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT(grant(r + 4 * G, G, 0), CUDA_ERROR_NOT_SUPPORTED);
    CHECK(access_of(r + 3 * G, 0) == CU_MEM_ACCESS_FLAGS_PROT_NONE);
    /* Both adjacent mappings at once. */
    OK(grant(r, 2 * G, 0));
    CHECK(access_of(r, 0) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CHECK(access_of(r + G + 5, 0) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    OK(grant(r + 3 * G, 2 * G, 0));
    {
        CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
        unsigned long long f = 0;

        EXPECT(cu.MemGetAccess(&f, &loc, r + 2 * G),
               CUDA_ERROR_INVALID_VALUE);
        EXPECT(cu.MemGetAccess(NULL, &loc, r), CUDA_ERROR_INVALID_VALUE);
        loc.id = 9;
        EXPECT(cu.MemGetAccess(&f, &loc, r), CUDA_ERROR_INVALID_DEVICE);
    }

    /* A copy across the boundary of the two adjacent mappings. */
    for (i = 0; i < sizeof(buf); i++) {
        buf[i] = (unsigned char)(i * 3 + 1);
    }
    OK(cu.MemcpyHtoD(r + G - 100, buf, sizeof(buf)));
    memset(back, 0, sizeof(back));
    OK(cu.MemcpyDtoH(back, r + G - 100, sizeof(back)));
    CHECK(memcmp(buf, back, sizeof(buf)) == 0);
    /* Device to device, across it too, and into h3. */
    OK(cu.MemcpyDtoD(r + 3 * G + 10, r + G - 100, sizeof(buf)));
    memset(back, 0, sizeof(back));
    OK(cu.MemcpyDtoH(back, r + 3 * G + 10, sizeof(back)));
    CHECK(memcmp(buf, back, sizeof(buf)) == 0);
    /* Asynchronous, on the legacy stream. */
    OK(cu.MemsetD8Async(r + G - 8, 0xcd, 16, NULL));
    OK(cu.MemcpyDtoHAsync(back, r + G - 8, 16, NULL));
    OK(cu.CtxSynchronize());
    for (i = 0; i < 16; i++) {
        CHECK(back[i] == 0xcd);
    }
    /* A 2D copy whose rows cross the boundary. */
    {
        CUDA_MEMCPY2D c;

        memset(&c, 0, sizeof(c));
        c.srcMemoryType = CU_MEMORYTYPE_HOST;
        c.srcHost = buf;
        c.srcPitch = 16;
        c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
        c.dstDevice = r + G - 64;
        c.dstPitch = 32;
        c.WidthInBytes = 16;
        c.Height = 4;
        OK(cu.Memcpy2D(&c));
        memset(back, 0, sizeof(back));
        OK(cu.MemcpyDtoH(back, r + G - 64 + 96, 16));
        CHECK(memcmp(back, buf + 48, 16) == 0);
    }
    /* The kernel path: accessible now. */
    kernel_runs = 0;
    OK(cu.MemsetD8(r + G, 41, 1));
    kstart = (uintptr_t)r + G - 4;
    klen = 8;
    OK(cm_sim_launch_checked(NULL, bump, (void *)(uintptr_t)(r + G), 0, 1,
                             &kstart, &klen));
    OK(cu.CtxSynchronize());
    CHECK(kernel_runs == 1);
    OK(cu.MemcpyDtoH(back, r + G, 1));
    CHECK(back[0] == 42);

    /* Into and out of the unmapped hole; running off a mapping into it. */
    EXPECT(cu.MemcpyHtoD(r + 2 * G, buf, 16), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemcpyDtoH(back, r + 2 * G + 64, 16),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemcpyHtoD(r + 2 * G - 8, buf, 16), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemcpyDtoD(r, r + 2 * G, 16), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemsetD8(r + 2 * G - 8, 0, 16), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemcpyHtoDAsync(r + 2 * G, buf, 16, NULL),
           CUDA_ERROR_INVALID_VALUE);
    kstart = (uintptr_t)r + 2 * G - 4;
    EXPECT(cm_sim_launch_checked(NULL, bump, (void *)(uintptr_t)r, 0, 1,
                                 &kstart, &klen),
           CUDA_ERROR_INVALID_VALUE);
    /* A hole named as host memory, either side. */
    EXPECT(cu.MemcpyHtoD(r, (void *)(uintptr_t)(r + 2 * G), 16),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemcpyDtoH((void *)(uintptr_t)(r + 2 * G), r, 16),
           CUDA_ERROR_INVALID_VALUE);
    /* Past the reservation's end. */
    EXPECT(cu.MemcpyHtoD(r + 8 * G - 8, buf, 16), CUDA_ERROR_INVALID_VALUE);

    /* Pointer queries: device memory, the reservation as the range. */
    OK(cu.PointerGetAttributes(6, attrs, data, r + G + 5));
    CHECK(type == CU_MEMORYTYPE_DEVICE && start == r && rsize == 8 * G
          && mapped == 1 && msize == G && types == 0);
    OK(cu.PointerGetAttribute(&mbase, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
                              r + G + 5));
    CHECK(mbase == (void *)(uintptr_t)(r + G));
    OK(cu.PointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, r));
    CHECK(ctx == NULL);
    OK(cu.PointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, r));
    CHECK(ord == 0);
    type = 7;
    OK(cu.PointerGetAttribute(&type,
                              CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                              r));
    CHECK(type == 0);
    OK(cu.PointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, r));
    CHECK(type == CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE);
    OK(cu.PointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, r));
    CHECK(id == h1);
    EXPECT(cu.PointerGetAttribute(&mbase, CU_POINTER_ATTRIBUTE_HOST_POINTER,
                                  r),
           CUDA_ERROR_INVALID_VALUE);
    /* cuMemAlloc memory is legacy-IPC capable. */
    OK(cu.PointerGetAttribute(&type,
                              CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                              dev));
    CHECK(type == 1);
    /* The hole: the range and MAPPED 0; no memory type. */
    type = 7;
    OK(cu.PointerGetAttributes(6, attrs, data, r + 2 * G));
    CHECK(type == 0 && start == r && rsize == 8 * G && mapped == 0
          && msize == 0);
    OK(cu.PointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                              r + 2 * G));
    CHECK(start == r);
    EXPECT(cu.PointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                  r + 2 * G),
           CUDA_ERROR_INVALID_VALUE);
    /* cuMemGetAddressRange: the mapping. */
    OK(cu.MemGetAddressRange(&base, &size, r + G + 5));
    CHECK(base == r + G && size == G);
    OK(cu.MemGetAddressRange(&base, &size, r + 4 * G));
    CHECK(base == r + 3 * G && size == 2 * G);
    EXPECT(cu.MemGetAddressRange(&base, &size, r + 2 * G),
           CUDA_ERROR_NOT_FOUND);
    /* No legacy IPC for VMM memory. */
    EXPECT(cu.IpcGetMemHandle(&ipc, r), CUDA_ERROR_INVALID_VALUE);

    /* Aliasing: h1 at a second address sees the same bytes. */
    OK(cu.MemMap(r2 + G, G, 0, h1, 0));
    OK(grant(r2 + G, G, 0));
    OK(cu.MemcpyHtoD(r + 7, "alias", 5));
    OK(cu.MemcpyDtoH(back, r2 + G + 7, 5));
    CHECK(memcmp(back, "alias", 5) == 0);
    OK(cu.MemsetD8(r2 + G + 100, 0x77, 4));
    OK(cu.MemcpyDtoH(back, r + 100, 4));
    CHECK(back[0] == 0x77 && back[3] == 0x77);
    /* Not adjacent in one reservation: a copy cannot run from one
     * reservation into the next. */
    EXPECT(cu.MemcpyDtoH(back, r2 + 2 * G - 8, 16),
           CUDA_ERROR_INVALID_VALUE);
    /* An offset mapping: h3's second granule at r2. */
    OK(cu.MemMap(r2, G, G, h3, 0));
    OK(grant(r2, G, 0));
    OK(cu.MemcpyHtoD(r + 4 * G + 3, "offset", 6));
    OK(cu.MemcpyDtoH(back, r2 + 3, 6));
    CHECK(memcmp(back, "offset", 6) == 0);
    /* r2's two mappings are adjacent: a copy may cross them. */
    OK(cu.MemcpyDtoH(back, r2 + G - 8, 16));

    /* Retaining the handle behind an address. */
    EXPECT(cu.MemRetainAllocationHandle(&hr, (void *)(uintptr_t)(r + 2 * G)),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemRetainAllocationHandle(NULL, (void *)(uintptr_t)r),
           CUDA_ERROR_INVALID_VALUE);
    OK(cu.MemRetainAllocationHandle(&hr, (void *)(uintptr_t)(r2 + G + 9)));
    CHECK(hr == h1);
    OK(cu.MemRelease(hr));

    /* cuMemUnmap's misuse: part of a mapping, a hole, beyond. */
    EXPECT(cu.MemUnmap(r + 3 * G, G), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemUnmap(r + 4 * G, G), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemUnmap(r + 2 * G, G), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemUnmap(r, 3 * G), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemUnmap(r + 6 * G, G), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemUnmap(r, G / 2), CUDA_ERROR_INVALID_VALUE);
    /* A reservation with mappings left cannot be freed. */
    EXPECT(cu.MemAddressFree(r, 8 * G), CUDA_ERROR_INVALID_VALUE);

    /* Release while mapped: the memory stays until the last unmap. */
    OK(cu.MemRelease(h1));
    EXPECT(cu.MemRelease(h1), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemMap(r + 6 * G, G, 0, h1, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK(free_bytes() == free0 - 4 * G);
    OK(cu.MemcpyDtoH(back, r + 7, 5));
    CHECK(memcmp(back, "alias", 5) == 0);
    /* Queued work on it: the unmap fails loudly rather than wait. */
    __atomic_store_n(&vmm_gate_open, 0, __ATOMIC_RELEASE);
    OK(cu.LaunchHostFunc(NULL, vmm_gate, NULL));
    OK(cu.MemsetD8Async(r2 + G, 0x11, G, NULL));
    EXPECT(cu.MemUnmap(r2 + G, G), CUDA_ERROR_ILLEGAL_STATE);
    __atomic_store_n(&vmm_gate_open, 1, __ATOMIC_RELEASE);
    OK(cu.CtxSynchronize());
    OK(cu.MemUnmap(r2 + G, G));
    CHECK(free_bytes() == free0 - 4 * G);
    /* Both adjacent mappings in one call; h1 goes with its last. */
    OK(cu.MemUnmap(r, 2 * G));
    CHECK(free_bytes() == free0 - 3 * G);
    EXPECT(cu.MemcpyDtoH(back, r, 4), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.PointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, r),
           CUDA_ERROR_INVALID_VALUE);
    /* A remapped range starts with no access again. */
    OK(cu.MemMap(r, G, 0, h2, 0));
    CHECK(access_of(r, 0) == CU_MEM_ACCESS_FLAGS_PROT_NONE);
    EXPECT(cu.MemcpyDtoH(back, r, 4), CUDA_ERROR_INVALID_VALUE);
    OK(grant(r, G, 0));
    /* h2's bytes, written through r + G before. */
    OK(cu.MemcpyDtoH(back, r, 1));
    CHECK(back[0] == 42);
    /* Revoking access. */
    d.location.id = 0;
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
    OK(cu.MemSetAccess(r, G, &d, 1));
    EXPECT(cu.MemcpyDtoH(back, r, 4), CUDA_ERROR_INVALID_VALUE);
    OK(cu.MemUnmap(r, G));

    /* Everything back: the device's memory is whole again. */
    OK(cu.MemRelease(h2));
    OK(cu.MemUnmap(r2, G));
    OK(cu.MemUnmap(r + 3 * G, 2 * G));
    CHECK(free_bytes() == free0 - 2 * G);
    OK(cu.MemRelease(h3));
    CHECK(free_bytes() == free0);
    OK(cu.MemAddressFree(r, 8 * G));
    OK(cu.MemAddressFree(r2, 2 * G));
    OK(cu.MemFree(dev));
    free0 = free_bytes();
    CHECK(free0 == 16 * G);
    /* The whole device in one allocation, then nothing left. */
    OK(cu.MemCreate(&hb, 16 * G, &p, 0));
    EXPECT(cu.MemAlloc(&dev, 256), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT(cu.MemCreate(&h1, G, &p, 0), CUDA_ERROR_OUT_OF_MEMORY);
    OK(cu.MemAddressReserve(&big, 16 * G, 0, 0, 0));
    OK(cu.MemMap(big, 16 * G, 0, hb, 0));
    OK(cu.MemRelease(hb));
    OK(grant(big, 16 * G, 0));
    OK(cu.MemsetD8(big + 16 * G - 4096, 1, 4096));
    /* A synchronous memset of device memory may return before it runs. */
    OK(cu.CtxSynchronize());
    OK(cu.MemUnmap(big, 16 * G));
    OK(cu.MemAddressFree(big, 16 * G));
    CHECK(free_bytes() == free0);
    /* Host memory of this process is not a reservation's. */
    host = malloc(64);
    CHECK(host != NULL);
    if (host != NULL) {
        EXPECT(cu.MemRetainAllocationHandle(&hr, host),
               CUDA_ERROR_INVALID_VALUE);
        free(host);
    }
}

/* ------------------------------------------------------------------ */
/* Two devices                                                         */
/* ------------------------------------------------------------------ */

static void
group_peer(void)
{
    CUmemAllocationProp p0 = prop_on(0, 0);
    CUmemAllocationProp p1 = prop_on(1, 0);
    CUmemGenericAllocationHandle h0 = 0, h1 = 0;
    CUcontext c0, c1;
    CUdeviceptr r = 0;
    unsigned char back[8];
    size_t free0;
    int ord = -1;

    OK(cu.Init(0));
    c1 = retain_and_push(1);
    free0 = free_bytes();
    c0 = retain_and_push(0);
    OK(cu.MemCreate(&h0, G, &p0, 0));
    OK(cu.MemCreate(&h1, G, &p1, 0));
    OK(cu.MemAddressReserve(&r, 2 * G, 0, 0, 0));
    OK(cu.MemMap(r, G, 0, h0, 0));
    OK(cu.MemMap(r + G, G, 0, h1, 0));
    OK(cu.PointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                              r + G));
    CHECK(ord == 1);
    OK(grant(r, 2 * G, 0));
    OK(cu.MemsetD8(r + G - 4, 9, 8));
    /* The memset may not have run yet: device 1's copies below do not
     * wait for device 0's default stream. */
    OK(cu.CtxSynchronize());
    /* Device 1 has no access yet: its context's copies fail. */
    OK(cu.CtxSetCurrent(c1));
    CHECK(free_bytes() == free0 - G);
    EXPECT(cu.MemcpyDtoH(back, r + G - 4, 8), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemcpyDtoH(back, r, 8), CUDA_ERROR_INVALID_VALUE);
    CHECK(access_of(r, 1) == CU_MEM_ACCESS_FLAGS_PROT_NONE);
    /* Peer access through cuMemSetAccess, not cuCtxEnablePeerAccess. */
    OK(cu.CtxEnablePeerAccess(c0, 0));
    EXPECT(cu.MemcpyDtoH(back, r, 8), CUDA_ERROR_INVALID_VALUE);
    OK(grant(r, 2 * G, 1));
    OK(cu.MemcpyDtoH(back, r + G - 4, 8));
    CHECK(back[0] == 9 && back[7] == 9);
    CHECK(access_of(r, 1) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CHECK(access_of(r, 0) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    OK(cu.MemUnmap(r, 2 * G));
    OK(cu.MemRelease(h0));
    OK(cu.MemRelease(h1));
    CHECK(free_bytes() == free0);
    OK(cu.MemAddressFree(r, 2 * G));
}

static void
group_no_peer(void)
{
    CUmemAllocationProp p0 = prop_on(0, 0);
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr r = 0;

    OK(cu.Init(0));
    retain_and_push(0);
    OK(cu.MemCreate(&h, G, &p0, 0));
    OK(cu.MemAddressReserve(&r, G, 0, 0, 0));
    OK(cu.MemMap(r, G, 0, h, 0));
    EXPECT(grant(r, G, 1), CUDA_ERROR_INVALID_DEVICE);
    OK(grant(r, G, 0));
    OK(cu.MemUnmap(r, G));
    OK(cu.MemRelease(h));
    OK(cu.MemAddressFree(r, G));
}

/* ------------------------------------------------------------------ */
/* Sharing with another process                                        */
/* ------------------------------------------------------------------ */

static int
send_fd(int sock, int fd)
{
    char byte = 'f';
    struct iovec iov = {&byte, 1};
    char ctl[CMSG_SPACE(sizeof(int))];
    struct msghdr msg;
    struct cmsghdr *cm;

    memset(&msg, 0, sizeof(msg));
    memset(ctl, 0, sizeof(ctl));
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctl;
    msg.msg_controllen = sizeof(ctl);
    cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof(int));
    return sendmsg(sock, &msg, 0) == 1 ? 0 : -1;
}

static int
recv_fd(int sock)
{
    char byte;
    struct iovec iov = {&byte, 1};
    char ctl[CMSG_SPACE(sizeof(int))];
    struct msghdr msg;
    struct cmsghdr *cm;
    int fd = -1;

    memset(&msg, 0, sizeof(msg));
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctl;
    msg.msg_controllen = sizeof(ctl);
    if (recvmsg(sock, &msg, 0) != 1) {
        return -1;
    }
    cm = CMSG_FIRSTHDR(&msg);
    if (cm != NULL && cm->cmsg_type == SCM_RIGHTS) {
        memcpy(&fd, CMSG_DATA(cm), sizeof(int));
    }
    return fd;
}

/* The importer: maps what it is sent, reads the pattern, writes back. */
static void
share_importer(int sock)
{
    CUmemGenericAllocationHandle h = 0;
    CUmemAllocationProp q;
    CUdeviceptr r = 0;
    unsigned char back[4];
    size_t free0;
    char done = 'd';
    int fd;

    OK(cu.Init(0));
    retain_and_push(0);
    free0 = free_bytes();
    fd = recv_fd(sock);
    CHECK(fd >= 0);
    EXPECT(cu.MemImportFromShareableHandle(&h, (void *)(intptr_t)fd,
                                           CU_MEM_HANDLE_TYPE_FABRIC),
           CUDA_ERROR_NOT_SUPPORTED);
    OK(cu.MemImportFromShareableHandle(
        &h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(fd);
    /* Imports charge nothing here. */
    CHECK(free_bytes() == free0);
    OK(cu.MemGetAllocationPropertiesFromHandle(&q, h));
    CHECK(q.location.id == 0
          && q.requestedHandleTypes
             == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    OK(cu.MemAddressReserve(&r, 2 * G, 0, 0, 0));
    OK(cu.MemMap(r, 2 * G, 0, h, 0));
    OK(cu.MemRelease(h));
    OK(grant(r, 2 * G, 0));
    OK(cu.MemcpyDtoH(back, r + G + 10, 4));
    CHECK(memcmp(back, "vmm!", 4) == 0);
    OK(cu.MemcpyHtoD(r + 20, "back", 4));
    OK(cu.CtxSynchronize());
    OK(cu.MemUnmap(r, 2 * G));
    OK(cu.MemAddressFree(r, 2 * G));
    CHECK(write(sock, &done, 1) == 1);
}

static void
group_share(void)
{
    CUmemAllocationProp p =
        prop_on(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    CUmemAllocationProp np = prop_on(0, 0);
    CUmemGenericAllocationHandle h = 0, hn = 0, hi = 0;
    CUdeviceptr r = 0;
    CUpointer_attribute at = CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES;
    unsigned long long types = 0;
    void *data[1] = {&types};
    unsigned char back[4];
    int sv[2];
    int fd = -1, pfd[2];
    int status = 0;
    char done = 0;
    pid_t pid;

    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    pid = fork();
    if (pid == 0) {
        /* Forked before cuInit: a fresh simulator of its own. */
        close(sv[0]);
        share_importer(sv[1]);
        exit(failures ? 1 : 0);
    }
    close(sv[1]);
    OK(cu.Init(0));
    retain_and_push(0);
    OK(cu.MemCreate(&h, 2 * G, &p, 0));
    OK(cu.MemCreate(&hn, G, &np, 0));
    OK(cu.MemAddressReserve(&r, 2 * G, 0, 0, 0));
    OK(cu.MemMap(r, 2 * G, 0, h, 0));
    OK(grant(r, 2 * G, 0));
    OK(cu.PointerGetAttributes(1, &at, data, r));
    CHECK(types == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    OK(cu.MemcpyHtoD(r + G + 10, "vmm!", 4));
    /* Export's misuse. */
    EXPECT(cu.MemExportToShareableHandle(&fd, hn,
               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemExportToShareableHandle(&fd, h,
               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemExportToShareableHandle(&fd, h,
               CU_MEM_HANDLE_TYPE_WIN32, 0),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemExportToShareableHandle(NULL, h,
               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemExportToShareableHandle(&fd, h + 1000,
               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
           CUDA_ERROR_INVALID_VALUE);
    /* Import's misuse: a descriptor that is no simulator memory. */
    CHECK(pipe(pfd) == 0);
    EXPECT(cu.MemImportFromShareableHandle(&hi, (void *)(intptr_t)pfd[0],
               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemImportFromShareableHandle(&hi, (void *)(intptr_t)-1,
               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
           CUDA_ERROR_INVALID_VALUE);
    close(pfd[0]);
    close(pfd[1]);
    OK(cu.MemExportToShareableHandle(&fd, h,
           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    CHECK(fd >= 0);
    /* Imported in this process too: the same bytes. */
    OK(cu.MemImportFromShareableHandle(&hi, (void *)(intptr_t)fd,
           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    CHECK(hi != h);
    {
        CUdeviceptr r2 = 0;

        OK(cu.MemAddressReserve(&r2, G, 0, 0, 0));
        OK(cu.MemMap(r2, G, G, hi, 0));
        OK(grant(r2, G, 0));
        OK(cu.MemcpyDtoH(back, r2 + 10, 4));
        CHECK(memcmp(back, "vmm!", 4) == 0);
        OK(cu.MemUnmap(r2, G));
        OK(cu.MemAddressFree(r2, G));
        OK(cu.MemRelease(hi));
    }
    /* The exporter releases its handle: the mapping keeps the memory. */
    OK(cu.MemRelease(h));
    CHECK(send_fd(sv[0], fd) == 0);
    close(fd);
    CHECK(read(sv[0], &done, 1) == 1 && done == 'd');
    OK(cu.MemcpyDtoH(back, r + 20, 4));
    CHECK(memcmp(back, "back", 4) == 0);
    OK(cu.MemUnmap(r, 2 * G));
    OK(cu.MemAddressFree(r, 2 * G));
    OK(cu.MemRelease(hn));
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(sv[0]);
}

/* CUDAMEM_SIM_NO_FD_HANDLES=1: a device without POSIX file-descriptor
 * handles says so and refuses them, for pages and for memory pools. */
static void
group_no_fd(void)
{
    CUmemAllocationProp p =
        prop_on(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    CUmemAllocationProp np = prop_on(0, 0);
    CUmemPoolProps pp;
    CUmemoryPool pool = NULL;
    CUmemGenericAllocationHandle h = 0;
    size_t g = 0;
    int v = -1;

    OK(cu.Init(0));
    retain_and_push(0);
    OK(cu.DeviceGetAttribute(
        &v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
        0));
    CHECK(v == 0);
    OK(cu.DeviceGetAttribute(
        &v, CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, 0));
    CHECK(v == 0);
    OK(cu.DeviceGetAttribute(
        &v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
    CHECK(v == 1);
    EXPECT(cu.MemGetAllocationGranularity(&g, &p,
                                          CU_MEM_ALLOC_GRANULARITY_MINIMUM),
           CUDA_ERROR_NOT_SUPPORTED);
    EXPECT(cu.MemCreate(&h, G, &p, 0), CUDA_ERROR_NOT_SUPPORTED);
    OK(cu.MemCreate(&h, G, &np, 0));
    OK(cu.MemRelease(h));
    memset(&pp, 0, sizeof(pp));
    pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    pp.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    pp.location.id = 0;
    EXPECT(cu.MemPoolCreate(&pool, &pp), CUDA_ERROR_NOT_SUPPORTED);
    pp.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
    OK(cu.MemPoolCreate(&pool, &pp));
    OK(cu.MemPoolDestroy(pool));
}

/* ------------------------------------------------------------------ */
/* Threads                                                             */
/* ------------------------------------------------------------------ */

/* Each thread maps, uses and unmaps its own allocations in a shared
 * reservation, so the sanitizers see the calls race. */
static CUdeviceptr thread_res;

static void *
thread_body(void *arg)
{
    int k = (int)(intptr_t)arg;
    CUmemAllocationProp p = prop_on(0, 0);
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr at = thread_res + (CUdeviceptr)k * G;
    unsigned char back = 0;
    int i;

    retain_and_push(0);
    for (i = 0; i < 20; i++) {
        OK(cu.MemCreate(&h, G, &p, 0));
        OK(cu.MemMap(at, G, 0, h, 0));
        OK(cu.MemRelease(h));
        OK(grant(at, G, 0));
        OK(cu.MemsetD8Async(at, (unsigned char)(k + i), G, NULL));
        OK(cu.MemcpyDtoH(&back, at + G - 1, 1));
        CHECK(back == (unsigned char)(k + i));
        OK(cu.MemUnmap(at, G));
    }
    return NULL;
}

static void
group_threads(void)
{
    pthread_t t[4];
    size_t free0;
    int k;

    OK(cu.Init(0));
    retain_and_push(0);
    free0 = free_bytes();
    OK(cu.MemAddressReserve(&thread_res, 4 * G, 0, 0, 0));
    for (k = 0; k < 4; k++) {
        CHECK(pthread_create(&t[k], NULL, thread_body,
                             (void *)(intptr_t)k) == 0);
    }
    for (k = 0; k < 4; k++) {
        pthread_join(t[k], NULL);
    }
    CHECK(free_bytes() == free0);
    OK(cu.MemAddressFree(thread_res, 4 * G));
}

/* ------------------------------------------------------------------ */
/* Driver                                                              */
/* ------------------------------------------------------------------ */


static const group groups[] = {
    {"props", group_props, NULL, 0},
    {"map", group_map, "CUDAMEM_SIM_MEMORY=33554432", 0},
    {"peer", group_peer, "CUDAMEM_SIM_DEVICES=2", 0},
    {"no_peer", group_no_peer,
     "CUDAMEM_SIM_DEVICES=2 CUDAMEM_SIM_NO_PEER=all", 0},
    {"share", group_share, NULL, 0},
    {"no_fd", group_no_fd, "CUDAMEM_SIM_NO_FD_HANDLES=1", 0},
    {"threads", group_threads, NULL, 0},
};


int
main(int argc, char **argv)
{
    return run_groups(groups, sizeof(groups) / sizeof(groups[0]), argc,
                      argv);
}
