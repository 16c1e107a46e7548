# SPDX-License-Identifier: MIT
"""Sharing device memory between processes (CUDA IPC), as numba.cuda does.

``DeviceNDArray.get_ipc_handle()`` gives an ``IpcArrayHandle``: it pickles,
so it crosses ``multiprocessing`` queues and pipes, and another process
opens it with ``handle.open()`` or ``with handle as arr:``.  Underneath is
``IpcHandle``, numba's class of the same name: the driver handle of the
*base* allocation (found with ``cuMemGetAddressRange``), the size of the
exported bytes and their offset inside the allocation, and the exporting
device's PCI identity.  The driver calls are in C (``cudamem._core``), and
so is the export of memory from the built-in managers: it makes the two
handle objects without calling Python (their attributes live in the C
bases ``_core._IpcHandleBase`` and ``_core._IpcArrayHandleBase``; the
base MemoryPointer, the handle bytes and the dicts are made on first
read).  Memory of a plugin goes through the plugin's ``get_ipc_handle``.

Memory managers: ``GetIpcHandleMixin.get_ipc_handle`` calls
``ipc_handle_of(context, memory)``, which works for any memory that
``cuIpcGetMemHandle`` can export -- ``cuMemAlloc`` allocations and
sub-allocations inside them (a pool's blocks), at any offset -- and for
memory of the built-in async manager.  Stream-ordered memory cannot be
exported with ``cuIpcGetMemHandle``; the async manager allocates from a
pool of its own made with the POSIX file-descriptor handle type, and its
memory is exported as a *memory-pool export*: the 64 bytes of
``cuMemPoolExportPointer`` (in ``handle``) plus the pool's shareable
handle as the exporter holds it, ``pool = (pid, fd, token)``.  The
importer takes the descriptor from the exporting process with
``pidfd_open`` + ``pidfd_getfd`` (Linux 5.6 or later; it needs ptrace
access to the exporter: the same user and a Yama ``ptrace_scope`` that
allows it, or ``CAP_SYS_PTRACE``), imports the pool and then the
allocation.  The exporter keeps the descriptor open until its context is
closed; a handle opened after that, or after the exporting process
exited, raises ``OSError`` saying so.  Where ``pidfd_getfd`` is refused
(no ptrace access), the importer asks the exporter for the descriptor
over a Unix socket the exporting process serves (a process of the same
user; ``CUDAMEM_IPC_FD`` = ``auto``, ``pidfd`` or ``socket`` picks).
Where the device cannot make a shareable pool, the async manager uses
the device's default pool and its exports raise ``CudaAPIError`` saying
why.

Memory of the pool manager on virtual memory (the default) is
made of ``cuMemCreate`` pages, which ``cuIpcGetMemHandle`` does not
accept either: it is exported as *pool pages*, the exporter's POSIX
descriptors of the pages under the exported bytes, ``pages = (pid,
page_size, ((fd, id), ...))`` (the 64 ``handle`` bytes are zeros, and
``offset`` is where the bytes start in the first page).  The importer
takes each descriptor the same way, imports the pages and maps them in
order into a range of its own.  A page's descriptor stays open in the
exporter while its memory is held, at least as long as the exported
array lives.

``IpcHandle.kind`` is ``"ipc"``, ``"mempool"`` or ``"vmm"``; ``open()``
takes the matching path.
"""

import contextlib
import sys

import numpy as np

from . import _core
from ._pointers import MemoryPointer, _address

__all__ = ["IpcArrayHandle", "IpcHandle", "ipc_handle_of", "open_ipc_array"]

SUPPORTS_IPC = sys.platform.startswith("linux")
HANDLE_SIZE = 64


def _require_ipc():
    if not SUPPORTS_IPC:
        raise OSError("OS does not support CUDA IPC")


class _RawHandle(bytes):
    """The 64 bytes of a ``CUipcMemHandle``; ``.reserved`` is numba's name
    for them (cuda-python's ``CUipcMemHandle.reserved``)."""

    __slots__ = ()

    @property
    def reserved(self):
        return bytes(self)

    def __reduce__(self):
        return (_RawHandle, (bytes(self),))


