"""Compare cudamem's figures in two benchmark summaries.

Each summary is a ``## <date>, commit <sha>, part bench`` section of
``benchmarks/RESULTS.md`` (or a ``summary.md`` written by ``.ci/gpu``).
For every row both have, prints cudamem's figure in each and how much
worse the second is (times: higher is worse; GB/s and k/s: lower is
worse), worst first.  Two runs on two machines of the same kind differ
by their own noise too: a row is only worth a look past the ``--flag``
fraction (default 0.10).

    python tools/bench_diff.py benchmarks/RESULTS.md cea94cc a016b9f
    python tools/bench_diff.py OLD_summary.md - NEW_summary.md -
"""
import argparse
import re
import sys

ROW = re.compile(r"^- (?P<row>.+?)(?: \((?P<unit>[^)]*)\))?: (?P<vals>.+?)"
                 r"(?:; vs best peer.*|; vs bare driver.*)?$")
VAL = re.compile(r"cudamem (?P<v>[0-9.]+)(?: (?P<u>GB/s|k/s))?")


def section(path, sha):
    """The lines of the bench section of `sha` in `path` ('-': the first)."""
    out, on = [], False
    for line in open(path, encoding="utf-8"):
        if line.startswith("## "):
            if on:
                break
            on = "part bench" in line and (sha == "-" or
                                           ("commit %s," % sha) in line)
            continue
        if on:
            out.append(line.rstrip("\n"))
    if not out:
        sys.exit("no bench section for %s in %s" % (sha, path))
    return out


def figures(lines):
    """{row: (value, higher_is_better)} for cudamem's figure of each row."""
    rows = {}
    for line in lines:
        m = ROW.match(line)
        if not m:
            continue
        v = VAL.search(m.group("vals"))
        if not v:
            continue
        rate = v.group("u") in ("GB/s", "k/s")
        rows[m.group("row")] = (float(v.group("v")), rate)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old_file")
    ap.add_argument("old_sha")
    ap.add_argument("new_file_or_sha")
    ap.add_argument("new_sha", nargs="?")
    ap.add_argument("--flag", type=float, default=0.10)
    a = ap.parse_args(argv)
    if a.new_sha is None:       # both sections in one file
        new_file, new_sha = a.old_file, a.new_file_or_sha
    else:
        new_file, new_sha = a.new_file_or_sha, a.new_sha
    old = figures(section(a.old_file, a.old_sha))
    new = figures(section(new_file, new_sha))
    out = []
    for row in old.keys() & new.keys():
        (o, rate), (n, _) = old[row], new[row]
        if o <= 0 or n <= 0:
            continue
        worse = (o / n - 1.0) if rate else (n / o - 1.0)
        out.append((worse, row, o, n))
    out.sort(reverse=True)
    flagged = 0
    for worse, row, o, n in out:
        mark = "  <--" if worse > a.flag else ""
        flagged += bool(mark)
        print("%+7.1f%%  %-52s %10.2f -> %-10.2f%s"
              % (100 * worse, row[:52], o, n, mark))
    print("%d rows in both; %d worse by more than %.0f%%; only in the old: %d;"
          " only in the new: %d" % (len(out), flagged, 100 * a.flag,
                                     len(old.keys() - new.keys()),
                                     len(new.keys() - old.keys())))


if __name__ == "__main__":
    main()
