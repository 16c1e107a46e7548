# SPDX-License-Identifier: MIT
"""cudamem: CUDA memory management for Python, written in C.

``import cudamem as cuda`` gives numba.cuda's memory API (devices and
contexts, device arrays, transfers, pinned / mapped / managed memory,
streams and events, deferred deallocation, the CUDA Array Interface,
DLPack)
without numba.  The driver is loaded at run time; set
``CUDAMEM_SIMULATOR=1`` to run everything on the CPU simulator.
"""

from . import config
from ._api import (
    close,
    cuda_error,
    detect,
    gpus,
    is_available,
    is_bfloat16_supported,
    is_float16_supported,
    is_fp8_supported,
    is_supported_version,
    list_devices,
    mapped,
    pinned,
    profile_start,
    profile_stop,
    profiling,
    require_context,
)
from ._core import (
    Context,
    Device,
    DeviceNDArray,
    DeviceNDArrayBase,
    DeviceRecord,
    Event,
    HostAllocation,
    HostRegistration,
    Kernel,
    Module,
    Stream,
    as_cuda_array,
    can_access_peer,
    compile,
    current_context,
    default_stream,
    device_array,
    device_array_like,
    driver_version,
    enable_peer_access,
    event,
    event_elapsed_time,
    external_stream,
    from_cuda_array_interface,
    from_dlpack,
    get_current_device,
    is_cuda_array,
    legacy_default_stream,
    managed_array,
    mapped_array,
    mapped_array_like,
    memory_stats,
    per_thread_default_stream,
    pinned_array,
    pinned_array_like,
    pinned_pool_stats,
    pinned_pool_trim,
    runtime_version,
    select_device,
    set_memory_limit,
    stream,
    synchronize,
    to_device,
)
from ._emm import (
    AsyncMemoryManager,
    BaseCUDAMemoryManager,
    GetIpcHandleMixin,
    HostOnlyCUDAMemoryManager,
    PoolMemoryManager,
    defer_cleanup,
    empty_cache,
    set_memory_manager,
)
from ._errors import (
    CompileError,
    CudaAPIError,
    CudaDriverError,
    CudaOutOfMemoryError,
    CudaSupportError,
    MemoryInfo,
    StreamCaptureError,
)
from .graphs import Graph, GraphPool, graph
from ._history import dump_snapshot, memory_history, memory_snapshot
from ._ipc import IpcArrayHandle, IpcHandle, open_ipc_array
from ._pointers import (
    AutoFreePointer,
    ManagedMemory,
    MappedMemory,
    MemoryPointer,
    OwnedPointer,
    PinnedMemory,
)
from . import _lower  # noqa: F401  (numba's Context and pointer methods)
from ._kernel import DeviceSymbol
from ._hostmem import ManagedNDArray, MappedNDArray
from . import _register  # noqa: F401  (hands C the classes it uses)
# numba.cuda's accidental exports (its api.py has no __all__), which code
# written for numba uses: cuda.driver.device_to_host,
# cuda.devicearray.auto_device, cuda.devices.get_context.
from .cudadrv import devicearray as devicearray
from .cudadrv import devices as devices
from .cudadrv import driver as driver

__version__ = "0.1.0"


def __getattr__(name):
    # numba's plugin class and the optional modules, loaded on first use:
    # importing cudamem never imports numba, CuPy, PyTorch or Dask (so
    # NumbaManager stays out of __all__: a star import would load numba).
    if name == "NumbaManager":
        from .numba_plugin import NumbaManager

        return NumbaManager
    if name in ("interop", "dask", "numba_plugin"):
        import importlib

        return importlib.import_module("." + name, __name__)
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


__all__ = [
    "AsyncMemoryManager",
    "AutoFreePointer",
    "BaseCUDAMemoryManager",
    "CompileError",
    "Context",
    "CudaAPIError",
    "CudaDriverError",
    "CudaOutOfMemoryError",
    "CudaSupportError",
    "Device",
    "Graph",
    "GraphPool",
    "StreamCaptureError",
    "graph",
    "DeviceNDArray",
    "DeviceNDArrayBase",
    "DeviceRecord",
    "DeviceSymbol",
    "Event",
    "GetIpcHandleMixin",
    "HostAllocation",
    "HostOnlyCUDAMemoryManager",
    "HostRegistration",
    "IpcArrayHandle",
    "IpcHandle",
    "Kernel",
    "ManagedMemory",
    "ManagedNDArray",
    "MappedMemory",
    "MappedNDArray",
    "MemoryInfo",
    "MemoryPointer",
    "Module",
    "OwnedPointer",
    "PinnedMemory",
    "PoolMemoryManager",
    "Stream",
    "as_cuda_array",
    "can_access_peer",
    "close",
    "compile",
    "config",
    "cuda_error",
    "current_context",
    "default_stream",
    "defer_cleanup",
    "empty_cache",
    "detect",
    "device_array",
    "device_array_like",
    "driver_version",
    "dump_snapshot",
    "enable_peer_access",
    "event",
    "event_elapsed_time",
    "external_stream",
    "from_cuda_array_interface",
    "from_dlpack",
    "get_current_device",
    "gpus",
    "is_available",
    "is_bfloat16_supported",
    "is_cuda_array",
    "is_float16_supported",
    "is_fp8_supported",
    "is_supported_version",
    "legacy_default_stream",
    "list_devices",
    "managed_array",
    "mapped",
    "mapped_array",
    "mapped_array_like",
    "memory_history",
    "memory_snapshot",
    "memory_stats",
    "open_ipc_array",
    "per_thread_default_stream",
    "pinned",
    "pinned_array",
    "pinned_array_like",
    "pinned_pool_stats",
    "pinned_pool_trim",
    "profile_start",
    "profile_stop",
    "profiling",
    "require_context",
    "runtime_version",
    "select_device",
    "set_memory_limit",
    "set_memory_manager",
    "stream",
    "synchronize",
    "to_device",
]

# Registers cudamem's arrays with Dask's sizeof and distributed's
# serialisers, now if they are loaded or right after they are; it
# imports neither.
from . import dask as _dask  # noqa: E402, F401
