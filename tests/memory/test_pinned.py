# SPDX-License-Identifier: MIT
"""Page-locked host memory (docs/api.md#host-memory, #registration):
pinned_array / pinned_array_like, the pinned() registration, the pinned
pool, and transfers from pinned memory."""

import os
import subprocess
import sys

import numpy as np
import pytest

import cudamem
import helpers
from cudamem import _core
from helpers.arrays import Stream

CU_MEMHOSTALLOC_PORTABLE = 0x01
CU_MEMHOSTALLOC_WRITECOMBINED = 0x04
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712


@pytest.fixture
def no_pool():
    old = _core._pinned_pool_enable(False)
    yield
    _core._pinned_pool_enable(old)


@pytest.fixture
def pool(ctx):
    _core.pinned_pool_trim()
    old = _core._pinned_pool_enable(True)
    yield
    _core._pinned_pool_enable(old)
    ctx.synchronize()
    _core.pinned_pool_trim()


# --------------------------------------------------------------------------
# pinned_array
# --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float64, np.int8, np.complex128,
                                   np.dtype([("a", "i4"), ("b", "f8")])])
def test_pinned_array_is_a_plain_ndarray(ctx, no_pool, dtype):
    a = cudamem.pinned_array((3, 4), dtype=dtype)
    assert type(a) is np.ndarray
    assert a.shape == (3, 4) and a.dtype == np.dtype(dtype)
    assert a.flags.c_contiguous and a.flags.writeable and a.flags.aligned
    owner = a.base
    assert isinstance(owner, cudamem.HostAllocation)
    assert owner.kind == "pinned"
    assert owner.size == a.nbytes
    assert owner.host_pointer == a.ctypes.data
    assert owner.context is ctx
    a[...] = np.ones((), dtype)  # writable, all of it
    assert bytes(memoryview(owner)) == a.tobytes()


def test_pinned_array_layouts(ctx, no_pool):
    f = cudamem.pinned_array((3, 4), np.float32, order="F")
    assert f.flags.f_contiguous and not f.flags.c_contiguous
    s = cudamem.pinned_array((2, 3), np.float64, strides=(8, 32))
    assert s.strides == (8, 32) and s.base.size == 80
    z = cudamem.pinned_array(0)
    assert z.shape == (0,) and z.base.size == 0
    z0 = cudamem.pinned_array(())
    assert z0.shape == () and z0.base.size == 8
    z0[()] = 2.5
    assert z0[()] == 2.5
    n = cudamem.pinned_array(np.int64(5), np.int16)
    assert n.shape == (5,)


def test_pinned_array_like(ctx, no_pool):
    src = np.zeros((4, 6), np.float32, order="F")
    a = cudamem.pinned_array_like(src)
    assert a.shape == src.shape and a.dtype == src.dtype
    assert a.flags.f_contiguous and type(a) is np.ndarray
    b = cudamem.pinned_array_like(np.zeros((4, 6, 2))[:, ::2].transpose(2, 0,
                                                                        1))
    assert b.shape == (2, 4, 3)
    d = cudamem.pinned_array_like(cudamem.device_array((5,), np.int8))
    assert d.shape == (5,) and d.dtype == np.int8


