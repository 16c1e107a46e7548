# SPDX-License-Identifier: MIT
"""Inputs that used to crash, hang or fail obscurely, each now a clear
Python exception or correct behaviour: arrays over pointers that are no
live allocation, faults on the simulator's worker threads, zero-byte
arrays and shapes NumPy refuses.  Whatever could take the process down
runs in a child through helpers.run_child."""

import signal

import numpy as np
import pytest

import cudamem as cuda
from helpers import run_child
from cudamem.cudadrv.devicearray import DeviceNDArray

sim = pytest.mark.sim

# ------------------------------------------------------------------ #
# The harness itself                                                  #
# ------------------------------------------------------------------ #


@pytest.mark.ahead
def test_harness_names_the_signal():
    with pytest.raises(pytest.fail.Exception,
                       match="child died of SIGSEGV"):
        run_child("import os, signal\n"
                  "os.kill(os.getpid(), signal.SIGSEGV)\n")
    r = run_child("import os, signal\n"
                  "os.kill(os.getpid(), signal.SIGSEGV)\n",
                  allow_signals=["SIGSEGV"])
    assert r.signame == "SIGSEGV"
    # faulthandler is on in the child.
    assert "Segmentation fault" in r.stderr


@pytest.mark.ahead
def test_harness_names_a_hang():
    with pytest.raises(pytest.fail.Exception,
                       match=r"child hung: still running after 2 s"):
        run_child("import time\nprint('started', flush=True)\n"
                  "time.sleep(60)\n", timeout=2)


@pytest.mark.ahead
def test_harness_exit_status_and_output():
    r = run_child("import sys, cudamem\nprint('hi', sys.argv[1:])\n",
                  args=["x"])
    assert r.returncode == 0 and "hi ['x']" in r.stdout
    with pytest.raises(pytest.fail.Exception,
                       match="child exited with status 3"):
        run_child("raise SystemExit(3)")
    assert run_child("raise SystemExit(3)", check=False).returncode == 3


# ------------------------------------------------------------------ #
# 1. Arrays over pointers that are no live allocation                 #
# ------------------------------------------------------------------ #

# Each makes `a` over 10 float64 at address P (or at P, freed), by one
# import path; the child reports a refusal, or writes through `a` (which
# crashed before the import checked the pointer).
_DEAD = """
import numpy as np
import cudamem as cuda
from cudamem.cudadrv.devicearray import DeviceNDArray

P = 0x1000
ctx = cuda.current_context()
cai = {"shape": (10,), "typestr": "<f8", "data": (P, False), "version": 3}


class Foreign:
    __cuda_array_interface__ = cai


def freed():
    d = cuda.device_array(1 << 19)      # 4 MiB: unmapped once freed
    desc = dict(d.__cuda_array_interface__)
    d.gpu_data.free()
    ctx.memory_manager.deallocations.clear()    # release it now
    return cuda.from_cuda_array_interface(desc, owner=None)


make = {
    "as_cuda_array": lambda: cuda.as_cuda_array(Foreign()),
    "from_cuda_array_interface":
        lambda: cuda.from_cuda_array_interface(cai, owner=None),
    "MemoryPointer": lambda: DeviceNDArray(
        (10,), (8,), np.float64, gpu_data=cuda.MemoryPointer(ctx, P, 80)),
    "copy_to_device": lambda: cuda.device_array(10).copy_to_device(
        Foreign()),
    "freed": freed,
}[WHICH]
try:
    a = make()
except ValueError as e:
    print("refused:", e)
else:
    a[:] = 1.0
    a.reshape(2, 5).T.copy_to_host()
    print("accepted")
"""


@pytest.mark.ahead
@pytest.mark.parametrize("which", ["as_cuda_array",
                                   "from_cuda_array_interface",
                                   "MemoryPointer", "copy_to_device",
                                   "freed"])
def test_pointer_in_no_allocation_is_refused(which):
    # The plain manager gives freed memory back to the driver at once.
    r = run_child("WHICH = %r\n" % which + _DEAD,
                  env={"CUDAMEM_MEMORY_MANAGER": "default"})
    assert "refused:" in r.stdout, r.output
    assert "no live CUDA allocation" in r.stdout
    if which != "freed":
        assert "0x1000" in r.stdout


