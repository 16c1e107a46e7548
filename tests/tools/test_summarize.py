# SPDX-License-Identifier: MIT
""".ci/summarize.py's test counts: from the junit files, and where a
stage stopped at its limit before pytest wrote its junit file, from the
verbose log beside it (both of pytest's -v formats, with and without
xdist), said to be partial."""

import importlib.util

from helpers import ROOT


def _summarize():
    spec = importlib.util.spec_from_file_location(
        "summarize", ROOT / ".ci" / "summarize.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


LOG = """\
=============== test session starts ===============
tests/a.py::test_one PASSED                                    [  1%]
tests/a.py::test_two[x-FAILED] FAILED                          [  2%]
[gw0] [ 50%] PASSED tests/b.py::test_three[ERROR in the name]
[gw1] [ 51%] SKIPPED tests/b.py::test_four
[gw1] [ 52%] ERROR tests/b.py::test_five
tests/c.py::test_six
"""


def test_counts_from_the_log_when_the_junit_file_is_missing(tmp_path):
    (tmp_path / "tests-exclusive.log").write_text(LOG)
    out = _summarize().test_counts(str(tmp_path / "junit-exclusive.xml"))
    assert out == ("tests: 2 passed, 2 failed, 1 skipped before the stage "
                   "stopped (junit-exclusive.xml: no junit report; counted "
                   "in tests-exclusive.log)")


def test_no_junit_and_no_log(tmp_path):
    out = _summarize().test_counts(str(tmp_path / "junit.xml"))
    assert out == "tests: no junit report (junit.xml)"


def test_counts_from_junit(tmp_path):
    (tmp_path / "junit.xml").write_text(
        '<testsuites><testsuite tests="10" failures="1" errors="1" '
        'skipped="3"/></testsuites>')
    (tmp_path / "tests.log").write_text(LOG)
    out = _summarize().test_counts(str(tmp_path / "junit.xml"))
    assert out == "5 passed, 2 failed, 3 skipped"
