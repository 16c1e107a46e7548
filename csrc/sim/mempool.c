/* SPDX-License-Identifier: MIT */
/*
 * sim/mempool.c: the simulator's stream-ordered allocation: memory pools,
 * shareable ones (memory kept in a memfd) and their entry points, and
 * pool memory given back while work may be queued (sim.graves).  The
 * pools' memory itself (heap, or a shareable pool's memfd ranges) is
 * made and given back by sim/poolmem.c.
 *
 * A pool's access (cuMemPoolSetAccess) is kept per device: a kernel of a
 * device without it refuses the pool's memory (sim_range_kernel), as a
 * GPU would fault; cuCtxEnablePeerAccess plays no part.  Copies are not
 * checked against it: the driver is not documented to refuse them.
 *
 * Locks and the GIL: every entry point takes sim.lock after SIM_ENTER and
 * gives it back before returning (cuMemPoolGetAttribute takes it twice in
 * turn: for the capture rule, then for the pool); the helpers run with it
 * held.  No other lock, and nothing here waits: memory that queued work may
 * still touch goes to sim.graves instead.  The GIL is never taken nor given
 * up here.
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

#define SIM_POOL_PTR_MAGIC 0x52545050u   /* "PPTR" */

/* The header at offset 0 of a shareable pool's memfd. */
typedef struct {
    uint32_t magic;         /* SIM_POOL_MAGIC */
    int32_t dev;            /* the pool's device ordinal */
    uint64_t nonce;         /* the making process's sim_ipc_nonce */
    uint64_t id;            /* the pool's number there */
} sim_pool_hdr;

/* What a CUmemPoolPtrExportData holds (the rest of its bytes are 0). */
typedef struct {
    uint32_t magic;         /* SIM_POOL_PTR_MAGIC */
    int32_t dev;            /* the pool's device ordinal */
    uint64_t nonce;         /* the pool's identity: nonce */
    uint64_t id;            /* and number */
    uint64_t off;           /* the allocation's data offset */
    uint64_t size;          /* its size */
    uint64_t span;          /* bytes mapped: whole pages */
    uint64_t serial;        /* its buffer id, as the words record it */
} sim_pool_ptr;

_Static_assert(sizeof(sim_pool_ptr) <= sizeof(CUmemPoolPtrExportData),
               "the export must fit in a CUmemPoolPtrExportData");

/* The memfd name of a shareable pool. */
static void
sim_pool_name(char *buf, size_t n, uint64_t nonce, uint64_t id)
{
    snprintf(buf, n, "cudamem-sim-pool-%016llx-%llu",
             (unsigned long long)nonce, (unsigned long long)id);
}

/* ------------------------------------------------------------------ */
/* Memory pools: memory given back while work may be queued         */
/* ------------------------------------------------------------------ */

/* Whether any stream of any context still has work numbered <= g. */
int
sim_busy_upto(uint64_t g)
{
    const sim_ctx *o;
    int d;

    for (d = 0; d < sim.ndev; d++) {
        o = sim.dev[d].primary;
        if (o != NULL && sim_ctx_busy(o, g)) {
            return 1;
        }
    }
    for (o = sim.dead; o != NULL; o = o->next_dead) {
        if (sim_ctx_busy(o, g)) {
            return 1;
        }
    }
    return 0;
}

/* Free the host memory of given-back chunks that no queued work can
 * touch any more. */
void
sim_graves_sweep(void)
{
    sim_grave **pp = &sim.graves;
    sim_grave *gr;

    while ((gr = *pp) != NULL) {
        if (!sim_busy_upto(gr->g)) {
            *pp = gr->next;
            if (gr->span != 0) {
                munmap(gr->mem, gr->span);
            }
            else {
                free(gr->mem);
            }
            free(gr);
        }
        else {
            pp = &gr->next;
        }
    }
}

/* ------------------------------------------------------------------ */
/* Stream-ordered allocation: the memory pools                         */
/* ------------------------------------------------------------------ */

/* Give a cached chunk's memory back to the device.  Queued work that
 * still names it (a user bug, as on the driver) keeps the host memory
 * alive until it has run, so the simulator itself never faults. */
