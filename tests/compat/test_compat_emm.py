# SPDX-License-Identifier: MIT
"""An EMM plugin written for numba (numba_style_plugin.py) runs unchanged:
installed by assigning ``context.memory_manager`` and through
``set_memory_manager``."""

import gc

import numpy as np
import pytest

from compat_util import run_target
from numba_style_plugin import make_plugin


@pytest.fixture
def plugged(cuda, raw):
    """The current context with a fresh plugin assigned as its memory
    manager (the original given back afterwards); (context, plugin,
    log)."""
    log = []
    cls = make_plugin(cuda, raw[0], raw[1], log)
    ctx = cuda.current_context()
    old = ctx.memory_manager
    mm = cls(context=ctx)
    mm.initialize()
    ctx.memory_manager = mm
    try:
        yield ctx, mm, log
    finally:
        ctx.memory_manager = old
        gc.collect()


def test_assigned_plugin_gets_the_allocations(cuda, plugged):
    ctx, mm, log = plugged
    assert ctx.memory_manager is mm
    d = cuda.device_array(100, np.uint8)
    assert ("memalloc", 100) in log
    d.copy_to_device(np.arange(100, dtype=np.uint8))
    assert (d.copy_to_host() == np.arange(100)).all()
    m = ctx.memalloc(64)
    assert log.count(("memalloc", 64)) == 1
    del d, m
    gc.collect()
    assert ("free", 100) in log and ("free", 64) in log


def test_assigned_plugin_host_memory(cuda, plugged):
    ctx, mm, log = plugged
    p = cuda.pinned_array(10, np.int32)
    p[:] = np.arange(10)
    m = cuda.mapped_array(10, np.int32)
    m[:] = 3
    h = ctx.memhostalloc(256, mapped=True)
    assert memoryview(h).nbytes == 256
    g = ctx.memallocmanaged(128)
    assert memoryview(g).nbytes == 128
    d = cuda.to_device(p)
    assert (d.copy_to_host() == np.arange(10)).all()


def test_assigned_plugin_ipc_and_info(cuda, plugged):
    ctx, mm, log = plugged
    m = ctx.memalloc(256)
    h = ctx.get_ipc_handle(m)
    assert h.size == 256
    assert tuple(ctx.get_memory_info()) == (1 << 30, 2 << 30)


def test_assigned_plugin_defer_cleanup(cuda, plugged):
    ctx, mm, log = plugged
    with cuda.defer_cleanup():
        d = cuda.device_array(8, np.uint8)
        del d
    assert "defer_cleanup" in log


def test_assigned_plugin_reset(cuda, plugged):
    ctx, mm, log = plugged
    ctx.reset()
    assert "reset" in log


def test_set_memory_manager_in_a_fresh_process():
    rc, out = run_target("""
        import gc
        from numba_style_plugin import make_plugin
        if cuda.__name__ == "cudamem":
            alloc, free = cuda._core._device_alloc, cuda._core._device_free
        else:
            drv = cuda.cudadrv.driver.driver
            alloc = lambda n: int(drv.cuMemAlloc(n))
            free = drv.cuMemFree
        log = []
        cuda.set_memory_manager(make_plugin(cuda, alloc, free, log))
        ctx = cuda.current_context()
        assert type(ctx.memory_manager).__name__ == "LoggingManager"
        d = cuda.to_device(np.arange(32, dtype=np.uint8))
        assert (d.copy_to_host() == np.arange(32)).all()
        p = cuda.pinned_array(4)
        del d, p
        gc.collect()
        assert "initialize" in log, log
        assert ("memalloc", 32) in log and ("free", 32) in log, log
        print("ok")
    """)
    assert rc == 0 and out.strip().endswith("ok"), out


def test_interface_version_checked(cuda, raw):
    cls = make_plugin(cuda, raw[0], raw[1], [])

    class V2(cls):
        @property
        def interface_version(self):
            return 2

    with pytest.raises(RuntimeError, match="version 2 - version 1 required"):
        cuda.set_memory_manager(V2)