def _handle_bytes(handle):
    """The 64 handle bytes from bytes-likes, a sequence of 64 ints (numba's
    pickled form), anything with ``.reserved``, an IpcHandle or an
    IpcArrayHandle."""
    if isinstance(handle, IpcArrayHandle):
        handle = handle.ipc_handle
    if isinstance(handle, IpcHandle):
        handle = handle.handle
    if not isinstance(handle, (bytes, bytearray, memoryview)):
        handle = getattr(handle, "reserved", handle)
    try:
        if isinstance(handle, (bytes, bytearray, memoryview)):
            raw = bytes(handle)
        else:
            raw = bytes(int(b) & 0xFF for b in handle)
    except TypeError:
        raise TypeError("an IPC handle must be 64 bytes (bytes, a sequence "
                        "of ints, or an object with .reserved), got %s"
                        % type(handle).__name__) from None
    if len(raw) != HANDLE_SIZE:
        raise ValueError("an IPC handle has %d bytes, got %d"
                         % (HANDLE_SIZE, len(raw)))
    return _RawHandle(raw)


def _pool_tuple(pool):
    """None, or a memory-pool export's (pid, fd, token) as ints."""
    if pool is None:
        return None
    try:
        pid, fd, token = pool
        return (int(pid), int(fd), int(token))
    except (TypeError, ValueError):
        raise TypeError("pool must be None or a (pid, fd, token) tuple, "
                        "got %r" % (pool,)) from None


def _pages_tuple(pages):
    """None, or an export of pool pages as (pid, page_size, ((fd, id),
    ...)) of ints."""
    if pages is None:
        return None
    try:
        pid, page_size, entries = pages
        entries = tuple((int(fd), int(i)) for fd, i in entries)
        if not entries:
            raise ValueError
        return (int(pid), int(page_size), entries)
    except (TypeError, ValueError):
        raise TypeError("pages must be None or a (pid, page_size, ((fd, "
                        "id), ...)) tuple, got %r" % (pages,)) from None


def _find_device(identity):
    """The ordinal of the device with this PCI identity; RuntimeError if
    this process does not see it."""
    for i in range(_core._device_count()):
        if _core._get_device(i).get_device_identity() == identity:
            return i
    raise RuntimeError("No device of {} is found".format(identity))


def _c_strides(shape, itemsize):
    strides = []
    stride = itemsize
    for n in reversed(shape):
        strides.append(stride)
        stride *= max(n, 1)
    return tuple(reversed(strides))


def _layout(shape, dtype, strides):
    """Normalised (shape, dtype, strides, span) of an array description;
    C strides when ``strides`` is None, for any ndim (numba assumed 1-D).
    ``span`` is the bytes from the lowest to the highest element."""
    dtype = np.dtype(dtype)
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    shape = tuple(int(n) for n in shape)
    if any(n < 0 for n in shape):
        raise ValueError("negative dimensions are not allowed: %r"
                         % (shape,))
    if strides is None:
        strides = _c_strides(shape, dtype.itemsize)
    else:
        if isinstance(strides, (int, np.integer)):
            strides = (strides,)
        strides = tuple(int(s) for s in strides)
        if len(strides) != len(shape):
            raise ValueError("strides not match ndim")
    if 0 in shape:
        return shape, dtype, strides, 0
    lo = sum((n - 1) * s for n, s in zip(shape, strides, strict=True) if s < 0)
    hi = sum((n - 1) * s for n, s in zip(shape, strides, strict=True) if s > 0)
    return shape, dtype, strides, hi - lo + dtype.itemsize


# ---------------------------------------------------------------------------
# IpcHandle
# ---------------------------------------------------------------------------


class _IpcPointer(_core.IpcMemory, MemoryPointer):
    """What an open gives: the imported mapping (``_core.IpcMemory``,
    whose ``device_pointer`` and ``size`` are the exported view's) with
    MemoryPointer's methods.  Arrays over it hold it as their
    ``gpu_data``: once ``close()`` has unmapped it, every use of them
    (copies, kernels, views, CAI and DLPack exports) raises ValueError, as
    after ``DeviceAllocation.free()``.  Made in C only."""

    # What MemoryPointer.__init__ would set: no finalizer, its own owner.
    _owner = None
    _finalizer = None
    is_managed = False
    refct = 1

    @property
    def _cuda_memsize_(self):
        return self.size


