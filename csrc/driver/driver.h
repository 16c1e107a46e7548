/* SPDX-License-Identifier: MIT */
/*
 * driver/driver.h: the driver layer, the ground floor of cudamem._core
 * (the driver folder's public header).  Every file sees it: each layer's
 * header includes the one of the layer below (context/context.h,
 * memory/memory.h, array/array.h, features/features.h).
 *
 * The driver folder owns:
 * - the Python and NumPy headers as every file includes them, with the
 *   shims for older Pythons;
 * - the module state (types, exception classes, interned strings) and
 *   what the cudamem package registers (state.c);
 * - the table of driver entry points (cm_cu, driver/cu_table.h), filled
 *   at run time either from libcuda.so.1 (driver.c) or from the CPU
 *   simulator (sim/), the backend choice, cuInit, and what the child of
 *   a fork() makes fresh (driver.c);
 * - how a call reaches the driver (driver/call.h): the checking macros
 *   that turn a CUresult into CudaAPIError, the count of calls made with
 *   the GIL released, the GIL's hand-over and cudamem's mutexes;
 * - NVRTC, loaded at run time, with its disk cache (nvrtc.c);
 * - the return check of the debug build (retcheck.c).
 *
 * Locks and the GIL: driver.c's cm_load_lock (a pthread mutex, through
 * cm_mu_lock) guards loading the backend, once; it is taken with the GIL
 * released and held across cuInit (the simulator's takes sim_lock
 * inside), and nothing under it touches Python.  The mutexes the layers
 * above hand to cm_atfork_mutex_add are only made fresh in a fork's child
 * here.  The macros of driver/call.h release the GIL around driver calls
 * (CM_DRIVER_BEGIN_NOGIL, CM_CU_NOGIL, CM_GIL_YIELD, cm_gil_drop), each
 * counted so that a close waits for it, and count the cudamem mutexes a
 * thread holds (cm_mu_lock); cm_nvrtc_compile_nogil runs without the GIL.
 * The module state is written with the GIL held; the counters change
 * with atomics or are thread-local.
 *
 * Multiple interpreters are unsupported (NumPy and the driver are per
 * process), so the module state is reached through one process-wide
 * pointer, cm_st (driver/state.c), set once in module exec.
 */
#ifndef CM_DRIVER_H
#define CM_DRIVER_H

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

#include "driver/call.h"

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
/* driver.c: loading, the backend, fork and the default stream        */
/* ------------------------------------------------------------------ */

/* The most devices cudamem keeps track of. */
#define CM_MAX_DEVICES 64

/* Set once the table is filled and cuInit succeeded (acquire load). */
extern int cm_driver_ready_flag;

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

cm_backend cm_driver_backend(void);
/* Whether CUDAMEM_SIMULATOR (or NUMBA_ENABLE_CUDASIM) asks for the
 * simulator. */
int cm_env_simulator(void);
/* Whether handle 0 means the per-thread default stream. */
int cm_driver_per_thread(void);

int cm_driver_init(PyObject *mod, cm_state *st);

/* ------------------------------------------------------------------ */
/* state.c: the state every layer shares                               */
/* ------------------------------------------------------------------ */

/* Import NumPy's C API (its table lives in state.c); module exec calls
 * it once, first.  0, or -1 with an exception. */
int cm_numpy_import(void);

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

#endif /* CM_DRIVER_H */
