# SPDX-License-Identifier: MIT
"""NumPy's indexing on device arrays, case by case: basic indexing with
``...`` and ``None`` (views), advanced indexing with host and device
index arrays and masks (gathers and scatters), NumPy's errors, streams,
and the internal kernels' source compiling for the H200.  The property
test beside this file compares drawn cases with NumPy."""

import ctypes
import os

import numpy as np
import pytest

import cudamem as cuda
from cudamem import _core


def _host(x):
    return x.copy_to_host() if isinstance(x, cuda.DeviceNDArrayBase) else x


@pytest.fixture
def pair(ctx):
    h = np.arange(60.0).reshape(3, 4, 5)
    return h, cuda.to_device(h)


# -- basic indexing: views --------------------------------------------------


@pytest.mark.parametrize("key", [
    Ellipsis, (Ellipsis, 0), (0, Ellipsis), (None,), (None, 1, None),
    (slice(None), None, slice(None, None, -2)), (Ellipsis, None),
    (1, Ellipsis, slice(3, 0, -1)), (), (slice(None), Ellipsis, 2),
    (-1, None, -1), (slice(2, 2),), (slice(None, None, -1), None, 0, 1),
])
def test_basic_keys_are_views_with_numpys_layout(pair, key):
    h, d = pair
    v = d[key]
    assert isinstance(v, cuda.DeviceNDArray)
    assert v.shape == h[key].shape and v.strides == h[key].strides
    np.testing.assert_array_equal(v.copy_to_host(), h[key])
    # a view: writes through it land in the array
    v[...] = -1
    h2 = h.copy()
    h2[key] = -1
    np.testing.assert_array_equal(d.copy_to_host(), h2)


def test_ellipsis_on_zero_d_and_scalars(ctx):
    d = cuda.to_device(np.asarray(2.5))
    assert d[()] == 2.5 and isinstance(d[()], np.float64)
    assert isinstance(d[...], cuda.DeviceNDArray) and d[...].shape == ()
    assert d[None].shape == (1,)
    d[...] = 4.0
    assert d[()] == 4.0
    e = cuda.to_device(np.arange(3))
    assert e[0, ...].shape == () and isinstance(e[0, ...],
                                                cuda.DeviceNDArray)
    assert isinstance(e[np.int64(2)], np.int64)


def test_basic_errors_are_numpys(pair):
    h, d = pair
    cases = [
        ((0, 0, 0, 0), IndexError, "too many indices for array: array is "
         "3-dimensional, but 4 were indexed"),
        ((Ellipsis, Ellipsis), IndexError, "an index can only have a "
         "single ellipsis"),
        ((0, 4), IndexError, "index 4 is out of bounds for axis 1 with "
         "size 4"),
        ((-4,), IndexError, "index -4 is out of bounds for axis 0"),
        ((1.0,), IndexError, "only integers, slices"),
        (("a",), IndexError, "only integers, slices"),
        ((slice(None, None, 0),), ValueError, "slice step cannot be zero"),
        ((2 ** 70,), IndexError, None),
    ]
    for key, exc, msg in cases:
        with pytest.raises(exc) as np_info:
            h[key]
        with pytest.raises(exc, match=msg) as info:
            d[key]
        assert type(info.value) is type(np_info.value)


# -- advanced indexing: reads ------------------------------------------------


def _keys(h):
    m = h[:, :, 0] > 20
    return [
        [2, 0],
        ([0, 2], [1, 3]),
        (slice(None), [0, 0, 3]),
        (0, slice(None), [1, -1]),          # separated: B goes first
        (slice(None), [[0], [2]], [1, 3]),
        (Ellipsis, [4, 0]),
        (np.array([[True, False, True]]).T[:, 0],),
        (m,),
        (m, 3),
        (h > 30,),
        (True,),
        (slice(1, None), False),
        (None, [1], None, [2]),
        ([], slice(None)),
        (np.array([-1, 0], dtype=np.int8), np.array([3], dtype=np.uint64)),
        (np.array(1), slice(None), np.array(2)),   # 0-d arrays: a copy
    ]