class _DirectOpen:
    """An open made with cuIpcOpenMemHandle in the importing context."""

    def __init__(self, parent):
        self.parent = parent
        self.mapping = None

    def open(self, context):
        p = self.parent
        if p.base is not None:
            raise ValueError("opening IpcHandle from original process")
        if self.mapping is not None:
            raise ValueError("IpcHandle is already opened")
        pool = p.pool
        if p.pages is not None:
            self.mapping = _core._ipc_open_vmm(context, p.pages, p.size,
                                               p.offset)
        elif pool is None:
            self.mapping = _core._ipc_open(context, p.handle, p.size,
                                           p.offset)
        else:
            # The pool's device, where its memory is: others need access.
            src = (context.device.id if p.source_info is None
                   else _find_device(p.source_info))
            self.mapping = _core._ipc_open_pool(
                context, p.handle, p.size, pool, src, p.offset)
        # The mapping itself (an _IpcPointer) at the view: arrays over it
        # see its close.
        return self.mapping

    def close(self):
        if self.mapping is None:
            raise ValueError("IpcHandle not opened")
        mapping, self.mapping = self.mapping, None
        mapping.close()


class _StagedOpen:
    """An open without peer access: map on the source device, copy into
    new memory of the importing context, unmap."""

    def __init__(self, parent):
        self.parent = parent

    def open(self, context):
        from ._api import gpus

        src = _find_device(self.parent.source_info)
        direct = _DirectOpen(self.parent)
        with gpus[src]:
            source = direct.open(_core.current_context())
            try:
                newmem = context.memalloc(self.parent.size)
                n = self.parent.size
                dst = _core.DeviceNDArray((n,), (1,), np.uint8,
                                          gpu_data=newmem)
                dst.copy_to_device(_core.DeviceNDArray(
                    (n,), (1,), np.uint8, gpu_data=source))
                context.synchronize()
            finally:
                direct.close()
        return newmem

    def close(self):
        pass


class IpcHandle(_core._IpcHandleBase):
    """A CUDA IPC handle of device memory: numba.cuda's ``IpcHandle``.

    Parameters
    ----------
    base : MemoryPointer or None
        The exported memory, kept alive by this handle in the exporting
        process; None once unpickled elsewhere.
    handle : bytes-like
        The 64 bytes of the ``CUipcMemHandle`` of the base allocation.
    size : int
        Bytes exported (the view's size).
    source_info : dict, optional
        The exporting device's ``get_device_identity()``.
    offset : int
        The view's offset inside the base allocation.
    pool : tuple, optional
        For a memory-pool export (the async manager's memory), the
        pool's shareable handle as the exporter holds it: ``(pid, fd,
        token)``; ``handle`` then holds the ``cuMemPoolExportPointer``
        data.  None (the default) for a ``cuIpcGetMemHandle`` handle.
    pages : tuple, optional
        For an export of pool pages (the pool manager's memory on
        virtual memory), the pages under the exported bytes as the
        exporter holds them: ``(pid, page_size, ((fd, id), ...))``, in
        order; ``offset`` is then where the bytes start in the first
        page.  None (the default) otherwise.

    Notes
    -----
    ``open()`` maps directly when the devices are the same or peers, else
    copies through the source device (``open_staged``), as numba does.
    Unlike numba, a mapping that is never closed is unmapped (through the
    deferred-release queue) once nothing uses it.  ``pool``, ``pages``
    and ``kind`` are cudamem's: numba exports only ``cuIpcGetMemHandle``
    handles.
    """

    _impl = None  # the open: a _DirectOpen or _StagedOpen, or None

    def __init__(self, base, handle, size, source_info=None, offset=0, *,
                 pool=None, pages=None):
        self.base = base
        self.handle = _handle_bytes(handle)
        self.size = int(size)
        self.source_info = source_info
        self.offset = int(offset)
        self.pool = _pool_tuple(pool)
        self.pages = _pages_tuple(pages)
        if self.pool is not None and self.pages is not None:
            raise TypeError("an IpcHandle has pool or pages, not both")
        self._impl = None

    @property
    def kind(self):
        """``"ipc"`` for a ``cuIpcGetMemHandle`` handle, ``"mempool"`` for
        a memory-pool export, ``"vmm"`` for an export of pool pages."""
        if self.pages is not None:
            return "vmm"
        return "ipc" if self.pool is None else "mempool"

    def __repr__(self):
        kind = self.kind
        return "<IpcHandle size=%d offset=%d source=%r%s%s>" % (
            self.size, self.offset, self.source_info,
            "" if kind == "ipc" else " " + kind,
            " open" if self._impl is not None else "")

    def _sentry_source_info(self):
        if self.source_info is None:
            raise RuntimeError("IPC handle doesn't have source info")

    def can_access_peer(self, context):
        """Whether ``context``'s device can map the source device's
        memory directly."""
        self._sentry_source_info()
        dev = context.device
        if self.source_info == dev.get_device_identity():
            return True
        src = _find_device(self.source_info)
        return src == dev.id or _core._can_access_peer(dev.id, src)

    def open_direct(self, context):
        """Map the memory into ``context``; a MemoryPointer at the view."""
        if self._impl is not None:
            raise ValueError("IpcHandle is already opened")
        impl = _DirectOpen(self)
        ptr = impl.open(context)
        self._impl = impl
        return ptr

    def open_staged(self, context):
        """Copy the memory into new memory of ``context`` through the
        source device (for devices without peer access)."""
        self._sentry_source_info()
        if self._impl is not None:
            raise ValueError("IpcHandle is already opened")
        if self.base is not None:
            raise ValueError("opening IpcHandle from original process")
        impl = _StagedOpen(self)
        mem = impl.open(context)
        self._impl = impl
        return mem

    def open(self, context):
        """Import the memory into ``context``: a memory pointer object."""
        if self.source_info is None or self.can_access_peer(context):
            return self.open_direct(context)
        return self.open_staged(context)

    def open_array(self, context, shape, dtype, strides=None):
        """``open()``, wrapped as a DeviceNDArray (C strides by default,
        any ndim)."""
        shape, dtype, strides, _ = _layout(shape, dtype, strides)
        ptr = self.open(context)
        try:
            return _core.DeviceNDArray(shape=shape, strides=strides,
                                       dtype=dtype, gpu_data=ptr)
        except BaseException:
            self.close()
            raise

    def close(self):
        """Unmap (or, for a staged open, nothing to do); ValueError when
        not open."""
        if self._impl is None:
            raise ValueError("IpcHandle not opened")
        impl, self._impl = self._impl, None
        impl.close()

    def __reduce__(self):
        args = (bytes(self.handle), self.size, self.source_info, self.offset)
        if self.pages is not None:
            args += (None, self.pages)
        elif self.pool is not None:
            args += (self.pool,)
        return (_rebuild_ipc_handle, args)


