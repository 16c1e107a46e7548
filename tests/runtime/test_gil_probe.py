# SPDX-License-Identifier: MIT
"""_core._gil_probe: the benchmarks' count of the GIL's releases around
driver calls, of the time run with it released and of the waits to take
it back (benchmarks/ops_threads.py prints it per round trip)."""

import pathlib
import sys
import threading

import numpy as np
import pytest

import cudamem as cuda
from cudamem import _core
from helpers import ROOT
from helpers.streamutil import Gate

KINDS = ("nogil", "drop")
KEYS = {"releases", "released_ns", "wait_ns", "max_wait_ns", "wait_hist"}


@pytest.fixture
def probe():
    _core._gil_probe(False)
    yield _core
    _core._gil_probe(False)


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
    assert st["drop"]["releases"] == 0
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

    def work():
        try:
            s = cuda.stream()
            h = cuda.pinned_array(1024, np.uint8)
            d = cuda.device_array(1024, np.uint8)
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
    import ops_threads

    monkeypatch.setattr(ops_threads, "SAMPLES", 2)
    monkeypatch.setattr(ops_threads, "MS", 20)
    rows = ops_threads.probe_rows(cuda,
                                  ["round trip 1 KiB pinned [2 threads]"])
    assert [r["op"] for r in rows] == ["GIL wait/rt 1K pinned [2 threads]"]
    p = rows[0]["probe"]
    assert "errors" not in rows[0]
    assert p["round_trips"] > 0
    # Three per round trip, and those of the trips cut by the stop.
    assert 3 <= p["releases_per_rt"] < 3.5
    assert p["released_us_per_rt"] > 0 and 0 <= p["wait_share"] < 1
    assert rows[0]["times"]["cudamem"][0] == p["wait_us_per_rt"] / 1e6
    assert "GIL wait/rt 1K pinned [2 threads]" in \
        ops_threads.format_probe(rows)
    assert _core._gil_probe_stats()["on"] is False
    sys.modules.pop("ops_threads", None)
