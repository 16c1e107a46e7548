/* SPDX-License-Identifier: MIT */
/*
 * array/devicearray.h: what the files of the device-array types share
 * (copy.c, argparse.c, devicearray.c, cai.c, transfer.c,
 * attrs.c, assign.c, methods.c, record.c, functions.c, types.c: the
 * sections of one concept, kept in files of their own).  Private to
 * them: the rest of the folder (dlpack.c, kernels.c) and the layers above
 * use array/array.h.
 */
#ifndef CM_DEVICEARRAY_H
#define CM_DEVICEARRAY_H

#include "array/array.h"

/* The last paragraph of the docstrings of the copies that may be staged
 * (to_device, copy_to_host, copy_to_device). */
#define CM_DOC_STAGED                                                   \
    "Large copies of pageable host memory may go through the staging\n"  \
    "pipeline (see the README: CUDAMEM_STAGING).  Such a copy has "     \
    "completed\n"                                                       \
    "when it returns, also an asynchronous one (issued on its stream "   \
    "after\n"                                                           \
    "the work queued there); the driver's own asynchronous copies of\n" \
    "pageable memory likewise return only once the host memory is "      \
    "consumed\n"                                                        \
    "or filled."

/* ------------------------------------------------------------------ */
/* The copy engine                                                     */
/* ------------------------------------------------------------------ */

/* Two views walked together: dst and src strides per joint dimension,
 * with size-1 dimensions dropped, dimensions both sides broadcast
 * dropped, the key side's strides made positive, sorted outermost first
 * by the key side's stride and adjacent dimensions merged. */
typedef struct {
    int ndim;
    Py_ssize_t shape[NPY_MAXDIMS];
    Py_ssize_t ds[NPY_MAXDIMS];
    Py_ssize_t ss[NPY_MAXDIMS];
    uintptr_t dst;
    uintptr_t src;
    int dst_dev;
    int src_dev;
    Py_ssize_t itemsize;
    Py_ssize_t count;          /* elements */
} cm_joint;

/* Wait for stream (GIL released); 0 or -1. */
int cm_stream_wait(CUstream stream);

/* The raw element type that moves itemsize bytes unchanged. */
int cm_raw_type(Py_ssize_t itemsize);

/* ------------------------------------------------------------------ */
/* Argument parsing                                                    */
/* ------------------------------------------------------------------ */

enum {
    K_SHAPE, K_STRIDES, K_DTYPE, K_ORDER, K_STREAM, K_GPU_DATA, K_ARY,
    K_OBJ, K_COPY, K_TO, K_SYNC, K_OWNER, K_DESC, K_AXIS, K_SECTION,
    K_ITEM, K_KEY, K_VALUE, K_AXES, K_N_NAMES
};

extern const char *const cm_kw_text[K_N_NAMES];

/* Interned names and constants, fields of the module state
 * (driver/driver.h). */
#define cm_kw (cm_st->kw)
#define cm_str_cuda_memory (cm_st->str_cuda_memory)
#define cm_str_cai (cm_st->str_cai)
#define cm_str_sync_cfg (cm_st->str_sync_cfg)
#define cm_zero (cm_st->zero)
#define cm_three (cm_st->three)
#define cm_str_C (cm_st->str_C)

/* cm_argparse with names given as indices into cm_kw. */
int cm_parse(const char *fname, PyObject *const *args, Py_ssize_t nargs,
             PyObject *kwnames, const int *names, int n, int nreq,
             PyObject **out);

/* One dimension or stride from an integer-like object; one beyond
 * Py_ssize_t is a ValueError, as in NumPy. */
int cm_as_ssize(PyObject *o, Py_ssize_t *v);

int cm_parse_shape(PyObject *obj, Py_ssize_t *shape);

int cm_parse_shape_signed(PyObject *obj, Py_ssize_t *shape);

/* Fail with ValueError where NumPy refuses the shape: when the product
 * of the non-zero extents times itemsize overflows, even if another
 * extent is 0 (an empty array NumPy could not make cannot be copied
 * back).  A zero itemsize counts as 1, so that the element count fits. */
int cm_check_size(int ndim, const Py_ssize_t *shape, Py_ssize_t itemsize);

/* 0 if the byte span of a layout fits in Py_ssize_t (so that
 * cm_layout_span cannot overflow), else -1 with ValueError. */
int cm_check_span(int ndim, const Py_ssize_t *shape, const Py_ssize_t *strides,
                  Py_ssize_t itemsize);

