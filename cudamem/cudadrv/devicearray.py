# SPDX-License-Identifier: MIT
"""numba.cuda.cudadrv.devicearray's names, re-exported from cudamem."""

from .._core import (
    DeviceNDArray,
    DeviceNDArrayBase,
    DeviceRecord,
    from_cuda_array_interface,
    is_cuda_array,
    to_device,
)
from .._hostmem import ManagedNDArray, MappedNDArray
from .._ipc import IpcArrayHandle

__all__ = ["DeviceNDArray", "DeviceNDArrayBase", "DeviceRecord",
           "IpcArrayHandle", "ManagedNDArray", "MappedNDArray",
           "auto_device"]


def auto_device(obj, stream=0, copy=True, user_explicit=False):
    """``(device_array, copied)``: ``obj`` itself (device memory) or a view
    of it (CUDA Array Interface) with ``copied`` False, else a new device
    copy with ``copied`` True.  ``user_explicit`` is accepted for numba
    compatibility; cudamem never warns about implicit copies here."""
    if isinstance(obj, DeviceNDArrayBase) or getattr(obj, "__cuda_memory__",
                                                     False):
        return obj, False
    if is_cuda_array(obj):
        return from_cuda_array_interface(obj.__cuda_array_interface__,
                                         owner=obj), False
    return to_device(obj, stream=stream, copy=copy), True
