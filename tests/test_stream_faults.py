# SPDX-License-Identifier: MIT
"""Driver failures on the stream and event paths (simulator fault
injection): each raises CudaAPIError with the entry point and error name,
and gives back everything it took."""

import asyncio
import gc
import sys
import weakref

import pytest

import cudamem as cuda
from cudamem import _core

pytestmark = pytest.mark.sim

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_ILLEGAL_ADDRESS = 700


@pytest.fixture(autouse=True)
def _disarm():
    yield
    for name in ("StreamCreate", "StreamAddCallback", "StreamSynchronize",
                 "StreamWaitEvent", "StreamQuery", "EventCreate",
                 "EventRecord", "EventQuery", "EventSynchronize",
                 "StreamDestroy", "EventDestroy"):
        _core._sim_inject(name, 0, 0)


def test_stream_create_fails(ctx):
    _core._sim_inject("StreamCreate", 1, CUDA_ERROR_OUT_OF_MEMORY)
    with pytest.raises(MemoryError, match="cuStreamCreate"):
        cuda.stream()
    cuda.stream().synchronize()


def test_event_create_fails(ctx):
    _core._sim_inject("EventCreate", 1, CUDA_ERROR_INVALID_VALUE)
    with pytest.raises(cuda.CudaAPIError,
                       match="cuEventCreate.*CUDA_ERROR_INVALID_VALUE"):
        cuda.event()


def test_add_callback_enqueue_fails_releases_references(ctx):
    s = cuda.stream()

    def cb(st, status, arg):
        pass

    arg = object()
    before = (sys.getrefcount(s), sys.getrefcount(cb), sys.getrefcount(arg))
    _core._sim_inject("StreamAddCallback", 1, CUDA_ERROR_ILLEGAL_ADDRESS)
    with pytest.raises(cuda.CudaAPIError,
                       match="cuStreamAddCallback.*ILLEGAL_ADDRESS"):
        s.add_callback(cb, arg)
    after = (sys.getrefcount(s), sys.getrefcount(cb), sys.getrefcount(arg))
    assert after == before


def test_async_done_enqueue_fails_releases_references(ctx):
    s = cuda.stream()

    async def main():
        before = sys.getrefcount(s)
        _core._sim_inject("StreamAddCallback", 1, CUDA_ERROR_INVALID_VALUE)
        with pytest.raises(cuda.CudaAPIError, match="cuStreamAddCallback"):
            s.async_done()
        assert sys.getrefcount(s) == before
        return await s.async_done()    # the path still works

    assert asyncio.run(main()) is s


def test_await_event_helper_stream_fails(ctx):
    s = cuda.stream()
    ev = cuda.event(timing=False)

    async def main():
        from streamutil import Gate

        with Gate() as gate:
            gate.block(s)
            ev.record(s)
            _core._sim_inject("StreamWaitEvent", 1, CUDA_ERROR_INVALID_VALUE)
            with pytest.raises(cuda.CudaAPIError, match="cuStreamWaitEvent"):
                await ev
            gate.open()
            return await ev

    assert asyncio.run(main()) is ev


@pytest.mark.parametrize("call, name", [
    (lambda s, e: s.synchronize(), "StreamSynchronize"),
    (lambda s, e: s.query(), "StreamQuery"),
    (lambda s, e: s.wait_event(e), "StreamWaitEvent"),
    (lambda s, e: e.record(s), "EventRecord"),
    (lambda s, e: e.query(), "EventQuery"),
    (lambda s, e: e.synchronize(), "EventSynchronize"),
    (lambda s, e: e.wait(s), "StreamWaitEvent"),
])
def test_driver_errors_are_named(ctx, call, name):
    s = cuda.stream()
    e = cuda.event()
    _core._sim_inject(name, 1, CUDA_ERROR_ILLEGAL_ADDRESS)
    with pytest.raises(cuda.CudaAPIError,
                       match=f"cu{name}.*CUDA_ERROR_ILLEGAL_ADDRESS"):
        call(s, e)


@pytest.mark.parametrize("make, name", [
    (lambda: cuda.stream(), "StreamDestroy"),
    (lambda: cuda.event(), "EventDestroy"),
])
def test_destroy_failure_is_unraisable_not_fatal(ctx, monkeypatch, make,
                                                 name):
    """A failing destroy in dealloc is reported (against the type: the
    object itself is already dead) and never crashes."""
    seen = []
    monkeypatch.setattr(sys, "unraisablehook",
                        lambda u: seen.append((u.exc_type, u.object)))
    obj = make()
    tp = type(obj)
    w = weakref.ref(obj)
    _core._sim_inject(name, 1, CUDA_ERROR_INVALID_VALUE)
    del obj
    gc.collect()
    assert w() is None
    assert seen == [(cuda.CudaAPIError, tp)]


def test_release_deferred_from_callback_thread(ctx, monkeypatch):
    """An event whose last reference dies on the callback thread is not
    destroyed there (the driver forbids it) but by the next cudamem call on
    an ordinary thread: a failure injected after the callback shows up
    there."""
    import threading

    seen = []
    monkeypatch.setattr(sys, "unraisablehook",
                        lambda u: seen.append((u.exc_type,
                                               threading.get_ident())))
    s = cuda.stream()
    box = [cuda.event()]
    s.add_callback(lambda st, status, a: a.clear(), box)
    ctx.synchronize()              # waits for the callback; runs nothing
    assert box == []
    _core._sim_inject("EventDestroy", 1, CUDA_ERROR_INVALID_VALUE)
    cuda.event()                   # runs the deferred release
    assert seen == [(cuda.CudaAPIError, threading.get_ident())]
