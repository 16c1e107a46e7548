# SPDX-License-Identifier: MIT
"""CUDA graphs: capture, replay, and the capture-aware synchronous work
(no allocation inside a capture here)."""

import numpy as np
import pytest

import cudamem
from cudamem import Graph, StreamCaptureError, _core
from helpers.crashutil import run_child
from helpers.isolation import SIMULATOR

N = 64


@pytest.fixture
def setup():
    s = cudamem.stream()
    hin = cudamem.pinned_array(N, np.float32)
    hout = cudamem.pinned_array(N, np.float32)
    d = cudamem.device_array(N, np.float32)
    d2 = cudamem.device_array(N, np.float32)
    yield s, hin, hout, d, d2
    left = _core._capture_counts()
    if s.is_capturing():
        try:
            s.end_capture().close()
        except cudamem.CudaAPIError:
            pass
    assert left == (0, 0)


def _capture_roundtrip(s, hin, hout, d, d2):
    s.begin_capture()
    d.copy_to_device(hin, stream=s)
    d2.copy_to_device(d, stream=s)
    d2.copy_to_host(hout, stream=s)
    return s.end_capture()


def test_capture_and_replay(setup):
    s, hin, hout, d, d2 = setup
    g = _capture_roundtrip(s, hin, hout, d, d2)
    assert isinstance(g, Graph)
    assert not s.is_capturing()
    rng = np.random.default_rng(0)
    for _ in range(100):
        hin[:] = rng.standard_normal(N)
        g.replay(s)
        s.synchronize()
        np.testing.assert_array_equal(hout, hin)
    g.close()


def test_capture_memset_and_kernel(setup):
    s, hin, hout, d, d2 = setup
    a = cudamem.device_array((8, 8), np.float32)
    t_host = cudamem.pinned_array((8, 8), np.float32)
    h2 = cudamem.pinned_array((8, 8), np.float32)
    b = cudamem.device_array((8, 8), np.float32)
    b.copy_to_device(np.zeros((8, 8), np.float32))
    s.begin_capture()
    d.setitem(slice(None), 0, stream=s)
    d.copy_to_host(hout, stream=s)
    a.copy_to_device(h2, stream=s)
    # A strided device-to device copy runs cudamem's internal kernel (a
    # host function on the simulator).
    b[:, ::2].copy_to_device(a[:, ::2], stream=s)
    b.copy_to_host(t_host, stream=s)
    g = s.end_capture()
    for r in range(3):
        hout[:] = 7
        h2[:] = np.arange(64, dtype=np.float32).reshape(8, 8) + r
        g.launch(s)
        s.synchronize()
        assert (hout == 0).all()
        want = np.zeros((8, 8), np.float32)
        want[:, ::2] = h2[:, ::2]
        np.testing.assert_array_equal(t_host, want)
    g.close()


def test_is_capturing_and_modes(setup):
    s = setup[0]
    assert not s.is_capturing()
    for mode in ("global", "thread_local", "relaxed"):
        s.begin_capture(mode=mode)
        assert s.is_capturing()
        s.end_capture().close()
    with pytest.raises(ValueError):
        s.begin_capture(mode="bogus")


def test_graph_context_manager(setup):
    s, hin, hout, d, d2 = setup
    with cudamem.graph() as g:
        assert g.stream.is_capturing()
        d.copy_to_device(hin, stream=g.stream)
        d.copy_to_host(hout, stream=g.stream)
    assert not g.stream.is_capturing()
    hin[:] = 3
    g.launch(s)
    s.synchronize()
    assert (hout == 3).all()
    g.close()
    with cudamem.graph(stream=s) as g2:
        d.copy_to_host(hout, stream=s)
    assert g2.stream is s
    g2.close()


def test_graph_block_raises(setup):
    s = setup[0]
    with pytest.raises(KeyError):
        with cudamem.graph(stream=s) as g:
            raise KeyError("x")
    assert not s.is_capturing()
    with pytest.raises(ValueError):
        g.launch(s)


