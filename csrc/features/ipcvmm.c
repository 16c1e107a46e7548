/* SPDX-License-Identifier: MIT */
/*
 * features/ipcvmm.c: imports of another process's pool pages (memory of
 * the pool manager on virtual memory, exported by memory/pool/vmm/share.c).
 *
 * The handle of such memory names the exporting process (pid), the page
 * size and, for each page in order, the exporter's descriptor of it and
 * the name of that export (an id): pages = (pid, page_size, ((fd, id),
 * ...)); the IpcHandle's offset is where the exported bytes start in the
 * first page, its size how many there are.  An open takes each
 * descriptor with pidfd_open + pidfd_getfd (ptrace access to the
 * exporter needed, as for memory-pool exports), imports it
 * (cuMemImportFromShareableHandle; the descriptor is closed at once, the
 * driver keeps what it needs), reserves npages * page_size bytes of
 * addresses (cuMemAddressReserve), maps the pages there in order
 * (cuMemMap) and gives the importing device read-write access
 * (cuMemSetAccess), and the pages' own device too when it is another
 * (a peer), as the other kinds of import are usable from both; the
 * mapping's pointer is the range's base plus the offset.  Its close unmaps the pages, frees the range and releases the
 * imported pages no other open maps; a failure halfway through an open
 * undoes what the open took.
 *
 * Owns the imported pages of this process: one import of a page per
 * importing context and export (exporter, descriptor, id), counted by
 * the opens that map it and released with the last (the driver does not
 * promise what a second import of one allocation gives, as for
 * memory-pool imports); and the opens (cm_ivmm), listed so that what a
 * context still maps is freed when it is closed.  The id tells apart two
 * exports of the exporter that reuse a descriptor number.
 *
 * Locks and the GIL: cm_vimp_mu (cm_mu_lock) guards the two lists and
 * every refs and dead field; it nests in no other lock (ipcpool.c's
 * cm_ipc_context_closing calls cm_ipc_vmm_context_closing before it takes
 * cm_imp_mu) and is never held across a driver call or a Python call.
 * The releases run from the memory queue without the GIL.  Driver calls
 * that can wait run without the GIL (CM_CU_NOGIL, CM_DRIVER_BEGIN_NOGIL),
 * touching only C locals and the entries the caller holds a reference
 * to.
 */
#include "features/ipc.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A page of another process, imported in one context. */
typedef struct cm_ipage cm_ipage;
struct cm_ipage {
    unsigned long gen;    /* the importing context's generation */
    long pid;             /* the exporting process */
    int fd;               /* its descriptor of the page */
    uint64_t id;          /* its name for the export */
    CUmemGenericAllocationHandle h;  /* the imported memory */
    int refs;             /* the opens that map it */
    int dead;             /* its context was closed: released then */
    cm_ipage *next;       /* link in cm_ipages */
};

/* One open: a range of addresses with the pages mapped in order. */
typedef struct cm_ivmm cm_ivmm;
struct cm_ivmm {
    unsigned long gen;    /* the importing context's generation */
    CUdeviceptr base;     /* the range */
    size_t size;          /* its bytes: n * page */
    size_t page;          /* the page size */
    size_t n;             /* pages */
    cm_ipage **pages;     /* n, each holding one of its references */
    int dead;             /* its context was closed: unmapped then */
    cm_ivmm *next;        /* link in cm_ivmms */
};

/* NOTE: cm_vimp_mu guards the two lists and every refs and dead field;
 * it is never held across a driver call.  An entry is listed while
 * referenced; lookups skip dead ones. */
static pthread_mutex_t cm_vimp_mu = PTHREAD_MUTEX_INITIALIZER;
static cm_ipage *cm_ipages;
static cm_ivmm *cm_ivmms;

int
cm_ipcvmm_fork_init(void)
{
    return cm_atfork_mutex_add(&cm_vimp_mu);
}

