# SPDX-License-Identifier: MIT
"""One array moved between two Dask workers: a LocalCluster of two worker
processes (TCP, one thread each); the array is made on the first worker
and a task on the second reads it, so the time covers serialising it,
sending it, and rebuilding it there (for a device array: device to host,
TCP, host to device).

    python benchmarks/dask_transfer.py [--size 256MiB] [--repeats 5]

Rows (each where it can run here):

- ``numpy``: a NumPy array of the same size, the host-only reference;
- ``cudamem``: a DeviceNDArray through cudamem.dask's serialisers (the
  "dask" family: host frames over TCP);
- ``cudamem, pickled``: the same array wrapped so that no serialiser of
  cudamem.dask applies and distributed falls back to pickle; a
  DeviceNDArray does not pickle, so this row says so instead of timing;
- ``cupy`` and ``numba``: their device arrays through distributed's own
  serialisers, where those libraries are installed and see a device.

The first transfer of each kind is a warm-up; the table gives the median,
fastest and slowest of the rest in seconds and the median's GB/s, and the
receiving task checks the first and last element.  On the simulator
(CUDAMEM_SIMULATOR=1) the device is host memory and ``--size 16MiB``
keeps it short.
"""

import argparse
import os
import re
import statistics
import sys
import time

KINDS = ("numpy", "cudamem", "cudamem, pickled", "cupy", "numba")


def _parse_size(text):
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]i?B?)?\s*", text, re.I)
    if not m:
        raise argparse.ArgumentTypeError("a size like 256MiB, not %r" % text)
    unit = (m.group(2) or "").upper()[:1]
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[unit]


class Boxed:
    """An array inside an object no serialiser knows: distributed pickles
    it (and the array with it)."""

    def __init__(self, a):
        self.a = a


def make(kind, nbytes, seed):
    """Run on the sending worker: the array, filled with seed."""
    import numpy as np

    host = np.full(nbytes // 8, float(seed))
    if kind == "numpy":
        return host
    if kind.startswith("cudamem"):
        import cudamem

        d = cudamem.to_device(host)
        return Boxed(d) if kind == "cudamem, pickled" else d
    if kind == "cupy":
        import cupy

        return cupy.asarray(host)
    if kind == "numba":
        _numba_shim()
        from numba import cuda

        return cuda.to_device(host)
    raise ValueError(kind)


def _numba_shim():
    import numpy as np

    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack   # numba-cuda 0.30 under NumPy 2.5


def check(x, seed):
    """Run on the receiving worker: the first and last element."""
    a = x.a if isinstance(x, Boxed) else x
    if hasattr(a, "copy_to_host"):                  # cudamem, numba
        ends = (a[:1].copy_to_host()[0], a[-1:].copy_to_host()[0])
    elif hasattr(a, "get"):                         # cupy
        ends = (float(a[0].get()), float(a[-1].get()))
    else:
        ends = (a[0], a[-1])
    if ends != (float(seed), float(seed)):
        raise AssertionError("arrived wrong: %r" % (ends,))
    return type(a).__module__ + "." + type(a).__name__


def pickles():
    """Run on a worker: None if a DeviceNDArray pickles, else why not (a
    transfer of one that does not pickle leaves distributed retrying)."""
    import pickle

    import numpy as np

    import cudamem

    try:
        pickle.dumps(cudamem.to_device(np.zeros(1)))
    except Exception as e:  # noqa: BLE001 - the reason is the answer
        return "a DeviceNDArray does not pickle (%s: %s)" % (
            type(e).__name__, e)
    return None


def _available(kind):
    """None if kind can run here, else why not."""
    try:
        if kind == "cupy":
            import cupy

            cupy.cuda.runtime.getDeviceCount()
        elif kind == "numba":
            if os.environ.get("CUDAMEM_SIMULATOR", "0") not in ("0", ""):
                return "the simulator is not numba's"
            _numba_shim()
            from numba import cuda

            cuda.current_context()
    except Exception as e:  # noqa: BLE001 - any failure means "not here"
        return "%s: %s" % (type(e).__name__, str(e)[:60])
    return None


def run(size, repeats, kinds=KINDS, out=sys.stdout):
    """Time each kind; a list of row dicts (kind, seconds or reason)."""
    from distributed import Client, LocalCluster, wait

    rows = []
    with LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                      dashboard_address=None,
                      protocol="tcp://") as lc, Client(lc) as client:
        w0, w1 = sorted(client.scheduler_info()["workers"])
        for kind in kinds:
            why = _available(kind)
            if why is None and kind == "cudamem, pickled":
                why = client.submit(pickles, workers=[w0],
                                    pure=False).result()
            if why is not None:
                rows.append({"kind": kind, "skipped": why})
                continue
            times = []
            arrived = None
            try:
                for seed in range(repeats + 1):
                    x = client.submit(make, kind, size, seed, workers=[w0],
                                      pure=False)
                    wait(x)
                    t0 = time.perf_counter()
                    y = client.submit(check, x, seed, workers=[w1],
                                      pure=False)
                    arrived = y.result(timeout=60 + size / 50e6)
                    dt = time.perf_counter() - t0
                    if seed:
                        times.append(dt)
                    del x, y
            except Exception as e:  # noqa: BLE001 - reported in the table
                rows.append({"kind": kind, "failed": "%s: %s" % (
                    type(e).__name__, str(e).splitlines()[0][:90])})
                continue
            times.sort()
            rows.append({"kind": kind, "arrived_as": arrived,
                         "median_s": statistics.median(times),
                         "min_s": times[0], "max_s": times[-1]})
    return rows


def format_table(rows, size):
    lines = ["Dask: one %s array from one worker to the other (TCP, two "
             "worker processes)" % _fmt(size),
             "%-18s %10s %10s %10s %9s" % ("array", "median s", "min s",
                                           "max s", "GB/s")]
    for r in rows:
        if "median_s" in r:
            lines.append("%-18s %10.4f %10.4f %10.4f %9.2f" % (
                r["kind"], r["median_s"], r["min_s"], r["max_s"],
                size / r["median_s"] / 1e9))
        else:
            lines.append("%-18s %s" % (r["kind"], "not run: " + r.get(
                "skipped", "") if "skipped" in r else "failed: "
                + r["failed"]))
    return "\n".join(lines)


def _fmt(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return "%d %s" % (n >> shift, unit)
    return "%d B" % n


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=_parse_size, default=256 << 20,
                    help="bytes per array, e.g. 256MiB (the default) or "
                         "16MiB on the simulator")
    ap.add_argument("--repeats", type=int, default=5,
                    help="timed transfers per kind (after one warm-up)")
    ap.add_argument("-k", "--kind", action="append", choices=KINDS,
                    help="only this kind (repeatable)")
    args = ap.parse_args(argv)
    if args.size < 16 or args.size % 8:
        ap.error("--size must be a positive multiple of 8 bytes")
    try:
        import distributed  # noqa: F401
    except ImportError:
        print("distributed is not installed (pip install dask distributed)")
        return 2
    sim = os.environ.get("CUDAMEM_SIMULATOR", "0") not in ("0", "")
    t0 = time.perf_counter()
    rows = run(args.size, args.repeats, tuple(args.kind or KINDS))
    print(format_table(rows, args.size))
    if sim:
        print("(simulated: the device is host memory on the CPU simulator)")
    print("(%.1f s)" % (time.perf_counter() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
