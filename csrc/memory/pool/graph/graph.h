/* SPDX-License-Identifier: MIT */
/*
 * memory/pool/graph/graph.h: the public header of the room
 * memory/pool/graph/, graph-private pools, as the memory managers
 * (memory/default.c, memory/pool/poolops.c), the release queue
 * (memory/release.c), the allocation path (memory/memory.c) and
 * PyTorch's allocator (memory/interop.c) call them.
 * The room owns one file:
 * - gpool.c: graph pools, their capsules and their retirement.
 *
 * Locks and the GIL, in brief: a graph pool's state is guarded by the
 * mutex of its private pool (taken plainly with cm_mu_lock: no holder
 * makes a driver call or waits for the GIL); the list of graph pools by
 * a process-wide mutex, cm_gpool_mu, taken before any pool's, never
 * after.  Every function here may run with or without the GIL unless it
 * says so.
 */
#ifndef CM_GPOOL_H
#define CM_GPOOL_H

#include "memory/memory.h"

/* A graph pool: the memory allocations made during a capture get. */
typedef struct cm_gpool cm_gpool;

/* The low bit of an allocation's handle says it is a graph pool's block
 * (a block struct is aligned; the managers' own handles, device
 * addresses and blocks, have it clear). */
#define CM_GPOOL_TAG ((uintptr_t)1)

static inline int
cm_gpool_handle(uintptr_t h)
{
    return (h & CM_GPOOL_TAG) != 0;
}

/* The graph pool of ctx that an allocation for stream goes to, or NULL:
 * none while cudamem captures nothing (one relaxed atomic load). */
cm_gpool *cm_gpool_for(cm_context *ctx, CUstream stream);

/* The graph pool of the capture another library began on stream h (of
 * ctx), made on first need, or NULL when h does not capture (or is
 * cudamem's own capture).  One cuStreamGetCaptureInfo, except for the
 * default streams, which never capture: for the adapters (CuPy's and
 * PyTorch's allocations through cudamem), whose streams cudamem does not
 * see begin a capture.  Such a pool is kept until ctx closes: cudamem
 * cannot see when the other library's graph goes. */
cm_gpool *cm_gpool_foreign(cm_context *ctx, CUstream h);

/* Send this thread's allocations to gp until cm_gpool_force(NULL). */
void cm_gpool_force(cm_gpool *gp);

/* Allocate size bytes for stream from gp (ctx current, GIL held; it is
 * released around cuMemAlloc, made in the relaxed capture mode).  The
 * handle is tagged (CM_GPOOL_TAG).  A new segment counts against the
 * device's limit until the pool retires. */
CUresult cm_gpool_alloc(cm_context *ctx, cm_gpool *gp, size_t size,
                        CUstream stream, CUdeviceptr *ptr,
                        uintptr_t *handle);

/* Give the block of tagged handle back to its graph pool (ctx current);
 * sync: the release could not be ordered on its streams (a *_SYNC
 * release): the context is waited for first.  Retires the pool when
 * this was its last block and its handle is gone. */
CUresult cm_gpool_release(cm_context *ctx, uintptr_t handle, int sync);

/* The block of tagged handle was allocated for a stream cudamem may not
 * hear the end of: it is not reused for that stream key again. */
void cm_gpool_foreign_free(cm_context *ctx, uintptr_t handle);

/* Stream h of ctx is about to be destroyed: free blocks of its graph
 * pools kept for h are not reused (the handle may come back as another
 * stream's). */
void cm_gpools_stream_gone(cm_context *ctx, CUstream h);

/* Add the bytes ctx's graph pools hold, and how many of them are free. */
void cm_gpools_stats(cm_context *ctx, size_t *reserved, size_t *free_b);

/* Module functions and upcalls; 0, or -1 with an exception (GIL). */
int cm_gpool_init(PyObject *mod);

#endif /* CM_GPOOL_H */
