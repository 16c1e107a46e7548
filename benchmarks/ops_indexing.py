# SPDX-License-Identifier: MIT
"""NumPy's advanced indexing on the device: ``d[idx]``, a gather of 1 M
float32 elements by 1 M random int64 indices held on the device (CuPy's
``take`` and PyTorch's ``index_select`` beside it), and ``d[mask]`` with
a device boolean mask (and, cudamem only, that mask's first stage
alone: its offsets).  Each call is synchronised.  numba's device arrays
take no index arrays: no numba column.

Each call allocates its result: CuPy and PyTorch from their caching
allocators, cudamem from its context's manager, so the [pool] rows time
cudamem in a subprocess started with CUDAMEM_MEMORY_MANAGER=pool (as
ops_alloc does; the peers run here in every row)."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np

import harness

HERE = pathlib.Path(__file__).resolve().parent

N = 1 << 20
_rng = np.random.default_rng(0)
_VALUES = _rng.random(N, dtype=np.float32)
_INDEX = _rng.integers(0, N, N, dtype=np.int64)
_MASK = _rng.random(N) < 0.5


def _cudamem_gather(cm):
    d = cm.to_device(_VALUES)
    idx = cm.to_device(_INDEX)
    sync = cm.synchronize

    def run():
        d[idx]
        sync()
    run.keep = (d, idx)
    return run


def _cupy_gather(cp):
    a = cp.asarray(_VALUES)
    idx = cp.asarray(_INDEX)
    sync = cp.cuda.Device().synchronize

    def run():
        cp.take(a, idx)
        sync()
    return run


def _torch_gather(torch):
    a = torch.as_tensor(_VALUES, device="cuda")
    idx = torch.as_tensor(_INDEX, device="cuda")
    sync = torch.cuda.synchronize

    def run():
        torch.index_select(a, 0, idx)
        sync()
    return run


def _cudamem_mask(cm):
    d = cm.to_device(_VALUES)
    m = cm.to_device(_MASK)
    sync = cm.synchronize

    def run():
        d[m]
        sync()
    run.keep = (d, m)
    return run


def _cudamem_mask_offsets(cm):
    """The first stage of d[mask] alone: the device mask turned into the
    byte offsets of its true elements (count, scan, write and the count
    read back), synchronised; d[mask] less this is the gather and the
    planning around it."""
    from cudamem import _core

    m = cm.to_device(_MASK)
    sync = cm.synchronize
    ix_mask, stream = _core._ix_mask, _core.default_stream()

    def run():
        ix_mask(m, (4,), stream)
        sync()
    run.keep = (m,)
    return run


def _cupy_mask(cp):
    a = cp.asarray(_VALUES)
    m = cp.asarray(_MASK)
    sync = cp.cuda.Device().synchronize

    def run():
        a[m]
        sync()
    return run


def _torch_mask(torch):
    a = torch.as_tensor(_VALUES, device="cuda")
    m = torch.as_tensor(_MASK, device="cuda")
    sync = torch.cuda.synchronize

    def run():
        a[m]
        sync()
    return run


def _measure(op, repeats=None):
    """Time cudamem's op here (the manager came from the environment);
    (median, p10, p90)."""
    import cudamem

    fn = {"gather": _cudamem_gather, "mask": _cudamem_mask,
          "mask_offsets": _cudamem_mask_offsets}[op](cudamem)
    return harness.time_callable(fn, repeats=repeats)


def _in_pool(op):
    """cudamem's timing of op under the pool manager, from a subprocess."""

    def factory(cm):
        code = ("import sys, json; sys.path.insert(0, %r); "
                "import ops_indexing; "
                "print(json.dumps(ops_indexing._measure(%r)))"
                % (str(HERE), op))
        env = dict(os.environ, CUDAMEM_MEMORY_MANAGER="pool")
        p = subprocess.run([sys.executable, "-c", code], env=env,
                           capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            raise RuntimeError(p.stderr.strip().splitlines()[-1])
        return harness.Measured(json.loads(p.stdout.strip().splitlines()[-1]))

    return factory


OPS = [
    {"name": "gather d[idx] 1M f32, 1M idx",
     "impls": {"cudamem": _cudamem_gather, "cupy": _cupy_gather,
               "torch": _torch_gather}},
    {"name": "gather d[idx] 1M f32 [pool]",
     "impls": {"cudamem": _in_pool("gather"), "cupy": _cupy_gather,
               "torch": _torch_gather}},
    {"name": "mask read d[mask] 1M f32",
     "impls": {"cudamem": _cudamem_mask, "cupy": _cupy_mask,
               "torch": _torch_mask}},
    {"name": "mask read d[mask] 1M f32 [pool]",
     "impls": {"cudamem": _in_pool("mask"), "cupy": _cupy_mask,
               "torch": _torch_mask}},
    # Where d[mask]'s time goes: its first stage alone (cudamem only).
    {"name": "mask offsets only 1M [pool]",
     "impls": {"cudamem": _in_pool("mask_offsets")}},
]
