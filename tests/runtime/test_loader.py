# SPDX-License-Identifier: MIT
"""Loading the backend: import never needs a GPU, a missing driver is a
clear CudaSupportError, the simulator is chosen by environment, a fork
after initialisation is refused in the child, and a source tree whose
extension is not built says how to build it."""

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import cudamem
from cudamem import _core
from helpers import run_py


def test_backend_is_reported(simulator):
    cudamem.current_context()
    assert _core._backend() == ("simulator" if simulator else "driver")


@pytest.mark.ahead
def test_missing_driver_is_a_support_error():
    rc, out = run_py("""
        import cudamem
        assert cudamem.is_available() is False
        err = cudamem.cuda_error()
        assert "does-not-exist.so" in err and "CUDAMEM_SIMULATOR=1" in err
        try:
            cudamem.current_context()
        except cudamem.CudaSupportError as e:
            assert isinstance(e, ImportError)
            assert e.msg == err, (e.msg, err)
            print("raised")
        """, CUDAMEM_SIMULATOR="0", NUMBA_ENABLE_CUDASIM=None,
        CUDAMEM_DRIVER_LIBRARY="/nonexistent/does-not-exist.so")
    assert rc == 0, out
    assert "raised" in out


@pytest.mark.ahead
def test_import_does_not_touch_the_driver():
    rc, out = run_py("""
        import cudamem
        from cudamem import _core
        assert _core._backend() is None
        print(cudamem.runtime_version())
        """, CUDAMEM_SIMULATOR="0",
        CUDAMEM_DRIVER_LIBRARY="/nonexistent/does-not-exist.so")
    assert rc == 0, out


@pytest.mark.ahead
@pytest.mark.parametrize("var", ["CUDAMEM_SIMULATOR", "NUMBA_ENABLE_CUDASIM"])
def test_simulator_selected_by_environment(var):
    other = ("NUMBA_ENABLE_CUDASIM" if var == "CUDAMEM_SIMULATOR"
             else "CUDAMEM_SIMULATOR")
    rc, out = run_py("""
        import cudamem
        from cudamem import _core
        d = cudamem.get_current_device()
        print(_core._backend(), d.name)
        """, **{var: "1", other: None})
    assert rc == 0, out
    assert "simulator cudamem simulator" in out


@pytest.mark.ahead
def test_cudamem_spelling_wins_over_numba():
    rc, out = run_py("""
        import cudamem
        print(cudamem.cuda_error())
        """, CUDAMEM_SIMULATOR="0", NUMBA_ENABLE_CUDASIM="1",
        CUDAMEM_DRIVER_LIBRARY="/nonexistent/does-not-exist.so")
    assert rc == 0, out
    assert "does-not-exist.so" in out


@pytest.mark.ahead
def test_numba_disable_cuda():
    rc, out = run_py("""
        import cudamem
        try:
            cudamem.synchronize()
        except cudamem.CudaSupportError as e:
            print(e.msg)
        """, CUDAMEM_SIMULATOR=None, NUMBA_ENABLE_CUDASIM=None,
        NUMBA_DISABLE_CUDA="1")
    assert rc == 0, out
    assert "NUMBA_DISABLE_CUDA=1" in out


@pytest.mark.ahead
def test_fork_after_init_is_refused_in_the_child():
    rc, out = run_py("""
        import os
        import cudamem
        cudamem.current_context()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                cudamem.current_context()
                msg = b"no error"
            except cudamem.CudaDriverError as e:
                msg = str(e).encode()
            except BaseException as e:
                msg = repr(e).encode()
            os.write(w, msg)
            os._exit(0)
        os.close(w)
        print(os.read(r, 1000).decode())
        os.waitpid(pid, 0)
        cudamem.current_context()  # the parent is unaffected
        print("parent ok")
        """)
    assert rc == 0, out
    assert "CUDA initialized before forking" in out
    assert "parent ok" in out


@pytest.mark.ahead
def test_per_thread_default_stream_variables():
    for var in ("CUDAMEM_PER_THREAD_DEFAULT_STREAM",
                "NUMBA_CUDA_PER_THREAD_DEFAULT_STREAM",
                "CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM"):
        rc, out = run_py("""
            from cudamem import _core
            print(_core._per_thread_default_stream())
            """, **{var: "1"})
        assert rc == 0, out
        assert out.strip() == "True", (var, out)
    rc, out = run_py("""
        from cudamem import _core
        print(_core._per_thread_default_stream())
        """, CUDAMEM_PER_THREAD_DEFAULT_STREAM="0",
        NUMBA_CUDA_PER_THREAD_DEFAULT_STREAM="1")
    assert out.strip() == "False", out


def test_python_m_cudamem_reports_devices(simulator):
    p = subprocess.run([sys.executable, "-m", "cudamem"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "driver version: CUDA" in p.stdout
    assert "compute capability" in p.stdout
    assert ("simulator" if simulator else "driver") in p.stdout


@pytest.mark.ahead
def test_python_m_cudamem_without_backend():
    rc, out = run_py("import runpy; runpy.run_module('cudamem', "
                     "run_name='__main__')",
                     CUDAMEM_SIMULATOR="0",
                     CUDAMEM_DRIVER_LIBRARY="/nonexistent/does-not-exist.so")
    assert rc == 1
    assert "backend: unavailable" in out


@pytest.mark.ahead
def test_unbuilt_source_tree_says_how_to_build():
    # The package's Python files without the extension, imported from
    # their folder (no site-packages: nothing installed can stand in).
    with tempfile.TemporaryDirectory() as d:
        shutil.copytree(Path(cudamem.__file__).parent, Path(d) / "cudamem",
                        ignore=shutil.ignore_patterns("*.so", "__pycache__"))
        p = subprocess.run([sys.executable, "-S", "-c", "import cudamem"],
                           cwd=d, capture_output=True, text=True,
                           timeout=60)
    assert p.returncode != 0
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: cudamem's C extension "
                           "(cudamem._core) is not built"), p.stderr
    assert "pip install ." in last and "build_ext --inplace" in last
