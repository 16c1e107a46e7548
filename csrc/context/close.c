/* SPDX-License-Identifier: MIT */
/*
 * context/close.c: closing a device's primary context
 * (cm_context_release_device: close() on the main thread,
 * Device.reset()).  It sits above the streams' cache and the record of
 * captures, which the closing context takes with it.
 *
 * Closing a device against other threads: the device is marked
 * resetting, its Context dead (from then on every object of it raises
 * ValueError before any driver call), and the closer waits, GIL
 * released, until no driver call made with the GIL released that began
 * before is in flight (cm_driver_calls), so that none is still using a
 * stream, event or allocation of the context when the driver destroys
 * them.  Until the reset is over, a thread that needs the device's
 * context waits (GIL released, cm_context_wait_reset) instead of
 * retaining the primary context being reset, which would give it a
 * context destroyed under it.
 *
 * Locks and the GIL: no lock.  The registry (cm_ctxs, cm_resetting,
 * cm_resetter) is guarded by the GIL, and the device is marked resetting
 * and its entry cleared before anything here lets go of it.  The GIL is
 * released while another thread's reset is waited for
 * (cm_context_wait_reset), while the calls in flight drain
 * (cm_context_quiesce), around the destroys of the kept streams, and
 * around cuDevicePrimaryCtxRelease / cuDevicePrimaryCtxReset, where
 * nothing Python is touched (the closing Context is kept by the
 * reference taken from the registry); it stays held across those two
 * while host arrays' pages are saved away, so that no Python thread
 * touches them.  What the layers above do through cm_ctx_up (the
 * flush, the manager's destroy, the IPC and interop closings) keeps its
 * own locking.
 */
#include "context/devctx.h"

/* Forget device i's context: release and reset its primary context.
 * Another thread's reset of the device in progress is waited for. */
int
cm_context_release_device(int i)
{
    cm_context *c;
    CUdevice h;
    int err = 0;

    if (cm_on_driver_thread()) {
        /* Calls in flight may be waiting for this very callback. */
        PyErr_SetString(PyExc_RuntimeError,
                        "a device cannot be closed or reset from a stream "
                        "callback: the driver forbids CUDA calls there");
        return -1;
    }
    if (cm_resetting[i]) {
        /* Another thread's reset is waited for; this thread's own, in
         * progress further up the stack, is left to finish. */
        if (cm_context_wait_reset(i) < 0) {
            PyErr_Clear();
        }
        return 0;
    }
    if (cm_ctxs[i] == NULL) {
        return 0;
    }
    c = cm_ctxs[i];
    cm_resetting[i] = 1;
    cm_resetter[i] = PyThread_get_thread_ident();
    /* Work of other devices that may read or write its memory (peer
     * copies, their kernels) ends before any of that memory goes, and
     * none is queued from now on (cm_context_enable_peer refuses). */
    c->closing = 1;
    cm_context_sync_peers(c);
    /* What is queued, and what its pool holds, is given back before the
     * context goes. */
    if (cm_ctx_up.ctx_flush(c) < 0) {
        PyErr_WriteUnraisable((PyObject *)c);
    }
    cm_ctx_up.ipc_context_closing(c);
    cm_ctx_up.interop_context_closing(c);
    cm_ctx_up.graph_pools_closing(c);
    if (c->mm_builtin->destroy != NULL) {
        c->mm_builtin->destroy(c);
    }
    cm_ctxs[i] = NULL;
    /* From here no other thread's driver call runs with it current. */
    cm_ctx_dying_set(i, c->handle);
    c->alive = 0;
    /* Calls other threads began on its objects end before it goes. */
    cm_context_quiesce();
    if (c->mm_builtin->dead != NULL) {
        /* No other thread can queue work on the manager's memory now:
         * it goes once the work queued, other devices' too, is done. */
        cm_context_sync_peers(c);
        c->mm_builtin->dead(c);
    }
    /* Dead, c keeps no more streams; those it kept go while its primary
     * context is still retained. */
    cm_stream_cache_clear(c);
    h = c->device->handle;
    if (cm_ctx_up.hostmem_context_save(c)) {
        /* Host arrays' pages are gone until the restore: the GIL stays
         * held so that no Python thread touches them meanwhile (not
         * released even while callbacks are in flight: the save let this
         * context's finish first). */
        (void)CM_CU_CALL_(DevicePrimaryCtxRelease, (h));
        err = cm_cu_check(CM_CU_CALL_(DevicePrimaryCtxReset, (h)),
                          "cuDevicePrimaryCtxReset");
    }
    else {
        Py_BEGIN_ALLOW_THREADS
        (void)CM_CU_CALL_(DevicePrimaryCtxRelease, (h));
        Py_END_ALLOW_THREADS
        CM_CU_NOGIL(err, DevicePrimaryCtxReset, (h));
    }
    cm_ctx_up.hostmem_context_restore(c);
    cm_ctx_dying_clear(i);
    cm_resetting[i] = 0;
    /* Its captures went with it. */
    cm_capture_context_gone(c->gen);
    Py_DECREF(c);
    return err;
}
