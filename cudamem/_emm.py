# SPDX-License-Identifier: MIT
"""Memory managers: the External Memory Management (EMM) plugin interface
of numba.cuda (version 1), the built-in managers' faces and host memory,
the choice of the manager, and deferred cleanup.  The interface's pointer
classes are ``cudamem._pointers``'s, re-exported here.

The built-in managers' work is done in C (cudamem._core): their
allocations never pass through Python, and ``DefaultMemoryManager``,
``PoolMemoryManager`` and ``AsyncMemoryManager`` here are only the faces
contexts show as ``context.memory_manager``.  ``set_memory_manager("pool")``
(or ``"async"``, or ``CUDAMEM_MEMORY_MANAGER=pool``) picks a built-in one
for contexts made afterwards.  A plugin set with
``set_memory_manager`` (or named by ``CUDAMEM_MEMORY_MANAGER`` /
``NUMBA_CUDA_MEMORY_MANAGER``) is called from C for every allocation of
the contexts made afterwards; only its users pay for those Python calls.
"""

import abc
import contextlib
import importlib
import operator
import os
import threading
import weakref
from typing import Any

import numpy as np

from . import _core, _ipc
from ._errors import MemoryInfo
from ._pointers import (
    AutoFreePointer,
    ManagedMemory,
    ManagedOwnedPointer,  # noqa: F401 - cudamem._emm's name too
    MappedMemory,
    MappedOwnedPointer,  # noqa: F401 - cudamem._emm's name too
    MemoryPointer,
    OwnedPointer,
    PinnedMemory,
    _address,
)

__all__ = [
    "AsyncMemoryManager",
    "AutoFreePointer",
    "BaseCUDAMemoryManager",
    "DefaultMemoryManager",
    "GetIpcHandleMixin",
    "HostOnlyCUDAMemoryManager",
    "ManagedMemory",
    "MappedMemory",
    "MemoryPointer",
    "OwnedPointer",
    "PinnedMemory",
    "PoolMemoryManager",
    "defer_cleanup",
    "set_memory_manager",
]

CU_MEMHOSTALLOC_PORTABLE = 0x01
CU_MEMHOSTALLOC_DEVICEMAP = 0x02
CU_MEMHOSTALLOC_WRITECOMBINED = 0x04
CU_MEMHOSTREGISTER_DEVICEMAP = 0x02
CU_MEM_ATTACH_GLOBAL = 0x1
CU_MEM_ATTACH_HOST = 0x2
CUDA_ERROR_OUT_OF_MEMORY = 2


@contextlib.contextmanager
def _direct():
    """Run the block as a built-in manager's own method on this thread:
    its allocations go to the context's built-in manager, not to a plugin
    assigned to ``context.memory_manager``."""
    _core._mm_direct(1)
    try:
        yield
    finally:
        _core._mm_direct(-1)


# ---------------------------------------------------------------------------
# Managers
# ---------------------------------------------------------------------------


class BaseCUDAMemoryManager(metaclass=abc.ABCMeta):
    """The EMM plugin interface, version 1 (numba.cuda's)."""

    def __init__(self, *args, **kwargs):
        if "context" not in kwargs:
            raise RuntimeError("Memory manager requires a context")
        self.context = kwargs.pop("context")

    @abc.abstractmethod
    def memalloc(self, size):
        """Allocate device memory; return a MemoryPointer."""

    @abc.abstractmethod
    def memhostalloc(self, size, mapped=False, portable=False, wc=False):
        """Allocate pinned host memory; MappedMemory or PinnedMemory."""

    @abc.abstractmethod
    def mempin(self, owner, pointer, size, mapped=False):
        """Page-lock existing host memory; MappedMemory or PinnedMemory."""

    @abc.abstractmethod
    def initialize(self):
        """Prepare for use; may be called any number of times."""

    @abc.abstractmethod
    def get_ipc_handle(self, memory):
        """An IpcHandle for memory allocated by this manager."""

    @abc.abstractmethod
    def get_memory_info(self):
        """(free, total) device memory as a MemoryInfo."""

    @abc.abstractmethod
    def reset(self):
        """Free everything this manager allocated."""

    @abc.abstractmethod
    def defer_cleanup(self):
        """A context manager that holds deallocation."""

    @property
    @abc.abstractmethod
    def interface_version(self):
        """The interface version implemented: 1."""


