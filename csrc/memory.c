/* SPDX-License-Identifier: MIT */
/*
 * memory.c: the allocation path and the owner objects of device memory.
 *
 * Owns AutoFreePointer, the reference-counted C object that owns one
 * device allocation made by cudamem's default memory manager.  Arrays and
 * their views hold a strong reference to it; when the last one goes the
 * allocation is freed in its context (never twice, never after the
 * context was closed or reset).  Out-of-memory on allocation is retried
 * once after a full garbage collection, which releases arrays kept alive
 * only by reference cycles.
 *
 * Locking: none of its own; everything runs with the GIL held, except the
 * driver calls, which release it.
 */
#include "cm.h"

/* Run fn with ctx current on this thread, pushing it only if needed. */
static CUresult
cm_free_in_context(cm_context *ctx, CUdeviceptr p)
{
    CUcontext cur = NULL;
    CUcontext popped;
    CUresult rc;

    if (cm_cu.MemFree == NULL) {
        return cm_cu_missing;
    }
    if (cm_cu.CtxGetCurrent(&cur) == CUDA_SUCCESS && cur == ctx->handle) {
        return cm_cu.MemFree(p);
    }
    rc = cm_cu.CtxPushCurrent(ctx->handle);
    if (rc != CUDA_SUCCESS) {
        return rc;
    }
    rc = cm_cu.MemFree(p);
    (void)cm_cu.CtxPopCurrent(&popped);
    return rc;
}

static int
cm_mem_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(((cm_mem *)self)->ctx);
    return 0;
}

/* Free the allocation now, once; 0 or -1 with an exception set. */
static int
cm_mem_release(cm_mem *m)
{
    CUdeviceptr p = m->ptr;
    CUresult rc = CUDA_SUCCESS;

    if (m->freed) {
        return 0;
    }
    m->freed = 1;
    if (p == 0 || !m->ctx->alive || cm_forked) {
        return 0;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = cm_free_in_context(m->ctx, p);
    Py_END_ALLOW_THREADS
    return cm_cu_check(rc, "cuMemFree");
}

static void
cm_mem_dealloc(PyObject *self)
{
    cm_mem *m = (cm_mem *)self;
    PyTypeObject *tp = Py_TYPE(self);
    PyObject *exc = PyErr_GetRaisedException();

    PyObject_GC_UnTrack(self);
    if (m->weakreflist != NULL) {
        PyObject_ClearWeakRefs(self);
    }
    if (!Py_IsFinalizing() && cm_mem_release(m) < 0) {
        PyErr_WriteUnraisable(self);
    }
    Py_CLEAR(m->ctx);
    tp->tp_free(self);
    Py_DECREF(tp);
    PyErr_SetRaisedException(exc);
}

PyObject *
cm_mem_alloc(cm_context *ctx, size_t size)
{
    CUdeviceptr p = 0;
    CUresult rc;
    cm_mem *m;
    PyObject *r;
    int attempt;

    if (cm_context_activate(ctx) < 0) {
        return NULL;
    }
    for (attempt = 0;; attempt++) {
        Py_BEGIN_ALLOW_THREADS
        rc = CM_CU_RAW(MemAlloc, (&p, size));
        Py_END_ALLOW_THREADS
        if (rc != CUDA_ERROR_OUT_OF_MEMORY || attempt > 0) {
            break;
        }
        /* Arrays held only by reference cycles free their memory. */
        r = PyImport_ImportModule("gc");
        if (r != NULL) {
            Py_SETREF(r, PyObject_CallMethod(r, "collect", NULL));
        }
        if (r == NULL) {
            return NULL;
        }
        Py_DECREF(r);
    }
    if (cm_cu_check(rc, "cuMemAlloc") < 0) {
        return NULL;
    }
    m = PyObject_GC_New(cm_mem, cm_st->Mem_type);
    if (m == NULL) {
        (void)CM_CU_RAW(MemFree, (p));
        return NULL;
    }
    m->ctx = (cm_context *)Py_NewRef(ctx);
    m->ptr = p;
    m->size = size;
    m->freed = 0;
    m->weakreflist = NULL;
    PyObject_GC_Track(m);
    return (PyObject *)m;
}

static PyObject *
cm_mem_get_ptr(PyObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromUnsignedLongLong(((cm_mem *)self)->ptr);
}

static PyObject *
cm_mem_get_ptr_value(PyObject *self, void *unused)
{
    cm_mem *m = (cm_mem *)self;

    (void)unused;
    if (m->ptr == 0) {
        Py_RETURN_NONE;
    }
    return PyLong_FromUnsignedLongLong(m->ptr);
}

static PyObject *
cm_mem_get_size(PyObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromSize_t(((cm_mem *)self)->size);
}

static PyObject *
cm_mem_get_context(PyObject *self, void *unused)
{
    (void)unused;
    return Py_NewRef(((cm_mem *)self)->ctx);
}

PyDoc_STRVAR(cm_mem_free_doc,
"free($self, /)\n--\n\n"
"Free the allocation now.  Arrays that still use it are left dangling: "
"only call this when nothing refers to the memory any more.");

static PyObject *
cm_mem_free(PyObject *self, PyObject *unused)
{
    cm_mem *m = (cm_mem *)self;

    (void)unused;
    if (m->freed) {
        PyErr_SetString(PyExc_RuntimeError, "Freeing dead memory");
        return NULL;
    }
    if (cm_mem_release(m) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyGetSetDef cm_mem_getset[] = {
    {"device_pointer", cm_mem_get_ptr, NULL,
     "The device address, as an int.", NULL},
    {"handle", cm_mem_get_ptr, NULL, "The device address, as an int.", NULL},
    {"device_pointer_value", cm_mem_get_ptr_value, NULL,
     "The device address, or None for a NULL pointer.", NULL},
    {"size", cm_mem_get_size, NULL, "The allocation's size in bytes.",
     NULL},
    {"context", cm_mem_get_context, NULL,
     "The Context the memory belongs to.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef cm_mem_methods[] = {
    {"free", cm_mem_free, METH_NOARGS, cm_mem_free_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef cm_mem_members[] = {
    {"__weaklistoffset__", Py_T_PYSSIZET, offsetof(cm_mem, weakreflist),
     Py_READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(cm_mem_doc,
"One device allocation of cudamem's default memory manager, freed when "
"the last array or view that uses it goes away.");

static PyType_Slot cm_mem_slots[] = {
    {Py_tp_doc, (void *)cm_mem_doc},
    {Py_tp_dealloc, cm_mem_dealloc},
    {Py_tp_traverse, cm_mem_traverse},
    {Py_tp_getset, cm_mem_getset},
    {Py_tp_methods, cm_mem_methods},
    {Py_tp_members, cm_mem_members},
    {0, NULL},
};

static PyType_Spec cm_mem_spec = {
    .name = "cudamem.AutoFreePointer",
    .basicsize = sizeof(cm_mem),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC
             | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = cm_mem_slots,
};

int
cm_memory_init(PyObject *mod, cm_state *st)
{
    st->Mem_type = (PyTypeObject *)PyType_FromModuleAndSpec(
        mod, &cm_mem_spec, NULL);
    if (st->Mem_type == NULL
        || PyModule_AddObjectRef(mod, "AutoFreePointer",
                                 (PyObject *)st->Mem_type) < 0) {
        return -1;
    }
    return 0;
}
