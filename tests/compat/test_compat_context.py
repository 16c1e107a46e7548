# SPDX-License-Identifier: MIT
"""numba's Context object: its allocation, stream, event and IPC methods
and the memory objects they return."""

import ctypes
import gc

import numpy as np
import pytest

CONTEXT_METHODS = [
    "memalloc", "memhostalloc", "mempin", "memallocmanaged",
    "get_ipc_handle", "open_ipc_handle", "create_stream",
    "create_external_stream", "create_event", "get_default_stream",
    "get_legacy_default_stream", "get_per_thread_default_stream", "push",
    "pop", "reset", "synchronize", "get_memory_info", "can_access_peer",
    "enable_peer_access", "defer_cleanup", "prepare_for_use",
]


@pytest.mark.parametrize("name", CONTEXT_METHODS)
def test_context_has_method(context, name):
    assert callable(getattr(context, name))


def test_context_attributes(context):
    assert context.device.id == 0
    assert context.memory_manager is not None
    assert len(context.allocations) >= 0
    assert context.deallocations is not None
    assert repr(context).startswith("<CUDA context ")
    assert repr(context).endswith(" of device 0>")


def test_push_pop(cuda, context):
    context.push()
    context.pop()
    assert cuda.current_context() == context


def _is_device_memory(driver, obj):
    assert driver.is_device_memory(obj)
    driver.require_device_memory(obj)
    assert isinstance(obj.device_ctypes_pointer, ctypes.c_size_t)


def test_memalloc_pointer_interface(driver, context):
    m = context.memalloc(1024)
    _is_device_memory(driver, m)
    assert m.size == 1024
    assert m.is_managed
    assert m.refct == 1
    assert m.device_pointer_value == int(m.handle) != 0
    assert m.device_ctypes_pointer.value == m.device_pointer_value
    assert int(m.owner.handle) == int(m.handle)


def test_memalloc_view_counts_holders(driver, context):
    m = context.memalloc(1024)
    for offset in (0, 1):
        v1 = m.view(offset)
        _is_device_memory(driver, v1)
        assert int(v1.owner.handle) == int(m.handle)
        assert int(v1.handle) - offset == int(m.handle)
        assert m.refct == 2
        v2 = v1.view(offset)
        assert int(v2.owner.handle) == int(m.handle)
        assert int(v2.handle) - 2 * offset == int(m.handle)
        assert m.refct == 3
        del v2
        assert m.refct == 2
        del v1
        assert m.refct == 1


def test_view_sizes(context):
    m = context.memalloc(100)
    assert m.view(10).size == 90
    assert m.view(10, 30).size == 20
    assert m.view(100).size == 0


def test_view_negative_size(context):
    m = context.memalloc(100)
    with pytest.raises(RuntimeError, match="size cannot be negative"):
        m.view(50, 10)


def test_view_of_null_pointer(driver, context):
    p = driver.MemoryPointer(context, 0, 0)
    assert p.device_pointer_value is None
    with pytest.raises(RuntimeError, match="non-empty slice into empty"):
        p.view(0, 8)
    assert p.view(0).size == 0


@pytest.mark.cudamem_only("a view past the end raises ValueError; numba "
                          "makes the pointer")
def test_view_out_of_range(context):
    m = context.memalloc(100)
    with pytest.raises(ValueError):
        m.view(50, 101)


def test_memset(driver, cuda, context):
    m = context.memalloc(64)
    m.memset(0xAB)
    out = np.zeros(64, np.uint8)
    driver.device_to_host(out, m, 64)
    assert (out == 0xAB).all()
    s = cuda.stream()
    m.memset(1, count=16, stream=s)
    s.synchronize()
    driver.device_to_host(out, m, 64)
    assert (out[:16] == 1).all() and (out[16:] == 0xAB).all()


def test_user_pointer_finalizer(driver, context):
    called = []
    p = driver.MemoryPointer(context=context,
                             pointer=ctypes.c_void_p(0xDEADBEEF), size=40,
                             finalizer=lambda: called.append(1))
    assert p.device_pointer_value == 0xDEADBEEF
    assert p.refct == 1 and p.is_managed and p.owner is p
    owned = p.own()
    assert p.refct == 2
    del owned
    gc.collect()
    assert called == [] and p.refct == 1   # only the object's death frees
    del p
    gc.collect()
    assert called == [1]


def test_user_pointer_free_twice(driver, context):
    called = []
    p = driver.MemoryPointer(context, 0xDEADBEEF, 40,
                             finalizer=lambda: called.append(1))
    p.free()
    assert called == [1]
    with pytest.raises(RuntimeError, match="Freeing dead memory"):
        p.free()


def test_autofree_pointer_frees_with_last_holder(driver, context):
    called = []
    p = driver.AutoFreePointer(context, 0xDEADBEEF, 40,
                               finalizer=lambda: called.append(1))
    assert p.refct == 0
    owned = p.own()
    assert p.refct == 1
    del owned
    gc.collect()
    assert called == [1]


