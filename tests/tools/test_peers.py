# SPDX-License-Identifier: MIT
"""RMM and cuda.core as the benchmarks' peers (``python -m cudamem bench
--compare`` and benchmarks/): imported only when compared, and called
the way their documented interfaces ask.

Neither library runs without a GPU, so on the simulator the calls go to
stand-ins written here from the interfaces of rmm 26.10 and cuda.core
(keyword-only ``stream`` on cuda.core's ``allocate`` and ``copy_from``,
``DeviceBuffer`` taking keywords only, ``deallocate`` given the size
that was allocated): a call of the wrong shape fails, and every
allocation a benchmark makes must be given back.  These check the
wiring, not the libraries; ``test_real_peers`` runs the same callables
against the installed libraries on a GPU (skipped elsewhere), and
``benchmarks/peers_smoke.py`` is the same check as a script.
"""

import gc
import itertools
import sys
import types

import pytest

from cudamem import _bench
from helpers import ROOT, run_py

BENCH = str(ROOT / "benchmarks")


class _Registry:
    """The allocations the stand-ins hold, by address."""

    def __init__(self):
        self.live = {}
        self.calls = []
        self._next = itertools.count(0x10000, 0x1000)

    def alloc(self, owner, size):
        assert isinstance(size, int) and size > 0, size
        ptr = next(self._next)
        self.live[ptr] = (owner, size)
        return ptr

    def free(self, owner, ptr, size):
        assert self.live.pop(ptr) == (owner, size), "wrong free"


def _fake_rmm(reg):
    rmm = types.ModuleType("rmm")
    mr = types.ModuleType("rmm.mr")
    pylibrmm = types.ModuleType("rmm.pylibrmm")
    stream_mod = types.ModuleType("rmm.pylibrmm.stream")
    allocators = types.ModuleType("rmm.allocators")
    cupy_alloc = types.ModuleType("rmm.allocators.cupy")

    class Stream:
        def __init__(self, obj=None):
            self.synced = 0
            reg.calls.append("rmm.Stream")

        def synchronize(self):
            self.synced += 1

    default = Stream()

    class _Resource:
        def allocate(self, nbytes, stream=default):
            return reg.alloc(self, nbytes)

        def deallocate(self, ptr, nbytes, stream=default):
            reg.free(self, ptr, nbytes)

    class CudaMemoryResource(_Resource):
        pass

    class PinnedHostMemoryResource(_Resource):
        pass

    class PoolMemoryResource(_Resource):
        def __init__(self, upstream_mr, initial_pool_size=None,
                     maximum_pool_size=None):
            assert isinstance(upstream_mr, _Resource)
            self.upstream = upstream_mr

    class DeviceBuffer:
        def __init__(self, *, ptr=0, size=0, stream=default, mr=None):
            assert isinstance(mr, _Resource)
            self.mr, self.size = mr, size
            self.ptr = mr.allocate(size, stream)

        def copy_from_host(self, ary, stream=default):
            assert memoryview(ary).nbytes <= self.size

        def copy_to_host(self, ary=None, stream=default):
            assert memoryview(ary).nbytes >= self.size
            return ary

        def __del__(self):
            self.mr.deallocate(self.ptr, self.size)

    def set_current_device_resource(resource):
        mr.current = resource

    for cls in (CudaMemoryResource, PinnedHostMemoryResource,
                PoolMemoryResource, set_current_device_resource):
        setattr(mr, cls.__name__, cls)
    stream_mod.Stream = Stream
    stream_mod.DEFAULT_STREAM = default
    rmm.DeviceBuffer = DeviceBuffer
    rmm.mr, rmm.pylibrmm, rmm.allocators = mr, pylibrmm, allocators
    pylibrmm.stream = stream_mod
    allocators.cupy = cupy_alloc
    cupy_alloc.rmm_cupy_allocator = lambda nbytes: None
    return {"rmm": rmm, "rmm.mr": mr, "rmm.pylibrmm": pylibrmm,
            "rmm.pylibrmm.stream": stream_mod,
            "rmm.allocators": allocators,
            "rmm.allocators.cupy": cupy_alloc}