@pytest.mark.parametrize("what", [
    "copy_to_host", "to_device", "copy_to_device", "synchronize",
    "cudamem.synchronize",
])
def test_sync_work_raises_and_capture_stays_valid(setup, what):
    s, hin, hout, d, d2 = setup
    s.begin_capture()
    d.copy_to_device(hin, stream=s)
    with pytest.raises(StreamCaptureError) as ei:
        if what == "copy_to_host":
            d.copy_to_host()
        elif what == "to_device":
            cudamem.to_device(np.ones(4))
        elif what == "copy_to_device":
            d.copy_to_device(np.ones(N, np.float32))
        elif what == "synchronize":
            s.synchronize()
        else:
            cudamem.synchronize()
    assert isinstance(ei.value, cudamem.CudaAPIError)
    assert ei.value.code == 900
    assert "capturing" in str(ei.value)
    assert s.is_capturing()
    d.copy_to_host(hout, stream=s)
    g = s.end_capture()
    hin[:] = 5
    g.launch(s)
    s.synchronize()
    assert (hout == 5).all()
    g.close()


def test_staged_pageable_copy_raises(setup):
    s, hin, hout, d, d2 = setup
    big = cudamem.device_array(1 << 22, np.uint8)
    s.begin_capture()
    with pytest.raises(StreamCaptureError):
        big.copy_to_host(np.empty(1 << 22, np.uint8), stream=s)
    s.end_capture().close()


def test_external_stream_capture_seen():
    h = _core._raw_stream_create(1)
    try:
        ext = cudamem.external_stream(h)
        assert not ext.is_capturing()
        ext.begin_capture()
        assert ext.is_capturing()
        with pytest.raises(StreamCaptureError):
            ext.synchronize()
        ext.end_capture().close()
        assert not ext.is_capturing()
    finally:
        _core._raw_stream_destroy(h)


def test_graph_launched_into_a_capture_another_library_began(setup):
    """A graph launched into a global-mode capture another library began
    (raw driver calls here): the driver would refuse the launch; cudamem
    refuses it first, so that capture goes on, ends valid and replays
    what it recorded."""
    s, hin, hout, d, d2 = setup
    with cudamem.graph() as g1:
        d.copy_to_device(hin, stream=g1.stream)
    h = _core._raw_stream_create(1)
    try:
        ext = cudamem.external_stream(h)
        _core._raw_begin_capture(h, 0)
        with pytest.raises(StreamCaptureError,
                           match=r"Graph\.launch\(\) cannot run while "
                                 r"stream \d+ is capturing"):
            g1.launch(ext)
        g1.close()
        assert ext.is_capturing()
        d2.copy_to_device(d, stream=ext)
        d2.copy_to_host(hout, stream=ext)
        g2 = ext.end_capture()
        for k in range(3):
            d.copy_to_device(np.arange(N, dtype=np.float32) * (k + 2))
            # A pageable copy may still be in flight on return, and ext
            # does not wait for the legacy stream (non-blocking).
            cudamem.synchronize()
            g2.launch(ext)
            _core._raw_stream_synchronize(h)
            np.testing.assert_array_equal(hout, np.arange(N) * (k + 2))
        g2.close()
    finally:
        _core._raw_stream_destroy(h)


def test_close_waits_in_the_relaxed_mode_beside_another_librarys_capture(
        setup):
    """A graph launched on a stream of its own and closed while another
    library captures in global mode: close() waits for the launch
    without invalidating that capture."""
    s, hin, hout, d, d2 = setup
    with cudamem.graph() as g1:
        d.copy_to_device(hin, stream=g1.stream)
        d.copy_to_host(hout, stream=g1.stream)
    hin[:] = 5
    g1.launch(s)
    h = _core._raw_stream_create(1)
    try:
        ext = cudamem.external_stream(h)
        _core._raw_begin_capture(h, 0)
        d2.copy_to_device(d, stream=ext)
        g1.close()
        assert (hout == 5).all()
        assert ext.is_capturing()
        ext.end_capture().close()
    finally:
        _core._raw_stream_destroy(h)


