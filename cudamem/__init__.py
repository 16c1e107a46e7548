# SPDX-License-Identifier: MIT
"""cudamem: CUDA memory management for Python, written in C.

``import cudamem as cuda`` gives numba.cuda's memory API (devices and
contexts, device arrays, transfers, pinned / mapped / managed memory,
streams and events, deferred deallocation, the CUDA Array Interface)
without numba.  The driver is loaded at run time; set
``CUDAMEM_SIMULATOR=1`` to run everything on the CPU simulator.
"""

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
    current_context,
    driver_version,
    get_current_device,
    memory_stats,
    runtime_version,
    select_device,
    synchronize,
)
from . import config
from ._emm import (
    AsyncMemoryManager,
    AutoFreePointer,
    BaseCUDAMemoryManager,
    GetIpcHandleMixin,
    HostOnlyCUDAMemoryManager,
    ManagedMemory,
    MappedMemory,
    MemoryPointer,
    OwnedPointer,
    PinnedMemory,
    PoolMemoryManager,
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
    "AsyncMemoryManager",
    "AutoFreePointer",
    "BaseCUDAMemoryManager",
    "Context",
    "CudaAPIError",
    "CudaDriverError",
    "CudaOutOfMemoryError",
    "CudaSupportError",
    "Device",
    "GetIpcHandleMixin",
    "HostOnlyCUDAMemoryManager",
    "ManagedMemory",
    "MappedMemory",
    "MemoryInfo",
    "MemoryPointer",
    "OwnedPointer",
    "PinnedMemory",
    "PoolMemoryManager",
    "close",
    "config",
    "cuda_error",
    "current_context",
    "defer_cleanup",
    "detect",
    "driver_version",
    "get_current_device",
    "gpus",
    "is_available",
    "is_bfloat16_supported",
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
]
