# SPDX-License-Identifier: MIT
"""The built-in memory managers "pool" (cudamem's caching allocator) and
"async" (the driver's stream-ordered allocator): reuse, split and
coalesce, stream-aware reuse, trim, limit, statistics, the one
out-of-memory policy, defer_cleanup, the environment variable, and a
threaded stress test."""

import ctypes
import gc
import os
import threading

import pytest

import cudamem
from cudamem import _core
from helpers import run_py
from helpers.isolation import (SIMULATOR, manager_context,
                               run_module_in_a_child,
                               skip_unless_own_process, use_manager)

# Reads the device's free memory (or loads the whole machine): on a GPU
# it runs alone, not beside other test processes (.ci/gpu).
pytestmark = pytest.mark.exclusive

KiB = 1 << 10
MiB = 1 << 20

# These tests switch managers with close(), which resets the primary
# context.  On a GPU other libraries of the test process (CuPy, PyTorch)
# share that context, so there the module runs in a child process of its
# own (test_pool_module_in_a_child_process) and is skipped here.


# The pool is on virtual memory unless CUDAMEM_POOL_VMM=0, under which
# test_pool_vmm.py runs the module again: the tests of cuMemAlloc'd
# segments' layout run there (test_pool_vmm.py tests the arenas').
VMM = os.environ.get("CUDAMEM_POOL_VMM", "1") != "0"
cumemalloc_segments = pytest.mark.skipif(
    VMM, reason="the layout of cuMemAlloc'd segments (test_pool_vmm.py "
    "tests the arenas of virtual memory)")


@pytest.fixture(autouse=True)
def _isolated_on_a_gpu(request):
    skip_unless_own_process(request, "test_pool_module_in_a_child")


@pytest.mark.timeout(430)
def test_pool_module_in_a_child_process():
    run_module_in_a_child(__file__, timeout=400)


@pytest.fixture
def pool_ctx():
    with manager_context("pool") as ctx:
        yield ctx


@pytest.fixture
def async_ctx():
    with manager_context("async") as ctx:
        yield ctx


@pytest.fixture(params=["pool", "async"])
def any_ctx(request):
    with manager_context(request.param) as ctx:
        yield ctx


@pytest.fixture
def streams():
    """Two raw non-blocking streams of the current context."""
    hs = [_core._raw_stream_create(1), _core._raw_stream_create(1)]
    yield hs
    for h in hs:
        _core._raw_stream_synchronize(h)
        _core._raw_stream_destroy(h)


# ---------------------------------------------------------------------------
# Choosing the manager
# ---------------------------------------------------------------------------


def test_manager_objects_and_names(any_ctx):
    mm = any_ctx.memory_manager
    kind = cudamem.memory_stats()["manager"]
    assert kind in ("pool", "async")
    cls = (cudamem.PoolMemoryManager if kind == "pool"
           else cudamem.AsyncMemoryManager)
    assert type(mm) is cls
    assert isinstance(mm, cudamem._emm.DefaultMemoryManager)
    assert mm.interface_version == 1
    assert mm.deallocations is any_ctx._memory_deallocations
    assert set(mm.stats()) >= {"reserved_bytes", "free_bytes",
                               "largest_free_block", "limit"}


def test_set_memory_manager_applies_to_new_contexts_only(pool_ctx):
    m = pool_ctx.memalloc(4096)
    cudamem.set_memory_manager("default")
    assert cudamem.memory_stats()["manager"] == "pool"  # unchanged
    del m                                                # still its pool
    assert cudamem.memory_stats()["allocated_bytes"] == 0
    cudamem.close()
    cudamem.current_context()
    assert cudamem.memory_stats()["manager"] == "default"


def test_unknown_builtin_name():
    with pytest.raises(ValueError, match="unknown built-in memory manager"):
        cudamem.set_memory_manager("pooled")


def test_pool_functions_refuse_other_managers(ctx):
    with pytest.raises(RuntimeError, match="not a built-in pool"):
        _core._pool_trim(ctx)
    with pytest.raises(RuntimeError, match="not a built-in pool"):
        _core._async_shareable(ctx)


def test_only_the_async_manager_has_a_pool_to_share(pool_ctx):
    with pytest.raises(RuntimeError, match="only the async manager"):
        _core._async_shareable(pool_ctx)


