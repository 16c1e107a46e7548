/* SPDX-License-Identifier: MIT */
/*
 * context/argparse.c: the arguments the stream, event and graph calls
 * share: binding METH_FASTCALL | METH_KEYWORDS arguments to names
 * (cm_bind_args) and resolving a stream argument (cm_stream_resolve,
 * with cm_stream_handle_check for a handle that did not come from
 * cudamem).  It calls nothing else of the folder; every file of streams,
 * events and graphs, and the layers above, call it.
 */
#include "context/stream.h"

#include <errno.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/uio.h>

/* ------------------------------------------------------------------ */
/* Argument binding                                                    */
/* ------------------------------------------------------------------ */

/* Bind METH_FASTCALL | METH_KEYWORDS arguments to names (interned).
 * out[i] receives a borrowed reference, or keeps what the caller preset
 * (a default, or NULL for a required argument).  The first nrequired names
 * are required.  0, or -1 with TypeError. */
int
cm_bind_args(const char *fname, PyObject *const *args, Py_ssize_t nargs,
             PyObject *kwnames, PyObject *const *names, Py_ssize_t nnames,
             Py_ssize_t nrequired, PyObject **out)
{
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    Py_ssize_t i;
    Py_ssize_t j;
    PyObject *key;

    if (nargs > nnames) {
        PyErr_Format(PyExc_TypeError,
                     "%s() takes at most %zd argument%s (%zd given)",
                     fname, nnames, nnames == 1 ? "" : "s", nargs);
        return -1;
    }
    for (i = 0; i < nargs; i++) {
        out[i] = args[i];
    }
    for (j = 0; j < nkw; j++) {
        key = PyTuple_GET_ITEM(kwnames, j);
        for (i = 0; i < nnames; i++) {
            if (key == names[i] || PyUnicode_Compare(key, names[i]) == 0) {
                break;
            }
        }
        if (i == nnames) {
            PyErr_Format(PyExc_TypeError,
                         "%s() got an unexpected keyword argument '%U'",
                         fname, key);
            return -1;
        }
        if (i < nargs) {
            PyErr_Format(PyExc_TypeError,
                         "%s() got multiple values for argument '%U'",
                         fname, key);
            return -1;
        }
        out[i] = args[nargs + j];
    }
    for (i = 0; i < nrequired; i++) {
        if (out[i] == NULL) {
            PyErr_Format(PyExc_TypeError,
                         "%s() missing required argument '%U'", fname,
                         names[i]);
            return -1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Stream arguments                                                    */
/* ------------------------------------------------------------------ */

/* NOTE: guarded by the GIL.  Handles that passed the check lately: the
 * check is a system call (a microsecond or more), and a foreign stream
 * object is often passed to call after call. */
#define CM_HANDLES_OK 4
static uintptr_t cm_handles_ok[CM_HANDLES_OK];
static unsigned cm_handles_next;

int
cm_stream_handle_check(uintptr_t h, const char *what)
{
    char byte[sizeof(void *)];
    struct iovec local = {byte, sizeof(byte)};
    struct iovec remote = {(void *)h, sizeof(byte)};
    ssize_t n;
    int i;

    if (h <= (uintptr_t)CU_STREAM_PER_THREAD) {
        return 0;
    }
    for (i = 0; i < CM_HANDLES_OK; i++) {
        if (cm_handles_ok[i] == h) {
            return 0;
        }
    }
    if (h % sizeof(void *) != 0) {
        goto bad;
    }
    /* Reading through the kernel fails with EFAULT instead of faulting. */
    n = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
    if (n == (ssize_t)sizeof(byte)) {
        cm_handles_ok[cm_handles_next++ % CM_HANDLES_OK] = h;
        return 0;
    }
    if (n < 0 && (errno == ENOSYS || errno == EPERM)) {
        /* Reading one's own memory is forbidden here: ask only whether
         * the page is mapped. */
        long pg = sysconf(_SC_PAGESIZE);
        unsigned char vec;

        if (pg > 0 && mincore((void *)(h & ~(uintptr_t)(pg - 1)),
                              (size_t)pg, &vec) == 0) {
            cm_handles_ok[cm_handles_next++ % CM_HANDLES_OK] = h;
            return 0;
        }
    }
bad:
    PyErr_Format(PyExc_ValueError,
                 "%s: %p is not a stream handle (no stream object can be "
                 "at that address)", what, (void *)h);
    return -1;
}

int
cm_stream_resolve(PyObject *obj, CUstream *handle)
{
    PyObject *meth;
    PyObject *t;
    unsigned long long h;
    int overflow;

    /* None and 0 first: the streams of most calls (no type walk for
     * them). */
    *handle = 0;
    if (obj == Py_None || obj == Py_False || obj == cm_st->zero) {
        return 0;
    }
    if (PyLong_CheckExact(obj)
        && PyLong_AsLongAndOverflow(obj, &overflow) == 0 && !overflow) {
        return 0;
    }
    if (cm_stream_check(obj)) {
        cm_stream *s = (cm_stream *)obj;

        /* A stream of a closed context names a destroyed driver stream:
         * the driver would read freed memory. */
        if (!s->ctx->alive && s->handle != NULL
            && s->handle != CU_STREAM_LEGACY
            && s->handle != CU_STREAM_PER_THREAD) {
            *handle = 0;
            PyErr_SetString(PyExc_ValueError,
                            "the stream belongs to a closed context");
            return -1;
        }
        *handle = s->handle;
        return 1;
    }
    if (PyObject_GetOptionalAttr(obj, cm_str_cuda_stream, &meth) < 0) {
        return -1;
    }
    if (meth == NULL) {
        PyErr_Format(PyExc_TypeError,
                     "Expected a Stream object or 0, got %.100s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    t = PyObject_CallNoArgs(meth);
    Py_DECREF(meth);
    if (t == NULL) {
        return -1;
    }
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 2
        || !PyLong_Check(PyTuple_GET_ITEM(t, 1))) {
        Py_DECREF(t);
        PyErr_Format(PyExc_TypeError,
                     "%.100s.__cuda_stream__() must return (version, "
                     "handle)", Py_TYPE(obj)->tp_name);
        return -1;
    }
    h = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, 1));
    Py_DECREF(t);
    if ((h == (unsigned long long)-1 && PyErr_Occurred())
        || cm_stream_handle_check((uintptr_t)h, "__cuda_stream__()") < 0) {
        return -1;
    }
    *handle = (CUstream)(uintptr_t)h;
    return 1;
}
