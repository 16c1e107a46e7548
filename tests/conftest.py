# SPDX-License-Identifier: MIT
"""Shared fixtures: the backend (real GPU when one works, else the CPU
simulator), a clean context per test, and the ``impl`` switch that runs a
test against cudamem and, where installed, numba.cuda.

The backend is chosen before anything uses a device
(cudamem/tests/_backend.py, shared with the validation suite's
conftest.py): if CUDAMEM_SIMULATOR is unset and no driver initialises,
the simulator is selected.
"""

import gc
import multiprocessing
import os
import sys
import threading

import pytest

# The test folders (memory/, array/, runtime/, ...) import the shared
# helpers package as ``helpers``: tests/ goes first on the path.
_TESTS = os.path.dirname(os.path.abspath(__file__))
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from cudamem.tests._backend import choose_backend  # noqa: E402

SIMULATOR = choose_backend()

import cudamem  # noqa: E402
from helpers import ahead  # noqa: E402

# CUDAMEM_TEST_INSTALLED_AT=DIR: the suite runs against an installed
# cudamem, which must be imported from under DIR (.ci/wheel sets it to the
# fresh virtual environment that the wheel went into): a cudamem from the
# source tree stops the session.
_INSTALLED_AT = os.environ.get("CUDAMEM_TEST_INSTALLED_AT")
if _INSTALLED_AT:
    _got = os.path.realpath(cudamem.__file__)
    if not _got.startswith(os.path.realpath(_INSTALLED_AT) + os.sep):
        raise pytest.UsageError(
            "cudamem was imported from %s, not from under "
            "CUDAMEM_TEST_INSTALLED_AT=%s" % (_got, _INSTALLED_AT))


def pytest_report_header(config):
    where = "cudamem %s from %s" % (cudamem.__version__,
                                   os.path.dirname(cudamem.__file__))
    if SIMULATOR:
        return [where, "cudamem backend: CPU simulator (CUDAMEM_SIMULATOR=1)"]
    dev = cudamem.get_current_device()
    return [where, "cudamem backend: CUDA driver %d.%d, device %s" % (
        cudamem.driver_version() + (dev.name,))]


def pytest_addoption(parser):
    parser.addoption(
        "--sim-devices", type=int, default=None, metavar="N",
        help="run on N simulated devices (sets CUDAMEM_SIM_DEVICES; the "
             "same as exporting it)")


def device_count():
    """How many devices the backend presents (0 when none works)."""
    try:
        return cudamem._core._device_count()
    except Exception:  # noqa: BLE001 - no driver: no device
        return 0


# The quick subset, ``pytest -m quick``: a few files of every layer
# (arrays and copies, memory and its managers, contexts, streams and
# errors, numba compatibility, the driver-call checks, the command line,
# packaging and the documents), under a minute on 2 cores on the
# simulator.  The full suite runs everything, these included.
QUICK = frozenset((
    "array/test_device_array.py",
    "array/test_transfers.py",
    "array/test_indexing.py",
    "array/test_cuda_array_interface.py",
    "memory/test_pool.py",
    "memory/test_pinned.py",
    "memory/test_deallocations.py",
    "memory/test_managed.py",
    "memory/test_mapped.py",
    "runtime/test_context.py",
    "runtime/test_events.py",
    "runtime/test_errors.py",
    "runtime/test_cudadrv.py",
    "compat/test_compat_arrays.py",
    "compat/test_compat_devices.py",
    "robustness/test_retcheck.py",
    "tools/test_cli_backend.py",
    "tools/test_docs.py",
    "tools/test_packaging.py",
))


def pytest_collection_modifyitems(config, items):
    ndev = None
    for item in items:
        if item.get_closest_marker("ahead"):
            why = ahead.why_not(item)
            if why:
                raise pytest.UsageError(
                    "%s is marked ahead, but %s (tests/helpers/ahead.py)"
                    % (item.nodeid, why))
        rel = os.path.relpath(str(item.path), _TESTS).replace(os.sep, "/")
        if rel in QUICK:
            item.add_marker(pytest.mark.quick)
        if SIMULATOR and item.get_closest_marker("gpu"):
            item.add_marker(pytest.mark.skip(reason="needs a real GPU"))
        if not SIMULATOR and item.get_closest_marker("sim"):
            item.add_marker(pytest.mark.skip(reason="simulator only"))
        if item.get_closest_marker("multi_gpu"):
            if ndev is None:
                ndev = device_count()
            if ndev < 2:
                item.add_marker(pytest.mark.skip(
                    reason="needs 2 or more devices (%d here; on the "
                           "simulator set CUDAMEM_SIM_DEVICES=2 or pass "
                           "--sim-devices=2)" % ndev))