def test_advanced_reads_match_numpy(pair):
    h, d = pair
    for key in _keys(h):
        got = d[key]
        want = h[key]
        assert isinstance(got, cuda.DeviceNDArray), key
        assert got.flags["C_CONTIGUOUS"]
        assert got.shape == want.shape and got.dtype == want.dtype, key
        np.testing.assert_array_equal(got.copy_to_host(), want)


def test_device_index_arrays_and_masks(pair):
    h, d = pair
    idx = np.array([[2, -3], [0, 1]])
    np.testing.assert_array_equal(d[cuda.to_device(idx)].copy_to_host(),
                                  h[idx])
    np.testing.assert_array_equal(
        d[1, cuda.to_device(np.array([3, 0])), 1:].copy_to_host(),
        h[1, [3, 0], 1:])
    m = h > 33
    np.testing.assert_array_equal(d[cuda.to_device(m)].copy_to_host(), h[m])
    m2 = h[0] % 3 == 0
    np.testing.assert_array_equal(
        d[:, cuda.to_device(m2)].copy_to_host(), h[:, m2])
    # a device mask that selects nothing
    z = cuda.to_device(np.zeros(h.shape, bool))
    assert d[z].shape == (0,)
    # a mask through the CUDA Array Interface only
    class Foreign:
        def __init__(self, a):
            self.a = a
            self.__cuda_array_interface__ = a.__cuda_array_interface__

    np.testing.assert_array_equal(
        d[Foreign(cuda.to_device(m))].copy_to_host(), h[m])
    np.testing.assert_array_equal(
        d[Foreign(cuda.to_device(idx))].copy_to_host(), h[idx])


def _mask_offsets_want(mask_bytes, astrides):
    """The byte offsets _ix_mask must give: the nonzero elements of the
    mask (any nonzero byte is true) in C order, dotted with astrides."""
    nz = np.nonzero(mask_bytes)
    off = np.zeros(len(nz[0]) if nz else 0, np.int64)
    for ix, st in zip(nz, astrides, strict=True):
        off += ix.astype(np.int64) * st
    return off


def _mask_cases(rng):
    """(host mask as bool, device mask, astrides): sizes about the kernels'
    16-element shares and 4096-element chunks, past 256 chunks (the scan
    kernel's runs), views whose start is not 16-byte aligned, strided,
    reversed and Fortran-ordered masks, array strides that merge with
    the mask's axes and strides that do not."""
    for n in (1, 15, 16, 17, 4095, 4096, 4097, 3 * 4096 + 5, 100_003):
        for p in (0.0, 1.0, 0.5, 0.01):
            h = rng.random(n) < p
            yield h, cuda.to_device(h), (4,)
    big = rng.random(257 * 4096 + 33) < 0.3
    yield big, cuda.to_device(big), (8,)
    base = rng.random(40_000) < 0.5
    dbase = cuda.to_device(base)
    for view in (slice(3, None), slice(16, None), slice(None, None, 2),
                 slice(None, None, -1), slice(5, -7, 3)):
        yield base[view], dbase[view], (2,)
    m2 = rng.random((300, 70)) < 0.4
    yield m2, cuda.to_device(m2), (70 * 8, 8)       # merges to one axis
    yield m2, cuda.to_device(m2), (80 * 8, 8)       # does not merge
    yield m2, cuda.to_device(m2), (-8, 300 * 8)     # any strides
    f = np.asfortranarray(m2)
    yield f, cuda.to_device(f), (70 * 4, 4)
    m3 = rng.random((9, 1, 33, 17)) < 0.5
    d3 = cuda.to_device(m3)
    yield m3, d3, (33 * 17 * 4, 4, 17 * 4, 4)
    yield m3[::-2, :, 1::4], d3[::-2, :, 1::4], (100, 7, 3, 1)
    one = np.ones((1, 1), bool)
    yield one, cuda.to_device(one), (12, 4)


