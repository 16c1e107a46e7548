# SPDX-License-Identifier: MIT
"""DLPack: __dlpack__ / __dlpack_device__ export and from_dlpack import.

On the simulator: round trips through cudamem itself over dtypes and
layouts, both capsule kinds, capsule ownership (the deleter runs exactly
once, on any thread), stream ordering, copies, every error with its type,
and a ctypes producer standing in for a foreign library.  On a GPU
(``gpu`` marker): zero-copy interop with CuPy, PyTorch and numba-cuda.

Strides: DLPack strides are signed element counts and the ABI forbids
neither negative nor zero strides, so cudamem exports and imports them as
they are (NumPy does the same; PyTorch refuses negative strides on import).
"""

import ctypes
import gc
import sys
import threading
import warnings
import weakref

import numpy as np
import pytest

import cudamem as cuda
from cudamem import _core
from helpers.arrays import REC, Stream, sample

NUMERIC = [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32,
           np.uint32, np.int64, np.uint64, np.float16, np.float32,
           np.float64, np.complex64, np.complex128]

# -- the ABI in ctypes, for inspecting capsules and for a foreign producer


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice),
                ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor),
                            ("manager_ctx", ctypes.c_void_p),
                            ("deleter", DELETER)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    pass


DELETER_V = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [("version", DLPackVersion),
                                     ("manager_ctx", ctypes.c_void_p),
                                     ("deleter", DELETER_V),
                                     ("flags", ctypes.c_uint64),
                                     ("dl_tensor", DLTensor)]

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p,
                               ctypes.c_void_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetName.restype = ctypes.c_char_p
_api.PyCapsule_GetName.argtypes = [ctypes.py_object]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

# The ctypes parts of every tensor a Producer handed out.
_TENSORS = []


def capsule_name(cap):
    return _api.PyCapsule_GetName(cap).decode()


def managed(cap):
    """The managed tensor of an unconsumed capsule (ctypes view)."""
    name = capsule_name(cap)
    kind = (DLManagedTensorVersioned if name == "dltensor_versioned"
            else DLManagedTensor)
    return kind.from_address(_api.PyCapsule_GetPointer(cap, name.encode()))


class Producer:
    """A DLPack producer built with ctypes over device memory that a
    cudamem array provides: it stands in for a foreign library and counts
    how often its tensor is deleted."""

    def __init__(self, base, shape=None, strides=None, code=None, bits=None,
                 lanes=1, device=(2, 0), versioned=True, version=(1, 0),
                 flags=0, byte_offset=0, data=None, ndim=None,
                 legacy_only=False):
        self.base = base
        self.shape = base.shape if shape is None else shape
        self.strides = strides
        if code is None:
            code = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}[base.dtype.kind]
        self.code, self.lanes = code, lanes
        self.bits = base.dtype.itemsize * 8 if bits is None else bits
        self.device = device
        self.versioned, self.version, self.flags = versioned, version, flags
        self.byte_offset = byte_offset
        self.data = base.device_ctypes_pointer.value if data is None else data
        self.ndim = len(self.shape) if ndim is None else ndim
        self.legacy_only = legacy_only
        self.deleted = 0
        self.calls = []

    def __dlpack_device__(self):
        return self.device

    @staticmethod
    def _deleter(kind, ref):
        """The tensor's deleter: counts on the producer while it lives,
        holding it only weakly (an array may outlive it)."""
        def delete(_ptr):
            p = ref()
            if p is not None:
                p.deleted += 1
        return kind(delete)

    def __dlpack__(self, *, stream=None, **kw):
        if self.legacy_only and kw:
            raise TypeError("unexpected keyword argument 'max_version'")
        self.calls.append(dict(kw, stream=stream))
        n = len(self.shape)
        shape = (ctypes.c_int64 * max(n, 1))(*self.shape)
        strides = None
        if self.strides is not None:
            strides = (ctypes.c_int64 * max(n, 1))(*self.strides)
        versioned = self.versioned and "max_version" in kw
        if versioned:
            m = DLManagedTensorVersioned()
            m.version = DLPackVersion(*self.version)
            m.flags = self.flags
            m.deleter = self._deleter(DELETER_V, weakref.ref(self))
            name = b"dltensor_versioned"
        else:
            m = DLManagedTensor()
            m.deleter = self._deleter(DELETER, weakref.ref(self))
            name = b"dltensor"
        t = m.dl_tensor
        t.data = self.data
        t.device = DLDevice(*self.device)
        t.ndim = self.ndim
        t.dtype = DLDataType(self.code, self.bits, self.lanes)
        t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
        if strides is not None:
            t.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
        t.byte_offset = self.byte_offset

        def destroy(cap, name=name, m=m):
            if _api.PyCapsule_IsValid(cap, name):
                m.deleter(ctypes.pointer(m))

        d = CAPSULE_DESTRUCTOR(destroy)
        # The tensor lives until its deleter runs, which may be after
        # the producer is gone: its parts stay for the session.
        _TENSORS.append((m, shape, strides, d))
        return _api.PyCapsule_New(ctypes.addressof(m), name,
                                  ctypes.cast(d, ctypes.c_void_p))


