# SPDX-License-Identifier: MIT
"""``python -m cudamem bench``: how fast this machine's host-device path
is, and how cudamem compares with the bare driver and other libraries.

Measures host-to-device, device-to-host and bidirectional bandwidth over
sizes from 4 KiB to 1 GiB for pinned memory, pageable memory copied
directly (the staging pipeline off) and pageable memory through the
staging pipeline; and the latency of device_array, to_device,
copy_to_host, pinned_array, stream and event calls.  Every figure of
cudamem's stands beside the bare driver's for the same work (cudamem's
raw test helpers, which make the driver call and nothing else), and, with
``compare=True``, beside numba-cuda, CuPy, PyTorch, RMM (its pool
resource, pinned resource and streams) and cuda.core (its
DeviceMemoryResource, LegacyPinnedMemoryResource and streams) where
installed; each is imported only then.

Each timing is the median of a few samples; a sample is the mean of
enough back-to-back calls to last a moment, and every call leaves the
device idle before it returns.
"""

import statistics
import sys
import threading
import time

import numpy as np

import cudamem
from cudamem import _core
from cudamem._bench_peers import (  # noqa: F401 - their names here too
    RMM_POOL_BYTES,
    cuda_core_module,
    load_cuda_core,
    load_rmm,
)

__all__ = ["format_table", "run", "run_memory", "write_json",
           "write_plot"]

SCHEMA_VERSION = 1
KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

METHODS = ("pinned", "pageable-direct", "pageable-staged")
DIRECTIONS = ("htod", "dtoh", "bidir")
LATENCY_OPS = ("device_array", "to_device", "copy_to_host", "pinned_array",
               "stream", "event")
LATENCY_BYTES = 4 * KiB


class _Skip(Exception):
    """This library cannot do this here."""


# ---------------------------------------------------------------------------
# progress


class _Progress:
    """A progress bar over total steps: tqdm or rich where installed, else
    one line redrawn on a terminal; nothing when disabled."""

    def __init__(self, total, enabled, stream=None):
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self._bar = None
        self._rich = None
        if not enabled:
            return
        try:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, file=self.stream,
                             unit="step", leave=False)
            return
        except ImportError:
            pass
        try:
            from rich.progress import Progress

            self._rich = Progress(transient=True)
            self._rich.start()
            self._task = self._rich.add_task("bench", total=self.total)
        except ImportError:
            self._rich = None

    def step(self, label):
        self.done += 1
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_description(label[:40])
            self._bar.update(1)
        elif self._rich is not None:
            self._rich.update(self._task, advance=1, description=label[:40])
        else:
            width = 30
            fill = width * self.done // self.total
            line = "\r[%s%s] %3d%% %-44s" % (
                "#" * fill, "." * (width - fill),
                100 * self.done // self.total, label[:44])
            self.stream.write(line)
            self.stream.flush()

    def close(self):
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        elif self._rich is not None:
            self._rich.stop()
        else:
            self.stream.write("\r" + " " * 84 + "\r")
            self.stream.flush()


# ---------------------------------------------------------------------------
# timing


def _time(fn, repeats, target):
    """Median, 10th and 90th percentile seconds per call of fn."""
    fn()                                         # warm up
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    inner = max(1, min(10000, int(target / one)))
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - t0) / inner)
    samples.sort()
    k = len(samples)
    return (statistics.median(samples), samples[int((k - 1) * 0.1)],
            samples[int(round((k - 1) * 0.9))])


class _Pair:
    """Run two callables at once on two persistent threads (the copies
    release the GIL), as one call."""

    def __init__(self, a, b):
        self._fns = (a, b)
        self._go = threading.Barrier(3)
        self._done = threading.Barrier(3)
        self._stop = False
        self._err = []
        self._threads = [threading.Thread(target=self._work, args=(f,),
                                          daemon=True) for f in self._fns]
        for t in self._threads:
            t.start()

    def _work(self, fn):
        while True:
            self._go.wait()
            if self._stop:
                return
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - re-raised below
                self._err.append(e)
            self._done.wait()

    def __call__(self):
        self._go.wait()
        self._done.wait()
        if self._err:
            raise self._err.pop()

    def close(self):
        self._stop = True
        self._go.wait()
        for t in self._threads:
            t.join()


