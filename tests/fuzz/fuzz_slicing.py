# SPDX-License-Identifier: MIT
"""Fuzz the keys of ``DeviceNDArray.__getitem__`` / ``__setitem__``
against NumPy on a host copy.

Expected exceptions: TypeError, ValueError, IndexError (and, for
``__setitem__``, NotImplementedError: numba's device reshape of a
non-contiguous value).  Anything else is a finding.

Oracle: cudamem indexes as NumPy does (a superset of numba's basic
indexing): NumPy and cudamem both raise, or give the same scalar / the
same result (shape and bytes; for a basic key, a view with NumPy's
strides too); an assignment leaves the same bytes.  cudamem may refuse
what NumPy takes only where numba does: an assigned value of more
dimensions than a basic key's target, and numba's device reshape of a
strided value.
"""

import numpy as np

from _common import CLEAN, cuda, main, pick, small_int

DTYPES = ("f8", "f4", "i4", "u1", "i8", "c16", "?", "i2",
          [("a", "u1"), ("b", "<f4")])


def host_array(fdp):
    shape = tuple(fdp.ConsumeIntInRange(0, 5)
                  for _ in range(fdp.ConsumeIntInRange(0, 3)))
    dtype = np.dtype(pick(fdp, DTYPES))
    n = int(np.prod(shape))
    raw = np.arange(n * dtype.itemsize, dtype=np.uint64) * 37 % 251
    h = raw.astype(np.uint8).view(dtype).reshape(shape)
    if dtype.kind == "b":
        h = (raw[:n] % 2).astype(bool).reshape(shape)
    elif dtype.kind in "fc":
        h = (np.arange(n) * 3 - 7).astype(dtype).reshape(shape)
    if fdp.ConsumeBool():
        h = np.asfortranarray(h)
    return h


def one_index(fdp, dim):
    kind = fdp.ConsumeIntInRange(0, 11)
    if kind <= 3:
        return small_int(fdp, -dim - 2, dim + 2)
    if kind <= 8:
        def bound():
            return (None if fdp.ConsumeIntInRange(0, 3) == 0
                    else small_int(fdp, -dim - 3, dim + 3))
        step = (None if fdp.ConsumeIntInRange(0, 2) == 0
                else small_int(fdp, -3, 3))
        return slice(bound(), bound(), step)
    if kind == 9:
        return np.int64(fdp.ConsumeIntInRange(-dim - 1, dim + 1))
    return pick(fdp, (None, Ellipsis, True, False, [0], np.array([0]),
                      1.0, "0", slice(0.5, 2), slice("a", None),
                      np.array(0), 2**70, -(2**70)))


def make_key(fdp, shape):
    n = fdp.ConsumeIntInRange(0, len(shape) + 1)
    dims = list(shape) + [1, 1]
    items = [one_index(fdp, dims[i]) for i in range(n)]
    form = fdp.ConsumeIntInRange(0, 3)
    if form == 0 and len(items) == 1:
        return items[0]
    if form == 1 and not items:
        return slice(None)
    return tuple(items)


def basic_view(key):
    """Whether the key is basic indexing (ints, slices, None, Ellipsis):
    a view, with NumPy's strides."""
    items = key if isinstance(key, tuple) else (key,)
    return all(k is None or k is Ellipsis or isinstance(k, slice)
               or (isinstance(k, (int, np.integer))
                   and not isinstance(k, (bool, np.bool_)))
               for k in items)


def as_bytes(a):
    a = np.ascontiguousarray(a)
    return a.tobytes()


