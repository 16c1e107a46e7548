/* SPDX-License-Identifier: MIT */
/*
 * context/ctxfuncs.c: the module-level functions of devices and contexts
 * (select_device, get_current_device, close, ...) and their init.
 *
 * Locks and the GIL: one lock, the pthread mutex of a _synchronize_all
 * waiter (cm_syncall.lock, through cm_mu_lock), which guards its done
 * flag and reference count; its helper thread, which has no GIL and
 * touches no Python object, takes it after its synchronisations, and the
 * caller waits on its condition with the GIL released.  No other lock
 * nests in it and no driver or Python call is made under it.  The GIL
 * is also released around cuCtxSynchronize in synchronize() (the context
 * held by a reference), cuMemcpyPeer in _memcpy_peer (CM_CU_NOGIL), and
 * around any driver call while Python callbacks are in flight (CM_CU);
 * close() releases and resets contexts through close.c.
 */
#include "context/devctx.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------ */
/* Module-level functions                                              */
/* ------------------------------------------------------------------ */

PyDoc_STRVAR(cm_device_count_doc,
"_device_count()\n--\n\nThe number of devices the backend reports.");

static PyObject *
cm_device_count_fn(PyObject *mod, PyObject *unused)
{
    int n;

    (void)mod;
    (void)unused;
    n = cm_device_count();
    return n < 0 ? NULL : PyLong_FromLong(n);
}

PyDoc_STRVAR(cm_get_device_doc,
"_get_device(device_id)\n--\n\nThe Device of that ordinal.");

static PyObject *
cm_get_device_fn(PyObject *mod, PyObject *arg)
{
    int i;

    (void)mod;
    if (cm_driver_ensure() < 0 || (i = cm_device_arg(arg)) < 0) {
        return NULL;
    }
    return Py_XNewRef((PyObject *)cm_device_get(i));
}

PyDoc_STRVAR(cm_current_context_doc,
"current_context(devnum=None)\n--\n\n"
"The current primary context of the calling thread.  With no context "
"current, device 0's primary context is made current (pushed) first.  "
"With devnum, that device's primary context is pushed and returned.  "
"A plugin memory manager assigned to Context.memory_manager is "
"initialised first (its initialize(), once), as numba prepares a "
"context.");

static PyObject *
cm_current_context_fn(PyObject *mod, PyObject *const *args,
                      Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *devnum = Py_None;
    cm_context *c;
    int i;

    (void)mod;
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0) {
        if (nargs + PyTuple_GET_SIZE(kwnames) != 1
            || !PyUnicode_Check(PyTuple_GET_ITEM(kwnames, 0))
            || PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0),
                                                "devnum") != 0) {
            PyErr_SetString(PyExc_TypeError,
                            "current_context() takes one optional argument, "
                            "devnum");
            return NULL;
        }
        devnum = args[0];
    }
    else if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError,
                        "current_context() takes at most 1 argument");
        return NULL;
    }
    else if (nargs == 1) {
        devnum = args[0];
    }
    if (devnum == Py_None) {
        c = cm_context_current();
        if (c == NULL) {
            return NULL;
        }
        Py_INCREF(c);
    }
    else {
        if (cm_driver_ensure() < 0 || (i = cm_device_arg(devnum)) < 0
            || (c = cm_context_get(i)) == NULL) {
            return NULL;
        }
        /* Held across the push, which may let go of the GIL: a reset on
         * another thread may drop the registry's reference meanwhile. */
        Py_INCREF(c);
        if (CM_CU(CtxPushCurrent, (c->handle)) < 0) {
            Py_DECREF(c);
            return NULL;
        }
    }
    /* The context is prepared for use, as numba's get_context does. */
    if (cm_ctx_up.mm_prepare(c) < 0) {
        Py_DECREF(c);
        return NULL;
    }
    return (PyObject *)c;
}

PyDoc_STRVAR(cm_select_device_doc,
"select_device(device_id)\n--\n\n"
"Push device device_id's primary context on the calling thread's stack "
"and return the Device.  Repeated calls grow the stack; close() pops it.");

