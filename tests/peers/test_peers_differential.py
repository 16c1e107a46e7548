# SPDX-License-Identifier: MIT
"""CuPy and PyTorch programs compute the same results on cudamem's memory
as on their own allocators.

Each pairing runs in fresh child processes: the program on the library's
own allocator, then on cudamem's (``use_with_cupy``, ``use_with_torch``,
``torch_mempool``) under one of cudamem's managers
(``CUDAMEM_MEMORY_MANAGER``: default, pool, async).  The records must
agree: ``bitwise`` steps byte for byte, ``close`` steps within the
tolerance tests/peers/peer_common.py gives (cupy_program.py and
torch_program.py say which step is which).  A failure names each step
that differed, with both runs' sums and first values.

On a GPU, with CUDAMEM_PEERS=1 (tests/peers/conftest.py):

    CUDAMEM_PEERS=1 python -m pytest tests/peers -v
"""

import os
import subprocess
import sys

import pytest

from helpers import child_env

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from peer_common import compare, last_json  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

MANAGERS = ("default", "pool", "async")


def run_program(script, allocator, manager, timeout=300):
    """The record ``script`` prints with ``--allocator allocator``, in a
    fresh process with CUDAMEM_MEMORY_MANAGER=manager (unset for the
    library's own allocator, where cudamem is not imported)."""
    env = child_env(CUDAMEM_SIMULATOR="0",
                    CUBLAS_WORKSPACE_CONFIG=":4096:8",
                    CUDAMEM_MEMORY_MANAGER=(
                        None if allocator in ("cupy", "torch")
                        else manager))
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    cmd = [sys.executable, os.path.join(HERE, script),
           "--allocator", allocator]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail("%s --allocator %s (manager %s) ran past %d s; its "
                    "output:\n%s" % (script, allocator, manager, timeout,
                                     (e.stderr or b"")[-3000:]),
                    pytrace=False)
    try:
        rec = last_json(p.stdout)
    except ValueError:
        pytest.fail("%s --allocator %s (manager %s) exited %d without a "
                    "record; stderr:\n%s" % (script, allocator, manager,
                                              p.returncode,
                                              p.stderr[-4000:]),
                    pytrace=False)
    if rec.get("error"):
        pytest.fail("%s --allocator %s (manager %s) failed at %s" % (
            script, allocator, manager, rec["error"]), pytrace=False)
    return rec


def check(ref, got, manager):
    if got.get("manager_in_use") is not None:
        assert got["manager_in_use"] == manager, (
            "cudamem used the %r manager, not %r" % (
                got["manager_in_use"], manager))
    problems, same_bytes = compare(ref, got)
    assert not problems, "\n".join(
        ["%d step(s) differ (%s on %s against %s, manager %s):" % (
            len(problems), got["library"], got["allocator"],
            ref["allocator"], manager)] + problems)
    print("%s/%s/%s: %d steps agree; close steps with equal bytes: %s" % (
        got["library"], got["allocator"], manager, len(got["steps"]),
        ", ".join(same_bytes) or "none"))


@pytest.mark.parametrize("manager", MANAGERS)
def test_cupy_program_on_cudamem(manager):
    pytest.importorskip("cupy")
    ref = run_program("cupy_program.py", "cupy", manager)
    got = run_program("cupy_program.py", "cudamem", manager)
    check(ref, got, manager)
    # What CuPy still holds through cudamem at the end (after the FFT
    # plan cache, which keeps work areas, is cleared): reported, as CuPy
    # may keep caches of its own.
    print("cupy bytes held through cudamem at the end: %s" % (
        got.get("cupy_bytes_after"),))


@pytest.mark.parametrize("allocator", ["cudamem", "mempool"])
@pytest.mark.parametrize("manager", MANAGERS)
def test_torch_program_on_cudamem(manager, allocator):
    torch = pytest.importorskip("torch")
    if allocator == "mempool" and not hasattr(torch.cuda, "MemPool"):
        pytest.skip("this PyTorch has no torch.cuda.MemPool")
    ref = run_program("torch_program.py", "torch", manager)
    got = run_program("torch_program.py", allocator, manager)
    check(ref, got, manager)
    assert got["torch_last_error"] is None
