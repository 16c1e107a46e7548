# SPDX-License-Identifier: MIT
"""The one-way boundary between the package and cudamem._core: C never
imports the package; the package registers at import what C uses
(``_core._register``).  Without that registration _core still imports,
and whatever needs a missing object raises RuntimeError naming it
instead of crashing.  Each case runs in a child that loads _core under a
bare stand-in package, so that cudamem/__init__.py never runs."""

import textwrap

import pytest

import cudamem
from cudamem import _core
from helpers.crashutil import run_child

# Loads cudamem._core without running cudamem/__init__.py (a bare package
# object over the same folder), so nothing is registered.
BARE = """
    import importlib.util
    import sys
    import types

    import numpy as np

    where = importlib.util.find_spec("cudamem").submodule_search_locations
    pkg = types.ModuleType("cudamem")
    pkg.__path__ = list(where)
    sys.modules["cudamem"] = pkg
    import cudamem._core as core

    def expect(fn, *, exc=RuntimeError, match):
        try:
            fn()
        except exc as e:
            assert match in str(e), (match, str(e))
            print("raised", type(e).__name__, str(e))
        else:
            raise AssertionError("no %s for %s" % (exc.__name__, match))
"""


def _bare(code):
    return run_child(textwrap.dedent(BARE) + textwrap.dedent(code),
                     timeout=120).stdout


def test_core_imports_without_the_package():
    out = _bare("""
        assert not hasattr(pkg, "device_array")   # __init__ did not run
        assert "cudamem._errors" not in sys.modules
        assert "cudamem._emm" not in sys.modules
        print("imported", core.__name__)
        """)
    assert "imported cudamem._core" in out


def test_missing_registration_names_what_is_missing():
    out = _bare("""
        expect(lambda: core.device_array(4), match="manager_for")
        # the rest with a stand-in for the manager only
        core._register(manager_for=lambda ctx: None)
        d = core.device_array(4)
        expect(lambda: d.split(2), match="api_split")
        expect(lambda: core.mapped_array(4), match="MappedNDArray")
        expect(lambda: core.managed_array(4), match="ManagedNDArray")
        ctx = core.current_context()
        expect(lambda: ctx.get_memory_info(), match="MemoryInfo")
        expect(lambda: ctx.memory_manager, match="DefaultMemoryManager")
        expect(lambda: d.get_ipc_handle(), match="MemoryPointer")
        # a driver error needs the exception class the package defines
        expect(lambda: core.device_array(1 << 50, dtype=np.uint8),
               match="CudaOutOfMemoryError")
        print("done")
        """)
    assert out.count("raised RuntimeError") == 8, out
    assert "is not registered" in out
    assert "done" in out


def test_register_checks_before_storing():
    out = _bare("""
        expect(lambda: core._register(nope=1), exc=TypeError,
               match="unexpected keyword argument 'nope'")
        expect(lambda: core._register(len), exc=TypeError,
               match="keyword arguments only")
        # one bad value: nothing of the call is stored
        expect(lambda: core._register(manager_for=lambda ctx: None,
                                      MappedNDArray=int),
               exc=TypeError, match="MappedNDArray must be a subclass of "
                                    "numpy.ndarray")
        expect(lambda: core.device_array(4), match="manager_for")
        expect(lambda: core._register(CudaAPIError=ValueError()),
               exc=TypeError, match="CudaAPIError must be an exception "
                                    "class")
        expect(lambda: core._register(IpcHandle=type("H", (), {})),
               exc=TypeError, match="_IpcHandleBase")
        print("done")
        """)
    assert "done" in out


def test_package_registers_what_c_uses():
    # Through the package every path above works and raises the
    # package's own classes.
    d = cudamem.device_array(4)
    assert len(list(d.split(2))) == 2
    info = cudamem.current_context().get_memory_info()
    assert isinstance(info, cudamem.MemoryInfo)
    with pytest.raises(cudamem.CudaOutOfMemoryError):
        cudamem.device_array(1 << 50, dtype="u1")
    with pytest.raises(TypeError, match="unexpected keyword"):
        _core._register(not_a_slot=None)
