/* SPDX-License-Identifier: MIT */
/*
 * memory/pool/order.c: ordering a release of the pool and async managers
 * after other streams (their tables' order, stream_gone and foreign_free
 * entries, poolops.c): the events a pool block waits for before another
 * stream may have it, and the async manager's side stream that frees
 * after every stream an allocation was used on.
 *
 * Locks and the GIL: called with the GIL held (the order, a foreign
 * free) or with or without it (stream_gone); each takes its pool's
 * mutex through cm_pool_lock, which gives up the GIL while Python stream
 * callbacks are in flight, and makes its event calls and the side
 * stream's cuStreamCreate / cuStreamWaitEvent under it.
 */
#include "memory/pool/pool.h"
#include "memory/pool/graph/graph.h"

#include <stdlib.h>

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

/* Add an event recorded on stream h now to b's waits (mutex held); where
 * none can be, nothing orders a later user after that stream: the block
 * is never handed out again (trim() frees it). */
void
cm_pool_wait_also(cm_pool *p, cm_blk *b, CUstream h)
{
    CUevent e = cm_event_on(p, h);

    if (e == NULL || cm_blk_add_wait(b, e) < 0) {
        cm_event_put(p, e);
        cm_blk_drop_waits(p, b);
        b->stream = CM_POOL_STUCK;
        b->any_after = 0;
    }
}

/* Before an order records events on own and the n streams: whether one
 * of them captures, whoever began the capture (one driver call each).
 * An event recorded there would join that graph (and a wait on it the
 * waiting stream), and its query would be refused.  CUDA_SUCCESS when
 * none does.  When one does, *skip is its index (n: own) and *on that
 * stream (the legacy one named as such): CM_ORDER_AFTER_CAPTURE, the
 * others may be recorded now and that one at the flush, once it no
 * longer captures.  When several do: CUDA_ERROR_NOT_READY, *on the
 * first, and the release, made after the context, waits in the queue
 * until that one no longer captures. */
static CUresult
cm_release_waits_for(CUstream own, const CUstream *streams, int n,
                     CUstream *on, int *skip)
{
    CUstream h;
    int found = 0;
    int i;

    for (i = 0; i <= n; i++) {
        h = i < n ? streams[i] : own;
        if (found && h == (*skip < n ? streams[*skip] : own)) {
            continue;        /* the same stream again */
        }
        if (cm_pool_stream_in_capture(h)) {
            if (found) {
                return CUDA_ERROR_NOT_READY;
            }
            *on = h != NULL ? h : CU_STREAM_LEGACY;
            *skip = i;
            found = 1;
        }
    }
    return found ? CM_ORDER_AFTER_CAPTURE : CUDA_SUCCESS;
}

/* Whether stream i of an order (n: own) is the one skipped, or the same
 * handle. */
static int
cm_order_skips(CUstream own, const CUstream *streams, int n, int i,
               int skip)
{
    if (skip < 0) {
        return 0;
    }
    return i == skip
           || (i < n ? streams[i] : own) == (skip < n ? streams[skip] : own);
}

/* The pool manager's order: record an event on each of the n streams,
 * and on own unless it is a default stream, so that block handle is
 * handed out again only once all of them have completed.  CUDA_SUCCESS:
 * a block whose event cannot be recorded is never reused (trim() gives
 * its segment back); CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, nothing
 * recorded, when one of them is a stream cudamem knows captures (the
 * caller's release then waits for the context, after the capture);
 * CM_ORDER_AFTER_CAPTURE when one of them captures for another library,
 * the others recorded (the release records that one,
 * cm_pool_wait_also); CUDA_ERROR_NOT_READY, nothing recorded, when
 * several do (cm_release_waits_for). */
