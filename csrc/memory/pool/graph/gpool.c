/* SPDX-License-Identifier: MIT */
/*
 * memory/pool/graph/gpool.c: graph-private pools.  A replay of a CUDA graph
 * reads and writes the memory its capture used, long after the capture:
 * memory allocated during a capture must stay the graph's, never handed
 * to other work, for as long as the graph may be launched.  So while
 * cudamem captures a stream, every allocation for that stream (and, on
 * the capturing thread, for the default stream) comes from the
 * capture's graph pool, whatever the memory manager:
 *
 * - a graph pool is a pool of its own (memory/pool/pool.c's blocks, bins and
 *   splitting) whose segments are cuMemAlloc'd for it, in the relaxed
 *   capture mode (cuMemAlloc is otherwise refused during a capture),
 *   never taken from the manager's memory: eager work freed there
 *   before the capture could still be running when a replay starts;
 * - its blocks carry no events: a freed block is reused only for the
 *   same stream key (stream order, or the capture order of the graphs
 *   that share the pool); a block released after use on other streams
 *   waits for the context first; a foreign stream's block is not reused;
 * - a block the program frees goes back to its graph pool, never to the
 *   manager: a later capture given the same pool (cudamem.graph(pool=
 *   g.pool)) may reuse it, and a replay of the graph still finds it;
 * - the pool is Python's GraphPool (cudamem/graphs.py) through a capsule
 *   each graph captured with it holds.  When the capsule is gone and no
 *   block is in use, the pool retires: its segments are cuMemFree'd
 *   (which waits for the device, so for replays in flight).  While
 *   cudamem captures, the retirement waits (cuMemFree would join the
 *   capture) until the last capture ends (the tidy upcall);
 * - a capture another library began (CuPy's, PyTorch's, allocating
 *   through cudamem's adapters) is found by the adapters' query
 *   (cm_gpool_foreign) and gets a graph pool by capture id, which the
 *   adapter's allocation is sent to through a thread-local hint; it is
 *   kept until the context closes, since cudamem cannot see when that
 *   library's graph goes;
 * - a context's close marks its graph pools dead (their memory goes
 *   with the context); a dead pool's struct is freed once nothing
 *   refers to it.
 *
 * Locks and the GIL: a graph pool's fields (live, orphan, its pool's
 * state) are guarded by its pool's mutex, taken plainly (cm_mu_lock), with
 * or without the GIL: a graph pool records no events, so no holder makes
 * a driver call or waits for the GIL.  cm_gpool_mu guards the list of
 * every graph pool and the retirements put off; it is taken before a
 * pool's mutex, never after, and no driver or Python call runs under it.
 * The GIL is given up, no mutex held, around cuMemAlloc and a failed
 * growth's cuMemFree (CM_DRIVER_BEGIN_NOGIL) and, where the caller holds
 * it, around a retirement's cuMemFree (cm_gil_drop).  Releases may run
 * without the GIL (the queue's flush, PyTorch's lane): no Python object.
 */
#include "memory/pool/graph/graph.h"
#include "memory/pool/pool.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define CM_GPOOL_CAPSULE "cudamem.graph_pool"

struct cm_gpool {
    cm_pool *p;           /* its private pool (kind CM_MM_POOL, graph) */
    cm_context *ctx;      /* its context: alive while p is not dead */
    size_t live;          /* blocks in use (p->mu) */
    int orphan;           /* the capsule is gone (p->mu) */
    int later;            /* on the list of retirements put off */
    cuuint64_t capture;   /* the id of the capture another library began
                           * that it serves, or 0 (cudamem's own) */
    cm_gpool *next;       /* the list of every graph pool (cm_gpool_mu) */
    cm_gpool *prev;
};

static pthread_mutex_t cm_gpool_mu = PTHREAD_MUTEX_INITIALIZER;

/* The graph pool an adapter's allocation on this thread goes to (a
 * capture another library began), or NULL. */
static _Thread_local cm_gpool *cm_gpool_forced;

/* Every graph pool not yet retired, and the retirements put off (a
 * retirement dequeued is on neither). */
static cm_gpool *cm_gpools;

static void
cm_gpool_unlink(cm_gpool *gp)
{
    if (gp->prev != NULL) {
        gp->prev->next = gp->next;
    }
    else {
        cm_gpools = gp->next;
    }
    if (gp->next != NULL) {
        gp->next->prev = gp->prev;
    }
    gp->next = NULL;
    gp->prev = NULL;
}

/* Free the host memory of gp, its pool's segments and blocks already
 * given back or gone with the context. */
