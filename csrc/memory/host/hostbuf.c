/* SPDX-License-Identifier: MIT */
/*
 * memory/host/hostbuf.c: control of the pinned pool, and HostBuffer, the
 * buffer side of the Python pointer classes.
 */
#include "memory/host/host.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* Pool control                                                        */
/* ------------------------------------------------------------------ */

PyDoc_STRVAR(cm_pinned_pool_trim_doc,
"pinned_pool_trim(device=None)\n--\n\n"
"Give every free block of the pinned pool of ``device`` (default: the\n"
"current one) back to the driver now.");

static PyObject *
cm_pinned_pool_trim_fn(PyObject *mod, PyObject *const *args,
                       Py_ssize_t nargs)
{
    cm_context *ctx;

    (void)mod;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError,
                        "pinned_pool_trim() takes at most one argument");
        return NULL;
    }
    ctx = (nargs == 1 && args[0] != Py_None)
              ? cm_context_of_device(args[0]) : cm_context_current();
    if (ctx == NULL || cm_hpool_trim(ctx) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cm_pinned_pool_stats_doc,
"pinned_pool_stats(device=None)\n--\n\n"
"The pinned pool of ``device`` (default: the current one): a dict with\n"
"enabled, limit_bytes (most free bytes kept), reserved_bytes (in blocks\n"
"made, in use or free), free_bytes, hits and misses.");

static PyObject *
cm_pinned_pool_stats_fn(PyObject *mod, PyObject *const *args,
                        Py_ssize_t nargs)
{
    cm_context *ctx;
    cm_hpool *p;
    cm_hpool none;

    (void)mod;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError,
                        "pinned_pool_stats() takes at most one argument");
        return NULL;
    }
    ctx = (nargs == 1 && args[0] != Py_None)
              ? cm_context_of_device(args[0]) : cm_context_current();
    if (ctx == NULL) {
        return NULL;
    }
    p = cm_hpool_of(ctx);
    if (p == NULL) {
        memset(&none, 0, sizeof(none));
        p = &none;
    }
    return Py_BuildValue("{sOsnsnsnsnsn}",
                         "enabled", cm_hpool_on ? Py_True : Py_False,
                         "limit_bytes", (Py_ssize_t)cm_hpool_cap,
                         "reserved_bytes", (Py_ssize_t)p->reserved,
                         "free_bytes", (Py_ssize_t)p->free_bytes,
                         "hits", (Py_ssize_t)p->hits,
                         "misses", (Py_ssize_t)p->misses);
}

PyDoc_STRVAR(cm_pinned_pool_enable_doc,
"_pinned_pool_enable(enabled, limit=None)\n--\n\n"
"Turn the pinned pool on or off for later allocations (blocks in use\n"
"return to it either way); ``limit``: the most free bytes it keeps.\n"
"Returns whether it was on.");

static PyObject *
cm_pinned_pool_enable_fn(PyObject *mod, PyObject *args)
{
    int on;
    PyObject *limit = Py_None;
    int old = cm_hpool_on;

    (void)mod;
    if (!PyArg_ParseTuple(args, "p|O:_pinned_pool_enable", &on, &limit)) {
        return NULL;
    }
    if (limit != Py_None) {
        Py_ssize_t v = PyNumber_AsSsize_t(limit, PyExc_OverflowError);

        if (v == -1 && PyErr_Occurred()) {
            return NULL;
        }
        if (v < 0) {
            PyErr_SetString(PyExc_ValueError, "limit must not be negative");
            return NULL;
        }
        cm_hpool_cap = (size_t)v;
    }
    cm_hpool_on = on;
    return PyBool_FromLong(old);
}

static PyMethodDef cm_hostmem_functions[] = {
    {"pinned_pool_trim", (PyCFunction)(void (*)(void))cm_pinned_pool_trim_fn,
     METH_FASTCALL, cm_pinned_pool_trim_doc},
    {"pinned_pool_stats",
     (PyCFunction)(void (*)(void))cm_pinned_pool_stats_fn, METH_FASTCALL,
     cm_pinned_pool_stats_doc},
    {"_pinned_pool_enable", cm_pinned_pool_enable_fn, METH_VARARGS,
     cm_pinned_pool_enable_doc},
    {NULL, NULL, 0, NULL},
};

/* The pool's limit on free bytes: CUDAMEM_PINNED_POOL_LIMIT (bytes, with
 * an optional K, M or G suffix: powers of 1024), else the smaller of
 * 1 GiB and 1/16 of the host's physical memory.  (The driver pins
 * cuMemHostAlloc memory itself: RLIMIT_MEMLOCK does not bound it.) */
static size_t
cm_pool_default_cap(void)
{
    const char *v = getenv("CUDAMEM_PINNED_POOL_LIMIT");
    size_t cap = (size_t)1 << 30;
    long pages = sysconf(_SC_PHYS_PAGES);
    long psize = sysconf(_SC_PAGESIZE);
    unsigned long long n;
    char *end;

    if (v != NULL && v[0] >= '0' && v[0] <= '9') {
        n = strtoull(v, &end, 10);
        switch (*end) {
        case 'k': case 'K': n <<= 10; end++; break;
        case 'm': case 'M': n <<= 20; end++; break;
        case 'g': case 'G': n <<= 30; end++; break;
        default: break;
        }
        if (*end == '\0') {
            return (size_t)n;
        }
    }
    if (pages > 0 && psize > 0
        && (size_t)pages / 16 * (size_t)psize < cap) {
        cap = (size_t)pages / 16 * (size_t)psize;
    }
    return cap;
}

