# SPDX-License-Identifier: MIT
"""cudamem's work behind the user's back while another library captures
(raw driver calls here, as CuPy's and PyTorch's are): the deferred frees
and a dropped stream's idleness check must not make the driver refuse a
call and invalidate that capture, which cudamem does not know of
(docs/design.md, "Capture-aware synchronous work")."""

import gc
import sys
import threading

import numpy as np
import pytest

import cudamem
from cudamem import _core
from helpers.crashutil import run_py

GLOBAL, THREAD_LOCAL, RELAXED = 0, 1, 2
N = 256


@pytest.fixture
def unraisable(monkeypatch):
    """What was reported as unraisable during the test."""
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    return seen


@pytest.fixture
def raw_stream():
    made = []

    def make(flags):
        made.append(_core._raw_stream_create(flags))
        return made[-1]

    yield make
    for h in made:
        _core._raw_stream_destroy(h)


def _captured_copy(ext, h, d, hout, mode):
    """Begin another library's capture of h in mode, with a copy recorded
    in it; returns a function that ends it (StreamCaptureError if it was
    invalidated), replays it and checks what it copied."""
    _core._raw_begin_capture(h, mode)
    d.copy_to_host(hout, stream=ext)

    def finish():
        g = ext.end_capture()
        try:
            for k in range(3):
                d.copy_to_device(np.arange(N, dtype=np.float32) + k)
                cudamem.synchronize()
                g.launch(ext)
                _core._raw_stream_synchronize(h)
                np.testing.assert_array_equal(hout, np.arange(N) + k)
        finally:
            g.close()
    return finish


@pytest.mark.parametrize("where", ["same_thread", "other_thread"])
@pytest.mark.parametrize("mode", [GLOBAL, THREAD_LOCAL],
                         ids=["global", "thread_local"])
@pytest.mark.parametrize("flags", [0, 1], ids=["blocking", "non_blocking"])
def test_frees_flushed_during_the_capture(memq, unraisable, raw_stream,
                                          flags, mode, where):
    # Forty arrays dropped during the capture: the queue goes past its
    # count (10) and flushes, cuMemFree for each.  The driver refuses
    # those frees during a global-mode capture on any thread, or one of
    # this thread's, unless the freeing thread's interaction mode is
    # relaxed; refused, they were dropped (leaked) and the capture
    # invalidated.
    h = raw_stream(flags)
    ext = cudamem.external_stream(h)
    d = cudamem.device_array(N, np.float32)
    hout = cudamem.pinned_array(N, np.float32)
    arrs = [cudamem.device_array(1024, np.float32) for _ in range(40)]
    finish = _captured_copy(ext, h, d, hout, mode)
    try:
        if where == "same_thread":
            del arrs[:]
            gc.collect()
        else:
            t = threading.Thread(target=lambda: (arrs.clear(),
                                                 gc.collect()))
            t.start()
            t.join()
        assert len(memq) <= 10      # flushed during the capture
    finally:
        finish()
    assert unraisable == []
    # The thread's interaction mode is what it was (global).
    assert _core._raw_capture_mode(GLOBAL) == GLOBAL


@pytest.mark.parametrize("before", [THREAD_LOCAL, RELAXED],
                         ids=["thread_local", "relaxed"])
def test_a_flush_gives_the_thread_its_mode_back(memq, before):
    arrs = [cudamem.device_array(16, np.float32) for _ in range(11)]
    old = _core._raw_capture_mode(before)
    try:
        del arrs[:]
        assert len(memq) == 0       # flushed
        assert _core._raw_capture_mode(before) == before
    finally:
        _core._raw_capture_mode(old)


def test_clear_during_the_capture(memq, unraisable, raw_stream):
    # PendingDeallocs.clear() by hand, in the capture.
    h = raw_stream(1)
    ext = cudamem.external_stream(h)
    d = cudamem.device_array(N, np.float32)
    hout = cudamem.pinned_array(N, np.float32)
    arrs = [cudamem.device_array(1024, np.float32) for _ in range(5)]
    pinned = cudamem.pinned_array(1024, np.float32)
    finish = _captured_copy(ext, h, d, hout, GLOBAL)
    try:
        del arrs[:], pinned
        gc.collect()
        memq.clear()
        assert len(memq) == 0
    finally:
        finish()
    assert unraisable == []