static void
cm_gpool_free(cm_gpool *gp, cm_seg *segs)
{
    cm_pool *p = gp->p;
    cm_seg *g;
    cm_blk *b;

    for (g = segs; g != NULL; g = segs) {
        segs = g->next;
        free(g);
    }
    while (p->spare != NULL) {
        b = p->spare;
        p->spare = b->fnext;
        free(b);
    }
    pthread_mutex_destroy(&p->mu);
    free(p);
    free(gp);
}

/* Detach the segments of gp's pool (every block free), freeing their
 * block structs; the list of segments. */
static cm_seg *
cm_gpool_detach(cm_gpool *gp)
{
    cm_pool *p = gp->p;
    cm_seg *segs = p->segs;
    cm_seg *g;
    cm_blk *b;
    cm_blk *next;

    p->segs = NULL;
    for (g = segs; g != NULL; g = g->next) {
        for (b = g->first; b != NULL; b = next) {
            next = b->next;
            cm_blk_drop_waits(p, b);
            free(b);
        }
        g->first = NULL;
    }
    memset(&p->small, 0, sizeof(p->small));
    memset(&p->large, 0, sizeof(p->large));
    p->reserved = 0;
    p->free_bytes = 0;
    return segs;
}

/* Retire gp (its capsule gone, no block in use; no mutex held): its
 * memory back to the device with ctx current where it must be made so,
 * or put off while cudamem captures.  cuMemFree runs without the GIL
 * where the caller holds it. */
static void
cm_gpool_retire(cm_gpool *gp, int gil)
{
    cm_pool *p = gp->p;
    cm_context *ctx = gp->ctx;
    cm_seg *segs;
    int dead;
    int pushed = 0;
    int epoch;
    cm_gil_saved gd;

    cm_mu_lock(&cm_gpool_mu);
    gd.ts = NULL;
    gd.probe = 0;
    gd.epoch = 0;
    cm_mu_lock(&p->mu);
    dead = p->dead;
    if (!dead && cm_capture_any() && !cm_forked) {
        /* cuMemFree now would join or invalidate a capture. */
        cm_mu_unlock(&p->mu);
        gp->later = 1;
        cm_mu_unlock(&cm_gpool_mu);
        return;
    }
    p->dead = 1;
    segs = cm_gpool_detach(gp);
    cm_mu_unlock(&p->mu);
    cm_gpool_unlink(gp);
    gp->later = 0;
    cm_mu_unlock(&cm_gpool_mu);
    if (dead || cm_forked || segs == NULL) {
        cm_gpool_free(gp, segs);
        return;
    }
    if (gil) {
        cm_gil_drop(&gd);
    }
    /* Counted: a close of the context waits for this call. */
    epoch = cm_driver_call_begin();
    if (ctx->alive) {
        (void)cm_ctx_enter(ctx->handle, &pushed);
        (void)cm_segs_release(ctx, segs);
        segs = NULL;
        cm_ctx_leave(pushed);
    }
    cm_driver_call_end(epoch);
    if (gil) {
        cm_gil_take(&gd);
    }
    cm_gpool_free(gp, segs);
}

/* The retirements put off while cudamem captured, now that it captures
 * nothing (end_capture's upcall; GIL held). */
static void
cm_gpools_tidy(void)
{
    cm_gpool *gp;

    while (!cm_capture_any()) {
        cm_mu_lock(&cm_gpool_mu);
        for (gp = cm_gpools; gp != NULL && !gp->later; gp = gp->next) {
        }
        if (gp != NULL) {
            gp->later = 0;
        }
        cm_mu_unlock(&cm_gpool_mu);
        if (gp == NULL) {
            return;
        }
        cm_gpool_retire(gp, 1);
    }
}

/* ctx is being closed (GIL held): its graph pools are dead, their
 * memory goes with the context; those nothing refers to any more are
 * freed. */
static void
cm_gpools_closing(cm_context *ctx)
{
    cm_gpool *gp;
    cm_gpool *next;
    cm_gpool *gone = NULL;
    cm_seg *segs;

    cm_mu_lock(&cm_gpool_mu);
    for (gp = cm_gpools; gp != NULL; gp = next) {
        next = gp->next;
        if (gp->ctx != ctx) {
            continue;
        }
        cm_mu_lock(&gp->p->mu);
        gp->p->dead = 1;
        if (gp->capture != 0) {
            /* Nothing else lets go of another library's capture's pool:
             * its last block does, or this. */
            gp->orphan = 1;
            gp->later = gp->live == 0;
        }
        if (gp->later) {
            cm_gpool_unlink(gp);
            gp->next = gone;
            gone = gp;
        }
        cm_mu_unlock(&gp->p->mu);
    }
    cm_mu_unlock(&cm_gpool_mu);
    for (gp = gone; gp != NULL; gp = next) {
        next = gp->next;
        segs = cm_gpool_detach(gp);
        cm_gpool_free(gp, segs);
    }
}

