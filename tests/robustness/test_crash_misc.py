# SPDX-License-Identifier: MIT
"""Uses that used to crash the process or give raw driver errors: arrays
over a closed IPC mapping, the IPC export of freed memory, arrays of a
finished ``mapped()`` / ``pinned()`` block, the out-of-memory error of every
allocation kind, and the range checks of the tunables.  Whatever could
crash runs in a child process (``run_child``), so a crash is reported as a
failure naming the signal."""

import json
import os
import pickle

import numpy as np
import pytest

import cudamem as cuda
from cudamem import _core
from helpers import run_child

# ---------------------------------------------------------------------------
# Arrays over a closed IPC mapping
# ---------------------------------------------------------------------------

# Opens the pickled IpcArrayHandle from stdin, closes it and tries every
# use of the array (and of views made before and after the close); prints
# {use: [exception type, message]} as JSON.
IPC_USES = r"""
import json, pickle, sys
import numpy as np
import cudamem as cuda

h = pickle.loads(sys.stdin.buffer.read())
arr = h.open()
before = arr[2:]
alias = cuda.as_cuda_array(arr)
first = float(arr.copy_to_host()[0])
h.close()
try:
    kernel = cuda.compile(
        'extern "C" __global__ void f(double *x) { x[threadIdx.x] = 7; }'
    ).get_function("f")
except cuda.CudaSupportError:
    kernel = None

uses = {
    "read": lambda: arr.copy_to_host(),
    "write": lambda: arr.__setitem__(slice(None), 7.0),
    "fill": lambda: arr[1:3].__setitem__(slice(None), 7.0),
    "reshape_T": lambda: arr.reshape(3, 4).T,
    "view_before": lambda: before.copy_to_host(),
    "view_before_write": lambda: before.__setitem__(slice(None), 1.0),
    "view_after": lambda: arr[1:],
    "as_cuda_array_view": lambda: alias.copy_to_host(),
    "copy_to_device": lambda: arr.copy_to_device(np.zeros(12)),
    "device_to_device": lambda: cuda.device_array(12).copy_to_device(arr),
    "cai": lambda: arr.__cuda_array_interface__,
    "dlpack": lambda: arr.__dlpack__(),
    "get_ipc_handle": lambda: arr.get_ipc_handle(),
    "device_pointer": lambda: arr.gpu_data.device_pointer,
}
if kernel is not None:
    uses["kernel_arg"] = lambda: kernel[1, 12](arr)
out = {"first": first}
for name, use in uses.items():
    try:
        use()
        out[name] = None
    except Exception as e:
        out[name] = [type(e).__name__, str(e)]
print(json.dumps(out))
"""


def test_ipc_array_after_close_raises_value_error(ctx):
    a = cuda.to_device(np.arange(12.0))
    h = a.get_ipc_handle()
    out = json.loads(run_child(IPC_USES, stdin=pickle.dumps(h)).stdout)
    assert out.pop("first") == 0.0
    for name, got in out.items():
        assert got is not None, "%s of a closed IPC array worked" % name
        assert got[0] == "ValueError", (name, got)
        if name == "kernel_arg":
            assert "kernel argument 0" in got[1], got
        elif name == "device_pointer":
            assert "closed" in got[1], got
        else:
            assert "IPC handle was closed" in got[1], (name, got)
    # The exporter's memory is untouched by the child's writes.
    np.testing.assert_array_equal(a.copy_to_host(), np.arange(12.0))


