# SPDX-License-Identifier: MIT
"""The memory history (memory_history), the snapshot (memory_snapshot,
dump_snapshot, err.dump) and the memviz viewer."""

import html.parser
import json
import re
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cudamem
import helpers
from cudamem import _core, _memviz


@pytest.fixture
def history(ctx):
    """History on for the test, off (and emptied) after."""
    cudamem.memory_history(True, max_entries=10000)
    yield
    cudamem.memory_history(True, max_entries=1)
    cudamem.memory_history(False)


def _mine(entries, addr):
    return [e for e in entries if e["address"] == addr]


def _entries():
    return cudamem.memory_snapshot()["history"]["entries"]


def test_off_records_nothing(ctx):
    cudamem.memory_history(True, max_entries=16)
    cudamem.memory_history(False)
    before = _core._history_state()["recorded"]
    a = cudamem.device_array(100)
    del a
    h = cudamem.pinned_array(10)
    del h
    st = _core._history_state()
    assert st["enabled"] is False
    assert st["recorded"] == before


def test_device_alloc_and_free(history):
    a = cudamem.device_array(100, np.float32)
    addr = a.device_ctypes_pointer.value
    del a
    ev = _mine(_entries(), addr)
    assert [e["action"] for e in ev] == ["alloc", "free"]
    for e in ev:
        assert e["kind"] == "device"
        assert e["size"] == 400
        assert e["device"] == cudamem.get_current_device().id
        assert e["manager"] == cudamem.memory_stats()["manager"]
        assert e["stack"] is None
    assert ev[0]["time_ns"] <= ev[1]["time_ns"]
    assert ev[0]["seq"] < ev[1]["seq"]


@pytest.mark.parametrize("make,kind", [
    (lambda: cudamem.pinned_array(1000, np.uint8), "pinned"),
    (lambda: cudamem.mapped_array(1000, np.uint8), "mapped"),
    (lambda: cudamem.managed_array(1000, np.uint8), "managed"),
])
def test_host_kinds(history, make, kind):
    a = make()
    addr = a.ctypes.data
    del a
    ev = _mine(_entries(), addr)
    assert [(e["action"], e["kind"], e["size"]) for e in ev] == [
        ("alloc", kind, 1000), ("free", kind, 1000)]


def test_stream_is_recorded(history):
    s = cudamem.stream()
    a = cudamem.device_array(64, stream=s)
    addr = a.device_ctypes_pointer.value
    manager = cudamem.memory_stats()["manager"]
    del a
    s.synchronize()
    ev = _mine(_entries(), addr)
    assert len(ev) == 2
    if manager in ("pool", "async"):
        assert ev[0]["stream"] == getattr(s.handle, "value", s.handle)
    else:
        assert ev[0]["stream"] == 0


def test_ring_overflow(ctx):
    cudamem.memory_history(True, max_entries=8)
    try:
        for _ in range(10):
            a = cudamem.device_array(16)
            del a
        h = cudamem.memory_snapshot()["history"]
    finally:
        cudamem.memory_history(False)
    assert h["recorded"] == 20
    assert h["dropped"] == 12
    assert h["max_entries"] == 8
    seqs = [e["seq"] for e in h["entries"]]
    assert seqs == list(range(12, 20))
    assert [e["action"] for e in h["entries"]] == ["alloc", "free"] * 4


def test_enable_starts_afresh_and_disable_keeps(ctx):
    cudamem.memory_history(True, max_entries=100)
    a = cudamem.device_array(16)
    cudamem.memory_history(False)
    del a
    h = cudamem.memory_snapshot()["history"]
    assert h["enabled"] is False
    assert [e["action"] for e in h["entries"]] == ["alloc"]
    cudamem.memory_history(True, max_entries=100)
    assert cudamem.memory_snapshot()["history"]["entries"] == []
    cudamem.memory_history(False)


def _allocate_here():
    return cudamem.device_array(10)


