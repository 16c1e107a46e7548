/* SPDX-License-Identifier: MIT */
/*
 * features/ipcpool.c: imports of allocations of other processes' memory
 * pools, and peer access for opened memory.
 *
 * Locks and the GIL: cm_imp_mu (cm_mu_lock) guards the two lists of
 * imports and every refs, dead and access field; it nests in no other
 * lock (a closing context's pages, ipcvmm.c, are freed before it is
 * taken) and is never held across a driver call or a Python call.  The
 * releases (cm_ipc_pool_release, _drop) run from the memory queue
 * without the GIL.  The imports and a closing context's frees run
 * without the GIL (CM_CU_NOGIL, CM_DRIVER_BEGIN_NOGIL), touching only C
 * locals and the entries the caller holds a reference to.
 */
#include "features/ipc.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

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

int
cm_ipcpool_fork_init(void)
{
    /* In a fork's child the lists are the parent's; nothing there frees
     * through them (cm_forked), but the mutex must not be one another
     * parent thread held. */
    return cm_atfork_mutex_add(&cm_imp_mu);
}

/* Drop a reference to ip; the last unlinks it and destroys the imported
 * pool (unless its context was closed, or driver is 0).  No GIL needed;
 * some context current when driver is 1. */
static CUresult
cm_ipool_unref(cm_ipool *ip, int driver)
{
    cm_ipool **pp;
    CUresult rc = CUDA_SUCCESS;
    int last;

    cm_mu_lock(&cm_imp_mu);
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
    cm_mu_unlock(&cm_imp_mu);
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

    cm_mu_lock(&cm_imp_mu);
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
    cm_mu_unlock(&cm_imp_mu);
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
    int pushed = 0;

    if (cm_forked) {
        return;
    }
    cm_ipc_vmm_context_closing(ctx);
    cm_mu_lock(&cm_imp_mu);
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
    cm_mu_unlock(&cm_imp_mu);
    if (nptrs + npools > 0) {
        CM_DRIVER_BEGIN_NOGIL
        (void)cm_ctx_enter(ctx->handle, &pushed);
        for (i = 0; i < nptrs; i++) {
            (void)CM_CU_RAW(MemFree, (ptrs[i]));
        }
        for (i = 0; i < npools; i++) {
            (void)CM_CU_RAW(MemPoolDestroy, (pools[i]));
        }
        cm_ctx_leave(pushed);
        CM_DRIVER_END_NOGIL
    }
    free(ptrs);
    free(pools);
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

    got = cm_ipc_take_fd(pid, fd, token, CM_IPC_FD_POOL);
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
        CM_DRIVER_BEGIN_NOGIL
        (void)CM_CU_RAW(MemPoolDestroy, (pool));
        CM_DRIVER_END_NOGIL
        PyErr_NoMemory();
        return NULL;
    }
    ip->gen = ctx->gen;
    ip->pid = pid;
    ip->fd = fd;
    ip->token = token;
    ip->pool = pool;
    ip->refs = 1;
    cm_mu_lock(&cm_imp_mu);
    ip->next = cm_ipools;
    cm_ipools = ip;
    cm_mu_unlock(&cm_imp_mu);
    return ip;
}

/* Drop a reference taken in this file's open path, with the GIL held and
 * an exception perhaps set (kept). */
static void
cm_ipool_unref_gil(cm_ipool *ip)
{
    PyObject *exc = PyErr_GetRaisedException();

    CM_DRIVER_BEGIN_NOGIL
    (void)cm_ipool_unref(ip, 1);
    CM_DRIVER_END_NOGIL
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

    cm_mu_lock(&cm_imp_mu);
    for (p = cm_iptrs; p != NULL; p = p->next) {
        ip = p->ipool;
        if (!p->dead && ip->gen == ctx->gen && ip->pid == pid
            && ip->fd == fd && ip->token == token
            && memcmp(p->data, data, sizeof(p->data)) == 0) {
            p->refs++;
            cm_mu_unlock(&cm_imp_mu);
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
    cm_mu_unlock(&cm_imp_mu);
    if (ip == NULL) {
        ip = cm_ipool_import(ctx, pid, fd, token);
        if (ip == NULL) {
            return NULL;
        }
    }
    /* The pool's memory is its device's; another device that opens it
     * needs access (the devices are peers, or the open is staged). */
    cm_mu_lock(&cm_imp_mu);
    need_access = src != ctx->device->id && !(ip->access & bit);
    cm_mu_unlock(&cm_imp_mu);
    if (need_access) {
        memset(&acc, 0, sizeof(acc));
        acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        acc.location.id = (int)ctx->device->handle;
        acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        CM_CU_NOGIL(err, MemPoolSetAccess, (ip->pool, &acc, 1));
        if (err < 0) {
            goto err_unref_pool;
        }
        cm_mu_lock(&cm_imp_mu);
        ip->access |= bit;
        cm_mu_unlock(&cm_imp_mu);
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
    cm_mu_lock(&cm_imp_mu);
    p->next = cm_iptrs;
    cm_iptrs = p;
    cm_mu_unlock(&cm_imp_mu);
    return p;

err_free_record:
    free(p);
err_unref_pool:
    cm_ipool_unref_gil(ip);
    return NULL;
}

const char cm_ipc_open_pool_doc[] = PyDoc_STR(
"_ipc_open_pool(context, handle, size, pool, source, offset=0, /)\n--\n\n"
"Import into context the allocation of another process's memory pool\n"
"that handle (64 bytes of cuMemPoolExportPointer) names; pool is the\n"
"pool's shareable handle as that process holds it, (pid, fd, token),\n"
"and source the ordinal here of the pool's device.  A new IpcMemory\n"
"whose device_pointer is offset bytes past the allocation's base and\n"
"whose size is size, as for _ipc_open.  Another open of the same export\n"
"in the same context shares the import.");

PyObject *
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
    ctx = cm_ipc_open_args("_ipc_open_pool", args, nargs, 5, &size, &off);
    if (ctx == NULL) {
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

        CM_DRIVER_BEGIN_NOGIL
        (void)cm_ipc_pool_release((uintptr_t)imp);
        CM_DRIVER_END_NOGIL
        PyErr_SetRaisedException(exc);
        return NULL;
    }
    return (PyObject *)m;
}

/* ------------------------------------------------------------------ */
/* Peers                                                               */
/* ------------------------------------------------------------------ */

const char cm_ipc_can_access_peer_doc[] = PyDoc_STR(
"_can_access_peer(device, peer, /)\n--\n\n"
"cuDeviceCanAccessPeer for two device ordinals.");

PyObject *
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
