/* SPDX-License-Identifier: MIT */
/*
 * ipc.c: sharing device memory between processes (CUDA IPC).
 *
 * Owns the driver side of IPC; the picklable handle classes are Python
 * (cudamem/_ipc.py) and call in here:
 * - _ipc_export(context, address): the allocation containing address
 *   (cuMemGetAddressRange) and its cuIpcGetMemHandle, for any manager's
 *   memory: the handle always names the base allocation, and the caller
 *   keeps the offset of its view inside it;
 * - IpcMemory, the owner of one mapping opened with cuIpcOpenMemHandle
 *   (made by _ipc_open).  Arrays over the mapping hold it through their
 *   gpu_data.  close() unmaps at once (cuIpcCloseMemHandle) and is
 *   idempotent; otherwise dealloc queues the close on its context's memory
 *   queue, like a free;
 * - DeviceNDArray.get_ipc_handle, which hands the array to
 *   cudamem._ipc._export_array.
 *
 * Locking: none of its own; the GIL guards IpcMemory's fields.  The
 * export, open and close calls can wait (the simulator's export and close
 * wait for queued work), so they run with the GIL released, touching only
 * C locals; an IpcMemory is marked closed before its close is issued.
 */
#include "cm.h"

#include <string.h>

/* The owner of one imported mapping. */
typedef struct {
    PyObject_HEAD
    cm_context *ctx;      /* strong: the context it was opened in */
    CUdeviceptr ptr;      /* the mapped address */
    size_t size;          /* bytes the opener asked for */
    int closed;           /* NOTE: set once, before the close is issued */
    PyObject *weakreflist;
} cm_ipcmem;

/* The Context argument of the module functions: borrowed, or NULL with
 * TypeError. */
