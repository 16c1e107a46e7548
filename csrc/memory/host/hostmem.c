/* SPDX-License-Identifier: MIT */
/*
 * hostmem.c: page-locked (pinned), mapped and managed host memory, the
 * registration of existing host arrays, and the pinned-memory pool.
 *
 * Owns:
 * - HostAllocation, the reference-counted owner of one cuMemHostAlloc or
 *   cuMemAllocManaged allocation (or of a plugin manager's pointer object
 *   that owns one).  pinned_array gives a plain ndarray whose base is the
 *   owner; mapped_array / managed_array give MappedNDArray /
 *   ManagedNDArray (NumPy subclasses defined in cudamem/_hostmem.py) over
 *   it.  When the last array goes, pinned memory (counting 0 bytes) and
 *   mapped memory (counting its size) go to the context's memory queue
 *   with cuMemFreeHost, managed memory with cuMemFree; pooled pinned
 *   blocks go back to the pool.
 * - HostRegistration, what pinned() and mapped() hold: the host ranges of
 *   their arrays, registered with cuMemHostRegister through a
 *   process-wide registry of byte ranges counted by their users, so that
 *   nested and overlapping registrations work.  A registration either
 *   takes all its ranges or none; unregistration is immediate, never
 *   queued.  The driver registers exact byte ranges (arrays sharing a
 *   page are independent) and refuses a copy whose host side starts in
 *   one registration and runs past its end, so overlapping arrays of one
 *   call are registered as one range; an array that only partly overlaps
 *   a range registered by an enclosing block gets the rest registered
 *   separately, and a single copy across that seam is refused.
 * - The pinned pool (on unless CUDAMEM_PINNED_POOL=0): per device, free
 *   lists of page-locked blocks in power-of-two size classes, keeping at
 *   most CUDAMEM_PINNED_POOL_LIMIT free bytes (default: the smaller of
 *   1 GiB and 1/16 of the host's memory).  A returned block gets an
 *   event recorded on the legacy default stream, which completes after
 *   all work issued before it to the context's blocking streams; a block
 *   is reused only once that event has completed.  Work on non-blocking
 *   streams is not ordered before that event: whoever queued it there
 *   synchronises before dropping the array.  The free blocks are given
 *   back by pinned_pool_trim(), when an allocation runs out of host
 *   memory, and at close().  While a CUDA graph capture cudamem began is
 *   in progress, a returned block is released through the queue instead
 *   (the legacy stream may not be used while a blocking stream captures),
 *   and while the capture forbids this thread the query, a free block is
 *   reused only if a context-wide synchronize since its event's record
 *   tells that it completed.
 *
 * Locks and the GIL: takes no lock; the GIL guards the owners, the pinned
 * pool and the statistics.  It gives up the GIL (CM_DRIVER_BEGIN_NOGIL,
 * CM_CU_NOGIL) around cuMemHostAlloc / cuMemAllocManaged, and around the
 * cuEventDestroy / cuMemFreeHost of a trim's blocks, already taken off
 * the pool's lists and uncounted, so other threads may use the pool
 * meanwhile; a context closed meanwhile is checked for after.  The
 * registry and its lock (cm_reg_lock) are registry.c's and hostreg.c's.
 */
#include "memory/host/host.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

const char *const cm_hm_kind_names[] = {"pinned", "mapped",
                                               "managed"};


/* ------------------------------------------------------------------ */
/* The pinned pool                                                     */
/* ------------------------------------------------------------------ */

#define CM_POOL_MIN_SHIFT 12          /* the smallest class: 4 KiB */
#define CM_POOL_DEVICES 64            /* devices with a pool */

/* NOTE: guarded by the GIL. */
static cm_hpool cm_pools[CM_POOL_DEVICES];
int cm_hpool_on;                /* CUDAMEM_PINNED_POOL */
size_t cm_hpool_cap;            /* most free bytes kept */

/* The pool of ctx's device, emptied of blocks of an earlier context
 * (their memory went with that context); NULL if the device has none. */
