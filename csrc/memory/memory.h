/* SPDX-License-Identifier: MIT */
/*
 * memory/memory.h: the public header of the room memory/, the memory
 * layer as the layers above see it.
 * The room owns, lowest first:
 * - layout.c: the layout math of strided views;
 * - argparse.c: the parsing of fast-call arguments;
 * - limit.c: the per-process device memory limit and what counts
 *   against it;
 * - clients.c: the bytes each library holds through cudamem's adapters;
 * - history.c: the memory history (memory_history, memory_snapshot);
 * - pool/: the pool and async managers, their segments on virtual memory
 *   (pool/vmm/) and graph-private pools (pool/graph/), behind
 *   memory/pool/pool.h;
 * - release.c: deferred deallocation, the release queues and the
 *   releases by context;
 * - oom.c: the out-of-memory policy and its error;
 * - default.c: the tables of the default manager and of a Python plugin;
 * - host/: pinned, mapped and managed host memory, the registrations of
 *   host arrays and the pinned pool, behind memory/host/host.h;
 * - staging/: the staged copies between pageable host memory and the
 *   device, behind memory/staging/staging.h;
 * - memory.c: the allocation path, DeviceAllocation and the choice of
 *   the built-in manager;
 * - interop.c: other libraries' allocations (ClientAllocation, CuPy's
 *   allocator, PyTorch's pluggable allocator).
 *
 * Locks and the GIL, in brief: everything here runs with the GIL held
 * unless it says so, and the GIL guards the Python-facing state (owners,
 * release queues, tunables, history).  The mutexes: each pool's mu
 * and, on virtual memory, its vmu, taken before mu; the graph pools'
 * list mutex, taken before any pool's; interop.c's cm_lane_mu; host/'s
 * registry lock cm_reg_lock; staging/'s cm_stg_mu.
 * None is held across a Python call; no other pair nests.  The GIL is
 * given up around the driver calls that can wait (allocations, frees,
 * flushes, synchronisations, mappings, the staging pipeline); releases,
 * the pool manager's take and PyTorch's lane also run without it and
 * touch no Python object.  Each file's head comment says the details.
 */
#ifndef CM_MEMORY_H
#define CM_MEMORY_H

#include "driver/driver.h"
#include "context/context.h"

/* ------------------------------------------------------------------ */
/* layout.c: the layout math of strided views                         */
/* ------------------------------------------------------------------ */

/* NumPy-1.19 contiguity of a layout: size-1 dimensions are ignored, an
 * empty array is both, a zero stride on a longer dimension is neither. */
void cm_layout_flags(int ndim, const Py_ssize_t *shape,
                     const Py_ssize_t *strides, Py_ssize_t itemsize,
                     int *c_contig, int *f_contig);
/* The byte span of a layout (0 when empty) and, in *lo, the offset of its
 * lowest byte from the first logical element (<= 0). */
Py_ssize_t cm_layout_span(int ndim, const Py_ssize_t *shape,
                          const Py_ssize_t *strides, Py_ssize_t itemsize,
                          Py_ssize_t *lo);
/* Whether the layout without its zero-stride dimensions (the "core") is
 * C- or F-contiguous. */
int cm_layout_core_contiguous(int ndim, const Py_ssize_t *shape,
                              const Py_ssize_t *strides, Py_ssize_t itemsize,
                              int *c_out, int *f_out);

/* Compact strides for shape in C (fortran = 0) or F order. */
void cm_layout_compact(int ndim, const Py_ssize_t *shape, Py_ssize_t itemsize,
                       int fortran, Py_ssize_t *strides);

/* Dimension indices ordered by descending |stride| (stable): the
 * keep-order permutation of NumPy's empty_like. */
void cm_layout_order(int ndim, const Py_ssize_t *strides, int *perm);

/* Compact strides following key's dimension order and signs; zero where
 * key has a zero stride.  Returns the bytes needed and, in *first, the
 * offset of the first logical element in such a buffer. */
