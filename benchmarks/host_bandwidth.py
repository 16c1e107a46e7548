# SPDX-License-Identifier: MIT
"""Host memory copy bandwidth on this machine: what bounds the staging
pipeline's host side (csrc/memory/staging/staging.c).

    python benchmarks/host_bandwidth.py

Prints GB/s of NumPy copies (memcpy, the GIL released) from a touched
pageable array into pageable memory, into a cudamem pinned array and into
pinned memory registered on huge pages, with 1, 2, 4 and 8 Python threads
each copying its own slice, for slices of 0.5 to 8 MiB; then the same
8-thread copy while the copy engine streams 256 MiB host to device from
pinned memory on another stream.  Never run from the test suite.
"""

import mmap
import statistics
import threading
import time

import numpy as np

import cudamem as cuda

MiB = 1 << 20


def _huge_pinned(n):
    m = mmap.mmap(-1, n + 2 * MiB)
    a = np.frombuffer(m, np.uint8)
    off = (-a.ctypes.data) % (2 * MiB)
    a = a[off:off + n]
    try:
        m.madvise(mmap.MADV_HUGEPAGE, 0, len(m))
    except (AttributeError, OSError):
        pass
    a[::4096] = 0
    return cuda.pinned(a), a, m


def _run(dst, src, threads, piece, reps=15):
    """Median GB/s of `threads` threads copying piece bytes each."""
    barrier = threading.Barrier(threads + 1)
    times = []
    stop = False

    def work(i):
        d = dst[i * piece:(i + 1) * piece]
        s = src[i * piece:(i + 1) * piece]
        while True:
            barrier.wait()
            if stop:
                return
            np.copyto(d, s)
            barrier.wait()

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for _ in range(reps):
        t0 = time.perf_counter()
        barrier.wait()
        barrier.wait()
        times.append(time.perf_counter() - t0)
    stop = True
    barrier.wait()
    for t in ts:
        t.join()
    return threads * piece / statistics.median(times) / 1e9


def main():
    total = 64 * MiB
    src = np.ones(total, np.uint8)
    page = np.zeros(total, np.uint8)
    pinned = cuda.pinned_array(total, np.uint8)
    pinned[:] = 0
    ctx, huge, _m = _huge_pinned(total)
    with ctx:
        print("%-26s %7s %8s %8s %8s %8s" % ("destination", "slice",
                                             "1 thr", "2 thr", "4 thr",
                                             "8 thr"))
        for name, dst in (("pageable", page), ("pinned_array", pinned),
                          ("registered huge pages", huge)):
            for piece in (MiB // 2, MiB, 4 * MiB, 8 * MiB):
                row = [_run(dst, src, t, piece) for t in (1, 2, 4, 8)]
                print("%-26s %5.1fM %8.1f %8.1f %8.1f %8.1f"
                      % (name, piece / MiB, *row))
        big = cuda.pinned_array(256 * MiB, np.uint8)
        dev = cuda.device_array(256 * MiB, np.uint8)
        s = cuda.stream()
        for name, dst in (("pinned_array", pinned),
                          ("registered huge pages", huge)):
            for piece in (MiB, 8 * MiB):
                alone = _run(dst, src, 8, piece)
                dev.copy_to_device(big, stream=s)
                busy = _run(dst, src, 8, piece, reps=9)
                s.synchronize()
                print("%-26s %5.1fM 8 threads: %.1f GB/s alone, %.1f GB/s "
                      "beside a 256 MiB HtoD copy" % (name, piece / MiB,
                                                      alone, busy))


if __name__ == "__main__":
    main()
