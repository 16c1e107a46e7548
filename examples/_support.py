# SPDX-License-Identifier: MIT
"""What the examples share: moving arrays to and from the device, and
numba-cuda when it is installed (to run each example's original numba
kernel on the same cudamem memory, through __cuda_array_interface__).

``to_device`` uses ``cudamem.to_device`` when cudamem has device arrays;
otherwise it wraps one ``current_context().memalloc`` allocation in a
minimal object that exports the CUDA Array Interface.
"""

from typing import Any

import numpy as np
import numpy.typing as npt

import cudamem as cuda


class _DeviceBuffer:
    """One allocation seen as an array through the CUDA Array Interface."""

    def __init__(self, shape: tuple[int, ...], dtype: npt.DTypeLike) -> None:
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        nbytes = max(1, int(np.prod(self.shape)) * self.dtype.itemsize)
        self.nbytes = nbytes
        self.mem = cuda.current_context().memalloc(nbytes)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.shape, "strides": None,
                "typestr": self.dtype.str,
                "data": (self.mem.device_pointer, False), "version": 3}

    def copy_to_host(self) -> npt.NDArray[Any]:
        from cudamem import _core

        out = np.empty(self.shape, self.dtype)
        cuda.synchronize()
        _core._memcpy_dtoh(out.reshape(-1).view(np.uint8),
                           self.mem.device_pointer)
        return out


def to_device(host: npt.ArrayLike) -> cuda.DeviceNDArray | _DeviceBuffer:
    host = np.ascontiguousarray(host)
    if hasattr(cuda, "to_device"):
        return cuda.to_device(host)
    from cudamem import _core

    d = _DeviceBuffer(host.shape, host.dtype)
    _core._memcpy_htod(d.mem.device_pointer, host.reshape(-1).view(np.uint8))
    return d


def device_array(shape: int | tuple[int, ...],
                 dtype: npt.DTypeLike) -> cuda.DeviceNDArray | _DeviceBuffer:
    if hasattr(cuda, "device_array"):
        return cuda.device_array(shape, dtype)
    return _DeviceBuffer(shape if isinstance(shape, tuple) else (shape,),
                         dtype)


def copy_to_host(d: cuda.DeviceNDArray | _DeviceBuffer) -> npt.NDArray[Any]:
    cuda.synchronize()
    return d.copy_to_host()


def numba_cuda() -> Any:
    """numba.cuda when numba-cuda is installed and sees a GPU, else None."""
    try:
        if not hasattr(np, "row_stack"):
            np.row_stack = np.vstack  # numba-cuda 0.30 under NumPy 2.5
        from numba import cuda as ncuda

        if not ncuda.is_available():
            return None
        return ncuda
    except Exception:  # noqa: BLE001 - any failure means "not here"
        return None
