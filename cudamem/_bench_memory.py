# SPDX-License-Identifier: MIT
"""The memory-efficiency benchmark: how much device memory each allocator
holds for the same sequence of allocations and frees, and how fast it
serves it.  ``benchmarks/mem_efficiency.py`` runs it from the command
line and ``python -m cudamem bench --memory`` from the package; both
print ``format_table``'s markdown.

A workload is a list of operations made from a seed: allocate n bytes
into a slot, or free a slot.  Its sizes scale with ``cap``, a bound on
the bytes live at once (2 GiB by default on a GPU, 192 MiB on the
simulator, whose device has 1 GiB).  The workloads (``WORKLOADS``):

``mixed``
    Mixed sizes: 70 % of requests log-uniform in 64 B .. 64 KiB, 25 % in
    64 KiB .. 4 MiB, 5 % in 4 MiB .. cap/8.  Each step frees a random
    live block with probability 0.45, else allocates, first freeing
    random live blocks until the request fits under the cap.
``growing``
    Sizes growing over the run: steps of six tensors proportional to a
    sequence length that grows in steps of 1/256 from 1/16 of its last
    value to it over the run (longer and longer batches; at the last
    step what is live at once takes 85 % of the cap), two of them freed
    inside the step and the rest at its end in reverse; beside them 32
    small tensors (1 .. 64 KiB) of long-lived state, one replaced every
    step.
``bulk``
    Many equal-size tensors freed in bulk: rounds until the operations
    are used, each with its own size (log-uniform in cap/4096 .. cap/64,
    multiples of 512 B) and as many tensors as fit in 90 % of the cap
    (at most ops/32), all freed at the round's end but one in 32, which
    lives until the end of the next round.
``training``
    A training step: parameters (6 % of the cap, two tensors a layer,
    over up to 24 layers) made first; each step's forward pass
    allocates three saved activations a layer (sizes proportional to the
    step's batch size, drawn from 1/4 .. 1 of the largest, which fills
    60 % of the cap) and one temporary freed at once; the backward pass
    goes through the layers in reverse, allocating two temporaries and
    freeing the layer's activations; gradients (made in the first
    backward pass) and two optimizer states a parameter (made at the
    first step's end) live to the end.

Every workload ends by freeing what is still live, and the same
operations run under every allocator (the child regenerates them from
the seed, and the run checks their digest).

The method: each (allocator, workload) runs twice, each time in a fresh
child process.  The sampling pass reads the device's memory in use from
the driver after every operation (``cuMemGetInfo`` through
``cudamem.current_context().get_memory_info()``: total - free, of the
same device and primary context the library allocates from), less a
baseline read before the library's first allocation (256 B, kept live
to the end), so the context, the libraries' handles and other
processes' memory stay out of it and everything the library takes from
the device, its first allocation included, is in; peak used / peak live
bytes is its result (lower is better, 1.0 the floor; the driver's view
counts what an allocator caches, its rounding and the driver's own
granularity).  Memory is read between operations, not inside one.  The
table also says what each library's first allocation took from the
device (``first_allocation`` in the JSON): a caching allocator's first
segment or a driver pool's first chunk, which the workload then uses.
The timing pass runs the same operations without sampling: wall time
over the number of operations, gc off, one synchronise at the end
included.  The sampling passes read device-wide memory, so on a GPU no
two children run at once; on the simulator (each child has its own
simulated device) the sampling passes may run in parallel (``jobs``);
timing passes always run one at a time.  On the simulator only
cudamem's managers run.
"""

import gc
import hashlib
import json
import math
import os
import random
import subprocess
import sys
import time

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

SCHEMA_VERSION = 1
WORKLOADS = ("mixed", "growing", "bulk", "training")
TITLES = {"mixed": "mixed sizes", "growing": "growing sizes",
          "bulk": "equal sizes, bulk frees", "training": "training step"}
CUDAMEM = ("cudamem-default", "cudamem-pool", "cudamem-pool-vmm",
           "cudamem-async")
