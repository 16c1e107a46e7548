# SPDX-License-Identifier: MIT
"""DeviceNDArray / DeviceRecord: allocation, layout attributes, views,
indexing and assignment."""

import ctypes
import sys

import numpy as np
import pytest

import cudamem as cuda

from helpers.arrays import DTYPES, REC, Stream, host, sample


# -- allocation -----------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_device_array_attributes(ctx, dtype):
    d = cuda.device_array((3, 4), dtype=dtype)
    dt = np.dtype(dtype)
    assert isinstance(d, cuda.DeviceNDArray)
    assert d.shape == (3, 4) and d.ndim == 2 and d.size == 12
    assert d.strides == (4 * dt.itemsize, dt.itemsize)
    assert d.dtype == dt and d.itemsize == dt.itemsize
    assert d.nbytes == d.alloc_size == 12 * dt.itemsize
    assert d.flags == {"C_CONTIGUOUS": True, "F_CONTIGUOUS": False}
    assert d.is_c_contiguous() and not d.is_f_contiguous()
    # numba's class attributes (numba-cuda's kernels use the CAI)
    assert d.__cuda_ndarray__ is True and d.__cuda_memory__ is True
    assert cuda.to_device(d) is d
    assert d.stream == 0
    assert d.as_cuda_arg() is d.gpu_data
    assert d.gpu_data.size == d.alloc_size


def test_device_array_order_and_strides(ctx):
    f = cuda.device_array((2, 3), order="F")
    assert f.strides == (8, 16) and f.is_f_contiguous()
    e = cuda.device_array((1, 10), strides=(800, 8))
    assert e.alloc_size == 80
    assert e.flags == {"C_CONTIGUOUS": True, "F_CONTIGUOUS": True}
    g = cuda.device_array(10, strides=16)
    assert g.strides == (16,) and g.alloc_size == 152 and g.nbytes == 80
    with pytest.raises(ValueError, match="must be either C/F order"):
        cuda.device_array((2, 3), order="K")
    assert cuda.device_array((), order="K").shape == ()
    with pytest.raises(ValueError, match="strides not match ndim"):
        cuda.device_array((2, 3), strides=(8,))


@pytest.mark.parametrize("shape", [5, np.int64(5), np.int32(5), [5],
                                   (np.int64(5),), np.array([5])])
def test_device_array_shape_kinds(ctx, shape):
    assert cuda.device_array(shape).shape == (5,)


def test_device_array_shape_errors(ctx):
    for bad in (5.0, np.float64(5), np.array([5.0])):
        with pytest.raises(TypeError,
                           match="shape must be an integer or tuple"):
            cuda.device_array(bad)
    with pytest.raises(TypeError, match="shape elements must be integers, "
                                        "got float"):
        cuda.device_array((2, 3.0))
    with pytest.raises(ValueError, match="negative dimensions"):
        cuda.device_array((2, -1))
    with pytest.raises(ValueError, match="array is too big"):
        cuda.device_array((2**40, 2**40))
    with pytest.raises(TypeError):
        cuda.device_array(None)
    with pytest.raises(TypeError, match="Python objects"):
        cuda.device_array(3, dtype=object)


def test_zero_size_and_zero_d(ctx):
    z = cuda.device_array((0, 4))
    assert z.gpu_data is None and z.alloc_size == 0
    assert z.flags == {"C_CONTIGUOUS": True, "F_CONTIGUOUS": True}
    assert z.__cuda_array_interface__["data"] == (0, False)
    assert z.copy_to_host().shape == (0, 4)
    s = cuda.device_array(())
    assert s.shape == () and s.strides == () and s.alloc_size == 8
    with pytest.raises(IndexError):
        len(s)
    with pytest.raises(NotImplementedError):
        _ = s.T


@pytest.mark.parametrize("src", [
    np.zeros((3, 4)), np.zeros((3, 4), order="F"), np.zeros(7),
    np.zeros((4, 6))[::2, ::3], np.zeros((3, 4, 5)).transpose(1, 0, 2),
    np.zeros(()),
])
def test_device_array_like(ctx, src):
    d = cuda.device_array_like(src)
    e = np.empty_like(src)
    assert d.shape == src.shape and d.dtype == src.dtype
    assert d.strides == e.strides
    assert cuda.device_array_like(d).strides == d.strides


