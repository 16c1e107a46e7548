# SPDX-License-Identifier: MIT
"""One memory pool for every GPU library in the process.

CuPy, PyTorch and numba each keep a caching allocator of their own, and
memory cached by one is memory the others cannot have.  The adapters here
make those libraries take their device memory from cudamem's memory
manager of the current context instead (choose the ``pool`` manager,
``cudamem.set_memory_manager("pool")`` or ``CUDAMEM_MEMORY_MANAGER=pool``,
before the first context is made, for stream-ordered reuse):

- :func:`use_with_cupy` installs a CuPy allocator;
- :func:`use_with_torch` installs a PyTorch pluggable allocator
  (:func:`torch_mempool` makes a ``torch.cuda.MemPool`` of it instead);
- ``cudamem.numba_plugin`` is a numba EMM plugin
  (``NUMBA_CUDA_MEMORY_MANAGER=cudamem.numba_plugin``).

Each allocation is tagged with the library that holds it:
``cudamem.memory_stats()["by_client"]`` gives the bytes per library, and a
``CudaOutOfMemoryError`` raised while libraries hold memory names them
(its ``by_client`` attribute has the same dict).

No library is imported before its adapter is asked for.
"""

import threading

from . import _core

__all__ = [
    "CLIENTS",
    "CupyAdapter",
    "client_alloc",
    "client_stats",
    "torch_last_error",
    "torch_mempool",
    "use_with_cupy",
    "use_with_torch",
]

#: The libraries allocations are counted for, by their tag in C.
CLIENTS = ("cupy", "torch", "numba")
_CUPY = 0
_TORCH = 1
_NUMBA = 2

#: The exported C entry points of PyTorch's pluggable allocator.
TORCH_ALLOC_SYMBOL = "cudamem_torch_alloc"
TORCH_FREE_SYMBOL = "cudamem_torch_free"

_lock = threading.Lock()


def client_stats(device=None):
    """The bytes each library holds through cudamem on ``device``
    (default: the current context's), with ``"cudamem"`` for the rest of
    the context's allocated bytes; ``memory_stats()["by_client"]``."""
    return _core._client_stats(device)


def client_alloc(size, client, stream=0, device=None):
    """``size`` bytes from the memory manager of ``device``'s context (an
    ordinal; default: the current context) for the stream with raw handle
    ``stream``, counted for ``client`` (one of :data:`CLIENTS`).  The
    returned ``ClientAllocation`` (``.ptr``, ``.size``) keeps the memory
    until it goes away."""
    try:
        tag = CLIENTS.index(client)
    except ValueError:
        raise ValueError("unknown client %r; expected one of %s"
                         % (client, ", ".join(CLIENTS))) from None
    return _core._client_alloc(device, size, int(stream), tag)


# ---------------------------------------------------------------------------
# CuPy
# ---------------------------------------------------------------------------


class _CupyPinned:
    """cudamem pinned host memory as CuPy's PinnedMemoryPointer wants it:
    ``ptr`` and ``size``, and the array that owns it kept alive."""

    __slots__ = ("ptr", "size", "_owner")

    def __init__(self, owner, size):
        self._owner = owner
        self.ptr = owner.ctypes.data
        self.size = size

    def __int__(self):
        return self.ptr


class CupyAdapter:
    """What :func:`use_with_cupy` installed; ``undo()`` (or leaving the
    ``with`` block) puts CuPy's previous allocators back."""

    def __init__(self, cupy, pinned):
        self._cupy = cupy
        self.pinned = pinned
        self._previous = cupy.cuda.get_allocator()
        self._active = False
        #: CuPy's allocator: ``malloc(size)`` gives ``size`` bytes for
        #: CuPy's current stream from the current context's manager, as a
        #: ``cupy.cuda.MemoryPointer`` (in C, around CuPy's own classes).
        self.malloc = _core._cupy_allocator(
            cupy.cuda.get_current_stream, cupy.cuda.UnownedMemory,
            cupy.cuda.MemoryPointer)

    def pinned_malloc(self, size):
        """CuPy's pinned allocator: cudamem's pinned memory."""
        import numpy as np

        from ._core import pinned_array

        owner = pinned_array(max(int(size), 1), dtype=np.uint8)
        return self._cupy.cuda.PinnedMemoryPointer(
            _CupyPinned(owner, size), 0)

    def install(self):
        cuda = self._cupy.cuda
        cuda.set_allocator(self.malloc)
        if self.pinned:
            cuda.set_pinned_memory_allocator(self.pinned_malloc)
        self._active = True
        return self

    def undo(self):
        """Give CuPy back the allocators it had before."""
        if not self._active:
            return
        cuda = self._cupy.cuda
        cuda.set_allocator(self._previous)
        if self.pinned:
            cuda.set_pinned_memory_allocator(
                self._cupy.get_default_pinned_memory_pool().malloc)
        self._active = False

    @property
    def active(self):
        return self._active

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.undo()


