/* SPDX-License-Identifier: MIT */
/*
 * sim/sim.h: the public header of csrc/sim/, the CPU simulator of the
 * CUDA driver, and what its files share: its types, its global state and
 * the helpers one file calls in another.  Not seen outside csrc/sim/: the
 * layers above reach the simulator only through the driver table
 * (driver/cu_table.h), which sim/table.c fills.  Plain C11 and pthreads,
 * no Python header.
 *
 * What the folder owns: the simulated devices and their primary
 * contexts, every allocation (the registry), streams with their worker
 * threads, events, captures and graphs, memory pools, interprocess and
 * virtual memory; sim.c's head comment describes the model.  Its files,
 * lowest first, each calling only files before it: sim.c (state, locks,
 * fault injection, devices, the registry, contexts), vmm.c (the VMM's
 * objects, and ranges as a device sees them), op.c (operations, stream
 * and event references), capture.c (what the queue asks of a capture),
 * queue.c (streams, workers, waits), graph.c (capture and graphs),
 * poolmem.c (the pools' memory), ipc.c, memory.c (the release of any
 * allocation, and the frees), vmmfuncs.c (the VMM's entry points),
 * mempool.c, copy.c, stream.c, primary.c, and on top table.c (the driver
 * table).  capture.h and vmm.h are private to their two files each.
 *
 * Locks and the GIL: one mutex, sim.lock (sim_lock, sim_unlock), guards
 * all shared state: entry points take it after SIM_ENTER and give it back
 * before returning, the helpers declared here run with it held unless
 * noted, and the waits (sim_wait, sim_drain) release it on sim.cond.  It
 * is never held while an operation or a host function runs.  sim.c's two
 * other mutexes (behind the driver lock a synchronous copy holds, and
 * behind cm_sim_block) are leaves, taken after sim.lock or alone.  The
 * simulator never takes, holds or gives up the GIL and never calls
 * Python; a caller that holds the GIL keeps it across a call, as across
 * the driver's.
 */
#ifndef CM_SIM_H
#define CM_SIM_H

#include "driver/cu_table.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

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

typedef struct sim_vmap sim_vmap;

typedef struct sim_capture sim_capture;

typedef struct sim_graph sim_graph;

/* One life of a device's primary context, from retain to reset or last
 * release.  The CUcontext handle is not its address but its device's
 * (sim_ctx_handle), the same across lives as on the driver: a thread
 * whose current context was reset sees the handle destroyed until
 * someone retains the context again, and then uses the new life. */
