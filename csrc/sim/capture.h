/* SPDX-License-Identifier: MIT */
/*
 * sim/capture.h: what sim/capture.c and sim/graph.c share about the
 * captures in progress and their recorded operations.  Private to
 * csrc/sim/.  Guarded by the simulator lock (sim.lock), as in graph.c.
 */
#ifndef CM_SIM_CAPTURE_H
#define CM_SIM_CAPTURE_H

#include "sim/sim.h"

#include <pthread.h>
#include <stdint.h>

/* One recorded operation and the ranges it needs allocated at launch. */
typedef struct sim_node sim_node;

struct sim_node {
    sim_op *op;             /* the operation: no deps, never queued */
    int nranges;            /* used entries of start and len */
    uintptr_t start[2];     /* first byte of each range */
    size_t len[2];          /* bytes of each range */
    sim_node *next;         /* the next node in replay order */
};

/* A capture in progress. */
struct sim_capture {
    uint64_t id;            /* its capture id, unique in the process */
    int mode;               /* CU_STREAM_CAPTURE_MODE_* */
    int invalidated;        /* an error invalidated it */
    sim_stream *origin;     /* the stream it began on (a ref) */
    sim_ctx *ctx;           /* the origin's context */
    pthread_t thread;       /* the thread that began it */
    sim_node *head;         /* recorded operations, oldest first */
    sim_node *tail;         /* the newest */
    uint64_t nops;          /* how many were recorded */
    sim_capture *next;      /* link in sim.captures */
};

/* Free a list of recorded operations. */
void sim_nodes_free(sim_node *n);

/* Take every stream out of cap, unlink and free it. */
void sim_capture_free(sim_capture *cap);

#endif /* CM_SIM_CAPTURE_H */
