# SPDX-License-Identifier: MIT
"""``python -m cudamem``: the report a user wants first.

Prints the backend, the driver version and each device with its name,
compute capability, total and free memory.  Exits 1 when no backend can
be used, after saying why.
"""

import sys

import cudamem
from cudamem import _core


def _gib(n):
    return "%.2f GiB" % (n / 2**30)


def main():
    print("cudamem %s" % cudamem.__version__)
    err = cudamem.cuda_error()
    if err is not None:
        print("backend: unavailable")
        print(err)
        return 1
    print("backend: %s" % _core._backend())
    print("driver version: CUDA %d.%d" % cudamem.driver_version())
    print("built against: CUDA %d.%d headers" % cudamem.runtime_version())
    print("default stream: %s" % ("per-thread"
                                  if _core._per_thread_default_stream()
                                  else "legacy"))
    print("devices: %d" % len(cudamem.gpus))
    for gpu in cudamem.gpus:
        dev = gpu._device
        with gpu:
            free, total = cudamem.current_context().get_memory_info()
        cc = dev.compute_capability
        print("  [%d] %s  compute capability %d.%d  %d SMs  "
              "memory %s total, %s free" % (
                  dev.id, dev.name, cc[0], cc[1], dev.MULTIPROCESSOR_COUNT,
                  _gib(total), _gib(free)))
        print("      %s" % dev.uuid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
