/* SPDX-License-Identifier: MIT */
/*
 * memory/staging/stagecfg.c: the tunables of the staging pipeline (from the
 * environment and _staging_config), its statistics (staging_stats),
 * staging_trim, its reset in a fork's child and its init.  The pipeline
 * itself is in staging.c; what they share is in memory/staging/staging.h.
 *
 * Locks and the GIL: the tunables are guarded by the GIL.  The statistics
 * read the counters under cm_stg_mu with the GIL held (no holder waits
 * for the GIL); staging_trim gives up the GIL (CM_DRIVER_BEGIN_NOGIL),
 * empties the caches under cm_stg_mu and frees their buffers (cuEventDestroy,
 * cuMemFreeHost) after letting it go: no Python or driver call is made
 * while it is held.  A fork's child makes the mutex and the condition
 * variables anew.
 */
#include "memory/staging/staging.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* Configuration and statistics                                        */
/* ------------------------------------------------------------------ */

/* The accepted range of each numeric tunable, the same for its
 * environment variable (read at import) and its _staging_config keyword:
 *
 *   CUDAMEM_STAGING_THRESHOLD  threshold  0 .. 1 TiB      (default 4 MiB)
 *   CUDAMEM_STAGING_CHUNK      chunk      4 KiB .. 64 MiB (default 8 MiB)
 *   CUDAMEM_STAGING_BUFFERS    buffers    2 .. 16         (default 3)
 *   CUDAMEM_STAGING_THREADS    threads    0 .. 256        (default: the
 *                                         CPUs, at most 8)
 *   (keyword only)             part       64 .. 64 MiB    (default 256 KiB)
 *   CUDAMEM_STAGING_RAMP       ramp       0 .. 6          (default 0)
 *   CUDAMEM_STAGING_SPIN       spin       0 .. 100000 us  (default 50 with
 *                                         twice as many CPUs as threads,
 *                                         else 0)
 *   CUDAMEM_STAGING_BOUNCE     bounce     0 .. 64 MiB     (default 1 MiB)
 *
 * and the flags CUDAMEM_STAGING (default on), CUDAMEM_STAGING_NT (off)
 * and CUDAMEM_STAGING_HUGE (on): 1/0, true/false, yes/no, on/off.  Sizes
 * in the environment are digits with an optional K, M or G (powers of
 * 1024, "KiB"/"KB" spellings too).  A value outside its range raises
 * ValueError naming the variable (or keyword) and the range: a chunk of
 * one byte made a 4 MiB copy take most of a minute, and each transfer
 * holds up to buffers x chunk bytes of page-locked staging memory (1 GiB
 * chunks took seconds to allocate for a 4 MiB copy). */
typedef struct {
    const char *env;          /* the variable, or NULL (keyword only) */
    const char *kw;           /* the _staging_config keyword */
    unsigned long long lo;    /* least accepted value */
    unsigned long long hi;    /* greatest accepted value */
    const char *range;        /* the range, as the error says it */
} cm_stg_range;

enum {
    CM_R_THRESHOLD, CM_R_CHUNK, CM_R_BUFFERS, CM_R_THREADS, CM_R_PART,
    CM_R_RAMP, CM_R_SPIN, CM_R_BOUNCE, CM_R_N
};

static const cm_stg_range cm_stg_ranges[CM_R_N] = {
    {"CUDAMEM_STAGING_THRESHOLD", "threshold", 0, 1ULL << 40,
     "0 to 1 TiB (1099511627776) bytes"},
    {"CUDAMEM_STAGING_CHUNK", "chunk", 4096, 1ULL << 26,
     "4 KiB (4096) to 64 MiB (67108864) bytes"},
    {"CUDAMEM_STAGING_BUFFERS", "buffers", 2, CM_STG_MAXBUF, "2 to 16"},
    {"CUDAMEM_STAGING_THREADS", "threads", 0, 256, "0 to 256"},
    {NULL, "part", 64, 1ULL << 26, "64 to 67108864 bytes"},
    {"CUDAMEM_STAGING_RAMP", "ramp", 0, CM_STG_MAXRAMP, "0 to 6"},
    {"CUDAMEM_STAGING_SPIN", "spin", 0, 100000,
     "0 to 100000 microseconds"},
    {"CUDAMEM_STAGING_BOUNCE", "bounce", 0, 1ULL << 26,
     "0 to 64 MiB (67108864) bytes"},
};

