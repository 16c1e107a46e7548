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
    ctx.reset()                         # no kept stream to hand out
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
        from helpers.streamutil import Gate

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


@pytest.fixture
def ctxq(ctx, monkeypatch):
    """The context's queue of pending destroys, empty, default limits;
    dropped streams go to it (none is kept for reuse)."""
    monkeypatch.setattr(cuda.config, "CUDA_STREAM_CACHE_SIZE", 0)
    q = ctx.deallocations
    q.clear()
    _core._set_dealloc_config(10, 0.2)
    yield q
    _core._set_dealloc_config(10, 0.2)
    q.clear()


@pytest.mark.parametrize("make, name", [
    (lambda: cuda.stream(), "StreamDestroy"),
    (lambda: cuda.event(), "EventDestroy"),
])
def test_destroy_is_queued_and_its_failure_raised_by_clear(ctxq, make,
                                                           name):
    """Streams and events go to the context's queue
    (docs/api.md#deferred-deallocation); a failing destroy surfaces from
    the flush that runs it, with the driver's name, and the queue is
    usable afterwards."""
    obj = make()
    w = weakref.ref(obj)
    del obj
    gc.collect()
    assert w() is None
    assert len(ctxq) == 1
    _core._sim_inject(name, 1, CUDA_ERROR_INVALID_VALUE)
    with pytest.raises(cuda.CudaAPIError, match=f"cu{name}"):
        ctxq.clear()
    assert len(ctxq) == 0


@pytest.mark.parametrize("make, name", [
    (lambda: cuda.stream(), "StreamDestroy"),
    (lambda: cuda.event(), "EventDestroy"),
])
def test_destroy_failure_in_dealloc_is_unraisable_not_fatal(
        ctxq, monkeypatch, make, name):
    """A flush run from a dealloc (past the count limit) cannot raise: the
    failure is reported as unraisable and never crashes."""
    seen = []
    monkeypatch.setattr(sys, "unraisablehook",
                        lambda u: seen.append(u.exc_type))
    _core._set_dealloc_config(0, 0.2)
    obj = make()
    _core._sim_inject(name, 1, CUDA_ERROR_INVALID_VALUE)
    del obj
    gc.collect()
    assert seen == [cuda.CudaAPIError]
    assert len(ctxq) == 0


def test_release_deferred_from_callback_thread(ctxq, monkeypatch):
    """An event whose last reference dies on the callback thread is not
    destroyed there (the driver forbids it): it waits in the queue, and the
    next flush on an ordinary thread destroys it."""
    import threading

    _core._set_dealloc_config(0, 0.2)
    s = cuda.stream()
    box = [cuda.event()]
    s.add_callback(lambda st, status, a: a.clear(), box)
    s.synchronize()                # waits for the callback
    assert box == []
    assert len(ctxq) == 1          # queued, not flushed on that thread
    seen = []
    monkeypatch.setattr(sys, "unraisablehook",
                        lambda u: seen.append((u.exc_type,
                                               threading.get_ident())))
    _core._sim_inject("EventDestroy", 1, CUDA_ERROR_INVALID_VALUE)
    with pytest.raises(cuda.CudaAPIError, match="cuEventDestroy"):
        ctxq.clear()
    assert seen == []


# ------------------------------------------------------------------
# Streams kept for reuse
# ------------------------------------------------------------------

def test_kept_stream_is_handed_out_without_create(ctx):
    ctx.reset()
    h = cuda.stream().handle
    _core._sim_inject("StreamCreate", 1, CUDA_ERROR_OUT_OF_MEMORY)
    s = cuda.stream()                   # the kept handle, no cuStreamCreate
    assert s.handle == h
    with pytest.raises(MemoryError, match="cuStreamCreate"):
        cuda.stream()                   # nothing kept: the armed failure
    assert _core._stream_cache(ctx) == []


def test_query_failure_at_drop_queues_the_destroy(ctx, monkeypatch):
    """cuStreamQuery failing in dealloc: the stream is not kept, its
    destroy is queued as before, and nothing is raised or reported."""
    seen = []
    monkeypatch.setattr(sys, "unraisablehook",
                        lambda u: seen.append(u.exc_type))
    ctx.reset()
    ctx.deallocations.clear()
    s = cuda.stream()
    _core._sim_inject("StreamQuery", 1, CUDA_ERROR_ILLEGAL_ADDRESS)
    del s
    assert _core._stream_cache(ctx) == []
    assert len(ctx.deallocations) == 1
    assert seen == []
    ctx.deallocations.clear()


def test_destroy_failure_when_kept_streams_go_is_unraisable(ctx,
                                                            monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook",
                        lambda u: seen.append(u.exc_type))
    ctx.reset()
    ctx.deallocations.clear()
    a, b = cuda.stream(), cuda.stream()
    del a, b
    assert len(_core._stream_cache(ctx)) == 2
    _core._sim_inject("StreamDestroy", 1, CUDA_ERROR_INVALID_VALUE)
    ctx.reset()                         # destroys both; the first fails
    assert seen == [cuda.CudaAPIError]
    assert _core._stream_cache(ctx) == []
