/* SPDX-License-Identifier: MIT */
/*
 * context/context.h: the context layer as the layers above see it, and
 * what all its files share: the Device and Context objects, which every
 * layer above the driver works in, the interface of the memory managers
 * a context points at (cm_mm_ops), the table through which the context
 * reaches the memory managers and the IPC imports above it (cm_ctx_up),
 * the Stream and Event objects, stream arguments, the driver-thread test
 * and the capture checks.
 *
 * The folder owns devices and their primary contexts, streams, events, host
 * callbacks, stream capture and graphs.  Its files, lowest first, each
 * calling only files before it: device.c (devices, the registry), context.c
 * (primary contexts, making one current), argparse.c (keyword binding, stream
 * arguments), graph.c (the record of captures, capture and graph launch),
 * callbacks.c (driver threads, deferred releases, the cache of idle streams,
 * host callbacks, the asyncio completion path), close.c (closing a device's
 * context), ctxtypes.c (the Device and Context types), ctxfuncs.c (their
 * module functions), stream.c and event.c (the Stream and Event types),
 * rawfuncs.c (test helpers: raw streams, events and a gate), streamfuncs.c
 * (their module functions).  devctx.h and stream.h are private to the folder:
 * what the files of devices and contexts, and of streams and events, share.
 * It reaches the memory managers and the IPC imports above it through
 * cm_ctx_up (below).
 *
 * Locks and the GIL: the registry of devices and contexts, a context's
 * fields and its kept streams are guarded by the GIL; the record of
 * captures is atomics, read from any thread with or without it.  The
 * only locks are two pthread mutexes of one object each, taken through
 * cm_mu_lock, never nested and never held across a driver or Python
 * call: an asyncio loop's notifier (callbacks.c) and a _synchronize_all
 * waiter (ctxfuncs.c).  The GIL is released around the driver calls
 * that may wait (synchronisations, retains and resets of primary
 * contexts, stream creation and destroys, enqueues of host calls, graph
 * instantiation and launch) and, while Python callbacks are in flight,
 * around every driver call (CM_CU, CM_CU_RAW); after such a release a
 * context may have been closed by another thread, which the code checks
 * again.  Host calls run on a driver thread, where no driver call is
 * made: add_callback's take the GIL themselves, the completion path's
 * never do.
 */
#ifndef CM_CONTEXT_LAYER_H
#define CM_CONTEXT_LAYER_H

#include "driver/driver.h"

/* ------------------------------------------------------------------ */
/* device.c, context.c: devices and primary contexts                  */
/* ------------------------------------------------------------------ */

/* A Device object (one per device ordinal, made once). */
typedef struct {
    PyObject_HEAD
    int id;               /* ordinal */
    CUdevice handle;      /* driver handle */
    PyObject *name;       /* str */
    int cc_major;         /* compute capability */
    int cc_minor;
    int pci[3];           /* PCI domain, bus and device ids, once has_pci */
    int has_pci;          /* pci was read (it never changes) */
    PyObject *weakreflist;
} cm_device;

typedef struct cm_pending cm_pending;
typedef struct cm_pool cm_pool;
typedef struct cm_mm_ops cm_mm_ops;

/* Which kind of memory manager a context has (cm_mm_ops.kind). */
enum {
    CM_MM_DEFAULT = 0,    /* cuMemAlloc, frees through the queue */
    CM_MM_PLUGIN,         /* a Python EMM plugin (memory_manager) */
    CM_MM_POOL,           /* cudamem's caching allocator (pool.c) */
    CM_MM_ASYNC           /* the driver's stream-ordered allocator */
};

/* What a queued release does. */
enum {
    CM_REL_DEVICE = 1,    /* cuMemFree (device or managed memory) */
    CM_REL_HOST,          /* cuMemFreeHost (pinned or mapped memory) */
    CM_REL_STREAM,        /* cuStreamDestroy */
    CM_REL_EVENT,         /* cuEventDestroy */
    CM_REL_MODULE,        /* cuModuleUnload */
    CM_REL_IPC,           /* cuIpcCloseMemHandle (an imported mapping) */
    CM_REL_POOL,          /* a block back to the context's pool */
    CM_REL_ASYNC,         /* cuMemFreeAsync on the allocation's stream */
    CM_REL_IPC_POOL,      /* an imported pool allocation (ipcpool.c's record)
                           * let go: cuMemFree once unused */
    CM_REL_POOL_SYNC,     /* a pool block whose streams could not be
                           * recorded (released on a driver callback
                           * thread): the flush waits for the context,
                           * then the block is free for any stream */
    CM_REL_ASYNC_SYNC,    /* the same for the async manager: the flush
                           * waits for the context, then cuMemFreeAsync
                           * on the default stream */
    CM_REL_IPC_VMM,       /* imported pool pages (ipcvmm.c's record) let
                           * go: unmapped, released once unused */
    CM_REL_POOL_AFTER,    /* a pool block used on a stream that captured
                           * at the order (its stream), its other streams
                           * recorded then: once that stream no longer
                           * captures, an event recorded on it joins them
                           * and the block goes back to the pool */
    CM_REL_ASYNC_AFTER    /* the same for the async manager: the side
                           * stream waited for the other streams at the
                           * order; at the flush it waits for that stream
                           * too, then cuMemFreeAsync on it */
};

