# SPDX-License-Identifier: MIT
"""NumPy's advanced indexing on device arrays (numba's DeviceNDArray
takes only integers and slices; cudamem takes what NumPy takes).

C handles every basic index itself (integers, slices, ``...``, ``None``:
a view).  A key with an integer or boolean array (a NumPy array, a list,
a device array or any object with ``__cuda_array_interface__``) or a
boolean scalar comes here: the key is planned with NumPy's rules on the
host (which dimensions the index arrays take, where the broadcast index
dimensions go, NumPy's errors), then one internal kernel
(``_core._ix_run``) gathers the result or scatters the value on the
array's stream.

Host index arrays are checked and combined into one array of byte
offsets here, then uploaded.  Integer indices held on the device are
read by the kernel, which checks each against its axis; a bad one is
reported after the kernel ran, so such a read waits for its stream.  A
boolean mask held on the device is turned into offsets on the device
(``_core._ix_mask``); the count of its true elements fixes the result's
shape, and reading it back is the one host synchronisation it costs.

Assignments write each element once: where the index arrays repeat a
position, the last value (in NumPy's order) is the one written, as in
NumPy, because repeated positions are resolved on the host before the
kernel runs (device-held indices of an assignment are read back for
that, except a lone device mask, whose positions never repeat).
"""

import math
import operator

import numpy as np

from . import _core

__all__ = []

_OFF_ARRAY = 20      # a source of int64 byte offsets into the array
_OFF_OTHER = 21      # ... into the other side (result or value)
_MAXDIM = 32         # iteration dimensions the kernel walks
_MAXSRC = 8          # index sources it reads
_MAXB = 16           # broadcast index dimensions
_INT_CODES = {
    np.dtype(np.int8): 1, np.dtype(np.uint8): 2, np.dtype(np.int16): 3,
    np.dtype(np.uint16): 4, np.dtype(np.int32): 5, np.dtype(np.uint32): 6,
    np.dtype(np.int64): 7, np.dtype(np.uint64): 8,
}
_BAD_KEY = ("only integers, slices (`:`), ellipsis (`...`), numpy.newaxis "
            "(`None`) and integer or boolean arrays are valid indices")
_BAD_ARRAY = "arrays used as indices must be of integer (or boolean) type"


def _out_of_bounds(value, axis, size):
    return IndexError("index %d is out of bounds for axis %d with size %d"
                      % (value, axis, size))


def _device_of(obj):
    """obj as a device array when it is one (or has the CUDA Array
    Interface and is not a NumPy array), else None."""
    if isinstance(obj, _core.DeviceNDArrayBase):
        return obj
    if isinstance(obj, np.ndarray):
        return None
    if getattr(obj, "__cuda_array_interface__", None) is not None:
        return _core.as_cuda_array(obj)
    return None


def _native_int(dtype):
    """The native-order dtype of an integer index dtype."""
    return dtype.newbyteorder("=") if dtype.byteorder not in "=|" else dtype


def _classify(item):
    """One element of a key as (kind, value): "int", "slice", "new",
    "ell", "bool0" (a boolean scalar), "int0" (a 0-d integer array: an
    integer that makes the result a copy, as in NumPy), "hint" / "hmask"
    (host integer / boolean arrays), "dint" / "dmask" (on the
    device)."""
    if item is None:
        return "new", None
    if item is Ellipsis:
        return "ell", None
    if isinstance(item, slice):
        return "slice", item
    if isinstance(item, (bool, np.bool_)):
        return "bool0", bool(item)
    dev = _device_of(item)
    if dev is not None:
        kind = dev.dtype.kind
        if kind == "b":
            if dev.ndim == 0:
                return "bool0", bool(dev[()])
            return "dmask", dev
        if kind in "iu" and dev.dtype.isnative:
            if dev.ndim == 0:
                return "int0", int(dev[()])
            return "dint", dev
        if kind in "iu":
            # another byte order: the host reads it
            return _classify(dev.copy_to_host())
        raise IndexError(_BAD_ARRAY)
    if isinstance(item, (np.ndarray, list, tuple)):
        a = np.asarray(item)      # NumPy's errors for ragged lists
        if not isinstance(item, np.ndarray) and a.size == 0:
            a = a.astype(np.intp)      # [] indexes nothing: NumPy's intp
        if a.dtype == np.bool_:
            return ("bool0", bool(a)) if a.ndim == 0 else ("hmask", a)
        if a.dtype.kind in "iu":
            return ("int0", int(a)) if a.ndim == 0 else ("hint", a)
        if a.dtype == object or a.dtype.kind in "US":
            raise IndexError(_BAD_KEY)
        raise IndexError(_BAD_ARRAY)
    try:
        return "int", operator.index(item)
    except TypeError:
        raise IndexError(_BAD_KEY) from None


