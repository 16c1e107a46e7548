/* SPDX-License-Identifier: MIT */
/*
 * memory/pool/pool.h: the public header of the room memory/pool/, the
 * pool and async managers: what its files and its sub-rooms share.  The
 * rest of memory/ and the layers above reach the managers through
 * memory/memory.h (cm_mm_pool, cm_mm_async), and graph pools through
 * memory/pool/graph/graph.h.
 * The room owns, lowest first:
 * - pool.c: a pool's blocks, bins, segments and events;
 * - vmm/: segments on virtual memory and the export of their pages
 *   (memory/pool/vmm/vmm.h);
 * - segment.c: giving a pool's segments back to the driver;
 * - graph/: graph-private pools (memory/pool/graph/graph.h);
 * - poolops.c: the managers' tables: create, allocate, release, order,
 *   trim, export, statistics; the pool manager on virtual memory keeps
 *   a second pool beside it, on cuMemAlloc'd segments, for what the
 *   adapters allocate for other libraries (cm_mm_for_peer);
 * - poolview.c: the segments of both as Python sees them;
 * - poolfuncs.c: the managers' module-level functions and their init.
 *
 * Locks and the GIL, in brief: each pool's mutex mu guards its state; it
 * is taken through cm_pool_lock (below), which gives up the GIL first
 * while Python stream callbacks are in flight, and is never held across
 * a Python call or a driver call that can wait.  A pool on virtual memory
 * has a second mutex, vmu, for its mapping calls, taken with the GIL
 * given up and before mu; the graph pools' list mutex is taken before any
 * pool's.  The GIL is given up, no mutex held, around cuMemAlloc,
 * cuMemFree, synchronisations and the mapping calls; releases and takes
 * also run without it.
 */
#ifndef CM_POOL_H
#define CM_POOL_H

#include "memory/memory.h"

#define CM_POOL_ROUND 512                  /* request granularity */

#define CM_POOL_SMALL_MAX ((size_t)1 << 20)   /* small requests */

#define CM_POOL_SMALL_SEG ((size_t)2 << 20)   /* their segments */

#define CM_POOL_LARGE_SEG ((size_t)20 << 20)  /* shared large segments */

#define CM_POOL_LARGE_OWN ((size_t)10 << 20)  /* past this: own segment */

#define CM_POOL_LARGE_ROUND ((size_t)2 << 20) /* own segments round to */

#define CM_POOL_NBINS 384

#define CM_POOL_SPARE 64   /* block structs a pool keeps for reuse */

#define CM_POOL_NWORDS (CM_POOL_NBINS / 64)

/* The stream key of a block usable on any stream at once. */
#define CM_POOL_ANY UINTPTR_MAX

/* The key of a block whose stream cannot record an event any more:
 * usable only after trim() gives its segment back. */
#define CM_POOL_STUCK (UINTPTR_MAX - 1)

typedef struct cm_seg cm_seg;

typedef struct cm_blk cm_blk;

/* An arena of virtual memory (memory/pool/vmm/vmm.h). */
typedef struct cm_arena cm_arena;

/* The descriptors of a pool's exported pages (memory/pool/vmm/share.c). */
typedef struct cm_vshare cm_vshare;

/* One segment, cut into blocks: cuMemAlloc'd, or an arena of virtual
 * memory with physical pages mapped where blocks need them. */
struct cm_seg {
    CUdeviceptr base;     /* device address */
    size_t size;          /* bytes */
    int small;            /* holds small blocks */
    cm_arena *arena;      /* its pages, or NULL: cuMemAlloc'd */
    void *owner;          /* the graph pool its pool belongs to
                           * (memory/pool/graph/gpool.c), or NULL */
    cm_blk *first;        /* its blocks in address order */
    cm_seg *prev;         /* links in the pool's segment list */
    cm_seg *next;
};

/* One block: a range of a segment, in use or free. */
struct cm_blk {
    CUdeviceptr ptr;      /* device address */
    size_t size;          /* bytes, a multiple of CM_POOL_ROUND */
    cm_seg *seg;          /* its segment */
    cm_blk *prev;         /* address neighbours in the segment */
    cm_blk *next;
    cm_blk *fprev;        /* links in its bin, while free */
    cm_blk *fnext;
    uintptr_t stream;     /* stream key of its last use, CM_POOL_ANY or
                           * CM_POOL_STUCK */
    CUevent event;        /* recorded on that stream after the last use,
                           * or NULL */
    uint64_t seq;         /* when the event was recorded (pool order) */
    CUevent *waits;       /* events on the other streams that used it,
                           * recorded at its release; it stays pending
                           * (in no bin) until they have all completed */
    int nwaits;           /* entries of waits */
    int any_after;        /* once they have: free for any stream (an
                           * event of its own stream is among them) */
    int free;             /* in a bin */
    int pending;          /* on the pool's pending list */
    int record_now;       /* its stream may go without notice: its event
                           * is recorded when it is freed, not left for
                           * later (cleared then) */
    int bin;              /* which, while free */
    int unbacked;         /* taken (cm_pool_take) from an arena with
                           * pages that have no memory mapped yet */
};