cm_hpool *
cm_hpool_of(cm_context *ctx)
{
    cm_hpool *p;
    int c;

    if (ctx->device->id < 0 || ctx->device->id >= CM_POOL_DEVICES) {
        return NULL;
    }
    p = &cm_pools[ctx->device->id];
    if (p->gen == ctx->gen) {
        return p;
    }
    for (c = 0; c < CM_POOL_CLASSES; c++) {
        while (p->free[c] != NULL) {
            cm_hblock *b = p->free[c];

            p->free[c] = b->next;
            PyMem_RawFree(b);
        }
    }
    memset(p, 0, sizeof(*p));
    p->gen = ctx->gen;
    return p;
}

/* The size class of a request; -1 when too large to pool. */
static int
cm_hpool_class(size_t size)
{
    int c = 0;

    while (c < CM_POOL_CLASSES
           && ((size_t)1 << (c + CM_POOL_MIN_SHIFT)) < size) {
        c++;
    }
    return c < CM_POOL_CLASSES ? c : -1;
}

/* A free block of class c of ctx's pool p whose last users have
 * finished, unlinked; NULL if none. */
static cm_hblock *
cm_hpool_take(const cm_context *ctx, cm_hpool *p, int c)
{
    cm_hblock **link = &p->free[c];
    /* The walk keeps a pointer into the list: the GIL stays held, and
     * while Python callbacks are in flight no event is asked (a block
     * whose event is unknown counts as busy); nor while a capture
     * forbids the query, when only a synchronize can tell. */
    int ask = !cm_gil_yield_needed();
    int restricted = cm_capture_restricted();

    while (*link != NULL) {
        cm_hblock *b = *link;

        if (b->ev == NULL
            || (restricted ? cm_ctx_synced_since(ctx, b->mark)
                : ask && CM_CU_RAW_HELD(EventQuery, (b->ev))
                         == CUDA_SUCCESS)) {
            *link = b->next;
            b->next = NULL;
            p->free_bytes -= b->size;
            return b;
        }
        link = &b->next;
    }
    return NULL;
}

/* Queue the release of a block's memory and event; the pool forgets it. */
static void
cm_hpool_drop(cm_context *ctx, cm_hpool *p, cm_hblock *b)
{
    if (p != NULL) {
        p->reserved -= b->size;
    }
    ctx->st_pinned -= b->size;
    cm_ctx_release(ctx, CM_REL_HOST, (uintptr_t)b->host, 0);
    if (b->ev != NULL) {
        cm_ctx_release(ctx, CM_REL_EVENT, (uintptr_t)b->ev, 0);
    }
    PyMem_RawFree(b);
}

/* Give a block back when its owner goes.  Never raises. */
static void
cm_hpool_give(cm_context *ctx, cm_hblock *b)
{
    cm_hpool *p;
    CUresult rc;
    int pushed;
    int c;

    if (!ctx->alive || cm_forked) {
        PyMem_RawFree(b);
        return;
    }
    p = cm_hpool_of(ctx);
    c = cm_hpool_class(b->size);
    /* During a capture, the record on the legacy stream would join a
     * blocking stream's capture (the driver refuses it, invalidating
     * the capture): released instead. */
    if (p == NULL || c < 0 || cm_on_driver_thread()
        || p->free_bytes + b->size > cm_hpool_cap || cm_capture_any()) {
        cm_hpool_drop(ctx, p, b);
        return;
    }
    /* Work issued to blocking streams before now may still read or write
     * the block: the legacy default stream orders after all of it. */
    rc = cm_ctx_enter(ctx->handle, &pushed);
    if (rc == CUDA_SUCCESS && b->ev == NULL) {
        rc = CM_CU_RAW(EventCreate, (&b->ev, CU_EVENT_DISABLE_TIMING));
        if (rc != CUDA_SUCCESS) {
            b->ev = NULL;
        }
    }
    /* Each call above may have let go of the GIL, and a reset may have
     * marked the context dead meanwhile: its memory and events go with
     * it, and the block is forgotten. */
    if (rc == CUDA_SUCCESS && !ctx->alive) {
        cm_ctx_leave(pushed);
        PyMem_RawFree(b);
        return;
    }
    if (rc == CUDA_SUCCESS) {
        rc = CM_CU_RAW(EventRecord, (b->ev, CU_STREAM_LEGACY));
        b->mark = cm_ctx_sync_mark(ctx);
    }
    cm_ctx_leave(pushed);
    if (rc == CUDA_SUCCESS && !ctx->alive) {
        PyMem_RawFree(b);
        return;
    }
    if (rc != CUDA_SUCCESS) {
        cm_hpool_drop(ctx, p, b);
        return;
    }
    b->next = p->free[c];
    p->free[c] = b;
    p->free_bytes += b->size;
}

