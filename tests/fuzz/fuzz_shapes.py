# SPDX-License-Identifier: MIT
"""Fuzz the shape / strides / dtype / order arguments of the allocators
and of the layout methods, against NumPy.

Calls: ``device_array``, ``device_array_like``, ``DeviceNDArray(...)``,
``pinned_array``, ``mapped_array``, ``managed_array``, and
``reshape`` / ``view`` of a small device array.

Expected exceptions: TypeError, ValueError, IndexError, OverflowError,
NotImplementedError (numba's reshape that needs a copy), MemoryError
(CudaOutOfMemoryError is one).  A raw CudaAPIError is a finding: bad
arguments are refused before the driver is called.

Oracle (no explicit strides): what ``np.empty(shape, dtype, order=order)``
refuses, cudamem refuses too, and what it accepts gives the same shape,
strides and dtype (or an out-of-memory error).  Documented differences
from NumPy, which numba has: object dtypes are refused; the order is
only checked for ndim > 0; explicit strides are taken as given.
``reshape`` and ``view`` agree with NumPy's on the host copy: same
layout and bytes, or an exception (numba's reshape refuses a reshape that
NumPy would do by copying: NotImplementedError, and takes the new shape
only as ints, a tuple or a list: TypeError for an ndarray).
"""

import math

import numpy as np

from _common import (CLEAN, HOST_LIMIT, any_dtype, cuda, known, main,
                     pick, small_int)


def shape_arg(fdp):
    kind = fdp.ConsumeIntInRange(0, 9)
    ndim = fdp.ConsumeIntInRange(0, 4)
    if kind == 9:
        ndim = fdp.ConsumeIntInRange(5, 70)
    dims = [small_int(fdp, -2, 6) for _ in range(ndim)]
    if kind == 0:
        return small_int(fdp, -2, 40)
    if kind == 1:
        return list(dims)
    if kind == 2:
        return (np.array([max(min(x, 2**63 - 1), -2**63) for x in dims],
                         dtype=np.int64) if dims else np.int64(3))
    if kind == 3:
        return pick(fdp, (2.0, np.float32(2), "3", None, b"\x02", (2.0,),
                          (2, None), np.array([2.5]), True, (True, 2),
                          [np.int8(2), np.uint64(3)], ()))
    return tuple(dims)


def strides_arg(fdp, shape):
    kind = fdp.ConsumeIntInRange(0, 5)
    if kind <= 2:
        return None
    n = len(shape) if isinstance(shape, tuple) else 1
    if kind == 3:
        n = fdp.ConsumeIntInRange(0, 5)
    s = tuple(small_int(fdp, -24, 24) for _ in range(n))
    if kind == 5:
        return pick(fdp, (s[0] if s else 8, list(s), (), 8.0, "8"))
    return s


def has_bool(shape):
    if isinstance(shape, (bool, np.bool_)):
        return True
    try:
        return any(isinstance(x, (bool, np.bool_)) for x in shape)
    except TypeError:
        return False


def zero_itemsize(dtype):
    try:
        return np.dtype(dtype).itemsize == 0
    except Exception:
        return False


def nbytes(shape, dtype):
    try:
        dt = np.dtype(dtype)
        if isinstance(shape, (int, np.integer)):
            shape = (int(shape),)
        n = dt.itemsize
        for d in shape:
            n *= max(int(d), 0)
        return n
    except Exception:
        return 0


def numpy_empty(shape, dtype, order):
    """('ok', array-or-None) or ('raise', exc)."""
    try:
        if nbytes(shape, dtype) > HOST_LIMIT:
            # Layout only: a zero-strided view of one element checks the
            # shape without allocating; NumPy's size limit as np.empty's.
            dt = np.dtype(dtype)
            shp = tuple(int(x) for x in (
                (shape,) if isinstance(shape, (int, np.integer))
                else shape))
            np.empty(0, dt).reshape(*(0,) * len(shp))  # dtype is usable
            size = 1
            for x in shp:
                if x < 0:
                    raise ValueError("negative dimensions are not allowed")
                size *= x
            if size * max(dt.itemsize, 1) >= 2**63:
                raise ValueError("array is too big")
            return "ok", None
        return "ok", np.empty(shape, dtype, order=order)
    except Exception as e:  # NumPy's verdict, whatever its type
        return "raise", e