cm_gpool *
cm_gpool_for(cm_context *ctx, CUstream stream)
{
    cm_gpool *gp = NULL;

    if (cm_capture_any()) {
        gp = (cm_gpool *)cm_capture_pool(stream);
    }
    if (gp == NULL) {
        gp = cm_gpool_forced;
    }
    return gp != NULL && gp->ctx == ctx ? gp : NULL;
}

/* A new graph pool of ctx (not yet on the list), or NULL when out of
 * host memory. */
static cm_gpool *
cm_gpool_make(cm_context *ctx)
{
    cm_gpool *gp = calloc(1, sizeof(*gp));
    cm_pool *p = calloc(1, sizeof(*p));

    if (gp == NULL || p == NULL || pthread_mutex_init(&p->mu, NULL) != 0) {
        free(gp);
        free(p);
        return NULL;
    }
    p->kind = CM_MM_POOL;
    p->graph = 1;
    p->multi_stream = 1;
    p->first_stream = CM_POOL_ANY;
    p->poison = -1;
    p->export_fd = -1;
    p->owner = gp;
    gp->p = p;
    gp->ctx = ctx;
    return gp;
}

static void
cm_gpool_link(cm_gpool *gp)
{
    gp->next = cm_gpools;
    if (cm_gpools != NULL) {
        cm_gpools->prev = gp;
    }
    cm_gpools = gp;
}

cm_gpool *
cm_gpool_foreign(cm_context *ctx, CUstream h)
{
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    cuuint64_t id = 0;
    cm_gpool *gp;

    if (cm_stream_handle_is_default(h)
        || (cm_capture_any() && cm_capture_pool(h) != NULL)) {
        /* The default streams never capture; cudamem's own captures
         * route without asking. */
        return NULL;
    }
    if (CM_CU_RAW(StreamGetCaptureInfo,
                  (h, &st, &id, NULL, NULL, NULL, NULL)) != CUDA_SUCCESS
        || st != CU_STREAM_CAPTURE_STATUS_ACTIVE || id == 0) {
        return NULL;
    }
    cm_mu_lock(&cm_gpool_mu);
    for (gp = cm_gpools; gp != NULL; gp = gp->next) {
        if (gp->capture == id && gp->ctx == ctx && !gp->p->dead) {
            break;
        }
    }
    if (gp == NULL && (gp = cm_gpool_make(ctx)) != NULL) {
        gp->capture = id;
        cm_gpool_link(gp);
    }
    cm_mu_unlock(&cm_gpool_mu);
    return gp;
}

void
cm_gpool_force(cm_gpool *gp)
{
    cm_gpool_forced = gp;
}

CUresult
cm_gpool_alloc(cm_context *ctx, cm_gpool *gp, size_t size, CUstream stream,
               CUdeviceptr *ptr, uintptr_t *handle)
{
    cm_pool *p = gp->p;
    uintptr_t s = cm_stream_key(stream);
    int small;
    size_t want;
    CUdeviceptr base = 0;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    CUresult rc;
    cm_blk *b;

    size = cm_round(size, CM_POOL_ROUND);
    if (size == 0) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    small = size <= CM_POOL_SMALL_MAX;
    cm_mu_lock(&p->mu);
    if (p->dead) {
        cm_mu_unlock(&p->mu);
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    }
    b = cm_pool_take(p, size, s);
    if (b != NULL) {
        gp->live++;
        *ptr = b->ptr;
        cm_mu_unlock(&p->mu);
        *handle = (uintptr_t)b | CM_GPOOL_TAG;
        return CUDA_SUCCESS;
    }
    cm_mu_unlock(&p->mu);
    /* A segment of its own: small ones share 2 MiB, a large request gets
     * its size rounded to 2 MiB. */
    want = small ? CM_POOL_SMALL_SEG : cm_round(size, CM_POOL_LARGE_ROUND);
    if (!cm_limit_take(ctx, want)) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CM_DRIVER_BEGIN_NOGIL
    /* This thread may capture in global or thread-local mode, where the
     * driver refuses cuMemAlloc; the allocation joins no stream. */
    (void)CM_CU_RAW(ThreadExchangeStreamCaptureMode, (&mode));
    rc = CM_CU_RAW(MemAlloc, (&base, want));
    (void)CM_CU_RAW(ThreadExchangeStreamCaptureMode, (&mode));
    CM_DRIVER_END_NOGIL
    if (rc != CUDA_SUCCESS) {
        cm_limit_give(ctx, want);
        return rc;
    }
    cm_mu_lock(&p->mu);
    b = p->dead ? NULL : cm_pool_add_seg(p, base, want, small, size, s);
    if (b != NULL) {
        gp->live++;
    }
    rc = p->dead ? CUDA_ERROR_CONTEXT_IS_DESTROYED
                 : CUDA_ERROR_OUT_OF_MEMORY;
    cm_mu_unlock(&p->mu);
    if (b == NULL) {
        if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
            CM_DRIVER_BEGIN_NOGIL
            (void)CM_CU_RAW(MemFree, (base));
            CM_DRIVER_END_NOGIL
        }
        cm_limit_give(ctx, want);
        return rc;
    }
    *ptr = b->ptr;
    *handle = (uintptr_t)b | CM_GPOOL_TAG;
    return CUDA_SUCCESS;
}

