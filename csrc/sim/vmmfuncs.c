/* SPDX-License-Identifier: MIT */
/*
 * sim/vmmfuncs.c: the simulator's virtual memory management entry points
 * (cuMemAddressReserve, cuMemCreate, cuMemMap, cuMemSetAccess and the
 * rest of the driver's VMM calls).  The model, what it refuses, and the
 * objects these calls make (reservations, physical allocations,
 * mappings) are sim/vmm.c's; sim/vmm.h holds the types both share.
 *
 * Locks and the GIL: every entry point takes sim.lock after SIM_ENTER and
 * gives it back before returning (cuMemUnmap gives it back before writing
 * its warning to stderr); the memfds and host mappings are made and changed
 * under it.  No other lock, and nothing here waits for queued work.  The
 * GIL is never taken nor given up here.
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

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

/* The handle types a physical allocation may ask for. */
#define SIM_VMM_TYPES_KNOWN                                             \
    ((unsigned int)(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR            \
                    | CU_MEM_HANDLE_TYPE_WIN32                          \
                    | CU_MEM_HANDLE_TYPE_WIN32_KMT                      \
                    | CU_MEM_HANDLE_TYPE_FABRIC))

#ifdef CU_MEM_CREATE_USAGE_HW_DECOMPRESS
#define SIM_VMM_USAGE_KNOWN \
    (CU_MEM_CREATE_USAGE_TILE_POOL | CU_MEM_CREATE_USAGE_HW_DECOMPRESS)
#else
#define SIM_VMM_USAGE_KNOWN CU_MEM_CREATE_USAGE_TILE_POOL
#endif

/* The memfd name of a physical allocation: its device follows. */
#define SIM_VMM_NAME "cudamem-sim-vmm-d"

/* NOTE: guarded by sim.lock. */
static uint64_t sim_vphys_last;

static int
sim_vmm_aligned(uintptr_t v)
{
    return (v & (SIM_VMM_GRANULE - 1)) == 0;
}

/* The physical allocation a live handle names, or NULL. */
static sim_vphys *
sim_vphys_find(CUmemGenericAllocationHandle h)
{
    sim_vphys *p;

    for (p = sim_vphys_list; p != NULL; p = p->next) {
        if (p->id == (uint64_t)h && p->refs > 0) {
            return p;
        }
    }
    return NULL;
}

/* Check an allocation's properties (cuMemCreate and the granularity
 * query). */
