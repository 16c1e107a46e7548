# SPDX-License-Identifier: MIT
"""Memory-pool IPC of the async manager (or, with "vmm" after the count,
the export of pages of the pool manager on virtual memory), many times
over: the exporter's handles and the importer's opens and closes
(direct, dropped unclosed, two opens of one export) must leave
descriptors, Python allocations and device memory flat in both
processes, and the importer must exit cleanly with imports still open.
Prints OK or what grew."""

import gc
import multiprocessing
import os
import pickle
import sys
import tracemalloc

import numpy as np

N = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
VMM = len(sys.argv) > 2 and sys.argv[2] == "vmm"


def fds():
    return len(os.listdir("/proc/self/fd"))


def _grown(runs, body):
    """Python bytes allocated and still held after body ran runs times,
    and the descriptors before and after."""
    gc.collect()
    tracemalloc.start()
    snap0 = tracemalloc.take_snapshot()
    n0 = fds()
    for _ in range(runs):
        body()
    gc.collect()
    snap1 = tracemalloc.take_snapshot()
    tracemalloc.stop()
    return sum(s.size_diff for s in snap1.compare_to(snap0, "filename")), \
        n0, fds()


def growth(side, body):
    """What body leaves grown (Python allocations, descriptors).  The
    interpreter's free lists and caches keep a bounded amount that
    tracemalloc counts (up to about 65 KiB in a window, whether it saw
    one run or five; the same window varies by up to 35 KiB from one
    process to the next), so a leak is told by how the growth scales:
    body once, then five times, after a first run to warm up; what five
    runs keep past one run's is four runs' leak (64 KiB: 16 bytes a
    cycle of 1 000)."""
    body()
    one, n0, n1 = _grown(1, body)
    five, m0, m1 = _grown(5, body)
    problems = []
    if five - one > 64 * 1024 or one > 256 * 1024:
        problems.append("%s: Python allocations grew by %d bytes in one "
                        "run and %d in five" % (side, one, five))
    if n1 != n0 or m1 != m0:
        problems.append("%s: descriptors %d -> %d, then %d -> %d"
                        % (side, n0, n1, m0, m1))
    return problems


def importer(conn):
    import cudamem as cuda

    def cycle(h, h2):
        with h as arr:
            arr.copy_to_host()
        a = h.open()            # dropped unclosed: freed through the queue
        b = h2.open()           # the same import, counted
        del a
        h._ipc_handle._impl = None
        h2.close()
        del b

    handles = conn.recv()
    ctx = cuda.current_context()
    h, h2 = handles[0], pickle.loads(pickle.dumps(handles[0]))
    for _ in range(50):
        cycle(h, h2)
    ctx.memory_manager.reset()

    def body():
        for i in range(N):
            cycle(handles[i % len(handles)], pickle.loads(pickle.dumps(
                handles[i % len(handles)])))
        ctx.memory_manager.reset()

    problems = growth("importer", body)
    conn.send(problems)
    # Exit with imports open: must be clean.
    keep = [x.open() for x in handles[:2]]
    conn.recv()
    del keep


def main():
    if VMM:
        os.environ["CUDAMEM_MEMORY_MANAGER"] = "pool"
        os.environ["CUDAMEM_POOL_VMM"] = "1"
    else:
        os.environ["CUDAMEM_MEMORY_MANAGER"] = "async"
    import cudamem as cuda
    from cudamem import _core

    ctx = cuda.current_context()
    if VMM and not _core._pool_stats(ctx)["virtual_memory"]:
        print("OK (the device has no virtual memory management)")
        return
    if not VMM and not ctx.memory_manager.shareable:
        print("OK (the device's pools cannot be shared)")
        return
    arrays = [cuda.to_device(np.arange(n, dtype=np.float32))
              for n in (10, 1000, 100000, 1200000)]
    handles = [a.get_ipc_handle() for a in arrays]
    handles.append(arrays[1][100:300].get_ipc_handle())
    # The exporter's side: handles made and pickled many times.
    stats0 = cuda.memory_stats()

    def body():
        for _ in range(N):
            for a in arrays:
                pickle.loads(pickle.dumps(a[1:].get_ipc_handle()))

    problems = growth("exporter", body)
    if cuda.memory_stats()["allocated_bytes"] != stats0["allocated_bytes"]:
        problems.append("exporter: device bytes grew")
    spawn = multiprocessing.get_context("spawn")
    conn, theirs = spawn.Pipe()
    p = spawn.Process(target=importer, args=(theirs,))
    p.start()
    theirs.close()
    conn.send(handles)
    problems += conn.recv()
    conn.send(None)
    p.join(120)
    if p.exitcode != 0:
        problems.append("importer exited with %r" % p.exitcode)
    print("OK" if not problems else "; ".join(problems))


if __name__ == "__main__":
    main()
