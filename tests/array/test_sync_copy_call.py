# SPDX-License-Identifier: MIT
"""The test aid ``_core._sync_copy_call`` (issue 32): a synchronous copy
(no stream) between pageable host memory and a device array may be made
by the asynchronous call on the default stream, which the driver returns
from once it has taken a pageable source or filled a pageable
destination.  Whatever the mode, every kind of host memory must give the
same results and numba's semantics: page-locked, mapped, managed and
registered memory keep the synchronous call (an asynchronous copy of
page-locked memory would return before it ran).

The simulator models the driver here (csrc/sim/copy.c): an asynchronous
copy consumes a pageable source and fills a pageable destination before
it returns, and leaves page-locked memory to the stream; with
CUDAMEM_SIM_DELAY_US a queued copy runs late enough to be seen.
"""

import numpy as np
import pytest

import cudamem as cuda
from cudamem import _core

MODES = ("sync", "async", "async_wait")
KINDS = ("pageable", "pageable slice", "pinned", "mapped", "managed",
         "registered")
N = 256


@pytest.fixture(params=MODES)
def mode(request):
    old = _core._sync_copy_call(request.param)
    yield request.param
    _core._sync_copy_call(old)


@pytest.fixture
def host(request, ctx):
    """A factory of host arrays of one kind, kept alive for the test (a
    registered array stays registered until the test ends)."""
    import contextlib

    stack = contextlib.ExitStack()

    def make(kind, values):
        if kind == "pageable":
            a = np.empty(N, np.float32)
        elif kind == "pageable slice":
            a = np.empty(N + 3, np.float32)[3:]
        elif kind == "pinned":
            a = cuda.pinned_array(N, np.float32)
        elif kind == "mapped":
            a = cuda.mapped_array(N, np.float32)
        elif kind == "managed":
            a = cuda.managed_array(N, np.float32)
        else:
            a = np.empty(N, np.float32)
            stack.enter_context(cuda.pinned(a))
        a[:] = values
        return a

    with stack:
        yield make


def test_the_switch():
    old = _core._sync_copy_call()
    try:
        assert _core._sync_copy_call("sync") == old
        assert _core._sync_copy_call("async") == "sync"
        assert _core._sync_copy_call("async_wait") == "async"
        assert _core._sync_copy_call(None) == "async_wait"
        # One mode per direction: host to device / device to host.
        assert _core._sync_copy_call("async/async_wait") == "async_wait"
        assert _core._sync_copy_call() == "async/async_wait"
        assert _core._sync_copy_call("sync/sync") == "async/async_wait"
        assert _core._sync_copy_call() == "sync"
        for bad in ("later", "", "async/", "/sync", "sync/async/sync",
                    "sync /async"):
            with pytest.raises(ValueError, match="'sync', 'async' or"):
                _core._sync_copy_call(bad)
        assert _core._sync_copy_call() == "sync"     # unchanged by those
        with pytest.raises(TypeError, match="must be a str"):
            _core._sync_copy_call(1)
        with pytest.raises(TypeError, match="at most one"):
            _core._sync_copy_call("sync", "async")
    finally:
        _core._sync_copy_call(old)


def test_default_is_async_to_the_device_and_sync_to_the_host():
    """The defaults the H200's rows chose (docs/design.md, "Synchronous
    copies of pageable memory"): the asynchronous call for a synchronous
    copy of pageable memory to the device, the synchronous call back."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c",
         "from cudamem import _core; print(_core._sync_copy_call())"],
        capture_output=True, text=True, check=True).stdout
    assert out.strip() == "async/sync"


@pytest.mark.parametrize("value, modes", [("sync", "sync"),
                                          ("sync/async_wait",
                                           "sync/async_wait"),
                                          ("async/async", "async"),
                                          ("", "async/sync")])
def test_modes_from_the_environment(value, modes):
    """A new process reads the modes from CUDAMEM_SYNC_COPY_CALL (for an
    A/B of them on a GPU); unset or empty, the defaults."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, CUDAMEM_SYNC_COPY_CALL=value)
    out = subprocess.run(
        [sys.executable, "-c",
         "from cudamem import _core; print(_core._sync_copy_call())"],
        capture_output=True, text=True, check=True, env=env).stdout
    assert out.split() == [modes]


def test_bad_mode_in_the_environment():
    import os
    import subprocess
    import sys

    env = dict(os.environ, CUDAMEM_SYNC_COPY_CALL="later")
    p = subprocess.run([sys.executable, "-c", "import cudamem"],
                       capture_output=True, text=True, env=env)
    assert p.returncode != 0
    assert "CUDAMEM_SYNC_COPY_CALL=later" in p.stderr


