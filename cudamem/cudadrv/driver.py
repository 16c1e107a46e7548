# SPDX-License-Identifier: MIT
"""numba.cuda.cudadrv.driver's names, re-exported from cudamem."""

from .._core import Context, Device, Event, Stream
from .._emm import (
    BaseCUDAMemoryManager,
    GetIpcHandleMixin,
    HostOnlyCUDAMemoryManager,
)
from .._pointers import (
    AutoFreePointer,
    ManagedMemory,
    MappedMemory,
    MemoryPointer,
    OwnedPointer,
    PinnedMemory,
)
import ctypes
import functools
import operator
import sys

import numpy as np

from .. import _core
from .._api import profile_start, profile_stop, profiling
from .._core import (
    DeviceNDArray,
    DeviceNDArrayBase,
    as_cuda_array,
    event_elapsed_time,
)
from .._emm import set_memory_manager
from .._errors import CudaAPIError, CudaDriverError, MemoryInfo
from .._ipc import IpcHandle
from .._pointers import ManagedOwnedPointer, MappedOwnedPointer

__all__ = [
    "AutoFreePointer",
    "BaseCUDAMemoryManager",
    "CU_STREAM_DEFAULT",
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
    "ManagedOwnedPointer",
    "MappedOwnedPointer",
    "MIN_REQUIRED_CC",
    "MemoryInfo",
    "MemoryPointer",
    "OwnedPointer",
    "PinnedMemory",
    "SUPPORTS_IPC",
    "Stream",
    "device_ctypes_pointer",
    "device_extents",
    "device_memory_depends",
    "device_memory_size",
    "device_memset",
    "device_pointer",
    "device_to_device",
    "device_to_host",
    "event_elapsed_time",
    "get_version",
    "host_memory_extents",
    "host_memory_size",
    "host_pointer",
    "host_to_device",
    "is_device_memory",
    "memory_size_from_info",
    "profile_start",
    "profile_stop",
    "profiling",
    "require_device_memory",
    "set_memory_manager",
]


# numba's constants of this module.
CU_STREAM_DEFAULT = 0
MIN_REQUIRED_CC = (3, 5)
SUPPORTS_IPC = sys.platform.startswith("linux")


# ---------------------------------------------------------------------------
# numba's pointer helpers
# ---------------------------------------------------------------------------


def is_device_memory(obj):
    """Whether ``obj`` is device memory: a truthy ``__cuda_memory__``
    (device arrays, mapped and managed memory, MemoryPointers)."""
    try:
        return bool(obj.__cuda_memory__)
    except AttributeError:
        return False


def require_device_memory(obj):
    """Raise unless ``obj`` is device memory (``is_device_memory``)."""
    if not is_device_memory(obj):
        raise Exception("Not a CUDA memory object.")


def device_ctypes_pointer(obj):
    """The device address of ``obj`` (device memory) as a ctypes integer;
    ``c_void_p(0)`` for None."""
    if obj is None:
        return ctypes.c_void_p(0)
    require_device_memory(obj)
    return obj.device_ctypes_pointer


def device_pointer(obj):
    """The device address of ``obj`` (device memory) as an int, or None
    for NULL."""
    return device_ctypes_pointer(obj).value


def device_extents(devmem):
    """``(start, end)`` addresses of the whole allocation that contains
    ``devmem``'s memory (cuMemGetAddressRange), not of a view's part."""
    ptr = device_ctypes_pointer(devmem).value or 0
    base, size = _core._address_range(ptr)
    return base, base + size


def device_memory_size(devmem):
    """Bytes of ``devmem``: its ``_cuda_memsize_``, else the size of the
    allocation that contains it (cached on the object where it can be)."""
    sz = getattr(devmem, "_cuda_memsize_", None)
    if sz is None:
        s, e = device_extents(devmem)
        sz = e - s
        try:
            devmem._cuda_memsize_ = sz
        except AttributeError:
            pass
    return sz


def device_memory_depends(devmem, *objs):
    """Record that ``devmem`` refers to ``objs`` (a list in its
    ``_depends_`` attribute, where it has one)."""
    getattr(devmem, "_depends_", []).extend(objs)


def _datetime_as_int(obj):
    dtype = getattr(obj, "dtype", None)
    if dtype is not None and dtype.char in "Mm":
        return obj.view(np.int64)
    return obj


def host_pointer(obj, readonly=False):
    """The address of host buffer ``obj`` (an int is returned as is);
    unless ``readonly``, the buffer must be writable (NumPy scalars and
    records are read as their bytes)."""
    if isinstance(obj, int):
        return obj
    if isinstance(obj, np.generic):
        obj = np.asarray(obj)
    elif not readonly and memoryview(obj).readonly:
        raise BufferError("host buffer is read-only")
    return host_memory_extents(obj)[0]


def _buffer_extents(mv):
    """(start, end) byte addresses a buffer (a memoryview or an ndarray)
    spans, strides counted."""
    arr = np.asarray(mv)
    if arr.dtype.hasobject:
        raise TypeError("object buffers have no host extent")
    start = end = arr.__array_interface__["data"][0]
    if arr.size == 0:
        return start, start
    end = start + arr.itemsize
    for n, st in zip(arr.shape, arr.strides, strict=True):
        if st >= 0:
            end += (n - 1) * st
        else:
            start += (n - 1) * st
    return start, end


def host_memory_extents(obj):
    """``(start, end)`` addresses of host buffer ``obj`` (half open)."""
    obj = _datetime_as_int(obj)
    if isinstance(obj, np.ndarray):
        return _buffer_extents(obj)
    try:
        mv = memoryview(obj)
    except TypeError:
        # ctypes objects whose format NumPy cannot read
        addr = ctypes.addressof(obj)
        return addr, addr + ctypes.sizeof(obj)
    try:
        return _buffer_extents(mv)
    except (TypeError, ValueError, NotImplementedError):
        raw = mv.cast("B") if mv.contiguous else None
        if raw is None:
            raise
        addr = np.frombuffer(raw, np.uint8).ctypes.data
        return addr, addr + mv.nbytes


def host_memory_size(obj):
    """Bytes host buffer ``obj`` spans."""
    s, e = host_memory_extents(obj)
    return e - s


@functools.cache
def memory_size_from_info(shape, strides, itemsize):
    """Bytes spanned by an array of this ``shape``, ``strides`` (bytes)
    and ``itemsize``."""
    if len(shape) != len(strides):
        raise ValueError("shape and strides differ in length")
    if any(n == 0 for n in shape):
        return 0
    lo = hi = 0
    for n, st in zip(shape, strides, strict=True):
        if st >= 0:
            hi += (n - 1) * st
        else:
            lo += (n - 1) * st
    return hi - lo + itemsize


def get_version():
    """The driver's CUDA version as a ``(major, minor)`` tuple."""
    return _core.driver_version()


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
