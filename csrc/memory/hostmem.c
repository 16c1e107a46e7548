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
 *   memory, and at close().
 *
 * Locking: the GIL guards the owners, the pool and the statistics.  The
 * registry has its own lock, taken only with the GIL released; it is held
 * across cuMemHostRegister / cuMemHostUnregister, and nothing of Python
 * is touched while it is held.
 */
#include "memory/memory.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

/* What a HostAllocation holds. */
enum {
    CM_HM_PINNED = 0,     /* cuMemHostAlloc, no device mapping asked */
    CM_HM_MAPPED,         /* cuMemHostAlloc with DEVICEMAP */
    CM_HM_MANAGED         /* cuMemAllocManaged */
};

static const char *const cm_hm_kind_names[] = {"pinned", "mapped",
                                               "managed"};

static PyObject *cm_hm_zero;          /* the int 0: the unbound stream */

/* ------------------------------------------------------------------ */
/* Context switching without the GIL                                   */
/* ------------------------------------------------------------------ */

/* Make h current if it is not; *pushed says whether to pop.  No GIL
 * needed. */
static CUresult
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

static void
cm_ctx_leave(int pushed)
{
    CUcontext popped;

    if (pushed) {
        (void)CM_CU_RAW(CtxPopCurrent, (&popped));
    }
}

/* ------------------------------------------------------------------ */
/* The pinned pool                                                     */
/* ------------------------------------------------------------------ */

#define CM_POOL_MIN_SHIFT 12          /* the smallest class: 4 KiB */
#define CM_POOL_CLASSES 40            /* 4 KiB .. 2 PiB */
#define CM_POOL_DEVICES 64            /* devices with a pool */

/* One page-locked block of a size class. */
typedef struct cm_hblock {
    void *host;               /* cuMemHostAlloc address */
    size_t size;              /* the class size, bytes */
    CUevent ev;               /* recorded when returned; NULL until then */
    struct cm_hblock *next;   /* free list link */
} cm_hblock;

/* One device's pool. */
typedef struct {
    unsigned long gen;        /* the Context generation the blocks are of;
                               * 0 before first use */
    cm_hblock *free[CM_POOL_CLASSES];  /* LIFO free lists */
    size_t reserved;          /* bytes of all blocks made (live and free) */
    size_t free_bytes;        /* bytes of free blocks */
    size_t hits;              /* allocations served from a free block */
    size_t misses;            /* allocations that made a block */
} cm_hpool;

/* NOTE: guarded by the GIL. */
static cm_hpool cm_pools[CM_POOL_DEVICES];
static int cm_hpool_on;                /* CUDAMEM_PINNED_POOL */
static size_t cm_hpool_cap;            /* most free bytes kept */

/* The pool of ctx's device, emptied of blocks of an earlier context
 * (their memory went with that context); NULL if the device has none. */
static cm_hpool *
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

/* A free block of class c whose last users have finished, unlinked;
 * NULL if none. */