def _rebuild_ipc_handle(handle, size, source_info, offset, pool=None,
                        pages=None):
    return IpcHandle(None, handle, size, source_info=source_info,
                     offset=offset, pool=pool, pages=pages)


_identities = {}  # device id -> its PCI identity (it never changes)


def _identity(device):
    ident = _identities.get(device.id)
    if ident is None:
        ident = _identities[device.id] = device.get_device_identity()
    return dict(ident)


def ipc_handle_of(context, memory):
    """The IpcHandle of ``memory`` (a MemoryPointer of ``context``, or any
    object with ``device_pointer`` and ``size``): the base allocation's
    handle and the offset of ``memory`` inside it."""
    _require_ipc()
    ptr = _address(memory.device_pointer)
    handle, base, _, pool, pages = _core._ipc_export(context, ptr,
                                                     memory.size or None)
    return IpcHandle(memory, handle, memory.size,
                     source_info=_identity(context.device),
                     offset=ptr - base, pool=pool, pages=pages)


# ---------------------------------------------------------------------------
# Arrays
# ---------------------------------------------------------------------------


class IpcArrayHandle(_core._IpcArrayHandleBase):
    """A picklable handle of a device array in another process:
    numba.cuda's ``IpcArrayHandle``.

    ``open()`` (or ``with handle as arr:``) gives a DeviceNDArray over the
    exporter's memory in the current context; ``close()`` unmaps it, after
    which that array is dead.  ``shape``, ``strides``, ``dtype``,
    ``offset`` and ``source_info`` describe what was exported.
    """

    def __init__(self, ipc_handle, array_desc):
        self._array_desc = dict(array_desc)
        self._ipc_handle = ipc_handle

    @property
    def ipc_handle(self):
        return self._ipc_handle

    @property
    def array_desc(self):
        return dict(self._array_desc)

    @property
    def shape(self):
        return self._array_desc["shape"]

    @property
    def strides(self):
        return self._array_desc["strides"]

    @property
    def dtype(self):
        return self._array_desc["dtype"]

    @property
    def offset(self):
        return self._ipc_handle.offset

    @property
    def source_info(self):
        return self._ipc_handle.source_info

    @property
    def handle(self):
        return self._ipc_handle.handle

    def __repr__(self):
        return "<IpcArrayHandle shape=%r dtype=%s %r>" % (
            self.shape, self.dtype, self._ipc_handle)

    def _ipc(self):
        # A handle built by hand or from a doctored pickle may hold
        # anything here: refuse it by name rather than fail on a missing
        # method of whatever it is.  A memory manager's own handle class
        # (duck-typed, as numba allows) has both methods.
        h = self._ipc_handle
        if not (callable(getattr(h, "open_array", None))
                and callable(getattr(h, "close", None))):
            raise TypeError("IpcArrayHandle's ipc_handle must be an "
                            "IpcHandle, not %s" % type(h).__name__)
        return h

    def open(self):
        """A DeviceNDArray over the shared memory, in the current context,
        with stream 0."""
        return self._ipc().open_array(_core.current_context(),
                                      **self._array_desc)

    def close(self):
        """Unmap what ``open()`` mapped; ValueError when not open."""
        self._ipc().close()

    def __enter__(self):
        return self.open()

    def __exit__(self, exc_type, exc, tb):
        self.close()

    def __reduce__(self):
        return (IpcArrayHandle, (self._ipc_handle, self._array_desc),
                self.__dict__ or None)

    def __setstate__(self, state):
        # Extra attributes, or the whole state of a handle pickled by an
        # older cudamem (copyreg's __newobj__ and the instance dict).
        for name, value in state.items():
            setattr(self, name, value)


