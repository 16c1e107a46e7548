# SPDX-License-Identifier: MIT
"""Allocation during a capture: graph pools.

Memory allocated while cudamem captures a stream comes from the
capture's graph pool under every memory manager, stays the graph's while
it may be replayed (never handed to other work), is shared by captures
given the same pool, and goes back to the device once nothing holds the
pool.  A seeded random program checks replays against NumPy and that no
eager allocation ever overlaps memory a graph pool holds.
"""

import gc
import json

import numpy as np
import pytest

import cudamem
from cudamem import GraphPool, StreamCaptureError, _core
from helpers.crashutil import run_child
from helpers.isolation import (manager_context, run_module_in_a_child,
                               skip_unless_own_process)

# The tests close contexts (manager_context): on a GPU, where the test
# process shares its primary context with other libraries, the module
# runs in a child process of its own.
pytestmark = pytest.mark.exclusive

AHEAD_HARMLESS = ("_isolated_on_a_gpu",)

N = 256
MANAGERS = ["default", "pool", "async"]


@pytest.fixture(autouse=True)
def _isolated_on_a_gpu(request):
    skip_unless_own_process(request, "test_graph_pools_module_in_a_child")


@pytest.mark.timeout(430)
def test_graph_pools_module_in_a_child_process():
    run_module_in_a_child(__file__, timeout=400)


@pytest.fixture(params=MANAGERS)
def mctx(request):
    with manager_context(request.param) as ctx:
        yield ctx
        assert _core._capture_counts() == (0, 0)


def ptr(a):
    return a.__cuda_array_interface__["data"][0]


def span(a):
    return (ptr(a), ptr(a) + a.nbytes)


def overlaps(r, s):
    return r[0] < s[1] and s[0] < r[1]


def flush(ctx, collect=True):
    """Run the releases the default manager queues (after a garbage
    collection, unless collect is false: in a process that ran many
    tests a collection is slow, and the random programs make no
    cycles)."""
    if collect:
        gc.collect()
    ctx.memory_manager.deallocations.clear()


def reserved():
    return cudamem.memory_stats()["pool_reserved_bytes"]


def test_capture_allocates_from_its_graph_pool(mctx):
    h = cudamem.pinned_array(N, np.float32)
    out = cudamem.pinned_array(N, np.float32)
    with cudamem.graph() as g:
        d = cudamem.device_array(N, np.float32, stream=g.stream)
        d.copy_to_device(h, stream=g.stream)
        t = cudamem.device_array(N, np.float32, stream=g.stream)
        t.copy_to_device(d, stream=g.stream)
        t.copy_to_host(out, stream=g.stream)
    assert isinstance(g.pool, GraphPool)
    st = g.pool._stats()
    assert st["live_blocks"] == 2 and st["reserved_bytes"] >= 2 * 4 * N
    spans = [span(d), span(t)]
    # The program lets go of the graph's arrays: the memory stays the
    # graph's, never another allocation's.
    del d, t
    flush(mctx)
    assert g.pool._stats()["live_blocks"] == 0
    eager = [cudamem.device_array(N, np.float32) for _ in range(16)]
    for e in eager:
        assert not any(overlaps(span(e), s) for s in spans)
        e.copy_to_device(np.full(N, -1, np.float32))
    rng = np.random.default_rng(1)
    for _ in range(100):
        h[:] = rng.standard_normal(N)
        g.replay(g.stream)
        g.stream.synchronize()
        np.testing.assert_array_equal(out, h)
    g.close()
    assert g.pool is None


def test_default_stream_allocation_on_the_capturing_thread(mctx):
    with cudamem.graph() as g:
        b = cudamem.device_array(N, np.float32, stream=g.stream)
        a = cudamem.device_array(N, np.float32)   # no stream
    assert g.pool._stats()["live_blocks"] == 2
    del a, b
    g.close()


