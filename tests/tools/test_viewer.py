# SPDX-License-Identifier: MIT
"""The memory viewer (``python -m cudamem memviz``) in a real browser,
and the benchmark's plot (``python -m cudamem bench --plot``) read back
pixel by pixel: what a person sees, not only that a file was written.

The viewer's page is opened in headless Chromium (tests/helpers/
browser.py drives it over the DevTools protocol's pipe): it loads with no
console error or exception, its timeline and pool map are drawn (the
elements have a size and the screenshot has their colours where they
stand), pointing at a block or at the out-of-memory mark shows its size
and stack and a click keeps them in a panel, and a record of 100 000
events still paints at once and answers the mouse.  The screenshots are
kept under artifacts/ (git-ignored) and their paths printed.  Without a
browser (``apt-get install chromium``; .ci/run installs it) the browser
tests skip, saying so.
"""

import json
import os
import subprocess
import sys
import time

import pytest

from cudamem import _memviz
from helpers import ROOT, run_py
from helpers.browser import Browser, find_chromium, read_png

ARTIFACTS = ROOT / "artifacts"

# A recorded history as a program makes it: device arrays of 1-63 KiB on
# the default stream and three others, some dropped as it goes, pinned
# and managed memory, every event with its stack, and at the end an
# allocation the device cannot hold, whose error writes the snapshot.
HISTORY = """
import json, sys
import numpy as np
import cudamem

n_alloc, live_max = {n_alloc}, {live_max}
cudamem.memory_history(True, stacks={stacks}, max_entries=4 * n_alloc)
streams = [0] + [cudamem.stream() for _ in range(3)]
rng = np.random.default_rng(7)
held = []


def make(i):
    size = int(rng.integers(1, 64)) << 10
    return cudamem.device_array(size, np.uint8, stream=streams[i % 4])


for i in range(n_alloc):
    held.append(make(i))
    if len(held) > live_max:
        for _ in range(live_max // 2):
            held.pop(int(rng.integers(0, len(held))))
pinned = cudamem.pinned_array(1 << 20, np.uint8)
managed = cudamem.managed_array(1 << 16, np.uint8)
for s in streams[1:]:
    s.synchronize()
try:
    cudamem.device_array(1 << 50, np.uint8)
except cudamem.CudaOutOfMemoryError as e:
    e.dump({path!r})
print(json.dumps([getattr(s.handle, "value", s.handle)
                  for s in streams[1:]]))
"""


def _record(path, n_alloc, live_max, stacks=True, **env):
    """Run HISTORY in a child on the pool manager; the streams' handles."""
    rc, out = run_py(HISTORY.format(n_alloc=n_alloc, live_max=live_max,
                                    stacks=stacks, path=str(path)),
                     timeout=600, CUDAMEM_MEMORY_MANAGER="pool", **env)
    assert rc == 0, out
    return json.loads(out.strip().splitlines()[-1])


def _make_page(snap_path, out_path):
    t0 = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", "cudamem", "memviz", str(snap_path), "-o",
         str(out_path)], capture_output=True, text=True, timeout=600,
        env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stdout + p.stderr
    return time.perf_counter() - t0


def _say(capsys, text):
    """A line in the test log even when pytest captures output."""
    with capsys.disabled():
        print("\n" + text)


def _save(capsys, name, png):
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    path.write_bytes(png)
    _say(capsys, "screenshot: %s" % path)
    return path


def _near(px, color, tol=40):
    return all(abs(a - b) <= tol for a, b in zip(px, color, strict=True))


def _hex(color):
    color = color.lstrip("#")
    if len(color) == 3:
        color = "".join(c * 2 for c in color)
    return tuple(int(color[i:i + 2], 16) for i in (0, 2, 4))


def _count(rows, box, color, tol=40):
    """Pixels of roughly color inside box (x0, y0, x1, y1)."""
    x0, y0, x1, y1 = (int(round(v)) for v in box)
    n = 0
    for row in rows[max(y0, 0):min(y1, len(rows))]:
        for px in row[max(x0, 0):min(x1, len(row))]:
            if _near(px, color, tol):
                n += 1
    return n


