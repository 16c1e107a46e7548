# SPDX-License-Identifier: MIT
"""The pinned pool, on by default: reuse, the cap on free bytes, trim,
stream safety, fork and close().  Each test runs in a child process with
the pool's environment as a user would have it."""

import os

import pytest

import helpers


# The pool's variables start unset in each child, as a user would have
# them.
POOL_VARS = ("CUDAMEM_PINNED_POOL", "CUDAMEM_PINNED_POOL_LIMIT")


def test_reuse_by_default():
    rc, out = helpers.run_py("""
        import numpy as np, cudamem
        a = cudamem.pinned_array(1 << 20, np.uint8)
        ptr = a.base.host_pointer
        assert a.base.pooled
        del a
        cudamem.synchronize()
        b = cudamem.pinned_array(1 << 20, np.uint8)
        st = cudamem.pinned_pool_stats()
        assert b.base.host_pointer == ptr, "not reused"
        assert st["enabled"] and st["hits"] == 1 and st["misses"] == 1, st
        # A size of the same class reuses the block too.
        del b
        cudamem.synchronize()
        c = cudamem.pinned_array(900000, np.uint8)
        assert c.base.host_pointer == ptr
        print("ok")
        """, timeout=300, unset=POOL_VARS)
    assert rc == 0, out
    assert "ok" in out


def test_default_cap():
    rc, out = helpers.run_py("""
        import os, cudamem
        phys = os.sysconf("SC_PHYS_PAGES") // 16 * os.sysconf("SC_PAGESIZE")
        lim = cudamem.pinned_pool_stats()["limit_bytes"]
        assert lim == min(1 << 30, phys), (lim, phys)
        print("ok")
        """, timeout=300, unset=POOL_VARS)
    assert rc == 0, out
    assert "ok" in out


@pytest.mark.parametrize("value,expect", [("65536", 65536), ("64K", 65536),
                                          ("3M", 3 << 20), ("0", 0)])
def test_cap_from_the_environment(value, expect):
    rc, out = helpers.run_py("""
        import numpy as np, cudamem
        lim = cudamem.pinned_pool_stats()["limit_bytes"]
        assert lim == %d, lim
        arrays = [cudamem.pinned_array(32768, np.uint8) for _ in range(4)]
        del arrays
        st = cudamem.pinned_pool_stats()
        assert st["free_bytes"] <= lim, st
        assert st["free_bytes"] == min(lim // 32768, 4) * 32768, st
        assert cudamem.memory_stats()["pinned_bytes"] == st["free_bytes"]
        print("ok")
        """ % expect, timeout=300, unset=POOL_VARS,
        CUDAMEM_PINNED_POOL_LIMIT=value)
    assert rc == 0, out
    assert "ok" in out


def test_bad_cap_is_refused():
    rc, out = helpers.run_py("import cudamem", timeout=300, unset=POOL_VARS,
                             CUDAMEM_PINNED_POOL_LIMIT="a lot")
    assert rc != 0
    assert "CUDAMEM_PINNED_POOL_LIMIT" in out


@pytest.mark.parametrize("value", ["0", "off", "false", "no"])
def test_off_restores_numba_behaviour(value):
    rc, out = helpers.run_py("""
        import numpy as np, cudamem
        before = cudamem.memory_stats()["pinned_bytes"]
        a = cudamem.pinned_array(5000, np.uint8)
        assert not a.base.pooled
        assert cudamem.memory_stats()["pinned_bytes"] == before + 5000
        del a
        assert cudamem.memory_stats()["pinned_bytes"] == before
        st = cudamem.pinned_pool_stats()
        assert not st["enabled"] and st["reserved_bytes"] == 0, st
        print("ok")
        """, timeout=300, unset=POOL_VARS, CUDAMEM_PINNED_POOL=value)
    assert rc == 0, out
    assert "ok" in out


def test_trim():
    rc, out = helpers.run_py("""
        import numpy as np, cudamem
        arrays = [cudamem.pinned_array(n, np.uint8)
                  for n in (4096, 10000, 1 << 20)]
        del arrays
        st = cudamem.pinned_pool_stats()
        assert st["free_bytes"] == 4096 + 16384 + (1 << 20), st
        cudamem.pinned_pool_trim()
        st = cudamem.pinned_pool_stats()
        assert st["free_bytes"] == 0 and st["reserved_bytes"] == 0, st
        assert cudamem.memory_stats()["pinned_bytes"] == 0
        print("ok")
        """, timeout=300, unset=POOL_VARS)
    assert rc == 0, out
    assert "ok" in out


