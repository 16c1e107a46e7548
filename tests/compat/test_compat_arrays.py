# SPDX-License-Identifier: MIT
"""Device arrays as numba's lower layer sees them: class flags,
DeviceRecord, and the memory objects behind pinned, mapped and managed
arrays."""

import numpy as np
import pytest

REC = np.dtype([("a", np.int32), ("b", np.float64), ("c", "S4")],
               align=True)


def test_device_array_flags(cuda):
    d = cuda.device_array(4)
    assert d.__cuda_memory__ is True
    assert d.__cuda_ndarray__ is True
    assert cuda.cudadrv.devicearray.DeviceNDArray.__cuda_memory__ is True
    assert cuda.cudadrv.devicearray.is_cuda_ndarray(d)
    assert cuda.cudadrv.driver.is_device_memory(d)


def test_device_record_constructed(cuda):
    da = cuda.cudadrv.devicearray
    r = da.DeviceRecord(REC)
    assert isinstance(r, da.DeviceRecord)
    assert r.dtype == REC and r.shape == () and r.alloc_size == REC.itemsize
    host = np.array([(3, 4.5, b"abc")], REC)[0]
    r.copy_to_device(host)
    back = r.copy_to_host()
    assert back["a"] == 3 and back["b"] == 4.5 and back["c"] == b"abc"


def test_device_record_on_given_memory(cuda):
    da = cuda.cudadrv.devicearray
    mem = cuda.current_context().memalloc(REC.itemsize)
    r = da.DeviceRecord(REC, stream=0, gpu_data=mem)
    assert r.device_ctypes_pointer.value == mem.device_pointer_value
    host = np.array([(7, 1.25, b"x")], REC)[0]
    r.copy_to_device(host)
    assert r.copy_to_host()["a"] == 7


def test_from_record_like(cuda):
    da = cuda.cudadrv.devicearray
    host = np.array([(9, 2.5, b"zz")], REC)[0]
    r = da.from_record_like(host)
    assert isinstance(r, da.DeviceRecord) and r.dtype == REC
    r.copy_to_device(host)
    assert r.copy_to_host()["b"] == 2.5
    s = cuda.stream()
    r2 = da.from_record_like(host, stream=s)
    assert r2.stream is s
    r3 = da.from_record_like(r)                # from a device record
    assert isinstance(r3, da.DeviceRecord) and r3.dtype == REC
    assert r3.device_ctypes_pointer.value != r.device_ctypes_pointer.value


def test_to_device_record_round_trip(cuda):
    host = np.array([(1, -1.5, b"ab")], REC)[0]
    d = cuda.to_device(host)
    assert isinstance(d, cuda.cudadrv.devicearray.DeviceRecord)
    back = np.empty(1, REC)[0]
    d.copy_to_host(back)
    assert back["a"] == 1 and back["b"] == -1.5


def _memory_of(ary, attr):
    """The first object of ``ary``'s ``.base`` chain with ``attr``."""
    obj = ary
    while obj is not None:
        if not isinstance(obj, np.ndarray) and hasattr(obj, attr):
            return obj
        obj = getattr(obj, "base", None)
    raise AssertionError("no memory object with %r under the array" % attr)


def test_pinned_array_base_is_pinned_memory(cuda):
    drv = cuda.cudadrv.driver
    a = cuda.pinned_array(16, np.float32)
    mem = _memory_of(a, "host_pointer")
    assert isinstance(mem, drv.PinnedMemory)
    assert not drv.is_device_memory(mem)
    assert int(mem.host_pointer) == a.ctypes.data
    assert mem.size >= a.nbytes


def test_mapped_array_base_is_mapped_memory(cuda):
    drv = cuda.cudadrv.driver
    a = cuda.mapped_array(16, np.float32)
    mem = _memory_of(a, "host_pointer")
    assert drv.is_device_memory(mem)
    assert int(mem.host_pointer) == a.ctypes.data
    assert mem.device_pointer_value
    assert isinstance(mem.device_ctypes_pointer.value, int)
    assert mem.size >= a.nbytes
    a.__cuda_memory__  # noqa: B018 - mapped arrays say so too
    assert drv.is_device_memory(a)


def test_mapped_array_memory_is_mapped_memory(cuda):
    # numba's chain ends in a MappedOwnedPointer, a proxy of the
    # MappedMemory; cudamem's owner is an instance of MappedMemory itself
    drv = cuda.cudadrv.driver
    a = cuda.mapped_array((4, 8), np.int32)
    mem = _memory_of(a, "host_pointer")
    assert isinstance(getattr(mem, "_view", mem), drv.MappedMemory)
    assert not isinstance(getattr(mem, "_view", mem), drv.PinnedMemory)
    assert int(mem.handle) == int(mem.host_pointer) == a.ctypes.data
    assert mem.size == a.nbytes
    assert mem.device_pointer_value
    assert mem.device_ctypes_pointer.value == mem.device_pointer_value
    assert memoryview(mem).nbytes == a.nbytes
    own = mem.own()
    assert own.device_pointer_value == mem.device_pointer_value


class _Foreign:
    """An object that only has a CUDA Array Interface (another library's
    array)."""

    def __init__(self, arr):
        self._arr = arr

    @property
    def __cuda_array_interface__(self):
        return self._arr.__cuda_array_interface__


def test_imported_array_gpu_data_is_a_memory_pointer(cuda):
    drv = cuda.cudadrv.driver
    d = cuda.to_device(np.arange(10, dtype=np.float64))
    f = _Foreign(d)
    v = cuda.as_cuda_array(f)
    ptr = d.__cuda_array_interface__["data"][0]
    mem = v.gpu_data
    assert isinstance(mem, drv.MemoryPointer)
    assert mem.owner is f
    assert mem.device_pointer_value == ptr == int(mem.handle)
    assert mem.device_ctypes_pointer.value == ptr
    assert mem.size == 80
    assert drv.is_device_memory(mem)
    assert drv.device_pointer(mem) == ptr
    np.testing.assert_array_equal(v.copy_to_host(), np.arange(10.0))
    # a view of the import points at its own bytes, still owned by f
    w = v[2:]
    assert w.gpu_data.owner is f
    assert w.gpu_data.size == 64
    assert w.gpu_data.device_pointer_value == ptr + 16
    # from_cuda_array_interface with an owner: the same
    u = cuda.from_cuda_array_interface(f.__cuda_array_interface__, owner=f)
    assert u.gpu_data.owner is f and u.gpu_data.device_pointer_value == ptr


def test_managed_array_base_is_managed_memory(cuda):
    drv = cuda.cudadrv.driver
    a = cuda.managed_array(16, np.float32)
    mem = _memory_of(a, "device_pointer")
    assert drv.is_device_memory(mem)
    assert int(mem.device_pointer_value) == a.ctypes.data
    assert mem.size >= a.nbytes


@pytest.mark.cudamem_only("the memory objects under cudamem's arrays are "
                          "the C owners, instances of numba's classes")
def test_array_memory_isinstance(cuda):
    drv = cuda.cudadrv.driver
    assert isinstance(cuda.pinned_array(4).base, drv.PinnedMemory)
    assert isinstance(cuda.mapped_array(4).base, drv.MappedMemory)
    assert isinstance(cuda.managed_array(4).base, drv.ManagedMemory)
    assert isinstance(cuda.device_array(4).gpu_data, drv.MemoryPointer)
