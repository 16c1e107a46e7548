# SPDX-License-Identifier: MIT
"""numba's module paths and its driver module's byte-copy helpers
(cuda.driver.host_to_device and friends), which code written for numba
reaches through numba.cuda's accidental exports."""

import numpy as np
import pytest

import cudamem as cuda
from cudamem.cudadrv import devicearray, devices, driver


def test_accidental_exports_are_the_modules(ctx):
    assert cuda.driver is driver
    assert cuda.devicearray is devicearray
    assert cuda.devices is devices
    assert devices.get_context() is cuda.current_context()
    assert devices.gpus is cuda.gpus
    d, copied = cuda.devicearray.auto_device(np.arange(3.0))
    assert copied and list(d.copy_to_host()) == [0, 1, 2]


class _CAI:
    def __init__(self, d):
        self.d = d

    @property
    def __cuda_array_interface__(self):
        return self.d.__cuda_array_interface__


@pytest.mark.parametrize("kind", ["array", "fortran", "allocation", "cai"])
def test_round_trip(ctx, kind):
    src = np.arange(24, dtype=np.uint8)
    if kind == "array":
        dev = cuda.device_array(24, np.uint8)
    elif kind == "fortran":
        dev = cuda.device_array((2, 3), np.float32, order="F")
    elif kind == "allocation":
        dev = cuda.current_context().memalloc(24)
    else:
        dev = _CAI(cuda.device_array(6, np.int32))
    driver.host_to_device(dev, src, 24)
    out = np.zeros(24, np.uint8)
    driver.device_to_host(out, dev, 24)
    np.testing.assert_array_equal(out, src)
    # Fewer bytes than either side holds: the rest is untouched.
    out2 = np.full(24, 255, np.uint8)
    driver.device_to_host(out2, dev, 10)
    np.testing.assert_array_equal(out2[:10], src[:10])
    assert (out2[10:] == 255).all()


def test_host_buffers_of_any_dtype_and_bytes(ctx):
    d = cuda.device_array(4, np.float64)
    driver.host_to_device(d, np.asfortranarray(np.ones((2, 2))), 32)
    assert (d.copy_to_host() == 1).all()
    driver.host_to_device(d, b"\x00" * 8, 8)
    assert d.copy_to_host()[0] == 0 and d.copy_to_host()[1] == 1
    buf = bytearray(32)
    driver.device_to_host(buf, d, 32)
    assert np.frombuffer(bytes(buf), np.float64).tolist() == [0, 1, 1, 1]


def test_device_to_device_and_memset(ctx):
    a = cuda.to_device(np.arange(16, dtype=np.uint8))
    b = cuda.current_context().memalloc(16)
    driver.device_memset(b, 7, 16)
    driver.device_to_device(b, a, 5)
    out = np.zeros(16, np.uint8)
    driver.device_to_host(out, b, 16)
    assert out.tolist() == [0, 1, 2, 3, 4] + [7] * 11
    driver.device_memset(a, 0xff, 3)
    assert a.copy_to_host()[:4].tolist() == [255, 255, 255, 3]


def test_on_a_stream(ctx):
    s = cuda.stream()
    d = cuda.device_array(8, np.uint8)
    src = cuda.pinned_array(8, np.uint8)
    src[:] = 3
    out = cuda.pinned_array(8, np.uint8)
    driver.host_to_device(d, src, 8, stream=s)
    driver.device_memset(d, 9, 2, stream=s)
    driver.device_to_host(out, d, 8, stream=s)
    s.synchronize()
    assert out.tolist() == [9, 9] + [3] * 6


def test_zero_bytes_is_a_no_op(ctx):
    d = cuda.device_array(2, np.uint8)
    driver.host_to_device(d, np.zeros(0, np.uint8), 0)
    driver.device_to_host(bytearray(0), d, 0)
    driver.device_memset(d, 1, 0)


@pytest.mark.parametrize("fn, args, exc, match", [
    ("device_to_host", lambda d: (np.zeros(4, np.uint8), d, 5),
     ValueError, "exceeds the 4 bytes of src"),
    ("device_to_host", lambda d: (np.zeros(2, np.uint8), d, 3),
     ValueError, "exceeds the 2 bytes of dst"),
    ("host_to_device", lambda d: (d, np.zeros(8, np.uint8), 5),
     ValueError, "exceeds the 4 bytes of dst"),
    ("device_to_host", lambda d: (np.zeros(4, np.uint8), d, -1),
     ValueError, "non-negative"),
    ("device_to_host", lambda d: (np.zeros(4, np.uint8), d, 1.5),
     TypeError, None),
    ("device_to_host", lambda d: (b"abcd", d, 4),
     ValueError, "read-only"),
    ("device_to_host", lambda d: (np.zeros((4, 4), np.uint8)[:, 0], d, 4),
     ValueError, "contiguous host buffer"),
    ("device_to_host", lambda d: (object(), d, 4),
     TypeError, "host buffer"),
    ("device_to_host", lambda d: (np.zeros(4, np.uint8), object(), 4),
     TypeError, "device memory"),
    ("device_to_host", lambda d: (np.zeros(4, np.uint8),
                                  cuda.device_array((4, 4), np.uint8)[:, 0],
                                  4),
     ValueError, "contiguous device memory"),
    ("device_memset", lambda d: (d, 256, 4), ValueError, "byte"),
    ("device_memset", lambda d: (d, -1, 4), ValueError, "byte"),
])
def test_bad_arguments(ctx, fn, args, exc, match):
    d = cuda.device_array(4, np.uint8)
    with pytest.raises(exc, match=match):
        getattr(driver, fn)(*args(d))
