/* SPDX-License-Identifier: MIT */
/*
 * sim/stream.c: the simulator's stream and event entry points.
 *
 * Locks and the GIL: every entry point (and cm_sim_launch_checked) takes
 * sim.lock after SIM_ENTER and gives it back before returning; no other
 * lock.  cuStreamSynchronize and cuEventSynchronize wait with sim_wait,
 * which releases sim.lock on sim.cond (refused on a worker); the others
 * never wait.  The GIL is never taken nor given up here: a caller that
 * holds it keeps it across a wait, as across the driver's.
 */
#include "driver/cu_table.h"
#include "sim/sim.h"
#include "sim/capture.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* Streams                                                             */
/* ------------------------------------------------------------------ */

CUresult
sim_StreamCreate(CUstream *phStream, unsigned int Flags)
{
    sim_ctx *c;
    sim_stream *s;
    CUresult rc;

    SIM_ENTER(StreamCreate);
    if (phStream == NULL || (Flags & ~(unsigned int)CU_STREAM_NON_BLOCKING)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS) {
        s = sim_stream_new(c, Flags ? SIM_STREAM_NONBLOCKING
                                    : SIM_STREAM_BLOCKING);
        if (s == NULL) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
        else if (sim_set_add(&sim.streams, s) != 0) {
            sim_stream_destroy(s);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
        else {
            *phStream = (CUstream)(void *)s;
        }
    }
    sim_unlock();
    return rc;
}

CUresult
sim_StreamDestroy(CUstream hStream)
{
    CUresult rc = CUDA_SUCCESS;

    SIM_ENTER(StreamDestroy);
    sim_lock();
    if (hStream == NULL || hStream == CU_STREAM_LEGACY
        || hStream == CU_STREAM_PER_THREAD) {
        /* The default streams cannot be destroyed. */
        rc = CUDA_ERROR_INVALID_HANDLE;
    }
    else if (!sim_set_has(&sim.streams, hStream)) {
        sim_unlock();
        sim_fatal("cuStreamDestroy of %p, not a live stream: the driver "
                  "would crash here", (void *)hStream);
    }
    else {
        sim_stream_destroy((sim_stream *)(void *)hStream);
    }
    sim_unlock();
    return rc;
}

CUresult
sim_StreamSynchronize(CUstream hStream)
{
    sim_stream *s;
    CUresult rc;

    SIM_ENTER(StreamSynchronize);
    sim_lock();
    rc = sim_stream_get(hStream, &s);
    if (rc == CUDA_SUCCESS && s->cap != NULL) {
        /* A capturing stream has nothing to wait for: refused, and the
         * capture is invalidated. */
        sim_capture_invalidate(s);
        rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (rc == CUDA_SUCCESS) {
        rc = sim_capture_legacy(s, 1);
    }
    if (rc == CUDA_SUCCESS) {
        /* A wait for a stream that does not capture: potentially
         * unsafe, as the driver has it (refused on an H200 from a thread
         * other than the one capturing in global mode). */
        rc = sim_capture_unsafe();
    }
    if (rc == CUDA_SUCCESS) {
        rc = sim_wait(s, s->submitted);
    }
    if (rc == CUDA_SUCCESS) {
        sim_mempools_settle();
    }
    sim_unlock();
    return rc;
}

CUresult
sim_StreamQuery(CUstream hStream)
{
    sim_stream *s;
    CUresult rc;

    SIM_ENTER(StreamQuery);
    sim_lock();
    rc = sim_stream_get(hStream, &s);
    if (rc == CUDA_SUCCESS && s->cap != NULL) {
        sim_capture_invalidate(s);
        rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (rc == CUDA_SUCCESS) {
        rc = sim_capture_legacy(s, 1);
    }
    if (rc == CUDA_SUCCESS) {
        /* A query of a stream that does not capture: potentially
         * unsafe, as the driver has it. */
        rc = sim_capture_unsafe();
    }
    if (rc == CUDA_SUCCESS && s->completed < s->submitted) {
        rc = CUDA_ERROR_NOT_READY;
    }
    sim_unlock();
    return rc;
}

/* Whether an event's last record is done (or it was never recorded). */
static int
sim_event_done(const sim_event *e)
{
    return e->rec_stream == NULL || e->rec_stream->completed >= e->rec_ticket;
}

CUresult
sim_StreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    sim_stream *s;
    sim_event *e;
    sim_op *op;
    CUresult rc;

    SIM_ENTER(StreamWaitEvent);
    if (Flags != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    rc = sim_stream_get(hStream, &s);
    if (rc == CUDA_SUCCESS && !sim_event_known(hEvent)) {
        rc = CUDA_ERROR_INVALID_HANDLE;
    }
    if (rc == CUDA_SUCCESS) {
        rc = sim_capture_legacy(s, 1);
    }
    if (rc == CUDA_SUCCESS) {
        e = (sim_event *)(void *)hEvent;
        if (s->cap != NULL || sim_event_captured(e)) {
            rc = sim_capture_wait(s, e);
        }
        else if (!sim_event_done(e)) {
            op = sim_op_new(SIM_OP_NOP);
            if (op == NULL
                || sim_op_dep(op, e->rec_stream, e->rec_ticket) != 0) {
                if (op != NULL) {
                    sim_op_free(op);
                }
                rc = CUDA_ERROR_OUT_OF_MEMORY;
            }
            else {
                rc = sim_enqueue(s, op);
            }
        }
    }
    sim_unlock();
    return rc;
}

/* Queue a host function or callback op on stream h. */
static CUresult
sim_host_op(CUstream h, sim_op *op)
{
    sim_stream *s;
    CUresult rc;

    if (op == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    sim_lock();
    rc = sim_stream_get(h, &s);
    if (rc == CUDA_SUCCESS) {
        rc = sim_enqueue(s, op);
    }
    else {
        sim_op_free(op);
    }
    sim_unlock();
    return rc;
}

CUresult
sim_StreamAddCallback(CUstream hStream, CUstreamCallback callback,
                      void *userData, unsigned int flags)
{
    sim_op *op;

    SIM_ENTER(StreamAddCallback);
    if (callback == NULL || flags != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    op = sim_op_new(SIM_OP_CALLBACK);
    if (op != NULL) {
        op->u.callback.fn = callback;
        op->u.callback.handle = hStream;
        op->u.callback.data = userData;
    }
    return sim_host_op(hStream, op);
}

CUresult
sim_LaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData)
{
    sim_op *op;

    SIM_ENTER(LaunchHostFunc);
    if (fn == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    op = sim_op_new(SIM_OP_HOSTFN);
    if (op != NULL) {
        op->u.hostfn.fn = fn;
        op->u.hostfn.data = userData;
    }
    return sim_host_op(hStream, op);
}

/* A kernel recorded into a capture waits, on the driver, while a host
 * function of its context runs on another stream, until a capture with
 * a kernel has ended in the context: on an H100 (CUDA 13.0,
 * tools/hostfn_probe.py) an NVRTC kernel and cudamem's kernel copy
 * recorded into a capture blocked behind a held host function, first or
 * after eager launches, and neither did once a capture of a kernel
 * (launched or not, the same kernel or another) had ended (graph.c sets
 * the context's kwarm then).  Whether the first kernel's record alone
 * lifts it is not known: the simulator waits until such a capture
 * ends, and for host functions queued as well as running (the driver's
 * line between the two is not known either).  A host function that
 * waits for the capturing thread makes that a hang on a GPU; here a
 * wait past CUDAMEM_SIM_CAPTURE_WAIT_S seconds aborts with the reason.
 * Lock held; a wait gives it up, so the caller looks its stream up
 * again when this returns 1. */
int
sim_capture_kernel_wait(sim_ctx *c)
{
    struct timespec until;
    int64_t start;

    if (c->hostfns == 0 || tls_worker != NULL || c->kwarm) {
        return 0;
    }
    start = sim_now_ns();
    while (c->hostfns > 0 && !c->kwarm) {
        if (sim_now_ns() - start > (int64_t)sim.capture_wait_s * 1000000000) {
            sim_fatal("a kernel recorded into a capture has waited %ld s for "
                      "a host function queued or running on another stream "
                      "of its context: the driver makes the first kernels "
                      "of captures in a context wait so, and on a GPU this "
                      "program would hang here", sim.capture_wait_s);
        }
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 50000000;
        if (until.tv_nsec >= 1000000000) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&sim.cond, &sim.lock, &until);
    }
    return 1;
}

/* cudamem's internal kernels on the simulator: a host function that
 * reads and writes device memory, queued only once every range it
 * touches lies inside one live allocation, as a copy's sides must.  The
 * check and the enqueue share one hold of the lock, and frees wait for
 * queued work, so the memory outlives the function. */
CUresult
cm_sim_launch_checked(CUstream h, CUhostFn fn, void *data, size_t size,
                      int nranges, const uintptr_t *start, const size_t *len)
{
    sim_stream *s;
    sim_op *op;
    CUresult rc = CUDA_SUCCESS;
    int i;

    SIM_ENTER(LaunchHostFunc);
    if (fn == NULL || nranges < 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    op = sim_op_new(SIM_OP_HOSTFN);
    if (op == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    op->u.hostfn.fn = fn;
    op->u.hostfn.data = data;
    op->u.hostfn.once = size == 0;
    op->u.hostfn.kernel = 1;
    if (size > 0) {
        op->u.hostfn.owned = malloc(size);
        if (op->u.hostfn.owned == NULL) {
            sim_op_free(op);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        memcpy(op->u.hostfn.owned, data, size);
        op->u.hostfn.data = op->u.hostfn.owned;
        op->u.hostfn.size = size;
    }
    sim_lock();
    rc = sim_stream_get(h, &s);
    if (rc == CUDA_SUCCESS && s->cap != NULL
        && sim_capture_kernel_wait(s->ctx)) {
        rc = sim_stream_get(h, &s);
    }
    /* VMM memory and pool memory must be accessible to the stream's
     * device. */
    for (i = 0; i < nranges && rc == CUDA_SUCCESS; i++) {
        if (len[i] > 0
            && sim_range_kernel(start[i], len[i], s->ctx->dev) == NULL) {
            rc = CUDA_ERROR_INVALID_VALUE;
        }
    }
    if (rc == CUDA_SUCCESS) {
        if (s->cap != NULL) {
            rc = sim_capture_record(s, op, nranges, start, len);
        }
        else {
            rc = sim_enqueue(s, op);
        }
    }
    else {
        sim_op_free(op);
    }
    sim_unlock();
    return rc;
}

/* cudamem's batches of small copies in a capture (context/kbatch.c).
 * *seq 0: as cm_sim_launch_checked on a capturing stream (size > 0),
 * and *seq and *capid name the node recorded.  Else the node *seq of
 * the capture *capid gets these data and ranges in place of its own, as
 * cuGraphKernelNodeSetParams changes a node the driver captured, where
 * that node is the last the stream recorded and the stream has joined
 * no later work since (its only dependency, as the driver's capture
 * info would say); CUDA_ERROR_NOT_FOUND, nothing changed, where not.
 * A stream that is not capturing: CUDA_ERROR_ILLEGAL_STATE. */
CUresult
cm_sim_kbatch(CUstream h, CUhostFn fn, const void *data, size_t size,
              int nranges, const uintptr_t *start, const size_t *len,
              uint64_t *seq, uint64_t *capid)
{
    sim_stream *s;
    sim_node *n;
    sim_op *op;
    void *copy;
    CUresult rc;
    int i;

    SIM_ENTER(LaunchHostFunc);
    if (fn == NULL || size == 0 || nranges < 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    copy = malloc(size);
    if (copy == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memcpy(copy, data, size);
    sim_lock();
    rc = sim_stream_get(h, &s);
    if (rc == CUDA_SUCCESS && *seq == 0 && s->cap != NULL
        && sim_capture_kernel_wait(s->ctx)) {
        rc = sim_stream_get(h, &s);
    }
    if (rc == CUDA_SUCCESS && s->cap == NULL) {
        rc = CUDA_ERROR_ILLEGAL_STATE;
    }
    if (rc == CUDA_SUCCESS && s->cap->invalidated) {
        rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    n = NULL;
    if (rc == CUDA_SUCCESS && *seq != 0) {
        if (*capid == s->cap->id && s->cap_tip == *seq) {
            for (n = s->cap->head; n != NULL && n->seq != *seq;
                 n = n->next) {
            }
        }
        if (n == NULL || n->op->kind != SIM_OP_HOSTFN
            || n->op->u.hostfn.fn != fn) {
            rc = CUDA_ERROR_NOT_FOUND;
        }
    }
    for (i = 0; i < nranges && rc == CUDA_SUCCESS; i++) {
        if (len[i] > 0
            && sim_range_kernel(start[i], len[i], s->ctx->dev) == NULL) {
            rc = CUDA_ERROR_INVALID_VALUE;
        }
    }
    if (*seq != 0) {
        if (rc != CUDA_SUCCESS) {
            /* Not changed. */
        }
        else if (sim_node_set_ranges(n, NULL, nranges, start, len) < 0) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
        else {
            free(n->op->u.hostfn.owned);
            n->op->u.hostfn.owned = copy;
            n->op->u.hostfn.data = copy;
            n->op->u.hostfn.size = size;
            copy = NULL;
        }
        sim_unlock();
        free(copy);
        return rc;
    }
    if (rc == CUDA_SUCCESS) {
        op = sim_op_new(SIM_OP_HOSTFN);
        if (op == NULL) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
        else {
            op->u.hostfn.fn = fn;
            op->u.hostfn.once = 0;
            op->u.hostfn.kernel = 1;
            op->u.hostfn.owned = copy;
            op->u.hostfn.data = copy;
            op->u.hostfn.size = size;
            copy = NULL;
            rc = sim_capture_record(s, op, nranges, start, len);
            if (rc == CUDA_SUCCESS) {
                *seq = s->cap->nops;
                *capid = s->cap->id;
            }
        }
    }
    sim_unlock();
    free(copy);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Events                                                              */
/* ------------------------------------------------------------------ */

CUresult
sim_EventCreate(CUevent *phEvent, unsigned int Flags)
{
    sim_ctx *c;
    sim_event *e;
    CUresult rc;

    SIM_ENTER(EventCreate);
    if (phEvent == NULL
        || (Flags & ~(unsigned int)(CU_EVENT_BLOCKING_SYNC
                                    | CU_EVENT_DISABLE_TIMING
                                    | CU_EVENT_INTERPROCESS))) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if ((Flags & CU_EVENT_INTERPROCESS)
        && !(Flags & CU_EVENT_DISABLE_TIMING)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS) {
        e = calloc(1, sizeof(*e));
        if (e == NULL) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
        else if (sim_set_add(&sim.events, e) != 0) {
            free(e);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
        else {
            e->ctx = c;
            e->flags = Flags;
            e->refs = 1;
            *phEvent = (CUevent)(void *)e;
        }
    }
    sim_unlock();
    return rc;
}

CUresult
sim_EventRecord(CUevent hEvent, CUstream hStream)
{
    sim_stream *s;
    sim_event *e;
    sim_op *op;
    CUresult rc = CUDA_SUCCESS;

    SIM_ENTER(EventRecord);
    sim_lock();
    if (!sim_event_known(hEvent)) {
        rc = CUDA_ERROR_INVALID_HANDLE;
    }
    if (rc == CUDA_SUCCESS) {
        rc = sim_stream_get(hStream, &s);
    }
    if (rc == CUDA_SUCCESS) {
        e = (sim_event *)(void *)hEvent;
        if (s->cap != NULL) {
            rc = sim_capture_event_record(s, e);
        }
        else if (s->ctx != e->ctx) {
            rc = CUDA_ERROR_INVALID_HANDLE;
        }
        else if ((op = sim_op_new(SIM_OP_RECORD)) == NULL) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
        else {
            e->refs++;
            op->u.record.event = e;
            op->u.record.seq = ++e->seq;
            rc = sim_enqueue(s, op);
            if (rc == CUDA_SUCCESS) {
                s->refs++;
                if (e->rec_stream != NULL) {
                    sim_stream_unref(e->rec_stream);
                }
                e->rec_stream = s;
                e->rec_ticket = s->submitted;
                e->cap_id = 0;
                if (e->cap_src != NULL) {
                    sim_stream_unref(e->cap_src);
                    e->cap_src = NULL;
                }
            }
        }
    }
    sim_unlock();
    return rc;
}

CUresult
sim_EventQuery(CUevent hEvent)
{
    CUresult rc = CUDA_SUCCESS;

    SIM_ENTER(EventQuery);
    sim_lock();
    if (!sim_event_known(hEvent)) {
        rc = CUDA_ERROR_INVALID_HANDLE;
    }
    else if (sim_event_captured((sim_event *)(void *)hEvent)) {
        rc = sim_capture_event_refuse((sim_event *)(void *)hEvent);
    }
    else if ((rc = sim_capture_unsafe()) != CUDA_SUCCESS) {
        /* A query of an ordinary event: potentially unsafe. */
    }
    else if (!sim_event_done((sim_event *)(void *)hEvent)) {
        rc = CUDA_ERROR_NOT_READY;
    }
    sim_unlock();
    return rc;
}

CUresult
sim_EventSynchronize(CUevent hEvent)
{
    sim_event *e;
    CUresult rc = CUDA_SUCCESS;

    SIM_ENTER(EventSynchronize);
    sim_lock();
    if (!sim_event_known(hEvent)) {
        rc = CUDA_ERROR_INVALID_HANDLE;
    }
    else {
        e = (sim_event *)(void *)hEvent;
        if (sim_event_captured(e)) {
            rc = sim_capture_event_refuse(e);
        }
        else if ((rc = sim_capture_unsafe()) != CUDA_SUCCESS) {
            /* A wait for an ordinary event: potentially unsafe, as its
             * query is. */
        }
        else if (e->rec_stream != NULL) {
            rc = sim_wait(e->rec_stream, e->rec_ticket);
        }
        if (rc == CUDA_SUCCESS) {
            sim_mempools_settle();
        }
    }
    sim_unlock();
    return rc;
}

CUresult
sim_EventDestroy(CUevent hEvent)
{
    sim_event *e;
    CUresult rc = CUDA_SUCCESS;

    SIM_ENTER(EventDestroy);
    sim_lock();
    if (!sim_event_known(hEvent)) {
        rc = CUDA_ERROR_INVALID_HANDLE;
    }
    else {
        e = (sim_event *)(void *)hEvent;
        sim_set_del(&sim.events, e);
        e->destroyed = 1;
        sim_event_unref(e);
    }
    sim_unlock();
    return rc;
}

CUresult
sim_EventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    sim_event *a, *b;
    CUresult rc = CUDA_SUCCESS;

    SIM_ENTER(EventElapsedTime);
    if (pMilliseconds == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    if (!sim_event_known(hStart) || !sim_event_known(hEnd)) {
        rc = CUDA_ERROR_INVALID_HANDLE;
    }
    else {
        a = (sim_event *)(void *)hStart;
        b = (sim_event *)(void *)hEnd;
        if (sim_event_captured(a) || sim_event_captured(b)) {
            rc = sim_capture_event_refuse(sim_event_captured(a) ? a : b);
        }
        else if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING
            || a->rec_stream == NULL || b->rec_stream == NULL) {
            rc = CUDA_ERROR_INVALID_HANDLE;
        }
        else if (!sim_event_done(a) || !sim_event_done(b)) {
            rc = CUDA_ERROR_NOT_READY;
        }
        else {
            *pMilliseconds = (float)((double)(b->time_ns - a->time_ns) / 1e6);
        }
    }
    sim_unlock();
    return rc;
}