/* Free every free block of ctx's pool now (GIL released around the
 * frees); closing: ctx is being closed (no longer alive, its handle
 * still valid).  0, or -1 with the first driver error raised. */
int
cm_hpool_trim_as(cm_context *ctx, int closing)
{
    cm_hpool *p = cm_hpool_of(ctx);
    cm_hblock *list = NULL;
    CUresult rc = CUDA_SUCCESS;
    const char *fn = "cuMemFreeHost";
    CUcontext h = ctx->handle;
    size_t bytes = 0;
    int pushed;
    int c;

    if (p == NULL || (!ctx->alive && !closing) || cm_forked) {
        return 0;
    }
    for (c = 0; c < CM_POOL_CLASSES; c++) {
        while (p->free[c] != NULL) {
            cm_hblock *b = p->free[c];

            p->free[c] = b->next;
            b->next = list;
            list = b;
            bytes += b->size;
        }
    }
    p->free_bytes = 0;
    p->reserved -= bytes;
    ctx->st_pinned -= bytes;
    CM_DRIVER_BEGIN_NOGIL
    rc = cm_ctx_enter(h, &pushed);
    while (list != NULL) {
        cm_hblock *b = list;
        CUresult r;

        list = b->next;
        if (rc == CUDA_SUCCESS && b->ev != NULL) {
            r = CM_CU_RAW(EventDestroy, (b->ev));
            if (r != CUDA_SUCCESS) {
                rc = r;
                fn = "cuEventDestroy";
            }
        }
        if (rc == CUDA_SUCCESS) {
            rc = CM_CU_RAW(MemFreeHost, (b->host));
        }
        PyMem_RawFree(b);
    }
    cm_ctx_leave(pushed);
    CM_DRIVER_END_NOGIL
    return cm_cu_check(rc, fn);
}

int
cm_hpool_trim(cm_context *ctx)
{
    return cm_hpool_trim_as(ctx, 0);
}

/* ------------------------------------------------------------------ */
/* Allocation with one flush-and-retry on out-of-memory (Q12)          */
/* ------------------------------------------------------------------ */

/* Make room after an out-of-memory answer for page-locked memory: the
 * pool's free blocks, the pending frees and, when page-locked memory of
 * ctx is still alive (a collection frees nothing else of it),
 * unreachable cycles, then the frees they queued. */
static int
cm_make_room(cm_context *ctx)
{
    /* The pool's blocks are not freed while a capture forbids it. */
    if ((!cm_capture_restricted() && cm_hpool_trim(ctx) < 0)
        || cm_pending_flush(ctx->memq) < 0) {
        return -1;
    }
    if (ctx->st_pinned == 0) {
        return 0;
    }
    (void)PyGC_Collect();
    return cm_pending_flush(ctx->memq);
}

/* cuMemHostAlloc (kind != managed) or cuMemAllocManaged of size bytes
 * with flags, retried once after making room (managed memory: as device
 * memory is, and counted against the device's limit until its free).
 * *addr gets the address.  0, or -1 with CudaAPIError (its out-of-memory
 * subclass, also a MemoryError, when memory is short). */
