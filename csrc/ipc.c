/* SPDX-License-Identifier: MIT */
/*
 * ipc.c: sharing device memory between processes (CUDA IPC).
 *
 * Owns the driver side of IPC and the state of the handle objects; the
 * picklable handle classes are Python (cudamem/_ipc.py) over two types of
 * this file:
 * - _IpcHandleBase and _IpcArrayHandleBase hold the attributes of
 *   IpcHandle (base, handle, size, source_info, offset) and IpcArrayHandle
 *   (_ipc_handle, _array_desc); the Python subclasses add the methods.  An
 *   export fills them from C values, and the Python objects that cost
 *   most to make (the base MemoryPointer, the _RawHandle, the source_info
 *   and array description dicts) are made on first read, once;
 * - DeviceNDArray.get_ipc_handle: for memory of the built-in managers (a
 *   DeviceAllocation), cuMemGetAddressRange and cuIpcGetMemHandle, then
 *   the two objects, with no Python call; for a plugin's memory (or memory
 *   cudamem did not allocate) cudamem._ipc._export_array, which asks the
 *   context's memory manager;
 * - _ipc_export(context, address): the allocation containing address and
 *   its handle, for any manager's memory (GetIpcHandleMixin): the handle
 *   always names the base allocation, and the caller keeps the offset of
 *   its view inside it;
 * - IpcMemory, the owner of one mapping opened with cuIpcOpenMemHandle
 *   (made by _ipc_open).  Arrays over the mapping hold it through their
 *   gpu_data.  close() unmaps at once (cuIpcCloseMemHandle) and is
 *   idempotent; otherwise dealloc queues the close on its context's memory
 *   queue, like a free.
 *
 * Locking: none of its own; the GIL guards the objects' fields.  The
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

/* The state of an IpcHandle.  NULL fields are unset (reading one raises
 * AttributeError, as for a plain object) unless made on first read. */
typedef struct {
    PyObject_HEAD
    PyObject *base;       /* strong or NULL: the exported memory pointer;
                           * NULL while owner holds what makes it */
    PyObject *owner;      /* strong or NULL: for the base made on first
                           * read, what keeps the exported memory alive */
    cm_context *ctx;      /* strong or NULL: that base's context */
    CUdeviceptr ptr;      /* that base's address (the view's lowest byte) */
    Py_ssize_t span;      /* that base's size (the view's byte span) */
    PyObject *handle;     /* strong or NULL: the _RawHandle; NULL while
                           * has_raw */
    PyObject *size;       /* strong or NULL: bytes exported (an int) */
    PyObject *source_info;  /* strong or NULL: the exporting device's
                             * identity; NULL while has_pci */
    PyObject *offset;     /* strong or NULL: the view's offset in the
                           * allocation (an int) */
    int has_raw;          /* raw holds the handle not yet made */
    int has_pci;          /* pci holds the source_info not yet made */
    int pci[3];           /* PCI domain, bus and device ids */
    unsigned char raw[CU_IPC_HANDLE_SIZE];  /* the CUipcMemHandle bytes */
} cm_ipch;

/* The state of an IpcArrayHandle, likewise. */
typedef struct {
    PyObject_HEAD
    PyObject *ipc_handle;  /* strong or NULL: the IpcHandle */
    PyObject *desc;       /* strong or NULL: the array description, a
                           * dict; NULL while shape is set */
    PyObject *shape;      /* strong or NULL: the exported array's shape, */
    PyObject *strides;    /* strides */
    PyObject *dtype;      /* and dtype, for the description */
} cm_ipcah;

/* Interned names: the description's "dtype" and the identity's keys. */
static PyObject *cm_str_dtype;
static PyObject *cm_str_pci[3];
static const char *const cm_pci_keys[3] = {
    "pci_domain_id", "pci_bus_id", "pci_device_id",
};

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

/* The handle of the allocation of ctx that contains addr, its base and
 * size.  0, or -1 with an exception. */