def test_captures_sharing_a_pool_reuse_its_free_blocks(mctx):
    with cudamem.graph() as g1:
        a = cudamem.device_array(N, np.float32, stream=g1.stream)
        a_span = span(a)
    del a
    flush(mctx)
    with cudamem.graph(pool=g1.pool) as g2:
        b = cudamem.device_array(N, np.float32, stream=g2.stream)
    assert g2.pool is g1.pool
    # A block of a pool is reused for its own stream key only: g2's side
    # stream is another stream, so b is other memory of the same pool.
    assert g1.pool._stats()["live_blocks"] == 1
    assert span(b) != a_span
    s = cudamem.stream()
    with cudamem.graph(stream=s) as g3:
        c = cudamem.device_array(N, np.float32, stream=s)
    c_span = span(c)
    del c
    flush(mctx)
    with cudamem.graph(stream=s, pool=g3.pool) as g4:
        c2 = cudamem.device_array(N, np.float32, stream=s)
    assert span(c2) == c_span
    for g in (g1, g2, g3, g4):
        g.close()
    del b, c2


def test_memory_goes_back_once_nothing_holds_the_pool(mctx):
    flush(mctx)
    before = reserved()
    with cudamem.graph() as g:
        big = cudamem.device_array(4 << 20, np.uint8, stream=g.stream)
        small = cudamem.device_array(100, np.uint8, stream=g.stream)
    assert reserved() >= before + (4 << 20)
    pool = g.pool
    g.close()
    assert reserved() >= before + (4 << 20)   # arrays and pool still held
    del big, small
    flush(mctx)
    assert reserved() >= before + (4 << 20)   # the pool is still held
    del pool
    flush(mctx)
    assert reserved() == before


def _gated(stream, seconds):
    """Hold stream's later work back until a timer opens the gate after
    seconds (a host function waits for it); the timer, to join."""
    import threading

    gate = threading.Event()
    stream.add_callback(lambda s, status, arg: gate.wait(30), None)
    timer = threading.Timer(seconds, gate.set)
    timer.start()
    return timer


@pytest.mark.parametrize("where", ["arrays", "graph pool"])
def test_close_waits_for_a_launch_still_running(mctx, where):
    """close() right after a launch on another stream than the capture's,
    the launch held back: close() returns once the launch has run, so
    the memory the graph writes (its arrays', its graph pool's) goes to
    other work only then, and new arrays keep what they were given."""
    s, s2, s3 = cudamem.stream(), cudamem.stream(), cudamem.stream()
    hin = cudamem.pinned_array(N, np.float32)
    hin[:] = 3
    hout = cudamem.pinned_array(N, np.float32)
    hout[:] = 0
    d = None
    if where == "arrays":
        d = cudamem.device_array(N, np.float32, stream=s2)
    with cudamem.graph(stream=s) as g:
        if d is None:
            d = cudamem.device_array(N, np.float32, stream=s)
        d.copy_to_device(hin, stream=s)
        d.copy_to_host(hout, stream=s)
    timer = _gated(s3, 0.3)
    g.launch(s3)
    g.close()
    # No synchronisation: close() waited for the launch.
    assert not timer.is_alive()
    assert (hout == 3).all()
    del d, g
    flush(mctx)
    news = [cudamem.device_array(N, np.float32, stream=s2)
            for _ in range(16)]
    for e in news:
        e.copy_to_device(np.full(N, 7, np.float32), stream=s2)
    s2.synchronize()
    s3.synchronize()
    for e in news:
        assert (e.copy_to_host() == 7).all()


def test_close_of_a_graph_never_launched_does_not_wait(mctx):
    """A graph never launched has nothing to wait for: close() returns
    while its capture stream is still held back."""
    s = cudamem.stream()
    h = cudamem.pinned_array(N, np.float32)
    d = cudamem.device_array(N, np.float32)
    with cudamem.graph(stream=s) as g:
        d.copy_to_device(h, stream=s)
    timer = _gated(s, 0.3)
    g.close()
    assert timer.is_alive()
    timer.join()
    s.synchronize()


def test_close_during_a_capture_lets_go_after_it(mctx):
    """A graph closed, its launch still held back, while a global-mode
    capture forbids the thread to wait: what it kept stays held through
    the capture, and goes once the capture has ended (the next graph
    made waits for the launch then)."""
    import weakref

    s, s3 = cudamem.stream(), cudamem.stream()
    h = cudamem.pinned_array(N, np.float32)
    d = cudamem.device_array(N, np.float32)
    with cudamem.graph() as g:
        d.copy_to_device(h, stream=g.stream)
    ref = weakref.ref(d.gpu_data)
    del d
    timer = _gated(s3, 0.3)
    g.launch(s3)
    s.begin_capture()
    g.close()                         # may not wait here
    del g
    flush(mctx)
    assert ref() is not None
    g2 = s.end_capture()              # waits for the launch, lets go
    assert not timer.is_alive()
    gc.collect()
    assert ref() is None
    g2.close()


