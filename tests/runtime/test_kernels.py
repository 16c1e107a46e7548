# SPDX-License-Identifier: MIT
"""User kernels: cudamem.compile, Module, Kernel, launch configurations,
argument packing, shared / dynamic shared / local / constant memory, and
kernels from numba-cuda, CuPy and PyTorch on cudamem memory.

Compiling needs NVRTC only, so those tests run on the simulator as well;
launching needs a GPU (the simulator checks the configuration and the
arguments, then raises CudaSupportError).
"""

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import cudamem
from cudamem import CompileError, CudaSupportError
from helpers import ROOT

EXAMPLES = ROOT / "examples"

SCALARS = r"""
#include <cuda_fp16.h>
struct pair { double a; char b; };
extern "C" __global__ void scalars(char a, short b, int c, long long d,
                                   float e, double f, __half g, bool h,
                                   float *p, pair s, unsigned char u)
{
}
"""

TEMPLATE = r"""
template <typename T>
__global__ void fill(T *x, T v, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        x[i] = v;
    }
}
extern "C" __global__ void empty() {}
"""


def _nvrtc_or_skip():
    try:
        cudamem.compile('extern "C" __global__ void k() {}')
    except CudaSupportError as e:
        pytest.skip(str(e))


@pytest.fixture
def nvrtc(ctx):
    _nvrtc_or_skip()
    return ctx


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("CUDAMEM_CACHE_DIR", str(d))
    return d


class CAI:
    """A minimal device array: one memalloc allocation seen through the
    CUDA Array Interface."""

    def __init__(self, shape, dtype, ctx=None):
        self.shape = tuple(np.atleast_1d(shape)) if shape != () else ()
        self.dtype = np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape)) * self.dtype.itemsize
        ctx = ctx or cudamem.current_context()
        self.mem = ctx.memalloc(max(self.nbytes, 1))
        self.ptr = self.mem.device_pointer

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "strides": None,
                "typestr": self.dtype.str, "data": (self.ptr, False),
                "version": 3}

    @classmethod
    def from_host(cls, a):
        from cudamem import _core

        a = np.ascontiguousarray(a)
        d = cls(a.shape, a.dtype)
        _core._memcpy_htod(d.ptr, a.reshape(-1).view(np.uint8))
        return d

    def copy_to_host(self):
        from cudamem import _core

        cudamem.synchronize()
        out = np.empty(self.shape, self.dtype)
        _core._memcpy_dtoh(out.reshape(-1).view(np.uint8), self.ptr)
        return out


# ---------------------------------------------------------------------------
# compile / Module / Kernel (simulator and GPU)


def test_compile_returns_module(nvrtc, cache_dir):
    mod = cudamem.compile(TEMPLATE, name_expressions=["fill<float>"])
    assert isinstance(mod, cudamem.Module)
    assert mod.lowered_names == {"fill<float>": "_Z4fillIfEvPT_S0_i"}
    k = mod.get_function("fill<float>")
    assert isinstance(k, cudamem.Kernel)
    assert k.name == "fill<float>"
    assert k.lowered_name == "_Z4fillIfEvPT_S0_i"
    assert k.params == ((0, 8, "int"), (8, 4, "float"), (12, 4, "int"))
    assert mod.get_function("fill<float>") is k
    assert mod.empty is mod.get_function("empty")
    assert mod.empty.params == ()
    assert k.module is mod
    assert ".entry" in mod.ptx


def test_param_layout_every_scalar_type(nvrtc, cache_dir):
    k = cudamem.compile(SCALARS).scalars
    assert k.params == (
        (0, 1, "int"), (2, 2, "int"), (4, 4, "int"), (8, 8, "int"),
        (16, 4, "float"), (24, 8, "float"), (32, 2, "bytes"),
        (34, 1, "int"), (40, 8, "int"), (48, 16, "bytes"), (64, 1, "int"))


def test_no_such_kernel(nvrtc, cache_dir):
    mod = cudamem.compile(TEMPLATE)
    with pytest.raises(ValueError, match="no kernel named 'nope'"):
        mod.get_function("nope")
    with pytest.raises(AttributeError, match="no kernel named 'nope'"):
        _ = mod.nope
    with pytest.raises(AttributeError):
        _ = mod.__nope__
    with pytest.raises(TypeError):
        mod.get_function(3)