def test_foreign_memory_is_accepted(ctx):
    d = cuda.to_device(np.arange(10.0))
    # A pointer into the middle of an allocation.
    mid = cuda.from_cuda_array_interface(
        d[3:].__cuda_array_interface__, owner=d)
    np.testing.assert_array_equal(mid.copy_to_host(), np.arange(3.0, 10.0))
    # A negative stride from the last element back to the first.
    rev = cuda.from_cuda_array_interface(
        d[::-1].__cuda_array_interface__, owner=d)
    np.testing.assert_array_equal(rev.copy_to_host(), np.arange(9.0, -1, -1))
    # Mapped and managed memory.
    for a in (cuda.mapped_array(6), cuda.managed_array(6)):
        a[:] = 2.0
        cuda.synchronize()
        v = cuda.from_cuda_array_interface(a.__cuda_array_interface__,
                                           owner=a)
        v[:] = 3.0
        cuda.synchronize()
        np.testing.assert_array_equal(np.asarray(a), np.full(6, 3.0))
    # Memory a manager handed out, seen through a MemoryPointer.
    mem = ctx.memalloc(80)
    view = DeviceNDArray((10,), (8,), np.float64,
                         gpu_data=cuda.MemoryPointer(ctx, mem.device_pointer,
                                                     80, owner=mem))
    view[:] = 5.0
    np.testing.assert_array_equal(view.copy_to_host(), np.full(10, 5.0))


@pytest.mark.parametrize("desc", [
    {"shape": (0,), "typestr": "<f8", "data": (0, False)},
    {"shape": (0, 4), "typestr": "<f8", "data": (0x1000, False)},
    {"shape": (4,), "typestr": "|V0", "data": (0, False)},
])
def test_empty_imports_need_no_allocation(ctx, desc):
    a = cuda.from_cuda_array_interface(dict(desc, version=3), owner=None)
    h = a.copy_to_host()
    assert h.shape == desc["shape"] and h.nbytes == 0


def test_span_past_the_allocation_is_refused(ctx):
    # Far past the end, whatever granularity the driver rounds sizes to.
    n = 1 << 20
    d = cuda.device_array(4)
    cai = dict(d.__cuda_array_interface__, shape=(n,))
    with pytest.raises(ValueError, match="'strides' reach outside"):
        cuda.from_cuda_array_interface(cai, owner=d)
    mp = cuda.MemoryPointer(ctx, d.device_ctypes_pointer.value + 8, 8 * n,
                            owner=d)
    with pytest.raises(ValueError, match="gpu_data reaches outside"):
        DeviceNDArray((n,), (8,), np.float64, gpu_data=mp)


# The simulator's internal kernels check the memory they touch, as its
# copies do: memory freed behind an import's back is an error, not a
# fault.  (On a GPU the same is an illegal address.)
_KERNEL_DEAD = """
import numpy as np
import cudamem as cuda
from cudamem import CudaAPIError

d = cuda.device_array((512, 1024))      # 4 MiB: unmapped once freed
a = cuda.from_cuda_array_interface(dict(d.__cuda_array_interface__),
                                   owner=None)
live = cuda.device_array((512, 1024), dtype=np.float32)
d.gpu_data.free()
cuda.current_context().memory_manager.deallocations.clear()  # now
# None of these allocates (a new allocation could take the freed range).
for name, op in [("fill", lambda: a.__setitem__(slice(None), 1.0)),
                 ("cast", lambda: live.__setitem__(slice(None), a)),
                 ("strided", lambda: live[:, ::2].__setitem__(
                     slice(None), a[:, 1::2])),
                 ("broadcast", lambda: live.__setitem__(slice(None),
                                                        a[0]))]:
    try:
        op()
        cuda.synchronize()
    except CudaAPIError as e:
        print(name, "refused:", e)
    else:
        print(name, "ran")
"""


@sim
def test_internal_kernel_checks_its_memory():
    r = run_child(_KERNEL_DEAD, env={"CUDAMEM_MEMORY_MANAGER": "default"})
    lines = r.stdout.splitlines()
    assert len(lines) == 4, r.output
    for ln in lines:
        assert "refused:" in ln and "CUDA_ERROR_INVALID_VALUE" in ln, \
            r.output


# ------------------------------------------------------------------ #
# 4. Faults on the simulator's worker threads                         #
# ------------------------------------------------------------------ #

_FAULT_SIGNALS = (signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE,
                  signal.SIGILL, signal.SIGABRT)


