/* SPDX-License-Identifier: MIT */
/*
 * history.c: the memory history, a record of every allocation and free
 * of device, pinned, mapped and managed memory that cudamem makes for
 * its users (cudamem.memory_history / memory_snapshot).
 *
 * Owns:
 * - cm_hist_on, the flag the allocation and free paths of memory.c and
 *   hostmem.c test (one predictable branch while it is off);
 * - a ring buffer of the last max_entries events (the oldest are
 *   overwritten and counted as dropped), each with its time, action,
 *   kind, manager, device, stream, address and size, and, when stacks
 *   were asked for, the Python stack of the caller as a tuple of
 *   (filename, line, function) tuples, innermost first;
 * - _allocation_info, which reads a DeviceAllocation's fields for the
 *   snapshot's list of live blocks.
 *
 * Locks and the GIL: no lock; the GIL guards the flag, the ring and its
 * counters.  Every hook runs with the GIL held (deallocs on driver
 * callback threads take it first); PyTorch's lane, which runs without
 * the GIL, stays off while the history records (interop.c reads the
 * flag atomically).
 */
#include "memory/memory.h"

#include <time.h>

/* The most frames kept of one stack. */
#define CM_HIST_DEPTH 32

/* One recorded event. */
typedef struct {
    uint64_t seq;             /* 0, 1, ...: its place among all events */
    int64_t t_ns;             /* CLOCK_MONOTONIC, nanoseconds */
    uintptr_t addr;           /* host address (pinned, mapped) or device
                               * address (device, managed) */
    size_t size;              /* bytes the user asked for */
    uintptr_t stream;         /* the stream handle it was made for */
    int action;               /* CM_HIST_ALLOC, _FREE or _OOM */
    int kind;                 /* CM_HIST_DEVICE, ... */
    int manager;              /* the context's CM_MM_* */
    int device;               /* device ordinal */
    PyObject *stack;          /* strong or NULL */
} cm_hist_entry;

/* NOTE: guarded by the GIL. */
int cm_hist_on;
static int cm_hist_stacks;            /* capture Python stacks */
static cm_hist_entry *cm_hist_ring;   /* cm_hist_cap entries */
static size_t cm_hist_cap;
static uint64_t cm_hist_total;        /* events recorded since enabled */

static const char *const cm_hist_actions[] = {"alloc", "free", "oom"};
static const char *const cm_hist_kinds[] = {"device", "pinned", "mapped",
                                            "managed"};
static const char *const cm_hist_managers[] = {"default", "plugin", "pool",
                                               "async"};

static int64_t
cm_hist_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The caller's Python stack, innermost first; NULL (and no exception)
 * when there is none or it cannot be built. */
static PyObject *
cm_hist_stack(void)
{
    PyObject *frames[CM_HIST_DEPTH];
    PyFrameObject *f = PyEval_GetFrame();
    PyObject *t = NULL;
    int n = 0;
    int i;

    Py_XINCREF(f);
    while (f != NULL && n < CM_HIST_DEPTH) {
        PyCodeObject *co = PyFrame_GetCode(f);
        PyFrameObject *back = PyFrame_GetBack(f);
        PyObject *item = Py_BuildValue("(OiO)", co->co_filename,
                                       PyFrame_GetLineNumber(f),
                                       co->co_name);

        Py_DECREF(co);
        Py_DECREF(f);
        f = back;
        if (item == NULL) {
            break;
        }
        frames[n++] = item;
    }
    Py_XDECREF(f);
    if (!PyErr_Occurred()) {
        t = PyTuple_New(n);
    }
    for (i = 0; i < n; i++) {
        if (t != NULL) {
            PyTuple_SET_ITEM(t, i, frames[i]);   /* steals */
        }
        else {
            Py_DECREF(frames[i]);
        }
    }
    if (t == NULL) {
        PyErr_Clear();
    }
    return t;
}

