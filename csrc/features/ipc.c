/* SPDX-License-Identifier: MIT */
/*
 * ipc.c: sharing device memory between processes (CUDA IPC).
 *
 * Owns the driver side of IPC and the state of the handle objects; the
 * picklable handle classes are Python (cudamem/_ipc.py) over two types of
 * this file:
 * - _IpcHandleBase and _IpcArrayHandleBase hold the attributes of
 *   IpcHandle (base, handle, size, source_info, offset) and IpcArrayHandle
 *   (_ipc_handle, _array_desc); the Python subclasses add the methods.  An
 *   export fills them from C values, and the Python objects that cost
 *   most to make (the base MemoryPointer, the _RawHandle, the source_info
 *   and array description dicts) are made on first read, once;
 * - DeviceNDArray.get_ipc_handle: for memory of the built-in managers (a
 *   DeviceAllocation), cuMemGetAddressRange and cuIpcGetMemHandle, then
 *   the two objects, with no Python call; for a plugin's memory (or memory
 *   cudamem did not allocate) cudamem._ipc._export_array, which asks the
 *   context's memory manager;
 * - _ipc_export(context, address): the allocation containing address and
 *   its handle, for any manager's memory (GetIpcHandleMixin): the handle
 *   always names the base allocation, and the caller keeps the offset of
 *   its view inside it;
 * - the two kinds of export.  Memory that cuIpcGetMemHandle can export
 *   gets a legacy handle.  Memory of the async manager's pool (pool.c)
 *   cannot be exported that way: it gets a memory-pool export, the 64
 *   bytes of cuMemPoolExportPointer plus the pool's shareable handle as
 *   the exporter holds it, (pid, fd, token): another process takes the
 *   descriptor with pidfd_open + pidfd_getfd (ptrace access to the
 *   exporter needed), imports the pool (cuMemPoolImportFromShareableHandle)
 *   and the allocation (cuMemPoolImportPointer).  Memory of the pool
 *   manager on virtual memory (cuMemCreate'd pages, which
 *   cuIpcGetMemHandle does not accept either) gets an export of pool
 *   pages: the exporter's descriptors of the pages under the exported
 *   bytes (memory/pool/vmm/share.c), which the importer takes the same way,
 *   imports and maps into a range of its own (ipcvmm.c).  The handle's
 *   pool and pages attributes say which kind it is;
 * - IpcMemory, the owner of one imported mapping: opened with
 *   cuIpcOpenMemHandle (made by _ipc_open), a memory-pool import (made
 *   by _ipc_open_pool), or pool pages mapped (made by _ipc_open_vmm).
 *   What they make is an instance of cudamem._ipc._IpcPointer, a
 *   subclass that is also a MemoryPointer, and is the gpu_data of the
 *   arrays over the mapping, so that an array's use tests the closed flag
 *   as it tests a DeviceAllocation's freed flag (ValueError once closed).
 *   close() unmaps at once (cuIpcCloseMemHandle, cuMemFree of the import,
 *   or the pages' cuMemUnmap) and is idempotent;
 *   otherwise dealloc queues the close on its context's memory queue,
 *   like a free;
 * - the memory-pool imports of this process: one import of a pool per
 *   importing context and exporter's pool, one import of an allocation
 *   per context and export, counted by the IpcMemory objects over it (the
 *   driver leaves open what a second import of one allocation does); a
 *   pool import is destroyed with its last allocation, and what a context
 *   still imports is freed when it is closed;
 * - the imported pool pages of this process (ipcvmm.c): one import of a
 *   page per importing context and export, counted by the opens that
 *   map it, released with the last, and freed with its context.
 *
 * Locks and the GIL: this file takes no lock; the GIL guards the
 * objects' fields.  The export, open and close calls can wait (the
 * simulator's export and close wait for queued work), so they run with
 * the GIL released (CM_CU_NOGIL, CM_DRIVER_BEGIN_NOGIL), touching only C
 * locals; an IpcMemory is marked closed before its close is issued.  The
 * import records are also released from the memory queue without the
 * GIL: cm_imp_mu (ipcpool.c) and cm_vimp_mu (ipcvmm.c), taken inside the
 * releases this file calls, guard their lists, counts and flags; neither
 * is held across a driver call or with the other.
 */