static int
cm_raw_alloc(cm_context *ctx, int kind, size_t size, unsigned int flags,
             uintptr_t *addr)
{
    CUresult rc;
    int attempt;

    for (attempt = 0;; attempt++) {
        void *hp = NULL;
        CUdeviceptr dp = 0;

        if (kind == CM_HM_MANAGED && !cm_limit_take(ctx, size)) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
        else {
            CM_DRIVER_BEGIN_NOGIL
            if (kind == CM_HM_MANAGED) {
                rc = CM_CU_RAW(MemAllocManaged, (&dp, size, flags));
            }
            else {
                rc = CM_CU_RAW(MemHostAlloc, (&hp, size, flags));
            }
            CM_DRIVER_END_NOGIL
            if (kind == CM_HM_MANAGED
                && (rc != CUDA_SUCCESS || !ctx->alive)) {
                cm_limit_give(ctx, size);
            }
        }
        if (rc == CUDA_SUCCESS && !ctx->alive) {
            /* Another thread closed the context meanwhile: the memory is
             * its, and goes (or went) with it, never to be freed here. */
            PyErr_Format(PyExc_ValueError,
                         "the context of device %d was closed or reset "
                         "while this memory was being allocated",
                         ctx->device->id);
            return -1;
        }
        if (rc == CUDA_SUCCESS) {
            *addr = kind == CM_HM_MANAGED ? (uintptr_t)dp : (uintptr_t)hp;
            return 0;
        }
        if (rc != CUDA_ERROR_OUT_OF_MEMORY || attempt > 0) {
            break;
        }
        if (kind == CM_HM_MANAGED) {
            int r = cm_oom_recover(ctx, size, 1);

            if (r < 0) {
                return -1;
            }
            if (r == 0) {
                break;
            }
        }
        else if (cm_make_room(ctx) < 0) {
            return -1;
        }
    }
    if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
        /* The same error, and attributes, as device_array's. */
        cm_raise_oom_at(ctx, rc, size,
                        kind == CM_HM_MANAGED ? "cuMemAllocManaged"
                                              : "cuMemHostAlloc",
                        kind == CM_HM_MANAGED ? CM_OOM_DEVICE : CM_OOM_HOST);
        return -1;
    }
    return cm_raise_cu(rc, kind == CM_HM_MANAGED ? "cuMemAllocManaged"
                                                 : "cuMemHostAlloc");
}

/* NOTE: guarded by the GIL.  Owners of live memory cudamem allocated
 * (not a plugin's), so close() can keep it for their arrays. */
cm_hostmem *cm_hm_live;

void
cm_hm_link(cm_hostmem *m)
{
    m->prev = NULL;
    m->next = cm_hm_live;
    if (cm_hm_live != NULL) {
        cm_hm_live->prev = m;
    }
    cm_hm_live = m;
}

static void
cm_hm_unlink(cm_hostmem *m)
{
    if (m->prev != NULL) {
        m->prev->next = m->next;
    }
    else if (cm_hm_live == m) {
        cm_hm_live = m->next;
    }
    if (m->next != NULL) {
        m->next->prev = m->prev;
    }
    m->prev = m->next = NULL;
}

/* Drop m's share of its rescued mapping; the last share unmaps it. */
static void
cm_hm_unrescue(cm_hostmem *m)
{
    cm_hrescue *r = m->rescue;

    m->rescue = NULL;
    /* A run still pending (saved, not yet restored) is dropped by
     * cm_hostmem_context_restore. */
    if (r != NULL && --r->refs == 0 && r->save == NULL) {
        (void)munmap((void *)r->start, r->len);
        PyMem_RawFree(r);
    }
}

int
cm_hm_check(PyObject *o)
{
    return Py_IS_TYPE(o, ST->HostMem_type);
}

int
cm_hostmem_page_locked(PyObject *arr, cm_context *ctx)
{
    PyObject *base = arr;
    cm_hostmem *m;

    while (base != NULL && PyArray_Check(base)) {
        base = PyArray_BASE((PyArrayObject *)base);
    }
    if (base == NULL || !cm_hm_check(base)) {
        return 0;
    }
    m = (cm_hostmem *)base;
    return m->kind != CM_HM_MANAGED && m->host != 0 && m->rescue == NULL
           && m->plugin_mem == NULL
           && (m->ctx == ctx || (m->flags & CU_MEMHOSTALLOC_PORTABLE));
}