def test_device_array_like_stream(ctx):
    s = Stream()
    assert cuda.device_array_like(np.zeros(3), stream=s).stream is s
    with pytest.raises(TypeError):
        cuda.device_array_like(np.zeros(3), stream=5)


def test_constructor(ctx):
    d = cuda.DeviceNDArray((2, 3), (24, 8), np.float32)
    assert d.shape == (2, 3) and d.dtype == np.float32
    assert d.alloc_size == 2 * 24 - 24 + 12 + 8
    e = cuda.DeviceNDArray((2, 3), (24, 8), np.float32, gpu_data=d.gpu_data)
    assert e.gpu_data is d.gpu_data
    assert e.device_ctypes_pointer.value == d.device_ctypes_pointer.value
    z = cuda.DeviceNDArray((0,), (8,), np.float64, gpu_data=d.gpu_data)
    assert z.gpu_data is None
    with pytest.raises(TypeError):
        cuda.DeviceNDArray((2,), None, np.float64)


def test_device_ctypes_pointer(ctx):
    d = cuda.device_array(4)
    assert isinstance(d.device_ctypes_pointer, ctypes.c_size_t)
    assert d.device_ctypes_pointer.value == \
        d.__cuda_array_interface__["data"][0]
    assert cuda.device_array(0).device_ctypes_pointer.value is None


def test_stream_attribute(ctx):
    d = cuda.device_array(3)
    s = Stream()
    d.stream = s
    assert d.stream is s
    with pytest.raises(TypeError):
        d.stream = 7
    b = d.bind()
    assert b.stream == 0 and b.gpu_data is d.gpu_data
    assert d.bind(s).stream is s


# -- ownership ------------------------------------------------------------


def test_views_keep_owner_alive(ctx):
    d = cuda.device_array(10)
    owner = d.gpu_data
    base = sys.getrefcount(owner)
    v = d[2:5]
    assert sys.getrefcount(owner) == base + 1
    w = v.view(np.int64)
    assert sys.getrefcount(owner) == base + 2
    del d      # its own reference and the one its gpu_data attribute kept
    assert sys.getrefcount(owner) == base
    del v, w
    assert sys.getrefcount(owner) == base - 2


def test_gpu_data_of_views_is_numbas(ctx):
    # numba's view: gpu_data points at the bytes the view spans and keeps
    # the allocation as its owner; a whole array shows the allocation
    d = cuda.device_array(10)
    owner = d.gpu_data
    assert d.gpu_data is owner and d[:].gpu_data is owner
    v = d[2:5]
    mem = v.gpu_data
    assert mem is v.gpu_data and mem.owner is owner
    assert mem.device_pointer == owner.device_pointer + 16
    assert mem.size == 24 and mem.device_ctypes_pointer.value == \
        v.device_ctypes_pointer.value
    w = v.view(np.int64)
    assert w.gpu_data.owner is owner and w.gpu_data.size == 24
    r = d[9:1:-2]                # negative step: its span, lowest first
    assert (r.gpu_data.device_pointer - owner.device_pointer,
            r.gpu_data.size) == (24, 56)
    assert d[:0].gpu_data is None


# -- views and indexing -----------------------------------------------------


@pytest.mark.parametrize("index", [
    1, -1, slice(None), slice(1, 3), slice(None, None, -1),
    (slice(None, None, 2), 1), (1, slice(None, None, -2)),
    (slice(5, 1, -1), slice(None)), (slice(10, 20),), (slice(2, 2),),
])
@pytest.mark.parametrize("order", ["C", "F"])
def test_getitem_views_match_numpy(ctx, index, order):
    h = np.asarray(np.arange(30.0).reshape(6, 5), order=order)
    d = cuda.to_device(h)
    v = d[index]
    assert isinstance(v, cuda.DeviceNDArray)
    assert v.shape == h[index].shape and v.strides == h[index].strides
    np.testing.assert_array_equal(v.copy_to_host(), h[index])


def test_getitem_scalar_and_errors(ctx):
    h = np.arange(12).reshape(3, 4)
    d = cuda.to_device(h)
    x = d[1, 2]
    assert isinstance(x, np.int64) and x == 6
    assert d[-1, -1] == 11
    assert cuda.to_device(np.asarray(2.5))[()] == 2.5
    with pytest.raises(IndexError):
        d[3]
    with pytest.raises(IndexError):
        d[-4]
    # NumPy's errors (numba's "1 extra indices given" is an IndexError)
    with pytest.raises(IndexError, match="too many indices for array: "
                       "array is 2-dimensional, but 3 were indexed"):
        d[0, 0, 0]
    with pytest.raises(IndexError, match="index 3 is out of bounds for "
                       "axis 0 with size 3"):
        d[3, 0]
    with pytest.raises(ValueError):
        d[::0]
    for bad in (1.5, "0", object(), slice(0.5, 1)):
        with pytest.raises((TypeError, IndexError)):
            d[bad, bad]