def test_ipc_open_pointer_is_a_memory_pointer(ctx):
    # What open() gives is both the mapping and a MemoryPointer at the
    # exported view, as numba's open gives a MemoryPointer.
    a = cuda.to_device(np.arange(12.0))
    h = a[3:].get_ipc_handle()
    out = run_child(r"""
        import pickle, sys
        import numpy as np
        import cudamem as cuda
        from cudamem import _core
        h = pickle.loads(sys.stdin.buffer.read())
        ptr = h.ipc_handle.open(_core.current_context())
        assert isinstance(ptr, cuda.MemoryPointer), type(ptr)
        assert isinstance(ptr, _core.IpcMemory), type(ptr)
        assert ptr.size == 72 and ptr.owner is ptr and not ptr.closed
        v = ptr.view(8)
        assert v.size == 64 and v.device_pointer == ptr.device_pointer + 8
        arr = cuda.DeviceNDArray((9,), (8,), np.float64, gpu_data=ptr)
        print(arr.copy_to_host().tolist())
        h.ipc_handle.close()
        assert ptr.closed
        try:
            arr.copy_to_host()
        except ValueError as e:
            print("ValueError", e)
    """, stdin=pickle.dumps(h)).stdout
    lines = out.splitlines()
    assert lines[0] == str(np.arange(3.0, 12.0).tolist())
    assert lines[1].startswith("ValueError") and "closed" in lines[1]


# ---------------------------------------------------------------------------
# The IPC export of freed memory
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("view", [False, True])
def test_get_ipc_handle_of_freed_memory_raises(ctx, view):
    d = cuda.to_device(np.arange(10.0))
    v = d[2:]
    d.gpu_data.free()
    with pytest.raises(ValueError, match="freed"):
        (v if view else d).get_ipc_handle()
    with pytest.raises(ValueError, match="freed"):
        cuda.as_cuda_array(d)


# ---------------------------------------------------------------------------
# Arrays of a finished mapped() / pinned() block
# ---------------------------------------------------------------------------

MAPPED_AFTER = r"""
import json
import numpy as np
import cudamem as cuda
from cudamem import _core
from helpers import run_child

h = np.zeros(8)
with cuda.mapped(h) as m:
    m[:] = 1.0
    before = m[2:]
two = [np.zeros(4), np.ones(4)]
with cuda.mapped(*two, stream=cuda.stream()) as ms:
    pass
try:
    kernel = cuda.compile(
        'extern "C" __global__ void f(double *x) { x[threadIdx.x] = 7; }'
    ).get_function("f")
except cuda.CudaSupportError:
    kernel = None
uses = {
    "write": lambda: m.__setitem__(slice(None), 7.0),
    "read": lambda: m.copy_to_host(),
    "copy_to_device": lambda: m.copy_to_device(np.full(8, 5.0)),
    "view_before": lambda: before.copy_to_host(),
    "view_after": lambda: m[1:],
    "reshape_T": lambda: m.reshape(2, 4).T,
    "cai": lambda: m.__cuda_array_interface__,
    "dlpack": lambda: m.__dlpack__(),
    "as_cuda_array": lambda: cuda.as_cuda_array(m),
    "device_to_device": lambda: cuda.device_array(8).copy_to_device(m),
    "second_of_two": lambda: ms[1].copy_to_host(),
}
if kernel is not None:
    uses["kernel_arg"] = lambda: kernel[1, 8](m)
out = {}
for name, use in uses.items():
    try:
        use()
        out[name] = None
    except Exception as e:
        out[name] = [type(e).__name__, str(e)]
out["host"] = h.tolist()
print(json.dumps(out))
"""


@pytest.mark.ahead
def test_mapped_array_after_the_block_raises_value_error():
    out = json.loads(run_child(MAPPED_AFTER).stdout)
    # The host array is ordinary memory again, and nothing wrote into it.
    assert out.pop("host") == [1.0] * 8
    for name, got in out.items():
        assert got is not None, "%s after mapped() exited worked" % name
        assert got[0] == "ValueError", (name, got)
        if name == "kernel_arg":
            assert "kernel argument 0" in got[1], got
        else:
            assert "no longer mapped" in got[1], (name, got)


