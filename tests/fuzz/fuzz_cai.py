# SPDX-License-Identifier: MIT
"""Fuzz the CUDA Array Interface import: ``from_cuda_array_interface``
and ``as_cuda_array`` / ``to_device`` of objects whose
``__cuda_array_interface__`` has fuzzed shape, strides, typestr, descr,
data, mask, stream and version.

The data pointer is an offset (in or out of range) into a device
allocation the harness owns, NULL, or any integer.  Stream values are
None, missing, 0, the legacy / per-thread handles, a live stream's
handle, or not an int: a handle that is no stream is beyond any check
(the driver reads the object it points at), so it is not fuzzed.

Expected exceptions: TypeError, ValueError, IndexError, OverflowError,
KeyError (a missing required key, as in numba), NotImplementedError (a
mask), BufferError, MemoryError, and CudaAPIError (the driver refusing a
pointer that is no allocation).

Oracle: an imported array has the dict's shape, dtype and strides (C
strides when none are given); reading it gives exactly the bytes NumPy's
``as_strided`` reads from a host copy of the allocation; a write through
it followed by a read gives what NumPy gives.
"""

import numpy as np

from _common import (CLEAN, EDGE_INTS, cuda, known, main, overlaps, pick,
                     small_int, span)

EXPECTED = CLEAN + (KeyError, cuda.CudaAPIError)
SIZE = 256
_base = None
_stream = None
_alloc_ptrs = []


def base():
    global _base, _stream
    if _base is None:
        _base = cuda.to_device(np.arange(SIZE, dtype=np.uint8))
        _stream = cuda.stream()
        # The allocations of the process: a pointer into one of them is
        # device memory of this context, whoever holds it.
        _alloc_ptrs.append(_base.device_ctypes_pointer.value)
    return _base


TYPESTRS = ("|u1", "<f8", "<i4", ">i4", "<c16", "|b1", "|V3", "<M8[s]",
            "<f2", "|i1", "<u8", "|O", "<f16", "|V0", "<U2", "|S3", "bogus",
            "", "<f8extra", 5, b"<f8", None, "<i4,<f8")


def shape_of(fdp):
    kind = fdp.ConsumeIntInRange(0, 7)
    dims = tuple(small_int(fdp, -1, 9)
                 for _ in range(fdp.ConsumeIntInRange(0, 4)))
    if kind == 0:
        return list(dims)
    if kind == 1:
        return pick(fdp, (None, 3, "3", (2.0,), (None,), (2**70,),
                          tuple(range(40)), (np.int64(2),)))
    return dims


def strides_of(fdp, shape):
    kind = fdp.ConsumeIntInRange(0, 5)
    if kind <= 2:
        return None
    n = len(shape) if isinstance(shape, (tuple, list)) else 1
    if kind == 3:
        n = fdp.ConsumeIntInRange(0, 4)
    s = tuple(small_int(fdp, -16, 16) for _ in range(n))
    if kind == 5:
        return pick(fdp, (list(s), 8, "8", (8.0,), ()))
    return s


def data_of(fdp, ptr):
    kind = fdp.ConsumeIntInRange(0, 7)
    if kind <= 3:
        p = ptr + small_int(fdp, -16, SIZE + 16)
    elif kind == 4:
        p = 0
    elif kind == 5:
        p = pick(fdp, EDGE_INTS + (0x1000, 2**64 - 1, 2**64 + 8))
    else:
        return pick(fdp, (None, (), (ptr,), [ptr, False], (ptr, False, 1),
                          (float(ptr), False), ("0", False), ptr))
    return (p, fdp.ConsumeBool())


def stream_of(fdp):
    return pick(fdp, ("missing", None, None, 0, 1, 2, "stream", "1", 1.0,
                      b"\x01", True))