def test_a_graph_launched_into_a_capture_is_refused(mctx):
    """The driver refuses a graph's launch or upload into a capture
    (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED): cudamem raises first, the
    capture goes on and ends valid, and the graph is still the caller's
    to launch after it."""
    hin = cudamem.pinned_array(N, np.float32)
    hout = cudamem.pinned_array(N, np.float32)
    d = cudamem.device_array(N, np.float32)
    with cudamem.graph() as g1:
        d.copy_to_device(hin, stream=g1.stream)
        d.copy_to_host(hout, stream=g1.stream)
    h2 = cudamem.pinned_array(N, np.float32)
    with cudamem.graph() as g2:
        with pytest.raises(StreamCaptureError,
                           match=r"Graph\.launch\(\) cannot run .*"
                                 r"after end_capture"):
            g1.launch(g2.stream)
        with pytest.raises(StreamCaptureError, match=r"Graph\.upload"):
            g1.upload(g2.stream)
        assert g2.stream.is_capturing()
        d.copy_to_host(h2, stream=g2.stream)
    for k in range(3):
        hin[:] = k + 1
        g1.launch(g2.stream)
        g2.replay(g2.stream)
        g2.stream.synchronize()
        assert (hout == k + 1).all() and (h2 == k + 1).all()
    g1.close()
    g2.close()


def test_retirement_waits_while_a_capture_is_in_progress(mctx):
    s = cudamem.stream()
    h = cudamem.pinned_array(16, np.float32)
    d = cudamem.device_array(16, np.float32)
    flush(mctx)
    before = reserved()
    with cudamem.graph() as g:
        a = cudamem.device_array(1 << 20, np.uint8, stream=g.stream)
    s.begin_capture()
    d.copy_to_device(h, stream=s)
    g.close()
    del a, g
    flush(mctx)
    # cuMemFree would join the capture: the memory goes back after it.
    assert reserved() > before
    g2 = s.end_capture()
    assert reserved() == before
    g2.replay(s)
    s.synchronize()
    g2.close()


def test_failed_block_lets_its_pool_go(mctx):
    flush(mctx)
    before = reserved()
    with pytest.raises(KeyError):
        with cudamem.graph() as g:
            a = cudamem.device_array(1 << 20, np.uint8, stream=g.stream)
            raise KeyError
    assert g.pool is None
    del a
    flush(mctx)
    assert reserved() == before


def test_bad_pool_arguments(ctx):
    s = cudamem.stream()
    with pytest.raises(TypeError, match="GraphPool"):
        s.begin_capture(pool=object())
    with pytest.raises(TypeError, match="GraphPool"):
        cudamem.graph(pool=3)
    assert not s.is_capturing()
    assert _core._capture_counts() == (0, 0)
    p = GraphPool()
    s.begin_capture(pool=p)
    g = s.end_capture()
    assert g.pool is p
    g.close()
    assert "GraphPool" in repr(p)


@pytest.mark.ahead
def test_pool_of_a_closed_context():
    # Graph pools of a context that is closed: their memory goes with the
    # context; the objects still held let go of it without a driver call.
    r = run_child("""
        import gc
        import numpy as np, cudamem
        for mgr in ("default", "pool", "async"):
            cudamem.set_memory_manager(mgr)
            with cudamem.graph() as g:
                a = cudamem.device_array(1000, np.float32, stream=g.stream)
            pool = g.pool
            cudamem.close()
            del a
            gc.collect()
            g.close()
            del g, pool
            gc.collect()
            try:
                cudamem.GraphPool(cudamem.current_context())
            except Exception as e:
                raise SystemExit(repr(e))
            cudamem.close()
        print("ok")
    """)
    assert r.stdout.strip().endswith("ok")


