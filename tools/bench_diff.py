"""Compare cudamem's figures in two benchmark summaries.

Each summary is a ``## <date>, commit <sha>, part bench`` section of
``benchmarks/RESULTS.md`` (or a ``summary.md`` written by ``.ci/gpu``).
For every row both have, prints cudamem's figure in each and how much
worse the second is (times: higher is worse; GB/s and k/s: lower is
worse), worst first.  Two runs on two machines of the same kind differ
by their own noise too: a row is only worth a look past the ``--flag``
fraction (default 0.10).

With ``--peers`` the machine's share is taken out: for each row, the
median change of the other columns (CuPy, PyTorch, the bare driver...)
that both runs have, and cudamem's change relative to it; a row with no
such column is set against the median of all rows' peer changes (printed
last).  Rows are then sorted and flagged by the relative change.

    python tools/bench_diff.py benchmarks/RESULTS.md cea94cc a016b9f
    python tools/bench_diff.py OLD_summary.md - NEW_summary.md - --peers
"""
import argparse
import re
import sys

ROW = re.compile(r"^- (?P<row>.+?)(?: \([^)]*\))?: (?P<vals>.+?)"
                 r"(?:; vs best peer.*|; vs bare driver.*)?$")
VAL = re.compile(r"(?:^|, )(?P<lib>[\w.-]+) (?P<v>[0-9.]+)"
                 r"(?: (?P<u>GB/s|k/s))?")


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
    """{row: (value, higher_is_better, {peer: value})} for cudamem's
    figure of each row and the other columns'."""
    rows = {}
    for line in lines:
        m = ROW.match(line)
        if not m:
            continue
        cols = {v.group("lib"): (float(v.group("v")), v.group("u"))
                for v in VAL.finditer(m.group("vals"))}
        if "cudamem" not in cols:
            continue
        v, unit = cols.pop("cudamem")
        rows[m.group("row")] = (v, unit in ("GB/s", "k/s"),
                                {k: c[0] for k, c in cols.items()})
    return rows


def worse_by(o, n, rate):
    """How much worse n is than o, as a fraction (None: not comparable)."""
    if o <= 0 or n <= 0:
        return None
    return (o / n - 1.0) if rate else (n / o - 1.0)


def median(xs):
    xs = sorted(xs)
    k = len(xs) // 2
    return xs[k] if len(xs) % 2 else 0.5 * (xs[k - 1] + xs[k])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old_file")
    ap.add_argument("old_sha")
    ap.add_argument("new_file_or_sha")
    ap.add_argument("new_sha", nargs="?")
    ap.add_argument("--flag", type=float, default=0.10)
    ap.add_argument("--peers", action="store_true",
                    help="set each row against its peers' change")
    a = ap.parse_args(argv)
    if a.new_sha is None:       # both sections in one file
        new_file, new_sha = a.old_file, a.new_file_or_sha
    else:
        new_file, new_sha = a.new_file_or_sha, a.new_sha
    old = figures(section(a.old_file, a.old_sha))
    new = figures(section(new_file, new_sha))
    out = []
    for row in old.keys() & new.keys():
        (o, rate, op), (n, _, np_) = old[row], new[row]
        worse = worse_by(o, n, rate)
        if worse is None:
            continue
        peer = [w for w in (worse_by(op[k], np_[k], rate)
                            for k in op.keys() & np_.keys())
                if w is not None]
        out.append([worse, row, o, n, median(peer) if peer else None])
    machine = [r[4] for r in out if r[4] is not None]
    machine = median(machine) if machine else 0.0
    if a.peers:
        for r in out:
            r.append((1.0 + r[0]) / (1.0 + (machine if r[4] is None
                                            else r[4])) - 1.0)
    out.sort(key=lambda r: r[-1] if a.peers else r[0], reverse=True)
    flagged = 0
    for r in out:
        worse, row, o, n = r[:4]
        key = r[-1] if a.peers else worse
        mark = "  <--" if key > a.flag else ""
        flagged += bool(mark)
        extra = ""
        if a.peers:
            extra = "  peers %s  rel %+7.1f%%" % (
                "     -  " if r[4] is None else "%+7.1f%%" % (100 * r[4]),
                100 * r[5])
        print("%+7.1f%%  %-52s %10.2f -> %-10.2f%s%s"
              % (100 * worse, row[:52], o, n, extra, mark))
    print("%d rows in both; %d worse by more than %.0f%%%s; only in the "
          "old: %d; only in the new: %d"
          % (len(out), flagged, 100 * a.flag,
             " (relative to the peers)" if a.peers else "",
             len(old.keys() - new.keys()), len(new.keys() - old.keys())))
    if a.peers:
        print("the peers' median change over %d rows: %+.1f%% (the rows "
              "with no peer are set against it)"
              % (len([r for r in out if r[4] is not None]), 100 * machine))


if __name__ == "__main__":
    main()