static cm_hblock *
cm_hpool_take(cm_hpool *p, int c)
{
    cm_hblock **link = &p->free[c];

    while (*link != NULL) {
        cm_hblock *b = *link;

        if (b->ev == NULL
            || CM_CU_RAW(EventQuery, (b->ev)) == CUDA_SUCCESS) {
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
    if (p == NULL || c < 0 || cm_on_driver_thread()
        || p->free_bytes + b->size > cm_hpool_cap) {
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
    if (rc == CUDA_SUCCESS) {
        rc = CM_CU_RAW(EventRecord, (b->ev, CU_STREAM_LEGACY));
    }
    cm_ctx_leave(pushed);
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
static int
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
    Py_BEGIN_ALLOW_THREADS
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
    Py_END_ALLOW_THREADS
    return cm_cu_check(rc, fn);
}

static int
cm_hpool_trim(cm_context *ctx)
{
    return cm_hpool_trim_as(ctx, 0);
}

/* ------------------------------------------------------------------ */
/* Allocation with one flush-and-retry on out-of-memory (Q12)          */
/* ------------------------------------------------------------------ */

/* Make room after an out-of-memory answer: the pool's free blocks, the
 * pending frees, unreachable cycles, then the frees they queued. */
static int
cm_make_room(cm_context *ctx)
{
    if (cm_hpool_trim(ctx) < 0 || cm_pending_flush(ctx->memq) < 0) {
        return -1;
    }
    (void)PyGC_Collect();
    return cm_pending_flush(ctx->memq);
}

/* cuMemHostAlloc (kind != managed) or cuMemAllocManaged of size bytes
 * with flags, retried once after making room.  *addr gets the address.
 * 0, or -1 with CudaAPIError (its out-of-memory subclass, also a
 * MemoryError, when memory is short). */
static int
cm_raw_alloc(cm_context *ctx, int kind, size_t size, unsigned int flags,
             uintptr_t *addr)
{
    CUresult rc;
    int attempt;

    for (attempt = 0;; attempt++) {
        void *hp = NULL;
        CUdeviceptr dp = 0;

        CM_DRIVER_BEGIN_NOGIL
        if (kind == CM_HM_MANAGED) {
            rc = CM_CU_RAW(MemAllocManaged, (&dp, size, flags));
        }
        else {
            rc = CM_CU_RAW(MemHostAlloc, (&hp, size, flags));
        }
        CM_DRIVER_END_NOGIL
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
        if (cm_make_room(ctx) < 0) {
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

/* ------------------------------------------------------------------ */
/* HostAllocation                                                      */
/* ------------------------------------------------------------------ */

/* Host memory that outlived its context: an anonymous mapping put where
 * the driver's mapping was, holding what the memory held (see "Host
 * memory across close()" below). */
typedef struct {
    uintptr_t start;          /* page-aligned */
    size_t len;               /* whole pages */
    void *save;               /* the copy while the context goes */
    Py_ssize_t refs;          /* owners in it */
} cm_hrescue;

/* The owner of one host allocation. */
typedef struct cm_hostmem_s {
    PyObject_HEAD
    cm_context *ctx;          /* strong: the context it was made in */
    uintptr_t host;           /* host address; 0 when size is 0 */
    CUdeviceptr dptr;         /* device address (mapped, managed); else 0 */
    size_t size;              /* bytes (a pooled block may be larger) */
    int kind;                 /* CM_HM_* */
    unsigned int flags;       /* the flags it was allocated with */
    cm_hblock *block;         /* the pool block it is, or NULL */
    PyObject *plugin_mem;     /* strong: the plugin's pointer object that
                               * owns the memory, or NULL (cudamem does) */
    PyObject *stream;         /* strong: the stream its arrays are bound
                               * to (0 or a Stream) */
    struct cm_hostmem_s *prev;  /* the list of owners of cudamem's own */
    struct cm_hostmem_s *next;  /* memory (cm_hm_live) */
    cm_hrescue *rescue;       /* where the memory went at close(), or
                               * NULL */
    PyObject *weakreflist;
} cm_hostmem;

/* NOTE: guarded by the GIL.  Owners of live memory cudamem allocated
 * (not a plugin's), so close() can keep it for their arrays. */
static cm_hostmem *cm_hm_live;

static void
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

#define ST cm_st

static int
cm_hm_check(PyObject *o)
{
    return Py_IS_TYPE(o, ST->HostMem_type);
}

static int
cm_hm_traverse(PyObject *self, visitproc visit, void *arg)
{
    cm_hostmem *m = (cm_hostmem *)self;

    Py_VISIT(Py_TYPE(self));
    Py_VISIT(m->ctx);
    Py_VISIT(m->plugin_mem);
    Py_VISIT(m->stream);
    return 0;
}

static int
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

static void
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
static cm_hostmem *
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
static int
cm_hm_alloc_plugin(cm_hostmem *m)
{
    PyObject *mm = m->ctx->memory_manager;
    PyObject *mp;
    uintptr_t h = 0;
    uintptr_t d = 0;

    if (m->kind == CM_HM_MANAGED) {
        mp = PyObject_CallMethod(mm, "memallocmanaged", "nO",
                                 (Py_ssize_t)m->size,
                                 m->flags == CU_MEM_ATTACH_GLOBAL
                                     ? Py_True : Py_False);
    }
    else {
        mp = PyObject_CallMethod(
            mm, "memhostalloc", "nOOO", (Py_ssize_t)m->size,
            m->kind == CM_HM_MAPPED ? Py_True : Py_False,
            (m->flags & CU_MEMHOSTALLOC_PORTABLE) ? Py_True : Py_False,
            (m->flags & CU_MEMHOSTALLOC_WRITECOMBINED) ? Py_True
                                                         : Py_False);
    }
    if (mp == NULL) {
        return -1;
    }
    if (m->kind == CM_HM_MANAGED) {
        if (cm_pointer_attr(mp, "device_pointer", &d) < 0) {
            goto err_drop_mp;
        }
        h = d;
    }
    else if (cm_pointer_attr(mp, "host_pointer", &h) < 0
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
static int
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
            cm_hblock *b = cm_hpool_take(p, c);

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
        ctx->st_bytes += m->size;
        ctx->st_count++;
        ctx->st_total_count++;
        if (ctx->st_bytes > ctx->st_peak) {
            ctx->st_peak = ctx->st_bytes;
        }
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
/* Host memory across close()                                          */
/* ------------------------------------------------------------------ */

/* Resetting a primary context unmaps its page-locked, mapped and managed
 * memory, and NumPy arrays still pointing there would fault.  Before the
 * reset the pages of each live owner of the context are copied (merged
 * into runs: the driver packs small allocations into shared pages);
 * after it an anonymous mapping with the copy is put at the same address
 * if nothing is mapped there, and unmapped when the run's last owner
 * goes.  The arrays keep their contents as ordinary pageable memory. */

typedef struct {
    uintptr_t a;              /* first page */
    uintptr_t b;              /* past the last page */
    cm_hostmem *m;
} cm_hspan;

/* NOTE: guarded by the GIL.  Runs saved, waiting for the reset to end. */
static cm_hrescue **cm_hr_pending;
static Py_ssize_t cm_hr_npending;

/* Other threads may touch these pages without the GIL all along (NumPy
 * releases it around its loops, a[:] = 1 included).  From the save to the
 * restore the runs are read-only, then unmapped by the reset: a thread
 * that faults on one meanwhile waits in cm_hr_fault until the restore has
 * put the pages back, then its access is retried.  A fault taken during
 * the window whose handler runs only after it closed is retried once.
 * Any other fault goes to the handler that was there before.  The
 * handler touches atomics, the published ranges and its thread's own
 * last retry only. */
typedef struct {
    Py_ssize_t n;             /* runs */
    uintptr_t *start;         /* [k]: first byte of run k */
    size_t *len;              /* [k]: its bytes */
} cm_hr_ranges;

static cm_hr_ranges *cm_hr_win;       /* the last window's runs */
static int cm_hr_window;              /* 1 from save to restore */
static unsigned long cm_hr_serial;    /* windows opened so far */
static int cm_hr_in_fault;            /* threads inside cm_hr_fault */
static struct sigaction cm_hr_old_segv;
static struct sigaction cm_hr_old_bus;
/* The access this thread last retried: (address, window). */
static __thread uintptr_t cm_hr_retried_addr
    __attribute__((tls_model("initial-exec")));
static __thread unsigned long cm_hr_retried_serial
    __attribute__((tls_model("initial-exec")));

static int
cm_hr_in_ranges(const cm_hr_ranges *w, uintptr_t p)
{
    Py_ssize_t k;

    for (k = 0; w != NULL && k < w->n; k++) {
        if (p >= w->start[k] && p - w->start[k] < w->len[k]) {
            return 1;
        }
    }
    return 0;
}

static void
cm_hr_fault(int sig, siginfo_t *si, void *uc)
{
    struct sigaction *old = sig == SIGBUS ? &cm_hr_old_bus
                                          : &cm_hr_old_segv;
    struct timespec ts = {0, 50000};
    int saved_errno = errno;
    uintptr_t p = si != NULL ? (uintptr_t)si->si_addr : 0;
    unsigned long serial;
    int retry = 0;

    (void)__atomic_fetch_add(&cm_hr_in_fault, 1, __ATOMIC_SEQ_CST);
    serial = __atomic_load_n(&cm_hr_serial, __ATOMIC_SEQ_CST);
    if (si != NULL && si->si_code > 0
        && cm_hr_in_ranges(__atomic_load_n(&cm_hr_win, __ATOMIC_SEQ_CST),
                           p)) {
        if (__atomic_load_n(&cm_hr_window, __ATOMIC_SEQ_CST)) {
            while (__atomic_load_n(&cm_hr_window, __ATOMIC_SEQ_CST)) {
                (void)nanosleep(&ts, NULL);
            }
            retry = 1;
        }
        else {
            retry = cm_hr_retried_addr != p
                    || cm_hr_retried_serial != serial;
        }
        cm_hr_retried_addr = p;
        cm_hr_retried_serial = serial;
    }
    (void)__atomic_fetch_sub(&cm_hr_in_fault, 1, __ATOMIC_SEQ_CST);
    errno = saved_errno;
    if (retry) {
        return;     /* the pages are back: the access runs again */
    }
    if (old->sa_flags & SA_SIGINFO) {
        if (old->sa_sigaction != NULL) {
            old->sa_sigaction(sig, si, uc);
            return;
        }
    }
    else if (old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN) {
        old->sa_handler(sig);
        return;
    }
    /* The default action: the access faults again and kills. */
    (void)signal(sig, SIG_DFL);
}

/* Put cm_hr_fault in front of the SIGSEGV and SIGBUS handlers, unless it
 * is there already (a handler installed since, faulthandler's say, is
 * chained to). */
static void
cm_hr_install(void)
{
    struct sigaction sa;
    struct sigaction cur;
    int sigs[2] = {SIGSEGV, SIGBUS};
    struct sigaction *olds[2] = {&cm_hr_old_segv, &cm_hr_old_bus};
    int k;

    for (k = 0; k < 2; k++) {
        if (sigaction(sigs[k], NULL, &cur) != 0
            || ((cur.sa_flags & SA_SIGINFO)
                && cur.sa_sigaction == cm_hr_fault)) {
            continue;
        }
        memset(&sa, 0, sizeof(sa));
        sa.sa_sigaction = cm_hr_fault;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        *olds[k] = cur;
        (void)sigaction(sigs[k], &sa, NULL);
    }
}

/* Wait until no thread is inside the fault handler. */
static void
cm_hr_drain_faults(void)
{
    struct timespec ts = {0, 50000};

    while (__atomic_load_n(&cm_hr_in_fault, __ATOMIC_SEQ_CST) != 0) {
        (void)nanosleep(&ts, NULL);
    }
}

/* Open the window over the runs that spans sp[0..n) (sorted) merge into
 * (GIL held): 0, or -1 when
 * memory is short (nothing is saved then). */
static int
cm_hr_open_window(const cm_hspan *sp, Py_ssize_t n)
{
    cm_hr_ranges *w = PyMem_RawMalloc(sizeof(*w));
    cm_hr_ranges *old;
    Py_ssize_t i;
    Py_ssize_t j;

    if (w == NULL) {
        return -1;
    }
    w->n = 0;
    w->start = PyMem_RawMalloc((size_t)n * sizeof(*w->start));
    w->len = PyMem_RawMalloc((size_t)n * sizeof(*w->len));
    if (w->start == NULL || w->len == NULL) {
        PyMem_RawFree(w->start);
        PyMem_RawFree(w->len);
        PyMem_RawFree(w);
        return -1;
    }
    for (i = 0; i < n; i = j) {
        uintptr_t end = sp[i].b;

        for (j = i + 1; j < n && sp[j].a <= end; j++) {
            end = sp[j].b > end ? sp[j].b : end;
        }
        w->start[w->n] = sp[i].a;
        w->len[w->n] = end - sp[i].a;
        w->n++;
    }
    cm_hr_install();
    old = __atomic_exchange_n(&cm_hr_win, w, __ATOMIC_SEQ_CST);
    (void)__atomic_fetch_add(&cm_hr_serial, 1, __ATOMIC_SEQ_CST);
    /* A handler still reading the old ranges is done before they go (and
     * none waits while the window is shut). */
    cm_hr_drain_faults();
    __atomic_store_n(&cm_hr_window, 1, __ATOMIC_SEQ_CST);
    if (old != NULL) {
        PyMem_RawFree(old->start);
        PyMem_RawFree(old->len);
        PyMem_RawFree(old);
    }
    return 0;
}

static int
cm_hspan_cmp(const void *x, const void *y)
{
    uintptr_t a = ((const cm_hspan *)x)->a;
    uintptr_t b = ((const cm_hspan *)y)->a;

    return a < b ? -1 : a > b;
}

/* Copy run [a, b) of spans sp[i..j) aside; on failure their owners are
 * left as they are (their memory goes with the context). */
static void
cm_hr_save_run(cm_hspan *sp, Py_ssize_t i, Py_ssize_t j)
{
    cm_hrescue *r = PyMem_RawMalloc(sizeof(*r));
    uintptr_t b = sp[i].b;
    Py_ssize_t k;

    for (k = i; k < j; k++) {
        b = sp[k].b > b ? sp[k].b : b;
    }
    if (r == NULL) {
        return;
    }
    r->start = sp[i].a;
    r->len = b - sp[i].a;
    r->save = mmap(NULL, r->len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r->save == MAP_FAILED) {
        PyMem_RawFree(r);
        return;
    }
    r->refs = j - i;
    for (k = i; k < j; k++) {
        sp[k].m->rescue = r;
    }
    cm_hr_pending[cm_hr_npending++] = r;
    /* Writers without the GIL now wait for the restore (a mapping of the
     * driver's that refuses this just keeps its late writes out of the
     * copy). */
    (void)mprotect((void *)r->start, r->len, PROT_READ);
    memcpy(r->save, (void *)r->start, r->len);
}

/* Whether an owner of context a loses its memory when closing context b
 * is reset: a is b, or a live Context of the same primary context (a
 * thread may have made one while close() released the GIL).  Owners of
 * dead contexts are not: their memory went before (a new primary context
 * may have the old one's handle). */
static int
cm_hm_same_primary(cm_context *a, cm_context *b)
{
    return a == b || (a->alive && a->device == b->device
                      && a->handle == b->handle);
}

int
cm_hostmem_context_save(cm_context *ctx)
{
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    cm_hostmem *m;
    cm_hspan *sp;
    Py_ssize_t n = 0;
    Py_ssize_t i;
    Py_ssize_t j;
    int pushed;
    int tries;

    /* The pool's free blocks go first (the reset would free their memory
     * too, unless another user keeps the primary context). */
    if (cm_hpool_trim_as(ctx, 1) < 0) {
        PyErr_WriteUnraisable((PyObject *)ctx);
    }
    for (m = cm_hm_live; m != NULL && n == 0; m = m->next) {
        n += cm_hm_same_primary(m->ctx, ctx) && m->rescue == NULL;
    }
    if (n == 0 || cm_hr_pending != NULL) {
        return 0;
    }
    /* Work still queued may write the memory (or, managed, hold it on the
     * device), and the reset, made with the GIL held, must not wait for a
     * callback that needs it: let all of it finish.  Other threads may
     * queue more meanwhile, so this repeats (a few times at most), and
     * the owners are listed after.  A failed context keeps its pages. */
    for (tries = 0;; tries++) {
        Py_BEGIN_ALLOW_THREADS
        if (cm_ctx_enter(ctx->handle, &pushed) == CUDA_SUCCESS) {
            (void)CM_CU_RAW(CtxSynchronize, ());
            cm_ctx_leave(pushed);
        }
        Py_END_ALLOW_THREADS
        if (ctx->pycalls <= 0) {
            break;
        }
        if (tries == 100) {
            return 0;   /* callbacks keep coming: do without */
        }
    }
    n = 0;
    for (m = cm_hm_live; m != NULL; m = m->next) {
        n += cm_hm_same_primary(m->ctx, ctx) && m->rescue == NULL;
    }
    if (n == 0) {
        return 0;
    }
    sp = PyMem_RawMalloc((size_t)n * sizeof(*sp));
    cm_hr_pending = PyMem_RawMalloc((size_t)n * sizeof(*cm_hr_pending));
    if (sp == NULL || cm_hr_pending == NULL) {
        PyMem_RawFree(sp);
        PyMem_RawFree(cm_hr_pending);
        cm_hr_pending = NULL;
        return 0;
    }
    cm_hr_npending = 0;
    n = 0;
    for (m = cm_hm_live; m != NULL; m = m->next) {
        if (cm_hm_same_primary(m->ctx, ctx) && m->rescue == NULL) {
            sp[n].a = m->host & ~(pg - 1);
            sp[n].b = (m->host + m->size + pg - 1) & ~(pg - 1);
            sp[n].m = m;
            n++;
        }
    }
    qsort(sp, (size_t)n, sizeof(*sp), cm_hspan_cmp);
    if (cm_hr_open_window(sp, n) < 0) {
        PyMem_RawFree(sp);
        PyMem_RawFree(cm_hr_pending);
        cm_hr_pending = NULL;
        return 0;
    }
    for (i = 0; i < n; i = j) {
        uintptr_t end = sp[i].b;

        for (j = i + 1; j < n && sp[j].a <= end; j++) {
            end = sp[j].b > end ? sp[j].b : end;
        }
        cm_hr_save_run(sp, i, j);
    }
    PyMem_RawFree(sp);
    if (cm_hr_npending == 0) {
        __atomic_store_n(&cm_hr_window, 0, __ATOMIC_SEQ_CST);
        cm_hr_drain_faults();
        PyMem_RawFree(cm_hr_pending);
        cm_hr_pending = NULL;
        return 0;
    }
    return 1;
}

void
cm_hostmem_context_restore(cm_context *ctx)
{
    Py_ssize_t i;

    (void)ctx;
    if (cm_hr_pending == NULL) {
        return;
    }
    /* First every run goes back, then the window closes: a thread
     * waiting in the fault handler retries only once all are back. */
    for (i = 0; i < cm_hr_npending; i++) {
        cm_hrescue *r = cm_hr_pending[i];
        void *p;

        if (r->refs == 0) {
            continue;
        }
        /* Claimed inaccessible first, so that a thread reaching these
         * pages before the copy is in place faults and waits rather than
         * seeing (or writing into) fresh zero pages; the copy then
         * replaces the claim in one step. */
        p = mmap((void *)r->start, r->len, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        if (p == (void *)r->start) {
            if (mremap(r->save, r->len, r->len,
                       MREMAP_MAYMOVE | MREMAP_FIXED, p) == MAP_FAILED) {
                (void)mprotect(p, r->len, PROT_READ | PROT_WRITE);
                memcpy(p, r->save, r->len);
                (void)munmap(r->save, r->len);
            }
            r->save = NULL;
            continue;
        }
        /* Something is still mapped there (the driver kept the memory),
         * or a kernel without MAP_FIXED_NOREPLACE put it elsewhere: the
         * owners keep what is there, writable again. */
        if (p != MAP_FAILED) {
            (void)munmap(p, r->len);
        }
        (void)mprotect((void *)r->start, r->len, PROT_READ | PROT_WRITE);
    }
    /* Threads waiting in the fault handler retry now. */
    __atomic_store_n(&cm_hr_window, 0, __ATOMIC_SEQ_CST);
    for (i = 0; i < cm_hr_npending; i++) {
        cm_hrescue *r = cm_hr_pending[i];
        cm_hostmem *m;

        if (r->refs == 0) {
            /* Its arrays went while the context was being reset. */
            (void)munmap(r->save, r->len);
            PyMem_RawFree(r);
            continue;
        }
        if (r->save == NULL) {
            continue;   /* back in place */
        }
        (void)munmap(r->save, r->len);
        for (m = cm_hm_live; m != NULL; m = m->next) {
            if (m->rescue == r) {
                m->rescue = NULL;
            }
        }
        PyMem_RawFree(r);
    }
    PyMem_RawFree(cm_hr_pending);
    cm_hr_pending = NULL;
    cm_hr_npending = 0;
}

/* A new owner of size bytes of kind in the current context.  Size 0
 * allocates nothing. */
static cm_hostmem *
cm_hm_new(int kind, size_t size, unsigned int flags, PyObject *stream)
{
    cm_context *ctx = cm_context_current();
    cm_hostmem *m;
    int err;

    if (ctx == NULL) {
        return NULL;
    }
    m = cm_hm_empty(ctx, kind, size, flags, stream);
    if (m == NULL) {
        return NULL;
    }
    if (size == 0) {
        return m;
    }
    err = (ctx->mm_kind == CM_MM_PLUGIN) ? cm_hm_alloc_plugin(m) : cm_hm_alloc_default(m);
    if (err < 0) {
        Py_DECREF(m);
        return NULL;
    }
    if (m->plugin_mem == NULL && m->host != 0) {
        cm_hm_link(m);
    }
    return m;
}

static int
cm_hm_getbuffer(PyObject *self, Py_buffer *view, int flags)
{
    cm_hostmem *m = (cm_hostmem *)self;

    return PyBuffer_FillInfo(view, self, (void *)m->host,
                             m->host ? (Py_ssize_t)m->size : 0, 0, flags);
}

static PyObject *
cm_hm_get_host(PyObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromSize_t(((cm_hostmem *)self)->host);
}

static PyObject *
cm_hm_get_dptr(PyObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromUnsignedLongLong(((cm_hostmem *)self)->dptr);
}

static PyObject *
cm_hm_get_dptr_value(PyObject *self, void *unused)
{
    cm_hostmem *m = (cm_hostmem *)self;

    (void)unused;
    if (m->dptr == 0) {
        Py_RETURN_NONE;
    }
    return PyLong_FromUnsignedLongLong(m->dptr);
}

static PyObject *
cm_hm_get_handle(PyObject *self, void *unused)
{
    cm_hostmem *m = (cm_hostmem *)self;

    (void)unused;
    return PyLong_FromSize_t(m->kind == CM_HM_MANAGED ? (size_t)m->dptr
                                                      : m->host);
}

static PyObject *
cm_hm_get_size(PyObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromSize_t(((cm_hostmem *)self)->size);
}

static PyObject *
cm_hm_get_kind(PyObject *self, void *unused)
{
    (void)unused;
    return PyUnicode_FromString(
        cm_hm_kind_names[((cm_hostmem *)self)->kind]);
}

static PyObject *
cm_hm_get_flags(PyObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromUnsignedLong(((cm_hostmem *)self)->flags);
}

static PyObject *
cm_hm_get_pooled(PyObject *self, void *unused)
{
    (void)unused;
    return PyBool_FromLong(((cm_hostmem *)self)->block != NULL);
}

static PyObject *
cm_hm_get_context(PyObject *self, void *unused)
{
    (void)unused;
    return Py_NewRef(((cm_hostmem *)self)->ctx);
}

static PyObject *
cm_hm_get_owner(PyObject *self, void *unused)
{
    cm_hostmem *m = (cm_hostmem *)self;

    (void)unused;
    return Py_NewRef(m->plugin_mem != NULL ? m->plugin_mem : self);
}

static PyObject *
cm_hm_get_stream(PyObject *self, void *unused)
{
    (void)unused;
    return Py_NewRef(((cm_hostmem *)self)->stream);
}

static int
cm_hm_set_stream(PyObject *self, PyObject *value, void *unused)
{
    CUstream h;

    (void)unused;
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete stream");
        return -1;
    }
    if (value == Py_None) {
        value = cm_hm_zero;
    }
    else if (cm_stream_resolve(value, &h) < 0) {
        return -1;
    }
    Py_SETREF(((cm_hostmem *)self)->stream, Py_NewRef(value));
    return 0;
}

static PyGetSetDef cm_hm_getset[] = {
    {"host_pointer", cm_hm_get_host, NULL, "The host address, as an int.",
     NULL},
    {"device_pointer", cm_hm_get_dptr, NULL,
     "The device address (0 for pinned memory).", NULL},
    {"device_pointer_value", cm_hm_get_dptr_value, NULL,
     "The device address, or None.", NULL},
    {"handle", cm_hm_get_handle, NULL,
     "The host address (the managed address for managed memory).", NULL},
    {"size", cm_hm_get_size, NULL, "Bytes allocated for the arrays.", NULL},
    {"kind", cm_hm_get_kind, NULL, "'pinned', 'mapped' or 'managed'.",
     NULL},
    {"flags", cm_hm_get_flags, NULL,
     "The cuMemHostAlloc (or cuMemAllocManaged) flags used.", NULL},
    {"pooled", cm_hm_get_pooled, NULL,
     "Whether the memory is a block of the pinned pool.", NULL},
    {"context", cm_hm_get_context, NULL, "The Context it belongs to.",
     NULL},
    {"owner", cm_hm_get_owner, NULL,
     "What owns the memory: this object, or a plugin's pointer.", NULL},
    {"stream", cm_hm_get_stream, cm_hm_set_stream,
     "The stream arrays on this memory are bound to.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef cm_hm_members[] = {
    {"__weaklistoffset__", Py_T_PYSSIZET,
     offsetof(cm_hostmem, weakreflist), Py_READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(cm_hm_doc,
"One page-locked, mapped or managed host allocation: the base of the\n"
"arrays made on it, and a buffer over its bytes.  Its memory is released\n"
"(through the context's deferred queue, or back to the pinned pool) when\n"
"the last array goes.");

static PyType_Slot cm_hm_slots[] = {
    {Py_tp_doc, (void *)cm_hm_doc},
    {Py_tp_dealloc, cm_hm_dealloc},
    {Py_tp_traverse, cm_hm_traverse},
    {Py_tp_clear, cm_hm_clear},
    {Py_tp_getset, cm_hm_getset},
    {Py_tp_members, cm_hm_members},
    {Py_bf_getbuffer, cm_hm_getbuffer},
    {0, NULL},
};

static PyType_Spec cm_hm_spec = {
    .name = "cudamem.HostAllocation",
    .basicsize = sizeof(cm_hostmem),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC
             | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = cm_hm_slots,
};

/* ------------------------------------------------------------------ */
/* Arrays on host allocations                                          */
/* ------------------------------------------------------------------ */

/* Where an empty array's data points: never read or written. */
static _Alignas(64) char cm_empty_data[64];

/* Interned keyword names. */
enum {
    KW_SHAPE, KW_DTYPE, KW_STRIDES, KW_ORDER, KW_STREAM, KW_PORTABLE,
    KW_WC, KW_ATTACH_GLOBAL, KW_ARY, KW_DEVICE, KW_ADVICE, KW_N
};

static const char *const cm_hm_kw_text[KW_N] = {
    "shape", "dtype", "strides", "order", "stream", "portable", "wc",
    "attach_global", "ary", "device", "advice",
};

static PyObject *cm_hm_kw[KW_N];

/* The NumPy subclass for arrays of kind (mapped or managed), fetched
 * from cudamem._hostmem once.  Borrowed, or NULL. */
static PyTypeObject *
cm_hm_subtype(int kind)
{
    PyObject **slot = kind == CM_HM_MAPPED ? &ST->MappedNDArray
                                           : &ST->ManagedNDArray;
    PyObject *mod;
    PyObject *cls;

    if (*slot != NULL) {
        return (PyTypeObject *)*slot;
    }
    mod = PyImport_ImportModule("cudamem._hostmem");
    if (mod == NULL) {
        return NULL;
    }
    cls = PyObject_GetAttrString(mod, kind == CM_HM_MAPPED
                                          ? "MappedNDArray"
                                          : "ManagedNDArray");
    Py_DECREF(mod);
    if (cls == NULL) {
        return NULL;
    }
    if (!PyType_Check(cls)
        || !PyType_IsSubtype((PyTypeObject *)cls, &PyArray_Type)) {
        Py_DECREF(cls);
        PyErr_SetString(PyExc_TypeError,
                        "cudamem._hostmem must define ndarray subclasses");
        return NULL;
    }
    *slot = cls;
    return (PyTypeObject *)cls;
}

/* An array of type subtype over m's memory with this layout; lo is the
 * offset of the layout's lowest byte (the allocation's first). */
static PyObject *
cm_hm_wrap(cm_hostmem *m, PyTypeObject *subtype, int ndim,
           const Py_ssize_t *shape, const Py_ssize_t *strides,
           PyArray_Descr *dtype, Py_ssize_t lo)
{
    PyObject *arr;
    char *data = m->host ? (char *)m->host - lo : cm_empty_data;

    Py_INCREF(dtype);
    /* Steals dtype even on failure. */
    arr = PyArray_NewFromDescr(subtype, dtype, ndim, (npy_intp *)shape,
                               (npy_intp *)strides, data,
                               NPY_ARRAY_WRITEABLE, NULL);
    if (arr == NULL) {
        return NULL;
    }
    /* Steals the new owner reference even on failure. */
    if (PyArray_SetBaseObject((PyArrayObject *)arr, Py_NewRef(m)) < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    PyArray_UpdateFlags((PyArrayObject *)arr, NPY_ARRAY_UPDATE_ALL);
    return arr;
}

/* Allocate the layout's span as kind and wrap it. */
static PyObject *
cm_hm_make(int kind, int ndim, const Py_ssize_t *shape,
           const Py_ssize_t *strides, PyArray_Descr *dtype,
           unsigned int flags, PyObject *stream)
{
    PyTypeObject *subtype = &PyArray_Type;
    Py_ssize_t lo;
    Py_ssize_t span;
    cm_hostmem *m;
    PyObject *r;

    if (kind != CM_HM_PINNED && (subtype = cm_hm_subtype(kind)) == NULL) {
        return NULL;
    }
    span = cm_layout_span(ndim, shape, strides, PyDataType_ELSIZE(dtype),
                          &lo);
    m = cm_hm_new(kind, (size_t)span, flags, stream);
    if (m == NULL) {
        return NULL;
    }
    r = cm_hm_wrap(m, subtype, ndim, shape, strides, dtype, lo);
    Py_DECREF(m);
    return r;
}

/* A stream argument: NULL or None give 0; else it must resolve. */
static PyObject *
cm_hm_stream_arg(PyObject *o)
{
    CUstream h;

    if (o == NULL || o == Py_None) {
        return cm_hm_zero;
    }
    return cm_stream_resolve(o, &h) < 0 ? NULL : o;
}

/* A flag argument: absent is dflt; else its truth. */
static int
cm_hm_bool_arg(PyObject *o, int dflt)
{
    return o == NULL ? dflt : PyObject_IsTrue(o);
}

PyDoc_STRVAR(cm_pinned_array_doc,
"pinned_array(shape, dtype=np.float64, strides=None, order='C')\n--\n\n"
"An uninitialised NumPy array in page-locked host memory\n"
"(cuMemHostAlloc).  Its base is the HostAllocation that owns the memory;\n"
"the memory is released when the last array using it goes.\n\n"
"Notes\n-----\n"
"numba does not retry after out-of-memory here; cudamem flushes its\n"
"pending frees and retries once.  The memory comes from the pinned pool\n"
"(CUDAMEM_PINNED_POOL=0 turns it off); see pinned_pool_stats.");

static PyObject *
cm_pinned_array(PyObject *mod, PyObject *const *args, Py_ssize_t nargs,
                PyObject *kwnames)
{
    PyObject *kwl[4] = {cm_hm_kw[KW_SHAPE], cm_hm_kw[KW_DTYPE],
                        cm_hm_kw[KW_STRIDES], cm_hm_kw[KW_ORDER]};
    Py_ssize_t shape[NPY_MAXDIMS];
    Py_ssize_t strides[NPY_MAXDIMS];
    PyArray_Descr *dt = NULL;
    PyObject *p[4];
    PyObject *r;
    int ndim;

    (void)mod;
    if (cm_argparse("pinned_array", args, nargs, kwnames, kwl, 4, 1, p) < 0
        || (ndim = cm_layout_parse(p[0], p[1], p[2], p[3], shape, strides,
                                   &dt)) < 0) {
        return NULL;
    }
    r = cm_hm_make(CM_HM_PINNED, ndim, shape, strides, dt, 0, NULL);
    Py_DECREF(dt);
    return r;
}

PyDoc_STRVAR(cm_pinned_array_like_doc,
"pinned_array_like(ary)\n--\n\n"
"An uninitialised pinned array with the shape and dtype of ``ary``, laid\n"
"out like it (as device_array_like).");

static PyObject *
cm_pinned_array_like(PyObject *mod, PyObject *ary)
{
    Py_ssize_t shape[NPY_MAXDIMS];
    Py_ssize_t strides[NPY_MAXDIMS];
    PyArray_Descr *dt = NULL;
    PyObject *r;
    int ndim;

    (void)mod;
    ndim = cm_layout_like(ary, shape, strides, &dt);
    if (ndim < 0) {
        return NULL;
    }
    r = cm_hm_make(CM_HM_PINNED, ndim, shape, strides, dt, 0, NULL);
    Py_DECREF(dt);
    return r;
}

/* The cuMemHostAlloc flags of a mapped allocation; -1 on error. */
static long
cm_mapped_flags(PyObject *portable, PyObject *wc)
{
    int pt = cm_hm_bool_arg(portable, 0);
    int w = pt < 0 ? -1 : cm_hm_bool_arg(wc, 0);

    if (pt < 0 || w < 0) {
        return -1;
    }
    return CU_MEMHOSTALLOC_DEVICEMAP | (pt ? CU_MEMHOSTALLOC_PORTABLE : 0)
           | (w ? CU_MEMHOSTALLOC_WRITECOMBINED : 0);
}

PyDoc_STRVAR(cm_mapped_array_doc,
"mapped_array(shape, dtype=np.float64, strides=None, order='C', "
"stream=0, portable=False, wc=False)\n--\n\n"
"An uninitialised MappedNDArray: host memory mapped into the device's\n"
"address space (cuMemHostAlloc with DEVICEMAP), a NumPy array on the\n"
"host and, through __cuda_array_interface__, a device array.\n\n"
"Notes\n-----\n"
"numba ignores ``portable`` and ``wc``; cudamem passes them to the\n"
"driver (CU_MEMHOSTALLOC_PORTABLE, CU_MEMHOSTALLOC_WRITECOMBINED).");

static PyObject *
cm_mapped_array(PyObject *mod, PyObject *const *args, Py_ssize_t nargs,
                PyObject *kwnames)
{
    PyObject *kwl[7] = {cm_hm_kw[KW_SHAPE], cm_hm_kw[KW_DTYPE],
                        cm_hm_kw[KW_STRIDES], cm_hm_kw[KW_ORDER],
                        cm_hm_kw[KW_STREAM], cm_hm_kw[KW_PORTABLE],
                        cm_hm_kw[KW_WC]};
    Py_ssize_t shape[NPY_MAXDIMS];
    Py_ssize_t strides[NPY_MAXDIMS];
    PyArray_Descr *dt = NULL;
    PyObject *p[7];
    PyObject *stream;
    PyObject *r;
    long flags;
    int ndim;

    (void)mod;
    if (cm_argparse("mapped_array", args, nargs, kwnames, kwl, 7, 1, p) < 0
        || (stream = cm_hm_stream_arg(p[4])) == NULL
        || (flags = cm_mapped_flags(p[5], p[6])) < 0
        || (ndim = cm_layout_parse(p[0], p[1], p[2], p[3], shape, strides,
                                   &dt)) < 0) {
        return NULL;
    }
    r = cm_hm_make(CM_HM_MAPPED, ndim, shape, strides, dt,
                   (unsigned int)flags, stream);
    Py_DECREF(dt);
    return r;
}

PyDoc_STRVAR(cm_mapped_array_like_doc,
"mapped_array_like(ary, stream=0, portable=False, wc=False)\n--\n\n"
"An uninitialised MappedNDArray with the shape and dtype of ``ary``, laid\n"
"out like it.  ``portable`` and ``wc`` are honoured (numba ignores\n"
"them).");

static PyObject *
cm_mapped_array_like(PyObject *mod, PyObject *const *args,
                     Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *kwl[4] = {cm_hm_kw[KW_ARY], cm_hm_kw[KW_STREAM],
                        cm_hm_kw[KW_PORTABLE], cm_hm_kw[KW_WC]};
    Py_ssize_t shape[NPY_MAXDIMS];
    Py_ssize_t strides[NPY_MAXDIMS];
    PyArray_Descr *dt = NULL;
    PyObject *p[4];
    PyObject *stream;
    PyObject *r;
    long flags;
    int ndim;

    (void)mod;
    if (cm_argparse("mapped_array_like", args, nargs, kwnames, kwl, 4, 1,
                    p) < 0
        || (stream = cm_hm_stream_arg(p[1])) == NULL
        || (flags = cm_mapped_flags(p[2], p[3])) < 0
        || (ndim = cm_layout_like(p[0], shape, strides, &dt)) < 0) {
        return NULL;
    }
    r = cm_hm_make(CM_HM_MAPPED, ndim, shape, strides, dt,
                   (unsigned int)flags, stream);
    Py_DECREF(dt);
    return r;
}

PyDoc_STRVAR(cm_managed_array_doc,
"managed_array(shape, dtype=np.float64, strides=None, order='C', "
"stream=0, attach_global=True)\n--\n\n"
"An uninitialised ManagedNDArray in managed (unified) memory\n"
"(cuMemAllocManaged with CU_MEM_ATTACH_GLOBAL, or CU_MEM_ATTACH_HOST\n"
"when ``attach_global`` is false), usable from host and device.");

static PyObject *
cm_managed_array(PyObject *mod, PyObject *const *args, Py_ssize_t nargs,
                 PyObject *kwnames)
{
    PyObject *kwl[6] = {cm_hm_kw[KW_SHAPE], cm_hm_kw[KW_DTYPE],
                        cm_hm_kw[KW_STRIDES], cm_hm_kw[KW_ORDER],
                        cm_hm_kw[KW_STREAM], cm_hm_kw[KW_ATTACH_GLOBAL]};
    Py_ssize_t shape[NPY_MAXDIMS];
    Py_ssize_t strides[NPY_MAXDIMS];
    PyArray_Descr *dt = NULL;
    PyObject *p[6];
    PyObject *stream;
    PyObject *r;
    int glob;
    int ndim;

    (void)mod;
    if (cm_argparse("managed_array", args, nargs, kwnames, kwl, 6, 1, p)
            < 0
        || (stream = cm_hm_stream_arg(p[4])) == NULL
        || (glob = cm_hm_bool_arg(p[5], 1)) < 0
        || (ndim = cm_layout_parse(p[0], p[1], p[2], p[3], shape, strides,
                                   &dt)) < 0) {
        return NULL;
    }
    r = cm_hm_make(CM_HM_MANAGED, ndim, shape, strides, dt,
                   glob ? CU_MEM_ATTACH_GLOBAL : CU_MEM_ATTACH_HOST,
                   stream);
    Py_DECREF(dt);
    return r;
}

/* The HostAllocation in arr's base chain, or NULL (no exception). */
static cm_hostmem *
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

PyDoc_STRVAR(cm_host_owner_doc,
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
static int
cm_host_devptr(cm_hostmem *m, uintptr_t addr, CUdeviceptr *d)
{
    if (m != NULL && m->dptr != 0) {
        *d = m->dptr + (CUdeviceptr)(addr - m->host);
        return 0;
    }
    return CM_CU(MemHostGetDevicePointer, (d, (void *)addr, 0));
}

PyDoc_STRVAR(cm_device_view_doc,
"_device_view(ary)\n--\n\n"
"A DeviceNDArray over the device side of a mapped or managed array (or\n"
"a view of one), bound to its allocation's stream.  AttributeError when\n"
"the array's memory is not mapped or managed memory; ValueError when its\n"
"context was closed.");

static PyObject *
cm_device_view_fn(PyObject *mod, PyObject *arg)
{
    PyArrayObject *a = (PyArrayObject *)arg;
    cm_hostmem *m;
    CUdeviceptr d = 0;

    (void)mod;
    if (!PyArray_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "expected a NumPy array, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    m = cm_hm_find(arg);
    if (PyArray_SIZE(a) == 0) {
        return cm_devicearray_new(PyArray_NDIM(a), PyArray_SHAPE(a),
                                  PyArray_STRIDES(a), PyArray_DESCR(a), 0,
                                  NULL, m != NULL ? m->stream : NULL);
    }
    if (m == NULL || m->kind == CM_HM_PINNED || m->host == 0) {
        PyErr_SetString(PyExc_AttributeError,
                        "this array is not in mapped or managed memory (the "
                        "results of NumPy operations are ordinary host "
                        "arrays)");
        return NULL;
    }
    if (!m->ctx->alive) {
        PyErr_Format(PyExc_ValueError,
                     "the context of this %s array was closed: it has no "
                     "device side, and its memory is ordinary host memory "
                     "now", cm_hm_kind_names[m->kind]);
        return NULL;
    }
    if (cm_host_devptr(m, (uintptr_t)PyArray_DATA(a), &d) < 0) {
        return NULL;
    }
    return cm_devicearray_new(PyArray_NDIM(a), PyArray_SHAPE(a),
                              PyArray_STRIDES(a), PyArray_DESCR(a), d,
                              (PyObject *)m, m->stream);
}

PyDoc_STRVAR(cm_host_get_flags_doc,
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

/* ------------------------------------------------------------------ */
/* The registry of registered host ranges                              */
/* ------------------------------------------------------------------ */

/* A byte range registered with the driver by one cuMemHostRegister. */
typedef struct cm_piece {
    uintptr_t lo;             /* first byte */
    uintptr_t hi;             /* end */
    long users;               /* registrations holding it */
    struct cm_piece *next;    /* the next piece up in address */
} cm_piece;

/* The pieces a registration holds, one user each. */
typedef struct {
    cm_piece **v;             /* raw memory */
    Py_ssize_t n;             /* used */
    Py_ssize_t cap;           /* allocated */
} cm_held;

/* Registered memory is portable (the registry is process-wide) and
 * mapped (mapped() and pinned() share pieces). */
#define CM_REG_FLAGS (CU_MEMHOSTREGISTER_PORTABLE \
                      | CU_MEMHOSTREGISTER_DEVICEMAP)

/* NOTE: the pieces, sorted and disjoint, and their byte total are
 * guarded by cm_reg_lock, which is taken only with the GIL released. */
static cm_piece *cm_pieces;
static size_t cm_reg_bytes;
static PyThread_type_lock cm_reg_lock;

static int
cm_held_reserve(cm_held *h)
{
    cm_piece **v;
    Py_ssize_t cap;

    if (h->n < h->cap) {
        return 0;
    }
    cap = h->cap ? 2 * h->cap : 8;
    v = PyMem_RawRealloc(h->v, (size_t)cap * sizeof(*v));
    if (v == NULL) {
        return -1;
    }
    h->v = v;
    h->cap = cap;
    return 0;
}

/* Drop h's pieces, newest first; unregister those left without users
 * (only when driver is set: a dead context took them already).  Lock
 * held, no GIL, the context current.  The first error. */
static CUresult
cm_reg_release_locked(cm_held *h, int driver)
{
    CUresult first = CUDA_SUCCESS;

    while (h->n > 0) {
        cm_piece *p = h->v[--h->n];
        cm_piece **link = &cm_pieces;

        if (--p->users > 0) {
            continue;
        }
        while (*link != p) {
            link = &(*link)->next;
        }
        *link = p->next;
        cm_reg_bytes -= p->hi - p->lo;
        if (driver) {
            CUresult rc = CM_CU_RAW(MemHostUnregister, ((void *)p->lo));

            if (first == CUDA_SUCCESS) {
                first = rc;
            }
        }
        PyMem_RawFree(p);
    }
    return first;
}

/* Hold pieces covering [lo, hi), registering the gaps between existing
 * pieces.  Lock held, no GIL, the context current. */
static CUresult
cm_reg_acquire_locked(uintptr_t lo, uintptr_t hi, cm_held *h)
{
    cm_piece **link = &cm_pieces;
    uintptr_t cur = lo;

    while (cur < hi) {
        cm_piece *p;
        cm_piece *np;
        uintptr_t end;
        CUresult rc;

        while (*link != NULL && (*link)->hi <= cur) {
            link = &(*link)->next;
        }
        p = *link;
        if (cm_held_reserve(h) < 0) {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        if (p != NULL && p->lo <= cur) {
            p->users++;
            h->v[h->n++] = p;
            cur = p->hi;
            link = &p->next;
            continue;
        }
        end = (p != NULL && p->lo < hi) ? p->lo : hi;
        np = PyMem_RawMalloc(sizeof(*np));
        if (np == NULL) {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        rc = CM_CU_RAW(MemHostRegister, ((void *)cur, (size_t)(end - cur),
                                         CM_REG_FLAGS));
        if (rc != CUDA_SUCCESS) {
            PyMem_RawFree(np);
            return rc;
        }
        np->lo = cur;
        np->hi = end;
        np->users = 1;
        np->next = p;
        *link = np;
        cm_reg_bytes += end - cur;
        h->v[h->n++] = np;
        link = &np->next;
        cur = end;
    }
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* HostRegistration                                                    */
/* ------------------------------------------------------------------ */

/* What pinned() / mapped() hold while their block runs. */
typedef struct {
    PyObject_HEAD
    cm_context *ctx;          /* strong: the context current at entry */
    PyObject *arrays;         /* strong: tuple of the arrays */
    PyObject *plugin_pins;    /* strong: list of a plugin's mempin results
                               * (None for arrays not pinned), or NULL */
    cm_held held;             /* registry pieces held */
    int mapped;               /* mapped(): device views wanted */
    int closed;               /* NOTE: set once, before unregistering */
} cm_hostreg;

int
cm_hostreg_closed(PyObject *o)
{
    return Py_IS_TYPE(o, ST->HostRegistration_type)
           && ((cm_hostreg *)o)->closed;
}

static int
cm_reg_traverse(PyObject *self, visitproc visit, void *arg)
{
    cm_hostreg *r = (cm_hostreg *)self;

    Py_VISIT(Py_TYPE(self));
    Py_VISIT(r->ctx);
    Py_VISIT(r->arrays);
    Py_VISIT(r->plugin_pins);
    return 0;
}

/* Unregister now (once).  0, or -1 with the first driver error. */
static int
cm_reg_close_impl(cm_hostreg *r)
{
    CUresult rc = CUDA_SUCCESS;
    CUcontext h;
    int driver;
    int pushed = 0;

    if (r->closed) {
        return 0;
    }
    r->closed = 1;
    /* A plugin's pins unregister in their finalizers, at once. */
    Py_CLEAR(r->plugin_pins);
    if (r->held.n > 0) {
        driver = r->ctx->alive && !cm_forked;
        h = r->ctx->handle;
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(cm_reg_lock, WAIT_LOCK);
        if (driver) {
            rc = cm_ctx_enter(h, &pushed);
        }
        if (rc == CUDA_SUCCESS) {
            rc = cm_reg_release_locked(&r->held, driver);
        }
        cm_ctx_leave(pushed);
        PyThread_release_lock(cm_reg_lock);
        Py_END_ALLOW_THREADS
    }
    PyMem_RawFree(r->held.v);
    r->held.v = NULL;
    r->held.cap = 0;
    return cm_cu_check(rc, "cuMemHostUnregister");
}

static int
cm_reg_clear(PyObject *self)
{
    cm_hostreg *r = (cm_hostreg *)self;

    Py_CLEAR(r->arrays);
    Py_CLEAR(r->plugin_pins);
    return 0;
}

static void
cm_reg_dealloc(PyObject *self)
{
    cm_hostreg *r = (cm_hostreg *)self;
    PyTypeObject *tp = Py_TYPE(self);
    PyObject *exc = PyErr_GetRaisedException();

    PyObject_GC_UnTrack(self);
    /* The driver forbids calls on its callback thread, and at exit the
     * process ends anyway: then the pages stay registered. */
    if (!Py_IsFinalizing() && !cm_on_driver_thread()
        && cm_reg_close_impl(r) < 0) {
        PyErr_WriteUnraisable(self);
    }
    if (r->held.v != NULL) {
        PyMem_RawFree(r->held.v);
    }
    cm_reg_clear(self);
    Py_CLEAR(r->ctx);
    tp->tp_free(self);
    Py_DECREF(tp);
    PyErr_SetRaisedException(exc);
}

/* The byte range [lo, hi) an array occupies; 0 if it is empty. */
static int
cm_array_range(PyArrayObject *a, uintptr_t *lo, uintptr_t *hi)
{
    Py_ssize_t off;
    Py_ssize_t span = cm_layout_span(PyArray_NDIM(a), PyArray_SHAPE(a),
                                     PyArray_STRIDES(a), PyArray_ITEMSIZE(a),
                                     &off);

    if (span <= 0) {
        return 0;
    }
    *lo = (uintptr_t)PyArray_DATA(a) + off;
    *hi = *lo + (uintptr_t)span;
    return 1;
}

/* Pin each array through the plugin manager (mempin). */
static int
cm_reg_plugin(cm_hostreg *r)
{
    Py_ssize_t n = PyTuple_GET_SIZE(r->arrays);
    Py_ssize_t i;

    r->plugin_pins = PyList_New(n);
    if (r->plugin_pins == NULL) {
        return -1;
    }
    for (i = 0; i < n; i++) {
        PyObject *a = PyTuple_GET_ITEM(r->arrays, i);
        PyObject *pin;
        uintptr_t lo;
        uintptr_t hi;

        if (!cm_array_range((PyArrayObject *)a, &lo, &hi)) {
            pin = Py_NewRef(Py_None);
        }
        else {
            pin = PyObject_CallMethod(r->ctx->memory_manager, "mempin",
                                      "OKnO", a, (unsigned long long)lo,
                                      (Py_ssize_t)(hi - lo),
                                      r->mapped ? Py_True : Py_False);
            if (pin == NULL) {
                return -1;
            }
        }
        PyList_SET_ITEM(r->plugin_pins, i, pin);
    }
    return 0;
}

/* Sort the [lo, hi) pairs of ranges (nr entries, two per range) and
 * merge those that overlap or touch; the new entry count.  One driver
 * registration then covers overlapping arrays: the driver refuses a copy
 * whose host side starts in one registration and leaves it. */
static Py_ssize_t
cm_ranges_coalesce(uintptr_t *ranges, Py_ssize_t nr)
{
    Py_ssize_t i;
    Py_ssize_t j;
    Py_ssize_t out = 0;

    for (i = 2; i < nr; i += 2) {
        uintptr_t lo = ranges[i];
        uintptr_t hi = ranges[i + 1];

        for (j = i; j > 0 && ranges[j - 2] > lo; j -= 2) {
            ranges[j] = ranges[j - 2];
            ranges[j + 1] = ranges[j - 1];
        }
        ranges[j] = lo;
        ranges[j + 1] = hi;
    }
    for (i = 0; i < nr; i += 2) {
        if (out > 0 && ranges[i] <= ranges[out - 1]) {
            if (ranges[i + 1] > ranges[out - 1]) {
                ranges[out - 1] = ranges[i + 1];
            }
            continue;
        }
        ranges[out++] = ranges[i];
        ranges[out++] = ranges[i + 1];
    }
    return out;
}

/* Register every array's bytes (none that are already page-locked by
 * cudamem), all or nothing. */
static int
cm_reg_default(cm_hostreg *r)
{
    Py_ssize_t n = PyTuple_GET_SIZE(r->arrays);
    uintptr_t *ranges;
    Py_ssize_t nr = 0;
    Py_ssize_t i;
    CUresult rc = CUDA_SUCCESS;
    CUcontext h = r->ctx->handle;
    int pushed = 0;

    ranges = PyMem_RawMalloc((size_t)(2 * n + 1) * sizeof(*ranges));
    if (ranges == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (i = 0; i < n; i++) {
        PyObject *a = PyTuple_GET_ITEM(r->arrays, i);
        cm_hostmem *m = cm_hm_find(a);
        uintptr_t lo;
        uintptr_t hi;

        if ((m != NULL && m->plugin_mem == NULL)
            || !cm_array_range((PyArrayObject *)a, &lo, &hi)) {
            continue;
        }
        ranges[nr++] = lo;
        ranges[nr++] = hi;
    }
    nr = cm_ranges_coalesce(ranges, nr);
    if (nr > 0) {
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(cm_reg_lock, WAIT_LOCK);
        rc = cm_ctx_enter(h, &pushed);
        for (i = 0; rc == CUDA_SUCCESS && i < nr; i += 2) {
            rc = cm_reg_acquire_locked(ranges[i], ranges[i + 1], &r->held);
        }
        if (rc != CUDA_SUCCESS) {
            /* Leave nothing registered. */
            (void)cm_reg_release_locked(&r->held, 1);
        }
        cm_ctx_leave(pushed);
        PyThread_release_lock(cm_reg_lock);
        Py_END_ALLOW_THREADS
    }
    PyMem_RawFree(ranges);
    return cm_cu_check(rc, "cuMemHostRegister");
}

PyDoc_STRVAR(cm_register_arrays_doc,
"_register_arrays(arrays, mapped)\n--\n\n"
"Page-lock the memory of a tuple of NumPy arrays (cuMemHostRegister, or\n"
"a plugin manager's mempin) until the returned HostRegistration is\n"
"closed.  Registrations of the same or overlapping memory nest.");

static PyObject *
cm_register_arrays_fn(PyObject *mod, PyObject *args)
{
    PyObject *arrays;
    int mapped;
    cm_context *ctx;
    cm_hostreg *r;
    Py_ssize_t i;

    (void)mod;
    if (!PyArg_ParseTuple(args, "O!p:_register_arrays", &PyTuple_Type,
                          &arrays, &mapped)) {
        return NULL;
    }
    for (i = 0; i < PyTuple_GET_SIZE(arrays); i++) {
        PyObject *a = PyTuple_GET_ITEM(arrays, i);

        if (!PyArray_Check(a)) {
            PyErr_Format(PyExc_TypeError,
                         "%s() takes NumPy arrays, not %.100s",
                         mapped ? "mapped" : "pinned", Py_TYPE(a)->tp_name);
            return NULL;
        }
    }
    ctx = cm_context_current();
    if (ctx == NULL) {
        return NULL;
    }
    r = PyObject_GC_New(cm_hostreg, ST->HostRegistration_type);
    if (r == NULL) {
        return NULL;
    }
    r->ctx = (cm_context *)Py_NewRef(ctx);
    r->arrays = Py_NewRef(arrays);
    r->plugin_pins = NULL;
    r->held.v = NULL;
    r->held.n = 0;
    r->held.cap = 0;
    r->mapped = mapped;
    r->closed = 0;
    PyObject_GC_Track(r);
    if (((ctx->mm_kind == CM_MM_PLUGIN) ? cm_reg_plugin(r) : cm_reg_default(r)) < 0) {
        /* Unregisters whatever was registered, silently. */
        r->closed = 1;
        Py_CLEAR(r->plugin_pins);
        Py_DECREF(r);
        return NULL;
    }
    return (PyObject *)r;
}

PyDoc_STRVAR(cm_reg_close_doc,
"close($self, /)\n--\n\n"
"Unregister now (immediately, never deferred); later calls do nothing.");

static PyObject *
cm_reg_close(PyObject *self, PyObject *unused)
{
    (void)unused;
    if (cm_reg_close_impl((cm_hostreg *)self) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* The device view of registered array i. */
static PyObject *
cm_reg_device_array(cm_hostreg *r, Py_ssize_t i, PyObject *stream)
{
    PyArrayObject *a = (PyArrayObject *)PyTuple_GET_ITEM(r->arrays, i);
    uintptr_t lo;
    uintptr_t hi;
    uintptr_t d = 0;

    if (cm_array_range(a, &lo, &hi)) {
        PyObject *pin = r->plugin_pins != NULL
                            ? PyList_GET_ITEM(r->plugin_pins, i) : NULL;

        if (pin != NULL) {
            if (cm_pointer_attr(pin, "device_pointer", &d) < 0) {
                return NULL;
            }
        }
        else {
            CUdeviceptr dp = 0;

            if (cm_host_devptr(cm_hm_find((PyObject *)a), lo, &dp) < 0) {
                return NULL;
            }
            d = (uintptr_t)dp;
        }
        d += (uintptr_t)PyArray_DATA(a) - lo;
    }
    return cm_devicearray_new(PyArray_NDIM(a), PyArray_SHAPE(a),
                              PyArray_STRIDES(a), PyArray_DESCR(a),
                              (CUdeviceptr)d, (PyObject *)r, stream);
}

PyDoc_STRVAR(cm_reg_device_arrays_doc,
"device_arrays($self, stream=0, /)\n--\n\n"
"A list of DeviceNDArray views of the registered arrays' device side,\n"
"bound to ``stream``; valid until close().");

static PyObject *
cm_reg_device_arrays(PyObject *self, PyObject *const *args,
                     Py_ssize_t nargs)
{
    cm_hostreg *r = (cm_hostreg *)self;
    PyObject *stream;
    PyObject *list;
    Py_ssize_t n;
    Py_ssize_t i;

    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError,
                        "device_arrays() takes at most one argument");
        return NULL;
    }
    stream = cm_hm_stream_arg(nargs ? args[0] : NULL);
    if (stream == NULL) {
        return NULL;
    }
    if (r->closed) {
        PyErr_SetString(PyExc_ValueError, "the registration is closed");
        return NULL;
    }
    n = PyTuple_GET_SIZE(r->arrays);
    list = PyList_New(n);
    if (list == NULL) {
        return NULL;
    }
    for (i = 0; i < n; i++) {
        PyObject *d = cm_reg_device_array(r, i, stream);

        if (d == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, d);
    }
    return list;
}

static PyObject *
cm_reg_get_closed(PyObject *self, void *unused)
{
    (void)unused;
    return PyBool_FromLong(((cm_hostreg *)self)->closed);
}

static PyGetSetDef cm_reg_getset[] = {
    {"closed", cm_reg_get_closed, NULL, "Whether close() ran.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef cm_reg_methods[] = {
    {"close", cm_reg_close, METH_NOARGS, cm_reg_close_doc},
    {"device_arrays", (PyCFunction)(void (*)(void))cm_reg_device_arrays,
     METH_FASTCALL, cm_reg_device_arrays_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(cm_reg_doc,
"The registration pinned() and mapped() hold: host arrays page-locked\n"
"until close().");

static PyType_Slot cm_reg_slots[] = {
    {Py_tp_doc, (void *)cm_reg_doc},
    {Py_tp_dealloc, cm_reg_dealloc},
    {Py_tp_traverse, cm_reg_traverse},
    {Py_tp_clear, cm_reg_clear},
    {Py_tp_getset, cm_reg_getset},
    {Py_tp_methods, cm_reg_methods},
    {0, NULL},
};

static PyType_Spec cm_reg_spec = {
    .name = "cudamem.HostRegistration",
    .basicsize = sizeof(cm_hostreg),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC
             | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = cm_reg_slots,
};

PyDoc_STRVAR(cm_registered_bytes_doc,
"_registered_bytes()\n--\n\n"
"Bytes of host memory cudamem holds registered (pinned() / mapped()).");

static PyObject *
cm_registered_bytes_fn(PyObject *mod, PyObject *unused)
{
    size_t b;

    (void)mod;
    (void)unused;
    Py_BEGIN_ALLOW_THREADS
    PyThread_acquire_lock(cm_reg_lock, WAIT_LOCK);
    b = cm_reg_bytes;
    PyThread_release_lock(cm_reg_lock);
    Py_END_ALLOW_THREADS
    return PyLong_FromSize_t(b);
}

int
cm_hostmem_registered(uintptr_t lo, uintptr_t hi)
{
    const cm_piece *p;
    int hit = 0;

    if (cm_reg_lock == NULL) {
        return 0;
    }
    PyThread_acquire_lock(cm_reg_lock, WAIT_LOCK);
    for (p = cm_pieces; p != NULL && p->lo < hi; p = p->next) {
        if (p->hi > lo) {
            hit = 1;
            break;
        }
    }
    PyThread_release_lock(cm_reg_lock);
    return hit;
}

/* ------------------------------------------------------------------ */
/* Managed memory: prefetch and advice                                 */
/* ------------------------------------------------------------------ */

/* The managed range of a managed array: its owner and its byte span
 * [*lo, *lo + *n).  -1 with TypeError for other arrays. */
static cm_hostmem *
cm_managed_range(PyObject *arr, uintptr_t *lo, size_t *n)
{
    cm_hostmem *m = PyArray_Check(arr) ? cm_hm_find(arr) : NULL;
    uintptr_t hi;

    if (m == NULL || m->kind != CM_HM_MANAGED) {
        PyErr_SetString(PyExc_TypeError,
                        "expected an array in managed memory (from "
                        "managed_array)");
        return NULL;
    }
    if (!cm_array_range((PyArrayObject *)arr, lo, &hi)) {
        *n = 0;
        return m;
    }
    *n = (size_t)(hi - *lo);
    return m;
}

/* A location from a device argument: None is m's device; 'cpu', 'host'
 * or -1 the host; else a device ordinal or Device.  *dev gets the device
 * ordinal (-1 for the host). */
static int
cm_location_arg(PyObject *o, cm_hostmem *m, CUmemLocation *loc, int *dev)
{
    long id;

    if (o == NULL || o == Py_None) {
        id = m->ctx->device->id;
    }
    else if (PyUnicode_Check(o)) {
        if (PyUnicode_CompareWithASCIIString(o, "cpu") != 0
            && PyUnicode_CompareWithASCIIString(o, "host") != 0) {
            PyErr_Format(PyExc_ValueError,
                         "device must be a device, its ordinal, None, "
                         "'cpu' or 'host', not %R", o);
            return -1;
        }
        id = -1;
    }
    else if (PyObject_TypeCheck(o, ST->Device_type)) {
        id = ((cm_device *)o)->id;
    }
    else {
        PyObject *idx = PyNumber_Index(o);

        if (idx == NULL) {
            PyErr_Format(PyExc_TypeError,
                         "device must be a device, its ordinal, None, "
                         "'cpu' or 'host', not %.100s",
                         Py_TYPE(o)->tp_name);
            return -1;
        }
        id = PyLong_AsLong(idx);
        Py_DECREF(idx);
        if (id == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (id < -1) {
            PyErr_Format(PyExc_ValueError, "invalid device ordinal %ld",
                         id);
            return -1;
        }
    }
    memset(loc, 0, sizeof(*loc));
    if (id < 0) {
        loc->type = CU_MEM_LOCATION_TYPE_HOST;
        loc->id = 0;
    }
    else {
        loc->type = CU_MEM_LOCATION_TYPE_DEVICE;
        loc->id = (int)id;
    }
    *dev = (int)id;
    return 0;
}

/* CudaSupportError unless device dev (>= 0) can migrate managed memory
 * on demand (CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS). */
static int
cm_check_concurrent_managed(int dev, const char *what)
{
    CUdevice h;
    int v = 0;

    if (dev < 0) {
        return 0;
    }
    if (CM_CU(DeviceGet, (&h, dev)) < 0
        || CM_CU(DeviceGetAttribute,
                 (&v, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, h))
           < 0) {
        return -1;
    }
    if (!v) {
        PyErr_Format(ST->CudaSupportError,
                     "%s needs a device with concurrent managed access; "
                     "device %d has none (a platform without on-demand "
                     "page migration)", what, dev);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(cm_managed_prefetch_doc,
"_managed_prefetch(ary, device=None, stream=0)\n--\n\n"
"cuMemPrefetchAsync of a managed array's bytes to a device (default: the\n"
"one it was allocated on) or to the host ('cpu'), on ``stream``.");

static PyObject *
cm_managed_prefetch_fn(PyObject *mod, PyObject *const *args,
                       Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *kwl[3] = {cm_hm_kw[KW_ARY], cm_hm_kw[KW_DEVICE],
                        cm_hm_kw[KW_STREAM]};
    PyObject *p[3];
    cm_hostmem *m;
    CUmemLocation loc;
    CUstream h = NULL;
    uintptr_t lo = 0;
    size_t n = 0;
    int dev;

    (void)mod;
    if (cm_argparse("prefetch", args, nargs, kwnames, kwl, 3, 1, p) < 0
        || (m = cm_managed_range(p[0], &lo, &n)) == NULL
        || cm_location_arg(p[1], m, &loc, &dev) < 0
        || (p[2] != NULL && p[2] != Py_None
            && cm_stream_resolve(p[2], &h) < 0)
        || cm_context_activate(m->ctx) < 0
        || cm_check_concurrent_managed(dev, "prefetch()") < 0) {
        return NULL;
    }
    if (n > 0 && CM_CU(MemPrefetchAsync, ((CUdeviceptr)lo, n, loc, 0, h))
                 < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* The CUmem_advise named by o (a name or the driver's number). */
static int
cm_advice_arg(PyObject *o, CUmem_advise *adv)
{
    static const struct {
        const char *name;
        CUmem_advise value;
    } names[] = {
        {"read_mostly", CU_MEM_ADVISE_SET_READ_MOSTLY},
        {"unset_read_mostly", CU_MEM_ADVISE_UNSET_READ_MOSTLY},
        {"preferred_location", CU_MEM_ADVISE_SET_PREFERRED_LOCATION},
        {"unset_preferred_location",
         CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION},
        {"accessed_by", CU_MEM_ADVISE_SET_ACCESSED_BY},
        {"unset_accessed_by", CU_MEM_ADVISE_UNSET_ACCESSED_BY},
    };
    size_t i;

    if (PyUnicode_Check(o)) {
        for (i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
            if (PyUnicode_CompareWithASCIIString(o, names[i].name) == 0) {
                *adv = names[i].value;
                return 0;
            }
        }
    }
    else if (PyLong_Check(o)) {
        long v = PyLong_AsLong(o);

        if (v == -1 && PyErr_Occurred()) {
            return -1;
        }
        for (i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
            if ((long)names[i].value == v) {
                *adv = names[i].value;
                return 0;
            }
        }
    }
    PyErr_Format(PyExc_ValueError,
                 "unknown advice %R: use 'read_mostly', "
                 "'unset_read_mostly', 'preferred_location', "
                 "'unset_preferred_location', 'accessed_by' or "
                 "'unset_accessed_by'", o);
    return -1;
}

PyDoc_STRVAR(cm_managed_advise_doc,
"_managed_advise(ary, advice, device=None)\n--\n\n"
"cuMemAdvise over a managed array's bytes.  ``advice``: 'read_mostly',\n"
"'preferred_location', 'accessed_by' or their 'unset_' forms;\n"
"``device`` as for prefetch.");

static PyObject *
cm_managed_advise_fn(PyObject *mod, PyObject *const *args,
                     Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *kwl[3] = {cm_hm_kw[KW_ARY], cm_hm_kw[KW_ADVICE],
                        cm_hm_kw[KW_DEVICE]};
    PyObject *p[3];
    cm_hostmem *m;
    CUmemLocation loc;
    CUmem_advise adv;
    uintptr_t lo = 0;
    size_t n = 0;
    int dev;

    (void)mod;
    if (cm_argparse("advise", args, nargs, kwnames, kwl, 3, 2, p) < 0
        || (m = cm_managed_range(p[0], &lo, &n)) == NULL
        || cm_advice_arg(p[1], &adv) < 0
        || cm_location_arg(p[2], m, &loc, &dev) < 0
        || cm_context_activate(m->ctx) < 0) {
        return NULL;
    }
    if (n > 0 && CM_CU(MemAdvise, ((CUdeviceptr)lo, n, adv, loc)) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ */
/* Pool control                                                        */
/* ------------------------------------------------------------------ */

PyDoc_STRVAR(cm_pinned_pool_trim_doc,
"pinned_pool_trim(device=None)\n--\n\n"
"Give every free block of the pinned pool of ``device`` (default: the\n"
"current one) back to the driver now.");

static PyObject *
cm_pinned_pool_trim_fn(PyObject *mod, PyObject *const *args,
                       Py_ssize_t nargs)
{
    cm_context *ctx;

    (void)mod;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError,
                        "pinned_pool_trim() takes at most one argument");
        return NULL;
    }
    ctx = (nargs == 1 && args[0] != Py_None)
              ? cm_context_of_device(args[0]) : cm_context_current();
    if (ctx == NULL || cm_hpool_trim(ctx) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cm_pinned_pool_stats_doc,
"pinned_pool_stats(device=None)\n--\n\n"
"The pinned pool of ``device`` (default: the current one): a dict with\n"
"enabled, limit_bytes (most free bytes kept), reserved_bytes (in blocks\n"
"made, in use or free), free_bytes, hits and misses.");

static PyObject *
cm_pinned_pool_stats_fn(PyObject *mod, PyObject *const *args,
                        Py_ssize_t nargs)
{
    cm_context *ctx;
    cm_hpool *p;
    cm_hpool none;

    (void)mod;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError,
                        "pinned_pool_stats() takes at most one argument");
        return NULL;
    }
    ctx = (nargs == 1 && args[0] != Py_None)
              ? cm_context_of_device(args[0]) : cm_context_current();
    if (ctx == NULL) {
        return NULL;
    }
    p = cm_hpool_of(ctx);
    if (p == NULL) {
        memset(&none, 0, sizeof(none));
        p = &none;
    }
    return Py_BuildValue("{sOsnsnsnsnsn}",
                         "enabled", cm_hpool_on ? Py_True : Py_False,
                         "limit_bytes", (Py_ssize_t)cm_hpool_cap,
                         "reserved_bytes", (Py_ssize_t)p->reserved,
                         "free_bytes", (Py_ssize_t)p->free_bytes,
                         "hits", (Py_ssize_t)p->hits,
                         "misses", (Py_ssize_t)p->misses);
}

PyDoc_STRVAR(cm_pinned_pool_enable_doc,
"_pinned_pool_enable(enabled, limit=None)\n--\n\n"
"Turn the pinned pool on or off for later allocations (blocks in use\n"
"return to it either way); ``limit``: the most free bytes it keeps.\n"
"Returns whether it was on.");

static PyObject *
cm_pinned_pool_enable_fn(PyObject *mod, PyObject *args)
{
    int on;
    PyObject *limit = Py_None;
    int old = cm_hpool_on;

    (void)mod;
    if (!PyArg_ParseTuple(args, "p|O:_pinned_pool_enable", &on, &limit)) {
        return NULL;
    }
    if (limit != Py_None) {
        Py_ssize_t v = PyNumber_AsSsize_t(limit, PyExc_OverflowError);

        if (v == -1 && PyErr_Occurred()) {
            return NULL;
        }
        if (v < 0) {
            PyErr_SetString(PyExc_ValueError, "limit must not be negative");
            return NULL;
        }
        cm_hpool_cap = (size_t)v;
    }
    cm_hpool_on = on;
    return PyBool_FromLong(old);
}

static PyMethodDef cm_hostmem_functions[] = {
    {"pinned_array", (PyCFunction)(void (*)(void))cm_pinned_array,
     METH_FASTCALL | METH_KEYWORDS, cm_pinned_array_doc},
    {"pinned_array_like", cm_pinned_array_like, METH_O,
     cm_pinned_array_like_doc},
    {"mapped_array", (PyCFunction)(void (*)(void))cm_mapped_array,
     METH_FASTCALL | METH_KEYWORDS, cm_mapped_array_doc},
    {"mapped_array_like", (PyCFunction)(void (*)(void))cm_mapped_array_like,
     METH_FASTCALL | METH_KEYWORDS, cm_mapped_array_like_doc},
    {"managed_array", (PyCFunction)(void (*)(void))cm_managed_array,
     METH_FASTCALL | METH_KEYWORDS, cm_managed_array_doc},
    {"_host_owner", cm_host_owner_fn, METH_O, cm_host_owner_doc},
    {"_device_view", cm_device_view_fn, METH_O, cm_device_view_doc},
    {"_host_get_flags", cm_host_get_flags_fn, METH_O,
     cm_host_get_flags_doc},
    {"_register_arrays", cm_register_arrays_fn, METH_VARARGS,
     cm_register_arrays_doc},
    {"_registered_bytes", cm_registered_bytes_fn, METH_NOARGS,
     cm_registered_bytes_doc},
    {"_managed_prefetch", (PyCFunction)(void (*)(void))cm_managed_prefetch_fn,
     METH_FASTCALL | METH_KEYWORDS, cm_managed_prefetch_doc},
    {"_managed_advise", (PyCFunction)(void (*)(void))cm_managed_advise_fn,
     METH_FASTCALL | METH_KEYWORDS, cm_managed_advise_doc},
    {"pinned_pool_trim", (PyCFunction)(void (*)(void))cm_pinned_pool_trim_fn,
     METH_FASTCALL, cm_pinned_pool_trim_doc},
    {"pinned_pool_stats",
     (PyCFunction)(void (*)(void))cm_pinned_pool_stats_fn, METH_FASTCALL,
     cm_pinned_pool_stats_doc},
    {"_pinned_pool_enable", cm_pinned_pool_enable_fn, METH_VARARGS,
     cm_pinned_pool_enable_doc},
    {NULL, NULL, 0, NULL},
};

/* The pool's limit on free bytes: CUDAMEM_PINNED_POOL_LIMIT (bytes, with
 * an optional K, M or G suffix: powers of 1024), else the smaller of
 * 1 GiB and 1/16 of the host's physical memory.  (The driver pins
 * cuMemHostAlloc memory itself: RLIMIT_MEMLOCK does not bound it.) */
static size_t
cm_pool_default_cap(void)
{
    const char *v = getenv("CUDAMEM_PINNED_POOL_LIMIT");
    size_t cap = (size_t)1 << 30;
    long pages = sysconf(_SC_PHYS_PAGES);
    long psize = sysconf(_SC_PAGESIZE);
    unsigned long long n;
    char *end;

    if (v != NULL && v[0] >= '0' && v[0] <= '9') {
        n = strtoull(v, &end, 10);
        switch (*end) {
        case 'k': case 'K': n <<= 10; end++; break;
        case 'm': case 'M': n <<= 20; end++; break;
        case 'g': case 'G': n <<= 30; end++; break;
        default: break;
        }
        if (*end == '\0') {
            return (size_t)n;
        }
    }
    if (pages > 0 && psize > 0
        && (size_t)pages / 16 * (size_t)psize < cap) {
        cap = (size_t)pages / 16 * (size_t)psize;
    }
    return cap;
}

/* ------------------------------------------------------------------ */
/* HostBuffer: the buffer side of the Python pointer classes           */
/* ------------------------------------------------------------------ */

/* Make a type from spec and add it to mod; 0 or -1. */
static int
cm_add_type(PyObject *mod, PyType_Spec *spec)
{
    PyObject *tp = PyType_FromModuleAndSpec(mod, spec, NULL);
    int r;

    if (tp == NULL) {
        return -1;
    }
    r = PyModule_AddObjectRef(mod, strchr(spec->name, '.') + 1, tp);
    Py_DECREF(tp);
    return r;
}

/* A base class whose instances export a writable buffer over the host
 * bytes [self._buffer_address, + self.size): numba's PinnedMemory,
 * MappedMemory and ManagedMemory (cudamem/_emm.py) and their owned
 * proxies derive from it, so that np.ndarray(buffer=ptr) and
 * memoryview(ptr) work on every supported Python (PEP 688's __buffer__
 * needs 3.12).  The object must keep the memory alive. */
static int
cm_hbuf_getbuffer(PyObject *self, Py_buffer *view, int flags)
{
    uintptr_t addr = 0;
    uintptr_t size = 0;

    if (cm_pointer_attr(self, "_buffer_address", &addr) < 0
        || cm_pointer_attr(self, "size", &size) < 0) {
        return -1;
    }
    if (size > (uintptr_t)PY_SSIZE_T_MAX || (addr == 0 && size != 0)) {
        PyErr_SetString(PyExc_BufferError,
                        "host buffer has no memory or an invalid size");
        return -1;
    }
    return PyBuffer_FillInfo(view, self, (void *)addr, (Py_ssize_t)size, 0,
                             flags);
}

static PyType_Slot cm_hbuf_slots[] = {
    {Py_tp_doc, (void *)"Base of the host-visible pointer classes: a "
                        "buffer over _buffer_address and size."},
    {Py_bf_getbuffer, cm_hbuf_getbuffer},
    {0, NULL},
};

static PyType_Spec cm_hbuf_spec = {
    .name = "cudamem._HostBuffer",
    .basicsize = sizeof(PyObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .slots = cm_hbuf_slots,
};

int
cm_hostmem_init(PyObject *mod, cm_state *st)
{
    const char *v = getenv("CUDAMEM_PINNED_POOL");
    int i;

    /* A flag, as cudamem.config checks it: 1/0, true/false, yes/no,
     * on/off; unset or empty: on. */
    cm_hpool_on = v == NULL || v[0] == '\0'
                  || (strcmp(v, "0") != 0 && strcasecmp(v, "false") != 0
                      && strcasecmp(v, "no") != 0
                      && strcasecmp(v, "off") != 0);
    cm_hpool_cap = cm_pool_default_cap();
    if (cm_reg_lock == NULL) {
        cm_reg_lock = PyThread_allocate_lock();
        if (cm_reg_lock == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    for (i = 0; i < KW_N; i++) {
        cm_hm_kw[i] = PyUnicode_InternFromString(cm_hm_kw_text[i]);
        if (cm_hm_kw[i] == NULL) {
            return -1;
        }
    }
    cm_hm_zero = PyLong_FromLong(0);
    if (cm_hm_zero == NULL) {
        return -1;
    }
    st->HostMem_type = (PyTypeObject *)PyType_FromModuleAndSpec(
        mod, &cm_hm_spec, NULL);
    if (st->HostMem_type == NULL
        || PyModule_AddObjectRef(mod, "HostAllocation",
                                 (PyObject *)st->HostMem_type) < 0) {
        return -1;
    }
    st->HostRegistration_type = (PyTypeObject *)PyType_FromModuleAndSpec(
        mod, &cm_reg_spec, NULL);
    if (st->HostRegistration_type == NULL
        || PyModule_AddObjectRef(mod, "HostRegistration",
                                 (PyObject *)st->HostRegistration_type)
           < 0) {
        return -1;
    }
    if (cm_add_type(mod, &cm_hbuf_spec) < 0) {
        return -1;
    }
    return PyModule_AddFunctions(mod, cm_hostmem_functions);
}