/* ValueError: value v of tunable r is out of its range. */
static int
cm_stg_range_error(const cm_stg_range *r, int env, const char *v)
{
    if (env) {
        PyErr_Format(PyExc_ValueError,
                     "%s=%s is not valid: expected %s", r->env, v, r->range);
    }
    else {
        PyErr_Format(PyExc_ValueError,
                     "_staging_config(%s=%s) is out of range: expected %s",
                     r->kw, v, r->range);
    }
    return -1;
}

/* Tunable r from the environment into *out (left alone when unset or
 * empty): digits with an optional K, M or G (powers of 1024), in r's
 * range.  0, or -1 with ValueError naming the variable. */
static int
cm_env_size(const cm_stg_range *r, unsigned long long *out)
{
    const char *s = getenv(r->env);
    const char *p;
    char *end;
    unsigned long long v;
    int shift = 0;

    if (s == NULL || *s == '\0') {
        return 0;
    }
    for (p = s; *p == ' '; p++) {
    }
    if (*p < '0' || *p > '9') {
        return cm_stg_range_error(r, 1, s);
    }
    errno = 0;
    v = strtoull(p, &end, 10);
    if (errno != 0) {
        return cm_stg_range_error(r, 1, s);
    }
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    default: break;
    }
    if (shift && (*end == 'i' || *end == 'I')) {
        end++;
    }
    if (*end == 'b' || *end == 'B') {
        end++;
    }
    if (*end != '\0' || v > (r->hi >> shift)) {
        return cm_stg_range_error(r, 1, s);
    }
    v <<= shift;
    if (v < r->lo) {
        return cm_stg_range_error(r, 1, s);
    }
    *out = v;
    return 0;
}

/* A flag from the environment into *out (left alone when unset or
 * empty).  0, or -1 with ValueError naming the variable. */
static int
cm_env_flag(const char *name, int *out)
{
    static const char *const on[] = {"1", "true", "yes", "on"};
    static const char *const off[] = {"0", "false", "no", "off"};
    const char *s = getenv(name);
    size_t i;

    if (s == NULL || *s == '\0') {
        return 0;
    }
    for (i = 0; i < sizeof(on) / sizeof(on[0]); i++) {
        if (strcasecmp(s, on[i]) == 0) {
            *out = 1;
            return 0;
        }
        if (strcasecmp(s, off[i]) == 0) {
            *out = 0;
            return 0;
        }
    }
    PyErr_Format(PyExc_ValueError,
                 "%s=%s is not valid: expected 1/0, true/false, yes/no or "
                 "on/off", name, s);
    return -1;
}

/* Where each numeric tunable lives in a cm_stg_cfg, as an unsigned long
 * long for reading (get) or writing (put). */
static unsigned long long
cm_cfg_get(const cm_stg_cfg *c, int i)
{
    switch (i) {
    case CM_R_THRESHOLD: return c->threshold;
    case CM_R_CHUNK: return c->chunk;
    case CM_R_BUFFERS: return (unsigned long long)c->buffers;
    case CM_R_THREADS: return (unsigned long long)c->threads;
    case CM_R_PART: return c->part;
    case CM_R_RAMP: return (unsigned long long)c->ramp;
    case CM_R_SPIN: return (unsigned long long)c->spin;
    default: return c->bounce;
    }
}

