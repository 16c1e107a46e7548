# SPDX-License-Identifier: MIT
"""Pageable host<->device bandwidth: plain NumPy arrays (not pinned) at
64 and 256 KiB, 1, 16, 64, 256 MiB and 1 GiB, side by side.

cudamem copies large pageable arrays through its staging pipeline
(csrc/memory/staging/staging.c); the rows marked "staging off" switch it off at
run time
(``_core._staging_config(enabled=False)``) so the two paths are compared
in one run.  The peers (numba-cuda, CuPy, PyTorch) and the bare driver
(bare_driver.c's copy loop in C: one cuMemcpyHtoD / DtoH a copy) all
take the driver's pageable path.  Every copy is synchronous.

Rows with a "bytes" key are reported as GB/s.  The pipeline's tunables
come from the environment (CUDAMEM_STAGING_THREADS, _CHUNK, _BUFFERS,
_THRESHOLD) as usual; a sweep over them is one run per setting.  Below
the threshold (4 MiB by default) both of cudamem's rows are the direct
copy, made as ``_core._sync_copy_call`` says (CUDAMEM_SYNC_COPY_CALL);
an A/B of either setting with the same tree twice:

    AB_ENV_B="CUDAMEM_STAGING_THRESHOLD=256K" \\
    AB_ROWS="--modules ops_staging -k pageable" bash tools/ab_bench.sh . .
"""

import numpy as np

import bare_driver

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
SIZES = (64 * KiB, 256 * KiB, MiB, 16 * MiB, 64 * MiB, 256 * MiB, GiB)


def _host(size):
    """A pageable array, touched so that its pages exist."""
    h = np.empty(size, np.uint8)
    h[:] = 1
    return h


def _cudamem(size, h2d, staging):
    def factory(cm):
        cm._core._staging_config(enabled=staging)
        host = _host(size)
        dev = cm.device_array(size, np.uint8)
        if h2d:
            return lambda: dev.copy_to_device(host)
        return lambda: dev.copy_to_host(host)
    return factory


def _numba(size, h2d):
    def factory(cuda):
        host = _host(size)
        dev = cuda.device_array(size, np.uint8)
        if h2d:
            return lambda: dev.copy_to_device(host)
        return lambda: dev.copy_to_host(host)
    return factory


def _cupy(size, h2d):
    def factory(cp):
        host = _host(size)
        dev = cp.empty(size, np.uint8)
        if h2d:
            def fn():
                dev.set(host)
                cp.cuda.runtime.deviceSynchronize()
            return fn
        return lambda: dev.get(out=host)
    return factory


def _torch(size, h2d):
    def factory(torch):
        host = torch.from_numpy(_host(size))
        dev = torch.empty(size, dtype=torch.uint8, device="cuda")
        if h2d:
            return lambda: dev.copy_(host)
        return lambda: host.copy_(dev)
    return factory


# bare_driver.c's copy loop in C: one cuMemcpyHtoD / cuMemcpyDtoH of a
# malloc'd, touched buffer a copy, no Python in the way.
C_SAMPLES = 31
C_MS = 2


def _driver(size, h2d):
    def factory(core):
        return bare_driver.run("copy", "htod" if h2d else "dtoh", "sync",
                               size, C_SAMPLES, C_MS)
    return factory


def _size_name(n):
    return "%d GiB" % (n // GiB) if n >= GiB else (
        "%d MiB" % (n // MiB) if n >= MiB else "%d KiB" % (n // KiB))


OPS = []
for _size in SIZES:
    for _h2d in (True, False):
        _dir = "HtoD" if _h2d else "DtoH"
        OPS.append({
            "name": "%s pageable %s" % (_dir, _size_name(_size)),
            "bytes": _size,
            "impls": {"cudamem": _cudamem(_size, _h2d, True),
                      "numba": _numba(_size, _h2d),
                      "cupy": _cupy(_size, _h2d),
                      "torch": _torch(_size, _h2d),
                      "driver": _driver(_size, _h2d)},
        })
        OPS.append({
            "name": "%s pageable %s staging off" % (_dir,
                                                    _size_name(_size)),
            "bytes": _size,
            "impls": {"cudamem": _cudamem(_size, _h2d, False),
                      "driver": _driver(_size, _h2d)},
        })
