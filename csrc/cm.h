/* SPDX-License-Identifier: MIT */
/*
 * cm.h: what every file of cudamem._core shares.
 *
 * - the table of driver entry points (cm_cu, driver/cu_table.h), filled
 *   at run time either from libcuda.so.1 (driver/driver.c) or from the
 *   CPU simulator (sim/);
 * - the checking macros that turn a CUresult into CudaAPIError;
 * - the module state (types, exception classes, interned strings);
 * - the Device and Context objects, which every layer above the driver
 *   works in (context/context.c), and the table through which the
 *   context reaches the memory managers and the IPC imports above it.
 *
 * What a layer offers the one above is in its folder's header
 * (driver/driver.h, context/context.h, memory/memory.h, array/array.h,
 * features/features.h).
 *
 * Multiple interpreters are unsupported (NumPy and the driver are per
 * process), so the module state is reached through one process-wide
 * pointer, cm_st (driver/state.c), set once in module exec.
 */
#ifndef CM_H
#define CM_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define PY_ARRAY_UNIQUE_SYMBOL cm_ARRAY_API
#ifndef CM_NUMPY_API_C
#define NO_IMPORT_ARRAY
#endif
#define NPY_NO_DEPRECATED_API NPY_1_22_API_VERSION
#include <numpy/arrayobject.h>

#include "driver/cu_table.h"

#include <stddef.h>
#include <stdint.h>
#include <pthread.h>

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
/* Module state                                                        */
/* ------------------------------------------------------------------ */

/* How many interned keyword names each table of the state holds (each
 * checked against its enum where the enum is). */
#define CM_ARRAY_KW_N 19
#define CM_HOST_KW_N 11
#define CM_DLPACK_KW_N 4

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
    PyTypeObject *HostMem_type;
    PyTypeObject *HostRegistration_type;
    PyTypeObject *Stream_type;
    PyTypeObject *Event_type;
    PyTypeObject *Module_type;
    PyTypeObject *Kernel_type;
    PyTypeObject *Launcher_type;
    PyTypeObject *autosync_type;   /* the auto_synchronize() helper */
    PyTypeObject *notifier_type;   /* one per asyncio loop */
    PyTypeObject *client_type;     /* ClientAllocation (memory/interop.c) */

    /* What the cudamem package registers at import (_register, see
     * module.c): the Python classes and helpers C uses, so that C never
     * imports the package.  NULL until registered; reach them through
     * cm_registered() / CM_RAISE, which raise RuntimeError naming a
     * missing one. */
    /* from cudamem._errors */
    PyObject *CudaSupportError;
    PyObject *CudaDriverError;
    PyObject *CudaAPIError;
    PyObject *CudaOutOfMemoryError;
    PyObject *CompileError;
    PyObject *MemoryInfo;          /* the namedtuple class */
    PyObject *StreamCaptureError;
    /* from cudamem.graphs: what Stream.end_capture returns, and the
     * pool a capture allocates from */
    PyObject *Graph;
    PyObject *GraphPool;
    /* from cudamem._emm: the manager of a new context (_manager_for),
     * the kind of an assigned one (_manager_kind), the built-in
     * managers' classes and the pointer class of IPC exports */
    PyObject *manager_for;
    PyObject *manager_kind;
    PyObject *DefaultMemoryManager;
    PyObject *PoolMemoryManager;
    PyObject *AsyncMemoryManager;
    PyObject *MemoryPointer;
    /* from cudamem._ipc: IpcHandle, IpcArrayHandle (subclasses of the
     * handle bases), _RawHandle, _export_array and _IpcPointer (an
     * IpcMemory and a MemoryPointer) */
    PyObject *IpcHandle;
    PyObject *IpcArrayHandle;
    PyObject *IpcRawHandle;
    PyObject *ipc_export_array;
    PyObject *IpcPointer;
    /* from cudamem._hostmem: the NumPy subclasses */
    PyObject *MappedNDArray;
    PyObject *ManagedNDArray;
    PyObject *config;              /* the cudamem.config module */
    PyObject *api_split;           /* cudamem._api._split */
    PyObject *global_view;         /* cudamem._kernel._global_view */
    /* from cudamem._index: d[key] and d[key] = value for keys with index
     * arrays (NumPy's advanced indexing) */
    PyObject *index_getitem;
    PyObject *index_setitem;

    /* Objects C makes for itself, kept for the life of the module. */
    PyObject *zero;                /* the int 0 */
    PyObject *three;               /* the int 3 (CAI version) */
    PyObject *dl_max_version;      /* (1, 0) */
    PyObject *dl_kwn_versioned;    /* ("stream", "max_version") */
    PyObject *dl_kwn_legacy;       /* ("stream",) */
    /* asyncio.get_running_loop, and the WeakKeyDictionary loop ->
     * notifier; made on first use (context/callbacks.c) */
    PyObject *get_running_loop;
    PyObject *notifiers;
    /* the exception of the last failed cudamem_torch_alloc, or NULL;
     * NOTE: guarded by the GIL */
    PyObject *torch_error;
    /* a Python plugin's allocations counted against the memory limit:
     * id of a weak reference to the pointer object -> (the weak
     * reference, the context, size), and the weak references' callback
     * (memory/limit.c); made on first use */
    PyObject *plugin_counts;
    PyObject *plugin_freed;

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
    PyObject *str_cuda_memory;         /* "__cuda_memory__" */
    PyObject *str_sync_cfg;            /* "CUDA_ARRAY_INTERFACE_SYNC" */
    PyObject *str_C;                   /* "C" */
    PyObject *str_dtype;               /* "dtype" */
    PyObject *str_pci[3];              /* features/ipc.c's cm_pci_keys */
    PyObject *str_dlpack;              /* "__dlpack__" */
    PyObject *str_dlpack_device;       /* "__dlpack_device__" */
    PyObject *str_cuda_stream;         /* "__cuda_stream__" */
    PyObject *str_callback;            /* "callback" */
    PyObject *str_arg;                 /* "arg" */
    PyObject *str_timing;              /* "timing" */
    PyObject *str_ptr;                 /* "ptr" */
    PyObject *str_evtstart;            /* "evtstart" */
    PyObject *str_evtend;              /* "evtend" */
    PyObject *str_done;                /* "done" */
    PyObject *str_set_result;          /* "set_result" */
    PyObject *str_set_exception;       /* "set_exception" */
    PyObject *str_create_future;       /* "create_future" */
    PyObject *str_await;               /* "__await__" */
    PyObject *str_drain;               /* "_drain" */
    /* interned keyword names: array/ (K_* of array/devicearray.h),
     * host memory (KW_* of memory/host/host.h), from_dlpack's protocol */
    PyObject *kw[CM_ARRAY_KW_N];
    PyObject *hm_kw[CM_HOST_KW_N];
    PyObject *dl_kw[CM_DLPACK_KW_N];
} cm_state;

