# SPDX-License-Identifier: MIT
"""Sharing device memory between processes: IpcArrayHandle, IpcHandle,
open_ipc_array.  The importing side runs in spawned child processes
(tests/helpers/ipc_child.py); on the simulator exported memory lives in a
memfd, so the same tests run without a GPU."""

import copy
import gc
import multiprocessing
import os
import pickle
import subprocess
import sys
import textwrap
import weakref

import numpy as np
import pytest

import cudamem as cuda
from cudamem import _core, _ipc

from helpers import ROOT, emm_plugin, ipc_child, run_py
from helpers.ipc_child import Child, expect_failure, open_on_device_1
from helpers.isolation import ISOLATED, SIMULATOR, use_manager

SPAWN = multiprocessing.get_context("spawn")


@pytest.fixture(scope="module")
def child():
    c = Child()
    yield c
    c.stop()


# ---------------------------------------------------------------------------
# Reading and writing from another process
# ---------------------------------------------------------------------------


def test_child_reads_and_writes_through_queues(ctx):
    a = cuda.to_device(np.arange(100, dtype=np.int32))
    q_in = SPAWN.Queue()
    q_out = SPAWN.Queue()
    p = SPAWN.Process(target=ipc_child.read_and_write, args=(q_in, q_out))
    p.start()
    q_in.put(a.get_ipc_handle())
    seen = q_out.get(timeout=60)
    p.join(60)
    assert p.exitcode == 0
    np.testing.assert_array_equal(seen, np.arange(100))
    np.testing.assert_array_equal(a.copy_to_host(), np.arange(100) + 1)