def ptr(d):
    return d.device_ctypes_pointer.value


def host(d):
    out = d.copy_to_host()
    cuda.synchronize()
    return out


def _layouts(dtype):
    """(name, device view, the same view on the host) per layout."""
    h = sample((6, 8), dtype)
    d = cuda.to_device(h)
    f = cuda.to_device(np.asfortranarray(h))
    yield "C", d, h
    yield "F", f, np.asfortranarray(h)
    yield "sliced", d[1:5:2, ::3], h[1:5:2, ::3]
    yield "negative", d[::-1, ::-2], h[::-1, ::-2]
    yield "0-d", d[2, 3:4].reshape(()), h[2, 3:4].reshape(())
    yield "empty", d[2:2], h[2:2]
    row = d[1]
    desc = dict(row.__cuda_array_interface__)
    desc["shape"] = (3, 8)
    desc["strides"] = (0, row.itemsize)
    yield ("broadcast", cuda.from_cuda_array_interface(desc, owner=row),
           np.broadcast_to(h[1], (3, 8)))


LAYOUTS = ["C", "F", "sliced", "negative", "0-d", "empty", "broadcast"]


def _layout(dtype, name):
    for n, d, h in _layouts(dtype):
        if n == name:
            return d, h
    raise KeyError(name)


# -- round trips through cudamem ----------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", NUMERIC)
def test_round_trip(ctx, dtype, layout):
    d, h = _layout(dtype, layout)
    v = cuda.from_dlpack(d)
    assert isinstance(v, cuda.DeviceNDArray)
    assert v.shape == d.shape and v.strides == d.strides
    assert v.dtype == d.dtype
    if d.size:
        assert ptr(v) == ptr(d)
    np.testing.assert_array_equal(host(v), h)


@pytest.mark.parametrize("max_version, name", [
    (None, "dltensor"), ((0, 8), "dltensor"), ((1, 0), "dltensor_versioned"),
    ((1, 3), "dltensor_versioned"), ((2, 0), "dltensor_versioned")])
def test_capsule_kinds(ctx, max_version, name):
    d = cuda.to_device(np.arange(6, dtype=np.int32).reshape(2, 3))
    cap = d.__dlpack__(max_version=max_version)
    assert capsule_name(cap) == name
    m = managed(cap)
    t = m.dl_tensor
    if name == "dltensor_versioned":
        assert (m.version.major, m.version.minor) == (1, 1)
        assert m.flags == 0
    assert t.data == ptr(d) and t.byte_offset == 0
    assert (t.device.device_type, t.device.device_id) == (2, 0)
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (0, 32, 1)
    assert [t.shape[i] for i in range(2)] == [2, 3]
    assert [t.strides[i] for i in range(2)] == [3, 1]
    v = cuda.from_dlpack(cap)
    assert capsule_name(cap) == "used_" + name
    assert ptr(v) == ptr(d)
    np.testing.assert_array_equal(host(v), np.arange(6).reshape(2, 3))


@pytest.mark.parametrize("dtype, code, bits", [
    (np.bool_, 6, 8), (np.int8, 0, 8), (np.uint64, 1, 64),
    (np.float16, 2, 16), (np.float64, 2, 64), (np.complex64, 5, 64),
    (np.complex128, 5, 128)])