def _fake_cuda_core(reg, experimental):
    """cuda.core with the classes at the top (newer releases) or, with
    experimental, only in cuda.core.experimental."""
    cuda = types.ModuleType("cuda")
    core = types.ModuleType("cuda.core")
    ns = types.ModuleType("cuda.core.experimental") if experimental \
        else core

    class Event:
        def sync(self):
            pass

    class Stream:
        closed = False

        def sync(self):
            assert not self.closed

        def record(self, event=None, options=None):
            return event if event is not None else Event()

        def close(self):
            self.closed = True

    class Buffer:
        def __init__(self, mr, size):
            self.mr, self.size = mr, size
            self.ptr = reg.alloc(mr, size)

        def copy_from(self, src, *, stream):
            assert isinstance(src, Buffer) and src.size == self.size
            assert isinstance(stream, Stream)

        def close(self, stream=None):
            if self.ptr is not None:
                reg.free(self.mr, self.ptr, self.size)
                self.ptr = None

        def __del__(self):
            self.close()

    class DeviceMemoryResource:
        def __init__(self, device_id, options=None):
            assert isinstance(device_id, int)

        def allocate(self, size, *, stream):
            assert isinstance(stream, Stream)
            return Buffer(self, size)

    class PinnedMemoryResource(DeviceMemoryResource):
        def __init__(self, options=None):
            pass

    class LegacyPinnedMemoryResource:
        def allocate(self, size, *, stream=None):
            return Buffer(self, size)

    class Device:
        def __init__(self, device_id=None):
            self.device_id = device_id or 0
            self.current = False

        def set_current(self):
            self.current = True

        def create_stream(self, obj=None, options=None):
            assert self.current
            reg.calls.append("cuda.core.create_stream")
            return Stream()

    for cls in (Device, DeviceMemoryResource, PinnedMemoryResource,
                LegacyPinnedMemoryResource, Buffer, Stream, Event):
        setattr(ns, cls.__name__, cls)
    cuda.core = core
    mods = {"cuda": cuda, "cuda.core": core}
    if experimental:
        core.experimental = ns
        mods["cuda.core.experimental"] = ns
    return mods


@pytest.fixture(params=["cuda.core", "cuda.core.experimental"])
def fakes(request, monkeypatch):
    reg = _Registry()
    mods = _fake_rmm(reg)
    mods.update(_fake_cuda_core(reg, request.param.endswith("experimental")))
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.syspath_prepend(BENCH)
    yield reg
    gc.collect()
    assert reg.live == {}, "allocations not given back"


def _drain(reg):
    gc.collect()
    return dict(reg.live)


# ---------------------------------------------------------------------------


def test_not_imported_unless_compared():
    rc, out = run_py("""
        import sys
        from cudamem import _bench
        res = _bench.run(quick=True, max_size=4096, repeats=1)
        assert res["libraries"] == ["cudamem", "driver"], res["libraries"]
        for name in ("rmm", "cuda", "cuda.core", "cupy", "torch"):
            assert name not in sys.modules, name
        print("ok")
        """)
    assert rc == 0, out


def test_loaders(fakes):
    p = _bench.load_rmm()
    assert p is not None and p.name == "rmm"
    assert p.pool.upstream.__class__.__name__ == "CudaMemoryResource"
    c = _bench.load_cuda_core()
    assert c is not None and c.name == "cuda.core"
    assert c.dev.current
    assert _drain(fakes) == {}


def test_bench_latency_and_bandwidth(fakes):
    rmm = _bench.load_rmm()
    core = _bench.load_cuda_core()
    for lib, mod in (("rmm", rmm), ("cuda.core", core)):
        ops, keep = _bench._lat_callables(lib, mod)
        want = {"device_array", "pinned_array", "stream"}
        assert want <= set(ops), lib
        assert set(ops) <= set(_bench.LATENCY_OPS)
        base = _drain(fakes)
        for fn in ops.values():
            for _ in range(3):
                fn()
        assert _drain(fakes) == base, lib
        del keep
    bufs = _bench._Buffers(4096)
    for method in ("pinned", "pageable-direct"):
        h, d = _bench._bw_callables("rmm", rmm, method, bufs)
        h()
        d()
    h, d = _bench._bw_callables("cuda.core", core, "pinned", bufs)
    h()
    d()
    with pytest.raises(_bench._Skip):
        _bench._bw_callables("cuda.core", core, "pageable-direct", bufs)
    with pytest.raises(_bench._Skip):
        _bench._bw_callables("rmm", rmm, "pageable-staged", bufs)
    del h, d