/* An order's answer (cm_mm_ops.order) where one of the streams captures
 * and the others were ordered; no driver call that an order makes
 * answers it. */
#define CM_ORDER_AFTER_CAPTURE CUDA_ERROR_STREAM_CAPTURE_UNJOINED

/* The most idle streams a context keeps for reuse (stream.c). */
#define CM_STREAM_CACHE_MAX 16

/* An idle stream that a context keeps for a later stream() with the same
 * creation parameters. */
typedef struct {
    CUstream handle;      /* the stream, created in that context */
    unsigned int flags;   /* CU_STREAM_* it was created with */
    int priority;         /* its priority (0: the default) */
} cm_stream_slot;

/* A Context object: one device's primary context as cudamem uses it.
 * Objects that own driver resources hold a strong reference to it. */
typedef struct {
    PyObject_HEAD
    cm_device *device;    /* strong */
    CUcontext handle;     /* the primary context, retained once */
    int alive;            /* NOTE: cleared by close()/reset() of the
                           * device; a dead context frees nothing */
    Py_ssize_t pycalls;   /* NOTE: guarded by the GIL: add_callback
                           * records enqueued and not yet run */
    size_t total_mem;     /* device total memory, bytes */
    unsigned long gen;    /* unique per retained primary context, for
                           * caches of modules loaded in it */
    PyObject *memory_manager;  /* the memory manager object, made on first
                                * use for the built-in managers */
    const cm_mm_ops *mm;  /* the manager that allocates: the built-in
                           * one, or cm_mm_plugin while memory_manager is
                           * a plugin (set when the context is made or
                           * memory_manager is assigned) */
    const cm_mm_ops *mm_builtin;  /* the built-in manager chosen when it
                                   * was made: pool holds its state */
    int mm_info_busy;     /* NOTE: guarded by the GIL: a plugin's
                           * get_memory_info is running */
    int mm_init_pending;  /* NOTE: guarded by the GIL: the plugin was
                           * assigned to memory_manager and its
                           * initialize() has not run yet */
    cm_pool *pool;        /* pool and async managers' state, else NULL;
                           * NOTE: freed only with the Context object */
    cm_pending *memq;     /* strong: the memory manager's release queue */
    cm_pending *ctxq;     /* strong: streams, events, modules */
    /* The counters of memory_stats(): two sets, whose sums it reports.
     * st_*: the allocations made with the GIL held (guarded by it);
     * lane_*: those PyTorch's entry points make and release without it
     * (interop.c; guarded by its lane mutex).  Each side writes its own
     * with atomic stores and reads the other's with atomic loads. */
    size_t st_bytes;      /* device bytes allocated and not yet released */
    size_t st_peak;       /* the most the two sets' bytes have been, as
                           * seen by an allocation with the GIL */
    size_t st_count;      /* live device allocations */
    size_t st_total_count;  /* device allocations ever made */
    size_t lane_bytes;
    size_t lane_peak;     /* the same as seen by the lane */
    size_t lane_count;
    size_t lane_total_count;
    size_t st_pinned;     /* pinned host bytes allocated */
    /* What counts against the device's memory limit (memory/limit.c):
     * the device and managed bytes cudamem holds from the driver in
     * this context.  Atomic: the pool's segments and the async
     * manager's memory are given back without the GIL. */
    size_t lim_used;
    /* A Python plugin's allocations that lim_used counts (those whose
     * pointer object takes a weak reference), until their pointer
     * objects go; NOTE: guarded by the GIL */
    size_t plugin_bytes;
    size_t plugin_count;
    size_t plugin_total;  /* plugin allocations ever counted */
    /* The last garbage collection an out-of-memory retry made
     * (memory/limit.c): the allocations ever made (st_total_count +
     * lane_total_count + plugin_total) when it began, when it ended and
     * what it took (monotonic ns).  NOTE: guarded by the GIL */
    size_t oom_collected_at;
    long long oom_collect_end;
    long long oom_collect_ns;
    /* [d]: gen of device d's context that this one enabled peer access
     * to (0: none); stale once that context is reset */
    unsigned long peer_gen[CM_MAX_DEVICES];
    /* bit d: device d's context was given access to this one's memory
     * (cm_context_enable_peer); the memory manager opens to it what
     * cuCtxEnablePeerAccess does not (cm_mm_ops.peer).  NOTE: guarded
     * by the GIL */
    uint64_t peers_in;
    /* NOTE: guarded by the GIL: being closed or reset
     * (cm_context_release_device): from then on no work of another
     * device may take up its memory (cm_context_enable_peer refuses) */
    int closing;
    /* idle streams for stream() to hand out again, oldest first; NOTE:
     * guarded by the GIL; filled and emptied only by stream.c, emptied
     * (the streams destroyed) by close, reset and at exit */
    cm_stream_slot stream_cache[CM_STREAM_CACHE_MAX];
    int n_stream_cache;   /* used entries of stream_cache */
    /* Tickets of the context-wide synchronisations cudamem made
     * (cuCtxSynchronize): how many began, and the latest that finished
     * (context/context.h, cm_ctx_sync_*).  Atomic: read without the GIL
     * by the release queue's flush. */
    unsigned long sync_begun;
    unsigned long sync_done;
    /* The small copy kernel (context/kcopy.c): its CUfunction, loaded
     * when a capture began in this context, and the gen it was looked
     * for in (0: not yet; a NULL kcopy then: unavailable).  NOTE:
     * guarded by the GIL */
    void *kcopy;
    unsigned long kcopy_gen;
    /* The batch kernel (context/kbatch.c), loaded with kcopy; NULL:
     * unavailable.  NOTE: guarded by the GIL */
    void *kbatch;
    PyObject *weakreflist;
} cm_context;

