/* SPDX-License-Identifier: MIT */
/*
 * memory.c: the allocation path and the owner objects of device memory;
 * deferred deallocation, which they end on, is release.c's.
 *
 * Owns:
 * - DefaultMemoryManager, the manager every context gets unless a plugin or
 *   another built-in manager is set: cuMemAlloc, with the context's memory
 *   queue (release.c) as its free path (its table cm_mm_default is in
 *   default.c).  The allocation path calls the context's manager through its
 *   table (cm_mm_ops in memory/memory.h: default, plugin, and the pool and
 *   async managers of poolops.c), never the other way round, and every
 *   built-in manager shares one out-of-memory policy (oom.c): flush pending
 *   frees, trim pools, gc.collect() where a collection could make room, retry
 *   once, then CudaOutOfMemoryError with a snapshot.
 * - DeviceAllocation, the reference-counted owner of one allocation.
 *   Arrays and views hold a strong reference; when the last one goes the
 *   free is queued.  A context that was closed or reset frees nothing.
 * - which built-in manager contexts made from now on get
 *   (set_memory_manager("pool") tells C through _set_builtin_manager).
 *
 * Locks and the GIL: runs with the GIL held, which guards the owners; it
 * takes no lock itself (the managers' functions it calls take their
 * pools' mutexes and give up the GIL around their driver calls).  It
 * gives up the GIL (CM_CU_NOGIL, CM_DRIVER_BEGIN_NOGIL) only in the bare
 * driver helpers for tests and benchmarks (_host_alloc .. _alloc_free),
 * around the one call; the copies' buffer views stay held until it is
 * back.
 */
#include "memory/memory.h"
#include "memory/pool/graph/graph.h"
#include "memory/release.h"

#include <string.h>

/* ------------------------------------------------------------------ */
/* DeviceAllocation                                                    */
/* ------------------------------------------------------------------ */

static int
cm_mem_traverse(PyObject *self, visitproc visit, void *arg)
{
    cm_mem *m = (cm_mem *)self;
    int i;

    Py_VISIT(Py_TYPE(self));
    Py_VISIT(m->ctx);
    Py_VISIT(m->stream_obj);
    if (m->uses != NULL) {
        for (i = 0; i < m->uses->n; i++) {
            Py_VISIT(m->uses->s[i].obj);
        }
    }
    return 0;
}

/* Let go of the streams m's memory was used on. */
static void
cm_mem_clear_uses(cm_mem *m)
{
    cm_uses *u = m->uses;
    int i;

    if (u == NULL) {
        return;
    }
    m->uses = NULL;
    for (i = 0; i < u->n; i++) {
        Py_XDECREF(u->s[i].obj);
    }
    PyMem_Free(u);
}

/* Whether m's stream may be destroyed without cudamem hearing of it: a
 * stream that is not a default one and not a stream() of cudamem's (those
 * tell the pool when they go: stream_gone).  The manager must not be
 * left to record an event on such a stream later (the pool does so when
 * another stream first wants a block): cm_mem_release tells it
 * (foreign_free) while the stream is known to be alive. */
static int
cm_mem_stream_foreign(const cm_mem *m)
{
    if (cm_stream_handle_is_default(m->stream)) {
        return 0;
    }
    return m->stream_obj == NULL || !cm_stream_check(m->stream_obj)
           || ((cm_stream *)m->stream_obj)->kind != CM_STREAM_USER;
}

/* Order the release of a pool or async allocation after the work queued
 * on it: by events on the other streams it was used on, and, when the
 * release waits in the queue, on its own stream too (the handle may be
 * gone by the flush).  The kind of release to queue, and in *on (set to
 * the own stream first) the stream an async free is queued on; for the
 * release after a capture (rel_after), the stream that captures; for the
 * release after the context (rel_sync), NULL, or the stream whose
 * capture it waits for (the order's CUDA_ERROR_NOT_READY). */
static int
cm_mem_order_release(cm_mem *m, CUstream *on)
{
    cm_context *ctx = m->ctx;
    const cm_mm_ops *mm = m->mm;
    CUstream hs[8];
    CUstream *v = hs;
    CUcontext prev;
    int n = m->uses != NULL ? m->uses->n : 0;
    int deferred;
    int i;
    int kind = mm->rel;
    CUresult rc;
    int own_default = cm_stream_handle_is_default(m->stream);

    if (!ctx->alive || cm_forked || ctx->memq == NULL) {
        return kind;                 /* nothing will be released */
    }
    deferred = ctx->memq->disabled > 0;
    if (n == 0 && (!deferred || own_default)) {
        return kind;                 /* the common case: stream order */
    }
    if (cm_on_driver_thread()) {
        /* No driver call here: the flush waits for the context. */
        *on = NULL;
        return mm->rel_sync;
    }
    if (n > (int)(sizeof(hs) / sizeof(hs[0]))) {
        v = PyMem_Malloc((size_t)n * sizeof(*v));
        if (v == NULL) {
            *on = NULL;
            return mm->rel_sync;
        }
    }
    for (i = 0; i < n; i++) {
        v[i] = m->uses->s[i].handle;
    }
    if (cm_context_enter(ctx, &prev) < 0) {
        PyErr_Clear();
        kind = mm->rel_sync;
        *on = NULL;
    }
    else {
        rc = mm->order(ctx, m->handle, m->stream, v, n, on);
        if (rc == CM_ORDER_AFTER_CAPTURE) {
            kind = mm->rel_after;
        }
        else if (rc != CUDA_SUCCESS) {
            kind = mm->rel_sync;
            if (rc != CUDA_ERROR_NOT_READY) {
                *on = NULL;
            }
        }
        cm_context_leave(ctx, prev);
    }
    if (v != hs) {
        PyMem_Free(v);
    }
    return kind;
}