def test_stacks(ctx):
    cudamem.memory_history(True, stacks=True, max_entries=100)
    try:
        a = _allocate_here()
        addr = a.device_ctypes_pointer.value
        snap = cudamem.memory_snapshot()
        del a
        ev = _mine(_entries(), addr)
    finally:
        cudamem.memory_history(False)
    alloc, free = ev
    assert alloc["stack"][0]["function"] == "_allocate_here"
    assert alloc["stack"][0]["filename"] == __file__
    assert alloc["stack"][1]["function"] == "test_stacks"
    assert free["stack"][0]["function"] == "test_stacks"
    live = [b for b in snap["live"] if b["address"] == addr]
    assert live and live[0]["stack"][0]["function"] == "_allocate_here"
    assert live[0]["time"] is not None


def test_bad_arguments(ctx):
    with pytest.raises(ValueError, match="max_entries"):
        cudamem.memory_history(True, max_entries=0)
    with pytest.raises(TypeError, match="max_entries must be an int"):
        cudamem.memory_history(True, max_entries="many")
    with pytest.raises(TypeError, match="Context"):
        _core._pool_segments(1)


CONSISTENCY = """
import numpy as np, cudamem, json
cudamem.memory_history(True, max_entries=100000)
s = cudamem.stream()
keep = []
for i in range(60):
    keep.append(cudamem.device_array(1000 + 37 * i, np.uint8,
                                     stream=s if i % 2 else 0))
    if i % 3 == 0:
        keep.pop(0)
big = cudamem.device_array(3 << 20, np.uint8)
m = cudamem.managed_array(5000, np.uint8)
p = cudamem.pinned_array(7000, np.uint8)
freed = cudamem.device_array(4096)
freed.gpu_data.free()
s.synchronize()
snap = cudamem.memory_snapshot()
print(json.dumps(snap))
"""


@pytest.mark.ahead
@pytest.mark.parametrize("manager", ["default", "pool", "async"])
def test_snapshot_matches_memory_stats(manager):
    rc, out = helpers.run_py(CONSISTENCY, timeout=300,
                             CUDAMEM_MEMORY_MANAGER=manager)
    assert rc == 0, out
    snap = json.loads(out.strip().splitlines()[-1])
    dev = snap["devices"][0]
    st = dev["stats"]
    assert dev["manager"] == manager
    counted = [b for b in snap["live"]
               if b["kind"] in ("device", "managed")]
    assert sum(b["size"] for b in counted) == st["allocated_bytes"]
    assert len(counted) == st["allocation_count"]
    # Sorted largest first, and each block known to the history.
    sizes = [b["size"] for b in snap["live"]]
    assert sizes == sorted(sizes, reverse=True)
    assert all(b["time"] is not None for b in snap["live"])
    segs = dev["segments"]
    if manager != "pool":
        assert segs == []
        return
    if all("mapped" in g for g in segs):
        # Arenas of virtual memory (CUDAMEM_POOL_VMM=1): what counts is
        # the memory mapped, and free is what of it no block uses.
        mapped = sum(hi - lo for g in segs for lo, hi in g["mapped"])
        assert mapped == st["pool_reserved_bytes"]
        busy = sum(sz for g in segs for _, sz, state in g["blocks"]
                   if state != "free")
        assert st["pool_free_bytes"] == max(mapped - busy, 0)
    else:
        assert sum(g["size"] for g in segs) == st["pool_reserved_bytes"]
        free = sum(sz for g in segs for _, sz, state in g["blocks"]
                   if state == "free")
        assert free == st["pool_free_bytes"]
    used = [(a, sz) for g in segs for a, sz, state in g["blocks"]
            if state == "used"]
    for b in snap["live"]:
        if b["kind"] == "device":
            assert any(a <= b["address"] and b["address"] + b["size"]
                       <= a + sz for a, sz in used), b
    for g in segs:
        # Blocks tile their segment.
        pos = g["base"]
        for a, sz, _ in g["blocks"]:
            assert a == pos
            pos += sz
        assert pos == g["base"] + g["size"]


