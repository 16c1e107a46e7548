# SPDX-License-Identifier: MIT
"""cudamem.dask: distributed's "cuda" and "dask" serialiser families for
every cudamem array type, dtype and layout, sizeof, registration without
importing cudamem.dask, the worker plugin, and a two-process LocalCluster
moving DeviceNDArrays between workers.  Skipped without distributed."""

import gc
import textwrap
import time

import numpy as np
import pytest

import cudamem
from helpers import ROOT, run_child

distributed = pytest.importorskip("distributed")

from dask.sizeof import sizeof  # noqa: E402
from distributed.protocol import (  # noqa: E402
    deserialize,
    deserialize_bytes,
    serialize,
    serialize_bytes,
)

import cudamem.dask as cdask  # noqa: E402

DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32,
          np.uint32, np.int64, np.uint64, np.float16, np.float32,
          np.float64, np.complex64, np.complex128, "datetime64[ns]",
          "S5", np.dtype([("a", "<f8"), ("b", "<i4"), ("c", "u1", (2,))])]

LAYOUTS = ["c2d", "f2d", "strided", "scalar", "empty", "1d", "transposed3d"]


def _host(dtype, layout):
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 255, size=6 * 5 * 4 * dtype.itemsize,
                       dtype=np.uint8)
    base = raw.view(dtype)[:120].reshape(6, 5, 4)
    if layout == "c2d":
        return np.ascontiguousarray(base[:, :, 0])
    if layout == "f2d":
        return np.asfortranarray(base[:, :, 0])
    if layout == "strided":
        return base[::2, 1::2, 3]
    if layout == "scalar":
        return np.ascontiguousarray(base[1, 2, 3])
    if layout == "empty":
        return base[:0, :, 0].copy()
    if layout == "1d":
        return base.reshape(-1)
    if layout == "transposed3d":
        return base.transpose(2, 0, 1)
    raise AssertionError(layout)


def _device(host, layout):
    """A DeviceNDArray with host's values; strided and transposed layouts
    come as views of a bigger device array."""
    if layout == "strided":
        big = np.ascontiguousarray(_host(host.dtype, "1d").reshape(6, 5, 4))
        d = cudamem.to_device(big)
        v = d[::2, 1::2, 3]
        assert not v.is_c_contiguous() and not v.is_f_contiguous()
        return v
    return cudamem.to_device(host)


def _check(out, host, kind):
    if kind == "device":
        assert isinstance(out, cudamem.DeviceNDArray)
        got = out.copy_to_host()
    else:
        cls = (cudamem.MappedNDArray if kind == "mapped"
               else cudamem.ManagedNDArray)
        assert isinstance(out, cls)
        got = np.asarray(out)
    assert got.shape == host.shape
    assert got.dtype == host.dtype
    assert got.tobytes() == np.ascontiguousarray(host).tobytes()


def _make(kind, host, layout):
    if kind == "device":
        return _device(host, layout)
    make = cudamem.mapped_array if kind == "mapped" else cudamem.managed_array
    if layout == "strided":
        big = _host(host.dtype, "1d").reshape(6, 5, 4)
        arr = make(big.shape, dtype=big.dtype)
        arr[...] = big
        return arr[::2, 1::2, 3]
    order = "F" if host.flags.f_contiguous and not host.flags.c_contiguous \
        else "C"
    arr = make(host.shape, dtype=host.dtype, order=order)
    arr[...] = host
    return arr


