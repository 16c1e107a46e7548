/* SPDX-License-Identifier: MIT */
/*
 * context/device.c: Device objects, one per device ordinal.
 */
#include "context/devctx.h"
#include "context/devattrs.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>


int cm_ndev = -1;                      /* device count, once known */
cm_device *cm_devs[CM_MAX_DEVICES];    /* strong, made on demand */
cm_context *cm_ctxs[CM_MAX_DEVICES];   /* strong, while retained */
unsigned long cm_ctx_gen;              /* last cm_context.gen */
/* NOTE: guarded by the GIL.  [i]: device i is being closed or reset, by
 * the thread cm_resetter[i]. */
unsigned char cm_resetting[CM_MAX_DEVICES];
unsigned long cm_resetter[CM_MAX_DEVICES];

/* Let other threads run for a moment; the GIL is released by the caller. */
static void
cm_context_nap(void)
{
    struct timespec ts = {0, 200000};

    (void)nanosleep(&ts, NULL);
}

/* Wait, GIL released, while another thread closes or resets device i;
 * -1 with ValueError when the caller is that thread (code run by the
 * reset itself, a plugin's say, asking for the device's context). */
int
cm_context_wait_reset(int i)
{
    if (cm_resetting[i] && cm_resetter[i] == PyThread_get_thread_ident()) {
        PyErr_Format(PyExc_ValueError,
                     "the context of device %d is being closed", i);
        return -1;
    }
    while (cm_resetting[i]) {
        Py_BEGIN_ALLOW_THREADS
        cm_context_nap();
        Py_END_ALLOW_THREADS
    }
    return 0;
}

/* Wait, GIL released, until every driver call made with the GIL released
 * that began before now has ended, in any thread.  Called with the
 * closing context already dead, so that no new call on its objects
 * starts; calls begun later, of other contexts, are not waited for. */
void
cm_context_quiesce(void)
{
    int e = (int)(__atomic_fetch_add(&cm_driver_epoch, 1, __ATOMIC_SEQ_CST)
                  & 1);

    if (__atomic_load_n(&cm_driver_calls[e], __ATOMIC_SEQ_CST) == 0) {
        return;
    }
    Py_BEGIN_ALLOW_THREADS
    while (__atomic_load_n(&cm_driver_calls[e], __ATOMIC_SEQ_CST) != 0) {
        cm_context_nap();
    }
    Py_END_ALLOW_THREADS
}

/* In the child of a fork(): the driver calls, resets and Python
 * callbacks that other parent threads had in flight never end there,
 * so nothing may wait for them (cm_context_quiesce, wait_reset and the
 * GIL's yield would).  The contexts stay as they were: their objects
 * refuse (the driver does) and free nothing (cm_forked). */
static void
cm_runtime_atfork_child(void)
{
    memset(cm_driver_calls, 0, sizeof(cm_driver_calls));
    memset(cm_resetting, 0, sizeof(cm_resetting));
    memset(cm_resetter, 0, sizeof(cm_resetter));
    __atomic_store_n(&cm_pycb_live, 0, __ATOMIC_SEQ_CST);
    for (int i = 0; i < CM_MAX_DEVICES; i++) {
        cm_ctx_dying_clear(i);
    }
}

int
cm_runtime_fork_init(void)
{
    return cm_atfork_child_add(cm_runtime_atfork_child);
}

/* What a fork's child must have made fresh, for the tests. */
PyObject *
cm_runtime_fork_state(void)
{
    long calls = __atomic_load_n(&cm_driver_calls[0], __ATOMIC_SEQ_CST)
                 + __atomic_load_n(&cm_driver_calls[1], __ATOMIC_SEQ_CST);
    int resetting = 0;
    int i;

    for (i = 0; i < CM_MAX_DEVICES; i++) {
        resetting += cm_resetting[i];
    }
    return Py_BuildValue(
        "{s:O,s:l,s:l,s:i}", "forked", cm_forked ? Py_True : Py_False,
        "calls_in_flight", calls, "callbacks_in_flight",
        __atomic_load_n(&cm_pycb_live, __ATOMIC_SEQ_CST), "resetting",
        resetting);
}

