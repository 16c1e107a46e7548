# SPDX-License-Identifier: MIT
"""_core._gil_probe: the benchmarks' count of the GIL's releases around
driver calls, of the time run with it released and of the waits to take
it back (benchmarks/ops_threads.py prints it per round trip); and the
setting _core._copy_keep_gil ('auto' by default), which keeps the GIL
around asynchronous copies between device arrays and cudamem's
page-locked host memory."""

import contextlib
import pathlib
import threading

import numpy as np
import pytest

import cudamem as cuda
from cudamem import _core
from helpers import ROOT
from helpers.crashutil import run_child
from helpers.isolation import SIMULATOR
from helpers.streamutil import Gate

KINDS = ("nogil", "drop")
KEYS = {"releases", "released_ns", "wait_ns", "max_wait_ns", "wait_hist"}


@pytest.fixture
def probe():
    _core._gil_probe(False)
    old = _core._copy_keep_gil(False)
    yield _core
    _core._gil_probe(False)
    _core._copy_keep_gil(old)


def test_off_by_default_and_counts_nothing_when_off(probe):
    s = cuda.stream()
    probe._gil_probe(True)
    probe._gil_probe(False)
    for _ in range(5):
        s.synchronize()
    st = probe._gil_probe_stats()
    assert st["on"] is False
    assert set(st) == {"on", *KINDS}
    for kind in KINDS:
        assert set(st[kind]) == KEYS
        assert st[kind]["releases"] == 0
        assert st[kind]["wait_hist"] == [0] * 17


def test_one_release_per_synchronize(probe):
    s = cuda.stream()
    s.synchronize()
    probe._gil_probe(True)
    for _ in range(40):
        s.synchronize()
    st = probe._gil_probe_stats()
    probe._gil_probe(False)
    g = st["nogil"]
    assert st["on"] is True
    assert g["releases"] == 40
    assert sum(g["wait_hist"]) == 40
    assert g["released_ns"] > 0
    assert 0 <= g["max_wait_ns"] <= g["wait_ns"]
    # Switching it on again starts from zero.
    probe._gil_probe(True)
    assert probe._gil_probe_stats()["nogil"]["releases"] == 0


def test_threads_round_trip(probe):
    """Three releases per round trip (two copies, a synchronize), from
    every thread; the waits are counted as well."""
    n, trips = 4, 200
    ready = threading.Barrier(n + 1)
    go = threading.Barrier(n + 1)
    errors = []
    # The threads' streams and arrays outlive the count: their release
    # (a stream destroyed, a pinned block given back) is no round trip.
    keep = []

    def work():
        try:
            s = cuda.stream()
            h = cuda.pinned_array(1024, np.uint8)
            d = cuda.device_array(1024, np.uint8)
            keep.append((s, h, d))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        ready.wait()
        go.wait()
        if errors:
            return
        for _ in range(trips):
            d.copy_to_device(h, stream=s)
            d.copy_to_host(h, stream=s)
            s.synchronize()

    ts = [threading.Thread(target=work) for _ in range(n)]
    for t in ts:
        t.start()
    ready.wait()
    probe._gil_probe(True)
    go.wait()
    for t in ts:
        t.join(120)
    st = probe._gil_probe_stats()
    keep.clear()
    assert not errors, errors
    g = st["nogil"]
    assert g["releases"] == 3 * n * trips
    assert sum(g["wait_hist"]) == g["releases"]
    assert g["wait_ns"] >= g["max_wait_ns"] > 0


def test_drop_counted_while_a_callback_is_in_flight(probe):
    """With a Python host callback in flight, a driver call made with the
    GIL held gives it up around the call (cm_gil_drop): counted apart."""
    s1 = cuda.stream()
    s2 = cuda.stream()
    with Gate() as gate:
        gate.block(s1)
        assert gate.entered.wait(20)
        probe._gil_probe(True)
        s2.synchronize()
        st = probe._gil_probe_stats()
        probe._gil_probe(False)
    s1.synchronize()
    assert not gate.timed_out
    assert st["drop"]["releases"] >= 1
    assert sum(st["drop"]["wait_hist"]) == st["drop"]["releases"]


def test_bad_argument(probe):
    class Bad:
        def __bool__(self):
            raise ZeroDivisionError("no truth")

    with pytest.raises(ZeroDivisionError, match="no truth"):
        probe._gil_probe(Bad())
    assert probe._gil_probe_stats()["on"] is False


