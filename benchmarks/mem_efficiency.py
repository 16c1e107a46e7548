# SPDX-License-Identifier: MIT
"""Memory efficiency: peak device memory used / peak live bytes (lower is
better, 1.0 the floor) and microseconds per operation of every allocator
on the same seeded sequences of allocations and frees, in one run, as a
markdown table (and ``--json FILE``).

    python benchmarks/mem_efficiency.py [--cap BYTES] [--ops N]
        [--seed S] [--budget SECONDS] [--allocators A,B]
        [--workloads W,V] [--jobs N] [--json FILE]

The engine is ``cudamem._bench_memory`` (also behind ``python -m cudamem
bench --memory``); its docstring is the reference.  In short:

Workloads, sizes scaled by ``--cap``, the bound on live bytes (2 GiB on a
GPU, 192 MiB on the simulator, whose device has 1 GiB, CUDAMEM_SIM_MEMORY):

1. ``mixed``: 70 % of requests 64 B .. 64 KiB, 25 % 64 KiB .. 4 MiB, 5 %
   4 MiB .. cap/8 (log-uniform), random frees (probability 0.45 a step,
   and as many as a request needs to fit under the cap).
2. ``growing``: longer and longer batches: six tensors a step
   proportional to a sequence length growing from 1/16 to all of its
   last value (where a step's live tensors take 85 % of the cap), two
   freed inside the step, the rest at its end; 32 small tensors of
   long-lived state, one replaced a step.
3. ``bulk``: rounds of many equal-size tensors (a new size each round,
   cap/4096 .. cap/64, filling up to 90 % of the cap), freed in bulk at
   the round's end but one in 32, which lives one round more.
4. ``training``: parameters first; per step, activations allocated layer
   by layer in the forward pass (three saved, one temporary) and freed in
   reverse in the backward pass (two temporaries a layer); gradients and
   two optimizer states a parameter made in the first step and kept; the
   batch size (and so every activation's size) drawn anew each step.

Allocators (each skipped with a note when absent): cudamem under
``default``, ``pool`` on cuMemAlloc'd segments (``cudamem-pool``:
``CUDAMEM_POOL_VMM=0``), ``pool`` on virtual memory (``cudamem-pool-vmm``:
the default, ``CUDAMEM_POOL_VMM=1``) and ``async`` (``cudamem.device_array(n,
np.uint8)``, dropped); CuPy (``cupy.cuda.alloc(n)``, its default pool);
PyTorch (``torch.empty(n, dtype=torch.uint8, device="cuda")``) without and
with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``; RMM
(``rmm.DeviceBuffer`` from a ``PoolMemoryResource`` over
``CudaMemoryResource``, starting empty); cuda.core (``mr.allocate(n,
stream=s)`` / ``buf.close(s)`` on its ``DeviceMemoryResource``).  On the
simulator only cudamem's managers run.

Method: every (allocator, workload) runs twice, each in a fresh child
process.  The sampling pass reads the driver's memory in use (total -
free of ``cudamem.current_context().get_memory_info()``: the same device
and primary context) after every operation, less a baseline read before
the library's first tiny allocation (so what that allocation takes is
counted); its peak over the workload's peak
live bytes is the ratio.  The timing pass runs the same operations without
sampling: its wall time (gc off, one synchronise at the end) over the
operations is the µs per operation.  On a GPU the children run one at a
time (the memory read is device-wide); on the simulator the sampling
passes may run in parallel (``--jobs``), the timing passes never.  The
defaults (20000 operations per workload, a budget of 240 s) fit in about
four minutes on the H200.
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # this tree's cudamem

from cudamem import _bench_memory as mem  # noqa: E402


def _names(text, allowed, what):
    if not text:
        return None
    out = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in out if t not in allowed]
    if bad:
        raise SystemExit("unknown %s %s (have %s)"
                         % (what, ", ".join(bad), ", ".join(allowed)))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="mem_efficiency.py",
        description="Peak device memory used / peak live bytes and µs per "
                    "operation of every allocator on seeded workloads.")
    p.add_argument("--cap", type=int, default=None, metavar="BYTES",
                   help="bound on live bytes (default 2 GiB; 192 MiB on "
                        "the simulator)")
    p.add_argument("--ops", type=int, default=mem.DEFAULT_OPS,
                   help="operations per workload (default %(default)s)")
    p.add_argument("--seed", type=int, default=mem.DEFAULT_SEED)
    p.add_argument("--budget", type=float, default=mem.DEFAULT_BUDGET_S,
                   metavar="SECONDS",
                   help="the whole run's time (default %(default)s)")
    p.add_argument("--allocators", default=None,
                   help="comma-separated, from: %s" % ", ".join(
                       mem.ALLOCATORS))
    p.add_argument("--workloads", default=None,
                   help="comma-separated, from: %s" % ", ".join(
                       mem.WORKLOADS))
    p.add_argument("--jobs", type=int, default=None,
                   help="sampling passes at once on the simulator (always "
                        "1 on a GPU)")
    p.add_argument("--json", metavar="FILE", help="write the results")
    p.add_argument("--quiet", action="store_true",
                   help="no line per child on stderr")
    a = p.parse_args(argv)

    def progress(label):
        if not a.quiet:
            print("  done: %s" % label, file=sys.stderr, flush=True)

    res = mem.run(allocators=_names(a.allocators, mem.ALLOCATORS,
                                    "allocator"),
                  workloads=_names(a.workloads, mem.WORKLOADS, "workload"),
                  cap=a.cap, ops=a.ops, seed=a.seed, budget=a.budget,
                  jobs=a.jobs, progress=progress)
    print(mem.format_table(res))
    if a.json:
        mem.write_json(res, a.json)
        print("results written to %s" % a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
