/* SPDX-License-Identifier: MIT */
/*
 * cm.h: what every file of cudamem._core shares.
 *
 * - the table of driver entry points (cm_cu), filled at run time either
 *   from libcuda.so.1 (driver.c) or from the CPU simulator (sim.c);
 * - the checking macros that turn a CUresult into CudaAPIError;
 * - the module state (types, exception classes, interned strings);
 * - the internal interfaces between the concept files.
 *
 * Multiple interpreters are unsupported (NumPy and the driver are per
 * process), so the module state is reached through one process-wide
 * pointer, cm_st, set once in module exec.
 */
#ifndef CM_H
#define CM_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define PY_ARRAY_UNIQUE_SYMBOL cm_ARRAY_API
#ifndef CM_MODULE_C
#define NO_IMPORT_ARRAY
#endif
#define NPY_NO_DEPRECATED_API NPY_1_22_API_VERSION
#include <numpy/arrayobject.h>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cudaProfilerTypedefs.h>

#include <stddef.h>
#include <stdint.h>

#if PY_VERSION_HEX < 0x030C0000
#include <structmember.h>
#define Py_T_PYSSIZET T_PYSSIZET
#define Py_T_OBJECT_EX T_OBJECT_EX
#define Py_READONLY READONLY
#endif

#if PY_VERSION_HEX < 0x030D0000
#define PyObject_GetOptionalAttr _PyObject_LookupAttr
#define Py_IsFinalizing _Py_IsFinalizing
#endif

#if PY_VERSION_HEX < 0x030C0000
static inline PyObject *
PyErr_GetRaisedException(void)
{
    PyObject *t;
    PyObject *v;
    PyObject *tb;

    PyErr_Fetch(&t, &v, &tb);
    if (t == NULL) {
        return NULL;
    }
    PyErr_NormalizeException(&t, &v, &tb);
    if (tb != NULL) {
        PyException_SetTraceback(v, tb);
        Py_DECREF(tb);
    }
    Py_DECREF(t);
    return v;
}

static inline void
PyErr_SetRaisedException(PyObject *exc)
{
    if (exc == NULL) {
        PyErr_Clear();
        return;
    }
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(exc)), exc,
                  PyException_GetTraceback(exc));
}
#endif

/* ------------------------------------------------------------------ */
/* The driver entry points                                             */
/* ------------------------------------------------------------------ */

/*
 * X(name, version): the entry point cu<name> at the ABI version whose
 * signature is PFN_cu<name>_v<version> in cudaTypedefs.h.  The loader asks
 * cuGetProcAddress for exactly that version; the simulator assigns
 * functions of exactly that type, so the compiler checks both.
 */
#define CM_CU_FUNCS(X)                  \
    X(GetErrorName, 6000)               \
    X(GetErrorString, 6000)             \
    X(Init, 2000)                       \
    X(DriverGetVersion, 2020)           \
    X(DeviceGet, 2000)                  \
    X(DeviceGetCount, 2000)             \
    X(DeviceGetName, 2000)              \
    X(DeviceGetAttribute, 2000)         \
    X(DeviceTotalMem, 3020)             \
    X(DeviceGetUuid, 11040)             \
    X(DeviceGetPCIBusId, 4010)          \
    X(DeviceCanAccessPeer, 4000)        \
    X(DevicePrimaryCtxRetain, 7000)     \
    X(DevicePrimaryCtxRelease, 11000)   \
    X(DevicePrimaryCtxReset, 11000)     \
    X(DevicePrimaryCtxGetState, 7000)   \
    X(CtxGetCurrent, 4000)              \
    X(CtxSetCurrent, 4000)              \
    X(CtxPushCurrent, 4000)             \
    X(CtxPopCurrent, 4000)              \
    X(CtxGetDevice, 2000)               \
    X(CtxSynchronize, 2000)             \
    X(CtxEnablePeerAccess, 4000)        \
    X(MemAlloc, 3020)                   \
    X(MemFree, 3020)                    \
    X(MemGetInfo, 3020)                 \
    X(MemAllocManaged, 6000)            \
    X(MemAllocAsync, 11020)             \
    X(MemFreeAsync, 11020)              \
    X(DeviceGetDefaultMemPool, 11020)   \
    X(MemPoolSetAttribute, 11020)       \
    X(MemPoolGetAttribute, 11020)       \
    X(MemPoolTrimTo, 11020)             \
    X(MemPoolCreate, 11020)             \
    X(MemPoolDestroy, 11020)            \
    X(MemPoolSetAccess, 11020)          \
    X(MemAllocFromPoolAsync, 11020)     \
    X(MemPoolExportToShareableHandle, 11020) \
    X(MemPoolImportFromShareableHandle, 11020) \
    X(MemPoolExportPointer, 11020)      \
    X(MemPoolImportPointer, 11020)      \
    X(MemHostAlloc, 2020)               \
    X(MemFreeHost, 2000)                \
    X(MemHostRegister, 6050)            \
    X(MemHostUnregister, 4000)          \
    X(MemHostGetDevicePointer, 3020)    \
    X(MemHostGetFlags, 2030)            \
    X(MemGetAddressRange, 3020)         \
    X(PointerGetAttribute, 4000)        \
    X(PointerGetAttributes, 7000)       \
    X(MemcpyHtoD, 3020)                 \
    X(MemcpyDtoH, 3020)                 \
    X(MemcpyDtoD, 3020)                 \
    X(MemcpyHtoDAsync, 3020)            \
    X(MemcpyDtoHAsync, 3020)            \
    X(MemcpyDtoDAsync, 3020)            \
    X(Memcpy2D, 3020)                   \
    X(Memcpy2DAsync, 3020)              \
    X(Memcpy3D, 3020)                   \
    X(Memcpy3DAsync, 3020)              \
    X(MemcpyPeer, 4000)                 \
    X(MemcpyPeerAsync, 4000)            \
    X(MemsetD8, 3020)                   \
    X(MemsetD8Async, 3020)              \
    X(MemPrefetchAsync, 12020)          \
    X(MemAdvise, 12020)                 \
    X(StreamCreate, 2000)               \
    X(StreamDestroy, 4000)              \
    X(StreamSynchronize, 2000)          \
    X(StreamQuery, 2000)                \
    X(StreamWaitEvent, 3020)            \
    X(StreamAddCallback, 5000)          \
    X(LaunchHostFunc, 10000)            \
    X(EventCreate, 2000)                \
    X(EventRecord, 2000)                \
    X(EventSynchronize, 2000)           \
    X(EventQuery, 2000)                 \
    X(EventDestroy, 4000)               \
    X(EventElapsedTime, 12080)          \
    X(IpcGetMemHandle, 4010)            \
    X(IpcOpenMemHandle, 11000)          \
    X(IpcCloseMemHandle, 4010)          \
    X(ModuleLoadData, 2000)             \
    X(ModuleUnload, 2000)               \
    X(ModuleGetFunction, 2000)          \
    X(ModuleGetGlobal, 3020)            \
    X(LaunchKernel, 4000)               \
    X(FuncSetAttribute, 9000)           \
    X(FuncGetAttribute, 2020)           \
    X(FuncGetParamInfo, 12040)          \
    X(ProfilerStart, 4000)              \
    X(ProfilerStop, 4000)

