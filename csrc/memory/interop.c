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
 * - _client_stats, memory_stats()'s "by_client" as a function (the
 *   counters are clients.c's);
 * - CuPy's allocator, a C function over CuPy's own classes;
 * - cudamem_torch_alloc / cudamem_torch_free, the entry points of
 *   PyTorch's CUDAPluggableAllocator, exported from the extension with
 *   default visibility, and the table (address -> ClientAllocation) that
 *   the free entry point looks up.
 *
 * Locks and the GIL: cm_lane_mu (cm_mu_lock) guards the lanes' fields,
 * cm_lanes, the address table and the contexts' lane_* counters; no
 * driver or Python call is made and no other lock is taken while it is
 * held.  The GIL guards the ClientAllocations, the client counters
 * (clients.c) and the last PyTorch error.  The PyTorch entry points are
 * called from any thread, with or without the GIL: the lane path runs
 * without it and touches no Python object (the pool manager's take and
 * release take the pool's mutex, cm_gpool_foreign the graph pools' list
 * mutex, after cm_lane_mu is let go); else they take the GIL with
 * PyGILState_Ensure, as does the drop of a retired lane's context, never
 * leave an exception set, and do nothing once the interpreter finalises.
 * The lanes and the table live in statics, not in the module state, since
 * the entry points are called with no module at hand; the module can be
 * loaded once per process only.
 */
#include "memory/memory.h"
#include "memory/clients.h"
#include "memory/pool/graph/graph.h"

/* The ClientAllocation type, the address -> ClientAllocation table of
 * cudamem_torch_free and the last failed cudamem_torch_alloc's exception:
 * fields of the module state (driver/driver.h), which says how they
 * are guarded. */
#define cm_client_type (cm_st->client_type)
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
    /* The library may be capturing on this thread: its free is relaxed
     * (context.h, cm_capture_relax). */
    cm_capture_adapter_depth++;
    Py_CLEAR(c->mem);
    cm_capture_adapter_depth--;
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

/* size bytes for client from the manager of ctx for stream.  A new
 * ClientAllocation, or NULL with an exception. */
