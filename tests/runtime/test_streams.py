# SPDX-License-Identifier: MIT
"""Streams: factories, identity and protocol views, ordering, callbacks,
dropped streams, stream arguments, and the GIL
(docs/api.md#streams-and-events)."""

import gc
import sys
import textwrap
import threading
import time
import weakref

import numpy as np
import pytest

import cudamem as cuda
from helpers import run_child
from helpers.streamutil import GATE_TIMEOUT, Gate


@pytest.fixture
def stream(ctx):
    s = cuda.stream()
    yield s
    s.synchronize()


# ------------------------------------------------------------------
# Factories, repr, int, protocol, truthiness, identity
# ------------------------------------------------------------------

def test_user_stream_views(stream):
    h = stream.handle
    assert isinstance(h, int) and h not in (0, 1, 2)
    assert int(stream) == h
    assert stream.__cuda_stream__() == (0, h)
    assert repr(stream) == f"<CUDA stream {h}>"
    assert stream.external is False
    assert isinstance(stream, cuda.Stream)


@pytest.mark.parametrize("factory, handle, text", [
    (cuda.default_stream, 0, "<Default CUDA stream>"),
    (cuda.legacy_default_stream, 1, "<Legacy default CUDA stream>"),
    (cuda.per_thread_default_stream, 2, "<Per-thread default CUDA stream>"),
])
def test_default_streams(ctx, factory, handle, text):
    s = factory()
    assert s.handle == handle and int(s) == handle
    assert s.__cuda_stream__() == (0, handle)
    assert repr(s) == text
    assert s.external is False
    assert bool(s) is True           # truthy even with handle 0
    other = factory()
    assert other is not s and other != s   # a fresh object, identity eq
    s.synchronize()
    assert s.query() is True


def test_truthiness_and_identity(stream):
    assert bool(stream) is True
    assert stream == stream  # noqa: PLR0124  (identity equality)
    assert stream != cuda.stream()
    assert hash(stream) == object.__hash__(stream)
    assert len({stream, stream}) == 1


def test_types_not_instantiable(ctx):
    with pytest.raises(TypeError):
        cuda.Stream()
    with pytest.raises(TypeError):
        cuda.Event()


def test_external_stream(ctx, stream):
    h = stream.handle
    e = cuda.external_stream(h)
    assert e.external is True
    assert e.handle == h and int(e) == h
    assert repr(e) == f"<External CUDA stream {h}>"
    assert "default" not in repr(e).lower()
    assert e.__cuda_stream__() == (0, h)
    assert cuda.external_stream(ptr=h).handle == h
    assert cuda.external_stream(True).handle == 1   # bool is an int
    assert cuda.external_stream(2).handle == 2


@pytest.mark.parametrize("bad", ["page", 5, 1 << 63, 0x1000, 2**64 - 8])
def test_external_stream_of_no_stream_object_is_refused(ctx, bad,
                                                        bad_handle):
    # The driver reads the object at a stream handle without a check, so a
    # handle at an unreadable or unaligned address would crash it: refused
    # before it gets there (numba accepts any int).
    with pytest.raises(ValueError, match="is not a stream handle"):
        cuda.external_stream(bad_handle if bad == "page" else bad)


class _CudaStreamOf:
    def __init__(self, h):
        self.h = h

    def __cuda_stream__(self):
        return (0, self.h)


def test_foreign_stream_of_no_stream_object_is_refused(ctx, bad_handle):
    d = cuda.device_array(3)
    with pytest.raises(ValueError, match="is not a stream handle"):
        d.copy_to_host(stream=_CudaStreamOf(bad_handle))
    with pytest.raises(ValueError, match="is not a stream handle"):
        cuda.to_device(np.zeros(3), stream=_CudaStreamOf(bad_handle + 64))


def test_external_stream_never_destroyed(stream):
    w = cuda.external_stream(stream.handle)
    assert repr(w) == f"<External CUDA stream {stream.handle}>"
    del w
    gc.collect()
    # The wrapped stream still works: cudamem did not destroy it.
    stream.synchronize()
    ran = []
    stream.add_callback(lambda s, st, a: ran.append(a), 7)
    stream.synchronize()
    assert ran == [7]