struct sim_ctx {
    int dev;                /* device ordinal */
    int destroyed;          /* set once by reset/release; never freed */
    unsigned int peers;     /* bit d: peer access to device d enabled */
    sim_stream *legacy;     /* the legacy default stream, made lazily */
    sim_stream *streams;    /* every stream of this context not yet freed */
    sim_ctx *next_dead;     /* link in sim.dead */
    int hostfns;            /* host functions (and callbacks) queued or
                             * running */
    int kwarm;              /* a capture with a kernel ended here: a
                             * kernel recorded into a capture no longer
                             * waits for host functions (stream.c) */
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
    sim_capture *cap;       /* the capture it takes part in, or NULL */
    uint64_t cap_tip;       /* in a capture: its count of recorded ops at
                             * this stream's newest op (or join) */
    int cap_joined;         /* in a capture: the origin has waited on an
                             * event recorded at or after cap_tip */
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
    uint64_t cap_id;        /* last recorded in this capture, or 0 */
    uint64_t cap_pos;       /* the capture's count of recorded ops then */
    sim_stream *cap_src;    /* the stream it was recorded on (a ref), or
                             * NULL */
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
            void *owned;        /* data when the op owns a copy of it
                                 * (freed with the op), or NULL */
            size_t size;        /* bytes of owned */
            int once;           /* fn owns data: never replayed */
            int kernel;         /* one of cudamem's kernels, which the
                                 * simulator runs as a host function */
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
    SIM_MEM_POOL_IMPORT,    /* cuMemPoolImportPointer (another process's) */
    SIM_MEM_VMM             /* one cuMemMap mapping (see vmm.c) */
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
    sim_vmap *vmap;         /* SIM_MEM_VMM: the mapping; else NULL */
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
    sim_ctx *last;          /* the latest life, live or destroyed */
    unsigned char handle;   /* its address is the primary's CUcontext */
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
    CUcontext *stack;       /* the context stack, top last */
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
struct sim_shared {
    pthread_mutex_t lock;   /* the simulator lock */
    pthread_cond_t cond;    /* broadcast when any operation completes */
    int ndev;               /* device count (set by cuInit) */
    size_t capacity;        /* bytes per device (set by cuInit) */
    uint16_t no_peer[SIM_MAX_DEVICES];  /* bit d of [e]: devices e and d
                                         * lack peer access (cuInit, from
                                         * CUDAMEM_SIM_NO_PEER) */
    long delay_us;          /* sleep before each operation (cuInit) */
    long capture_wait_s;    /* how long a kernel recorded into a capture
                             * waits for host functions before the
                             * simulator aborts (cuInit, from
                             * CUDAMEM_SIM_CAPTURE_WAIT_S; stream.c) */
    int no_fd;              /* the devices lack POSIX file-descriptor
                             * handles (cuInit, from
                             * CUDAMEM_SIM_NO_FD_HANDLES=1) */
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
    sim_capture *captures;  /* captures begun and not yet ended */
    uint64_t next_cap_id;   /* last capture id handed out */
    sim_set graphs;         /* live CUgraph and CUgraphExec handles */
};
extern struct sim_shared sim;

/* SIM_*; read without the lock by every entry point. */
extern atomic_int sim_state;

/* Whether stream handle 0 is the per-thread default stream. */
extern atomic_int sim_per_thread;

/* This thread's stack and per-thread streams, or NULL. */
extern _Thread_local sim_tls *tls;

/* The stream whose worker this thread is, or NULL. */
extern _Thread_local sim_stream *tls_worker;

/* Registers the fork handler. */
extern pthread_once_t fork_once;

/* Random, naming this process's exports (IPC and shareable pools); made
 * on first use (lock held), 0 until then. */
extern uint64_t sim_ipc_nonce;

/* The host bytes behind a device allocation of size bytes: whole pages
 * (SIZE_MAX when that overflows, which no allocation satisfies). */
size_t sim_device_span(size_t size);

/* Pages of their own for host or managed memory, as the driver maps
 * them (and unmaps them when they are freed or their context goes);
 * NULL when memory is short. */
void *sim_host_map(size_t size);

/* ------------------------------------------------------------------ */
/* Fault injection                                                     */
/* ------------------------------------------------------------------ */

/* How many entry points have a fault or a wait armed. */
extern atomic_long inj_armed;

/* Whether this call of entry point idx is the armed one; sets *rc.  A
 * call armed to wait (cm_sim_block) waits here first. */
int sim_inject_slow(int idx, CUresult *rc);

static inline int
sim_injected(int idx, CUresult *rc)
{
    if (atomic_load_explicit(&inj_armed, memory_order_relaxed) == 0) {
        return 0;
    }
    return sim_inject_slow(idx, rc);
}

/* The driver's lock as a synchronous copy holds it.  A synchronous
 * copy or memset (cuMemcpyHtoD, cuMemsetD8, ...) waits for the work
 * queued before it on the legacy default stream, and meanwhile holds a
 * lock that other threads' driver calls wait for (seen on a GPU: a
 * cuEventCreate waited for a cuMemcpyHtoD that waited behind a stream
 * callback).  Modelled so that a callback waiting for something held by
 * a thread inside the driver (the GIL) deadlocks here as it does on a
 * GPU, instead of passing unseen.  Calls made from a worker (a host
 * function or callback, where CUDA allows none) are let through. */
extern atomic_int sim_sync_holders;
extern _Thread_local int sim_holds_sync;

void sim_driver_lock_wait_slow(void);

/* Taken around a synchronous op's wait, given back after it. */
void sim_driver_lock_take(void);

void sim_driver_lock_give(void);

static inline void
sim_driver_lock_wait(void)
{
    if (atomic_load_explicit(&sim_sync_holders, memory_order_acquire) != 0
        && !sim_holds_sync && tls_worker == NULL) {
        sim_driver_lock_wait_slow();
    }
}

/* The start of every entry point: an armed fault, the lock a waiting
 * synchronous copy holds, then the init rule. */
#define SIM_ENTER(name)                                                 \
    do {                                                                \
        CUresult sim_rc_;                                               \
        if (sim_injected(CM_CU_IDX_##name, &sim_rc_)) {                 \
            return sim_rc_;                                             \
        }                                                               \
        sim_driver_lock_wait();                                         \
        if (atomic_load_explicit(&sim_state, memory_order_acquire)      \
            != SIM_READY) {                                             \
            return CUDA_ERROR_NOT_INITIALIZED;                          \
        }                                                               \
    } while (0)

/* ------------------------------------------------------------------ */
/* Small helpers                                                       */
/* ------------------------------------------------------------------ */

void sim_lock(void);

void sim_unlock(void);

int64_t sim_now_ns(void);

/* This process's sim_ipc_nonce, made on the first call (lock held). */
uint64_t sim_nonce(void);

void sim_sleep_us(long us);

int sim_set_has(const sim_set *set, const void *p);

/* 0, or -1 when out of memory. */
int sim_set_add(sim_set *set, const void *p);

void sim_set_del(sim_set *set, const void *p);

CUresult sim_GetErrorName(CUresult error, const char **pStr);

CUresult sim_GetErrorString(CUresult error, const char **pStr);

void sim_register_atfork(void);

CUresult sim_Init(unsigned int Flags);

CUresult sim_DriverGetVersion(int *driverVersion);

/* ------------------------------------------------------------------ */
/* Devices                                                             */
/* ------------------------------------------------------------------ */

int sim_dev_ok(CUdevice dev);

CUresult sim_DeviceGet(CUdevice *device, int ordinal);

CUresult sim_DeviceGetCount(int *count);

CUresult sim_DeviceGetName(char *name, int len, CUdevice dev);

CUresult
sim_DeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev);

CUresult sim_DeviceTotalMem(size_t *bytes, CUdevice dev);

CUresult sim_DeviceGetUuid(CUuuid *uuid, CUdevice dev);

CUresult sim_DeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev);