#include "features/ipc.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Interned names: the description's "dtype" and the identity's keys. */
const char *const cm_pci_keys[3] = {
    "pci_domain_id", "pci_bus_id", "pci_device_id",
};

/* ------------------------------------------------------------------ */
/* Export                                                              */
/* ------------------------------------------------------------------ */

const char cm_ipc_export_doc[] = PyDoc_STR(
"_ipc_export(context, address, size=None, /)\n--\n\n"
"The IPC handle of the allocation that contains address: a tuple\n"
"(handle, base, size, pool, pages) of the 64 handle bytes, the\n"
"allocation's base address (cuMemGetAddressRange), its size, and None\n"
"for a cuIpcGetMemHandle handle or, for memory of the async manager's\n"
"pool, the pool's shareable handle (pid, fd, token) (the bytes are then\n"
"the cuMemPoolExportPointer data); pages is None but for memory of the\n"
"pool manager on virtual memory, whose export names the pages under\n"
"the size bytes at address (to the end of its block when size is None):\n"
"(pid, page_size, ((fd, id), ...)), base and size are then the pages'\n"
"and the bytes are zeros.  address - base is the offset of the caller's\n"
"view.");

_Static_assert(sizeof(CUmemPoolPtrExportData) == CU_IPC_HANDLE_SIZE,
               "both kinds of export have 64 bytes");

/* Export the allocation at b of the pool of ctx's built-in manager
 * (ValueError when it has none to export from, as for a closed pool); 0,
 * or -1 with an exception. */
static int
cm_ipc_export_pooled(cm_context *ctx, CUdeviceptr b,
                     CUmemPoolPtrExportData *data, cm_ipc_exp *out)
{
    const cm_mm_ops *mm = ctx->mm_builtin;

    if (mm->export == NULL) {
        PyErr_SetString(PyExc_ValueError,
                        "the context's async memory pool is closed");
        return -1;
    }
    return mm->export(ctx, b, data, &out->fd, &out->token);
}

/* The pages tuple of an export of pool pages of this process,
 * (pid, page_size, ((fd, id), ...)); NULL with an exception. */
static PyObject *
cm_ipc_pages_tuple(const cm_vmm_pages *v)
{
    PyObject *list = PyTuple_New((Py_ssize_t)v->n);
    PyObject *item;
    size_t i;

    if (list == NULL) {
        return NULL;
    }
    for (i = 0; i < v->n; i++) {
        item = Py_BuildValue("(iK)", v->fds[i],
                             (unsigned long long)v->ids[i]);
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyTuple_SET_ITEM(list, (Py_ssize_t)i, item);  /* steals item */
    }
    /* N steals list, even on failure. */
    return Py_BuildValue("(lnN)", (long)getpid(), (Py_ssize_t)v->page,
                         list);
}

/* Export the allocation of ctx that contains addr, or, for memory of the
 * pool on virtual memory, the pages under [addr, addr + span) (span 0:
 * to the end of its block).  pooled: 1 when it is known to come from the
 * async manager's pool, 0 when known not to, -1 to ask the driver.  0
 * (the caller owns out->pages), or -1 with an exception. */
