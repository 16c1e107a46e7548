/* SPDX-License-Identifier: MIT */
/*
 * bare_driver.c: the CUDA driver called from C, nothing else, for the
 * benchmark rows that need the driver's own figure without Python in the
 * way (ops_threads.py, and the C rows of ops_alloc.py).  Compiled by the
 * benchmark at run time against the toolkit's cuda.h; the driver library
 * is loaded with dlopen (CUDAMEM_DRIVER_LIBRARY, else libcuda.so.1), so
 * nothing but pthreads is linked.
 *
 *   bare_driver roundtrip THREADS BYTES pinned|pageable|pinned-generic
 *               SAMPLES MS
 *       THREADS threads, each with a stream of its own (cuStreamCreate,
 *       flags 0, as cudamem's stream()), a device buffer and two host
 *       buffers of BYTES bytes (cuMemHostAlloc, or malloc'd and touched),
 *       repeat cuMemcpyHtoDAsync, cuMemcpyDtoHAsync and
 *       cuStreamSynchronize on that stream; pinned-generic makes both
 *       copies with cuMemcpyAsync (unified addressing, the entry point
 *       the runtime's cudaMemcpyAsync may take) from and to
 *       cuMemHostAlloc'd buffers.  A sample starts every
 *       thread at once and stops them after MS milliseconds (each
 *       finishes its round trip, and makes one at least); it counts
 *       until the last one stopped.
 *   bare_driver churn plain|deferred COUNT SAMPLES MS
 *       One thread: cuMemAlloc of sizes cycling 1 KiB .. 4 MiB, each
 *       freed at once (plain) or queued and freed in a batch when more
 *       than COUNT are queued (deferred: the default memory manager's
 *       rule, config.CUDA_DEALLOCS_COUNT).  COUNT is ignored by plain.
 *   bare_driver copy htod|dtoh|dtoh-new CALL BYTES SAMPLES MS
 *       One thread, one copy of BYTES between pageable host memory
 *       (malloc'd and touched) and a device buffer made once: host to
 *       device, device to host into one host buffer, or device to host
 *       into a buffer malloc'd before and freed after each copy (what
 *       copy_to_host() without a destination does).  CALL is how:
 *       sync (cuMemcpyHtoD / cuMemcpyDtoH), async (the ...Async call on
 *       CU_STREAM_LEGACY), async-wait (async, then cuStreamSynchronize
 *       of CU_STREAM_LEGACY), and query-async, query-async-wait (the
 *       same preceded by cuPointerGetAttribute(MEMORY_TYPE) of the host
 *       address, the check a library makes to learn that the memory is
 *       pageable: the driver must answer CUDA_ERROR_INVALID_VALUE), and
 *       pinned (the sync call, the host buffer from cuMemHostAlloc
 *       instead: synchronous for the host in both directions; htod and
 *       dtoh only), and pinned-generic (the same with cuMemcpy, the
 *       unified entry point).
 *
 * Prints one line, "ok" and per sample the seconds per operation (per
 * round trip of all threads together, per allocate-and-free, per
 * copy).  Exit
 * status: 0; 1 on a driver or system error (a line on stderr); 2 on a
 * usage error; 3 when the driver library or its device cannot be had.
 */
#define _POSIX_C_SOURCE 200809L

#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BD_MAX_THREADS 256
#define BD_MAX_SAMPLES 1000
#define BD_WARM 50              /* round trips each thread makes first */
#define BD_CHURN_MIN 10         /* 1 KiB */
#define BD_CHURN_MAX 22         /* 4 MiB */

/* The driver's entry points, resolved by their exported names. */
static struct {
    CUresult (*Init)(unsigned int);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*StreamCreate)(CUstream *, unsigned int);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemHostAlloc)(void **, size_t, unsigned int);
    CUresult (*MemFreeHost)(void *);
    CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t,
                                CUstream);
    CUresult (*MemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
    CUresult (*MemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*Memcpy)(CUdeviceptr, CUdeviceptr, size_t);
    CUresult (*PointerGetAttribute)(void *, CUpointer_attribute,
                                    CUdeviceptr);
    CUresult (*GetErrorName)(CUresult, const char **);
} cu;

static CUcontext bd_ctx;          /* device 0's primary context */

/* The round trip's shared state; the barrier has THREADS + 1 parties
 * (the main thread times each sample between two of its waits). */