CUresult
sim_DeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev);

/* The allocation containing address p, dying or not, or NULL. */
sim_alloc *sim_alloc_find_any(uintptr_t p);

/* The live allocation containing address p, or NULL. */
sim_alloc *sim_alloc_find(uintptr_t p);

/* Whether [p, p + n) overlaps any registered range, dying ones included. */
int sim_alloc_overlaps(uintptr_t p, size_t n);

/* 0, or -1 when out of memory. */
int sim_alloc_insert(sim_alloc *a);

void sim_alloc_remove(sim_alloc *a);

/* Register a new allocation of size bytes at mem for the current
 * context; charged: bytes counted against the device. */
CUresult
sim_alloc_add(sim_ctx *c, void *mem, size_t size, size_t charged, int kind,
              unsigned int flags);

/* The top of this thread's context stack, destroyed or not. */
sim_ctx *sim_top(void);

/* The current context, or why there is no usable one. */
CUresult sim_current(sim_ctx **out);

/* Whether h is a live context, a destroyed one, or no context at all. */
CUresult sim_ctx_check(CUcontext h);

/* The CUcontext of c's device's primary context. */
CUcontext sim_ctx_handle(const sim_ctx *c);

/* The latest life of the context h names (live or destroyed), or NULL
 * when h names none. */
sim_ctx *sim_ctx_of(CUcontext h);

