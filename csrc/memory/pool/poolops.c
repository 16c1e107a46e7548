/* SPDX-License-Identifier: MIT */
/*
 * memory/pool/poolops.c: the pool and async managers as memory.c and
 * context.c call them, through their tables cm_mm_pool and cm_mm_async
 * (memory/memory.h): create, allocate, release, trim, export,
 * statistics; ordering a release after other streams is order.c's.
 *
 * Locks and the GIL: a pool's mutex p->mu guards its state (pool.c says
 * what).  It is taken through cm_pool_lock, which first gives up the GIL
 * while Python stream callbacks are in flight, and is never held across
 * a Python call or cuMemAlloc / cuMemFree: only pool.c's event calls and
 * the async order's cuStreamCreate / cuStreamWaitEvent run under it.  The
 * destroy takes the mapping mutex p->vmu (memory/pool/vmm/arena.c) before
 * p->mu, with the GIL given up while it waits.  The GIL guards
 * cm_pools_all and the exported descriptor, and is given up
 * (CM_DRIVER_BEGIN_NOGIL, CM_CU_NOGIL, no mutex held) around cuMemAlloc /
 * cuMemFree of segments, the async allocation, the exports and the
 * destroy's and trims' driver calls; the pool is read again under its
 * mutex after (dead: closed meanwhile).  Releases and takes also run
 * without the GIL (the queue's flush, PyTorch's lane): no Python object.
 */
#include "memory/pool/pool.h"
#include "memory/pool/graph/graph.h"
#include "memory/pool/vmm/vmm.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* State: create, destroy, free (both managers)                       */
/* ------------------------------------------------------------------ */

/* Give the async manager of ctx its pool: one of its own that other
 * processes can import (the POSIX file-descriptor handle type), where
 * the device and driver can make one; else the device's default pool,
 * with the reason in noshare.  0, or -1 with an exception. */