def check_alloc(fdp):
    shape = shape_arg(fdp)
    dtype = any_dtype(fdp)
    strides = strides_arg(fdp, shape)
    order = pick(fdp, ("C", "F", "C", "A", "K", "X", "", None, 1))
    kind = pick(fdp, ("device", "device", "ctor", "pinned", "mapped",
                      "managed"))
    if known(zero_itemsize(dtype)):
        return  # issue 17 item 9: zero-byte arrays raise CudaAPIError
    host = kind in ("pinned", "mapped", "managed")
    if host and nbytes(shape, dtype) > HOST_LIMIT and strides is None:
        return
    try:
        if kind == "device":
            r = cuda.device_array(shape, dtype, strides=strides, order=order)
        elif kind == "ctor":
            if strides is None:
                return
            r = cuda.DeviceNDArray(shape, strides, dtype)
        elif kind == "pinned":
            r = cuda.pinned_array(shape, dtype, strides=strides, order=order)
        elif kind == "mapped":
            r = cuda.mapped_array(shape, dtype, strides=strides, order=order)
        else:
            r = cuda.managed_array(shape, dtype, strides=strides,
                                   order=order)
    except CLEAN as e:
        err = e
    else:
        err = None
    if order not in ("C", "F"):
        # numba takes only 'C' and 'F', and checks the order only when it
        # computes strides of ndim > 0: any outcome but a crash is right.
        return
    if strides is not None or kind == "ctor":
        if err is None and np.dtype(dtype).subdtype is None:
            shp = (shape,) if isinstance(shape, (int, np.integer)) else shape
            assert r.shape == tuple(int(x) for x in shp), (r.shape, shape)
            assert r.dtype == np.dtype(dtype)
            assert len(r.strides) == r.ndim
        return
    verdict, ref = numpy_empty(shape, dtype, order)
    if err is not None:
        if isinstance(err, MemoryError):
            return
        if verdict == "raise":
            return
        dt = np.dtype(dtype)
        if dt.hasobject:
            return  # device memory cannot hold Python objects
        if (zero_itemsize(dtype) and ref is not None
                and "too big" in str(err)
                and math.prod(n for n in ref.shape if n) >= 2**63):
            # NumPy checks only the bytes, so a 'V0' array whose element
            # count does not fit in intp is made, with a size that wrapped
            # (np.empty((6, 3, 2**63 - 1), 'V0').size == -18); cudamem
            # refuses it as NumPy refuses the same shape in 'S0' or 'u1'
            # (whose check multiplies the dimensions other than 0, so
            # (6, 0, 2**63 - 1) is refused too).
            return
        raise AssertionError("%s(%r, %r, order=%r) raised %r; NumPy "
                             "accepts it" % (kind, shape, dtype, order, err))
    if verdict == "raise":
        if has_bool(shape):
            return  # numba takes a bool as the int it is; NumPy does not
        if known("too big" in str(ref)):
            return  # issue 17 item 10: NumPy's size limit, with a 0 dim
        if zero_itemsize(dtype) and isinstance(ref, MemoryError):
            # numba's rule: 'S0' stays zero bytes wide, so any number of
            # elements takes no memory; np.empty makes it 'S1' and cannot
            # allocate 2**63 - 1 bytes.  Not a refusal of the shape.
            return
        raise AssertionError("%s(%r, %r, order=%r) gave shape %r; NumPy "
                             "raises %r" % (kind, shape, dtype, order,
                                            r.shape, ref))
    if ref is not None and np.dtype(dtype).subdtype is not None:
        # numba keeps a subarray dtype as the element type; NumPy makes
        # its shape part of the array's.
        return
    elif ref is not None:
        assert r.shape == ref.shape, (r.shape, ref.shape)
        if zero_itemsize(dtype):
            # numba's rule, kept: the dtype is np.dtype(dtype) as given
            # ('S' is S0); NumPy's array functions make it one wide
            assert r.dtype == np.dtype(dtype), (r.dtype, dtype)
            return
        assert r.dtype == ref.dtype, (r.dtype, ref.dtype)
        if ref.size > 1 and order in ("C", "F"):
            assert r.strides == ref.strides, (r.strides, ref.strides)


def small_device(fdp):
    shape = tuple(fdp.ConsumeIntInRange(0, 5)
                  for _ in range(fdp.ConsumeIntInRange(0, 3)))
    dtype = pick(fdp, ("f4", "u1", "i8", "c16", "i2", "V3"))
    h = np.arange(int(np.prod(shape)) * np.dtype(dtype).itemsize,
                  dtype=np.uint8).view(dtype).reshape(shape)
    layout = fdp.ConsumeIntInRange(0, 3)
    if layout == 1:
        h = np.asfortranarray(h)
    elif layout == 2 and h.ndim == 2:
        h = h.T
    elif layout == 3 and h.ndim:
        h = h[..., ::-1] if h.shape[-1] else h
    return h