/* ------------------------------------------------------------------ */
/* Streams and operations (lock held unless noted)                     */
/* ------------------------------------------------------------------ */

/* Whether s takes part in the legacy default stream's implicit sync. */
int sim_blocking(const sim_stream *s);

void sim_stream_unref(sim_stream *s);

void sim_event_unref(sim_event *e);

/* A new stream of c with its worker started; NULL when out of memory
 * or threads. */
sim_stream *sim_stream_new(sim_ctx *c, int kind);

/* Drop the handle: queued work still runs, then the worker exits. */
void sim_stream_destroy(sim_stream *s);

sim_op *sim_op_new(int kind);

/* Make op wait for ticket on s; 0, or -1 when out of memory. */
int sim_op_dep(sim_op *op, sim_stream *s, uint64_t ticket);

void sim_op_free(sim_op *op);

/* Queue op on s behind its implicit dependencies.  Always consumes op;
 * on success s->submitted is op's ticket. */
CUresult sim_enqueue(sim_stream *s, sim_op *op);

/* Where the driver would crash (it reads a handle's object without a
 * check): say why and abort, so a test sees the crash. */
__attribute__((noreturn, format(printf, 1, 2))) void
sim_fatal(const char *fmt, ...);

/* This thread's state, made on first use; NULL when out of memory.  At
 * thread exit its per-thread default streams are destroyed (queue.c). */
sim_tls *sim_tls_get(void);

/* The stream a handle names: 0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD
 * (these need a current context) or a live stream. */
CUresult sim_stream_get(CUstream h, sim_stream **out);

/* Whether h is a live event: NULL is not (the driver refuses it); any
 * other handle that is not one would crash the driver, which reads the
 * object it points at. */
int sim_event_known(CUevent h);

/* Wait until s has finished ticket (the lock is released meanwhile). */
CUresult sim_wait(sim_stream *s, uint64_t ticket);

/* Whether c has a stream still busy with work numbered <= g. */
int sim_ctx_busy(const sim_ctx *c, uint64_t g);

/* Wait while a host function of c stops a kernel's record into a
 * capture (stream.c); 1 if the lock was given up meanwhile. */
int sim_capture_kernel_wait(sim_ctx *c);

/* Wait for all work submitted so far on the streams of c, or of every
 * context (destroyed ones too, which may still be draining) if c is
 * NULL.  The lock is released meanwhile. */
CUresult sim_drain(const sim_ctx *c);

/* ------------------------------------------------------------------ */
/* Capture and graphs (capture.c, graph.c; lock held unless noted)    */
/* ------------------------------------------------------------------ */

/* Record op, queued on capturing stream s, into its capture instead of
 * running it; the nranges ranges [start[i], start[i] + len[i]) must
 * still lie in live allocations at each launch of the graph.  Always
 * consumes op. */
CUresult sim_capture_record(sim_stream *s, sim_op *op, int nranges,
                            const uintptr_t *start, const size_t *len);

/* A use of the legacy stream s (enqueue, query, synchronize): while a
 * blocking stream of its context captures, the driver refuses it with
 * CUDA_ERROR_STREAM_CAPTURE_IMPLICIT and invalidates those captures
 * (invalidate 0: the capture-status queries, which leave them valid). */
CUresult sim_capture_legacy(const sim_stream *s, int invalidate);

/* A potentially unsafe call (synchronous copy or memset, allocation,
 * free, registration, a query of an ordinary event or of a stream that
 * does not capture) on this thread: refused with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, invalidating the captures that
 * forbid it, under the capture modes' rules. */
CUresult sim_capture_unsafe(void);

/* A synchronous copy or memset on this thread (sim lock held): it runs on
 * the legacy stream unless the per-thread default stream is chosen, so a
 * blocking stream of the current context that captures is joined
 * implicitly (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, the capture
 * invalidated, as the driver answers); else the unsafe-call rules of
 * sim_capture_unsafe. */
CUresult sim_capture_sync_call(void);