extern cm_state *cm_st;

/* obj, an object the package registers (a cm_state field named name);
 * when it is not registered (cudamem._core imported without the cudamem
 * package), NULL with RuntimeError naming it.  Borrowed. */
PyObject *cm_registered(PyObject *obj, const char *name);
#define CM_REGISTERED(field) cm_registered(cm_st->field, #field)

/* PyErr_Format with a registered exception class; RuntimeError naming
 * the class when it is not registered.  Always NULL. */
PyObject *cm_raise_registered(PyObject *cls, const char *name,
                              const char *fmt, ...);
#define CM_RAISE(field, ...)                                           \
    cm_raise_registered(cm_st->field, #field, __VA_ARGS__)

/* ------------------------------------------------------------------ */
/* driver.c: loading and error checking                                */
/* ------------------------------------------------------------------ */

/* Raise CudaAPIError (or its out-of-memory subclass) for rc from the
 * driver function fn ("cuMemAlloc").  Always returns -1. */
int cm_raise_cu(CUresult rc, const char *fn);

/* Raise CudaAPIError(rc, msg), numba's own signature, with a message of
 * cudamem's own; msg is stolen (NULL: its error stands).  -1. */
int cm_raise_api_msg(CUresult rc, PyObject *msg);

static inline int
cm_cu_check(CUresult rc, const char *fn)
{
    return rc == CUDA_SUCCESS ? 0 : cm_raise_cu(rc, fn);
}

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

/* The epoch in which the calling thread's outermost counted call began
 * (cm_call_depth > 0): a close waits for such calls, so they may still
 * use the context it marked dead (cm_ctx_dying_check). */
extern _Thread_local unsigned long cm_call_epoch;
extern _Thread_local int cm_call_depth;

static inline int
cm_driver_call_begin(void)
{
    unsigned long ep = __atomic_load_n(&cm_driver_epoch, __ATOMIC_SEQ_CST);
    int e = (int)(ep & 1);

    (void)__atomic_fetch_add(&cm_driver_calls[e], 1, __ATOMIC_SEQ_CST);
    if (cm_call_depth++ == 0) {
        cm_call_epoch = ep;
    }
    return e;
}

static inline void
cm_driver_call_end(int e)
{
    cm_call_depth--;
    (void)__atomic_fetch_sub(&cm_driver_calls[e], 1, __ATOMIC_SEQ_CST);
}

/* The setting _core._copy_keep_gil (see cm_copy_host): a CM_KEEP_GIL_*
 * mode, CM_KEEP_GIL_AUTO by default (the H200's thread rows,
 * docs/performance.md). */
enum { CM_KEEP_GIL_OFF, CM_KEEP_GIL_ON, CM_KEEP_GIL_AUTO };
extern int cm_copy_keep_gil;

/* Whether two or more driver calls of other threads are counted (made
 * with the GIL released, or waiting to take it back): then a release of
 * ours joins a queue of hand-overs that costs more than a short call
 * (with one other, the overlap is worth it).  GIL held. */
static inline int
cm_gil_contended(void)
{
    return cm_call_depth == 0
           && __atomic_load_n(&cm_driver_calls[0], __ATOMIC_RELAXED)
              + __atomic_load_n(&cm_driver_calls[1], __ATOMIC_RELAXED) >= 2;
}

/* Whether an enqueue that _core._copy_keep_gil covers keeps the GIL now
 * (CM_KEEP_GIL_AUTO: while cm_gil_contended).  One relaxed load when
 * off; GIL held. */
static inline int
cm_keep_gil_now(void)
{
    int mode = __atomic_load_n(&cm_copy_keep_gil, __ATOMIC_RELAXED);

    return mode == CM_KEEP_GIL_AUTO ? cm_gil_contended() : mode;
}

/* Whether 'auto' (not 'on') keeps the GIL now around the two calls it
 * alone covers: a host-to-device enqueue of at most CM_SHORT_HTOD_BYTES
 * from host memory cudamem cannot place (cm_copy_host), and a
 * Stream.synchronize of the stream of cm_done_hint, when a query, made
 * first, finds it done.  Both return at once where they apply; under
 * contention (cm_gil_contended) a release around them costs a place in
 * the queue for the GIL. */
static inline int
cm_keep_gil_auto_now(void)
{
    return __atomic_load_n(&cm_copy_keep_gil, __ATOMIC_RELAXED)
               == CM_KEEP_GIL_AUTO
           && cm_gil_contended();
}

/* The stream of this thread's last copy into host memory cudamem could
 * not place, which the driver returns from once the copy is done where
 * that memory is pageable: its synchronize likely finds nothing left.
 * A hint only (the query decides); NULL when none. */
extern _Thread_local CUstream cm_done_hint;

/* The driver returns from a host-to-device enqueue from pageable memory
 * of up to this many bytes once it has copied the source into its
 * staging memory (no wait for the stream). */
#define CM_SHORT_HTOD_BYTES 65536

/* The GIL probe (_core._gil_probe, for the benchmarks): while it is on,
 * every counted release of the GIL records how long the thread ran with
 * it released and how long it then waited to take it back, per kind
 * (CM_PROBE_NOGIL: CM_DRIVER_BEGIN/END_NOGIL; CM_PROBE_DROP:
 * cm_gil_drop/cm_gil_take).  Off, it costs one relaxed load per release.
 * cm_gil_probe_note runs with the GIL held (taken back), which guards the
 * counts. */
enum { CM_PROBE_NOGIL, CM_PROBE_DROP, CM_PROBE_KINDS };
extern int cm_gil_probe_on;
/* How a synchronous copy between pageable host memory and device memory
 * is made, per direction (CM_SYNC_HTOD, CM_SYNC_DTOH; set by the test aid
 * _core._sync_copy_call, see cm_copy_host).  CM_SYNC_CALL: the
 * synchronous call; CM_SYNC_ASYNC: the ...Async call on the default
 * stream (legacy, or per-thread when cudamem runs so); CM_SYNC_ASYNC_WAIT:
 * the same, and a copy into host memory then waits for that stream.  The
 * defaults, host to device CM_SYNC_ASYNC and device to host CM_SYNC_CALL,
 * come from the H200's rows (docs/design.md). */
enum { CM_SYNC_CALL, CM_SYNC_ASYNC, CM_SYNC_ASYNC_WAIT };
enum { CM_SYNC_HTOD, CM_SYNC_DTOH };
extern int cm_sync_copy_call[2];
uint64_t cm_gil_probe_clock(void);
void cm_gil_probe_note(int kind, uint64_t t0, uint64_t t1);

/* Nanoseconds now while the probe is on, else 0 (nothing to note). */
static inline uint64_t
cm_gil_probe_now(void)
{
    return __atomic_load_n(&cm_gil_probe_on, __ATOMIC_RELAXED)
               ? cm_gil_probe_clock()
               : 0;
}

/* Py_BEGIN/END_ALLOW_THREADS around driver calls, counted as above. */
#define CM_DRIVER_BEGIN_NOGIL                                          \
    {                                                                  \
        int cm_epoch_ = cm_driver_call_begin();                        \
        uint64_t cm_probe0_ = cm_gil_probe_now();                      \
        uint64_t cm_probe1_;                                           \
        Py_BEGIN_ALLOW_THREADS
#define CM_DRIVER_END_NOGIL                                            \
        cm_probe1_ = cm_probe0_ ? cm_gil_probe_clock() : 0;            \
        Py_END_ALLOW_THREADS                                           \
        if (cm_probe0_) {                                              \
            cm_gil_probe_note(CM_PROBE_NOGIL, cm_probe0_, cm_probe1_); \
        }                                                              \
        cm_driver_call_end(cm_epoch_);                                 \
    }

/* The same with the GIL released around the call; err gets 0 or -1. */
#define CM_CU_NOGIL(err, fn, args)                                     \
    do {                                                               \
        CUresult cm_rc_;                                               \
        CM_DRIVER_BEGIN_NOGIL                                          \
        cm_rc_ = CM_CU_CALL_(fn, args);                                \
        CM_DRIVER_END_NOGIL                                            \
        (err) = cm_cu_check(cm_rc_, "cu" #fn);                         \
    } while (0)

/* Python host callbacks (Stream.add_callback) enqueued and not yet
 * returned, in every context (atomic).  The driver runs a host callback
 * on a thread of its own that holds the driver's lock, and the callback
 * waits there for the GIL; a thread that holds the GIL and enters the
 * driver meanwhile waits for that lock: neither moves again.  So while
 * any is in flight, CM_CU and CM_CU_RAW release the GIL around the call
 * when the calling thread holds it (counted as in CM_DRIVER_BEGIN_NOGIL)
 * and holds no cudamem mutex (cm_mu_depth: taking the GIL back while
 * holding one would wait for a thread that holds the GIL and waits for
 * the mutex).  With none in flight, the cost is one atomic load.  The
 * arguments of such a call are evaluated with the GIL released: they
 * must not touch Python objects. */
extern long cm_pycb_live;
extern _Thread_local int cm_mu_depth;

/* The GIL released as one counted driver call: what cm_gil_drop saved,
 * for cm_gil_take (ts is NULL when nothing was dropped). */
typedef struct {
    PyThreadState *ts;
    int epoch;
    uint64_t probe;       /* cm_gil_probe_now() at the drop */
} cm_gil_saved;

/* The save of the call in flight on this thread (CM_GIL_YIELD). */
extern _Thread_local cm_gil_saved cm_yield_saved;

static inline void
cm_gil_drop(cm_gil_saved *s)
{
    s->epoch = cm_driver_call_begin();
    s->probe = cm_gil_probe_now();
    s->ts = PyEval_SaveThread();
}

static inline void
cm_gil_take(cm_gil_saved *s)
{
    if (s->ts != NULL) {
        uint64_t t1 = s->probe ? cm_gil_probe_clock() : 0;

        PyEval_RestoreThread(s->ts);
        if (s->probe) {
            cm_gil_probe_note(CM_PROBE_DROP, s->probe, t1);
        }
        cm_driver_call_end(s->epoch);
        s->ts = NULL;
    }
}

static inline int
cm_gil_yield_needed(void)
{
    return __atomic_load_n(&cm_pycb_live, __ATOMIC_ACQUIRE) > 0
           && cm_mu_depth == 0 && PyGILState_Check();
}

static inline int
cm_gil_yield_begin(void)
{
    cm_gil_drop(&cm_yield_saved);
    return 0;
}

static inline CUresult
cm_gil_yield_end(CUresult rc)
{
    cm_gil_take(&cm_yield_saved);
    return rc;
}

/* A cudamem mutex: taken and given back through these, so that
 * cm_mu_depth says whether the thread holds one. */
static inline void
cm_mu_lock(pthread_mutex_t *m)
{
    pthread_mutex_lock(m);
    cm_mu_depth++;
}

static inline void
cm_mu_unlock(pthread_mutex_t *m)
{
    cm_mu_depth--;
    pthread_mutex_unlock(m);
}

/* Every driver call goes through here.  In the child of a fork() after
 * the driver was initialised none reaches the driver: the parent's
 * handles mean nothing there, and a lock of the driver's that another
 * parent thread held at the fork would never be given back.  The call
 * answers CUDA_ERROR_NOT_INITIALIZED, which cm_raise_cu turns into
 * numba's "CUDA initialized before forking". */
#define CM_CU_CALL_(fn, args)                                          \
    (cm_forked ? CUDA_ERROR_NOT_INITIALIZED                            \
     : !CM_CU_FREE_OF_CTX(fn) && cm_ctx_dying_refused()                \
         ? CUDA_ERROR_CONTEXT_IS_DESTROYED                             \
     : cm_cu.fn ? cm_cu.fn args : cm_cu_missing)

/* The entry points that use no handle of a context (devices, the
 * thread's context stack, primary-context bookkeeping, pointer queries,
 * error names): CM_CU_FREE_OF_CTX(fn) is 1 for them, 0 for the others,
 * at compile time. */
#define CM_FREE_OF_CTX_GetErrorName ~, 1
#define CM_FREE_OF_CTX_GetErrorString ~, 1
#define CM_FREE_OF_CTX_Init ~, 1
#define CM_FREE_OF_CTX_DriverGetVersion ~, 1
#define CM_FREE_OF_CTX_DeviceGet ~, 1
#define CM_FREE_OF_CTX_DeviceGetCount ~, 1
#define CM_FREE_OF_CTX_DeviceGetName ~, 1
#define CM_FREE_OF_CTX_DeviceGetAttribute ~, 1
#define CM_FREE_OF_CTX_DeviceTotalMem ~, 1
#define CM_FREE_OF_CTX_DeviceGetUuid ~, 1
#define CM_FREE_OF_CTX_DeviceGetPCIBusId ~, 1
#define CM_FREE_OF_CTX_DeviceCanAccessPeer ~, 1
#define CM_FREE_OF_CTX_DevicePrimaryCtxRetain ~, 1
#define CM_FREE_OF_CTX_DevicePrimaryCtxRelease ~, 1
#define CM_FREE_OF_CTX_DevicePrimaryCtxReset ~, 1
#define CM_FREE_OF_CTX_DevicePrimaryCtxGetState ~, 1
#define CM_FREE_OF_CTX_CtxGetCurrent ~, 1
#define CM_FREE_OF_CTX_CtxSetCurrent ~, 1
#define CM_FREE_OF_CTX_CtxPushCurrent ~, 1
#define CM_FREE_OF_CTX_CtxPopCurrent ~, 1
#define CM_FREE_OF_CTX_CtxGetDevice ~, 1
#define CM_FREE_OF_CTX_PointerGetAttribute ~, 1
#define CM_FREE_OF_CTX_PointerGetAttributes ~, 1
#define CM_FREE_OF_CTX_ProfilerStart ~, 1
#define CM_FREE_OF_CTX_ProfilerStop ~, 1
#define CM_SECOND_(a, b, ...) b
#define CM_PROBE_(...) CM_SECOND_(__VA_ARGS__, 0, ~)
#define CM_CU_FREE_OF_CTX(fn) CM_PROBE_(CM_FREE_OF_CTX_##fn)

/* A context that a close() or reset marked dead and has not yet
 * destroyed: counted calls begun before the mark are waited for (the
 * counts above) and go on; any other call must not reach the driver
 * with the context current, whatever the caller checked before it last
 * let go of the GIL: it answers CUDA_ERROR_CONTEXT_IS_DESTROYED.
 * cm_ctx_dying_n counts such contexts (atomic); set (before the epoch
 * moves on) and cleared with the GIL held by the thread that closes,
 * whose own calls go on.  Driver.c. */
extern int cm_ctx_dying_n;
void cm_ctx_dying_set(int device, CUcontext handle);
void cm_ctx_dying_clear(int device);
/* 1 if the calling thread's current context is dying and the thread is
 * not the one destroying it.  Reads no Python state (any thread). */
int cm_ctx_dying_check(void);

static inline int
cm_ctx_dying_refused(void)
{
    return __atomic_load_n(&cm_ctx_dying_n, __ATOMIC_SEQ_CST) != 0
           && cm_ctx_dying_check();
}

/* call, a CUresult expression that enters the driver, with the GIL
 * released around it while Python callbacks are in flight. */
#define CM_GIL_YIELD(call)                                             \
    (cm_gil_yield_needed()                                             \
     ? (cm_gil_yield_begin(), cm_gil_yield_end(call))                  \
     : (call))

/* The raw call, for code that handles the CUresult itself. */
#define CM_CU_RAW(fn, args) CM_GIL_YIELD(CM_CU_CALL_(fn, args))

/* The raw call with the GIL kept whatever is in flight, for code that
 * holds pointers into state the GIL guards across the call; such code
 * makes no driver call while cm_gil_yield_needed() (see its users). */
#define CM_CU_RAW_HELD(fn, args) CM_CU_CALL_(fn, args)

/* Call cu<fn>(args...) and check it; 0 or -1 with an exception set.
 * A missing entry point stays NULL and fails here, not at import. */
#define CM_CU(fn, args) cm_cu_check(CM_CU_RAW(fn, args), "cu" #fn)

/* Set once the table is filled and cuInit succeeded (acquire load). */
extern int cm_driver_ready_flag;
/* Set in the child of a fork() after the driver was initialised. */
extern volatile int cm_forked;

/* Add fn to what the child of a fork() runs, after cm_forked is set:
 * a layer's own reset (its locks made fresh, its counts of other
 * threads' work dropped).  fn may not call the driver or the Python
 * API.  0, or -1 with an exception set. */
int cm_atfork_child_add(void (*fn)(void));
/* Add a process-wide mutex of a layer's to those the child makes fresh
 * (before the handlers of cm_atfork_child_add run).  0, or -1 with an
 * exception set. */
int cm_atfork_mutex_add(pthread_mutex_t *m);
/* For the tests: whether every such mutex can be taken now (1/0); and
 * all of them taken (on: 1) or given back (0) by the calling thread. */
int cm_atfork_mutexes_free(void);
void cm_atfork_mutexes_pretend(int on);

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
    CM_REL_IPC_POOL,      /* an imported pool allocation (ipc.c's record)
                           * let go: cuMemFree once unused */
    CM_REL_POOL_SYNC,     /* a pool block whose streams could not be
                           * recorded (released on a driver callback
                           * thread): the flush waits for the context,
                           * then the block is free for any stream */
    CM_REL_ASYNC_SYNC,    /* the same for the async manager: the flush
                           * waits for the context, then cuMemFreeAsync
                           * on the default stream */
    CM_REL_IPC_VMM        /* imported pool pages (ipcvmm.c's record) let
                           * go: unmapped, released once unused */
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
    /* Give ctx (alive; it need not be current) the manager's state; 0,
     * or -1 with an exception. */
    int (*create)(cm_context *ctx);
    /* Give everything the state holds back to the driver (the context
     * is being closed or reset; it is still alive).  Never raises. */
    void (*destroy)(cm_context *ctx);
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
     * No exception is set. */
    CUresult (*release)(cm_context *ctx, int kind, uintptr_t handle,
                        size_t size, CUstream stream);
    /* Before the release of an allocation (handle, allocated for own)
     * that work queued by cudamem also used on the n streams (ctx
     * current, GIL held): order the release after that work.  *on (own
     * on entry): the stream the release goes to.  Not CUDA_SUCCESS:
     * release with rel_sync.  Ordered managers only. */
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
};

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
/* driver/retcheck.c: the return check of the debug build              */
/* ------------------------------------------------------------------ */

/*
 * With CUDAMEM_DEBUG=1 (CM_RETCHECK defined), every function Python can
 * call is wrapped in a check that it returns NULL exactly when it has set
 * an exception (docs/design.md#return-check); the normal build has none
 * of it and the macros below cost nothing.
 */
#ifdef CM_RETCHECK
/* Wrap every function of the module's tables and of the types it made
 * (module exec, last).  0, or -1 with RuntimeError. */
int cm_retcheck_install(PyObject *mod);
/* Wrap def in place: a PyMethodDef that C turns into a function object
 * itself (PyCFunction_NewEx), named owner.name.  0, or -1. */
int cm_retcheck_def(PyMethodDef *def, const char *owner);
/* fn, stored as an instance's vectorcall, wrapped (the same trampoline
 * for the same fn). */
vectorcallfunc cm_retcheck_vectorcall(vectorcallfunc fn, const char *name);
#define CM_RETCHECK_VECTORCALL(fn, name) cm_retcheck_vectorcall((fn), (name))
#else
#define CM_RETCHECK_VECTORCALL(fn, name) (fn)
#endif

#endif /* CM_H */

