/* SPDX-License-Identifier: MIT */
/*
 * sim/vmm.c: the simulator's virtual memory management (cuMemAddressReserve,
 * cuMemCreate, cuMemMap, cuMemSetAccess and the rest of the driver's VMM
 * calls): its objects and what the rest of the simulator asks of them
 * (whether a range is mapped and accessible, sim_range and sim_range_dev
 * included; pointer attributes; a mapping's release).  The entry points
 * are sim/vmmfuncs.c's; sim/vmm.h holds the types the two files share.
 *
 * What it owns: address reservations (sim_vres), physical allocations
 * (sim_vphys) and mappings (sim_vmap, each registered in the allocation
 * registry as a SIM_MEM_VMM sim_alloc, so that copies, memsets, kernels
 * and pointer queries find it as they find cuMemAlloc memory).
 *
 * The model, on real host mappings:
 * - a reservation is a PROT_NONE, MAP_NORESERVE anonymous mapping of the
 *   host, aligned to the granularity (2 MiB, as on an H200) or more.  The
 *   device pointer is the host address, as everywhere in the simulator,
 *   and the kernel keeps reservations apart from every other allocation;
 * - a physical allocation is a memfd of its size (sparse: pages cost host
 *   memory once written), charged against its device's memory as
 *   cuMemAlloc is (cuMemGetInfo sees it; CUDA_ERROR_OUT_OF_MEMORY when
 *   short);
 * - cuMemMap maps the memfd, at the offset, MAP_SHARED | MAP_FIXED over
 *   the reservation, so two mappings of one allocation alias; it stays
 *   PROT_NONE (and the simulator's copies, memsets and kernels refuse it,
 *   with CUDA_ERROR_INVALID_VALUE) until cuMemSetAccess grants a device
 *   read-write access.  Access is kept per device; a copy or kernel is
 *   checked against the device of its context, so with two devices the
 *   peer needs its own grant (cuCtxEnablePeerAccess plays no part);
 * - cuMemUnmap fails loudly (CUDA_ERROR_ILLEGAL_STATE and a line on
 *   stderr) while queued copies or memsets still use the range, which
 *   the driver does not promise to wait for; else it puts PROT_NONE
 *   anonymous pages back at once, waiting for no other work (the driver
 *   is not documented to synchronise there); a physical allocation goes once no
 *   handle reference and no mapping is left (cuMemRelease while mapped
 *   only drops the reference, as the driver documents);
 * - an allocation made with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR is
 *   exported as a duplicate of its memfd, so another process that gets
 *   the descriptor (SCM_RIGHTS, pidfd_getfd) imports and maps the same
 *   pages; an import charges nothing.  Under CUDAMEM_SIM_NO_FD_HANDLES=1
 *   the device has no such handles: asking for them (cuMemCreate, the
 *   granularity query) gives CUDA_ERROR_NOT_SUPPORTED.
 *
 * Answers where the driver leaves room or where the simulator cannot
 * follow it, each an error, never a pretended success:
 * CU_MEM_ACCESS_FLAGS_PROT_READ (read-only device access) gives
 * CUDA_ERROR_NOT_SUPPORTED, since the simulator's paths do not know which
 * ranges a kernel writes; so do a cuMemSetAccess range that starts or
 * ends inside a mapping, host or host-NUMA locations, managed allocation
 * type, fabric handles and tile-pool or decompression usage;
 * cuMemAddressFree with mappings left gives CUDA_ERROR_INVALID_VALUE (the
 * caller must unmap first); a handle value that names nothing gives
 * CUDA_ERROR_INVALID_VALUE where the driver calls it undefined; revoking
 * a device's access does not take the host pages away (queued work was
 * checked when it was queued), only later checks see it.
 *
 * Locking: every list here and every mapping is guarded by sim.lock;
 * every entry point (vmmfuncs.c) takes it after SIM_ENTER and gives it
 * back before returning; the functions here run with it held.
 */
#include "driver/cu_table.h"
#include "sim/sim.h"
#include "sim/vmm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* NOTE: the two below are guarded by sim.lock. */
sim_vphys *sim_vphys_list;
sim_vres *sim_vres_list;

/* Free p once no reference and no mapping is left. */
void
sim_vphys_settle(sim_vphys *p)
{
    sim_vphys **pp = &sim_vphys_list;

    if (p->refs > 0 || p->nmaps > 0) {
        return;
    }
    while (*pp != p) {
        pp = &(*pp)->next;
    }
    *pp = p->next;
    close(p->fd);
    sim.dev[p->dev].used -= p->charged;
    free(p);
}

/* The reservation containing address v, or NULL. */
sim_vres *
sim_vres_of(uintptr_t v)
{
    sim_vres *r;

    for (r = sim_vres_list; r != NULL; r = r->next) {
        if (v - r->base < r->size) {
            return r;
        }
    }
    return NULL;
}

/* Whether [p, p + n) overlaps any address reservation. */
int
sim_vmm_overlaps(uintptr_t p, size_t n)
{
    const sim_vres *r;

    for (r = sim_vres_list; r != NULL; r = r->next) {
        if (p - r->base < r->size || (r->base > p && r->base - p < n)) {
            return 1;
        }
    }
    return 0;
}

/* Put inaccessible, unbacked pages over [base, base + size) of a
 * reservation.  0, or -1 if the host refused. */
int
sim_vmm_unback(uintptr_t base, size_t size)
{
    void *m = mmap((void *)base, size, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
                   -1, 0);

    return m == MAP_FAILED ? -1 : 0;
}

