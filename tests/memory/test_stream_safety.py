# SPDX-License-Identifier: MIT
"""Stream safety of every memory manager: memory is never handed out
again while work that cudamem enqueued on it, on any stream, is still
pending.

Each test runs under the four kinds of manager: ``default`` (cuMemAlloc,
whose free waits for the device), ``pool`` (cudamem's caching
allocator), ``async`` (the driver's stream-ordered allocator) and an EMM
plugin.  Streams are held at a known point by gates (host callbacks that
wait), so that a use-after-free shows as wrong data every time rather
than by chance.
"""

import gc

import numpy as np
import pytest

import cudamem
from helpers.isolation import (run_module_in_a_child,
                               skip_unless_own_process)
from helpers.streamutil import Gate

MANAGERS = ["default", "pool", "async", "emm_plugin"]


@pytest.fixture(autouse=True)
def _isolated_on_a_gpu(request):
    # Switching managers resets the primary context, which other
    # libraries of the test process share on a GPU: there the module runs
    # in a child process of its own.
    skip_unless_own_process(request, "test_module_in_a_child")


@pytest.mark.timeout(330)
def test_module_in_a_child_process():
    run_module_in_a_child(__file__, timeout=300)


@pytest.fixture(params=MANAGERS)
def manager(request):
    cudamem.close()
    if request.param == "emm_plugin":
        from helpers import emm_plugin
        cudamem.set_memory_manager(emm_plugin.DeferringManager)
    else:
        cudamem.set_memory_manager(request.param)
    cudamem.current_context()
    yield request.param
    gc.collect()
    if request.param == "emm_plugin":
        cudamem.current_context().memory_manager.deallocations.clear()
    cudamem.close()
    cudamem.set_memory_manager("default")


N = 1 << 20


def test_freed_while_its_stream_reads_it(manager):
    """The reproducer of the pool's use-after-free: an array freed while a
    copy from it is queued on its stream is not handed to another
    stream's allocation before that copy ran."""
    s1, s2 = cudamem.stream(), cudamem.stream()
    a = cudamem.to_device(np.full(N, 7, np.uint8), stream=s1)
    s1.synchronize()
    out = cudamem.pinned_array(N, np.uint8)
    with Gate() as g:
        g.block(s1)
        a.copy_to_host(out, stream=s1)
        del a
        b = cudamem.device_array(N, np.uint8, stream=s2)
        b.copy_to_device(np.zeros(N, np.uint8), stream=s2)
        s2.synchronize()
    s1.synchronize()
    assert not g.timed_out, "s2 waited for the held s1"
    assert (out == 7).all(), manager


def test_array_of_one_stream_read_on_another(manager):
    """An array bound to s1 (or to no stream) read by a copy queued on s3
    keeps its memory until that copy ran, whichever stream allocates
    next."""
    s1, s2, s3 = cudamem.stream(), cudamem.stream(), cudamem.stream()
    for bound in (s1, 0):
        a = cudamem.to_device(np.full(N, 5, np.uint8), stream=bound)
        if bound:
            bound.synchronize()
        out = cudamem.pinned_array(N, np.uint8)
        with Gate() as g:
            g.block(s3)
            a.copy_to_host(out, stream=s3)
            del a
            # No host waits while the gate is closed: work on the legacy
            # default stream (the release of an array bound to it, under
            # the async manager) makes every blocking stream wait for s3.
            for s in (s1, s2):
                b = cudamem.device_array(N, np.uint8, stream=s)
                b.setitem(slice(None), 0, stream=s)
                del b
        s1.synchronize()
        s2.synchronize()
        s3.synchronize()
        assert not g.timed_out, "another stream waited for the held s3"
        assert (out == 5).all(), (manager, bound)


def test_setitem_on_another_stream_then_free(manager):
    """A device-to-device setitem queued on s3 from an array of s1's: the
    source is not reused before the copy ran."""
    s1, s2, s3 = cudamem.stream(), cudamem.stream(), cudamem.stream()
    src = cudamem.to_device(np.full(N, 9, np.uint8), stream=s1)
    dst = cudamem.device_array(N, np.uint8, stream=s3)
    s1.synchronize()
    with Gate() as g:
        g.block(s3)
        dst.setitem(slice(None), src, stream=s3)
        del src
        b = cudamem.device_array(N, np.uint8, stream=s2)
        b.copy_to_device(np.zeros(N, np.uint8), stream=s2)
        s2.synchronize()
    s3.synchronize()
    assert not g.timed_out, "s2 waited for the held s3"
    assert (dst.copy_to_host() == 9).all(), manager


