# SPDX-License-Identifier: MIT
"""The pool manager on virtual memory (CUDAMEM_POOL_VMM=1): arenas cut
into pages of the device's granularity, memory mapped where blocks need
it, idle pages moved to serve any request and given back past the
release threshold once their work is done, empty_cache(), the limits,
the statistics, and the whole of test_pool.py again on the arenas."""

import gc
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import cudamem
from cudamem import _core
from helpers import ROOT, TESTS, run_py
from helpers.isolation import (SIMULATOR, manager_context,
                               skip_unless_own_process)

pytestmark = pytest.mark.exclusive

KiB = 1 << 10
MiB = 1 << 20


@pytest.fixture(autouse=True)
def _isolated_on_a_gpu(request):
    skip_unless_own_process(request, "test_vmm_module_in_a_child")


@pytest.mark.timeout(330)
def test_vmm_module_in_a_child_process():
    if SIMULATOR:
        pytest.skip("already in a process of its own")
    env = dict(os.environ, CUDAMEM_TEST_ISOLATED="1")
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p",
                        "no:cacheprovider", __file__], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]


@pytest.fixture
def vmm_ctx():
    old = _core._pool_vmm(True)
    try:
        with manager_context("pool") as ctx:
            if not _core._pool_stats(ctx)["virtual_memory"]:
                pytest.skip("the device has no virtual memory management")
            yield ctx
    finally:
        _core._pool_vmm(old)


def stats(ctx):
    return _core._pool_stats(ctx)


def fill(n, seed):
    return np.random.default_rng(seed).integers(0, 255, n, dtype=np.uint8)


def test_pages_mapped_where_blocks_are(vmm_ctx):
    s = stats(vmm_ctx)
    page = s["page_size"]
    assert s["virtual_memory"] and page >= 64 * KiB
    assert page & (page - 1) == 0
    assert s["reserved_bytes"] == 0
    a = vmm_ctx.memalloc(4 * KiB)
    b = vmm_ctx.memalloc(4 * KiB)
    s = stats(vmm_ctx)
    # One page for both, packed back to back.
    assert s["reserved_bytes"] == page
    assert b.device_pointer == a.device_pointer + 4 * KiB
    assert s["free_bytes"] == page - 8 * KiB
    big = vmm_ctx.memalloc(3 * page + 1)     # four pages of the large arena
    assert stats(vmm_ctx)["reserved_bytes"] == page + 4 * page
    ms = cudamem.memory_stats()
    assert ms["pool_reserved_bytes"] == 5 * page
    assert ms["limit_used_bytes"] >= 5 * page
    del a, b, big
    gc.collect()
    s = stats(vmm_ctx)
    # Freed: idle (under the threshold), mapped, all free.
    assert s["reserved_bytes"] == 5 * page
    assert s["idle_bytes"] == 5 * page == s["free_bytes"]
    assert s["largest_free_block"] >= 4 * page


def test_data_survives_while_pages_move(vmm_ctx):
    page = stats(vmm_ctx)["page_size"]
    keep = {}
    drop = {}
    for i in range(12):
        n = 3 * page + 3 * KiB * (i + 1)
        h = fill(n, i)
        (keep if i % 2 else drop)[i] = (cudamem.to_device(h), h)
    del h
    drop.clear()
    gc.collect()
    # Each freed block has two pages no block in use shares.
    assert stats(vmm_ctx)["idle_bytes"] >= 12 * page
    held = stats(vmm_ctx)["reserved_bytes"]
    # A request larger than any hole: idle pages move, none is made.
    big = fill(5 * page, 99)
    d = cudamem.to_device(big)
    assert stats(vmm_ctx)["reserved_bytes"] <= held + page
    np.testing.assert_array_equal(d.copy_to_host(), big)
    for dev, host in keep.values():
        np.testing.assert_array_equal(dev.copy_to_host(), host)


def test_free_memory_serves_a_request_larger_than_any_hole(vmm_ctx):
    page = stats(vmm_ctx)["page_size"]
    limit = 40 * page
    cudamem.set_memory_limit(limit)
    try:
        blocks = [vmm_ctx.memalloc(2 * page) for _ in range(18)]
        del blocks[::2]          # nine holes of two pages, none adjacent
        gc.collect()
        # 18 pages live, 18 idle, 4 left under the limit: 20 pages fit
        # only where the idle ones move.
        big = vmm_ctx.memalloc(20 * page)
        assert stats(vmm_ctx)["reserved_bytes"] <= limit
        assert cudamem.memory_stats()["limit_used_bytes"] <= limit
        del big
    finally:
        del blocks
        gc.collect()
        cudamem.set_memory_limit(None)


