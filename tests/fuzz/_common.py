# SPDX-License-Identifier: MIT
"""What every fuzz harness shares: the environment it runs in, the
exceptions that count as a clean refusal, and the input decoder.

A harness is a script run by ``tests/fuzz/run.py`` (or by hand:
``CUDAMEM_SIMULATOR=1 python3 tests/fuzz/fuzz_x.py corpus_dir``).  Each
input is decoded with ``atheris.FuzzedDataProvider`` into arguments for
one of cudamem's parsers of outside data; the call must either work (and
then agree with NumPy wherever NumPy defines the answer) or raise one of
the harness's expected exceptions.  Anything else -- another exception,
a wrong answer, a crash, a hang -- is a finding: the exception
propagates to libFuzzer, which saves the input.
"""

import os
import sys

# The simulator, with a small memory so that a fuzzed size runs out of
# device memory quickly instead of filling the machine's RAM.
os.environ.setdefault("CUDAMEM_SIMULATOR", "1")
os.environ.setdefault("CUDAMEM_SIM_MEMORY", str(256 << 20))

import atheris  # noqa: E402

with atheris.instrument_imports(include=["cudamem"]):
    import cudamem as cuda  # noqa: E402,F401

import numpy as np  # noqa: E402

# Where the runner asks each harness to write the input it is about to
# run: a crash that libFuzzer cannot catch (a fault in a thread whose
# signals are blocked, a kill) still leaves the input behind.
_LAST = os.environ.get("CUDAMEM_FUZZ_LAST_INPUT")

# Host allocations (pinned, mapped, managed on the simulator) are real
# memory: a harness skips sizes above this instead of touching gigabytes.
HOST_LIMIT = 64 << 20

# A clean refusal of bad input.  CudaOutOfMemoryError is a MemoryError.
# Harnesses that call the driver on fuzzed pointers also accept
# CudaAPIError (see each harness).
CLEAN = (TypeError, ValueError, IndexError, OverflowError, BufferError,
         NotImplementedError, MemoryError)


# Inputs that hit a bug already filed (issue 17's list) fail the run like
# any other finding, so that CI shows them until they are fixed; with
# CUDAMEM_FUZZ_SKIP_KNOWN=1 a harness steps around them instead, to look
# for new ones.
SKIP_KNOWN = os.environ.get("CUDAMEM_FUZZ_SKIP_KNOWN", "") not in ("", "0")


def known(condition):
    """Whether to step around this input: ``condition`` says it hits a
    filed bug, and the run was asked to skip those."""
    return SKIP_KNOWN and bool(condition)


def record(data):
    """Save the input about to run where the runner can find it."""
    if _LAST:
        with open(_LAST, "wb") as f:
            f.write(data)


def main(test_one_input):
    """The libFuzzer entry point of a harness: ``main(TestOneInput)``."""

    def wrapped(data):
        record(data)
        test_one_input(data)

    # Coverage of Python code is the fuzzer's guide: the harness's own
    # branches (which decode the input), cudamem's Python layer and
    # NumPy's (which the oracles run).  The C of cudamem._core is not
    # instrumented.
    atheris.instrument_all()
    atheris.Setup(sys.argv, wrapped)
    atheris.Fuzz()


def span(shape, strides, itemsize):
    """(lo, hi) byte offsets read by a layout, or None when empty."""
    if 0 in shape:
        return None
    lo = sum((n - 1) * s for n, s in zip(shape, strides, strict=True) if s < 0)
    hi = sum((n - 1) * s for n, s in zip(shape, strides, strict=True) if s > 0)
    return lo, hi + itemsize


def overlaps(shape, strides, itemsize):
    """Whether two elements share a byte: a write's result then depends
    on the order of the element writes, which nothing defines."""
    offs = np.zeros(1, dtype=np.int64)
    for n, st in zip(shape, strides, strict=True):
        offs = (offs[:, None] + np.arange(n) * st).ravel()
    offs.sort()
    return bool((np.diff(offs) < itemsize).any())


def pick(fdp, seq):
    return seq[fdp.ConsumeIntInRange(0, len(seq) - 1)]


# A mix of edge integers that a plain ConsumeInt rarely produces.
EDGE_INTS = (0, 1, 2, 3, -1, -2, 7, 8, 16, 255, 256, 2**31 - 1, 2**31,
             2**32, 2**62, 2**63 - 1, 2**63, 2**64, -(2**63), -(2**31))


def small_int(fdp, lo=-4, hi=12):
    """Mostly small ints, sometimes an edge value."""
    if fdp.ConsumeIntInRange(0, 7) == 0:
        return pick(fdp, EDGE_INTS)
    return fdp.ConsumeIntInRange(lo, hi)


DTYPES = ("f8", "f4", "f2", "i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8",
          "c8", "c16", "?", "V0", "V1", "V3", "V16", "S0", "S3", "U2",
          "M8[ns]", "m8[s]", "O", "f16", "<f8", ">i4", "i4,f8",
          [("a", "u1"), ("b", ">f4")], "(2,3)f4", "float64", "int",
          "bogus", "", None, np.float32, object, 3, 1.5)


def any_dtype(fdp):
    return pick(fdp, DTYPES)
