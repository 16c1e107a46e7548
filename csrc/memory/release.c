/* SPDX-License-Identifier: MIT */
/*
 * memory/release.c: deferred deallocation, the release path every owner
 * of driver memory and handles ends on.
 *
 * Owns:
 * - PendingDeallocs, a FIFO of driver releases (kind, handle, size).
 *   Every context has two, as in numba: its memory manager's (device,
 *   managed, pinned and mapped memory) and its own (streams, events,
 *   modules).  A queue flushes when its count goes above
 *   config.CUDA_DEALLOCS_COUNT or, for memory, its bytes above
 *   config.CUDA_DEALLOCS_RATIO times the device's memory; never while
 *   defer_cleanup() holds it; and on out-of-memory, close() and reset().
 * - the releases by context (cm_ctx_release and its kin): which queue a
 *   release goes to, the pool and async managers' releases run at once
 *   where they may, and the context's allocation counters;
 * - _set_dealloc_config and the queues' settings from the environment.
 *
 * Locks and the GIL: the GIL guards the queues; the contexts'
 * allocation counters are written with it held, atomically, since
 * PyTorch's lane (interop.c) reads them without it.  No lock of its
 * own: the managers' releases it runs take their pools' mutexes.  A
 * flush takes the entries out of the queue first and runs the driver
 * calls with the GIL given up (CM_DRIVER_BEGIN_NOGIL), as does a release
 * made at once when the queue cannot grow, so other threads may queue
 * more meanwhile; nothing of Python is touched until the GIL is back.
 *
 * No flush runs on a driver callback thread (the driver forbids API
 * calls there): entries simply wait for the next flush.  Nor while a
 * CUDA graph capture cudamem began forbids this thread the frees
 * (cm_capture_restricted), or, for the releases that synchronise the
 * context, while any capture is in progress: the entries stay queued,
 * the queue is marked held, and the end of the last capture flushes it
 * (cm_ctx_flush_held).  A flush runs its releases in the relaxed capture
 * mode, always: a capture another library began is not known here, and
 * in global mode it would make the driver refuse them and invalidate it.
 */
#include "memory/memory.h"
#include "memory/pool/graph/graph.h"
#include "memory/release.h"

#include <stdlib.h>
#include <string.h>

/* What this layer reaches of the layers above (memory/memory.h). */
cm_memory_upcalls cm_mem_up;

/* Settings read by every queue at use; config changes them at run time. */
static long cm_cfg_count = 10;         /* CUDA_DEALLOCS_COUNT */
static double cm_cfg_ratio = 0.2;      /* CUDA_DEALLOCS_RATIO */

/* ------------------------------------------------------------------ */
/* PendingDeallocs                                                     */
/* ------------------------------------------------------------------ */

static const char *
cm_rel_fn(int kind)
{
    switch (kind) {
    case CM_REL_DEVICE: return "cuMemFree";
    case CM_REL_HOST: return "cuMemFreeHost";
    case CM_REL_STREAM: return "cuStreamDestroy";
    case CM_REL_EVENT: return "cuEventDestroy";
    case CM_REL_MODULE: return "cuModuleUnload";
    case CM_REL_IPC: return "cuIpcCloseMemHandle";
    case CM_REL_POOL: return "cuEventRecord";
    case CM_REL_POOL_SYNC: return "cuCtxSynchronize";
    case CM_REL_ASYNC: return "cuMemFreeAsync";
    case CM_REL_ASYNC_SYNC: return "cuMemFreeAsync";
    case CM_REL_IPC_POOL: return "cuMemFree";
    case CM_REL_IPC_VMM: return "cuMemUnmap";
    case CM_REL_POOL_AFTER: return "cuEventRecord";
    case CM_REL_ASYNC_AFTER: return "cuMemFreeAsync";
    default: return "release";
    }
}

