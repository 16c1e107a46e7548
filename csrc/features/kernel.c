/* SPDX-License-Identifier: MIT */
/*
 * kernel.c: user kernels: cudamem.compile, Module, Kernel and the launch
 * configuration kernel[grid, block, stream, shared_bytes](*args).
 *
 * compile() runs NVRTC (nvrtc.c) for the current device's architecture and
 * loads the image into the current context; constants={name: array}
 * declares __constant__ arrays of the arrays' dtype and shape ahead of the
 * source and fills them once the module is loaded.  A Kernel describes its
 * parameters once (offsets and sizes from cuFuncGetParamInfo, kinds from
 * the PTX) and reuses that description on every launch, so a launch is an
 * argument check, a copy of each argument's bytes into one block and one
 * cuLaunchKernel.  Dynamic shared memory above the kernel's current limit
 * sets its opt-in attribute; above the device's limit it is refused before
 * the driver is called.
 *
 * On the simulator, compile() works (NVRTC produces PTX, from which the
 * parameters are read) but nothing is loaded: launching checks the
 * configuration and the arguments, then raises CudaSupportError.
 *
 * Arguments: cudamem device arrays give their address directly; other
 * objects are asked for __cuda_array_interface__ (one dict lookup).
 *
 * Owns: Module (a loaded CUmodule, unloaded through its context's release
 * queue), Kernel and the per-launch configuration object.
 *
 * Locks and the GIL: no lock; the GIL is held throughout but around a
 * kernel's first launch (CM_CU_NOGIL: lazy loading may wait for the
 * device, and so for a host callback that needs the GIL), which touches
 * only the launch's C locals and the packed arguments.
 */
#include "features/kernel.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* Kernel                                                              */
/* ------------------------------------------------------------------ */

static int
cm_kernel_traverse(PyObject *self, visitproc visit, void *arg)
{
    cm_kernel *k = (cm_kernel *)self;

    Py_VISIT(Py_TYPE(self));
    Py_VISIT(k->module);
    return 0;
}

static int
cm_kernel_clear(PyObject *self)
{
    Py_CLEAR(((cm_kernel *)self)->module);
    return 0;
}

static void
cm_kernel_dealloc(PyObject *self)
{
    cm_kernel *k = (cm_kernel *)self;
    PyTypeObject *tp = Py_TYPE(self);

    PyObject_GC_UnTrack(self);
    if (k->weakreflist != NULL) {
        PyObject_ClearWeakRefs(self);
    }
    PyMem_Free(k->params);
    k->params = NULL;
    Py_CLEAR(k->name);
    Py_CLEAR(k->symbol);
    Py_CLEAR(k->module);
    tp->tp_free(self);
    Py_DECREF(tp);
}

/* A launch extent: an int or a tuple of 1 to 3 ints into out[3]. */
static int
cm_parse_dims(PyObject *o, unsigned int out[3], const int max[3],
              const char *what)
{
    Py_ssize_t n;
    Py_ssize_t i;
    long long v;
    static const char axes[] = "xyz";

    out[0] = out[1] = out[2] = 1;
    if (PyTuple_Check(o) || PyList_Check(o)) {
        n = PySequence_Fast_GET_SIZE(o);
        if (n < 1 || n > 3) {
            PyErr_Format(PyExc_ValueError,
                         "%s must be an int or a tuple of 1 to 3 ints, got "
                         "%zd values", what, n);
            return -1;
        }
    }
    else {
        n = 1;
    }
    for (i = 0; i < n; i++) {
        PyObject *d = (PyTuple_Check(o) || PyList_Check(o))
                          ? PySequence_Fast_GET_ITEM(o, i) : o;

        if (PyFloat_Check(d) || !PyIndex_Check(d)) {
            PyErr_Format(PyExc_TypeError,
                         "%s must be an int or a tuple of ints, got "
                         "%.100s", what, Py_TYPE(d)->tp_name);
            return -1;
        }
        v = PyLong_AsLongLong(d);
        if (v == -1 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError)) {
                return -1;
            }
            PyErr_Clear();
            v = 1LL << 40;
        }
        if (v < 1) {
            PyErr_Format(PyExc_ValueError,
                         "%s.%c must be at least 1, got %lld", what,
                         axes[i], v);
            return -1;
        }
        if (v > max[i]) {
            PyErr_Format(PyExc_ValueError,
                         "%s.%c = %lld exceeds the device's limit of %d",
                         what, axes[i], v, max[i]);
            return -1;
        }
        out[i] = (unsigned int)v;
    }
    return 0;
}