typedef struct {
#define CM_CU_FIELD(name, ver) PFN_cu##name##_v##ver name;
    CM_CU_FUNCS(CM_CU_FIELD)
#undef CM_CU_FIELD
} cm_cu_table;

/* Index of each entry point, for fault injection and name lookup. */
enum {
#define CM_CU_INDEX(name, ver) CM_CU_IDX_##name,
    CM_CU_FUNCS(CM_CU_INDEX)
#undef CM_CU_INDEX
    CM_CU_N_FUNCS
};

/* The process-wide table; entries are NULL until cm_driver_ensure. */
extern cm_cu_table cm_cu;
/* The base names ("MemAlloc"), indexed by CM_CU_IDX_*. */
extern const char *const cm_cu_names[CM_CU_N_FUNCS];
/* What a NULL entry returns: CUDA_ERROR_NOT_FOUND for the driver,
 * CUDA_ERROR_NOT_SUPPORTED for the simulator. */
extern CUresult cm_cu_missing;

/* Which backend filled the table. */
typedef enum {
    CM_BACKEND_NONE = 0,
    CM_BACKEND_DRIVER,
    CM_BACKEND_SIM
} cm_backend;

/* ------------------------------------------------------------------ */
/* Module state                                                        */
/* ------------------------------------------------------------------ */

typedef struct cm_state {
    /* types */
    PyTypeObject *Device_type;
    PyTypeObject *Context_type;
    PyTypeObject *Mem_type;
    PyTypeObject *Pending_type;
    PyTypeObject *DeviceNDArrayBase_type;
    PyTypeObject *DeviceNDArray_type;
    PyTypeObject *DeviceRecord_type;
    PyTypeObject *IpcMemory_type;
    PyTypeObject *IpcHandleBase_type;
    PyTypeObject *IpcArrayHandleBase_type;
    /* cudamem._ipc's IpcHandle, IpcArrayHandle (subclasses of the two
     * types above), _RawHandle and _export_array, and cudamem._emm's
     * MemoryPointer, fetched on the first export (or open) */
    PyObject *IpcHandle;
    PyObject *IpcArrayHandle;
    PyObject *IpcRawHandle;
    PyObject *ipc_export_array;
    PyObject *MemoryPointer;
    /* cudamem._ipc's _IpcPointer (an IpcMemory and a MemoryPointer): the
     * type of what an open makes, fetched with the above */
    PyObject *IpcPointer;

    PyTypeObject *HostMem_type;
    PyTypeObject *HostRegistration_type;
    /* cudamem._hostmem's MappedNDArray and ManagedNDArray, fetched on
     * first use (NumPy subclasses are defined in Python) */
    PyObject *MappedNDArray;
    PyObject *ManagedNDArray;
    /* cudamem.config, imported on first use by the CAI-import path */
    PyObject *config;
    PyTypeObject *Stream_type;
    PyTypeObject *Event_type;
    PyTypeObject *Module_type;
    PyTypeObject *Kernel_type;
    PyTypeObject *Launcher_type;
    /* exception classes, from cudamem/_errors.py */
    PyObject *CudaSupportError;
    PyObject *CudaDriverError;
    PyObject *CudaAPIError;
    PyObject *CudaOutOfMemoryError;
    PyObject *CompileError;
    /* the MemoryInfo namedtuple class */
    PyObject *MemoryInfo;
    /* interned strings */
    PyObject *str_shape;
    PyObject *str_strides;
    PyObject *str_typestr;
    PyObject *str_data;
    PyObject *str_version;
    PyObject *str_stream;
    PyObject *str_descr;
    PyObject *str_mask;
    PyObject *str_cai;                 /* "__cuda_array_interface__" */
} cm_state;

