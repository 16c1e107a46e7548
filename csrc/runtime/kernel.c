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
 * queue), Kernel and the per-launch configuration object.  Locking: the
 * GIL throughout; NVRTC and module loading run with it released on local
 * data only.
 */
#include "runtime/runtime.h"
#include "array/convert.h"

#include <stdlib.h>
#include <string.h>

/* How a parameter takes a Python int or float. */
enum {
    CM_P_INT = 0,      /* an integer or a pointer (.u/.s/.b scalars) */
    CM_P_FLOAT,        /* .f16, .f32, .f64 */
    CM_P_BYTES         /* an aggregate (.b8 x[n]): NumPy scalars only */
};

/* One kernel parameter. */
typedef struct {
    unsigned int offset;   /* bytes into the parameter block */
    unsigned int size;     /* bytes */
    int kind;              /* CM_P_* */
} cm_param;

/* A compiled module: its image loaded in one context. */
typedef struct {
    PyObject_HEAD
    cm_context *ctx;       /* strong: the context it is loaded in */
    CUmodule handle;       /* NULL on the simulator */
    char *ptx;             /* malloc'd PTX text, for parameter kinds */
    PyObject *lowered;     /* dict: name expression -> lowered name */
    PyObject *kernels;     /* dict: name -> Kernel, made once */
    PyObject *weakreflist;
} cm_module;

/* A __global__ function of a Module, with its parameter description. */
typedef struct {
    PyObject_HEAD
    cm_module *module;     /* strong: keeps the image loaded */
    PyObject *name;        /* str: the name it was asked for by */
    PyObject *symbol;      /* str: the (lowered) symbol name */
    CUfunction fn;         /* NULL on the simulator */
    int nparams;           /* number of parameters */
    cm_param *params;      /* PyMem; nparams entries */
    size_t argsize;        /* bytes of the whole parameter block */
    int max_threads;       /* threads per block this kernel allows */
    int max_block[3];      /* device: block extents */
    int max_grid[3];       /* device: grid extents */
    int static_smem;       /* static __shared__ bytes */
    int smem_optin;        /* device: shared bytes per block, opted in */
    int dyn_limit;         /* the kernel's current dynamic shared limit */
    int launched;          /* launched once (its code is loaded) */
    PyObject *weakreflist;
} cm_kernel;

/* kernel[grid, block, stream, shared]: a configured launch. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;   /* cm_launch_vectorcall */
    cm_kernel *kernel;     /* strong */
    unsigned int grid[3];  /* validated extents */
    unsigned int block[3];
    unsigned int shared;   /* dynamic shared bytes */
    CUstream stream;       /* resolved handle */
    PyObject *stream_obj;  /* strong: keeps the stream alive */
} cm_launcher;

#define CM_ARGBUF 4096
#define CM_ARGPTRS 64

static PyObject *cm_launch_vectorcall(PyObject *self, PyObject *const *args,
                                      size_t nargsf, PyObject *kwnames);

static const char cm_no_gpu_msg[] =
    "kernels need a GPU: the CPU simulator (CUDAMEM_SIMULATOR=1) compiles "
    "CUDA C with NVRTC but cannot run it";

static int
cm_on_sim(void)
{
    return cm_driver_backend() == CM_BACKEND_SIM;
}

/* ------------------------------------------------------------------ */
/* Parameters from PTX                                                 */
/* ------------------------------------------------------------------ */

/* Whether c may be part of a PTX identifier. */
static int
cm_ident_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
           || (c >= '0' && c <= '9') || c == '_' || c == '$';
}

/* The parameter list after ".entry <name>" in ptx ('(' follows), or NULL
 * if there is no such entry. */
static const char *
cm_ptx_find_entry(const char *ptx, const char *name)
{
    size_t n = strlen(name);
    const char *p = ptx;

    while ((p = strstr(p, ".entry ")) != NULL) {
        p += 7;
        while (*p == ' ' || *p == '\t') {
            p++;
        }
        if (strncmp(p, name, n) == 0 && !cm_ident_char(p[n])) {
            p += n;
            while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') {
                p++;
            }
            return *p == '(' ? p + 1 : NULL;
        }
    }
    return NULL;
}

/* Size and kind of a PTX type token (".u32"); 0 if it is not a type. */
static int
cm_ptx_type(const char *t, size_t len, int *kind)
{
    int bits;

    if (len < 3 || t[0] != '.') {
        return 0;
    }
    switch (t[1]) {
    case 'u':
    case 's':
    case 'b':
        *kind = CM_P_INT;
        break;
    case 'f':
        *kind = CM_P_FLOAT;
        break;
    default:
        return 0;
    }
    if (len == 3 && t[2] == '8') {
        return 1;
    }
    bits = (len == 4) ? (t[2] - '0') * 10 + (t[3] - '0') : 0;
    switch (bits) {
    case 16: return 2;
    case 32: return 4;
    case 64: return 8;
    default: return 0;
    }
}

/*
 * Parse the parameters of entry name: a PyMem array into *out, its count
 * into *count and the block size into *total.  1 if found, 0 if there is
 * no such entry, -1 with an exception.
 */