static PyObject *
cm_kernel_subscript(PyObject *self, PyObject *key)
{
    cm_kernel *k = (cm_kernel *)self;
    cm_state *st = cm_st;
    cm_launcher *l;
    PyObject *stream_obj = Py_None;
    Py_ssize_t n;
    long long threads;
    long long shared = 0;
    CUstream stream = 0;

    if (!PyTuple_Check(key) || PyTuple_GET_SIZE(key) < 2
        || PyTuple_GET_SIZE(key) > 4) {
        PyErr_SetString(PyExc_ValueError,
                        "a launch configuration is kernel[grid, block], "
                        "kernel[grid, block, stream] or kernel[grid, "
                        "block, stream, shared_bytes]");
        return NULL;
    }
    n = PyTuple_GET_SIZE(key);
    l = PyObject_GC_New(cm_launcher, st->Launcher_type);
    if (l == NULL) {
        return NULL;
    }
    l->vectorcall = NULL;
    l->kernel = (cm_kernel *)Py_NewRef(self);
    l->stream_obj = NULL;
    l->shared = 0;
    l->stream = 0;
    PyObject_GC_Track(l);
    if (cm_parse_dims(PyTuple_GET_ITEM(key, 0), l->grid, k->max_grid,
                      "grid") < 0
        || cm_parse_dims(PyTuple_GET_ITEM(key, 1), l->block, k->max_block,
                         "block") < 0) {
        goto err;
    }
    threads = (long long)l->block[0] * l->block[1] * l->block[2];
    if (threads > k->max_threads) {
        PyErr_Format(PyExc_ValueError,
                     "block of %lld threads exceeds the limit of %d "
                     "threads per block for kernel %R", threads,
                     k->max_threads, k->name);
        goto err;
    }
    if (n >= 3) {
        stream_obj = PyTuple_GET_ITEM(key, 2);
        if (cm_stream_resolve(stream_obj, &stream) < 0) {
            goto err;
        }
    }
    if (n == 4) {
        PyObject *s = PyTuple_GET_ITEM(key, 3);

        if (PyFloat_Check(s) || !PyIndex_Check(s)) {
            PyErr_Format(PyExc_TypeError,
                         "shared_bytes must be an int, got %.100s",
                         Py_TYPE(s)->tp_name);
            goto err;
        }
        shared = PyLong_AsLongLong(s);
        if (shared == -1 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError)) {
                goto err;
            }
            PyErr_Clear();
            shared = 1LL << 40;
        }
        if (shared < 0) {
            PyErr_Format(PyExc_ValueError,
                         "shared_bytes must not be negative, got %lld",
                         shared);
            goto err;
        }
        if (shared + k->static_smem > k->smem_optin) {
            PyErr_Format(PyExc_ValueError,
                         "%lld bytes of dynamic shared memory exceed the "
                         "device's limit for kernel %R: %d bytes per "
                         "block, %d of them static", shared, k->name,
                         k->smem_optin, k->static_smem);
            goto err;
        }
    }
    l->shared = (unsigned int)shared;
    l->stream = stream;
    l->stream_obj = Py_NewRef(stream_obj);
    l->vectorcall = CM_RETCHECK_VECTORCALL(cm_launch_vectorcall,
                                           "cudamem._core.KernelLaunch");
    return (PyObject *)l;

err:
    Py_DECREF(l);
    return NULL;
}

/* Raise TypeError about argument i of k. */
static int
cm_arg_error(cm_kernel *k, int i, const char *fmt, PyObject *o)
{
    PyErr_Format(PyExc_TypeError,
                 "kernel %U argument %d (a parameter of %u bytes): %s, got "
                 "%.100s", k->name, i, k->params[i].size, fmt,
                 Py_TYPE(o)->tp_name);
    return -1;
}

