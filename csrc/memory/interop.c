/* SPDX-License-Identifier: MIT */
/*
 * interop.c: other GPU libraries' device allocations drawn from cudamem's
 * memory managers, and the bytes each library holds.
 *
 * Owns:
 * - ClientAllocation, the owner of one device allocation that a library
 *   (CuPy, PyTorch, numba) took through an adapter of cudamem.interop:
 *   the allocation's own owner (a DeviceAllocation, or what a plugin's
 *   memalloc returned) and the client tag it is counted under until it
 *   goes away.  Dropping it releases the memory as any cudamem
 *   allocation is released (stream-ordered for the pool manager).
 * - The per-device, per-client byte counters behind memory_stats()'s
 *   "by_client" and the out-of-memory message.
 * - CuPy's allocator, a C function over CuPy's own classes;
 * - cudamem_torch_alloc / cudamem_torch_free, the entry points of
 *   PyTorch's CUDAPluggableAllocator, exported from the extension with
 *   default visibility, and the table (address -> ClientAllocation) that
 *   the free entry point looks up.
 *
 * Locking: the GIL guards the counters, the table and the last PyTorch
 * error.  The PyTorch entry points take it with PyGILState_Ensure, since
 * PyTorch calls them from any thread, with or without it; they never
 * leave an exception set and do nothing once the interpreter finalises.
 * The type, table and error live in statics rather than the module state
 * because the entry points are called with no module at hand; the module
 * can be loaded once per process only.
 */
#include "memory/memory.h"

/* The libraries an allocation can be tagged with (the "cudamem" entry of
 * by_client is the rest of the context's allocated bytes). */
enum {
    CM_CLIENT_CUPY = 0,
    CM_CLIENT_TORCH,
    CM_CLIENT_NUMBA,
    CM_CLIENT_N
};

static const char *const cm_client_names[CM_CLIENT_N] = {
    "cupy", "torch", "numba",
};

/* [device][client]: bytes held by live ClientAllocations.  NOTE: guarded
 * by the GIL. */
static size_t cm_client_bytes[CM_MAX_DEVICES][CM_CLIENT_N];

/* The ClientAllocation type, the address -> ClientAllocation table of
 * cudamem_torch_free and the last failed cudamem_torch_alloc's exception:
 * fields of the module state (cm.h), which says how they are guarded. */
#define cm_client_type (cm_st->client_type)
#define cm_torch_table (cm_st->torch_table)
#define cm_torch_error (cm_st->torch_error)

/* One device allocation held by another library. */
typedef struct {
    PyObject_HEAD
    PyObject *mem;        /* strong: the allocation's owner */
    CUdeviceptr ptr;      /* its device address */
    size_t size;          /* bytes counted for it */
    int device;           /* device ordinal it is counted on */
    int client;           /* CM_CLIENT_* */
    PyObject *weakreflist;
} cm_client_mem;

/* ------------------------------------------------------------------ */
/* ClientAllocation                                                    */
/* ------------------------------------------------------------------ */

static int
cm_client_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(((cm_client_mem *)self)->mem);
    return 0;
}

static int
cm_client_clear(PyObject *self)
{
    Py_CLEAR(((cm_client_mem *)self)->mem);
    return 0;
}

static void
cm_client_dealloc(PyObject *self)
{
    cm_client_mem *c = (cm_client_mem *)self;
    PyTypeObject *tp = Py_TYPE(self);
    PyObject *exc = PyErr_GetRaisedException();
    size_t *slot;

    PyObject_GC_UnTrack(self);
    if (c->weakreflist != NULL) {
        PyObject_ClearWeakRefs(self);
    }
    if (c->device >= 0 && c->device < CM_MAX_DEVICES) {
        slot = &cm_client_bytes[c->device][c->client];
        *slot = *slot >= c->size ? *slot - c->size : 0;
    }
    Py_CLEAR(c->mem);
    tp->tp_free(self);
    Py_DECREF(tp);
    PyErr_SetRaisedException(exc);
}

static PyObject *
cm_client_get_ptr(PyObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromUnsignedLongLong(((cm_client_mem *)self)->ptr);
}

