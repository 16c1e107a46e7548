/* SPDX-License-Identifier: MIT */
/*
 * features/cumodule.c: kernel parameters read from PTX, and Module objects
 * (loaded images, their functions and globals).
 */
#include "features/kernel.h"

#include <stdlib.h>
#include <string.h>


const char cm_no_gpu_msg[] =
    "kernels need a GPU: the CPU simulator (CUDAMEM_SIMULATOR=1) compiles "
    "CUDA C with NVRTC but cannot run it";

int
cm_on_sim(void)
{
    return cm_driver_backend() == CM_BACKEND_SIM;
}

/* ------------------------------------------------------------------ */
/* Parameters from PTX                                                 */
/* ------------------------------------------------------------------ */

/* Whether c may be part of a PTX identifier. */
int
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

            rc = CM_CU_RAW(FuncGetParamInfo, (k->fn, (size_t)i, &off, &sz));
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

/* cudamem._kernel._global_view(owner, ptr, nbytes, dtype, shape), as
 * the package registered it (global_view). */
static PyObject *
cm_global_view(PyObject *owner, CUdeviceptr ptr, size_t nbytes,
               PyObject *dtype, PyObject *shape)
{
    PyObject *fn = CM_REGISTERED(global_view);

    if (fn == NULL) {
        return NULL;
    }
    return PyObject_CallFunction(fn, "OKnOO", owner,
                                 (unsigned long long)ptr,
                                 (Py_ssize_t)nbytes, dtype, shape);
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
    const char *csym;
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
        CM_RAISE(CudaSupportError, "%s", cm_no_gpu_msg);
        return NULL;
    }
    if ((sym = cm_module_symbol(m, name)) == NULL
        || (csym = PyUnicode_AsUTF8(sym)) == NULL
        || cm_context_activate(m->ctx) < 0) {
        goto out;
    }
    rc = CM_CU_RAW(ModuleGetGlobal, (&ptr, &size, m->handle, csym));
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

PyType_Spec cm_module_spec = {
    .name = "cudamem.Module",
    .basicsize = sizeof(cm_module),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC
             | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = cm_module_slots,
};
