/* SPDX-License-Identifier: MIT */
/*
 * memory/limit.c: the per-process device memory limit and what counts
 * against it.
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
 *
 * What happens when memory runs out is oom.c's.
 *
 * Locks and the GIL: no lock; the limits and the counts are atomic, read
 * and written with or without the GIL (the pool's segments and the async
 * manager's memory are given back without it); a count goes up by
 * compare and swap, so that two threads cannot both pass the limit.
 * Which limit a device has, and the records of the plugins' allocations,
 * are decided with the GIL held.
 */
#include "memory/memory.h"
#include "driver/bytesize.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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