class _PendingDeallocs:
    """A Python queue of finalizers, as numba's plugins expect; the byte
    limit is 0 until ``memory_capacity`` is set."""

    def __init__(self, capacity=0):
        self._cons = []
        self._disable_count = 0
        self._size = 0
        self.memory_capacity = capacity

    @property
    def _max_pending_bytes(self):
        from . import config

        return int(self.memory_capacity * config.CUDA_DEALLOCS_RATIO)

    def add_item(self, dtor, handle, size=-1):
        from . import config

        self._cons.append((dtor, handle, size))
        self._size += max(size, 0)
        if (len(self._cons) > config.CUDA_DEALLOCS_COUNT
                or self._size > self._max_pending_bytes):
            self.clear()

    def clear(self):
        if self.is_disabled:
            return
        while self._cons:
            dtor, handle, size = self._cons.pop(0)
            dtor(handle)
        self._size = 0

    @contextlib.contextmanager
    def disable(self):
        self._disable_count += 1
        try:
            yield
        finally:
            self._disable_count -= 1

    @property
    def is_disabled(self):
        return self._disable_count > 0

    def __len__(self):
        return len(self._cons)


class _AllocationsDict(dict):
    def __setitem__(self, key, value):
        if key in self:
            raise AssertionError("duplicate allocation key %r" % (key,))
        super().__setitem__(key, value)


class HostOnlyCUDAMemoryManager(BaseCUDAMemoryManager):
    """A base for plugins that manage device memory themselves: host
    allocations (pinned, mapped, registered, managed) are done here."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.allocations = _AllocationsDict()
        self.deallocations = _PendingDeallocs()

    def _attempt(self, fn, retry):
        try:
            return fn()
        except MemoryError:
            if not retry:
                raise
            self.deallocations.clear()
            return fn()

    def memhostalloc(self, size, mapped=False, portable=False, wc=False):
        flags = ((CU_MEMHOSTALLOC_DEVICEMAP if mapped else 0)
                 | (CU_MEMHOSTALLOC_PORTABLE if portable else 0)
                 | (CU_MEMHOSTALLOC_WRITECOMBINED if wc else 0))
        ptr = self._attempt(lambda: _core._host_alloc(size, flags), True)
        ctx = self.context
        dealloc = self.deallocations

        def finalizer():
            dealloc.add_item(_core._host_free, ptr, size if mapped else 0)

        if mapped:
            mem = MappedMemory(ctx, ptr, size, finalizer=finalizer)
            self.allocations[ptr] = mem
            return mem.own()
        return PinnedMemory(ctx, ptr, size, finalizer=finalizer)

    def mempin(self, owner, pointer, size, mapped=False):
        ptr = _address(pointer)
        flags = CU_MEMHOSTREGISTER_DEVICEMAP if mapped else 0
        self._attempt(lambda: _core._host_register(ptr, size, flags), mapped)

        def finalizer():
            _core._host_unregister(ptr)  # immediate, never queued

        if mapped:
            mem = MappedMemory(self.context, ptr, size, owner=owner,
                               finalizer=finalizer)
            self.allocations[ptr] = mem
            return mem.own()
        return PinnedMemory(self.context, ptr, size, owner=owner,
                            finalizer=finalizer)

    def memallocmanaged(self, size, attach_global):
        flags = CU_MEM_ATTACH_GLOBAL if attach_global else CU_MEM_ATTACH_HOST
        ptr = self._attempt(lambda: _core._managed_alloc(size, flags), True)
        dealloc = self.deallocations

        def finalizer():
            dealloc.add_item(_core._device_free, ptr, size)

        mem = ManagedMemory(self.context, ptr, size, finalizer=finalizer)
        self.allocations[ptr] = mem
        return mem.own()

    def reset(self):
        self.allocations.clear()
        self.deallocations.clear()

    @contextlib.contextmanager
    def defer_cleanup(self):
        with self.deallocations.disable():
            yield


class GetIpcHandleMixin:
    """get_ipc_handle for managers whose allocations cuIpcGetMemHandle
    can export (it finds the base allocation and the offset)."""

    def get_ipc_handle(self, memory):
        return _ipc.ipc_handle_of(self.context, memory)


class DefaultMemoryManager(GetIpcHandleMixin):
    """cudamem's built-in manager: cuMemAlloc, with frees deferred on the
    context's queue (``deallocations``) and flushed past the thresholds of
    ``config.CUDA_DEALLOCS_COUNT`` / ``CUDA_DEALLOCS_RATIO``."""

    interface_version = 1

    def __init__(self, context):
        self.context = context

    @property
    def deallocations(self):
        """The queue of pending memory frees."""
        return self.context._memory_deallocations

    def initialize(self):
        """Nothing to prepare; may be called any number of times."""

    # These allocate with the context's built-in manager even while a
    # plugin is assigned to ``context.memory_manager``: a plugin that
    # wraps the manager it replaced (and delegates to it) must not be
    # called back.

    def memalloc(self, size):
        """Allocate ``size`` bytes of device memory."""
        with _direct():
            return self.context.memalloc(size)

    def memhostalloc(self, size, mapped=False, portable=False, wc=False):
        """Allocate ``size`` bytes of page-locked host memory: a
        MappedMemory (owned proxy) when ``mapped``, else a PinnedMemory."""
        return _builtin_memhostalloc(self.context, size, mapped, portable,
                                     wc)

    def mempin(self, owner, pointer, size, mapped=False):
        """Page-lock ``size`` bytes of existing host memory at
        ``pointer``."""
        return _builtin_mempin(self.context, owner, pointer, size, mapped)

    def memallocmanaged(self, size, attach_global=True):
        """Allocate ``size`` bytes of managed memory."""
        return _builtin_memallocmanaged(self.context, size, attach_global)

    def get_memory_info(self):
        """(free, total) bytes of device memory."""
        with _direct():
            free, total = self.context.get_memory_info()
        return MemoryInfo(free, total)

    def reset(self):
        """Run the pending frees now."""
        q = self.deallocations
        if not q.is_disabled:
            q.clear()

    @contextlib.contextmanager
    def defer_cleanup(self):
        """Hold this manager's frees until the block exits."""
        q = self.deallocations
        q._disable(1)
        try:
            yield
        finally:
            q._disable(-1)


