# SPDX-License-Identifier: MIT
"""Tests written for numba patch methods on its classes."""

from unittest import mock

import numpy as np


def test_patch_stream_synchronize(cuda):
    drv = cuda.cudadrv.driver
    original = drv.Stream.synchronize
    with mock.patch.object(drv.Stream, "synchronize") as fake:
        s = cuda.stream()
        s.synchronize()
        assert fake.call_count == 1
    assert drv.Stream.synchronize is original
    cuda.stream().synchronize()


def test_patch_event_record(cuda):
    drv = cuda.cudadrv.driver
    with mock.patch.object(drv.Event, "record") as fake:
        cuda.event().record()
        assert fake.called
    e = cuda.event()
    e.record()
    e.synchronize()


def test_patch_context_memalloc(cuda):
    drv = cuda.cudadrv.driver
    ctx = cuda.current_context()
    with mock.patch.object(drv.Context, "memalloc",
                           return_value="patched") as fake:
        assert ctx.memalloc(8) == "patched"
        fake.assert_called_once_with(8)
    assert ctx.memalloc(8).size == 8


def test_patch_device_array_method(cuda):
    cls = cuda.cudadrv.devicearray.DeviceNDArray
    d = cuda.to_device(np.arange(4))
    with mock.patch.object(cls, "copy_to_host", return_value=42):
        assert d.copy_to_host() == 42
    assert (d.copy_to_host() == np.arange(4)).all()
