# SPDX-License-Identifier: MIT
"""__cuda_array_interface__ export (v3, with cudamem's fixes Q1/Q2) and
import (as_cuda_array, from_cuda_array_interface, to_device, config)."""

import sys

import numpy as np
import pytest

import cudamem as cuda
from cudamem import _core

from helpers.arrays import REC, Stream


class Foreign:
    """A foreign producer: only a CAI dict over someone's memory."""

    def __init__(self, cai, keep=None):
        self.__cuda_array_interface__ = cai
        self.keep = keep


def foreign_of(d, **changes):
    cai = dict(d.__cuda_array_interface__)
    cai.update(changes)
    return Foreign(cai, keep=d)


# -- export ----------------------------------------------------------------


def test_export_c_contiguous(ctx):
    d = cuda.device_array((3, 4), dtype=np.float32)
    cai = d.__cuda_array_interface__
    assert cai == {"shape": (3, 4), "strides": None,
                   "data": (d.device_ctypes_pointer.value, False),
                   "typestr": "<f4", "version": 3, "stream": None}
    assert d.__cuda_array_interface__ is not cai  # fresh each time


@pytest.mark.parametrize("make, strides", [
    (lambda: cuda.device_array((3, 4), order="F"), (8, 24)),
    (lambda: cuda.device_array((6, 4))[::2], (64, 8)),
    (lambda: cuda.device_array((3, 4))[:, ::-1], (32, -8)),
    (lambda: cuda.to_device(np.broadcast_to(np.arange(4.0), (3, 4))),
     (0, 8)),  # Q1: real zero strides
])
def test_export_strides(ctx, make, strides):
    assert make().__cuda_array_interface__["strides"] == strides


def test_export_negative_stride_pointer(ctx):
    d = cuda.to_device(np.arange(5.0))
    r = d[::-1]
    assert r.__cuda_array_interface__["data"][0] == \
        d.__cuda_array_interface__["data"][0] + 32
    assert r.alloc_size == 40


def test_export_zero_d_empty_and_records(ctx):
    assert cuda.device_array(()).__cuda_array_interface__["strides"] is None
    assert cuda.device_array(0).__cuda_array_interface__["data"] == (0,
                                                                     False)
    r = cuda.device_array(2, dtype=REC).__cuda_array_interface__
    assert r["typestr"] == "|V%d" % REC.itemsize
    assert r["descr"] == REC.descr
    assert "descr" not in cuda.device_array(2).__cuda_array_interface__
    t = cuda.device_array(2, dtype="M8[D]").__cuda_array_interface__
    assert t["typestr"] == "<M8[D]"


def test_export_stream(ctx):
    h = cuda.stream().handle
    s = Stream(h)
    assert cuda.device_array(2, stream=s).__cuda_array_interface__[
        "stream"] == h
    default = cuda.device_array(2, stream=Stream(0))
    expected = 2 if _core._per_thread_default_stream() else 1
    assert default.__cuda_array_interface__["stream"] == expected  # Q2


# -- import ----------------------------------------------------------------


def test_is_cuda_array(ctx):
    assert cuda.is_cuda_array(cuda.device_array(1))
    assert not cuda.is_cuda_array(np.zeros(1))
    assert cuda.is_cuda_array(Foreign({}))  # not validated


def test_as_cuda_array_view_and_lifetime(ctx):
    d = cuda.to_device(np.arange(6.0).reshape(2, 3))
    f = foreign_of(d)
    base = sys.getrefcount(f)
    v = cuda.as_cuda_array(f)
    assert isinstance(v, cuda.DeviceNDArray) and v is not d
    assert sys.getrefcount(f) == base + 1
    # numba's gpu_data of an import: a MemoryPointer owned by the object
    mem = v.gpu_data
    assert isinstance(mem, cuda.MemoryPointer) and mem.owner is f
    assert mem.device_pointer == d.device_ctypes_pointer.value
    assert mem.size == d.alloc_size
    del mem
    assert v.stream == 0
    np.testing.assert_array_equal(v.copy_to_host(), d.copy_to_host())
    v[0, 0] = 42.0
    assert d[0, 0] == 42.0  # zero copy
    del v
    assert sys.getrefcount(f) == base
    w = cuda.as_cuda_array(d)
    assert w is not d and w.gpu_data.owner is d
    with pytest.raises(TypeError, match=r"\*obj\* doesn't implement the "
                                        r"cuda array interface\."):
        cuda.as_cuda_array(np.zeros(3))


def test_from_cuda_array_interface_owner(ctx):
    d = cuda.to_device(np.arange(4.0))
    owner = object()
    base = sys.getrefcount(owner)
    v = cuda.from_cuda_array_interface(d.__cuda_array_interface__,
                                       owner=owner)
    assert sys.getrefcount(owner) == base + 1
    assert v.gpu_data.owner is owner
    del v
    assert sys.getrefcount(owner) == base
    n = cuda.from_cuda_array_interface(d.__cuda_array_interface__)
    # no owner: the MemoryPointer is its own (numba's owner=None)
    assert n.gpu_data.owner is n.gpu_data
    assert n.gpu_data.device_pointer == d.device_ctypes_pointer.value
    np.testing.assert_array_equal(n.copy_to_host(), np.arange(4.0))