static pthread_barrier_t bd_barrier;
static atomic_int bd_stop;        /* 1: end the sample's loop */
static atomic_int bd_failed;      /* a thread hit an error */
static pthread_mutex_t bd_err_mu = PTHREAD_MUTEX_INITIALIZER;
static char bd_err[256];          /* NOTE: the first error; bd_err_mu */

typedef struct {
    size_t bytes;                 /* per copy */
    int pinned;                   /* host buffers page-locked */
    int generic;                  /* copies with cuMemcpyAsync */
    int samples;
    long counts[BD_MAX_SAMPLES];  /* round trips done per sample */
} bd_worker;

static double
bd_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void
bd_sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Keep the first error's text; later ones are consequences. */
static void
bd_fail(const char *what, CUresult rc)
{
    const char *name = NULL;

    pthread_mutex_lock(&bd_err_mu);
    if (!atomic_load(&bd_failed)) {
        if (cu.GetErrorName == NULL || cu.GetErrorName(rc, &name) != 0
            || name == NULL) {
            name = "unknown";
        }
        snprintf(bd_err, sizeof(bd_err), "%s failed: %s (%d)", what, name,
                 (int)rc);
        atomic_store(&bd_failed, 1);
    }
    pthread_mutex_unlock(&bd_err_mu);
}

/* Load the library and resolve the table; 0, or -1 with a message. */
static int
bd_load(void)
{
    const char *path = getenv("CUDAMEM_DRIVER_LIBRARY");
    void *lib;

    if (path == NULL || path[0] == '\0') {
        path = "libcuda.so.1";
    }
    lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        fprintf(stderr, "bare_driver: cannot load %s: %s\n", path,
                dlerror());
        return -1;
    }