def test_compile_error_carries_log(nvrtc, cache_dir):
    with pytest.raises(CompileError) as ei:
        cudamem.compile('extern "C" __global__ void k() { undefined_x; }')
    e = ei.value
    assert "NVRTC_ERROR_COMPILATION" in str(e)
    assert 'identifier "undefined_x" is undefined' in e.log
    assert "cudamem_module.cu(1)" in e.log
    assert e.log in str(e)
    assert not isinstance(e, CudaSupportError)
    e2 = pickle.loads(pickle.dumps(e))
    assert (type(e2), str(e2), e2.log) == (CompileError, str(e), e.log)


def test_compile_error_bad_option(nvrtc, cache_dir):
    with pytest.raises(CompileError, match="INVALID_OPTION"):
        cudamem.compile("__global__ void k() {}",
                        options=["--no-such-option"])


def test_compile_bad_name_expression(nvrtc, cache_dir):
    with pytest.raises(CompileError):
        cudamem.compile(TEMPLATE, name_expressions=["nothing<int>"])


def test_compile_argument_types(nvrtc, cache_dir):
    with pytest.raises(TypeError):
        cudamem.compile(b"__global__ void k() {}")
    with pytest.raises(TypeError, match="single string"):
        cudamem.compile("", options="-G")
    with pytest.raises(TypeError, match="must contain str"):
        cudamem.compile("", options=[1])
    with pytest.raises(TypeError, match="constants"):
        cudamem.compile("", constants=[1, 2])
    with pytest.raises(ValueError, match="C identifier"):
        cudamem.compile("", constants={"1x": np.ones(2)})
    with pytest.raises(ValueError, match="non-empty"):
        cudamem.compile("", constants={"x": np.ones(0)})
    with pytest.raises(TypeError):
        cudamem.compile("", "positional")


def test_options_and_defines(nvrtc, cache_dir):
    src = 'extern "C" __global__ void k(WIDTH_T x) {}'
    mod = cudamem.compile(src, options=("-DWIDTH_T=short",))
    assert mod.k.params == ((0, 2, "int"),)


def test_constants_declared(nvrtc, cache_dir):
    src = r"""
    extern "C" __global__ void k(float *x) {
        x[0] = coefficients[1] + table[1][2] + (float)one + h[0].x;
    }
    """
    mod = cudamem.compile(src, constants={
        "coefficients": np.array([1.0, 2.0, 3.0], np.float32),
        "table": np.arange(6, dtype=np.int64).reshape(2, 3),
        "one": np.float64(1.0),
        "h": np.ones(2, np.complex64),
    })
    ptx = mod.ptx
    assert ".const .align 4 .b8 coefficients[12]" in ptx
    assert "table[48]" in ptx


def test_constants_error_lines_point_at_user_source(nvrtc, cache_dir):
    with pytest.raises(CompileError) as ei:
        cudamem.compile("\n\nbad", constants={"c": np.ones(3, np.float32)})
    assert "cudamem_module.cu(3)" in ei.value.log


def test_disk_cache(nvrtc, cache_dir):
    src = 'extern "C" __global__ void cached(int x) {}'
    cudamem.compile(src)
    files = sorted(os.listdir(cache_dir))
    assert len(files) == 1 and files[0].startswith("kernel-")
    cudamem.compile(src)
    assert sorted(os.listdir(cache_dir)) == files
    cudamem.compile(src, options=["-DX=1"])
    cudamem.compile(src, name_expressions=["cached"])
    assert len(os.listdir(cache_dir)) == 3
    # A damaged entry is ignored and rewritten.
    for f in os.listdir(cache_dir):
        (cache_dir / f).write_bytes(b"junk")
    assert cudamem.compile(src).cached.params == ((0, 4, "int"),)


# ---------------------------------------------------------------------------
# launch configurations and arguments: checked before the driver is called


@pytest.fixture
def fill(nvrtc, cache_dir):
    return cudamem.compile(TEMPLATE,
                           name_expressions=["fill<float>"]).get_function(
                               "fill<float>")