/* The context current on this thread, making device 0's primary context
 * current if none is.  Borrowed reference, or NULL with an exception.
 * Alive and registered when returned, which holds until the caller next
 * lets go of the GIL (a reset on another thread may follow). */
cm_context *cm_context_current(void);
/* Make ctx current on this thread if it is not (cheap when it is). */
int cm_context_activate(cm_context *ctx);
/* Make ctx current for one operation; *prev gets what cm_context_leave
 * needs to give the thread its own context back.  0, or -1 with an
 * exception (then nothing to leave).  On 0, and for cm_context_activate,
 * ctx was alive after their last driver call: the caller's next driver
 * call, made before it lets go of the GIL, counts before any close of
 * ctx destroys its objects. */
int cm_context_enter(cm_context *ctx, CUcontext *prev);
/* Undo cm_context_enter.  Never raises. */
void cm_context_leave(cm_context *ctx, CUcontext prev);
/* Make h current on this thread if it is not; *pushed says whether to
 * pop it after, with cm_ctx_leave.  No GIL needed (context.c). */
CUresult cm_ctx_enter(CUcontext h, int *pushed);
void cm_ctx_leave(int pushed);
/* r = call, evaluated between enter(obj, &prev) and leave(obj, prev), an
 * enter/leave pair of the cm_context_enter kind (cm_da_enter and
 * cm_da_leave take an array).  When enter fails, call does not run and
 * r = fail, with the exception set.  obj is evaluated more than once.
 * The one spelling of "run this with that context current": the wrapper
 * of a method body (its *_run function) is this line and a return. */
#define CM_ENTERED(enter, leave, obj, r, fail, call)                        \
    do {                                                                    \
        CUcontext cm_entered_prev_;                                         \
        if (enter((obj), &cm_entered_prev_) < 0) {                          \
            (r) = (fail);                                                   \
        }                                                                   \
        else {                                                              \
            (r) = (call);                                                   \
            leave((obj), cm_entered_prev_);                                 \
        }                                                                   \
    } while (0)
/* CM_ENTERED with cm_context_enter/cm_context_leave for ctx; a NULL ctx
 * runs call as it is, in whatever context the thread has. */
#define CM_IN_CONTEXT(ctx, r, fail, call)                                   \
    do {                                                                    \
        cm_context *cm_in_ctx_ = (ctx);                                     \
        if (cm_in_ctx_ == NULL) {                                           \
            (r) = (call);                                                   \
        }                                                                   \
        else {                                                              \
            CM_ENTERED(cm_context_enter, cm_context_leave, cm_in_ctx_, r,   \
                       fail, call);                                         \
        }                                                                   \
    } while (0)
/* The registered Context of a CUcontext handle, or NULL (no exception). */
cm_context *cm_context_of_handle(CUcontext h);
/* The registered Context that owns device memory at p, as the driver's
 * pointer attributes name it, or NULL (no exception). */
cm_context *cm_context_of_pointer(CUdeviceptr p);
/* Whether a primary context with that gen is still registered and
 * alive (a closed or reset one is not).  Never raises. */
int cm_context_gen_live(unsigned long gen);
/* Whether ctx's device can map device peer's memory: 1, 0, or -1 with an
 * exception. */
int cm_context_can_access_peer(cm_context *ctx, int peer);
/* Whether ctx has peer access to peer's memory (or is peer). */
int cm_context_peer_enabled(cm_context *ctx, cm_context *peer);
/* Give ctx access to peer's memory, once per pair of live contexts;
 * ValueError naming both devices when the driver reports no peer
 * access.  0, or -1 with an exception. */
int cm_context_enable_peer(cm_context *ctx, cm_context *peer);
/* Check that memory of owner can be used by work in user (NULL owner:
 * unknown, allowed): the same context, or peer access (enabled here on
 * first need).  Else ValueError naming what ("kernel argument 1") and
 * both devices.  0 or -1. */
int cm_context_require_access(cm_context *user, cm_context *owner,
                              const char *what);
/* The Context of a device given as an ordinal or Device object (its
 * primary context retained, not pushed).  Borrowed, or NULL. */
cm_context *cm_context_of_device(PyObject *dev);
/* d's PCI domain, bus and device ids in pci[0..2], read from the driver
 * on the first call and cached on d.  0, or -1 with an exception. */
int cm_device_pci(cm_device *d, int pci[3]);
/* Every registered live Context, into out (CM_MAX_DEVICES entries), as
 * borrowed references; how many.  Never raises. */