def test_pinned_arrays_stay_ordinary_memory_after_the_block(ctx):
    # pinned() yields None; what survives it is the host array, which
    # keeps working (as pageable memory), also for asynchronous copies
    # queued inside the block and completed after it.
    h = np.zeros(1 << 16)
    d = cuda.to_device(np.arange(1 << 16, dtype=np.float64))
    s = cuda.stream()
    for _ in range(3):
        with cuda.pinned(h) as p:
            assert p is None
            d.copy_to_host(h, stream=s)
        s.synchronize()
        np.testing.assert_array_equal(h, np.arange(1 << 16))
        h[:] = 0
    d.copy_to_host(h, stream=s)
    s.synchronize()
    np.testing.assert_array_equal(h, np.arange(1 << 16))
    # The registration object, if one is kept, refuses its device side.
    reg = _core._register_arrays((h,), False)
    reg.close()
    with pytest.raises(ValueError, match="registration is closed"):
        reg.device_arrays()
    reg = _core._register_arrays((h,), True)
    m = reg.device_arrays()[0]
    reg.close()
    with pytest.raises(ValueError, match="no longer mapped"):
        m.copy_to_host()


# ---------------------------------------------------------------------------
# Out-of-memory errors of every allocation kind
# ---------------------------------------------------------------------------

OOM_ATTRS = ("requested", "free", "total", "pending_bytes", "pool_reserved",
             "largest_free_block")

OOM_KINDS = r"""
import json, os
import numpy as np
import cudamem as cuda

huge = int(os.environ["HUGE"])
kinds = {
    "device_array": lambda: cuda.device_array(huge, dtype=np.uint8),
    "managed_array": lambda: cuda.managed_array(huge, dtype=np.uint8),
    "pinned_array": lambda: cuda.pinned_array(huge, dtype=np.uint8),
    "mapped_array": lambda: cuda.mapped_array(huge, dtype=np.uint8),
}
out = {}
for name, alloc in kinds.items():
    try:
        alloc()
        out[name] = None
    except Exception as e:
        out[name] = {
            "mro": [c.__name__ for c in type(e).__mro__],
            "msg": str(e),
            "attrs": {k: getattr(e, k, "MISSING") for k in %r},
        }
    # The process goes on: a small allocation of the same kind works.
    kinds[name] = None
    small = {"device_array": cuda.device_array,
             "managed_array": cuda.managed_array,
             "pinned_array": cuda.pinned_array,
             "mapped_array": cuda.mapped_array}[name](16)
    assert small.shape == (16,)
print(json.dumps(out))
""" % (OOM_ATTRS,)


@pytest.mark.ahead
@pytest.mark.parametrize("manager", ["default", "pool", "async"])
def test_oom_error_of_every_allocation_kind(manager):
    # On the simulator a small device makes device and managed memory
    # run out; an absurd size makes page-locked host memory run out (the
    # simulator's mmap fails, as the driver's cuMemHostAlloc does).
    env = {"CUDAMEM_MEMORY_MANAGER": manager, "HUGE": str(1 << 56)}
    if os.environ.get("CUDAMEM_SIMULATOR", "0") not in ("0", "", "false"):
        env["CUDAMEM_SIM_MEMORY"] = str(64 << 20)
    out = json.loads(run_child(OOM_KINDS, env=env).stdout)
    for kind, got in out.items():
        assert got is not None, "%s of 2**56 bytes worked" % kind
        assert got["mro"][:3] == ["CudaOutOfMemoryError", "CudaAPIError",
                                  "CudaDriverError"], (kind, got)
        assert "MemoryError" in got["mro"], (kind, got)
        attrs = got["attrs"]
        assert "MISSING" not in attrs.values(), (kind, attrs)
        assert attrs["requested"] >= 1 << 56, (kind, attrs)
        assert 0 <= attrs["free"] <= attrs["total"], (kind, attrs)
        assert attrs["total"] > 0, (kind, attrs)
        assert attrs["pending_bytes"] >= 0 and attrs["pool_reserved"] >= 0
        # The message repeats them.
        assert "%d bytes requested" % attrs["requested"] in got["msg"], got
        assert "of %d bytes free" % attrs["total"] in got["msg"], got
        where = ("in host memory" if kind in ("pinned_array", "mapped_array")
                 else "on device 0")
        assert where in got["msg"], (kind, got["msg"])
    # free / total: device memory for device and managed arrays, host
    # memory for pinned and mapped ones.
    assert (out["managed_array"]["attrs"]["total"]
            == out["device_array"]["attrs"]["total"])
    host_total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for kind in ("pinned_array", "mapped_array"):
        assert out[kind]["attrs"]["total"] == host_total, out[kind]