# ---------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def browser():
    path = find_chromium()
    if path is None:
        pytest.skip("no Chromium or Chrome to open the page in "
                    "(apt-get install chromium; .ci/run installs it "
                    "where it can)")
    with Browser(path) as b:
        yield b


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A history of some thousands of events on four streams, ending in
    an out-of-memory error; (snapshot, page path, stream handles)."""
    d = tmp_path_factory.mktemp("viewer")
    snap_path = d / "oom.json"
    streams = _record(snap_path, n_alloc=2500, live_max=240)
    page = d / "memory.html"
    _make_page(snap_path, page)
    snap = _memviz.load(snap_path)
    assert len(snap["history"]["entries"]) >= 4000
    return snap, page, streams


def _open(browser, page, width=1280, height=900):
    tab = browser.page(width, height)
    seconds = tab.navigate(page.as_uri())
    return tab, seconds


def _box(tab, selector, scroll=False):
    """The element's box in page coordinates (x0, y0, x1, y1); with
    scroll, brought to the middle of the window first and given in
    window coordinates."""
    return tab.evaluate("""(function(){
        var el = document.querySelector(%s);
        if (!el) return null;
        if (%s) el.scrollIntoView({block: 'center', inline: 'center'});
        var r = el.getBoundingClientRect();
        var dx = %s ? 0 : scrollX, dy = %s ? 0 : scrollY;
        return [r.left + dx, r.top + dy, r.right + dx, r.bottom + dy];
    })()""" % (json.dumps(selector), "true" if scroll else "false",
               "true" if scroll else "false", "true" if scroll else "false"))


def _drawn_blocks(tab):
    """The pool map's block rectangles: (x, y, width, height, blocks in
    it: more than one for a cluster of blocks too small to draw alone)."""
    return tab.evaluate("""Array.from(document.querySelectorAll(
        'svg.segments rect.block')).map(function(r){var b = r.getBBox();
        return [b.x, b.y, b.width, b.height,
                parseInt(r.getAttribute('data-n') || '1')];})""")


def _no_overlap(rects):
    """No block rectangle covers part of the next one in its row (the
    mouse would find the wrong block)."""
    rows = {}
    for x, y, w, _, _ in rects:
        rows.setdefault(y, []).append((x, w))
    for row in rows.values():
        row.sort()
        for (x, w), (nx, _) in zip(row, row[1:], strict=False):
            assert x + w <= nx + 0.05, (x, w, nx)


# ---------------------------------------------------------------------------
# the viewer


def test_page_loads_and_draws(browser, recorded, capsys):
    snap, page, streams = recorded
    tab, seconds = _open(browser, page)
    assert tab.problems() == []
    assert tab.evaluate("document.title") == "cudamem memory snapshot"
    # One line per series, each spread over the timeline.
    # Streams by name ("stream 1", ...), their handles in the tooltips.
    sn = _memviz.stream_names(snap)
    names = ["device"] + ["device " + sn[h] for h in streams] + [
        "managed", "pinned", "total"]
    drawn = tab.evaluate("""Array.from(document.querySelectorAll(
        'path.series')).map(function(p){var b = p.getBBox();
        return [p.dataset.series, b.width, b.height,
                p.getAttribute('stroke')];})""")
    assert sorted(d[0] for d in drawn) == sorted(names)
    svg = _box(tab, "#timeline")
    plot_w = svg[2] - svg[0]
    for name, w, h, _ in drawn:
        assert w > 0.8 * (plot_w - 100), (name, w)
        assert h > 0 or name == "managed", (name, h)
    # Every label of the timeline lies inside its picture (the last
    # time label once ran past the right edge and was cut).
    outside = tab.evaluate("""(function(){
        var s = document.getElementById('timeline').getBoundingClientRect();
        return Array.from(document.querySelectorAll('#timeline text'))
            .filter(function(t){var r = t.getBoundingClientRect();
                return r.left < s.left - 0.5 || r.right > s.right + 0.5;})
            .map(function(t){return t.textContent;});})()""")
    assert outside == []
    # A legend entry keeps its colour swatch beside its name.
    heights = tab.evaluate("""Array.from(document.querySelectorAll(
        '.legend > span')).map(function(s){
        return s.getBoundingClientRect().height;})""")
    assert heights and max(heights) < 2 * min(heights)
    # The pool map: every block of the snapshot, each with a size.
    blocks = sum(len(s["blocks"]) for d in snap["devices"]
                 for s in d["segments"])
    rects = _drawn_blocks(tab)
    assert sum(n for *_, n in rects) == blocks > 100
    assert all(w >= 1 and h > 0 for _, _, w, h, _ in rects)
    _no_overlap(rects)
    assert tab.evaluate("document.querySelectorAll('rect.oom').length") == 1
    # The screenshot shows them: each series' colour on the timeline,
    # the out-of-memory mark, and used and free blocks on the map.
    png = tab.screenshot()
    _save(capsys, "memviz.png", png)
    width, height, rows = read_png(png)
    assert width >= 900 and height > 1000
    for name, _, _, stroke in drawn:
        if name == "managed":        # 64 KiB: a line along the axis
            continue
        assert _count(rows, svg, _hex(stroke), 30) > 30, name
    oom = _box(tab, "rect.oom")
    assert _count(rows, oom, (0xdd, 0, 0), 30) > 100           # OOM mark
    segs = _box(tab, "svg.segments")
    assert _count(rows, segs, _hex(_memviz.BLOCK_COLORS["used"]),
                  20) > 500                                     # used
    # Red is the OOM mark's alone: no used block is red.
    assert _count(rows, segs, (0xdd, 0, 0), 30) == 0
    # Free blocks drawn (about 2 400 pixels of them here, 1 900 under the
    # sanitizers alone, 406 once in the sanitizer stage of a full run:
    # what is free at the out-of-memory error depends on how far the
    # streams' work had got).
    assert _count(rows, segs, _hex("#2ca02c"), 20) > 100      # free
    blank = _count(rows, svg, (0xfa, 0xfa, 0xfa), 2)
    area = (svg[2] - svg[0]) * (svg[3] - svg[1])
    assert blank < 0.9 * area
    assert tab.problems() == []
    _say(capsys, "viewer: %d events, %d blocks, loaded in %.2f s"
         % (len(snap["history"]["entries"]), blocks, seconds))


def test_pointing_shows_size_and_stack(browser, recorded, capsys):
    snap, page, streams = recorded
    tab, _ = _open(browser, page, width=1000, height=700)
    # A live allocation on a stream of its own, and its block.
    b = next(b for b in snap["live"] if b["kind"] == "device"
             and b.get("stream") == streams[1] and b.get("stack"))
    sel = 'rect.block[data-tip^="block 0x%x:"]' % b["address"]
    box = _box(tab, sel, scroll=True)
    assert box is not None
    x, y = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    tab.hover(x, y)
    tip = tab.evaluate("""(function(){var t = document.getElementById('tip');
        var r = t.getBoundingClientRect();
        return [getComputedStyle(t).display, t.textContent, r.left, r.top,
                r.right, r.bottom, innerWidth, innerHeight];})()""")
    display, text, left, top, right, bottom, vw, vh = tip
    assert display == "block"
    frames = ["%s:%d in %s" % (f["filename"], f["line"], f["function"])
              for f in b["stack"]]
    assert "allocation: %s of device memory" % _memviz._fmt_bytes(
        b["size"]) in text
    assert "%s (handle 0x%x)" % (_memviz.stream_names(snap)[streams[1]],
                                 streams[1]) in text
    assert "allocated at:" in text and frames[0] in text
    # The tooltip stays inside the window.
    assert 0 <= left and right <= vw and 0 <= top and bottom <= vh
    # A click keeps the record, the whole stack, in a panel.
    tab.click(x, y)
    panel = tab.evaluate("""[getComputedStyle(document.getElementById(
        'detail')).display, document.getElementById('detail-text')
        .textContent, document.querySelectorAll('.sel').length]""")
    assert panel[0] == "block" and panel[2] == 1
    assert all(f in panel[1] for f in frames)
    _save(capsys, "memviz-click.png", tab.screenshot(full_page=False))
    cl = _box(tab, "#detail-close")
    tab.click((cl[0] + cl[2]) / 2 - tab.evaluate("scrollX"),
              (cl[1] + cl[3]) / 2 - tab.evaluate("scrollY"))
    assert tab.evaluate("getComputedStyle(document.getElementById("
                        "'detail')).display") == "none"
    # The out-of-memory mark: what was asked for, and where.
    oom = next(e for e in snap["history"]["entries"]
               if e["action"] == "oom")
    box = _box(tab, "rect.oom", scroll=True)
    tab.hover((box[0] + box[2]) / 2, (box[1] + box[3]) / 2)
    text = tab.evaluate("document.getElementById('tip').textContent")
    assert text.startswith("out of memory: %s of device memory"
                           % _memviz._fmt_bytes(1 << 50))
    assert "failed at:" in text
    assert "%s:%d" % (oom["stack"][0]["filename"],
                      oom["stack"][0]["line"]) in text
    # Anywhere on the timeline: the live bytes of every series then.
    box = _box(tab, "#timeline", scroll=True)
    tab.hover(box[0] + 0.55 * (box[2] - box[0]),
              box[1] + 0.5 * (box[3] - box[1]))
    text = tab.evaluate("document.getElementById('tip').textContent")
    lines = text.splitlines()
    assert lines[0].startswith("t = ")
    assert {ln.split(": ")[0] for ln in lines[1:]} == set(
        _memviz.series(snap))
    assert tab.evaluate("getComputedStyle(document.getElementById("
                        "'cursor')).display") != "none"
    # Away from everything, the tooltip goes.
    tab.hover(2, 2)
    assert tab.evaluate("getComputedStyle(document.getElementById("
                        "'tip')).display") == "none"
    assert tab.problems() == []


@pytest.mark.slow
def test_100k_events_stay_responsive(browser, tmp_path, capsys):
    """Over 100 000 events, 14 000 allocations alive at the end: the
    page is made in seconds, paints at once and answers the mouse."""
    snap_path = tmp_path / "big.json"
    _record(snap_path, n_alloc=62_000, live_max=24_000)
    snap = _memviz.load(snap_path)
    events = len(snap["history"]["entries"])
    assert events >= 100_000
    page = tmp_path / "big.html"
    made = _make_page(snap_path, page)
    tab, loaded = _open(browser, page)
    # The first contentful paint's time, once the browser has recorded it
    # (a small page can be asked before the entry exists).
    fcp = tab.evaluate("""new Promise(function(done){
        new PerformanceObserver(function(list, obs){
            list.getEntries().forEach(function(e){
                if (e.name === 'first-contentful-paint') {
                    obs.disconnect(); done(e.startTime);}});
        }).observe({type: 'paint', buffered: true});})""") / 1000
    box = _box(tab, "rect.block.used[data-alloc]", scroll=True)
    t0 = time.perf_counter()
    tab.hover((box[0] + box[2]) / 2, (box[1] + box[3]) / 2)
    text = tab.evaluate("document.getElementById('tip').textContent")
    answered = time.perf_counter() - t0
    assert "allocated at:" in text
    _save(capsys, "memviz-100k.png", tab.screenshot(full_page=False))
    assert tab.problems() == []
    _say(capsys, "viewer, %d events, %d live blocks, page of %.1f MB: "
         "made in %.2f s, first contentful paint %.3f s, loaded in "
         "%.2f s, tooltip in %.3f s" % (
             events, len(snap["live"]), page.stat().st_size / 1e6, made,
             fcp, loaded, answered))
    # Generous bounds for a loaded two-core CI machine; the figures
    # printed above are what was measured.
    assert fcp < 5.0
    assert loaded < 30.0
    assert answered < 2.0


ARENA = """
import numpy as np, cudamem
cudamem.memory_history(True)
keep = [cudamem.device_array(n, np.uint8)
        for n in (300, 5000, 3 << 20, 7 << 20, 12 << 20, 2 << 20)]