# ---------------------------------------------------------------------------
# Round trips
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["cuda", "dask"])
@pytest.mark.parametrize("kind", ["device", "mapped", "managed"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_round_trip(ctx, family, kind, dtype, layout):
    host = _host(dtype, layout)
    x = _make(kind, host, layout)
    header, frames = serialize(x, serializers=(family,))
    assert header["serializer"] == family
    assert len(frames) == 1
    if family == "cuda" and kind == "device":
        assert isinstance(frames[0], cudamem.DeviceNDArray)
        assert frames[0].nbytes == host.nbytes
    if family == "dask":
        assert memoryview(frames[0]).nbytes == host.nbytes
    out = deserialize(header, frames)
    _check(out, host, kind)
    if layout in ("c2d", "f2d") and kind == "device":
        # A contiguous array keeps its order.
        assert out.is_c_contiguous() == x.is_c_contiguous()
        assert out.is_f_contiguous() == x.is_f_contiguous()


@pytest.mark.parametrize("kind", ["device", "mapped", "managed"])
def test_dask_family_through_bytes(ctx, kind):
    # The header goes through msgpack, frames through bytes, as over TCP.
    host = np.arange(60, dtype=np.float32).reshape(6, 10)
    x = _make(kind, host, "c2d")
    blob = serialize_bytes(x, serializers=("dask",))
    out = deserialize_bytes(blob)
    _check(out, host, kind)


def test_cuda_frames_may_be_any_cuda_array(ctx):
    host = np.arange(24, dtype=np.int16).reshape(4, 6)
    header, frames = serialize(cudamem.to_device(host),
                               serializers=("cuda",))

    class Foreign:
        """Device bytes known only by their CUDA Array Interface (what a
        UCX comm hands over)."""

        def __init__(self, owner):
            self.owner = owner
            self.__cuda_array_interface__ = \
                owner.__cuda_array_interface__

    out = deserialize(header, [Foreign(frames[0])])
    _check(out, host, "device")


def test_device_frames_keep_the_memory_alive(ctx):
    host = np.arange(1000, dtype=np.float64)
    header, frames = serialize(cudamem.to_device(host),
                               serializers=("cuda",))
    out = deserialize(header, frames)
    del frames
    gc.collect()
    assert (out.copy_to_host() == host).all()


def test_sizeof(ctx):
    d = cudamem.device_array((100, 10), dtype=np.float32)
    assert sizeof(d) == 4000
    assert sizeof(cudamem.mapped_array(100, dtype=np.int64)) >= 800
    assert sizeof(cudamem.managed_array(100, dtype=np.int64)) >= 800


def test_no_leak_after_round_trips(ctx):
    gc.collect()
    before = cudamem.memory_stats()["allocated_bytes"]
    for family in ("cuda", "dask"):
        x = cudamem.to_device(np.arange(4096, dtype=np.uint8))
        h, f = serialize(x, serializers=(family,))
        out = deserialize(h, f)
        del x, h, f, out
    gc.collect()
    assert cudamem.memory_stats()["allocated_bytes"] == before


# ---------------------------------------------------------------------------
# Registration without importing cudamem.dask
# ---------------------------------------------------------------------------


CHECK = """
import numpy as np
from distributed.protocol import serialize, deserialize
a = cudamem.to_device(np.arange(10.0))
h, f = serialize(a, serializers=("dask",))
assert h["serializer"] == "dask", h
assert (deserialize(h, f).copy_to_host() == np.arange(10.0)).all()
h, f = serialize(a, serializers=("cuda",))
assert h["serializer"] == "cuda", h
from dask.sizeof import sizeof
assert sizeof(a) == 80
print("ok")
"""


@pytest.mark.parametrize("order", ["cudamem first", "distributed first",
                                   "dask first"])
def test_registered_without_importing_cudamem_dask(order):
    first = {"cudamem first": "import cudamem\nimport distributed\n",
             "distributed first": "import distributed\nimport cudamem\n",
             "dask first": "import dask\nimport cudamem\n"
                           "import distributed\n"}[order]
    p = run_child(first + CHECK, timeout=120, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip() == "ok"


def test_sizeof_entry_point_registers_lazily():
    code = textwrap.dedent("""
        import sys
        import dask.sizeof
        import cudamem.dask as cd
        from dask.utils import Dispatch
        d = Dispatch("sizeof")
        d.register(object)(lambda x: -1)
        cd._sizeof_entry_point(d)
        assert "cudamem" in d._lazy
        import cudamem
        assert d(cudamem.device_array(10)) == 80
        print("ok")
    """)
    p = run_child(code, timeout=120, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip() == "ok"


def test_the_entry_point_is_declared():
    tomllib = pytest.importorskip("tomllib")

    with open(ROOT / "pyproject.toml", "rb") as f:
        meta = tomllib.load(f)["project"]
    ep = meta["entry-points"]["dask.sizeof"]["cudamem"]
    mod, _, fn = ep.partition(":")
    assert mod == "cudamem.dask" and callable(getattr(cdask, fn))
    assert set(meta["optional-dependencies"]["dask"]) >= {
        "dask>=2023.1", "distributed>=2023.1"}


def test_plugin_sets_up_the_worker_process():
    code = textwrap.dedent("""
        import cudamem
        from cudamem.dask import CudamemPlugin
        import distributed, pickle
        p = pickle.loads(pickle.dumps(
            CudamemPlugin(manager="pool", staging={"threshold": 1 << 20})))
        assert isinstance(p, distributed.WorkerPlugin)
        p.setup(None)
        from cudamem import _core
        assert _core._staging_config()["threshold"] == 1 << 20
        assert cudamem.memory_stats()["manager"] == "pool"
        print("ok")
    """)
    p = run_child(code, timeout=120, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip() == "ok"


def test_plugin_rejects_bad_settings():
    with pytest.raises(ValueError, match="unknown built-in memory manager"):
        cdask.CudamemPlugin(manager="nope").setup(None)


# ---------------------------------------------------------------------------
# A LocalCluster of two worker processes
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster():
    from distributed import Client, LocalCluster

    # Worker processes inherit the environment (the simulator switch and
    # the path to this cudamem).
    with LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                      dashboard_address=None) as lc, Client(lc) as client:
        client.register_plugin(cdask.CudamemPlugin(manager="pool"))
        yield client


def _worker_bytes(client):
    def stats():
        import gc

        import cudamem

        gc.collect()
        s = cudamem.memory_stats()
        return s["allocated_bytes"], s["manager"]

    return client.run(stats)


def _wait_released(client, timeout=30):
    deadline = time.monotonic() + timeout
    while True:
        got = _worker_bytes(client)
        if all(b == 0 for b, _ in got.values()) \
                or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


@pytest.mark.slow
def test_device_arrays_travel_between_workers(cluster):
    client = cluster
    w0, w1 = sorted(client.scheduler_info()["workers"])

    def make(n, seed):
        import numpy as np

        import cudamem

        rng = np.random.default_rng(seed)
        return cudamem.to_device(rng.standard_normal(n))

    def scale(a, k):
        import cudamem

        return cudamem.to_device(a.copy_to_host() * k)

    def view(a):
        return a.reshape(100, 100)[::3, 1::2]   # non-contiguous

    def total(*arrays):
        return [float(a.copy_to_host().sum()) for a in arrays]

    def mapped(n):
        import numpy as np

        import cudamem

        m = cudamem.mapped_array(n, dtype=np.int32)
        m[:] = np.arange(n)
        return m

    x = client.submit(make, 10000, 1, workers=[w0])
    y = client.submit(scale, x, 3.0, workers=[w1])
    v = client.submit(view, x, workers=[w0])
    s = client.submit(total, x, y, v, workers=[w1])
    m = client.submit(mapped, 1000, workers=[w0])
    msum = client.submit(lambda a: int(a.sum()), m, workers=[w1])
    host = np.random.default_rng(1).standard_normal(10000)
    got_y, got_v, sums, got_msum = client.gather([y, v, s, msum])
    assert isinstance(got_y, cudamem.DeviceNDArray)
    assert (got_y.copy_to_host() == host * 3.0).all()
    assert (got_v.copy_to_host() == host.reshape(100, 100)[::3, 1::2]).all()
    assert sums == [float(host.sum()), float((host * 3.0).sum()),
                    float(host.reshape(100, 100)[::3, 1::2].sum())]
    assert got_msum == sum(range(1000))
    managers = {mgr for _, mgr in _worker_bytes(client).values()}
    assert managers == {"pool"}
    del x, y, v, s, m, msum, got_y, got_v
    got = _wait_released(client)
    assert all(b == 0 for b, _ in got.values()), got
