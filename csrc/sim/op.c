/* SPDX-License-Identifier: MIT */
/*
 * sim/op.c: the simulator's operations (made, made to wait on a ticket of
 * another stream, freed) and the reference counts that keep streams and
 * events alive while a handle, a worker, an operation's dependency or a
 * pending record still names them.  Split from sim/queue.c so that what
 * sits below the queue (the captures) can use them.  Callers hold the
 * simulator lock (sim.lock) wherever a count changes; making an
 * operation, or freeing one that holds no reference, needs none.
 * Nothing here takes a lock.
 */
#include "driver/cu_table.h"
#include "sim/sim.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

/* Whether s takes part in the legacy default stream's implicit sync. */
int
sim_blocking(const sim_stream *s)
{
    return s->kind == SIM_STREAM_BLOCKING || s->kind == SIM_STREAM_PER_THREAD;
}

void
sim_stream_unref(sim_stream *s)
{
    if (--s->refs > 0) {
        return;
    }
    if (s->prev != NULL) {
        s->prev->next = s->next;
    }
    else {
        s->ctx->streams = s->next;
    }
    if (s->next != NULL) {
        s->next->prev = s->prev;
    }
    pthread_cond_destroy(&s->cv);
    free(s);
}

void
sim_event_unref(sim_event *e)
{
    if (--e->refs > 0) {
        return;
    }
    if (e->rec_stream != NULL) {
        sim_stream_unref(e->rec_stream);
    }
    if (e->cap_src != NULL) {
        sim_stream_unref(e->cap_src);
    }
    free(e);
}

sim_op *
sim_op_new(int kind)
{
    sim_op *op = calloc(1, sizeof(*op));

    if (op != NULL) {
        op->kind = kind;
    }
    return op;
}

/* Make op wait for ticket on s; 0, or -1 when out of memory. */
int
sim_op_dep(sim_op *op, sim_stream *s, uint64_t ticket)
{
    if (s->completed >= ticket) {
        return 0;
    }
    if (op->ndeps == op->capdeps) {
        size_t cap = op->capdeps ? op->capdeps * 2 : 4;
        sim_dep *v = realloc(op->deps, cap * sizeof(*v));
        if (v == NULL) {
            return -1;
        }
        op->deps = v;
        op->capdeps = cap;
    }
    op->deps[op->ndeps].stream = s;
    op->deps[op->ndeps].ticket = ticket;
    op->ndeps++;
    s->refs++;
    return 0;
}

void
sim_op_free(sim_op *op)
{
    size_t i;

    for (i = 0; i < op->ndeps; i++) {
        sim_stream_unref(op->deps[i].stream);
    }
    free(op->deps);
    if (op->kind == SIM_OP_RECORD && op->u.record.event != NULL) {
        sim_event_unref(op->u.record.event);
    }
    if (op->kind == SIM_OP_COPY) {
        free(op->u.copy.owned);
    }
    if (op->kind == SIM_OP_HOSTFN) {
        free(op->u.hostfn.owned);
    }
    free(op);
}