# ---------------------------------------------------------------------------
# Tunables: every one has a range, and a value outside it is a ValueError
# naming it
# ---------------------------------------------------------------------------


def import_error(**env):
    """What ``import cudamem`` (and a first use) says under env: "ok", or
    the exception's type and message."""
    return run_child(r"""
        try:
            import numpy as np
            import cudamem as cuda
            cuda.to_device(np.arange(1 << 19, dtype=np.float64))
            print("ok")
        except Exception as e:
            print("%s: %s" % (type(e).__name__, e))
    """, timeout=60, env=env).stdout.strip()


@pytest.mark.ahead
@pytest.mark.parametrize("name, value, expect", [
    ("CUDAMEM_STAGING_CHUNK", "0", "4 KiB (4096) to 64 MiB"),
    ("CUDAMEM_STAGING_CHUNK", "1", "4 KiB (4096) to 64 MiB"),
    ("CUDAMEM_STAGING_CHUNK", "65M", "4 KiB (4096) to 64 MiB"),
    ("CUDAMEM_STAGING_CHUNK", "8Q", "4 KiB (4096) to 64 MiB"),
    ("CUDAMEM_STAGING_THRESHOLD", "-5", "0 to 1 TiB"),
    ("CUDAMEM_STAGING_BUFFERS", "1", "2 to 16"),
    ("CUDAMEM_STAGING_BUFFERS", "17", "2 to 16"),
    ("CUDAMEM_STAGING_THREADS", "1000", "0 to 256"),
    ("CUDAMEM_STAGING_RAMP", "7", "0 to 6"),
    ("CUDAMEM_STAGING_SPIN", "100001", "0 to 100000 microseconds"),
    ("CUDAMEM_STAGING", "maybe", "1/0, true/false"),
    ("CUDAMEM_STAGING_NT", "2", "1/0, true/false"),
    ("CUDAMEM_STAGING_HUGE", "x", "1/0, true/false"),
    ("CUDAMEM_STAGING_BOUNCE", "65M", "0 to 64 MiB"),
    ("CUDAMEM_STAGING_BOUNCE", "-1", "0 to 64 MiB"),
    ("CUDAMEM_MAX_PENDING_DEALLOCS_COUNT", "-1", "0 to 2147483647"),
    ("NUMBA_CUDA_MAX_PENDING_DEALLOCS_COUNT", "ten", "0 to 2147483647"),
    ("CUDAMEM_MAX_PENDING_DEALLOCS_RATIO", "1.5", "0.0 to 1.0"),
    ("CUDAMEM_STREAM_CACHE_SIZE", "17", "0 to 16"),
    ("CUDAMEM_ARRAY_INTERFACE_SYNC", "sometimes", "1/0, true/false"),
    ("CUDAMEM_PER_THREAD_DEFAULT_STREAM", "2", "1/0, true/false"),
    ("CUDAMEM_WARN_ON_IMPLICIT_COPY", "y", "1/0, true/false"),
    ("CUDAMEM_PINNED_POOL", "2", "1/0, true/false"),
    ("CUDAMEM_POOL_LIMIT", "4X", "0 to 9223372036854775807"),
    ("CUDAMEM_POOL_LIMIT", "-1", "0 to 9223372036854775807"),
    ("CUDAMEM_ASYNC_RELEASE_THRESHOLD", "99999999999G",
     "0 to 18446744073709551615"),
    ("CUDAMEM_DEVICE_MEMORY_LIMIT", "0", "a byte count above 0"),
    ("CUDAMEM_DEVICE_MEMORY_LIMIT", "1.5", "at most 1 (such as 0.25)"),
    ("CUDAMEM_DEVICE_MEMORY_LIMIT", "4T", "a byte count above 0"),
    ("CUDAMEM_SIM_DEVICES", "0", "1 to 16"),
    ("CUDAMEM_SIM_MEMORY", "1000", "1048576 (1 MiB) to 2**50"),
    ("CUDAMEM_SIM_MEMORY", "1023K", "such as 512M or 1GiB"),
    ("CUDAMEM_SIM_MEMORY", "2TiB", "1048576 (1 MiB) to 2**50"),
    ("CUDAMEM_SIM_MEMORY", "1.5G", "digits with an optional K, M or G"),
    ("CUDAMEM_SIM_DELAY_US", "-1", "0 to 60000000"),
    ("CUDAMEM_SIM_NO_PEER", "0-0", "pairs of distinct devices"),
    ("CUDAMEM_SIM_NO_FD_HANDLES", "2", "0 to 1"),
    ("CUDAMEM_SIM_CAPTURE_WAIT_S", "0", "1 to 3600"),
    ("CUDAMEM_SIM_CAPTURE_WAIT_S", "3601", "1 to 3600"),
])
def test_environment_tunable_out_of_range(name, value, expect):
    out = import_error(**{name: value})
    assert out.startswith("ValueError: %s=%s is not valid" % (name, value)), \
        out
    assert expect in out, out