/* Store d into floating-point parameter i at dst. */
static int
cm_store_float(cm_kernel *k, int i, PyObject *o, double d,
               unsigned char *dst)
{
    const cm_param *p = &k->params[i];

    if (p->size == 8) {
        memcpy(dst, &d, 8);
        return 0;
    }
    if (p->size == 4) {
        float f = (float)d;

        memcpy(dst, &f, 4);
        return 0;
    }
#if PY_VERSION_HEX >= 0x030B0000
    if (p->size == 2) {
        return PyFloat_Pack2(d, (char *)dst, 1);
    }
#endif
    return cm_arg_error(k, i, "pass a NumPy scalar of that size", o);
}

/* Pack a Python int into parameter i at dst. */
static int
cm_pack_int(cm_kernel *k, int i, PyObject *o, unsigned char *dst)
{
    const cm_param *p = &k->params[i];
    long long v;
    unsigned long long u;
    int overflow = 0;

    if (p->kind == CM_P_FLOAT) {
        double d = PyLong_AsDouble(o);

        if (d == -1.0 && PyErr_Occurred()) {
            return -1;
        }
        return cm_store_float(k, i, o, d, dst);
    }
    if (p->kind != CM_P_INT) {
        return cm_arg_error(k, i, "a Python int cannot fill an aggregate "
                            "parameter; pass a NumPy scalar", o);
    }
    v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (overflow > 0 && p->size == 8) {
        u = PyLong_AsUnsignedLongLong(o);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
        }
        else {
            memcpy(dst, &u, 8);
            return 0;
        }
    }
    if (overflow == 0 && p->size < 8) {
        long long lo = -(1LL << (8 * p->size - 1));
        long long hi = (1LL << (8 * p->size)) - 1;

        overflow = v < lo || v > hi;
    }
    if (overflow) {
        PyErr_Format(PyExc_OverflowError,
                     "kernel %U argument %d: %R does not fit in a parameter "
                     "of %u bytes", k->name, i, o, p->size);
        return -1;
    }
    u = (unsigned long long)v;
    switch (p->size) {
    case 1: {
        uint8_t x = (uint8_t)u;

        memcpy(dst, &x, 1);
        return 0;
    }
    case 2: {
        uint16_t x = (uint16_t)u;

        memcpy(dst, &x, 2);
        return 0;
    }
    case 4: {
        uint32_t x = (uint32_t)u;

        memcpy(dst, &x, 4);
        return 0;
    }
    case 8:
        memcpy(dst, &u, 8);
        return 0;
    default:
        return cm_arg_error(k, i, "pass a NumPy scalar of that size", o);
    }
}

/* Pack a Python float into parameter i at dst. */
static int
cm_pack_float(cm_kernel *k, int i, PyObject *o, unsigned char *dst)
{
    double d = PyFloat_AsDouble(o);

    if (d == -1.0 && PyErr_Occurred()) {
        return -1;
    }
    if (k->params[i].kind != CM_P_FLOAT) {
        return cm_arg_error(k, i, "the parameter is an integer, pointer or "
                            "aggregate; a Python float fits only a "
                            "floating-point parameter", o);
    }
    return cm_store_float(k, i, o, d, dst);
}

/* Pack a device address into parameter i at dst. */
static int
cm_pack_ptr(cm_kernel *k, int i, PyObject *o, unsigned long long ptr,
            unsigned char *dst)
{
    if (k->params[i].size != 8 || k->params[i].kind == CM_P_FLOAT) {
        return cm_arg_error(k, i, "a device array fills only a pointer "
                            "parameter", o);
    }
    memcpy(dst, &ptr, 8);
    return 0;
}

/* The device address of a CUDA Array Interface object: 1 found, 0 the
 * object has no interface, -1 error. */