@pytest.mark.parametrize("kind", KINDS)
def test_same_results_every_kind(mode, host, kind):
    want = np.arange(N, dtype=np.float32)
    src = host(kind, want)
    d = cuda.device_array(N, np.float32)
    d.copy_to_device(src)
    out = host(kind, -1)
    assert d.copy_to_host(out) is out
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(d.copy_to_host(), want)
    e = cuda.to_device(src)
    np.testing.assert_array_equal(e.copy_to_host(), want)
    # Strided and 0-size copies take their own paths in every mode.
    np.testing.assert_array_equal(d[::2].copy_to_host(), want[::2])
    d[:0].copy_to_device(src[:0])


def _which_call(fn, direction):
    """The entry point fn's copy went through: cu<name> of the async call
    is made to fail once, so that it names itself if it is reached."""
    name = "MemcpyHtoDAsync" if direction == "htod" else "MemcpyDtoHAsync"
    _core._sim_inject(name, 1, 999)        # CUDA_ERROR_UNKNOWN
    try:
        fn()
    except cuda.CudaAPIError as e:
        assert "cu" + name in str(e), e
        return "async"
    finally:
        _core._sim_inject(name, 0, 0)
    return "sync"


@pytest.mark.sim
@pytest.mark.parametrize("kind", KINDS)
def test_async_call_only_for_pageable_memory(mode, host, kind):
    pageable = kind.startswith("pageable")
    want = "async" if mode != "sync" and pageable else "sync"
    d = cuda.device_array(N, np.float32)
    src = host(kind, 1)
    assert _which_call(lambda: d.copy_to_device(src), "htod") == want
    out = host(kind, 0)
    assert _which_call(lambda: d.copy_to_host(out), "dtoh") == want
    # A new host array is NumPy's (pageable) memory.
    new = "sync" if mode == "sync" else "async"
    assert _which_call(d.copy_to_host, "dtoh") == new
    # With a stream the copy is asynchronous in every mode.
    s = cuda.stream()
    assert _which_call(lambda: d.copy_to_device(src, stream=s),
                       "htod") == "async"
    s.synchronize()


def test_the_size_limit_switch():
    old = _core._sync_async_max()
    try:
        assert _core._sync_async_max(16 << 10) == old
        assert _core._sync_async_max(0) == 16 << 10
        assert _core._sync_async_max(None) == 0
        assert _core._sync_async_max() is None
        for bad in (-1, 2 ** 64):
            with pytest.raises(ValueError, match="None or an int"):
                _core._sync_async_max(bad)
        with pytest.raises(TypeError):
            _core._sync_async_max("1K")
        with pytest.raises(TypeError, match="at most one"):
            _core._sync_async_max(1, 2)
        assert _core._sync_async_max() is None
    finally:
        _core._sync_async_max(old)


@pytest.mark.sim
def test_async_call_only_up_to_the_size_limit(ctx):
    """_sync_async_max bounds the copies the asynchronous modes take: a
    larger one of pageable memory gets the synchronous call, in both
    directions; at the limit, the asynchronous one."""
    old = _core._sync_copy_call("async")
    try:
        d = cuda.device_array(N, np.float32)
        src = np.ones(N, np.float32)
        out = np.zeros(N, np.float32)
        for limit, want in ((4 * N - 1, "sync"), (4 * N, "async"),
                            (0, "sync"), (None, "async")):
            was = _core._sync_async_max(limit)
            try:
                assert _which_call(lambda: d.copy_to_device(src),
                                   "htod") == want, limit
                assert _which_call(lambda: d.copy_to_host(out),
                                   "dtoh") == want, limit
            finally:
                _core._sync_async_max(was)
        np.testing.assert_array_equal(d.copy_to_host(), src)
    finally:
        _core._sync_copy_call(old)


@pytest.mark.parametrize("value, limit", [("16K", 16 << 10),
                                          ("1048576", 1 << 20),
                                          ("", None)])
def test_size_limit_from_the_environment(value, limit):
    import os
    import subprocess
    import sys

    env = dict(os.environ, CUDAMEM_SYNC_ASYNC_MAX=value)
    out = subprocess.run(
        [sys.executable, "-c",
         "from cudamem import _core; print(_core._sync_async_max())"],
        capture_output=True, text=True, check=True, env=env).stdout
    assert out.split() == [str(limit)]
    env["CUDAMEM_SYNC_ASYNC_MAX"] = "lots"
    p = subprocess.run([sys.executable, "-c", "import cudamem"],
                       capture_output=True, text=True, env=env)
    assert p.returncode != 0
    assert "CUDAMEM_SYNC_ASYNC_MAX=lots" in p.stderr


