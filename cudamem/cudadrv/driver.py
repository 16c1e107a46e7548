# SPDX-License-Identifier: MIT
"""numba.cuda.cudadrv.driver's names, re-exported from cudamem."""

from .._core import Context, Device, Event, Stream
from .._emm import (
    AutoFreePointer,
    BaseCUDAMemoryManager,
    GetIpcHandleMixin,
    HostOnlyCUDAMemoryManager,
    ManagedMemory,
    MappedMemory,
    MemoryPointer,
    OwnedPointer,
    PinnedMemory,
)
from .._errors import CudaAPIError, CudaDriverError, MemoryInfo
from .._ipc import IpcHandle

__all__ = [
    "AutoFreePointer",
    "BaseCUDAMemoryManager",
    "Context",
    "CudaAPIError",
    "CudaDriverError",
    "Device",
    "Event",
    "GetIpcHandleMixin",
    "HostOnlyCUDAMemoryManager",
    "IpcHandle",
    "ManagedMemory",
    "MappedMemory",
    "MemoryInfo",
    "MemoryPointer",
    "OwnedPointer",
    "PinnedMemory",
    "Stream",
]
