/* SPDX-License-Identifier: MIT */
/*
 * context/context.h: the context layer as the layers above see it, and
 * what its files (device.c, context.c, ctxfuncs.c, callbacks.c,
 * stream.c, event.c, streamfuncs.c) share: the Stream and Event objects,
 * stream arguments and the driver-thread test.  The Device and Context
 * objects themselves are declared in cm.h.
 */
#ifndef CM_CONTEXT_LAYER_H
#define CM_CONTEXT_LAYER_H

#include "cm.h"
#include "driver/driver.h"

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
/* streamfuncs.c, callbacks.c: stream arguments, driver threads        */
/* ------------------------------------------------------------------ */

/* Whether h names a default stream (0, CU_STREAM_LEGACY or
 * CU_STREAM_PER_THREAD): always valid, never destroyed. */
static inline int
cm_stream_handle_is_default(CUstream h)
{
    uintptr_t v = (uintptr_t)h;

    return v == 0 || v == (uintptr_t)CU_STREAM_LEGACY
           || v == (uintptr_t)CU_STREAM_PER_THREAD;
}

/* Resolve a stream argument.  0, None and False give *handle = 0 and
 * return 0 (falsy: the caller then uses the array's bound stream, or a
 * synchronous call).  A cudamem Stream (one type check, no attribute
 * lookup), or any object with __cuda_stream__ (the cuda.core protocol),
 * gives its handle and returns 1 (truthy: asynchronous).  Anything else:
 * -1 with TypeError; a Stream of a closed context, or a handle that no
 * stream object can be at (cm_stream_handle_check): -1 with ValueError. */
int cm_stream_resolve(PyObject *obj, CUstream *handle);

/* Whether h, a stream handle that did not come from cudamem, may be
 * handed to the driver.  0, 1 and 2 name default streams; any other value
 * is the address of the driver's stream object, which the driver reads
 * without a check, so an unaligned address or one that cannot be read
 * would crash the process.  0, or -1 with ValueError naming what.  A
 * destroyed stream whose memory is still mapped cannot be told apart. */
int cm_stream_handle_check(uintptr_t h, const char *what);

/* Whether the calling thread is running a host callback for cudamem (the
 * driver's callback thread).  The driver forbids API calls there, so a
 * dealloc that would free a driver resource must defer it instead. */
int cm_on_driver_thread(void);

/* A new Stream object wrapping a handle cudamem does not own (external:
 * never destroyed by cudamem), as external_stream(h) returns, in the
 * current context.  New reference, or NULL with an exception. */
PyObject *cm_stream_external(CUstream handle);

/* ------------------------------------------------------------------ */
/* init functions of the context layer                                */
/* ------------------------------------------------------------------ */

int cm_context_init(PyObject *mod, cm_state *st);
/* Let Python code assign attributes on the public types (tests written
 * for numba patch their methods); called once every type is made.  0. */
int cm_types_patchable(cm_state *st);
int cm_stream_init(PyObject *mod, cm_state *st);

/* Capture-aware work (graph.c; docs/design.md, "Capture-aware
 * synchronous work").  Each is 0, or -1 with StreamCaptureError, raised
 * before any driver call; what names the refused call. */

/* Whether a capture cudamem began is in progress (an atomic load). */
int cm_capture_any(void);

/* The graph pool (memory/pool/graph/gpool.c's, opaque here) that allocations
 * for stream h go to while cudamem captures h, or NULL; for the default
 * stream, that of a capture the calling thread began.  Read without a
 * lock: call it only while cm_capture_any(). */
void *cm_capture_pool(CUstream h);

/* Whether the calling thread may not make a potentially unsafe call (a
 * query of an ordinary event or of a stream that does not capture, a
 * free, an allocation, a synchronisation) because of the captures
 * cudamem began: one in global mode on any thread, or one in global or
 * thread-local mode on this thread.  The driver would refuse the call
 * and invalidate those captures; cudamem's background work waits, or
 * goes another way, instead.  No driver call: a relaxed atomic load and
 * a thread-local one when nothing captures.  Any thread, with or
 * without the GIL. */
int cm_capture_restricted(void);

/* While the captures cudamem began forbid this thread the potentially
 * unsafe calls (cm_capture_restricted): its capture mode made relaxed
 * around a call the driver would otherwise refuse and that joins no
 * capture (a stream-ordered allocation or free on a stream that does not
 * capture, a cuMemAlloc).  *saved: the mode to give back, or -1 when
 * nothing was changed (no driver call then). */
