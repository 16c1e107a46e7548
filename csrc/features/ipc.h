/* SPDX-License-Identifier: MIT */
/*
 * features/ipc.h: what the files of IPC share (ipc.c, ipcpool.c,
 * ipcvmm.c, ipchandle.c: the sections of one concept, kept in files of
 * their own).  They stand in layers, each using only those below it:
 * ipcbase.c (the shared helpers), ipcvmm.c (pool pages), ipcpool.c
 * (memory-pool imports), ipc.c (export, IpcMemory), ipchandle.c (the
 * handle objects, get_ipc_handle and the init).
 * Private to them: the rest of the folder and module.c use
 * features/features.h.
 */
#ifndef CM_IPC_H
#define CM_IPC_H

#include "features/features.h"

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
    void *vimp;           /* an import of pool pages (ipcvmm.c's
                           * cm_ivmm), or NULL; imp is NULL then */
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
    PyObject *pages;      /* strong or NULL (None): an export of pool
                           * pages, (pid, page_size, ((fd, id), ...)) */
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
#define cm_str_dtype (cm_st->str_dtype)
#define cm_str_pci (cm_st->str_pci)

extern const char *const cm_pci_keys[3];

/* The Context argument of the module functions: borrowed, or NULL with
 * TypeError. */
cm_context *cm_ipc_context_arg(PyObject *obj);

/* What an export gives. */
typedef struct {
    unsigned char raw[CU_IPC_HANDLE_SIZE];  /* the handle's bytes (zeros
                                             * for pool pages) */
    CUdeviceptr base;     /* the allocation's base (the first page's) */
    size_t size;          /* and size (the pages') */
    int pooled;           /* a memory-pool export: the next three apply */
    long pid;             /* the exporting process (this one) */
    int fd;               /* the pool's shareable handle here */
    uint64_t token;       /* the pool's name */
    PyObject *pages;      /* new reference or NULL: an export of pool
                           * pages, (pid, page_size, ((fd, id), ...)) */
} cm_ipc_exp;

/* Export the allocation of ctx that contains addr, or, for memory of the
 * pool on virtual memory, the pages under [addr, addr + span) (span 0:
 * to the end of its block).  pooled: 1 when it is known to come from the
 * async manager's pool, 0 when known not to, -1 to ask the driver.  0
 * (the caller owns out->pages), or -1 with an exception. */
int cm_ipc_export_raw(cm_context *ctx, CUdeviceptr addr, size_t span,
                      int pooled, cm_ipc_exp *out);

/* The (pid, fd, token) tuple of a memory-pool export. */
PyObject *cm_ipc_pool_tuple(long pid, int fd, uint64_t token);

PyObject *
cm_ipc_export(PyObject *mod, PyObject *const *args, Py_ssize_t nargs);

/* The two non-negative sizes of an open: size, and offset (0 when
 * absent).  0, or -1 with an exception. */
int cm_ipc_sizes(PyObject *size_arg, PyObject *off_arg, Py_ssize_t *size,
                 Py_ssize_t *off);

/* The arguments every open shares: fname's nargs must be nmin, or nmin + 1
 * with the offset last; args[0] the Context, args[2] the size.  Also
 * checks the registered classes (cm_ipc_classes).  The Context
 * (borrowed) with *size and *off, or NULL with an exception. */
cm_context *cm_ipc_open_args(const char *fname, PyObject *const *args,
                             Py_ssize_t nargs, Py_ssize_t nmin,
                             Py_ssize_t *size, Py_ssize_t *off);

/* A new IpcMemory (an instance of cudamem._ipc._IpcPointer) over the
 * mapping at p of ctx, showing size bytes from p + off; imp as for the
 * field.  NULL with an exception (the mapping is then the caller's). */
cm_ipcmem *cm_ipcmem_new(cm_context *ctx, CUdeviceptr p, Py_ssize_t off,
                         Py_ssize_t size, void *imp);

PyObject *cm_ipc_open(PyObject *mod, PyObject *const *args, Py_ssize_t nargs);

extern PyType_Spec cm_ipcmem_spec;

PyObject *
cm_ipc_open_pool(PyObject *mod, PyObject *const *args, Py_ssize_t nargs);

PyObject *
cm_ipc_open_vmm(PyObject *mod, PyObject *const *args, Py_ssize_t nargs);

/* What a descriptor taken from another process is (the messages of
 * cm_ipc_take_fd). */
enum {
    CM_IPC_FD_POOL = 0,   /* a memory pool's shareable handle */
    CM_IPC_FD_PAGE        /* a pool page's (ipcvmm.c) */
};

/* A descriptor of this process for descriptor fd of process pid (it is
 * close-on-exec), or -1 with OSError saying why not; kind: CM_IPC_FD_*,
 * check the value the handle carries beside fd (the pool's token, the
 * page's id), which the exporter's socket checks.  By pidfd_getfd, then,
 * where that is refused, over the exporter's socket (memory/fdserve.c);
 * CUDAMEM_IPC_FD ("auto", "pidfd", "socket") picks.  GIL held. */
int cm_ipc_take_fd(long pid, int fd, uint64_t check, int kind);

PyObject *cm_ipc_can_access_peer(PyObject *mod, PyObject *const *args,
                                 Py_ssize_t nargs);

/* Fetch what the export makes or calls in Python (cm_state's IpcHandle
 * ... MemoryPointer), once.  0, or -1 with an exception. */
int cm_ipc_classes(void);

/* The imported pools' mutex made fresh in a fork's child (ipcpool.c).
 * 0, or -1 with an exception set. */
int cm_ipcpool_fork_init(void);
/* The same for the imported pages' mutex (ipcvmm.c). */
int cm_ipcvmm_fork_init(void);


/* Docstrings of functions whose tables live in another file. */
extern const char cm_ipc_export_doc[];
extern const char cm_ipc_open_doc[];
extern const char cm_ipc_open_pool_doc[];
extern const char cm_ipc_open_vmm_doc[];
extern const char cm_ipc_can_access_peer_doc[];

/* Let go of one open of a memory-pool import (the handle of a
 * CM_REL_IPC_POOL release): the last frees the imported memory and, with
 * its pool's last allocation, the imported pool.  No GIL needed; the
 * import's context current.  The first failing CUresult, or success. */
CUresult cm_ipc_pool_release(uintptr_t imp);
/* The same for an import whose context was closed: no driver call. */
void cm_ipc_pool_drop(uintptr_t imp);

/* Let go of one open of pool pages (the handle of a CM_REL_IPC_VMM
 * release): unmap them, free the range, release the pages no other open
 * maps.  No GIL needed; the import's context current.  The first failing
 * CUresult, or success. */
CUresult cm_ipc_vmm_release(uintptr_t imp);
/* The same for an open whose context was closed: no driver call. */
void cm_ipc_vmm_drop(uintptr_t imp);
/* Free what ctx (being closed) still imports of pool pages (ipcvmm.c;
 * called by cm_ipc_context_closing). */
void cm_ipc_vmm_context_closing(cm_context *ctx);


#endif /* CM_IPC_H */
