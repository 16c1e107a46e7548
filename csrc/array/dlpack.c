/* SPDX-License-Identifier: MIT */
/*
 * dlpack.c: DLPack export (__dlpack__, __dlpack_device__) and import
 * (from_dlpack) of device arrays.
 *
 * Export hands out a capsule over a managed tensor that holds a strong
 * reference to the array; its deleter drops that reference (taking the
 * GIL: a consumer may call it from any thread) and frees the block.  The
 * capsule's destructor calls the deleter only while the capsule is
 * unconsumed; a consumer renames it to "used_..." and takes ownership.
 * Import consumes a producer's capsule the same way and keeps the
 * tensor in an owner capsule (the view's gpu_data) whose destructor
 * calls the producer's deleter exactly once.
 *
 * Stream ordering follows the DLPack Python specification for CUDA: the
 * producer makes the data ready on the consumer's stream by recording an
 * event on the array's stream and making the consumer's stream wait.
 *
 * Strides: DLPack strides are signed element counts, so negative and
 * zero (broadcast) strides are exported and imported as they are; byte
 * strides that are not a multiple of the itemsize cannot be described.
 *
 * Locks and the GIL: no lock of its own; the GIL is held except inside
 * a deleter called by a consumer, which takes it before touching Python
 * objects.
 */
#include "array/array.h"
#include "array/dlpack_abi.h"

#include <string.h>

/* Owner capsule names of an imported tensor, by ABI. */
#define CM_OWNER_NAME "cudamem.dlpack_owner"
#define CM_OWNER_NAME_V "cudamem.dlpack_owner_versioned"

enum { K_STREAM, K_MAX_VERSION, K_DL_DEVICE, K_COPY, K_N };

static const char *const cm_dl_kw_text[K_N] = {
    "stream", "max_version", "dl_device", "copy",
};

_Static_assert(K_N == CM_DLPACK_KW_N,
               "cm_state.dl_kw holds one entry per K_* name");

/* Interned names and constants, fields of the module state
 * (driver/driver.h). */
#define cm_dl_kw (cm_st->dl_kw)
#define cm_str_dlpack (cm_st->str_dlpack)
#define cm_str_dlpack_device (cm_st->str_dlpack_device)
#define cm_kwn_versioned (cm_st->dl_kwn_versioned)
#define cm_kwn_legacy (cm_st->dl_kwn_legacy)
#define cm_max_version (cm_st->dl_max_version)

/* ------------------------------------------------------------------ */
/* Data types                                                          */
/* ------------------------------------------------------------------ */

/* The DLPack type of a dtype; -1 with BufferError for the dtypes DLPack
 * cannot describe. */
static int
cm_dl_dtype_of(PyArray_Descr *d, cm_dl_dtype *out)
{
    int code;
    Py_ssize_t size = PyDataType_ELSIZE(d);

    if (!PyArray_ISNBO(d->byteorder)) {
        PyErr_Format(PyExc_BufferError,
                     "DLPack only describes native byte order; dtype %S is "
                     "byte-swapped", d);
        return -1;
    }
    switch (d->type_num) {
    case NPY_BOOL:
        code = CM_DL_BOOL;
        break;
    case NPY_BYTE: case NPY_SHORT: case NPY_INT: case NPY_LONG:
    case NPY_LONGLONG:
        code = CM_DL_INT;
        break;
    case NPY_UBYTE: case NPY_USHORT: case NPY_UINT: case NPY_ULONG:
    case NPY_ULONGLONG:
        code = CM_DL_UINT;
        break;
    case NPY_HALF: case NPY_FLOAT: case NPY_DOUBLE:
        code = CM_DL_FLOAT;
        break;
    case NPY_CFLOAT: case NPY_CDOUBLE:
        code = CM_DL_COMPLEX;
        break;
    case NPY_LONGDOUBLE: case NPY_CLONGDOUBLE:
        PyErr_Format(PyExc_BufferError,
                     "DLPack has no type for %S (long double is not an "
                     "IEEE type without padding)", d);
        return -1;
    default:
        PyErr_Format(PyExc_BufferError,
                     "DLPack has no type for dtype %S: only bool, integer, "
                     "floating and complex dtypes can be exported "
                     "(structured, datetime, string and object dtypes "
                     "cannot)", d);
        return -1;
    }
    out->code = (uint8_t)code;
    out->bits = (uint8_t)(size * 8);
    out->lanes = 1;
    return 0;
}

