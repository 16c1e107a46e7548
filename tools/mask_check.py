# SPDX-License-Identifier: MIT
"""The device mask's kernels on a few masks, checked against NumPy: a
short program to run under compute-sanitizer (memcheck, racecheck) on a
GPU, where the suite would take too long.

    compute-sanitizer --tool racecheck python tools/mask_check.py
"""
import numpy as np

import cudamem as cuda
from cudamem import _core


def main():
    rng = np.random.default_rng(3)
    stream = _core.default_stream()
    cases = []
    for n in (17, 4096, 3 * 4096 + 5, 300 * 4096 + 7):
        h = rng.random(n) < 0.5
        cases.append((h, cuda.to_device(h), (4,)))
    base = rng.random(20_000) < 0.5
    cases.append((base[3:], cuda.to_device(base)[3:], (4,)))
    m2 = rng.random((200, 70)) < 0.4
    cases.append((m2, cuda.to_device(m2), (80 * 8, 8)))
    for h, d, ast in cases:
        got = _core._ix_mask(d, ast, stream).copy_to_host()
        nz = np.nonzero(h)
        want = np.zeros(len(nz[0]), np.int64)
        for ix, st in zip(nz, ast, strict=True):
            want += ix.astype(np.int64) * st
        np.testing.assert_array_equal(got, want)
    print("mask_check: %d masks ok" % len(cases))


if __name__ == "__main__":
    main()
