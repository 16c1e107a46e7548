/* SPDX-License-Identifier: MIT */
/*
 * features/compile.c: compile() through NVRTC and its disk cache (the
 * views of module globals copy with memory.c's _memcpy_htod/_dtoh).
 *
 * Locks and the GIL: no lock.  NVRTC's compilation (Py_BEGIN_ALLOW_THREADS
 * around cm_nvrtc_compile_nogil), the module's load and the copies of
 * its constants' initial values (CM_CU_NOGIL) run without the GIL; they
 * read only C locals and the bytes of Python objects (source, names,
 * arrays) the call holds references to, and touch no Python object.
 */
#include "features/kernel.h"

#include <stdlib.h>
#include <string.h>

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

    if (CM_REGISTERED(CompileError) == NULL) {
        return;
    }
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

static PyMethodDef cm_kernel_functions[] = {
    {"compile", (PyCFunction)(void (*)(void))cm_compile_fn,
     METH_VARARGS | METH_KEYWORDS, cm_compile_doc},
    {NULL, NULL, 0, NULL},
};

int
cm_kernel_init(PyObject *mod, cm_state *st)
{
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