class PoolMemoryManager(DefaultMemoryManager):
    """cudamem's caching allocator (``set_memory_manager("pool")``).

    Device memory is cut from cached segments and reused: on the stream
    it was allocated for at once, on other streams once an event recorded
    when it was freed has completed.  Frees return blocks to the pool at
    once, except inside ``defer_cleanup()``, which queues them on
    ``deallocations`` like the default manager's frees.

    Stream safety: a device array is allocated for the stream it is bound
    to (``device_array(..., stream=s)``, ``to_device(..., stream=s)``).
    Work that cudamem queues on it on another stream (a copy, a setitem or
    a kernel launch with ``stream=s3``) is remembered, and the block is
    handed out again only once that work has completed, whatever stream
    asks for it next.  What cudamem cannot see is work another library
    queues on the memory after receiving its address through
    ``__cuda_array_interface__`` or DLPack: there the consumer's side of
    the protocol (the interface's ``stream`` entry, ``__dlpack__(stream=)``)
    is the point of synchronisation, as in numba, and the memory must
    outlive that work (keep the array alive, or synchronise, before
    dropping it).  ``CUDAMEM_POOL_POISON=1`` fills every block handed out
    with the byte 0xA5 (on its stream), so that a use after free reads
    wrong bytes instead of stale right ones.
    """

    def trim(self):
        """Give every wholly free cached segment back to the driver (on
        virtual memory: every idle page, after waiting for the
        context)."""
        _core._pool_trim(self.context)

    @property
    def limit(self):
        """The most bytes the pool may hold (0: no limit); settable.
        Starts at ``CUDAMEM_POOL_LIMIT``."""
        return _core._pool_limit(self.context)

    @limit.setter
    def limit(self, value):
        _core._pool_limit(self.context,
                          _check_int("limit", value, 0, 2 ** 63 - 1))

    def stats(self):
        """A dict: reserved_bytes, free_bytes, largest_free_block,
        segments, limit, virtual_memory; on virtual memory (the default;
        ``CUDAMEM_POOL_VMM=0`` turns it off) reserved_bytes are the mapped
        bytes plus the peers' pool's (the cuMemAlloc'd segments that
        serve other libraries through cudamem's adapters), and page_size,
        idle_bytes, release_threshold, pages (made, moved, released),
        peers_reserved_bytes and borrowed_from_peers (requests that could
        map no memory, served by the peers' pool's free blocks) follow."""
        return _core._pool_stats(self.context)

    def reset(self):
        """Run the pending frees, then trim."""
        super().reset()
        self.trim()


def _check_int(name, value, lo, hi):
    """value as an int in [lo, hi] (bytes), else ValueError naming it."""
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError("%s must be an int (bytes; 0: none), not %s"
                        % (name, type(value).__name__)) from None
    if not lo <= v <= hi:
        raise ValueError("%s must be from %d to %d bytes, got %d"
                         % (name, lo, hi, v))
    return v


