# SPDX-License-Identifier: MIT
"""Several devices in one process: device selection, per-device contexts
and memory managers, arrays that remember their device, copies between
devices (peer or staged through the host), peer access, and IPC handles
opened on another device than the exporter's.

Every test needs two or more devices and is skipped otherwise; on the
simulator run ``CUDAMEM_SIM_DEVICES=2 python -m pytest`` (or pass
``--sim-devices=2``).  The same tests run unchanged on a real multi-GPU
machine.  Tests that need a pair of devices without peer access force it
in a child process with ``CUDAMEM_SIM_NO_PEER`` (simulator only).
"""

import sys
import threading

import numpy as np
import pytest

import cudamem as cuda
from cudamem import _core
from helpers import run_child

pytestmark = pytest.mark.multi_gpu



@pytest.fixture
def ndev(ctx):
    """The device count; the thread's current device is the same after the
    test as before it."""
    before = _core._current_device_id()
    yield len(cuda.gpus)
    assert _core._current_device_id() == before
    # Leave no queued frees behind for tests that count them.
    import gc

    gc.collect()
    for i in range(len(cuda.gpus)):
        with cuda.gpus[i]:
            c = cuda.current_context()
            c.memory_manager.deallocations.clear()
            c.deallocations.clear()


def on(dev, fn, *args):
    """fn(*args) with device dev's context pushed."""
    with cuda.gpus[dev]:
        return fn(*args)


def dl_device(arr):
    """The device ordinal an array says its memory is on."""
    kind, dev = arr.__dlpack_device__()
    assert kind == 2
    return dev


# ---------------------------------------------------------------------------
# Devices and contexts
# ---------------------------------------------------------------------------


def test_each_device_has_its_own_context_and_manager(ndev):
    ctxs = [on(i, _core.current_context) for i in range(ndev)]
    assert [c.device.id for c in ctxs] == list(range(ndev))
    assert len({c.handle for c in ctxs}) == ndev
    assert len({id(c.memory_manager) for c in ctxs}) == ndev
    assert len({id(c.deallocations) for c in ctxs}) == ndev
    assert len({id(c._memory_deallocations) for c in ctxs}) == ndev
    # The same Context object every time for a device.
    for i, c in enumerate(ctxs):
        assert on(i, _core.current_context) is c
        assert "of device %d" % i in repr(c)


def test_with_gpus_nests_and_restores(ndev):
    cuda.current_context()
    with cuda.gpus[1]:
        assert cuda.gpus.current.id == 1
        assert cuda.get_current_device().id == 1
        with cuda.gpus[0]:
            assert cuda.get_current_device().id == 0
        assert cuda.current_context().device.id == 1
    assert cuda.get_current_device().id == 0


def test_current_context_devnum_pushes(ndev):
    cuda.current_context()
    c = cuda.current_context(ndev - 1)
    try:
        assert c.device.id == ndev - 1
        assert cuda.current_context() is c
    finally:
        c.pop()
    assert cuda.get_current_device().id == 0


def test_allocations_are_charged_to_their_device(ndev):
    c0 = on(0, cuda.current_context)
    c1 = on(1, cuda.current_context)
    free0 = c0.get_memory_info().free
    free1 = c1.get_memory_info().free
    a = on(1, cuda.device_array, 1 << 20, np.uint8)
    assert c1.get_memory_info().free <= free1 - (1 << 20)
    assert c0.get_memory_info().free == free0
    del a


def test_threads_each_on_their_own_device(ndev):
    errors = []
    seen = {}

    def work(i):
        try:
            dev = i % ndev
            cuda.select_device(dev)
            a = cuda.to_device(np.full(100, i, np.int32))
            seen[i] = (cuda.get_current_device().id, dl_device(a),
                       int(a.copy_to_host().sum()))
            cuda.close()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,))
               for i in range(2 * ndev)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i, (cur, dev, total) in seen.items():
        assert cur == dev == i % ndev
        assert total == 100 * i


