/* SPDX-License-Identifier: MIT */
/*
 * pool.c: the built-in memory managers "pool" and "async".
 *
 * Owns:
 * - which built-in manager contexts made from now on get
 *   (set_memory_manager("pool") tells C through _set_builtin_manager);
 * - pool: a caching allocator of device memory per context.  Requests
 *   are rounded to 512 bytes.  Small ones (up to 1 MiB) are split from
 *   2 MiB segments, larger ones from 20 MiB segments (or a segment of
 *   their own, rounded to 2 MiB, past 10 MiB); small and large blocks
 *   never share a segment.  Free blocks sit in size-class bins (eight
 *   classes per power of two, a bitmap of the non-empty ones) and are
 *   coalesced with free neighbours of their segment on free.
 *   Stream-aware reuse: a block remembers the stream it was allocated
 *   for; freed, it is reusable at once on that stream (stream order makes
 *   it safe) and on another only once an event recorded on its stream has
 *   completed.  While the pool has only ever served one stream no event
 *   is recorded at free; the first time another stream wants such a
 *   block one is recorded then (it covers the free and more).  Events
 *   come from, and go back to, a per-pool stack.  trim() gives every
 *   wholly free segment back with cuMemFree; a limit caps the bytes held;
 *   the statistics feed memory_stats() and the out-of-memory snapshot.
 * - async: cuMemAllocFromPoolAsync / cuMemFreeAsync on the allocation's
 *   stream from a memory pool of the context's own, made with the POSIX
 *   file-descriptor handle type so that its memory can be shared with
 *   other processes (ipc.c); where the device cannot make such a pool,
 *   cuMemAllocAsync from the device's default pool, whose memory cannot
 *   be shared.  The pool's release threshold is set
 *   (CUDAMEM_ASYNC_RELEASE_THRESHOLD, default UINT64_MAX) so memory stays
 *   cached across synchronisations; trim() waits for the context and
 *   trims the driver's pool to 0.  The pool's shareable handle (a file
 *   descriptor) is exported on the first IPC export and kept, with the
 *   pool, until the context is closed.
 * - private helpers for tests: raw streams and a host-function gate.
 *
 * Locking: each pool has its own mutex guarding its segments, blocks,
 * bins, events and counters.  It is never held across a Python call, a
 * GIL acquisition or a driver call that can wait (cuMemAlloc, cuMemFree,
 * synchronisation); only cuEventRecord / cuEventQuery / cuEventCreate run
 * under it.  Callers hold the GIL except in the queue's flush, which runs
 * releases without it.  A pool is destroyed (memory given back) under
 * the GIL when its context is closed; the struct is freed only with the
 * Context object, and an allocation that grew the pool with the GIL
 * released checks whether it was destroyed meanwhile.  The async pool's
 * exported descriptor is guarded by the GIL.
 *
 * Limitation: under the per-thread default stream, handle 0 names a
 * different stream on each thread; the pool treats it as one stream.
 */
#include "memory/memory.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define CM_POOL_ROUND 512                  /* request granularity */
#define CM_POOL_SMALL_MAX ((size_t)1 << 20)   /* small requests */
#define CM_POOL_SMALL_SEG ((size_t)2 << 20)   /* their segments */
#define CM_POOL_LARGE_SEG ((size_t)20 << 20)  /* shared large segments */
#define CM_POOL_LARGE_OWN ((size_t)10 << 20)  /* past this: own segment */
#define CM_POOL_LARGE_ROUND ((size_t)2 << 20) /* own segments round to */
#define CM_POOL_LARGE_SPLIT ((size_t)1 << 20) /* least large remainder */
#define CM_POOL_NBINS 384
#define CM_POOL_NWORDS (CM_POOL_NBINS / 64)

/* The stream key of a block usable on any stream at once. */
#define CM_POOL_ANY UINTPTR_MAX
/* The key of a block whose stream cannot record an event any more:
 * usable only after trim() gives its segment back. */
#define CM_POOL_STUCK (UINTPTR_MAX - 1)

typedef struct cm_seg cm_seg;
typedef struct cm_blk cm_blk;

/* One cuMemAlloc'd segment, cut into blocks. */
struct cm_seg {
    CUdeviceptr base;     /* device address */
    size_t size;          /* bytes */
    int small;            /* holds small blocks */
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
    int bin;              /* which, while free */
};

/* A bin set: the free blocks of one kind of segment. */
typedef struct {
    cm_blk *head[CM_POOL_NBINS];        /* lists, newest first */
    uint64_t used[CM_POOL_NWORDS];      /* bit b: head[b] != NULL */
} cm_bins;

struct cm_pool {
    int kind;             /* CM_MM_POOL or CM_MM_ASYNC */
    int dead;             /* NOTE: set once (GIL held) when destroyed */
    pthread_mutex_t mu;   /* guards everything below */
    /* pool */
    cm_bins small;        /* free small blocks */
    cm_bins large;        /* free large blocks */
    cm_seg *segs;         /* every segment */
    size_t reserved;      /* bytes in segments */
    size_t free_bytes;    /* bytes in free blocks */
    size_t limit;         /* the most reserved may be; 0: no limit */
    uintptr_t first_stream;  /* the first stream key served */
    int multi_stream;     /* more than one stream key was served */
    uint64_t seq;         /* events recorded so far */
    cm_blk *pending;      /* released blocks waiting for the events of
                           * other streams (linked through fnext) */
    size_t pending_bytes; /* their bytes */
    int poison;           /* CUDAMEM_POOL_POISON: the byte every block
                           * handed out is filled with, or -1 */
    CUevent *events;      /* idle events, a stack */
    size_t nevents;       /* used entries */
    size_t capevents;     /* allocated entries */
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
};

/* The built-in kind for new contexts. */
static int cm_builtin = CM_MM_DEFAULT;
/* CUDAMEM_POOL_LIMIT: the limit new pools start with (0: none). */
static size_t cm_default_limit;
/* CUDAMEM_POOL_POISON: the byte pools made from now on fill every block
 * they hand out with (on the block's stream), or -1 for none. */
static int cm_pool_poison = -1;
/* CUDAMEM_ASYNC_RELEASE_THRESHOLD: the async pool's threshold. */
static cuuint64_t cm_async_threshold = UINT64_MAX;

int
cm_mm_builtin_kind(void)
{
    return cm_builtin;
}

/* ------------------------------------------------------------------ */
/* Bins                                                                */
/* ------------------------------------------------------------------ */

/* The size class of a size (a multiple of CM_POOL_ROUND): one class per
 * 512 bytes below 8 KiB, then eight per power of two. */
static int
cm_bin_of(size_t size)
{
    size_t units = size / CM_POOL_ROUND;
    int l;
    int b;

    if (units < 16) {
        return (int)units;
    }
    l = 63 - __builtin_clzll((unsigned long long)units);
    b = 16 + (l - 4) * 8 + (int)((units >> (l - 3)) & 7);
    return b < CM_POOL_NBINS ? b : CM_POOL_NBINS - 1;
}

static cm_bins *
cm_bins_of(cm_pool *p, const cm_blk *b)
{
    return b->seg->small ? &p->small : &p->large;
}

static void
cm_bin_add(cm_pool *p, cm_blk *b)
{
    cm_bins *bs = cm_bins_of(p, b);
    int i = cm_bin_of(b->size);

    b->bin = i;
    b->free = 1;
    b->fprev = NULL;
    b->fnext = bs->head[i];
    if (b->fnext != NULL) {
        b->fnext->fprev = b;
    }
    bs->head[i] = b;
    bs->used[i / 64] |= (uint64_t)1 << (i % 64);
    p->free_bytes += b->size;
}