extern cm_state *cm_st;

/* ------------------------------------------------------------------ */
/* driver.c: loading and error checking                                */
/* ------------------------------------------------------------------ */

/* Raise CudaAPIError (or its out-of-memory subclass) for rc from the
 * driver function fn ("cuMemAlloc").  Always returns -1. */
int cm_raise_cu(CUresult rc, const char *fn);

static inline int
cm_cu_check(CUresult rc, const char *fn)
{
    return rc == CUDA_SUCCESS ? 0 : cm_raise_cu(rc, fn);
}

/* Call cu<fn>(args...) and check it; 0 or -1 with an exception set.
 * A missing entry point stays NULL and fails here, not at import. */
#define CM_CU(fn, args)                                                \
    cm_cu_check(cm_cu.fn ? cm_cu.fn args : cm_cu_missing, "cu" #fn)

/* Driver calls made with the GIL released and not yet back with it:
 * close() and Device.reset() wait, GIL released, until none that began
 * before the context was marked dead is left before they destroy it, so
 * that no call in flight uses a stream, event or memory of it meanwhile.
 * A call counts in cm_driver_calls[its epoch's parity] from before it
 * releases the GIL until after it has taken the GIL back, so what the
 * caller does with the result before its next release of the GIL
 * (linking a new owner, checking that its context is still alive) also
 * happens before the reset.  The closer moves cm_driver_epoch on (GIL
 * held) and waits for the old parity's count to drain, which calls begun
 * later do not hold up.  Changed with atomics. */
extern long cm_driver_calls[2];
extern unsigned long cm_driver_epoch;

static inline int
cm_driver_call_begin(void)
{
    int e = (int)(__atomic_load_n(&cm_driver_epoch, __ATOMIC_SEQ_CST) & 1);

    (void)__atomic_fetch_add(&cm_driver_calls[e], 1, __ATOMIC_SEQ_CST);
    return e;
}

static inline void
cm_driver_call_end(int e)
{
    (void)__atomic_fetch_sub(&cm_driver_calls[e], 1, __ATOMIC_SEQ_CST);
}

/* Py_BEGIN/END_ALLOW_THREADS around driver calls, counted as above. */
#define CM_DRIVER_BEGIN_NOGIL                                          \
    {                                                                  \
        int cm_epoch_ = cm_driver_call_begin();                        \
        Py_BEGIN_ALLOW_THREADS
#define CM_DRIVER_END_NOGIL                                            \
        Py_END_ALLOW_THREADS                                           \
        cm_driver_call_end(cm_epoch_);                                 \
    }

/* The same with the GIL released around the call; err gets 0 or -1. */
#define CM_CU_NOGIL(err, fn, args)                                     \
    do {                                                               \
        CUresult cm_rc_;                                               \
        CM_DRIVER_BEGIN_NOGIL                                          \
        cm_rc_ = cm_cu.fn ? cm_cu.fn args : cm_cu_missing;             \
        CM_DRIVER_END_NOGIL                                            \
        (err) = cm_cu_check(cm_rc_, "cu" #fn);                         \
    } while (0)

/* The raw call, for code that handles the CUresult itself. */
#define CM_CU_RAW(fn, args) (cm_cu.fn ? cm_cu.fn args : cm_cu_missing)

/* Set once the table is filled and cuInit succeeded (acquire load). */
extern int cm_driver_ready_flag;
/* Set in the child of a fork() after the driver was initialised. */
extern volatile int cm_forked;

/* Load the backend and run cuInit once; 0, or -1 with CudaSupportError
 * (or CudaDriverError after fork) set.  Cheap after the first call. */
int cm_driver_ensure_slow(void);

static inline int
cm_driver_ensure(void)
{
    if (__atomic_load_n(&cm_driver_ready_flag, __ATOMIC_ACQUIRE)
        && !cm_forked) {
        return 0;
    }
    return cm_driver_ensure_slow();
}

cm_backend cm_driver_backend(void);
/* Whether CUDAMEM_SIMULATOR (or NUMBA_ENABLE_CUDASIM) asks for the
 * simulator. */
int cm_env_simulator(void);
/* Whether handle 0 means the per-thread default stream. */
int cm_driver_per_thread(void);

/* ------------------------------------------------------------------ */
/* sim.c: the CPU simulator                                            */
/* ------------------------------------------------------------------ */

/* Fill every modelled entry of t; leave the others NULL.  per_thread:
 * whether stream handle 0 means the per-thread default stream. */
void cm_sim_fill(cm_cu_table *t, int per_thread);
/* Arm fault injection: the nth (1 = next) call of entry point idx returns
 * code.  nth 0 disarms.  0, or -1 if idx is out of range. */
int cm_sim_inject(int idx, long nth, CUresult code);
/* Whether h is a stream the simulator has and has not destroyed (its
 * context included).  Simulator backend only. */
int cm_sim_stream_live(const void *h);
/* cuLaunchHostFunc(h, fn, data), queued only if each of the nranges
 * byte ranges [start[i], start[i] + len[i]) (empty ones skipped) lies
 * inside one live allocation, else CUDA_ERROR_INVALID_VALUE as the
 * simulator's copies answer; checked and queued atomically.  For the
 * internal kernels (kernels.c).  Simulator backend only. */
CUresult cm_sim_launch_checked(CUstream h, CUhostFn fn, void *data,
                               int nranges, const uintptr_t *start,
                               const size_t *len);

/* ------------------------------------------------------------------ */
/* context.c: devices and primary contexts                             */
/* ------------------------------------------------------------------ */

/* The most devices cudamem keeps track of. */
#define CM_MAX_DEVICES 64

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

/* Which memory manager a context has (cm_context.mm_kind). */
enum {
    CM_MM_DEFAULT = 0,    /* cuMemAlloc, frees through the queue */
    CM_MM_PLUGIN,         /* a Python EMM plugin (memory_manager) */
    CM_MM_POOL,           /* cudamem's caching allocator (pool.c) */
    CM_MM_ASYNC           /* the driver's stream-ordered allocator */
};

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
    int mm_kind;          /* CM_MM_*: the built-in kind, or CM_MM_PLUGIN
                           * while memory_manager is a plugin (set when
                           * the context is made or memory_manager is
                           * assigned) */
    int mm_builtin;       /* the built-in kind chosen when it was made */
    int mm_info_busy;     /* NOTE: guarded by the GIL: a plugin's
                           * get_memory_info is running */
    cm_pool *pool;        /* pool and async managers' state, else NULL;
                           * NOTE: freed only with the Context object */
    cm_pending *memq;     /* strong: the memory manager's release queue */
    cm_pending *ctxq;     /* strong: streams, events, modules */
    size_t st_bytes;      /* device bytes allocated and not yet released */
    size_t st_peak;       /* the most st_bytes has been */
    size_t st_count;      /* live device allocations */
    size_t st_total_count;  /* device allocations ever made */
    size_t st_pinned;     /* pinned host bytes allocated */
    /* [d]: gen of device d's context that this one enabled peer access
     * to (0: none); stale once that context is reset */
    unsigned long peer_gen[CM_MAX_DEVICES];
    /* idle streams for stream() to hand out again, oldest first; NOTE:
     * guarded by the GIL; filled and emptied only by stream.c, emptied
     * (the streams destroyed) by close, reset and at exit */
    cm_stream_slot stream_cache[CM_STREAM_CACHE_MAX];
    int n_stream_cache;   /* used entries of stream_cache */
    PyObject *weakreflist;
} cm_context;

/* The context current on this thread, making device 0's primary context
 * current if none is.  Borrowed reference, or NULL with an exception. */
cm_context *cm_context_current(void);
/* Make ctx current on this thread if it is not (cheap when it is). */
int cm_context_activate(cm_context *ctx);
/* Make ctx current for one operation; *prev gets what cm_context_leave
 * needs to give the thread its own context back.  0, or -1 with an
 * exception (then nothing to leave). */
int cm_context_enter(cm_context *ctx, CUcontext *prev);
/* Undo cm_context_enter.  Never raises. */
void cm_context_leave(cm_context *ctx, CUcontext prev);
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
/* memory.c: allocations                                               */
/* ------------------------------------------------------------------ */

/* The owner of one device allocation of the default memory manager
 * (Python type DeviceAllocation). */
typedef struct {
    PyObject_HEAD
    cm_context *ctx;      /* strong: the context the memory lives in */
    CUdeviceptr ptr;      /* device address; 0 for a zero-size owner */
    size_t size;          /* bytes */
    int freed;            /* NOTE: set once, before the free is issued */
    int kind;             /* CM_MM_* of the manager that allocated it */
    CUstream stream;      /* the stream it was allocated for */
    PyObject *stream_obj; /* strong or NULL: the object that stream came
                           * from (a Stream, or a __cuda_stream__
                           * object), kept so that its handle stays valid
                           * until the release has been ordered after it */
    void *blk;            /* the pool's block (CM_MM_POOL), else NULL */
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
    } s[];
} cm_uses;