del keep[2], keep[3]
cudamem.dump_snapshot({path!r})
"""


def test_arenas_of_virtual_memory_drawn_to_their_mapped_span(
        browser, tmp_path, capsys):
    # The pool on virtual memory: each arena reserves as much as the
    # device, so it is drawn up to its last mapped page or live block,
    # with the mapped pages as a strip under the blocks.
    snap_path = tmp_path / "arenas.json"
    rc, out = run_py(ARENA.format(path=str(snap_path)), timeout=120,
                     CUDAMEM_MEMORY_MANAGER="pool", CUDAMEM_POOL_VMM="1",
                     CUDAMEM_POOL_RELEASE_INTERVAL="3600")
    assert rc == 0, out
    snap = _memviz.load(snap_path)
    segs = snap["devices"][0]["segments"]
    assert len(segs) == 2 and all("mapped" in s for s in segs)
    page = tmp_path / "arenas.html"
    _make_page(snap_path, page)
    tab, _ = _open(browser, page, width=1000, height=700)
    # Every block that starts inside a drawn span is drawn, with a width.
    drawn = sum(1 for s in segs for a, _, _ in s["blocks"]
                if a < s["base"] + _memviz._span(s))
    rects = _drawn_blocks(tab)
    sizes = [(x, w) for x, _, w, _, _ in rects]
    assert sum(n for *_, n in rects) == drawn
    assert all(w >= 1 for _, w in sizes)
    _no_overlap(rects)
    # Nothing runs past the picture: the free rest of the reservation is
    # cut at the span.
    svg_w = tab.evaluate("document.querySelector('svg.segments')"
                         ".width.baseVal.value")
    assert max(x + w for x, w in sizes) <= svg_w
    runs = tab.evaluate("document.querySelectorAll("
                        "'svg.segments rect.mapped').length")
    assert runs == sum(len(s["mapped"]) for s in segs) >= 2
    labels = tab.evaluate("""Array.from(document.querySelectorAll(
        'svg.segments text')).map(function(t){
        return t.getAttribute('data-tip');})""")
    assert all("mapped" in t and "largest free mapped extent" in t
               for t in labels)
    box = _box(tab, "svg.segments")
    png = tab.screenshot()
    _save(capsys, "memviz-arenas.png", png)
    _, _, rows = read_png(png)
    assert _count(rows, box, _hex(_memviz.MAPPED_COLOR), 12) > 100
    assert _count(rows, box, _hex(_memviz.BLOCK_COLORS["used"]), 20) > 500
    assert tab.problems() == []


def test_small_blocks_of_an_arena_each_found_by_the_mouse(
        browser, tmp_path, capsys):
    # The pool on virtual memory puts thousands of small blocks in one
    # arena, a row of the map: blocks narrower than a pixel are drawn
    # together (a cluster, with its block count and its largest used
    # block's record), and no rectangle covers another, so the mouse at
    # any rectangle's middle finds that rectangle.  (Drawn one by one at
    # a pixel each, they overlapped and the tooltip of a used block was a
    # free neighbour's.)
    snap_path = tmp_path / "small.json"
    _record(snap_path, n_alloc=6000, live_max=2400, stacks=False,
            CUDAMEM_POOL_VMM="1")
    snap = _memviz.load(snap_path)
    segs = snap["devices"][0]["segments"]
    assert any("mapped" in s for s in segs)
    blocks = sum(1 for s in segs for a, _, _ in s["blocks"]
                 if a < s["base"] + _memviz._span(s))
    page = tmp_path / "small.html"
    _make_page(snap_path, page)
    tab, _ = _open(browser, page, width=1000, height=700)
    rects = _drawn_blocks(tab)
    assert sum(n for *_, n in rects) == blocks
    assert any(n > 1 for *_, n in rects)
    _no_overlap(rects)
    missed = tab.evaluate("""(function(){
        var svg = document.querySelector('svg.segments');
        svg.scrollIntoView({block: 'start'});
        var out = [], seen = 0;
        svg.querySelectorAll('rect.block').forEach(function(r){
            var b = r.getBoundingClientRect();
            var x = (b.left + b.right) / 2, y = (b.top + b.bottom) / 2;
            if (y < 0 || y > innerHeight || x < 0 || x > innerWidth) return;
            seen++;
            if (document.elementFromPoint(x, y) !== r)
                out.push(r.getAttribute('data-tip'));});
        return [seen, out];})()""")
    seen, wrong = missed
    assert seen > 100 and wrong == []
    box = _box(tab, "rect.block.used[data-alloc]", scroll=True)
    tab.hover((box[0] + box[2]) / 2, (box[1] + box[3]) / 2)
    text = tab.evaluate("document.getElementById('tip').textContent")
    assert "allocation:" in text
    _save(capsys, "memviz-small-blocks.png", tab.screenshot())
    assert tab.problems() == []
