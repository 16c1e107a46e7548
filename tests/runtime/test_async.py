# SPDX-License-Identifier: MIT
"""asyncio: Stream.async_done() and `await event`, through the GIL-free
completion path (docs/api.md#asyncio)."""

import asyncio
import gc
import os
import threading
import weakref

import pytest
from helpers.streamutil import Gate

import cudamem as cuda

pytestmark = pytest.mark.timeout(30)


def run(coro):
    return asyncio.run(coro)


def test_async_done_needs_running_loop(ctx):
    s = cuda.stream()
    with pytest.raises(RuntimeError):
        s.async_done()


def test_async_done_resolves_to_stream(ctx):
    s = cuda.stream()

    async def main():
        fut = s.async_done()
        assert isinstance(fut, asyncio.Future)
        return await fut

    assert run(main()) is s


def test_several_futures_on_one_stream(ctx):
    s = cuda.stream()
    order = []

    async def main():
        futs = []
        with Gate() as gate:
            gate.block(s)
            for i in range(5):
                f = s.async_done()
                f.add_done_callback(lambda f, i=i: order.append(i))
                futs.append(f)
            await asyncio.sleep(0)
            assert not any(f.done() for f in futs)
            gate.open()
            return await asyncio.gather(*futs)

    assert run(main()) == [s] * 5
    assert order == list(range(5))


def test_futures_across_streams(ctx):
    streams = [cuda.stream() for _ in range(4)]

    async def main():
        return await asyncio.gather(*(s.async_done() for s in streams))

    assert run(main()) == streams


def test_resolved_on_loop_thread(ctx):
    s = cuda.stream()
    threads = []

    async def main():
        fut = s.async_done()
        fut.add_done_callback(lambda f: threads.append(threading.get_ident()))
        await fut

    run(main())
    assert threads == [threading.get_ident()]


def test_cancelled_future_left_alone(ctx):
    s = cuda.stream()

    async def main():
        with Gate() as gate:
            gate.block(s)
            first = s.async_done()
            first.cancel()
            second = s.async_done()
            gate.open()
            r = await second
        # second completed after first's record on the same stream, so the
        # loop has already dropped first without touching it.
        assert first.cancelled()
        return r

    assert run(main()) is s


def test_waiting_task_cancelled(ctx):
    s = cuda.stream()

    async def main():
        with Gate() as gate:
            gate.block(s)
            task = asyncio.ensure_future(s.async_done())
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            gate.open()
            return await s.async_done()

    assert run(main()) is s


def test_future_keeps_stream_alive(ctx):
    async def main():
        s = cuda.stream()
        w = weakref.ref(s)
        with Gate() as gate:
            gate.block(s)
            fut = s.async_done()
            del s
            gc.collect()
            assert w() is not None
            gate.open()
            r = await fut
        assert r is w()
        del r, fut
        gc.collect()
        return w

    w = run(main())
    cuda.synchronize()
    gc.collect()
    assert w() is None


def test_loops_on_two_threads(ctx):
    results = {}

    def worker(i):
        cuda.current_context()
        s = cuda.stream()

        async def main():
            return await s.async_done()

        results[i] = run(main()) is s

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {0: True, 1: True, 2: True}


def test_await_event(ctx):
    s = cuda.stream()
    ev = cuda.event(timing=False)

    async def main():
        with Gate() as gate:
            gate.block(s)
            ev.record(s)
            task = asyncio.ensure_future(_await(ev))
            await asyncio.sleep(0)
            assert not task.done()
            assert ev.query() is False
            gate.open()
            return await task

    assert run(main()) is ev
    assert ev.query() is True


async def _await(ev):
    return await ev


def test_await_completed_event(ctx):
    ev = cuda.event()
    ev.record()
    ev.synchronize()
    assert run(_await(ev)) is ev
    fresh = cuda.event()
    assert run(_await(fresh)) is fresh   # never recorded: complete


def test_await_event_needs_loop(ctx):
    ev = cuda.event()
    with pytest.raises(RuntimeError):
        ev.__await__()


def test_no_fd_leak_across_loops(ctx):
    s = cuda.stream()

    async def main():
        await s.async_done()

    run(main())
    gc.collect()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        run(main())
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= before + 1