static int
cm_cai_pointer(PyObject *o, unsigned long long *ptr)
{
    PyObject *cai;
    PyObject *data;
    int r = -1;

    if (PyObject_GetOptionalAttr(o, cm_st->str_cai, &cai) < 0) {
        return -1;
    }
    if (cai == NULL) {
        return 0;
    }
    if (!PyDict_Check(cai)) {
        PyErr_Format(PyExc_TypeError,
                     "%.100s.__cuda_array_interface__ is not a dict",
                     Py_TYPE(o)->tp_name);
        goto out;
    }
    data = PyDict_GetItemWithError(cai, cm_st->str_data);
    if (data == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_Format(PyExc_TypeError,
                         "%.100s.__cuda_array_interface__ has no 'data'",
                         Py_TYPE(o)->tp_name);
        }
        goto out;
    }
    if (data == Py_None) {
        *ptr = 0;
        r = 1;
        goto out;
    }
    if (!PyTuple_Check(data) || PyTuple_GET_SIZE(data) != 2) {
        PyErr_Format(PyExc_TypeError,
                     "%.100s.__cuda_array_interface__['data'] must be a "
                     "(pointer, read_only) tuple", Py_TYPE(o)->tp_name);
        goto out;
    }
    *ptr = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(data, 0));
    if (*ptr == (unsigned long long)-1 && PyErr_Occurred()) {
        goto out;
    }
    r = 1;
out:
    Py_DECREF(cai);
    return r;
}

/* Whether argument i, memory of owner, can be used by a launch in the
 * kernel's context (peer access enabled on first need); 0 or -1. */
static int
cm_arg_access(cm_kernel *k, int i, cm_context *owner)
{
    char what[48];

    snprintf(what, sizeof(what), "kernel argument %d", i);
    return cm_context_require_access(k->module->ctx, owner, what);
}

/* 0 if argument i, a cudamem allocation or device array, still has its
 * memory: not freed with free() (nor the allocation of the array it
 * views), no closed IPC mapping or mapped() registration, its context
 * not closed; else -1 with ValueError. */
static int
cm_arg_alive(int i, PyObject *o)
{
    PyObject *g = Py_NewRef(o);
    cm_context *ctx;
    cm_da_desc d;
    int depth;
    int r = 0;

    for (depth = 0; depth < 3 && r == 0; depth++) {
        if (Py_IS_TYPE(g, cm_st->Mem_type)) {
            if (((cm_mem *)g)->freed || !((cm_mem *)g)->ctx->alive) {
                r = -1;
            }
            break;
        }
        if (cm_ipc_mem_closed(g) || cm_hostreg_closed(g)) {
            r = -1;
            break;
        }
        if (!cm_devicearray_pointer(g, &(CUdeviceptr){0})) {
            break;
        }
        ctx = cm_devicearray_context(g);
        if (ctx != NULL && !ctx->alive) {
            r = -1;
            break;
        }
        /* The owner itself, not the pointer the attribute shows. */
        if (!cm_da_describe(g, &d)) {
            break;
        }
        Py_SETREF(g, Py_NewRef(d.gpu_data));
    }
    Py_DECREF(g);
    if (r < 0) {
        PyErr_Format(PyExc_ValueError,
                     "kernel argument %d: its device memory was freed, or "
                     "its context closed", i);
    }
    return r;
}

