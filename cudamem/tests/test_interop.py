# SPDX-License-Identifier: MIT
"""Arrays exchanged with the other GPU libraries that are installed
(numba-cuda, CuPy, PyTorch: through the CUDA Array Interface and DLPack,
on a GPU), their allocations served by cudamem's pool, and Dask's
serialisers (on either backend).  Each skips without its library."""

import importlib

import numpy as np
import pytest

import cudamem as cuda
from cudamem.tests._util import run_child


def _library(name):
    """The module, or a skip when it is not installed or cannot load."""
    try:
        return importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - any failure means "not here"
        pytest.skip("%s is not usable here: %s" % (name, e))


@pytest.mark.gpu
def test_numba_cuda_exchange():
    ncuda = _library("numba.cuda")
    if not ncuda.is_available():
        pytest.skip("numba.cuda sees no GPU")
    d = cuda.to_device(np.arange(100, dtype=np.float32))
    nd = ncuda.as_cuda_array(d)
    np.testing.assert_array_equal(nd.copy_to_host(), np.arange(100))
    back = cuda.as_cuda_array(ncuda.to_device(np.arange(5)))
    np.testing.assert_array_equal(back.copy_to_host(), np.arange(5))


@pytest.mark.gpu
def test_cupy_exchange():
    cp = _library("cupy")
    d = cuda.to_device(np.arange(100, dtype=np.float64))
    c = cp.asarray(d)  # the same memory, through the interface
    assert int(c.data.ptr) == d.device_ctypes_pointer.value
    c *= 2
    cp.cuda.get_current_stream().synchronize()
    np.testing.assert_array_equal(d.copy_to_host(), np.arange(100) * 2)
    back = cuda.as_cuda_array(cp.arange(7))
    np.testing.assert_array_equal(back.copy_to_host(), np.arange(7))


@pytest.mark.gpu
def test_torch_exchange():
    torch = _library("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no GPU")
    d = cuda.to_device(np.arange(64, dtype=np.float32))
    t = torch.from_dlpack(d)
    assert t.data_ptr() == d.device_ctypes_pointer.value
    t.add_(1)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(d.copy_to_host(), np.arange(64) + 1)
    back = cuda.as_cuda_array(torch.arange(9, device="cuda"))
    np.testing.assert_array_equal(back.copy_to_host(), np.arange(9))


POOLED = r"""
import numpy as np
import cudamem
from cudamem import interop
cudamem.set_memory_manager("pool")
name = %r
if name == "cupy":
    interop.use_with_cupy()
    import cupy
    x = cupy.arange(1 << 20, dtype=cupy.float32)
    total = float(x.sum())
    held = cudamem.memory_stats()["by_client"].get("cupy", 0)
else:
    interop.use_with_torch()
    import torch
    x = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    total = float(x.sum())
    held = cudamem.memory_stats()["by_client"].get("torch", 0)
assert total == float(np.arange(1 << 20, dtype=np.float64).sum()), total
assert held >= 4 << 20, held
print("ok")
"""


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["cupy", "torch"])
def test_library_allocates_from_cudamems_pool(name):
    _library(name)
    assert run_child(POOLED % name, timeout=300).strip() == "ok"


def test_dask_serialisers():
    _library("distributed")
    from distributed.protocol import deserialize, serialize

    host = np.arange(30, dtype=np.int64).reshape(5, 6)
    for family in ("cuda", "dask"):
        header, frames = serialize(cuda.to_device(host),
                                   serializers=(family,))
        out = deserialize(header, frames)
        assert isinstance(out, cuda.DeviceNDArray)
        np.testing.assert_array_equal(out.copy_to_host(), host)