@pytest.mark.parametrize("flags", [0, 1], ids=["blocking", "non_blocking"])
def test_work_on_a_capture_another_library_began(setup, flags):
    # Another library (raw driver calls here, as CuPy's do) captures its
    # stream in global mode; cudamem works on it through external_stream.
    s, hin, hout, d, d2 = setup
    h = _core._raw_stream_create(flags)
    try:
        ext = cudamem.external_stream(h)
        _core._raw_begin_capture(h, 0)
        assert ext.is_capturing()               # the driver says so
        assert _core._capture_counts() == (0, 0)
        with pytest.raises(StreamCaptureError):
            ext.synchronize()                   # refused before the driver
        # Stream-ordered work on the capturing stream is recorded.
        d.copy_to_device(hin, stream=ext)
        d2.copy_to_device(d, stream=ext)
        d2.copy_to_host(hout, stream=ext)
        g = ext.end_capture()
        for k in range(3):
            hin[:] = np.arange(N) * (k + 1)
            g.launch(ext)
            _core._raw_stream_synchronize(h)
            np.testing.assert_array_equal(hout, hin)
        g.close()
    finally:
        _core._raw_stream_destroy(h)


def test_sync_copy_during_a_capture_another_library_began(setup):
    # cudamem cannot know of that capture without asking the driver on
    # every synchronous copy: the driver refuses the copy and invalidates
    # the capture; both refusals are StreamCaptureError, with the
    # driver's codes, and nothing is recorded to crash at a replay.
    s, hin, hout, d, d2 = setup
    h = _core._raw_stream_create(0)
    try:
        ext = cudamem.external_stream(h)
        _core._raw_begin_capture(h, 0)
        with pytest.raises(StreamCaptureError) as ei:
            d.copy_to_host()
        # On the legacy stream, which a capturing blocking stream joins
        # implicitly: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT (the H200's
        # answer, and the simulator's).
        assert ei.value.code == 906
        with pytest.raises(StreamCaptureError) as ei:
            ext.end_capture()
        assert ei.value.code == 901             # invalidated
        assert not ext.is_capturing()
        d.copy_to_device(hin)                   # all is well afterwards
        np.testing.assert_array_equal(d.copy_to_host(), hin)
    finally:
        _core._raw_stream_destroy(h)


@pytest.mark.parametrize("cache", ["empty", "warm"])
def test_one_buffer_copy_during_a_capture_another_library_began(setup,
                                                                cache):
    # A copy of 64 KiB to pageable memory goes through a staging buffer
    # (memory/staging/staging.c): refused as a StreamCaptureError and the
    # capture invalidated, as the direct copy is, the buffer back in the
    # cache.  With the cache empty the simulator refuses the buffer's
    # cuMemHostAlloc (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) before the
    # copy is asked; with a buffer cached, the copy (IMPLICIT).
    s, hin, hout, d, d2 = setup
    big = cudamem.to_device(np.arange(1 << 14, dtype=np.float32))
    _core._staging_trim()
    if cache == "warm":
        big.copy_to_host()
    h = _core._raw_stream_create(0)
    try:
        ext = cudamem.external_stream(h)
        _core._raw_begin_capture(h, 0)
        with pytest.raises(StreamCaptureError) as ei:
            big.copy_to_host()
        assert ei.value.code in (900, 906)
        if cache == "warm":
            assert ei.value.code == 906
        with pytest.raises(StreamCaptureError) as ei:
            ext.end_capture()
        assert ei.value.code == 901             # invalidated
        st = _core._staging_stats()
        assert st["in_use"] == 0 and st["inflight"] == 0, st
        np.testing.assert_array_equal(big.copy_to_host(),
                                      np.arange(1 << 14))
    finally:
        _core._raw_stream_destroy(h)
        _core._staging_trim()


