# SPDX-License-Identifier: MIT
"""The parts of cudamem's API that are natural in Python: device lists,
context managers, and cold functions that print or decorate.

Hot calls live in the C extension and are re-exported by ``cudamem``
directly; nothing here is on a per-operation path.
"""

import contextlib
import atexit
import functools
import os
import sys
import threading
from collections.abc import Iterator
from typing import Optional

from . import _core
from ._errors import CudaSupportError


class _DeviceContextManager:
    """``gpus[i]``: a Device that is also a context manager.

    ``with gpus[i]:`` pushes device i's primary context and pops it on
    exit; ``__enter__`` returns None, as in numba.  Other attributes are
    those of the Device.
    """

    __slots__ = ("_id",)

    def __init__(self, device_id):
        self._id = device_id

    @property
    def _device(self):
        return _core._get_device(self._id)

    def __getattr__(self, name):
        return getattr(self._device, name)

    def __enter__(self):
        attached = getattr(_attached, "context", None)
        if attached is not None and attached.device.id != self._id:
            raise RuntimeError("Cannot switch CUDA-context.")
        _core._push_device(self._id)

    def __exit__(self, exc_type, exc, tb):
        _core._pop_device(self._id)

    def __str__(self):
        return "<Managed Device %d>" % self._id

    __repr__ = __str__

    def __eq__(self, other):
        if isinstance(other, _DeviceContextManager):
            return self._id == other._id
        return self._device == other

    def __hash__(self):
        return hash(self._id)


class _DeviceList:
    """``cudamem.gpus``: the devices, indexable and iterable.

    The driver is consulted on first use, so importing cudamem needs no
    GPU.
    """

    def __init__(self):
        self._items = None
        self._lock = threading.Lock()

    @property
    def _list(self):
        items = self._items
        if items is None:
            with self._lock:
                if self._items is None:
                    n = _core._device_count()
                    self._items = [_DeviceContextManager(i) for i in range(n)]
                items = self._items
        return items

    @property
    def lst(self):
        """The list of devices (context managers), as numba names it."""
        return self._list

    def __len__(self) -> int:
        return len(self._list)

    def __iter__(self):
        return iter(self._list)

    def __getitem__(self, key):
        if isinstance(key, slice):
            return self._list[key]
        if isinstance(key, float):
            raise TypeError("device index must be an integer, not float")
        return self._list[int(key)]

    def __str__(self):
        return ", ".join(str(d) for d in self._list)

    @property
    def current(self):
        """The manager of the current context's device, or None."""
        from ._core import _current_device_id

        i = _current_device_id()
        return None if i is None else self._list[i]


gpus = _DeviceList()


def list_devices() -> "_DeviceList":
    """The device list: ``cudamem.gpus`` itself, as in numba."""
    return gpus


# The context a require_context function runs in, per thread.
_attached = threading.local()


