# SPDX-License-Identifier: MIT
"""Host memory: pinned allocation (with the pinned pool off, numba's way,
and on, cudamem's default; RMM's and cuda.core's pinned resources, and
each one's pool of them), registration of an
existing array, mapped and managed allocation, and host<->device
bandwidth from pinned memory.

Rows with a "bytes" key are reported as GB/s.  The driver column is
``_core``'s own calls of the driver on the context cudamem made current,
and for the bandwidth rows bare_driver.c's copy loop in C (``copy
htod|dtoh pinned``), no Python in the way.
"""

import numpy as np

import bare_driver
from harness import Skip

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30


def _pool(cm, on):
    """cudamem's pinned pool on or off for the factory's callable."""
    cm._core._pinned_pool_enable(on)
    if not on:
        cm._core.pinned_pool_trim()


# -- pinned allocation ------------------------------------------------------


def _pin_cudamem(cm):
    _pool(cm, False)
    return lambda: cm.pinned_array(MiB, np.uint8)


def _pin_cudamem_pooled(cm):
    _pool(cm, True)
    return lambda: cm.pinned_array(MiB, np.uint8)


def _pin_numba(cuda):
    return lambda: cuda.pinned_array(MiB, np.uint8)


def _pin_cupy(cp):
    import cupyx

    return lambda: cupyx.empty_pinned((MiB,), np.uint8)


def _pin_torch(torch):
    return lambda: torch.empty(MiB, dtype=torch.uint8, pin_memory=True)


def _pin_rmm(p):
    """RMM's PinnedHostMemoryResource (cudaMallocHost / cudaFreeHost)."""
    mr = p.pinned
    return lambda: mr.deallocate(mr.allocate(MiB), MiB)


def _pin_rmm_pooled(p):
    """A PoolMemoryResource over RMM's pinned resource."""
    mr = p.mr.PoolMemoryResource(p.pinned, initial_pool_size=64 * MiB)
    return lambda: mr.deallocate(mr.allocate(MiB), MiB)


def _pin_core(p):
    """cuda.core's LegacyPinnedMemoryResource (cuMemAllocHost)."""
    mr = p.pinned
    return lambda: mr.allocate(MiB).close()


def _pin_core_pooled(p):
    """cuda.core's PinnedMemoryResource: a stream-ordered pool of host
    memory (newer releases, on devices with host memory pools)."""
    if not hasattr(p.cc, "PinnedMemoryResource"):
        raise Skip("this cuda.core has no PinnedMemoryResource")
    mr = p.cc.PinnedMemoryResource()
    s = p.stream
    return lambda: mr.allocate(MiB, stream=s).close(s)


def _pin_driver(core):
    def fn():
        core._host_free(core._host_alloc(MiB, 0))
    return fn


# -- registration -------------------------------------------------------------


def _reg_cudamem(cm):
    _pool(cm, False)
    a = np.zeros(MiB, np.uint8)

    def fn():
        with cm.pinned(a):
            pass
    return fn


def _reg_numba(cuda):
    a = np.zeros(MiB, np.uint8)

    def fn():
        with cuda.pinned(a):
            pass
    return fn


def _reg_cupy(cp):
    a = np.zeros(MiB, np.uint8)
    rt = cp.cuda.runtime
    ptr = a.ctypes.data

    def fn():
        rt.hostRegister(ptr, MiB, 0)
        rt.hostUnregister(ptr)
    return fn


def _reg_driver(core):
    a = np.zeros(MiB, np.uint8)
    ptr = a.ctypes.data

    def fn():
        core._host_register(ptr, MiB, 0)
        core._host_unregister(ptr)
    return fn


# -- mapped and managed allocation ------------------------------------------


def _mapped_cudamem(cm):
    _pool(cm, False)
    return lambda: cm.mapped_array(MiB, np.uint8)


def _mapped_numba(cuda):
    return lambda: cuda.mapped_array(MiB, np.uint8)


def _mapped_driver(core):
    def fn():
        core._host_free(core._host_alloc(MiB, 0x02))
    return fn


def _managed_cudamem(cm):
    return lambda: cm.managed_array(MiB, np.uint8)


def _managed_numba(cuda):
    return lambda: cuda.managed_array(MiB, np.uint8)