/* Note that work just queued on stream h (obj: the object h came from,
 * or NULL for a default stream) uses the memory that owner (a device
 * array's gpu_data: a DeviceAllocation, a device array it views, or
 * anything else) keeps alive.  Only allocations of the pool and async
 * managers made for another stream record it; the others return at
 * once.  GIL held.  0, or -1 with MemoryError. */
int cm_mem_note_use(PyObject *owner, CUstream h, PyObject *obj);

/* What the free and total attributes of an out-of-memory error count. */
enum {
    CM_OOM_DEVICE = 0,    /* device memory (device and managed arrays) */
    CM_OOM_HOST           /* the host's RAM (pinned and mapped arrays) */
};

/* Raise CudaOutOfMemoryError for a failed allocation of size bytes in
 * ctx by fn (rc the driver's answer), with the attributes requested,
 * free, total, pending_bytes, pool_reserved and largest_free_block, all
 * repeated in the message.  where: CM_OOM_*. */
void cm_raise_oom_at(cm_context *ctx, CUresult rc, size_t size,
                     const char *fn, int where);

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
    CM_REL_IPC_POOL,      /* an imported pool allocation (ipc.c's record)
                           * let go: cuMemFree once unused */
    CM_REL_POOL_SYNC,     /* a pool block whose streams could not be
                           * recorded (released on a driver callback
                           * thread): the flush waits for the context,
                           * then the block is free for any stream */
    CM_REL_ASYNC_SYNC     /* the same for the async manager: the flush
                           * waits for the context, then cuMemFreeAsync
                           * on the default stream */
};

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
/* Flush both of ctx's queues now (unless defer_cleanup holds them). */
int cm_ctx_flush(cm_context *ctx);
/* Flush one queue; 0, or -1 with the first driver error raised. */
int cm_pending_flush(cm_pending *q);
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
/* The same for work on the stream that stream_obj names (a Stream, an
 * object with __cuda_stream__, or 0/None/False for the default stream):
 * the DeviceAllocation keeps stream_obj alive until its release. */