/* Drop a reference to ip; the last unlinks it and releases the imported
 * memory (unless its context was closed, or driver is 0).  No GIL
 * needed. */
static CUresult
cm_ipage_unref(cm_ipage *ip, int driver)
{
    cm_ipage **pp;
    CUresult rc = CUDA_SUCCESS;
    int last;

    cm_mu_lock(&cm_vimp_mu);
    last = --ip->refs == 0;
    if (last) {
        for (pp = &cm_ipages; *pp != NULL; pp = &(*pp)->next) {
            if (*pp == ip) {
                *pp = ip->next;
                break;
            }
        }
        driver = driver && !ip->dead;
    }
    cm_mu_unlock(&cm_vimp_mu);
    if (!last) {
        return CUDA_SUCCESS;
    }
    if (driver) {
        rc = CM_CU_RAW(MemRelease, (ip->h));
    }
    free(ip);
    return rc;
}

/* Unmap the first nmap pages of r's range, free the range (when free_va)
 * and drop r's references to its first nref pages; with driver 0 only
 * the references.  No GIL needed.  The first failing CUresult. */
static CUresult
cm_ivmm_undo(cm_ivmm *r, size_t nmap, int free_va, size_t nref,
             int driver)
{
    CUresult first = CUDA_SUCCESS;
    CUresult rc;
    size_t i;

    for (i = 0; driver && i < nmap; i++) {
        rc = CM_CU_RAW(MemUnmap, (r->base + i * r->page, r->page));
        first = first == CUDA_SUCCESS ? rc : first;
    }
    if (driver && free_va) {
        rc = CM_CU_RAW(MemAddressFree, (r->base, r->size));
        first = first == CUDA_SUCCESS ? rc : first;
    }
    for (i = 0; i < nref; i++) {
        rc = cm_ipage_unref(r->pages[i], driver);
        first = first == CUDA_SUCCESS ? rc : first;
    }
    return first;
}

/* Unlink r and free it, unmapping it unless its context was closed or
 * driver is 0.  No GIL needed; r's context current when driver is 1. */
static CUresult
cm_ivmm_free(cm_ivmm *r, int driver)
{
    cm_ivmm **pp;
    CUresult rc;

    cm_mu_lock(&cm_vimp_mu);
    for (pp = &cm_ivmms; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == r) {
            *pp = r->next;
            break;
        }
    }
    driver = driver && !r->dead;
    cm_mu_unlock(&cm_vimp_mu);
    rc = cm_ivmm_undo(r, r->n, 1, r->n, driver);
    free(r->pages);
    free(r);
    return rc;
}

CUresult
cm_ipc_vmm_release(uintptr_t imp)
{
    return cm_ivmm_free((cm_ivmm *)imp, 1);
}

void
cm_ipc_vmm_drop(uintptr_t imp)
{
    (void)cm_ivmm_free((cm_ivmm *)imp, 0);
}