def _export_array(arr):
    """DeviceNDArray.get_ipc_handle of memory the built-in managers did not
    allocate: export the bytes the array spans through its context's
    memory manager (for the built-in managers' memory, C gives the same
    result without asking them)."""
    _require_ipc()
    if arr.size == 0:
        raise ValueError("cannot export an empty array through IPC: it has "
                         "no device memory")
    gpu_data = arr.gpu_data
    ctx = getattr(gpu_data, "context", None)
    if not isinstance(ctx, _core.Context):
        ctx = _core.current_context()
    span = arr.alloc_size  # the bytes from the lowest to the highest
    lo = 0
    for n, s in zip(arr.shape, arr.strides, strict=True):
        if s < 0:
            lo += (n - 1) * s
    low = arr.device_ctypes_pointer.value + lo
    memory = MemoryPointer(ctx, low, span, owner=gpu_data)
    ipch = ctx.memory_manager.get_ipc_handle(memory)
    desc = {"shape": arr.shape, "strides": arr.strides, "dtype": arr.dtype}
    return IpcArrayHandle(ipc_handle=ipch, array_desc=desc)


@contextlib.contextmanager
def open_ipc_array(handle, shape, dtype, strides=None, offset=0):
    """Open the device memory that ``handle`` (64 IPC handle bytes, or an
    IpcHandle / IpcArrayHandle) names as a DeviceNDArray of ``shape`` and
    ``dtype`` starting ``offset`` bytes into the exported allocation; it is
    unmapped when the block exits.

    Notes
    -----
    numba assumes 1-D when ``strides`` is None and skips the close when the
    block raises; cudamem computes C strides for any ndim and always
    closes.  An IpcHandle or IpcArrayHandle of a memory-pool export or of
    pool pages keeps its kind (``offset`` then counts from the start of
    what it exported: the allocation, or the first page); raw bytes are a
    ``cuIpcGetMemHandle`` handle.
    """
    _require_ipc()
    shape, dtype, strides, span = _layout(shape, dtype, strides)
    src = handle.ipc_handle if isinstance(handle, IpcArrayHandle) else handle
    pool = src.pool if isinstance(src, IpcHandle) else None
    pages = src.pages if isinstance(src, IpcHandle) else None
    source_info = (src.source_info
                   if pool is not None or pages is not None else None)
    ipch = IpcHandle(None, _handle_bytes(handle), span, source_info,
                     offset=offset, pool=pool, pages=pages)
    arr = ipch.open_array(_core.current_context(), shape, dtype, strides)
    try:
        yield arr
    finally:
        ipch.close()
