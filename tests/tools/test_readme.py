# SPDX-License-Identifier: MIT
"""The README's Python examples, literally: each ```python block runs as
written in a fresh interpreter (in a folder of its own, so that files it
writes land there), and does what the prose around it says; the memviz
command after the history example renders the snapshot it wrote."""

import re
import subprocess
import sys

import pytest

from helpers import ROOT
from helpers.crashutil import child_env, run_py

README = ROOT / "README.md"


def blocks(lang):
    text = README.read_text(encoding="utf-8")
    return re.findall(r"^```%s\n(.*?)^```$" % lang, text,
                      re.DOTALL | re.MULTILINE)


def block_with(text, lang="python"):
    found = [b for b in blocks(lang) if text in b]
    assert len(found) == 1, "README: %d %s blocks with %r" % (
        len(found), lang, text)
    return found[0]


def run_block(code, where):
    return run_py("import os\nos.chdir(%r)\n" % str(where) + code,
                  timeout=180)


def test_every_python_block_is_tested():
    # A block added to the README gets a test here.
    keys = ("d = cuda.to_device(a, stream=s)", "interop.use_with_torch()",
            "with cudamem.graph() as g:", "cudamem.memory_history(True")
    for b in blocks("python"):
        assert any(k in b for k in keys), "an untested README block:\n" + b


@pytest.mark.ahead
def test_short_example(tmp_path):
    rc, out = run_block(block_with("d = cuda.to_device(a, stream=s)"),
                        tmp_path)
    assert rc == 0, out
    # The comment shows the first and last of the twelve values.
    printed = out.strip().splitlines()[-1]
    assert printed.startswith("[ 0.  0.") and printed.endswith("10. 11.]"), \
        out


@pytest.mark.ahead
def test_one_pool_for_every_library(tmp_path):
    code = block_with("interop.use_with_torch()")
    rc, out = run_block(code, tmp_path)
    if rc != 0 and re.search(r"No module named '(torch|cupy)'", out):
        pytest.skip("PyTorch or CuPy is not installed here")
    assert rc == 0, out


@pytest.mark.ahead
def test_graph_example(tmp_path):
    rc, out = run_block(block_with("with cudamem.graph() as g:"), tmp_path)
    assert rc == 0, out


@pytest.mark.ahead
def test_history_example_and_memviz(tmp_path):
    rc, out = run_block(block_with("cudamem.memory_history(True"),
                        tmp_path)
    assert rc == 0, out
    snap = tmp_path / "snapshot.json"
    assert snap.stat().st_size > 0
    cmd = block_with("python -m cudamem memviz", "sh").split("#")[0].split()
    assert cmd[:3] == ["python", "-m", "cudamem"], cmd
    p = subprocess.run([sys.executable] + cmd[1:], cwd=tmp_path,
                       env=child_env(), capture_output=True, text=True,
                       timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    html = (tmp_path / "memory.html").read_text(encoding="utf-8")
    assert "<html" in html.lower()