/* sim_capture_unsafe, taking the lock (not held). */
CUresult sim_capture_check_unsafe(void);

/* A synchronising call on c (cuCtxSynchronize): refused with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED while a stream of c captures,
 * which invalidates those captures. */
CUresult sim_capture_ctx_sync(const sim_ctx *c);

/* Mark s's capture invalidated (its later use and EndCapture fail). */
void sim_capture_invalidate(sim_stream *s);

/* s is being destroyed: it leaves its capture, which is invalidated; a
 * capture whose origin it was is discarded. */
void sim_capture_stream_gone(sim_stream *s);

/* Discard every capture of context c (being destroyed). */
void sim_capture_drop_ctx(const sim_ctx *c);

/* Whether event e is (last) recorded in a capture. */
int sim_event_captured(const sim_event *e);

/* cuStreamWaitEvent(s, e) where s captures or e was recorded in a
 * capture. */
CUresult sim_capture_wait(sim_stream *s, sim_event *e);

/* A synchronising call (query, synchronize, elapsed time) on captured
 * event e: refused with CUDA_ERROR_CAPTURED_EVENT, invalidating its
 * capture if it is still going. */
CUresult sim_capture_event_refuse(const sim_event *e);

/* cuEventRecord(e, s) on capturing stream s. */
CUresult sim_capture_event_record(sim_stream *s, sim_event *e);

CUresult sim_StreamBeginCapture(CUstream hStream, CUstreamCaptureMode mode);

CUresult sim_StreamEndCapture(CUstream hStream, CUgraph *phGraph);

CUresult
sim_StreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus);

CUresult
sim_StreamGetCaptureInfo(CUstream hStream,
                         CUstreamCaptureStatus *captureStatus_out,
                         cuuint64_t *id_out, CUgraph *graph_out,
                         const CUgraphNode **dependencies_out,
                         const CUgraphEdgeData **edgeData_out,
                         size_t *numDependencies_out);

CUresult sim_ThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode);

CUresult sim_GraphInstantiateWithFlags(CUgraphExec *phGraphExec,
                                       CUgraph hGraph,
                                       unsigned long long flags);

CUresult sim_GraphLaunch(CUgraphExec hGraphExec, CUstream hStream);

CUresult sim_GraphUpload(CUgraphExec hGraphExec, CUstream hStream);

CUresult sim_GraphDestroy(CUgraph hGraph);

CUresult sim_GraphExecDestroy(CUgraphExec hGraphExec);

/* ------------------------------------------------------------------ */
/* Primary contexts                                                    */
/* ------------------------------------------------------------------ */

/* Destroy dev's primary context: drain it, then free everything it
 * owns.  The struct stays, marked destroyed. */
CUresult sim_ctx_destroy(int dev);

CUresult sim_DevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);

CUresult sim_DevicePrimaryCtxRelease(CUdevice dev);

CUresult sim_DevicePrimaryCtxReset(CUdevice dev);

CUresult
sim_DevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active);

CUresult sim_CtxGetCurrent(CUcontext *pctx);

CUresult sim_CtxSetCurrent(CUcontext ctx);

CUresult sim_CtxPushCurrent(CUcontext ctx);

CUresult sim_CtxPopCurrent(CUcontext *pctx);

CUresult sim_CtxGetDevice(CUdevice *device);

CUresult sim_CtxSynchronize(void);

CUresult sim_CtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags);

/* ------------------------------------------------------------------ */
/* Memory                                                              */
/* ------------------------------------------------------------------ */

/* Give back what a (already out of the registry) holds, and a itself. */
void sim_alloc_release(sim_alloc *a);

CUresult sim_MemAlloc(CUdeviceptr *dptr, size_t bytesize);

CUresult
sim_MemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);

CUresult sim_MemFree(CUdeviceptr dptr);

CUresult sim_MemGetInfo(size_t *free_, size_t *total);

CUresult sim_MemHostAlloc(void **pp, size_t bytesize, unsigned int Flags);

