# SPDX-License-Identifier: MIT
"""Hand cudamem._core the Python classes and helpers it uses.

The boundary between the package and its C extension is one-way: Python
imports ``_core``, and C never imports the package.  What C needs from
Python (the exception classes, the NumPy subclasses, the memory
managers, the IPC handle classes, a few helpers and the config module) is
registered here once, when ``cudamem`` is imported; C keeps it in its
module state.  Using ``cudamem._core`` without this registration raises
RuntimeError naming what is missing.
"""

from . import (_api, _core, _emm, _errors, _hostmem, _index, _ipc, _kernel,
               config, graphs)

_core._register(
    CudaSupportError=_errors.CudaSupportError,
    CudaDriverError=_errors.CudaDriverError,
    CudaAPIError=_errors.CudaAPIError,
    CudaOutOfMemoryError=_errors.CudaOutOfMemoryError,
    CompileError=_errors.CompileError,
    MemoryInfo=_errors.MemoryInfo,
    StreamCaptureError=_errors.StreamCaptureError,
    Graph=graphs.Graph,
    GraphPool=graphs.GraphPool,
    manager_for=_emm._manager_for,
    manager_kind=_emm._manager_kind,
    DefaultMemoryManager=_emm.DefaultMemoryManager,
    PoolMemoryManager=_emm.PoolMemoryManager,
    AsyncMemoryManager=_emm.AsyncMemoryManager,
    MemoryPointer=_emm.MemoryPointer,
    IpcHandle=_ipc.IpcHandle,
    IpcArrayHandle=_ipc.IpcArrayHandle,
    IpcRawHandle=_ipc._RawHandle,
    ipc_export_array=_ipc._export_array,
    IpcPointer=_ipc._IpcPointer,
    MappedNDArray=_hostmem.MappedNDArray,
    ManagedNDArray=_hostmem.ManagedNDArray,
    config=config,
    api_split=_api._split,
    global_view=_kernel._global_view,
    index_getitem=_index.getitem,
    index_setitem=_index.setitem,
)