void
cm_ipc_vmm_context_closing(cm_context *ctx)
{
    CUdeviceptr *ranges = NULL;    /* base, size, page: three a range */
    CUmemGenericAllocationHandle *hs = NULL;
    size_t nr = 0;
    size_t nh = 0;
    size_t i;
    size_t off;
    cm_ivmm *r;
    cm_ipage *ip;
    int pushed = 0;

    cm_mu_lock(&cm_vimp_mu);
    for (r = cm_ivmms; r != NULL; r = r->next) {
        nr += !r->dead && r->gen == ctx->gen;
    }
    for (ip = cm_ipages; ip != NULL; ip = ip->next) {
        nh += !ip->dead && ip->gen == ctx->gen;
    }
    /* Without memory for the lists, what the imports hold stays until
     * the process ends (marked dead all the same). */
    ranges = nr ? malloc(3 * nr * sizeof(*ranges)) : NULL;
    hs = nh ? malloc(nh * sizeof(*hs)) : NULL;
    nr = 0;
    nh = 0;
    for (r = cm_ivmms; r != NULL; r = r->next) {
        if (!r->dead && r->gen == ctx->gen) {
            r->dead = 1;
            if (ranges != NULL) {
                ranges[3 * nr] = r->base;
                ranges[3 * nr + 1] = (CUdeviceptr)r->size;
                ranges[3 * nr + 2] = (CUdeviceptr)r->page;
                nr++;
            }
        }
    }
    for (ip = cm_ipages; ip != NULL; ip = ip->next) {
        if (!ip->dead && ip->gen == ctx->gen) {
            ip->dead = 1;
            if (hs != NULL) {
                hs[nh++] = ip->h;
            }
        }
    }
    cm_mu_unlock(&cm_vimp_mu);
    if (nr + nh > 0) {
        CM_DRIVER_BEGIN_NOGIL
        (void)cm_ctx_enter(ctx->handle, &pushed);
        for (i = 0; i < nr; i++) {
            for (off = 0; off < ranges[3 * i + 1]; off += ranges[3 * i + 2]) {
                (void)CM_CU_RAW(MemUnmap, (ranges[3 * i] + off,
                                           (size_t)ranges[3 * i + 2]));
            }
            (void)CM_CU_RAW(MemAddressFree,
                            (ranges[3 * i], (size_t)ranges[3 * i + 1]));
        }
        for (i = 0; i < nh; i++) {
            (void)CM_CU_RAW(MemRelease, (hs[i]));
        }
        cm_ctx_leave(pushed);
        CM_DRIVER_END_NOGIL
    }
    free(ranges);
    free(hs);
}

/* The import in ctx (current) of the page that process pid exported as
 * descriptor fd named id: an existing one counted again, or a new one.
 * NULL with an exception. */