/* A new dtype reference from a dtype argument (NULL: float64). */
PyArray_Descr *cm_parse_dtype(PyObject *obj);

/* ------------------------------------------------------------------ */
/* The array object                                                    */
/* ------------------------------------------------------------------ */

#define CM_DA_INLINE 4

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int ndim;
    Py_ssize_t *shape;         /* ndim entries: dims_inline or heap */
    Py_ssize_t *strides;       /* ndim entries after shape */
    Py_ssize_t dims_inline[2 * CM_DA_INLINE];
    PyObject *shape_t;         /* tuple of shape, made on first use */
    PyObject *strides_t;       /* tuple of strides, likewise */
    PyArray_Descr *dtype;      /* strong */
    CUdeviceptr ptr;           /* first logical element; 0 when empty */
    Py_ssize_t size;           /* elements */
    Py_ssize_t alloc_size;     /* byte span */
    Py_ssize_t lo;             /* offset of the span's lowest byte */
    int c_contig;              /* NumPy-1.19 flags */
    int f_contig;
    PyObject *gpu_data;        /* strong: keeps the memory alive, or None */
    PyObject *stream;          /* strong: bound stream (0 or a stream) */
    cm_context *ctx;           /* strong or NULL: the context of the
                                * memory's device (NULL: empty, or not
                                * known), made current around every
                                * operation */
    PyObject *cai_typestr;     /* strong or NULL: dtype.str, made on the
                                * first CAI export */
    PyObject *cai_data;        /* strong or NULL: (ptr, False), likewise */
    PyObject *gpu_shown;       /* strong or NULL: what the gpu_data
                                * attribute shows, made on first use (a
                                * pointer to the bytes this array spans) */
    int gpu_foreign;           /* gpu_data is a foreign owner (a CUDA Array
                                * Interface import): gpu_data shows a
                                * MemoryPointer owned by it, as numba */
    PyObject *weakreflist;
} cm_da;

/* The module state for slots and functions. */
#define ST cm_st

int cm_da_check(PyObject *o);

void cm_da_view(cm_da *a, cm_view *v);

void cm_nd_view(PyArrayObject *arr, cm_view *v);

PyObject *cm_ssize_tuple(int n, const Py_ssize_t *v);

/* The owner's device address, for DeviceNDArray(..., gpu_data=owner). */
int cm_owner_ptr(PyObject *owner, CUdeviceptr *p);

/* 0 if a's memory is still allocated; -1 with ValueError when its
 * DeviceAllocation (or that of the array it views, as as_cuda_array
 * makes) was freed with free(), its IPC mapping (IpcMemory) was
 * closed, or its mapped() registration was closed. */
int cm_da_alive(cm_da *a);

/* Make the context of a's memory current (or the thread's default). */
int cm_da_activate(cm_da *a);

/* Make a's context current for one operation; *prev as for
 * cm_context_enter (NULL when a has no context of its own). */
int cm_da_enter(cm_da *a, CUcontext *prev);

void cm_da_leave(cm_da *a, CUcontext prev);

/* A new array of type tp over a layout.  gpu_data NULL: allocate the
 * span (nothing when empty) and place the first element; else ptr is the
 * first element's address in memory that gpu_data keeps alive.  stream
 * NULL means 0.  Steals nothing. */
PyObject *
cm_da_make_in(PyTypeObject *tp, cm_context *hint, int ndim,
              const Py_ssize_t *shape, const Py_ssize_t *strides,
              PyArray_Descr *dtype, CUdeviceptr ptr, PyObject *gpu_data,
              PyObject *stream);

/* cm_da_make_in, the context found from the owner. */
PyObject *
cm_da_make(PyTypeObject *tp, int ndim, const Py_ssize_t *shape,
           const Py_ssize_t *strides, PyArray_Descr *dtype, CUdeviceptr ptr,
           PyObject *gpu_data, PyObject *stream);

/* A view of a: same memory and owner, new layout, bound to stream (NULL:
 * a's stream).  offset: bytes from a's first element. */
PyObject *
cm_da_subview(cm_da *a, PyTypeObject *tp, int ndim, const Py_ssize_t *shape,
              const Py_ssize_t *strides, PyArray_Descr *dtype,
              Py_ssize_t offset, PyObject *stream);

int cm_da_traverse(PyObject *self, visitproc visit, void *arg);

int cm_da_clear(PyObject *self);

void cm_da_dealloc(PyObject *self);

