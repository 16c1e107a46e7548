# SPDX-License-Identifier: MIT
"""Views of a module's ``__constant__`` and ``__device__`` symbols.

``Module.get_global`` (C) finds the symbol's address and size and calls
``_global_view`` here: the view is a cudamem DeviceNDArray when the device
arrays are available (through ``from_cuda_array_interface``, owned by the
Module so the symbol outlives the view), else a small ``DeviceSymbol``
with the CUDA Array Interface and synchronous copies.
"""

import math

import numpy as np

from . import _core


class DeviceSymbol:
    """A typed view of a module global: ``shape``, ``dtype``,
    ``__cuda_array_interface__``, ``copy_to_device`` and ``copy_to_host``.

    Notes
    -----
    Copies are synchronous; the stream argument is accepted for numba's
    signature and ignored.
    """

    def __init__(self, owner, ptr, dtype, shape):
        self._owner = owner
        self._ptr = ptr
        self.dtype = dtype
        self.shape = shape
        self.size = math.prod(shape)
        self.nbytes = self.size * dtype.itemsize

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "strides": None,
                "typestr": self.dtype.str, "data": (self._ptr, False),
                "version": 3}

    @property
    def device_ctypes_pointer(self):
        import ctypes

        return ctypes.c_void_p(self._ptr)

    def copy_to_device(self, ary, stream=0):
        """Copy a host array of this shape and dtype into the symbol."""
        del stream
        a = np.ascontiguousarray(ary, dtype=self.dtype)
        if a.shape != self.shape and a.size != self.size:
            raise ValueError("cannot copy an array of shape %s into a "
                             "symbol of shape %s" % (a.shape, self.shape))
        _core._memcpy_htod(self._ptr, a.reshape(-1).view(np.uint8))

    def copy_to_host(self, ary=None, stream=0):
        """The symbol's contents as a host array (into ary if given)."""
        del stream
        out = np.empty(self.shape, self.dtype) if ary is None else ary
        if out.nbytes != self.nbytes or not out.flags.c_contiguous:
            raise ValueError("copy_to_host needs a C-contiguous array of "
                             "%d bytes" % self.nbytes)
        _core._memcpy_dtoh(out.reshape(-1).view(np.uint8), self._ptr)
        return out

    def __repr__(self):
        return "<cudamem.DeviceSymbol shape=%s dtype=%s at 0x%x>" % (
            self.shape, self.dtype, self._ptr)


def _global_view(owner, ptr, nbytes, dtype, shape):
    dtype = np.dtype(np.uint8 if dtype is None else dtype)
    if shape is None:
        if nbytes % dtype.itemsize:
            raise ValueError("the symbol's %d bytes are not a whole number "
                             "of %s items" % (nbytes, dtype))
        shape = (nbytes // dtype.itemsize,)
    elif isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    else:
        shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError("negative dimensions are not allowed")
    need = math.prod(shape) * dtype.itemsize
    if need > nbytes:
        raise ValueError("shape %s of %s needs %d bytes; the symbol has %d"
                         % (shape, dtype, need, nbytes))
    from_cai = getattr(_core, "from_cuda_array_interface", None)
    if from_cai is not None:
        desc = {"shape": shape, "strides": None, "typestr": dtype.str,
                "data": (ptr, False), "version": 3}
        if dtype.fields is not None:
            desc["descr"] = dtype.descr
        return from_cai(desc, owner=owner, sync=False)
    return DeviceSymbol(owner, ptr, dtype, shape)