static int
cm_ptx_params(const char *ptx, const char *name, cm_param **out,
              int *count, size_t *total)
{
    const char *p = cm_ptx_find_entry(ptx, name);
    cm_param *v = NULL;
    int n = 0;
    int cap = 0;
    size_t off = 0;

    *out = NULL;
    *count = 0;
    *total = 0;
    if (p == NULL) {
        return 0;
    }
    for (;;) {
        size_t align = 0;
        size_t elem = 0;
        size_t mult = 1;
        int kind = CM_P_INT;
        const char *t;
        size_t len;

        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'
               || *p == ',') {
            p++;
        }
        if (*p == ')') {
            break;
        }
        if (strncmp(p, ".param", 6) != 0) {
            goto err_parse;
        }
        p += 6;
        /* Tokens up to the parameter's end (',' or ')'). */
        for (;;) {
            while (*p == ' ' || *p == '\t') {
                p++;
            }
            if (*p == ',' || *p == ')' || *p == '\n' || *p == '\0') {
                break;
            }
            t = p;
            while (*p != '\0' && *p != ' ' && *p != '\t' && *p != ','
                   && *p != ')' && *p != '\n') {
                p++;
            }
            len = (size_t)(p - t);
            if (len == 6 && strncmp(t, ".align", 6) == 0) {
                align = strtoul(p, (char **)&p, 10);
            }
            else if (t[0] == '.') {
                int k;
                int sz = cm_ptx_type(t, len, &k);

                if (sz > 0) {
                    elem = (size_t)sz;
                    kind = k;
                }
            }
            else {
                const char *br = memchr(t, '[', len);

                if (br != NULL) {
                    mult = strtoul(br + 1, NULL, 10);
                    kind = CM_P_BYTES;
                }
            }
        }
        while (*p == '\n' || *p == '\r' || *p == ' ' || *p == '\t') {
            p++;
        }
        if (elem == 0 || mult == 0) {
            goto err_parse;
        }
        if (align == 0) {
            align = elem;
        }
        off = (off + align - 1) / align * align;
        if (n == cap) {
            cm_param *nv;

            cap = cap ? cap * 2 : 8;
            nv = PyMem_Realloc(v, (size_t)cap * sizeof(*v));
            if (nv == NULL) {
                PyMem_Free(v);
                PyErr_NoMemory();
                return -1;
            }
            v = nv;
        }
        v[n].offset = (unsigned int)off;
        v[n].size = (unsigned int)(elem * mult);
        v[n].kind = kind;
        off += elem * mult;
        n++;
    }
    *out = v;
    *count = n;
    *total = off;
    return 1;

err_parse:
    PyMem_Free(v);
    PyErr_Format(PyExc_RuntimeError,
                 "cudamem could not read the parameters of kernel '%s' "
                 "from its PTX", name);
    return -1;
}

/* ------------------------------------------------------------------ */
/* Module                                                              */
/* ------------------------------------------------------------------ */

static int
cm_module_check(cm_module *m)
{
    if (m->ctx == NULL || (m->handle == NULL && !cm_on_sim())) {
        PyErr_SetString(PyExc_ValueError, "module is not loaded");
        return -1;
    }
    return 0;
}

static int
cm_module_traverse_obj(PyObject *self, visitproc visit, void *arg)
{
    cm_module *m = (cm_module *)self;

    Py_VISIT(Py_TYPE(self));
    Py_VISIT(m->ctx);
    Py_VISIT(m->lowered);
    Py_VISIT(m->kernels);
    return 0;
}

static int
cm_module_clear_obj(PyObject *self)
{
    cm_module *m = (cm_module *)self;

    Py_CLEAR(m->lowered);
    Py_CLEAR(m->kernels);
    return 0;
}

static void
cm_module_dealloc(PyObject *self)
{
    cm_module *m = (cm_module *)self;
    PyTypeObject *tp = Py_TYPE(self);
    PyObject *exc = PyErr_GetRaisedException();

    PyObject_GC_UnTrack(self);
    if (m->weakreflist != NULL) {
        PyObject_ClearWeakRefs(self);
    }
    if (m->handle != NULL && m->ctx != NULL && !Py_IsFinalizing()) {
        cm_ctx_release(m->ctx, CM_REL_MODULE, (uintptr_t)m->handle, 0);
    }
    m->handle = NULL;
    free(m->ptx);
    m->ptx = NULL;
    Py_CLEAR(m->lowered);
    Py_CLEAR(m->kernels);
    Py_CLEAR(m->ctx);
    tp->tp_free(self);
    Py_DECREF(tp);
    PyErr_SetRaisedException(exc);
}

/* The symbol for a name: its lowered name if it was a name expression.
 * New reference, or NULL. */
static PyObject *
cm_module_symbol(cm_module *m, PyObject *name)
{
    PyObject *low = PyDict_GetItemWithError(m->lowered, name);

    if (low != NULL) {
        return Py_NewRef(low);
    }
    if (PyErr_Occurred()) {
        return NULL;
    }
    return Py_NewRef(name);
}

/* An int attribute of the device of ctx. */
static int
cm_dev_attr(cm_context *ctx, CUdevice_attribute a, int *out)
{
    return CM_CU(DeviceGetAttribute, (out, a, ctx->device->handle));
}