/* Run one release of ctx; no GIL, the right context current. */
static CUresult
cm_rel_run(cm_context *ctx, const cm_pending_item *it)
{
    CUresult rc;

    switch (it->kind) {
    case CM_REL_POOL:
    case CM_REL_ASYNC:
    case CM_REL_POOL_SYNC:
    case CM_REL_ASYNC_SYNC:
    case CM_REL_POOL_AFTER:
    case CM_REL_ASYNC_AFTER:
        return ctx->mm_builtin->release(ctx, it->kind, it->handle,
                                        it->size, it->stream);
    case CM_REL_DEVICE:
        if (cm_gpool_handle(it->handle)) {
            /* Allocated during a capture: back to its graph pool. */
            return cm_gpool_release(ctx, it->handle, 0);
        }
        /* The default manager's memory, or managed memory: counted
         * against the limit until now, whatever the driver answers (the
         * entry is dropped either way). */
        rc = CM_CU_RAW(MemFree, ((CUdeviceptr)it->handle));
        cm_limit_give(ctx, it->size);
        return rc;
    case CM_REL_HOST:
        return CM_CU_RAW(MemFreeHost, ((void *)it->handle));
    case CM_REL_STREAM:
        cm_gpools_stream_gone(ctx, (CUstream)it->handle);
        if (ctx->mm_builtin->stream_gone != NULL) {
            ctx->mm_builtin->stream_gone(ctx, (CUstream)it->handle);
        }
        return CM_CU_RAW(StreamDestroy, ((CUstream)it->handle));
    case CM_REL_EVENT:
        return CM_CU_RAW(EventDestroy, ((CUevent)it->handle));
    case CM_REL_MODULE:
        return CM_CU_RAW(ModuleUnload, ((CUmodule)it->handle));
    case CM_REL_IPC:
        return CM_CU_RAW(IpcCloseMemHandle, ((CUdeviceptr)it->handle));
    case CM_REL_IPC_POOL:
        return cm_mem_up.ipc_pool_release(it->handle);
    case CM_REL_IPC_VMM:
        return cm_mem_up.ipc_vmm_release(it->handle);
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

/* Whether release it must wait for now: any, while a capture forbids
 * this thread the potentially unsafe calls; one that synchronises the
 * context, while any capture is in progress (the driver refuses a
 * context's synchronisation while one of its streams captures).  No
 * driver call, no GIL needed. */
static int
cm_rel_waits(const cm_pending_item *it)
{
    if (cm_capture_restricted()) {
        return 1;
    }
    return (it->kind == CM_REL_POOL_SYNC || it->kind == CM_REL_ASYNC_SYNC)
           && cm_capture_any();
}

/* Let go of queued releases that will never run (their context is gone):
 * only the records of C state need it. */
static void
cm_pending_drop(cm_pending_item *items, Py_ssize_t n)
{
    Py_ssize_t i;

    if (cm_forked) {
        return;
    }
    for (i = 0; i < n; i++) {
        if (items[i].kind == CM_REL_IPC_POOL) {
            cm_mem_up.ipc_pool_drop(items[i].handle);
        }
        else if (items[i].kind == CM_REL_IPC_VMM) {
            cm_mem_up.ipc_vmm_drop(items[i].handle);
        }
    }
}

static int
cm_pending_over(cm_pending *q)
{
    /* Entries the last flush kept because their streams captured are
     * not counted: each flush tries them again, and one at every add
     * while a long capture runs would cost a driver query per kept
     * entry at each. */
    if (q->n - q->stuck > cm_cfg_count) {
        return 1;
    }
    return q->has_byte_limit
           && (double)(q->bytes - q->stuck_bytes)
                  > cm_cfg_ratio * (double)q->ctx->total_mem;
}

/* Run every queued release, oldest first, unless disabled.  On an error
 * the failing entry is dropped, the rest stay queued, and the error is
 * raised (-1).  0 when done or nothing to do; also when a capture holds
 * the releases back (cm_rel_waits): from the first that must wait, they
 * stay queued, in order, and the queue is marked held. */
int
cm_pending_flush(cm_pending *q)
{
    cm_pending_item *items;
    Py_ssize_t n;
    Py_ssize_t i;
    Py_ssize_t done = 0;
    Py_ssize_t kept = 0;
    int failed = 0;
    CUresult rc = CUDA_SUCCESS;
    CUcontext h;
    cm_context *ctx = q->ctx;
    int pushed = 0;
    int relaxed;

    if (q->disabled || q->n == 0 || cm_on_driver_thread()) {
        return 0;
    }
    if (q->ctx->alive && !cm_forked && cm_rel_waits(&q->items[0])) {
        q->held = 1;
        return 0;
    }
    items = q->items;
    n = q->n;
    q->items = NULL;
    q->n = 0;
    q->cap = 0;
    q->bytes = 0;
    q->held = 0;
    q->stuck = 0;
    q->stuck_bytes = 0;
    if (!q->ctx->alive || cm_forked) {
        cm_pending_drop(items, n);
        PyMem_Free(items);
        return 0;
    }
    h = q->ctx->handle;
    CM_DRIVER_BEGIN_NOGIL
    rc = cm_ctx_enter(h, &pushed);
    /* In the relaxed capture mode (two calls of a thread-local setting a
     * flush): a capture another library began in global mode, which
     * cudamem does not know of, would otherwise make the driver refuse
     * these frees and invalidate that capture.  They join no capture. */
    cm_capture_relax_always(&relaxed);
    for (i = 0; rc == CUDA_SUCCESS && i < n; i++) {
        /* Checked at each: a capture may begin meanwhile. */
        if (cm_rel_waits(&items[i])) {
            break;
        }
        rc = cm_rel_run(ctx, &items[i]);
        if (rc == CUDA_ERROR_NOT_READY) {
            /* Not now (its stream captures): kept, in order, ahead of
             * those not attempted; the others go on. */
            items[kept++] = items[i];
            rc = CUDA_SUCCESS;
        }
        done = i + 1;
    }
    cm_capture_unrelax(relaxed);
    cm_ctx_leave(pushed);
    CM_DRIVER_END_NOGIL
    if (rc == CUDA_SUCCESS && done == n && kept == 0) {
        PyMem_Free(items);
        return 0;
    }
    if (rc != CUDA_SUCCESS) {
        failed = items[done - 1].kind;
    }
    if (kept > 0) {
        memmove(items + kept, items + done,
                (size_t)(n - done) * sizeof(*items));
        n -= done - kept;
        done = 0;
    }
    /* Keep what was not attempted, ahead of anything queued meanwhile. */
    if (done < n) {
        Py_ssize_t rest = n - done;
        cm_pending_item *merged = PyMem_Malloc(
            (size_t)(rest + q->n) * sizeof(*merged));

        if (merged != NULL) {
            memcpy(merged, items + done, (size_t)rest * sizeof(*merged));
            if (q->n) {
                memcpy(merged + rest, q->items,
                       (size_t)q->n * sizeof(*merged));
            }
            for (i = 0; i < rest; i++) {
                q->bytes += merged[i].size;
                if (i < kept) {
                    q->stuck_bytes += merged[i].size;
                }
            }
            q->stuck += kept;
            PyMem_Free(q->items);
            q->items = merged;
            q->n += rest;
            q->cap = q->n;
        }
    }
    if (rc == CUDA_SUCCESS) {
        /* Held back from items[done] on, or kept. */
        q->held = 1;
        PyMem_Free(items);
        return 0;
    }
    cm_raise_cu(rc, cm_rel_fn(failed));
    PyMem_Free(items);
    return -1;
}

int
cm_pending_hold(cm_pending *q, int depth)
{
    int old = q->disabled;

    q->disabled = depth;
    return old;
}

/* Append an entry, flushing past the thresholds.  Never raises: a failed
 * flush is reported as unraisable. */
static void
cm_pending_add(cm_pending *q, int kind, uintptr_t handle, size_t size,
               CUstream stream)
{
    if (q->n == q->cap) {
        Py_ssize_t cap = q->cap ? q->cap * 2 : 16;
        cm_pending_item *p = PyMem_Realloc(q->items,
                                           (size_t)cap * sizeof(*p));

        if (p == NULL) {
            /* Cannot queue: release now rather than leak. */
            cm_pending_item it = {kind, handle, size, stream};
            CUresult rc;
            int relaxed;

            CM_DRIVER_BEGIN_NOGIL
            cm_capture_relax_always(&relaxed);
            rc = cm_rel_run(q->ctx, &it);
            cm_capture_unrelax(relaxed);
            CM_DRIVER_END_NOGIL
            (void)rc;
            return;
        }
        q->items = p;
        q->cap = cap;
    }
    q->items[q->n].kind = kind;
    q->items[q->n].handle = handle;
    q->items[q->n].size = size;
    q->items[q->n].stream = stream;
    q->n++;
    q->bytes += size;
    if (cm_pending_over(q) && cm_pending_flush(q) < 0) {
        PyErr_WriteUnraisable((PyObject *)q);
    }
}

static int
cm_pending_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(((cm_pending *)self)->ctx);
    return 0;
}

static int
cm_pending_clear_refs(PyObject *self)
{
    Py_CLEAR(((cm_pending *)self)->ctx);
    return 0;
}

static void
cm_pending_dealloc(PyObject *self)
{
    cm_pending *q = (cm_pending *)self;
    PyTypeObject *tp = Py_TYPE(self);

    PyObject_GC_UnTrack(self);
    /* Entries left here belong to a context that is gone. */
    cm_pending_drop(q->items, q->n);
    PyMem_Free(q->items);
    Py_CLEAR(q->ctx);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static cm_pending *
cm_pending_new(cm_context *ctx, int has_byte_limit)
{
    cm_pending *q = PyObject_GC_New(cm_pending, cm_st->Pending_type);

    if (q == NULL) {
        return NULL;
    }
    q->ctx = (cm_context *)Py_NewRef(ctx);
    q->items = NULL;
    q->n = 0;
    q->cap = 0;
    q->bytes = 0;
    q->disabled = 0;
    q->has_byte_limit = has_byte_limit;
    q->held = 0;
    q->stuck = 0;
    q->stuck_bytes = 0;
    q->since_try = 0;
    PyObject_GC_Track(q);
    return q;
}

static Py_ssize_t
cm_pending_len(PyObject *self)
{
    return ((cm_pending *)self)->n;
}

size_t
cm_pending_bytes(cm_pending *q)
{
    return q->bytes;
}

PyDoc_STRVAR(cm_pending_clear_doc,
"clear($self, /)\n--\n\n"
"Run every queued release now, oldest first; does nothing inside "
"defer_cleanup().  If one fails, that error is raised and the entries "
"after it stay queued.  While a CUDA graph capture cudamem began forbids "
"them, the releases stay queued until it ends.");

static PyObject *
cm_pending_clear(PyObject *self, PyObject *unused)
{
    (void)unused;
    if (cm_pending_flush((cm_pending *)self) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cm_pending_disable_doc,
"_disable($self, delta, /)\n--\n\n"
"Raise (delta=1) or lower (delta=-1) the defer_cleanup() depth.  The "
"thresholds apply again at the next add (the pool and async managers' "
"queues: on leaving the outermost level).");

/* Raise (d = 1) or lower (d = -1) q's hold; 0, or -1 with an
 * exception. */
static int
cm_pending_step(cm_pending *q, int d)
{
    if (d < 0 && q->disabled == 0) {
        PyErr_SetString(PyExc_RuntimeError,
                        "defer_cleanup() exited more often than entered");
        return -1;
    }
    q->disabled += d;
    /* As in numba, leaving the outermost level leaves the queue as it
     * is: the thresholds apply at the next add, so a block that ends a
     * hot loop does not stall on frees.  Returning blocks to the pool
     * and async managers never waits, so their queues still apply the
     * thresholds here. */
    if (q->disabled == 0 && q->has_byte_limit
        && q->ctx->mm->ordered && cm_pending_over(q)) {
        return cm_pending_flush(q);
    }
    return 0;
}

static PyObject *
cm_pending_disable(PyObject *self, PyObject *arg)
{
    long d = PyLong_AsLong(arg);

    if (d == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (d != 1 && d != -1) {
        PyErr_SetString(PyExc_ValueError, "delta must be 1 or -1");
        return NULL;
    }
    if (cm_pending_step((cm_pending *)self, (int)d) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cm_pending_disable_cm_doc,
"disable($self, /)\n--\n\n"
"A context manager that holds this queue while its block runs, as "
"defer_cleanup() does; it nests.  It is the queue itself: entering "
"raises the hold, leaving lowers it.");

static PyObject *
cm_pending_disable_cm(PyObject *self, PyObject *unused)
{
    (void)unused;
    return Py_NewRef(self);
}

static PyObject *
cm_pending_enter(PyObject *self, PyObject *unused)
{
    (void)unused;
    if (cm_pending_step((cm_pending *)self, 1) < 0) {
        return NULL;
    }
    return Py_NewRef(self);
}

static PyObject *
cm_pending_exit(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)args;
    (void)nargs;
    if (cm_pending_step((cm_pending *)self, -1) < 0) {
        return NULL;
    }
    Py_RETURN_FALSE;
}

/* numba's _max_pending_bytes: the byte threshold, the device's memory
 * times CUDA_DEALLOCS_RATIO for a queue of memory, 0 for the context's
 * own (its entries have no size). */
static PyObject *
cm_pending_get_max_bytes(PyObject *self, void *unused)
{
    cm_pending *q = (cm_pending *)self;

    (void)unused;
    if (!q->has_byte_limit) {
        return PyLong_FromLong(0);
    }
    return PyLong_FromDouble(cm_cfg_ratio * (double)q->ctx->total_mem);
}

static PyObject *
cm_pending_get_bytes(PyObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromSize_t(((cm_pending *)self)->bytes);
}

static PyObject *
cm_pending_get_disabled(PyObject *self, void *unused)
{
    (void)unused;
    return PyBool_FromLong(((cm_pending *)self)->disabled > 0);
}

static PyGetSetDef cm_pending_getset[] = {
    {"pending_bytes", cm_pending_get_bytes, NULL,
     "Bytes the queued releases will give back.", NULL},
    {"_size", cm_pending_get_bytes, NULL, "numba's name of pending_bytes.",
     NULL},
    {"is_disabled", cm_pending_get_disabled, NULL,
     "Whether defer_cleanup() holds this queue.", NULL},
    {"_max_pending_bytes", cm_pending_get_max_bytes, NULL,
     "numba's name of the byte threshold: the pending bytes above which "
     "the queue flushes (0: none).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef cm_pending_methods[] = {
    {"clear", cm_pending_clear, METH_NOARGS, cm_pending_clear_doc},
    {"_disable", cm_pending_disable, METH_O, cm_pending_disable_doc},
    {"disable", cm_pending_disable_cm, METH_NOARGS,
     cm_pending_disable_cm_doc},
    {"__enter__", cm_pending_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))cm_pending_exit,
     METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(cm_pending_doc,
"A context's queue of pending driver releases (deferred deallocation): "
"len() entries, pending_bytes, clear(), disable().");

static PyType_Slot cm_pending_slots[] = {
    {Py_tp_doc, (void *)cm_pending_doc},
    {Py_tp_dealloc, cm_pending_dealloc},
    {Py_tp_traverse, cm_pending_traverse},
    {Py_tp_clear, cm_pending_clear_refs},
    {Py_mp_length, cm_pending_len},
    {Py_sq_length, cm_pending_len},
    {Py_tp_getset, cm_pending_getset},
    {Py_tp_methods, cm_pending_methods},
    {0, NULL},
};

static PyType_Spec cm_pending_spec = {
    .name = "cudamem.PendingDeallocs",
    .basicsize = sizeof(cm_pending),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC
             | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = cm_pending_slots,
};

/* ------------------------------------------------------------------ */
/* Releases, by context                                                */
/* ------------------------------------------------------------------ */

void
cm_ctx_release(cm_context *ctx, int kind, uintptr_t handle, size_t size)
{
    cm_ctx_release_on(ctx, kind, handle, size, NULL);
}

/* Run a pool or async release now, in ctx; 0, or -1 with an exception. */
static int
cm_pool_release_now(cm_context *ctx, int kind, uintptr_t handle,
                    size_t size, CUstream stream)
{
    cm_pending *q = ctx->memq;
    CUresult rc;
    int pushed = 0;

    rc = cm_ctx_enter(ctx->handle, &pushed);
    if (rc != CUDA_SUCCESS) {
        return cm_cu_check(rc, "cuCtxPushCurrent");
    }
    rc = ctx->mm_builtin->release(ctx, kind, handle, size, stream);
    cm_ctx_leave(pushed);
    if (rc == CUDA_ERROR_NOT_READY) {
        /* Not now (its stream captures): a later flush tries again. */
        cm_pending_add(q, kind, handle, size, stream);
        return 0;
    }
    if (rc == CUDA_SUCCESS && q->stuck > 0 && ++q->since_try > cm_cfg_count) {
        /* Kept releases wait for captures to end, which nothing here
         * hears of: tried again every CUDA_DEALLOCS_COUNT releases made
         * at once, so their memory does not wait for the thresholds. */
        q->since_try = 0;
        return cm_pending_flush(q);
    }
    return cm_cu_check(rc, cm_rel_fn(kind));
}

int
cm_ctx_deferring(cm_context *ctx)
{
    return __atomic_load_n(&ctx->memq->disabled, __ATOMIC_RELAXED) != 0;
}

void
cm_ctx_count_alloc(cm_context *ctx, size_t size)
{
    size_t b = ctx->st_bytes + size;
    size_t all = b + __atomic_load_n(&ctx->lane_bytes, __ATOMIC_RELAXED);

    __atomic_store_n(&ctx->st_bytes, b, __ATOMIC_RELAXED);
    __atomic_store_n(&ctx->st_count, ctx->st_count + 1, __ATOMIC_RELAXED);
    __atomic_store_n(&ctx->st_total_count, ctx->st_total_count + 1,
                     __ATOMIC_RELAXED);
    if (all > ctx->st_peak) {
        __atomic_store_n(&ctx->st_peak, all, __ATOMIC_RELAXED);
    }
}

void
cm_ctx_count_free(cm_context *ctx, size_t size)
{
    __atomic_store_n(&ctx->st_bytes, ctx->st_bytes - size, __ATOMIC_RELAXED);
    __atomic_store_n(&ctx->st_count, ctx->st_count - 1, __ATOMIC_RELAXED);
}

void
cm_ctx_release_on(cm_context *ctx, int kind, uintptr_t handle, size_t size,
                  CUstream stream)
{
    int memory = kind == CM_REL_DEVICE || kind == CM_REL_POOL
                 || kind == CM_REL_ASYNC || kind == CM_REL_POOL_SYNC
                 || kind == CM_REL_ASYNC_SYNC || kind == CM_REL_POOL_AFTER
                 || kind == CM_REL_ASYNC_AFTER;

    if (handle == 0 || !ctx->alive || cm_forked) {
        return;
    }
    if (memory) {
        cm_ctx_count_free(ctx, size);
    }
    cm_ctx_release_uncounted(ctx, kind, handle, size, stream);
}

void
cm_ctx_release_uncounted(cm_context *ctx, int kind, uintptr_t handle,
                         size_t size, CUstream stream)
{
    cm_pending *q;
    int memory = kind == CM_REL_DEVICE || kind == CM_REL_POOL
                 || kind == CM_REL_ASYNC || kind == CM_REL_POOL_SYNC
                 || kind == CM_REL_ASYNC_SYNC || kind == CM_REL_POOL_AFTER
                 || kind == CM_REL_ASYNC_AFTER;

    if (handle == 0 || !ctx->alive || cm_forked) {
        return;
    }
    q = (memory || kind == CM_REL_HOST || kind == CM_REL_IPC
         || kind == CM_REL_IPC_POOL || kind == CM_REL_IPC_VMM)
            ? ctx->memq : ctx->ctxq;
    if ((kind == CM_REL_POOL || kind == CM_REL_ASYNC) && !q->disabled
        && !cm_on_driver_thread()) {
        if (cm_pool_release_now(ctx, kind, handle, size, stream) < 0) {
            PyErr_WriteUnraisable((PyObject *)q);
        }
        return;
    }
    cm_pending_add(q, kind, handle, size, stream);
}

int
cm_ctx_flush(cm_context *ctx)
{
    int a = cm_pending_flush(ctx->memq);
    int b = a < 0 ? 0 : cm_pending_flush(ctx->ctxq);

    return (a < 0 || b < 0) ? -1 : 0;
}

/* Flush those queues of ctx that a capture held back (the last capture
 * ended); 0, or -1 with the error of a release raised. */
static int
cm_ctx_flush_held(cm_context *ctx)
{
    int a = 0;
    int b = 0;

    if (ctx->memq != NULL && ctx->memq->held) {
        a = cm_pending_flush(ctx->memq);
    }
    if (a == 0 && ctx->ctxq != NULL && ctx->ctxq->held) {
        b = cm_pending_flush(ctx->ctxq);
    }
    return (a < 0 || b < 0) ? -1 : 0;
}

int
cm_ctx_init_memory(cm_context *ctx)
{
    ctx->memq = cm_pending_new(ctx, 1);
    if (ctx->memq == NULL) {
        return -1;
    }
    ctx->ctxq = cm_pending_new(ctx, 0);
    if (ctx->ctxq == NULL) {
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(cm_set_dealloc_config_doc,
"_set_dealloc_config(count, ratio)\n--\n\n"
"Set CUDA_DEALLOCS_COUNT and CUDA_DEALLOCS_RATIO (cudamem.config does "
"this whenever they change).");

static PyObject *
cm_set_dealloc_config(PyObject *mod, PyObject *args)
{
    long count;
    double ratio;

    (void)mod;
    if (!PyArg_ParseTuple(args, "ld:_set_dealloc_config", &count, &ratio)) {
        return NULL;
    }
    if (count < 0 || ratio < 0.0) {
        PyErr_SetString(PyExc_ValueError,
                        "CUDA_DEALLOCS_COUNT and CUDA_DEALLOCS_RATIO must "
                        "not be negative");
        return NULL;
    }
    cm_cfg_count = count;
    cm_cfg_ratio = ratio;
    Py_RETURN_NONE;
}

/* An environment setting: CUDAMEM_<name> wins over NUMBA_CUDA_<name>. */
static const char *
cm_env_setting(const char *name)
{
    char key[96];
    const char *v;

    snprintf(key, sizeof(key), "CUDAMEM_%s", name);
    v = getenv(key);
    if (v == NULL || v[0] == '\0') {
        snprintf(key, sizeof(key), "NUMBA_CUDA_%s", name);
        v = getenv(key);
    }
    return (v == NULL || v[0] == '\0') ? NULL : v;
}

static PyMethodDef cm_release_functions[] = {
    {"_set_dealloc_config", cm_set_dealloc_config, METH_VARARGS,
     cm_set_dealloc_config_doc},
    {NULL, NULL, 0, NULL},
};

int
cm_release_init(PyObject *mod, cm_state *st)
{
    const char *v;

    /* What the context layer reaches of this file (context/context.h). */
    cm_ctx_up.ctx_init_memory = cm_ctx_init_memory;
    cm_ctx_up.ctx_flush = cm_ctx_flush;
    cm_ctx_up.ctx_flush_held = cm_ctx_flush_held;
    cm_ctx_up.pending_hold = cm_pending_hold;
    cm_ctx_up.ctx_release = cm_ctx_release;
    if ((v = cm_env_setting("MAX_PENDING_DEALLOCS_COUNT")) != NULL) {
        cm_cfg_count = strtol(v, NULL, 10);
    }
    if ((v = cm_env_setting("MAX_PENDING_DEALLOCS_RATIO")) != NULL) {
        cm_cfg_ratio = strtod(v, NULL);
    }
    st->Pending_type = (PyTypeObject *)PyType_FromModuleAndSpec(
        mod, &cm_pending_spec, NULL);
    if (st->Pending_type == NULL
        || PyModule_AddObjectRef(mod, "PendingDeallocs",
                                 (PyObject *)st->Pending_type) < 0) {
        return -1;
    }
    return PyModule_AddFunctions(mod, cm_release_functions);
}
