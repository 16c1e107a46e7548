/* SPDX-License-Identifier: MIT */
/*
 * sim/graph.c: stream capture and graphs in the simulator.  Owns the
 * captures in progress (sim.captures, each with the operations it has
 * recorded), the graphs that cuStreamEndCapture makes of them and the
 * executable graphs instantiated from those (both in sim.graphs; the
 * CUgraph and CUgraphExec handles are their addresses).  Every field is
 * guarded by the simulator lock (sim.lock): the entry points take it, the
 * helpers named in sim.h run with it held.  A thread's capture
 * interaction mode (cuThreadExchangeStreamCaptureMode) is thread-local.
 * What the queue asks of a capture (recording an operation, the legacy
 * stream's rule, a destroyed stream leaving) is sim/capture.c's, below
 * the queue; sim/capture.h holds the types the two files share.
 *
 * The model.  A capture records, in the order they are issued, the
 * copies, memsets and host functions queued on its streams (the origin
 * and every stream that joined it by waiting on an event recorded in
 * it); the order they were issued in is a topological order of the
 * driver's graph, so a launch replays them one after another on the
 * launch stream, with the pointers and values they were captured with.
 * An event recorded in a capture records no work: it marks the point a
 * wait on it joins.  The driver's refusals are modelled: synchronising
 * or querying a capturing stream, its context or a captured event; any
 * use of the legacy stream while a blocking stream of its context
 * captures (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT); potentially unsafe calls
 * (synchronous copies and memsets, allocations, frees, registrations,
 * and the queries of an ordinary event or of a stream that does not
 * capture: cuEventQuery, cuStreamQuery) under the capture modes' rules
 * (sim_capture_unsafe: such a call fails with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, invalidating the captures that
 * forbid it, while the calling thread itself captures in global or
 * thread-local mode, or another thread captures in global mode and the
 * calling thread's interaction mode, cuThreadExchangeStreamCaptureMode,
 * is global; a relaxed thread is never forbidden); ending a capture
 * from another stream, another thread (unless relaxed) or with a joined
 * stream not joined back; a graph's launch or upload into a capturing
 * stream.  Each invalidates the capture as the driver does, and
 * cuStreamEndCapture then answers CUDA_ERROR_STREAM_CAPTURE_INVALIDATED.
 *
 * What it does not model it refuses, never pretends: a pageable-source
 * copy (the simulator snapshots those bytes at the call, the driver's
 * graph reads them at each launch), stream callbacks and cudamem's
 * one-shot host functions (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
 * invalidating the capture), waits on an event recorded outside the
 * capture (CUDA_ERROR_STREAM_CAPTURE_ISOLATION), memory-pool
 * allocations and frees in a capture, the graph and node outputs of
 * cuStreamGetCaptureInfo, instantiation flags and a graph launched in
 * another context (CUDA_ERROR_NOT_SUPPORTED, or the error named at each
 * case below).  A launch whose recorded device or page-locked ranges are
 * no longer allocated fails with CUDA_ERROR_INVALID_VALUE where the
 * driver would write into freed memory.
 *
 * Locks and the GIL: every entry point, and sim_capture_check_unsafe, takes
 * sim.lock and gives it back before returning; no other lock, and nothing
 * here waits.  The GIL is never taken nor given up here.
 */
#include "driver/cu_table.h"
#include "sim/sim.h"
#include "sim/capture.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A graph (from cuStreamEndCapture) or an executable graph. */
struct sim_graph {
    int exec;               /* a CUgraphExec, else a CUgraph */
    sim_ctx *ctx;           /* the context it was captured in */
    sim_node *head;         /* its operations in replay order */
    sim_node *tail;         /* the last */
};

/* This thread's capture interaction mode. */
static _Thread_local int sim_thread_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

/* A copy of op to queue or keep; NULL when out of memory. */
static sim_op *
sim_op_dup(const sim_op *op)
{
    sim_op *d = sim_op_new(op->kind);

    if (d == NULL) {
        return NULL;
    }
    d->u = op->u;
    if (op->kind == SIM_OP_HOSTFN && op->u.hostfn.owned != NULL) {
        d->u.hostfn.owned = malloc(op->u.hostfn.size);
        if (d->u.hostfn.owned == NULL) {
            free(d);
            return NULL;
        }
        memcpy(d->u.hostfn.owned, op->u.hostfn.owned, op->u.hostfn.size);
        d->u.hostfn.data = d->u.hostfn.owned;
    }
    return d;
}

