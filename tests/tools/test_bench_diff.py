# SPDX-License-Identifier: MIT
"""tools/bench_diff.py: cudamem's figures in two bench summaries, worst
first, times and rates each read the right way round."""

import subprocess
import sys

from helpers import ROOT

RESULTS = """\
# Results

## 2026-01-01, commit aaa1111, part tests
- stream() create+drop (us, median): cudamem 9.00

## 2026-01-01, commit aaa1111, part bench
- device: X
- stream() create+drop (us, median): cudamem 0.50, cupy 8.57; vs best peer 0.1x
- event() create+drop (us, median): cudamem 1.00, cupy 1.21
- HtoD pinned 1 MiB: cudamem 40.0 GB/s, cupy 35.3 GB/s; vs best peer 1.00x
- only old (us, median): cudamem 1.00

## 2026-01-02, commit bbb2222, part bench
- stream() create+drop (us, median): cuda.core 8.90, cudamem 1.00
- event() create+drop (us, median): cudamem 0.95, cupy 1.21
- HtoD pinned 1 MiB: cudamem 20.0 GB/s, cupy 35.3 GB/s
- round trip 1 KiB GIL auto [2 threads] (us, median): cudamem 8.00
"""


def run(*args):
    return subprocess.run([sys.executable,
                           str(ROOT / "tools" / "bench_diff.py"), *args],
                          capture_output=True, text=True, timeout=60)


def test_rows_worst_first_with_rates_inverted(tmp_path):
    f = tmp_path / "RESULTS.md"
    f.write_text(RESULTS)
    p = run(str(f), "aaa1111", "bbb2222")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    # Time 0.50 -> 1.00 and bandwidth 40 -> 20 GB/s are both 100 % worse;
    # 1.00 -> 0.95 us is better.  The tests section's row is not read.
    assert [ln.split()[0] for ln in lines[:3]] == ["+100.0%", "+100.0%",
                                                   "-5.0%"]
    assert lines[0].endswith("<--") and lines[1].endswith("<--")
    assert "event() create+drop" in lines[2]
    assert not lines[2].endswith("<--")
    assert lines[-1] == ("3 rows in both; 2 worse by more than 10%; only in "
                         "the old: 1; only in the new: 1")


def test_two_files_and_a_missing_section(tmp_path):
    old = tmp_path / "old.md"
    new = tmp_path / "new.md"
    old.write_text(RESULTS)
    new.write_text(RESULTS.split("## 2026-01-02")[0].replace(
        "cudamem 0.50", "cudamem 0.52"))
    p = run(str(old), "aaa1111", str(new), "-", "--flag", "0.01")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[0].startswith("   +4.0%  stream()")
    p = run(str(old), "ccc3333", "bbb2222")
    assert p.returncode != 0
    assert "no bench section for ccc3333" in p.stderr


def test_peers_take_the_machine_out(tmp_path):
    """--peers: a row whose peers slowed as much as cudamem did is not
    flagged; one where cudamem alone slowed is; a row with no peer is set
    against the median of the peers' changes."""
    f = tmp_path / "RESULTS.md"
    f.write_text("""\
## 2026-01-01, commit aaa1111, part bench
- a (us, median): cudamem 1.00, cupy 2.00, torch 4.00
- b (us, median): cudamem 1.00, cupy 2.00
- c (us, median): cudamem 1.00
- d: cudamem 40.0 GB/s, driver 40.0 GB/s

## 2026-01-02, commit bbb2222, part bench
- a (us, median): cudamem 2.00, cupy 4.00, torch 8.00
- b (us, median): cudamem 2.00, cupy 2.00
- c (us, median): cudamem 1.50
- d: cudamem 20.0 GB/s, driver 20.0 GB/s
""")
    p = run(str(f), "aaa1111", "bbb2222", "--peers")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    by_row = {ln.split()[1]: ln for ln in lines[:4]}
    # b: +100 %, its peer unchanged; c: +50 % against the median of the
    # peers' changes (+100 %, +0 %, +100 %: +100 %), so -25 %.
    assert lines[0].split()[1] == "b" and lines[0].endswith("<--")
    assert "rel  +100.0%" in by_row["b"]
    assert "rel    +0.0%" in by_row["a"] and not by_row["a"].endswith("<--")
    assert "rel    +0.0%" in by_row["d"]
    assert "peers      -" in by_row["c"] and "rel   -25.0%" in by_row["c"]
    assert lines[-2].startswith("4 rows in both; 1 worse by more than 10% "
                                "(relative to the peers)")
    assert lines[-1].startswith("the peers' median change over 3 rows: "
                                "+100.0%")
