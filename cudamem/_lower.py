# SPDX-License-Identifier: MIT
"""numba.cuda's lower layer on cudamem's objects: the ``Context`` methods
and the ``MemoryPointer`` interface of the memory owners.

Why Python, and why here: these calls are made by code written for
numba's driver layer (tests, EMM plugins, libraries that allocate raw
memory), never on a per-element or per-copy path, and each is a few
lines over what the C extension already does.  ``Context``,
``DeviceAllocation`` and ``HostAllocation`` are C types that accept
attribute assignment (numba's are Python classes, and code written for
numba patches them), so the methods are attached to them once, when
cudamem is imported; the hot paths (allocation, copies, arrays) stay in
C and never look at these attributes.
"""

import ctypes
import operator
import weakref

from . import _core
from ._emm import (
    DefaultMemoryManager,
    _allocations,
    _builtin_memallocmanaged,
    _builtin_memhostalloc,
    _builtin_mempin,
    _current,
    _defer_cleanup,
)
from ._errors import CudaDriverError
from ._ipc import _handle_bytes
from ._pointers import MappedOwnedPointer, MemoryPointer, OwnedPointer

__all__ = []

Context = _core.Context
DeviceAllocation = _core.DeviceAllocation
HostAllocation = _core.HostAllocation


# ---------------------------------------------------------------------------
# The MemoryPointer interface of DeviceAllocation and HostAllocation
# ---------------------------------------------------------------------------
#
# numba counts the holders of an allocation in ``refct``: 1 for the memory
# object itself, one more for every ``own()`` proxy and view alive.  In
# cudamem those hold a strong reference to the owner, so the count only
# reports them; the memory goes when the owner object does.

_holds = weakref.WeakKeyDictionary()


def _get_refct(self):
    return _holds.get(self, 1)


def _set_refct(self, value):
    _holds[self] = operator.index(value)


def _own(self):
    """A proxy that counts as one more holder of this memory (pinned
    memory: the object itself, as in numba)."""
    if isinstance(self, HostAllocation):
        if self.kind == "pinned":
            return self
        return MappedOwnedPointer(self)
    return OwnedPointer(self)


def _view(self, start, stop=None):
    """A pointer to bytes [start, stop) of this memory that keeps it
    alive; numba's RuntimeErrors for a negative size and for a non-empty
    view of NULL memory, ValueError for one outside the memory."""
    start = operator.index(start)
    size = self.size - start if stop is None else operator.index(stop) - start
    base = self.device_pointer_value
    if not base:
        if size != 0:
            raise RuntimeError("non-empty slice into empty slice")
        return OwnedPointer(self, MemoryPointer(self.context, 0, 0,
                                                owner=self))
    if size < 0:
        raise RuntimeError("size cannot be negative")
    if start < 0 or start + size > self.size:
        raise ValueError("view [%d, %d) outside a pointer of %d bytes"
                         % (start, start + size, self.size))
    view = MemoryPointer(self.context, base + start, size, owner=self)
    return OwnedPointer(self, view)


def _memset(self, byte, count=None, stream=0):
    """Set ``count`` bytes (default: all) to ``byte``: cuMemsetD8, or
    cuMemsetD8Async on a truthy ``stream``."""
    count = self.size if count is None else operator.index(count)
    if not 0 <= count <= self.size:
        raise ValueError("memset of %d bytes on memory of %d bytes"
                         % (count, self.size))
    if count:
        _core._memset(self.device_pointer, byte, count, stream, self)


def _device_ctypes_pointer(self):
    return ctypes.c_size_t(self.device_pointer)


def _host_cuda_memory(self):
    return self.kind != "pinned"


def _host_device_ctypes_pointer(self):
    if self.kind == "pinned":
        raise AttributeError("pinned memory has no device pointer")
    return ctypes.c_size_t(self.device_pointer)


def _host_buffer_address(self):
    return self.host_pointer


DeviceAllocation.__cuda_memory__ = True
DeviceAllocation.refct = property(_get_refct, _set_refct,
                                  doc="numba's count of holders.")
DeviceAllocation.owner = property(lambda self: self,
                                  doc="What keeps the memory alive: self.")
DeviceAllocation.is_managed = True
DeviceAllocation.device_ctypes_pointer = property(
    _device_ctypes_pointer, doc="The device address as ctypes.c_size_t.")
DeviceAllocation._cuda_memsize_ = property(lambda self: self.size)
DeviceAllocation.own = _own
DeviceAllocation.view = _view
DeviceAllocation.memset = _memset

HostAllocation.__cuda_memory__ = property(
    _host_cuda_memory, doc="True for mapped and managed memory.")
HostAllocation.refct = property(_get_refct, _set_refct,
                                doc="numba's count of holders.")
HostAllocation.is_managed = True
HostAllocation.owned = property(lambda self: None)
HostAllocation.device_ctypes_pointer = property(
    _host_device_ctypes_pointer,
    doc="The device address as ctypes.c_size_t (mapped, managed).")
HostAllocation._cuda_memsize_ = property(lambda self: self.size)
HostAllocation._buffer_address = property(_host_buffer_address)
HostAllocation.own = _own
HostAllocation.view = _view
HostAllocation.memset = _memset


# ---------------------------------------------------------------------------
# Context methods
# ---------------------------------------------------------------------------

def _builtin(ctx):
    """Whether ``ctx`` allocates with its built-in manager here: no EMM
    plugin is assigned, or one of the built-in manager's own methods is
    running on this thread (called by a plugin that wraps it)."""
    return (isinstance(ctx.memory_manager, DefaultMemoryManager)
            or _core._mm_direct(0) > 0)