@pytest.mark.parametrize("var", ["CUDAMEM_MEMORY_MANAGER",
                                 "NUMBA_CUDA_MEMORY_MANAGER"])
@pytest.mark.parametrize("kind", ["pool", "async"])
def test_environment_variable(var, kind):
    rc, out = run_py("""
        import cudamem
        ctx = cudamem.current_context()
        print(cudamem.memory_stats()["manager"],
              type(ctx.memory_manager).__name__)
        m = ctx.memalloc(1000)
        del m
        print(cudamem.memory_stats()["allocated_bytes"])
        """, **{var: kind})
    assert rc == 0, out
    name = "PoolMemoryManager" if kind == "pool" else "AsyncMemoryManager"
    assert out.split() == [kind, name, "0"]


def test_environment_pool_limit():
    rc, out = run_py("""
        import cudamem
        ctx = cudamem.current_context()
        print(ctx.memory_manager.limit)
        try:
            ctx.memalloc(5 << 20)
        except cudamem.CudaOutOfMemoryError as e:
            print("oom", e.pool_reserved)
        """, CUDAMEM_MEMORY_MANAGER="pool", CUDAMEM_POOL_LIMIT="4M")
    assert rc == 0, out
    assert out.split() == [str(4 * MiB), "oom", "0"]


def test_explicit_call_wins_over_the_environment():
    rc, out = run_py("""
        import cudamem
        cudamem.set_memory_manager("default")
        cudamem.current_context()
        print(cudamem.memory_stats()["manager"])
        """, CUDAMEM_MEMORY_MANAGER="pool")
    assert rc == 0, out
    assert out.split() == ["default"]


@pytest.mark.parametrize("env", ["async", "helpers.emm_plugin"])
def test_explicit_call_racing_the_environment_wins(env):
    # set_memory_manager in one thread while another makes the
    # environment's choice (what the first context of a thread does):
    # the explicit call wins whichever runs first, and the state is never
    # half one and half the other (a plugin with a pool kind, or the
    # environment's kind after the call).  The environment's plugin
    # calls set_memory_manager itself, under the same lock.
    rc, out = run_py("""
        import sys, threading
        import cudamem
        from cudamem import _core, _emm
        from helpers import emm_plugin

        sys.setswitchinterval(1e-6)     # switch threads often
        want = {"pool": ("pool", None),
                emm_plugin.CountingManager: ("default",
                                             emm_plugin.CountingManager)}
        bad = []
        for i in range(1500):
            choice = list(want)[i % 2]
            _emm._env_done = False      # the environment not read yet
            go = threading.Barrier(2)

            def explicit():
                go.wait()
                cudamem.set_memory_manager(choice)

            def environment():
                go.wait()
                _emm._from_environment()

            ts = [threading.Thread(target=f)
                  for f in (explicit, environment)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            got = (_core._builtin_manager(), _emm._plugin)
            if got != want[choice]:
                bad.append((i, got))
        print("bad", len(bad), bad[:3])
        """, timeout=240, CUDAMEM_MEMORY_MANAGER=env)
    assert rc == 0, out
    assert out.split()[:2] == ["bad", "0"], out


# ---------------------------------------------------------------------------
# The pool
# ---------------------------------------------------------------------------


def test_reuse_on_the_same_stream(pool_ctx):
    a = pool_ctx.memalloc(1000)
    pa = a.device_pointer
    del a
    b = pool_ctx.memalloc(700)  # same size class (rounded to 512s): 1 KiB
    assert b.device_pointer == pa
    assert cudamem.memory_stats()["total_allocations"] == 2


@cumemalloc_segments
def test_split_and_coalesce(pool_ctx):
    mm = pool_ctx.memory_manager
    a = pool_ctx.memalloc(4 * KiB)
    b = pool_ctx.memalloc(4 * KiB)
    c = pool_ctx.memalloc(4 * KiB)
    s = mm.stats()
    # Split from one 2 MiB segment, back to back.
    assert s["segments"] == 1 and s["reserved_bytes"] == 2 * MiB
    assert b.device_pointer == a.device_pointer + 4 * KiB
    assert c.device_pointer == b.device_pointer + 4 * KiB
    assert s["free_bytes"] == 2 * MiB - 12 * KiB
    assert s["largest_free_block"] == 2 * MiB - 12 * KiB
    pa = a.device_pointer
    del a, c
    s = mm.stats()
    # c coalesced with the tail; a alone (b is between).
    assert s["free_bytes"] == 2 * MiB - 4 * KiB
    assert s["largest_free_block"] == 2 * MiB - 8 * KiB
    del b
    s = mm.stats()
    assert s["largest_free_block"] == 2 * MiB  # one block again
    d = pool_ctx.memalloc(12 * KiB)
    assert d.device_pointer == pa


