# SPDX-License-Identifier: MIT
"""The return check of the debug build (csrc/driver/retcheck.c).

Built with CUDAMEM_DEBUG=1, every C function Python can call is wrapped
in a check that it returns NULL (or -1) exactly when it has set an
exception; a break aborts the process, naming the function.  These tests
run on the debug build (.ci/run's sanitizer step builds it and runs the
whole suite, these tests included, under it) and are skipped on the
normal build, which has no check and none of the debug functions (one
test checks that).
"""

import types

import pytest
from helpers import run_child

from cudamem import _core

DEBUG = hasattr(_core, "_debug_checked")

debug_only = pytest.mark.skipif(
    not DEBUG, reason="needs the debug build (CUDAMEM_DEBUG=1)")


@pytest.mark.skipif(DEBUG, reason="the debug build")
def test_the_normal_build_has_no_check():
    # Nothing of the check is compiled in: no debug functions, and the
    # module's functions are the plain ones.
    assert not [n for n in dir(_core) if n.startswith("_debug_")]


@debug_only
@pytest.mark.parametrize("fn, what", [
    ("_debug_return_null_without_error",
     "returned NULL without setting an exception"),
    ("_debug_return_value_with_error",
     "returned a value with an exception set"),
])
def test_a_broken_entry_point_aborts_naming_it(fn, what):
    p = run_child("""
        import cudamem
        from cudamem import _core
        _core.%s()
        print("not reached")
    """ % fn, check=False, allow_signals=["SIGABRT"])
    assert p.signame == "SIGABRT", p.output
    assert "not reached" not in p.stdout
    assert "cudamem: cudamem._core.%s %s" % (fn, what) in p.stderr, p.stderr
    if fn == "_debug_return_value_with_error":
        assert "RuntimeError('set on purpose')" in p.stderr, p.stderr


@debug_only
def test_the_check_lets_correct_calls_through():
    # Both sides of the rule, through a method, a getter, a slot and a
    # module function: a value with no exception, NULL with one.
    import numpy as np

    import cudamem as cuda

    d = cuda.to_device(np.arange(6.0))
    assert d.shape == (6,)
    assert d[2] == 2.0
    assert len(d) == 6
    with pytest.raises(IndexError):
        d[10]
    with pytest.raises(TypeError):
        cuda.device_array(nope=1)
    with pytest.raises(AttributeError):
        assert cuda.get_current_device().no_such_attribute


def _python_visible_entries():
    """The qualified names of what Python reaches in _core: its builtin
    functions, and the methods, getset attributes and slots of its
    types."""
    names = set()
    for name, obj in vars(_core).items():
        if isinstance(obj, types.BuiltinFunctionType) \
                and obj.__self__ is _core:
            names.add("cudamem._core." + name)
        elif isinstance(obj, type) and obj.__module__.startswith("cudamem"):
            qual = "%s.%s" % (obj.__module__, obj.__qualname__)
            for attr, v in vars(obj).items():
                if isinstance(v, (types.MethodDescriptorType,
                                  types.GetSetDescriptorType)):
                    names.add("%s.%s" % (qual, attr))
    return names


@debug_only
def test_every_entry_point_is_checked():
    checked = set(_core._debug_checked())
    missing = sorted(_python_visible_entries() - checked)
    assert missing == []
    # Slots and the vectorcall of the array type are wrapped too.
    for name in ["cudamem.DeviceNDArray.tp_new",
                 "cudamem.DeviceNDArray.tp_vectorcall",
                 "cudamem.DeviceNDArray.mp_subscript",
                 "cudamem.DeviceNDArray.mp_ass_subscript",
                 "cudamem.DeviceNDArray.mp_length",
                 "cudamem.Device.tp_getattro", "cudamem.Device.tp_hash",
                 "cudamem.Stream.tp_repr", "cudamem.Event.am_await",
                 "cudamem.HostAllocation.bf_getbuffer",
                 "cudamem.Kernel.tp_call"]:
        assert name in checked
