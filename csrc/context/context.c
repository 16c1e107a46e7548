/* SPDX-License-Identifier: MIT */
/*
 * context/context.c: primary contexts.
 *
 * Owns the registry of Context objects (one per device while its primary
 * context is retained; the Device objects are device.c's, the Python
 * type Context is ctxtypes.c's), the Context of the calling thread, of a
 * handle, a pointer or a device argument, making a context current
 * around a call (cm_context_activate, cm_context_enter,
 * cm_context_leave; and, for a bare handle without the GIL, cm_ctx_enter
 * and cm_ctx_leave), and peer access between contexts.  cudamem uses
 * primary contexts only: the first call on a thread with no current
 * context pushes device 0's, a current context that is not a primary one
 * is refused, and close() on the main thread releases and resets every
 * primary context so the next call starts fresh.
 *
 * Locks and the GIL: no lock; the registry is only touched with the GIL
 * held.  Retaining a primary context releases the GIL (CM_CU_NOGIL), and
 * so does any driver call while Python callbacks are in flight (CM_CU,
 * CM_CU_RAW), so after one the registry is checked again: a context made
 * meanwhile by another thread wins, one being closed is waited for, and
 * cm_context_activate / cm_context_enter check that the context is still
 * alive.  A new context's memory manager is made by Python code
 * (cudamem._emm), with no lock held.
 *
 * Closing a device (close() on the main thread, Device.reset()) against
 * other threads is close.c's; until it is over, a thread that needs the
 * device's context waits (GIL released) instead of retaining the primary
 * context being reset, which would give it a context destroyed under it.
 */
#include "context/devctx.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------ */
/* Context                                                             */
/* ------------------------------------------------------------------ */

cm_context_upcalls cm_ctx_up;

/* Give a new context its memory manager: the plugin if one is set (or
 * named by the environment): cudamem._emm._manager_for(ctx) (registered
 * as manager_for) returns it, initialised, or None for a built-in one;
 * else the built-in kind set_memory_manager chose (default, pool or
 * async), made here. */
static int
cm_context_make_manager(cm_context *c)
{
    PyObject *fn = CM_REGISTERED(manager_for);
    PyObject *mm;

    if (fn == NULL) {
        return -1;
    }
    mm = PyObject_CallOneArg(fn, (PyObject *)c);
    if (mm == NULL) {
        return -1;
    }
    if (mm == Py_None) {
        Py_DECREF(mm);
        c->mm_builtin = cm_ctx_up.mm_builtin();
        c->mm = c->mm_builtin;
        if (c->mm->create == NULL) {
            return 0;
        }
        return c->mm->create(c);
    }
    c->memory_manager = mm;
    c->mm = cm_ctx_up.mm_plugin;
    c->mm_builtin = cm_ctx_up.mm_default;
    return 0;
}

/* The handle each device's primary context had when cudamem last
 * retained it.  The driver keeps that handle across resets (a thread
 * whose current context was reset still has it current, destroyed until
 * someone retains the context again), so a current context found here is
 * known to be device i's primary without asking the driver, whose answer
 * about a context being reset by another thread is not to be relied on. */
static CUcontext cm_primary_seen[CM_MAX_DEVICES];

/* The device whose primary context cudamem knew as h, or -1. */
static int
cm_primary_device(CUcontext h)
{
    int i;

    for (i = 0; h != NULL && i < CM_MAX_DEVICES && i < cm_ndev; i++) {
        if (cm_primary_seen[i] == h) {
            return i;
        }
    }
    return -1;
}

/* The Context of device i, retaining its primary context if needed.
 * Borrowed reference. */