/* The effective stream of a call: the stream argument if truthy, else
 * the array's bound stream.  1 (async on *h), 0 (synchronous) or -1.
 * *obj (when obj is not NULL) gets the object the stream came from
 * (borrowed). */
int cm_effective_stream_obj(PyObject *arg, PyObject *bound, CUstream *h,
                            PyObject **obj);

int cm_effective_stream(PyObject *arg, PyObject *bound, CUstream *h);

/* Note that async work just queued on h (from stream object sobj) used
 * a's memory, so that its release waits for it (cm_mem_note_use); a
 * no-op for synchronous work, which has completed.  0 or -1. */
int cm_da_used_on(cm_da *a, int async, CUstream h, PyObject *sobj);

/* The stream a view made with a stream argument is bound to. */
PyObject *cm_pick_stream(PyObject *arg, cm_da *a);

/* numba's check_array_compatibility without the strides rule (cudamem
 * copies between any layouts): TypeError on dtype, ValueError on shape;
 * the message ends with which is which, the device array then other
 * ("the source" or "the destination"). */
int cm_check_compatible(PyArray_Descr *d1, int n1, const Py_ssize_t *s1,
                        PyArray_Descr *d2, int n2, const Py_ssize_t *s2,
                        const char *other);

/* ------------------------------------------------------------------ */
/* CUDA Array Interface import                                         */
/* ------------------------------------------------------------------ */

/* config.CUDA_ARRAY_INTERFACE_SYNC, read at each use; 1, 0 or -1. */
int cm_config_cai_sync(void);

/* 0 if memory cudamem did not allocate, that an array spans, may be
 * used by the device: p, the address given, lies inside an allocation
 * the driver knows, of any kind and from any library (device, managed,
 * page-locked or mapped host memory, IPC mappings), and the span, bytes
 * [p + lo, p + lo + n) (lo <= 0 < n), fits inside it; or, where the
 * device reaches pageable memory, the span is mapped memory of this
 * process.  Else -1 with ValueError: what names the address's source,
 * reach what spans it, for the messages.  One pointer query
 * (cuPointerGetAttributes answers for unknown addresses without
 * failing); the driver's range query where that entry point fails. */
int cm_check_extent(CUdeviceptr p, Py_ssize_t lo, size_t n, const char *what,
                    const char *reach);

/* A DeviceNDArray view over the memory a CAI dict describes, owned by
 * owner (may be NULL).  Synchronises on the dict's stream when sync and
 * config.CUDA_ARRAY_INTERFACE_SYNC are both true. */
PyObject *cm_from_cai(PyObject *desc, PyObject *owner, int sync);

/* A cm_da for a device-side source: a cudamem array (new reference to
 * it) or any CAI object (a synchronised view); NULL without an exception
 * when obj is neither. */
cm_da *cm_as_device_source(PyObject *obj);

/* ------------------------------------------------------------------ */
/* Copies                                                              */
/* ------------------------------------------------------------------ */

/* dst <- src through a pinned host buffer laid out like src: src's
 * device fills it with its context current, then dst's empties it with
 * dst's current (the caller's).  Complete when it returns. */
int cm_copy_via_host(cm_da *dst, cm_da *src, CUstream h, int async);

/* Order the work queued next on h (a stream of the current context)
 * after what the default stream of another context, src, has queued so
 * far: a synchronous to_device there returns before its bytes land (as
 * the driver's pageable copy does), and nothing orders this context's
 * streams after another's.  0, or -1 with an exception. */
int cm_wait_other_default(cm_context *src, CUstream h);

/* cm_da_copy_from_run with the array's context current. */
int cm_da_copy_from(cm_da *self, PyObject *ary, PyObject *stream);

/* cm_da_copy_to_host_impl_run with the array's context current. */
PyObject *
cm_da_copy_to_host_impl(cm_da *self, PyObject *ary, PyObject *stream);

/* A new C-contiguous host copy of a device view with dtype; waits for an
 * async copy to land. */
PyArrayObject *
cm_view_to_host(const cm_view *v, PyArray_Descr *dtype, CUstream h,
                int async);

/* ------------------------------------------------------------------ */
/* Attributes                                                          */
/* ------------------------------------------------------------------ */

/* The shape tuple (strides 0) or the strides tuple (1), made on first
 * use (most arrays never show theirs); borrowed, or NULL with an
 * exception. */
PyObject *cm_da_dims_tuple(cm_da *a, int strides);

PyObject *cm_da_get_shape(PyObject *self, void *unused);