/* Pack argument i (o) into the block buf. */
static int
cm_pack_arg(cm_kernel *k, int i, PyObject *o, unsigned char *buf)
{
    unsigned char *dst = buf + k->params[i].offset;
    unsigned long long ptr;
    CUdeviceptr dptr;
    int r;

    if (PyLong_CheckExact(o) || PyBool_Check(o)) {
        return cm_pack_int(k, i, o, dst);
    }
    if (PyFloat_CheckExact(o)) {
        return cm_pack_float(k, i, o, dst);
    }
    if (cm_devicearray_pointer(o, &dptr)) {
        if (cm_arg_alive(i, o) < 0) {
            return -1;
        }
        if (cm_devicearray_context(o) != k->module->ctx
            && cm_arg_access(k, i, cm_devicearray_context(o)) < 0) {
            return -1;
        }
        return cm_pack_ptr(k, i, o, (unsigned long long)dptr, dst);
    }
    if (Py_IS_TYPE(o, cm_st->Mem_type)) {
        if (cm_arg_alive(i, o) < 0) {
            return -1;
        }
        if (((cm_mem *)o)->ctx != k->module->ctx
            && cm_arg_access(k, i, ((cm_mem *)o)->ctx) < 0) {
            return -1;
        }
        return cm_pack_ptr(k, i, o, ((cm_mem *)o)->ptr, dst);
    }
    if (PyArray_IsScalar(o, Generic)) {
        PyArray_Descr *d = PyArray_DescrFromScalar(o);
        int ok;

        if (d == NULL) {
            return -1;
        }
        ok = !PyDataType_REFCHK(d)
             && (size_t)PyDataType_ELSIZE(d) == k->params[i].size;
        if (ok && PyDataType_ISFLEXIBLE(d)) {
            /* For flexible types (void, bytes) NumPy hands out a pointer
             * to the scalar's data rather than the data. */
            void *data = NULL;

            PyArray_ScalarAsCtype(o, &data);
            memcpy(dst, data, k->params[i].size);
        }
        else if (ok) {
            PyArray_ScalarAsCtype(o, dst);
        }
        Py_DECREF(d);
        if (!ok) {
            return cm_arg_error(k, i, "a NumPy scalar must have exactly "
                                "the parameter's size", o);
        }
        return 0;
    }
    /* Mapped and managed arrays are NumPy subclasses with the CUDA Array
     * Interface; a plain ndarray is host memory. */
    r = PyArray_CheckExact(o) ? 0 : cm_cai_pointer(o, &ptr);
    if (r < 0) {
        return -1;
    }
    if (r > 0) {
        return cm_pack_ptr(k, i, o, ptr, dst);
    }
    if (PyArray_Check(o)) {
        return cm_arg_error(k, i, "host arrays cannot be passed to a "
                            "kernel; copy it to the device first", o);
    }
    if (PyLong_Check(o)) {
        return cm_pack_int(k, i, o, dst);
    }
    if (PyFloat_Check(o)) {
        return cm_pack_float(k, i, o, dst);
    }
    return cm_arg_error(k, i, "expected a device array (an object with "
                        "__cuda_array_interface__), a NumPy scalar, or a "
                        "Python int, float or bool", o);
}

PyObject *
cm_launch_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                     PyObject *kwnames)
{
    cm_launcher *l = (cm_launcher *)self;
    cm_kernel *k = l->kernel;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    union {
        long long align;
        double dalign;
        unsigned char b[CM_ARGBUF];
    } stackbuf;
    void *stackptrs[CM_ARGPTRS];
    unsigned char *buf = stackbuf.b;
    void **ptrs = stackptrs;
    PyObject *r = NULL;
    CUcontext prev;
    int i;

    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0) {
        PyErr_Format(PyExc_TypeError,
                     "kernel %U takes positional arguments only", k->name);
        return NULL;
    }
    if (nargs != k->nparams) {
        PyErr_Format(PyExc_TypeError,
                     "kernel %U takes %d argument%s (%zd given)", k->name,
                     k->nparams, k->nparams == 1 ? "" : "s", nargs);
        return NULL;
    }
    if (k->argsize > CM_ARGBUF
        && (buf = PyMem_Malloc(k->argsize)) == NULL) {
        return PyErr_NoMemory();
    }
    if (k->nparams > CM_ARGPTRS
        && (ptrs = PyMem_Malloc((size_t)k->nparams * sizeof(void *)))
               == NULL) {
        PyErr_NoMemory();
        goto out_free;
    }
    memset(buf, 0, k->argsize);
    for (i = 0; i < k->nparams; i++) {
        if (cm_pack_arg(k, i, args[i], buf) < 0) {
            goto out_free;
        }
        ptrs[i] = buf + k->params[i].offset;
    }
    if (k->fn == NULL) {
        CM_RAISE(CudaSupportError, "%s", cm_no_gpu_msg);
        goto out_free;
    }
    if (cm_context_enter(k->module->ctx, &prev) < 0) {
        goto out_free;
    }
    if ((int)l->shared > k->dyn_limit) {
        if (CM_CU(FuncSetAttribute,
                  (k->fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                   (int)l->shared)) < 0) {
            goto out_leave;
        }
        k->dyn_limit = (int)l->shared;
    }
    if (k->launched) {
        if (CM_CU(LaunchKernel,
                  (k->fn, l->grid[0], l->grid[1], l->grid[2], l->block[0],
                   l->block[1], l->block[2], l->shared, l->stream, ptrs,
                   NULL)) < 0) {
            goto out_leave;
        }
    }
    else {
        /* The first launch loads the kernel's code (lazy loading), which
         * can wait for the device and so for a host callback that needs
         * the GIL: it runs without it. */
        int err;

        CM_CU_NOGIL(err, LaunchKernel,
                    (k->fn, l->grid[0], l->grid[1], l->grid[2], l->block[0],
                     l->block[1], l->block[2], l->shared, l->stream, ptrs,
                     NULL));
        if (err < 0) {
            goto out_leave;
        }
        k->launched = 1;
    }
    /* The arrays' releases wait for the kernel (memory.c). */
    for (i = 0; i < k->nparams; i++) {
        PyObject *owner = args[i];

        if ((cm_devicearray_owner(args[i], &owner)
             || Py_IS_TYPE(owner, cm_st->Mem_type))
            && cm_mem_note_use(owner, l->stream,
                               cm_stream_handle_is_default(l->stream)
                               ? NULL : l->stream_obj)
               < 0) {
            goto out_leave;
        }
    }
    r = Py_NewRef(Py_None);
