# SPDX-License-Identifier: MIT
"""Dynamic shared memory, sized by the fourth launch parameter.

Every extern __shared__ array starts at the same address, so a float and
an int array alias: writing 3.14 to the float array changes the int one
(prints ``3.140000 1078523331``, the bits of 3.14f).  Disjoint views
(the int array one element further) keep both values (``3.140000 1``)."""

import numpy as np
from _support import numba_cuda

import cudamem as cuda

SOURCE = r"""
extern "C" __global__ void aliased()
{
    extern __shared__ float f32_arr[];
    int *i32_arr = reinterpret_cast<int *>(f32_arr);
    f32_arr[0] = 3.14f;
    printf("%f %d\n", f32_arr[0], i32_arr[0]);
}

extern "C" __global__ void disjoint()
{
    extern __shared__ float f32_arr[];
    int *i32_arr = reinterpret_cast<int *>(f32_arr) + 1;
    f32_arr[0] = 3.14f;
    i32_arr[0] = 1;
    printf("%f %d\n", f32_arr[0], i32_arr[0]);
}
"""


def main() -> None:
    mod = cuda.compile(SOURCE)
    mod.aliased[1, 1, 0, 4]()
    cuda.synchronize()
    mod.disjoint[1, 1, 0, 8]()
    cuda.synchronize()

    ncuda = numba_cuda()
    if ncuda is not None:
        @ncuda.jit
        def f() -> None:
            f32_arr = ncuda.shared.array(0, dtype=np.float32)
            i32_arr = ncuda.shared.array(0, dtype=np.int32)
            f32_arr[0] = 3.14
            print(f32_arr[0])
            print(i32_arr[0])

        f[1, 1, 0, 4]()
        ncuda.synchronize()


if __name__ == "__main__":
    main()
