"""Synchronous copies of 64 KiB, 1 MiB and 16 MiB, pinned and pageable,
both directions: cudamem's ``copy_to_device`` / ``copy_to_host`` against
the bare driver call (``_core._memcpy_htod`` / ``_memcpy_dtoh``: one
cuMemcpyHtoD / DtoH) and CuPy's ``runtime.memcpy`` when it is installed,
on the same host and device buffers, interleaved call by call (the order
reversed every other round), so that a difference between the columns is
not the order the libraries were timed in or the link warming up.  Each
call is timed with a ``cudamem.synchronize()`` after it, the context
synchronised before: a copy from pageable memory returns before its
bytes land, and back to back the next call would pay for them.

Where the side-by-side benchmark shows cudamem behind the driver on a
row, this says whether the gap is cudamem's or the timing's.

    python tools/copy_probe.py [ROUNDS]
    python tools/copy_probe.py tight SIZE[,SIZE...]

Prints, per size and host memory, the median GB/s of each column.  Then
the sizes where the asynchronous call gains for a synchronous copy of
pageable memory to the device (1 KiB to 1 MiB): cudamem's copy with
``_sync_copy_call`` 'async' (``cuMemcpyHtoDAsync`` on the default
stream, after its pointer query) and 'sync' (``cuMemcpyHtoD``), the bare
``cuMemcpyHtoD``, and CuPy's ``memcpyAsync`` on the legacy stream (the
bare asynchronous call); the mode is set outside the timed call, and
the context synchronised before it.  Twice: the call alone, then the
call and a synchronize (the bytes landed): back to back, what one call
leaves in flight would be paid by the next.  Where 'sync' overtakes
'async' is the limit to give ``CUDAMEM_SYNC_ASYNC_MAX``.  Between the
two, the bare C program's round trips and synchronous copies of 1 and
64 KiB of page-locked memory through the host-to-device / device-to-host
entry points and through the unified ones (``entry_points``).
"""
import os
import statistics
import sys
import time

import numpy as np

import cudamem
from cudamem import _core
from benchpath import bench_modules

try:
    import cupy
except ImportError:
    cupy = None

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() \
    else 300
SIZES = (64 << 10, 1 << 20, 16 << 20)


def columns(n, pinned):
    """{name: callable} over one host buffer and one device buffer."""
    if pinned:
        h = cudamem.pinned_array(n, np.uint8)
    else:
        h = np.empty(n, np.uint8)
    h[:] = 1
    d = cudamem.device_array(n, np.uint8)
    p = d.device_ctypes_pointer.value
    cols = {"cudamem htod": lambda: d.copy_to_device(h),
            "driver htod": lambda: _core._memcpy_htod(p, h),
            "cudamem dtoh": lambda: d.copy_to_host(h),
            "driver dtoh": lambda: _core._memcpy_dtoh(h, p)}
    if cupy is not None:
        rt = cupy.cuda.runtime
        hp = h.ctypes.data
        cols["cupy htod"] = lambda: rt.memcpy(p, hp, n,
                                              rt.memcpyHostToDevice)
        cols["cupy dtoh"] = lambda: rt.memcpy(hp, p, n,
                                              rt.memcpyDeviceToHost)
    return cols


