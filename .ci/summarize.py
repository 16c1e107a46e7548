# SPDX-License-Identifier: MIT
"""Summarise a .ci/gpu run as one RESULTS.md entry: date, commit, device,
driver, test counts and the benchmark figures (cudamem's median and its
ratios to the best peer and to the bare driver)."""

import argparse
import datetime
import json
import pathlib
import re
import sys
import xml.etree.ElementTree as ET


OUTCOME = re.compile(r"(?:^|\s)(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)"
                     r"(?:\s|$)")


def log_counts(junit):
    """Outcomes counted in the verbose log beside a junit file that was
    never written (the stage stopped at its limit): junit.xml's is
    tests.log, junit-exclusive.xml's tests-exclusive.log.  None where
    there is no such log."""
    p = pathlib.Path(junit)
    log = p.with_name(p.name.replace("junit", "tests", 1)
                      .replace(".xml", ".log"))
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    n = {}
    for line in text.splitlines():
        if "::" not in line:
            continue
        m = OUTCOME.search(line)
        if m:
            n[m.group(1)] = n.get(m.group(1), 0) + 1
    return ("%d passed, %d failed, %d skipped before the stage stopped "
            "(%s: no junit report; counted in %s)"
            % (n.get("PASSED", 0) + n.get("XFAIL", 0),
               n.get("FAILED", 0) + n.get("ERROR", 0) + n.get("XPASS", 0),
               n.get("SKIPPED", 0), p.name, log.name))


def test_counts(paths):
    """Counts summed over junit files (a path or a list of them)."""
    if isinstance(paths, str):
        paths = [paths]
    suites = []
    for path in paths:
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError):
            counted = log_counts(path)
            if counted is not None:
                return "tests: " + counted
            return "tests: no junit report (%s)" % pathlib.Path(path).name
        suites += [root] if root.tag == "testsuite" else list(root)
    n = sum(int(s.get("tests", 0)) for s in suites)
    failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0))
                 for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    return "%d passed, %d failed, %d skipped" % (n - failed - skipped,
                                                 failed, skipped)


def bench_lines(path):
    try:
        rows = json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError):
        return ["- benchmarks: none recorded"]
    out = []
    for row in rows:
        t = row["times"]
        if "cudamem" not in t:
            continue
        med = t["cudamem"][0]
        cells = []
        for lib, v in sorted(t.items()):
            if row.get("bytes"):
                cells.append("%s %.1f GB/s" % (lib, row["bytes"] / v[0] / 1e9))
            else:
                cells.append("%s %.2f" % (lib, v[0] * 1e6))
        peers = [v[0] for k, v in t.items() if k not in ("cudamem", "driver")]
        extra = ""
        if peers:
            extra += "; vs best peer %.2fx" % (med / min(peers))
        if "driver" in t:
            extra += "; vs bare driver %.2fx (%+.2f us)" % (
                med / t["driver"][0], (med - t["driver"][0]) * 1e6)
        unit = "" if row.get("bytes") else " (us, median)"
        out.append("- %s%s: %s%s" % (row["op"], unit, ", ".join(cells),
                                     extra))
    return out or ["- benchmarks: none recorded"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", required=True)
    ap.add_argument("--junit", action="append", required=True,
                    help="a junit file of the suite (repeat: summed)")
    ap.add_argument("--bench", required=True)
    ap.add_argument("--report", required=True)
    ap.add_argument("--compat-junit", action="append", default=[],
                    metavar="TARGET=FILE",
                    help="junit file of a tests/compat run against TARGET "
                         "(repeatable)")
    ap.add_argument("--sanitize", default=None,
                    help="the line .ci/sanitize wrote (absent: no stage)")
    a = ap.parse_args()
    report = pathlib.Path(a.report).read_text() if pathlib.Path(
        a.report).exists() else ""
    drv = re.search(r"driver version: (.*)", report)
    dev = re.search(r"\[0\] (.*?)  compute capability ([0-9.]+)", report)
    today = datetime.date.today().isoformat()
    print("\n## %s, commit %s" % (today, a.commit))
    print("- device: %s (cc %s), driver %s" % (
        dev.group(1) if dev else "?", dev.group(2) if dev else "?",
        drv.group(1) if drv else "?"))
    print("- tests (`bash .ci/gpu`): %s" % test_counts(a.junit))
    if a.compat_junit:
        print("- compat tests (`tests/compat`): %s" % "; ".join(
            "against %s: %s" % (target, test_counts(path))
            for target, _, path in (c.partition("=")
                                    for c in a.compat_junit)))
    if a.sanitize and pathlib.Path(a.sanitize).exists():
        line = pathlib.Path(a.sanitize).read_text().strip()
        if line:
            print(line)
    for line in bench_lines(a.bench):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
