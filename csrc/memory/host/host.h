/* SPDX-License-Identifier: MIT */
/*
 * memory/host/host.h: the public header of the room memory/host/,
 * page-locked (pinned), mapped and managed host memory: what its files
 * share, and what array/hostarray.c reads of it.  The rest of memory/
 * and the other layers use memory/memory.h.
 * The room owns, lowest first:
 * - registry.c: the registry of the host ranges registered with the
 *   driver, counted by their users;
 * - hostmem.c: HostAllocation, its allocation, and the pinned pool;
 * - hostreg.c: HostRegistration (pinned(), mapped()) and the registry's
 *   queries;
 * - hostclose.c: host memory across close() and Device.reset();
 * - managed.c: managed memory's prefetch and advice;
 * - hostbuf.c: the pinned pool's control, HostBuffer and the room's init.
 *
 * Locks and the GIL, in brief: the GIL guards the owners, the pinned pool
 * and the statistics.  The registry's lock cm_reg_lock (a PyThread lock)
 * guards the registered ranges; it is taken only with the GIL given up,
 * held across cuMemHostRegister / cuMemHostUnregister, and nests with no
 * other lock.  The GIL is given up around the allocations', frees' and
 * registrations' driver calls.
 */
#ifndef CM_HOSTMEM_H
#define CM_HOSTMEM_H

#include "memory/memory.h"

/* What a HostAllocation holds. */
enum {
    CM_HM_PINNED = 0,     /* cuMemHostAlloc, no device mapping asked */
    CM_HM_MAPPED,         /* cuMemHostAlloc with DEVICEMAP */
    CM_HM_MANAGED         /* cuMemAllocManaged */
};

extern const char *const cm_hm_kind_names[];

#define cm_hm_zero (cm_st->zero)     /* the int 0: the unbound stream */

#define CM_POOL_CLASSES 40            /* 4 KiB .. 2 PiB */

/* One page-locked block of a size class. */
typedef struct cm_hblock {
    void *host;               /* cuMemHostAlloc address */
    size_t size;              /* the class size, bytes */
    CUevent ev;               /* recorded when returned; NULL until then */
    unsigned long mark;       /* cm_ctx_sync_mark after ev's record */
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

extern int cm_hpool_on;                /* CUDAMEM_PINNED_POOL */

extern size_t cm_hpool_cap;            /* most free bytes kept */

/* The pool of ctx's device, emptied of blocks of an earlier context
 * (their memory went with that context); NULL if the device has none. */
cm_hpool *cm_hpool_of(cm_context *ctx);

/* Free every free block of ctx's pool now (GIL released around the
 * frees); closing: ctx is being closed (no longer alive, its handle
 * still valid).  0, or -1 with the first driver error raised. */
int cm_hpool_trim_as(cm_context *ctx, int closing);

int cm_hpool_trim(cm_context *ctx);

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
extern cm_hostmem *cm_hm_live;

void cm_hm_link(cm_hostmem *m);

#define ST cm_st

int cm_hm_check(PyObject *o);

int cm_hm_traverse(PyObject *self, visitproc visit, void *arg);

int cm_hm_clear(PyObject *self);

void cm_hm_dealloc(PyObject *self);

/* A new owner with nothing allocated yet. */
cm_hostmem *
cm_hm_empty(cm_context *ctx, int kind, size_t size, unsigned int flags,
            PyObject *stream);

/* Fill m through the context's plugin manager. */
int cm_hm_alloc_plugin(cm_hostmem *m);

/* Fill m with cudamem's own allocation (pool, host or managed). */
int cm_hm_alloc_default(cm_hostmem *m);

/* A new owner of size bytes of kind in the current context.  Size 0
 * allocates nothing. */
cm_hostmem *
cm_hm_new(int kind, size_t size, unsigned int flags, PyObject *stream);

extern PyType_Spec cm_hm_spec;

/* Interned keyword names. */
enum {
    KW_SHAPE, KW_DTYPE, KW_STRIDES, KW_ORDER, KW_STREAM, KW_PORTABLE,
    KW_WC, KW_ATTACH_GLOBAL, KW_ARY, KW_DEVICE, KW_ADVICE, KW_N
};

extern const char *const cm_hm_kw_text[KW_N];

#define cm_hm_kw (cm_st->hm_kw)      /* a field of the module state */

/* A stream argument: NULL or None give 0; else it must resolve. */
PyObject *cm_hm_stream_arg(PyObject *o);

/* The HostAllocation in arr's base chain, or NULL (no exception). */
cm_hostmem *cm_hm_find(PyObject *arr);

/* The device address of host memory at addr (mapped or registered). */
int cm_host_devptr(cm_hostmem *m, uintptr_t addr, CUdeviceptr *d);

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

/* NOTE: the pieces, sorted and disjoint, and their byte total are
 * guarded by cm_reg_lock, which is taken only with the GIL released. */
extern cm_piece *cm_pieces;

extern size_t cm_reg_bytes;

extern PyThread_type_lock cm_reg_lock;

/* Drop h's pieces, newest first; unregister those left without users
 * (only when driver is set: a dead context took them already).  Lock
 * held, no GIL, the context current.  The first error. */
CUresult cm_reg_release_locked(cm_held *h, int driver);

/* Hold pieces covering [lo, hi), registering the gaps between existing
 * pieces.  Lock held, no GIL, the context current. */
CUresult cm_reg_acquire_locked(uintptr_t lo, uintptr_t hi, cm_held *h);

/* The byte range [lo, hi) an array occupies; 0 if it is empty. */
int cm_array_range(PyArrayObject *a, uintptr_t *lo, uintptr_t *hi);

extern PyType_Spec cm_reg_spec;

/* The module functions of hostmem.c, hostreg.c, managed.c and
 * hostclose.c, each file's own table, added by the room's init
 * (hostbuf.c); 0 or -1. */
int cm_hostmem_add_functions(PyObject *mod);
int cm_hostclose_add_functions(PyObject *mod);
int cm_hostreg_add_functions(PyObject *mod);
int cm_managed_add_functions(PyObject *mod);

#endif /* CM_HOSTMEM_H */
