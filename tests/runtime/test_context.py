# SPDX-License-Identifier: MIT
"""Devices and primary contexts (docs/api.md#devices-and-contexts)."""

import re
import threading

import pytest

import cudamem
from cudamem import _core
from helpers import run_child


def test_current_context_is_primary_and_stable(ctx):
    assert cudamem.current_context() is ctx
    assert ctx == cudamem.current_context()
    assert isinstance(ctx.handle, int) and ctx.handle != 0
    assert ctx.device.id == 0
    assert re.fullmatch(r"<CUDA context 0x[0-9a-f]+ of device 0>", repr(ctx))


def test_device_properties(ctx, simulator):
    dev = cudamem.get_current_device()
    assert dev is ctx.device
    assert dev.id == 0
    assert isinstance(dev.name, str) and dev.name
    if simulator:
        assert dev.name == "cudamem simulator"
    cc = dev.compute_capability
    assert isinstance(cc, tuple) and len(cc) == 2 and cc >= (3, 5)
    assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-"
                        r"[0-9a-f]{4}-[0-9a-f]{12}", dev.uuid)
    assert repr(dev) == str(dev) == "<CUDA device 0 '%s'>" % dev.name
    assert hash(dev) == hash(cudamem.get_current_device())
    assert dev.supports_float16
    assert dev.supports_bfloat16 == (cc >= (8, 0))


def test_device_attributes_by_name(ctx):
    dev = ctx.device
    assert dev.MULTIPROCESSOR_COUNT > 0
    assert dev.MAX_THREADS_PER_BLOCK >= 512
    assert dev.WARP_SIZE == 32
    assert dev.COMPUTE_CAPABILITY_MAJOR == dev.compute_capability[0]
    assert dev.CAN_MAP_HOST_MEMORY in (0, 1)
    with pytest.raises(AttributeError):
        _ = dev.NO_SUCH_ATTRIBUTE
    ident = dev.get_device_identity()
    assert set(ident) == {"pci_domain_id", "pci_bus_id", "pci_device_id"}


def test_memory_info(ctx, simulator):
    info = ctx.get_memory_info()
    assert isinstance(info, cudamem.MemoryInfo)
    free, total = info
    assert info.free == free and info.total == total
    assert 0 < free <= total
    if simulator:
        assert total == 1 << 30  # CUDAMEM_SIM_MEMORY's default


@pytest.mark.exclusive
def test_memory_info_tracks_allocations(ctx):
    ctx.memory_manager.deallocations.clear()
    free0, _ = ctx.get_memory_info()
    m = ctx.memalloc(64 << 20)
    free1, _ = ctx.get_memory_info()
    assert free1 <= free0 - (64 << 20)
    del m  # the free is deferred (docs/api.md#deferred-deallocation) ...
    assert len(ctx.memory_manager.deallocations) == 1
    ctx.memory_manager.deallocations.clear()  # ... until the queue flushes
    free2, _ = ctx.get_memory_info()
    assert free2 >= free1 + (64 << 20)


def test_memalloc_rejects_bad_sizes(ctx):
    with pytest.raises(ValueError, match="positive"):
        ctx.memalloc(0)
    with pytest.raises(TypeError):
        ctx.memalloc(1.5)


def test_allocation_owner_attributes(ctx):
    m = ctx.memalloc(4096)
    assert m.size == 4096
    assert m.device_pointer == m.handle == m.device_pointer_value != 0
    assert m.context is ctx
    m.free()
    with pytest.raises(RuntimeError, match="Freeing dead memory"):
        m.free()


def test_gpus_list(ctx):
    n = len(cudamem.gpus)
    assert n >= 1
    assert cudamem.list_devices() is cudamem.gpus
    assert [g.id for g in cudamem.gpus] == list(range(n))
    assert str(cudamem.gpus[0]) == "<Managed Device 0>"
    assert cudamem.gpus[0].name == ctx.device.name
    assert cudamem.gpus[-1].id == n - 1
    assert cudamem.gpus.current.id == 0
    with pytest.raises(IndexError):
        cudamem.gpus[n]
    with pytest.raises(TypeError):
        cudamem.gpus[0.0]


def test_with_gpus_pushes_and_pops(ctx):
    before = ctx.handle
    with cudamem.gpus[0] as entered:
        assert entered is None
        assert cudamem.current_context().handle == before
    assert cudamem.current_context().handle == before


def test_select_device(ctx):
    dev = cudamem.select_device(0)
    assert dev is ctx.device
    ctx.pop()  # select_device pushed once more
    assert cudamem.current_context() is ctx


@pytest.mark.parametrize("bad", [10**6, -10**6])
def test_bad_device_ids(ctx, bad):
    with pytest.raises(IndexError):
        cudamem.select_device(bad)
    with pytest.raises(IndexError):
        cudamem.current_context(bad)


def test_bad_device_id_is_reported_as_given(ctx):
    # A negative ordinal wraps as in a list; one past the start is
    # reported as the caller wrote it, not as the wrapped number.
    n = len(cudamem.gpus)
    for bad in (-n - 1, -n - 2, n, n + 5):
        with pytest.raises(IndexError,
                           match=r"device index out of range: %d \(there "
                                 r"(is|are) %d device" % (bad, n)):
            cudamem.select_device(bad)
        with pytest.raises(IndexError, match=r": %d \(" % bad):
            cudamem.current_context(bad)


