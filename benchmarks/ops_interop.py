# SPDX-License-Identifier: MIT
"""cudamem.interop and cudamem.dask: other libraries' allocations through
cudamem's pool, and DeviceNDArrays moving between Dask workers.

Rows (the cudamem column is the library under cudamem's adapter, the
library's own column its own allocator):

- ``cupy.empty(256) [use_with_cupy]``: CuPy's allocate-and-drop; the
  rmm column is CuPy under ``rmm.allocators.cupy.rmm_cupy_allocator``
  with RMM's PoolMemoryResource as the current device resource;
- ``torch.empty(256) [use_with_torch]``: PyTorch's; the adapter must be
  installed before PyTorch's first allocation, so cudamem's timing comes
  from a subprocess (as the ``[pool]`` rows of ops_alloc do);
- ``torch.empty(256) [torch_mempool]``: PyTorch's allocate-and-drop
  inside ``torch.cuda.use_mem_pool(interop.torch_mempool())``: PyTorch's
  caching allocator takes its segments from cudamem and caches blocks
  within them;
- ``torch.empty(256) [pluggable floor]``: the same under a
  ``CUDAPluggableAllocator`` that does nearly nothing (torch_floor.c,
  compiled at run time: a stack of freed blocks over one region that
  cudamem allocates first), in the driver column: what PyTorch's
  pluggable-allocator interface costs by itself, the floor of any
  allocator behind it;
- ``numba device_array(256) [plugin]``: numba's, the plugin named by
  NUMBA_CUDA_MEMORY_MANAGER in a subprocess;
- ``peak reserved MiB, mixed``: a workload that uses CuPy, then PyTorch,
  then numba (each phase drops its arrays before the next), measured as
  device memory in use at the end over the start (cuMemGetInfo), in MiB
  printed in the microsecond cells: cudamem = all three through cudamem's
  pool; each library's column = that library's phase alone on its own
  allocator; the driver column = the mixed workload without adapters;
- ``dask TCP 256 MiB``: one transfer between two worker processes of a
  LocalCluster (TCP, host frames) of a DeviceNDArray (cudamem column)
  against a NumPy array of the same size (driver column), in GB/s.

Every timing runs in a subprocess of its own started with
CUDAMEM_MEMORY_MANAGER=pool: the adapter's and the library's own alike,
so that both columns of a row see the same conditions (timings in the
benchmark's own process differed from a fresh process's by up to 2x on
the H200).
"""

import json
import os
import pathlib
import subprocess
import sys
import time

import harness

HERE = pathlib.Path(__file__).resolve().parent
N = 256
MIB = 1 << 20
DASK_BYTES = 256 * MIB


# ---------------------------------------------------------------------------
# Subprocess measurements
# ---------------------------------------------------------------------------


def _measure(which, repeats=None):
    """Run in a subprocess: time one allocate-and-drop under an adapter
    (which: cupy, torch, torch_mempool, torch_floor, numba), on the
    library's own allocator (cupy_own, torch_own, numba_own), or CuPy's
    through RMM's CuPy allocator over its pool resource (cupy_rmm);
    (median, p10, p90)."""
    if which == "cupy_own":
        import cupy

        fn = _cupy(cupy)
    elif which == "cupy_rmm":
        import cupy
        import rmm
        import rmm.mr
        from rmm.allocators.cupy import rmm_cupy_allocator

        rmm.mr.set_current_device_resource(rmm.mr.PoolMemoryResource(
            rmm.mr.CudaMemoryResource(), initial_pool_size=256 * MIB))
        cupy.cuda.set_allocator(rmm_cupy_allocator)
        fn = _cupy(cupy)
    elif which == "torch_own":
        import torch

        fn = _torch(torch)
    elif which == "numba_own":
        from numba import cuda

        fn = _numba(cuda)
    elif which == "cupy":
        import cupy

        from cudamem import interop

        interop.use_with_cupy()

        def fn():
            cupy.empty(N, dtype=cupy.float32)
    elif which == "torch":
        import torch

        from cudamem import interop

        interop.use_with_torch()

        def fn():
            torch.empty(N, device="cuda")
    elif which == "torch_mempool":
        import torch

        from cudamem import interop

        pool = interop.torch_mempool()
        scope = torch.cuda.use_mem_pool(pool)
        scope.__enter__()
        _measure.keep = (pool, scope)

        def fn():
            torch.empty(N, device="cuda")
    elif which == "torch_floor":
        import torch

        fn = _torch_floor(torch)
    elif which == "numba":
        import numpy as np
        from numba import cuda

        if not hasattr(np, "row_stack"):
            np.row_stack = np.vstack

        def fn():
            cuda.device_array(N, dtype=np.float32)
    else:
        raise ValueError(which)
    return harness.time_callable(fn, repeats=repeats)


