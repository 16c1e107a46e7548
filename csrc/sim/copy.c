/* SPDX-License-Identifier: MIT */
/*
 * sim/copy.c: the simulator's copies and memsets (1-D, 2-D, 3-D, peer,
 * synchronous and asynchronous).
 *
 * Locks and the GIL: every entry point takes sim.lock after SIM_ENTER and
 * gives it back before returning.  A synchronous copy or memset waits for
 * its work (sim_wait, which releases sim.lock on sim.cond) while it holds
 * the modelled driver lock (sim_driver_lock_take and sim_driver_lock_give,
 * whose mutex sim.c takes briefly under sim.lock); other threads' entry
 * points wait for that lock in SIM_ENTER, holding no simulator lock.  A
 * copy into pageable memory waits likewise, without the driver lock.  Both
 * waits are refused on a worker (a host function).  The GIL is never taken
 * nor given up here: a caller that holds it keeps it across the wait, as
 * across the driver's.
 */
#include "driver/cu_table.h"
#include "sim/sim.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>


/* Check one side of a w x h x d copy and find its first byte.  Device
 * sides must lie inside one live allocation. */
static CUresult
sim_side_check(const sim_side *sd, size_t w, size_t h, size_t d,
               char **first)
{
    size_t need, off, span, rows;
    uintptr_t p;
    int device;

    switch (sd->type) {
    case CU_MEMORYTYPE_HOST:
        device = 0;
        break;
    case CU_MEMORYTYPE_DEVICE:
        device = 1;
        break;
    case CU_MEMORYTYPE_UNIFIED:
        device = -1;        /* device if the address is registered */
        break;
    case CU_MEMORYTYPE_ARRAY:
        return CUDA_ERROR_NOT_SUPPORTED;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (sd->addr == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (h > 1 || d > 1 || sd->y > 0 || sd->z > 0) {
        if (__builtin_add_overflow(w, sd->x, &need) || sd->pitch < need
            || sd->pitch > SIM_MAX_PITCH) {
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    if (d > 1 || sd->z > 0) {
        if (__builtin_add_overflow(h, sd->y, &need) || sd->height < need) {
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    /* off: first byte; span: bytes from there to the end of the last row */
    if (__builtin_mul_overflow(sd->z, sd->height, &rows)
        || __builtin_add_overflow(rows, sd->y, &rows)
        || __builtin_mul_overflow(rows, sd->pitch, &off)
        || __builtin_add_overflow(off, sd->x, &off)
        || __builtin_mul_overflow(d - 1, sd->height, &rows)
        || __builtin_add_overflow(rows, h - 1, &rows)
        || __builtin_mul_overflow(rows, sd->pitch, &span)
        || __builtin_add_overflow(span, w, &span)
        || __builtin_add_overflow(sd->addr, off, &p)
        || span > UINTPTR_MAX - p) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (device != 1 && sim_alloc_find(p) == NULL
        && sim_vmm_overlaps(p, span)) {
        /* Host memory that runs into a reservation, or starts in one
         * where nothing live is mapped (a hole, a mapping being
         * unmapped): no host memory is there, nor usable device
         * memory. */
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (device == 1 || (device == -1 && sim_alloc_find_any(p) != NULL)) {
        if (sim_range(p, span) == NULL) {
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    else if (device == 0 && sim_alloc_find(p) != NULL
             && sim_range(p, span) == NULL) {
        /* A host side that starts in page-locked memory must end there:
         * the driver refuses one that runs past the allocation or
         * registration (seen on an H200). */
        return CUDA_ERROR_INVALID_VALUE;
    }
    *first = (char *)p;
    return CUDA_SUCCESS;
}

/* Queue op on stream h; *sp the stream.  Lock held; always consumes
 * op. */
static CUresult
sim_queue(sim_op *op, CUstream h, sim_stream **sp)
{
    CUresult rc = sim_stream_get(h, sp);

    if (rc != CUDA_SUCCESS) {
        sim_op_free(op);
        return rc;
    }
    return sim_enqueue(*sp, op);
}

/* Wait until s has finished ticket as a synchronous call does, holding
 * the driver lock meanwhile.  Lock held. */
static CUresult
sim_wait_sync(sim_stream *s, uint64_t ticket)
{
    CUresult rc;

    sim_driver_lock_take();
    rc = sim_wait(s, ticket);
    sim_driver_lock_give();
    return rc;
}

/* Queue the op on stream h (the default stream when sync) and, when
 * sync, wait for it.  Lock held; always consumes op. */
static CUresult
sim_submit(sim_op *op, CUstream h, int sync)
{
    sim_stream *s;
    CUresult rc = sim_queue(op, sync ? NULL : h, &s);

    if (rc == CUDA_SUCCESS && sync) {
        rc = sim_wait_sync(s, s->submitted);
    }
    return rc;
}

/* Whether a copy side is pageable host memory: host memory (or unified
 * addressing of an address the simulator does not know) that is not
 * page-locked (cuMemHostAlloc, cuMemHostRegister) nor managed.  Lock
 * held. */
static int
sim_side_pageable(const sim_side *sd, const char *first)
{
    if (sd->type != CU_MEMORYTYPE_HOST && sd->type != CU_MEMORYTYPE_UNIFIED) {
        return 0;
    }
    return sim_alloc_find_any((uintptr_t)first) == NULL;
}

/* Copy a pageable source into a snapshot that op owns and reads from
 * instead, as the driver consumes pageable memory before the call
 * returns.  Lock held; frees op and returns OUT_OF_MEMORY on failure. */
static CUresult
sim_copy_snapshot(sim_op *op, const char *sp)
{
    /* Validated not to overflow by sim_side_check. */
    size_t span = (op->u.copy.depth - 1) * op->u.copy.sslice
                  + (op->u.copy.height - 1) * op->u.copy.spitch
                  + op->u.copy.width;

    op->u.copy.owned = malloc(span);
    if (op->u.copy.owned == NULL) {
        sim_op_free(op);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memcpy(op->u.copy.owned, sp, span);
    op->u.copy.src = op->u.copy.owned;
    return CUDA_SUCCESS;
}

/* Queue an asynchronous copy as the driver does with pageable host
 * memory: a pageable source is consumed before the call returns (here:
 * copied into a snapshot the op owns), and a copy into pageable memory
 * returns only once it has completed.  Page-locked and device sides stay
 * asynchronous.  Lock held; always consumes op. */
static CUresult
sim_submit_async_copy(sim_op *op, const sim_side *dst, const sim_side *src,
                      const char *dp, const char *sp, CUstream hs)
{
    sim_stream *s;
    CUresult rc;
    int wait_after = sim_side_pageable(dst, dp);

    if (wait_after && tls_worker != NULL) {
        sim_op_free(op);
        return CUDA_ERROR_NOT_PERMITTED;
    }
    if (sim_side_pageable(src, sp)
        && (rc = sim_copy_snapshot(op, sp)) != CUDA_SUCCESS) {
        return rc;
    }
    rc = sim_queue(op, hs, &s);
    if (rc == CUDA_SUCCESS && wait_after) {
        rc = sim_wait(s, s->submitted);
    }
    return rc;
}

/* A synchronous copy from pageable host memory to the device, as the
 * driver makes it: the default stream's earlier work is waited for, the
 * source is consumed (copied into a snapshot the op owns), and the call
 * returns then, before the bytes land on the device: work on the
 * default stream (and on the streams that synchronise with it) sees
 * them, anything else (a non-blocking stream, another process through
 * IPC) may not yet.  CUDAMEM_SIM_DELAY_US widens that window.  Lock
 * held; always consumes op. */
static CUresult
sim_submit_pageable_upload(sim_op *op, const char *sp)
{
    sim_stream *s;
    CUresult rc = sim_copy_snapshot(op, sp);

    if (rc != CUDA_SUCCESS) {
        return rc;
    }
    rc = sim_queue(op, NULL, &s);
    if (rc == CUDA_SUCCESS && s->submitted > 1) {
        rc = sim_wait_sync(s, s->submitted - 1);
    }
    return rc;
}

/* Whether a is memory of the device's side (not page-locked host
 * memory): a synchronous copy between two such, or a synchronous memset
 * of one, returns before it has run, as the driver makes no host-side
 * synchronisation for them; the work waits on the default stream.  Lock
 * held. */
static int
sim_alloc_on_device(const sim_alloc *a)
{
    return a != NULL && a->kind != SIM_MEM_HOST
           && a->kind != SIM_MEM_REGISTERED;
}

/* Every copy: dst <- src, w bytes by h rows by d slices. */
static CUresult
sim_copy(const sim_side *dst, const sim_side *src, size_t w, size_t h,
         size_t d, CUstream hs, int sync)
{
    sim_ctx *c;
    sim_op *op;
    const sim_alloc *dst_alloc;
    char *dp = NULL, *sp = NULL;
    CUresult rc;

    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS && sync && tls_worker != NULL) {
        rc = CUDA_ERROR_NOT_PERMITTED;
    }
    if (rc == CUDA_SUCCESS && sync) {
        /* On the legacy stream, and a potentially unsafe call. */
        rc = sim_capture_sync_call();
    }
    if (rc != CUDA_SUCCESS || w == 0 || h == 0 || d == 0) {
        sim_unlock();
        return rc;
    }
    rc = sim_side_check(dst, w, h, d, &dp);
    if (rc == CUDA_SUCCESS) {
        rc = sim_side_check(src, w, h, d, &sp);
    }
    if (rc == CUDA_SUCCESS) {
        op = sim_op_new(SIM_OP_COPY);
        if (op == NULL) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
        else {
            op->u.copy.dst = dp;
            op->u.copy.src = sp;
            op->u.copy.width = w;
            op->u.copy.height = h;
            op->u.copy.depth = d;
            op->u.copy.dpitch = dst->pitch;
            op->u.copy.spitch = src->pitch;
            /* Validated not to overflow when d > 1. */
            op->u.copy.dslice = d > 1 ? dst->pitch * dst->height : 0;
            op->u.copy.sslice = d > 1 ? src->pitch * src->height : 0;
            op->u.copy.owned = NULL;
            dst_alloc = sim_alloc_find_any((uintptr_t)dp);
            if (sync && sim_side_pageable(src, sp) && dst_alloc != NULL
                && (dst_alloc->kind == SIM_MEM_DEVICE
                    || dst_alloc->kind == SIM_MEM_VMM)) {
                rc = sim_submit_pageable_upload(op, sp);
            }
            else if (sync && dst->type != CU_MEMORYTYPE_HOST
                     && src->type != CU_MEMORYTYPE_HOST
                     && sim_alloc_on_device(dst_alloc)
                     && sim_alloc_on_device(
                            sim_alloc_find_any((uintptr_t)sp))) {
                rc = sim_submit(op, NULL, 0);     /* device to device */
            }
            else {
                rc = sync ? sim_submit(op, hs, 1)
                          : sim_submit_async_copy(op, dst, src, dp, sp, hs);
            }
        }
    }
    sim_unlock();
    return rc;
}

/* A contiguous copy of n bytes. */
static CUresult
sim_copy1d(CUmemorytype dt, uintptr_t dst, CUmemorytype st, uintptr_t src,
           size_t n, CUstream hs, int sync)
{
    sim_side d = {dt, dst, 0, 0, 0, 0, 0};
    sim_side s = {st, src, 0, 0, 0, 0, 0};

    return sim_copy(&d, &s, n, 1, 1, hs, sync);
}

/* The three directions of a contiguous copy. */
static CUresult
sim_htod(CUdeviceptr dst, const void *src, size_t n, CUstream hs, int sync)
{
    return sim_copy1d(CU_MEMORYTYPE_DEVICE, (uintptr_t)dst,
                      CU_MEMORYTYPE_HOST, (uintptr_t)src, n, hs, sync);
}

static CUresult
sim_dtoh(void *dst, CUdeviceptr src, size_t n, CUstream hs, int sync)
{
    return sim_copy1d(CU_MEMORYTYPE_HOST, (uintptr_t)dst,
                      CU_MEMORYTYPE_DEVICE, (uintptr_t)src, n, hs, sync);
}

static CUresult
sim_dtod(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream hs, int sync)
{
    return sim_copy1d(CU_MEMORYTYPE_DEVICE, (uintptr_t)dst,
                      CU_MEMORYTYPE_DEVICE, (uintptr_t)src, n, hs, sync);
}

CUresult
sim_MemcpyHtoD(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    SIM_ENTER(MemcpyHtoD);
    return sim_htod(dstDevice, srcHost, ByteCount, NULL, 1);
}

CUresult
sim_MemcpyDtoH(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    SIM_ENTER(MemcpyDtoH);
    return sim_dtoh(dstHost, srcDevice, ByteCount, NULL, 1);
}

CUresult
sim_MemcpyDtoD(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
               size_t ByteCount)
{
    SIM_ENTER(MemcpyDtoD);
    return sim_dtod(dstDevice, srcDevice, ByteCount, NULL, 1);
}

CUresult
sim_MemcpyHtoDAsync(CUdeviceptr dstDevice, const void *srcHost,
                    size_t ByteCount, CUstream hStream)
{
    SIM_ENTER(MemcpyHtoDAsync);
    return sim_htod(dstDevice, srcHost, ByteCount, hStream, 0);
}

CUresult
sim_MemcpyDtoHAsync(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                    CUstream hStream)
{
    SIM_ENTER(MemcpyDtoHAsync);
    return sim_dtoh(dstHost, srcDevice, ByteCount, hStream, 0);
}

CUresult
sim_MemcpyDtoDAsync(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                    size_t ByteCount, CUstream hStream)
{
    SIM_ENTER(MemcpyDtoDAsync);
    return sim_dtod(dstDevice, srcDevice, ByteCount, hStream, 0);
}

/* One side of a 3D copy, from its descriptor's fields for that side;
 * the address is the host or the device one by the memory type. */
static sim_side
sim_side_of(CUmemorytype type, const void *host, CUdeviceptr device,
            size_t x, size_t y, size_t z, size_t pitch, size_t height)
{
    sim_side sd = {type, 0, x, y, z, pitch, height};

    sd.addr = type == CU_MEMORYTYPE_HOST ? (uintptr_t)host
                                         : (uintptr_t)device;
    return sd;
}

static CUresult
sim_copy3d(const CUDA_MEMCPY3D *p, CUstream hs, int sync)
{
    sim_side d, s;

    if (p == NULL || p->srcLOD != 0 || p->dstLOD != 0
        || p->reserved0 != NULL || p->reserved1 != NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    d = sim_side_of(p->dstMemoryType, p->dstHost, p->dstDevice,
                    p->dstXInBytes, p->dstY, p->dstZ, p->dstPitch,
                    p->dstHeight);
    s = sim_side_of(p->srcMemoryType, p->srcHost, p->srcDevice,
                    p->srcXInBytes, p->srcY, p->srcZ, p->srcPitch,
                    p->srcHeight);
    return sim_copy(&d, &s, p->WidthInBytes, p->Height, p->Depth, hs, sync);
}

/* A 2D copy is the 3D copy of one slice (no slice height, no LOD). */
static CUresult
sim_copy2d(const CUDA_MEMCPY2D *p, CUstream hs, int sync)
{
    CUDA_MEMCPY3D q;

    if (p == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    q = (CUDA_MEMCPY3D){
        .srcXInBytes = p->srcXInBytes, .srcY = p->srcY,
        .srcMemoryType = p->srcMemoryType, .srcHost = p->srcHost,
        .srcDevice = p->srcDevice, .srcArray = p->srcArray,
        .srcPitch = p->srcPitch,
        .dstXInBytes = p->dstXInBytes, .dstY = p->dstY,
        .dstMemoryType = p->dstMemoryType, .dstHost = p->dstHost,
        .dstDevice = p->dstDevice, .dstArray = p->dstArray,
        .dstPitch = p->dstPitch,
        .WidthInBytes = p->WidthInBytes, .Height = p->Height, .Depth = 1,
    };
    return sim_copy3d(&q, hs, sync);
}

CUresult
sim_Memcpy2D(const CUDA_MEMCPY2D *pCopy)
{
    SIM_ENTER(Memcpy2D);
    return sim_copy2d(pCopy, NULL, 1);
}

CUresult
sim_Memcpy2DAsync(const CUDA_MEMCPY2D *pCopy, CUstream hStream)
{
    SIM_ENTER(Memcpy2DAsync);
    return sim_copy2d(pCopy, hStream, 0);
}

CUresult
sim_Memcpy3D(const CUDA_MEMCPY3D *pCopy)
{
    SIM_ENTER(Memcpy3D);
    return sim_copy3d(pCopy, NULL, 1);
}

CUresult
sim_Memcpy3DAsync(const CUDA_MEMCPY3D *pCopy, CUstream hStream)
{
    SIM_ENTER(Memcpy3DAsync);
    return sim_copy3d(pCopy, hStream, 0);
}

/* A peer copy: both contexts must be live; then a device-to-device copy
 * (one address space here). */
static CUresult
sim_copy_peer(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src,
              CUcontext src_ctx, size_t n, CUstream hs, int sync)
{
    CUresult rc;

    sim_lock();
    rc = sim_ctx_check(dst_ctx);
    if (rc == CUDA_SUCCESS) {
        rc = sim_ctx_check(src_ctx);
    }
    sim_unlock();
    if (rc != CUDA_SUCCESS) {
        return rc;
    }
    return sim_dtod(dst, src, n, hs, sync);
}

CUresult
sim_MemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext,
               CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount)
{
    SIM_ENTER(MemcpyPeer);
    return sim_copy_peer(dstDevice, dstContext, srcDevice, srcContext,
                         ByteCount, NULL, 1);
}

CUresult
sim_MemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext,
                    CUdeviceptr srcDevice, CUcontext srcContext,
                    size_t ByteCount, CUstream hStream)
{
    SIM_ENTER(MemcpyPeerAsync);
    return sim_copy_peer(dstDevice, dstContext, srcDevice, srcContext,
                         ByteCount, hStream, 0);
}

static CUresult
sim_memset(CUdeviceptr dst, unsigned char uc, size_t n, CUstream hs,
           int sync)
{
    sim_ctx *c;
    sim_op *op;
    CUresult rc;

    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS && sync && tls_worker != NULL) {
        rc = CUDA_ERROR_NOT_PERMITTED;
    }
    if (rc == CUDA_SUCCESS && sync) {
        /* On the legacy stream, and a potentially unsafe call. */
        rc = sim_capture_sync_call();
    }
    if (rc == CUDA_SUCCESS && n > 0) {
        if (sim_range((uintptr_t)dst, n) == NULL) {
            rc = CUDA_ERROR_INVALID_VALUE;
        }
        else if ((op = sim_op_new(SIM_OP_SET)) == NULL) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
        else {
            op->u.set.dst = (char *)(uintptr_t)dst;
            op->u.set.value = uc;
            op->u.set.n = n;
            rc = sim_submit(op, hs,
                            sync && !sim_alloc_on_device(
                                        sim_alloc_find_any((uintptr_t)dst)));
        }
    }
    sim_unlock();
    return rc;
}

CUresult
sim_MemsetD8(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    SIM_ENTER(MemsetD8);
    return sim_memset(dstDevice, uc, N, NULL, 1);
}

CUresult
sim_MemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N,
                  CUstream hStream)
{
    SIM_ENTER(MemsetD8Async);
    return sim_memset(dstDevice, uc, N, hStream, 0);
}

/* Whether a memory location names something that exists. */
static int
sim_location_ok(CUmemLocation loc)
{
    switch (loc.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
        return sim_dev_ok(loc.id);
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
        return 1;
    default:
        return 0;
    }
}

/* Whether [p, p + n) lies inside one managed allocation. */
static int
sim_managed_range(CUdeviceptr p, size_t n)
{
    sim_alloc *a = sim_alloc_find((uintptr_t)p);

    return a != NULL && a->kind == SIM_MEM_MANAGED
           && n <= a->size - ((uintptr_t)p - a->base);
}

CUresult
sim_MemPrefetchAsync(CUdeviceptr devPtr, size_t count,
                     CUmemLocation location, unsigned int flags,
                     CUstream hStream)
{
    sim_ctx *c;
    sim_op *op;
    CUresult rc;

    SIM_ENTER(MemPrefetchAsync);
    if (flags != 0 || !sim_location_ok(location)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS) {
        if (!sim_managed_range(devPtr, count)) {
            rc = CUDA_ERROR_INVALID_VALUE;
        }
        else if ((op = sim_op_new(SIM_OP_NOP)) == NULL) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
        else {
            /* Migration is free here; only the ordering is real. */
            rc = sim_submit(op, hStream, 0);
        }
    }
    sim_unlock();
    return rc;
}

CUresult
sim_MemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
              CUmemLocation location)
{
    sim_ctx *c;
    CUresult rc;

    SIM_ENTER(MemAdvise);
    switch (advice) {
    case CU_MEM_ADVISE_SET_READ_MOSTLY:
    case CU_MEM_ADVISE_UNSET_READ_MOSTLY:
    case CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION:
        break;
    case CU_MEM_ADVISE_SET_PREFERRED_LOCATION:
    case CU_MEM_ADVISE_SET_ACCESSED_BY:
    case CU_MEM_ADVISE_UNSET_ACCESSED_BY:
        if (!sim_location_ok(location)) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        break;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS && !sim_managed_range(devPtr, count)) {
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    sim_unlock();
    return rc;
}