@pytest.mark.ahead
@pytest.mark.slow
def test_concurrent_allocations_and_snapshots():
    rc, out = helpers.run_py("""
        import threading, numpy as np, cudamem
        cudamem.memory_history(True, stacks=True, max_entries=5000)
        cudamem.current_context()
        stop = threading.Event()
        errors = []
        def work(i):
            try:
                keep = []
                for j in range(300):
                    keep.append(cudamem.device_array(100 + j, np.uint8))
                    if j % 5 == 0:
                        keep.append(cudamem.pinned_array(4096, np.uint8))
                    if len(keep) > 6:
                        keep.pop(0)
            except BaseException as e:
                errors.append(e)
        def snap():
            n = 0
            while not stop.is_set():
                s = cudamem.memory_snapshot()
                assert s["history"]["entries"] is not None
                n += 1
            print("snapshots", n)
        ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        t = threading.Thread(target=snap)
        t.start()
        for x in ts: x.start()
        for x in ts: x.join()
        stop.set(); t.join()
        assert not errors, errors
        s = cudamem.memory_snapshot()
        st = s["devices"][0]["stats"]
        dev = [b for b in s["live"] if b["kind"] in ("device", "managed")]
        assert sum(b["size"] for b in dev) == st["allocated_bytes"]
        h = s["history"]
        assert h["recorded"] >= 8 * 300 * 2
        seqs = [e["seq"] for e in h["entries"]]
        assert seqs == list(range(h["recorded"] - len(seqs), h["recorded"]))
        print("ok")
        """, timeout=300, CUDAMEM_MEMORY_MANAGER="pool")
    assert rc == 0, out
    assert "ok" in out


def test_oom_dump(tmp_path, ctx):
    cudamem.memory_history(True, max_entries=1000)
    try:
        keep = cudamem.device_array(1000)
        with pytest.raises(cudamem.CudaOutOfMemoryError) as ei:
            cudamem.device_array(1 << 50, np.uint8)
        path = ei.value.dump(tmp_path / "oom.json")
    finally:
        cudamem.memory_history(False)
    snap = json.loads(Path(path).read_text())
    assert snap["oom"]["requested"] == 1 << 50
    assert "CUDA_ERROR_OUT_OF_MEMORY" in snap["oom"]["message"]
    ooms = [e for e in snap["history"]["entries"] if e["action"] == "oom"]
    assert ooms and ooms[-1]["size"] == 1 << 50
    assert any(b["address"] == keep.device_ctypes_pointer.value
               for b in snap["live"])
    page = _memviz.render_html(snap)
    assert 'id="oom"' in page


# ---------------------------------------------------------------------------
# memviz


class _Page(html.parser.HTMLParser):
    """The parts of the page the tests look at."""

    def __init__(self):
        super().__init__()
        self.series = []
        self.blocks = []
        self.data = None
        self.scripts = []
        self._in = None
        self.external = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for k in ("src", "href"):
            if a.get(k):
                self.external.append(a[k])
        if tag == "path" and a.get("class") == "series":
            self.series.append(a["data-series"])
        if tag == "rect" and (a.get("class") or "").startswith("block"):
            self.blocks.append(a["class"].split()[1])
        if tag == "script":
            self._in = a.get("id") or "js"

    def handle_endtag(self, tag):
        if tag == "script":
            self._in = None

    def handle_data(self, data):
        if self._in == "memviz-data":
            self.data = json.loads(data)
        elif self._in == "js":
            self.scripts.append(data)


MEMVIZ = """
import numpy as np, cudamem
cudamem.memory_history(True, stacks=True)
s = cudamem.stream()
keep = [cudamem.device_array(1 << 16, np.uint8) for _ in range(4)]
on_s = cudamem.device_array(1 << 15, np.uint8, stream=s)
del keep[1]
p = cudamem.pinned_array(1 << 14, np.uint8)
m = cudamem.managed_array(1 << 12, np.uint8)
s.synchronize()
cudamem.dump_snapshot({path!r})
print("stream", getattr(s.handle, "value", s.handle))
"""