static void
cm_cfg_put(cm_stg_cfg *c, int i, unsigned long long v)
{
    /* v is in the tunable's range, so it fits its field. */
    switch (i) {
    case CM_R_THRESHOLD: c->threshold = (size_t)v; break;
    case CM_R_CHUNK: c->chunk = (size_t)v; break;
    case CM_R_BUFFERS: c->buffers = (int)v; break;
    case CM_R_THREADS: c->threads = (int)v; break;
    case CM_R_PART: c->part = (size_t)v; break;
    case CM_R_RAMP: c->ramp = (int)v; break;
    case CM_R_SPIN: c->spin = (int)v; break;
    default: c->bounce = (size_t)v; break;
    }
}

/* Make c the tunables. */
static void
cm_cfg_set(const cm_stg_cfg *c)
{
    cm_cfg = *c;
    __atomic_store_n(&cm_nt_on, c->nt, __ATOMIC_RELAXED);
    __atomic_store_n(&cm_spin_ns, (long)c->spin * 1000, __ATOMIC_RELAXED);
}

static PyObject *
cm_cfg_dict(void)
{
    return Py_BuildValue("{s:O,s:n,s:n,s:i,s:i,s:n,s:i,s:O,s:i,s:O,s:n}",
                         "enabled", cm_cfg.enabled ? Py_True : Py_False,
                         "threshold", (Py_ssize_t)cm_cfg.threshold,
                         "chunk", (Py_ssize_t)cm_cfg.chunk,
                         "buffers", cm_cfg.buffers,
                         "threads", cm_cfg.threads,
                         "part", (Py_ssize_t)cm_cfg.part,
                         "ramp", cm_cfg.ramp,
                         "nt", cm_cfg.nt ? Py_True : Py_False,
                         "spin", cm_cfg.spin,
                         "huge", cm_cfg.huge ? Py_True : Py_False,
                         "bounce", (Py_ssize_t)cm_cfg.bounce);
}

PyDoc_STRVAR(cm_staging_config_doc,
"_staging_config(*, enabled=None, threshold=None, chunk=None,\n"
"                buffers=None, threads=None, part=None, ramp=None,\n"
"                nt=None, spin=None, huge=None, bounce=None)\n"
"--\n\n"
"Set the staging pipeline's tunables given (the rest stay) and return\n"
"them all as a dict.  Worker threads are only ever added.  Ranges:\n"
"threshold 0 to 2**40 bytes, chunk 4096 to 2**26, buffers 2 to 16,\n"
"threads 0 to 256, part 64 to 2**26, ramp 0 to 6, spin 0 to 100000\n"
"(microseconds), bounce 0 to 2**26 (the largest synchronous copy to\n"
"pageable host memory under the threshold made through one staging\n"
"buffer; 0: none); a value outside raises ValueError naming it.");

static PyObject *
cm_staging_config_fn(PyObject *mod, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"enabled", "threshold", "chunk", "buffers",
                             "threads", "part", "ramp", "nt", "spin",
                             "huge", "bounce", NULL};
    PyObject *v[11] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                       NULL, NULL, NULL};
    cm_stg_cfg c = cm_cfg;
    Py_ssize_t n;
    int i;

    (void)mod;
    if (!PyArg_ParseTupleAndKeywords(args, kw,
                                     "|$OOOOOOOOOOO:_staging_config",
                                     kwlist, &v[0], &v[1], &v[2], &v[3],
                                     &v[4], &v[5], &v[6], &v[7], &v[8],
                                     &v[9], &v[10])) {
        return NULL;
    }
    if (v[0] != NULL && v[0] != Py_None) {
        if ((i = PyObject_IsTrue(v[0])) < 0) {
            return NULL;
        }
        c.enabled = i;
    }
    if (v[7] != NULL && v[7] != Py_None) {
        if ((i = PyObject_IsTrue(v[7])) < 0) {
            return NULL;
        }
        c.nt = i;
    }
    if (v[9] != NULL && v[9] != Py_None) {
        if ((i = PyObject_IsTrue(v[9])) < 0) {
            return NULL;
        }
        c.huge = i;
    }
    /* keywords 1-6, 8 and 10 are the numeric tunables, in
     * cm_stg_ranges' order */
    for (i = 1; i < 11; i++) {
        const cm_stg_range *r;
        int ri = i < 7 ? i - 1 : i == 8 ? CM_R_SPIN : CM_R_BOUNCE;
        PyObject *repr;

        if (i == 7 || i == 9 || v[i] == NULL || v[i] == Py_None) {
            continue;
        }
        r = &cm_stg_ranges[ri];
        n = PyNumber_AsSsize_t(v[i], NULL);
        if (n == -1 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError)) {
                return NULL;
            }
            PyErr_Clear();
            n = -1;     /* out of range either way */
        }
        if (n < 0 || (unsigned long long)n < r->lo
            || (unsigned long long)n > r->hi) {
            repr = PyObject_Repr(v[i]);
            if (repr == NULL) {
                return NULL;
            }
            (void)cm_stg_range_error(r, 0, PyUnicode_AsUTF8(repr));
            Py_DECREF(repr);
            return NULL;
        }
        cm_cfg_put(&c, ri, (unsigned long long)n);
    }
    cm_cfg_set(&c);
    return cm_cfg_dict();
}