PEERS = ("cupy", "torch", "torch-expandable", "rmm", "cuda.core")
ALLOCATORS = CUDAMEM + PEERS
LABELS = {"cudamem-default": "cudamem `default`",
          "cudamem-pool": "cudamem `pool`, `CUDAMEM_POOL_VMM=0`",
          "cudamem-pool-vmm": "cudamem `pool` (on virtual memory, the "
                              "default)",
          "cudamem-async": "cudamem `async` (driver's pool)",
          "cupy": "CuPy (its default pool)",
          "torch": "PyTorch",
          "torch-expandable": "PyTorch, `expandable_segments:True`",
          "rmm": "RMM pool",
          "cuda.core": "cuda.core"}
DEFAULT_OPS = 20000
DEFAULT_SEED = 0
DEFAULT_BUDGET_S = 240.0
CHILD_LIMIT_S = 150.0
METHOD = ("peak used = max over a sampling pass of the driver's memory in "
          "use (total - free from cuMemGetInfo after every operation) "
          "less a baseline read before the library's first "
          "allocation (256 B, kept live), so that everything the library "
          "takes is counted; peak live = the most bytes requested "
          "and not yet freed; us/op = wall time of a separate pass "
          "without sampling (one synchronise at its end) over the "
          "operations; each pass in a fresh process")
_TAG = "MEMEFF-RESULT "


def default_cap(simulated):
    """The live-set bound: 2 GiB on a GPU, 192 MiB on the simulator."""
    return 192 * MiB if simulated else 2 * GiB


# ---------------------------------------------------------------------------
# workloads


class _Seq:
    """An operation sequence being built: ``sizes[i]`` bytes allocated into
    ``slots[i]``, or the slot freed where ``sizes[i]`` is 0; it tracks the
    live bytes and their peak."""

    def __init__(self):
        self.sizes = []
        self.slots = []
        self.live = {}
        self.live_bytes = 0
        self.peak_live = 0
        self._spare = []
        self._nslots = 0

    def __len__(self):
        return len(self.sizes)

    def alloc(self, n):
        n = max(1, int(n))
        if self._spare:
            slot = self._spare.pop()
        else:
            slot = self._nslots
            self._nslots += 1
        self.live[slot] = n
        self.live_bytes += n
        self.peak_live = max(self.peak_live, self.live_bytes)
        self.sizes.append(n)
        self.slots.append(slot)
        return slot

    def free(self, slot):
        self.live_bytes -= self.live.pop(slot)
        self._spare.append(slot)
        self.sizes.append(0)
        self.slots.append(slot)

    def free_all(self):
        for slot in list(self.live):
            self.free(slot)


def _loguniform(rng, lo, hi):
    return int(math.exp(rng.uniform(math.log(lo), math.log(max(hi, lo)))))