LAYOUTS = {
    "1d": lambda h: h,
    "2d_c": lambda h: h.reshape(6, 20),
    "3d_f": lambda h: np.asfortranarray(h.reshape(4, 5, 6)),
    "view": lambda h: h.reshape(12, 10)[3:9, 2:7],
    "strided": lambda h: h[5:100:3],
    "negative": lambda h: h.reshape(10, 12)[::-2, ::-1],
    "0d": lambda h: h[7].reshape(()),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("dtype", [np.float64, np.int16, np.complex64])
def test_layouts_round_trip(ctx, child, layout, dtype):
    base = cuda.to_device(np.arange(120).astype(dtype))
    host = LAYOUTS[layout](np.arange(120).astype(dtype))
    # The same view of the device array as of the host one.
    if layout == "1d":
        d = base
    elif layout in ("2d_c",):
        d = base.reshape(6, 20)
    elif layout == "3d_f":
        d = cuda.to_device(host)
    elif layout == "view":
        d = base.reshape(12, 10)[3:9, 2:7]
    elif layout == "strided":
        d = base[5:100:3]
    elif layout == "negative":
        d = base.reshape(10, 12)[::-2, ::-1]
    else:
        d = base.reshape(120)[7:8].reshape(())
    assert d.shape == host.shape and d.strides == host.strides
    h = d.get_ipc_handle()
    assert h.shape == d.shape and h.strides == d.strides
    assert h.dtype == d.dtype
    seen = child.call("read", h)
    np.testing.assert_array_equal(seen, host)
    assert seen.dtype == host.dtype and seen.shape == host.shape
    assert child.call("add", h, 1) is None
    np.testing.assert_array_equal(d.copy_to_host(), host + 1)


def test_view_offset_and_size(ctx):
    a = cuda.device_array(1000, dtype=np.float64)
    h = a[100:300].get_ipc_handle()
    assert h.offset == 800
    assert h.ipc_handle.size == 1600
    whole = a.get_ipc_handle()
    assert whole.offset == 0
    assert bytes(whole.handle) == bytes(h.handle)


def test_record_dtype(ctx, child):
    dt = np.dtype([("a", np.int32), ("b", np.float64, (2,))], align=True)
    host = np.zeros(5, dtype=dt)
    host["a"] = np.arange(5)
    host["b"] = np.arange(10).reshape(5, 2) / 2
    d = cuda.to_device(host)
    seen = child.call("read", d.get_ipc_handle())
    assert seen.dtype == dt
    np.testing.assert_array_equal(seen, host)


def test_open_ipc_array_raw_bytes(ctx, child):
    a = cuda.to_device(np.arange(64, dtype=np.float32))
    raw = bytes(a.get_ipc_handle().handle)
    assert len(raw) == 64
    # Any ndim without strides: C strides (numba assumed 1-D).
    seen = child.call("raw", raw, (4, 8), np.float32, None, 0)
    np.testing.assert_array_equal(seen, np.arange(32).reshape(4, 8))
    # An offset into the allocation, explicit strides, numba's tuple form.
    seen = child.call("raw", tuple(raw), (3, 2), np.float32, (8, 4), 16)
    np.testing.assert_array_equal(seen, [[4, 5], [6, 7], [8, 9]])
    r = child.call("raw", raw, (4, 8), np.float32, (4,), 0)
    expect_failure(r, "ValueError", "strides not match ndim")
    r = child.call("raw", raw[:10], (4,), np.float32, None, 0)
    expect_failure(r, "ValueError", "64 bytes")


def test_open_ipc_array_closes_on_exception(ctx, child):
    a = cuda.to_device(np.arange(8.0))
    r = child.call("raw_raises", bytes(a.get_ipc_handle().handle), (8,),
                   np.float64)
    expect_failure(r, "ValueError", "IPC handle was closed")


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


def test_open_in_exporting_process(ctx):
    a = cuda.to_device(np.arange(4))
    h = a.get_ipc_handle()
    with pytest.raises(ValueError, match="from original process"):
        h.open()
    with pytest.raises(ValueError, match="from original process"):
        h.ipc_handle.open_direct(ctx)
    # Once pickled the base is gone: the driver refuses.
    h2 = pickle.loads(pickle.dumps(h))
    with pytest.raises(cuda.CudaAPIError,
                       match="CUDA_ERROR_INVALID_CONTEXT") as e:
        h2.open()
    assert e.value.name == "CUDA_ERROR_INVALID_CONTEXT"
    # A failed open leaves the handle closed.
    with pytest.raises(ValueError, match="IpcHandle not opened"):
        h2.close()


def test_open_twice(ctx, child):
    a = cuda.to_device(np.arange(10.0))
    h = a.get_ipc_handle()
    expect_failure(child.call("open_twice", h), "ValueError",
                   "IpcHandle is already opened")
    expect_failure(child.call("close_twice", h), "ValueError",
                   "IpcHandle not opened")
    # Two handles of the same memory in one process: the driver counts
    # the opens and returns the same pointer.
    same, values = child.call("two_copies", h)
    assert same
    np.testing.assert_array_equal(values, np.arange(10.0))


def test_unclosed_mapping_is_closed_through_the_queue(ctx, child):
    a = cuda.to_device(np.arange(3.0) + 5)
    first, pending, after = child.call("drop_unclosed", a.get_ipc_handle())
    assert (first, pending, after) == (5.0, 1, 0)


def test_dead_after_close(ctx, child):
    a = cuda.to_device(np.arange(10.0))
    expect_failure(child.call("dead_after_close", a.get_ipc_handle()),
                   "ValueError", "IPC handle was closed")


@pytest.mark.sim
def test_open_after_exporter_freed(ctx, child):
    a = cuda.to_device(np.arange(10.0))
    h = a.get_ipc_handle()
    del a
    h.ipc_handle.base = None
    ctx.memory_manager.reset()
    assert ctx.memory_manager.deallocations.pending_bytes == 0
    expect_failure(child.call("open", h), "CudaAPIError",
                   "CUDA_ERROR_INVALID_VALUE")


def test_handle_from_another_device(ctx, child):
    a = cuda.to_device(np.arange(10.0))
    h = a.get_ipc_handle()
    other = {"pci_domain_id": 0x7777, "pci_bus_id": 0x77,
             "pci_device_id": 7}
    h2 = cuda.IpcArrayHandle(
        cuda.IpcHandle(None, h.handle, h.ipc_handle.size,
                       source_info=other, offset=0), h.array_desc)
    expect_failure(child.call("read", h2), "RuntimeError", "No device of")
    # Without source info there is no peer question to ask.
    bare = cuda.IpcHandle(None, h.handle, 80)
    with pytest.raises(RuntimeError, match="doesn't have source info"):
        bare.can_access_peer(ctx)
    with pytest.raises(RuntimeError, match="No device of"):
        h2.ipc_handle.can_access_peer(ctx)
    assert h.ipc_handle.can_access_peer(ctx)


def test_export_errors(ctx):
    with pytest.raises(ValueError, match="empty array"):
        cuda.device_array(0).get_ipc_handle()
    with pytest.raises(TypeError, match="Context"):
        _core._ipc_export(None, 1)
    with pytest.raises(ValueError, match="NULL"):
        _core._ipc_export(ctx, 0)
    with pytest.raises(cuda.CudaAPIError):
        _core._ipc_export(ctx, 8)
    with pytest.raises(ValueError, match="64 bytes"):
        _core._ipc_open(ctx, b"x" * 10, 8)
    with pytest.raises(TypeError):
        cuda.IpcHandle(None, object(), 8)


# ---------------------------------------------------------------------------
# Pickling
# ---------------------------------------------------------------------------


def test_pickle_round_trip(ctx):
    a = cuda.to_device(np.arange(12, dtype=np.int64).reshape(3, 4))
    h = a[1:].get_ipc_handle()
    ih = h.ipc_handle
    assert ih.base is not None
    assert ih.source_info == ctx.device.get_device_identity()
    assert len(ih.handle.reserved) == 64
    for proto in range(2, pickle.HIGHEST_PROTOCOL + 1):
        ih2 = pickle.loads(pickle.dumps(ih, protocol=proto))
        assert ih2.base is None
        assert bytes(ih2.handle) == bytes(ih.handle)
        assert (ih2.size, ih2.offset, ih2.source_info) == (
            ih.size, ih.offset, ih.source_info)
        h2 = pickle.loads(pickle.dumps(h, protocol=proto))
        assert h2.array_desc == h.array_desc
        assert (h2.shape, h2.strides, h2.dtype, h2.offset) == (
            (2, 4), (32, 8), np.dtype(np.int64), 32)
    assert ih.size == 64 and ih.offset == 32


def test_public_names():
    from cudamem.cudadrv import devicearray, driver

    assert driver.IpcHandle is cuda.IpcHandle
    assert devicearray.IpcArrayHandle is cuda.IpcArrayHandle
    assert "open_ipc_array" in cuda.__all__


# ---------------------------------------------------------------------------
# Memory-manager plugins
# ---------------------------------------------------------------------------


def test_emm_plugin_allocation_exports(ctx, child):
    mm = emm_plugin.CountingManager(context=ctx)
    mp = mm.memalloc(8 * 100)
    arr = cuda.DeviceNDArray((100,), (8,), np.float64, gpu_data=mp)
    arr.copy_to_device(np.arange(100.0))
    view = mp.view(8 * 40)
    ih = mm.get_ipc_handle(view)
    assert ih.offset == 320 and ih.size == 480
    assert ih.base is view
    seen = child.call("ipch_read", ih, np.float64, 60)
    np.testing.assert_array_equal(seen, np.arange(40.0, 100.0))
    # The default manager exports the same way.
    dm = ctx.memory_manager
    ih2 = dm.get_ipc_handle(view)
    assert bytes(ih2.handle) == bytes(ih.handle) and ih2.offset == 320


# ---------------------------------------------------------------------------
# What get_ipc_handle builds: the built-in managers' export is done in C and
# must give what the Python path (the plugin path, _ipc._export_array)
# gives.
# ---------------------------------------------------------------------------

DEVICE_LAYOUTS = {
    "1d": lambda d: d,
    "2d_c": lambda d: d.reshape(6, 20),
    "3d_f": lambda d: cuda.to_device(
        np.asfortranarray(d.copy_to_host().reshape(4, 5, 6))),
    "view": lambda d: d.reshape(12, 10)[3:9, 2:7],
    "strided": lambda d: d[5:100:3],
    "negative": lambda d: d.reshape(10, 12)[::-2, ::-1],
    "reversed": lambda d: d[100:10:-3],
    "0d": lambda d: d.reshape(120)[7:8].reshape(()),
    "broadcast": lambda d: cuda.DeviceNDArray(
        (4, 30), (0, 8), np.float64, gpu_data=d.gpu_data),
}


def _span(d):
    """(offset of the lowest byte from the first element, byte span)."""
    lo = sum((n - 1) * s for n, s in zip(d.shape, d.strides, strict=True)
             if s < 0)
    hi = sum((n - 1) * s for n, s in zip(d.shape, d.strides, strict=True)
             if s > 0)
    return lo, hi - lo + d.dtype.itemsize


def _fields(h):
    ih = h.ipc_handle
    return (type(h), type(ih), type(ih.handle), bytes(ih.handle),
            ih.handle.reserved, ih.size, ih.offset, ih.source_info,
            h.array_desc, h.shape, h.strides, h.dtype, h.offset,
            h.source_info, type(ih.base), ih.base.device_pointer,
            ih.base.size, ih.base.owner, ih.base.context, ih._impl,
            ih.pool, ih.kind)


@pytest.mark.parametrize("layout", sorted(DEVICE_LAYOUTS))
def test_export_matches_the_python_path(ctx, layout):
    whole = cuda.to_device(np.arange(120, dtype=np.float64))
    d = DEVICE_LAYOUTS[layout](whole)
    h = d.get_ipc_handle()
    ref = _ipc._export_array(d)
    assert _fields(h) == _fields(ref)
    lo, span = _span(d)
    low = d.device_ctypes_pointer.value + lo
    alloc = _core._ipc_export(ctx, low)[1]
    ih = h.ipc_handle
    assert (ih.offset, ih.size) == (low - alloc, span)
    assert (ih.base.device_pointer, ih.base.size) == (low, span)
    assert ih.base.owner is d.gpu_data and ih.base.context is ctx
    assert h.array_desc == {"shape": d.shape, "strides": d.strides,
                            "dtype": d.dtype}
    assert list(h.array_desc) == ["shape", "strides", "dtype"]


def test_handle_types_and_fields(ctx):
    a = cuda.to_device(np.arange(100, dtype=np.float64))
    h = a[90:10:-2].get_ipc_handle()
    ih = h.ipc_handle
    assert type(h) is cuda.IpcArrayHandle
    assert type(ih) is cuda.IpcHandle
    assert isinstance(ih.handle, bytes) and len(ih.handle) == 64
    assert type(ih.handle) is _ipc._RawHandle
    assert ih.handle.reserved == bytes(ih.handle)
    assert type(ih.size) is int and type(ih.offset) is int
    # The lowest byte is element 12; the span is 39 steps of 16 bytes.
    assert (ih.offset, ih.size) == (96, 632)
    assert h.offset == 96 and h.shape == (40,) and h.strides == (-16,)
    assert isinstance(ih.base, cuda.MemoryPointer)
    assert ih.base is ih.base and ih.handle is ih.handle
    # source_info: the device's identity, one dict per handle.
    assert ih.source_info == ctx.device.get_device_identity()
    assert type(ih.source_info) is dict
    assert ih.source_info is ih.source_info
    assert h.source_info is ih.source_info
    other = a.get_ipc_handle().ipc_handle
    assert other.source_info is not ih.source_info
    ih.source_info["pci_bus_id"] = -1
    assert ih.source_info["pci_bus_id"] == -1
    assert other.source_info == ctx.device.get_device_identity()
    # The array description: a fresh dict per read.
    assert h.array_desc is not h.array_desc
    h.array_desc["shape"] = None
    assert h.shape == (40,)
    assert ih._impl is None
    assert "size=632 offset=96" in repr(ih)
    assert repr(h).startswith("<IpcArrayHandle shape=(40,) dtype=float64")
    # Attributes stay settable, as on numba's plain objects.
    ih.note = "x"
    h.note = "y"
    assert (ih.note, h.note) == ("x", "y")


def test_python_made_handles(ctx):
    ih = cuda.IpcHandle(None, tuple(range(64)), 8.0)
    assert ih.base is None and ih.source_info is None
    assert (ih.size, ih.offset) == (8, 0) and type(ih.size) is int
    assert ih.handle == bytes(range(64)) and ih._impl is None
    ih.base = "anything"
    ih.offset = 16
    assert (ih.base, ih.offset) == ("anything", 16)
    h = cuda.IpcArrayHandle(ih, {"shape": (2,), "dtype": np.int32})
    assert h.ipc_handle is ih and h.offset == 16
    assert h.array_desc == {"shape": (2,), "dtype": np.int32}
    with pytest.raises(KeyError):
        _ = h.strides
    h2 = pickle.loads(pickle.dumps(h))
    assert h2.array_desc == h.array_desc and h2.ipc_handle.base is None
    assert bytes(h2.handle) == bytes(range(64))


def test_array_handle_of_something_that_is_no_ipc_handle():
    """An IpcArrayHandle over an object that is no IpcHandle (a doctored
    pickle gave one over the rebuild function; found by fuzz_ipc) refuses
    open() and close() with a TypeError naming the type; a duck-typed
    handle of a memory manager still works."""
    desc = {"shape": (10,), "strides": (8,), "dtype": np.dtype("f8")}
    for bad in (len, None, 5, b"x" * 64):
        h = cuda.IpcArrayHandle(bad, desc)
        for call in (h.open, h.close):
            with pytest.raises(TypeError, match="must be an IpcHandle, not "
                               + type(bad).__name__):
                call()
        with pytest.raises(TypeError):
            with h:
                pass

    calls = []

    class Duck:
        def open_array(self, context, **kw):
            calls.append(("open", sorted(kw)))
            return "array"

        def close(self):
            calls.append("close")

    with cuda.IpcArrayHandle(Duck(), desc) as arr:
        assert arr == "array"
    assert calls == [("open", ["dtype", "shape", "strides"]), "close"]


@pytest.mark.parametrize("read_first", [False, True])
def test_pickle_and_copy_of_a_fresh_export(ctx, read_first):
    a = cuda.to_device(np.arange(30, dtype=np.int16).reshape(5, 6))
    h = a[1:, ::2].get_ipc_handle()
    expect = None
    if read_first:
        expect = _fields(h)
    for proto in range(0, pickle.HIGHEST_PROTOCOL + 1):
        h2 = pickle.loads(pickle.dumps(h, protocol=proto))
        assert type(h2) is cuda.IpcArrayHandle
        assert type(h2.ipc_handle) is cuda.IpcHandle
        ih, ih2 = h.ipc_handle, h2.ipc_handle
        assert ih2.base is None and ih2._impl is None
        assert type(ih2.handle) is _ipc._RawHandle
        assert (bytes(ih2.handle), ih2.size, ih2.offset, ih2.source_info) \
            == (bytes(ih.handle), ih.size, ih.offset, ih.source_info)
        assert h2.array_desc == h.array_desc
    c = copy.copy(h)
    assert c.ipc_handle is h.ipc_handle
    d = copy.deepcopy(h)
    assert d.ipc_handle.base is None and d.array_desc == h.array_desc
    if expect is not None:
        assert _fields(h) == expect


def test_array_handle_state(ctx):
    a = cuda.to_device(np.arange(6.0))
    h = a.get_ipc_handle()
    h.note = [1]
    h2 = pickle.loads(pickle.dumps(h))
    assert h2.note == [1] and h2.array_desc == h.array_desc
    # The form that copyreg gives a plain object (older cudamem).
    old = cuda.IpcArrayHandle.__new__(cuda.IpcArrayHandle)
    old.__setstate__({"_array_desc": h.array_desc,
                      "_ipc_handle": h.ipc_handle})
    assert old.ipc_handle is h.ipc_handle and old.shape == (6,)
    bare = cuda.IpcArrayHandle.__new__(cuda.IpcArrayHandle)
    with pytest.raises(AttributeError, match="_ipc_handle"):
        _ = bare.ipc_handle
    with pytest.raises(AttributeError, match="_array_desc"):
        _ = bare.shape
    ih = cuda.IpcHandle.__new__(cuda.IpcHandle)
    for name in ("base", "handle", "size", "source_info", "offset"):
        with pytest.raises(AttributeError, match=name):
            getattr(ih, name)
    assert ih._impl is None


def test_handle_keeps_the_memory_alive(ctx):
    a = cuda.device_array(1000, dtype=np.float32)
    v = a[10:20]
    h = v.get_ipc_handle()
    # numba's base: the view's gpu_data, a pointer to its 40 bytes that
    # holds the allocation
    base = h.ipc_handle.base
    assert base.owner is v.gpu_data
    assert (base.device_pointer, base.size) == (
        a.device_ctypes_pointer.value + 40, 40)
    assert v.gpu_data.owner is a.gpu_data
    h2 = a.get_ipc_handle()
    assert h2.ipc_handle.base.owner is a.gpu_data
    del h2, base, v
    raw = bytes(h.handle)
    ptr = a.device_ctypes_pointer.value
    r = weakref.ref(a.gpu_data)
    del a
    gc.collect()
    # The exporter's memory is still there: the handle holds its owner.
    assert r() is not None
    assert _core._ipc_export(ctx, ptr)[0] == raw
    h2 = pickle.loads(pickle.dumps(h))
    del h
    gc.collect()
    assert r() is None
    assert bytes(h2.handle) == raw


def test_dropping_the_base_lets_the_memory_go(ctx):
    a = cuda.device_array(1000, dtype=np.float32)
    r = weakref.ref(a.gpu_data)
    h = a.get_ipc_handle()
    h.ipc_handle.base = None
    del a
    gc.collect()
    assert r() is None
    assert h.ipc_handle.base is None


def test_cycles_through_handles_are_collected(ctx):
    a = cuda.to_device(np.arange(10.0))
    h = a.get_ipc_handle()
    ih = h.ipc_handle
    ih.base = ih
    ih.source_info = {"h": h}
    refs = [weakref.ref(h), weakref.ref(ih), weakref.ref(a.gpu_data)]
    del h, ih, a
    gc.collect()
    assert [r() for r in refs] == [None, None, None]


def test_export_after_the_context_is_closed():
    # In a child: on a GPU, close() resets the primary context that the
    # other libraries in this process share.
    rc, out = run_py("""
        import numpy as np, cudamem as cuda
        a = cuda.to_device(np.arange(10.0))
        cuda.close()
        try:
            a.get_ipc_handle()
        except ValueError as e:
            print("refused:", "closed or reset" in str(e))
        """)
    assert rc == 0, out
    assert "refused: True" in out


def test_builtin_managers_export_like_the_python_path():
    rc, out = run_py("""
        import numpy as np, cudamem as cuda
        from cudamem import _core, _ipc

        def fields(h):
            ih = h.ipc_handle
            return (bytes(ih.handle), ih.size, ih.offset, ih.source_info,
                    h.array_desc, ih.base.device_pointer, ih.base.size,
                    ih.base.owner, ih.pool, ih.kind)

        for mm in ("default", "pool", "async"):
            cuda.set_memory_manager(mm)
            cuda.close()
            ctx = cuda.current_context()
            x = cuda.device_array(1000)
            y = cuda.device_array(1000)[10:500:7]
            try:
                h = y.get_ipc_handle()
            except cuda.CudaAPIError as e:
                with_python = None
                try:
                    _ipc._export_array(y)
                except cuda.CudaAPIError as e2:
                    with_python = str(e2)
                assert str(e) == with_python, (e, with_python)
                print(mm, "refused", "cannot be shared" in str(e))
                continue
            assert fields(h) == fields(_ipc._export_array(y))
            low = y.device_ctypes_pointer.value
            assert h.ipc_handle.offset == low - _core._ipc_export(ctx, low)[1]
            print(mm, "ok")
        """)
    assert rc == 0, out
    lines = out.split("\n")
    assert "default ok" in lines and "pool ok" in lines, out
    # The async manager's pool is made shareable where the device supports
    # POSIX file-descriptor handles (the simulator does); elsewhere the
    # export says why it cannot be.
    if SIMULATOR:
        assert "async ok" in lines, out
    else:
        assert "async ok" in lines or "async refused True" in lines, out


def test_plugin_get_ipc_handle_is_called():
    rc, out = run_py("""
        import numpy as np, cudamem as cuda
        from helpers import emm_plugin

        seen = []

        class Recording(emm_plugin.CountingManager):
            def get_ipc_handle(self, memory):
                seen.append(memory)
                return super().get_ipc_handle(memory)

        class Custom(emm_plugin.CountingManager):
            def get_ipc_handle(self, memory):
                seen.append(memory)
                return "custom"

        cuda.set_memory_manager(Recording)
        cuda.close()
        ctx = cuda.current_context()
        a = cuda.to_device(np.arange(100, dtype=np.float64))
        v = a[80:20:-4]
        h = v.get_ipc_handle()
        (mem,) = seen
        assert type(mem) is cuda.MemoryPointer, mem
        assert mem.device_pointer == a.device_ctypes_pointer.value + 24 * 8
        assert mem.size == 14 * 32 + 8 and mem.owner is v.gpu_data
        assert mem.context is ctx
        ih = h.ipc_handle
        assert type(h) is cuda.IpcArrayHandle and type(ih) is cuda.IpcHandle
        assert ih.base is mem and (ih.offset, ih.size) == (24 * 8, 456)
        assert h.array_desc == {"shape": (15,), "strides": (-32,),
                                "dtype": np.dtype(np.float64)}

        cuda.set_memory_manager(Custom)
        cuda.close()
        b = cuda.to_device(np.arange(10, dtype=np.float64))
        h = b.get_ipc_handle()
        assert h.ipc_handle == "custom" and len(seen) == 2
        assert h.shape == (10,)
        print("ok")
        """)
    assert rc == 0, out
    assert "ok" in out


# ---------------------------------------------------------------------------
# The async manager: its pool is made with a shareable handle type, and its
# memory exports with cuMemPoolExportPointer; the importer takes the pool's
# file descriptor from the exporter with pidfd_getfd.
# ---------------------------------------------------------------------------


def test_async_exports_in_a_child_process(capsys):
    """On a GPU, close() on the main thread resets the primary context
    that other libraries of the test process share: the async-manager
    tests run in a process of their own there."""
    if SIMULATOR or ISOLATED:
        pytest.skip("already in a process of its own")
    env = dict(os.environ, CUDAMEM_TEST_ISOLATED="1")
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-rs",
                        "-p", "no:cacheprovider", "-k",
                        "test_async_ and not in_a_child", __file__],
                       env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode in (0, 5), p.stdout[-4000:] + p.stderr[-2000:]
    # What the child ran, and why it skipped what it skipped, goes to the
    # terminal (on a GPU the log shows nothing of a child otherwise).
    lines = p.stdout.strip().splitlines()
    skips = sorted({ln.split(": ", 1)[-1] for ln in lines
                    if ln.startswith("SKIPPED")})
    with capsys.disabled():
        print("\nasync-manager IPC tests in a child: %s; skipped: %s"
              % (lines[-1] if lines else "no output",
                 "; ".join(skips) or "none"))