CUresult sim_MemFreeHost(void *p);

/* The flags of a cuMemHostAlloc allocation (the driver answers
 * INVALID_VALUE for registered or unknown memory). */
CUresult sim_MemHostGetFlags(unsigned int *pFlags, void *p);

CUresult sim_MemHostRegister(void *p, size_t bytesize, unsigned int Flags);

CUresult sim_MemHostUnregister(void *p);

CUresult
sim_MemHostGetDevicePointer(CUdeviceptr *pdptr, void *p, unsigned int Flags);

CUresult
sim_MemGetAddressRange(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr);

CUresult sim_PointerGetAttribute(void *data, CUpointer_attribute attribute,
                                 CUdeviceptr ptr);

/* As the driver's: an address the simulator does not know is no error;
 * every attribute of it reads as zero (memory type 0: unregistered). */
CUresult sim_PointerGetAttributes(unsigned int numAttributes,
                                  CUpointer_attribute *attributes, void **data,
                                  CUdeviceptr ptr);

/* ------------------------------------------------------------------ */
/* Memory pools: memory given back while work may be queued         */
/* ------------------------------------------------------------------ */

/* Whether any stream of any context still has work numbered <= g. */
int sim_busy_upto(uint64_t g);

/* Free the host memory of given-back chunks that no queued work can
 * touch any more. */
void sim_graves_sweep(void);

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
#define SIM_POOL_META ((uint64_t)4096)
#define SIM_POOL_DATA ((uint64_t)1 << 32)

/* The page size, as a 64-bit offset. */
uint64_t sim_page(void);

/* Record in mp's words that the allocation at data offset off is now
 * buffer serial (0: none).  0, or -1 when the write failed. */
int sim_pool_mark(sim_mempool *mp, uint64_t off, uint64_t serial);

/* New memory of charged bytes for pool mp: heap memory, or for a
 * shareable pool a fresh range of its memfd, mapped (*span its bytes,
 * *off its data offset).  NULL when out of memory. */
void *sim_pool_mem_new(sim_mempool *mp, size_t charged, size_t *span,
                       uint64_t *off);

/* Unmap a pool's memory: span bytes of a memfd, or heap memory when
 * span is 0. */
void sim_pool_mem_unmap(void *mem, size_t span);

/* Give the memory of a's shareable range back: not live any more, its
 * pages punched out of the memfd (importers that still map them read
 * zeros). */
void sim_pool_mem_unshare(sim_mempool *mp, sim_alloc *a);

/* Give back the memory of pool allocation a now (nothing queued can use
 * it). */
void sim_pool_mem_release(sim_mempool *mp, sim_alloc *a);

/* Free a made or imported pool once it is destroyed and nothing of it is
 * left; unlinks it. */
void sim_mempool_reap(sim_mempool *mp);

/* After a synchronising call: every pool keeps at most its release
 * threshold, as the driver releases memory at synchronisation; a
 * destroyed pool keeps nothing, and goes once empty. */
void sim_mempools_settle(void);

/* Drop every cached chunk of dev's pools made in context c (being
 * destroyed, after draining). */
void sim_mempool_drop_ctx(int dev, const sim_ctx *c);

CUresult sim_DeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev);

CUresult sim_MemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                                 void *value);

CUresult sim_MemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                                 void *value);

CUresult sim_MemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep);

CUresult
sim_MemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);

CUresult sim_MemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize,
                                   CUmemoryPool pool, CUstream hStream);

CUresult sim_MemFreeAsync(CUdeviceptr dptr, CUstream hStream);

/* ------------------------------------------------------------------ */
/* Shareable memory pools: the entry points                            */
/* ------------------------------------------------------------------ */

CUresult
sim_MemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps);

CUresult sim_MemPoolDestroy(CUmemoryPool pool);

CUresult sim_MemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map,
                              size_t count);