/* The dtype of a DLPack type (new reference), or NULL with BufferError. */
static PyArray_Descr *
cm_descr_of_dl(cm_dl_dtype t)
{
    int tn = -1;

    if (t.lanes == 1) {
        switch (t.code) {
        case CM_DL_INT:
            tn = t.bits == 8 ? NPY_INT8 : t.bits == 16 ? NPY_INT16
                 : t.bits == 32 ? NPY_INT32 : t.bits == 64 ? NPY_INT64 : -1;
            break;
        case CM_DL_UINT:
            tn = t.bits == 8 ? NPY_UINT8 : t.bits == 16 ? NPY_UINT16
                 : t.bits == 32 ? NPY_UINT32 : t.bits == 64 ? NPY_UINT64
                 : -1;
            break;
        case CM_DL_FLOAT:
            tn = t.bits == 16 ? NPY_FLOAT16 : t.bits == 32 ? NPY_FLOAT32
                 : t.bits == 64 ? NPY_FLOAT64 : -1;
            break;
        case CM_DL_COMPLEX:
            tn = t.bits == 64 ? NPY_COMPLEX64 : t.bits == 128
                 ? NPY_COMPLEX128 : -1;
            break;
        case CM_DL_BOOL:
            tn = t.bits == 8 ? NPY_BOOL : -1;
            break;
        default:
            break;
        }
    }
    if (tn < 0) {
        PyErr_Format(PyExc_BufferError,
                     "from_dlpack: DLPack data type (code %d, bits %d, "
                     "lanes %d) has no NumPy dtype", (int)t.code,
                     (int)t.bits, (int)t.lanes);
        return NULL;
    }
    return PyArray_DescrFromType(tn);
}

/* ------------------------------------------------------------------ */
/* Export                                                              */
/* ------------------------------------------------------------------ */

/* One exported tensor: the managed tensor (either ABI), the array it
 * keeps alive and the shape and strides it points to. */
typedef struct {
    union {
        cm_dl_managed legacy;
        cm_dl_managed_v versioned;
    } m;
    PyObject *array;           /* strong, dropped by the deleter */
    int64_t dims[];            /* shape, then strides (2 * ndim) */
} cm_dl_export;

/* Drop the array and free the block; any thread, GIL held or not. */
static void
cm_dl_export_release(cm_dl_export *x)
{
    /* After finalisation the array is leaked on purpose: no Python code
     * may run any more. */
    if (x->array != NULL && !Py_IsFinalizing()) {
        PyGILState_STATE g = PyGILState_Ensure();
        PyObject *exc = PyErr_GetRaisedException();

        Py_CLEAR(x->array);
        PyErr_SetRaisedException(exc);
        PyGILState_Release(g);
    }
    PyMem_RawFree(x);
}

static void
cm_dl_deleter(cm_dl_managed *m)
{
    cm_dl_export_release((cm_dl_export *)m->manager_ctx);
}

static void
cm_dl_deleter_v(cm_dl_managed_v *m)
{
    cm_dl_export_release((cm_dl_export *)m->manager_ctx);
}

/* The destructor of an exported capsule: deletes the tensor unless a
 * consumer took it (renamed the capsule). */
static void
cm_dl_capsule_free(PyObject *cap)
{
    PyObject *exc = PyErr_GetRaisedException();

    if (PyCapsule_IsValid(cap, CM_DL_NAME_V)) {
        cm_dl_managed_v *m = PyCapsule_GetPointer(cap, CM_DL_NAME_V);

        m->deleter(m);
    }
    else if (PyCapsule_IsValid(cap, CM_DL_NAME)) {
        cm_dl_managed *m = PyCapsule_GetPointer(cap, CM_DL_NAME);

        m->deleter(m);
    }
    PyErr_SetRaisedException(exc);
}

/* The device ordinal of an array's memory: its allocating context's
 * device, else what the driver says of the pointer, else the current
 * device. */
static int
cm_dl_device_id(const cm_da_desc *d, int *id)
{
    cm_context *ctx;
    int ord = 0;

    if (d->ctx != NULL) {
        *id = d->ctx->device->id;
        return 0;
    }
    if (d->view.addr != 0
        && CM_CU_RAW(PointerGetAttribute,
                     (&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                      (CUdeviceptr)d->view.addr)) == CUDA_SUCCESS) {
        *id = ord;
        return 0;
    }
    ctx = cm_context_current();
    if (ctx == NULL) {
        return -1;
    }
    *id = ctx->device->id;
    return 0;
}

/* The device self's data is on, as (type, ordinal). */
static int
cm_dl_describe_self(PyObject *self, cm_da_desc *d, int *id)
{
    if (!cm_da_describe(self, d)) {
        PyErr_Format(PyExc_TypeError, "expected a device array, not %.100s",
                     Py_TYPE(self)->tp_name);
        return -1;
    }
    return cm_dl_device_id(d, id);
}

