# SPDX-License-Identifier: MIT
"""PyTorch's entry points (cudamem_torch_alloc / cudamem_torch_free) on
the pool manager's lane: blocks taken from the pool and given back with
no Python object and without the GIL, the table of what PyTorch holds
kept in C.  The entry points are called through ctypes, which releases
the GIL around the call, as PyTorch does.

Model-based: seeded random programs of allocations and frees on several
streams, some held by gates, check that no two live allocations overlap,
that a block given back on one stream is not handed to another while
work queued on the first before the free can still use it, and that
memory_stats() counts what the model holds.  The failing seed is in the
assertion message."""

import gc
import random
import threading
import weakref

import pytest

import cudamem
from cudamem import _core, interop
from helpers.crashutil import run_child
from helpers.isolation import (manager_context, run_module_in_a_child,
                               skip_unless_own_process)
from helpers.torch_entry import entry_points

KiB = 1 << 10
SIZES = [1, 100, 512, 4 * KiB, 64 * KiB, 300 * KiB, 2 << 20]


# These tests switch managers with close(), which resets the primary
# context that other libraries of the test process share on a GPU: there
# the module runs in a child process of its own.


@pytest.fixture(autouse=True)
def _isolated_on_a_gpu(request):
    skip_unless_own_process(request, "test_lane_module_in_a_child")


@pytest.mark.timeout(330)
def test_lane_module_in_a_child_process():
    run_module_in_a_child(__file__, timeout=300)


@pytest.fixture
def lib():
    """The extension loaded with ctypes, typed as PyTorch calls it."""
    lib = entry_points()
    interop.torch_last_error()
    yield lib
    assert _core._torch_live() == 0
    assert interop.torch_last_error() is None


@pytest.fixture(params=["pool", "default", "async"])
def mgr_ctx(request):
    with manager_context(request.param) as ctx:
        yield ctx


@pytest.fixture
def pool_ctx():
    with manager_context("pool") as ctx:
        yield ctx


def client_objects():
    return sum(1 for o in gc.get_objects()
               if type(o) is _core.ClientAllocation)


def stats():
    return cudamem.memory_stats()


def test_counts_and_values_under_every_manager(mgr_ctx, lib):
    dev = mgr_ctx.device.id
    st0 = stats()
    ptrs = [lib.cudamem_torch_alloc(4 * KiB, dev, None) for _ in range(8)]
    assert all(ptrs) and len(set(ptrs)) == 8
    st = stats()
    assert st["by_client"]["torch"] == st0["by_client"]["torch"] + 32 * KiB
    assert st["allocated_bytes"] == st0["allocated_bytes"] + 32 * KiB
    assert st["allocation_count"] == st0["allocation_count"] + 8
    assert st["total_allocations"] == st0["total_allocations"] + 8
    assert st["peak_allocated_bytes"] >= st["allocated_bytes"]
    assert st["by_client"]["cudamem"] == st0["by_client"]["cudamem"]
    assert _core._torch_live() == 8
    import numpy as np
    for i, p in enumerate(ptrs):
        view = cudamem.from_cuda_array_interface(
            {"shape": (512,), "typestr": "<f8", "data": (p, False),
             "version": 3, "strides": None})
        view.copy_to_device(np.full(512, float(i)))
    for i, p in enumerate(ptrs):
        view = cudamem.from_cuda_array_interface(
            {"shape": (512,), "typestr": "<f8", "data": (p, False),
             "version": 3, "strides": None})
        assert (view.copy_to_host() == i).all()
        del view
    for p in ptrs:
        lib.cudamem_torch_free(p, 4 * KiB, dev, None)
    st = stats()
    assert st["by_client"]["torch"] == st0["by_client"]["torch"]
    assert st["allocation_count"] == st0["allocation_count"]


def test_the_pool_serves_pytorch_with_no_python_object(pool_ctx, lib):
    dev = pool_ctx.device.id
    # The first allocation grows the pool (with the GIL); the rest are
    # taken from it.
    lib.cudamem_torch_free(lib.cudamem_torch_alloc(4 * KiB, dev, None),
                           4 * KiB, dev, None)
    gc.collect()
    assert client_objects() == 0
    ptrs = [lib.cudamem_torch_alloc(4 * KiB, dev, None) for _ in range(16)]
    assert all(ptrs)
    assert client_objects() == 0
    assert stats()["by_client"]["torch"] == 16 * 4 * KiB
    for p in ptrs:
        lib.cudamem_torch_free(p, 4 * KiB, dev, None)
    assert stats()["by_client"]["torch"] == 0