PyObject *cm_mem_alloc_for(cm_context *ctx, size_t size,
                           PyObject *stream_obj, CUdeviceptr *ptr);

/* ------------------------------------------------------------------ */
/* pool.c: the built-in pool and async managers                        */
/* ------------------------------------------------------------------ */

/* The built-in kind (CM_MM_DEFAULT, _POOL or _ASYNC) that contexts made
 * from now on get, unless a plugin is set. */
int cm_mm_builtin_kind(void);
/* Give ctx (alive; it need not be current) the state of manager kind;
 * 0, or -1 with an exception. */
int cm_pool_create(cm_context *ctx, int kind);
/* Give everything ctx's pool holds back to the driver (the context is
 * being closed or reset; it is still alive).  Never raises. */
void cm_pool_destroy(cm_context *ctx);
/* Free the C state (Context dealloc). */
void cm_pool_free(cm_context *ctx);
/* Allocate size bytes for stream from ctx's pool or async allocator,
 * ctx current, GIL held (released around calls that can block).  No
 * exception is set: the CUresult says what happened. */
CUresult cm_pool_alloc(cm_context *ctx, size_t size, CUstream stream,
                       CUdeviceptr *ptr, void **blk);
/* Run a CM_REL_POOL / CM_REL_ASYNC release; ctx current, with or without
 * the GIL.  No exception is set. */
CUresult cm_pool_release(cm_context *ctx, int kind, uintptr_t handle,
                         CUstream stream);
/* Before the release of pool block blk (in use; ctx current, GIL
 * held): record an event on each of the n streams, and on own unless it
 * is a default stream, so that the block is handed out again only once
 * all of them have completed (own: the stream it was allocated for).
 * Never raises: a block whose event cannot be recorded is never reused
 * (trim() gives its segment back). */
void cm_pool_retire(cm_context *ctx, void *blk, CUstream own,
                    const CUstream *streams, int n);
/* For the async manager: the stream (*on, the pool's own) on which a
 * free follows the work queued so far on own and on each of the n
 * streams, without making any of them wait for another.  ctx current;
 * CUresult. */
CUresult cm_pool_async_join(cm_context *ctx, CUstream own,
                            const CUstream *streams, int n, CUstream *on);
/* Stream h of ctx is about to be destroyed by cudamem: free pool blocks
 * that wait for it to reach their release get an event recorded on it
 * now, while the handle is valid.  ctx current, with or without the
 * GIL; never raises. */
void cm_pool_stream_gone(cm_context *ctx, CUstream h);
/* Give every wholly free pooled byte back to the driver (the async
 * manager waits for the context first); 0, or -1 with an exception. */
int cm_pool_trim(cm_context *ctx);
/* Whether device memory at base (an allocation's start) comes from the
 * pool of ctx's async manager: 1, 0 (another manager, another pool, or
 * no pool), or -1 with an exception. */
int cm_pool_owns(cm_context *ctx, CUdeviceptr base);
/* Export the allocation at base of ctx's async pool for another process:
 * its cuMemPoolExportPointer data, the descriptor of the pool's
 * shareable handle (exported on the first call, kept until the context
 * is closed) and the token that names the pool.  GIL held, ctx current.
 * 0, or -1 with an exception: CudaAPIError CUDA_ERROR_NOT_SUPPORTED,
 * saying why, when the pool was made without a shareable handle type. */
int cm_pool_export(cm_context *ctx, CUdeviceptr base,
                   CUmemPoolPtrExportData *data, int *fd, uint64_t *token);
/* Whether ctx's async pool can be shared with other processes. */
int cm_pool_shareable(cm_context *ctx);
/* The entry point that allocates for ctx's built-in manager kind, for
 * messages ("cuMemAllocFromPoolAsync" for a shareable async pool). */
const char *cm_pool_alloc_fn(cm_context *ctx);
/* Bytes the pool holds, how many of them are free, and the largest free
 * block (-1 when the manager cannot know).  Zeros without a pool. */
void cm_pool_stats(cm_context *ctx, size_t *reserved, size_t *free_b,
                   long long *largest);

/* ------------------------------------------------------------------ */
/* stream.c: streams, events and stream arguments                      */
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

/* Destroy the idle streams ctx keeps for reuse: ctx is being closed or
 * reset, or the interpreter exits.  ctx's primary context must still be
 * retained (ctx may already be marked dead).  GIL held, released around
 * the destroys; never raises (a failure is reported as unraisable). */
void cm_stream_cache_clear(cm_context *ctx);

/* A new Stream object wrapping a handle cudamem does not own (external:
 * never destroyed by cudamem), as external_stream(h) returns, in the
 * current context.  New reference, or NULL with an exception. */
PyObject *cm_stream_external(CUstream handle);
/* The same, keeping owner (may be NULL) alive as long as the Stream. */
PyObject *cm_stream_external_owned(CUstream handle, PyObject *owner);


/* ------------------------------------------------------------------ */
/* nvrtc.c: NVRTC loaded at run time, compilation with a disk cache    */
/* ------------------------------------------------------------------ */