def _managed_cupy(cp):
    return lambda: cp.cuda.malloc_managed(MiB)


def _managed_driver(core):
    def fn():
        core._device_free(core._managed_alloc(MiB, 0x1))
    return fn


# -- bandwidth from pinned memory --------------------------------------------


def _bw_cudamem(size, h2d):
    def factory(cm):
        _pool(cm, False)
        host = cm.pinned_array(size, np.uint8)
        host[:] = 1
        dev = cm.device_array(size, np.uint8)
        if h2d:
            return lambda: dev.copy_to_device(host)
        return lambda: dev.copy_to_host(host)
    return factory


def _bw_numba(size, h2d):
    def factory(cuda):
        host = cuda.pinned_array(size, np.uint8)
        host[:] = 1
        dev = cuda.device_array(size, np.uint8)
        if h2d:
            return lambda: dev.copy_to_device(host)
        return lambda: dev.copy_to_host(host)
    return factory


def _bw_cupy(size, h2d):
    def factory(cp):
        import cupyx

        host = cupyx.empty_pinned((size,), np.uint8)
        host[:] = 1
        dev = cp.empty(size, np.uint8)
        rt = cp.cuda.runtime
        hp = host.ctypes.data
        dp = dev.data.ptr
        if h2d:
            return lambda: rt.memcpy(dp, hp, size, rt.memcpyHostToDevice)
        return lambda: rt.memcpy(hp, dp, size, rt.memcpyDeviceToHost)
    return factory


def _bw_torch(size, h2d):
    def factory(torch):
        host = torch.ones(size, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(size, dtype=torch.uint8, device="cuda")
        if h2d:
            return lambda: dev.copy_(host)
        return lambda: host.copy_(dev)
    return factory


# The driver column of the bandwidth rows: bare_driver.c copying between a
# cuMemHostAlloc'd buffer and a device buffer in a C loop (cuMemcpyHtoD /
# cuMemcpyDtoH, synchronous for the host), no Python in the way.
C_SAMPLES = 31
C_MS = 2


def _bw_driver(size, h2d):
    def factory(core):
        return bare_driver.run("copy", "htod" if h2d else "dtoh", "pinned",
                               size, C_SAMPLES, C_MS)
    return factory


def _size_name(n):
    return "%d GiB" % (n // GiB) if n >= GiB else (
        "%d MiB" % (n // MiB) if n >= MiB else "%d KiB" % (n // KiB))


OPS = [
    {"name": "pinned_array(1 MiB) [pool off]",
     "impls": {"cudamem": _pin_cudamem, "numba": _pin_numba,
               "cupy": _pin_cupy, "torch": _pin_torch, "rmm": _pin_rmm,
               "cuda.core": _pin_core, "driver": _pin_driver}},
    {"name": "pinned_array(1 MiB) [default: pooled]",
     "impls": {"cudamem": _pin_cudamem_pooled, "cupy": _pin_cupy,
               "torch": _pin_torch, "rmm": _pin_rmm_pooled,
               "cuda.core": _pin_core_pooled}},
    {"name": "pinned() register 1 MiB",
     "impls": {"cudamem": _reg_cudamem, "numba": _reg_numba,
               "cupy": _reg_cupy, "driver": _reg_driver}},
    {"name": "mapped_array(1 MiB)",
     "impls": {"cudamem": _mapped_cudamem, "numba": _mapped_numba,
               "driver": _mapped_driver}},
    {"name": "managed_array(1 MiB)",
     "impls": {"cudamem": _managed_cudamem, "numba": _managed_numba,
               "cupy": _managed_cupy, "driver": _managed_driver}},
]

for _size in (64 * KiB, MiB, 16 * MiB, 256 * MiB, GiB):
    for _h2d in (True, False):
        OPS.append({
            "name": "%s pinned %s" % ("HtoD" if _h2d else "DtoH",
                                      _size_name(_size)),
            "bytes": _size,
            "impls": {"cudamem": _bw_cudamem(_size, _h2d),
                      "numba": _bw_numba(_size, _h2d),
                      "cupy": _bw_cupy(_size, _h2d),
                      "torch": _bw_torch(_size, _h2d),
                      "driver": _bw_driver(_size, _h2d)},
        })