cm_context *
cm_context_get(int i)
{
    cm_device *d;
    cm_context *c;
    CUcontext h = NULL;
    size_t total = 0;
    int err;

again:
    if (cm_context_wait_reset(i) < 0) {
        return NULL;
    }
    if (cm_ctxs[i] != NULL) {
        return cm_ctxs[i];
    }
    d = cm_device_get(i);
    if (d == NULL) {
        return NULL;
    }
    if (!cm_device_cc_at_least(d, 3, 5)) {
        CM_RAISE(CudaSupportError,
                 "device %d has compute capability %d.%d; cudamem "
                 "needs 3.5 or newer", i, d->cc_major, d->cc_minor);
        return NULL;
    }
    CM_CU_NOGIL(err, DevicePrimaryCtxRetain, (&h, d->handle));
    if (err == 0 && cm_resetting[i]) {
        /* A close began meanwhile: what was retained is the context it
         * is about to reset.  Give it back and wait for the fresh one. */
        (void)CM_CU_RAW(DevicePrimaryCtxRelease, (d->handle));
        goto again;
    }
    if (err < 0 || CM_CU(DeviceTotalMem, (&total, d->handle)) < 0) {
        if (err == 0) {
            (void)CM_CU_RAW(DevicePrimaryCtxRelease, (d->handle));
        }
        return NULL;
    }
    if (cm_resetting[i]) {
        /* A close began while the GIL was released (the query). */
        (void)CM_CU_RAW(DevicePrimaryCtxRelease, (d->handle));
        goto again;
    }
    if (cm_ctxs[i] != NULL) {
        /* Another thread made it while the GIL was released: this retain
         * goes back, and the lookup starts over.  Not a return of
         * cm_ctxs[i] from here: the release may let go of the GIL (while
         * Python callbacks are in flight), and a reset on another thread
         * may clear the entry meanwhile (that was a NULL with no
         * exception: a SystemError from stream() on a GPU). */
        (void)CM_CU_RAW(DevicePrimaryCtxRelease, (d->handle));
        goto again;
    }
    /* The device's first context: CUDAMEM_DEVICE_MEMORY_LIMIT applies
     * now that its memory is known (a bad value raises here). */
    if (cm_ctx_up.limit_device_init(i, total) < 0) {
        (void)CM_CU_RAW(DevicePrimaryCtxRelease, (d->handle));
        return NULL;
    }
    c = PyObject_GC_New(cm_context, cm_st->Context_type);
    if (c == NULL) {
        (void)CM_CU_RAW(DevicePrimaryCtxRelease, (d->handle));
        return NULL;
    }
    c->device = (cm_device *)Py_NewRef(d);
    c->handle = h;
    cm_primary_seen[i] = h;
    c->alive = 1;
    c->pycalls = 0;
    c->total_mem = total;
    c->gen = ++cm_ctx_gen;
    c->memory_manager = NULL;
    c->mm = cm_ctx_up.mm_default;
    c->mm_builtin = cm_ctx_up.mm_default;
    c->mm_info_busy = 0;
    c->mm_init_pending = 0;
    c->pool = NULL;
    c->memq = NULL;
    c->ctxq = NULL;
    c->st_bytes = 0;
    c->st_peak = 0;
    c->st_count = 0;
    c->st_total_count = 0;
    c->lane_bytes = 0;
    c->lane_peak = 0;
    c->lane_count = 0;
    c->lane_total_count = 0;
    c->st_pinned = 0;
    c->lim_used = 0;
    c->plugin_bytes = 0;
    c->plugin_count = 0;
    c->plugin_total = 0;
    c->oom_collected_at = 0;
    c->oom_collect_end = 0;
    c->oom_collect_ns = 0;
    memset(c->peer_gen, 0, sizeof(c->peer_gen));
    c->peers_in = 0;
    c->closing = 0;
    c->n_stream_cache = 0;
    c->sync_begun = 0;
    c->sync_done = 0;
    c->weakreflist = NULL;
    PyObject_GC_Track(c);
    if (cm_ctx_up.ctx_init_memory(c) < 0) {
        c->alive = 0;
        Py_DECREF(c);
        (void)CM_CU_RAW(DevicePrimaryCtxRelease, (d->handle));
        return NULL;
    }
    cm_ctxs[i] = c;
    /* The manager's Python code may let other threads run, and a reset
     * of the device may take c away meanwhile (releasing its primary
     * context and the registry's reference): this reference keeps c
     * until it is known which happened. */
    Py_INCREF(c);
    err = cm_context_make_manager(c);
    if (cm_ctxs[i] != c) {
        Py_DECREF(c);
        if (err < 0) {
            return NULL;
        }
        goto again;  /* reset meanwhile: a fresh context is made */
    }
    if (err < 0) {
        cm_ctxs[i] = NULL;
        c->alive = 0;
        Py_DECREF(c);
        Py_DECREF(c);
        (void)CM_CU_RAW(DevicePrimaryCtxRelease, (d->handle));
        return NULL;
    }
    Py_DECREF(c);  /* the registry's reference stays */
    return c;
}