@pytest.mark.parametrize("cfg, exc, match", [
    ((0, 1), ValueError, "grid.x must be at least 1"),
    ((1, 0), ValueError, "block.x must be at least 1"),
    (((1, -1), 1), ValueError, "grid.y must be at least 1"),
    ((1, 2048), ValueError, "block.x = 2048 exceeds"),
    ((1, (1, 1, 65)), ValueError, "block.z = 65 exceeds"),
    ((1, (32, 32, 2)), ValueError, "2048 threads exceeds"),
    ((2 ** 31, 1), ValueError, "grid.x = 2147483648 exceeds"),
    ((1, (1, 65536)), ValueError, "block.y"),
    (((1, 1, 1, 1), 1), ValueError, "1 to 3 ints"),
    (((), 1), ValueError, "1 to 3 ints"),
    ((1.0, 1), TypeError, "grid must be an int"),
    ((1, "a"), TypeError, "block must be an int"),
    ((1, 1, "stream"), TypeError, "Stream"),
    ((1, 1, 0, -1), ValueError, "must not be negative"),
    ((1, 1, 0, 1.5), TypeError, "shared_bytes must be an int"),
    ((1, 1, 0, 10 ** 7), ValueError, "exceed the device's limit"),
    ((1, 1, 0, 2 ** 70), ValueError, "exceed the device's limit"),
])
def test_bad_launch_configuration(fill, cfg, exc, match):
    with pytest.raises(exc, match=match):
        fill[cfg]


def test_config_needs_two_to_four_items(fill):
    with pytest.raises(ValueError, match="launch configuration"):
        fill[1]
    with pytest.raises(ValueError, match="launch configuration"):
        fill[1, 1, 0, 0, 0]
    with pytest.raises(ValueError, match="needs a launch configuration"):
        fill(1, 2, 3)


def test_bad_arguments(fill, ctx):
    d = CAI(4, np.float32)
    launch = fill[1, 32]
    with pytest.raises(TypeError, match=r"takes 3 arguments \(2 given\)"):
        launch(d, 1.0)
    with pytest.raises(TypeError, match=r"takes 3 arguments \(4 given\)"):
        launch(d, 1.0, 4, 5)
    with pytest.raises(TypeError, match="positional"):
        launch(d, 1.0, n=4)
    with pytest.raises(TypeError, match="argument 0 .*host arrays"):
        launch(np.zeros(4, np.float32), 1.0, 4)
    with pytest.raises(TypeError, match="argument 2 .*Python float"):
        launch(d, 1.0, 4.0)
    with pytest.raises(TypeError, match="argument 0 .*got str"):
        launch("x", 1.0, 4)
    with pytest.raises(TypeError, match="argument 1 .*exactly the param"):
        launch(d, np.float64(1.0), 4)
    with pytest.raises(TypeError, match="argument 0 .*Python float"):
        fill[1, 1](1.0, 1.0, 4)
    with pytest.raises(TypeError, match="argument 1 .*pointer parameter"):
        fill[1, 1](d, CAI(1, np.float32), 4)
    with pytest.raises(OverflowError, match="argument 2"):
        launch(d, 1.0, 2 ** 32)
    with pytest.raises(TypeError, match="argument 1 .*pointer parameter"):
        launch(d, d, 4)


def test_bad_cai(fill):
    class NoData:
        __cuda_array_interface__ = {"shape": (1,), "version": 3}

    class NotDict:
        __cuda_array_interface__ = 5

    with pytest.raises(TypeError, match="has no 'data'"):
        fill[1, 1](NoData(), 1.0, 1)
    with pytest.raises(TypeError, match="not a dict"):
        fill[1, 1](NotDict(), 1.0, 1)


def test_scalar_packing_accepts_every_type_before_launch(nvrtc, cache_dir,
                                                          simulator, ctx):
    k = cudamem.compile(SCALARS).scalars
    d = CAI(4, np.float32)
    pair = np.zeros((), dtype=[("a", "f8"), ("b", "i1"), ("pad", "V7")])
    args_np = (np.int8(-1), np.int16(2), np.int32(3), np.int64(4),
               np.float32(5), np.float64(6), np.float16(7), np.bool_(True),
               d, pair[()], np.uint8(255))
    # __half is an aggregate to the driver: only a NumPy float16 fills it.
    args_py = (-1, 2, 3, 4, 5.0, 6.0, np.float16(7), True, d, pair[()],
               255)
    with pytest.raises(TypeError, match="argument 6 .*Python float"):
        k[1, 1](*args_py[:6], 7.0, *args_py[7:])
    for args in (args_np, args_py):
        if simulator:
            with pytest.raises(CudaSupportError, match="kernels need a GPU"):
                k[1, 1](*args)
        else:
            k[1, 1](*args)
    if not simulator:
        cudamem.synchronize()


def test_memalloc_owner_as_pointer(fill, ctx, simulator):
    mem = ctx.memalloc(16)
    if simulator:
        with pytest.raises(CudaSupportError):
            fill[1, 4](mem, 2.0, 4)
    else:
        fill[1, 4](mem, 2.0, 4)
        cudamem.synchronize()


