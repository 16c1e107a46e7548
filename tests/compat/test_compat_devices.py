# SPDX-License-Identifier: MIT
"""gpus, require_context and deferred cleanup as numba has them."""

import gc

import numpy as np
import pytest


def test_gpus_lst(cuda):
    lst = cuda.gpus.lst
    assert len(lst) == len(cuda.gpus) >= 1
    assert [d.id for d in lst] == list(range(len(cuda.gpus)))
    assert str(lst[0]) == "<Managed Device 0>"


def test_require_context_runs_in_a_context(cuda):
    devices = cuda.cudadrv.devices

    @devices.require_context
    def body():
        return cuda.current_context()

    assert body() == cuda.current_context()
    with cuda.gpus[0]:
        assert body().device.id == 0


def test_require_context_same_device_is_allowed(cuda):
    devices = cuda.cudadrv.devices

    @devices.require_context
    def body():
        with cuda.gpus[0]:
            return cuda.current_context().device.id

    assert body() == 0


@pytest.mark.multi_gpu
def test_require_context_cannot_switch(cuda):
    devices = cuda.cudadrv.devices

    @devices.require_context
    def body():
        with cuda.gpus[1]:
            pass

    with pytest.raises(RuntimeError, match="Cannot switch CUDA-context."):
        body()
    with cuda.gpus[1]:                  # outside such a function: allowed
        assert cuda.current_context().device.id == 1
    assert cuda.current_context().device.id == 0


def test_defer_cleanup_exit_keeps_the_queue(cuda):
    ctx = cuda.current_context()
    q = ctx.memory_manager.deallocations
    gc.collect()
    q.clear()
    with cuda.defer_cleanup():
        d = cuda.device_array(1024, np.uint8)
        del d
        gc.collect()
        assert len(q) == 1
    assert len(q) == 1          # leaving the block frees nothing
    q.clear()
    assert len(q) == 0


def test_context_defer_cleanup_nests(cuda):
    ctx = cuda.current_context()
    q = ctx.memory_manager.deallocations
    q.clear()
    with ctx.defer_cleanup():
        with ctx.defer_cleanup():
            d = cuda.device_array(64, np.uint8)
            del d
            gc.collect()
            q.clear()                    # held: does nothing
            assert len(q) == 1
        assert len(q) == 1
    q.clear()
    assert len(q) == 0
