# SPDX-License-Identifier: MIT
"""Streams and events: ordering, queries, timing, callbacks, waiting on an
event from another stream, asyncio."""

import asyncio
import threading

import numpy as np

import cudamem as cuda


def test_default_and_new_streams():
    s = cuda.stream()
    assert s.handle is not None and int(s) != 0
    assert cuda.default_stream() is not None
    assert cuda.legacy_default_stream() is not None
    assert cuda.per_thread_default_stream() is not None
    s.synchronize()
    assert s.query()


def test_work_on_a_stream_is_ordered(stream):
    host = np.arange(1 << 14, dtype=np.int32)
    d = cuda.to_device(host, stream=stream)
    for i in range(5):
        d[:] = host + i  # enqueued on the stream, in order
    out = d.copy_to_host(stream=stream)
    stream.synchronize()
    np.testing.assert_array_equal(out, host + 4)


def test_events_time_and_order(stream):
    start = cuda.event()
    end = cuda.event()
    start.record(stream)
    cuda.to_device(np.zeros(1 << 20, dtype=np.uint8), stream=stream)
    end.record(stream)
    end.synchronize()
    assert end.query()
    assert cuda.event_elapsed_time(start, end) >= 0.0
    assert start.elapsed_time(end) >= 0.0


def test_cross_stream_wait():
    a = cuda.stream()
    b = cuda.stream()
    host = np.arange(1 << 16, dtype=np.float32)
    d = cuda.to_device(host, stream=a)
    done = cuda.event(timing=False)
    done.record(a)
    b.wait_event(done)
    out = d.copy_to_host(stream=b)
    b.synchronize()
    np.testing.assert_array_equal(out, host)


def test_stream_callback(stream):
    called = threading.Event()
    seen = []

    def callback(s, status, arg):
        seen.append((status, arg))
        called.set()

    cuda.to_device(np.ones(1024), stream=stream)
    stream.add_callback(callback, "arg")
    stream.synchronize()
    assert called.wait(30)
    assert seen == [(0, "arg")]


def test_auto_synchronize():
    s = cuda.stream()
    with s.auto_synchronize():
        d = cuda.to_device(np.arange(10), stream=s)
    assert s.query()
    np.testing.assert_array_equal(d.copy_to_host(), np.arange(10))


def test_asyncio_await_stream():
    async def main():
        s = cuda.stream()
        d = cuda.to_device(np.arange(1000, dtype=np.int64), stream=s)
        await s.async_done()
        return d.copy_to_host()

    np.testing.assert_array_equal(asyncio.run(main()), np.arange(1000))


def test_synchronize_all():
    cuda.to_device(np.arange(10), stream=cuda.stream())
    cuda.synchronize()