/* The registered Context whose handle is h, or NULL. */
cm_context *
cm_context_find(CUcontext h)
{
    int i;

    for (i = 0; i < CM_MAX_DEVICES && i < cm_ndev; i++) {
        if (cm_ctxs[i] != NULL && cm_ctxs[i]->handle == h) {
            return cm_ctxs[i];
        }
    }
    return NULL;
}

cm_context *
cm_context_current(void)
{
    CUcontext cur = NULL;
    CUdevice dev;
    cm_context *c;
    int i;
    int n;

    if (cm_driver_ensure() < 0) {
        return NULL;
    }
again:
    if (CM_CU(CtxGetCurrent, (&cur)) < 0) {
        return NULL;
    }
    c = cur != NULL ? cm_context_find(cur) : NULL;
    if (c != NULL) {
        return c;
    }
    i = cm_primary_device(cur);
    if (i >= 0) {
        /* A primary context of cudamem's, closed since (close(),
         * Device.reset(), maybe by another thread) and still current
         * here. */
        if (cm_resetting[i]
            && cm_resetter[i] != PyThread_get_thread_ident()) {
            PyErr_Format(PyExc_ValueError,
                         "the context of device %d was closed or reset "
                         "by another thread", i);
            return NULL;
        }
        c = cm_context_get(i);
        if (c == NULL) {
            return NULL;
        }
        if (c->handle != cur) {
            /* A driver that gave the fresh context a new handle: it
             * replaces the dead one on this thread's stack, and the
             * lookup starts over (the call may have let go of the GIL,
             * and another thread reset c meanwhile). */
            if (CM_CU(CtxSetCurrent, (c->handle)) < 0) {
                return NULL;
            }
            goto again;
        }
        return c;
    }
    /* A context destroyed while current here (Device.reset(), another
     * thread's close(), another library's reset) is popped, as close()
     * would have: the next one down, or a fresh one, serves. */
    while (cur != NULL && cm_context_find(cur) == NULL) {
        CUresult rc = CM_CU_RAW(CtxGetDevice, (&dev));
        CUcontext popped;

        if (rc != CUDA_ERROR_CONTEXT_IS_DESTROYED
            && rc != CUDA_ERROR_INVALID_CONTEXT) {
            break;
        }
        if (CM_CU(CtxPopCurrent, (&popped)) < 0
            || CM_CU(CtxGetCurrent, (&cur)) < 0) {
            return NULL;
        }
    }
    if (cur != NULL) {
        c = cm_context_find(cur);
        if (c != NULL) {
            return c;
        }
        /* Adopt the primary context another library made current. */
        if (CM_CU(CtxGetDevice, (&dev)) < 0
            || (n = cm_device_count()) < 0) {
            return NULL;
        }
        for (i = 0; i < n; i++) {
            if (cm_device_get(i) == NULL) {
                return NULL;
            }
            if (cm_devs[i]->handle == dev) {
                break;
            }
        }
        if (i < n && cm_resetting[i]) {
            /* Another thread is closing the context current here, maybe
             * in the middle of this thread's operation: a fresh context
             * must not take over its pointers. */
            PyErr_Format(PyExc_ValueError,
                         "the context of device %d was closed or reset "
                         "by another thread", i);
            return NULL;
        }
        if (i == n || (c = cm_context_get(i)) == NULL) {
            if (!PyErr_Occurred()) {
                PyErr_Format(PyExc_RuntimeError,
                             "cudamem cannot operate on the current CUDA "
                             "context %p: its device is unknown",
                             (void *)cur);
            }
            return NULL;
        }
        if (c->handle != cur
            && CM_CU_RAW(CtxGetDevice, (&dev))
                   == CUDA_ERROR_CONTEXT_IS_DESTROYED) {
            /* cur was being closed by another thread, which has now
             * destroyed it: pop it, as above. */
            goto again;
        }
        if (c->handle != cur) {
            PyErr_Format(PyExc_RuntimeError,
                         "cudamem cannot operate on non-primary CUDA "
                         "context %p", (void *)cur);
            return NULL;
        }
        return c;
    }
    if (cm_device_count() < 0) {
        return NULL;
    }
    if (cm_ndev == 0) {
        CM_RAISE(CudaSupportError,
                 "no CUDA device was found; set CUDAMEM_SIMULATOR=1 "
                 "to run on the CPU simulator");
        return NULL;
    }
    c = cm_context_get(0);
    if (c == NULL || CM_CU(CtxPushCurrent, (c->handle)) < 0) {
        return NULL;
    }
    /* Found again as the current context: the push may have let go of
     * the GIL, and another thread reset c meanwhile. */
    goto again;
}

