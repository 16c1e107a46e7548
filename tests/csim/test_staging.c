/* SPDX-License-Identifier: MIT */
/*
 * test_staging.c: the staging pipeline (csrc/memory/staging/staging.c) on the
 * simulator without Python, for ThreadSanitizer and AddressSanitizer.
 *
 * Includes staging.c and drives its internals directly: eight threads
 * run synchronous and asynchronous transfers (contiguous and strided,
 * both directions) at once through the shared workers and buffer
 * caches, and check every byte.  The few symbols staging.c takes from
 * the rest of the extension are stubbed here; nothing calls Python.
 * Build and run: `make -C tests/csim check-staging`.
 */
#include "../../csrc/memory/staging/staging.c"

#include <stdatomic.h>
#include <stdio.h>

cm_cu_table cm_cu;
CUresult cm_cu_missing = CUDA_ERROR_NOT_SUPPORTED;
volatile int cm_forked;
int cm_driver_ready_flag = 1;

int
cm_raise_cu(CUresult rc, const char *fn)
{
    fprintf(stderr, "unexpected raise: %s %d\n", fn, (int)rc);
    abort();
}

int
cm_driver_ensure_slow(void)
{
    return 0;
}

cm_context *
cm_context_current(void)
{
    return NULL;
}

int
cm_capture_refuse_stream(CUstream h, int external, const char *what)
{
    (void)h;
    (void)external;
    (void)what;
    return 0;
}

int
cm_context_live(cm_context **out)
{
    (void)out;
    return 0;
}

/* The GIL-yield state of driver/call.h's driver-call macros
 * (driver/state.c in the extension): no Python callback is ever in
 * flight here. */
long cm_pycb_live;
_Thread_local int cm_mu_depth;
_Thread_local cm_gil_saved cm_yield_saved;
long cm_driver_calls[2];
unsigned long cm_driver_epoch;
_Thread_local unsigned long cm_call_epoch;
_Thread_local int cm_call_depth;

/* The dying-context guard of driver/call.h's CM_CU_CALL_
 * (driver/driver.c in the extension): no context is ever closed here. */
int cm_ctx_dying_n;

int
cm_ctx_dying_check(void)
{
    return 0;
}

/* The GIL probe (driver/driver.c in the extension): off here. */
int cm_gil_probe_on;

uint64_t
cm_gil_probe_clock(void)
{
    return 0;
}

void
cm_gil_probe_note(int kind, uint64_t t0, uint64_t t1)
{
    (void)kind;
    (void)t0;
    (void)t1;
}

/* The fork handlers' list (driver/driver.c in the extension): this
 * program does not fork. */
int
cm_atfork_child_add(void (*fn)(void))
{
    (void)fn;
    return 0;
}

int
cm_hostmem_registered(uintptr_t lo, uintptr_t hi)
{
    (void)lo;
    (void)hi;
    return 0;
}

static CUcontext the_ctx;
static atomic_int failures;

#define CHECK(cond)                                                     \
    do {                                                                \
        if (!(cond)) {                                                  \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__,      \
                    __LINE__, #cond);                                   \
            atomic_fetch_add(&failures, 1);                             \
        }                                                               \
    } while (0)

/* A job over n doubles: the host side every step-th double of host. */
static cm_sjob *
mkjob(int htod, double *host, Py_ssize_t step, CUdeviceptr dev, size_t n)
{
    cm_sjob *j = calloc(1, sizeof(*j));

    j->htod = htod;
    j->ndim = 2;
    j->shape[0] = (Py_ssize_t)(n / 10);
    j->shape[1] = 10;
    j->hs[1] = step * (Py_ssize_t)sizeof(double);
    j->hs[0] = 10 * j->hs[1];
    j->host = (uintptr_t)host;
    j->dev = dev;
    j->itemsize = sizeof(double);
    j->elems = n;
    j->chunk_el = 500;
    j->part_el = 37;
    j->bound = cm_stg_schedule(n, j->chunk_el, j->part_el, 0, &j->nchunks);
    j->nbuf = 3;
    j->ctx = the_ctx;
    j->devid = 0;
    j->gen = 1;
    return j;
}

/* One transfer, synchronous (on the default stream) or on stream s, as
 * cm_staging_copy runs it; 0 on success.  Either way the pipeline
 * returns with every chunk in place. */
static int
transfer(int htod, double *host, Py_ssize_t step, CUdeviceptr dev,
         size_t n, CUstream s)
{
    cm_sjob *j = mkjob(htod, host, step, dev, n);
    CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;

    if (j->bound != NULL) {
        j->stream = s;
        rc = cm_stg_acquire(j, j->chunk_el * j->itemsize, 4096);
    }
    if (rc == CUDA_SUCCESS) {
        cm_stg_run(j);
        rc = j->rc;
        CHECK(!j->unsure);
    }
    cm_stg_release(j, 6);
    free(j->bound);
    free(j);
    return rc == CUDA_SUCCESS ? 0 : -1;
}

static void *
thread_main(void *arg)
{
    int id = (int)(intptr_t)arg;
    size_t n = 10 * (700 + (size_t)id * 113);
    double *a = malloc(2 * n * sizeof(double));
    double *b = malloc(2 * n * sizeof(double));
    CUdeviceptr dev;
    CUstream s;
    size_t i;
    int round;

    CHECK(cm_cu.CtxSetCurrent(the_ctx) == CUDA_SUCCESS);
    CHECK(cm_cu.MemAlloc(&dev, n * sizeof(double)) == CUDA_SUCCESS);
    CHECK(cm_cu.StreamCreate(&s, 0) == CUDA_SUCCESS);
    for (round = 0; round < 6; round++) {
        Py_ssize_t step = 1 + round % 2;
        CUstream use = round >= 3 ? s : NULL;

        for (i = 0; i < 2 * n; i++) {
            a[i] = (double)(id * 1000003 + round * 7919) + (double)i;
            b[i] = -1.0;
        }
        CHECK(transfer(1, a, step, dev, n, use) == 0);
        CHECK(transfer(0, b, 3 - step, dev, n, use) == 0);
        for (i = 0; i < n; i++) {
            if (b[i * (size_t)(3 - step)] != a[i * (size_t)step]) {
                CHECK(!"data differs");
                break;
            }
        }
    }
    CHECK(cm_cu.StreamDestroy(s) == CUDA_SUCCESS);
    CHECK(cm_cu.MemFree(dev) == CUDA_SUCCESS);
    free(a);
    free(b);
    return NULL;
}

int
main(void)
{
    pthread_t t[8];
    CUdevice d;
    int i;

    cm_sim_fill(&cm_cu, 0);
    if (cm_cu.Init(0) != CUDA_SUCCESS || cm_cu.DeviceGet(&d, 0)
        || cm_cu.DevicePrimaryCtxRetain(&the_ctx, d)) {
        fprintf(stderr, "simulator did not start\n");
        return 1;
    }
    cm_workers_grow(4);
    for (i = 0; i < 8; i++) {
        pthread_create(&t[i], NULL, thread_main, (void *)(intptr_t)i);
    }
    for (i = 0; i < 8; i++) {
        pthread_join(t[i], NULL);
    }
    /* Every buffer is back in its cache. */
    pthread_mutex_lock(&cm_stg_mu);
    CHECK(cm_nlive == cm_nfree_all);
    pthread_mutex_unlock(&cm_stg_mu);
    if (atomic_load(&failures) != 0) {
        fprintf(stderr, "%d failures\n", atomic_load(&failures));
        return 1;
    }
    printf("test_staging: ok\n");
    return 0;
}