int cm_context_live(cm_context **out);

/* ------------------------------------------------------------------ */
/* The memory managers as a context points at them                    */
/* ------------------------------------------------------------------ */

/* One kind of memory manager, as the allocation path (memory.c) and the
 * context (context/context.c) use it, instead of switching on the kind.
 * One constant table per kind: cm_mm_default and cm_mm_plugin
 * (memory.c), cm_mm_pool and cm_mm_async (poolops.c).  A context points
 * at two: ctx->mm, the manager that allocates, and ctx->mm_builtin, the
 * built-in one it was made with, whose state ctx->pool holds (they
 * differ while a plugin is assigned); a DeviceAllocation points at the
 * one that made it.  Calls go one way: memory.c calls the managers
 * through their tables, the pool files never call memory.c.
 *
 * The plugin's table has no functions (the allocation path calls the
 * Python object).  In the built-in ones, alloc, release, trim, stats
 * and alloc_fn are never NULL; the others are NULL where the manager
 * has nothing to do (no state, no stream order, nothing to export). */
struct cm_mm_ops {
    int kind;             /* CM_MM_* (the history records it) */
    const char *name;     /* memory_stats()'s "manager", and the name
                           * that selects the built-in one */
    const char *emm_class;  /* the class of cudamem._emm that
                             * Context.memory_manager makes for it */
    int ordered;          /* allocates for a stream and releases ordered
                           * on it (pool, async): the release runs at
                           * once unless defer_cleanup() holds the
                           * queue, and uses on other streams are noted */
    int rel;              /* the CM_REL_* that releases an allocation */
    int rel_sync;         /* the same when the streams that used it
                           * cannot be recorded (the flush waits for the
                           * context first) */
    int rel_after;        /* the same when one of them captured at the
                           * order (CM_ORDER_AFTER_CAPTURE): the flush
                           * orders after that stream once it no longer
                           * captures */
    /* Give ctx (alive; it need not be current) the manager's state; 0,
     * or -1 with an exception. */
    int (*create)(cm_context *ctx);
    /* Give everything the state holds back to the driver (the context
     * is being closed or reset; it is still alive).  Never raises. */
    void (*destroy)(cm_context *ctx);
    /* ctx, closed, is dead to every other thread and none of their
     * driver calls is in flight; its primary context is still retained:
     * give back what destroy kept for then (memory that work of other
     * threads could still reach, once the work queued is done).  NULL:
     * destroy keeps nothing.  Never raises. */
    void (*dead)(cm_context *ctx);
    /* Free the C state (Context dealloc). */
    void (*free)(cm_context *ctx);
    /* Allocate size bytes for stream, ctx current, GIL held (released
     * around calls that can block); *handle: what release takes.  What
     * it gets from the driver counts against the device's memory limit
     * (cm_limit_take), until given back: CUDA_ERROR_OUT_OF_MEMORY, with
     * no driver call, where the limit refuses it.  No exception is set:
     * the CUresult says what happened. */
    CUresult (*alloc)(cm_context *ctx, size_t size, CUstream stream,
                      CUdeviceptr *ptr, uintptr_t *handle);
    /* Run a release (kind: rel or rel_sync) of handle, an allocation
     * of size bytes, on stream; ctx current, with or without the GIL.
     * No exception is set.  CUDA_ERROR_NOT_READY, nothing done: not
     * now (stream captures, for a capture cudamem may not know of); the
     * release is queued and tried again at a later flush. */
    CUresult (*release)(cm_context *ctx, int kind, uintptr_t handle,
                        size_t size, CUstream stream);
    /* Before the release of an allocation (handle, allocated for own)
     * that work queued by cudamem also used on the n streams (ctx
     * current, GIL held): order the release after that work.  *on (own
     * on entry): the stream the release goes to.  CM_ORDER_AFTER_CAPTURE:
     * *on is the one of them (own included) that captures, for a
     * capture cudamem does not know of, and the others are ordered:
     * release with rel_after on *on.  Otherwise, not CUDA_SUCCESS:
     * release with rel_sync; CUDA_ERROR_NOT_READY: *on is one of several
     * that capture, and that release waits until it no longer does
     * (rel_sync's stream is NULL otherwise).  Ordered managers only. */
    CUresult (*order)(cm_context *ctx, uintptr_t handle, CUstream own,
                      const CUstream *streams, int n, CUstream *on);
    /* Stream h of ctx is about to be destroyed by cudamem: what waits
     * for it is ordered now, while the handle is valid.  ctx current,
     * with or without the GIL; never raises. */
    void (*stream_gone)(cm_context *ctx, CUstream h);
    /* Block handle, about to be released, was allocated for a stream
     * that may be destroyed without cudamem hearing of it (an external
     * stream, another library's): whatever its release will need of that
     * stream later is taken now, while the stream is alive.  With or
     * without the GIL; never raises. */
    void (*foreign_free)(cm_context *ctx, uintptr_t handle);
    /* Give every wholly free cached byte back to the driver; 0, or -1
     * with an exception. */
    int (*trim)(cm_context *ctx);
    /* Bytes the manager holds, how many of them are free, and the
     * largest free block (-1 when the manager cannot know); zeros
     * without state. */
    void (*stats)(cm_context *ctx, size_t *reserved, size_t *free_b,
                  long long *largest);
    /* Of the free bytes, those trim() can give back now or once
     * their work is done (NULL: all of them). */
    size_t (*trimmable)(cm_context *ctx);
    /* The entry point that allocates, for messages. */
    const char *(*alloc_fn)(cm_context *ctx);
    /* Whether device memory at base (an allocation's start) comes from
     * the manager's own exportable pool: 1, 0, or -1 with an exception. */
    int (*owns)(cm_context *ctx, CUdeviceptr base);
    /* Export the allocation at base for another process: its
     * cuMemPoolExportPointer data, the descriptor of the pool's
     * shareable handle (exported on the first call, kept until the
     * context is closed) and the token that names the pool.  GIL held,
     * ctx current.  0, or -1 with an exception: CudaAPIError
     * CUDA_ERROR_NOT_SUPPORTED, saying why, when the pool was made
     * without a shareable handle type. */
    int (*export)(cm_context *ctx, CUdeviceptr base,
                  CUmemPoolPtrExportData *data, int *fd, uint64_t *token);
    /* Allocate size bytes for stream from what the manager already
     * holds, with or without the GIL, never growing: the path of callers
     * that hold no Python object (interop.c's PyTorch entry points).
     * ctx is current and kept alive by the caller, which counts itself
     * as a driver call in flight (cm_driver_call_begin) from before the
     * call until it is done with the memory.  CUDA_SUCCESS;
     * CUDA_ERROR_NOT_READY when only alloc (GIL held) can serve it
     * (nothing free fits); CUDA_ERROR_CONTEXT_IS_DESTROYED once the
     * manager was destroyed.  NULL: the manager has no such path. */
    CUresult (*take)(cm_context *ctx, size_t size, CUstream stream,
                     CUdeviceptr *ptr, uintptr_t *handle);
    /* Device dev's context was given peer access to ctx's memory
     * (ctx->peers_in has its bit): what the manager holds or will hold
     * that cuCtxEnablePeerAccess does not open to other devices
     * (virtual memory, a stream-ordered pool) is opened to dev, now and
     * as it grows.  ctx alive, GIL held; 0, or -1 with an exception.
     * NULL: nothing to open. */
    int (*peer)(cm_context *ctx, int dev);
};