Py_ssize_t cm_layout_compact_like(int ndim, const Py_ssize_t *shape,
                                  const Py_ssize_t *key, Py_ssize_t itemsize,
                                  Py_ssize_t *strides, Py_ssize_t *first);

/* ------------------------------------------------------------------ */
/* argparse.c: fast-call arguments                                     */
/* ------------------------------------------------------------------ */

/* Parse METH_FASTCALL | METH_KEYWORDS arguments against kwlist, n
 * interned names of positional-or-keyword parameters, the first nreq
 * required; out[i] is borrowed, or NULL when absent.  0 or -1. */
int cm_argparse(const char *fname, PyObject *const *args, Py_ssize_t nargs,
                PyObject *kwnames, PyObject *const *kwlist, int n,
                int nreq, PyObject **out);

/* ------------------------------------------------------------------ */
/* memory.c: allocations                                               */
/* ------------------------------------------------------------------ */

/* What memory/ calls in the layers above it, through pointers those
 * layers set in their init functions (module exec, before any Python
 * code can call into the module): the array layer (array/types.c) and
 * the IPC imports (features/ipchandle.c). */
typedef struct {
    /* cm_devicearray_owner: whether o is a device array, with what keeps
     * its memory alive */
    int (*devicearray_owner)(PyObject *o, PyObject **owner);
    /* cm_devicearray_new: a DeviceNDArray over memory gpu_data keeps
     * alive */
    PyObject *(*devicearray_new)(int ndim, const Py_ssize_t *shape,
                                 const Py_ssize_t *strides,
                                 PyArray_Descr *dtype, CUdeviceptr ptr,
                                 PyObject *gpu_data, PyObject *stream);
    /* cm_ipc_pool_release: let go of one open of a memory-pool import
     * (a CM_REL_IPC_POOL release); no GIL needed */
    CUresult (*ipc_pool_release)(uintptr_t imp);
    /* cm_ipc_pool_drop: the same for an import whose context was closed */
    void (*ipc_pool_drop)(uintptr_t imp);
    /* cm_ipc_vmm_release: let go of one open of imported pool pages (a
     * CM_REL_IPC_VMM release); no GIL needed */
    CUresult (*ipc_vmm_release)(uintptr_t imp);
    /* cm_ipc_vmm_drop: the same for an open whose context was closed */
    void (*ipc_vmm_drop)(uintptr_t imp);
} cm_memory_upcalls;

extern cm_memory_upcalls cm_mem_up;

/* The owner of one device allocation of the default memory manager
 * (Python type DeviceAllocation). */
typedef struct {
    PyObject_HEAD
    cm_context *ctx;      /* strong: the context the memory lives in */
    CUdeviceptr ptr;      /* device address; 0 for a zero-size owner */
    size_t size;          /* bytes */
    int freed;            /* NOTE: set once, before the free is issued */
    const cm_mm_ops *mm;  /* the manager that allocated it */
    CUstream stream;      /* the stream it was allocated for */
    PyObject *stream_obj; /* strong or NULL: the object that stream came
                           * from (a Stream, or a __cuda_stream__
                           * object), kept so that its handle stays valid
                           * until the release has been ordered after it */
    uintptr_t handle;     /* what the manager's release takes (the
                           * pool's block, else the address) */
    struct cm_uses *uses; /* NULL, or the other streams that work queued
                           * by cudamem used the memory on (pool and async
                           * managers only): the release waits for them */
    PyObject *weakreflist;
} cm_mem;

/* The streams, other than its own, on which cudamem queued work that
 * uses one allocation (cm_mem.uses): each handle with a strong reference
 * to the object it came from (NULL for the default streams), so that the
 * handle is still valid when the release records an event on it. */
typedef struct cm_uses {
    int n;
    int cap;
    struct {
        CUstream handle;
        PyObject *obj;
        int follower;     /* a stream of the memory's own context made
                           * to wait for work of another context's that
                           * used it (cm_mem_note_use) */
    } s[];
} cm_uses;

