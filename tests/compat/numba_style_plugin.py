# SPDX-License-Identifier: MIT
"""An EMM plugin written only against numba.cuda's documented interface,
the way external allocators (RMM's among them) write theirs: device
memory from a raw allocator of its own, host memory from
HostOnlyCUDAMemoryManager, IPC from GetIpcHandleMixin.  ``make_plugin``
builds it over either implementation (``cuda`` is numba.cuda or
cudamem)."""

import contextlib


def make_plugin(cuda, raw_alloc, raw_free, log):
    """The plugin class; its calls are appended to ``log``."""
    drv = cuda.cudadrv.driver

    class LoggingManager(drv.GetIpcHandleMixin,
                         drv.HostOnlyCUDAMemoryManager):
        def initialize(self):
            log.append("initialize")

        def memalloc(self, size):
            ptr = raw_alloc(size)
            log.append(("memalloc", size))

            def finalizer():
                log.append(("free", size))
                raw_free(ptr)

            return drv.MemoryPointer(self.context, ptr, size,
                                     finalizer=finalizer)

        def get_memory_info(self):
            return cuda.MemoryInfo(free=1 << 30, total=2 << 30)

        def reset(self):
            log.append("reset")
            super().reset()

        @contextlib.contextmanager
        def defer_cleanup(self):
            log.append("defer_cleanup")
            with super().defer_cleanup():
                yield

        @property
        def interface_version(self):
            return 1

    return LoggingManager