static PyObject *
cm_client_get_size(PyObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromSize_t(((cm_client_mem *)self)->size);
}

static PyObject *
cm_client_get_device(PyObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromLong(((cm_client_mem *)self)->device);
}

static PyObject *
cm_client_get_client(PyObject *self, void *unused)
{
    (void)unused;
    return PyUnicode_FromString(
        cm_client_names[((cm_client_mem *)self)->client]);
}

static PyObject *
cm_client_get_memory(PyObject *self, void *unused)
{
    cm_client_mem *c = (cm_client_mem *)self;

    (void)unused;
    return Py_NewRef(c->mem != NULL ? c->mem : Py_None);
}

static PyGetSetDef cm_client_getset[] = {
    {"ptr", cm_client_get_ptr, NULL, "The device address, as an int.",
     NULL},
    {"device_pointer", cm_client_get_ptr, NULL,
     "The device address, as an int.", NULL},
    {"size", cm_client_get_size, NULL, "The size in bytes.", NULL},
    {"device", cm_client_get_device, NULL, "The device ordinal.", NULL},
    {"client", cm_client_get_client, NULL,
     "The library it is counted for (\"cupy\", \"torch\", \"numba\").",
     NULL},
    {"memory", cm_client_get_memory, NULL,
     "The cudamem allocation it keeps alive.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef cm_client_members[] = {
    {"__weaklistoffset__", Py_T_PYSSIZET,
     offsetof(cm_client_mem, weakreflist), Py_READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(cm_client_doc,
"Device memory from a cudamem memory manager that another library (CuPy, "
"PyTorch, numba) holds through a cudamem.interop adapter.  "
"memory_stats()['by_client'] counts it for that library until this "
"object goes away, which releases the memory.");

static PyType_Slot cm_client_slots[] = {
    {Py_tp_doc, (void *)cm_client_doc},
    {Py_tp_dealloc, cm_client_dealloc},
    {Py_tp_traverse, cm_client_traverse},
    {Py_tp_clear, cm_client_clear},
    {Py_tp_getset, cm_client_getset},
    {Py_tp_members, cm_client_members},
    {0, NULL},
};

static PyType_Spec cm_client_spec = {
    .name = "cudamem.ClientAllocation",
    .basicsize = sizeof(cm_client_mem),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC
             | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = cm_client_slots,
};

/* ------------------------------------------------------------------ */
/* Allocation                                                          */
/* ------------------------------------------------------------------ */

/* size bytes for client from the manager of device's context (dev: an
 * ordinal or Device; NULL: the current context) for stream.  A new
 * ClientAllocation, or NULL with an exception. */
static PyObject *
cm_client_alloc(PyObject *dev, size_t size, CUstream stream, int client)
{
    cm_context *ctx;
    cm_client_mem *c;
    PyObject *mem;
    CUdeviceptr p = 0;
    int id;

    ctx = dev == NULL ? cm_context_current() : cm_context_of_device(dev);
    if (ctx == NULL) {
        return NULL;
    }
    id = ctx->device->id;
    mem = cm_mem_alloc_on(ctx, size, stream, &p);
    if (mem == NULL) {
        return NULL;
    }
    c = PyObject_GC_New(cm_client_mem, cm_client_type);
    if (c == NULL) {
        Py_DECREF(mem);
        return NULL;
    }
    c->mem = mem;  /* the new reference moves into c */
    c->ptr = p;
    c->size = size;
    c->device = id;
    c->client = client;
    c->weakreflist = NULL;
    if (id >= 0 && id < CM_MAX_DEVICES) {
        cm_client_bytes[id][client] += size;
    }
    PyObject_GC_Track(c);
    return (PyObject *)c;
}

PyDoc_STRVAR(cm_client_alloc_doc,
"_client_alloc(device, size, stream_handle, client, /)\n--\n\n"
"size bytes from the memory manager of device's context (an ordinal, or "
"None: the current context) for the stream with that raw handle (0: the "
"default stream), counted for client (0 cupy, 1 torch, 2 numba); a "
"ClientAllocation.");

static PyObject *
cm_client_alloc_fn(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t size;
    unsigned long long h;
    long client;

    (void)mod;
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError,
                     "_client_alloc() takes 4 arguments (%zd given)", nargs);
        return NULL;
    }
    size = PyNumber_AsSsize_t(args[1], PyExc_OverflowError);
    if (size == -1 && PyErr_Occurred()) {
        return NULL;
    }
    h = PyLong_AsUnsignedLongLong(args[2]);
    if (h == (unsigned long long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    client = PyLong_AsLong(args[3]);
    if (client == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (size <= 0) {
        PyErr_Format(PyExc_ValueError,
                     "allocation size must be positive, got %zd", size);
        return NULL;
    }
    if (client < 0 || client >= CM_CLIENT_N) {
        PyErr_Format(PyExc_ValueError, "unknown client %ld", client);
        return NULL;
    }
    return cm_client_alloc(args[0] == Py_None ? NULL : args[0],
                           (size_t)size, (CUstream)(uintptr_t)h,
                           (int)client);
}

/* ------------------------------------------------------------------ */
/* Statistics                                                          */
/* ------------------------------------------------------------------ */

PyObject *
cm_interop_by_client(cm_context *ctx)
{
    PyObject *d = PyDict_New();
    PyObject *v;
    size_t tagged = 0;
    size_t held;
    int id = ctx->device->id;
    int i;

    if (d == NULL) {
        return NULL;
    }
    for (i = 0; i < CM_CLIENT_N; i++) {
        held = id >= 0 && id < CM_MAX_DEVICES ? cm_client_bytes[id][i] : 0;
        tagged += held;
    }
    v = PyLong_FromSize_t(ctx->st_bytes > tagged ? ctx->st_bytes - tagged
                                                 : 0);
    if (v == NULL || PyDict_SetItemString(d, "cudamem", v) < 0) {
        goto err;
    }
    Py_DECREF(v);
    for (i = 0; i < CM_CLIENT_N; i++) {
        held = id >= 0 && id < CM_MAX_DEVICES ? cm_client_bytes[id][i] : 0;
        v = PyLong_FromSize_t(held);
        if (v == NULL || PyDict_SetItemString(d, cm_client_names[i], v) < 0) {
            goto err;
        }
        Py_DECREF(v);
    }
    return d;

err:
    Py_XDECREF(v);
    Py_DECREF(d);
    return NULL;
}

int
cm_interop_oom_note(cm_context *ctx, PyObject *exc)
{
    PyObject *by = cm_interop_by_client(ctx);
    PyObject *msg = NULL;
    PyObject *note = NULL;
    PyObject *parts = NULL;
    PyObject *sep = NULL;
    PyObject *joined = NULL;
    int id = ctx->device->id;
    int any = 0;
    int r = -1;
    int i;

    if (by == NULL || PyObject_SetAttrString(exc, "by_client", by) < 0) {
        goto out;
    }
    parts = PyList_New(0);
    if (parts == NULL) {
        goto out;
    }
    for (i = 0; i < CM_CLIENT_N; i++) {
        size_t held = id >= 0 && id < CM_MAX_DEVICES
                          ? cm_client_bytes[id][i] : 0;
        PyObject *s;

        if (held == 0) {
            continue;
        }
        any = 1;
        s = PyUnicode_FromFormat("%s %zu bytes", cm_client_names[i], held);
        if (s == NULL || PyList_Append(parts, s) < 0) {
            Py_XDECREF(s);
            goto out;
        }
        Py_DECREF(s);
    }
    if (!any) {
        r = 0;
        goto out;
    }
    msg = PyObject_GetAttrString(exc, "msg");
    sep = PyUnicode_FromString(", ");
    if (msg == NULL || sep == NULL) {
        goto out;
    }
    joined = PyUnicode_Join(sep, parts);
    if (joined == NULL) {
        goto out;
    }
    note = PyUnicode_FromFormat("%U; held through cudamem by other "
                                "libraries: %U", msg, joined);
    if (note == NULL || PyObject_SetAttrString(exc, "msg", note) < 0) {
        goto out;
    }
    r = 0;

out:
    Py_XDECREF(by);
    Py_XDECREF(msg);
    Py_XDECREF(note);
    Py_XDECREF(parts);
    Py_XDECREF(sep);
    Py_XDECREF(joined);
    return r;
}

PyDoc_STRVAR(cm_client_stats_doc,
"_client_stats(device=None, /)\n--\n\n"
"The bytes each library holds through cudamem on the device (default: "
"the current context's): memory_stats()['by_client'].");

static PyObject *
cm_client_stats_fn(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    cm_context *ctx;

    (void)mod;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError,
                        "_client_stats() takes at most one argument");
        return NULL;
    }
    ctx = nargs == 1 && args[0] != Py_None ? cm_context_of_device(args[0])
                                           : cm_context_current();
    if (ctx == NULL) {
        return NULL;
    }
    return cm_interop_by_client(ctx);
}

/* ------------------------------------------------------------------ */
/* CuPy's allocator                                                    */
/* ------------------------------------------------------------------ */

/* CuPy's allocator (what cupy.cuda.set_allocator calls with a size): size
 * bytes for CuPy's current stream from the current context's manager,
 * counted for CuPy, as a cupy.cuda.MemoryPointer over an UnownedMemory
 * that keeps the ClientAllocation.  self is the tuple that
 * _cupy_allocator made: (cupy.cuda.get_current_stream,
 * cupy.cuda.UnownedMemory, cupy.cuda.MemoryPointer).  In C so that an
 * allocation costs CuPy's own calls and no Python frame. */
static PyObject *
cm_cupy_malloc(PyObject *self, PyObject *arg)
{
    PyObject *get_stream = PyTuple_GET_ITEM(self, 0);
    PyObject *unowned = PyTuple_GET_ITEM(self, 1);
    PyObject *memptr = PyTuple_GET_ITEM(self, 2);
    PyObject *owner = NULL;
    PyObject *st = NULL;
    PyObject *sp = NULL;
    PyObject *a[4] = {NULL, NULL, NULL, NULL};
    PyObject *mem = NULL;
    PyObject *r = NULL;
    cm_context *ctx;
    CUstream stream;
    CUdeviceptr ptr = 0;
    Py_ssize_t size = PyNumber_AsSsize_t(arg, PyExc_OverflowError);

    if (size == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (size < 0) {
        PyErr_Format(PyExc_ValueError, "negative allocation size %zd",
                     size);
        return NULL;
    }
    ctx = cm_context_current();
    if (ctx == NULL) {
        return NULL;
    }
    if (size > 0) {
        st = PyObject_CallNoArgs(get_stream);
        sp = st == NULL ? NULL : PyObject_GetAttr(st, cm_st->str_ptr);
        if (sp == NULL) {
            goto out;
        }
        stream = (CUstream)PyLong_AsVoidPtr(sp);
        if (stream == NULL && PyErr_Occurred()) {
            goto out;
        }
        owner = cm_client_alloc(NULL, (size_t)size, stream, CM_CLIENT_CUPY);
        if (owner == NULL) {
            goto out;
        }
        ptr = ((cm_client_mem *)owner)->ptr;
    }
    a[0] = PyLong_FromUnsignedLongLong(ptr);
    a[1] = PyLong_FromSsize_t(size);
    a[2] = owner != NULL ? owner : Py_None;
    a[3] = PyLong_FromLong(ctx->device->id);
    if (a[0] == NULL || a[1] == NULL || a[3] == NULL) {
        goto out;
    }
    mem = PyObject_Vectorcall(unowned, a, 4, NULL);
    if (mem == NULL) {
        goto out;
    }
    Py_SETREF(a[1], PyLong_FromLong(0));
    if (a[1] == NULL) {
        goto out;
    }
    {
        PyObject *b[2] = {mem, a[1]};

        r = PyObject_Vectorcall(memptr, b, 2, NULL);
    }

out:
    Py_XDECREF(a[0]);
    Py_XDECREF(a[1]);
    Py_XDECREF(a[3]);
    Py_XDECREF(mem);
    Py_XDECREF(owner);
    Py_XDECREF(sp);
    Py_XDECREF(st);
    return r;
}

static PyMethodDef cm_cupy_malloc_def = {
    "cupy_malloc", cm_cupy_malloc, METH_O,
    "cupy_malloc(size, /)\n--\n\n"
    "CuPy's allocator installed by cudamem.interop.use_with_cupy(): size "
    "bytes for CuPy's current stream from the current context's cudamem "
    "memory manager, counted for CuPy; a cupy.cuda.MemoryPointer.",
};

PyDoc_STRVAR(cm_cupy_allocator_doc,
"_cupy_allocator(get_current_stream, UnownedMemory, MemoryPointer, /)\n"
"--\n\n"
"CuPy's allocator over cudamem, made in C around CuPy's own "
"cupy.cuda.get_current_stream, cupy.cuda.UnownedMemory and "
"cupy.cuda.MemoryPointer (passed in: cudamem imports no library).");

static PyObject *
cm_cupy_allocator_fn(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *t;
    PyObject *f;
    Py_ssize_t i;

    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError,
                     "_cupy_allocator() takes 3 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    for (i = 0; i < 3; i++) {
        if (!PyCallable_Check(args[i])) {
            PyErr_Format(PyExc_TypeError,
                         "_cupy_allocator() argument %zd must be callable, "
                         "not %.100s", i + 1, Py_TYPE(args[i])->tp_name);
            return NULL;
        }
    }
    t = PyTuple_New(3);
    if (t == NULL) {
        return NULL;
    }
    for (i = 0; i < 3; i++) {
        PyTuple_SET_ITEM(t, i, Py_NewRef(args[i]));
    }
    (void)mod;
    f = PyCFunction_NewEx(&cm_cupy_malloc_def, t, NULL);
    Py_DECREF(t);
    return f;
}

/* ------------------------------------------------------------------ */
/* PyTorch's pluggable allocator                                       */
/* ------------------------------------------------------------------ */

#define CM_EXPORT __attribute__((visibility("default")))

CM_EXPORT void *cudamem_torch_alloc(size_t size, int device,
                                    CUstream stream);
CM_EXPORT void cudamem_torch_free(void *ptr, size_t size, int device,
                                  CUstream stream);

/* Whether Python code may run now (the module loaded, not finalising). */
static int
cm_interop_python_ok(void)
{
    return Py_IsInitialized() && !Py_IsFinalizing() && cm_st != NULL
           && cm_torch_table != NULL;
}

/* PyTorch's alloc: size bytes on device for stream from that device's
 * cudamem manager, or NULL (the exception is kept for
 * _torch_last_error()). */
CM_EXPORT void *
cudamem_torch_alloc(size_t size, int device, CUstream stream)
{
    PyGILState_STATE g;
    PyObject *saved;
    PyObject *dev = NULL;
    PyObject *o = NULL;
    PyObject *key = NULL;
    void *r = NULL;

    if (size == 0 || size > (size_t)PY_SSIZE_T_MAX
        || !cm_interop_python_ok()) {
        return NULL;
    }
    g = PyGILState_Ensure();
    saved = PyErr_GetRaisedException();
    if (!cm_interop_python_ok()) {
        goto out;
    }
    if (device < 0) {
        PyErr_Format(PyExc_ValueError, "invalid device %d", device);
        goto err;
    }
    dev = PyLong_FromLong(device);
    if (dev == NULL) {
        goto err;
    }
    o = cm_client_alloc(dev, size, stream, CM_CLIENT_TORCH);
    if (o == NULL) {
        goto err;
    }
    key = PyLong_FromUnsignedLongLong(((cm_client_mem *)o)->ptr);
    if (key == NULL || PyDict_SetItem(cm_torch_table, key, o) < 0) {
        goto err;
    }
    r = (void *)(uintptr_t)((cm_client_mem *)o)->ptr;
    goto out;

err:
    Py_XSETREF(cm_torch_error, PyErr_GetRaisedException());
out:
    Py_XDECREF(dev);
    Py_XDECREF(key);
    Py_XDECREF(o);
    PyErr_SetRaisedException(saved);
    PyGILState_Release(g);
    return r;
}

/* PyTorch's free: drop the ClientAllocation of ptr (its release is
 * ordered on the stream it was allocated for).  Unknown addresses are
 * ignored. */
CM_EXPORT void
cudamem_torch_free(void *ptr, size_t size, int device, CUstream stream)
{
    PyGILState_STATE g;
    PyObject *saved;
    PyObject *key;
    PyObject *o = NULL;

    (void)size;
    (void)device;
    (void)stream;
    if (ptr == NULL || !cm_interop_python_ok()) {
        return;
    }
    g = PyGILState_Ensure();
    saved = PyErr_GetRaisedException();
    if (cm_interop_python_ok()) {
        key = PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)ptr);
        if (key != NULL) {
            o = PyDict_GetItemWithError(cm_torch_table, key);
            Py_XINCREF(o);
            if (o != NULL && PyDict_DelItem(cm_torch_table, key) < 0) {
                Py_XSETREF(cm_torch_error, PyErr_GetRaisedException());
            }
        }
        Py_XDECREF(key);
        Py_XDECREF(o);
        PyErr_Clear();
    }
    PyErr_SetRaisedException(saved);
    PyGILState_Release(g);
}