def test_mask_offsets_match_numpy(ctx):
    """_core._ix_mask, the first stage of d[mask] on a device mask, gives
    NumPy's nonzero positions as byte offsets for every layout."""
    rng = np.random.default_rng(7)
    stream = _core.default_stream()
    for h, d, ast in _mask_cases(rng):
        got = _core._ix_mask(d, ast, stream).copy_to_host()
        want = _mask_offsets_want(h, ast)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, want, err_msg=(
            "mask shape %s strides %s astrides %s"
            % (h.shape, d.strides, ast)))


def test_mask_bytes_other_than_one_are_true(ctx):
    """A bool mask's byte that is neither 0 nor 1 (from a view of other
    bytes) is true, in the kernels' 16-byte loads as in NumPy."""
    raw = np.zeros(4096 * 2 + 48, np.uint8)
    pattern = np.array([1, 2, 0x7F, 0x80, 0xFF, 0x10, 0x01, 0x40], np.uint8)
    raw[::3] = np.resize(pattern, len(raw[::3]))
    h = raw.view(bool)
    d = cuda.to_device(h)
    got = _core._ix_mask(d, (1,), _core.default_stream()).copy_to_host()
    np.testing.assert_array_equal(got, np.nonzero(raw)[0])
    vals = np.arange(len(raw), dtype=np.float32)
    np.testing.assert_array_equal(cuda.to_device(vals)[d].copy_to_host(),
                                  vals[raw != 0])


def test_large_device_mask_reads_and_writes(ctx):
    """d[mask] and d[mask] = v with a device mask of many chunks, against
    NumPy, for a contiguous and a strided array."""
    rng = np.random.default_rng(11)
    h = rng.standard_normal((513, 300)).astype(np.float32)
    m = rng.random(h.shape) < 0.37
    d = cuda.to_device(h)
    dm = cuda.to_device(m)
    np.testing.assert_array_equal(d[dm].copy_to_host(), h[m])
    sv = d[:, ::-2]
    np.testing.assert_array_equal(
        sv[cuda.to_device(m[:, ::-2].copy())].copy_to_host(),
        h[:, ::-2][m[:, ::-2]])
    d[dm] = 5.0
    h2 = h.copy()
    h2[m] = 5.0
    np.testing.assert_array_equal(d.copy_to_host(), h2)


def test_layouts_and_dtypes(ctx):
    base = np.arange(2 * 6 * 8, dtype=np.int16).reshape(2, 6, 8)
    d = cuda.to_device(base)
    for view in (slice(None), (slice(None, None, -1), slice(1, None, 2)),
                 (1, slice(None, None, -3))):
        h = base[view]
        v = d[view]
        for key in ([1, 0], (Ellipsis, [0, -1]), (h > 40,)):
            if isinstance(key, tuple) and isinstance(key[0], np.ndarray) \
                    and key[0].shape != h.shape:
                continue
            np.testing.assert_array_equal(v[key].copy_to_host(), h[key])
    f = np.asfortranarray(np.arange(12, dtype=np.complex64).reshape(3, 4))
    df = cuda.to_device(f)
    np.testing.assert_array_equal(df[[2, 0], 1:].copy_to_host(),
                                  f[[2, 0], 1:])
    rec = np.zeros(5, [("a", "u1"), ("b", "<f8")])
    rec["a"] = np.arange(5)
    rec["b"] = np.arange(5) * 1.5
    dr = cuda.to_device(rec)
    got = dr[[4, 1]].copy_to_host()
    assert got.tobytes() == rec[[4, 1]].tobytes()


def test_result_stream_and_memory(ctx):
    s = cuda.stream()
    h = np.arange(10.0)
    d = cuda.to_device(h, stream=s)
    s.synchronize()       # t is not ordered after s
    r = d[[3, 1]]
    assert r.stream is s
    assert r.gpu_data is not d.gpu_data          # a copy
    t = cuda.stream()
    r2 = d.getitem([0, 9], stream=t)
    assert r2.stream is t
    np.testing.assert_array_equal(r2.copy_to_host(stream=t), h[[0, 9]])
    t.synchronize()
    np.testing.assert_array_equal(r.copy_to_host(), h[[3, 1]])