def test_bench_compare_has_their_columns(fakes):
    res = _bench.run(quick=True, compare=True, max_size=4096, repeats=1)
    assert {"rmm", "cuda.core"} <= set(res["libraries"])
    lat = {(r["library"], r["op"]) for r in res["latency"]}
    for lib in ("rmm", "cuda.core"):
        for op in ("device_array", "pinned_array", "stream"):
            assert (lib, op) in lat
    bw = {(r["library"], r["method"]) for r in res["bandwidth"]}
    assert ("rmm", "pageable-direct") in bw and ("cuda.core", "pinned") in bw
    assert ("cuda.core", "pageable-direct") not in bw
    head = [ln for ln in _bench.format_table(res).splitlines()
            if ln.strip().startswith("op ")][0]
    assert "rmm" in head and "cuda.core" in head


def test_benchmark_rows(fakes):
    import harness
    import ops_alloc
    import ops_hostmem
    import ops_interop
    import ops_streams

    assert harness.LIBS.index("rmm") < harness.LIBS.index("driver")
    peers = {"rmm": harness.load_lib("rmm"),
             "cuda.core": harness.load_lib("cuda.core")}
    assert None not in peers.values()
    base = _drain(fakes)
    rows = {}
    for op in (ops_alloc.OPS + ops_hostmem.OPS + ops_streams.OPS
               + ops_interop.OPS):
        for lib in peers:
            if lib in op["impls"]:
                rows.setdefault(op["name"], []).append(lib)
    want = ["alloc+drop churn 1K-4M [default]", "alloc+drop 256 B [pool]",
            "alloc+drop 256 B [async]", "pinned_array(1 MiB) [pool off]",
            "pinned_array(1 MiB) [default: pooled]",
            "stream() create+drop"]
    for name in want:
        assert sorted(rows[name]) == ["cuda.core", "rmm"], name
    assert rows["cupy.empty(256) [use_with_cupy]"] == ["rmm"]
    for op in ops_alloc.OPS + ops_hostmem.OPS + ops_streams.OPS:
        for lib, mod in peers.items():
            factory = op["impls"].get(lib)
            if factory is None:
                continue
            fn = factory(mod)
            for _ in range(20):      # the churn row goes round its sizes
                fn()
            del fn
    calls = fakes.calls
    assert "rmm.Stream" in calls and "cuda.core.create_stream" in calls
    assert _drain(fakes) == base


# ---------------------------------------------------------------------------
# the real libraries, on a GPU


@pytest.mark.gpu
def test_real_peers():
    """What the benchmarks call, against the installed RMM and cuda.core,
    in a process of its own (RMM's pool and cuda.core's current device
    stay out of the suite's)."""
    rc, out = run_py("""
        import sys
        sys.path.insert(0, %r)
        import numpy as np
        from cudamem import _bench
        import harness, ops_alloc, ops_hostmem, ops_streams
        got = []
        for lib in ("rmm", "cuda.core"):
            try:
                __import__("rmm" if lib == "rmm" else "cuda.core")
            except ImportError:
                continue
            mod = harness.load_lib(lib)
            assert mod is not None, lib + " is installed but did not load"
            ops, keep = _bench._lat_callables(lib, mod)
            for fn in ops.values():
                fn()
            b = _bench._Buffers(1 << 20)
            for method in ("pinned", "pageable-direct"):
                try:
                    h, d = _bench._bw_callables(lib, mod, method, b)
                except _bench._Skip:
                    continue
                h()
                d()
            for op in ops_alloc.OPS + ops_hostmem.OPS + ops_streams.OPS:
                f = op["impls"].get(lib)
                if f is None:
                    continue
                try:
                    fn = f(mod)
                except harness.Skip:
                    continue
                for _ in range(20):
                    fn()
            got.append(lib)
        print("peers:", " ".join(got) or "none")
        """ % BENCH, timeout=300)
    assert rc == 0, out
    if "peers: none" in out:
        pytest.skip("neither RMM nor cuda.core is installed")
