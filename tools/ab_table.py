# SPDX-License-Identifier: MIT
"""The table of an A/B run (tools/ab_bench.sh): for each row, the median
of tree A's round medians and of tree B's, the spread of the round
medians (lowest-highest), B/A, and in how many rounds B's median was
below A's.

    python tools/ab_table.py [--a LABEL] [--b LABEL] ab-round-*.json

Rows in k/s (the thread rows) and GB/s (rows with bytes) are compared as
times too: B/A below 1 is B faster.
"""

import argparse
import json
import pathlib
import re
import statistics
import sys


def load(paths):
    """{side: {row: [round medians, in round order]}}, the row order."""
    got = {"A": {}, "B": {}}
    order = []
    named = []
    for p in paths:
        m = re.search(r"round-(\d+)-([AB])\.json$", str(p))
        if not m:
            raise SystemExit("%s: not an ab-round-<r>-<A|B>.json file" % p)
        named.append((int(m.group(1)), m.group(2), p))
    for _, side, p in sorted(named):
        for row in json.loads(pathlib.Path(p).read_text()):
            t = row.get("times", {}).get("cudamem")
            if t is None:
                continue
            if row["op"] not in order:
                order.append(row["op"])
            got[side].setdefault(row["op"], []).append(t[0])
    return got, order


def table(got, order):
    lines = ["%-40s %-24s %-24s %6s %7s" % (
        "row (us: median of round medians [range])", "A", "B", "B/A",
        "B<A")]
    for op in order:
        a = got["A"].get(op, [])
        b = got["B"].get(op, [])

        def cell(xs):
            if not xs:
                return "-"
            return "%.2f [%.2f-%.2f]" % (statistics.median(xs) * 1e6,
                                         min(xs) * 1e6, max(xs) * 1e6)

        ratio = "-"
        wins = "-"
        if a and b:
            ratio = "%.2f" % (statistics.median(b) / statistics.median(a))
            n = min(len(a), len(b))
            wins = "%d/%d" % (sum(1 for i in range(n) if b[i] < a[i]), n)
        lines.append("%-40s %-24s %-24s %6s %7s" % (
            op[:40], cell(a), cell(b), ratio, wins))
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", default="A", help="what A is (printed)")
    ap.add_argument("--b", default="B", help="what B is (printed)")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args(argv)
    got, order = load(args.files)
    rounds = {s: max((len(v) for v in got[s].values()), default=0)
              for s in "AB"}
    print("A/B: A = %s, B = %s; %d / %d rounds" % (args.a, args.b,
                                                   rounds["A"], rounds["B"]))
    if not order:
        print("no row timed")
        return 1
    print(table(got, order))
    return 0


if __name__ == "__main__":
    sys.exit(main())
