/* SPDX-License-Identifier: MIT */
/*
 * sim/memory.c: the simulator's device, host, pinned, mapped and managed
 * memory entry points, and the release of an allocation of any kind
 * (sim_alloc_release), above the files that own the kinds (ipc.c,
 * poolmem.c, vmm.c); so the frees over it live here, cuIpcCloseMemHandle
 * included.
 *
 * Locks and the GIL: every entry point takes sim.lock after SIM_ENTER and
 * gives it back before returning (the capture rule,
 * sim_capture_check_unsafe, takes and gives it back first);
 * sim_alloc_release runs with it held.  The frees (cuMemFree,
 * cuMemFreeHost, cuMemHostUnregister, cuIpcCloseMemHandle) wait for all
 * queued work with sim_drain, releasing sim.lock on sim.cond (refused on a
 * worker).  No other lock; the host memory is unmapped or freed under
 * sim.lock.  The GIL is never taken nor given up here.
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

/* ------------------------------------------------------------------ */
/* The release of an allocation (lock held)                            */
/* ------------------------------------------------------------------ */

/* Give back what a (already out of the registry) holds, and a itself. */
void
sim_alloc_release(sim_alloc *a)
{
    sim_mempool *mp = a->pool;

    if (a->kind == SIM_MEM_DEVICE || a->kind == SIM_MEM_MANAGED
        || a->kind == SIM_MEM_ASYNC) {
        sim.dev[a->ctx->dev].used -= a->charged;
    }
    if (a->kind == SIM_MEM_ASYNC) {
        /* A live pool allocation that goes with its context. */
        mp->used -= a->charged;
        mp->reserved -= a->charged;
    }
    if (a->ipc != NULL) {
        sim_ipc_release(a);
    }
#ifdef SIM_ASAN
    if (a->kind == SIM_MEM_DEVICE) {
        ASAN_UNPOISON_MEMORY_REGION((void *)a->base,
                                    sim_device_span(a->size));
    }
#endif
    if (a->kind == SIM_MEM_ASYNC) {
        sim_pool_mem_release(mp, a);
    }
    else if (a->kind == SIM_MEM_POOL_IMPORT) {
        munmap((void *)a->base, a->span);
        mp->nimports--;
    }
    else if (a->kind == SIM_MEM_VMM) {
        sim_vmm_map_release(a);
    }
    else if (a->kind == SIM_MEM_HOST || a->kind == SIM_MEM_MANAGED) {
        /* Like the driver's: unmapped, so a stale pointer faults. */
        munmap((void *)a->base, sim_device_span(a->size));
    }
    else if (a->kind != SIM_MEM_REGISTERED && a->kind != SIM_MEM_IPC) {
        free((void *)a->base);
    }
    free(a);
    if (mp != NULL) {
        sim_mempool_reap(mp);
    }
}

/* ------------------------------------------------------------------ */
/* Memory                                                              */
/* ------------------------------------------------------------------ */

/* cuMemAlloc and cuMemAllocManaged. */
static CUresult
sim_device_alloc(CUdeviceptr *dptr, size_t size, int kind, unsigned int flags)
{
    sim_ctx *c;
    void *mem = NULL;
    size_t charged;
    CUresult rc;

    if (dptr == NULL || size == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS) {
        charged = (size + (SIM_GRANULE - 1)) & ~(size_t)(SIM_GRANULE - 1);
        if (charged < size
            || charged > sim.capacity - sim.dev[c->dev].used) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
        else if (kind == SIM_MEM_DEVICE
                 ? posix_memalign(&mem, sysconf(_SC_PAGESIZE),
                                  sim_device_span(size)) != 0
                 : (mem = sim_host_map(size)) == NULL) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
        else {
#ifdef SIM_ASAN
            /* Whole pages, so IPC can share them; the tail stays out of
             * bounds. */
            if (kind == SIM_MEM_DEVICE) {
                ASAN_POISON_MEMORY_REGION((char *)mem + size,
                                          sim_device_span(size) - size);
            }
#endif
            rc = sim_alloc_add(c, mem, size, charged, kind, flags);
            if (rc != CUDA_SUCCESS && kind == SIM_MEM_DEVICE) {
                free(mem);
            }
            else if (rc != CUDA_SUCCESS) {
                munmap(mem, sim_device_span(size));
            }
            else {
                *dptr = (CUdeviceptr)(uintptr_t)mem;
            }
        }
    }
    sim_unlock();
    return rc;
}