class AsyncMemoryManager(PoolMemoryManager):
    """The driver's stream-ordered allocator (``set_memory_manager(
    "async")``): cuMemAllocFromPoolAsync / cuMemFreeAsync on the
    allocation's stream from a memory pool of the context's own, whose
    release threshold (``CUDAMEM_ASYNC_RELEASE_THRESHOLD``, default
    2**64-1) keeps memory cached across synchronisations.

    The pool is made with the POSIX file-descriptor handle type, so its
    memory exports through IPC (``get_ipc_handle()``) like any other
    manager's; where the device cannot make such a pool (``shareable`` is
    False), the manager uses the device's default pool with
    cuMemAllocAsync, and exports raise CudaAPIError saying why.

    Memory used on streams other than its own (see PoolMemoryManager) is
    freed on a stream of the manager's own that first waits for each of
    them, so no user stream is made to wait for another; the pool does
    not let the driver add such waits for reuse either.

    ``trim()`` waits for the context, then trims the driver's pool to 0;
    ``limit`` caps the bytes allocated through this manager;
    ``stats()['largest_free_block']`` is None (the driver does not say).
    """

    @property
    def shareable(self):
        """Whether the pool can be shared with other processes, so that
        its memory exports through IPC."""
        return _core._async_shareable(self.context)

    @property
    def release_threshold(self):
        """The driver pool's CU_MEMPOOL_ATTR_RELEASE_THRESHOLD; settable."""
        return _core._async_release_threshold(self.context)

    @release_threshold.setter
    def release_threshold(self, value):
        _core._async_release_threshold(
            self.context, _check_int("release_threshold", value, 0,
                                     2 ** 64 - 1))


# ---------------------------------------------------------------------------
# The built-in managers' host memory
# ---------------------------------------------------------------------------
#
# What DefaultMemoryManager's memhostalloc / mempin / memallocmanaged do,
# and a context's own (cudamem._lower's Context methods) when no plugin
# is assigned: cudamem's C host memory, tracked in the context's
# ``allocations``.

_ctx_allocations = weakref.WeakKeyDictionary()


def _allocations(self):
    """The pointer objects this context's own ``memhostalloc``,
    ``mempin`` and ``memallocmanaged`` keep alive (numba's ``allocations``),
    by address."""
    d = _ctx_allocations.get(self)
    if d is None:
        d = _ctx_allocations[self] = _AllocationsDict()
    return d


@contextlib.contextmanager
def _current(ctx):
    """Make ``ctx`` current for the block (pushed, then popped)."""
    ctx.push()
    try:
        yield
    finally:
        ctx.pop()


def _tracked(ctx, cls, ptr, size, holder, owner=None):
    """A ``cls`` pointer at ``ptr`` whose finalizer lets go of ``holder``
    (a HostAllocation, whose memory then goes to the deferred queue), kept
    in the context's ``allocations`` until then."""
    allocs = _allocations(ctx)
    keep = [holder]

    def finalizer():
        allocs.pop(ptr, None)
        keep.clear()

    mem = cls(ctx, ptr, size, owner=owner, finalizer=finalizer)
    if cls is not PinnedMemory:
        allocs[ptr] = mem
    return mem


def _builtin_memhostalloc(ctx, bytesize, mapped=False, portable=False,
                          wc=False):
    """The built-in managers' memhostalloc (cudamem's C host memory)."""
    n = operator.index(bytesize)
    with _direct(), _current(ctx):
        if mapped or portable or wc:
            ary = _core.mapped_array(n, np.uint8, portable=bool(portable),
                                     wc=bool(wc))
        else:
            ary = _core.pinned_array(n, np.uint8)
    holder = ary.base
    if mapped:
        return _tracked(ctx, MappedMemory, holder.host_pointer, n,
                        holder).own()
    return _tracked(ctx, PinnedMemory, holder.host_pointer, n, holder)


def _builtin_mempin(ctx, owner, pointer, size, mapped=False):
    """The built-in managers' mempin."""
    ptr = _address(pointer)
    n = operator.index(size)
    with _direct(), _current(ctx):
        _core._host_register(ptr, n,
                             CU_MEMHOSTREGISTER_DEVICEMAP if mapped else 0)
    allocs = _allocations(ctx)

    def finalizer():
        allocs.pop(ptr, None)
        _core._host_unregister(ptr)

    if mapped:
        with _direct(), _current(ctx):
            mem = MappedMemory(ctx, ptr, n, owner=owner,
                               finalizer=finalizer)
        allocs[ptr] = mem
        return mem.own()
    return PinnedMemory(ctx, ptr, n, owner=owner, finalizer=finalizer)