def test_memhostalloc_pinned(driver, context):
    p = context.memhostalloc(1024)
    assert isinstance(p, driver.PinnedMemory)
    assert not driver.is_device_memory(p)
    assert p.size == 1024
    assert p.own() is p
    assert memoryview(p).nbytes == 1024
    a = np.ndarray(256, np.uint32, buffer=p)
    a[:] = np.arange(256)
    assert a.ctypes.data == int(p.host_pointer) == int(p.handle)
    assert (np.frombuffer(p, np.uint32) == np.arange(256)).all()


def test_memhostalloc_mapped(driver, context):
    m = context.memhostalloc(1024, mapped=True)
    _is_device_memory(driver, m)
    assert m.size == 1024
    assert int(m.handle) == int(m.host_pointer)
    a = np.ndarray(1024, np.uint8, buffer=m)
    assert a.ctypes.data == int(m.host_pointer)
    a[:] = 7
    out = np.zeros(1024, np.uint8)
    driver.device_to_host(out, m, 1024)
    assert (out == 7).all()


def test_memhostalloc_flags(context):
    p = context.memhostalloc(64, portable=True)
    w = context.memhostalloc(64, mapped=True, portable=True, wc=True)
    assert memoryview(p).nbytes == 64 and memoryview(w).nbytes == 64


def test_mempin(driver, context):
    ary = np.arange(10)
    m = context.mempin(ary, ary.ctypes.data, ary.nbytes, mapped=True)
    _is_device_memory(driver, m)
    out = np.zeros(10, np.int64)
    driver.device_to_host(out, m, ary.nbytes)
    assert (out == ary).all()
    del m
    p = context.mempin(ary, ary.ctypes.data, ary.nbytes)
    assert isinstance(p, driver.PinnedMemory)
    assert p.owned is ary
    assert not driver.is_device_memory(p)


def test_memallocmanaged(driver, context):
    m = context.memallocmanaged(1024)
    _is_device_memory(driver, m)
    a = np.ndarray(128, np.int64, buffer=m)
    a[:] = np.arange(128)
    out = np.zeros(128, np.int64)
    driver.device_to_host(out, m, 1024)
    assert (out == np.arange(128)).all()
    h = context.memallocmanaged(64, attach_global=False)
    assert memoryview(h).nbytes == 64


def test_create_stream_and_event(driver, context):
    s = context.create_stream()
    assert isinstance(s, driver.Stream)
    assert int(s.handle) != 0
    e = context.create_event(timing=True)
    assert isinstance(e, driver.Event)
    e.record(s)
    e.synchronize()
    assert e.query()
    e2 = context.create_event(timing=False)
    e2.record(s)
    s.synchronize()
    e3 = context.create_event()
    e3.record(s)
    e3.synchronize()
    assert e.elapsed_time(e3) >= 0


def test_default_streams(driver, context):
    for fn, handle in ((context.get_default_stream, 0),
                       (context.get_legacy_default_stream, 1),
                       (context.get_per_thread_default_stream, 2)):
        s = fn()
        assert isinstance(s, driver.Stream)
        assert int(s.handle or 0) == handle
        s.synchronize()


def test_external_stream(driver, context):
    s = context.create_stream()
    e = context.create_external_stream(int(s.handle))
    assert isinstance(e, driver.Stream)
    assert int(e.handle) == int(s.handle)
    e.synchronize()
    with pytest.raises(TypeError, match="must be an int"):
        context.create_external_stream("0")


def test_get_ipc_handle(driver, context):
    m = context.memalloc(256)
    h = context.get_ipc_handle(m)
    assert isinstance(h, driver.IpcHandle)
    assert h.size == 256


def test_get_ipc_handle_of_a_view(cuda, driver, context):
    # numba's view: gpu_data points at the view's own bytes, so the handle
    # says how many and where they start in the allocation
    d = cuda.to_device(np.arange(10, dtype=np.float64))
    mem = d[2:].gpu_data
    assert mem.size == 64
    assert mem.device_pointer_value == d.device_ctypes_pointer.value + 16
    h = context.get_ipc_handle(mem)
    assert isinstance(h, driver.IpcHandle)
    assert (h.size, h.offset) == (64, 16)
    h = context.get_ipc_handle(d[3:7].gpu_data)
    assert (h.size, h.offset) == (32, 24)


@pytest.mark.cudamem_only("numba's out-of-memory error names only the "
                          "driver call and its error code")
def test_out_of_memory_names_free_and_total(context):
    total = context.get_memory_info().total
    with pytest.raises(MemoryError) as info:
        context.memalloc(total * 4)
    err = info.value
    assert err.total == total and err.requested == total * 4
    assert " of %d bytes free" % total in str(err)
