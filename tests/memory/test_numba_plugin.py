# SPDX-License-Identifier: MIT
"""numba on cudamem's memory manager, the README's two ways, each in a
fresh process: ``NUMBA_CUDA_MEMORY_MANAGER=cudamem.numba_plugin`` and
``numba.cuda.set_memory_manager(cudamem.NumbaManager)``.

The variable names numba's plugin, which takes its memory from cudamem's
manager of the same device; cudamem reads the same variable, and its own
contexts must then keep their built-in manager (a context whose manager
is that plugin would ask itself for every allocation).  A plugin that
does loop back into its own context's manager is refused with a clear
error, never a RecursionError.

numba's contexts need a real driver: on the simulator the plugin runs
against a stand-in of numba's context (what the plugin reads of it: the
device's ordinal), with numba's own MemoryPointer; on a GPU numba's
``to_device`` runs through it.
"""

import json
import textwrap
import threading

import pytest

from helpers.crashutil import run_child
from helpers.isolation import SIMULATOR

# Each test only runs children (tests/helpers/ahead.py).
pytestmark = pytest.mark.ahead

PLUGIN_VAR = {"NUMBA_CUDA_MEMORY_MANAGER": "cudamem.numba_plugin"}

# numba-cuda 0.30 still names np.row_stack, which NumPy 2.5 removed.
SHIM = """
import numpy as np
if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack
"""


def numba_importable():
    r = run_child(SHIM + "import numba.cuda\n", check=False, timeout=120)
    return r.returncode == 0


_NUMBA = []                 # [whether numba.cuda imports], once asked
_NUMBA_LOCK = threading.Lock()


def need_numba():
    """Skip the test unless numba.cuda imports here (asked once, in a
    child)."""
    with _NUMBA_LOCK:
        if not _NUMBA:
            _NUMBA.append(numba_importable())
    if not _NUMBA[0]:
        pytest.skip("numba-cuda is not importable here")