/* Copies of the nodes from n on, appended to *head / *tail; 0, or -1
 * when out of memory (what was copied stays on the list). */
static int
sim_nodes_dup(const sim_node *n, sim_node **head, sim_node **tail)
{
    sim_node *d;

    for (; n != NULL; n = n->next) {
        d = malloc(sizeof(*d));
        if (d == NULL) {
            return -1;
        }
        *d = *n;
        d->next = NULL;
        d->start = NULL;
        d->len = NULL;
        if (sim_node_set_ranges(d, NULL, n->nranges, n->start, n->len)
            < 0) {
            free(d);
            return -1;
        }
        d->op = sim_op_dup(n->op);
        if (d->op == NULL) {
            free(d->start);
            free(d->len);
            free(d);
            return -1;
        }
        if (*tail != NULL) {
            (*tail)->next = d;
        }
        else {
            *head = d;
        }
        *tail = d;
    }
    return 0;
}

/* The live capture numbered id, or NULL. */
static sim_capture *
sim_capture_find(uint64_t id)
{
    sim_capture *cap;

    for (cap = sim.captures; cap != NULL; cap = cap->next) {
        if (cap->id == id) {
            return cap;
        }
    }
    return NULL;
}

CUresult
sim_capture_unsafe(void)
{
    sim_capture *cap;
    pthread_t self;
    int bad = 0;

    if (sim.captures == NULL
        || sim_thread_mode == CU_STREAM_CAPTURE_MODE_RELAXED
        || tls_worker != NULL) {
        return CUDA_SUCCESS;
    }
    self = pthread_self();
    for (cap = sim.captures; cap != NULL; cap = cap->next) {
        if (cap->mode == CU_STREAM_CAPTURE_MODE_RELAXED) {
            continue;
        }
        if (pthread_equal(cap->thread, self)
            || (cap->mode == CU_STREAM_CAPTURE_MODE_GLOBAL
                && sim_thread_mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
            cap->invalidated = 1;
            bad = 1;
        }
    }
    return bad ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

CUresult
sim_capture_sync_call(void)
{
    sim_stream *legacy;
    CUresult rc;

    if (sim.captures == NULL) {
        return CUDA_SUCCESS;
    }
    if (!atomic_load(&sim_per_thread)) {
        rc = sim_stream_get(CU_STREAM_LEGACY, &legacy);
        if (rc != CUDA_SUCCESS) {
            return rc;
        }
        rc = sim_capture_legacy(legacy, 1);
        if (rc != CUDA_SUCCESS) {
            return rc;
        }
    }
    return sim_capture_unsafe();
}

CUresult
sim_capture_check_unsafe(void)
{
    CUresult rc;

    sim_lock();
    rc = sim_capture_unsafe();
    sim_unlock();
    return rc;
}

CUresult
sim_capture_ctx_sync(const sim_ctx *c)
{
    sim_capture *cap;
    int bad = 0;

    for (cap = sim.captures; cap != NULL; cap = cap->next) {
        if (cap->ctx == c) {
            cap->invalidated = 1;
            bad = 1;
        }
    }
    return bad ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

void
sim_capture_invalidate(sim_stream *s)
{
    if (s->cap != NULL) {
        s->cap->invalidated = 1;
    }
}

void
sim_capture_drop_ctx(const sim_ctx *c)
{
    sim_capture *cap, *next;

    for (cap = sim.captures; cap != NULL; cap = next) {
        next = cap->next;
        if (cap->ctx == c) {
            sim_capture_free(cap);
        }
    }
}

int
sim_event_captured(const sim_event *e)
{
    return e->cap_id != 0;
}

CUresult
sim_capture_event_refuse(const sim_event *e)
{
    sim_capture *cap = sim_capture_find(e->cap_id);

    if (cap != NULL) {
        cap->invalidated = 1;
    }
    return CUDA_ERROR_CAPTURED_EVENT;
}

CUresult
sim_capture_event_record(sim_stream *s, sim_event *e)
{
    sim_capture *cap = s->cap;

    if (cap->invalidated) {
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    if (s->ctx != e->ctx) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    s->refs++;
    if (e->cap_src != NULL) {
        sim_stream_unref(e->cap_src);
    }
    e->cap_src = s;
    e->cap_id = cap->id;
    e->cap_pos = s->cap_tip;
    return CUDA_SUCCESS;
}

CUresult
sim_capture_wait(sim_stream *s, sim_event *e)
{
    sim_capture *ec = e->cap_id != 0 ? sim_capture_find(e->cap_id) : NULL;
    sim_stream *src = e->cap_src;

    if (e->cap_id != 0 && ec == NULL) {
        /* Recorded in a capture that has ended: what a wait on it means
         * is not modelled. */
        if (s->cap != NULL) {
            s->cap->invalidated = 1;
        }
        return CUDA_ERROR_CAPTURED_EVENT;
    }
    if (s->cap == NULL) {
        /* s joins the capture the event was recorded in. */
        if (ec->invalidated) {
            return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        }
        if (s->kind == SIM_STREAM_LEGACY) {
            ec->invalidated = 1;
            return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        }
        if (s->ctx != ec->ctx) {
            return CUDA_ERROR_NOT_SUPPORTED;
        }
        s->cap = ec;
        s->cap_tip = e->cap_pos;
        s->cap_joined = 0;
        return CUDA_SUCCESS;
    }
    if (s->cap->invalidated) {
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    if (ec == NULL) {
        if (e->rec_stream == NULL) {
            return CUDA_SUCCESS;    /* never recorded: waits for nothing */
        }
        /* An event of work outside the capture. */
        s->cap->invalidated = 1;
        return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
    }
    if (ec != s->cap) {
        ec->invalidated = 1;
        s->cap->invalidated = 1;
        return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
    }
    if (src != NULL && src != s && src->cap == ec
        && e->cap_pos >= src->cap_tip) {
        src->cap_joined = 1;
    }
    if (e->cap_pos > s->cap_tip) {
        s->cap_tip = e->cap_pos;
    }
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* Entry points                                                        */
/* ------------------------------------------------------------------ */

CUresult
sim_StreamBeginCapture(CUstream hStream, CUstreamCaptureMode mode)
{
    sim_capture *cap;
    sim_stream *s;
    CUresult rc;

    SIM_ENTER(StreamBeginCapture);
    if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL
        && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        && mode != CU_STREAM_CAPTURE_MODE_RELAXED) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    rc = sim_stream_get(hStream, &s);
    if (rc == CUDA_SUCCESS && s->kind == SIM_STREAM_LEGACY) {
        /* The legacy stream cannot capture. */
        rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    else if (rc == CUDA_SUCCESS && s->cap != NULL) {
        rc = CUDA_ERROR_ILLEGAL_STATE;
    }
    if (rc == CUDA_SUCCESS) {
        cap = calloc(1, sizeof(*cap));
        if (cap == NULL) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
        else {
            cap->id = ++sim.next_cap_id;
            cap->mode = (int)mode;
            cap->origin = s;
            s->refs++;
            cap->ctx = s->ctx;
            cap->thread = pthread_self();
            cap->next = sim.captures;
            sim.captures = cap;
            s->cap = cap;
            s->cap_tip = 0;
            s->cap_joined = 1;
        }
    }
    sim_unlock();
    return rc;
}

/* A capture whose nodes start at head ended in context c: if one is a
 * kernel, kernels recorded into later captures there no longer wait for
 * host functions (sim_capture_kernel_wait, stream.c). */
static void
sim_ctx_warm_graph(sim_ctx *c, const sim_node *head)
{
    for (; head != NULL && !c->kwarm; head = head->next) {
        c->kwarm = head->op->kind == SIM_OP_HOSTFN
                   && head->op->u.hostfn.kernel;
    }
}

CUresult
sim_StreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    sim_capture *cap;
    sim_stream *s, *t;
    sim_graph *g;
    CUresult rc;

    SIM_ENTER(StreamEndCapture);
    if (phGraph == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    rc = sim_stream_get(hStream, &s);
    if (rc != CUDA_SUCCESS) {
        goto out;
    }
    cap = s->cap;
    if (cap == NULL) {
        rc = CUDA_ERROR_ILLEGAL_STATE;
        goto out;
    }
    if (cap->origin != s) {
        cap->invalidated = 1;
        rc = CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
        goto out;
    }
    if (cap->mode != CU_STREAM_CAPTURE_MODE_RELAXED
        && !pthread_equal(cap->thread, pthread_self())) {
        rc = CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
        goto out;
    }
    *phGraph = NULL;
    if (cap->invalidated) {
        rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    for (t = cap->ctx->streams; t != NULL && rc == CUDA_SUCCESS;
         t = t->next) {
        if (t->cap == cap && t != s && !t->cap_joined) {
            rc = CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
        }
    }
    if (rc == CUDA_SUCCESS) {
        g = calloc(1, sizeof(*g));
        if (g == NULL || sim_set_add(&sim.graphs, g) != 0) {
            free(g);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
        else {
            g->ctx = cap->ctx;
            g->head = cap->head;
            g->tail = cap->tail;
            sim_ctx_warm_graph(g->ctx, g->head);
            cap->head = NULL;
            cap->tail = NULL;
            *phGraph = (CUgraph)(void *)g;
        }
    }
    /* Ended either way: its streams leave capture. */
    sim_capture_free(cap);
out:
    sim_unlock();
    return rc;
}

/* s's capture status. */
static CUstreamCaptureStatus
sim_capture_status(const sim_stream *s)
{
    if (s->cap == NULL) {
        return CU_STREAM_CAPTURE_STATUS_NONE;
    }
    return s->cap->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                               : CU_STREAM_CAPTURE_STATUS_ACTIVE;
}

CUresult
sim_StreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    sim_stream *s;
    CUresult rc;

    SIM_ENTER(StreamIsCapturing);
    if (captureStatus == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    rc = sim_stream_get(hStream, &s);
    if (rc == CUDA_SUCCESS) {
        rc = sim_capture_legacy(s, 0);
    }
    if (rc == CUDA_SUCCESS) {
        *captureStatus = sim_capture_status(s);
    }
    sim_unlock();
    return rc;
}

CUresult
sim_StreamGetCaptureInfo(CUstream hStream,
                         CUstreamCaptureStatus *captureStatus_out,
                         cuuint64_t *id_out, CUgraph *graph_out,
                         const CUgraphNode **dependencies_out,
                         const CUgraphEdgeData **edgeData_out,
                         size_t *numDependencies_out)
{
    sim_stream *s;
    CUresult rc;

    SIM_ENTER(StreamGetCaptureInfo);
    if (captureStatus_out == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (graph_out != NULL || dependencies_out != NULL || edgeData_out != NULL
        || numDependencies_out != NULL) {
        /* The simulator keeps no graph nodes to hand out. */
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    sim_lock();
    rc = sim_stream_get(hStream, &s);
    if (rc == CUDA_SUCCESS) {
        rc = sim_capture_legacy(s, 0);
    }
    if (rc == CUDA_SUCCESS) {
        *captureStatus_out = sim_capture_status(s);
        if (id_out != NULL && s->cap != NULL) {
            *id_out = s->cap->id;
        }
    }
    sim_unlock();
    return rc;
}

CUresult
sim_ThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    int old;

    SIM_ENTER(ThreadExchangeStreamCaptureMode);
    if (mode == NULL
        || (*mode != CU_STREAM_CAPTURE_MODE_GLOBAL
            && *mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
            && *mode != CU_STREAM_CAPTURE_MODE_RELAXED)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    old = sim_thread_mode;
    sim_thread_mode = (int)*mode;
    *mode = (CUstreamCaptureMode)old;
    return CUDA_SUCCESS;
}

/* The graph (exec 0) or executable graph (exec 1) handle h names: NULL
 * is refused; an unknown handle would crash the driver. */
static sim_graph *
sim_graph_get(const void *h, int exec)
{
    sim_graph *g;

    if (h == NULL) {
        return NULL;
    }
    if (!sim_set_has(&sim.graphs, h)) {
        sim_fatal("graph handle %p is not a live graph: the driver would "
                  "crash here", h);
    }
    g = (sim_graph *)h;
    if (g->exec != exec) {
        sim_fatal("graph handle %p is a %s, not a %s: the driver would "
                  "crash here", h, g->exec ? "CUgraphExec" : "CUgraph",
                  exec ? "CUgraphExec" : "CUgraph");
    }
    return g;
}

CUresult
sim_GraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                              unsigned long long flags)
{
    sim_graph *g, *x;
    CUresult rc = CUDA_SUCCESS;

    SIM_ENTER(GraphInstantiateWithFlags);
    if (phGraphExec == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (flags != 0) {
        /* Auto-free, device launch, upload and priority: not modelled. */
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    sim_lock();
    g = sim_graph_get(hGraph, 0);
    if (g == NULL) {
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    else if (g->ctx->destroyed) {
        rc = CUDA_ERROR_CONTEXT_IS_DESTROYED;
    }
    else if ((x = calloc(1, sizeof(*x))) == NULL) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    else {
        x->exec = 1;
        x->ctx = g->ctx;
        if (sim_nodes_dup(g->head, &x->head, &x->tail) != 0
            || sim_set_add(&sim.graphs, x) != 0) {
            sim_nodes_free(x->head);
            free(x);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
        else {
            *phGraphExec = (CUgraphExec)(void *)x;
        }
    }
    sim_unlock();
    return rc;
}

/* Where exec x may run on stream h: *sp. */
static CUresult
sim_graph_target(CUgraphExec h, CUstream hs, sim_graph **xp,
                 sim_stream **sp)
{
    CUresult rc;

    *xp = sim_graph_get(h, 1);
    if (*xp == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if ((*xp)->ctx->destroyed) {
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    }
    rc = sim_stream_get(hs, sp);
    if (rc != CUDA_SUCCESS) {
        return rc;
    }
    if ((*sp)->ctx != (*xp)->ctx) {
        /* A graph of one context launched in another: not modelled. */
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    return sim_capture_legacy(*sp, 1);
}

CUresult
sim_GraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    sim_graph *x;
    sim_stream *s;
    sim_node *n;
    sim_op *op;
    CUresult rc;
    int k;

    SIM_ENTER(GraphLaunch);
    sim_lock();
    rc = sim_graph_target(hGraphExec, hStream, &x, &s);
    if (rc == CUDA_SUCCESS && s->cap != NULL) {
        /* The driver refuses a graph's launch into a capture (an H100,
         * CUDA 13.0). */
        sim_capture_invalidate(s);
        rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    for (n = rc == CUDA_SUCCESS ? x->head : NULL; n != NULL; n = n->next) {
        for (k = 0; k < n->nranges && rc == CUDA_SUCCESS; k++) {
            if (sim_range(n->start[k], n->len[k]) == NULL) {
                /* Freed since the capture: the driver would use freed
                 * memory. */
                rc = CUDA_ERROR_INVALID_VALUE;
            }
        }
    }
    for (n = rc == CUDA_SUCCESS ? x->head : NULL;
         n != NULL && rc == CUDA_SUCCESS; n = n->next) {
        op = sim_op_dup(n->op);
        rc = op == NULL ? CUDA_ERROR_OUT_OF_MEMORY : sim_enqueue(s, op);
    }
    sim_unlock();
    return rc;
}

CUresult
sim_GraphUpload(CUgraphExec hGraphExec, CUstream hStream)
{
    sim_graph *x;
    sim_stream *s;
    CUresult rc;

    SIM_ENTER(GraphUpload);
    sim_lock();
    rc = sim_graph_target(hGraphExec, hStream, &x, &s);
    if (rc == CUDA_SUCCESS && s->cap != NULL) {
        sim_capture_invalidate(s);            /* as a launch there */
        rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    sim_unlock();
    return rc;
}

/* Free graph h of kind exec. */
static CUresult
sim_graph_destroy(const void *h, int exec)
{
    sim_graph *g;
    CUresult rc = CUDA_SUCCESS;

    sim_lock();
    g = sim_graph_get(h, exec);
    if (g == NULL) {
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    else if (exec && (rc = sim_capture_unsafe()) != CUDA_SUCCESS) {
        /* A potentially unsafe call under the capture modes' rule: an
         * H200 refuses cuGraphExecDestroy during a global capture. */
    }
    else {
        sim_set_del(&sim.graphs, g);
        sim_nodes_free(g->head);
        free(g);
    }
    sim_unlock();
    return rc;
}

CUresult
sim_GraphDestroy(CUgraph hGraph)
{
    SIM_ENTER(GraphDestroy);
    return sim_graph_destroy(hGraph, 0);
}

CUresult
sim_GraphExecDestroy(CUgraphExec hGraphExec)
{
    SIM_ENTER(GraphExecDestroy);
    return sim_graph_destroy(hGraphExec, 1);
}
