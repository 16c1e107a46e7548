/* SPDX-License-Identifier: MIT */
/*
 * context/device.c: devices, and the registry the files of devices and
 * contexts share.  Owns the device count and ordinals (cm_device_count,
 * cm_device_index, cm_device_arg), one Device object per ordinal made on
 * first use (cm_device_get; its Python type is ctxtypes.c's), a device's
 * compute capability and PCI location, the registry's arrays (cm_devs,
 * cm_ctxs, cm_resetting), the waits of a close against other threads
 * (cm_context_wait_reset, cm_context_quiesce) and the runtime's part of
 * a fork's child.  It calls nothing else of the folder.
 *
 * Locks and the GIL: no lock; the registry's arrays are guarded by the
 * GIL (a fork's child clears the flags and counts before any other
 * thread exists there).  The GIL is released only to nap while another
 * thread closes device i (cm_context_wait_reset: cm_resetting is read
 * again with the GIL back) and while the driver calls in flight drain
 * (cm_context_quiesce: atomics only), and around a device query while
 * Python callbacks are in flight (CM_CU): cm_device_get checks again
 * afterwards that no other thread made the Device meanwhile.
 */
#include "context/devctx.h"

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

int
cm_device_cc_at_least(cm_device *d, int major, int minor)
{
    return d->cc_major > major || (d->cc_major == major
                                   && d->cc_minor >= minor);
}

/* The PCI domain, bus and device ids of device h from the driver; 0 or
 * -1. */
int
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
