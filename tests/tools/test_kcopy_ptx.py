# SPDX-License-Identifier: MIT
"""The PTX of cudamem's capture kernels (csrc/context/kcopy.c's, which a
small copy becomes while cudamem captures, and csrc/context/kbatch.c's,
which a run of them becomes) assembles for an old and a new GPU, and
each kernel's CUDA C source, kept beside it in a comment, compiles to
the same instructions: ptxas and nvcc from the toolkit, skipped where
there is none (the simulator never loads the PTX)."""

import os
import re
import shutil
import subprocess

import pytest

from helpers import ROOT

# (file, the name of its PTX string)
KERNELS = [("kcopy.c", "cm_kcopy_ptx"), ("kbatch.c", "cm_kbatch_ptx")]


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


def _text(name):
    return (ROOT / "csrc" / "context" / name).read_text()


def _embedded_ptx(name, symbol):
    text = _text(name)
    start = text.index(symbol + "[] =")
    body = text[start:text.index(";\n", start)]
    return "".join(p.encode().decode("unicode_escape")
                   for p in re.findall(r'"((?:[^"\\]|\\.)*)"', body))


def _cuda_source(name):
    text = _text(name)
    start = text.index("\n *\n", text.index("The kernel's CUDA C source")) + 4
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
@pytest.mark.parametrize("name,symbol", KERNELS)
def test_embedded_ptx_assembles(tmp_path, arch, name, symbol):
    ptxas = _tool("ptxas")
    src = tmp_path / "kcopy.ptx"
    src.write_text(_embedded_ptx(name, symbol))
    out = subprocess.run([ptxas, "-arch=" + arch, str(src), "-o",
                          str(tmp_path / "kcopy.cubin")],
                         capture_output=True, text=True, timeout=120,
                         env=_env())
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("name,symbol", KERNELS)
def test_embedded_ptx_is_its_source_compiled(tmp_path, name, symbol):
    nvcc = _tool("nvcc")
    cu = tmp_path / "kcopy.cu"
    cu.write_text(_cuda_source(name))
    out = subprocess.run([nvcc, "-ptx", "-arch=compute_75", "-O3", str(cu),
                          "-o", str(tmp_path / "kcopy.ptx")],
                         capture_output=True, text=True, timeout=300,
                         env=_env())
    assert out.returncode == 0, out.stderr
    fresh = _instructions((tmp_path / "kcopy.ptx").read_text())
    kept = _instructions(_embedded_ptx(name, symbol))
    assert kept == fresh


def test_batch_parameter_is_the_c_struct():
    """kbatch.c's kernel takes the batch by value: its PTX parameter is
    as large as the C struct the capture fills (a _Static_assert there),
    within the 4 KiB of kernel parameters every driver takes."""
    text = _text("kbatch.c")
    size = int(re.search(r"_Static_assert\(sizeof\(cm_kb\) == (\d+)",
                         text).group(1))
    ptx = _embedded_ptx("kbatch.c", "cm_kbatch_ptx")
    assert ".b8 cm_kbatch_param_0[%d]" % size in ptx
    assert size <= 4096
