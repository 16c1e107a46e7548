/* SPDX-License-Identifier: MIT */
/*
 * memory/pool/poolfuncs.c: the module-level functions of the pool and async
 * managers and their init.
 *
 * Locks and the GIL: called with the GIL held.  Takes a pool's mutex
 * (cm_pool_lock, which gives up the GIL first while Python stream
 * callbacks are in flight) only to read or set its limit, its release
 * threshold and its counters, with no driver or Python call under it.
 * The async pool's attributes go through the driver with no lock held;
 * trim gives up the GIL inside the manager's trim (poolops.c).
 */
#include "memory/pool/pool.h"
#include "memory/pool/graph/graph.h"
#include "memory/pool/vmm/vmm.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* Module-level functions                                              */
/* ------------------------------------------------------------------ */

/* The Context argument of a private helper, borrowed; NULL with
 * TypeError. */
static cm_context *
cm_ctx_arg(PyObject *o)
{
    if (!PyObject_TypeCheck(o, cm_st->Context_type)) {
        PyErr_Format(PyExc_TypeError, "expected a Context, got %.100s",
                     Py_TYPE(o)->tp_name);
        return NULL;
    }
    return (cm_context *)o;
}

/* The pool of a context argument; NULL with an exception if it has
 * none (another manager) or it was closed. */
static cm_pool *
cm_pool_arg(PyObject *o, cm_context **ctx)
{
    cm_context *c = cm_ctx_arg(o);

    if (c == NULL) {
        return NULL;
    }
    if (c->pool == NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "this context's memory manager is not a built-in "
                        "pool (set_memory_manager('pool') or 'async' before "
                        "the context is made)");
        return NULL;
    }
    if (cm_context_activate(c) < 0) {
        return NULL;
    }
    *ctx = c;
    return c->pool;
}

PyDoc_STRVAR(cm_pool_trim_doc,
"_pool_trim(ctx)\n--\n\n"
"Give every wholly free pooled segment of ctx back to the driver (the "
"async manager: wait for the context, then trim its pool to 0).");

