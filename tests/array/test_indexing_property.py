# SPDX-License-Identifier: MIT
"""NumPy's indexing on device arrays, property-based: draws a shape, a
dtype, a layout (C, F, strided, negative-strided, transposed) and an
index expression (integers, slices with any step, None, Ellipsis,
integer arrays as NumPy arrays, lists or device arrays, boolean masks on
the host or the device, boolean scalars; sometimes out of range or
malformed), then compares a read and an assignment with NumPy on the
same data: the same values, shape and dtype, or the same exception
class.

How many cases: CUDAMEM_INDEX_EXAMPLES, else 2000 on the simulator and
300 on a GPU.  With hypothesis installed the cases are drawn by it from a
fixed seed (derandomized: the same cases every run; it shrinks a failure
to a small one); without it, from Python's random with the seed
CUDAMEM_INDEX_SEED (default 0), printed on failure.
"""

import os
import random

import numpy as np

import cudamem as cuda

try:
    import hypothesis
    from hypothesis import strategies as st
except ImportError:      # the GPU machine may lack it: plain random draws
    hypothesis = None

# tests/conftest.py has chosen the backend (and set this) by now
SIMULATOR = os.environ.get("CUDAMEM_SIMULATOR", "1") not in ("0", "",
                                                          "false")
EXAMPLES = int(os.environ.get("CUDAMEM_INDEX_EXAMPLES",
                              "2000" if SIMULATOR else "300"))
SEED = int(os.environ.get("CUDAMEM_INDEX_SEED", "0"))

DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32,
          np.int64, np.uint64, np.float16, np.float32, np.float64,
          np.complex64, np.complex128]
LAYOUTS = ["C", "F", "strided", "negative", "transposed"]


class Draw:
    """The draws a case needs, over hypothesis's data or a seeded
    random.Random."""

    def __init__(self, data=None, rng=None):
        self._data = data
        self._rng = rng

    def int(self, lo, hi):
        if self._data is not None:
            return self._data.draw(st.integers(lo, hi))
        return self._rng.randint(lo, hi)

    def pick(self, seq):
        if self._data is not None:
            return self._data.draw(st.sampled_from(seq))
        return self._rng.choice(seq)

    def chance(self, p):
        """True with probability about p."""
        return self.int(0, 99) < int(p * 100)


def _values(dr, shape, dtype, rng_seed):
    """Deterministic values of a dtype for a shape."""
    rs = np.random.RandomState(rng_seed)
    v = np.asarray(rs.randint(-50, 50, size=shape))
    if np.dtype(dtype) == np.bool_:
        return np.asarray(v > 0)
    if np.dtype(dtype).kind == "u":
        v = np.abs(v)
    if np.dtype(dtype).kind == "c":
        v = v + 1j * np.asarray(rs.randint(-5, 5, size=shape))
    return np.asarray(v).astype(dtype)


def draw_array(dr):
    """(host array, device array) with the same values and layout."""
    ndim = dr.int(0, 4)
    shape = tuple(dr.pick([0, 1, 2, 3, 4, 5] if dr.chance(0.1)
                          else [1, 2, 3, 4, 5]) for _ in range(ndim))
    dtype = dr.pick(DTYPES)
    layout = dr.pick(LAYOUTS)
    seed = dr.int(0, 1 << 20)
    if layout == "strided" and ndim:
        steps = tuple(dr.int(1, 3) for _ in range(ndim))
        bshape = tuple(n * s for n, s in zip(shape, steps, strict=True))
        big = _values(dr, bshape, dtype, seed)
        key = tuple(slice(None, None, s) for s in steps)
        return big[key], cuda.to_device(big)[key]
    base = _values(dr, shape, dtype, seed)
    if layout == "F":
        base = np.asfortranarray(base)
        return base, cuda.to_device(base)
    if layout == "negative" and ndim:
        key = tuple(slice(None, None, -1) if dr.chance(0.6) else slice(None)
                    for _ in range(ndim))
        return base[key], cuda.to_device(base)[key]
    if layout == "transposed" and ndim > 1:
        t = np.ascontiguousarray(base.T)
        dt = cuda.to_device(t)
        return t.T, cuda.DeviceNDArray(t.T.shape, t.T.strides, t.dtype,
                                       gpu_data=dt.gpu_data)
    return base, cuda.to_device(base)


