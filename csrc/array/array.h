/* SPDX-License-Identifier: MIT */
/*
 * array/array.h: the array layer as the features above see it, and its
 * public header (the folder's other headers, devicearray.h, convert.h,
 * dlpack_abi.h and ixcode.h, are private to it).  The folder owns the
 * device arrays (DeviceNDArrayBase, DeviceNDArray, DeviceRecord) and the
 * host-backed arrays, their layouts, indexing and assignment, the copy
 * engine over plain views (copy.c) and the copies to and from the host,
 * the internal kernels (the copy-with-cast of kernels.c and convert.h,
 * the indexing kernels of gather.c), the CUDA Array Interface and
 * DLPack.  What the memory layer below calls here it reaches through
 * cm_mem_up (memory/memory.h), which types.c fills; what it calls in the
 * features layer above, through cm_array_up (below).
 *
 * Locks and the GIL: the folder has no lock of its own; the GIL guards
 * its state (the loaded kernels' tables, the page-locked buffers of
 * assignments).  The driver calls that can wait run without the GIL on C data only;
 * copy.c decides where a copy keeps or releases it (cm_copy_host,
 * CM_HOST_LOCKED) and leaves the thread-local cm_done_hint.  Each file
 * that drops the GIL says where in its head comment.
 */
#ifndef CM_ARRAY_H
#define CM_ARRAY_H

#include "driver/driver.h"
#include "memory/memory.h"

/* ------------------------------------------------------------------ */
/* kernels.c: internal kernels (NVRTC on a GPU, host code on the sim)  */
/* ------------------------------------------------------------------ */

#define CM_KMAXDIM 32

/* Element type codes; used by the kernels'
 * conversion code (convert.h) and cm_elem_type_of. */
#define CM_T_BOOL 0
#define CM_T_I8 1
#define CM_T_U8 2
#define CM_T_I16 3
#define CM_T_U16 4
#define CM_T_I32 5
#define CM_T_U32 6
#define CM_T_I64 7
#define CM_T_U64 8
#define CM_T_F16 9
#define CM_T_F32 10
#define CM_T_F64 11
#define CM_T_C64 12
#define CM_T_C128 13
#define CM_T_BYTES 14   /* opaque items of a given size: copied, not cast */


/* An N-d strided copy with a cast: dst[i] = cast(src[i]) over shape.
 * Zero source strides broadcast.  Types are CM_T_* codes of convert.h;
 * CM_T_BYTES on both sides copies opaque items of itemsize bytes. */
typedef struct {
    int ndim;                          /* 0..CM_KMAXDIM */
    Py_ssize_t shape[CM_KMAXDIM];      /* extents */
    Py_ssize_t dst_strides[CM_KMAXDIM];  /* bytes */
    Py_ssize_t src_strides[CM_KMAXDIM];  /* bytes, 0 to broadcast */
    CUdeviceptr dst;                   /* address of element (0,...,0) */
    CUdeviceptr src;                   /* address of element (0,...,0) */
    int dst_type;                      /* CM_T_* */
    int src_type;                      /* CM_T_* */
    int itemsize;                      /* bytes, for CM_T_BYTES */
} cm_copy_desc;

/* Enqueue the copy on stream in ctx; 0, or -1 with an exception
 * (CudaSupportError when NVRTC is missing on a GPU). */
int cm_copy_kernel(cm_context *ctx, const cm_copy_desc *d, CUstream stream);
/* Compile an internal kernel's CUDA C source with NVRTC (through its
 * disk cache) for ctx's device and load it in ctx (current): *mod, 0; or
 * -1 with an exception.  name names the program in NVRTC's log. */
int cm_kernel_build(cm_context *ctx, const char *src, const char *name,
                    CUmodule *mod);
/* The CM_T_* code of a dtype: a numeric code for native-order numeric
 * types, else CM_T_BYTES. */
int cm_elem_type_of(PyArray_Descr *dt);

/* ------------------------------------------------------------------ */
/* devicearray.c: layouts and the copy engine                          */
/* ------------------------------------------------------------------ */

/* A strided view of memory on either side of the bus: what the layout
 * math and the copy engine work on, shared by device arrays and the
 * host-backed (mapped / managed) arrays. */