/* Note that work just queued on stream h (obj: the object h came from,
 * or NULL for a default stream) uses the memory that owner (a device
 * array's gpu_data: a DeviceAllocation, a device array it views, or
 * anything else) keeps alive.  Only allocations of the pool and async
 * managers made for another stream record it; the others return at
 * once.  h may be a stream of the current context where that is not
 * the memory's (a peer copy, a kernel of another device): the release
 * then waits for a stream of the memory's context made to wait for h's
 * work so far.  While cudamem captures h, the capture keeps owner too
 * (cm_capture_keep), unless it is a graph pool's block.  GIL held.  0,
 * or -1 with an exception. */
int cm_mem_note_use(PyObject *owner, CUstream h, PyObject *obj);

/* The kinds of queued release (CM_REL_*) are in context/context.h. */

/* Queue the release of a driver resource of ctx: memory on its memory
 * manager's queue, the rest on the context's; flush past the thresholds.
 * Safe on a driver callback thread (it never flushes there).  Never
 * raises: a failed flush is reported as unraisable.  Nothing happens for
 * a context that was closed or reset. */
void cm_ctx_release(cm_context *ctx, int kind, uintptr_t handle,
                    size_t size);
/* The same for a release tied to a stream (CM_REL_POOL, CM_REL_ASYNC).
 * Those run at once unless defer_cleanup() holds the queue or this is a
 * driver callback thread: returning a block to a stream-ordered pool
 * never waits, and the pool itself keeps reuse safe across streams. */
void cm_ctx_release_on(cm_context *ctx, int kind, uintptr_t handle,
                       size_t size, CUstream stream);
/* cm_ctx_release_on for memory that memory_stats()'s st_* counters do
 * not count (interop.c's lane counts its own). */
void cm_ctx_release_uncounted(cm_context *ctx, int kind, uintptr_t handle,
                              size_t size, CUstream stream);
/* Whether defer_cleanup() holds ctx's memory queue now: a read without
 * the GIL, for interop.c's lane, which leaves such releases to the
 * queue. */
int cm_ctx_deferring(cm_context *ctx);
/* Count an allocation of size bytes in ctx's st_* counters, or a release
 * (GIL held). */
void cm_ctx_count_alloc(cm_context *ctx, size_t size);
void cm_ctx_count_free(cm_context *ctx, size_t size);
/* Flush both of ctx's queues now (unless defer_cleanup holds them). */
int cm_ctx_flush(cm_context *ctx);
/* Flush one queue; 0, or -1 with the first driver error raised. */
int cm_pending_flush(cm_pending *q);
/* The bytes a queue's entries will give back (GIL held). */
size_t cm_pending_bytes(cm_pending *q);
/* Set a queue's defer_cleanup depth; returns the old one. */
int cm_pending_hold(cm_pending *q, int depth);
/* Make ctx's two queues; called once when the context is made. */
int cm_ctx_init_memory(cm_context *ctx);

/* An address attribute (device_pointer, host_pointer, ...) of a memory
 * pointer object, as plugins and foreign owners spell it: an int, None
 * (NULL), or an object with an int .value (ctypes).  0 or -1. */
int cm_pointer_attr(PyObject *obj, const char *name, uintptr_t *out);

/* Allocate size (> 0) bytes of device memory in ctx through its memory
 * manager (the C default, or a Python plugin's memalloc), the default
 * retrying once on out-of-memory after flushing and collecting.  A new
 * reference to the owner object (keep it alive as long as the memory is
 * used; it is a DeviceAllocation only for the default manager) with the
 * address in *ptr, or NULL with an exception (CudaOutOfMemoryError, also
 * a MemoryError, when the device is full). */
PyObject *cm_mem_alloc(cm_context *ctx, size_t size, CUdeviceptr *ptr);
/* The same for work on stream (0: the default stream).  The pool and
 * async managers allocate for that stream (the memory may be used on it
 * at once, on others after synchronising with it) and release on it;
 * the default manager and plugins ignore it. */
