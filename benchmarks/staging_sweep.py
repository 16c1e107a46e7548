# SPDX-License-Identifier: MIT
"""Sweep the staging pipeline's tunables on the GPU machine: cudamem's
pageable HtoD / DtoH bandwidth per (threads, chunk, buffers), one fresh
process per setting (the tunables are read from the environment), so the
defaults in csrc/memory/staging/staging.c and the README can be chosen by
measurement.

    python benchmarks/staging_sweep.py [--sizes 16,64,256,1024] \
        [--threads 1,2,4,8,16] [--chunks 2,4,8,16] [--buffers 2,3,4] \
        [--ramps 0,2,3] [--nts 0,1] [--spins 0,50]
        [--huges 0,1] [--repeats 7]

Sizes and chunks are in MiB.  Prints one line per setting and size:
GB/s host to device and device to host, then per chunk (from the
pipeline's counters, _core._staging_stats) the microseconds spent waiting
for a buffer's copy, staging on the host, issuing copies, and in all.
Never run from the test suite.
"""

import argparse
import itertools
import json
import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent

CHILD = r"""
import json, sys, time
import numpy as np
sys.path.insert(0, %(root)r)
import cudamem
from cudamem import _core
KEYS = ("chunks", "wait_ns", "stage_ns", "issue_ns", "total_ns")
sizes, repeats = %(sizes)r, %(repeats)d
out = {}
for mib in sizes:
    n = mib << 20
    h = np.ones(n, np.uint8)
    d = cudamem.device_array(n, np.uint8)
    row = []
    for fn in (lambda: d.copy_to_device(h), lambda: d.copy_to_host(h)):
        fn()
        ts = []
        st0 = _core._staging_stats()
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        st1 = _core._staging_stats()
        ts.sort()
        grew = {k: st1[k] - st0[k] for k in KEYS}
        per = max(grew["chunks"], 1)
        # GB/s, then per chunk (us): chunks per copy, time waiting for a
        # buffer's copy, staging on the host, issuing, and in all.
        row.append([n / ts[len(ts) // 2] / 1e9,
                    grew["chunks"] / repeats,
                    grew["wait_ns"] / per / 1e3,
                    grew["stage_ns"] / per / 1e3,
                    grew["issue_ns"] / per / 1e3,
                    grew["total_ns"] / per / 1e3])
    out[mib] = row
    del d
print(json.dumps(out))
"""


def ints(s):
    return [int(x) for x in s.split(",") if x]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=ints, default=[16, 64, 256, 1024])
    ap.add_argument("--threads", type=ints, default=[1, 2, 4, 8, 16])
    ap.add_argument("--chunks", type=ints, default=[2, 4, 8, 16])
    ap.add_argument("--buffers", type=ints, default=[2, 3, 4])
    ap.add_argument("--ramps", type=ints, default=[0],
                    help="CUDAMEM_STAGING_RAMP values (halvings of the "
                         "chunks at each end)")
    ap.add_argument("--nts", type=ints, default=[0],
                    help="CUDAMEM_STAGING_NT values (non-temporal "
                         "stores on the host side)")
    ap.add_argument("--spins", type=ints, default=[0],
                    help="CUDAMEM_STAGING_SPIN values (microseconds "
                         "a waiting thread polls before it sleeps)")
    ap.add_argument("--huges", type=ints, default=[0],
                    help="CUDAMEM_STAGING_HUGE values (staging buffers "
                         "on huge pages)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)

    code = CHILD % {"root": str(HERE.parent), "sizes": args.sizes,
                    "repeats": args.repeats}
    results = []
    print("%7s %6s %7s %4s %2s %4s %2s %8s %10s %10s   per chunk, us: "
          "wait/stage/issue/all (HtoD | DtoH), chunks"
          % ("threads", "chunk", "buffers", "ramp", "nt", "spin", "hp",
             "size", "HtoD GB/s", "DtoH GB/s"))
    for t, c, b, r, nt, sp, hp in itertools.product(
            args.threads, args.chunks, args.buffers, args.ramps, args.nts,
            args.spins, args.huges):
        env = dict(os.environ, CUDAMEM_STAGING="1",
                   CUDAMEM_STAGING_THREADS=str(t),
                   CUDAMEM_STAGING_CHUNK="%dM" % c,
                   CUDAMEM_STAGING_BUFFERS=str(b),
                   CUDAMEM_STAGING_RAMP=str(r),
                   CUDAMEM_STAGING_NT=str(nt),
                   CUDAMEM_STAGING_SPIN=str(sp),
                   CUDAMEM_STAGING_HUGE=str(hp),
                   CUDAMEM_STAGING_THRESHOLD="1M")
        p = subprocess.run([sys.executable, "-c", code], env=env,
                           capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            print("threads=%d chunk=%dM buffers=%d ramp=%d nt=%d spin=%d "
                  "huge=%d failed: %s" % (t, c, b, r, nt, sp, hp,
                                          p.stderr.strip()[-200:]))
            continue
        for mib, (h2d, d2h) in json.loads(p.stdout).items():
            print("%7d %5dM %7d %4d %2d %4d %2d %7sM %10.1f %10.1f   "
                  "%.0f/%.0f/%.0f/%.0f | %.0f/%.0f/%.0f/%.0f, %.0f"
                  % (t, c, b, r, nt, sp, hp, mib, h2d[0], d2h[0],
                     *h2d[2:], *d2h[2:], h2d[1]))
            results.append({"threads": t, "chunk_mib": c, "buffers": b,
                            "ramp": r, "nt": nt, "spin": sp, "huge": hp,
                            "size_mib": int(mib), "htod": h2d[0],
                            "dtoh": d2h[0], "chunks": h2d[1],
                            "htod_us_per_chunk": h2d[2:],
                            "dtoh_us_per_chunk": d2h[2:]})
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