def test_memset_of_an_allocation_on_another_stream_then_free(manager):
    """A memset of an array's allocation (``gpu_data.memset``) queued on
    s3 over memory of s1's: the block is not handed out again before the
    memset ran, so it does not overwrite the next owner's bytes."""
    s1, s3 = cudamem.stream(), cudamem.stream()
    a = cudamem.device_array(N, np.uint8, stream=s1)
    with Gate() as g:
        g.block(s3)
        a.gpu_data.memset(0xAB, stream=s3)
        del a
        b = cudamem.device_array(N, np.uint8, stream=s1)
        b.copy_to_device(np.full(N, 3, np.uint8), stream=s1)
        s1.synchronize()
    s3.synchronize()
    assert not g.timed_out, "s1 waited for the held s3"
    assert (b.copy_to_host() == 3).all(), manager


def _peers_or_skip():
    if len(cudamem.gpus) < 2:
        pytest.skip("needs 2 devices")
    if not cudamem.can_access_peer(1, 0):
        pytest.skip("devices 1 and 0 have no peer access: such copies "
                    "go through the host and are complete on return")


@pytest.mark.multi_gpu
@pytest.mark.parametrize("layout", ["contiguous", "fortran", "strided"])
def test_copies_between_devices(manager, layout):
    """Copies both ways between two devices' arrays of the manager, in
    every layout (a peer copy, 2-D / 3-D copies, the internal kernel of
    one device reading the other's memory), and setitem across them:
    the manager's memory is open to the peer however it was made
    (virtual memory, a stream-ordered pool)."""
    _peers_or_skip()
    full = np.arange(48.0).reshape(6, 8)
    host = {"contiguous": full, "fortran": np.asfortranarray(full),
            "strided": full[:, ::2]}[layout]
    with cudamem.gpus[0]:
        src = cudamem.to_device(full)
        if layout == "strided":
            src = src[:, ::2]
        elif layout == "fortran":
            src = cudamem.to_device(host)
    for stream in (None, "own"):
        with cudamem.gpus[1]:
            s = cudamem.stream() if stream else 0
            dst = cudamem.device_array_like(host)
            dst.copy_to_device(src, stream=s)
            cudamem.synchronize()
            assert (dst.copy_to_host() == host).all(), (manager, stream)
            dst[:] = 0
            dst.setitem(slice(None), src, stream=s)
            cudamem.synchronize()
            assert (dst.copy_to_host() == host).all(), (manager, stream)
            # Another dtype: device 1's cast kernel reads device 0's.
            cast = cudamem.device_array(host.shape, np.float32)
            cast.setitem(slice(None), src, stream=s)
            cudamem.synchronize()
            assert (cast.copy_to_host() == host).all(), (manager, stream)
        with cudamem.gpus[0]:
            back = cudamem.device_array_like(host)
            back.copy_to_device(dst)
            assert (back.copy_to_host() == host).all(), (manager, stream)


@pytest.mark.multi_gpu
@pytest.mark.parametrize("how", ["copy_to_device", "setitem"])
def test_read_from_another_device_then_free(manager, how):
    """A copy queued on a held stream of device 1 that reads an array of
    device 0 (allocated for s1 there): freed at once, its block is not
    handed out again on s1 before the copy ran.  Nothing of device 0's
    own streams comes after device 1's work, so its release must be
    ordered after that work some other way."""
    _peers_or_skip()
    with cudamem.gpus[0]:
        s1 = cudamem.stream()
        src = cudamem.to_device(np.full(N, 9, np.uint8), stream=s1)
        s1.synchronize()
    with cudamem.gpus[1]:
        s3 = cudamem.stream()
        dst = cudamem.device_array(N, np.uint8, stream=s3)
        with Gate() as g:
            g.block(s3)
            if how == "copy_to_device":
                dst.copy_to_device(src, stream=s3)
            else:
                dst.setitem(slice(None), src, stream=s3)
            del src
            gc.collect()
            with cudamem.gpus[0]:
                b = cudamem.device_array(N, np.uint8, stream=s1)
                b.copy_to_device(np.zeros(N, np.uint8), stream=s1)
                s1.synchronize()
        s3.synchronize()
        assert not g.timed_out, "device 0's s1 waited for device 1's s3"
        assert (dst.copy_to_host() == 9).all(), manager
    with cudamem.gpus[0]:
        del b
        gc.collect()
        s1.synchronize()