def test_exported_types(ctx, dtype, code, bits):
    cap = cuda.device_array(3, dtype=dtype).__dlpack__()
    t = managed(cap).dl_tensor
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (code, bits, 1)


def test_exported_strides_count_elements(ctx):
    d = cuda.to_device(np.zeros((4, 6), np.float64))[::-1, ::2]
    cap = d.__dlpack__()
    t = managed(cap).dl_tensor
    assert [t.strides[i] for i in range(2)] == [-6, 2]
    assert t.data == ptr(d)


def test_dlpack_device(ctx):
    d = cuda.device_array(4)
    assert d.__dlpack_device__() == (2, 0)
    assert cuda.device_array(0).__dlpack_device__() == (2, 0)


def test_views_of_imports_and_reexport(ctx):
    d = cuda.to_device(np.arange(24, dtype=np.float32).reshape(4, 6))
    v = cuda.from_dlpack(d)
    w = cuda.from_dlpack(v[1:, ::2])
    assert ptr(w) == ptr(d[1:, ::2])
    np.testing.assert_array_equal(host(w), host(d)[1:, ::2])
    w[0, 0] = 100  # writes land in the producer's memory
    assert host(d)[1, 0] == 100


def test_write_through(ctx):
    d = cuda.to_device(np.zeros(8, np.int64))
    v = cuda.from_dlpack(d)
    v.copy_to_device(np.arange(8))
    np.testing.assert_array_equal(host(d), np.arange(8))


# -- ownership: the deleter runs exactly once ---------------------------


def test_import_keeps_the_producer_alive(ctx):
    d = cuda.to_device(np.arange(10.0))
    w = weakref.ref(d)
    v = cuda.from_dlpack(d)
    view = v[2:5]
    del d, v
    gc.collect()
    assert w() is not None
    np.testing.assert_array_equal(host(view), [2.0, 3.0, 4.0])
    del view
    gc.collect()
    assert w() is None


def test_refcounts_of_every_handoff(ctx):
    d = cuda.to_device(np.arange(4.0))
    base = sys.getrefcount(d)
    cap = d.__dlpack__()
    assert sys.getrefcount(d) == base + 1
    del cap  # never consumed: the capsule deletes the tensor
    assert sys.getrefcount(d) == base
    cap = d.__dlpack__(max_version=(1, 0))
    v = cuda.from_dlpack(cap)
    del cap  # consumed: the view owns the tensor now
    assert sys.getrefcount(d) == base + 1
    del v
    assert sys.getrefcount(d) == base
    v = cuda.from_dlpack(d)
    assert sys.getrefcount(d) == base + 1
    del v
    assert sys.getrefcount(d) == base


def test_empty_import_deletes_at_once(ctx):
    p = Producer(cuda.device_array((0, 3)))
    v = cuda.from_dlpack(p)
    assert v.shape == (0, 3) and v.gpu_data is None
    assert p.deleted == 1


@pytest.mark.parametrize("versioned", [True, False])
def test_foreign_deleter_runs_once(ctx, versioned):
    base = cuda.to_device(np.arange(12, dtype=np.float32))
    p = Producer(base, shape=(3, 4), strides=(4, 1), versioned=versioned)
    v = cuda.from_dlpack(p)
    assert p.calls[0]["max_version"] == (1, 0)
    assert ptr(v) == ptr(base) and v.strides == (16, 4)
    views = [v[1:], v.T, v.reshape(12)]
    del v
    gc.collect()
    assert p.deleted == 0
    np.testing.assert_array_equal(host(views[0]),
                                  np.arange(4, 12).reshape(2, 4))
    del views
    gc.collect()
    assert p.deleted == 1


def test_consumed_capsule_is_not_consumed_again(ctx):
    p = Producer(cuda.device_array(4))
    cap = p.__dlpack__(max_version=(1, 0))
    v = cuda.from_dlpack(cap)
    with pytest.raises(BufferError, match="already consumed"):
        cuda.from_dlpack(cap)
    del cap
    gc.collect()
    assert p.deleted == 0
    del v
    assert p.deleted == 1


