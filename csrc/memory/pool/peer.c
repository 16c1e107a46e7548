/* SPDX-License-Identifier: MIT */
/*
 * memory/pool/peer.c: peer access to the pool and async managers' memory.
 * cuCtxEnablePeerAccess opens a device's cuMemAlloc'd memory to another
 * device, not memory mapped on virtual memory (the pool manager's
 * arenas) nor memory of a stream-ordered pool (the async manager's):
 * when context.c gives another device's context access to this one's
 * (cm_context.peers_in gets its bit), the manager's peer entry (the
 * tables in poolops.c) opens those too: the arena's pages mapped so far
 * and every page mapped later (memory/pool/vmm/arena.c, cm_arena_open),
 * or the driver pool (cuMemPoolSetAccess, which covers what it will
 * hold as well).  A pool made after the grant reads peers_in when it is
 * made (cm_arena_setup, cm_pool_new).
 *
 * Locks and the GIL: called with the GIL held; cm_arena_open gives it
 * up and takes the pool's mapping lock (vmu), then its mutex (mu) only
 * to list the mapped pages; cuMemPoolSetAccess runs with no lock held.
 */
#include "memory/pool/pool.h"
#include "memory/pool/vmm/vmm.h"

#include <string.h>

/* The async manager's driver pool opened to the devices of mask
 * (cuCtxEnablePeerAccess does not reach a stream-ordered pool's memory;
 * cuMemPoolSetAccess covers what it holds and what it will hold).  0, or
 * -1 with an exception. */
int
cm_async_open(cm_pool *p, uint64_t mask)
{
    CUmemAccessDesc d;
    int i;

    for (i = 0; i < CM_MAX_DEVICES && i < 64; i++) {
        if (!((mask >> i) & 1)) {
            continue;
        }
        memset(&d, 0, sizeof(d));
        d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        d.location.id = i;
        d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        if (CM_CU(MemPoolSetAccess, (p->mempool, &d, 1)) < 0) {
            return -1;
        }
    }
    return 0;
}

/* The pool manager's peer: its pages on virtual memory opened to dev
 * (cuMemAlloc'd segments, the peers' pool's included, are the driver's
 * peer access already). */
int
cm_pool_peer(cm_context *ctx, int dev)
{
    cm_pool *p = ctx->pool;

    if (p == NULL || p->dead || !p->vmm) {
        return 0;       /* a pool made later reads ctx->peers_in */
    }
    return cm_arena_open(p, dev);
}

/* The async manager's peer. */
int
cm_async_peer(cm_context *ctx, int dev)
{
    cm_pool *p = ctx->pool;

    if (p == NULL || p->dead) {
        return 0;       /* a pool made later reads ctx->peers_in */
    }
    return cm_async_open(p, (uint64_t)1 << dev);
}