def pytest_configure(config):
    n = config.getoption("--sim-devices")
    if n is not None:
        # Read by the simulator at its cuInit, which has not run yet; child
        # processes inherit it.
        os.environ["CUDAMEM_SIM_DEVICES"] = str(n)
    try:
        multiprocessing.set_start_method("spawn")
    except RuntimeError:
        pass


# The pool of the tests marked ahead (tests/helpers/ahead.py); None when
# they run one by one.
_AHEAD = None


def _will_skip(item):
    """Whether item's skip marks skip it (pytest evaluates them again at
    its setup)."""
    try:
        from _pytest.skipping import evaluate_skip_marks
        return evaluate_skip_marks(item) is not None
    except Exception:  # noqa: BLE001 - let pytest say it at setup
        return True


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    if _AHEAD is None or not pyfuncitem.get_closest_marker("ahead"):
        return None
    _AHEAD.outcome(pyfuncitem, _will_skip)
    return True


@pytest.hookimpl(hookwrapper=True)
def pytest_runtestloop(session):
    global _AHEAD
    # In a pytest-xdist worker a run of marked tests may hold tests that
    # another worker was given: there they run one by one.
    n = 1 if hasattr(session.config, "workerinput") else ahead.workers(
        SIMULATOR)
    _AHEAD = ahead.Pool(n) if n > 1 else None
    try:
        yield
    finally:
        if _AHEAD is not None:
            _AHEAD.close()
        _AHEAD = None


# A full collection walks every object the collector tracks, and this
# process holds many for good (the collected tests, the modules they
# import, their caches): each gc.collect() of a test, or of the library
# before it reports an out-of-memory error, took about 0.1 s, a fifth of
# the suite's time.  At the start of each test module what is alive (once
# collected) is moved out of the collector's view (gc.freeze()), and put
# back at the next module's start: a collection inside a module walks
# only what the module made, and everything is collected again at the
# next module's start.
_FROZEN_AT = None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    global _FROZEN_AT
    module = item.module
    if module is not _FROZEN_AT:
        _FROZEN_AT = module
        gc.unfreeze()
        gc.collect()
        gc.freeze()


@pytest.fixture(scope="session")
def simulator():
    """True on the simulator backend, False on a real GPU."""
    return SIMULATOR


@pytest.fixture
def ctx():
    """The current context for the test; the thread's context stack is the
    same after the test as before it."""
    from cudamem import _core

    before = _core._current_device_id()
    c = cudamem.current_context()
    yield c
    after = _core._current_device_id()
    if before is None and after is not None:
        c.synchronize()


@pytest.fixture
def memq(ctx):
    """The context's queue of deferred memory frees, emptied before and
    after the test, with numba's default thresholds (10 entries, 0.2 of
    the device's memory)."""
    from cudamem import _core

    q = ctx.memory_manager.deallocations
    q.clear()
    _core._set_dealloc_config(10, 0.2)
    yield q
    _core._set_dealloc_config(10, 0.2)
    q.clear()


@pytest.fixture(scope="session")
def bad_handle():
    """An address no stream object can be at: a page of this process that
    cannot be read, held for the session (a fixed number may lie in the
    heap, and a readable address that is not a stream crashes the driver,
    which reads it unchecked)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                          ctypes.c_int, ctypes.c_int, ctypes.c_long]
    return libc.mmap(None, mmap.PAGESIZE, 0, 0x22, -1, 0)  # PROT_NONE


@pytest.fixture(params=["cudamem", "numba"])
def impl(request):
    """cudamem, or numba.cuda when it is installed and usable here."""
    if request.param == "cudamem":
        return cudamem
    if SIMULATOR:
        pytest.skip("numba.cuda is compared on a real GPU only")
    import numpy as np

    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack
    numba_cuda = pytest.importorskip("numba.cuda")
    return numba_cuda


@pytest.fixture(autouse=True)
def _no_close_on_the_main_thread(monkeypatch):
    """On a GPU, close() on the main thread resets the primary context that
    CuPy, PyTorch and numba in this process share, so their cached memory
    goes stale and later tests fail far from the cause.  A test that needs
    it runs it in a child process (CUDAMEM_TEST_ISOLATED=1 marks one that
    is a process of its own)."""
    if SIMULATOR or os.environ.get("CUDAMEM_TEST_ISOLATED"):
        yield
        return
    real = cudamem.close

    def guarded():
        if threading.current_thread() is threading.main_thread():
            pytest.fail("close() on the main thread of the test process "
                        "resets the primary context the other libraries "
                        "share: run it in a child process", pytrace=False)
        real()

    monkeypatch.setattr(cudamem, "close", guarded)
    yield