@pytest.mark.parametrize("bad", [1.0, "0x10", None, b"1", [1], object()])
def test_external_stream_type_errors(ctx, bad):
    with pytest.raises(TypeError,
                       match="ptr for external stream must be an int"):
        cuda.external_stream(bad)


def test_external_stream_range(ctx):
    with pytest.raises(OverflowError):
        cuda.external_stream(-1)
    with pytest.raises(OverflowError):
        cuda.external_stream(1 << 64)
    with pytest.raises(TypeError):
        cuda.external_stream()


# ------------------------------------------------------------------
# synchronize, query, auto_synchronize
# ------------------------------------------------------------------

def test_query_follows_pending_work(stream):
    assert stream.query() is True
    with Gate() as gate:
        gate.block(stream)
        assert stream.query() is False
        gate.open()
        stream.synchronize()
    assert stream.query() is True
    assert not gate.timed_out


def test_auto_synchronize_yields_and_syncs(stream):
    ran = []
    with stream.auto_synchronize() as s:
        assert s is stream
        with Gate() as gate:
            gate.block(stream)
            stream.add_callback(lambda s, st, a: ran.append(a), "done")
            gate.open()
    assert ran == ["done"]
    assert stream.query() is True


def test_auto_synchronize_on_exception(stream):
    """The exit action runs in `finally` (docs/api.md#exit-actions)."""
    ran = []
    gate = Gate()
    # Opened from another thread only once the body has raised, so the
    # callback can only have run if __exit__ waited for it.
    opener = threading.Timer(0.05, gate.open)
    with pytest.raises(ValueError, match="boom"), stream.auto_synchronize():
        gate.block(stream)
        stream.add_callback(lambda s, st, a: ran.append(a), "done")
        opener.start()
        raise ValueError("boom")
    # Checked before joining the opener: without the sync in __exit__ the
    # gate would still be closed here.
    assert ran == ["done"]
    assert stream.query() is True
    opener.join()


# ------------------------------------------------------------------
# Callbacks
# ------------------------------------------------------------------

def test_callbacks_in_order(stream):
    out = []
    for i in range(50):
        stream.add_callback(lambda s, st, a: out.append(a), i)
    stream.synchronize()
    assert out == list(range(50))


def test_callback_arguments_and_thread(stream):
    seen = []

    def cb(s, status, arg):
        seen.append((s, status, arg, threading.get_ident()))

    stream.add_callback(cb)
    stream.add_callback(cb, arg="x")
    stream.add_callback(callback=cb, arg=3)
    stream.synchronize()
    assert [(s, st, a) for s, st, a, _ in seen] == [
        (stream, 0, None), (stream, 0, "x"), (stream, 0, 3)]
    assert all(t != threading.get_ident() for *_, t in seen)
    assert all(type(st) is int for _, st, _, _ in seen)


def test_callback_on_default_stream(ctx):
    out = []
    s = cuda.default_stream()
    s.add_callback(lambda s, st, a: out.append(a), 1)
    s.synchronize()
    assert out == [1]


def test_add_callback_argument_errors(stream):
    with pytest.raises(TypeError, match="callable"):
        stream.add_callback(5)
    with pytest.raises(TypeError):
        stream.add_callback()
    with pytest.raises(TypeError):
        stream.add_callback(print, 1, 2)
    with pytest.raises(TypeError, match="unexpected keyword"):
        stream.add_callback(print, bogus=1)
    with pytest.raises(TypeError, match="multiple values"):
        stream.add_callback(print, callback=print)


def test_callback_exception_becomes_warning(stream):
    after = []

    def bad(s, status, arg):
        raise KeyError("boom")

    with pytest.warns(UserWarning,  # noqa: PT031  (the sync must be inside)
                      match="Exception in stream callback: 'boom'"):
        stream.add_callback(bad)
        stream.synchronize()
    # The process and the stream carry on.
    stream.add_callback(lambda s, st, a: after.append(a), 1)
    stream.synchronize()
    assert after == [1]


