# SPDX-License-Identifier: MIT
"""Allocation: one small device array made and dropped; allocate+drop
churn over sizes 1 KiB - 4 MiB; one small allocation; a failing
allocation (twice the device's memory, so nothing can be freed to make
it fit; and twice a memory limit of a quarter of the device, which the
driver never sees); each under every cudamem memory manager (default,
pool, async) beside the peers.  The churn's ``[C, plain]`` and
``[C, deferred]`` rows put cudamem's default manager beside
bare_driver.c making the same allocations from C, freed at once or in
batches as the default manager frees them.

A memory manager is chosen before a context exists, and closing
cudamem's context would reset the primary context the peers share, so
the pool and async rows time cudamem in a subprocess started with
CUDAMEM_MEMORY_MANAGER=<kind> (the same timing code, see ``_measure``);
the default rows time it in this process.  The peers run in this process
in every row, so each row's ratios compare like with like: RMM with a
DeviceBuffer from its PoolMemoryResource (a sub-allocator, as cudamem's
pool), cuda.core with a Buffer from its DeviceMemoryResource (the
driver's stream-ordered pool, as cudamem's async manager).

Nothing here synchronises: an allocation enqueues no device work (the
async manager's cuMemFreeAsync is stream-ordered, and PyTorch's and
CuPy's caching allocators do not synchronise either).
"""

import itertools
import json
import os
import pathlib
import subprocess
import sys

import numpy as np

import bare_driver
import harness

SIZES = [1 << k for k in range(10, 23)]   # 1 KiB .. 4 MiB
MANAGERS = ("default", "pool", "async")
SMALL = 256
HERE = pathlib.Path(__file__).resolve().parent


def _numba(cuda):
    return lambda: cuda.device_array(256, np.float32)


def _cudamem(cm):
    return lambda: cm.device_array(256, np.float32)


def _cupy(cp):
    return lambda: cp.empty(256, np.float32)


def _torch(torch):
    dev = torch.device("cuda")
    return lambda: torch.empty(256, dtype=torch.float32, device=dev)


# -- allocate + drop: one allocation per call ------------------------------


def _sizes(op):
    return itertools.cycle(SIZES if op == "churn" else [SMALL]).__next__


def _cm_alloc(op):
    def factory(cm):
        if op == "device_array":
            return _cudamem(cm)
        if op == "device_array_like":
            host = np.arange(256, dtype=np.float32)
            return lambda: cm.device_array_like(host)
        alloc = cm.current_context().memalloc
        nxt = _sizes(op)
        return lambda: alloc(nxt())

    return factory


def _numba_alloc(op):
    def factory(cuda):
        nxt = _sizes(op)
        return lambda: cuda.device_array(nxt(), np.uint8)

    return factory


def _cupy_alloc(op):
    def factory(cp):
        nxt = _sizes(op)
        return lambda: cp.cuda.alloc(nxt())

    return factory


def _torch_alloc(op):
    def factory(torch):
        dev = torch.device("cuda")
        nxt = _sizes(op)
        return lambda: torch.empty(nxt(), dtype=torch.uint8, device=dev)

    return factory


def _rmm_alloc(op):
    """RMM: a DeviceBuffer from its pool resource, dropped."""
    def factory(p):
        nxt = _sizes(op)
        buf, pool = p.rmm.DeviceBuffer, p.pool
        return lambda: buf(size=nxt(), mr=pool)

    return factory


def _core_alloc(op):
    """cuda.core: a Buffer from its DeviceMemoryResource (the driver's
    stream-ordered pool) on one of its streams, closed on it."""
    def factory(p):
        nxt = _sizes(op)
        alloc, s = p.mr.allocate, p.stream
        return lambda: alloc(nxt(), stream=s).close(s)

    return factory


def _driver_alloc(op):
    def factory(core):
        nxt = _sizes(op)
        alloc = core._device_alloc
        free = core._device_free
        return lambda: free(alloc(nxt()))

    return factory