def is_advanced(key):
    """Whether a key needs this module (C asks only after its own parse
    found an element it does not take)."""
    items = key if isinstance(key, tuple) else (key,)
    return any(_classify(k)[0] in ("bool0", "int0", "hint", "hmask",
                                   "dint", "dmask") for k in items)


def _bstrides(shape, strides, nb):
    """Byte strides over nb broadcast dimensions of an array of this
    shape (right-aligned, 0 where it broadcasts)."""
    out = [0] * nb
    off = nb - len(shape)
    for j, (n, s) in enumerate(zip(shape, strides, strict=True)):
        if n != 1:
            out[off + j] = s
    return tuple(out)


class _Plan:
    """An indexing operation planned with NumPy's rules.

    ``shape``: the result's shape; ``bpos`` / ``b``: where the broadcast
    index dimensions sit in it and their extents; ``dims``: the array
    strides of the other result dimensions, in order, with None at the
    place of B; ``offset``: bytes from the array's first element (the
    integer indices); ``host``: [(int64 byte offsets, shape)] index arrays
    combined on the host; ``dint``: [(device array, axis)]; ``dmask``:
    [(device offsets array)].
    """

    def __init__(self, arr, key, stream):
        items = key if isinstance(key, tuple) else (key,)
        entries = [_classify(k) for k in items]
        shape = arr.shape
        strides = arr.strides
        ndim = len(shape)
        if sum(1 for k, _ in entries if k == "ell") > 1:
            raise IndexError("an index can only have a single ellipsis "
                             "('...')")
        used = 0
        for kind, val in entries:
            if kind in ("int", "int0", "slice", "hint", "dint"):
                used += 1
            elif kind in ("hmask", "dmask"):
                used += val.ndim
        if used > ndim:
            raise IndexError("too many indices for array: array is "
                             "%d-dimensional, but %d were indexed"
                             % (ndim, used))
        # An integer for every dimension, nothing else: one element
        self.element = len(entries) == ndim and all(
            k in ("int", "int0") for k, _ in entries)
        # One boolean array over all the dimensions: NumPy assigns through
        # its boolean path, with rules of its own for the value.
        self.full_mask = len(entries) == 1 and (
            (entries[0][0] in ("hmask", "dmask")
             and entries[0][1].ndim == ndim)
            or (entries[0][0] == "bool0" and ndim == 0))
        if not any(k == "ell" for k, _ in entries):
            entries.append(("ell", None))
        ell = ndim - used
        dims = []              # (extent, array stride), None for B
        fancy = []             # (kind, value, first axis)
        offset = 0
        ax = 0
        status = -1            # NumPy's consecutive-index rule
        consec = 0
        for kind, val in entries:
            fancy_like = kind in ("int", "int0", "hint", "dint", "hmask",
                                  "dmask", "bool0")
            if fancy_like:
                if status == -1:
                    consec = len(dims)
                    status = 0
                elif status == 1:
                    status = 2
            elif status == 0:
                status = 1
            if kind in ("int", "int0"):
                n = shape[ax]
                i = val + n if val < 0 else val
                if not 0 <= i < n:
                    raise _out_of_bounds(val, ax, n)
                offset += i * strides[ax]
                ax += 1
            elif kind == "slice":
                start, stop, step = val.indices(shape[ax])
                n = len(range(start, stop, step))
                if n > 0:
                    offset += start * strides[ax]
                if n <= 1:
                    step = 1          # never stepped: no overflow
                dims.append((n, strides[ax] * step))
                ax += 1
            elif kind == "new":
                dims.append((1, 0))
            elif kind == "ell":
                for _ in range(ell):
                    dims.append((shape[ax], strides[ax]))
                    ax += 1
            elif kind in ("hint", "dint"):
                fancy.append((kind, val, ax))
                ax += 1
            elif kind in ("hmask", "dmask"):
                for k, n in enumerate(val.shape):
                    if n != shape[ax + k]:
                        raise IndexError(
                            "boolean index did not match indexed array "
                            "along axis %d; size of axis is %d but size "
                            "of corresponding boolean axis is %d"
                            % (ax + k, shape[ax + k], n))
                fancy.append((kind, val, ax))
                ax += val.ndim
            else:
                fancy.append((kind, val, None))
        self.bpos = 0 if status == 2 else consec
        self.offset = offset
        self._arr = arr
        # the stream the operation runs on (the argument, else the
        # array's bound stream); the mask's kernels run there too, so
        # that the gather or scatter is ordered after them
        self._eff = _effective(arr, stream)
        self._plan_fancy(fancy, shape, strides)
        self.dims = dims[:self.bpos] + [None] + dims[self.bpos:]
        self.shape = (tuple(n for n, _ in dims[:self.bpos]) + self.b
                      + tuple(n for n, _ in dims[self.bpos:]))
        if len(self.shape) > _MAXDIM or len(self.b) > _MAXB:
            raise ValueError("an indexing result of more than %d "
                             "dimensions (or %d broadcast index "
                             "dimensions) cannot be made on the device"
                             % (_MAXDIM, _MAXB))

    def _plan_fancy(self, fancy, shape, strides):
        """The index arrays: B found, host ones checked and combined,
        device masks turned into offsets.  As in NumPy, no index is
        checked when B is empty (none is used)."""
        shapes = []
        self.dint = []
        self.dmask = []
        # what every byte offset of the index arrays is a multiple of
        self.align = self._arr.dtype.itemsize or 1
        for kind, val, ax in fancy:
            if ax is not None:
                n = 1 if kind in ("hint", "dint") else val.ndim
                for st in strides[ax:ax + n]:
                    self.align = math.gcd(self.align, st)
            if kind == "bool0":
                shapes.append((1,) if val else (0,))
            elif kind == "hint":
                shapes.append(val.shape)
            elif kind == "hmask":
                shapes.append((int(np.count_nonzero(val)),))
            elif kind == "dint":
                self.dint.append((val, ax))
                shapes.append(val.shape)
            else:
                ast = tuple(strides[ax:ax + val.ndim])
                offs = _core._ix_mask(val, ast,
                                      self._eff or _core.default_stream())
                self.dmask.append(offs)
                shapes.append(offs.shape)
        try:
            self.b = tuple(np.broadcast_shapes(*shapes))
        except ValueError:
            raise IndexError(
                "shape mismatch: indexing arrays could not be broadcast "
                "together with shapes " + " ".join(str(tuple(s))
                                                   for s in shapes)) \
                from None
        self.host = None
        if _size(self.b) == 0:
            self.dint = []
            self.dmask = []
            return
        combined = None if self.dint or self.dmask else np.zeros(
            (), np.int64)
        for kind, val, ax in fancy:
            if kind == "hint":
                off = _checked(val, ax, shape[ax], strides[ax])
            elif kind == "hmask":
                nz = np.nonzero(val)
                off = np.zeros(len(nz[0]), np.int64)
                for k, idx in enumerate(nz):
                    off += idx.astype(np.int64) * strides[ax + k]
            elif kind == "bool0":
                off = np.zeros(1, np.int64)
            else:
                continue
            combined = off if combined is None else combined + off
        if combined is not None:
            self.host = np.asarray(combined, dtype=np.int64, order="C")

    def _device_int_on_host(self):
        """Read the device-held integer indices back, check them and fold
        them into the host offsets (then there are none left)."""
        shape = self._arr.shape
        strides = self._arr.strides
        combined = self.host
        for d, ax in self.dint:
            h = _to_host(d, self._eff)
            off = _checked(h, ax, shape[ax], strides[ax])
            combined = off if combined is None else combined + off
        for d in self.dmask:
            h = _to_host(d, self._eff)
            combined = h if combined is None else combined + h
        self.dint = []
        self.dmask = []
        self.host = (None if combined is None
                     else np.asarray(combined, dtype=np.int64, order="C"))

    def sources(self, eff):
        """The kernel's index sources over B, and whether device-held
        integer indices need the kernel's check read back."""
        nb = len(self.b)
        src = []
        if self.host is not None:
            h = _core.to_device(self.host, stream=eff)
            src.append((_OFF_ARRAY, h, 0, 0, self.align,
                        _bstrides(h.shape, h.strides, nb)))
        for d in self.dmask:
            src.append((_OFF_ARRAY, d, 0, 0, self.align,
                        _bstrides(d.shape, d.strides, nb)))
        arr = self._arr
        for d, ax in self.dint:
            src.append((_INT_CODES[d.dtype], d, arr.shape[ax], ax,
                        arr.strides[ax], _bstrides(d.shape, d.strides, nb)))
        return src, bool(self.dint)

    def iteration(self):
        """(array strides, B slot) of the result's dimensions."""
        ast = []
        for dim in self.dims:
            if dim is None:
                ast.extend([0] * len(self.b))
            else:
                ast.append(dim[1])
        return tuple(ast)