def _index_values(dr, n, shape):
    """An integer index array for an axis of extent n (mostly in range,
    negative too; sometimes out of range)."""
    rs = np.random.RandomState(dr.int(0, 1 << 20))
    if n == 0 or dr.chance(0.04):
        lo, hi = -n - 3, n + 3
    else:
        lo, hi = -n, n
    a = rs.randint(lo, hi, size=shape) if hi > lo else np.zeros(shape, int)
    return a.astype(dr.pick([np.int64, np.int32, np.int16, np.uint8,
                             np.uint64, np.int8]) if a.min(initial=0) >= 0
                    else dr.pick([np.int64, np.int32, np.int16, np.int8]))


def _as_given(dr, a, host_only=False):
    """An index array as the key holds it: NumPy, a list or a device
    array (host pair for NumPy, the key's element for cudamem)."""
    form = "numpy" if host_only else dr.pick(["numpy", "list", "device",
                                              "device"])
    if form == "list" and a.size:     # an empty list has no dtype
        return a, a.tolist()
    if form == "device":
        return a, cuda.to_device(a)
    return a, a


def draw_key(dr, shape):
    """(NumPy's key, cudamem's key): the same index, with index arrays
    that are device arrays on cudamem's side."""
    ndim = len(shape)
    nb = dr.int(1, 2)
    bshape = tuple(dr.int(0, 3) if dr.chance(0.1) else dr.int(1, 3)
                   for _ in range(nb))
    np_key = []
    cm_key = []
    ax = 0
    n_items = dr.int(0, ndim + 1)
    ellipsis_used = False
    advanced = dr.chance(0.7)
    if advanced:
        n_items = max(n_items, 1)
        forced = dr.int(0, n_items - 1)
    while len(np_key) < n_items:
        choices = ["int", "slice", "slice", "none"]
        if advanced:
            choices += ["intarray", "intarray", "mask", "bool"]
        if not ellipsis_used or dr.chance(0.03):
            choices.append("ellipsis")
        kind = dr.pick(choices)
        if advanced and len(np_key) == forced:
            kind = dr.pick(["intarray", "intarray", "intarray", "mask",
                            "mask", "bool"])
        n = shape[ax] if ax < ndim else 1
        if kind in ("int", "slice", "intarray") and ax >= ndim \
                and not dr.chance(0.05):
            kind = "none"
        if kind == "int":
            i = dr.int(-n - 1, n) if dr.chance(0.05) else (
                dr.int(-n, n - 1) if n else 0)
            if dr.chance(0.1):
                i = np.int64(i)
            np_key.append(i)
            cm_key.append(i)
            ax += 1
        elif kind == "slice":
            start = dr.pick([None, dr.int(-n - 2, n + 2)])
            stop = dr.pick([None, dr.int(-n - 2, n + 2)])
            step = dr.pick([None, 1, 2, 3, -1, -2, -3])
            np_key.append(slice(start, stop, step))
            cm_key.append(slice(start, stop, step))
            ax += 1
        elif kind == "none":
            np_key.append(None)
            cm_key.append(None)
        elif kind == "ellipsis":
            np_key.append(Ellipsis)
            cm_key.append(Ellipsis)
            ellipsis_used = True
            ax = max(ax, ndim - (n_items - len(np_key)))
        elif kind == "intarray":
            # a suffix of the broadcast shape, some dimensions 1
            k = dr.int(0, nb)
            ishape = tuple(1 if dr.chance(0.2) else b
                           for b in bshape[nb - k:])
            if not ishape:
                ishape = (bshape[-1],)
            a = _index_values(dr, n, ishape)
            h, c = _as_given(dr, a)
            np_key.append(h)
            cm_key.append(c)
            ax += 1
        elif kind == "mask":
            k = dr.int(1, max(1, min(2, ndim - ax)))
            mshape = tuple(shape[ax:ax + k]) if ax + k <= ndim else (1,) * k
            if dr.chance(0.05):
                mshape = tuple(m + 1 for m in mshape)
            rs = np.random.RandomState(dr.int(0, 1 << 20))
            m = rs.randint(0, 2, size=mshape).astype(bool)
            h, c = _as_given(dr, m)
            np_key.append(h)
            cm_key.append(c)
            ax += k
        else:
            b = dr.pick([True, False])
            np_key.append(b)
            cm_key.append(b)
    if len(np_key) == 1 and dr.chance(0.5):
        return np_key[0], cm_key[0]
    return tuple(np_key), tuple(cm_key)


