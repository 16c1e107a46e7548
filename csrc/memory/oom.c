/* SPDX-License-Identifier: MIT */
/*
 * memory/oom.c: what happens when memory runs out: the out-of-memory
 * policy every allocation path applies before its one retry
 * (cm_oom_recover: flush, trim, and collect garbage only where a
 * collection could make room; while a CUDA graph capture cudamem began
 * is in progress, no trim and only the frees the capture allows), the
 * refusal no recovery could change (past the device's memory), the
 * error raised at last, with its snapshot (cm_raise_oom_at), and a
 * plugin's allocation counted against the limit after that policy
 * (cm_limit_plugin_take).
 * The limit itself and its counts are limit.c's.
 *
 * Locks and the GIL: runs with the GIL held; it takes no lock of its
 * own.  The flush and trim it runs release the GIL around their driver
 * calls (release.c, the managers' trim).
 */
#include "memory/memory.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------ */
/* Out of memory: the policy and the error                             */
/* ------------------------------------------------------------------ */

/* Set exc.name to a new reference v (stolen); 0 or -1. */
static int
cm_set_attr_steal(PyObject *exc, const char *name, PyObject *v)
{
    int r;

    if (v == NULL) {
        return -1;
    }
    r = PyObject_SetAttrString(exc, name, v);
    Py_DECREF(v);
    return r;
}

void
cm_raise_oom_at(cm_context *ctx, CUresult rc, size_t size, const char *fn,
                int where)
{
    size_t free_b = 0;
    size_t total_b = 0;
    size_t reserved = 0;
    size_t pool_free = 0;
    long long largest = -1;
    long pages;
    long avail;
    long psize;
    char lbuf[32];
    char wbuf[64];
    char mbuf[128];
    size_t lim = cm_limit_of(ctx->device->id);
    size_t used = cm_limit_used(ctx);
    size_t pending = cm_pending_bytes(ctx->memq);
    PyObject *exc;
    PyObject *msg;

    if (where == CM_OOM_HOST) {
        /* Page-locked memory comes from the host's RAM; no pool of
         * cudamem's holds it once the retry has trimmed the cache. */
        pages = sysconf(_SC_PHYS_PAGES);
        avail = sysconf(_SC_AVPHYS_PAGES);
        psize = sysconf(_SC_PAGESIZE);
        if (pages > 0 && avail >= 0 && psize > 0) {
            total_b = (size_t)pages * (size_t)psize;
            free_b = (size_t)avail * (size_t)psize;
        }
        snprintf(wbuf, sizeof(wbuf), "in host memory");
    }
    else {
        /* Device and managed memory both come from the device's. */
        (void)CM_CU_RAW(MemGetInfo, (&free_b, &total_b));
        ctx->mm_builtin->stats(ctx, &reserved, &pool_free, &largest);
        snprintf(wbuf, sizeof(wbuf), "on device %d", ctx->device->id);
    }
    cm_hist_note(CM_HIST_OOM, where == CM_OOM_HOST ? CM_HIST_PINNED
                                                   : CM_HIST_DEVICE,
                 ctx, 0, 0, size);
    cm_raise_cu(rc, fn);
    exc = PyErr_GetRaisedException();
    if (exc == NULL) {
        return;
    }
    if (largest < 0) {
        snprintf(lbuf, sizeof(lbuf), "unknown");
    }
    else {
        snprintf(lbuf, sizeof(lbuf), "%lld bytes", largest);
    }
    mbuf[0] = '\0';
    if (lim != 0 && where != CM_OOM_HOST) {
        snprintf(mbuf, sizeof(mbuf),
                 "; this process's memory limit on the device is %zu "
                 "bytes, %zu of them held", lim, used);
    }
    msg = PyUnicode_FromFormat(
        "Call to %s results in CUDA_ERROR_OUT_OF_MEMORY: %zu bytes "
        "requested, %zu of %zu bytes free %s, %zu bytes in "
        "pending frees, %zu bytes held in pools (%zu of them free), "
        "largest free pooled block %s%s%s",
        fn, size, free_b, total_b, wbuf, pending,
        reserved, pool_free, lbuf, mbuf,
        cm_capture_any()
            ? "; a CUDA graph capture is in progress, so cudamem neither "
              "synchronised nor gave cached memory back to make room"
            : "");
    if (msg == NULL
        || PyObject_SetAttrString(exc, "msg", msg) < 0
        || cm_set_attr_steal(exc, "requested", PyLong_FromSize_t(size)) < 0
        || cm_set_attr_steal(exc, "free", PyLong_FromSize_t(free_b)) < 0
        || cm_set_attr_steal(exc, "total", PyLong_FromSize_t(total_b)) < 0
        || cm_set_attr_steal(exc, "pending_bytes",
                             PyLong_FromSize_t(pending)) < 0
        || cm_set_attr_steal(exc, "pool_reserved",
                             PyLong_FromSize_t(reserved)) < 0
        || cm_set_attr_steal(exc, "largest_free_block",
                             largest < 0 ? Py_NewRef(Py_None)
                                         : PyLong_FromLongLong(largest))
           < 0
        || cm_set_attr_steal(exc, "limit",
                             lim == 0 || where == CM_OOM_HOST
                                 ? Py_NewRef(Py_None)
                                 : PyLong_FromSize_t(lim)) < 0
        || cm_set_attr_steal(exc, "limit_used",
                             PyLong_FromSize_t(where == CM_OOM_HOST ? 0
                                                                    : used))
           < 0
        || (where != CM_OOM_HOST && cm_interop_oom_note(ctx, exc) < 0)) {
        Py_XDECREF(msg);
        Py_DECREF(exc);
        return;
    }
    Py_DECREF(msg);
    PyErr_SetRaisedException(exc);
}

