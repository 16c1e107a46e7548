# SPDX-License-Identifier: MIT
"""The internal copy-and-cast kernel (NVRTC on a GPU, the same conversion
code on the simulator) and the device-array operations that use it:
device-to-device copies no 2-D / 3-D copy expresses, transposition,
assignment with broadcasting and casting."""

import numpy as np
import pytest

import cudamem as cuda

NUMERIC = [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32,
           np.uint32, np.int64, np.uint64, np.float16, np.float32,
           np.float64, np.complex64, np.complex128]


def values_for(src, dst):
    """Values every pair converts without undefined behaviour: small
    non-negative numbers that fit every type (floats truncate)."""
    base = np.array([0, 1, 2, 3, 7, 42, 100, 127], dtype=np.float64)
    if np.dtype(src).kind in "fc" and np.dtype(dst).kind in "iub":
        base = base + 0.75  # truncation toward zero
    if np.dtype(src).kind == "b":
        base = np.array([0, 1, 1, 0, 1, 0, 0, 1], dtype=np.float64)
    return base.astype(src)


@pytest.mark.parametrize("dst", NUMERIC, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("src", NUMERIC, ids=lambda t: np.dtype(t).name)
def test_cast_matches_numpy(src, dst):
    h = values_for(src, dst)
    d_src = cuda.to_device(h)
    d_dst = cuda.device_array(h.shape, dtype=dst)
    d_dst[:] = d_src  # another dtype on the device: the kernel casts
    with np.errstate(all="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = h.astype(dst)
    np.testing.assert_array_equal(d_dst.copy_to_host(), want)


@pytest.mark.parametrize("dtype", [np.float32, np.int16, np.complex128])
def test_device_copy_between_layouts(dtype):
    h = (np.arange(4 * 5 * 6) % 251).astype(dtype).reshape(4, 5, 6)
    c = cuda.to_device(h)
    f = cuda.device_array_like(np.asfortranarray(h))
    f.copy_to_device(c)  # C -> F on the device: no 2-D / 3-D copy fits
    out = np.empty_like(np.asfortranarray(h))
    f.copy_to_host(out)
    np.testing.assert_array_equal(out, h)
    # a stepped, negative-stride view into a fresh array
    v = c[::-1, ::2, 1::3]
    dst = cuda.device_array(v.shape, dtype=dtype)
    dst.copy_to_device(v)
    np.testing.assert_array_equal(dst.copy_to_host(), h[::-1, ::2, 1::3])


def test_device_copy_leaves_bytes_outside_the_view():
    h = np.arange(64, dtype=np.int32).reshape(8, 8)
    d = cuda.to_device(h)
    src = cuda.to_device(np.full((4, 4), -1, np.int32))
    d[::2, ::2].copy_to_device(src)
    want = h.copy()
    want[::2, ::2] = -1
    np.testing.assert_array_equal(d.copy_to_host(), want)


def test_transpose_large():
    h = np.arange(300 * 170, dtype=np.float64).reshape(300, 170)
    d = cuda.to_device(h)
    t = d.T
    assert t.shape == (170, 300) and t.is_c_contiguous()
    cuda.synchronize()
    np.testing.assert_array_equal(t.copy_to_host(), h.T)


@pytest.mark.parametrize("value", [1.5, -2, 3 + 0j, True])
def test_scalar_fill_of_a_strided_view(value):
    h = np.zeros((6, 10), np.float32)
    d = cuda.to_device(h)
    if isinstance(value, complex):
        # a host value is cast by NumPy, which warns as it always does
        with pytest.warns(np.exceptions.ComplexWarning):
            d[1::2, ::3] = value
    else:
        d[1::2, ::3] = value
    h[1::2, ::3] = np.real(value)
    np.testing.assert_array_equal(d.copy_to_host(), h)


def test_row_broadcast_and_cast():
    d = cuda.device_array((50, 40), dtype=np.int64)
    row = np.arange(40, dtype=np.float64) + 0.5
    d[:] = row
    np.testing.assert_array_equal(d.copy_to_host(),
                                  np.broadcast_to(row.astype(np.int64),
                                                  (50, 40)))
    col = cuda.to_device(np.arange(50, dtype=np.int8).reshape(50, 1))
    d[:, :] = col  # a device column of another dtype, broadcast
    np.testing.assert_array_equal(
        d.copy_to_host(),
        np.broadcast_to(np.arange(50).reshape(50, 1), (50, 40)))


def test_assignment_on_a_stream_is_ordered():
    s = cuda.stream() if hasattr(cuda, "stream") else None
    if s is None:
        pytest.skip("streams are not available")
    d = cuda.device_array(1000, dtype=np.float32, stream=s)
    d[:] = 2.5
    d[10:20] = cuda.to_device(np.arange(10, dtype=np.int32))
    # copy_to_host is asynchronous on the bound stream too.
    out = d.copy_to_host()
    s.synchronize()
    want = np.full(1000, 2.5, np.float32)
    want[10:20] = np.arange(10)
    np.testing.assert_array_equal(out, want)


def test_records_copy_between_layouts():
    dt = np.dtype([("a", np.int32), ("b", np.float64, (2,))])
    h = np.zeros((5, 7), dt)
    h["a"] = np.arange(35).reshape(5, 7)
    h["b"] = np.arange(70).reshape(5, 7, 2)
    d = cuda.to_device(h)
    f = cuda.device_array((5, 7), dtype=dt, order="F")
    f.copy_to_device(d)
    out = f.copy_to_host()
    np.testing.assert_array_equal(out, h)
