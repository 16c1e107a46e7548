/* SPDX-License-Identifier: MIT */
/*
 * context/ctxtypes.c: the Python types Device and Context, their
 * attributes and methods.  They sit above what their methods reach:
 * Device.reset() closes the device (close.c), Context.reset() empties
 * the context's kept streams (callbacks.c) and Context.synchronize() is
 * refused while a capture is in progress (graph.c); the devices and
 * contexts themselves are device.c's and context.c's.
 *
 * Locks and the GIL: no lock.  Everything runs with the GIL held, which
 * guards a Context's fields (mm_info_busy, memory_manager, mm).  The GIL
 * is released around cuCtxSynchronize in Context.synchronize
 * (CM_CU_NOGIL, the context entered, no Python object touched), inside
 * what Device.reset() and Context.reset() call (close.c's close,
 * callbacks.c's destroys of the kept streams, the memory layer's flush),
 * and around any driver call while Python callbacks are in flight
 * (CM_CU).  The methods call Python (a plugin's methods, cudamem._emm's
 * classes) with no lock held.
 */
#include "context/devctx.h"
#include "context/devattrs.h"

#include <string.h>

/* ------------------------------------------------------------------ */
/* Device                                                              */
/* ------------------------------------------------------------------ */

static int
cm_device_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(((cm_device *)self)->name);
    return 0;
}

static void
cm_device_dealloc(PyObject *self)
{
    cm_device *d = (cm_device *)self;
    PyTypeObject *tp = Py_TYPE(self);

    PyObject_GC_UnTrack(self);
    if (d->weakreflist != NULL) {
        PyObject_ClearWeakRefs(self);
    }
    Py_CLEAR(d->name);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static int
cm_devattr_cmp(const void *key, const void *item)
{
    return strcmp((const char *)key, ((const cm_devattr *)item)->name);
}

/* Attributes by numba's names: dev.MULTIPROCESSOR_COUNT and the like. */
static PyObject *
cm_device_getattro(PyObject *self, PyObject *name)
{
    PyObject *r = PyObject_GenericGetAttr(self, name);
    const cm_devattr *a;
    const char *s;
    int v = 0;

    if (r != NULL || !PyErr_ExceptionMatches(PyExc_AttributeError)) {
        return r;
    }
    s = PyUnicode_AsUTF8(name);
    if (s == NULL) {
        return NULL;
    }
    a = bsearch(s, cm_devattrs, CM_N_DEVATTRS, sizeof(cm_devattr),
                cm_devattr_cmp);
    if (a == NULL) {
        return NULL;  /* the AttributeError stays set */
    }
    PyErr_Clear();
    if (CM_CU(DeviceGetAttribute, (&v, (CUdevice_attribute)a->value,
                                   ((cm_device *)self)->handle)) < 0) {
        return NULL;
    }
    return PyLong_FromLong(v);
}

static PyObject *
cm_device_get_id(PyObject *self, void *c)
{
    (void)c;
    return PyLong_FromLong(((cm_device *)self)->id);
}

static PyObject *
cm_device_get_name(PyObject *self, void *c)
{
    (void)c;
    return Py_NewRef(((cm_device *)self)->name);
}

static PyObject *
cm_device_get_cc(PyObject *self, void *c)
{
    cm_device *d = (cm_device *)self;

    (void)c;
    return Py_BuildValue("(ii)", d->cc_major, d->cc_minor);
}

static PyObject *
cm_device_get_uuid(PyObject *self, void *c)
{
    CUuuid u;
    const unsigned char *b = (const unsigned char *)u.bytes;
    char s[64];
    int i;
    int n;

    (void)c;
    if (CM_CU(DeviceGetUuid, (&u, ((cm_device *)self)->handle)) < 0) {
        return NULL;
    }
    n = snprintf(s, sizeof(s), "GPU-");
    for (i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10) {
            s[n++] = '-';
        }
        n += snprintf(s + n, sizeof(s) - n, "%02x", b[i]);
    }
    return PyUnicode_FromStringAndSize(s, n);
}

static PyObject *
cm_device_get_fp16(PyObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(cm_device_cc_at_least((cm_device *)self, 5, 3));
}