def test_other_managers_hold_a_client_allocation(lib):
    # The contrast with the test above: without a lane, each allocation
    # is a ClientAllocation (and its DeviceAllocation).
    with manager_context("default") as ctx:
        p = lib.cudamem_torch_alloc(4 * KiB, ctx.device.id, None)
        assert p and client_objects() == 1
        lib.cudamem_torch_free(p, 4 * KiB, ctx.device.id, None)
        assert client_objects() == 0


def test_a_plugin_set_later_takes_over_from_the_lane(pool_ctx, lib):
    from helpers.emm_plugin import CountingManager

    dev = pool_ctx.device.id
    lib.cudamem_torch_free(lib.cudamem_torch_alloc(512, dev, None), 512,
                           dev, None)
    builtin = pool_ctx.memory_manager
    plugin = CountingManager(context=pool_ctx)
    pool_ctx.memory_manager = plugin
    try:
        p = lib.cudamem_torch_alloc(4 * KiB, dev, None)
        assert p and plugin.live == {p: 4 * KiB}
        lib.cudamem_torch_free(p, 4 * KiB, dev, None)
        assert plugin.live == {}
    finally:
        pool_ctx.memory_manager = builtin


def _gate_model(lib, dev, seed, steps=80):
    """One random program (see the module's docstring); raises
    AssertionError naming the seed."""
    rng = random.Random(seed)
    streams = [_core._raw_stream_create(1) for _ in range(3)]
    live = {}        # ptr -> (size, stream)
    fenced = []      # (ptr, size, stream, gate): freed behind a closed gate
    gates = {}       # stream -> its gates, in order: (step, handle)
    closed = []      # the gates not yet opened
    try:
        for step in range(steps):
            op = rng.random()
            if op < 0.45 or not live:
                size = rng.choice(SIZES)
                s = rng.choice(streams)
                p = lib.cudamem_torch_alloc(size, dev, s)
                assert p, "seed %d step %d: NULL (%r)" % (
                    seed, step, interop.torch_last_error())
                for q, (n, _) in live.items():
                    assert p + size <= q or q + n <= p, (
                        "seed %d step %d: %#x+%d overlaps live %#x+%d"
                        % (seed, step, p, size, q, n))
                for q, n, fs, g in fenced:
                    if fs != s and g in closed:
                        assert p + size <= q or q + n <= p, (
                            "seed %d step %d: %#x+%d handed to another "
                            "stream while the stream it was freed on is "
                            "held (%#x+%d)" % (seed, step, p, size, q, n))
                live[p] = (size, s)
            elif op < 0.8:
                p = rng.choice(sorted(live))
                size, s = live.pop(p)
                lib.cudamem_torch_free(p, size, dev, s)
                for g in gates.get(s, []):
                    if g in closed:
                        fenced.append((p, size, s, g))
            elif op < 0.9 and len(closed) < 3:
                # A gate's handle is an address that a later gate may
                # get again: the model names gates by a count.
                s = rng.choice(streams)
                g = (step, _core._raw_gate(s))
                gates.setdefault(s, []).append(g)
                closed.append(g)
            elif closed:
                g = closed.pop(rng.randrange(len(closed)))
                _core._raw_gate_open(g[1])
            want = sum(n for n, _ in live.values())
            got = stats()["by_client"]["torch"]
            assert got == want, "seed %d step %d: torch holds %d, model %d" % (
                seed, step, got, want)
    finally:
        for g in closed:
            _core._raw_gate_open(g[1])
        for p, (size, s) in live.items():
            lib.cudamem_torch_free(p, size, dev, s)
        for h in streams:
            _core._raw_stream_synchronize(h)
            _core._raw_stream_destroy(h)


@pytest.mark.parametrize("block", range(4))
def test_random_programs_with_held_streams(pool_ctx, lib, block):
    dev = pool_ctx.device.id
    for seed in range(block * 50, block * 50 + 50):
        _gate_model(lib, dev, seed)
        assert stats()["by_client"]["torch"] == 0