/* A bin set: the free blocks of one kind of segment. */
typedef struct {
    cm_blk *head[CM_POOL_NBINS];        /* lists, newest first */
    uint64_t used[CM_POOL_NWORDS];      /* bit b: head[b] != NULL */
} cm_bins;

struct cm_pool {
    int kind;             /* CM_MM_POOL or CM_MM_ASYNC */
    int graph;            /* a graph pool's (memory/pool/graph/gpool.c): no
                           * events; a free block serves its own stream
                           * key only (or any, if never used) */
    void *owner;          /* that graph pool, else NULL */
    int dead;             /* NOTE: set once (GIL held) when destroyed */
    pthread_mutex_t mu;   /* guards everything below */
    /* pool */
    cm_bins small;        /* free small blocks */
    cm_bins large;        /* free large blocks */
    cm_seg *segs;         /* every segment */
    size_t reserved;      /* bytes of device memory held: cuMemAlloc'd
                           * segments and pages mapped in arenas
                           * (written atomically: the twin reads it
                           * without the mutex) */
    size_t free_bytes;    /* bytes in free blocks */
    size_t limit;         /* the most reserved may be; 0: no limit */
    uintptr_t first_stream;  /* the first stream key served */
    int multi_stream;     /* more than one stream key was served */
    uint64_t seq;         /* events recorded so far */
    cm_blk *spare;        /* block structs kept for reuse (through
                           * fnext), and how many */
    int nspare;
    cm_blk *pending;      /* released blocks waiting for the events of
                           * other streams (linked through fnext) */
    size_t pending_bytes; /* their bytes */
    int poison;           /* CUDAMEM_POOL_POISON: the byte every block
                           * handed out is filled with, or -1 */
    CUevent *events;      /* idle events, a stack */
    size_t nevents;       /* used entries */
    size_t capevents;     /* allocated entries */
    cm_context *ctx;      /* its context (the struct never outlives it) */
    /* What a context-wide synchronize tells of the blocks' events
     * (cm_blk_event_done): the synchronize mark (cm_ctx_sync_mark) read
     * after the latest record, and, at the last change of that mark, the
     * mark before and the last seq recorded under it. */
    unsigned long rec_mark;
    unsigned long old_mark;
    uint64_t old_seq;
    /* async */
    CUmemoryPool mempool;  /* the pool it allocates from: its own, or the
                            * device's default one */
    int shareable;        /* mempool is its own, made with the POSIX
                           * file-descriptor handle type */
    const char *noshare;  /* when not shareable: why (static text) */
    int export_fd;        /* NOTE: GIL; mempool's shareable handle, once
                           * exported, else -1; closed with the pool */
    uint64_t token;       /* names mempool in IPC handles (random) */
    CUstream side;        /* async: a stream of the pool's own (made on
                           * first need, never blocking) on which the
                           * frees of memory that several streams used
                           * wait for all of them; NULL until then */
    /* the pool manager on virtual memory: the peers' pool beside it */
    cm_pool *peers;       /* the pool whose cuMemAlloc'd segments serve
                           * what the adapters allocate for other
                           * libraries (cm_mm_for_peer), or NULL: those
                           * come from this pool */
    cm_pool *twin;        /* the other pool of that pair (the limit
                           * counts both), or NULL */
    size_t borrowed;      /* a peers' pool: the blocks it gave its twin
                           * on virtual memory when that one could map
                           * no memory (cm_pool_borrow_peers) */
    cm_seg *late;         /* NOTE: GIL; the segments, kept by the
                           * destroy (a close) for cm_pool_dead */
    cm_pool *all_next;    /* NOTE: GIL; the list of every pool */
    cm_pool *all_prev;
    /* virtual memory (memory/pool/vmm/arena.c) */
    int vmm;              /* segments are arenas (CUDAMEM_POOL_VMM) */
    int gshift;           /* log2 of the page size, the device's
                           * allocation granularity */
    int device;           /* the device ordinal pages are made on */
    uint64_t open_to;     /* bit d: device d (a peer) gets access to
                           * every page mapped too; guarded by vmu */
    pthread_mutex_t vmu;  /* serialises mapping and unmapping; taken
                           * without the GIL, before mu, never by a
                           * thread that holds mu */
    size_t idle_pages;    /* mapped pages no block in use covers */
    size_t arena_used;    /* bytes of the arenas' blocks in use */
    size_t peak_reserved; /* the most reserved has been */
    size_t peak_used;     /* the most arena_used has been */
    size_t n_made;        /* pages made (cuMemCreate) so far */
    size_t n_moved;       /* idle pages moved to another place so far */
    size_t n_released;    /* pages given back (cuMemRelease) so far */
    int vshare;           /* pages are made with the POSIX
                           * file-descriptor handle type: exportable */
    cm_vshare *shares;    /* the exported pages' descriptors, or NULL
                           * (memory/pool/vmm/share.c) */
    size_t keep;          /* idle bytes kept: past them, idle pages go
                           * back to the device once quiet */
    int release_due;      /* idle bytes past keep since the last release
                           * (read without mu as a hint) */
    size_t idle_low;      /* the fewest idle pages since the last release
                           * pass: those stayed idle all along */
    uint64_t release_ns;  /* the time between release passes */
    uint64_t release_next;  /* CLOCK_MONOTONIC_COARSE ns of the next
                             * pass */
    size_t astat_reserved;  /* async: the driver pool's reserved and
                             * free bytes as last read, for statistics
                             * while a capture forbids the query */
    size_t astat_free;
    int untrimmed;        /* async: the driver's pool may cache memory
                           * (a free or a failed allocation since the
                           * last trim); trim() has nothing to give back
                           * while 0.  Atomic. */
};