/* Make the Kernel for name; 1 made, 0 no such kernel, -1 error. */
static int
cm_kernel_make(cm_module *m, PyObject *name, cm_kernel **out)
{
    cm_state *st = cm_st;
    cm_kernel *k = NULL;
    PyObject *sym = NULL;
    const char *csym;
    cm_param *pp = NULL;
    int ptx_n = 0;
    size_t ptx_total = 0;
    int found;
    int i;
    CUresult rc;

    *out = NULL;
    if ((sym = cm_module_symbol(m, name)) == NULL
        || (csym = PyUnicode_AsUTF8(sym)) == NULL) {
        goto err;
    }
    found = m->ptx != NULL
                ? cm_ptx_params(m->ptx, csym, &pp, &ptx_n, &ptx_total)
                : 0;
    if (found < 0) {
        goto err;
    }
    if (m->handle == NULL && found == 0) {
        Py_DECREF(sym);
        return 0;
    }
    k = PyObject_GC_New(cm_kernel, st->Kernel_type);
    if (k == NULL) {
        goto err;
    }
    k->module = (cm_module *)Py_NewRef(m);
    k->name = Py_NewRef(name);
    k->symbol = sym;
    sym = NULL;
    k->fn = NULL;
    k->launched = 0;
    k->nparams = ptx_n;
    k->params = pp;
    pp = NULL;
    k->argsize = ptx_total;
    k->weakreflist = NULL;
    k->static_smem = 0;
    PyObject_GC_Track(k);
    if (cm_dev_attr(m->ctx, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                    &k->max_threads) < 0
        || cm_dev_attr(m->ctx, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X,
                       &k->max_block[0]) < 0
        || cm_dev_attr(m->ctx, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y,
                       &k->max_block[1]) < 0
        || cm_dev_attr(m->ctx, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z,
                       &k->max_block[2]) < 0
        || cm_dev_attr(m->ctx, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X,
                       &k->max_grid[0]) < 0
        || cm_dev_attr(m->ctx, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y,
                       &k->max_grid[1]) < 0
        || cm_dev_attr(m->ctx, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z,
                       &k->max_grid[2]) < 0
        || cm_dev_attr(m->ctx,
                       CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                       &k->smem_optin) < 0
        || cm_dev_attr(m->ctx,
                       CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK,
                       &k->dyn_limit) < 0) {
        goto err;
    }
    if (m->handle == NULL) {
        *out = k;
        return 1;
    }
    if (cm_context_activate(m->ctx) < 0) {
        goto err;
    }
    csym = PyUnicode_AsUTF8(k->symbol);
    rc = CM_CU_RAW(ModuleGetFunction, (&k->fn, m->handle, csym));
    if (rc == CUDA_ERROR_NOT_FOUND) {
        Py_DECREF(k);
        return 0;
    }
    if (cm_cu_check(rc, "cuModuleGetFunction") < 0
        || CM_CU(FuncGetAttribute,
                 (&k->max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                  k->fn)) < 0
        || CM_CU(FuncGetAttribute,
                 (&k->static_smem, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
                  k->fn)) < 0
        || CM_CU(FuncGetAttribute,
                 (&k->dyn_limit,
                  CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                  k->fn)) < 0) {
        goto err;
    }
    /* The driver's offsets and sizes are authoritative; the PTX only
     * adds the kinds, when both agree on the list. */
    if (cm_cu.FuncGetParamInfo != NULL) {
        cm_param *dv = NULL;
        int n = 0;
        size_t total = 0;
        /* The PTX's signature gives the count, so only indices that exist
         * are asked for (an index past the last is an API error, which
         * tools such as compute-sanitizer report); without the PTX, ask
         * until the driver says the index is past the end. */
        int count = found ? k->nparams : -1;

        for (i = 0; count < 0 || i < count; i++) {
            size_t off;
            size_t sz;
            cm_param *nv;

            rc = cm_cu.FuncGetParamInfo(k->fn, (size_t)i, &off, &sz);
            if (rc == CUDA_ERROR_INVALID_VALUE) {
                break;
            }
            if (cm_cu_check(rc, "cuFuncGetParamInfo") < 0) {
                PyMem_Free(dv);
                goto err;
            }
            nv = PyMem_Realloc(dv, (size_t)(i + 1) * sizeof(*dv));
            if (nv == NULL) {
                PyMem_Free(dv);
                PyErr_NoMemory();
                goto err;
            }
            dv = nv;
            dv[i].offset = (unsigned int)off;
            dv[i].size = (unsigned int)sz;
            dv[i].kind = sz == 4 || sz == 8 || sz <= 2 ? CM_P_INT
                                                       : CM_P_BYTES;
            if (i < k->nparams && k->params[i].size == sz) {
                dv[i].kind = k->params[i].kind;
            }
            if (off + sz > total) {
                total = off + sz;
            }
            n++;
        }
        PyMem_Free(k->params);
        k->params = dv;
        k->nparams = n;
        k->argsize = total;
    }
    *out = k;
    return 1;

err:
    PyMem_Free(pp);
    Py_XDECREF(sym);
    Py_XDECREF(k);
    return -1;
}

/* The Kernel called name (cached); NULL with ValueError if there is
 * none (or another exception).  New reference. */