def test_idle_memory_past_the_threshold_goes_back(vmm_ctx):
    page = stats(vmm_ctx)["page_size"]
    # Passes not spaced (interval 0): what is idle goes at once.
    assert _core._pool_release_threshold(vmm_ctx, 2 * page, 0.0) == 2 * page
    a = vmm_ctx.memalloc(10 * page)
    used = cudamem.memory_stats()["limit_used_bytes"]
    del a
    gc.collect()
    s = stats(vmm_ctx)
    assert s["idle_bytes"] <= 2 * page
    assert s["reserved_bytes"] <= 2 * page
    assert cudamem.memory_stats()["limit_used_bytes"] <= used - 8 * page
    _core._pool_release_threshold(vmm_ctx, 0)
    b = vmm_ctx.memalloc(page)
    del b
    gc.collect()
    assert stats(vmm_ctx)["reserved_bytes"] == 0


def test_memory_a_stream_still_uses_is_kept_until_its_work_is_done(vmm_ctx):
    page = stats(vmm_ctx)["page_size"]
    _core._pool_release_threshold(vmm_ctx, 0, 0.0)
    s1 = _core._raw_stream_create(1)
    try:
        a = _core._memalloc_on(vmm_ctx, 4 * page, s1)
        gate = _core._raw_gate(s1)           # s1's work cannot finish
        try:
            del a
            gc.collect()
            # Not quiet: its pages stay mapped, idle.
            assert stats(vmm_ctx)["reserved_bytes"] == 4 * page
            # Another stream's request cannot take them either.
            s2 = _core._raw_stream_create(1)
            try:
                b = _core._memalloc_on(vmm_ctx, 4 * page, s2)
                assert stats(vmm_ctx)["reserved_bytes"] == 8 * page
                del b
                gc.collect()
            finally:
                _core._raw_stream_destroy(s2)
        finally:
            _core._raw_gate_open(gate)
        _core._raw_stream_synchronize(s1)
        # A later release looks again: releases of small blocks beside
        # one kept (its page stays), until s1's and s2's pages are quiet
        # and given back.
        keep = vmm_ctx.memalloc(512)
        for _ in range(200):
            c = vmm_ctx.memalloc(512)
            del c
            gc.collect()
            cudamem.synchronize()
            if stats(vmm_ctx)["reserved_bytes"] == page:
                break
            time.sleep(0.005)
        assert stats(vmm_ctx)["reserved_bytes"] == page
        del keep
    finally:
        _core._raw_stream_destroy(s1)


def test_memory_that_cycles_between_uses_stays_mapped(vmm_ctx):
    # A pass gives back only what stayed idle since the previous pass:
    # a block freed and made again within the interval keeps its pages.
    page = stats(vmm_ctx)["page_size"]
    _core._pool_release_threshold(vmm_ctx, 0, 0.3)
    first = vmm_ctx.memalloc(8 * page)
    del first                          # the first pass: nothing stayed
    gc.collect()
    made = stats(vmm_ctx)["pages"]["made"]
    for _ in range(20):
        a = vmm_ctx.memalloc(8 * page)
        del a
        gc.collect()
    s = stats(vmm_ctx)
    assert s["pages"]["made"] == made and s["pages"]["released"] == 0
    assert s["idle_bytes"] == 8 * page
    time.sleep(0.35)
    b = vmm_ctx.memalloc(512)            # a pass: the pages stayed idle
    del b
    gc.collect()
    deadline = time.monotonic() + 5
    while stats(vmm_ctx)["reserved_bytes"] > page:
        assert time.monotonic() < deadline, stats(vmm_ctx)
        time.sleep(0.35)
        c = vmm_ctx.memalloc(512)
        del c
        gc.collect()
    # All but the one page the 512-byte blocks took (moved, not made).
    assert stats(vmm_ctx)["pages"]["released"] >= 7


def test_empty_cache_gives_everything_back(vmm_ctx):
    keep = [vmm_ctx.memalloc(n) for n in (100, 3 * MiB, 17 * MiB)]
    assert stats(vmm_ctx)["reserved_bytes"] > 0
    del keep
    gc.collect()
    cudamem.empty_cache()
    s = stats(vmm_ctx)
    assert s["reserved_bytes"] == 0 and s["idle_bytes"] == 0
    assert cudamem.memory_stats()["limit_used_bytes"] == 0
    # And it serves again.
    a = cudamem.to_device(np.arange(1000.0))
    np.testing.assert_array_equal(a.copy_to_host(), np.arange(1000.0))