@pytest.fixture
def async_ctx():
    """A fresh context of the async manager whose pool can be shared."""
    if not (SIMULATOR or ISOLATED):
        pytest.skip("runs in its own process on a GPU")
    ctx = use_manager("async")
    try:
        if not ctx.memory_manager.shareable:
            assert not SIMULATOR
            pytest.skip("this device's memory pools cannot be shared "
                        "(no POSIX file-descriptor handles)")
        yield ctx
    finally:
        gc.collect()
        cuda.close()
        cuda.set_memory_manager("default")


def _sim_pool_fds():
    """This process's descriptors of simulated shareable pools."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        n += "cudamem-sim-pool" in link
    return n


def test_async_export_is_a_pool_export(async_ctx):
    a = cuda.to_device(np.arange(100, dtype=np.float64))
    h = a.get_ipc_handle()
    ih = h.ipc_handle
    assert ih.kind == "mempool"
    pid, fd, token = ih.pool
    assert pid == os.getpid()
    assert type(fd) is int and type(token) is int
    os.fstat(fd)                               # open here, for importers
    assert type(ih.handle) is _ipc._RawHandle and len(ih.handle) == 64
    assert (ih.offset, ih.size) == (0, 800)
    assert ih.base.owner is a.gpu_data and ih.base.context is async_ctx
    assert h.array_desc == {"shape": (100,), "strides": (8,),
                            "dtype": np.dtype(np.float64)}
    # One descriptor per pool: every export names the same.
    b = cuda.device_array(10)
    assert b.get_ipc_handle().ipc_handle.pool == ih.pool
    # The plugin path (the manager's get_ipc_handle) gives the same.
    assert _fields(h) == _fields(_ipc._export_array(a))
    assert _ipc._export_array(a).ipc_handle.pool == ih.pool
    ref = async_ctx.memory_manager.get_ipc_handle(a.gpu_data)
    assert ref.pool == ih.pool and bytes(ref.handle) == bytes(ih.handle)
    # A legacy handle says so.
    assert cuda.IpcHandle(None, bytes(64), 8).kind == "ipc"
    assert cuda.IpcHandle(None, bytes(64), 8).pool is None


def test_async_child_reads_and_writes_through_queues(async_ctx):
    a = cuda.to_device(np.arange(100, dtype=np.int32))
    q_in = SPAWN.Queue()
    q_out = SPAWN.Queue()
    p = SPAWN.Process(target=ipc_child.read_and_write, args=(q_in, q_out))
    p.start()
    q_in.put(a.get_ipc_handle())
    seen = q_out.get(timeout=60)
    p.join(60)
    assert p.exitcode == 0
    np.testing.assert_array_equal(seen, np.arange(100))
    cuda.synchronize()
    np.testing.assert_array_equal(a.copy_to_host(), np.arange(100) + 1)


@pytest.mark.parametrize("layout", sorted(DEVICE_LAYOUTS))
def test_async_layouts_round_trip(async_ctx, child, layout):
    whole = cuda.to_device(np.arange(120, dtype=np.float64))
    d = DEVICE_LAYOUTS[layout](whole)
    host = d.copy_to_host()
    h = d.get_ipc_handle()
    assert h.ipc_handle.kind == "mempool"
    assert _fields(h) == _fields(_ipc._export_array(d))
    seen = child.call("read", h)
    np.testing.assert_array_equal(seen, host)
    if layout == "broadcast":
        return                                 # aliased elements
    assert child.call("add", h, 1) is None
    cuda.synchronize()
    np.testing.assert_array_equal(d.copy_to_host(), host + 1)


def test_async_view_offset_and_size(async_ctx, child):
    a = cuda.to_device(np.arange(1000, dtype=np.float64))
    h = a[100:300].get_ipc_handle()
    assert h.offset == 800 and h.ipc_handle.size == 1600
    whole = a.get_ipc_handle()
    assert whole.offset == 0
    assert bytes(whole.handle) == bytes(h.handle)
    seen = child.call("ipch_read", h.ipc_handle, np.float64, 200)
    np.testing.assert_array_equal(seen, np.arange(100, 300))
    # open_ipc_array with an IpcHandle keeps its kind.
    seen = child.call("raw", whole.ipc_handle, (3, 2), np.float64, None,
                      16)
    np.testing.assert_array_equal(seen, [[2, 3], [4, 5], [6, 7]])


def test_async_importer_of_the_async_manager(async_ctx, monkeypatch):
    # The importing process's own manager does not matter.
    monkeypatch.setenv("CUDAMEM_MEMORY_MANAGER", "async")
    a = cuda.to_device(np.arange(50, dtype=np.int64))
    c = Child()
    try:
        seen = c.call("read", a.get_ipc_handle())
        np.testing.assert_array_equal(seen, np.arange(50))
        assert c.call("add", a[10:20].get_ipc_handle(), 5) is None
    finally:
        c.stop()
    cuda.synchronize()
    expect = np.arange(50)
    expect[10:20] += 5
    np.testing.assert_array_equal(a.copy_to_host(), expect)


def test_async_pickle_round_trip(async_ctx):
    a = cuda.to_device(np.arange(12, dtype=np.int64).reshape(3, 4))
    h = a[1:].get_ipc_handle()
    ih = h.ipc_handle
    for proto in range(0, pickle.HIGHEST_PROTOCOL + 1):
        ih2 = pickle.loads(pickle.dumps(ih, protocol=proto))
        assert ih2.base is None and ih2._impl is None
        assert (bytes(ih2.handle), ih2.size, ih2.offset, ih2.source_info,
                ih2.pool, ih2.kind) == (bytes(ih.handle), ih.size,
                                        ih.offset, ih.source_info, ih.pool,
                                        "mempool")
        h2 = pickle.loads(pickle.dumps(h, protocol=proto))
        assert h2.ipc_handle.pool == ih.pool
        assert h2.array_desc == h.array_desc
    d = copy.deepcopy(h)
    assert d.ipc_handle.pool == ih.pool and d.ipc_handle.base is None
    # A handle made in Python carries the pool too.
    ih3 = cuda.IpcHandle(None, ih.handle, ih.size, ih.source_info,
                         ih.offset, pool=ih.pool)
    assert ih3.kind == "mempool"
    assert pickle.loads(pickle.dumps(ih3)).pool == ih.pool
    # A legacy handle pickles as before: no pool argument.
    legacy = cuda.IpcHandle(None, bytes(64), 8)
    assert len(legacy.__reduce__()[1]) == 4


def test_async_open_in_exporting_process(async_ctx):
    a = cuda.to_device(np.arange(4))
    h = a.get_ipc_handle()
    with pytest.raises(ValueError, match="from original process"):
        h.open()
    h2 = pickle.loads(pickle.dumps(h))
    with pytest.raises(ValueError, match="from original process"):
        h2.open()
    with pytest.raises(ValueError, match="IpcHandle not opened"):
        h2.close()
    fds = _sim_pool_fds()
    with pytest.raises(ValueError, match="from original process"):
        _core._ipc_open_pool(async_ctx, h.handle, 32, h.ipc_handle.pool, 0)
    assert _sim_pool_fds() == fds


def test_async_open_twice(async_ctx, child):
    a = cuda.to_device(np.arange(10.0))
    h = a.get_ipc_handle()
    expect_failure(child.call("open_twice", h), "ValueError",
                   "IpcHandle is already opened")
    expect_failure(child.call("close_twice", h), "ValueError",
                   "IpcHandle not opened")
    # Two handles of the same memory in one process: one import, counted.
    same, values = child.call("two_copies", h)
    assert same
    np.testing.assert_array_equal(values, np.arange(10.0))


def test_async_imports_are_given_back(async_ctx, child):
    a = cuda.to_device(np.arange(10.0))
    b = cuda.to_device(np.arange(10.0) * 2)
    before = child.call("fds")
    np.testing.assert_array_equal(child.call("read", a.get_ipc_handle()),
                                  np.arange(10.0))
    np.testing.assert_array_equal(child.call("read", b.get_ipc_handle()),
                                  np.arange(10.0) * 2)
    # The imported pool went with its last pointer.
    assert child.call("fds") == before


def test_async_unclosed_mapping_is_closed_through_the_queue(async_ctx,
                                                            child):
    a = cuda.to_device(np.arange(3.0) + 5)
    before = child.call("fds")
    first, pending, after = child.call("drop_unclosed", a.get_ipc_handle())
    assert (first, pending, after) == (5.0, 1, 0)
    assert child.call("fds") == before


def test_async_dead_after_close(async_ctx, child):
    a = cuda.to_device(np.arange(10.0))
    expect_failure(child.call("dead_after_close", a.get_ipc_handle()),
                   "ValueError", "IPC handle was closed")


@pytest.mark.sim
def test_async_open_after_exporter_freed(async_ctx, child):
    a = cuda.to_device(np.arange(10.0))
    h = a.get_ipc_handle()
    ptr = a.device_ctypes_pointer.value
    del a
    h.ipc_handle.base = None
    gc.collect()
    expect_failure(child.call("open", h), "CudaAPIError",
                   "CUDA_ERROR_INVALID_VALUE")
    # The pool hands the same memory out again: the old handle still
    # names the freed allocation, the new one the new.
    b = cuda.to_device(np.arange(10.0) + 1)
    assert b.device_ctypes_pointer.value == ptr
    expect_failure(child.call("open", h), "CudaAPIError",
                   "CUDA_ERROR_INVALID_VALUE")
    np.testing.assert_array_equal(child.call("read", b.get_ipc_handle()),
                                  np.arange(10.0) + 1)


def test_async_open_after_the_exporter_closed_its_context(async_ctx, child):
    a = cuda.to_device(np.arange(10.0))
    h = a.get_ipc_handle()
    pid, fd, _ = h.ipc_handle.pool
    del a
    h.ipc_handle.base = None
    before = _sim_pool_fds()
    cuda.close()                               # the pool and its fd go
    if SIMULATOR:
        # The simulator's memfd and the descriptor exported from it.
        assert _sim_pool_fds() == before - 2
    expect_failure(child.call("open", h), "OSError",
                   "no longer has the memory pool's file descriptor")


def test_async_open_after_the_exporter_exited(async_ctx, child):
    rc, out = run_py("""
        import pickle, numpy as np, cudamem as cuda
        a = cuda.to_device(np.arange(6.0))
        print(pickle.dumps(a.get_ipc_handle()).hex())
        """, CUDAMEM_MEMORY_MANAGER="async")
    assert rc == 0, out
    h = pickle.loads(bytes.fromhex(out.split()[-1]))
    assert h.ipc_handle.kind == "mempool"
    expect_failure(child.call("open", h), "ProcessLookupError",
                   "has exited")


@pytest.mark.parametrize("way", ["auto", "pidfd", "socket", "tampered",
                                 "bogus"])
def test_async_open_without_ptrace_permission(async_ctx, monkeypatch, way):
    """pidfd_getfd needs ptrace access to the exporter: a process that
    is not dumpable refuses an importer without CAP_SYS_PTRACE.  The
    importer then asks the exporter's socket, which hands the pool's
    descriptor to a process of the same user ("auto", the default, and
    "socket"); with CUDAMEM_IPC_FD=pidfd the refusal stands, saying why.
    The socket hands over only what was exported: a handle whose token
    does not match gets nothing.  Another value of CUDAMEM_IPC_FD is a
    ValueError naming it."""
    if os.geteuid() != 0:
        pytest.skip("needs root (to drop CAP_SYS_PTRACE in the child)")
    code = """
        import ctypes, pickle, sys, numpy as np, cudamem as cuda
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)    # PR_SET_DUMPABLE 0
        a = cuda.to_device(np.arange(6.0))
        print(pickle.dumps(a.get_ipc_handle()).hex(), flush=True)
        sys.stdin.readline()
        """
    env = dict(os.environ, CUDAMEM_MEMORY_MANAGER="async",
               PYTHONPATH=os.pathsep.join(
                   [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)],
                         env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    monkeypatch.setenv("CUDAMEM_IPC_FD",
                       "socket" if way == "tampered" else way)
    c = Child()
    try:
        h = pickle.loads(bytes.fromhex(p.stdout.readline().strip()))
        assert c.call("drop_ptrace") is None
        if way == "tampered":
            ih = h.ipc_handle
            pid, fd, token = ih.pool
            ih.pool = (pid, fd, token ^ 1)
        r = c.call("read", h)
        if way in ("auto", "socket"):
            np.testing.assert_array_equal(r, np.arange(6.0))
        elif way == "pidfd":
            expect_failure(r, "PermissionError", "pidfd_getfd")
            assert "ptrace" in r.message
        elif way == "bogus":
            expect_failure(r, "ValueError", "CUDAMEM_IPC_FD")
        else:
            expect_failure(r, "OSError", "no longer has the memory pool")
    finally:
        c.stop()
        p.communicate("\n", timeout=60)
    assert p.returncode == 0


def test_async_handle_from_another_device(async_ctx, child):
    a = cuda.to_device(np.arange(10.0))
    h = a.get_ipc_handle()
    ih = h.ipc_handle
    other = {"pci_domain_id": 0x7777, "pci_bus_id": 0x77,
             "pci_device_id": 7}
    h2 = cuda.IpcArrayHandle(
        cuda.IpcHandle(None, ih.handle, ih.size, source_info=other,
                       offset=0, pool=ih.pool), h.array_desc)
    expect_failure(child.call("read", h2), "RuntimeError", "No device of")


def test_async_bad_pool_handles(async_ctx, child):
    a = cuda.to_device(np.arange(10.0))
    h = a.get_ipc_handle()
    ih = h.ipc_handle
    pid, fd, token = ih.pool

    def with_pool(pool):
        return cuda.IpcArrayHandle(
            cuda.IpcHandle(None, ih.handle, ih.size, ih.source_info,
                           pool=pool), h.array_desc)

    # A descriptor the exporter does not have.
    expect_failure(child.call("open", with_pool((pid, 1 << 20, token))),
                   "OSError", "no longer has the memory pool's file "
                   "descriptor")
    # One that is not a memory pool's.
    expect_failure(child.call("open", with_pool((pid, 0, token))),
                   "CudaAPIError", "cuMemPoolImportFromShareableHandle")
    with pytest.raises(TypeError, match="pool"):
        cuda.IpcHandle(None, ih.handle, 8, pool=(1, 2))
    with pytest.raises(TypeError, match="pool"):
        cuda.IpcHandle(None, ih.handle, 8, pool="x")
    with pytest.raises(ValueError, match="64 bytes"):
        _core._ipc_open_pool(async_ctx, b"x" * 10, 8, ih.pool, 0)
    with pytest.raises(TypeError):
        _core._ipc_open_pool(async_ctx, ih.handle, 8, None, 0)
    with pytest.raises(TypeError, match="Context"):
        _core._ipc_open_pool(None, ih.handle, 8, ih.pool, 0)


@pytest.mark.sim
@pytest.mark.parametrize("entry", ["MemPoolImportFromShareableHandle",
                                   "MemPoolImportPointer"])
def test_async_failed_import_leaks_nothing(async_ctx, child, entry):
    a = cuda.to_device(np.arange(10.0))
    h = a.get_ipc_handle()
    err, before, after = child.call("open_failing", h, entry, 1, 1)
    assert err is not None and err[0] == "CudaAPIError", err
    assert "cu" + entry in err[1] and "CUDA_ERROR_INVALID_VALUE" in err[1]
    assert after == before
    # And the next open works.
    np.testing.assert_array_equal(child.call("read", h), np.arange(10.0))


@pytest.mark.sim
@pytest.mark.parametrize("entry", ["MemPoolExportToShareableHandle",
                                   "MemPoolExportPointer"])
def test_async_failed_export(async_ctx, child, entry):
    a = cuda.to_device(np.arange(10.0))
    for export in (a.get_ipc_handle, lambda: _ipc._export_array(a)):
        _core._sim_inject(entry, 1, 999)
        try:
            with pytest.raises(cuda.CudaAPIError, match="cu" + entry):
                export()
        finally:
            _core._sim_inject(entry, 0, 0)
    h = a.get_ipc_handle()
    np.testing.assert_array_equal(child.call("read", h), np.arange(10.0))


@pytest.mark.sim
def test_async_export_asks_which_pool_only_on_the_plugin_path(async_ctx):
    # The built-in export knows its memory's pool; _ipc_export (the
    # plugin path, given only an address) asks the driver.
    a = cuda.to_device(np.arange(10.0))
    _core._sim_inject("PointerGetAttribute", 1, 999)
    try:
        assert a.get_ipc_handle().ipc_handle.kind == "mempool"
    finally:
        _core._sim_inject("PointerGetAttribute", 0, 0)
    assert _ipc._export_array(a).ipc_handle.kind == "mempool"


@pytest.mark.sim
def test_async_pool_that_cannot_be_shared(child):
    # The device cannot make a pool with a shareable handle type: the
    # manager uses the device's default pool, and exports say why not.
    _core._sim_inject("MemPoolCreate", 1, 801)    # NOT_SUPPORTED
    try:
        ctx = use_manager("async")
    finally:
        _core._sim_inject("MemPoolCreate", 0, 0)
    try:
        assert not ctx.memory_manager.shareable
        a = cuda.to_device(np.arange(10.0))
        np.testing.assert_array_equal(a.copy_to_host(), np.arange(10.0))
        with pytest.raises(cuda.CudaAPIError, match="cannot be shared") as e:
            a.get_ipc_handle()
        with pytest.raises(cuda.CudaAPIError) as e2:
            _ipc._export_array(a)
        assert str(e.value) == str(e2.value)
        assert e.value.code == 801
    finally:
        gc.collect()
        cuda.close()
        cuda.set_memory_manager("default")


@pytest.mark.sim
def test_async_pool_creation_failure_is_raised():
    _core._sim_inject("MemPoolCreate", 1, 2)      # OUT_OF_MEMORY
    try:
        with pytest.raises(cuda.CudaAPIError, match="cuMemPoolCreate"):
            use_manager("async")
    finally:
        _core._sim_inject("MemPoolCreate", 0, 0)
        cuda.close()
        cuda.set_memory_manager("default")


def test_async_pool_fd_goes_with_the_context():
    if not SIMULATOR:
        pytest.skip("counts the simulator's pool descriptors")
    before = _sim_pool_fds()
    ctx = use_manager("async")
    try:
        a = cuda.device_array(100)
        a.get_ipc_handle()
        assert _sim_pool_fds() >= before + 1
    finally:
        cuda.close()
        cuda.set_memory_manager("default")
    del ctx, a
    gc.collect()
    assert _sim_pool_fds() == before


@pytest.mark.multi_gpu
@pytest.mark.parametrize("no_peer", [False, True])
def test_async_open_on_another_device(async_ctx, monkeypatch, no_peer):
    how, dldev = open_on_device_1(monkeypatch, no_peer, SIMULATOR)
    assert dldev == (2, 1)


@pytest.mark.sim
@pytest.mark.multi_gpu
def test_async_open_on_a_peer_gives_it_access(async_ctx):
    # Opened on device 1, the imported pool of device 0 is made usable
    # there (cuMemPoolSetAccess); a refusal surfaces, and leaks nothing.
    if len(cuda.gpus) < 2:
        pytest.skip("needs 2 devices")
    a = cuda.to_device(np.arange(16, dtype=np.float32))
    ih = a.get_ipc_handle().ipc_handle
    c = Child()
    try:
        before = c.call("fds")
        assert c.call("inject", "MemPoolSetAccess", 1, 1) is None
        r = c.call("open_on_device", ih, np.float32, 16, 1)
        expect_failure(r, "CudaAPIError", "cuMemPoolSetAccess")
        assert c.call("fds") == before
        how, _, values, _ = c.call("open_on_device", ih, np.float32, 16, 1)
        assert how == "_DirectOpen"
        np.testing.assert_array_equal(values, np.arange(16))
        assert c.call("fds") == before
    finally:
        c.stop()
