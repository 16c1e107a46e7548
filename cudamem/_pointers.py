# SPDX-License-Identifier: MIT
"""The pointer classes of numba.cuda's External Memory Management (EMM)
interface: ``MemoryPointer`` and its kinds (``AutoFreePointer``,
``MappedMemory``, ``PinnedMemory``, ``ManagedMemory``) and the owned
proxies (``OwnedPointer``, ``MappedOwnedPointer``).

What a memory manager hands out, and what IPC opens (``_ipc``): they
depend on ``_core`` alone, below the managers (``_emm``) and IPC, which
both use them.  ``cudamem._emm`` re-exports the public ones.
"""

import ctypes
import operator
import weakref

from . import _core

__all__ = [
    "AutoFreePointer",
    "ManagedMemory",
    "ManagedOwnedPointer",
    "MappedMemory",
    "MappedOwnedPointer",
    "MemoryPointer",
    "OwnedPointer",
    "PinnedMemory",
]


def _address(pointer):
    """An int address from an int, a ctypes pointer or anything with
    ``.value`` (None and NULL give 0)."""
    if isinstance(pointer, int):
        return pointer
    value = getattr(pointer, "value", pointer)
    return int(value or 0)


class _PointerType(type):
    """The metaclass of the pointer classes: cudamem's own memory owners
    (DeviceAllocation, HostAllocation: C types) are instances of the
    pointer class whose interface they have, as numba's objects are."""

    def __instancecheck__(cls, obj):
        if type.__instancecheck__(cls, obj):
            return True
        match = cls.__dict__.get("_c_owner_kinds")
        if match is None:
            return False
        if isinstance(obj, _core.DeviceAllocation):
            return "device" in match
        if isinstance(obj, _core.HostAllocation):
            return obj.kind in match
        return False


class MemoryPointer(metaclass=_PointerType):
    """Device memory that a memory manager hands out.

    ``finalizer``, if given, runs once: on ``free()`` or when this object
    is garbage-collected.  ``owner`` (default: self) is what keeps the
    memory alive for views.
    """

    __cuda_memory__ = True
    _c_owner_kinds = ("device", "mapped", "managed")

    def __init__(self, context, pointer, size, owner=None, finalizer=None):
        self.context = context
        self.device_pointer = _address(pointer)
        self.size = size
        self._cuda_memsize_ = size
        self.is_managed = finalizer is not None
        self.refct = 1
        self.handle = self.device_pointer
        self._owner = owner
        self._finalizer = None
        if finalizer is not None:
            self._finalizer = weakref.finalize(self, finalizer)

    @property
    def owner(self):
        return self if self._owner is None else self._owner

    @property
    def device_ctypes_pointer(self):
        return ctypes.c_size_t(self.device_pointer)

    @property
    def device_pointer_value(self):
        return self.device_pointer or None

    def own(self):
        """A proxy that counts as one more owner of this memory."""
        return OwnedPointer(weakref.proxy(self))

    def free(self):
        """Run the finalizer now; a second call raises RuntimeError."""
        if self.is_managed:
            if not self._finalizer.alive:
                raise RuntimeError("Freeing dead memory")
            self._finalizer()

    def memset(self, byte, count=None, stream=0):
        """Fill ``count`` bytes (default: all) with ``byte``."""
        count = self.size if count is None else operator.index(count)
        if not 0 <= count <= self.size:
            raise ValueError("memset of %d bytes on a pointer of %d bytes"
                             % (count, self.size))
        if count:
            _core._memset(self.device_pointer, byte, count, stream,
                          self.owner)

    def view(self, start, stop=None):
        """A pointer to bytes [start, stop) of this memory."""
        start = operator.index(start)
        if stop is None:
            size = self.size - start
        else:
            size = operator.index(stop) - start
        if size < 0:
            raise RuntimeError("size cannot be negative")
        if not self.device_pointer_value:
            if size != 0:
                raise RuntimeError("non-empty slice into empty slice")
            base = 0
        elif start < 0 or start + size > self.size:
            # numba does not check; a view outside the memory is a bug
            raise ValueError("view [%d, %d) outside a pointer of %d bytes"
                             % (start, start + size, self.size))
        else:
            base = self.device_pointer + start
        view = MemoryPointer(self.context, base, size, owner=self.owner)
        if isinstance(self.owner, (MemoryPointer, OwnedPointer)):
            return OwnedPointer(weakref.proxy(self.owner), view)
        return view


class AutoFreePointer(MemoryPointer):
    """Memory freed when its last owner (``own()`` proxy or view) goes."""

    _c_owner_kinds = ("device",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.refct -= 1


class MappedMemory(AutoFreePointer, _core._HostBuffer):
    """Mapped (zero-copy) host memory: ``host_pointer`` for the host,
    ``device_pointer`` for the device; a buffer over the host bytes."""

    __cuda_memory__ = True
    _c_owner_kinds = ("mapped",)

    def __init__(self, context, pointer, size, owner=None, finalizer=None):
        self.host_pointer = _address(pointer)
        self.owned = owner
        devptr = _core._host_device_pointer(self.host_pointer)
        super().__init__(context, devptr, size, finalizer=finalizer)
        self.handle = self.host_pointer
        self._buffer_address = self.host_pointer

    def own(self):
        return MappedOwnedPointer(weakref.proxy(self))


class PinnedMemory(MemoryPointer, _core._HostBuffer):
    """Page-locked host memory: a buffer over its bytes; not device
    memory (``__cuda_memory__`` is False)."""

    __cuda_memory__ = False
    _c_owner_kinds = ("pinned",)

    def __init__(self, context, pointer, size, owner=None, finalizer=None):
        self.owned = owner
        self.host_pointer = _address(pointer)
        super().__init__(context, pointer, size, finalizer=finalizer)
        self.handle = self.host_pointer
        self._buffer_address = self.host_pointer

    def own(self):
        return self


class ManagedMemory(AutoFreePointer, _core._HostBuffer):
    """Managed (unified) memory: one address for host and device; a
    buffer over its bytes."""

    _c_owner_kinds = ("managed",)

    def __init__(self, context, pointer, size, owner=None, finalizer=None):
        self.owned = owner
        super().__init__(context, pointer, size, finalizer=finalizer)
        self.handle = self.device_pointer
        self._buffer_address = self.device_pointer

    def own(self):
        return MappedOwnedPointer(weakref.proxy(self))


class OwnedPointer:
    """One owner's hold on a pointer: the base's ``refct`` is raised while
    this object lives, and the memory is freed when it drops to 0.

    As in numba, the base is held only weakly: a plugin must keep the
    pointer it made alive itself (numba's managers keep them in
    ``self.allocations``).
    """

    def __init__(self, memptr, view=None):
        self._mem = memptr
        self._view = self._mem if view is None else view
        mem = self._mem
        mem.refct += 1

        def deref():
            try:
                mem.refct -= 1
                if mem.refct == 0:
                    mem.free()
            except ReferenceError:
                pass

        weakref.finalize(self, deref)
        try:
            # read often: an attribute of its own, as numba's
            self.device_ctypes_pointer = self._view.device_ctypes_pointer
        except AttributeError:
            pass

    def __getattr__(self, name):
        return getattr(self._view, name)


class MappedOwnedPointer(OwnedPointer, _core._HostBuffer):
    """An owned pointer over host-visible memory, usable as a buffer."""


ManagedOwnedPointer = MappedOwnedPointer