def child(*parts, env=None, check=True):
    """Run SHIM and the parts of code (each dedented on its own) with the
    variables in env (None removes one); the JSON of its last line, or
    the ChildResult when check is False."""
    code = "\n".join(textwrap.dedent(p) for p in parts)
    base = {"CUDAMEM_MEMORY_MANAGER": None,
            "NUMBA_CUDA_MEMORY_MANAGER": None,
            "CUDAMEM_TEST_ISOLATED": "1"}
    base.update(env or {})
    r = run_child(SHIM + code, env=base, timeout=240, check=check)
    if not check:
        return r
    return json.loads(r.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------
# cudamem's own contexts under the variable
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("cudamem_mm, expect", [
    (None, "DefaultMemoryManager"),
    ("pool", "PoolMemoryManager"),
    ("async", "AsyncMemoryManager"),
])
def test_variable_leaves_cudamem_on_its_own_manager(cudamem_mm, expect):
    # The README's first way, with cudamem used in the same process.
    out = child("""
        import json, sys
        import cudamem
        a = cudamem.to_device(np.arange(1000, dtype=np.float32))
        ok = bool((a.copy_to_host() == np.arange(1000)).all())
        mm = cudamem.current_context().memory_manager
        print(json.dumps({"ok": ok, "mm": type(mm).__name__,
                          "numba_imported": "numba" in sys.modules}))
    """, env=dict(PLUGIN_VAR, CUDAMEM_MEMORY_MANAGER=cudamem_mm))
    assert out == {"ok": True, "mm": expect, "numba_imported": False}


def test_cudamem_variable_naming_the_numba_plugin_is_refused():
    need_numba()
    # Asked for cudamem's own contexts, numba's plugin is a loop: a clear
    # error when the context is made, and again at the next try.
    out = child("""
        import json
        import cudamem
        res = []
        for _ in range(2):
            try:
                cudamem.device_array(10)
                res.append(None)
            except RuntimeError as e:
                res.append([str(e), type(e.__cause__).__name__,
                            str(e.__cause__)])
        print(json.dumps(res))
    """, env={"CUDAMEM_MEMORY_MANAGER": "cudamem.numba_plugin"})
    for msg, cause, why in out:
        assert "cudamem.numba_plugin" in msg
        assert cause == "ValueError"
        assert "CUDAMEM_MEMORY_MANAGER=cudamem.numba_plugin" in why
        assert "numba.cuda.set_memory_manager" in why


def test_set_memory_manager_refuses_the_numba_plugin():
    need_numba()
    out = child("""
        import json
        import cudamem
        res = {}
        try:
            cudamem.set_memory_manager(cudamem.NumbaManager)
        except ValueError as e:
            res["set"] = str(e)
        # Nothing changed: the context takes the built-in default.
        cudamem.device_array(10)
        ctx = cudamem.current_context()
        res["mm"] = type(ctx.memory_manager).__name__
        try:
            ctx.memory_manager = cudamem.NumbaManager(context=ctx)
        except ValueError as e:
            res["assign"] = str(e)
        res["after"] = type(ctx.memory_manager).__name__
        print(json.dumps(res))
    """)
    assert "takes its memory from cudamem" in out["set"]
    assert "takes its memory from cudamem" in out["assign"]
    assert out["mm"] == out["after"] == "DefaultMemoryManager"


def test_a_plugin_that_asks_its_own_context_is_refused():
    # Any plugin, not only numba's: its memalloc allocates from the
    # context it serves, which would call it again without end.
    out = child("""
        import json
        import cudamem

        class Loop(cudamem.HostOnlyCUDAMemoryManager):
            calls = 0

            def initialize(self):
                pass

            def memalloc(self, size):
                Loop.calls += 1
                return cudamem.device_array(size, np.uint8).gpu_data

            def get_ipc_handle(self, memory):
                raise NotImplementedError

            def get_memory_info(self):
                return cudamem.MemoryInfo(free=0, total=0)

            @property
            def interface_version(self):
                return 1

        cudamem.set_memory_manager(Loop)
        res = {}
        for name, make in [("to_device", lambda: cudamem.to_device(
                               np.arange(4))),
                           ("device_array", lambda: cudamem.device_array(8))]:
            try:
                make()
                res[name] = None
            except RecursionError as e:
                res[name] = "RecursionError: %s" % e
            except RuntimeError as e:
                res[name] = str(e)
        res["calls"] = Loop.calls
        st = cudamem.memory_stats()
        res["held"] = st["allocated_bytes"] + st["limit_used_bytes"]
        print(json.dumps(res))
    """)
    for name in ("to_device", "device_array"):
        assert out[name] is not None
        assert out[name].startswith("the memory manager plugin"), out[name]
        assert "Loop" in out[name]
    assert out["calls"] == 2           # once each: the inner call refused
    assert out["held"] == 0            # nothing leaked on the way out


# ---------------------------------------------------------------------------
# numba's side: the plugin
# ---------------------------------------------------------------------------

STAND_IN = """
import types
numba_ctx = types.SimpleNamespace(device=types.SimpleNamespace(id=0))
"""


@pytest.mark.parametrize("import_cudamem_first", [True, False])
@pytest.mark.parametrize("way", ["variable", "set_memory_manager"])
def test_plugin_serves_numba_from_cudamem(way, import_cudamem_first):
    """The plugin numba would take either way, against a stand-in of
    numba's context on the simulator (numba's own contexts need a
    driver): numba's MemoryPointer over cudamem's memory, counted for
    numba, given back when numba drops it; cudamem's context on its own
    manager."""
    need_numba()
    first = "import cudamem\n" if import_cudamem_first else ""
    if way == "variable":
        take = ("import importlib, os\n"
                "plugin = importlib.import_module(\n"
                "    os.environ['NUMBA_CUDA_MEMORY_MANAGER'])"
                "._numba_memory_manager\n")
    else:
        take = ("import cudamem\n"
                "cuda.set_memory_manager(cudamem.NumbaManager)\n"
                "plugin = cudamem.NumbaManager\n")
    out = child(first, """
        import gc, json
        from numba import cuda
        from numba.cuda.cudadrv import driver
        """, take, STAND_IN, """
        import cudamem
        mm = plugin(context=numba_ctx)
        mm.initialize()
        mp = mm.memalloc(1 << 20)
        res = {"numba_pointer": isinstance(mp, driver.MemoryPointer),
               "size": mp.size,
               "held": cudamem.memory_stats()["by_client"]["numba"],
               "mm": type(cudamem.current_context().memory_manager
                          ).__name__}
        # cudamem's memory is behind numba's pointer.
        d = cudamem.DeviceNDArray((1 << 18,), (4,), np.float32,
                                  gpu_data=cudamem.MemoryPointer(
                                      cudamem.current_context(),
                                      mp.device_pointer_value, 1 << 20,
                                      owner=mp))
        d.copy_to_device(np.arange(1 << 18, dtype=np.float32))
        res["values"] = bool((d.copy_to_host() ==
                              np.arange(1 << 18)).all())
        del d, mp
        gc.collect()
        res["after"] = cudamem.memory_stats()["by_client"]["numba"]
        print(json.dumps(res))
    """, env=PLUGIN_VAR if way == "variable" else None)
    assert out == {"numba_pointer": True, "size": 1 << 20,
                   "held": 1 << 20, "mm": "DefaultMemoryManager",
                   "values": True, "after": 0}


# ---------------------------------------------------------------------------
# On a GPU: numba's own to_device, both ways, with and without cudamem
# imported first
# ---------------------------------------------------------------------------

NUMBA_WORK = """
        import gc, json
        from numba import cuda
        a = cuda.to_device(np.arange(1 << 20, dtype=np.float32))
        b = cuda.device_array_like(a)
        b.copy_to_device(a)
        res = {"values": bool((b.copy_to_host() ==
                               np.arange(1 << 20)).all())}
        import cudamem
        st = cudamem.memory_stats()
        res["held"] = st["by_client"]["numba"]
        res["mm"] = type(cudamem.current_context().memory_manager).__name__
        c = cudamem.to_device(np.ones(16))        # cudamem itself too
        res["cudamem"] = float(c.copy_to_host().sum())
        del a, b
        gc.collect()
        cuda.current_context().deallocations.clear()
        res["after"] = cudamem.memory_stats()["by_client"]["numba"]
        print(json.dumps(res))
"""


@pytest.mark.gpu
@pytest.mark.parametrize("cudamem_mm", [None, "pool"])
@pytest.mark.parametrize("import_cudamem_first", [True, False])
def test_numba_to_device_with_the_variable(import_cudamem_first,
                                           cudamem_mm):
    if SIMULATOR:
        pytest.skip("numba's contexts need a driver")
    first = "import cudamem\n" if import_cudamem_first else ""
    out = child(first, NUMBA_WORK,
                env=dict(PLUGIN_VAR, CUDAMEM_MEMORY_MANAGER=cudamem_mm))
    assert out["values"] and out["cudamem"] == 16.0
    assert out["held"] >= 8 << 20
    assert out["after"] == 0
    assert out["mm"] == ("PoolMemoryManager" if cudamem_mm == "pool"
                         else "DefaultMemoryManager")


@pytest.mark.gpu
@pytest.mark.parametrize("import_cudamem_first", [True, False])
def test_numba_to_device_with_set_memory_manager(import_cudamem_first):
    if SIMULATOR:
        pytest.skip("numba's contexts need a driver")
    first = "import cudamem\n" if import_cudamem_first else ""
    out = child(first, """
        import cudamem
        from numba import cuda
        cuda.set_memory_manager(cudamem.NumbaManager)
    """, NUMBA_WORK)
    assert out["values"] and out["cudamem"] == 16.0
    assert out["held"] >= 8 << 20
    assert out["after"] == 0
    assert out["mm"] == "DefaultMemoryManager"


@pytest.mark.parametrize("device", ["int", "CUdevice"])
def test_plugin_on_a_context_numba_did_not_make(device):
    need_numba()
    """numba's context of a primary context another library made current
    holds the driver's device handle, not a numba Device: the plugin
    takes its ordinal from that (numba's Test3rdPartyContext)."""
    code = SHIM + textwrap.dedent("""
        import json, sys, types
        import cudamem
        if sys.argv[1] == "CUdevice":
            from cuda.bindings import driver as cu
            dev = cu.CUdevice(0)
        else:
            dev = 0
        mm = cudamem.NumbaManager(context=types.SimpleNamespace(device=dev))
        mm.initialize()
        mp = mm.memalloc(4096)
        print(json.dumps({
            "held": cudamem.memory_stats()["by_client"]["numba"]}))
    """)
    if device == "CUdevice":
        r = run_child("import cuda.bindings.driver\n", check=False,
                      timeout=60)
        if r.returncode != 0:
            pytest.skip("cuda.bindings is not importable here")
    r = run_child(code, args=[device], timeout=120,
                  env={"CUDAMEM_TEST_ISOLATED": "1"})
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["held"] == 4096