@pytest.mark.ahead
@pytest.mark.parametrize("env", [
    {"CUDAMEM_STAGING_CHUNK": "4K", "CUDAMEM_STAGING_THRESHOLD": "0"},
    {"CUDAMEM_STAGING_CHUNK": "64MiB", "CUDAMEM_STAGING_BUFFERS": "2",
     "CUDAMEM_STAGING_RAMP": "6", "CUDAMEM_STAGING_SPIN": "100000",
     "CUDAMEM_STAGING_THREADS": "0"},
    {"CUDAMEM_STAGING_BUFFERS": "16", "CUDAMEM_STAGING_THREADS": "256",
     "CUDAMEM_STAGING_THRESHOLD": "1024G"},
    {"CUDAMEM_STAGING": "off", "CUDAMEM_STAGING_NT": "yes",
     "CUDAMEM_STAGING_HUGE": "False"},
    {"CUDAMEM_MAX_PENDING_DEALLOCS_COUNT": "0",
     "CUDAMEM_MAX_PENDING_DEALLOCS_RATIO": "1",
     "CUDAMEM_STREAM_CACHE_SIZE": "0", "CUDAMEM_PINNED_POOL": "off",
     "CUDAMEM_POOL_LIMIT": "4M", "CUDAMEM_ASYNC_RELEASE_THRESHOLD": "0"},
    {"CUDAMEM_DEVICE_MEMORY_LIMIT": "1.0"},
    {"CUDAMEM_DEVICE_MEMORY_LIMIT": "8 MiB"},
])
def test_environment_tunables_at_their_bounds(env):
    assert import_error(**env) == "ok"


@pytest.mark.ahead
@pytest.mark.sim
@pytest.mark.parametrize("value, size", [
    ("3145728", 3 << 20), ("512M", 512 << 20), ("2 GiB", 2 << 30),
    ("1536kb", 1536 << 10), (" 64MB ", 64 << 20), ("1g", 1 << 30),
])
def test_sim_memory_takes_the_limits_spellings(value, size):
    # CUDAMEM_SIM_MEMORY is written as CUDAMEM_DEVICE_MEMORY_LIMIT's byte
    # counts are; the simulated device has that much memory.
    out = run_child("""
        import cudamem as cuda
        print(cuda.current_context().get_memory_info()[1])
    """, timeout=60, env={"CUDAMEM_SIMULATOR": "1",
                          "CUDAMEM_SIM_MEMORY": value}).stdout
    assert int(out) == size, (value, out)


def test_staging_chunk_of_one_byte_is_refused_not_slow(ctx):
    # It was clamped to one byte: a 4 MiB to_device took most of a minute.
    old = _core._staging_config()
    try:
        for chunk in (0, 1, 4095, (64 << 20) + 1, -1, 2 ** 70):
            with pytest.raises(ValueError, match=r"_staging_config\(chunk="):
                _core._staging_config(chunk=chunk)
        assert _core._staging_config() == old
        c = _core._staging_config(chunk=4096, threshold=1)
        assert c["chunk"] == 4096
        h = np.arange(1 << 19, dtype=np.float64)       # 4 MiB
        np.testing.assert_array_equal(cuda.to_device(h).copy_to_host(), h)
    finally:
        _core._staging_config(**old)
        cuda.synchronize()
        _core._staging_trim()