/* ValueError for an object of ctx, which was closed or reset, or which
 * another thread is closing (its memory is going).  -1. */
static int
cm_context_dead(cm_context *ctx)
{
    PyErr_Format(PyExc_ValueError,
                 "the context of device %d was closed or reset; its "
                 "memory, streams and events are gone", ctx->device->id);
    return -1;
}

/*
 * cm_context_activate and cm_context_enter check that ctx is alive before
 * their driver calls and again after them: while Python callbacks are in
 * flight those calls let go of the GIL, and another thread may close ctx
 * meanwhile.  The second check is what the caller relies on: its next
 * driver call, made before any other release of the GIL, counts as in
 * flight before a close that began later destroys anything
 * (cm_driver_calls), so it never meets a destroyed stream or event.
 */
int
cm_context_activate(cm_context *ctx)
{
    CUcontext cur = NULL;

    if (!ctx->alive) {
        return cm_context_dead(ctx);
    }
    if (CM_CU(CtxGetCurrent, (&cur)) < 0
        || (cur != ctx->handle && CM_CU(CtxSetCurrent, (ctx->handle)) < 0)) {
        return -1;
    }
    return ctx->alive ? 0 : cm_context_dead(ctx);
}

int
cm_context_enter(cm_context *ctx, CUcontext *prev)
{
    CUcontext cur = NULL;

    *prev = NULL;
    if (!ctx->alive) {
        return cm_context_dead(ctx);
    }
    if (CM_CU(CtxGetCurrent, (&cur)) < 0) {
        return -1;
    }
    if (cur != ctx->handle) {
        if (CM_CU(CtxSetCurrent, (ctx->handle)) < 0) {
            return -1;
        }
        /* A thread that had no context keeps this one, as a first use
         * does. */
        cur = cur == NULL ? ctx->handle : cur;
    }
    if (!ctx->alive) {
        cm_context_leave(ctx, cur);
        return cm_context_dead(ctx);
    }
    *prev = cur;
    return 0;
}

void
cm_context_leave(cm_context *ctx, CUcontext prev)
{
    if (prev != NULL && prev != ctx->handle) {
        (void)CM_CU_RAW(CtxSetCurrent, (prev));
    }
}