PyObject *cm_mem_alloc_on(cm_context *ctx, size_t size, CUstream stream,
                          CUdeviceptr *ptr);
/* Allocate size bytes for stream from ctx's built-in manager, ctx
 * current, as cm_mem_alloc_on does (one retry after flushing and
 * collecting, CudaOutOfMemoryError when the device is full) but with no
 * owner object and nothing counted: *ptr and the manager's release
 * handle in *handle.  0, or -1 with an exception. */
int cm_mem_alloc_raw(cm_context *ctx, size_t size, CUstream stream,
                     CUdeviceptr *ptr, uintptr_t *handle);
/* The same for work on the stream that stream_obj names (a Stream, an
 * object with __cuda_stream__, or 0/None/False for the default stream):
 * the DeviceAllocation keeps stream_obj alive until its release. */
PyObject *cm_mem_alloc_for(cm_context *ctx, size_t size,
                           PyObject *stream_obj, CUdeviceptr *ptr);

/* ------------------------------------------------------------------ */
/* limit.c, oom.c: the per-process device memory limit, out of memory  */
/* ------------------------------------------------------------------ */

/* What the free and total attributes of an out-of-memory error count. */
enum {
    CM_OOM_DEVICE = 0,    /* device memory (device and managed arrays) */
    CM_OOM_HOST           /* the host's RAM (pinned and mapped arrays) */
};

/* Raise CudaOutOfMemoryError for a failed allocation of size bytes in
 * ctx by fn (rc the driver's answer), with the attributes requested,
 * free, total, pending_bytes, pool_reserved, largest_free_block, limit
 * and limit_used, all repeated in the message.  where: CM_OOM_*. */
void cm_raise_oom_at(cm_context *ctx, CUresult rc, size_t size,
                     const char *fn, int where);

/* The out-of-memory policy after a failed allocation of size bytes in
 * ctx (managed: of managed memory), before its one retry.  Refused by
 * the driver: run the pending frees, trim the pools and, when a
 * collection could make room, collect cycles, then flush and trim
 * again; retry.  Refused by the memory limit (no driver call made): the
 * same only where it can help, that is the pending frees and the pool's
 * free bytes could cover the request, or a collection could (and owners
 * were made since the last collection for a refusal); else no retry.
 * GIL held; 1: retry, 0: refuse now, -1 with an exception. */
int cm_oom_recover(cm_context *ctx, size_t size, int managed);
/* Whether the memory limit refuses size more bytes in ctx now (no
 * driver call needed to know).  No GIL needed. */
int cm_limit_refuses(cm_context *ctx, size_t size);
/* A device allocation of more than the whole device: raises the
 * out-of-memory error for fn and returns -1 (no driver call: see
 * oom.c); 0 for any other size. */
int cm_oom_past_device(cm_context *ctx, size_t size, const char *fn);

/* Device dev's limit in bytes; 0 for none.  No GIL needed. */
size_t cm_limit_of(int dev);
/* Count n bytes that ctx is about to get from the driver against its
 * device's limit: 1, or 0 (nothing counted) when they would cross it.
 * No GIL needed. */
int cm_limit_take(cm_context *ctx, size_t n);
/* Uncount n bytes that ctx gave back to the driver (or never got from
 * it).  No GIL needed. */
void cm_limit_give(cm_context *ctx, size_t n);
/* The bytes ctx holds against the limit now. */
size_t cm_limit_used(cm_context *ctx);
/* Decide device dev's limit when its first context is made (total: its
 * memory): CUDAMEM_DEVICE_MEMORY_LIMIT applies unless set_memory_limit
 * did.  0, or -1 with ValueError naming the variable. */