def test_deleter_on_another_thread_without_the_gil(ctx):
    d = cuda.to_device(np.arange(4.0))
    base = sys.getrefcount(d)
    for kw, name, kind in [({}, b"dltensor", DLManagedTensor),
                           ({"max_version": (1, 0)}, b"dltensor_versioned",
                            DLManagedTensorVersioned)]:
        cap = d.__dlpack__(**kw)
        addr = _api.PyCapsule_GetPointer(cap, name)
        _api.PyCapsule_SetName(cap, b"used_" + name)  # consumed by "us"
        del cap
        m = kind.from_address(addr)
        # A ctypes call releases the GIL: the deleter takes it itself.
        t = threading.Thread(target=m.deleter, args=(ctypes.pointer(m),))
        t.start()
        t.join()
        assert sys.getrefcount(d) == base


def test_numpy_refuses_a_cuda_capsule_cleanly(ctx):
    d = cuda.to_device(np.arange(4.0))
    base = sys.getrefcount(d)
    with pytest.raises((BufferError, RuntimeError, TypeError, ValueError)):
        np.from_dlpack(d)
    gc.collect()
    assert sys.getrefcount(d) == base


# -- copies -------------------------------------------------------------


@pytest.mark.parametrize("layout", ["C", "F", "negative", "broadcast"])
def test_copy_true_makes_a_c_contiguous_copy(ctx, layout):
    d, h = _layout(np.float32, layout)
    cap = d.__dlpack__(copy=True, max_version=(1, 0))
    assert managed(cap).flags == 2  # IS_COPIED
    v = cuda.from_dlpack(cap)
    assert ptr(v) != ptr(d)
    assert v.is_c_contiguous()
    np.testing.assert_array_equal(host(v), h)
    v.copy_to_device(np.full(v.shape, 7, np.float32))  # the consumer's
    np.testing.assert_array_equal(host(d), h)


def test_copy_false_and_none_never_copy(ctx):
    d = cuda.to_device(np.arange(6.0))[::2]
    for copy in (False, None):
        cap = d.__dlpack__(copy=copy, max_version=(1, 0))
        m = managed(cap)
        assert m.flags == 0 and m.dl_tensor.data == ptr(d)


def test_copy_of_empty(ctx):
    v = cuda.from_dlpack(cuda.device_array((0, 4)).__dlpack__(copy=True))
    assert v.shape == (0, 4)


# -- streams ------------------------------------------------------------


@pytest.mark.parametrize("stream", [None, 1, 2, -1])
def test_stream_values(ctx, stream):
    d = cuda.to_device(np.arange(5.0))
    v = cuda.from_dlpack(d.__dlpack__(stream=stream))
    np.testing.assert_array_equal(host(v), np.arange(5.0))


@pytest.mark.parametrize("stream", [None, 1, 2, -1])
def test_stream_of_a_bound_array(ctx, stream):
    d = cuda.to_device(np.arange(5.0), stream=Stream())
    cap = d.__dlpack__(stream=stream)
    cuda.synchronize()
    np.testing.assert_array_equal(host(cuda.from_dlpack(cap)),
                                  np.arange(5.0))


def test_stream_of_no_stream_object_is_refused(ctx, bad_handle):
    """The driver reads the object at a raw stream handle without a check,
    so a handle that no stream object can be at is refused before it gets
    there, and the array is left as it was."""
    d = cuda.to_device(np.arange(5.0))
    base = sys.getrefcount(d)
    for bad in (0x1234, bad_handle, bad_handle + 8, 1 << 63, 2**64 - 8):
        with pytest.raises(ValueError, match="is not a stream handle"):
            d.__dlpack__(stream=bad)
    assert sys.getrefcount(d) == base
    cuda.from_dlpack(d.__dlpack__(stream=cuda.stream().handle))


def test_event_failure_raises(ctx, simulator):
    if not simulator:
        pytest.skip("fault injection is simulator-only")
    d = cuda.to_device(np.arange(5.0))
    base = sys.getrefcount(d)
    other = 1 if _core._per_thread_default_stream() else 2
    _core._sim_inject("EventRecord", 1, 999)
    try:
        with pytest.raises(cuda.CudaAPIError, match="cuEventRecord"):
            d.__dlpack__(stream=other)
    finally:
        _core._sim_inject("EventRecord", 0, 0)
    assert sys.getrefcount(d) == base


