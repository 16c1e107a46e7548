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
 *   and the allocation (cuMemPoolImportPointer).  The handle's pool
 *   attribute says which kind it is;
 * - IpcMemory, the owner of one imported mapping: opened with
 *   cuIpcOpenMemHandle (made by _ipc_open), or a memory-pool import (made
 *   by _ipc_open_pool).  What they make is an instance of
 *   cudamem._ipc._IpcPointer, a subclass that is also a MemoryPointer,
 *   and is the gpu_data of the arrays over the mapping, so that an
 *   array's use tests the closed flag as it tests a DeviceAllocation's
 *   freed flag (ValueError once closed).  close() unmaps at once
 *   (cuIpcCloseMemHandle, or cuMemFree of the import) and is idempotent;
 *   otherwise dealloc queues the close on its context's memory queue,
 *   like a free;
 * - the memory-pool imports of this process: one import of a pool per
 *   importing context and exporter's pool, one import of an allocation
 *   per context and export, counted by the IpcMemory objects over it (the
 *   driver leaves open what a second import of one allocation does); a
 *   pool import is destroyed with its last allocation, and what a context
 *   still imports is freed when it is closed.
 *
 * Locking: the GIL guards the objects' fields.  The export, open and
 * close calls can wait (the simulator's export and close wait for queued
 * work), so they run with the GIL released, touching only C locals; an
 * IpcMemory is marked closed before its close is issued.  The import
 * records are also released from the memory queue without the GIL:
 * cm_imp_mu guards their lists, counts and flags, and is never held
 * across a driver call.
 */
#include "runtime/runtime.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The owner of one imported mapping. */
typedef struct {
    PyObject_HEAD
    cm_context *ctx;      /* strong: the context it was opened in */
    CUdeviceptr ptr;      /* the mapped address (the allocation's base) */
    size_t off;           /* where the opener's bytes start past ptr */
    size_t size;          /* bytes the opener uses, from ptr + off */
    int closed;           /* NOTE: set once, before the close is issued;
                           * arrays over the memory test it before each
                           * use (cm_ipc_mem_closed) */
    void *imp;            /* a memory-pool import (cm_iptr, counted), or
                           * NULL for a cuIpcOpenMemHandle mapping */
    PyObject *weakreflist;
} cm_ipcmem;

/* The state of an IpcHandle.  NULL fields are unset (reading one raises
 * AttributeError, as for a plain object) unless made on first read. */
typedef struct {
    PyObject_HEAD
    PyObject *base;       /* strong or NULL: the exported memory pointer;
                           * NULL while owner holds what makes it */
    PyObject *owner;      /* strong or NULL: for the base made on first
                           * read, what keeps the exported memory alive */
    cm_context *ctx;      /* strong or NULL: that base's context */
    CUdeviceptr ptr;      /* that base's address (the view's lowest byte) */
    Py_ssize_t span;      /* that base's size (the view's byte span) */
    PyObject *handle;     /* strong or NULL: the _RawHandle; NULL while
                           * has_raw */
    PyObject *size;       /* strong or NULL: bytes exported (an int) */
    PyObject *source_info;  /* strong or NULL: the exporting device's
                             * identity; NULL while has_pci */
    PyObject *offset;     /* strong or NULL: the view's offset in the
                           * allocation (an int) */
    PyObject *pool;       /* strong or NULL (None): a memory-pool
                           * export's (pid, fd, token); NULL while
                           * has_pool */
    int has_raw;          /* raw holds the handle not yet made */
    int has_pci;          /* pci holds the source_info not yet made */
    int has_pool;         /* pool_* hold the pool not yet made */
    int pci[3];           /* PCI domain, bus and device ids */
    long pool_pid;        /* the exporting process */
    int pool_fd;          /* its descriptor of the pool's handle */
    uint64_t pool_token;  /* its name for the pool */
    unsigned char raw[CU_IPC_HANDLE_SIZE];  /* the CUipcMemHandle bytes, or
                                             * the CUmemPoolPtrExportData
                                             * of a memory-pool export */
} cm_ipch;

/* The state of an IpcArrayHandle, likewise. */
typedef struct {
    PyObject_HEAD
    PyObject *ipc_handle;  /* strong or NULL: the IpcHandle */
    PyObject *desc;       /* strong or NULL: the array description, a
                           * dict; NULL while shape is set */
    PyObject *shape;      /* strong or NULL: the exported array's shape, */
    PyObject *strides;    /* strides */
    PyObject *dtype;      /* and dtype, for the description */
} cm_ipcah;

/* Interned names: the description's "dtype" and the identity's keys. */
static PyObject *cm_str_dtype;
static PyObject *cm_str_pci[3];
static const char *const cm_pci_keys[3] = {
    "pci_domain_id", "pci_bus_id", "pci_device_id",
};

/* The Context argument of the module functions: borrowed, or NULL with
 * TypeError. */