def _torch_floor(torch):
    """Install torch_floor.c's allocator in this process (before
    PyTorch's first CUDA allocation); the allocate-and-drop to time."""
    import ctypes
    import shutil
    import tempfile

    import cudamem

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise harness.Skip("no C compiler to build torch_floor.c")
    out = pathlib.Path(tempfile.mkdtemp()) / "torch_floor.so"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(out),
                    str(HERE / "torch_floor.c")], check=True)
    region = cudamem.current_context().memalloc(64 * MIB)
    lib = ctypes.CDLL(str(out))
    lib.floor_init.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
    lib.floor_init(region.device_pointer, 64 * MIB)
    alloc = torch.cuda.memory.CUDAPluggableAllocator(
        str(out), "floor_alloc", "floor_free")
    torch.cuda.memory.change_current_allocator(alloc)
    _torch_floor.keep = (region, lib, alloc)

    def fn():
        torch.empty(N, device="cuda")

    return fn


def _used():
    import cudamem

    free, total = cudamem.current_context().get_memory_info()
    return total - free


def _mixed(mode):
    """Run in a subprocess: MiB of device memory in use after a workload
    (mode: "adapters", "native", or one library's name alone)."""
    import gc

    import cudamem

    base = _used()
    libs = ("cupy", "torch", "numba") if mode in ("adapters", "native") \
        else (mode,)
    if mode == "adapters":
        from cudamem import interop

        interop.use_with_torch()
        interop.use_with_cupy()
    if "torch" in libs:
        import torch
    if "cupy" in libs:
        import cupy
    if "numba" in libs:
        import numpy as np
        from numba import cuda

        if not hasattr(np, "row_stack"):
            np.row_stack = np.vstack
    sizes = [64 * MIB, 32 * MIB, 16 * MIB, 8 * MIB, MIB, 256 * 1024]
    for lib in libs:
        keep = []
        for rnd in range(4):
            for s in sizes:
                if lib == "cupy":
                    keep.append(cupy.empty(s, dtype=cupy.uint8))
                elif lib == "torch":
                    keep.append(torch.empty(s, dtype=torch.uint8,
                                            device="cuda"))
                else:
                    keep.append(cuda.device_array(s, dtype=np.uint8))
            if rnd % 2:
                keep = keep[len(keep) // 2:]
        del keep
        gc.collect()
    cudamem.synchronize()
    return (_used() - base) / MIB


def _child(func, arg, env):
    code = ("import sys, json; sys.path.insert(0, %r); sys.path.insert(0, "
            "%r); import ops_interop; print(json.dumps(ops_interop.%s(%r)))"
            % (str(HERE.parent), str(HERE), func, arg))
    e = dict(os.environ, CUDAMEM_MEMORY_MANAGER="pool")
    e.update(env)
    p = subprocess.run([sys.executable, "-c", code], env=e,
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        lines = p.stderr.strip().splitlines() or ["failed"]
        last = lines[-1]
        if "ModuleNotFoundError" in last or "ImportError" in last:
            raise harness.Skip(last)
        raise RuntimeError(last)
    return json.loads(p.stdout.strip().splitlines()[-1])


def _adapter(which, env=None):
    def factory(cm):
        return harness.Measured(_child("_measure", which, env or {}))

    return factory


def _mib(mode, env=None):
    def factory(lib):
        v = _child("_mixed", mode, env or {}) * 1e-6   # printed as MiB
        return harness.Measured((v, v, v))

    return factory


# ---------------------------------------------------------------------------
# The libraries' own allocators (timed in a subprocess too, so that both
# columns of a row are measured under the same conditions)
# ---------------------------------------------------------------------------


def _own(lib):
    def factory(mod):
        return harness.Measured(_child("_measure", lib + "_own", {}))

    return factory



def _cupy(cp):
    return lambda: cp.empty(N, dtype=cp.float32)


def _torch(torch):
    return lambda: torch.empty(N, device="cuda")


def _numba(cuda):
    import numpy as np

    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack
    return lambda: cuda.device_array(N, dtype=np.float32)


# ---------------------------------------------------------------------------
# Dask
# ---------------------------------------------------------------------------


def _dask_transfer(kind, repeats=3):
    """Seconds for one transfer of a 256 MiB array between two workers of
    a LocalCluster (TCP); kind "cudamem" or "numpy"."""
    try:
        from distributed import Client, LocalCluster, wait
    except ImportError as e:
        raise harness.Skip("distributed is not installed") from e

    def make(kind, nbytes, seed):
        import numpy as np

        a = np.full(nbytes // 8, float(seed))
        if kind == "numpy":
            return a
        import cudamem

        return cudamem.to_device(a)

    def touch(a):
        return a.shape

    times = []
    with LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                      dashboard_address=None) as lc, Client(lc) as client:
        w0, w1 = sorted(client.scheduler_info()["workers"])
        for seed in range(repeats + 1):
            x = client.submit(make, kind, DASK_BYTES, seed, workers=[w0])
            wait(x)
            t0 = time.perf_counter()
            y = client.submit(touch, x, workers=[w1])
            wait(y)
            dt = time.perf_counter() - t0
            if seed:
                times.append(dt)
            del x, y
    times.sort()
    return harness.Measured((times[len(times) // 2], times[0], times[-1]))


def _dask_cudamem(cm):
    return _dask_transfer("cudamem")


def _dask_numpy(core):
    return _dask_transfer("numpy")


NUMBA_PLUGIN = {"NUMBA_CUDA_MEMORY_MANAGER": "cudamem.numba_plugin"}

OPS = [
    {"name": "cupy.empty(256) [use_with_cupy]",
     "impls": {"cudamem": _adapter("cupy"), "cupy": _own("cupy"),
               "rmm": _adapter("cupy_rmm")}},
    {"name": "torch.empty(256) [use_with_torch]",
     "impls": {"cudamem": _adapter("torch"), "torch": _own("torch")}},
    {"name": "torch.empty(256) [torch_mempool]",
     "impls": {"cudamem": _adapter("torch_mempool"), "torch": _own("torch")}},
    {"name": "torch.empty(256) [pluggable floor] (drv: no-op pluggable)",
     "impls": {"cudamem": _adapter("torch"), "torch": _own("torch"),
               "driver": _adapter("torch_floor")}},
    {"name": "numba device_array(256) [plugin]",
     "impls": {"cudamem": _adapter("numba", NUMBA_PLUGIN),
               "numba": _own("numba")}},
    {"name": "peak reserved MiB, mixed",
     "impls": {"cudamem": _mib("adapters", NUMBA_PLUGIN),
               "numba": _mib("numba"), "cupy": _mib("cupy"),
               "torch": _mib("torch"), "driver": _mib("native")}},
    {"name": "dask TCP 256 MiB (drv: NumPy)", "bytes": DASK_BYTES,
     "impls": {"cudamem": _dask_cudamem, "driver": _dask_numpy}},
]