/* The graph pool of a tagged handle's block.  The block is alive: it is
 * in use until this release, and its pool retires only after. */
static cm_gpool *
cm_gpool_of(uintptr_t handle, cm_blk **bp)
{
    cm_blk *b = (cm_blk *)(handle & ~CM_GPOOL_TAG);

    *bp = b;
    return (cm_gpool *)b->seg->owner;
}

CUresult
cm_gpool_release(cm_context *ctx, uintptr_t handle, int sync)
{
    cm_blk *b;
    cm_gpool *gp = cm_gpool_of(handle, &b);
    cm_pool *p = gp->p;
    CUresult rc = CUDA_SUCCESS;
    int retire;

    (void)ctx;
    if (sync && !p->dead) {
        /* Other streams used it and could not be recorded: every one of
         * them is done once the context is.  Not while a blocking
         * stream captures: tried again at a later flush. */
        rc = cm_pool_sync_context();
        if (rc == CUDA_ERROR_NOT_READY) {
            return rc;
        }
    }
    cm_mu_lock(&p->mu);
    if (!p->dead) {
        if (sync || rc != CUDA_SUCCESS) {
            b->stream = CM_POOL_STUCK;
        }
        cm_pool_put(p, b);
    }
    gp->live--;
    retire = gp->live == 0 && gp->orphan;
    cm_mu_unlock(&p->mu);
    if (retire) {
        cm_gpool_retire(gp, 0);
    }
    return rc;
}

void
cm_gpool_foreign_free(cm_context *ctx, uintptr_t handle)
{
    cm_blk *b;
    cm_gpool *gp = cm_gpool_of(handle, &b);

    (void)ctx;
    cm_mu_lock(&gp->p->mu);
    if (!gp->p->dead) {
        b->stream = CM_POOL_STUCK;
    }
    cm_mu_unlock(&gp->p->mu);
}

void
cm_gpools_stream_gone(cm_context *ctx, CUstream h)
{
    uintptr_t s = cm_stream_key(h);
    cm_gpool *gp;
    cm_seg *g;
    cm_blk *b;

    if (__atomic_load_n(&cm_gpools, __ATOMIC_RELAXED) == NULL) {
        /* No graph pool (a hint read without the mutex). */
        return;
    }
    cm_mu_lock(&cm_gpool_mu);
    for (gp = cm_gpools; gp != NULL; gp = gp->next) {
        if (gp->ctx != ctx) {
            continue;
        }
        cm_mu_lock(&gp->p->mu);
        for (g = gp->p->segs; g != NULL; g = g->next) {
            for (b = g->first; b != NULL; b = b->next) {
                if (b->stream == s) {
                    b->stream = CM_POOL_STUCK;
                }
            }
        }
        cm_mu_unlock(&gp->p->mu);
    }
    cm_mu_unlock(&cm_gpool_mu);
}

void
cm_gpools_stats(cm_context *ctx, size_t *reserved, size_t *free_b)
{
    cm_gpool *gp;

    if (__atomic_load_n(&cm_gpools, __ATOMIC_RELAXED) == NULL) {
        /* No graph pool (a hint read without the mutex). */
        return;
    }
    cm_mu_lock(&cm_gpool_mu);
    for (gp = cm_gpools; gp != NULL; gp = gp->next) {
        if (gp->ctx != ctx) {
            continue;
        }
        cm_mu_lock(&gp->p->mu);
        if (!gp->p->dead) {
            *reserved += gp->p->reserved;
            *free_b += gp->p->free_bytes;
        }
        cm_mu_unlock(&gp->p->mu);
    }
    cm_mu_unlock(&cm_gpool_mu);
}

