# SPDX-License-Identifier: MIT
"""MappedNDArray and ManagedNDArray: NumPy arrays that are device arrays
too.

Why Python: a NumPy subclass is a class deriving from ``numpy.ndarray``,
and NumPy's subclass machinery (views, ``__array_finalize__``, pickling,
ufunc wrapping) is built for classes defined this way; a C subclass of
ndarray would have to re-implement its deallocation and instance
dictionary for no gain.  The classes are thin: the allocation, the owner
object, the device pointer and every copy are C (``cudamem._core``).
Each device-side method makes one C call that builds a DeviceNDArray
view of the same memory (``_core._device_view``, a few hundred
nanoseconds) and delegates to it, so mapped and managed arrays share
DeviceNDArray's copy engine and CUDA Array Interface instead of copying
them.  Creating these arrays, slicing them and NumPy operations on them
run no Python code of cudamem.
"""

import numpy as np

from . import _core

__all__ = ["ManagedNDArray", "MappedNDArray"]

_device_view = _core._device_view
_host_owner = _core._host_owner


class _HostBackedArray(np.ndarray):
    """Host memory the device can address: a NumPy array on the host and
    a device array through ``__cuda_array_interface__``.

    The memory's owner (``gpu_data``, a HostAllocation) is the base of the
    array, so every NumPy view of it (slices, ``split``) is backed by the
    same memory and is a device array too.  The bound ``stream`` belongs
    to the allocation and is shared by its views.

    Notes
    -----
    numba's versions lack ``alloc_size``, so their ``copy_to_host``,
    ``copy_to_device`` and ``split`` raise AttributeError, and their
    slices lose the device side; here they all work.  ``view`` and ``T``
    are NumPy's (host views), where numba's come from DeviceNDArray.
    The results of NumPy operations (``m + 1``) are in ordinary host
    memory: their device-side attributes raise AttributeError.
    """

    __cuda_memory__ = True

    @property
    def gpu_data(self):
        """The HostAllocation that owns the memory."""
        owner = _host_owner(self)
        if owner is None:
            raise AttributeError("this array is not in mapped or managed "
                                 "memory")
        return owner

    @property
    def stream(self):
        """The stream copies default to (0: synchronous)."""
        owner = _host_owner(self)
        return 0 if owner is None else owner.stream

    @stream.setter
    def stream(self, value):
        self.gpu_data.stream = value

    @property
    def __cuda_array_interface__(self):
        return _device_view(self).__cuda_array_interface__

    @property
    def device_ctypes_pointer(self):
        """The device address of the first element, as ctypes c_void_p."""
        return _device_view(self).device_ctypes_pointer

    @property
    def alloc_size(self):
        """Bytes spanned by the array."""
        return _device_view(self).alloc_size

    def device_view(self):
        """A DeviceNDArray over the same memory, bound to ``stream``."""
        return _device_view(self)

    def copy_to_host(self, ary=None, stream=0):
        """Copy to a new host array (``ary`` None) or into ``ary``, as
        DeviceNDArray.copy_to_host."""
        return _device_view(self).copy_to_host(ary, stream=stream)

    def copy_to_device(self, ary, stream=0):
        """Copy ``ary`` (host or device) into this memory, as
        DeviceNDArray.copy_to_device."""
        _device_view(self).copy_to_device(ary, stream=stream)

    def split(self, section, stream=0):
        """Consecutive 1-D views of ``section`` elements each (a
        generator; its errors appear when iterated).  ``stream`` is
        accepted for numba's signature; views share the bound stream."""
        if self.ndim != 1:
            raise ValueError("only support 1d array")
        if self.strides[0] != self.dtype.itemsize:
            raise ValueError("only support unit stride")
        n = self.size
        for begin in range(0, n, section):
            yield self[begin:min(begin + section, n)]

    def is_c_contiguous(self):
        return bool(self.flags.c_contiguous)

    def is_f_contiguous(self):
        return bool(self.flags.f_contiguous)


class MappedNDArray(_HostBackedArray):
    """An array in mapped (zero-copy) host memory, from mapped_array."""


class ManagedNDArray(_HostBackedArray):
    """An array in managed (unified) memory, from managed_array."""

    def prefetch(self, device=None, stream=0):
        """Migrate this array's pages to ``device`` (default: the device
        it was allocated on; ``'cpu'`` for the host) asynchronously on
        ``stream`` (cuMemPrefetchAsync).

        Raises CudaSupportError on devices without concurrent managed
        access, where pages cannot be migrated on demand.
        """
        _core._managed_prefetch(self, device, stream)

    def advise(self, advice, device=None):
        """Give the driver a usage hint for this array's pages
        (cuMemAdvise): ``'read_mostly'``, ``'preferred_location'``,
        ``'accessed_by'`` or their ``'unset_'`` forms; ``device`` as for
        prefetch."""
        _core._managed_advise(self, advice, device)