/* ------------------------------------------------------------------ */
/* HostBuffer: the buffer side of the Python pointer classes           */
/* ------------------------------------------------------------------ */

/* Make a type from spec and add it to mod; 0 or -1. */
static int
cm_add_type(PyObject *mod, PyType_Spec *spec)
{
    PyObject *tp = PyType_FromModuleAndSpec(mod, spec, NULL);
    int r;

    if (tp == NULL) {
        return -1;
    }
    r = PyModule_AddObjectRef(mod, strchr(spec->name, '.') + 1, tp);
    Py_DECREF(tp);
    return r;
}

/* A base class whose instances export a writable buffer over the host
 * bytes [self._buffer_address, + self.size): numba's PinnedMemory,
 * MappedMemory and ManagedMemory (cudamem/_pointers.py) and their owned
 * proxies derive from it, so that np.ndarray(buffer=ptr) and
 * memoryview(ptr) work on every supported Python (PEP 688's __buffer__
 * needs 3.12).  The object must keep the memory alive. */
static int
cm_hbuf_getbuffer(PyObject *self, Py_buffer *view, int flags)
{
    uintptr_t addr = 0;
    uintptr_t size = 0;

    if (cm_pointer_attr(self, "_buffer_address", &addr) < 0
        || cm_pointer_attr(self, "size", &size) < 0) {
        return -1;
    }
    if (size > (uintptr_t)PY_SSIZE_T_MAX || (addr == 0 && size != 0)) {
        PyErr_SetString(PyExc_BufferError,
                        "host buffer has no memory or an invalid size");
        return -1;
    }
    return PyBuffer_FillInfo(view, self, (void *)addr, (Py_ssize_t)size, 0,
                             flags);
}

static PyType_Slot cm_hbuf_slots[] = {
    {Py_tp_doc, (void *)"Base of the host-visible pointer classes: a "
                        "buffer over _buffer_address and size."},
    {Py_bf_getbuffer, cm_hbuf_getbuffer},
    {0, NULL},
};

static PyType_Spec cm_hbuf_spec = {
    .name = "cudamem._HostBuffer",
    .basicsize = sizeof(PyObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .slots = cm_hbuf_slots,
};

/* In a fork's child the registry's lock may be one another parent
 * thread held (it is held across cuMemHostRegister): a fresh one.  The
 * old one is left as it is (it may be taken). */
static void
cm_reg_atfork_child(void)
{
    PyThread_type_lock l = PyThread_allocate_lock();

    if (l != NULL) {
        cm_reg_lock = l;
    }
}

int
cm_hostmem_init(PyObject *mod, cm_state *st)
{
    const char *v = getenv("CUDAMEM_PINNED_POOL");
    int i;

    /* A flag, as cudamem.config checks it: 1/0, true/false, yes/no,
     * on/off; unset or empty: on. */
    cm_hpool_on = v == NULL || v[0] == '\0'
                  || (strcmp(v, "0") != 0 && strcasecmp(v, "false") != 0
                      && strcasecmp(v, "no") != 0
                      && strcasecmp(v, "off") != 0);
    cm_hpool_cap = cm_pool_default_cap();
    if (cm_reg_lock == NULL) {
        cm_reg_lock = PyThread_allocate_lock();
        if (cm_reg_lock == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        if (cm_atfork_child_add(cm_reg_atfork_child) < 0) {
            return -1;
        }
    }
    for (i = 0; i < KW_N; i++) {
        cm_hm_kw[i] = PyUnicode_InternFromString(cm_hm_kw_text[i]);
        if (cm_hm_kw[i] == NULL) {
            return -1;
        }
    }
    st->HostMem_type = (PyTypeObject *)PyType_FromModuleAndSpec(
        mod, &cm_hm_spec, NULL);
    if (st->HostMem_type == NULL
        || PyModule_AddObjectRef(mod, "HostAllocation",
                                 (PyObject *)st->HostMem_type) < 0) {
        return -1;
    }
    st->HostRegistration_type = (PyTypeObject *)PyType_FromModuleAndSpec(
        mod, &cm_reg_spec, NULL);
    if (st->HostRegistration_type == NULL
        || PyModule_AddObjectRef(mod, "HostRegistration",
                                 (PyObject *)st->HostRegistration_type)
           < 0) {
        return -1;
    }
    if (cm_add_type(mod, &cm_hbuf_spec) < 0) {
        return -1;
    }
    if (cm_hostmem_add_functions(mod) < 0 || cm_hostreg_add_functions(mod) < 0
        || cm_managed_add_functions(mod) < 0
        || cm_hostclose_add_functions(mod) < 0) {
        return -1;
    }
    return PyModule_AddFunctions(mod, cm_hostmem_functions);
}