# ---------------------------------------------------------------------------
# libraries


def _load(name):
    """The module of a library to compare with, or None."""
    if name == "rmm":
        return load_rmm()
    if name == "cuda.core":
        return load_cuda_core()
    try:
        if name == "numba":
            from numba import cuda

            cuda.current_context()
            return cuda
        if name == "cupy":
            import cupy

            cupy.cuda.runtime.getDeviceCount()
            return cupy
        if name == "torch":
            import torch

            if not torch.cuda.is_available():
                return None
            torch.cuda.init()
            return torch
    except Exception:  # noqa: BLE001 - any failure means "not here"
        return None
    return None


def _staging(enabled):
    """Turn cudamem's staging pipeline on or off; the old setting."""
    return _core._staging_config(enabled=enabled)["enabled"]


class _Buffers:
    """The host and device buffers of one size, made once."""

    def __init__(self, n):
        self.n = n
        self.pin_a = cudamem.pinned_array(n, np.uint8)
        self.pin_b = cudamem.pinned_array(n, np.uint8)
        self.pin_a[:] = 1
        self.pin_b[:] = 0
        self.page_a = np.ones(n, np.uint8)
        self.page_b = np.zeros(n, np.uint8)
        self.dev_a = cudamem.device_array(n, np.uint8)
        self.dev_b = cudamem.device_array(n, np.uint8)


def _bw_callables(lib, mod, method, b):
    """(htod, dtoh) callables of one library and method, over distinct
    buffers so that both can run at once (the bidirectional figure)."""
    pinned = method == "pinned"
    src = b.pin_a if pinned else b.page_a
    dst = b.pin_b if pinned else b.page_b
    if lib == "cudamem":
        da, db = b.dev_a, b.dev_b
        return (lambda: da.copy_to_device(src),
                lambda: db.copy_to_host(dst))
    if lib == "driver":
        if method == "pageable-staged":
            raise _Skip
        pa = b.dev_a.device_ctypes_pointer.value
        pb = b.dev_b.device_ctypes_pointer.value
        return (lambda: _core._memcpy_htod(pa, src),
                lambda: _core._memcpy_dtoh(dst, pb))
    if method == "pageable-staged":
        raise _Skip
    if lib == "rmm":
        # Device buffers from its pool, a stream per direction (the
        # default stream would serialise the two of bidir).
        da = mod.rmm.DeviceBuffer(size=b.n, mr=mod.pool)
        db = mod.rmm.DeviceBuffer(size=b.n, mr=mod.pool)
        s1, s2 = mod.Stream(), mod.Stream()

        def rhtod():
            da.copy_from_host(src, s1)
            s1.synchronize()

        def rdtoh():
            db.copy_to_host(dst, s2)
            s2.synchronize()
        return rhtod, rdtoh
    if lib == "cuda.core":
        # Its buffers copy to and from its own buffers: host memory is its
        # pinned resource's, so it has no pageable figure.
        if not pinned:
            raise _Skip
        s1, s2 = mod.dev.create_stream(), mod.dev.create_stream()
        hp = mod.pinned.allocate(b.n)
        hq = mod.pinned.allocate(b.n)
        da = mod.mr.allocate(b.n, stream=s1)
        db = mod.mr.allocate(b.n, stream=s2)

        def chtod():
            da.copy_from(hp, stream=s1)
            s1.sync()

        def cdtoh():
            hq.copy_from(db, stream=s2)
            s2.sync()
        return chtod, cdtoh
    if lib == "numba":
        da = mod.device_array(b.n, np.uint8)
        db = mod.device_array(b.n, np.uint8)
        if pinned:
            s2 = mod.pinned_array(b.n, np.uint8)
            d2 = mod.pinned_array(b.n, np.uint8)
            s2[:] = 1
        else:
            s2, d2 = src, dst
        return (lambda: da.copy_to_device(s2), lambda: db.copy_to_host(d2))
    if lib == "cupy":
        cp = mod
        da = cp.empty(b.n, cp.uint8)
        db = cp.empty(b.n, cp.uint8)
        if pinned:
            import cupyx

            s2 = cupyx.empty_pinned(b.n, np.uint8)
            d2 = cupyx.empty_pinned(b.n, np.uint8)
            s2[:] = 1
        else:
            s2, d2 = src, dst

        def htod():
            da.set(s2)
            cp.cuda.get_current_stream().synchronize()

        def dtoh():
            db.get(out=d2)
            cp.cuda.get_current_stream().synchronize()
        return htod, dtoh
    if lib == "torch":
        torch = mod
        da = torch.empty(b.n, dtype=torch.uint8, device="cuda")
        db = torch.empty(b.n, dtype=torch.uint8, device="cuda")
        s2 = torch.ones(b.n, dtype=torch.uint8, pin_memory=pinned)
        d2 = torch.empty(b.n, dtype=torch.uint8, pin_memory=pinned)

        def htod():
            da.copy_(s2)
            torch.cuda.synchronize()

        def dtoh():
            d2.copy_(db)
            torch.cuda.synchronize()
        return htod, dtoh
    raise _Skip


