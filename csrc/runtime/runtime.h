/* SPDX-License-Identifier: MIT */
/*
 * runtime/runtime.h: the runtime layer as module.c sees it, and what its
 * files (context.c, stream.c, ipc.c, kernel.c) share: the Stream and
 * Event objects and the closing of a context.  The context itself, and
 * what the lower layers call here, are declared in cm.h.
 */
#ifndef CM_RUNTIME_H
#define CM_RUNTIME_H

#include "cm.h"
#include "driver/driver.h"
#include "memory/memory.h"
#include "array/array.h"

/* ------------------------------------------------------------------ */
/* stream.c: streams, events and stream arguments                      */
/* ------------------------------------------------------------------ */

/* What a Stream object stands for; decides its repr, whether cudamem
 * destroys it, and what a CUDA Array Interface export names. */
typedef enum {
    CM_STREAM_USER = 0,       /* made by stream(); destroyed by cudamem */
    CM_STREAM_DEFAULT,        /* default_stream(): handle 0 */
    CM_STREAM_LEGACY,         /* legacy_default_stream(): handle 1 */
    CM_STREAM_PER_THREAD,     /* per_thread_default_stream(): handle 2 */
    CM_STREAM_EXTERNAL        /* external_stream(h): never destroyed */
} cm_stream_kind;

/* A Stream object (Python type cudamem.Stream, final: an exact type check
 * with cm_stream_check is enough).  Device-array code reads handle
 * directly. */
typedef struct {
    PyObject_HEAD
    CUstream handle;      /* driver handle; 0, 1, 2 for the defaults */
    cm_context *ctx;      /* strong: made current around driver calls */
    cm_stream_kind kind;  /* what the handle means */
    unsigned int flags;   /* CM_STREAM_USER: the CU_STREAM_* it was made
                           * with (the key of its reuse), else 0 */
    int priority;         /* CM_STREAM_USER: its priority, else 0 */
    PyObject *owner;      /* strong or NULL: keeps an external stream's
                           * producer alive */
    PyObject *weakreflist;
} cm_stream;

#define cm_stream_check(op) Py_IS_TYPE((op), cm_st->Stream_type)

/* An Event object (Python type cudamem.Event, final). */
typedef struct {
    PyObject_HEAD
    CUevent handle;       /* driver handle, NULL until created */
    cm_context *ctx;      /* strong: made current around driver calls */
    int timing;           /* created without CU_EVENT_DISABLE_TIMING */
    PyObject *weakreflist;
} cm_event;

#define cm_event_check(op) Py_IS_TYPE((op), cm_st->Event_type)

/* The stream handle a CUDA Array Interface export names for s: the
 * default stream (handle 0) is spelled 1 (legacy) or 2 (per-thread),
 * matching the default-stream mode, since the interface forbids 0
 * (docs/api.md#default-streams). */
static inline uintptr_t
cm_stream_cai_handle(const cm_stream *s)
{
    if (s->handle == NULL) {
        return cm_driver_per_thread() ? (uintptr_t)CU_STREAM_PER_THREAD
                                      : (uintptr_t)CU_STREAM_LEGACY;
    }
    return (uintptr_t)s->handle;
}

/* Destroy the idle streams ctx keeps for reuse: ctx is being closed or
 * reset, or the interpreter exits.  ctx's primary context must still be
 * retained (ctx may already be marked dead).  GIL held, released around
 * the destroys; never raises (a failure is reported as unraisable). */
void cm_stream_cache_clear(cm_context *ctx);
/* The same as cm_stream_external, keeping owner (may be NULL) alive as
 * long as the Stream. */
PyObject *cm_stream_external_owned(CUstream handle, PyObject *owner);

/* ------------------------------------------------------------------ */
/* ipc.c                                                              */
/* ------------------------------------------------------------------ */

/* ctx is being closed (still alive, GIL held): free what it still
 * imports from other processes' pools and destroy those pools.  Never
 * raises. */
void cm_ipc_context_closing(cm_context *ctx);
/* DeviceNDArray.get_ipc_handle (METH_NOARGS): an IpcArrayHandle, made in
 * C for the built-in managers' memory, else by the memory manager's
 * get_ipc_handle through cudamem._ipc._export_array. */
PyObject *cm_ipc_get_handle(PyObject *self, PyObject *unused);
/* 1 if o is an IpcMemory (what IpcHandle.open gives) that was closed,
 * else 0.  Never raises. */
int cm_ipc_mem_closed(PyObject *o);

/* ------------------------------------------------------------------ */
/* init functions of the runtime layer                                */
/* ------------------------------------------------------------------ */

int cm_context_init(PyObject *mod, cm_state *st);
/* Let Python code assign attributes on the public types (tests written
 * for numba patch their methods); called once every type is made.  0. */
int cm_types_patchable(cm_state *st);
int cm_stream_init(PyObject *mod, cm_state *st);
int cm_ipc_init(PyObject *mod, cm_state *st);
int cm_kernel_init(PyObject *mod, cm_state *st);

#endif /* CM_RUNTIME_H */
