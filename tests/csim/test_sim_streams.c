/* SPDX-License-Identifier: MIT */
/*
 * test_sim_streams.c: standalone tests of the CPU simulator's streams
 * (csrc/sim/): events, host functions and callbacks, asynchrony
 * (CUDAMEM_SIM_DELAY_US), handles that are not (or no longer) streams,
 * events or pools, re-entry from host functions and faults, per-thread
 * default streams, and stream-ordered allocation from the default memory
 * pool.  The rest of the simulator's general tests are in test_sim.c;
 * what both use (expect_abort, the gate) in csim_sim.h.
 *
 * Build and run with tests/csim/Makefile (`make -C tests/csim check`),
 * under ASan+UBSan and under TSan.  Each group runs in a child process
 * of its own, as in test_sim.c.
 */
#include "csim_sim.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A counter bumped by host functions, in order. */
typedef struct {
    pthread_mutex_t mu;     /* guards the fields */
    int log[64];            /* values seen, in call order */
    int n;                  /* how many */
    pthread_t thread;       /* the thread of the last call */
} order_log;

typedef struct {
    order_log *log;         /* where to append */
    int value;              /* what to append */
} order_arg;

static void CUDA_CB
order_fn(void *arg)
{
    order_arg *a = arg;

    pthread_mutex_lock(&a->log->mu);
    a->log->log[a->log->n++] = a->value;
    a->log->thread = pthread_self();
    pthread_mutex_unlock(&a->log->mu);
}

static void CUDA_CB
callback_fn(CUstream h, CUresult status, void *arg)
{
    order_arg *a = arg;

    (void)h;
    if (status == CUDA_SUCCESS) {
        order_fn(a);
    }
}

/* ------------------------------------------------------------------ */
/* Groups                                                              */
/* ------------------------------------------------------------------ */

/* A stream destroyed with work still queued on it. */
static void
abort_query_destroyed_stream(void)
{
    CUdeviceptr d;
    CUstream s;

    OK(cu.Init(0));
    retain_and_push(0);
    OK(cu.MemAlloc(&d, 4096));
    OK(cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING));
    OK(cu.MemsetD8Async(d, 1, 4096, s));
    OK(cu.StreamDestroy(s));
    abort_expect("stream handle %p is not a live stream: the driver would "
                 "crash here", (void *)s);
    (void)cu.StreamQuery(s);
}

/* An event destroyed while its record is pending. */
static CUevent
destroyed_event(void)
{
    CUstream s;
    CUevent e;

    OK(cu.Init(0));
    retain_and_push(0);
    OK(cu.StreamCreate(&s, 0));
    OK(cu.EventCreate(&e, CU_EVENT_DEFAULT));
    OK(cu.EventRecord(e, s));
    OK(cu.EventDestroy(e));
    return e;
}

static void
abort_query_destroyed_event(void)
{
    CUevent e = destroyed_event();

    abort_expect("event handle %p is not a live event: the driver would "
                 "crash here", (void *)e);
    (void)cu.EventQuery(e);
}

static void
abort_destroy_destroyed_event(void)
{
    CUevent e = destroyed_event();

    abort_expect("event handle %p is not a live event: the driver would "
                 "crash here", (void *)e);
    (void)cu.EventDestroy(e);
}