cm_context *
cm_context_of_device(PyObject *dev)
{
    int i;

    if (cm_driver_ensure() < 0) {
        return NULL;
    }
    if (PyObject_TypeCheck(dev, cm_st->Device_type)) {
        i = ((cm_device *)dev)->id;
    }
    else if ((i = cm_device_arg(dev)) < 0) {
        return NULL;
    }
    return cm_context_get(i);
}

cm_context *
cm_context_of_handle(CUcontext h)
{
    return h == NULL ? NULL : cm_context_find(h);
}

cm_context *
cm_context_of_pointer(CUdeviceptr p)
{
    CUcontext h = NULL;
    int dev = -1;

    if (p == 0 || cm_driver_ensure() < 0) {
        PyErr_Clear();
        return NULL;
    }
    if (CM_CU_RAW(PointerGetAttribute,
                  (&h, CU_POINTER_ATTRIBUTE_CONTEXT, p)) == CUDA_SUCCESS
        && h != NULL) {
        return cm_context_find(h);
    }
    /* Memory of no one context (a stream-ordered pool's, or VMM memory)
     * still names its device. */
    if (CM_CU_RAW(PointerGetAttribute,
                  (&dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p))
            == CUDA_SUCCESS
        && dev >= 0 && dev < CM_MAX_DEVICES && dev < cm_ndev) {
        return cm_ctxs[dev];
    }
    return NULL;
}

/* Whether device a's contexts can map device b's memory (cached). */
int
cm_peer_possible(int a, int b)
{
    /* -1 unknown, else the driver's answer */
    static signed char known[CM_MAX_DEVICES][CM_MAX_DEVICES];
    static int init;
    int can = 0;

    if (!init) {
        memset(known, -1, sizeof(known));
        init = 1;
    }
    if (a == b) {
        return 1;
    }
    if (known[a][b] < 0) {
        if (cm_device_get(a) == NULL || cm_device_get(b) == NULL
            || CM_CU(DeviceCanAccessPeer,
                     (&can, cm_devs[a]->handle, cm_devs[b]->handle)) < 0) {
            return -1;
        }
        known[a][b] = (signed char)(can != 0);
    }
    return known[a][b];
}

int
cm_context_can_access_peer(cm_context *ctx, int peer)
{
    return cm_peer_possible(ctx->device->id, peer);
}

int
cm_context_peer_enabled(cm_context *ctx, cm_context *peer)
{
    int d = peer->device->id;

    return ctx == peer
           || (peer->alive && ctx->peer_gen[d] == peer->gen);
}

int
cm_context_enable_peer(cm_context *ctx, cm_context *peer)
{
    CUcontext prev;
    CUresult rc;
    int d = peer->device->id;
    int can;

    if (peer->closing && peer->alive) {
        return cm_context_dead(peer);
    }
    if (cm_context_peer_enabled(ctx, peer)) {
        return 0;
    }
    if (!peer->alive) {
        return cm_context_activate(peer);  /* raises */
    }
    can = cm_peer_possible(ctx->device->id, d);
    if (can < 0) {
        return -1;
    }
    if (!can) {
        PyErr_Format(PyExc_ValueError,
                     "device %d cannot access the memory of device %d: "
                     "the driver reports no peer access between them",
                     ctx->device->id, d);
        return -1;
    }
    if (cm_context_enter(ctx, &prev) < 0) {
        return -1;
    }
    rc = CM_CU_RAW(CtxEnablePeerAccess, (peer->handle, 0));
    cm_context_leave(ctx, prev);
    if (rc != CUDA_SUCCESS && rc != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) {
        return cm_raise_cu(rc, "cuCtxEnablePeerAccess");
    }
    /* Memory the driver's peer access does not cover (virtual memory,
     * stream-ordered pools) is opened by the manager; until it is, the
     * pair does not count as enabled, so a failure is tried again. */
    peer->peers_in |= (uint64_t)1 << ctx->device->id;
    if (peer->mm_builtin->peer != NULL
        && peer->mm_builtin->peer(peer, ctx->device->id) < 0) {
        return -1;
    }
    ctx->peer_gen[d] = peer->gen;
    return 0;
}