int
cm_hm_traverse(PyObject *self, visitproc visit, void *arg)
{
    cm_hostmem *m = (cm_hostmem *)self;

    Py_VISIT(Py_TYPE(self));
    Py_VISIT(m->ctx);
    Py_VISIT(m->plugin_mem);
    Py_VISIT(m->stream);
    return 0;
}

int
cm_hm_clear(PyObject *self)
{
    cm_hostmem *m = (cm_hostmem *)self;

    if (m->plugin_mem != NULL) {
        /* The memory goes with the plugin's object: never free it here. */
        m->host = 0;
        m->dptr = 0;
    }
    Py_CLEAR(m->plugin_mem);
    Py_CLEAR(m->stream);
    return 0;
}

/* Record the free of m's memory at host in the history. */
static void
cm_hm_hist_free(cm_hostmem *m, uintptr_t host)
{
    static const int kinds[] = {CM_HIST_PINNED, CM_HIST_MAPPED,
                                CM_HIST_MANAGED};

    if (host != 0 && m->plugin_mem == NULL) {
        cm_hist_record(CM_HIST_FREE, kinds[m->kind], m->ctx, 0,
                       m->kind == CM_HM_MANAGED ? (uintptr_t)m->dptr : host,
                       m->size);
    }
}

/* Hand the memory back once: to the pool, or to the context's queue. */
static void
cm_hm_release(cm_hostmem *m)
{
    cm_context *ctx = m->ctx;
    uintptr_t host = m->host;

    m->host = 0;
    cm_hm_unlink(m);
    if (__builtin_expect(cm_hist_on, 0)) {
        cm_hm_hist_free(m, host);
    }
    if (m->rescue != NULL) {
        /* The context went; the memory is an anonymous mapping now. */
        cm_hm_unrescue(m);
        PyMem_RawFree(m->block);
        m->block = NULL;
        return;
    }
    if (host == 0 || m->plugin_mem != NULL || ctx == NULL) {
        return;
    }
    if (m->block != NULL) {
        cm_hblock *b = m->block;

        m->block = NULL;
        cm_hpool_give(ctx, b);
        return;
    }
    if (!ctx->alive) {
        return;
    }
    if (m->kind == CM_HM_MANAGED) {
        /* Counted as device memory at allocation; the queue uncounts. */
        cm_ctx_release(ctx, CM_REL_DEVICE, (uintptr_t)m->dptr, m->size);
        return;
    }
    ctx->st_pinned -= m->size;
    cm_ctx_release(ctx, CM_REL_HOST, host,
                   m->kind == CM_HM_MAPPED ? m->size : 0);
}

void
cm_hm_dealloc(PyObject *self)
{
    cm_hostmem *m = (cm_hostmem *)self;
    PyTypeObject *tp = Py_TYPE(self);
    PyObject *exc = PyErr_GetRaisedException();

    PyObject_GC_UnTrack(self);
    if (m->weakreflist != NULL) {
        PyObject_ClearWeakRefs(self);
    }
    if (!Py_IsFinalizing()) {
        cm_hm_release(m);
    }
    cm_hm_unlink(m);
    Py_CLEAR(m->plugin_mem);
    Py_CLEAR(m->stream);
    Py_CLEAR(m->ctx);
    tp->tp_free(self);
    Py_DECREF(tp);
    PyErr_SetRaisedException(exc);
}

/* A new owner with nothing allocated yet. */
cm_hostmem *
cm_hm_empty(cm_context *ctx, int kind, size_t size, unsigned int flags,
            PyObject *stream)
{
    cm_hostmem *m = PyObject_GC_New(cm_hostmem, ST->HostMem_type);

    if (m == NULL) {
        return NULL;
    }
    m->ctx = (cm_context *)Py_NewRef(ctx);
    m->host = 0;
    m->dptr = 0;
    m->size = size;
    m->kind = kind;
    m->flags = flags;
    m->block = NULL;
    m->plugin_mem = NULL;
    m->stream = Py_NewRef(stream != NULL ? stream : cm_hm_zero);
    m->prev = m->next = NULL;
    m->rescue = NULL;
    m->weakreflist = NULL;
    PyObject_GC_Track(m);
    return m;
}

