/* SPDX-License-Identifier: MIT */
/*
 * driver/state.c: what every layer of cudamem._core shares, kept in the
 * lowest layer so that each layer reaches it downward.
 *
 * Owns the pointer to the module state (cm_st, set by module exec), the
 * look-up of what the cudamem package registers (its exception classes,
 * raised from any layer), NumPy's C API table (imported once by module
 * exec through cm_numpy_import), and the counters the checking macros of
 * driver/call.h keep around driver calls made with the GIL released: the
 * calls in flight per epoch, the Python host callbacks in flight, the
 * cudamem mutexes the calling thread holds and the GIL saved by
 * CM_GIL_YIELD.
 *
 * Locking: cm_st is written with the GIL held, in module exec and free;
 * the counters change with atomics or are thread-local.
 */
#define CM_NUMPY_API_C
#include "driver/driver.h"

#include <stdarg.h>

cm_state *cm_st;

long cm_driver_calls[2];
unsigned long cm_driver_epoch;

long cm_pycb_live;
_Thread_local int cm_mu_depth;
_Thread_local cm_gil_saved cm_yield_saved;

int
cm_numpy_import(void)
{
    return PyArray_ImportNumPyAPI();
}

PyObject *
cm_registered(PyObject *obj, const char *name)
{
    if (obj == NULL) {
        PyErr_Format(PyExc_RuntimeError,
                     "cudamem._core: %s is not registered: the cudamem "
                     "package registers it when imported (import cudamem, "
                     "not cudamem._core alone)", name);
    }
    return obj;
}

PyObject *
cm_raise_registered(PyObject *cls, const char *name, const char *fmt, ...)
{
    va_list va;

    if (cm_registered(cls, name) == NULL) {
        return NULL;
    }
    va_start(va, fmt);
    PyErr_FormatV(cls, fmt, va);
    va_end(va);
    return NULL;
}