typedef struct {
    uintptr_t addr;             /* address of the first logical element */
    int ndim;
    const Py_ssize_t *shape;    /* ndim entries */
    const Py_ssize_t *strides;  /* ndim entries, bytes, any sign */
    Py_ssize_t itemsize;
    int device;                 /* 1: device memory, 0: host memory */
} cm_view;

/* 0 when NumPy could make an array of that layout (its size and byte
 * span fit in Py_ssize_t), else -1 with NumPy's ValueError. */
int cm_layout_check(int ndim, const Py_ssize_t *shape,
                    const Py_ssize_t *strides, Py_ssize_t itemsize);
/* Copy src into dst, element by element in logical order: both have the
 * same shape once size-1 dimensions are dropped and the same itemsize.
 * Any layouts; zero strides only where src has them too (or src only).
 * Writes no byte of dst's span outside the view.  async: use the ...Async
 * calls on stream; staged copies then synchronise stream before they
 * return.  0, or -1 with an exception set. */
int cm_copy(const cm_view *dst, const cm_view *src, CUstream stream,
            int async);
/* What the caller of cm_copy_host knows of the copy's host side. */
enum {
    CM_HOST_OTHER = -1,    /* nothing to go on: cm_copy as it is */
    CM_HOST_UNKNOWN = 0,   /* a host array that may be pageable, the
                            * device side plain device memory */
    CM_HOST_LOCKED = 1     /* cudamem's page-locked memory of the copy's
                            * context (cm_hostmem_page_locked) */
};
/* cm_copy of one side in host memory, the other on the device; host is a
 * CM_HOST_* value.  CM_HOST_LOCKED: while _core._copy_keep_gil is on
 * (or 'auto', the default, and cm_keep_gil_now says so), an asynchronous
 * copy of one piece is issued with the GIL kept (it only enqueues).
 * CM_HOST_UNKNOWN: where the direction's cm_sync_copy_call is not
 * CM_SYNC_CALL (host to device, by default), a synchronous copy of one
 * contiguous piece whose host side proves pageable is made by the
 * asynchronous call on the default stream (cm_copy_pageable).  Otherwise
 * it is cm_copy. */
int cm_copy_host(const cm_view *dst, const cm_view *src, CUstream stream,
                 int async, int host);

/* Whether o is a cudamem device array (DeviceNDArrayBase or a subclass):
 * 1 with the address of its first element in *ptr, else 0.  The fast
 * path for kernel arguments; never raises. */
int cm_devicearray_pointer(PyObject *o, CUdeviceptr *ptr);
/* The Context of a device array's memory (borrowed; NULL when empty or
 * unknown).  o must be a device array. */
cm_context *cm_devicearray_context(PyObject *o);

/* What the files that extend device arrays (dlpack.c) see of one: all
 * borrowed, valid while the array lives. */
typedef struct {
    cm_view view;              /* layout; view.addr is the first element */
    PyArray_Descr *dtype;
    PyObject *stream;          /* the bound stream (0 or a stream) */
    PyObject *gpu_data;        /* what keeps the memory alive, or None */
    cm_context *ctx;           /* the context of the memory's device, or
                                * NULL (empty, or not known) */
} cm_da_desc;

/* 1 with *d filled when obj is a device array (DeviceNDArrayBase), else
 * 0. */
int cm_da_describe(PyObject *obj, cm_da_desc *d);
/* The effective bound stream of a device array: 1 with the handle in *h
 * when bound (asynchronous), 0 when unbound, -1 with an exception. */
int cm_da_bound_stream(PyObject *obj, CUstream *h);
/* Make the context of a device array's memory current (or the thread's
 * default context). */
int cm_da_activate_ctx(PyObject *obj);
/* A new DeviceNDArray: over memory that owner keeps alive, ptr being the
 * first logical element, or (owner NULL) over a fresh allocation of the
 * layout's span in the current context.  stream NULL means 0.  Steals
 * nothing; an empty array drops owner at once. */
PyObject *cm_da_wrap(int ndim, const Py_ssize_t *shape,
                    const Py_ssize_t *strides, PyArray_Descr *dtype,
                    CUdeviceptr ptr, PyObject *owner, PyObject *stream);