@pytest.mark.sim
def test_out_of_host_memory_trims_and_retries(simulator):
    if not simulator:
        pytest.skip("needs the simulator's fault injection")
    rc, out = helpers.run_py("""
        import numpy as np, cudamem
        from cudamem import _core
        a = cudamem.pinned_array(1 << 16, np.uint8)
        del a
        assert cudamem.pinned_pool_stats()["free_bytes"] == 1 << 16
        _core._sim_inject("MemHostAlloc", 1, 2)   # OUT_OF_MEMORY once
        b = cudamem.pinned_array(1 << 20, np.uint8)
        st = cudamem.pinned_pool_stats()
        assert b.base.pooled
        assert st["free_bytes"] == 0, st           # trimmed, then retried
        assert st["reserved_bytes"] == 1 << 20, st
        print("ok")
        """, timeout=300, unset=POOL_VARS)
    assert rc == 0, out
    assert "ok" in out


def test_busy_block_not_reused_on_a_held_stream():
    rc, out = helpers.run_py("""
        import numpy as np, cudamem
        from helpers.streamutil import Gate
        n = 1 << 16
        d = cudamem.device_array(n, np.uint8)
        s = cudamem.stream()
        with Gate() as g:
            g.block(s)
            a = cudamem.pinned_array(n, np.uint8)
            ptr = a.base.host_pointer
            d.copy_to_host(a, stream=s)      # queued behind the gate
            del a
            b = cudamem.pinned_array(n, np.uint8)
            print("busy reused:", b.base.host_pointer == ptr)
        s.synchronize()
        cudamem.synchronize()
        c = cudamem.pinned_array(n, np.uint8)
        print("idle reused:", c.base.host_pointer == ptr)
        """, timeout=300, unset=POOL_VARS)
    assert rc == 0, out
    assert "busy reused: False" in out
    assert "idle reused: True" in out


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork():
    rc, out = helpers.run_py("""
        import os, warnings, numpy as np, cudamem
        warnings.simplefilter("ignore", DeprecationWarning)
        a = cudamem.pinned_array(1 << 16, np.uint8)
        a[:] = 7
        b = cudamem.pinned_array(1 << 16, np.uint8)
        del b                                # a free block in the pool
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                # The child's copy of a pooled array is ordinary memory:
                # reading it and dropping it touch no driver.
                if int(a.sum()) != 7 * (1 << 16):
                    code = 3
                del a
                try:
                    c = cudamem.pinned_array(1 << 16, np.uint8)
                    code = 4 if c.base.pooled else code
                except Exception:
                    pass                     # CUDA is unusable after fork
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
        # b's block is reusable once the event of its return completed
        # (on a loaded machine it may not have yet)
        cudamem.synchronize()
        c = cudamem.pinned_array(1 << 16, np.uint8)
        print("parent reuses:", c.base.pooled and
              cudamem.pinned_pool_stats()["hits"] >= 1)
        """, timeout=300, unset=POOL_VARS)
    assert rc == 0, out
    assert "child 0" in out
    assert "parent reuses: True" in out


def test_close_trims_and_keeps_live_arrays():
    rc, out = helpers.run_py("""
        import numpy as np, cudamem
        live = cudamem.pinned_array(1 << 16, np.uint8)
        live[:] = 5
        gone = cudamem.pinned_array(1 << 18, np.uint8)
        del gone
        st = cudamem.pinned_pool_stats()
        assert st["free_bytes"] == 1 << 18, st
        cudamem.memory_history(True)
        cudamem.close()
        # The live array keeps its contents after close().
        assert int(live.sum()) == 5 * (1 << 16)
        del live
        st = cudamem.pinned_pool_stats()
        assert st["free_bytes"] == 0 and st["reserved_bytes"] == 0, st
        n = cudamem.pinned_array(1 << 18, np.uint8)
        n[:] = 1
        assert n.base.pooled and int(n.sum()) == 1 << 18
        print("ok")
        """, timeout=300, unset=POOL_VARS)
    assert rc == 0, out
    assert "ok" in out


@pytest.mark.sim
def test_close_frees_the_free_blocks(simulator):
    if not simulator:
        pytest.skip("needs the simulator's fault injection")
    # A failing cuMemFreeHost at close() shows that close() gives the
    # pool's free blocks back itself (reported, not raised).
    rc, out = helpers.run_py("""
        import numpy as np, cudamem
        from cudamem import _core
        gone = cudamem.pinned_array(1 << 18, np.uint8)
        del gone
        _core._sim_inject("MemFreeHost", 1, 1)
        cudamem.close()
        print("closed")
        """, timeout=300, unset=POOL_VARS)
    assert rc == 0, out
    assert "closed" in out
    assert "cuMemFreeHost" in out and "CUDA_ERROR_INVALID_VALUE" in out