/* What to compile. */
typedef struct {
    const char *src;                 /* CUDA C source */
    const char *name;                /* program name, for the log */
    int major;                       /* target compute capability */
    int minor;
    int n_opts;                      /* extra NVRTC options */
    const char *const *opts;
    int n_names;                     /* name expressions to lower */
    const char *const *names;
    int want_ptx;                    /* PTX for compute_XY, not a cubin */
    int keep_ptx;                    /* also return the PTX text */
} cm_nvrtc_req;

/* What came out; every pointer malloc'd, freed by
 * cm_nvrtc_result_clear. */
typedef struct {
    char *image;                     /* cubin, or NUL-terminated PTX */
    size_t size;                     /* bytes of image (without the NUL) */
    int is_ptx;                      /* image is PTX */
    char *ptx;                       /* the PTX text, if keep_ptx */
    char **lowered;                  /* n_names lowered (mangled) names */
    char *log;                       /* NVRTC's log on failure (or NULL) */
    const char *error;               /* NVRTC's error name on failure */
} cm_nvrtc_result;

/* Statuses of cm_nvrtc_compile_nogil. */
enum {
    CM_NVRTC_OK = 0,
    CM_NVRTC_EFAIL,                  /* NVRTC refused: res->log says why */
    CM_NVRTC_ENOMEM                  /* out of host memory */
};

/* Load NVRTC once; 0, or -1 with CudaSupportError set.  GIL held. */
int cm_nvrtc_ensure(void);
/* The loaded NVRTC's version (after cm_nvrtc_ensure). */
void cm_nvrtc_version(int *major, int *minor);
/* The CUDA Toolkit's include directory into buf (for -I); 0 or -1. */
int cm_nvrtc_include_dir(char *buf, size_t n);
/* Compile through the disk cache (CUDAMEM_CACHE_DIR); runs without the
 * GIL, after cm_nvrtc_ensure.  A CM_NVRTC_* status; res is filled on
 * success and holds the log on CM_NVRTC_EFAIL. */
int cm_nvrtc_compile_nogil(const cm_nvrtc_req *req, cm_nvrtc_result *res);
/* Free what res holds (n_names as in the request). */
void cm_nvrtc_result_clear(cm_nvrtc_result *res, int n_names);

/* ------------------------------------------------------------------ */
/* kernels.c: internal kernels (NVRTC on a GPU, host code on the sim)  */
/* ------------------------------------------------------------------ */

#define CM_KMAXDIM 32

/* Element type codes; used by the kernels'
 * conversion code (convert.h) and cm_elem_type_of. */
#define CM_T_BOOL 0
#define CM_T_I8 1
#define CM_T_U8 2
#define CM_T_I16 3
#define CM_T_U16 4
#define CM_T_I32 5
#define CM_T_U32 6
#define CM_T_I64 7
#define CM_T_U64 8
#define CM_T_F16 9
#define CM_T_F32 10
#define CM_T_F64 11
#define CM_T_C64 12
#define CM_T_C128 13
#define CM_T_BYTES 14   /* opaque items of a given size: copied, not cast */


/* An N-d strided copy with a cast: dst[i] = cast(src[i]) over shape.
 * Zero source strides broadcast.  Types are CM_T_* codes of convert.h;
 * CM_T_BYTES on both sides copies opaque items of itemsize bytes. */
typedef struct {
    int ndim;                          /* 0..CM_KMAXDIM */
    Py_ssize_t shape[CM_KMAXDIM];      /* extents */
    Py_ssize_t dst_strides[CM_KMAXDIM];  /* bytes */
    Py_ssize_t src_strides[CM_KMAXDIM];  /* bytes, 0 to broadcast */
    CUdeviceptr dst;                   /* address of element (0,...,0) */
    CUdeviceptr src;                   /* address of element (0,...,0) */
    int dst_type;                      /* CM_T_* */
    int src_type;                      /* CM_T_* */
    int itemsize;                      /* bytes, for CM_T_BYTES */
} cm_copy_desc;

/* Enqueue the copy on stream in ctx; 0, or -1 with an exception
 * (CudaSupportError when NVRTC is missing on a GPU). */
int cm_copy_kernel(cm_context *ctx, const cm_copy_desc *d, CUstream stream);
/* The CM_T_* code of a dtype: a numeric code for native-order numeric
 * types, else CM_T_BYTES. */
int cm_elem_type_of(PyArray_Descr *dt);
/* devicearray.c: layouts and the copy engine                          */
/* ------------------------------------------------------------------ */

/* A strided view of memory on either side of the bus: what the layout
 * math and the copy engine work on, shared by device arrays and the
 * host-backed (mapped / managed) arrays. */
typedef struct {
    uintptr_t addr;             /* address of the first logical element */
    int ndim;
    const Py_ssize_t *shape;    /* ndim entries */
    const Py_ssize_t *strides;  /* ndim entries, bytes, any sign */
    Py_ssize_t itemsize;
    int device;                 /* 1: device memory, 0: host memory */
} cm_view;

/* NumPy-1.19 contiguity of a layout: size-1 dimensions are ignored, an
 * empty array is both, a zero stride on a longer dimension is neither. */
void cm_layout_flags(int ndim, const Py_ssize_t *shape,
                     const Py_ssize_t *strides, Py_ssize_t itemsize,
                     int *c_contig, int *f_contig);
/* 0 when NumPy could make an array of that layout (its size and byte
 * span fit in Py_ssize_t), else -1 with NumPy's ValueError. */