def test_adversarial(setup):
    s, hin, hout, d, d2 = setup
    with pytest.raises(RuntimeError, match="not capturing"):
        s.end_capture()
    s.begin_capture()
    with pytest.raises(RuntimeError, match="already capturing"):
        s.begin_capture()
    g = s.end_capture()
    g.close()
    g.close()
    for call in (g.launch, g.replay, g.upload):
        with pytest.raises(ValueError):
            call(s)
    with pytest.raises(ValueError):
        cudamem.default_stream().begin_capture()
    assert "closed" in repr(g)


def test_graph_outlives_context():
    run_child("""
        import numpy as np, cudamem
        s = cudamem.stream()
        h = cudamem.pinned_array(4, np.float32)
        d = cudamem.device_array(4, np.float32)
        s.begin_capture()
        d.copy_to_device(h, stream=s)
        g = s.end_capture()
        cudamem.close()
        try:
            g.launch()
        except ValueError as e:
            assert "context" in str(e), e
        else:
            raise SystemExit("no ValueError")
        g.close()
        g.close()
        print("ok")
    """)


def test_close_while_other_threads_launch():
    # Threads launch one graph while another closes it: every launch
    # either runs or raises ValueError ("closed"); none reaches the
    # driver with a destroyed graph.  In a child process, so that a crash
    # fails this test only.
    r = run_child("""
        import threading
        import numpy as np, cudamem
        s = cudamem.stream()
        h = cudamem.pinned_array(256, np.float32)
        d = cudamem.device_array(256, np.float32)
        for round_ in range(20):
            s.begin_capture()
            d.copy_to_device(h, stream=s)
            g = s.end_capture()
            outcomes = []

            def launch():
                streams = [cudamem.stream() for _ in range(2)]
                for i in range(50):
                    try:
                        g.launch(streams[i % 2])
                    except ValueError as e:
                        outcomes.append(str(e))
                        return
                outcomes.append("ran")

            ts = [threading.Thread(target=launch) for _ in range(4)]
            for t in ts:
                t.start()
            g.close()
            for t in ts:
                t.join()
            assert all(o == "ran" or "closed" in o for o in outcomes), outcomes
            cudamem.synchronize()
        print("ok")
    """, timeout=240)
    assert r.stdout.strip().endswith("ok")


@pytest.mark.multi_gpu
def test_graph_on_other_device_stream():
    with cudamem.gpus[0]:
        s0 = cudamem.stream()
        d = cudamem.device_array(4, np.float32)
        h = cudamem.pinned_array(4, np.float32)
        s0.begin_capture()
        d.copy_to_device(h, stream=s0)
        g = s0.end_capture()
    with cudamem.gpus[1]:
        s1 = cudamem.stream()
    with pytest.raises(ValueError, match="another device"):
        g.launch(s1)
    g.close()


@pytest.mark.gpu
def test_gpu_replay_many(setup):
    s, hin, hout, d, d2 = setup
    g = _capture_roundtrip(s, hin, hout, d, d2)
    for i in range(1000):
        hin[:] = i
        g.launch(s)
        s.synchronize()
        assert hout[0] == i
    g.close()


@pytest.mark.skipif(not SIMULATOR, reason="injects driver errors")
def test_close_destroys_the_event_when_the_wait_fails(setup):
    """close() whose wait for the last launch fails (an error of the
    context's) raises it and still destroys the launch's event: the
    armed failure of the next cuEventDestroy is this close()'s, and a
    later graph closes cleanly."""
    s, hin, hout, d, d2 = setup
    graphs = []
    for _ in range(2):
        with cudamem.graph() as g:
            d.copy_to_device(hin, stream=g.stream)
        g.launch(s)
        graphs.append(g)
    s.synchronize()
    _core._sim_inject("EventSynchronize", 1, 999)
    _core._sim_inject("EventDestroy", 1, 1)
    try:
        with pytest.raises(cudamem.CudaAPIError, match="999|UNKNOWN"):
            graphs[0].close()
        assert graphs[0].closed
        graphs[1].close()              # its cuEventDestroy succeeds
    finally:
        _core._sim_inject("EventSynchronize", 0, 0)
        _core._sim_inject("EventDestroy", 0, 0)
