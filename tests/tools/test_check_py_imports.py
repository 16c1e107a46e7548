# SPDX-License-Identifier: MIT
"""tools/check_py_imports.py (run by tools/check_layers.py) reads every
import of a package's modules, at module level and inside functions,
and fails on a cycle between them, naming the modules and the line of
each import; the compiled extension (`from . import _core`) is not a
node.  Checked on small packages written here."""

import importlib.util
import subprocess
import sys

import pytest

from helpers import ROOT

SCRIPT = ROOT / "tools" / "check_py_imports.py"
LAYERS = ROOT / "tools" / "check_layers.py"

pytestmark = pytest.mark.skipif(not SCRIPT.is_file(),
                                reason="tools/ is not in this checkout")


def load():
    spec = importlib.util.spec_from_file_location("check_py_imports",
                                                  SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def package(tmp_path, files, name="cudamem"):
    """Write a package ({path under it: source}) at tmp_path/name."""
    pkg = tmp_path / name
    for rel, text in {"__init__.py": "", **files}.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return pkg


def test_a_cycle_through_an_import_in_a_function_fails(tmp_path):
    cpi = load()
    pkg = package(tmp_path, {
        "a.py": "import os\nfrom . import b\n",
        "b.py": "def f():\n    from .a import name\n    return name\n",
        "c.py": "from cudamem import a\n",
    })
    bad = cpi.check(pkg, tmp_path)
    assert bad == ["cudamem: import cycle between modules: cudamem.a, "
                   "cudamem.b\n"
                   "    cudamem.a -> cudamem.b (cudamem/a.py:2)\n"
                   "    cudamem.b -> cudamem.a (cudamem/b.py:2 in a "
                   "function)"]


def test_subpackages_and_absolute_imports_are_nodes(tmp_path):
    cpi = load()
    pkg = package(tmp_path, {
        "sub/__init__.py": "from ..x import y\n",
        "sub/deep.py": "import cudamem.sub\n",
        "x.py": "class K:\n    import cudamem.sub.deep as d\ny = 1\n",
    })
    edges, mods = cpi.read_imports(pkg, tmp_path)
    assert set(mods) == {"cudamem", "cudamem.sub", "cudamem.sub.deep",
                         "cudamem.x"}
    assert edges == {
        ("cudamem.sub", "cudamem.x"): [("cudamem/sub/__init__.py", 1,
                                        False)],
        ("cudamem.sub.deep", "cudamem.sub"): [("cudamem/sub/deep.py", 1,
                                               False)],
        ("cudamem.x", "cudamem.sub.deep"): [("cudamem/x.py", 2, False)]}
    assert cpi.check(pkg, tmp_path)[0].startswith(
        "cudamem: import cycle between modules: cudamem.sub, "
        "cudamem.sub.deep, cudamem.x")


def test_the_extension_is_not_a_node(tmp_path):
    cpi = load()
    # without the exception, `from . import _core` would be an edge to
    # the package's __init__, which imports a: a cycle
    pkg = package(tmp_path, {
        "__init__.py": "from . import a\nfrom . import _core\n",
        "a.py": "from . import _core\nfrom ._core import thing\n",
        "_stubbed.pyi": "x: int\n",
        "b.py": "from . import _stubbed\n",
    })
    edges, _ = cpi.read_imports(pkg, tmp_path)
    assert edges == {("cudamem", "cudamem.a"): [("cudamem/__init__.py", 1,
                                                 False)]}
    assert cpi.check(pkg, tmp_path) == []


def test_a_name_of_the_package_is_an_edge_to_its_init(tmp_path):
    cpi = load()
    pkg = package(tmp_path, {
        "__init__.py": "from .a import f\nVERSION = 1\n",
        "a.py": "def f():\n    from . import VERSION\n    return VERSION\n",
    })
    bad = cpi.check(pkg, tmp_path)
    assert len(bad) == 1
    assert "    cudamem.a -> cudamem (cudamem/a.py:2 in a function)" \
        in bad[0]


def test_no_package_no_check(tmp_path):
    cpi = load()
    assert cpi.check(tmp_path / "cudamem", tmp_path) == []


def test_the_layers_check_runs_it_and_graphs_it(tmp_path):
    package(tmp_path, {"a.py": "from . import b\n",
                       "b.py": "def f():\n    from . import a\n"})
    src = tmp_path / "csrc" / "memory" / "mem.c"
    src.parent.mkdir(parents=True)
    src.write_text("int cm_mem(void) { return 1; }\n")
    obj = tmp_path / "build" / "csrc" / "memory" / "mem.o"
    obj.parent.mkdir(parents=True)
    try:
        subprocess.run(["cc", "-c", "-o", str(obj), str(src)], check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("no C compiler here")
    p = subprocess.run(
        [sys.executable, str(LAYERS), "--csrc", str(tmp_path / "csrc"),
         "--build-temp", str(tmp_path / "build"), "--graph"],
        capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stdout + p.stderr
    assert ("import cycles between the modules of the Python package: 1"
            in p.stdout)
    assert "graph python: cudamem.a -> cudamem.b (cudamem/a.py:1)" \
        in p.stdout
    assert ("    cudamem.b -> cudamem.a (cudamem/b.py:2 in a function)"
            in p.stdout)


def test_the_script_alone(tmp_path):
    pkg = package(tmp_path, {"a.py": "import json\n"})
    p = subprocess.run([sys.executable, str(SCRIPT), "--package", str(pkg),
                        "--graph"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "cudamem: no import cycle between its modules" in p.stdout
