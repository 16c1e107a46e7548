/* SPDX-License-Identifier: MIT */
/*
 * memory/clients.c: the bytes each library (CuPy, PyTorch, numba) holds
 * through cudamem's adapters on each device, behind memory_stats()'s
 * "by_client" and the out-of-memory message.  interop.c's owners of
 * those allocations add and remove their bytes; the out-of-memory path
 * (limit.c) and memory_stats() read them here.  No driver call.
 *
 * Locks and the GIL: no lock; the GIL guards the counters.  PyTorch's
 * lane bytes, which interop.c counts without the GIL, are read atomically.
 */
#include "memory/memory.h"
#include "memory/clients.h"

const char *const cm_client_names[CM_CLIENT_N] = {
    "cupy", "torch", "numba",
};

/* [device][client]: bytes held by live ClientAllocations.  NOTE: guarded
 * by the GIL. */
size_t cm_client_bytes[CM_MAX_DEVICES][CM_CLIENT_N];

/* The bytes client holds on device id, whose current context is ctx:
 * its ClientAllocations', and with lane, for PyTorch, those of ctx's
 * lane (which memory_stats()'s st_bytes does not count). */
static size_t
cm_client_held(cm_context *ctx, int id, int client, int lane)
{
    size_t held = id >= 0 && id < CM_MAX_DEVICES ? cm_client_bytes[id][client]
                                                 : 0;

    if (lane && client == CM_CLIENT_TORCH) {
        held += __atomic_load_n(&ctx->lane_bytes, __ATOMIC_RELAXED);
    }
    return held;
}

PyObject *
cm_interop_by_client(cm_context *ctx)
{
    PyObject *d = PyDict_New();
    PyObject *v;
    size_t tagged = 0;
    size_t held;
    int id = ctx->device->id;
    int i;

    if (d == NULL) {
        return NULL;
    }
    for (i = 0; i < CM_CLIENT_N; i++) {
        tagged += cm_client_held(ctx, id, i, 0);
    }
    v = PyLong_FromSize_t(ctx->st_bytes > tagged ? ctx->st_bytes - tagged
                                                 : 0);
    if (v == NULL || PyDict_SetItemString(d, "cudamem", v) < 0) {
        goto err;
    }
    Py_DECREF(v);
    for (i = 0; i < CM_CLIENT_N; i++) {
        held = cm_client_held(ctx, id, i, 1);
        v = PyLong_FromSize_t(held);
        if (v == NULL || PyDict_SetItemString(d, cm_client_names[i], v) < 0) {
            goto err;
        }
        Py_DECREF(v);
    }
    return d;

err:
    Py_XDECREF(v);
    Py_DECREF(d);
    return NULL;
}

int
cm_interop_oom_note(cm_context *ctx, PyObject *exc)
{
    PyObject *by = cm_interop_by_client(ctx);
    PyObject *msg = NULL;
    PyObject *note = NULL;
    PyObject *parts = NULL;
    PyObject *sep = NULL;
    PyObject *joined = NULL;
    int id = ctx->device->id;
    int any = 0;
    int r = -1;
    int i;

    if (by == NULL || PyObject_SetAttrString(exc, "by_client", by) < 0) {
        goto out;
    }
    parts = PyList_New(0);
    if (parts == NULL) {
        goto out;
    }
    for (i = 0; i < CM_CLIENT_N; i++) {
        size_t held = cm_client_held(ctx, id, i, 1);
        PyObject *s;

        if (held == 0) {
            continue;
        }
        any = 1;
        s = PyUnicode_FromFormat("%s %zu bytes", cm_client_names[i], held);
        if (s == NULL || PyList_Append(parts, s) < 0) {
            Py_XDECREF(s);
            goto out;
        }
        Py_DECREF(s);
    }
    if (!any) {
        r = 0;
        goto out;
    }
    msg = PyObject_GetAttrString(exc, "msg");
    sep = PyUnicode_FromString(", ");
    if (msg == NULL || sep == NULL) {
        goto out;
    }
    joined = PyUnicode_Join(sep, parts);
    if (joined == NULL) {
        goto out;
    }
    note = PyUnicode_FromFormat("%U; held through cudamem by other "
                                "libraries: %U", msg, joined);
    if (note == NULL || PyObject_SetAttrString(exc, "msg", note) < 0) {
        goto out;
    }
    r = 0;

out:
    Py_XDECREF(by);
    Py_XDECREF(msg);
    Py_XDECREF(note);
    Py_XDECREF(parts);
    Py_XDECREF(sep);
    Py_XDECREF(joined);
    return r;
}