def _builtin_memallocmanaged(ctx, bytesize, attach_global=True):
    """The built-in managers' memallocmanaged."""
    n = operator.index(bytesize)
    with _direct(), _current(ctx):
        ary = _core.managed_array(n, np.uint8,
                                  attach_global=bool(attach_global))
    holder = ary.base
    return _tracked(ctx, ManagedMemory, holder.device_pointer, n,
                    holder).own()


# ---------------------------------------------------------------------------
# Choosing the manager
# ---------------------------------------------------------------------------

# Held by set_memory_manager and by _from_environment for all their work,
# so that the explicit call wins whichever thread runs first and the
# state (_plugin, _env_done, C's built-in kind) is never half of each.
# Re-entrant: the environment's plugin goes through set_memory_manager,
# and a plugin's constructor or module may call it too.
_lock = threading.RLock()
_plugin = None          # the plugin class, or None for a built-in manager
_env_done = False       # the environment variable was consulted
BUILTIN_MANAGERS = ("default", "pool", "async")


def _draws_from_cudamem(plugin):
    """Whether the EMM plugin class (or object) ``plugin`` takes its
    memory from cudamem's manager of the same device: numba's plugin
    ``cudamem.NumbaManager`` and its subclasses, or any plugin that says
    so with a true ``_draws_from_cudamem`` attribute.  Such a plugin
    serves numba's contexts; as the manager of a cudamem context it would
    ask itself for every allocation."""
    return bool(getattr(plugin, "_draws_from_cudamem", False))


def _refuse_loop(plugin, what):
    """The ValueError for a plugin class that takes its memory from
    cudamem, asked for by what."""
    name = plugin.__qualname__
    return ValueError(
        "%s: the EMM plugin %s takes its memory from cudamem's memory "
        "manager, so a cudamem context cannot use it as its manager (every "
        "allocation would ask the plugin itself). It is numba's plugin: "
        "give it to numba (numba.cuda.set_memory_manager(...), or "
        "NUMBA_CUDA_MEMORY_MANAGER=cudamem.numba_plugin) and choose "
        "cudamem's own manager with set_memory_manager(\"pool\") or "
        "CUDAMEM_MEMORY_MANAGER" % (what, name))


def empty_cache() -> None:
    """Give the memory that the current context's manager caches back to
    the device: the pending frees run first, then the built-in ``pool``
    manager gives back every wholly free segment and, on virtual memory
    (the default), every idle page, after waiting for the
    context; the ``async`` manager trims the driver's pool to 0; the
    ``default`` manager caches nothing.  A plugin manager's memory is its
    own: only the pending frees run.  The name PyTorch and CuPy users
    know (``torch.cuda.empty_cache``, ``free_all_blocks``); numba has
    none."""
    ctx = _core.current_context()
    mm = ctx.memory_manager
    if isinstance(mm, DefaultMemoryManager):   # the built-in managers
        mm.reset()
    elif not ctx.deallocations.is_disabled:
        ctx.deallocations.clear()


def set_memory_manager(mm_plugin: Any) -> None:
    """Use ``mm_plugin`` for contexts created from now on; existing
    contexts (and their live allocations) keep theirs.

    ``mm_plugin`` is an EMM plugin class (numba's interface version 1), or
    the name of a built-in manager: ``"default"`` (or None), ``"pool"``
    (cudamem's caching allocator) or ``"async"`` (the driver's
    stream-ordered allocator).  An explicit call wins over
    ``CUDAMEM_MEMORY_MANAGER`` / ``NUMBA_CUDA_MEMORY_MANAGER``.  A plugin
    that takes its memory from cudamem (``cudamem.NumbaManager``) raises
    ``ValueError``: it is numba's, not cudamem's.
    """
    global _plugin, _env_done
    with _lock:
        if mm_plugin is None:
            mm_plugin = "default"
        if isinstance(mm_plugin, str):
            if mm_plugin not in BUILTIN_MANAGERS:
                raise ValueError("unknown built-in memory manager %r "
                                 "(expected one of %s)"
                                 % (mm_plugin, ", ".join(BUILTIN_MANAGERS)))
            _core._set_builtin_manager(mm_plugin)
            _plugin = None
            _env_done = True
            return
        if _draws_from_cudamem(mm_plugin):
            raise _refuse_loop(mm_plugin, "set_memory_manager")
        dummy = mm_plugin(context=None)
        iv = dummy.interface_version
        if iv != 1:
            raise RuntimeError("EMM Plugin interface has version %d - "
                               "version 1 required" % iv)
        _core._set_builtin_manager("default")
        _plugin = mm_plugin
        _env_done = True