def _round_up(n, k):
    return max(k, -(-int(n) // k) * k)


def _mixed(rng, cap, nops):
    s = _Seq()
    held = []
    large = max(cap // 8, 4 * MiB)

    def drop_random():
        i = rng.randrange(len(held))
        held[i], held[-1] = held[-1], held[i]
        s.free(held.pop())

    while len(s) + len(held) < nops:
        if held and rng.random() < 0.45:
            drop_random()
            continue
        r = rng.random()
        if r < 0.70:
            n = _loguniform(rng, 64, 64 * KiB)
        elif r < 0.95:
            n = _loguniform(rng, 64 * KiB, 4 * MiB)
        else:
            n = _loguniform(rng, 4 * MiB, large)
        n = min(n, cap)
        while held and s.live_bytes + n > cap:
            drop_random()
        held.append(s.alloc(n))
    s.free_all()
    return s


def _growing(rng, cap, nops):
    s = _Seq()
    state = [s.alloc(_loguniform(rng, KiB, 64 * KiB)) for _ in range(32)]
    weights = [rng.uniform(0.5, 2.0) for _ in range(6)]
    # The most of a step live at once (tensors 1 and 3 die early) takes
    # 85 % of the cap at the last step.
    most = max(sum(weights[:3]), weights[0] + sum(weights[2:5]),
               weights[0] + weights[2] + sum(weights[4:]))
    scale = 0.85 * cap / most                # bytes per unit at the end
    per_step = 2 * len(weights) + 2
    steps = max(2, (nops - 2 * len(state)) // per_step)
    for k in range(steps):
        # The length grows step by step, in increments of 1/256.
        frac = 1 / 16 + (15 / 16) * k / (steps - 1)
        frac = max(1, round(frac * 256)) / 256
        step = []
        for j, w in enumerate(weights):
            step.append(s.alloc(_round_up(w * scale * frac, 512)))
            if j in (2, 4):                  # intermediates die early
                s.free(step.pop(-2))
        for slot in reversed(step):
            s.free(slot)
        i = rng.randrange(len(state))
        s.free(state[i])
        state[i] = s.alloc(_loguniform(rng, KiB, 64 * KiB))
    s.free_all()
    return s


def _bulk(rng, cap, nops):
    s = _Seq()
    most = max(8, nops // 32)
    survivors = []
    while len(s) + 2 * most + 2 * len(survivors) <= nops:
        size = _round_up(_loguniform(rng, max(cap // 4096, 512), cap // 64),
                         512)
        count = max(1, min(most, int(0.9 * cap) // size))
        made = [s.alloc(size) for _ in range(count)]
        for slot in survivors:
            s.free(slot)
        survivors = made[::32]
        keep = set(survivors)
        for slot in made:
            if slot not in keep:
                s.free(slot)
    s.free_all()
    return s


def _training(rng, cap, nops):
    s = _Seq()
    layers = max(4, min(24, nops // 400))
    per_layer = 0.06 * cap / layers
    params = []
    for _ in range(layers):
        params.append(s.alloc(_round_up(per_layer * 0.97, 512)))
        params.append(s.alloc(_round_up(per_layer * 0.03, 512)))
    acts = [rng.uniform(0.5, 1.5) for _ in range(3)]
    unit = 0.6 * cap / layers / sum(acts)   # bytes per activation weight
    ops_per_step = 12 * layers
    steps = max(1, (nops - 8 * layers) // ops_per_step)
    grads = None
    states = None
    for _ in range(steps):
        batch = rng.randint(8, 32) / 32
        saved = []
        for _ in range(layers):                      # forward
            saved.append([s.alloc(_round_up(a * unit * batch, 512))
                          for a in acts])
            s.free(s.alloc(_round_up(acts[0] * unit * batch, 512)))
        first = grads is None
        if first:
            grads = []
        for layer in reversed(range(layers)):        # backward
            t1 = s.alloc(_round_up(acts[1] * unit * batch, 512))
            if first:
                for p in params[2 * layer:2 * layer + 2]:
                    grads.append(s.alloc(s.live[p]))
            for slot in reversed(saved[layer]):
                s.free(slot)
            t2 = s.alloc(_round_up(acts[2] * unit * batch, 512))
            s.free(t1)
            s.free(t2)
        if states is None:                           # optimizer state
            states = [s.alloc(s.live[p]) for p in params for _ in range(2)]
    s.free_all()
    return s


_MAKERS = {"mixed": _mixed, "growing": _growing, "bulk": _bulk,
           "training": _training}


def generate(workload, seed, cap, nops):
    """The operations of workload: a ``_Seq`` (``sizes``, ``slots``,
    ``peak_live``); the same for the same arguments in every process."""
    if workload not in _MAKERS:
        raise ValueError("no workload %r (have %s)"
                         % (workload, ", ".join(WORKLOADS)))
    rng = random.Random("%s:%d" % (workload, seed))
    return _MAKERS[workload](rng, int(cap), int(nops))


def digest(seq):
    """A short hash of the operations, to check every child ran the same."""
    h = hashlib.sha256()
    h.update(json.dumps([seq.sizes, seq.slots]).encode())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------
# allocators (in the child)


class _Skip(Exception):
    """This allocator cannot run here."""


def _open(name):
    """(alloc, free, label): alloc(n) returns an object holding n bytes;
    free(obj) gives it back, or None where dropping the last reference
    does.  Raises _Skip when the library is absent or unusable."""
    import numpy as np

    if name in CUDAMEM:
        import cudamem

        kind = name.split("-")[1]
        got = cudamem.memory_stats().get("manager")
        if got != kind:
            raise RuntimeError("asked for the %r manager, the context has %r"
                               % (kind, got))
        dev_array = cudamem.device_array
        u8 = np.uint8
        return (lambda n: dev_array(n, u8)), None
    if name == "cupy":
        try:
            import cupy
        except ImportError as e:
            raise _Skip("not installed (%s)" % e) from None
        cupy.cuda.runtime.getDeviceCount()
        return cupy.cuda.alloc, None
    if name in ("torch", "torch-expandable"):
        try:
            import torch
        except ImportError as e:
            raise _Skip("not installed (%s)" % e) from None
        if not torch.cuda.is_available():
            raise _Skip("torch.cuda.is_available() is False")
        dev = torch.device("cuda")
        u8 = torch.uint8
        empty = torch.empty
        return (lambda n: empty(n, dtype=u8, device=dev)), None
    if name == "rmm":
        try:
            import rmm
            import rmm.mr
        except ImportError as e:
            raise _Skip("not installed (%s)" % e) from None
        # An empty pool that grows on demand (RMM's own growth policy),
        # as the other allocators start empty.
        try:
            pool = rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(),
                                             initial_pool_size=0)
        except (ValueError, RuntimeError, TypeError, OverflowError):
            pool = rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(),
                                             initial_pool_size=256)
        buf = rmm.DeviceBuffer
        return (lambda n: buf(size=n, mr=pool)), None
    if name == "cuda.core":
        from cudamem import _bench_peers

        try:
            _bench_peers.cuda_core_module()
        except ImportError as e:
            raise _Skip("not installed (%s)" % e) from None
        p = _bench_peers.load_cuda_core()
        if p is None:
            raise _Skip("installed, but no device through it")
        mr, stream = p.mr, p.stream
        # load_cuda_core's check allocated and freed 256 B of the
        # driver's pool, which keeps the chunk it took until a
        # synchronisation: without one the baseline would hold that chunk
        # and the workload use it uncounted (0.993 on the H100's training
        # step, under the 1.0 floor).
        stream.sync()
        return ((lambda n: mr.allocate(n, stream=stream)),
                (lambda b: b.close(stream)))
    raise ValueError("no allocator %r (have %s)"
                     % (name, ", ".join(ALLOCATORS)))


def _is_oom(e):
    text = ("%s %s" % (type(e).__name__, e)).lower()
    return isinstance(e, MemoryError) or "out of memory" in text \
        or "out_of_memory" in text or "outofmemory" in text


def _child(spec):
    """One pass of one allocator over one workload, in this (fresh)
    process; a JSON-ready dict."""
    import cudamem

    seq = generate(spec["workload"], spec["seed"], spec["cap"], spec["ops"])
    out = {"allocator": spec["allocator"], "workload": spec["workload"],
           "mode": spec["mode"], "ops": len(seq), "digest": digest(seq),
           "peak_live": seq.peak_live}
    try:
        alloc, free = _open(spec["allocator"])
    except _Skip as e:
        out["skipped"] = str(e)
        return out
    ctx = cudamem.current_context()
    info = ctx.get_memory_info
    sync = cudamem.synchronize
    f, total = info()
    before = total - f
    # The baseline is read before the library's first allocation (256 B,
    # live to the end), so that what it takes (a caching allocator's
    # first segment, a driver pool's first chunk: room the workload then
    # uses) is counted as the rest is.
    out["baseline"] = before
    tiny = alloc(256)
    sync()
    f, total = info()
    out["first_allocation"] = max(0, total - f - before)
    out["total"] = total
    sizes, slots = seq.sizes, seq.slots
    live = [None] * (max(slots) + 1 if slots else 0)
    done = 0
    peak = 0
    gc.collect()
    gc.disable()
    t0 = time.perf_counter()
    try:
        if spec["mode"] == "sample":
            for n, k in zip(sizes, slots, strict=True):
                if n:
                    live[k] = alloc(n)
                else:
                    if free is not None:
                        free(live[k])
                    live[k] = None
                done += 1
                f, t = info()
                if t - f > peak:
                    peak = t - f
        elif free is None:
            for n, k in zip(sizes, slots, strict=True):
                live[k] = alloc(n) if n else None
                done += 1
        else:
            for n, k in zip(sizes, slots, strict=True):
                if n:
                    live[k] = alloc(n)
                else:
                    free(live[k])
                    live[k] = None
                done += 1
        sync()
        wall = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - reported per allocator
        kind = "oom" if _is_oom(e) else "error"
        out[kind] = "%s at operation %d of %d: %s" % (
            "out of memory" if kind == "oom" else type(e).__name__,
            done + 1, len(sizes), str(e).splitlines()[0][:160] if str(e)
            else type(e).__name__)
        out["failed_at"] = done
        wall = None
    finally:
        gc.enable()
    if spec["mode"] == "sample":
        out["peak_used"] = max(0, peak - before)
        if wall is not None:
            if free is not None:
                for b in live:
                    if b is not None:
                        free(b)
            live = None
            sync()
            f, t = info()
            out["held_after"] = max(0, t - f - before)
    elif wall is not None:
        out["seconds"] = wall
        out["us_per_op"] = wall / len(sizes) * 1e6
    del tiny
    return out


def _child_main(argv):
    spec = json.loads(argv[0])
    try:
        out = _child(spec)
    except _Skip as e:
        out = {"skipped": str(e)}
    except Exception as e:  # noqa: BLE001 - reported, the run goes on
        out = {"error": "%s: %s" % (type(e).__name__, str(e)[:200])}
    sys.stdout.write(_TAG + json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


# ---------------------------------------------------------------------------
# the run (in the parent)


def _child_env(allocator):
    env = dict(os.environ)
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(
        [pkg_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                      if p])
    env.pop("CUDAMEM_POOL_VMM", None)
    if allocator in CUDAMEM:
        env["CUDAMEM_MEMORY_MANAGER"] = allocator.split("-")[1]
        if allocator.startswith("cudamem-pool"):
            env["CUDAMEM_POOL_VMM"] = "1" if allocator.endswith("-vmm") \
                else "0"
    else:
        env.pop("CUDAMEM_MEMORY_MANAGER", None)
    env.pop("NUMBA_CUDA_MEMORY_MANAGER", None)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("PYTORCH_ALLOC_CONF", None)
    if allocator == "torch-expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    return env


def _spawn(spec, timeout):
    """Run one child; its result dict (an ``error`` entry when it died)."""
    cmd = [sys.executable, "-m", "cudamem._bench_memory", "--child",
           json.dumps(spec)]
    base = {"allocator": spec["allocator"], "workload": spec["workload"],
            "mode": spec["mode"]}
    try:
        p = subprocess.run(cmd, env=_child_env(spec["allocator"]),
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(base, error="no result within %.0f s" % timeout)
    for line in reversed(p.stdout.splitlines()):
        if line.startswith(_TAG):
            return dict(base, **json.loads(line[len(_TAG):]))
    tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
    return dict(base, error="child exited %d: %s" % (p.returncode,
                                                     tail[:200]))


def _backend():
    import cudamem
    from cudamem import _core

    err = cudamem.cuda_error()
    if err is not None:
        raise RuntimeError("no backend: %s" % err)
    return _core._backend()


def run(allocators=None, workloads=None, cap=None, ops=DEFAULT_OPS,
        seed=DEFAULT_SEED, budget=DEFAULT_BUDGET_S, jobs=None,
        progress=None):
    """Run the benchmark; a JSON-ready dict (``format_table`` prints it).

    Parameters
    ----------
    allocators : sequence of str, optional
        Names from ``ALLOCATORS`` (default: all; on the simulator
        cudamem's managers only, the others noted as skipped).
    workloads : sequence of str, optional
        Names from ``WORKLOADS`` (default: all).
    cap : int, optional
        The bound on live bytes (default ``default_cap``).
    ops : int
        Operations per workload (about; each ends by freeing all).
    seed : int
        The workloads' seed.
    budget : float
        Seconds for the whole run; children not started when it is spent
        are reported as not run, a child still running at its end is
        stopped.
    jobs : int, optional
        Sampling passes run at once on the simulator (default: the CPU
        count, at most 8); always 1 on a GPU.
    progress : callable, optional
        Called with a label as each child ends.
    """
    t_start = time.perf_counter()
    deadline = t_start + budget
    backend = _backend()
    simulated = backend != "driver"
    allocators = list(allocators or ALLOCATORS)
    workloads = list(workloads or WORKLOADS)
    for a in allocators:
        if a not in ALLOCATORS:
            raise ValueError("no allocator %r (have %s)"
                             % (a, ", ".join(ALLOCATORS)))
    cap = int(cap or default_cap(simulated))
    notes = {}
    runnable = []
    for a in allocators:
        if simulated and a not in CUDAMEM:
            notes[a] = "skipped: the simulator runs cudamem's managers only"
        else:
            runnable.append(a)
    wl = []
    for w in workloads:
        seq = generate(w, seed, cap, ops)
        wl.append({"name": w, "title": TITLES[w], "ops": len(seq),
                   "peak_live": seq.peak_live, "digest": digest(seq)})
    digests = {w["name"]: w["digest"] for w in wl}
    if jobs is None:
        jobs = min(os.cpu_count() or 1, 8)
    jobs = max(1, int(jobs)) if simulated else 1
    cells = {(a, w): {"allocator": a, "workload": w} for a in runnable
             for w in workloads}

    def spec(a, w, mode):
        return {"allocator": a, "workload": w, "mode": mode, "seed": seed,
                "cap": cap, "ops": ops}

    def absorb(r):
        cell = cells[(r["allocator"], r["workload"])]
        if r.get("digest") not in (None, digests[r["workload"]]):
            r = dict(r, error="ran other operations (digest %s, not %s)"
                     % (r["digest"], digests[r["workload"]]))
        for key in ("skipped", "error", "oom"):
            if key in r and key not in cell:
                cell[key] = r[key]
        for key in ("peak_used", "held_after", "baseline", "total",
                    "first_allocation", "us_per_op", "failed_at"):
            if key in r:
                cell[key] = r[key]
        if progress is not None:
            progress("%s %s %s" % (r["allocator"], r["workload"], r["mode"]))

    def timeout():
        return max(1.0, min(CHILD_LIMIT_S, deadline - time.perf_counter()))

    def spent():
        return time.perf_counter() >= deadline

    # Sampling passes: an allocator found absent in its first child is
    # not started again.
    absent = set()
    todo = [spec(a, w, "sample") for a in runnable for w in workloads]
    if jobs > 1:
        from concurrent.futures import ThreadPoolExecutor

        def one(s):
            return None if spent() else _spawn(s, timeout())

        with ThreadPoolExecutor(jobs) as ex:
            for r in ex.map(one, todo):
                if r is not None:
                    absorb(r)
    else:
        for s in todo:
            if s["allocator"] in absent:
                absorb(dict(s, skipped=notes.get(s["allocator"], "")))
                continue
            if spent():
                continue
            r = _spawn(s, timeout())
            if "skipped" in r:
                absent.add(s["allocator"])
                notes[s["allocator"]] = "skipped: " + r["skipped"]
            absorb(r)
    for a in runnable:
        first = cells[(a, workloads[0])] if workloads else {}
        if "skipped" in first:
            notes[a] = "skipped: " + first["skipped"]
    # Timing passes, one at a time.
    for a in runnable:
        for w in workloads:
            cell = cells[(a, w)]
            if "skipped" in cell or "peak_used" not in cell \
                    or "oom" in cell or "error" in cell or spent():
                continue
            absorb(_spawn(spec(a, w, "time"), timeout()))
    results = []
    for a in runnable:
        for w in workloads:
            cell = cells[(a, w)]
            if not any(k in cell for k in ("peak_used", "skipped", "error",
                                           "oom")):
                cell["not_run"] = "the run's time budget was spent"
            live = next(x["peak_live"] for x in wl if x["name"] == w)
            if "peak_used" in cell and "oom" not in cell \
                    and "error" not in cell:
                cell["ratio"] = cell["peak_used"] / live
            results.append(cell)
    device = None
    for c in results:
        if "total" in c:
            device = {"total_memory": c["total"]}
            break
    return {"schema": SCHEMA_VERSION, "backend": backend,
            "simulated": simulated, "device": _device(device),
            "cap": cap, "ops": ops, "seed": seed, "method": METHOD,
            "workloads": wl, "allocators": allocators, "notes": notes,
            "results": results,
            "elapsed_s": round(time.perf_counter() - t_start, 2)}


def _device(seen):
    """The device's name (read without making a context here: a child
    made its own) and its total memory as a child saw it."""
    out = dict(seen or {})
    try:
        import cudamem

        dev = cudamem.gpus[0]._device
        name = dev.name
        out["name"] = name.decode() if isinstance(name, bytes) else name
    except Exception:  # noqa: BLE001 - the name is decoration
        out.setdefault("name", "unknown device")
    return out


# ---------------------------------------------------------------------------
# output


def _fmt_bytes(n):
    if n >= GiB:
        return "%.2f GiB" % (n / GiB)
    if n >= MiB:
        return "%.1f MiB" % (n / MiB)
    return "%.1f KiB" % (n / KiB)


def _cell(c):
    if "skipped" in c:
        return "skipped"
    if "oom" in c:
        return "OOM at op %d (%s used)" % (c.get("failed_at", 0) + 1,
                                           _fmt_bytes(c.get("peak_used", 0)))
    if "error" in c:
        return "error"
    if "not_run" in c:
        return "not run"
    us = c.get("us_per_op")
    return "%.3f (%s)" % (c["ratio"], "%.1f µs" % us if us is not None
                          else "no time")


def format_table(res):
    """The results as markdown: a heading, the method, one row per
    allocator, a row of peak live bytes, then the notes."""
    sim = (" (SIMULATED: cudamem's CPU simulator, not a GPU)"
           if res["simulated"] else "")
    dev = res["device"]
    lines = [
        "## Memory efficiency on %s [%s]%s" % (dev.get("name", "?"),
                                               res["backend"], sim),
        "",
        "Peak device memory used / peak live bytes (lower is better, 1.0 "
        "the floor), and (µs per operation); live set capped at %s, about "
        "%d operations per workload, seed %d." % (
            _fmt_bytes(res["cap"]), res["ops"], res["seed"]),
        "Method: %s." % res["method"],
        "",
    ]
    wl = res["workloads"]
    lines.append("| allocator | " + " | ".join(w["title"] for w in wl)
                 + " |")
    lines.append("|---" * (len(wl) + 1) + "|")
    by = {(c["allocator"], c["workload"]): c for c in res["results"]}
    for a in res["allocators"]:
        if not any((a, w["name"]) in by for w in wl):
            continue
        cells = [_cell(by[(a, w["name"])]) for w in wl]
        if all(c == "skipped" for c in cells):
            continue
        lines.append("| %s | %s |" % (LABELS[a], " | ".join(cells)))
    lines.append("| peak live | %s |" % " | ".join(
        "%s in %d ops" % (_fmt_bytes(w["peak_live"]), w["ops"]) for w in wl))
    # What each library's first (256 B) allocation took, counted in its
    # peak like the rest.
    first = {}
    for c in res["results"]:
        if "first_allocation" in c:
            a = c["allocator"]
            first[a] = max(first.get(a, 0), c["first_allocation"])
    if first:
        lines.append("")
        lines.append("Of the peak, taken by the first allocation (the "
                     "most over the workloads): " + "; ".join(
                         "%s %s" % (LABELS[a], _fmt_bytes(first[a]))
                         for a in res["allocators"] if a in first) + ".")
    extra = []
    for a in res["allocators"]:
        if a in res["notes"]:
            extra.append("- %s: %s" % (LABELS[a], res["notes"][a]))
    for c in res["results"]:
        if res["notes"].get(c["allocator"], "").startswith("skipped"):
            continue
        for key in ("oom", "error", "not_run"):
            if key in c:
                extra.append("- %s, %s: %s" % (
                    LABELS[c["allocator"]], TITLES[c["workload"]], c[key]))
    if extra:
        lines.append("")
        lines.extend(extra)
    lines.append("")
    lines.append("(%.1f s)" % res["elapsed_s"])
    return "\n".join(lines)


def write_json(res, path):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        sys.exit(_child_main(sys.argv[2:]))
    sys.exit("usage: python -m cudamem._bench_memory --child SPEC "
             "(run benchmarks/mem_efficiency.py or "
             "python -m cudamem bench --memory)")