def test_from_dlpack_passes_the_default_stream(ctx):
    p = Producer(cuda.device_array(3))
    cuda.from_dlpack(p)
    want = 2 if _core._per_thread_default_stream() else 1
    assert p.calls == [{"stream": want, "max_version": (1, 0)}]


def test_from_dlpack_falls_back_to_legacy(ctx):
    p = Producer(cuda.to_device(np.arange(3.0)), legacy_only=True)
    v = cuda.from_dlpack(p)
    assert len(p.calls) == 1 and "max_version" not in p.calls[0]
    np.testing.assert_array_equal(host(v), np.arange(3.0))
    del v
    assert p.deleted == 1


# -- foreign tensors ----------------------------------------------------


def test_null_strides_mean_c_order(ctx):
    base = cuda.to_device(np.arange(12, dtype=np.int16))
    v = cuda.from_dlpack(Producer(base, shape=(3, 4), strides=None))
    assert v.strides == (8, 2)
    np.testing.assert_array_equal(host(v), np.arange(12).reshape(3, 4))


def test_byte_offset_is_honoured(ctx):
    base = cuda.to_device(np.arange(8, dtype=np.int32))
    v = cuda.from_dlpack(Producer(base, shape=(4,), strides=(1,),
                                  byte_offset=12))
    assert ptr(v) == ptr(base) + 12
    np.testing.assert_array_equal(host(v), [3, 4, 5, 6])


@pytest.mark.parametrize("device", [(13, 0), (3, 0)])
def test_managed_and_pinned_device_types_are_accepted(ctx, device):
    base = cuda.to_device(np.arange(3.0))
    v = cuda.from_dlpack(Producer(base, device=device))
    np.testing.assert_array_equal(host(v), np.arange(3.0))


@pytest.mark.parametrize("kw, match", [
    ({"lanes": 2}, "lanes 2"),
    ({"code": 4, "bits": 16}, "code 4"),   # bfloat16
    ({"code": 2, "bits": 8}, "bits 8"),
    ({"code": 9}, "code 9"),
    ({"device": (1, 0)}, "device type 1"),
    ({"device": (2, 3)}, "device 3"),
    ({"version": (2, 0)}, "version 2.0"),
    ({"flags": 1}, "read-only"),
    ({"ndim": -1}, "ndim -1"),
    ({"shape": (-2,), "strides": (1,)}, "shape -2"),
    ({"data": 0}, "NULL data"),
])
def test_foreign_tensor_errors(ctx, kw, match):
    p = Producer(cuda.to_device(np.arange(4.0)), **kw)
    if "device" in kw and kw["device"][0] == 1:
        match = "CPU|device type 1"
    with pytest.raises(BufferError, match=match):
        cuda.from_dlpack(p)
    gc.collect()
    # refused, so the capsule deleted it (a host producer is refused
    # before it is asked for a capsule)
    assert p.deleted == len(p.calls) == (0 if kw.get("device") == (1, 0)
                                         else 1)
    cap = p.__dlpack__(max_version=(1, 0))  # the capsule itself
    with pytest.raises(BufferError, match=match):
        cuda.from_dlpack(cap)
    del cap
    gc.collect()
    assert p.deleted == len(p.calls)


def test_from_dlpack_type_errors(ctx):
    with pytest.raises(TypeError, match="no __dlpack__"):
        cuda.from_dlpack(object())
    with pytest.raises(TypeError, match="DLPack capsule"):
        cuda.from_dlpack(_api.PyCapsule_New(1, b"other", None))

    class NotCapsule:
        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, **kw):
            return 42

    with pytest.raises(TypeError, match="not a capsule"):
        cuda.from_dlpack(NotCapsule())


def test_from_dlpack_of_host_data(ctx):
    with pytest.raises(BufferError, match="to_device"):
        cuda.from_dlpack(np.arange(3.0))


# -- export errors ------------------------------------------------------


