"""Whether a synchronous copy of pageable memory to the host, 16 KiB to
4 MiB, lands sooner through a page-locked buffer of cudamem's than
through the driver's synchronous call on the pageable memory (the
measurement behind the staging pipeline's one-buffer route,
``CUDAMEM_STAGING_BOUNCE``, and its check on a GPU).

Columns, each timed back to back the way the side-by-side benchmark
times a row (benchmarks/harness.py: 2 ms a sample, no synchronize; a
copy to the host has landed when it returns), alternated over rounds:

- ``direct``: ``d.copy_to_host(h)``, ``h`` a touched pageable array,
  with the one-buffer route off for the column (``_staging_config(
  bounce=0)``): below the staging threshold, the driver's cuMemcpyDtoH;
- ``cudamem``: the same call with the tunables as the process found
  them (by default, 16 KiB to 1 MiB through one staging buffer);
- ``bounce``: ``d.copy_to_host(p)`` into a page-locked array, then
  ``np.copyto(h, p)``: two Python calls, so an upper bound on what the
  same steps cost in C;
- ``locked``: ``d.copy_to_host(p)`` alone, and ``memcpy``:
  ``np.copyto(h, p)`` alone, the two halves of ``bounce``;
- ``staged``: ``d.copy_to_host(h)`` with the staging pipeline's
  threshold lowered to 16 KiB for the column (the whole pipeline, its
  events and workers, at every size);
- ``C loop``: benchmarks/bare_driver.c's cuMemcpyDtoH into pageable
  memory (the rows' driver column), where it builds.

    python tools/bounce_probe.py [ROUNDS [KIB,KIB,...]]

Prints, per size and column, the median of the rounds' medians in µs
a copy and in GB/s.
"""
import os
import statistics
import sys

import numpy as np

import cudamem
from cudamem import _core
from benchpath import bench_modules

SIZES = (16 << 10, 64 << 10, 256 << 10, 1 << 20, 2 << 20, 4 << 20)




def columns(n):
    h = np.ones(n, np.uint8)
    p = cudamem.pinned_array(n, np.uint8)
    d = cudamem.to_device(np.full(n, 7, np.uint8))

    def bounce():
        d.copy_to_host(p)
        np.copyto(h, p)
    cols = {"direct": lambda: d.copy_to_host(h),
            "cudamem": lambda: d.copy_to_host(h),
            "staged": lambda: d.copy_to_host(h),
            "bounce": bounce,
            "locked": lambda: d.copy_to_host(p),
            "memcpy": lambda: np.copyto(h, p)}
    return cols, h, p


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    sizes = SIZES
    if len(sys.argv) > 2:
        sizes = tuple(int(k) << 10 for k in sys.argv[2].split(","))
    bare_driver, harness = bench_modules()
    name = cudamem.get_current_device().name
    if isinstance(name, bytes):
        name = name.decode()
    print("bounce_probe: %s, %d rounds" % (name, rounds))
    if os.environ.get("CUDAMEM_SIMULATOR") == "1":
        print("(the simulator: its figures are not a GPU's)")
    saved = _core._staging_config()
    for n in sizes:
        cols, h, p = columns(n)
        fns = dict(cols)
        try:
            bare_driver.run("copy", "dtoh", "sync", n, 1, 1)
            fns["C loop"] = lambda n=n: bare_driver.run(
                "copy", "dtoh", "sync", n, 11, 2)[0]
        except Exception as e:   # no compiler, no driver: say so
            print("bare_driver: %s" % e)

        def measure(k, fns=fns):
            if k == "C loop":
                return fns[k]()
            if k == "staged":
                _core._staging_config(threshold=16 << 10)
            elif k == "direct":
                _core._staging_config(bounce=0)
            try:
                return harness.time_callable(fns[k], repeats=11)[0]
            finally:
                _core._staging_config(**saved)
        times = harness.alternated(measure, fns, rounds)
        assert (h == 7).all() and (p == 7).all(), "bytes did not land"
        line = ["%5d KiB" % (n >> 10)]
        for k, ts in times.items():
            t = statistics.median(ts)
            line.append("%s %.2f us %.1f GB/s" % (k, t * 1e6, n / t / 1e9))
        print("  ".join(line))


if __name__ == "__main__":
    main()
