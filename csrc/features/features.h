/* SPDX-License-Identifier: MIT */
/*
 * features/features.h: the features layer as module.c sees it, and what
 * its concepts (IPC: ipcbase.c, ipcvmm.c, ipcpool.c, ipc.c, ipchandle.c;
 * user kernels: cumodule.c, kernel.c, compile.c) share; its public
 * header (ipc.h and kernel.h are private to the folder).  The folder
 * owns sharing device memory between processes (the exports, the
 * imports of this process, IpcMemory and the handle objects) and user
 * kernels (compile(), Module, Kernel, launches).  They combine the
 * layers below: contexts and streams, memory, device arrays.
 *
 * Locks and the GIL: two mutexes, cm_imp_mu (ipcpool.c: the memory-pool
 * imports) and cm_vimp_mu (ipcvmm.c: the imported pool pages), each
 * taken alone, never across a driver call or a Python call; the
 * releases from the memory queue take them without the GIL.  Everything
 * else is guarded by the GIL, which NVRTC, module loads, first launches
 * and the IPC driver calls that can wait run without, on C data only.
 */
#ifndef CM_FEATURES_H
#define CM_FEATURES_H

#include "driver/driver.h"
#include "context/context.h"
#include "memory/memory.h"
#include "array/array.h"

/* ------------------------------------------------------------------ */
/* IPC: ipcpool.c, ipchandle.c, ipc.c                                 */
/* ------------------------------------------------------------------ */

/* ctx is being closed (still alive, GIL held): free what it still
 * imports from other processes' pools and destroy those pools.  Never
 * raises. */
void cm_ipc_context_closing(cm_context *ctx);
/* DeviceNDArray.get_ipc_handle (METH_NOARGS): an IpcArrayHandle, made in
 * C for the built-in managers' memory, else by the memory manager's
 * get_ipc_handle through cudamem._ipc._export_array. */
PyObject *cm_ipc_get_handle(PyObject *self, PyObject *unused);
/* 1 if o is an IpcMemory (what IpcHandle.open gives) that was closed,
 * else 0.  Never raises. */
int cm_ipc_mem_closed(PyObject *o);

/* ------------------------------------------------------------------ */
/* init functions of the features layer                               */
/* ------------------------------------------------------------------ */

int cm_ipc_init(PyObject *mod, cm_state *st);
int cm_kernel_init(PyObject *mod, cm_state *st);

#endif /* CM_FEATURES_H */