int cm_layout_check(int ndim, const Py_ssize_t *shape,
                    const Py_ssize_t *strides, Py_ssize_t itemsize);
/* The byte span of a layout (0 when empty) and, in *lo, the offset of its
 * lowest byte from the first logical element (<= 0). */
Py_ssize_t cm_layout_span(int ndim, const Py_ssize_t *shape,
                          const Py_ssize_t *strides, Py_ssize_t itemsize,
                          Py_ssize_t *lo);
/* Copy src into dst, element by element in logical order: both have the
 * same shape once size-1 dimensions are dropped and the same itemsize.
 * Any layouts; zero strides only where src has them too (or src only).
 * Writes no byte of dst's span outside the view.  async: use the ...Async
 * calls on stream; staged copies then synchronise stream before they
 * return.  0, or -1 with an exception set. */
int cm_copy(const cm_view *dst, const cm_view *src, CUstream stream,
            int async);

/* Whether o is a cudamem device array (DeviceNDArrayBase or a subclass):
 * 1 with the address of its first element in *ptr, else 0.  The fast
 * path for kernel arguments; never raises. */
int cm_devicearray_pointer(PyObject *o, CUdeviceptr *ptr);
/* Whether o is a device array: 1 with what keeps its memory alive (its
 * gpu_data, borrowed) in *owner, else 0.  Never raises. */
int cm_devicearray_owner(PyObject *o, PyObject **owner);
/* The Context of a device array's memory (borrowed; NULL when empty or
 * unknown).  o must be a device array. */
cm_context *cm_devicearray_context(PyObject *o);

/* What the files that extend device arrays (dlpack.c) see of one: all
 * borrowed, valid while the array lives. */
typedef struct {
    cm_view view;              /* layout; view.addr is the first element */
    PyArray_Descr *dtype;
    PyObject *stream;          /* the bound stream (0 or a stream) */
    PyObject *gpu_data;        /* what keeps the memory alive, or None */
    cm_context *ctx;           /* the context of the memory's device, or
                                * NULL (empty, or not known) */
} cm_da_desc;

/* 1 with *d filled when obj is a device array (DeviceNDArrayBase), else
 * 0. */
int cm_da_describe(PyObject *obj, cm_da_desc *d);
/* The effective bound stream of a device array: 1 with the handle in *h
 * when bound (asynchronous), 0 when unbound, -1 with an exception. */
int cm_da_bound_stream(PyObject *obj, CUstream *h);
/* Make the context of a device array's memory current (or the thread's
 * default context). */
int cm_da_activate_ctx(PyObject *obj);
/* A new DeviceNDArray: over memory that owner keeps alive, ptr being the
 * first logical element, or (owner NULL) over a fresh allocation of the
 * layout's span in the current context.  stream NULL means 0.  Steals
 * nothing; an empty array drops owner at once. */
PyObject *cm_da_wrap(int ndim, const Py_ssize_t *shape,
                    const Py_ssize_t *strides, PyArray_Descr *dtype,
                    CUdeviceptr ptr, PyObject *owner, PyObject *stream);

/* ------------------------------------------------------------------ */
/* dlpack.c: DLPack export and import                                  */
/* ------------------------------------------------------------------ */

/* DLPack device types cudamem exchanges (docs/api.md#dlpack): device
 * memory (what its arrays export), pinned / mapped host memory and
 * managed memory (also accepted on import). */
#define CM_DLDEV_CUDA 2
#define CM_DLDEV_CUDA_HOST 3
#define CM_DLDEV_CUDA_MANAGED 13

/* __dlpack__ / __dlpack_device__ of an array over memory of DLPack device
 * type dl_type (CM_DLDEV_*): the host-backed array types call these from
 * their own methods with their device type. */
PyObject *cm_dlpack_export_as(PyObject *self, int dl_type,
                              PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames);
PyObject *cm_dlpack_device_as(PyObject *self, int dl_type);
/* The methods of DeviceNDArrayBase (device memory, kDLCUDA). */
PyObject *cm_dlpack_export(PyObject *self, PyObject *const *args,
                           Py_ssize_t nargs, PyObject *kwnames);
PyObject *cm_dlpack_device(PyObject *self, PyObject *unused);
extern const char cm_dlpack_export_doc[];
extern const char cm_dlpack_device_doc[];

/* Parse METH_FASTCALL | METH_KEYWORDS arguments against kwlist, n
 * interned names of positional-or-keyword parameters, the first nreq
 * required; out[i] is borrowed, or NULL when absent.  0 or -1. */
int cm_argparse(const char *fname, PyObject *const *args, Py_ssize_t nargs,
                PyObject *kwnames, PyObject *const *kwlist, int n,
                int nreq, PyObject **out);
/* device_array's (shape, dtype, strides, order) rules: fills shape[] and
 * strides[] (NPY_MAXDIMS entries each) and *dtype (a new reference);
 * ndim, or -1 with an exception.  Any argument may be NULL (default). */
int cm_layout_parse(PyObject *shape_o, PyObject *dtype_o,
                    PyObject *strides_o, PyObject *order_o,
                    Py_ssize_t *shape, Py_ssize_t *strides,
                    PyArray_Descr **dtype);
/* device_array_like's rules: the layout of a new array like ary (host or
 * device); ndim, or -1. */
int cm_layout_like(PyObject *ary, Py_ssize_t *shape, Py_ssize_t *strides,
                   PyArray_Descr **dtype);
