# SPDX-License-Identifier: MIT
"""Mapped (zero-copy) host memory (docs/api.md#host-memory):
mapped_array / mapped_array_like, MappedNDArray as a NumPy array and a
device array at once, and the mapped() registration."""

import sys

import numpy as np
import pytest

import cudamem
from cudamem import _core
from helpers.arrays import Stream

CU_MEMHOSTALLOC_PORTABLE = 0x01
CU_MEMHOSTALLOC_DEVICEMAP = 0x02
CU_MEMHOSTALLOC_WRITECOMBINED = 0x04


def test_mapped_array_is_both(ctx):
    m = cudamem.mapped_array((4, 5), np.float32)
    assert type(m) is cudamem.MappedNDArray
    assert isinstance(m, np.ndarray)
    assert m.__cuda_memory__
    assert cudamem.is_cuda_array(m)
    assert cudamem.to_device(m) is m
    owner = m.gpu_data
    assert isinstance(owner, cudamem.HostAllocation)
    assert owner.kind == "mapped" and owner.size == m.nbytes
    assert m.base is owner and owner.host_pointer == m.ctypes.data
    cai = m.__cuda_array_interface__
    assert cai["data"] == (owner.device_pointer, False)
    assert cai["shape"] == (4, 5) and cai["typestr"] == "<f4"
    assert cai["stream"] is None and cai["version"] == 3
    assert m.stream == 0
    assert m.alloc_size == m.nbytes


def test_numpy_operations_work(ctx):
    m = cudamem.mapped_array(10, np.int64)
    m[:] = range(10)
    assert m.sum() == 45
    assert (m == np.arange(10)).all()
    m.fill(3)
    assert int(m[4]) == 3
    r = m + 1  # a result in ordinary host memory
    assert not cudamem.is_cuda_array(r)
    with pytest.raises(AttributeError, match="not in mapped or managed"):
        getattr(r, "gpu_data")  # noqa: B009
    with pytest.raises(AttributeError):
        getattr(r, "__cuda_array_interface__")  # noqa: B009


def test_host_writes_visible_on_device_and_back(ctx):
    m = cudamem.mapped_array((8, 3), np.float64)
    m[:] = np.arange(24.0).reshape(8, 3)
    dev = cudamem.from_cuda_array_interface(m.__cuda_array_interface__,
                                            owner=m)
    np.testing.assert_array_equal(dev.copy_to_host(), m)
    d = cudamem.to_device(np.full((8, 3), 7.0))
    m.copy_to_device(d)  # device -> mapped memory
    np.testing.assert_array_equal(m, 7.0)
    m.copy_to_device(np.ones((8, 3)))  # host -> mapped memory
    np.testing.assert_array_equal(np.asarray(m), 1.0)
    out = np.zeros((8, 3))
    assert m.copy_to_host(out) is out
    np.testing.assert_array_equal(out, 1.0)


@pytest.mark.parametrize("portable, wc", [(False, False), (True, False),
                                          (False, True), (True, True)])
def test_portable_and_wc_are_honoured(ctx, portable, wc):
    m = cudamem.mapped_array(64, np.uint8, portable=portable, wc=wc)
    assert bool(m.gpu_data.flags & CU_MEMHOSTALLOC_PORTABLE) == portable
    # The driver reports WRITECOMBINED and DEVICEMAP; with unified
    # addressing all pinned memory is portable and it may leave that bit
    # out of its answer.
    flags = _core._host_get_flags(m.gpu_data.host_pointer)
    assert flags & CU_MEMHOSTALLOC_DEVICEMAP
    assert bool(flags & CU_MEMHOSTALLOC_WRITECOMBINED) == wc
    n = cudamem.mapped_array_like(m, portable=portable, wc=wc)
    flags = _core._host_get_flags(n.gpu_data.host_pointer)
    assert bool(flags & CU_MEMHOSTALLOC_WRITECOMBINED) == wc


def test_slices_keep_the_device_side(ctx):
    m = cudamem.mapped_array((6, 8), np.int32)
    m[:] = np.arange(48).reshape(6, 8)
    s = m[1:5, ::2]
    assert type(s) is cudamem.MappedNDArray
    assert s.gpu_data is m.gpu_data
    cai = s.__cuda_array_interface__
    assert cai["data"][0] == m.gpu_data.device_pointer + 8 * 4
    assert cai["strides"] == (32, 8)
    np.testing.assert_array_equal(s.copy_to_host(), m[1:5, ::2])
    neg = m[::-1]
    np.testing.assert_array_equal(neg.copy_to_host(), np.asarray(m)[::-1])


def test_split(ctx):
    m = cudamem.mapped_array(10, np.float32)
    m[:] = np.arange(10)
    parts = list(m.split(4))
    assert [p.shape for p in parts] == [(4,), (4,), (2,)]
    assert all(type(p) is cudamem.MappedNDArray for p in parts)
    np.testing.assert_array_equal(parts[2].copy_to_host(), [8, 9])
    with pytest.raises(ValueError, match="only support 1d array"):
        next(cudamem.mapped_array((2, 2)).split(1))
    with pytest.raises(ValueError, match="only support unit stride"):
        next(m[::2].split(1))