/* Queue the free once. */
static void
cm_mem_release(cm_mem *m)
{
    CUstream on;
    int kind;

    if (m->freed) {
        return;
    }
    m->freed = 1;
    cm_hist_note(CM_HIST_FREE, CM_HIST_DEVICE, m->ctx, (uintptr_t)m->stream,
                 (uintptr_t)m->ptr, m->size);
    if (m->mm->ordered) {
        on = m->stream;
        if (m->mm->foreign_free != NULL && cm_mem_stream_foreign(m)
            && m->ctx->alive && !cm_forked) {
            m->mm->foreign_free(m->ctx, m->handle);
        }
        kind = cm_mem_order_release(m, &on);
        cm_ctx_release_on(m->ctx, kind, m->handle, m->size, on);
    }
    else {
        cm_ctx_release(m->ctx, m->mm->rel, m->handle, m->size);
    }
    cm_mem_clear_uses(m);
    Py_CLEAR(m->stream_obj);
}

/* cm_mem_note_use's step where h is a stream of the current context
 * and m's memory another context's: a release can be ordered only
 * after streams of m's own context, so a stream of that context (m's
 * follower: one per allocation, non-blocking, kept among its uses) is
 * made to wait for the work queued on h so far.  *h and *obj become the
 * follower's.  1 when it was among the uses already (or there is
 * nothing to order: h captures), 0 when it is new
 * (*obj a new reference for the caller to hand over), -1 with an
 * exception. */
static int
cm_mem_follow(cm_mem *m, CUstream *h, PyObject **obj)
{
    cm_uses *u = m->uses;
    PyObject *f = NULL;
    CUevent ev = NULL;
    CUcontext prev;
    CUstreamCaptureStatus cs;
    int known = 0;
    int i;
    int rc;

    for (i = 0; u != NULL && i < u->n; i++) {
        if (u->s[i].follower) {
            f = u->s[i].obj;
            known = 1;
            break;
        }
    }
    if (CM_CU(StreamIsCapturing, (*h, &cs)) < 0) {
        return -1;
    }
    if (cs != CU_STREAM_CAPTURE_STATUS_NONE) {
        /* Recorded into a graph, whose replays come later: nothing to
         * order now (a capture of cudamem's keeps the memory). */
        return 1;
    }
    rc = CM_CU(EventCreate, (&ev, CU_EVENT_DISABLE_TIMING));
    if (rc == 0) {
        rc = CM_CU(EventRecord, (ev, *h));
    }
    if (rc == 0) {
        rc = cm_context_enter(m->ctx, &prev);
    }
    if (rc == 0) {
        if (f == NULL) {
            f = cm_stream_make_in(m->ctx, CU_STREAM_NON_BLOCKING);
        }
        rc = f == NULL ? -1
                       : CM_CU(StreamWaitEvent,
                               (((cm_stream *)f)->handle, ev, 0));
        cm_context_leave(m->ctx, prev);
    }
    if (ev != NULL) {
        /* The driver keeps it until the wait is over. */
        (void)CM_CU_RAW(EventDestroy, (ev));
    }
    if (rc < 0) {
        if (!known) {
            Py_XDECREF(f);
        }
        return -1;
    }
    *h = ((cm_stream *)f)->handle;
    *obj = f;
    return known;
}