void
cm_hist_record(int action, int kind, cm_context *ctx, uintptr_t stream,
               uintptr_t addr, size_t size)
{
    cm_hist_entry *e;
    PyObject *exc;
    PyObject *stack = NULL;

    if (cm_hist_ring == NULL || cm_hist_cap == 0) {
        return;
    }
    if (cm_hist_stacks) {
        exc = PyErr_GetRaisedException();
        stack = cm_hist_stack();
        PyErr_SetRaisedException(exc);
    }
    e = &cm_hist_ring[cm_hist_total % cm_hist_cap];
    Py_XSETREF(e->stack, stack);
    e->seq = cm_hist_total++;
    e->t_ns = cm_hist_now();
    e->addr = addr;
    e->size = size;
    e->stream = stream;
    e->action = action;
    e->kind = kind;
    e->manager = ctx != NULL ? ctx->mm->kind : CM_MM_DEFAULT;
    e->device = ctx != NULL && ctx->device != NULL ? ctx->device->id : -1;
}

/* Drop the ring and its stacks. */
static void
cm_hist_free_ring(void)
{
    cm_hist_entry *r = cm_hist_ring;
    size_t n = cm_hist_cap;
    size_t i;

    cm_hist_ring = NULL;
    cm_hist_cap = 0;
    cm_hist_total = 0;
    if (r == NULL) {
        return;
    }
    for (i = 0; i < n; i++) {
        Py_XDECREF(r[i].stack);
    }
    PyMem_Free(r);
}

PyDoc_STRVAR(cm_history_enable_doc,
"_history_enable(enabled, stacks, max_entries)\n--\n\n"
"Turn the memory history on (starting a fresh record of at most\n"
"max_entries events) or off (keeping what was recorded).");

static PyObject *
cm_history_enable_fn(PyObject *mod, PyObject *args)
{
    int on;
    int stacks;
    Py_ssize_t cap;
    cm_hist_entry *r;

    (void)mod;
    if (!PyArg_ParseTuple(args, "ppn:_history_enable", &on, &stacks,
                          &cap)) {
        return NULL;
    }
    if (!on) {
        cm_hist_on = 0;
        Py_RETURN_NONE;
    }
    if (cap <= 0 || (size_t)cap > PY_SSIZE_T_MAX / sizeof(*r)) {
        PyErr_Format(PyExc_ValueError,
                     "max_entries must be a positive number of entries, "
                     "not %zd", cap);
        return NULL;
    }
    r = PyMem_Calloc((size_t)cap, sizeof(*r));
    if (r == NULL) {
        return PyErr_NoMemory();
    }
    cm_hist_on = 0;
    cm_hist_free_ring();
    cm_hist_ring = r;
    cm_hist_cap = (size_t)cap;
    cm_hist_stacks = stacks;
    cm_hist_on = 1;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cm_history_state_doc,
"_history_state()\n--\n\n"
"A dict: enabled, stacks, max_entries, recorded (events since enabled),\n"
"dropped (overwritten by newer ones) and now_ns (CLOCK_MONOTONIC, the\n"
"clock of the entries' times).");

static PyObject *
cm_history_state_fn(PyObject *mod, PyObject *unused)
{
    uint64_t dropped = cm_hist_total > cm_hist_cap
                           ? cm_hist_total - cm_hist_cap : 0;

    (void)mod;
    (void)unused;
    return Py_BuildValue("{sOsOsnsKsKsL}",
                         "enabled", cm_hist_on ? Py_True : Py_False,
                         "stacks", cm_hist_stacks ? Py_True : Py_False,
                         "max_entries", (Py_ssize_t)cm_hist_cap,
                         "recorded", (unsigned long long)cm_hist_total,
                         "dropped", (unsigned long long)dropped,
                         "now_ns", (long long)cm_hist_now());
}

PyDoc_STRVAR(cm_history_entries_doc,
"_history_entries()\n--\n\n"
"The recorded events, oldest first: a list of tuples (seq, time_ns,\n"
"action, kind, manager, device, stream, address, size, stack), stack\n"
"None unless stacks were captured.");

