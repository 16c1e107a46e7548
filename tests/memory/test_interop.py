# SPDX-License-Identifier: MIT
"""cudamem.interop and cudamem.numba_plugin: other libraries' allocations
drawn from cudamem's managers, the per-library byte counts, the PyTorch
entry points (called through ctypes), the CuPy and numba adapters against
stand-in modules on the simulator, and against the real libraries on a
GPU (each in a child process of its own, where the pool manager is chosen
before the first context)."""

import abc
import contextlib
import ctypes
import gc
import importlib
import json
import sys
import textwrap
import threading
import types

import numpy as np
import pytest

import cudamem
from cudamem import _core, interop
from helpers import run_child
from helpers.isolation import manager_context
from helpers.torch_entry import entry_points

# Reads the device's free memory (or loads the whole machine): on a GPU
# it runs alone, not beside other test processes (.ci/gpu).
pytestmark = pytest.mark.exclusive


KiB = 1 << 10
MiB = 1 << 20


def by_client(device=None):
    return cudamem.memory_stats(device)["by_client"]


@pytest.fixture
def pool_ctx():
    with manager_context("pool") as ctx:
        yield ctx


@pytest.fixture
def torch_lib():
    """The extension loaded with ctypes, the PyTorch entry points typed as
    PyTorch calls them."""
    lib = entry_points()
    interop.torch_last_error()
    yield lib
    assert _core._torch_live() == 0
    interop.torch_last_error()


# ---------------------------------------------------------------------------
# Per-client accounting (simulator and GPU)
# ---------------------------------------------------------------------------


def test_memory_stats_has_every_client(ctx):
    stats = cudamem.memory_stats()
    assert set(stats["by_client"]) == {"cudamem", "cupy", "torch", "numba"}
    assert interop.client_stats() == stats["by_client"]


@pytest.mark.parametrize("client", interop.CLIENTS)
def test_client_alloc_is_counted_until_dropped(ctx, client):
    # Earlier tests' arrays must not be freed in the middle of this one.
    gc.collect()
    before = by_client()
    own = cudamem.device_array(1000, dtype=np.uint8)
    a = interop.client_alloc(3 * KiB, client)
    assert a.size == 3 * KiB and a.client == client and a.ptr != 0
    assert a.device == cudamem.get_current_device().id
    after = by_client()
    assert after[client] == before[client] + 3 * KiB
    assert after["cudamem"] == before["cudamem"] + 1000
    # The memory is usable device memory of the context.
    view = cudamem.from_cuda_array_interface(
        {"shape": (3 * KiB,), "typestr": "|u1", "data": (a.ptr, False),
         "version": 3, "strides": None}, owner=a)
    view.copy_to_device(np.full(3 * KiB, 7, np.uint8))
    assert (view.copy_to_host() == 7).all()
    del view, a, own
    gc.collect()
    assert by_client() == before


def test_client_alloc_rejects_bad_arguments(ctx):
    with pytest.raises(ValueError, match="unknown client 'jax'"):
        interop.client_alloc(10, "jax")
    with pytest.raises(ValueError, match="size must be positive, got 0"):
        interop.client_alloc(0, "cupy")
    with pytest.raises(IndexError, match="device index out of range"):
        interop.client_alloc(10, "cupy", device=99)
    with pytest.raises(TypeError):
        _core._client_alloc(None, 10, 0)
    with pytest.raises(ValueError, match="unknown client 9"):
        _core._client_alloc(None, 10, 0, 9)
    assert by_client()["cupy"] == 0


def test_client_allocation_cannot_be_made_from_python():
    with pytest.raises(TypeError):
        _core.ClientAllocation()


