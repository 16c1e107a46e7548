# SPDX-License-Identifier: MIT
"""numba.cuda.cudadrv.driver's names, re-exported from cudamem."""

from .._core import Context, Device, Event, Stream
from .._errors import CudaAPIError, CudaDriverError, MemoryInfo

__all__ = ["Context", "CudaAPIError", "CudaDriverError", "Device", "Event",
           "MemoryInfo", "Stream"]
