# SPDX-License-Identifier: MIT
"""Device-to-device bandwidth between devices 0 and 1: ``copy_to_device``
of a device-0 array into a device-1 array, against the bare driver's
``cuMemcpyPeer`` (the ratio that matters) and, where installed, numba,
CuPy and PyTorch.  Peer access is enabled before timing (every library
enables it once), so the copies are direct when the devices are peers.

Every operation is skipped with fewer than 2 devices.  Run alone with
``python benchmarks/ops_multigpu.py``.
"""

import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import harness  # noqa: E402

SIZES = {"1 MiB": 1 << 20, "64 MiB": 64 << 20, "256 MiB": 256 << 20}


def _need_two(count):
    if count < 2:
        raise harness.Skip("needs 2 devices, found %d" % count)


def _cm(n):
    def factory(cm):
        _need_two(len(cm.gpus))
        cm.enable_peer_access(1, 0)
        with cm.gpus[0]:
            src = cm.to_device(np.ones(n, np.uint8))
        with cm.gpus[1]:
            dst = cm.device_array(n, np.uint8)
        # Synchronous: complete when it returns.
        return lambda: dst.copy_to_device(src)
    return factory


def _driver(n):
    def factory(core):
        _need_two(core._device_count())
        import cudamem as cm

        cm.enable_peer_access(1, 0)
        with cm.gpus[0]:
            src = cm.device_array(n, np.uint8)
            c0 = cm.current_context().handle
        with cm.gpus[1]:
            dst = cm.device_array(n, np.uint8)
            c1 = cm.current_context().handle
        s = src.device_ctypes_pointer.value
        d = dst.device_ctypes_pointer.value

        def run():
            core._memcpy_peer(d, c1, s, c0, n)
        run.keep = (src, dst)
        return run
    return factory


def _numba(n):
    def factory(cuda):
        _need_two(len(cuda.gpus))
        with cuda.gpus[0]:
            src = cuda.to_device(np.ones(n, np.uint8))
        with cuda.gpus[1]:
            dst = cuda.device_array(n, np.uint8)
            cuda.current_context().enable_peer_access(
                cuda.gpus[0].get_primary_context().handle)

        def run():
            with cuda.gpus[1]:
                dst.copy_to_device(src)
        return run
    return factory


def _cupy(n):
    def factory(cp):
        _need_two(cp.cuda.runtime.getDeviceCount())
        with cp.cuda.Device(0):
            src = cp.ones(n, cp.uint8)
        with cp.cuda.Device(1):
            dst = cp.empty(n, cp.uint8)

        def run():
            with cp.cuda.Device(1):
                dst.data.copy_from_device(src.data, n)
                cp.cuda.Device(1).synchronize()
        return run
    return factory


def _torch(n):
    def factory(torch):
        _need_two(torch.cuda.device_count())
        src = torch.ones(n, dtype=torch.uint8, device="cuda:0")
        dst = torch.empty(n, dtype=torch.uint8, device="cuda:1")

        def run():
            dst.copy_(src)
            torch.cuda.synchronize(1)
        return run
    return factory


OPS = [
    {"name": "peer copy dev0->dev1 (%s)" % label, "bytes": n,
     "impls": {"cudamem": _cm(n), "driver": _driver(n), "numba": _numba(n),
               "cupy": _cupy(n), "torch": _torch(n)}}
    for label, n in SIZES.items()
]


if __name__ == "__main__":
    libs = {name: harness.load_lib(name) for name in harness.LIBS}
    print(harness.format_table(harness.run_ops(OPS, libs, repeats=11)))
