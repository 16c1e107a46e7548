/* SPDX-License-Identifier: MIT */
/*
 * driver/call.h: how a call reaches the driver, for every layer.  Private
 * to driver/: the other folders get it through driver/driver.h, which
 * includes it after the Python header.
 *
 * Every driver call goes through CM_CU_CALL_ (through CM_CU, CM_CU_RAW,
 * CM_CU_NOGIL...): refused in the child of a fork() and in a context
 * being destroyed, checked into CudaAPIError, and, when made with the GIL
 * released, counted so that close() and Device.reset() wait for it.  The
 * settings that decide when a short call keeps the GIL, and the GIL probe
 * of the benchmarks, are here too.  Their state is in driver/state.c and
 * driver/driver.c.
 *
 * Locks and the GIL: cm_mu_lock/cm_mu_unlock take and give back every
 * cudamem mutex, counted in cm_mu_depth.  The GIL is released around
 * driver calls by CM_DRIVER_BEGIN_NOGIL/END_NOGIL and CM_CU_NOGIL, by
 * cm_gil_drop/cm_gil_take, and by CM_GIL_YIELD (CM_CU, CM_CU_RAW) only
 * while Python host callbacks are in flight and the thread holds no
 * cudamem mutex (taking the GIL back while holding one could wait for a
 * thread that holds the GIL and waits for that mutex); CM_CU_RAW_HELD
 * never releases it.  What runs with the GIL released, a call's arguments
 * included, must not touch Python objects.
 */
#ifndef CM_DRIVER_CALL_H
#define CM_DRIVER_CALL_H

#include "driver/cu_table.h"

#include <pthread.h>
#include <stdint.h>

/* ------------------------------------------------------------------ */
/* driver.c: error checking                                           */
/* ------------------------------------------------------------------ */

/* Raise CudaAPIError (or its out-of-memory subclass) for rc from the
 * driver function fn ("cuMemAlloc").  Always returns -1. */
int cm_raise_cu(CUresult rc, const char *fn);

/* Raise cls(code, msg) (an exception class whose first two arguments
 * are a code and a message: OSError, CudaAPIError); msg is stolen (NULL:
 * its error stands).  -1. */
int cm_raise_code_msg(PyObject *cls, int code, PyObject *msg);

/* Raise CudaAPIError(rc, msg), numba's own signature, with a message of
 * cudamem's own; msg is stolen (NULL: its error stands).  -1. */
int cm_raise_api_msg(CUresult rc, PyObject *msg);

static inline int
cm_cu_check(CUresult rc, const char *fn)
{
    return rc == CUDA_SUCCESS ? 0 : cm_raise_cu(rc, fn);
}

/* ------------------------------------------------------------------ */
/* state.c, driver.c: calls counted, the GIL, cudamem mutexes         */
/* ------------------------------------------------------------------ */

/* Driver calls made with the GIL released and not yet back with it:
 * close() and Device.reset() wait, GIL released, until none that began
 * before the context was marked dead is left before they destroy it, so
 * that no call in flight uses a stream, event or memory of it meanwhile.
 * A call counts in cm_driver_calls[its epoch's parity] from before it
 * releases the GIL until after it has taken the GIL back, so what the
 * caller does with the result before its next release of the GIL
 * (linking a new owner, checking that its context is still alive) also
 * happens before the reset.  The closer moves cm_driver_epoch on (GIL
 * held) and waits for the old parity's count to drain, which calls begun
 * later do not hold up.  Changed with atomics. */
extern long cm_driver_calls[2];
extern unsigned long cm_driver_epoch;

/* The epoch in which the calling thread's outermost counted call began
 * (cm_call_depth > 0): a close waits for such calls, so they may still
 * use the context it marked dead (cm_ctx_dying_check). */
extern _Thread_local unsigned long cm_call_epoch;
extern _Thread_local int cm_call_depth;

static inline int
cm_driver_call_begin(void)
{
    unsigned long ep = __atomic_load_n(&cm_driver_epoch, __ATOMIC_SEQ_CST);
    int e = (int)(ep & 1);

    (void)__atomic_fetch_add(&cm_driver_calls[e], 1, __ATOMIC_SEQ_CST);
    if (cm_call_depth++ == 0) {
        cm_call_epoch = ep;
    }
    return e;
}

static inline void
cm_driver_call_end(int e)
{
    cm_call_depth--;
    (void)__atomic_fetch_sub(&cm_driver_calls[e], 1, __ATOMIC_SEQ_CST);
}

/* The setting _core._copy_keep_gil (see cm_copy_host): a CM_KEEP_GIL_*
 * mode, CM_KEEP_GIL_AUTO by default (the H200's thread rows,
 * docs/performance.md). */