@pytest.mark.multi_gpu
def test_default_stream_array_read_from_another_device_then_free(manager):
    """Both arrays on their devices' default streams: a synchronous copy
    of a Fortran-ordered array (a 2-D copy, which the driver does not
    wait for, device to device) is left on device 1's held default
    stream.  Device 0's default stream is not that one, so the freed
    source's block is not handed out there before the copy ran."""
    _peers_or_skip()
    host = np.asfortranarray(np.full((512, 2048), 9, np.uint8))
    with cudamem.gpus[0]:
        src = cudamem.to_device(host)
        cudamem.synchronize()
    with cudamem.gpus[1]:
        dst = cudamem.device_array_like(host)
        with Gate() as g:
            g.block(cudamem.default_stream())
            dst.copy_to_device(src)
            del src
            gc.collect()
            with cudamem.gpus[0]:
                b = cudamem.device_array_like(host)
                b.copy_to_device(np.zeros_like(host))
                # Not the context: it now waits for device 1's copy,
                # which uses its memory (docs/design.md, cross-stream
                # uses).
                cudamem.default_stream().synchronize()
        cudamem.synchronize()
        assert not g.timed_out, "the copy waited for the held stream"
        assert (dst.copy_to_host() == 9).all(), manager


@pytest.mark.multi_gpu
def test_blocks_read_from_another_device_come_back(manager):
    """Blocks freed after a copy of device 1's read them are reused on
    device 0 once that copy has run: a release ordered after another
    context's work is not a block kept out of use for good, so a loop of
    such copies does not grow the pool."""
    _peers_or_skip()
    if manager not in ("pool", "async"):
        pytest.skip("the stream-ordered managers")
    with cudamem.gpus[1]:
        s3 = cudamem.stream()
        dst = cudamem.device_array(N, np.uint8, stream=s3)
    with cudamem.gpus[0]:
        s1 = cudamem.stream()
        before = None
        for i in range(24):
            src = cudamem.to_device(np.full(N, i, np.uint8), stream=s1)
            s1.synchronize()
            with cudamem.gpus[1]:
                dst.copy_to_device(src, stream=s3)
                s3.synchronize()
                assert (dst.copy_to_host() == i).all()
            del src
            gc.collect()
            held = cudamem.memory_stats()["pool_reserved_bytes"]
            if i == 3:
                before = held
        # Slack of a few blocks: when the async manager's frees complete
        # is the driver pool's business, and on a machine whose cores are
        # all busy the simulator's pool ended up to 5 blocks above the
        # fourth copy's figure (7 runs in 65, none growing copy by copy);
        # a block kept out of use at every copy grows it by 20 MiB over
        # the 20 copies.
        assert held - before <= 8 * N, (manager, before, held)


def test_pinned_pool_buffer_not_reused_while_a_copy_is_queued():
    """A pooled page-locked buffer freed while a copy into it is queued on
    a held stream is not handed to the next pinned_array."""
    from cudamem import _core

    _core._pinned_pool_enable(True)
    try:
        s1 = cudamem.stream()
        d = cudamem.to_device(np.full(N, 3, np.uint8))
        a = cudamem.pinned_array(N, np.uint8)
        with Gate() as g:
            g.block(s1)
            d.copy_to_host(a, stream=s1)
            pa = a.ctypes.data
            del a
            b = cudamem.pinned_array(N, np.uint8)
            assert b.ctypes.data != pa
            b[:] = 0
        s1.synchronize()
        assert not g.timed_out
        assert (b == 0).all()
    finally:
        _core._pinned_pool_enable(False)
        cudamem.pinned_pool_trim()