@pytest.mark.parametrize("mgr", MANAGERS)
def test_random_programs(mgr):
    """Seeded random programs: captures (some sharing a pool) that
    allocate, copy a host input through device arrays and back, frees of
    the captured arrays, eager allocations written with garbage, replays
    in any order, launches on any stream closed at once, and closes.
    Every replay's output matches its input (a closed launch's when
    close() returns), no eager allocation overlaps memory a live graph
    pool holds, and eager arrays keep what they were given."""
    with manager_context(mgr) as ctx:
        for seed in range(300):
            try:
                _random_program(ctx, seed)
            except AssertionError as e:
                raise AssertionError(
                    "seed %d (%s): %s" % (seed, mgr, e)) from None
            flush(ctx, collect=False)
        assert _core._capture_counts() == (0, 0)


def _random_program(ctx, seed):
    rng = np.random.default_rng(seed)
    # [graph, stream, host in, host out, spans of its pool (one list
    # shared by the graphs of a pool)]
    graphs = []
    held = []            # captured arrays the program still holds
    eager = []
    streams = [cudamem.stream() for _ in range(3)]
    for _ in range(30):
        op = rng.integers(7)
        if op == 0 or not graphs:
            s = streams[rng.integers(len(streams))]
            pool = None
            spans = []
            if graphs and rng.random() < 0.5:
                other = graphs[rng.integers(len(graphs))]
                pool, spans = other[0].pool, other[4]
            n = int(rng.integers(1, 3000))
            hin = cudamem.pinned_array(n, np.float32)
            hout = cudamem.pinned_array(n, np.float32)
            with cudamem.graph(stream=s, pool=pool) as g:
                chain = [cudamem.device_array(n, np.float32, stream=s)
                         for _ in range(int(rng.integers(1, 4)))]
                chain[0].copy_to_device(hin, stream=s)
                for a, b in zip(chain[:-1], chain[1:], strict=True):
                    b.copy_to_device(a, stream=s)
                chain[-1].copy_to_host(hout, stream=s)
                tmp = cudamem.device_array(int(rng.integers(1, 5000)),
                                           np.uint8, stream=s)
                spans.extend([span(a) for a in chain] + [span(tmp)])
                del tmp
            graphs.append([g, s, hin, hout, spans])
            held.extend(chain)
        elif op == 1:
            g, s, hin, hout, _ = graphs[rng.integers(len(graphs))]
            hin[:] = rng.standard_normal(hin.size)
            g.replay(s)
            s.synchronize()
            assert np.array_equal(hout, hin), "replay output differs"
        elif op == 2 and held:
            del held[rng.integers(len(held))]
        elif op == 3:
            n = int(rng.integers(1, 1 << 16))
            e = cudamem.device_array(n, np.uint8)
            live = {id(gr[4]): gr[4] for gr in graphs}
            for spans in live.values():
                for sp in spans:
                    assert not overlaps(span(e), sp), \
                        "an eager allocation overlaps a graph pool's memory"
            e.copy_to_device(np.full(n, 0xAB, np.uint8))
            eager.append(e)
        elif op == 4 and len(graphs) > 1:
            gr = graphs.pop(rng.integers(len(graphs)))
            gr[0].close()
        elif op == 5:
            flush(ctx, collect=False)
        elif op == 6 and len(graphs) > 1:
            # Launched on any stream, closed at once with no
            # synchronisation: close() waits for the launch.
            g, s, hin, hout, _ = graphs.pop(rng.integers(len(graphs)))
            hin[:] = rng.standard_normal(hin.size)
            g.launch(streams[rng.integers(len(streams))])
            g.close()
            assert np.array_equal(hout, hin), \
                "close() returned before the launch ended"
    for e in eager:
        # What eager arrays were given, no launch wrote over it.
        assert (e.copy_to_host() == 0xAB).all(), \
            "an eager array's contents changed"
    for gr in graphs:
        g, s, hin, hout, _ = gr
        hin[:] = rng.standard_normal(hin.size)
        g.replay(s)
        s.synchronize()
        assert np.array_equal(hout, hin), "final replay output differs"
        g.close()


def _wrap(ptr_, n):
    return cudamem.from_cuda_array_interface(
        {"data": (ptr_, False), "shape": (n,), "typestr": "<f4",
         "version": 3}, sync=False)