int
cm_mem_note_use(PyObject *owner, CUstream h, PyObject *obj)
{
    cm_mem *m;
    cm_uses *u;
    int i;
    PyObject *given = owner;
    CUcontext cur = NULL;
    int follow = 0;

    if (owner == NULL || !Py_IS_TYPE(owner, cm_st->Mem_type)) {
        /* A view of another device array (as_cuda_array of one). */
        if (owner == NULL || !cm_mem_up.devicearray_owner(owner, &owner)
            || owner == NULL || !Py_IS_TYPE(owner, cm_st->Mem_type)) {
            /* Memory cudamem does not manage: a capture's graph keeps
             * its owner all the same. */
            return cm_capture_keep(h, given);
        }
    }
    m = (cm_mem *)owner;
    /* Work recorded in a capture cudamem began: its graph keeps the
     * memory (a relaxed atomic load when nothing captures), but for a
     * block of a graph pool, which stays the graphs' while the pool
     * lives, and once freed serves a later capture sharing the pool. */
    if (!cm_gpool_handle(m->handle) && cm_capture_keep(h, given) < 0) {
        return -1;
    }
    /* The memory's own stream: nothing to note, but where h is a
     * default stream and another device's context may be current (one
     * was given peer access to this one's memory): its default stream
     * is not the memory's context's. */
    if (!m->mm->ordered || m->freed
        || (h == m->stream
            && (!cm_stream_handle_is_default(h) || m->ctx->peers_in == 0))) {
        return 0;
    }
    if (CM_CU(CtxGetCurrent, (&cur)) < 0) {
        return -1;
    }
    if (cur != m->ctx->handle) {
        int r = cm_mem_follow(m, &h, &obj);

        if (r != 0) {
            return r < 0 ? -1 : 0;
        }
        follow = 1;
    }
    else if (h == m->stream) {
        return 0;
    }
    u = m->uses;
    if (u != NULL) {
        for (i = 0; i < u->n; i++) {
            if (u->s[i].handle == h) {
                return 0;
            }
        }
    }
    if (u == NULL || u->n == u->cap) {
        int cap = u == NULL ? 2 : u->cap * 2;
        cm_uses *nu = PyMem_Realloc(u, sizeof(*u) + (size_t)cap
                                       * sizeof(u->s[0]));

        if (nu == NULL) {
            if (follow) {
                Py_DECREF(obj);
            }
            PyErr_NoMemory();
            return -1;
        }
        if (u == NULL) {
            nu->n = 0;
        }
        nu->cap = cap;
        m->uses = u = nu;
    }
    u->s[u->n].handle = h;
    /* A new follower's reference is handed over. */
    u->s[u->n].obj = follow ? obj : Py_XNewRef(obj);
    u->s[u->n].follower = follow;
    u->n++;
    return 0;
}

static void
cm_mem_dealloc(PyObject *self)
{
    cm_mem *m = (cm_mem *)self;
    PyTypeObject *tp = Py_TYPE(self);
    PyObject *exc = PyErr_GetRaisedException();

    PyObject_GC_UnTrack(self);
    if (m->weakreflist != NULL) {
        PyObject_ClearWeakRefs(self);
    }
    if (!Py_IsFinalizing()) {
        cm_mem_release(m);
    }
    cm_mem_clear_uses(m);
    Py_CLEAR(m->stream_obj);
    Py_CLEAR(m->ctx);
    tp->tp_free(self);
    Py_DECREF(tp);
    PyErr_SetRaisedException(exc);
}

/* Raise out-of-memory of manager mm with a snapshot of where the memory
 * is. */
static void
cm_raise_oom(cm_context *ctx, const cm_mm_ops *mm, CUresult rc, size_t size)
{
    cm_raise_oom_at(ctx, rc, size, mm->alloc_fn(ctx), CM_OOM_DEVICE);
}

static PyObject *cm_mem_alloc_on_run(cm_context *ctx, size_t size,
                                     CUstream stream, CUdeviceptr *out);

PyObject *
cm_mem_alloc(cm_context *ctx, size_t size, CUdeviceptr *out)
{
    return cm_mem_alloc_on(ctx, size, NULL, out);
}

int
cm_mem_alloc_raw(cm_context *ctx, size_t size, CUstream stream,
                 CUdeviceptr *ptr, uintptr_t *handle)
{
    const cm_mm_ops *mm = ctx->mm_builtin;
    CUresult rc;
    int attempt;

    if (cm_oom_past_device(ctx, size, mm->alloc_fn(ctx)) < 0) {
        return -1;
    }
    for (attempt = 0;; attempt++) {
        int r;

        rc = mm->alloc(ctx, size, stream, ptr, handle);
        if (rc != CUDA_ERROR_OUT_OF_MEMORY || attempt > 0) {
            break;
        }
        r = cm_oom_recover(ctx, size, 0);
        if (r < 0 || (r > 0 && cm_context_activate(ctx) < 0)) {
            return -1;
        }
        if (r == 0) {
            break;
        }
    }
    if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
        /* What a refused attempt left cached (the driver's stream-ordered
         * pool grows as it tries) goes back before the snapshot; a
         * failure here leaves the out-of-memory error to report.  A
         * refusal of the limit asked the driver nothing. */
        if (!cm_limit_refuses(ctx, size) && !cm_capture_any()
            && mm->trim(ctx) < 0) {
            PyErr_Clear();
        }
        cm_raise_oom(ctx, mm, rc, size);
        return -1;
    }
    if (rc != CUDA_SUCCESS) {
        (void)cm_cu_check(rc, mm->alloc_fn(ctx));
        return -1;
    }
    return 0;
}

static PyObject *
cm_mem_alloc_on_run(cm_context *ctx, size_t size, CUstream stream,
                    CUdeviceptr *out)
{
    const cm_mm_ops *mm = cm_mm_active(ctx);
    CUdeviceptr p = 0;
    uintptr_t handle = 0;
    cm_mem *m;

    /* ctx is current: cm_mem_alloc_on entered it just before. */
    if (mm->alloc == NULL) {
        return cm_mm_plugin_alloc(ctx, size, out);
    }
    if (cm_mem_alloc_raw(ctx, size, stream, &p, &handle) < 0) {
        return NULL;
    }
    m = PyObject_GC_New(cm_mem, cm_st->Mem_type);
    if (m == NULL) {
        /* Give back the allocation whose owner could not be made. */
        (void)mm->release(ctx, mm->rel, handle, size, stream);
        return NULL;
    }
    m->ctx = (cm_context *)Py_NewRef(ctx);
    m->ptr = p;
    m->size = size;
    m->freed = 0;
    m->mm = mm;
    m->stream = stream;
    m->stream_obj = NULL;
    m->handle = handle;
    m->uses = NULL;
    m->weakreflist = NULL;
    PyObject_GC_Track(m);
    cm_ctx_count_alloc(ctx, size);
    cm_hist_note(CM_HIST_ALLOC, CM_HIST_DEVICE, ctx, (uintptr_t)stream,
                 (uintptr_t)p, size);
    *out = p;
    return (PyObject *)m;
}

