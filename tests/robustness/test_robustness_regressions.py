# SPDX-License-Identifier: MIT
"""Regression tests of the bugs the robustness sweep
(test_robustness.py) found, run in this process or in a child of their
own: object dtypes and reference leaks of the _like functions, sizes and
indices beyond Py_ssize_t, freed memory, DeviceNDArray over too little
memory, a device reset, host arrays that outlive their context, and
MemoryPointer views out of bounds.
"""

import sys

import pytest
from helpers import run_child

# Alone on a GPU, as the sweep's groups (test_robustness.py).
pytestmark = pytest.mark.exclusive


def run_code(src, timeout=60):
    """Run Python source in a fresh child; (returncode, stdout, stderr).
    A crash or a hang fails the test (crashutil)."""
    r = run_child(src, timeout=timeout, check=False)
    return r.returncode, r.stdout, r.stderr


@pytest.mark.parametrize("fn", ["device_array_like", "pinned_array_like",
                                "mapped_array_like"])
def test_like_rejects_object_dtype(fn):
    # Was accepted: pinned_array_like gave a NumPy array of object
    # pointers in uninitialised memory, and printing it crashed.
    import numpy as np

    import cudamem

    with pytest.raises(TypeError, match="Python objects"):
        getattr(cudamem, fn)(np.empty(2, object))


def test_like_without_flags_keeps_no_dtype_reference():
    # An array-like without .flags leaked a reference to its dtype.
    import numpy as np

    import cudamem

    class NoFlags:
        shape = (4,)
        strides = (8,)
        dtype = np.dtype([("x", "f8")])

    before = sys.getrefcount(NoFlags.dtype)
    for _ in range(100):
        with pytest.raises(AttributeError):
            cudamem.device_array_like(NoFlags())
    assert sys.getrefcount(NoFlags.dtype) - before < 10


@pytest.mark.parametrize("shape, strides", [
    ((3, 3), (2 ** 62, 2 ** 62)),
    ((4,), (-2 ** 63,)),
    ((2 ** 40, 2 ** 20), (2 ** 30, -2 ** 40)),
])
def test_span_overflow_is_a_value_error(shape, strides):
    # The byte span of these layouts overflowed a signed 64-bit integer
    # (undefined behaviour); CAI import then let the view through.
    import cudamem

    with pytest.raises(ValueError):
        cudamem.device_array(shape, strides=strides)
    with pytest.raises(ValueError):
        cudamem.pinned_array(shape, strides=strides)
    d = cudamem.device_array(4)
    desc = dict(d.__cuda_array_interface__, shape=shape, strides=strides)
    with pytest.raises(ValueError):
        cudamem.from_cuda_array_interface(desc)


@pytest.mark.parametrize("key", [2 ** 63, -2 ** 63 - 1, 10 ** 30,
                                 (0, 2 ** 64)])
def test_index_beyond_ssize_t_is_an_index_error(key):
    import cudamem

    d = cudamem.device_array((3, 2))
    with pytest.raises(IndexError):
        d[key]
    with pytest.raises(IndexError):
        d[key] = 1


@pytest.mark.parametrize("call", [
    lambda c: c.device_array(2 ** 63),
    lambda c: c.device_array((3, 2 ** 64)),
    lambda c: c.pinned_array(3, strides=(2 ** 63,)),
    lambda c: c.device_array((2, 3)).reshape(2 ** 63),
    lambda c: c.device_array((2, 3)).transpose((1, 2 ** 63)),
    lambda c: c.DeviceNDArray((3,), (-2 ** 63 - 1,), "f8"),
])
def test_dimension_beyond_ssize_t_is_a_value_error(call):
    # Q8 (and NumPy): OverflowError before.
    import cudamem

    with pytest.raises(ValueError):
        call(cudamem)


@pytest.mark.parametrize("use", [
    lambda c, f: f.copy_to_host(),
    lambda c, f: f[1:].copy_to_host(),
    lambda c, f: f[0],
    lambda c, f: f.__setitem__(0, 1.0),
    lambda c, f: c.device_array(3).copy_to_device(f),
    lambda c, f: c.device_array(3, "i1").__setitem__(slice(None), f),
    lambda c, f: c.to_device(f.copy_to_host(), to=f),
    lambda c, f: c.as_cuda_array(f).copy_to_host(),
    lambda c, f: f.__dlpack__(),
    lambda c, f: c.from_dlpack(f),
])
def test_freed_memory_is_not_touched(use):
    # After DeviceAllocation.free() the array's memory was read and
    # written (AddressSanitizer: heap-use-after-free on the simulator).
    import cudamem

    f = cudamem.to_device([1.0, 2.0, 3.0])
    f.gpu_data.free()
    with pytest.raises(ValueError, match="freed"):
        use(cudamem, f)


def test_device_array_on_too_little_gpu_data_is_refused():
    # DeviceNDArray(..., gpu_data=) took any layout over any memory, so
    # its copies reached past the allocation.
    import cudamem

    m = cudamem.current_context().memalloc(8)
    with pytest.raises(ValueError, match="spans"):
        cudamem.DeviceNDArray((1000,), (8,), "f8", gpu_data=m)
    p = cudamem.MemoryPointer(m.context, m.device_pointer, 8, owner=m)
    with pytest.raises(ValueError, match="spans"):
        cudamem.DeviceNDArray((2,), (8,), "f8", gpu_data=p)
    d = cudamem.DeviceNDArray((1,), (8,), "f8", gpu_data=p)
    d.copy_to_device([1.0])
    assert d.copy_to_host()[0] == 1.0