PyObject *
cm_dlpack_device_as(PyObject *self, int dl_type)
{
    cm_da_desc d;
    int id;

    if (cm_dl_describe_self(self, &d, &id) < 0) {
        return NULL;
    }
    return Py_BuildValue("(ii)", dl_type, id);
}

PyObject *
cm_dlpack_device(PyObject *self, PyObject *unused)
{
    (void)unused;
    return cm_dlpack_device_as(self, CM_DLDEV_CUDA);
}

/* The consumer's stream argument: *h the handle (1 legacy default, 2
 * per-thread default, else a stream), *nosync for -1. */
static int
cm_dl_parse_stream(PyObject *o, uintptr_t *h, int *nosync)
{
    long long v;

    *nosync = 0;
    if (o == NULL || o == Py_None) {
        *h = 1;
        return 0;
    }
    if (!PyLong_Check(o) || PyBool_Check(o)) {
        PyErr_Format(PyExc_TypeError,
                     "__dlpack__: stream must be an int or None, not "
                     "%.100s", Py_TYPE(o)->tp_name);
        return -1;
    }
    v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        *h = (uintptr_t)PyLong_AsUnsignedLongLong(o);
        if (*h == (uintptr_t)-1 && PyErr_Occurred()) {
            return -1;
        }
        return cm_stream_handle_check(*h, "__dlpack__ stream");
    }
    if (v == -1) {
        *nosync = 1;
        *h = 0;
        return 0;
    }
    if (v == 0) {
        PyErr_SetString(PyExc_ValueError,
                        "__dlpack__: stream=0 is ambiguous on CUDA and not "
                        "allowed; pass None or 1 (legacy default stream), 2 "
                        "(per-thread default stream), a stream handle, or "
                        "-1 (no synchronisation)");
        return -1;
    }
    if (v < -1) {
        PyErr_Format(PyExc_ValueError,
                     "__dlpack__: stream %lld is not a stream handle", v);
        return -1;
    }
    *h = (uintptr_t)v;
    return cm_stream_handle_check(*h, "__dlpack__ stream");
}

