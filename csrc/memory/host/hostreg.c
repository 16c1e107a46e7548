/* SPDX-License-Identifier: MIT */
/*
 * memory/host/hostreg.c: HostRegistration, what pinned() and mapped() hold
 * while a host range stays registered.
 *
 * Locks and the GIL: the registry's lock cm_reg_lock (a PyThread lock,
 * registry.c) guards its pieces and their byte total.  It is taken only
 * with the GIL given up (CM_DRIVER_BEGIN_NOGIL, Py_BEGIN_ALLOW_THREADS;
 * cm_hostmem_registered's callers, the copy paths, have given it up) and
 * is held across cuMemHostRegister / cuMemHostUnregister (registry.c's
 * _locked functions); nothing of Python is touched and no other lock is
 * taken while it is held.  A registration's own fields are guarded by
 * the GIL.
 */
#include "memory/host/host.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

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
        CM_DRIVER_BEGIN_NOGIL
        PyThread_acquire_lock(cm_reg_lock, WAIT_LOCK);
        if (driver) {
            rc = cm_ctx_enter(h, &pushed);
        }
        if (rc == CUDA_SUCCESS) {
            rc = cm_reg_release_locked(&r->held, driver);
        }
        cm_ctx_leave(pushed);
        PyThread_release_lock(cm_reg_lock);
        CM_DRIVER_END_NOGIL
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
int
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

    if (cm_mm_prepare(r->ctx) < 0) {
        return -1;
    }
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
        CM_DRIVER_BEGIN_NOGIL
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
        CM_DRIVER_END_NOGIL
    }
    PyMem_RawFree(ranges);
    return cm_cu_check(rc, "cuMemHostRegister");
}

static const char cm_register_arrays_doc[] = PyDoc_STR(
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
    if ((cm_mm_uses_plugin(ctx) ? cm_reg_plugin(r) : cm_reg_default(r)) < 0) {
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
    return cm_mem_up.devicearray_new(PyArray_NDIM(a), PyArray_SHAPE(a),
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

PyType_Spec cm_reg_spec = {
    .name = "cudamem.HostRegistration",
    .basicsize = sizeof(cm_hostreg),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC
             | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = cm_reg_slots,
};

static const char cm_registered_bytes_doc[] = PyDoc_STR(
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

static PyMethodDef cm_hostreg_functions[] = {
    {"_register_arrays", cm_register_arrays_fn, METH_VARARGS,
     cm_register_arrays_doc},
    {"_registered_bytes", cm_registered_bytes_fn, METH_NOARGS,
     cm_registered_bytes_doc},
    {NULL, NULL, 0, NULL},
};

int
cm_hostreg_add_functions(PyObject *mod)
{
    return PyModule_AddFunctions(mod, cm_hostreg_functions);
}
