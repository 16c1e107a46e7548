# SPDX-License-Identifier: MIT
"""benchmarks/ops_graphs.py: the graph and eager rows of 100 round trips
and the launch row of one run for cudamem on this backend and bring the
bytes back, and the harness gives their times per copy or per launch
(an operation's ``per``)."""

import pytest

import cudamem as cuda
from helpers import ROOT


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import harness
    import ops_graphs
    import run as bench_run

    return harness, ops_graphs, bench_run


def test_rows_are_listed(bench):
    harness, ops_graphs, bench_run = bench
    assert "ops_graphs" in bench_run.MODULES
    names = [op["name"] for op in ops_graphs.OPS]
    assert names == ["copy 1K pinned, 100 round trips [graph]",
                     "copy 1K pinned, 1 trip [graph launch]",
                     "copy 1K pinned, 100 trips [copy nodes]",
                     "copy 1K pinned, 100 trips [kernel nodes]",
                     "copy 1K registered, 100 trips [graph]",
                     "copy 1K pinned, 100 round trips [eager]"]
    assert max(len(n) for n in names) <= 40
    for op in ops_graphs.OPS:
        if "launch" in op["name"]:
            # Per replay of a graph of one round trip, beside the peers'
            # and the driver's.
            assert op["per"] == 1
            assert set(op["impls"]) == {"cudamem", "cupy", "torch",
                                        "driver"}
            continue
        assert op["per"] == 2 * ops_graphs.TRIPS == 200
        # The registered and copy-node rows are cudamem's alone (its host
        # memory, or how it records the copies, is the one thing each
        # changes).
        want = ({"cudamem"} if "registered" in op["name"]
                or "nodes" in op["name"] else {"cudamem", "cupy", "torch"})
        if "nodes" in op["name"]:
            assert set(op["impls"]) == {"cudamem"}
        assert want <= set(op["impls"])
        assert set(op["impls"]) <= set(harness.LIBS)


@pytest.mark.parametrize("factory", ["_graph_cm", "_graph_cm_nodes",
                                     "_graph_cm_apart",
                                     "_graph_cm_registered", "_eager"])
def test_cudamem_columns_round_trip(bench, factory):
    _, ops_graphs, _ = bench
    run = getattr(ops_graphs, factory)(cuda)   # checks the bytes once
    for _ in range(3):
        run()


def test_launch_row_round_trips(bench):
    _, ops_graphs, _ = bench
    op = next(o for o in ops_graphs.OPS if "launch" in o["name"])
    run = op["impls"]["cudamem"](cuda)          # checks the bytes once
    for _ in range(3):
        run()


def test_harness_divides_by_per(bench):
    harness, ops_graphs, _ = bench
    ops = [{"name": "fixed", "per": 4,
            "impls": {"cudamem": lambda m: harness.Measured((8.0, 4.0,
                                                             12.0))}},
           {"name": "timed", "per": 200,
            "impls": {"cudamem": ops_graphs._graph_cm}}]
    rows = harness.run_ops(ops, {"cudamem": cuda}, repeats=3)
    assert rows[0]["times"]["cudamem"] == (2.0, 1.0, 3.0)
    assert rows[0]["per"] == 4
    assert rows[1]["samples"]["cudamem"] == 3
    assert rows[1]["times"]["cudamem"][0] > 0
    assert "errors" not in rows[1] and "skipped" not in rows[1]