def _checked(idx, axis, size, stride):
    """Host integer indices: checked against the axis (NumPy's
    IndexError), negative ones counted from the end, as int64 byte
    offsets."""
    idx = np.asarray(idx)
    if idx.dtype == np.uint64 and idx.size:
        big = idx > np.uint64(np.iinfo(np.int64).max)
        if big.any():
            raise _out_of_bounds(int(idx[big].flat[0]), axis, size)
    idx = idx.astype(np.int64)
    bad = (idx < -size) | (idx >= size)
    if bad.any():
        raise _out_of_bounds(int(idx[bad].flat[0]), axis, size)
    return np.where(idx < 0, idx + size, idx) * np.int64(stride)


def _to_host(d, stream):
    """A host copy of device array d after the work queued on stream."""
    h = d.copy_to_host(stream=stream) if stream else d.copy_to_host()
    if stream:
        stream.synchronize()
    return h


def _effective(arr, stream):
    """The stream an operation runs on: the argument, else the array's
    bound stream (0 for none)."""
    return stream if stream else arr.stream


def getitem(arr, key, stream):
    """``arr[key]`` for a key with index arrays or boolean scalars: a new
    C-contiguous device array, gathered by the internal kernel on the
    effective stream (bound to it)."""
    plan = _Plan(arr, key, stream)
    eff = _effective(arr, stream)
    out = _core.device_array(plan.shape, arr.dtype, stream=eff)
    size = 1
    for n in plan.shape:
        size *= n
    if size == 0:
        if plan.dint and _size(plan.b):
            plan._device_int_on_host()      # NumPy checks them all the same
        return out
    src, check = plan.sources(eff)
    _core._ix_run(arr, out, plan.offset, plan.shape, plan.iteration(),
                  out.strides, plan.bpos, tuple(src), False, check, stream)
    if not plan.shape:
        # every dimension indexed by an integer (0-d arrays among them):
        # NumPy's scalar
        return out.copy_to_host(stream=eff)[()]
    return out


