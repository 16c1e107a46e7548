# SPDX-License-Identifier: MIT
"""numba.cuda.cudadrv.driver's module-level helpers and names."""

import ctypes

import numpy as np
import pytest

NAMES = [
    "Context", "Device", "Stream", "Event", "IpcHandle", "MemoryPointer",
    "AutoFreePointer", "MappedMemory", "PinnedMemory", "ManagedMemory",
    "OwnedPointer", "MappedOwnedPointer", "ManagedOwnedPointer",
    "BaseCUDAMemoryManager", "HostOnlyCUDAMemoryManager",
    "GetIpcHandleMixin", "MemoryInfo", "CudaAPIError", "CudaDriverError",
    "is_device_memory", "require_device_memory", "device_memory_size",
    "device_pointer", "device_ctypes_pointer", "host_pointer",
    "device_extents", "host_memory_extents", "host_memory_size",
    "memory_size_from_info", "device_memory_depends", "host_to_device",
    "device_to_host", "device_to_device", "device_memset",
    "event_elapsed_time", "profile_start", "profile_stop", "profiling",
    "get_version",
]


@pytest.mark.parametrize("name", NAMES)
def test_driver_name(driver, name):
    assert getattr(driver, name) is not None


def test_is_device_memory(driver, cuda, context):
    assert driver.is_device_memory(cuda.device_array(3))
    assert driver.is_device_memory(context.memalloc(8))
    assert not driver.is_device_memory(np.arange(3))
    assert not driver.is_device_memory(object())
    with pytest.raises(Exception, match="Not a CUDA memory object"):
        driver.require_device_memory(np.arange(3))


def test_device_pointers(driver, cuda, context):
    m = context.memalloc(64)
    assert driver.device_pointer(m) == m.device_pointer_value
    assert driver.device_ctypes_pointer(m).value == m.device_pointer_value
    assert driver.device_ctypes_pointer(None).value is None
    d = cuda.device_array(8)
    assert driver.device_pointer(d) == d.device_ctypes_pointer.value


def test_device_extents_and_size(driver, context):
    m = context.memalloc(1024)
    s, e = driver.device_extents(m)
    assert s == m.device_pointer_value and e - s >= 1024
    assert driver.device_extents(m.view(100)) == (s, e)
    assert driver.device_memory_size(m) == 1024


@pytest.mark.parametrize("ary", [
    np.arange(100),
    np.asfortranarray(np.arange(100).reshape(2, 50)),
    np.asarray(np.uint32(1234)),
], ids=["c", "f", "0d"])
def test_host_memory_extents(driver, ary):
    s, e = driver.host_memory_extents(ary)
    assert s == ary.ctypes.data
    assert driver.host_memory_size(ary) == ary.nbytes == e - s
    assert driver.host_pointer(ary) == ary.ctypes.data


def test_host_memory_size_of_ctypes(driver):
    class Pair(ctypes.Structure):
        _fields_ = [("x", ctypes.c_int), ("y", ctypes.c_int)]

    assert driver.host_memory_size(Pair(x=1, y=2)) == ctypes.sizeof(Pair)
    assert driver.host_memory_size(ctypes.c_double(1.5)) == 8


def test_host_pointer_of_int(driver):
    assert driver.host_pointer(12345) == 12345


def test_memory_size_from_info(driver):
    assert driver.memory_size_from_info((2, 50), (400, 8), 8) == 800
    assert driver.memory_size_from_info((10,), (16,), 8) == 152
    assert driver.memory_size_from_info((), (), 4) == 4


def test_byte_copies(driver, context):
    src = np.arange(100, dtype=np.uint32)
    out = np.zeros_like(src)
    n = src.nbytes
    a = context.memalloc(n)
    b = context.memalloc(n)
    driver.host_to_device(a, src, n)
    driver.device_to_device(b, a, n)
    driver.device_to_host(out, b, n)
    assert (out == src).all()
    driver.device_memset(b, 0xAB, n)
    driver.device_to_host(out, b, n)
    assert (out == 0xABABABAB).all()
