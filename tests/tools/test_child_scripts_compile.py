# SPDX-License-Identifier: MIT
"""Every Python script a test hands to a child process (the first
argument of run_child, run_py and the modules' own *_child helpers: a
string literal, or a %-template, filled with dummies here) compiles.
Many of those tests run only on a GPU or with a peer library installed:
a syntax slip in their script would otherwise first show there."""

import ast
import pathlib
import re
import textwrap

import pytest

TESTS = pathlib.Path(__file__).resolve().parents[1]


def _runner(call):
    f = call.func
    name = f.id if isinstance(f, ast.Name) else (
        f.attr if isinstance(f, ast.Attribute) else "")
    return name in ("run_child", "run_py") or name.endswith("_child")


def _literal(arg):
    """The script of a runner's first argument: (text, is a template),
    or None."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value, False
    if (isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Mod)
            and isinstance(arg.left, ast.Constant)
            and isinstance(arg.left.value, str)):
        return arg.left.value, True
    return None


def _scripts():
    for path in sorted(TESTS.rglob("test_*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _runner(node) and node.args:
                lit = _literal(node.args[0])
                if lit is not None:
                    yield (path.relative_to(TESTS), node.lineno) + lit


SCRIPTS = list(_scripts())


def test_the_scripts_are_found():
    assert len(SCRIPTS) > 90, len(SCRIPTS)


@pytest.mark.parametrize("path,line,code,template", SCRIPTS,
                         ids=["%s:%d" % (p, n) for p, n, _, _ in SCRIPTS])
def test_child_script_compiles(path, line, code, template):
    src = textwrap.dedent(code)
    if template:
        # Each conversion becomes a name, each %% a %.
        src = re.sub(r"%(\([^)]*\))?[-#0 +]*\d*(\.\d+)?[sdrifxg]", "x0",
                     src).replace("%%", "%")
    compile(src, "%s:%d" % (path, line), "exec")