CUresult
sim_MemPoolExportToShareableHandle(void *handle_out, CUmemoryPool pool,
                                   CUmemAllocationHandleType handleType,
                                   unsigned long long flags);

CUresult
sim_MemPoolImportFromShareableHandle(CUmemoryPool *pool_out, void *handle,
                                     CUmemAllocationHandleType handleType,
                                     unsigned long long flags);

CUresult sim_MemPoolExportPointer(CUmemPoolPtrExportData *shareData_out,
                                  CUdeviceptr ptr);

CUresult sim_MemPoolImportPointer(CUdeviceptr *ptr_out, CUmemoryPool pool,
                                  CUmemPoolPtrExportData *shareData);

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

CUresult
sim_MemcpyHtoD(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount);

CUresult
sim_MemcpyDtoH(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount);

CUresult sim_MemcpyDtoD(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                        size_t ByteCount);

CUresult sim_MemcpyHtoDAsync(CUdeviceptr dstDevice, const void *srcHost,
                             size_t ByteCount, CUstream hStream);

CUresult
sim_MemcpyDtoHAsync(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                    CUstream hStream);

CUresult sim_MemcpyDtoDAsync(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                             size_t ByteCount, CUstream hStream);

CUresult sim_Memcpy2D(const CUDA_MEMCPY2D *pCopy);

CUresult sim_Memcpy2DAsync(const CUDA_MEMCPY2D *pCopy, CUstream hStream);

CUresult sim_Memcpy3D(const CUDA_MEMCPY3D *pCopy);

CUresult sim_Memcpy3DAsync(const CUDA_MEMCPY3D *pCopy, CUstream hStream);

CUresult
sim_MemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext,
               CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount);

CUresult sim_MemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext,
                             CUdeviceptr srcDevice, CUcontext srcContext,
                             size_t ByteCount, CUstream hStream);

CUresult sim_MemsetD8(CUdeviceptr dstDevice, unsigned char uc, size_t N);

CUresult sim_MemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N,
                           CUstream hStream);

CUresult sim_MemPrefetchAsync(CUdeviceptr devPtr, size_t count,
                              CUmemLocation location, unsigned int flags,
                              CUstream hStream);

CUresult sim_MemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                       CUmemLocation location);

/* ------------------------------------------------------------------ */
/* Streams                                                             */
/* ------------------------------------------------------------------ */

CUresult sim_StreamCreate(CUstream *phStream, unsigned int Flags);

CUresult sim_StreamDestroy(CUstream hStream);

CUresult sim_StreamSynchronize(CUstream hStream);

CUresult sim_StreamQuery(CUstream hStream);

CUresult
sim_StreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags);

CUresult sim_StreamAddCallback(CUstream hStream, CUstreamCallback callback,
                               void *userData, unsigned int flags);

CUresult sim_LaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData);

/* ------------------------------------------------------------------ */
/* Events                                                              */
/* ------------------------------------------------------------------ */

CUresult sim_EventCreate(CUevent *phEvent, unsigned int Flags);

CUresult sim_EventRecord(CUevent hEvent, CUstream hStream);

CUresult sim_EventQuery(CUevent hEvent);

CUresult sim_EventSynchronize(CUevent hEvent);

CUresult sim_EventDestroy(CUevent hEvent);

CUresult
sim_EventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd);

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

/* The IPC state of an allocation: exported (fd >= 0) or imported. */
struct sim_ipc {
    int fd;                 /* exported: the memfd; imported: -1 */
    sim_ipc_key key;        /* the handle's contents */
    int refs;               /* imported: opens not yet closed */
    uintptr_t base;         /* imported: where it is mapped */
    sim_ipc *next;          /* imported: link in sim_ipc_imports */
};

/* Undo what sim_ipc_share or an open did to a; from sim_alloc_release. */
void sim_ipc_release(sim_alloc *a);

CUresult sim_IpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr);

CUresult sim_IpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle,
                              unsigned int Flags);

