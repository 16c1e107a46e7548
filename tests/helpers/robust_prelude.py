# SPDX-License-Identifier: MIT
"""Adversarial objects for tests/robustness/test_robustness.py: values
whose dunder methods raise, return garbage, or change things in the
middle of a call.

Imported by the child processes that run the cases (never by pytest
itself), after cudamem.
"""

import mmap

import numpy as np

import cudamem as cuda


def _no_access_page():
    import ctypes

    libc = ctypes.CDLL(None)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                          ctypes.c_int, ctypes.c_int, ctypes.c_long]
    # PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS: held for the process's life,
    # so nothing else is ever mapped there.
    return libc.mmap(None, mmap.PAGESIZE, 0, 0x22, -1, 0)


# A stream handle no stream object can be at: a page that cannot be read.
# (A fixed number such as 0x12345678 may lie inside the heap of a process
# that loaded much, and a readable address that is not a stream is beyond
# any check: the driver reads it.)
BAD_HANDLE = _no_access_page()


class Boom(Exception):
    """Raised by the adversarial objects: a case that lets it through has
    propagated the user's exception, which is right."""


class RaiseIndex:
    def __index__(self):
        raise Boom("__index__")

    def __int__(self):
        raise Boom("__int__")


class GarbageIndex:
    def __index__(self):
        return 1.5

    def __int__(self):
        return "x"


class HugeIndex:
    def __index__(self):
        return 2 ** 100

    def __int__(self):
        return 2 ** 100


class RaiseSeq:
    """A sequence whose every protocol method raises."""

    def __len__(self):
        raise Boom("__len__")

    def __iter__(self):
        raise Boom("__iter__")

    def __getitem__(self, i):
        raise Boom("__getitem__")


class LyingSeq:
    """Claims 3 items and yields 1 (or 5), as a tuple() caller sees."""

    def __init__(self, n=3, items=(4,)):
        self.n = n
        self.items = items

    def __len__(self):
        return self.n

    def __iter__(self):
        return iter(self.items)

    def __getitem__(self, i):
        return self.items[i]


class RaiseBool:
    def __bool__(self):
        raise Boom("__bool__")


class RaiseArray:
    def __array__(self, dtype=None, copy=None):
        raise Boom("__array__")


class GarbageArray:
    def __array__(self, dtype=None, copy=None):
        return "not an array"


class ObjectArray:
    def __array__(self, dtype=None, copy=None):
        return np.array([object(), object()], dtype=object)


class RaiseCAI:
    @property
    def __cuda_array_interface__(self):
        raise Boom("__cuda_array_interface__")


class CAI:
    """An object exporting the given dict (or anything) as its CAI."""

    def __init__(self, desc):
        self.desc = desc

    @property
    def __cuda_array_interface__(self):
        return self.desc


def cai_of(d, **changes):
    """The CAI dict of device array d with some keys changed (a key set
    to ... is removed)."""
    desc = dict(d.__cuda_array_interface__)
    for k, v in changes.items():
        if v is ...:
            desc.pop(k, None)
        else:
            desc[k] = v
    return desc


class MutatingCAI:
    """Each read of the CAI returns a dict whose shape grows, and frees
    the array it describes after the first read."""

    def __init__(self):
        self.d = cuda.device_array(4)
        self.reads = 0

    @property
    def __cuda_array_interface__(self):
        self.reads += 1
        desc = cai_of(self.d, shape=(4 * self.reads,))
        self.d = None
        return desc


class DLPack:
    """An object whose __dlpack__ / __dlpack_device__ are given."""

    def __init__(self, dlpack=None, device=(2, 0)):
        self._dlpack = dlpack
        self._device = device

    def __dlpack__(self, *args, **kwargs):
        if callable(self._dlpack):
            return self._dlpack(*args, **kwargs)
        return self._dlpack

    def __dlpack_device__(self):
        if callable(self._device):
            return self._device()
        return self._device