@sim
def test_worker_leaves_fault_signals_unblocked(ctx):
    masks = []
    s = cuda.stream()
    s.add_callback(lambda st, status, arg: masks.append(
        signal.pthread_sigmask(signal.SIG_BLOCK, [])))
    s.synchronize()
    assert len(masks) == 1
    for sig in _FAULT_SIGNALS:
        assert sig not in masks[0], sig
    # Asynchronous signals still belong to the application's threads.
    assert signal.SIGINT in masks[0]


_WORKER_FAULT = """
import ctypes
import cudamem as cuda


def fault_in_worker(stream, status, arg):
    ctypes.string_at(8, 1)


s = cuda.stream()
s.add_callback(fault_in_worker)
s.synchronize()
print("survived")
"""


@sim
def test_fault_in_worker_is_reported():
    # A sanitizer build reports the fault after faulthandler and aborts.
    r = run_child(_WORKER_FAULT, check=False,
                  allow_signals=["SIGSEGV", "SIGABRT"])
    assert r.signame in ("SIGSEGV", "SIGABRT"), r.output
    assert "Fatal Python error: Segmentation fault" in r.stderr, r.output
    assert "fault_in_worker" in r.stderr


# ------------------------------------------------------------------ #
# 9. Zero-byte arrays                                                 #
# ------------------------------------------------------------------ #

ZERO_BYTE = [np.dtype("V0"), np.dtype([])]


@pytest.mark.parametrize("dt", ZERO_BYTE, ids=str)
@pytest.mark.parametrize("shape", [5, (3, 4), (), (2, 0, 3)], ids=str)
def test_zero_byte_arrays_are_empty(ctx, dt, shape):
    h = np.zeros(shape, dt)
    for d in (cuda.device_array(shape, dtype=dt), cuda.to_device(h),
              cuda.device_array_like(h),
              cuda.to_device(h, stream=cuda.stream())):
        assert d.shape == h.shape and d.dtype == dt and d.nbytes == 0
        assert d.__cuda_array_interface__["data"][0] == 0
        back = d.copy_to_host()
        assert back.shape == h.shape and back.dtype == dt
        out = np.zeros(shape, dt)
        assert d.copy_to_host(out) is out
        d.copy_to_device(h)
        d.copy_to_device(cuda.device_array(shape, dtype=dt))
        if d.ndim:
            d[:] = h
            assert d[:1].copy_to_host().shape == h[:1].shape
            if d.ndim == 2:
                assert d.T.copy_to_host().shape == h.T.shape
            assert d.reshape(-1).copy_to_host().shape == (h.size,)


# ------------------------------------------------------------------ #
# 10. Shapes NumPy refuses                                            #
# ------------------------------------------------------------------ #

HUGE = (0, 2**62)


@pytest.mark.parametrize("make", [
    lambda: cuda.device_array(HUGE),
    lambda: cuda.device_array(HUGE[::-1], order="F"),
    lambda: cuda.device_array((2**61, 0, 3), dtype=np.int32),
    lambda: DeviceNDArray(HUGE, (8, 8), np.float64),
    lambda: cuda.from_cuda_array_interface(
        {"shape": HUGE, "typestr": "<f8", "data": (0, False),
         "version": 3}, owner=None),
    lambda: cuda.device_array(0).reshape(HUGE),
    lambda: cuda.device_array((0, 4)).reshape(2**62, 0),
    lambda: cuda.pinned_array(HUGE),
    lambda: cuda.mapped_array(HUGE),
    lambda: cuda.managed_array(HUGE),
], ids=["device_array", "device_array_F", "int32_3d", "DeviceNDArray",
        "cai", "reshape", "reshape_2d", "pinned", "mapped", "managed"])
def test_shapes_numpy_refuses_are_refused(ctx, make):
    with pytest.raises(ValueError, match="array is too big"):
        np.empty(HUGE)
    with pytest.raises(ValueError, match="array is too big"):
        make()


@pytest.mark.parametrize("shape, dt", [((0, 2**61), np.uint8),
                                        ((2**59, 0), np.float64),
                                        ((0, 2**40, 2**20), np.uint8)])
def test_empty_shapes_numpy_accepts_are_accepted(ctx, shape, dt):
    h = np.empty(shape, dt)
    d = cuda.device_array(shape, dtype=dt)
    assert d.shape == h.shape and d.size == 0
    back = d.copy_to_host()
    assert back.shape == h.shape and back.dtype == h.dtype