PyObject *cm_da_get_strides(PyObject *self, void *unused);

PyObject *cm_da_get_ndim(PyObject *self, void *unused);

PyObject *cm_da_get_size(PyObject *self, void *unused);

PyObject *cm_da_get_dtype(PyObject *self, void *unused);

PyObject *cm_da_get_itemsize(PyObject *self, void *unused);

PyObject *cm_da_get_nbytes(PyObject *self, void *unused);

PyObject *cm_da_get_alloc_size(PyObject *self, void *unused);

PyObject *cm_da_get_gpu_data(PyObject *self, void *unused);

PyObject *cm_da_get_stream(PyObject *self, void *unused);

int cm_da_set_stream(PyObject *self, PyObject *value, void *unused);

PyObject *cm_da_get_ctypes_ptr(PyObject *self, void *unused);

PyObject *cm_da_get_flags(PyObject *self, void *unused);

PyObject *cm_da_get_cai(PyObject *self, void *unused);

/* ------------------------------------------------------------------ */
/* Indexing                                                            */
/* ------------------------------------------------------------------ */

/* Apply a basic index (ints and slices) to a layout, numba's way.  Fills
 * the result layout, the byte offset of its first element and whether
 * every dimension was indexed by an integer. */
int cm_layout_index(int ndim, const Py_ssize_t *shape,
                    const Py_ssize_t *strides, PyObject *item, int *ondim,
                    Py_ssize_t *oshape, Py_ssize_t *ostrides,
                    Py_ssize_t *offset, int *all_int);

/* arr[idx] for one integer index array held on the device, without
 * cudamem._index (gather.c); *handled 0 (NULL, no exception) when the
 * key is not of that kind after all. */
PyObject *cm_ix_take(cm_da *arr, cm_da *idx, PyObject *stream, int *handled);

/* Read one element at addr as a NumPy scalar (a blocking copy). */
PyObject *
cm_read_scalar(CUdeviceptr addr, PyArray_Descr *dtype, PyObject *stream,
               PyObject *bound);

/* cm_da_getitem_impl_run with the array's context current. */
PyObject *cm_da_getitem_impl(cm_da *self, PyObject *item, PyObject *stream);

PyObject *cm_da_subscript(PyObject *self, PyObject *item);

/* Fill the device view lhs (dtype) from value with numba's broadcasting
 * rules; host values are cast with NumPy's unsafe casting. */
/* lhs = cast(src) elementwise by the internal kernel; src strides are
 * per lhs dimension (0 broadcasts).  Waits for it unless async. */
int cm_assign_by_kernel(const cm_view *lhs, int dst_type, CUdeviceptr src,
                        const Py_ssize_t *src_strides, int src_type,
                        CUstream h, int async);

/* lhs = host broadcast over lhs (rstrides: host's strides per lhs
 * dimension, 0 where it broadcasts): one upload of the compact host
 * value into a temporary device buffer, then the kernel.  The temporary's
 * free is deferred, so it outlives the kernel. */
/* ------------------------------------------------------------------ */
/* Host values of asynchronous assignments                             */
/* ------------------------------------------------------------------ */

/* d[...] = value on a stream must not wait for the stream, yet the host
 * value (often a temporary) must outlive the copy that reads it.  It is
 * copied into one of these page-locked buffers, which is handed out
 * again only once an event recorded after that copy has completed.
 * Buffers belong to one primary context (gen): those of a context that
 * was closed or reset went with it and are forgotten without a driver
 * call.  GIL held throughout. */
#define CM_HV_SLOTS 1024                /* at most this many buffers */

/* cm_da_setitem_impl_run with the array's context current. */
int cm_da_setitem_impl(cm_da *self, PyObject *key, PyObject *value,
                       PyObject *stream);

int cm_da_ass_subscript(PyObject *self, PyObject *key, PyObject *value);

Py_ssize_t cm_da_length(PyObject *self);

PyObject *
cm_da_copy_to_host(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                   PyObject *kwnames);

PyObject *cm_da_copy_to_device(PyObject *self, PyObject *const *args,
                               Py_ssize_t nargs, PyObject *kwnames);

PyObject *
cm_da_getitem(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
              PyObject *kwnames);

PyObject *
cm_da_setitem(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
              PyObject *kwnames);

PyObject *cm_da_bind(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                     PyObject *kwnames);

PyObject *cm_da_is_c_contiguous(PyObject *self, PyObject *unused);