#: The module NUMBA_CUDA_MEMORY_MANAGER names to make numba allocate from
#: cudamem; cudamem's own contexts do not take it (nor import it).
NUMBA_PLUGIN_MODULE = "cudamem.numba_plugin"


def _from_environment():
    """The manager the environment names, for contexts made from now on.

    ``CUDAMEM_MEMORY_MANAGER`` wins; ``NUMBA_CUDA_MEMORY_MANAGER`` is
    honoured too, except where it names a plugin that takes its memory
    from cudamem (``cudamem.numba_plugin``): that setting means "numba
    allocates from cudamem", and cudamem's contexts keep the built-in
    manager (``CUDAMEM_MEMORY_MANAGER``, or the default)."""
    global _env_done
    with _lock:
        if _env_done:
            return
        _env_done = True
        name = os.environ.get("CUDAMEM_MEMORY_MANAGER")
        var = "CUDAMEM_MEMORY_MANAGER"
        if not name:
            name = os.environ.get("NUMBA_CUDA_MEMORY_MANAGER") or "default"
            var = "NUMBA_CUDA_MEMORY_MANAGER"
            if name == NUMBA_PLUGIN_MODULE:
                name = "default"
        if name in BUILTIN_MANAGERS:
            _core._set_builtin_manager(name)
            return
        try:
            mod = importlib.import_module(name)
            plugin = mod._numba_memory_manager
            if _draws_from_cudamem(plugin):
                if var == "NUMBA_CUDA_MEMORY_MANAGER":
                    # numba's plugin drawing from cudamem: numba's setting.
                    _core._set_builtin_manager("default")
                    return
                raise _refuse_loop(plugin, "%s=%s" % (var, name))
            set_memory_manager(plugin)
        except Exception as e:
            _env_done = False       # the next context raises again
            raise RuntimeError("Failed to use memory manager from %s"
                               % name) from e


def _manager_for(context):
    """Called from C when a context is made: its plugin manager,
    initialised, or None for a built-in one (C then makes the kind
    ``_core._builtin_manager()`` names)."""
    _from_environment()
    if _plugin is None:
        return None
    mm = _plugin(context=context)
    mm.initialize()
    return mm


def _manager_kind(context, mm):
    """Called from C when ``context.memory_manager = mm``: "plugin" for an
    EMM plugin object, else the kind of a built-in manager of
    ``context``."""
    if isinstance(mm, DefaultMemoryManager):
        if mm.context != context:
            raise ValueError("this built-in memory manager belongs to "
                             "another context")
        if isinstance(mm, AsyncMemoryManager):
            return "async"
        return "pool" if isinstance(mm, PoolMemoryManager) else "default"
    if _draws_from_cudamem(mm):
        raise _refuse_loop(type(mm), "context.memory_manager")
    if isinstance(mm, type) or not callable(getattr(mm, "memalloc", None)):
        raise TypeError("memory_manager must be a memory manager object "
                        "(an instance of an EMM plugin class), not %s"
                        % type(mm).__name__)
    return "plugin"


@contextlib.contextmanager
def _defer_cleanup(ctx):
    mq = ctx._memory_deallocations
    cq = ctx.deallocations
    mm = ctx.memory_manager
    plugin = None if isinstance(mm, DefaultMemoryManager) else mm
    mq._disable(1)
    try:
        cq._disable(1)
        try:
            if plugin is None:
                yield
            else:
                with plugin.defer_cleanup():
                    yield
        finally:
            cq._disable(-1)
    finally:
        mq._disable(-1)


def defer_cleanup() -> contextlib.AbstractContextManager[None]:
    """Hold every deallocation of the current context until the outermost
    block exits; nestable.

    Both queues are held: memory frees and stream / event / module
    destroys, and a plugin manager's own ``defer_cleanup()`` as well.
    Unregistering host memory pinned by ``pinned()`` or ``mapped()`` still
    happens at once.  As in numba, leaving the block frees nothing by
    itself: the queue's thresholds apply again at the next deallocation
    (the pool and async managers, whose releases never wait, apply them
    on leaving).
    """
    return _defer_cleanup(_core.current_context())