def _c_churn(how):
    """bare_driver.c's churn: cuMemAlloc of the same sizes from C, each
    freed at once (plain) or queued and freed in a batch once more than
    config.CUDA_DEALLOCS_COUNT are queued, the default manager's rule
    (deferred).  Samples of 2 ms, as the harness's."""

    def factory(core):
        from cudamem import config

        return bare_driver.run("churn", how, config.CUDA_DEALLOCS_COUNT,
                               31, 2)

    return factory
# -- a failing allocation: twice the device, nothing to free ---------------


def _too_big(total):
    """A request no device of total bytes can serve (and no peer's
    cache): twice its memory."""
    return 2 * total


def _failing(alloc, errors):
    """A callable that makes the failing request and swallows only the
    out-of-memory error expected; an allocation that succeeds is a broken
    row, not a fast one."""

    def fn():
        try:
            alloc()
        except errors:
            return
        raise RuntimeError("the allocation meant to fail succeeded")

    return fn


def _cm_fail(cm):
    n = _too_big(cm.current_context().get_memory_info()[1])
    return _failing(lambda: cm.device_array(n, np.uint8),
                    cm.CudaOutOfMemoryError)


def _cm_past_limit(cm):
    n = 2 * cm.memory_stats()["limit_bytes"]
    return _failing(lambda: cm.device_array(n, np.uint8),
                    cm.CudaOutOfMemoryError)