def test_cudamem_device_arrays_as_arguments(fill, simulator):
    if not hasattr(cudamem, "device_array"):
        pytest.skip("cudamem has no device arrays on this branch")
    d = cudamem.device_array(8, np.float32)
    views = [d, d[2:], d[::2]]
    if hasattr(cudamem, "mapped_array"):
        views.append(cudamem.mapped_array(8, np.float32))
    for v in views:
        if simulator:
            with pytest.raises(CudaSupportError):
                fill[1, 8](v, 1.5, v.size)
        else:
            fill[1, 8](v, 1.5, v.size)
    if not simulator:
        cudamem.synchronize()
        assert np.all(d.copy_to_host() == 1.5)


@pytest.mark.sim
def test_simulator_launch_raises_support_error(fill, ctx):
    d = CAI(4, np.float32)
    with pytest.raises(CudaSupportError, match="kernels need a GPU"):
        fill[1, 32](d, 1.0, 4)
    with pytest.raises(CudaSupportError, match="kernels need a GPU"):
        _ = fill.attributes
    mod = cudamem.compile("__device__ int g;")
    with pytest.raises(CudaSupportError, match="kernels need a GPU"):
        mod.get_global("g")


def test_refcounts_on_launch_errors(fill):
    d = CAI(4, np.float32)
    before = sys.getrefcount(d)
    for _ in range(100):
        with pytest.raises(TypeError):
            fill[1, 1](d, 1.0)
        try:
            fill[1, 1](d, 1.0, 4)
        except CudaSupportError:
            pass
    assert sys.getrefcount(d) == before


def test_module_outlives_python_reference(fill):
    mod = fill.module
    del mod
    assert fill.module.get_function("fill<float>") is fill


# ---------------------------------------------------------------------------
# on the GPU