#define BD_SYM(field, name)                                              \
    do {                                                                 \
        *(void **)&cu.field = dlsym(lib, name);                          \
        if (cu.field == NULL) {                                          \
            fprintf(stderr, "bare_driver: %s has no %s\n", path, name);  \
            return -1;                                                   \
        }                                                                \
    } while (0)
    BD_SYM(Init, "cuInit");
    BD_SYM(DeviceGet, "cuDeviceGet");
    BD_SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    BD_SYM(CtxSetCurrent, "cuCtxSetCurrent");
    BD_SYM(StreamCreate, "cuStreamCreate");
    BD_SYM(StreamDestroy, "cuStreamDestroy_v2");
    BD_SYM(StreamSynchronize, "cuStreamSynchronize");
    BD_SYM(MemAlloc, "cuMemAlloc_v2");
    BD_SYM(MemFree, "cuMemFree_v2");
    BD_SYM(MemHostAlloc, "cuMemHostAlloc");
    BD_SYM(MemFreeHost, "cuMemFreeHost");
    BD_SYM(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
    BD_SYM(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
    BD_SYM(MemcpyHtoD, "cuMemcpyHtoD_v2");
    BD_SYM(MemcpyDtoH, "cuMemcpyDtoH_v2");
    BD_SYM(MemcpyAsync, "cuMemcpyAsync");
    BD_SYM(Memcpy, "cuMemcpy");
    BD_SYM(PointerGetAttribute, "cuPointerGetAttribute");
    BD_SYM(GetErrorName, "cuGetErrorName");
#undef BD_SYM
    return 0;
}

/* cuInit and device 0's primary context, current on this thread. */
static int
bd_context(void)
{
    CUdevice dev;
    CUresult rc;

    if ((rc = cu.Init(0)) != CUDA_SUCCESS) {
        bd_fail("cuInit", rc);
        return -1;
    }
    if ((rc = cu.DeviceGet(&dev, 0)) != CUDA_SUCCESS) {
        bd_fail("cuDeviceGet", rc);
        return -1;
    }
    if ((rc = cu.DevicePrimaryCtxRetain(&bd_ctx, dev)) != CUDA_SUCCESS) {
        bd_fail("cuDevicePrimaryCtxRetain", rc);
        return -1;
    }
    if ((rc = cu.CtxSetCurrent(bd_ctx)) != CUDA_SUCCESS) {
        bd_fail("cuCtxSetCurrent", rc);
        return -1;
    }
    return 0;
}

static void *
bd_host_alloc(size_t bytes, int pinned)
{
    void *p = NULL;
    CUresult rc;

    if (!pinned) {
        p = malloc(bytes);
        if (p == NULL) {
            bd_fail("malloc", CUDA_ERROR_OUT_OF_MEMORY);
            return NULL;
        }
        memset(p, 1, bytes);   /* touched, as a NumPy array would be */
        return p;
    }
    if ((rc = cu.MemHostAlloc(&p, bytes, 0)) != CUDA_SUCCESS) {
        bd_fail("cuMemHostAlloc", rc);
        return NULL;
    }
    memset(p, 1, bytes);
    return p;
}

static void
bd_host_free(void *p, int pinned)
{
    if (p != NULL) {
        if (pinned) {
            (void)cu.MemFreeHost(p);
        }
        else {
            free(p);
        }
    }
}

/* One round trip on s; 0, or -1 with the error kept. */
static int
bd_round_trip(CUdeviceptr d, void *src, void *dst, size_t bytes, CUstream s,
              int generic)
{
    CUresult rc;

    if (generic) {
        if ((rc = cu.MemcpyAsync(d, (CUdeviceptr)(uintptr_t)src, bytes, s))
            != CUDA_SUCCESS
            || (rc = cu.MemcpyAsync((CUdeviceptr)(uintptr_t)dst, d, bytes,
                                    s)) != CUDA_SUCCESS) {
            bd_fail("cuMemcpyAsync", rc);
            return -1;
        }
    }
    else if ((rc = cu.MemcpyHtoDAsync(d, src, bytes, s)) != CUDA_SUCCESS) {
        bd_fail("cuMemcpyHtoDAsync", rc);
        return -1;
    }
    else if ((rc = cu.MemcpyDtoHAsync(dst, d, bytes, s)) != CUDA_SUCCESS) {
        bd_fail("cuMemcpyDtoHAsync", rc);
        return -1;
    }
    if ((rc = cu.StreamSynchronize(s)) != CUDA_SUCCESS) {
        bd_fail("cuStreamSynchronize", rc);
        return -1;
    }
    return 0;
}

/* A round-trip thread: set up, warm up, then one loop per sample between
 * the barrier's waits.  A thread that failed still waits at every
 * barrier, so that the others and the main thread finish. */
static void *
bd_worker_main(void *arg)
{
    bd_worker *w = arg;
    CUstream s = NULL;
    CUdeviceptr d = 0;
    void *src = NULL;
    void *dst = NULL;
    CUresult rc;
    int ok = 0;
    int k;
    int i;

    if ((rc = cu.CtxSetCurrent(bd_ctx)) != CUDA_SUCCESS) {
        bd_fail("cuCtxSetCurrent", rc);
        goto run;
    }
    if ((rc = cu.StreamCreate(&s, 0)) != CUDA_SUCCESS) {
        bd_fail("cuStreamCreate", rc);
        s = NULL;
        goto run;
    }
    if ((rc = cu.MemAlloc(&d, w->bytes)) != CUDA_SUCCESS) {
        bd_fail("cuMemAlloc", rc);
        d = 0;
        goto run;
    }
    src = bd_host_alloc(w->bytes, w->pinned);
    dst = bd_host_alloc(w->bytes, w->pinned);
    if (src == NULL || dst == NULL) {
        goto run;
    }
    ok = 1;
    for (i = 0; ok && i < BD_WARM; i++) {
        ok = bd_round_trip(d, src, dst, w->bytes, s, w->generic) == 0;
    }
run:
    for (k = 0; k < w->samples; k++) {
        long n = 0;

        pthread_barrier_wait(&bd_barrier);
        /* At least one round trip per sample, so that a sample shorter
         * than a round trip still measures one. */
        while (ok) {
            ok = bd_round_trip(d, src, dst, w->bytes, s, w->generic) == 0;
            n += ok;
            if (atomic_load_explicit(&bd_stop, memory_order_relaxed)
                || atomic_load_explicit(&bd_failed, memory_order_relaxed)) {
                break;
            }
        }
        w->counts[k] = n;
        pthread_barrier_wait(&bd_barrier);
    }
    bd_host_free(dst, w->pinned);
    bd_host_free(src, w->pinned);
    if (d != 0) {
        (void)cu.MemFree(d);
    }
    if (s != NULL) {
        (void)cu.StreamDestroy(s);
    }
    return NULL;
}

/* A row's result on stdout, "ok" and the seconds per operation of each
 * sample, when rc is 0; else the error kept, on stderr.  The exit
 * status. */
static int
bd_report(int rc, const double *per, int samples)
{
    int k;

    if (rc < 0) {
        fprintf(stderr, "bare_driver: %s\n", bd_err);
        return 1;
    }
    printf("ok");
    for (k = 0; k < samples; k++) {
        printf(" %.9g", per[k]);
    }
    printf("\n");
    return 0;
}

static int
bd_roundtrip(int nthreads, size_t bytes, int pinned, int samples, long ms)
{
    static bd_worker workers[BD_MAX_THREADS];
    pthread_t tids[BD_MAX_THREADS];
    double per[BD_MAX_SAMPLES];
    int started = 0;
    int k;
    int i;

    if (pthread_barrier_init(&bd_barrier, NULL, (unsigned)nthreads + 1)
        != 0) {
        fprintf(stderr, "bare_driver: pthread_barrier_init failed\n");
        return 1;
    }
    for (i = 0; i < nthreads; i++) {
        workers[i].bytes = bytes;
        workers[i].pinned = pinned != 0;
        workers[i].generic = pinned == 2;
        workers[i].samples = samples;
        if (pthread_create(&tids[i], NULL, bd_worker_main, &workers[i])
            != 0) {
            break;
        }
        started++;
    }
    if (started < nthreads) {
        /* The barrier counts on every thread: none can finish now. */
        fprintf(stderr, "bare_driver: pthread_create failed\n");
        exit(1);
    }
    for (k = 0; k < samples; k++) {
        double t0;
        double t1;
        long total = 0;

        atomic_store(&bd_stop, 0);
        pthread_barrier_wait(&bd_barrier);
        t0 = bd_now();
        bd_sleep_ms(ms);
        atomic_store(&bd_stop, 1);
        pthread_barrier_wait(&bd_barrier);
        t1 = bd_now();
        for (i = 0; i < nthreads; i++) {
            total += workers[i].counts[k];
        }
        per[k] = total > 0 ? (t1 - t0) / (double)total : 0.0;  /* failed */
    }
    for (i = 0; i < nthreads; i++) {
        pthread_join(tids[i], NULL);
    }
    pthread_barrier_destroy(&bd_barrier);
    return bd_report(atomic_load(&bd_failed) ? -1 : 0, per, samples);
}

/* Free the queued allocations; 0 or -1. */
static int
bd_flush(CUdeviceptr *queue, int *n)
{
    CUresult rc = CUDA_SUCCESS;
    int i;

    for (i = 0; i < *n; i++) {
        CUresult r = cu.MemFree(queue[i]);

        if (r != CUDA_SUCCESS && rc == CUDA_SUCCESS) {
            rc = r;
        }
    }
    *n = 0;
    if (rc != CUDA_SUCCESS) {
        bd_fail("cuMemFree", rc);
        return -1;
    }
    return 0;
}

static int
bd_churn(int deferred, int count, int samples, long ms)
{
    CUdeviceptr *queue;
    double per[BD_MAX_SAMPLES];
    int queued = 0;
    int shift = BD_CHURN_MIN;
    int rc = 0;
    int k;

    queue = malloc(((size_t)count + 1) * sizeof(*queue));
    if (queue == NULL) {
        fprintf(stderr, "bare_driver: out of memory\n");
        return 1;
    }
    /* One warm-up sample, not reported, then the samples. */
    for (k = -1; rc == 0 && k < samples; k++) {
        double t0 = bd_now();
        double t1 = t0;
        double end = t0 + (k < 0 ? 0.02 : 1e-3 * (double)ms);
        long n = 0;

        do {
            CUdeviceptr p;
            CUresult r = cu.MemAlloc(&p, (size_t)1 << shift);

            if (r != CUDA_SUCCESS) {
                bd_fail("cuMemAlloc", r);
                rc = -1;
                break;
            }
            shift = shift == BD_CHURN_MAX ? BD_CHURN_MIN : shift + 1;
            if (!deferred) {
                if ((r = cu.MemFree(p)) != CUDA_SUCCESS) {
                    bd_fail("cuMemFree", r);
                    rc = -1;
                    break;
                }
            }
            else {
                queue[queued++] = p;
                if (queued > count && bd_flush(queue, &queued) < 0) {
                    rc = -1;
                    break;
                }
            }
            n++;
            t1 = bd_now();
        } while (t1 < end);
        if (k >= 0 && rc == 0) {
            per[k] = (t1 - t0) / (double)n;
        }
    }
    if (bd_flush(queue, &queued) < 0) {
        rc = -1;
    }
    free(queue);
    return bd_report(rc, per, samples);
}

/* The copy rows' directions and calls (bd_copy). */
enum { BD_HTOD, BD_DTOH, BD_DTOH_NEW };
#define BD_ASYNC 1              /* the ...Async call on CU_STREAM_LEGACY */
#define BD_WAIT 2               /* then cuStreamSynchronize of it */
#define BD_QUERY 4              /* first cuPointerGetAttribute */
#define BD_PINNED 8             /* the host buffer page-locked */
#define BD_GENERIC 16           /* with BD_PINNED: cuMemcpy */

/* One copy of the copy rows; 0, or -1 with the error kept. */
static int
bd_copy_once(int dir, int call, CUdeviceptr d, void *host, size_t bytes)
{
    void *h = host;
    CUresult rc = CUDA_SUCCESS;
    const char *what = "";

    if (dir == BD_DTOH_NEW && (h = malloc(bytes)) == NULL) {
        bd_fail("malloc", CUDA_ERROR_OUT_OF_MEMORY);
        return -1;
    }
    if (call & BD_QUERY) {
        CUmemorytype t;

        rc = cu.PointerGetAttribute(&t, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                    (CUdeviceptr)(uintptr_t)h);
        if (rc != CUDA_ERROR_INVALID_VALUE) {
            /* Known to the driver (or another error): not pageable. */
            what = "cuPointerGetAttribute (pageable memory expected)";
            rc = rc == CUDA_SUCCESS ? CUDA_ERROR_INVALID_VALUE : rc;
            goto out;
        }
        rc = CUDA_SUCCESS;
    }
    if (call & BD_GENERIC) {
        what = "cuMemcpy";
        rc = dir == BD_HTOD ? cu.Memcpy(d, (CUdeviceptr)(uintptr_t)h, bytes)
                            : cu.Memcpy((CUdeviceptr)(uintptr_t)h, d, bytes);
        goto out;
    }
    if (!(call & BD_ASYNC)) {
        what = dir == BD_HTOD ? "cuMemcpyHtoD" : "cuMemcpyDtoH";
        rc = dir == BD_HTOD ? cu.MemcpyHtoD(d, h, bytes)
                            : cu.MemcpyDtoH(h, d, bytes);
        goto out;
    }
    what = dir == BD_HTOD ? "cuMemcpyHtoDAsync" : "cuMemcpyDtoHAsync";
    rc = dir == BD_HTOD ? cu.MemcpyHtoDAsync(d, h, bytes, CU_STREAM_LEGACY)
                        : cu.MemcpyDtoHAsync(h, d, bytes, CU_STREAM_LEGACY);
    if (rc == CUDA_SUCCESS && (call & BD_WAIT)) {
        what = "cuStreamSynchronize";
        rc = cu.StreamSynchronize(CU_STREAM_LEGACY);
    }
out:
    if (h != host) {
        free(h);
    }
    if (rc != CUDA_SUCCESS) {
        bd_fail(what, rc);
        return -1;
    }
    return 0;
}

static int
bd_copy(int dir, int call, size_t bytes, int samples, long ms)
{
    double per[BD_MAX_SAMPLES];
    CUdeviceptr d = 0;
    CUresult r;
    void *host;
    int rc = 0;
    int k;

    if ((r = cu.MemAlloc(&d, bytes)) != CUDA_SUCCESS) {
        bd_fail("cuMemAlloc", r);
        fprintf(stderr, "bare_driver: %s\n", bd_err);
        return 1;
    }
    host = bd_host_alloc(bytes, (call & BD_PINNED) != 0);
    if (host == NULL) {
        rc = -1;
    }
    /* One warm-up sample, not reported, then the samples. */
    for (k = -1; rc == 0 && k < samples; k++) {
        double t0 = bd_now();
        double t1 = t0;
        double end = t0 + (k < 0 ? 0.02 : 1e-3 * (double)ms);
        long n = 0;

        do {
            if (bd_copy_once(dir, call, d, host, bytes) < 0) {
                rc = -1;
                break;
            }
            n++;
            t1 = bd_now();
        } while (t1 < end);
        if (k >= 0 && rc == 0) {
            per[k] = (t1 - t0) / (double)n;
        }
    }
    bd_host_free(host, (call & BD_PINNED) != 0);
    (void)cu.MemFree(d);
    return bd_report(rc, per, samples);
}

static int
bd_usage(void)
{
    fprintf(stderr,
            "usage: bare_driver roundtrip THREADS BYTES "
            "pinned|pageable|pinned-generic SAMPLES MS\n"
            "       bare_driver churn plain|deferred COUNT SAMPLES MS\n"
            "       bare_driver copy htod|dtoh|dtoh-new "
            "sync|async|async-wait|query-async|query-async-wait|pinned|"
            "pinned-generic BYTES SAMPLES MS\n");
    return 2;
}

/* A whole decimal number in [lo, hi], or -1. */
static long
bd_arg(const char *s, long lo, long hi)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) {
        return -1;
    }
    return v;
}