@cumemalloc_segments
def test_small_and_large_segments(pool_ctx):
    mm = pool_ctx.memory_manager
    big = pool_ctx.memalloc(3 * MiB)       # from a 20 MiB segment
    mid = pool_ctx.memalloc(11 * MiB)      # split from the same one
    huge = pool_ctx.memalloc(17 * MiB + 1)  # its own segment, 18 MiB
    s = mm.stats()
    assert s["segments"] == 2
    assert mid.device_pointer == big.device_pointer + 3 * MiB
    assert s["reserved_bytes"] == 20 * MiB + 18 * MiB
    small = pool_ctx.memalloc(100)         # never from a large segment
    assert mm.stats()["segments"] == 3
    del big, mid, huge, small
    mm.trim()
    assert mm.stats()["reserved_bytes"] == 0


def test_cross_stream_reuse_waits_for_the_event(pool_ctx, streams):
    s1, s2 = streams
    mm = pool_ctx.memory_manager
    first = _core._memalloc_on(pool_ctx, 512, s2)   # two streams served
    gate = _core._raw_gate(s1)               # s1's work cannot finish
    try:
        a = _core._memalloc_on(pool_ctx, 64 * KiB, s1)
        pa = a.device_pointer
        del a                                # freed: event on s1, pending
        b = _core._memalloc_on(pool_ctx, 64 * KiB, s2)
        assert b.device_pointer != pa        # not before the event
        assert mm.stats()["segments"] == 1   # the rest of the segment is
        c = _core._memalloc_on(pool_ctx, 64 * KiB, s1)
        assert c.device_pointer == pa        # s1 itself may reuse at once
        del c
    finally:
        _core._raw_gate_open(gate)
    _core._raw_stream_synchronize(s1)
    d = _core._memalloc_on(pool_ctx, 64 * KiB, s2)
    assert d.device_pointer == pa            # the event has completed
    del b, d, first


@cumemalloc_segments
def test_cross_stream_before_any_second_stream(pool_ctx, streams):
    # Freed while the pool had seen one stream only: no event at free;
    # the first other stream records one then, and waits for it.
    s1, s2 = streams
    mm = pool_ctx.memory_manager
    a = _core._memalloc_on(pool_ctx, 8 * KiB, s1)
    pa = a.device_pointer
    gate = _core._raw_gate(s1)
    try:
        del a
        b1 = _core._memalloc_on(pool_ctx, MiB, s2)
        assert mm.stats()["segments"] == 2   # s1's segment must wait
        b2 = _core._memalloc_on(pool_ctx, MiB, s2)
        assert b2.device_pointer == b1.device_pointer + MiB  # now full
        c = _core._memalloc_on(pool_ctx, 8 * KiB, s2)
        assert c.device_pointer != pa and mm.stats()["segments"] == 3
    finally:
        _core._raw_gate_open(gate)
    _core._raw_stream_synchronize(s1)
    del c                                    # back to the third segment
    assert mm.stats()["segments"] == 3
    cs = [_core._memalloc_on(pool_ctx, MiB, s2) for _ in range(3)]
    assert pa in [c.device_pointer for c in cs]  # s1's segment, at last
    assert mm.stats()["segments"] == 3
    del b1, b2, cs


@cumemalloc_segments
def test_trim(pool_ctx):
    mm = pool_ctx.memory_manager
    keep = pool_ctx.memalloc(100)
    ms = [pool_ctx.memalloc(4 * MiB) for _ in range(3)]
    free0 = pool_ctx.get_memory_info().free
    del ms
    assert mm.stats()["reserved_bytes"] == 2 * MiB + 20 * MiB
    mm.trim()
    s = mm.stats()
    assert s["reserved_bytes"] == 2 * MiB   # the segment in use stays
    assert pool_ctx.get_memory_info().free == free0 + 20 * MiB
    assert cudamem.memory_stats()["pool_reserved_bytes"] == 2 * MiB
    del keep
    mm.reset()                               # flush, then trim
    assert mm.stats()["reserved_bytes"] == 0