/* ------------------------------------------------------------------ */
/* The capsule (GIL held)                                              */
/* ------------------------------------------------------------------ */

static void
cm_gpool_capsule_gone(PyObject *cap)
{
    cm_gpool *gp = PyCapsule_GetPointer(cap, CM_GPOOL_CAPSULE);
    int retire;

    if (gp == NULL) {
        PyErr_Clear();
        return;
    }
    cm_mu_lock(&gp->p->mu);
    gp->orphan = 1;
    retire = gp->live == 0;
    cm_mu_unlock(&gp->p->mu);
    if (retire) {
        cm_gpool_retire(gp, 1);
    }
    /* The capsule's reference (cm_graph_pool_new_fn). */
    Py_XDECREF((PyObject *)PyCapsule_GetContext(cap));
}

PyDoc_STRVAR(cm_graph_pool_new_doc,
"_graph_pool_new(ctx)\n--\n\n"
"A new graph pool of Context ctx, as a capsule: what cudamem.GraphPool "
"holds.  The pool retires (its memory back to the device) once the "
"capsule is gone and no block of it is in use.");

static PyObject *
cm_graph_pool_new_fn(PyObject *mod, PyObject *arg)
{
    cm_context *ctx;
    cm_gpool *gp;
    PyObject *cap;

    (void)mod;
    if (!PyObject_TypeCheck(arg, cm_st->Context_type)) {
        PyErr_SetString(PyExc_TypeError, "expected a Context");
        return NULL;
    }
    ctx = (cm_context *)arg;
    if (!ctx->alive) {
        PyErr_SetString(PyExc_ValueError,
                        "the context was closed or reset");
        return NULL;
    }
    gp = cm_gpool_make(ctx);
    if (gp == NULL) {
        return PyErr_NoMemory();
    }
    cap = PyCapsule_New(gp, CM_GPOOL_CAPSULE, NULL);
    if (cap == NULL) {
        cm_gpool_free(gp, NULL);
        return NULL;
    }
    /* The capsule holds the context, for the retirement its destructor
     * may run. */
    if (PyCapsule_SetContext(cap, Py_NewRef(arg)) < 0
        || PyCapsule_SetDestructor(cap, cm_gpool_capsule_gone) < 0) {
        Py_DECREF(arg);
        Py_DECREF(cap);
        cm_gpool_free(gp, NULL);
        return NULL;
    }
    cm_mu_lock(&cm_gpool_mu);
    cm_gpool_link(gp);
    cm_mu_unlock(&cm_gpool_mu);
    cm_gpools_tidy();
    return cap;
}

PyDoc_STRVAR(cm_graph_pool_stats_doc,
"_graph_pool_stats(capsule)\n--\n\n"
"A graph pool's state: {'reserved_bytes', 'free_bytes', 'live_blocks', "
"'segments', 'dead'}.");

static PyObject *
cm_graph_pool_stats_fn(PyObject *mod, PyObject *arg)
{
    cm_gpool *gp = PyCapsule_GetPointer(arg, CM_GPOOL_CAPSULE);
    size_t reserved, free_b, live;
    Py_ssize_t nseg = 0;
    int dead;
    cm_seg *g;

    (void)mod;
    if (gp == NULL) {
        return NULL;
    }
    cm_mu_lock(&gp->p->mu);
    reserved = gp->p->reserved;
    free_b = gp->p->free_bytes;
    live = gp->live;
    dead = gp->p->dead;
    for (g = gp->p->segs; g != NULL; g = g->next) {
        nseg++;
    }
    cm_mu_unlock(&gp->p->mu);
    return Py_BuildValue("{snsnsnsnsO}", "reserved_bytes",
                         (Py_ssize_t)reserved, "free_bytes",
                         (Py_ssize_t)free_b, "live_blocks", (Py_ssize_t)live,
                         "segments", nseg, "dead",
                         dead ? Py_True : Py_False);
}

static PyMethodDef cm_gpool_functions[] = {
    {"_graph_pool_new", cm_graph_pool_new_fn, METH_O,
     cm_graph_pool_new_doc},
    {"_graph_pool_stats", cm_graph_pool_stats_fn, METH_O,
     cm_graph_pool_stats_doc},
    {NULL, NULL, 0, NULL},
};

int
cm_gpool_init(PyObject *mod)
{
    cm_ctx_up.graph_pools_closing = cm_gpools_closing;
    cm_ctx_up.graph_pools_tidy = cm_gpools_tidy;
    return PyModule_AddFunctions(mod, cm_gpool_functions);
}