/* What the handle of a block of a peers' pool carries (poolops.c; a
 * graph pool's carry CM_GPOOL_TAG). */
#define CM_PEER_TAG ((uintptr_t)2)

/* The bytes pool p and its twin hold: what the pool's limit counts (p's
 * mutex held; the twin's figure read without its mutex, a hint). */
static inline size_t
cm_pool_held(const cm_pool *p)
{
    return p->reserved
           + (p->twin != NULL
                  ? __atomic_load_n(&p->twin->reserved, __ATOMIC_RELAXED)
                  : 0);
}

/* In a fork's child: every pool dead, with a fresh mutex (poolops.c). */
void cm_pool_atfork_child(void);

/* CUDAMEM_POOL_LIMIT: the limit new pools start with (0: none). */
extern size_t cm_default_limit;

/* CUDAMEM_POOL_POISON: the byte pools made from now on fill every block
 * they hand out with (on the block's stream), or -1 for none. */
extern int cm_pool_poison;

/* CUDAMEM_ASYNC_RELEASE_THRESHOLD: the async pool's threshold. */
extern cuuint64_t cm_async_threshold;

/* p->mu, taken by a thread that may hold the GIL.  Its holders make
 * driver calls (the events of the settle, the put and the retire), and
 * a driver call can wait for a Python stream callback that waits for the
 * GIL; so while callbacks are in flight the GIL is released before the
 * mutex is taken and taken back after it is given back (see
 * cm_gil_yield_needed).  Every taker of p->mu goes through these; the
 * code between uses no Python object. */
static inline void
cm_pool_lock(cm_pool *p, cm_gil_saved *g)
{
    g->ts = NULL;
    g->probe = 0;
    g->epoch = 0;
    if (cm_gil_yield_needed()) {
        cm_gil_drop(g);
    }
    cm_mu_lock(&p->mu);
}

static inline void
cm_pool_unlock(cm_pool *p, cm_gil_saved *g)
{
    cm_mu_unlock(&p->mu);
    cm_gil_take(g);
}

/* ------------------------------------------------------------------ */
/* Events (mutex held)                                                 */
/* ------------------------------------------------------------------ */

void cm_event_put(cm_pool *p, CUevent e);

/* An idle event recorded on stream h now, or NULL (mutex held); NULL
 * when cudamem knows h captures. */
CUevent cm_event_on(cm_pool *p, CUstream h);

/* Give b's wait events back (mutex held). */
void cm_blk_drop_waits(cm_pool *p, cm_blk *b);

/* Whether stream h (alive) captures, or cannot say (the legacy stream
 * while a blocking stream captures: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
 * which invalidates nothing), by the driver's cuStreamIsCapturing: then
 * it is neither queried nor given an event, which would be refused,
 * invalidating a capture another library began, or be recorded into
 * it. */
int cm_pool_stream_captures(CUstream h);

/* The same, but 0 where the driver cannot say for another reason (a
 * handle it refuses): for a release that waits while h captures, which
 * must not wait for ever on a handle that never answers.  One driver
 * call. */
int cm_pool_stream_in_capture(CUstream h);