def _lat_callables(lib, mod):
    """{op: callable} of one library's latency figures."""
    n = LATENCY_BYTES
    host = np.ones(n, np.uint8)
    ops = {}
    if lib == "cudamem":
        d = cudamem.to_device(host)
        out = np.empty_like(host)
        ev = cudamem.event()
        ops["device_array"] = lambda: cudamem.device_array(n, np.uint8)
        ops["to_device"] = lambda: cudamem.to_device(host)
        ops["copy_to_host"] = lambda: d.copy_to_host(out)
        ops["pinned_array"] = lambda: cudamem.pinned_array(MiB, np.uint8)
        ops["stream"] = lambda: cudamem.stream()

        def event():
            ev.record()
            ev.synchronize()
        ops["event"] = event
        return ops, (d, ev)
    if lib == "driver":
        p = _core._device_alloc(n)
        out = np.empty_like(host)
        ev = _core._raw_event_create(0)

        def dev():
            _core._device_free(_core._device_alloc(n))

        def to_dev():
            q = _core._device_alloc(n)
            _core._memcpy_htod(q, host)
            _core._device_free(q)

        ops["device_array"] = dev
        ops["to_device"] = to_dev
        ops["copy_to_host"] = lambda: _core._memcpy_dtoh(out, p)
        ops["pinned_array"] = lambda: _core._host_free(
            _core._host_alloc(MiB, 0))
        ops["stream"] = lambda: _core._raw_stream_destroy(
            _core._raw_stream_create(0))
        ops["event"] = lambda: _core._raw_event_record_sync(ev, 0)

        def cleanup():
            _core._device_free(p)
            _core._raw_event_destroy(ev)
        return ops, cleanup
    if lib == "rmm":
        buf, pool, pinned = mod.rmm.DeviceBuffer, mod.pool, mod.pinned
        d = buf(size=n, mr=pool)
        d.copy_from_host(host)
        out = np.empty_like(host)

        def rto_dev():
            x = buf(size=n, mr=pool)
            x.copy_from_host(host)               # the default stream: synced
            return x
        ops["device_array"] = lambda: buf(size=n, mr=pool)
        ops["to_device"] = rto_dev
        ops["copy_to_host"] = lambda: d.copy_to_host(out)
        ops["pinned_array"] = lambda: pinned.deallocate(
            pinned.allocate(MiB), MiB)
        ops["stream"] = mod.Stream
        return ops, (d,)
    if lib == "cuda.core":
        s, mr, pinned, dev = mod.stream, mod.mr, mod.pinned, mod.dev
        ev = s.record()
        ops["device_array"] = lambda: mr.allocate(n, stream=s).close(s)
        ops["pinned_array"] = lambda: pinned.allocate(MiB).close()
        ops["stream"] = lambda: dev.create_stream().close()

        def cevent():
            s.record(ev)
            ev.sync()
        ops["event"] = cevent
        return ops, (ev,)
    if lib == "numba":
        cuda = mod
        d = cuda.to_device(host)
        out = np.empty_like(host)
        ev = cuda.event()
        ops["device_array"] = lambda: cuda.device_array(n, np.uint8)
        ops["to_device"] = lambda: cuda.to_device(host)
        ops["copy_to_host"] = lambda: d.copy_to_host(out)
        ops["pinned_array"] = lambda: cuda.pinned_array(MiB, np.uint8)
        ops["stream"] = lambda: cuda.stream()

        def nevent():
            ev.record()
            ev.synchronize()
        ops["event"] = nevent
        return ops, (d, ev)
    if lib == "cupy":
        cp = mod
        import cupyx

        d = cp.asarray(host)
        out = np.empty_like(host)
        ev = cp.cuda.Event()

        def cp_sync(x):
            cp.cuda.get_current_stream().synchronize()
            return x
        ops["device_array"] = lambda: cp.empty(n, cp.uint8)
        ops["to_device"] = lambda: cp_sync(cp.asarray(host))
        ops["copy_to_host"] = lambda: d.get(out=out)
        ops["pinned_array"] = lambda: cupyx.empty_pinned(MiB, np.uint8)
        ops["stream"] = lambda: cp.cuda.Stream()

        def cevent():
            ev.record()
            ev.synchronize()
        ops["event"] = cevent
        return ops, (d, ev)
    if lib == "torch":
        torch = mod
        d = torch.as_tensor(host, device="cuda")
        ev = torch.cuda.Event()
        ops["device_array"] = lambda: torch.empty(n, dtype=torch.uint8,
                                                  device="cuda")
        ops["to_device"] = lambda: torch.as_tensor(host, device="cuda")
        ops["copy_to_host"] = lambda: d.cpu()
        ops["pinned_array"] = lambda: torch.empty(MiB, dtype=torch.uint8,
                                                  pin_memory=True)
        ops["stream"] = lambda: torch.cuda.Stream()

        def tevent():
            ev.record()
            ev.synchronize()
        ops["event"] = tevent
        return ops, (d, ev)
    raise _Skip


