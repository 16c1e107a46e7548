# SPDX-License-Identifier: MIT
"""benchmarks/mem_efficiency.py and ``python -m cudamem bench --memory``
on the simulator, small: the table's rows and columns, every cudamem
manager's peak used / peak live finite and at least 1.0 with a time per
operation, the same operations in every child, the peers noted as
skipped; and the workloads themselves (seeded, capped, ending empty)."""

import json
import math
import os
import subprocess
import sys

import pytest

from cudamem import _bench_memory as mem
from helpers import ROOT

CAP = 48 << 20
OPS = 1200
# The baseline is read before the library's first allocation, so what
# that allocation takes (a 2 MiB page of the pool on virtual memory, into
# which later small blocks pack) is counted: every ratio is at least 1.0.


def sim_env():
    env = dict(os.environ, CUDAMEM_SIMULATOR="1", PYTHONPATH=str(ROOT))
    for var in ("CUDAMEM_MEMORY_MANAGER", "CUDAMEM_SIM_MEMORY",
                "CUDAMEM_DEVICE_MEMORY_LIMIT"):
        env.pop(var, None)
    return env


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("memeff") / "memeff.json"
    p = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "mem_efficiency.py"),
         "--cap", str(CAP), "--ops", str(OPS), "--jobs", "2", "--quiet",
         "--json", str(out)],
        capture_output=True, text=True, timeout=240, env=sim_env())
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout, json.loads(out.read_text())


def test_table_structure(bench):
    text, _ = bench
    lines = text.splitlines()
    assert "SIMULATED" in lines[0]
    assert any(line.startswith("Method: peak used = ") for line in lines)
    head = "| allocator | " + " | ".join(
        mem.TITLES[w] for w in mem.WORKLOADS) + " |"
    i = lines.index(head)
    assert lines[i + 1] == "|---" * (len(mem.WORKLOADS) + 1) + "|"
    rows = lines[i + 2:i + 3 + len(mem.CUDAMEM)]
    for row, name in zip(rows, mem.CUDAMEM + ("peak live",), strict=True):
        label = mem.LABELS.get(name, name)
        assert row.startswith("| %s | " % label), row
        cells = row.strip("| ").split(" | ")[1:]
        assert len(cells) == len(mem.WORKLOADS), row
        if name != "peak live":
            for cell in cells:
                ratio, us = cell.split(" (")
                assert float(ratio) >= 1.0, cell
                assert len(ratio.split(".")[1]) == 3, cell
                assert us.endswith(" µs)"), cell
    assert any(line.startswith("Of the peak, taken by the first allocation")
               for line in lines)
    for peer in mem.PEERS:
        assert "- %s: skipped: the simulator" % mem.LABELS[peer] in text


def test_ratios_finite_and_at_least_one(bench):
    _, res = bench
    assert res["simulated"] is True and res["cap"] == CAP
    assert res["ops"] == OPS
    cells = {(c["allocator"], c["workload"]): c for c in res["results"]}
    assert set(cells) == {(a, w) for a in mem.CUDAMEM
                          for w in mem.WORKLOADS}
    for (a, w), c in cells.items():
        for key in ("error", "oom", "skipped", "not_run"):
            assert key not in c, (a, w, c)
        live = [x["peak_live"] for x in res["workloads"]
                if x["name"] == w][0]
        assert math.isfinite(c["ratio"]), (a, w, c)
        assert c["ratio"] == c["peak_used"] / live, (a, w, c)
        assert c["ratio"] >= 1.0, (a, w, c)
        # What the first allocation took is inside the peak.
        assert 0 <= c["first_allocation"] <= c["peak_used"], (a, w, c)
        assert math.isfinite(c["us_per_op"]) and c["us_per_op"] > 0
    for w in res["workloads"]:
        assert 0 < w["peak_live"] <= CAP
        assert 0.8 * OPS <= w["ops"] <= 1.1 * OPS


def test_workloads_are_seeded_capped_and_end_empty():
    for w in mem.WORKLOADS:
        a = mem.generate(w, 3, CAP, OPS)
        b = mem.generate(w, 3, CAP, OPS)
        c = mem.generate(w, 4, CAP, OPS)
        assert mem.digest(a) == mem.digest(b) != mem.digest(c), w
        assert a.live == {} and a.live_bytes == 0, w
        assert 0 < a.peak_live <= CAP, w
        assert a.sizes.count(0) * 2 == len(a), w    # every block freed


def test_cli_memory(tmp_path):
    out = tmp_path / "m.json"
    p = subprocess.run(
        [sys.executable, "-m", "cudamem", "bench", "--memory", "--quick",
         "--cap", str(CAP), "--no-progress", "--json", str(out)],
        capture_output=True, text=True, timeout=240, env=sim_env())
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads(out.read_text())
    assert res["allocators"] == list(mem.CUDAMEM)
    assert {c["allocator"] for c in res["results"]} == set(mem.CUDAMEM)
    assert all(c["ratio"] >= 1.0 for c in res["results"])
    assert "| cudamem `pool`, `CUDAMEM_POOL_VMM=0` | " in p.stdout
    assert "| cudamem `pool` (on virtual memory, the default) | " in p.stdout