def test_device_reset_spares_the_other_devices(ndev):
    a0 = on(0, cuda.to_device, np.arange(5.0))
    a1 = on(1, cuda.to_device, np.arange(5.0))
    old1 = on(1, cuda.current_context)
    cuda.gpus[1].reset()
    assert np.array_equal(a0.copy_to_host(), np.arange(5.0))
    with pytest.raises(ValueError, match="device 1 was closed or reset"):
        a1.copy_to_host()
    new1 = on(1, cuda.current_context)
    assert new1 is not old1
    assert new1.memory_manager is not old1.memory_manager
    b1 = on(1, cuda.to_device, np.arange(3.0))
    assert dl_device(b1) == 1
    assert np.array_equal(b1.copy_to_host(), np.arange(3.0))


def test_thread_keeps_its_device_across_another_threads_reset(ndev):
    """A thread with device 1 current, whose context the main thread
    resets: its next call gets device 1's fresh context (the driver keeps
    the primary context's handle across a reset, so the thread still has
    it current), not device 0's."""
    ready = threading.Event()
    go = threading.Event()
    out = {}

    def work():
        try:
            cuda.select_device(1)
            old = cuda.current_context()
            cuda.stream().synchronize()
            ready.set()
            go.wait(30)
            s = cuda.stream()
            d = cuda.to_device(np.arange(4.0), stream=s)
            out["dev"] = cuda.current_context().device.id
            out["fresh"] = cuda.current_context() is not old
            out["array_dev"] = dl_device(d)
            out["values"] = d.copy_to_host(stream=s).tolist()
            cuda.close()
        except BaseException as e:  # noqa: BLE001 - reported below
            out["error"] = e
            ready.set()

    t = threading.Thread(target=work)
    t.start()
    assert ready.wait(30)
    cuda.gpus[1].reset()
    go.set()
    t.join(60)
    assert "error" not in out, out
    assert out == {"dev": 1, "fresh": True, "array_dev": 1,
                   "values": [0.0, 1.0, 2.0, 3.0]}


def test_close_resets_every_device():
    run_child("""
        import numpy as np, cudamem as cuda
        from cudamem import _core
        cuda.select_device(1)
        a = cuda.to_device(np.arange(4.0))
        olds = [cuda.current_context(i) for i in range(len(cuda.gpus))]
        cuda.close()
        assert _core._current_device_id() is None
        try:
            a.copy_to_host()
        except ValueError as e:
            assert "device 1" in str(e)
        else:
            raise AssertionError("a dead array worked")
        for i, old in enumerate(olds):
            with cuda.gpus[i]:
                new = cuda.current_context()
                assert new is not old
                assert new.memory_manager is not old.memory_manager
        assert cuda.get_current_device().id == 0
        print("ok")
    """)


# ---------------------------------------------------------------------------
# Arrays remember their device
# ---------------------------------------------------------------------------


def test_arrays_and_views_remember_their_device(ndev):
    cuda.current_context()
    host = np.arange(24.0).reshape(4, 6)
    a = on(1, cuda.to_device, host)
    assert dl_device(a) == 1
    # Operations use the array's context; the thread's stays device 0's.
    assert np.array_equal(a.copy_to_host(), host)
    assert cuda.get_current_device().id == 0
    for v in (a[1:], a[:, ::2], a.T, a.reshape(6, 4), a.view(np.int64),
              a.bind(0), cuda.as_cuda_array(a),
              cuda.from_cuda_array_interface(a.__cuda_array_interface__)):
        assert dl_device(v) == 1
    a[0, 0] = 99.0
    assert a[0, 0] == 99.0
    a.copy_to_device(host)
    assert np.array_equal(np.asarray(a[:, ::2]), host[:, ::2])
    assert np.array_equal(a.T.copy_to_host(), host.T)
    assert cuda.get_current_device().id == 0


