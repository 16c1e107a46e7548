/* SPDX-License-Identifier: MIT */
/*
 * memory/pool/segment.c: giving a pool's segments back to the driver, whether
 * cuMemAlloc'd or arenas of virtual memory (memory/pool/vmm/arena.c), for the
 * pool and async managers (poolops.c) and the graph pools
 * (memory/pool/graph/gpool.c).
 *
 * Locks and the GIL: runs with no pool mutex held and without the GIL;
 * the segments were unlinked from their pool under its mutex first.
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