int cm_limit_device_init(int dev, size_t total);
/* A Python plugin's allocation of size bytes by fn ("memalloc",
 * "memallocmanaged"): count it against the limit before the call (after
 * the out-of-memory policy when the limit refuses it); 0, or -1 with
 * CudaOutOfMemoryError.  Give it back with cm_limit_give when the call
 * fails. */
int cm_limit_plugin_take(cm_context *ctx, size_t size, const char *fn,
                         int managed);
/* Keep the plugin's allocation counted while its pointer object mp
 * lives.  Never raises: an object that takes no weak reference is not
 * counted (its bytes are given back at once). */
void cm_limit_plugin_track(cm_context *ctx, PyObject *mp, size_t size);
int cm_limit_init(PyObject *mod, cm_state *st);

/* ------------------------------------------------------------------ */
/* The memory managers' interface                                      */
/* ------------------------------------------------------------------ */

/* struct cm_mm_ops, the table of one kind of memory manager, is in
 * context/context.h beside the context that points at it. */

extern const cm_mm_ops cm_mm_default;  /* cuMemAlloc, queued cuMemFree */
extern const cm_mm_ops cm_mm_plugin;   /* a Python EMM plugin */
extern const cm_mm_ops cm_mm_pool;     /* cudamem's caching allocator */
extern const cm_mm_ops cm_mm_async;    /* the stream-ordered allocator */

/* The built-in manager (cm_mm_default, _pool or _async) that contexts
 * made from now on get, unless a plugin is set. */
const cm_mm_ops *cm_mm_builtin(void);

/* Nonzero while a built-in manager's own methods run on this thread
 * (_core._mm_direct): what they allocate goes to the context's built-in
 * manager even while a plugin that wraps them is assigned. */
extern _Thread_local int cm_mm_direct;
/* Nonzero while an adapter (interop.c) allocates on this thread for
 * another library (numba's plugin, CuPy, PyTorch): the pool manager on
 * virtual memory serves it from its peers' pool, whose cuMemAlloc'd
 * segments that library's own IPC can export with cuIpcGetMemHandle
 * (pool/poolops.c; docs/design.md, "Memory for the peers"). */
extern _Thread_local int cm_mm_for_peer;
/* Whether ctx's allocations on this thread go to its plugin (a plugin is
 * assigned and no built-in manager method is running here). */
int cm_mm_uses_plugin(const cm_context *ctx);
/* The table that allocates for ctx on this thread: ctx->mm, or the
 * built-in one inside a built-in manager's method. */
const cm_mm_ops *cm_mm_active(const cm_context *ctx);
/* Prepare ctx's memory manager for use, as numba does when it prepares a
 * context: a plugin assigned to Context.memory_manager has its
 * initialize() called once, before the first allocation through it (or
 * current_context() / push()).  0, or -1 with the plugin's exception
 * (the next preparation calls it again). */
int cm_mm_prepare(cm_context *ctx);
/* Allocate size bytes through ctx's plugin (prepared first): the
 * plugin's pointer object, its device address in *out; NULL with an
 * exception. */
PyObject *cm_mm_plugin_alloc(cm_context *ctx, size_t size,
                             CUdeviceptr *out);

/* ------------------------------------------------------------------ */
/* staging/staging.c: the staged pipeline of large pageable copies    */
/* ------------------------------------------------------------------ */

/* A copy between host memory and one contiguous device range, walked in
 * the device side's order: element i of the joint layout (row-major over
 * shape) is at dev + i * itemsize on the device. */
typedef struct {
    int htod;                   /* host to device, else device to host */
    int ndim;                   /* 0..NPY_MAXDIMS */
    const Py_ssize_t *shape;    /* ndim extents */
    const Py_ssize_t *hstrides; /* host strides, bytes, any sign */
    const Py_ssize_t *dstrides; /* device strides, bytes */
    uintptr_t host;             /* host address of element 0 */
    CUdeviceptr dev;            /* device address of element 0 */
    Py_ssize_t itemsize;
    int early;                  /* host to device: may return once the
                                 * host side is taken, its last chunks'
                                 * copies still running on the stream
                                 * (the device side is plain device
                                 * memory of one of cudamem's managers) */
} cm_xfer;