def test_array_made_inside_with_works_outside(ndev):
    with cuda.gpus[1]:
        s = cuda.stream()
        a = cuda.device_array(1000, np.float32, stream=s)
    ones = np.ones(1000, np.float32)    # alive until the copy ran
    a.copy_to_device(ones)
    out = a.copy_to_host()
    s.synchronize()
    assert out.sum() == 1000


# ---------------------------------------------------------------------------
# Copies between devices
# ---------------------------------------------------------------------------

LAYOUTS = {
    "contiguous": lambda a: a,
    "fortran": lambda a: np.asfortranarray(a),
    "strided": lambda a: a[:, ::2],
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("asynchronous", [False, True])
def test_copy_between_devices(ndev, layout, asynchronous):
    full = np.arange(48.0).reshape(6, 8)
    host = LAYOUTS[layout](full)
    if layout == "strided":
        src = on(0, cuda.to_device, full)[:, ::2]
    else:
        src = on(0, cuda.to_device, host)
    dst = on(1, cuda.device_array_like, host)
    stream = on(1, cuda.stream) if asynchronous else 0
    dst.copy_to_device(src, stream=stream)
    if asynchronous:
        stream.synchronize()
    assert np.array_equal(dst.copy_to_host(), host)
    # And back, from device 1 to device 0.
    back = on(0, cuda.device_array_like, host)
    back.copy_to_device(dst)
    assert np.array_equal(back.copy_to_host(), host)
    assert dl_device(back) == 0 and dl_device(dst) == 1


def test_copy_from_a_cai_object_of_another_device(ndev):
    class Foreign:
        def __init__(self, arr):
            self.arr = arr
            self.__cuda_array_interface__ = arr.__cuda_array_interface__

    src = on(1, cuda.to_device, np.arange(10, dtype=np.int16))
    dst = on(0, cuda.device_array, 10, np.int16)
    dst.copy_to_device(Foreign(src))
    assert np.array_equal(dst.copy_to_host(), np.arange(10))


def test_copy_between_devices_checks_shape_and_dtype(ndev):
    src = on(0, cuda.to_device, np.arange(10.0))
    with pytest.raises(TypeError):
        on(1, cuda.device_array, 10, np.float32).copy_to_device(src)
    with pytest.raises(ValueError):
        on(1, cuda.device_array, 9).copy_to_device(src)
    on(1, cuda.device_array, 0).copy_to_device(src[:0])


def test_peer_access_functions(ndev):
    can = cuda.can_access_peer(0, 1)
    assert isinstance(can, bool)
    assert cuda.can_access_peer(1, 1) is True
    c0 = on(0, cuda.current_context)
    c1 = on(1, cuda.current_context)
    assert c0.can_access_peer(1) is can
    assert c0.can_access_peer(cuda.gpus[1]._device) is can
    with pytest.raises(IndexError):
        cuda.can_access_peer(0, ndev)
    with pytest.raises(ValueError, match="own device"):
        c0.enable_peer_access(c0)
    with pytest.raises(ValueError, match="flags"):
        c0.enable_peer_access(c1, 1)
    if can:
        c0.enable_peer_access(c1)
        c0.enable_peer_access(c1)       # once per pair; again is a no-op
        cuda.enable_peer_access(0, 1)
        cuda.enable_peer_access(1, 1)
    else:
        with pytest.raises(ValueError, match="device 0 .*device 1"):
            c0.enable_peer_access(c1)


def test_kernel_argument_of_another_device(ndev, simulator):
    k = on(0, cuda.compile,
           'extern "C" __global__ void f(float *x) { x[0] = 1; }').f
    a = on(1, cuda.device_array, 4, np.float32)
    if simulator:
        # Peer access is enabled on first need; then the simulator
        # refuses the launch itself.
        with pytest.raises(cuda.CudaSupportError):
            k[1, 1](a)
    else:
        if not cuda.can_access_peer(0, 1):
            pytest.skip("devices 0 and 1 have no peer access")
        k[1, 1](a)
        cuda.synchronize()
        assert a.copy_to_host()[0] == 1


# ---------------------------------------------------------------------------
# Without peer access (simulator: CUDAMEM_SIM_NO_PEER)
# ---------------------------------------------------------------------------


@pytest.mark.sim
def test_without_peer_access_copies_are_staged():
    out = run_child("""
        import numpy as np, cudamem as cuda
        assert not cuda.can_access_peer(0, 1)
        assert cuda.can_access_peer(1, 0) is False
        host = np.arange(48.0).reshape(6, 8)
        src = cuda.to_device(host)
        with cuda.gpus[1]:
            dst = cuda.device_array_like(host)
            s = cuda.stream()
            strided = cuda.device_array((6, 4))
        dst.copy_to_device(src)
        assert np.array_equal(dst.copy_to_host(), host)
        dst.copy_to_device(src, stream=s)
        s.synchronize()
        assert np.array_equal(dst.copy_to_host(), host)
        strided.copy_to_device(src[:, ::2])
        assert np.array_equal(strided.copy_to_host(), host[:, ::2])
        back = cuda.device_array((6, 8))
        back[:, ::2].copy_to_device(strided)
        assert np.array_equal(back.copy_to_host()[:, ::2], host[:, ::2])
        c0 = cuda.current_context()
        try:
            c0.enable_peer_access(1)
        except ValueError as e:
            assert "device 0" in str(e) and "device 1" in str(e), e
        else:
            raise AssertionError("enable_peer_access worked")
        k = cuda.compile('extern "C" __global__ void f(float *x) {}').f
        try:
            k[1, 1](dst)
        except ValueError as e:
            msg = str(e)
            assert "kernel argument 0" in msg, msg
            assert "device 1" in msg and "device 0" in msg, msg
        except cuda.CudaSupportError as e:
            if "NVRTC" not in str(e) and "nvrtc" not in str(e):
                raise
        else:
            raise AssertionError("a launch with another device's array")
        assert cuda.get_current_device().id == 0
        print("ok")
    """, env=dict(CUDAMEM_SIM_NO_PEER="0-1")).stdout
    assert out.strip() == "ok"


@pytest.mark.sim
def test_simulator_peer_hook_parses_pairs():
    out = run_child("""
        import cudamem as cuda
        n = len(cuda.gpus)
        print([[cuda.can_access_peer(a, b) for b in range(n)]
               for a in range(n)])
    """, env=dict(CUDAMEM_SIM_DEVICES="3",
                  CUDAMEM_SIM_NO_PEER="2-0")).stdout
    assert out.strip() == str([[True, True, False], [True, True, True],
                               [False, True, True]])


# ---------------------------------------------------------------------------
# IPC across devices
# ---------------------------------------------------------------------------


def _ipc_roundtrip(monkeypatch, no_peer):
    from test_ipc import Child

    if no_peer:
        monkeypatch.setenv("CUDAMEM_SIM_NO_PEER", "0-1")
    a = on(0, cuda.to_device, np.arange(16, dtype=np.float32))
    h = a.get_ipc_handle()
    child = Child()
    try:
        r = child.call("open_on_device", h.ipc_handle, np.float32, 16, 1)
    finally:
        child.stop()
    assert not hasattr(r, "message"), r
    how, dldev, values, cur = r
    assert np.array_equal(values, np.arange(16, dtype=np.float32))
    assert tuple(dldev) == (2, 1)
    assert cur == 0
    return how


@pytest.mark.skipif(sys.platform != "linux", reason="IPC needs Linux")
def test_ipc_open_on_another_device_with_peer_access(ndev, monkeypatch):
    how = _ipc_roundtrip(monkeypatch, no_peer=False)
    expected = "_DirectOpen" if cuda.can_access_peer(1, 0) else "_StagedOpen"
    assert how == expected


@pytest.mark.sim
@pytest.mark.skipif(sys.platform != "linux", reason="IPC needs Linux")
def test_ipc_open_on_another_device_without_peer_access(ndev, monkeypatch):
    assert _ipc_roundtrip(monkeypatch, no_peer=True) == "_StagedOpen"


@pytest.mark.parametrize("cast", [False, True])
def test_setitem_with_an_array_of_another_device(ndev, cast):
    src = on(0, cuda.to_device, np.arange(8, dtype=np.int32))
    dst = on(1, cuda.to_device, np.zeros((2, 8), np.float64 if cast
                                         else np.int32))
    dst[1] = src
    dst[0, ::2] = src[::2]
    out = dst.copy_to_host()
    assert np.array_equal(out[1], np.arange(8))
    assert np.array_equal(out[0, ::2], np.arange(0, 8, 2))
    assert np.all(out[0, 1::2] == 0)


@pytest.mark.sim
def test_setitem_without_peer_access_goes_through_the_host():
    out = run_child("""
        import numpy as np, cudamem as cuda
        src = cuda.to_device(np.arange(8, dtype=np.int32))
        with cuda.gpus[1]:
            dst = cuda.to_device(np.zeros((2, 8), np.float32))
        dst[1] = src
        dst[0] = 7
        dst[0, ::2] = src[::2]
        out = dst.copy_to_host()
        assert np.array_equal(out[1], np.arange(8)), out
        assert np.array_equal(out[0], [0, 7, 2, 7, 4, 7, 6, 7]), out
        assert cuda.get_current_device().id == 0
        print("ok")
    """, env=dict(CUDAMEM_SIM_NO_PEER="0-1")).stdout
    assert out.strip() == "ok"


def test_arrays_hold_their_context(ndev):
    c1 = on(1, cuda.current_context)
    base = sys.getrefcount(c1)
    a = on(1, cuda.device_array, 16)
    views = [a[2:], a.view(np.int64), cuda.as_cuda_array(a)]
    assert sys.getrefcount(c1) > base
    del a, views
    import gc

    gc.collect()
    assert sys.getrefcount(c1) == base


def test_context_methods_leave_the_current_device_alone(ndev):
    """A Context's own calls make it current only for their duration."""
    c1 = on(1, cuda.current_context)
    assert _core._current_device_id() == 0
    free, total = c1.get_memory_info()
    assert 0 < free <= total
    assert _core._current_device_id() == 0
    c1.synchronize()
    assert _core._current_device_id() == 0


def test_internal_kernel_on_another_device_leaves_the_current_one(ndev):
    """An assignment that runs the internal kernel on device 1's array
    (a broadcast) keeps device 0 current."""
    d1 = on(1, cuda.device_array, (8, 8), np.float32)
    assert _core._current_device_id() == 0
    d1[:] = np.arange(8, dtype=np.float32)  # broadcast: the kernel path
    assert _core._current_device_id() == 0
    out = on(1, d1.copy_to_host)
    np.testing.assert_array_equal(out, np.broadcast_to(np.arange(8.0), (8, 8)))


@pytest.mark.sim
def test_copy_from_another_device_waits_for_its_upload():
    """A synchronous to_device returns before its bytes land; a copy or
    assignment from that array on another device must come after them,
    though nothing orders one context's streams after another's.  The
    simulator's CUDAMEM_SIM_DELAY_US keeps the upload in flight."""
    run_child("""
        import numpy as np
        import cudamem as cuda
        full = np.arange(48.0).reshape(6, 8)
        for layout in (full, np.asfortranarray(full)):
            with cuda.gpus[0]:
                src = cuda.to_device(layout)
            with cuda.gpus[1]:
                s = cuda.stream()
                dst = cuda.device_array_like(layout)
                dst.copy_to_device(src, stream=s)
                s.synchronize()
                assert (dst.copy_to_host() == layout).all()
        with cuda.gpus[0]:
            src = cuda.to_device(np.arange(8, dtype=np.int32))
        with cuda.gpus[1]:
            dst = cuda.to_device(np.zeros((2, 8), np.int32))
            dst[1] = src
            assert (dst.copy_to_host()[1] == np.arange(8)).all()
    """, env={"CUDAMEM_SIM_DEVICES": "2", "CUDAMEM_SIM_DELAY_US": "20000"})