/* Parse a (int, int) pair; -1 with TypeError naming what. */
static int
cm_dl_pair(PyObject *o, const char *what, long long *a, long long *b)
{
    if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != 2) {
        PyErr_Format(PyExc_TypeError,
                     "__dlpack__: %s must be a tuple of two ints, not "
                     "%.100s", what, Py_TYPE(o)->tp_name);
        return -1;
    }
    *a = PyLong_AsLongLong(PyTuple_GET_ITEM(o, 0));
    if (*a == -1 && PyErr_Occurred()) {
        return -1;
    }
    *b = PyLong_AsLongLong(PyTuple_GET_ITEM(o, 1));
    return (*b == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* Make the data of an array ready on the consumer's stream: record an
 * event on the array's stream and make the consumer's wait for it.
 * Nothing when both are the same stream. */
static int
cm_dl_order(PyObject *arr, uintptr_t consumer)
{
    CUstream ph = NULL;
    CUevent ev = NULL;
    CUresult drc;
    uintptr_t producer;
    int r;

    r = cm_da_bound_stream(arr, &ph);
    if (r < 0) {
        return -1;
    }
    if (r == 0 || ph == NULL) {
        /* Unbound arrays and the default stream: the default stream of
         * cudamem's mode. */
        ph = NULL;
        producer = cm_driver_per_thread() ? 2 : 1;
    }
    else {
        producer = (uintptr_t)ph;
    }
    if (producer == consumer) {
        return 0;
    }
    if (cm_da_activate_ctx(arr) < 0
        || CM_CU(EventCreate, (&ev, CU_EVENT_DISABLE_TIMING)) < 0) {
        return -1;
    }
    r = CM_CU(EventRecord, (ev, ph)) < 0
        || CM_CU(StreamWaitEvent, ((CUstream)consumer, ev, 0)) < 0 ? -1 : 0;
    /* The driver keeps the event until the wait is resolved. */
    drc = CM_CU_RAW(EventDestroy, (ev));
    if (r == 0) {
        r = cm_cu_check(drc, "cuEventDestroy");
    }
    return r;
}

/* A new C-contiguous device copy of d, bound to the same stream, the
 * copy enqueued on the array's effective stream. */
static PyObject *
cm_dl_copy(PyObject *self, const cm_da_desc *d)
{
    Py_ssize_t strides[NPY_MAXDIMS];
    Py_ssize_t sd = d->view.itemsize;
    PyObject *res;
    cm_da_desc nd;
    CUstream h = NULL;
    int async;
    int i;

    for (i = d->view.ndim - 1; i >= 0; i--) {
        strides[i] = sd;
        sd *= d->view.shape[i] > 0 ? d->view.shape[i] : 1;
    }
    async = cm_da_bound_stream(self, &h);
    if (async < 0 || cm_da_activate_ctx(self) < 0) {
        return NULL;
    }
    res = cm_da_wrap(d->view.ndim, d->view.shape, strides, d->dtype, 0,
                     NULL, d->stream);
    if (res == NULL) {
        return NULL;
    }
    (void)cm_da_describe(res, &nd);
    if (nd.view.addr != 0 && cm_copy(&nd.view, &d->view, h, async) < 0) {
        Py_DECREF(res);
        return NULL;
    }
    return res;
}

/* Whether DLPack can describe an array: its dtype and its strides (in
 * whole elements).  0, or -1 with BufferError. */
static int
cm_dl_check_exportable(const cm_da_desc *d, cm_dl_dtype *dt)
{
    int i;

    if (cm_dl_dtype_of(d->dtype, dt) < 0) {
        return -1;
    }
    for (i = 0; i < d->view.ndim; i++) {
        if (d->view.shape[i] > 1 && d->view.strides[i] % d->view.itemsize) {
            PyErr_Format(PyExc_BufferError,
                         "DLPack strides count elements: byte stride %zd "
                         "of dimension %d is not a multiple of the "
                         "itemsize %zd", d->view.strides[i], i,
                         d->view.itemsize);
            return -1;
        }
    }
    return 0;
}

/* The capsule of an export of arr (already on the wanted device and
 * ready on the consumer's stream). */
static PyObject *
cm_dl_capsule(PyObject *arr, int dl_type, int dev_id, int versioned,
              uint64_t flags)
{
    cm_da_desc d;
    cm_dl_dtype dt;
    cm_dl_tensor *t;
    cm_dl_export *x;
    PyObject *cap;
    int n;
    int i;

    (void)cm_da_describe(arr, &d);
    if (cm_dl_check_exportable(&d, &dt) < 0) {
        return NULL;
    }
    n = d.view.ndim;
    x = PyMem_RawMalloc(sizeof(*x) + 2 * (size_t)(n > 0 ? n : 1)
                                     * sizeof(int64_t));
    if (x == NULL) {
        return PyErr_NoMemory();
    }
    memset(&x->m, 0, sizeof(x->m));
    for (i = 0; i < n; i++) {
        x->dims[i] = (int64_t)d.view.shape[i];
        x->dims[n + i] = (int64_t)(d.view.strides[i] / d.view.itemsize);
    }
    if (versioned) {
        x->m.versioned.version.major = CM_DL_MAJOR;
        x->m.versioned.version.minor = CM_DL_MINOR;
        x->m.versioned.manager_ctx = x;
        x->m.versioned.deleter = cm_dl_deleter_v;
        x->m.versioned.flags = flags;
        t = &x->m.versioned.dl_tensor;
    }
    else {
        x->m.legacy.manager_ctx = x;
        x->m.legacy.deleter = cm_dl_deleter;
        t = &x->m.legacy.dl_tensor;
    }
    t->data = (void *)d.view.addr;
    t->device.device_type = dl_type;
    t->device.device_id = dev_id;
    t->ndim = n;
    t->dtype = dt;
    t->shape = x->dims;
    t->strides = x->dims + n;
    t->byte_offset = 0;
    x->array = Py_NewRef(arr);
    cap = PyCapsule_New(&x->m, versioned ? CM_DL_NAME_V : CM_DL_NAME,
                        cm_dl_capsule_free);
    if (cap == NULL) {
        cm_dl_export_release(x);
    }
    return cap;
}

/* __dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)
 * of an array over memory of DLPack device type dl_type. */
PyObject *
cm_dlpack_export_as(PyObject *self, int dl_type, PyObject *const *args,
                    Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *p[K_N] = {NULL, NULL, NULL, NULL};
    PyObject *arr = NULL;
    PyObject *cap = NULL;
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    Py_ssize_t k;
    cm_da_desc d;
    cm_dl_dtype dt;
    uintptr_t consumer;
    long long a;
    long long b;
    int nosync;
    int versioned = 0;
    int copy = -1;
    int id;
    int i;

    if (nargs > 0) {
        PyErr_SetString(PyExc_TypeError,
                        "__dlpack__() takes only keyword arguments");
        return NULL;
    }
    for (k = 0; k < nkw; k++) {
        PyObject *kw = PyTuple_GET_ITEM(kwnames, k);

        for (i = 0; i < K_N && kw != cm_dl_kw[i]; i++) {
        }
        if (i == K_N) {
            for (i = 0; i < K_N; i++) {
                if (PyUnicode_Compare(kw, cm_dl_kw[i]) == 0) {
                    break;
                }
            }
        }
        if (i == K_N) {
            PyErr_Format(PyExc_TypeError,
                         "__dlpack__() got an unexpected keyword argument "
                         "'%U'", kw);
            return NULL;
        }
        p[i] = args[k];
    }
    /* Memory that was freed, or whose context was closed, is not
     * exported (cm_da_activate_ctx raises). */
    if (cm_dl_describe_self(self, &d, &id) < 0
        || cm_da_activate_ctx(self) < 0
        || cm_dl_parse_stream(p[K_STREAM], &consumer, &nosync) < 0) {
        return NULL;
    }
    if (p[K_MAX_VERSION] != NULL && p[K_MAX_VERSION] != Py_None) {
        if (cm_dl_pair(p[K_MAX_VERSION], "max_version", &a, &b) < 0) {
            return NULL;
        }
        versioned = a >= 1;
    }
    if (p[K_COPY] != NULL && p[K_COPY] != Py_None) {
        copy = PyObject_IsTrue(p[K_COPY]);
        if (copy < 0) {
            return NULL;
        }
    }
    if (p[K_DL_DEVICE] != NULL && p[K_DL_DEVICE] != Py_None) {
        if (cm_dl_pair(p[K_DL_DEVICE], "dl_device", &a, &b) < 0) {
            return NULL;
        }
        if (a != dl_type || b != id) {
            PyErr_Format(PyExc_BufferError,
                         "__dlpack__: the array is on DLPack device (%d, "
                         "%d), not (%lld, %lld); cudamem exports only "
                         "where the data is", dl_type, id, a, b);
            return NULL;
        }
    }
    /* Refuse what DLPack cannot describe before copying or ordering;
     * a copy is C-contiguous, so only its dtype matters. */
    if (copy == 1 ? cm_dl_dtype_of(d.dtype, &dt)
                  : cm_dl_check_exportable(&d, &dt)) {
        return NULL;
    }
    arr = copy == 1 ? cm_dl_copy(self, &d) : Py_NewRef(self);
    if (arr == NULL) {
        return NULL;
    }
    if (!nosync && cm_dl_order(arr, consumer) < 0) {
        goto out_arr;
    }
    cap = cm_dl_capsule(arr, dl_type, id, versioned,
                        copy == 1 ? CM_DL_FLAG_IS_COPIED : 0);
out_arr:
    Py_DECREF(arr);
    return cap;
}

/* __dlpack__ of a device array: with the array's context current for the
 * export (the thread's own comes back after). */
PyObject *
cm_dlpack_export(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                 PyObject *kwnames)
{
    cm_da_desc d;
    PyObject *r;

    CM_IN_CONTEXT(cm_da_describe(self, &d) ? d.ctx : NULL, r, NULL,
                  cm_dlpack_export_as(self, CM_DLDEV_CUDA, args, nargs,
                                      kwnames));
    return r;
}

const char cm_dlpack_export_doc[] =
"__dlpack__($self, /, *, stream=None, max_version=None, dl_device=None, "
"copy=None)\n--\n\n"
"Export the array as a DLPack capsule, without copying.\n\n"
"stream is the consumer's stream: None or 1 the legacy default stream, 2\n"
"the per-thread default stream, another int a stream handle, -1 no\n"
"synchronisation; 0 is refused (ValueError).  Unless it is -1 and unless\n"
"it is the array's own stream, the consumer's stream is made to wait for\n"
"the work enqueued so far on the array's stream (an unbound array's is\n"
"the default stream).\n\n"
"max_version: a (major, minor) of 1 or more gives a versioned capsule\n"
"(\"dltensor_versioned\", DLPack 1.1); None or 0.x the legacy\n"
"\"dltensor\" capsule.  dl_device must be __dlpack_device__() or None\n"
"(else BufferError).  copy=True exports a new C-contiguous device copy\n"
"(flagged IS_COPIED); None and False never copy.\n\n"
"Raises BufferError for dtypes DLPack cannot describe (structured,\n"
"datetime, string, long double, non-native byte order) and for byte\n"
"strides that are not a multiple of the itemsize.\n\n"
"Notes\n-----\n"
"numba's device arrays have no DLPack support.  Negative and zero\n"
"(broadcast) strides are exported as they are: DLPack strides are\n"
"signed, but some consumers (PyTorch) refuse negative ones.";

const char cm_dlpack_device_doc[] =
"__dlpack_device__($self, /)\n--\n\n"
"(device_type, device_id): (2, ordinal) (kDLCUDA) for device memory.";

/* ------------------------------------------------------------------ */
/* Import                                                              */
/* ------------------------------------------------------------------ */

/* Drop a capsule with any pending exception saved: the destructor of a
 * refused capsule runs the producer's deleter, which may run Python
 * code. */
static void
cm_dl_drop(PyObject *cap)
{
    PyObject *exc = PyErr_GetRaisedException();

    Py_DECREF(cap);
    PyErr_SetRaisedException(exc);
}

/* The destructor of an owner capsule: the last view is gone, so the
 * producer's tensor is deleted (exactly once: only this capsule holds
 * it). */
static void
cm_dl_owner_free(PyObject *cap)
{
    PyObject *exc = PyErr_GetRaisedException();

    if (PyCapsule_IsValid(cap, CM_OWNER_NAME_V)) {
        cm_dl_managed_v *m = PyCapsule_GetPointer(cap, CM_OWNER_NAME_V);

        if (m->deleter != NULL) {
            m->deleter(m);
        }
    }
    else if (PyCapsule_IsValid(cap, CM_OWNER_NAME)) {
        cm_dl_managed *m = PyCapsule_GetPointer(cap, CM_OWNER_NAME);

        if (m->deleter != NULL) {
            m->deleter(m);
        }
    }
    PyErr_SetRaisedException(exc);
}

/* A DeviceNDArray over the tensor of a DLPack capsule, which it consumes
 * (renames) on success.  On failure the capsule is left unconsumed, so
 * its own destructor deletes the tensor. */
static PyObject *
cm_dl_consume(PyObject *cap)
{
    Py_ssize_t shape[NPY_MAXDIMS];
    Py_ssize_t strides[NPY_MAXDIMS];
    PyArray_Descr *dtype;
    cm_dl_managed_v *mv = NULL;
    cm_dl_managed *ml = NULL;
    cm_dl_tensor *t;
    cm_context *ctx;
    PyObject *owner;
    PyObject *res;
    Py_ssize_t itemsize;
    int nonempty = 1;
    uintptr_t ptr;
    int dev;
    int i;

    if (PyCapsule_IsValid(cap, CM_DL_NAME_V)) {
        mv = PyCapsule_GetPointer(cap, CM_DL_NAME_V);
        if (mv->version.major != 1) {
            PyErr_Format(PyExc_BufferError,
                         "from_dlpack: DLPack version %u.%u is not "
                         "supported (cudamem reads 1.x)",
                         (unsigned)mv->version.major,
                         (unsigned)mv->version.minor);
            return NULL;
        }
        if (mv->flags & CM_DL_FLAG_READ_ONLY) {
            PyErr_SetString(PyExc_BufferError,
                            "from_dlpack: the tensor is read-only and "
                            "cudamem device arrays are always writable");
            return NULL;
        }
        t = &mv->dl_tensor;
    }
    else if (PyCapsule_IsValid(cap, CM_DL_NAME)) {
        ml = PyCapsule_GetPointer(cap, CM_DL_NAME);
        t = &ml->dl_tensor;
    }
    else {
        const char *name = PyCapsule_CheckExact(cap)
                           ? PyCapsule_GetName(cap) : NULL;

        PyErr_Clear();
        if (name != NULL && strncmp(name, "used_", 5) == 0) {
            PyErr_SetString(PyExc_BufferError,
                            "from_dlpack: the DLPack capsule was already "
                            "consumed");
        }
        else {
            PyErr_Format(PyExc_TypeError,
                         "from_dlpack: expected a DLPack capsule "
                         "(\"dltensor\" or \"dltensor_versioned\"), got "
                         "%.100s", Py_TYPE(cap)->tp_name);
        }
        return NULL;
    }
    dev = t->device.device_type;
    if (dev != CM_DLDEV_CUDA && dev != CM_DLDEV_CUDA_HOST
        && dev != CM_DLDEV_CUDA_MANAGED) {
        PyErr_Format(PyExc_BufferError,
                     "from_dlpack: the tensor is on DLPack device type %d, "
                     "not CUDA memory (2, 3 or 13)%s", dev,
                     dev == CM_DL_CPU ? "; cudamem.to_device copies host "
                                        "data to the device" : "");
        return NULL;
    }
    ctx = cm_context_current();
    if (ctx == NULL) {
        return NULL;
    }
    if (dev == CM_DLDEV_CUDA && t->device.device_id != ctx->device->id) {
        PyErr_Format(PyExc_BufferError,
                     "from_dlpack: the tensor is on device %d but the "
                     "current device is %d; select_device(%d) first",
                     (int)t->device.device_id, ctx->device->id,
                     (int)t->device.device_id);
        return NULL;
    }
    if (t->ndim < 0 || t->ndim > NPY_MAXDIMS
        || (t->ndim > 0 && t->shape == NULL)) {
        PyErr_Format(PyExc_BufferError,
                     "from_dlpack: bad tensor: ndim %d%s", (int)t->ndim,
                     t->ndim > 0 && t->shape == NULL ? " with no shape"
                                                     : "");
        return NULL;
    }
    dtype = cm_descr_of_dl(t->dtype);
    if (dtype == NULL) {
        return NULL;
    }
    itemsize = PyDataType_ELSIZE(dtype);
    for (i = 0; i < t->ndim; i++) {
        int64_t s = t->strides != NULL ? t->strides[i] : 0;

        if (t->shape[i] < 0 || t->shape[i] > PY_SSIZE_T_MAX
            || s > PY_SSIZE_T_MAX / itemsize
            || s < PY_SSIZE_T_MIN / itemsize) {
            PyErr_Format(PyExc_BufferError,
                         "from_dlpack: bad tensor: dimension %d has shape "
                         "%lld and stride %lld", i,
                         (long long)t->shape[i], (long long)s);
            goto err_dtype;
        }
        shape[i] = (Py_ssize_t)t->shape[i];
        strides[i] = (Py_ssize_t)s * itemsize;
        nonempty &= shape[i] > 0;
    }
    if (t->strides == NULL) {
        Py_ssize_t sd = itemsize;

        for (i = t->ndim - 1; i >= 0; i--) {
            strides[i] = sd;
            sd *= shape[i] > 0 ? shape[i] : 1;
        }
    }
    ptr = (uintptr_t)t->data + (uintptr_t)t->byte_offset;
    if (nonempty && t->data == NULL) {
        PyErr_SetString(PyExc_BufferError,
                        "from_dlpack: bad tensor: NULL data for a "
                        "non-empty tensor");
        goto err_dtype;
    }
    /* A tensor refused is left to its producer: check all first. */
    if (cm_layout_check(t->ndim, shape, strides, itemsize) < 0) {
        goto err_dtype;
    }
    /* Take the tensor: from here the owner deletes it. */
    if (PyCapsule_SetName(cap, mv != NULL ? CM_DL_NAME_V_USED
                                          : CM_DL_NAME_USED) < 0) {
        goto err_dtype;
    }
    owner = mv != NULL
            ? PyCapsule_New(mv, CM_OWNER_NAME_V, cm_dl_owner_free)
            : PyCapsule_New(ml, CM_OWNER_NAME, cm_dl_owner_free);
    if (owner == NULL) {
        if (mv != NULL && mv->deleter != NULL) {
            mv->deleter(mv);
        }
        else if (ml != NULL && ml->deleter != NULL) {
            ml->deleter(ml);
        }
        goto err_dtype;
    }
    res = cm_da_wrap(t->ndim, shape, strides, dtype,
                     nonempty ? (CUdeviceptr)ptr : 0, owner, NULL);
    cm_dl_drop(owner);
    Py_DECREF(dtype);
    return res;
err_dtype:
    Py_DECREF(dtype);
    return NULL;
}

/* obj.__dlpack_device__() as (type, id); 0 when obj has none. */
static int
cm_dl_query_device(PyObject *obj, long long *type, long long *id)
{
    PyObject *r = PyObject_CallMethodNoArgs(obj, cm_str_dlpack_device);

    if (r == NULL) {
        if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
            PyErr_Clear();
            return 0;
        }
        return -1;
    }
    if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 2) {
        Py_DECREF(r);
        PyErr_SetString(PyExc_TypeError,
                        "from_dlpack: __dlpack_device__() must return "
                        "(device_type, device_id)");
        return -1;
    }
    *type = PyLong_AsLongLong(PyTuple_GET_ITEM(r, 0));
    *id = (*type == -1 && PyErr_Occurred())
          ? -1 : PyLong_AsLongLong(PyTuple_GET_ITEM(r, 1));
    Py_DECREF(r);
    return PyErr_Occurred() ? -1 : 1;
}