CUresult
sim_MemAlloc(CUdeviceptr *dptr, size_t bytesize)
{
    SIM_ENTER(MemAlloc);
    if (sim_capture_check_unsafe() != CUDA_SUCCESS) {
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    return sim_device_alloc(dptr, bytesize, SIM_MEM_DEVICE, 0);
}

CUresult
sim_MemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    SIM_ENTER(MemAllocManaged);
    if (sim_capture_check_unsafe() != CUDA_SUCCESS) {
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    return sim_device_alloc(dptr, bytesize, SIM_MEM_MANAGED, flags);
}

/* Free the allocation starting at p if its kind is in kinds (a bit
 * mask); bad: what an unknown p returns.  Waits for all queued work
 * first, as the driver's frees synchronise. */
static CUresult
sim_free(uintptr_t p, unsigned int kinds, CUresult bad)
{
    sim_ctx *c;
    sim_alloc *a;
    CUresult rc;

    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS) {
        a = sim_alloc_find(p);
        if (a == NULL || a->base != p || !(kinds & (1u << a->kind))) {
            rc = bad;
        }
        else {
            a->dying = SIM_DYING_FREE;
            rc = sim_drain(NULL);
            if (rc != CUDA_SUCCESS) {
                a->dying = SIM_DYING_NO;
            }
            else {
                sim_alloc_remove(a);
                sim_alloc_release(a);
            }
        }
    }
    sim_unlock();
    return rc;
}

CUresult
sim_MemFree(CUdeviceptr dptr)
{
    SIM_ENTER(MemFree);
    if (sim_capture_check_unsafe() != CUDA_SUCCESS) {
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    return sim_free((uintptr_t)dptr,
                    (1u << SIM_MEM_DEVICE) | (1u << SIM_MEM_MANAGED)
                    | (1u << SIM_MEM_POOL_IMPORT),
                    CUDA_ERROR_INVALID_VALUE);
}

CUresult
sim_MemGetInfo(size_t *free_, size_t *total)
{
    sim_ctx *c;
    CUresult rc;

    SIM_ENTER(MemGetInfo);
    if (free_ == NULL || total == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS) {
        *free_ = sim.capacity - sim.dev[c->dev].used;
        *total = sim.capacity;
    }
    sim_unlock();
    return rc;
}

CUresult
sim_MemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    sim_ctx *c;
    void *mem = NULL;
    CUresult rc;

    SIM_ENTER(MemHostAlloc);
    if (sim_capture_check_unsafe() != CUDA_SUCCESS) {
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (pp == NULL || bytesize == 0
        || (Flags & ~(unsigned int)(CU_MEMHOSTALLOC_PORTABLE
                                    | CU_MEMHOSTALLOC_DEVICEMAP
                                    | CU_MEMHOSTALLOC_WRITECOMBINED))) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS) {
        if ((mem = sim_host_map(bytesize)) == NULL) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
        else {
            rc = sim_alloc_add(c, mem, bytesize, 0, SIM_MEM_HOST, Flags);
            if (rc != CUDA_SUCCESS) {
                munmap(mem, sim_device_span(bytesize));
            }
            else {
                *pp = mem;
            }
        }
    }
    sim_unlock();
    return rc;
}