def test_cuda_call_inside_callback_is_refused(stream):
    def cb(s, status, arg):
        s.synchronize()

    with pytest.warns(UserWarning,  # noqa: PT031  (the sync must be inside)
                      match="cannot be called from a stream callback"):
        stream.add_callback(cb)
        stream.synchronize()


def test_callback_references_held_until_run(stream):
    class Arg:
        pass

    def cb(s, status, arg):
        pass

    arg = Arg()
    base_cb = sys.getrefcount(cb)
    base_arg = sys.getrefcount(arg)
    base_stream = sys.getrefcount(stream)
    with Gate() as gate:
        gate.block(stream)
        # Once the gate runs, its call's arguments hold the stream too;
        # counted only then, so the result does not depend on when the
        # callback thread takes the GIL.
        assert gate.entered.wait(GATE_TIMEOUT)
        held = sys.getrefcount(stream)
        assert held > base_stream           # the gate's record
        stream.add_callback(cb, arg)
        assert sys.getrefcount(cb) == base_cb + 1
        assert sys.getrefcount(arg) == base_arg + 1
        assert sys.getrefcount(stream) == held + 1     # cb's record
        gate.open()
        stream.synchronize()
    assert sys.getrefcount(cb) == base_cb
    assert sys.getrefcount(arg) == base_arg
    assert sys.getrefcount(stream) == base_stream


def test_callback_keeps_only_reference_alive(stream):
    out = []
    arg = [1, 2, 3]

    class Box(list):
        pass

    box = Box(arg)
    w = weakref.ref(box)
    with Gate() as gate:
        gate.block(stream)
        stream.add_callback(lambda s, st, a: out.append(list(a)), box)
        del box
        gc.collect()
        assert w() is not None
        gate.open()
        stream.synchronize()
    assert out == [arg]
    assert w() is None


# ------------------------------------------------------------------
# Across streams
# ------------------------------------------------------------------

@pytest.mark.timeout(30)
def test_streams_are_independent(ctx):
    s1 = cuda.stream()
    s2 = cuda.stream()
    ev = cuda.event(timing=False)
    with Gate() as gate:
        gate.block(s1)
        # Work on s2 completes while s1 is held (no host callback on s2:
        # the driver may run all host callbacks on one thread).
        ev.record(s2)
        ev.synchronize()
        s2.synchronize()
        assert s2.query() is True
        assert s1.query() is False
        gate.open()
        s1.synchronize()
    assert not gate.timed_out


@pytest.mark.timeout(30)
@pytest.mark.parametrize("how", ["stream.wait_event", "event.wait"])
def test_wait_event_orders_streams(ctx, how):
    s1 = cuda.stream()
    s2 = cuda.stream()
    ev = cuda.event(timing=False)
    order = []
    with Gate() as gate:
        gate.block(s1)
        s1.add_callback(lambda s, st, a: order.append(a), "s1")
        ev.record(s1)
        if how == "stream.wait_event":
            s2.wait_event(ev)
        else:
            ev.wait(s2)
        s2.add_callback(lambda s, st, a: order.append(a), "s2")
        assert s2.query() is False    # s2 waits for s1's gate
        gate.open()
        s2.synchronize()
    assert order == ["s1", "s2"]
    s1.synchronize()


def test_wait_event_type_error(stream):
    with pytest.raises(TypeError, match="expects an Event"):
        stream.wait_event(stream)


# ------------------------------------------------------------------
# Dropping streams
# ------------------------------------------------------------------

def test_dropped_stream_is_freed(ctx):
    s = cuda.stream()
    w = weakref.ref(s)
    del s
    assert w() is None


