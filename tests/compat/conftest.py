# SPDX-License-Identifier: MIT
"""Differential tests of numba.cuda's lower layer (contexts, memory
pointers, the driver module's helpers, EMM plugins).

Every test here runs against cudamem by default and against numba.cuda
itself with ``CUDAMEM_COMPAT_TARGET=numba``: the tests assert numba's
behaviour, so one that numba fails is a wrong test.  Tests of cudamem's
deliberate differences carry ``@pytest.mark.cudamem_only(reason)`` and
are skipped for numba.  Without numba the numba run skips everything.
"""

import os
import warnings

import numpy as np

import pytest

TARGET = os.environ.get("CUDAMEM_COMPAT_TARGET", "cudamem")
HERE = os.path.dirname(os.path.abspath(__file__))
NUMBA = TARGET == "numba"
_why_not = None

if TARGET not in ("cudamem", "numba"):
    raise RuntimeError("CUDAMEM_COMPAT_TARGET must be 'cudamem' or 'numba', "
                       "not %r" % TARGET)
if NUMBA:
    if not hasattr(np, "row_stack"):   # numba-cuda still names it
        np.row_stack = np.vstack
    try:
        # numba's import warns about NumPy deprecations, which the
        # suite's filterwarnings would turn into errors.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from numba import cuda as _cuda
            import numba.cuda.cudadrv.driver
    except Exception as e:  # noqa: BLE001 - any failure: skip the run
        _cuda = None
        _why_not = "numba.cuda is not importable: %s: %s" % (
            type(e).__name__, e)
    else:
        # These tests pin numba-cuda on cuda.bindings, its default: on its
        # ctypes fallback pointers and handles are ctypes objects (int()
        # of one parses its bytes) and the plugin tests' raw allocator
        # differs.  That happens when numba-cuda cannot use the installed
        # cuda-bindings; say so instead of failing a third of the tests.
        if not getattr(numba.cuda.cudadrv.driver, "USE_NV_BINDING", True):
            raise RuntimeError(
                "numba-cuda runs on its ctypes binding here (it could not "
                "use cuda.bindings, or NUMBA_CUDA_USE_NVIDIA_BINDING=0): "
                "the compat tests pin numba-cuda on cuda.bindings")
else:
    import cudamem as _cuda


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "cudamem_only(reason): one of cudamem's documented "
        "differences from numba; skipped for numba")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if not str(item.fspath).startswith(HERE + os.sep):
            continue
        if _cuda is None:
            item.add_marker(pytest.mark.skip(reason=_why_not))
            continue
        if NUMBA:
            # numba's own warnings (deprecations, performance hints) are
            # not what these tests check
            item.add_marker(pytest.mark.filterwarnings("ignore"))
        mark = item.get_closest_marker("cudamem_only")
        if NUMBA and mark is not None:
            reason = mark.args[0] if mark.args else "cudamem only"
            item.add_marker(pytest.mark.skip(
                reason="cudamem's difference: %s" % reason))


def pytest_report_header(config):
    return "compat target: %s" % TARGET


@pytest.fixture
def cuda():
    """The implementation under test: cudamem, or numba.cuda."""
    return _cuda


@pytest.fixture
def driver(cuda):
    """Its ``cudadrv.driver`` module."""
    return cuda.cudadrv.driver


@pytest.fixture
def context(cuda):
    """The current context."""
    return cuda.current_context()


@pytest.fixture
def raw(cuda):
    """(alloc, free) of raw device memory outside any memory manager, the
    kind of allocator an EMM plugin wraps."""
    if NUMBA:
        drv = cuda.cudadrv.driver.driver
        return (lambda n: int(drv.cuMemAlloc(n)),
                lambda p: drv.cuMemFree(p))
    from cudamem import _core

    return _core._device_alloc, _core._device_free


@pytest.fixture(autouse=True)
def _leave_queues_empty():
    """Run the deallocations a test leaves pending, so that the tests
    after it (here and elsewhere in the suite) start from empty queues."""
    yield
    if _cuda is None:
        return
    import gc

    gc.collect()
    ctx = _cuda.current_context()
    ctx.deallocations.clear()
    ctx.memory_manager.deallocations.clear()
