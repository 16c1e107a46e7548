# SPDX-License-Identifier: MIT
"""Fuzz ``from_dlpack``: capsules built with ctypes from fuzzed
DLManagedTensor / DLManagedTensorVersioned fields, passed directly or
returned by a producer's ``__dlpack__``; producers whose ``__dlpack__``
returns something else, raises, or knows no ``max_version``; and
``__dlpack_device__`` results of every shape.

The fuzzer process stays valid: every pointer in a tensor is memory the
harness owns (shape and strides arrays of 64 entries, whatever ndim
says; the data pointer is an offset into a device allocation of the
harness, NULL, or a number that is read only through the driver).

Expected exceptions: TypeError, ValueError, BufferError (the DLPack
protocol's refusal), OverflowError, MemoryError, and CudaAPIError (the
driver refusing a pointer that is no allocation).

Oracles: the deleter runs exactly once, and only after the last view of
a consumed tensor is gone (never for a refused capsule, which this
harness gives no destructor); an imported array has the tensor's shape,
dtype and strides and reads the bytes NumPy reads from a host copy.
"""

import ctypes
import gc

import numpy as np

from _common import (CLEAN, EDGE_INTS, cuda, known, main, pick, small_int,
                     span)

EXPECTED = CLEAN + (cuda.CudaAPIError,)
SIZE = 256
MAXDIMS = 64


class Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32)]


class DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16)]


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", Device),
                ("ndim", ctypes.c_int32), ("dtype", DType),
                ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("byte_offset", ctypes.c_uint64)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", Tensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", DELETER)]


class Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class ManagedV(ctypes.Structure):
    _fields_ = [("version", Version), ("manager_ctx", ctypes.c_void_p),
                ("deleter", DELETER), ("flags", ctypes.c_uint64),
                ("dl_tensor", Tensor)]


assert ctypes.sizeof(Tensor) == 48 and ctypes.sizeof(Managed) == 64
assert ManagedV.dl_tensor.offset == 32

_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_is_valid.restype = ctypes.c_int
_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _is_capsule(cap, name):
    return bool(_is_valid(cap, name))


_deleted = []          # addresses of the structs whose deleter ran


@DELETER
def _deleter(addr):
    _deleted.append(addr)


_base = None


def base():
    global _base
    if _base is None:
        _base = cuda.to_device(np.arange(SIZE, dtype=np.uint8))
    return _base


# A name that lives as long as the process: a capsule keeps the pointer.
NAMES = {n: ctypes.create_string_buffer(n) for n in (
    b"dltensor", b"dltensor_versioned", b"used_dltensor", b"foo", b"")}


class Made:
    """One fuzzed tensor and everything its pointers point at."""

    def __init__(self, fdp, ptr):
        self.versioned = fdp.ConsumeBool()
        self.struct = ManagedV() if self.versioned else Managed()
        self.shape = (ctypes.c_int64 * MAXDIMS)()
        self.strides = (ctypes.c_int64 * MAXDIMS)()
        t = self.struct.dl_tensor
        kind = fdp.ConsumeIntInRange(0, 5)
        if kind <= 2:
            t.data = ptr + small_int(fdp, -8, SIZE + 8)
        elif kind == 3:
            t.data = None
        else:
            t.data = pick(fdp, EDGE_INTS[:14] + (0x1000,)) % 2**64 or None
        t.byte_offset = pick(fdp, (0, 0, 0, 1, 8, 64, 255, 2**63, 2**64 - 1,
                                   2**64 - ptr % 2**64))
        t.device.device_type = pick(fdp, (2, 2, 2, 3, 13, 1, 0, 4, -1,
                                          2**31 - 1))
        t.device.device_id = pick(fdp, (0, 0, 0, 1, -1, 7))
        t.ndim = (fdp.ConsumeIntInRange(0, 4) if fdp.ConsumeIntInRange(0, 7)
                  else pick(fdp, (-1, -2**31, 32, 33, 64, 65, 2**31 - 1)))
        for i in range(MAXDIMS):
            self.shape[i] = small_int(fdp, -1, 6) if i < 5 else 1
            self.strides[i] = small_int(fdp, -6, 30) if i < 5 else 1
        t.dtype.code = fdp.ConsumeIntInRange(0, 8)
        t.dtype.bits = pick(fdp, (8, 16, 32, 64, 128, 0, 1, 3, 255))
        t.dtype.lanes = pick(fdp, (1, 1, 1, 1, 2, 0, 65535))
        t.shape = (None if fdp.ConsumeIntInRange(0, 15) == 0
                   else ctypes.addressof(self.shape))
        t.strides = (None if fdp.ConsumeIntInRange(0, 3) == 0
                     else ctypes.addressof(self.strides))
        self.struct.deleter = _deleter
        if self.versioned:
            self.struct.version.major = pick(fdp, (1, 1, 1, 0, 2))
            self.struct.version.minor = pick(fdp, (0, 1, 2, 3, 2**32 - 1))
            self.struct.flags = pick(fdp, (0, 0, 1, 2, 3, 2**64 - 1))
        name = b"dltensor_versioned" if self.versioned else b"dltensor"
        if fdp.ConsumeIntInRange(0, 10) == 0:
            name = pick(fdp, tuple(NAMES))
        self.name = name
        self.capsule = _new_capsule(ctypes.addressof(self.struct),
                                    NAMES[name], None)
        self.addr = ctypes.addressof(self.struct)

    def tensor(self):
        return self.struct.dl_tensor


