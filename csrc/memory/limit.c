/* SPDX-License-Identifier: MIT */
/*
 * memory/limit.c: the per-process device memory limit, and what happens
 * when memory runs out.
 *
 * Owns:
 * - the limit of each device (cm_lim): bytes, 0 for none.  Set by
 *   set_memory_limit(), or from CUDAMEM_DEVICE_MEMORY_LIMIT (bytes, or a
 *   fraction of the device's memory) when the device's first context is
 *   made; it outlives close() and resets.
 * - the count of what a context holds against it (cm_context.lim_used):
 *   the device and managed memory cudamem holds from the driver in that
 *   context.  cm_limit_take() counts bytes before the driver is asked
 *   for them and refuses them when the limit would be crossed;
 *   cm_limit_give() uncounts them once the call that gives them back
 *   has been made.  Which bytes each manager counts: its table's
 *   functions (default.c, poolops.c) and docs/design.md.
 * - the count of a Python plugin's allocations: a weak reference to each
 *   pointer object the plugin hands out, whose callback uncounts it.
 * - the out-of-memory policy every allocation path applies before its
 *   one retry (cm_oom_recover: flush, trim, and collect garbage only
 *   where a collection could make room; while a CUDA graph capture
 *   cudamem began is in progress, no trim and only the frees the capture
 *   allows), and the error it raises at last, with its snapshot
 *   (cm_raise_oom_at).
 *
 * Locking: the limits and the counts are atomic, read and written with
 * or without the GIL (the pool's segments and the async manager's
 * memory are given back without it); a count goes up by compare and
 * swap, so that two threads cannot both pass the limit.  Which limit a
 * device has, and the records of the plugins' allocations, are decided
 * with the GIL held.
 */
#include "memory/memory.h"
#include "driver/bytesize.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CM_LIMIT_ENV "CUDAMEM_DEVICE_MEMORY_LIMIT"

/* What a limit, as the variable or a str spells it, turned out to be. */
enum {
    CM_LIM_NONE = 0,      /* not given */
    CM_LIM_BYTES,         /* a byte count */
    CM_LIM_FRACTION,      /* a fraction of the device's memory */
    CM_LIM_INVALID        /* neither */
};

/* The limit of each device in bytes, 0 for none; atomic. */
static size_t cm_lim[CM_MAX_DEVICES];
/* NOTE: guarded by the GIL.  Whether device d's limit is decided (by
 * set_memory_limit, or by the environment on its first context). */
static unsigned char cm_lim_decided[CM_MAX_DEVICES];

/* CUDAMEM_DEVICE_MEMORY_LIMIT as read when the module loaded. */
static int cm_env_kind = CM_LIM_NONE;
static size_t cm_env_bytes;
static double cm_env_fraction;
static char cm_env_text[80];   /* its text (cut), for messages */

static const char cm_lim_expected[] =
    "expected a byte count above 0 (digits with an optional K, M or G, "
    "such as 512M or 1GiB) or a fraction of the device's memory above 0 "
    "and at most 1 (such as 0.25)";

/* Parse s as the variable spells a limit: digits with an optional K, M
 * or G (followed by an optional B or iB), or a decimal fraction with a
 * point; blanks around.  CM_LIM_BYTES with *bytes (above 0, at most
 * 2**63 - 1), CM_LIM_FRACTION with *frac (above 0, at most 1), or
 * CM_LIM_INVALID. */
static int
cm_limit_parse(const char *s, size_t *bytes, double *frac)
{
    const char *p = s;
    const char *start;
    unsigned long long v = 0;
    int ndigits = 0;
    int point = 0;
    char buf[64];
    char *end;
    double f;

    while (isspace((unsigned char)*p)) {
        p++;
    }
    start = p;
    for (; isdigit((unsigned char)*p) || (*p == '.' && !point); p++) {
        if (*p == '.') {
            point = 1;
        }
        else {
            ndigits++;
        }
    }
    if (ndigits == 0) {
        return CM_LIM_INVALID;
    }
    if (point) {
        if ((size_t)(p - start) >= sizeof(buf)) {
            return CM_LIM_INVALID;
        }
        memcpy(buf, start, (size_t)(p - start));
        buf[p - start] = '\0';
        errno = 0;
        f = strtod(buf, &end);
        while (isspace((unsigned char)*p)) {
            p++;
        }
        if (*p != '\0' || *end != '\0' || errno != 0 || !(f > 0.0)
            || f > 1.0) {
            return CM_LIM_INVALID;
        }
        *frac = f;
        return CM_LIM_FRACTION;
    }
    if (cm_parse_bytes(s, (unsigned long long)INT64_MAX, &v) < 0 || v == 0) {
        return CM_LIM_INVALID;
    }
    *bytes = (size_t)v;
    return CM_LIM_BYTES;
}

