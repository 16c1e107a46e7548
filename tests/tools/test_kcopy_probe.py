# SPDX-License-Identifier: MIT
"""tools/kcopy_probe.py (a kernel against the copy engine for eager
copies of page-locked memory, a GPU-only probe): its PTX assembles for
an old and a new GPU, and without a driver it says so and exits 0."""

import ctypes
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

from helpers import ROOT

PROBE = ROOT / "tools" / "kcopy_probe.py"


def _probe_module():
    spec = importlib.util.spec_from_file_location("kcopy_probe", PROBE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("arch", ["sm_75", "sm_90"])
def test_probe_ptx_assembles(tmp_path, arch):
    ptxas = shutil.which("ptxas") or "/usr/local/cuda/bin/ptxas"
    if not shutil.which(ptxas):
        pytest.skip("no ptxas here")
    src = tmp_path / "probe.ptx"
    src.write_bytes(_probe_module().COPY_PTX)
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS")}
    out = subprocess.run([ptxas, "-arch=" + arch, str(src), "-o",
                          str(tmp_path / "probe.cubin")],
                         capture_output=True, text=True, timeout=120,
                         env=env)
    assert out.returncode == 0, out.stderr


def test_probe_without_a_driver_says_so():
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        pass
    else:
        pytest.skip("a driver is here: the probe would run on the GPU")
    out = subprocess.run([sys.executable, str(PROBE)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("kcopy_probe: no driver here")