def _result(fn):
    """fn()'s value, or its exception's class."""
    try:
        return fn(), None
    except (IndexError, ValueError, TypeError) as e:
        return None, type(e)


def _host(x):
    if isinstance(x, cuda.DeviceNDArrayBase):
        return x.copy_to_host()
    return x


def _same(got, want):
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray), type(got)
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    else:
        assert np.asarray(got).dtype == np.asarray(want).dtype
        assert got == want or (got != got and want != want)


def _is_advanced(key):
    items = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, (bool, list, np.ndarray,
                              cuda.DeviceNDArrayBase)) for k in items)


def check_case(dr):
    h, d = draw_array(dr)
    np_key, cm_key = draw_key(dr, h.shape)
    h0 = h.copy()
    # read
    want, want_exc = _result(lambda: h[np_key])
    got, got_exc = _result(lambda: _host(d[cm_key]))
    assert got_exc == want_exc, (np_key, h.shape, got_exc, want_exc)
    if want_exc is None:
        _same(got, want)
        if isinstance(want, np.ndarray) and not _is_advanced(np_key):
            # a basic index gives a view with NumPy's strides
            assert d[cm_key].strides == want.strides
    # assignment: a scalar, or an array of the result's shape (or one
    # that broadcasts to it), on the host or the device
    if want_exc is not None:
        shape = None
    else:
        shape = np.shape(want)
    if shape is None or dr.chance(0.3):
        value = _values(dr, (), h.dtype, dr.int(0, 999))[()]
        cm_value = value
    else:
        if shape and dr.chance(0.3):
            # a value that broadcasts: a suffix, with some 1s
            shape = tuple(1 if dr.chance(0.3) else n
                          for n in shape[dr.int(0, len(shape)):])
        if _is_advanced(np_key) and dr.chance(0.1):
            shape = (1,) + shape      # NumPy drops leading 1s
        value = _values(dr, shape, h.dtype, dr.int(0, 999))
        cm_value = cuda.to_device(value) if dr.chance(0.4) else value
    hw = h0.copy()

    def np_set():
        hw[np_key] = value

    got_exc = _result(lambda: d.__setitem__(cm_key, cm_value))[1]
    want_exc = _result(np_set)[1]
    assert got_exc == want_exc, (np_key, h.shape, got_exc, want_exc)
    np.testing.assert_array_equal(d.copy_to_host(), hw)


def test_random_cases_agree_with_numpy(ctx):
    if hypothesis is None:
        rng = random.Random(SEED)
        for case in range(EXAMPLES):
            try:
                check_case(Draw(rng=rng))
            except AssertionError as e:
                raise AssertionError("case %d of the cases of seed %d "
                                     "(CUDAMEM_INDEX_SEED): %s"
                                     % (case, SEED, e)) from e
        return
    ran = []

    @hypothesis.settings(
        max_examples=EXAMPLES, derandomize=True, deadline=None,
        database=None, print_blob=True,
        suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(st.data())
    def cases(data):
        ran.append(1)
        check_case(Draw(data=data))

    cases()
    assert len(ran) >= EXAMPLES