/* ------------------------------------------------------------------ */
/* cm_ctx_up: what the context calls in the layers above              */
/* ------------------------------------------------------------------ */

/* What the context layer calls in the layers above it, through pointers
 * those layers set in their init functions (module exec, before any
 * Python code can call into the module): the memory layer
 * (memory/memory.c's cm_memory_init) gives a context its memory manager,
 * queues and limit, and the IPC imports (features/ipchandle.c) let go of
 * a closing context's imported pools.  Each field names the function it
 * points at; memory/memory.h and features/ipc.h say what it does. */
typedef struct {
    /* memory/ */
    const cm_mm_ops *mm_default;       /* &cm_mm_default */
    const cm_mm_ops *mm_plugin;        /* &cm_mm_plugin */
    const cm_mm_ops *mm_pool;          /* &cm_mm_pool */
    const cm_mm_ops *mm_async;         /* &cm_mm_async */
    const cm_mm_ops *(*mm_builtin)(void);
    int (*mm_uses_plugin)(const cm_context *ctx);
    int (*mm_prepare)(cm_context *ctx);
    int (*limit_device_init)(int dev, size_t total);
    int (*ctx_init_memory)(cm_context *ctx);
    int (*ctx_flush)(cm_context *ctx);
    int (*ctx_flush_held)(cm_context *ctx);
    int (*pending_hold)(cm_pending *q, int depth);
    void (*ctx_release)(cm_context *ctx, int kind, uintptr_t handle,
                        size_t size);
    PyObject *(*mem_alloc)(cm_context *ctx, size_t size, CUdeviceptr *ptr);
    int (*hostmem_context_save)(cm_context *ctx);
    void (*hostmem_context_restore)(cm_context *ctx);
    void (*interop_context_closing)(cm_context *ctx);
    /* memory/pool/graph/gpool.c: a closing context's graph pools die; the
     * retirements put off while cudamem captured run once it captures
     * nothing (end_capture) */
    void (*graph_pools_closing)(cm_context *ctx);
    void (*graph_pools_tidy)(void);
    /* features/ipcpool.c */
    void (*ipc_context_closing)(cm_context *ctx);
} cm_context_upcalls;

extern cm_context_upcalls cm_ctx_up;

/* ------------------------------------------------------------------ */
/* Streams and events (stream.c, event.c, callbacks.c, streamfuncs.c)  */
/* ------------------------------------------------------------------ */

/* What a Stream object stands for; decides its repr, whether cudamem
 * destroys it, and what a CUDA Array Interface export names. */
typedef enum {
    CM_STREAM_USER = 0,       /* made by stream(); destroyed by cudamem */
    CM_STREAM_DEFAULT,        /* default_stream(): handle 0 */
    CM_STREAM_LEGACY,         /* legacy_default_stream(): handle 1 */
    CM_STREAM_PER_THREAD,     /* per_thread_default_stream(): handle 2 */
    CM_STREAM_EXTERNAL        /* external_stream(h): never destroyed */
} cm_stream_kind;

