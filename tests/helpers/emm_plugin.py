# SPDX-License-Identifier: MIT
"""A memory-manager plugin written against numba.cuda's documented EMM
interface, the way external allocators (RMM's, for one) write theirs:
device memory from its own allocator, host memory from
HostOnlyCUDAMemoryManager.  Used by test_emm.py, also through
CUDAMEM_MEMORY_MANAGER=emm_plugin."""

from cudamem import (
    GetIpcHandleMixin,
    HostOnlyCUDAMemoryManager,
    MemoryInfo,
    MemoryPointer,
    _core,
)

LOG = []


class CountingManager(GetIpcHandleMixin, HostOnlyCUDAMemoryManager):
    """Counts its calls; frees when the MemoryPointer dies."""

    instances = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        type(self).instances += 1
        self.live = {}

    def initialize(self):
        LOG.append("initialize")

    def memalloc(self, size):
        ptr = _core._device_alloc(size)
        LOG.append(("memalloc", size))
        live = self.live
        live[ptr] = size

        def finalizer():
            LOG.append(("free", size))
            del live[ptr]
            _core._device_free(ptr)

        return MemoryPointer(self.context, ptr, size, finalizer=finalizer)

    def get_memory_info(self):
        free, total = self.context.get_memory_info()
        return MemoryInfo(free=free, total=total)

    @property
    def interface_version(self):
        return 1


_numba_memory_manager = CountingManager


class DeferringManager(GetIpcHandleMixin, HostOnlyCUDAMemoryManager):
    """A plugin written as numba's own manager is: cuMemAlloc, and frees
    through its deallocation queue (an immediate cuMemFree would wait for
    the device, and so for a stream that a test holds)."""

    def initialize(self):
        self.deallocations.memory_capacity = self.get_memory_info().total

    def memalloc(self, size):
        ptr = _core._device_alloc(size)
        dealloc = self.deallocations

        def finalizer():
            dealloc.add_item(_core._device_free, ptr, size)

        return MemoryPointer(self.context, ptr, size, finalizer=finalizer)

    def get_memory_info(self):
        free, total = self.context.get_memory_info()
        return MemoryInfo(free=free, total=total)

    @property
    def interface_version(self):
        return 1
