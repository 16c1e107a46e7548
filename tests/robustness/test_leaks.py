# SPDX-License-Identifier: MIT
"""Leak and shutdown scripts (tests/robustness/leaks/), each in a
subprocess."""

import subprocess
import sys

import pytest

from helpers import TESTS

# Each test only runs children (tests/helpers/ahead.py).
pytestmark = pytest.mark.ahead

LEAKS = TESTS / "robustness" / "leaks"


def run(script, *args):
    return subprocess.run([sys.executable, str(LEAKS / script), *args],
                          capture_output=True, text=True, timeout=600)


@pytest.mark.leaks
def test_exit_with_live_objects_is_clean():
    p = run("exit_with_live_objects.py")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout == "" and p.stderr == ""


@pytest.mark.leaks
def test_hot_paths_do_not_leak():
    p = run("hot_path_cycles.py", "20000")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip() == "OK", p.stdout + p.stderr


@pytest.mark.leaks
@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="IPC needs Linux")
def test_async_ipc_does_not_leak():
    p = run("async_ipc_cycles.py", "2000")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip().startswith("OK"), p.stdout + p.stderr
    assert p.stderr == "", p.stderr


@pytest.mark.leaks
@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="IPC needs Linux")
def test_vmm_ipc_does_not_leak():
    p = run("async_ipc_cycles.py", "1000", "vmm")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip().startswith("OK"), p.stdout + p.stderr
    assert p.stderr == "", p.stderr