@pytest.mark.timeout(30)
def test_stream_dropped_with_work_queued(ctx):
    """The queued work still runs, then the stream goes: the pending
    callbacks held it, and nothing stays behind."""
    out = []
    s = cuda.stream()
    h = s.handle
    w = weakref.ref(s)
    with Gate() as gate:
        gate.block(s)
        for i in range(5):
            s.add_callback(lambda st, status, a: out.append(a), i)
        del s
        gc.collect()
        assert w() is not None          # kept by the pending callbacks
        gate.open()
        ctx.synchronize()
    assert out == list(range(5))
    assert w() is None
    # The handle was released from the callback thread, deferred to the
    # next cudamem call on an ordinary thread; that call succeeds.
    s2 = cuda.stream()
    s2.synchronize()
    assert h != 0


def test_many_streams_no_growth(ctx):
    gc.collect()
    before = len(gc.get_objects())
    for _ in range(200):
        s = cuda.stream()
        s.add_callback(lambda st, status, a: None)
        s.synchronize()
        del s
    gc.collect()
    assert len(gc.get_objects()) - before < 50


# ------------------------------------------------------------------
# Stream arguments (cm_stream_resolve through Event.record)
# ------------------------------------------------------------------

class _ForeignStream:
    def __init__(self, h):
        self.h = h

    def __cuda_stream__(self):
        return (0, self.h)


@pytest.mark.parametrize("make", [
    lambda s: 0, lambda s: None, lambda s: False, lambda s: s,
    lambda s: cuda.default_stream(), lambda s: _ForeignStream(s.handle),
])
def test_stream_arguments_accepted(stream, make):
    ev = cuda.event()
    ev.record(make(stream))
    ev.record(stream=make(stream))
    ev.synchronize()
    ev.wait(make(stream))
    stream.synchronize()


@pytest.mark.parametrize("bad", [1, 2, True, 1.5, "s", 1 << 70, object()])
def test_stream_arguments_rejected(stream, bad):
    ev = cuda.event()
    with pytest.raises(TypeError, match="Expected a Stream object or 0"):
        ev.record(bad)


def test_bad_cuda_stream_protocol(stream):
    class Bad:
        def __cuda_stream__(self):
            return 5

    with pytest.raises(TypeError, match="must return"):
        cuda.event().record(Bad())


# ------------------------------------------------------------------
# The GIL: blocking calls release it
# ------------------------------------------------------------------