# ---------------------------------------------------------------------------
# the run


def _sizes(quick, simulated, max_size=None):
    if quick:
        sizes = [4 * KiB, 64 * KiB, MiB, 16 * MiB, 256 * MiB]
    else:
        sizes = [4 * KiB << (2 * i) for i in range(10)]   # 4 KiB .. 1 GiB
    cap = max_size
    if cap is None:
        cap = 16 * MiB if simulated else GiB
    return [s for s in sizes if s <= cap] or [min(sizes)]


def _device_info():
    dev = cudamem.get_current_device()
    free, total = cudamem.current_context().get_memory_info()
    name = dev.name
    if isinstance(name, bytes):
        name = name.decode()
    return {"id": dev.id, "name": name,
            "compute_capability": list(dev.compute_capability),
            "total_memory": total, "free_memory": free}


def run(quick=False, compare=False, progress=False, max_size=None,
        repeats=None, stream=None):
    """Run the benchmark; a JSON-ready dict of the figures.

    Parameters
    ----------
    quick : bool
        Fewer sizes (4 KiB to 256 MiB) and samples.
    compare : bool
        Also time numba-cuda, CuPy, PyTorch, RMM and cuda.core where
        installed.
    progress : bool
        Draw a progress bar on ``stream`` (default: stderr).
    max_size : int, optional
        The largest transfer (default: 1 GiB; 16 MiB on the simulator).
    repeats : int, optional
        Samples per figure (default: 3 quick, 5 full).
    """
    t_start = time.perf_counter()
    cudamem.current_context()
    backend = _core._backend()
    simulated = backend != "driver"
    sizes = _sizes(quick, simulated, max_size)
    if repeats is None:
        repeats = 3 if quick else 5
    target = 2e-4 if quick else 1e-3
    libs = ["cudamem", "driver"]
    mods = {"cudamem": cudamem, "driver": _core}
    if compare:
        for name in ("numba", "cupy", "torch", "rmm", "cuda.core"):
            m = _load(name)
            if m is not None:
                libs.append(name)
                mods[name] = m
    total = len(sizes) * len(METHODS) * len(libs) + len(libs)
    bar = _Progress(total, progress, stream)
    bandwidth = []
    latency = []
    old_staging = _staging(True)
    try:
        for size in sizes:
            bufs = _Buffers(size)
            for method in METHODS:
                _staging(method != "pageable-direct")
                for lib in libs:
                    bar.step("%s %s %s" % (lib, method, _fmt_size(size)))
                    try:
                        htod, dtoh = _bw_callables(lib, mods[lib], method,
                                                   bufs)
                    except (_Skip, ImportError):
                        continue
                    except Exception:  # noqa: BLE001 - a library's failure
                        continue
                    pair = _Pair(htod, dtoh)
                    try:
                        for direction, fn, nbytes in (
                                ("htod", htod, size), ("dtoh", dtoh, size),
                                ("bidir", pair, 2 * size)):
                            med, p10, p90 = _time(fn, repeats, target)
                            bandwidth.append({
                                "library": lib, "method": method,
                                "direction": direction, "size": size,
                                "seconds": med, "gbps": nbytes / med / 1e9,
                                "gbps_p10": nbytes / p90 / 1e9,
                                "gbps_p90": nbytes / p10 / 1e9,
                            })
                    finally:
                        pair.close()
            del bufs
            cudamem.pinned_pool_trim()     # keep no GiB of pinned memory
        _staging(True)
        for lib in libs:
            bar.step("%s latency" % lib)
            try:
                ops, keep = _lat_callables(lib, mods[lib])
            except Exception:  # noqa: BLE001 - not here
                continue
            try:
                for op in LATENCY_OPS:
                    if op not in ops:
                        continue
                    med, p10, p90 = _time(ops[op], repeats, target)
                    latency.append({"library": lib, "op": op,
                                    "us": med * 1e6, "us_p10": p10 * 1e6,
                                    "us_p90": p90 * 1e6})
            finally:
                if callable(keep):
                    keep()
                del keep
    finally:
        _staging(old_staging)
        bar.close()
    pinned = [r["gbps"] for r in bandwidth
              if r["method"] == "pinned" and r["direction"] == "htod"
              and r["library"] in ("cudamem", "driver")]
    return {
        "schema": SCHEMA_VERSION,
        "cudamem_version": cudamem.__version__,
        "backend": backend,
        "simulated": simulated,
        "quick": bool(quick),
        "device": _device_info(),
        "libraries": libs,
        "sizes": sizes,
        "repeats": repeats,
        "pcie_limit_gbps": max(pinned) if pinned else None,
        "bandwidth": bandwidth,
        "latency": latency,
        "elapsed_s": time.perf_counter() - t_start,
    }


