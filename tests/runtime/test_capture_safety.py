# SPDX-License-Identifier: MIT
"""What cudamem does behind the user's back while a CUDA graph capture it
began is in progress (docs/design.md, "Capture-aware synchronous work").

The driver refuses a potentially unsafe call (a query of an ordinary
event or of a stream that does not capture, a free, a context's
synchronisation) while another thread captures in global mode, or the
calling thread itself in global or thread-local mode, and invalidates the
capture.  cudamem's background work (the pools' event queries, the
release queue's flush, the stream cache's idle check, the 'auto' GIL
mode's query, the out-of-memory path's trim) waits or goes another way
then; here eager work of another thread (or of the capturing one) runs
during a capture of the main thread's, the capture must end valid and
replay correctly, and what was held back must have run once it ended.

Nothing here relies on the simulator beyond the driver's documented rules:
on a GPU the module runs in a process of its own (it switches managers
with close())."""

import contextlib
import gc
import threading

import numpy as np
import pytest

import cudamem
from cudamem import _core
from helpers.crashutil import run_child
from helpers.isolation import (manager_context, run_module_in_a_child,
                               skip_unless_own_process)

N = 64
KiB = 1 << 10


@pytest.fixture(autouse=True)
def _isolated_on_a_gpu(request):
    skip_unless_own_process(request, "test_capture_safety_module_in_a_")


@pytest.mark.timeout(330)
def test_capture_safety_module_in_a_child_process():
    run_module_in_a_child(__file__, timeout=300)


@pytest.fixture
def pool_ctx():
    with manager_context("pool") as ctx:
        yield ctx


@pytest.fixture
def async_ctx():
    with manager_context("async") as ctx:
        yield ctx