static PyObject *
cm_module_get_function_impl(cm_module *m, PyObject *name, int as_attr)
{
    PyObject *k;
    cm_kernel *made;
    int r;

    if (!PyUnicode_Check(name)) {
        PyErr_Format(PyExc_TypeError,
                     "get_function() argument 'name' must be str, not "
                     "%.100s", Py_TYPE(name)->tp_name);
        return NULL;
    }
    if (cm_module_check(m) < 0) {
        return NULL;
    }
    k = PyDict_GetItemWithError(m->kernels, name);
    if (k != NULL) {
        return Py_NewRef(k);
    }
    if (PyErr_Occurred()) {
        return NULL;
    }
    r = cm_kernel_make(m, name, &made);
    if (r < 0) {
        return NULL;
    }
    if (r == 0) {
        PyErr_Format(as_attr ? PyExc_AttributeError : PyExc_ValueError,
                     "the module has no kernel named %R (declare it "
                     "extern \"C\" __global__, or pass its C++ name in "
                     "name_expressions)", name);
        return NULL;
    }
    if (PyDict_SetItem(m->kernels, name, (PyObject *)made) < 0) {
        Py_DECREF(made);
        return NULL;
    }
    return (PyObject *)made;
}

PyDoc_STRVAR(cm_module_get_function_doc,
"get_function($self, name, /)\n--\n\n"
"The Kernel for the __global__ function name: an extern \"C\" name, or a "
"name expression given to compile().  Attribute access (module.name) "
"does the same.");

static PyObject *
cm_module_get_function(PyObject *self, PyObject *name)
{
    return cm_module_get_function_impl((cm_module *)self, name, 0);
}

static PyObject *
cm_module_getattro(PyObject *self, PyObject *name)
{
    PyObject *r = PyObject_GenericGetAttr(self, name);
    Py_ssize_t n;
    const char *s;

    if (r != NULL || !PyErr_ExceptionMatches(PyExc_AttributeError)
        || !PyUnicode_Check(name)) {
        return r;
    }
    s = PyUnicode_AsUTF8AndSize(name, &n);
    if (s == NULL) {
        return NULL;
    }
    if (n >= 2 && s[0] == '_' && s[1] == '_') {
        return NULL;
    }
    PyErr_Clear();
    return cm_module_get_function_impl((cm_module *)self, name, 1);
}

/* cudamem._kernel._global_view(owner, ptr, nbytes, dtype, shape). */
static PyObject *
cm_global_view(PyObject *owner, CUdeviceptr ptr, size_t nbytes,
               PyObject *dtype, PyObject *shape)
{
    PyObject *mod = PyImport_ImportModule("cudamem._kernel");
    PyObject *r;

    if (mod == NULL) {
        return NULL;
    }
    r = PyObject_CallMethod(mod, "_global_view", "OKnOO", owner,
                            (unsigned long long)ptr, (Py_ssize_t)nbytes,
                            dtype, shape);
    Py_DECREF(mod);
    return r;
}

PyDoc_STRVAR(cm_module_get_global_doc,
"get_global($self, /, name, dtype=None, shape=None)\n--\n\n"
"A device array viewing the __constant__ or __device__ symbol name: "
"dtype defaults to uint8 and shape to the symbol's whole size.  Copying "
"into it (copy_to_device) changes what later launches read.");

static PyObject *
cm_module_get_global(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"name", "dtype", "shape", NULL};
    cm_module *m = (cm_module *)self;
    PyObject *name;
    PyObject *dtype = Py_None;
    PyObject *shape = Py_None;
    PyObject *sym = NULL;
    PyObject *r = NULL;
    CUdeviceptr ptr = 0;
    size_t size = 0;
    CUresult rc;

    if (!PyArg_ParseTupleAndKeywords(args, kw, "U|OO:get_global", kwlist,
                                     &name, &dtype, &shape)) {
        return NULL;
    }
    if (cm_module_check(m) < 0) {
        return NULL;
    }
    if (m->handle == NULL) {
        PyErr_SetString(cm_st->CudaSupportError, cm_no_gpu_msg);
        return NULL;
    }
    if ((sym = cm_module_symbol(m, name)) == NULL
        || cm_context_activate(m->ctx) < 0) {
        goto out;
    }
    rc = CM_CU_RAW(ModuleGetGlobal, (&ptr, &size, m->handle,
                                     PyUnicode_AsUTF8(sym)));
    if (rc == CUDA_ERROR_NOT_FOUND) {
        PyErr_Format(PyExc_ValueError,
                     "the module has no __constant__ or __device__ symbol "
                     "named %R", name);
        goto out;
    }
    if (cm_cu_check(rc, "cuModuleGetGlobal") < 0) {
        goto out;
    }
    r = cm_global_view(self, ptr, size, dtype, shape);
out:
    Py_XDECREF(sym);
    return r;
}

static PyObject *
cm_module_get_ptx(PyObject *self, void *closure)
{
    cm_module *m = (cm_module *)self;

    (void)closure;
    if (m->ptx == NULL) {
        Py_RETURN_NONE;
    }
    return PyUnicode_FromString(m->ptx);
}

static PyObject *
cm_module_get_lowered(PyObject *self, void *closure)
{
    (void)closure;
    return PyDict_Copy(((cm_module *)self)->lowered);
}

static PyObject *
cm_module_get_handle(PyObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromVoidPtr((void *)((cm_module *)self)->handle);
}