# -- advanced indexing: assignment -------------------------------------------


def test_advanced_assignment_matches_numpy(pair):
    h, d = pair
    cases = [
        ([0, 2], 7.0),
        (([0, 2], [1, 3]), np.array([[1.5], [2.5]])),
        ((slice(None), [0, 0, 3]), np.arange(3 * 3 * 5).reshape(3, 3, 5)),
        ((0, slice(None), [1, -1]), np.array([[9.0], [8.0]])),
        ((h > 50,), -2.0),
        ((h[:, :, 0] > 20, 2),
         np.arange(float(np.count_nonzero(h[:, :, 0] > 20)))),
        (([[0], [2]], [1, 3]), np.arange(4.0).reshape(2, 2, 1)),
        ((True,), np.ones((1, 4, 5))),
    ]
    for key, value in cases:
        want = h.copy()
        want[key] = value
        d.copy_to_device(h)
        d[key] = value
        np.testing.assert_array_equal(d.copy_to_host(), want)


def test_repeated_positions_write_the_last_value(ctx):
    h = np.zeros(6)
    d = cuda.to_device(h)
    idx = np.array([1, 4, 1, 1, 4])
    vals = np.arange(1.0, 6.0)
    h[idx] = vals
    d[idx] = vals
    np.testing.assert_array_equal(d.copy_to_host(), h)
    d2 = cuda.to_device(np.zeros(6))
    d2[cuda.to_device(idx)] = cuda.to_device(vals)
    np.testing.assert_array_equal(d2.copy_to_host(), h)
    h2 = np.zeros((3, 3))
    d3 = cuda.to_device(h2)
    key = ([0, 0, 2], [1, 1, 0])
    h2[key] = [5.0, 6.0, 7.0]
    d3[key] = [5.0, 6.0, 7.0]
    np.testing.assert_array_equal(d3.copy_to_host(), h2)


def test_assignment_values(ctx):
    h = np.arange(8, dtype=np.int32)
    d = cuda.to_device(h)
    # a device value of another dtype is cast; an overlapping one is read
    # before anything is written, as NumPy does
    d[[0, 1]] = cuda.to_device(np.array([1.9, -2.9]))
    h[[0, 1]] = np.array([1.9, -2.9]).astype(np.int32)
    d[[2, 3, 4]] = d[1:4]
    h[[2, 3, 4]] = h[1:4].copy()
    np.testing.assert_array_equal(d.copy_to_host(), h)
    d[cuda.to_device(h > 3)] = cuda.to_device(np.array([100], np.int32))
    h[h > 3] = 100
    np.testing.assert_array_equal(d.copy_to_host(), h)


def test_assignment_on_a_stream(ctx):
    s = cuda.stream()
    h = np.arange(1000.0)
    d = cuda.to_device(h, stream=s)
    idx = np.arange(0, 1000, 7)[:-1]
    m = h > 500
    for k in range(3):
        d[idx] = cuda.to_device(np.full(idx.size, float(k)), stream=s)
        d[idx[::2]] = d[idx[1::2]]
        h[idx] = k
        h[idx[::2]] = h[idx[1::2]]
    d[cuda.to_device(m, stream=s)] = -1.0
    h[m] = -1.0
    np.testing.assert_array_equal(d.copy_to_host(stream=s), h)
    s.synchronize()


# -- errors ------------------------------------------------------------------


