# SPDX-License-Identifier: MIT
"""Shared memory and __syncthreads(): each thread of a 32-thread block
writes one element of a 32-element shared array, waits for the others,
then reads its neighbour's element."""

from typing import Any

import numpy as np
from _support import copy_to_host, numba_cuda, to_device

import cudamem as cuda

SOURCE = r"""
extern "C" __global__ void neighbour(float *x)
{
    __shared__ float sdata[32];
    unsigned int tid = threadIdx.x;
    sdata[tid] = x[tid];
    __syncthreads();
    x[tid] = sdata[(tid + 1) % 32];
}
"""


def main() -> None:
    host = np.arange(32, dtype=np.float32)
    expected = np.roll(host, -1)

    kernel = cuda.compile(SOURCE).neighbour
    d = to_device(host)
    kernel[1, 32](d)
    got = copy_to_host(d)
    assert np.array_equal(got, expected), got
    print("cudamem:", got[:4], "...", got[-2:])

    ncuda = numba_cuda()
    if ncuda is not None:
        @ncuda.jit
        def nb_kernel(x: Any) -> None:
            sdata = ncuda.shared.array(32, dtype=np.float32)
            tid = ncuda.threadIdx.x
            sdata[tid] = x[tid]
            ncuda.syncthreads()
            x[tid] = sdata[(tid + 1) % 32]

        d2 = to_device(host)
        nb_kernel[1, 32](ncuda.as_cuda_array(d2))
        ncuda.synchronize()
        assert np.array_equal(copy_to_host(d2), got)
        print("numba-cuda on cudamem memory: same result")
    print("OK")


if __name__ == "__main__":
    main()