@pytest.mark.gpu
def test_launch_fill(fill, ctx):
    n = 1000
    d = CAI(n, np.float32)
    fill[(n + 255) // 256, 256](d, 2.5, n)
    assert np.all(d.copy_to_host() == 2.5)


@pytest.mark.gpu
@pytest.mark.parametrize("ctype, dtype, value", [
    ("signed char", np.int8, -5), ("unsigned char", np.uint8, 250),
    ("short", np.int16, -300), ("unsigned short", np.uint16, 65000),
    ("int", np.int32, -70000), ("unsigned int", np.uint32, 4000000000),
    ("long long", np.int64, -(2 ** 40)),
    ("unsigned long long", np.uint64, 2 ** 63 + 5),
    ("float", np.float32, 1.5), ("double", np.float64, -2.25),
    ("__half", np.float16, 0.5), ("bool", np.bool_, True),
])
def test_scalar_packing_values(nvrtc, cache_dir, ctype, dtype, value):
    src = ("#include <cuda_fp16.h>\n"
           'extern "C" __global__ void k(%s *out, %s a, int tail)\n'
           "{ out[0] = a; out[1] = (%s)tail; }" % (ctype, ctype, ctype))
    k = cudamem.compile(src).k
    for arg in (dtype(value), value) if dtype != np.float16 else (
            dtype(value),):
        d = CAI(2, dtype)
        k[1, 1](d, arg, 1)
        got = d.copy_to_host()
        assert got[0] == dtype(value), (arg, got)
        assert got[1] == dtype(1)


@pytest.mark.gpu
def test_struct_param(nvrtc, cache_dir):
    src = r"""
    struct pair { double a; int b; };
    extern "C" __global__ void k(double *out, char c, pair p)
    { out[0] = p.a + p.b + c; }
    """
    k = cudamem.compile(src).k
    dt = np.dtype([("a", "f8"), ("b", "i4"), ("pad", "V4")])
    p = np.zeros((), dt)
    p["a"], p["b"] = 1.5, 10
    d = CAI(1, np.float64)
    k[1, 1](d, 3, p[()])
    assert d.copy_to_host()[0] == 14.5


@pytest.mark.gpu
def test_static_shared_and_attributes(nvrtc, cache_dir):
    src = r"""
    extern "C" __global__ void k(float *x)
    {
        __shared__ float s[256];
        s[threadIdx.x] = x[threadIdx.x];
        __syncthreads();
        x[threadIdx.x] = s[255 - threadIdx.x];
    }
    """
    k = cudamem.compile(src).k
    a = k.attributes
    for key in ("num_regs", "shared_size_bytes", "local_size_bytes",
                "const_size_bytes", "max_threads_per_block"):
        assert isinstance(a[key], int)
    assert a["shared_size_bytes"] == 1024
    assert a["max_threads_per_block"] <= 1024
    host = np.arange(256, dtype=np.float32)
    d = CAI.from_host(host)
    k[1, 256](d)
    assert np.array_equal(d.copy_to_host(), host[::-1])


@pytest.mark.gpu
def test_local_memory_spill_visible(nvrtc, cache_dir):
    src = r"""
    extern "C" __global__ void k(float *x, int j)
    {
        float scratch[512];
        for (int i = 0; i < 512; i++) scratch[i] = x[i];
        x[0] = scratch[j];
    }
    """
    k = cudamem.compile(src).k
    assert k.attributes["local_size_bytes"] >= 2048
    host = np.arange(512, dtype=np.float32)
    d = CAI.from_host(host)
    k[1, 1](d, 100)
    assert d.copy_to_host()[0] == 100


@pytest.mark.gpu
@pytest.mark.parametrize("nbytes", [4, 48 * 1024, 100 * 1024, 200 * 1024])
def test_dynamic_shared_memory_opt_in(nvrtc, cache_dir, nbytes):
    src = r"""
    extern "C" __global__ void k(int *out, int n)
    {
        extern __shared__ int s[];
        for (int i = threadIdx.x; i < n; i += blockDim.x) s[i] = i;
        __syncthreads();
        if (threadIdx.x == 0) {
            long long t = 0;
            for (int i = 0; i < n; i++) t += s[i];
            out[0] = (int)(t % 1000003);
        }
    }
    """
    k = cudamem.compile(src).k
    n = nbytes // 4
    d = CAI(1, np.int32)
    k[1, 128, 0, nbytes](d, n)
    assert d.copy_to_host()[0] == (n * (n - 1) // 2) % 1000003
    if nbytes > 48 * 1024:
        assert k.attributes["max_dynamic_shared_size_bytes"] >= nbytes


@pytest.mark.gpu
def test_dynamic_shared_above_device_limit(nvrtc, cache_dir):
    k = cudamem.compile('extern "C" __global__ void k() {}').k
    limit = cudamem.get_current_device().MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
    k[1, 1, 0, limit]()
    cudamem.synchronize()
    with pytest.raises(ValueError, match="exceed the device's limit"):
        k[1, 1, 0, limit + 1]


@pytest.mark.gpu
def test_constants_and_get_global(nvrtc, cache_dir):
    src = r"""
    extern "C" __global__ void k(float *x, int n)
    {
        int i = threadIdx.x;
        if (i < n) x[i] = coefficients[i % 3] + table[1][i % 2];
    }
    __device__ int counter;
    extern "C" __global__ void bump() { atomicAdd(&counter, 1); }
    """
    coeff = np.array([1.0, 2.0, 3.0], np.float32)
    table = np.array([[0, 0], [10, 20]], np.float32)
    mod = cudamem.compile(src, constants={"coefficients": coeff,
                                          "table": table})
    d = CAI(6, np.float32)
    mod.k[1, 32](d, 6)
    i = np.arange(6)
    assert np.array_equal(d.copy_to_host(), coeff[i % 3] + table[1][i % 2])
    assert mod.k.attributes["const_size_bytes"] >= 28

    view = mod.get_global("coefficients", dtype=np.float32)
    assert view.shape == (3,)
    assert np.array_equal(view.copy_to_host(), coeff)
    view.copy_to_device(np.array([5, 6, 7], np.float32))
    mod.k[1, 32](d, 6)
    assert np.array_equal(d.copy_to_host(),
                          np.array([5, 6, 7], np.float32)[i % 3]
                          + table[1][i % 2])
    raw = mod.get_global("table")
    assert raw.shape == (16,) and raw.dtype == np.uint8
    t2 = mod.get_global("table", np.float32, (2, 2))
    assert np.array_equal(t2.copy_to_host(), table)
    with pytest.raises(ValueError, match="needs 32 bytes"):
        mod.get_global("table", np.float64, 4)
    with pytest.raises(ValueError, match="no __constant__ or __device__"):
        mod.get_global("nope")

    counter = mod.get_global("counter", np.int32)
    counter.copy_to_device(np.zeros(1, np.int32))
    mod.bump[4, 64]()
    assert counter.copy_to_host()[0] == 256


@pytest.mark.gpu
def test_streams(nvrtc, cache_dir, fill):
    n = 64
    d = CAI(n, np.float32)
    fill[1, n, 0](d, 1.0, n)
    fill[1, n, 0, 0](d, 3.0, n)
    assert np.all(d.copy_to_host() == 3.0)


@pytest.mark.gpu
def test_many_args_and_big_block(nvrtc, cache_dir):
    n = 80
    params = ", ".join("int a%d" % i for i in range(n))
    body = " + ".join("a%d" % i for i in range(n))
    src = ('struct big { char b[5000]; };\n'
           'extern "C" __global__ void k(long long *out, big g, %s)\n'
           '{ out[0] = (long long)g.b[4999] + %s; }' % (params, body))
    k = cudamem.compile(src).k
    big = np.zeros((), dtype=[("b", "i1", 5000)])
    big["b"][4999] = 7
    d = CAI(1, np.int64)
    k[1, 1](d, big[()], *range(n))
    assert d.copy_to_host()[0] == 7 + sum(range(n))


# ---------------------------------------------------------------------------
# interoperability


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:.*Grid size")
def test_numba_kernel_on_cudamem_memory(ctx):
    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack
    ncuda = pytest.importorskip("numba.cuda")

    @ncuda.jit
    def add_one(x):
        i = ncuda.grid(1)
        if i < x.size:
            x[i] += 1

    host = np.arange(100, dtype=np.float32)
    d = CAI.from_host(host)
    add_one[1, 128](d)
    ncuda.synchronize()
    assert np.array_equal(d.copy_to_host(), host + 1)


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:.*Grid size")
def test_numba_kernel_takes_a_cudamem_array_directly(ctx):
    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack
    ncuda = pytest.importorskip("numba.cuda")

    @ncuda.jit
    def twice(x):
        i = ncuda.grid(1)
        if i < x.size:
            x[i] *= 2

    host = np.arange(64, dtype=np.float64)
    d = cudamem.to_device(host)
    twice[1, 64](d)  # no as_cuda_array: the CAI is enough
    ncuda.synchronize()
    assert np.array_equal(d.copy_to_host(), host * 2)


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:.*Grid size")
def test_cudamem_kernel_on_numba_array(nvrtc, cache_dir, fill):
    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack
    ncuda = pytest.importorskip("numba.cuda")
    a = ncuda.device_array(50, np.float32)
    fill[1, 64](a, 4.0, 50)
    cudamem.synchronize()
    assert np.all(a.copy_to_host() == 4.0)


@pytest.mark.gpu
def test_cupy_rawkernel_on_cudamem_memory(ctx, fill):
    cp = pytest.importorskip("cupy")
    k = cp.RawKernel(r"""
    extern "C" __global__ void twice(float *x, int n)
    {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) x[i] *= 2;
    }""", "twice")
    host = np.arange(64, dtype=np.float32)
    d = CAI.from_host(host)
    arr = cp.asarray(d)
    k((1,), (64,), (arr, np.int32(64)))
    cp.cuda.runtime.deviceSynchronize()
    assert np.array_equal(d.copy_to_host(), host * 2)
    # and the other way round: a cudamem kernel on a CuPy array
    c = cp.zeros(64, dtype=cp.float32)
    fill[1, 64](c, 9.0, 64)
    cudamem.synchronize()
    assert np.all(cp.asnumpy(c) == 9.0)


@pytest.mark.gpu
def test_torch_on_cudamem_memory(ctx, fill):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no GPU")
    host = np.arange(32, dtype=np.float32)
    d = CAI.from_host(host)
    t = torch.as_tensor(d, device="cuda")
    t.mul_(3)
    torch.cuda.synchronize()
    assert np.array_equal(d.copy_to_host(), host * 3)
    # a cudamem kernel on a torch tensor
    u = torch.zeros(32, device="cuda")
    fill[1, 32](u, 5.0, 32)
    cudamem.synchronize()
    assert torch.all(u == 5).item()


# ---------------------------------------------------------------------------
# examples


def _run_example(name):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, str(EXAMPLES / name)], env=env,
                       cwd=str(EXAMPLES), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["shared_neighbour.py", "local_scratch.py",
                                  "constant_memory.py", "matmul_shared.py"])
def test_example_runs(name):
    out = _run_example(name)
    assert out.rstrip().endswith("OK"), out


@pytest.mark.gpu
def test_example_dynamic_shared_output():
    lines = _run_example("dynamic_shared.py").splitlines()
    assert lines[:2] == ["3.140000 1078523331", "3.140000 1"], lines