static PyObject *
cm_device_get_bf16(PyObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(cm_device_cc_at_least((cm_device *)self, 8, 0));
}

static PyObject *
cm_device_get_fp8(PyObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(cm_device_cc_at_least((cm_device *)self, 8, 9));
}

PyDoc_STRVAR(cm_device_identity_doc,
"get_device_identity($self, /)\n--\n\n"
"The device's PCI location: a dict of pci_domain_id, pci_bus_id and "
"pci_device_id.");

static PyObject *
cm_device_get_device_identity(PyObject *self, PyObject *unused)
{
    int pci[3] = {0, 0, 0};

    (void)unused;
    if (cm_device_read_pci(((cm_device *)self)->handle, pci) < 0) {
        return NULL;
    }
    return Py_BuildValue("{sisisi}", "pci_domain_id", pci[0], "pci_bus_id",
                         pci[1], "pci_device_id", pci[2]);
}

PyDoc_STRVAR(cm_device_reset_doc,
"reset($self, /)\n--\n\n"
"Release and reset this device's primary context.  Every array, stream "
"and event made in it becomes invalid; the next call that needs the "
"device starts a fresh context.\n\n"
"Safe against other threads: calls they have in flight on the device "
"finish first; afterwards their streams, events, device arrays and "
"kernels of the old context raise ValueError (or CudaAPIError), while "
"pinned, mapped and managed arrays stay valid as ordinary host memory. "
"Frees of the old context's objects are dropped without a word.");