/* Run gc.collect(); 0 or -1. */
static int
cm_gc_collect(void)
{
    PyObject *gc = PyImport_ImportModule("gc");
    PyObject *r;

    if (gc == NULL) {
        return -1;
    }
    r = PyObject_CallMethod(gc, "collect", NULL);
    Py_DECREF(gc);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

/* Whether collecting garbage may make room for size more bytes in ctx
 * (managed: of managed memory, which may exceed the device's), the
 * queues flushed and the pools trimmed.  A collection frees only
 * objects alive now, and which of them are unreachable only the
 * collection itself finds out, so the answer is no only where no outcome
 * of it could help: no owner of ctx's device memory is alive (no
 * DeviceAllocation or managed HostAllocation, nothing PyTorch holds
 * through the lane, no plugin pointer object counted), or the request
 * does not fit even with every one of them gone: past the device's
 * memory, or past the limit less the bytes no collection can give back
 * (the count less everything alive and everything the pool holds). */
static int
cm_oom_collect_may_help(cm_context *ctx, size_t size, int managed)
{
    size_t lane_bytes = __atomic_load_n(&ctx->lane_bytes, __ATOMIC_RELAXED);
    size_t lane_count = __atomic_load_n(&ctx->lane_count, __ATOMIC_RELAXED);
    size_t reserved = 0;
    size_t pool_free = 0;
    long long largest = -1;
    size_t freeable;
    size_t floor;
    size_t used;
    size_t lim;

    if (ctx->st_count + lane_count + ctx->plugin_count == 0) {
        return 0;
    }
    if (!managed && size > ctx->total_mem) {
        return 0;
    }
    lim = cm_limit_of(ctx->device->id);
    if (lim == 0) {
        return 1;
    }
    if (ctx->mm_builtin->kind == CM_MM_POOL) {
        ctx->mm_builtin->stats(ctx, &reserved, &pool_free, &largest);
        if (reserved >= size) {
            /* A segment may serve it once its blocks are gone, with
             * nothing more counted. */
            return 1;
        }
    }
    freeable = ctx->st_bytes + lane_bytes + ctx->plugin_bytes + reserved;
    used = cm_limit_used(ctx);
    floor = used > freeable ? used - freeable : 0;
    return floor < lim && size <= lim - floor;
}

/* No manager and no recovery can serve a request past the device's
 * whole memory, and asking is slow: under the async manager 0.7 s a
 * request on the H200, against 14 ms under the other managers (the
 * stream-ordered pool seems to take what it can before it refuses: 7 MB
 * were free after one such refusal, and the trim gives it back).  The
 * driver's answer, without asking it. */
int
cm_oom_past_device(cm_context *ctx, size_t size, const char *fn)
{
    if (size <= ctx->total_mem) {
        return 0;
    }
    cm_raise_oom_at(ctx, CUDA_ERROR_OUT_OF_MEMORY, size, fn, CM_OOM_DEVICE);
    return -1;
}

/* Run the pending frees and trim the pools; 0 or -1.  While a capture
 * cudamem began is in progress the trim, which synchronises the context,
 * is not made (the driver would refuse it and invalidate the capture),
 * and the frees run only where the capture allows them (the queue holds
 * them back otherwise). */
static int
cm_oom_make_room(cm_context *ctx)
{
    if (cm_pending_flush(ctx->memq) < 0
        || (!cm_capture_any() && ctx->mm_builtin->trim(ctx) < 0)) {
        return -1;
    }
    return 0;
}

/* The allocations ever made in ctx whose owners a collection could
 * free. */
static size_t
cm_oom_owners_made(cm_context *ctx)
{
    return ctx->st_total_count
           + __atomic_load_n(&ctx->lane_total_count, __ATOMIC_RELAXED)
           + ctx->plugin_total;
}

/* Whether what the release queue holds and the pools' free bytes, all
 * counted against the limit until given back, could make room for size
 * bytes under it (lim nonzero). */
static int
cm_oom_cheap_room(cm_context *ctx, size_t size, size_t lim)
{
    size_t reserved = 0;
    size_t pool_free = 0;
    long long largest = -1;
    size_t back;
    size_t used = cm_limit_used(ctx);

    if (size > lim) {
        return 0;
    }
    back = cm_pending_bytes(ctx->memq);
    if (ctx->mm_builtin->kind == CM_MM_POOL) {
        /* What the trim gives back: on virtual memory the free bytes
         * within pages in use stay; counted, they made every refusal
         * trim (a context synchronisation) for nothing. */
        if (ctx->mm_builtin->trimmable != NULL) {
            pool_free = ctx->mm_builtin->trimmable(ctx);
        }
        else {
            ctx->mm_builtin->stats(ctx, &reserved, &pool_free, &largest);
        }
        back += pool_free;
    }
    return back != 0 && (used > back ? used - back : 0) <= lim - size;
}

static long long
cm_oom_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Whether a retry should collect garbage again, made allocations having
 * been made in ctx so far, at time now.  A collection finds the owners
 * that became garbage; the last one found those of every allocation
 * made before it, so it is due again at once when owners were made
 * since; else only once 100 times what it took has passed (an owner
 * made before it may have been put in a cycle and dropped since: no
 * event cudamem sees tells).  A loop probing for room so pays one
 * collection, then at most 1 % of its time, not a collection a probe. */
static int
cm_oom_collect_due(cm_context *ctx, size_t made, long long now)
{
    if (ctx->oom_collect_end == 0 || made != ctx->oom_collected_at) {
        return 1;
    }
    return now - ctx->oom_collect_end >= 100 * ctx->oom_collect_ns;
}

int
cm_oom_recover(cm_context *ctx, size_t size, int managed)
{
    int by_limit = cm_limit_refuses(ctx, size);
    long long now;
    size_t made;
    int r;

    if (by_limit) {
        /* Nothing was asked of the driver: a refusal costs what the
         * answer costs, unless freeing something can change it. */
        if (cm_oom_cheap_room(ctx, size, cm_limit_of(ctx->device->id))) {
            return cm_oom_make_room(ctx) < 0 ? -1 : 1;
        }
    }
    else if (cm_oom_make_room(ctx) < 0) {
        return -1;
    }
    if (!cm_oom_collect_may_help(ctx, size, managed)) {
        return !by_limit;
    }
    /* Amortised: see cm_oom_collect_due. */
    made = cm_oom_owners_made(ctx);
    now = cm_oom_now_ns();
    if (!cm_oom_collect_due(ctx, made, now)) {
        return !by_limit;
    }
    ctx->oom_collected_at = made;
    /* Cycles collected queue or run their frees. */
    r = cm_gc_collect();
    ctx->oom_collect_end = cm_oom_now_ns();
    ctx->oom_collect_ns = ctx->oom_collect_end - now;
    if (r < 0 || cm_oom_make_room(ctx) < 0) {
        return -1;
    }
    return 1;
}

int
cm_limit_plugin_take(cm_context *ctx, size_t size, const char *fn,
                     int managed)
{
    int r;

    if (cm_limit_take(ctx, size)) {
        return 0;
    }
    r = cm_oom_recover(ctx, size, managed);
    if (r < 0) {
        return -1;
    }
    if (r > 0 && cm_limit_take(ctx, size)) {
        return 0;
    }
    cm_raise_oom_at(ctx, CUDA_ERROR_OUT_OF_MEMORY, size, fn, CM_OOM_DEVICE);
    return -1;
}
