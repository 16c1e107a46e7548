# SPDX-License-Identifier: MIT
"""``python -m cudamem``: the default report, ``bench`` and its outputs."""

import io
import json
import os
import subprocess
import sys

import pytest

from cudamem import _bench
from helpers import ROOT



def cli(*args, timeout=300, **env):
    e = dict(os.environ, PYTHONPATH=str(ROOT))
    e.update(env)
    return subprocess.run([sys.executable, "-m", "cudamem", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env=e)


def test_no_arguments_is_the_report():
    p = cli()
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("cudamem ")
    assert "backend: " in p.stdout
    assert "devices: " in p.stdout


def test_unknown_option():
    p = cli("bench", "--frobnicate")
    assert p.returncode == 2
    assert "unrecognized arguments: --frobnicate" in p.stderr


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    p = cli("bench", "--quick", "--json", str(out), "--max-size",
            str(1 << 20))
    assert p.returncode == 0, p.stdout + p.stderr
    return p, json.loads(out.read_text())


def test_quick_json_schema(quick):
    p, res = quick
    for key, typ in (("schema", int), ("cudamem_version", str),
                     ("backend", str), ("simulated", bool), ("quick", bool),
                     ("device", dict), ("libraries", list), ("sizes", list),
                     ("repeats", int), ("bandwidth", list),
                     ("latency", list), ("elapsed_s", float)):
        assert isinstance(res[key], typ), key
    assert res["schema"] == _bench.SCHEMA_VERSION
    assert res["quick"] is True
    assert res["simulated"] == (res["backend"] != "driver")
    assert res["libraries"][:2] == ["cudamem", "driver"]
    assert res["sizes"] == [4096, 65536, 1 << 20]
    assert set(res["device"]) >= {"id", "name", "total_memory"}
    rows = {(r["library"], r["method"], r["direction"], r["size"]): r
            for r in res["bandwidth"]}
    for size in res["sizes"]:
        for method in _bench.METHODS:
            for direction in _bench.DIRECTIONS:
                r = rows[("cudamem", method, direction, size)]
                assert r["gbps"] > 0 and r["seconds"] > 0
                assert r["gbps_p10"] <= r["gbps"] * 1.0001 <= \
                    r["gbps_p90"] * 1.0002
                want = (2 if direction == "bidir" else 1) * size
                assert r["gbps"] == pytest.approx(want / r["seconds"] / 1e9)
                # The bare driver has no staging pipeline.
                assert (("driver", method, direction, size) in rows) == \
                    (method != "pageable-staged")
    ops = {(r["library"], r["op"]): r for r in res["latency"]}
    for lib in ("cudamem", "driver"):
        for op in _bench.LATENCY_OPS:
            assert ops[(lib, op)]["us"] > 0
    pinned = [r["gbps"] for r in res["bandwidth"]
              if r["method"] == "pinned" and r["direction"] == "htod"
              and r["library"] in ("cudamem", "driver")]
    assert res["pcie_limit_gbps"] == max(pinned)


def test_quick_table(quick):
    p, res = quick
    out = p.stdout
    assert "Bandwidth, GB/s" in out
    assert "pageable-staged htod" in out
    assert "Latency, microseconds per call" in out
    assert "pinned_array" in out
    if res["simulated"]:
        assert "(simulated" in out.splitlines()[0]
    assert "figures written to" in out


def _rgb(color):
    color = color.lstrip("#")
    return [int(color[i:i + 2], 16) / 255 for i in (0, 2, 4)]


def test_plot(tmp_path):
    """The PNG is read back: three framed panels with tick labels, and
    in every panel the colour of every library measured, and no other
    library's."""
    try:
        import matplotlib.image as mimage
    except ImportError:
        p = cli("bench", "--quick", "--plot", str(tmp_path / "b.png"))
        assert p.returncode == 2
        assert "pip install matplotlib" in p.stderr
        pytest.skip("matplotlib is not installed")
    import numpy as np

    png = tmp_path / "bench.png"
    figures = tmp_path / "bench.json"
    p = cli("bench", "--quick", "--max-size", str(1 << 16), "--plot",
            str(png), "--json", str(figures))
    assert p.returncode == 0, p.stdout + p.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = mimage.imread(png)[:, :, :3]
    res = json.loads(figures.read_text())
    # Where the panels are: the same figures drawn again here give the
    # same picture, pixel for pixel, and say where they put each panel.
    again = tmp_path / "again.png"
    drawn = _bench.write_plot(res, again)
    assert np.array_equal(img, mimage.imread(again)[:, :, :3])
    assert img.shape[:2] == (drawn["size"][1], drawn["size"][0])
    measured = [lib for lib in res["libraries"]
                if any(r["library"] == lib for r in res["bandwidth"])]
    assert sorted({s["library"] for s in drawn["series"]}) == sorted(
        measured)
    dark = img.mean(axis=2) < 0.5
    assert len(drawn["axes"]) == 3
    shown = {}
    for ax in drawn["axes"]:
        x0, y0, x1, y1 = (int(round(v)) for v in ax["box"])
        # The frame: each edge a dark line (within a pixel of the box).
        for edge in (dark[y0 - 1:y0 + 2, x0 + 2:x1 - 2].any(axis=0),
                     dark[y1 - 2:y1 + 1, x0 + 2:x1 - 2].any(axis=0),
                     dark[y0 + 2:y1 - 2, x0 - 1:x0 + 2].any(axis=1),
                     dark[y0 + 2:y1 - 2, x1 - 2:x1 + 1].any(axis=1)):
            assert edge.mean() > 0.95, ax["title"]
        # The tick labels under it, and its title above.
        assert dark[y1 + 4:y1 + 30, x0:x1].sum() > 100, ax["title"]
        assert dark[max(y0 - 30, 0):y0 - 3, x0:x1].sum() > 50
        inside = img[y0 + 3:y1 - 3, x0 + 3:x1 - 3]
        for lib, color in _bench.LIBRARY_COLORS.items():
            near = (np.abs(inside - _rgb(color)) < 0.12).all(axis=2).sum()
            if lib in measured:
                # Visible in every panel; a library drawn later over the
                # same figures may hide part of a line (77 pixels of
                # cudamem's were left once, under the driver's).
                assert near > 10, (ax["title"], lib, near)
                shown[lib] = shown.get(lib, 0) + near
            else:
                assert near < 5, (ax["title"], lib, near)
    for lib in measured:
        assert shown[lib] > 100, (lib, shown)
    # The y axis's labels, left of the first panel.
    x0, y0, _, y1 = (int(round(v)) for v in drawn["axes"][0]["box"])
    assert dark[y0:y1, max(x0 - 40, 0):x0 - 3].sum() > 100


def test_size_labels():
    assert _bench.size_label(512) == "512 B"
    assert _bench.size_label(4096) == "4 KiB"
    assert _bench.size_label(1 << 20) == "1 MiB"
    assert _bench.size_label(256 << 20) == "256 MiB"
    assert _bench.size_label(1 << 30) == "1 GiB"
    assert _bench.size_label(3 << 29) == "1.5 GiB"


def test_plot_limit_per_direction_and_size_axis(tmp_path):
    """Device to host faster than host to device (as on some links): each
    panel's limit line is that direction's best pinned figure, so no
    pinned curve crosses it; the x axis is labelled in KiB / MiB / GiB."""
    pytest.importorskip("matplotlib")
    sizes = [4096 << (2 * k) for k in range(10)]        # 4 KiB .. 1 GiB
    rows = []
    for direction, top in (("htod", 50.0), ("dtoh", 55.0),
                           ("bidir", 90.0)):
        for lib, scale in (("cudamem", 1.0), ("driver", 0.98)):
            for i, size in enumerate(sizes):
                g = top * scale * (i + 1) / len(sizes)
                rows.append({"library": lib, "method": "pinned",
                             "direction": direction, "size": size,
                             "gbps": g})
                rows.append({"library": lib, "method": "pageable-staged",
                             "direction": direction, "size": size,
                             "gbps": g * 0.8})
    res = {"libraries": ["cudamem", "driver"], "bandwidth": rows,
           "sizes": sizes, "pcie_limit_gbps": 50.0, "simulated": True,
           "device": {"name": "test"}}
    drawn = _bench.write_plot(res, tmp_path / "p.png")
    assert drawn["limits"] == {"htod": 50.0, "dtoh": 55.0, "bidir": 90.0}
    for s in drawn["series"]:
        if s["method"] == "pinned":
            top = max(g for _, g in s["points"])
            assert top <= drawn["limits"][s["direction"]], s
    assert drawn["xticks"] == ["4 KiB", "16 KiB", "64 KiB", "256 KiB",
                               "1 MiB", "4 MiB", "16 MiB", "64 MiB",
                               "256 MiB", "1 GiB"]
    # Few sizes: each measured size is labelled.
    res["bandwidth"] = [r for r in rows if r["size"] in (4096, 1 << 16,
                                                         1 << 20)]
    drawn = _bench.write_plot(res, tmp_path / "q.png")
    assert drawn["xticks"] == ["4 KiB", "64 KiB", "1 MiB"]


def test_plain_progress(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "rich", None)
    monkeypatch.setitem(sys.modules, "rich.progress", None)
    buf = io.StringIO()
    bar = _bench._Progress(4, True, buf)
    for i in range(4):
        bar.step("step %d" % i)
    bar.close()
    text = buf.getvalue()
    assert "\r[#######" in text and " 25% step 0" in text
    assert "100% step 3" in text
    assert text.endswith("\r")


def test_progress_off_writes_nothing():
    buf = io.StringIO()
    bar = _bench._Progress(3, False, buf)
    bar.step("x")
    bar.close()
    assert buf.getvalue() == ""


def test_sizes():
    assert _bench._sizes(False, False) == [4096 << (2 * i)
                                           for i in range(10)]
    assert _bench._sizes(False, False)[-1] == 1 << 30
    assert _bench._sizes(True, False)[-1] == 256 << 20
    assert max(_bench._sizes(False, True)) <= 16 << 20