PyDoc_STRVAR(cm_from_dlpack_doc,
"from_dlpack(obj, /)\n--\n\n"
"A DeviceNDArray viewing the CUDA memory of obj, without a copy.\n\n"
"obj is an object with __dlpack__ (or a DLPack capsule, consumed).  Its\n"
"data must be CUDA device, managed or pinned host memory (DLPack device\n"
"types 2, 13 or 3), on the current device for device memory.  The\n"
"producer is asked for a versioned capsule (max_version=(1, 0)), and\n"
"for a legacy one if it does not know max_version, with cudamem's\n"
"default stream (1, or 2 in per-thread mode) as the consumer's stream,\n"
"so the data is ready for work on the default stream.  The view keeps\n"
"the producer's memory alive; its deleter runs once, when the last\n"
"view goes.\n\n"
"Raises BufferError for host data, another device, read-only tensors,\n"
"vector (lanes > 1), bfloat16 and other types NumPy cannot hold.\n\n"
"Notes\n-----\n"
"numba.cuda has no from_dlpack; this is cudamem's own.");

static PyObject *
cm_from_dlpack(PyObject *mod, PyObject *obj)
{
    PyObject *args[3];
    PyObject *cap;
    PyObject *res;
    PyObject *h;
    PyObject *meth;
    long long type = CM_DLDEV_CUDA;
    long long id = 0;
    int r;

    (void)mod;
    if (PyCapsule_CheckExact(obj)) {
        if (cm_context_current() == NULL) {
            return NULL;
        }
        return cm_dl_consume(obj);
    }
    r = PyObject_GetOptionalAttr(obj, cm_str_dlpack, &meth);
    Py_XDECREF(meth);
    if (r <= 0) {
        if (r == 0) {
            PyErr_Format(PyExc_TypeError,
                         "from_dlpack: %.100s has no __dlpack__ method",
                         Py_TYPE(obj)->tp_name);
        }
        return NULL;
    }
    if (cm_dl_query_device(obj, &type, &id) < 0) {
        return NULL;
    }
    if (type != CM_DLDEV_CUDA && type != CM_DLDEV_CUDA_HOST
        && type != CM_DLDEV_CUDA_MANAGED) {
        PyErr_Format(PyExc_BufferError,
                     "from_dlpack: %.100s is on DLPack device type %lld, "
                     "not CUDA memory (2, 3 or 13)%s",
                     Py_TYPE(obj)->tp_name, type,
                     type == CM_DL_CPU ? "; cudamem.to_device copies host "
                                         "data to the device" : "");
        return NULL;
    }
    if (cm_context_current() == NULL) {
        return NULL;
    }
    h = PyLong_FromLong(cm_driver_per_thread() ? 2 : 1);
    if (h == NULL) {
        return NULL;
    }
    args[0] = obj;
    args[1] = h;
    args[2] = cm_max_version;
    cap = PyObject_VectorcallMethod(cm_str_dlpack, args,
                                    1 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                    cm_kwn_versioned);
    if (cap == NULL && PyErr_ExceptionMatches(PyExc_TypeError)) {
        /* A producer older than DLPack 1.0 knows no max_version. */
        PyErr_Clear();
        cap = PyObject_VectorcallMethod(cm_str_dlpack, args,
                                        1 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                        cm_kwn_legacy);
    }
    Py_DECREF(h);
    if (cap == NULL) {
        return NULL;
    }
    if (!PyCapsule_CheckExact(cap)) {
        PyErr_Format(PyExc_TypeError,
                     "from_dlpack: %.100s.__dlpack__() returned %.100s, not "
                     "a capsule", Py_TYPE(obj)->tp_name,
                     Py_TYPE(cap)->tp_name);
        res = NULL;
    }
    else {
        res = cm_dl_consume(cap);
    }
    cm_dl_drop(cap);
    return res;
}

static PyMethodDef cm_dlpack_functions[] = {
    {"from_dlpack", cm_from_dlpack, METH_O, cm_from_dlpack_doc},
    {NULL, NULL, 0, NULL},
};

int
cm_dlpack_init(PyObject *mod, cm_state *st)
{
    int i;

    (void)st;
    for (i = 0; i < K_N; i++) {
        cm_dl_kw[i] = PyUnicode_InternFromString(cm_dl_kw_text[i]);
        if (cm_dl_kw[i] == NULL) {
            return -1;
        }
    }
    cm_kwn_versioned = PyTuple_Pack(2, cm_dl_kw[K_STREAM],
                                    cm_dl_kw[K_MAX_VERSION]);
    cm_kwn_legacy = PyTuple_Pack(1, cm_dl_kw[K_STREAM]);
    cm_max_version = Py_BuildValue("(ii)", 1, 0);
    if (cm_kwn_versioned == NULL || cm_kwn_legacy == NULL
        || cm_max_version == NULL) {
        return -1;
    }
    return PyModule_AddFunctions(mod, cm_dlpack_functions);
}