PyDoc_STRVAR(cm_torch_last_error_doc,
"_torch_last_error(clear=True, /)\n--\n\n"
"The exception of the last allocation that cudamem_torch_alloc could not "
"make (PyTorch sees only NULL), or None; cleared unless clear is false.");

static PyObject *
cm_torch_last_error_fn(PyObject *mod, PyObject *const *args,
                       Py_ssize_t nargs)
{
    PyObject *e;
    int clear = 1;

    (void)mod;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError,
                        "_torch_last_error() takes at most one argument");
        return NULL;
    }
    if (nargs == 1 && (clear = PyObject_IsTrue(args[0])) < 0) {
        return NULL;
    }
    e = cm_torch_error != NULL ? Py_NewRef(cm_torch_error)
                               : Py_NewRef(Py_None);
    if (clear) {
        Py_CLEAR(cm_torch_error);
    }
    return e;
}

PyDoc_STRVAR(cm_torch_live_doc,
"_torch_live()\n--\n\n"
"The number of allocations PyTorch holds through cudamem_torch_alloc.");

static PyObject *
cm_torch_live_fn(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    return PyLong_FromSsize_t(PyDict_GET_SIZE(cm_torch_table));
}

/* ------------------------------------------------------------------ */
/* Module init                                                         */
/* ------------------------------------------------------------------ */