/* A new DeviceNDArray over memory that gpu_data keeps alive; ptr is the
 * address of the first logical element (ignored when empty); stream NULL
 * means 0.  Steals nothing. */
PyObject *cm_devicearray_new(int ndim, const Py_ssize_t *shape,
                             const Py_ssize_t *strides,
                             PyArray_Descr *dtype, CUdeviceptr ptr,
                             PyObject *gpu_data, PyObject *stream);

/* ------------------------------------------------------------------ */
/* staging.c: the staged pipeline for large pageable transfers        */
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
} cm_xfer;

/* Copy x through the staging pipeline when it applies (staging on, at
 * least the threshold, the device side contiguous, the host memory not
 * page-locked).  Synchronous (on the default stream), or (async) issued
 * on stream after the work queued there; either way the copy completed
 * when it returns, as the driver's copies of pageable memory do.  1 when
 * done, 0 when the caller should copy directly, -1 with an exception.
 * The context current, GIL held (released inside). */
int cm_staging_copy(const cm_xfer *x, CUstream stream, int async);

/* hostmem.c: whether [lo, hi) overlaps a range cudamem registered with
 * the driver (pinned() / mapped()).  Call without the GIL. */
int cm_hostmem_registered(uintptr_t lo, uintptr_t hi);
/* hostmem.c: 1 if o is a HostRegistration (the gpu_data of mapped()'s
 * device arrays) that was closed, else 0.  Never raises. */
int cm_hostreg_closed(PyObject *o);

/* ------------------------------------------------------------------ */
/* init functions, called from module exec in this order               */
/* ------------------------------------------------------------------ */

int cm_driver_init(PyObject *mod, cm_state *st);
int cm_context_init(PyObject *mod, cm_state *st);
int cm_memory_init(PyObject *mod, cm_state *st);
/* Let Python code assign attributes on the public types (tests written
 * for numba patch their methods); called once every type is made.  0. */
int cm_types_patchable(cm_state *st);
int cm_pool_init(PyObject *mod, cm_state *st);
int cm_stream_init(PyObject *mod, cm_state *st);
int cm_kernels_init(PyObject *mod, cm_state *st);
int cm_devicearray_init(PyObject *mod, cm_state *st);
/* A heap type from spec (base may be NULL) bound to mod, added to mod
 * under the name after the spec name's dot; NULL with an exception. */
PyTypeObject *cm_make_type(PyObject *mod, PyType_Spec *spec,
                           PyTypeObject *base);
int cm_ipc_init(PyObject *mod, cm_state *st);

/* ------------------------------------------------------------------ */
/* ipc.c                                                               */
/* ------------------------------------------------------------------ */

/* DeviceNDArray.get_ipc_handle (METH_NOARGS): an IpcArrayHandle, made in
 * C for the built-in managers' memory, else by the memory manager's
 * get_ipc_handle through cudamem._ipc._export_array. */
PyObject *cm_ipc_get_handle(PyObject *self, PyObject *unused);
/* Let go of one open of a memory-pool import (the handle of a
 * CM_REL_IPC_POOL release): the last frees the imported memory and, with
 * its pool's last allocation, the imported pool.  No GIL needed; the
 * import's context current.  The first failing CUresult, or success. */
CUresult cm_ipc_pool_release(uintptr_t imp);
/* The same for an import whose context was closed: no driver call. */
void cm_ipc_pool_drop(uintptr_t imp);
/* 1 if o is an IpcMemory (what IpcHandle.open gives) that was closed,
 * else 0.  Never raises. */
int cm_ipc_mem_closed(PyObject *o);
/* ctx is being closed (still alive, GIL held): free what it still
 * imports from other processes' pools and destroy those pools.  Never
 * raises. */
void cm_ipc_context_closing(cm_context *ctx);

/* close() and Device.reset() keep the page-locked, mapped and managed
 * memory of ctx that arrays still point at (hostmem.c): _save before the
 * primary context is reset copies it aside, _restore after puts it back
 * at the same addresses as ordinary memory.  GIL held; never raise.
 * _save returns 1 when memory was copied aside: the caller then keeps the
 * GIL until _restore, so that no Python thread writes the arrays while
 * their pages are gone (no add_callback of ctx is pending then, so the
 * reset does not wait for one that needs the GIL). */
int cm_hostmem_context_save(cm_context *ctx);
void cm_hostmem_context_restore(cm_context *ctx);

/* init functions of the later files */
int cm_kernel_init(PyObject *mod, cm_state *st);
int cm_dlpack_init(PyObject *mod, cm_state *st);

int cm_hostmem_init(PyObject *mod, cm_state *st);
int cm_staging_init(PyObject *mod, cm_state *st);

/* interop.c: allocations other libraries hold through cudamem.  The
 * bytes each library holds on ctx's device, with "cudamem" for the rest
 * of ctx's allocated bytes: a new dict, or NULL. */
PyObject *cm_interop_by_client(cm_context *ctx);
/* Set exc.by_client and, when a library holds memory, name the holders
 * in exc.msg; 0, or -1 with an exception. */
int cm_interop_oom_note(cm_context *ctx, PyObject *exc);
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
/* pool.c: the segments of ctx's pool manager, a list of dicts (base,
 * size, small, blocks: a list of (address, size, state) with state
 * 'used', 'free' or 'pending'); an empty list for other managers.  A
 * new reference, or NULL with an exception. */
PyObject *cm_pool_segments(cm_context *ctx);

#endif /* CM_H */
