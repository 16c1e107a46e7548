/* SPDX-License-Identifier: MIT */
/*
 * sim.c: the CPU simulator of the CUDA driver.
 *
 * When CUDAMEM_SIMULATOR=1 the entry-point table cm_cu is filled from here
 * instead of libcuda.so.1, so that everything above the table runs, and is
 * tested, without a GPU.  The simulator aims to be honest: what the real
 * driver rejects it rejects with the same CUresult, and what the real
 * driver does asynchronously it does asynchronously (every stream has its
 * own worker thread), so a missing synchronisation is a visible bug.  As
 * in the driver, an asynchronous copy from pageable host memory consumes
 * its source before returning (the simulator keeps a snapshot), and one
 * into pageable host memory returns only once it has completed; copies
 * between page-locked host memory and the device stay asynchronous.
 *
 * What it owns: CUDAMEM_SIM_DEVICES devices of CUDAMEM_SIM_MEMORY bytes
 * each (every pair peer-capable unless CUDAMEM_SIM_NO_PEER names it, as
 * "0-1,2-3" or "all"); one primary context per device; every allocation (device, managed,
 * pinned host, registered host), each a separate host allocation whose
 * address is the device pointer; streams with their worker threads and
 * queues of operations; events.  Destroyed contexts are kept (never freed)
 * so that stale handles are recognised; streams and events are reference
 * counted and freed once nothing (handle, worker, dependency, waiter,
 * pending record) refers to them.
 *
 * Locking: one mutex, sim.lock, guards all shared state; sim.cond is
 * broadcast whenever an operation completes, and each stream's cv is
 * signalled when work arrives on it or it is destroyed.  The lock is never
 * held while an operation or a host function runs, so host functions may
 * call back into the simulator; calls that would have to wait are refused
 * there with CUDA_ERROR_NOT_PERMITTED (the driver allows that answer).
 * The per-thread context stack is thread-local and needs no lock.  Fault
 * injection uses atomics only.  In the child of a fork() after cuInit the
 * lock is never touched: every entry point answers NOT_INITIALIZED.
 *
 * Choices where the driver leaves room: frees (cuMemFree, cuMemFreeHost,
 * cuMemHostUnregister) wait for all queued work, as the driver's frees
 * synchronise; a thread's per-thread default streams are destroyed (after
 * draining) by a pthread key destructor when the thread exits; calls on an
 * explicit stream or event handle need no current context, calls on the
 * default streams and all memory calls do; boolean pointer attributes are
 * written as unsigned int.
 *
 * IPC (the section "Interprocess memory"): device allocations are
 * page-aligned and page-granular host memory, so that cuIpcGetMemHandle
 * can move one into a memfd (shared memory) in place; another process
 * opens it through /proc/<pid>/fd/<n>.  That section explains the choice.
 *
 * Stream-ordered allocation (cuMemAllocAsync / cuMemFreeAsync): each
 * device has one default pool, whose reserved memory (live and cached) is
 * charged to the device.  Both calls are operations on the stream.  A
 * freed chunk is reusable on its own stream at once and on others once
 * the free has run; a chunk is reused for requests of half its size up to
 * its size.  The pool releases cached chunks whose free has run down to
 * its release threshold (default 0) at every stream, event or context
 * synchronisation, and to the argument of cuMemPoolTrimTo; to grow, it
 * first releases its own idle chunks.  Destroying a context frees its
 * pool allocations and cached chunks; the pool's attributes stay.  Pools
 * made with cuMemPoolCreate behave the same; one made with the POSIX
 * file-descriptor handle type keeps its memory in a memfd, so that
 * another process can import the pool and its allocations (the section
 * "Shareable memory pools").
 *
 * Everything here is plain C11 and pthreads: it runs on worker threads
 * that never hold the GIL, so it must not call the Python API.
 */
#include "driver/cu_table.h"

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

#if defined(__SANITIZE_ADDRESS__)
#define SIM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SIM_ASAN 1
#endif
#endif
#ifdef SIM_ASAN
#include <sanitizer/asan_interface.h>
#endif

#define SIM_MAX_DEVICES 16
#define SIM_DEFAULT_MEMORY ((size_t)1 << 30)
/* Device allocations are charged in multiples of this. */
#define SIM_GRANULE 256
/* Alignment of device and pinned host allocations. */
#define SIM_DEVICE_ALIGN 256
/* CU_DEVICE_ATTRIBUTE_MAX_PITCH, also the largest pitch a copy accepts. */
#define SIM_MAX_PITCH 2147483647

/* ------------------------------------------------------------------ */
/* Types                                                               */
/* ------------------------------------------------------------------ */

typedef struct sim_ctx sim_ctx;
typedef struct sim_stream sim_stream;
typedef struct sim_event sim_event;
typedef struct sim_op sim_op;
typedef struct sim_ipc sim_ipc;
typedef struct sim_mempool sim_mempool;

/* A primary context.  The CUcontext handle is its address. */
struct sim_ctx {
    int dev;                /* device ordinal */
    int destroyed;          /* set once by reset/release; never freed */
    unsigned int peers;     /* bit d: peer access to device d enabled */
    sim_stream *legacy;     /* the legacy default stream, made lazily */
    sim_stream *streams;    /* every stream of this context not yet freed */
    sim_ctx *next_dead;     /* link in sim.dead */
};

/* What a stream synchronises with implicitly. */
enum {
    SIM_STREAM_BLOCKING,    /* cuStreamCreate(flags 0): syncs with legacy */
    SIM_STREAM_NONBLOCKING, /* CU_STREAM_NON_BLOCKING: never syncs */
    SIM_STREAM_LEGACY,      /* the context's legacy default stream */
    SIM_STREAM_PER_THREAD   /* a thread's per-thread default stream */
};

/* A stream: an in-order queue run by its own worker thread. */
struct sim_stream {
    sim_ctx *ctx;           /* owning context */
    int kind;               /* SIM_STREAM_* */
    int destroyed;          /* the handle is gone: drain, then exit */
    int refs;               /* handle, worker, deps, waiters, events */
    uint64_t submitted;     /* ticket of the last enqueued operation */
    uint64_t completed;     /* ticket of the last finished operation */
    sim_op *head;           /* oldest pending operation (maybe running) */
    sim_op *tail;           /* newest pending operation */
    pthread_cond_t cv;      /* work arrived, or the stream was destroyed */
    sim_stream *prev;       /* links in ctx->streams */
    sim_stream *next;
};

/* An event.  The CUevent handle is its address. */
struct sim_event {
    sim_ctx *ctx;           /* context current at creation */
    unsigned int flags;     /* CU_EVENT_* */
    int destroyed;          /* the handle is gone */
    int refs;               /* handle and pending records */
    uint64_t seq;           /* number of the last cuEventRecord */
    sim_stream *rec_stream; /* stream of the last record (a ref), or NULL */
    uint64_t rec_ticket;    /* its ticket on that stream */
    uint64_t done_seq;      /* number of the record that set time_ns */
    int64_t time_ns;        /* CLOCK_MONOTONIC time of that record */
};

/* One thing an operation waits for: ticket done on stream (a ref). */
typedef struct {
    sim_stream *stream;     /* held by a reference */
    uint64_t ticket;        /* wait until stream->completed >= ticket */
} sim_dep;

/* What an operation does. */
enum {
    SIM_OP_NOP,             /* ordering only (waits, prefetches) */
    SIM_OP_COPY,            /* a strided 3D copy (1D and 2D included) */
    SIM_OP_SET,             /* a byte memset */
    SIM_OP_HOSTFN,          /* cuLaunchHostFunc */
    SIM_OP_CALLBACK,        /* cuStreamAddCallback */
    SIM_OP_RECORD           /* cuEventRecord */
};

/* One operation queued on a stream. */
struct sim_op {
    sim_op *next;           /* next in the stream's queue */
    int kind;               /* SIM_OP_* */
    uint64_t ticket;        /* its number on the stream */
    uint64_t gseq;          /* its process-wide number, for draining */
    sim_dep *deps;          /* what it waits for before running */
    size_t ndeps;           /* used entries of deps */
    size_t capdeps;         /* allocated entries of deps */
    union {
        struct {
            char *dst;          /* first byte written */
            const char *src;    /* first byte read */
            size_t width;       /* bytes per row */
            size_t height;      /* rows per slice */
            size_t depth;       /* slices */
            size_t dpitch;      /* bytes between destination rows */
            size_t dslice;      /* bytes between destination slices */
            size_t spitch;      /* bytes between source rows */
            size_t sslice;      /* bytes between source slices */
            void *owned;        /* a snapshot of pageable source bytes,
                                 * freed with the op, or NULL */
        } copy;
        struct {
            char *dst;          /* first byte set */
            unsigned char value;  /* the byte */
            size_t n;           /* how many */
        } set;
        struct {
            CUhostFn fn;        /* the host function */
            void *data;         /* its argument */
        } hostfn;
        struct {
            CUstreamCallback fn;  /* the callback */
            CUstream handle;    /* the stream handle as the caller gave it */
            void *data;         /* its argument */
        } callback;
        struct {
            sim_event *event;   /* held by a reference */
            uint64_t seq;       /* which record of the event this is */
            int64_t time_ns;    /* when it ran */
        } record;
    } u;
};

/* Kinds of registered memory. */
enum {
    SIM_MEM_DEVICE,         /* cuMemAlloc */
    SIM_MEM_MANAGED,        /* cuMemAllocManaged */
    SIM_MEM_HOST,           /* cuMemHostAlloc */
    SIM_MEM_REGISTERED,     /* cuMemHostRegister */
    SIM_MEM_IPC,            /* cuIpcOpenMemHandle (another process's) */
    SIM_MEM_ASYNC,          /* cuMemAllocAsync / cuMemAllocFromPoolAsync */
    SIM_MEM_POOL_IMPORT     /* cuMemPoolImportPointer (another process's) */
};

/* Who is freeing an allocation (it stays registered while they wait). */
enum {
    SIM_DYING_NO,           /* live */
    SIM_DYING_FREE,         /* a free or unregister call */
    SIM_DYING_CTX           /* the destruction of its context */
};

/* One live allocation or registration. */
typedef struct {
    uintptr_t base;         /* first byte (the device pointer too) */
    size_t size;            /* bytes requested */
    size_t charged;         /* bytes charged to the device (0 for host) */
    int kind;               /* SIM_MEM_* */
    int dying;              /* SIM_DYING_*: being freed, no longer usable */
    sim_ctx *ctx;           /* context current at allocation */
    unsigned int flags;     /* the flags it was made with */
    uint64_t id;            /* CU_POINTER_ATTRIBUTE_BUFFER_ID */
    sim_ipc *ipc;           /* exported or imported: see sim_ipc; or NULL */
    sim_mempool *pool;      /* SIM_MEM_ASYNC: its pool; SIM_MEM_POOL_IMPORT:
                             * the imported pool; else NULL */
    uint64_t off;           /* in a shareable pool: its data offset */
    size_t span;            /* in a shareable pool: bytes mapped (whole
                             * pages); 0: heap memory */
} sim_alloc;

/* A chunk of a memory pool freed by cuMemFreeAsync and kept cached.
 * Its allocation is out of the registry (unusable) while it is here. */
typedef struct sim_chunk sim_chunk;
struct sim_chunk {
    sim_alloc *a;           /* the allocation, charged bytes included */
    sim_stream *stream;     /* the stream of the free (a ref), or NULL */
    uint64_t ticket;        /* the free's ticket on that stream */
    sim_chunk *next;        /* next cached chunk, newest first */
};

/* A memory pool: a device's default pool (cuDeviceGetDefaultMemPool),
 * one made by cuMemPoolCreate, or one imported from another process; the
 * CUmemoryPool handle is its address.  Reserved memory is charged to the
 * device whether it is in use or cached.  A destroyed pool stays until
 * nothing of it is left (live or cached allocations, imported
 * pointers), as the driver releases it then. */
struct sim_mempool {
    uint64_t threshold;     /* CU_MEMPOOL_ATTR_RELEASE_THRESHOLD */
    uint64_t reserved;      /* bytes held: used plus cached */
    uint64_t reserved_high; /* the most reserved has been */
    uint64_t used;          /* bytes of live allocations */
    uint64_t used_high;     /* the most used has been */
    int reuse[3];           /* the three CU_MEMPOOL_ATTR_REUSE_* flags */
    sim_chunk *cached;      /* freed chunks, newest first */
    int dev;                /* the device its memory is on */
    int created;            /* made by cuMemPoolCreate */
    int imported;           /* made by cuMemPoolImportFromShareableHandle */
    int destroyed;          /* cuMemPoolDestroy ran: the handle is gone */
    unsigned int handle_types;  /* CU_MEM_HANDLE_TYPE_* it allows */
    int fd;                 /* shareable: its memfd (ours), else -1 */
    uint64_t nonce;         /* shareable: the making process's nonce */
    uint64_t id;            /* shareable: its number in that process */
    uint64_t next_off;      /* made here, shareable: next data offset */
    uint64_t access;        /* bit d: device d may use its memory */
    size_t nimports;        /* imported: pointers imported, not freed */
    sim_mempool *next;      /* link in sim.pools (made or imported) */
};

/* One simulated device. */
typedef struct {
    sim_ctx *primary;       /* the live primary context, or NULL */
    int retains;            /* primary context retain count */
    unsigned int flags;     /* primary context flags (always 0) */
    size_t used;            /* bytes charged against sim.capacity */
    sim_mempool pool;       /* the default memory pool */
} sim_device;

/* Host memory given back by a pool while queued work may still touch it:
 * freed once every operation numbered <= g has run. */
typedef struct sim_grave sim_grave;
struct sim_grave {
    void *mem;              /* the host allocation, or mapping */
    size_t span;            /* a mapping's bytes; 0: heap memory */
    uint64_t g;             /* sim.gseq when it was given back */
    sim_grave *next;        /* next in sim.graves */
};

/* A sorted set of pointers (live stream and event handles). */
typedef struct {
    uintptr_t *v;           /* sorted ascending */
    size_t n;               /* used entries */
    size_t cap;             /* allocated entries */
} sim_set;

/* A thread's per-thread default stream for one context. */
typedef struct {
    sim_ctx *ctx;           /* stale once ctx->destroyed */
    sim_stream *stream;     /* valid while ctx is not destroyed */
} sim_ptds;

/* What the simulator keeps per thread. */
typedef struct {
    sim_ctx **stack;        /* the context stack, top last */
    size_t n;               /* its depth */
    size_t cap;             /* allocated entries */
    sim_ptds *ptds;         /* per-thread default streams */
    size_t nptds;           /* used entries */
    size_t capptds;         /* allocated entries */
} sim_tls;

/* Values of sim_state. */
enum {
    SIM_UNINIT,             /* cuInit not yet called */
    SIM_READY,              /* initialised */
    SIM_FORKED              /* the child of a fork() after cuInit */
};

/* All shared state; guarded by lock unless noted. */
static struct {
    pthread_mutex_t lock;   /* the simulator lock */
    pthread_cond_t cond;    /* broadcast when any operation completes */
    int ndev;               /* device count (set by cuInit) */
    size_t capacity;        /* bytes per device (set by cuInit) */
    uint16_t no_peer[SIM_MAX_DEVICES];  /* bit d of [e]: devices e and d
                                         * lack peer access (cuInit, from
                                         * CUDAMEM_SIM_NO_PEER) */
    long delay_us;          /* sleep before each operation (cuInit) */
    sim_device dev[SIM_MAX_DEVICES];  /* the devices */
    sim_ctx *dead;          /* destroyed contexts, kept forever */
    sim_alloc **allocs;     /* live allocations, sorted by base */
    size_t nallocs;         /* used entries of allocs */
    size_t capallocs;       /* allocated entries of allocs */
    uint64_t next_id;       /* last buffer id handed out */
    uint64_t gseq;          /* last process-wide operation number */
    sim_set streams;        /* live user stream handles */
    sim_set events;         /* live event handles */
    sim_grave *graves;      /* pool memory waiting to be freed */
    sim_mempool *pools;     /* pools made or imported, not yet freed */
    uint64_t next_pool_id;  /* last shareable pool number handed out */
} sim = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .cond = PTHREAD_COND_INITIALIZER,
};

/* SIM_*; read without the lock by every entry point. */
static atomic_int sim_state;
/* Whether stream handle 0 is the per-thread default stream. */
static atomic_int sim_per_thread;

/* This thread's stack and per-thread streams, or NULL. */
static _Thread_local sim_tls *tls;
/* The stream whose worker this thread is, or NULL. */
static _Thread_local sim_stream *tls_worker;
/* Frees tls at thread exit. */
static pthread_key_t tls_key;
static pthread_once_t tls_once = PTHREAD_ONCE_INIT;
/* Registers the fork handler. */
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
/* Random, naming this process's exports (IPC and shareable pools); made
 * on first use (lock held), 0 until then. */
static uint64_t sim_ipc_nonce;

static void sim_stream_destroy(sim_stream *s);
static void sim_ipc_release(sim_alloc *a);
static size_t sim_device_span(size_t size);

/* Pages of their own for host or managed memory, as the driver maps
 * them (and unmaps them when they are freed or their context goes);
 * NULL when memory is short. */