class Producer:
    def __init__(self, fdp, made):
        self.made = made
        self.device = pick(fdp, ("ask", "ask", "none", (2, 0), (1, 0),
                                 (3, 0), (13, 0), (2, 1), (2,), None,
                                 ("2", 0), (2**70, 0), (2, 2**70),
                                 [2, 0], "raise"))
        self.result = pick(fdp, ("capsule", "capsule", "capsule", None, 5,
                                 "raise", "legacy"))

    def __dlpack__(self, stream=None, max_version=None):
        if self.result == "raise":
            raise BufferError("producer refuses")
        if self.result == "legacy" and max_version is not None:
            raise TypeError("unexpected keyword argument 'max_version'")
        if self.result in ("capsule", "legacy"):
            return self.made.capsule
        return self.result

    def __dlpack_device__(self):
        if self.device == "raise":
            raise ValueError("no device")
        if self.device == "ask":
            return (int(self.made.tensor().device.device_type),
                    int(self.made.tensor().device.device_id))
        return self.device


def check_result(r, made, ptr):
    t = made.tensor()
    assert r.ndim == t.ndim, (r.ndim, t.ndim)
    shape = tuple(made.shape[i] for i in range(t.ndim))
    assert r.shape == shape, (r.shape, shape)
    item = r.dtype.itemsize
    if t.strides:
        strides = tuple(made.strides[i] * item for i in range(t.ndim))
        assert r.strides == strides, (r.strides, strides)
    ext = span(r.shape, r.strides, item)
    if ext is None:
        return
    p = (t.data or 0) + t.byte_offset
    p %= 2**64
    inside = ptr <= p + ext[0] and p + ext[1] <= ptr + SIZE
    if not inside:
        if known(True):
            return  # issue 17 item 1: foreign pointers are accepted
        if ext[1] - ext[0] > 1 << 24:
            # a span of gigabytes over other memory: its host copy is that
            # big (the harness's own allocation, not cudamem's)
            return
        try:
            r.copy_to_host()
        except EXPECTED:
            pass
        return
    if r.size * item > 1 << 24 or r.ndim >= 64:
        return  # see below: no host copy of that size either
    try:
        got = r.copy_to_host()
    except EXPECTED:
        return  # layouts numba cannot copy
    if r.size * item > 1 << 24 or r.ndim >= 64:
        # zero strides over a huge shape: the copy is a view of its span,
        # too big to compare element by element; and NumPy's as_strided
        # takes no more than 64 dimensions with the byte axis added
        return
    hb = np.frombuffer(base().copy_to_host().tobytes(), np.uint8)
    want = np.lib.stride_tricks.as_strided(
        hb[p - ptr:], shape=r.shape + (item,), strides=r.strides + (1,))
    assert np.ascontiguousarray(got).tobytes() == want.tobytes()


def TestOneInput(data):
    import atheris

    fdp = atheris.FuzzedDataProvider(data)
    ptr = base().device_ctypes_pointer.value
    made = Made(fdp, ptr)
    src = made.capsule if fdp.ConsumeIntInRange(0, 2) == 0 \
        else Producer(fdp, made)
    del _deleted[:]
    try:
        r = cuda.from_dlpack(src)
    except EXPECTED:
        # Refused: deleted exactly once if cudamem took the capsule
        # (renamed it "used_..."), else never (the producer still owns it).
        if not made.name.startswith(b"used_") and (
                _is_capsule(made.capsule, b"used_dltensor")
                or _is_capsule(made.capsule, b"used_dltensor_versioned")):
            assert _deleted == [made.addr], ("taken, then", _deleted)
        else:
            assert not _deleted, "the deleter of a refused tensor ran"
        return
    # An empty array holds no memory, so it may let the tensor go at once.
    assert not _deleted or r.size == 0, "the deleter ran while it lives"
    # A non-empty view holds the memory too (an empty one needs none).
    view = r[:1] if r.size and r.ndim else None
    try:
        check_result(r, made, ptr)
    finally:
        del r
        gc.collect()
        if view is not None and view.size:
            assert not _deleted, "the deleter ran while a view lives"
        del view
        gc.collect()
    assert _deleted == [made.addr], ("deleter calls", _deleted, made.addr)


if __name__ == "__main__":
    main(TestOneInput)