static void
cm_bin_del(cm_pool *p, cm_blk *b)
{
    cm_bins *bs = cm_bins_of(p, b);
    int i = b->bin;

    if (b->fprev != NULL) {
        b->fprev->fnext = b->fnext;
    }
    else {
        bs->head[i] = b->fnext;
    }
    if (b->fnext != NULL) {
        b->fnext->fprev = b->fprev;
    }
    if (bs->head[i] == NULL) {
        bs->used[i / 64] &= ~((uint64_t)1 << (i % 64));
    }
    b->free = 0;
    p->free_bytes -= b->size;
}

/* The first non-empty bin at or after i, or -1. */
static int
cm_bin_next(const cm_bins *bs, int i)
{
    int w = i / 64;
    uint64_t m;

    if (i >= CM_POOL_NBINS) {
        return -1;
    }
    m = bs->used[w] & (~(uint64_t)0 << (i % 64));
    for (;;) {
        if (m != 0) {
            return w * 64 + __builtin_ctzll(m);
        }
        if (++w == CM_POOL_NWORDS) {
            return -1;
        }
        m = bs->used[w];
    }
}

/* ------------------------------------------------------------------ */
/* Events (mutex held)                                                 */
/* ------------------------------------------------------------------ */

static void
cm_event_put(cm_pool *p, CUevent e)
{
    if (e == NULL) {
        return;
    }
    if (p->nevents == p->capevents) {
        size_t cap = p->capevents ? p->capevents * 2 : 16;
        CUevent *v = realloc(p->events, cap * sizeof(*v));

        if (v == NULL) {
            (void)CM_CU_RAW(EventDestroy, (e));
            return;
        }
        p->events = v;
        p->capevents = cap;
    }
    p->events[p->nevents++] = e;
}

/* An idle event recorded on stream h now, or NULL (mutex held). */
static CUevent
cm_event_on(cm_pool *p, CUstream h)
{
    CUevent e = NULL;

    if (p->nevents > 0) {
        e = p->events[--p->nevents];
    }
    else if (CM_CU_RAW(EventCreate, (&e, CU_EVENT_DISABLE_TIMING))
             != CUDA_SUCCESS) {
        return NULL;
    }
    if (CM_CU_RAW(EventRecord, (e, h)) != CUDA_SUCCESS) {
        cm_event_put(p, e);
        return NULL;
    }
    return e;
}

/* Give b's wait events back (mutex held). */
static void
cm_blk_drop_waits(cm_pool *p, cm_blk *b)
{
    int i;

    for (i = 0; i < b->nwaits; i++) {
        cm_event_put(p, b->waits[i]);
    }
    free(b->waits);
    b->waits = NULL;
    b->nwaits = 0;
}

/* Record an event on stream key s for block b (which has none). */
static void
cm_event_record(cm_pool *p, cm_blk *b)
{
    CUevent e = NULL;

    if (p->nevents > 0) {
        e = p->events[--p->nevents];
    }
    else if (CM_CU_RAW(EventCreate, (&e, CU_EVENT_DISABLE_TIMING))
             != CUDA_SUCCESS) {
        e = NULL;
    }
    if (e == NULL) {
        b->stream = CM_POOL_STUCK;
        return;
    }
    if (CM_CU_RAW(EventRecord, (e, (CUstream)b->stream)) != CUDA_SUCCESS) {
        /* The stream is gone: nobody can order against it any more. */
        cm_event_put(p, e);
        b->stream = CM_POOL_STUCK;
        return;
    }
    b->event = e;
    b->seq = ++p->seq;
}

/* Whether free block b may be handed out for stream key s now; may
 * record the event other streams wait for, or find it done. */
static int
cm_blk_usable(cm_pool *p, cm_blk *b, uintptr_t s)
{
    CUresult rc;

    if (b->stream == CM_POOL_ANY || b->stream == s) {
        return 1;
    }
    if (b->stream == CM_POOL_STUCK) {
        return 0;
    }
    if (b->event == NULL) {
        cm_event_record(p, b);
        return 0;
    }
    rc = CM_CU_RAW(EventQuery, (b->event));
    if (rc != CUDA_SUCCESS) {
        return 0;
    }
    cm_event_put(p, b->event);
    b->event = NULL;
    b->stream = CM_POOL_ANY;
    return 1;
}

/* Whether free blocks a and b may be merged: free for the same stream,
 * or both for any; a block for any stream joins one bound to a stream
 * only while the pool has served a single stream (else it would hide
 * memory that other streams may use now). */
static int
cm_blk_mergeable(const cm_pool *p, const cm_blk *a, const cm_blk *b)
{
    if (a->stream == CM_POOL_STUCK || b->stream == CM_POOL_STUCK) {
        return 0;
    }
    if (a->stream == b->stream) {
        return 1;
    }
    return !p->multi_stream
           && (a->stream == CM_POOL_ANY || b->stream == CM_POOL_ANY);
}

/* The free state of a block made of free blocks a and b, into a; 0 if
 * they may not be merged. */
static int
cm_blk_merge_state(cm_pool *p, cm_blk *a, cm_blk *b)
{
    if (!cm_blk_mergeable(p, a, b)) {
        return 0;
    }
    if (b->stream == CM_POOL_ANY) {
        cm_event_put(p, b->event);
        b->event = NULL;
        return 1;
    }
    if (a->stream == CM_POOL_ANY) {
        cm_event_put(p, a->event);
        a->stream = b->stream;
        a->event = b->event;
        a->seq = b->seq;
        b->event = NULL;
        return 1;
    }
    if (a->event != NULL && b->event != NULL) {
        /* Events on one stream: the later one covers the earlier. */
        if (b->seq > a->seq) {
            cm_event_put(p, a->event);
            a->event = b->event;
            a->seq = b->seq;
        }
        else {
            cm_event_put(p, b->event);
        }
    }
    else {
        /* One block waits for no event yet: record one when needed. */
        cm_event_put(p, a->event);
        cm_event_put(p, b->event);
        a->event = NULL;
    }
    b->event = NULL;
    return 1;
}

/* ------------------------------------------------------------------ */
/* The pool (mutex held unless noted)                                  */
/* ------------------------------------------------------------------ */

static size_t
cm_round(size_t n, size_t to)
{
    return (n + to - 1) / to * to;
}

/* Split b (in use) after size bytes if the rest is worth a block; the
 * rest is free, with the free state given. */
static void
cm_blk_split(cm_pool *p, cm_blk *b, size_t size, uintptr_t stream,
             CUevent event, uint64_t seq)
{
    size_t rest = b->size - size;
    cm_blk *r;

    if (rest < (b->seg->small ? CM_POOL_ROUND : CM_POOL_LARGE_SPLIT)
        || (r = calloc(1, sizeof(*r))) == NULL) {
        cm_event_put(p, event);
        return;
    }
    r->ptr = b->ptr + size;
    r->size = rest;
    r->seg = b->seg;
    r->prev = b;
    r->next = b->next;
    if (r->next != NULL) {
        r->next->prev = r;
    }
    b->next = r;
    b->size = size;
    r->stream = stream;
    r->event = event;
    r->seq = seq;
    cm_bin_add(p, r);
}

/* Take a free block of at least size bytes usable on stream key s, in
 * use, split; NULL if none. */