@pytest.mark.parametrize("dtype", ["M8[D]", "m8[s]", REC, ">f4", "<U3",
                                   np.longdouble])
def test_unexportable_dtypes(ctx, dtype):
    d = cuda.device_array(3, dtype=dtype)
    base = sys.getrefcount(d)
    with pytest.raises(BufferError, match="DLPack"):
        d.__dlpack__()
    with pytest.raises(BufferError, match="DLPack"):
        d.__dlpack__(copy=True)
    with pytest.raises(BufferError):
        cuda.from_dlpack(d)
    assert sys.getrefcount(d) == base


def test_record_is_not_exportable(ctx):
    r = cuda.to_device(np.zeros(2, REC))[0]
    with pytest.raises(BufferError, match="DLPack"):
        r.__dlpack__()


def test_strides_not_multiple_of_itemsize(ctx):
    base = cuda.device_array(32, dtype=np.uint8)
    desc = {"shape": (3,), "strides": (6,), "typestr": "<f4",
            "data": (ptr(base), False), "version": 3}
    d = cuda.from_cuda_array_interface(desc, owner=base)
    with pytest.raises(BufferError, match="multiple of the itemsize"):
        d.__dlpack__()
    d.__dlpack__(copy=True)  # a copy is C-contiguous
    # a size-1 dimension's stride does not matter
    desc.update(shape=(1, 3), strides=(3, 4))
    cuda.from_dlpack(cuda.from_cuda_array_interface(desc, owner=base))


@pytest.mark.parametrize("kw, exc, match", [
    ({"stream": 0}, ValueError, "stream=0"),
    ({"stream": -2}, ValueError, "not a stream"),
    ({"stream": "1"}, TypeError, "stream must be an int"),
    ({"stream": 1.0}, TypeError, "stream must be an int"),
    ({"max_version": 1}, TypeError, "max_version"),
    ({"max_version": (1,)}, TypeError, "max_version"),
    ({"dl_device": (1, 0)}, BufferError, r"not \(1, 0\)"),
    ({"dl_device": (2, 1)}, BufferError, r"not \(2, 1\)"),
    ({"dl_device": "cuda"}, TypeError, "dl_device"),
    ({"bogus": 1}, TypeError, "unexpected keyword"),
])
def test_export_argument_errors(ctx, kw, exc, match):
    d = cuda.device_array(3)
    base = sys.getrefcount(d)
    with pytest.raises(exc, match=match):
        d.__dlpack__(**kw)
    assert sys.getrefcount(d) == base


def test_export_is_keyword_only(ctx):
    with pytest.raises(TypeError, match="keyword"):
        cuda.device_array(3).__dlpack__(None)


def test_dl_device_matching_is_accepted(ctx):
    d = cuda.device_array(3)
    cap = d.__dlpack__(dl_device=d.__dlpack_device__(), copy=False)
    assert capsule_name(cap) == "dltensor"


# -- GPU: interop with CuPy, PyTorch and numba-cuda ---------------------


def _torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch without CUDA")
    return torch


def _cupy():
    return pytest.importorskip("cupy")


def _numba_cuda():
    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack  # numba-cuda 0.30 under NumPy 2.5
    numba = pytest.importorskip("numba.cuda")
    return numba


@pytest.mark.gpu
def test_torch_round_trips(ctx):
    torch = _torch()
    d = cuda.to_device(np.arange(12, dtype=np.float32).reshape(3, 4))
    t = torch.from_dlpack(d)
    assert t.data_ptr() == ptr(d) and t.is_cuda
    assert t.stride() == (4, 1)
    t.add_(1)  # PyTorch writes into cudamem's memory
    torch.cuda.synchronize()
    np.testing.assert_array_equal(host(d), np.arange(1, 13).reshape(3, 4))
    tt = torch.arange(6, device="cuda", dtype=torch.int64).reshape(2, 3).t()
    v = cuda.from_dlpack(tt)
    assert ptr(v) == tt.data_ptr() and v.strides == (8, 24)
    np.testing.assert_array_equal(host(v), np.arange(6).reshape(2, 3).T)
    v[0, 0] = 50  # cudamem writes into PyTorch's memory
    assert int(tt[0, 0]) == 50
    # a legacy capsule handed over directly
    t2 = torch.from_dlpack(d.__dlpack__())
    assert t2.data_ptr() == ptr(d)


