# SPDX-License-Identifier: MIT
"""One version in one place, and what the build recorded: cudamem's
version, the installed distribution's metadata, ``python -m cudamem
--version`` and CHANGELOG.md agree; the module names the CUDA headers it
was built against; the package ships its stubs and validation suite."""

import importlib.metadata
import os
import re
import subprocess
import sys

import pytest

import cudamem
from cudamem import _core
from helpers import ROOT


def test_metadata_version_is_the_package_version():
    try:
        dist = importlib.metadata.distribution("cudamem")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("cudamem is not installed here, only imported")
    assert dist.version == cudamem.__version__


def test_command_line_version():
    p = subprocess.run([sys.executable, "-m", "cudamem", "--version"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "cudamem %s" % cudamem.__version__


def test_changelog_names_this_version():
    with open(ROOT / "CHANGELOG.md", encoding="utf-8") as f:
        text = f.read()
    versions = re.findall(r"^## \[(\d[^\]]*)\]", text, re.M)
    assert versions, "no version heading in CHANGELOG.md"
    assert versions[0] == cudamem.__version__
    # This version's section is the one unreleased section until it has a
    # date.
    assert re.search(r"^## \[%s\] - (Unreleased|\d{4}-\d\d-\d\d)$"
                     % re.escape(cudamem.__version__), text, re.M)


def test_headers_are_recorded():
    line = _core._cuda_headers
    major, minor = cudamem.runtime_version()
    assert line.startswith("CUDA %d.%d headers " % (major, minor)), line
    assert "toolkit in " in line or "from nvidia-cuda-runtime " in line
    p = subprocess.run([sys.executable, "-m", "cudamem"],
                       capture_output=True, text=True, timeout=120)
    assert "built against: %s\n" % line in p.stdout, p.stdout


def test_package_ships_stubs_and_suite():
    here = os.path.dirname(cudamem.__file__)
    for name in ("py.typed", "_core.pyi", os.path.join("tests", "pytest.ini"),
                 os.path.join("tests", "conftest.py")):
        assert os.path.isfile(os.path.join(here, name)), name
