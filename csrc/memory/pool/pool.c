/* SPDX-License-Identifier: MIT */
/*
 * pool.c: the built-in memory managers "pool" and "async".
 *
 * Owns:
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
 *   With CUDAMEM_POOL_VMM=1 the segments are arenas of virtual memory
 *   instead (memory/pool/vmm/arena.c): the same blocks, bins and rules, with
 *   pages of physical memory mapped where blocks in use are.
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
 *
 * CUDA graph captures cudamem began (context/graph.c): no pool event is
 * recorded on a stream that captures (it would be a captured event,
 * which no query can answer): a block freed there is not handed to
 * another stream before a look after the capture records one.  While a
 * capture forbids this thread the queries (cm_capture_restricted), an
 * event counts as completed only when a context-wide synchronize begun
 * after its record has finished (cm_blk_event_done), and the pending
 * blocks are not looked at.
 *
 * Locks and the GIL: each pool has its own mutex (mu, taken through
 * cm_pool_lock: memory/pool/pool.h) guarding its segments, blocks, bins,
 * events and counters; the functions here run with it held unless they
 * say so, and take no lock themselves.  It is never held across a Python
 * call, a GIL acquisition or a driver call that can wait (cuMemAlloc,
 * cuMemFree, synchronisation): only the event calls (cuEventCreate,
 * cuEventRecord, cuEventQuery, cuEventDestroy), cuStreamQuery (the quiet
 * check of memory/pool/vmm/arena.c) and the async order's cuStreamCreate
 * / cuStreamWaitEvent run under it.  A pool on virtual memory has a
 * second mutex, vmu, taken before mu (arena.c).  Callers hold the GIL
 * except in the queue's flush and PyTorch's lane (memory/interop.c),
 * which run releases and takes without it.  A pool is destroyed (memory
 * given back) when its context is closed; the struct is freed only with
 * the Context object, and an allocation that grew the pool with the GIL
 * released checks whether it was destroyed meanwhile.  The async pool's
 * exported descriptor is guarded by the GIL.
 *
 * Limitation: under the per-thread default stream, handle 0 names a
 * different stream on each thread; the pool treats it as one stream.
 */
#include "memory/pool/pool.h"
#include "memory/pool/vmm/vmm.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#define CM_POOL_LARGE_SPLIT ((size_t)1 << 20) /* least large remainder */

/* CUDAMEM_POOL_LIMIT: the limit new pools start with (0: none). */
size_t cm_default_limit;
/* CUDAMEM_POOL_POISON: the byte pools made from now on fill every block
 * they hand out with (on the block's stream), or -1 for none. */
int cm_pool_poison = -1;
/* CUDAMEM_ASYNC_RELEASE_THRESHOLD: the async pool's threshold. */
cuuint64_t cm_async_threshold = UINT64_MAX;

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