/* For the tests: on (1), pretend that another thread is in a driver call
 * with the GIL released, that device 0 is being reset by another thread
 * and that a Python callback is in flight; off (0) takes it back.  Only
 * meant around a fork (this thread must not touch device 0 meanwhile). */
void
cm_runtime_fork_pretend(int on)
{
    long d = on ? 1 : -1;

    (void)__atomic_fetch_add(&cm_driver_calls[0], d, __ATOMIC_SEQ_CST);
    (void)__atomic_fetch_add(&cm_driver_calls[1], d, __ATOMIC_SEQ_CST);
    (void)__atomic_fetch_add(&cm_pycb_live, d, __ATOMIC_SEQ_CST);
    cm_resetting[0] = (unsigned char)(on != 0);
    cm_resetter[0] = on ? (unsigned long)-1 : 0;
}

/* ------------------------------------------------------------------ */
/* Device                                                              */
/* ------------------------------------------------------------------ */

int
cm_device_count(void)
{
    int n = 0;

    if (cm_ndev >= 0) {
        return cm_ndev;
    }
    if (cm_driver_ensure() < 0 || CM_CU(DeviceGetCount, (&n)) < 0) {
        return -1;
    }
    cm_ndev = n > CM_MAX_DEVICES ? CM_MAX_DEVICES : n;
    return cm_ndev;
}

/* Normalise a device ordinal (negative ones wrap); -1 with IndexError. */
int
cm_device_index(Py_ssize_t i)
{
    int n = cm_device_count();
    Py_ssize_t j = i;

    if (n < 0) {
        return -1;
    }
    if (j < 0) {
        j += n;
    }
    if (j < 0 || j >= n) {
        /* The number the caller gave, not the wrapped one. */
        PyErr_Format(PyExc_IndexError,
                     "device index out of range: %zd (there %s %d device%s)",
                     i, n == 1 ? "is" : "are", n, n == 1 ? "" : "s");
        return -1;
    }
    return (int)j;
}

/* A device ordinal argument, normalised; -1 with an exception. */
int
cm_device_arg(PyObject *arg)
{
    Py_ssize_t i;

    if (PyFloat_Check(arg)) {
        PyErr_Format(PyExc_TypeError,
                     "device id must be an integer, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return -1;
    }
    i = PyNumber_AsSsize_t(arg, PyExc_IndexError);
    if (i == -1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Format(PyExc_TypeError,
                         "device id must be an integer, not %.100s",
                         Py_TYPE(arg)->tp_name);
        }
        return -1;
    }
    return cm_device_index(i);
}

/* Device i (already normalised): borrowed, made on first use. */
cm_device *
cm_device_get(int i)
{
    cm_device *d;
    CUdevice h;
    char name[256];

    if (cm_devs[i] != NULL) {
        return cm_devs[i];
    }
    if (CM_CU(DeviceGet, (&h, i)) < 0
        || CM_CU(DeviceGetName, (name, (int)sizeof(name), h)) < 0) {
        return NULL;
    }
    d = PyObject_GC_New(cm_device, cm_st->Device_type);
    if (d == NULL) {
        return NULL;
    }
    d->id = i;
    d->handle = h;
    d->name = NULL;
    d->weakreflist = NULL;
    d->cc_major = 0;
    d->cc_minor = 0;
    d->has_pci = 0;
    PyObject_GC_Track(d);
    d->name = PyUnicode_DecodeUTF8(name, strlen(name), "replace");
    if (d->name == NULL
        || CM_CU(DeviceGetAttribute,
                 (&d->cc_major,
                  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, h)) < 0
        || CM_CU(DeviceGetAttribute,
                 (&d->cc_minor,
                  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, h)) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    if (cm_devs[i] != NULL) {
        /* Made by another thread while a query let go of the GIL: one
         * Device per ordinal. */
        Py_DECREF(d);
        return cm_devs[i];
    }
    cm_devs[i] = d;
    return d;
}

static int
cm_device_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(((cm_device *)self)->name);
    return 0;
}

