# SPDX-License-Identifier: MIT
"""Constant memory: coefficients fixed at compile time
(``constants={"coefficients": array}``, numba's const.array_like), then
changed between launches through ``Module.get_global``."""

from typing import Any

import numpy as np
from _support import copy_to_host, numba_cuda, to_device

import cudamem as cuda

SOURCE = r"""
extern "C" __global__ void scale(float *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        x[i] = x[i] * coefficients[i % 3];
    }
}
"""

coefficients = np.array([1.0, 2.0, 3.0], dtype=np.float32)


def main() -> None:
    n = 10
    host = np.ones(n, dtype=np.float32)
    expected = host * coefficients[np.arange(n) % 3]

    mod = cuda.compile(SOURCE, constants={"coefficients": coefficients})
    d = to_device(host)
    mod.scale[1, 32](d, n)
    got = copy_to_host(d)
    assert np.array_equal(got, expected), got
    print("cudamem:", got)

    view = mod.get_global("coefficients", dtype=np.float32)
    view.copy_to_device(np.array([10.0, 20.0, 30.0], dtype=np.float32))
    d = to_device(host)
    mod.scale[1, 32](d, n)
    got2 = copy_to_host(d)
    assert np.array_equal(got2, 10 * expected), got2
    print("after get_global(...).copy_to_device:", got2)

    ncuda = numba_cuda()
    if ncuda is not None:
        @ncuda.jit
        def nb_kernel(x: Any) -> None:
            i = ncuda.grid(1)
            if i < x.size:
                x[i] = x[i] * ncuda.const.array_like(coefficients)[i % 3]

        d2 = to_device(host)
        nb_kernel[1, 32](ncuda.as_cuda_array(d2))
        ncuda.synchronize()
        assert np.array_equal(copy_to_host(d2), got)
        print("numba-cuda on cudamem memory: same result")
    print("OK")


if __name__ == "__main__":
    main()
