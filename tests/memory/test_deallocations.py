# SPDX-License-Identifier: MIT
"""Deferred deallocation (docs/api.md#deferred-deallocation): the two
queues per context, their thresholds, defer_cleanup(), the out-of-memory
flush-and-retry, errors while flushing, and memory_stats()."""

import sys

import pytest

import cudamem
from cudamem import _core
from helpers import run_child

# Reads the device's free memory (or loads the whole machine): on a GPU
# it runs alone, not beside other test processes (.ci/gpu).
pytestmark = pytest.mark.exclusive


MiB = 1 << 20


def test_queues_are_where_numba_has_them(ctx):
    assert ctx.memory_manager.deallocations is ctx._memory_deallocations
    assert ctx.deallocations is not ctx.memory_manager.deallocations
    assert ctx.memory_manager.interface_version == 1
    assert isinstance(ctx.deallocations, cudamem._core.PendingDeallocs)


def test_free_is_queued_not_done(ctx, memq):
    free0 = ctx.get_memory_info().free
    m = ctx.memalloc(8 * MiB)
    del m
    assert len(memq) == 1
    assert memq.pending_bytes == 8 * MiB
    assert ctx.get_memory_info().free <= free0 - 8 * MiB
    memq.clear()
    assert len(memq) == 0 and memq.pending_bytes == 0
    assert ctx.get_memory_info().free >= free0


def test_count_threshold_is_strict(ctx, memq):
    ms = [ctx.memalloc(1024) for _ in range(11)]
    for _ in range(10):
        ms.pop()
    assert len(memq) == 10  # not above the limit yet
    ms.pop()
    assert len(memq) == 0  # 11 > 10: flushed


def test_count_threshold_changes_at_run_time(ctx, memq):
    _core._set_dealloc_config(2, 0.2)
    ms = [ctx.memalloc(1024) for _ in range(3)]
    ms.pop()
    ms.pop()
    assert len(memq) == 2
    ms.pop()
    assert len(memq) == 0


def test_byte_threshold(ctx, memq):
    total = ctx.get_memory_info().total
    _core._set_dealloc_config(1000, 0.001)
    limit = int(total * 0.001)
    m1 = ctx.memalloc(limit)
    m2 = ctx.memalloc(4096)
    del m1
    assert len(memq) == 1  # exactly at the limit: not above
    del m2
    assert len(memq) == 0


def test_defer_cleanup_holds_and_nests(ctx, memq):
    _core._set_dealloc_config(0, 0.2)
    with cudamem.defer_cleanup():
        with cudamem.defer_cleanup():
            m = ctx.memalloc(1024)
            del m
            assert len(memq) == 1
            memq.clear()  # even an explicit clear does nothing
            assert len(memq) == 1
        assert len(memq) == 1  # the inner exit does not flush
    assert len(memq) == 1  # nor the outermost one (numba): no stall there
    m = ctx.memalloc(1024)
    del m                  # the next add applies the thresholds
    assert len(memq) == 0


def test_defer_cleanup_exits_on_exception(ctx, memq):
    with pytest.raises(KeyError):
        with cudamem.defer_cleanup():
            raise KeyError("x")
    assert not memq.is_disabled
    assert not ctx.deallocations.is_disabled


def test_out_of_memory_flushes_and_retries(ctx, memq):
    total = ctx.get_memory_info().total
    _core._set_dealloc_config(1000, 1.0)
    big = int(total * 0.6)
    m = ctx.memalloc(big)
    del m
    assert memq.pending_bytes == big
    m2 = ctx.memalloc(big)  # fails at first, flushes, then succeeds
    assert len(memq) == 0
    del m2


def test_out_of_memory_snapshot(ctx, memq):
    total = ctx.get_memory_info().total
    with pytest.raises(cudamem.CudaOutOfMemoryError) as ei:
        ctx.memalloc(total * 2)
    e = ei.value
    assert isinstance(e, MemoryError)
    assert e.requested == total * 2
    assert e.total == total and 0 <= e.free <= total
    assert e.pending_bytes == 0 and e.pool_reserved == 0
    assert e.largest_free_block is None
    assert "%d bytes requested" % (total * 2) in str(e)


@pytest.mark.sim
def test_error_while_flushing(ctx, memq):
    _core._set_dealloc_config(1000, 1.0)
    ms = [ctx.memalloc(1024) for _ in range(4)]
    del ms[:]
    assert len(memq) == 4
    _core._sim_inject("MemFree", 2, 1)  # the second free fails
    with pytest.raises(cudamem.CudaAPIError, match="cuMemFree") as ei:
        memq.clear()
    assert ei.value.name == "CUDA_ERROR_INVALID_VALUE"
    assert len(memq) == 2  # the failing entry is dropped, the rest stay
    memq.clear()
    assert len(memq) == 0


@pytest.mark.sim
def test_error_while_flushing_from_a_dealloc_is_reported(ctx, memq):
    _core._set_dealloc_config(0, 1.0)
    m = ctx.memalloc(1024)
    _core._sim_inject("MemFree", 1, 1)
    seen = []
    old = sys.unraisablehook
    sys.unraisablehook = seen.append
    try:
        del m
    finally:
        sys.unraisablehook = old
    assert len(seen) == 1
    assert isinstance(seen[0].exc_value, cudamem.CudaAPIError)


def test_memory_stats(ctx, memq):
    ctx.deallocations.clear()    # what earlier tests left (streams, events)
    s0 = cudamem.memory_stats()
    m = ctx.memalloc(3 * MiB)
    s1 = cudamem.memory_stats()
    assert s1["allocated_bytes"] == s0["allocated_bytes"] + 3 * MiB
    assert s1["allocation_count"] == s0["allocation_count"] + 1
    assert s1["peak_allocated_bytes"] >= s1["allocated_bytes"]
    assert s1["manager"] == "default"
    del m
    s2 = cudamem.memory_stats(0)
    assert s2["allocated_bytes"] == s0["allocated_bytes"]
    assert s2["pending_free_count"] == 1
    assert s2["pending_free_bytes"] == 3 * MiB
    assert set(s2) >= {"allocated_bytes", "peak_allocated_bytes",
                       "allocation_count", "pending_free_count",
                       "pending_free_bytes", "pool_reserved_bytes",
                       "pool_free_bytes", "pinned_bytes", "manager"}
    assert cudamem.memory_stats(device=ctx.device)["manager"] == "default"


def test_close_flushes_what_is_queued():
    code = """if 1:
        import cudamem
        ctx = cudamem.current_context()
        m = ctx.memalloc(1 << 20)
        free0 = ctx.get_memory_info().free
        del m
        assert len(ctx.memory_manager.deallocations) == 1
        cudamem.close()
        print("ok")
    """
    p = run_child(code, timeout=120, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stderr == ""


@pytest.mark.parametrize("prefix", ["NUMBA_CUDA_", "CUDAMEM_"])
def test_environment_sets_the_thresholds(prefix):
    code = """if 1:
        import cudamem
        ctx = cudamem.current_context()
        q = ctx.memory_manager.deallocations
        ms = [ctx.memalloc(1024) for _ in range(3)]
        ms.pop(); ms.pop()
        print(len(q))
        ms.pop()
        print(len(q))
    """
    env = {prefix + "MAX_PENDING_DEALLOCS_COUNT": "2"}
    if prefix == "CUDAMEM_":
        env["NUMBA_CUDA_MAX_PENDING_DEALLOCS_COUNT"] = "100"
    p = run_child(code, timeout=120, check=False, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.split() == ["2", "0"]