def test_advanced_errors_are_numpys(pair):
    h, d = pair
    cases = [
        ([3],), ([0, -4],), ((0, [5]),),
        (np.array([0.5]),), (np.ones((3, 5), bool),),
        ([[0, 1], [0, 1, 2]],), (([0, 1], [0, 1, 2]),),
        ((0, 0, 0, [0]),), ((Ellipsis, [0], Ellipsis),),
        ([0, None],),
    ]
    for (key,) in cases:
        with pytest.raises(Exception) as np_info:
            h[key]
        with pytest.raises(type(np_info.value)):
            d[key]
        with pytest.raises(type(np_info.value)):
            d[key] = 0
    with pytest.raises(ValueError, match="shape mismatch: value array of "
                       "shape"):
        d[[0, 1]] = np.ones((3, 4, 5))
    with pytest.raises(TypeError, match="requires a 0 or 1-dimensional"):
        d[h > 3] = np.ones((1, 1))
    with pytest.raises(ValueError, match="cannot assign 2 input values"):
        d[h > 3] = np.ones(2)
    np.testing.assert_array_equal(d.copy_to_host(), h)   # untouched


def test_device_index_out_of_range_is_an_index_error(pair):
    h, d = pair
    bad = cuda.to_device(np.array([0, 1, 7, 2]))
    with pytest.raises(IndexError, match="index 7 is out of bounds for "
                       "axis 0 with size 3"):
        d[bad]
    with pytest.raises(IndexError, match="index -9 is out of bounds for "
                       "axis 1 with size 4"):
        d[0, cuda.to_device(np.array([-9]))]
    big = cuda.to_device(np.array([2 ** 63 + 5], dtype=np.uint64))
    with pytest.raises(IndexError):
        d[big]
    with pytest.raises(IndexError, match="index 7 is out of bounds"):
        d[bad] = 1.0
    s = cuda.stream()
    with pytest.raises(IndexError):
        d.getitem(bad, stream=s)
    # nothing was written, and the array and its context still work
    np.testing.assert_array_equal(d.copy_to_host(), h)
    np.testing.assert_array_equal(d[cuda.to_device(np.array([2]))]
                                  .copy_to_host(), h[[2]])


def test_internal_entry_points_refuse_bad_arguments(pair):
    h, d = pair
    out = cuda.device_array(4)
    idx = cuda.to_device(np.arange(4))
    src = ((7, idx, 3, 0, 160, (8,)),)
    with pytest.raises(TypeError):
        _core._ix_run(h, out, 0, (4,), (0,), (8,), 0, src, False, False,
                      None)
    with pytest.raises(ValueError):
        _core._ix_run(d, out, 0, (4,), (0, 0), (8,), 0, src, False, False,
                      None)
    with pytest.raises(TypeError, match="type is not its dtype"):
        _core._ix_run(d, out, 0, (4,), (0,), (8,), 0,
                      ((5, idx, 3, 0, 160, (8,)),), False, False, None)
    with pytest.raises(ValueError, match="B dimensions"):
        _core._ix_run(d, out, 0, (4,), (0,), (8,), 1, src, False, False,
                      None)
    with pytest.raises(ValueError):
        _core._ix_mask(idx, (8,), None)      # not a boolean mask


# -- the kernels compile for the GPU -----------------------------------------


def _nvrtc():
    roots = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")]
    for root in [r for r in roots if r] + ["/usr/local/cuda"]:
        for sub in ("lib64", "lib"):
            path = os.path.join(root, sub, "libnvrtc.so")
            if os.path.exists(path):
                return ctypes.CDLL(path)
    for name in ("libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    pytest.skip("NVRTC is not installed here")


@pytest.mark.parametrize("arch", ["sm_90", "sm_75"])
def test_index_kernels_compile(arch):
    """The indexing kernels' source compiles with NVRTC for the H200
    (sm_90) and an older architecture, whatever the backend here."""
    lib = _nvrtc()
    src = _core._ix_source().encode()
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src,
                                  b"cudamem_index.cu", 0, None, None) == 0
    opts = [b"--std=c++17", b"-default-device",
            b"--gpu-architecture=" + arch.encode()]
    rc = lib.nvrtcCompileProgram(prog, len(opts),
                                 (ctypes.c_char_p * len(opts))(*opts))
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(max(n.value, 1))
    lib.nvrtcGetProgramLog(prog, log)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    if rc != 0 and b"invalid value for --gpu-architecture" in log.value:
        pytest.skip("this NVRTC does not target %s" % arch)
    assert rc == 0, log.value.decode()
