# SPDX-License-Identifier: MIT
"""Many cycles of the hot calls must leave Python's allocations and the
device's flat: a reference or allocation leaked per call shows up here.
Prints OK or what grew."""

import gc
import pickle
import sys
import tracemalloc

import numpy as np

import cudamem as cuda

N = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
h = np.arange(256, dtype=np.float32)
ctx = cuda.current_context()
IPC = sys.platform.startswith("linux")


def cycle():
    d = cuda.to_device(h)
    d.copy_to_host()
    d.copy_to_device(h)
    e = cuda.device_array_like(d)
    e[:] = 2.0
    v = d[::2]
    _ = v.__cuda_array_interface__
    w = cuda.as_cuda_array(d)
    cap = d.__dlpack__()
    x = cuda.from_dlpack(cap)
    if IPC:
        ipc = v.get_ipc_handle()
        ih = ipc.ipc_handle
        _ = (ih.base, ih.handle.reserved, ih.source_info, ipc.array_desc)
        _ = pickle.loads(pickle.dumps(d.get_ipc_handle()))
        del ipc, ih
    del d, e, v, w, x, cap, _


for _ in range(200):
    cycle()
ctx.memory_manager.deallocations.clear()
gc.collect()
tracemalloc.start()
snap0 = tracemalloc.take_snapshot()
stats0 = cuda.memory_stats()
for _ in range(N):
    cycle()
ctx.memory_manager.deallocations.clear()
gc.collect()
snap1 = tracemalloc.take_snapshot()
stats1 = cuda.memory_stats()
grew = sum(s.size_diff for s in snap1.compare_to(snap0, "filename"))
problems = []
if grew > 64 * 1024:
    problems.append("Python allocations grew by %d bytes" % grew)
if stats1["allocated_bytes"] != stats0["allocated_bytes"]:
    problems.append("device bytes %d -> %d" % (stats0["allocated_bytes"],
                                               stats1["allocated_bytes"]))
print("OK" if not problems else "; ".join(problems))
