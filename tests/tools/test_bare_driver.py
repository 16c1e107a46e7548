# SPDX-License-Identifier: MIT
"""benchmarks/bare_driver.c, the benchmark's driver called from C, and
the rows that use it (benchmarks/ops_threads.py, the churn's C rows of
benchmarks/ops_alloc.py).

Without a GPU the program runs against fake_libcuda.c (host memory
behind the dozen entry points it loads), which counts what it was asked
to do: so the threads, the deferred frees and the error path are checked
here; the figures themselves only mean something on a GPU.
"""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from helpers import ROOT

BENCH = pathlib.Path(ROOT) / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import bare_driver  # noqa: E402
import harness  # noqa: E402

CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(
    CC is None or bare_driver.cuda_include_dir() is None,
    reason="needs a C compiler and the toolkit's cuda.h")


@pytest.fixture(scope="module")
def prog(tmp_path_factory):
    out = tmp_path_factory.mktemp("bd") / "bd"
    p = bare_driver.compile_program(out, extra=["-Werror"])
    assert p.returncode == 0, p.stderr
    assert p.stderr == "", p.stderr     # warning-free, -Wall -Wextra
    return str(out)


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    out = tmp_path_factory.mktemp("fake") / "libfakecuda.so"
    src = pathlib.Path(__file__).with_name("fake_libcuda.c")
    p = subprocess.run([CC, "-std=c11", "-O2", "-Wall", "-Wextra",
                        "-Werror", "-shared", "-fPIC", "-o", str(out),
                        str(src), "-pthread"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return str(out)


def run(prog, *args, fake=None, **env):
    e = dict(os.environ, FAKE_CUDA_STATS="1")
    e.pop("FAKE_CUDA_FAIL_COPY", None)
    if fake is not None:
        e["CUDAMEM_DRIVER_LIBRARY"] = fake
    e.update(env)
    return subprocess.run([prog, *map(str, args)], capture_output=True,
                          text=True, timeout=120, env=e)


def stats(p):
    """The fake driver's counts, from its line on stderr."""
    line = [x for x in p.stderr.splitlines() if x.startswith("fake_cuda:")]
    assert len(line) == 1, p.stderr
    return {k: int(v) for k, v in
            (w.split("=") for w in line[0].split()[1:])}


def samples(p, n):
    words = p.stdout.split()
    assert words[0] == "ok", p.stdout + p.stderr
    xs = [float(w) for w in words[1:]]
    assert len(xs) == n and all(x > 0 for x in xs), p.stdout
    return xs


@pytest.mark.parametrize("memory", ["pinned", "pageable", "pinned-generic"])
@pytest.mark.parametrize("nthreads", [1, 4])
def test_round_trip_threads(prog, fake, memory, nthreads):
    p = run(prog, "roundtrip", nthreads, 1024, memory, 3, 20, fake=fake)
    assert p.returncode == 0, p.stderr
    samples(p, 3)
    s = stats(p)
    # One device buffer and one stream per thread, all released; every
    # round trip two copies and one synchronize.
    assert s["allocs"] == s["frees"] == nthreads
    assert s["live"] == 0 and s["streams"] == 0
    assert s["syncs"] >= nthreads * 50       # the warm-up at least
    assert s["copies"] == 2 * s["syncs"]


def test_round_trip_64k(prog, fake):
    p = run(prog, "roundtrip", 2, 65536, "pageable", 2, 10, fake=fake)
    assert p.returncode == 0, p.stderr
    samples(p, 2)


@pytest.mark.parametrize("count", [0, 1, 10, 31])
def test_churn_deferred_frees_in_batches(prog, fake, count):
    """A free is queued; the queue is freed whole once it holds more than
    COUNT (memory.c's rule for config.CUDA_DEALLOCS_COUNT)."""
    p = run(prog, "churn", "deferred", count, 5, 2, fake=fake)
    assert p.returncode == 0, p.stderr
    samples(p, 5)
    s = stats(p)
    assert s["max_live"] == count + 1
    assert s["allocs"] == s["frees"] > 5 * (count + 1)
    assert s["live"] == 0


def test_churn_plain_frees_at_once(prog, fake):
    p = run(prog, "churn", "plain", 10, 5, 2, fake=fake)
    assert p.returncode == 0, p.stderr
    samples(p, 5)
    s = stats(p)
    assert s["max_live"] == 1
    assert s["allocs"] == s["frees"] and s["live"] == 0


# What each CALL of the copy command makes per copy: synchronous copies,
# copies on CU_STREAM_LEGACY, synchronizations of it, pointer queries.
COPY_CALLS = {
    "sync": (1, 0, 0, 0),
    "async": (0, 1, 0, 0),
    "async-wait": (0, 1, 1, 0),
    "query-async": (0, 1, 0, 1),
    "query-async-wait": (0, 1, 1, 1),
    "pinned": (1, 0, 0, 0),
    "pinned-generic": (1, 0, 0, 0),
}


# (a new buffer each copy, dtoh-new, is pageable: no pinned call there)
@pytest.mark.parametrize("direction,call", [
    (d, c) for d in ("htod", "dtoh", "dtoh-new") for c in sorted(COPY_CALLS)
    if not (d == "dtoh-new" and c.startswith("pinned"))])
def test_copy_rows_make_the_calls_they_name(prog, fake, direction, call):
    """The single-copy rows: per copy exactly the driver calls CALL names
    (the fake counts them), one device buffer, released; the host buffer
    page-locked (cuMemHostAlloc, then freed) for ``pinned`` alone."""
    p = run(prog, "copy", direction, call, 1024, 4, 2, fake=fake)
    assert p.returncode == 0, p.stderr
    samples(p, 4)
    s = stats(p)
    n = s["copies"]
    assert n > 4
    assert s["allocs"] == s["frees"] == 1 and s["live"] == 0
    sync, legacy, legacy_syncs, queries = COPY_CALLS[call]
    assert (s["scopies"], s["legacy"], s["legacy_syncs"], s["queries"]) \
        == (sync * n, legacy * n, legacy_syncs * n, queries * n)
    assert s["streams"] == 0 and s["syncs"] == s["legacy_syncs"]
    pinned = int(call.startswith("pinned"))
    assert s["host_allocs"] == s["host_frees"] == pinned


def test_copy_query_refuses_page_locked_memory(prog, fake):
    """The query's answer is checked: host memory the driver knows is not
    the pageable memory the row is about."""
    p = run(prog, "copy", "htod", "query-async", 1024, 2, 2, fake=fake,
            FAKE_CUDA_QUERY_LOCKED="1")
    assert p.returncode == 1
    assert "cuPointerGetAttribute (pageable memory expected) failed: " \
        "CUDA_ERROR_INVALID_VALUE" in p.stderr
    s = stats(p)
    assert s["copies"] == 0 and s["live"] == 0


def test_copy_error_is_reported(prog, fake):
    p = run(prog, "copy", "htod", "sync", 1024, 3, 5, fake=fake,
            FAKE_CUDA_FAIL_COPY="7")
    assert p.returncode == 1
    assert "cuMemcpyHtoD failed: CUDA_ERROR_LAUNCH_FAILED" in p.stderr
    assert stats(p)["live"] == 0


def test_driver_error_is_reported_and_threads_end(prog, fake):
    p = run(prog, "roundtrip", 4, 1024, "pinned", 3, 20, fake=fake,
            FAKE_CUDA_FAIL_COPY="120")
    assert p.returncode == 1
    assert "cuMemcpyHtoDAsync failed: CUDA_ERROR_LAUNCH_FAILED (719)" \
        in p.stderr
    assert p.stdout == ""
    s = stats(p)
    assert s["live"] == 0 and s["streams"] == 0


def test_no_driver(prog, tmp_path):
    p = run(prog, "roundtrip", 1, 1024, "pinned", 1, 1,
            fake=str(tmp_path / "nothing.so"))
    assert p.returncode == bare_driver.NO_DRIVER
    assert "cannot load" in p.stderr


@pytest.mark.parametrize("args", [
    (), ("roundtrip",), ("roundtrip", 0, 1024, "pinned", 1, 1),
    ("roundtrip", 1, 1024, "mapped", 1, 1),
    ("roundtrip", 1, "1k", "pinned", 1, 1),
    ("churn", "lazy", 10, 1, 1), ("churn", "plain", -1, 1, 1),
    ("churn", "plain", 10, 1, 1, 1), ("frobnicate", 1, 1, 1, 1),
    ("copy", "htod", "sync", 1024, 1), ("copy", "up", "sync", 1024, 1, 1),
    ("copy", "htod", "later", 1024, 1, 1),
    ("copy", "dtoh", "async", 0, 1, 1),
    ("copy", "dtoh-new", "pinned", 1024, 1, 1)])
def test_usage(prog, args):
    p = run(prog, *args, fake="/nonexistent")
    assert p.returncode == 2
    assert p.stderr.startswith("usage: bare_driver")


def test_python_side(fake, monkeypatch):
    """bare_driver.run builds the program and turns its samples into the
    harness's (median, p10, p90); no driver is a Skip."""
    monkeypatch.setenv("CUDAMEM_DRIVER_LIBRARY", fake)
    m = bare_driver.run("churn", "deferred", 10, 9, 1)
    assert isinstance(m, harness.Measured) and len(m) == 3
    assert 0 < m[1] <= m[0] <= m[2]
    monkeypatch.setenv("CUDAMEM_DRIVER_LIBRARY", "/nonexistent.so")
    with pytest.raises(harness.Skip, match="cannot load"):
        bare_driver.run("churn", "plain", 10, 1, 1)


def test_threads_rows_driver_column(fake, monkeypatch):
    """The driver column of a round-trip row and of the churn's C rows,
    as the harness calls them (the module argument is unused)."""
    import ops_alloc
    import ops_threads

    monkeypatch.setenv("CUDAMEM_DRIVER_LIBRARY", fake)
    monkeypatch.setattr(ops_threads, "SAMPLES", 3)
    monkeypatch.setattr(ops_threads, "MS", 5)
    ops = {op["name"]: op for op in ops_threads.OPS + ops_alloc.OPS}
    rows = harness.run_ops(
        [ops["round trip 1 KiB pinned [2 threads]"],
         ops["alloc+drop churn 1K-4M [C, deferred]"]],
        {"driver": object()})
    for row in rows:
        assert "errors" not in row and "skipped" not in row, row
        assert set(row["times"]) == {"driver"}
    assert "k/s" in harness.format_table(rows[:1])


def test_copy_rows_driver_column(fake, monkeypatch):
    """The issue-32 copy rows of ops_transfer.py: the driver column is the
    C program making the calls of cudamem's mode (the pointer query with
    the async ones), or the async call alone in the [C async] rows."""
    import ops_transfer

    monkeypatch.setenv("CUDAMEM_DRIVER_LIBRARY", fake)
    monkeypatch.setattr(ops_transfer, "C_SAMPLES", 3)
    rows = [op for op in ops_transfer.OPS if "1K pageable" in op["name"]]
    assert [op["name"] for op in rows] == [
        "%s [%s]" % (name, mode)
        for name, modes in (
            ("htod 1K pageable, existing", ("sync", "async")),
            ("dtoh 1K pageable, existing", ("sync", "async", "async_wait")),
            ("dtoh 1K pageable, new", ("sync", "async", "async_wait")))
        for mode in modes + ("C async",)]
    calls = []
    real = bare_driver.run

    def spy(*args, **kw):
        calls.append(args[1:3])
        return real(*args, **kw)

    monkeypatch.setattr(bare_driver, "run", spy)
    out = harness.run_ops(rows, {"driver": object()})
    for row in out:
        assert "errors" not in row and set(row["times"]) == {"driver"}, row
    assert calls == [
        (d, c) for d, cs in (
            ("htod", ("sync", "query-async", "async")),
            ("dtoh", ("sync", "query-async", "query-async-wait", "async")),
            ("dtoh-new", ("sync", "query-async", "query-async-wait",
                          "async")))
        for c in cs]


def test_copy_rows_cudamem_modes(monkeypatch):
    """cudamem's column of each copy row is timed with its mode set, and
    the mode before is set back, also when the timing fails."""
    import cudamem
    import ops_transfer
    from cudamem import _core

    seen = []

    def timing(fn, **kw):
        fn()
        seen.append(_core._sync_copy_call())
        return (1e-6, 1e-6, 1e-6)

    monkeypatch.setattr(harness, "time_callable", timing)
    rows = [op for op in ops_transfer.OPS if "1K pageable" in op["name"]
            and "C async" not in op["name"]]
    old = _core._sync_copy_call("sync")
    try:
        out = harness.run_ops(rows, {"cudamem": cudamem})
        assert seen == [op["name"].split("[")[1][:-1] for op in rows]
        assert all(set(r["times"]) == {"cudamem"} for r in out), out
        assert _core._sync_copy_call() == "sync"

        def broken(fn, **kw):
            raise RuntimeError("timing failed")

        monkeypatch.setattr(harness, "time_callable", broken)
        out = harness.run_ops(rows[1:2], {"cudamem": cudamem})
        assert "timing failed" in out[0]["errors"]["cudamem"]
        assert _core._sync_copy_call() == "sync"
    finally:
        _core._sync_copy_call(old)


def test_threaded_counts_and_errors():
    import ops_threads

    calls = []

    def setup(i):
        return lambda: calls.append(i)

    m = ops_threads.threaded(3, setup, samples=2, ms=5, warm=1)
    assert 0 < m[1] <= m[0] <= m[2]
    assert set(calls) == {0, 1, 2}

    def bad(i):
        if i == 1:
            raise ValueError("setup of thread 1")
        return lambda: None

    with pytest.raises(ValueError, match="setup of thread 1"):
        ops_threads.threaded(2, bad, samples=2, ms=1, warm=1)


def test_benchmark_lists_the_rows():
    import ops_alloc
    import ops_threads
    import run as bench_run

    assert "ops_threads" in bench_run.MODULES
    names = [op["name"] for op in ops_threads.OPS]
    want = ["round trip %s %s [%s]" % (size, mem, n)
            for size in ("1 KiB", "64 KiB") for mem in ("pinned", "pageable")
            for n in ("1 thread", "2 threads", "4 threads", "8 threads")]
    keep = ["round trip 1 KiB %s [%s]" % (tag, n)
            for tag in ("release-GIL", "keep-GIL", "GIL auto")
            for n in ("1 thread", "2 threads", "4 threads", "8 threads")]
    staged = ["round trip 1 KiB staged [%s]" % n
              for n in ("1 thread", "2 threads", "4 threads", "8 threads")]
    assert names == want + keep + staged
    for op in ops_threads.OPS:
        assert op["unit"] == "k/s"
        assert set(op["impls"]) == (
            {"cudamem"} if op["name"] in keep + staged
            else {"cudamem", "cupy", "torch", "driver"})
    alloc = [op["name"] for op in ops_alloc.OPS]
    i = alloc.index("alloc+drop churn 1K-4M [default]")
    assert alloc[i + 1:i + 3] == ["alloc+drop churn 1K-4M [C, plain]",
                                  "alloc+drop churn 1K-4M [C, deferred]"]
    # The table's operation column holds every name whole.
    assert max(len(n) for n in names + alloc) <= 40


def test_run_prints_the_rows():
    """benchmarks/run.py on this backend: the rows are timed for cudamem
    and, without a GPU, the driver column is left out as in every row."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run(
        [sys.executable, str(BENCH / "run.py"), "-k",
         "round trip 1 KiB pageable [2 threads]", "-k",
         "churn 1K-4M [C, deferred]", "-k", "1K pageable, new [async]",
         "--repeats", "3"],
        capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = {line[:40].rstrip(): line for line in p.stdout.splitlines()}
    rt = rows["round trip 1 KiB pageable [2 threads]"]
    assert rt[40:].split()[1] == "k/s"
    assert float(rt[40:].split()[0]) > 0
    assert "alloc+drop churn 1K-4M [C, deferred]" in rows
    assert float(rows["dtoh 1K pageable, new [async]"][40:].split()[0]) > 0
    assert "error" not in p.stdout
    if os.environ.get("CUDAMEM_SIMULATOR", "0") not in ("0", ""):
        assert "driver=no" in p.stdout


@pytest.mark.parametrize("mode", [False, True, "auto"])
def test_keep_gil_rows_run_and_restore_the_setting(monkeypatch, mode):
    import ops_threads

    import cudamem as cm

    monkeypatch.setattr(ops_threads, "SAMPLES", 2)
    monkeypatch.setattr(ops_threads, "MS", 2)
    start = False if mode is True else True
    old = cm._core._copy_keep_gil(start)
    try:
        m = ops_threads._cudamem_keep_gil(2, 1024, mode)(cm)
        assert isinstance(m, tuple) and m[0] > 0
        assert cm._core._copy_keep_gil() is start
    finally:
        cm._core._copy_keep_gil(old)


def test_staged_rows_run_through_the_pipeline_and_restore_it(monkeypatch):
    import ops_threads

    import cudamem as cm

    monkeypatch.setattr(ops_threads, "SAMPLES", 2)
    monkeypatch.setattr(ops_threads, "MS", 2)
    before = cm._core._staging_config()
    staged = cm._core._staging_stats()["staged"]
    m = ops_threads._cudamem_staged(2, 1024)(cm)
    assert isinstance(m, tuple) and m[0] > 0
    assert cm._core._staging_config() == before
    # Both copies of every round trip went through the pipeline.
    assert cm._core._staging_stats()["staged"] - staged >= 2 * 2 * 50


def test_keep_gil_rows_skip_a_build_that_reads_auto_as_true(monkeypatch):
    """A build before 'auto' takes the string as a truth value: its row
    is skipped, not timed as keep-GIL under the auto label."""
    import harness
    import ops_threads

    setting = [False]

    def old_switch(on=None):
        prev = setting[0]
        if on is not None:
            setting[0] = bool(on)
        return prev

    class Core:
        _copy_keep_gil = staticmethod(old_switch)

    class Lib:
        _core = Core

    with pytest.raises(harness.Skip, match="no _copy_keep_gil\\('auto'\\)"):
        ops_threads._cudamem_keep_gil(2, 1024, "auto")(Lib)
    assert setting[0] is False