def test_benchmark_probe_rows(monkeypatch):
    bench = pathlib.Path(ROOT) / "benchmarks"
    monkeypatch.syspath_prepend(str(bench))
    import harness
    import ops_threads

    monkeypatch.setattr(ops_threads, "SAMPLES", 2)
    monkeypatch.setattr(ops_threads, "MS", 20)
    before = _core._copy_keep_gil()
    fake = harness.Measured((1e-5, 9e-6, 2e-5))
    monkeypatch.setitem(ops_threads._driver_seen, (2, 1024, True), fake)
    rows = ops_threads.probe_rows(cuda,
                                  ["round trip 1 KiB pinned [2 threads]"])
    assert [r["op"] for r in rows] == ["GIL wait/rt 1K pinned [2 threads]",
                                       "keep-GIL rt 1K pinned [2 threads]"]
    for row in rows:
        assert "errors" not in row
        p = row["probe"]
        assert p["round_trips"] > 0 and p["k_per_s"] > 0
        assert p["released_us_per_rt"] > 0 and 0 <= p["wait_share"] < 1
    # Three releases per round trip (and those of the trips cut by the
    # stop); one with the setting on.
    assert 3 <= rows[0]["probe"]["releases_per_rt"] < 3.5
    assert 1 <= rows[1]["probe"]["releases_per_rt"] < 1.5
    assert rows[0]["unit"] == "us" and rows[1]["unit"] == "k/s"
    assert rows[0]["times"]["cudamem"][0] == pytest.approx(
        rows[0]["probe"]["wait_us_per_rt"] / 1e6)
    # The keep-GIL row stands beside the C program's figure.
    assert rows[1]["times"]["driver"] == tuple(fake)
    text = ops_threads.format_probe(rows)
    assert "GIL wait/rt 1K pinned [2 threads]" in text
    assert "keep-GIL rt 1K pinned [2 threads]" in text
    assert _core._gil_probe_stats()["on"] is False
    assert _core._copy_keep_gil() == before
    # Pageable rows have no keep-GIL row.
    rows = ops_threads.probe_rows(cuda,
                                  ["round trip 1 KiB pageable [1 thread]"])
    assert [r["op"] for r in rows] == ["GIL wait/rt 1K pageable [1 thread]"]


def test_keep_gil_is_auto_in_a_new_process():
    """A process that never set it runs with 'auto'."""
    p = run_child("from cudamem import _core\n"
                  "print(repr(_core._copy_keep_gil()))\n", timeout=60)
    assert p.stdout.strip() == "'auto'", p.output[-2000:]


def test_keep_gil_switch(probe):
    assert probe._copy_keep_gil() is False
    assert probe._copy_keep_gil(True) is False
    assert probe._copy_keep_gil(None) is True
    assert probe._copy_keep_gil(0) is True
    assert probe._copy_keep_gil() is False
    with pytest.raises(TypeError, match="at most one"):
        probe._copy_keep_gil(True, True)

    class Bad:
        def __bool__(self):
            raise ZeroDivisionError("no truth")

    with pytest.raises(ZeroDivisionError):
        probe._copy_keep_gil(Bad())
    assert probe._copy_keep_gil() is False
    # 'auto' is the one string it takes; the setting reads back as given,
    # and a string that is not a mode changes nothing.
    assert probe._copy_keep_gil("auto") is False
    assert probe._copy_keep_gil() == "auto"
    for bad in ("", "on", "AUTO", "auto "):
        with pytest.raises(ValueError, match="not a mode"):
            probe._copy_keep_gil(bad)
        assert probe._copy_keep_gil() == "auto"
    assert probe._copy_keep_gil(True) == "auto"
    # Other objects are truth values, bytes among them.
    assert probe._copy_keep_gil(b"") is True
    assert probe._copy_keep_gil(False) is False


HOSTS = {
    "pinned": (lambda n: cuda.pinned_array(n, np.uint8), 1),
    "mapped": (lambda n: cuda.mapped_array(n, np.uint8), 1),
    "managed": (lambda n: cuda.managed_array(n, np.uint8), 3),
    "pageable": (lambda n: np.empty(n, np.uint8), 3),
}