def _ctx_memhostalloc(self, bytesize, mapped=False, portable=False,
                      wc=False):
    """Page-locked host memory of ``bytesize`` bytes (cuMemHostAlloc):
    a MappedMemory (owned proxy) when ``mapped``, else a PinnedMemory;
    both are buffers over the bytes.  From the memory manager."""
    if not _builtin(self):
        return self.memory_manager.memhostalloc(bytesize, mapped, portable,
                                                wc)
    return _builtin_memhostalloc(self, bytesize, mapped, portable, wc)


def _ctx_mempin(self, owner, pointer, size, mapped=False):
    """Page-lock ``size`` bytes of host memory at ``pointer`` (owned by
    ``owner``) with cuMemHostRegister: a MappedMemory (owned proxy) when
    ``mapped``, else a PinnedMemory.  Unregistered at once when the
    object goes."""
    if mapped and not self.device.CAN_MAP_HOST_MEMORY:
        raise CudaDriverError("%s cannot map host memory" % self.device)
    if not _builtin(self):
        return self.memory_manager.mempin(owner, pointer, size, mapped)
    return _builtin_mempin(self, owner, pointer, size, mapped)


def _ctx_memallocmanaged(self, bytesize, attach_global=True):
    """Managed memory of ``bytesize`` bytes (cuMemAllocManaged): a
    ManagedMemory (owned proxy), a buffer over the bytes."""
    if not _builtin(self):
        return self.memory_manager.memallocmanaged(bytesize, attach_global)
    return _builtin_memallocmanaged(self, bytesize, attach_global)


def _ctx_get_ipc_handle(self, memory):
    """An IpcHandle of ``memory`` (allocated in this context), from the
    memory manager."""
    return self.memory_manager.get_ipc_handle(memory)


def _ctx_open_ipc_handle(self, handle, size):
    """Map another process's memory (an IPC handle's bytes) of ``size``
    bytes into this context: a MemoryPointer, unmapped when its owner
    goes."""
    mapping = _core._ipc_open(self, _handle_bytes(handle),
                              operator.index(size))
    return MemoryPointer(weakref.proxy(self), mapping.device_pointer, size,
                         owner=mapping)


def _ctx_create_stream(self):
    """A new stream of this context (cudamem.stream() in it)."""
    with _current(self):
        return _core.stream()


def _ctx_create_external_stream(self, ptr):
    """A Stream over a stream handle made elsewhere (not destroyed by
    cudamem)."""
    if not isinstance(ptr, int):
        raise TypeError("ptr for external stream must be an int")
    with _current(self):
        return _core.external_stream(ptr)


def _ctx_create_event(self, timing=True):
    """A new event of this context; ``timing=False`` disables timing."""
    with _current(self):
        return _core.event(timing)


def _ctx_get_default_stream(self):
    """The default stream (handle 0)."""
    return _core.default_stream()


def _ctx_get_legacy_default_stream(self):
    """The legacy default stream (CU_STREAM_LEGACY)."""
    return _core.legacy_default_stream()


def _ctx_get_per_thread_default_stream(self):
    """The per-thread default stream (CU_STREAM_PER_THREAD)."""
    return _core.per_thread_default_stream()


def _ctx_prepare_for_use(self):
    """Initialise the memory manager (any number of times)."""
    self.memory_manager.initialize()


def _ctx_defer_cleanup(self):
    """Hold this context's deallocations for the block (nestable); see
    cudamem.defer_cleanup."""
    return _defer_cleanup(self)


for _name, _fn in [
    ("memhostalloc", _ctx_memhostalloc),
    ("mempin", _ctx_mempin),
    ("memallocmanaged", _ctx_memallocmanaged),
    ("get_ipc_handle", _ctx_get_ipc_handle),
    ("open_ipc_handle", _ctx_open_ipc_handle),
    ("create_stream", _ctx_create_stream),
    ("create_external_stream", _ctx_create_external_stream),
    ("create_event", _ctx_create_event),
    ("get_default_stream", _ctx_get_default_stream),
    ("get_legacy_default_stream", _ctx_get_legacy_default_stream),
    ("get_per_thread_default_stream", _ctx_get_per_thread_default_stream),
    ("prepare_for_use", _ctx_prepare_for_use),
    ("defer_cleanup", _ctx_defer_cleanup),
]:
    _fn.__name__ = _name
    _fn.__qualname__ = "Context." + _name
    setattr(Context, _name, _fn)
Context.allocations = property(_allocations, doc=_allocations.__doc__)
del _name, _fn


# numba-cuda (0.30 and later) launches its kernels on an argument that
# says __cuda_memory__ through the argument's _strided_memory_view_shim: an
# object with the pointer, shape, dtype, size and a layout (strides in
# bytes and contiguity flags).  Device arrays give one, so that numba
# kernels take cudamem arrays directly.

class _Layout:
    __slots__ = ("strides_in_bytes", "is_contiguous_c", "is_contiguous_f",
                 "is_contiguous_any")

    def __init__(self, strides, c, f):
        self.strides_in_bytes = strides
        self.is_contiguous_c = c
        self.is_contiguous_f = f
        self.is_contiguous_any = c or f


class _MemoryView:
    __slots__ = ("ptr", "shape", "dtype", "size", "_layout")

    def __init__(self, ary):
        self.ptr = ary.device_ctypes_pointer.value or 0
        self.shape = ary.shape
        self.dtype = ary.dtype
        self.size = ary.size
        self._layout = _Layout(ary.strides, ary.is_c_contiguous(),
                               ary.is_f_contiguous())


def _strided_memory_view_shim(self):
    return _MemoryView(self)


_core.DeviceNDArrayBase._strided_memory_view_shim = property(
    _strided_memory_view_shim,
    doc="The array as numba-cuda's kernel launcher reads it.")