def test_out_of_memory_names_the_libraries_holding_memory(ctx):
    held = interop.client_alloc(5 * KiB, "cupy")
    held2 = interop.client_alloc(3 * KiB, "numba")
    free, total = ctx.get_memory_info()
    with pytest.raises(cudamem.CudaOutOfMemoryError) as info:
        cudamem.device_array(total * 4, dtype=np.uint8)
    e = info.value
    assert e.by_client["cupy"] == 5 * KiB
    assert e.by_client["numba"] == 3 * KiB
    assert "held through cudamem by other libraries" in str(e)
    assert "cupy %d bytes" % (5 * KiB) in str(e)
    assert "numba %d bytes" % (3 * KiB) in str(e)
    assert "torch" not in str(e)
    # Raised for a library too (what CuPy and numba get).
    with pytest.raises(cudamem.CudaOutOfMemoryError) as info:
        interop.client_alloc(total * 4, "torch")
    assert "cupy %d bytes" % (5 * KiB) in str(info.value)
    del held, held2


def test_out_of_memory_without_clients_has_no_note(ctx):
    free, total = ctx.get_memory_info()
    with pytest.raises(cudamem.CudaOutOfMemoryError) as info:
        cudamem.device_array(total * 4, dtype=np.uint8)
    assert "other libraries" not in str(info.value)
    assert info.value.by_client["cupy"] == 0


# ---------------------------------------------------------------------------
# The PyTorch entry points, through ctypes
# ---------------------------------------------------------------------------


def test_torch_entry_points_are_exported(torch_lib):
    assert interop.TORCH_ALLOC_SYMBOL == "cudamem_torch_alloc"
    assert interop.TORCH_FREE_SYMBOL == "cudamem_torch_free"
    assert torch_lib.cudamem_torch_alloc and torch_lib.cudamem_torch_free


def test_torch_alloc_and_free(ctx, torch_lib):
    dev = cudamem.get_current_device().id
    before = by_client()["torch"]
    p = torch_lib.cudamem_torch_alloc(4096, dev, None)
    assert p
    assert _core._torch_live() == 1
    assert by_client()["torch"] == before + 4096
    view = cudamem.from_cuda_array_interface(
        {"shape": (512,), "typestr": "<f8", "data": (p, False),
         "version": 3, "strides": None})
    view.copy_to_device(np.arange(512.0))
    assert (view.copy_to_host() == np.arange(512.0)).all()
    del view
    torch_lib.cudamem_torch_free(p, 4096, dev, None)
    assert _core._torch_live() == 0
    assert by_client()["torch"] == before
    assert interop.torch_last_error() is None


def test_torch_alloc_on_a_stream(ctx, torch_lib):
    s = cudamem.stream()
    dev = cudamem.get_current_device().id
    p = torch_lib.cudamem_torch_alloc(100, dev, s.handle.value
                                      if hasattr(s.handle, "value")
                                      else int(s.handle))
    assert p
    torch_lib.cudamem_torch_free(p, 100, dev, None)
    s.synchronize()


def test_torch_failures_return_null_and_keep_the_error(ctx, torch_lib):
    assert torch_lib.cudamem_torch_alloc(0, 0, None) is None
    assert torch_lib.cudamem_torch_alloc(64, 99, None) is None
    e = interop.torch_last_error(clear=False)
    assert isinstance(e, IndexError) and "99" in str(e)
    assert isinstance(interop.torch_last_error(), IndexError)
    assert interop.torch_last_error() is None
    assert torch_lib.cudamem_torch_alloc(64, -1, None) is None
    assert "invalid device -1" in str(interop.torch_last_error())
    free, total = ctx.get_memory_info()
    held = interop.client_alloc(KiB, "cupy")
    assert torch_lib.cudamem_torch_alloc(total * 4, 0, None) is None
    e = interop.torch_last_error()
    assert isinstance(e, cudamem.CudaOutOfMemoryError)
    assert e.by_client["cupy"] == KiB
    del held
    # Unknown and NULL pointers are ignored; nothing is raised.
    torch_lib.cudamem_torch_free(None, 0, 0, None)
    torch_lib.cudamem_torch_free(0x1234, 8, 0, None)
    assert interop.torch_last_error() is None


