# SPDX-License-Identifier: MIT
"""Values for the array tests: the dtypes they sweep, deterministic
sample data of each, a stand-in stream object, and a waited-for
copy_to_host."""

import numpy as np

import cudamem as cuda

REC = np.dtype([("a", "i4"), ("b", "f8", (2,)),
                ("c", [("x", "u1"), ("y", "i2")])])

DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32,
          np.uint32, np.int64, np.uint64, np.float16, np.float32,
          np.float64, np.complex64, np.complex128, "M8[D]", "m8[s]", REC]


def sample(shape, dtype):
    """Deterministic values of any dtype in DTYPES."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape))
    raw = np.arange(1, n * dtype.itemsize + 1, dtype=np.uint64) * 37
    return (raw.astype(np.uint8)[: n * dtype.itemsize]
            .view(dtype)[:n].reshape(shape).copy()
            if dtype != np.bool_ else (np.arange(n) % 3 == 0).reshape(shape))


class Stream:
    """A stand-in stream object (cuda.core protocol) on a given handle."""

    def __init__(self, handle=0):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


def host(d):
    """d.copy_to_host(), waited for: with a bound stream the copy is
    asynchronous even without a stream argument (numba's rule)."""
    out = d.copy_to_host()
    cuda.synchronize()
    return out