def test_getitem_stream(ctx):
    s = Stream()
    d = cuda.to_device(np.arange(5), stream=s)
    assert d[1:].stream is s
    t = Stream()
    assert d.getitem(slice(1, None), stream=t).stream is t
    assert d.getitem(2, stream=t) == 2


def test_iteration_and_len(ctx):
    d = cuda.to_device(np.arange(4))
    assert len(d) == 4
    assert list(d) == [0, 1, 2, 3]
    with pytest.raises(IndexError):  # len() of a 0-d array, as in numba
        list(cuda.device_array(()))


def test_reshape_ravel(ctx):
    h = np.arange(24.0).reshape(4, 6)
    s = Stream()
    d = cuda.to_device(h, stream=s)
    r = d.reshape(3, 8)
    assert r.shape == (3, 8) and r.stream is s  # Q5: keeps the stream
    np.testing.assert_array_equal(host(r), h.reshape(3, 8))
    assert d.reshape((2, -1)).shape == (2, 12)
    assert d.reshape([24]).shape == (24,)
    assert d.reshape(4, 6, order="F").strides == (8, 32)
    with pytest.raises(ValueError, match="reshape changes the size"):
        d.reshape(5, 5)
    with pytest.raises(ValueError, match="can only specify one unknown"):
        d.reshape(-1, -1)
    with pytest.raises(ValueError, match="cannot infer valid shape"):
        d.reshape(-1, 5)
    with pytest.raises(ValueError, match="order not C|F|A"):
        d.reshape(24, order="X")
    with pytest.raises(TypeError, match="unknown keyword arguments"):
        d.reshape(24, foo=1)
    with pytest.raises(NotImplementedError, match="operation requires "
                                                  "copying"):
        d[:, ::2].reshape(12)
    rv = d.ravel()
    assert rv.shape == (24,) and rv.stream is s
    np.testing.assert_array_equal(host(rv), h.ravel())
    with pytest.raises(NotImplementedError, match="ravel on non-contiguous"):
        d.ravel(order="F")
    with pytest.raises(NotImplementedError, match="ravel on non-contiguous"):
        d[::2].ravel()
    with pytest.raises(ValueError, match="order not C|F|A"):
        d.ravel(order="Q")
    assert cuda.to_device(np.asfortranarray(h)).ravel("F").shape == (24,)


def test_view_dtype(ctx):
    h = np.arange(12, dtype=np.int32).reshape(3, 4)
    d = cuda.to_device(h)
    v = d.view(np.int64)
    assert v.shape == (3, 2) and v.strides == (16, 8)
    np.testing.assert_array_equal(v.copy_to_host(), h.view(np.int64))
    assert d.view(np.float32).gpu_data is d.gpu_data
    with pytest.raises(ValueError, match="must be C-contiguous"):
        d[:, ::2].view(np.int64)
    with pytest.raises(ValueError, match="must be a divisor"):
        d.view("V12")
    dt = cuda.to_device(np.array(["2020-01-01"], dtype="M8[D]"))
    assert dt.view(np.int64).copy_to_host()[0] == 18262


def test_squeeze_split_transpose(ctx):
    h = np.arange(6.0).reshape(1, 6, 1)
    d = cuda.to_device(h)
    assert d.squeeze().shape == (6,)
    assert d.squeeze(axis=0).shape == (6, 1)
    assert d.squeeze(axis=(0, 2)).shape == (6,)
    with pytest.raises(ValueError, match="cannot select an axis"):
        d.squeeze(axis=1)
    s = Stream()
    parts = list(cuda.to_device(np.arange(7)).split(3, stream=s))
    assert [p.shape for p in parts] == [(3,), (3,), (1,)]
    assert all(p.stream is s for p in parts)
    np.testing.assert_array_equal(host(parts[2]), [6])
    gen = d.split(2)  # errors appear only when iterated
    with pytest.raises(ValueError, match="only support 1d array"):
        next(gen)
    with pytest.raises(ValueError, match="only support unit stride"):
        next(cuda.to_device(np.arange(8))[::2].split(2))
    m = cuda.to_device(np.arange(12).reshape(3, 4))
    assert m.transpose((0, 1)) is m
    t = m.T
    assert t.shape == (4, 3) and t.is_c_contiguous()
    np.testing.assert_array_equal(t.copy_to_host(),
                                  np.arange(12).reshape(3, 4).T)
    sv = cuda.to_device(np.arange(120, dtype=np.int64).reshape(10, 12))
    tv = sv[::2, ::2].T
    assert tv.shape == (6, 5) and tv.strides == (40, 8)
    with pytest.raises(ValueError, match="invalid axes list"):
        m.transpose((0, 0))
    with pytest.raises(NotImplementedError, match="non-2D"):
        _ = cuda.to_device(np.arange(3)).T


