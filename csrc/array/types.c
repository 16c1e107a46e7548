/* SPDX-License-Identifier: MIT */
/*
 * array/types.c: the type objects of the device arrays and their init.
 */
#include "array/devicearray.h"

#include <numpy/arrayscalars.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>


static PyGetSetDef cm_base_getset[] = {
    {"shape", cm_da_get_shape, NULL, "The shape, a tuple of ints.", NULL},
    {"strides", cm_da_get_strides, NULL, "The strides in bytes.", NULL},
    {"ndim", cm_da_get_ndim, NULL, "The number of dimensions.", NULL},
    {"size", cm_da_get_size, NULL, "The number of elements.", NULL},
    {"dtype", cm_da_get_dtype, NULL, "The numpy.dtype.", NULL},
    {"itemsize", cm_da_get_itemsize, NULL, "Bytes per element.", NULL},
    {"nbytes", cm_da_get_nbytes, NULL, "itemsize * size.", NULL},
    {"alloc_size", cm_da_get_alloc_size, NULL,
     "The byte span from the lowest to the highest element.", NULL},
    {"gpu_data", cm_da_get_gpu_data, NULL,
     "The memory object, as numba shows it: the owner of the memory when\n"
     "the array spans all of it, else a pointer to the bytes it spans\n"
     "(the owner's view(); a MemoryPointer owned by the foreign object\n"
     "for a CUDA Array Interface import); None when empty.", NULL},
    {"stream", cm_da_get_stream, cm_da_set_stream,
     "The bound stream: 0 or a stream object.", NULL},
    {"device_ctypes_pointer", cm_da_get_ctypes_ptr, NULL,
     "The device address as a ctypes value.", NULL},
    {"flags", cm_da_get_flags, NULL,
     "A new dict {'C_CONTIGUOUS': bool, 'F_CONTIGUOUS': bool}.", NULL},
    {"__cuda_array_interface__", cm_da_get_cai, NULL,
     "The CUDA Array Interface (version 3), a new dict each time.\n\n"
     "Notes: numba exports strides None for broadcast arrays and stream 0\n"
     "for the default stream; cudamem exports the real strides and 1\n"
     "(legacy) or 2 (per-thread).  Structured dtypes carry 'descr'.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(cm_da_as_cuda_arg_doc,
"as_cuda_arg($self, /)\n--\n\nThe gpu_data object.");

static PyMethodDef cm_base_methods[] = {
    {"copy_to_host", (PyCFunction)(void (*)(void))cm_da_copy_to_host,
     CM_FAST, cm_da_copy_to_host_doc},
    {"copy_to_device", (PyCFunction)(void (*)(void))cm_da_copy_to_device,
     CM_FAST, cm_da_copy_to_device_doc},
    {"bind", (PyCFunction)(void (*)(void))cm_da_bind, CM_FAST,
     cm_da_bind_doc},
    {"as_cuda_arg", cm_da_as_cuda_arg, METH_NOARGS, cm_da_as_cuda_arg_doc},
    {"__dlpack__", (PyCFunction)(void (*)(void))cm_dlpack_export, CM_FAST,
     cm_dlpack_export_doc},
    {"__dlpack_device__", cm_dlpack_device, METH_NOARGS,
     cm_dlpack_device_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef cm_da_members[] = {
    {"__weaklistoffset__", Py_T_PYSSIZET, offsetof(cm_da, weakreflist),
     Py_READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(cm_base_doc,
"What device arrays and device records share: layout attributes, the\n"
"copies and the CUDA Array Interface.\n\n"
"Notes\n-----\n"
"Unlike numba's, these arrays set neither __cuda_memory__ nor\n"
"__cuda_ndarray__: numba takes those to mean one of its own arrays and\n"
"reads its internals, so a numba kernel would refuse a cudamem array.\n"
"Without them numba kernels accept cudamem arrays directly, through\n"
"__cuda_array_interface__.  cudamem recognises its arrays by type\n"
"(to_device(d) is d), and still honours a truthy __cuda_memory__ on\n"
"other objects.");

static PyType_Slot cm_base_slots[] = {
    {Py_tp_doc, (void *)cm_base_doc},
    {Py_tp_dealloc, cm_da_dealloc},
    {Py_tp_traverse, cm_da_traverse},
    {Py_tp_clear, cm_da_clear},
    {Py_tp_getset, cm_base_getset},
    {Py_tp_methods, cm_base_methods},
    {Py_tp_members, cm_da_members},
    {0, NULL},
};

static PyType_Spec cm_base_spec = {
    .name = "cudamem.DeviceNDArrayBase",
    .basicsize = sizeof(cm_da),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE
             | Py_TPFLAGS_IMMUTABLETYPE
             | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = cm_base_slots,
};

PyDoc_STRVAR(cm_da_is_c_doc,
"is_c_contiguous($self, /)\n--\n\nWhether the array is C-contiguous.");
PyDoc_STRVAR(cm_da_is_f_doc,
"is_f_contiguous($self, /)\n--\n\nWhether the array is F-contiguous.");

PyDoc_STRVAR(cm_da_get_ipc_handle_doc,
"get_ipc_handle($self, /)\n--\n\n"
"An IpcArrayHandle for this array: picklable, opened in another process\n"
"with open() or a with block (see cudamem.IpcArrayHandle).");

/* get_ipc_handle: made by the IPC layer above (cm_array_up). */
static PyObject *
cm_da_get_ipc_handle(PyObject *self, PyObject *unused)
{
    return cm_array_up.ipc_get_handle(self, unused);
}

static PyMethodDef cm_da_methods[] = {
    {"getitem", (PyCFunction)(void (*)(void))cm_da_getitem, CM_FAST,
     cm_da_getitem_doc},
    {"setitem", (PyCFunction)(void (*)(void))cm_da_setitem, CM_FAST,
     cm_da_setitem_doc},
    {"reshape", (PyCFunction)(void (*)(void))cm_da_reshape, CM_FAST,
     cm_da_reshape_doc},
    {"ravel", (PyCFunction)(void (*)(void))cm_da_ravel, CM_FAST,
     cm_da_ravel_doc},
    {"view", cm_da_view_meth, METH_O, cm_da_view_doc},
    {"squeeze", (PyCFunction)(void (*)(void))cm_da_squeeze, CM_FAST,
     cm_da_squeeze_doc},
    {"split", (PyCFunction)(void (*)(void))cm_da_split, CM_FAST,
     cm_da_split_doc},
    {"transpose", (PyCFunction)(void (*)(void))cm_da_transpose, CM_FAST,
     cm_da_transpose_doc},
    {"is_c_contiguous", cm_da_is_c_contiguous, METH_NOARGS, cm_da_is_c_doc},
    {"is_f_contiguous", cm_da_is_f_contiguous, METH_NOARGS, cm_da_is_f_doc},
    {"__array__", (PyCFunction)(void (*)(void))cm_da_array, CM_FAST,
     cm_da_array_doc},
    {"get_ipc_handle", cm_da_get_ipc_handle, METH_NOARGS,
     cm_da_get_ipc_handle_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef cm_da_getset[] = {
    {"T", cm_da_get_T, NULL, "transpose()", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(cm_da_doc,
"DeviceNDArray(shape, strides, dtype, stream=0, gpu_data=None)\n--\n\n"
"An array in device memory.  Without gpu_data (and when not empty) the\n"
"byte span is allocated; with it, gpu_data's device_pointer is the\n"
"lowest byte of the span and gpu_data is kept alive.");

static PyType_Slot cm_da_slots[] = {
    {Py_tp_doc, (void *)cm_da_doc},
    {Py_tp_new, cm_da_new},
    {Py_tp_dealloc, cm_da_dealloc},
    {Py_tp_traverse, cm_da_traverse},
    {Py_tp_clear, cm_da_clear},
    {Py_tp_methods, cm_da_methods},
    {Py_tp_getset, cm_da_getset},
    {Py_mp_subscript, cm_da_subscript},
    {Py_mp_ass_subscript, cm_da_ass_subscript},
    {Py_mp_length, cm_da_length},
    {Py_sq_item, cm_da_sq_item},
    {0, NULL},
};

static PyType_Spec cm_da_spec = {
    .name = "cudamem.DeviceNDArray",
    .basicsize = sizeof(cm_da),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE
             | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = cm_da_slots,
};

static PyMethodDef cm_rec_methods[] = {
    {"getitem", (PyCFunction)(void (*)(void))cm_rec_getitem, CM_FAST,
     cm_rec_getitem_doc},
    {"setitem", (PyCFunction)(void (*)(void))cm_rec_setitem, CM_FAST,
     cm_rec_setitem_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(cm_rec_doc,
"DeviceRecord(dtype, stream=0, gpu_data=None)\n--\n\n"
"A structured scalar (0-d record) in device memory: new memory, or the\n"
"first ``dtype.itemsize`` bytes of ``gpu_data``.  Indexing by field\n"
"name reads a host scalar, a nested record view or a subarray view;\n"
"assignment writes the field.");

static PyType_Slot cm_rec_slots[] = {
    {Py_tp_doc, (void *)cm_rec_doc},
    {Py_tp_new, cm_rec_new},
    {Py_tp_dealloc, cm_da_dealloc},
    {Py_tp_traverse, cm_da_traverse},
    {Py_tp_clear, cm_da_clear},
    {Py_tp_methods, cm_rec_methods},
    {Py_mp_subscript, cm_rec_subscript},
    {Py_mp_ass_subscript, cm_rec_ass_subscript},
    {0, NULL},
};

static PyType_Spec cm_rec_spec = {
    .name = "cudamem.DeviceRecord",
    .basicsize = sizeof(cm_da),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC
             | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = cm_rec_slots,
};

static PyMethodDef cm_devicearray_functions[] = {
    {"device_array", (PyCFunction)(void (*)(void))cm_device_array, CM_FAST,
     cm_device_array_doc},
    {"device_array_like", (PyCFunction)(void (*)(void))cm_device_array_like,
     CM_FAST, cm_device_array_like_doc},
    {"to_device", (PyCFunction)(void (*)(void))cm_to_device, CM_FAST,
     cm_to_device_doc},
    {"is_cuda_array", cm_is_cuda_array, METH_O, cm_is_cuda_array_doc},
    {"as_cuda_array", (PyCFunction)(void (*)(void))cm_as_cuda_array,
     CM_FAST, cm_as_cuda_array_doc},
    {"from_cuda_array_interface",
     (PyCFunction)(void (*)(void))cm_from_cuda_array_interface, CM_FAST,
     cm_from_cai_doc},
    {NULL, NULL, 0, NULL},
};

PyTypeObject *
cm_make_type(PyObject *mod, PyType_Spec *spec, PyTypeObject *base)
{
    PyTypeObject *tp = (PyTypeObject *)PyType_FromModuleAndSpec(
        mod, spec, (PyObject *)base);

    if (tp == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(mod, strchr(spec->name, '.') + 1,
                              (PyObject *)tp) < 0) {
        Py_DECREF(tp);
        return NULL;
    }
    return tp;
}

int
cm_devicearray_init(PyObject *mod, cm_state *st)
{
    int i;

    /* What memory/ reaches of this layer (memory/memory.h). */
    cm_mem_up.devicearray_owner = cm_devicearray_owner;
    cm_mem_up.devicearray_new = cm_devicearray_new;
    for (i = 0; i < K_N_NAMES; i++) {
        cm_kw[i] = PyUnicode_InternFromString(cm_kw_text[i]);
        if (cm_kw[i] == NULL) {
            return -1;
        }
    }
    st->DeviceNDArrayBase_type = cm_make_type(mod, &cm_base_spec, NULL);
    if (st->DeviceNDArrayBase_type == NULL) {
        return -1;
    }
    /* numba's class attributes: code written for numba tests them
     * (is_device_memory).  numba-cuda's kernels type arguments through
     * the CUDA Array Interface, which cudamem's arrays export. */
    if (PyDict_SetItemString(st->DeviceNDArrayBase_type->tp_dict,
                             "__cuda_memory__", Py_True) < 0
        || PyDict_SetItemString(st->DeviceNDArrayBase_type->tp_dict,
                                "__cuda_ndarray__", Py_True) < 0) {
        return -1;
    }
    PyType_Modified(st->DeviceNDArrayBase_type);
    st->DeviceNDArray_type = cm_make_type(mod, &cm_da_spec,
                                          st->DeviceNDArrayBase_type);
    if (st->DeviceNDArray_type == NULL) {
        return -1;
    }
    st->DeviceNDArray_type->tp_vectorcall = cm_da_vectorcall;
    st->DeviceRecord_type = cm_make_type(mod, &cm_rec_spec,
                                         st->DeviceNDArrayBase_type);
    if (st->DeviceRecord_type == NULL) {
        return -1;
    }
    return PyModule_AddFunctions(mod, cm_devicearray_functions);
}
