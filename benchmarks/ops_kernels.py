# SPDX-License-Identifier: MIT
"""Kernel launch latency: an empty kernel with 0, 1 and 4 array arguments,
launched and synchronised."""

import numpy as np

from harness import Skip

SOURCE = r"""
extern "C" __global__ void empty0() {}
extern "C" __global__ void empty1(float *a) {}
extern "C" __global__ void empty4(float *a, float *b, float *c, float *d) {}
"""


def _cudamem(nargs):
    def factory(cm):
        if cm._core._backend() != "driver":
            raise Skip("kernels need a GPU")
        k = getattr(cm.compile(SOURCE), "empty%d" % nargs)
        if hasattr(cm, "device_array"):
            arrs = [cm.device_array(256, np.float32) for _ in range(nargs)]
        else:
            arrs = [cm.current_context().memalloc(1024)
                    for _ in range(nargs)]
        sync = cm.synchronize

        def run():
            k[1, 1](*arrs)
            sync()
        run.keep = arrs
        return run
    return factory


def _numba(nargs):
    def factory(cuda):
        if nargs == 0:
            @cuda.jit
            def k():
                pass
        elif nargs == 1:
            @cuda.jit
            def k(a):
                pass
        else:
            @cuda.jit
            def k(a, b, c, d):
                pass
        arrs = [cuda.device_array(256, np.float32) for _ in range(nargs)]
        launch = k[1, 1]
        sync = cuda.synchronize

        def run():
            launch(*arrs)
            sync()
        return run
    return factory


def _cupy(nargs):
    def factory(cp):
        k = cp.RawModule(code=SOURCE).get_function("empty%d" % nargs)
        arrs = tuple(cp.empty(256, cp.float32) for _ in range(nargs))
        sync = cp.cuda.Device().synchronize

        def run():
            k((1,), (1,), arrs)
            sync()
        return run
    return factory


OPS = [
    {"name": "launch empty kernel, %d arrays" % n,
     "impls": {"cudamem": _cudamem(n), "numba": _numba(n),
               "cupy": _cupy(n)}}
    for n in (0, 1, 4)
]