static int
cm_ipc_export_raw(cm_context *ctx, CUdeviceptr addr, CUipcMemHandle *h,
                  CUdeviceptr *base, size_t *size)
{
    CUipcMemHandle out;
    CUdeviceptr b = 0;
    size_t n = 0;
    int err;

    if (addr == 0) {
        PyErr_SetString(PyExc_ValueError,
                        "cannot export a NULL pointer (an empty array has "
                        "no memory to share)");
        return -1;
    }
    if (cm_context_activate(ctx) < 0
        || CM_CU(MemGetAddressRange, (&b, &n, addr)) < 0) {
        return -1;
    }
    memset(&out, 0, sizeof(out));
    CM_CU_NOGIL(err, IpcGetMemHandle, (&out, b));
    if (err < 0) {
        return -1;
    }
    *h = out;
    *base = b;
    *size = n;
    return 0;
}

static PyObject *
cm_ipc_export(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    cm_context *ctx;
    unsigned long long addr;
    CUdeviceptr base = 0;
    size_t size = 0;
    CUipcMemHandle h;

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
    if ((addr == (unsigned long long)-1 && PyErr_Occurred())
        || cm_ipc_export_raw(ctx, (CUdeviceptr)addr, &h, &base, &size) < 0) {
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
/* Peers                                                               */
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

/* ------------------------------------------------------------------ */
/* The handle objects                                                  */
/* ------------------------------------------------------------------ */

/* AttributeError for the unset attribute name of self, worded as for a
 * plain object.  NULL. */
static PyObject *
cm_ipc_no_attr(PyObject *self, const char *name)
{
    PyErr_Format(PyExc_AttributeError, "'%.100s' object has no attribute "
                 "'%s'", Py_TYPE(self)->tp_name, name);
    return NULL;
}

/* Fetch what the export makes or calls in Python (cm_state's IpcHandle
 * ... MemoryPointer), once.  0, or -1 with an exception. */
static int
cm_ipc_classes(void)
{
    static const char *const names[5] = {
        "MemoryPointer", "_RawHandle", "_export_array", "IpcArrayHandle",
        "IpcHandle",
    };
    PyObject **slots[5];
    PyObject *got[5] = {NULL, NULL, NULL, NULL, NULL};
    PyObject *mod;
    int i;

    if (cm_st->IpcHandle != NULL) {
        return 0;
    }
    slots[0] = &cm_st->MemoryPointer;
    slots[1] = &cm_st->IpcRawHandle;
    slots[2] = &cm_st->ipc_export_array;
    slots[3] = &cm_st->IpcArrayHandle;
    slots[4] = &cm_st->IpcHandle;
    mod = PyImport_ImportModule("cudamem._ipc");
    if (mod == NULL) {
        return -1;
    }
    for (i = 0; i < 5; i++) {
        got[i] = PyObject_GetAttrString(mod, names[i]);
        if (got[i] == NULL) {
            goto err_drop_fetched;
        }
    }
    if (!PyType_Check(got[3]) || !PyType_Check(got[4])
        || !PyType_IsSubtype((PyTypeObject *)got[3],
                             cm_st->IpcArrayHandleBase_type)
        || !PyType_IsSubtype((PyTypeObject *)got[4],
                             cm_st->IpcHandleBase_type)) {
        PyErr_SetString(PyExc_TypeError,
                        "cudamem._ipc's IpcHandle and IpcArrayHandle must "
                        "subclass cudamem._core's handle bases");
        goto err_drop_fetched;
    }
    Py_DECREF(mod);
    /* IpcHandle last: it says the others are there. */
    for (i = 0; i < 5; i++) {
        Py_XSETREF(*slots[i], got[i]);
    }
    return 0;

err_drop_fetched:
    for (i = 0; i < 5; i++) {
        Py_XDECREF(got[i]);
    }
    Py_DECREF(mod);
    return -1;
}

/* ---- IpcHandle's state ---- */

static PyObject *
cm_ipch_get_base(PyObject *self, void *unused)
{
    cm_ipch *h = (cm_ipch *)self;
    PyObject *args[4];
    PyObject *mp;
    int i;

    (void)unused;
    if (h->base == NULL && h->owner != NULL) {
        if (cm_ipc_classes() < 0) {
            return NULL;
        }
        args[0] = (PyObject *)h->ctx;
        args[1] = PyLong_FromUnsignedLongLong((unsigned long long)h->ptr);
        if (args[1] == NULL) {
            return NULL;
        }
        args[2] = PyLong_FromSsize_t(h->span);
        if (args[2] == NULL) {
            Py_DECREF(args[1]);
            return NULL;
        }
        /* Held for the call: MemoryPointer runs Python, which may set
         * base (and so drop them) meanwhile. */
        args[0] = Py_NewRef(args[0]);
        args[3] = Py_NewRef(h->owner);
        /* MemoryPointer(context, pointer, size, owner) */
        mp = PyObject_Vectorcall(cm_st->MemoryPointer, args, 4, NULL);
        for (i = 0; i < 4; i++) {
            Py_DECREF(args[i]);
        }
        if (mp == NULL) {
            return NULL;
        }
        if (h->base == NULL && h->owner != NULL) {
            h->base = mp;
            Py_CLEAR(h->owner);
            Py_CLEAR(h->ctx);
        }
        else {
            /* The call set or dropped base meanwhile: that wins. */
            Py_DECREF(mp);
        }
    }
    if (h->base == NULL) {
        return cm_ipc_no_attr(self, "base");
    }
    return Py_NewRef(h->base);
}

static int
cm_ipch_set_base(PyObject *self, PyObject *value, void *unused)
{
    cm_ipch *h = (cm_ipch *)self;

    (void)unused;
    if (value == NULL && h->base == NULL && h->owner == NULL) {
        (void)cm_ipc_no_attr(self, "base");
        return -1;
    }
    Py_XSETREF(h->base, Py_XNewRef(value));
    Py_CLEAR(h->owner);
    Py_CLEAR(h->ctx);
    return 0;
}

static PyObject *
cm_ipch_get_handle(PyObject *self, void *unused)
{
    cm_ipch *h = (cm_ipch *)self;
    PyObject *raw;
    PyObject *r;

    (void)unused;
    if (h->handle == NULL && h->has_raw) {
        if (cm_ipc_classes() < 0) {
            return NULL;
        }
        raw = PyBytes_FromStringAndSize((const char *)h->raw,
                                        (Py_ssize_t)sizeof(h->raw));
        if (raw == NULL) {
            return NULL;
        }
        r = PyObject_CallOneArg(cm_st->IpcRawHandle, raw);
        Py_DECREF(raw);
        if (r == NULL) {
            return NULL;
        }
        Py_XSETREF(h->handle, r);
        h->has_raw = 0;
    }
    if (h->handle == NULL) {
        return cm_ipc_no_attr(self, "handle");
    }
    return Py_NewRef(h->handle);
}

static int
cm_ipch_set_handle(PyObject *self, PyObject *value, void *unused)
{
    cm_ipch *h = (cm_ipch *)self;

    (void)unused;
    if (value == NULL && h->handle == NULL && !h->has_raw) {
        (void)cm_ipc_no_attr(self, "handle");
        return -1;
    }
    Py_XSETREF(h->handle, Py_XNewRef(value));
    h->has_raw = 0;
    return 0;
}

/* A new dict of a PCI identity, as Device.get_device_identity gives. */
static PyObject *
cm_ipc_identity_dict(const int pci[3])
{
    PyObject *d = PyDict_New();
    PyObject *v;
    int i;

    if (d == NULL) {
        return NULL;
    }
    for (i = 0; i < 3; i++) {
        v = PyLong_FromLong(pci[i]);
        if (v == NULL || PyDict_SetItem(d, cm_str_pci[i], v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(v);
    }
    return d;
}

static PyObject *
cm_ipch_get_source_info(PyObject *self, void *unused)
{
    cm_ipch *h = (cm_ipch *)self;
    PyObject *d;

    (void)unused;
    if (h->source_info == NULL && h->has_pci) {
        d = cm_ipc_identity_dict(h->pci);
        if (d == NULL) {
            return NULL;
        }
        h->source_info = d;
        h->has_pci = 0;
    }
    if (h->source_info == NULL) {
        return cm_ipc_no_attr(self, "source_info");
    }
    return Py_NewRef(h->source_info);
}

static int
cm_ipch_set_source_info(PyObject *self, PyObject *value, void *unused)
{
    cm_ipch *h = (cm_ipch *)self;

    (void)unused;
    if (value == NULL && h->source_info == NULL && !h->has_pci) {
        (void)cm_ipc_no_attr(self, "source_info");
        return -1;
    }
    Py_XSETREF(h->source_info, Py_XNewRef(value));
    h->has_pci = 0;
    return 0;
}

static int
cm_ipch_traverse(PyObject *self, visitproc visit, void *arg)
{
    cm_ipch *h = (cm_ipch *)self;

    Py_VISIT(Py_TYPE(self));
    Py_VISIT(h->base);
    Py_VISIT(h->owner);
    Py_VISIT(h->ctx);
    Py_VISIT(h->handle);
    Py_VISIT(h->size);
    Py_VISIT(h->source_info);
    Py_VISIT(h->offset);
    return 0;
}

static int
cm_ipch_clear(PyObject *self)
{
    cm_ipch *h = (cm_ipch *)self;

    Py_CLEAR(h->base);
    Py_CLEAR(h->owner);
    Py_CLEAR(h->ctx);
    Py_CLEAR(h->handle);
    Py_CLEAR(h->size);
    Py_CLEAR(h->source_info);
    Py_CLEAR(h->offset);
    return 0;
}

static void
cm_ipch_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);

    PyObject_GC_UnTrack(self);
    (void)cm_ipch_clear(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyGetSetDef cm_ipch_getset[] = {
    {"base", cm_ipch_get_base, cm_ipch_set_base,
     "The exported memory pointer (kept alive by the handle), or None.",
     NULL},
    {"handle", cm_ipch_get_handle, cm_ipch_set_handle,
     "The 64 bytes of the CUipcMemHandle (bytes with .reserved).", NULL},
    {"source_info", cm_ipch_get_source_info, cm_ipch_set_source_info,
     "The exporting device's identity (a dict), or None.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef cm_ipch_members[] = {
    {"size", Py_T_OBJECT_EX, offsetof(cm_ipch, size), 0,
     "Bytes exported."},
    {"offset", Py_T_OBJECT_EX, offsetof(cm_ipch, offset), 0,
     "The exported bytes' offset inside the allocation."},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(cm_ipch_doc,
"The attributes of cudamem.IpcHandle, which subclasses this type.");

static PyType_Slot cm_ipch_slots[] = {
    {Py_tp_doc, (void *)cm_ipch_doc},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, cm_ipch_dealloc},
    {Py_tp_traverse, cm_ipch_traverse},
    {Py_tp_clear, cm_ipch_clear},
    {Py_tp_getset, cm_ipch_getset},
    {Py_tp_members, cm_ipch_members},
    {0, NULL},
};

static PyType_Spec cm_ipch_spec = {
    .name = "cudamem._IpcHandleBase",
    .basicsize = sizeof(cm_ipch),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE
             | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = cm_ipch_slots,
};

/* ---- IpcArrayHandle's state ---- */

static PyObject *
cm_ipcah_get_desc(PyObject *self, void *unused)
{
    cm_ipcah *a = (cm_ipcah *)self;
    PyObject *d;

    (void)unused;
    if (a->desc == NULL && a->shape != NULL) {
        d = PyDict_New();
        if (d == NULL || PyDict_SetItem(d, cm_st->str_shape, a->shape) < 0
            || PyDict_SetItem(d, cm_st->str_strides, a->strides) < 0
            || PyDict_SetItem(d, cm_str_dtype, a->dtype) < 0) {
            Py_XDECREF(d);
            return NULL;
        }
        a->desc = d;
        Py_CLEAR(a->shape);
        Py_CLEAR(a->strides);
        Py_CLEAR(a->dtype);
    }
    if (a->desc == NULL) {
        return cm_ipc_no_attr(self, "_array_desc");
    }
    return Py_NewRef(a->desc);
}

static int
cm_ipcah_set_desc(PyObject *self, PyObject *value, void *unused)
{
    cm_ipcah *a = (cm_ipcah *)self;

    (void)unused;
    if (value == NULL && a->desc == NULL && a->shape == NULL) {
        (void)cm_ipc_no_attr(self, "_array_desc");
        return -1;
    }
    Py_XSETREF(a->desc, Py_XNewRef(value));
    Py_CLEAR(a->shape);
    Py_CLEAR(a->strides);
    Py_CLEAR(a->dtype);
    return 0;
}

static int
cm_ipcah_traverse(PyObject *self, visitproc visit, void *arg)
{
    cm_ipcah *a = (cm_ipcah *)self;

    Py_VISIT(Py_TYPE(self));
    Py_VISIT(a->ipc_handle);
    Py_VISIT(a->desc);
    Py_VISIT(a->shape);
    Py_VISIT(a->strides);
    Py_VISIT(a->dtype);
    return 0;
}

static int
cm_ipcah_clear(PyObject *self)
{
    cm_ipcah *a = (cm_ipcah *)self;

    Py_CLEAR(a->ipc_handle);
    Py_CLEAR(a->desc);
    Py_CLEAR(a->shape);
    Py_CLEAR(a->strides);
    Py_CLEAR(a->dtype);
    return 0;
}

static void
cm_ipcah_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);

    PyObject_GC_UnTrack(self);
    (void)cm_ipcah_clear(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyGetSetDef cm_ipcah_getset[] = {
    {"_array_desc", cm_ipcah_get_desc, cm_ipcah_set_desc,
     "The array's description: a dict of shape, strides and dtype.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef cm_ipcah_members[] = {
    {"_ipc_handle", Py_T_OBJECT_EX, offsetof(cm_ipcah, ipc_handle), 0,
     "The IpcHandle."},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(cm_ipcah_doc,
"The attributes of cudamem.IpcArrayHandle, which subclasses this type.");

static PyType_Slot cm_ipcah_slots[] = {
    {Py_tp_doc, (void *)cm_ipcah_doc},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, cm_ipcah_dealloc},
    {Py_tp_traverse, cm_ipcah_traverse},
    {Py_tp_clear, cm_ipcah_clear},
    {Py_tp_getset, cm_ipcah_getset},
    {Py_tp_members, cm_ipcah_members},
    {0, NULL},
};

static PyType_Spec cm_ipcah_spec = {
    .name = "cudamem._IpcArrayHandleBase",
    .basicsize = sizeof(cm_ipcah),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE
             | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = cm_ipcah_slots,
};

/* ------------------------------------------------------------------ */
/* DeviceNDArray.get_ipc_handle                                        */
/* ------------------------------------------------------------------ */

#ifdef __linux__
/* The export of a device array: see get_ipc_handle. */
static PyObject *
cm_ipc_export_array(PyObject *self)
{
    cm_da_desc d;
    cm_context *ctx;
    Py_ssize_t lo = 0;
    Py_ssize_t span;
    CUdeviceptr low;
    CUdeviceptr base = 0;
    size_t size = 0;
    CUipcMemHandle h;
    int pci[3];
    PyTypeObject *tp;
    cm_ipch *ih;
    cm_ipcah *ah;
    int i;

    if (cm_ipc_classes() < 0) {
        return NULL;
    }
    (void)cm_da_describe(self, &d);
    for (i = 0; i < d.view.ndim; i++) {
        if (d.view.shape[i] == 0) {
            PyErr_SetString(PyExc_ValueError,
                            "cannot export an empty array through IPC: it "
                            "has no device memory");
            return NULL;
        }
    }
    /* Only memory of the built-in managers takes the C path; a plugin's
     * get_ipc_handle (or the current context's, for memory cudamem did
     * not allocate) is asked from Python. */
    if (!Py_IS_TYPE(d.gpu_data, cm_st->Mem_type)
        || ((cm_mem *)d.gpu_data)->ctx->mm_kind == CM_MM_PLUGIN) {
        return PyObject_CallOneArg(cm_st->ipc_export_array, self);
    }
    ctx = ((cm_mem *)d.gpu_data)->ctx;
    span = cm_layout_span(d.view.ndim, d.view.shape, d.view.strides,
                          d.view.itemsize, &lo);
    /* The view's lowest byte: lo <= 0 is its offset from the first
     * element. */
    low = (CUdeviceptr)d.view.addr - (CUdeviceptr)(-lo);
    if (cm_ipc_export_raw(ctx, low, &h, &base, &size) < 0
        || cm_device_pci(ctx->device, pci) < 0) {
        return NULL;
    }
    tp = (PyTypeObject *)cm_st->IpcHandle;
    ih = (cm_ipch *)tp->tp_alloc(tp, 0);
    if (ih == NULL) {
        return NULL;
    }
    ih->owner = Py_NewRef(d.gpu_data);
    ih->ctx = (cm_context *)Py_NewRef(ctx);
    ih->ptr = low;
    ih->span = span;
    memcpy(ih->raw, h.reserved, sizeof(ih->raw));
    ih->has_raw = 1;
    memcpy(ih->pci, pci, sizeof(ih->pci));
    ih->has_pci = 1;
    ih->size = PyLong_FromSsize_t(span);
    ih->offset = PyLong_FromUnsignedLongLong(
        (unsigned long long)(low - base));
    if (ih->size == NULL || ih->offset == NULL) {
        Py_DECREF(ih);
        return NULL;
    }
    tp = (PyTypeObject *)cm_st->IpcArrayHandle;
    ah = (cm_ipcah *)tp->tp_alloc(tp, 0);
    if (ah == NULL) {
        Py_DECREF(ih);
        return NULL;
    }
    ah->ipc_handle = (PyObject *)ih;  /* takes the reference ih came with */
    ah->shape = Py_NewRef(d.shape);
    ah->strides = Py_NewRef(d.strides);
    ah->dtype = Py_NewRef((PyObject *)d.dtype);
    return (PyObject *)ah;
}
#endif

PyObject *
cm_ipc_get_handle(PyObject *self, PyObject *unused)
{
    (void)unused;
#ifdef __linux__
    return cm_ipc_export_array(self);
#else
    (void)self;
    PyErr_SetString(PyExc_OSError, "OS does not support CUDA IPC");
    return NULL;
#endif
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

/* A type of this file, added to mod; NULL on failure. */
static PyTypeObject *
cm_ipc_type(PyObject *mod, PyType_Spec *spec)
{
    PyTypeObject *tp = (PyTypeObject *)PyType_FromModuleAndSpec(mod, spec,
                                                                NULL);

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
cm_ipc_init(PyObject *mod, cm_state *st)
{
    int i;

    cm_str_dtype = PyUnicode_InternFromString("dtype");
    if (cm_str_dtype == NULL) {
        return -1;
    }
    for (i = 0; i < 3; i++) {
        cm_str_pci[i] = PyUnicode_InternFromString(cm_pci_keys[i]);
        if (cm_str_pci[i] == NULL) {
            return -1;
        }
    }
    st->IpcMemory_type = cm_ipc_type(mod, &cm_ipcmem_spec);
    st->IpcHandleBase_type = st->IpcMemory_type == NULL
                                 ? NULL
                                 : cm_ipc_type(mod, &cm_ipch_spec);
    st->IpcArrayHandleBase_type = st->IpcHandleBase_type == NULL
                                      ? NULL
                                      : cm_ipc_type(mod, &cm_ipcah_spec);
    if (st->IpcArrayHandleBase_type == NULL) {
        return -1;
    }
    return PyModule_AddFunctions(mod, cm_ipc_functions);
}