static PyObject *
cm_select_device_fn(PyObject *mod, PyObject *arg)
{
    cm_context *c;
    int i;

    (void)mod;
    if (cm_driver_ensure() < 0 || (i = cm_device_arg(arg)) < 0
        || (c = cm_context_get(i)) == NULL
        || CM_CU(CtxPushCurrent, (c->handle)) < 0) {
        return NULL;
    }
    return Py_NewRef(c->device);
}

PyDoc_STRVAR(cm_push_device_doc,
"_push_device(device_id)\n--\n\n"
"Push that device's primary context; used by gpus[i].__enter__.");

static PyObject *
cm_push_device_fn(PyObject *mod, PyObject *arg)
{
    PyObject *d = cm_select_device_fn(mod, arg);

    if (d == NULL) {
        return NULL;
    }
    Py_DECREF(d);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cm_pop_device_doc,
"_pop_device(device_id)\n--\n\n"
"Pop the current context, which must be that device's primary context; "
"used by gpus[i].__exit__.");

static PyObject *
cm_pop_device_fn(PyObject *mod, PyObject *arg)
{
    CUcontext cur = NULL;
    CUcontext popped = NULL;
    int i;

    (void)mod;
    if (cm_driver_ensure() < 0 || (i = cm_device_arg(arg)) < 0
        || CM_CU(CtxGetCurrent, (&cur)) < 0) {
        return NULL;
    }
    if (cur != NULL && cm_ctxs[i] != NULL && cur != cm_ctxs[i]->handle) {
        PyErr_Format(PyExc_RuntimeError,
                     "the current context is not device %d's: contexts "
                     "were pushed and popped out of order", i);
        return NULL;
    }
    if (cur != NULL && CM_CU(CtxPopCurrent, (&popped)) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cm_get_current_device_doc,
"get_current_device()\n--\n\n"
"The Device of the current context (device 0's made current if none).");

static PyObject *
cm_get_current_device_fn(PyObject *mod, PyObject *unused)
{
    cm_context *c;

    (void)mod;
    (void)unused;
    c = cm_context_current();
    return c == NULL ? NULL : Py_NewRef(c->device);
}

PyDoc_STRVAR(cm_synchronize_doc,
"synchronize()\n--\n\n"
"Wait, with the GIL released, until all work in the current context is "
"done.");

static PyObject *
cm_synchronize_fn(PyObject *mod, PyObject *unused)
{
    cm_context *c;
    unsigned long ticket;
    int err;

    (void)mod;
    (void)unused;
    if (cm_capture_refuse_ctx("cudamem.synchronize()") < 0
        || (c = cm_context_current()) == NULL) {
        return NULL;
    }
    /* Held: a close on another thread while the GIL is released may
     * drop the registry's reference. */
    Py_INCREF(c);
    ticket = cm_ctx_sync_begin(c);
    CM_CU_NOGIL(err, CtxSynchronize, ());
    if (err == 0) {
        cm_ctx_sync_end(c, ticket);
    }
    Py_DECREF(c);
    if (err < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cm_close_doc,
"_close(main_thread)\n--\n\n"
"Pop every context of the calling thread; on the main thread also release "
"and reset every primary context.");

static PyObject *
cm_close_fn(PyObject *mod, PyObject *main_thread)
{
    int i;
    int err = 0;

    (void)mod;
    if (cm_driver_ensure() < 0 || cm_context_pop_all() < 0) {
        return NULL;
    }
    if (PyObject_IsTrue(main_thread)) {
        for (i = 0; i < CM_MAX_DEVICES && i < cm_ndev; i++) {
            if (cm_context_release_device(i) < 0) {
                err = -1;
                break;
            }
        }
    }
    if (err < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cm_current_device_id_doc,
"_current_device_id()\n--\n\n"
"The ordinal of the current context's device, or None when no context is "
"current.  Makes no context current.");

static PyObject *
cm_current_device_id_fn(PyObject *mod, PyObject *unused)
{
    CUcontext cur = NULL;
    cm_context *c;

    (void)mod;
    (void)unused;
    if (cm_driver_ensure() < 0 || CM_CU(CtxGetCurrent, (&cur)) < 0) {
        return NULL;
    }
    if (cur == NULL) {
        Py_RETURN_NONE;
    }
    c = cm_context_find(cur);
    if (c == NULL && (c = cm_context_current()) == NULL) {
        return NULL;
    }
    return PyLong_FromLong(c->device->id);
}

PyDoc_STRVAR(cm_can_access_peer_doc,
"can_access_peer(device, peer, /)\n--\n\n"
"Whether device (an ordinal or a Device) can map the memory of device "
"peer: cuDeviceCanAccessPeer.  True for a device and itself.");

static PyObject *
cm_can_access_peer_fn(PyObject *mod, PyObject *const *args,
                      Py_ssize_t nargs)
{
    int ids[2];
    int k;
    int r;

    (void)mod;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError,
                     "can_access_peer() takes 2 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    if (cm_driver_ensure() < 0) {
        return NULL;
    }
    for (k = 0; k < 2; k++) {
        ids[k] = PyObject_TypeCheck(args[k], cm_st->Device_type)
                     ? ((cm_device *)args[k])->id
                     : cm_device_arg(args[k]);
        if (ids[k] < 0) {
            return NULL;
        }
    }
    r = cm_peer_possible(ids[0], ids[1]);
    return r < 0 ? NULL : PyBool_FromLong(r);
}

PyDoc_STRVAR(cm_enable_peer_access_doc,
"enable_peer_access(device, peer, /)\n--\n\n"
"Let device's primary context map the memory of device peer (ordinals "
"or Devices), once per pair; nothing for a device and itself.  "
"ValueError naming both devices when they have no peer access.");

static PyObject *
cm_enable_peer_access_fn(PyObject *mod, PyObject *const *args,
                         Py_ssize_t nargs)
{
    cm_context *a;
    cm_context *b;

    (void)mod;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError,
                     "enable_peer_access() takes 2 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    if ((a = cm_context_of_device(args[0])) == NULL
        || (b = cm_context_of_device(args[1])) == NULL
        || cm_context_enable_peer(a, b) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* O& converter: a context handle given as an int address. */
static int
cm_context_handle_arg(PyObject *o, void *out)
{
    void *p = PyLong_AsVoidPtr(o);

    if (p == NULL && PyErr_Occurred()) {
        return 0;
    }
    *(void **)out = p;
    return 1;
}

PyDoc_STRVAR(cm_memcpy_peer_doc,
"_memcpy_peer(dst, dst_context, src, src_context, nbytes, /)\n--\n\n"
"The bare cuMemcpyPeer (GIL released), for the benchmarks' driver "
"column: addresses and context handles as ints.");

static PyObject *
cm_memcpy_peer_fn(PyObject *mod, PyObject *args)
{
    unsigned long long dst;
    unsigned long long src;
    void *dctx;
    void *sctx;
    Py_ssize_t n;
    int err;

    (void)mod;
    if (!PyArg_ParseTuple(args, "KO&KO&n:_memcpy_peer", &dst,
                          cm_context_handle_arg, &dctx, &src,
                          cm_context_handle_arg, &sctx, &n)) {
        return NULL;
    }
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "nbytes must not be negative");
        return NULL;
    }
    if (cm_driver_ensure() < 0) {
        return NULL;
    }
    CM_CU_NOGIL(err, MemcpyPeer,
                ((CUdeviceptr)dst, (CUcontext)dctx, (CUdeviceptr)src,
                 (CUcontext)sctx, (size_t)n));
    if (err < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* The work of _synchronize_all, on a thread of its own so that the caller
 * can stop waiting. */
typedef struct {
    CUcontext handles[CM_MAX_DEVICES];  /* contexts to wait for */
    int n;                              /* how many */
    int done;                           /* NOTE: guarded by lock */
    int refs;                           /* NOTE: guarded by lock; the
                                         * last one frees the struct */
    pthread_mutex_t lock;
    pthread_cond_t cond;
} cm_syncall;

static void
cm_syncall_unref(cm_syncall *w)
{
    int last;

    cm_mu_lock(&w->lock);
    last = --w->refs == 0;
    cm_mu_unlock(&w->lock);
    if (last) {
        pthread_mutex_destroy(&w->lock);
        pthread_cond_destroy(&w->cond);
        free(w);
    }
}

static void *
cm_syncall_run(void *arg)
{
    cm_syncall *w = arg;
    CUcontext popped;
    int i;

    for (i = 0; i < w->n; i++) {
        if (CM_CU_RAW(CtxPushCurrent, (w->handles[i])) == CUDA_SUCCESS) {
            (void)CM_CU_RAW(CtxSynchronize, ());
            (void)CM_CU_RAW(CtxPopCurrent, (&popped));
        }
    }
    cm_mu_lock(&w->lock);
    w->done = 1;
    pthread_cond_broadcast(&w->cond);
    cm_mu_unlock(&w->lock);
    cm_syncall_unref(w);
    return NULL;
}

PyDoc_STRVAR(cm_synchronize_all_doc,
"_synchronize_all(timeout)\n--\n\n"
"Wait, with the GIL released, up to timeout seconds for the work of every "
"live context to finish.  Run at interpreter exit, so that no copy or "
"host function is still in flight while Python frees the objects it "
"uses.  True if everything finished in time.");

static PyObject *
cm_synchronize_all_fn(PyObject *mod, PyObject *arg)
{
    double timeout = PyFloat_AsDouble(arg);
    cm_syncall *w;
    pthread_t th;
    struct timespec until;
    int i;
    int ok;

    (void)mod;
    if (timeout == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    if (!__atomic_load_n(&cm_driver_ready_flag, __ATOMIC_ACQUIRE)
        || cm_forked) {
        Py_RETURN_TRUE;
    }
    w = calloc(1, sizeof(*w));
    if (w == NULL) {
        return PyErr_NoMemory();
    }
    for (i = 0; i < CM_MAX_DEVICES && i < cm_ndev; i++) {
        if (cm_ctxs[i] != NULL && cm_ctxs[i]->alive) {
            w->handles[w->n++] = cm_ctxs[i]->handle;
        }
    }
    if (w->n == 0) {
        free(w);
        Py_RETURN_TRUE;
    }
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->cond, NULL);
    w->refs = 2;
    if (pthread_create(&th, NULL, cm_syncall_run, w) != 0) {
        pthread_mutex_destroy(&w->lock);
        pthread_cond_destroy(&w->cond);
        free(w);
        Py_RETURN_FALSE;
    }
    pthread_detach(th);
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)timeout;
    until.tv_nsec += (long)((timeout - (double)(time_t)timeout) * 1e9);
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    Py_BEGIN_ALLOW_THREADS
    cm_mu_lock(&w->lock);
    while (!w->done) {
        if (pthread_cond_timedwait(&w->cond, &w->lock, &until)
            == ETIMEDOUT) {
            break;
        }
    }
    ok = w->done;
    cm_mu_unlock(&w->lock);
    Py_END_ALLOW_THREADS
    cm_syncall_unref(w);
    return PyBool_FromLong(ok);
}

PyDoc_STRVAR(cm_profile_doc,
"_profile(start)\n--\n\n"
"cuProfilerStart (start true) or cuProfilerStop in the current context,\n"
"made current if none is.");

static PyObject *
cm_profile_fn(PyObject *mod, PyObject *start)
{
    int on = PyObject_IsTrue(start);

    (void)mod;
    if (on < 0 || cm_context_current() == NULL
        || (on ? CM_CU(ProfilerStart, ()) : CM_CU(ProfilerStop, ())) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cm_address_range_doc,
"_address_range(address, /)\n--\n\n"
"(base, size) of the device allocation that contains address, in the\n"
"current context (made if needed): cuMemGetAddressRange.");

static PyObject *
cm_address_range_fn(PyObject *mod, PyObject *arg)
{
    unsigned long long a = PyLong_AsUnsignedLongLong(arg);
    CUdeviceptr base = 0;
    size_t size = 0;

    (void)mod;
    if (a == (unsigned long long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    if (cm_context_current() == NULL
        || CM_CU(MemGetAddressRange, (&base, &size, (CUdeviceptr)a)) < 0) {
        return NULL;
    }
    return Py_BuildValue("(Kn)", (unsigned long long)base, (Py_ssize_t)size);
}

static PyMethodDef cm_context_functions[] = {
    {"_address_range", cm_address_range_fn, METH_O, cm_address_range_doc},
    {"_synchronize_all", cm_synchronize_all_fn, METH_O,
     cm_synchronize_all_doc},
    {"_memcpy_peer", cm_memcpy_peer_fn, METH_VARARGS, cm_memcpy_peer_doc},
    {"can_access_peer", (PyCFunction)(void (*)(void))cm_can_access_peer_fn,
     METH_FASTCALL, cm_can_access_peer_doc},
    {"enable_peer_access",
     (PyCFunction)(void (*)(void))cm_enable_peer_access_fn, METH_FASTCALL,
     cm_enable_peer_access_doc},
    {"_current_device_id", cm_current_device_id_fn, METH_NOARGS,
     cm_current_device_id_doc},
    {"_device_count", cm_device_count_fn, METH_NOARGS, cm_device_count_doc},
    {"_get_device", cm_get_device_fn, METH_O, cm_get_device_doc},
    {"current_context", (PyCFunction)(void (*)(void))cm_current_context_fn,
     METH_FASTCALL | METH_KEYWORDS, cm_current_context_doc},
    {"select_device", cm_select_device_fn, METH_O, cm_select_device_doc},
    {"_push_device", cm_push_device_fn, METH_O, cm_push_device_doc},
    {"_pop_device", cm_pop_device_fn, METH_O, cm_pop_device_doc},
    {"get_current_device", cm_get_current_device_fn, METH_NOARGS,
     cm_get_current_device_doc},
    {"synchronize", cm_synchronize_fn, METH_NOARGS, cm_synchronize_doc},
    {"_close", cm_close_fn, METH_O, cm_close_doc},
    {"_profile", cm_profile_fn, METH_O, cm_profile_doc},
    {NULL, NULL, 0, NULL},
};

int
cm_context_init(PyObject *mod, cm_state *st)
{
    if (cm_runtime_fork_init() < 0) {
        return -1;
    }
    st->Device_type = (PyTypeObject *)PyType_FromModuleAndSpec(
        mod, &cm_device_spec, NULL);
    if (st->Device_type == NULL
        || PyModule_AddObjectRef(mod, "Device",
                                 (PyObject *)st->Device_type) < 0) {
        return -1;
    }
    st->Context_type = (PyTypeObject *)PyType_FromModuleAndSpec(
        mod, &cm_context_spec, NULL);
    if (st->Context_type == NULL
        || PyModule_AddObjectRef(mod, "Context",
                                 (PyObject *)st->Context_type) < 0) {
        return -1;
    }
    return PyModule_AddFunctions(mod, cm_context_functions);
}

int
cm_types_patchable(cm_state *st)
{
    /* Code written for numba replaces methods on its classes
     * (unittest.mock.patch.object(Stream, "synchronize")); numba's are
     * Python classes.  Clearing the flag after creation costs nothing
     * on the hot paths: attribute lookups are cached per type version
     * either way, and only an assignment invalidates the cache. */
    PyTypeObject *const types[] = {
        st->Device_type, st->Context_type, st->Mem_type, st->Pending_type,
        st->DeviceNDArrayBase_type, st->DeviceNDArray_type,
        st->DeviceRecord_type, st->HostMem_type, st->HostRegistration_type,
        st->Stream_type, st->Event_type, st->Module_type, st->Kernel_type,
    };
    size_t i;

    for (i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        if (types[i] != NULL) {
            types[i]->tp_flags &= ~Py_TPFLAGS_IMMUTABLETYPE;
            PyType_Modified(types[i]);
        }
    }
    return 0;
}