def test_kernel_arguments_with_freed_memory_are_refused():
    # A launch packed the dangling pointer of freed memory.
    import cudamem

    try:
        m = cudamem.compile('extern "C" __global__ void k(float *x) {}')
    except cudamem.CudaSupportError:
        pytest.skip("no NVRTC")
    k = m.get_function("k")
    d = cudamem.device_array(3, "f4")
    v = d[1:]
    d.gpu_data.free()
    a = cudamem.current_context().memalloc(8)
    a.free()
    for arg in (d, v, a):
        with pytest.raises(ValueError, match="freed"):
            k[1, 1](arg)


def test_device_reset_then_new_work_gets_a_fresh_context():
    # After Device.reset() every call failed with
    # CUDA_ERROR_CONTEXT_IS_DESTROYED (the destroyed context stayed
    # current on the thread) until close().
    rc, out, err = run_code(
        "import numpy as np, cudamem as cuda\n"
        "d = cuda.to_device(np.arange(3.0))\n"
        "for _ in range(3):\n    cuda.select_device(0)\n"
        "cuda.get_current_device().reset()\n"
        "try:\n    d.copy_to_host()\nexcept ValueError:\n    pass\n"
        "cuda.memory_stats()\n"
        "assert list(cuda.to_device(np.arange(3.0)).copy_to_host())"
        " == [0, 1, 2]\n"
        "cuda.close()\nprint('OK')\n")
    assert rc == 0 and out.strip() == "OK", out + err


_SURVIVE = """
import numpy as np, cudamem as cuda

def mapped(addr):
    for ln in open("/proc/self/maps"):
        a, b = (int(x, 16) for x in ln.split()[0].split("-"))
        if a <= addr < b:
            return True
    return False

# Small arrays share pages (the driver packs them); large ones do not.
arrs = [cuda.%(fn)s(n) for n in (3, 4096, 5, 1 << 18, 7)]
for i, a in enumerate(arrs):
    a[:] = np.arange(a.size) + i
cuda.%(how)s
for i, a in enumerate(arrs):
    assert (a == np.arange(a.size) + i).all(), i
    a += 1
junk = [np.ones(4096) for _ in range(64)]
for i, a in enumerate(arrs):
    assert (a == np.arange(a.size) + i + 1).all(), i
# The new context works, and copies the old arrays as pageable memory;
# those of mapped or managed memory have no device side any more.
d = cuda.to_device(np.asarray(arrs[3]))
assert (d.copy_to_host() == arrs[3]).all()
if "%(fn)s" != "pinned_array":
    try:
        arrs[0].copy_to_host()
    except ValueError as e:
        assert "context of this" in str(e), e
    else:
        raise AssertionError("no error")
p = cuda.%(fn)s(16)
p[:] = 2
assert (p == 2).all()
# The memory goes with the last array.
addrs = [a.ctypes.data for a in arrs]
del a, arrs
import gc; gc.collect()
assert not any(mapped(x) for x in addrs), [hex(x) for x in addrs]
print("OK")
"""


@pytest.mark.parametrize("how", ["close()",
                                 "get_current_device().reset()"])
@pytest.mark.parametrize("fn", ["pinned_array", "mapped_array",
                                "managed_array"])
def test_host_arrays_survive_close(fn, how):
    # Resetting the primary context unmaps its page-locked, mapped and
    # managed memory; the arrays still pointing there keep their contents
    # as ordinary memory (numba's fault there).
    rc, out, err = run_code(_SURVIVE % {"fn": fn, "how": how})
    assert rc == 0 and out.strip() == "OK", (rc, out, err[-2000:])


def test_host_arrays_survive_close_with_pinned_pool():
    src = _SURVIVE % {"fn": "pinned_array", "how": "close()"}
    p = run_child(src, timeout=60, check=False,
                  env={"CUDAMEM_PINNED_POOL": "1"})
    assert p.returncode == 0 and p.stdout.strip() == "OK", p.stderr[-2000:]


_THREAD_DURING_CLOSE = """
import threading, numpy as np, cudamem as cuda
lock = threading.Lock()
theirs = []
stop = False

def churn():
    while not stop:
        with lock:
            arrs = list(theirs)
        for a in arrs:
            a[:] = 1
        del arrs
        with lock:
            if len(theirs) > 6:
                del theirs[:3]

t = threading.Thread(target=churn)
t.start()
for _ in range(20):
    fresh = [cuda.pinned_array(n) for n in (3, 5000, 7)]
    fresh += [cuda.managed_array(9), cuda.mapped_array(4)]
    with lock:
        theirs.extend(fresh)
    del fresh
    cuda.close()
stop = True
t.join()
for a in theirs:
    a[:] = 3
    assert (a == 3).all()
print("OK")
"""


def test_host_arrays_used_by_another_thread_during_close():
    # The reset unmaps the pages until they are put back: another thread
    # writing the arrays, or dropping them, must not see that window.
    rc, out, err = run_code(_THREAD_DURING_CLOSE, timeout=120)
    assert rc == 0 and out.strip() == "OK", (rc, out, err[-2000:])


@pytest.mark.parametrize("meth, args", [
    ("memset", (0, 9)), ("memset", (0, -1)), ("view", (0, 9)),
    ("view", (-4, 4)), ("view", (12,))])
def test_memory_pointer_stays_in_bounds(meth, args):
    # memset and view reached past the pointer's size.
    import cudamem

    m = cudamem.current_context().memalloc(8)
    p = cudamem.MemoryPointer(m.context, m.device_pointer, 8, owner=m)
    with pytest.raises((ValueError, RuntimeError)):
        getattr(p, meth)(*args)