def test_pool_limit_counts_mapped_memory(vmm_ctx):
    page = stats(vmm_ctx)["page_size"]
    mm = vmm_ctx.memory_manager
    mm.limit = 3 * page
    a = vmm_ctx.memalloc(2 * page)
    with pytest.raises(cudamem.CudaOutOfMemoryError) as ei:
        vmm_ctx.memalloc(2 * page)
    assert ei.value.pool_reserved == 2 * page
    del a
    gc.collect()
    b = vmm_ctx.memalloc(3 * page)           # the idle pages moved
    assert stats(vmm_ctx)["reserved_bytes"] == 3 * page
    del b


def test_growing_sizes_stay_near_the_live_bytes(vmm_ctx):
    page = stats(vmm_ctx)["page_size"]
    _core._pool_release_threshold(vmm_ctx, 0, 0.0)
    live = []
    for step in range(1, 40):
        for _ in range(2):
            live.append(vmm_ctx.memalloc(step * page // 2 + 4 * KiB))
        while len(live) > 4:
            live.pop(0)
        gc.collect()
        nbytes = sum(m.size for m in live)
        # No more than the pages the live blocks touch: at most two
        # partial ones each.  (cuMemAlloc'd segments held several times
        # the live bytes here: freed ones were too small to reuse.)
        assert stats(vmm_ctx)["reserved_bytes"] <= nbytes + 8 * page
    del live


def test_the_variables_are_checked():
    for name, value in [("CUDAMEM_POOL_VMM", "yes"),
                        ("CUDAMEM_POOL_RELEASE_THRESHOLD", "lots"),
                        ("CUDAMEM_POOL_RELEASE_THRESHOLD", "1.5"),
                        ("CUDAMEM_POOL_RELEASE_INTERVAL", "-1"),
                        ("CUDAMEM_POOL_RELEASE_INTERVAL", "soon")]:
        rc, out = run_py("import cudamem", **{name: value})
        assert rc != 0 and name in out and "ValueError" in out, out
    rc, out = run_py(
        "import cudamem, numpy as np\n"
        "cudamem.set_memory_manager('pool')\n"
        "cudamem.device_array(10, np.uint8)\n"
        "from cudamem import _core\n"
        "s = _core._pool_stats(cudamem.current_context())\n"
        "print(s['virtual_memory'], s['release_threshold'])\n",
        CUDAMEM_POOL_VMM="1", CUDAMEM_POOL_RELEASE_THRESHOLD="3M")
    assert rc == 0, out
    assert out.split()[-2:] == ["True", str(3 * MiB)]


@pytest.mark.timeout(330)
def test_pool_tests_pass_on_virtual_memory():
    """test_pool.py, the PyTorch lane's tests (streams held by host
    functions while the pool maps and unmaps), the other libraries'
    adapters (CuPy, PyTorch, numba on cudamem's memory) and the
    snapshot's again, every pool made on virtual memory."""
    env = dict(os.environ, CUDAMEM_POOL_VMM="1", CUDAMEM_TEST_ISOLATED="1")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(TESTS), str(ROOT)]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p",
                        "no:cacheprovider",
                        str(TESTS / "memory" / "test_pool.py"),
                        str(TESTS / "memory" / "test_torch_lane.py"),
                        str(TESTS / "memory" / "test_interop.py"),
                        str(TESTS / "memory" / "test_history.py")],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    assert " passed" in p.stdout


def test_ipc_export_says_why_it_cannot(vmm_ctx):
    # cuIpcGetMemHandle does not accept cuMemCreate memory: the export
    # says so and what to do, before asking the driver.
    a = cudamem.to_device(np.arange(10))
    with pytest.raises(cudamem.CudaAPIError) as ei:
        a.get_ipc_handle()
    assert ei.value.code == 801            # CUDA_ERROR_NOT_SUPPORTED
    assert "CUDAMEM_POOL_VMM" in str(ei.value)


@pytest.mark.sim
def test_a_full_device_serves_from_the_pools_free_memory(vmm_ctx):
    # No limit: the simulated device itself is full.  Its free memory is
    # idle pages in holes smaller than the request: when no new memory
    # can be made they move there, with no trim and no retry.
    page = stats(vmm_ctx)["page_size"]
    # No release pass meanwhile (idle memory past the threshold would go
    # back at the next allocation once the interval is over).
    _core._pool_release_threshold(vmm_ctx, None, 3600.0)
    blocks = []
    with pytest.raises(cudamem.CudaOutOfMemoryError):
        while True:
            blocks.append(vmm_ctx.memalloc(2 * page))
    assert len(blocks) > 20
    del blocks[::2]
    gc.collect()
    moved = stats(vmm_ctx)["pages"]["moved"]
    released = stats(vmm_ctx)["pages"]["released"]
    big = vmm_ctx.memalloc(2 * page * (len(blocks) // 2))
    assert big.size >= 20 * page
    s = stats(vmm_ctx)["pages"]
    assert s["moved"] - moved >= 20 and s["released"] == released
    del big, blocks
