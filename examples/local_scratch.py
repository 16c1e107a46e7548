# SPDX-License-Identifier: MIT
"""Local memory: a per-thread scratch array.  Each thread copies a row of
eight values into its own local array, reverses it there and writes the
reversed row back."""

from typing import Any

import numpy as np
from _support import copy_to_host, numba_cuda, to_device

import cudamem as cuda

SOURCE = r"""
extern "C" __global__ void reverse_rows(float *x, int rows)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    float scratch[8];
    if (r >= rows) {
        return;
    }
    for (int j = 0; j < 8; j++) {
        scratch[j] = x[r * 8 + j];
    }
    for (int j = 0; j < 8; j++) {
        x[r * 8 + j] = scratch[7 - j];
    }
}
"""


def main() -> None:
    rows = 100
    host = np.arange(rows * 8, dtype=np.float32).reshape(rows, 8)
    expected = host[:, ::-1]

    mod = cuda.compile(SOURCE)
    kernel = mod.reverse_rows
    d = to_device(host)
    kernel[(rows + 63) // 64, 64](d, rows)
    got = copy_to_host(d)
    assert np.array_equal(got, expected), got
    print("cudamem: row 0 ->", got[0])
    print("local bytes per thread:", kernel.attributes["local_size_bytes"])

    ncuda = numba_cuda()
    if ncuda is not None:
        @ncuda.jit
        def nb_kernel(x: Any) -> None:
            r = ncuda.grid(1)
            scratch = ncuda.local.array(8, dtype=np.float32)
            if r < x.shape[0]:
                for j in range(8):
                    scratch[j] = x[r, j]
                for j in range(8):
                    x[r, j] = scratch[7 - j]

        d2 = to_device(host)
        nb_kernel[(rows + 63) // 64, 64](ncuda.as_cuda_array(d2))
        ncuda.synchronize()
        assert np.array_equal(copy_to_host(d2), got)
        print("numba-cuda on cudamem memory: same result")
    print("OK")


if __name__ == "__main__":
    main()