_DEADLOCK_SCRIPT = textwrap.dedent("""
    import sys, threading
    import cudamem as cuda

    what = sys.argv[1]
    s1 = cuda.stream()
    s2 = cuda.stream()
    done = cuda.event(timing=False)
    go = threading.Event()
    ran = []

    def gate(stream, status, arg):
        # Waits with the GIL released, but needs the GIL to return.
        go.wait()

    def needs_gil(stream, status, arg):
        ran.append(threading.get_ident())

    s1.add_callback(gate)
    s1.add_callback(needs_gil)
    done.record(s1)
    s2.wait_event(done)

    # Open the gate only once this thread is entering the blocking call:
    # from then on the callbacks can finish only if that call releases the
    # GIL while it waits.
    target = {"stream": s2.synchronize, "event": done.synchronize}[what]

    def prof(frame, event, arg):
        if event == "c_call" and arg == target:
            sys.setprofile(None)
            go.set()

    sys.setprofile(prof)
    target()
    sys.setprofile(None)
    assert ran and ran[0] != threading.get_ident(), ran
    print("ok")
""")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("what", ["stream", "event"])
def test_blocking_call_holding_thread_cannot_deadlock_callback(what):
    """A callback that needs the GIL is queued behind a gate that opens
    only when the main thread (holding the GIL) enters synchronize() on a
    second stream, which waits for the callback.  If synchronize kept the
    GIL this would hang forever, so it runs in a subprocess."""
    r = run_child(_DEADLOCK_SCRIPT, args=(what,), timeout=45, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


@pytest.mark.leaks
@pytest.mark.timeout(60)
def test_exit_with_callbacks_pending():
    """Exiting while host callbacks are still queued neither crashes nor
    hangs: callbacks that arrive once the interpreter exits are skipped."""
    script = textwrap.dedent("""
        import cudamem as cuda
        out = []
        streams = [cuda.stream() for _ in range(4)]
        for s in streams:
            for i in range(200):
                s.add_callback(lambda st, status, a: out.append(a), i)
        print("exiting")
    """)
    r = run_child(script, timeout=45, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "exiting"
    assert "Fatal" not in r.stderr


# ------------------------------------------------------------------
# Default-stream mode
# ------------------------------------------------------------------

_MODE_SCRIPT = textwrap.dedent("""
    import sys
    import cudamem as cuda
    from cudamem import _core
    from helpers.streamutil import Gate

    per_thread = _core._per_thread_default_stream()
    d = cuda.default_stream()
    assert d.handle == 0 and repr(d) == "<Default CUDA stream>"
    s = cuda.stream()              # blocking: waits for the legacy stream
    ev = cuda.event(timing=False)
    with Gate() as gate:
        gate.block(d)
        ev.record(s)
        if per_thread:
            ev.synchronize()       # not held by the per-thread stream
        else:
            assert ev.query() is False   # held by the legacy stream
        gate.open()
        d.synchronize()
    ev.synchronize()
    print("per-thread" if per_thread else "legacy")
""")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("flag, mode", [
    ("0", "legacy"), ("1", "per-thread")])
def test_default_stream_follows_mode(flag, mode):
    """Handle 0 behaves as the legacy or the per-thread default stream as
    CUDAMEM_PER_THREAD_DEFAULT_STREAM says."""
    r = run_child(_MODE_SCRIPT, timeout=90, check=False,
                  env={"CUDAMEM_PER_THREAD_DEFAULT_STREAM": flag})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == mode


def test_external_wrapper_as_stream_argument(stream):
    order = []
    with Gate() as gate:
        gate.block(stream)
        ev = cuda.event(timing=False)
        ev.record(cuda.external_stream(stream.handle))
        assert ev.query() is False    # recorded on the same stream
        stream.add_callback(lambda s, st, a: order.append(a), 1)
        gate.open()
        ev.synchronize()
    stream.synchronize()
    assert order == [1]


# ------------------------------------------------------------------
# Recycling: an idle dropped stream's handle serves a later stream()
# ------------------------------------------------------------------

CU_STREAM_NON_BLOCKING = 1


@pytest.fixture
def kept(ctx):
    """The handles ctx keeps for reuse, as a callable; none at the start
    (Context.reset() destroys them) and none left behind."""
    from cudamem import _core

    ctx.reset()
    assert _core._stream_cache(ctx) == []
    yield lambda: _core._stream_cache(ctx)
    gc.collect()
    ctx.reset()


def test_idle_dropped_stream_is_reused(ctx, kept):
    ctx.deallocations.clear()
    s = cuda.stream()
    h = s.handle
    s.add_callback(lambda st, status, a: None)
    s.synchronize()
    del s
    assert kept() == [h]
    assert len(ctx.deallocations) == 0      # kept, not queued for destroy
    s2 = cuda.stream()
    assert s2.handle == h
    assert kept() == []
    assert repr(s2) == f"<CUDA stream {h}>"
    assert s2.external is False and s2.query() is True


def test_unused_stream_is_reused(ctx, kept):
    h = cuda.stream().handle
    assert kept() == [h]
    assert cuda.stream().handle == h


def test_newest_kept_stream_is_reused_first(ctx, kept):
    a, b, c = cuda.stream(), cuda.stream(), cuda.stream()
    handles = [a.handle, b.handle, c.handle]
    del a
    del b
    del c
    assert kept() == handles
    again = [cuda.stream() for _ in range(3)]
    assert [s.handle for s in again] == handles[::-1]
    assert kept() == []


def test_busy_dropped_stream_is_destroyed_not_reused(ctx, kept):
    """Work pending (here a host function that holds no reference to the
    Stream object): the handle is queued for destroy as before."""
    from cudamem import _core

    ctx.deallocations.clear()
    s = cuda.stream()
    h = s.handle
    gate = _core._raw_gate(h)
    try:
        del s
        assert kept() == []
        assert len(ctx.deallocations) == 1
        s2 = cuda.stream()
        assert s2.handle != h
    finally:
        _core._raw_gate_open(gate)
    ctx.synchronize()
    ctx.deallocations.clear()


def test_stream_dropped_by_its_callback_is_not_reused(ctx, kept):
    """The last reference goes on the driver's callback thread, where no
    driver call is allowed: the handle is queued for destroy, not kept."""
    ctx.deallocations.clear()
    s = cuda.stream()
    h = s.handle
    w = weakref.ref(s)
    go = threading.Event()
    # The callback waits until the test has let go of s: were it to run
    # (and its record go) first, the last reference would be the test's.
    s.add_callback(lambda st, status, a: go.wait(GATE_TIMEOUT))
    del s                   # the callback's record holds the last reference
    go.set()
    ctx.synchronize()
    # The record is let go just after the callback returns, on the
    # callback's thread, which may be a moment after synchronize().
    deadline = time.monotonic() + GATE_TIMEOUT
    while w() is not None and time.monotonic() < deadline:
        time.sleep(0.001)
    assert w() is None
    assert kept() == []
    assert len(ctx.deallocations) == 1
    assert cuda.stream().handle != h
    ctx.deallocations.clear()


def test_no_reuse_across_flags(ctx, kept):
    from cudamem import _core

    nb = _core._stream_with_flags(CU_STREAM_NON_BLOCKING)
    hnb = nb.handle
    del nb
    assert kept() == [hnb]
    s = cuda.stream()                   # blocking: not served by hnb
    hs = s.handle
    assert hs != hnb
    assert kept() == [hnb]
    del s
    assert kept() == [hnb, hs]
    nb = _core._stream_with_flags(CU_STREAM_NON_BLOCKING)
    assert nb.handle == hnb
    assert kept() == [hs]
    assert _core._stream_with_flags(0).handle == hs


@pytest.mark.timeout(30)
@pytest.mark.parametrize("flags, blocking", [
    (0, True), (CU_STREAM_NON_BLOCKING, False)])
def test_recycled_stream_keeps_its_flags(ctx, kept, flags, blocking):
    """A blocking stream still waits for the legacy default stream after
    reuse; a non-blocking one still does not."""
    from cudamem import _core

    h = _core._stream_with_flags(flags).handle
    s = _core._stream_with_flags(flags)
    assert s.handle == h
    legacy = cuda.legacy_default_stream()
    ev = cuda.event(timing=False)
    with Gate() as gate:
        gate.block(legacy)
        ev.record(s)
        if blocking:
            assert ev.query() is False      # held behind the legacy stream
        else:
            ev.synchronize()                # not held
        gate.open()
        legacy.synchronize()
    ev.synchronize()
    assert not gate.timed_out


@pytest.mark.timeout(30)
def test_work_on_recycled_stream(ctx, kept):
    """Copies, callbacks, events and synchronize behave on a reused
    handle as on a new one."""
    import numpy as np

    a = np.arange(256, dtype=np.float64)
    s = cuda.stream()
    h = s.handle
    d = cuda.to_device(a, stream=s)
    out = d.copy_to_host(stream=s)
    s.synchronize()
    assert np.array_equal(out, a)
    del s, d                            # d's bound stream was s
    s = cuda.stream()
    other = cuda.stream()
    assert s.handle == h and other.handle != h
    assert s.query() is True
    order = []
    ev = cuda.event(timing=False)
    with Gate() as gate:
        gate.block(s)
        s.add_callback(lambda st, status, arg: order.append((st, status,
                                                             arg)), 1)
        ev.record(s)
        other.wait_event(ev)
        assert s.query() is False
        assert ev.query() is False
        assert other.query() is False   # waits on the device for ev
        gate.open()
        other.synchronize()
    assert order == [(s, 0, 1)]
    assert ev.query() is True
    s.synchronize()
    d = cuda.to_device(a * 2, stream=s)
    out = d.copy_to_host(stream=s)
    s.synchronize()
    assert np.array_equal(out, a * 2)
    assert not gate.timed_out


def test_kept_streams_are_capped(ctx, kept):
    ctx.deallocations.clear()
    streams = [cuda.stream() for _ in range(20)]
    handles = [s.handle for s in streams]
    while streams:
        streams.pop(0)
    assert kept() == handles[:16]
    assert len(ctx.deallocations) == 4      # the rest queued for destroy
    ctx.deallocations.clear()


def test_cache_size_setting(ctx, kept, monkeypatch):
    """config.CUDA_STREAM_CACHE_SIZE = 0 keeps the old behaviour: every
    dropped stream is queued for destroy."""
    ctx.deallocations.clear()
    monkeypatch.setattr(cuda.config, "CUDA_STREAM_CACHE_SIZE", 0)
    cuda.stream()
    assert kept() == []
    assert len(ctx.deallocations) == 1
    monkeypatch.setattr(cuda.config, "CUDA_STREAM_CACHE_SIZE", 2)
    a, b, c = cuda.stream(), cuda.stream(), cuda.stream()
    del a, b, c
    assert len(kept()) == 2
    assert len(ctx.deallocations) == 2
    ctx.deallocations.clear()
    with pytest.raises(ValueError, match="CUDA_STREAM_CACHE_SIZE"):
        cuda.config.CUDA_STREAM_CACHE_SIZE = 17
    with pytest.raises(ValueError, match="CUDA_STREAM_CACHE_SIZE"):
        cuda.config.CUDA_STREAM_CACHE_SIZE = -1
    assert cuda.config.CUDA_STREAM_CACHE_SIZE == 2


def test_cache_size_from_environment(ctx, kept, monkeypatch):
    import importlib

    from cudamem import config

    monkeypatch.setenv("CUDAMEM_STREAM_CACHE_SIZE", "0")
    try:
        importlib.reload(config)
        assert config.CUDA_STREAM_CACHE_SIZE == 0
        cuda.stream()
        assert kept() == []
    finally:
        monkeypatch.delenv("CUDAMEM_STREAM_CACHE_SIZE")
        importlib.reload(config)
    assert config.CUDA_STREAM_CACHE_SIZE == 16
    cuda.stream()
    assert len(kept()) == 1
    ctx.deallocations.clear()


def test_dropping_on_a_thread_without_context(ctx, kept):
    """The stream's context is made current around the query and popped
    again: the dropping thread is left as it was."""
    from cudamem import _core

    box = [cuda.stream()]
    h = box[0].handle
    seen = []

    def drop():
        seen.append(_core._current_device_id())
        box.clear()
        seen.append(_core._current_device_id())

    t = threading.Thread(target=drop)
    t.start()
    t.join()
    assert seen == [None, None]
    assert kept() == [h]


@pytest.mark.timeout(60)
def test_threads_never_share_a_handle(ctx, kept):
    live = set()
    lock = threading.Lock()
    errors = []

    def work():
        try:
            for _ in range(100):
                s = cuda.stream()
                with lock:
                    if s.handle in live:
                        errors.append(s.handle)
                    live.add(s.handle)
                ev = cuda.event(timing=False)
                ev.record(s)
                s.synchronize()
                assert ev.query() is True
                with lock:
                    live.discard(s.handle)
                del s
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(kept()) <= 16


def test_context_reset_destroys_kept_streams(ctx, kept, simulator):
    h = cuda.stream().handle
    assert kept() == [h]
    ctx.reset()
    assert kept() == []
    if simulator:       # on a GPU a destroyed handle must not be touched
        from cudamem import _core
        assert not _core._sim_stream_live(h)


_TEARDOWN_SCRIPT = textwrap.dedent("""
    import sys
    import cudamem as cuda
    from cudamem import _core

    how = sys.argv[1]
    with cuda.gpus[0]:                   # nothing is current afterwards
        ctx = cuda.current_context()
        live = cuda.stream()             # still referenced at the end
        s = cuda.stream()
        h = s.handle
        del s
        assert _core._stream_cache(ctx) == [h], _core._stream_cache(ctx)
    assert _core._current_device_id() is None
    if how == "close":
        cuda.close()
    elif how == "device.reset":
        ctx.device.reset()
    else:
        _core._callbacks_atexit()        # what atexit runs first
    assert _core._stream_cache(ctx) == []
    if how == "exit":
        # The context lives on, its kept stream is destroyed, and streams
        # dropped from now on are not kept.
        # (A destroyed handle must not reach the driver: only the
        # simulator can say whether it was destroyed.)
        if _core._backend() == "simulator":
            assert not _core._sim_stream_live(h), "kept stream not destroyed"
        cuda.stream()
        assert _core._stream_cache(ctx) == []
    else:
        new = cuda.current_context()
        assert new is not ctx and _core._stream_cache(new) == []
        cuda.stream()
        assert len(_core._stream_cache(new)) == 1
    print("ok")
""")


@pytest.mark.sim
@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["close", "device.reset", "exit"])
def test_kept_streams_destroyed_with_their_context(how):
    r = run_child(_TEARDOWN_SCRIPT, args=(how,), timeout=90, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"
    assert r.stderr == ""


@pytest.mark.leaks
@pytest.mark.timeout(60)
def test_exit_with_kept_streams():
    script = textwrap.dedent("""
        import cudamem as cuda
        for _ in range(3):
            cuda.stream()
        keep = [cuda.stream() for _ in range(3)]
        print("exiting")
    """)
    r = run_child(script, timeout=45, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "exiting"
    assert r.stderr == ""


@pytest.mark.multi_gpu
def test_kept_streams_are_per_context(ctx):
    from cudamem import _core

    dev0 = _core._current_device_id()
    other = 1 if dev0 == 0 else 0
    c0 = cuda.current_context()
    with cuda.gpus[other]:
        c1 = cuda.current_context()
        c1.reset()
        s1 = cuda.stream()
        h1 = s1.handle
    c0.reset()
    del s1                          # dropped with the other device current
    assert _core._current_device_id() == dev0
    assert _core._stream_cache(c1) == [h1]
    assert _core._stream_cache(c0) == []
    s0 = cuda.stream()
    assert s0.handle != h1
    del s0
    with cuda.gpus[other]:
        s1 = cuda.stream()
        assert s1.handle == h1
        s1.synchronize()
        del s1
    assert len(_core._stream_cache(c0)) == 1
    assert _core._stream_cache(c1) == [h1]
    cuda.gpus[other].reset()            # spares device dev0's kept stream
    assert _core._stream_cache(c1) == []
    assert len(_core._stream_cache(c0)) == 1
    c0.reset()


@pytest.mark.gpu
def test_copies_on_two_streams_overlap(ctx):
    """A host-to-device copy on one stream and a device-to-host copy on
    another are in flight at the same time (the two copy engines): the
    download starts before the upload ends.  Read from the GPU's own event
    clock, not from host timing."""
    n = 256 << 20
    up = cuda.pinned_array(n, np.uint8)
    down = cuda.pinned_array(n, np.uint8)
    up[:] = 7
    d_up = cuda.device_array(n, np.uint8)
    d_down = cuda.to_device(np.full(n, 9, np.uint8))
    s1, s2 = cuda.stream(), cuda.stream()
    start, up_done, down_start = cuda.event(), cuda.event(), cuda.event()
    start.record(s1)
    s2.wait_event(start)
    d_up.copy_to_device(up, stream=s1)
    up_done.record(s1)
    down_start.record(s2)
    d_down.copy_to_host(down, stream=s2)
    s1.synchronize()
    s2.synchronize()
    assert down[0] == down[-1] == 9
    assert d_up[n - 1] == 7
    up_ms = cuda.event_elapsed_time(start, up_done)
    down_after_ms = cuda.event_elapsed_time(start, down_start)
    assert down_after_ms < up_ms, (down_after_ms, up_ms)