/* ------------------------------------------------------------------ */
/* dlpack.c: DLPack export and import                                  */
/* ------------------------------------------------------------------ */

/* DLPack device types cudamem exchanges (docs/api.md#dlpack): device
 * memory (what its arrays export), pinned / mapped host memory and
 * managed memory (also accepted on import). */
#define CM_DLDEV_CUDA 2
#define CM_DLDEV_CUDA_HOST 3
#define CM_DLDEV_CUDA_MANAGED 13

/* __dlpack__ / __dlpack_device__ of an array over memory of DLPack device
 * type dl_type (CM_DLDEV_*): the host-backed array types call these from
 * their own methods with their device type. */
PyObject *cm_dlpack_export_as(PyObject *self, int dl_type,
                              PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames);
PyObject *cm_dlpack_device_as(PyObject *self, int dl_type);
/* The methods of DeviceNDArrayBase (device memory, kDLCUDA). */
PyObject *cm_dlpack_export(PyObject *self, PyObject *const *args,
                           Py_ssize_t nargs, PyObject *kwnames);
PyObject *cm_dlpack_device(PyObject *self, PyObject *unused);
extern const char cm_dlpack_export_doc[];
extern const char cm_dlpack_device_doc[];

/* ------------------------------------------------------------------ */
/* functions.c, devicearray.c: made for the host arrays and the layers */
/* above                                                               */
/* ------------------------------------------------------------------ */

/* Whether o is a device array: 1 with what keeps its memory alive (its
 * gpu_data, borrowed) in *owner, else 0.  Never raises. */
int cm_devicearray_owner(PyObject *o, PyObject **owner);
/* device_array's (shape, dtype, strides, order) rules: fills shape[] and
 * strides[] (NPY_MAXDIMS entries each) and *dtype (a new reference);
 * ndim, or -1 with an exception.  Any argument may be NULL (default). */
int cm_layout_parse(PyObject *shape_o, PyObject *dtype_o,
                    PyObject *strides_o, PyObject *order_o,
                    Py_ssize_t *shape, Py_ssize_t *strides,
                    PyArray_Descr **dtype);
/* device_array_like's rules: the layout of a new array like ary (host or
 * device); ndim, or -1. */
int cm_layout_like(PyObject *ary, Py_ssize_t *shape, Py_ssize_t *strides,
                   PyArray_Descr **dtype);
/* A new DeviceNDArray over memory that gpu_data keeps alive; ptr is the
 * address of the first logical element (ignored when empty); stream NULL
 * means 0.  Steals nothing. */
PyObject *cm_devicearray_new(int ndim, const Py_ssize_t *shape,
                             const Py_ssize_t *strides,
                             PyArray_Descr *dtype, CUdeviceptr ptr,
                             PyObject *gpu_data, PyObject *stream);

/* What the array layer calls in the layer above it, through pointers
 * that layer sets in its init function (features/ipchandle.c's
 * cm_ipc_init, in module exec before any Python code can call into the
 * module). */
typedef struct {
    /* cm_ipc_get_handle: DeviceNDArray.get_ipc_handle (METH_NOARGS) */
    PyObject *(*ipc_get_handle)(PyObject *self, PyObject *unused);
    /* cm_ipc_mem_closed: 1 if o is an IpcMemory that was closed, else 0;
     * never raises */
    int (*ipc_mem_closed)(PyObject *o);
} cm_array_upcalls;

extern cm_array_upcalls cm_array_up;

/* ------------------------------------------------------------------ */
/* init functions of the array layer                                  */
/* ------------------------------------------------------------------ */

int cm_kernels_init(PyObject *mod, cm_state *st);
int cm_gather_init(PyObject *mod, cm_state *st);
int cm_devicearray_init(PyObject *mod, cm_state *st);
int cm_hostarray_init(PyObject *mod, cm_state *st);
/* A heap type from spec (base may be NULL) bound to mod, added to mod
 * under the name after the spec name's dot; NULL with an exception. */
PyTypeObject *cm_make_type(PyObject *mod, PyType_Spec *spec,
                           PyTypeObject *base);
int cm_dlpack_init(PyObject *mod, cm_state *st);

#endif /* CM_ARRAY_H */