@pytest.mark.parametrize("layout", [
    lambda d: d, lambda d: d[::2, ::-1], lambda d: d.T,
    lambda d: d[1], lambda d: d[:0],
])
def test_roundtrip_layouts(ctx, layout):
    h = np.arange(24.0).reshape(4, 6)
    d = layout(cuda.to_device(h))
    v = cuda.as_cuda_array(d)
    assert v.shape == d.shape and v.strides == d.strides
    np.testing.assert_array_equal(v.copy_to_host(), d.copy_to_host())


def test_import_structured_descr(ctx):
    d = cuda.device_array(3, dtype=REC)
    assert cuda.as_cuda_array(d).dtype == REC


def test_import_stream_and_sync_config(ctx, monkeypatch):
    d = cuda.to_device(np.arange(3.0))
    handle = 0  # the default stream: valid on every backend
    v = cuda.as_cuda_array(foreign_of(d, stream=handle))
    assert v.stream is not None
    monkeypatch.setattr(cuda.config, "CUDA_ARRAY_INTERFACE_SYNC", False)
    v = cuda.as_cuda_array(foreign_of(d, stream=handle))
    np.testing.assert_array_equal(v.copy_to_host(), np.arange(3.0))
    monkeypatch.setattr(cuda.config, "CUDA_ARRAY_INTERFACE_SYNC", "bad")
    with pytest.raises(RuntimeError, match="no"):
        class Bad:
            def __bool__(self):
                raise RuntimeError("no")
        monkeypatch.setattr(cuda.config, "CUDA_ARRAY_INTERFACE_SYNC", Bad())
        cuda.as_cuda_array(foreign_of(d, stream=handle))
    cuda.as_cuda_array(foreign_of(d, stream=handle), sync=False)
    with pytest.raises(TypeError, match="'stream'"):
        cuda.as_cuda_array(foreign_of(d, stream="s"))


@pytest.mark.parametrize("change, exc, match", [
    ({"version": None}, TypeError, "'version'"),
    ({"version": 4}, ValueError, "'version'"),
    ({"mask": object()}, NotImplementedError,
     "Masked arrays are not supported"),
    ({"shape": (-1,)}, ValueError, "'shape'"),
    ({"shape": [3]}, ValueError, "'shape'"),
    ({"typestr": "zz9"}, ValueError, "'typestr'"),
    ({"typestr": "|O"}, ValueError, "'typestr'"),
    ({"strides": (8, 8)}, ValueError, "'strides'"),
    ({"data": (0, False)}, ValueError, "'data'"),
    ({"data": "x"}, ValueError, "'data'"),
    ({"strides": (-8,)}, ValueError, "'strides'"),
    ({"shape": (10**6,)}, ValueError, "'strides'"),
])
def test_import_malformed(ctx, change, exc, match):
    d = cuda.device_array(3)
    cai = dict(d.__cuda_array_interface__)
    cai.update(change)
    if change.get("version", 0) is None:
        del cai["version"]
    with pytest.raises(exc, match=match):
        cuda.from_cuda_array_interface(cai, owner=d)


def test_to_device_of_cai_and_copy_from_cai(ctx):
    d = cuda.to_device(np.arange(5.0))
    f = foreign_of(d)
    v = cuda.to_device(f)
    assert isinstance(v, cuda.DeviceNDArray) and v.gpu_data.owner is f
    dst = cuda.device_array(5)
    dst.copy_to_device(f)  # Q10
    np.testing.assert_array_equal(dst.copy_to_host(), np.arange(5.0))
    dst[:] = foreign_of(cuda.to_device(np.ones(5)))
    np.testing.assert_array_equal(dst.copy_to_host(), np.ones(5))


def test_config_defaults_and_env(monkeypatch):
    import importlib

    from cudamem import config

    assert config.CUDA_DEALLOCS_COUNT == 10 or \
        "CUDAMEM_MAX_PENDING_DEALLOCS_COUNT" in __import__("os").environ
    monkeypatch.setenv("NUMBA_CUDA_MAX_PENDING_DEALLOCS_COUNT", "3")
    monkeypatch.setenv("NUMBA_CUDA_ARRAY_INTERFACE_SYNC", "0")
    importlib.reload(config)
    assert config.CUDA_DEALLOCS_COUNT == 3
    assert config.CUDA_ARRAY_INTERFACE_SYNC is False
    monkeypatch.setenv("CUDAMEM_MAX_PENDING_DEALLOCS_COUNT", "7")
    importlib.reload(config)
    assert config.CUDA_DEALLOCS_COUNT == 7  # cudamem spelling wins
    monkeypatch.delenv("CUDAMEM_MAX_PENDING_DEALLOCS_COUNT")
    monkeypatch.delenv("NUMBA_CUDA_MAX_PENDING_DEALLOCS_COUNT")
    monkeypatch.delenv("NUMBA_CUDA_ARRAY_INTERFACE_SYNC")
    importlib.reload(config)
    assert config.CUDA_DEALLOCS_RATIO == 0.2
    assert config.CUDA_MEMORY_MANAGER == "default"
    assert config.CUDA_ARRAY_INTERFACE_SYNC is True
