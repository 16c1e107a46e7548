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

/* Before an order records events on own and the n streams: whether one
 * of them captures, whoever began the capture (one driver call each).
 * An event recorded there would join that graph (and a wait on it the
 * waiting stream), and its query would be refused.  Then *on is that
 * stream (the legacy one named as such) and the release, made after the
 * context, waits in the queue until the stream no longer captures:
 * CUDA_ERROR_NOT_READY; else CUDA_SUCCESS. */
static CUresult
cm_release_waits_for(CUstream own, const CUstream *streams, int n,
                     CUstream *on)
{
    CUstream h;
    int i;

    for (i = 0; i <= n; i++) {
        h = i < n ? streams[i] : own;
        if (cm_pool_stream_in_capture(h)) {
            *on = h != NULL ? h : CU_STREAM_LEGACY;
            return CUDA_ERROR_NOT_READY;
        }
    }
    return CUDA_SUCCESS;
}

/* The pool manager's order: record an event on each of the n streams,
 * and on own unless it is a default stream, so that block handle is
 * handed out again only once all of them have completed.  CUDA_SUCCESS:
 * a block whose event cannot be recorded is never reused (trim() gives
 * its segment back); CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, nothing
 * recorded, when one of them is a stream cudamem knows captures (the
 * caller's release then waits for the context, after the capture);
 * CUDA_ERROR_NOT_READY when one of them captures for another library
 * (cm_release_waits_for). */
CUresult
cm_pool_order(cm_context *ctx, uintptr_t handle, CUstream own,
              const CUstream *streams, int n, CUstream *on)
{
    cm_pool *p;
    cm_blk *b;
    CUevent e;
    int i;
    cm_gil_saved gd;

    (void)on;
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
    if (cm_release_waits_for(own, streams, n, on) != CUDA_SUCCESS) {
        return CUDA_ERROR_NOT_READY;
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
        e = cm_event_on(p, h);
        if (e == NULL || cm_blk_add_wait(b, e) < 0) {
            /* Nothing can order a later user after that stream: the
             * block is never handed out again (trim() frees it). */
            cm_event_put(p, e);
            cm_blk_drop_waits(p, b);
            b->stream = CM_POOL_STUCK;
            b->any_after = 0;
            cm_pool_unlock(p, &gd);
            return CUDA_SUCCESS;
        }
        if (i == n) {
            b->any_after = 1;
        }
    }
    cm_pool_unlock(p, &gd);
    return CUDA_SUCCESS;
}

/* The async manager's order: *on becomes the pool's own side stream, on
 * which a free follows the work queued so far on own and on each of the
 * n streams, without making any of them wait for another. */
CUresult
cm_async_order(cm_context *ctx, uintptr_t handle, CUstream own,
               const CUstream *streams, int n, CUstream *on)
{
    cm_pool *p = ctx->pool;
    CUresult rc = CUDA_SUCCESS;
    CUevent e;
    int i;
    cm_gil_saved gd;

    if (cm_gpool_handle(handle)) {
        /* A graph pool records no events: released after the context. */
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (p == NULL || p->dead) {
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    }
    if (cm_release_waits_for(own, streams, n, on) != CUDA_SUCCESS) {
        return CUDA_ERROR_NOT_READY;
    }
    cm_pool_lock(p, &gd);
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
    cm_pool_unlock(p, &gd);
    return rc;
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
