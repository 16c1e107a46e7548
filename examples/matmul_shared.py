# SPDX-License-Identifier: MIT
"""A tiled matrix multiply through shared memory, checked against NumPy:
each block stages one TPB x TPB tile of A and of B in shared memory,
synchronises, accumulates, and synchronises again before the next tile."""

from typing import Any

import numpy as np
from _support import copy_to_host, device_array, numba_cuda, to_device

import cudamem as cuda

TPB = 16

SOURCE = r"""
#define TPB 16
extern "C" __global__ void matmul(const float *A, const float *B, float *C,
                                  int n)
{
    __shared__ float sA[TPB][TPB];
    __shared__ float sB[TPB][TPB];
    int tx = threadIdx.x;
    int ty = threadIdx.y;
    int row = blockIdx.y * TPB + ty;
    int col = blockIdx.x * TPB + tx;
    float acc = 0.0f;
    for (int t = 0; t < (n + TPB - 1) / TPB; t++) {
        int ac = t * TPB + tx;
        int br = t * TPB + ty;
        sA[ty][tx] = (row < n && ac < n) ? A[row * n + ac] : 0.0f;
        sB[ty][tx] = (br < n && col < n) ? B[br * n + col] : 0.0f;
        __syncthreads();
        for (int k = 0; k < TPB; k++) {
            acc += sA[ty][k] * sB[k][tx];
        }
        __syncthreads();
    }
    if (row < n && col < n) {
        C[row * n + col] = acc;
    }
}
"""


def main() -> None:
    n = 100
    rng = np.random.default_rng(0)
    a = rng.random((n, n), dtype=np.float32)
    b = rng.random((n, n), dtype=np.float32)
    expected = a @ b

    kernel = cuda.compile(SOURCE).matmul
    blocks = ((n + TPB - 1) // TPB, (n + TPB - 1) // TPB)
    da, db = to_device(a), to_device(b)
    dc = device_array((n, n), np.float32)
    kernel[blocks, (TPB, TPB)](da, db, dc, n)
    got = copy_to_host(dc)
    err = np.abs(got - expected).max()
    assert np.allclose(got, expected, rtol=1e-4), err
    print("cudamem: max abs error vs NumPy %.2e" % err)

    ncuda = numba_cuda()
    if ncuda is not None:
        from numba import float32

        @ncuda.jit
        def fast_matmul(A: Any, B: Any, C: Any) -> None:
            sA = ncuda.shared.array(shape=(TPB, TPB), dtype=float32)
            sB = ncuda.shared.array(shape=(TPB, TPB), dtype=float32)
            x, y = ncuda.grid(2)
            tx = ncuda.threadIdx.x
            ty = ncuda.threadIdx.y
            tmp = float32(0.0)
            for i in range((A.shape[1] + TPB - 1) // TPB):
                sA[ty, tx] = 0
                sB[ty, tx] = 0
                if y < A.shape[0] and (tx + i * TPB) < A.shape[1]:
                    sA[ty, tx] = A[y, tx + i * TPB]
                if x < B.shape[1] and (ty + i * TPB) < B.shape[0]:
                    sB[ty, tx] = B[ty + i * TPB, x]
                ncuda.syncthreads()
                for j in range(TPB):
                    tmp += sA[ty, j] * sB[j, tx]
                ncuda.syncthreads()
            if y < C.shape[0] and x < C.shape[1]:
                C[y, x] = tmp

        dc2 = device_array((n, n), np.float32)
        fast_matmul[blocks, (TPB, TPB)](
            *(ncuda.as_cuda_array(x) for x in (da, db, dc2)))
        ncuda.synchronize()
        assert np.allclose(copy_to_host(dc2), got, rtol=1e-5)
        print("numba-cuda on cudamem memory: same result")
    print("OK")


if __name__ == "__main__":
    main()