int
cm_ipc_export_raw(cm_context *ctx, CUdeviceptr addr, size_t span,
                  int pooled, cm_ipc_exp *out)
{
    CUipcMemHandle h;
    CUmemPoolPtrExportData data;
    cm_vmm_pages v;
    CUdeviceptr b = 0;
    size_t n = 0;
    int err;

    if (addr == 0) {
        PyErr_SetString(PyExc_ValueError,
                        "cannot export a NULL pointer (an empty array has "
                        "no memory to share)");
        return -1;
    }
    memset(out, 0, sizeof(*out));
    if (cm_context_activate(ctx) < 0) {
        return -1;
    }
    if (pooled != 1) {
        /* The pool manager's arenas: pages, whatever the driver says of
         * the address (cuMemGetAddressRange names one page's mapping). */
        err = cm_pool_export_pages(ctx, addr, span, &v);
        if (err < 0) {
            return -1;
        }
        if (err == 1) {
            out->pages = cm_ipc_pages_tuple(&v);
            free(v.fds);
            free(v.ids);
            if (out->pages == NULL) {
                return -1;
            }
            out->base = v.base;
            out->size = v.n * v.page;
            return 0;
        }
    }
    if (CM_CU(MemGetAddressRange, (&b, &n, addr)) < 0) {
        return -1;
    }
    if (pooled < 0) {
        pooled = ctx->mm_builtin->owns != NULL
                 ? ctx->mm_builtin->owns(ctx, b) : 0;
        if (pooled < 0) {
            return -1;
        }
    }
    if (pooled) {
        if (cm_ipc_export_pooled(ctx, b, &data, out) < 0) {
            return -1;
        }
        memcpy(out->raw, data.reserved, sizeof(out->raw));
        out->pooled = 1;
        out->pid = (long)getpid();
    }
    else {
        memset(&h, 0, sizeof(h));
        CM_CU_NOGIL(err, IpcGetMemHandle, (&h, b));
        if (err < 0) {
            return -1;
        }
        memcpy(out->raw, h.reserved, sizeof(out->raw));
    }
    out->base = b;
    out->size = n;
    return 0;
}

/* The (pid, fd, token) tuple of a memory-pool export. */
PyObject *
cm_ipc_pool_tuple(long pid, int fd, uint64_t token)
{
    return Py_BuildValue("(liK)", pid, fd, (unsigned long long)token);
}