_cupy_adapter = None


def use_with_cupy(pinned=False):
    """Make CuPy take its device memory from cudamem.

    Every CuPy allocation (``cupy.cuda.set_allocator``) then comes from the
    memory manager of cudamem's context for CuPy's current device, for
    ``cupy.cuda.get_current_stream()``: with the ``pool`` manager a block
    CuPy drops is reused at once on that stream, and on another stream
    only once the work queued before the drop has finished.  The memory
    is released when CuPy drops its last reference (its ``UnownedMemory``
    holds cudamem's allocation).  ``pinned=True`` also gives CuPy
    cudamem's pinned memory (``set_pinned_memory_allocator``).

    Returns a :class:`CupyAdapter`; its ``undo()`` (or a ``with`` block)
    puts back the allocators CuPy had.  Calling this again first undoes
    the previous installation.

    Notes
    -----
    A block stays tied to the stream it was allocated for: as with CuPy's
    own pool, keep that stream alive while memory allocated for it lives.
    """
    global _cupy_adapter

    import cupy

    with _lock:
        if _cupy_adapter is not None:
            _cupy_adapter.undo()
        _cupy_adapter = CupyAdapter(cupy, bool(pinned)).install()
        return _cupy_adapter


# ---------------------------------------------------------------------------
# PyTorch
# ---------------------------------------------------------------------------


def _torch_allocator(torch):
    return torch.cuda.memory.CUDAPluggableAllocator(
        _core.__file__, TORCH_ALLOC_SYMBOL, TORCH_FREE_SYMBOL)


def use_with_torch():
    """Make PyTorch's CUDA allocations come from cudamem.

    Installs a ``torch.cuda.memory.CUDAPluggableAllocator`` backed by two
    C functions that cudamem's extension exports (``cudamem_torch_alloc``
    and ``cudamem_torch_free``, PyTorch's documented signatures:
    ``void *alloc(size_t size, int device, cudaStream_t stream)`` and
    ``void free(void *ptr, size_t size, int device, cudaStream_t
    stream)``), through ``torch.cuda.memory.change_current_allocator``.
    Each allocation comes from the manager of cudamem's context of that
    device, for that stream; ``memory_stats()["by_client"]["torch"]``
    counts it.  With the ``pool`` manager, allocations the pool can serve
    from what it holds, and frees, take neither the GIL nor a Python
    object.

    This must run before PyTorch's first CUDA allocation: PyTorch
    refuses to swap an allocator that has already been used (a
    RuntimeError "Can't swap an already initialized allocator").  Call it
    right after ``import torch``, or use :func:`torch_mempool`, which
    needs no such ordering.

    PyTorch cannot receive a Python exception from the allocator: an
    allocation cudamem cannot make (out of memory, for instance) returns
    NULL to PyTorch, and :func:`torch_last_error` gives the exception
    (a ``CudaOutOfMemoryError`` with its snapshot).

    Returns the ``CUDAPluggableAllocator``.
    """
    import torch

    alloc = _torch_allocator(torch)
    torch.cuda.memory.change_current_allocator(alloc)
    return alloc


def torch_mempool():
    """A ``torch.cuda.MemPool`` whose memory comes from cudamem.

    Use it with ``torch.cuda.use_mem_pool(pool)``: the tensors made inside
    the block take their memory from cudamem (PyTorch's caching allocator
    still caches the blocks it got), and PyTorch's own allocator stays in
    place elsewhere, so this works after PyTorch has allocated.  Raises
    NotImplementedError when the installed PyTorch has no ``MemPool``
    taking an allocator.
    """
    import torch

    pool_type = getattr(torch.cuda, "MemPool", None)
    if pool_type is None or not hasattr(torch.cuda, "use_mem_pool"):
        raise NotImplementedError(
            "torch.cuda.MemPool is not available in PyTorch %s; use "
            "cudamem.interop.use_with_torch() instead" % torch.__version__)
    return pool_type(_torch_allocator(torch).allocator())


def torch_last_error(clear=True):
    """The exception of the last allocation for PyTorch that cudamem
    could not make (PyTorch only saw NULL), or None."""
    return _core._torch_last_error(clear)