static PyObject *
cm_pool_trim_fn(PyObject *mod, PyObject *arg)
{
    cm_context *c = NULL;

    (void)mod;
    if (cm_pool_arg(arg, &c) == NULL || c->mm_builtin->trim(c) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cm_pool_limit_doc,
"_pool_limit(ctx, limit=None)\n--\n\n"
"The most bytes ctx's pool may hold (the async manager: may have "
"allocated; a pool on virtual memory: with its peers' pool); 0 means no "
"limit.  With limit, set it first.");

static PyObject *
cm_pool_limit_fn(PyObject *mod, PyObject *args)
{
    PyObject *o;
    PyObject *v = Py_None;
    cm_context *c = NULL;
    cm_pool *p;
    size_t n;
    cm_gil_saved gd;

    (void)mod;
    if (!PyArg_ParseTuple(args, "O|O:_pool_limit", &o, &v)
        || (p = cm_pool_arg(o, &c)) == NULL) {
        return NULL;
    }
    if (v != Py_None) {
        n = PyLong_AsSize_t(v);
        if (n == (size_t)-1 && PyErr_Occurred()) {
            return NULL;
        }
        cm_pool_lock(p, &gd);
        p->limit = n;
        cm_pool_unlock(p, &gd);
        if (p->peers != NULL) {
            cm_pool_lock(p->peers, &gd);
            p->peers->limit = n;
            cm_pool_unlock(p->peers, &gd);
        }
    }
    return PyLong_FromSize_t(p->limit);
}

PyDoc_STRVAR(cm_async_threshold_doc,
"_async_release_threshold(ctx, value=None)\n--\n\n"
"The release threshold of the driver pool behind ctx's async manager; "
"with value, set it first.");

static PyObject *
cm_async_threshold_fn(PyObject *mod, PyObject *args)
{
    PyObject *o;
    PyObject *v = Py_None;
    cm_context *c = NULL;
    cm_pool *p;
    cuuint64_t t = 0;

    (void)mod;
    if (!PyArg_ParseTuple(args, "O|O:_async_release_threshold", &o, &v)
        || (p = cm_pool_arg(o, &c)) == NULL) {
        return NULL;
    }
    if (p->kind != CM_MM_ASYNC) {
        PyErr_SetString(PyExc_RuntimeError,
                        "only the async manager has a release threshold");
        return NULL;
    }
    if (v != Py_None) {
        t = PyLong_AsUnsignedLongLong(v);
        if ((t == (cuuint64_t)-1 && PyErr_Occurred())
            || CM_CU(MemPoolSetAttribute,
                     (p->mempool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                      &t)) < 0) {
            return NULL;
        }
    }
    if (CM_CU(MemPoolGetAttribute,
              (p->mempool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &t)) < 0) {
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(t);
}

PyDoc_STRVAR(cm_async_shareable_doc,
"_async_shareable(ctx)\n--\n\n"
"Whether the pool of ctx's async manager can be shared with other "
"processes (made with the POSIX file-descriptor handle type), so that "
"its memory exports through IPC.");

static PyObject *
cm_async_shareable_fn(PyObject *mod, PyObject *arg)
{
    cm_context *c = NULL;
    cm_pool *p;

    (void)mod;
    if ((p = cm_pool_arg(arg, &c)) == NULL) {
        return NULL;
    }
    if (p->kind != CM_MM_ASYNC) {
        PyErr_SetString(PyExc_RuntimeError,
                        "only the async manager has a memory pool to "
                        "share");
        return NULL;
    }
    return PyBool_FromLong(p->shareable);
}

PyDoc_STRVAR(cm_pool_stats_doc,
"_pool_stats(ctx)\n--\n\n"
"A dict: reserved_bytes, free_bytes, largest_free_block (None where the "
"manager cannot know), segments, limit, virtual_memory (the pool's "
"segments are arenas of virtual memory), page_size, idle_bytes (mapped "
"pages no block uses) and release_threshold (0 without virtual "
"memory); on virtual memory, pages: counts of pages made, moved and "
"released so far, and peers_reserved_bytes: what the peers' pool "
"beside it holds (cuMemAlloc'd segments for the memory other libraries "
"take through cudamem's adapters), counted in reserved_bytes too, and "
"borrowed_from_peers: how many of this pool's requests, finding no "
"memory to map, were served by free blocks of the peers' pool.");

static PyObject *
cm_pool_stats_fn(PyObject *mod, PyObject *arg)
{
    cm_context *c = NULL;
    cm_pool *p;
    size_t reserved;
    size_t free_b;
    long long largest;
    Py_ssize_t nseg = 0;
    size_t idle;
    size_t made;
    size_t moved;
    size_t released;
    size_t peers = 0;
    size_t borrowed = 0;
    cm_seg *g;
    PyObject *lg;
    PyObject *r;
    cm_gil_saved gd;

    (void)mod;
    if ((p = cm_pool_arg(arg, &c)) == NULL) {
        return NULL;
    }
    c->mm_builtin->stats(c, &reserved, &free_b, &largest);
    if (p->peers != NULL) {
        cm_pool_lock(p->peers, &gd);
        for (g = p->peers->segs; g != NULL; g = g->next) {
            nseg++;
        }
        peers = p->peers->reserved;
        borrowed = p->peers->borrowed;
        cm_pool_unlock(p->peers, &gd);
    }
    cm_pool_lock(p, &gd);
    for (g = p->segs; g != NULL; g = g->next) {
        nseg++;
    }
    idle = p->idle_pages;
    made = p->n_made;
    moved = p->n_moved;
    released = p->n_released;
    cm_pool_unlock(p, &gd);
    lg = largest < 0 ? Py_NewRef(Py_None) : PyLong_FromLongLong(largest);
    if (lg == NULL) {
        return NULL;
    }
    r = Py_BuildValue("{snsnsOsnsnsOsnsnsn}", "reserved_bytes",
                      (Py_ssize_t)reserved, "free_bytes", (Py_ssize_t)free_b,
                      "largest_free_block", lg, "segments", nseg,
                      "limit", (Py_ssize_t)p->limit,
                      "virtual_memory", p->vmm ? Py_True : Py_False,
                      "page_size",
                      (Py_ssize_t)(p->vmm ? (size_t)1 << p->gshift : 0),
                      "idle_bytes",
                      (Py_ssize_t)(p->vmm ? idle << p->gshift : 0),
                      "release_threshold",
                      (Py_ssize_t)(p->vmm ? p->keep : 0));
    if (r != NULL && p->vmm) {
        PyObject *c = Py_BuildValue("{snsnsn}", "made", (Py_ssize_t)made,
                                    "moved", (Py_ssize_t)moved,
                                    "released", (Py_ssize_t)released);
        PyObject *pb = PyLong_FromSize_t(peers);
        PyObject *bw = PyLong_FromSize_t(borrowed);

        if (c == NULL || pb == NULL || bw == NULL
            || PyDict_SetItemString(r, "pages", c) < 0
            || PyDict_SetItemString(r, "peers_reserved_bytes", pb) < 0
            || PyDict_SetItemString(r, "borrowed_from_peers", bw) < 0) {
            Py_CLEAR(r);
        }
        Py_XDECREF(c);
        Py_XDECREF(pb);
        Py_XDECREF(bw);
    }
    Py_DECREF(lg);
    return r;
}

PyDoc_STRVAR(cm_pool_vmm_doc,
"_pool_vmm(on)\n--\n\n"
"Whether pool managers made from now on put their segments on virtual "
"memory (CUDAMEM_POOL_VMM sets it at import); returns the previous "
"setting.");

static PyObject *
cm_pool_vmm_fn(PyObject *mod, PyObject *arg)
{
    int on = PyObject_IsTrue(arg);
    int old = cm_vmm_env;

    (void)mod;
    if (on < 0) {
        return NULL;
    }
    cm_vmm_env = on;
    return PyBool_FromLong(old);
}

PyDoc_STRVAR(cm_pool_release_threshold_doc,
"_pool_release_threshold(ctx, threshold=None, interval=-1.0)\n--\n\n"
"The idle bytes ctx's pool keeps mapped on virtual memory "
"(CUDAMEM_POOL_RELEASE_THRESHOLD); with threshold, set it first, and "
"with interval >= 0 the seconds between release passes "
"(CUDAMEM_POOL_RELEASE_INTERVAL).  "
"ValueError when the pool is not on virtual memory.");

static PyObject *
cm_pool_release_threshold_fn(PyObject *mod, PyObject *args)
{
    PyObject *o;
    PyObject *n = Py_None;
    double iv = -1.0;
    cm_context *c = NULL;
    cm_pool *p;
    size_t v;
    cm_gil_saved gd;

    (void)mod;
    if (!PyArg_ParseTuple(args, "O|Od:_pool_release_threshold", &o, &n,
                          &iv)
        || (p = cm_pool_arg(o, &c)) == NULL) {
        return NULL;
    }
    if (!(iv >= -1.0 && iv <= 3600.0)) {
        PyErr_SetString(PyExc_ValueError,
                        "interval must be seconds from 0 to 3600");
        return NULL;
    }
    if (!p->vmm) {
        PyErr_SetString(PyExc_ValueError,
                        "this context's pool is not on virtual memory "
                        "(CUDAMEM_POOL_VMM=1)");
        return NULL;
    }
    if (n != Py_None) {
        v = PyLong_AsSize_t(n);
        if (v == (size_t)-1 && PyErr_Occurred()) {
            return NULL;
        }
        cm_pool_lock(p, &gd);
        p->keep = v;
        if ((p->idle_pages << p->gshift) > v) {
            p->release_due = 1;
        }
        cm_pool_unlock(p, &gd);
    }
    if (iv >= 0.0) {
        cm_pool_lock(p, &gd);
        p->release_ns = (uint64_t)(iv * 1e9);
        p->release_next = 0;
        cm_pool_unlock(p, &gd);
    }
    return PyLong_FromSize_t(p->keep);
}

PyDoc_STRVAR(cm_pool_segments_doc,
"_pool_segments(ctx)\n--\n\n"
"The segments of a Context's pool manager: a list of dicts (base, size,\n"
"small, blocks: [(address, size, 'used' | 'free' | 'pending')]); empty\n"
"under the other managers.");

static PyObject *
cm_pool_segments_fn(PyObject *mod, PyObject *obj)
{
    (void)mod;
    if (!PyObject_TypeCheck(obj, cm_st->Context_type)) {
        PyErr_Format(PyExc_TypeError, "expected a Context, got %.100s",
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return cm_pool_segments((cm_context *)obj);
}

static PyObject *cm_pool_poison_fn(PyObject *mod, PyObject *arg);
extern const char cm_pool_poison_doc[];

static PyMethodDef cm_pool_functions[] = {
    {"_pool_trim", cm_pool_trim_fn, METH_O, cm_pool_trim_doc},
    {"_pool_limit", cm_pool_limit_fn, METH_VARARGS, cm_pool_limit_doc},
    {"_pool_stats", cm_pool_stats_fn, METH_O, cm_pool_stats_doc},
    {"_pool_segments", cm_pool_segments_fn, METH_O, cm_pool_segments_doc},
    {"_pool_vmm", cm_pool_vmm_fn, METH_O, cm_pool_vmm_doc},
    {"_pool_release_threshold", cm_pool_release_threshold_fn, METH_VARARGS,
     cm_pool_release_threshold_doc},
    {"_async_release_threshold", cm_async_threshold_fn, METH_VARARGS,
     cm_async_threshold_doc},
    {"_async_shareable", cm_async_shareable_fn, METH_O,
     cm_async_shareable_doc},
    {"_pool_poison", cm_pool_poison_fn, METH_O, cm_pool_poison_doc},
    {NULL, NULL, 0, NULL},
};

/* A byte count from the environment: digits with an optional K, M or G
 * (powers of 1024); dflt when unset or unreadable. */
static unsigned long long
cm_env_bytes(const char *name, unsigned long long dflt)
{
    const char *v = getenv(name);
    char *end;
    unsigned long long n;

    if (v == NULL || v[0] == '\0') {
        return dflt;
    }
    n = strtoull(v, &end, 10);
    if (end == v) {
        return dflt;
    }
    switch (*end) {
    case 'k': case 'K': n <<= 10; break;
    case 'm': case 'M': n <<= 20; break;
    case 'g': case 'G': n <<= 30; break;
    default: break;
    }
    return n;
}

/* CUDAMEM_POOL_POISON: unset, empty or 0: off; 1: the byte 0xA5; 2 to
 * 255: that byte.  0, or -1 with ValueError naming the variable. */
static int
cm_pool_poison_env(void)
{
    const char *v = getenv("CUDAMEM_POOL_POISON");
    char *end;
    long n;

    cm_pool_poison = -1;
    if (v == NULL || v[0] == '\0') {
        return 0;
    }
    n = strtol(v, &end, 0);
    if (end == v || *end != '\0' || n < 0 || n > 255) {
        PyErr_Format(PyExc_ValueError,
                     "CUDAMEM_POOL_POISON must be 0 (off), 1 (the byte "
                     "0xA5) or a byte value 2..255, not %.100s", v);
        return -1;
    }
    if (n > 0) {
        cm_pool_poison = n == 1 ? 0xA5 : (int)n;
    }
    return 0;
}

const char cm_pool_poison_doc[] = PyDoc_STR(
"_pool_poison(byte)\n--\n\n"
"Set the byte that pool and async managers made from now on fill every "
"block they hand out with (-1: none; CUDAMEM_POOL_POISON sets it at "
"import); returns the previous setting.");

static PyObject *
cm_pool_poison_fn(PyObject *mod, PyObject *arg)
{
    long n = PyLong_AsLong(arg);
    int old = cm_pool_poison;

    (void)mod;
    if (n == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (n < -1 || n > 255) {
        PyErr_SetString(PyExc_ValueError,
                        "the poison byte must be -1 (none) or 0..255");
        return NULL;
    }
    cm_pool_poison = (int)n;
    return PyLong_FromLong(old);
}

int
cm_pool_init(PyObject *mod, cm_state *st)
{
    (void)st;
    if (cm_atfork_child_add(cm_pool_atfork_child) < 0) {
        return -1;
    }
    cm_default_limit = (size_t)cm_env_bytes("CUDAMEM_POOL_LIMIT", 0);
    if (cm_pool_poison_env() < 0 || cm_arena_env() < 0
        || cm_gpool_init(mod) < 0) {
        return -1;
    }
    cm_async_threshold = (cuuint64_t)cm_env_bytes(
        "CUDAMEM_ASYNC_RELEASE_THRESHOLD", UINT64_MAX);
    return PyModule_AddFunctions(mod, cm_pool_functions);
}