@pytest.mark.ahead
def test_staging_trim_after_close():
    # The cached staging buffers of a closed context went with it (their
    # events too): trimming them must not destroy those events again,
    # which aborted the simulator ("not a live event").
    out = run_child(r"""
        import numpy as np
        import cudamem as cuda
        from cudamem import _core
        h = np.arange(1 << 20, dtype=np.float64)
        cuda.to_device(h)
        assert _core._staging_stats()["buffers"] > 0
        cuda.close()
        _core._staging_trim()
        assert _core._staging_stats()["buffers"] == 0
        np.testing.assert_array_equal(cuda.to_device(h).copy_to_host(), h)
        _core._staging_trim()
        print(_core._staging_stats()["buffers"])
    """).stdout
    assert out.strip() == "0"


@pytest.mark.parametrize("kw, expect", [
    ({"threshold": -1}, "0 to 1 TiB"),
    ({"threshold": 2 ** 41}, "0 to 1 TiB"),
    ({"buffers": 1}, "2 to 16"),
    ({"buffers": 17}, "2 to 16"),
    ({"threads": 257}, "0 to 256"),
    ({"part": 63}, "64 to 67108864"),
    ({"part": (64 << 20) + 1}, "64 to 67108864"),
    ({"ramp": 7}, "0 to 6"),
    ({"spin": 100001}, "0 to 100000 microseconds"),
])
def test_staging_config_keyword_out_of_range(ctx, kw, expect):
    old = _core._staging_config()
    with pytest.raises(ValueError, match=r"_staging_config\(%s=" % next(
            iter(kw))) as e:
        _core._staging_config(**kw)
    assert expect in str(e.value)
    assert _core._staging_config() == old        # nothing was changed


def test_run_time_setters_check_their_range(ctx, monkeypatch):
    from cudamem import config

    for name, bad in [("CUDA_DEALLOCS_COUNT", -1),
                      ("CUDA_DEALLOCS_COUNT", 2 ** 31),
                      ("CUDA_DEALLOCS_RATIO", -0.1),
                      ("CUDA_DEALLOCS_RATIO", 1.5),
                      ("CUDA_DEALLOCS_RATIO", "lots"),
                      ("CUDA_STREAM_CACHE_SIZE", 17)]:
        before = getattr(config, name)
        with pytest.raises(ValueError, match=name):
            setattr(config, name, bad)
        assert getattr(config, name) == before
    monkeypatch.setattr(config, "CUDA_DEALLOCS_COUNT", 0)
    monkeypatch.setattr(config, "CUDA_DEALLOCS_RATIO", 1.0)
    assert (config.CUDA_DEALLOCS_COUNT, config.CUDA_DEALLOCS_RATIO) == (0, 1.0)


@pytest.mark.ahead
def test_pool_limit_and_release_threshold_check_their_range():
    out = run_child(r"""
        import cudamem as cuda
        for manager in ("pool", "async"):
            cuda.set_memory_manager(manager)
            mm = cuda.current_context(0).memory_manager
            for bad in (-1, 2 ** 63):
                try:
                    mm.limit = bad
                    print(manager, "limit", bad, "accepted")
                except ValueError as e:
                    print(manager, "limit ValueError", e)
            mm.limit = 0
            if manager == "async":
                for bad in (-1, 2 ** 64):
                    try:
                        mm.release_threshold = bad
                        print("release_threshold", bad, "accepted")
                    except ValueError as e:
                        print("release_threshold ValueError", e)
            cuda.close()
    """).stdout
    lines = out.splitlines()
    assert len(lines) == 6, out
    for line in lines:
        assert "ValueError" in line and "must be from 0 to" in line, line
