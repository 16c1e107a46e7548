# SPDX-License-Identifier: MIT
"""The backend gates, and test modules that run in a process of their own
on a GPU.

Switching memory managers needs close(), which resets the primary
context; on a GPU other libraries of the test process (CuPy, PyTorch)
share that context, so there such a module runs again in a child process
(CUDAMEM_TEST_ISOLATED=1) and its tests are skipped in the parent.
"""

import contextlib
import gc
import os
import subprocess
import sys

import pytest

import cudamem

SIMULATOR = os.environ.get("CUDAMEM_SIMULATOR", "0") not in ("0", "")
ISOLATED = os.environ.get("CUDAMEM_TEST_ISOLATED") == "1"


def skip_unless_own_process(request, runner):
    """For an autouse fixture: skip the test on a GPU unless this is the
    module's own process; the test whose name starts with ``runner`` (the
    one that starts that process) always runs."""
    if request.node.name.startswith(runner):
        return
    if not (SIMULATOR or ISOLATED):
        pytest.skip("runs in its own process on a GPU")


def run_module_in_a_child(path, timeout=600, workers=1):
    """Run the test module at ``path`` under pytest in a child process of
    its own; the test fails with the child's output when the child does,
    or when it runs past ``timeout`` seconds (its output so far then says
    where it was: the child runs verbosely, each test under a limit of its
    own where pytest-timeout is installed, and lists its slowest tests).
    The test that calls this needs a pytest-timeout mark above
    ``timeout``.  ``workers`` > 1 runs the module's tests in that many
    processes (pytest-xdist, where installed): only for a module whose
    tests read nothing device-wide (each process has its own context and
    limit).  Skipped where the tests already run in this process."""
    if SIMULATOR or ISOLATED:
        pytest.skip("already in a process of its own")
    env = dict(os.environ, CUDAMEM_TEST_ISOLATED="1")
    args = [sys.executable, "-m", "pytest", "-v", "-x", "-p",
            "no:cacheprovider", "--durations=10", str(path)]
    try:
        import pytest_timeout  # noqa: F401
        args.insert(-1, "--timeout=%d" % max(30, timeout // 4))
    except ImportError:
        pass
    if workers > 1:
        try:
            import xdist  # noqa: F401
            args[-1:-1] = ["-n", str(workers)]
        except ImportError:
            pass
    try:
        p = subprocess.run(args, env=env, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout or b""
        if isinstance(out, bytes):
            out = out.decode(errors="replace")
        pytest.fail("the child ran past %d s; its output so far:\n%s"
                    % (timeout, out[-6000:]))
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-2000:]
    print(p.stdout[-3000:])


def use_manager(kind):
    """A fresh context whose manager is kind (contexts choose theirs when
    they are made, so the current one is closed first)."""
    cudamem.close()
    cudamem.set_memory_manager(kind)
    return cudamem.current_context()


@contextlib.contextmanager
def manager_context(kind):
    """A fresh context of manager kind for the block; after it, garbage
    collected, the context closed and the default manager back."""
    ctx = use_manager(kind)
    yield ctx
    gc.collect()
    cudamem.close()
    cudamem.set_memory_manager("default")


def limit_device_memory_on_a_gpu(env, limit):
    """Hold a child started with ``env`` to a device memory limit of
    ``limit`` (CUDAMEM_DEVICE_MEMORY_LIMIT's spelling) when it runs on a
    GPU, unless env already names one: no case of it can take the card,
    and an absurd request fails at the limit, at once, whatever the
    card's size.  On the simulator the device is the child's own arena
    (often smaller than the limit), so nothing is set.  Returns env."""
    if env.get("CUDAMEM_SIMULATOR", "0") in ("0", ""):
        env.setdefault("CUDAMEM_DEVICE_MEMORY_LIMIT", limit)
    return env