void
cm_context_sync_peers(cm_context *c)
{
    CUcontext hs[CM_MAX_DEVICES];
    CUcontext popped;
    int n = 0;
    int i;

    for (i = 0; i < CM_MAX_DEVICES && i < cm_ndev; i++) {
        if (((c->peers_in >> i) & 1) && cm_ctxs[i] != NULL
            && cm_ctxs[i] != c && cm_ctxs[i]->alive) {
            hs[n++] = cm_ctxs[i]->handle;
        }
    }
    if (n == 0) {
        return;
    }
    Py_BEGIN_ALLOW_THREADS
    for (i = 0; i < n; i++) {
        /* Errors are the other context's to report (a reset of it on
         * another thread, a sticky error): nothing to wait for then. */
        if (CM_CU_RAW(CtxPushCurrent, (hs[i])) == CUDA_SUCCESS) {
            (void)CM_CU_RAW(CtxSynchronize, ());
            (void)CM_CU_RAW(CtxPopCurrent, (&popped));
        }
    }
    Py_END_ALLOW_THREADS
}

int
cm_context_require_access(cm_context *user, cm_context *owner,
                          const char *what)
{
    int can;

    if (owner != NULL && owner != user && owner->closing && owner->alive) {
        return cm_context_dead(owner);
    }
    if (owner == NULL || owner == user
        || cm_context_peer_enabled(user, owner)) {
        return 0;
    }
    can = owner->alive
          ? cm_peer_possible(user->device->id, owner->device->id) : 0;
    if (can < 0) {
        return -1;
    }
    if (!can) {
        PyErr_Format(PyExc_ValueError,
                     "%s is memory of device %d, which device %d cannot "
                     "use: %s", what, owner->device->id, user->device->id,
                     owner->alive ? "the driver reports no peer access "
                                    "between the two devices"
                                  : "that device's context was closed");
        return -1;
    }
    return cm_context_enable_peer(user, owner);
}

int
cm_context_live(cm_context **out)
{
    int i;
    int n = 0;

    for (i = 0; i < CM_MAX_DEVICES && i < cm_ndev; i++) {
        if (cm_ctxs[i] != NULL && cm_ctxs[i]->alive) {
            out[n++] = cm_ctxs[i];
        }
    }
    return n;
}

int
cm_context_gen_live(unsigned long gen)
{
    int i;

    for (i = 0; i < CM_MAX_DEVICES && i < cm_ndev; i++) {
        if (cm_ctxs[i] != NULL && cm_ctxs[i]->alive
            && cm_ctxs[i]->gen == gen) {
            return 1;
        }
    }
    return 0;
}

/* Pop every context of the calling thread. */
int
cm_context_pop_all(void)
{
    CUcontext cur = NULL;
    CUcontext popped;

    for (;;) {
        if (CM_CU(CtxGetCurrent, (&cur)) < 0) {
            return -1;
        }
        if (cur == NULL) {
            return 0;
        }
        if (CM_CU(CtxPopCurrent, (&popped)) < 0) {
            return -1;
        }
    }
}

/* ------------------------------------------------------------------ */
/* Context switching without the GIL                                   */
/* ------------------------------------------------------------------ */

/* Make h current if it is not; *pushed says whether to pop.  No GIL
 * needed. */
CUresult
cm_ctx_enter(CUcontext h, int *pushed)
{
    CUcontext cur = NULL;
    CUresult rc;

    *pushed = 0;
    if (CM_CU_RAW(CtxGetCurrent, (&cur)) == CUDA_SUCCESS && cur == h) {
        return CUDA_SUCCESS;
    }
    rc = CM_CU_RAW(CtxPushCurrent, (h));
    *pushed = rc == CUDA_SUCCESS;
    return rc;
}

void
cm_ctx_leave(int pushed)
{
    CUcontext popped;

    if (pushed) {
        (void)CM_CU_RAW(CtxPopCurrent, (&popped));
    }
}