@pytest.mark.parametrize("kind", sorted(HOSTS))
def test_keep_gil_round_trip(probe, kind):
    """With the setting on, the two copies of a round trip with
    page-locked host memory keep the GIL (only the synchronize releases
    it); other host memory is copied as before.  The data round trips
    either way, whole arrays and views."""
    make, per_trip = HOSTS[kind]
    s = cuda.stream()
    h = make(4096)
    out = make(4096)
    h[:] = np.arange(4096) % 251
    d = cuda.device_array(4096, np.uint8)
    probe._copy_keep_gil(True)
    probe._gil_probe(True)
    for _ in range(5):
        out[:] = 0
        d.copy_to_device(h, stream=s)
        d.copy_to_host(out, stream=s)
        s.synchronize()
        assert (out == h).all()
    assert probe._gil_probe_stats()["nogil"]["releases"] == 5 * per_trip
    probe._gil_probe(True)
    out[:] = 0
    d[1024:2048].copy_to_device(h[:1024], stream=s)
    d[1024:2048].copy_to_host(out[2048:3072], stream=s)
    s.synchronize()
    assert (out[2048:3072] == h[:1024]).all()
    assert probe._gil_probe_stats()["nogil"]["releases"] == per_trip
    # Synchronous copies still release it.
    probe._gil_probe(True)
    d.copy_to_device(h)
    d.copy_to_host(out)
    assert probe._gil_probe_stats()["nogil"]["releases"] == 2


def _wait_blocked(name, n):
    for _ in range(5000):
        if _core._sim_blocked(name) >= n:
            return
        threading.Event().wait(0.001)
    raise AssertionError("no thread blocked in cu" + name)


@contextlib.contextmanager
def _others_in_driver_calls():
    """Yields a function that puts one more thread into a driver call
    (a synchronize the simulator holds), up to two; all are let go and
    joined on leaving."""
    other_s = cuda.stream()
    ev = cuda.event()
    ev.record(other_s)
    waits = [("StreamSynchronize", other_s.synchronize),
             ("EventSynchronize", ev.synchronize)]
    for name, _ in waits:
        _core._sim_block(name, 1)
    waiters = []

    def one_more():
        name, fn = waits[len(waiters)]
        waiters.append(threading.Thread(target=fn))
        waiters[-1].start()
        _wait_blocked(name, 1)

    try:
        yield one_more
    finally:
        for name, _ in waits:
            _core._sim_unblock(name)
        for t in waiters:
            t.join(30)
    assert not any(t.is_alive() for t in waiters)


def _releases(fn):
    _core._gil_probe(True)
    fn()
    n = _core._gil_probe_stats()["nogil"]["releases"]
    _core._gil_probe(False)
    return n


@pytest.mark.skipif(not SIMULATOR,
                    reason="holds threads inside driver calls with the "
                           "simulator")
def test_keep_gil_auto_follows_the_other_threads(probe):
    """'auto': a copy between a device array and page-locked memory keeps
    the GIL only while two or more other threads are in driver calls with
    it released; with none or one it is released as when off."""
    s = cuda.stream()
    h = cuda.pinned_array(4096, np.uint8)
    h[:] = np.arange(4096) % 253
    d = cuda.device_array(4096, np.uint8)
    probe._copy_keep_gil("auto")

    def a_round():
        d.copy_to_device(h, stream=s)
        d.copy_to_host(h, stream=s)

    assert _releases(a_round) == 2             # no other thread
    with _others_in_driver_calls() as one_more:
        one_more()
        assert _releases(a_round) == 2         # one other: released
        one_more()
        assert _releases(a_round) == 0         # two others: kept
        probe._copy_keep_gil(False)
        assert _releases(a_round) == 2         # off: released regardless
        probe._copy_keep_gil("auto")
    assert _releases(a_round) == 2             # they are back: released
    s.synchronize()
    assert (d.copy_to_host() == np.arange(4096) % 253).all()


@pytest.mark.skipif(not SIMULATOR,
                    reason="holds threads inside driver calls with the "
                           "simulator")