def require_context(fn):
    """Decorator: run ``fn`` with a primary context current on the thread.

    ``fn`` cannot switch contexts: entering ``gpus[j]`` of another device
    in its body raises ``RuntimeError("Cannot switch CUDA-context.")``.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        ctx = _core.current_context()
        old = getattr(_attached, "context", None)
        _attached.context = ctx
        try:
            return fn(*args, **kwargs)
        finally:
            _attached.context = old

    return wrapper


def profile_start() -> None:
    """Enable profile collection by the current profiling tool
    (``cuProfilerStart``), in the current context (made if needed)."""
    _core._profile(True)


def profile_stop() -> None:
    """Disable profile collection by the current profiling tool
    (``cuProfilerStop``), in the current context (made if needed)."""
    _core._profile(False)


@contextlib.contextmanager
def profiling() -> Iterator[None]:
    """Profile the body: ``profile_start()`` on entry, ``profile_stop()``
    on exit.

    Notes
    -----
    numba stops only when the body returns; cudamem stops also when it
    raises (the exception propagates).
    """
    profile_start()
    try:
        yield
    finally:
        profile_stop()


def close() -> None:
    """Pop every context of the calling thread.

    On the main thread it also releases and resets every device's primary
    context: all arrays, streams and events become invalid, and the next
    call that needs a device starts a fresh context.

    Notes
    -----
    numba then fails the next allocation with
    CUDA_ERROR_CONTEXT_IS_DESTROYED; cudamem gives the next call a fresh
    primary context, as numba's documentation intends.

    The primary context is the driver's, shared by every library of the
    process: on the main thread, ``close()`` invalidates CuPy's, PyTorch's
    and numba's memory, streams and modules too, as numba's ``close()``
    does.  Call it only when no other library still uses the GPU.

    Host arrays (``pinned_array``, ``mapped_array``, ``managed_array``)
    still alive keep their contents and stay usable as ordinary pageable
    NumPy memory: the driver unmaps that memory with the context (numba's
    arrays then fault), so cudamem copies it aside first and maps it back
    at the same addresses.  Mapped and managed arrays of a closed context
    have no device side: their device operations raise ``ValueError``, as
    do streams of a closed context.  Memory of an EMM plugin is the
    plugin's, and is not kept.

    Other threads may go on working during ``close()`` (or
    ``Device.reset()``); numba leaves this undefined, cudamem never
    crashes:

    - driver calls they have in flight finish before the reset, and a
      thread that needs the device meanwhile waits for the fresh context;
    - afterwards their streams, events, device arrays and kernels of the
      closed context raise ``ValueError``; an operation caught in the
      middle of the reset raises ``ValueError`` or ``CudaAPIError``;
    - pinned, mapped and managed arrays stay valid host memory, also for a
      thread reading or writing them without the GIL (NumPy releases it)
      while the reset runs: it waits until the pages are back; an
      allocation of host memory caught by the reset raises ``ValueError``;
    - frees of objects of the closed context are dropped without a word.
    """
    _core._close(threading.current_thread() is threading.main_thread())


def is_available() -> bool:
    """True when a driver (or the simulator) initialises and has a device.

    Never raises.
    """
    try:
        return _core._device_count() > 0
    except CudaSupportError:
        return False


def cuda_error() -> Optional[str]:
    """None, or the text of the error that stopped the driver from
    initialising."""
    return _core._init_error()


def is_supported_version() -> bool:
    """Whether the driver implements at least the CUDA version cudamem was
    built against."""
    try:
        return _core.driver_version() >= (11, 3)
    except CudaSupportError:
        return False


def detect() -> bool:
    """Print the devices and whether each is supported; True if any is."""
    n = len(gpus)
    print("Found %d CUDA devices" % n)
    supported = 0
    for i in range(n):
        dev = _core._get_device(i)
        cc = dev.compute_capability
        ok = cc >= (3, 5)
        supported += ok
        tag = "[SUPPORTED]" if ok else "[NOT SUPPORTED: CC < 3.5]"
        print("id %d %20s %40s" % (i, dev.name, tag))
        print("%40s: %d.%d" % ("Compute Capability", cc[0], cc[1]))
        print("%40s: %d" % ("PCI Device ID", dev.PCI_DEVICE_ID))
        print("%40s: %d" % ("PCI Bus ID", dev.PCI_BUS_ID))
        print("%40s: %s" % ("UUID", dev.uuid))
        print("%40s: %d" % ("Watchdog", dev.KERNEL_EXEC_TIMEOUT))
        ratio = dev.SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO
        print("%40s: %d" % ("FP32/FP64 Performance Ratio", ratio))
        print("%40s: %s" % ("FP16 Support", dev.supports_float16))
        print("%40s: %s" % ("BF16 Support", dev.supports_bfloat16))
        print("%40s: %s" % ("FP8 Support", dev.supports_fp8))
    print("Summary:")
    print("\t%d/%d devices are supported" % (supported, n))
    return supported > 0


def is_float16_supported() -> bool:
    """Always True: every supported device has float16."""
    return True


def is_bfloat16_supported() -> bool:
    """Whether the current device has compute capability 8.0 or newer."""
    return _core.get_current_device().supports_bfloat16


def is_fp8_supported() -> bool:
    """Whether the current device has compute capability 8.9 or newer."""
    return _core.get_current_device().supports_fp8


def _split(ary, section, stream=0):
    """DeviceNDArray.split: a generator of consecutive 1-D views of
    ``section`` elements; its errors appear when it is iterated."""
    if ary.ndim != 1:
        raise ValueError("only support 1d array")
    if ary.strides[0] != ary.dtype.itemsize:
        raise ValueError("only support unit stride")
    nsect = (ary.size + section - 1) // section
    for i in range(nsect):
        begin = i * section
        yield ary.getitem(slice(begin, min(begin + section, ary.size)),
                          stream=stream)


@contextlib.contextmanager
def pinned(*arylist):
    """Page-lock the memory of NumPy arrays for the duration of the block
    (cuMemHostRegister); yields None.

    Unregistration happens on exit, at once (never deferred, even inside
    ``defer_cleanup``), also when the block raises.  Arrays already in
    cudamem's page-locked memory are left as they are; empty arrays need
    nothing.

    Notes
    -----
    numba fails with CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED when the
    same memory is pinned twice (nested blocks, overlapping arrays);
    cudamem counts registrations per page range, so nesting and overlap
    work and the pages are unregistered when the last block exits.  After
    the block the arrays are ordinary (pageable) host memory and keep
    working, also for asynchronous copies.
    """
    reg = _core._register_arrays(arylist, False)
    try:
        yield
    finally:
        reg.close()


@contextlib.contextmanager
def mapped(*arylist, **kws):
    """Map the memory of NumPy arrays into the device's address space for
    the duration of the block and yield their device views
    (DeviceNDArray, bound to ``stream``): one array, or a list when
    several were given.  Unmapped on exit, at once.

    Notes
    -----
    After the block the device views (and their views) are dead: using
    them (copies, assignment, kernels, CAI and DLPack exports) raises
    ValueError, where numba writes into the host array or fails in the
    driver.  The host arrays stay ordinary host memory."""
    assert not kws or "stream" in kws, "Only accept 'stream' as keyword."
    stream = kws.get("stream", 0)
    reg = _core._register_arrays(arylist, True)
    try:
        devarys = reg.device_arrays(stream)
        yield devarys[0] if len(arylist) == 1 else devarys
    finally:
        reg.close()


def _wait_at_exit():
    """At interpreter exit, let in-flight copies and host functions finish
    (for at most 5 s) before Python frees the objects they use."""
    try:
        _core._synchronize_all(5.0)
    except Exception:  # noqa: BLE001 - exit must go on
        pass


atexit.register(_wait_at_exit)


def _after_fork_in_child():
    """The package's locks, fresh in a fork's child: another thread of the
    parent may have held one at the fork, and it is not there to give it
    back.  (The C locks are made fresh by the module's own handler.)"""
    gpus._lock = threading.Lock()
    # Only modules already loaded: no import runs in the child's hook.
    for name in ("_emm", "interop"):
        mod = sys.modules.get(__package__ + "." + name)
        if mod is not None:
            mod._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