static cm_blk *
cm_pool_take(cm_pool *p, size_t size, uintptr_t s)
{
    cm_bins *bs = size <= CM_POOL_SMALL_MAX ? &p->small : &p->large;
    int i = cm_bin_of(size);
    cm_blk *b;
    uintptr_t rs;
    CUevent re;
    uint64_t rseq;

    for (i = cm_bin_next(bs, i); i >= 0; i = cm_bin_next(bs, i + 1)) {
        for (b = bs->head[i]; b != NULL; b = b->fnext) {
            if (b->size >= size && cm_blk_usable(p, b, s)) {
                goto found;
            }
        }
    }
    return NULL;
found:
    cm_bin_del(p, b);
    /* The rest keeps the free state; the block is now s's. */
    rs = b->stream;
    re = b->event;
    rseq = b->seq;
    b->stream = s;
    b->event = NULL;
    cm_blk_split(p, b, size, rs, re, rseq);
    return b;
}

/* Make a segment of segsize bytes at base into the pool, in use for
 * size bytes on s; the block, or NULL when out of host memory. */
static cm_blk *
cm_pool_add_seg(cm_pool *p, CUdeviceptr base, size_t segsize, int small,
                size_t size, uintptr_t s)
{
    cm_seg *g = calloc(1, sizeof(*g));
    cm_blk *b = calloc(1, sizeof(*b));

    if (g == NULL || b == NULL) {
        free(g);
        free(b);
        return NULL;
    }
    g->base = base;
    g->size = segsize;
    g->small = small;
    g->first = b;
    g->next = p->segs;
    if (p->segs != NULL) {
        p->segs->prev = g;
    }
    p->segs = g;
    p->reserved += segsize;
    b->ptr = base;
    b->size = segsize;
    b->seg = g;
    b->stream = s;
    cm_blk_split(p, b, size, CM_POOL_ANY, NULL, 0);
    return b;
}

/* Merge free b into its free neighbour n after it (same segment). */
static void
cm_blk_absorb(cm_blk *b, cm_blk *n)
{
    b->size += n->size;
    b->next = n->next;
    if (n->next != NULL) {
        n->next->prev = b;
    }
    free(n);
}

/* Return block b (in use) to the pool. */
static void
cm_pool_put(cm_pool *p, cm_blk *b)
{
    cm_blk *n;

    if (b->nwaits > 0) {
        /* Other streams used it: no stream may have it before their
         * work is done (cm_pool_settle looks again). */
        b->pending = 1;
        b->fprev = NULL;
        b->fnext = p->pending;
        if (p->pending != NULL) {
            p->pending->fprev = b;
        }
        p->pending = b;
        p->pending_bytes += b->size;
        return;
    }
    if (p->multi_stream && b->stream != CM_POOL_ANY
        && b->stream != CM_POOL_STUCK) {
        cm_event_record(p, b);
    }
    n = b->next;
    if (n != NULL && n->free) {
        cm_bin_del(p, n);
        if (cm_blk_merge_state(p, b, n)) {
            cm_blk_absorb(b, n);
        }
        else {
            cm_bin_add(p, n);
        }
    }
    n = b->prev;
    if (n != NULL && n->free) {
        cm_bin_del(p, n);
        if (cm_blk_merge_state(p, n, b)) {
            cm_blk_absorb(n, b);
            b = n;
        }
        else {
            cm_bin_add(p, n);
        }
    }
    cm_bin_add(p, b);
}

/* Find which pending events have completed (their blocks become usable
 * on any stream) and merge the free neighbours that now may be; the slow
 * path, before the pool grows. */
static void
cm_pool_settle(cm_pool *p)
{
    cm_seg *g;
    cm_blk *b;
    cm_blk *n;
    int i;

    for (b = p->pending; b != NULL; b = n) {
        n = b->fnext;
        for (i = 0; i < b->nwaits; i++) {
            if (CM_CU_RAW(EventQuery, (b->waits[i])) != CUDA_SUCCESS) {
                break;
            }
        }
        if (i < b->nwaits) {
            continue;
        }
        if (b->fprev != NULL) {
            b->fprev->fnext = b->fnext;
        }
        else {
            p->pending = b->fnext;
        }
        if (b->fnext != NULL) {
            b->fnext->fprev = b->fprev;
        }
        b->pending = 0;
        p->pending_bytes -= b->size;
        cm_blk_drop_waits(p, b);
        if (b->any_after) {
            b->stream = CM_POOL_ANY;
            b->any_after = 0;
        }
        cm_pool_put(p, b);
    }
    for (g = p->segs; g != NULL; g = g->next) {
        for (b = g->first; b != NULL; b = b->next) {
            if (b->free && b->event != NULL
                && CM_CU_RAW(EventQuery, (b->event)) == CUDA_SUCCESS) {
                cm_event_put(p, b->event);
                b->event = NULL;
                b->stream = CM_POOL_ANY;
            }
        }
        b = g->first;
        while (b != NULL) {
            n = b->next;
            if (b->free && n != NULL && n->free
                && cm_blk_mergeable(p, b, n)) {
                cm_bin_del(p, b);
                cm_bin_del(p, n);
                (void)cm_blk_merge_state(p, b, n);
                cm_blk_absorb(b, n);
                cm_bin_add(p, b);
            }
            else {
                b = n;
            }
        }
    }
}

/* Unlink every wholly free segment into *out (a list through next).  Its
 * free blocks may wait for different streams: cuMemFree waits for the
 * device anyway. */
static void
cm_pool_collect_free_segs(cm_pool *p, cm_seg **out)
{
    cm_seg *g = p->segs;
    cm_seg *next;
    cm_blk *b;
    cm_blk *bn;

    *out = NULL;
    for (; g != NULL; g = next) {
        next = g->next;
        for (b = g->first; b != NULL && b->free; b = b->next) {
        }
        if (b != NULL) {
            continue;
        }
        for (b = g->first; b != NULL; b = bn) {
            bn = b->next;
            cm_bin_del(p, b);
            cm_event_put(p, b->event);
            free(b);
        }
        if (g->prev != NULL) {
            g->prev->next = g->next;
        }
        else {
            p->segs = g->next;
        }
        if (g->next != NULL) {
            g->next->prev = g->prev;
        }
        p->reserved -= g->size;
        g->first = NULL;
        g->prev = NULL;
        g->next = *out;
        *out = g;
    }
}

/* cuMemFree every segment of a list and free the list (no mutex, no
 * GIL).  The first error, or CUDA_SUCCESS. */
static CUresult
cm_segs_release(cm_seg *g)
{
    CUresult first = CUDA_SUCCESS;
    CUresult rc;
    cm_seg *next;

    for (; g != NULL; g = next) {
        next = g->next;
        rc = CM_CU_RAW(MemFree, (g->base));
        if (first == CUDA_SUCCESS) {
            first = rc;
        }
        free(g);
    }
    return first;
}

/* The stream key of a handle. */
static uintptr_t
cm_stream_key(CUstream s)
{
    uintptr_t h = (uintptr_t)s;

    if (h == (uintptr_t)CU_STREAM_LEGACY && !cm_driver_per_thread()) {
        return 0;
    }
    if (h == (uintptr_t)CU_STREAM_PER_THREAD && cm_driver_per_thread()) {
        return 0;
    }
    return h;
}

/* ------------------------------------------------------------------ */
/* The interface to memory.c and context.c                             */
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

int
cm_pool_create(cm_context *ctx, int kind)
{
    cm_pool *p = calloc(1, sizeof(*p));
    int err;

    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    p->kind = kind;
    p->limit = cm_default_limit;
    p->first_stream = CM_POOL_ANY;
    p->poison = cm_pool_poison;
    if (pthread_mutex_init(&p->mu, NULL) != 0) {
        free(p);
        PyErr_NoMemory();
        return -1;
    }
    p->export_fd = -1;
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
        if (err < 0 && p->shareable) {
            (void)CM_CU_RAW(MemPoolDestroy, (p->mempool));
        }
        if (err < 0) {
            pthread_mutex_destroy(&p->mu);
            free(p);
            return -1;
        }
    }
    ctx->pool = p;
    return 0;
}