class Fake:
    """An array-like by attributes only: shape, strides, dtype, flags
    (an attribute given as None is absent)."""

    def __init__(self, shape=(4,), strides=(8,), dtype=np.float64,
                 flags=...):
        if flags is ...:
            flags = {"C_CONTIGUOUS": True, "F_CONTIGUOUS": True}
        for k, v in (("shape", shape), ("strides", strides),
                     ("dtype", dtype), ("flags", flags)):
            if v is not None:
                setattr(self, k, v)


def raiser(*args, **kwargs):
    raise Boom("callable")


def capsule(name, ptr=0):
    """A PyCapsule named ``name`` around an arbitrary pointer value
    (never dereferenced by a correct consumer that checks the name)."""
    import ctypes

    PyCapsule_New = ctypes.pythonapi.PyCapsule_New
    PyCapsule_New.restype = ctypes.py_object
    PyCapsule_New.argtypes = (ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_void_p)
    # The capsule keeps pointers to its name and contents, not copies:
    # both live here, one pair per name.
    if name not in _keep:
        _keep[name] = (ctypes.create_string_buffer(256),
                       None if name is None
                       else ctypes.create_string_buffer(name.encode()))
    keep, cname = _keep[name]
    return PyCapsule_New(ptr or ctypes.addressof(keep),
                         None if cname is None else ctypes.addressof(cname),
                         None)


_keep = {}


class OddSub(np.ndarray):
    """An ndarray subclass whose __array_finalize__ raises."""

    def __array_finalize__(self, obj):
        if obj is not None and getattr(obj, "_armed", False):
            raise Boom("__array_finalize__")


def odd_sub(shape=(4,)):
    a = np.zeros(shape).view(OddSub)
    a._armed = True
    return a


def noncontig():
    return np.arange(16.0)[::2]


def readonly(shape=(4,)):
    a = np.zeros(shape)
    a.flags.writeable = False
    return a


def misaligned(n=4, dtype=np.float64):
    dt = np.dtype(dtype)
    buf = np.zeros(n * dt.itemsize + 1, np.uint8)
    return buf[1:].view(dt)


def freed_array(n=4):
    """A device array whose allocation was freed under it."""
    d = cuda.device_array(n)
    d.gpu_data.free()
    return d


STRUCT = np.dtype([("a", np.int32), ("b", np.float64, (2,))])


def record():
    return cuda.to_device(np.zeros(1, STRUCT)[0])


# -- objects that close the context (or free memory) in the middle of a
# -- call that uses it

def close():
    cuda.close()


class CloseIndex:
    def __index__(self):
        close()
        return 3

    __int__ = __index__


class CloseSeq:
    def __len__(self):
        close()
        return 1

    def __iter__(self):
        close()
        return iter((3,))

    def __getitem__(self, i):
        close()
        return (3,)[i]


class CloseBool:
    def __bool__(self):
        close()
        return True


class CloseArray:
    def __array__(self, dtype=None, copy=None):
        close()
        return np.arange(3.0, dtype=dtype)


class CloseCAI:
    def __init__(self):
        self.d = cuda.device_array(3)

    @property
    def __cuda_array_interface__(self):
        desc = self.d.__cuda_array_interface__
        close()
        return desc


class CloseDLPack:
    def __init__(self):
        self.d = cuda.device_array(3)

    def __dlpack__(self, *args, **kwargs):
        cap = self.d.__dlpack__()
        close()
        return cap

    def __dlpack_device__(self):
        return self.d.__dlpack_device__()


class CloseDtype:
    """A dtype argument whose conversion closes the context."""

    @property
    def dtype(self):
        close()
        return np.dtype(np.float64)


class FreeArray:
    """An __array__ that frees the memory of the device array it was
    given, then returns good data."""

    def __init__(self, d):
        self.d = d

    def __array__(self, dtype=None, copy=None):
        self.d.gpu_data.free()
        return np.arange(3.0, dtype=dtype)