/* Fill m through the context's plugin manager. */
int
cm_hm_alloc_plugin(cm_hostmem *m)
{
    PyObject *mm = m->ctx->memory_manager;
    PyObject *mp;
    uintptr_t h = 0;
    uintptr_t d = 0;

    if (cm_mm_prepare(m->ctx) < 0) {
        return -1;
    }
    if (m->kind == CM_HM_MANAGED) {
        /* Counted against the limit while the plugin's object lives. */
        if (cm_limit_plugin_take(m->ctx, m->size, "memallocmanaged", 1)
            < 0) {
            return -1;
        }
        mp = PyObject_CallMethod(mm, "memallocmanaged", "nO",
                                 (Py_ssize_t)m->size,
                                 m->flags == CU_MEM_ATTACH_GLOBAL
                                     ? Py_True : Py_False);
        if (mp == NULL) {
            cm_limit_give(m->ctx, m->size);
            return -1;
        }
        if (cm_pointer_attr(mp, "device_pointer", &d) < 0) {
            cm_limit_give(m->ctx, m->size);
            goto err_drop_mp;
        }
        cm_limit_plugin_track(m->ctx, mp, m->size);
        m->plugin_mem = mp;
        m->host = d;
        m->dptr = (CUdeviceptr)d;
        return 0;
    }
    mp = PyObject_CallMethod(
        mm, "memhostalloc", "nOOO", (Py_ssize_t)m->size,
        m->kind == CM_HM_MAPPED ? Py_True : Py_False,
        (m->flags & CU_MEMHOSTALLOC_PORTABLE) ? Py_True : Py_False,
        (m->flags & CU_MEMHOSTALLOC_WRITECOMBINED) ? Py_True : Py_False);
    if (mp == NULL) {
        return -1;
    }
    if (cm_pointer_attr(mp, "host_pointer", &h) < 0
        || (m->kind == CM_HM_MAPPED
            && cm_pointer_attr(mp, "device_pointer", &d) < 0)) {
        goto err_drop_mp;
    }
    m->plugin_mem = mp;
    m->host = h;
    m->dptr = (CUdeviceptr)d;
    return 0;
err_drop_mp:
    Py_DECREF(mp);
    return -1;
}

