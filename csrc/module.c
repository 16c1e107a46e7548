/* SPDX-License-Identifier: MIT */
/*
 * module.c: the extension module cudamem._core.
 *
 * Owns the module state (the pointer to it, cm_st, is in the lowest
 * layer, driver/state.c): the interned strings, the types that
 * the concept files create in their init functions (which exec calls in
 * dependency order), and what the cudamem package registers at import
 * through _register (its exception classes, NumPy subclasses, managers
 * and helpers): C never imports the package, so the package can import
 * _core at any point of its own import without a cycle.  One
 * interpreter per process: exec refuses to run twice.
 */
#include "features/features.h"

/* Visit or clear every object field of the state, in one list so that
 * traverse and clear cannot drift apart; what holds objects of cudamem's
 * types comes first, so that their deallocs see the state whole.
 * Interned strings and small constants cannot be in a cycle: free drops
 * them, traverse and clear skip them. */
#define CM_STATE_OBJECTS(X)                                            \
    X(torch_error) X(notifiers) X(get_running_loop)                    \
    X(plugin_counts) X(plugin_freed)                                   \
    X(Device_type) X(Context_type) X(Mem_type) X(Pending_type)         \
    X(DeviceNDArrayBase_type) X(DeviceNDArray_type)                    \
    X(DeviceRecord_type) X(IpcMemory_type) X(IpcHandleBase_type)       \
    X(IpcArrayHandleBase_type) X(HostMem_type)                         \
    X(HostRegistration_type) X(Stream_type) X(Event_type)              \
    X(Module_type) X(Kernel_type) X(Launcher_type) X(autosync_type)    \
    X(notifier_type) X(client_type)                                    \
    X(CudaSupportError) X(CudaDriverError) X(CudaAPIError)             \
    X(CudaOutOfMemoryError) X(CompileError) X(MemoryInfo)              \
    X(StreamCaptureError) X(Graph) X(GraphPool)                        \
    X(manager_for) X(manager_kind) X(DefaultMemoryManager)             \
    X(PoolMemoryManager) X(AsyncMemoryManager) X(MemoryPointer)        \
    X(IpcHandle) X(IpcArrayHandle) X(IpcRawHandle)                     \
    X(ipc_export_array) X(IpcPointer) X(MappedNDArray)                 \
    X(ManagedNDArray) X(config) X(api_split) X(global_view)          \
    X(index_getitem) X(index_setitem)

#define CM_STATE_CONSTANTS(X)                                          \
    X(zero) X(three) X(dl_max_version) X(dl_kwn_versioned)             \
    X(dl_kwn_legacy)                                                   \
    X(str_shape) X(str_strides) X(str_typestr) X(str_data)             \
    X(str_version) X(str_stream) X(str_descr) X(str_mask) X(str_cai)   \
    X(str_cuda_memory) X(str_sync_cfg) X(str_C) X(str_dtype)           \
    X(str_dlpack) X(str_dlpack_device) X(str_cuda_stream)              \
    X(str_callback) X(str_arg) X(str_timing) X(str_ptr)                \
    X(str_evtstart) X(str_evtend) X(str_done) X(str_set_result)        \
    X(str_set_exception) X(str_create_future) X(str_await)             \
    X(str_drain)

#define CM_VISIT_FIELD(f) Py_VISIT(st->f);
#define CM_CLEAR_FIELD(f) Py_CLEAR(st->f);

static int
cm_module_traverse(PyObject *mod, visitproc visit, void *arg)
{
    cm_state *st = PyModule_GetState(mod);

    if (st == NULL) {
        return 0;
    }
    CM_STATE_OBJECTS(CM_VISIT_FIELD)
    return 0;
}

/* Drop what may be in a cycle.  The interned strings and constants stay
 * until free: code that runs between a clear and the free (a dealloc
 * late in finalisation) may still use them. */
static int
cm_module_clear(PyObject *mod)
{
    cm_state *st = PyModule_GetState(mod);

    if (st == NULL) {
        return 0;
    }
    CM_STATE_OBJECTS(CM_CLEAR_FIELD)
    return 0;
}

static void
cm_module_free(void *mod)
{
    cm_state *st = PyModule_GetState((PyObject *)mod);
    size_t i;

    cm_module_clear((PyObject *)mod);
    cm_st = NULL;
    if (st == NULL) {
        return;
    }
    CM_STATE_CONSTANTS(CM_CLEAR_FIELD)
    for (i = 0; i < 3; i++) {
        Py_CLEAR(st->str_pci[i]);
    }
    for (i = 0; i < CM_ARRAY_KW_N; i++) {
        Py_CLEAR(st->kw[i]);
    }
    for (i = 0; i < CM_HOST_KW_N; i++) {
        Py_CLEAR(st->hm_kw[i]);
    }
    for (i = 0; i < CM_DLPACK_KW_N; i++) {
        Py_CLEAR(st->dl_kw[i]);
    }
}

