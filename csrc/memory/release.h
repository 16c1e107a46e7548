/* SPDX-License-Identifier: MIT */
/*
 * memory/release.h: a release queue's layout (release.c).  Private to
 * memory/: shared by release.c and memory.c only (the allocation path
 * and memory_stats() read it).  Guarded by the GIL, as release.c says.
 */
#ifndef CM_MEMORY_RELEASE_H
#define CM_MEMORY_RELEASE_H

#include "memory/memory.h"

/* One queued release. */
typedef struct {
    int kind;             /* CM_REL_* */
    uintptr_t handle;     /* the driver handle, address or pool block */
    size_t size;          /* bytes it counts for (0 if none) */
    CUstream stream;      /* CM_REL_POOL / CM_REL_ASYNC: the stream;
                           * CM_REL_*_SYNC: NULL, or a stream whose
                           * capture the release waits for;
                           * CM_REL_*_AFTER: the stream that captured at
                           * the order */
} cm_pending_item;

struct cm_pending {
    PyObject_HEAD
    cm_context *ctx;      /* strong: flushes run in it */
    cm_pending_item *items;  /* FIFO, items[0] oldest */
    Py_ssize_t n;         /* entries */
    Py_ssize_t cap;       /* allocated entries */
    size_t bytes;         /* sum of sizes */
    int disabled;         /* defer_cleanup() nesting depth */
    int has_byte_limit;   /* memory queues flush on bytes too */
    int held;             /* a flush left entries queued because a
                           * capture forbade them (cm_rel_waits) */
    Py_ssize_t stuck;     /* of them, those the last flush tried and
                           * kept (their streams captured): the
                           * thresholds count the others */
    size_t stuck_bytes;   /* their sizes */
    long since_try;       /* releases made at once since the last
                           * retry of the kept ones */
};

#endif