def test_threads_never_share_a_block(pool_ctx, lib):
    dev = pool_ctx.device.id
    streams = [_core._raw_stream_create(1) for _ in range(2)] + [None]
    lock = threading.Lock()
    live = {}
    errors = []

    def work(seed):
        rng = random.Random(seed)
        mine = []
        try:
            for _ in range(400):
                if rng.random() < 0.55 or not mine:
                    size = rng.choice(SIZES[:5])
                    s = rng.choice(streams)
                    p = lib.cudamem_torch_alloc(size, dev, s)
                    assert p, "seed %d: NULL" % seed
                    with lock:
                        for q, n in live.items():
                            assert p + size <= q or q + n <= p, (
                                "seed %d: %#x+%d overlaps %#x+%d"
                                % (seed, p, size, q, n))
                        live[p] = size
                    mine.append((p, size, s))
                else:
                    p, size, s = mine.pop(rng.randrange(len(mine)))
                    with lock:
                        del live[p]
                    lib.cudamem_torch_free(p, size, dev, s)
            for p, size, s in mine:
                with lock:
                    del live[p]
                lib.cudamem_torch_free(p, size, dev, s)
        except AssertionError as e:
            errors.append(e)

    try:
        for rnd in range(3):
            ts = [threading.Thread(target=work, args=(rnd * 10 + i,))
                  for i in range(4)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            assert not errors, errors[0]
            st = stats()
            assert st["by_client"]["torch"] == 0
            assert _core._torch_live() == 0
    finally:
        for h in streams[:2]:
            _core._raw_stream_synchronize(h)
            _core._raw_stream_destroy(h)


def test_defer_cleanup_holds_what_pytorch_gives_back(pool_ctx, lib):
    dev = pool_ctx.device.id
    s = _core._raw_stream_create(1)
    try:
        lib.cudamem_torch_free(lib.cudamem_torch_alloc(64 * KiB, dev, s),
                               64 * KiB, dev, s)
        with cudamem.defer_cleanup():
            p = lib.cudamem_torch_alloc(64 * KiB, dev, s)
            before = stats()["pending_free_count"]
            lib.cudamem_torch_free(p, 64 * KiB, dev, s)
            st = stats()
            assert st["pending_free_count"] == before + 1
            assert st["by_client"]["torch"] == 0
            q = lib.cudamem_torch_alloc(64 * KiB, dev, s)
            assert q != p          # p is still queued, not in the pool
            lib.cudamem_torch_free(q, 64 * KiB, dev, s)
        pool_ctx.memory_manager.deallocations.clear()
        assert stats()["pending_free_count"] == 0
        got = {lib.cudamem_torch_alloc(64 * KiB, dev, s) for _ in range(2)}
        assert p in got            # back in the pool after the flush
        for x in got:
            lib.cudamem_torch_free(x, 64 * KiB, dev, s)
    finally:
        _core._raw_stream_synchronize(s)
        _core._raw_stream_destroy(s)


def test_history_records_the_lane(pool_ctx, lib):
    dev = pool_ctx.device.id
    lib.cudamem_torch_free(lib.cudamem_torch_alloc(512, dev, None), 512,
                           dev, None)
    cudamem.memory_history(True, max_entries=100)
    try:
        p = lib.cudamem_torch_alloc(1000, dev, None)
        lib.cudamem_torch_free(p, 1000, dev, None)
        ev = [e for e in cudamem.memory_snapshot()["history"]["entries"]
              if e["address"] == p]
    finally:
        cudamem.memory_history(False)
    assert [e["action"] for e in ev] == ["alloc", "free"]
    assert all(e["size"] == 1000 and e["kind"] == "device" for e in ev)


def test_free_from_a_stream_callback_is_queued(pool_ctx, lib):
    dev = pool_ctx.device.id
    s = cudamem.stream()
    h = int(s.handle.value if hasattr(s.handle, "value") else s.handle)
    p = lib.cudamem_torch_alloc(4 * KiB, dev, h)
    s.add_callback(lambda st, status, arg: lib.cudamem_torch_free(
        arg, 4 * KiB, dev, h), p)
    s.synchronize()
    assert _core._torch_live() == 0
    assert stats()["by_client"]["torch"] == 0
    pool_ctx.memory_manager.deallocations.clear()
    assert stats()["pending_free_count"] == 0


def test_close_while_pytorch_holds_memory(lib):
    with manager_context("pool") as ctx:
        dev = ctx.device.id
        p = lib.cudamem_torch_alloc(4 * KiB, dev, None)
        assert p
        ref = weakref.ref(ctx)
        del ctx
    # Closed: the entry stays until PyTorch gives it back, which is safe.
    assert _core._torch_live() == 1
    gc.collect()
    assert ref() is not None       # the lane keeps the closed context
    lib.cudamem_torch_free(p, 4 * KiB, dev, None)
    gc.collect()
    assert ref() is None           # and lets it go with the last entry
    with manager_context("pool"):
        q = lib.cudamem_torch_alloc(4 * KiB, dev, None)
        assert q and stats()["by_client"]["torch"] == 4 * KiB
        lib.cudamem_torch_free(q, 4 * KiB, dev, None)


def test_close_and_reset_beside_threads_on_the_lane():
    # Threads allocate and free through the lane while the main thread
    # closes and resets the device; in a child so that a crash is
    # reported.  Allocations during a close may fail (NULL, with the
    # reason kept); nothing may crash or hang, and everything given
    # back leaves nothing counted.
    run_child("""
        import threading, time, random
        import cudamem
        from cudamem import _core, interop
        cudamem.set_memory_manager("pool")
        cudamem.current_context()
        from helpers.torch_entry import entry_points
        lib = entry_points()
        stop = time.monotonic() + 1.5
        nulls = [0]

        def work(seed):
            rng = random.Random(seed)
            mine = []
            while time.monotonic() < stop:
                if rng.random() < 0.55 or not mine:
                    n = rng.choice([256, 4096, 100000])
                    p = lib.cudamem_torch_alloc(n, 0, None)
                    if p:
                        mine.append((p, n))
                    else:
                        nulls[0] += 1
                else:
                    p, n = mine.pop(rng.randrange(len(mine)))
                    lib.cudamem_torch_free(p, n, 0, None)
            for p, n in mine:
                lib.cudamem_torch_free(p, n, 0, None)

        ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        i = 0
        while time.monotonic() < stop:
            time.sleep(0.02)
            if i % 2:
                cudamem.close()
            else:
                cudamem.get_current_device().reset()
            cudamem.current_context()
            i += 1
        for t in ts:
            t.join()
        interop.torch_last_error()
        assert _core._torch_live() == 0, _core._torch_live()
        assert cudamem.memory_stats()["by_client"]["torch"] == 0
        print("ok", i, nulls[0])
    """, timeout=120)


def test_out_of_memory_names_what_pytorch_holds(pool_ctx, lib):
    dev = pool_ctx.device.id
    held = lib.cudamem_torch_alloc(64 * KiB, dev, None)
    free, total = pool_ctx.get_memory_info()
    assert lib.cudamem_torch_alloc(total * 4, dev, None) is None
    e = interop.torch_last_error()
    assert isinstance(e, cudamem.CudaOutOfMemoryError)
    assert e.by_client["torch"] == 64 * KiB
    assert "torch 65536 bytes" in str(e)
    lib.cudamem_torch_free(held, 64 * KiB, dev, None)


@pytest.mark.multi_gpu
def test_each_device_has_its_lane():
    # PyTorch allocates on device 1 from a thread whose current device
    # is 0: the lane of device 1 serves it in device 1's context and
    # leaves device 0 current.
    run_child("""
        import numpy as np
        import cudamem
        from cudamem import _core
        cudamem.set_memory_manager("pool")
        from helpers.torch_entry import entry_points
        lib = entry_points()
        cudamem.select_device(0)
        cudamem.current_context()

        def torch_bytes(dev):
            return cudamem.memory_stats(dev)["by_client"]["torch"]

        for rnd in range(3):      # the first grows the pools, then lanes
            p1 = lib.cudamem_torch_alloc(4096, 1, None)
            p0 = lib.cudamem_torch_alloc(4096, 0, None)
            assert p1 and p0 and p1 != p0
            assert _core._current_device_id() == 0
            assert torch_bytes(1) == 4096 and torch_bytes(0) == 4096
            with cudamem.gpus[1]:
                v = cudamem.from_cuda_array_interface(
                    {"shape": (512,), "typestr": "<f8", "data": (p1, False),
                     "version": 3, "strides": None})
                assert v.__dlpack_device__() == (2, 1)
                v.copy_to_device(np.arange(512.0))
                assert (v.copy_to_host() == np.arange(512.0)).all()
                del v
            lib.cudamem_torch_free(p1, 4096, 1, None)
            lib.cudamem_torch_free(p0, 4096, 0, None)
            assert torch_bytes(1) == 0 and torch_bytes(0) == 0
            assert _core._current_device_id() == 0
        assert _core._torch_live() == 0
        print("ok")
    """, timeout=120)