# ---------------------------------------------------------------------------
# output


def _fmt_size(n):
    for unit, s in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= s and n % s == 0:
            return "%d %s" % (n // s, unit)
    return "%d B" % n


def format_table(res):
    """The results as text tables."""
    lines = []
    sim = " (simulated: CPU simulator, not a GPU)" if res["simulated"] else ""
    dev = res["device"]
    lines.append("cudamem %s bench on %s [%s]%s" % (
        res["cudamem_version"], dev["name"], res["backend"], sim))
    libs = res["libraries"]
    by = {}
    for r in res["bandwidth"]:
        by[(r["library"], r["method"], r["direction"], r["size"])] = r["gbps"]
    lines.append("")
    lines.append("Bandwidth, GB/s (median)")
    for method in METHODS:
        for direction in DIRECTIONS:
            cols = [lib for lib in libs
                    if any((lib, method, direction, s) in by
                           for s in res["sizes"])]
            if not cols:
                continue
            lines.append("  %s %s" % (method, direction))
            lines.append("    %-9s" % "size" + "".join(
                "%11s" % c for c in cols))
            for s in res["sizes"]:
                cells = []
                for c in cols:
                    v = by.get((c, method, direction, s))
                    cells.append("%11s" % ("-" if v is None
                                           else "%.2f" % v))
                lines.append("    %-9s" % _fmt_size(s) + "".join(cells))
    lat = {(r["library"], r["op"]): r["us"] for r in res["latency"]}
    lcols = [lib for lib in libs if any(k[0] == lib for k in lat)]
    lines.append("")
    lines.append("Latency, microseconds per call (median; %s transfers, "
                 "1 MiB pinned_array)" % _fmt_size(LATENCY_BYTES))
    lines.append("    %-14s" % "op" + "".join("%11s" % c for c in lcols))
    for op in LATENCY_OPS:
        cells = []
        for c in lcols:
            v = lat.get((c, op))
            cells.append("%11s" % ("-" if v is None else "%.1f" % v))
        lines.append("    %-14s" % op + "".join(cells))
    if res["pcie_limit_gbps"] is not None:
        lines.append("")
        lines.append("Host-to-device limit measured with pinned memory: "
                     "%.2f GB/s" % res["pcie_limit_gbps"])
    lines.append("(%.1f s)" % res["elapsed_s"])
    return "\n".join(lines)


def run_memory(quick=False, compare=False, progress=False, cap=None,
               ops=None, stream=None):
    """The memory-efficiency benchmark (``cudamem._bench_memory``) for
    cudamem's three managers, and with ``compare=True`` CuPy, PyTorch
    (with and without expandable segments), RMM and cuda.core where
    installed: a JSON-ready dict; ``_bench_memory.format_table`` prints
    it.  ``quick`` runs 4000 operations per workload instead of 20000."""
    from cudamem import _bench_memory as mem

    allocators = mem.ALLOCATORS if compare else mem.CUDAMEM
    if ops is None:
        ops = 4000 if quick else mem.DEFAULT_OPS
    bar = _Progress(2 * len(allocators) * len(mem.WORKLOADS), progress,
                    stream)
    try:
        return mem.run(allocators=allocators, cap=cap, ops=ops,
                       progress=bar.step)
    finally:
        bar.close()


def write_json(res, path):
    import json

    with open(path, "w", encoding="utf-8") as f:
        json.dump(res, f, indent=1)


# One colour per library (the line style says the method), the same in
# every run, so that a plot is read at a glance and checked by its pixels.
LIBRARY_COLORS = {"cudamem": "#1f77b4", "driver": "#ff7f0e",
                  "numba": "#2ca02c", "cupy": "#d62728", "torch": "#9467bd",
                  "rmm": "#8c564b", "cuda.core": "#e377c2"}
LIMIT_COLOR = "#808080"


def write_plot(res, path):
    """Bandwidth against size, one line per library and method, with the
    pinned path's best host-to-device figure as a reference line.  Needs
    matplotlib (``pip install matplotlib``).

    Returns what was drawn: ``size`` (width, height) of the PNG in
    pixels; ``axes``, per panel its ``title`` and ``box`` (left, top,
    right, bottom pixels of its frame, from the image's top left);
    ``series``, per line its ``library``, ``method``, ``direction``,
    ``color`` and ``points``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dpi = 110
    fig, axes = plt.subplots(1, 3, figsize=(16, 5.6), sharey=True, dpi=dpi)
    styles = {"pinned": "-", "pageable-direct": "--",
              "pageable-staged": ":"}
    markers = {"cudamem": "o", "driver": "s", "numba": "^", "cupy": "v",
               "torch": "D", "rmm": "P", "cuda.core": "X"}
    titles = {"htod": "host to device", "dtoh": "device to host",
              "bidir": "bidirectional"}
    drawn = []
    limits = {}
    for ax, direction in zip(axes, DIRECTIONS, strict=True):
        for lib in res["libraries"]:
            color = LIBRARY_COLORS.get(lib)
            for method in METHODS:
                pts = sorted((r["size"], r["gbps"]) for r in res["bandwidth"]
                             if r["library"] == lib
                             and r["method"] == method
                             and r["direction"] == direction)
                if not pts:
                    continue
                line, = ax.plot([p[0] for p in pts], [p[1] for p in pts],
                                linestyle=styles[method], color=color,
                                marker=markers.get(lib, "."), markersize=4,
                                label="%s %s" % (lib, method))
                drawn.append({"library": lib, "method": method,
                              "direction": direction,
                              "color": matplotlib.colors.to_hex(
                                  line.get_color()),
                              "points": pts})
        # The link's limit as this direction measured it: the best pinned
        # figure of any library, so that no pinned curve crosses it (the
        # two directions of a link differ, and bidirectional is a sum).
        best = max((r["gbps"] for r in res["bandwidth"]
                    if r["method"] == "pinned"
                    and r["direction"] == direction), default=0.0)
        if best > 0:
            ax.axhline(best, color=LIMIT_COLOR, linewidth=1, linestyle="-.",
                       label="best pinned (limit)")
            ax.annotate("best pinned %.1f GB/s" % best, xy=(0.01, best),
                        xycoords=("axes fraction", "data"),
                        xytext=(0, 3), textcoords="offset points",
                        fontsize=8, color=LIMIT_COLOR)
        limits[direction] = best
        ax.set_xscale("log", base=2)
        ticks = _size_ticks(res)
        ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(ticks))
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(
            lambda x, _pos: size_label(x)))
        ax.set_xlabel("transfer size")
        ax.set_title(titles[direction])
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("GB/s")
    # The legend goes under the panels, where it hides no line.
    handles, labels = axes[0].get_legend_handles_labels()
    for ax in axes[1:]:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="lower center", fontsize=8,
               ncol=min(len(labels), 6), frameon=False)
    title = "cudamem bench: %s" % res["device"]["name"]
    if res["simulated"]:
        title += " (SIMULATED: CPU simulator, not a GPU)"
    fig.suptitle(title)
    rows = (len(labels) + 5) // 6
    fig.tight_layout(rect=(0, 0.035 * rows + 0.02, 1, 1))
    fig.savefig(path, dpi=dpi)
    width, height = fig.canvas.get_width_height()
    boxes = []
    for ax, direction in zip(axes, DIRECTIONS, strict=True):
        b = ax.get_window_extent()
        boxes.append({"title": titles[direction],
                      "box": [float(b.x0), float(height - b.y1),
                              float(b.x1), float(height - b.y0)]})
    xticks = [t.get_text() for t in axes[0].get_xticklabels()]
    plt.close(fig)
    return {"size": [width, height], "axes": boxes, "series": drawn,
            "limits": limits, "xticks": xticks}


def size_label(n):
    """A byte count as the plot's axis writes it: '512 B', '4 KiB',
    '1 MiB', '1.5 GiB'."""
    n = float(n)
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            v = n / (1 << shift)
            return ("%d %s" if v == int(v) else "%.3g %s") % (v, unit)
    return "%d B" % n


def _size_ticks(res):
    """The sizes labelled on the x axis: the measured ones when there are
    few, else every other power of two from the smallest."""
    sizes = sorted({r["size"] for r in res["bandwidth"]}) or \
        sorted(res.get("sizes") or [4096])
    if len(sizes) <= 8:
        return sizes
    ticks = [sizes[0]]
    while ticks[-1] * 4 <= sizes[-1]:
        ticks.append(ticks[-1] * 4)
    return ticks