static PyObject *
cm_module_get_context(PyObject *self, void *closure)
{
    cm_module *m = (cm_module *)self;

    (void)closure;
    return Py_NewRef(m->ctx != NULL ? (PyObject *)m->ctx : Py_None);
}

static PyGetSetDef cm_module_getset[] = {
    {"ptx", cm_module_get_ptx, NULL,
     "The module's PTX text (None if NVRTC gave none).", NULL},
    {"lowered_names", cm_module_get_lowered, NULL,
     "A dict from each name expression to its lowered (mangled) name.",
     NULL},
    {"handle", cm_module_get_handle, NULL,
     "The CUmodule handle as an int (0 on the simulator).", NULL},
    {"context", cm_module_get_context, NULL,
     "The Context the module is loaded in.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef cm_module_methods[] = {
    {"get_function", cm_module_get_function, METH_O,
     cm_module_get_function_doc},
    {"get_global", (PyCFunction)(void (*)(void))cm_module_get_global,
     METH_VARARGS | METH_KEYWORDS, cm_module_get_global_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef cm_module_members[] = {
    {"__weaklistoffset__", Py_T_PYSSIZET,
     offsetof(cm_module, weakreflist), Py_READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(cm_module_doc,
"A CUDA C module compiled by cudamem.compile() and loaded in the current "
"context.  Its kernels are module.get_function(name) or module.name.");

static PyType_Slot cm_module_slots[] = {
    {Py_tp_doc, (void *)cm_module_doc},
    {Py_tp_dealloc, cm_module_dealloc},
    {Py_tp_traverse, cm_module_traverse_obj},
    {Py_tp_clear, cm_module_clear_obj},
    {Py_tp_getattro, cm_module_getattro},
    {Py_tp_getset, cm_module_getset},
    {Py_tp_methods, cm_module_methods},
    {Py_tp_members, cm_module_members},
    {0, NULL},
};

static PyType_Spec cm_module_spec = {
    .name = "cudamem.Module",
    .basicsize = sizeof(cm_module),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC
             | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = cm_module_slots,
};

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
    l->vectorcall = cm_launch_vectorcall;
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
        Py_SETREF(g, PyObject_GetAttrString(g, "gpu_data"));
        if (g == NULL) {
            return -1;
        }
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

static PyObject *
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
        PyErr_SetString(cm_st->CudaSupportError, cm_no_gpu_msg);
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
        PyErr_SetString(cm_st->CudaSupportError, cm_no_gpu_msg);
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

static PyType_Spec cm_kernel_spec = {
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

static PyType_Spec cm_launcher_spec = {
    .name = "cudamem._core.KernelLaunch",
    .basicsize = sizeof(cm_launcher),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC
             | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION
             | Py_TPFLAGS_HAVE_VECTORCALL,
    .slots = cm_launcher_slots,
};

/* ------------------------------------------------------------------ */
/* compile()                                                           */
/* ------------------------------------------------------------------ */

/* The CUDA C type of a constant array's dtype, or NULL for raw bytes. */
static const char *
cm_ctype_of(PyArray_Descr *d, int *need_fp16)
{
    switch (cm_elem_type_of(d)) {
    case CM_T_BOOL: return "bool";
    case CM_T_I8: return "signed char";
    case CM_T_U8: return "unsigned char";
    case CM_T_I16: return "short";
    case CM_T_U16: return "unsigned short";
    case CM_T_I32: return "int";
    case CM_T_U32: return "unsigned int";
    case CM_T_I64: return "long long";
    case CM_T_U64: return "unsigned long long";
    case CM_T_F16:
        *need_fp16 = 1;
        return "__half";
    case CM_T_F32: return "float";
    case CM_T_F64: return "double";
    case CM_T_C64: return "float2";
    case CM_T_C128: return "double2";
    default: return NULL;
    }
}

/* Whether s is a C identifier. */
static int
cm_is_ident(const char *s)
{
    const char *p;

    if (s[0] == '\0' || (s[0] >= '0' && s[0] <= '9')) {
        return 0;
    }
    for (p = s; *p; p++) {
        if (!cm_ident_char(*p) || *p == '$') {
            return 0;
        }
    }
    return 1;
}

/*
 * Normalise constants={name: array} into a list of (name, array) with
 * C-contiguous native arrays, and their declarations into *decls (a new
 * str).  New reference to the list, or NULL.
 */
static PyObject *
cm_constants_prepare(PyObject *constants, PyObject **decls)
{
    PyObject *items = NULL;
    PyObject *parts = NULL;
    PyObject *key;
    PyObject *value;
    Py_ssize_t pos = 0;
    int need_fp16 = 0;
    int i;

    *decls = NULL;
    if (!PyDict_Check(constants)) {
        PyErr_Format(PyExc_TypeError,
                     "compile() argument 'constants' must be a dict of "
                     "name: array, not %.100s", Py_TYPE(constants)->tp_name);
        return NULL;
    }
    if ((items = PyList_New(0)) == NULL
        || (parts = PyList_New(0)) == NULL) {
        goto err;
    }
    while (PyDict_Next(constants, &pos, &key, &value)) {
        const char *name;
        const char *ctype;
        PyArrayObject *a;
        PyObject *pair;
        PyObject *line;
        PyObject *dims;

        if (!PyUnicode_Check(key) || (name = PyUnicode_AsUTF8(key)) == NULL
            || !cm_is_ident(name)) {
            if (!PyErr_Occurred()) {
                PyErr_Format(PyExc_ValueError,
                             "compile() argument 'constants': %R is not a "
                             "C identifier", key);
            }
            goto err;
        }
        a = (PyArrayObject *)PyArray_FROMANY(
            value, NPY_NOTYPE, 0, 0,
            NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED
                | NPY_ARRAY_NOTSWAPPED);
        if (a == NULL) {
            goto err;
        }
        if (PyArray_SIZE(a) == 0 || PyDataType_REFCHK(PyArray_DESCR(a))) {
            PyErr_Format(PyExc_ValueError,
                         "compile() argument 'constants': %R must be a "
                         "non-empty array of a numeric or structured "
                         "dtype", key);
            Py_DECREF(a);
            goto err;
        }
        ctype = cm_ctype_of(PyArray_DESCR(a), &need_fp16);
        if ((dims = PyUnicode_FromString("")) == NULL) {
            Py_DECREF(a);
            goto err;
        }
        for (i = 0; ctype != NULL && i < PyArray_NDIM(a); i++) {
            PyObject *nd = PyUnicode_FromFormat(
                "%U[%zd]", dims, (Py_ssize_t)PyArray_DIM(a, i));

            Py_SETREF(dims, nd);
            if (dims == NULL) {
                Py_DECREF(a);
                goto err;
            }
        }
        if (ctype != NULL) {
            line = PyUnicode_FromFormat("__constant__ %s %s%U;\n", ctype,
                                        name, dims);
        }
        else {
            line = PyUnicode_FromFormat(
                "__constant__ __align__(16) unsigned char %s[%zd];\n", name,
                (Py_ssize_t)PyArray_NBYTES(a));
        }
        Py_DECREF(dims);
        if (line == NULL) {
            Py_DECREF(a);
            goto err;
        }
        i = PyList_Append(parts, line);
        Py_DECREF(line);
        pair = i < 0 ? NULL : Py_BuildValue("(OO)", key, (PyObject *)a);
        Py_DECREF(a);
        if (pair == NULL) {
            goto err;
        }
        i = PyList_Append(items, pair);
        Py_DECREF(pair);
        if (i < 0) {
            goto err;
        }
    }
    if (need_fp16) {
        PyObject *inc = PyUnicode_FromString("#include <cuda_fp16.h>\n");

        if (inc == NULL || PyList_Insert(parts, 0, inc) < 0) {
            Py_XDECREF(inc);
            goto err;
        }
        Py_DECREF(inc);
    }
    {
        PyObject *empty = PyUnicode_FromString("");

        if (empty == NULL) {
            goto err;
        }
        *decls = PyUnicode_Join(empty, parts);
        Py_DECREF(empty);
        if (*decls == NULL) {
            goto err;
        }
    }
    Py_DECREF(parts);
    return items;

err:
    Py_XDECREF(items);
    Py_XDECREF(parts);
    return NULL;
}

/* A tuple of str from a sequence argument; its UTF-8 pointers (borrowed
 * from the tuple) into a PyMem array *out.  New reference, or NULL. */
static PyObject *
cm_str_tuple(PyObject *seq, const char *what, const char ***out,
             int extra)
{
    PyObject *t;
    Py_ssize_t i;
    Py_ssize_t n;

    *out = NULL;
    if (PyUnicode_Check(seq) || PyBytes_Check(seq)) {
        PyErr_Format(PyExc_TypeError,
                     "compile() argument '%s' must be a sequence of str, "
                     "not a single string", what);
        return NULL;
    }
    t = PySequence_Tuple(seq);
    if (t == NULL) {
        return NULL;
    }
    n = PyTuple_GET_SIZE(t);
    *out = PyMem_Calloc((size_t)(n + extra + 1), sizeof(char *));
    if (*out == NULL) {
        Py_DECREF(t);
        PyErr_NoMemory();
        return NULL;
    }
    for (i = 0; i < n; i++) {
        PyObject *o = PyTuple_GET_ITEM(t, i);

        if (!PyUnicode_Check(o)
            || ((*out)[i] = PyUnicode_AsUTF8(o)) == NULL) {
            if (!PyErr_Occurred()) {
                PyErr_Format(PyExc_TypeError,
                             "compile() argument '%s' must contain str, "
                             "not %.100s", what, Py_TYPE(o)->tp_name);
            }
            PyMem_Free(*out);
            *out = NULL;
            Py_DECREF(t);
            return NULL;
        }
    }
    return t;
}

/* Raise CompileError(msg, log) for a failed compilation. */
static void
cm_raise_compile(const cm_nvrtc_result *res, const char *name)
{
    const char *log = res->log != NULL ? res->log : "";
    PyObject *exc;

    exc = PyObject_CallFunction(
        cm_st->CompileError, "(NN)",
        PyUnicode_FromFormat("NVRTC failed (%s) compiling %s%s%s",
                             res->error != NULL ? res->error : "?", name,
                             log[0] != '\0' ? ":\n" : "", log),
        PyUnicode_DecodeUTF8(log, (Py_ssize_t)strlen(log), "replace"));
    if (exc != NULL) {
        PyErr_SetObject(cm_st->CompileError, exc);
        Py_DECREF(exc);
    }
}

/* Fill the module's constants after loading: ModuleGetGlobal and a
 * synchronous copy per (name, array). */
static int
cm_constants_fill(cm_module *m, PyObject *items)
{
    Py_ssize_t i;
    int err;

    for (i = 0; i < PyList_GET_SIZE(items); i++) {
        PyObject *pair = PyList_GET_ITEM(items, i);
        PyArrayObject *a = (PyArrayObject *)PyTuple_GET_ITEM(pair, 1);
        const char *name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(pair, 0));
        CUdeviceptr ptr = 0;
        size_t size = 0;
        const void *data = PyArray_DATA(a);
        size_t nbytes = (size_t)PyArray_NBYTES(a);

        if (name == NULL
            || CM_CU(ModuleGetGlobal, (&ptr, &size, m->handle, name)) < 0) {
            return -1;
        }
        if (size < nbytes) {
            PyErr_Format(PyExc_RuntimeError,
                         "constant %s has %zu bytes in the module, %zu "
                         "given", name, size, nbytes);
            return -1;
        }
        CM_CU_NOGIL(err, MemcpyHtoD, (ptr, data, nbytes));
        if (err < 0) {
            return -1;
        }
    }
    return 0;
}

PyDoc_STRVAR(cm_compile_doc,
"compile(source, *, name_expressions=(), options=(), constants=None)\n"
"--\n\n"
"Compile CUDA C source with NVRTC for the current device and load it.\n"
"\n"
"name_expressions: C++ names (``\"scale<float>\"``) to instantiate and "
"look up by that spelling; options: extra NVRTC options; constants: a "
"dict of name: array, each declared as a __constant__ array of the "
"array's dtype and shape ahead of the source and filled with its data "
"(numba's const.array_like).  Results are cached on disk "
"(CUDAMEM_CACHE_DIR).  Returns a Module; raises CompileError with "
"NVRTC's log when the source does not compile.");

static PyObject *
cm_compile_fn(PyObject *mod, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"source", "name_expressions", "options",
                             "constants", NULL};
    static const char prog_name[] = "cudamem_module.cu";
    cm_state *st = cm_st;
    PyObject *source;
    PyObject *names_arg = NULL;
    PyObject *opts_arg = NULL;
    PyObject *constants = Py_None;
    PyObject *empty = NULL;
    PyObject *names_t = NULL;
    PyObject *opts_t = NULL;
    PyObject *items = NULL;
    PyObject *decls = NULL;
    PyObject *full = NULL;
    PyObject *r = NULL;
    const char **names = NULL;
    const char **opts = NULL;
    char incdir[1100];
    cm_context *ctx;
    cm_module *m = NULL;
    cm_nvrtc_req req;
    cm_nvrtc_result res;
    int status;
    int err;
    Py_ssize_t i;

    (void)mod;
    memset(&res, 0, sizeof(res));
    memset(&req, 0, sizeof(req));
    if (!PyArg_ParseTupleAndKeywords(args, kw, "U|$OOO:compile", kwlist,
                                     &source, &names_arg, &opts_arg,
                                     &constants)) {
        return NULL;
    }
    if ((empty = PyTuple_New(0)) == NULL
        || (names_t = cm_str_tuple(names_arg != NULL ? names_arg : empty,
                                   "name_expressions", &names, 0)) == NULL
        || (opts_t = cm_str_tuple(opts_arg != NULL ? opts_arg : empty,
                                  "options", &opts, 1)) == NULL) {
        goto out;
    }
    if (constants != Py_None) {
        if ((items = cm_constants_prepare(constants, &decls)) == NULL) {
            goto out;
        }
        full = PyUnicode_FromFormat("%U#line 1 \"%s\"\n%U", decls,
                                    prog_name, source);
    }
    else {
        full = Py_NewRef(source);
    }
    if (full == NULL || (req.src = PyUnicode_AsUTF8(full)) == NULL) {
        goto out;
    }
    if ((ctx = cm_context_current()) == NULL || cm_nvrtc_ensure() < 0) {
        goto out;
    }
    req.name = prog_name;
    req.major = ctx->device->cc_major;
    req.minor = ctx->device->cc_minor;
    req.n_opts = (int)PyTuple_GET_SIZE(opts_t);
    if (cm_nvrtc_include_dir(incdir + 2, sizeof(incdir) - 2) == 0) {
        incdir[0] = '-';
        incdir[1] = 'I';
        opts[req.n_opts++] = incdir;
    }
    req.opts = opts;
    req.n_names = (int)PyTuple_GET_SIZE(names_t);
    req.names = names;
    req.want_ptx = cm_on_sim();
    req.keep_ptx = 1;
    Py_BEGIN_ALLOW_THREADS
    status = cm_nvrtc_compile_nogil(&req, &res);
    Py_END_ALLOW_THREADS
    if (status == CM_NVRTC_ENOMEM) {
        PyErr_NoMemory();
        goto out;
    }
    if (status != CM_NVRTC_OK) {
        cm_raise_compile(&res, prog_name);
        goto out;
    }
    m = PyObject_GC_New(cm_module, st->Module_type);
    if (m == NULL) {
        goto out;
    }
    m->ctx = (cm_context *)Py_NewRef(ctx);
    m->handle = NULL;
    m->ptx = res.ptx;
    res.ptx = NULL;
    m->weakreflist = NULL;
    m->lowered = PyDict_New();
    m->kernels = PyDict_New();
    PyObject_GC_Track(m);
    if (m->lowered == NULL || m->kernels == NULL) {
        goto out;
    }
    for (i = 0; i < req.n_names; i++) {
        PyObject *low = PyUnicode_FromString(res.lowered[i]);

        if (low == NULL
            || PyDict_SetItem(m->lowered, PyTuple_GET_ITEM(names_t, i),
                              low) < 0) {
            Py_XDECREF(low);
            goto out;
        }
        Py_DECREF(low);
    }
    if (!cm_on_sim()) {
        CUmodule h = NULL;
        const void *image = res.image;

        if (cm_context_activate(ctx) < 0) {
            goto out;
        }
        CM_CU_NOGIL(err, ModuleLoadData, (&h, image));
        if (err < 0) {
            goto out;
        }
        m->handle = h;
        if (items != NULL && cm_constants_fill(m, items) < 0) {
            goto out;
        }
    }
    r = Py_NewRef((PyObject *)m);
out:
    cm_nvrtc_result_clear(&res, req.n_names);
    Py_XDECREF(m);
    Py_XDECREF(full);
    Py_XDECREF(decls);
    Py_XDECREF(items);
    PyMem_Free(opts);
    PyMem_Free(names);
    Py_XDECREF(opts_t);
    Py_XDECREF(names_t);
    Py_XDECREF(empty);
    return r;
}

/* ------------------------------------------------------------------ */
/* Synchronous copies for views of module globals                      */
/* ------------------------------------------------------------------ */

PyDoc_STRVAR(cm_memcpy_htod_doc,
"_memcpy_htod(dptr, src, /)\n--\n\n"
"Copy the bytes of a buffer to a device address in the current context, "
"synchronously.");

static PyObject *
cm_memcpy_htod_fn(PyObject *mod, PyObject *args)
{
    unsigned long long dptr;
    Py_buffer view;
    int err;

    (void)mod;
    if (!PyArg_ParseTuple(args, "Ky*:_memcpy_htod", &dptr, &view)) {
        return NULL;
    }
    if (cm_context_current() == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    CM_CU_NOGIL(err, MemcpyHtoD, ((CUdeviceptr)dptr, view.buf,
                                  (size_t)view.len));
    PyBuffer_Release(&view);
    if (err < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cm_memcpy_dtoh_doc,
"_memcpy_dtoh(dst, dptr, /)\n--\n\n"
"Fill a writable buffer from a device address in the current context, "
"synchronously.");

static PyObject *
cm_memcpy_dtoh_fn(PyObject *mod, PyObject *args)
{
    unsigned long long dptr;
    Py_buffer view;
    int err;

    (void)mod;
    if (!PyArg_ParseTuple(args, "w*K:_memcpy_dtoh", &view, &dptr)) {
        return NULL;
    }
    if (cm_context_current() == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    CM_CU_NOGIL(err, MemcpyDtoH, (view.buf, (CUdeviceptr)dptr,
                                  (size_t)view.len));
    PyBuffer_Release(&view);
    if (err < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef cm_kernel_functions[] = {
    {"compile", (PyCFunction)(void (*)(void))cm_compile_fn,
     METH_VARARGS | METH_KEYWORDS, cm_compile_doc},
    {"_memcpy_htod", cm_memcpy_htod_fn, METH_VARARGS, cm_memcpy_htod_doc},
    {"_memcpy_dtoh", cm_memcpy_dtoh_fn, METH_VARARGS, cm_memcpy_dtoh_doc},
    {NULL, NULL, 0, NULL},
};

int
cm_kernel_init(PyObject *mod, cm_state *st)
{
    PyObject *errs = PyImport_ImportModule("cudamem._errors");

    if (errs == NULL) {
        return -1;
    }
    st->CompileError = PyObject_GetAttrString(errs, "CompileError");
    Py_DECREF(errs);
    if (st->CompileError == NULL) {
        return -1;
    }
    st->str_cai = PyUnicode_InternFromString("__cuda_array_interface__");
    if (st->str_cai == NULL) {
        return -1;
    }
    st->Module_type = (PyTypeObject *)PyType_FromModuleAndSpec(
        mod, &cm_module_spec, NULL);
    if (st->Module_type == NULL
        || PyModule_AddObjectRef(mod, "Module",
                                 (PyObject *)st->Module_type) < 0) {
        return -1;
    }
    st->Kernel_type = (PyTypeObject *)PyType_FromModuleAndSpec(
        mod, &cm_kernel_spec, NULL);
    if (st->Kernel_type == NULL
        || PyModule_AddObjectRef(mod, "Kernel",
                                 (PyObject *)st->Kernel_type) < 0) {
        return -1;
    }
    st->Launcher_type = (PyTypeObject *)PyType_FromModuleAndSpec(
        mod, &cm_launcher_spec, NULL);
    if (st->Launcher_type == NULL) {
        return -1;
    }
    return PyModule_AddFunctions(mod, cm_kernel_functions);
}