static cm_context *
cm_ipc_context_arg(PyObject *obj)
{
    if (!PyObject_TypeCheck(obj, cm_st->Context_type)) {
        PyErr_Format(PyExc_TypeError, "expected a cudamem Context, got %.200s",
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return (cm_context *)obj;
}

/* ------------------------------------------------------------------ */
/* Export                                                              */
/* ------------------------------------------------------------------ */

PyDoc_STRVAR(cm_ipc_export_doc,
"_ipc_export(context, address, /)\n--\n\n"
"The IPC handle of the allocation that contains address: a tuple\n"
"(handle, base, size, pool) of the 64 handle bytes, the allocation's\n"
"base address (cuMemGetAddressRange), its size, and None for a\n"
"cuIpcGetMemHandle handle or, for memory of the async manager's pool, the\n"
"pool's shareable handle (pid, fd, token) (the bytes are then the\n"
"cuMemPoolExportPointer data).  The handle names the base allocation;\n"
"address - base is the offset of the caller's view.");

/* What an export gives. */
typedef struct {
    unsigned char raw[CU_IPC_HANDLE_SIZE];  /* the handle's bytes */
    CUdeviceptr base;     /* the allocation's base */
    size_t size;          /* and size */
    int pooled;           /* a memory-pool export: the next three apply */
    long pid;             /* the exporting process (this one) */
    int fd;               /* the pool's shareable handle here */
    uint64_t token;       /* the pool's name */
} cm_ipc_exp;

_Static_assert(sizeof(CUmemPoolPtrExportData) == CU_IPC_HANDLE_SIZE,
               "both kinds of export have 64 bytes");

/* Export the allocation of ctx that contains addr.  pooled: 1 when it is
 * known to come from the async manager's pool, 0 when known not to, -1
 * to ask the driver.  0, or -1 with an exception. */
static int
cm_ipc_export_raw(cm_context *ctx, CUdeviceptr addr, int pooled,
                  cm_ipc_exp *out)
{
    CUipcMemHandle h;
    CUmemPoolPtrExportData data;
    CUdeviceptr b = 0;
    size_t n = 0;
    int err;

    if (addr == 0) {
        PyErr_SetString(PyExc_ValueError,
                        "cannot export a NULL pointer (an empty array has "
                        "no memory to share)");
        return -1;
    }
    if (cm_context_activate(ctx) < 0
        || CM_CU(MemGetAddressRange, (&b, &n, addr)) < 0) {
        return -1;
    }
    if (pooled < 0) {
        pooled = cm_pool_owns(ctx, b);
        if (pooled < 0) {
            return -1;
        }
    }
    memset(out, 0, sizeof(*out));
    if (pooled) {
        if (cm_pool_export(ctx, b, &data, &out->fd, &out->token) < 0) {
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
static PyObject *
cm_ipc_pool_tuple(long pid, int fd, uint64_t token)
{
    return Py_BuildValue("(liK)", pid, fd, (unsigned long long)token);
}

static PyObject *
cm_ipc_export(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    cm_context *ctx;
    unsigned long long addr;
    cm_ipc_exp x;
    PyObject *pool;
    PyObject *r;

    (void)mod;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError,
                     "_ipc_export() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    ctx = cm_ipc_context_arg(args[0]);
    if (ctx == NULL) {
        return NULL;
    }
    addr = PyLong_AsUnsignedLongLong(args[1]);
    if ((addr == (unsigned long long)-1 && PyErr_Occurred())
        || cm_ipc_export_raw(ctx, (CUdeviceptr)addr, -1, &x) < 0) {
        return NULL;
    }
    pool = x.pooled ? cm_ipc_pool_tuple(x.pid, x.fd, x.token)
                    : Py_NewRef(Py_None);
    if (pool == NULL) {
        return NULL;
    }
    r = Py_BuildValue("(y#KKO)", x.raw, (Py_ssize_t)sizeof(x.raw),
                      (unsigned long long)x.base, (unsigned long long)x.size,
                      pool);
    Py_DECREF(pool);
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

static int cm_ipc_classes(void);

/* The two non-negative sizes of an open: size, and offset (0 when
 * absent).  0, or -1 with an exception. */
static int
cm_ipc_sizes(PyObject *size_arg, PyObject *off_arg, Py_ssize_t *size,
             Py_ssize_t *off)
{
    *off = 0;
    *size = PyNumber_AsSsize_t(size_arg, PyExc_OverflowError);
    if (*size == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (off_arg != NULL) {
        *off = PyNumber_AsSsize_t(off_arg, PyExc_OverflowError);
        if (*off == -1 && PyErr_Occurred()) {
            return -1;
        }
    }
    if (*size < 0 || *off < 0) {
        PyErr_Format(PyExc_ValueError,
                     "size and offset must not be negative, got %zd and %zd",
                     *size, *off);
        return -1;
    }
    return 0;
}

/* A new IpcMemory (an instance of cudamem._ipc._IpcPointer) over the
 * mapping at p of ctx, showing size bytes from p + off; imp as for the
 * field.  NULL with an exception (the mapping is then the caller's). */
static cm_ipcmem *
cm_ipcmem_new(cm_context *ctx, CUdeviceptr p, Py_ssize_t off,
              Py_ssize_t size, void *imp)
{
    PyTypeObject *tp = (PyTypeObject *)cm_st->IpcPointer;
    /* tp_alloc zeroes the object and tracks it */
    cm_ipcmem *m = (cm_ipcmem *)tp->tp_alloc(tp, 0);

    if (m == NULL) {
        return NULL;
    }
    m->ctx = (cm_context *)Py_NewRef(ctx);
    m->ptr = p;
    m->off = (size_t)off;
    m->size = (size_t)size;
    m->closed = 0;
    m->imp = imp;
    return m;
}

PyDoc_STRVAR(cm_ipc_open_doc,
"_ipc_open(context, handle, size, offset=0, /)\n--\n\n"
"Map the memory that handle (64 bytes from another process's\n"
"cuIpcGetMemHandle) names into context, with lazy peer access: a new\n"
"IpcMemory (a cudamem._ipc._IpcPointer) whose device_pointer is offset\n"
"bytes past the allocation's base and whose size is size, the bytes the\n"
"caller will use from there.");

static PyObject *
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
    if (nargs != 3 && nargs != 4) {
        PyErr_Format(PyExc_TypeError,
                     "_ipc_open() takes 3 or 4 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    ctx = cm_ipc_context_arg(args[0]);
    if (ctx == NULL
        || cm_ipc_sizes(args[2], nargs == 4 ? args[3] : NULL, &size, &off)
               < 0
        || cm_ipc_classes() < 0) {
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
"Unmap now (cuIpcCloseMemHandle, or cuMemFree of a memory-pool import\n"
"once no other open of it in this context remains).  Arrays over the\n"
"mapping are dead afterwards: using them (copies, kernels, views, CAI\n"
"and DLPack exports, IPC export) raises ValueError.  A second call does\n"
"nothing.");

static PyObject *
cm_ipcmem_close(PyObject *self, PyObject *unused)
{
    cm_ipcmem *m = (cm_ipcmem *)self;
    CUdeviceptr p = m->ptr;
    void *imp = m->imp;
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
        if (imp != NULL) {
            cm_ipc_pool_drop((uintptr_t)imp);
        }
        Py_RETURN_NONE;
    }
    if (cm_context_activate(m->ctx) < 0) {
        /* Still open: dealloc queues the close. */
        return NULL;
    }
    m->closed = 1;
    m->imp = NULL;
    if (imp != NULL) {
        Py_BEGIN_ALLOW_THREADS
        rc = cm_ipc_pool_release((uintptr_t)imp);
        Py_END_ALLOW_THREADS
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
        if (m->imp == NULL) {
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
"Device memory of another process, mapped here by cuIpcOpenMemHandle or\n"
"imported from its memory pool (cuMemPoolImportPointer).  Made by\n"
"IpcHandle.open; unmapped by close() or, failing that, queued for\n"
"unmapping when the last reference goes.");

static PyType_Slot cm_ipcmem_slots[] = {
    {Py_tp_doc, (void *)cm_ipcmem_doc},
    {Py_tp_dealloc, cm_ipcmem_dealloc},
    {Py_tp_traverse, cm_ipcmem_traverse},
    {Py_tp_getset, cm_ipcmem_getset},
    {Py_tp_methods, cm_ipcmem_methods},
    {Py_tp_members, cm_ipcmem_members},
    {0, NULL},
};

static PyType_Spec cm_ipcmem_spec = {
    .name = "cudamem.IpcMemory",
    .basicsize = sizeof(cm_ipcmem),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE
             | Py_TPFLAGS_IMMUTABLETYPE
             | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = cm_ipcmem_slots,
};

/* ------------------------------------------------------------------ */
/* Memory-pool imports                                                 */
/* ------------------------------------------------------------------ */

/* A memory pool of another process, imported in one context. */
typedef struct cm_ipool cm_ipool;
struct cm_ipool {
    unsigned long gen;    /* the importing context's generation */
    long pid;             /* the exporting process */
    int fd;               /* its descriptor of the pool's handle */
    uint64_t token;       /* its name for the pool */
    CUmemoryPool pool;    /* the imported pool */
    uint64_t access;      /* bit d: device d was given access to it */
    int refs;             /* the imported allocations that hold it */
    int dead;             /* its context was closed: destroyed then */
    cm_ipool *next;       /* link in cm_ipools */
};

/* An allocation imported from such a pool. */
typedef struct cm_iptr cm_iptr;
struct cm_iptr {
    cm_ipool *ipool;      /* holds one of its references */
    unsigned char data[CU_IPC_HANDLE_SIZE];  /* the export it came from */
    CUdeviceptr ptr;      /* where it is mapped */
    int refs;             /* the IpcMemory objects (or their queued
                           * releases) over it */
    int dead;             /* its context was closed: freed then */
    cm_iptr *next;        /* link in cm_iptrs */
};

/* NOTE: cm_imp_mu guards the two lists and every refs, dead and access
 * field; it is never held across a driver call.  An entry is listed
 * while referenced; lookups skip dead ones. */
static pthread_mutex_t cm_imp_mu = PTHREAD_MUTEX_INITIALIZER;
static cm_ipool *cm_ipools;
static cm_iptr *cm_iptrs;

/* Drop a reference to ip; the last unlinks it and destroys the imported
 * pool (unless its context was closed, or driver is 0).  No GIL needed;
 * some context current when driver is 1. */
static CUresult
cm_ipool_unref(cm_ipool *ip, int driver)
{
    cm_ipool **pp;
    CUresult rc = CUDA_SUCCESS;
    int last;

    pthread_mutex_lock(&cm_imp_mu);
    last = --ip->refs == 0;
    if (last) {
        for (pp = &cm_ipools; *pp != NULL; pp = &(*pp)->next) {
            if (*pp == ip) {
                *pp = ip->next;
                break;
            }
        }
        driver = driver && !ip->dead;
    }
    pthread_mutex_unlock(&cm_imp_mu);
    if (!last) {
        return CUDA_SUCCESS;
    }
    if (driver) {
        rc = CM_CU_RAW(MemPoolDestroy, (ip->pool));
    }
    free(ip);
    return rc;
}

/* Drop a reference to p; the last unlinks it, frees the imported memory
 * (unless its context was closed, or driver is 0) and drops its pool.
 * No GIL needed; p's context current when driver is 1. */
static CUresult
cm_iptr_unref(cm_iptr *p, int driver)
{
    cm_iptr **pp;
    CUresult rc = CUDA_SUCCESS;
    CUresult rc2;
    int last;

    pthread_mutex_lock(&cm_imp_mu);
    last = --p->refs == 0;
    if (last) {
        for (pp = &cm_iptrs; *pp != NULL; pp = &(*pp)->next) {
            if (*pp == p) {
                *pp = p->next;
                break;
            }
        }
        driver = driver && !p->dead;
    }
    pthread_mutex_unlock(&cm_imp_mu);
    if (!last) {
        return CUDA_SUCCESS;
    }
    if (driver) {
        rc = CM_CU_RAW(MemFree, (p->ptr));
    }
    rc2 = cm_ipool_unref(p->ipool, driver);
    free(p);
    return rc != CUDA_SUCCESS ? rc : rc2;
}

CUresult
cm_ipc_pool_release(uintptr_t imp)
{
    return cm_iptr_unref((cm_iptr *)imp, 1);
}

void
cm_ipc_pool_drop(uintptr_t imp)
{
    (void)cm_iptr_unref((cm_iptr *)imp, 0);
}

void
cm_ipc_context_closing(cm_context *ctx)
{
    CUdeviceptr *ptrs = NULL;
    CUmemoryPool *pools = NULL;
    size_t nptrs = 0;
    size_t npools = 0;
    size_t i;
    cm_iptr *p;
    cm_ipool *ip;
    CUcontext cur = NULL;
    CUcontext popped;
    int pushed = 0;

    if (cm_forked) {
        return;
    }
    pthread_mutex_lock(&cm_imp_mu);
    for (p = cm_iptrs; p != NULL; p = p->next) {
        nptrs += !p->dead && p->ipool->gen == ctx->gen;
    }
    for (ip = cm_ipools; ip != NULL; ip = ip->next) {
        npools += !ip->dead && ip->gen == ctx->gen;
    }
    /* Without memory for the lists, the context's reset takes what the
     * imports hold. */
    ptrs = nptrs ? malloc(nptrs * sizeof(*ptrs)) : NULL;
    pools = npools ? malloc(npools * sizeof(*pools)) : NULL;
    nptrs = 0;
    npools = 0;
    for (p = cm_iptrs; p != NULL; p = p->next) {
        if (!p->dead && p->ipool->gen == ctx->gen) {
            p->dead = 1;
            if (ptrs != NULL) {
                ptrs[nptrs++] = p->ptr;
            }
        }
    }
    for (ip = cm_ipools; ip != NULL; ip = ip->next) {
        if (!ip->dead && ip->gen == ctx->gen) {
            ip->dead = 1;
            if (pools != NULL) {
                pools[npools++] = ip->pool;
            }
        }
    }
    pthread_mutex_unlock(&cm_imp_mu);
    if (nptrs + npools > 0) {
        Py_BEGIN_ALLOW_THREADS
        if (CM_CU_RAW(CtxGetCurrent, (&cur)) != CUDA_SUCCESS
            || cur != ctx->handle) {
            pushed = CM_CU_RAW(CtxPushCurrent, (ctx->handle))
                     == CUDA_SUCCESS;
        }
        for (i = 0; i < nptrs; i++) {
            (void)CM_CU_RAW(MemFree, (ptrs[i]));
        }
        for (i = 0; i < npools; i++) {
            (void)CM_CU_RAW(MemPoolDestroy, (pools[i]));
        }
        if (pushed) {
            (void)CM_CU_RAW(CtxPopCurrent, (&popped));
        }
        Py_END_ALLOW_THREADS
    }
    free(ptrs);
    free(pools);
}

/* OSError(err, why) for a descriptor that could not be taken from pid:
 * a subclass where the errno has one (ProcessLookupError,
 * PermissionError).  -1. */
static int
cm_ipc_take_fd_error(int err, long pid, int fd)
{
    PyObject *msg;
    PyObject *exc;

    switch (err) {
    case ESRCH:
        msg = PyUnicode_FromFormat(
            "cannot open the IPC handle: the exporting process (pid %ld) "
            "has exited", pid);
        break;
    case EBADF:
        msg = PyUnicode_FromFormat(
            "cannot open the IPC handle: process %ld no longer has the "
            "memory pool's file descriptor %d (the exporting context was "
            "closed, or the handle is not from that process)", pid, fd);
        break;
    case EPERM:
    case EACCES:
        msg = PyUnicode_FromFormat(
            "cannot open the IPC handle: not permitted to take file "
            "descriptor %d of process %ld with pidfd_getfd, which needs "
            "ptrace access to the exporting process (the same user and a "
            "Yama ptrace_scope that allows it, or CAP_SYS_PTRACE)",
            fd, pid);
        break;
    case ENOSYS:
        msg = PyUnicode_FromString(
            "cannot open the IPC handle: importing memory of the async "
            "memory manager needs pidfd_open and pidfd_getfd (Linux 5.6 or "
            "later)");
        break;
    default:
        msg = PyUnicode_FromFormat(
            "cannot open the IPC handle: taking file descriptor %d of "
            "process %ld failed (%s)", fd, pid, strerror(err));
        break;
    }
    if (msg == NULL) {
        return -1;
    }
    exc = PyObject_CallFunction(PyExc_OSError, "iO", err, msg);
    Py_DECREF(msg);
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return -1;
}

/* A descriptor of this process for descriptor fd of process pid (it is
 * close-on-exec), or -1 with OSError saying why not. */
static int
cm_ipc_take_fd(long pid, int fd)
{
    int pidfd = -1;
    int got = -1;
    int err = ENOSYS;

#if defined(SYS_pidfd_open) && defined(SYS_pidfd_getfd)
    pidfd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
    if (pidfd >= 0) {
        got = (int)syscall(SYS_pidfd_getfd, pidfd, fd, 0);
    }
    err = errno;
    if (pidfd >= 0) {
        close(pidfd);
    }
#else
    (void)pidfd;
#endif
    if (got < 0) {
        return cm_ipc_take_fd_error(err, pid, fd);
    }
    return got;
}

/* Import, in ctx, the pool that process pid holds as descriptor fd: a
 * new entry, listed, with one reference; NULL with an exception. */
static cm_ipool *
cm_ipool_import(cm_context *ctx, long pid, int fd, uint64_t token)
{
    CUmemoryPool pool = NULL;
    cm_ipool *ip;
    int got;
    int err;

    got = cm_ipc_take_fd(pid, fd);
    if (got < 0) {
        return NULL;
    }
    /* The driver keeps what it needs: the descriptor is ours to close. */
    CM_CU_NOGIL(err, MemPoolImportFromShareableHandle,
                (&pool, (void *)(intptr_t)got,
                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    close(got);
    if (err < 0) {
        return NULL;
    }
    ip = calloc(1, sizeof(*ip));
    if (ip == NULL) {
        Py_BEGIN_ALLOW_THREADS
        (void)CM_CU_RAW(MemPoolDestroy, (pool));
        Py_END_ALLOW_THREADS
        PyErr_NoMemory();
        return NULL;
    }
    ip->gen = ctx->gen;
    ip->pid = pid;
    ip->fd = fd;
    ip->token = token;
    ip->pool = pool;
    ip->refs = 1;
    pthread_mutex_lock(&cm_imp_mu);
    ip->next = cm_ipools;
    cm_ipools = ip;
    pthread_mutex_unlock(&cm_imp_mu);
    return ip;
}

/* Drop a reference taken in this file's open path, with the GIL held and
 * an exception perhaps set (kept). */
static void
cm_ipool_unref_gil(cm_ipool *ip)
{
    PyObject *exc = PyErr_GetRaisedException();

    Py_BEGIN_ALLOW_THREADS
    (void)cm_ipool_unref(ip, 1);
    Py_END_ALLOW_THREADS
    PyErr_SetRaisedException(exc);
}

/* The import in ctx (current) of the allocation that data names, from
 * the pool (pid, fd, token) of device src: an existing one counted again,
 * or a new one.  NULL with an exception. */
static cm_iptr *
cm_ipc_import(cm_context *ctx, long pid, int fd, uint64_t token,
              const unsigned char *data, int src)
{
    CUmemPoolPtrExportData d;
    CUmemAccessDesc acc;
    CUdeviceptr ptr = 0;
    uint64_t bit = (uint64_t)1 << (ctx->device->id % 64);
    cm_ipool *ip;
    cm_iptr *p;
    int need_access;
    int err;

    pthread_mutex_lock(&cm_imp_mu);
    for (p = cm_iptrs; p != NULL; p = p->next) {
        ip = p->ipool;
        if (!p->dead && ip->gen == ctx->gen && ip->pid == pid
            && ip->fd == fd && ip->token == token
            && memcmp(p->data, data, sizeof(p->data)) == 0) {
            p->refs++;
            pthread_mutex_unlock(&cm_imp_mu);
            return p;
        }
    }
    for (ip = cm_ipools; ip != NULL; ip = ip->next) {
        if (!ip->dead && ip->gen == ctx->gen && ip->pid == pid
            && ip->fd == fd && ip->token == token) {
            ip->refs++;
            break;
        }
    }
    pthread_mutex_unlock(&cm_imp_mu);
    if (ip == NULL) {
        ip = cm_ipool_import(ctx, pid, fd, token);
        if (ip == NULL) {
            return NULL;
        }
    }
    /* The pool's memory is its device's; another device that opens it
     * needs access (the devices are peers, or the open is staged). */
    pthread_mutex_lock(&cm_imp_mu);
    need_access = src != ctx->device->id && !(ip->access & bit);
    pthread_mutex_unlock(&cm_imp_mu);
    if (need_access) {
        memset(&acc, 0, sizeof(acc));
        acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        acc.location.id = (int)ctx->device->handle;
        acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        CM_CU_NOGIL(err, MemPoolSetAccess, (ip->pool, &acc, 1));
        if (err < 0) {
            goto err_unref_pool;
        }
        pthread_mutex_lock(&cm_imp_mu);
        ip->access |= bit;
        pthread_mutex_unlock(&cm_imp_mu);
    }
    p = calloc(1, sizeof(*p));
    if (p == NULL) {
        PyErr_NoMemory();
        goto err_unref_pool;
    }
    memcpy(d.reserved, data, sizeof(d.reserved));
    CM_CU_NOGIL(err, MemPoolImportPointer, (&ptr, ip->pool, &d));
    if (err < 0) {
        goto err_free_record;
    }
    p->ipool = ip;
    memcpy(p->data, data, sizeof(p->data));
    p->ptr = ptr;
    p->refs = 1;
    pthread_mutex_lock(&cm_imp_mu);
    p->next = cm_iptrs;
    cm_iptrs = p;
    pthread_mutex_unlock(&cm_imp_mu);
    return p;

err_free_record:
    free(p);
err_unref_pool:
    cm_ipool_unref_gil(ip);
    return NULL;
}

PyDoc_STRVAR(cm_ipc_open_pool_doc,
"_ipc_open_pool(context, handle, size, pool, source, offset=0, /)\n--\n\n"
"Import into context the allocation of another process's memory pool\n"
"that handle (64 bytes of cuMemPoolExportPointer) names; pool is the\n"
"pool's shareable handle as that process holds it, (pid, fd, token),\n"
"and source the ordinal here of the pool's device.  A new IpcMemory\n"
"whose device_pointer is offset bytes past the allocation's base and\n"
"whose size is size, as for _ipc_open.  Another open of the same export\n"
"in the same context shares the import.");

static PyObject *
cm_ipc_open_pool(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    cm_context *ctx;
    Py_buffer view;
    Py_ssize_t size;
    Py_ssize_t off;
    unsigned char data[CU_IPC_HANDLE_SIZE];
    long pid;
    int fd;
    unsigned long long token;
    int src;
    cm_iptr *imp;
    cm_ipcmem *m;

    (void)mod;
    if (nargs != 5 && nargs != 6) {
        PyErr_Format(PyExc_TypeError,
                     "_ipc_open_pool() takes 5 or 6 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    ctx = cm_ipc_context_arg(args[0]);
    if (ctx == NULL
        || cm_ipc_sizes(args[2], nargs == 6 ? args[5] : NULL, &size, &off)
               < 0
        || cm_ipc_classes() < 0) {
        return NULL;
    }
    if (!PyTuple_Check(args[3])) {
        PyErr_Format(PyExc_TypeError,
                     "pool must be a (pid, fd, token) tuple, got %.200s",
                     Py_TYPE(args[3])->tp_name);
        return NULL;
    }
    if (!PyArg_ParseTuple(args[3], "liK;pool must be a (pid, fd, token) "
                          "tuple", &pid, &fd, &token)) {
        return NULL;
    }
    src = (int)PyLong_AsLong(args[4]);
    if (src == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (view.len != (Py_ssize_t)sizeof(data)) {
        PyErr_Format(PyExc_ValueError,
                     "an IPC handle has %zu bytes, got %zd", sizeof(data),
                     view.len);
        PyBuffer_Release(&view);
        return NULL;
    }
    memcpy(data, view.buf, sizeof(data));
    PyBuffer_Release(&view);
    if (pid == (long)getpid()) {
        /* The pool is this process's own: nothing to import. */
        PyErr_SetString(PyExc_ValueError,
                        "opening IpcHandle from original process");
        return NULL;
    }
    if (cm_context_activate(ctx) < 0) {
        return NULL;
    }
    imp = cm_ipc_import(ctx, pid, fd, (uint64_t)token, data, src);
    if (imp == NULL) {
        return NULL;
    }
    m = cm_ipcmem_new(ctx, imp->ptr, off, size, imp);
    if (m == NULL) {
        /* The import is still ours to undo. */
        PyObject *exc = PyErr_GetRaisedException();

        Py_BEGIN_ALLOW_THREADS
        (void)cm_ipc_pool_release((uintptr_t)imp);
        Py_END_ALLOW_THREADS
        PyErr_SetRaisedException(exc);
        return NULL;
    }
    return (PyObject *)m;
}

/* ------------------------------------------------------------------ */
/* Peers                                                               */
/* ------------------------------------------------------------------ */

PyDoc_STRVAR(cm_ipc_can_access_peer_doc,
"_can_access_peer(device, peer, /)\n--\n\n"
"cuDeviceCanAccessPeer for two device ordinals.");

static PyObject *
cm_ipc_can_access_peer(PyObject *mod, PyObject *const *args,
                       Py_ssize_t nargs)
{
    CUdevice d;
    CUdevice p;
    int a;
    int b;
    int can = 0;

    (void)mod;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError,
                     "_can_access_peer() takes 2 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    a = (int)PyLong_AsLong(args[0]);
    if (a == -1 && PyErr_Occurred()) {
        return NULL;
    }
    b = (int)PyLong_AsLong(args[1]);
    if ((b == -1 && PyErr_Occurred()) || cm_driver_ensure() < 0
        || CM_CU(DeviceGet, (&d, a)) < 0 || CM_CU(DeviceGet, (&p, b)) < 0
        || CM_CU(DeviceCanAccessPeer, (&can, d, p)) < 0) {
        return NULL;
    }
    return PyBool_FromLong(can);
}

/* ------------------------------------------------------------------ */
/* The handle objects                                                  */
/* ------------------------------------------------------------------ */

/* AttributeError for the unset attribute name of self, worded as for a
 * plain object.  NULL. */
static PyObject *
cm_ipc_no_attr(PyObject *self, const char *name)
{
    PyErr_Format(PyExc_AttributeError, "'%.100s' object has no attribute "
                 "'%s'", Py_TYPE(self)->tp_name, name);
    return NULL;
}

/* Fetch what the export makes or calls in Python (cm_state's IpcHandle
 * ... MemoryPointer), once.  0, or -1 with an exception. */
static int
cm_ipc_classes(void)
{
    static const char *const names[6] = {
        "MemoryPointer", "_RawHandle", "_export_array", "_IpcPointer",
        "IpcArrayHandle", "IpcHandle",
    };
    PyObject **slots[6];
    PyObject *got[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    PyObject *mod;
    int i;

    if (cm_st->IpcHandle != NULL) {
        return 0;
    }
    slots[0] = &cm_st->MemoryPointer;
    slots[1] = &cm_st->IpcRawHandle;
    slots[2] = &cm_st->ipc_export_array;
    slots[3] = &cm_st->IpcPointer;
    slots[4] = &cm_st->IpcArrayHandle;
    slots[5] = &cm_st->IpcHandle;
    mod = PyImport_ImportModule("cudamem._ipc");
    if (mod == NULL) {
        return -1;
    }
    for (i = 0; i < 6; i++) {
        got[i] = PyObject_GetAttrString(mod, names[i]);
        if (got[i] == NULL) {
            goto err_drop_fetched;
        }
    }
    if (!PyType_Check(got[3]) || !PyType_Check(got[4])
        || !PyType_Check(got[5])
        || !PyType_IsSubtype((PyTypeObject *)got[3], cm_st->IpcMemory_type)
        || !PyType_IsSubtype((PyTypeObject *)got[4],
                             cm_st->IpcArrayHandleBase_type)
        || !PyType_IsSubtype((PyTypeObject *)got[5],
                             cm_st->IpcHandleBase_type)) {
        PyErr_SetString(PyExc_TypeError,
                        "cudamem._ipc's _IpcPointer, IpcHandle and "
                        "IpcArrayHandle must subclass cudamem._core's "
                        "IpcMemory and handle bases");
        goto err_drop_fetched;
    }
    Py_DECREF(mod);
    /* IpcHandle last: it says the others are there. */
    for (i = 0; i < 6; i++) {
        Py_XSETREF(*slots[i], got[i]);
    }
    return 0;

err_drop_fetched:
    for (i = 0; i < 6; i++) {
        Py_XDECREF(got[i]);
    }
    Py_DECREF(mod);
    return -1;
}

/* ---- IpcHandle's state ---- */

static PyObject *
cm_ipch_get_base(PyObject *self, void *unused)
{
    cm_ipch *h = (cm_ipch *)self;
    PyObject *args[4];
    PyObject *mp;
    int i;

    (void)unused;
    if (h->base == NULL && h->owner != NULL) {
        if (cm_ipc_classes() < 0) {
            return NULL;
        }
        args[0] = (PyObject *)h->ctx;
        args[1] = PyLong_FromUnsignedLongLong((unsigned long long)h->ptr);
        if (args[1] == NULL) {
            return NULL;
        }
        args[2] = PyLong_FromSsize_t(h->span);
        if (args[2] == NULL) {
            Py_DECREF(args[1]);
            return NULL;
        }
        /* Held for the call: MemoryPointer runs Python, which may set
         * base (and so drop them) meanwhile. */
        args[0] = Py_NewRef(args[0]);
        args[3] = Py_NewRef(h->owner);
        /* MemoryPointer(context, pointer, size, owner) */
        mp = PyObject_Vectorcall(cm_st->MemoryPointer, args, 4, NULL);
        for (i = 0; i < 4; i++) {
            Py_DECREF(args[i]);
        }
        if (mp == NULL) {
            return NULL;
        }
        if (h->base == NULL && h->owner != NULL) {
            h->base = mp;
            Py_CLEAR(h->owner);
            Py_CLEAR(h->ctx);
        }
        else {
            /* The call set or dropped base meanwhile: that wins. */
            Py_DECREF(mp);
        }
    }
    if (h->base == NULL) {
        return cm_ipc_no_attr(self, "base");
    }
    return Py_NewRef(h->base);
}

static int
cm_ipch_set_base(PyObject *self, PyObject *value, void *unused)
{
    cm_ipch *h = (cm_ipch *)self;

    (void)unused;
    if (value == NULL && h->base == NULL && h->owner == NULL) {
        (void)cm_ipc_no_attr(self, "base");
        return -1;
    }
    Py_XSETREF(h->base, Py_XNewRef(value));
    Py_CLEAR(h->owner);
    Py_CLEAR(h->ctx);
    return 0;
}

static PyObject *
cm_ipch_get_handle(PyObject *self, void *unused)
{
    cm_ipch *h = (cm_ipch *)self;
    PyObject *raw;
    PyObject *r;

    (void)unused;
    if (h->handle == NULL && h->has_raw) {
        if (cm_ipc_classes() < 0) {
            return NULL;
        }
        raw = PyBytes_FromStringAndSize((const char *)h->raw,
                                        (Py_ssize_t)sizeof(h->raw));
        if (raw == NULL) {
            return NULL;
        }
        r = PyObject_CallOneArg(cm_st->IpcRawHandle, raw);
        Py_DECREF(raw);
        if (r == NULL) {
            return NULL;
        }
        Py_XSETREF(h->handle, r);
        h->has_raw = 0;
    }
    if (h->handle == NULL) {
        return cm_ipc_no_attr(self, "handle");
    }
    return Py_NewRef(h->handle);
}

static int
cm_ipch_set_handle(PyObject *self, PyObject *value, void *unused)
{
    cm_ipch *h = (cm_ipch *)self;

    (void)unused;
    if (value == NULL && h->handle == NULL && !h->has_raw) {
        (void)cm_ipc_no_attr(self, "handle");
        return -1;
    }
    Py_XSETREF(h->handle, Py_XNewRef(value));
    h->has_raw = 0;
    return 0;
}

/* A new dict of a PCI identity, as Device.get_device_identity gives. */
static PyObject *
cm_ipc_identity_dict(const int pci[3])
{
    PyObject *d = PyDict_New();
    PyObject *v;
    int i;

    if (d == NULL) {
        return NULL;
    }
    for (i = 0; i < 3; i++) {
        v = PyLong_FromLong(pci[i]);
        if (v == NULL || PyDict_SetItem(d, cm_str_pci[i], v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(v);
    }
    return d;
}

static PyObject *
cm_ipch_get_source_info(PyObject *self, void *unused)
{
    cm_ipch *h = (cm_ipch *)self;
    PyObject *d;

    (void)unused;
    if (h->source_info == NULL && h->has_pci) {
        d = cm_ipc_identity_dict(h->pci);
        if (d == NULL) {
            return NULL;
        }
        h->source_info = d;
        h->has_pci = 0;
    }
    if (h->source_info == NULL) {
        return cm_ipc_no_attr(self, "source_info");
    }
    return Py_NewRef(h->source_info);
}

static int
cm_ipch_set_source_info(PyObject *self, PyObject *value, void *unused)
{
    cm_ipch *h = (cm_ipch *)self;

    (void)unused;
    if (value == NULL && h->source_info == NULL && !h->has_pci) {
        (void)cm_ipc_no_attr(self, "source_info");
        return -1;
    }
    Py_XSETREF(h->source_info, Py_XNewRef(value));
    h->has_pci = 0;
    return 0;
}

static PyObject *
cm_ipch_get_pool(PyObject *self, void *unused)
{
    cm_ipch *h = (cm_ipch *)self;
    PyObject *t;

    (void)unused;
    if (h->pool == NULL && h->has_pool) {
        t = cm_ipc_pool_tuple(h->pool_pid, h->pool_fd, h->pool_token);
        if (t == NULL) {
            return NULL;
        }
        h->pool = t;
        h->has_pool = 0;
    }
    /* Unset: a legacy handle (made before handles had a kind, too). */
    return Py_NewRef(h->pool == NULL ? Py_None : h->pool);
}

static int
cm_ipch_set_pool(PyObject *self, PyObject *value, void *unused)
{
    cm_ipch *h = (cm_ipch *)self;

    (void)unused;
    Py_XSETREF(h->pool, Py_XNewRef(value));
    h->has_pool = 0;
    return 0;
}

static int
cm_ipch_traverse(PyObject *self, visitproc visit, void *arg)
{
    cm_ipch *h = (cm_ipch *)self;

    Py_VISIT(Py_TYPE(self));
    Py_VISIT(h->base);
    Py_VISIT(h->owner);
    Py_VISIT(h->ctx);
    Py_VISIT(h->handle);
    Py_VISIT(h->size);
    Py_VISIT(h->source_info);
    Py_VISIT(h->offset);
    Py_VISIT(h->pool);
    return 0;
}

static int
cm_ipch_clear(PyObject *self)
{
    cm_ipch *h = (cm_ipch *)self;

    Py_CLEAR(h->base);
    Py_CLEAR(h->owner);
    Py_CLEAR(h->ctx);
    Py_CLEAR(h->handle);
    Py_CLEAR(h->size);
    Py_CLEAR(h->source_info);
    Py_CLEAR(h->offset);
    Py_CLEAR(h->pool);
    return 0;
}

static void
cm_ipch_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);

    PyObject_GC_UnTrack(self);
    (void)cm_ipch_clear(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyGetSetDef cm_ipch_getset[] = {
    {"base", cm_ipch_get_base, cm_ipch_set_base,
     "The exported memory pointer (kept alive by the handle), or None.",
     NULL},
    {"handle", cm_ipch_get_handle, cm_ipch_set_handle,
     "The 64 bytes of the CUipcMemHandle (bytes with .reserved).", NULL},
    {"source_info", cm_ipch_get_source_info, cm_ipch_set_source_info,
     "The exporting device's identity (a dict), or None.", NULL},
    {"pool", cm_ipch_get_pool, cm_ipch_set_pool,
     "None for a cuIpcGetMemHandle handle; for a memory-pool export, the "
     "pool's shareable handle as the exporter holds it: (pid, fd, "
     "token).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef cm_ipch_members[] = {
    {"size", Py_T_OBJECT_EX, offsetof(cm_ipch, size), 0,
     "Bytes exported."},
    {"offset", Py_T_OBJECT_EX, offsetof(cm_ipch, offset), 0,
     "The exported bytes' offset inside the allocation."},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(cm_ipch_doc,
"The attributes of cudamem.IpcHandle, which subclasses this type.");

static PyType_Slot cm_ipch_slots[] = {
    {Py_tp_doc, (void *)cm_ipch_doc},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, cm_ipch_dealloc},
    {Py_tp_traverse, cm_ipch_traverse},
    {Py_tp_clear, cm_ipch_clear},
    {Py_tp_getset, cm_ipch_getset},
    {Py_tp_members, cm_ipch_members},
    {0, NULL},
};

static PyType_Spec cm_ipch_spec = {
    .name = "cudamem._IpcHandleBase",
    .basicsize = sizeof(cm_ipch),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE
             | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = cm_ipch_slots,
};

/* ---- IpcArrayHandle's state ---- */

static PyObject *
cm_ipcah_get_desc(PyObject *self, void *unused)
{
    cm_ipcah *a = (cm_ipcah *)self;
    PyObject *d;

    (void)unused;
    if (a->desc == NULL && a->shape != NULL) {
        d = PyDict_New();
        if (d == NULL || PyDict_SetItem(d, cm_st->str_shape, a->shape) < 0
            || PyDict_SetItem(d, cm_st->str_strides, a->strides) < 0
            || PyDict_SetItem(d, cm_str_dtype, a->dtype) < 0) {
            Py_XDECREF(d);
            return NULL;
        }
        a->desc = d;
        Py_CLEAR(a->shape);
        Py_CLEAR(a->strides);
        Py_CLEAR(a->dtype);
    }
    if (a->desc == NULL) {
        return cm_ipc_no_attr(self, "_array_desc");
    }
    return Py_NewRef(a->desc);
}

static int
cm_ipcah_set_desc(PyObject *self, PyObject *value, void *unused)
{
    cm_ipcah *a = (cm_ipcah *)self;

    (void)unused;
    if (value == NULL && a->desc == NULL && a->shape == NULL) {
        (void)cm_ipc_no_attr(self, "_array_desc");
        return -1;
    }
    Py_XSETREF(a->desc, Py_XNewRef(value));
    Py_CLEAR(a->shape);
    Py_CLEAR(a->strides);
    Py_CLEAR(a->dtype);
    return 0;
}

static int
cm_ipcah_traverse(PyObject *self, visitproc visit, void *arg)
{
    cm_ipcah *a = (cm_ipcah *)self;

    Py_VISIT(Py_TYPE(self));
    Py_VISIT(a->ipc_handle);
    Py_VISIT(a->desc);
    Py_VISIT(a->shape);
    Py_VISIT(a->strides);
    Py_VISIT(a->dtype);
    return 0;
}

static int
cm_ipcah_clear(PyObject *self)
{
    cm_ipcah *a = (cm_ipcah *)self;

    Py_CLEAR(a->ipc_handle);
    Py_CLEAR(a->desc);
    Py_CLEAR(a->shape);
    Py_CLEAR(a->strides);
    Py_CLEAR(a->dtype);
    return 0;
}

static void
cm_ipcah_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);

    PyObject_GC_UnTrack(self);
    (void)cm_ipcah_clear(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyGetSetDef cm_ipcah_getset[] = {
    {"_array_desc", cm_ipcah_get_desc, cm_ipcah_set_desc,
     "The array's description: a dict of shape, strides and dtype.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef cm_ipcah_members[] = {
    {"_ipc_handle", Py_T_OBJECT_EX, offsetof(cm_ipcah, ipc_handle), 0,
     "The IpcHandle."},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(cm_ipcah_doc,
"The attributes of cudamem.IpcArrayHandle, which subclasses this type.");

static PyType_Slot cm_ipcah_slots[] = {
    {Py_tp_doc, (void *)cm_ipcah_doc},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, cm_ipcah_dealloc},
    {Py_tp_traverse, cm_ipcah_traverse},
    {Py_tp_clear, cm_ipcah_clear},
    {Py_tp_getset, cm_ipcah_getset},
    {Py_tp_members, cm_ipcah_members},
    {0, NULL},
};

static PyType_Spec cm_ipcah_spec = {
    .name = "cudamem._IpcArrayHandleBase",
    .basicsize = sizeof(cm_ipcah),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE
             | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = cm_ipcah_slots,
};

/* ------------------------------------------------------------------ */
/* DeviceNDArray.get_ipc_handle                                        */
/* ------------------------------------------------------------------ */

#ifdef __linux__
/* The export of a device array: see get_ipc_handle. */
static PyObject *
cm_ipc_export_array(PyObject *self)
{
    cm_da_desc d;
    cm_context *ctx;
    Py_ssize_t lo = 0;
    Py_ssize_t span;
    CUdeviceptr low;
    cm_ipc_exp x;
    int pci[3];
    PyTypeObject *tp;
    cm_ipch *ih;
    cm_ipcah *ah;
    int i;

    /* Memory that was freed, or an IPC mapping that was closed, has
     * nothing to share: ValueError, as for every other use. */
    if (cm_da_activate_ctx(self) < 0 || cm_ipc_classes() < 0) {
        return NULL;
    }
    (void)cm_da_describe(self, &d);
    for (i = 0; i < d.view.ndim; i++) {
        if (d.view.shape[i] == 0) {
            PyErr_SetString(PyExc_ValueError,
                            "cannot export an empty array through IPC: it "
                            "has no device memory");
            return NULL;
        }
    }
    /* Only memory of the built-in managers takes the C path; a plugin's
     * get_ipc_handle (or the current context's, for memory cudamem did
     * not allocate) is asked from Python. */
    if (!Py_IS_TYPE(d.gpu_data, cm_st->Mem_type)
        || ((cm_mem *)d.gpu_data)->ctx->mm_kind == CM_MM_PLUGIN) {
        return PyObject_CallOneArg(cm_st->ipc_export_array, self);
    }
    ctx = ((cm_mem *)d.gpu_data)->ctx;
    span = cm_layout_span(d.view.ndim, d.view.shape, d.view.strides,
                          d.view.itemsize, &lo);
    /* The view's lowest byte: lo <= 0 is its offset from the first
     * element. */
    low = (CUdeviceptr)d.view.addr - (CUdeviceptr)(-lo);
    if (cm_ipc_export_raw(ctx, low,
                          ((cm_mem *)d.gpu_data)->kind == CM_MM_ASYNC, &x) < 0
        || cm_device_pci(ctx->device, pci) < 0) {
        return NULL;
    }
    tp = (PyTypeObject *)cm_st->IpcHandle;
    ih = (cm_ipch *)tp->tp_alloc(tp, 0);
    if (ih == NULL) {
        return NULL;
    }
    ih->owner = Py_NewRef(d.gpu_data);
    ih->ctx = (cm_context *)Py_NewRef(ctx);
    ih->ptr = low;
    ih->span = span;
    memcpy(ih->raw, x.raw, sizeof(ih->raw));
    ih->has_raw = 1;
    memcpy(ih->pci, pci, sizeof(ih->pci));
    ih->has_pci = 1;
    if (x.pooled) {
        ih->pool_pid = x.pid;
        ih->pool_fd = x.fd;
        ih->pool_token = x.token;
        ih->has_pool = 1;
    }
    ih->size = PyLong_FromSsize_t(span);
    ih->offset = PyLong_FromUnsignedLongLong(
        (unsigned long long)(low - x.base));
    if (ih->size == NULL || ih->offset == NULL) {
        Py_DECREF(ih);
        return NULL;
    }
    tp = (PyTypeObject *)cm_st->IpcArrayHandle;
    ah = (cm_ipcah *)tp->tp_alloc(tp, 0);
    if (ah == NULL) {
        Py_DECREF(ih);
        return NULL;
    }
    ah->ipc_handle = (PyObject *)ih;  /* takes the reference ih came with */
    ah->dtype = Py_NewRef((PyObject *)d.dtype);
    ah->shape = PyObject_GetAttr(self, cm_st->str_shape);
    ah->strides = PyObject_GetAttr(self, cm_st->str_strides);
    if (ah->shape == NULL || ah->strides == NULL) {
        Py_DECREF(ah);
        return NULL;
    }
    return (PyObject *)ah;
}
#endif

PyObject *
cm_ipc_get_handle(PyObject *self, PyObject *unused)
{
    (void)unused;
#ifdef __linux__
    return cm_ipc_export_array(self);
#else
    (void)self;
    PyErr_SetString(PyExc_OSError, "OS does not support CUDA IPC");
    return NULL;
#endif
}

static PyMethodDef cm_ipc_functions[] = {
    {"_ipc_export", (PyCFunction)(void (*)(void))cm_ipc_export,
     METH_FASTCALL, cm_ipc_export_doc},
    {"_ipc_open", (PyCFunction)(void (*)(void))cm_ipc_open, METH_FASTCALL,
     cm_ipc_open_doc},
    {"_ipc_open_pool", (PyCFunction)(void (*)(void))cm_ipc_open_pool,
     METH_FASTCALL, cm_ipc_open_pool_doc},
    {"_can_access_peer", (PyCFunction)(void (*)(void))cm_ipc_can_access_peer,
     METH_FASTCALL, cm_ipc_can_access_peer_doc},
    {NULL, NULL, 0, NULL},
};

int
cm_ipc_init(PyObject *mod, cm_state *st)
{
    int i;

    cm_str_dtype = PyUnicode_InternFromString("dtype");
    if (cm_str_dtype == NULL) {
        return -1;
    }
    for (i = 0; i < 3; i++) {
        cm_str_pci[i] = PyUnicode_InternFromString(cm_pci_keys[i]);
        if (cm_str_pci[i] == NULL) {
            return -1;
        }
    }
    st->IpcMemory_type = cm_make_type(mod, &cm_ipcmem_spec, NULL);
    if (st->IpcMemory_type == NULL) {
        return -1;
    }
    st->IpcHandleBase_type = cm_make_type(mod, &cm_ipch_spec, NULL);
    if (st->IpcHandleBase_type == NULL) {
        return -1;
    }
    st->IpcArrayHandleBase_type = cm_make_type(mod, &cm_ipcah_spec, NULL);
    if (st->IpcArrayHandleBase_type == NULL) {
        return -1;
    }
    return PyModule_AddFunctions(mod, cm_ipc_functions);
}