static PyObject *
cm_device_reset(PyObject *self, PyObject *unused)
{
    (void)unused;
    if (cm_context_release_device(((cm_device *)self)->id) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
cm_device_repr(PyObject *self)
{
    cm_device *d = (cm_device *)self;

    return PyUnicode_FromFormat("<CUDA device %d '%U'>", d->id, d->name);
}

static Py_hash_t
cm_device_hash(PyObject *self)
{
    return (Py_hash_t)((cm_device *)self)->id + 1;
}

static PyObject *
cm_device_richcompare(PyObject *a, PyObject *b, int op)
{
    int eq;

    if ((op != Py_EQ && op != Py_NE) || Py_TYPE(a) != Py_TYPE(b)) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    eq = ((cm_device *)a)->id == ((cm_device *)b)->id;
    return PyBool_FromLong(op == Py_EQ ? eq : !eq);
}

static PyGetSetDef cm_device_getset[] = {
    {"id", cm_device_get_id, NULL, "The device ordinal.", NULL},
    {"name", cm_device_get_name, NULL, "The device name.", NULL},
    {"compute_capability", cm_device_get_cc, NULL,
     "(major, minor) compute capability.", NULL},
    {"uuid", cm_device_get_uuid, NULL,
     "The device UUID, as GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.", NULL},
    {"supports_float16", cm_device_get_fp16, NULL,
     "Compute capability 5.3 or newer.", NULL},
    {"supports_bfloat16", cm_device_get_bf16, NULL,
     "Compute capability 8.0 or newer.", NULL},
    {"supports_fp8", cm_device_get_fp8, NULL,
     "Compute capability 8.9 or newer.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef cm_device_methods[] = {
    {"get_device_identity", cm_device_get_device_identity, METH_NOARGS,
     cm_device_identity_doc},
    {"reset", cm_device_reset, METH_NOARGS, cm_device_reset_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef cm_device_members[] = {
    {"__weaklistoffset__", Py_T_PYSSIZET,
     offsetof(cm_device, weakreflist), Py_READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(cm_device_doc,
"A CUDA device.  Attributes of the driver's CUdevice_attribute enum are "
"readable by their names without the CU_DEVICE_ATTRIBUTE_ prefix, for "
"example dev.MULTIPROCESSOR_COUNT.\n\n"
"Notes\n-----\n"
"get_current_device() returns this object itself, not a weak proxy: it is "
"hashable, and repr and str agree.");

static PyType_Slot cm_device_slots[] = {
    {Py_tp_doc, (void *)cm_device_doc},
    {Py_tp_dealloc, cm_device_dealloc},
    {Py_tp_traverse, cm_device_traverse},
    {Py_tp_getattro, cm_device_getattro},
    {Py_tp_repr, cm_device_repr},
    {Py_tp_str, cm_device_repr},
    {Py_tp_hash, cm_device_hash},
    {Py_tp_richcompare, cm_device_richcompare},
    {Py_tp_getset, cm_device_getset},
    {Py_tp_methods, cm_device_methods},
    {Py_tp_members, cm_device_members},
    {0, NULL},
};

PyType_Spec cm_device_spec = {
    .name = "cudamem.Device",
    .basicsize = sizeof(cm_device),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC
             | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = cm_device_slots,
};

/* ------------------------------------------------------------------ */
/* Context                                                             */
/* ------------------------------------------------------------------ */

static int
cm_context_traverse(PyObject *self, visitproc visit, void *arg)
{
    cm_context *c = (cm_context *)self;

    Py_VISIT(Py_TYPE(self));
    Py_VISIT(c->device);
    Py_VISIT(c->memory_manager);
    Py_VISIT(c->memq);
    Py_VISIT(c->ctxq);
    return 0;
}

static int
cm_context_clear(PyObject *self)
{
    cm_context *c = (cm_context *)self;

    Py_CLEAR(c->memory_manager);
    Py_CLEAR(c->memq);
    Py_CLEAR(c->ctxq);
    return 0;
}

static void
cm_context_dealloc(PyObject *self)
{
    cm_context *c = (cm_context *)self;
    PyTypeObject *tp = Py_TYPE(self);

    PyObject_GC_UnTrack(self);
    if (c->weakreflist != NULL) {
        PyObject_ClearWeakRefs(self);
    }
    cm_context_clear(self);
    if (c->mm_builtin->free != NULL) {
        c->mm_builtin->free(c);
    }
    Py_CLEAR(c->device);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyObject *
cm_context_get_device(PyObject *self, void *unused)
{
    (void)unused;
    return Py_NewRef(((cm_context *)self)->device);
}

static PyObject *
cm_context_get_handle(PyObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromVoidPtr(((cm_context *)self)->handle);
}

PyDoc_STRVAR(cm_context_get_memory_info_doc,
"get_memory_info($self, /)\n--\n\n"
"(free, total) device memory in bytes, as a MemoryInfo named tuple: the\n"
"memory manager's answer for an EMM plugin (the driver's when the\n"
"plugin's get_memory_info asks its context), else cuMemGetInfo.");

static PyObject *
cm_context_get_memory_info(PyObject *self, PyObject *unused)
{
    cm_context *c = (cm_context *)self;
    size_t free_b = 0;
    size_t total_b = 0;
    CUcontext prev;
    PyObject *r;
    int err;

    (void)unused;
    if (cm_ctx_up.mm_uses_plugin(c) && c->memory_manager != NULL
        && !c->mm_info_busy) {
        c->mm_info_busy = 1;
        r = PyObject_CallMethod(c->memory_manager, "get_memory_info", NULL);
        c->mm_info_busy = 0;
        return r;
    }
    if (cm_context_enter(c, &prev) < 0) {
        return NULL;
    }
    err = CM_CU(MemGetInfo, (&free_b, &total_b));
    cm_context_leave(c, prev);
    if (err < 0) {
        return NULL;
    }
    if (CM_REGISTERED(MemoryInfo) == NULL) {
        return NULL;
    }
    return PyObject_CallFunction(cm_st->MemoryInfo, "nn", (Py_ssize_t)free_b,
                                 (Py_ssize_t)total_b);
}

PyDoc_STRVAR(cm_context_synchronize_doc,
"synchronize($self, /)\n--\n\n"
"Wait, with the GIL released, until all work in this context is done.");

static PyObject *
cm_context_synchronize(PyObject *self, PyObject *unused)
{
    cm_context *c = (cm_context *)self;
    CUcontext prev;
    unsigned long ticket;
    int err;

    (void)unused;
    if (cm_capture_refuse_ctx("Context.synchronize()") < 0
        || cm_context_enter(c, &prev) < 0) {
        return NULL;
    }
    ticket = cm_ctx_sync_begin(c);
    CM_CU_NOGIL(err, CtxSynchronize, ());
    cm_context_leave(c, prev);
    if (err < 0) {
        return NULL;
    }
    cm_ctx_sync_end(c, ticket);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cm_context_reset_doc,
"reset($self, /)\n--\n\n"
"Wait for the context's work and run its pending deallocations now "
"(even inside defer_cleanup()); destroy the idle streams it keeps for "
"reuse.");

static PyObject *
cm_context_reset(PyObject *self, PyObject *unused)
{
    cm_context *c = (cm_context *)self;
    PyObject *r = cm_context_synchronize(self, unused);
    int dm;
    int dc;

    if (r == NULL) {
        return NULL;
    }
    Py_DECREF(r);
    if (c->memory_manager != NULL) {
        r = PyObject_CallMethod(c->memory_manager, "reset", NULL);
        if (r == NULL) {
            return NULL;
        }
        Py_DECREF(r);
    }
    dm = cm_ctx_up.pending_hold(c->memq, 0);
    dc = cm_ctx_up.pending_hold(c->ctxq, 0);
    r = cm_ctx_up.ctx_flush(c) < 0 ? NULL : Py_NewRef(Py_None);
    cm_ctx_up.pending_hold(c->memq, dm);
    cm_ctx_up.pending_hold(c->ctxq, dc);
    if (c->alive) {
        cm_stream_cache_clear(c);
    }
    return r;
}

static PyObject *
cm_context_get_deallocations(PyObject *self, void *unused)
{
    (void)unused;
    return Py_NewRef(((cm_context *)self)->ctxq);
}

static PyObject *
cm_context_get_memq(PyObject *self, void *unused)
{
    (void)unused;
    return Py_NewRef(((cm_context *)self)->memq);
}

static PyObject *
cm_context_get_memory_manager(PyObject *self, void *unused)
{
    cm_context *c = (cm_context *)self;
    PyObject *cls;

    (void)unused;
    if (c->memory_manager == NULL) {
        cls = c->mm == cm_ctx_up.mm_pool
                  ? CM_REGISTERED(PoolMemoryManager)
              : c->mm == cm_ctx_up.mm_async
                  ? CM_REGISTERED(AsyncMemoryManager)
                  : CM_REGISTERED(DefaultMemoryManager);
        if (cls == NULL) {
            return NULL;
        }
        c->memory_manager = PyObject_CallOneArg(cls, self);
        if (c->memory_manager == NULL) {
            return NULL;
        }
    }
    return Py_NewRef(c->memory_manager);
}

/* memory_manager = value, as numba's tests do on a live context: the
 * next allocation goes to value.  cudamem._emm._manager_kind (registered
 * as manager_kind) checks value and names its kind: "plugin", or that of a built-in manager of
 * this context, which must be the kind the context was made with. */
static int
cm_context_set_memory_manager(PyObject *self, PyObject *value, void *unused)
{
    const cm_mm_ops *const builtins[] = {
        cm_ctx_up.mm_default, cm_ctx_up.mm_pool, cm_ctx_up.mm_async,
    };
    cm_context *c = (cm_context *)self;
    PyObject *fn;
    PyObject *kind;
    const cm_mm_ops *mm = NULL;
    size_t i;

    (void)unused;
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError,
                        "cannot delete memory_manager");
        return -1;
    }
    fn = CM_REGISTERED(manager_kind);
    if (fn == NULL) {
        return -1;
    }
    kind = PyObject_CallFunctionObjArgs(fn, self, value, NULL);
    if (kind == NULL) {
        return -1;
    }
    if (PyUnicode_Check(kind)
        && PyUnicode_CompareWithASCIIString(kind, "plugin") == 0) {
        mm = cm_ctx_up.mm_plugin;
    }
    for (i = 0; PyUnicode_Check(kind) && i < 3; i++) {
        if (PyUnicode_CompareWithASCIIString(kind, builtins[i]->name)
            == 0) {
            mm = builtins[i];
        }
    }
    Py_DECREF(kind);
    if (mm != cm_ctx_up.mm_plugin && mm != c->mm_builtin) {
        PyErr_SetString(PyExc_ValueError,
                        "a built-in memory manager can only be given back "
                        "to the context it belongs to, of the kind the "
                        "context was made with");
        return -1;
    }
    c->mm = mm;
    /* A plugin is initialised when the context is next prepared, before
     * anything is allocated through it (numba's prepare_for_use). */
    c->mm_init_pending = mm == cm_ctx_up.mm_plugin;
    Py_XSETREF(c->memory_manager, Py_NewRef(value));
    return 0;
}

PyDoc_STRVAR(cm_context_push_doc,
"push($self, /)\n--\n\nPush this context on the calling thread's stack.");

static PyObject *
cm_context_push(PyObject *self, PyObject *unused)
{
    cm_context *c = (cm_context *)self;

    (void)unused;
    if (!c->alive) {
        return cm_context_activate(c) < 0 ? NULL : Py_None;
    }
    if (CM_CU(CtxPushCurrent, (c->handle)) < 0
        || cm_ctx_up.mm_prepare(c) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cm_context_pop_doc,
"pop($self, /)\n--\n\n"
"Pop this context from the calling thread's stack; it must be on top.");

static PyObject *
cm_context_pop(PyObject *self, PyObject *unused)
{
    CUcontext cur = NULL;
    CUcontext popped = NULL;

    (void)unused;
    if (CM_CU(CtxGetCurrent, (&cur)) < 0) {
        return NULL;
    }
    if (cur != ((cm_context *)self)->handle) {
        PyErr_SetString(PyExc_RuntimeError,
                        "pop(): this context is not the current one");
        return NULL;
    }
    if (CM_CU(CtxPopCurrent, (&popped)) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cm_context_memalloc_doc,
"memalloc($self, size, /)\n--\n\n"
"Allocate size bytes of device memory in this context through its "
"memory manager.  The returned owner (a DeviceAllocation for the default "
"manager, whatever a plugin's memalloc returns) releases the memory when "
"it goes away.");

static PyObject *
cm_context_memalloc(PyObject *self, PyObject *arg)
{
    Py_ssize_t n = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    CUdeviceptr p;

    if (n == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (n <= 0) {
        PyErr_Format(PyExc_ValueError,
                     "memalloc size must be positive, got %zd", n);
        return NULL;
    }
    return cm_ctx_up.mem_alloc((cm_context *)self, (size_t)n, &p);
}

/* A peer argument: a Context, a Device or an ordinal; its Context
 * (borrowed, retained) or NULL with an exception. */
static cm_context *
cm_peer_arg(PyObject *arg)
{
    if (PyObject_TypeCheck(arg, cm_st->Context_type)) {
        return (cm_context *)arg;
    }
    return cm_context_of_device(arg);
}

PyDoc_STRVAR(cm_context_can_access_peer_doc,
"can_access_peer($self, peer_device, /)\n--\n\n"
"Whether this context's device can map the memory of device "
"peer_device (an ordinal or a Device): cuDeviceCanAccessPeer.");

static PyObject *
cm_context_can_access_peer_meth(PyObject *self, PyObject *arg)
{
    int i;
    int r;

    if (cm_driver_ensure() < 0) {
        return NULL;
    }
    i = PyObject_TypeCheck(arg, cm_st->Device_type) ? ((cm_device *)arg)->id
                                                     : cm_device_arg(arg);
    if (i < 0) {
        return NULL;
    }
    r = cm_context_can_access_peer((cm_context *)self, i);
    return r < 0 ? NULL : PyBool_FromLong(r);
}

PyDoc_STRVAR(cm_context_enable_peer_access_doc,
"enable_peer_access($self, peer_context, flags=0, /)\n--\n\n"
"Let this context map the memory of peer_context (a Context, a Device or "
"an ordinal).  Enabling twice is not an error.  ValueError when the "
"devices have no peer access.\n\n"
"Notes\n-----\n"
"numba takes only a context handle and raises "
"CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED the second time.");

static PyObject *
cm_context_enable_peer_access_meth(PyObject *self, PyObject *const *args,
                                   Py_ssize_t nargs)
{
    cm_context *peer;
    long flags = 0;

    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError,
                     "enable_peer_access() takes 1 or 2 arguments "
                     "(%zd given)", nargs);
        return NULL;
    }
    if (nargs == 2) {
        flags = PyLong_AsLong(args[1]);
        if (flags == -1 && PyErr_Occurred()) {
            return NULL;
        }
        if (flags != 0) {
            PyErr_SetString(PyExc_ValueError,
                            "flags is reserved and must be 0");
            return NULL;
        }
    }
    peer = cm_peer_arg(args[0]);
    if (peer == NULL) {
        return NULL;
    }
    if (peer == (cm_context *)self) {
        PyErr_Format(PyExc_ValueError,
                     "enable_peer_access: device %d is this context's own "
                     "device", peer->device->id);
        return NULL;
    }
    if (cm_context_enable_peer((cm_context *)self, peer) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
cm_context_repr(PyObject *self)
{
    cm_context *c = (cm_context *)self;

    return PyUnicode_FromFormat("<CUDA context %p of device %d>",
                                (void *)c->handle, c->device->id);
}

static Py_hash_t
cm_context_hash(PyObject *self)
{
    Py_hash_t h = (Py_hash_t)((uintptr_t)((cm_context *)self)->handle >> 4);

    return h == -1 ? -2 : h;
}

static PyObject *
cm_context_richcompare(PyObject *a, PyObject *b, int op)
{
    int eq;

    if ((op != Py_EQ && op != Py_NE) || Py_TYPE(a) != Py_TYPE(b)) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    eq = ((cm_context *)a)->handle == ((cm_context *)b)->handle;
    return PyBool_FromLong(op == Py_EQ ? eq : !eq);
}

static PyGetSetDef cm_context_getset[] = {
    {"device", cm_context_get_device, NULL, "The context's Device.", NULL},
    {"handle", cm_context_get_handle, NULL,
     "The CUcontext, as an int address.", NULL},
    {"deallocations", cm_context_get_deallocations, NULL,
     "The queue of pending stream, event and module destroys.", NULL},
    {"_memory_deallocations", cm_context_get_memq, NULL,
     "The queue of pending memory frees (its memory manager's).", NULL},
    {"memory_manager", cm_context_get_memory_manager,
     cm_context_set_memory_manager,
     "The context's memory manager; assigning an EMM plugin object sends "
     "the allocations that follow to it.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef cm_context_methods[] = {
    {"get_memory_info", cm_context_get_memory_info, METH_NOARGS,
     cm_context_get_memory_info_doc},
    {"synchronize", cm_context_synchronize, METH_NOARGS,
     cm_context_synchronize_doc},
    {"reset", cm_context_reset, METH_NOARGS, cm_context_reset_doc},
    {"push", cm_context_push, METH_NOARGS, cm_context_push_doc},
    {"memalloc", cm_context_memalloc, METH_O, cm_context_memalloc_doc},
    {"can_access_peer", cm_context_can_access_peer_meth, METH_O,
     cm_context_can_access_peer_doc},
    {"enable_peer_access",
     (PyCFunction)(void (*)(void))cm_context_enable_peer_access_meth,
     METH_FASTCALL, cm_context_enable_peer_access_doc},
    {"pop", cm_context_pop, METH_NOARGS, cm_context_pop_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef cm_context_members[] = {
    {"__weaklistoffset__", Py_T_PYSSIZET,
     offsetof(cm_context, weakreflist), Py_READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(cm_context_doc,
"A device's primary CUDA context, as cudamem uses it.  Equal when the "
"handles are equal.");

static PyType_Slot cm_context_slots[] = {
    {Py_tp_doc, (void *)cm_context_doc},
    {Py_tp_dealloc, cm_context_dealloc},
    {Py_tp_traverse, cm_context_traverse},
    {Py_tp_clear, cm_context_clear},
    {Py_tp_repr, cm_context_repr},
    {Py_tp_hash, cm_context_hash},
    {Py_tp_richcompare, cm_context_richcompare},
    {Py_tp_getset, cm_context_getset},
    {Py_tp_methods, cm_context_methods},
    {Py_tp_members, cm_context_members},
    {0, NULL},
};

PyType_Spec cm_context_spec = {
    .name = "cudamem.Context",
    .basicsize = sizeof(cm_context),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC
             | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = cm_context_slots,
};
