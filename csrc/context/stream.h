/* SPDX-License-Identifier: MIT */
/*
 * context/stream.h: what the files of streams and events share (argparse.c,
 * graph.c, callbacks.c, stream.c, event.c, rawfuncs.c, streamfuncs.c, lowest
 * first: the sections of one concept, kept in files of their own).  Private
 * to them: the rest of the folder and the layers above use context/context.h.
 */
#ifndef CM_STREAM_H
#define CM_STREAM_H

#include "context/context.h"

/* interned strings and types, fields of the module state
 * (driver/driver.h) */
#define cm_str_cuda_stream (cm_st->str_cuda_stream)
#define cm_str_stream (cm_st->str_stream)
#define cm_str_callback (cm_st->str_callback)
#define cm_str_arg (cm_st->str_arg)
#define cm_str_timing (cm_st->str_timing)
#define cm_str_ptr (cm_st->str_ptr)
#define cm_str_evtstart (cm_st->str_evtstart)
#define cm_str_evtend (cm_st->str_evtend)
#define cm_str_done (cm_st->str_done)
#define cm_str_set_result (cm_st->str_set_result)
#define cm_str_set_exception (cm_st->str_set_exception)
#define cm_str_create_future (cm_st->str_create_future)
#define cm_str_await (cm_st->str_await)
#define cm_str_drain (cm_st->str_drain)
#define cm_autosync_type (cm_st->autosync_type)
#define cm_notifier_type (cm_st->notifier_type)

/* ------------------------------------------------------------------ */
/* Argument binding (argparse.c)                                       */
/* ------------------------------------------------------------------ */

/* Bind METH_FASTCALL | METH_KEYWORDS arguments to names (interned).
 * out[i] receives a borrowed reference, or keeps what the caller preset
 * (a default, or NULL for a required argument).  The first nrequired names
 * are required.  0, or -1 with TypeError. */
int cm_bind_args(const char *fname, PyObject *const *args, Py_ssize_t nargs,
                 PyObject *kwnames, PyObject *const *names, Py_ssize_t nnames,
                 Py_ssize_t nrequired, PyObject **out);

/* ------------------------------------------------------------------ */
/* Deferred releases and the cache of idle streams (callbacks.c)       */
/* ------------------------------------------------------------------ */

/* Release a stream or event handle of ctx through the context's queue of
 * pending destroys (docs/api.md#deferred-deallocation): it is destroyed
 * when the queue flushes, never on a driver callback thread, where the
 * driver forbids API calls.  A dead context or a forked child frees
 * nothing.  GIL held; never fails. */
int cm_handle_release(cm_context *ctx, int is_event, void *handle);

/* Keep the handle of s (a stream cudamem made, being deallocated) on its
 * context's list if it is idle and there is room: 1 if kept, 0 if the
 * caller must release it.  Not on a driver callback thread (the driver
 * forbids the query there), in a dead context, a forked child or once
 * the exit hook ran.  GIL held; never blocks, never raises. */
int cm_stream_cache_put(cm_stream *s);

/* Take the newest kept stream of ctx made with flags and priority, or
 * NULL if none.  GIL held. */
CUstream
cm_stream_cache_take(cm_context *ctx, unsigned int flags, int priority);

PyObject *cm_set_stream_cache_size(PyObject *mod, PyObject *arg);

PyObject *cm_stream_cache_fn(PyObject *mod, PyObject *arg);

PyObject *cm_callbacks_atexit(PyObject *mod, PyObject *unused);

/* ------------------------------------------------------------------ */
/* Host calls: C records run by the driver after a stream's work       */
/* ------------------------------------------------------------------ */

/* The head of every record handed to the driver: what to run, with the
 * stream's status (CUDA_SUCCESS, or the error that stopped the stream). */
typedef struct cm_hostcall cm_hostcall;

struct cm_hostcall {
    void (*run)(cm_hostcall *hc, CUresult status);
};

/* Enqueue hc on stream h: cuStreamAddCallback (which reports the stream's
 * status), else cuLaunchHostFunc.  Runs without the GIL; on success the
 * driver owns hc until it has run.  *fn names the entry point used. */
CUresult cm_hostcall_enqueue(CUstream h, cm_hostcall *hc, const char **fn);

/* ------------------------------------------------------------------ */
/* add_callback: Python callables on the driver thread                 */
/* ------------------------------------------------------------------ */

/* A Python callback in flight; holds its references until it has run. */
typedef struct {
    cm_hostcall hc;
    PyObject *stream;     /* strong */
    PyObject *callback;   /* strong */
    PyObject *arg;        /* strong */
} cm_pycall;

/* Drop a record's references and free it.  GIL held. */
void cm_pycall_free(cm_pycall *pc);

/* On the driver thread, without the GIL. */
void cm_pycall_run(cm_hostcall *hc, CUresult status);

extern PyType_Spec cm_notifier_spec;

/* The running asyncio loop of this thread.  New reference, or NULL with
 * RuntimeError when none runs. */
PyObject *cm_running_loop(void);

/* A future of the running loop that resolves to result once the work
 * queued so far on stream h (of ctx) is done, or, with wait_event, once
 * that event has completed.  The driver thread never takes the GIL for
 * it.  New reference, or NULL with an exception. */
PyObject *cm_future_after(PyObject *loop, cm_context *ctx, CUstream h,
                          CUevent wait_event, PyObject *result);

/* ------------------------------------------------------------------ */
/* Stream                                                              */
/* ------------------------------------------------------------------ */

/* A new Stream object for handle h of ctx.  New reference, or NULL. */
PyObject *cm_stream_new(cm_context *ctx, CUstream h, cm_stream_kind kind,
                        PyObject *owner);

/* Refuse a call that waits on the device from inside a host callback:
 * the driver forbids it and the stream could never finish. */
int cm_check_not_in_callback(const char *what);

extern PyType_Spec cm_stream_spec;

extern PyType_Spec cm_autosync_spec;

/* Milliseconds between two events; NULL with CudaAPIError (named by the
 * driver: CUDA_ERROR_INVALID_HANDLE for a non-timing event,
 * CUDA_ERROR_NOT_READY for one not complete) or TypeError. */
PyObject *cm_elapsed(PyObject *start, PyObject *end);

extern PyType_Spec cm_event_spec;

/* ------------------------------------------------------------------ */
/* Capture and graphs (graph.c)                                        */
/* ------------------------------------------------------------------ */

PyObject *cm_stream_begin_capture(PyObject *self, PyObject *const *args,
                                  Py_ssize_t nargs, PyObject *kwnames);

PyObject *cm_stream_end_capture(PyObject *self, PyObject *unused);

PyObject *cm_stream_is_capturing(PyObject *self, PyObject *unused);

PyObject *cm_graph_launch(PyObject *mod, PyObject *const *args,
                          Py_ssize_t nargs);

PyObject *cm_graph_destroy(PyObject *mod, PyObject *const *args,
                           Py_ssize_t nargs);

PyObject *cm_graph_settle(PyObject *mod, PyObject *const *args,
                          Py_ssize_t nargs);

PyObject *cm_capture_counts(PyObject *mod, PyObject *unused);

/* Docstrings of functions whose tables live in another file. */
extern const char cm_set_stream_cache_size_doc[];
extern const char cm_stream_cache_doc[];
extern const char cm_callbacks_atexit_doc[];

/* The test helpers' module functions (rawfuncs.c); 0 or -1. */
int cm_rawfuncs_init(PyObject *mod);

#endif /* CM_STREAM_H */