def test_keep_gil_auto_short_pageable_copies_and_done_streams(probe):
    """'auto' under contention also keeps the GIL around a host-to-device
    enqueue of up to 64 KiB from pageable memory and around the
    synchronize of a stream that a copy into pageable memory (which the
    driver returns from once done) left done; a larger enqueue, that copy
    itself, a synchronize with no such copy before it and one of a stream
    with work pending release it.  'on' keeps it only for page-locked
    memory, as before."""
    s = cuda.stream()
    small = np.arange(1 << 16, dtype=np.uint8)           # 64 KiB
    big = np.arange((1 << 16) + 1, dtype=np.uint8)
    d = cuda.device_array(big.size, np.uint8)
    out = np.zeros(big.size, np.uint8)
    probe._copy_keep_gil("auto")

    def small_in():
        d[:small.size].copy_to_device(small, stream=s)

    def big_in():
        d.copy_to_device(big, stream=s)

    def back():
        d.copy_to_host(out, stream=s)

    with _others_in_driver_calls() as one_more:
        one_more()
        assert _releases(small_in) == 1        # one other: released
        assert _releases(s.synchronize) == 1
        one_more()
        assert _releases(small_in) == 0        # two others: kept
        assert _releases(big_in) == 1
        assert _releases(back) == 1
        assert (out == big).all()
        assert _releases(s.synchronize) == 0   # done: kept
        assert _releases(s.synchronize) == 1   # no copy since: released
        back()
        probe._copy_keep_gil(True)
        assert _releases(small_in) == 1        # 'on': page-locked only
        assert _releases(s.synchronize) == 1
        probe._copy_keep_gil("auto")
        # Work pending behind a gate: the synchronize waits for it, with
        # the GIL released (the gate's callback takes it to return).
        pinned = cuda.pinned_array(big.size, np.uint8)
        with Gate() as gate:
            gate.block(s)
            d.copy_to_device(big[::-1].copy(), stream=s)
            d.copy_to_host(pinned, stream=s)
            opener = threading.Timer(0.2, gate.open)
            opener.start()
            s.synchronize()
            assert gate.entered.is_set()
            opener.join()
        assert not gate.timed_out
        assert (pinned == big[::-1]).all()
    assert _releases(small_in) == 1            # they are back: released


@pytest.mark.ahead
@pytest.mark.parametrize("mode", ["on", "auto"])
def test_keep_gil_beside_python_callbacks(mode):
    """Threads making round trips that keep the GIL (always, or 'auto')
    while Python host callbacks are always in flight on other streams:
    the driver's lock, which the simulator models, is never waited for
    with the GIL held."""
    p = run_child(KEEP_CHILD, timeout=120, args=("1.5", mode))
    assert p.stdout.startswith("ok"), p.output[-3000:]


KEEP_CHILD = r"""
import sys
import threading
import time

import numpy as np

import cudamem as cuda
from cudamem import _core

_core._copy_keep_gil(True if sys.argv[2] == "on" else sys.argv[2])
seconds = float(sys.argv[1])
stop = threading.Event()
errors = []
done = [0, 0]


def callbacks():
    s = cuda.stream()
    d = cuda.device_array(1 << 12, dtype=np.uint8)
    h = cuda.pinned_array(1 << 12, dtype=np.uint8)
    while not stop.is_set():
        for i in range(4):
            d.copy_to_host(h, stream=s)
            s.add_callback(lambda st, status, arg: sum(range(200)), i)
        s.synchronize()
        done[0] += 1


def trips(k):
    try:
        s = cuda.stream()
        h = cuda.pinned_array(1024, np.uint8)
        out = cuda.mapped_array(1024, np.uint8)
        d = cuda.device_array(1024, np.uint8)
        while not stop.is_set():
            h[:] = (done[1] + k) % 256
            d.copy_to_device(h, stream=s)
            d.copy_to_host(out, stream=s)
            s.synchronize()
            assert (out == h).all()
            done[1] += 1
    except Exception as exc:  # noqa: BLE001 - reported below
        errors.append(repr(exc))


# The context exists before the clock starts: creating it takes a large
# part of a second on a busy machine.
cuda.current_context()
threads = [threading.Thread(target=callbacks)]
threads += [threading.Thread(target=trips, args=(k,)) for k in range(4)]
for t in threads:
    t.start()
# Run for `seconds`, then on until both sides have made progress (a
# loaded machine can be slow to get there; a hang is the child's
# timeout), but never past a minute.
t0 = time.monotonic()
while time.monotonic() - t0 < 60 and not errors:
    if time.monotonic() - t0 >= seconds and done[0] >= 3 and done[1] >= 30:
        break
    time.sleep(0.02)
stop.set()
for t in threads:
    t.join()
assert not errors, errors
assert done[0] >= 3 and done[1] >= 30, (
    "rounds of callbacks, round trips after %.1f s: %r"
    % (time.monotonic() - t0, done))
print("ok", done)
"""