static void
cm_device_dealloc(PyObject *self)
{
    cm_device *d = (cm_device *)self;
    PyTypeObject *tp = Py_TYPE(self);

    PyObject_GC_UnTrack(self);
    if (d->weakreflist != NULL) {
        PyObject_ClearWeakRefs(self);
    }
    Py_CLEAR(d->name);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static int
cm_devattr_cmp(const void *key, const void *item)
{
    return strcmp((const char *)key, ((const cm_devattr *)item)->name);
}

/* Attributes by numba's names: dev.MULTIPROCESSOR_COUNT and the like. */
static PyObject *
cm_device_getattro(PyObject *self, PyObject *name)
{
    PyObject *r = PyObject_GenericGetAttr(self, name);
    const cm_devattr *a;
    const char *s;
    int v = 0;

    if (r != NULL || !PyErr_ExceptionMatches(PyExc_AttributeError)) {
        return r;
    }
    s = PyUnicode_AsUTF8(name);
    if (s == NULL) {
        return NULL;
    }
    a = bsearch(s, cm_devattrs, CM_N_DEVATTRS, sizeof(cm_devattr),
                cm_devattr_cmp);
    if (a == NULL) {
        return NULL;  /* the AttributeError stays set */
    }
    PyErr_Clear();
    if (CM_CU(DeviceGetAttribute, (&v, (CUdevice_attribute)a->value,
                                   ((cm_device *)self)->handle)) < 0) {
        return NULL;
    }
    return PyLong_FromLong(v);
}

static PyObject *
cm_device_get_id(PyObject *self, void *c)
{
    (void)c;
    return PyLong_FromLong(((cm_device *)self)->id);
}

static PyObject *
cm_device_get_name(PyObject *self, void *c)
{
    (void)c;
    return Py_NewRef(((cm_device *)self)->name);
}

static PyObject *
cm_device_get_cc(PyObject *self, void *c)
{
    cm_device *d = (cm_device *)self;

    (void)c;
    return Py_BuildValue("(ii)", d->cc_major, d->cc_minor);
}

static PyObject *
cm_device_get_uuid(PyObject *self, void *c)
{
    CUuuid u;
    const unsigned char *b = (const unsigned char *)u.bytes;
    char s[64];
    int i;
    int n;

    (void)c;
    if (CM_CU(DeviceGetUuid, (&u, ((cm_device *)self)->handle)) < 0) {
        return NULL;
    }
    n = snprintf(s, sizeof(s), "GPU-");
    for (i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10) {
            s[n++] = '-';
        }
        n += snprintf(s + n, sizeof(s) - n, "%02x", b[i]);
    }
    return PyUnicode_FromStringAndSize(s, n);
}

int
cm_device_cc_at_least(cm_device *d, int major, int minor)
{
    return d->cc_major > major || (d->cc_major == major
                                   && d->cc_minor >= minor);
}

static PyObject *
cm_device_get_fp16(PyObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(cm_device_cc_at_least((cm_device *)self, 5, 3));
}

static PyObject *
cm_device_get_bf16(PyObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(cm_device_cc_at_least((cm_device *)self, 8, 0));
}

static PyObject *
cm_device_get_fp8(PyObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(cm_device_cc_at_least((cm_device *)self, 8, 9));
}

PyDoc_STRVAR(cm_device_identity_doc,
"get_device_identity($self, /)\n--\n\n"
"The device's PCI location: a dict of pci_domain_id, pci_bus_id and "
"pci_device_id.");

/* The PCI domain, bus and device ids of device h from the driver; 0 or
 * -1. */
static int
cm_device_read_pci(CUdevice h, int pci[3])
{
    if (CM_CU(DeviceGetAttribute,
              (&pci[0], CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, h)) < 0
        || CM_CU(DeviceGetAttribute,
                 (&pci[1], CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, h)) < 0
        || CM_CU(DeviceGetAttribute,
                 (&pci[2], CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, h)) < 0) {
        return -1;
    }
    return 0;
}

int
cm_device_pci(cm_device *d, int pci[3])
{
    if (!d->has_pci) {
        if (cm_device_read_pci(d->handle, d->pci) < 0) {
            return -1;
        }
        d->has_pci = 1;
    }
    pci[0] = d->pci[0];
    pci[1] = d->pci[1];
    pci[2] = d->pci[2];
    return 0;
}