CUresult
sim_MemFreeHost(void *p)
{
    SIM_ENTER(MemFreeHost);
    if (sim_capture_check_unsafe() != CUDA_SUCCESS) {
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    return sim_free((uintptr_t)p, 1u << SIM_MEM_HOST,
                    CUDA_ERROR_INVALID_VALUE);
}

/* The flags of a cuMemHostAlloc allocation (the driver answers
 * INVALID_VALUE for registered or unknown memory). */
CUresult
sim_MemHostGetFlags(unsigned int *pFlags, void *p)
{
    sim_ctx *c;
    sim_alloc *a;
    CUresult rc;

    SIM_ENTER(MemHostGetFlags);
    if (pFlags == NULL || p == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS) {
        a = sim_alloc_find((uintptr_t)p);
        if (a == NULL || a->kind != SIM_MEM_HOST) {
            rc = CUDA_ERROR_INVALID_VALUE;
        }
        else {
            *pFlags = a->flags;
        }
    }
    sim_unlock();
    return rc;
}

CUresult
sim_MemHostRegister(void *p, size_t bytesize, unsigned int Flags)
{
    sim_ctx *c;
    CUresult rc;

    SIM_ENTER(MemHostRegister);
    if (sim_capture_check_unsafe() != CUDA_SUCCESS) {
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (p == NULL || bytesize == 0
        || bytesize > UINTPTR_MAX - (uintptr_t)p
        || (Flags & ~(unsigned int)(CU_MEMHOSTREGISTER_PORTABLE
                                    | CU_MEMHOSTREGISTER_DEVICEMAP
                                    | CU_MEMHOSTREGISTER_IOMEMORY
                                    | CU_MEMHOSTREGISTER_READ_ONLY))) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (Flags & CU_MEMHOSTREGISTER_IOMEMORY) {
        /* There is no I/O memory to map here. */
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS) {
        if (sim_alloc_overlaps((uintptr_t)p, bytesize)) {
            rc = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
        }
        else {
            rc = sim_alloc_add(c, p, bytesize, 0, SIM_MEM_REGISTERED, Flags);
        }
    }
    sim_unlock();
    return rc;
}

CUresult
sim_MemHostUnregister(void *p)
{
    SIM_ENTER(MemHostUnregister);
    if (sim_capture_check_unsafe() != CUDA_SUCCESS) {
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    return sim_free((uintptr_t)p, 1u << SIM_MEM_REGISTERED,
                    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
}

/* cuIpcCloseMemHandle: a free of an imported mapping (ipc.c explains
 * the model), so it lives here with the other frees, over
 * sim_alloc_release. */
CUresult
sim_IpcCloseMemHandle(CUdeviceptr dptr)
{
    sim_ctx *c;
    sim_alloc *a;
    CUresult rc;

    SIM_ENTER(IpcCloseMemHandle);
    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS) {
        a = sim_alloc_find((uintptr_t)dptr);
        if (a == NULL || a->base != (uintptr_t)dptr
            || a->kind != SIM_MEM_IPC) {
            rc = CUDA_ERROR_INVALID_VALUE;
        }
        else if (--a->ipc->refs == 0) {
            /* Unmap once nothing queued can still touch it. */
            a->dying = SIM_DYING_FREE;
            rc = sim_drain(NULL);
            if (rc != CUDA_SUCCESS) {
                a->dying = SIM_DYING_NO;
                a->ipc->refs++;
            }
            else {
                sim_alloc_remove(a);
                sim_alloc_release(a);
            }
        }
    }
    sim_unlock();
    return rc;
}

CUresult
sim_MemHostGetDevicePointer(CUdeviceptr *pdptr, void *p, unsigned int Flags)
{
    sim_ctx *c;
    sim_alloc *a;
    CUresult rc;

    SIM_ENTER(MemHostGetDevicePointer);
    if (pdptr == NULL || p == NULL || Flags != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS) {
        a = sim_alloc_find((uintptr_t)p);
        if (a == NULL
            || (a->kind != SIM_MEM_HOST && a->kind != SIM_MEM_REGISTERED)) {
            rc = CUDA_ERROR_INVALID_VALUE;
        }
        else {
            /* Unified addressing: the same address on both sides. */
            *pdptr = (CUdeviceptr)(uintptr_t)p;
        }
    }
    sim_unlock();
    return rc;
}

CUresult
sim_MemGetAddressRange(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    sim_ctx *c;
    sim_alloc *a;
    CUresult rc;

    SIM_ENTER(MemGetAddressRange);
    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS) {
        a = sim_alloc_find((uintptr_t)dptr);
        if (a == NULL
            || (a->kind != SIM_MEM_DEVICE && a->kind != SIM_MEM_MANAGED
                && a->kind != SIM_MEM_IPC && a->kind != SIM_MEM_ASYNC
                && a->kind != SIM_MEM_POOL_IMPORT
                && a->kind != SIM_MEM_VMM)) {
            /* VMM memory: the mapping, not the reservation. */
            rc = CUDA_ERROR_NOT_FOUND;
        }
        else {
            if (pbase != NULL) {
                *pbase = (CUdeviceptr)a->base;
            }
            if (psize != NULL) {
                *psize = a->size;
            }
        }
    }
    sim_unlock();
    return rc;
}

/* The size of what the simulator writes for a pointer attribute, or 0
 * for one it does not model. */
static size_t
sim_pointer_attr_size(CUpointer_attribute attribute)
{
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        return sizeof(CUcontext);
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        return sizeof(CUdeviceptr);
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
        return sizeof(void *);
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
        return sizeof(unsigned long long);
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        return sizeof(int);
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
        return sizeof(size_t);
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
        return sizeof(CUmemoryPool);
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_MAPPED:
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
        return sizeof(unsigned int);
    default:
        return 0;
    }
}

/* One attribute of ptr, which lies in a (live).  Lock held. */
static CUresult
sim_pointer_attr(const sim_alloc *a, void *data,
                 CUpointer_attribute attribute, CUdeviceptr ptr)
{
    int host = a->kind == SIM_MEM_HOST || a->kind == SIM_MEM_REGISTERED;
    int managed = a->kind == SIM_MEM_MANAGED;

    if (a->kind == SIM_MEM_VMM) {
        return sim_vmm_pointer_attr(a, data, attribute, ptr);
    }
    /* Booleans are written as unsigned int, the type the driver uses. */
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
        *(unsigned int *)data = a->kind == SIM_MEM_DEVICE;
        break;
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext *)data = sim_ctx_handle(a->ctx);
        break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = host ? CU_MEMORYTYPE_HOST
                                     : CU_MEMORYTYPE_DEVICE;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *(CUdeviceptr *)data = ptr;
        break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (!host && !managed) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        *(void **)data = (void *)(uintptr_t)ptr;
        break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        *(unsigned long long *)data = a->id;
        break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *(unsigned int *)data = (unsigned int)managed;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = a->ctx->dev;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)data = (CUdeviceptr)a->base;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = a->size;
        break;
    case CU_POINTER_ATTRIBUTE_MAPPED:
        *(unsigned int *)data = 1;
        break;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
        *(CUmemoryPool *)data = (CUmemoryPool)(void *)a->pool;
        break;
    default:
        return (int)attribute >= CU_POINTER_ATTRIBUTE_CONTEXT
               && attribute <= CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE
               ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