def test_bound_stream(ctx):
    s = Stream()
    m = cudamem.mapped_array(16, np.float32, stream=s)
    assert m.stream is s and m[2:].stream is s
    m[:] = 2
    out = m.copy_to_host()  # async on the bound stream
    ctx.synchronize()
    np.testing.assert_array_equal(out, 2)
    m.stream = 0
    assert m.stream == 0
    with pytest.raises(TypeError):
        cudamem.mapped_array(4, stream=5)


def test_layouts_and_empty(ctx):
    f = cudamem.mapped_array((3, 4), order="F")
    assert f.flags.f_contiguous
    assert f.__cuda_array_interface__["strides"] == (8, 24)
    e = cudamem.mapped_array(0)
    assert e.size == 0
    assert e.__cuda_array_interface__["data"] == (0, False)
    assert e.copy_to_host().shape == (0,)
    z = cudamem.mapped_array(())
    z[()] = 4.0
    assert z.copy_to_host()[()] == 4.0
    like = cudamem.mapped_array_like(np.zeros((2, 3), np.int16, order="F"))
    assert like.flags.f_contiguous and like.dtype == np.int16


@pytest.mark.parametrize("args, kwargs, exc", [
    ((1.5,), {}, TypeError),
    ((-2,), {}, ValueError),
    ((3,), {"dtype": object}, TypeError),
    ((3,), {"attach_global": True}, TypeError),
])
def test_mapped_array_errors(ctx, args, kwargs, exc):
    with pytest.raises(exc):
        cudamem.mapped_array(*args, **kwargs)


def test_mapped_freed_once_with_its_size(ctx, memq):
    before = cudamem.memory_stats()["pinned_bytes"]
    m = cudamem.mapped_array(1000, np.float32)
    ptr = m.gpu_data.host_pointer
    v = m[100:]
    dv = v.device_view()
    owner_refs = sys.getrefcount(m.gpu_data)
    del m, v
    assert len(memq) == 0  # the device view holds the owner
    del dv
    assert len(memq) == 1 and memq.pending_bytes == 4000  # counts its size
    assert owner_refs > 2
    assert cudamem.memory_stats()["pinned_bytes"] == before
    memq.clear()
    with pytest.raises(cudamem.CudaAPIError):
        _core._host_get_flags(ptr)


def test_mapped_out_of_memory_retries(ctx, simulator):
    if not simulator:
        pytest.skip("fault injection needs the simulator")
    _core._sim_inject("MemHostAlloc", 1, 2)  # CUDA_ERROR_OUT_OF_MEMORY
    m = cudamem.mapped_array(8)
    assert m.gpu_data.kind == "mapped"


# --------------------------------------------------------------------------
# mapped()
# --------------------------------------------------------------------------


def test_mapped_yields_device_views(ctx):
    a = np.arange(100, dtype=np.float64)
    with cudamem.mapped(a) as d:
        assert isinstance(d, cudamem.DeviceNDArray)
        assert d.shape == a.shape and d.dtype == a.dtype
        np.testing.assert_array_equal(d.copy_to_host(), a)
        d.copy_to_device(np.zeros(100))  # writes land in a
    np.testing.assert_array_equal(a, 0)
    assert _core._registered_bytes() == 0


def test_mapped_many_and_stream(ctx):
    a = np.ones((10, 4), np.float32)[:, ::2]
    b = np.arange(5)
    s = Stream()
    with cudamem.mapped(a, b, stream=s) as ds:
        assert isinstance(ds, list) and len(ds) == 2
        assert ds[0].strides == a.strides and ds[1].stream is s
        # bound to s, so the copy is asynchronous on s
        # (docs/api.md#effective-stream)
        h = ds[0].copy_to_host(stream=0)
        cudamem.synchronize()
        np.testing.assert_array_equal(h, a)
    assert _core._registered_bytes() == 0


def test_mapped_keyword_check(ctx):
    with pytest.raises(AssertionError):
        with cudamem.mapped(np.zeros(3), strem=0):
            pass


def test_mapped_unmaps_on_exception_and_nests_with_pinned(ctx):
    a = np.zeros(8192)
    with pytest.raises(RuntimeError):
        with cudamem.mapped(a):
            raise RuntimeError
    assert _core._registered_bytes() == 0
    with cudamem.pinned(a):
        with cudamem.mapped(a[100:]) as d:
            d.copy_to_device(np.full(a.size - 100, 2.0))
        assert _core._registered_bytes() > 0
    assert _core._registered_bytes() == 0
    assert a[100] == 2.0


def test_mapped_of_mapped_and_pinned_memory(ctx):
    m = cudamem.mapped_array(10)
    m[:] = 5
    p = cudamem.pinned_array(10)
    p[:] = 6
    with cudamem.mapped(m, p) as (dm, dp):
        np.testing.assert_array_equal(dm.copy_to_host(), 5)
        np.testing.assert_array_equal(dp.copy_to_host(), 6)
        assert _core._registered_bytes() == 0


def test_mapped_empty_and_errors(ctx):
    with cudamem.mapped(np.zeros(0)) as d:
        assert d.size == 0
    with pytest.raises(TypeError, match="mapped\\(\\) takes NumPy arrays"):
        with cudamem.mapped([1, 2]):
            pass
