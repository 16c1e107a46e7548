# SPDX-License-Identifier: MIT
"""cudamem: CUDA memory management for Python, written in C.

``import cudamem as cuda`` gives numba.cuda's memory API (devices and
contexts, device arrays, transfers, pinned / mapped / managed memory,
streams and events, deferred deallocation, the CUDA Array Interface)
without numba.  The driver is loaded at run time; set
``CUDAMEM_SIMULATOR=1`` to run everything on the CPU simulator.
"""

from . import _core
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
    Event,
    Stream,
    current_context,
    default_stream,
    driver_version,
    event,
    event_elapsed_time,
    external_stream,
    get_current_device,
    legacy_default_stream,
    per_thread_default_stream,
    runtime_version,
    select_device,
    stream,
    synchronize,
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
    "Context",
    "CudaAPIError",
    "CudaDriverError",
    "CudaOutOfMemoryError",
    "CudaSupportError",
    "Device",
    "Event",
    "MemoryInfo",
    "Stream",
    "close",
    "cuda_error",
    "current_context",
    "default_stream",
    "detect",
    "driver_version",
    "event",
    "event_elapsed_time",
    "external_stream",
    "get_current_device",
    "gpus",
    "is_available",
    "is_bfloat16_supported",
    "is_float16_supported",
    "is_fp8_supported",
    "is_supported_version",
    "legacy_default_stream",
    "list_devices",
    "per_thread_default_stream",
    "require_context",
    "runtime_version",
    "select_device",
    "stream",
    "synchronize",
]
