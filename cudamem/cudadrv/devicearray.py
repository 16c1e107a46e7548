# SPDX-License-Identifier: MIT
"""numba.cuda.cudadrv.devicearray's names, re-exported from cudamem."""

import numpy as np

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
           "auto_device", "errmsg_contiguous_buffer", "from_array_like",
           "from_record_like", "is_cuda_ndarray", "require_cuda_ndarray",
           "sentry_contiguous", "verify_cuda_ndarray_interface"]

# The ValueError text for arrays that are not one contiguous region.
errmsg_contiguous_buffer = ("Array is not contiguous, so it cannot be copied "
                            "as one memory region; numpy.ascontiguousarray() "
                            "makes a contiguous copy")


def is_cuda_ndarray(obj):
    """Whether ``obj`` says it is a device array (``__cuda_ndarray__``)."""
    return bool(getattr(obj, "__cuda_ndarray__", False))


def verify_cuda_ndarray_interface(obj):
    """Raise unless ``obj`` is a device array with numba's attributes."""
    require_cuda_ndarray(obj)
    for name, kind in (("shape", tuple), ("strides", tuple),
                       ("dtype", np.dtype), ("size", int)):
        if not hasattr(obj, name):
            raise AttributeError("device array lacks %r" % name)
        if not isinstance(getattr(obj, name), kind):
            raise AttributeError("%r of a device array must be a %s"
                                 % (name, kind.__name__))


def require_cuda_ndarray(obj):
    """Raise ValueError unless ``obj`` is a device array."""
    if not is_cuda_ndarray(obj):
        raise ValueError("require an cuda ndarray object")


def sentry_contiguous(ary):
    """Raise ValueError unless ``ary`` (host or device) is C or F
    contiguous, size-1 dimensions aside."""
    core = ary
    if not isinstance(ary, np.ndarray) and not hasattr(ary, "flags"):
        core = np.asarray(ary)
    flags = core.flags
    if not (flags["C_CONTIGUOUS"] or flags["F_CONTIGUOUS"]):
        raise ValueError(errmsg_contiguous_buffer)


def from_array_like(ary, stream=0, gpu_data=None):
    """A DeviceNDArray of ``ary``'s shape, strides and dtype: new memory,
    or ``gpu_data``."""
    return DeviceNDArray(ary.shape, ary.strides, ary.dtype, stream=stream,
                         gpu_data=gpu_data)


def from_record_like(rec, stream=0, gpu_data=None):
    """A DeviceRecord of ``rec``'s dtype: new memory, or ``gpu_data``."""
    return DeviceRecord(rec.dtype, stream=stream, gpu_data=gpu_data)


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
