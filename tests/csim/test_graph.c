/* SPDX-License-Identifier: MIT */
/*
 * test_graph.c: standalone tests of the simulator's stream capture and
 * graphs (csrc/sim/graph.c): recording and replay, the driver's
 * refusals during a capture and the capture modes, and cudamem's
 * batches of small copies (cm_sim_kbatch, csrc/sim/stream.c).  Built and run by
 * tests/csim/Makefile (`make -C tests/csim check`) under ASan+UBSan and
 * under TSan, in one process: each test ends every capture it begins.
 */
#include "csim_check.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


#define N 256

static CUstream stream;     /* a non-blocking stream */
static CUdeviceptr dev;     /* N bytes of device memory */
static unsigned char *pin;  /* N bytes of page-locked host memory */

/* Capture memset + H->D + D->H, replay it several times with the host
 * bytes changed in between. */
static void
test_replay(void)
{
    unsigned char *out;
    CUdeviceptr tmp;
    CUgraph g = NULL;
    CUgraphExec x = NULL;
    CUstreamCaptureStatus st;
    cuuint64_t id = 0;
    int i, r;

    OK(cu.MemHostAlloc((void **)&out, N, 0));
    OK(cu.MemAlloc(&tmp, N));
    OK(cu.StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(cu.StreamIsCapturing(stream, &st));
    CHECK(st == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    OK(cu.StreamGetCaptureInfo(stream, &st, &id, NULL, NULL, NULL, NULL));
    CHECK(st == CU_STREAM_CAPTURE_STATUS_ACTIVE && id != 0);
    EXPECT(cu.StreamGetCaptureInfo(stream, &st, &id, &g, NULL, NULL, NULL),
           CUDA_ERROR_NOT_SUPPORTED);
    OK(cu.MemsetD8Async(dev, 7, N, stream));
    OK(cu.MemcpyHtoDAsync(tmp, pin, N / 2, stream));
    OK(cu.MemcpyDtoDAsync(dev, tmp, N / 2, stream));
    OK(cu.MemcpyDtoHAsync(out, dev, N, stream));
    OK(cu.StreamEndCapture(stream, &g));
    CHECK(g != NULL);
    OK(cu.StreamIsCapturing(stream, &st));
    CHECK(st == CU_STREAM_CAPTURE_STATUS_NONE);
    /* Nothing ran during the capture. */
    CHECK(out[0] == 0);
    OK(cu.GraphInstantiateWithFlags(&x, g, 0));
    EXPECT(cu.GraphInstantiateWithFlags(&x, g, 1), CUDA_ERROR_NOT_SUPPORTED);
    OK(cu.GraphDestroy(g));
    OK(cu.GraphUpload(x, stream));
    for (r = 0; r < 5; r++) {
        memset(pin, 100 + r, N);
        memset(out, 0, N);
        OK(cu.GraphLaunch(x, stream));
        OK(cu.StreamSynchronize(stream));
        for (i = 0; i < N; i++) {
            CHECK(out[i] == (i < N / 2 ? 100 + r : 7));
        }
    }
    /* A recorded range freed since: refused, not a write into freed
     * memory. */
    OK(cu.MemFree(tmp));
    EXPECT(cu.GraphLaunch(x, stream), CUDA_ERROR_INVALID_VALUE);
    OK(cu.GraphExecDestroy(x));
    OK(cu.MemFreeHost(out));
}

/* Synchronising a capturing stream invalidates the capture. */
static void
test_invalidate(void)
{
    CUgraph g = (CUgraph)1;
    CUstreamCaptureStatus st;
    CUevent e;

    OK(cu.StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT(cu.StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL),
           CUDA_ERROR_ILLEGAL_STATE);
    EXPECT(cu.StreamSynchronize(stream),
           CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    OK(cu.StreamIsCapturing(stream, &st));
    CHECK(st == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    EXPECT(cu.MemsetD8Async(dev, 1, N, stream),
           CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    EXPECT(cu.StreamEndCapture(stream, &g),
           CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CHECK(g == NULL);
    EXPECT(cu.StreamEndCapture(stream, &g), CUDA_ERROR_ILLEGAL_STATE);

    /* A synchronous copy during a global capture. */
    OK(cu.StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT(cu.MemcpyHtoD(dev, pin, N), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    EXPECT(cu.StreamEndCapture(stream, &g),
           CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

    /* cuCtxSynchronize during a capture. */
    OK(cu.StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_RELAXED));
    EXPECT(cu.CtxSynchronize(), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    EXPECT(cu.StreamEndCapture(stream, &g),
           CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

    /* A captured event cannot be queried. */
    OK(cu.EventCreate(&e, CU_EVENT_DISABLE_TIMING));
    OK(cu.StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(cu.EventRecord(e, stream));
    EXPECT(cu.EventQuery(e), CUDA_ERROR_CAPTURED_EVENT);
    EXPECT(cu.StreamEndCapture(stream, &g),
           CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    /* Recorded outside a capture again, it is an ordinary event. */
    OK(cu.EventRecord(e, stream));
    OK(cu.EventSynchronize(e));
    OK(cu.EventDestroy(e));

    /* Querying a capturing stream invalidates it too. */
    OK(cu.StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT(cu.StreamQuery(stream), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    EXPECT(cu.StreamEndCapture(stream, &g),
           CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
}

/* The legacy stream while a blocking stream captures. */
static void
test_legacy(void)
{
    CUstream blocking;
    CUgraph g = NULL;
    CUstreamCaptureStatus st;

    OK(cu.StreamCreate(&blocking, 0));
    EXPECT(cu.StreamBeginCapture(CU_STREAM_LEGACY,
                                 CU_STREAM_CAPTURE_MODE_GLOBAL),
           CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    OK(cu.StreamBeginCapture(blocking, CU_STREAM_CAPTURE_MODE_RELAXED));
    /* The status query answers IMPLICIT and leaves the capture valid. */
    EXPECT(cu.StreamIsCapturing(CU_STREAM_LEGACY, &st),
           CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    OK(cu.StreamIsCapturing(blocking, &st));
    CHECK(st == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    /* Relaxed: the synchronous copy passes the mode check, and its use
     * of the legacy stream is refused. */
    EXPECT(cu.MemcpyHtoD(dev, pin, N), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    OK(cu.StreamIsCapturing(blocking, &st));
    CHECK(st == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    EXPECT(cu.StreamEndCapture(blocking, &g),
           CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    /* A non-blocking stream's relaxed capture leaves the legacy stream
     * alone. */
    OK(cu.StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_RELAXED));
    OK(cu.MemcpyHtoD(dev, pin, N));
    OK(cu.StreamSynchronize(CU_STREAM_LEGACY));
    OK(cu.StreamEndCapture(stream, &g));
    OK(cu.GraphDestroy(g));
    OK(cu.StreamDestroy(blocking));
}

/* Fork and join through events; an unjoined stream. */
static void
test_fork_join(void)
{
    CUstream side;
    CUevent fork_ev, join_ev;
    CUgraph g = NULL;
    CUgraphExec x;
    CUstreamCaptureStatus st;
    unsigned char out[N];
    int i;

    OK(cu.StreamCreate(&side, CU_STREAM_NON_BLOCKING));
    OK(cu.EventCreate(&fork_ev, CU_EVENT_DISABLE_TIMING));
    OK(cu.EventCreate(&join_ev, CU_EVENT_DISABLE_TIMING));
    OK(cu.StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(cu.MemsetD8Async(dev, 3, N, stream));
    OK(cu.EventRecord(fork_ev, stream));
    OK(cu.StreamWaitEvent(side, fork_ev, 0));
    OK(cu.StreamIsCapturing(side, &st));
    CHECK(st == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    OK(cu.MemsetD8Async(dev, 4, N / 4, side));
    OK(cu.EventRecord(join_ev, side));
    OK(cu.StreamWaitEvent(stream, join_ev, 0));
    /* Only the origin ends it. */
    EXPECT(cu.StreamEndCapture(side, &g),
           CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
    EXPECT(cu.StreamEndCapture(stream, &g),
           CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

    OK(cu.StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(cu.MemsetD8Async(dev, 3, N, stream));
    OK(cu.EventRecord(fork_ev, stream));
    OK(cu.StreamWaitEvent(side, fork_ev, 0));
    OK(cu.MemsetD8Async(dev, 4, N / 4, side));
    OK(cu.EventRecord(join_ev, side));
    OK(cu.StreamWaitEvent(stream, join_ev, 0));
    OK(cu.StreamEndCapture(stream, &g));
    OK(cu.StreamIsCapturing(side, &st));
    CHECK(st == CU_STREAM_CAPTURE_STATUS_NONE);
    OK(cu.GraphInstantiateWithFlags(&x, g, 0));
    OK(cu.GraphLaunch(x, stream));
    OK(cu.StreamSynchronize(stream));
    OK(cu.MemcpyDtoH(out, dev, N));
    for (i = 0; i < N; i++) {
        CHECK(out[i] == (i < N / 4 ? 4 : 3));
    }
    OK(cu.GraphExecDestroy(x));
    OK(cu.GraphDestroy(g));

    /* Forked and never joined back. */
    OK(cu.StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(cu.EventRecord(fork_ev, stream));
    OK(cu.StreamWaitEvent(side, fork_ev, 0));
    OK(cu.MemsetD8Async(dev, 4, N, side));
    EXPECT(cu.StreamEndCapture(stream, &g),
           CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
    OK(cu.StreamIsCapturing(side, &st));
    CHECK(st == CU_STREAM_CAPTURE_STATUS_NONE);

    /* An event of work outside the capture. */
    OK(cu.EventRecord(fork_ev, side));
    OK(cu.StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT(cu.StreamWaitEvent(stream, fork_ev, 0),
           CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
    EXPECT(cu.StreamEndCapture(stream, &g),
           CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    OK(cu.EventDestroy(fork_ev));
    OK(cu.EventDestroy(join_ev));
    OK(cu.StreamDestroy(side));
}

/* What another thread may do during a capture, by mode. */
typedef struct {
    CUcontext ctx;
    CUstreamCaptureMode mine;   /* the thread's interaction mode */
    CUresult rc;                /* what its cuMemcpyHtoD returned */
} other_arg;

static void *
other_thread(void *p)
{
    other_arg *a = p;
    CUstreamCaptureMode m = a->mine;

    cu.CtxSetCurrent(a->ctx);
    cu.ThreadExchangeStreamCaptureMode(&m);
    a->rc = cu.MemcpyHtoD(dev, pin, N);
    return NULL;
}

static CUresult
in_other_thread(CUcontext ctx, CUstreamCaptureMode mine)
{
    other_arg a = {ctx, mine, CUDA_SUCCESS};
    pthread_t t;

    pthread_create(&t, NULL, other_thread, &a);
    pthread_join(t, NULL);
    return a.rc;
}

static void
test_modes(CUcontext ctx)
{
    CUgraph g = NULL;
    CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;

    /* Another thread's global capture forbids this thread's unsafe call
     * unless this thread is relaxed. */
    OK(cu.StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(in_other_thread(ctx, CU_STREAM_CAPTURE_MODE_RELAXED));
    EXPECT(in_other_thread(ctx, CU_STREAM_CAPTURE_MODE_GLOBAL),
           CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    EXPECT(cu.StreamEndCapture(stream, &g),
           CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    /* A thread-local capture forbids only its own thread's. */
    OK(cu.StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    OK(in_other_thread(ctx, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(cu.StreamEndCapture(stream, &g));
    OK(cu.GraphDestroy(g));
    OK(cu.StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    EXPECT(cu.MemAlloc(&(CUdeviceptr){0}, 16),
           CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    EXPECT(cu.StreamEndCapture(stream, &g),
           CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    /* This thread relaxed: its own capture does not forbid it. */
    OK(cu.ThreadExchangeStreamCaptureMode(&m));
    CHECK(m == CU_STREAM_CAPTURE_MODE_GLOBAL);
    OK(cu.StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(cu.MemcpyHtoD(dev, pin, N));
    OK(cu.StreamEndCapture(stream, &g));
    OK(cu.GraphDestroy(g));
    OK(cu.ThreadExchangeStreamCaptureMode(&m));
    CHECK(m == CU_STREAM_CAPTURE_MODE_RELAXED);
}

/* Opens the gate gate_wait waits at. */
static atomic_int gate_open;

static void CUDA_CB
gate_wait(void *unused)
{
    (void)unused;
    while (!atomic_load(&gate_open)) {
        usleep(100);
    }
}

/* What another thread's queries answered during a capture. */
typedef struct {
    CUcontext ctx;
    CUstreamCaptureMode mine;   /* the thread's interaction mode */
    CUevent ev;                 /* an ordinary event, to query */
    CUstream s;                 /* a stream that does not capture */
    CUresult ev_rc;             /* what its cuEventQuery returned */
    CUresult s_rc;              /* what its cuStreamQuery returned */
} query_arg;

static void *
query_thread(void *p)
{
    query_arg *a = p;
    CUstreamCaptureMode m = a->mine;

    cu.CtxSetCurrent(a->ctx);
    cu.ThreadExchangeStreamCaptureMode(&m);
    a->ev_rc = cu.EventQuery(a->ev);
    a->s_rc = cu.StreamQuery(a->s);
    return NULL;
}

static void
query_in_other_thread(query_arg *a)
{
    pthread_t t;

    pthread_create(&t, NULL, query_thread, a);
    pthread_join(t, NULL);
}

/* cuEventQuery of an ordinary event and cuStreamQuery of a stream that
 * does not capture are potentially unsafe calls: another thread's global
 * capture forbids them (and is invalidated) unless the querying thread is
 * relaxed; another thread's thread-local capture does not. */
static void
test_queries(CUcontext ctx)
{
    CUstream cs;
    CUevent ev;
    CUgraph g = NULL;
    query_arg a;

    OK(cu.StreamCreate(&cs, CU_STREAM_NON_BLOCKING));
    OK(cu.EventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    OK(cu.MemsetD8Async(dev, 3, N, stream));
    OK(cu.EventRecord(ev, stream));
    OK(cu.StreamSynchronize(stream));
    OK(cu.EventQuery(ev));
    OK(cu.StreamQuery(stream));
    /* Another thread's global capture: refused, and invalidated. */
    memset(&a, 0, sizeof(a));
    a.ctx = ctx;
    a.ev = ev;
    a.s = stream;
    a.mine = CU_STREAM_CAPTURE_MODE_GLOBAL;
    OK(cu.StreamBeginCapture(cs, CU_STREAM_CAPTURE_MODE_GLOBAL));
    query_in_other_thread(&a);
    CHECK(a.ev_rc == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CHECK(a.s_rc == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    EXPECT(cu.StreamEndCapture(cs, &g),
           CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    /* Each query alone invalidates it. */
    OK(cu.StreamBeginCapture(cs, CU_STREAM_CAPTURE_MODE_GLOBAL));
    a.s = cs;      /* the capturing stream: refused whatever the mode */
    a.ev_rc = CUDA_SUCCESS;
    query_in_other_thread(&a);
    CHECK(a.ev_rc == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    EXPECT(cu.StreamEndCapture(cs, &g),
           CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    a.s = stream;
    /* The querying thread relaxed: both answer, the capture stays valid. */
    a.mine = CU_STREAM_CAPTURE_MODE_RELAXED;
    OK(cu.StreamBeginCapture(cs, CU_STREAM_CAPTURE_MODE_GLOBAL));
    query_in_other_thread(&a);
    CHECK(a.ev_rc == CUDA_SUCCESS);
    CHECK(a.s_rc == CUDA_SUCCESS);
    OK(cu.MemsetD8Async(dev, 4, N, cs));
    OK(cu.StreamEndCapture(cs, &g));
    OK(cu.GraphDestroy(g));
    /* Work still running reads as not ready, not as a refusal. */
    atomic_store(&gate_open, 0);
    OK(cu.LaunchHostFunc(stream, gate_wait, NULL));
    OK(cu.EventRecord(ev, stream));
    OK(cu.StreamBeginCapture(cs, CU_STREAM_CAPTURE_MODE_GLOBAL));
    query_in_other_thread(&a);
    CHECK(a.ev_rc == CUDA_ERROR_NOT_READY);
    CHECK(a.s_rc == CUDA_ERROR_NOT_READY);
    OK(cu.StreamEndCapture(cs, &g));
    OK(cu.GraphDestroy(g));
    atomic_store(&gate_open, 1);
    OK(cu.StreamSynchronize(stream));
    /* Another thread's thread-local capture does not restrict this
     * thread, even in the global interaction mode ... */
    a.mine = CU_STREAM_CAPTURE_MODE_GLOBAL;
    OK(cu.StreamBeginCapture(cs, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    query_in_other_thread(&a);
    CHECK(a.ev_rc == CUDA_SUCCESS);
    CHECK(a.s_rc == CUDA_SUCCESS);
    OK(cu.StreamEndCapture(cs, &g));
    OK(cu.GraphDestroy(g));
    /* ... but it restricts the capturing thread itself. */
    OK(cu.StreamBeginCapture(cs, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    EXPECT(cu.EventQuery(ev), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    EXPECT(cu.StreamEndCapture(cs, &g),
           CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    OK(cu.StreamBeginCapture(cs, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    EXPECT(cu.StreamQuery(stream), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    EXPECT(cu.StreamEndCapture(cs, &g),
           CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    /* A relaxed capture restricts no one. */
    OK(cu.StreamBeginCapture(cs, CU_STREAM_CAPTURE_MODE_RELAXED));
    OK(cu.EventQuery(ev));
    query_in_other_thread(&a);
    CHECK(a.ev_rc == CUDA_SUCCESS);
    CHECK(a.s_rc == CUDA_SUCCESS);
    OK(cu.StreamEndCapture(cs, &g));
    OK(cu.GraphDestroy(g));
    OK(cu.EventDestroy(ev));
    OK(cu.StreamDestroy(cs));
}

/* A capture whose origin stream is destroyed is discarded. */
static void
test_destroy(void)
{
    CUstream s;
    CUgraph g = NULL;

    OK(cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING));
    OK(cu.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(cu.MemsetD8Async(dev, 1, N, s));
    OK(cu.StreamDestroy(s));
    /* No capture is left to forbid this. */
    OK(cu.MemcpyHtoD(dev, pin, N));
    EXPECT(cu.StreamEndCapture(stream, &g), CUDA_ERROR_ILLEGAL_STATE);
}

/* A batch's host function: adds its one byte to each of its n bytes. */
typedef struct {
    unsigned char *p;
    size_t n;
    unsigned char add;
} kb_arg;

static void CUDA_CB
kb_run(void *arg)
{
    const kb_arg *a = arg;
    size_t i;

    for (i = 0; i < a->n; i++) {
        a->p[i] += a->add;
    }
}

/* cm_sim_kbatch: a node recorded, then changed in place while it is the
 * stream's last and the stream joined nothing since; refused
 * (CUDA_ERROR_NOT_FOUND, nothing changed) once other work was recorded
 * on the stream, or the stream waited on another's later work, or the
 * capture is another one; outside a capture, CUDA_ERROR_ILLEGAL_STATE. */
static void
test_kbatch(void)
{
    CUstream side;
    CUevent ev;
    CUgraph g = NULL;
    CUgraphExec x;
    kb_arg a = {pin, N, 1};
    uintptr_t start = (uintptr_t)pin;
    size_t len = N;
    uint64_t seq = 0, capid = 0, seq2, old_cap;
    int i;

    OK(cu.StreamCreate(&side, CU_STREAM_NON_BLOCKING));
    OK(cu.EventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    EXPECT(cm_sim_kbatch(stream, kb_run, &a, sizeof(a), 1, &start, &len,
                         &seq, &capid), CUDA_ERROR_ILLEGAL_STATE);
    OK(cu.StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(cm_sim_kbatch(stream, kb_run, &a, sizeof(a), 1, &start, &len, &seq,
                     &capid));
    CHECK(seq == 1 && capid != 0);
    /* Joined: the node now adds 2. */
    a.add = 2;
    seq2 = seq;
    OK(cm_sim_kbatch(stream, kb_run, &a, sizeof(a), 1, &start, &len, &seq2,
                     &capid));
    CHECK(seq2 == seq);
    /* Another stream forks from it and comes back: still the only
     * dependency when the join is at the node itself. */
    OK(cu.EventRecord(ev, stream));
    OK(cu.StreamWaitEvent(side, ev, 0));
    OK(cu.EventRecord(ev, side));
    OK(cu.StreamWaitEvent(stream, ev, 0));
    a.add = 3;
    OK(cm_sim_kbatch(stream, kb_run, &a, sizeof(a), 1, &start, &len, &seq2,
                     &capid));
    /* Work on the side stream, joined back: refused. */
    OK(cu.EventRecord(ev, stream));
    OK(cu.StreamWaitEvent(side, ev, 0));
    OK(cu.MemsetD8Async(dev, 9, N, side));
    OK(cu.EventRecord(ev, side));
    OK(cu.StreamWaitEvent(stream, ev, 0));
    a.add = 50;
    EXPECT(cm_sim_kbatch(stream, kb_run, &a, sizeof(a), 1, &start, &len,
                         &seq2, &capid), CUDA_ERROR_NOT_FOUND);
    /* A new node instead, then other work on the stream: refused too. */
    a.add = 4;
    seq2 = 0;
    OK(cm_sim_kbatch(stream, kb_run, &a, sizeof(a), 1, &start, &len, &seq2,
                     &capid));
    CHECK(seq2 == 3);          /* after the first node and the memset */
    OK(cu.MemsetD8Async(dev, 1, N, stream));
    a.add = 60;
    EXPECT(cm_sim_kbatch(stream, kb_run, &a, sizeof(a), 1, &start, &len,
                         &seq2, &capid), CUDA_ERROR_NOT_FOUND);
    OK(cu.StreamEndCapture(stream, &g));
    /* Another capture: the old node is not its. */
    old_cap = capid;
    OK(cu.StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT(cm_sim_kbatch(stream, kb_run, &a, sizeof(a), 1, &start, &len,
                         &seq2, &old_cap), CUDA_ERROR_NOT_FOUND);
    CHECK(old_cap == capid);
    {
        CUgraph g2 = NULL;

        OK(cu.StreamEndCapture(stream, &g2));
        OK(cu.GraphDestroy(g2));
    }
    /* The replay: 3 (the first node as last changed) then 4. */
    OK(cu.GraphInstantiateWithFlags(&x, g, 0));
    memset(pin, 10, N);
    OK(cu.GraphLaunch(x, stream));
    OK(cu.StreamSynchronize(stream));
    for (i = 0; i < N; i++) {
        CHECK(pin[i] == 17);
    }
    memset(pin, 0, N);
    OK(cu.GraphExecDestroy(x));
    OK(cu.GraphDestroy(g));
    OK(cu.EventDestroy(ev));
    OK(cu.StreamDestroy(side));
}

int
main(void)
{
    CUcontext ctx;
    CUdevice d;

    cm_sim_fill(&cu, 0);
    OK(cu.Init(0));
    OK(cu.DeviceGet(&d, 0));
    OK(cu.DevicePrimaryCtxRetain(&ctx, d));
    OK(cu.CtxSetCurrent(ctx));
    OK(cu.StreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    OK(cu.MemAlloc(&dev, N));
    OK(cu.MemHostAlloc((void **)&pin, N, 0));
    memset(pin, 0, N);
    test_replay();
    test_invalidate();
    test_legacy();
    test_fork_join();
    test_modes(ctx);
    test_queries(ctx);
    test_destroy();
    test_kbatch();
    OK(cu.MemFreeHost(pin));
    OK(cu.MemFree(dev));
    OK(cu.StreamDestroy(stream));
    OK(cu.DevicePrimaryCtxRelease(d));
    if (failures) {
        fprintf(stderr, "test_graph: %d failure(s)\n", failures);
        return 1;
    }
    printf("ok   graph\n");
    return 0;
}