static void
sim_chunk_release(sim_mempool *mp, sim_chunk *ck)
{
    sim_alloc *a = ck->a;
    sim_grave *gr = malloc(sizeof(*gr));

    sim.dev[a->ctx->dev].used -= a->charged;
    mp->reserved -= a->charged;
    if (a->span != 0) {
        sim_pool_mem_unshare(mp, a);
    }
    if (gr == NULL || !sim_busy_upto(sim.gseq)) {
        /* Nothing is queued (or no memory to wait): free at once.  With
         * no grave the wait is skipped; only buggy work could notice. */
        free(gr);
        sim_pool_mem_unmap((void *)a->base, a->span);
    }
    else {
        gr->mem = (void *)a->base;
        gr->span = a->span;
        gr->g = sim.gseq;
        gr->next = sim.graves;
        sim.graves = gr;
    }
    if (ck->stream != NULL) {
        sim_stream_unref(ck->stream);
    }
    free(a);
    free(ck);
}

/* Whether a cached chunk's free has run on its stream. */
static int
sim_chunk_done(const sim_chunk *ck)
{
    return ck->stream == NULL || ck->stream->completed >= ck->ticket;
}

/* Release cached chunks whose free has run until at most keep bytes are
 * reserved (cuMemPoolTrimTo, and the release threshold at a
 * synchronisation). */
static void
sim_mempool_trim(sim_mempool *mp, uint64_t keep)
{
    sim_chunk **pp = &mp->cached;
    sim_chunk *ck;

    while (mp->reserved > keep && (ck = *pp) != NULL) {
        if (sim_chunk_done(ck)) {
            *pp = ck->next;
            sim_chunk_release(mp, ck);
        }
        else {
            pp = &ck->next;
        }
    }
    sim_graves_sweep();
}

/* After a synchronising call: every pool keeps at most its release
 * threshold, as the driver releases memory at synchronisation; a
 * destroyed pool keeps nothing, and goes once empty. */
void
sim_mempools_settle(void)
{
    sim_mempool *mp;
    sim_mempool *next;
    int d;

    for (d = 0; d < sim.ndev; d++) {
        if (sim.dev[d].pool.reserved > sim.dev[d].pool.threshold) {
            sim_mempool_trim(&sim.dev[d].pool, sim.dev[d].pool.threshold);
        }
    }
    for (mp = sim.pools; mp != NULL; mp = next) {
        next = mp->next;
        if (mp->destroyed || mp->reserved > mp->threshold) {
            sim_mempool_trim(mp, mp->destroyed ? 0 : mp->threshold);
        }
        sim_mempool_reap(mp);
    }
}

/* Drop every cached chunk of pool mp made in context c. */
static void
sim_mempool_drop_chunks(sim_mempool *mp, const sim_ctx *c)
{
    sim_chunk **pp = &mp->cached;
    sim_chunk *ck;

    while ((ck = *pp) != NULL) {
        if (ck->a->ctx == c) {
            *pp = ck->next;
            sim_chunk_release(mp, ck);
        }
        else {
            pp = &ck->next;
        }
    }
}

/* Drop every cached chunk of dev's pools made in context c (being
 * destroyed, after draining). */
void
sim_mempool_drop_ctx(int dev, const sim_ctx *c)
{
    sim_mempool *mp;
    sim_mempool *next;

    sim_mempool_drop_chunks(&sim.dev[dev].pool, c);
    for (mp = sim.pools; mp != NULL; mp = next) {
        next = mp->next;
        if (mp->dev == dev) {
            sim_mempool_drop_chunks(mp, c);
            sim_mempool_reap(mp);
        }
    }
    sim_graves_sweep();
}

/* A descriptor of the caller's own for the memfd fd, as the driver
 * gives one; in *out. */
static CUresult
sim_pool_fd_dup(int fd, int *out)
{
    *out = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (*out < 0) {
        return errno == EMFILE || errno == ENFILE
               ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_OPERATING_SYSTEM;
    }
    return CUDA_SUCCESS;
}

/* A new pool made or imported: its own device has access to it; linked
 * in, its handle in *out.  Lock held. */
static void
sim_mempool_link(sim_mempool *mp, CUmemoryPool *out)
{
    mp->access = (uint64_t)1 << mp->dev;
    mp->next = sim.pools;
    sim.pools = mp;
    *out = (CUmemoryPool)(void *)mp;
}

/* The live pool a handle names; NULL for a NULL handle.  Any other
 * handle that is not a live pool would crash the driver, which reads the
 * object it points at. */