static CUresult
sim_vmm_prop_check(const CUmemAllocationProp *prop)
{
    unsigned int types;

    if (prop == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (prop->type == CU_MEM_ALLOCATION_TYPE_MANAGED) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    switch (prop->location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
        if (!sim_dev_ok(prop->location.id)) {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        break;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
        /* The device attributes say host VMM is unsupported. */
        return CUDA_ERROR_NOT_SUPPORTED;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (prop->win32HandleMetaData != NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    types = (unsigned int)prop->requestedHandleTypes;
    if ((types & ~SIM_VMM_TYPES_KNOWN)
        || (types & (CU_MEM_HANDLE_TYPE_WIN32
                     | CU_MEM_HANDLE_TYPE_WIN32_KMT))) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if ((types & CU_MEM_HANDLE_TYPE_FABRIC)
        || ((types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
            && sim.no_fd)) {
        /* No fabric; no descriptors under CUDAMEM_SIM_NO_FD_HANDLES. */
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (prop->allocFlags.usage & ~(unsigned int)SIM_VMM_USAGE_KNOWN) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (prop->allocFlags.usage != 0) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    return CUDA_SUCCESS;
}

CUresult
sim_MemGetAllocationGranularity(size_t *granularity,
                                const CUmemAllocationProp *prop,
                                CUmemAllocationGranularity_flags option)
{
    CUresult rc;

    SIM_ENTER(MemGetAllocationGranularity);
    if (granularity == NULL
        || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM
            && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    rc = sim_vmm_prop_check(prop);
    if (rc == CUDA_SUCCESS) {
        *granularity = SIM_VMM_GRANULE;
    }
    return rc;
}

/* ------------------------------------------------------------------ */
/* Reservations                                                        */
/* ------------------------------------------------------------------ */

/* A fresh PROT_NONE range of size bytes aligned to align, at hint if
 * that is free; 0 when the host has no room. */
static uintptr_t
sim_vmm_map_none(uintptr_t hint, size_t size, size_t align)
{
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    uintptr_t start;
    size_t head;
    void *m;

    if (hint != 0 && (hint & (align - 1)) == 0) {
        m = mmap((void *)hint, size, PROT_NONE, flags | MAP_FIXED_NOREPLACE,
                 -1, 0);
        if (m == (void *)hint) {
            return hint;
        }
        if (m != MAP_FAILED) {
            /* A kernel without MAP_FIXED_NOREPLACE put it elsewhere. */
            munmap(m, size);
        }
    }
    if (size > SIZE_MAX - align) {
        return 0;
    }
    m = mmap(NULL, size + align, PROT_NONE, flags, -1, 0);
    if (m == MAP_FAILED) {
        return 0;
    }
    start = ((uintptr_t)m + align - 1) & ~(uintptr_t)(align - 1);
    head = start - (uintptr_t)m;
    if (head > 0) {
        munmap(m, head);
    }
    if (align - head > 0) {
        munmap((void *)(start + size), align - head);
    }
    return start;
}

CUresult
sim_MemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                      CUdeviceptr addr, unsigned long long flags)
{
    sim_vres *r;
    uintptr_t base;

    SIM_ENTER(MemAddressReserve);
    if (ptr == NULL || size == 0 || flags != 0 || !sim_vmm_aligned(size)
        || (alignment & (alignment - 1)) != 0
        || !sim_vmm_aligned((uintptr_t)addr)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (alignment < SIM_VMM_GRANULE) {
        alignment = SIM_VMM_GRANULE;
    }
    r = calloc(1, sizeof(*r));
    if (r == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    base = sim_vmm_map_none((uintptr_t)addr, size, alignment);
    if (base == 0) {
        free(r);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    r->base = base;
    r->size = size;
    sim_lock();
    r->next = sim_vres_list;
    sim_vres_list = r;
    sim_unlock();
    *ptr = (CUdeviceptr)base;
    return CUDA_SUCCESS;
}

CUresult
sim_MemAddressFree(CUdeviceptr ptr, size_t size)
{
    sim_vres **pp;
    sim_vres *r = NULL;
    CUresult rc = CUDA_ERROR_INVALID_VALUE;

    SIM_ENTER(MemAddressFree);
    sim_lock();
    for (pp = &sim_vres_list; *pp != NULL; pp = &(*pp)->next) {
        if ((*pp)->base == (uintptr_t)ptr) {
            break;
        }
    }
    if (*pp != NULL && (*pp)->size == size && (*pp)->nmaps == 0) {
        r = *pp;
        *pp = r->next;
        rc = CUDA_SUCCESS;
    }
    sim_unlock();
    if (r != NULL) {
        munmap((void *)r->base, r->size);
        free(r);
    }
    return rc;
}

/* ------------------------------------------------------------------ */
/* Physical allocations                                                */
/* ------------------------------------------------------------------ */

/* A new physical allocation over fd (taken over), linked, one handle
 * reference; NULL when out of memory (fd is then closed). */
static sim_vphys *
sim_vphys_new(int fd, size_t size, const CUmemAllocationProp *prop,
              size_t charged)
{
    sim_vphys *p = calloc(1, sizeof(*p));

    if (p == NULL) {
        close(fd);
        return NULL;
    }
    p->id = ++sim_vphys_last;
    p->fd = fd;
    p->size = size;
    p->dev = prop->location.id;
    p->charged = charged;
    p->prop = *prop;
    p->refs = 1;
    p->next = sim_vphys_list;
    sim_vphys_list = p;
    sim.dev[p->dev].used += charged;
    return p;
}

CUresult
sim_MemCreate(CUmemGenericAllocationHandle *handle, size_t size,
              const CUmemAllocationProp *prop, unsigned long long flags)
{
    char name[64];
    sim_vphys *p;
    CUresult rc;
    int fd = -1;

    SIM_ENTER(MemCreate);
    if (handle == NULL || size == 0 || flags != 0 || !sim_vmm_aligned(size)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    rc = sim_vmm_prop_check(prop);
    if (rc != CUDA_SUCCESS) {
        return rc;
    }
    snprintf(name, sizeof(name), SIM_VMM_NAME "%d", prop->location.id);
    sim_lock();
    if (size > sim.capacity - sim.dev[prop->location.id].used) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    else if ((fd = memfd_create(name, MFD_CLOEXEC)) < 0
             || ftruncate(fd, (off_t)size) != 0) {
        if (fd >= 0) {
            close(fd);
        }
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    else if ((p = sim_vphys_new(fd, size, prop, size)) == NULL) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    else {
        /* What the simulator keeps: no compression, no GPUDirect RDMA. */
        p->prop.allocFlags.compressionType = CU_MEM_ALLOCATION_COMP_NONE;
        p->prop.allocFlags.gpuDirectRDMACapable = 0;
        *handle = (CUmemGenericAllocationHandle)p->id;
    }
    sim_unlock();
    return rc;
}

CUresult
sim_MemRelease(CUmemGenericAllocationHandle handle)
{
    sim_vphys *p;
    CUresult rc = CUDA_SUCCESS;

    SIM_ENTER(MemRelease);
    sim_lock();
    p = sim_vphys_find(handle);
    if (p == NULL) {
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    else {
        p->refs--;
        sim_vphys_settle(p);
    }
    sim_unlock();
    return rc;
}

CUresult
sim_MemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                         CUmemGenericAllocationHandle handle)
{
    sim_vphys *p;
    CUresult rc = CUDA_SUCCESS;

    SIM_ENTER(MemGetAllocationPropertiesFromHandle);
    if (prop == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    p = sim_vphys_find(handle);
    if (p == NULL) {
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    else {
        *prop = p->prop;
    }
    sim_unlock();
    return rc;
}

CUresult
sim_MemRetainAllocationHandle(CUmemGenericAllocationHandle *handle,
                              void *addr)
{
    sim_alloc *a;
    CUresult rc = CUDA_SUCCESS;

    SIM_ENTER(MemRetainAllocationHandle);
    if (handle == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    a = sim_alloc_find((uintptr_t)addr);
    if (a == NULL || a->kind != SIM_MEM_VMM) {
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    else {
        a->vmap->phys->refs++;
        *handle = (CUmemGenericAllocationHandle)a->vmap->phys->id;
    }
    sim_unlock();
    return rc;
}

/* ------------------------------------------------------------------ */
/* Mappings                                                            */
/* ------------------------------------------------------------------ */

CUresult
sim_MemMap(CUdeviceptr ptr, size_t size, size_t offset,
           CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    uintptr_t p = (uintptr_t)ptr;
    sim_alloc *a;
    sim_vmap *vm;
    sim_vphys *ph;
    sim_vres *res;
    CUresult rc = CUDA_SUCCESS;

    SIM_ENTER(MemMap);
    if (p == 0 || size == 0 || flags != 0 || !sim_vmm_aligned(p)
        || !sim_vmm_aligned(size) || !sim_vmm_aligned(offset)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    a = calloc(1, sizeof(*a));
    vm = calloc(1, sizeof(*vm));
    if (a == NULL || vm == NULL) {
        free(a);
        free(vm);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    sim_lock();
    ph = sim_vphys_find(handle);
    res = sim_vres_of(p);
    if (ph == NULL || offset > ph->size || size > ph->size - offset
        || res == NULL || size > res->size - (p - res->base)
        || sim_alloc_overlaps(p, size)) {
        /* Also: mapping over a range that is (or is being un-) mapped. */
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    else if (mmap((void *)p, size, PROT_NONE, MAP_SHARED | MAP_FIXED,
                  ph->fd, (off_t)offset) == MAP_FAILED) {
        sim_vmm_unback(p, size);
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    else {
        a->base = p;
        a->size = size;
        a->kind = SIM_MEM_VMM;
        a->vmap = vm;
        vm->phys = ph;
        vm->res = res;
        vm->offset = offset;
        if (sim_alloc_insert(a) != 0) {
            sim_vmm_unback(p, size);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
        else {
            ph->nmaps++;
            res->nmaps++;
            a = NULL;
            vm = NULL;
        }
    }
    sim_unlock();
    free(a);
    free(vm);
    return rc;
}

/* The number of whole live mappings that tile [p, p + size) exactly, or
 * 0 when the range has a hole, starts or ends inside a mapping, or
 * leaves the reservation. */
static size_t
sim_vmm_tiles(uintptr_t p, size_t size)
{
    const sim_alloc *a;
    const sim_vres *res = NULL;
    size_t n = 0;

    while (size > 0) {
        a = sim_alloc_find(p);
        if (a == NULL || a->kind != SIM_MEM_VMM || a->base != p
            || a->size > size || (res != NULL && a->vmap->res != res)) {
            return 0;
        }
        res = a->vmap->res;
        p += a->size;
        size -= a->size;
        n++;
    }
    return n;
}

/* The last byte after first that a copy's side touches, for extents. */
static uintptr_t
sim_copy_end(uintptr_t first, const sim_op *op, size_t pitch, size_t slice)
{
    size_t h = op->u.copy.height ? op->u.copy.height : 1;
    size_t d = op->u.copy.depth ? op->u.copy.depth : 1;

    return first + (d - 1) * slice + (h - 1) * pitch + op->u.copy.width;
}

/* Whether work queued and not yet done on a stream of c copies to or
 * from, or sets, a byte of [p, p + n) (lock held). */
static int
sim_vmm_ctx_uses(const sim_ctx *c, uintptr_t p, size_t n)
{
    const sim_stream *s;
    const sim_op *op;
    uintptr_t a, e;
    int k;

    for (k = 0; k < 2; k++) {
        for (s = k ? c->streams : c->legacy; s != NULL;
             s = k ? s->next : NULL) {
            for (op = s->head; op != NULL; op = op->next) {
                if (op->kind == SIM_OP_SET) {
                    a = (uintptr_t)op->u.set.dst;
                    if (a < p + n && p < a + op->u.set.n) {
                        return 1;
                    }
                }
                else if (op->kind == SIM_OP_COPY) {
                    a = (uintptr_t)op->u.copy.dst;
                    e = sim_copy_end(a, op, op->u.copy.dpitch,
                                     op->u.copy.dslice);
                    if (a < p + n && p < e) {
                        return 1;
                    }
                    a = (uintptr_t)op->u.copy.src;
                    e = sim_copy_end(a, op, op->u.copy.spitch,
                                     op->u.copy.sslice);
                    if (a < p + n && p < e) {
                        return 1;
                    }
                }
            }
        }
    }
    return 0;
}

/* Whether queued work of any context still uses [p, p + n). */
static int
sim_vmm_queued_use(uintptr_t p, size_t n)
{
    const sim_ctx *o;
    int d;

    for (d = 0; d < sim.ndev; d++) {
        o = sim.dev[d].primary;
        if (o != NULL && sim_vmm_ctx_uses(o, p, n)) {
            return 1;
        }
    }
    for (o = sim.dead; o != NULL; o = o->next_dead) {
        if (sim_vmm_ctx_uses(o, p, n)) {
            return 1;
        }
    }
    return 0;
}

CUresult
sim_MemUnmap(CUdeviceptr ptr, size_t size)
{
    uintptr_t p = (uintptr_t)ptr, q;
    sim_alloc *a;
    size_t n, i;

    SIM_ENTER(MemUnmap);
    if (p == 0 || size == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    n = sim_vmm_tiles(p, size);
    if (n == 0) {
        /* Not mapped, a hole, or part of a mapping. */
        sim_unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (sim_vmm_queued_use(p, size)) {
        /* The driver does not promise to wait for work that reads or
         * writes memory being unmapped: a caller that relies on it has a
         * bug a GPU may show as a fault.  Said, never waited away. */
        sim_unlock();
        fprintf(stderr, "cudamem simulator: cuMemUnmap(0x%lx, %zu) while "
                "queued work still copies to, from or sets those bytes "
                "(undefined on a GPU)\n", (unsigned long)p, size);
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    /* Work that does not use them is not waited for: the driver's
     * cuMemUnmap is not documented to synchronise (tools/vmm_probe.py
     * asks a GPU), and a caller that unmaps while another stream is held
     * by a host function must not hang here where the driver would not
     * (should the probe find that it does wait, this waits again). */
    for (i = 0, q = p; i < n; i++) {
        a = sim_alloc_find(q);
        q += a->size;
        sim_alloc_remove(a);
        sim_alloc_release(a);
    }
    sim_unlock();
    return CUDA_SUCCESS;
}

/* Whether a CUmemAccessDesc names a device and flags the simulator
 * models; else why not (peers are checked per mapping). */
static CUresult
sim_vmm_access_check(const CUmemAccessDesc *d)
{
    if (d->location.type == CU_MEM_LOCATION_TYPE_HOST
        || d->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (d->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!sim_dev_ok(d->location.id)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    switch (d->flags) {
    case CU_MEM_ACCESS_FLAGS_PROT_NONE:
    case CU_MEM_ACCESS_FLAGS_PROT_READWRITE:
        return CUDA_SUCCESS;
    case CU_MEM_ACCESS_FLAGS_PROT_READ:
        /* Not modelled: the simulator's paths cannot tell reads from
         * writes. */
        return CUDA_ERROR_NOT_SUPPORTED;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

CUresult
sim_MemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                 size_t count)
{
    uintptr_t p = (uintptr_t)ptr, q;
    sim_alloc *a;
    uint64_t access;
    size_t n, i, j;
    int dev;
    CUresult rc = CUDA_SUCCESS;

    SIM_ENTER(MemSetAccess);
    if (p == 0 || size == 0 || desc == NULL || count == 0
        || !sim_vmm_aligned(p) || !sim_vmm_aligned(size)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (j = 0; j < count; j++) {
        rc = sim_vmm_access_check(&desc[j]);
        if (rc != CUDA_SUCCESS) {
            return rc;
        }
    }
    sim_lock();
    n = sim_vmm_tiles(p, size);
    if (n == 0) {
        a = sim_alloc_find(p);
        /* Mapped throughout but cutting a mapping: the simulator keeps
         * access per mapping and cannot split one.  Else a hole. */
        rc = a != NULL && a->kind == SIM_MEM_VMM
             && sim_vmm_cover(a, p, size, -1, 0)
             ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE;
    }
    for (i = 0, q = p; rc == CUDA_SUCCESS && i < n; i++) {
        a = sim_alloc_find(q);
        for (j = 0; j < count && rc == CUDA_SUCCESS; j++) {
            dev = desc[j].location.id;
            if (dev != a->vmap->phys->dev
                && (sim.no_peer[a->vmap->phys->dev] & (1u << dev))) {
                rc = CUDA_ERROR_INVALID_DEVICE;
            }
        }
        q += a->size;
    }
    for (i = 0, q = p; rc == CUDA_SUCCESS && i < n; i++) {
        a = sim_alloc_find(q);
        access = a->vmap->access;
        for (j = 0; j < count; j++) {
            dev = desc[j].location.id;
            if (desc[j].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
                access |= (uint64_t)1 << dev;
            }
            else {
                access &= ~((uint64_t)1 << dev);
            }
        }
        if (access != 0 && a->vmap->access == 0
            && mprotect((void *)a->base, a->size,
                        PROT_READ | PROT_WRITE) != 0) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
            break;
        }
        a->vmap->access = access;
        q += a->size;
    }
    sim_unlock();
    return rc;
}

CUresult
sim_MemGetAccess(unsigned long long *flags, const CUmemLocation *location,
                 CUdeviceptr ptr)
{
    sim_alloc *a;
    CUresult rc = CUDA_SUCCESS;

    SIM_ENTER(MemGetAccess);
    if (flags == NULL || location == NULL
        || location->type != CU_MEM_LOCATION_TYPE_DEVICE) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!sim_dev_ok(location->id)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    sim_lock();
    a = sim_alloc_find((uintptr_t)ptr);
    if (a == NULL || a->kind != SIM_MEM_VMM) {
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    else {
        *flags = (a->vmap->access >> location->id) & 1
                 ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                 : CU_MEM_ACCESS_FLAGS_PROT_NONE;
    }
    sim_unlock();
    return rc;
}

/* ------------------------------------------------------------------ */
/* Sharing with other processes                                        */
/* ------------------------------------------------------------------ */

CUresult
sim_MemExportToShareableHandle(void *shareableHandle,
                               CUmemGenericAllocationHandle handle,
                               CUmemAllocationHandleType handleType,
                               unsigned long long flags)
{
    sim_vphys *p;
    CUresult rc = CUDA_SUCCESS;
    int fd;

    SIM_ENTER(MemExportToShareableHandle);
    if (shareableHandle == NULL || flags != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (handleType == CU_MEM_HANDLE_TYPE_FABRIC) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    p = sim_vphys_find(handle);
    if (p == NULL
        || !(p->prop.requestedHandleTypes
             & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
        /* Not made exportable: the driver refuses too. */
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    else if ((fd = fcntl(p->fd, F_DUPFD_CLOEXEC, 0)) < 0) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    else {
        /* The caller owns the descriptor and closes it. */
        *(int *)shareableHandle = fd;
    }
    sim_unlock();
    return rc;
}

/* The device of the simulator memfd fd names, or -1 if it is not one. */
static int
sim_vmm_fd_dev(int fd)
{
    char path[64];
    char target[256];
    const char *want = "/memfd:" SIM_VMM_NAME;
    ssize_t n;
    int dev = -1;
    char *end;
    long v;

    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    n = readlink(path, target, sizeof(target) - 1);
    if (n <= 0) {
        return -1;
    }
    target[n] = '\0';
    if (strncmp(target, want, strlen(want)) != 0) {
        return -1;
    }
    errno = 0;
    v = strtol(target + strlen(want), &end, 10);
    if (errno == 0 && end != target + strlen(want) && v >= 0
        && v < SIM_MAX_DEVICES && (*end == '\0' || *end == ' ')) {
        dev = (int)v;
    }
    return dev;
}

CUresult
sim_MemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                 void *osHandle,
                                 CUmemAllocationHandleType shHandleType)
{
    CUmemAllocationProp prop;
    struct stat st;
    sim_vphys *p;
    CUresult rc = CUDA_SUCCESS;
    int fd = (int)(intptr_t)osHandle;
    int dev;
    int mine;

    SIM_ENTER(MemImportFromShareableHandle);
    if (handle == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (shHandleType == CU_MEM_HANDLE_TYPE_FABRIC) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        || (intptr_t)osHandle < 0 || (intptr_t)osHandle > INT32_MAX
        || fstat(fd, &st) != 0 || st.st_size <= 0
        || !sim_vmm_aligned((uintptr_t)st.st_size)
        || (dev = sim_vmm_fd_dev(fd)) < 0) {
        /* Not a descriptor of simulator VMM memory. */
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!sim_dev_ok(dev)) {
        /* Memory of a device this process does not have. */
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    /* Its own descriptor: the caller keeps (and closes) the one given. */
    mine = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (mine < 0) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    sim_lock();
    /* The exporter holds the charge; an import adds none. */
    p = sim_vphys_new(mine, (size_t)st.st_size, &prop, 0);
    if (p == NULL) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    else {
        *handle = (CUmemGenericAllocationHandle)p->id;
    }
    sim_unlock();
    return rc;
}
