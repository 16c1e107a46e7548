# SPDX-License-Identifier: MIT
"""A numba EMM plugin whose device memory comes from cudamem.

Either name the module before numba makes its first context::

    NUMBA_CUDA_MEMORY_MANAGER=cudamem.numba_plugin python app.py

or set it from Python::

    import cudamem
    from numba import cuda
    cuda.set_memory_manager(cudamem.NumbaManager)

numba's device allocations (``cuda.device_array``, ``cuda.to_device``,
the arrays kernels get) then come from the memory manager of cudamem's
context for the same device (the same primary context), so numba, cudamem
and the other adapted libraries (``cudamem.interop``) share one pool.
``cudamem.memory_stats()["by_client"]["numba"]`` counts what numba holds.
Host memory (pinned, mapped) stays numba's own, as in any plugin built on
``HostOnlyCUDAMemoryManager``.

This module imports numba: it is imported only by numba users (cudamem
itself never imports it).
"""

import contextlib
import ctypes

from numba import cuda as _ncuda
from numba.cuda.cudadrv import driver as _ndriver

from . import _core
from ._emm import defer_cleanup as _cudamem_defer_cleanup

__all__ = ["CudamemNumbaManager", "NumbaManager", "_numba_memory_manager"]

_NUMBA = 2  # the client tag of numba's allocations (cudamem.interop)


def _pointer_factory():
    """How this numba wants device pointers: a cuda-python CUdeviceptr
    when it uses NVIDIA's binding, else a ctypes integer."""
    use_nv = getattr(_ndriver, "USE_NV_BINDING", None)
    if use_nv is None:
        # Releases without the switch only have NVIDIA's binding.
        use_nv = hasattr(_ndriver, "binding")
    if use_nv:
        return _ndriver.binding.CUdeviceptr
    return ctypes.c_uint64


_make_pointer = _pointer_factory()


def _memory_info(free, total):
    info = getattr(_ndriver, "MemoryInfo", None)
    if info is None:
        from ._errors import MemoryInfo as info
    return info(free=free, total=total)


class CudamemNumbaManager(
        _ncuda.GetIpcHandleMixin, _ncuda.HostOnlyCUDAMemoryManager):
    # The mixin comes first: its get_ipc_handle must be found before the
    # base class's abstract one, or numba cannot instantiate the class.
    """numba's device memory from cudamem's memory manager of the same
    device; see the module's docstring."""

    #: It takes its memory from cudamem: numba's contexts may use it,
    #: cudamem's may not (cudamem.set_memory_manager refuses it, and
    #: NUMBA_CUDA_MEMORY_MANAGER naming it leaves cudamem's contexts on
    #: their built-in manager).
    _draws_from_cudamem = True

    def initialize(self):
        """Make cudamem's context of numba's device (without making it
        current), so that a failure shows when numba makes its context."""
        _core._client_stats(self._numba_device_id())

    def _numba_device_id(self):
        """The ordinal of numba's device: a numba Device's ``id``, or the
        driver's device handle itself (an int, or a cuda-python
        ``CUdevice``), which numba's context of a primary context it did
        not make (``cuda.current_context()`` after another library made
        it current) holds instead."""
        dev = self.context.device
        ordinal = getattr(dev, "id", None)
        return int(dev if ordinal is None else ordinal)

    def memalloc(self, size):
        """``size`` bytes from cudamem, for the default stream; numba's
        MemoryPointer, whose finalizer releases them."""
        owner = _core._client_alloc(self._numba_device_id(), size, 0,
                                    _NUMBA)
        keep = [owner]
        return _ndriver.MemoryPointer(
            self.context, _make_pointer(owner.ptr), size,
            finalizer=keep.clear)

    def get_memory_info(self):
        """Free and total bytes of the device."""
        from ._api import gpus

        with gpus[self._numba_device_id()]:
            free, total = _core.current_context().get_memory_info()
        return _memory_info(free, total)

    @contextlib.contextmanager
    def defer_cleanup(self):
        """Hold numba's and cudamem's deferred frees."""
        with super().defer_cleanup(), _cudamem_defer_cleanup():
            yield

    @property
    def interface_version(self):
        return 1


NumbaManager = CudamemNumbaManager
#: What NUMBA_CUDA_MEMORY_MANAGER=cudamem.numba_plugin looks up.
_numba_memory_manager = CudamemNumbaManager