/* Copy x through the staging pipeline when it applies (staging on, at
 * least the threshold, the device side contiguous, the host memory not
 * page-locked).  Synchronous (on the default stream), or (async) issued
 * on stream after the work queued there.  When it returns the host side
 * is free to reuse (host to device) or filled (device to host), as with
 * the driver's copies of pageable memory; host to device with x->early,
 * the copies of the last chunks may still run on the stream (as the
 * driver's cuMemcpyHtoD of pageable memory may leave its last DMA), and
 * later work on that stream comes after them.  1 when done, 0 when the
 * caller should copy directly, -1 with an exception.  The context
 * current, GIL held (released inside). */
int cm_staging_copy(const cm_xfer *x, CUstream stream, int async);

/* host/hostreg.c: whether [lo, hi) overlaps a range cudamem registered
 * with the driver (pinned() / mapped()).  Call without the GIL. */
int cm_hostmem_registered(uintptr_t lo, uintptr_t hi);
/* host/hostmem.c: 1 if arr is a NumPy array over page-locked host memory
 * of cudamem's own for ctx (pinned_array, mapped_array: a pinned or
 * mapped allocation made in ctx or portable, not a plugin's, still in
 * place), else 0.  Never raises. */
int cm_hostmem_page_locked(PyObject *arr, cm_context *ctx);
/* host/hostreg.c: 1 if o is a HostRegistration (the gpu_data of
 * mapped()'s device arrays) that was closed, else 0.  Never raises. */
int cm_hostreg_closed(PyObject *o);

/* ------------------------------------------------------------------ */
/* host/hostclose.c: context close and reset                          */
/* ------------------------------------------------------------------ */

/* close() and Device.reset() keep the page-locked, mapped and managed
 * memory of ctx that arrays still point at (host/hostclose.c): _save
 * before the primary context is reset copies it aside, _restore after
 * puts it back at the same addresses as ordinary memory.  GIL held;
 * never raise.
 * _save returns 1 when memory was copied aside: the caller then keeps the
 * GIL until _restore, so that no Python thread writes the arrays while
 * their pages are gone (no add_callback of ctx is pending then, so the
 * reset does not wait for one that needs the GIL). */
int cm_hostmem_context_save(cm_context *ctx);
void cm_hostmem_context_restore(cm_context *ctx);

/* clients.c: the bytes each library holds through cudamem on ctx's
 * device, with "cudamem" for the rest of ctx's allocated bytes: a new
 * dict, or NULL. */
PyObject *cm_interop_by_client(cm_context *ctx);
/* Set exc.by_client and, when a library holds memory, name the holders
 * in exc.msg; 0, or -1 with an exception. */
int cm_interop_oom_note(cm_context *ctx, PyObject *exc);

/* interop.c: allocations other libraries hold through cudamem. */
/* ctx is being closed or reset (still alive, GIL held): PyTorch's entry
 * points stop serving from its pool, and the reference they keep to it
 * goes once PyTorch gives back what it took.  Never raises. */
void cm_interop_context_closing(cm_context *ctx);
int cm_interop_init(PyObject *mod, cm_state *st);

/* ------------------------------------------------------------------ */
/* history.c: the memory history                                       */
/* ------------------------------------------------------------------ */

/* What a history event records (cm_hist_note's action and kind). */
enum {
    CM_HIST_ALLOC = 0,    /* memory handed to a user */
    CM_HIST_FREE,         /* memory given back by its owner */
    CM_HIST_OOM           /* an allocation failed: out of memory */
};
enum {
    CM_HIST_DEVICE = 0,   /* device memory (a DeviceAllocation) */
    CM_HIST_PINNED,       /* page-locked host memory */
    CM_HIST_MAPPED,       /* page-locked host memory mapped to devices */
    CM_HIST_MANAGED       /* managed memory */
};

