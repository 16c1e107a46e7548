/* SPDX-License-Identifier: MIT */
/*
 * features/ipchandle.c: the IPC handle objects and
 * DeviceNDArray.get_ipc_handle.
 */
#include "features/ipc.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

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

static PyObject *
cm_ipch_get_pool(PyObject *self, void *unused)
{
    cm_ipch *h = (cm_ipch *)self;
    PyObject *t;

    (void)unused;
    if (h->pool == NULL && h->has_pool) {
        t = cm_ipc_pool_tuple(h->pool_pid, h->pool_fd, h->pool_token);
        if (t == NULL) {
            return NULL;
        }
        h->pool = t;
        h->has_pool = 0;
    }
    /* Unset: a legacy handle (made before handles had a kind, too). */
    return Py_NewRef(h->pool == NULL ? Py_None : h->pool);
}

static int
cm_ipch_set_pool(PyObject *self, PyObject *value, void *unused)
{
    cm_ipch *h = (cm_ipch *)self;

    (void)unused;
    Py_XSETREF(h->pool, Py_XNewRef(value));
    h->has_pool = 0;
    return 0;
}

static PyObject *
cm_ipch_get_pages(PyObject *self, void *unused)
{
    cm_ipch *h = (cm_ipch *)self;

    (void)unused;
    /* Unset: not an export of pool pages. */
    return Py_NewRef(h->pages == NULL ? Py_None : h->pages);
}

static int
cm_ipch_set_pages(PyObject *self, PyObject *value, void *unused)
{
    cm_ipch *h = (cm_ipch *)self;

    (void)unused;
    Py_XSETREF(h->pages, Py_XNewRef(value));
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
    Py_VISIT(h->pool);
    Py_VISIT(h->pages);
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
    Py_CLEAR(h->pool);
    Py_CLEAR(h->pages);
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
    {"pool", cm_ipch_get_pool, cm_ipch_set_pool,
     "None for a cuIpcGetMemHandle handle; for a memory-pool export, the "
     "pool's shareable handle as the exporter holds it: (pid, fd, "
     "token).", NULL},
    {"pages", cm_ipch_get_pages, cm_ipch_set_pages,
     "None, or for an export of pages of the pool manager on virtual "
     "memory, the pages as the exporter holds them: (pid, page_size, "
     "((fd, id), ...)).", NULL},
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
    cm_ipc_exp x;
    int pci[3];
    PyTypeObject *tp;
    cm_ipch *ih;
    cm_ipcah *ah;
    PyObject *owner;
    int i;

    /* Memory that was freed, or an IPC mapping that was closed, has
     * nothing to share: ValueError, as for every other use. */
    if (cm_da_activate_ctx(self) < 0 || cm_ipc_classes() < 0) {
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
        || ((cm_mem *)d.gpu_data)->ctx->mm == &cm_mm_plugin) {
        return PyObject_CallOneArg(cm_st->ipc_export_array, self);
    }
    ctx = ((cm_mem *)d.gpu_data)->ctx;
    span = cm_layout_span(d.view.ndim, d.view.shape, d.view.strides,
                          d.view.itemsize, &lo);
    /* The view's lowest byte: lo <= 0 is its offset from the first
     * element. */
    low = (CUdeviceptr)d.view.addr - (CUdeviceptr)(-lo);
    if (cm_ipc_export_raw(ctx, low, (size_t)span,
                          ((cm_mem *)d.gpu_data)->mm->export != NULL, &x)
        < 0) {
        return NULL;
    }
    if (cm_device_pci(ctx->device, pci) < 0) {
        Py_XDECREF(x.pages);
        return NULL;
    }
    /* The base keeps the memory object the array shows as gpu_data (a
     * pointer to the bytes it spans), as the Python path does. */
    owner = PyObject_GetAttrString(self, "gpu_data");
    if (owner == NULL) {
        Py_XDECREF(x.pages);
        return NULL;
    }
    tp = (PyTypeObject *)cm_st->IpcHandle;
    ih = (cm_ipch *)tp->tp_alloc(tp, 0);
    if (ih == NULL) {
        Py_DECREF(owner);
        Py_XDECREF(x.pages);
        return NULL;
    }
    ih->owner = owner;  /* takes the reference */
    ih->pages = x.pages;  /* takes the reference, or NULL */
    ih->ctx = (cm_context *)Py_NewRef(ctx);
    ih->ptr = low;
    ih->span = span;
    memcpy(ih->raw, x.raw, sizeof(ih->raw));
    ih->has_raw = 1;
    memcpy(ih->pci, pci, sizeof(ih->pci));
    ih->has_pci = 1;
    if (x.pooled) {
        ih->pool_pid = x.pid;
        ih->pool_fd = x.fd;
        ih->pool_token = x.token;
        ih->has_pool = 1;
    }
    ih->size = PyLong_FromSsize_t(span);
    ih->offset = PyLong_FromUnsignedLongLong(
        (unsigned long long)(low - x.base));
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
    ah->dtype = Py_NewRef((PyObject *)d.dtype);
    ah->shape = PyObject_GetAttr(self, cm_st->str_shape);
    ah->strides = PyObject_GetAttr(self, cm_st->str_strides);
    if (ah->shape == NULL || ah->strides == NULL) {
        Py_DECREF(ah);
        return NULL;
    }
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
    {"_ipc_open_pool", (PyCFunction)(void (*)(void))cm_ipc_open_pool,
     METH_FASTCALL, cm_ipc_open_pool_doc},
    {"_ipc_open_vmm", (PyCFunction)(void (*)(void))cm_ipc_open_vmm,
     METH_FASTCALL, cm_ipc_open_vmm_doc},
    {"_can_access_peer", (PyCFunction)(void (*)(void))cm_ipc_can_access_peer,
     METH_FASTCALL, cm_ipc_can_access_peer_doc},
    {NULL, NULL, 0, NULL},
};

int
cm_ipc_init(PyObject *mod, cm_state *st)
{
    int i;

    /* What memory/ reaches of the IPC imports (memory/memory.h). */
    cm_mem_up.ipc_pool_release = cm_ipc_pool_release;
    cm_mem_up.ipc_pool_drop = cm_ipc_pool_drop;
    cm_mem_up.ipc_vmm_release = cm_ipc_vmm_release;
    cm_mem_up.ipc_vmm_drop = cm_ipc_vmm_drop;
    /* What the context layer reaches of them (context/context.h). */
    cm_ctx_up.ipc_context_closing = cm_ipc_context_closing;
    /* What the array layer reaches of them (array/array.h). */
    cm_array_up.ipc_get_handle = cm_ipc_get_handle;
    cm_array_up.ipc_mem_closed = cm_ipc_mem_closed;
    if (cm_ipcpool_fork_init() < 0 || cm_ipcvmm_fork_init() < 0) {
        return -1;
    }
    for (i = 0; i < 3; i++) {
        cm_str_pci[i] = PyUnicode_InternFromString(cm_pci_keys[i]);
        if (cm_str_pci[i] == NULL) {
            return -1;
        }
    }
    st->IpcMemory_type = cm_make_type(mod, &cm_ipcmem_spec, NULL);
    if (st->IpcMemory_type == NULL) {
        return -1;
    }
    st->IpcHandleBase_type = cm_make_type(mod, &cm_ipch_spec, NULL);
    if (st->IpcHandleBase_type == NULL) {
        return -1;
    }
    st->IpcArrayHandleBase_type = cm_make_type(mod, &cm_ipcah_spec, NULL);
    if (st->IpcArrayHandleBase_type == NULL) {
        return -1;
    }
    return PyModule_AddFunctions(mod, cm_ipc_functions);
}