/* A free of an imported mapping, so in memory.c with the other frees. */
CUresult sim_IpcCloseMemHandle(CUdeviceptr dptr);

/* ------------------------------------------------------------------ */
/* VMM (vmm.c, vmmfuncs.c; lock held unless noted)                    */
/* ------------------------------------------------------------------ */

/* The allocation granularity, minimum and recommended: an H200's. */
#define SIM_VMM_GRANULE ((size_t)2 << 20)

/* Whether the mappings from a on cover [p, p + n) without a hole, all in
 * a's reservation and all accessible to device dev; p lies in a. */
int sim_vmm_range(const sim_alloc *a, uintptr_t p, size_t n, int dev);

/* Whether [p, p + n) lies inside one live allocation, as seen from the
 * current context's device; n > 0.  VMM mappings count as one
 * allocation where they are adjacent in one reservation, and only where
 * the device has access to each. */
sim_alloc *sim_range(uintptr_t p, size_t n);

/* sim_range as seen from device dev (-1: none, so no VMM memory). */
sim_alloc *sim_range_dev(uintptr_t p, size_t n, int dev);

/* sim_range_dev for a kernel of device dev: memory of a stream-ordered
 * pool also needs the pool's access for dev (cuMemPoolSetAccess; the
 * driver's peer access does not reach it, and a GPU faults). */
sim_alloc *sim_range_kernel(uintptr_t p, size_t n, int dev);

/* Whether [p, p + n) overlaps any address reservation. */
int sim_vmm_overlaps(uintptr_t p, size_t n);

/* One pointer attribute of ptr, which lies in mapping a (live). */
CUresult sim_vmm_pointer_attr(const sim_alloc *a, void *data,
                              CUpointer_attribute attribute, CUdeviceptr ptr);

/* One pointer attribute of ptr, which lies in no allocation: if it lies
 * in a reservation, the range and MAPPED (0) are answered, and *known is
 * set; other attributes give CUDA_ERROR_INVALID_VALUE.  Else *known is
 * 0. */
CUresult sim_vmm_hole_attr(uintptr_t ptr, void *data,
                           CUpointer_attribute attribute, int *known);

/* Give back what mapping a holds (out of the registry; nothing queued
 * uses it): the pages return to the reservation, inaccessible. */
void sim_vmm_map_release(sim_alloc *a);

CUresult sim_MemAddressReserve(CUdeviceptr *ptr, size_t size,
                               size_t alignment, CUdeviceptr addr,
                               unsigned long long flags);

CUresult sim_MemAddressFree(CUdeviceptr ptr, size_t size);

CUresult sim_MemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                       const CUmemAllocationProp *prop,
                       unsigned long long flags);

CUresult sim_MemRelease(CUmemGenericAllocationHandle handle);

CUresult sim_MemMap(CUdeviceptr ptr, size_t size, size_t offset,
                    CUmemGenericAllocationHandle handle,
                    unsigned long long flags);

CUresult sim_MemUnmap(CUdeviceptr ptr, size_t size);

CUresult sim_MemSetAccess(CUdeviceptr ptr, size_t size,
                          const CUmemAccessDesc *desc, size_t count);

CUresult sim_MemGetAccess(unsigned long long *flags,
                          const CUmemLocation *location, CUdeviceptr ptr);

CUresult
sim_MemGetAllocationGranularity(size_t *granularity,
                                const CUmemAllocationProp *prop,
                                CUmemAllocationGranularity_flags option);

CUresult
sim_MemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                         CUmemGenericAllocationHandle handle);

CUresult sim_MemRetainAllocationHandle(CUmemGenericAllocationHandle *handle,
                                       void *addr);

CUresult
sim_MemExportToShareableHandle(void *shareableHandle,
                               CUmemGenericAllocationHandle handle,
                               CUmemAllocationHandleType handleType,
                               unsigned long long flags);

CUresult
sim_MemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                 void *osHandle,
                                 CUmemAllocationHandleType shHandleType);

#endif /* CM_SIM_H */