@pytest.mark.sim
def test_device_side_not_plain_device_memory_keeps_the_sync_call(mode, ctx):
    """A device array over managed memory (here: the CUDA Array Interface
    of a managed array) is read by the host directly: a copy into it must
    have landed when it returns, as the synchronous call does."""
    m = cuda.managed_array(N, np.float32)
    m[:] = 0
    d = cuda.as_cuda_array(m)
    h = np.arange(N, dtype=np.float32)
    assert _which_call(lambda: d.copy_to_device(h), "htod") == "sync"
    np.testing.assert_array_equal(m, h)


# The semantics with the copies made late: each line of the child checks
# one promise of a synchronous copy; "control" shows that the simulator
# would catch the wrong call (an asynchronous copy of pinned memory runs
# after the call returned).
_SEMANTICS = """
import sys
import numpy as np
import cudamem as cuda
from cudamem import _core
_core._sync_copy_call(sys.argv[1])
N = 256
want = np.arange(N, dtype=np.float32)

def check(label, got):
    ok = bool((np.asarray(got) == want).all())
    print(label, "ok" if ok else "WRONG")

for kind in ("pageable", "pinned", "mapped", "registered"):
    if kind == "pageable" or kind == "registered":
        src = np.empty(N, np.float32)
        dst = np.empty(N, np.float32)
    elif kind == "pinned":
        src = cuda.pinned_array(N, np.float32)
        dst = cuda.pinned_array(N, np.float32)
    else:
        src = cuda.mapped_array(N, np.float32)
        dst = cuda.mapped_array(N, np.float32)
    reg = cuda.pinned(src, dst) if kind == "registered" else None
    if reg is not None:
        reg.__enter__()
    src[:] = want
    d = cuda.device_array(N, np.float32)
    d.copy_to_device(src)
    src[:] = -1                    # taken already: no effect
    check(kind + " source reused", d.copy_to_host())
    dst[:] = -1
    d.copy_to_host(dst)
    check(kind + " destination filled", dst)     # read at once
    if reg is not None:
        reg.__exit__(None, None, None)

m = cuda.managed_array(N, np.float32)
m[:] = 0
cuda.as_cuda_array(m).copy_to_device(want.copy())
check("managed destination filled", m)
d = cuda.to_device(want)
check("new host array filled", d.copy_to_host())

p = cuda.pinned_array(N, np.float32)
p[:] = want
s = cuda.stream()
d.copy_to_device(p, stream=s)
p[:] = -1
s.synchronize()
print("control", "caught" if (d.copy_to_host() == -1).all() else "MISSED")
"""


@pytest.mark.ahead
@pytest.mark.sim
@pytest.mark.parametrize("ptds", [False, True], ids=["legacy", "ptds"])
@pytest.mark.parametrize("m", MODES)
def test_semantics_with_late_copies(m, ptds):
    from helpers import run_child

    env = {"CUDAMEM_SIM_DELAY_US": "20000",
           "CUDAMEM_PER_THREAD_DEFAULT_STREAM": "1" if ptds else None}
    p = run_child(_SEMANTICS, args=(m,), env=env)
    lines = p.stdout.splitlines()
    assert lines[-1] == "control caught", p.stdout
    assert len(lines) == 11 and all(x.endswith(" ok") for x in lines[:-1]), \
        p.stdout


@pytest.mark.parametrize("m", MODES)
def test_copy_to_host_waits_for_the_default_streams_work(m, ctx):
    """Whatever the call, a copy into pageable memory returns with the
    data, after the default stream's earlier work: a large device copy
    queued on it, then the last 1 KiB of its destination read with no
    stream.  On a GPU this checks what the documentation no longer
    promises for cuMemcpyDtoHAsync ('async' mode)."""
    n = (64 << 20) // 4
    src = cuda.to_device(np.arange(n, dtype=np.float32))
    dst = cuda.device_array(n, np.float32)
    dst[-N:].copy_to_device(np.zeros(N, np.float32))
    old = _core._sync_copy_call(m)
    try:
        for _ in range(3):
            dst.copy_to_device(src, stream=cuda.legacy_default_stream())
            out = np.zeros(N, np.float32)
            dst[-N:].copy_to_host(out)
            np.testing.assert_array_equal(
                out, np.arange(n - N, n, dtype=np.float32))
            dst[-N:].copy_to_device(np.zeros(N, np.float32))
    finally:
        _core._sync_copy_call(old)