int
main(int argc, char **argv)
{
    long a;
    long b;
    long samples;
    long ms;
    int mode;
    int call = 0;

    if (argc != 7 && argc != 6) {
        return bd_usage();
    }
    if (strcmp(argv[1], "roundtrip") == 0 && argc == 7) {
        a = bd_arg(argv[2], 1, BD_MAX_THREADS);
        b = bd_arg(argv[3], 1, 1L << 30);
        mode = strcmp(argv[4], "pinned") == 0 ? 1
               : strcmp(argv[4], "pinned-generic") == 0 ? 2
               : strcmp(argv[4], "pageable") == 0 ? 0 : -1;
        samples = bd_arg(argv[5], 1, BD_MAX_SAMPLES);
        ms = bd_arg(argv[6], 1, 60000);
    }
    else if (strcmp(argv[1], "churn") == 0 && argc == 6) {
        mode = strcmp(argv[2], "deferred") == 0 ? 1
               : strcmp(argv[2], "plain") == 0 ? 0 : -1;
        a = bd_arg(argv[3], 0, 1L << 20);
        b = 0;
        samples = bd_arg(argv[4], 1, BD_MAX_SAMPLES);
        ms = bd_arg(argv[5], 1, 60000);
    }
    else if (strcmp(argv[1], "copy") == 0 && argc == 7) {
        mode = strcmp(argv[2], "htod") == 0 ? BD_HTOD
               : strcmp(argv[2], "dtoh") == 0 ? BD_DTOH
               : strcmp(argv[2], "dtoh-new") == 0 ? BD_DTOH_NEW : -1;
        call = strcmp(argv[3], "sync") == 0 ? 0
               : strcmp(argv[3], "async") == 0 ? BD_ASYNC
               : strcmp(argv[3], "async-wait") == 0 ? BD_ASYNC | BD_WAIT
               : strcmp(argv[3], "query-async") == 0 ? BD_QUERY | BD_ASYNC
               : strcmp(argv[3], "query-async-wait") == 0
                 ? BD_QUERY | BD_ASYNC | BD_WAIT
               : strcmp(argv[3], "pinned") == 0 ? BD_PINNED
               : strcmp(argv[3], "pinned-generic") == 0
                 ? BD_PINNED | BD_GENERIC : -1;
        if ((call & BD_PINNED) && mode == BD_DTOH_NEW) {
            call = -1;          /* a new buffer each copy is pageable */
        }
        a = 0;
        b = bd_arg(argv[4], 1, 1L << 30);
        samples = bd_arg(argv[5], 1, BD_MAX_SAMPLES);
        ms = bd_arg(argv[6], 1, 60000);
    }
    else {
        return bd_usage();
    }
    if (a < 0 || call < 0 || b < 0 || mode < 0 || samples < 0 || ms < 0) {
        return bd_usage();
    }
    if (bd_load() < 0) {
        return 3;
    }
    if (bd_context() < 0) {
        fprintf(stderr, "bare_driver: %s\n", bd_err);
        return 3;
    }
    if (argv[1][0] == 'r') {
        return bd_roundtrip((int)a, (size_t)b, mode, (int)samples, ms);
    }
    if (argv[1][0] == 'c' && argv[1][1] == 'o') {
        return bd_copy(mode, call, (size_t)b, (int)samples, ms);
    }
    return bd_churn(mode, (int)a, (int)samples, ms);
}
