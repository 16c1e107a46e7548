/* SPDX-License-Identifier: MIT */
/*
 * module.c: the extension module cudamem._core.
 *
 * Owns the module state (cm_st): the exception classes fetched from
 * cudamem._errors, the interned strings, and the types that the concept
 * files create in their init functions, which exec calls in dependency
 * order.  One interpreter per process: exec refuses to run twice.
 */
#define CM_MODULE_C
#include "runtime/runtime.h"

cm_state *cm_st;

static int
cm_module_traverse(PyObject *mod, visitproc visit, void *arg)
{
    cm_state *st = PyModule_GetState(mod);

    if (st == NULL) {
        return 0;
    }
    Py_VISIT(st->Device_type);
    Py_VISIT(st->Context_type);
    Py_VISIT(st->Mem_type);
    Py_VISIT(st->Pending_type);
    Py_VISIT(st->DeviceNDArrayBase_type);
    Py_VISIT(st->DeviceNDArray_type);
    Py_VISIT(st->DeviceRecord_type);
    Py_VISIT(st->IpcMemory_type);
    Py_VISIT(st->IpcHandleBase_type);
    Py_VISIT(st->IpcArrayHandleBase_type);
    Py_VISIT(st->IpcHandle);
    Py_VISIT(st->IpcArrayHandle);
    Py_VISIT(st->IpcRawHandle);
    Py_VISIT(st->ipc_export_array);
    Py_VISIT(st->MemoryPointer);
    Py_VISIT(st->IpcPointer);
    Py_VISIT(st->HostMem_type);
    Py_VISIT(st->HostRegistration_type);
    Py_VISIT(st->MappedNDArray);
    Py_VISIT(st->ManagedNDArray);
    Py_VISIT(st->config);
    Py_VISIT(st->Stream_type);
    Py_VISIT(st->Event_type);
    Py_VISIT(st->Module_type);
    Py_VISIT(st->Kernel_type);
    Py_VISIT(st->Launcher_type);
    Py_VISIT(st->CompileError);
    Py_VISIT(st->CudaSupportError);
    Py_VISIT(st->CudaDriverError);
    Py_VISIT(st->CudaAPIError);
    Py_VISIT(st->CudaOutOfMemoryError);
    Py_VISIT(st->MemoryInfo);
    return 0;
}

static int
cm_module_clear(PyObject *mod)
{
    cm_state *st = PyModule_GetState(mod);

    if (st == NULL) {
        return 0;
    }
    Py_CLEAR(st->Device_type);
    Py_CLEAR(st->Context_type);
    Py_CLEAR(st->Mem_type);
    Py_CLEAR(st->Pending_type);
    Py_CLEAR(st->DeviceNDArrayBase_type);
    Py_CLEAR(st->DeviceNDArray_type);
    Py_CLEAR(st->DeviceRecord_type);
    Py_CLEAR(st->IpcMemory_type);
    Py_CLEAR(st->IpcHandleBase_type);
    Py_CLEAR(st->IpcArrayHandleBase_type);
    Py_CLEAR(st->IpcHandle);
    Py_CLEAR(st->IpcArrayHandle);
    Py_CLEAR(st->IpcRawHandle);
    Py_CLEAR(st->ipc_export_array);
    Py_CLEAR(st->MemoryPointer);
    Py_CLEAR(st->IpcPointer);
    Py_CLEAR(st->HostMem_type);
    Py_CLEAR(st->HostRegistration_type);
    Py_CLEAR(st->MappedNDArray);
    Py_CLEAR(st->ManagedNDArray);
    Py_CLEAR(st->config);
    Py_CLEAR(st->Stream_type);
    Py_CLEAR(st->Event_type);
    Py_CLEAR(st->Module_type);
    Py_CLEAR(st->Kernel_type);
    Py_CLEAR(st->Launcher_type);
    Py_CLEAR(st->CompileError);
    Py_CLEAR(st->CudaSupportError);
    Py_CLEAR(st->CudaDriverError);
    Py_CLEAR(st->CudaAPIError);
    Py_CLEAR(st->CudaOutOfMemoryError);
    Py_CLEAR(st->MemoryInfo);
    Py_CLEAR(st->str_shape);
    Py_CLEAR(st->str_strides);
    Py_CLEAR(st->str_typestr);
    Py_CLEAR(st->str_data);
    Py_CLEAR(st->str_version);
    Py_CLEAR(st->str_stream);
    Py_CLEAR(st->str_descr);
    Py_CLEAR(st->str_mask);
    Py_CLEAR(st->str_cai);
    return 0;
}

static void
cm_module_free(void *mod)
{
    cm_module_clear((PyObject *)mod);
    cm_st = NULL;
}

/* A new reference to cudamem.<modname>.<attr>. */
static PyObject *
cm_import_attr(const char *modname, const char *attr)
{
    PyObject *m = PyImport_ImportModule(modname);
    PyObject *o;

    if (m == NULL) {
        return NULL;
    }
    o = PyObject_GetAttrString(m, attr);
    Py_DECREF(m);
    return o;
}

static int
cm_intern(PyObject **slot, const char *s)
{
    *slot = PyUnicode_InternFromString(s);
    return *slot == NULL ? -1 : 0;
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
    if (PyArray_ImportNumPyAPI() < 0) {
        return -1;
    }
    if ((st->CudaSupportError = cm_import_attr("cudamem._errors",
                                               "CudaSupportError")) == NULL
        || (st->CudaDriverError = cm_import_attr("cudamem._errors",
                                                 "CudaDriverError")) == NULL
        || (st->CudaAPIError = cm_import_attr("cudamem._errors",
                                              "CudaAPIError")) == NULL
        || (st->CudaOutOfMemoryError = cm_import_attr(
                "cudamem._errors", "CudaOutOfMemoryError")) == NULL
        || (st->MemoryInfo = cm_import_attr("cudamem._errors",
                                            "MemoryInfo")) == NULL) {
        return -1;
    }
    if (cm_intern(&st->str_shape, "shape") < 0
        || cm_intern(&st->str_strides, "strides") < 0
        || cm_intern(&st->str_typestr, "typestr") < 0
        || cm_intern(&st->str_data, "data") < 0
        || cm_intern(&st->str_version, "version") < 0
        || cm_intern(&st->str_stream, "stream") < 0
        || cm_intern(&st->str_descr, "descr") < 0
        || cm_intern(&st->str_mask, "mask") < 0) {
        return -1;
    }
    cm_st = st;
    if (cm_driver_init(mod, st) < 0 || cm_context_init(mod, st) < 0
        || cm_memory_init(mod, st) < 0 || cm_pool_init(mod, st) < 0
        || cm_stream_init(mod, st) < 0 || cm_kernels_init(mod, st) < 0
        || cm_devicearray_init(mod, st) < 0 || cm_dlpack_init(mod, st) < 0
        || cm_hostmem_init(mod, st) < 0 || cm_ipc_init(mod, st) < 0
        || cm_staging_init(mod, st) < 0 || cm_history_init(mod, st) < 0
        || cm_kernel_init(mod, st) < 0 || cm_types_patchable(st) < 0) {
        cm_st = NULL;
        return -1;
    }
    if (cm_interop_init(mod, st) < 0) {
        cm_st = NULL;
        return -1;
    }
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
