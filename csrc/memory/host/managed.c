/* SPDX-License-Identifier: MIT */
/*
 * memory/host/managed.c: managed memory: prefetch and advice.
 */
#include "memory/host/host.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* Managed memory: prefetch and advice                                 */
/* ------------------------------------------------------------------ */

/* The managed range of a managed array: its owner and its byte span
 * [*lo, *lo + *n).  -1 with TypeError for other arrays. */
static cm_hostmem *
cm_managed_range(PyObject *arr, uintptr_t *lo, size_t *n)
{
    cm_hostmem *m = PyArray_Check(arr) ? cm_hm_find(arr) : NULL;
    uintptr_t hi;

    if (m == NULL || m->kind != CM_HM_MANAGED) {
        PyErr_SetString(PyExc_TypeError,
                        "expected an array in managed memory (from "
                        "managed_array)");
        return NULL;
    }
    if (!cm_array_range((PyArrayObject *)arr, lo, &hi)) {
        *n = 0;
        return m;
    }
    *n = (size_t)(hi - *lo);
    return m;
}

/* A location from a device argument: None is m's device; 'cpu', 'host'
 * or -1 the host; else a device ordinal or Device.  *dev gets the device
 * ordinal (-1 for the host). */
static int
cm_location_arg(PyObject *o, cm_hostmem *m, CUmemLocation *loc, int *dev)
{
    long id;

    if (o == NULL || o == Py_None) {
        id = m->ctx->device->id;
    }
    else if (PyUnicode_Check(o)) {
        if (PyUnicode_CompareWithASCIIString(o, "cpu") != 0
            && PyUnicode_CompareWithASCIIString(o, "host") != 0) {
            PyErr_Format(PyExc_ValueError,
                         "device must be a device, its ordinal, None, "
                         "'cpu' or 'host', not %R", o);
            return -1;
        }
        id = -1;
    }
    else if (PyObject_TypeCheck(o, ST->Device_type)) {
        id = ((cm_device *)o)->id;
    }
    else {
        PyObject *idx = PyNumber_Index(o);

        if (idx == NULL) {
            PyErr_Format(PyExc_TypeError,
                         "device must be a device, its ordinal, None, "
                         "'cpu' or 'host', not %.100s",
                         Py_TYPE(o)->tp_name);
            return -1;
        }
        id = PyLong_AsLong(idx);
        Py_DECREF(idx);
        if (id == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (id < -1) {
            PyErr_Format(PyExc_ValueError, "invalid device ordinal %ld",
                         id);
            return -1;
        }
    }
    memset(loc, 0, sizeof(*loc));
    if (id < 0) {
        loc->type = CU_MEM_LOCATION_TYPE_HOST;
        loc->id = 0;
    }
    else {
        loc->type = CU_MEM_LOCATION_TYPE_DEVICE;
        loc->id = (int)id;
    }
    *dev = (int)id;
    return 0;
}

/* CudaSupportError unless device dev (>= 0) can migrate managed memory
 * on demand (CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS). */
static int
cm_check_concurrent_managed(int dev, const char *what)
{
    CUdevice h;
    int v = 0;

    if (dev < 0) {
        return 0;
    }
    if (CM_CU(DeviceGet, (&h, dev)) < 0
        || CM_CU(DeviceGetAttribute,
                 (&v, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, h))
           < 0) {
        return -1;
    }
    if (!v) {
        CM_RAISE(CudaSupportError,
                 "%s needs a device with concurrent managed access; "
                 "device %d has none (a platform without on-demand "
                 "page migration)", what, dev);
        return -1;
    }
    return 0;
}

static const char cm_managed_prefetch_doc[] = PyDoc_STR(
"_managed_prefetch(ary, device=None, stream=0)\n--\n\n"
"cuMemPrefetchAsync of a managed array's bytes to a device (default: the\n"
"one it was allocated on) or to the host ('cpu'), on ``stream``.");

static PyObject *
cm_managed_prefetch_fn(PyObject *mod, PyObject *const *args,
                       Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *kwl[3] = {cm_hm_kw[KW_ARY], cm_hm_kw[KW_DEVICE],
                        cm_hm_kw[KW_STREAM]};
    PyObject *p[3];
    cm_hostmem *m;
    CUmemLocation loc;
    CUstream h = NULL;
    uintptr_t lo = 0;
    size_t n = 0;
    int dev;

    (void)mod;
    if (cm_argparse("prefetch", args, nargs, kwnames, kwl, 3, 1, p) < 0
        || (m = cm_managed_range(p[0], &lo, &n)) == NULL
        || cm_location_arg(p[1], m, &loc, &dev) < 0
        || (p[2] != NULL && p[2] != Py_None
            && cm_stream_resolve(p[2], &h) < 0)
        || cm_context_activate(m->ctx) < 0
        || cm_check_concurrent_managed(dev, "prefetch()") < 0) {
        return NULL;
    }
    if (n > 0 && CM_CU(MemPrefetchAsync, ((CUdeviceptr)lo, n, loc, 0, h))
                 < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* The CUmem_advise named by o (a name or the driver's number). */
static int
cm_advice_arg(PyObject *o, CUmem_advise *adv)
{
    static const struct {
        const char *name;
        CUmem_advise value;
    } names[] = {
        {"read_mostly", CU_MEM_ADVISE_SET_READ_MOSTLY},
        {"unset_read_mostly", CU_MEM_ADVISE_UNSET_READ_MOSTLY},
        {"preferred_location", CU_MEM_ADVISE_SET_PREFERRED_LOCATION},
        {"unset_preferred_location",
         CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION},
        {"accessed_by", CU_MEM_ADVISE_SET_ACCESSED_BY},
        {"unset_accessed_by", CU_MEM_ADVISE_UNSET_ACCESSED_BY},
    };
    size_t i;

    if (PyUnicode_Check(o)) {
        for (i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
            if (PyUnicode_CompareWithASCIIString(o, names[i].name) == 0) {
                *adv = names[i].value;
                return 0;
            }
        }
    }
    else if (PyLong_Check(o)) {
        long v = PyLong_AsLong(o);

        if (v == -1 && PyErr_Occurred()) {
            return -1;
        }
        for (i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
            if ((long)names[i].value == v) {
                *adv = names[i].value;
                return 0;
            }
        }
    }
    PyErr_Format(PyExc_ValueError,
                 "unknown advice %R: use 'read_mostly', "
                 "'unset_read_mostly', 'preferred_location', "
                 "'unset_preferred_location', 'accessed_by' or "
                 "'unset_accessed_by'", o);
    return -1;
}

static const char cm_managed_advise_doc[] = PyDoc_STR(
"_managed_advise(ary, advice, device=None)\n--\n\n"
"cuMemAdvise over a managed array's bytes.  ``advice``: 'read_mostly',\n"
"'preferred_location', 'accessed_by' or their 'unset_' forms;\n"
"``device`` as for prefetch.");

static PyObject *
cm_managed_advise_fn(PyObject *mod, PyObject *const *args,
                     Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *kwl[3] = {cm_hm_kw[KW_ARY], cm_hm_kw[KW_ADVICE],
                        cm_hm_kw[KW_DEVICE]};
    PyObject *p[3];
    cm_hostmem *m;
    CUmemLocation loc;
    CUmem_advise adv;
    uintptr_t lo = 0;
    size_t n = 0;
    int dev;

    (void)mod;
    if (cm_argparse("advise", args, nargs, kwnames, kwl, 3, 2, p) < 0
        || (m = cm_managed_range(p[0], &lo, &n)) == NULL
        || cm_advice_arg(p[1], &adv) < 0
        || cm_location_arg(p[2], m, &loc, &dev) < 0
        || cm_context_activate(m->ctx) < 0) {
        return NULL;
    }
    if (n > 0 && CM_CU(MemAdvise, ((CUdeviceptr)lo, n, adv, loc)) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef cm_managed_functions[] = {
    {"_managed_prefetch", (PyCFunction)(void (*)(void))cm_managed_prefetch_fn,
     METH_FASTCALL | METH_KEYWORDS, cm_managed_prefetch_doc},
    {"_managed_advise", (PyCFunction)(void (*)(void))cm_managed_advise_fn,
     METH_FASTCALL | METH_KEYWORDS, cm_managed_advise_doc},
    {NULL, NULL, 0, NULL},
};

int
cm_managed_add_functions(PyObject *mod)
{
    return PyModule_AddFunctions(mod, cm_managed_functions);
}