@pytest.mark.parametrize("mgr", MANAGERS)
def test_another_librarys_capture_allocating_through_cudamem(mgr):
    """PyTorch (its pluggable-allocator entry points) allocates through
    cudamem while it captures its own stream, a capture cudamem did not
    begin: the memory comes from a graph pool of that capture, kept for
    the graph after PyTorch frees it, never handed to other work."""
    from helpers.torch_entry import entry_points

    lib = entry_points()
    with manager_context(mgr) as ctx:
        dev = ctx.device.id
        h = _core._raw_stream_create(1)
        try:
            ext = cudamem.external_stream(h)
            hin = cudamem.pinned_array(N, np.float32)
            hout = cudamem.pinned_array(N, np.float32)
            h2 = _core._raw_stream_create(1)
            old = lib.cudamem_torch_alloc(4 * N, dev, h2)
            before = reserved()
            _core._raw_begin_capture(h, 0)
            # PyTorch frees a tensor made before its capture, inside it,
            # on the capturing thread: no call the capture forbids.
            lib.cudamem_torch_free(old, 4 * N, dev, h2)
            p = lib.cudamem_torch_alloc(4 * N, dev, h)
            q = lib.cudamem_torch_alloc(4 * N, dev, h)
            assert p and q
            a, b = _wrap(p, N), _wrap(q, N)
            a.copy_to_device(hin, stream=ext)
            b.copy_to_device(a, stream=ext)
            b.copy_to_host(hout, stream=ext)
            # PyTorch frees an intermediate during the capture: reused in
            # the same capture only.
            lib.cudamem_torch_free(p, 4 * N, dev, h)
            g = ext.end_capture()
            assert reserved() > before
            lib.cudamem_torch_free(q, 4 * N, dev, h)
            del a, b
            flush(ctx)
            spans = [(p, p + 4 * N), (q, q + 4 * N)]
            others = [lib.cudamem_torch_alloc(4 * N, dev, h)
                      for _ in range(8)]
            others += [lib.cudamem_torch_alloc(4 * N, dev, None)
                       for _ in range(8)]
            eager = [cudamem.device_array(N, np.float32) for _ in range(8)]
            for o in others:
                assert not any(overlaps((o, o + 4 * N), sp) for sp in spans)
            for e in eager:
                assert not any(overlaps(span(e), sp) for sp in spans)
                e.copy_to_device(np.full(N, -1, np.float32))
            for k in range(20):
                hin[:] = np.arange(N) * (k + 1)
                g.launch(ext)
                _core._raw_stream_synchronize(h)
                np.testing.assert_array_equal(hout, hin)
            g.close()
            for o in others[:8]:
                lib.cudamem_torch_free(o, 4 * N, dev, h)
            for o in others[8:]:
                lib.cudamem_torch_free(o, 4 * N, dev, None)
            # Kept: cudamem cannot see when the other library's graph
            # goes; the context's close lets go of it.
            assert reserved() > before
        finally:
            _core._raw_stream_synchronize(h)
            _core._raw_stream_destroy(h)
            _core._raw_stream_synchronize(h2)
            _core._raw_stream_destroy(h2)


def _peer_child(code, mgr):
    p = run_child(code, timeout=300, args=(mgr,),
                  env={"CUDAMEM_TEST_ISOLATED": "1"})
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.gpu
@pytest.mark.parametrize("mgr", MANAGERS)
def test_cupy_captures_with_memory_from_cudamem(mgr):
    """CuPy captures its own stream while allocating through cudamem
    (use_with_cupy): the capture ends, every replay is right, and what
    CuPy allocates eagerly between replays never overlaps the graph's
    memory."""
    pytest.importorskip("cupy")
    out = _peer_child("""
        import json, sys
        import cupy, cudamem
        from cudamem import interop
        cudamem.set_memory_manager(sys.argv[1])
        n = 1 << 16
        res = {"ok": True, "overlap": False}
        with interop.use_with_cupy():
            x = cupy.zeros(n, dtype=cupy.float32)
            s = cupy.cuda.Stream(non_blocking=True)
            with s:
                for _ in range(2):              # compile before capturing
                    y = x * 2 + 1
                    z = y.sum()
                s.synchronize()
                s.begin_capture()
                y = x * 2 + 1
                z = y.sum()
                g = s.end_capture()
            spans = [(y.data.ptr, y.data.ptr + y.nbytes),
                     (z.data.ptr, z.data.ptr + z.nbytes)]
            del y                               # the graph still uses it
            for k in range(20):
                with s:
                    x.fill(k)
                    g.launch(stream=s)
                s.synchronize()
                junk = [cupy.full(n, -1.0, dtype=cupy.float32)
                        for _ in range(64)]
                for j in junk:
                    a = (j.data.ptr, j.data.ptr + j.nbytes)
                    res["overlap"] |= any(a[0] < b[1] and b[0] < a[1]
                                          for b in spans)
                res["ok"] &= float(z.get()) == float((2 * k + 1) * n)
                del junk
        print(json.dumps(res))
    """, mgr)
    assert out == {"ok": True, "overlap": False}


