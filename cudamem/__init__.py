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
    require_context,
)
from ._core import (
    Context,
    Device,
    DeviceNDArray,
    DeviceNDArrayBase,
    DeviceRecord,
    as_cuda_array,
    current_context,
    device_array,
    device_array_like,
    driver_version,
    from_cuda_array_interface,
    from_dlpack,
    get_current_device,
    is_cuda_array,
    memory_stats,
    runtime_version,
    select_device,
    synchronize,
    to_device,
)
from ._emm import (
    AutoFreePointer,
    BaseCUDAMemoryManager,
    GetIpcHandleMixin,
    HostOnlyCUDAMemoryManager,
    ManagedMemory,
    MappedMemory,
    MemoryPointer,
    OwnedPointer,
    PinnedMemory,
    defer_cleanup,
    set_memory_manager,
)
from ._errors import (
    CudaAPIError,
    CudaDriverError,
    CudaOutOfMemoryError,
    CudaSupportError,
    MemoryInfo,
)

__version__ = "0.1.0"

__all__ = [
    "AutoFreePointer",
    "BaseCUDAMemoryManager",
    "Context",
    "CudaAPIError",
    "CudaDriverError",
    "CudaOutOfMemoryError",
    "CudaSupportError",
    "Device",
    "DeviceNDArray",
    "DeviceNDArrayBase",
    "DeviceRecord",
    "GetIpcHandleMixin",
    "HostOnlyCUDAMemoryManager",
    "ManagedMemory",
    "MappedMemory",
    "MemoryInfo",
    "MemoryPointer",
    "OwnedPointer",
    "PinnedMemory",
    "as_cuda_array",
    "close",
    "config",
    "cuda_error",
    "current_context",
    "defer_cleanup",
    "detect",
    "device_array",
    "device_array_like",
    "driver_version",
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
    "list_devices",
    "memory_stats",
    "require_context",
    "runtime_version",
    "select_device",
    "set_memory_manager",
    "synchronize",
    "to_device",
]