/* A Stream object (Python type cudamem.Stream, final: an exact type check
 * with cm_stream_check is enough).  Device-array code reads handle
 * directly. */
typedef struct {
    PyObject_HEAD
    CUstream handle;      /* driver handle; 0, 1, 2 for the defaults */
    cm_context *ctx;      /* strong: made current around driver calls */
    cm_stream_kind kind;  /* what the handle means */
    unsigned int flags;   /* CM_STREAM_USER: the CU_STREAM_* it was made
                           * with (the key of its reuse), else 0 */
    int priority;         /* CM_STREAM_USER: its priority, else 0 */
    PyObject *owner;      /* strong or NULL: keeps an external stream's
                           * producer alive */
    PyObject *weakreflist;
} cm_stream;

#define cm_stream_check(op) Py_IS_TYPE((op), cm_st->Stream_type)

/* An Event object (Python type cudamem.Event, final). */
typedef struct {
    PyObject_HEAD
    CUevent handle;       /* driver handle, NULL until created */
    cm_context *ctx;      /* strong: made current around driver calls */
    int timing;           /* created without CU_EVENT_DISABLE_TIMING */
    PyObject *weakreflist;
} cm_event;

#define cm_event_check(op) Py_IS_TYPE((op), cm_st->Event_type)

/* The stream handle a CUDA Array Interface export names for s: the
 * default stream (handle 0) is spelled 1 (legacy) or 2 (per-thread),
 * matching the default-stream mode, since the interface forbids 0
 * (docs/api.md#default-streams). */
static inline uintptr_t
cm_stream_cai_handle(const cm_stream *s)
{
    if (s->handle == NULL) {
        return cm_driver_per_thread() ? (uintptr_t)CU_STREAM_PER_THREAD
                                      : (uintptr_t)CU_STREAM_LEGACY;
    }
    return (uintptr_t)s->handle;
}

/* Destroy the idle streams ctx keeps for reuse: ctx is being closed or
 * reset, or the interpreter exits.  ctx's primary context must still be
 * retained (ctx may already be marked dead).  GIL held, released around
 * the destroys; never raises (a failure is reported as unraisable). */
void cm_stream_cache_clear(cm_context *ctx);
/* The same as cm_stream_external, keeping owner (may be NULL) alive as
 * long as the Stream. */
PyObject *cm_stream_external_owned(CUstream handle, PyObject *owner);

/* Wait, GIL held on entry and released meanwhile, until every driver
 * call made with the GIL released that began before now has ended, in
 * any thread.  Called once no new call on the objects that are going
 * can start (a closing context dead, a destroyed pool marked dead);
 * calls begun later are not waited for. */
void cm_context_quiesce(void);

/* A new Stream made with flags (priority 0) in ctx, which is current (a
 * kept idle one of ctx's where there is one).  New reference, or NULL
 * with an exception. */
PyObject *cm_stream_make_in(cm_context *ctx, unsigned int flags);

/* ------------------------------------------------------------------ */
/* argparse.c, callbacks.c, streamfuncs.c: stream arguments, driver    */
/* threads, external streams                                           */
/* ------------------------------------------------------------------ */

/* Whether h names a default stream (0, CU_STREAM_LEGACY or
 * CU_STREAM_PER_THREAD): always valid, never destroyed. */
static inline int
cm_stream_handle_is_default(CUstream h)
{
    uintptr_t v = (uintptr_t)h;

    return v == 0 || v == (uintptr_t)CU_STREAM_LEGACY
           || v == (uintptr_t)CU_STREAM_PER_THREAD;
}

/* Resolve a stream argument.  0, None and False give *handle = 0 and
 * return 0 (falsy: the caller then uses the array's bound stream, or a
 * synchronous call).  A cudamem Stream (one type check, no attribute
 * lookup), or any object with __cuda_stream__ (the cuda.core protocol),
 * gives its handle and returns 1 (truthy: asynchronous).  Anything else:
 * -1 with TypeError; a Stream of a closed context, or a handle that no
 * stream object can be at (cm_stream_handle_check): -1 with ValueError. */
int cm_stream_resolve(PyObject *obj, CUstream *handle);

/* Whether h, a stream handle that did not come from cudamem, may be
 * handed to the driver.  0, 1 and 2 name default streams; any other value
 * is the address of the driver's stream object, which the driver reads
 * without a check, so an unaligned address or one that cannot be read
 * would crash the process.  0, or -1 with ValueError naming what.  A
 * destroyed stream whose memory is still mapped cannot be told apart. */
int cm_stream_handle_check(uintptr_t h, const char *what);

/* Whether the calling thread is running a host callback for cudamem (the
 * driver's callback thread).  The driver forbids API calls there, so a
 * dealloc that would free a driver resource must defer it instead. */
int cm_on_driver_thread(void);

/* A new Stream object wrapping a handle cudamem does not own (external:
 * never destroyed by cudamem), as external_stream(h) returns, in the
 * current context.  New reference, or NULL with an exception. */
PyObject *cm_stream_external(CUstream handle);