def _cm_past_limit_held(cm):
    """The limit nine tenths held by a live array, and a request of a
    fifth of it: refused by the limit with owners alive (what a service
    probing for room meets)."""
    lim = cm.memory_stats()["limit_bytes"]
    keep = cm.device_array(lim // 10 * 9, np.uint8)
    fn = _failing(lambda: cm.device_array(lim // 5, np.uint8),
                  cm.CudaOutOfMemoryError)

    def probe():
        fn()
        return keep        # alive as long as the row runs

    return probe


def _numba_fail(cuda):
    n = _too_big(cuda.current_context().get_memory_info()[1])
    return _failing(lambda: cuda.device_array(n, np.uint8),
                    cuda.cudadrv.driver.CudaAPIError)


def _cupy_fail(cp):
    n = _too_big(cp.cuda.runtime.memGetInfo()[1])
    return _failing(lambda: cp.cuda.alloc(n), cp.cuda.memory.OutOfMemoryError)


def _torch_fail(torch):
    dev = torch.device("cuda")
    n = _too_big(torch.cuda.mem_get_info()[1])
    return _failing(lambda: torch.empty(n, dtype=torch.uint8, device=dev),
                    torch.OutOfMemoryError)


def _driver_fail(core):
    import cudamem

    n = _too_big(cudamem.current_context().get_memory_info()[1])
    return _failing(lambda: core._alloc_free(n), cudamem.CudaAPIError)


def _measure(op, repeats=None, history=None):
    """Time cudamem's allocation op here (the manager came from the
    environment); (median, p10, p90).  history: None (off), "on" or
    "stacks" (cudamem.memory_history recording while it runs)."""
    import cudamem

    if history is not None:
        cudamem.memory_history(True, stacks=history == "stacks",
                               max_entries=1 << 16)
    if op == "fail":
        fn = _cm_fail(cudamem)
    elif op == "past_limit":
        fn = _cm_past_limit(cudamem)
    elif op == "past_limit_held":
        fn = _cm_past_limit_held(cudamem)
    else:
        fn = _cm_alloc(op)(cudamem)
    return harness.time_callable(fn, repeats=repeats)


def _cm_alloc_in(kind, op, history=None, env=None):
    """cudamem's timing of op under manager kind, from a subprocess (with
    the variables of env set there)."""

    def factory(cm):
        code = ("import sys, json; sys.path.insert(0, %r); import ops_alloc; "
                "print(json.dumps(ops_alloc._measure(%r, history=%r)))"
                % (str(HERE), op, history))
        penv = dict(os.environ, CUDAMEM_MEMORY_MANAGER=kind, **(env or {}))
        p = subprocess.run([sys.executable, "-c", code], env=penv,
                           capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            raise RuntimeError(p.stderr.strip().splitlines()[-1])
        return harness.Measured(json.loads(p.stdout.strip().splitlines()[-1]))

    return factory


def _alloc_ops():
    ops = []
    for op, label in (("churn", "alloc+drop churn 1K-4M"),
                      ("small", "alloc+drop %d B" % SMALL)):
        for kind in ("default", "pool", "async"):
            cm = _cm_alloc(op) if kind == "default" else _cm_alloc_in(kind, op)
            ops.append({"name": "%s [%s]" % (label, kind),
                        "impls": {"cudamem": cm, "numba": _numba_alloc(op),
                                  "cupy": _cupy_alloc(op),
                                  "torch": _torch_alloc(op),
                                  "rmm": _rmm_alloc(op),
                                  "cuda.core": _core_alloc(op),
                                  "driver": _driver_alloc(op)}})
            if op == "churn" and kind == "default":
                # The same cudamem timing beside the driver called from
                # C: freeing at once, and freeing as the default manager
                # does (numba's deferred frees).  The first ratio is
                # what numba's semantics and cudamem cost together, the
                # second what cudamem costs by itself.
                for how in ("plain", "deferred"):
                    ops.append({"name": "%s [C, %s]" % (label, how),
                                "impls": {"cudamem": cm,
                                          "driver": _c_churn(how)}})
    # The memory history's cost: the [pool] row above is the same work
    # with it off.
    for history, label in (("on", "history on"),
                           ("stacks", "history+stacks")):
        ops.append({"name": "alloc+drop %d B [pool, %s]" % (SMALL, label),
                    "impls": {"cudamem": _cm_alloc_in("pool", "small",
                                                      history),
                              "cupy": _cupy_alloc("small"),
                              "torch": _torch_alloc("small"),
                              "rmm": _rmm_alloc("small"),
                              "cuda.core": _core_alloc("small")}})
    # Out of memory when nothing can be freed: what the policy (flush,
    # trim, collect, retry, the error's snapshot) costs beyond the
    # driver's own failure.
    for kind in MANAGERS:
        cm = _cm_fail if kind == "default" else _cm_alloc_in(kind, "fail")
        ops.append({"name": "failing alloc 2x device [%s]" % kind,
                    "impls": {"cudamem": cm, "numba": _numba_fail,
                              "cupy": _cupy_fail, "torch": _torch_fail,
                              "driver": _driver_fail}})
    # Refused by the memory limit (CUDAMEM_DEVICE_MEMORY_LIMIT): the
    # policy's cost with no driver call at all.
    for kind in MANAGERS:
        ops.append({"name": "failing alloc past limit [%s]" % kind,
                    "impls": {"cudamem": _cm_alloc_in(
                        kind, "past_limit",
                        env={"CUDAMEM_DEVICE_MEMORY_LIMIT": "0.25"})}})
    # The same with nine tenths of the limit held by a live array and a
    # request of a fifth of it (a service probing for room), beside the
    # driver's own refusal: the policy must not collect or synchronise
    # per refusal.
    for kind in MANAGERS:
        ops.append({"name": "refusal, limit 0.9 held [%s]" % kind,
                    "impls": {"cudamem": _cm_alloc_in(
                        kind, "past_limit_held",
                        env={"CUDAMEM_DEVICE_MEMORY_LIMIT": "0.25"}),
                              "driver": _driver_fail}})
    return ops


def _driver(core):
    return lambda: core._alloc_free(1024)


OPS = [
    {"name": "device_array(256 f4)",
     "impls": {"cudamem": _cudamem, "numba": _numba, "cupy": _cupy,
               "torch": _torch, "driver": _driver}},
    # The same with cudamem's caching allocator: CuPy and PyTorch always
    # serve this row from theirs.
    {"name": "device_array(256 f4) [pool]",
     "impls": {"cudamem": _cm_alloc_in("pool", "device_array"),
               "numba": _numba, "cupy": _cupy, "torch": _torch}},
] + _alloc_ops()