/* Groups that need CUDAMEM_SIM_DELAY_US: asynchrony must be visible. */
static void
group_async(void)
{
    CUdeviceptr d;
    CUstream s;
    CUevent a, b;
    float ms = -1;
    unsigned char *src = malloc(1 << 16), *dst = malloc(1 << 16);
    int i;

    expect_abort(abort_query_destroyed_stream);
    expect_abort(abort_query_destroyed_event);
    expect_abort(abort_destroy_destroyed_event);

    OK(cu.Init(0));
    retain_and_push(0);
    for (i = 0; i < (1 << 16); i++) {
        src[i] = (unsigned char)(i * 7);
    }
    memset(dst, 0, 1 << 16);
    OK(cu.MemAlloc(&d, 1 << 16));
    OK(cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING));
    OK(cu.EventCreate(&a, CU_EVENT_DEFAULT));
    OK(cu.EventCreate(&b, CU_EVENT_BLOCKING_SYNC));
    OK(cu.EventRecord(a, s));
    OK(cu.MemcpyHtoDAsync(d, src, 1 << 16, s));    /* pageable, async */
    OK(cu.MemcpyDtoHAsync(dst, d, 1 << 16, s));
    OK(cu.EventRecord(b, s));
    /* Each op sleeps 20 ms first: nothing can have finished yet. */
    EXPECT(cu.StreamQuery(s), CUDA_ERROR_NOT_READY);
    EXPECT(cu.EventQuery(b), CUDA_ERROR_NOT_READY);
    EXPECT(cu.EventElapsedTime(&ms, a, b), CUDA_ERROR_NOT_READY);
    OK(cu.EventSynchronize(b));
    OK(cu.StreamQuery(s));
    OK(cu.EventQuery(a));
    CHECK(memcmp(src, dst, 1 << 16) == 0);
    OK(cu.EventElapsedTime(&ms, a, b));
    /* Three ops of >= 20 ms each lie between the two timestamps. */
    CHECK(ms >= 55.0f && ms < 5000.0f);

    /* A synchronous copy on the default stream returns when done. */
    memset(dst, 0, 1 << 16);
    OK(cu.MemcpyDtoH(dst, d, 1 << 16));
    CHECK(memcmp(src, dst, 1 << 16) == 0);

    /* Destroying a stream with queued work: the work still happens (the
     * handle is gone: abort_query_destroyed_stream). */
    memset(dst, 0, 1 << 16);
    OK(cu.MemcpyDtoHAsync(dst, d, 1 << 16, s));
    OK(cu.EventRecord(b, s));
    OK(cu.StreamDestroy(s));
    OK(cu.EventSynchronize(b));
    CHECK(memcmp(src, dst, 1 << 16) == 0);

    /* Destroying an event whose record is pending (the handle is gone:
     * abort_query_destroyed_event). */
    OK(cu.StreamCreate(&s, 0));
    OK(cu.EventRecord(a, s));
    OK(cu.EventDestroy(a));
    OK(cu.StreamSynchronize(s));
    OK(cu.StreamDestroy(s));
    EXPECT(cu.EventQuery(NULL), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cu.EventDestroy(NULL), CUDA_ERROR_INVALID_HANDLE);

    OK(cu.EventDestroy(b));
    OK(cu.MemFree(d));
    OK(cu.CtxPopCurrent(NULL));
    OK(cu.DevicePrimaryCtxRelease(0));
    free(src);
    free(dst);
}

/* Handles that were never streams or events, and a stream destroyed
 * twice. */
static void
abort_query_unknown_stream(void)
{
    unsigned char host[64];

    OK(cu.Init(0));
    retain_and_push(0);
    abort_expect("stream handle %p is not a live stream: the driver would "
                 "crash here", (void *)host);
    (void)cu.StreamQuery((CUstream)(void *)host);
}

static void
abort_wait_unknown_event(void)
{
    unsigned char host[64];
    CUstream s;

    OK(cu.Init(0));
    retain_and_push(0);
    OK(cu.StreamCreate(&s, 0));
    abort_expect("event handle %p is not a live event: the driver would "
                 "crash here", (void *)host);
    (void)cu.StreamWaitEvent(s, (CUevent)(void *)host, 0);
}

static void
abort_record_unknown_event(void)
{
    unsigned char host[64];
    CUstream s;

    OK(cu.Init(0));
    retain_and_push(0);
    OK(cu.StreamCreate(&s, 0));
    abort_expect("event handle %p is not a live event: the driver would "
                 "crash here", (void *)host);
    (void)cu.EventRecord((CUevent)(void *)host, s);
}