enum { CM_KEEP_GIL_OFF, CM_KEEP_GIL_ON, CM_KEEP_GIL_AUTO };
extern int cm_copy_keep_gil;

/* Whether two or more driver calls of other threads are counted (made
 * with the GIL released, or waiting to take it back): then a release of
 * ours joins a queue of hand-overs that costs more than a short call
 * (with one other, the overlap is worth it).  GIL held. */
static inline int
cm_gil_contended(void)
{
    return cm_call_depth == 0
           && __atomic_load_n(&cm_driver_calls[0], __ATOMIC_RELAXED)
              + __atomic_load_n(&cm_driver_calls[1], __ATOMIC_RELAXED) >= 2;
}

/* Whether an enqueue that _core._copy_keep_gil covers keeps the GIL now
 * (CM_KEEP_GIL_AUTO: while cm_gil_contended).  One relaxed load when
 * off; GIL held. */
static inline int
cm_keep_gil_now(void)
{
    int mode = __atomic_load_n(&cm_copy_keep_gil, __ATOMIC_RELAXED);

    return mode == CM_KEEP_GIL_AUTO ? cm_gil_contended() : mode;
}

/* Whether 'auto' (not 'on') keeps the GIL now around the two calls it
 * alone covers: a host-to-device enqueue of at most CM_SHORT_HTOD_BYTES
 * from host memory cudamem cannot place (cm_copy_host), and a
 * Stream.synchronize of the stream of cm_done_hint, when a query, made
 * first, finds it done.  Both return at once where they apply; under
 * contention (cm_gil_contended) a release around them costs a place in
 * the queue for the GIL. */
static inline int
cm_keep_gil_auto_now(void)
{
    return __atomic_load_n(&cm_copy_keep_gil, __ATOMIC_RELAXED)
               == CM_KEEP_GIL_AUTO
           && cm_gil_contended();
}

/* The stream of this thread's last copy into host memory cudamem could
 * not place, which the driver returns from once the copy is done where
 * that memory is pageable: its synchronize likely finds nothing left.
 * A hint only (the query decides); NULL when none. */
extern _Thread_local CUstream cm_done_hint;

/* The driver returns from a host-to-device enqueue from pageable memory
 * of up to this many bytes once it has copied the source into its
 * staging memory (no wait for the stream). */
#define CM_SHORT_HTOD_BYTES 65536

/* The GIL probe (_core._gil_probe, for the benchmarks): while it is on,
 * every counted release of the GIL records how long the thread ran with
 * it released and how long it then waited to take it back, per kind
 * (CM_PROBE_NOGIL: CM_DRIVER_BEGIN/END_NOGIL; CM_PROBE_DROP:
 * cm_gil_drop/cm_gil_take).  Off, it costs one relaxed load per release.
 * cm_gil_probe_note runs with the GIL held (taken back), which guards the
 * counts. */
enum { CM_PROBE_NOGIL, CM_PROBE_DROP, CM_PROBE_KINDS };
extern int cm_gil_probe_on;
/* How a synchronous copy between pageable host memory and device memory
 * is made, per direction (CM_SYNC_HTOD, CM_SYNC_DTOH; set by the test aid
 * _core._sync_copy_call, see cm_copy_host).  CM_SYNC_CALL: the
 * synchronous call; CM_SYNC_ASYNC: the ...Async call on the default
 * stream (legacy, or per-thread when cudamem runs so); CM_SYNC_ASYNC_WAIT:
 * the same, and a copy into host memory then waits for that stream.  The
 * defaults, host to device CM_SYNC_ASYNC and device to host CM_SYNC_CALL,
 * come from the H200's rows (docs/design.md). */
enum { CM_SYNC_CALL, CM_SYNC_ASYNC, CM_SYNC_ASYNC_WAIT };
enum { CM_SYNC_HTOD, CM_SYNC_DTOH };
extern int cm_sync_copy_call[2];
/* The largest such copy (bytes) the ...Async modes apply to; a larger
 * one gets the synchronous call.  SIZE_MAX: no limit (the default).  Set
 * by the test aid _core._sync_async_max and CUDAMEM_SYNC_ASYNC_MAX, for
 * an A/B of the sizes where the asynchronous call gains. */
extern size_t cm_sync_async_max;
uint64_t cm_gil_probe_clock(void);
void cm_gil_probe_note(int kind, uint64_t t0, uint64_t t1);

/* Nanoseconds now while the probe is on, else 0 (nothing to note). */
static inline uint64_t
cm_gil_probe_now(void)
{
    return __atomic_load_n(&cm_gil_probe_on, __ATOMIC_RELAXED)
               ? cm_gil_probe_clock()
               : 0;
}