def _size(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def _value(arr, value, shape, eff, full_mask=False, element=False):
    """The value of an assignment as a device array of arr's dtype, and
    its byte strides over the indexing result's shape (0 where it
    broadcasts); NumPy's ValueError when it does not broadcast (and its
    boolean assignment's rules when ``full_mask``; one element's when
    ``element``)."""
    dev = _device_of(value)
    if element:
        # one element: NumPy's rules for storing one value of the dtype
        one = np.empty((), arr.dtype)
        one[()] = value if dev is None else _to_host(dev, eff)
        value, dev = one, None
    if dev is not None:
        if dev.dtype != arr.dtype or _overlap(dev, arr):
            tmp = _core.device_array(dev.shape, arr.dtype, stream=eff)
            tmp.setitem(Ellipsis, dev, stream=eff)
            dev = tmp
        vshape, vstrides = dev.shape, dev.strides
    else:
        if isinstance(value, np.ndarray):
            host = value.astype(arr.dtype, copy=False)
        else:
            host = np.asarray(value, dtype=arr.dtype)
        vshape = host.shape
    if full_mask:
        count = shape[0] if shape else 1
        if len(vshape) > 1:
            raise TypeError("NumPy boolean array indexing assignment "
                            "requires a 0 or 1-dimensional input, input "
                            "has %d dimensions" % len(vshape))
        if len(vshape) == 1 and vshape[0] not in (1, count):
            raise ValueError("NumPy boolean array indexing assignment "
                             "cannot assign %d input values to the %d "
                             "output values where the mask is true"
                             % (vshape[0], count))
    # NumPy drops leading length-1 dimensions of a longer value
    lead = 0
    while len(vshape) - lead > len(shape) and vshape[lead] == 1:
        lead += 1
    core = vshape[lead:]
    ok = len(core) <= len(shape) and all(
        v in (1, r)
        for v, r in zip(core[::-1], shape[::-1], strict=False))
    if not ok:
        raise ValueError("shape mismatch: value array of shape %s could "
                         "not be broadcast to indexing result of shape %s"
                         % (tuple(vshape), tuple(shape)))
    if dev is None:
        dev = _core.to_device(np.asarray(host, order="C"), stream=eff)
        vstrides = dev.strides
    vst = _bstrides(core, vstrides[lead:], len(shape))
    return dev, vst


def _overlap(a, b):
    """Whether two device arrays' byte spans intersect."""
    def span(x):
        p = x.__cuda_array_interface__["data"][0]
        lo = p + sum((n - 1) * s
                     for n, s in zip(x.shape, x.strides, strict=True)
                     if s < 0)
        return lo, lo + x.alloc_size

    if a.size == 0 or b.size == 0:
        return False
    alo, ahi = span(a)
    blo, bhi = span(b)
    return alo < bhi and blo < ahi


def setitem(arr, key, value, stream):
    """``arr[key] = value`` for a key with index arrays or boolean
    scalars: the value (broadcast and cast as NumPy does) scattered by
    the internal kernel on the effective stream; synchronous without a
    stream, as every assignment is."""
    plan = _Plan(arr, key, stream)
    eff = _effective(arr, stream)
    shape = plan.shape
    val, vst = _value(arr, value, shape, eff, plan.full_mask,
                      plan.element)
    if _size(shape) == 0:
        if plan.dint and _size(plan.b):
            plan._device_int_on_host()
        return
    nb = len(plan.b)
    bpos = plan.bpos
    ast = plan.iteration()
    if (len(plan.dmask) == 1 and plan.host is None and not plan.dint
            and nb == 1):
        # a lone device mask: its positions never repeat
        src, _ = plan.sources(eff)
        _core._ix_run(arr, val, plan.offset, shape, ast, vst, bpos,
                      tuple(src), True, False, stream)
        return
    # Repeated positions: only the last (NumPy's order) is written.
    plan._device_int_on_host()
    offs = np.broadcast_to(plan.host, plan.b).ravel()
    voff = np.zeros(plan.b, np.int64)
    for k, n in enumerate(plan.b):
        step = vst[bpos + k]
        if step:
            voff = voff + (np.arange(n, dtype=np.int64) * step).reshape(
                (n,) + (1,) * (nb - k - 1))
    voff = np.broadcast_to(voff, plan.b).ravel()
    n = offs.size
    _, last = np.unique(offs[::-1], return_index=True)
    if last.size < n:
        keep = np.sort(n - 1 - last)
        offs = offs[keep]
        voff = voff[keep]
    m = offs.size
    shape1 = shape[:bpos] + (m,) + shape[bpos + nb:]
    ast1 = ast[:bpos] + (0,) + ast[bpos + nb:]
    vst1 = vst[:bpos] + (0,) + vst[bpos + nb:]
    o = _core.to_device(np.ascontiguousarray(offs), stream=eff)
    v = _core.to_device(np.ascontiguousarray(voff), stream=eff)
    valign = arr.dtype.itemsize or 1
    for s in vst[bpos:bpos + nb]:
        valign = math.gcd(valign, s)
    src = ((_OFF_ARRAY, o, 0, 0, plan.align, (8,)),
           (_OFF_OTHER, v, 0, 0, valign, (8,)))
    _core._ix_run(arr, val, plan.offset, shape1, ast1, vst1, bpos, src,
                  True, False, stream)