@pytest.mark.parametrize("args, kwargs, exc, match", [
    ((1.5,), {}, TypeError, "shape must be an integer"),
    (((2, 1.0),), {}, TypeError, "shape elements must be integers"),
    ((-1,), {}, ValueError, "negative dimensions"),
    (((2, 2),), {"order": "K"}, ValueError, "must be either C/F order"),
    ((3,), {"strides": (8, 8)}, ValueError, "strides not match ndim"),
    ((3,), {"dtype": object}, TypeError, "Python objects"),
    ((3,), {"stream": 0}, TypeError, "unexpected keyword"),
    ((), {}, TypeError, "missing required argument 'shape'"),
])
def test_pinned_array_errors(ctx, args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        cudamem.pinned_array(*args, **kwargs)


def test_pinned_array_like_errors(ctx):
    with pytest.raises(AttributeError):
        cudamem.pinned_array_like(object())


def test_pinned_flags_are_plain(ctx, no_pool):
    a = cudamem.pinned_array(16)
    flags = _core._host_get_flags(a.base.host_pointer)
    assert not flags & CU_MEMHOSTALLOC_WRITECOMBINED
    assert a.base.flags == 0


def test_pinned_freed_once_after_last_view(ctx, memq, no_pool):
    before = cudamem.memory_stats()["pinned_bytes"]
    a = cudamem.pinned_array(1000, np.float64)
    ptr = a.base.host_pointer
    assert cudamem.memory_stats()["pinned_bytes"] == before + 8000
    v = a[10:20]
    vv = v[::2]
    del a, v
    assert len(memq) == 0  # vv keeps the memory
    assert _core._host_get_flags(ptr) is not None
    del vv
    assert len(memq) == 1
    assert memq.pending_bytes == 0  # pinned memory counts 0 bytes (API 9)
    assert cudamem.memory_stats()["pinned_bytes"] == before
    memq.clear()
    with pytest.raises(cudamem.CudaAPIError):
        _core._host_get_flags(ptr)  # freed, once
    assert len(memq) == 0


def test_pinned_base_refcount(ctx, no_pool):
    a = cudamem.pinned_array(8)
    owner = a.base
    rc = sys.getrefcount(owner)
    b = a[2:]
    assert sys.getrefcount(owner) == rc  # views point at a, not the owner
    del b
    assert sys.getrefcount(owner) == rc


def test_pinned_out_of_memory_retries_once(ctx, no_pool, simulator):
    if not simulator:
        pytest.skip("fault injection needs the simulator")
    _core._sim_inject("MemHostAlloc", 1, CUDA_ERROR_OUT_OF_MEMORY)
    a = cudamem.pinned_array(10)  # flush, collect, retry (Q12)
    assert a.base.kind == "pinned"
    _core._sim_inject("MemHostAlloc", 1, 1)  # other errors: no retry
    with pytest.raises(cudamem.CudaAPIError,
                       match="cuMemHostAlloc results in "
                             "CUDA_ERROR_INVALID_VALUE"):
        cudamem.pinned_array(10)
    _core._sim_inject("MemHostAlloc", 0, 0)


# --------------------------------------------------------------------------
# transfers from pinned memory
# --------------------------------------------------------------------------


@pytest.mark.parametrize("use_stream", [False, True])
def test_transfers_through_pinned_memory(ctx, no_pool, use_stream):
    stream = Stream() if use_stream else 0
    src = cudamem.pinned_array((64, 33), np.float32)
    src[:] = np.arange(src.size, dtype=np.float32).reshape(src.shape)
    d = cudamem.to_device(src, stream=stream)
    dst = cudamem.pinned_array_like(src)
    d.copy_to_host(dst, stream=stream)
    ctx.synchronize()
    np.testing.assert_array_equal(dst, src)


# --------------------------------------------------------------------------
# pinned()
# --------------------------------------------------------------------------


def test_pinned_registers_and_unregisters(ctx):
    a = np.arange(10000.0)
    before = _core._registered_bytes()
    with cudamem.pinned(a) as r:
        assert r is None
        assert _core._registered_bytes() >= before + a.nbytes
    assert _core._registered_bytes() == before
    with cudamem.pinned(a):  # re-pinning right after works
        pass
    assert _core._registered_bytes() == before


def test_pinned_unregisters_on_exception(ctx):
    a = np.zeros(5000)
    with pytest.raises(KeyError):
        with cudamem.pinned(a):
            raise KeyError("x")
    assert _core._registered_bytes() == 0
    with cudamem.pinned(a):
        assert _core._registered_bytes() > 0
    assert _core._registered_bytes() == 0


def test_pinned_nested_and_overlapping(ctx):
    big = np.zeros(100000, np.uint8)
    with cudamem.pinned(big):
        n = _core._registered_bytes()
        with cudamem.pinned(big):                   # the same array again
            with cudamem.pinned(big[100:50000], big[30000:]):  # overlaps
                assert _core._registered_bytes() == n
        assert _core._registered_bytes() == n       # still pinned
    assert _core._registered_bytes() == 0
    # overlapping partly, then extending beyond: the gap is registered
    with cudamem.pinned(big[:40000]):
        with cudamem.pinned(big[20000:]):
            assert _core._registered_bytes() >= big.nbytes
        assert 40000 <= _core._registered_bytes() < big.nbytes
    assert _core._registered_bytes() == 0


def test_pinned_copies_work_inside(ctx):
    a = np.arange(4096, dtype=np.int32)
    out = np.zeros_like(a)
    with cudamem.pinned(a, out):
        d = cudamem.to_device(a)
        d.copy_to_host(out)
    np.testing.assert_array_equal(a, out)


def test_pinned_overlapping_arrays_copy_in_one_block(ctx):
    big = np.zeros(100000, np.uint8)
    d = cudamem.to_device(np.full(70000, 3, np.uint8))
    with cudamem.pinned(big[:60000], big[30000:]):
        d.copy_to_host(big[30000:])  # one registration covers both
    assert (big[30000:] == 3).all()


def test_pinned_odd_arrays(ctx):
    ro = np.arange(100.0)
    ro.flags.writeable = False
    strided = np.zeros((50, 40))[::3, ::2]
    negative = np.arange(300.0)[::-1]
    empty = np.zeros(0)
    with cudamem.pinned(ro, strided, negative, empty):
        assert _core._registered_bytes() > 0
    with cudamem.pinned(empty):
        assert _core._registered_bytes() == 0
    with cudamem.pinned():
        pass
    assert _core._registered_bytes() == 0


def test_pinned_of_pinned_memory_registers_nothing(ctx, no_pool):
    p = cudamem.pinned_array(5000)
    with cudamem.pinned(p, p[10:]):
        assert _core._registered_bytes() == 0


@pytest.mark.parametrize("bad", [[1, 2, 3], b"bytes", 3.0, None])
def test_pinned_rejects_non_arrays(ctx, bad):
    with pytest.raises(TypeError, match="pinned\\(\\) takes NumPy arrays"):
        with cudamem.pinned(np.zeros(3), bad):
            pass
    assert _core._registered_bytes() == 0


def test_pinned_unregisters_at_once_inside_defer_cleanup(ctx):
    a = np.zeros(9000)
    with cudamem.defer_cleanup():
        with cudamem.pinned(a):
            pass
        assert _core._registered_bytes() == 0


def test_pinned_conflict_with_foreign_registration(ctx):
    raw = np.zeros(4 * 4096 + 4096, np.uint8)
    off = (-raw.ctypes.data) % 4096
    page = raw[off:off + 4 * 4096]
    _core._host_register(page.ctypes.data, page.nbytes, 0)
    try:
        with pytest.raises(cudamem.CudaAPIError,
                           match="HOST_MEMORY_ALREADY_REGISTERED"):
            with cudamem.pinned(page[100:200]):
                pass
    finally:
        _core._host_unregister(page.ctypes.data)
    assert _core._registered_bytes() == 0


def test_copy_leaving_a_registration_is_refused(ctx):
    # The driver's rule that pinned() coalesces the ranges of a call for.
    raw = np.zeros(4 * 4096, np.uint8)
    p = raw.ctypes.data
    d = cudamem.to_device(np.arange(8192, dtype=np.uint8))
    _core._host_register(p, 4096, 0)
    _core._host_register(p + 4096, 4096, 0)
    try:
        with pytest.raises(cudamem.CudaAPIError, match="INVALID_VALUE"):
            d.copy_to_host(raw[:8192])
        d[:4096].copy_to_host(raw[:4096])
    finally:
        _core._host_unregister(p)
        _core._host_unregister(p + 4096)
    np.testing.assert_array_equal(raw[:4096], np.arange(4096) % 256)


def test_pinned_failure_part_way_leaves_nothing(ctx, simulator):
    if not simulator:
        pytest.skip("fault injection needs the simulator")
    big = np.zeros(200000)
    a = big[:20000]
    b = big[100000:]  # pages apart from a: a second registration
    _core._sim_inject("MemHostRegister", 2, 1)  # the second range fails
    try:
        with pytest.raises(cudamem.CudaAPIError, match="cuMemHostRegister"):
            with cudamem.pinned(a, b):
                pass
    finally:
        _core._sim_inject("MemHostRegister", 0, 0)
    assert _core._registered_bytes() == 0
    with cudamem.pinned(a, b):  # and nothing is left behind
        pass
    assert _core._registered_bytes() == 0


def test_pinned_through_a_plugin():
    rc, out = helpers.run_py("""
        import numpy as np, cudamem
        from helpers import emm_plugin
        from cudamem import _core
        cudamem.set_memory_manager(emm_plugin.CountingManager)
        a = cudamem.pinned_array(100, np.int32)
        assert isinstance(a.base.owner, cudamem.PinnedMemory)
        a[:] = 3
        assert a.sum() == 300
        m = cudamem.mapped_array(10)
        m[:] = 2
        assert m.copy_to_host().sum() == 20
        g = cudamem.managed_array(10)
        g[:] = 1
        assert g.copy_to_host().sum() == 10
        h = np.zeros(1000)
        with cudamem.pinned(h):
            pass
        with cudamem.mapped(h) as d:
            assert d.copy_to_host().shape == (1000,)
        with cudamem.pinned(h):  # unregistered at once, pinnable again
            pass
        del a, m, g
        print("ok")
        """, timeout=300)
    assert rc == 0, out
    assert "ok" in out


# --------------------------------------------------------------------------
# The pinned pool
# --------------------------------------------------------------------------


def test_pool_reuses_blocks(ctx, pool):
    a = cudamem.pinned_array(1 << 20, np.uint8)
    assert a.base.pooled
    ptr = a.base.host_pointer
    s0 = cudamem.pinned_pool_stats()
    assert s0["enabled"] and s0["reserved_bytes"] == 1 << 20
    del a
    ctx.synchronize()
    s1 = cudamem.pinned_pool_stats()
    assert s1["free_bytes"] == 1 << 20
    b = cudamem.pinned_array(700000, np.uint8)  # the same size class
    assert b.base.host_pointer == ptr
    s2 = cudamem.pinned_pool_stats()
    assert s2["hits"] == s1["hits"] + 1 and s2["free_bytes"] == 0
    del b
    cudamem.pinned_pool_trim()
    s3 = cudamem.pinned_pool_stats()
    assert s3["free_bytes"] == 0 and s3["reserved_bytes"] == 0


def test_pool_counts_pinned_bytes(ctx, pool):
    before = cudamem.memory_stats()["pinned_bytes"]
    a = cudamem.pinned_array(5000, np.uint8)  # an 8 KiB block
    assert cudamem.memory_stats()["pinned_bytes"] == before + 8192
    del a
    assert cudamem.memory_stats()["pinned_bytes"] == before + 8192
    cudamem.pinned_pool_trim()
    assert cudamem.memory_stats()["pinned_bytes"] == before


def test_pool_waits_for_copies_before_reuse(simulator):
    if not simulator:
        pytest.skip("slowed-down copies need the simulator")
    rc, out = helpers.run_py("""
        import numpy as np, cudamem
        from helpers.arrays import Stream
        d = cudamem.device_array(1 << 16, np.uint8)
        a = cudamem.pinned_array(1 << 16, np.uint8)
        ptr = a.base.host_pointer
        d.copy_to_host(a, stream=Stream())  # still running for a while
        del a
        b = cudamem.pinned_array(1 << 16, np.uint8)
        print("busy block reused:", b.base.host_pointer == ptr)
        cudamem.synchronize()
        del b
        cudamem.synchronize()
        c = cudamem.pinned_array(1 << 16, np.uint8)
        print("idle block reused:", c.base.pooled and
              cudamem.pinned_pool_stats()["hits"] == 1)
        """, timeout=300, CUDAMEM_PINNED_POOL="1",
        CUDAMEM_SIM_DELAY_US="300000")
    assert rc == 0, out
    assert "busy block reused: False" in out
    assert "idle block reused: True" in out


def test_pool_limit_is_respected(ctx, pool):
    _core._pinned_pool_enable(True, 4096)
    try:
        a = cudamem.pinned_array(100000, np.uint8)
        del a
        assert cudamem.pinned_pool_stats()["free_bytes"] == 0
    finally:
        _core._pinned_pool_enable(True, 1 << 30)


@pytest.mark.ahead
def test_pool_from_the_environment():
    rc, out = helpers.run_py("""
        import cudamem
        a = cudamem.pinned_array(10)
        print(a.base.pooled, cudamem.pinned_pool_stats()["enabled"])
        """, timeout=300, CUDAMEM_PINNED_POOL="1")
    assert rc == 0, out
    assert "True True" in out


@pytest.mark.ahead
def test_pool_is_on_by_default():
    rc, out = helpers.run_py("""
        import cudamem
        print(cudamem.pinned_array(10).base.pooled)
        """, timeout=300, CUDAMEM_PINNED_POOL="")
    assert rc == 0, out
    assert "True" in out


@pytest.mark.ahead
def test_pool_off_from_the_environment():
    rc, out = helpers.run_py("""
        import cudamem
        print(cudamem.pinned_array(10).base.pooled,
              cudamem.pinned_pool_stats()["enabled"])
        """, timeout=300, CUDAMEM_PINNED_POOL="0")
    assert rc == 0, out
    assert "False False" in out


# --------------------------------------------------------------------------
# Leaks
# --------------------------------------------------------------------------


@pytest.mark.ahead
@pytest.mark.leaks
@pytest.mark.slow
def test_allocate_and_drop_cycles_stay_flat():
    script = helpers.TESTS / "robustness" / "leaks" / "hostmem_cycles.py"
    env = dict(helpers.environ(), PYTHONPATH=os.pathsep.join(
        [str(helpers.ROOT), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, str(script), "100000"], env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "flat" in p.stdout
