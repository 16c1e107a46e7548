/* SPDX-License-Identifier: MIT */
/*
 * sim/capture.c: the captures in progress (sim.captures) as the queue
 * sees them: an operation queued on a capturing stream is recorded
 * instead of run (sim_capture_record), a use of the legacy stream while
 * a blocking stream captures is refused (sim_capture_legacy), and a
 * destroyed stream leaves its capture (sim_capture_stream_gone).  Split
 * from sim/graph.c, which owns the rest of capture (its entry points and
 * rules, and the graphs) and explains the model, so that sim/queue.c
 * calls down into it.  Every function here runs with the simulator lock
 * (sim.lock) held and takes no lock itself.
 */
#include "driver/cu_table.h"
#include "sim/sim.h"
#include "sim/capture.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

static int sim_op_ranges(const sim_op *op, uintptr_t *start, size_t *len);

/* Free a list of recorded operations. */
void
sim_nodes_free(sim_node *n)
{
    sim_node *next;

    for (; n != NULL; n = next) {
        next = n->next;
        sim_op_free(n->op);
        free(n->start);
        free(n->len);
        free(n);
    }
}

int
sim_node_set_ranges(sim_node *n, sim_op *op, int nranges,
                    const uintptr_t *start, const size_t *len)
{
    int room = nranges > 2 ? nranges : 2;
    uintptr_t *st = malloc((size_t)room * sizeof(*st));
    size_t *ln = malloc((size_t)room * sizeof(*ln));
    int used = 0;
    int k;

    if (st == NULL || ln == NULL) {
        free(st);
        free(ln);
        return -1;
    }
    if (nranges < 0) {
        used = sim_op_ranges(op, st, ln);
    }
    else {
        for (k = 0; k < nranges; k++) {
            if (len[k] > 0) {
                st[used] = start[k];
                ln[used] = len[k];
                used++;
            }
        }
    }
    free(n->start);
    free(n->len);
    n->start = st;
    n->len = ln;
    n->nranges = used;
    return 0;
}

/* Take every stream out of cap, unlink and free it. */
void
sim_capture_free(sim_capture *cap)
{
    sim_capture **pp;
    sim_stream *s;

    for (s = cap->ctx->streams; s != NULL; s = s->next) {
        if (s->cap == cap) {
            s->cap = NULL;
        }
    }
    for (pp = &sim.captures; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == cap) {
            *pp = cap->next;
            break;
        }
    }
    sim_nodes_free(cap->head);
    sim_stream_unref(cap->origin);
    free(cap);
}

/* Where a copy or memset touches registered memory (device, managed or
 * page-locked host): up to two ranges; how many. */
static int
sim_op_ranges(const sim_op *op, uintptr_t *start, size_t *len)
{
    uintptr_t p[2];
    size_t span;
    int i, n = 0;

    if (op->kind == SIM_OP_SET) {
        start[0] = (uintptr_t)op->u.set.dst;
        len[0] = op->u.set.n;
        return 1;
    }
    if (op->kind != SIM_OP_COPY) {
        return 0;
    }
    span = (op->u.copy.depth - 1) * op->u.copy.dslice
           + (op->u.copy.height - 1) * op->u.copy.dpitch + op->u.copy.width;
    p[0] = (uintptr_t)op->u.copy.dst;
    p[1] = (uintptr_t)op->u.copy.src;
    for (i = 0; i < 2; i++) {
        if (i == 1) {
            span = (op->u.copy.depth - 1) * op->u.copy.sslice
                   + (op->u.copy.height - 1) * op->u.copy.spitch
                   + op->u.copy.width;
        }
        if (span > 0 && sim_range(p[i], span) != NULL) {
            start[n] = p[i];
            len[n] = span;
            n++;
        }
    }
    return n;
}

CUresult
sim_capture_record(sim_stream *s, sim_op *op, int nranges,
                   const uintptr_t *start, const size_t *len)
{
    sim_capture *cap = s->cap;
    sim_node *n;
    size_t i;
    int refuse;

    if (cap->invalidated) {
        sim_op_free(op);
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    switch (op->kind) {
    case SIM_OP_NOP:
        /* Ordering only: the record order keeps it. */
        sim_op_free(op);
        return CUDA_SUCCESS;
    case SIM_OP_SET:
        refuse = 0;
        break;
    case SIM_OP_COPY:
        /* A snapshot of pageable bytes is not what a graph replays. */
        refuse = op->u.copy.owned != NULL;
        break;
    case SIM_OP_HOSTFN:
        /* A one-shot host function cannot be replayed. */
        refuse = op->u.hostfn.once;
        break;
    default:
        /* Stream callbacks (and records, which never come here). */
        refuse = 1;
        break;
    }
    if (refuse) {
        sim_op_free(op);
        cap->invalidated = 1;
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    /* Its dependencies are on work outside the capture (the graph has
     * none) or inside it, which comes earlier in record order. */
    for (i = 0; i < op->ndeps; i++) {
        sim_stream_unref(op->deps[i].stream);
    }
    free(op->deps);
    op->deps = NULL;
    op->ndeps = 0;
    op->capdeps = 0;
    n = calloc(1, sizeof(*n));
    if (n == NULL) {
        sim_op_free(op);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (sim_node_set_ranges(n, op, nranges, start, len) < 0) {
        free(n);
        sim_op_free(op);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    n->op = op;
    n->seq = cap->nops + 1;
    if (cap->tail != NULL) {
        cap->tail->next = n;
    }
    else {
        cap->head = n;
    }
    cap->tail = n;
    cap->nops++;
    s->cap_tip = cap->nops;
    s->cap_joined = 0;
    return CUDA_SUCCESS;
}

CUresult
sim_capture_legacy(const sim_stream *s, int invalidate)
{
    sim_stream *t;
    int found = 0;

    if (s->kind != SIM_STREAM_LEGACY || sim.captures == NULL) {
        return CUDA_SUCCESS;
    }
    for (t = s->ctx->streams; t != NULL; t = t->next) {
        if (t->cap != NULL && sim_blocking(t)) {
            found = 1;
            if (invalidate) {
                t->cap->invalidated = 1;
            }
        }
    }
    return found ? CUDA_ERROR_STREAM_CAPTURE_IMPLICIT : CUDA_SUCCESS;
}

void
sim_capture_stream_gone(sim_stream *s)
{
    sim_capture *cap = s->cap;

    if (cap == NULL) {
        return;
    }
    if (cap->origin == s) {
        sim_capture_free(cap);
        return;
    }
    s->cap = NULL;
    cap->invalidated = 1;
}
