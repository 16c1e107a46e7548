# SPDX-License-Identifier: MIT
"""to_device / copy_to_host / copy_to_device: every layout pair, sync and
async, the compatibility checks, and writes confined to the view."""

import numpy as np
import pytest

import cudamem as cuda
from cudamem.cudadrv.devicearray import auto_device

from helpers.arrays import DTYPES, Stream, host, sample
from helpers.isolation import SIMULATOR


def layouts(base):
    """Host views of base (3-D) in the layouts under test."""
    return {
        "C": base,
        "F": np.asfortranarray(base),
        "step": base[::2, :, ::2],
        "neg": base[::-1, :, ::-1],
        "perm": base.transpose(2, 0, 1),
        "zero-d": base[0, 0, 0:1].reshape(()),
        "empty": base[:0],
    }


BASE = np.arange(6 * 4 * 6, dtype=np.float64).reshape(6, 4, 6)
LAYOUTS = layouts(BASE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("order", ["C", "F"])
def test_roundtrip_dtypes(ctx, dtype, order):
    h = np.asarray(sample((3, 5), dtype), order=order)
    d = cuda.to_device(h)
    assert d.strides == h.strides and d.dtype == h.dtype
    out = d.copy_to_host()
    assert out.strides == h.strides
    assert out.tobytes() == h.tobytes()


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_to_device_any_layout(ctx, name):
    h = LAYOUTS[name]
    d = cuda.to_device(h)
    assert d.shape == h.shape
    np.testing.assert_array_equal(d.copy_to_host(), h)
    if h.flags.c_contiguous or h.flags.f_contiguous:
        assert d.strides == h.strides
    else:
        assert d.is_c_contiguous() or d.is_f_contiguous()


def test_to_device_noncontiguous_order(ctx):
    f = np.asfortranarray(np.arange(60.0).reshape(3, 4, 5))[:, ::2, :]
    assert cuda.to_device(f).is_f_contiguous()
    c = np.arange(60.0).reshape(3, 4, 5)[:, ::2, :]
    assert cuda.to_device(c).is_c_contiguous()


def test_broadcast_roundtrip(ctx):
    b = np.broadcast_to(np.arange(5.0), (3, 5))
    d = cuda.to_device(b)
    assert d.strides == (0, 8) and d.alloc_size == 40
    out = d.copy_to_host()
    assert out.strides == (0, 8)
    np.testing.assert_array_equal(out, b)
    full = cuda.device_array((3, 5))
    full.copy_to_device(b)
    np.testing.assert_array_equal(full.copy_to_host(), b)
    bf = np.broadcast_to(np.arange(3.0)[:, None], (3, 5))
    full.copy_to_device(bf)
    np.testing.assert_array_equal(full.copy_to_host(), bf)


def test_zero_stride_destination_refused(ctx):
    d = cuda.to_device(np.broadcast_to(np.arange(5.0), (3, 5)))
    with pytest.raises(ValueError, match="zero stride"):
        d.copy_to_device(np.ones((3, 5)))


def relayout(values, name):
    """values (any shape) laid out on the host as layout ``name``."""
    nd = values.ndim
    if name == "C":
        return np.ascontiguousarray(values)
    if name == "F":
        return np.asfortranarray(values)
    if name == "step":
        wide = np.zeros(tuple(2 * n for n in values.shape), values.dtype)
        out = wide[(slice(None, None, 2),) * nd]
        out[...] = values
        return out
    if name == "neg":
        flip = (slice(None, None, -1),) * nd
        return values[flip].copy()[flip]
    perm = tuple(reversed(range(nd)))
    return np.ascontiguousarray(values.transpose(perm)).transpose(perm)


NAMES = ["C", "F", "step", "neg", "perm"]


@pytest.mark.parametrize("dst_name", NAMES + ["empty"])
@pytest.mark.parametrize("src_name", NAMES)
def test_device_to_device_layouts(ctx, dst_name, src_name):
    dst_host = np.zeros_like(LAYOUTS[dst_name])
    values = np.arange(dst_host.size, dtype=np.float64)
    src = relayout(values.reshape(dst_host.shape), src_name)
    dsrc = cuda.to_device(src)
    ddst = cuda.device_array_like(relayout(dst_host, dst_name))
    ddst.copy_to_device(dsrc)
    np.testing.assert_array_equal(ddst.copy_to_host(), src)
    back = relayout(np.zeros_like(src), dst_name)
    dsrc.copy_to_host(back)
    np.testing.assert_array_equal(back, src)


@pytest.mark.parametrize("view", [
    (slice(None, None, 2), slice(None), slice(1, None, 2)),
    (slice(None, None, -1), slice(None, None, 2), slice(None)),
    (1, slice(None, None, -3), slice(None)),
    (slice(1, 5), slice(None), slice(None, None, -2)),
])
@pytest.mark.parametrize("src_name", ["C", "F", "neg", "step"])
@pytest.mark.parametrize("stream", [False, True])
def test_strided_copies_touch_only_the_view(ctx, view, src_name, stream):
    big = np.full((6, 4, 6), -1.0)
    dbig = cuda.to_device(big)
    target = dbig[view]
    hv = big[view]
    src = np.asarray(np.arange(hv.size, dtype=np.float64).reshape(hv.shape),
                     order="F" if src_name == "F" else "C")
    if src_name == "neg":
        src = src[::-1].copy()[::-1]
    elif src_name == "step":
        wide = np.zeros(tuple(2 * n for n in hv.shape))
        src = wide[tuple(slice(None, None, 2) for _ in hv.shape)]
        src[...] = np.arange(hv.size).reshape(hv.shape)
    s = Stream() if stream else 0
    target.copy_to_device(src, stream=s)  # host -> strided device view
    cuda.synchronize()
    expect = big.copy()
    expect[view] = src
    np.testing.assert_array_equal(dbig.copy_to_host(stream=0), expect)
    # device view -> host view of another layout, only the view written
    host_big = np.full((6, 4, 6), -7.0)
    host_view = host_big[view]
    target.copy_to_host(host_view, stream=s)
    cuda.synchronize()
    expect_host = np.full((6, 4, 6), -7.0)
    expect_host[view] = src
    np.testing.assert_array_equal(host_big, expect_host)
    # device strided view -> device strided view
    other = cuda.to_device(np.full((6, 4, 6), -2.0))
    other[view].copy_to_device(target, stream=s)
    cuda.synchronize()
    expect_other = np.full((6, 4, 6), -2.0)
    expect_other[view] = src
    np.testing.assert_array_equal(other.copy_to_host(stream=0),
                                  expect_other)


def test_four_d_strided_views(ctx):
    z = cuda.device_array((8, 8, 8, 8))
    z.copy_to_device(np.zeros((8, 8, 8, 8)))
    v = z[::2, ::2, ::-2, ::2]
    src = np.arange(256.0).reshape(4, 4, 4, 4)
    v.copy_to_device(src)
    np.testing.assert_array_equal(v.copy_to_host(), src)
    whole = z.copy_to_host()
    assert (whole[1::2] == 0).all()
    w = cuda.device_array((4, 4, 4, 4), order="F")
    w.copy_to_device(v)
    np.testing.assert_array_equal(w.copy_to_host(), src)


def test_copy_to_host_negative_strides_gives_c(ctx):
    d = cuda.to_device(np.arange(12.0).reshape(3, 4))[::-1, ::-1]
    out = d.copy_to_host()
    assert out.flags.c_contiguous
    np.testing.assert_array_equal(out, np.arange(12.0).reshape(3, 4)[::-1,
                                                                      ::-1])


def test_copy_to_host_strided_keeps_strides(ctx):
    d = cuda.to_device(np.arange(24.0).reshape(4, 6))[:, ::2]
    out = d.copy_to_host()
    assert out.strides == d.strides and out.flags.writeable
    np.testing.assert_array_equal(out, np.arange(24.0).reshape(4, 6)[:, ::2])


def test_compatibility_errors(ctx):
    d = cuda.device_array((5, 5, 5))
    # numba's words (and exception types), then which is which.
    with pytest.raises(TypeError, match=r"^incompatible dtype: float64 vs\. "
                                        r"float32 \(the device array vs\. "
                                        r"the source\)$"):
        d.copy_to_device(np.zeros((5, 5, 5), np.float32))
    with pytest.raises(ValueError, match=r"^incompatible shape: \(5, 5, 5\) "
                                         r"vs\. \(5, 5\) \(the device "
                                         r"array vs\. the source\)$"):
        d.copy_to_device(np.zeros((5, 5)))
    with pytest.raises(ValueError, match=r"^incompatible shape: \(5, 5, 5\) "
                                         r"vs\. \(5, 5, 4\) \(the device "
                                         r"array vs\. the destination\)$"):
        d.copy_to_host(np.zeros((5, 5, 4)))
    with pytest.raises(TypeError, match=r"^incompatible dtype: float64 vs\. "
                                        r"int32 \(the device array vs\. the "
                                        r"destination\)$"):
        d.copy_to_host(np.zeros((5, 5, 5), np.int32))
    with pytest.raises(TypeError, match=r"incompatible dtype: float64 vs\. "
                                        r"int64 \(the device array vs\. the "
                                        r"source\)"):
        d.copy_to_device(cuda.device_array((5, 5, 5), np.int64))
    with pytest.raises(TypeError):
        d.copy_to_host([1, 2])
    ro = np.zeros((5, 5, 5))
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        d.copy_to_host(ro)
    # size-1 dimensions are ignored
    e = cuda.device_array((1, 5))
    e.copy_to_device(np.arange(5.0))
    np.testing.assert_array_equal(e.copy_to_host(np.zeros(5)),
                                  np.arange(5.0))
    # zero-size copies skip every check
    cuda.device_array((0, 3)).copy_to_device(np.zeros((3, 0), np.int8))


def test_c_to_f_device_copy(ctx):
    c = cuda.to_device(np.arange(125.0).reshape(5, 5, 5))
    f = cuda.device_array((5, 5, 5), order="F")
    f.copy_to_device(c)
    np.testing.assert_array_equal(f.copy_to_host(),
                                  np.arange(125.0).reshape(5, 5, 5))


def test_to_device_mixed_list_is_numpys_array(ctx):
    # As in numba (its auto_device passes a list through np.array):
    # [1, 'a', 2.0] becomes NumPy's array of str ('<U32'), a device array
    # of that dtype, and comes back as the same strings.
    host = np.array([1, "a", 2.0])
    d = cuda.to_device([1, "a", 2.0])
    assert d.dtype == host.dtype and d.dtype.kind == "U"
    assert d.shape == (3,)
    np.testing.assert_array_equal(d.copy_to_host(), host)
    assert list(d.copy_to_host()) == ["1", "a", "2.0"]
    # A list NumPy can only hold as objects is refused (numba would put
    # the objects' addresses on the device).
    with pytest.raises(TypeError, match="Python objects"):
        cuda.to_device([1, None])


def test_to_device_passthrough_and_to(ctx):
    d = cuda.device_array(3)
    assert cuda.to_device(d) is d
    out = cuda.to_device(np.arange(3.0), to=d)
    assert out is d
    np.testing.assert_array_equal(d.copy_to_host(), np.arange(3.0))
    cuda.to_device(np.zeros(3), to=d, copy=False)
    np.testing.assert_array_equal(d.copy_to_host(), np.arange(3.0))
    e = cuda.to_device(np.arange(4.0), copy=False)
    assert e.shape == (4,)
    assert cuda.to_device([1, 2, 3]).dtype == np.int64
    assert cuda.to_device(2.5).shape == ()
    assert cuda.to_device(range(4)).copy_to_host().tolist() == [0, 1, 2, 3]
    assert cuda.to_device("abc").dtype == np.dtype("<U3")
    ro = np.arange(3)
    ro.flags.writeable = False
    assert cuda.to_device(ro).copy_to_host().tolist() == [0, 1, 2]
    with pytest.raises(TypeError):
        cuda.to_device(np.arange(3), stream=5)


def test_auto_device(ctx):
    d = cuda.device_array(3)
    assert auto_device(d) == (d, False)
    a, copied = auto_device(np.arange(3))
    assert copied and isinstance(a, cuda.DeviceNDArray)


@pytest.mark.parametrize("dtype", [np.int32, np.float64, np.complex64])
def test_async_copies(ctx, dtype):
    s = Stream()
    h = sample((64, 33), dtype)
    d = cuda.to_device(h, stream=s)
    assert d.stream is s
    out = d.copy_to_host()  # asynchronous on the bound stream
    cuda.synchronize()
    np.testing.assert_array_equal(out, h)
    dst = np.zeros_like(h)
    d.copy_to_host(dst, stream=s)
    cuda.synchronize()
    np.testing.assert_array_equal(dst, h)
    e = cuda.device_array_like(h, stream=s)
    e.copy_to_device(d)
    cuda.synchronize()
    np.testing.assert_array_equal(host(e), h)


def test_oom_is_memory_error(ctx, simulator):
    if not simulator:
        pytest.skip("fills device memory only on the simulator")
    free, total = ctx.get_memory_info()
    with pytest.raises(MemoryError):
        cuda.device_array(total + 1, dtype=np.uint8)


@pytest.mark.sim
def test_small_to_device_returns_before_the_data_lands():
    """As the driver's synchronous copy of pageable memory: to_device of
    a small array returns once the host bytes are taken, before they
    land on the device; work on the default stream (and cuda.synchronize())
    comes after them.  The simulator slows each device operation by
    CUDAMEM_SIM_DELAY_US, so the landing is late enough to see."""
    from helpers import run_child

    p = run_child("""
        import time
        import numpy as np
        import cudamem as cuda
        cuda.current_context()
        h = np.arange(64, dtype=np.float32)
        t0 = time.perf_counter()
        d = cuda.to_device(h)
        h[:] = -1                       # the bytes were taken: no effect
        returned = time.perf_counter() - t0
        t0 = time.perf_counter()
        cuda.synchronize()
        landed = time.perf_counter() - t0
        assert (d.copy_to_host() == np.arange(64, dtype=np.float32)).all()
        print(returned, landed)
    """, env={"CUDAMEM_SIM_DELAY_US": "400000"})
    returned, landed = map(float, p.stdout.split())
    assert returned < 0.2 and landed > 0.2, (returned, landed)


def test_device_to_device_and_memset_return_before_they_run():
    """As the driver, which makes no host-side synchronisation for them:
    a synchronous copy between device arrays and a synchronous memset of
    device memory return before they have run, their work on the default
    stream; a copy into the host (managed memory included) waits.  On the
    simulator, slowed by CUDAMEM_SIM_DELAY_US so that it shows; on a GPU
    the bytes are checked only."""
    from helpers import run_child

    p = run_child("""
        import time
        import numpy as np
        import cudamem as cuda
        sim = %r
        a = cuda.to_device(np.arange(64, dtype=np.float32))
        b = cuda.device_array(64, np.float32)
        cuda.synchronize()
        t0 = time.perf_counter()
        b.copy_to_device(a)
        b.gpu_data.memset(0, 4)          # the first element's bytes
        returned = time.perf_counter() - t0
        m = cuda.managed_array(64, np.float32)
        b.copy_to_host(m)                # waits for both, then lands
        want = np.arange(64, dtype=np.float32)
        want[0] = 0
        print(bool((np.asarray(m) == want).all()),
              returned < 0.2 if sim else True)
    """ % SIMULATOR, env={"CUDAMEM_SIM_DELAY_US": "300000"})
    assert p.stdout.split() == ["True", "True"], p.stdout


class _PopsContext:
    """A stream (the legacy default stream, by handle) or a host source
    whose protocol method pops the current context first."""

    def __init__(self, values=None):
        self.values = values

    def _pop(self):
        cuda.current_context().pop()

    def __cuda_stream__(self):
        self._pop()
        return (0, 1)                    # CU_STREAM_LEGACY

    def __array__(self, dtype=None, copy=None):
        self._pop()
        return self.values


def test_copies_make_the_context_current_after_python_code(ctx):
    """copy_to_device / copy_to_host make the array's context current
    again when Python code ran after they made it so (a stream's
    __cuda_stream__, a source's __array__), which may have changed it;
    plain arguments run none, and no context query is repeated."""
    h = np.arange(64, dtype=np.float32)
    d = cuda.device_array(64, np.float32)
    d.copy_to_device(_PopsContext(h))
    assert cuda.current_context() is ctx
    out = np.zeros_like(h)
    d.copy_to_host(out, stream=_PopsContext())
    cuda.synchronize()
    np.testing.assert_array_equal(out, h)
    assert cuda.current_context() is ctx
    d.copy_to_device(h * 2, stream=_PopsContext())
    np.testing.assert_array_equal(d.copy_to_host(stream=_PopsContext()),
                                  h * 2)
    assert cuda.current_context() is ctx


class _Tagged(np.ndarray):
    """An ndarray subclass with nothing of its own."""


@pytest.mark.parametrize("kind", ["subclass", "subclass view", "memmap"])
def test_copy_to_device_from_ndarray_subclasses(ctx, kind, tmp_path):
    # copy_to_device takes an ndarray (subclasses too) as it is; its data,
    # contiguous or strided, is what lands.
    base = np.arange(48, dtype=np.float32).reshape(6, 8)
    if kind == "memmap":
        src = np.memmap(tmp_path / "a.bin", dtype=np.float32, mode="w+",
                        shape=(6, 8))
        src[:] = base
    elif kind == "subclass":
        src = base.view(_Tagged)
    else:
        src = base.view(_Tagged)[::2, 1::3]
    d = cuda.device_array(src.shape, np.float32)
    d.copy_to_device(src)
    assert (d.copy_to_host() == np.asarray(src)).all()
    s = cuda.stream()
    d2 = cuda.device_array(src.shape, np.float32, stream=s)
    d2.copy_to_device(src, stream=s)
    s.synchronize()
    assert (d2.copy_to_host() == np.asarray(src)).all()