static cm_ipage *
cm_ipage_get(cm_context *ctx, long pid, int fd, uint64_t id)
{
    CUmemGenericAllocationHandle h = 0;
    cm_ipage *ip;
    int got;
    int err;

    cm_mu_lock(&cm_vimp_mu);
    for (ip = cm_ipages; ip != NULL; ip = ip->next) {
        if (!ip->dead && ip->gen == ctx->gen && ip->pid == pid
            && ip->fd == fd && ip->id == id) {
            ip->refs++;
            break;
        }
    }
    cm_mu_unlock(&cm_vimp_mu);
    if (ip != NULL) {
        return ip;
    }
    got = cm_ipc_take_fd(pid, fd, id, CM_IPC_FD_PAGE);
    if (got < 0) {
        return NULL;
    }
    /* The driver keeps what it needs: the descriptor is ours to close. */
    CM_CU_NOGIL(err, MemImportFromShareableHandle,
                (&h, (void *)(intptr_t)got,
                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(got);
    if (err < 0) {
        return NULL;
    }
    ip = calloc(1, sizeof(*ip));
    if (ip == NULL) {
        CM_DRIVER_BEGIN_NOGIL
        (void)CM_CU_RAW(MemRelease, (h));
        CM_DRIVER_END_NOGIL
        PyErr_NoMemory();
        return NULL;
    }
    ip->gen = ctx->gen;
    ip->pid = pid;
    ip->fd = fd;
    ip->id = id;
    ip->h = h;
    ip->refs = 1;
    cm_mu_lock(&cm_vimp_mu);
    ip->next = cm_ipages;
    cm_ipages = ip;
    cm_mu_unlock(&cm_vimp_mu);
    return ip;
}

/* Undo the first nmap mappings and nref page references of an open that
 * failed (its range freed when free_va), with the GIL held and an
 * exception set (kept); then free r. */
static void
cm_ivmm_fail(cm_ivmm *r, size_t nmap, int free_va, size_t nref)
{
    PyObject *exc = PyErr_GetRaisedException();

    CM_DRIVER_BEGIN_NOGIL
    (void)cm_ivmm_undo(r, nmap, free_va, nref, 1);
    CM_DRIVER_END_NOGIL
    free(r->pages);
    free(r);
    PyErr_SetRaisedException(exc);
}

/* Read a pages tuple, (pid, page_size, ((fd, id), ...)): 0 with *n
 * entries in the malloc'd *fds and *ids (the caller frees them), or -1
 * with an exception. */
static int
cm_ipc_pages_arg(PyObject *pages, long *pid, size_t *page, size_t *n,
                 int **fds, uint64_t **ids)
{
    PyObject *seq;
    PyObject *item;
    unsigned long long id;
    Py_ssize_t count;
    Py_ssize_t i;
    const char *bad = "pages must be a (pid, page_size, ((fd, id), ...)) "
                      "tuple";

    *fds = NULL;
    *ids = NULL;
    if (!PyTuple_Check(pages) || PyTuple_GET_SIZE(pages) != 3) {
        PyErr_Format(PyExc_TypeError, "%s, got %.200s", bad,
                     Py_TYPE(pages)->tp_name);
        return -1;
    }
    *pid = PyLong_AsLong(PyTuple_GET_ITEM(pages, 0));
    if (*pid == -1 && PyErr_Occurred()) {
        return -1;
    }
    *page = PyLong_AsSize_t(PyTuple_GET_ITEM(pages, 1));
    if (*page == (size_t)-1 && PyErr_Occurred()) {
        return -1;
    }
    if (*page == 0 || (*page & (*page - 1)) != 0) {
        PyErr_Format(PyExc_ValueError,
                     "the page size of an IPC handle must be a power of "
                     "two, got %zu", *page);
        return -1;
    }
    seq = PySequence_Fast(PyTuple_GET_ITEM(pages, 2), bad);
    if (seq == NULL) {
        return -1;
    }
    count = PySequence_Fast_GET_SIZE(seq);
    if (count == 0 || (size_t)count > SIZE_MAX / *page) {
        PyErr_Format(PyExc_ValueError,
                     "an IPC handle of pool pages names 1 to %zu pages, "
                     "got %zd", SIZE_MAX / *page, count);
        goto err;
    }
    *fds = malloc((size_t)count * sizeof(**fds));
    *ids = malloc((size_t)count * sizeof(**ids));
    if (*fds == NULL || *ids == NULL) {
        PyErr_NoMemory();
        goto err;
    }
    for (i = 0; i < count; i++) {
        item = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_Check(item)
            || !PyArg_ParseTuple(item, "iK", &(*fds)[i], &id)) {
            if (!PyErr_Occurred() || PyErr_ExceptionMatches(
                                         PyExc_TypeError)) {
                PyErr_Clear();
                PyErr_Format(PyExc_TypeError, "%s", bad);
            }
            goto err;
        }
        (*ids)[i] = (uint64_t)id;
    }
    *n = (size_t)count;
    Py_DECREF(seq);
    return 0;

err:
    Py_DECREF(seq);
    free(*fds);
    free(*ids);
    *fds = NULL;
    *ids = NULL;
    return -1;
}

const char cm_ipc_open_vmm_doc[] = PyDoc_STR(
"_ipc_open_vmm(context, pages, size, offset=0, /)\n--\n\n"
"Map into context the pages of another process's pool on virtual\n"
"memory that pages names, (pid, page_size, ((fd, id), ...)) as that\n"
"process exported them: each descriptor is taken with pidfd_getfd and\n"
"imported, and the pages are mapped in order into a new range of\n"
"addresses that context's device may read and write.  A new IpcMemory\n"
"whose device_pointer is offset bytes past the range's base and whose\n"
"size is size.  Another open of the same pages in the same context\n"
"shares their imports (not the range).");

PyObject *
cm_ipc_open_vmm(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    cm_context *ctx;
    Py_ssize_t size;
    Py_ssize_t off;
    long pid = 0;
    size_t page = 0;
    size_t n = 0;
    size_t i;
    int *fds = NULL;
    uint64_t *ids = NULL;
    cm_ivmm *r;
    cm_ipcmem *m;
    CUmemAllocationProp prop;
    CUmemAccessDesc acc[2];
    CUdeviceptr base = 0;
    int nacc = 1;
    int err;

    (void)mod;
    ctx = cm_ipc_open_args("_ipc_open_vmm", args, nargs, 3, &size, &off);
    if (ctx == NULL
        || cm_ipc_pages_arg(args[1], &pid, &page, &n, &fds, &ids) < 0) {
        return NULL;
    }
    if ((size_t)off > n * page || (size_t)size > n * page - (size_t)off) {
        PyErr_Format(PyExc_ValueError,
                     "the IPC handle's %zd bytes at offset %zd lie outside "
                     "its %zu pages of %zu bytes", size, off, n, page);
        goto out_free_args;
    }
    if (pid == (long)getpid()) {
        /* The pages are this process's own: nothing to import. */
        PyErr_SetString(PyExc_ValueError,
                        "opening IpcHandle from original process");
        goto out_free_args;
    }
    if (cm_context_activate(ctx) < 0) {
        goto out_free_args;
    }
    r = calloc(1, sizeof(*r));
    if (r == NULL || (r->pages = calloc(n, sizeof(*r->pages))) == NULL) {
        free(r);
        PyErr_NoMemory();
        goto out_free_args;
    }
    r->gen = ctx->gen;
    r->size = n * page;
    r->page = page;
    r->n = n;
    for (i = 0; i < n; i++) {
        r->pages[i] = cm_ipage_get(ctx, pid, fds[i], ids[i]);
        if (r->pages[i] == NULL) {
            cm_ivmm_fail(r, 0, 0, i);
            goto out_free_args;
        }
    }
    CM_CU_NOGIL(err, MemAddressReserve, (&base, r->size, page, 0, 0));
    if (err < 0) {
        cm_ivmm_fail(r, 0, 0, n);
        goto out_free_args;
    }
    r->base = base;
    for (i = 0; i < n; i++) {
        CM_CU_NOGIL(err, MemMap, (base + i * page, page, 0,
                                  r->pages[i]->h, 0));
        if (err < 0) {
            cm_ivmm_fail(r, i, 1, n);
            goto out_free_args;
        }
    }
    /* The importing device, and the pages' own if it is another. */
    memset(&prop, 0, sizeof(prop));
    CM_CU_NOGIL(err, MemGetAllocationPropertiesFromHandle,
                (&prop, r->pages[0]->h));
    if (err < 0) {
        cm_ivmm_fail(r, n, 1, n);
        goto out_free_args;
    }
    memset(acc, 0, sizeof(acc));
    acc[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc[0].location.id = (int)ctx->device->handle;
    acc[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE
        && prop.location.id != acc[0].location.id) {
        acc[1] = acc[0];
        acc[1].location.id = prop.location.id;
        nacc = 2;
    }
    CM_CU_NOGIL(err, MemSetAccess, (base, r->size, acc, (size_t)nacc));
    if (err < 0) {
        cm_ivmm_fail(r, n, 1, n);
        goto out_free_args;
    }
    cm_mu_lock(&cm_vimp_mu);
    r->next = cm_ivmms;
    cm_ivmms = r;
    cm_mu_unlock(&cm_vimp_mu);
    m = cm_ipcmem_new(ctx, base, off, size, NULL);
    if (m == NULL) {
        /* The open is still ours to undo. */
        PyObject *exc = PyErr_GetRaisedException();

        CM_DRIVER_BEGIN_NOGIL
        (void)cm_ipc_vmm_release((uintptr_t)r);
        CM_DRIVER_END_NOGIL
        PyErr_SetRaisedException(exc);
        goto out_free_args;
    }
    m->vimp = r;
    free(fds);
    free(ids);
    return (PyObject *)m;

out_free_args:
    free(fds);
    free(ids);
    return NULL;
}
