# SPDX-License-Identifier: MIT
"""Managed (unified) memory (docs/api.md#host-memory): managed_array,
ManagedNDArray as a NumPy array and a device array, prefetch() and
advise()."""

import numpy as np
import pytest

import cudamem
from cudamem import _core
from helpers.arrays import Stream

CU_MEM_ATTACH_GLOBAL = 0x1
CU_MEM_ATTACH_HOST = 0x2


@pytest.fixture
def small():
    """Sizes stay far below any device's memory."""
    return 4096


def test_managed_array_is_both(ctx, small):
    g = cudamem.managed_array((small // 8,), np.float64)
    assert type(g) is cudamem.ManagedNDArray
    assert isinstance(g, np.ndarray) and g.__cuda_memory__
    owner = g.gpu_data
    assert owner.kind == "managed" and owner.flags == CU_MEM_ATTACH_GLOBAL
    # one address on both sides
    assert owner.device_pointer == owner.host_pointer == g.ctypes.data
    assert g.__cuda_array_interface__["data"] == (owner.device_pointer,
                                                  False)
    assert cudamem.to_device(g) is g


def test_attach_host(ctx):
    g = cudamem.managed_array(16, np.int32, attach_global=False)
    assert g.gpu_data.flags == CU_MEM_ATTACH_HOST


def test_data_visible_both_ways(ctx):
    g = cudamem.managed_array((5, 6), np.int32)
    g[:] = np.arange(30).reshape(5, 6)
    np.testing.assert_array_equal(g.copy_to_host(), g)
    d = cudamem.to_device(np.full((5, 6), 9, np.int32))
    g.copy_to_device(d)
    cudamem.synchronize()
    assert (g == 9).all()
    view = cudamem.as_cuda_array(g[1:3])
    np.testing.assert_array_equal(view.copy_to_host(), 9)
    parts = list(cudamem.managed_array(7).split(3))
    assert [p.size for p in parts] == [3, 3, 1]


def test_managed_counts_as_device_memory(ctx, memq):
    s0 = cudamem.memory_stats()
    g = cudamem.managed_array(1000, np.uint8)
    s1 = cudamem.memory_stats()
    assert s1["allocated_bytes"] == s0["allocated_bytes"] + 1000
    assert s1["allocation_count"] == s0["allocation_count"] + 1
    v = g[10:]
    del g
    assert len(memq) == 0
    del v
    assert len(memq) == 1 and memq.pending_bytes == 1000
    s2 = cudamem.memory_stats()
    assert s2["allocated_bytes"] == s0["allocated_bytes"]


def test_prefetch_and_advise(ctx):
    g = cudamem.managed_array(1024, np.float32)
    g[:] = 1
    dev = cudamem.get_current_device()
    g.prefetch()
    g.prefetch(dev.id)
    g.prefetch(dev)
    g.prefetch(stream=Stream())
    g.prefetch("cpu")
    g[10:20].prefetch(0)
    for advice in ("read_mostly", "unset_read_mostly", "preferred_location",
                   "unset_preferred_location", "accessed_by",
                   "unset_accessed_by"):
        g.advise(advice)
    g.advise("preferred_location", "cpu")
    cudamem.synchronize()
    assert (g == 1).all()
    cudamem.managed_array(0).prefetch()  # empty: nothing to do


@pytest.mark.parametrize("call, exc, match", [
    (lambda g: g.advise("fast"), ValueError, "unknown advice"),
    (lambda g: g.advise(99), ValueError, "unknown advice"),
    (lambda g: g.prefetch("gpu"), ValueError, "device must be"),
    (lambda g: g.prefetch(1.5), TypeError, "device must be"),
    (lambda g: g.prefetch(-3), ValueError, "invalid device"),
    (lambda g: g.prefetch(stream=7), TypeError, "Stream object"),
    (lambda g: g.prefetch(10 ** 3), cudamem.CudaAPIError, "INVALID"),
])
def test_prefetch_and_advise_errors(ctx, call, exc, match):
    g = cudamem.managed_array(64, np.float32)
    with pytest.raises(exc, match=match):
        call(g)


def test_prefetch_needs_a_managed_array(ctx):
    with pytest.raises(TypeError, match="managed memory"):
        _core._managed_prefetch(np.zeros(4))
    with pytest.raises(TypeError, match="managed memory"):
        _core._managed_advise(cudamem.mapped_array(4), "read_mostly")


def test_managed_array_errors(ctx):
    with pytest.raises(TypeError):
        cudamem.managed_array(3, portable=True)
    with pytest.raises(ValueError):
        cudamem.managed_array((2, -1))
    with pytest.raises(TypeError, match="shape must be an integer"):
        cudamem.managed_array(2.0)


def test_managed_out_of_memory_retries(ctx, simulator):
    if not simulator:
        pytest.skip("fault injection needs the simulator")
    _core._sim_inject("MemAllocManaged", 1, 2)  # CUDA_ERROR_OUT_OF_MEMORY
    g = cudamem.managed_array(8)
    assert g.gpu_data.kind == "managed"
    _core._sim_inject("MemAllocManaged", 1, 1)
    with pytest.raises(cudamem.CudaAPIError,
                       match="cuMemAllocManaged results in "
                             "CUDA_ERROR_INVALID_VALUE"):
        cudamem.managed_array(8)
