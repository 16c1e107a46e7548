/* SPDX-License-Identifier: MIT */
/*
 * memory/pool/segment.c: giving a pool's segments back to the driver, whether
 * cuMemAlloc'd or arenas of virtual memory (memory/pool/vmm/arena.c), for the
 * pool and async managers (poolops.c) and the graph pools
 * (memory/pool/graph/gpool.c).
 *
 * A close keeps the segments of its context's pools until no other thread
 * can queue work on them (cm_pool_dead).
 *
 * Locks and the GIL: runs with no pool mutex held and without the GIL;
 * the segments were unlinked from their pool under its mutex first.
 * cm_pool_dead is called with the GIL held (the closing thread's).
 */
#include "memory/pool/pool.h"
#include "memory/pool/vmm/vmm.h"

#include <stdlib.h>

/* cuMemFree every segment of a list of ctx's pool and free the list (no
 * mutex, no GIL); the segments no longer count against the limit.  The
 * first error, or CUDA_SUCCESS. */
CUresult
cm_segs_release(cm_context *ctx, cm_seg *g)
{
    CUresult first = CUDA_SUCCESS;
    CUresult rc;
    cm_seg *next;

    for (; g != NULL; g = next) {
        next = g->next;
        if (g->arena != NULL) {
            rc = cm_arena_free_seg(ctx, g, 1);
            if (first == CUDA_SUCCESS) {
                first = rc;
            }
            continue;
        }
        rc = CM_CU_RAW(MemFree, (g->base));
        cm_limit_give(ctx, g->size);
        if (first == CUDA_SUCCESS) {
            first = rc;
        }
        free(g);
    }
    return first;
}

void
cm_pool_dead(cm_context *ctx)
{
    cm_pool *p = ctx->pool;
    cm_seg *late[2] = {NULL, NULL};
    int pushed = 0;

    if (p == NULL) {
        return;
    }
    late[0] = p->late;
    p->late = NULL;
    if (p->peers != NULL) {
        late[1] = p->peers->late;
        p->peers->late = NULL;
    }
    if (late[0] == NULL && late[1] == NULL) {
        return;
    }
    CM_DRIVER_BEGIN_NOGIL
    (void)cm_ctx_enter(ctx->handle, &pushed);
    /* cuMemUnmap does not wait for the work queued on the pages. */
    (void)CM_CU_RAW(CtxSynchronize, ());
    (void)cm_segs_release(ctx, late[0]);
    (void)cm_segs_release(ctx, late[1]);
    cm_ctx_leave(pushed);
    CM_DRIVER_END_NOGIL
}
