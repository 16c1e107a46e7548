#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Check that the modules of the cudamem package import one another
without a cycle.

Every `import` and `from ... import` of every .py file of the package
(cudamem/ and its subpackages), at module level and inside functions and
classes alike, read through `ast`, gives an edge from the importing
module to each module of the package it names: `import cudamem.a.b` and
`from cudamem.a import b` (b a submodule) name cudamem.a.b; `from .x
import name` (name not a submodule) names .x; `from . import name`
(name not a submodule) names the package itself, its __init__.py.  A
compiled extension (`from . import _core`) and modules outside the
package are not nodes.  Any strongly connected set of more than one
module fails, naming the modules and the file and line of each import
between them.

tools/check_layers.py runs this check with its own; run alone, it exits
1 on a cycle, and with --graph prints the edges it read.
"""

import argparse
import ast
import collections
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent

# The compiled extensions of the package, which no .py file defines:
# imported like a module, not a node of the graph (a stub .pyi or a built
# .so beside the package's modules is also taken as one).
EXTENSION_MODULES = ("cudamem._core",)


def sccs(nodes, succ):
    """The strongly connected components of the graph (succ: {node:
    iterable of nodes}) with more than one node, each a sorted list, in
    the order of their smallest node (Tarjan's, without recursion)."""
    index = {}
    low = {}
    stack = []
    on_stack = set()
    found = []
    counter = 0
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(succ.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(succ.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    u = work[-1][0]
                    low[u] = min(low[u], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return sorted(found)


def modules_of(pkgdir):
    """{dotted module name: path} of every .py file of the package at
    pkgdir (a package's own name for its __init__.py), and the set of
    dotted names of its compiled extensions."""
    mods = {}
    ext = set(EXTENSION_MODULES)
    base = pkgdir.parent
    for path in sorted(pkgdir.rglob("*")):
        if "__pycache__" in path.parts or not path.is_file():
            continue
        rel = path.relative_to(base)
        parts = list(rel.parts)
        stem = parts[-1].split(".", 1)[0]
        if path.suffix == ".py":
            parts[-1] = stem
            if stem == "__init__":
                parts.pop()
            mods[".".join(parts)] = path
        elif path.suffix in (".so", ".pyd", ".pyi"):
            parts[-1] = stem
            ext.add(".".join(parts))
    return mods, ext - set(mods)


class _Imports(ast.NodeVisitor):
    """The imports of one module, as (dotted target, line, inside a
    function or not); relative ones resolved against the module."""

    def __init__(self, package):
        self.package = package
        self.depth = 0
        self.found = []

    def _scope(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = _scope
    visit_AsyncFunctionDef = _scope
    visit_Lambda = _scope

    def visit_Import(self, node):
        for alias in node.names:
            self.found.append((alias.name, None, node.lineno,
                               self.depth > 0))

    def visit_ImportFrom(self, node):
        if node.level:
            parts = self.package.split(".")
            if node.level - 1 > len(parts) - 1:
                return
            parts = parts[:len(parts) - (node.level - 1)]
            base = ".".join(parts)
            mod = base + "." + node.module if node.module else base
        else:
            mod = node.module
        for alias in node.names:
            self.found.append((mod, alias.name, node.lineno,
                               self.depth > 0))


def read_imports(pkgdir, repo=None):
    """The import graph between the package's modules: {(importer,
    imported): [(file relative to repo, line, inside a function)]}, and
    the modules, {name: path}."""
    repo = pathlib.Path(repo) if repo is not None else pkgdir.parent
    mods, ext = modules_of(pkgdir)
    edges = collections.defaultdict(list)
    for name, path in sorted(mods.items()):
        package = name if path.name == "__init__.py" \
            else name.rpartition(".")[0]
        visitor = _Imports(package)
        visitor.visit(ast.parse(path.read_text(), str(path)))
        try:
            where = path.relative_to(repo).as_posix()
        except ValueError:
            where = path.as_posix()
        for mod, attr, line, nested in visitor.found:
            if attr is None:
                target = mod
                while target and target not in mods:
                    target = target.rpartition(".")[0]
            elif attr != "*" and mod + "." + attr in mods:
                target = mod + "." + attr
            elif attr != "*" and mod + "." + attr in ext:
                continue
            else:
                target = mod
            if target in mods and target != name:
                edges[name, target].append((where, line, nested))
    return dict(edges), mods


def _sites(sites):
    """file:line of each import (one per line of source)."""
    return ", ".join("%s:%d%s" % (f, line, " in a function" if nested
                                  else "")
                     for f, line, nested in sorted(set(sites)))


def cycle_messages(nodes, edges, head, label):
    """One message per cycle of the graph (edges: {(a, b): what}): head
    (a format of the cycle's nodes, comma-separated), then one indented
    line per edge between them, ``a -> b (label(what))``."""
    succ = collections.defaultdict(set)
    for a, b in edges:
        succ[a].add(b)
    bad = []
    for comp in sccs(nodes, succ):
        lines = [head % ", ".join(comp)]
        for a in comp:
            for b in sorted(succ[a]):
                if b in comp:
                    lines.append("    %s -> %s (%s)"
                                 % (a, b, label(edges[a, b])))
        bad.append("\n".join(lines))
    return bad


def check(pkgdir, repo=None):
    """The import cycles between the package's modules, as messages (a
    first line naming the modules, then one indented line per import
    between them); [] when there is no package at pkgdir."""
    pkgdir = pathlib.Path(pkgdir)
    if not (pkgdir / "__init__.py").is_file():
        return []
    edges, mods = read_imports(pkgdir, repo)
    return cycle_messages(mods, edges,
                          pkgdir.name.replace("%", "%%")
                          + ": import cycle between modules: %s",
                          _sites)


def graph(pkgdir, repo=None):
    """The import edges read, one line each ("a -> b (file:line, ...)");
    [] when there is no package at pkgdir."""
    pkgdir = pathlib.Path(pkgdir)
    if not (pkgdir / "__init__.py").is_file():
        return []
    edges, _ = read_imports(pkgdir, repo)
    return ["%s -> %s (%s)" % (a, b, _sites(sites))
            for (a, b), sites in sorted(edges.items())]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--package", default=str(REPO / "cudamem"),
                    help="the package's folder (default: this checkout's "
                         "cudamem/)")
    ap.add_argument("--graph", action="store_true",
                    help="print the import edges read")
    args = ap.parse_args(argv)
    pkgdir = pathlib.Path(args.package)
    if args.graph:
        for line in graph(pkgdir, pkgdir.parent):
            print("check_py_imports: graph: " + line)
    bad = check(pkgdir, pkgdir.parent)
    for msg in bad:
        print("check_py_imports: " + msg)
    if bad:
        return 1
    print("check_py_imports: %s: no import cycle between its modules"
          % pkgdir.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