static PyObject *
cm_history_entries_fn(PyObject *mod, PyObject *unused)
{
    uint64_t first = cm_hist_total > cm_hist_cap
                         ? cm_hist_total - cm_hist_cap : 0;
    size_t n = (size_t)(cm_hist_total - first);
    cm_hist_entry *copy;
    PyObject *list = NULL;
    size_t i;

    (void)mod;
    (void)unused;
    /* Copied out first: building the tuples may run the garbage
     * collector, whose frees record new events over the ring. */
    copy = PyMem_RawMalloc(n > 0 ? n * sizeof(*copy) : 1);
    if (copy == NULL) {
        return PyErr_NoMemory();
    }
    for (i = 0; i < n; i++) {
        copy[i] = cm_hist_ring[(first + i) % cm_hist_cap];
        Py_XINCREF(copy[i].stack);
    }
    list = PyList_New((Py_ssize_t)n);
    for (i = 0; list != NULL && i < n; i++) {
        const cm_hist_entry *e = &copy[i];
        int mgr = e->manager >= 0 && e->manager < 4 ? e->manager : 0;
        PyObject *t = Py_BuildValue(
            "(KLsssiKKnO)", (unsigned long long)e->seq, (long long)e->t_ns,
            cm_hist_actions[e->action], cm_hist_kinds[e->kind],
            cm_hist_managers[mgr], e->device,
            (unsigned long long)e->stream, (unsigned long long)e->addr,
            (Py_ssize_t)e->size, e->stack != NULL ? e->stack : Py_None);

        if (t == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, t);   /* steals */
    }
    for (i = 0; i < n; i++) {
        Py_XDECREF(copy[i].stack);
    }
    PyMem_RawFree(copy);
    return list;
}

PyDoc_STRVAR(cm_allocation_info_doc,
"_allocation_info(obj)\n--\n\n"
"For a DeviceAllocation not yet freed: (address, size, manager, stream,\n"
"device); None for anything else.");

static PyObject *
cm_allocation_info_fn(PyObject *mod, PyObject *obj)
{
    cm_mem *m;
    int mgr;

    (void)mod;
    if (!Py_IS_TYPE(obj, cm_st->Mem_type)) {
        Py_RETURN_NONE;
    }
    m = (cm_mem *)obj;
    if (m->freed || m->ctx == NULL) {
        Py_RETURN_NONE;
    }
    mgr = m->mm->kind >= 0 && m->mm->kind < 4 ? m->mm->kind : 0;
    return Py_BuildValue("(KnsKi)", (unsigned long long)m->ptr,
                         (Py_ssize_t)m->size, cm_hist_managers[mgr],
                         (unsigned long long)(uintptr_t)m->stream,
                         m->ctx->device != NULL ? m->ctx->device->id : -1);
}

PyDoc_STRVAR(cm_live_contexts_doc,
"_live_contexts()\n--\n\n"
"The Contexts alive now (not closed or reset), as a list.");

static PyObject *
cm_live_contexts_fn(PyObject *mod, PyObject *unused)
{
    cm_context *live[CM_MAX_DEVICES];
    int n = cm_context_live(live);
    PyObject *list = PyList_New(0);
    int i;

    (void)mod;
    (void)unused;
    for (i = 0; list != NULL && i < n; i++) {
        if (PyList_Append(list, (PyObject *)live[i]) < 0) {
            Py_CLEAR(list);
        }
    }
    return list;
}

static PyMethodDef cm_history_functions[] = {
    {"_live_contexts", cm_live_contexts_fn, METH_NOARGS,
     cm_live_contexts_doc},
    {"_history_enable", cm_history_enable_fn, METH_VARARGS,
     cm_history_enable_doc},
    {"_history_state", cm_history_state_fn, METH_NOARGS,
     cm_history_state_doc},
    {"_history_entries", cm_history_entries_fn, METH_NOARGS,
     cm_history_entries_doc},
    {"_allocation_info", cm_allocation_info_fn, METH_O,
     cm_allocation_info_doc},
    {NULL, NULL, 0, NULL},
};

int
cm_history_init(PyObject *mod, cm_state *st)
{
    (void)st;
    return PyModule_AddFunctions(mod, cm_history_functions);
}