@pytest.mark.parametrize("where", ["same_thread", "other_thread"])
@pytest.mark.parametrize("flags", [0, 1], ids=["blocking", "non_blocking"])
def test_stream_dropped_during_the_capture(unraisable, raw_stream, flags,
                                           where):
    # A dropped stream is kept for reuse when idle, which a query tells;
    # the query of a stream that does not capture is refused during a
    # global-mode capture, and invalidated it.
    h = raw_stream(flags)
    ext = cudamem.external_stream(h)
    d = cudamem.device_array(N, np.float32)
    hout = cudamem.pinned_array(N, np.float32)
    streams = [cudamem.stream() for _ in range(4)]
    for s in streams:
        d.copy_to_host(hout, stream=s)
        s.synchronize()
    dropped = {s.handle for s in streams}
    finish = _captured_copy(ext, h, d, hout, GLOBAL)
    try:
        if where == "same_thread":
            del streams[:], s
        else:
            t = threading.Thread(target=streams.clear)
            t.start()
            t.join()
            del s
        s2 = cudamem.stream()
        assert s2.handle in dropped     # idle: kept, and reused
        assert not s2.is_capturing()
        del s2
    finally:
        finish()
    assert unraisable == []


def test_the_capturing_stream_dropped_is_not_kept(ctx, unraisable):
    # Another library captures a stream cudamem made (through its
    # handle); the stream object is dropped meanwhile: not queried (the
    # driver would refuse the query and invalidate the capture) and not
    # kept for reuse.  Its destruction waits in the context's queue,
    # held here until the capture has ended and replayed.
    s = cudamem.stream()
    h = s.handle
    d = cudamem.device_array(N, np.float32)
    hout = cudamem.pinned_array(N, np.float32)
    ext = cudamem.external_stream(h)
    ctx.deallocations._disable(1)
    try:
        finish = _captured_copy(ext, h, d, hout, GLOBAL)
        try:
            del s
            gc.collect()
            again = [cudamem.stream() for _ in range(3)]
            assert h not in {x.handle for x in again}
        finally:
            finish()
        del ext
    finally:
        ctx.deallocations._disable(-1)
    assert unraisable == []


# What the children below share: another library's stream (h, ext)
# about to capture a copy of d into hout, a stream s1 of cudamem's, and
# `two`, used on s1 and on the capturing stream.  _REPLAY ends the
# capture (StreamCaptureError if it was invalidated) and checks a replay.
_HEAD = r"""
import gc, sys
import numpy as np
import cudamem
from cudamem import _core

seen = []
sys.unraisablehook = seen.append
memq = cudamem.current_context().memory_manager.deallocations
h = _core._raw_stream_create(1)
ext = cudamem.external_stream(h)
d = cudamem.to_device(np.arange(256, dtype=np.float32))
hout = cudamem.pinned_array(256, np.float32)
s1 = cudamem.stream()
two = cudamem.device_array(4096, np.float32, stream=s1)
two.copy_to_device(np.ones(4096, np.float32), stream=ext)
"""

_REPLAY = r"""
g = ext.end_capture()
hout[:] = 0
g.launch(ext)
_core._raw_stream_synchronize(h)
np.testing.assert_array_equal(hout, np.arange(256))
g.close()
"""

_POOL_CHILD = _HEAD + r"""
# Blocks freed on the default stream and on s1, before the capture:
# their events were recorded outside it.
blocks = [cudamem.device_array(1024, np.float32, stream=s1 if i % 2 else 0)
          for i in range(30)]
del blocks[::2]
cudamem.synchronize()
_core._raw_begin_capture(h, 0)
d.copy_to_host(hout, stream=ext)
# On s1, the pool hands out blocks freed on the default stream once
# their events' queries say so.
more = [cudamem.device_array(1024, np.float32, stream=s1) for _ in range(40)]
del more, blocks
gc.collect()
# Memory used on the capturing stream itself, dropped there: no event is
# recorded on that stream (it would be captured, and its query refused),
# so another stream does not get the blocks during the capture.
on_ext = [cudamem.device_array(2048, np.float32, stream=ext)
          for _ in range(8)]
del on_ext
gc.collect()
again = [cudamem.device_array(2048, np.float32, stream=s1)
         for _ in range(8)]
del again
gc.collect()
# Used on another stream and on the capturing one: no event can be
# recorded on the capturing stream, so its release waits in the queue
# for the capture's end (the other stream's event recorded now, the
# capturing stream's then).
del two
gc.collect()
assert len(memq) == 1, len(memq)
""" + _REPLAY + r"""
memq.clear()
assert len(memq) == 0, len(memq)
# After the capture the blocks freed on it serve another stream again.
later = [cudamem.device_array(2048, np.float32, stream=s1)
         for _ in range(16)]
del later
cudamem.synchronize()
_core._raw_stream_destroy(h)
assert not seen, [str(u.exc_value) for u in seen]
print("OK")
"""


