# SPDX-License-Identifier: MIT
"""Memory-manager plugins (numba's EMM interface, version 1) and the
pointer classes they build on."""

import pytest

import cudamem
from helpers import run_py


def test_base_manager_needs_a_context():
    from helpers import emm_plugin

    with pytest.raises(RuntimeError, match="requires a context"):
        emm_plugin.CountingManager()

    class M(cudamem.HostOnlyCUDAMemoryManager):
        pass

    with pytest.raises(TypeError):
        M(context=None)  # abstract methods missing


def test_set_memory_manager_checks_the_version():
    class Old(cudamem.HostOnlyCUDAMemoryManager):
        def memalloc(self, size):
            raise AssertionError

        def initialize(self):
            pass

        def get_ipc_handle(self, memory):
            pass

        def get_memory_info(self):
            pass

        @property
        def interface_version(self):
            return 2

    with pytest.raises(RuntimeError, match="version 2 - version 1 required"):
        cudamem.set_memory_manager(Old)


def test_plugin_applies_to_new_contexts_only():
    rc, out = run_py("""
        import cudamem
        from helpers import emm_plugin
        ctx0 = cudamem.current_context()
        cudamem.set_memory_manager(emm_plugin.CountingManager)
        assert type(ctx0.memory_manager).__name__ == "DefaultMemoryManager"
        m0 = ctx0.memalloc(4096)
        assert emm_plugin.LOG == []
        del m0
        cudamem.close()
        ctx = cudamem.current_context()          # a new context
        mm = ctx.memory_manager
        assert isinstance(mm, emm_plugin.CountingManager), mm
        assert emm_plugin.CountingManager.instances == 2  # probe + context
        assert emm_plugin.LOG == ["initialize"]
        m = ctx.memalloc(1000)
        assert isinstance(m, cudamem.MemoryPointer) and m.size == 1000
        assert emm_plugin.LOG[-1] == ("memalloc", 1000)
        assert len(mm.live) == 1
        del m
        assert emm_plugin.LOG[-1] == ("free", 1000) and not mm.live
        assert cudamem.memory_stats()["manager"] == "plugin"
        assert mm.get_memory_info().total == ctx.get_memory_info().total
        print("ok")
        """)
    assert rc == 0, out
    assert "ok" in out


def test_plugin_from_the_environment():
    code = """
        import cudamem
        from helpers import emm_plugin
        ctx = cudamem.current_context()
        print(type(ctx.memory_manager).__name__)
        with cudamem.defer_cleanup():
            m = ctx.memalloc(64)
        print(emm_plugin.LOG)
        """
    for var in ("CUDAMEM_MEMORY_MANAGER", "NUMBA_CUDA_MEMORY_MANAGER"):
        rc, out = run_py(code, **{var: "helpers.emm_plugin"})
        assert rc == 0, out
        assert "CountingManager" in out


def test_bad_plugin_module_is_a_runtime_error():
    rc, out = run_py("""
        import cudamem
        try:
            cudamem.current_context()
        except RuntimeError as e:
            print("error:", e)
        """, CUDAMEM_MEMORY_MANAGER="no_such_module_here")
    assert rc == 0, out
    assert "Failed to use memory manager from no_such_module_here" in out


def test_host_only_manager_host_memory():
    rc, out = run_py("""
        import numpy as np, cudamem
        from helpers import emm_plugin
        cudamem.set_memory_manager(emm_plugin.CountingManager)
        ctx = cudamem.current_context()
        mm = ctx.memory_manager
        pm = mm.memhostalloc(4096)
        assert isinstance(pm, cudamem.PinnedMemory)
        assert pm.own() is pm
        a = np.frombuffer(pm, dtype=np.uint8)    # a buffer
        a[:] = 7
        mapped = mm.memhostalloc(4096, mapped=True)
        assert mapped.device_pointer != 0
        host = np.zeros(1024, np.uint8)
        pin = mm.mempin(host, host.ctypes.data, host.nbytes)
        del pin                                  # unregisters at once
        pin2 = mm.mempin(host, host.ctypes.data, host.nbytes)
        managed = mm.memallocmanaged(256, True)
        assert managed.device_pointer != 0
        del pin2, managed, mapped, pm
        mm.reset()
        print("ok")
        """)
    assert rc == 0, out
    assert "ok" in out


def test_memory_pointer_semantics(ctx):
    freed = []
    base = cudamem.MemoryPointer(ctx, 0x1000, 256,
                                 finalizer=lambda: freed.append(1))
    assert base.owner is base and base.is_managed and base.refct == 1
    assert base.device_pointer_value == 0x1000
    assert base.device_ctypes_pointer.value == 0x1000
    v = base.view(16, 32)
    assert v.device_pointer == 0x1010 and v.size == 16
    with pytest.raises(RuntimeError, match="negative"):
        base.view(32, 16)
    base.free()
    assert freed == [1]
    with pytest.raises(RuntimeError, match="Freeing dead memory"):
        base.free()
    empty = cudamem.MemoryPointer(ctx, 0, 0)
    assert empty.device_pointer_value is None
    with pytest.raises(RuntimeError, match="non-empty slice"):
        empty.view(0, 4)


def test_auto_free_pointer_frees_with_its_last_owner(ctx):
    freed = []
    p = cudamem.AutoFreePointer(ctx, 0x2000, 64,
                                finalizer=lambda: freed.append(1))
    assert p.refct == 0
    o1 = p.own()
    o2 = p.own()
    assert p.refct == 2 and o1.device_pointer == 0x2000
    del o1
    assert freed == []
    del o2
    assert freed == [1]


def test_default_manager_interface(ctx):
    mm = ctx.memory_manager
    mm.deallocations.clear()
    assert mm.interface_version == 1
    mm.initialize()
    mm.initialize()
    assert isinstance(mm.get_memory_info(), cudamem.MemoryInfo)
    m = mm.memalloc(512)
    assert m.size == 512
    del m
    with mm.defer_cleanup():
        mm.reset()
        assert len(mm.deallocations) >= 1
    mm.reset()
    assert len(mm.deallocations) == 0