PyObject *
cm_ipc_export(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    cm_context *ctx;
    unsigned long long addr;
    Py_ssize_t span = 0;
    cm_ipc_exp x;
    PyObject *pool;
    PyObject *r;

    (void)mod;
    if (nargs != 2 && nargs != 3) {
        PyErr_Format(PyExc_TypeError,
                     "_ipc_export() takes 2 or 3 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    ctx = cm_ipc_context_arg(args[0]);
    if (ctx == NULL) {
        return NULL;
    }
    addr = PyLong_AsUnsignedLongLong(args[1]);
    if (addr == (unsigned long long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    if (nargs == 3 && args[2] != Py_None) {
        span = PyNumber_AsSsize_t(args[2], PyExc_OverflowError);
        if (span == -1 && PyErr_Occurred()) {
            return NULL;
        }
        if (span <= 0) {
            PyErr_Format(PyExc_ValueError,
                         "size must be positive, got %zd", span);
            return NULL;
        }
    }
    if (cm_ipc_export_raw(ctx, (CUdeviceptr)addr, (size_t)span, -1, &x)
        < 0) {
        return NULL;
    }
    pool = x.pooled ? cm_ipc_pool_tuple(x.pid, x.fd, x.token)
                    : Py_NewRef(Py_None);
    if (pool == NULL) {
        Py_XDECREF(x.pages);
        return NULL;
    }
    r = Py_BuildValue("(y#KKOO)", x.raw, (Py_ssize_t)sizeof(x.raw),
                      (unsigned long long)x.base, (unsigned long long)x.size,
                      pool, x.pages != NULL ? x.pages : Py_None);
    Py_DECREF(pool);
    Py_XDECREF(x.pages);
    return r;
}

/* ------------------------------------------------------------------ */
/* IpcMemory                                                           */
/* ------------------------------------------------------------------ */

int
cm_ipc_mem_closed(PyObject *o)
{
    return PyObject_TypeCheck(o, cm_st->IpcMemory_type)
           && ((cm_ipcmem *)o)->closed;
}

static int
cm_ipcmem_check_open(cm_ipcmem *m)
{
    if (m->closed) {
        PyErr_SetString(PyExc_ValueError, "the IPC mapping is closed");
        return -1;
    }
    return 0;
}

const char cm_ipc_open_doc[] = PyDoc_STR(
"_ipc_open(context, handle, size, offset=0, /)\n--\n\n"
"Map the memory that handle (64 bytes from another process's\n"
"cuIpcGetMemHandle) names into context, with lazy peer access: a new\n"
"IpcMemory (a cudamem._ipc._IpcPointer) whose device_pointer is offset\n"
"bytes past the allocation's base and whose size is size, the bytes the\n"
"caller will use from there.");

PyObject *
cm_ipc_open(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    cm_context *ctx;
    Py_buffer view;
    Py_ssize_t size;
    Py_ssize_t off;
    CUipcMemHandle h;
    CUdeviceptr p = 0;
    cm_ipcmem *m;
    int err;

    (void)mod;
    ctx = cm_ipc_open_args("_ipc_open", args, nargs, 3, &size, &off);
    if (ctx == NULL) {
        return NULL;
    }
    if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (view.len != (Py_ssize_t)sizeof(h.reserved)) {
        PyErr_Format(PyExc_ValueError,
                     "an IPC handle has %zu bytes, got %zd",
                     sizeof(h.reserved), view.len);
        PyBuffer_Release(&view);
        return NULL;
    }
    memcpy(h.reserved, view.buf, sizeof(h.reserved));
    PyBuffer_Release(&view);
    if (cm_context_activate(ctx) < 0) {
        return NULL;
    }
    CM_CU_NOGIL(err, IpcOpenMemHandle,
                (&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    if (err < 0) {
        return NULL;
    }
    m = cm_ipcmem_new(ctx, p, off, size, NULL);
    if (m == NULL) {
        /* The mapping is still ours to undo. */
        (void)CM_CU_RAW(IpcCloseMemHandle, (p));
        return NULL;
    }
    return (PyObject *)m;
}

PyDoc_STRVAR(cm_ipcmem_close_doc,
"close($self, /)\n--\n\n"
"Unmap now (cuIpcCloseMemHandle; cuMemFree of a memory-pool import\n"
"once no other open of it in this context remains; for pool pages,\n"
"cuMemUnmap, cuMemAddressFree and cuMemRelease of the pages no other\n"
"open maps).  Arrays over the\n"
"mapping are dead afterwards: using them (copies, kernels, views, CAI\n"
"and DLPack exports, IPC export) raises ValueError.  A second call does\n"
"nothing.");

static PyObject *
cm_ipcmem_close(PyObject *self, PyObject *unused)
{
    cm_ipcmem *m = (cm_ipcmem *)self;
    CUdeviceptr p = m->ptr;
    void *imp = m->imp;
    void *vimp = m->vimp;
    CUresult rc;
    int err;

    (void)unused;
    if (m->closed) {
        Py_RETURN_NONE;
    }
    if (!m->ctx->alive) {
        /* Closing or resetting the device unmapped it already. */
        m->closed = 1;
        m->imp = NULL;
        m->vimp = NULL;
        if (imp != NULL) {
            cm_ipc_pool_drop((uintptr_t)imp);
        }
        if (vimp != NULL) {
            cm_ipc_vmm_drop((uintptr_t)vimp);
        }
        Py_RETURN_NONE;
    }
    if (cm_context_activate(m->ctx) < 0) {
        /* Still open: dealloc queues the close. */
        return NULL;
    }
    m->closed = 1;
    m->imp = NULL;
    m->vimp = NULL;
    if (vimp != NULL) {
        CM_DRIVER_BEGIN_NOGIL
        rc = cm_ipc_vmm_release((uintptr_t)vimp);
        CM_DRIVER_END_NOGIL
        return cm_cu_check(rc, "cuMemUnmap") < 0 ? NULL : Py_NewRef(Py_None);
    }
    if (imp != NULL) {
        CM_DRIVER_BEGIN_NOGIL
        rc = cm_ipc_pool_release((uintptr_t)imp);
        CM_DRIVER_END_NOGIL
        return cm_cu_check(rc, "cuMemFree") < 0 ? NULL : Py_NewRef(Py_None);
    }
    CM_CU_NOGIL(err, IpcCloseMemHandle, (p));
    if (err < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
cm_ipcmem_get_ptr(PyObject *self, void *unused)
{
    cm_ipcmem *m = (cm_ipcmem *)self;

    (void)unused;
    if (cm_ipcmem_check_open(m) < 0) {
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(m->ptr + m->off);
}

static PyObject *
cm_ipcmem_get_size(PyObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromSize_t(((cm_ipcmem *)self)->size);
}

static PyObject *
cm_ipcmem_get_context(PyObject *self, void *unused)
{
    (void)unused;
    return Py_NewRef(((cm_ipcmem *)self)->ctx);
}

static PyObject *
cm_ipcmem_get_closed(PyObject *self, void *unused)
{
    (void)unused;
    return PyBool_FromLong(((cm_ipcmem *)self)->closed);
}

static int
cm_ipcmem_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(((cm_ipcmem *)self)->ctx);
    return 0;
}

static void
cm_ipcmem_dealloc(PyObject *self)
{
    cm_ipcmem *m = (cm_ipcmem *)self;
    PyTypeObject *tp = Py_TYPE(self);
    PyObject *exc = PyErr_GetRaisedException();

    PyObject_GC_UnTrack(self);
    if (m->weakreflist != NULL) {
        PyObject_ClearWeakRefs(self);
    }
    if (!m->closed && !Py_IsFinalizing()) {
        m->closed = 1;
        if (m->vimp != NULL) {
            if (m->ctx->alive && !cm_forked) {
                cm_ctx_release(m->ctx, CM_REL_IPC_VMM, (uintptr_t)m->vimp,
                               0);
            }
            else if (!cm_forked) {
                /* The context's close unmapped it already. */
                cm_ipc_vmm_drop((uintptr_t)m->vimp);
            }
            m->vimp = NULL;
        }
        else if (m->imp == NULL) {
            cm_ctx_release(m->ctx, CM_REL_IPC, (uintptr_t)m->ptr, 0);
        }
        else if (m->ctx->alive && !cm_forked) {
            cm_ctx_release(m->ctx, CM_REL_IPC_POOL, (uintptr_t)m->imp, 0);
        }
        else if (!cm_forked) {
            /* The context's close freed the import already. */
            cm_ipc_pool_drop((uintptr_t)m->imp);
        }
        m->imp = NULL;
    }
    Py_CLEAR(m->ctx);
    tp->tp_free(self);
    Py_DECREF(tp);
    PyErr_SetRaisedException(exc);
}

static PyGetSetDef cm_ipcmem_getset[] = {
    {"device_pointer", cm_ipcmem_get_ptr, NULL,
     "The address of the opener's bytes in the mapping, as an int "
     "(ValueError once closed).", NULL},
    {"handle", cm_ipcmem_get_ptr, NULL, "The same as device_pointer.",
     NULL},
    {"size", cm_ipcmem_get_size, NULL, "The bytes the opener uses.", NULL},
    {"context", cm_ipcmem_get_context, NULL,
     "The Context the mapping was opened in.", NULL},
    {"closed", cm_ipcmem_get_closed, NULL,
     "Whether close() ran (or the mapping was handed to the queue).",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef cm_ipcmem_methods[] = {
    {"close", cm_ipcmem_close, METH_NOARGS, cm_ipcmem_close_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef cm_ipcmem_members[] = {
    {"__weaklistoffset__", Py_T_PYSSIZET, offsetof(cm_ipcmem, weakreflist),
     Py_READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(cm_ipcmem_doc,
"Device memory of another process, mapped here by cuIpcOpenMemHandle,\n"
"imported from its memory pool (cuMemPoolImportPointer), or its pool\n"
"pages imported and mapped (cuMemImportFromShareableHandle, cuMemMap).\n"
"Made by IpcHandle.open; unmapped by close() or, failing that, queued\n"
"for unmapping when the last reference goes.");

static PyType_Slot cm_ipcmem_slots[] = {
    {Py_tp_doc, (void *)cm_ipcmem_doc},
    {Py_tp_dealloc, cm_ipcmem_dealloc},
    {Py_tp_traverse, cm_ipcmem_traverse},
    {Py_tp_getset, cm_ipcmem_getset},
    {Py_tp_methods, cm_ipcmem_methods},
    {Py_tp_members, cm_ipcmem_members},
    {0, NULL},
};

PyType_Spec cm_ipcmem_spec = {
    .name = "cudamem.IpcMemory",
    .basicsize = sizeof(cm_ipcmem),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE
             | Py_TPFLAGS_IMMUTABLETYPE
             | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = cm_ipcmem_slots,
};