def _strict_plugin(cuda, raw_alloc, raw_free):
    """A plugin that refuses to allocate before initialize(), the pattern
    of numba's EMM documentation."""
    drv = cuda.cudadrv.driver

    class StrictManager(drv.GetIpcHandleMixin,
                        drv.HostOnlyCUDAMemoryManager):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.initialized = False
            self.sizes = []

        def initialize(self):
            self.initialized = True

        def memalloc(self, size):
            if not self.initialized:
                raise RuntimeError("memalloc called before initialize")
            ptr = raw_alloc(size)
            self.sizes.append(size)
            return drv.MemoryPointer(self.context, ptr, size,
                                     finalizer=lambda: raw_free(ptr))

        def get_memory_info(self):
            return cuda.MemoryInfo(free=1 << 30, total=2 << 30)

        @property
        def interface_version(self):
            return 1

    return StrictManager


def test_assigned_plugin_is_initialised_before_it_allocates(cuda, raw):
    ctx = cuda.current_context()
    old = ctx.memory_manager
    mm = _strict_plugin(cuda, *raw)(context=ctx)
    ctx.memory_manager = mm
    try:
        d = cuda.device_array_like(np.zeros(16))
        assert mm.initialized and mm.sizes == [128]
        assert cuda.current_context().memory_manager.initialized
        d.copy_to_device(np.arange(16.0))
        np.testing.assert_array_equal(d.copy_to_host(), np.arange(16.0))
        del d
    finally:
        ctx.memory_manager = old
        gc.collect()


def test_assigned_plugin_is_initialised_by_current_context(cuda, raw):
    ctx = cuda.current_context()
    old = ctx.memory_manager
    mm = _strict_plugin(cuda, *raw)(context=ctx)
    ctx.memory_manager = mm
    try:
        assert not mm.initialized
        assert cuda.current_context().memory_manager.initialized
    finally:
        ctx.memory_manager = old
        gc.collect()


def test_plugin_set_for_new_contexts_is_initialised():
    rc, out = run_target("""
        from test_compat_emm import _strict_plugin
        if cuda.__name__ == "cudamem":
            alloc, free = cuda._core._device_alloc, cuda._core._device_free
        else:
            drv = cuda.cudadrv.driver.driver
            alloc = lambda n: int(drv.cuMemAlloc(n))
            free = drv.cuMemFree
        cuda.set_memory_manager(_strict_plugin(cuda, alloc, free))
        d = cuda.device_array_like(np.zeros(4))
        mm = cuda.current_context().memory_manager
        assert mm.initialized and mm.sizes == [32], mm.sizes
        print("ok")
    """)
    assert rc == 0 and out.strip().endswith("ok"), out


class _Wrapper:
    """What code written for numba does to count allocations: wrap the
    context's manager and delegate to it."""

    def __init__(self, inner):
        self.inner = inner
        self.sizes = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def memalloc(self, size):
        self.sizes.append(size)
        return self.inner.memalloc(size)


def test_wrapper_of_the_previous_manager_does_not_recurse(cuda):
    ctx = cuda.current_context()
    old = ctx.memory_manager
    w = _Wrapper(old)
    ctx.memory_manager = w
    try:
        d = cuda.device_array(100, np.float32)
        assert w.sizes == [400]
        d.copy_to_device(np.arange(100, dtype=np.float32))
        np.testing.assert_array_equal(d.copy_to_host(), np.arange(100))
        m = ctx.memalloc(64)
        assert w.sizes == [400, 64] and m.size == 64
        p = cuda.pinned_array(8, np.int32)
        p[:] = np.arange(8)
        q = cuda.mapped_array(8, np.int32)
        q[:] = 3
        assert q.sum() == 24
        assert ctx.get_memory_info().total > 0
        with cuda.defer_cleanup():
            del d, m
    finally:
        ctx.memory_manager = old
        gc.collect()