/* Fill m with cudamem's own allocation (pool, host or managed). */
int
cm_hm_alloc_default(cm_hostmem *m)
{
    cm_context *ctx = m->ctx;
    uintptr_t addr = 0;
    CUdeviceptr d = 0;
    int err;

    if (m->kind == CM_HM_PINNED && cm_hpool_on) {
        cm_hpool *p = cm_hpool_of(ctx);
        int c = cm_hpool_class(m->size);

        if (p != NULL && c >= 0) {
            cm_hblock *b = cm_hpool_take(ctx, p, c);

            if (b != NULL) {
                p->hits++;
            }
            else {
                size_t sz = (size_t)1 << (c + CM_POOL_MIN_SHIFT);

                if (cm_raw_alloc(ctx, CM_HM_PINNED, sz, 0, &addr) < 0) {
                    if (sz == m->size
                        || !PyErr_ExceptionMatches(
                               ST->CudaOutOfMemoryError)) {
                        return -1;
                    }
                    /* The rounded size did not fit: the exact one may,
                     * outside the pool. */
                    PyErr_Clear();
                    goto unpooled;
                }
                b = PyMem_RawMalloc(sizeof(*b));
                if (b == NULL) {
                    cm_ctx_release(ctx, CM_REL_HOST, addr, 0);
                    PyErr_NoMemory();
                    return -1;
                }
                b->host = (void *)addr;
                b->size = sz;
                b->ev = NULL;
                b->mark = 0;
                b->next = NULL;
                p->misses++;
                p->reserved += sz;
                ctx->st_pinned += sz;
            }
            m->block = b;
            m->host = (uintptr_t)b->host;
            cm_hist_note(CM_HIST_ALLOC, CM_HIST_PINNED, ctx, 0, m->host,
                         m->size);
            return 0;
        }
    }
unpooled:
    if (cm_raw_alloc(ctx, m->kind, m->size, m->flags, &addr) < 0) {
        return -1;
    }
    if (m->kind == CM_HM_MANAGED) {
        m->host = addr;
        m->dptr = (CUdeviceptr)addr;
        cm_ctx_count_alloc(ctx, m->size);
        cm_hist_note(CM_HIST_ALLOC, CM_HIST_MANAGED, ctx, 0, addr, m->size);
        return 0;
    }
    if (m->kind == CM_HM_MAPPED) {
        err = CM_CU(MemHostGetDevicePointer, (&d, (void *)addr, 0));
        if (err < 0) {
            CM_CU_NOGIL(err, MemFreeHost, ((void *)addr));
            return -1;
        }
        m->dptr = d;
    }
    m->host = addr;
    ctx->st_pinned += m->size;
    cm_hist_note(CM_HIST_ALLOC, m->kind == CM_HM_MAPPED ? CM_HIST_MAPPED
                                                        : CM_HIST_PINNED,
                 ctx, 0, addr, m->size);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Host allocations behind arrays                                      */
/* ------------------------------------------------------------------ */

const char *const cm_hm_kw_text[KW_N] = {
    "shape", "dtype", "strides", "order", "stream", "portable", "wc",
    "attach_global", "ary", "device", "advice",
};

_Static_assert(KW_N == CM_HOST_KW_N,
               "cm_state.hm_kw holds one entry per KW_* name");

/* A stream argument: NULL or None give 0; else it must resolve. */
PyObject *
cm_hm_stream_arg(PyObject *o)
{
    CUstream h;

    if (o == NULL || o == Py_None) {
        return cm_hm_zero;
    }
    return cm_stream_resolve(o, &h) < 0 ? NULL : o;
}

/* The HostAllocation in arr's base chain, or NULL (no exception). */
cm_hostmem *
cm_hm_find(PyObject *arr)
{
    while (PyArray_Check(arr)) {
        PyObject *b = PyArray_BASE((PyArrayObject *)arr);

        if (b == NULL) {
            return NULL;
        }
        if (cm_hm_check(b)) {
            return (cm_hostmem *)b;
        }
        arr = b;
    }
    return NULL;
}

static const char cm_host_owner_doc[] = PyDoc_STR(
"_host_owner(ary)\n--\n\n"
"The HostAllocation in the base chain of ``ary``, or None.");

static PyObject *
cm_host_owner_fn(PyObject *mod, PyObject *arg)
{
    cm_hostmem *m = cm_hm_find(arg);

    (void)mod;
    return Py_NewRef(m != NULL ? (PyObject *)m : Py_None);
}

/* The device address of host memory at addr (mapped or registered). */
int
cm_host_devptr(cm_hostmem *m, uintptr_t addr, CUdeviceptr *d)
{
    if (m != NULL && m->dptr != 0) {
        *d = m->dptr + (CUdeviceptr)(addr - m->host);
        return 0;
    }
    return CM_CU(MemHostGetDevicePointer, (d, (void *)addr, 0));
}

static const char cm_host_get_flags_doc[] = PyDoc_STR(
"_host_get_flags(ptr)\n--\n\n"
"cuMemHostGetFlags: the flags of the cuMemHostAlloc allocation at ptr.");

static PyObject *
cm_host_get_flags_fn(PyObject *mod, PyObject *arg)
{
    void *p = PyLong_AsVoidPtr(arg);
    unsigned int flags = 0;

    (void)mod;
    if ((p == NULL && PyErr_Occurred()) || cm_context_current() == NULL
        || CM_CU(MemHostGetFlags, (&flags, p)) < 0) {
        return NULL;
    }
    return PyLong_FromUnsignedLong(flags);
}

static PyMethodDef cm_hostmem_functions[] = {
    {"_host_owner", cm_host_owner_fn, METH_O, cm_host_owner_doc},
    {"_host_get_flags", cm_host_get_flags_fn, METH_O,
     cm_host_get_flags_doc},
    {NULL, NULL, 0, NULL},
};

int
cm_hostmem_add_functions(PyObject *mod)
{
    return PyModule_AddFunctions(mod, cm_hostmem_functions);
}