static PyObject *
cm_client_alloc(cm_context *ctx, size_t size, CUstream stream, int client)
{
    cm_client_mem *c;
    PyObject *mem;
    CUdeviceptr p = 0;
    int id;

    id = ctx->device->id;
    /* From the peers' pool where the pool is on virtual memory: the
     * library may export it with cuIpcGetMemHandle. */
    cm_mm_for_peer++;
    mem = cm_mem_alloc_on(ctx, size, stream, &p);
    cm_mm_for_peer--;
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

/* Keep the object stream_obj (CuPy's Stream) that the allocation owner
 * was made for alive until the memory is released: CuPy destroys a
 * stream when its object goes, possibly before the memory made for it,
 * whose release orders itself after that stream. */
static void
cm_client_keep_stream(PyObject *owner, PyObject *stream_obj)
{
    cm_client_mem *c = (cm_client_mem *)owner;
    cm_mem *m;

    if (c->mem == NULL || !Py_IS_TYPE(c->mem, cm_st->Mem_type)) {
        return;                       /* a plugin's pointer object */
    }
    m = (cm_mem *)c->mem;
    if (m->stream_obj == NULL && !cm_stream_handle_is_default(m->stream)) {
        m->stream_obj = Py_NewRef(stream_obj);
    }
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
    cm_context *ctx;
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
    ctx = args[0] == Py_None ? cm_context_current()
                             : cm_context_of_device(args[0]);
    if (ctx == NULL) {
        return NULL;
    }
    return cm_client_alloc(ctx, (size_t)size, (CUstream)(uintptr_t)h,
                           (int)client);
}

/* ------------------------------------------------------------------ */
/* Statistics                                                          */
/* ------------------------------------------------------------------ */

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
        /* During CuPy's own capture of its stream: the capture's graph
         * pool (memory/pool/graph/gpool.c). */
        cm_gpool_force(cm_gpool_foreign(ctx, stream));
        cm_capture_adapter_depth++;
        owner = cm_client_alloc(ctx, (size_t)size, stream, CM_CLIENT_CUPY);
        cm_capture_adapter_depth--;
        cm_gpool_force(NULL);
        if (owner == NULL) {
            goto out;
        }
        ptr = ((cm_client_mem *)owner)->ptr;
        cm_client_keep_stream(owner, st);
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
/* PyTorch's allocations: the lanes and the table                      */
/* ------------------------------------------------------------------ */

/* A lane: cudamem's context of one device whose manager allocates
 * without the GIL (mm->take: the pool manager), from which
 * cudamem_torch_alloc takes blocks, and to which cudamem_torch_free
 * gives them back, with no Python object and no GIL.  It outlives its
 * context's close or reset while entries of the table name it: they
 * are dropped then (the pool is dead), never used. */
typedef struct {
    cm_context *ctx;      /* strong; taken and dropped with the GIL */
    int retired;          /* no longer cm_lanes[its device] */
    size_t holds;         /* table entries and calls in flight that use
                           * it; the last to let go of a retired lane
                           * frees it */
} cm_lane;

/* One allocation PyTorch holds. */
typedef struct {
    uintptr_t ptr;        /* its address, the key; 0: an empty slot */
    size_t size;          /* the bytes PyTorch asked for */
    CUstream stream;      /* the stream it was allocated for */
    cm_lane *lane;        /* the lane it came from, with the manager's
                           * release handle: */
    uintptr_t handle;
    PyObject *obj;        /* else its ClientAllocation (strong; the GIL
                           * drops it) */
} cm_torch_ent;

/* Guards the lanes' fields, cm_lanes, the table and the lane_* counters
 * of contexts.  No driver call and no Python call is made while it is
 * held. */
static pthread_mutex_t cm_lane_mu = PTHREAD_MUTEX_INITIALIZER;
static cm_lane *cm_lanes[CM_MAX_DEVICES];
/* The table: open addressing, linear probing, capacity a power of two
 * (0 before the first entry), at most half full. */
static cm_torch_ent *cm_torch_tab;
static size_t cm_torch_cap;
static size_t cm_torch_n;

/* Whether the extension is ready for the entry points (set once). */
static int cm_interop_ready;

static size_t
cm_torch_home(uintptr_t ptr)
{
    return (size_t)(((uint64_t)ptr * 0x9E3779B97F4A7C15ull) >> 32)
           & (cm_torch_cap - 1);
}

/* Add e (lane mutex held); 0, or -1 when out of host memory. */
static int
cm_torch_put(const cm_torch_ent *e)
{
    size_t i;

    if ((cm_torch_n + 1) * 2 > cm_torch_cap) {
        size_t cap = cm_torch_cap ? cm_torch_cap * 2 : 64;
        cm_torch_ent *old = cm_torch_tab;
        size_t oldcap = cm_torch_cap;
        cm_torch_ent *t = calloc(cap, sizeof(*t));
        size_t k;

        if (t == NULL) {
            return -1;
        }
        cm_torch_tab = t;
        cm_torch_cap = cap;
        for (k = 0; k < oldcap; k++) {
            if (old[k].ptr != 0) {
                for (i = cm_torch_home(old[k].ptr); t[i].ptr != 0;
                     i = (i + 1) & (cap - 1)) {
                }
                t[i] = old[k];
            }
        }
        free(old);
    }
    for (i = cm_torch_home(e->ptr); cm_torch_tab[i].ptr != 0;
         i = (i + 1) & (cm_torch_cap - 1)) {
    }
    cm_torch_tab[i] = *e;
    cm_torch_n++;
    return 0;
}

/* The slot of ptr, or -1 (lane mutex held). */
static long
cm_torch_find(uintptr_t ptr)
{
    size_t i;

    if (cm_torch_cap == 0) {
        return -1;
    }
    for (i = cm_torch_home(ptr); cm_torch_tab[i].ptr != 0;
         i = (i + 1) & (cm_torch_cap - 1)) {
        if (cm_torch_tab[i].ptr == ptr) {
            return (long)i;
        }
    }
    return -1;
}

/* Empty slot i, moving back the entries after it that probed past it
 * (lane mutex held). */
static void
cm_torch_drop_slot(size_t i)
{
    size_t mask = cm_torch_cap - 1;
    size_t j = i;
    size_t k;

    for (;;) {
        j = (j + 1) & mask;
        if (cm_torch_tab[j].ptr == 0) {
            break;
        }
        k = cm_torch_home(cm_torch_tab[j].ptr);
        /* The entry at j stays when its home lies cyclically in (i, j]. */
        if (i <= j ? (i < k && k <= j) : (i < k || k <= j)) {
            continue;
        }
        cm_torch_tab[i] = cm_torch_tab[j];
        i = j;
    }
    memset(&cm_torch_tab[i], 0, sizeof(cm_torch_tab[i]));
    cm_torch_n--;
}

/* Count size bytes taken (add) or given back in ctx's lane_* counters
 * (lane mutex held). */
static void
cm_lane_count(cm_context *ctx, size_t size, int add)
{
    size_t b = add ? ctx->lane_bytes + size : ctx->lane_bytes - size;
    size_t all;

    __atomic_store_n(&ctx->lane_bytes, b, __ATOMIC_RELAXED);
    if (!add) {
        __atomic_store_n(&ctx->lane_count, ctx->lane_count - 1,
                         __ATOMIC_RELAXED);
        return;
    }
    __atomic_store_n(&ctx->lane_count, ctx->lane_count + 1,
                     __ATOMIC_RELAXED);
    __atomic_store_n(&ctx->lane_total_count, ctx->lane_total_count + 1,
                     __ATOMIC_RELAXED);
    all = b + __atomic_load_n(&ctx->st_bytes, __ATOMIC_RELAXED);
    if (all > ctx->lane_peak) {
        __atomic_store_n(&ctx->lane_peak, all, __ATOMIC_RELAXED);
    }
}

/* Take lane out of cm_lanes' service (lane mutex held): whether nobody
 * holds it any more, when cm_lane_free must follow. */
static int
cm_lane_retire(cm_lane *lane)
{
    lane->retired = 1;
    return --lane->holds == 0;
}

/* Free a retired lane nobody holds (GIL held). */
static void
cm_lane_free(cm_lane *lane)
{
    Py_DECREF(lane->ctx);
    free(lane);
}

/* Let go of one hold on lane.  A retired lane that nobody holds any
 * more drops its context, which needs the GIL: gil says whether the
 * caller holds it, else it is taken here (or, while the interpreter
 * finalises, the context is left alone). */
static void
cm_lane_release(cm_lane *lane, int gil)
{
    PyGILState_STATE g;
    int last;

    cm_mu_lock(&cm_lane_mu);
    last = --lane->holds == 0 && lane->retired;
    cm_mu_unlock(&cm_lane_mu);
    if (!last) {
        return;
    }
    if (gil) {
        cm_lane_free(lane);
    }
    else if (Py_IsInitialized() && !Py_IsFinalizing()) {
        g = PyGILState_Ensure();
        cm_lane_free(lane);
        PyGILState_Release(g);
    }
    else {
        free(lane);           /* the context is left alone */
    }
}

/* The lane of ctx, held once for the caller; made (and the device's
 * previous lane retired) when ctx is not the device's lane yet.  GIL
 * held.  NULL with MemoryError. */
static cm_lane *
cm_lane_attach(cm_context *ctx)
{
    int id = ctx->device->id;
    cm_lane *lane;
    cm_lane *old = NULL;
    int drop_old = 0;

    cm_mu_lock(&cm_lane_mu);
    lane = cm_lanes[id];
    if (lane != NULL && lane->ctx == ctx) {
        lane->holds++;
        cm_mu_unlock(&cm_lane_mu);
        return lane;
    }
    cm_mu_unlock(&cm_lane_mu);
    lane = calloc(1, sizeof(*lane));
    if (lane == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    lane->ctx = (cm_context *)Py_NewRef(ctx);
    lane->holds = 2;      /* cm_lanes' and the caller's */
    cm_mu_lock(&cm_lane_mu);
    old = cm_lanes[id];
    cm_lanes[id] = lane;
    drop_old = old != NULL && cm_lane_retire(old);
    cm_mu_unlock(&cm_lane_mu);
    if (drop_old) {
        cm_lane_free(old);
    }
    return lane;
}

void
cm_interop_context_closing(cm_context *ctx)
{
    int id = ctx->device->id;
    cm_lane *lane;
    int last = 0;

    if (id < 0 || id >= CM_MAX_DEVICES) {
        return;
    }
    cm_mu_lock(&cm_lane_mu);
    lane = cm_lanes[id];
    if (lane != NULL && lane->ctx == ctx) {
        cm_lanes[id] = NULL;
        last = cm_lane_retire(lane);
    }
    cm_mu_unlock(&cm_lane_mu);
    if (last) {
        cm_lane_free(lane);
    }
}

/* Whether a lane may serve this thread now: not while the history
 * records (it notes with the GIL), not on a driver callback thread (no
 * driver call there), not in a forked child. */
static int
cm_lane_usable(void)
{
    return !cm_forked && !__atomic_load_n(&cm_hist_on, __ATOMIC_RELAXED)
           && !cm_on_driver_thread();
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
           && cm_interop_ready;
}

/* The lane's allocation, without the GIL: 1 with *out set, or 0 when
 * only the path with the GIL can serve it. */
static int
cm_torch_alloc_lane(size_t size, int device, CUstream stream, void **out)
{
    cm_torch_ent e;
    cm_lane *lane;
    cm_context *ctx;
    CUdeviceptr p = 0;
    uintptr_t h = 0;
    CUresult rc;
    int epoch;
    int pushed;
    int ok = 0;

    if (device < 0 || device >= CM_MAX_DEVICES || !cm_lane_usable()) {
        return 0;
    }
    /* Counted from here: a close of the context on another thread waits
     * for this call before its driver objects go. */
    epoch = cm_driver_call_begin();
    cm_mu_lock(&cm_lane_mu);
    lane = cm_lanes[device];
    if (lane != NULL) {
        lane->holds++;
    }
    cm_mu_unlock(&cm_lane_mu);
    if (lane == NULL) {
        cm_driver_call_end(epoch);
        return 0;
    }
    ctx = lane->ctx;
    if (__atomic_load_n(&ctx->mm, __ATOMIC_RELAXED) != ctx->mm_builtin
        || cm_ctx_enter(ctx->handle, &pushed) != CUDA_SUCCESS) {
        cm_driver_call_end(epoch);
        cm_lane_release(lane, 0);
        return 0;
    }
    if (cm_gpool_foreign(ctx, stream) != NULL) {
        /* PyTorch captures the stream: the path with the GIL allocates
         * from the capture's graph pool. */
        cm_ctx_leave(pushed);
        cm_driver_call_end(epoch);
        cm_lane_release(lane, 0);
        return 0;
    }
    cm_mm_for_peer++;
    rc = ctx->mm_builtin->take(ctx, size, stream, &p, &h);
    cm_mm_for_peer--;
    if (rc == CUDA_SUCCESS) {
        e.ptr = (uintptr_t)p;
        e.size = size;
        e.stream = stream;
        e.lane = lane;
        e.handle = h;
        e.obj = NULL;
        cm_mu_lock(&cm_lane_mu);
        ok = cm_torch_put(&e) == 0;
        if (ok) {
            /* The entry keeps the hold this call took. */
            cm_lane_count(ctx, size, 1);
        }
        cm_mu_unlock(&cm_lane_mu);
        if (!ok) {
            (void)ctx->mm_builtin->release(ctx, ctx->mm_builtin->rel, h,
                                           size, stream);
        }
    }
    cm_ctx_leave(pushed);
    cm_driver_call_end(epoch);
    if (!ok) {
        cm_lane_release(lane, 0);
        return 0;
    }
    *out = (void *)(uintptr_t)p;
    return 1;
}

/* The allocation with the GIL held: through the lane of the device's
 * context when its manager has one (made or renewed here), else a
 * ClientAllocation.  The address, or 0 with an exception. */
static uintptr_t
cm_torch_alloc_gil(size_t size, int device, CUstream stream)
{
    cm_torch_ent e;
    cm_context *ctx;
    cm_lane *lane;
    PyObject *dev;
    PyObject *o;
    CUdeviceptr p = 0;
    uintptr_t h = 0;
    int err;
    int r;

    if (device < 0) {
        PyErr_Format(PyExc_ValueError, "invalid device %d", device);
        return 0;
    }
    dev = PyLong_FromLong(device);
    if (dev == NULL) {
        return 0;
    }
    ctx = cm_context_of_device(dev);
    if (ctx == NULL) {
        Py_DECREF(dev);
        return 0;
    }
    memset(&e, 0, sizeof(e));
    e.size = size;
    e.stream = stream;
    if (ctx->mm != ctx->mm_builtin || ctx->mm->take == NULL || cm_forked) {
        Py_DECREF(dev);
        cm_gpool_force(cm_gpool_foreign(ctx, stream));
        o = cm_client_alloc(ctx, size, stream, CM_CLIENT_TORCH);
        cm_gpool_force(NULL);
        if (o == NULL) {
            return 0;
        }
        e.ptr = ((cm_client_mem *)o)->ptr;
        e.obj = o;
        cm_mu_lock(&cm_lane_mu);
        err = cm_torch_put(&e);
        cm_mu_unlock(&cm_lane_mu);
        if (err < 0) {
            Py_DECREF(o);
            PyErr_NoMemory();
            return 0;
        }
        return e.ptr;
    }
    Py_DECREF(dev);
    lane = cm_lane_attach(ctx);
    if (lane == NULL) {
        return 0;
    }
    /* During PyTorch's own capture of the stream: the capture's graph
     * pool (memory/pool/graph/gpool.c). */
    cm_gpool_force(cm_gpool_foreign(ctx, stream));
    cm_mm_for_peer++;
    CM_IN_CONTEXT(ctx, r, -1, cm_mem_alloc_raw(ctx, size, stream, &p, &h));
    cm_mm_for_peer--;
    cm_gpool_force(NULL);
    if (r < 0) {
        cm_lane_release(lane, 1);
        return 0;
    }
    e.ptr = (uintptr_t)p;
    e.lane = lane;
    e.handle = h;
    cm_mu_lock(&cm_lane_mu);
    err = cm_torch_put(&e);
    if (err == 0) {
        cm_lane_count(ctx, size, 1);
    }
    cm_mu_unlock(&cm_lane_mu);
    if (err < 0) {
        cm_ctx_release_uncounted(ctx, ctx->mm_builtin->rel, h, size, stream);
        cm_lane_release(lane, 1);
        PyErr_NoMemory();
        return 0;
    }
    cm_hist_note(CM_HIST_ALLOC, CM_HIST_DEVICE, ctx, (uintptr_t)stream,
                 e.ptr, size);
    return e.ptr;
}

/* PyTorch's alloc: size bytes on device for stream from that device's
 * cudamem manager, or NULL (the exception is kept for
 * _torch_last_error()).  The lane serves it without the GIL when it
 * can. */
CM_EXPORT void *
cudamem_torch_alloc(size_t size, int device, CUstream stream)
{
    PyGILState_STATE g;
    PyObject *saved;
    void *r = NULL;

    if (size == 0 || size > (size_t)PY_SSIZE_T_MAX
        || !cm_interop_python_ok()) {
        return NULL;
    }
    /* PyTorch may be capturing on this thread: its allocation is made in
     * the relaxed capture mode (context.h, cm_capture_relax). */
    cm_capture_adapter_depth++;
    if (cm_torch_alloc_lane(size, device, stream, &r)) {
        cm_capture_adapter_depth--;
        return r;
    }
    g = PyGILState_Ensure();
    saved = PyErr_GetRaisedException();
    if (cm_interop_python_ok()) {
        r = (void *)cm_torch_alloc_gil(size, device, stream);
        if (r == NULL) {
            Py_XSETREF(cm_torch_error, PyErr_GetRaisedException());
        }
    }
    PyErr_SetRaisedException(saved);
    PyGILState_Release(g);
    cm_capture_adapter_depth--;
    return r;
}

/* Give back the memory of lane entry e, taken out of the table (its
 * bytes no longer counted), on this thread without the GIL when
 * nothing needs it: 1, or 0 when it must be done with the GIL. */
static int
cm_torch_free_lane(const cm_torch_ent *e)
{
    cm_context *ctx = e->lane->ctx;
    int epoch;
    int pushed;

    if (!cm_lane_usable() || cm_ctx_deferring(ctx)) {
        return 0;
    }
    epoch = cm_driver_call_begin();
    if (__atomic_load_n(&ctx->alive, __ATOMIC_SEQ_CST)) {
        if (cm_ctx_enter(ctx->handle, &pushed) != CUDA_SUCCESS) {
            cm_driver_call_end(epoch);
            return 0;
        }
        /* The pool checks that it still lives before it touches the
         * block. */
        if (ctx->mm_builtin->release(ctx, ctx->mm_builtin->rel, e->handle,
                                     e->size, e->stream)
            == CUDA_ERROR_NOT_READY) {
            /* Not now (its stream captures: PyTorch's capture): queued,
             * which needs the GIL. */
            cm_ctx_leave(pushed);
            cm_driver_call_end(epoch);
            return 0;
        }
        cm_ctx_leave(pushed);
    }
    cm_driver_call_end(epoch);
    cm_lane_release(e->lane, 0);
    return 1;
}

/* The same with the GIL held: the release goes through the context's
 * queue (held by defer_cleanup(), kept for later on a driver callback
 * thread), and the history notes it. */
static void
cm_torch_free_gil(const cm_torch_ent *e)
{
    cm_context *ctx;

    if (e->obj != NULL) {
        Py_DECREF(e->obj);
        return;
    }
    ctx = e->lane->ctx;
    cm_hist_note(CM_HIST_FREE, CM_HIST_DEVICE, ctx, (uintptr_t)e->stream,
                 e->ptr, e->size);
    cm_ctx_release_uncounted(ctx, ctx->mm_builtin->rel, e->handle, e->size,
                             e->stream);
    cm_lane_release(e->lane, 1);
}

/* PyTorch's free: give back the allocation at ptr (its release is
 * ordered on the stream it was allocated for).  Unknown addresses are
 * ignored. */
CM_EXPORT void
cudamem_torch_free(void *ptr, size_t size, int device, CUstream stream)
{
    PyGILState_STATE g;
    PyObject *saved;
    cm_torch_ent e;
    long i;

    (void)size;
    (void)device;
    (void)stream;
    if (ptr == NULL || !cm_interop_python_ok()) {
        return;
    }
    cm_mu_lock(&cm_lane_mu);
    i = cm_torch_find((uintptr_t)ptr);
    if (i >= 0) {
        e = cm_torch_tab[i];
        cm_torch_drop_slot((size_t)i);
        if (e.lane != NULL) {
            cm_lane_count(e.lane->ctx, e.size, 0);
        }
    }
    cm_mu_unlock(&cm_lane_mu);
    if (i < 0) {
        return;
    }
    /* PyTorch may be capturing on this thread (a tensor made before its
     * capture freed inside it): the free is made in the relaxed capture
     * mode (context.h, cm_capture_relax). */
    cm_capture_adapter_depth++;
    if (e.lane != NULL && cm_torch_free_lane(&e)) {
        cm_capture_adapter_depth--;
        return;
    }
    g = PyGILState_Ensure();
    saved = PyErr_GetRaisedException();
    if (cm_interop_python_ok()) {
        cm_torch_free_gil(&e);
        PyErr_Clear();
    }
    PyErr_SetRaisedException(saved);
    PyGILState_Release(g);
    cm_capture_adapter_depth--;
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
    size_t n;

    (void)mod;
    (void)unused;
    cm_mu_lock(&cm_lane_mu);
    n = cm_torch_n;
    cm_mu_unlock(&cm_lane_mu);
    return PyLong_FromSize_t(n);
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
    /* What the context layer reaches of this file (context/context.h). */
    cm_ctx_up.interop_context_closing = cm_interop_context_closing;
    /* A fork's child: PyTorch's entry points there find the lanes of
     * the parent's contexts, whose driver calls refuse (cm_forked). */
    if (cm_atfork_mutex_add(&cm_lane_mu) < 0) {
        return -1;
    }
    cm_client_type = (PyTypeObject *)PyType_FromModuleAndSpec(
        mod, &cm_client_spec, NULL);
    if (cm_client_type == NULL
        || PyModule_AddObjectRef(mod, "ClientAllocation",
                                 (PyObject *)cm_client_type) < 0) {
        return -1;
    }
    if (PyModule_AddFunctions(mod, cm_interop_functions) < 0) {
        return -1;
    }
#ifdef CM_RETCHECK
    if (cm_retcheck_def(&cm_cupy_malloc_def, "cudamem._core") < 0) {
        return -1;
    }
#endif
    cm_interop_ready = 1;
    return 0;
}