@pytest.mark.gpu
def test_torch_deleter_runs_once(ctx):
    torch = _torch()
    d = cuda.to_device(np.arange(4.0))
    base = sys.getrefcount(d)
    t = torch.from_dlpack(d)
    assert sys.getrefcount(d) == base + 1
    del t
    gc.collect()
    assert sys.getrefcount(d) == base
    t = torch.ones(5, device="cuda")
    v = cuda.from_dlpack(t)
    assert ptr(v) == t.data_ptr()
    del t
    gc.collect()
    # The view keeps PyTorch's storage: a new tensor does not reuse it.
    t2 = torch.zeros(5, device="cuda")
    torch.cuda.synchronize()
    assert t2.data_ptr() != ptr(v)
    np.testing.assert_array_equal(host(v), np.ones(5))


@pytest.mark.gpu
def test_torch_on_its_own_stream(ctx):
    torch = _torch()
    d = cuda.to_device(np.zeros(1 << 20, np.float32))
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        t = torch.from_dlpack(d)  # passes s: cudamem orders it
        t.add_(2)
    s.synchronize()
    assert host(d)[-1] == 2


@pytest.mark.gpu
def test_cupy_round_trips(ctx):
    cp = _cupy()
    d = cuda.to_device(np.arange(10, dtype=np.int32))
    a = cp.from_dlpack(d)
    assert a.data.ptr == ptr(d)
    kernel = cp.ElementwiseKernel("int32 x", "int32 y", "y = x * 3",
                                  "cm_triple")
    kernel(cp.arange(10, dtype=cp.int32), a)  # CuPy writes into cudamem's
    cp.cuda.get_current_stream().synchronize()
    np.testing.assert_array_equal(host(d), np.arange(10) * 3)
    b = cp.arange(12, dtype=cp.float64).reshape(3, 4).T
    v = cuda.from_dlpack(b)
    assert ptr(v) == b.data.ptr and v.strides == b.strides
    np.testing.assert_array_equal(host(v), cp.asnumpy(b))
    v[0, 0] = -1
    assert float(b[0, 0]) == -1


@pytest.mark.gpu
def test_numba_interop(ctx):
    ncuda = _numba_cuda()

    def add_one(x):
        i = ncuda.grid(1)
        if i < x.size:
            x[i] += 1

    d = cuda.to_device(np.arange(64, dtype=np.float32))
    nd = ncuda.as_cuda_array(d)  # numba's view of cudamem's memory
    assert nd.device_ctypes_pointer.value == ptr(d)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numba's small-grid warning
        ncuda.jit(add_one)[1, 64](nd)  # numba's kernel writes into it
    ncuda.synchronize()
    np.testing.assert_array_equal(host(d), np.arange(1, 65))
    theirs = ncuda.to_device(np.arange(8, dtype=np.int16))
    v = cuda.as_cuda_array(theirs)
    assert ptr(v) == theirs.device_ctypes_pointer.value
    np.testing.assert_array_equal(host(v), np.arange(8))


@pytest.mark.gpu
def test_torch_cupy_chain(ctx):
    torch = _torch()
    cp = _cupy()
    d = cuda.to_device(np.arange(6, dtype=np.float32))
    a = cp.from_dlpack(torch.from_dlpack(cuda.from_dlpack(d)))
    assert a.data.ptr == ptr(d)


def test_tensor_too_big_for_numpy_is_left_to_its_producer(ctx):
    """A tensor refused for its size is refused before it is taken: the
    capsule keeps its name and the producer's deleter runs once, when the
    capsule goes."""
    p = Producer(cuda.device_array(4, np.uint8), shape=(1, 4, 2**62, 1))
    cap = p.__dlpack__(max_version=(1, 0))
    with pytest.raises(ValueError, match="too big"):
        cuda.from_dlpack(cap)
    assert capsule_name(cap) == "dltensor_versioned"
    assert p.deleted == 0
    del cap
    gc.collect()
    assert p.deleted == 1