void
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
CUevent
cm_event_on(cm_pool *p, CUstream h)
{
    CUevent e = NULL;

    /* Not on a stream cudamem captures (the orders ask the driver
     * about the others first). */
    if (cm_capture_stream_known(h)) {
        return NULL;
    }
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
void
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

/* What the driver says of stream h's capture: 1 it captures (or, the
 * legacy stream, a blocking stream does), 0 it does not, -1 it cannot
 * say (a handle it refuses).  One driver call. */
static int
cm_pool_capture_state(CUstream h)
{
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult rc;

    if (cm_cu.StreamIsCapturing == NULL) {
        return 0;
    }
    rc = CM_CU_RAW(StreamIsCapturing, (h, &st));
    if (rc == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) {
        return 1;
    }
    if (rc != CUDA_SUCCESS) {
        return -1;
    }
    return st != CU_STREAM_CAPTURE_STATUS_NONE;
}

int
cm_pool_stream_captures(CUstream h)
{
    return cm_pool_capture_state(h) != 0;
}

int
cm_pool_stream_in_capture(CUstream h)
{
    return cm_pool_capture_state(h) > 0;
}

CUresult
cm_pool_sync_context(void)
{
    if (cm_pool_capture_state(CU_STREAM_LEGACY) > 0) {
        return CUDA_ERROR_NOT_READY;
    }
    return CM_CU_RAW(CtxSynchronize, ());
}

/* Record an event on stream key s for block b (which has none). */
void
cm_event_record(cm_pool *p, cm_blk *b)
{
    CUevent e = NULL;
    unsigned long mark;

    if (cm_capture_stream_known((CUstream)b->stream)
        || cm_pool_stream_captures((CUstream)b->stream)) {
        return;
    }
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
    mark = cm_ctx_sync_mark(p->ctx);
    if (mark != p->rec_mark) {
        p->old_mark = p->rec_mark;
        p->old_seq = p->seq;
        p->rec_mark = mark;
    }
    b->event = e;
    b->seq = ++p->seq;
}

int
cm_blk_event_done(cm_pool *p, const cm_blk *b)
{
    CUresult rc;
    int relaxed;

    if (!cm_capture_restricted()) {
        /* In the relaxed capture mode: a global-mode capture another
         * library began (on this thread or another), which cudamem does
         * not know of, would make the driver refuse the query of an
         * event recorded outside it and invalidate that capture. */
        cm_capture_relax_always(&relaxed);
        rc = CM_CU_RAW(EventQuery, (b->event));
        cm_capture_unrelax(relaxed);
        return rc == CUDA_SUCCESS;
    }
    /* Every event so far was recorded before the marks' synchronize
     * began; marks and seqs grow together. */
    if (cm_ctx_synced_since(p->ctx, p->rec_mark)) {
        return 1;
    }
    return b->seq <= p->old_seq && cm_ctx_synced_since(p->ctx, p->old_mark);
}

/* Whether free block b may be handed out for stream key s now; may
 * record the event other streams wait for, or find it done (while a
 * capture forbids the query, only if a synchronize tells it). */
static int
cm_blk_usable(cm_pool *p, cm_blk *b, uintptr_t s)
{
    if (b->stream == CM_POOL_ANY || b->stream == s) {
        return 1;
    }
    if (b->stream == CM_POOL_STUCK || p->graph) {
        return 0;
    }
    if (b->event == NULL) {
        cm_event_record(p, b);
        return 0;
    }
    if (!cm_blk_event_done(p, b)) {
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

size_t
cm_round(size_t n, size_t to)
{
    return (n + to - 1) / to * to;
}

/* A zeroed block struct: a recycled one, or a new one; NULL when out of
 * host memory.  A split and the merge that undoes it (a block taken and
 * given back in an arena, again and again) then allocate nothing. */
static cm_blk *
cm_blk_new(cm_pool *p)
{
    cm_blk *b = p->spare;

    if (b == NULL) {
        return calloc(1, sizeof(*b));
    }
    p->spare = b->fnext;
    p->nspare--;
    memset(b, 0, sizeof(*b));
    return b;
}

/* Block struct b, no longer in a segment, kept for cm_blk_new (a few)
 * or freed. */
void
cm_blk_recycle(cm_pool *p, cm_blk *b)
{
    if (p->nspare >= CM_POOL_SPARE) {
        free(b);
        return;
    }
    b->fnext = p->spare;
    p->spare = b;
    p->nspare++;
}

/* Split b (in use) after size bytes if the rest is worth a block; the
 * rest is free, with the free state given. */
static void
cm_blk_split(cm_pool *p, cm_blk *b, size_t size, uintptr_t stream,
             CUevent event, uint64_t seq)
{
    size_t rest = b->size - size;
    cm_blk *r;

    if (rest < (b->seg->small || b->seg->arena != NULL
                    ? CM_POOL_ROUND
                    : CM_POOL_LARGE_SPLIT)
        || (r = cm_blk_new(p)) == NULL) {
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

/* The free block of at least size bytes usable on stream key s that
 * best fits, NULL if none; with mapped, only one of an arena whose first
 * size bytes have memory mapped. */
static cm_blk *
cm_pool_find(cm_pool *p, cm_bins *bs, size_t size, uintptr_t s, int mapped)
{
    int i = cm_bin_of(size);
    cm_blk *b;

    for (i = cm_bin_next(bs, i); i >= 0; i = cm_bin_next(bs, i + 1)) {
        for (b = bs->head[i]; b != NULL; b = b->fnext) {
            if (b->size >= size
                && (!mapped
                    || (b->seg->arena != NULL
                        && cm_arena_range_backed(p, b->seg->arena, b->ptr,
                                                 size)))
                && cm_blk_usable(p, b, s)) {
                return b;
            }
        }
    }
    return NULL;
}

/* Pages without memory under [ptr, ptr + size) of arena a. */
static size_t
cm_arena_missing(const cm_pool *p, const cm_arena *a, CUdeviceptr ptr,
                 size_t size)
{
    size_t i = (size_t)(ptr - a->base) >> p->gshift;
    size_t e = (size_t)(ptr + size - 1 - a->base) >> p->gshift;
    size_t n = 0;

    for (; i <= e; i++) {
        n += a->h[i] == 0;
    }
    return n;
}

/* Where in an arena size bytes (a page or more) usable on s need the
 * fewest pages mapped: the free block, and in *off the offset in it (0,
 * or where a page starts); NULL if none.  Each free block is looked at
 * from its start and at every page boundary inside it, up to the highest
 * page ever mapped (past it no page has memory); the first block in the
 * best fit's order wins a tie.  An offset other than 0 leaves the
 * block's head free, so it is only taken from a block whose free state
 * has no event to share (cm_pool_take). */
static cm_blk *
cm_pool_window(cm_pool *p, cm_bins *bs, size_t size, uintptr_t s,
               size_t *off)
{
    size_t gran = (size_t)1 << p->gshift;
    size_t k = (size + gran - 1) >> p->gshift;
    size_t best_n = (size_t)-1;
    cm_blk *best = NULL;
    cm_blk *b;
    int i;

    *off = 0;
    for (i = cm_bin_next(bs, cm_bin_of(size)); i >= 0 && best_n > 0;
         i = cm_bin_next(bs, i + 1)) {
        for (b = bs->head[i]; b != NULL && best_n > 0; b = b->fnext) {
            const cm_arena *a = b->seg->arena;
            size_t n;
            size_t j;
            size_t jmax;
            size_t rel;
            size_t q;

            if (b->size < size || a == NULL || !cm_blk_usable(p, b, s)) {
                continue;
            }
            n = cm_arena_missing(p, a, b->ptr, size);
            if (n < best_n) {
                best_n = n;
                best = b;
                *off = 0;
            }
            if (b->event != NULL || b->size - size < gran) {
                continue;
            }
            /* Windows of k pages from each page boundary in b. */
            rel = (size_t)(b->ptr - a->base);
            j = (rel + gran - 1) >> p->gshift;
            jmax = (rel + b->size - size) >> p->gshift;
            if (jmax > a->hi) {
                jmax = a->hi;
            }
            if (j > jmax) {
                continue;
            }
            n = 0;
            for (q = j; q < j + k; q++) {
                n += a->h[q] == 0;
            }
            for (;;) {
                if (n < best_n) {
                    best_n = n;
                    best = b;
                    *off = (j << p->gshift) - rel;
                    if (n == 0) {
                        break;
                    }
                }
                if (++j > jmax) {
                    break;
                }
                n += (a->h[j + k - 1] == 0) - (a->h[j - 1] == 0);
            }
        }
    }
    return best;
}

/* Free block b loses its first off bytes to a free block of their own,
 * with b's stream (b's free state has no event); 0, or -1 when out of
 * host memory (b unchanged). */
static int
cm_blk_split_front(cm_pool *p, cm_blk *b, size_t off)
{
    cm_blk *f = cm_blk_new(p);

    if (f == NULL) {
        return -1;
    }
    f->ptr = b->ptr;
    f->size = off;
    f->seg = b->seg;
    f->prev = b->prev;
    f->next = b;
    if (f->prev != NULL) {
        f->prev->next = f;
    }
    else {
        b->seg->first = f;
    }
    b->prev = f;
    b->ptr += off;
    b->size -= off;
    f->stream = b->stream;
    f->seq = b->seq;
    cm_bin_add(p, f);
    return 0;
}

/* cm_pool_take; settle: whether the pending blocks may be settled. */
static cm_blk *
cm_pool_take_in(cm_pool *p, size_t size, uintptr_t s, int settle)
{
    cm_bins *bs = size <= CM_POOL_SMALL_MAX ? &p->small : &p->large;
    cm_blk *b;
    cm_blk *m;
    uintptr_t rs;
    CUevent re;
    uint64_t rseq;
    size_t off = 0;
    int unbacked = 0;

    b = cm_pool_find(p, bs, size, s, 0);
    if (b == NULL) {
        return NULL;
    }
    if (b->seg->arena != NULL
        && !cm_arena_range_backed(p, b->seg->arena, b->ptr, size)) {
        if (settle && p->pending != NULL) {
            /* An arena always has free virtual memory for a request, so
             * the blocks waiting for other streams are settled before
             * memory is mapped for one: the pages of those whose streams
             * are done may serve it. */
            cm_pool_settle(p);
            return cm_pool_take_in(p, size, s, 0);
        }
        unbacked = 1;
        if (p->idle_pages > 0
            && (m = cm_pool_find(p, bs, size, s, 1)) != NULL) {
            b = m;
            unbacked = 0;
        }
        else if (p->idle_pages > 0 && size >= ((size_t)1 << p->gshift)
                 && (m = cm_pool_window(p, bs, size, s, &off)) != NULL) {
            b = m;
        }
    }
    cm_bin_del(p, b);
    if (off > 0 && cm_blk_split_front(p, b, off) == 0) {
        /* b now starts at the window (else, out of host memory for the
         * head, it is taken from its start). */
        unbacked = !cm_arena_range_backed(p, b->seg->arena, b->ptr, size);
    }
    /* The rest keeps the free state; the block is now s's. */
    rs = b->stream;
    re = b->event;
    rseq = b->seq;
    b->stream = s;
    b->event = NULL;
    cm_blk_split(p, b, size, rs, re, rseq);
    b->unbacked = unbacked;
    if (b->seg->arena != NULL) {
        cm_arena_use(p, b);
    }
    return b;
}

/* Take a free block of at least size bytes usable on stream key s, in
 * use, split; NULL if none.  In an arena, a block whose memory is mapped
 * is preferred to the best fit when that one would need pages mapped,
 * and failing one, the place that needs the fewest pages mapped: idle
 * memory is used where it lies rather than moved.  Before any is chosen
 * that needs pages mapped, the pending blocks are settled (else, blocks
 * used on several streams stayed pending in an arena, their pages
 * mapped, until an out-of-memory error synchronised the context). */
cm_blk *
cm_pool_take(cm_pool *p, size_t size, uintptr_t s)
{
    return cm_pool_take_in(p, size, s, 1);
}

/* Make a segment of segsize bytes at base into the pool, in use for
 * size bytes on s; the block, or NULL when out of host memory. */
cm_blk *
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
    g->owner = p->owner;
    g->first = b;
    g->next = p->segs;
    if (p->segs != NULL) {
        p->segs->prev = g;
    }
    p->segs = g;
    __atomic_store_n(&p->reserved, p->reserved + segsize, __ATOMIC_RELAXED);
    b->ptr = base;
    b->size = segsize;
    b->seg = g;
    b->stream = s;
    cm_blk_split(p, b, size, CM_POOL_ANY, NULL, 0);
    return b;
}

/* Add free block b (of a new segment) to its bins. */
void
cm_pool_free_add(cm_pool *p, cm_blk *b)
{
    cm_bin_add(p, b);
}

/* Merge free b into its free neighbour n after it (same segment). */
static void
cm_blk_absorb(cm_pool *p, cm_blk *b, cm_blk *n)
{
    b->size += n->size;
    b->next = n->next;
    if (n->next != NULL) {
        n->next->prev = b;
    }
    cm_blk_recycle(p, n);
}

/* Return block b (in use) to the pool. */
void
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
    if (b->seg->arena != NULL) {
        cm_arena_unuse(p, b);
    }
    if ((p->multi_stream || b->record_now) && b->stream != CM_POOL_ANY
        && b->stream != CM_POOL_STUCK && !p->graph) {
        cm_event_record(p, b);
        if (b->record_now && b->event == NULL) {
            /* Not recorded (the stream captures), and the stream may go
             * without notice before a later record: no other stream may
             * have the block (trim() frees it). */
            b->stream = CM_POOL_STUCK;
        }
    }
    b->record_now = 0;
    n = b->next;
    if (n != NULL && n->free) {
        cm_bin_del(p, n);
        if (cm_blk_merge_state(p, b, n)) {
            cm_blk_absorb(p, b, n);
        }
        else {
            cm_bin_add(p, n);
        }
    }
    n = b->prev;
    if (n != NULL && n->free) {
        cm_bin_del(p, n);
        if (cm_blk_merge_state(p, n, b)) {
            cm_blk_absorb(p, n, b);
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
void
cm_pool_settle(cm_pool *p)
{
    cm_seg *g;
    cm_blk *b;
    cm_blk *n;
    int restricted = cm_capture_restricted();
    int relaxing = 0;
    int relaxed = -1;
    int done;
    int i;

    /* Their waits are not queried while a capture forbids it; queried in
     * the relaxed capture mode otherwise (set once a settle, at the first
     * query, on this slow path): a global-mode capture another library
     * began would make the driver refuse the queries and invalidate
     * it. */
    if (p->pending != NULL && !restricted) {
        cm_capture_relax_always(&relaxed);
        relaxing = 1;
    }
    for (b = restricted ? NULL : p->pending; b != NULL; b = n) {
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
            if (!b->free || b->event == NULL) {
                continue;
            }
            if (restricted) {
                done = cm_blk_event_done(p, b);
            }
            else {
                if (!relaxing) {
                    cm_capture_relax_always(&relaxed);
                    relaxing = 1;
                }
                done = CM_CU_RAW(EventQuery, (b->event)) == CUDA_SUCCESS;
            }
            if (done) {
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
                cm_blk_absorb(p, b, n);
                cm_bin_add(p, b);
            }
            else {
                b = n;
            }
        }
    }
    if (relaxing) {
        cm_capture_unrelax(relaxed);
    }
}

/* Unlink every wholly free segment into *out (a list through next).  Its
 * free blocks may wait for different streams: cuMemFree waits for the
 * device anyway. */
void
cm_pool_collect_free_segs(cm_pool *p, cm_seg **out)
{
    cm_seg *g = p->segs;
    cm_seg *next;
    cm_blk *b;
    cm_blk *bn;

    *out = NULL;
    for (; g != NULL; g = next) {
        next = g->next;
        if (g->arena != NULL) {
            continue;   /* arenas give back pages, not themselves */
        }
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
        __atomic_store_n(&p->reserved, p->reserved - g->size,
                         __ATOMIC_RELAXED);
        g->first = NULL;
        g->prev = NULL;
        g->next = *out;
        *out = g;
    }
}

/* The stream key of a handle. */
uintptr_t
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
