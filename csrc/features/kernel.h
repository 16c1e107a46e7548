/* SPDX-License-Identifier: MIT */
/*
 * features/kernel.h: what the files of user kernels share (cumodule.c,
 * kernel.c, compile.c: the sections of one concept, kept in files of their
 * own).  Private to them: the rest of the folder and module.c use
 * features/features.h.
 */
#ifndef CM_KERNEL_H
#define CM_KERNEL_H

#include "features/features.h"

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

extern const char cm_no_gpu_msg[];

int cm_on_sim(void);

/* ------------------------------------------------------------------ */
/* Parameters from PTX                                                 */
/* ------------------------------------------------------------------ */

/* Whether c may be part of a PTX identifier. */
int cm_ident_char(char c);

extern PyType_Spec cm_module_spec;

PyObject *
cm_launch_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                     PyObject *kwnames);

extern PyType_Spec cm_kernel_spec;

extern PyType_Spec cm_launcher_spec;

#endif /* CM_KERNEL_H */
