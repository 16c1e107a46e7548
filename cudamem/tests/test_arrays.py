# SPDX-License-Identifier: MIT
"""Device arrays and transfers: round trips of dtypes and layouts, views,
assignment, device-to-device copies, large (staged) copies, the CUDA
Array Interface and DLPack."""

import numpy as np
import pytest

import cudamem as cuda

DTYPES = [np.int8, np.uint16, np.int32, np.int64, np.float32, np.float64,
          np.complex128, np.bool_]


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_dtypes(dtype):
    host = (np.arange(1000) % 7).astype(dtype)
    d = cuda.to_device(host)
    assert d.shape == host.shape and d.dtype == host.dtype
    assert d.nbytes == host.nbytes
    np.testing.assert_array_equal(d.copy_to_host(), host)


@pytest.mark.parametrize("layout", ["C", "F", "strided", "0-d", "empty"])
def test_round_trip_layouts(layout):
    base = np.arange(6 * 5, dtype=np.float64).reshape(6, 5)
    host = {
        "C": base,
        "F": np.asfortranarray(base),
        "strided": base[::2, 1::2],
        "0-d": np.array(3.5),
        "empty": np.empty((0, 4)),
    }[layout]
    d = cuda.to_device(host)
    assert d.shape == host.shape
    np.testing.assert_array_equal(d.copy_to_host(), host)


def test_copy_into_given_host_array():
    host = np.arange(64, dtype=np.int32)
    d = cuda.to_device(host)
    out = np.zeros_like(host)
    assert d.copy_to_host(out) is out
    np.testing.assert_array_equal(out, host)


def test_device_array_and_like():
    d = cuda.device_array((4, 3), dtype=np.float32, order="F")
    assert d.shape == (4, 3) and d.is_f_contiguous()
    like = cuda.device_array_like(d)
    assert like.shape == d.shape and like.dtype == d.dtype


def test_views_and_assignment():
    host = np.arange(100, dtype=np.int64).reshape(10, 10)
    d = cuda.to_device(host)
    np.testing.assert_array_equal(d[2:5, ::3].copy_to_host(),
                                  host[2:5, ::3])
    np.testing.assert_array_equal(d.T.copy_to_host(), host.T)
    np.testing.assert_array_equal(d.reshape(100).copy_to_host(),
                                  host.reshape(100))
    d[0] = 7
    d[1:3, 4] = np.array([-1, -2])
    expected = host.copy()
    expected[0] = 7
    expected[1:3, 4] = [-1, -2]
    np.testing.assert_array_equal(d.copy_to_host(), expected)
    assert d[9, 9] == 99


def test_device_to_device_copy():
    src = cuda.to_device(np.arange(256, dtype=np.float32))
    dst = cuda.device_array_like(src)
    dst.copy_to_device(src)
    np.testing.assert_array_equal(dst.copy_to_host(), src.copy_to_host())


def test_large_transfer():
    """64 MiB each way, beyond the threshold of the staged path."""
    host = np.random.default_rng(1).integers(0, 255, 64 << 20,
                                             dtype=np.uint8)
    d = cuda.to_device(host)
    np.testing.assert_array_equal(d.copy_to_host(), host)


def test_asynchronous_transfers_on_a_stream(stream):
    host = np.arange(1 << 16, dtype=np.float64)
    d = cuda.to_device(host, stream=stream)
    out = cuda.pinned_array(host.shape, dtype=host.dtype)
    d.copy_to_host(out, stream=stream)
    stream.synchronize()
    np.testing.assert_array_equal(out, host)


def test_bad_input_raises():
    d = cuda.to_device(np.arange(10, dtype=np.int32))
    with pytest.raises(ValueError):
        d.copy_to_device(np.arange(11, dtype=np.int32))
    with pytest.raises(IndexError):
        d[10]


def test_cuda_array_interface():
    d = cuda.to_device(np.arange(12, dtype=np.int16).reshape(3, 4))
    cai = d.__cuda_array_interface__
    assert cai["shape"] == (3, 4) and cai["typestr"] == "<i2"
    assert cai["data"][0] == d.device_ctypes_pointer.value
    assert cuda.is_cuda_array(d)
    view = cuda.as_cuda_array(d)
    np.testing.assert_array_equal(view.copy_to_host(), d.copy_to_host())
    # The view is the same memory: a write through it is seen by d.
    view[0, 0] = 42
    assert d[0, 0] == 42


def test_dlpack_round_trip():
    d = cuda.to_device(np.arange(20, dtype=np.float32).reshape(4, 5))
    e = cuda.from_dlpack(d)
    assert e.shape == (4, 5)
    np.testing.assert_array_equal(e.copy_to_host(), d.copy_to_host())