def make_desc(fdp, ptr):
    desc = {}
    version = pick(fdp, (3, 3, 2, 1, 0, None, "missing", "3", -1, 2**64))
    if version != "missing":
        desc["version"] = version
    desc["shape"] = shape_of(fdp)
    desc["typestr"] = pick(fdp, TYPESTRS)
    desc["data"] = data_of(fdp, ptr)
    strides = strides_of(fdp, desc["shape"])
    if strides is not None or fdp.ConsumeBool():
        desc["strides"] = strides
    if fdp.ConsumeIntInRange(0, 5) == 0:
        desc["descr"] = pick(fdp, ([("", "<f8")], None, "x", [(1, 2)]))
    if fdp.ConsumeIntInRange(0, 7) == 0:
        desc["mask"] = pick(fdp, (None, desc.copy(), 0, "mask"))
    s = stream_of(fdp)
    if s == "stream":
        s = int(getattr(_stream.handle, "value", _stream.handle))
    if s != "missing":
        desc["stream"] = s
    for key in ("shape", "typestr", "data"):
        if fdp.ConsumeIntInRange(0, 30) == 0:
            del desc[key]
    return desc


class Holder:
    def __init__(self, desc):
        self.__cuda_array_interface__ = desc


def check_result(fdp, r, desc, ptr):
    shape = tuple(int(n) for n in desc["shape"]) if isinstance(
        desc["shape"], (tuple, list)) else None
    dtype = np.dtype(desc["typestr"])
    assert r.dtype == dtype, (r.dtype, dtype)
    if shape is not None:
        assert r.shape == shape, (r.shape, shape)
    strides = desc.get("strides")
    if strides is not None and shape is not None:
        assert r.strides == tuple(strides), (r.strides, strides)
    ext = span(r.shape, r.strides, r.dtype.itemsize)
    p = r.device_ctypes_pointer.value if r.size else None
    inside = ext is not None and p is not None and (
        ptr <= p + ext[0] and p + ext[1] <= ptr + SIZE)
    if ext is not None and not inside:
        # Memory that is no allocation of the harness: reading it must
        # be refused (or read another live allocation: no oracle then).
        if known(True):
            return  # issue 17 item 1: kernels on foreign pointers
        try:
            r.copy_to_host()
        except EXPECTED:
            pass
        try:
            if r.ndim:
                r[:] = 0
        except EXPECTED:
            pass
        return
    if ext is None or dtype.hasobject:
        return
    if r.size * dtype.itemsize > 1 << 24:
        # zero strides over a huge shape: its host copy is a view of the
        # span, too big to compare element by element
        return
    hb = base().copy_to_host()
    want = np.lib.stride_tricks.as_strided(
        hb[p - ptr:].view(np.uint8), shape=r.shape, strides=r.strides)
    try:
        got = r.copy_to_host()
    except EXPECTED:
        return  # layouts numba cannot copy (zero strides, overlaps)
    want_bytes = np.ascontiguousarray(
        np.lib.stride_tricks.as_strided(
            np.frombuffer(hb.tobytes(), dtype=np.uint8)[p - ptr:],
            shape=r.shape + (dtype.itemsize,),
            strides=r.strides + (1,))).tobytes()
    del want
    assert np.ascontiguousarray(got).tobytes() == want_bytes
    if (fdp.ConsumeBool() and r.ndim and dtype.kind in "biufc"
            and not overlaps(r.shape, r.strides, dtype.itemsize)):
        try:
            r[:] = 7
        except EXPECTED:
            return
        got = r.copy_to_host()
        assert (got == np.array(7).astype(dtype)).all(), got
        base().copy_to_device(np.arange(SIZE, dtype=np.uint8))


def TestOneInput(data):
    import atheris

    fdp = atheris.FuzzedDataProvider(data)
    ptr = base().device_ctypes_pointer.value
    desc = make_desc(fdp, ptr)
    how = fdp.ConsumeIntInRange(0, 2)
    try:
        if how == 0:
            r = cuda.from_cuda_array_interface(desc, owner=None,
                                               sync=fdp.ConsumeBool())
        elif how == 1:
            r = cuda.as_cuda_array(Holder(desc))
        else:
            r = cuda.to_device(Holder(desc))
    except EXPECTED:
        return
    check_result(fdp, r, desc, ptr)


if __name__ == "__main__":
    main(TestOneInput)