def test_torch_entry_points_from_threads(ctx, torch_lib):
    # PyTorch calls them from its own threads; ctypes drops the GIL, so
    # the entry points take it themselves.
    dev = cudamem.get_current_device().id
    ptrs = []
    errors = []

    def work():
        try:
            for _ in range(50):
                p = torch_lib.cudamem_torch_alloc(256, dev, None)
                assert p
                ptrs.append(p)
                torch_lib.cudamem_torch_free(p, 256, dev, None)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    assert len(ptrs) == 200
    assert by_client()["torch"] == 0


def test_torch_alloc_from_a_thread_python_never_saw(ctx):
    # A thread with no Python thread state, as PyTorch's own threads are.
    # pthread_create starts cudamem_torch_free directly: its first
    # argument is the pointer, the others are unused by the entry point.
    code = textwrap.dedent("""
        import ctypes
        import cudamem
        from cudamem import _core
        cudamem.current_context()
        lib = ctypes.CDLL(_core.__file__)
        lib.cudamem_torch_alloc.restype = ctypes.c_void_p
        lib.cudamem_torch_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int,
                                            ctypes.c_void_p]
        libc = ctypes.CDLL(None)
        p = lib.cudamem_torch_alloc(512, 0, None)
        assert p and _core._torch_live() == 1
        tid = ctypes.c_ulong()
        start = ctypes.cast(lib.cudamem_torch_free, ctypes.c_void_p)
        assert libc.pthread_create(ctypes.byref(tid), None, start,
                                   ctypes.c_void_p(p)) == 0
        assert libc.pthread_join(tid, None) == 0
        assert _core._torch_live() == 0
        assert cudamem.memory_stats()["by_client"]["torch"] == 0
        print("ok")
    """)
    out = run_child(code, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"


# ---------------------------------------------------------------------------
# Stream-ordered reuse across libraries (pool manager, simulator)
# ---------------------------------------------------------------------------


@pytest.mark.sim
def test_pool_reuse_across_libraries_waits_for_the_stream(pool_ctx):
    # On cuMemAlloc'd segments cudamem's own allocations and the other
    # libraries' share one pool; on virtual memory the libraries' come
    # from the peers' pool beside it (their IPC needs cuIpcGetMemHandle),
    # shared among them: there numba's allocation stands for the other
    # side.
    vmm = _core._pool_stats(pool_ctx)["virtual_memory"]
    other = "numba" if vmm else "cudamem"

    def alloc_other(stream):
        if vmm:
            o = interop.client_alloc(64 * KiB, "numba", stream=stream)
            return o, o.ptr
        o = _core._memalloc_on(pool_ctx, 64 * KiB, stream)
        return o, o.device_pointer

    s1 = _core._raw_stream_create(1)
    s2 = _core._raw_stream_create(1)
    try:
        first = interop.client_alloc(512, "cupy", stream=s2)
        gate = _core._raw_gate(s1)           # s1's work cannot finish
        try:
            a = interop.client_alloc(64 * KiB, "cupy", stream=s1)
            pa = a.ptr
            del a                            # CuPy drops it on s1
            b, pb = alloc_other(s2)          # cudamem (or numba), s2
            assert pb != pa                  # not before s1's work ends
            c = interop.client_alloc(64 * KiB, "torch", stream=s1)
            assert c.ptr == pa               # the same stream reuses at once
            del c
        finally:
            _core._raw_gate_open(gate)
        _core._raw_stream_synchronize(s1)
        d, pd = alloc_other(s2)
        assert pd == pa                      # s1's work has finished
        stats = by_client()
        assert stats["cupy"] == 512 and stats["torch"] == 0
        assert stats[other] == 2 * 64 * KiB
        del b, d, first
    finally:
        for h in (s1, s2):
            _core._raw_stream_synchronize(h)
            _core._raw_stream_destroy(h)
    assert by_client()["cupy"] == 0


@pytest.mark.sim
def test_pool_keeps_what_libraries_dropped(pool_ctx):
    mm = pool_ctx.memory_manager
    a = interop.client_alloc(MiB, "numba")
    pa = a.ptr
    del a
    assert cudamem.memory_stats()["pool_reserved_bytes"] >= MiB
    b = interop.client_alloc(MiB, "cupy")
    assert b.ptr == pa                       # one pool for both libraries
    del b
    mm.trim()


# ---------------------------------------------------------------------------
# CuPy adapter against a stand-in cupy module (simulator and GPU)
# ---------------------------------------------------------------------------


def _fake_cupy(device_id):
    """The few names of cupy that the adapter uses."""
    cupy = types.ModuleType("cupy")
    cuda = types.SimpleNamespace()
    state = {"allocator": "cupy-pool", "pinned": "cupy-pinned-pool"}

    class UnownedMemory:
        def __init__(self, ptr, size, owner, device_id=-1):
            self.ptr, self.size, self._owner = ptr, size, owner
            self.device_id = device_id

    class MemoryPointer:
        def __init__(self, mem, offset):
            self.mem, self.ptr = mem, mem.ptr + offset

    class PinnedMemoryPointer:
        def __init__(self, mem, offset):
            self.mem, self.ptr = mem, mem.ptr + offset

    class Stream:
        ptr = 0

    cuda.UnownedMemory = UnownedMemory
    cuda.MemoryPointer = MemoryPointer
    cuda.PinnedMemoryPointer = PinnedMemoryPointer
    cuda.runtime = types.SimpleNamespace(getDevice=lambda: device_id)
    cuda.get_current_stream = lambda: Stream()
    cuda.get_allocator = lambda: state["allocator"]
    cuda.set_allocator = lambda f: state.__setitem__("allocator", f)
    cuda.set_pinned_memory_allocator = (
        lambda f: state.__setitem__("pinned", f))
    cupy.cuda = cuda
    cupy.get_default_pinned_memory_pool = lambda: types.SimpleNamespace(
        malloc="cupy-pinned-pool")
    cupy.state = state
    cupy.Stream = Stream
    return cupy


def test_cupy_adapter_with_a_stand_in(ctx, monkeypatch):
    fake = _fake_cupy(cudamem.get_current_device().id)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    before = by_client()["cupy"]
    with interop.use_with_cupy(pinned=True) as adapter:
        assert adapter.active
        malloc = fake.state["allocator"]
        mp = malloc(1000)
        assert isinstance(mp.mem, fake.cuda.UnownedMemory)
        assert mp.ptr == mp.mem._owner.ptr and mp.mem.size == 1000
        assert mp.mem.device_id == cudamem.get_current_device().id
        assert by_client()["cupy"] == before + 1000
        empty = malloc(0)
        assert empty.ptr == 0 and empty.mem.size == 0
        pinned = fake.state["pinned"](4096)
        host = np.ctypeslib.as_array(
            ctypes.cast(pinned.ptr, ctypes.POINTER(ctypes.c_uint8)),
            shape=(4096,))
        host[:] = 3                          # writable host memory
        assert pinned.mem.size == 4096
        del mp, empty, pinned, host
        gc.collect()
        assert by_client()["cupy"] == before
    assert not adapter.active
    assert fake.state["allocator"] == "cupy-pool"
    assert fake.state["pinned"] == "cupy-pinned-pool"
    adapter.undo()                           # a second undo does nothing


def test_cupy_allocator_bad_input_leaks_nothing(ctx, monkeypatch):
    """The C allocator refuses bad sizes and passes on what CuPy's own
    callables raise, without keeping the memory it had taken."""
    fake = _fake_cupy(cudamem.get_current_device().id)
    with pytest.raises(TypeError, match="3 arguments"):
        _core._cupy_allocator(fake.cuda.get_current_stream)
    with pytest.raises(TypeError, match="callable"):
        _core._cupy_allocator(1, fake.cuda.UnownedMemory,
                              fake.cuda.MemoryPointer)
    before = by_client()["cupy"]
    malloc = _core._cupy_allocator(fake.cuda.get_current_stream,
                                   fake.cuda.UnownedMemory,
                                   fake.cuda.MemoryPointer)
    with pytest.raises(ValueError, match="negative"):
        malloc(-1)
    with pytest.raises(TypeError):
        malloc("10")
    with pytest.raises(OverflowError):
        malloc(2 ** 70)

    def raising():
        raise RuntimeError("no stream")

    class NoPtr:
        pass

    class BadMemory:
        def __init__(self, *args):
            raise RuntimeError("refused")

    for parts, exc in (((raising, fake.cuda.UnownedMemory,
                         fake.cuda.MemoryPointer), "no stream"),
                       ((NoPtr, fake.cuda.UnownedMemory,
                         fake.cuda.MemoryPointer), "ptr"),
                       ((fake.cuda.get_current_stream, BadMemory,
                         fake.cuda.MemoryPointer), "refused"),
                       ((fake.cuda.get_current_stream,
                         fake.cuda.UnownedMemory, BadMemory), "refused")):
        bad = _core._cupy_allocator(*parts)
        with pytest.raises((RuntimeError, AttributeError), match=exc):
            bad(4096)
        gc.collect()
        assert by_client()["cupy"] == before
    mp = malloc(256)
    assert by_client()["cupy"] == before + 256
    del mp
    gc.collect()
    assert by_client()["cupy"] == before


def test_cupy_adapter_installed_twice_restores_the_original(ctx,
                                                            monkeypatch):
    fake = _fake_cupy(cudamem.get_current_device().id)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    first = interop.use_with_cupy()
    second = interop.use_with_cupy()
    assert not first.active and second.active
    second.undo()
    assert fake.state["allocator"] == "cupy-pool"


@pytest.mark.sim
def test_cupy_adapter_allocates_for_cupys_stream(pool_ctx, monkeypatch):
    fake = _fake_cupy(0)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    h = _core._raw_stream_create(1)
    fake.Stream.ptr = h
    try:
        first = _core._memalloc_on(pool_ctx, 512, 0)  # two streams served
        with interop.use_with_cupy():
            a = fake.state["allocator"](64 * KiB)
            pa = a.ptr
            gate = _core._raw_gate(h)
            try:
                del a
                other = _core._memalloc_on(pool_ctx, 64 * KiB, 0)
                assert other.device_pointer != pa   # h's work pending
                again = fake.state["allocator"](64 * KiB)
                assert again.ptr == pa              # same stream: at once
                del again, other, first
            finally:
                _core._raw_gate_open(gate)
    finally:
        _core._raw_stream_synchronize(h)
        _core._raw_stream_destroy(h)


def test_use_with_cupy_without_cupy(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(ImportError):
        interop.use_with_cupy()


def test_use_with_torch_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError):
        interop.use_with_torch()
    with pytest.raises(ImportError):
        interop.torch_mempool()


def test_torch_mempool_needs_a_pytorch_with_mempool(monkeypatch):
    fake = types.ModuleType("torch")
    fake.__version__ = "1.13"
    fake.cuda = types.SimpleNamespace()
    monkeypatch.setitem(sys.modules, "torch", fake)
    with pytest.raises(NotImplementedError, match="MemPool.*1.13"):
        interop.torch_mempool()


def test_use_with_torch_with_a_stand_in(monkeypatch):
    calls = []

    class Pluggable:
        def __init__(self, path, alloc, free):
            calls.append(("new", path, alloc, free))

        def allocator(self):
            return "raw-allocator"

    fake = types.ModuleType("torch")
    fake.__version__ = "2.8"
    memory = types.SimpleNamespace(
        CUDAPluggableAllocator=Pluggable,
        change_current_allocator=lambda a: calls.append(("change", a)))
    fake.cuda = types.SimpleNamespace(
        memory=memory, MemPool=lambda a: ("pool", a),
        use_mem_pool=lambda pool: None)
    monkeypatch.setitem(sys.modules, "torch", fake)
    alloc = interop.use_with_torch()
    assert calls[0] == ("new", _core.__file__, "cudamem_torch_alloc",
                        "cudamem_torch_free")
    assert calls[1] == ("change", alloc)
    assert interop.torch_mempool() == ("pool", "raw-allocator")


# ---------------------------------------------------------------------------
# numba plugin against a stand-in numba (simulator and GPU)
# ---------------------------------------------------------------------------


def _fake_numba(device_id, nv_binding):
    """numba's EMM names that the plugin uses."""
    import weakref

    numba = types.ModuleType("numba")
    ncuda = types.ModuleType("numba.cuda")
    cudadrv = types.ModuleType("numba.cuda.cudadrv")
    driver = types.ModuleType("numba.cuda.cudadrv.driver")

    class HostOnlyCUDAMemoryManager(abc.ABC):
        # numba's base class leaves get_ipc_handle abstract: a plugin that
        # puts GetIpcHandleMixin after it cannot be instantiated.
        def __init__(self, context):
            self.context = context
            self.deferred = 0

        @abc.abstractmethod
        def get_ipc_handle(self, memory):
            """Abstract, as in numba."""

        @contextlib.contextmanager
        def defer_cleanup(self):
            self.deferred += 1
            yield

    class GetIpcHandleMixin:
        def get_ipc_handle(self, memory):
            return ("ipc", memory)

    class MemoryPointer:
        def __init__(self, context, pointer, size, owner=None,
                     finalizer=None):
            self.context, self.device_pointer, self.size = (
                context, pointer, size)
            self._finalizer = weakref.finalize(self, finalizer)

        def free(self):
            self._finalizer()

    class CUdeviceptr(int):
        pass

    driver.MemoryPointer = MemoryPointer
    driver.MemoryInfo = lambda free, total: ("info", free, total)
    if nv_binding:
        driver.USE_NV_BINDING = True
        driver.binding = types.SimpleNamespace(CUdeviceptr=CUdeviceptr)
    else:
        driver.USE_NV_BINDING = False
    ncuda.HostOnlyCUDAMemoryManager = HostOnlyCUDAMemoryManager
    ncuda.GetIpcHandleMixin = GetIpcHandleMixin
    ncuda.cudadrv = cudadrv
    cudadrv.driver = driver
    numba.cuda = ncuda
    context = types.SimpleNamespace(
        device=types.SimpleNamespace(id=device_id))
    return {"numba": numba, "numba.cuda": ncuda,
            "numba.cuda.cudadrv": cudadrv,
            "numba.cuda.cudadrv.driver": driver}, context, CUdeviceptr


@pytest.mark.parametrize("nv_binding", [True, False])
def test_numba_plugin_with_a_stand_in(ctx, monkeypatch, nv_binding):
    mods, context, devptr = _fake_numba(cudamem.get_current_device().id,
                                        nv_binding)
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.delitem(sys.modules, "cudamem.numba_plugin", raising=False)
    plugin = importlib.import_module("cudamem.numba_plugin")
    try:
        assert plugin._numba_memory_manager is plugin.NumbaManager
        assert cudamem.NumbaManager is plugin.NumbaManager
        mm = plugin.NumbaManager(context=context)
        assert mm.interface_version == 1
        mm.initialize()
        before = by_client()["numba"]
        mp = mm.memalloc(2048)
        assert mp.size == 2048
        if nv_binding:
            assert isinstance(mp.device_pointer, devptr)
            addr = int(mp.device_pointer)
        else:
            assert isinstance(mp.device_pointer, ctypes.c_uint64)
            addr = mp.device_pointer.value
        assert addr != 0
        assert by_client()["numba"] == before + 2048
        mp.free()
        assert by_client()["numba"] == before
        mp2 = mm.memalloc(512)
        del mp2
        gc.collect()
        assert by_client()["numba"] == before
        info = mm.get_memory_info()
        assert info[0] == "info" and 0 < info[1] <= info[2]
        with mm.defer_cleanup():
            assert mm.deferred == 1
            assert cudamem.current_context()._memory_deallocations.is_disabled
        assert mm.get_ipc_handle("x") == ("ipc", "x")
        free, total = ctx.get_memory_info()
        with pytest.raises(cudamem.CudaOutOfMemoryError):
            mm.memalloc(total * 4)
    finally:
        sys.modules.pop("cudamem.numba_plugin", None)


def test_cudamem_does_not_import_numba():
    code = ("import sys, cudamem, cudamem.interop; "
            "from cudamem import *; "
            "bad = [m for m in ('numba', 'cupy', 'torch', 'dask', "
            "'distributed') if m in sys.modules]; print(bad)")
    out = run_child(code, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------------------
# The real libraries, on a GPU (each in a child process)
# ---------------------------------------------------------------------------


def _run_child(code, env=None):
    """What the child printed last, as JSON; its exit status must be 0."""
    p = run_child(code, timeout=300,
                  env=dict({"CUDAMEM_TEST_ISOLATED": "1"}, **(env or {})))
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.gpu
def test_cupy_through_cudamem():
    pytest.importorskip("cupy")
    out = _run_child("""
        import gc, json
        import numpy as np
        import cupy, cudamem
        from cudamem import interop
        cudamem.set_memory_manager("pool")
        res = {}
        with interop.use_with_cupy(pinned=True):
            a = cupy.arange(1 << 20, dtype=cupy.float32)
            res["held"] = cudamem.memory_stats()["by_client"]["cupy"]
            res["values"] = bool((cupy.asnumpy(a * 2) ==
                                  np.arange(1 << 20, dtype=np.float32) * 2
                                  ).all())
            # CuPy on one stream, cudamem on another.
            s = cupy.cuda.Stream(non_blocking=True)
            with s:
                b = cupy.ones(1 << 18, dtype=cupy.float64)
                pb = b.data.ptr
                del b
                c = cupy.ones(1 << 18, dtype=cupy.float64)
                res["same_stream_reuse"] = c.data.ptr == pb
            cs = cudamem.stream()
            d = cudamem.device_array(1 << 18, dtype=np.float64, stream=cs)
            d.copy_to_device(np.full(1 << 18, 5.0), stream=cs)
            cs.synchronize()
            s.synchronize()
            res["c_ok"] = bool((cupy.asnumpy(c) == 1).all())
            res["d_ok"] = bool((d.copy_to_host() == 5).all())
            h = cupy.cuda.alloc_pinned_memory(4096)
            res["pinned_bytes"] = cudamem.memory_stats()["pinned_bytes"]
            del a, c, d, h
            gc.collect()
            res["after"] = cudamem.memory_stats()["by_client"]["cupy"]
            keep = cupy.zeros(1 << 20, dtype=cupy.uint8)
            free, total = cudamem.current_context().get_memory_info()
            try:
                cudamem.device_array(total * 2, dtype=np.uint8)
                res["oom"] = None
            except cudamem.CudaOutOfMemoryError as e:
                res["oom"] = e.by_client["cupy"]
                res["oom_msg"] = "cupy" in str(e)
            del keep
        print(json.dumps(res))
    """)
    assert out["held"] >= 4 << 20
    assert out["values"] and out["c_ok"] and out["d_ok"]
    assert out["same_stream_reuse"]
    assert out["after"] == 0
    assert out["oom"] >= 1 << 20 and out["oom_msg"]


@pytest.mark.gpu
def test_torch_through_cudamem():
    pytest.importorskip("torch")
    out = _run_child("""
        import gc, json
        import torch, cudamem
        from cudamem import interop
        cudamem.set_memory_manager("pool")
        interop.use_with_torch()
        res = {}
        a = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
        res["held"] = cudamem.memory_stats()["by_client"]["torch"]
        res["values"] = bool(((a * 2).cpu() ==
                              torch.arange(1 << 20) * 2).all())
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            b = torch.ones(1 << 18, device="cuda")
            res["b"] = float(b.sum().item())
        del a, b
        torch.cuda.synchronize()
        gc.collect()
        res["after"] = cudamem.memory_stats()["by_client"]["torch"]
        keep = torch.zeros(1 << 20, device="cuda", dtype=torch.uint8)
        free, total = cudamem.current_context().get_memory_info()
        try:
            cudamem.device_array(total * 2, dtype="u1")
            res["oom"] = None
        except cudamem.CudaOutOfMemoryError as e:
            res["oom"] = e.by_client["torch"]
        del keep
        print(json.dumps(res))
    """)
    assert out["held"] >= 4 << 20
    assert out["values"] and out["b"] == float(1 << 18)
    assert out["after"] == 0
    assert out["oom"] >= 1 << 20


@pytest.mark.gpu
def test_torch_tensors_on_two_streams_through_the_lane():
    # Thousands of tensors of mixed sizes made and dropped on two PyTorch
    # streams, most of them served by the pool's lane without the GIL;
    # each tensor's value is checked on its stream before it goes.
    pytest.importorskip("torch")
    out = _run_child("""
        import gc, json, random
        import torch, cudamem
        from cudamem import interop
        cudamem.set_memory_manager("pool")
        interop.use_with_torch()
        rng = random.Random(7)
        streams = [torch.cuda.Stream(), torch.cuda.Stream()]
        live = []
        bad = 0
        for i in range(3000):
            s = rng.choice(streams)
            with torch.cuda.stream(s):
                n = rng.choice([1, 100, 4096, 70000, 300000])
                live.append((torch.full((n,), float(i), device="cuda"),
                             float(i), s))
            if len(live) > 24:
                t, v, s = live.pop(rng.randrange(len(live)))
                with torch.cuda.stream(s):
                    bad += not bool((t == v).all().item())
                del t
        for t, v, s in live:
            with torch.cuda.stream(s):
                bad += not bool((t == v).all().item())
        del live, t
        torch.cuda.synchronize()
        gc.collect()
        st = cudamem.memory_stats()
        print(json.dumps({"bad": bad, "after": st["by_client"]["torch"],
                          "total": st["total_allocations"]}))
    """)
    assert out["bad"] == 0
    assert out["after"] == 0
    assert out["total"] >= 3000


@pytest.mark.gpu
def test_torch_mempool_through_cudamem():
    torch = pytest.importorskip("torch")
    if not hasattr(torch.cuda, "MemPool"):
        pytest.skip("this PyTorch has no MemPool")
    out = _run_child("""
        import json
        import torch, cudamem
        from cudamem import interop
        torch.zeros(1, device="cuda")        # PyTorch's allocator in use
        pool = interop.torch_mempool()
        with torch.cuda.use_mem_pool(pool):
            a = torch.ones(1 << 20, device="cuda")
        res = {"held": cudamem.memory_stats()["by_client"]["torch"],
               "sum": float(a.sum().item())}
        print(json.dumps(res))
    """)
    assert out["held"] >= 4 << 20 and out["sum"] == float(1 << 20)


@pytest.mark.gpu
def test_numba_through_cudamem():
    pytest.importorskip("numba.cuda")
    out = _run_child("""
        import gc, json
        import numpy as np
        import cudamem
        from numba import cuda
        cudamem.set_memory_manager("pool")
        res = {}
        a = cuda.to_device(np.arange(1 << 20, dtype=np.float32))
        res["held"] = cudamem.memory_stats()["by_client"]["numba"]
        res["values"] = bool((a.copy_to_host() ==
                              np.arange(1 << 20, dtype=np.float32)).all())
        del a
        gc.collect()
        res["after"] = cudamem.memory_stats()["by_client"]["numba"]
        keep = cuda.device_array(1 << 20, dtype=np.uint8)
        free, total = cudamem.current_context().get_memory_info()
        try:
            cudamem.device_array(total * 2, dtype=np.uint8)
            res["oom"] = None
        except cudamem.CudaOutOfMemoryError as e:
            res["oom"] = e.by_client["numba"]
        del keep
        print(json.dumps(res))
    """, env={"NUMBA_CUDA_MEMORY_MANAGER": "cudamem.numba_plugin"})
    assert out["held"] >= 4 << 20 and out["values"]
    assert out["after"] == 0
    assert out["oom"] >= 1 << 20