@pytest.mark.parametrize("vmm", ["1", "0"], ids=["arenas", "segments"])
def test_pool_allocations_on_another_stream_during_the_capture(vmm):
    # The pool gives a block freed on one stream to another once the
    # event recorded at its free has completed, which a query tells: a
    # query the driver refuses during a global-mode capture of this
    # thread, invalidating it, unless made in the relaxed mode; and
    # refuses whatever the mode for an event recorded in the capture.  In a
    # child: a manager is chosen before the context is made.  (The async
    # manager's cuMemAllocFromPoolAsync is the user's allocation, which
    # the driver refuses there as it refuses cuMemAlloc.)
    rc, out = run_py(_POOL_CHILD, CUDAMEM_MEMORY_MANAGER="pool",
                     CUDAMEM_POOL_VMM=vmm)
    assert rc == 0 and "OK" in out, out


_ASYNC_CHILD = _HEAD + r"""
others = [cudamem.device_array(1024, np.float32, stream=s1 if i % 2 else 0)
          for i in range(30)]
on_ext = [cudamem.device_array(2048, np.float32, stream=ext)
          for _ in range(8)]
for a in on_ext:
    a.copy_to_device(np.ones(2048, np.float32), stream=ext)
del a
# Made before: the user's own allocations are refused during the capture.
batches = [[cudamem.device_array(64, np.float32, stream=s1)
            for _ in range(20)] for _ in range(3)]
cudamem.synchronize()
_core._raw_begin_capture(h, MODE)
d.copy_to_host(hout, stream=ext)
# Blocks of streams that do not capture: freed at once, in the relaxed
# mode (the driver refuses a free in the default modes).
del others
gc.collect()
assert len(memq) == 0, len(memq)
# Blocks of the capturing stream: a free there would be recorded into
# the graph, to run at each replay; they wait in the queue.
del on_ext
gc.collect()
assert len(memq) == 8, len(memq)
# The one used on two streams waits for the capture too (after it, the
# side stream waits for the capturing stream and frees).
del two
gc.collect()
assert len(memq) == 9, len(memq)
# A flush by hand, and past the thresholds, keeps them: the rest go.
memq.clear()
assert len(memq) == 9, len(memq)
while batches:
    with memq.disable():
        del batches[-1]
        gc.collect()
        assert len(memq) == 29, len(memq)
    # Leaving it flushes past the thresholds, which count the others.
    assert len(memq) == 9, len(memq)
""" + _REPLAY + r"""
# The capture over, they are tried again every CUDA_DEALLOCS_COUNT
# (10) releases made at once: freed on their stream.
for _ in range(11):
    cudamem.device_array(64, np.float32, stream=s1)
assert len(memq) == 0, len(memq)
cudamem.synchronize()
_core._raw_stream_destroy(h)
assert not seen, [str(u.exc_value) for u in seen]
print("OK")
"""


@pytest.mark.parametrize("mode", [GLOBAL, THREAD_LOCAL],
                         ids=["global", "thread_local"])
def test_async_frees_during_the_capture(mode):
    # The async manager returns a block at once with cuMemFreeAsync on
    # its stream: in the relaxed mode (a default-mode capture of this
    # thread makes the driver refuse it and invalidates that capture),
    # and not while that stream itself captures.  In a child: a manager
    # is chosen before the context is made.
    rc, out = run_py(_ASYNC_CHILD.replace("MODE", str(mode)),
                     CUDAMEM_MEMORY_MANAGER="async")
    assert rc == 0 and "OK" in out, out