void
cm_pool_destroy(cm_context *ctx)
{
    cm_pool *p = ctx->pool;
    cm_seg *all;
    cm_seg *g;
    cm_blk *b;
    cm_blk *next;
    CUevent *events;
    size_t nevents;
    size_t i;
    CUcontext cur = NULL;
    CUcontext popped;
    CUmemoryPool mp;
    int pushed = 0;

    if (p == NULL || p->dead) {
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->dead = 1;
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
    memset(&p->small, 0, sizeof(p->small));
    memset(&p->large, 0, sizeof(p->large));
    p->pending = NULL;
    p->pending_bytes = 0;
    p->reserved = 0;
    p->free_bytes = 0;
    events = p->events;
    nevents = p->nevents;
    p->events = NULL;
    p->nevents = 0;
    p->capevents = 0;
    mp = p->mempool;
    pthread_mutex_unlock(&p->mu);
    if (p->export_fd >= 0) {
        /* Importers can no longer take it; what they imported stays. */
        close(p->export_fd);
        p->export_fd = -1;
    }
    if (!ctx->alive || cm_forked) {
        free(events);
        for (g = all; g != NULL; g = all) {
            all = g->next;
            free(g);
        }
        return;
    }
    Py_BEGIN_ALLOW_THREADS
    if (CM_CU_RAW(CtxGetCurrent, (&cur)) != CUDA_SUCCESS
        || cur != ctx->handle) {
        pushed = CM_CU_RAW(CtxPushCurrent, (ctx->handle)) == CUDA_SUCCESS;
    }
    (void)cm_segs_release(all);
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
    if (pushed) {
        (void)CM_CU_RAW(CtxPopCurrent, (&popped));
    }
    Py_END_ALLOW_THREADS
    free(events);
}

void
cm_pool_free(cm_context *ctx)
{
    cm_pool *p = ctx->pool;
    size_t i;

    if (p == NULL) {
        return;
    }
    ctx->pool = NULL;
    if (p->export_fd >= 0) {
        close(p->export_fd);
    }
    for (i = 0; i < p->nevents; i++) {
        (void)CM_CU_RAW(EventDestroy, (p->events[i]));
    }
    free(p->events);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

/* Grow the pool by one segment for size bytes on s and take the block;
 * GIL held on entry and exit, released around cuMemAlloc. */
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
    cm_blk *b;

    if (small) {
        want = CM_POOL_SMALL_SEG;
        exact = want;
    }
    else {
        exact = cm_round(size, CM_POOL_LARGE_ROUND);
        want = size < CM_POOL_LARGE_OWN ? CM_POOL_LARGE_SEG : exact;
    }
    pthread_mutex_lock(&p->mu);
    reserved = p->reserved;
    limit = p->limit;
    pthread_mutex_unlock(&p->mu);
    if (limit != 0 && want > limit - (reserved < limit ? reserved : limit)) {
        want = exact;
        if (want > limit - (reserved < limit ? reserved : limit)) {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    Py_INCREF(ctx);
    CM_DRIVER_BEGIN_NOGIL
    rc = CM_CU_RAW(MemAlloc, (&base, want));
    if (rc == CUDA_ERROR_OUT_OF_MEMORY && want != exact) {
        want = exact;
        rc = CM_CU_RAW(MemAlloc, (&base, want));
    }
    CM_DRIVER_END_NOGIL
    if (rc != CUDA_SUCCESS) {
        Py_DECREF(ctx);
        return rc;
    }
    pthread_mutex_lock(&p->mu);
    if (p->dead) {
        /* Closed meanwhile: the context's reset took the memory. */
        pthread_mutex_unlock(&p->mu);
        Py_DECREF(ctx);
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    }
    b = cm_pool_add_seg(p, base, want, small, size, s);
    pthread_mutex_unlock(&p->mu);
    Py_DECREF(ctx);
    if (b == NULL) {
        Py_BEGIN_ALLOW_THREADS
        (void)CM_CU_RAW(MemFree, (base));
        Py_END_ALLOW_THREADS
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = b;
    return CUDA_SUCCESS;
}

CUresult
cm_pool_alloc(cm_context *ctx, size_t size, CUstream stream,
              CUdeviceptr *ptr, void **blk)
{
    cm_pool *p = ctx->pool;
    uintptr_t s = cm_stream_key(stream);
    cm_blk *b;
    CUresult rc;

    if (p->kind == CM_MM_ASYNC) {
        if (p->limit != 0 && size > p->limit - (ctx->st_bytes < p->limit
                                                ? ctx->st_bytes
                                                : p->limit)) {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        *blk = NULL;
        CM_DRIVER_BEGIN_NOGIL
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
        CM_DRIVER_END_NOGIL
        return rc;
    }
    size = cm_round(size, CM_POOL_ROUND);
    if (size == 0) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&p->mu);
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
    pthread_mutex_unlock(&p->mu);
    if (b == NULL) {
        rc = cm_pool_grow(ctx, p, size, s, &b);
        if (rc != CUDA_SUCCESS) {
            return rc;
        }
    }
    *ptr = b->ptr;
    *blk = b;
    if (p->poison >= 0) {
        CM_DRIVER_BEGIN_NOGIL
        rc = CM_CU_RAW(MemsetD8Async, (b->ptr, (unsigned char)p->poison,
                                       b->size, stream));
        CM_DRIVER_END_NOGIL
        if (rc != CUDA_SUCCESS) {
            pthread_mutex_lock(&p->mu);
            if (!p->dead) {
                cm_pool_put(p, b);
            }
            pthread_mutex_unlock(&p->mu);
            return rc;
        }
    }
    return CUDA_SUCCESS;
}

CUresult
cm_pool_release(cm_context *ctx, int kind, uintptr_t handle,
                CUstream stream)
{
    cm_pool *p = ctx->pool;
    cm_blk *b = (cm_blk *)handle;
    CUresult rc;

    if (p == NULL || p->dead) {
        return CUDA_SUCCESS;
    }
    if (kind == CM_REL_POOL_SYNC || kind == CM_REL_ASYNC_SYNC) {
        /* Released where no stream could be recorded: every stream that
         * used it is done once the context is. */
        rc = CM_CU_RAW(CtxSynchronize, ());
        if (rc != CUDA_SUCCESS) {
            return rc;
        }
    }
    if (kind == CM_REL_ASYNC || kind == CM_REL_ASYNC_SYNC) {
        return CM_CU_RAW(MemFreeAsync, ((CUdeviceptr)handle,
                                        kind == CM_REL_ASYNC ? stream
                                                             : NULL));
    }
    pthread_mutex_lock(&p->mu);
    if (!p->dead) {
        if (kind == CM_REL_POOL_SYNC) {
            cm_blk_drop_waits(p, b);
            b->any_after = 0;
            b->stream = CM_POOL_ANY;
        }
        cm_pool_put(p, b);
    }
    pthread_mutex_unlock(&p->mu);
    return CUDA_SUCCESS;
}

/* Append event e to b's waits; 0, or -1 when out of host memory. */
static int
cm_blk_add_wait(cm_blk *b, CUevent e)
{
    CUevent *w = realloc(b->waits, (size_t)(b->nwaits + 1) * sizeof(*w));

    if (w == NULL) {
        return -1;
    }
    b->waits = w;
    b->waits[b->nwaits++] = e;
    return 0;
}

void
cm_pool_retire(cm_context *ctx, void *blk, CUstream own,
               const CUstream *streams, int n)
{
    cm_pool *p = ctx->pool;
    cm_blk *b = blk;
    CUevent e;
    int i;

    if (p == NULL || p->kind != CM_MM_POOL) {
        return;
    }
    pthread_mutex_lock(&p->mu);
    if (p->dead) {
        pthread_mutex_unlock(&p->mu);
        return;
    }
    for (i = 0; i <= n; i++) {
        CUstream h = i < n ? streams[i] : own;

        if (i == n && cm_stream_handle_is_default(own)) {
            break;
        }
        e = cm_event_on(p, h);
        if (e == NULL || cm_blk_add_wait(b, e) < 0) {
            /* Nothing can order a later user after that stream: the
             * block is never handed out again (trim() frees it). */
            cm_event_put(p, e);
            cm_blk_drop_waits(p, b);
            b->stream = CM_POOL_STUCK;
            b->any_after = 0;
            pthread_mutex_unlock(&p->mu);
            return;
        }
        if (i == n) {
            b->any_after = 1;
        }
    }
    pthread_mutex_unlock(&p->mu);
}

CUresult
cm_pool_async_join(cm_context *ctx, CUstream own, const CUstream *streams,
                   int n, CUstream *on)
{
    cm_pool *p = ctx->pool;
    CUresult rc = CUDA_SUCCESS;
    CUevent e;
    int i;

    if (p == NULL || p->dead) {
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    }
    pthread_mutex_lock(&p->mu);
    if (p->side == NULL) {
        rc = CM_CU_RAW(StreamCreate, (&p->side, CU_STREAM_NON_BLOCKING));
    }
    for (i = 0; i <= n && rc == CUDA_SUCCESS; i++) {
        e = cm_event_on(p, i < n ? streams[i] : own);
        if (e == NULL) {
            rc = CUDA_ERROR_INVALID_HANDLE;
            break;
        }
        /* The wait takes the event's state now: it may be reused. */
        rc = CM_CU_RAW(StreamWaitEvent, (p->side, e, 0));
        cm_event_put(p, e);
    }
    *on = p->side;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void
cm_pool_stream_gone(cm_context *ctx, CUstream h)
{
    cm_pool *p = ctx->pool;
    uintptr_t s = cm_stream_key(h);
    cm_seg *g;
    cm_blk *b;

    if (p == NULL || p->kind != CM_MM_POOL
        || cm_stream_handle_is_default(h)) {
        return;
    }
    pthread_mutex_lock(&p->mu);
    if (!p->dead) {
        for (g = p->segs; g != NULL; g = g->next) {
            for (b = g->first; b != NULL; b = b->next) {
                if (b->free && b->stream == s && b->event == NULL) {
                    /* Later, the handle may name another stream. */
                    cm_event_record(p, b);
                }
            }
        }
    }
    pthread_mutex_unlock(&p->mu);
}

int
cm_pool_trim(cm_context *ctx)
{
    cm_pool *p = ctx->pool;
    cm_seg *segs = NULL;
    CUresult rc = CUDA_SUCCESS;
    const char *fn = "cuMemFree";

    if (p == NULL || p->dead || cm_context_activate(ctx) < 0) {
        return p == NULL || p->dead ? 0 : -1;
    }
    if (p->kind == CM_MM_ASYNC) {
        Py_BEGIN_ALLOW_THREADS
        rc = CM_CU_RAW(CtxSynchronize, ());
        if (rc == CUDA_SUCCESS) {
            rc = CM_CU_RAW(MemPoolTrimTo, (p->mempool, 0));
            fn = "cuMemPoolTrimTo";
        }
        else {
            fn = "cuCtxSynchronize";
        }
        Py_END_ALLOW_THREADS
        return cm_cu_check(rc, fn);
    }
    if (p->pending != NULL) {
        /* Blocks that wait for other streams: their segments may be
         * wholly free once the device is idle. */
        Py_BEGIN_ALLOW_THREADS
        rc = CM_CU_RAW(CtxSynchronize, ());
        Py_END_ALLOW_THREADS
        if (rc != CUDA_SUCCESS) {
            return cm_cu_check(rc, "cuCtxSynchronize");
        }
    }
    pthread_mutex_lock(&p->mu);
    if (p->pending != NULL) {
        cm_pool_settle(p);
    }
    cm_pool_collect_free_segs(p, &segs);
    pthread_mutex_unlock(&p->mu);
    if (segs != NULL) {
        Py_BEGIN_ALLOW_THREADS
        rc = cm_segs_release(segs);
        Py_END_ALLOW_THREADS
    }
    return cm_cu_check(rc, fn);
}

int
cm_pool_shareable(cm_context *ctx)
{
    cm_pool *p = ctx->pool;

    return p != NULL && p->kind == CM_MM_ASYNC && p->shareable;
}

const char *
cm_pool_alloc_fn(cm_context *ctx)
{
    switch (ctx->mm_kind) {
    case CM_MM_POOL:
        return "cuMemAlloc (pool)";
    case CM_MM_ASYNC:
        return cm_pool_shareable(ctx) ? "cuMemAllocFromPoolAsync"
                                      : "cuMemAllocAsync";
    default:
        return "cuMemAlloc";
    }
}

int
cm_pool_owns(cm_context *ctx, CUdeviceptr base)
{
    cm_pool *p = ctx->pool;
    CUmemoryPool mp = NULL;

    if (p == NULL || p->kind != CM_MM_ASYNC || p->dead) {
        return 0;
    }
    if (CM_CU(PointerGetAttribute,
              (&mp, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, base)) < 0) {
        return -1;
    }
    return mp != NULL && mp == p->mempool;
}

int
cm_pool_export(cm_context *ctx, CUdeviceptr base,
               CUmemPoolPtrExportData *data, int *fd, uint64_t *token)
{
    cm_pool *p = ctx->pool;
    PyObject *msg;
    PyObject *exc;
    int got = -1;
    int err;

    if (p == NULL || p->kind != CM_MM_ASYNC || p->dead) {
        PyErr_SetString(PyExc_ValueError,
                        "the context's async memory pool is closed");
        return -1;
    }
    if (!p->shareable) {
        msg = PyUnicode_FromFormat(
            "cannot export memory of the async memory manager through IPC: "
            "its memory pool on device %d cannot be shared (%s)",
            ctx->device->id, p->noshare);
        if (msg == NULL) {
            return -1;
        }
        /* CudaAPIError(code, msg), numba's own signature */
        exc = PyObject_CallFunction(cm_st->CudaAPIError, "iO",
                                    (int)CUDA_ERROR_NOT_SUPPORTED, msg);
        Py_DECREF(msg);
        if (exc != NULL) {
            PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
            Py_DECREF(exc);
        }
        return -1;
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

void
cm_pool_stats(cm_context *ctx, size_t *reserved, size_t *free_b,
              long long *largest)
{
    cm_pool *p = ctx->pool;
    cuuint64_t r = 0;
    cuuint64_t u = 0;
    size_t a;
    size_t b;

    *reserved = 0;
    *free_b = 0;
    *largest = ctx->mm_kind == CM_MM_POOL ? 0 : -1;
    if (p == NULL || p->dead) {
        return;
    }
    if (p->kind == CM_MM_ASYNC) {
        if (CM_CU_RAW(MemPoolGetAttribute,
                      (p->mempool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &r))
                == CUDA_SUCCESS
            && CM_CU_RAW(MemPoolGetAttribute,
                         (p->mempool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &u))
                   == CUDA_SUCCESS) {
            *reserved = (size_t)r;
            *free_b = r > u ? (size_t)(r - u) : 0;
        }
        return;
    }
    pthread_mutex_lock(&p->mu);
    *reserved = p->reserved;
    *free_b = p->free_bytes;
    a = cm_bins_largest(&p->small);
    b = cm_bins_largest(&p->large);
    *largest = (long long)(a > b ? a : b);
    pthread_mutex_unlock(&p->mu);
}

/* One block as cm_pool_segments copies it out (mutex held). */
typedef struct {
    int seg;              /* index of its segment */
    CUdeviceptr ptr;
    size_t size;
    int state;            /* 0 used, 1 free, 2 pending */
} cm_blk_view;

PyObject *
cm_pool_segments(cm_context *ctx)
{
    static const char *const states[] = {"used", "free", "pending"};
    cm_pool *p = ctx->pool;
    cm_blk_view *v = NULL;
    CUdeviceptr *base = NULL;
    size_t *size = NULL;
    int *small = NULL;
    size_t nb = 0;
    size_t nt;
    size_t ns = 0;
    size_t i;
    cm_seg *g;
    cm_blk *b;
    PyObject *list;
    PyObject *blocks = NULL;

    list = PyList_New(0);
    if (list == NULL || p == NULL || p->dead || p->kind != CM_MM_POOL) {
        return list;
    }
    /* Copied out under the mutex, turned into objects after it. */
    pthread_mutex_lock(&p->mu);
    for (g = p->segs; g != NULL; g = g->next) {
        ns++;
        for (b = g->first; b != NULL; b = b->next) {
            nb++;
        }
    }
    v = malloc((nb > 0 ? nb : 1) * sizeof(*v));
    base = malloc((ns > 0 ? ns : 1) * sizeof(*base));
    size = malloc((ns > 0 ? ns : 1) * sizeof(*size));
    small = malloc((ns > 0 ? ns : 1) * sizeof(*small));
    if (v != NULL && base != NULL && size != NULL && small != NULL) {
        nb = 0;
        ns = 0;
        for (g = p->segs; g != NULL; g = g->next, ns++) {
            base[ns] = g->base;
            size[ns] = g->size;
            small[ns] = g->small;
            for (b = g->first; b != NULL; b = b->next, nb++) {
                v[nb].seg = (int)ns;
                v[nb].ptr = b->ptr;
                v[nb].size = b->size;
                v[nb].state = b->free ? 1 : b->pending ? 2 : 0;
            }
        }
    }
    pthread_mutex_unlock(&p->mu);
    if (v == NULL || base == NULL || size == NULL || small == NULL) {
        PyErr_NoMemory();
        goto err_free;
    }
    nt = nb;
    for (i = 0, nb = 0; i < ns; i++) {
        PyObject *d;
        int r;

        blocks = PyList_New(0);
        if (blocks == NULL) {
            goto err_free;
        }
        for (; nb < nt && v[nb].seg == (int)i; nb++) {
            PyObject *t = Py_BuildValue("(Kns)",
                                        (unsigned long long)v[nb].ptr,
                                        (Py_ssize_t)v[nb].size,
                                        states[v[nb].state]);

            if (t == NULL || PyList_Append(blocks, t) < 0) {
                Py_XDECREF(t);
                goto err_free;
            }
            Py_DECREF(t);
        }
        d = Py_BuildValue("{sKsnsOsO}", "base", (unsigned long long)base[i],
                          "size", (Py_ssize_t)size[i], "small",
                          small[i] ? Py_True : Py_False, "blocks", blocks);
        Py_CLEAR(blocks);
        r = d == NULL ? -1 : PyList_Append(list, d);
        Py_XDECREF(d);
        if (r < 0) {
            goto err_free;
        }
    }
    free(v);
    free(base);
    free(size);
    free(small);
    return list;
err_free:
    Py_XDECREF(blocks);
    Py_DECREF(list);
    free(v);
    free(base);
    free(size);
    free(small);
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Module-level functions                                              */
/* ------------------------------------------------------------------ */

/* The Context argument of a private helper, borrowed; NULL with
 * TypeError. */
static cm_context *
cm_ctx_arg(PyObject *o)
{
    if (!PyObject_TypeCheck(o, cm_st->Context_type)) {
        PyErr_Format(PyExc_TypeError, "expected a Context, got %.100s",
                     Py_TYPE(o)->tp_name);
        return NULL;
    }
    return (cm_context *)o;
}

/* The pool of a context argument; NULL with an exception if it has
 * none (another manager) or it was closed. */
static cm_pool *
cm_pool_arg(PyObject *o, cm_context **ctx)
{
    cm_context *c = cm_ctx_arg(o);

    if (c == NULL) {
        return NULL;
    }
    if (c->pool == NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "this context's memory manager is not a built-in "
                        "pool (set_memory_manager('pool') or 'async' before "
                        "the context is made)");
        return NULL;
    }
    if (cm_context_activate(c) < 0) {
        return NULL;
    }
    *ctx = c;
    return c->pool;
}

PyDoc_STRVAR(cm_set_builtin_doc,
"_set_builtin_manager(name)\n--\n\n"
"Which built-in manager contexts made from now on get: 'default', "
"'pool' or 'async'.");

static PyObject *
cm_set_builtin_fn(PyObject *mod, PyObject *arg)
{
    const char *s = PyUnicode_Check(arg) ? PyUnicode_AsUTF8(arg) : NULL;

    (void)mod;
    if (s == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "name must be a str");
        }
        return NULL;
    }
    if (strcmp(s, "default") == 0) {
        cm_builtin = CM_MM_DEFAULT;
    }
    else if (strcmp(s, "pool") == 0) {
        cm_builtin = CM_MM_POOL;
    }
    else if (strcmp(s, "async") == 0) {
        cm_builtin = CM_MM_ASYNC;
    }
    else {
        PyErr_Format(PyExc_ValueError,
                     "unknown built-in memory manager %R", arg);
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cm_get_builtin_doc,
"_builtin_manager()\n--\n\n"
"The built-in manager contexts made from now on get.");

static PyObject *
cm_get_builtin_fn(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    return PyUnicode_FromString(cm_builtin == CM_MM_POOL ? "pool"
                                : cm_builtin == CM_MM_ASYNC ? "async"
                                : "default");
}

PyDoc_STRVAR(cm_pool_trim_doc,
"_pool_trim(ctx)\n--\n\n"
"Give every wholly free pooled segment of ctx back to the driver (the "
"async manager: wait for the context, then trim its pool to 0).");

static PyObject *
cm_pool_trim_fn(PyObject *mod, PyObject *arg)
{
    cm_context *c = NULL;

    (void)mod;
    if (cm_pool_arg(arg, &c) == NULL || cm_pool_trim(c) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cm_pool_limit_doc,
"_pool_limit(ctx, limit=None)\n--\n\n"
"The most bytes ctx's pool may hold (the async manager: may have "
"allocated); 0 means no limit.  With limit, set it first.");

static PyObject *
cm_pool_limit_fn(PyObject *mod, PyObject *args)
{
    PyObject *o;
    PyObject *v = Py_None;
    cm_context *c = NULL;
    cm_pool *p;
    size_t n;

    (void)mod;
    if (!PyArg_ParseTuple(args, "O|O:_pool_limit", &o, &v)
        || (p = cm_pool_arg(o, &c)) == NULL) {
        return NULL;
    }
    if (v != Py_None) {
        n = PyLong_AsSize_t(v);
        if (n == (size_t)-1 && PyErr_Occurred()) {
            return NULL;
        }
        pthread_mutex_lock(&p->mu);
        p->limit = n;
        pthread_mutex_unlock(&p->mu);
    }
    return PyLong_FromSize_t(p->limit);
}

PyDoc_STRVAR(cm_async_threshold_doc,
"_async_release_threshold(ctx, value=None)\n--\n\n"
"The release threshold of the driver pool behind ctx's async manager; "
"with value, set it first.");

static PyObject *
cm_async_threshold_fn(PyObject *mod, PyObject *args)
{
    PyObject *o;
    PyObject *v = Py_None;
    cm_context *c = NULL;
    cm_pool *p;
    cuuint64_t t = 0;

    (void)mod;
    if (!PyArg_ParseTuple(args, "O|O:_async_release_threshold", &o, &v)
        || (p = cm_pool_arg(o, &c)) == NULL) {
        return NULL;
    }
    if (p->kind != CM_MM_ASYNC) {
        PyErr_SetString(PyExc_RuntimeError,
                        "only the async manager has a release threshold");
        return NULL;
    }
    if (v != Py_None) {
        t = PyLong_AsUnsignedLongLong(v);
        if ((t == (cuuint64_t)-1 && PyErr_Occurred())
            || CM_CU(MemPoolSetAttribute,
                     (p->mempool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                      &t)) < 0) {
            return NULL;
        }
    }
    if (CM_CU(MemPoolGetAttribute,
              (p->mempool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &t)) < 0) {
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(t);
}

PyDoc_STRVAR(cm_async_shareable_doc,
"_async_shareable(ctx)\n--\n\n"
"Whether the pool of ctx's async manager can be shared with other "
"processes (made with the POSIX file-descriptor handle type), so that "
"its memory exports through IPC.");

static PyObject *
cm_async_shareable_fn(PyObject *mod, PyObject *arg)
{
    cm_context *c = NULL;
    cm_pool *p;

    (void)mod;
    if ((p = cm_pool_arg(arg, &c)) == NULL) {
        return NULL;
    }
    if (p->kind != CM_MM_ASYNC) {
        PyErr_SetString(PyExc_RuntimeError,
                        "only the async manager has a memory pool to "
                        "share");
        return NULL;
    }
    return PyBool_FromLong(p->shareable);
}

PyDoc_STRVAR(cm_pool_stats_doc,
"_pool_stats(ctx)\n--\n\n"
"A dict: reserved_bytes, free_bytes, largest_free_block (None where the "
"manager cannot know), segments, limit.");

static PyObject *
cm_pool_stats_fn(PyObject *mod, PyObject *arg)
{
    cm_context *c = NULL;
    cm_pool *p;
    size_t reserved;
    size_t free_b;
    long long largest;
    Py_ssize_t nseg = 0;
    cm_seg *g;
    PyObject *lg;
    PyObject *r;

    (void)mod;
    if ((p = cm_pool_arg(arg, &c)) == NULL) {
        return NULL;
    }
    cm_pool_stats(c, &reserved, &free_b, &largest);
    pthread_mutex_lock(&p->mu);
    for (g = p->segs; g != NULL; g = g->next) {
        nseg++;
    }
    pthread_mutex_unlock(&p->mu);
    lg = largest < 0 ? Py_NewRef(Py_None) : PyLong_FromLongLong(largest);
    if (lg == NULL) {
        return NULL;
    }
    r = Py_BuildValue("{snsnsOsnsn}", "reserved_bytes", (Py_ssize_t)reserved,
                      "free_bytes", (Py_ssize_t)free_b,
                      "largest_free_block", lg, "segments", nseg,
                      "limit", (Py_ssize_t)p->limit);
    Py_DECREF(lg);
    return r;
}

PyDoc_STRVAR(cm_memalloc_on_doc,
"_memalloc_on(ctx, size, stream_handle)\n--\n\n"
"Allocate size bytes in ctx for the stream with that raw handle (0: the "
"default stream); the owner, as Context.memalloc gives.");

static PyObject *
cm_memalloc_on_fn(PyObject *mod, PyObject *args)
{
    PyObject *o;
    Py_ssize_t n;
    unsigned long long h;
    cm_context *c;
    CUdeviceptr p;

    (void)mod;
    if (!PyArg_ParseTuple(args, "OnK:_memalloc_on", &o, &n, &h)
        || (c = cm_ctx_arg(o)) == NULL) {
        return NULL;
    }
    if (n <= 0) {
        PyErr_Format(PyExc_ValueError,
                     "memalloc size must be positive, got %zd", n);
        return NULL;
    }
    return cm_mem_alloc_on(c, (size_t)n, (CUstream)(uintptr_t)h, &p);
}

/* Test helpers: raw streams and a gate that holds a stream's worker. */

PyDoc_STRVAR(cm_raw_stream_create_doc,
"_raw_stream_create(flags=0)\n--\n\n"
"cuStreamCreate in the current context; the raw handle (tests only).");

static PyObject *
cm_raw_stream_create_fn(PyObject *mod, PyObject *args)
{
    unsigned int flags = 0;
    CUstream s = NULL;

    (void)mod;
    if (!PyArg_ParseTuple(args, "|I:_raw_stream_create", &flags)
        || cm_context_current() == NULL
        || CM_CU(StreamCreate, (&s, flags)) < 0) {
        return NULL;
    }
    return PyLong_FromVoidPtr((void *)s);
}

PyDoc_STRVAR(cm_raw_stream_destroy_doc,
"_raw_stream_destroy(handle)\n--\n\ncuStreamDestroy (tests only).");

static PyObject *
cm_raw_stream_destroy_fn(PyObject *mod, PyObject *arg)
{
    void *s = PyLong_AsVoidPtr(arg);

    (void)mod;
    if ((s == NULL && PyErr_Occurred())
        || CM_CU(StreamDestroy, ((CUstream)s)) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cm_raw_stream_sync_doc,
"_raw_stream_synchronize(handle)\n--\n\n"
"cuStreamSynchronize with the GIL released (tests only).");

static PyObject *
cm_raw_stream_sync_fn(PyObject *mod, PyObject *arg)
{
    void *s = PyLong_AsVoidPtr(arg);
    int err;

    (void)mod;
    if ((s == NULL && PyErr_Occurred()) || cm_context_current() == NULL) {
        return NULL;
    }
    CM_CU_NOGIL(err, StreamSynchronize, ((CUstream)s));
    if (err < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cm_raw_event_create_doc,
"_raw_event_create(flags=0)\n--\n\n"
"cuEventCreate in the current context; the raw handle (benchmarks only).");

static PyObject *
cm_raw_event_create_fn(PyObject *mod, PyObject *args)
{
    unsigned int flags = 0;
    CUevent e = NULL;

    (void)mod;
    if (!PyArg_ParseTuple(args, "|I:_raw_event_create", &flags)
        || cm_context_current() == NULL
        || CM_CU(EventCreate, (&e, flags)) < 0) {
        return NULL;
    }
    return PyLong_FromVoidPtr((void *)e);
}

PyDoc_STRVAR(cm_raw_event_destroy_doc,
"_raw_event_destroy(handle)\n--\n\ncuEventDestroy (benchmarks only).");

static PyObject *
cm_raw_event_destroy_fn(PyObject *mod, PyObject *arg)
{
    void *e = PyLong_AsVoidPtr(arg);

    (void)mod;
    if ((e == NULL && PyErr_Occurred())
        || CM_CU(EventDestroy, ((CUevent)e)) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cm_raw_event_record_sync_doc,
"_raw_event_record_sync(event, stream)\n--\n\n"
"cuEventRecord, then cuEventSynchronize with the GIL released, as\n"
"Event.record and Event.synchronize do (benchmarks only).");

static PyObject *
cm_raw_event_record_sync_fn(PyObject *mod, PyObject *args)
{
    void *e;
    void *s;
    PyObject *eo;
    PyObject *so;
    int err;

    (void)mod;
    if (!PyArg_ParseTuple(args, "OO:_raw_event_record_sync", &eo, &so)) {
        return NULL;
    }
    e = PyLong_AsVoidPtr(eo);
    if (e == NULL && PyErr_Occurred()) {
        return NULL;
    }
    s = PyLong_AsVoidPtr(so);
    if ((s == NULL && PyErr_Occurred())
        || CM_CU(EventRecord, ((CUevent)e, (CUstream)s)) < 0) {
        return NULL;
    }
    CM_CU_NOGIL(err, EventSynchronize, ((CUevent)e));
    if (err < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* A host function that waits until opened; freed by whichever of the
 * host function and _raw_gate_open comes last. */
typedef struct {
    pthread_mutex_t mu;   /* guards the two flags */
    pthread_cond_t cv;    /* signalled when opened */
    int open;             /* _raw_gate_open was called */
    int refs;             /* the host function and the opener */
} cm_gate;

static void
cm_gate_unref(cm_gate *g)
{
    int last;

    pthread_mutex_lock(&g->mu);
    last = --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    if (last) {
        pthread_cond_destroy(&g->cv);
        pthread_mutex_destroy(&g->mu);
        free(g);
    }
}

static void CUDA_CB
cm_gate_fn(void *arg)
{
    cm_gate *g = arg;

    pthread_mutex_lock(&g->mu);
    while (!g->open) {
        pthread_cond_wait(&g->cv, &g->mu);
    }
    pthread_mutex_unlock(&g->mu);
    cm_gate_unref(g);
}

PyDoc_STRVAR(cm_raw_gate_doc,
"_raw_gate(handle)\n--\n\n"
"Hold the stream with that raw handle until _raw_gate_open(gate) (a host "
"function that waits); the gate (tests only).");

static PyObject *
cm_raw_gate_fn(PyObject *mod, PyObject *arg)
{
    void *s = PyLong_AsVoidPtr(arg);
    cm_gate *g;

    (void)mod;
    if ((s == NULL && PyErr_Occurred()) || cm_context_current() == NULL) {
        return NULL;
    }
    g = calloc(1, sizeof(*g));
    if (g == NULL) {
        return PyErr_NoMemory();
    }
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->refs = 2;
    if (CM_CU(LaunchHostFunc, ((CUstream)s, cm_gate_fn, g)) < 0) {
        pthread_cond_destroy(&g->cv);
        pthread_mutex_destroy(&g->mu);
        free(g);
        return NULL;
    }
    return PyLong_FromVoidPtr(g);
}

PyDoc_STRVAR(cm_raw_gate_open_doc,
"_raw_gate_open(gate)\n--\n\nLet a _raw_gate's stream go on (once).");

static PyObject *
cm_raw_gate_open_fn(PyObject *mod, PyObject *arg)
{
    cm_gate *g = PyLong_AsVoidPtr(arg);

    (void)mod;
    if (g == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError, "not a gate");
        }
        return NULL;
    }
    pthread_mutex_lock(&g->mu);
    g->open = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    cm_gate_unref(g);
    Py_RETURN_NONE;
}

static PyObject *cm_pool_poison_fn(PyObject *mod, PyObject *arg);
extern const char cm_pool_poison_doc[];

static PyMethodDef cm_pool_functions[] = {
    {"_set_builtin_manager", cm_set_builtin_fn, METH_O, cm_set_builtin_doc},
    {"_builtin_manager", cm_get_builtin_fn, METH_NOARGS, cm_get_builtin_doc},
    {"_pool_trim", cm_pool_trim_fn, METH_O, cm_pool_trim_doc},
    {"_pool_limit", cm_pool_limit_fn, METH_VARARGS, cm_pool_limit_doc},
    {"_pool_stats", cm_pool_stats_fn, METH_O, cm_pool_stats_doc},
    {"_async_release_threshold", cm_async_threshold_fn, METH_VARARGS,
     cm_async_threshold_doc},
    {"_async_shareable", cm_async_shareable_fn, METH_O,
     cm_async_shareable_doc},
    {"_memalloc_on", cm_memalloc_on_fn, METH_VARARGS, cm_memalloc_on_doc},
    {"_raw_stream_create", cm_raw_stream_create_fn, METH_VARARGS,
     cm_raw_stream_create_doc},
    {"_raw_stream_destroy", cm_raw_stream_destroy_fn, METH_O,
     cm_raw_stream_destroy_doc},
    {"_raw_stream_synchronize", cm_raw_stream_sync_fn, METH_O,
     cm_raw_stream_sync_doc},
    {"_raw_event_create", cm_raw_event_create_fn, METH_VARARGS,
     cm_raw_event_create_doc},
    {"_raw_event_destroy", cm_raw_event_destroy_fn, METH_O,
     cm_raw_event_destroy_doc},
    {"_raw_event_record_sync", cm_raw_event_record_sync_fn, METH_VARARGS,
     cm_raw_event_record_sync_doc},
    {"_raw_gate", cm_raw_gate_fn, METH_O, cm_raw_gate_doc},
    {"_pool_poison", cm_pool_poison_fn, METH_O, cm_pool_poison_doc},
    {"_raw_gate_open", cm_raw_gate_open_fn, METH_O, cm_raw_gate_open_doc},
    {NULL, NULL, 0, NULL},
};

/* A byte count from the environment: digits with an optional K, M or G
 * (powers of 1024); dflt when unset or unreadable. */
static unsigned long long
cm_env_bytes(const char *name, unsigned long long dflt)
{
    const char *v = getenv(name);
    char *end;
    unsigned long long n;

    if (v == NULL || v[0] == '\0') {
        return dflt;
    }
    n = strtoull(v, &end, 10);
    if (end == v) {
        return dflt;
    }
    switch (*end) {
    case 'k': case 'K': n <<= 10; break;
    case 'm': case 'M': n <<= 20; break;
    case 'g': case 'G': n <<= 30; break;
    default: break;
    }
    return n;
}

/* CUDAMEM_POOL_POISON: unset, empty or 0: off; 1: the byte 0xA5; 2 to
 * 255: that byte.  0, or -1 with ValueError naming the variable. */
static int
cm_pool_poison_env(void)
{
    const char *v = getenv("CUDAMEM_POOL_POISON");
    char *end;
    long n;

    cm_pool_poison = -1;
    if (v == NULL || v[0] == '\0') {
        return 0;
    }
    n = strtol(v, &end, 0);
    if (end == v || *end != '\0' || n < 0 || n > 255) {
        PyErr_Format(PyExc_ValueError,
                     "CUDAMEM_POOL_POISON must be 0 (off), 1 (the byte "
                     "0xA5) or a byte value 2..255, not %.100s", v);
        return -1;
    }
    if (n > 0) {
        cm_pool_poison = n == 1 ? 0xA5 : (int)n;
    }
    return 0;
}

const char cm_pool_poison_doc[] = PyDoc_STR(
"_pool_poison(byte)\n--\n\n"
"Set the byte that pool and async managers made from now on fill every "
"block they hand out with (-1: none; CUDAMEM_POOL_POISON sets it at "
"import); returns the previous setting.");

static PyObject *
cm_pool_poison_fn(PyObject *mod, PyObject *arg)
{
    long n = PyLong_AsLong(arg);
    int old = cm_pool_poison;

    (void)mod;
    if (n == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (n < -1 || n > 255) {
        PyErr_SetString(PyExc_ValueError,
                        "the poison byte must be -1 (none) or 0..255");
        return NULL;
    }
    cm_pool_poison = (int)n;
    return PyLong_FromLong(old);
}

int
cm_pool_init(PyObject *mod, cm_state *st)
{
    (void)st;
    cm_default_limit = (size_t)cm_env_bytes("CUDAMEM_POOL_LIMIT", 0);
    if (cm_pool_poison_env() < 0) {
        return -1;
    }
    cm_async_threshold = (cuuint64_t)cm_env_bytes(
        "CUDAMEM_ASYNC_RELEASE_THRESHOLD", UINT64_MAX);
    return PyModule_AddFunctions(mod, cm_pool_functions);
}