out_leave:
    cm_context_leave(k->module->ctx, prev);
out_free:
    if (ptrs != stackptrs) {
        PyMem_Free(ptrs);
    }
    if (buf != stackbuf.b) {
        PyMem_Free(buf);
    }
    return r;
}

static PyObject *
cm_kernel_call(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)args;
    (void)kw;
    PyErr_Format(PyExc_ValueError,
                 "kernel %U needs a launch configuration: "
                 "kernel[grid, block](*args)", ((cm_kernel *)self)->name);
    return NULL;
}

static PyObject *
cm_kernel_get_attributes(PyObject *self, void *closure)
{
    static const struct {
        const char *name;
        CUfunction_attribute attr;
    } attrs[] = {
        {"num_regs", CU_FUNC_ATTRIBUTE_NUM_REGS},
        {"shared_size_bytes", CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES},
        {"local_size_bytes", CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES},
        {"const_size_bytes", CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES},
        {"max_threads_per_block", CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK},
        {"max_dynamic_shared_size_bytes",
         CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES},
        {"ptx_version", CU_FUNC_ATTRIBUTE_PTX_VERSION},
        {"binary_version", CU_FUNC_ATTRIBUTE_BINARY_VERSION},
    };
    cm_kernel *k = (cm_kernel *)self;
    PyObject *d;
    size_t i;

    (void)closure;
    if (k->fn == NULL) {
        CM_RAISE(CudaSupportError, "%s", cm_no_gpu_msg);
        return NULL;
    }
    if (cm_context_activate(k->module->ctx) < 0
        || (d = PyDict_New()) == NULL) {
        return NULL;
    }
    for (i = 0; i < sizeof(attrs) / sizeof(attrs[0]); i++) {
        int v = 0;
        PyObject *o;

        if (CM_CU(FuncGetAttribute, (&v, attrs[i].attr, k->fn)) < 0
            || (o = PyLong_FromLong(v)) == NULL) {
            Py_DECREF(d);
            return NULL;
        }
        if (PyDict_SetItemString(d, attrs[i].name, o) < 0) {
            Py_DECREF(o);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(o);
    }
    return d;
}

static PyObject *
cm_kernel_get_params(PyObject *self, void *closure)
{
    static const char *const kinds[] = {"int", "float", "bytes"};
    cm_kernel *k = (cm_kernel *)self;
    PyObject *t = PyTuple_New(k->nparams);
    int i;

    (void)closure;
    if (t == NULL) {
        return NULL;
    }
    for (i = 0; i < k->nparams; i++) {
        PyObject *e = Py_BuildValue("(IIs)", k->params[i].offset,
                                    k->params[i].size,
                                    kinds[k->params[i].kind]);

        if (e == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, e);
    }
    return t;
}

static PyObject *
cm_kernel_get_name(PyObject *self, void *closure)
{
    (void)closure;
    return Py_NewRef(((cm_kernel *)self)->name);
}

static PyObject *
cm_kernel_get_symbol(PyObject *self, void *closure)
{
    (void)closure;
    return Py_NewRef(((cm_kernel *)self)->symbol);
}

static PyObject *
cm_kernel_get_module(PyObject *self, void *closure)
{
    cm_kernel *k = (cm_kernel *)self;

    (void)closure;
    return Py_NewRef(k->module != NULL ? (PyObject *)k->module : Py_None);
}

static PyGetSetDef cm_kernel_getset[] = {
    {"attributes", cm_kernel_get_attributes, NULL,
     "A dict of the kernel's attributes: num_regs, shared_size_bytes "
     "(static), local_size_bytes (per thread: spills show here), "
     "const_size_bytes, max_threads_per_block, and more.", NULL},
    {"params", cm_kernel_get_params, NULL,
     "The parameters as (offset, size, kind) tuples; kind is 'int' "
     "(integers and pointers), 'float' or 'bytes' (aggregates).", NULL},
    {"name", cm_kernel_get_name, NULL, "The name it was asked for by.",
     NULL},
    {"lowered_name", cm_kernel_get_symbol, NULL,
     "The symbol in the module (the mangled name for a name expression).",
     NULL},
    {"module", cm_kernel_get_module, NULL, "The Module it belongs to.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef cm_kernel_members[] = {
    {"__weaklistoffset__", Py_T_PYSSIZET,
     offsetof(cm_kernel, weakreflist), Py_READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(cm_kernel_doc,
"A __global__ function of a Module.  Launch it with "
"kernel[grid, block, stream, shared_bytes](*args): grid and block are "
"ints or tuples of up to 3 ints, stream (optional) a Stream or 0, "
"shared_bytes (optional) the size of its extern __shared__ memory.");

static PyType_Slot cm_kernel_slots[] = {
    {Py_tp_doc, (void *)cm_kernel_doc},
    {Py_tp_dealloc, cm_kernel_dealloc},
    {Py_tp_traverse, cm_kernel_traverse},
    {Py_tp_clear, cm_kernel_clear},
    {Py_tp_call, cm_kernel_call},
    {Py_mp_subscript, cm_kernel_subscript},
    {Py_tp_getset, cm_kernel_getset},
    {Py_tp_members, cm_kernel_members},
    {0, NULL},
};

PyType_Spec cm_kernel_spec = {
    .name = "cudamem.Kernel",
    .basicsize = sizeof(cm_kernel),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC
             | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = cm_kernel_slots,
};

/* ------------------------------------------------------------------ */
/* The configured launch                                               */
/* ------------------------------------------------------------------ */

static int
cm_launcher_traverse(PyObject *self, visitproc visit, void *arg)
{
    cm_launcher *l = (cm_launcher *)self;

    Py_VISIT(Py_TYPE(self));
    Py_VISIT(l->kernel);
    Py_VISIT(l->stream_obj);
    return 0;
}

static int
cm_launcher_clear(PyObject *self)
{
    cm_launcher *l = (cm_launcher *)self;

    Py_CLEAR(l->kernel);
    Py_CLEAR(l->stream_obj);
    return 0;
}

static void
cm_launcher_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);

    PyObject_GC_UnTrack(self);
    (void)cm_launcher_clear(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyMemberDef cm_launcher_members[] = {
    {"__vectorcalloffset__", Py_T_PYSSIZET,
     offsetof(cm_launcher, vectorcall), Py_READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot cm_launcher_slots[] = {
    {Py_tp_doc, "kernel[grid, block, ...]: call it with the arguments."},
    {Py_tp_dealloc, cm_launcher_dealloc},
    {Py_tp_traverse, cm_launcher_traverse},
    {Py_tp_clear, cm_launcher_clear},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_members, cm_launcher_members},
    {0, NULL},
};

PyType_Spec cm_launcher_spec = {
    .name = "cudamem._core.KernelLaunch",
    .basicsize = sizeof(cm_launcher),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC
             | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION
             | Py_TPFLAGS_HAVE_VECTORCALL,
    .slots = cm_launcher_slots,
};
