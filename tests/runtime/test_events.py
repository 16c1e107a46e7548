# SPDX-License-Identifier: MIT
"""Events: creation, record / wait / query / synchronize, timing and the
driver's errors (docs/api.md#streams-and-events, #stream-arguments)."""

import gc
import time
import weakref

import pytest
from helpers.streamutil import Gate

import cudamem as cuda


@pytest.fixture
def stream(ctx):
    s = cuda.stream()
    yield s
    s.synchronize()


def test_event_basics(ctx):
    for timing in (True, False):
        ev = cuda.event(timing=timing)
        assert isinstance(ev, cuda.Event)
        assert isinstance(ev.handle, int) and ev.handle != 0
        assert bool(ev) is True
        assert ev.query() is True        # never recorded: complete
        ev.record()
        ev.synchronize()
        assert ev.query() is True
    assert cuda.event(False).handle != cuda.event(True).handle


def test_event_argument_errors(ctx):
    with pytest.raises(TypeError):
        cuda.event(True, False)
    with pytest.raises(TypeError, match="unexpected keyword"):
        cuda.event(timeing=True)
    ev = cuda.event()
    with pytest.raises(TypeError, match="two Events"):
        ev.elapsed_time(0)
    with pytest.raises(TypeError, match="two Events"):
        cuda.event_elapsed_time(ev, None)
    with pytest.raises(TypeError):
        cuda.event_elapsed_time(ev)


@pytest.mark.parametrize("stream_arg", [None, 0])
def test_record_and_wait_accept_none_and_zero(ctx, stream_arg):
    """None means 0 everywhere (docs/api.md#stream-arguments)."""
    ev = cuda.event()
    ev.record(stream_arg)
    ev.record(stream=stream_arg)
    ev.wait(stream_arg)
    ev.wait(stream=stream_arg)
    ev.synchronize()


def test_query_pending_and_complete(stream):
    ev = cuda.event(timing=False)
    with Gate() as gate:
        gate.block(stream)
        ev.record(stream)
        assert ev.query() is False
        gate.open()
        ev.synchronize()
    assert ev.query() is True


def test_elapsed_time_measures_host_work(stream):
    start = cuda.event()
    end = cuda.event()
    start.record(stream)
    stream.add_callback(lambda s, st, a: time.sleep(0.05))
    end.record(stream)
    end.synchronize()
    ms = start.elapsed_time(end)
    assert isinstance(ms, float)
    assert ms > 0
    assert ms >= 40.0   # the callback slept 50 ms between the records
    assert cuda.event_elapsed_time(start, end) == ms
    assert cuda.event_elapsed_time(evtstart=start, evtend=end) == ms


def test_elapsed_time_without_timing(stream):
    a = cuda.event(timing=False)
    b = cuda.event(timing=False)
    a.record(stream)
    b.record(stream)
    b.synchronize()
    with pytest.raises(cuda.CudaAPIError,
                       match="cuEventElapsedTime.*CUDA_ERROR_INVALID_HANDLE"):
        a.elapsed_time(b)


def test_elapsed_time_never_recorded(ctx):
    a = cuda.event()
    b = cuda.event()
    with pytest.raises(cuda.CudaAPIError,
                       match="CUDA_ERROR_INVALID_HANDLE") as info:
        cuda.event_elapsed_time(a, b)
    assert info.value.code == 400


@pytest.mark.timeout(30)
def test_elapsed_time_not_ready(stream):
    a = cuda.event()
    b = cuda.event()
    a.record(stream)
    with Gate() as gate:
        gate.block(stream)
        b.record(stream)
        with pytest.raises(cuda.CudaAPIError, match="CUDA_ERROR_NOT_READY"):
            a.elapsed_time(b)
        gate.open()
        b.synchronize()
    assert a.elapsed_time(b) >= 0


def test_event_dropped_while_recorded_pending(stream):
    ev = cuda.event()
    w = weakref.ref(ev)
    with Gate() as gate:
        gate.block(stream)
        ev.record(stream)
        del ev
        gc.collect()
        assert w() is None        # the driver keeps the record itself
        gate.open()
        stream.synchronize()


def test_event_freed_inside_callback(stream):
    """An event whose last reference dies on the callback thread is
    released later, from an ordinary thread."""
    box = [cuda.event()]
    w = weakref.ref(box[0])
    stream.add_callback(lambda s, st, a: a.clear(), box)
    stream.synchronize()
    assert w() is None
    cuda.event().synchronize()     # runs the deferred release


def test_event_repr(ctx):
    assert repr(cuda.event()).startswith("<CUDA event 0x")
    assert repr(cuda.event(timing=False)).endswith("(no timing)>")