static sim_mempool *
sim_mempool_get(CUmemoryPool h)
{
    sim_mempool *mp;
    int d;

    if (h == NULL) {
        return NULL;
    }
    for (d = 0; d < sim.ndev; d++) {
        if ((void *)h == (void *)&sim.dev[d].pool) {
            return &sim.dev[d].pool;
        }
    }
    for (mp = sim.pools; mp != NULL; mp = mp->next) {
        if ((void *)h == (void *)mp && !mp->destroyed) {
            return mp;
        }
    }
    sim_fatal("memory pool handle %p is not a live pool: the driver would "
              "crash here", (void *)h);
}

CUresult
sim_DeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
    SIM_ENTER(DeviceGetDefaultMemPool);
    if (pool_out == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!sim_dev_ok(dev)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    *pool_out = (CUmemoryPool)(void *)&sim.dev[dev].pool;
    return CUDA_SUCCESS;
}

/* Set one attribute of pool mp from value.  Lock held. */
static CUresult
sim_mempool_attr_set(sim_mempool *mp, CUmemPool_attribute attr,
                     const void *value)
{
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        mp->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES]
            = *(const int *)value != 0;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        mp->threshold = *(const cuuint64_t *)value;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        /* Only a reset to the current value is allowed. */
        if (*(const cuuint64_t *)value != 0) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) {
            mp->reserved_high = mp->reserved;
        }
        else {
            mp->used_high = mp->used;
        }
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