/* Whether the mappings from a on cover [p, p + n) without a hole, all in
 * a's reservation and, if check, all accessible to device dev; p lies in
 * a. */
int
sim_vmm_cover(const sim_alloc *a, uintptr_t p, size_t n, int dev, int check)
{
    const sim_vres *res = a->vmap->res;
    size_t left;

    for (;;) {
        if (check && (dev < 0 || dev >= SIM_MAX_DEVICES
                      || !((a->vmap->access >> dev) & 1))) {
            return 0;
        }
        left = a->size - (p - a->base);
        if (n <= left) {
            return 1;
        }
        n -= left;
        p = a->base + a->size;
        a = sim_alloc_find(p);
        if (a == NULL || a->kind != SIM_MEM_VMM || a->vmap->res != res) {
            return 0;
        }
    }
}

/* Whether the mappings from a on cover [p, p + n) without a hole, all in
 * a's reservation and all accessible to device dev; p lies in a. */
int
sim_vmm_range(const sim_alloc *a, uintptr_t p, size_t n, int dev)
{
    return sim_vmm_cover(a, p, n, dev, 1);
}

/* Give back what mapping a holds (out of the registry; nothing queued
 * uses it): the pages return to the reservation, inaccessible. */
void
sim_vmm_map_release(sim_alloc *a)
{
    sim_vmap *vm = a->vmap;

    /* Should the host refuse, the memfd pages stay mapped but unused:
     * the registry no longer knows them, so nothing reaches them. */
    sim_vmm_unback(a->base, a->size);
    vm->res->nmaps--;
    vm->phys->nmaps--;
    sim_vphys_settle(vm->phys);
    free(vm);
    a->vmap = NULL;
}

/* ------------------------------------------------------------------ */
/* Pointer queries                                                     */
/* ------------------------------------------------------------------ */

/* One pointer attribute of ptr, which lies in mapping a (live). */
CUresult
sim_vmm_pointer_attr(const sim_alloc *a, void *data,
                     CUpointer_attribute attribute, CUdeviceptr ptr)
{
    const sim_vmap *vm = a->vmap;
    const sim_ctx *c = sim_top();
    int dev = c != NULL && !c->destroyed ? c->dev : -1;

    /* Booleans are written as unsigned int, as elsewhere. */
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        /* VMM memory belongs to no context. */
        *(CUcontext *)data = NULL;
        break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = CU_MEMORYTYPE_DEVICE;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *(CUdeviceptr *)data = ptr;
        break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        return CUDA_ERROR_INVALID_VALUE;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        *(unsigned long long *)data = a->id;
        break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
        *(unsigned int *)data = 0;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = vm->phys->dev;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        /* The reservation, as the driver documents; the mapping is
         * MAPPING_BASE_ADDR and cuMemGetAddressRange. */
        *(CUdeviceptr *)data = (CUdeviceptr)vm->res->base;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = vm->res->size;
        break;
    case CU_POINTER_ATTRIBUTE_MAPPED:
        *(unsigned int *)data = 1;
        break;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
        *(unsigned long long *)data =
            (unsigned long long)vm->phys->prop.requestedHandleTypes;
        break;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
        *(unsigned int *)data =
            dev >= 0 && ((vm->access >> dev) & 1)
            ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE
            : CU_POINTER_ATTRIBUTE_ACCESS_FLAG_NONE;
        break;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
        *(CUmemoryPool *)data = NULL;
        break;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
        *(size_t *)data = a->size;
        break;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
        *(void **)data = (void *)a->base;
        break;
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
        *(unsigned long long *)data = vm->phys->id;
        break;
    default:
        return (int)attribute >= CU_POINTER_ATTRIBUTE_CONTEXT
               && attribute <= CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE
               ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

/* One pointer attribute of ptr, which lies in no allocation: if it lies
 * in a reservation, the range and MAPPED (0) are answered, and *known is
 * set; other attributes give CUDA_ERROR_INVALID_VALUE.  Else *known is
 * 0. */
CUresult
sim_vmm_hole_attr(uintptr_t ptr, void *data, CUpointer_attribute attribute,
                  int *known)
{
    const sim_vres *r = sim_vres_of(ptr);

    *known = r != NULL;
    if (r == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)data = (CUdeviceptr)r->base;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = r->size;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED:
        *(unsigned int *)data = 0;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

/* ------------------------------------------------------------------ */
/* Ranges as a device sees them                                        */
/* ------------------------------------------------------------------ */

/* sim_range as seen from device dev (-1: none, so no VMM memory). */
sim_alloc *
sim_range_dev(uintptr_t p, size_t n, int dev)
{
    sim_alloc *a = sim_alloc_find(p);

    if (a == NULL) {
        return NULL;
    }
    if (a->kind == SIM_MEM_VMM) {
        return sim_vmm_range(a, p, n, dev) ? a : NULL;
    }
    return n > a->size - (p - a->base) ? NULL : a;
}

sim_alloc *
sim_range_kernel(uintptr_t p, size_t n, int dev)
{
    sim_alloc *a = sim_range_dev(p, n, dev);

    if (a != NULL && a->kind == SIM_MEM_ASYNC && a->pool != NULL
        && (dev < 0 || dev >= SIM_MAX_DEVICES
            || !((a->pool->access >> dev) & 1))) {
        return NULL;
    }
    return a;
}

/* Whether [p, p + n) lies inside one live allocation, as seen from the
 * current context's device; n > 0. */
sim_alloc *
sim_range(uintptr_t p, size_t n)
{
    const sim_ctx *c = sim_top();

    return sim_range_dev(p, n, c != NULL && !c->destroyed ? c->dev : -1);
}