@cumemalloc_segments
def test_limit(pool_ctx):
    mm = pool_ctx.memory_manager
    assert mm.limit == 0
    mm.limit = 3 * MiB
    assert mm.limit == 3 * MiB
    a = pool_ctx.memalloc(100)              # 2 MiB segment
    with pytest.raises(cudamem.CudaOutOfMemoryError) as ei:
        pool_ctx.memalloc(2 * MiB)          # would need 2 MiB more
    assert ei.value.pool_reserved == 2 * MiB
    assert ei.value.largest_free_block == 2 * MiB - 512
    del a
    b = pool_ctx.memalloc(2 * MiB)          # the policy trimmed first
    assert mm.stats()["reserved_bytes"] == 2 * MiB
    del b
    mm.limit = 0


def test_memory_stats_feed(pool_ctx):
    a = pool_ctx.memalloc(3000)
    st = cudamem.memory_stats()
    assert st["manager"] == "pool"
    assert st["allocated_bytes"] == 3000 and st["allocation_count"] == 1
    assert st["pool_reserved_bytes"] == 2 * MiB
    assert st["pool_free_bytes"] == 2 * MiB - 3072
    del a
    st = cudamem.memory_stats()
    assert st["allocated_bytes"] == 0 and st["allocation_count"] == 0
    assert st["pool_free_bytes"] == 2 * MiB
    assert st["pending_free_count"] == 0