/* cuCtxSynchronize for a release after the context (ctx current), or
 * CUDA_ERROR_NOT_READY, nothing done, while a blocking stream of the
 * context captures, which the driver tells of the legacy stream without
 * harm: the synchronisation would be refused and invalidate that
 * capture, whoever began it.  A capture of a non-blocking stream by
 * another library is not told. */
CUresult cm_pool_sync_context(void);

/* Record an event on stream key s for block b (which has none); none on
 * a stream that captures, one cudamem began or another library's
 * (cm_pool_stream_captures: the event would be captured, and its query
 * refused): b waits for a later look, after the capture. */
void cm_event_record(cm_pool *p, cm_blk *b);

/* Whether free block b's event has completed: asked of the driver
 * (cuEventQuery), or, while a capture forbids this thread the query,
 * known from a context-wide synchronize made since it was recorded
 * (else taken as not yet). */
int cm_blk_event_done(cm_pool *p, const cm_blk *b);

/* ------------------------------------------------------------------ */
/* The pool (mutex held unless noted)                                  */
/* ------------------------------------------------------------------ */

size_t cm_round(size_t n, size_t to);

/* Take a free block of at least size bytes usable on stream key s, in
 * use, split; NULL if none. */
cm_blk *cm_pool_take(cm_pool *p, size_t size, uintptr_t s);

/* Make a segment of segsize bytes at base into the pool, in use for
 * size bytes on s; the block, or NULL when out of host memory. */
cm_blk *
cm_pool_add_seg(cm_pool *p, CUdeviceptr base, size_t segsize, int small,
                size_t size, uintptr_t s);

/* Return block b (in use) to the pool. */
void cm_pool_put(cm_pool *p, cm_blk *b);

/* Add free block b (of a new segment) to its bins. */
void cm_pool_free_add(cm_pool *p, cm_blk *b);

/* Block struct b, no longer in a segment, kept for reuse or freed
 * (mutex held). */
void cm_blk_recycle(cm_pool *p, cm_blk *b);

/* Find which pending events have completed (their blocks become usable
 * on any stream) and merge the free neighbours that now may be; the slow
 * path, before the pool grows. */
void cm_pool_settle(cm_pool *p);

/* Unlink every wholly free segment into *out (a list through next).  Its
 * free blocks may wait for different streams: cuMemFree waits for the
 * device anyway. */
void cm_pool_collect_free_segs(cm_pool *p, cm_seg **out);

/* cuMemFree every segment of a list of ctx's pool and free the list (no
 * mutex, no GIL); their bytes no longer count against the limit.  The
 * first error, or CUDA_SUCCESS. */
CUresult cm_segs_release(cm_context *ctx, cm_seg *g);
/* cm_mm_ops.dead of the pool and async managers (segment.c). */
void cm_pool_dead(cm_context *ctx);

/* Peer access (peer.c).  The async manager's driver pool opened to the
 * devices of mask; 0, or -1 with an exception. */
int cm_async_open(cm_pool *p, uint64_t mask);

/* The tables' peer entries (cm_mm_ops.peer) of the pool and async
 * managers. */
int cm_pool_peer(cm_context *ctx, int dev);
int cm_async_peer(cm_context *ctx, int dev);

/* The stream key of a handle. */
uintptr_t cm_stream_key(CUstream s);

/* The pool of an allocation's handle (not a graph pool's) and its
 * block. */
static inline cm_pool *
cm_pool_of(cm_context *ctx, uintptr_t handle, cm_blk **b)
{
    cm_pool *p = ctx->pool;

    *b = (cm_blk *)(handle & ~CM_PEER_TAG);
    if ((handle & CM_PEER_TAG) && p != NULL) {
        return p->peers;
    }
    return p;
}

/* order.c: the tables' order, foreign_free and stream_gone entries of
 * the pool manager and the async manager (context/context.h, cm_mm_ops
 * says what each does). */
CUresult cm_pool_order(cm_context *ctx, uintptr_t handle, CUstream own,
                       const CUstream *streams, int n, CUstream *on);
CUresult cm_async_order(cm_context *ctx, uintptr_t handle, CUstream own,
                        const CUstream *streams, int n, CUstream *on);
void cm_pool_foreign_free(cm_context *ctx, uintptr_t handle);
void cm_async_foreign_free(cm_context *ctx, uintptr_t handle);
void cm_pool_stream_gone(cm_context *ctx, CUstream h);
/* An event recorded on stream h now added to b's waits (mutex held); the
 * block made never to be handed out again where none can be. */
void cm_pool_wait_also(cm_pool *p, cm_blk *b, CUstream h);

#endif /* CM_POOL_H */