PyDoc_STRVAR(cm_staging_stats_doc,
"_staging_stats()\n--\n\n"
"The staging pipeline's counters: buffers (page-locked staging buffers\n"
"held), bytes (their size), free (cached, idle), in_use, inflight\n"
"(transfers running), staged (transfers staged so far), workers\n"
"(threads made), chunks (staged so far), bounced (synchronous copies\n"
"to pageable host memory made through one staging buffer so far) and\n"
"where the staged\n"
"transfers' time went, summed in nanoseconds: wait_ns (waiting for a\n"
"buffer's copy, the final drain included), stage_ns (host-side packing\n"
"and unpacking), issue_ns (issuing copies and event records) and\n"
"total_ns (the whole pipelines).");

static PyObject *
cm_staging_stats_fn(PyObject *mod, PyObject *unused)
{
    size_t live;
    size_t bytes;
    size_t nfree;
    size_t inflight;
    size_t staged;
    size_t chunks;
    size_t bounced = __atomic_load_n(&cm_bounced, __ATOMIC_RELAXED);
    unsigned long long ns[4];
    int workers;

    (void)mod;
    (void)unused;
    cm_mu_lock(&cm_stg_mu);
    live = cm_nlive;
    bytes = cm_live_bytes;
    nfree = cm_nfree_all;
    inflight = cm_inflight;
    staged = cm_staged;
    workers = cm_workers;
    chunks = cm_nchunks_all;
    ns[0] = cm_ns_wait;
    ns[1] = cm_ns_stage;
    ns[2] = cm_ns_issue;
    ns[3] = cm_ns_total;
    cm_mu_unlock(&cm_stg_mu);
    return Py_BuildValue("{s:n,s:n,s:n,s:n,s:n,s:n,s:i,s:n,s:n,s:K,s:K,"
                         "s:K,s:K}",
                         "buffers", (Py_ssize_t)live,
                         "bytes", (Py_ssize_t)bytes,
                         "free", (Py_ssize_t)nfree,
                         "in_use", (Py_ssize_t)(live - nfree),
                         "inflight", (Py_ssize_t)inflight,
                         "staged", (Py_ssize_t)staged,
                         "workers", workers,
                         "chunks", (Py_ssize_t)chunks,
                         "bounced", (Py_ssize_t)bounced,
                         "wait_ns", ns[0], "stage_ns", ns[1],
                         "issue_ns", ns[2], "total_ns", ns[3]);
}

PyDoc_STRVAR(cm_staging_trim_doc,
"_staging_trim()\n--\n\n"
"Free every cached staging buffer now.");