/* ------------------------------------------------------------------ */
/* init functions of the context layer (ctxfuncs.c, streamfuncs.c)    */
/* ------------------------------------------------------------------ */

int cm_context_init(PyObject *mod, cm_state *st);
/* Let Python code assign attributes on the public types (tests written
 * for numba patch their methods); called once every type is made.  0. */
int cm_types_patchable(cm_state *st);
int cm_stream_init(PyObject *mod, cm_state *st);
/* For the tests (module.c): the state a fork's child must have made
 * fresh, as a dict; and a pretence of other threads' work in flight (on:
 * 1/0).  device.c. */
PyObject *cm_runtime_fork_state(void);
void cm_runtime_fork_pretend(int on);

/* Capture-aware work (graph.c; docs/design.md, "Capture-aware
 * synchronous work").  Each is 0, or -1 with StreamCaptureError, raised
 * before any driver call; what names the refused call. */

/* Whether a capture cudamem began is in progress (an atomic load). */
int cm_capture_any(void);

/* The graph pool (memory/pool/graph/gpool.c's, opaque here) that allocations
 * for stream h go to while cudamem captures h, or NULL; for the default
 * stream, that of a capture the calling thread began.  Read without a
 * lock: call it only while cm_capture_any(). */
void *cm_capture_pool(CUstream h);

/* Whether the calling thread may not make a potentially unsafe call (a
 * query of an ordinary event or of a stream that does not capture, a
 * free, an allocation, a synchronisation) because of the captures
 * cudamem began: one in global mode on any thread, or one in global or
 * thread-local mode on this thread.  The driver would refuse the call
 * and invalidate those captures; cudamem's background work waits, or
 * goes another way, instead.  No driver call: a relaxed atomic load and
 * a thread-local one when nothing captures.  Any thread, with or
 * without the GIL. */
int cm_capture_restricted(void);

/* While the captures cudamem began forbid this thread the potentially
 * unsafe calls (cm_capture_restricted): its capture mode made relaxed
 * around a call the driver would otherwise refuse and that joins no
 * capture (a stream-ordered allocation or free on a stream that does not
 * capture, a cuMemAlloc).  *saved: the mode to give back, or -1 when
 * nothing was changed (no driver call then). */
/* Nonzero while this thread runs an adapter's call for another library
 * (CuPy's, PyTorch's allocations and frees through cudamem): that
 * library may capture on this thread without cudamem knowing, so its
 * allocations and frees are relaxed too (graph.c). */
extern _Thread_local int cm_capture_adapter_depth;

/* This thread's capture mode made relaxed whatever cudamem knows of
 * captures (another library's may forbid the call): two calls of a
 * thread-local setting, for slow paths.  *saved as above. */
static inline void
cm_capture_relax_always(int *saved)
{
    CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;

    *saved = -1;
    if (cm_cu.ThreadExchangeStreamCaptureMode != NULL
        && CM_CU_RAW(ThreadExchangeStreamCaptureMode, (&m))
               == CUDA_SUCCESS) {
        *saved = (int)m;
    }
}

/* cm_capture_relax_always with the GIL kept whatever is in flight
 * (CM_CU_RAW_HELD), for code that holds pointers into state the GIL
 * guards; cm_capture_unrelax_held gives the mode back the same way. */
static inline void
cm_capture_relax_held(int *saved)
{
    CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;

    *saved = -1;
    if (cm_cu.ThreadExchangeStreamCaptureMode != NULL
        && CM_CU_RAW_HELD(ThreadExchangeStreamCaptureMode, (&m))
               == CUDA_SUCCESS) {
        *saved = (int)m;
    }
}

static inline void
cm_capture_unrelax_held(int saved)
{
    CUstreamCaptureMode m = (CUstreamCaptureMode)saved;

    if (saved >= 0) {
        (void)CM_CU_RAW_HELD(ThreadExchangeStreamCaptureMode, (&m));
    }
}

static inline void
cm_capture_relax(int *saved)
{
    *saved = -1;
    if (cm_capture_adapter_depth > 0 || cm_capture_restricted()) {
        cm_capture_relax_always(saved);
    }
}

static inline void
cm_capture_unrelax(int saved)
{
    CUstreamCaptureMode m = (CUstreamCaptureMode)saved;

    if (saved >= 0) {
        (void)CM_CU_RAW(ThreadExchangeStreamCaptureMode, (&m));
    }
}

/* Whether cudamem began a capture on stream h that is in progress: an
 * event recorded on h would be captured, and a query of h refused.  No
 * driver call.  Any thread. */
int cm_capture_stream_known(CUstream h);

/* While cudamem captures h (a stream it began capturing): keep o (an
 * owner of memory work just recorded on h uses) with the capture, so
 * that the Graph end_capture makes holds it until closed; a no-op for
 * other streams (one relaxed atomic load when nothing captures).  0, or
 * -1 with an exception.  GIL held. */
int cm_capture_keep(CUstream h, PyObject *o);

