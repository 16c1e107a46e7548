# SPDX-License-Identifier: MIT
"""CudaAPIError and friends: attributes, wording, pickling, and driver
errors surfacing with their code and name (fault injection on the
simulator)."""

import pickle

import pytest

import cudamem
from cudamem import _core

CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_LAUNCH_FAILED = 719


def test_api_error_attributes():
    e = cudamem.CudaAPIError(1, "cuMemAlloc", "CUDA_ERROR_INVALID_VALUE")
    assert e.code == 1
    assert e.name == "CUDA_ERROR_INVALID_VALUE"
    assert e.msg == "Call to cuMemAlloc results in CUDA_ERROR_INVALID_VALUE"
    assert str(e) == "[1] " + e.msg
    assert isinstance(e, cudamem.CudaDriverError)


def test_api_error_numba_signature():
    e = cudamem.CudaAPIError(999, "CUDA_ERROR_UNKNOWN")
    assert e.code == 999 and e.msg == "CUDA_ERROR_UNKNOWN"
    assert str(e) == "[999] CUDA_ERROR_UNKNOWN"


@pytest.mark.parametrize("exc", [
    cudamem.CudaAPIError(2, "cuMemAlloc", "CUDA_ERROR_OUT_OF_MEMORY"),
    cudamem.CudaOutOfMemoryError(2, "cuMemAlloc", "CUDA_ERROR_OUT_OF_MEMORY"),
    cudamem.CudaAPIError(999, "CUDA_ERROR_UNKNOWN"),
    cudamem.CudaSupportError("no driver"),
])
def test_errors_pickle(exc):
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc)
    assert str(back) == str(exc)


def test_out_of_memory_is_a_memory_error():
    assert issubclass(cudamem.CudaOutOfMemoryError, MemoryError)
    assert issubclass(cudamem.CudaOutOfMemoryError, cudamem.CudaAPIError)
    assert issubclass(cudamem.CudaSupportError, ImportError)


@pytest.mark.sim
def test_injected_fault_surfaces_with_code_and_name(ctx):
    _core._sim_inject("MemGetInfo", 1, CUDA_ERROR_LAUNCH_FAILED)
    with pytest.raises(cudamem.CudaAPIError,
                       match="CUDA_ERROR_LAUNCH_FAILED") as ei:
        ctx.get_memory_info()
    assert ei.value.code == CUDA_ERROR_LAUNCH_FAILED
    assert ei.value.name == "CUDA_ERROR_LAUNCH_FAILED"
    assert "cuMemGetInfo" in ei.value.msg
    ctx.get_memory_info()  # once only


@pytest.mark.sim
def test_injected_fault_hits_the_nth_call(ctx):
    _core._sim_inject("MemGetInfo", 3, CUDA_ERROR_INVALID_VALUE)
    ctx.get_memory_info()
    ctx.get_memory_info()
    with pytest.raises(cudamem.CudaAPIError, match="INVALID_VALUE"):
        ctx.get_memory_info()
    ctx.get_memory_info()


@pytest.mark.sim
def test_out_of_memory_is_retried_once(ctx):
    _core._sim_inject("MemAlloc", 1, CUDA_ERROR_OUT_OF_MEMORY)
    m = ctx.memalloc(1024)
    assert m.size == 1024 and m.device_pointer != 0


@pytest.mark.sim
def test_injection_arguments_are_checked():
    with pytest.raises(ValueError, match="cuNoSuchCall"):
        _core._sim_inject("NoSuchCall", 1, 1)
    _core._sim_inject("cuMemGetInfo", 0, 1)  # disarms, "cu" prefix allowed


@pytest.mark.gpu
def test_injection_needs_the_simulator():
    with pytest.raises(RuntimeError, match="simulator"):
        _core._sim_inject("MemAlloc", 1, 2)


def test_real_out_of_memory(ctx):
    free, total = ctx.get_memory_info()
    with pytest.raises(cudamem.CudaOutOfMemoryError) as ei:
        ctx.memalloc(total * 4)
    assert isinstance(ei.value, MemoryError)
    assert ei.value.code == CUDA_ERROR_OUT_OF_MEMORY
    assert "cuMemAlloc" in str(ei.value)