CUresult
cm_pool_order(cm_context *ctx, uintptr_t handle, CUstream own,
              const CUstream *streams, int n, CUstream *on)
{
    cm_pool *p;
    cm_blk *b;
    CUresult rc;
    int skip = -1;
    int i;
    cm_gil_saved gd;

    if (cm_gpool_handle(handle)) {
        /* A graph pool records no events: released after the context. */
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    p = cm_pool_of(ctx, handle, &b);
    if (p == NULL) {
        return CUDA_SUCCESS;
    }
    for (i = 0; cm_capture_any() && i <= n; i++) {
        if (cm_capture_stream_known(i < n ? streams[i] : own)) {
            return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
    }
    rc = cm_release_waits_for(own, streams, n, on, &skip);
    if (rc == CUDA_ERROR_NOT_READY) {
        return rc;
    }
    cm_pool_lock(p, &gd);
    if (p->dead) {
        cm_pool_unlock(p, &gd);
        return CUDA_SUCCESS;
    }
    for (i = 0; i <= n; i++) {
        CUstream h = i < n ? streams[i] : own;

        if (i == n && cm_stream_handle_is_default(own)) {
            break;
        }
        if (i == n) {
            /* Own's event is among the waits, now or at the release
             * after the capture. */
            b->any_after = 1;
        }
        if (cm_order_skips(own, streams, n, i, skip)) {
            continue;
        }
        cm_pool_wait_also(p, b, h);
        if (b->stream == CM_POOL_STUCK) {
            cm_pool_unlock(p, &gd);
            return CUDA_SUCCESS;
        }
    }
    cm_pool_unlock(p, &gd);
    return rc;
}

/* The async manager's order: *on becomes the pool's own side stream, on
 * which a free follows the work queued so far on own and on each of the
 * n streams, without making any of them wait for another.
 * CM_ORDER_AFTER_CAPTURE when one of them captures for another library:
 * the side stream waits for the others, and *on is that one (the
 * release makes the side stream wait for it);
 * CUDA_ERROR_NOT_READY, nothing ordered, when several do. */
CUresult
cm_async_order(cm_context *ctx, uintptr_t handle, CUstream own,
               const CUstream *streams, int n, CUstream *on)
{
    cm_pool *p = ctx->pool;
    CUresult rc = CUDA_SUCCESS;
    CUresult after;
    CUevent e;
    int skip = -1;
    int i;
    cm_gil_saved gd;

    if (cm_gpool_handle(handle)) {
        /* A graph pool records no events: released after the context. */
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (p == NULL || p->dead) {
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    }
    after = cm_release_waits_for(own, streams, n, on, &skip);
    if (after == CUDA_ERROR_NOT_READY) {
        return after;
    }
    cm_pool_lock(p, &gd);
    if (p->side == NULL) {
        rc = CM_CU_RAW(StreamCreate, (&p->side, CU_STREAM_NON_BLOCKING));
    }
    for (i = 0; i <= n && rc == CUDA_SUCCESS; i++) {
        if (cm_order_skips(own, streams, n, i, skip)) {
            continue;
        }
        e = cm_event_on(p, i < n ? streams[i] : own);
        if (e == NULL) {
            rc = CUDA_ERROR_INVALID_HANDLE;
            break;
        }
        /* The wait takes the event's state now: it may be reused. */
        rc = CM_CU_RAW(StreamWaitEvent, (p->side, e, 0));
        cm_event_put(p, e);
    }
    if (after == CUDA_SUCCESS || rc != CUDA_SUCCESS) {
        *on = p->side;
    }
    cm_pool_unlock(p, &gd);
    return rc != CUDA_SUCCESS ? rc : after;
}

/* The pool manager's foreign_free: block handle's event is recorded when
 * it is freed (cm_pool_put), never later on a handle that may be gone. */
void
cm_pool_foreign_free(cm_context *ctx, uintptr_t handle)
{
    cm_pool *p;
    cm_blk *b;
    cm_gil_saved gd;

    if (cm_gpool_handle(handle)) {
        cm_gpool_foreign_free(ctx, handle);
        return;
    }
    p = cm_pool_of(ctx, handle, &b);
    if (p == NULL) {
        return;
    }
    cm_pool_lock(p, &gd);
    if (!p->dead) {
        b->record_now = 1;
    }
    cm_pool_unlock(p, &gd);
}

/* The async manager's foreign_free: only its graph pools' blocks need
 * it (cuMemFreeAsync takes the stream when it is issued). */
void
cm_async_foreign_free(cm_context *ctx, uintptr_t handle)
{
    if (cm_gpool_handle(handle)) {
        cm_gpool_foreign_free(ctx, handle);
    }
}

/* The pool manager's stream_gone: free blocks that wait for stream h
 * to reach their release get an event recorded on it now. */
static void
cm_pool_stream_gone_one(cm_pool *p, CUstream h)
{
    uintptr_t s = cm_stream_key(h);
    cm_seg *g;
    cm_blk *b;
    cm_gil_saved gd;

    if (p == NULL || cm_stream_handle_is_default(h)) {
        return;
    }
    cm_pool_lock(p, &gd);
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
    cm_pool_unlock(p, &gd);
}

void
cm_pool_stream_gone(cm_context *ctx, CUstream h)
{
    cm_pool *p = ctx->pool;

    if (p != NULL && p->peers != NULL) {
        cm_pool_stream_gone_one(p->peers, h);
    }
    cm_pool_stream_gone_one(p, h);
}