/* ------------------------------------------------------------------ */
/* What the package registers                                          */
/* ------------------------------------------------------------------ */

/* How _register checks a value before storing it. */
enum {
    CM_REG_ANY,           /* any object (a module) */
    CM_REG_CALLABLE,      /* a callable */
    CM_REG_CLASS,         /* a class */
    CM_REG_EXCEPTION,     /* an exception class */
    CM_REG_NDARRAY,       /* a subclass of numpy.ndarray */
    CM_REG_IPC_MEMORY,    /* a subclass of IpcMemory */
    CM_REG_IPC_HANDLE,    /* a subclass of _IpcHandleBase */
    CM_REG_IPC_ARRAY      /* a subclass of _IpcArrayHandleBase */
};

/* One keyword of _register: the state field it fills and its check. */
typedef struct {
    const char *name;
    size_t offset;
    int check;
} cm_reg_slot;

#define CM_REG_SLOT(field, check)                                      \
    {#field, offsetof(cm_state, field), (check)}

static const cm_reg_slot cm_reg_slots[] = {
    CM_REG_SLOT(CudaSupportError, CM_REG_EXCEPTION),
    CM_REG_SLOT(CudaDriverError, CM_REG_EXCEPTION),
    CM_REG_SLOT(CudaAPIError, CM_REG_EXCEPTION),
    CM_REG_SLOT(CudaOutOfMemoryError, CM_REG_EXCEPTION),
    CM_REG_SLOT(CompileError, CM_REG_EXCEPTION),
    CM_REG_SLOT(MemoryInfo, CM_REG_CLASS),
    CM_REG_SLOT(StreamCaptureError, CM_REG_EXCEPTION),
    CM_REG_SLOT(Graph, CM_REG_CLASS),
    CM_REG_SLOT(GraphPool, CM_REG_CLASS),
    CM_REG_SLOT(manager_for, CM_REG_CALLABLE),
    CM_REG_SLOT(manager_kind, CM_REG_CALLABLE),
    CM_REG_SLOT(DefaultMemoryManager, CM_REG_CLASS),
    CM_REG_SLOT(PoolMemoryManager, CM_REG_CLASS),
    CM_REG_SLOT(AsyncMemoryManager, CM_REG_CLASS),
    CM_REG_SLOT(MemoryPointer, CM_REG_CLASS),
    CM_REG_SLOT(IpcHandle, CM_REG_IPC_HANDLE),
    CM_REG_SLOT(IpcArrayHandle, CM_REG_IPC_ARRAY),
    CM_REG_SLOT(IpcRawHandle, CM_REG_CLASS),
    CM_REG_SLOT(ipc_export_array, CM_REG_CALLABLE),
    CM_REG_SLOT(IpcPointer, CM_REG_IPC_MEMORY),
    CM_REG_SLOT(MappedNDArray, CM_REG_NDARRAY),
    CM_REG_SLOT(ManagedNDArray, CM_REG_NDARRAY),
    CM_REG_SLOT(config, CM_REG_ANY),
    CM_REG_SLOT(api_split, CM_REG_CALLABLE),
    CM_REG_SLOT(global_view, CM_REG_CALLABLE),
    CM_REG_SLOT(index_getitem, CM_REG_CALLABLE),
    CM_REG_SLOT(index_setitem, CM_REG_CALLABLE),
};

#define CM_REG_N (sizeof(cm_reg_slots) / sizeof(cm_reg_slots[0]))

/* Whether v passes check; 0, or -1 with TypeError naming name. */
static int
cm_reg_check(cm_state *st, const char *name, int check, PyObject *v)
{
    PyTypeObject *base = NULL;
    const char *what = NULL;

    switch (check) {
    case CM_REG_ANY:
        return 0;
    case CM_REG_CALLABLE:
        if (PyCallable_Check(v)) {
            return 0;
        }
        what = "a callable";
        break;
    case CM_REG_CLASS:
        if (PyType_Check(v)) {
            return 0;
        }
        what = "a class";
        break;
    case CM_REG_EXCEPTION:
        if (PyExceptionClass_Check(v)) {
            return 0;
        }
        what = "an exception class";
        break;
    case CM_REG_NDARRAY:
        base = &PyArray_Type;
        what = "a subclass of numpy.ndarray";
        break;
    case CM_REG_IPC_MEMORY:
        base = st->IpcMemory_type;
        what = "a subclass of cudamem._core.IpcMemory";
        break;
    case CM_REG_IPC_HANDLE:
        base = st->IpcHandleBase_type;
        what = "a subclass of cudamem._core._IpcHandleBase";
        break;
    case CM_REG_IPC_ARRAY:
        base = st->IpcArrayHandleBase_type;
        what = "a subclass of cudamem._core._IpcArrayHandleBase";
        break;
    }
    if (base != NULL && PyType_Check(v)
        && PyType_IsSubtype((PyTypeObject *)v, base)) {
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "_register(): %s must be %s, not %R",
                 name, what, v);
    return -1;
}

PyDoc_STRVAR(cm_register_doc,
"_register($module, /, **objects)\n--\n\n"
"Hand C the Python classes and helpers it uses (called by the cudamem\n"
"package at import; C never imports the package).  Each keyword names\n"
"one; all are checked before any is stored.  Unknown names raise\n"
"TypeError.");

static PyObject *
cm_register(PyObject *mod, PyObject *args, PyObject *kw)
{
    cm_state *st = PyModule_GetState(mod);
    PyObject *key;
    PyObject *value;
    Py_ssize_t pos = 0;
    size_t i;

    if (PyTuple_GET_SIZE(args) != 0) {
        PyErr_SetString(PyExc_TypeError,
                        "_register() takes keyword arguments only");
        return NULL;
    }
    /* Check everything first, so that a failed call stores nothing. */
    while (kw != NULL && PyDict_Next(kw, &pos, &key, &value)) {
        for (i = 0; i < CM_REG_N; i++) {
            if (PyUnicode_CompareWithASCIIString(key, cm_reg_slots[i].name)
                == 0) {
                break;
            }
        }
        if (i == CM_REG_N) {
            PyErr_Format(PyExc_TypeError, "_register() got an unexpected "
                         "keyword argument '%U'", key);
            return NULL;
        }
        if (cm_reg_check(st, cm_reg_slots[i].name, cm_reg_slots[i].check,
                         value) < 0) {
            return NULL;
        }
    }
    pos = 0;
    while (kw != NULL && PyDict_Next(kw, &pos, &key, &value)) {
        for (i = 0; i < CM_REG_N; i++) {
            if (PyUnicode_CompareWithASCIIString(key, cm_reg_slots[i].name)
                == 0) {
                PyObject **slot = (PyObject **)((char *)st
                                                + cm_reg_slots[i].offset);

                Py_XSETREF(*slot, Py_NewRef(value));
                break;
            }
        }
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cm_fork_state_doc,
"_fork_state($module, /)\n--\n\n"
"For the tests: what the child of a fork() must have made fresh, as a\n"
"dict: forked (the driver refuses), calls_in_flight (driver calls made\n"
"with the GIL released), callbacks_in_flight, resetting (devices being\n"
"closed) and locks_free (every process-wide mutex can be taken).");

static PyObject *
cm_fork_state_fn(PyObject *mod, PyObject *unused)
{
    PyObject *d = cm_runtime_fork_state();
    PyObject *free_;

    (void)mod;
    (void)unused;
    if (d == NULL) {
        return NULL;
    }
    free_ = cm_atfork_mutexes_free() ? Py_True : Py_False;
    if (PyDict_SetItemString(d, "locks_free", free_) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

PyDoc_STRVAR(cm_fork_state_debug_doc,
"_fork_state_debug($module, on, /)\n--\n\n"
"For the tests, around a fork() only: on=1 makes this process look as if\n"
"other threads were busy (a driver call with the GIL released, a reset\n"
"of device 0, a Python callback in flight, every process-wide mutex\n"
"held); on=0 takes that back.  The calling thread must use no device\n"
"in between.");

static PyObject *
cm_fork_state_debug_fn(PyObject *mod, PyObject *arg)
{
    static int on_now;
    int on = PyObject_IsTrue(arg);

    (void)mod;
    if (on < 0) {
        return NULL;
    }
    if (on == on_now) {
        PyErr_SetString(PyExc_ValueError,
                        on ? "already on" : "not on");
        return NULL;
    }
    on_now = on;
    cm_runtime_fork_pretend(on);
    cm_atfork_mutexes_pretend(on);
    Py_RETURN_NONE;
}

static PyMethodDef cm_module_functions[] = {
    {"_register", (PyCFunction)(void (*)(void))cm_register,
     METH_VARARGS | METH_KEYWORDS, cm_register_doc},
    {"_fork_state", cm_fork_state_fn, METH_NOARGS, cm_fork_state_doc},
    {"_fork_state_debug", cm_fork_state_debug_fn, METH_O,
     cm_fork_state_debug_doc},
    {NULL, NULL, 0, NULL},
};

/* ------------------------------------------------------------------ */
/* Init                                                                */
/* ------------------------------------------------------------------ */

static int
cm_intern(PyObject **slot, const char *s)
{
    *slot = PyUnicode_InternFromString(s);
    return *slot == NULL ? -1 : 0;
}

/* The interned strings and constants of the state that the layers share;
 * each layer's init makes its keyword tables. */
static int
cm_module_strings(cm_state *st)
{
    static const struct {
        size_t offset;
        const char *text;
    } strs[] = {
        {offsetof(cm_state, str_shape), "shape"},
        {offsetof(cm_state, str_strides), "strides"},
        {offsetof(cm_state, str_typestr), "typestr"},
        {offsetof(cm_state, str_data), "data"},
        {offsetof(cm_state, str_version), "version"},
        {offsetof(cm_state, str_stream), "stream"},
        {offsetof(cm_state, str_descr), "descr"},
        {offsetof(cm_state, str_mask), "mask"},
        {offsetof(cm_state, str_cai), "__cuda_array_interface__"},
        {offsetof(cm_state, str_cuda_memory), "__cuda_memory__"},
        {offsetof(cm_state, str_sync_cfg), "CUDA_ARRAY_INTERFACE_SYNC"},
        {offsetof(cm_state, str_C), "C"},
        {offsetof(cm_state, str_dtype), "dtype"},
        {offsetof(cm_state, str_dlpack), "__dlpack__"},
        {offsetof(cm_state, str_dlpack_device), "__dlpack_device__"},
        {offsetof(cm_state, str_cuda_stream), "__cuda_stream__"},
        {offsetof(cm_state, str_callback), "callback"},
        {offsetof(cm_state, str_arg), "arg"},
        {offsetof(cm_state, str_timing), "timing"},
        {offsetof(cm_state, str_ptr), "ptr"},
        {offsetof(cm_state, str_evtstart), "evtstart"},
        {offsetof(cm_state, str_evtend), "evtend"},
        {offsetof(cm_state, str_done), "done"},
        {offsetof(cm_state, str_set_result), "set_result"},
        {offsetof(cm_state, str_set_exception), "set_exception"},
        {offsetof(cm_state, str_create_future), "create_future"},
        {offsetof(cm_state, str_await), "__await__"},
        {offsetof(cm_state, str_drain), "_drain"},
    };
    size_t i;

    for (i = 0; i < sizeof(strs) / sizeof(strs[0]); i++) {
        if (cm_intern((PyObject **)((char *)st + strs[i].offset),
                      strs[i].text) < 0) {
            return -1;
        }
    }
    st->zero = PyLong_FromLong(0);
    st->three = PyLong_FromLong(3);
    if (st->zero == NULL || st->three == NULL) {
        return -1;
    }
    return 0;
}

static int
cm_module_exec(PyObject *mod)
{
    cm_state *st = PyModule_GetState(mod);

    if (cm_st != NULL) {
        PyErr_SetString(PyExc_ImportError,
                        "cudamem._core cannot be loaded twice in one "
                        "process (multiple interpreters are unsupported)");
        return -1;
    }
    if (cm_numpy_import() < 0) {
        return -1;
    }
    if (cm_module_strings(st) < 0
        || PyModule_AddFunctions(mod, cm_module_functions) < 0) {
        return -1;
    }
    cm_st = st;
    if (cm_driver_init(mod, st) < 0 || cm_context_init(mod, st) < 0
        || cm_memory_init(mod, st) < 0 || cm_limit_init(mod, st) < 0
        || cm_pool_init(mod, st) < 0
        || cm_stream_init(mod, st) < 0 || cm_kernels_init(mod, st) < 0
        || cm_gather_init(mod, st) < 0
        || cm_devicearray_init(mod, st) < 0 || cm_dlpack_init(mod, st) < 0
        || cm_hostmem_init(mod, st) < 0
        || cm_hostarray_init(mod, st) < 0 || cm_ipc_init(mod, st) < 0
        || cm_staging_init(mod, st) < 0 || cm_history_init(mod, st) < 0
        || cm_kernel_init(mod, st) < 0 || cm_types_patchable(st) < 0) {
        cm_st = NULL;
        return -1;
    }
    if (cm_interop_init(mod, st) < 0) {
        cm_st = NULL;
        return -1;
    }
#ifdef CM_RETCHECK
    /* Last: every table is in place. */
    if (cm_retcheck_install(mod) < 0) {
        cm_st = NULL;
        return -1;
    }
#endif
    return 0;
}

static PyModuleDef_Slot cm_module_slots[] = {
    {Py_mod_exec, cm_module_exec},
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
#endif
    {0, NULL},
};

PyDoc_STRVAR(cm_module_doc,
"cudamem._core: the C implementation of cudamem.  Use the cudamem "
"package, not this module.");

static struct PyModuleDef cm_module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "cudamem._core",
    .m_doc = cm_module_doc,
    .m_size = sizeof(cm_state),
    .m_slots = cm_module_slots,
    .m_traverse = cm_module_traverse,
    .m_clear = cm_module_clear,
    .m_free = cm_module_free,
};

PyMODINIT_FUNC
PyInit__core(void)
{
    return PyModuleDef_Init(&cm_module_def);
}