static PyMethodDef cm_interop_functions[] = {
    {"_client_alloc", (PyCFunction)(void (*)(void))cm_client_alloc_fn,
     METH_FASTCALL, cm_client_alloc_doc},
    {"_client_stats", (PyCFunction)(void (*)(void))cm_client_stats_fn,
     METH_FASTCALL, cm_client_stats_doc},
    {"_torch_last_error",
     (PyCFunction)(void (*)(void))cm_torch_last_error_fn, METH_FASTCALL,
     cm_torch_last_error_doc},
    {"_torch_live", cm_torch_live_fn, METH_NOARGS, cm_torch_live_doc},
    {"_cupy_allocator", (PyCFunction)(void (*)(void))cm_cupy_allocator_fn,
     METH_FASTCALL, cm_cupy_allocator_doc},
    {NULL, NULL, 0, NULL},
};

int
cm_interop_init(PyObject *mod, cm_state *st)
{
    (void)st;
    cm_client_type = (PyTypeObject *)PyType_FromModuleAndSpec(
        mod, &cm_client_spec, NULL);
    if (cm_client_type == NULL
        || PyModule_AddObjectRef(mod, "ClientAllocation",
                                 (PyObject *)cm_client_type) < 0) {
        return -1;
    }
    if (cm_torch_table == NULL) {
        cm_torch_table = PyDict_New();
        if (cm_torch_table == NULL) {
            return -1;
        }
    }
    return PyModule_AddFunctions(mod, cm_interop_functions);
}
