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
import operator

import numpy as np

from .._core import DeviceNDArray, DeviceNDArrayBase, as_cuda_array
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
    "device_memset",
    "device_to_device",
    "device_to_host",
    "host_to_device",
]


# numba's byte-copy helpers of its driver module, which code written for
# numba calls as ``cuda.driver.device_to_host(...)``.  numba hands the raw
# pointers to the driver; cudamem checks that ``size`` bytes fit on both
# sides (ValueError) and copies through its arrays.


def _size(size):
    n = operator.index(size)
    if n < 0:
        raise ValueError("size must be non-negative, not %d" % n)
    return n


def _device_bytes(obj, size, what):
    """A 1-D uint8 device array over the first ``size`` bytes of ``obj``:
    a device array (contiguous), an object with the CUDA Array Interface,
    or device memory with ``device_pointer`` and ``size`` (an allocation or
    a MemoryPointer)."""
    if not isinstance(obj, DeviceNDArrayBase):
        if hasattr(obj, "__cuda_array_interface__"):
            obj = as_cuda_array(obj)
        elif hasattr(obj, "device_pointer") and hasattr(obj, "size"):
            obj = DeviceNDArray((obj.size,), (1,), np.uint8, gpu_data=obj)
        else:
            raise TypeError("%s must be device memory (a device array or "
                            "an allocation), not %s"
                            % (what, type(obj).__name__))
    if obj.is_c_contiguous():
        flat = obj.reshape(obj.size)
    elif obj.is_f_contiguous():
        flat = obj.reshape(obj.size, order="F")
    else:
        raise ValueError("%s must be contiguous device memory" % what)
    flat = flat.view(np.uint8)
    if size > flat.size:
        raise ValueError("size %d exceeds the %d bytes of %s"
                         % (size, flat.size, what))
    return flat[:size]


def _host_bytes(obj, size, writable, what):
    """A 1-D uint8 NumPy view of the first ``size`` bytes of host buffer
    ``obj`` (contiguous; writable when ``writable``)."""
    try:
        mv = memoryview(obj)
    except TypeError:
        raise TypeError("%s must be a host buffer (a NumPy array or a "
                        "bytes-like object), not %s"
                        % (what, type(obj).__name__)) from None
    if writable and mv.readonly:
        raise ValueError("%s is read-only" % what)
    if not (mv.c_contiguous or mv.f_contiguous):
        raise ValueError("%s must be a contiguous host buffer" % what)
    arr = np.asarray(mv)
    flat = arr.ravel(order="F" if not mv.c_contiguous else "C")
    flat = flat.view(np.uint8)
    if size > flat.size:
        raise ValueError("size %d exceeds the %d bytes of %s"
                         % (size, flat.size, what))
    return flat[:size]


def host_to_device(dst, src, size, stream=0):
    """Copy ``size`` bytes from host buffer ``src`` to device memory
    ``dst``; asynchronous on a truthy ``stream``."""
    n = _size(size)
    d = _device_bytes(dst, n, "dst")
    if n:
        d.copy_to_device(_host_bytes(src, n, False, "src"), stream=stream)


def device_to_host(dst, src, size, stream=0):
    """Copy ``size`` bytes from device memory ``src`` to host buffer
    ``dst``; asynchronous on a truthy ``stream``."""
    n = _size(size)
    d = _device_bytes(src, n, "src")
    if n:
        d.copy_to_host(_host_bytes(dst, n, True, "dst"), stream=stream)


def device_to_device(dst, src, size, stream=0):
    """Copy ``size`` bytes between device memories; asynchronous on a
    truthy ``stream``."""
    n = _size(size)
    d = _device_bytes(dst, n, "dst")
    s = _device_bytes(src, n, "src")
    if n:
        d.copy_to_device(s, stream=stream)


def device_memset(dst, val, size, stream=0):
    """Set ``size`` bytes of device memory ``dst`` to the byte ``val``
    (``cuMemsetD8``); asynchronous on a truthy ``stream``."""
    n = _size(size)
    v = operator.index(val)
    if not 0 <= v <= 255:
        raise ValueError("val must be a byte (0..255), not %d" % v)
    d = _device_bytes(dst, n, "dst")
    if n:
        d.setitem(slice(None), np.uint8(v), stream=stream)
