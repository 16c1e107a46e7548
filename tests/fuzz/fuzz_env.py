# SPDX-License-Identifier: MIT
"""Fuzz the environment tunables: a child process imports cudamem with
fuzzed ``CUDAMEM_*`` variables (and their NUMBA_* spellings) and does a
little work -- a transfer through the staging path, a pinned array, a
stream, a pool allocation, deferred frees.

Each input is a process, so this harness runs slowly (a few executions a
second).  A child must exit 0 (the value works) or exit with a Python
exception of an expected type -- ValueError / TypeError /
OverflowError (better: naming the variable), RuntimeError (numba's
"Failed to use memory manager from ..."),
CudaSupportError (a disabled or missing driver), MemoryError,
CudaAPIError for an allocator limit -- within the time limit.  A signal,
another exception, or a hang (over 10 s) is a finding.
"""

import os
import subprocess
import sys

from _common import known, main, pick

VARS = ("CUDAMEM_STAGING", "CUDAMEM_STAGING_CHUNK", "CUDAMEM_STAGING_THREADS",
        "CUDAMEM_STAGING_THRESHOLD", "CUDAMEM_STAGING_BUFFERS",
        "CUDAMEM_STAGING_SPIN", "CUDAMEM_STAGING_RAMP", "CUDAMEM_STAGING_NT",
        "CUDAMEM_STAGING_HUGE", "CUDAMEM_PINNED_POOL", "CUDAMEM_POOL_LIMIT",
        "CUDAMEM_ASYNC_RELEASE_THRESHOLD", "CUDAMEM_MEMORY_MANAGER",
        "CUDAMEM_MAX_PENDING_DEALLOCS_COUNT",
        "CUDAMEM_MAX_PENDING_DEALLOCS_RATIO", "CUDAMEM_ARRAY_INTERFACE_SYNC",
        "CUDAMEM_PER_THREAD_DEFAULT_STREAM", "CUDAMEM_STREAM_CACHE_SIZE",
        "CUDAMEM_WARN_ON_IMPLICIT_COPY", "CUDAMEM_SIM_DEVICES",
        "CUDAMEM_SIM_MEMORY", "CUDAMEM_SIM_NO_PEER", "CUDAMEM_SIM_DELAY_US",
        "NUMBA_CUDA_MEMORY_MANAGER", "NUMBA_CUDA_MAX_PENDING_DEALLOCS_COUNT",
        "CUDAMEM_DEVICE_MEMORY_LIMIT")

VALUES = ("0", "1", "2", "-1", "", " ", "3.5", "1e3", "0x10", "abc", "4k",
          "64M", "1G", "9" * 30, "-0", "18446744073709551616", "nan", "inf",
          "default", "async", "pool", "host", "none", "all", "0-1", "1-0",
          "on", "off", "true", "False", "1 2", "\t7", "7\n", "+5",
          "9223372036854775807", "4096", "65536", "0.5", "1.5", "-2")

CHILD = r"""
import sys
import numpy as np
try:
    import cudamem as cuda
    a = np.arange(300000, dtype=np.float64)
    d = cuda.to_device(a)
    assert (d.copy_to_host() == a).all()
    p = cuda.pinned_array(1000)
    s = cuda.stream()
    d2 = cuda.device_array(1000, stream=s)
    d2.copy_to_device(p, stream=s)
    s.synchronize()
    for _ in range(20):
        cuda.device_array(100)
    cuda.synchronize()
except Exception as e:
    ok = ("ValueError", "TypeError", "OverflowError", "MemoryError",
          "RuntimeError",
          "CudaSupportError", "CudaAPIError", "CudaOutOfMemoryError")
    if type(e).__name__ not in ok:
        raise
    print("refused:", type(e).__name__, e, file=sys.stderr)
    sys.exit(3)
"""

EXPECTED_RC = (0, 3)
TIMEOUT = 10


def TestOneInput(data):
    import atheris

    fdp = atheris.FuzzedDataProvider(data)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CUDAMEM_", "NUMBA_"))}
    env["CUDAMEM_SIMULATOR"] = "1"
    for _ in range(fdp.ConsumeIntInRange(1, 3)):
        name = pick(fdp, VARS)
        if fdp.ConsumeIntInRange(0, 4) == 0:
            value = fdp.ConsumeUnicodeNoSurrogates(12).replace("\0", "")
        else:
            value = pick(fdp, VALUES)
        env[name] = value
    if env.get("CUDAMEM_SIM_DELAY_US", "0").strip() not in ("0", ""):
        env["CUDAMEM_SIM_DELAY_US"] = "0"  # a real delay, by design
    if known(env.get("CUDAMEM_STAGING_CHUNK", "x").strip() in
             ("0", "1", "-0", "+0", "0.5")):
        return  # issue 17 item 5: a tiny staging chunk crawls
    try:
        r = subprocess.run([sys.executable, "-c", CHILD], env=env,
                           capture_output=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        raise AssertionError("hang (over %d s) with %r" % (
            TIMEOUT, {k: v for k, v in env.items()
                      if k.startswith(("CUDAMEM_", "NUMBA_"))})) from None
    if r.returncode not in EXPECTED_RC:
        raise AssertionError("child exited %d with %r:\n%s" % (
            r.returncode, {k: v for k, v in env.items()
                           if k.startswith(("CUDAMEM_", "NUMBA_"))},
            r.stderr.decode(errors="replace")[-2000:]))


if __name__ == "__main__":
    main(TestOneInput)