/* Read one attribute of pool mp into value.  Lock held. */
static CUresult
sim_mempool_attr_get(const sim_mempool *mp, CUmemPool_attribute attr,
                     void *value)
{
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        *(int *)value = mp->reuse[
            attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES];
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        *(cuuint64_t *)value = mp->threshold;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
        *(cuuint64_t *)value = mp->reserved;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        *(cuuint64_t *)value = mp->reserved_high;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
        *(cuuint64_t *)value = mp->used;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        *(cuuint64_t *)value = mp->used_high;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

/* cuMemPoolSetAttribute (set) and cuMemPoolGetAttribute. */
static CUresult
sim_mempool_attr(CUmemoryPool pool, CUmemPool_attribute attr, void *value,
                 int set)
{
    sim_mempool *mp;
    CUresult rc;

    if (value == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    mp = sim_mempool_get(pool);
    if (mp == NULL) {
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    else if (set) {
        rc = sim_mempool_attr_set(mp, attr, value);
    }
    else {
        rc = sim_mempool_attr_get(mp, attr, value);
    }
    sim_unlock();
    return rc;
}

CUresult
sim_MemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                        void *value)
{
    SIM_ENTER(MemPoolSetAttribute);
    return sim_mempool_attr(pool, attr, value, 1);
}

CUresult
sim_MemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                        void *value)
{
    CUresult rc;

    SIM_ENTER(MemPoolGetAttribute);
    /* Potentially unsafe during a capture, as the driver has it (an H200
     * refused it on the thread capturing in global mode). */
    rc = sim_capture_check_unsafe();
    if (rc != CUDA_SUCCESS) {
        return rc;
    }
    return sim_mempool_attr(pool, attr, value, 0);
}

CUresult
sim_MemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    sim_mempool *mp;
    CUresult rc = CUDA_SUCCESS;

    SIM_ENTER(MemPoolTrimTo);
    sim_lock();
    mp = sim_mempool_get(pool);
    if (mp == NULL) {
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    else {
        sim_mempool_trim(mp, minBytesToKeep);
    }
    sim_unlock();
    return rc;
}

/* The best cached chunk of mp for charged bytes on stream s: its free
 * has run, or was queued on s itself (stream order makes that safe); at
 * least charged bytes and at most twice that.  Unlinked, or NULL. */
static sim_chunk *
sim_mempool_take(sim_mempool *mp, const sim_ctx *c, size_t charged,
                 const sim_stream *s)
{
    sim_chunk **pp;
    sim_chunk **best = NULL;
    sim_chunk *ck;

    for (pp = &mp->cached; (ck = *pp) != NULL; pp = &ck->next) {
        if (ck->a->ctx != c || ck->a->charged < charged
            || ck->a->charged / 2 > charged
            || (ck->stream != s && !sim_chunk_done(ck))) {
            continue;
        }
        if (best == NULL || ck->a->charged < (*best)->a->charged) {
            best = pp;
        }
    }
    if (best == NULL) {
        return NULL;
    }
    ck = *best;
    *best = ck->next;
    return ck;
}

/* cuMemAllocAsync (pool NULL: the stream's device's default pool) and
 * cuMemAllocFromPoolAsync. */
static CUresult
sim_pool_alloc(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
               CUstream hStream)
{
    sim_stream *s;
    sim_mempool *mp;
    sim_chunk *ck;
    sim_alloc *a = NULL;
    sim_op *op;
    void *mem = NULL;
    size_t charged;
    size_t span = 0;
    uint64_t off = 0;
    size_t *used;
    CUresult rc;

    if (dptr == NULL || bytesize == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    charged = (bytesize + (SIM_GRANULE - 1)) & ~(size_t)(SIM_GRANULE - 1);
    if (charged < bytesize) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    op = sim_op_new(SIM_OP_NOP);
    if (op == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    sim_lock();
    rc = sim_stream_get(hStream, &s);
    if (rc == CUDA_SUCCESS && s->cap != NULL) {
        /* Allocation nodes of a graph: not modelled. */
        rc = CUDA_ERROR_NOT_SUPPORTED;
    }
    if (rc == CUDA_SUCCESS) {
        /* On a stream that does not capture, a potentially unsafe call
         * under the capture modes' rule (an H200 refuses it while
         * another thread captures in global mode). */
        rc = sim_capture_unsafe();
    }
    if (rc == CUDA_SUCCESS && pool != NULL) {
        mp = sim_mempool_get(pool);
        /* An imported pool cannot allocate; a pool's memory must be
         * usable from the stream's device. */
        if (mp == NULL || mp->imported
            || !(mp->access & ((uint64_t)1 << s->ctx->dev))) {
            rc = CUDA_ERROR_INVALID_VALUE;
        }
    }
    else if (rc == CUDA_SUCCESS) {
        mp = &sim.dev[s->ctx->dev].pool;
    }
    if (rc != CUDA_SUCCESS) {
        sim_op_free(op);
        sim_unlock();
        return rc;
    }
    used = &sim.dev[s->ctx->dev].used;
    sim_graves_sweep();
    ck = sim_mempool_take(mp, s->ctx, charged, s);
    if (ck != NULL) {
        a = ck->a;
        if (ck->stream != NULL) {
            sim_stream_unref(ck->stream);
        }
        free(ck);
        a->size = bytesize;
        a->dying = SIM_DYING_NO;
        if (sim_alloc_insert(a) != 0
            || (a->span != 0 && sim_pool_mark(mp, a->off, a->id) != 0)) {
            /* Give it back to the device rather than lose it. */
            sim_alloc_remove(a);
            *used -= a->charged;
            mp->reserved -= a->charged;
            sim_pool_mem_release(mp, a);
            free(a);
            a = NULL;
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    else {
        /* The pool grows; its own idle chunks make room first, as the
         * memory they hold is the pool's to reuse. */
        if (charged > sim.capacity - *used) {
            sim_mempool_trim(mp, mp->reserved > charged
                                 ? mp->reserved - charged : 0);
        }
        if (charged > sim.capacity - *used
            || (mem = sim_pool_mem_new(mp, charged, &span, &off)) == NULL) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
        else {
            rc = sim_alloc_add(s->ctx, mem, bytesize, charged,
                               SIM_MEM_ASYNC, 0);
            if (rc == CUDA_SUCCESS) {
                a = sim_alloc_find((uintptr_t)mem);
                a->pool = mp;
                a->off = off;
                a->span = span;
                mp->reserved += charged;
                if (mp->reserved > mp->reserved_high) {
                    mp->reserved_high = mp->reserved;
                }
                if (span != 0 && sim_pool_mark(mp, off, a->id) != 0) {
                    sim_alloc_remove(a);
                    mp->used += a->charged;
                    sim_alloc_release(a);
                    a = NULL;
                    rc = CUDA_ERROR_OUT_OF_MEMORY;
                }
            }
            else {
                sim_pool_mem_unmap(mem, span);
            }
        }
    }
    if (a == NULL) {
        sim_op_free(op);
        sim_unlock();
        return rc;
    }
    mp->used += a->charged;
    if (mp->used > mp->used_high) {
        mp->used_high = mp->used;
    }
    /* The allocation is a point in the stream's order. */
    rc = sim_enqueue(s, op);
    if (rc != CUDA_SUCCESS) {
        sim_alloc_remove(a);
        sim_alloc_release(a);
    }
    else {
        *dptr = (CUdeviceptr)a->base;
    }
    sim_unlock();
    return rc;
}

CUresult
sim_MemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    SIM_ENTER(MemAllocAsync);
    return sim_pool_alloc(dptr, bytesize, NULL, hStream);
}

CUresult
sim_MemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize,
                          CUmemoryPool pool, CUstream hStream)
{
    SIM_ENTER(MemAllocFromPoolAsync);
    if (pool == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    return sim_pool_alloc(dptr, bytesize, pool, hStream);
}

CUresult
sim_MemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    sim_stream *s;
    sim_mempool *mp;
    sim_chunk *ck;
    sim_alloc *a;
    sim_op *op;
    CUresult rc;

    SIM_ENTER(MemFreeAsync);
    op = sim_op_new(SIM_OP_NOP);
    ck = calloc(1, sizeof(*ck));
    if (op == NULL || ck == NULL) {
        free(op);
        free(ck);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    sim_lock();
    rc = sim_stream_get(hStream, &s);
    a = sim_alloc_find((uintptr_t)dptr);
    if (rc == CUDA_SUCCESS && s->cap != NULL) {
        /* Free nodes of a graph: not modelled. */
        rc = CUDA_ERROR_NOT_SUPPORTED;
    }
    if (rc == CUDA_SUCCESS) {
        /* As for the allocation: a potentially unsafe call. */
        rc = sim_capture_unsafe();
    }
    if (rc == CUDA_SUCCESS
        && (a == NULL || a->base != (uintptr_t)dptr
            || a->kind != SIM_MEM_ASYNC)) {
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    if (rc != CUDA_SUCCESS) {
        sim_op_free(op);
        free(ck);
        sim_unlock();
        return rc;
    }
    /* The free is a point in the stream's order: the chunk is reusable
     * on s at once and elsewhere once that point has run. */
    rc = sim_enqueue(s, op);
    if (rc != CUDA_SUCCESS) {
        free(ck);
        sim_unlock();
        return rc;
    }
    mp = a->pool;
    sim_alloc_remove(a);
    mp->used -= a->charged;
    if (a->span != 0) {
        /* Freed: an importer may no longer open it. */
        (void)sim_pool_mark(mp, a->off, 0);
    }
    ck->a = a;
    ck->stream = s;
    s->refs++;
    ck->ticket = s->submitted;
    ck->next = mp->cached;
    mp->cached = ck;
    sim_unlock();
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* Shareable memory pools: the entry points                            */
/* ------------------------------------------------------------------ */

CUresult
sim_MemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    const CUmemPoolProps *p = poolProps;
    char name[64];
    sim_pool_hdr hdr;
    sim_mempool *mp;
    size_t i;
    CUresult rc = CUDA_SUCCESS;

    SIM_ENTER(MemPoolCreate);
    if (pool == NULL || p == NULL
        || p->allocType != CU_MEM_ALLOCATION_TYPE_PINNED
        || p->win32SecurityAttributes != NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (i = 0; i < sizeof(p->reserved); i++) {
        if (p->reserved[i] != 0) {
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    if (p->location.type != CU_MEM_LOCATION_TYPE_DEVICE
        || (p->handleTypes
            & ~(unsigned int)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        || (p->handleTypes != 0 && sim.no_fd)) {
        /* Host pools, Windows or fabric handles, and descriptors under
         * CUDAMEM_SIM_NO_FD_HANDLES. */
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (!sim_dev_ok(p->location.id)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    mp = calloc(1, sizeof(*mp));
    if (mp == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    mp->dev = p->location.id;
    mp->created = 1;
    mp->handle_types = (unsigned int)p->handleTypes;
    mp->fd = -1;
    sim_lock();
    if (p->handleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
        mp->nonce = sim_nonce();
        mp->id = ++sim.next_pool_id;
        sim_pool_name(name, sizeof(name), mp->nonce, mp->id);
        memset(&hdr, 0, sizeof(hdr));
        hdr.magic = SIM_POOL_MAGIC;
        hdr.dev = mp->dev;
        hdr.nonce = mp->nonce;
        hdr.id = mp->id;
        mp->fd = memfd_create(name, MFD_CLOEXEC);
        if (mp->fd < 0
            || ftruncate(mp->fd, (off_t)SIM_POOL_DATA) != 0
            || pwrite(mp->fd, &hdr, sizeof(hdr), 0)
               != (ssize_t)sizeof(hdr)) {
            rc = errno == EMFILE || errno == ENFILE || errno == ENOMEM
                 ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_OPERATING_SYSTEM;
        }
    }
    if (rc != CUDA_SUCCESS) {
        if (mp->fd >= 0) {
            close(mp->fd);
        }
        free(mp);
    }
    else {
        sim_mempool_link(mp, pool);
    }
    sim_unlock();
    return rc;
}

CUresult
sim_MemPoolDestroy(CUmemoryPool pool)
{
    sim_mempool *mp;
    CUresult rc = CUDA_SUCCESS;

    SIM_ENTER(MemPoolDestroy);
    sim_lock();
    mp = sim_mempool_get(pool);
    if (mp == NULL || !(mp->created || mp->imported)) {
        /* Unknown, destroyed, or a device's default pool. */
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    else {
        /* What is still allocated or imported keeps it until freed. */
        mp->destroyed = 1;
        sim_mempool_trim(mp, 0);
        sim_mempool_reap(mp);
    }
    sim_unlock();
    return rc;
}

CUresult
sim_MemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map,
                     size_t count)
{
    sim_mempool *mp;
    uint64_t access;
    size_t i;
    int d;
    CUresult rc = CUDA_SUCCESS;

    SIM_ENTER(MemPoolSetAccess);
    if (map == NULL && count > 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    mp = sim_mempool_get(pool);
    if (mp == NULL) {
        rc = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    access = mp->access;
    for (i = 0; i < count; i++) {
        d = map[i].location.id;
        if (map[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE
            || (map[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE
                && map[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)) {
            rc = CUDA_ERROR_INVALID_VALUE;
            goto out;
        }
        if (!sim_dev_ok(d)) {
            rc = CUDA_ERROR_INVALID_DEVICE;
            goto out;
        }
        if (d == mp->dev) {
            /* The pool's own device keeps its access. */
            if (map[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
                rc = CUDA_ERROR_INVALID_VALUE;
                goto out;
            }
            continue;
        }
        if (sim.no_peer[d] & (1u << mp->dev)) {
            rc = CUDA_ERROR_INVALID_DEVICE;
            goto out;
        }
        if (map[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
            access |= (uint64_t)1 << d;
        }
        else {
            access &= ~((uint64_t)1 << d);
        }
    }
    mp->access = access;
out:
    sim_unlock();
    return rc;
}

CUresult
sim_MemPoolExportToShareableHandle(void *handle_out, CUmemoryPool pool,
                                   CUmemAllocationHandleType handleType,
                                   unsigned long long flags)
{
    sim_mempool *mp;
    CUresult rc = CUDA_SUCCESS;
    int fd;

    SIM_ENTER(MemPoolExportToShareableHandle);
    if (handle_out == NULL || flags != 0
        || handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    mp = sim_mempool_get(pool);
    if (mp == NULL || mp->imported
        || !(mp->handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    else {
        rc = sim_pool_fd_dup(mp->fd, &fd);
        if (rc == CUDA_SUCCESS) {
            *(int *)handle_out = fd;
        }
    }
    sim_unlock();
    return rc;
}

/* Whether fd is a shareable pool's memfd; its header in *hdr.  No lock
 * needed. */
static int
sim_pool_fd_check(int fd, sim_pool_hdr *hdr)
{
    char path[64];
    char link[128];
    char want[128];
    char name[64];
    ssize_t n;

    if (fd < 0 || pread(fd, hdr, sizeof(*hdr), 0) != (ssize_t)sizeof(*hdr)
        || hdr->magic != SIM_POOL_MAGIC) {
        return 0;
    }
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    n = readlink(path, link, sizeof(link) - 1);
    sim_pool_name(name, sizeof(name), hdr->nonce, hdr->id);
    snprintf(want, sizeof(want), "/memfd:%s (deleted)", name);
    return n >= 0 && (link[n] = '\0', strcmp(link, want) == 0);
}

CUresult
sim_MemPoolImportFromShareableHandle(CUmemoryPool *pool_out, void *handle,
                                     CUmemAllocationHandleType handleType,
                                     unsigned long long flags)
{
    sim_pool_hdr hdr;
    sim_mempool *mp;
    int fd = (int)(intptr_t)handle;
    CUresult rc = CUDA_SUCCESS;

    SIM_ENTER(MemPoolImportFromShareableHandle);
    if (pool_out == NULL || flags != 0
        || handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        || !sim_pool_fd_check(fd, &hdr)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    mp = calloc(1, sizeof(*mp));
    if (mp == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    sim_lock();
    if (hdr.nonce == sim_ipc_nonce) {
        /* This process made it. */
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    else if (!sim_dev_ok(hdr.dev)) {
        rc = CUDA_ERROR_INVALID_DEVICE;
    }
    else {
        /* The caller keeps its descriptor; the pool has its own. */
        rc = sim_pool_fd_dup(fd, &mp->fd);
    }
    if (rc != CUDA_SUCCESS) {
        free(mp);
    }
    else {
        mp->dev = hdr.dev;
        mp->imported = 1;
        mp->handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        mp->nonce = hdr.nonce;
        mp->id = hdr.id;
        sim_mempool_link(mp, pool_out);
    }
    sim_unlock();
    return rc;
}

CUresult
sim_MemPoolExportPointer(CUmemPoolPtrExportData *shareData_out,
                         CUdeviceptr ptr)
{
    sim_pool_ptr k;
    sim_alloc *a;
    CUresult rc = CUDA_SUCCESS;

    SIM_ENTER(MemPoolExportPointer);
    if (shareData_out == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    a = sim_alloc_find((uintptr_t)ptr);
    if (a == NULL || a->base != (uintptr_t)ptr || a->kind != SIM_MEM_ASYNC
        || a->span == 0) {
        /* Not the start of an allocation of a shareable pool. */
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    else {
        memset(&k, 0, sizeof(k));
        k.magic = SIM_POOL_PTR_MAGIC;
        k.dev = a->pool->dev;
        k.nonce = a->pool->nonce;
        k.id = a->pool->id;
        k.off = a->off;
        k.size = a->size;
        k.span = a->span;
        k.serial = a->id;
        memset(shareData_out, 0, sizeof(*shareData_out));
        memcpy(shareData_out->reserved, &k, sizeof(k));
    }
    sim_unlock();
    return rc;
}

CUresult
sim_MemPoolImportPointer(CUdeviceptr *ptr_out, CUmemoryPool pool,
                         CUmemPoolPtrExportData *shareData)
{
    sim_pool_ptr k;
    sim_mempool *mp;
    sim_alloc *a;
    sim_ctx *c;
    uint64_t serial = 0;
    uint64_t pg = sim_page();
    void *mem;
    CUresult rc;

    SIM_ENTER(MemPoolImportPointer);
    if (ptr_out == NULL || shareData == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    memcpy(&k, shareData->reserved, sizeof(k));
    if (k.magic != SIM_POOL_PTR_MAGIC || k.size == 0 || k.size > k.span
        || k.span > SIZE_MAX || k.span % pg != 0 || k.off % pg != 0
        || k.off > (SIM_POOL_DATA - SIM_POOL_META) / 8 * pg) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    rc = sim_current(&c);
    if (rc != CUDA_SUCCESS) {
        goto out;
    }
    mp = sim_mempool_get(pool);
    if (mp == NULL || !mp->imported || mp->nonce != k.nonce
        || mp->id != k.id || mp->dev != k.dev) {
        rc = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    /* Still the live allocation the export named? */
    if (pread(mp->fd, &serial, sizeof(serial),
              (off_t)(SIM_POOL_META + k.off / pg * 8))
            != (ssize_t)sizeof(serial)
        || serial != k.serial) {
        rc = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    mem = mmap(NULL, (size_t)k.span, PROT_READ | PROT_WRITE, MAP_SHARED,
               mp->fd, (off_t)(SIM_POOL_DATA + k.off));
    if (mem == MAP_FAILED) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    rc = sim_alloc_add(c, mem, (size_t)k.size, 0, SIM_MEM_POOL_IMPORT, 0);
    if (rc != CUDA_SUCCESS) {
        munmap(mem, (size_t)k.span);
        goto out;
    }
    a = sim_alloc_find((uintptr_t)mem);
    a->pool = mp;
    a->off = k.off;
    a->span = (size_t)k.span;
    mp->nimports++;
    *ptr_out = (CUdeviceptr)(uintptr_t)mem;
out:
    sim_unlock();
    return rc;
}