/* Nonzero while this thread runs an adapter's call for another library
 * (CuPy's, PyTorch's allocations and frees through cudamem): that
 * library may capture on this thread without cudamem knowing, so its
 * allocations and frees are relaxed too (graph.c). */
extern _Thread_local int cm_capture_adapter_depth;

static inline void
cm_capture_relax(int *saved)
{
    CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;

    *saved = -1;
    if ((cm_capture_adapter_depth > 0 || cm_capture_restricted())
        && CM_CU_RAW(ThreadExchangeStreamCaptureMode, (&m))
               == CUDA_SUCCESS) {
        *saved = (int)m;
    }
}

static inline void
cm_capture_unrelax(int saved)
{
    CUstreamCaptureMode m = (CUstreamCaptureMode)saved;

    if (saved >= 0) {
        (void)CM_CU_RAW(ThreadExchangeStreamCaptureMode, (&m));
    }
}

/* Whether cudamem began a capture on stream h that is in progress: an
 * event recorded on h would be captured, and a query of h refused.  No
 * driver call.  Any thread. */
int cm_capture_stream_known(CUstream h);

/* Whether cudamem began a capture of ctx's stream h that is in progress
 * (ctx alive): the check of a stream that goes.  No driver call; GIL. */
int cm_capture_stream_of(const cm_context *ctx, CUstream h);

/* Stream h of ctx, a stream() of cudamem's, is being dropped and its
 * destroy was queued: if it captures, that capture is ended in the
 * driver (its graph discarded) and forgotten, and ctx's queues run
 * unless another capture forbids it.  1 if it captured, else 0.  GIL
 * held; never raises. */
int cm_capture_stream_gone(cm_context *ctx, CUstream h);

/* The context of gen is gone (closed or reset): so are its captures,
 * which cudamem forgets.  GIL held; never raises. */
void cm_capture_context_gone(unsigned long gen);

/* Context-wide synchronisations as tickets, so that work known finished
 * needs no query (a capture may forbid one): a synchronize of ctx takes
 * a ticket before cuCtxSynchronize (GIL held) and hands it in once that
 * succeeded.  Work queued on ctx before cm_ctx_sync_mark (read after the
 * queuing call returned) is done once cm_ctx_synced_since that mark. */
static inline unsigned long
cm_ctx_sync_begin(cm_context *ctx)
{
    return __atomic_add_fetch(&ctx->sync_begun, 1, __ATOMIC_RELAXED);
}

static inline void
cm_ctx_sync_end(cm_context *ctx, unsigned long ticket)
{
    if (ticket > __atomic_load_n(&ctx->sync_done, __ATOMIC_RELAXED)) {
        __atomic_store_n(&ctx->sync_done, ticket, __ATOMIC_RELEASE);
    }
}

static inline unsigned long
cm_ctx_sync_mark(const cm_context *ctx)
{
    return __atomic_load_n(&ctx->sync_begun, __ATOMIC_RELAXED);
}

static inline int
cm_ctx_synced_since(const cm_context *ctx, unsigned long mark)
{
    return __atomic_load_n(&ctx->sync_done, __ATOMIC_ACQUIRE) > mark;
}

/* Work on the legacy default stream that must happen now: refused while
 * a global-mode capture cudamem began is in progress.  No driver call. */
int cm_capture_refuse_sync(const char *what);

/* A context-wide synchronize: refused while any capture cudamem began
 * is in progress.  No driver call. */
int cm_capture_refuse_ctx(const char *what);

/* Work that must happen now on stream h (waits on it, or queues host
 * code that runs once): refused while h captures.  A default handle is
 * cm_capture_refuse_sync; a stream cudamem captures is known without a
 * driver call; for an external stream (external != 0) the driver is
 * asked (cuStreamIsCapturing), as another library may capture it. */
int cm_capture_refuse_stream(CUstream h, int external, const char *what);

/* A wait or query of a stream or event the driver counts as potentially
 * unsafe during a capture (cuStreamSynchronize, cuStreamQuery,
 * cuEventSynchronize, cuEventQuery): refused while a capture cudamem
 * began forbids this thread such calls (cm_capture_restricted), before
 * the driver would refuse it and invalidate that capture.  No driver
 * call. */
int cm_capture_refuse_unsafe(const char *what);

#endif /* CM_CONTEXT_LAYER_H */
