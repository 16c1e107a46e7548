# SPDX-License-Identifier: MIT
"""The loaders of the libraries the benchmarks compare with, RMM and
cuda.core, for ``python -m cudamem bench`` (``_bench``, which re-exports
these names) and its memory benchmark (``_bench_memory``).  Each library
is imported only when asked for; a loader gives None where the library
is not installed or finds no device.
"""

__all__ = ["cuda_core_module", "load_cuda_core", "load_rmm"]

RMM_POOL_BYTES = 256 << 20              # 256 MiB


def cuda_core_module():
    """cuda.core's namespace: ``cuda.core`` where it exports the classes
    (newer releases), else ``cuda.core.experimental``.  ImportError when
    neither is installed."""
    try:
        from cuda import core

        core.Device                          # noqa: B018 - probe
        return core
    except (ImportError, AttributeError):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from cuda.core import experimental
        return experimental


def load_rmm():
    """RMM's objects the benchmarks use, made once, or None (not
    installed, or no device): ``rmm``; ``pool``, a PoolMemoryResource of
    RMM_POOL_BYTES over CudaMemoryResource (what RMM's users pick for
    many small allocations); ``pinned``, a PinnedHostMemoryResource;
    ``Stream``, RMM's stream class (a new CUDA stream per call, destroyed
    with it)."""
    try:
        import types

        import rmm
        import rmm.mr

        try:
            from rmm.pylibrmm.stream import Stream
        except ImportError:                  # releases before 24.12
            from rmm._cuda.stream import Stream
        pool = rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(),
                                         initial_pool_size=RMM_POOL_BYTES)
        rmm.DeviceBuffer(size=256, mr=pool)  # a device that works
        return types.SimpleNamespace(
            name="rmm", rmm=rmm, mr=rmm.mr, pool=pool,
            pinned=rmm.mr.PinnedHostMemoryResource(), Stream=Stream)
    except Exception:  # noqa: BLE001 - any failure means "not here"
        return None


def load_cuda_core():
    """cuda.core's objects the benchmarks use, made once, or None:
    ``cc`` (the namespace), ``dev`` (device 0, made current), ``stream``
    (one of its streams), ``mr`` (its DeviceMemoryResource: the driver's
    stream-ordered pool) and ``pinned`` (a LegacyPinnedMemoryResource:
    cuMemAllocHost)."""
    try:
        import types

        cc = cuda_core_module()
        dev = cc.Device(0)
        dev.set_current()
        stream = dev.create_stream()
        mr = cc.DeviceMemoryResource(dev.device_id)
        mr.allocate(256, stream=stream).close(stream)
        return types.SimpleNamespace(
            name="cuda.core", cc=cc, dev=dev, stream=stream, mr=mr,
            pinned=cc.LegacyPinnedMemoryResource())
    except Exception:  # noqa: BLE001 - any failure means "not here"
        return None