def _memviz_run(snap_path, out_path):
    return subprocess.run(
        [sys.executable, "-m", "cudamem", "memviz", str(snap_path), "-o",
         str(out_path)], capture_output=True, text=True, timeout=120,
        env=dict(os.environ, PYTHONPATH=str(helpers.ROOT)))


def test_memviz_html(tmp_path):
    snap_path = tmp_path / "snapshot.json"
    rc, out = helpers.run_py(MEMVIZ.format(path=str(snap_path)),
                             timeout=300, CUDAMEM_MEMORY_MANAGER="pool")
    assert rc == 0, out
    stream = int(out.split("stream")[-1])
    page_path = tmp_path / "memory.html"
    p = _memviz_run(snap_path, page_path)
    assert p.returncode == 0, p.stdout + p.stderr
    page = _Page()
    page.feed(page_path.read_text())
    # The stream by its name, not its handle.
    want = {"device", "device stream 1", "pinned", "managed", "total"}
    assert set(page.series) == want
    assert set(page.data["series"]) == want
    snap = json.loads(snap_path.read_text())
    live = sum(b["size"] for b in snap["live"])
    assert page.data["series"]["total"][-1][1] == live
    # Three 64 KiB arrays remain on the default stream.
    assert page.data["series"]["device"][-1][1] == 3 << 16
    assert max(v for _, v in page.data["series"]["device"]) == 4 << 16
    assert "0x%x" % stream not in " ".join(page.series)
    assert page.data["series"]["device stream 1"][-1][1] \
        == 1 << 15
    assert "used" in page.blocks and "free" in page.blocks
    assert page.external == []           # self-contained
    assert "SIMULATED" in page_path.read_text() or \
        snap["backend"] == "driver"
    node = shutil.which("node")
    if node is not None:
        js = tmp_path / "page.js"
        js.write_text("\n".join(page.scripts))
        r = subprocess.run([node, "--check", str(js)], capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stderr


def test_memviz_empty_history(tmp_path, ctx):
    cudamem.memory_history(True, max_entries=10)
    cudamem.memory_history(False)
    keep = cudamem.device_array(100)
    snap = cudamem.memory_snapshot()
    page = _memviz.render_html(snap)
    assert "No history recorded" in page
    ser = _memviz.series(snap)
    # The live block is there from the start.
    assert ser["device"][0][1] >= keep.nbytes


def test_memviz_bad_input(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"x": 1}')
    p = _memviz_run(bad, tmp_path / "o.html")
    assert p.returncode == 2
    assert "not a cudamem memory snapshot" in p.stderr
    good = tmp_path / "s.json"
    good.write_text(json.dumps({"history": {"entries": []}, "live": []}))
    p = _memviz_run(good, tmp_path / "o.svg")
    assert p.returncode == 2
    assert ".html or .png" in p.stderr


def test_memviz_png(tmp_path):
    pytest.importorskip("matplotlib")
    snap_path = tmp_path / "snapshot.json"
    rc, out = helpers.run_py(MEMVIZ.format(path=str(snap_path)), timeout=300)
    assert rc == 0, out
    png = tmp_path / "memory.png"
    p = _memviz_run(snap_path, png)
    assert p.returncode == 0, p.stdout + p.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _synthetic_snapshot():
    """A snapshot written by hand: device memory on the default stream
    and on two streams (raw handles as a process has them), 700 MiB at
    the peak over 3.7 s, and an out-of-memory error at 3 s."""
    s1, s2 = 0x5581F2A03C40, 0x5581F2A04D10
    mib = 1 << 20
    ev = []

    def add(t, action, stream, addr, size):
        ev.append({"seq": len(ev), "time_ns": int(t * 1e9),
                   "time": 1000.0 + t, "action": action, "kind": "device",
                   "manager": "default", "device": 0, "stream": stream,
                   "address": addr, "size": size, "stack": None})

    add(0.0, "alloc", 0, 0x1000, 100 * mib)
    add(1.0, "alloc", s1, 0x2000, 300 * mib)
    add(2.0, "alloc", s2, 0x3000, 300 * mib)
    add(3.0, "oom", s2, 0, 900 * mib)
    add(3.7, "free", s1, 0x2000, 300 * mib)
    live = [{"kind": "device", "device": 0, "manager": "default",
             "stream": 0, "address": 0x1000, "size": 100 * mib},
            {"kind": "device", "device": 0, "manager": "default",
             "stream": s2, "address": 0x3000, "size": 300 * mib}]
    return {"version": 1, "backend": "simulator", "time": 1003.7,
            "devices": [], "live": live,
            "history": {"enabled": True, "stacks": False, "recorded": 5,
                        "dropped": 0, "max_entries": 100, "entries": ev}}


def test_memviz_names_streams_and_rounds_ticks():
    snap = _synthetic_snapshot()
    names = _memviz.stream_names(snap)
    assert names[0] == "default stream"
    assert names[0x5581F2A03C40] == "stream 1"
    assert names[0x5581F2A04D10] == "stream 2"
    ser = _memviz.series(snap)
    assert set(ser) == {"device", "device stream 1", "device stream 2",
                        "total"}
    page = _memviz.render_html(snap)
    # The raw handle only in tooltips (titles and data-tip).
    assert 'title="stream handle 0x5581f2a03c40"' in page
    assert "stream 2 (handle 0x5581f2a04d10)" in page
    # Round ticks: bytes in steps of 200 MiB up to 800 MiB; the time
    # axis ends with the data (every series spans the timeline), its
    # round seconds within it.
    ticks = re.findall(r'class="ytick"[^>]*>([^<]*)<', page)
    assert ticks == ["0", "200 MiB", "400 MiB", "600 MiB", "800 MiB"]
    ticks = re.findall(r'class="xtick"[^>]*>([^<]*)<', page)
    assert ticks == ["0 s", "1 s", "2 s", "3 s"]
    # Red is the OOM mark's alone.
    assert _memviz.OOM_COLOR not in _memviz.BLOCK_COLORS.values()
    assert _memviz.OOM_COLOR not in _memviz._COLORS
    assert 'stroke="%s"' % _memviz.OOM_COLOR in page


@pytest.mark.parametrize("top, ticks", [
    (3.7, [0, 1, 2, 3, 4]), (0.37, [0, 0.1, 0.2, 0.3, 0.4]),
    (10, [0, 2.5, 5, 7.5, 10]), (1, [0, 0.25, 0.5, 0.75, 1.0]),
])
def test_memviz_nice_ticks(top, ticks):
    got = _memviz._nice_ticks(top)
    assert got == pytest.approx(ticks)


def test_memviz_png_marks_the_oom(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.image as mimage

    snap = _synthetic_snapshot()
    png = tmp_path / "m.png"
    drawn = _memviz.write_png(snap, str(png))
    assert drawn["ooms"] == pytest.approx([3.0])
    img = mimage.imread(png)[:, :, :3]
    red = (np.abs(img - np.array([0xdd, 0, 0]) / 255) < 0.1).all(axis=2)
    # A dashed vertical line: red pixels in one narrow band of columns,
    # over much of the plot's height.
    cols = np.nonzero(red.sum(axis=0) > 40)[0]
    assert len(cols) > 0 and cols.max() - cols.min() < 12, cols
    # Without an error, no red at all.
    snap["history"]["entries"] = [e for e in snap["history"]["entries"]
                                  if e["action"] != "oom"]
    drawn = _memviz.write_png(snap, str(png))
    assert drawn["ooms"] == []
    img = mimage.imread(png)[:, :, :3]
    red = (np.abs(img - np.array([0xdd, 0, 0]) / 255) < 0.1).all(axis=2)
    assert red.sum() == 0