/* cm_mem_alloc_on_run with ctx current. */
PyObject *
cm_mem_alloc_on(cm_context *ctx, size_t size, CUstream stream,
                CUdeviceptr *out)
{
    PyObject *r;

    CM_IN_CONTEXT(ctx, r, NULL, cm_mem_alloc_on_run(ctx, size, stream, out));
    return r;
}

PyObject *
cm_mem_alloc_for(cm_context *ctx, size_t size, PyObject *stream_obj,
                 CUdeviceptr *out)
{
    CUstream h = NULL;
    PyObject *r;
    int bound = 0;

    if (stream_obj != NULL && cm_mm_active(ctx)->ordered) {
        bound = cm_stream_resolve(stream_obj, &h);
        if (bound < 0) {
            return NULL;
        }
    }
    else if (stream_obj != NULL && cm_capture_any()
             && cm_stream_resolve(stream_obj, &h) < 0) {
        /* A stream-blind manager still allocates from the graph pool of
         * a capture on that stream (memory/pool/graph/gpool.c). */
        return NULL;
    }
    r = cm_mem_alloc_on(ctx, size, h, out);
    if (r != NULL && bound && Py_IS_TYPE(r, cm_st->Mem_type)
        && !cm_stream_handle_is_default(h)) {
        ((cm_mem *)r)->stream_obj = Py_NewRef(stream_obj);
    }
    return r;
}

static PyObject *
cm_mem_get_ptr(PyObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromUnsignedLongLong(((cm_mem *)self)->ptr);
}

static PyObject *
cm_mem_get_ptr_value(PyObject *self, void *unused)
{
    cm_mem *m = (cm_mem *)self;

    (void)unused;
    if (m->ptr == 0) {
        Py_RETURN_NONE;
    }
    return PyLong_FromUnsignedLongLong(m->ptr);
}

static PyObject *
cm_mem_get_size(PyObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromSize_t(((cm_mem *)self)->size);
}

static PyObject *
cm_mem_get_context(PyObject *self, void *unused)
{
    (void)unused;
    return Py_NewRef(((cm_mem *)self)->ctx);
}

PyDoc_STRVAR(cm_mem_free_doc,
"free($self, /)\n--\n\n"
"Release the allocation now (through the deferred queue).  Arrays that "
"still use it raise ValueError when they are used (copies, indexing, "
"DLPack export); only call this when nothing refers to the memory any "
"more.  A second call raises RuntimeError.");

static PyObject *
cm_mem_free(PyObject *self, PyObject *unused)
{
    cm_mem *m = (cm_mem *)self;

    (void)unused;
    if (m->freed) {
        PyErr_SetString(PyExc_RuntimeError, "Freeing dead memory");
        return NULL;
    }
    cm_mem_release(m);
    Py_RETURN_NONE;
}