def in_thread(fn, *args):
    """fn(*args) on a thread of its own; its result, or its exception
    raised here."""
    out = {}

    def run():
        try:
            out["r"] = fn(*args)
        except BaseException as e:       # re-raised on the caller's thread
            out["e"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join(60)
    assert not t.is_alive(), "the worker thread hung"
    if "e" in out:
        raise out["e"]
    return out.get("r")


def make_io():
    """What capture() copies: made before the capture, alive after it (a
    stream, two pinned arrays, two device arrays)."""
    return (cudamem.stream(), cudamem.pinned_array(N, np.float32),
            cudamem.pinned_array(N, np.float32),
            cudamem.device_array(N, np.float32),
            cudamem.device_array(N, np.float32))


@pytest.fixture
def io():
    return make_io()


@contextlib.contextmanager
def capture(io, mode="global", replay=True):
    """A capture on io's cudamem stream around the block, of copies in and
    out of device memory; afterwards it must end valid (no
    StreamCaptureError 901) and its graph (unless not replay) replay the
    copies correctly."""
    s, hin, hout, d, d2 = io
    s.begin_capture(mode=mode)
    done = False
    try:
        d.copy_to_device(hin, stream=s)
        yield s
        done = True
    finally:
        if not done and s.is_capturing():
            with contextlib.suppress(cudamem.CudaAPIError):
                s.end_capture().close()
    d2.copy_to_device(d, stream=s)
    d2.copy_to_host(hout, stream=s)
    g = s.end_capture()
    assert _core._capture_counts() == (0, 0)
    for k in range(3 if replay else 0):
        hin[:] = np.arange(N) * (k + 1)
        g.launch(s)
        s.synchronize()
        np.testing.assert_array_equal(hout, hin)
    g.close()


def memq(ctx=None):
    """The memory manager's release queue of ctx (the current context)."""
    return (ctx or cudamem.current_context())._memory_deallocations


# ------------------------------------------------------------------ #
# The release queue                                                   #
# ------------------------------------------------------------------ #


def test_default_manager_frees_wait_for_the_capture(io):
    # Past CUDA_DEALLOCS_COUNT a drop flushes the queue: cuMemFree, which
    # another thread's global capture forbids.  The frees stay queued.
    ctx = cudamem.current_context()
    cudamem.synchronize()
    memq(ctx).clear()
    before = cudamem.memory_stats()["allocated_bytes"]
    arrs = [cudamem.device_array(1000, np.float32) for _ in range(30)]
    count = cudamem.config.CUDA_DEALLOCS_COUNT
    with capture(io):
        def drop():
            arrs.clear()
            return len(memq(ctx))

        assert in_thread(drop) > count      # held back, not freed
    # The end of the capture ran them.
    assert len(memq(ctx)) == 0
    assert cudamem.memory_stats()["allocated_bytes"] == before


def test_thread_local_capture_does_not_hold_other_threads_frees(io):
    # Another thread's thread-local capture forbids this thread nothing:
    # its frees run as usual.
    ctx = cudamem.current_context()
    memq(ctx).clear()
    arrs = [cudamem.device_array(1000, np.float32) for _ in range(30)]
    count = cudamem.config.CUDA_DEALLOCS_COUNT
    with capture(io, "thread_local"):
        def drop():
            arrs.clear()
            return len(memq(ctx))

        assert in_thread(drop) <= count


@pytest.mark.parametrize("mode", ["global", "thread_local"])
def test_capturing_threads_own_frees_wait(mode, io):
    # The capturing thread's own capture forbids it the frees, in either
    # mode.
    ctx = cudamem.current_context()
    memq(ctx).clear()
    arrs = [cudamem.device_array(1000, np.float32) for _ in range(30)]
    with capture(io, mode):
        arrs.clear()
        assert len(memq(ctx)) == 30
    assert len(memq(ctx)) == 0


def test_relaxed_capture_holds_nothing(io):
    ctx = cudamem.current_context()
    memq(ctx).clear()
    arrs = [cudamem.device_array(1000, np.float32) for _ in range(30)]
    count = cudamem.config.CUDA_DEALLOCS_COUNT
    with capture(io, "relaxed"):
        arrs.clear()
        assert len(memq(ctx)) <= count


def test_clear_waits_for_the_capture(io):
    ctx = cudamem.current_context()
    memq(ctx).clear()
    a = cudamem.device_array(1000, np.float32)
    with capture(io):
        del a
        assert len(memq(ctx)) == 1
        in_thread(memq(ctx).clear)              # refused nothing, held
        assert len(memq(ctx)) == 1
    assert len(memq(ctx)) == 0


def test_dropped_streams_are_destroyed_after_the_capture(io):
    # An idle stream dropped is kept for reuse after a cuStreamQuery,
    # which the capture forbids: it is destroyed the deferred way.
    ctx = cudamem.current_context()
    ctx.deallocations.clear()
    streams = [cudamem.stream() for _ in range(12)]
    for st in streams:
        st.synchronize()
    del st
    with capture(io):
        def drop():
            streams.clear()
            return len(ctx.deallocations)

        assert in_thread(drop) == 12
    assert len(ctx.deallocations) == 0


def test_stream_dropped_while_it_captures():
    # cudamem forgets the capture of a stream dropped meanwhile, and what
    # that capture held back runs.  In a child: the driver ends the capture
    # by destroying the stream.
    r = run_child("""
        import numpy as np, cudamem
        from cudamem import _core
        ctx = cudamem.current_context()
        q = ctx._memory_deallocations
        arrs = [cudamem.device_array(100, np.float32) for _ in range(20)]
        s = cudamem.stream()
        s.begin_capture()
        assert _core._capture_counts() == (1, 1)
        arrs.clear()
        assert len(q) == 20, len(q)
        del s
        assert _core._capture_counts() == (0, 0)
        assert len(q) == 0, len(q)
        d = cudamem.to_device(np.arange(4.0))
        np.testing.assert_array_equal(d.copy_to_host(), np.arange(4.0))
        print("ok")
    """)
    assert r.stdout.strip().endswith("ok")


def test_a_failed_capture_releases_what_it_held():
    ctx = cudamem.current_context()
    memq(ctx).clear()
    arrs = [cudamem.device_array(1000, np.float32) for _ in range(30)]
    s = cudamem.stream()
    s.begin_capture()
    arrs.clear()
    assert len(memq(ctx)) == 30
    with pytest.raises(cudamem.CudaAPIError):  # the driver refuses it
        _core._raw_stream_synchronize(s.handle)
    with pytest.raises(cudamem.CudaAPIError) as ei:
        s.end_capture()
    assert ei.value.code == 901
    assert _core._capture_counts() == (0, 0)
    assert len(memq(ctx)) == 0


# ------------------------------------------------------------------ #
# The pool and async managers                                         #
# ------------------------------------------------------------------ #


@pytest.fixture
def raw_streams():
    """Two raw non-blocking streams of the current context."""
    hs = [_core._raw_stream_create(1) for _ in range(2)]
    yield hs
    for h in hs:
        _core._raw_stream_synchronize(h)
        _core._raw_stream_destroy(h)


def test_pool_cross_stream_reuse_during_a_capture(pool_ctx, io, raw_streams):
    # A block freed on stream A is handed to stream B once an event on A
    # has completed: a cuEventQuery, which another thread's global
    # capture forbids.  A context-wide synchronize since the event tells
    # without a query; otherwise the block waits for the capture's end.
    ctx = pool_ctx
    a_s, b_s = raw_streams
    mm = ctx.memory_manager
    first = _core._memalloc_on(ctx, 512, b_s)       # two streams served
    a = _core._memalloc_on(ctx, 64 * KiB, a_s)
    pa = a.device_pointer
    del a                                          # event on A
    cudamem.synchronize()
    segments = mm.stats()["segments"]
    out = {}
    with capture(io):
        def work():
            b = _core._memalloc_on(ctx, 64 * KiB, b_s)
            out["b"] = b                           # known done: reused
            z = _core._memalloc_on(ctx, 64 * KiB, a_s)
            out["pz"] = z.device_pointer
            del z                                  # event on A, not known
            c = _core._memalloc_on(ctx, 64 * KiB, b_s)
            out["c"] = c

        in_thread(work)
        assert out["b"].device_pointer == pa
        assert out["c"].device_pointer != out["pz"]
        assert mm.stats()["segments"] == segments  # no cuMemAlloc
    # After the capture the block freed during it is reusable.
    _core._raw_stream_synchronize(a_s)
    d = _core._memalloc_on(ctx, 64 * KiB, b_s)
    assert d.device_pointer == out["pz"]
    del d, first


def test_pool_records_no_event_on_the_capturing_stream(pool_ctx, io,
                                                       raw_streams):
    # The capturing thread's own allocations: a block freed on the
    # capturing stream would get its event recorded there (a captured
    # event, which no later query can answer) when another stream wants
    # it.  None is recorded during the capture; afterwards the block is
    # reused as usual.
    #
    # The gate is a host function that holds B until the test opens it.
    # On an H100 the capture's first copy, made as a kernel
    # (CUDAMEM_CAPTURE_KERNEL_COPY_MAX), waited for the gate, which the
    # test opens only after the capture, and hung; as copy nodes it did
    # not (any driver call may wait for the driver's own resources, and
    # a host function in flight holds some: tools/hostfn_probe.py tells
    # which calls wait).  A host function that waits for the thread that
    # calls the driver is what the driver's rules forbid (cudamem's own
    # Python callbacks never do: the GIL goes around driver calls while
    # one is in flight); this test is about the pool's events, so its
    # copies are copy nodes.
    ctx = pool_ctx
    s = io[0]
    b_s = raw_streams[1]
    kcopy, _ = _core._capture_kernel_copy(0)
    gate = _core._raw_gate(b_s)                    # B's work cannot finish
    try:
        y = _core._memalloc_on(ctx, 64 * KiB, b_s)
        py = y.device_pointer
        del y                                      # free on B, for B only
        x = cudamem.device_array(16 * KiB, np.float32, stream=s)
        px = x.__cuda_array_interface__["data"][0]
        assert px != py
        with capture(io):
            del x                                  # free on the capture
            c = _core._memalloc_on(ctx, 64 * KiB, b_s)
            assert c.device_pointer == py          # not x's block
            del c
    finally:
        _core._raw_gate_open(gate)
        _core._capture_kernel_copy(kcopy)
    # A look records the event on the stream, a later one finds it done.
    got = []
    for _ in range(4):
        got.append(_core._memalloc_on(ctx, 64 * KiB, b_s))
        s.synchronize()
    assert px in [g.device_pointer for g in got]
    del got


@pytest.mark.parametrize("manager", ["pool", "async"])
def test_memory_dropped_during_a_capture_stays_the_captures(manager):
    # Memory used on the capturing stream and dropped during the capture
    # stays the capture's, then its graph's (a replay would write into
    # it): nothing to release while the capture runs, and no release
    # that would have to wait for the context, which the driver refuses
    # while any stream of it captures.  Once the graph is closed the
    # memory goes.
    with manager_context(manager) as ctx:
        io = make_io()
        other = cudamem.stream()
        a = cudamem.device_array(N, np.float32, stream=other)
        before = cudamem.memory_stats()["allocated_bytes"]
        with capture(io, "thread_local", replay=False) as s:
            a.copy_to_device(io[1], stream=s)      # used on the capture
            n0 = len(memq(ctx))

            def drop():
                nonlocal a
                a = None
                memq(ctx).clear()                  # not forbidden here
                return len(memq(ctx))

            assert in_thread(drop) == n0
            assert cudamem.memory_stats()["allocated_bytes"] == before
        memq(ctx).clear()
        assert len(memq(ctx)) == 0
        st = cudamem.memory_stats()
        assert st["allocated_bytes"] == before - N * 4
        del io


def test_pool_defer_cleanup_exit_during_a_capture(pool_ctx, io):
    ctx = pool_ctx
    warm = [cudamem.device_array(1000, np.float32) for _ in range(20)]
    del warm
    cudamem.synchronize()
    segments = ctx.memory_manager.stats()["segments"]
    with capture(io):
        def work():
            with cudamem.defer_cleanup():
                arrs = [cudamem.device_array(1000, np.float32)
                        for _ in range(20)]
                del arrs
            return len(memq(ctx))                  # exit: held back

        assert in_thread(work) == 20
    assert len(memq(ctx)) == 0
    assert ctx.memory_manager.stats()["segments"] == segments


def test_async_manager_during_a_capture(async_ctx, io):
    # Stream-ordered allocations and frees, and the ordering of a free
    # after the other streams that used the memory (events, and a wait
    # of the pool's side stream), are no calls a capture forbids.
    ctx = async_ctx
    s1 = cudamem.stream()
    s2 = cudamem.stream()
    host = cudamem.pinned_array(N, np.float32)
    host[:] = np.arange(N)
    outs = [cudamem.pinned_array(N, np.float32) for _ in range(20)]
    before = cudamem.memory_stats()["allocated_bytes"]
    with capture(io):
        def work():
            for out in outs:
                a = cudamem.device_array(N, np.float32, stream=s1)
                a.copy_to_device(host, stream=s1)
                e = cudamem.event()
                e.record(s1)
                e.wait(s2)
                b = cudamem.device_array(N, np.float32, stream=s2)
                b.copy_to_device(a, stream=s2)     # a used on two streams
                b.copy_to_host(out, stream=s2)
                del a, b

        in_thread(work)
    s2.synchronize()
    for out in outs:
        np.testing.assert_array_equal(out, np.arange(N))
    assert cudamem.memory_stats()["allocated_bytes"] == before
    assert len(memq(ctx)) == 0


# ------------------------------------------------------------------ #
# Page-locked memory, assignments, the GIL, out of memory            #
# ------------------------------------------------------------------ #


def test_pinned_allocation_and_drop_during_a_capture(io):
    # The pinned pool reuses a block once its event has completed (a
    # query): a synchronize since tells without one.  A block dropped
    # during the capture would get an event on the legacy stream, which
    # a blocking stream's capture joins: it is released instead, after.
    ctx = cudamem.current_context()
    was_on = _core._pinned_pool_enable(True)
    try:
        warm = [cudamem.pinned_array(1000, np.float32) for _ in range(3)]
        del warm
        cudamem.synchronize()
        stats = cudamem.pinned_pool_stats()
        out = {}
        with capture(io):
            def work():
                p = cudamem.pinned_array(1000, np.float32)
                p[:] = 3
                st = cudamem.pinned_pool_stats()
                out["hit"] = (st["hits"] - stats["hits"],
                              st["misses"] - stats["misses"])
                del p
                memq(ctx).clear()
                return len(memq(ctx))

            assert in_thread(work) >= 1            # its release waits
            assert out["hit"] == (1, 0)
    finally:
        _core._pinned_pool_enable(was_on)
    assert len(memq(ctx)) == 0
    assert len(ctx.deallocations) <= cudamem.config.CUDA_DEALLOCS_COUNT


def test_async_assignment_during_a_capture(io):
    # An asynchronous assignment copies its value from a page-locked
    # buffer it reuses once an event says the last copy from it ran.
    d = cudamem.device_array(N, np.float32)
    s2 = cudamem.stream()
    d.setitem(slice(None), 1.0, stream=s2)
    s2.synchronize()
    cudamem.synchronize()
    with capture(io):
        in_thread(d.setitem, slice(None), 7.0, s2)
    s2.synchronize()
    assert (d.copy_to_host() == 7).all()


def test_waits_and_queries_during_a_global_capture(io):
    # The driver forbids waits and queries of streams and events (even of
    # ones that do not capture) on every thread while a capture runs in
    # global mode, and invalidates the capture for such a call (an H200
    # refused cuStreamSynchronize of an idle stream from another thread).
    # cudamem says so before the driver is asked, so the capture stays
    # valid; in the 'auto' GIL mode the query Stream.synchronize() makes
    # after a copy into pageable memory is not made either.
    was = _core._copy_keep_gil("auto")
    s2 = cudamem.stream()
    d = cudamem.to_device(np.arange(16, dtype=np.float32))
    ev = cudamem.event()
    ev.record(s2)
    try:
        with capture(io):
            def copy_and_wait():
                out = np.zeros(16, np.float32)
                d.copy_to_host(out, stream=s2)
                with pytest.raises(cudamem.StreamCaptureError,
                                   match=r"Stream.synchronize\(\).*"
                                         r"end_capture"):
                    s2.synchronize()
                return out

            out = in_thread(copy_and_wait)
            np.testing.assert_array_equal(out, np.arange(16))
            for call, name in ((s2.query, "Stream.query"),
                               (ev.query, "Event.query"),
                               (ev.synchronize, "Event.synchronize")):
                with pytest.raises(cudamem.StreamCaptureError,
                                   match=name):
                    in_thread(call)
        s2.synchronize()                       # after it: as before
        assert s2.query() and ev.query()
    finally:
        _core._copy_keep_gil(was)


def test_waits_beside_a_thread_local_capture(io):
    # A capture in thread_local mode forbids nothing to other threads.
    s2 = cudamem.stream()
    ev = cudamem.event()
    ev.record(s2)
    with capture(io, mode="thread_local"):
        in_thread(s2.synchronize)
        assert in_thread(s2.query) and in_thread(ev.query)
        in_thread(ev.synchronize)


def test_out_of_memory_during_a_capture(pool_ctx, io):
    # The out-of-memory path would trim the pool (a synchronisation and
    # frees): during a capture it raises at once, and says why.
    ctx = pool_ctx
    cudamem.set_memory_limit(8 << 20)
    try:
        keep = cudamem.device_array(1 << 20, np.float32)   # 4 MiB
        with capture(io):
            with pytest.raises(cudamem.CudaOutOfMemoryError,
                               match="capture is in progress"):
                in_thread(cudamem.device_array, 2 << 20, np.float32)
        del keep
    finally:
        cudamem.set_memory_limit(None)
    gc.collect()
    assert len(memq(ctx)) == 0


def test_synchronous_memset_during_a_global_capture(io):
    # A synchronous memset runs on the legacy default stream, which the
    # driver forbids while a capture runs in global mode (it would
    # invalidate the capture): refused before the driver is asked, as a
    # synchronous copy is; with a stream, on one that does not capture,
    # it runs.
    s, hin, hout, d, d2 = io
    with capture(io):
        with pytest.raises(cudamem.StreamCaptureError,
                           match="synchronous memset"):
            in_thread(d2.gpu_data.memset, 0)
    d2.gpu_data.memset(7)
    cudamem.synchronize()
    assert (d2.copy_to_host().view(np.uint8) == 7).all()