static PyObject *
cm_staging_trim_fn(PyObject *mod, PyObject *unused)
{
    cm_sbuf *drop;
    cm_context *live[CM_MAX_DEVICES];
    unsigned long gen[CM_STG_DEVICES];
    int n;
    int d;

    (void)mod;
    (void)unused;
    if (cm_driver_ensure() < 0) {
        return NULL;
    }
    /* The generation of each device's live context: buffers of an
     * earlier one (closed, or reset) went with it, events included. */
    memset(gen, 0, sizeof(gen));
    n = cm_context_live(live);
    for (d = 0; d < n; d++) {
        if (live[d]->device->id >= 0
            && live[d]->device->id < CM_STG_DEVICES) {
            gen[live[d]->device->id] = live[d]->gen;
        }
    }
    CM_DRIVER_BEGIN_NOGIL
    cm_mu_lock(&cm_stg_mu);
    drop = NULL;
    for (d = 0; d < CM_STG_DEVICES; d++) {
        cm_scache *c = &cm_caches[d];

        if (c->free != NULL && (gen[d] == 0 || c->gen != gen[d])) {
            (void)cm_cache_of_locked(d, gen[d]);
            continue;
        }
        cm_cache_shed_locked(c, 0, &drop);
    }
    cm_mu_unlock(&cm_stg_mu);
    cm_sbuf_free_list(drop);
    CM_DRIVER_END_NOGIL
    Py_RETURN_NONE;
}

static PyMethodDef cm_staging_methods[] = {
    {"_staging_config", (PyCFunction)(void (*)(void))cm_staging_config_fn,
     METH_VARARGS | METH_KEYWORDS, cm_staging_config_doc},
    {"_staging_stats", cm_staging_stats_fn, METH_NOARGS,
     cm_staging_stats_doc},
    {"_staging_trim", cm_staging_trim_fn, METH_NOARGS, cm_staging_trim_doc},
    {NULL, NULL, 0, NULL},
};

/* In a forked child no worker exists and the parent's buffers
 * belong to its driver: start from nothing. */
static void
cm_staging_atfork_child(void)
{
    pthread_mutex_init(&cm_stg_mu, NULL);
    pthread_cond_init(&cm_stg_work, NULL);
    pthread_cond_init(&cm_stg_part_done, NULL);
    cm_bq_head = cm_bq_tail = NULL;
    cm_bq_nonempty = 0;
    cm_workers = 0;
    memset(cm_caches, 0, sizeof(cm_caches));
    cm_nlive = cm_live_bytes = cm_nfree_all = cm_inflight = 0;
}

int
cm_staging_init(PyObject *mod, cm_state *st)
{
    static int atfork_done;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    cm_stg_cfg c = cm_cfg;
    unsigned long long u;
    int i;

    (void)st;
    if (!atfork_done) {
        if (cm_atfork_child_add(cm_staging_atfork_child) < 0) {
            return -1;
        }
        atfork_done = 1;
    }
    /* On unless switched off: on the H200 it moves pageable memory at
     * 32-48 GB/s where the driver's own path gives 7-15 (issue 10). */
    if (cm_env_flag("CUDAMEM_STAGING", &c.enabled) < 0) {
        return -1;
    }
    c.threads = ncpu > 0 && ncpu < 8 ? (int)ncpu : 8;
    for (i = 0; i < CM_R_N; i++) {
        if (i == CM_R_SPIN || cm_stg_ranges[i].env == NULL) {
            continue;
        }
        u = cm_cfg_get(&c, i);
        if (cm_env_size(&cm_stg_ranges[i], &u) < 0) {
            return -1;
        }
        cm_cfg_put(&c, i, u);
    }
    /* Polling before sleeping pays where the workers have cores to
     * themselves (the H200 machine, a virtual one, wakes a sleeping
     * thread slowly); with fewer cores it would steal them. */
    c.spin = ncpu >= 2 * (long)c.threads ? 50 : 0;
    u = (unsigned long long)c.spin;
    if (cm_env_size(&cm_stg_ranges[CM_R_SPIN], &u) < 0
        || cm_env_flag("CUDAMEM_STAGING_NT", &c.nt) < 0
        || cm_env_flag("CUDAMEM_STAGING_HUGE", &c.huge) < 0) {
        return -1;
    }
    c.spin = (int)u;
    cm_cfg_set(&c);
    return PyModule_AddFunctions(mod, cm_staging_methods);
}