/* NOTE: guarded by the GIL.  Whether the history records. */
extern int cm_hist_on;
/* Record one event (GIL held; never raises).  Call via cm_hist_note. */
void cm_hist_record(int action, int kind, cm_context *ctx, uintptr_t stream,
                    uintptr_t addr, size_t size);

/* The hook of the allocation and free paths: one branch while off. */
static inline void
cm_hist_note(int action, int kind, cm_context *ctx, uintptr_t stream,
             uintptr_t addr, size_t size)
{
    if (__builtin_expect(cm_hist_on, 0)) {
        cm_hist_record(action, kind, ctx, stream, addr, size);
    }
}

int cm_history_init(PyObject *mod, cm_state *st);
/* pool/poolview.c: the segments of ctx's pool manager, a list of dicts
 * (base, size, small, blocks: a list of (address, size, state) with
 * state 'used', 'free' or 'pending'; peers: whether it is of the peers'
 * pool beside a pool on virtual memory; on virtual memory mapped and
 * page_size); an empty list for other managers.
 * A new reference, or NULL with an exception. */
PyObject *cm_pool_segments(cm_context *ctx);

/* What an export of memory of the pool on virtual memory gives
 * (memory/pool/vmm/share.c): the pages that hold the range, in order. */
typedef struct {
    CUdeviceptr base;     /* the first page's address */
    size_t page;          /* the page size */
    size_t n;             /* pages */
    int *fds;             /* malloc'd, n: each page's POSIX descriptor in
                           * this process, the pool's (open until the
                           * page's memory is given back) */
    uint64_t *ids;        /* malloc'd, n: each page's export name, unique
                           * in this process while its descriptor is open
                           * (a descriptor number may be reused later) */
} cm_vmm_pages;

/* Export the pages that hold [addr, addr + span) of ctx's pool on
 * virtual memory (span 0: from addr to the end of its block), with the
 * POSIX file-descriptor handle type.  1 with *out filled (the caller
 * frees fds and ids), 0 when addr is not memory of the pool's arenas,
 * -1 with an exception: CudaAPIError (CUDA_ERROR_NOT_SUPPORTED) when the
 * device cannot make its pages shareable, ValueError when the range is
 * not inside one block in use, or the driver's error.  GIL held;
 * released around the driver calls. */
int cm_pool_export_pages(cm_context *ctx, CUdeviceptr addr, size_t span,
                         cm_vmm_pages *out);

/* fdserve.c: descriptors offered to importing processes over a Unix
 * socket, where pidfd_getfd is refused them.  cm_fd_offer puts fd, with
 * the value its IPC handle carries beside it (a pool's token, a page's
 * id), on offer and starts this process's server if it has none: 0, or
 * -1 with errno (nothing offered; pidfd_getfd may still serve).
 * cm_fd_withdraw takes fd off before it is closed.  cm_fd_fetch asks
 * process pid for (fd, check): a new descriptor, or -1 with *err (EBADF:
 * not on offer; ECONNREFUSED: pid serves none; EPERM: the socket is not
 * pid's).  Any thread, GIL or not. */
int cm_fd_offer(int fd, uint64_t check);
void cm_fd_withdraw(int fd);
int cm_fd_fetch(long pid, int fd, uint64_t check, int *err);
/* Its part of module init (the fork handler); 0, or -1 with an
 * exception. */
int cm_fdserve_init(void);

/* ------------------------------------------------------------------ */
/* init functions of the memory layer                                 */
/* ------------------------------------------------------------------ */

int cm_memory_init(PyObject *mod, cm_state *st);
/* release.c: its type, functions and settings; called by cm_memory_init. */
int cm_release_init(PyObject *mod, cm_state *st);
int cm_pool_init(PyObject *mod, cm_state *st);
int cm_hostmem_init(PyObject *mod, cm_state *st);
int cm_staging_init(PyObject *mod, cm_state *st);

#endif /* CM_MEMORY_H */