def test_array_protocol(ctx):
    h = np.arange(5)
    d = cuda.to_device(h)
    np.testing.assert_array_equal(np.asarray(d), h)
    assert np.asarray(d, dtype=np.float32).dtype == np.float32
    with pytest.raises(ValueError, match="copy=False"):
        np.asarray(d, copy=False)


# -- records ----------------------------------------------------------------


def test_device_record(ctx):
    h = sample((4,), REC)
    d = cuda.to_device(h)
    r = d[2]
    assert isinstance(r, cuda.DeviceRecord) and r.shape == ()
    assert r.flags == {"C_CONTIGUOUS": True, "F_CONTIGUOUS": True}
    assert r.alloc_size == REC.itemsize
    assert r["a"] == h[2]["a"] and isinstance(r["a"], np.int32)
    sub = r["b"]
    assert isinstance(sub, cuda.DeviceNDArray) and sub.shape == (2,)
    np.testing.assert_array_equal(sub.copy_to_host(), h[2]["b"])
    nested = r["c"]
    assert isinstance(nested, cuda.DeviceRecord)
    assert nested["y"] == h[2]["c"]["y"]
    with pytest.raises(KeyError):
        r["nope"]
    with pytest.raises(KeyError):
        r[0]
    r["a"] = 41.9  # unsafe cast on the host
    r["b"] = [1.5, 2.5]
    nested["y"] = -3
    out = d.copy_to_host()
    assert out[2]["a"] == 41
    np.testing.assert_array_equal(out[2]["b"], [1.5, 2.5])
    assert out[2]["c"]["y"] == -3
    assert out[1] == h[1]
    host_rec = r.copy_to_host()
    assert isinstance(host_rec, np.ndarray) and host_rec.shape == ()
    assert host_rec["a"] == 41


def test_record_from_void(ctx):
    h = sample((2,), REC)
    r = cuda.to_device(h[1])
    assert isinstance(r, cuda.DeviceRecord)
    assert r.copy_to_host()[()] == h[1]
    blank = np.zeros(1, dtype=REC)
    out = r.copy_to_host(blank[0])
    assert out == h[1] and blank[0] == h[1]


# -- assignment ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.int8, np.uint32, np.float32,
                                   np.float64, np.complex128, np.bool_])
def test_setitem_scalar_broadcast(ctx, dtype):
    h = np.zeros((4, 5), dtype=dtype)
    d = cuda.to_device(h)
    d[1] = 1
    h[1] = 1
    d[:, 2] = 3
    h[:, 2] = 3
    d[2, 3] = 0
    h[2, 3] = 0
    d[3, ::2] = np.arange(3).astype(dtype)
    h[3, ::2] = np.arange(3).astype(dtype)
    np.testing.assert_array_equal(d.copy_to_host(), h)


def test_setitem_casts_and_broadcasts(ctx):
    d = cuda.device_array((3, 4), dtype=np.int16)
    d[:] = 2.7  # truncates like C
    assert (d.copy_to_host() == 2).all()
    d[:] = np.arange(4.0) + 0.5
    np.testing.assert_array_equal(d.copy_to_host(),
                                  np.tile(np.arange(4), (3, 1)))
    d[:] = np.array([[1], [2], [3]])
    np.testing.assert_array_equal(d.copy_to_host()[:, 0], [1, 2, 3])
    d[:] = 300  # wraps as an unsafe cast
    assert (d.copy_to_host() == np.int16(300)).all()
    f = cuda.device_array((3, 4))
    f[:] = d  # device source of another dtype
    np.testing.assert_array_equal(f.copy_to_host(), d.copy_to_host())
    g = cuda.device_array((3, 4), dtype=np.int16)
    g[::-1] = d[:, ::-1]  # device source, same dtype, reversed layouts
    np.testing.assert_array_equal(g.copy_to_host(),
                                  d.copy_to_host()[::-1, ::-1])
    row = cuda.to_device(np.arange(4, dtype=np.int16))
    g[:] = row  # broadcast device source
    np.testing.assert_array_equal(g.copy_to_host(),
                                  np.tile(np.arange(4), (3, 1)))
    d[0:0] = 5  # empty target: no-op