/* Py_BEGIN/END_ALLOW_THREADS around driver calls, counted as above. */
#define CM_DRIVER_BEGIN_NOGIL                                          \
    {                                                                  \
        int cm_epoch_ = cm_driver_call_begin();                        \
        uint64_t cm_probe0_ = cm_gil_probe_now();                      \
        uint64_t cm_probe1_;                                           \
        Py_BEGIN_ALLOW_THREADS
#define CM_DRIVER_END_NOGIL                                            \
        cm_probe1_ = cm_probe0_ ? cm_gil_probe_clock() : 0;            \
        Py_END_ALLOW_THREADS                                           \
        if (cm_probe0_) {                                              \
            cm_gil_probe_note(CM_PROBE_NOGIL, cm_probe0_, cm_probe1_); \
        }                                                              \
        cm_driver_call_end(cm_epoch_);                                 \
    }

/* The same with the GIL released around the call; err gets 0 or -1. */
#define CM_CU_NOGIL(err, fn, args)                                     \
    do {                                                               \
        CUresult cm_rc_;                                               \
        CM_DRIVER_BEGIN_NOGIL                                          \
        cm_rc_ = CM_CU_CALL_(fn, args);                                \
        CM_DRIVER_END_NOGIL                                            \
        (err) = cm_cu_check(cm_rc_, "cu" #fn);                         \
    } while (0)

/* Python host callbacks (Stream.add_callback) enqueued and not yet
 * returned, in every context (atomic).  The driver runs a host callback
 * on a thread of its own that holds the driver's lock, and the callback
 * waits there for the GIL; a thread that holds the GIL and enters the
 * driver meanwhile waits for that lock: neither moves again.  So while
 * any is in flight, CM_CU and CM_CU_RAW release the GIL around the call
 * when the calling thread holds it (counted as in CM_DRIVER_BEGIN_NOGIL)
 * and holds no cudamem mutex (cm_mu_depth: taking the GIL back while
 * holding one would wait for a thread that holds the GIL and waits for
 * the mutex).  With none in flight, the cost is one atomic load.  The
 * arguments of such a call are evaluated with the GIL released: they
 * must not touch Python objects. */
extern long cm_pycb_live;
extern _Thread_local int cm_mu_depth;

/* The GIL released as one counted driver call: what cm_gil_drop saved,
 * for cm_gil_take (ts is NULL when nothing was dropped). */
typedef struct {
    PyThreadState *ts;
    int epoch;
    uint64_t probe;       /* cm_gil_probe_now() at the drop */
} cm_gil_saved;

/* The save of the call in flight on this thread (CM_GIL_YIELD). */
extern _Thread_local cm_gil_saved cm_yield_saved;

static inline void
cm_gil_drop(cm_gil_saved *s)
{
    s->epoch = cm_driver_call_begin();
    s->probe = cm_gil_probe_now();
    s->ts = PyEval_SaveThread();
}

static inline void
cm_gil_take(cm_gil_saved *s)
{
    if (s->ts != NULL) {
        uint64_t t1 = s->probe ? cm_gil_probe_clock() : 0;

        PyEval_RestoreThread(s->ts);
        if (s->probe) {
            cm_gil_probe_note(CM_PROBE_DROP, s->probe, t1);
        }
        cm_driver_call_end(s->epoch);
        s->ts = NULL;
    }
}

static inline int
cm_gil_yield_needed(void)
{
    return __atomic_load_n(&cm_pycb_live, __ATOMIC_ACQUIRE) > 0
           && cm_mu_depth == 0 && PyGILState_Check();
}

static inline int
cm_gil_yield_begin(void)
{
    cm_gil_drop(&cm_yield_saved);
    return 0;
}

static inline CUresult
cm_gil_yield_end(CUresult rc)
{
    cm_gil_take(&cm_yield_saved);
    return rc;
}

/* A cudamem mutex: taken and given back through these, so that
 * cm_mu_depth says whether the thread holds one. */
static inline void
cm_mu_lock(pthread_mutex_t *m)
{
    pthread_mutex_lock(m);
    cm_mu_depth++;
}

static inline void
cm_mu_unlock(pthread_mutex_t *m)
{
    cm_mu_depth--;
    pthread_mutex_unlock(m);
}

/* Set in the child of a fork() after the driver was initialised. */
extern volatile int cm_forked;

/* Every driver call goes through here.  In the child of a fork() after
 * the driver was initialised none reaches the driver: the parent's
 * handles mean nothing there, and a lock of the driver's that another
 * parent thread held at the fork would never be given back.  The call
 * answers CUDA_ERROR_NOT_INITIALIZED, which cm_raise_cu turns into
 * numba's "CUDA initialized before forking". */
#define CM_CU_CALL_(fn, args)                                          \
    (cm_forked ? CUDA_ERROR_NOT_INITIALIZED                            \
     : !CM_CU_FREE_OF_CTX(fn) && cm_ctx_dying_refused()                \
         ? CUDA_ERROR_CONTEXT_IS_DESTROYED                             \
     : cm_cu.fn ? cm_cu.fn args : cm_cu_missing)

/* The entry points that use no handle of a context (devices, the
 * thread's context stack, primary-context bookkeeping, pointer queries,
 * error names): CM_CU_FREE_OF_CTX(fn) is 1 for them, 0 for the others,
 * at compile time. */
#define CM_FREE_OF_CTX_GetErrorName ~, 1
#define CM_FREE_OF_CTX_GetErrorString ~, 1
#define CM_FREE_OF_CTX_Init ~, 1
#define CM_FREE_OF_CTX_DriverGetVersion ~, 1
#define CM_FREE_OF_CTX_DeviceGet ~, 1
#define CM_FREE_OF_CTX_DeviceGetCount ~, 1
#define CM_FREE_OF_CTX_DeviceGetName ~, 1
#define CM_FREE_OF_CTX_DeviceGetAttribute ~, 1
#define CM_FREE_OF_CTX_DeviceTotalMem ~, 1
#define CM_FREE_OF_CTX_DeviceGetUuid ~, 1
#define CM_FREE_OF_CTX_DeviceGetPCIBusId ~, 1
#define CM_FREE_OF_CTX_DeviceCanAccessPeer ~, 1
#define CM_FREE_OF_CTX_DevicePrimaryCtxRetain ~, 1
#define CM_FREE_OF_CTX_DevicePrimaryCtxRelease ~, 1
#define CM_FREE_OF_CTX_DevicePrimaryCtxReset ~, 1
#define CM_FREE_OF_CTX_DevicePrimaryCtxGetState ~, 1
#define CM_FREE_OF_CTX_CtxGetCurrent ~, 1
#define CM_FREE_OF_CTX_CtxSetCurrent ~, 1
#define CM_FREE_OF_CTX_CtxPushCurrent ~, 1
#define CM_FREE_OF_CTX_CtxPopCurrent ~, 1
#define CM_FREE_OF_CTX_CtxGetDevice ~, 1
#define CM_FREE_OF_CTX_PointerGetAttribute ~, 1
#define CM_FREE_OF_CTX_PointerGetAttributes ~, 1
#define CM_FREE_OF_CTX_ProfilerStart ~, 1
#define CM_FREE_OF_CTX_ProfilerStop ~, 1
#define CM_SECOND_(a, b, ...) b
#define CM_PROBE_(...) CM_SECOND_(__VA_ARGS__, 0, ~)
#define CM_CU_FREE_OF_CTX(fn) CM_PROBE_(CM_FREE_OF_CTX_##fn)

/* A context that a close() or reset marked dead and has not yet
 * destroyed: counted calls begun before the mark are waited for (the
 * counts above) and go on; any other call must not reach the driver
 * with the context current, whatever the caller checked before it last
 * let go of the GIL: it answers CUDA_ERROR_CONTEXT_IS_DESTROYED.
 * cm_ctx_dying_n counts such contexts (atomic); set (before the epoch
 * moves on) and cleared with the GIL held by the thread that closes,
 * whose own calls go on.  Driver.c. */
extern int cm_ctx_dying_n;
void cm_ctx_dying_set(int device, CUcontext handle);
void cm_ctx_dying_clear(int device);
/* 1 if the calling thread's current context is dying and the thread is
 * not the one destroying it.  Reads no Python state (any thread). */
int cm_ctx_dying_check(void);

static inline int
cm_ctx_dying_refused(void)
{
    return __atomic_load_n(&cm_ctx_dying_n, __ATOMIC_SEQ_CST) != 0
           && cm_ctx_dying_check();
}

/* call, a CUresult expression that enters the driver, with the GIL
 * released around it while Python callbacks are in flight. */
#define CM_GIL_YIELD(call)                                             \
    (cm_gil_yield_needed()                                             \
     ? (cm_gil_yield_begin(), cm_gil_yield_end(call))                  \
     : (call))

/* The raw call, for code that handles the CUresult itself. */
#define CM_CU_RAW(fn, args) CM_GIL_YIELD(CM_CU_CALL_(fn, args))

/* The raw call with the GIL kept whatever is in flight, for code that
 * holds pointers into state the GIL guards across the call; such code
 * makes no driver call while cm_gil_yield_needed() (see its users). */
#define CM_CU_RAW_HELD(fn, args) CM_CU_CALL_(fn, args)

/* Call cu<fn>(args...) and check it; 0 or -1 with an exception set.
 * A missing entry point stays NULL and fails here, not at import. */
#define CM_CU(fn, args) cm_cu_check(CM_CU_RAW(fn, args), "cu" #fn)

#endif /* CM_DRIVER_CALL_H */