static int
cm_async_pool_make(cm_context *ctx, cm_pool *p)
{
    CUdevice dev = ctx->device->handle;
    CUmemPoolProps props;
    int types = 0;
    CUresult rc;

    if (cm_cu.MemPoolCreate == NULL || cm_cu.MemPoolDestroy == NULL
        || cm_cu.MemAllocFromPoolAsync == NULL
        || cm_cu.MemPoolExportToShareableHandle == NULL
        || cm_cu.MemPoolExportPointer == NULL) {
        p->noshare = "the driver lacks the entry points that make and "
                     "export memory pools";
    }
    else if (CM_CU_RAW(DeviceGetAttribute,
                       (&types,
                        CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES,
                        dev)) != CUDA_SUCCESS
             || !(types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
        p->noshare = "the device does not support POSIX file-descriptor "
                     "handles for memory pools";
    }
    if (p->noshare == NULL) {
        memset(&props, 0, sizeof(props));
        props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = (int)dev;
        rc = CM_CU_RAW(MemPoolCreate, (&p->mempool, &props));
        if (rc == CUDA_ERROR_NOT_SUPPORTED) {
            p->noshare = "the driver refused to make a memory pool with "
                         "POSIX file-descriptor handles "
                         "(CUDA_ERROR_NOT_SUPPORTED)";
        }
        else if (cm_cu_check(rc, "cuMemPoolCreate") < 0) {
            return -1;
        }
        else {
            p->shareable = 1;
            if (getrandom(&p->token, sizeof(p->token), 0)
                != (ssize_t)sizeof(p->token)) {
                p->token = (uint64_t)time(NULL)
                           ^ ((uint64_t)getpid() << 32)
                           ^ (uint64_t)(uintptr_t)p;
            }
            return 0;
        }
    }
    return CM_CU(DeviceGetDefaultMemPool, (&p->mempool, dev));
}

/* NOTE: GIL; every pool made and not yet freed. */
static cm_pool *cm_pools_all;

/* In a fork's child a pool's lists may be half relinked by a thread
 * that no longer exists, and its mutex held: every pool becomes dead
 * there (its operations return at once, nothing walks it) with a fresh
 * mutex.  Frees in the child are dropped before they reach a pool
 * (cm_forked). */
void
cm_pool_atfork_child(void)
{
    cm_pool *p;

    for (p = cm_pools_all; p != NULL; p = p->all_next) {
        pthread_mutex_init(&p->mu, NULL);
        if (p->vmm) {
            pthread_mutex_init(&p->vmu, NULL);
        }
        p->dead = 1;
    }
}

_Thread_local int cm_mm_for_peer;

/* A new pool of manager kind (CM_MM_POOL or CM_MM_ASYNC) for ctx, on the
 * list of every pool; a pool of the pool manager on virtual memory where
 * vmm allows it and CUDAMEM_POOL_VMM and the device do.  NULL with an
 * exception. */
static cm_pool *
cm_pool_new(cm_context *ctx, int kind, int vmm)
{
    cm_pool *p = calloc(1, sizeof(*p));
    int err;

    if (p == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    p->kind = kind;
    p->ctx = ctx;
    p->limit = cm_default_limit;
    p->first_stream = CM_POOL_ANY;
    p->poison = cm_pool_poison;
    if (pthread_mutex_init(&p->mu, NULL) != 0) {
        free(p);
        PyErr_NoMemory();
        return NULL;
    }
    p->export_fd = -1;
    p->untrimmed = 1;
    if (kind == CM_MM_POOL && vmm && cm_arena_setup(ctx, p) < 0) {
        pthread_mutex_destroy(&p->mu);
        free(p);
        return NULL;
    }
    if (kind == CM_MM_ASYNC) {
        cuuint64_t t = cm_async_threshold;

        err = cm_async_pool_make(ctx, p);
        if (err == 0) {
            err = CM_CU(MemPoolSetAttribute,
                        (p->mempool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &t));
        }
        if (err == 0 && p->shareable) {
            /* Reuse across streams only once the free has completed: the
             * driver would otherwise make a stream wait for another one
             * that a host callback may be holding. */
            int off = 0;

            err = CM_CU(MemPoolSetAttribute,
                        (p->mempool,
                         CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
                         &off));
        }
        if (err == 0) {
            /* Peers given access before the pool was made. */
            err = cm_async_open(p, ctx->peers_in
                                       & ~((uint64_t)1
                                           << ctx->device->id));
        }
        if (err < 0 && p->shareable) {
            (void)CM_CU_RAW(MemPoolDestroy, (p->mempool));
        }
        if (err < 0) {
            pthread_mutex_destroy(&p->mu);
            free(p);
            return NULL;
        }
    }
    p->all_next = cm_pools_all;
    if (cm_pools_all != NULL) {
        cm_pools_all->all_prev = p;
    }
    cm_pools_all = p;
    return p;
}

static void cm_pool_free_one(cm_pool *p);

/* The pool manager's state: its pool, and where that pool is on virtual
 * memory, the peers' pool beside it (cuMemAlloc'd segments: the memory
 * other libraries take through cudamem's adapters, which their own IPC
 * exports with cuIpcGetMemHandle). */
static int
cm_pool_create(cm_context *ctx)
{
    cm_pool *p = cm_pool_new(ctx, CM_MM_POOL, 1);
    cm_pool *q;

    if (p == NULL) {
        return -1;
    }
    if (p->vmm) {
        q = cm_pool_new(ctx, CM_MM_POOL, 0);
        if (q == NULL) {
            cm_pool_free_one(p);
            return -1;
        }
        p->peers = q;
        q->twin = p;
        p->twin = q;
    }
    ctx->pool = p;
    return 0;
}

static int
cm_async_create(cm_context *ctx)
{
    cm_pool *p = cm_pool_new(ctx, CM_MM_ASYNC, 0);

    if (p == NULL) {
        return -1;
    }
    ctx->pool = p;
    return 0;
}

/* The pool an allocation on this thread comes from: the peers' pool
 * while an adapter allocates for another library (cm_mm_for_peer) and
 * ctx's pool has one, else ctx's pool; *tag: what its handles carry. */
static inline cm_pool *
cm_pool_pick(cm_context *ctx, uintptr_t *tag)
{
    cm_pool *p = ctx->pool;

    if (cm_mm_for_peer && p != NULL && p->peers != NULL) {
        *tag = CM_PEER_TAG;
        return p->peers;
    }
    *tag = 0;
    return p;
}

/* Give everything pool p of ctx holds back to the driver. */
static void
cm_pool_destroy_one(cm_context *ctx, cm_pool *p)
{
    cm_seg *all;
    cm_seg *g;
    cm_blk *b;
    cm_blk *next;
    CUevent *events;
    size_t nevents;
    size_t i;
    CUmemoryPool mp;
    int pushed = 0;
    cm_gil_saved gd;

    if (p == NULL || p->dead) {
        return;
    }
    /* Refused from now on by whoever holds the GIL; the locks are taken
     * without it (their holders may wait for a driver call that waits
     * for a Python callback), and what they guard is cleared without. */
    p->dead = 1;
    gd.ts = NULL;
    gd.probe = 0;
    gd.epoch = 0;
    cm_gil_drop(&gd);
    if (p->vmm) {
        cm_mu_lock(&p->vmu);   /* no mapping in progress */
    }
    cm_mu_lock(&p->mu);
    all = p->segs;
    p->segs = NULL;
    for (g = all; g != NULL; g = g->next) {
        /* Blocks still named by a DeviceAllocation go too: releases
         * check dead (under the mutex) before they touch a block. */
        for (b = g->first; b != NULL; b = next) {
            next = b->next;
            if (b->free) {
                cm_event_put(p, b->event);
            }
            cm_blk_drop_waits(p, b);
            free(b);
        }
        g->first = NULL;
    }
    while (p->spare != NULL) {
        b = p->spare;
        p->spare = b->fnext;
        free(b);
    }
    p->nspare = 0;
    memset(&p->small, 0, sizeof(p->small));
    memset(&p->large, 0, sizeof(p->large));
    p->pending = NULL;
    p->pending_bytes = 0;
    __atomic_store_n(&p->reserved, 0, __ATOMIC_RELAXED);
    p->free_bytes = 0;
    events = p->events;
    nevents = p->nevents;
    p->events = NULL;
    p->nevents = 0;
    p->capevents = 0;
    mp = p->mempool;
    p->idle_pages = 0;
    cm_mu_unlock(&p->mu);
    if (p->vmm) {
        cm_mu_unlock(&p->vmu);
    }
    cm_gil_take(&gd);
    if (p->kind == CM_MM_ASYNC) {
        /* An allocation another thread began from the driver pool
         * before dead was set may still be in the driver (GIL released):
         * it ends before the driver pool goes. */
        cm_context_quiesce();
    }
    if (p->export_fd >= 0) {
        /* Importers can no longer take it; what they imported stays. */
        cm_fd_withdraw(p->export_fd);
        close(p->export_fd);
        p->export_fd = -1;
    }
    cm_vshare_close(p);   /* the exported pages' descriptors, likewise */
    if (!ctx->alive || cm_forked) {
        free(events);
        for (g = all; g != NULL; g = all) {
            all = g->next;
            if (g->arena != NULL) {
                (void)cm_arena_free_seg(ctx, g, 0);
            }
            else {
                free(g);
            }
        }
        return;
    }
    /* Another thread that holds an array of the pool can still queue a
     * copy or a kernel on its pages until the close marks the context
     * dead: the segments go then (cm_pool_dead). */
    p->late = all;
    CM_DRIVER_BEGIN_NOGIL
    (void)cm_ctx_enter(ctx->handle, &pushed);
    for (i = 0; i < nevents; i++) {
        (void)CM_CU_RAW(EventDestroy, (events[i]));
    }
    if (p->kind == CM_MM_ASYNC && CM_CU_RAW(CtxSynchronize, ())
                                  == CUDA_SUCCESS) {
        (void)CM_CU_RAW(MemPoolTrimTo, (mp, 0));
    }
    if (p->side != NULL) {
        (void)CM_CU_RAW(StreamDestroy, (p->side));
    }
    if (p->shareable) {
        /* Allocations still live go with the context's reset. */
        (void)CM_CU_RAW(MemPoolDestroy, (mp));
    }
    cm_ctx_leave(pushed);
    CM_DRIVER_END_NOGIL
    free(events);
}

static void
cm_pool_destroy(cm_context *ctx)
{
    cm_pool *p = ctx->pool;

    if (p != NULL && p->peers != NULL) {
        cm_pool_destroy_one(ctx, p->peers);
    }
    cm_pool_destroy_one(ctx, p);
}

/* Free the C state of pool p, off the list of every pool. */
static void
cm_pool_free_one(cm_pool *p)
{
    size_t i;

    if (p->all_prev != NULL) {
        p->all_prev->all_next = p->all_next;
    }
    else {
        cm_pools_all = p->all_next;
    }
    if (p->all_next != NULL) {
        p->all_next->all_prev = p->all_prev;
    }
    if (p->export_fd >= 0) {
        cm_fd_withdraw(p->export_fd);
        close(p->export_fd);
    }
    cm_vshare_close(p);
    for (i = 0; i < p->nevents; i++) {
        (void)CM_CU_RAW(EventDestroy, (p->events[i]));
    }
    free(p->events);
    if (p->vmm) {
        pthread_mutex_destroy(&p->vmu);
    }
    pthread_mutex_destroy(&p->mu);
    free(p);
}

static void
cm_pool_free(cm_context *ctx)
{
    cm_pool *p = ctx->pool;

    if (p == NULL) {
        return;
    }
    ctx->pool = NULL;
    if (p->peers != NULL) {
        cm_pool_free_one(p->peers);
    }
    cm_pool_free_one(p);
}

/* Grow the pool by one segment for size bytes on s and take the block;
 * GIL held on entry and exit, released around cuMemAlloc.  The segment
 * counts against the limit until cm_segs_release; when the limit has no
 * room for a shared segment, the request's own size is tried. */
static CUresult
cm_pool_grow(cm_context *ctx, cm_pool *p, size_t size, uintptr_t s,
             cm_blk **out)
{
    int small = size <= CM_POOL_SMALL_MAX;
    size_t want;
    size_t exact;
    size_t reserved;
    size_t limit;
    CUdeviceptr base = 0;
    CUresult rc;
    int relaxed;
    cm_blk *b;
    cm_gil_saved gd;

    if (p->vmm) {
        /* Every arena is full: another one, then the block from it. */
        rc = cm_arena_add(ctx, p, size, small);
        if (rc != CUDA_SUCCESS) {
            return rc;
        }
        cm_pool_lock(p, &gd);
        b = p->dead ? NULL : cm_pool_take(p, size, s);
        cm_pool_unlock(p, &gd);
        if (b == NULL) {
            return p->dead ? CUDA_ERROR_CONTEXT_IS_DESTROYED
                           : CUDA_ERROR_OUT_OF_MEMORY;
        }
        *out = b;
        return CUDA_SUCCESS;
    }
    if (small) {
        want = CM_POOL_SMALL_SEG;
        exact = want;
    }
    else {
        exact = cm_round(size, CM_POOL_LARGE_ROUND);
        want = size < CM_POOL_LARGE_OWN ? CM_POOL_LARGE_SEG : exact;
    }
    cm_pool_lock(p, &gd);
    reserved = cm_pool_held(p);
    limit = p->limit;
    cm_pool_unlock(p, &gd);
    if (limit != 0 && want > limit - (reserved < limit ? reserved : limit)) {
        want = exact;
        if (want > limit - (reserved < limit ? reserved : limit)) {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    if (!cm_limit_take(ctx, want)) {
        if (want == exact || !cm_limit_take(ctx, exact)) {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        want = exact;
    }
    Py_INCREF(ctx);
    CM_DRIVER_BEGIN_NOGIL
    cm_capture_relax(&relaxed);
    rc = CM_CU_RAW(MemAlloc, (&base, want));
    if (rc == CUDA_ERROR_OUT_OF_MEMORY && want != exact) {
        cm_limit_give(ctx, want - exact);
        want = exact;
        rc = CM_CU_RAW(MemAlloc, (&base, want));
    }
    cm_capture_unrelax(relaxed);
    CM_DRIVER_END_NOGIL
    if (rc != CUDA_SUCCESS) {
        cm_limit_give(ctx, want);
        Py_DECREF(ctx);
        return rc;
    }
    cm_pool_lock(p, &gd);
    if (p->dead) {
        /* Closed meanwhile: the context's reset took the memory. */
        cm_pool_unlock(p, &gd);
        cm_limit_give(ctx, want);
        Py_DECREF(ctx);
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    }
    b = cm_pool_add_seg(p, base, want, small, size, s);
    cm_pool_unlock(p, &gd);
    Py_DECREF(ctx);
    if (b == NULL) {
        CM_DRIVER_BEGIN_NOGIL
        (void)CM_CU_RAW(MemFree, (base));
        CM_DRIVER_END_NOGIL
        cm_limit_give(ctx, want);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = b;
    return CUDA_SUCCESS;
}


/* ------------------------------------------------------------------ */
/* Allocation and release                                              */
/* ------------------------------------------------------------------ */

/* The async manager's allocation: the driver's pool, on stream; the
 * handle its release takes is the address.  The bytes count against the
 * limit until their cuMemFreeAsync is issued (what the driver's pool
 * then caches was counted when allocated, and serves the next ones). */
static CUresult
cm_async_alloc(cm_context *ctx, size_t size, CUstream stream,
               CUdeviceptr *ptr, uintptr_t *handle)
{
    cm_pool *p = ctx->pool;
    cm_gpool *gp = cm_gpool_for(ctx, stream);
    CUresult rc;
    int relaxed;

    if (gp != NULL) {
        /* Captured: the graph's own memory (memory/pool/graph/gpool.c). */
        return cm_gpool_alloc(ctx, gp, size, stream, ptr, handle);
    }
    if (p == NULL || p->dead) {
        /* Destroyed by a close on another thread (dead is set with the
         * GIL held, as here): its driver pool is gone. */
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    }
    if (p->limit != 0 && size > p->limit - (ctx->st_bytes < p->limit
                                            ? ctx->st_bytes
                                            : p->limit)) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (!cm_limit_take(ctx, size)) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CM_DRIVER_BEGIN_NOGIL
    cm_capture_relax(&relaxed);
    if (p->shareable) {
        rc = CM_CU_RAW(MemAllocFromPoolAsync,
                       (ptr, size, p->mempool, stream));
    }
    else {
        rc = CM_CU_RAW(MemAllocAsync, (ptr, size, stream));
    }
    if (rc == CUDA_SUCCESS && p->poison >= 0) {
        rc = CM_CU_RAW(MemsetD8Async, (*ptr, (unsigned char)p->poison,
                                       size, stream));
        if (rc != CUDA_SUCCESS) {
            (void)CM_CU_RAW(MemFreeAsync, (*ptr, stream));
        }
    }
    cm_capture_unrelax(relaxed);
    CM_DRIVER_END_NOGIL
    if (rc != CUDA_SUCCESS) {
        cm_limit_give(ctx, size);
        __atomic_store_n(&p->untrimmed, 1, __ATOMIC_RELAXED);
    }
    *handle = (uintptr_t)*ptr;
    return rc;
}

/* A free block of at least size bytes (rounded) for stream key s, in
 * use, settling the pending blocks once if none fits; NULL if still
 * none (mutex held). */
static cm_blk *
cm_pool_take_for(cm_pool *p, size_t size, uintptr_t s)
{
    cm_blk *b;

    if (p->first_stream == CM_POOL_ANY) {
        p->first_stream = s;
    }
    else if (p->first_stream != s) {
        p->multi_stream = 1;
    }
    b = cm_pool_take(p, size, s);
    if (b == NULL) {
        cm_pool_settle(p);
        b = cm_pool_take(p, size, s);
    }
    return b;
}

/* Fill n bytes at ptr, a block b just taken, with the pool's poison
 * byte on stream; on failure the block goes back to the pool. */
static CUresult
cm_pool_poison_fill(cm_pool *p, cm_blk *b, CUdeviceptr ptr, size_t n,
                    CUstream stream)
{
    CUresult rc;
    cm_gil_saved gd;

    rc = CM_CU_RAW(MemsetD8Async, (ptr, (unsigned char)p->poison, n,
                                   stream));
    if (rc != CUDA_SUCCESS) {
        cm_pool_lock(p, &gd);
        if (!p->dead) {
            cm_pool_put(p, b);
        }
        cm_pool_unlock(p, &gd);
    }
    return rc;
}

/* The poison fill of a block b just taken from p, the GIL released
 * around it; CUDA_SUCCESS at once when p has no poison byte. */
static CUresult
cm_pool_poison_nogil(cm_pool *p, cm_blk *b, CUdeviceptr ptr, size_t n,
                     CUstream stream)
{
    CUresult rc;

    if (p->poison < 0) {
        return CUDA_SUCCESS;
    }
    CM_DRIVER_BEGIN_NOGIL
    rc = cm_pool_poison_fill(p, b, ptr, n, stream);
    CM_DRIVER_END_NOGIL
    return rc;
}

/* A free block of the peers' pool of p (the pool on virtual memory),
 * for a request p could not map memory for: the bytes free in the
 * peers' segments serve it rather than an out-of-memory error.  No new
 * segment is made.  CUDA_ERROR_OUT_OF_MEMORY when none fits.  The other
 * way round is not taken: the peers' pool serves memory that other
 * libraries export with cuIpcGetMemHandle, which pages refuse. */
static CUresult
cm_pool_borrow_peers(cm_pool *p, size_t size, uintptr_t s,
                     CUstream stream, CUdeviceptr *ptr, uintptr_t *handle)
{
    cm_pool *q = p->peers;
    cm_blk *b = NULL;
    CUdeviceptr at = 0;
    size_t n = 0;
    cm_gil_saved gd;

    if (q == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    cm_pool_lock(q, &gd);
    if (!q->dead) {
        b = cm_pool_take_for(q, size, s);
    }
    if (b != NULL) {
        at = b->ptr;
        n = b->size;
        q->borrowed++;
    }
    cm_pool_unlock(q, &gd);
    if (b == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *ptr = at;
    *handle = (uintptr_t)b | CM_PEER_TAG;
    return cm_pool_poison_nogil(q, b, at, n, stream);
}

/* Whether p, on virtual memory, cannot back a block of size bytes at
 * all (cm_arena_cannot_serve), counting the pages of the pending blocks
 * whose work is done, which settling makes idle (mutex held): asked
 * before a block is cut, so that a refusal walks no pages. */
static int
cm_pool_out_of_reach(cm_context *ctx, cm_pool *p, size_t size)
{
    if (!p->vmm || !cm_arena_cannot_serve(ctx, p, size)) {
        return 0;
    }
    if (p->pending == NULL) {
        return 1;
    }
    cm_pool_settle(p);
    return cm_arena_cannot_serve(ctx, p, size);
}

/* The pool manager's allocation: a block for stream from the bins, or
 * from a new segment; the handle its release takes is the block. */
static CUresult
cm_pool_alloc(cm_context *ctx, size_t size, CUstream stream,
              CUdeviceptr *ptr, uintptr_t *handle)
{
    uintptr_t tag;
    cm_pool *p = cm_pool_pick(ctx, &tag);
    uintptr_t s = cm_stream_key(stream);
    cm_blk *b;
    CUdeviceptr at = 0;
    size_t n = 0;
    CUresult rc;
    int backed;
    cm_gpool *gp = cm_gpool_for(ctx, stream);
    cm_gil_saved gd;

    if (gp != NULL) {
        /* Captured: the graph's own memory (memory/pool/graph/gpool.c). */
        return cm_gpool_alloc(ctx, gp, size, stream, ptr, handle);
    }
    size = cm_round(size, CM_POOL_ROUND);
    if (size == 0) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    cm_pool_lock(p, &gd);
    if (cm_pool_out_of_reach(ctx, p, size)) {
        cm_pool_unlock(p, &gd);
        return cm_pool_borrow_peers(p, size, s, stream, ptr, handle);
    }
    b = cm_pool_take_for(p, size, s);
    backed = b == NULL || !b->unbacked;
    if (b != NULL) {
        at = b->ptr;
        n = b->size;
    }
    cm_pool_unlock(p, &gd);
    if (b == NULL) {
        rc = cm_pool_grow(ctx, p, size, s, &b);
        if (rc != CUDA_SUCCESS) {
            return rc == CUDA_ERROR_OUT_OF_MEMORY
                       ? cm_pool_borrow_peers(p, size, s, stream, ptr,
                                              handle)
                       : rc;
        }
        backed = 0;
    }
    if (!backed) {
        /* Pages to map (or a block of a new segment).  Whatever happened
         * meanwhile, the block is read again under the mutex: a close of
         * the context on another thread, while this one waited for the
         * GIL, may have freed it with the pool. */
        rc = CUDA_SUCCESS;
        cm_pool_lock(p, &gd);
        if (!p->dead && b->unbacked) {
            cm_pool_unlock(p, &gd);
            rc = cm_arena_back(ctx, p, b);
            cm_pool_lock(p, &gd);
        }
        if (p->dead) {
            cm_pool_unlock(p, &gd);
            return CUDA_ERROR_CONTEXT_IS_DESTROYED;
        }
        if (rc != CUDA_SUCCESS) {
            cm_pool_put(p, b);
            cm_pool_unlock(p, &gd);
            return rc == CUDA_ERROR_OUT_OF_MEMORY
                       ? cm_pool_borrow_peers(p, size, s, stream, ptr,
                                              handle)
                       : rc;
        }
        b->unbacked = 0;
        at = b->ptr;
        n = b->size;
        cm_pool_unlock(p, &gd);
    }
    *ptr = at;
    *handle = (uintptr_t)b | tag;
    if (p->vmm && __atomic_load_n(&p->release_due, __ATOMIC_RELAXED)
        && !cm_capture_restricted()) {
        /* A pass may be due (the idle memory stays past a failure). */
        (void)cm_arena_release(ctx, p, p->keep, 0);
    }
    return cm_pool_poison_nogil(p, b, at, n, stream);
}

/* The pool manager's take: a block from the bins only.  The block's
 * address and size are read under the mutex: once it is given back, a
 * close of the context on another thread may free the block. */
static CUresult
cm_pool_take_only(cm_context *ctx, size_t size, CUstream stream,
                  CUdeviceptr *ptr, uintptr_t *handle)
{
    uintptr_t tag;
    cm_pool *p = cm_pool_pick(ctx, &tag);
    uintptr_t s = cm_stream_key(stream);
    CUdeviceptr at = 0;
    size_t n = 0;
    cm_blk *b;
    cm_gil_saved gd;

    size = cm_round(size, CM_POOL_ROUND);
    if (size == 0) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (p == NULL) {
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    }
    if (cm_gpool_for(ctx, stream) != NULL) {
        /* Captured: for the allocation path, which knows graph pools. */
        return CUDA_ERROR_NOT_READY;
    }
    cm_pool_lock(p, &gd);
    if (p->dead) {
        cm_pool_unlock(p, &gd);
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    }
    b = cm_pool_take_for(p, size, s);
    if (b != NULL && b->unbacked) {
        /* Its memory is not mapped yet: for the allocation path. */
        cm_pool_put(p, b);
        b = NULL;
    }
    if (b != NULL) {
        at = b->ptr;
        n = b->size;
    }
    cm_pool_unlock(p, &gd);
    if (b == NULL) {
        return CUDA_ERROR_NOT_READY;
    }
    *ptr = at;
    *handle = (uintptr_t)b | tag;
    return p->poison >= 0 ? cm_pool_poison_fill(p, b, at, n, stream)
                          : CUDA_SUCCESS;
}

/* The async manager's release (CM_REL_ASYNC, or CM_REL_ASYNC_SYNC:
 * after the context, on the default stream, or CM_REL_ASYNC_AFTER: after
 * stream too, on the side stream): cuMemFreeAsync. */
static CUresult
cm_async_release(cm_context *ctx, int kind, uintptr_t handle, size_t size,
                 CUstream stream)
{
    cm_pool *p = ctx->pool;
    CUresult rc;
    CUevent e;
    int relaxed;
    cm_gil_saved gd;

    if (cm_gpool_handle(handle)) {
        return cm_gpool_release(ctx, handle, kind == CM_REL_ASYNC_SYNC);
    }
    if (p == NULL || p->dead) {
        return CUDA_SUCCESS;
    }
    if (kind == CM_REL_ASYNC_AFTER) {
        /* The side stream waited at the order for the other streams
         * that used it; stream captured then.  Once it no longer does,
         * the side stream waits for it too, and frees. */
        if (cm_pool_stream_in_capture(stream)) {
            return CUDA_ERROR_NOT_READY;
        }
        cm_pool_lock(p, &gd);
        e = p->dead || p->side == NULL ? NULL : cm_event_on(p, stream);
        rc = e == NULL ? CUDA_ERROR_INVALID_HANDLE
                       : CM_CU_RAW(StreamWaitEvent, (p->side, e, 0));
        cm_event_put(p, e);
        stream = p->side;
        cm_pool_unlock(p, &gd);
        if (rc != CUDA_SUCCESS) {
            /* Nothing orders the free after that stream: after the
             * context then. */
            kind = CM_REL_ASYNC_SYNC;
            stream = NULL;
        }
    }
    if (kind == CM_REL_ASYNC_SYNC) {
        /* Released where no stream could be recorded: every stream that
         * used it is done once the context is; then freed on the
         * default stream.  Not while stream (one of them that captured
         * at the order, order.c) still captures. */
        if (stream != NULL && cm_pool_stream_in_capture(stream)) {
            return CUDA_ERROR_NOT_READY;
        }
        rc = cm_pool_sync_context();
        if (rc == CUDA_ERROR_NOT_READY) {
            return rc;
        }
        if (rc != CUDA_SUCCESS) {
            cm_limit_give(ctx, size);
            return rc;
        }
        stream = NULL;
    }
    /* In the relaxed capture mode, always (two calls of a thread-local
     * setting): a capture another library began in global mode, which
     * cudamem does not know of, would make the driver refuse this free
     * and invalidate that capture.  And not while the stream itself
     * captures (one call): the free would be recorded into that graph,
     * to run at each replay; it waits in the queue instead. */
    cm_capture_relax_always(&relaxed);
    if (cm_pool_stream_in_capture(stream)) {
        cm_capture_unrelax(relaxed);
        return CUDA_ERROR_NOT_READY;
    }
    /* Uncounted whatever the driver answers: the release is not tried
     * again. */
    cm_limit_give(ctx, size);
    rc = CM_CU_RAW(MemFreeAsync, ((CUdeviceptr)handle, stream));
    cm_capture_unrelax(relaxed);
    __atomic_store_n(&p->untrimmed, 1, __ATOMIC_RELAXED);
    return rc;
}

/* The pool manager's release (CM_REL_POOL, CM_REL_POOL_SYNC: after the
 * context, free for any stream, or CM_REL_POOL_AFTER: after stream too):
 * the block back to the bins. */
static CUresult
cm_pool_release(cm_context *ctx, int kind, uintptr_t handle, size_t size,
                CUstream stream)
{
    cm_pool *p;
    cm_blk *b;
    CUresult rc;
    cm_gil_saved gd;

    (void)size;
    if (cm_gpool_handle(handle)) {
        return cm_gpool_release(ctx, handle, kind == CM_REL_POOL_SYNC);
    }
    p = cm_pool_of(ctx, handle, &b);
    if (p == NULL || p->dead) {
        return CUDA_SUCCESS;
    }
    if (kind == CM_REL_POOL_AFTER
        && cm_pool_stream_in_capture(stream)) {
        /* Its other streams' events were recorded at the order; stream
         * captured then, and still does. */
        return CUDA_ERROR_NOT_READY;
    }
    if (kind == CM_REL_POOL_SYNC) {
        /* Released where no stream could be recorded: every stream that
         * used it is done once the context is.  Not while stream (one
         * of them that captured at the order, order.c) still captures. */
        if (stream != NULL && cm_pool_stream_in_capture(stream)) {
            return CUDA_ERROR_NOT_READY;
        }
        rc = cm_pool_sync_context();
        if (rc != CUDA_SUCCESS) {
            return rc;
        }
    }
    cm_pool_lock(p, &gd);
    if (!p->dead && kind == CM_REL_POOL_AFTER) {
        cm_pool_wait_also(p, b, stream);
    }
    if (!p->dead) {
        if (kind == CM_REL_POOL_SYNC) {
            cm_blk_drop_waits(p, b);
            b->any_after = 0;
            b->stream = CM_POOL_ANY;
        }
        cm_pool_put(p, b);
    }
    cm_pool_unlock(p, &gd);
    if (p->vmm && __atomic_load_n(&p->release_due, __ATOMIC_RELAXED)
        && !cm_capture_restricted()) {
        /* Idle memory past the threshold: the quiet part goes back (not
         * while a capture forbids the unmapping: a later pass). */
        return cm_arena_release(ctx, p, p->keep, 0);
    }
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* Trim, export, statistics                                            */
/* ------------------------------------------------------------------ */

/* The async manager's trim: wait for the context, then trim the
 * driver's pool to 0; nothing when nothing was freed (and no allocation
 * failed) since the last trim, which left the pool holding only what is
 * in use. */
static int
cm_async_trim(cm_context *ctx)
{
    cm_pool *p = ctx->pool;
    CUresult rc;
    const char *fn;

    if (p == NULL || p->dead
        || !__atomic_load_n(&p->untrimmed, __ATOMIC_RELAXED)) {
        return 0;
    }
    if (cm_context_activate(ctx) < 0) {
        return -1;
    }
    /* Cleared first: a free on another thread meanwhile sets it again. */
    __atomic_store_n(&p->untrimmed, 0, __ATOMIC_RELAXED);
    CM_DRIVER_BEGIN_NOGIL
    rc = CM_CU_RAW(CtxSynchronize, ());
    if (rc == CUDA_SUCCESS) {
        rc = CM_CU_RAW(MemPoolTrimTo, (p->mempool, 0));
        fn = "cuMemPoolTrimTo";
    }
    else {
        fn = "cuCtxSynchronize";
    }
    CM_DRIVER_END_NOGIL
    if (rc != CUDA_SUCCESS) {
        __atomic_store_n(&p->untrimmed, 1, __ATOMIC_RELAXED);
    }
    return cm_cu_check(rc, fn);
}

/* The pool manager's trim: every wholly free segment back to the
 * driver (after the device, when blocks wait for other streams). */
static int
cm_pool_trim_one(cm_context *ctx, cm_pool *p)
{
    cm_gil_saved gd;
    cm_seg *segs = NULL;
    CUresult rc = CUDA_SUCCESS;
    const char *fn = "cuMemFree";
    size_t idle;

    if (p == NULL || p->dead || cm_context_activate(ctx) < 0) {
        return p == NULL || p->dead ? 0 : -1;
    }
    if (p->pending != NULL) {
        /* Blocks that wait for other streams: their segments may be
         * wholly free once the device is idle. */
        CM_DRIVER_BEGIN_NOGIL
        rc = CM_CU_RAW(CtxSynchronize, ());
        CM_DRIVER_END_NOGIL
        if (rc != CUDA_SUCCESS) {
            return cm_cu_check(rc, "cuCtxSynchronize");
        }
    }
    cm_pool_lock(p, &gd);
    if (p->pending != NULL) {
        cm_pool_settle(p);
    }
    cm_pool_collect_free_segs(p, &segs);
    idle = p->vmm ? p->idle_pages : 0;
    cm_pool_unlock(p, &gd);
    if (segs != NULL) {
        CM_DRIVER_BEGIN_NOGIL
        rc = cm_segs_release(ctx, segs);
        CM_DRIVER_END_NOGIL
    }
    if (rc == CUDA_SUCCESS && idle > 0) {
        /* Every idle page back: once the context is idle all are quiet. */
        CM_DRIVER_BEGIN_NOGIL
        rc = CM_CU_RAW(CtxSynchronize, ());
        CM_DRIVER_END_NOGIL
        if (rc != CUDA_SUCCESS) {
            return cm_cu_check(rc, "cuCtxSynchronize");
        }
        rc = cm_arena_release(ctx, p, 0, 1);
        fn = "cuMemUnmap";
    }
    return cm_cu_check(rc, fn);
}

static int
cm_pool_trim(cm_context *ctx)
{
    cm_pool *p = ctx->pool;

    if (p != NULL && p->peers != NULL && cm_pool_trim_one(ctx, p->peers) < 0) {
        return -1;
    }
    return cm_pool_trim_one(ctx, p);
}

static const char *
cm_pool_alloc_fn(cm_context *ctx)
{
    (void)ctx;
    return "cuMemAlloc (pool)";
}

/* "cuMemAllocFromPoolAsync" from a shareable pool of its own. */
static const char *
cm_async_alloc_fn(cm_context *ctx)
{
    cm_pool *p = ctx->pool;

    return p != NULL && p->shareable ? "cuMemAllocFromPoolAsync"
                                     : "cuMemAllocAsync";
}

/* The async manager's owns: the driver names the allocation's pool. */
static int
cm_async_owns(cm_context *ctx, CUdeviceptr base)
{
    cm_pool *p = ctx->pool;
    CUmemoryPool mp = NULL;

    if (p == NULL || p->dead) {
        return 0;
    }
    if (CM_CU(PointerGetAttribute,
              (&mp, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, base)) < 0) {
        return -1;
    }
    return mp != NULL && mp == p->mempool;
}

/* The async manager's export: the pool's shareable handle. */
static int
cm_async_export(cm_context *ctx, CUdeviceptr base,
                CUmemPoolPtrExportData *data, int *fd, uint64_t *token)
{
    cm_pool *p = ctx->pool;
    int got = -1;
    int err;

    if (p == NULL || p->dead) {
        PyErr_SetString(PyExc_ValueError,
                        "the context's async memory pool is closed");
        return -1;
    }
    if (!p->shareable) {
        return cm_raise_api_msg(
            CUDA_ERROR_NOT_SUPPORTED,
            PyUnicode_FromFormat(
                "cannot export memory of the async memory manager through "
                "IPC: its memory pool on device %d cannot be shared (%s)",
                ctx->device->id, p->noshare));
    }
    if (p->export_fd < 0) {
        CM_CU_NOGIL(err, MemPoolExportToShareableHandle,
                    (&got, p->mempool,
                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        if (err < 0) {
            return -1;
        }
        if (p->export_fd >= 0 || p->dead) {
            /* Another thread exported meanwhile, or the context closed. */
            close(got);
        }
        else {
            p->export_fd = got;
            /* Also over this process's socket, where an importer may
             * not take it with pidfd_getfd (memory/fdserve.c). */
            (void)cm_fd_offer(got, p->token);
        }
        if (p->dead) {
            PyErr_SetString(PyExc_ValueError,
                            "the context's async memory pool is closed");
            return -1;
        }
    }
    memset(data, 0, sizeof(*data));
    CM_CU_NOGIL(err, MemPoolExportPointer, (data, base));
    if (err < 0) {
        return -1;
    }
    *fd = p->export_fd;
    *token = p->token;
    return 0;
}

/* The largest free block of a bin set (mutex held). */
static size_t
cm_bins_largest(const cm_bins *bs)
{
    int w;
    int i;
    size_t best = 0;
    const cm_blk *b;

    for (w = CM_POOL_NWORDS - 1; w >= 0; w--) {
        if (bs->used[w] != 0) {
            i = w * 64 + 63 - __builtin_clzll(bs->used[w]);
            for (b = bs->head[i]; b != NULL; b = b->fnext) {
                best = b->size > best ? b->size : best;
            }
            return best;
        }
    }
    return 0;
}

/* The async manager's statistics: the driver pool's attributes; the
 * largest free block is unknown. */
static void
cm_async_stats(cm_context *ctx, size_t *reserved, size_t *free_b,
               long long *largest)
{
    cm_pool *p = ctx->pool;
    cuuint64_t r = 0;
    cuuint64_t u = 0;

    *reserved = 0;
    *free_b = 0;
    *largest = -1;
    if (p == NULL || p->dead) {
        return;
    }
    /* While a capture forbids this thread the query (it would be refused
     * and invalidate the capture): the figures as last read. */
    if (!cm_capture_restricted()
        && CM_CU_RAW(MemPoolGetAttribute,
                     (p->mempool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &r))
               == CUDA_SUCCESS
        && CM_CU_RAW(MemPoolGetAttribute,
                     (p->mempool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &u))
               == CUDA_SUCCESS) {
        __atomic_store_n(&p->astat_reserved, (size_t)r, __ATOMIC_RELAXED);
        __atomic_store_n(&p->astat_free, r > u ? (size_t)(r - u) : 0,
                         __ATOMIC_RELAXED);
    }
    *reserved = __atomic_load_n(&p->astat_reserved, __ATOMIC_RELAXED);
    *free_b = __atomic_load_n(&p->astat_free, __ATOMIC_RELAXED);
}

/* Add pool p's figures to the statistics. */
static void
cm_pool_stats_one(cm_pool *p, size_t *reserved, size_t *free_b,
                  long long *largest)
{
    size_t a;
    size_t b;
    cm_gil_saved gd;

    if (p == NULL || p->dead) {
        return;
    }
    cm_pool_lock(p, &gd);
    *reserved += p->reserved;
    if (p->vmm) {
        /* Free: mapped memory no block uses.  Any request up to the
         * idle pages' size is served by moving them, wherever they lie. */
        *free_b += p->reserved > p->arena_used
                       ? p->reserved - p->arena_used : 0;
        a = cm_arena_largest(p);
        b = 0;
    }
    else {
        *free_b += p->free_bytes;
        a = cm_bins_largest(&p->small);
        b = cm_bins_largest(&p->large);
    }
    a = a > b ? a : b;
    if ((long long)a > *largest) {
        *largest = (long long)a;
    }
    cm_pool_unlock(p, &gd);
}

/* The pool manager's statistics, its peers' pool included, largest free
 * block included (0 with no pool while it allocates; unknown while a
 * plugin does). */
static void
cm_pool_stats(cm_context *ctx, size_t *reserved, size_t *free_b,
              long long *largest)
{
    cm_pool *p = ctx->pool;

    *reserved = 0;
    *free_b = 0;
    *largest = ctx->mm == &cm_mm_pool ? 0 : -1;
    cm_pool_stats_one(p, reserved, free_b, largest);
    if (p != NULL && p->peers != NULL) {
        cm_pool_stats_one(p->peers, reserved, free_b, largest);
    }
}

/* What a trim of p gives back: on virtual memory the idle pages (the
 * free bytes within pages a block uses stay), else the free blocks. */
static size_t
cm_pool_trimmable_one(cm_pool *p)
{
    size_t n;
    cm_gil_saved gd;

    if (p == NULL || p->dead) {
        return 0;
    }
    cm_pool_lock(p, &gd);
    n = p->vmm ? p->idle_pages << p->gshift : p->free_bytes;
    cm_pool_unlock(p, &gd);
    return n;
}

static size_t
cm_pool_trimmable(cm_context *ctx)
{
    cm_pool *p = ctx->pool;

    return cm_pool_trimmable_one(p)
           + (p != NULL ? cm_pool_trimmable_one(p->peers) : 0);
}

/* ------------------------------------------------------------------ */
/* The tables                                                          */
/* ------------------------------------------------------------------ */

const cm_mm_ops cm_mm_pool = {
    .kind = CM_MM_POOL,
    .name = "pool",
    .emm_class = "PoolMemoryManager",
    .ordered = 1,
    .rel = CM_REL_POOL,
    .rel_sync = CM_REL_POOL_SYNC,
    .rel_after = CM_REL_POOL_AFTER,
    .create = cm_pool_create,
    .destroy = cm_pool_destroy,
    .dead = cm_pool_dead,
    .free = cm_pool_free,
    .alloc = cm_pool_alloc,
    .release = cm_pool_release,
    .order = cm_pool_order,
    .stream_gone = cm_pool_stream_gone,
    .foreign_free = cm_pool_foreign_free,
    .trim = cm_pool_trim,
    .stats = cm_pool_stats,
    .trimmable = cm_pool_trimmable,
    .alloc_fn = cm_pool_alloc_fn,
    .take = cm_pool_take_only,
    .peer = cm_pool_peer,
};

const cm_mm_ops cm_mm_async = {
    .kind = CM_MM_ASYNC,
    .name = "async",
    .emm_class = "AsyncMemoryManager",
    .ordered = 1,
    .rel = CM_REL_ASYNC,
    .rel_sync = CM_REL_ASYNC_SYNC,
    .rel_after = CM_REL_ASYNC_AFTER,
    .create = cm_async_create,
    .destroy = cm_pool_destroy,
    .dead = cm_pool_dead,
    .free = cm_pool_free,
    .alloc = cm_async_alloc,
    .release = cm_async_release,
    .order = cm_async_order,
    .foreign_free = cm_async_foreign_free,
    .trim = cm_async_trim,
    .stats = cm_async_stats,
    .alloc_fn = cm_async_alloc_fn,
    .owns = cm_async_owns,
    .export = cm_async_export,
    .peer = cm_async_peer,
};