def check_like(fdp):
    h = small_device(fdp)
    try:
        d = cuda.to_device(h)
    except CLEAN:
        return  # to_device of a non-contiguous host array: ValueError
    for src in (h, d):
        r = cuda.device_array_like(src)
        assert r.shape == h.shape and r.dtype == h.dtype
        ref = np.empty_like(h)
        if h.ndim <= 1 or h.flags.c_contiguous or h.flags.f_contiguous:
            if h.size > 1:
                assert r.strides == ref.strides, (r.strides, ref.strides)


def check_reshape_view(fdp):
    h = small_device(fdp)
    if not (h.flags.c_contiguous or h.flags.f_contiguous):
        h = np.ascontiguousarray(h)
    d = cuda.to_device(h)
    if fdp.ConsumeBool() and d.ndim == 2:
        # numba's .T of a 2-D array is a C-contiguous copy.
        d = d.T
        h = np.ascontiguousarray(h.T)
    if fdp.ConsumeBool():
        newshape = shape_arg(fdp)
        order = pick(fdp, ("C", "F", "A", "K", "x"))
        # numba's 'A' is 'F' whenever the array is F-contiguous, NumPy's
        # only when it is F- and not C-contiguous: an array that is both
        # (one axis longer than 1, e.g. (1, 1, 4)) gets an F-layout view
        # in numba and cudamem, C in NumPy.  Compare with NumPy's reading
        # in the order numba picks.
        ref_order = order
        if order == "A":
            ref_order = "F" if h.flags.f_contiguous else "C"
        try:
            ref = h.reshape(newshape, order=ref_order)
        except Exception as e:
            ref, ref_err = None, e
        if h.size > 1 and (
                (ref_order == "F" and not h.flags.f_contiguous)
                or (ref_order == "C" and not h.flags.c_contiguous)):
            # numba's rule (FINDINGS.md 7): the order is the layout of a
            # view over the same bytes, not NumPy's reading order
            return
        try:
            r = d.reshape(newshape, order=order)
        except CLEAN as e:
            plain = isinstance(newshape, (int, tuple, list))
            if (ref is not None and plain
                    and not isinstance(e, NotImplementedError)):
                if order in ("A", "K"):
                    return  # numba takes only C and F
                raise AssertionError("reshape(%r, order=%r) of %r %r "
                                     "raised %r; NumPy gives %r"
                                     % (newshape, order, h.shape,
                                        h.strides, e, ref.shape)) from e
            return
        if ref is None and has_bool(newshape):
            return  # numba takes a bool as the int it is
        if ref is None:
            raise AssertionError("reshape(%r, order=%r) of %r gave %r; "
                                 "NumPy raises %r" % (newshape, order,
                                                      h.shape, r.shape,
                                                      ref_err))
        assert r.shape == ref.shape, (r.shape, ref.shape)
        assert np.shares_memory(ref, h) or ref.size <= 1, "numpy copied"
        out = r.copy_to_host()
        assert out.shape == ref.shape
        assert (np.ascontiguousarray(out).tobytes()
                == np.ascontiguousarray(ref).tobytes())
        return
    dtype = any_dtype(fdp)
    try:
        ref = h.view(dtype)
    except Exception as e:
        ref, ref_err = None, e
    try:
        r = d.view(dtype)
    except CLEAN:
        return  # numba's view is stricter than NumPy's (C-contiguous)
    if r.dtype.subdtype is not None:
        return  # numba keeps a subarray dtype as the element type
    if ref is None and "divisor" in str(ref_err):
        # numba's rule: the last axis's bytes divide into the new items
        # (NumPy 2 asks the new size to divide the old one).
        assert r.shape[-1] * r.dtype.itemsize == h.shape[-1] * h.itemsize
        return
    if ref is None:
        raise AssertionError("view(%r) of %r %r gave %r %r; NumPy raises "
                             "%r" % (dtype, h.shape, h.strides, r.shape,
                                     r.strides, ref_err))
    # The strides of length-1 axes mean nothing (NumPy's flags ignore
    # them), nor do any of an empty array.
    assert r.shape == ref.shape and (r.size == 0 or [
        s for n, s in zip(r.shape, r.strides, strict=True) if n > 1] == [
        s for n, s in zip(ref.shape, ref.strides, strict=True) if n > 1]), (
        r.shape, r.strides, ref.shape, ref.strides)
    if r.size and not r.dtype.hasobject:
        out = r.copy_to_host()
        assert out.tobytes() == ref.tobytes()


def TestOneInput(data):
    import atheris

    fdp = atheris.FuzzedDataProvider(data)
    what = fdp.ConsumeIntInRange(0, 3)
    if what <= 1:
        check_alloc(fdp)
    elif what == 2:
        check_like(fdp)
    else:
        check_reshape_view(fdp)


if __name__ == "__main__":
    main(TestOneInput)
