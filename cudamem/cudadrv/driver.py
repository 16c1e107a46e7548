# SPDX-License-Identifier: MIT
"""numba.cuda.cudadrv.driver's names, re-exported from cudamem."""

from .._core import Context, Device
from .._errors import CudaAPIError, CudaDriverError, MemoryInfo
from .._ipc import IpcHandle

__all__ = [
           "Context",
           "CudaAPIError",
           "CudaDriverError",
           "Device",
           "IpcHandle",
           "MemoryInfo",
]
