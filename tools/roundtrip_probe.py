"""Where a round trip of 64 KiB of page-locked memory on a stream goes:
a copy to the device, a copy back, a synchronize of the stream (the
``round trip 64 KiB pinned [1 thread]`` row of benchmarks/ops_threads.py),
made by cudamem, by CuPy, and by CuPy's runtime calls over the other
library's memory and streams, so that a difference between two columns
is one of: the calls, the host memory, the device memory, the stream.

    python tools/roundtrip_probe.py [SIZE_KIB]

Columns (each a tight loop of round trips, 2 ms a sample, the columns
alternated over rounds; microseconds per round trip, median):

- ``cm``: cudamem's ``copy_to_device(h, stream=s)``,
  ``copy_to_host(out, stream=s)``, ``s.synchronize()`` on
  ``pinned_array`` / ``device_array`` / ``cudamem.stream()``;
- ``cp``: CuPy's ``set`` / ``get(blocking=False)`` / ``synchronize`` on
  ``cupyx.empty_pinned`` / ``cupy.empty`` / a blocking CuPy stream;
- ``rt(H,D,S)``: CuPy's ``runtime.memcpyAsync`` both ways and
  ``runtime.streamSynchronize`` with host memory H, device memory D and
  stream S each cudamem's (m) or CuPy's (p);
- ``torch`` (when PyTorch is installed): ``copy_(non_blocking=True)``
  both ways and the stream's ``synchronize``;
- ``C``: benchmarks/bare_driver.c's round trip (cuMemcpyHtoDAsync,
  cuMemcpyDtoHAsync, cuStreamSynchronize in a C loop, a process of its
  own).
Never run from the test suite.
"""
import os
import statistics
import sys

import numpy as np

import cudamem

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, "benchmarks"))

import harness  # noqa: E402

ROUNDS = 5


def columns(n):
    cols = {}
    s = cudamem.stream()
    h = cudamem.pinned_array(n, np.uint8)
    out = cudamem.pinned_array(n, np.uint8)
    h[:] = 1
    d = cudamem.device_array(n, np.uint8)
    to_dev, to_host, sync = d.copy_to_device, d.copy_to_host, s.synchronize

    def cm():
        to_dev(h, stream=s)
        to_host(out, stream=s)
        sync()
    cols["cm"] = cm
    try:
        import cupy
        import cupyx
    except ImportError:
        print("no CuPy: cudamem's column only")
        return cols
    ps = cupy.cuda.Stream(non_blocking=False)
    ph = cupyx.empty_pinned((n,), np.uint8)
    pout = cupyx.empty_pinned((n,), np.uint8)
    ph[:] = 1
    pd = cupy.empty(n, np.uint8)
    put, psync = pd.set, ps.synchronize

    def cp():
        put(ph, stream=ps)
        pd.get(stream=ps, out=pout, blocking=False)
        psync()
    cols["cp"] = cp
    rt = cupy.cuda.runtime
    hosts = {"m": (h.ctypes.data, out.ctypes.data),
             "p": (ph.ctypes.data, pout.ctypes.data)}
    devs = {"m": d.device_ctypes_pointer.value, "p": pd.data.ptr}
    strs = {"m": int(s.handle), "p": ps.ptr}
    for key in ("mmm", "pmm", "mpm", "mmp", "ppp"):
        hp, op = hosts[key[0]]
        dp = devs[key[1]]
        sp = strs[key[2]]

        def step(hp=hp, op=op, dp=dp, sp=sp, f=rt.memcpyAsync,
                 w=rt.streamSynchronize):
            f(dp, hp, n, 1, sp)
            f(op, dp, n, 2, sp)
            w(sp)
        cols["rt(%s,%s,%s)" % tuple(key)] = step
    try:
        import torch
    except ImportError:
        return cols
    ts = torch.cuda.Stream()
    th = torch.ones(n, dtype=torch.uint8, pin_memory=True)
    tout = torch.zeros(n, dtype=torch.uint8, pin_memory=True)
    td = torch.empty(n, dtype=torch.uint8, device="cuda")

    torch.cuda.set_stream(ts)      # this thread's current stream
    tsync = ts.synchronize

    def tc():
        td.copy_(th, non_blocking=True)
        tout.copy_(td, non_blocking=True)
        tsync()
    cols["torch"] = tc
    return cols


def main():
    n = (int(sys.argv[1]) if len(sys.argv) > 1 else 64) << 10
    cols = columns(n)
    try:
        import bare_driver
        bare_driver.run("roundtrip", 1, n, "pinned", 1, 1)
        cols["C"] = lambda: bare_driver.run("roundtrip", 1, n, "pinned",
                                            11, 20)[0]
    except Exception as e:   # no compiler, no driver: say so
        print("no C column: %s" % e)

    def measure(k):
        if k == "C":
            return cols[k]()
        return harness.time_callable(cols[k], repeats=11)[0]
    times = harness.alternated(measure, cols, ROUNDS)
    cudamem.synchronize()
    print("%d KiB pinned round trip on a stream (us): " % (n >> 10)
          + "  ".join("%s %.2f" % (k, statistics.median(v) * 1e6)
                      for k, v in times.items()), flush=True)

if __name__ == "__main__":
    main()