size_t
cm_limit_of(int dev)
{
    if (dev < 0 || dev >= CM_MAX_DEVICES) {
        return 0;
    }
    return __atomic_load_n(&cm_lim[dev], __ATOMIC_RELAXED);
}

int
cm_limit_take(cm_context *ctx, size_t n)
{
    size_t lim = cm_limit_of(ctx->device->id);
    size_t cur;

    if (lim == 0) {
        __atomic_fetch_add(&ctx->lim_used, n, __ATOMIC_RELAXED);
        return 1;
    }
    cur = __atomic_load_n(&ctx->lim_used, __ATOMIC_RELAXED);
    do {
        if (cur > lim || n > lim - cur) {
            return 0;
        }
    } while (!__atomic_compare_exchange_n(&ctx->lim_used, &cur, cur + n, 1,
                                          __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    return 1;
}

void
cm_limit_give(cm_context *ctx, size_t n)
{
    size_t cur = __atomic_load_n(&ctx->lim_used, __ATOMIC_RELAXED);

    /* Never below 0: a count that wrapped would refuse every later
     * allocation. */
    while (!__atomic_compare_exchange_n(&ctx->lim_used, &cur,
                                        cur > n ? cur - n : 0, 1,
                                        __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
    }
}

size_t
cm_limit_used(cm_context *ctx)
{
    return __atomic_load_n(&ctx->lim_used, __ATOMIC_RELAXED);
}

int
cm_limit_device_init(int dev, size_t total)
{
    size_t lim = 0;

    if (dev < 0 || dev >= CM_MAX_DEVICES || cm_lim_decided[dev]) {
        return 0;
    }
    switch (cm_env_kind) {
    case CM_LIM_BYTES:
        if (cm_env_bytes > total) {
            PyErr_Format(PyExc_ValueError,
                         "%s=%s is not valid: %zu bytes is more than "
                         "device %d's memory (%zu bytes)", CM_LIMIT_ENV,
                         cm_env_text, cm_env_bytes, dev, total);
            return -1;
        }
        lim = cm_env_bytes;
        break;
    case CM_LIM_FRACTION:
        lim = (size_t)(cm_env_fraction * (double)total);
        if (lim == 0) {
            PyErr_Format(PyExc_ValueError,
                         "%s=%s is not valid: less than one byte of "
                         "device %d's memory", CM_LIMIT_ENV, cm_env_text,
                         dev);
            return -1;
        }
        break;
    case CM_LIM_INVALID:
        PyErr_Format(PyExc_ValueError, "%s=%s is not valid: %s",
                     CM_LIMIT_ENV, cm_env_text, cm_lim_expected);
        return -1;
    default:
        break;
    }
    __atomic_store_n(&cm_lim[dev], lim, __ATOMIC_RELAXED);
    cm_lim_decided[dev] = 1;
    return 0;
}

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

int
cm_limit_refuses(cm_context *ctx, size_t size)
{
    size_t lim = cm_limit_of(ctx->device->id);
    size_t used;

    if (lim == 0) {
        return 0;
    }
    used = cm_limit_used(ctx);
    return size > lim || used > lim - size;
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
        ctx->mm_builtin->stats(ctx, &reserved, &pool_free, &largest);
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

/* ------------------------------------------------------------------ */
/* A plugin's allocations                                              */
/* ------------------------------------------------------------------ */

/* The callback of the weak reference to a plugin's pointer object: its
 * allocation is no longer counted. */
static PyObject *
cm_plugin_freed(PyObject *mod, PyObject *wr)
{
    PyObject *counts = cm_st != NULL ? cm_st->plugin_counts : NULL;
    PyObject *key;
    PyObject *rec;
    cm_context *ctx;
    size_t size;

    (void)mod;
    if (counts == NULL) {
        Py_RETURN_NONE;          /* the module is being torn down */
    }
    key = PyLong_FromVoidPtr(wr);
    if (key == NULL) {
        return NULL;
    }
    rec = PyDict_GetItemWithError(counts, key);
    if (rec == NULL) {
        Py_DECREF(key);
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    /* rec = (weak reference, context, size): kept until uncounted. */
    Py_INCREF(rec);
    if (PyDict_DelItem(counts, key) < 0) {
        PyErr_Clear();
    }
    Py_DECREF(key);
    ctx = (cm_context *)PyTuple_GET_ITEM(rec, 1);
    size = (size_t)PyLong_AsSsize_t(PyTuple_GET_ITEM(rec, 2));
    ctx->plugin_bytes -= size;
    ctx->plugin_count--;
    cm_limit_give(ctx, size);
    Py_DECREF(rec);
    Py_RETURN_NONE;
}

static PyMethodDef cm_plugin_freed_def = {
    "_plugin_freed", cm_plugin_freed, METH_O,
    "Uncount a plugin's allocation whose pointer object went.",
};

void
cm_limit_plugin_track(cm_context *ctx, PyObject *mp, size_t size)
{
    cm_state *st = cm_st;
    PyObject *wr = NULL;
    PyObject *key = NULL;
    PyObject *rec = NULL;

    if (st->plugin_freed == NULL) {
        st->plugin_freed = PyCFunction_New(&cm_plugin_freed_def, NULL);
        if (st->plugin_freed == NULL) {
            goto err_uncount;
        }
    }
    if (st->plugin_counts == NULL) {
        st->plugin_counts = PyDict_New();
        if (st->plugin_counts == NULL) {
            goto err_uncount;
        }
    }
    /* A pointer object that takes no weak reference cannot be followed:
     * its bytes are not counted. */
    wr = PyWeakref_NewRef(mp, st->plugin_freed);
    if (wr == NULL) {
        goto err_uncount;
    }
    key = PyLong_FromVoidPtr(wr);
    rec = Py_BuildValue("(OOn)", wr, (PyObject *)ctx, (Py_ssize_t)size);
    if (key == NULL || rec == NULL
        || PyDict_SetItem(st->plugin_counts, key, rec) < 0) {
        goto err_uncount;
    }
    ctx->plugin_bytes += size;
    ctx->plugin_count++;
    ctx->plugin_total++;
    Py_DECREF(key);
    Py_DECREF(rec);
    Py_DECREF(wr);
    return;
err_uncount:
    PyErr_Clear();
    Py_XDECREF(key);
    Py_XDECREF(rec);
    Py_XDECREF(wr);
    cm_limit_give(ctx, size);
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

/* ------------------------------------------------------------------ */
/* set_memory_limit                                                    */
/* ------------------------------------------------------------------ */

/* The limit that arg asks for on a device of total bytes: *out (0 for
 * None: no limit).  0, or -1 with TypeError or ValueError. */
static int
cm_limit_arg(PyObject *arg, int dev, size_t total, size_t *out)
{
    const char *s;
    size_t bytes = 0;
    double f = 0.0;
    int kind;
    int overflow = 0;
    long long v;

    if (arg == Py_None) {
        *out = 0;
        return 0;
    }
    if (PyBool_Check(arg)
        || !(PyFloat_Check(arg) || PyIndex_Check(arg)
             || PyUnicode_Check(arg))) {
        PyErr_Format(PyExc_TypeError,
                     "set_memory_limit(): the limit must be a byte count "
                     "(an int), a fraction of the device's memory (a "
                     "float), a str such as '1GiB' or '0.25', or None, "
                     "not %.100s", Py_TYPE(arg)->tp_name);
        return -1;
    }
    if (PyUnicode_Check(arg)) {
        s = PyUnicode_AsUTF8(arg);
        if (s == NULL) {
            return -1;
        }
        kind = cm_limit_parse(s, &bytes, &f);
        if (kind == CM_LIM_INVALID) {
            PyErr_Format(PyExc_ValueError,
                         "set_memory_limit(%R): not a valid limit: %s", arg,
                         cm_lim_expected);
            return -1;
        }
    }
    else if (PyFloat_Check(arg)) {
        f = PyFloat_AS_DOUBLE(arg);
        if (!(f > 0.0) || f > 1.0) {
            PyErr_Format(PyExc_ValueError,
                         "set_memory_limit(%R): a fraction of the device's "
                         "memory must be above 0 and at most 1 (give a "
                         "byte count as an int, and None to remove the "
                         "limit)", arg);
            return -1;
        }
        kind = CM_LIM_FRACTION;
    }
    else {
        v = PyLong_AsLongLongAndOverflow(arg, &overflow);
        if (v == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (overflow < 0 || (overflow == 0 && v <= 0)) {
            PyErr_Format(PyExc_ValueError,
                         "set_memory_limit(%R): a byte count must be above "
                         "0 (None removes the limit)", arg);
            return -1;
        }
        bytes = overflow > 0 ? SIZE_MAX : (size_t)v;
        kind = CM_LIM_BYTES;
    }
    if (kind == CM_LIM_FRACTION) {
        bytes = (size_t)(f * (double)total);
        if (bytes == 0) {
            PyErr_Format(PyExc_ValueError,
                         "set_memory_limit(%R): less than one byte of device "
                         "%d's memory", arg, dev);
            return -1;
        }
    }
    else if (bytes > total) {
        PyErr_Format(PyExc_ValueError,
                     "set_memory_limit(%R): more than device %d's memory "
                     "(%zu bytes)", arg, dev, total);
        return -1;
    }
    *out = bytes;
    return 0;
}

PyDoc_STRVAR(cm_set_memory_limit_doc,
"set_memory_limit(limit, device=None)\n--\n\n"
"Limit the device memory this process allocates through cudamem on a "
"device (default: the current one): a byte count (an int), a fraction "
"of the device's memory (a float above 0 and at most 1), or a str as "
"CUDAMEM_DEVICE_MEMORY_LIMIT spells one ('1GiB', '0.25'); None removes "
"the limit.  Allocations that would cross it raise CudaOutOfMemoryError "
"after the usual flush, trim and retry.  memory_stats() shows it as "
"limit_bytes and what counts against it as limit_used_bytes.");

static PyObject *
cm_set_memory_limit_fn(PyObject *mod, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"limit", "device", NULL};
    PyObject *arg;
    PyObject *device = Py_None;
    cm_context *ctx;
    size_t lim;
    int dev;

    (void)mod;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:set_memory_limit",
                                     kwlist, &arg, &device)) {
        return NULL;
    }
    ctx = device == Py_None ? cm_context_current()
                            : cm_context_of_device(device);
    if (ctx == NULL) {
        return NULL;
    }
    dev = ctx->device->id;
    if (cm_limit_arg(arg, dev, ctx->total_mem, &lim) < 0) {
        return NULL;
    }
    __atomic_store_n(&cm_lim[dev], lim, __ATOMIC_RELAXED);
    cm_lim_decided[dev] = 1;
    Py_RETURN_NONE;
}

static PyMethodDef cm_limit_functions[] = {
    {"set_memory_limit", (PyCFunction)(void (*)(void))cm_set_memory_limit_fn,
     METH_VARARGS | METH_KEYWORDS, cm_set_memory_limit_doc},
    {NULL, NULL, 0, NULL},
};

int
cm_limit_init(PyObject *mod, cm_state *st)
{
    const char *v = getenv(CM_LIMIT_ENV);

    (void)st;
    if (v != NULL && v[0] != '\0') {
        snprintf(cm_env_text, sizeof(cm_env_text), "%s", v);
        cm_env_kind = cm_limit_parse(v, &cm_env_bytes, &cm_env_fraction);
    }
    return PyModule_AddFunctions(mod, cm_limit_functions);
}