static PyObject *
cm_device_get_device_identity(PyObject *self, PyObject *unused)
{
    int pci[3] = {0, 0, 0};

    (void)unused;
    if (cm_device_read_pci(((cm_device *)self)->handle, pci) < 0) {
        return NULL;
    }
    return Py_BuildValue("{sisisi}", "pci_domain_id", pci[0], "pci_bus_id",
                         pci[1], "pci_device_id", pci[2]);
}

PyDoc_STRVAR(cm_device_reset_doc,
"reset($self, /)\n--\n\n"
"Release and reset this device's primary context.  Every array, stream "
"and event made in it becomes invalid; the next call that needs the "
"device starts a fresh context.\n\n"
"Safe against other threads: calls they have in flight on the device "
"finish first; afterwards their streams, events, device arrays and "
"kernels of the old context raise ValueError (or CudaAPIError), while "
"pinned, mapped and managed arrays stay valid as ordinary host memory. "
"Frees of the old context's objects are dropped without a word.");

static PyObject *
cm_device_reset(PyObject *self, PyObject *unused)
{
    (void)unused;
    if (cm_context_release_device(((cm_device *)self)->id) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
cm_device_repr(PyObject *self)
{
    cm_device *d = (cm_device *)self;

    return PyUnicode_FromFormat("<CUDA device %d '%U'>", d->id, d->name);
}

static Py_hash_t
cm_device_hash(PyObject *self)
{
    return (Py_hash_t)((cm_device *)self)->id + 1;
}

static PyObject *
cm_device_richcompare(PyObject *a, PyObject *b, int op)
{
    int eq;

    if ((op != Py_EQ && op != Py_NE) || Py_TYPE(a) != Py_TYPE(b)) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    eq = ((cm_device *)a)->id == ((cm_device *)b)->id;
    return PyBool_FromLong(op == Py_EQ ? eq : !eq);
}

static PyGetSetDef cm_device_getset[] = {
    {"id", cm_device_get_id, NULL, "The device ordinal.", NULL},
    {"name", cm_device_get_name, NULL, "The device name.", NULL},
    {"compute_capability", cm_device_get_cc, NULL,
     "(major, minor) compute capability.", NULL},
    {"uuid", cm_device_get_uuid, NULL,
     "The device UUID, as GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.", NULL},
    {"supports_float16", cm_device_get_fp16, NULL,
     "Compute capability 5.3 or newer.", NULL},
    {"supports_bfloat16", cm_device_get_bf16, NULL,
     "Compute capability 8.0 or newer.", NULL},
    {"supports_fp8", cm_device_get_fp8, NULL,
     "Compute capability 8.9 or newer.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef cm_device_methods[] = {
    {"get_device_identity", cm_device_get_device_identity, METH_NOARGS,
     cm_device_identity_doc},
    {"reset", cm_device_reset, METH_NOARGS, cm_device_reset_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef cm_device_members[] = {
    {"__weaklistoffset__", Py_T_PYSSIZET,
     offsetof(cm_device, weakreflist), Py_READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(cm_device_doc,
"A CUDA device.  Attributes of the driver's CUdevice_attribute enum are "
"readable by their names without the CU_DEVICE_ATTRIBUTE_ prefix, for "
"example dev.MULTIPROCESSOR_COUNT.\n\n"
"Notes\n-----\n"
"get_current_device() returns this object itself, not a weak proxy: it is "
"hashable, and repr and str agree.");

static PyType_Slot cm_device_slots[] = {
    {Py_tp_doc, (void *)cm_device_doc},
    {Py_tp_dealloc, cm_device_dealloc},
    {Py_tp_traverse, cm_device_traverse},
    {Py_tp_getattro, cm_device_getattro},
    {Py_tp_repr, cm_device_repr},
    {Py_tp_str, cm_device_repr},
    {Py_tp_hash, cm_device_hash},
    {Py_tp_richcompare, cm_device_richcompare},
    {Py_tp_getset, cm_device_getset},
    {Py_tp_methods, cm_device_methods},
    {Py_tp_members, cm_device_members},
    {0, NULL},
};

PyType_Spec cm_device_spec = {
    .name = "cudamem.Device",
    .basicsize = sizeof(cm_device),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC
             | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = cm_device_slots,
};
