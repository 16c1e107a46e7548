# SPDX-License-Identifier: MIT
"""tools/check_layers.py sees calls, not only includes: a file that uses
a symbol of a higher layer of csrc/, or two layers that use each other,
fail the check, both on nm output made up here and on objects compiled
here from a small tree laid out as setup.py lays out its build."""

import importlib.util
import shutil
import subprocess
import sys

import pytest

from helpers import ROOT

SCRIPT = ROOT / "tools" / "check_layers.py"

pytestmark = pytest.mark.skipif(not SCRIPT.is_file(),
                                reason="tools/ is not in this checkout")


def load():
    spec = importlib.util.spec_from_file_location("check_layers", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_parse_nm_splits_defined_from_used():
    cl = load()
    text = ("cm_a T 0000000000000000 0000000000000010\n"
            "cm_b U\n"
            "cm_local t 0000000000000010 0000000000000004\n"
            "cm_data B 0000000000000000 0000000000000008\n")
    assert cl.parse_nm(text) == ({"cm_a", "cm_data"}, {"cm_b"})


def test_a_downward_use_passes():
    cl = load()
    objs = {"memory/memory.c": ({"cm_mem_alloc"}, {"cm_context_current"}),
            "context/context.c": ({"cm_context_current"}, set()),
            "array/types.c": (set(), {"cm_mem_alloc"})}
    bad, counts = cl.check_symbols(objs, allowed={})
    assert bad == []
    assert counts["memory", "context"] == 1
    assert counts["array", "memory"] == 1


def test_an_upward_use_fails_naming_file_symbol_and_layers():
    cl = load()
    objs = {"memory/memory.c": ({"cm_mem_alloc"}, {"cm_devicearray_new"}),
            "array/functions.c": ({"cm_devicearray_new"}, set())}
    bad, _ = cl.check_symbols(objs, allowed={})
    assert len(bad) == 1
    assert "memory/memory.c (memory) uses cm_devicearray_new" in bad[0]
    assert "higher layer array" in bad[0]


def test_two_layers_that_use_each_other_fail():
    cl = load()
    objs = {"memory/memory.c": ({"cm_mem_alloc"}, {"cm_devicearray_new"}),
            "array/functions.c": ({"cm_devicearray_new"}, {"cm_mem_alloc"})}
    bad, _ = cl.check_symbols(objs, allowed={})
    assert any("layers array and memory use each other" in b for b in bad)


def test_the_allow_list_names_an_accepted_upward_use(capsys):
    cl = load()
    objs = {"context/context.c": (set(), {"cm_mm_default"}),
            "memory/default.c": ({"cm_mm_default"}, set())}
    allowed = {("context/context.c", "cm_mm_default"): "a reason"}
    bad, _ = cl.check_symbols(objs, allowed=allowed)
    assert bad == []
    assert "allowed upward use: context/context.c" in capsys.readouterr().out


def test_the_tree_allows_no_upward_use():
    assert load().ALLOWED_UP == {}


def compile_tree(tmp_path, files):
    """Write files ({path under csrc/: C source}) and compile each into
    build/csrc/<path>.o, as setup.py's build-temp folder holds them."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or shutil.which("nm") is None:
        pytest.skip("no C compiler or nm here")
    for rel, text in files.items():
        src = tmp_path / "csrc" / rel
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_text(text)
        obj = tmp_path / "build" / "csrc" / (rel[:-2] + ".o")
        obj.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([cc, "-c", "-o", str(obj), str(src)], check=True)


def run(tmp_path):
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--csrc", str(tmp_path / "csrc"),
         "--build-temp", str(tmp_path / "build")],
        capture_output=True, text=True, timeout=120)


def test_compiled_objects_with_an_upward_call_fail(tmp_path):
    compile_tree(tmp_path, {
        "memory/mem.c": "int cm_up(void);\n"
                        "int cm_mem(void) { return cm_up(); }\n",
        "array/arr.c": "int cm_up(void) { return 1; }\n",
    })
    p = run(tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert ("memory/mem.c (memory) uses cm_up, defined in array/arr.c of "
            "the higher layer array") in p.stdout


def test_compiled_objects_with_downward_calls_pass(tmp_path):
    compile_tree(tmp_path, {
        "memory/mem.c": "int cm_mem(void) { return 1; }\n",
        "array/arr.c": "int cm_mem(void);\n"
                       "int cm_arr(void) { return cm_mem(); }\n",
    })
    p = run(tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "every use of another layer's symbol goes down" in p.stdout


def test_no_objects_is_a_clear_failure(tmp_path):
    (tmp_path / "csrc" / "memory").mkdir(parents=True)
    (tmp_path / "csrc" / "memory" / "mem.c").write_text("int x;\n")
    (tmp_path / "build").mkdir()
    p = run(tmp_path)
    assert p.returncode == 2
    assert "no compiled objects" in p.stdout
    assert "--build-temp" in p.stdout