_NEXT_CAPTURE_CHILD = _HEAD + r"""
h2 = _core._raw_stream_create(1)
ext2 = cudamem.external_stream(h2)
d2 = cudamem.to_device(np.arange(256, dtype=np.float32) * 2)
hout2 = cudamem.pinned_array(256, np.float32)
cudamem.synchronize()
_core._raw_begin_capture(h, 0)
d.copy_to_host(hout, stream=ext)
# Used on s1 and on the capturing stream, dropped during the capture: its
# release waits in the queue for that capture's end.
del two
gc.collect()
assert len(memq) == 1, len(memq)
""" + _REPLAY + r"""
# The library captures again, on another stream of its own, in global
# mode: a flush now (by hand, and past the count) must not synchronise
# the context, which the driver refuses while a stream of it captures,
# invalidating that capture.
batch = [cudamem.device_array(64, np.float32, stream=s1) for _ in range(12)]
with memq.disable():
    _core._raw_begin_capture(h2, 0)
    d2.copy_to_host(hout2, stream=ext2)
    memq.clear()
    del batch
    gc.collect()
g2 = ext2.end_capture()
hout2[:] = 0
g2.launch(ext2)
_core._raw_stream_synchronize(h2)
np.testing.assert_array_equal(hout2, np.arange(256) * 2)
g2.close()
# Both captures over: the release has run, and the memory is the pool's
# to hand out again.
memq.clear()
assert len(memq) == 0, len(memq)
again = [cudamem.device_array(4096, np.float32, stream=s1) for _ in range(4)]
del again
cudamem.synchronize()
_core._raw_stream_destroy(h)
_core._raw_stream_destroy(h2)
assert not seen, [str(u.exc_value) for u in seen]
print("OK")
"""


@pytest.mark.parametrize("manager", ["pool", "async"])
def test_a_release_kept_for_one_capture_runs_beside_the_next(manager):
    # Memory used on a stream another library captures, and on one of
    # cudamem's, dropped during that capture, waits in the queue for the
    # capture's end.  The library then captures again on another stream
    # (capturing graphs one after another is the usual pattern): the
    # flushes meanwhile must leave that second capture valid.  In a
    # child: a manager is chosen before the context is made.
    rc, out = run_py(_NEXT_CAPTURE_CHILD, CUDAMEM_MEMORY_MANAGER=manager)
    assert rc == 0 and "OK" in out, out


_CALLBACK_DROP_CHILD = r"""
import gc, sys
import numpy as np
import cudamem
from cudamem import _core

seen = []
sys.unraisablehook = seen.append
memq = cudamem.current_context().memory_manager.deallocations
s1 = cudamem.stream()
s2 = cudamem.stream()
held = [cudamem.device_array(4096, np.float32, stream=s1)]
held[0].copy_to_device(np.ones(4096, np.float32), stream=s2)
# Dropped by a stream callback, on the driver's thread, where no event
# can be recorded: its release waits for the context, at a later flush.
s1.add_callback(lambda stream, status, arg: held.clear(), None)
s1.synchronize()
assert not held
assert len(memq) == 1, len(memq)
# Another library captures a blocking stream of its own meanwhile: the
# flush must keep that release rather than synchronise the context,
# which the driver refuses then, invalidating the capture.
h = _core._raw_stream_create(0)
ext = cudamem.external_stream(h)
d = cudamem.to_device(np.arange(256, dtype=np.float32))
hout = cudamem.pinned_array(256, np.float32)
cudamem.synchronize()
_core._raw_begin_capture(h, 0)
d.copy_to_host(hout, stream=ext)
memq.clear()
assert len(memq) == 1, len(memq)
g = ext.end_capture()
hout[:] = 0
g.launch(ext)
_core._raw_stream_synchronize(h)
np.testing.assert_array_equal(hout, np.arange(256))
g.close()
# The capture over, the next flush runs it.
memq.clear()
assert len(memq) == 0, len(memq)
cudamem.synchronize()
_core._raw_stream_destroy(h)
assert not seen, [str(u.exc_value) for u in seen]
print("OK")
"""


@pytest.mark.parametrize("manager", ["pool", "async"])
def test_a_release_after_the_context_waits_for_a_blocking_capture(manager):
    # Memory used on two streams and dropped where no event can be
    # recorded (a stream callback) is released after the context: a
    # context-wide synchronisation, which the driver refuses, invalidating
    # the capture, while any stream of the context captures.  A capture
    # of a blocking stream the driver tells without harm (a query of the
    # legacy stream): the release waits for its end.  In a child: a
    # manager is chosen before the context is made.
    rc, out = run_py(_CALLBACK_DROP_CHILD, CUDAMEM_MEMORY_MANAGER=manager)
    assert rc == 0 and "OK" in out, out