static void *
sim_host_map(size_t size)
{
    size_t span = sim_device_span(size);
    void *p;

    if (span == SIZE_MAX) {
        return NULL;
    }
    p = mmap(NULL, span, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}
static void sim_mempool_drop_ctx(int dev, const sim_ctx *c);
static void sim_mempools_settle(void);
static void sim_pool_mem_release(sim_mempool *mp, sim_alloc *a);
static void sim_mempool_reap(sim_mempool *mp);

/* ------------------------------------------------------------------ */
/* Fault injection                                                     */
/* ------------------------------------------------------------------ */

/* How many entry points have a fault armed. */
static atomic_long inj_armed;
/* Per entry point: calls left until the fault (0: disarmed). */
static atomic_long inj_left[CM_CU_N_FUNCS];
/* Per entry point: the code the fault returns. */
static atomic_int inj_code[CM_CU_N_FUNCS];

int
cm_sim_inject(int idx, long nth, CUresult code)
{
    long old;

    if (idx < 0 || idx >= CM_CU_N_FUNCS || nth < 0) {
        return -1;
    }
    atomic_store(&inj_code[idx], (int)code);
    old = atomic_exchange(&inj_left[idx], nth);
    atomic_fetch_add(&inj_armed, (long)(nth > 0) - (long)(old > 0));
    return 0;
}

/* Whether this call of entry point idx is the armed one; sets *rc. */
static int
sim_inject_slow(int idx, CUresult *rc)
{
    long left = atomic_load(&inj_left[idx]);

    while (left > 0) {
        if (atomic_compare_exchange_weak(&inj_left[idx], &left, left - 1)) {
            if (left == 1) {
                atomic_fetch_sub(&inj_armed, 1);
                *rc = (CUresult)atomic_load(&inj_code[idx]);
                return 1;
            }
            return 0;
        }
    }
    return 0;
}

static inline int
sim_injected(int idx, CUresult *rc)
{
    if (atomic_load_explicit(&inj_armed, memory_order_relaxed) == 0) {
        return 0;
    }
    return sim_inject_slow(idx, rc);
}

/* The start of every entry point: an armed fault, then the init rule. */
#define SIM_ENTER(name)                                                 \
    do {                                                                \
        CUresult sim_rc_;                                               \
        if (sim_injected(CM_CU_IDX_##name, &sim_rc_)) {                 \
            return sim_rc_;                                             \
        }                                                               \
        if (atomic_load_explicit(&sim_state, memory_order_acquire)      \
            != SIM_READY) {                                             \
            return CUDA_ERROR_NOT_INITIALIZED;                          \
        }                                                               \
    } while (0)

/* The same for the entry points that work before cuInit. */
#define SIM_ENTER_NOINIT(name)                                          \
    do {                                                                \
        CUresult sim_rc_;                                               \
        if (sim_injected(CM_CU_IDX_##name, &sim_rc_)) {                 \
            return sim_rc_;                                             \
        }                                                               \
    } while (0)

/* ------------------------------------------------------------------ */
/* Small helpers                                                       */
/* ------------------------------------------------------------------ */

static void
sim_lock(void)
{
    pthread_mutex_lock(&sim.lock);
}

static void
sim_unlock(void)
{
    pthread_mutex_unlock(&sim.lock);
}

static int64_t
sim_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* This process's sim_ipc_nonce, made on the first call (lock held). */
static uint64_t
sim_nonce(void)
{
    while (sim_ipc_nonce == 0) {
        if (getrandom(&sim_ipc_nonce, sizeof(sim_ipc_nonce), 0)
            != (ssize_t)sizeof(sim_ipc_nonce)) {
            sim_ipc_nonce = (uint64_t)sim_now_ns() ^ ((uint64_t)getpid() << 32);
        }
    }
    return sim_ipc_nonce;
}

static void
sim_sleep_us(long us)
{
    struct timespec ts;

    ts.tv_sec = us / 1000000;
    ts.tv_nsec = (us % 1000000) * 1000;
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* An integer environment variable in [lo, hi], or dflt. */
static unsigned long long
sim_env_ull(const char *name, unsigned long long lo, unsigned long long hi,
            unsigned long long dflt)
{
    const char *s = getenv(name);
    char *end;
    unsigned long long v;

    if (s == NULL || *s < '0' || *s > '9') {
        return dflt;
    }
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi) {
        return dflt;
    }
    return v;
}

static int
sim_set_find(const sim_set *set, uintptr_t p, size_t *pos)
{
    size_t lo = 0, hi = set->n;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (set->v[mid] < p) {
            lo = mid + 1;
        }
        else {
            hi = mid;
        }
    }
    *pos = lo;
    return lo < set->n && set->v[lo] == p;
}

static int
sim_set_has(const sim_set *set, const void *p)
{
    size_t pos;

    return sim_set_find(set, (uintptr_t)p, &pos);
}

/* 0, or -1 when out of memory. */
static int
sim_set_add(sim_set *set, const void *p)
{
    size_t pos;

    if (sim_set_find(set, (uintptr_t)p, &pos)) {
        return 0;
    }
    if (set->n == set->cap) {
        size_t cap = set->cap ? set->cap * 2 : 16;
        uintptr_t *v = realloc(set->v, cap * sizeof(*v));
        if (v == NULL) {
            return -1;
        }
        set->v = v;
        set->cap = cap;
    }
    memmove(&set->v[pos + 1], &set->v[pos],
            (set->n - pos) * sizeof(set->v[0]));
    set->v[pos] = (uintptr_t)p;
    set->n++;
    return 0;
}

static void
sim_set_del(sim_set *set, const void *p)
{
    size_t pos;

    if (sim_set_find(set, (uintptr_t)p, &pos)) {
        memmove(&set->v[pos], &set->v[pos + 1],
                (set->n - pos - 1) * sizeof(set->v[0]));
        set->n--;
    }
}

/* ------------------------------------------------------------------ */
/* Error names                                                         */
/* ------------------------------------------------------------------ */

/* One CUresult with its name and description. */
typedef struct {
    CUresult code;          /* the value */
    const char *name;       /* "CUDA_ERROR_INVALID_VALUE" */
    const char *text;       /* "invalid argument" */
} sim_err;

#define SIM_ERR(code, text) {code, #code, text}

/* Sorted by code for bsearch. */
static const sim_err sim_errs[] = {
/* Generated once from the CUDA 13.0 cuda.h (enum cudaError_enum): the
 * common codes carry the driver's own short strings, the rest the first
 * sentence of their cuda.h comment. */
    SIM_ERR(CUDA_SUCCESS,
            "no error"),
    SIM_ERR(CUDA_ERROR_INVALID_VALUE,
            "invalid argument"),
    SIM_ERR(CUDA_ERROR_OUT_OF_MEMORY,
            "out of memory"),
    SIM_ERR(CUDA_ERROR_NOT_INITIALIZED,
            "initialization error"),
    SIM_ERR(CUDA_ERROR_DEINITIALIZED,
            "driver shutting down"),
    SIM_ERR(CUDA_ERROR_PROFILER_DISABLED,
            "This indicates profiler is not initialized for this run"),
    SIM_ERR(CUDA_ERROR_PROFILER_NOT_INITIALIZED,
            "This error return is deprecated as of CUDA 5.0"),
    SIM_ERR(CUDA_ERROR_PROFILER_ALREADY_STARTED,
            "This error return is deprecated as of CUDA 5.0"),
    SIM_ERR(CUDA_ERROR_PROFILER_ALREADY_STOPPED,
            "This error return is deprecated as of CUDA 5.0"),
    SIM_ERR(CUDA_ERROR_STUB_LIBRARY,
            "This indicates that the CUDA driver that the application has "
            "loaded is a stub library"),
    SIM_ERR(CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER,
            "This indicates that the API call requires a newer CUDA driver "
            "than the one currently installed"),
    SIM_ERR(CUDA_ERROR_DEVICE_UNAVAILABLE,
            "This indicates that requested CUDA device is unavailable at "
            "the current time"),
    SIM_ERR(CUDA_ERROR_NO_DEVICE,
            "no CUDA-capable device is detected"),
    SIM_ERR(CUDA_ERROR_INVALID_DEVICE,
            "invalid device ordinal"),
    SIM_ERR(CUDA_ERROR_DEVICE_NOT_LICENSED,
            "This error indicates that the Grid license is not applied"),
    SIM_ERR(CUDA_ERROR_INVALID_IMAGE,
            "device kernel image is invalid"),
    SIM_ERR(CUDA_ERROR_INVALID_CONTEXT,
            "invalid device context"),
    SIM_ERR(CUDA_ERROR_CONTEXT_ALREADY_CURRENT,
            "This indicated that the context being supplied as a parameter "
            "to the API call was already the active context"),
    SIM_ERR(CUDA_ERROR_MAP_FAILED,
            "This indicates that a map or register operation has failed"),
    SIM_ERR(CUDA_ERROR_UNMAP_FAILED,
            "This indicates that an unmap or unregister operation has "
            "failed"),
    SIM_ERR(CUDA_ERROR_ARRAY_IS_MAPPED,
            "This indicates that the specified array is currently mapped "
            "and thus cannot be destroyed"),
    SIM_ERR(CUDA_ERROR_ALREADY_MAPPED,
            "resource already mapped"),
    SIM_ERR(CUDA_ERROR_NO_BINARY_FOR_GPU,
            "This indicates that there is no kernel image available that is"
            " suitable for the device"),
    SIM_ERR(CUDA_ERROR_ALREADY_ACQUIRED,
            "This indicates that a resource has already been acquired"),
    SIM_ERR(CUDA_ERROR_NOT_MAPPED,
            "This indicates that a resource is not mapped"),
    SIM_ERR(CUDA_ERROR_NOT_MAPPED_AS_ARRAY,
            "This indicates that a mapped resource is not available for "
            "access as an array"),
    SIM_ERR(CUDA_ERROR_NOT_MAPPED_AS_POINTER,
            "This indicates that a mapped resource is not available for "
            "access as a pointer"),
    SIM_ERR(CUDA_ERROR_ECC_UNCORRECTABLE,
            "This indicates that an uncorrectable ECC error was detected "
            "during execution"),
    SIM_ERR(CUDA_ERROR_UNSUPPORTED_LIMIT,
            "This indicates that the CUlimit passed to the API call is not "
            "supported by the active device"),
    SIM_ERR(CUDA_ERROR_CONTEXT_ALREADY_IN_USE,
            "This indicates that the CUcontext passed to the API call can "
            "only be bound to a single CPU thread at a time but is already "
            "bound to a CPU thread"),
    SIM_ERR(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
            "peer access is not supported between these two devices"),
    SIM_ERR(CUDA_ERROR_INVALID_PTX,
            "a PTX JIT compilation failed"),
    SIM_ERR(CUDA_ERROR_INVALID_GRAPHICS_CONTEXT,
            "This indicates an error with OpenGL or DirectX context"),
    SIM_ERR(CUDA_ERROR_NVLINK_UNCORRECTABLE,
            "This indicates that an uncorrectable NVLink error was detected"
            " during the execution"),
    SIM_ERR(CUDA_ERROR_JIT_COMPILER_NOT_FOUND,
            "This indicates that the PTX JIT compiler library was not found"),
    SIM_ERR(CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
            "This indicates that the provided PTX was compiled with an "
            "unsupported toolchain"),
    SIM_ERR(CUDA_ERROR_JIT_COMPILATION_DISABLED,
            "This indicates that the PTX JIT compilation was disabled"),
    SIM_ERR(CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY,
            "This indicates that the CUexecAffinityType passed to the API "
            "call is not supported by the active device"),
    SIM_ERR(CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC,
            "This indicates that the code to be compiled by the PTX JIT "
            "contains unsupported call to cudaDeviceSynchronize"),
    SIM_ERR(CUDA_ERROR_CONTAINED,
            "This indicates that an exception occurred on the device that "
            "is now contained by the GPU's error containment capability"),
    SIM_ERR(CUDA_ERROR_INVALID_SOURCE,
            "This indicates that the device kernel source is invalid"),
    SIM_ERR(CUDA_ERROR_FILE_NOT_FOUND,
            "This indicates that the file specified was not found"),
    SIM_ERR(CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND,
            "This indicates that a link to a shared object failed to "
            "resolve"),
    SIM_ERR(CUDA_ERROR_SHARED_OBJECT_INIT_FAILED,
            "This indicates that initialization of a shared object failed"),
    SIM_ERR(CUDA_ERROR_OPERATING_SYSTEM,
            "OS call failed or operation not supported on this OS"),
    SIM_ERR(CUDA_ERROR_INVALID_HANDLE,
            "invalid resource handle"),
    SIM_ERR(CUDA_ERROR_ILLEGAL_STATE,
            "This indicates that a resource required by the API call is not"
            " in a valid state to perform the requested operation"),
    SIM_ERR(CUDA_ERROR_LOSSY_QUERY,
            "This indicates an attempt was made to introspect an object in "
            "a way that would discard semantically important information"),
    SIM_ERR(CUDA_ERROR_NOT_FOUND,
            "named symbol not found"),
    SIM_ERR(CUDA_ERROR_NOT_READY,
            "device not ready"),
    SIM_ERR(CUDA_ERROR_ILLEGAL_ADDRESS,
            "an illegal memory access was encountered"),
    SIM_ERR(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
            "This indicates that a launch did not occur because it did not "
            "have appropriate resources"),
    SIM_ERR(CUDA_ERROR_LAUNCH_TIMEOUT,
            "This indicates that the device kernel took too long to execute"),
    SIM_ERR(CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING,
            "This error indicates a kernel launch that uses an incompatible"
            " texturing mode"),
    SIM_ERR(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
            "peer access is already enabled"),
    SIM_ERR(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED,
            "peer access has not been enabled"),
    SIM_ERR(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE,
            "This error indicates that the primary context for the "
            "specified device has already been initialized"),
    SIM_ERR(CUDA_ERROR_CONTEXT_IS_DESTROYED,
            "context is destroyed"),
    SIM_ERR(CUDA_ERROR_ASSERT,
            "A device-side assert triggered during kernel execution"),
    SIM_ERR(CUDA_ERROR_TOO_MANY_PEERS,
            "This error indicates that the hardware resources required to "
            "enable peer access have been exhausted for one or more of the "
            "devices passed to cuCtxEnablePeerAccess()"),
    SIM_ERR(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
            "part or all of the requested memory range is already mapped"),
    SIM_ERR(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
            "pointer does not correspond to a registered memory region"),
    SIM_ERR(CUDA_ERROR_HARDWARE_STACK_ERROR,
            "While executing a kernel, the device encountered a stack error"),
    SIM_ERR(CUDA_ERROR_ILLEGAL_INSTRUCTION,
            "While executing a kernel, the device encountered an illegal "
            "instruction"),
    SIM_ERR(CUDA_ERROR_MISALIGNED_ADDRESS,
            "While executing a kernel, the device encountered a load or "
            "store instruction on a memory address which is not aligned"),
    SIM_ERR(CUDA_ERROR_INVALID_ADDRESS_SPACE,
            "While executing a kernel, the device encountered an "
            "instruction which can only operate on memory locations in "
            "certain address spaces (global, shared, or local), but was "
            "supplied a memory address not belonging to an allowed address "
            "space"),
    SIM_ERR(CUDA_ERROR_INVALID_PC,
            "While executing a kernel, the device program counter wrapped "
            "its address space"),
    SIM_ERR(CUDA_ERROR_LAUNCH_FAILED,
            "unspecified launch failure"),
    SIM_ERR(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
            "This error indicates that the number of blocks launched per "
            "grid for a kernel that was launched via either "
            "cuLaunchCooperativeKernel or "
            "cuLaunchCooperativeKernelMultiDevice exceeds the maximum "
            "number of blocks as allowed by "
            "cuOccupancyMaxActiveBlocksPerMultiprocessor or "
            "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags times the"
            " number of multiprocessors as specified by the device "
            "attribute CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT"),
    SIM_ERR(CUDA_ERROR_TENSOR_MEMORY_LEAK,
            "An exception occurred on the device while exiting a kernel "
            "using tensor memory: the tensor memory was not completely "
            "deallocated"),
    SIM_ERR(CUDA_ERROR_NOT_PERMITTED,
            "operation not permitted"),
    SIM_ERR(CUDA_ERROR_NOT_SUPPORTED,
            "operation not supported"),
    SIM_ERR(CUDA_ERROR_SYSTEM_NOT_READY,
            "This error indicates that the system is not yet ready to start"
            " any CUDA work"),
    SIM_ERR(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,
            "This error indicates that there is a mismatch between the "
            "versions of the display driver and the CUDA driver"),
    SIM_ERR(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE,
            "This error indicates that the system was upgraded to run with "
            "forward compatibility but the visible hardware detected by "
            "CUDA does not support this configuration"),
    SIM_ERR(CUDA_ERROR_MPS_CONNECTION_FAILED,
            "This error indicates that the MPS client failed to connect to "
            "the MPS control daemon or the MPS server"),
    SIM_ERR(CUDA_ERROR_MPS_RPC_FAILURE,
            "This error indicates that the remote procedural call between "
            "the MPS server and the MPS client failed"),
    SIM_ERR(CUDA_ERROR_MPS_SERVER_NOT_READY,
            "This error indicates that the MPS server is not ready to "
            "accept new MPS client requests"),
    SIM_ERR(CUDA_ERROR_MPS_MAX_CLIENTS_REACHED,
            "This error indicates that the hardware resources required to "
            "create MPS client have been exhausted"),
    SIM_ERR(CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED,
            "This error indicates the the hardware resources required to "
            "support device connections have been exhausted"),
    SIM_ERR(CUDA_ERROR_MPS_CLIENT_TERMINATED,
            "This error indicates that the MPS client has been terminated "
            "by the server"),
    SIM_ERR(CUDA_ERROR_CDP_NOT_SUPPORTED,
            "This error indicates that the module is using CUDA Dynamic "
            "Parallelism, but the current configuration, like MPS, does not"
            " support it"),
    SIM_ERR(CUDA_ERROR_CDP_VERSION_MISMATCH,
            "This error indicates that a module contains an unsupported "
            "interaction between different versions of CUDA Dynamic "
            "Parallelism"),
    SIM_ERR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
            "This error indicates that the operation is not permitted when "
            "the stream is capturing"),
    SIM_ERR(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
            "This error indicates that the current capture sequence on the "
            "stream has been invalidated due to a previous error"),
    SIM_ERR(CUDA_ERROR_STREAM_CAPTURE_MERGE,
            "This error indicates that the operation would have resulted in"
            " a merge of two independent capture sequences"),
    SIM_ERR(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
            "This error indicates that the capture was not initiated in "
            "this stream"),
    SIM_ERR(CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
            "This error indicates that the capture sequence contains a fork"
            " that was not joined to the primary stream"),
    SIM_ERR(CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
            "This error indicates that a dependency would have been created"
            " which crosses the capture sequence boundary"),
    SIM_ERR(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
            "This error indicates a disallowed implicit dependency on a "
            "current capture sequence from cudaStreamLegacy"),
    SIM_ERR(CUDA_ERROR_CAPTURED_EVENT,
            "This error indicates that the operation is not permitted on an"
            " event which was last recorded in a capturing stream"),
    SIM_ERR(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
            "A stream capture sequence not initiated with the "
            "CU_STREAM_CAPTURE_MODE_RELAXED argument to "
            "cuStreamBeginCapture was passed to cuStreamEndCapture in a "
            "different thread"),
    SIM_ERR(CUDA_ERROR_TIMEOUT,
            "This error indicates that the timeout specified for the wait "
            "operation has lapsed"),
    SIM_ERR(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE,
            "This error indicates that the graph update was not performed "
            "because it included changes which violated constraints "
            "specific to instantiated graph update"),
    SIM_ERR(CUDA_ERROR_EXTERNAL_DEVICE,
            "This indicates that an async error has occurred in a device "
            "outside of CUDA. If CUDA was waiting for an external device's "
            "signal before consuming shared data, the external device "
            "signaled an error indicating that the data is not valid for "
            "consumption"),
    SIM_ERR(CUDA_ERROR_INVALID_CLUSTER_SIZE,
            "Indicates a kernel launch error due to cluster "
            "misconfiguration"),
    SIM_ERR(CUDA_ERROR_FUNCTION_NOT_LOADED,
            "Indiciates a function handle is not loaded when calling an API"
            " that requires a loaded function"),
    SIM_ERR(CUDA_ERROR_INVALID_RESOURCE_TYPE,
            "This error indicates one or more resources passed in are not "
            "valid resource types for the operation"),
    SIM_ERR(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION,
            "This error indicates one or more resources are insufficient or"
            " non-applicable for the operation"),
    SIM_ERR(CUDA_ERROR_KEY_ROTATION,
            "This error indicates that an error happened during the key "
            "rotation sequence"),
    SIM_ERR(CUDA_ERROR_UNKNOWN,
            "unknown error"),
};

static int
sim_err_cmp(const void *key, const void *elem)
{
    CUresult k = *(const CUresult *)key;
    CUresult e = ((const sim_err *)elem)->code;

    return (k > e) - (k < e);
}

static const sim_err *
sim_err_find(CUresult code)
{
    return bsearch(&code, sim_errs, sizeof(sim_errs) / sizeof(sim_errs[0]),
                   sizeof(sim_errs[0]), sim_err_cmp);
}

static CUresult
sim_GetErrorName(CUresult error, const char **pStr)
{
    const sim_err *e;

    SIM_ENTER_NOINIT(GetErrorName);
    if (pStr == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    e = sim_err_find(error);
    *pStr = e ? e->name : NULL;
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult
sim_GetErrorString(CUresult error, const char **pStr)
{
    const sim_err *e;

    SIM_ENTER_NOINIT(GetErrorString);
    if (pStr == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    e = sim_err_find(error);
    *pStr = e ? e->text : NULL;
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ------------------------------------------------------------------ */
/* Initialisation and fork                                             */
/* ------------------------------------------------------------------ */

static void
sim_atfork_child(void)
{
    if (atomic_load(&sim_state) == SIM_READY) {
        /* The workers are gone and the lock may be held by one of them:
         * never touch either again. */
        atomic_store(&sim_state, SIM_FORKED);
    }
    else if (atomic_load(&sim_state) == SIM_UNINIT) {
        /* Nothing was started; a cuInit racing the fork may have held
         * the lock, so start the child with a fresh one. */
        pthread_mutex_init(&sim.lock, NULL);
        pthread_cond_init(&sim.cond, NULL);
    }
}

static void
sim_register_atfork(void)
{
    pthread_atfork(NULL, NULL, sim_atfork_child);
}

/* CUDAMEM_SIM_NO_PEER: pairs of devices that lack peer access, as
 * "0-1,2-3" (either order), or "all".  Lock held, from cuInit; bad
 * entries are ignored. */
static void
sim_parse_no_peer(void)
{
    const char *s = getenv("CUDAMEM_SIM_NO_PEER");
    char *end;
    long a;
    long b;
    int i;

    memset(sim.no_peer, 0, sizeof(sim.no_peer));
    if (s == NULL) {
        return;
    }
    if (strcmp(s, "all") == 0) {
        for (i = 0; i < SIM_MAX_DEVICES; i++) {
            sim.no_peer[i] = (uint16_t)~(1u << i);
        }
        return;
    }
    while (*s != '\0') {
        a = strtol(s, &end, 10);
        if (end == s || *end != '-') {
            return;
        }
        s = end + 1;
        b = strtol(s, &end, 10);
        if (end == s) {
            return;
        }
        s = *end == ',' ? end + 1 : end;
        if (a >= 0 && a < SIM_MAX_DEVICES && b >= 0 && b < SIM_MAX_DEVICES
            && a != b) {
            sim.no_peer[a] |= (uint16_t)(1u << b);
            sim.no_peer[b] |= (uint16_t)(1u << a);
        }
        if (*end != ',' && *end != '\0') {
            return;
        }
    }
}

static CUresult
sim_Init(unsigned int Flags)
{
    int d;

    SIM_ENTER_NOINIT(Init);
    if (atomic_load(&sim_state) == SIM_FORKED) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (Flags != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    if (atomic_load(&sim_state) == SIM_UNINIT) {
        sim.ndev = (int)sim_env_ull("CUDAMEM_SIM_DEVICES", 1,
                                    SIM_MAX_DEVICES, 1);
        sim.capacity = (size_t)sim_env_ull("CUDAMEM_SIM_MEMORY", 1, SIZE_MAX,
                                           SIM_DEFAULT_MEMORY);
        sim.delay_us = (long)sim_env_ull("CUDAMEM_SIM_DELAY_US", 0,
                                         60000000, 0);
        sim_parse_no_peer();
        for (d = 0; d < SIM_MAX_DEVICES; d++) {
            sim.dev[d].pool.dev = d;
            sim.dev[d].pool.fd = -1;
            sim.dev[d].pool.access = (uint64_t)1 << d;
        }
        atomic_store_explicit(&sim_state, SIM_READY, memory_order_release);
    }
    sim_unlock();
    return CUDA_SUCCESS;
}

static CUresult
sim_DriverGetVersion(int *driverVersion)
{
    SIM_ENTER_NOINIT(DriverGetVersion);
    if (driverVersion == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *driverVersion = 13000;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* Devices                                                             */
/* ------------------------------------------------------------------ */

static int
sim_dev_ok(CUdevice dev)
{
    return dev >= 0 && dev < sim.ndev;
}

static CUresult
sim_DeviceGet(CUdevice *device, int ordinal)
{
    SIM_ENTER(DeviceGet);
    if (device == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!sim_dev_ok(ordinal)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    *device = ordinal;
    return CUDA_SUCCESS;
}

static CUresult
sim_DeviceGetCount(int *count)
{
    SIM_ENTER(DeviceGetCount);
    if (count == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *count = sim.ndev;
    return CUDA_SUCCESS;
}

static CUresult
sim_DeviceGetName(char *name, int len, CUdevice dev)
{
    SIM_ENTER(DeviceGetName);
    if (!sim_dev_ok(dev)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    if (name == NULL || len <= 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    snprintf(name, (size_t)len, "%s", "cudamem simulator");
    return CUDA_SUCCESS;
}

/* One attribute value that is not 0. */
typedef struct {
    CUdevice_attribute attr;  /* the attribute */
    int value;                /* its value on every simulated device */
} sim_attr;

/* An H100-like device; everything absent here is 0. */
static const sim_attr sim_attrs[] = {
    {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, 64},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, 2147483647},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, 65535},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, 65535},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, 49152},
    {CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY, 65536},
    {CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32},
    {CU_DEVICE_ATTRIBUTE_MAX_PITCH, SIM_MAX_PITCH},
    {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, 65536},
    {CU_DEVICE_ATTRIBUTE_CLOCK_RATE, 1980000},
    {CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT, 512},
    {CU_DEVICE_ATTRIBUTE_GPU_OVERLAP, 1},
    {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132},
    {CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 1},
    {CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS, 1},
    {CU_DEVICE_ATTRIBUTE_ECC_ENABLED, 1},
    {CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, 2619000},
    {CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, 5120},
    {CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, 52428800},
    {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 2048},
    {CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT, 2},
    {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1},
    {CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT, 32},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0},
    {CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, 233472},
    {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR, 65536},
    {CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 1},
    {CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO, 2},
    {CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 1},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, 1},
    {CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, 1},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 232448},
    {CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR, 32},
    {CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK, 1024},
    {CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES,
     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR},
    {CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH, 1},
    {CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_UNIFIED_FUNCTION_POINTERS, 1},
};

static CUresult
sim_DeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    size_t i;

    SIM_ENTER(DeviceGetAttribute);
    if (pi == NULL || (int)attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!sim_dev_ok(dev)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
        *pi = dev + 1;
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD_GROUP_ID:
        *pi = dev;
        return CUDA_SUCCESS;
    default:
        break;
    }
    *pi = 0;
    for (i = 0; i < sizeof(sim_attrs) / sizeof(sim_attrs[0]); i++) {
        if (sim_attrs[i].attr == attrib) {
            *pi = sim_attrs[i].value;
            break;
        }
    }
    return CUDA_SUCCESS;
}

static CUresult
sim_DeviceTotalMem(size_t *bytes, CUdevice dev)
{
    SIM_ENTER(DeviceTotalMem);
    if (bytes == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!sim_dev_ok(dev)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    *bytes = sim.capacity;
    return CUDA_SUCCESS;
}

static CUresult
sim_DeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    static const unsigned char base[16] = {
        0x63, 0x75, 0x64, 0x61, 0x6d, 0x65, 0x6d, 0x2d,   /* "cudamem-" */
        0x73, 0x69, 0x6d, 0x00, 0x00, 0x00, 0x00, 0x00,   /* "sim" */
    };
    int i;

    SIM_ENTER(DeviceGetUuid);
    if (uuid == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!sim_dev_ok(dev)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    for (i = 0; i < 16; i++) {
        uuid->bytes[i] = (char)base[i];
    }
    uuid->bytes[15] = (char)(dev + 1);
    return CUDA_SUCCESS;
}

static CUresult
sim_DeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
    SIM_ENTER(DeviceGetPCIBusId);
    if (!sim_dev_ok(dev)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    if (pciBusId == NULL || len <= 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    snprintf(pciBusId, (size_t)len, "0000:%02x:00.0", (unsigned)(dev + 1));
    return CUDA_SUCCESS;
}

static CUresult
sim_DeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)
{
    SIM_ENTER(DeviceCanAccessPeer);
    if (canAccessPeer == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!sim_dev_ok(dev) || !sim_dev_ok(peerDev)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    *canAccessPeer = dev != peerDev
                     && !(sim.no_peer[dev] & (1u << peerDev));
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* The allocation registry (lock held)                                 */
/* ------------------------------------------------------------------ */

/* Index of the first allocation whose base is > p. */
static size_t
sim_alloc_upper(uintptr_t p)
{
    size_t lo = 0, hi = sim.nallocs;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (sim.allocs[mid]->base <= p) {
            lo = mid + 1;
        }
        else {
            hi = mid;
        }
    }
    return lo;
}

/* The allocation containing address p, dying or not, or NULL. */
static sim_alloc *
sim_alloc_find_any(uintptr_t p)
{
    size_t i = sim_alloc_upper(p);
    sim_alloc *a;

    if (i == 0) {
        return NULL;
    }
    a = sim.allocs[i - 1];
    return p - a->base < a->size ? a : NULL;
}

/* The live allocation containing address p, or NULL. */
static sim_alloc *
sim_alloc_find(uintptr_t p)
{
    sim_alloc *a = sim_alloc_find_any(p);

    return a != NULL && a->dying == SIM_DYING_NO ? a : NULL;
}

/* Whether [p, p + n) overlaps any registered range, dying ones included. */
static int
sim_alloc_overlaps(uintptr_t p, size_t n)
{
    size_t i = sim_alloc_upper(p);

    if (sim_alloc_find_any(p) != NULL) {
        return 1;
    }
    return i < sim.nallocs && sim.allocs[i]->base - p < n;
}

/* 0, or -1 when out of memory. */
static int
sim_alloc_insert(sim_alloc *a)
{
    size_t i;

    if (sim.nallocs == sim.capallocs) {
        size_t cap = sim.capallocs ? sim.capallocs * 2 : 64;
        sim_alloc **v = realloc(sim.allocs, cap * sizeof(*v));
        if (v == NULL) {
            return -1;
        }
        sim.allocs = v;
        sim.capallocs = cap;
    }
    i = sim_alloc_upper(a->base);
    memmove(&sim.allocs[i + 1], &sim.allocs[i],
            (sim.nallocs - i) * sizeof(sim.allocs[0]));
    sim.allocs[i] = a;
    sim.nallocs++;
    a->id = ++sim.next_id;
    return 0;
}

static void
sim_alloc_remove(sim_alloc *a)
{
    size_t i = sim_alloc_upper(a->base);

    if (i > 0 && sim.allocs[i - 1] == a) {
        memmove(&sim.allocs[i - 1], &sim.allocs[i],
                (sim.nallocs - i) * sizeof(sim.allocs[0]));
        sim.nallocs--;
    }
}

/* Give back what a (already out of the registry) holds, and a itself. */
static void
sim_alloc_release(sim_alloc *a)
{
    sim_mempool *mp = a->pool;

    if (a->kind == SIM_MEM_DEVICE || a->kind == SIM_MEM_MANAGED
        || a->kind == SIM_MEM_ASYNC) {
        sim.dev[a->ctx->dev].used -= a->charged;
    }
    if (a->kind == SIM_MEM_ASYNC) {
        /* A live pool allocation that goes with its context. */
        mp->used -= a->charged;
        mp->reserved -= a->charged;
    }
    if (a->ipc != NULL) {
        sim_ipc_release(a);
    }
#ifdef SIM_ASAN
    if (a->kind == SIM_MEM_DEVICE) {
        ASAN_UNPOISON_MEMORY_REGION((void *)a->base,
                                    sim_device_span(a->size));
    }
#endif
    if (a->kind == SIM_MEM_ASYNC) {
        sim_pool_mem_release(mp, a);
    }
    else if (a->kind == SIM_MEM_POOL_IMPORT) {
        munmap((void *)a->base, a->span);
        mp->nimports--;
    }
    else if (a->kind == SIM_MEM_HOST || a->kind == SIM_MEM_MANAGED) {
        /* Like the driver's: unmapped, so a stale pointer faults. */
        munmap((void *)a->base, sim_device_span(a->size));
    }
    else if (a->kind != SIM_MEM_REGISTERED && a->kind != SIM_MEM_IPC) {
        free((void *)a->base);
    }
    free(a);
    if (mp != NULL) {
        sim_mempool_reap(mp);
    }
}

/* Whether [p, p + n) lies inside one live allocation; n > 0. */
static sim_alloc *
sim_range(uintptr_t p, size_t n)
{
    sim_alloc *a = sim_alloc_find(p);

    if (a == NULL || n > a->size - (p - a->base)) {
        return NULL;
    }
    return a;
}

/* ------------------------------------------------------------------ */
/* Contexts (lock held unless noted)                                   */
/* ------------------------------------------------------------------ */

static void
sim_tls_free(void *p)
{
    sim_tls *t = p;
    size_t i;

    if (atomic_load(&sim_state) == SIM_READY && t->nptds > 0) {
        sim_lock();
        for (i = 0; i < t->nptds; i++) {
            if (!t->ptds[i].ctx->destroyed) {
                sim_stream_destroy(t->ptds[i].stream);
            }
        }
        sim_unlock();
    }
    free(t->stack);
    free(t->ptds);
    free(t);
    tls = NULL;
}

static void
sim_tls_key_make(void)
{
    pthread_key_create(&tls_key, sim_tls_free);
}

/* This thread's state, made on first use; NULL when out of memory. */
static sim_tls *
sim_tls_get(void)
{
    if (tls == NULL) {
        pthread_once(&tls_once, sim_tls_key_make);
        tls = calloc(1, sizeof(*tls));
        if (tls != NULL) {
            pthread_setspecific(tls_key, tls);
        }
    }
    return tls;
}

/* The top of this thread's context stack, destroyed or not. */
static sim_ctx *
sim_top(void)
{
    return tls != NULL && tls->n > 0 ? tls->stack[tls->n - 1] : NULL;
}

/* The current context, or why there is no usable one. */
static CUresult
sim_current(sim_ctx **out)
{
    sim_ctx *c = sim_top();

    if (c == NULL) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    if (c->destroyed) {
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    }
    *out = c;
    return CUDA_SUCCESS;
}

/* Whether h is a live context, a destroyed one, or no context at all. */
static CUresult
sim_ctx_check(CUcontext h)
{
    const sim_ctx *c;
    int d;

    for (d = 0; d < sim.ndev; d++) {
        if ((uintptr_t)sim.dev[d].primary == (uintptr_t)h && h != NULL) {
            return CUDA_SUCCESS;
        }
    }
    for (c = sim.dead; c != NULL; c = c->next_dead) {
        if ((uintptr_t)c == (uintptr_t)h) {
            return CUDA_ERROR_CONTEXT_IS_DESTROYED;
        }
    }
    return CUDA_ERROR_INVALID_CONTEXT;
}

/* ------------------------------------------------------------------ */
/* Streams and operations (lock held unless noted)                     */
/* ------------------------------------------------------------------ */

/* Whether s takes part in the legacy default stream's implicit sync. */
static int
sim_blocking(const sim_stream *s)
{
    return s->kind == SIM_STREAM_BLOCKING || s->kind == SIM_STREAM_PER_THREAD;
}

static void
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

static void
sim_event_unref(sim_event *e)
{
    if (--e->refs > 0) {
        return;
    }
    if (e->rec_stream != NULL) {
        sim_stream_unref(e->rec_stream);
    }
    free(e);
}

static void *sim_worker(void *arg);

/* A new stream of c with its worker started; NULL when out of memory
 * or threads. */
static sim_stream *
sim_stream_new(sim_ctx *c, int kind)
{
    sim_stream *s = calloc(1, sizeof(*s));
    pthread_attr_t attr;
    pthread_t thread;
    sigset_t all, old;
    int err;

    if (s == NULL) {
        return NULL;
    }
    if (pthread_cond_init(&s->cv, NULL) != 0) {
        free(s);
        return NULL;
    }
    s->ctx = c;
    s->kind = kind;
    s->refs = 2;            /* the handle and the worker */
    if (pthread_attr_init(&attr) != 0) {
        pthread_cond_destroy(&s->cv);
        free(s);
        return NULL;
    }
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    /* Signals belong to the application's threads, not to workers; but
     * a fault in a worker (a host function's bug) must reach the
     * process's handlers (faulthandler, a sanitizer): were it blocked,
     * the kernel would kill the process without a word. */
    sigfillset(&all);
    sigdelset(&all, SIGSEGV);
    sigdelset(&all, SIGBUS);
    sigdelset(&all, SIGFPE);
    sigdelset(&all, SIGILL);
    sigdelset(&all, SIGABRT);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    err = pthread_create(&thread, &attr, sim_worker, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (err != 0) {
        pthread_cond_destroy(&s->cv);
        free(s);
        return NULL;
    }
    s->next = c->streams;
    if (c->streams != NULL) {
        c->streams->prev = s;
    }
    c->streams = s;
    return s;
}

/* Drop the handle: queued work still runs, then the worker exits. */
static void
sim_stream_destroy(sim_stream *s)
{
    if (s->destroyed) {
        return;
    }
    s->destroyed = 1;
    sim_set_del(&sim.streams, s);
    pthread_cond_signal(&s->cv);
    sim_stream_unref(s);
}

static sim_op *
sim_op_new(int kind)
{
    sim_op *op = calloc(1, sizeof(*op));

    if (op != NULL) {
        op->kind = kind;
    }
    return op;
}

/* Make op wait for ticket on s; 0, or -1 when out of memory. */
static int
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

static void
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
    free(op);
}

/* Queue op on s behind its implicit dependencies.  Always consumes op;
 * on success s->submitted is op's ticket. */
static CUresult
sim_enqueue(sim_stream *s, sim_op *op)
{
    sim_stream *t;

    if (s->kind == SIM_STREAM_LEGACY) {
        for (t = s->ctx->streams; t != NULL; t = t->next) {
            if (t != s && sim_blocking(t)
                && sim_op_dep(op, t, t->submitted) != 0) {
                sim_op_free(op);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
        }
    }
    else if (sim_blocking(s) && s->ctx->legacy != NULL) {
        t = s->ctx->legacy;
        if (sim_op_dep(op, t, t->submitted) != 0) {
            sim_op_free(op);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    op->ticket = ++s->submitted;
    op->gseq = ++sim.gseq;
    if (s->tail != NULL) {
        s->tail->next = op;
    }
    else {
        s->head = op;
    }
    s->tail = op;
    pthread_cond_signal(&s->cv);
    return CUDA_SUCCESS;
}

/* This thread's per-thread default stream for c, made on first use. */
static CUresult
sim_ptds_get(sim_ctx *c, sim_stream **out)
{
    sim_tls *t = sim_tls_get();
    size_t i, j;

    if (t == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    /* Forget the streams of destroyed contexts; they went with them. */
    for (i = j = 0; i < t->nptds; i++) {
        if (!t->ptds[i].ctx->destroyed) {
            t->ptds[j++] = t->ptds[i];
        }
    }
    t->nptds = j;
    for (i = 0; i < t->nptds; i++) {
        if (t->ptds[i].ctx == c) {
            *out = t->ptds[i].stream;
            return CUDA_SUCCESS;
        }
    }
    if (t->nptds == t->capptds) {
        size_t cap = t->capptds ? t->capptds * 2 : 4;
        sim_ptds *v = realloc(t->ptds, cap * sizeof(*v));
        if (v == NULL) {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        t->ptds = v;
        t->capptds = cap;
    }
    *out = sim_stream_new(c, SIM_STREAM_PER_THREAD);
    if (*out == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    t->ptds[t->nptds].ctx = c;
    t->ptds[t->nptds].stream = *out;
    t->nptds++;
    return CUDA_SUCCESS;
}

/* Where the driver would crash (it reads a handle's object without a
 * check): say why and abort, so a test sees the crash. */
__attribute__((noreturn, format(printf, 1, 2))) static void
sim_fatal(const char *fmt, ...)
{
    va_list ap;

    fputs("cudamem simulator: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}

/* The stream a handle names: 0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD
 * (these need a current context) or a live stream. */
static CUresult
sim_stream_get(CUstream h, sim_stream **out)
{
    sim_ctx *c;
    CUresult rc;

    if (h == NULL) {
        h = atomic_load(&sim_per_thread) ? CU_STREAM_PER_THREAD
                                          : CU_STREAM_LEGACY;
    }
    if (h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
        rc = sim_current(&c);
        if (rc != CUDA_SUCCESS) {
            return rc;
        }
        if (h == CU_STREAM_PER_THREAD) {
            return sim_ptds_get(c, out);
        }
        if (c->legacy == NULL) {
            c->legacy = sim_stream_new(c, SIM_STREAM_LEGACY);
            if (c->legacy == NULL) {
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
        }
        *out = c->legacy;
        return CUDA_SUCCESS;
    }
    if (!sim_set_has(&sim.streams, h)) {
        /* The driver reads the object a handle points at without a
         * check: an unknown or destroyed stream crashes it. */
        sim_fatal("stream handle %p is not a live stream: the driver "
                  "would crash here", (void *)h);
    }
    if (((sim_stream *)(void *)h)->ctx->destroyed) {
        /* A context being destroyed still lists its streams while it
         * drains them, but they take no more work. */
        return CUDA_ERROR_INVALID_HANDLE;
    }
    *out = (sim_stream *)(void *)h;
    return CUDA_SUCCESS;
}

int
cm_sim_stream_live(const void *h)
{
    int live;

    sim_lock();
    live = sim_set_has(&sim.streams, h)
           && !((const sim_stream *)h)->ctx->destroyed;
    sim_unlock();
    return live;
}

/* Whether h is a live event: NULL is not (the driver refuses it); any
 * other handle that is not one would crash the driver, which reads the
 * object it points at. */
static int
sim_event_known(CUevent h)
{
    if (h == NULL) {
        return 0;
    }
    if (!sim_set_has(&sim.events, h)) {
        sim_fatal("event handle %p is not a live event: the driver would "
                  "crash here", (void *)h);
    }
    return 1;
}

/* Wait until s has finished ticket (the lock is released meanwhile). */
static CUresult
sim_wait(sim_stream *s, uint64_t ticket)
{
    if (s->completed >= ticket) {
        return CUDA_SUCCESS;
    }
    if (tls_worker != NULL) {
        /* A host function waiting on the simulator could wait on itself. */
        return CUDA_ERROR_NOT_PERMITTED;
    }
    s->refs++;
    while (s->completed < ticket) {
        pthread_cond_wait(&sim.cond, &sim.lock);
    }
    sim_stream_unref(s);
    return CUDA_SUCCESS;
}

/* Whether c has a stream still busy with work numbered <= g. */
static int
sim_ctx_busy(const sim_ctx *c, uint64_t g)
{
    const sim_stream *s;

    for (s = c->streams; s != NULL; s = s->next) {
        if (s->head != NULL && s->head->gseq <= g) {
            return 1;
        }
    }
    return 0;
}

/* Wait for all work submitted so far on the streams of c, or of every
 * context (destroyed ones too, which may still be draining) if c is
 * NULL.  The lock is released meanwhile. */
static CUresult
sim_drain(const sim_ctx *c)
{
    uint64_t g = sim.gseq;
    const sim_ctx *o;
    int d, busy;

    for (;;) {
        busy = 0;
        if (c != NULL) {
            busy = sim_ctx_busy(c, g);
        }
        else {
            for (d = 0; d < sim.ndev && !busy; d++) {
                o = sim.dev[d].primary;
                busy = o != NULL && sim_ctx_busy(o, g);
            }
            for (o = sim.dead; o != NULL && !busy; o = o->next_dead) {
                busy = sim_ctx_busy(o, g);
            }
        }
        if (!busy) {
            return CUDA_SUCCESS;
        }
        if (tls_worker != NULL) {
            return CUDA_ERROR_NOT_PERMITTED;
        }
        pthread_cond_wait(&sim.cond, &sim.lock);
    }
}

/* Whether op may run: everything it waits for is done. */
static int
sim_op_ready(const sim_op *op)
{
    size_t i;

    for (i = 0; i < op->ndeps; i++) {
        if (op->deps[i].stream->completed < op->deps[i].ticket) {
            return 0;
        }
    }
    return 1;
}

/* Do what op does; runs without the lock. */
static void
sim_op_run(sim_op *op)
{
    size_t y, z;

    switch (op->kind) {
    case SIM_OP_COPY:
        for (z = 0; z < op->u.copy.depth; z++) {
            for (y = 0; y < op->u.copy.height; y++) {
                memmove(op->u.copy.dst + z * op->u.copy.dslice
                        + y * op->u.copy.dpitch,
                        op->u.copy.src + z * op->u.copy.sslice
                        + y * op->u.copy.spitch,
                        op->u.copy.width);
            }
        }
        break;
    case SIM_OP_SET:
        memset(op->u.set.dst, op->u.set.value, op->u.set.n);
        break;
    case SIM_OP_HOSTFN:
        op->u.hostfn.fn(op->u.hostfn.data);
        break;
    case SIM_OP_CALLBACK:
        op->u.callback.fn(op->u.callback.handle, CUDA_SUCCESS,
                          op->u.callback.data);
        break;
    case SIM_OP_RECORD:
        op->u.record.time_ns = sim_now_ns();
        break;
    default:
        break;
    }
}

/* A stream's worker: runs its queue in order until it is destroyed and
 * empty, then frees its share of the stream. */
static void *
sim_worker(void *arg)
{
    sim_stream *s = arg;
    sim_op *op;
    sim_event *e;

    tls_worker = s;
    sim_lock();
    for (;;) {
        op = s->head;
        if (op == NULL) {
            if (s->destroyed) {
                break;
            }
            pthread_cond_wait(&s->cv, &sim.lock);
            continue;
        }
        if (!sim_op_ready(op)) {
            pthread_cond_wait(&sim.cond, &sim.lock);
            continue;
        }
        sim_unlock();
        if (sim.delay_us > 0) {
            sim_sleep_us(sim.delay_us);
        }
        sim_op_run(op);
        sim_lock();
        s->head = op->next;
        if (s->head == NULL) {
            s->tail = NULL;
        }
        s->completed = op->ticket;
        if (op->kind == SIM_OP_RECORD) {
            e = op->u.record.event;
            if (op->u.record.seq > e->done_seq) {
                e->done_seq = op->u.record.seq;
                e->time_ns = op->u.record.time_ns;
            }
        }
        sim_op_free(op);
        pthread_cond_broadcast(&sim.cond);
    }
    tls_worker = NULL;
    sim_stream_unref(s);
    sim_unlock();
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Primary contexts                                                    */
/* ------------------------------------------------------------------ */

/* Destroy dev's primary context: drain it, then free everything it
 * owns.  The struct stays, marked destroyed. */
static CUresult
sim_ctx_destroy(int dev)
{
    sim_ctx *c = sim.dev[dev].primary, *o;
    sim_stream *s, *next;
    sim_event *e;
    sim_alloc *a;
    size_t i, j;
    int d;

    if (c == NULL) {
        return CUDA_SUCCESS;
    }
    if (tls_worker != NULL) {
        return CUDA_ERROR_NOT_PERMITTED;
    }
    c->destroyed = 1;
    sim.dev[dev].primary = NULL;
    c->next_dead = sim.dead;
    sim.dead = c;
    for (d = 0; d < sim.ndev; d++) {
        o = sim.dev[d].primary;
        if (o != NULL) {
            o->peers &= ~(1u << dev);
        }
    }
    /* Nothing new may use its memory or events from now on. */
    for (i = 0; i < sim.nallocs; i++) {
        a = sim.allocs[i];
        if (a->ctx == c && a->dying == SIM_DYING_NO) {
            a->dying = SIM_DYING_CTX;
        }
    }
    for (i = j = 0; i < sim.events.n; i++) {
        e = (sim_event *)sim.events.v[i];
        if (e->ctx == c) {
            e->destroyed = 1;
            sim_event_unref(e);
        }
        else {
            sim.events.v[j++] = sim.events.v[i];
        }
    }
    sim.events.n = j;
    /* Work elsewhere may still read its memory: wait for all of it. */
    sim_drain(NULL);
    for (s = c->streams; s != NULL; s = next) {
        next = s->next;
        sim_stream_destroy(s);
    }
    c->legacy = NULL;
    for (i = j = 0; i < sim.nallocs; i++) {
        a = sim.allocs[i];
        if (a->ctx == c && a->dying == SIM_DYING_CTX) {
            sim_alloc_release(a);
        }
        else {
            sim.allocs[j++] = a;
        }
    }
    sim.nallocs = j;
    sim_mempool_drop_ctx(dev, c);
    return CUDA_SUCCESS;
}

static CUresult
sim_DevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    sim_device *d;

    SIM_ENTER(DevicePrimaryCtxRetain);
    if (pctx == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!sim_dev_ok(dev)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    sim_lock();
    d = &sim.dev[dev];
    if (d->primary == NULL) {
        d->primary = calloc(1, sizeof(sim_ctx));
        if (d->primary == NULL) {
            sim_unlock();
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        d->primary->dev = dev;
    }
    d->retains++;
    *pctx = (CUcontext)(void *)d->primary;
    sim_unlock();
    return CUDA_SUCCESS;
}

static CUresult
sim_DevicePrimaryCtxRelease(CUdevice dev)
{
    sim_device *d;
    CUresult rc = CUDA_SUCCESS;

    SIM_ENTER(DevicePrimaryCtxRelease);
    if (!sim_dev_ok(dev)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    sim_lock();
    d = &sim.dev[dev];
    if (d->retains == 0) {
        rc = CUDA_ERROR_INVALID_CONTEXT;
    }
    else if (d->retains == 1 && d->primary != NULL && tls_worker != NULL) {
        rc = CUDA_ERROR_NOT_PERMITTED;
    }
    else if (--d->retains == 0) {
        rc = sim_ctx_destroy(dev);
    }
    sim_unlock();
    return rc;
}

static CUresult
sim_DevicePrimaryCtxReset(CUdevice dev)
{
    CUresult rc;

    SIM_ENTER(DevicePrimaryCtxReset);
    if (!sim_dev_ok(dev)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    sim_lock();
    rc = sim_ctx_destroy(dev);
    sim_unlock();
    return rc;
}

static CUresult
sim_DevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    SIM_ENTER(DevicePrimaryCtxGetState);
    if (!sim_dev_ok(dev)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    if (flags == NULL || active == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    *flags = sim.dev[dev].flags;
    *active = sim.dev[dev].primary != NULL;
    sim_unlock();
    return CUDA_SUCCESS;
}

static CUresult
sim_CtxGetCurrent(CUcontext *pctx)
{
    SIM_ENTER(CtxGetCurrent);
    if (pctx == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *pctx = (CUcontext)(void *)sim_top();
    return CUDA_SUCCESS;
}

/* Push c on this thread's stack, or replace the top if replace. */
static CUresult
sim_stack_put(CUcontext h, int replace)
{
    sim_tls *t;
    CUresult rc;

    sim_lock();
    rc = sim_ctx_check(h);
    sim_unlock();
    if (rc != CUDA_SUCCESS) {
        return rc;
    }
    t = sim_tls_get();
    if (t == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (replace && t->n > 0) {
        t->stack[t->n - 1] = (sim_ctx *)(void *)h;
        return CUDA_SUCCESS;
    }
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 8;
        sim_ctx **v = realloc(t->stack, cap * sizeof(*v));
        if (v == NULL) {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        t->stack = v;
        t->cap = cap;
    }
    t->stack[t->n++] = (sim_ctx *)(void *)h;
    return CUDA_SUCCESS;
}

static CUresult
sim_CtxSetCurrent(CUcontext ctx)
{
    SIM_ENTER(CtxSetCurrent);
    if (ctx == NULL) {
        if (tls != NULL && tls->n > 0) {
            tls->n--;
        }
        return CUDA_SUCCESS;
    }
    return sim_stack_put(ctx, 1);
}

static CUresult
sim_CtxPushCurrent(CUcontext ctx)
{
    SIM_ENTER(CtxPushCurrent);
    if (ctx == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    return sim_stack_put(ctx, 0);
}

static CUresult
sim_CtxPopCurrent(CUcontext *pctx)
{
    SIM_ENTER(CtxPopCurrent);
    if (tls == NULL || tls->n == 0) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    tls->n--;
    if (pctx != NULL) {
        *pctx = (CUcontext)(void *)tls->stack[tls->n];
    }
    return CUDA_SUCCESS;
}

static CUresult
sim_CtxGetDevice(CUdevice *device)
{
    sim_ctx *c;
    CUresult rc;

    SIM_ENTER(CtxGetDevice);
    if (device == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS) {
        *device = c->dev;
    }
    sim_unlock();
    return rc;
}

static CUresult
sim_CtxSynchronize(void)
{
    sim_ctx *c;
    CUresult rc;

    SIM_ENTER(CtxSynchronize);
    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS) {
        rc = sim_drain(c);
    }
    if (rc == CUDA_SUCCESS) {
        sim_mempools_settle();
    }
    sim_unlock();
    return rc;
}

static CUresult
sim_CtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags)
{
    sim_ctx *c, *peer;
    CUresult rc;

    SIM_ENTER(CtxEnablePeerAccess);
    if (Flags != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS) {
        rc = sim_ctx_check(peerContext);
    }
    if (rc == CUDA_SUCCESS) {
        peer = (sim_ctx *)(void *)peerContext;
        if (peer->dev == c->dev) {
            rc = CUDA_ERROR_INVALID_DEVICE;
        }
        else if (sim.no_peer[c->dev] & (1u << peer->dev)) {
            rc = CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
        }
        else if (c->peers & (1u << peer->dev)) {
            rc = CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
        }
        else {
            c->peers |= 1u << peer->dev;
        }
    }
    sim_unlock();
    return rc;
}

/* ------------------------------------------------------------------ */
/* Memory                                                              */
/* ------------------------------------------------------------------ */

/* Register a new allocation of size bytes at mem for the current
 * context; charged: bytes counted against the device. */
static CUresult
sim_alloc_add(sim_ctx *c, void *mem, size_t size, size_t charged, int kind,
              unsigned int flags)
{
    sim_alloc *a = calloc(1, sizeof(*a));

    if (a == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->base = (uintptr_t)mem;
    a->size = size;
    a->charged = charged;
    a->kind = kind;
    a->ctx = c;
    a->flags = flags;
    if (sim_alloc_insert(a) != 0) {
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    sim.dev[c->dev].used += charged;
    return CUDA_SUCCESS;
}

/* cuMemAlloc and cuMemAllocManaged. */
static CUresult
sim_device_alloc(CUdeviceptr *dptr, size_t size, int kind, unsigned int flags)
{
    sim_ctx *c;
    void *mem = NULL;
    size_t charged;
    CUresult rc;

    if (dptr == NULL || size == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS) {
        charged = (size + (SIM_GRANULE - 1)) & ~(size_t)(SIM_GRANULE - 1);
        if (charged < size
            || charged > sim.capacity - sim.dev[c->dev].used) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
        else if (kind == SIM_MEM_DEVICE
                 ? posix_memalign(&mem, sysconf(_SC_PAGESIZE),
                                  sim_device_span(size)) != 0
                 : (mem = sim_host_map(size)) == NULL) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
        else {
#ifdef SIM_ASAN
            /* Whole pages, so IPC can share them; the tail stays out of
             * bounds. */
            if (kind == SIM_MEM_DEVICE) {
                ASAN_POISON_MEMORY_REGION((char *)mem + size,
                                          sim_device_span(size) - size);
            }
#endif
            rc = sim_alloc_add(c, mem, size, charged, kind, flags);
            if (rc != CUDA_SUCCESS && kind == SIM_MEM_DEVICE) {
                free(mem);
            }
            else if (rc != CUDA_SUCCESS) {
                munmap(mem, sim_device_span(size));
            }
            else {
                *dptr = (CUdeviceptr)(uintptr_t)mem;
            }
        }
    }
    sim_unlock();
    return rc;
}

static CUresult
sim_MemAlloc(CUdeviceptr *dptr, size_t bytesize)
{
    SIM_ENTER(MemAlloc);
    return sim_device_alloc(dptr, bytesize, SIM_MEM_DEVICE, 0);
}

static CUresult
sim_MemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    SIM_ENTER(MemAllocManaged);
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    return sim_device_alloc(dptr, bytesize, SIM_MEM_MANAGED, flags);
}

/* Free the allocation starting at p if its kind is in kinds (a bit
 * mask); bad: what an unknown p returns.  Waits for all queued work
 * first, as the driver's frees synchronise. */
static CUresult
sim_free(uintptr_t p, unsigned int kinds, CUresult bad)
{
    sim_ctx *c;
    sim_alloc *a;
    CUresult rc;

    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS) {
        a = sim_alloc_find(p);
        if (a == NULL || a->base != p || !(kinds & (1u << a->kind))) {
            rc = bad;
        }
        else {
            a->dying = SIM_DYING_FREE;
            rc = sim_drain(NULL);
            if (rc != CUDA_SUCCESS) {
                a->dying = SIM_DYING_NO;
            }
            else {
                sim_alloc_remove(a);
                sim_alloc_release(a);
            }
        }
    }
    sim_unlock();
    return rc;
}

static CUresult
sim_MemFree(CUdeviceptr dptr)
{
    SIM_ENTER(MemFree);
    return sim_free((uintptr_t)dptr,
                    (1u << SIM_MEM_DEVICE) | (1u << SIM_MEM_MANAGED)
                    | (1u << SIM_MEM_POOL_IMPORT),
                    CUDA_ERROR_INVALID_VALUE);
}

static CUresult
sim_MemGetInfo(size_t *free_, size_t *total)
{
    sim_ctx *c;
    CUresult rc;

    SIM_ENTER(MemGetInfo);
    if (free_ == NULL || total == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS) {
        *free_ = sim.capacity - sim.dev[c->dev].used;
        *total = sim.capacity;
    }
    sim_unlock();
    return rc;
}

static CUresult
sim_MemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    sim_ctx *c;
    void *mem = NULL;
    CUresult rc;

    SIM_ENTER(MemHostAlloc);
    if (pp == NULL || bytesize == 0
        || (Flags & ~(unsigned int)(CU_MEMHOSTALLOC_PORTABLE
                                    | CU_MEMHOSTALLOC_DEVICEMAP
                                    | CU_MEMHOSTALLOC_WRITECOMBINED))) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS) {
        if ((mem = sim_host_map(bytesize)) == NULL) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
        else {
            rc = sim_alloc_add(c, mem, bytesize, 0, SIM_MEM_HOST, Flags);
            if (rc != CUDA_SUCCESS) {
                munmap(mem, sim_device_span(bytesize));
            }
            else {
                *pp = mem;
            }
        }
    }
    sim_unlock();
    return rc;
}

static CUresult
sim_MemFreeHost(void *p)
{
    SIM_ENTER(MemFreeHost);
    return sim_free((uintptr_t)p, 1u << SIM_MEM_HOST,
                    CUDA_ERROR_INVALID_VALUE);
}

/* The flags of a cuMemHostAlloc allocation (the driver answers
 * INVALID_VALUE for registered or unknown memory). */
static CUresult
sim_MemHostGetFlags(unsigned int *pFlags, void *p)
{
    sim_ctx *c;
    sim_alloc *a;
    CUresult rc;

    SIM_ENTER(MemHostGetFlags);
    if (pFlags == NULL || p == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS) {
        a = sim_alloc_find((uintptr_t)p);
        if (a == NULL || a->kind != SIM_MEM_HOST) {
            rc = CUDA_ERROR_INVALID_VALUE;
        }
        else {
            *pFlags = a->flags;
        }
    }
    sim_unlock();
    return rc;
}

static CUresult
sim_MemHostRegister(void *p, size_t bytesize, unsigned int Flags)
{
    sim_ctx *c;
    CUresult rc;

    SIM_ENTER(MemHostRegister);
    if (p == NULL || bytesize == 0
        || bytesize > UINTPTR_MAX - (uintptr_t)p
        || (Flags & ~(unsigned int)(CU_MEMHOSTREGISTER_PORTABLE
                                    | CU_MEMHOSTREGISTER_DEVICEMAP
                                    | CU_MEMHOSTREGISTER_IOMEMORY
                                    | CU_MEMHOSTREGISTER_READ_ONLY))) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (Flags & CU_MEMHOSTREGISTER_IOMEMORY) {
        /* There is no I/O memory to map here. */
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS) {
        if (sim_alloc_overlaps((uintptr_t)p, bytesize)) {
            rc = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
        }
        else {
            rc = sim_alloc_add(c, p, bytesize, 0, SIM_MEM_REGISTERED, Flags);
        }
    }
    sim_unlock();
    return rc;
}

static CUresult
sim_MemHostUnregister(void *p)
{
    SIM_ENTER(MemHostUnregister);
    return sim_free((uintptr_t)p, 1u << SIM_MEM_REGISTERED,
                    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
}

static CUresult
sim_MemHostGetDevicePointer(CUdeviceptr *pdptr, void *p, unsigned int Flags)
{
    sim_ctx *c;
    sim_alloc *a;
    CUresult rc;

    SIM_ENTER(MemHostGetDevicePointer);
    if (pdptr == NULL || p == NULL || Flags != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS) {
        a = sim_alloc_find((uintptr_t)p);
        if (a == NULL
            || (a->kind != SIM_MEM_HOST && a->kind != SIM_MEM_REGISTERED)) {
            rc = CUDA_ERROR_INVALID_VALUE;
        }
        else {
            /* Unified addressing: the same address on both sides. */
            *pdptr = (CUdeviceptr)(uintptr_t)p;
        }
    }
    sim_unlock();
    return rc;
}

static CUresult
sim_MemGetAddressRange(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    sim_ctx *c;
    sim_alloc *a;
    CUresult rc;

    SIM_ENTER(MemGetAddressRange);
    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS) {
        a = sim_alloc_find((uintptr_t)dptr);
        if (a == NULL
            || (a->kind != SIM_MEM_DEVICE && a->kind != SIM_MEM_MANAGED
                && a->kind != SIM_MEM_IPC && a->kind != SIM_MEM_ASYNC
                && a->kind != SIM_MEM_POOL_IMPORT)) {
            rc = CUDA_ERROR_NOT_FOUND;
        }
        else {
            if (pbase != NULL) {
                *pbase = (CUdeviceptr)a->base;
            }
            if (psize != NULL) {
                *psize = a->size;
            }
        }
    }
    sim_unlock();
    return rc;
}

/* The size of what the simulator writes for a pointer attribute, or 0
 * for one it does not model. */
static size_t
sim_pointer_attr_size(CUpointer_attribute attribute)
{
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        return sizeof(CUcontext);
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        return sizeof(CUdeviceptr);
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        return sizeof(void *);
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        return sizeof(unsigned long long);
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        return sizeof(int);
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        return sizeof(size_t);
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
        return sizeof(CUmemoryPool);
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_MAPPED:
        return sizeof(unsigned int);
    default:
        return 0;
    }
}

/* One attribute of ptr, which lies in a (live).  Lock held. */
static CUresult
sim_pointer_attr(const sim_alloc *a, void *data,
                 CUpointer_attribute attribute, CUdeviceptr ptr)
{
    int host = a->kind == SIM_MEM_HOST || a->kind == SIM_MEM_REGISTERED;
    int managed = a->kind == SIM_MEM_MANAGED;

    /* Booleans are written as unsigned int, the type the driver uses. */
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext *)data = (CUcontext)(void *)a->ctx;
        break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = host ? CU_MEMORYTYPE_HOST
                                     : CU_MEMORYTYPE_DEVICE;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *(CUdeviceptr *)data = ptr;
        break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (!host && !managed) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        *(void **)data = (void *)(uintptr_t)ptr;
        break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        *(unsigned long long *)data = a->id;
        break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *(unsigned int *)data = (unsigned int)managed;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = a->ctx->dev;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)data = (CUdeviceptr)a->base;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = a->size;
        break;
    case CU_POINTER_ATTRIBUTE_MAPPED:
        *(unsigned int *)data = 1;
        break;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
        *(CUmemoryPool *)data = (CUmemoryPool)(void *)a->pool;
        break;
    default:
        return (int)attribute >= CU_POINTER_ATTRIBUTE_CONTEXT
               && attribute <= CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE
               ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

static CUresult
sim_PointerGetAttribute(void *data, CUpointer_attribute attribute,
                        CUdeviceptr ptr)
{
    sim_alloc *a;
    CUresult rc;

    SIM_ENTER(PointerGetAttribute);
    if (data == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    a = sim_alloc_find((uintptr_t)ptr);
    rc = a == NULL ? CUDA_ERROR_INVALID_VALUE
                   : sim_pointer_attr(a, data, attribute, ptr);
    sim_unlock();
    return rc;
}

/* As the driver's: an address the simulator does not know is no error;
 * every attribute of it reads as zero (memory type 0: unregistered). */
static CUresult
sim_PointerGetAttributes(unsigned int numAttributes,
                         CUpointer_attribute *attributes, void **data,
                         CUdeviceptr ptr)
{
    sim_alloc *a;
    CUresult rc = CUDA_SUCCESS;
    size_t size;
    unsigned int i;

    SIM_ENTER(PointerGetAttributes);
    if (numAttributes == 0 || attributes == NULL || data == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (i = 0; i < numAttributes; i++) {
        if (data[i] == NULL
            || sim_pointer_attr_size(attributes[i]) == 0) {
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    sim_lock();
    a = sim_alloc_find((uintptr_t)ptr);
    for (i = 0; i < numAttributes && rc == CUDA_SUCCESS; i++) {
        size = sim_pointer_attr_size(attributes[i]);
        if (a == NULL) {
            memset(data[i], 0, size);
        }
        else if (attributes[i] == CU_POINTER_ATTRIBUTE_HOST_POINTER
                 && a->kind != SIM_MEM_HOST && a->kind != SIM_MEM_REGISTERED
                 && a->kind != SIM_MEM_MANAGED) {
            /* Device memory has no host address: NULL, not an error. */
            memset(data[i], 0, size);
        }
        else {
            rc = sim_pointer_attr(a, data[i], attributes[i], ptr);
        }
    }
    sim_unlock();
    return rc;
}

/* ------------------------------------------------------------------ */
/* Memory pools: memory given back while work may be queued         */
/* ------------------------------------------------------------------ */

/* Whether any stream of any context still has work numbered <= g. */
static int
sim_busy_upto(uint64_t g)
{
    const sim_ctx *o;
    int d;

    for (d = 0; d < sim.ndev; d++) {
        o = sim.dev[d].primary;
        if (o != NULL && sim_ctx_busy(o, g)) {
            return 1;
        }
    }
    for (o = sim.dead; o != NULL; o = o->next_dead) {
        if (sim_ctx_busy(o, g)) {
            return 1;
        }
    }
    return 0;
}

/* Free the host memory of given-back chunks that no queued work can
 * touch any more. */
static void
sim_graves_sweep(void)
{
    sim_grave **pp = &sim.graves;
    sim_grave *gr;

    while ((gr = *pp) != NULL) {
        if (!sim_busy_upto(gr->g)) {
            *pp = gr->next;
            if (gr->span != 0) {
                munmap(gr->mem, gr->span);
            }
            else {
                free(gr->mem);
            }
            free(gr);
        }
        else {
            pp = &gr->next;
        }
    }
}

/* ------------------------------------------------------------------ */
/* Shareable memory pools: the memory (lock held unless noted)         */
/* ------------------------------------------------------------------ */

/*
 * A pool made with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR keeps all its
 * memory in one memfd, named "cudamem-sim-pool-<nonce>-<id>", laid out
 * as: a header page (sim_pool_hdr); from SIM_POOL_META, one 64-bit word
 * per data page, the buffer id of the live allocation that starts on
 * that page (0: none); from SIM_POOL_DATA, the allocations, each at a
 * page-aligned offset never used before (the file is sparse, and a chunk
 * given back has its pages punched out).  The exporting process maps each
 * allocation from the memfd; cuMemPoolExportToShareableHandle hands out a
 * duplicate of the descriptor; an importer that has one (through
 * pidfd_getfd, say) checks the name and header, and maps an exported
 * allocation from it after checking, in the words, that the allocation
 * is still the live one the export named.  So a freed (or freed and
 * reused) allocation is refused with CUDA_ERROR_INVALID_VALUE, where the
 * driver calls that undefined, and memory an importer still maps stays
 * valid (if unused) after the exporter frees it or exits: never a fault.
 *
 * Answers where the driver leaves room: importing a pool into the process
 * that made it, or importing a pointer whose pool identity does not match
 * the imported pool, gives CUDA_ERROR_INVALID_VALUE; importing the same
 * pointer twice maps it twice; imported pointers are freed with
 * cuMemFree (cuMemFreeAsync refuses them).
 */

#define SIM_POOL_MAGIC 0x4c4f4f50u       /* "POOL" */
#define SIM_POOL_PTR_MAGIC 0x52545050u   /* "PPTR" */
#define SIM_POOL_META ((uint64_t)4096)
#define SIM_POOL_DATA ((uint64_t)1 << 32)

/* The header at offset 0 of a shareable pool's memfd. */
typedef struct {
    uint32_t magic;         /* SIM_POOL_MAGIC */
    int32_t dev;            /* the pool's device ordinal */
    uint64_t nonce;         /* the making process's sim_ipc_nonce */
    uint64_t id;            /* the pool's number there */
} sim_pool_hdr;

/* What a CUmemPoolPtrExportData holds (the rest of its bytes are 0). */
typedef struct {
    uint32_t magic;         /* SIM_POOL_PTR_MAGIC */
    int32_t dev;            /* the pool's device ordinal */
    uint64_t nonce;         /* the pool's identity: nonce */
    uint64_t id;            /* and number */
    uint64_t off;           /* the allocation's data offset */
    uint64_t size;          /* its size */
    uint64_t span;          /* bytes mapped: whole pages */
    uint64_t serial;        /* its buffer id, as the words record it */
} sim_pool_ptr;

_Static_assert(sizeof(sim_pool_ptr) <= sizeof(CUmemPoolPtrExportData),
               "the export must fit in a CUmemPoolPtrExportData");

/* The memfd name of a shareable pool. */
static void
sim_pool_name(char *buf, size_t n, uint64_t nonce, uint64_t id)
{
    snprintf(buf, n, "cudamem-sim-pool-%016llx-%llu",
             (unsigned long long)nonce, (unsigned long long)id);
}

/* The page size, as a 64-bit offset. */
static uint64_t
sim_page(void)
{
    return (uint64_t)sysconf(_SC_PAGESIZE);
}

/* Record in mp's words that the allocation at data offset off is now
 * buffer serial (0: none).  0, or -1 when the write failed. */
static int
sim_pool_mark(sim_mempool *mp, uint64_t off, uint64_t serial)
{
    off_t at = (off_t)(SIM_POOL_META + off / sim_page() * 8);

    return pwrite(mp->fd, &serial, sizeof(serial), at)
           == (ssize_t)sizeof(serial) ? 0 : -1;
}

/* New memory of charged bytes for pool mp: heap memory, or for a
 * shareable pool a fresh range of its memfd, mapped (*span its bytes,
 * *off its data offset).  NULL when out of memory. */
static void *
sim_pool_mem_new(sim_mempool *mp, size_t charged, size_t *span,
                 uint64_t *off)
{
    uint64_t pg = sim_page();
    /* The data pages that have words below the data. */
    uint64_t most = (SIM_POOL_DATA - SIM_POOL_META) / 8 * pg;
    uint64_t n;
    void *mem = NULL;

    *span = 0;
    *off = 0;
    if (mp->fd < 0) {
        return posix_memalign(&mem, SIM_DEVICE_ALIGN, charged) == 0 ? mem
                                                                    : NULL;
    }
    n = ((uint64_t)charged + pg - 1) / pg * pg;
    if (n < charged || n > most || mp->next_off > most - n
        || ftruncate(mp->fd, (off_t)(SIM_POOL_DATA + mp->next_off + n))
               != 0) {
        return NULL;
    }
    mem = mmap(NULL, (size_t)n, PROT_READ | PROT_WRITE, MAP_SHARED, mp->fd,
               (off_t)(SIM_POOL_DATA + mp->next_off));
    if (mem == MAP_FAILED) {
        return NULL;
    }
    *span = (size_t)n;
    *off = mp->next_off;
    mp->next_off += n;
    return mem;
}

/* Give the memory of a's shareable range back: not live any more, its
 * pages punched out of the memfd (importers that still map them read
 * zeros). */
static void
sim_pool_mem_unshare(sim_mempool *mp, sim_alloc *a)
{
    (void)sim_pool_mark(mp, a->off, 0);
    (void)fallocate(mp->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                    (off_t)(SIM_POOL_DATA + a->off), (off_t)a->span);
}

/* Give back the memory of pool allocation a now (nothing queued can use
 * it). */
static void
sim_pool_mem_release(sim_mempool *mp, sim_alloc *a)
{
    if (a->span == 0) {
        free((void *)a->base);
        return;
    }
    sim_pool_mem_unshare(mp, a);
    munmap((void *)a->base, a->span);
}

/* Free a made or imported pool once it is destroyed and nothing of it is
 * left; unlinks it. */
static void
sim_mempool_reap(sim_mempool *mp)
{
    sim_mempool **pp;

    if (!mp->destroyed || mp->used != 0 || mp->cached != NULL
        || mp->nimports != 0) {
        return;
    }
    for (pp = &sim.pools; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == mp) {
            *pp = mp->next;
            break;
        }
    }
    if (mp->fd >= 0) {
        close(mp->fd);
    }
    free(mp);
}

/* ------------------------------------------------------------------ */
/* Stream-ordered allocation: the memory pools                         */
/* ------------------------------------------------------------------ */

/* Give a cached chunk's memory back to the device.  Queued work that
 * still names it (a user bug, as on the driver) keeps the host memory
 * alive until it has run, so the simulator itself never faults. */
static void
sim_chunk_release(sim_mempool *mp, sim_chunk *ck)
{
    sim_alloc *a = ck->a;
    sim_grave *gr = malloc(sizeof(*gr));

    sim.dev[a->ctx->dev].used -= a->charged;
    mp->reserved -= a->charged;
    if (a->span != 0) {
        sim_pool_mem_unshare(mp, a);
    }
    if (gr == NULL || !sim_busy_upto(sim.gseq)) {
        /* Nothing is queued (or no memory to wait): free at once.  With
         * no grave the wait is skipped; only buggy work could notice. */
        free(gr);
        if (a->span != 0) {
            munmap((void *)a->base, a->span);
        }
        else {
            free((void *)a->base);
        }
    }
    else {
        gr->mem = (void *)a->base;
        gr->span = a->span;
        gr->g = sim.gseq;
        gr->next = sim.graves;
        sim.graves = gr;
    }
    if (ck->stream != NULL) {
        sim_stream_unref(ck->stream);
    }
    free(a);
    free(ck);
}

/* Whether a cached chunk's free has run on its stream. */
static int
sim_chunk_done(const sim_chunk *ck)
{
    return ck->stream == NULL || ck->stream->completed >= ck->ticket;
}

/* Release cached chunks whose free has run until at most keep bytes are
 * reserved (cuMemPoolTrimTo, and the release threshold at a
 * synchronisation). */
static void
sim_mempool_trim(sim_mempool *mp, uint64_t keep)
{
    sim_chunk **pp = &mp->cached;
    sim_chunk *ck;

    while (mp->reserved > keep && (ck = *pp) != NULL) {
        if (sim_chunk_done(ck)) {
            *pp = ck->next;
            sim_chunk_release(mp, ck);
        }
        else {
            pp = &ck->next;
        }
    }
    sim_graves_sweep();
}

/* After a synchronising call: every pool keeps at most its release
 * threshold, as the driver releases memory at synchronisation; a
 * destroyed pool keeps nothing, and goes once empty. */
static void
sim_mempools_settle(void)
{
    sim_mempool *mp;
    sim_mempool *next;
    int d;

    for (d = 0; d < sim.ndev; d++) {
        if (sim.dev[d].pool.reserved > sim.dev[d].pool.threshold) {
            sim_mempool_trim(&sim.dev[d].pool, sim.dev[d].pool.threshold);
        }
    }
    for (mp = sim.pools; mp != NULL; mp = next) {
        next = mp->next;
        if (mp->destroyed || mp->reserved > mp->threshold) {
            sim_mempool_trim(mp, mp->destroyed ? 0 : mp->threshold);
        }
        sim_mempool_reap(mp);
    }
}

/* Drop every cached chunk of pool mp made in context c. */
static void
sim_mempool_drop_chunks(sim_mempool *mp, const sim_ctx *c)
{
    sim_chunk **pp = &mp->cached;
    sim_chunk *ck;

    while ((ck = *pp) != NULL) {
        if (ck->a->ctx == c) {
            *pp = ck->next;
            sim_chunk_release(mp, ck);
        }
        else {
            pp = &ck->next;
        }
    }
}

/* Drop every cached chunk of dev's pools made in context c (being
 * destroyed, after draining). */
static void
sim_mempool_drop_ctx(int dev, const sim_ctx *c)
{
    sim_mempool *mp;
    sim_mempool *next;

    sim_mempool_drop_chunks(&sim.dev[dev].pool, c);
    for (mp = sim.pools; mp != NULL; mp = next) {
        next = mp->next;
        if (mp->dev == dev) {
            sim_mempool_drop_chunks(mp, c);
            sim_mempool_reap(mp);
        }
    }
    sim_graves_sweep();
}

/* The live pool a handle names; NULL for a NULL handle.  Any other
 * handle that is not a live pool would crash the driver, which reads the
 * object it points at. */
static sim_mempool *
sim_mempool_get(CUmemoryPool h)
{
    sim_mempool *mp;
    int d;

    if (h == NULL) {
        return NULL;
    }
    for (d = 0; d < sim.ndev; d++) {
        if ((void *)h == (void *)&sim.dev[d].pool) {
            return &sim.dev[d].pool;
        }
    }
    for (mp = sim.pools; mp != NULL; mp = mp->next) {
        if ((void *)h == (void *)mp && !mp->destroyed) {
            return mp;
        }
    }
    sim_fatal("memory pool handle %p is not a live pool: the driver would "
              "crash here", (void *)h);
}

static CUresult
sim_DeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
    SIM_ENTER(DeviceGetDefaultMemPool);
    if (pool_out == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!sim_dev_ok(dev)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    *pool_out = (CUmemoryPool)(void *)&sim.dev[dev].pool;
    return CUDA_SUCCESS;
}

static CUresult
sim_MemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                        void *value)
{
    sim_mempool *mp;
    CUresult rc = CUDA_SUCCESS;

    SIM_ENTER(MemPoolSetAttribute);
    if (value == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    mp = sim_mempool_get(pool);
    if (mp == NULL) {
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    else {
        switch (attr) {
        case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
            mp->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES]
                = *(int *)value != 0;
            break;
        case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
            mp->threshold = *(cuuint64_t *)value;
            break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
            /* Only a reset to the current value is allowed. */
            if (*(cuuint64_t *)value != 0) {
                rc = CUDA_ERROR_INVALID_VALUE;
            }
            else if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) {
                mp->reserved_high = mp->reserved;
            }
            else {
                mp->used_high = mp->used;
            }
            break;
        default:
            rc = CUDA_ERROR_INVALID_VALUE;
            break;
        }
    }
    sim_unlock();
    return rc;
}

static CUresult
sim_MemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                        void *value)
{
    sim_mempool *mp;
    CUresult rc = CUDA_SUCCESS;

    SIM_ENTER(MemPoolGetAttribute);
    if (value == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    mp = sim_mempool_get(pool);
    if (mp == NULL) {
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    else {
        switch (attr) {
        case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
            *(int *)value = mp->reuse[
                attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES];
            break;
        case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
            *(cuuint64_t *)value = mp->threshold;
            break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
            *(cuuint64_t *)value = mp->reserved;
            break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
            *(cuuint64_t *)value = mp->reserved_high;
            break;
        case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
            *(cuuint64_t *)value = mp->used;
            break;
        case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
            *(cuuint64_t *)value = mp->used_high;
            break;
        default:
            rc = CUDA_ERROR_INVALID_VALUE;
            break;
        }
    }
    sim_unlock();
    return rc;
}

static CUresult
sim_MemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    sim_mempool *mp;
    CUresult rc = CUDA_SUCCESS;

    SIM_ENTER(MemPoolTrimTo);
    sim_lock();
    mp = sim_mempool_get(pool);
    if (mp == NULL) {
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    else {
        sim_mempool_trim(mp, minBytesToKeep);
    }
    sim_unlock();
    return rc;
}

/* The best cached chunk of mp for charged bytes on stream s: its free
 * has run, or was queued on s itself (stream order makes that safe); at
 * least charged bytes and at most twice that.  Unlinked, or NULL. */
static sim_chunk *
sim_mempool_take(sim_mempool *mp, const sim_ctx *c, size_t charged,
                 const sim_stream *s)
{
    sim_chunk **pp;
    sim_chunk **best = NULL;
    sim_chunk *ck;

    for (pp = &mp->cached; (ck = *pp) != NULL; pp = &ck->next) {
        if (ck->a->ctx != c || ck->a->charged < charged
            || ck->a->charged / 2 > charged
            || (ck->stream != s && !sim_chunk_done(ck))) {
            continue;
        }
        if (best == NULL || ck->a->charged < (*best)->a->charged) {
            best = pp;
        }
    }
    if (best == NULL) {
        return NULL;
    }
    ck = *best;
    *best = ck->next;
    return ck;
}

/* cuMemAllocAsync (pool NULL: the stream's device's default pool) and
 * cuMemAllocFromPoolAsync. */
static CUresult
sim_pool_alloc(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
               CUstream hStream)
{
    sim_stream *s;
    sim_mempool *mp;
    sim_chunk *ck;
    sim_alloc *a = NULL;
    sim_op *op;
    void *mem = NULL;
    size_t charged;
    size_t span = 0;
    uint64_t off = 0;
    size_t *used;
    CUresult rc;

    if (dptr == NULL || bytesize == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    charged = (bytesize + (SIM_GRANULE - 1)) & ~(size_t)(SIM_GRANULE - 1);
    if (charged < bytesize) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    op = sim_op_new(SIM_OP_NOP);
    if (op == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    sim_lock();
    rc = sim_stream_get(hStream, &s);
    if (rc == CUDA_SUCCESS && pool != NULL) {
        mp = sim_mempool_get(pool);
        /* An imported pool cannot allocate; a pool's memory must be
         * usable from the stream's device. */
        if (mp == NULL || mp->imported
            || !(mp->access & ((uint64_t)1 << s->ctx->dev))) {
            rc = CUDA_ERROR_INVALID_VALUE;
        }
    }
    else if (rc == CUDA_SUCCESS) {
        mp = &sim.dev[s->ctx->dev].pool;
    }
    if (rc != CUDA_SUCCESS) {
        sim_op_free(op);
        sim_unlock();
        return rc;
    }
    used = &sim.dev[s->ctx->dev].used;
    sim_graves_sweep();
    ck = sim_mempool_take(mp, s->ctx, charged, s);
    if (ck != NULL) {
        a = ck->a;
        if (ck->stream != NULL) {
            sim_stream_unref(ck->stream);
        }
        free(ck);
        a->size = bytesize;
        a->dying = SIM_DYING_NO;
        if (sim_alloc_insert(a) != 0
            || (a->span != 0 && sim_pool_mark(mp, a->off, a->id) != 0)) {
            /* Give it back to the device rather than lose it. */
            sim_alloc_remove(a);
            *used -= a->charged;
            mp->reserved -= a->charged;
            sim_pool_mem_release(mp, a);
            free(a);
            a = NULL;
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    else {
        /* The pool grows; its own idle chunks make room first, as the
         * memory they hold is the pool's to reuse. */
        if (charged > sim.capacity - *used) {
            sim_mempool_trim(mp, mp->reserved > charged
                                 ? mp->reserved - charged : 0);
        }
        if (charged > sim.capacity - *used
            || (mem = sim_pool_mem_new(mp, charged, &span, &off)) == NULL) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
        else {
            rc = sim_alloc_add(s->ctx, mem, bytesize, charged,
                               SIM_MEM_ASYNC, 0);
            if (rc == CUDA_SUCCESS) {
                a = sim_alloc_find((uintptr_t)mem);
                a->pool = mp;
                a->off = off;
                a->span = span;
                mp->reserved += charged;
                if (mp->reserved > mp->reserved_high) {
                    mp->reserved_high = mp->reserved;
                }
                if (span != 0 && sim_pool_mark(mp, off, a->id) != 0) {
                    sim_alloc_remove(a);
                    mp->used += a->charged;
                    sim_alloc_release(a);
                    a = NULL;
                    rc = CUDA_ERROR_OUT_OF_MEMORY;
                }
            }
            else if (span != 0) {
                munmap(mem, span);
            }
            else {
                free(mem);
            }
        }
    }
    if (a == NULL) {
        sim_op_free(op);
        sim_unlock();
        return rc;
    }
    mp->used += a->charged;
    if (mp->used > mp->used_high) {
        mp->used_high = mp->used;
    }
    /* The allocation is a point in the stream's order. */
    rc = sim_enqueue(s, op);
    if (rc != CUDA_SUCCESS) {
        sim_alloc_remove(a);
        sim_alloc_release(a);
    }
    else {
        *dptr = (CUdeviceptr)a->base;
    }
    sim_unlock();
    return rc;
}

static CUresult
sim_MemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    SIM_ENTER(MemAllocAsync);
    return sim_pool_alloc(dptr, bytesize, NULL, hStream);
}

static CUresult
sim_MemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize,
                          CUmemoryPool pool, CUstream hStream)
{
    SIM_ENTER(MemAllocFromPoolAsync);
    if (pool == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    return sim_pool_alloc(dptr, bytesize, pool, hStream);
}

static CUresult
sim_MemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    sim_stream *s;
    sim_mempool *mp;
    sim_chunk *ck;
    sim_alloc *a;
    sim_op *op;
    CUresult rc;

    SIM_ENTER(MemFreeAsync);
    op = sim_op_new(SIM_OP_NOP);
    ck = calloc(1, sizeof(*ck));
    if (op == NULL || ck == NULL) {
        free(op);
        free(ck);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    sim_lock();
    rc = sim_stream_get(hStream, &s);
    a = sim_alloc_find((uintptr_t)dptr);
    if (rc == CUDA_SUCCESS
        && (a == NULL || a->base != (uintptr_t)dptr
            || a->kind != SIM_MEM_ASYNC)) {
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    if (rc != CUDA_SUCCESS) {
        sim_op_free(op);
        free(ck);
        sim_unlock();
        return rc;
    }
    /* The free is a point in the stream's order: the chunk is reusable
     * on s at once and elsewhere once that point has run. */
    rc = sim_enqueue(s, op);
    if (rc != CUDA_SUCCESS) {
        free(ck);
        sim_unlock();
        return rc;
    }
    mp = a->pool;
    sim_alloc_remove(a);
    mp->used -= a->charged;
    if (a->span != 0) {
        /* Freed: an importer may no longer open it. */
        (void)sim_pool_mark(mp, a->off, 0);
    }
    ck->a = a;
    ck->stream = s;
    s->refs++;
    ck->ticket = s->submitted;
    ck->next = mp->cached;
    mp->cached = ck;
    sim_unlock();
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* Shareable memory pools: the entry points                            */
/* ------------------------------------------------------------------ */

static CUresult
sim_MemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    const CUmemPoolProps *p = poolProps;
    char name[64];
    sim_pool_hdr hdr;
    sim_mempool *mp;
    size_t i;
    CUresult rc = CUDA_SUCCESS;

    SIM_ENTER(MemPoolCreate);
    if (pool == NULL || p == NULL
        || p->allocType != CU_MEM_ALLOCATION_TYPE_PINNED
        || p->win32SecurityAttributes != NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (i = 0; i < sizeof(p->reserved); i++) {
        if (p->reserved[i] != 0) {
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    if (p->location.type != CU_MEM_LOCATION_TYPE_DEVICE
        || (p->handleTypes
            & ~(unsigned int)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
        /* Host pools, and Windows or fabric handles. */
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (!sim_dev_ok(p->location.id)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    mp = calloc(1, sizeof(*mp));
    if (mp == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    mp->dev = p->location.id;
    mp->created = 1;
    mp->handle_types = (unsigned int)p->handleTypes;
    mp->fd = -1;
    mp->access = (uint64_t)1 << mp->dev;
    sim_lock();
    if (p->handleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
        mp->nonce = sim_nonce();
        mp->id = ++sim.next_pool_id;
        sim_pool_name(name, sizeof(name), mp->nonce, mp->id);
        memset(&hdr, 0, sizeof(hdr));
        hdr.magic = SIM_POOL_MAGIC;
        hdr.dev = mp->dev;
        hdr.nonce = mp->nonce;
        hdr.id = mp->id;
        mp->fd = memfd_create(name, MFD_CLOEXEC);
        if (mp->fd < 0
            || ftruncate(mp->fd, (off_t)SIM_POOL_DATA) != 0
            || pwrite(mp->fd, &hdr, sizeof(hdr), 0)
               != (ssize_t)sizeof(hdr)) {
            rc = errno == EMFILE || errno == ENFILE || errno == ENOMEM
                 ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_OPERATING_SYSTEM;
        }
    }
    if (rc != CUDA_SUCCESS) {
        if (mp->fd >= 0) {
            close(mp->fd);
        }
        free(mp);
    }
    else {
        mp->next = sim.pools;
        sim.pools = mp;
        *pool = (CUmemoryPool)(void *)mp;
    }
    sim_unlock();
    return rc;
}

static CUresult
sim_MemPoolDestroy(CUmemoryPool pool)
{
    sim_mempool *mp;
    CUresult rc = CUDA_SUCCESS;

    SIM_ENTER(MemPoolDestroy);
    sim_lock();
    mp = sim_mempool_get(pool);
    if (mp == NULL || !(mp->created || mp->imported)) {
        /* Unknown, destroyed, or a device's default pool. */
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    else {
        /* What is still allocated or imported keeps it until freed. */
        mp->destroyed = 1;
        sim_mempool_trim(mp, 0);
        sim_mempool_reap(mp);
    }
    sim_unlock();
    return rc;
}

static CUresult
sim_MemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map,
                     size_t count)
{
    sim_mempool *mp;
    uint64_t access;
    size_t i;
    int d;
    CUresult rc = CUDA_SUCCESS;

    SIM_ENTER(MemPoolSetAccess);
    if (map == NULL && count > 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    mp = sim_mempool_get(pool);
    if (mp == NULL) {
        rc = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    access = mp->access;
    for (i = 0; i < count; i++) {
        d = map[i].location.id;
        if (map[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE
            || (map[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE
                && map[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)) {
            rc = CUDA_ERROR_INVALID_VALUE;
            goto out;
        }
        if (!sim_dev_ok(d)) {
            rc = CUDA_ERROR_INVALID_DEVICE;
            goto out;
        }
        if (d == mp->dev) {
            /* The pool's own device keeps its access. */
            if (map[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
                rc = CUDA_ERROR_INVALID_VALUE;
                goto out;
            }
            continue;
        }
        if (sim.no_peer[d] & (1u << mp->dev)) {
            rc = CUDA_ERROR_INVALID_DEVICE;
            goto out;
        }
        if (map[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
            access |= (uint64_t)1 << d;
        }
        else {
            access &= ~((uint64_t)1 << d);
        }
    }
    mp->access = access;
out:
    sim_unlock();
    return rc;
}

static CUresult
sim_MemPoolExportToShareableHandle(void *handle_out, CUmemoryPool pool,
                                   CUmemAllocationHandleType handleType,
                                   unsigned long long flags)
{
    sim_mempool *mp;
    CUresult rc = CUDA_SUCCESS;
    int fd;

    SIM_ENTER(MemPoolExportToShareableHandle);
    if (handle_out == NULL || flags != 0
        || handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    mp = sim_mempool_get(pool);
    if (mp == NULL || mp->imported
        || !(mp->handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    else {
        /* A descriptor of the caller's own, as the driver gives. */
        fd = fcntl(mp->fd, F_DUPFD_CLOEXEC, 0);
        if (fd < 0) {
            rc = errno == EMFILE || errno == ENFILE
                 ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_OPERATING_SYSTEM;
        }
        else {
            *(int *)handle_out = fd;
        }
    }
    sim_unlock();
    return rc;
}

/* Whether fd is a shareable pool's memfd; its header in *hdr.  No lock
 * needed. */
static int
sim_pool_fd_check(int fd, sim_pool_hdr *hdr)
{
    char path[64];
    char link[128];
    char want[128];
    char name[64];
    ssize_t n;

    if (fd < 0 || pread(fd, hdr, sizeof(*hdr), 0) != (ssize_t)sizeof(*hdr)
        || hdr->magic != SIM_POOL_MAGIC) {
        return 0;
    }
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    n = readlink(path, link, sizeof(link) - 1);
    sim_pool_name(name, sizeof(name), hdr->nonce, hdr->id);
    snprintf(want, sizeof(want), "/memfd:%s (deleted)", name);
    return n >= 0 && (link[n] = '\0', strcmp(link, want) == 0);
}

static CUresult
sim_MemPoolImportFromShareableHandle(CUmemoryPool *pool_out, void *handle,
                                     CUmemAllocationHandleType handleType,
                                     unsigned long long flags)
{
    sim_pool_hdr hdr;
    sim_mempool *mp;
    int fd = (int)(intptr_t)handle;
    CUresult rc = CUDA_SUCCESS;

    SIM_ENTER(MemPoolImportFromShareableHandle);
    if (pool_out == NULL || flags != 0
        || handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        || !sim_pool_fd_check(fd, &hdr)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    mp = calloc(1, sizeof(*mp));
    if (mp == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    sim_lock();
    if (hdr.nonce == sim_ipc_nonce) {
        /* This process made it. */
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    else if (!sim_dev_ok(hdr.dev)) {
        rc = CUDA_ERROR_INVALID_DEVICE;
    }
    else {
        /* The caller keeps its descriptor; the pool has its own. */
        mp->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (mp->fd < 0) {
            rc = errno == EMFILE || errno == ENFILE
                 ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_OPERATING_SYSTEM;
        }
    }
    if (rc != CUDA_SUCCESS) {
        free(mp);
    }
    else {
        mp->dev = hdr.dev;
        mp->imported = 1;
        mp->handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        mp->nonce = hdr.nonce;
        mp->id = hdr.id;
        mp->access = (uint64_t)1 << mp->dev;
        mp->next = sim.pools;
        sim.pools = mp;
        *pool_out = (CUmemoryPool)(void *)mp;
    }
    sim_unlock();
    return rc;
}

static CUresult
sim_MemPoolExportPointer(CUmemPoolPtrExportData *shareData_out,
                         CUdeviceptr ptr)
{
    sim_pool_ptr k;
    sim_alloc *a;
    CUresult rc = CUDA_SUCCESS;

    SIM_ENTER(MemPoolExportPointer);
    if (shareData_out == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    a = sim_alloc_find((uintptr_t)ptr);
    if (a == NULL || a->base != (uintptr_t)ptr || a->kind != SIM_MEM_ASYNC
        || a->span == 0) {
        /* Not the start of an allocation of a shareable pool. */
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    else {
        memset(&k, 0, sizeof(k));
        k.magic = SIM_POOL_PTR_MAGIC;
        k.dev = a->pool->dev;
        k.nonce = a->pool->nonce;
        k.id = a->pool->id;
        k.off = a->off;
        k.size = a->size;
        k.span = a->span;
        k.serial = a->id;
        memset(shareData_out, 0, sizeof(*shareData_out));
        memcpy(shareData_out->reserved, &k, sizeof(k));
    }
    sim_unlock();
    return rc;
}

static CUresult
sim_MemPoolImportPointer(CUdeviceptr *ptr_out, CUmemoryPool pool,
                         CUmemPoolPtrExportData *shareData)
{
    sim_pool_ptr k;
    sim_mempool *mp;
    sim_alloc *a;
    sim_ctx *c;
    uint64_t serial = 0;
    uint64_t pg = sim_page();
    void *mem;
    CUresult rc;

    SIM_ENTER(MemPoolImportPointer);
    if (ptr_out == NULL || shareData == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    memcpy(&k, shareData->reserved, sizeof(k));
    if (k.magic != SIM_POOL_PTR_MAGIC || k.size == 0 || k.size > k.span
        || k.span > SIZE_MAX || k.span % pg != 0 || k.off % pg != 0
        || k.off > (SIM_POOL_DATA - SIM_POOL_META) / 8 * pg) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    rc = sim_current(&c);
    if (rc != CUDA_SUCCESS) {
        goto out;
    }
    mp = sim_mempool_get(pool);
    if (mp == NULL || !mp->imported || mp->nonce != k.nonce
        || mp->id != k.id || mp->dev != k.dev) {
        rc = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    /* Still the live allocation the export named? */
    if (pread(mp->fd, &serial, sizeof(serial),
              (off_t)(SIM_POOL_META + k.off / pg * 8))
            != (ssize_t)sizeof(serial)
        || serial != k.serial) {
        rc = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    mem = mmap(NULL, (size_t)k.span, PROT_READ | PROT_WRITE, MAP_SHARED,
               mp->fd, (off_t)(SIM_POOL_DATA + k.off));
    if (mem == MAP_FAILED) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    rc = sim_alloc_add(c, mem, (size_t)k.size, 0, SIM_MEM_POOL_IMPORT, 0);
    if (rc != CUDA_SUCCESS) {
        munmap(mem, (size_t)k.span);
        goto out;
    }
    a = sim_alloc_find((uintptr_t)mem);
    a->pool = mp;
    a->off = k.off;
    a->span = (size_t)k.span;
    mp->nimports++;
    *ptr_out = (CUdeviceptr)(uintptr_t)mem;
out:
    sim_unlock();
    return rc;
}

/* ------------------------------------------------------------------ */
/* Copies and memsets                                                  */
/* ------------------------------------------------------------------ */

/* One side of a copy as the caller described it. */
typedef struct {
    CUmemorytype type;      /* CU_MEMORYTYPE_* */
    uintptr_t addr;         /* host or device base address */
    size_t x;               /* byte offset in a row */
    size_t y;               /* first row */
    size_t z;               /* first slice */
    size_t pitch;           /* bytes per row */
    size_t height;          /* rows per slice */
} sim_side;

/* Check one side of a w x h x d copy and find its first byte.  Device
 * sides must lie inside one live allocation. */
static CUresult
sim_side_check(const sim_side *sd, size_t w, size_t h, size_t d,
               char **first)
{
    size_t need, off, span, rows;
    uintptr_t p;
    int device;

    switch (sd->type) {
    case CU_MEMORYTYPE_HOST:
        device = 0;
        break;
    case CU_MEMORYTYPE_DEVICE:
        device = 1;
        break;
    case CU_MEMORYTYPE_UNIFIED:
        device = -1;        /* device if the address is registered */
        break;
    case CU_MEMORYTYPE_ARRAY:
        return CUDA_ERROR_NOT_SUPPORTED;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (sd->addr == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (h > 1 || d > 1 || sd->y > 0 || sd->z > 0) {
        if (__builtin_add_overflow(w, sd->x, &need) || sd->pitch < need
            || sd->pitch > SIM_MAX_PITCH) {
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    if (d > 1 || sd->z > 0) {
        if (__builtin_add_overflow(h, sd->y, &need) || sd->height < need) {
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    /* off: first byte; span: bytes from there to the end of the last row */
    if (__builtin_mul_overflow(sd->z, sd->height, &rows)
        || __builtin_add_overflow(rows, sd->y, &rows)
        || __builtin_mul_overflow(rows, sd->pitch, &off)
        || __builtin_add_overflow(off, sd->x, &off)
        || __builtin_mul_overflow(d - 1, sd->height, &rows)
        || __builtin_add_overflow(rows, h - 1, &rows)
        || __builtin_mul_overflow(rows, sd->pitch, &span)
        || __builtin_add_overflow(span, w, &span)
        || __builtin_add_overflow(sd->addr, off, &p)
        || span > UINTPTR_MAX - p) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (device == 1 || (device == -1 && sim_alloc_find_any(p) != NULL)) {
        if (sim_range(p, span) == NULL) {
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    else if (device == 0 && sim_alloc_find(p) != NULL
             && sim_range(p, span) == NULL) {
        /* A host side that starts in page-locked memory must end there:
         * the driver refuses one that runs past the allocation or
         * registration (seen on an H200). */
        return CUDA_ERROR_INVALID_VALUE;
    }
    *first = (char *)p;
    return CUDA_SUCCESS;
}

/* Queue the op on stream h (the default stream when sync) and, when
 * sync, wait for it.  Lock held; always consumes op. */
static CUresult
sim_submit(sim_op *op, CUstream h, int sync)
{
    sim_stream *s;
    CUresult rc;

    rc = sim_stream_get(sync ? NULL : h, &s);
    if (rc != CUDA_SUCCESS) {
        sim_op_free(op);
        return rc;
    }
    rc = sim_enqueue(s, op);
    if (rc == CUDA_SUCCESS && sync) {
        rc = sim_wait(s, s->submitted);
    }
    return rc;
}

/* Whether a copy side is pageable host memory: host memory (or unified
 * addressing of an address the simulator does not know) that is not
 * page-locked (cuMemHostAlloc, cuMemHostRegister) nor managed.  Lock
 * held. */
static int
sim_side_pageable(const sim_side *sd, const char *first)
{
    if (sd->type != CU_MEMORYTYPE_HOST && sd->type != CU_MEMORYTYPE_UNIFIED) {
        return 0;
    }
    return sim_alloc_find_any((uintptr_t)first) == NULL;
}

/* Queue an asynchronous copy as the driver does with pageable host
 * memory: a pageable source is consumed before the call returns (here:
 * copied into a snapshot the op owns), and a copy into pageable memory
 * returns only once it has completed.  Page-locked and device sides stay
 * asynchronous.  Lock held; always consumes op. */
static CUresult
sim_submit_async_copy(sim_op *op, const sim_side *dst, const sim_side *src,
                      const char *dp, const char *sp, CUstream hs)
{
    sim_stream *s;
    CUresult rc;
    size_t span;
    int wait_after = sim_side_pageable(dst, dp);

    if (wait_after && tls_worker != NULL) {
        sim_op_free(op);
        return CUDA_ERROR_NOT_PERMITTED;
    }
    if (sim_side_pageable(src, sp)) {
        /* Validated not to overflow by sim_side_check. */
        span = (op->u.copy.depth - 1) * op->u.copy.sslice
               + (op->u.copy.height - 1) * op->u.copy.spitch
               + op->u.copy.width;
        op->u.copy.owned = malloc(span);
        if (op->u.copy.owned == NULL) {
            sim_op_free(op);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        memcpy(op->u.copy.owned, sp, span);
        op->u.copy.src = op->u.copy.owned;
    }
    rc = sim_stream_get(hs, &s);
    if (rc != CUDA_SUCCESS) {
        sim_op_free(op);
        return rc;
    }
    rc = sim_enqueue(s, op);
    if (rc == CUDA_SUCCESS && wait_after) {
        rc = sim_wait(s, s->submitted);
    }
    return rc;
}

/* Every copy: dst <- src, w bytes by h rows by d slices. */
static CUresult
sim_copy(const sim_side *dst, const sim_side *src, size_t w, size_t h,
         size_t d, CUstream hs, int sync)
{
    sim_ctx *c;
    sim_op *op;
    char *dp = NULL, *sp = NULL;
    CUresult rc;

    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS && sync && tls_worker != NULL) {
        rc = CUDA_ERROR_NOT_PERMITTED;
    }
    if (rc != CUDA_SUCCESS || w == 0 || h == 0 || d == 0) {
        sim_unlock();
        return rc;
    }
    rc = sim_side_check(dst, w, h, d, &dp);
    if (rc == CUDA_SUCCESS) {
        rc = sim_side_check(src, w, h, d, &sp);
    }
    if (rc == CUDA_SUCCESS) {
        op = sim_op_new(SIM_OP_COPY);
        if (op == NULL) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
        else {
            op->u.copy.dst = dp;
            op->u.copy.src = sp;
            op->u.copy.width = w;
            op->u.copy.height = h;
            op->u.copy.depth = d;
            op->u.copy.dpitch = dst->pitch;
            op->u.copy.spitch = src->pitch;
            /* Validated not to overflow when d > 1. */
            op->u.copy.dslice = d > 1 ? dst->pitch * dst->height : 0;
            op->u.copy.sslice = d > 1 ? src->pitch * src->height : 0;
            op->u.copy.owned = NULL;
            rc = sync ? sim_submit(op, hs, 1)
                      : sim_submit_async_copy(op, dst, src, dp, sp, hs);
        }
    }
    sim_unlock();
    return rc;
}

/* A contiguous copy of n bytes. */
static CUresult
sim_copy1d(CUmemorytype dt, uintptr_t dst, CUmemorytype st, uintptr_t src,
           size_t n, CUstream hs, int sync)
{
    sim_side d = {dt, dst, 0, 0, 0, 0, 0};
    sim_side s = {st, src, 0, 0, 0, 0, 0};

    return sim_copy(&d, &s, n, 1, 1, hs, sync);
}

static CUresult
sim_MemcpyHtoD(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    SIM_ENTER(MemcpyHtoD);
    return sim_copy1d(CU_MEMORYTYPE_DEVICE, (uintptr_t)dstDevice,
                      CU_MEMORYTYPE_HOST, (uintptr_t)srcHost, ByteCount,
                      NULL, 1);
}

static CUresult
sim_MemcpyDtoH(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    SIM_ENTER(MemcpyDtoH);
    return sim_copy1d(CU_MEMORYTYPE_HOST, (uintptr_t)dstHost,
                      CU_MEMORYTYPE_DEVICE, (uintptr_t)srcDevice, ByteCount,
                      NULL, 1);
}

static CUresult
sim_MemcpyDtoD(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
               size_t ByteCount)
{
    SIM_ENTER(MemcpyDtoD);
    return sim_copy1d(CU_MEMORYTYPE_DEVICE, (uintptr_t)dstDevice,
                      CU_MEMORYTYPE_DEVICE, (uintptr_t)srcDevice, ByteCount,
                      NULL, 1);
}

static CUresult
sim_MemcpyHtoDAsync(CUdeviceptr dstDevice, const void *srcHost,
                    size_t ByteCount, CUstream hStream)
{
    SIM_ENTER(MemcpyHtoDAsync);
    return sim_copy1d(CU_MEMORYTYPE_DEVICE, (uintptr_t)dstDevice,
                      CU_MEMORYTYPE_HOST, (uintptr_t)srcHost, ByteCount,
                      hStream, 0);
}

static CUresult
sim_MemcpyDtoHAsync(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                    CUstream hStream)
{
    SIM_ENTER(MemcpyDtoHAsync);
    return sim_copy1d(CU_MEMORYTYPE_HOST, (uintptr_t)dstHost,
                      CU_MEMORYTYPE_DEVICE, (uintptr_t)srcDevice, ByteCount,
                      hStream, 0);
}

static CUresult
sim_MemcpyDtoDAsync(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                    size_t ByteCount, CUstream hStream)
{
    SIM_ENTER(MemcpyDtoDAsync);
    return sim_copy1d(CU_MEMORYTYPE_DEVICE, (uintptr_t)dstDevice,
                      CU_MEMORYTYPE_DEVICE, (uintptr_t)srcDevice, ByteCount,
                      hStream, 0);
}

/* The address a 2D or 3D side names, by its memory type. */
static uintptr_t
sim_side_addr(CUmemorytype type, const void *host, CUdeviceptr device)
{
    return type == CU_MEMORYTYPE_HOST ? (uintptr_t)host : (uintptr_t)device;
}

static CUresult
sim_copy2d(const CUDA_MEMCPY2D *p, CUstream hs, int sync)
{
    sim_side d, s;

    if (p == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    d.type = p->dstMemoryType;
    d.addr = sim_side_addr(p->dstMemoryType, p->dstHost, p->dstDevice);
    d.x = p->dstXInBytes;
    d.y = p->dstY;
    d.z = 0;
    d.pitch = p->dstPitch;
    d.height = 0;
    s.type = p->srcMemoryType;
    s.addr = sim_side_addr(p->srcMemoryType, p->srcHost, p->srcDevice);
    s.x = p->srcXInBytes;
    s.y = p->srcY;
    s.z = 0;
    s.pitch = p->srcPitch;
    s.height = 0;
    return sim_copy(&d, &s, p->WidthInBytes, p->Height, 1, hs, sync);
}

static CUresult
sim_copy3d(const CUDA_MEMCPY3D *p, CUstream hs, int sync)
{
    sim_side d, s;

    if (p == NULL || p->srcLOD != 0 || p->dstLOD != 0
        || p->reserved0 != NULL || p->reserved1 != NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    d.type = p->dstMemoryType;
    d.addr = sim_side_addr(p->dstMemoryType, p->dstHost, p->dstDevice);
    d.x = p->dstXInBytes;
    d.y = p->dstY;
    d.z = p->dstZ;
    d.pitch = p->dstPitch;
    d.height = p->dstHeight;
    s.type = p->srcMemoryType;
    s.addr = sim_side_addr(p->srcMemoryType, p->srcHost, p->srcDevice);
    s.x = p->srcXInBytes;
    s.y = p->srcY;
    s.z = p->srcZ;
    s.pitch = p->srcPitch;
    s.height = p->srcHeight;
    return sim_copy(&d, &s, p->WidthInBytes, p->Height, p->Depth, hs, sync);
}

static CUresult
sim_Memcpy2D(const CUDA_MEMCPY2D *pCopy)
{
    SIM_ENTER(Memcpy2D);
    return sim_copy2d(pCopy, NULL, 1);
}

static CUresult
sim_Memcpy2DAsync(const CUDA_MEMCPY2D *pCopy, CUstream hStream)
{
    SIM_ENTER(Memcpy2DAsync);
    return sim_copy2d(pCopy, hStream, 0);
}

static CUresult
sim_Memcpy3D(const CUDA_MEMCPY3D *pCopy)
{
    SIM_ENTER(Memcpy3D);
    return sim_copy3d(pCopy, NULL, 1);
}

static CUresult
sim_Memcpy3DAsync(const CUDA_MEMCPY3D *pCopy, CUstream hStream)
{
    SIM_ENTER(Memcpy3DAsync);
    return sim_copy3d(pCopy, hStream, 0);
}

static CUresult
sim_MemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext,
               CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount)
{
    CUresult rc;

    SIM_ENTER(MemcpyPeer);
    sim_lock();
    rc = sim_ctx_check(dstContext);
    if (rc == CUDA_SUCCESS) {
        rc = sim_ctx_check(srcContext);
    }
    sim_unlock();
    if (rc != CUDA_SUCCESS) {
        return rc;
    }
    return sim_copy1d(CU_MEMORYTYPE_DEVICE, (uintptr_t)dstDevice,
                      CU_MEMORYTYPE_DEVICE, (uintptr_t)srcDevice, ByteCount,
                      NULL, 1);
}

static CUresult
sim_MemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext,
                    CUdeviceptr srcDevice, CUcontext srcContext,
                    size_t ByteCount, CUstream hStream)
{
    CUresult rc;

    SIM_ENTER(MemcpyPeerAsync);
    sim_lock();
    rc = sim_ctx_check(dstContext);
    if (rc == CUDA_SUCCESS) {
        rc = sim_ctx_check(srcContext);
    }
    sim_unlock();
    if (rc != CUDA_SUCCESS) {
        return rc;
    }
    return sim_copy1d(CU_MEMORYTYPE_DEVICE, (uintptr_t)dstDevice,
                      CU_MEMORYTYPE_DEVICE, (uintptr_t)srcDevice, ByteCount,
                      hStream, 0);
}

static CUresult
sim_memset(CUdeviceptr dst, unsigned char uc, size_t n, CUstream hs,
           int sync)
{
    sim_ctx *c;
    sim_op *op;
    CUresult rc;

    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS && sync && tls_worker != NULL) {
        rc = CUDA_ERROR_NOT_PERMITTED;
    }
    if (rc == CUDA_SUCCESS && n > 0) {
        if (sim_range((uintptr_t)dst, n) == NULL) {
            rc = CUDA_ERROR_INVALID_VALUE;
        }
        else if ((op = sim_op_new(SIM_OP_SET)) == NULL) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
        else {
            op->u.set.dst = (char *)(uintptr_t)dst;
            op->u.set.value = uc;
            op->u.set.n = n;
            rc = sim_submit(op, hs, sync);
        }
    }
    sim_unlock();
    return rc;
}

static CUresult
sim_MemsetD8(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    SIM_ENTER(MemsetD8);
    return sim_memset(dstDevice, uc, N, NULL, 1);
}

static CUresult
sim_MemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N,
                  CUstream hStream)
{
    SIM_ENTER(MemsetD8Async);
    return sim_memset(dstDevice, uc, N, hStream, 0);
}

/* Whether a memory location names something that exists. */
static int
sim_location_ok(CUmemLocation loc)
{
    switch (loc.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
        return sim_dev_ok(loc.id);
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
        return 1;
    default:
        return 0;
    }
}

/* Whether [p, p + n) lies inside one managed allocation. */
static int
sim_managed_range(CUdeviceptr p, size_t n)
{
    sim_alloc *a = sim_alloc_find((uintptr_t)p);

    return a != NULL && a->kind == SIM_MEM_MANAGED
           && n <= a->size - ((uintptr_t)p - a->base);
}

static CUresult
sim_MemPrefetchAsync(CUdeviceptr devPtr, size_t count,
                     CUmemLocation location, unsigned int flags,
                     CUstream hStream)
{
    sim_ctx *c;
    sim_op *op;
    CUresult rc;

    SIM_ENTER(MemPrefetchAsync);
    if (flags != 0 || !sim_location_ok(location)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS) {
        if (!sim_managed_range(devPtr, count)) {
            rc = CUDA_ERROR_INVALID_VALUE;
        }
        else if ((op = sim_op_new(SIM_OP_NOP)) == NULL) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
        else {
            /* Migration is free here; only the ordering is real. */
            rc = sim_submit(op, hStream, 0);
        }
    }
    sim_unlock();
    return rc;
}

static CUresult
sim_MemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
              CUmemLocation location)
{
    sim_ctx *c;
    CUresult rc;

    SIM_ENTER(MemAdvise);
    switch (advice) {
    case CU_MEM_ADVISE_SET_READ_MOSTLY:
    case CU_MEM_ADVISE_UNSET_READ_MOSTLY:
    case CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION:
        break;
    case CU_MEM_ADVISE_SET_PREFERRED_LOCATION:
    case CU_MEM_ADVISE_SET_ACCESSED_BY:
    case CU_MEM_ADVISE_UNSET_ACCESSED_BY:
        if (!sim_location_ok(location)) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        break;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS && !sim_managed_range(devPtr, count)) {
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    sim_unlock();
    return rc;
}

/* ------------------------------------------------------------------ */
/* Streams                                                             */
/* ------------------------------------------------------------------ */

static CUresult
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

static CUresult
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

static CUresult
sim_StreamSynchronize(CUstream hStream)
{
    sim_stream *s;
    CUresult rc;

    SIM_ENTER(StreamSynchronize);
    sim_lock();
    rc = sim_stream_get(hStream, &s);
    if (rc == CUDA_SUCCESS) {
        rc = sim_wait(s, s->submitted);
    }
    if (rc == CUDA_SUCCESS) {
        sim_mempools_settle();
    }
    sim_unlock();
    return rc;
}

static CUresult
sim_StreamQuery(CUstream hStream)
{
    sim_stream *s;
    CUresult rc;

    SIM_ENTER(StreamQuery);
    sim_lock();
    rc = sim_stream_get(hStream, &s);
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

static CUresult
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
        e = (sim_event *)(void *)hEvent;
        if (!sim_event_done(e)) {
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

static CUresult
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

static CUresult
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

/* cudamem's internal kernels on the simulator: a host function that
 * reads and writes device memory, queued only once every range it
 * touches lies inside one live allocation, as a copy's sides must.  The
 * check and the enqueue share one hold of the lock, and frees wait for
 * queued work, so the memory outlives the function. */
CUresult
cm_sim_launch_checked(CUstream h, CUhostFn fn, void *data, int nranges,
                      const uintptr_t *start, const size_t *len)
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
    sim_lock();
    for (i = 0; i < nranges && rc == CUDA_SUCCESS; i++) {
        if (len[i] > 0 && sim_range(start[i], len[i]) == NULL) {
            rc = CUDA_ERROR_INVALID_VALUE;
        }
    }
    if (rc == CUDA_SUCCESS) {
        rc = sim_stream_get(h, &s);
    }
    if (rc == CUDA_SUCCESS) {
        rc = sim_enqueue(s, op);
    }
    else {
        sim_op_free(op);
    }
    sim_unlock();
    return rc;
}

/* ------------------------------------------------------------------ */
/* Events                                                              */
/* ------------------------------------------------------------------ */

static CUresult
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

static CUresult
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
        if (s->ctx != e->ctx) {
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
            }
        }
    }
    sim_unlock();
    return rc;
}

static CUresult
sim_EventQuery(CUevent hEvent)
{
    CUresult rc = CUDA_SUCCESS;

    SIM_ENTER(EventQuery);
    sim_lock();
    if (!sim_event_known(hEvent)) {
        rc = CUDA_ERROR_INVALID_HANDLE;
    }
    else if (!sim_event_done((sim_event *)(void *)hEvent)) {
        rc = CUDA_ERROR_NOT_READY;
    }
    sim_unlock();
    return rc;
}

static CUresult
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
        if (e->rec_stream != NULL) {
            rc = sim_wait(e->rec_stream, e->rec_ticket);
        }
        if (rc == CUDA_SUCCESS) {
            sim_mempools_settle();
        }
    }
    sim_unlock();
    return rc;
}

static CUresult
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

static CUresult
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
        if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING
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

/* ------------------------------------------------------------------ */
/* Interprocess memory (lock held unless noted)                        */
/* ------------------------------------------------------------------ */

/*
 * A device allocation is private heap memory, page-aligned and a whole
 * number of pages, until cuIpcGetMemHandle first exports it.  Then, once,
 * its pages move into a memfd: with no operation running anywhere (the
 * export waits for all queued work, as a free does), the contents are
 * written to a new memfd, which is mapped MAP_SHARED | MAP_FIXED over the
 * same addresses, so the device pointer does not change.  The memfd stays
 * open until the allocation is freed; then the addresses get private
 * anonymous pages again and go back to the heap.  Allocations that are
 * never exported cost nothing more than the page rounding, and keep the
 * sanitizers' checks.
 *
 * The handle names (pid, memfd number, a random per-process nonce, the
 * allocation's buffer id, sizes, device).  Another process opens
 * /proc/<pid>/fd/<n>: that needs no privilege between processes of one
 * user (a read-mode ptrace check, which Yama leaves alone), unlike
 * pidfd_getfd (attach mode) or /proc/<pid>/map_files (CAP_SYS_ADMIN); and
 * unlike a named POSIX shm object it leaves nothing behind when a process
 * dies and is not bounded by the size of /dev/shm.  The opener checks that
 * what it opened is the memfd named "cudamem-sim-<nonce>-<id>", so a
 * freed allocation whose descriptor number was reused, or a process that
 * exited and whose pid was reused, is refused.
 *
 * Answers where the driver leaves room: the pointer exported must be the
 * allocation's base (cuMemAlloc memory only; managed and host memory give
 * CUDA_ERROR_INVALID_VALUE); opening in the exporting process gives
 * CUDA_ERROR_INVALID_CONTEXT, as the driver does; a handle whose
 * allocation was freed, or whose process exited, gives
 * CUDA_ERROR_INVALID_VALUE (the driver calls this undefined); opening a
 * handle the process already opened returns the same pointer and counts
 * the opens, as the driver documents, and cuIpcCloseMemHandle unmaps (after
 * waiting for queued work) when the count reaches zero.  An imported
 * mapping charges nothing against this process's device memory.
 */

#define SIM_IPC_MAGIC 0x4d495343u  /* "CSIM" */

/* What a CUipcMemHandle holds (the rest of its 64 bytes are zero). */
typedef struct {
    uint32_t magic;         /* SIM_IPC_MAGIC */
    uint32_t pid;           /* the exporting process */
    int32_t fd;             /* its memfd */
    int32_t dev;            /* the allocation's device ordinal */
    uint64_t nonce;         /* the exporting process's sim_ipc_nonce */
    uint64_t id;            /* the allocation's buffer id there */
    uint64_t size;          /* the allocation's size */
    uint64_t span;          /* bytes shared: whole pages */
} sim_ipc_key;

_Static_assert(sizeof(sim_ipc_key) <= CU_IPC_HANDLE_SIZE,
               "the key must fit in a CUipcMemHandle");

/* The IPC state of an allocation: exported (fd >= 0) or imported. */
struct sim_ipc {
    int fd;                 /* exported: the memfd; imported: -1 */
    sim_ipc_key key;        /* the handle's contents */
    int refs;               /* imported: opens not yet closed */
    uintptr_t base;         /* imported: where it is mapped */
    sim_ipc *next;          /* imported: link in sim_ipc_imports */
};

/* Every mapping this process imported and has not closed. */
static sim_ipc *sim_ipc_imports;

/* The host bytes behind a device allocation of size bytes: whole pages
 * (SIZE_MAX when that overflows, which no allocation satisfies). */
static size_t
sim_device_span(size_t size)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);

    if (size > SIZE_MAX - (page - 1)) {
        return SIZE_MAX;
    }
    return (size + page - 1) & ~(page - 1);
}

/* The memfd name of an exported allocation. */
static void
sim_ipc_name(char *buf, size_t n, uint64_t nonce, uint64_t id)
{
    snprintf(buf, n, "cudamem-sim-%016llx-%llu", (unsigned long long)nonce,
             (unsigned long long)id);
}

/* Wait until no operation is queued or running anywhere: all work
 * submitted before, and none submitted meanwhile.  The lock is released
 * while waiting. */
static CUresult
sim_ipc_quiesce(void)
{
    uint64_t g;
    CUresult rc;

    do {
        g = sim.gseq;
        rc = sim_drain(NULL);
        if (rc != CUDA_SUCCESS) {
            return rc;
        }
    } while (g != sim.gseq);
    return CUDA_SUCCESS;
}

/* Move the device allocation at base p into a memfd, in place. */
static CUresult
sim_ipc_share(uintptr_t p)
{
    char name[64];
    sim_alloc *a;
    sim_ipc *x;
    size_t span;
    size_t done = 0;
    ssize_t w;
    CUresult rc;
    int fd;

    rc = sim_ipc_quiesce();
    if (rc != CUDA_SUCCESS) {
        return rc;
    }
    /* It may have been freed, or shared, while the lock was released. */
    a = sim_alloc_find(p);
    if (a == NULL || a->base != p || a->kind != SIM_MEM_DEVICE) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (a->ipc != NULL) {
        return CUDA_SUCCESS;
    }
    (void)sim_nonce();
    x = calloc(1, sizeof(*x));
    if (x == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    span = sim_device_span(a->size);
    sim_ipc_name(name, sizeof(name), sim_ipc_nonce, a->id);
    fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)span) != 0) {
        goto fail;
    }
    while (done < a->size) {
        w = pwrite(fd, (const char *)a->base + done, a->size - done,
                   (off_t)done);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            goto fail;
        }
        done += (size_t)w;
    }
    if (mmap((void *)a->base, span, PROT_READ | PROT_WRITE,
             MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
        goto fail;
    }
#ifdef SIM_ASAN
    ASAN_POISON_MEMORY_REGION((char *)a->base + a->size, span - a->size);
#endif
    x->fd = fd;
    x->key.magic = SIM_IPC_MAGIC;
    x->key.pid = (uint32_t)getpid();
    x->key.fd = fd;
    x->key.dev = a->ctx->dev;
    x->key.nonce = sim_ipc_nonce;
    x->key.id = a->id;
    x->key.size = a->size;
    x->key.span = span;
    a->ipc = x;
    return CUDA_SUCCESS;
fail:
    rc = errno == EMFILE || errno == ENFILE || errno == ENOMEM
         ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_OPERATING_SYSTEM;
    if (fd >= 0) {
        close(fd);
    }
    free(x);
    return rc;
}

/* Undo what sim_ipc_share or an open did to a; from sim_alloc_release. */
static void
sim_ipc_release(sim_alloc *a)
{
    sim_ipc *x = a->ipc;
    sim_ipc **pp;

    if (x->fd >= 0) {
        /* Private pages again, so the heap may reuse the addresses.  If
         * that fails the shared pages stay: still memory, never a hole. */
        (void)mmap((void *)a->base, (size_t)x->key.span,
                   PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        close(x->fd);
    }
    else {
        munmap((void *)a->base, (size_t)x->key.span);
        for (pp = &sim_ipc_imports; *pp != NULL; pp = &(*pp)->next) {
            if (*pp == x) {
                *pp = x->next;
                break;
            }
        }
    }
    free(x);
    a->ipc = NULL;
}

/* Open and map the memfd a key names (no lock needed). */
static CUresult
sim_ipc_map(const sim_ipc_key *k, void **out)
{
    char path[64];
    char link[128];
    char want[128];
    char name[64];
    struct stat st;
    ssize_t n;
    void *m;
    int fd;

    snprintf(path, sizeof(path), "/proc/%u/fd/%d", (unsigned int)k->pid,
             (int)k->fd);
    fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        /* Gone: the allocation was freed or its process exited. */
        return errno == EACCES || errno == EPERM ? CUDA_ERROR_NOT_PERMITTED
                                                 : CUDA_ERROR_INVALID_VALUE;
    }
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    n = readlink(path, link, sizeof(link) - 1);
    sim_ipc_name(name, sizeof(name), k->nonce, k->id);
    snprintf(want, sizeof(want), "/memfd:%s (deleted)", name);
    if (n < 0 || (link[n] = '\0', strcmp(link, want) != 0)
        || fstat(fd, &st) != 0 || (uint64_t)st.st_size < k->span) {
        close(fd);
        return CUDA_ERROR_INVALID_VALUE;
    }
    m = mmap(NULL, (size_t)k->span, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
             0);
    close(fd);
    if (m == MAP_FAILED) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = m;
    return CUDA_SUCCESS;
}

static CUresult
sim_IpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    sim_ctx *c;
    sim_alloc *a;
    CUresult rc;

    SIM_ENTER(IpcGetMemHandle);
    if (pHandle == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS) {
        a = sim_alloc_find((uintptr_t)dptr);
        if (a == NULL || a->base != (uintptr_t)dptr
            || a->kind != SIM_MEM_DEVICE) {
            rc = CUDA_ERROR_INVALID_VALUE;
        }
        else if (a->ipc == NULL) {
            rc = sim_ipc_share(a->base);
        }
    }
    if (rc == CUDA_SUCCESS) {
        a = sim_alloc_find((uintptr_t)dptr);
        memset(pHandle, 0, sizeof(*pHandle));
        memcpy(pHandle->reserved, &a->ipc->key, sizeof(a->ipc->key));
    }
    sim_unlock();
    return rc;
}

static CUresult
sim_IpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle,
                     unsigned int Flags)
{
    sim_ipc_key k;
    sim_ipc *x;
    sim_alloc *a;
    sim_ctx *c;
    void *mem = NULL;
    CUresult rc;

    SIM_ENTER(IpcOpenMemHandle);
    memcpy(&k, handle.reserved, sizeof(k));
    if (pdptr == NULL
        || (Flags & ~(unsigned int)CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
        || k.magic != SIM_IPC_MAGIC || k.fd < 0 || k.size == 0
        || k.size > k.span || k.span > SIZE_MAX) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock();
    rc = sim_current(&c);
    if (rc != CUDA_SUCCESS) {
        goto out;
    }
    if (k.pid == (uint32_t)getpid() && k.nonce == sim_ipc_nonce) {
        rc = CUDA_ERROR_INVALID_CONTEXT;
        goto out;
    }
    for (x = sim_ipc_imports; x != NULL; x = x->next) {
        if (x->key.pid == k.pid && x->key.nonce == k.nonce
            && x->key.id == k.id) {
            x->refs++;
            *pdptr = (CUdeviceptr)x->base;
            goto out;
        }
    }
    x = calloc(1, sizeof(*x));
    if (x == NULL) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    rc = sim_ipc_map(&k, &mem);
    if (rc == CUDA_SUCCESS) {
        rc = sim_alloc_add(c, mem, (size_t)k.size, 0, SIM_MEM_IPC, Flags);
        if (rc != CUDA_SUCCESS) {
            munmap(mem, (size_t)k.span);
        }
    }
    if (rc != CUDA_SUCCESS) {
        free(x);
        goto out;
    }
    a = sim_alloc_find((uintptr_t)mem);
    x->fd = -1;
    x->key = k;
    x->refs = 1;
    x->base = (uintptr_t)mem;
    x->next = sim_ipc_imports;
    sim_ipc_imports = x;
    a->ipc = x;
    *pdptr = (CUdeviceptr)(uintptr_t)mem;
out:
    sim_unlock();
    return rc;
}

static CUresult
sim_IpcCloseMemHandle(CUdeviceptr dptr)
{
    sim_ctx *c;
    sim_alloc *a;
    CUresult rc;

    SIM_ENTER(IpcCloseMemHandle);
    sim_lock();
    rc = sim_current(&c);
    if (rc == CUDA_SUCCESS) {
        a = sim_alloc_find((uintptr_t)dptr);
        if (a == NULL || a->base != (uintptr_t)dptr
            || a->kind != SIM_MEM_IPC) {
            rc = CUDA_ERROR_INVALID_VALUE;
        }
        else if (--a->ipc->refs == 0) {
            /* Unmap once nothing queued can still touch it. */
            a->dying = SIM_DYING_FREE;
            rc = sim_drain(NULL);
            if (rc != CUDA_SUCCESS) {
                a->dying = SIM_DYING_NO;
                a->ipc->refs++;
            }
            else {
                sim_alloc_remove(a);
                sim_alloc_release(a);
            }
        }
    }
    sim_unlock();
    return rc;
}

/* ------------------------------------------------------------------ */
/* Profiler                                                            */
/* ------------------------------------------------------------------ */

/* Nothing to profile; like the driver's, they need a current context. */
static CUresult
sim_profiler(void)
{
    sim_ctx *c;
    CUresult rc;

    sim_lock();
    rc = sim_current(&c);
    sim_unlock();
    return rc;
}

static CUresult
sim_ProfilerStart(void)
{
    SIM_ENTER(ProfilerStart);
    return sim_profiler();
}

static CUresult
sim_ProfilerStop(void)
{
    SIM_ENTER(ProfilerStop);
    return sim_profiler();
}

/* ------------------------------------------------------------------ */
/* The table                                                           */
/* ------------------------------------------------------------------ */

void
cm_sim_fill(cm_cu_table *t, int per_thread)
{
    pthread_once(&fork_once, sim_register_atfork);
    atomic_store(&sim_per_thread, per_thread != 0);
    memset(t, 0, sizeof(*t));
#define SIM_FILL(name) t->name = sim_##name;
    SIM_FILL(GetErrorName)
    SIM_FILL(GetErrorString)
    SIM_FILL(Init)
    SIM_FILL(DriverGetVersion)
    SIM_FILL(DeviceGet)
    SIM_FILL(DeviceGetCount)
    SIM_FILL(DeviceGetName)
    SIM_FILL(DeviceGetAttribute)
    SIM_FILL(DeviceTotalMem)
    SIM_FILL(DeviceGetUuid)
    SIM_FILL(DeviceGetPCIBusId)
    SIM_FILL(DeviceCanAccessPeer)
    SIM_FILL(DevicePrimaryCtxRetain)
    SIM_FILL(DevicePrimaryCtxRelease)
    SIM_FILL(DevicePrimaryCtxReset)
    SIM_FILL(DevicePrimaryCtxGetState)
    SIM_FILL(CtxGetCurrent)
    SIM_FILL(CtxSetCurrent)
    SIM_FILL(CtxPushCurrent)
    SIM_FILL(CtxPopCurrent)
    SIM_FILL(CtxGetDevice)
    SIM_FILL(CtxSynchronize)
    SIM_FILL(CtxEnablePeerAccess)
    SIM_FILL(MemAlloc)
    SIM_FILL(MemFree)
    SIM_FILL(MemGetInfo)
    SIM_FILL(MemAllocManaged)
    SIM_FILL(MemAllocAsync)
    SIM_FILL(MemFreeAsync)
    SIM_FILL(DeviceGetDefaultMemPool)
    SIM_FILL(MemPoolSetAttribute)
    SIM_FILL(MemPoolGetAttribute)
    SIM_FILL(MemPoolTrimTo)
    SIM_FILL(MemPoolCreate)
    SIM_FILL(MemPoolDestroy)
    SIM_FILL(MemPoolSetAccess)
    SIM_FILL(MemAllocFromPoolAsync)
    SIM_FILL(MemPoolExportToShareableHandle)
    SIM_FILL(MemPoolImportFromShareableHandle)
    SIM_FILL(MemPoolExportPointer)
    SIM_FILL(MemPoolImportPointer)
    SIM_FILL(MemHostAlloc)
    SIM_FILL(MemFreeHost)
    SIM_FILL(MemHostRegister)
    SIM_FILL(MemHostUnregister)
    SIM_FILL(MemHostGetDevicePointer)
    SIM_FILL(MemHostGetFlags)
    SIM_FILL(MemGetAddressRange)
    SIM_FILL(PointerGetAttribute)
    SIM_FILL(PointerGetAttributes)
    SIM_FILL(MemcpyHtoD)
    SIM_FILL(MemcpyDtoH)
    SIM_FILL(MemcpyDtoD)
    SIM_FILL(MemcpyHtoDAsync)
    SIM_FILL(MemcpyDtoHAsync)
    SIM_FILL(MemcpyDtoDAsync)
    SIM_FILL(Memcpy2D)
    SIM_FILL(Memcpy2DAsync)
    SIM_FILL(Memcpy3D)
    SIM_FILL(Memcpy3DAsync)
    SIM_FILL(MemcpyPeer)
    SIM_FILL(MemcpyPeerAsync)
    SIM_FILL(MemsetD8)
    SIM_FILL(MemsetD8Async)
    SIM_FILL(MemPrefetchAsync)
    SIM_FILL(MemAdvise)
    SIM_FILL(StreamCreate)
    SIM_FILL(StreamDestroy)
    SIM_FILL(StreamSynchronize)
    SIM_FILL(StreamQuery)
    SIM_FILL(StreamWaitEvent)
    SIM_FILL(StreamAddCallback)
    SIM_FILL(LaunchHostFunc)
    SIM_FILL(EventCreate)
    SIM_FILL(EventRecord)
    SIM_FILL(EventSynchronize)
    SIM_FILL(EventQuery)
    SIM_FILL(EventDestroy)
    SIM_FILL(EventElapsedTime)
    SIM_FILL(IpcGetMemHandle)
    SIM_FILL(IpcOpenMemHandle)
    SIM_FILL(IpcCloseMemHandle)
    SIM_FILL(ProfilerStart)
    SIM_FILL(ProfilerStop)
#undef SIM_FILL
}