def main():
    name = cudamem.get_current_device().name
    if isinstance(name, bytes):
        name = name.decode()
    print("cudamem %s on %s" % (cudamem.__version__, name))
    if os.environ.get("CUDAMEM_SIMULATOR") == "1":
        print("(the simulator: its figures are not a GPU's)")
    for n in SIZES:
        rounds = ROUNDS if n < (16 << 20) else max(ROUNDS // 4, 20)
        for pinned in (True, False):
            cols = columns(n, pinned)
            names = list(cols)
            for f in cols.values():
                for _ in range(5):
                    f()
            times = {k: [] for k in names}
            sync = cudamem.synchronize
            for r in range(rounds):
                for k in (names if r % 2 else names[::-1]):
                    sync()
                    t = time.perf_counter()
                    cols[k]()
                    sync()
                    times[k].append(time.perf_counter() - t)
            print("%6d KiB %-8s " % (n >> 10, "pinned" if pinned
                                      else "pageable")
                  + "  ".join("%s %.2f" % (k, n / statistics.median(v) / 1e9)
                              for k, v in times.items()) + "  (GB/s)",
                  flush=True)


CROSS_SIZES = (1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20)


def cross_columns(n):
    """{name: (mode or None, callable)} over one pageable host buffer and
    one device buffer of n bytes."""
    h = np.ones(n, np.uint8)
    d = cudamem.device_array(n, np.uint8)
    p = d.device_ctypes_pointer.value
    cols = {"cudamem async": ("async/sync", lambda: d.copy_to_device(h)),
            "cudamem sync": ("sync", lambda: d.copy_to_device(h)),
            "driver sync": (None, lambda: _core._memcpy_htod(p, h))}
    if cupy is not None:
        rt = cupy.cuda.runtime
        hp = h.ctypes.data
        cols["cupy async"] = (None, lambda: rt.memcpyAsync(
            p, hp, n, rt.memcpyHostToDevice, 0))
    return cols


def crossover(landed):
    """Pageable host to device: the asynchronous call against the
    synchronous one, per size.  Both return before the bytes land (the
    driver stages pageable memory and returns), and the synchronous one
    first waits for the stream's earlier work: timed back to back, what
    one column leaves in flight is paid by the next.  So each column is
    timed twice over: the call alone, the context synchronised before it
    (untimed), and with landed, the call and cudamem.synchronize() after
    it (the bytes on the device)."""
    old = _core._sync_copy_call()
    sync = cudamem.synchronize
    try:
        for n in CROSS_SIZES:
            cols = cross_columns(n)
            names = list(cols)
            times = {k: [] for k in names}
            for r in range(ROUNDS):
                for k in (names if r % 2 else names[::-1]):
                    mode, f = cols[k]
                    if mode is not None:
                        _core._sync_copy_call(mode)
                    sync()
                    t = time.perf_counter()
                    f()
                    if landed:
                        sync()
                    times[k].append(time.perf_counter() - t)
            sync()
            print("%6d KiB pageable htod, %s: " % (
                      n >> 10, "the call and a synchronize" if landed
                      else "the call")
                  + "  ".join("%s %.2f" % (k, statistics.median(v) * 1e6)
                              for k, v in times.items()) + "  (us)",
                  flush=True)
    finally:
        _core._sync_copy_call(old)


def entry_points():
    """The bare C program (benchmarks/bare_driver.c) with page-locked
    buffers of 1 KiB and 64 KiB, through the driver's host-to-device and
    device-to-host entry points and through the unified ones
    (cuMemcpyAsync / cuMemcpy, which the runtime's cudaMemcpy[Async] may
    take): one thread's round trips on a stream (the ``round trip ...
    pinned [1 thread]`` rows' driver column), and synchronous copies
    both ways.  Where the unified calls are faster, cudamem's copies of
    page-locked memory could make them."""
    bare_driver, _ = bench_modules()
    for n in (1 << 10, 64 << 10):
        try:
            rt = {m: bare_driver.run("roundtrip", 1, n, m, 21, 20)[0]
                  for m in ("pinned", "pinned-generic")}
            cp = {(d, c): bare_driver.run("copy", d, c, n, 21, 20)[0]
                  for d in ("htod", "dtoh")
                  for c in ("pinned", "pinned-generic")}
        except Exception as e:   # no compiler, no driver: say so
            print("bare_driver: %s" % e)
            return
        print("%6d KiB pinned, bare C: round trip htod/dtoh %.2f, "
              "generic %.2f; copy htod %.2f, generic %.2f; dtoh %.2f, "
              "generic %.2f  (us)"
              % (n >> 10, rt["pinned"] * 1e6, rt["pinned-generic"] * 1e6,
                 cp["htod", "pinned"] * 1e6,
                 cp["htod", "pinned-generic"] * 1e6,
                 cp["dtoh", "pinned"] * 1e6,
                 cp["dtoh", "pinned-generic"] * 1e6), flush=True)


def cupy_own(n):
    """CuPy's copies between buffers CuPy allocated: the benchmark's CuPy
    column (ops_hostmem._bw_cupy).  Where cudamem and CuPy differ on the
    benchmark's rows (each library on its own buffers) but not here on
    shared ones, the difference is the buffers'."""
    bench_modules()                 # benchmarks/ on sys.path
    import ops_hostmem

    return {"cupy-own htod": ops_hostmem._bw_cupy(n, True)(cupy),
            "cupy-own dtoh": ops_hostmem._bw_cupy(n, False)(cupy)}


def async_sync(n):
    """cudamem's copy of page-locked memory on the default stream, then
    that stream's synchronize: two driver calls (cuMemcpy...Async on the
    legacy stream, cuStreamSynchronize) where the synchronous copy makes
    one, with the same result.  Whether the driver's wait in
    cuStreamSynchronize returns sooner than the one inside the
    synchronous call."""
    h = cudamem.pinned_array(n, np.uint8)
    h[:] = 1
    d = cudamem.device_array(n, np.uint8)
    s = cudamem.default_stream()

    def htod():
        d.copy_to_device(h, stream=s)
        s.synchronize()

    def dtoh():
        d.copy_to_host(h, stream=s)
        s.synchronize()
    return {"async+sync htod": htod, "async+sync dtoh": dtoh}


def tight(n=64 << 10):
    """n bytes (64 KiB) of page-locked memory, each column timed the way the
    side-by-side benchmark times a row: calls back to back, 2 ms a
    sample (benchmarks/harness.py's loop), no synchronize: cudamem's
    copy, the bare driver call from Python, CuPy's, and the bare C loop
    (benchmarks/bare_driver.c, the rows' driver column), the columns
    alternated over rounds.  The interleaved figures above time one call
    at a time; where the benchmark's rows put every Python column below
    the C loop and these agree with them, the gap is the loop's, not
    cudamem's.  Then n bytes of pageable memory to the host, the same
    way (no C column: bare_driver.c copies pinned memory here).  With CuPy,
    also CuPy's copy between its own buffers (cupy_own)."""
    bare_driver, harness = bench_modules()
    for pinned in (True, False):
        cols = columns(n, pinned)
        if pinned:
            cols.update(async_sync(n))
        if pinned and cupy is not None:
            cols.update(cupy_own(n))
        for way in ("htod", "dtoh") if pinned else ("dtoh",):
            fns = {k: f for k, f in cols.items() if k.endswith(way)}
            if pinned:
                try:
                    bare_driver.run("copy", way, "pinned", n, 1, 1)
                    fns["C loop " + way] = lambda way=way: bare_driver.run(
                        "copy", way, "pinned", n, 11, 2)[0]
                except Exception as e:   # no compiler, no driver
                    print("tight: bare_driver: %s" % e)

            def measure(k, fns=fns):
                if k.startswith("C loop"):
                    return fns[k]()
                return harness.time_callable(fns[k], repeats=11)[0]
            times = harness.alternated(measure, fns, 7)
            cudamem.synchronize()
            print("%6d KiB %-8s back to back: " % (
                      n >> 10, "pinned" if pinned else "pageable")
                  + "  ".join("%s %.2f" % (k, statistics.median(v) * 1e6)
                              for k, v in times.items()) + "  (us)",
                  flush=True)



if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "tight":
        # python tools/copy_probe.py tight 65536,1048576: tight() alone
        for size in sys.argv[2].split(","):
            tight(int(size))
        sys.exit(0)
    main()
    entry_points()
    tight()
    crossover(False)
    crossover(True)
