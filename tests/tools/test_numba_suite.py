# SPDX-License-Identifier: MIT
"""tools/numba_suite.py, without a GPU: its dry run, the child that runs
one unittest module and writes an outcome per test (on a stand-in module:
passes, failures, errors, skips, subtests, a hang and a crash), the
comparison of the two runs and the known differences read from
docs/numba-compat.md."""

import importlib.util
import subprocess
import sys
import textwrap

import pytest

from helpers import ROOT

TOOL = ROOT / "tools" / "numba_suite.py"


@pytest.fixture(scope="module")
def ns():
    spec = importlib.util.spec_from_file_location("numba_suite", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_dry_run_lists_every_module_with_its_reason():
    p = subprocess.run([sys.executable, str(TOOL), "--dry-run"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "cudadrv.test_cuda_memory" in p.stdout
    assert "cudapy.test_ipc" in p.stdout
    assert "NUMBA_CUDA_MEMORY_MANAGER=cudamem.numba_plugin" in p.stdout


def test_every_default_module_has_a_reason(ns):
    assert all(r.strip() for r in ns.MODULES.values())
    assert all(m.split(".")[0] in ("cudadrv", "cudapy")
               for m in ns.MODULES)


STAND_IN = """
    import os
    import time
    import unittest


    class T(unittest.TestCase):
        def test_pass(self):
            pass

        def test_fail(self):
            self.assertEqual(1, 2, "one is not two")

        def test_error(self):
            raise RuntimeError("broken\\nsecond line")

        @unittest.skip("not here")
        def test_skip(self):
            pass

        def test_subtests(self):
            for i in range(3):
                with self.subTest(i=i):
                    self.assertNotEqual(i, 1)

        @unittest.expectedFailure
        def test_xfail(self):
            self.fail()

        def test_z_last(self):
            if os.environ.get("STAND_IN_HANG"):
                time.sleep(600)
            if os.environ.get("STAND_IN_CRASH"):
                os.abort()


    class Broken(unittest.TestCase):
        @classmethod
        def setUpClass(cls):
            raise ValueError("no class today")

        def test_never(self):
            pass
"""


@pytest.fixture
def stand_in(tmp_path, monkeypatch, ns):
    (tmp_path / "stand_in_tests.py").write_text(textwrap.dedent(STAND_IN))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(ns, "PREFIX", "")
    return tmp_path


def _job(ns, tmp_path, run="numba"):
    return ns.Job("stand_in_tests", run, None, str(tmp_path / "out"))


def test_child_records_each_outcome(ns, stand_in):
    job = ns.run_job(_job(ns, stand_in), 120)
    assert job.status == "done"
    t = {k.rsplit(".", 1)[-1]: v for k, v in job.tests.items()}
    assert t["test_pass"] == ("passed", "")
    assert t["test_fail"][0] == "failed"
    assert "one is not two" in t["test_fail"][1]
    assert t["test_error"] == ("error", "RuntimeError: broken")
    assert t["test_skip"] == ("skipped", "not here")
    assert t["test_subtests"][0] == "failed"
    assert "(i=1)" in t["test_subtests"][1]
    assert t["test_xfail"] == ("passed", "")
    assert t["test_z_last"] == ("passed", "")
    broken = [v for k, v in job.tests.items() if "setUpClass" in k]
    assert broken == [("error", "ValueError: no class today")]
    assert ns.counts(job.tests) == {"run": 8, "passed": 3, "failed": 2,
                                    "errors": 2, "skipped": 1}


def test_a_hung_module_keeps_the_tests_it_ran(ns, stand_in, monkeypatch):
    monkeypatch.setenv("STAND_IN_HANG", "1")
    # The child reaches the hang in a fraction of a second (under the
    # sanitizers too); the limit is what the test waits.
    job = ns.run_job(_job(ns, stand_in), 4)
    assert job.status == "timed out"
    last = job.tests["stand_in_tests.T.test_z_last"]
    assert last[0] == "error" and last[1].startswith("timed out")
    assert job.tests["stand_in_tests.T.test_pass"] == ("passed", "")


def test_a_crash_names_the_test_and_the_signal(ns, stand_in, monkeypatch):
    monkeypatch.setenv("STAND_IN_CRASH", "1")
    job = ns.run_job(_job(ns, stand_in), 120)
    assert job.status == "crashed"
    assert job.tests["stand_in_tests.T.test_z_last"] == (
        "error", "crashed: the child died of SIGABRT")


def test_a_module_that_does_not_import(ns, tmp_path, monkeypatch):
    (tmp_path / "bad_tests.py").write_text("import no_such_module_here\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(ns, "PREFIX", "")
    job = ns.run_job(ns.Job("bad_tests", "plugin", "x", str(tmp_path)), 60)
    assert job.status == "done"
    assert ns.counts(job.tests)["errors"] == 1
    (outcome, last), = job.tests.values()
    assert "no_such_module_here" in last


def test_differences_and_listed_tests(ns, tmp_path):
    a = {"m.A.t1": ("passed", ""), "m.A.t2": ("passed", ""),
         "m.A.t3": ("failed", "x"), "m.A.t4": ("passed", "")}
    b = {"m.A.t1": ("passed", ""), "m.A.t2": ("error", "E: boom"),
         "m.A.t3": ("passed", ""), "m.A.t4": ("skipped", "EMM in use")}
    assert ns.differences(a, b) == [("m.A.t2", "error", "E: boom"),
                                    ("m.A.t4", "skipped", "EMM in use")]
    assert ns.differences(a, {}) == [
        ("m.A.t1", "not run", "the test did not run"),
        ("m.A.t2", "not run", "the test did not run"),
        ("m.A.t4", "not run", "the test did not run")]
    doc = tmp_path / "compat.md"
    doc.write_text(
        "`numba.cuda.tests.x.T.outside`\n<!-- begin: numba-suite -->\n"
        "| `numba.cuda.tests.cudadrv.test_x.T.test_y` | why |\n"
        "<!-- end: numba-suite -->\n")
    assert ns.listed_tests(doc) == {
        "numba.cuda.tests.cudadrv.test_x.T.test_y"}
    assert ns.listed_tests(tmp_path / "none.md") == set()


def test_the_docs_section_is_there(ns):
    # docs/numba-compat.md keeps the section the tool reads (the
    # generator, tools/compat_matrix.py, keeps it when it rewrites the
    # file).
    text = (ROOT / "docs" / "numba-compat.md").read_text()
    assert "<!-- begin: numba-suite -->" in text
    assert "<!-- end: numba-suite -->" in text
