# SPDX-License-Identifier: MIT
"""``python -m cudamem`` on a machine without a CUDA driver: the report,
``test`` and ``bench`` follow one rule (fall back to the simulator and
say so, unless the environment chose a backend) and the exit status the
module's docstring and the README give.

Each command runs in a fresh process whose driver library cannot be
loaded (CUDAMEM_DRIVER_LIBRARY names a file that does not exist), so
these tests see a machine without a driver on a GPU machine as well."""

import pathlib
import subprocess
import sys

import pytest

from helpers import ROOT, environ

# Each test only runs children (tests/helpers/ahead.py).
pytestmark = pytest.mark.ahead

NO_DRIVER = "/nonexistent/cudamem-test/libcuda.so.1"


def cli(*args, timeout=120, **env):
    """``python -m cudamem ARGS`` without a driver and with no backend
    chosen, env set over that (None removes a variable)."""
    e = dict(environ(), PYTHONPATH=str(ROOT),
             CUDAMEM_DRIVER_LIBRARY=NO_DRIVER)
    for name in ("CUDAMEM_SIMULATOR", "NUMBA_ENABLE_CUDASIM",
                 "NUMBA_DISABLE_CUDA", "CUDAMEM_SIM_DEVICES"):
        e.pop(name, None)
    for k, v in env.items():
        if v is None:
            e.pop(k, None)
        else:
            e[k] = v
    return subprocess.run([sys.executable, "-m", "cudamem", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env=e, cwd=str(ROOT))


def fell_back(p):
    return ("no usable CUDA driver, so this runs on the CPU simulator"
            in p.stderr and NO_DRIVER in p.stderr)


def test_report_falls_back_to_the_simulator():
    p = cli()
    assert p.returncode == 0, p.stdout + p.stderr
    assert fell_back(p), p.stderr
    assert "backend: simulator (no usable CUDA driver" in p.stdout
    assert "devices: 1" in p.stdout


def test_report_and_chain_of_the_readme():
    # The README's first steps: the report, then the validation suite,
    # joined by && (a narrowed suite here, to stay quick).
    p = subprocess.run(
        "%s -m cudamem && %s -m cudamem test -q -k round_trip_dtypes"
        % (sys.executable, sys.executable), shell=True,
        capture_output=True, text=True, timeout=180, cwd=str(ROOT),
        env={k: v for k, v in dict(
            environ(), PYTHONPATH=str(ROOT),
            CUDAMEM_DRIVER_LIBRARY=NO_DRIVER).items()
            if k not in ("CUDAMEM_SIMULATOR", "NUMBA_ENABLE_CUDASIM",
                         "NUMBA_DISABLE_CUDA")})
    assert p.returncode == 0, p.stdout + p.stderr
    assert "validation: " in p.stdout and " 0 failed" in p.stdout
    assert "CPU simulator" in p.stdout
    assert p.stderr.count("no usable CUDA driver") == 2, p.stderr


def test_simulator_chosen_says_nothing():
    p = cli(CUDAMEM_SIMULATOR="1")
    assert p.returncode == 0, p.stderr
    assert "no usable CUDA driver" not in p.stderr
    assert "backend: simulator\n" in p.stdout


@pytest.mark.parametrize("env", [{"CUDAMEM_SIMULATOR": "0"},
                                 {"NUMBA_DISABLE_CUDA": "1"}])
def test_driver_asked_for_is_an_error(env):
    p = cli(**env)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "backend: unavailable" in p.stdout
    assert not fell_back(p)


def test_validation_suite_falls_back_alike():
    p = cli("test", "-q", "-k", "round_trip_dtypes")
    assert p.returncode == 0, p.stdout + p.stderr
    assert fell_back(p), p.stderr
    assert "CPU simulator" in p.stdout
    assert "validation: " in p.stdout


def test_validation_suite_status_when_nothing_is_selected():
    p = cli("test", "-q", "-k", "no_test_has_this_name")
    assert p.returncode == 5, p.stdout + p.stderr


def test_bench_falls_back_alike():
    p = cli("bench", "--quick", "--no-progress", "--max-size", "65536")
    assert p.returncode == 0, p.stdout + p.stderr
    assert fell_back(p), p.stderr
    assert "simulat" in p.stdout.lower()


def test_bench_without_a_driver_asked_for():
    p = cli("bench", "--quick", "--no-progress", "--max-size", "65536",
            CUDAMEM_SIMULATOR="0")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "backend: unavailable" in p.stderr


def test_install_hints_name_plain_packages():
    # cudamem is not on the package index: a hint such as
    # pip install 'cudamem[test]' cannot work for a user; every hint the
    # package prints names the packages themselves.
    # The package under test: the installed one where the suite runs
    # against an install (the tree beside the tests may have no cudamem/).
    import cudamem

    hints = []
    for path in sorted(pathlib.Path(cudamem.__file__).parent.rglob("*.py")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if "pip install" in line:
                hints.append((path.name, line.strip()))
    assert hints
    for name, line in hints:
        assert "cudamem[" not in line, (name, line)


def test_validation_suite_without_pytest_says_what_to_install():
    code = ("import sys; sys.modules['pytest'] = None; "
            "from cudamem.__main__ import main; sys.exit(main(['test']))")
    e = dict(environ(), PYTHONPATH=str(ROOT), CUDAMEM_SIMULATOR="1")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, timeout=120, env=e)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "pip install pytest" in p.stderr