CUresult
sim_PointerGetAttribute(void *data, CUpointer_attribute attribute,
                        CUdeviceptr ptr)
{
    sim_alloc *a;
    CUresult rc;
    int known;

    SIM_ENTER(PointerGetAttribute);
    if (data == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    a = sim_alloc_find((uintptr_t)ptr);
    if (a != NULL) {
        rc = sim_pointer_attr(a, data, attribute, ptr);
    }
    else {
        /* An unmapped address of a reservation answers its range. */
        rc = sim_vmm_hole_attr((uintptr_t)ptr, data, attribute, &known);
    }
    sim_unlock();
    return rc;
}

/* As the driver's: an address the simulator does not know is no error;
 * every attribute of it reads as zero (memory type 0: unregistered). */
CUresult
sim_PointerGetAttributes(unsigned int numAttributes,
                         CUpointer_attribute *attributes, void **data,
                         CUdeviceptr ptr)
{
    sim_alloc *a;
    CUresult rc = CUDA_SUCCESS;
    size_t size;
    unsigned int i;
    int known;

    SIM_ENTER(PointerGetAttributes);
    if (numAttributes == 0 || attributes == NULL || data == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (i = 0; i < numAttributes; i++) {
        if (data[i] == NULL
            || sim_pointer_attr_size(attributes[i]) == 0) {
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    sim_lock();
    a = sim_alloc_find((uintptr_t)ptr);
    for (i = 0; i < numAttributes && rc == CUDA_SUCCESS; i++) {
        size = sim_pointer_attr_size(attributes[i]);
        if (a == NULL) {
            /* Unknown, or a reservation's unmapped address: its range
             * and MAPPED (0) are known, the rest reads as zero. */
            if (sim_vmm_hole_attr((uintptr_t)ptr, data[i], attributes[i],
                                  &known) != CUDA_SUCCESS) {
                memset(data[i], 0, size);
            }
        }
        else if (attributes[i] == CU_POINTER_ATTRIBUTE_HOST_POINTER
                 && a->kind != SIM_MEM_HOST && a->kind != SIM_MEM_REGISTERED
                 && a->kind != SIM_MEM_MANAGED) {
            /* Device memory has no host address: NULL, not an error. */
            memset(data[i], 0, size);
        }
        else {
            rc = sim_pointer_attr(a, data[i], attributes[i], ptr);
        }
    }
    sim_unlock();
    return rc;
}