@cumemalloc_segments
def test_out_of_memory_policy_trims_and_retries(pool_ctx):
    total = pool_ctx.get_memory_info().total
    mm = pool_ctx.memory_manager
    ms = [pool_ctx.memalloc(16 * MiB) for _ in range(total // (40 * MiB))]
    del ms                                   # all cached in the pool
    assert mm.stats()["reserved_bytes"] > total // 3
    # Too big for what is left on the device, not for what the pool holds.
    big = pool_ctx.get_memory_info().free + 64 * MiB
    m = pool_ctx.memalloc(big)               # trim, then retry: succeeds
    assert m.size == big
    del m


@cumemalloc_segments
def test_out_of_memory_snapshot(pool_ctx):
    total = pool_ctx.get_memory_info().total
    keep = pool_ctx.memalloc(5000)
    with pytest.raises(cudamem.CudaOutOfMemoryError) as ei:
        pool_ctx.memalloc(total * 2)
    e = ei.value
    assert isinstance(e, MemoryError) and isinstance(e, cudamem.CudaAPIError)
    assert e.requested == total * 2 and e.total == total
    assert e.pool_reserved == 2 * MiB
    assert e.largest_free_block == 2 * MiB - 5120
    assert e.pending_bytes == 0
    msg = str(e)
    assert "%d bytes requested" % (total * 2) in msg
    assert "%d bytes held in pools" % (2 * MiB) in msg
    assert "largest free pooled block %d bytes" % (2 * MiB - 5120) in msg
    del keep


def test_out_of_memory_collects_cycles(pool_ctx):
    total = pool_ctx.get_memory_info().total

    class Holder:
        pass

    h = Holder()
    h.self = h
    h.m = pool_ctx.memalloc(int(total * 0.6))
    del h                                     # only gc can free it
    m = pool_ctx.memalloc(int(total * 0.6))
    del m


@pytest.mark.parametrize("kind", ["pool", "async"])
def test_defer_cleanup_holds_frees(kind):
    ctx = use_manager(kind)
    try:
        q = ctx.memory_manager.deallocations
        a = ctx.memalloc(8 * KiB)
        pa = a.device_pointer
        with cudamem.defer_cleanup():
            del a
            assert len(q) == 1 and q.pending_bytes == 8 * KiB
            b = ctx.memalloc(8 * KiB)
            assert b.device_pointer != pa    # still held: not reused
            st = cudamem.memory_stats()
            assert st["pending_free_count"] == 1
            assert st["allocated_bytes"] == 8 * KiB
            q.clear()                         # does nothing while held
            assert len(q) == 1
        assert len(q) == 1                    # below the thresholds
        q.clear()                             # the flush returns it
        assert len(q) == 0
        c = ctx.memalloc(8 * KiB)
        if kind == "pool":
            assert c.device_pointer == pa
        del b, c
        assert len(q) == 0                    # immediate again
        assert cudamem.memory_stats()["allocated_bytes"] == 0
    finally:
        gc.collect()
        cudamem.close()
        cudamem.set_memory_manager("default")


@pytest.mark.parametrize("kind", ["pool", "async"])
def test_defer_cleanup_flush_past_the_count(kind):
    ctx = use_manager(kind)
    try:
        q = ctx.memory_manager.deallocations
        _core._set_dealloc_config(2, 0.2)
        ms = [ctx.memalloc(1024) for _ in range(3)]
        with cudamem.defer_cleanup():
            del ms[:]
            assert len(q) == 3
        assert len(q) == 0                    # 3 > 2 on leaving
    finally:
        _core._set_dealloc_config(10, 0.2)
        gc.collect()
        cudamem.close()
        cudamem.set_memory_manager("default")


def test_close_with_live_pool_allocations():
    rc, out = run_py("""
        import cudamem
        cudamem.set_memory_manager("pool")
        ctx = cudamem.current_context()
        m = ctx.memalloc(1000)
        free0 = ctx.get_memory_info().free
        cudamem.close()
        del m                                  # its context is gone
        ctx2 = cudamem.current_context()
        print(cudamem.memory_stats()["pool_reserved_bytes"],
              ctx2.get_memory_info().free >= free0 - (64 << 20))
        """)
    assert rc == 0, out
    assert out.split() == ["0", "True"]


# ---------------------------------------------------------------------------
# The async manager
# ---------------------------------------------------------------------------


def test_async_release_threshold_keeps_memory(async_ctx):
    mm = async_ctx.memory_manager
    assert mm.release_threshold == 2**64 - 1
    a = async_ctx.memalloc(64 * KiB)
    pa = a.device_pointer
    del a
    cudamem.synchronize()
    st = cudamem.memory_stats()
    assert st["manager"] == "async"
    # kept across the sync (the driver reserves in its own granules)
    assert st["pool_reserved_bytes"] >= 64 * KiB
    assert st["pool_free_bytes"] >= 64 * KiB
    b = async_ctx.memalloc(64 * KiB)
    assert b.device_pointer == pa
    del b
    mm.release_threshold = 0
    cudamem.synchronize()
    assert cudamem.memory_stats()["pool_reserved_bytes"] == 0
    mm.release_threshold = 2**64 - 1


def test_async_trim_and_stats(async_ctx):
    mm = async_ctx.memory_manager
    ms = [async_ctx.memalloc(1 * MiB) for _ in range(4)]
    assert mm.stats()["reserved_bytes"] >= 4 * MiB
    assert mm.stats()["largest_free_block"] is None
    del ms
    mm.trim()
    assert mm.stats()["reserved_bytes"] == 0


def test_async_cross_stream(async_ctx, streams):
    s1, s2 = streams
    gate = _core._raw_gate(s1)
    try:
        a = _core._memalloc_on(async_ctx, 32 * KiB, s1)
        pa = a.device_pointer
        del a                                 # cuMemFreeAsync on s1
        b = _core._memalloc_on(async_ctx, 32 * KiB, s2)
        assert b.device_pointer != pa
        c = _core._memalloc_on(async_ctx, 32 * KiB, s1)
        assert c.device_pointer == pa
    finally:
        _core._raw_gate_open(gate)
    del b, c


def test_async_out_of_memory_policy(async_ctx):
    total = async_ctx.get_memory_info().total
    ms = [async_ctx.memalloc(8 * MiB) for _ in range(total // (16 * MiB))]
    del ms                                    # cached by the driver pool
    # Plain cuMemAlloc memory cannot use the async pool's cache...
    assert async_ctx.get_memory_info().free <= total // 2
    big = async_ctx.get_memory_info().free + 64 * MiB
    m = async_ctx.memalloc(big)               # ...the pool's own growth can
    del m
    with pytest.raises(cudamem.CudaOutOfMemoryError) as ei:
        async_ctx.memalloc(total * 2)
    e = ei.value
    assert e.largest_free_block is None
    # The manager's own (shareable) pool, or the device's default one.
    fn = ("cuMemAllocFromPoolAsync" if async_ctx.memory_manager.shareable
          else "cuMemAllocAsync")
    assert fn in str(e)


def test_async_pool_is_its_own_and_shareable(async_ctx):
    mm = async_ctx.memory_manager
    if SIMULATOR:
        assert mm.shareable
    a = async_ctx.memalloc(64 * KiB)
    st = mm.stats()
    assert st["reserved_bytes"] >= 64 * KiB
    del a


def test_async_limit(async_ctx):
    mm = async_ctx.memory_manager
    mm.limit = 1 * MiB
    a = async_ctx.memalloc(MiB // 2)
    with pytest.raises(cudamem.CudaOutOfMemoryError):
        async_ctx.memalloc(MiB)
    del a
    b = async_ctx.memalloc(MiB)
    del b
    mm.limit = 0


@pytest.mark.parametrize("value,exc,match", [
    (None, TypeError, r"limit must be an int \(bytes; 0: none\), not "
                      r"NoneType"),
    (1.5, TypeError, r"limit must be an int .*not float"),
    (-1, ValueError, r"limit must be from 0"),
])
def test_pool_limit_bad_values(pool_ctx, value, exc, match):
    mm = pool_ctx.memory_manager
    with pytest.raises(exc, match=match):
        mm.limit = value
    assert mm.limit == 0


# ---------------------------------------------------------------------------
# Stress
# ---------------------------------------------------------------------------


# Under AddressSanitizer freed memory sits in a quarantine (RSS grows by
# design) and everything runs several times slower.
ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")


def _rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


try:
    _libc = ctypes.CDLL("libc.so.6")
    _libc.malloc_trim.argtypes = [ctypes.c_size_t]
except (OSError, AttributeError):      # not glibc
    _libc = None


@pytest.mark.parametrize("kind", ["default", "pool", "async"])
def test_threads_stress(kind):
    """8 threads x mixed-size allocate/free cycles (three rounds of them
    after a warm-up one) leave nothing live and the RSS flat.  The pool
    runs the issue's 100 000 cycles per thread a round; the default and
    async managers, which cross into the simulator's lock (or the driver)
    on every call, fewer, to stay within seconds on a small CI machine.
    CUDAMEM_STRESS_CYCLES=100000 runs the full count under every manager."""
    ctx = use_manager(kind)
    try:
        sizes = [512, 3000, 64 * KiB, 700 * KiB, 2 * MiB + 1, 5 * MiB]
        cycles = {"default": 30000, "pool": 100000, "async": 20000}[kind]
        cycles = int(os.environ.get("CUDAMEM_STRESS_CYCLES", cycles))
        if ASAN:
            cycles //= 10
        errors = []

        def work(seed):
            try:
                cudamem.current_context()
                held = []
                for i in range(cycles):
                    held.append(ctx.memalloc(sizes[(i * 7 + seed) % 6]))
                    if len(held) > 3:
                        del held[(i + seed) % len(held)]
                del held
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        def round_():
            ts = [threading.Thread(target=work, args=(k,)) for k in range(8)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()

        def rss():
            # Memory the pool caches is not a leak, and how much of it a
            # round leaves behind depends on timing (with
            # CUDAMEM_SIM_DELAY_US the async pool grew 88 MiB between
            # rounds): trimmed first, what remains is what leaked.
            if kind != "default":
                ctx.memory_manager.trim()
            # And what the C heap keeps free is not a leak either (how
            # much depends on the peak backlog of a round).
            if _libc is not None:
                _libc.malloc_trim(0)
            return _rss_kib()

        round_()                      # warm up caches and allocators
        rss0 = rss()
        round_()
        round_()
        rss1 = rss()
        assert not errors, errors[0]
        st = cudamem.memory_stats()
        assert st["allocated_bytes"] == 0 and st["allocation_count"] == 0
        assert st["total_allocations"] == 3 * 8 * cycles
        if not ASAN:
            assert rss1 - rss0 < 16 * 1024, (rss0, rss1)
    finally:
        gc.collect()
        cudamem.close()
        cudamem.set_memory_manager("default")