static void
abort_destroy_stream_twice(void)
{
    CUstream s;

    OK(cu.Init(0));
    retain_and_push(0);
    OK(cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING));
    OK(cu.StreamDestroy(s));
    abort_expect("cuStreamDestroy of %p, not a live stream: the driver "
                 "would crash here", (void *)s);
    (void)cu.StreamDestroy(s);
}

static void
group_streams(void)
{
    CUdeviceptr d;
    CUstream s1, s2, nb;
    CUevent e, nt;
    gate g1, g2;
    order_log lg;
    order_arg args[8];
    unsigned char host[64];
    float ms;
    int i;

    expect_abort(abort_query_unknown_stream);
    expect_abort(abort_wait_unknown_event);
    expect_abort(abort_record_unknown_event);
    expect_abort(abort_destroy_stream_twice);

    OK(cu.Init(0));
    retain_and_push(0);
    OK(cu.MemAlloc(&d, 64));
    OK(cu.MemsetD8(d, 0, 64));
    OK(cu.StreamCreate(&s1, 0));
    OK(cu.StreamCreate(&s2, 0));
    OK(cu.StreamCreate(&nb, CU_STREAM_NON_BLOCKING));
    EXPECT(cu.StreamCreate(&nb, 2), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.StreamDestroy(NULL), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cu.StreamDestroy(CU_STREAM_LEGACY), CUDA_ERROR_INVALID_HANDLE);

    /* In-order execution on the worker thread, host fns and callbacks. */
    pthread_mutex_init(&lg.mu, NULL);
    lg.n = 0;
    for (i = 0; i < 8; i++) {
        args[i].log = &lg;
        args[i].value = i;
        if (i % 2) {
            OK(cu.StreamAddCallback(s1, callback_fn, &args[i], 0));
        }
        else {
            OK(cu.LaunchHostFunc(s1, order_fn, &args[i]));
        }
    }
    EXPECT(cu.StreamAddCallback(s1, callback_fn, &args[0], 1),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.LaunchHostFunc(s1, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
    OK(cu.StreamSynchronize(s1));
    CHECK(lg.n == 8);
    for (i = 0; i < lg.n; i++) {
        CHECK(lg.log[i] == i);
    }
    CHECK(!pthread_equal(lg.thread, pthread_self()));

    /* Ordering within a stream behind a blocked host function. */
    gate_init(&g1);
    OK(cu.LaunchHostFunc(s1, gate_fn, &g1));
    OK(cu.MemsetD8Async(d, 7, 64, s1));
    gate_wait_entered(&g1);
    CHECK(!pthread_equal(g1.thread, pthread_self()));
    sleep_ms(20);
    EXPECT(cu.StreamQuery(s1), CUDA_ERROR_NOT_READY);
    OK(cu.StreamQuery(s2));
    gate_open(&g1);
    OK(cu.StreamSynchronize(s1));
    OK(cu.MemcpyDtoH(host, d, 64));
    CHECK(host[0] == 7 && host[63] == 7);
    gate_fini(&g1);

    /* Legacy stream waits for blocking streams, not non-blocking ones. */
    gate_init(&g1);
    gate_init(&g2);
    OK(cu.LaunchHostFunc(s1, gate_fn, &g1));
    OK(cu.LaunchHostFunc(nb, gate_fn, &g2));
    gate_wait_entered(&g1);
    gate_wait_entered(&g2);
    OK(cu.MemsetD8Async(d, 9, 64, NULL));   /* behind s1, not behind nb */
    sleep_ms(20);
    EXPECT(cu.StreamQuery(CU_STREAM_LEGACY), CUDA_ERROR_NOT_READY);
    gate_open(&g1);
    OK(cu.StreamSynchronize(CU_STREAM_LEGACY));
    EXPECT(cu.StreamQuery(nb), CUDA_ERROR_NOT_READY);
    gate_open(&g2);
    OK(cu.StreamSynchronize(nb));
    gate_fini(&g1);
    gate_fini(&g2);

    /* A blocking stream waits for the legacy stream; nb does not. */
    gate_init(&g1);
    OK(cu.LaunchHostFunc(CU_STREAM_LEGACY, gate_fn, &g1));
    gate_wait_entered(&g1);
    OK(cu.MemsetD8Async(d, 3, 32, s2));
    OK(cu.MemsetD8Async(d + 32, 4, 32, nb));
    OK(cu.StreamSynchronize(nb));
    sleep_ms(20);
    EXPECT(cu.StreamQuery(s2), CUDA_ERROR_NOT_READY);
    gate_open(&g1);
    OK(cu.StreamSynchronize(s2));
    OK(cu.MemcpyDtoH(host, d, 64));
    CHECK(host[0] == 3 && host[31] == 3 && host[32] == 4 && host[63] == 4);
    gate_fini(&g1);

    /* cuStreamWaitEvent: s2 waits for an event recorded on nb. */
    gate_init(&g1);
    OK(cu.EventCreate(&e, CU_EVENT_DISABLE_TIMING));
    OK(cu.EventQuery(e));                   /* never recorded */
    OK(cu.EventSynchronize(e));
    OK(cu.LaunchHostFunc(nb, gate_fn, &g1));
    OK(cu.EventRecord(e, nb));
    OK(cu.StreamWaitEvent(s2, e, 0));
    OK(cu.MemsetD8Async(d, 5, 64, s2));
    gate_wait_entered(&g1);
    sleep_ms(20);
    EXPECT(cu.EventQuery(e), CUDA_ERROR_NOT_READY);
    EXPECT(cu.StreamQuery(s2), CUDA_ERROR_NOT_READY);
    /* Re-recording after the wait does not change what s2 waits for. */
    OK(cu.EventRecord(e, s1));
    OK(cu.StreamSynchronize(s1));
    OK(cu.EventQuery(e));
    EXPECT(cu.StreamQuery(s2), CUDA_ERROR_NOT_READY);
    gate_open(&g1);
    OK(cu.StreamSynchronize(s2));
    OK(cu.MemcpyDtoH(host, d, 64));
    CHECK(host[10] == 5);
    EXPECT(cu.StreamWaitEvent(s2, e, 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.StreamWaitEvent(s2, NULL, 0), CUDA_ERROR_INVALID_HANDLE);
    gate_fini(&g1);

    /* Event errors. */
    OK(cu.EventCreate(&nt, CU_EVENT_DEFAULT));
    EXPECT(cu.EventElapsedTime(&ms, nt, nt), CUDA_ERROR_INVALID_HANDLE);
    OK(cu.EventRecord(nt, s1));
    OK(cu.EventSynchronize(nt));
    OK(cu.EventElapsedTime(&ms, nt, nt));
    CHECK(ms == 0.0f);
    EXPECT(cu.EventElapsedTime(&ms, nt, e), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cu.EventCreate(&e, 0x40), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.EventCreate(&e, CU_EVENT_INTERPROCESS),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.EventRecord(NULL, s1), CUDA_ERROR_INVALID_HANDLE);
    OK(cu.EventDestroy(nt));
    OK(cu.EventDestroy(e));

    OK(cu.StreamDestroy(s1));
    OK(cu.StreamDestroy(s2));
    OK(cu.StreamDestroy(nb));
    OK(cu.MemFree(d));
    OK(cu.CtxPopCurrent(NULL));
    OK(cu.DevicePrimaryCtxRelease(0));
    pthread_mutex_destroy(&lg.mu);
}

/* What a host function saw when it called back into the simulator. */
typedef struct {
    CUstream self;          /* the stream it runs on */
    CUresult query;         /* cuStreamQuery(self) */
    CUresult sync;          /* cuStreamSynchronize(self) */
    CUresult enqueue;       /* cuMemsetD8Async on another stream */
    CUstream other;         /* that stream */
    CUdeviceptr d;          /* what it set */
} reentry;

static void CUDA_CB
reentry_fn(void *arg)
{
    reentry *r = arg;

    r->query = cu.StreamQuery(r->self);
    r->sync = cu.StreamSynchronize(r->self);
    r->enqueue = cu.MemsetD8Async(r->d, 1, 1, r->other);
}

static void CUDA_CB
reset_fn(void *arg)
{
    CUresult *rc = arg;

    *rc = cu.DevicePrimaryCtxReset(0);
}

/* A cuDeviceGetCount made on a thread of its own (the waiting call). */
typedef struct {
    CUresult rc;
    int done;
} blocked_call;

static void *
blocked_call_fn(void *arg)
{
    blocked_call *bc = arg;
    int n = 0;

    bc->rc = cu.DeviceGetCount(&n);
    __atomic_store_n(&bc->done, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

static void
group_reentry_and_faults(void)
{
    CUdeviceptr d;
    CUstream s, t;
    CUcontext ctx;
    CUresult rc = CUDA_ERROR_UNKNOWN;
    order_log lg;
    order_arg arg;
    reentry r;
    int n = 0;

    OK(cu.Init(0));
    ctx = retain_and_push(0);
    OK(cu.MemAlloc(&d, 16));
    OK(cu.StreamCreate(&s, 0));
    OK(cu.StreamCreate(&t, CU_STREAM_NON_BLOCKING));
    /* A host function pushes the context: a thread has its own stack. */
    r.self = s;
    r.other = t;
    r.d = d;
    OK(cu.LaunchHostFunc(s, reentry_fn, &r));
    OK(cu.StreamSynchronize(s));
    CHECK(r.query == CUDA_ERROR_NOT_READY);
    CHECK(r.sync == CUDA_ERROR_NOT_PERMITTED);
    CHECK(r.enqueue == CUDA_ERROR_INVALID_CONTEXT);

    /* Fault injection: the 2nd next cuMemAlloc fails, once. */
    CHECK(cm_sim_inject(CM_CU_IDX_MemAlloc, 2, CUDA_ERROR_OUT_OF_MEMORY)
          == 0);
    OK(cu.MemAlloc(&r.d, 16));
    OK(cu.MemFree(r.d));
    EXPECT(cu.MemAlloc(&r.d, 16), CUDA_ERROR_OUT_OF_MEMORY);
    OK(cu.MemAlloc(&r.d, 16));
    OK(cu.MemFree(r.d));
    /* Disarming. */
    CHECK(cm_sim_inject(CM_CU_IDX_DeviceGetCount, 1, CUDA_ERROR_UNKNOWN)
          == 0);
    CHECK(cm_sim_inject(CM_CU_IDX_DeviceGetCount, 0, CUDA_ERROR_UNKNOWN)
          == 0);
    OK(cu.DeviceGetCount(&n));
    /* Injection wins even over the init rule's exceptions. */
    CHECK(cm_sim_inject(CM_CU_IDX_GetErrorName, 1, CUDA_ERROR_NOT_FOUND)
          == 0);
    {
        const char *name;
        EXPECT(cu.GetErrorName(CUDA_SUCCESS, &name), CUDA_ERROR_NOT_FOUND);
        OK(cu.GetErrorName(CUDA_SUCCESS, &name));
    }
    CHECK(cm_sim_inject(-1, 1, CUDA_ERROR_UNKNOWN) == -1);
    CHECK(cm_sim_inject(CM_CU_N_FUNCS, 1, CUDA_ERROR_UNKNOWN) == -1);

    /* A call armed to wait: the 2nd next cuDeviceGetCount, on another
     * thread, waits until unblocked; the calls around it do not. */
    {
        pthread_t th;
        blocked_call bc = {0};
        int k;

        CHECK(cm_sim_block(CM_CU_IDX_DeviceGetCount, 2) == 0);
        OK(cu.DeviceGetCount(&n));
        CHECK(pthread_create(&th, NULL, blocked_call_fn, &bc) == 0);
        for (k = 0; k < 10000
                    && cm_sim_blocked(CM_CU_IDX_DeviceGetCount) == 0; k++) {
            usleep(1000);
        }
        CHECK(cm_sim_blocked(CM_CU_IDX_DeviceGetCount) == 1);
        usleep(20000);
        CHECK(!__atomic_load_n(&bc.done, __ATOMIC_SEQ_CST));
        CHECK(cm_sim_unblock(CM_CU_IDX_DeviceGetCount) == 0);
        CHECK(pthread_join(th, NULL) == 0);
        CHECK(bc.done && bc.rc == CUDA_SUCCESS);
        CHECK(cm_sim_blocked(CM_CU_IDX_DeviceGetCount) == 0);
        OK(cu.DeviceGetCount(&n));
        CHECK(cm_sim_block(-1, 1) == -1);
        CHECK(cm_sim_block(CM_CU_N_FUNCS, 1) == -1);
    }

    /* A host function may not destroy the context its stream runs in. */
    OK(cu.LaunchHostFunc(s, reset_fn, &rc));
    OK(cu.StreamSynchronize(s));
    CHECK(rc == CUDA_ERROR_NOT_PERMITTED);

    /* Reset with queued work on live streams drains them first (their
     * handles are gone after it: abort_query_stream_of_reset_context). */
    pthread_mutex_init(&lg.mu, NULL);
    lg.n = 0;
    arg.log = &lg;
    arg.value = 42;
    OK(cu.MemsetD8Async(d, 2, 16, t));
    OK(cu.LaunchHostFunc(t, order_fn, &arg));
    OK(cu.DevicePrimaryCtxReset(0));
    CHECK(lg.n == 1 && lg.log[0] == 42);
    pthread_mutex_destroy(&lg.mu);
    OK(cu.CtxPopCurrent(NULL));
    (void)ctx;
    OK(cu.DevicePrimaryCtxRelease(0));
}

/* Per-thread default streams (cm_sim_fill(.., 1)). */
typedef struct {
    CUcontext ctx;          /* to push */
    gate *g;                /* to launch on handle 0 */
    CUresult rc;            /* of the launch */
} ptds_arg;

static void *
ptds_thread(void *p)
{
    ptds_arg *a = p;

    a->rc = cu.CtxPushCurrent(a->ctx);
    if (a->rc == CUDA_SUCCESS) {
        a->rc = cu.LaunchHostFunc(NULL, gate_fn, a->g);
    }
    if (a->rc == CUDA_SUCCESS) {
        a->rc = cu.StreamSynchronize(NULL);
    }
    cu.CtxPopCurrent(NULL);
    return NULL;
}

static void
group_per_thread(void)
{
    CUcontext ctx;
    gate g1, g2;
    pthread_t th;
    ptds_arg a;
    CUdeviceptr d;

    OK(cu.Init(0));
    ctx = retain_and_push(0);
    gate_init(&g1);
    gate_init(&g2);
    /* This thread's handle 0 is blocked ... */
    OK(cu.LaunchHostFunc(NULL, gate_fn, &g1));
    gate_wait_entered(&g1);
    /* ... another thread's handle 0 is another stream. */
    a.ctx = ctx;
    a.g = &g2;
    pthread_create(&th, NULL, ptds_thread, &a);
    gate_wait_entered(&g2);
    CHECK(!pthread_equal(g1.thread, g2.thread));
    gate_open(&g2);
    pthread_join(th, NULL);
    OK(a.rc);
    EXPECT(cu.StreamQuery(NULL), CUDA_ERROR_NOT_READY);
    EXPECT(cu.StreamQuery(CU_STREAM_PER_THREAD), CUDA_ERROR_NOT_READY);
    /* The legacy stream waits for per-thread streams. */
    OK(cu.MemAlloc(&d, 16));
    OK(cu.MemsetD8Async(d, 1, 16, CU_STREAM_LEGACY));
    sleep_ms(20);
    EXPECT(cu.StreamQuery(CU_STREAM_LEGACY), CUDA_ERROR_NOT_READY);
    gate_open(&g1);
    OK(cu.StreamSynchronize(CU_STREAM_LEGACY));
    OK(cu.StreamQuery(NULL));
    OK(cu.CtxSynchronize());
    OK(cu.MemFree(d));
    gate_fini(&g1);
    gate_fini(&g2);
    OK(cu.CtxPopCurrent(NULL));
    OK(cu.DevicePrimaryCtxRelease(0));
}

/* ------------------------------------------------------------------ */
/* Stream-ordered allocation and the default memory pool               */
/* ------------------------------------------------------------------ */

/* Pool handles that are not (or no longer) pools. */
static void
abort_unknown_pool(void)
{
    cuuint64_t v = 0;

    OK(cu.Init(0));
    retain_and_push(0);
    abort_expect("memory pool handle %p is not a live pool: the driver "
                 "would crash here", (void *)&v);
    (void)cu.MemPoolGetAttribute((CUmemoryPool)(void *)&v,
                                 CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v);
}

static void
abort_destroyed_pool(void)
{
    CUmemPoolProps props;
    CUmemoryPool pool;
    cuuint64_t t = 0;

    OK(cu.Init(0));
    retain_and_push(0);
    memset(&props, 0, sizeof(props));
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 0;
    OK(cu.MemPoolCreate(&pool, &props));
    OK(cu.MemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &t));
    OK(cu.MemPoolDestroy(pool));
    abort_expect("memory pool handle %p is not a live pool: the driver "
                 "would crash here", (void *)pool);
    (void)cu.MemPoolTrimTo(pool, 0);
}

static void
group_mempool(void)
{
    CUmemoryPool pool, pool2;
    CUdeviceptr a, b, c, big;
    CUstream s1, s2;
    cuuint64_t v = 0, t;
    size_t freeb, total;
    int flag = 0;
    gate g;

    expect_abort(abort_unknown_pool);
    expect_abort(abort_destroyed_pool);

    OK(cu.Init(0));
    retain_and_push(0);
    OK(cu.DeviceGetDefaultMemPool(&pool, 0));
    OK(cu.DeviceGetDefaultMemPool(&pool2, 0));
    CHECK(pool == pool2);
    EXPECT(cu.DeviceGetDefaultMemPool(&pool2, 3), CUDA_ERROR_INVALID_DEVICE);
    OK(cu.MemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v));
    CHECK(v == 0);
    OK(cu.MemPoolGetAttribute(pool,
                              CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
                              &flag));
    EXPECT(cu.MemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
                                  &v), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemPoolGetAttribute(NULL, CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
                                  &v), CUDA_ERROR_INVALID_VALUE);
    OK(cu.StreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    OK(cu.StreamCreate(&s2, CU_STREAM_NON_BLOCKING));

    /* Threshold 0: freed memory goes back at the next synchronisation. */
    OK(cu.MemAllocAsync(&a, 1000, s1));
    OK(cu.MemGetInfo(&freeb, &total));
    CHECK(freeb == total - 1024);
    OK(cu.MemsetD8Async(a, 7, 1000, s1));
    OK(cu.MemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v));
    CHECK(v == 1024);
    OK(cu.MemFreeAsync(a, s1));
    EXPECT(cu.MemFreeAsync(a, s1), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cu.MemsetD8Async(a, 7, 1000, s1), CUDA_ERROR_INVALID_VALUE);
    OK(cu.MemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v));
    CHECK(v == 0);
    OK(cu.MemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                              &v));
    CHECK(v == 1024);
    OK(cu.StreamSynchronize(s1));
    OK(cu.MemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                              &v));
    CHECK(v == 0);
    OK(cu.MemGetInfo(&freeb, &total));
    CHECK(freeb == total);

    /* A high threshold keeps it; same-stream reuse is immediate, another
     * stream waits for the free to run. */
    t = UINT64_MAX;
    OK(cu.MemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &t));
    gate_init(&g);
    OK(cu.LaunchHostFunc(s1, gate_fn, &g));
    OK(cu.MemAllocAsync(&a, 4096, s1));
    OK(cu.MemFreeAsync(a, s1));
    OK(cu.MemAllocAsync(&b, 4096, s2));
    CHECK(b != a);                      /* the free has not run */
    OK(cu.MemAllocAsync(&c, 4000, s1));
    CHECK(c == a);                      /* stream order makes it safe */
    OK(cu.MemFreeAsync(c, s1));
    OK(cu.MemFreeAsync(b, s2));
    gate_open(&g);
    OK(cu.StreamSynchronize(s1));
    gate_fini(&g);
    OK(cu.MemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                              &v));
    CHECK(v == 8192);
    OK(cu.MemAllocAsync(&c, 4096, s2));
    CHECK(c == a || c == b);
    OK(cu.MemFreeAsync(c, s2));
    OK(cu.CtxSynchronize());

    /* Trim gives back what is idle; the cache makes room for growth. */
    OK(cu.MemPoolTrimTo(pool, 4096));
    OK(cu.MemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                              &v));
    CHECK(v == 4096);
    OK(cu.MemPoolTrimTo(pool, 0));
    OK(cu.MemAllocAsync(&a, 512 * 1024, s1));
    OK(cu.MemFreeAsync(a, s1));
    OK(cu.StreamSynchronize(s1));
    OK(cu.MemAllocAsync(&big, 768 * 1024, s1));  /* needs the cached */
    EXPECT(cu.MemAlloc(&a, 512 * 1024), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT(cu.MemAllocAsync(&a, 512 * 1024, s1), CUDA_ERROR_OUT_OF_MEMORY);
    OK(cu.MemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &v));
    CHECK(v == 768 * 1024);
    t = 0;
    OK(cu.MemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &t));
    OK(cu.MemFreeAsync(big, s1));
    OK(cu.StreamSynchronize(s1));
    OK(cu.MemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &v));
    CHECK(v == 768 * 1024);
    OK(cu.MemPoolTrimTo(pool, 0));
    OK(cu.MemGetInfo(&freeb, &total));
    CHECK(freeb == total);

    /* A reset takes live pool memory with the context. */
    OK(cu.MemAllocAsync(&a, 1000, s1));
    OK(cu.StreamDestroy(s1));
    OK(cu.StreamDestroy(s2));
    OK(cu.CtxPopCurrent(NULL));
    OK(cu.DevicePrimaryCtxReset(0));
    OK(cu.DevicePrimaryCtxRelease(0));
    retain_and_push(0);
    OK(cu.MemGetInfo(&freeb, &total));
    CHECK(freeb == total);
    OK(cu.MemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                              &v));
    CHECK(v == 0);
    OK(cu.CtxPopCurrent(NULL));
    OK(cu.DevicePrimaryCtxRelease(0));
}

/* ------------------------------------------------------------------ */
/* Driver                                                              */
/* ------------------------------------------------------------------ */

static const group groups[] = {
    {"async", group_async, "CUDAMEM_SIM_DELAY_US=20000", 0},
    {"streams", group_streams, NULL, 0},
    {"reentry_and_faults", group_reentry_and_faults, NULL, 0},
    {"per_thread", group_per_thread, NULL, 1},
    {"mempool", group_mempool, "CUDAMEM_SIM_MEMORY=1048576", 0},
};


int
main(int argc, char **argv)
{
    return run_sim_groups(groups, sizeof(groups) / sizeof(groups[0]), argc,
                          argv);
}
