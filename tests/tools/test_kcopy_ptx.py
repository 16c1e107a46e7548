# SPDX-License-Identifier: MIT
"""csrc/context/kcopy.c's PTX (the kernel small copies become while
cudamem captures) assembles for an old and a new GPU, and its CUDA C
source, kept beside it in a comment, compiles
to the same instructions: ptxas and nvcc from the toolkit, skipped
where there is none (the simulator never loads the PTX)."""

import os
import re
import shutil
import subprocess

import pytest

from helpers import ROOT

SRC = ROOT / "csrc" / "context" / "kcopy.c"


def _tool(name):
    path = shutil.which(name) or "/usr/local/cuda/bin/" + name
    if not shutil.which(path):
        pytest.skip("no %s here" % name)
    return path


def _env():
    """The environment for the toolkit's programs: without the
    sanitizer runtimes a sanitizer run of the suite preloads (nvcc
    crashes under them)."""
    return {k: v for k, v in os.environ.items()
            if k not in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS")}


def _embedded_ptx():
    text = SRC.read_text()
    start = text.index("cm_kcopy_ptx[] =")
    body = text[start:text.index(";\n", start)]
    return "".join(p.encode().decode("unicode_escape")
                   for p in re.findall(r'"((?:[^"\\]|\\.)*)"', body))


def _cuda_source():
    text = SRC.read_text()
    start = text.rindex("\n", 0, text.index('extern "C" __global__ void')) + 1
    end = text.index(" * and its PTX", start)
    return "\n".join(line[3:] if line.startswith(" * ") else ""
                     for line in text[start:end].splitlines()) + "\n"


def _instructions(ptx):
    """The instruction opcodes of ptx in order (no registers, labels or
    directives), which the hand-kept copy must keep."""
    ops = []
    for line in ptx.splitlines():
        line = line.strip()
        if (not line or line.startswith(("//", ".", "{", "}", ")"))
                or line.endswith(":")):
            continue
        if line.startswith("@"):
            line = line.split(None, 1)[1]
        ops.append(line.split()[0].rstrip(";"))
    return ops


# The PTX says .target sm_52 (the oldest it needs); a toolkit's ptxas
# assembles it for the GPUs that toolkit knows (CUDA 13: sm_75 up).
@pytest.mark.parametrize("arch", ["sm_75", "sm_90"])
def test_embedded_ptx_assembles(tmp_path, arch):
    ptxas = _tool("ptxas")
    src = tmp_path / "kcopy.ptx"
    src.write_text(_embedded_ptx())
    out = subprocess.run([ptxas, "-arch=" + arch, str(src), "-o",
                          str(tmp_path / "kcopy.cubin")],
                         capture_output=True, text=True, timeout=120,
                         env=_env())
    assert out.returncode == 0, out.stderr


def test_embedded_ptx_is_its_source_compiled(tmp_path):
    nvcc = _tool("nvcc")
    cu = tmp_path / "kcopy.cu"
    cu.write_text(_cuda_source())
    out = subprocess.run([nvcc, "-ptx", "-arch=compute_75", "-O3", str(cu),
                          "-o", str(tmp_path / "kcopy.ptx")],
                         capture_output=True, text=True, timeout=300,
                         env=_env())
    assert out.returncode == 0, out.stderr
    fresh = _instructions((tmp_path / "kcopy.ptx").read_text())
    kept = _instructions(_embedded_ptx())
    assert kept == fresh
