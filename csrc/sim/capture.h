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
    uintptr_t *start;       /* first byte of each range (malloc'd, room
                             * for at least 2) */
    size_t *len;            /* bytes of each range (likewise) */
    uint64_t seq;           /* its place in record order, from 1 */
    sim_node *next;         /* the next node in replay order */
};

/* Set n's ranges to the nranges of start / len with bytes in them
 * (nranges < 0: op's own, sim_op_ranges); 0, or -1 when out of memory
 * (n unchanged). */
int sim_node_set_ranges(sim_node *n, sim_op *op, int nranges,
                        const uintptr_t *start, const size_t *len);

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