@pytest.mark.gpu
@pytest.mark.parametrize("mgr", MANAGERS)
def test_torch_captures_with_memory_from_cudamem(mgr):
    """torch.cuda.graph while PyTorch allocates through cudamem
    (use_with_torch): replays are right and eager tensors made between
    replays never overlap the graph's memory."""
    pytest.importorskip("torch")
    out = _peer_child("""
        import json, sys
        import torch, cudamem
        from cudamem import interop
        cudamem.set_memory_manager(sys.argv[1])
        interop.use_with_torch()
        n = 1 << 16
        res = {"ok": True, "overlap": False}
        x = torch.zeros(n, device="cuda")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):                  # warm up, as PyTorch asks
                y = x * 2 + 1
                z = y.sum()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = x * 2 + 1
            z = y.sum()
        spans = [(y.data_ptr(), y.data_ptr() + 4 * n),
                 (z.data_ptr(), z.data_ptr() + 4)]
        del y
        for k in range(20):
            x.fill_(k)
            g.replay()
            junk = [torch.full((n,), -1.0, device="cuda") for _ in range(4)]
            for j in junk:
                a = (j.data_ptr(), j.data_ptr() + 4 * n)
                res["overlap"] |= any(a[0] < b[1] and b[0] < a[1]
                                      for b in spans)
            res["ok"] &= z.item() == float((2 * k + 1) * n)
            del junk
        print(json.dumps(res))
    """, mgr)
    assert out == {"ok": True, "overlap": False}



@pytest.mark.gpu
@pytest.mark.parametrize("mgr", MANAGERS)
def test_torch_frees_inside_its_capture_a_tensor_of_the_capturing_stream(
        mgr):
    """A tensor made on the stream torch.cuda.graph then captures, freed
    inside the capture: its release must not be refused (invalidating
    PyTorch's capture) nor recorded into the graph (a free at each
    replay); it is made once the capture is over."""
    pytest.importorskip("torch")
    out = _peer_child("""
        import gc, json, sys
        import torch, cudamem
        from cudamem import interop
        seen = []
        sys.unraisablehook = seen.append
        cudamem.set_memory_manager(sys.argv[1])
        interop.use_with_torch()
        n = 1 << 16
        x = torch.zeros(n, device="cuda")
        cs = torch.cuda.Stream()
        cs.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(cs):
            pre = [torch.ones(n, device="cuda") for _ in range(4)]
            y = x * 2 + 1
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=cs):
            del pre
            gc.collect()
            y = x * 2 + 1
        res = {"ok": True}
        for k in range(5):
            x.fill_(k)
            g.replay()
            torch.cuda.synchronize()
            res["ok"] &= bool((y == 2 * k + 1).all().item())
        del g, y
        torch.cuda.synchronize()
        q = cudamem.current_context().memory_manager.deallocations
        q.clear()
        res["queued"] = len(q)
        res["error"] = repr(interop.torch_last_error())
        res["unraisable"] = [repr(u.exc_value) for u in seen]
        print(json.dumps(res))
    """, mgr)
    assert out == {"ok": True, "queued": 0, "error": "None",
                   "unraisable": []}