static PyGetSetDef cm_mem_getset[] = {
    {"device_pointer", cm_mem_get_ptr, NULL,
     "The device address, as an int.", NULL},
    {"handle", cm_mem_get_ptr, NULL, "The device address, as an int.", NULL},
    {"device_pointer_value", cm_mem_get_ptr_value, NULL,
     "The device address, or None for a NULL pointer.", NULL},
    {"size", cm_mem_get_size, NULL, "The allocation's size in bytes.",
     NULL},
    {"context", cm_mem_get_context, NULL,
     "The Context the memory belongs to.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef cm_mem_methods[] = {
    {"free", cm_mem_free, METH_NOARGS, cm_mem_free_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef cm_mem_members[] = {
    {"__weaklistoffset__", Py_T_PYSSIZET, offsetof(cm_mem, weakreflist),
     Py_READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(cm_mem_doc,
"One device allocation of cudamem's default memory manager.  Its free is "
"queued (deferred deallocation) when the last array or view that uses it "
"goes away.");

static PyType_Slot cm_mem_slots[] = {
    {Py_tp_doc, (void *)cm_mem_doc},
    {Py_tp_dealloc, cm_mem_dealloc},
    {Py_tp_traverse, cm_mem_traverse},
    {Py_tp_getset, cm_mem_getset},
    {Py_tp_methods, cm_mem_methods},
    {Py_tp_members, cm_mem_members},
    {0, NULL},
};

static PyType_Spec cm_mem_spec = {
    .name = "cudamem.DeviceAllocation",
    .basicsize = sizeof(cm_mem),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC
             | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = cm_mem_slots,
};

/* ------------------------------------------------------------------ */
/* Module-level functions                                              */
/* ------------------------------------------------------------------ */

PyDoc_STRVAR(cm_memory_stats_doc,
"memory_stats(device=None)\n--\n\n"
"A dict of allocation statistics for the device (default: the current "
"one): allocated_bytes, peak_allocated_bytes, allocation_count, "
"total_allocations, pending_free_count, pending_free_bytes, "
"pool_reserved_bytes, pool_free_bytes, pinned_bytes, limit_bytes (the "
"device's memory limit, None for none: set_memory_limit), "
"limit_used_bytes (the device and managed memory cudamem holds from the "
"driver, which counts against it), manager, by_client (the bytes each "
"library holds through cudamem.interop's adapters, \"cudamem\" for the "
"rest).");

static PyObject *
cm_memory_stats(PyObject *mod, PyObject *const *args, Py_ssize_t nargs,
                PyObject *kwnames)
{
    cm_context *ctx;
    size_t reserved = 0;
    size_t pool_free = 0;
    long long largest = -1;
    size_t lane_bytes;
    size_t lane_peak;
    size_t lane_count;
    size_t lane_total;
    size_t limit;
    const char *name;

    (void)mod;
    if (nargs + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0) > 1) {
        PyErr_SetString(PyExc_TypeError,
                        "memory_stats() takes at most one argument, device");
        return NULL;
    }
    if (nargs + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0) == 1
        && args[0] != Py_None) {
        ctx = cm_context_of_device(args[0]);
    }
    else {
        ctx = cm_context_current();
    }
    if (ctx == NULL) {
        return NULL;
    }
    ctx->mm_builtin->stats(ctx, &reserved, &pool_free, &largest);
    cm_gpools_stats(ctx, &reserved, &pool_free);
    lane_bytes = __atomic_load_n(&ctx->lane_bytes, __ATOMIC_RELAXED);
    lane_peak = __atomic_load_n(&ctx->lane_peak, __ATOMIC_RELAXED);
    lane_count = __atomic_load_n(&ctx->lane_count, __ATOMIC_RELAXED);
    lane_total = __atomic_load_n(&ctx->lane_total_count, __ATOMIC_RELAXED);
    name = ctx->mm->name;
    limit = cm_limit_of(ctx->device->id);
    return Py_BuildValue(
        "{snsnsnsnsnsnsnsnsnsNsnsssN}",
        "allocated_bytes", (Py_ssize_t)(ctx->st_bytes + lane_bytes),
        "peak_allocated_bytes",
        (Py_ssize_t)(ctx->st_peak > lane_peak ? ctx->st_peak : lane_peak),
        "allocation_count", (Py_ssize_t)(ctx->st_count + lane_count),
        "total_allocations", (Py_ssize_t)(ctx->st_total_count + lane_total),
        "pending_free_count", ctx->memq->n + ctx->ctxq->n,
        "pending_free_bytes", (Py_ssize_t)ctx->memq->bytes,
        "pool_reserved_bytes", (Py_ssize_t)reserved,
        "pool_free_bytes", (Py_ssize_t)pool_free,
        "pinned_bytes", (Py_ssize_t)ctx->st_pinned,
        "limit_bytes", limit == 0 ? Py_NewRef(Py_None)
                                  : PyLong_FromSize_t(limit),
        "limit_used_bytes", (Py_ssize_t)cm_limit_used(ctx),
        "manager", name,
        "by_client", cm_interop_by_client(ctx));
}

PyDoc_STRVAR(cm_memalloc_on_doc,
"_memalloc_on(ctx, size, stream_handle)\n--\n\n"
"Allocate size bytes in ctx for the stream with that raw handle (0: the "
"default stream); the owner, as Context.memalloc gives.");

static PyObject *
cm_memalloc_on_fn(PyObject *mod, PyObject *args)
{
    PyObject *o;
    Py_ssize_t n;
    unsigned long long h;
    cm_context *c;
    CUdeviceptr p;

    (void)mod;
    if (!PyArg_ParseTuple(args, "OnK:_memalloc_on", &o, &n, &h)) {
        return NULL;
    }
    if (!PyObject_TypeCheck(o, cm_st->Context_type)) {
        PyErr_Format(PyExc_TypeError, "expected a Context, got %.100s",
                     Py_TYPE(o)->tp_name);
        return NULL;
    }
    c = (cm_context *)o;
    if (n <= 0) {
        PyErr_Format(PyExc_ValueError,
                     "memalloc size must be positive, got %zd", n);
        return NULL;
    }
    return cm_mem_alloc_on(c, (size_t)n, (CUstream)(uintptr_t)h, &p);
}

/* Make sure a context is current; the raw helpers below run in it. */
static int
cm_need_context(void)
{
    return cm_context_current() == NULL ? -1 : 0;
}

PyDoc_STRVAR(cm_host_alloc_doc,
"_host_alloc(size, flags)\n--\n\n"
"cuMemHostAlloc in the current context; the host address.");

static PyObject *
cm_host_alloc_fn(PyObject *mod, PyObject *args)
{
    Py_ssize_t size;
    unsigned int flags;
    void *p = NULL;
    int err;

    (void)mod;
    if (!PyArg_ParseTuple(args, "nI:_host_alloc", &size, &flags)
        || cm_need_context() < 0) {
        return NULL;
    }
    CM_CU_NOGIL(err, MemHostAlloc, (&p, (size_t)size, flags));
    return err < 0 ? NULL : PyLong_FromVoidPtr(p);
}

PyDoc_STRVAR(cm_host_free_doc,
"_host_free(ptr)\n--\n\ncuMemFreeHost.");

static PyObject *
cm_host_free_fn(PyObject *mod, PyObject *arg)
{
    void *p = PyLong_AsVoidPtr(arg);
    int err;

    (void)mod;
    if ((p == NULL && PyErr_Occurred()) || cm_need_context() < 0) {
        return NULL;
    }
    CM_CU_NOGIL(err, MemFreeHost, (p));
    return err < 0 ? NULL : Py_NewRef(Py_None);
}

PyDoc_STRVAR(cm_host_register_doc,
"_host_register(ptr, size, flags)\n--\n\ncuMemHostRegister.");

static PyObject *
cm_host_register_fn(PyObject *mod, PyObject *args)
{
    unsigned long long p;
    Py_ssize_t size;
    unsigned int flags;
    int err;

    (void)mod;
    if (!PyArg_ParseTuple(args, "KnI:_host_register", &p, &size, &flags)
        || cm_need_context() < 0) {
        return NULL;
    }
    CM_CU_NOGIL(err, MemHostRegister, ((void *)(uintptr_t)p, (size_t)size,
                                       flags));
    return err < 0 ? NULL : Py_NewRef(Py_None);
}

PyDoc_STRVAR(cm_host_unregister_doc,
"_host_unregister(ptr)\n--\n\ncuMemHostUnregister.");

static PyObject *
cm_host_unregister_fn(PyObject *mod, PyObject *arg)
{
    void *p = PyLong_AsVoidPtr(arg);
    int err;

    (void)mod;
    if ((p == NULL && PyErr_Occurred()) || cm_need_context() < 0) {
        return NULL;
    }
    CM_CU_NOGIL(err, MemHostUnregister, (p));
    return err < 0 ? NULL : Py_NewRef(Py_None);
}

PyDoc_STRVAR(cm_host_device_pointer_doc,
"_host_device_pointer(ptr)\n--\n\n"
"cuMemHostGetDevicePointer: the device address of mapped host memory.");

static PyObject *
cm_host_device_pointer_fn(PyObject *mod, PyObject *arg)
{
    void *p = PyLong_AsVoidPtr(arg);
    CUdeviceptr d = 0;

    (void)mod;
    if ((p == NULL && PyErr_Occurred()) || cm_need_context() < 0
        || CM_CU(MemHostGetDevicePointer, (&d, p, 0)) < 0) {
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(d);
}

PyDoc_STRVAR(cm_managed_alloc_doc,
"_managed_alloc(size, flags)\n--\n\ncuMemAllocManaged.");

static PyObject *
cm_managed_alloc_fn(PyObject *mod, PyObject *args)
{
    Py_ssize_t size;
    unsigned int flags;
    CUdeviceptr d = 0;
    int err;

    (void)mod;
    if (!PyArg_ParseTuple(args, "nI:_managed_alloc", &size, &flags)
        || cm_need_context() < 0) {
        return NULL;
    }
    CM_CU_NOGIL(err, MemAllocManaged, (&d, (size_t)size, flags));
    return err < 0 ? NULL : PyLong_FromUnsignedLongLong(d);
}

PyDoc_STRVAR(cm_device_alloc_doc,
"_device_alloc(size)\n--\n\ncuMemAlloc, with no manager involved.");

static PyObject *
cm_device_alloc_fn(PyObject *mod, PyObject *arg)
{
    Py_ssize_t size = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    CUdeviceptr d = 0;
    int err;

    (void)mod;
    if ((size == -1 && PyErr_Occurred()) || cm_need_context() < 0) {
        return NULL;
    }
    CM_CU_NOGIL(err, MemAlloc, (&d, (size_t)size));
    return err < 0 ? NULL : PyLong_FromUnsignedLongLong(d);
}

PyDoc_STRVAR(cm_device_free_doc,
"_device_free(ptr)\n--\n\ncuMemFree, with no manager involved.");

static PyObject *
cm_device_free_fn(PyObject *mod, PyObject *arg)
{
    unsigned long long d = PyLong_AsUnsignedLongLong(arg);
    int err;

    (void)mod;
    if ((d == (unsigned long long)-1 && PyErr_Occurred())
        || cm_need_context() < 0) {
        return NULL;
    }
    CM_CU_NOGIL(err, MemFree, ((CUdeviceptr)d));
    return err < 0 ? NULL : Py_NewRef(Py_None);
}

PyDoc_STRVAR(cm_memset_doc,
"_memset(ptr, byte, count, stream=0, owner=None)\n--\n\n"
"cuMemsetD8 (synchronous) or cuMemsetD8Async on a truthy stream.  owner:\n"
"the memory's owner (an allocation), whose release then waits for the\n"
"memset as for any work on its memory (a synchronous one may return\n"
"before it has run: its work counts as the default stream's).");

static PyObject *
cm_memset_fn(PyObject *mod, PyObject *args)
{
    unsigned long long d;
    unsigned char byte;
    Py_ssize_t count;
    PyObject *stream_obj = Py_False;
    PyObject *owner = Py_None;
    CUstream stream;
    int async;
    int err;

    (void)mod;
    if (!PyArg_ParseTuple(args, "Kbn|OO:_memset", &d, &byte, &count,
                          &stream_obj, &owner)
        || (async = cm_stream_resolve(stream_obj, &stream)) < 0
        || cm_need_context() < 0
        || (!async && cm_capture_refuse_sync("a synchronous memset") < 0)) {
        return NULL;
    }
    if (async) {
        err = CM_CU(MemsetD8Async, ((CUdeviceptr)d, byte, (size_t)count,
                                    stream));
    }
    else {
        CM_CU_NOGIL(err, MemsetD8, ((CUdeviceptr)d, byte, (size_t)count));
    }
    if (err < 0) {
        return NULL;
    }
    /* The owner's release waits for the memset: on another stream than
     * the memory's, a pool would otherwise hand the block out there
     * before it has run. */
    if (owner != Py_None
        && cm_mem_note_use(owner, async ? stream : NULL,
                           async && !cm_stream_handle_is_default(stream)
                               ? stream_obj : NULL) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cm_memcpy_htod_doc,
"_memcpy_htod(dptr, src, /)\n--\n\n"
"cuMemcpyHtoD of a whole contiguous buffer: the bare driver call, for "
"benchmarks and tests.");

static PyObject *
cm_memcpy_htod_fn(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    unsigned long long d;
    Py_buffer view;
    int err;

    (void)mod;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "_memcpy_htod(dptr, src)");
        return NULL;
    }
    d = PyLong_AsUnsignedLongLong(args[0]);
    if ((d == (unsigned long long)-1 && PyErr_Occurred())
        || PyObject_GetBuffer(args[1], &view, PyBUF_C_CONTIGUOUS) < 0) {
        return NULL;
    }
    /* The current context, made current on this thread if it is not
     * (a thread of its own, as the bidirectional benchmark's). */
    if (cm_context_current() == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    CM_CU_NOGIL(err, MemcpyHtoD, ((CUdeviceptr)d, view.buf,
                                  (size_t)view.len));
    PyBuffer_Release(&view);
    return err < 0 ? NULL : Py_NewRef(Py_None);
}

PyDoc_STRVAR(cm_memcpy_dtoh_doc,
"_memcpy_dtoh(dst, dptr, /)\n--\n\n"
"cuMemcpyDtoH into a whole writable contiguous buffer: the bare driver "
"call, for benchmarks and tests.");

static PyObject *
cm_memcpy_dtoh_fn(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    unsigned long long d;
    Py_buffer view;
    int err;

    (void)mod;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "_memcpy_dtoh(dst, dptr)");
        return NULL;
    }
    d = PyLong_AsUnsignedLongLong(args[1]);
    if ((d == (unsigned long long)-1 && PyErr_Occurred())
        || PyObject_GetBuffer(args[0], &view,
                              PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        return NULL;
    }
    if (cm_context_current() == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    CM_CU_NOGIL(err, MemcpyDtoH, (view.buf, (CUdeviceptr)d,
                                  (size_t)view.len));
    PyBuffer_Release(&view);
    return err < 0 ? NULL : Py_NewRef(Py_None);
}

PyDoc_STRVAR(cm_alloc_free_doc,
"_alloc_free(size)\n--\n\n"
"cuMemAlloc then cuMemFree: the bare driver's cost of one allocation, "
"for benchmarks.");

static PyObject *
cm_alloc_free_fn(PyObject *mod, PyObject *arg)
{
    Py_ssize_t size = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    CUdeviceptr d = 0;
    CUresult rc;

    (void)mod;
    if (size == -1 && PyErr_Occurred()) {
        return NULL;
    }
    CM_DRIVER_BEGIN_NOGIL
    rc = CM_CU_RAW(MemAlloc, (&d, (size_t)size));
    if (rc == CUDA_SUCCESS) {
        rc = CM_CU_RAW(MemFree, (d));
    }
    CM_DRIVER_END_NOGIL
    return cm_cu_check(rc, "cuMemAlloc") < 0 ? NULL : Py_NewRef(Py_None);
}

/* The built-in manager for new contexts. */
static const cm_mm_ops *cm_builtin = &cm_mm_default;

const cm_mm_ops *
cm_mm_builtin(void)
{
    return cm_builtin;
}

PyDoc_STRVAR(cm_set_builtin_doc,
"_set_builtin_manager(name)\n--\n\n"
"Which built-in manager contexts made from now on get: 'default', "
"'pool' or 'async'.");

static PyObject *
cm_set_builtin_fn(PyObject *mod, PyObject *arg)
{
    static const cm_mm_ops *const builtins[] = {
        &cm_mm_default, &cm_mm_pool, &cm_mm_async,
    };
    const char *s = PyUnicode_Check(arg) ? PyUnicode_AsUTF8(arg) : NULL;
    size_t i;

    (void)mod;
    if (s == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "name must be a str");
        }
        return NULL;
    }
    for (i = 0; i < sizeof(builtins) / sizeof(builtins[0]); i++) {
        if (strcmp(s, builtins[i]->name) == 0) {
            cm_builtin = builtins[i];
            Py_RETURN_NONE;
        }
    }
    PyErr_Format(PyExc_ValueError, "unknown built-in memory manager %R",
                 arg);
    return NULL;
}

PyDoc_STRVAR(cm_get_builtin_doc,
"_builtin_manager()\n--\n\n"
"The built-in manager contexts made from now on get.");

static PyObject *
cm_get_builtin_fn(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    return PyUnicode_FromString(cm_builtin->name);
}

PyDoc_STRVAR(cm_mm_direct_doc,
"_mm_direct(delta)\n--\n\n"
"Add delta to this thread's count of built-in manager methods running "
"(DefaultMemoryManager's, which a plugin wrapping the manager it "
"replaced may call): while it is not zero, allocations go to the "
"context's built-in manager, not to the plugin.  Returns the new "
"count.");

static PyObject *
cm_mm_direct_fn(PyObject *mod, PyObject *arg)
{
    long d = PyLong_AsLong(arg);

    (void)mod;
    if (d == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (d < -1 || d > 1 || cm_mm_direct + d < 0) {
        PyErr_SetString(PyExc_ValueError, "_mm_direct: unbalanced delta");
        return NULL;
    }
    cm_mm_direct += (int)d;
    return PyLong_FromLong(cm_mm_direct);
}

static PyMethodDef cm_memory_functions[] = {
    {"_set_builtin_manager", cm_set_builtin_fn, METH_O, cm_set_builtin_doc},
    {"_builtin_manager", cm_get_builtin_fn, METH_NOARGS, cm_get_builtin_doc},
    {"_mm_direct", cm_mm_direct_fn, METH_O, cm_mm_direct_doc},
    {"_memcpy_htod", (PyCFunction)(void (*)(void))cm_memcpy_htod_fn,
     METH_FASTCALL, cm_memcpy_htod_doc},
    {"_memcpy_dtoh", (PyCFunction)(void (*)(void))cm_memcpy_dtoh_fn,
     METH_FASTCALL, cm_memcpy_dtoh_doc},
    {"_alloc_free", cm_alloc_free_fn, METH_O, cm_alloc_free_doc},
    {"_host_alloc", cm_host_alloc_fn, METH_VARARGS, cm_host_alloc_doc},
    {"_host_free", cm_host_free_fn, METH_O, cm_host_free_doc},
    {"_host_register", cm_host_register_fn, METH_VARARGS,
     cm_host_register_doc},
    {"_host_unregister", cm_host_unregister_fn, METH_O,
     cm_host_unregister_doc},
    {"_host_device_pointer", cm_host_device_pointer_fn, METH_O,
     cm_host_device_pointer_doc},
    {"_managed_alloc", cm_managed_alloc_fn, METH_VARARGS,
     cm_managed_alloc_doc},
    {"_device_alloc", cm_device_alloc_fn, METH_O, cm_device_alloc_doc},
    {"_device_free", cm_device_free_fn, METH_O, cm_device_free_doc},
    {"_memset", cm_memset_fn, METH_VARARGS, cm_memset_doc},
    {"_memalloc_on", cm_memalloc_on_fn, METH_VARARGS, cm_memalloc_on_doc},
    {"memory_stats", (PyCFunction)(void (*)(void))cm_memory_stats,
     METH_FASTCALL | METH_KEYWORDS, cm_memory_stats_doc},
    {NULL, NULL, 0, NULL},
};

int
cm_memory_init(PyObject *mod, cm_state *st)
{
    /* What the context layer reaches of this one (context/context.h). */
    cm_ctx_up.mm_default = &cm_mm_default;
    cm_ctx_up.mm_plugin = &cm_mm_plugin;
    cm_ctx_up.mm_pool = &cm_mm_pool;
    cm_ctx_up.mm_async = &cm_mm_async;
    cm_ctx_up.mm_builtin = cm_mm_builtin;
    cm_ctx_up.mm_uses_plugin = cm_mm_uses_plugin;
    cm_ctx_up.mm_prepare = cm_mm_prepare;
    cm_ctx_up.limit_device_init = cm_limit_device_init;
    cm_ctx_up.mem_alloc = cm_mem_alloc;
    cm_ctx_up.hostmem_context_save = cm_hostmem_context_save;
    cm_ctx_up.hostmem_context_restore = cm_hostmem_context_restore;
    st->Mem_type = (PyTypeObject *)PyType_FromModuleAndSpec(
        mod, &cm_mem_spec, NULL);
    if (st->Mem_type == NULL
        || PyModule_AddObjectRef(mod, "DeviceAllocation",
                                 (PyObject *)st->Mem_type) < 0) {
        return -1;
    }
    if (cm_release_init(mod, st) < 0 || cm_fdserve_init() < 0) {
        return -1;
    }
    return PyModule_AddFunctions(mod, cm_memory_functions);
}