def check_getitem(h, d, key, d_is_view=True):
    try:
        ref = h[key]
        ref_err = None
    except Exception as e:
        ref, ref_err = None, e
    try:
        r = d[key]
    except CLEAN as e:
        if ref_err is None:
            raise AssertionError("d[%r] of %r %r raised %r; NumPy gives %r"
                                 % (key, h.shape, h.strides, e, ref)) from e
        return
    if ref_err is not None:
        raise AssertionError("d[%r] of %r %r gave %r; NumPy raises %r"
                             % (key, h.shape, h.dtype, r, ref_err))
    if isinstance(r, cuda.DeviceNDArray) and not isinstance(
            ref, (np.ndarray, np.void)):
        raise AssertionError("d[%r] gave an array; NumPy a scalar" % (key,))
    if isinstance(ref, np.ndarray) and ref.ndim:
        assert isinstance(r, cuda.DeviceNDArray), (key, r)
        assert r.shape == ref.shape, (key, r.shape, ref.shape)
        if ref.size > 1 and d_is_view and basic_view(key):
            # NumPy's flags ignore the strides of length-1 axes; so do we.
            got = [s for n, s in zip(r.shape, r.strides, strict=True) if n > 1]
            want = [s for n, s in zip(ref.shape, ref.strides, strict=True)
                    if n > 1]
            assert got == want, (key, r.strides, ref.strides)
        assert as_bytes(r.copy_to_host()) == as_bytes(ref), key
    elif isinstance(ref, np.void):
        got = r.copy_to_host() if hasattr(r, "copy_to_host") else r
        assert bytes(np.asarray(got).tobytes()) == ref.tobytes(), key
    else:
        got = r.copy_to_host() if hasattr(r, "copy_to_host") else r
        assert as_bytes(np.asarray(got, dtype=h.dtype)) == as_bytes(
            np.asarray(ref, dtype=h.dtype)), (key, got, ref)


def value_for(fdp, h, key):
    try:
        target = h[key]
    except Exception:
        target = h
    tshape = np.shape(target)
    kind = fdp.ConsumeIntInRange(0, 4)
    if kind == 0:
        return h.dtype.type(fdp.ConsumeIntInRange(0, 100)) \
            if h.dtype.names is None else None
    # A value of a shape that broadcasts (or not) to the target's.
    shape = [n if fdp.ConsumeIntInRange(0, 3) else
             pick(fdp, (1, 1, 0, 2, 3)) for n in tshape]
    if fdp.ConsumeIntInRange(0, 4) == 0:
        shape = [1] + shape
    if fdp.ConsumeIntInRange(0, 3) == 0 and shape:
        shape = shape[fdp.ConsumeIntInRange(0, len(shape)):]
    n = int(np.prod(shape))
    v = (np.arange(n) % 97 + 1).astype(h.dtype).reshape(shape) \
        if h.dtype.names is None else \
        np.frombuffer(bytes(range(n * h.itemsize % 256)) * 0 +
                      bytes(n * h.itemsize), h.dtype).reshape(shape)
    if kind == 2:
        return cuda.to_device(v)
    if kind == 3 and v.ndim >= 1 and v.shape[-1] > 1:
        return v[..., ::-1]
    return v


def check_setitem(fdp, h, d, key):
    value = value_for(fdp, h, key)
    if value is None:
        return
    h2 = h.copy()
    host_value = value.copy_to_host() if isinstance(
        value, cuda.DeviceNDArray) else value
    try:
        h2[key] = host_value
        ref_err = None
    except Exception as e:
        ref_err = e
    try:
        d[key] = value
    except CLEAN as e:
        if ref_err is None:
            lhs = h[key]
            vnd = np.ndim(host_value)
            if vnd > np.ndim(lhs) and basic_view(key):
                return  # numba: "Can't assign N-D array to M-D self"
            if isinstance(e, NotImplementedError) and basic_view(key):
                return  # numba's device reshape of a strided value
            raise AssertionError("d[%r] = %r-shaped value raised %r; NumPy "
                                 "takes it" % (key, np.shape(host_value),
                                               e)) from e
        return
    if ref_err is not None:
        raise AssertionError("d[%r] = %r-shaped value worked; NumPy raises "
                             "%r" % (key, np.shape(host_value), ref_err))
    got = d.copy_to_host()
    assert as_bytes(got) == as_bytes(h2), (key, got, h2)


def TestOneInput(data):
    import atheris

    fdp = atheris.FuzzedDataProvider(data)
    h = host_array(fdp)
    d = cuda.to_device(h)
    view = True
    if fdp.ConsumeIntInRange(0, 3) == 0 and h.ndim == 2:
        # numba's .T of a 2-D array is a copy made by a transpose kernel:
        # C-contiguous, so its views' strides are not NumPy's.
        h, d, view = h.T, d.T, False
    key = make_key(fdp, h.shape)
    if fdp.ConsumeBool():
        check_getitem(h, d, key, view)
    else:
        check_setitem(fdp, h, d, key)


if __name__ == "__main__":
    main(TestOneInput)