PyObject *cm_da_is_f_contiguous(PyObject *self, PyObject *unused);

PyObject *cm_da_as_cuda_arg(PyObject *self, PyObject *unused);

PyObject *
cm_da_reshape(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
              PyObject *kwnames);

PyObject *cm_da_ravel(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                      PyObject *kwnames);

PyObject *cm_da_view_meth(PyObject *self, PyObject *arg);

PyObject *
cm_da_squeeze(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
              PyObject *kwnames);

PyObject *cm_da_split(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                      PyObject *kwnames);

PyObject *
cm_da_transpose(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                PyObject *kwnames);

PyObject *cm_da_get_T(PyObject *self, void *unused);

PyObject *cm_da_array(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                      PyObject *kwnames);

/* ------------------------------------------------------------------ */
/* DeviceRecord                                                        */
/* ------------------------------------------------------------------ */

/* The dtype and offset of field key of a structured dtype (borrowed), or
 * NULL with KeyError. */
PyArray_Descr *
cm_record_field(PyArray_Descr *dt, PyObject *key, Py_ssize_t *offset);

PyObject *cm_rec_subscript(PyObject *self, PyObject *key);

int cm_rec_ass_subscript(PyObject *self, PyObject *key, PyObject *value);

PyObject *
cm_rec_getitem(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
               PyObject *kwnames);

PyObject *
cm_rec_setitem(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
               PyObject *kwnames);

/* ------------------------------------------------------------------ */
/* Module functions                                                    */
/* ------------------------------------------------------------------ */

/* Parse the shape / strides / order triple of device_array and the
 * constructor into shape[] and strides[]; ndim or -1.  order NULL: the
 * strides must be given (the constructor). */
int
cm_parse_layout(PyObject *shape_o, PyObject *strides_o, PyObject *order_o,
                Py_ssize_t itemsize, Py_ssize_t *shape, Py_ssize_t *strides);

PyObject *
cm_device_array(PyObject *mod, PyObject *const *args, Py_ssize_t nargs,
                PyObject *kwnames);

PyObject *
cm_device_array_like(PyObject *mod, PyObject *const *args, Py_ssize_t nargs,
                     PyObject *kwnames);

PyObject *cm_to_device(PyObject *mod, PyObject *const *args, Py_ssize_t nargs,
                       PyObject *kwnames);

PyObject *cm_is_cuda_array(PyObject *mod, PyObject *obj);

PyObject *
cm_as_cuda_array(PyObject *mod, PyObject *const *args, Py_ssize_t nargs,
                 PyObject *kwnames);

PyObject *cm_from_cuda_array_interface(PyObject *mod, PyObject *const *args,
                                       Py_ssize_t nargs, PyObject *kwnames);

PyObject *
cm_da_vectorcall(PyObject *type, PyObject *const *args, size_t nargsf,
                 PyObject *kwnames);

PyObject *cm_da_new(PyTypeObject *tp, PyObject *args, PyObject *kwds);

/* DeviceRecord(dtype, stream=0, gpu_data=None): the DeviceNDArray
 * constructor with shape and strides (). */
PyObject *cm_rec_new(PyTypeObject *tp, PyObject *args, PyObject *kwds);

PyObject *cm_da_sq_item(PyObject *self, Py_ssize_t i);

/* ------------------------------------------------------------------ */
/* Types                                                               */
/* ------------------------------------------------------------------ */

#define CM_FAST (METH_FASTCALL | METH_KEYWORDS)

/* Docstrings of functions whose tables live in another file. */
extern const char cm_da_copy_to_host_doc[];
extern const char cm_da_copy_to_device_doc[];
extern const char cm_da_getitem_doc[];
extern const char cm_da_setitem_doc[];
extern const char cm_da_bind_doc[];
extern const char cm_da_reshape_doc[];
extern const char cm_da_ravel_doc[];
extern const char cm_da_view_doc[];
extern const char cm_da_squeeze_doc[];
extern const char cm_da_split_doc[];
extern const char cm_da_transpose_doc[];
extern const char cm_da_array_doc[];
extern const char cm_rec_getitem_doc[];
extern const char cm_rec_setitem_doc[];
extern const char cm_device_array_doc[];
extern const char cm_device_array_like_doc[];
extern const char cm_to_device_doc[];
extern const char cm_is_cuda_array_doc[];
extern const char cm_as_cuda_array_doc[];
extern const char cm_from_cai_doc[];

#endif /* CM_DEVICEARRAY_H */
