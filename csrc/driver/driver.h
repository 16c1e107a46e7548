/* SPDX-License-Identifier: MIT */
/*
 * driver/driver.h: what the layers above use of the driver layer beyond
 * the entry-point table and the checking macros of cm.h: which backend
 * was loaded, the default-stream mode, and NVRTC (nvrtc.c) loaded at run
 * time with its disk cache.
 */
#ifndef CM_DRIVER_H
#define CM_DRIVER_H

#include "cm.h"

/* ------------------------------------------------------------------ */
/* driver.c: the backend and the default-stream mode                  */
/* ------------------------------------------------------------------ */

cm_backend cm_driver_backend(void);
/* Whether CUDAMEM_SIMULATOR (or NUMBA_ENABLE_CUDASIM) asks for the
 * simulator. */
int cm_env_simulator(void);
/* Whether handle 0 means the per-thread default stream. */
int cm_driver_per_thread(void);

int cm_driver_init(PyObject *mod, cm_state *st);

/* ------------------------------------------------------------------ */
/* state.c: the state every layer shares                               */
/* ------------------------------------------------------------------ */

/* Import NumPy's C API (its table lives in state.c); module exec calls
 * it once, first.  0, or -1 with an exception. */
int cm_numpy_import(void);

/* ------------------------------------------------------------------ */
/* nvrtc.c: NVRTC loaded at run time, compilation with a disk cache    */
/* ------------------------------------------------------------------ */

/* What to compile. */
typedef struct {
    const char *src;                 /* CUDA C source */
    const char *name;                /* program name, for the log */
    int major;                       /* target compute capability */
    int minor;
    int n_opts;                      /* extra NVRTC options */
    const char *const *opts;
    int n_names;                     /* name expressions to lower */
    const char *const *names;
    int want_ptx;                    /* PTX for compute_XY, not a cubin */
    int keep_ptx;                    /* also return the PTX text */
} cm_nvrtc_req;

/* What came out; every pointer malloc'd, freed by
 * cm_nvrtc_result_clear. */
typedef struct {
    char *image;                     /* cubin, or NUL-terminated PTX */
    size_t size;                     /* bytes of image (without the NUL) */
    int is_ptx;                      /* image is PTX */
    char *ptx;                       /* the PTX text, if keep_ptx */
    char **lowered;                  /* n_names lowered (mangled) names */
    char *log;                       /* NVRTC's log on failure (or NULL) */
    const char *error;               /* NVRTC's error name on failure */
} cm_nvrtc_result;

/* Statuses of cm_nvrtc_compile_nogil. */
enum {
    CM_NVRTC_OK = 0,
    CM_NVRTC_EFAIL,                  /* NVRTC refused: res->log says why */
    CM_NVRTC_ENOMEM                  /* out of host memory */
};

/* Load NVRTC once; 0, or -1 with CudaSupportError set.  GIL held. */
int cm_nvrtc_ensure(void);
/* The loaded NVRTC's version (after cm_nvrtc_ensure). */
void cm_nvrtc_version(int *major, int *minor);
/* The CUDA Toolkit's include directory into buf (for -I); 0 or -1. */
int cm_nvrtc_include_dir(char *buf, size_t n);
/* Compile through the disk cache (CUDAMEM_CACHE_DIR); runs without the
 * GIL, after cm_nvrtc_ensure.  A CM_NVRTC_* status; res is filled on
 * success and holds the log on CM_NVRTC_EFAIL. */
int cm_nvrtc_compile_nogil(const cm_nvrtc_req *req, cm_nvrtc_result *res);
/* Free what res holds (n_names as in the request). */
void cm_nvrtc_result_clear(cm_nvrtc_result *res, int n_names);

#endif /* CM_DRIVER_H */
