/* SPDX-License-Identifier: MIT */
/*
 * memory/pool/vmm/vmm.h: the public header of the room memory/pool/vmm/,
 * the pool manager's segments on virtual memory, as the files of
 * memory/pool/ call them.
 * The room owns, lowest first:
 * - share.c: each pool's table of exported pages (IPC);
 * - arena.c: arenas, their pages' physical memory and the release
 *   threshold.
 *
 * Locks and the GIL, in brief: the page tables and the table of exported
 * pages are guarded by the pool's mutex mu, never held across a mapping
 * or export call; those run under the pool's vmu, taken with the GIL
 * given up and before mu, so one thread at a time changes mappings.
 */
#ifndef CM_ARENA_H
#define CM_ARENA_H

#include "memory/pool/pool.h"

/* One reservation of virtual addresses, cut into pages of the device's
 * allocation granularity; a page has physical memory mapped in while a
 * block in use covers it, and may keep it (idle) after. */
struct cm_arena {
    CUdeviceptr base;     /* the reservation */
    size_t size;          /* bytes, a multiple of the page size */
    size_t npages;
    CUmemGenericAllocationHandle *h;   /* the memory mapped at page i
                                        * (access granted), or 0 */
    uint32_t *users;      /* blocks in use or pending over page i */
    size_t hi;            /* 1 + the highest page ever mapped */
};

/* CUDAMEM_POOL_VMM: pools made from now on put their segments on
 * virtual memory (where the device can). */
extern int cm_vmm_env;

/* Read CUDAMEM_POOL_VMM and CUDAMEM_POOL_RELEASE_THRESHOLD (at import);
 * 0, or -1 with ValueError naming the variable. */
int cm_arena_env(void);

/* Decide whether p (the pool manager's) puts its segments on virtual
 * memory (CUDAMEM_POOL_VMM and what the device can do) and with which
 * page size and release threshold.  0, or -1 with an exception. */
int cm_arena_setup(cm_context *ctx, cm_pool *p);

/* The first and last page of block b of an arena (mutex held). */
static inline void
cm_arena_pages(const cm_pool *p, const cm_blk *b, size_t *first,
               size_t *last)
{
    CUdeviceptr base = b->seg->arena->base;

    *first = (size_t)(b->ptr - base) >> p->gshift;
    *last = (size_t)(b->ptr + b->size - 1 - base) >> p->gshift;
}

/* Whether every page of [ptr, ptr + size) of arena a has memory mapped
 * (mutex held). */
static inline int
cm_arena_range_backed(const cm_pool *p, const cm_arena *a, CUdeviceptr ptr,
                      size_t size)
{
    size_t i = (size_t)(ptr - a->base) >> p->gshift;
    size_t e = (size_t)(ptr + size - 1 - a->base) >> p->gshift;

    for (; i <= e; i++) {
        if (a->h[i] == 0) {
            return 0;
        }
    }
    return 1;
}

/* Whether every page of block b has memory mapped (mutex held). */
static inline int
cm_arena_backed(const cm_pool *p, const cm_blk *b)
{
    const cm_arena *a = b->seg->arena;
    size_t i;
    size_t e;

    cm_arena_pages(p, b, &i, &e);
    for (; i <= e; i++) {
        if (a->h[i] == 0) {
            return 0;
        }
    }
    return 1;
}

/* Block b of an arena is now in use / free: count it on its pages
 * (mutex held); the pool's idle pages, their low-water mark and whether
 * a release pass is due follow. */
static inline void
cm_arena_use(cm_pool *p, const cm_blk *b)
{
    cm_arena *a = b->seg->arena;
    size_t i;
    size_t e;

    p->arena_used += b->size;
    cm_arena_pages(p, b, &i, &e);
    for (; i <= e; i++) {
        if (a->users[i]++ == 0 && a->h[i] != 0) {
            p->idle_pages--;
        }
    }
    if (p->idle_pages < p->idle_low) {
        p->idle_low = p->idle_pages;
    }
    if (p->arena_used > p->peak_used) {
        p->peak_used = p->arena_used;
    }
}

static inline void
cm_arena_unuse(cm_pool *p, const cm_blk *b)
{
    cm_arena *a = b->seg->arena;
    size_t i;
    size_t e;

    p->arena_used -= b->size;
    cm_arena_pages(p, b, &i, &e);
    for (; i <= e; i++) {
        if (--a->users[i] == 0 && a->h[i] != 0) {
            p->idle_pages++;
        }
    }
    if ((p->idle_pages << p->gshift) > p->keep) {
        p->release_due = 1;
    }
}

/* The largest request p serves without memory from the device: its
 * idle pages (moved where needed), or a free block all of whose pages
 * are mapped, whichever is larger (mutex held). */
size_t cm_arena_largest(const cm_pool *p);

/* Whether no block of size bytes can be backed at all, wherever it is
 * cut: more pages without memory than the idle ones (which may move
 * there) and the new memory the limits allow can fill (mutex held).
 * Asked before a block is cut, so that a refused request of many pages
 * costs no walk over them. */
int cm_arena_cannot_serve(cm_context *ctx, const cm_pool *p, size_t size);

/* Map memory into the pages of block b (in use) that have none: idle
 * pages that are quiet move there, new ones are made for the rest.  No
 * mutex held; with or without the GIL.  On failure b stays in use, for
 * the caller to give back. */
CUresult cm_arena_back(cm_context *ctx, cm_pool *p, cm_blk *b);

/* Open p's memory to device dev (another device's context was given
 * peer access to p's: cuCtxEnablePeerAccess does not cover virtual
 * memory): every page mapped now, and every page mapped from now on,
 * gets read-write access for dev.  No mutex held, GIL held; 0, or -1
 * with an exception. */
int cm_arena_open(cm_pool *p, int dev);

/* Reserve a new arena for small or large blocks, of at least size
 * bytes, as a wholly free segment.  No mutex held; GIL either. */
CUresult cm_arena_add(cm_context *ctx, cm_pool *p, size_t size, int small);

/* Give idle pages back to the device, quiet ones only (their last
 * users' work done).  With wait (trim): until at most keep bytes of them
 * are left, after another thread's mapping.  Without: a pass, at most
 * one per release interval and none while another thread maps, that
 * gives back what stayed idle since the last pass beyond keep.  No mutex held; GIL either.  The
 * first driver error, or CUDA_SUCCESS. */
CUresult cm_arena_release(cm_context *ctx, cm_pool *p, size_t keep,
                          int wait);

/* Unmap and release an arena segment's pages and its reservation and
 * free it (no mutex, no GIL, ctx current); with no driver (a dead
 * context) only the host memory is freed. */
CUresult cm_arena_free_seg(cm_context *ctx, cm_seg *g, int driver);

/* share.c: the descriptors of exported pages. */

/* Forget page h's exported descriptor (its memory is being given back):
 * the descriptor, for the caller to close, or -1 when h had none (mutex
 * held). */
int cm_vshare_take(cm_pool *p, CUmemGenericAllocationHandle h);

/* Close every exported descriptor of p and free the table (p is dead:
 * no mutex needed). */
void cm_vshare_close(cm_pool *p);

#endif /* CM_ARENA_H */