static cm_context *
cm_ipc_context_arg(PyObject *obj)
{
    if (!PyObject_TypeCheck(obj, cm_st->Context_type)) {
        PyErr_Format(PyExc_TypeError, "expected a cudamem Context, got %.200s",
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return (cm_context *)obj;
}

/* ------------------------------------------------------------------ */
/* Export                                                              */
/* ------------------------------------------------------------------ */

PyDoc_STRVAR(cm_ipc_export_doc,
"_ipc_export(context, address, /)\n--\n\n"
"The IPC handle of the allocation that contains address: a tuple\n"
"(handle, base, size) of the 64 handle bytes, the allocation's base\n"
"address (cuMemGetAddressRange) and its size.  The handle names the base\n"
"allocation; address - base is the offset of the caller's view.");

static PyObject *
cm_ipc_export(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    cm_context *ctx;
    unsigned long long addr;
    CUdeviceptr base = 0;
    size_t size = 0;
    CUipcMemHandle h;
    int err;

    (void)mod;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError,
                     "_ipc_export() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    ctx = cm_ipc_context_arg(args[0]);
    if (ctx == NULL) {
        return NULL;
    }
    addr = PyLong_AsUnsignedLongLong(args[1]);
    if (addr == (unsigned long long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    if (addr == 0) {
        PyErr_SetString(PyExc_ValueError,
                        "cannot export a NULL pointer (an empty array has "
                        "no memory to share)");
        return NULL;
    }
    if (cm_context_activate(ctx) < 0
        || CM_CU(MemGetAddressRange, (&base, &size, (CUdeviceptr)addr)) < 0) {
        return NULL;
    }
    memset(&h, 0, sizeof(h));
    CM_CU_NOGIL(err, IpcGetMemHandle, (&h, base));
    if (err < 0) {
        return NULL;
    }
    return Py_BuildValue("(y#KK)", h.reserved, (Py_ssize_t)sizeof(h.reserved),
                         (unsigned long long)base, (unsigned long long)size);
}

/* ------------------------------------------------------------------ */
/* IpcMemory                                                           */
/* ------------------------------------------------------------------ */

static int
cm_ipcmem_check_open(cm_ipcmem *m)
{
    if (m->closed) {
        PyErr_SetString(PyExc_ValueError, "the IPC mapping is closed");
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(cm_ipc_open_doc,
"_ipc_open(context, handle, size, /)\n--\n\n"
"Map the memory that handle (64 bytes from another process's\n"
"cuIpcGetMemHandle) names into context, with lazy peer access: a new\n"
"IpcMemory whose device_pointer is the allocation's base.  size is the\n"
"number of bytes the caller will use, for its size attribute.");

static PyObject *
cm_ipc_open(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    cm_context *ctx;
    Py_buffer view;
    Py_ssize_t size;
    CUipcMemHandle h;
    CUdeviceptr p = 0;
    cm_ipcmem *m;
    int err;

    (void)mod;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError,
                     "_ipc_open() takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    ctx = cm_ipc_context_arg(args[0]);
    if (ctx == NULL) {
        return NULL;
    }
    size = PyNumber_AsSsize_t(args[2], PyExc_OverflowError);
    if (size == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (size < 0) {
        PyErr_Format(PyExc_ValueError, "size must not be negative, got %zd",
                     size);
        return NULL;
    }
    if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (view.len != (Py_ssize_t)sizeof(h.reserved)) {
        PyErr_Format(PyExc_ValueError,
                     "an IPC handle has %zu bytes, got %zd",
                     sizeof(h.reserved), view.len);
        PyBuffer_Release(&view);
        return NULL;
    }
    memcpy(h.reserved, view.buf, sizeof(h.reserved));
    PyBuffer_Release(&view);
    if (cm_context_activate(ctx) < 0) {
        return NULL;
    }
    CM_CU_NOGIL(err, IpcOpenMemHandle,
                (&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    if (err < 0) {
        return NULL;
    }
    m = PyObject_GC_New(cm_ipcmem, cm_st->IpcMemory_type);
    if (m == NULL) {
        /* The mapping is still ours to undo. */
        (void)CM_CU_RAW(IpcCloseMemHandle, (p));
        return NULL;
    }
    m->ctx = (cm_context *)Py_NewRef(ctx);
    m->ptr = p;
    m->size = (size_t)size;
    m->closed = 0;
    m->weakreflist = NULL;
    PyObject_GC_Track(m);
    return (PyObject *)m;
}

PyDoc_STRVAR(cm_ipcmem_close_doc,
"close($self, /)\n--\n\n"
"Unmap now (cuIpcCloseMemHandle).  Arrays over the mapping are dead\n"
"afterwards: using them raises CudaAPIError.  A second call does\n"
"nothing.");

static PyObject *
cm_ipcmem_close(PyObject *self, PyObject *unused)
{
    cm_ipcmem *m = (cm_ipcmem *)self;
    CUdeviceptr p = m->ptr;
    int err;

    (void)unused;
    if (m->closed) {
        Py_RETURN_NONE;
    }
    m->closed = 1;
    if (!m->ctx->alive) {
        /* Closing or resetting the device unmapped it already. */
        Py_RETURN_NONE;
    }
    if (cm_context_activate(m->ctx) < 0) {
        return NULL;
    }
    CM_CU_NOGIL(err, IpcCloseMemHandle, (p));
    if (err < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
cm_ipcmem_get_ptr(PyObject *self, void *unused)
{
    cm_ipcmem *m = (cm_ipcmem *)self;

    (void)unused;
    if (cm_ipcmem_check_open(m) < 0) {
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(m->ptr);
}

static PyObject *
cm_ipcmem_get_size(PyObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromSize_t(((cm_ipcmem *)self)->size);
}

static PyObject *
cm_ipcmem_get_context(PyObject *self, void *unused)
{
    (void)unused;
    return Py_NewRef(((cm_ipcmem *)self)->ctx);
}

static PyObject *
cm_ipcmem_get_closed(PyObject *self, void *unused)
{
    (void)unused;
    return PyBool_FromLong(((cm_ipcmem *)self)->closed);
}

static int
cm_ipcmem_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(((cm_ipcmem *)self)->ctx);
    return 0;
}

static void
cm_ipcmem_dealloc(PyObject *self)
{
    cm_ipcmem *m = (cm_ipcmem *)self;
    PyTypeObject *tp = Py_TYPE(self);
    PyObject *exc = PyErr_GetRaisedException();

    PyObject_GC_UnTrack(self);
    if (m->weakreflist != NULL) {
        PyObject_ClearWeakRefs(self);
    }
    if (!m->closed && !Py_IsFinalizing()) {
        m->closed = 1;
        cm_ctx_release(m->ctx, CM_REL_IPC, (uintptr_t)m->ptr, 0);
    }
    Py_CLEAR(m->ctx);
    tp->tp_free(self);
    Py_DECREF(tp);
    PyErr_SetRaisedException(exc);
}

static PyGetSetDef cm_ipcmem_getset[] = {
    {"device_pointer", cm_ipcmem_get_ptr, NULL,
     "The mapped address, as an int (ValueError once closed).", NULL},
    {"handle", cm_ipcmem_get_ptr, NULL, "The same as device_pointer.",
     NULL},
    {"size", cm_ipcmem_get_size, NULL, "The bytes the opener uses.", NULL},
    {"context", cm_ipcmem_get_context, NULL,
     "The Context the mapping was opened in.", NULL},
    {"closed", cm_ipcmem_get_closed, NULL,
     "Whether close() ran (or the mapping was handed to the queue).",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef cm_ipcmem_methods[] = {
    {"close", cm_ipcmem_close, METH_NOARGS, cm_ipcmem_close_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef cm_ipcmem_members[] = {
    {"__weaklistoffset__", Py_T_PYSSIZET, offsetof(cm_ipcmem, weakreflist),
     Py_READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(cm_ipcmem_doc,
"Device memory of another process, mapped here by cuIpcOpenMemHandle.\n"
"Made by IpcHandle.open; unmapped by close() or, failing that, queued for\n"
"unmapping when the last reference goes.");

static PyType_Slot cm_ipcmem_slots[] = {
    {Py_tp_doc, (void *)cm_ipcmem_doc},
    {Py_tp_dealloc, cm_ipcmem_dealloc},
    {Py_tp_traverse, cm_ipcmem_traverse},
    {Py_tp_getset, cm_ipcmem_getset},
    {Py_tp_methods, cm_ipcmem_methods},
    {Py_tp_members, cm_ipcmem_members},
    {0, NULL},
};

static PyType_Spec cm_ipcmem_spec = {
    .name = "cudamem.IpcMemory",
    .basicsize = sizeof(cm_ipcmem),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC
             | Py_TPFLAGS_IMMUTABLETYPE
             | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = cm_ipcmem_slots,
};

/* ------------------------------------------------------------------ */
/* Peers and the array method                                          */
/* ------------------------------------------------------------------ */

PyDoc_STRVAR(cm_ipc_can_access_peer_doc,
"_can_access_peer(device, peer, /)\n--\n\n"
"cuDeviceCanAccessPeer for two device ordinals.");

static PyObject *
cm_ipc_can_access_peer(PyObject *mod, PyObject *const *args,
                       Py_ssize_t nargs)
{
    CUdevice d;
    CUdevice p;
    int a;
    int b;
    int can = 0;

    (void)mod;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError,
                     "_can_access_peer() takes 2 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    a = (int)PyLong_AsLong(args[0]);
    if (a == -1 && PyErr_Occurred()) {
        return NULL;
    }
    b = (int)PyLong_AsLong(args[1]);
    if ((b == -1 && PyErr_Occurred()) || cm_driver_ensure() < 0
        || CM_CU(DeviceGet, (&d, a)) < 0 || CM_CU(DeviceGet, (&p, b)) < 0
        || CM_CU(DeviceCanAccessPeer, (&can, d, p)) < 0) {
        return NULL;
    }
    return PyBool_FromLong(can);
}

PyObject *
cm_ipc_get_handle(PyObject *self, PyObject *unused)
{
    PyObject *mod;
    PyObject *r;

    (void)unused;
    mod = PyImport_ImportModule("cudamem._ipc");
    if (mod == NULL) {
        return NULL;
    }
    r = PyObject_CallMethod(mod, "_export_array", "O", self);
    Py_DECREF(mod);
    return r;
}

static PyMethodDef cm_ipc_functions[] = {
    {"_ipc_export", (PyCFunction)(void (*)(void))cm_ipc_export,
     METH_FASTCALL, cm_ipc_export_doc},
    {"_ipc_open", (PyCFunction)(void (*)(void))cm_ipc_open, METH_FASTCALL,
     cm_ipc_open_doc},
    {"_can_access_peer", (PyCFunction)(void (*)(void))cm_ipc_can_access_peer,
     METH_FASTCALL, cm_ipc_can_access_peer_doc},
    {NULL, NULL, 0, NULL},
};

int
cm_ipc_init(PyObject *mod, cm_state *st)
{
    st->IpcMemory_type = (PyTypeObject *)PyType_FromModuleAndSpec(
        mod, &cm_ipcmem_spec, NULL);
    if (st->IpcMemory_type == NULL
        || PyModule_AddObjectRef(mod, "IpcMemory",
                                 (PyObject *)st->IpcMemory_type) < 0) {
        return -1;
    }
    return PyModule_AddFunctions(mod, cm_ipc_functions);
}
