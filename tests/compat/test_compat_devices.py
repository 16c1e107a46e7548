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


@pytest.mark.parametrize("which", ["memory", "context"])
def test_queue_disable_holds_and_nests(cuda, which):
    # PendingDeallocs.disable(): the context manager numba's own
    # defer_cleanup() is made of, on either queue.
    ctx = cuda.current_context()
    q = (ctx.memory_manager.deallocations if which == "memory"
         else ctx.deallocations)
    gc.collect()
    q.clear()
    assert not q.is_disabled
    with q.disable():
        assert q.is_disabled
        with q.disable():
            if which == "memory":
                d = cuda.device_array(64, np.uint8)
            else:
                d = cuda.event()
            del d
            gc.collect()
        assert q.is_disabled
        q.clear()                       # held: does nothing
        assert len(q) == 1
    assert not q.is_disabled
    assert len(q) == 1
    q.clear()
    assert len(q) == 0


def test_queue_disable_exits_on_an_exception(cuda):
    q = cuda.current_context().memory_manager.deallocations
    with pytest.raises(KeyError):
        with q.disable():
            assert q.is_disabled
            raise KeyError("inside")
    assert not q.is_disabled


def test_max_pending_bytes_is_the_ratio_of_the_device_memory(cuda):
    ctx = cuda.current_context()
    q = ctx.memory_manager.deallocations
    total = ctx.get_memory_info()[1]
    # CUDA_DEALLOCS_RATIO's default, 0.2.
    assert abs(q._max_pending_bytes - int(total * 0.2)) <= 1