/* Small copies recorded as kernel nodes while cudamem captures
 * (context/kcopy.c).  cm_kcopy_max: the largest such copy, bytes (0:
 * off; CUDAMEM_CAPTURE_KERNEL_COPY_MAX).  cm_kcopy_prepare: load the
 * kernel into ctx (current) before a capture begins there, where the
 * switch is on; only on a thread that may make calls a capture forbids
 * (cm_capture_restricted); never raises (a failure leaves copy nodes).
 * cm_kcopy_record: record dst <- src, n bytes, on h (a stream cudamem
 * captures: cm_capture_stream_known) as the kernel when n is within the
 * switch and the kernel is loaded; a side marked host is cudamem's page-locked memory, whose
 * device address the driver gives.  1 when recorded, 0 when the caller
 * makes the copy node, -1 with an exception.  GIL held. */
size_t cm_kcopy_max(void);
void cm_kcopy_prepare(cm_context *ctx);
int cm_kcopy_record(cm_context *ctx, CUdeviceptr dst, int dst_host,
                    CUdeviceptr src, int src_host, size_t n, CUstream h);
int cm_kcopy_init(PyObject *mod);

/* Runs of kernel copies on a stream cudamem captures as one kernel node
 * (context/kbatch.c).  cm_kbatch_load: the batch kernel loaded into the
 * current context, or NULL (GIL released by the caller).
 * cm_kbatch_join: the copy dst <- src (device addresses; dst_host: dst
 * is page-locked host memory) joins h's open batch, where its node is
 * still h's one dependency: 1; 0 when it cannot (the caller records
 * it); -1 with an exception.  cm_kbatch_open: a copy that did not join:
 * on the simulator recorded here as a batch of one, on the driver
 * recorded by the caller just before (kcopy.c's kernel), and the batch
 * h's open one from now: 1, or -1 with an exception.  GIL held. */
void *cm_kbatch_load(void);
int cm_kbatch_join(cm_context *ctx, uintptr_t dst, int dst_host,
                   uintptr_t src, size_t n, CUstream h);
int cm_kbatch_open(cm_context *ctx, uintptr_t dst, int dst_host,
                   uintptr_t src, size_t n, CUstream h);
int cm_kbatch_init(PyObject *mod);

/* Whether cudamem began a capture of ctx's stream h that is in progress
 * (ctx alive): the check of a stream that goes.  No driver call; GIL. */
int cm_capture_stream_of(const cm_context *ctx, CUstream h);

/* Stream h of ctx, a stream() of cudamem's, is being dropped and its
 * destroy was queued: if it captures, that capture is ended in the
 * driver (its graph discarded) and forgotten, and ctx's queues run
 * unless another capture forbids it.  1 if it captured, else 0.  GIL
 * held; never raises. */
int cm_capture_stream_gone(cm_context *ctx, CUstream h);

/* The context of gen is gone (closed or reset): so are its captures,
 * which cudamem forgets.  GIL held; never raises. */
void cm_capture_context_gone(unsigned long gen);

/* Context-wide synchronisations as tickets, so that work known finished
 * needs no query (a capture may forbid one): a synchronize of ctx takes
 * a ticket before cuCtxSynchronize (GIL held) and hands it in once that
 * succeeded.  Work queued on ctx before cm_ctx_sync_mark (read after the
 * queuing call returned) is done once cm_ctx_synced_since that mark. */
static inline unsigned long
cm_ctx_sync_begin(cm_context *ctx)
{
    return __atomic_add_fetch(&ctx->sync_begun, 1, __ATOMIC_RELAXED);
}

static inline void
cm_ctx_sync_end(cm_context *ctx, unsigned long ticket)
{
    if (ticket > __atomic_load_n(&ctx->sync_done, __ATOMIC_RELAXED)) {
        __atomic_store_n(&ctx->sync_done, ticket, __ATOMIC_RELEASE);
    }
}

static inline unsigned long
cm_ctx_sync_mark(const cm_context *ctx)
{
    return __atomic_load_n(&ctx->sync_begun, __ATOMIC_RELAXED);
}

static inline int
cm_ctx_synced_since(const cm_context *ctx, unsigned long mark)
{
    return __atomic_load_n(&ctx->sync_done, __ATOMIC_ACQUIRE) > mark;
}

/* Work on the legacy default stream that must happen now: refused while
 * a global-mode capture cudamem began is in progress.  No driver call. */
int cm_capture_refuse_sync(const char *what);

/* A context-wide synchronize: refused while any capture cudamem began
 * is in progress.  No driver call. */
int cm_capture_refuse_ctx(const char *what);

/* Work that must happen now on stream h (waits on it, or queues host
 * code that runs once): refused while h captures.  A default handle is
 * cm_capture_refuse_sync; a stream cudamem captures is known without a
 * driver call; for an external stream (external != 0) the driver is
 * asked (cuStreamIsCapturing), as another library may capture it. */
int cm_capture_refuse_stream(CUstream h, int external, const char *what);

/* A wait or query of a stream or event the driver counts as potentially
 * unsafe during a capture (cuStreamSynchronize, cuStreamQuery,
 * cuEventSynchronize, cuEventQuery): refused while a capture cudamem
 * began forbids this thread such calls (cm_capture_restricted), before
 * the driver would refuse it and invalidate that capture.  No driver
 * call. */
int cm_capture_refuse_unsafe(const char *what);

#endif /* CM_CONTEXT_LAYER_H */