def test_setitem_errors(ctx):
    d = cuda.device_array((3, 4))
    with pytest.raises(ValueError, match="Can't assign 3-D array to 2-D "
                                         "self"):
        d[:] = np.zeros((1, 3, 4))
    with pytest.raises(ValueError, match="Can't copy sequence with size 3 "
                                         "to array axis 1 with dimension 4"):
        d[:] = np.zeros(3)
    with pytest.raises(ValueError, match="Can't copy sequence with size 2"):
        d[1] = np.zeros(2)
    with pytest.raises(TypeError):
        del d[0]


def test_setitem_stream(ctx):
    s = Stream()
    d = cuda.device_array(6, dtype=np.int32, stream=s)
    d[:] = 4
    d.setitem(slice(0, 2), 9, stream=s)
    cuda.synchronize()
    np.testing.assert_array_equal(host(d), [9, 9, 4, 4, 4, 4])


def test_setitem_record_rows(ctx):
    d = cuda.to_device(np.zeros(3, dtype=REC))
    d[1] = (5, (1.0, 2.0), (3, 4))
    out = d.copy_to_host()
    assert out[1]["a"] == 5 and out[1]["c"]["y"] == 4
    assert out[0]["a"] == 0



def test_reshape_order_is_the_layout_of_the_view():
    """numba's rule, kept: reshape(order=) lays the new shape over the same
    bytes in that order (no copy), where NumPy reads the elements in that
    order."""
    h = np.arange(6.0).reshape(2, 3)
    d = cuda.to_device(h)
    r = d.reshape(6, order="F")
    assert r.device_ctypes_pointer.value == d.device_ctypes_pointer.value
    np.testing.assert_array_equal(r.copy_to_host(), np.arange(6.0))
    f = d.reshape((3, 2), order="F")
    assert f.strides == (8, 24)
    np.testing.assert_array_equal(
        f.copy_to_host(), np.arange(6.0).reshape((3, 2), order="F"))


def test_reshape_order_a_of_c_and_f_contiguous_array_is_f():
    """numba's rule, kept: order='A' means F whenever the array is
    F-contiguous, also when it is C-contiguous too (NumPy then takes C).
    The fuzz harness fuzz_shapes found the difference."""
    h = np.arange(4, dtype=np.uint8).reshape(1, 1, 4)
    d = cuda.to_device(h)
    assert d.is_c_contiguous() and d.is_f_contiguous()
    r = d.reshape((2, 2), order="A")
    assert r.strides == (1, 2)
    assert r.device_ctypes_pointer.value == d.device_ctypes_pointer.value
    np.testing.assert_array_equal(r.copy_to_host(), [[0, 2], [1, 3]])
    c = cuda.to_device(np.arange(6.0).reshape(2, 3))
    assert c.reshape((3, 2), order="A").strides == (16, 8)


def test_zero_itemsize_array_of_any_length_takes_no_memory():
    """numba's rule, kept: np.dtype('S0') stays zero bytes wide, so an
    array of 2**63 - 1 such elements is accepted and holds no memory
    (np.empty widens it to S1 and runs out of memory).  Found by the
    fuzz harness fuzz_shapes."""
    a = cuda.device_array(2**63 - 1, "S0")
    assert a.shape == (2**63 - 1,) and a.dtype == np.dtype("S0")
    assert a.nbytes == 0 and a.alloc_size == 0
    # The element count must still fit in intp, whatever the itemsize
    # (NumPy makes such a 'V0' array, with a size that wrapped).
    for dt in ("S0", "V0"):
        for shape in ((6, 3, 2**63 - 1), (6, 0, 2**63 - 1)):
            with pytest.raises(ValueError, match="too big"):
                cuda.device_array(shape, dt)
        assert cuda.device_array((2**62, 0), dt).size == 0
