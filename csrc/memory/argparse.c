/* SPDX-License-Identifier: MIT */
/*
 * memory/argparse.c: the parser of METH_FASTCALL | METH_KEYWORDS
 * arguments against a list of interned names, used by the module
 * functions of this layer and the layers above (array/argparse.c adds
 * the array functions' shape, dtype, strides and order rules); and the
 * reader of a pointer object's address attributes (cm_pointer_attr),
 * which the managers and the owners of host and device memory share.
 */
#include "memory/memory.h"

int
cm_argparse(const char *fname, PyObject *const *args, Py_ssize_t nargs,
            PyObject *kwnames, PyObject *const *kwlist, int n, int nreq,
            PyObject **out)
{
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    Py_ssize_t k;
    int i;

    if (nargs > n) {
        PyErr_Format(PyExc_TypeError,
                     "%s() takes at most %d positional arguments (%zd "
                     "given)", fname, n, nargs);
        return -1;
    }
    for (i = 0; i < n; i++) {
        out[i] = i < nargs ? args[i] : NULL;
    }
    for (k = 0; k < nkw; k++) {
        PyObject *kw = PyTuple_GET_ITEM(kwnames, k);

        for (i = 0; i < n; i++) {
            if (kw == kwlist[i]) {
                break;
            }
        }
        if (i == n) {
            for (i = 0; i < n; i++) {
                if (PyUnicode_Compare(kw, kwlist[i]) == 0) {
                    break;
                }
            }
        }
        if (i == n) {
            PyErr_Format(PyExc_TypeError,
                         "%s() got an unexpected keyword argument '%U'",
                         fname, kw);
            return -1;
        }
        if (out[i] != NULL) {
            PyErr_Format(PyExc_TypeError,
                         "%s() got multiple values for argument '%U'",
                         fname, kw);
            return -1;
        }
        out[i] = args[nargs + k];
    }
    for (i = 0; i < nreq; i++) {
        if (out[i] == NULL) {
            PyErr_Format(PyExc_TypeError,
                         "%s() missing required argument '%U'", fname,
                         kwlist[i]);
            return -1;
        }
    }
    return 0;
}

/* An address attribute (device_pointer, host_pointer, ...) of a memory
 * pointer object, as plugins and foreign owners spell it: an int, None
 * (NULL), or an object with an int .value (ctypes).  0 or -1. */
int
cm_pointer_attr(PyObject *obj, const char *name, uintptr_t *out)
{
    PyObject *v = PyObject_GetAttrString(obj, name);
    unsigned long long u;

    if (v == NULL) {
        return -1;
    }
    if (!PyLong_Check(v) && v != Py_None) {
        Py_SETREF(v, PyObject_GetAttrString(v, "value"));
        if (v == NULL) {
            return -1;
        }
    }
    u = v == Py_None ? 0 : PyLong_AsUnsignedLongLong(v);
    Py_DECREF(v);
    if (u == (unsigned long long)-1 && PyErr_Occurred()) {
        return -1;
    }
    *out = (uintptr_t)u;
    return 0;
}