def test_device_id_type_errors(ctx):
    with pytest.raises(TypeError, match="integer"):
        cudamem.select_device(0.0)
    with pytest.raises(TypeError, match="integer"):
        cudamem.select_device("0")


def test_current_context_devnum(ctx):
    c = cudamem.current_context(devnum=0)
    assert c is ctx
    c.pop()
    with pytest.raises(TypeError):
        cudamem.current_context(0, 1)
    with pytest.raises(TypeError):
        cudamem.current_context(dev=0)


def test_synchronize(ctx):
    assert cudamem.synchronize() is None
    assert ctx.synchronize() is None


def test_require_context():
    @cudamem.require_context
    def body():
        return _core._current_device_id()

    assert body() == 0


def test_fresh_thread_gets_device_zero(ctx):
    seen = {}

    def work():
        try:
            seen["before"] = _core._current_device_id()
            c = cudamem.current_context()
            seen["ctx"] = c
            seen["after"] = _core._current_device_id()
            cudamem.close()  # a worker's close pops its own stack only
            seen["closed"] = _core._current_device_id()
        except BaseException as e:  # pragma: no cover - reported below
            seen["error"] = e

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert "error" not in seen, seen.get("error")
    assert seen["before"] is None
    assert seen["ctx"] is ctx  # the same primary context, shared
    assert seen["after"] == 0
    assert seen["closed"] is None
    assert cudamem.current_context() is ctx  # main thread unaffected


def test_threads_select_and_close_repeatedly(ctx):
    errors = []

    def work():
        try:
            for _ in range(20):
                for i in range(len(cudamem.gpus)):
                    cudamem.select_device(i)
                    cudamem.current_context().get_memory_info()
                cudamem.close()
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_close_then_fresh_context():
    code = """if 1:
        import cudamem
        c1 = cudamem.current_context()
        m = c1.memalloc(1 << 20)
        h1 = c1.handle
        cudamem.close()
        from cudamem import _core
        assert _core._current_device_id() is None
        c2 = cudamem.current_context()
        assert c2 is not c1
        m2 = c2.memalloc(1 << 20)   # Q14: works after close()
        del m                       # memory of the closed context: no-op
        try:
            c1.get_memory_info()
        except ValueError as e:
            assert "closed or reset" in str(e)
        else:
            raise AssertionError("a closed context must refuse work")
        print("ok")
    """
    p = run_child(code, timeout=120, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "ok" in p.stdout


def test_device_reset_gives_a_fresh_context():
    code = """if 1:
        import cudamem
        c1 = cudamem.current_context()
        cudamem.close()
        c1.device.reset()
        c2 = cudamem.current_context()
        assert c2 is not c1 and c2.device is c1.device
        c2.get_memory_info()
        print("ok")
    """
    p = run_child(code, timeout=120, check=False)
    assert p.returncode == 0, p.stdout + p.stderr


def test_detect(ctx, capsys):
    assert cudamem.detect() is True
    out = capsys.readouterr().out
    assert out.startswith("Found %d CUDA devices" % len(cudamem.gpus))
    assert "[SUPPORTED]" in out
    assert "Compute Capability" in out
    assert "devices are supported" in out


def test_availability_and_versions(ctx):
    assert cudamem.is_available() is True
    assert cudamem.cuda_error() is None
    major, minor = cudamem.driver_version()
    assert major >= 11
    assert cudamem.runtime_version() >= (11, 0)
    assert cudamem.is_supported_version() is True
    assert cudamem.is_float16_supported() is True
    assert isinstance(cudamem.is_bfloat16_supported(), bool)
    assert isinstance(cudamem.is_fp8_supported(), bool)


def test_contexts_and_devices_cannot_be_instantiated():
    with pytest.raises(TypeError):
        cudamem.Context()
    with pytest.raises(TypeError):
        cudamem.Device()


# ------------------------------------------------------------------
# profiling
# ------------------------------------------------------------------

def test_profile_start_and_stop(ctx):
    assert cudamem.profile_start() is None
    assert cudamem.profile_stop() is None
    with cudamem.profiling():
        cudamem.device_array(4).copy_to_host()


def test_profiling_stops_when_the_body_raises(ctx, monkeypatch):
    from cudamem import _api

    calls = []
    real_stop = _api.profile_stop

    def stop():
        calls.append("stop")
        real_stop()

    monkeypatch.setattr(_api, "profile_stop", stop)

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with cudamem.profiling():
            raise Boom
    assert calls == ["stop"]


def test_profile_start_makes_a_context():
    r = run_child(
        "import cudamem\ncudamem.profile_start()\ncudamem.profile_stop()\n"
        "from cudamem import _core\nprint(_core._current_device_id())",
        timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0"


@pytest.mark.sim
@pytest.mark.parametrize("fn", ["profile_start", "profile_stop"])
def test_profiler_failure_raises(ctx, fn):
    name = "cuProfilerStart" if fn == "profile_start" else "cuProfilerStop"
    _core._sim_inject(name, 1, 1)               # CUDA_ERROR_INVALID_VALUE
    with pytest.raises(cudamem.CudaAPIError, match=name):
        getattr(cudamem, fn)()