@pytest.mark.gpu
@pytest.mark.parametrize("mgr", MANAGERS)
def test_cupy_frees_inside_its_capture_an_array_of_the_capturing_stream(
        mgr):
    """CuPy arrays allocated through cudamem (use_with_cupy) for the
    stream CuPy then captures, dropped inside the capture: the release
    must neither be refused (invalidating CuPy's capture) nor recorded
    into the graph (a free at each replay); it is made once the capture
    is over."""
    pytest.importorskip("cupy")
    out = _peer_child("""
        import gc, json, sys
        import cupy, cudamem
        from cudamem import interop
        seen = []
        sys.unraisablehook = seen.append
        cudamem.set_memory_manager(sys.argv[1])
        n = 1 << 16
        res = {"ok": True}
        with interop.use_with_cupy():
            x = cupy.zeros(n, dtype=cupy.float32)
            s = cupy.cuda.Stream(non_blocking=True)
            with s:
                for _ in range(2):              # compile before capturing
                    y = x * 2 + 1
                pre = [cupy.ones(n, dtype=cupy.float32) for _ in range(4)]
                s.synchronize()
                s.begin_capture()
                del pre
                gc.collect()
                y = x * 2 + 1
                g = s.end_capture()
            for k in range(5):
                with s:
                    x.fill(k)
                    g.launch(stream=s)
                s.synchronize()
                res["ok"] &= bool((y == 2 * k + 1).all().get())
            del g, y
            cupy.cuda.Device().synchronize()
            q = cudamem.current_context().memory_manager.deallocations
            q.clear()
            res["queued"] = len(q)
        res["unraisable"] = [repr(u.exc_value) for u in seen]
        print(json.dumps(res))
    """, mgr)
    assert out == {"ok": True, "queued": 0, "unraisable": []}


def test_a_capturing_stream_dropped_ends_its_capture(mctx):
    flush(mctx)
    before = reserved()
    h = cudamem.pinned_array(4, np.float32)
    s = cudamem.stream()
    s.begin_capture()
    a = cudamem.device_array(1 << 20, np.uint8, stream=s)
    d = cudamem.device_array(4, np.float32, stream=s)
    d.copy_to_device(h, stream=s)
    # The arrays used on the stream hold it: they go first.
    del s, a, d
    flush(mctx)
    assert _core._capture_counts() == (0, 0)
    assert reserved() == before                          # its pool went
    h[:] = 7
    np.testing.assert_array_equal(cudamem.to_device(h).copy_to_host(), h)


@pytest.mark.ahead
def test_closing_a_context_while_it_captures():
    r = run_child("""
        import gc
        import numpy as np, cudamem
        from cudamem import _core
        for mgr in ("default", "pool", "async"):
            cudamem.set_memory_manager(mgr)
            s = cudamem.stream()
            s.begin_capture()
            a = cudamem.device_array(1000, np.float32, stream=s)
            try:
                with cudamem.graph() as g:
                    b = cudamem.device_array(10, np.float32,
                                             stream=g.stream)
                    cudamem.close()
            except ValueError as e:             # its end: context gone
                assert "closed" in str(e), e
            else:
                raise SystemExit("no ValueError")
            assert _core._capture_counts() == (0, 0), _core._capture_counts()
            del a, b, s
            gc.collect()
            d = cudamem.to_device(np.arange(4.0))
            assert (d.copy_to_host() == np.arange(4.0)).all()
            cudamem.close()
        print("ok")
    """, check=False)
    assert r.stdout.strip().endswith("ok"), r.stdout + r.stderr


def test_a_closed_contexts_stream_does_not_end_a_new_capture():
    # A Stream object of a closed context outlives its handle, and a new
    # stream may get the same handle value: dropping the old object must
    # not end (or forget) the new stream's capture.
    r = run_child("""
        import gc
        import numpy as np, cudamem
        from cudamem import _core
        old = [cudamem.stream() for _ in range(64)]
        handles = {s.handle for s in old}
        cudamem.close()
        new = [cudamem.stream() for _ in range(64)]
        reused = [s for s in new if s.handle in handles]
        if not reused:
            print("no handle reused")
            raise SystemExit(0)
        s = reused[0]
        s.begin_capture()
        del old
        gc.collect()
        assert _core._capture_counts() == (1, 1), _core._capture_counts()
        assert s.is_capturing()
        a = cudamem.device_array(100, np.float32, stream=s)
        g = s.end_capture()
        assert g.pool._stats()["live_blocks"] == 1
        g.close()
        print("ok")
    """)
    out = r.stdout.strip()
    if out.endswith("no handle reused"):
        pytest.skip("the driver gave no closed context's handle again")
    assert out.endswith("ok")
