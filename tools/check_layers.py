#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Check the structure of csrc/ and of the cudamem package.

The layers of csrc/, lowest first: the simulator (sim/, a backend the
driver table is filled from), driver (with retcheck.c, the debug build's
return check, which any layer calls on what it hands Python), context,
memory, array, features, then module.c at the top; docs/design.md#layers
says what each owns.  A folder of csrc/ is a room: its direct .c files
and its subfolders (each one room of its own, nested like memory/vmm/).

The rules, each failing with a message that names the files:

- includes go down: every `#include "..."` of every .c and .h file under
  csrc/ names a header of its own layer or a lower one; the simulator
  includes only its own headers and the driver table's, and nothing
  outside sim/ includes a sim/ header.
- calls go down: the compiled objects (`nm` of each .o that setup.py's
  build left under its build-temp folder, for a source that still
  exists) say which global symbols each file defines and which it uses.
  A file that uses a symbol defined in a higher layer fails, and so do
  two layers that use each other.  A lower layer reaches a higher one
  only through a table of function pointers the higher one fills at
  module init (cm_ctx_up in context/context.h, cm_mem_up in
  memory/memory.h, cm_array_up in array/array.h), which nm does not see
  as a use.
- no cycle between the files of one folder: in every folder of csrc/
  (csrc/ itself included), nodes are its direct .c files and each direct
  subfolder as one node, and A -> B when an object of A uses a global
  symbol an object of B defines.  A strongly connected set of more than
  one node fails, printing each edge in it with a few of its symbols.
- private headers stay home: a folder's public header is
  <folder>/<folder's name>.h (context/context.h, memory/vmm/vmm.h); every
  other header of a folder is private to it and its subfolders, and an
  include of it from outside them fails.  A header at the top of csrc/
  (none today) would be public; SHARED_HEADERS lists the few exceptions,
  each with its reason.
- the simulator through the driver table only: a symbol defined by an
  object under sim/ and used by an object outside sim/ and driver/
  fails.
- no file over MAX_LINES (1 500) lines: every source file of the
  repository (.c, .h, .py, .pyi, .js, .sh, and scripts without an
  extension that start with #!), listed by `git ls-files` (tracked, and
  untracked ones not ignored) in a git checkout, else found by walking
  the tree past build/, dist/, virtual environments and hidden folders
  other than .ci/.
- locks and the GIL said at the top: every .c file under csrc/ that
  takes a lock or gives up the GIL (a use of one of LOCK_PRIMITIVES,
  outside comments and strings) has, in its head comment (the first
  /* */ block after the SPDX line), a paragraph whose first line begins
  with " * Locks and the GIL:".
- no import cycle in the Python package: the imports between the modules
  of cudamem/ (module level and inside functions alike), read through
  `ast` by tools/check_py_imports.py, have no cycle; its message names
  the modules and the line of each import in the cycle.

--graph prints what the checker read: for each folder of csrc/ the file
-> file edges with their count of symbols, and the Python import edges
with their lines.  --counts prints the uses between layers by direction.

Exits 1 naming each break, grouped by rule; 2 when no objects are found
(build first: python setup.py build_ext --inplace).
"""

import argparse
import collections
import glob
import os
import pathlib
import re
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import check_py_imports  # noqa: E402  (tools/, beside this file)

REPO = pathlib.Path(__file__).resolve().parent.parent
ROOT = REPO / "csrc"
RANK = {"sim": -1, "driver": 0, "context": 1, "memory": 2,
        "array": 3, "features": 4, "module.c": 5}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
DEFINED = set("TDBRCGSVW")

# Uses of a symbol of a higher layer that are known and accepted, as
# {(file, symbol): why}; file is relative to csrc/ ("memory/memory.c").
# Empty: every call goes down.  An entry is a debt to pay, named here
# rather than hidden, and the check reports it on every run.
ALLOWED_UP = {}

# Headers of a folder other than its public <folder>/<folder's name>.h
# that any file of csrc/ may include, as {path under csrc/: why}.
SHARED_HEADERS = {
    "driver/cu_table.h": "the driver's entry-point table, which "
                         "driver/driver.h includes and the simulator "
                         "fills",
    "driver/bytesize.h": "how a variable spells a byte count, read by the "
                         "simulator and the memory limit alike",
}

MAX_LINES = 1500
# What the line count reads: these suffixes, and files without one that
# start with #! (the scripts of .ci/).
SOURCE_SUFFIXES = (".c", ".h", ".py", ".pyi", ".js", ".sh")
# Folders the walk (outside a git checkout) never enters, as .gitignore
# has them: these names, *.egg-info, a folder that holds a pyvenv.cfg (a
# virtual environment), and hidden ones (.git, .venv*, .gpu-work, the
# caches) but for HIDDEN_KEPT.
SKIP_DIRS = {"build", "dist", "venv", "node_modules", "__pycache__",
             "artifacts"}
HIDDEN_KEPT = {".ci", ".github"}

# The project's ways to take a lock or to give up the GIL, as {name:
# what it is}: a .c file under csrc/ whose code (comments and strings
# left out) names one of them needs the " * Locks and the GIL:"
# paragraph.  Read from the definitions: cm_mu_lock (driver/call.h)
# takes a pthread mutex, cm_pool_lock (memory/pool/pool.h) a pool's
# mutex with the GIL dropped first, sim_lock (sim/sim.c) the simulator's
# lock; cm_gil_drop, CM_DRIVER_BEGIN_NOGIL, CM_CU_NOGIL and CM_GIL_YIELD
# (driver/call.h) give up the GIL.  The registry's lock cm_reg_lock is
# taken through PyThread_acquire_lock and the loader's cm_load_lock
# through cm_mu_lock, so their names alone do not count
# (memory/host/hostbuf.c only makes the former); nor do CM_HOST_LOCKED
# (page-locked host memory, array/array.h) and CM_PROBE_NOGIL (a kind of
# the GIL probe's counts, driver/call.h), which are no lock and give
# nothing up.  CM_CU and CM_CU_RAW, which give up the GIL only while a
# Python callback is in flight, do not count either: every file that
# calls the driver would.
LOCK_PRIMITIVES = {
    "cm_mu_lock": "a cudamem mutex (driver/call.h)",
    "cm_pool_lock": "a pool's mutex, the GIL dropped first "
                    "(memory/pool/pool.h)",
    "sim_lock": "the simulator's lock (sim/sim.c)",
    "pthread_mutex_lock": "a pthread mutex",
    "pthread_mutex_trylock": "a pthread mutex",
    "pthread_rwlock_rdlock": "a pthread rwlock",
    "pthread_rwlock_wrlock": "a pthread rwlock",
    "pthread_rwlock_tryrdlock": "a pthread rwlock",
    "pthread_rwlock_trywrlock": "a pthread rwlock",
    "pthread_spin_lock": "a pthread spin lock",
    "PyThread_acquire_lock": "a Python lock (the registry's cm_reg_lock)",
    "Py_BEGIN_ALLOW_THREADS": "gives up the GIL",
    "PyEval_SaveThread": "gives up the GIL",
    "CM_DRIVER_BEGIN_NOGIL": "gives up the GIL around driver calls "
                             "(driver/call.h)",
    "CM_CU_NOGIL": "a driver call without the GIL (driver/call.h)",
    "CM_GIL_YIELD": "a call with the GIL given up while Python callbacks "
                    "are in flight (driver/call.h)",
    "cm_gil_drop": "gives up the GIL (driver/call.h)",
    "cm_nvrtc_compile_nogil": "compiles without the GIL (driver/driver.h)",
}
LOCKS_PARAGRAPH = " * Locks and the GIL:"
SPDX = "/* SPDX-License-Identifier: MIT */"
C_NOISE = re.compile(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"'
                     r"|'(?:\\.|[^'\\\n])*'", re.S)
LOCK_USE = re.compile(r"\b(%s)\b" % "|".join(sorted(LOCK_PRIMITIVES)))


def layer(rel):
    """The layer of a path relative to csrc/ ("memory/pool.c" -> memory)."""
    return rel.split("/", 1)[0]


def check_includes(root):
    """The includes of files under root that go up, as messages."""
    bad = []
    for path in sorted(root.rglob("*.[ch]")):
        rel = path.relative_to(root).as_posix()
        own = layer(rel)
        for inc in INCLUDE.findall(path.read_text()):
            target = layer(inc)
            if target not in RANK:
                bad.append("%s: includes %r, not a path under csrc/ "
                           "(write it as layer/file.h)" % (rel, inc))
            elif own == "sim":
                if target not in ("sim", "driver"):
                    bad.append("%s: the simulator includes %r; it may "
                               "include only sim/ and driver/ headers"
                               % (rel, inc))
            elif target == "sim":
                bad.append("%s: includes %r; the simulator is reached "
                           "only through the driver table" % (rel, inc))
            elif RANK[target] > RANK[own]:
                bad.append("%s (%s) includes %r of the higher layer %s"
                           % (rel, own, inc, target))
    return bad


def parse_nm(text):
    """The global symbols nm -P text defines, and those it uses."""
    defined = set()
    used = set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind == "U":
            used.add(name)
        elif kind in DEFINED:
            defined.add(name)
    return defined, used


def default_build_temp():
    """The build-temp folder setup.py used last (build/temp.<platform>),
    or None."""
    found = [p for p in glob.glob(str(REPO / "build" / "temp.*"))
             if os.path.isdir(os.path.join(p, "csrc"))]
    if not found:
        return None
    return max(found, key=os.path.getmtime)


def read_objects(root, build_temp):
    """{file relative to csrc/ (.c): (defined, used)} for every source
    under root whose object setup.py left under build_temp (it mirrors
    the source tree: <build_temp>/csrc/memory/pool.o)."""
    objs = {}
    base = pathlib.Path(build_temp) / "csrc"
    for src in sorted(root.rglob("*.c")):
        rel = src.relative_to(root).as_posix()
        obj = base / (rel[:-2] + ".o")
        if not obj.is_file():
            continue
        out = subprocess.run(["nm", "-P", str(obj)], capture_output=True,
                             text=True, check=True).stdout
        objs[rel] = parse_nm(out)
    return objs


def check_symbols(objs, allowed=None):
    """The uses of a higher layer's symbols, and the pairs of layers that
    use each other, in objs ({file: (defined, used)}), as messages; and
    the uses between layers counted by (from, to)."""
    allowed = ALLOWED_UP if allowed is None else allowed
    owner = {}
    for rel, (defined, _) in objs.items():
        for sym in defined:
            owner[sym] = rel
    bad = []
    counts = collections.Counter()
    pairs = collections.defaultdict(list)
    for rel, (_, used) in sorted(objs.items()):
        own = layer(rel)
        for sym in sorted(used):
            where = owner.get(sym)
            if where is None or layer(where) == own:
                continue
            target = layer(where)
            counts[own, target] += 1
            pairs[own, target].append("%s -> %s (%s)" % (rel, where, sym))
            if RANK[target] <= RANK[own]:
                continue
            why = allowed.get((rel, sym))
            if why is not None:
                print("check_layers: allowed upward use: %s (%s) uses %s "
                      "of %s: %s" % (rel, own, sym, where, why))
                continue
            bad.append("%s (%s) uses %s, defined in %s of the higher "
                       "layer %s" % (rel, own, sym, where, target))
    for (a, b), uses in sorted(pairs.items()):
        if a < b and (b, a) in pairs:
            bad.append("layers %s and %s use each other: %s; and %s"
                       % (a, b, ", ".join(uses[:3]),
                          ", ".join(pairs[b, a][:3])))
    return bad, counts


def symbol_owners(objs):
    """{global symbol: the file (relative to csrc/) whose object defines
    it} of objs ({file: (defined, used)})."""
    owner = {}
    for rel, (defined, _) in objs.items():
        for sym in defined:
            owner[sym] = rel
    return owner


def node_in(folder, rel):
    """The node of folder (relative to csrc/, "" for csrc/ itself) that
    the file rel belongs to: a direct file's name, or a subfolder's name
    with a trailing /; None when rel is outside folder."""
    prefix = folder + "/" if folder else ""
    if not rel.startswith(prefix):
        return None
    head, sep, _ = rel[len(prefix):].partition("/")
    return head + "/" if sep else head


def folder_label(folder):
    return folder or "csrc"


def folder_graphs(objs):
    """{folder: (nodes, {(a, b): symbols})} for every folder of csrc/
    that holds a compiled file, at any depth, and csrc/ itself: the
    edges between its direct files and its subfolders (each one node)."""
    owner = symbol_owners(objs)
    folders = {""}
    for rel in objs:
        parts = rel.split("/")[:-1]
        for n in range(1, len(parts) + 1):
            folders.add("/".join(parts[:n]))
    graphs = {}
    for folder in sorted(folders):
        nodes = set()
        edges = collections.defaultdict(set)
        for rel, (_, used) in objs.items():
            a = node_in(folder, rel)
            if a is None:
                continue
            nodes.add(a)
            for sym in used:
                where = owner.get(sym)
                b = node_in(folder, where) if where else None
                if b is not None and b != a:
                    edges[a, b].add(sym)
        graphs[folder] = (nodes, dict(edges))
    return graphs


def few(symbols, n=3):
    """The first n of symbols, sorted, and how many more."""
    syms = sorted(symbols)
    more = ", +%d more" % (len(syms) - n) if len(syms) > n else ""
    return ", ".join(syms[:n]) + more


def check_cycles(objs):
    """The cycles between the files of one folder, as messages: a first
    line naming the folder and the nodes of the cycle, then one indented
    line per edge between them with a few of its symbols."""
    bad = []
    for folder, (nodes, edges) in sorted(folder_graphs(objs).items()):
        head = folder_label(folder).replace("%", "%%")
        bad += check_py_imports.cycle_messages(
            nodes, edges, head + ": cycle between files: %s", few)
    return bad


def check_private_headers(root):
    """The includes of a folder's private header from outside the folder
    and its subfolders, as messages."""
    bad = []
    for path in sorted(root.rglob("*.[ch]")):
        rel = path.relative_to(root).as_posix()
        for inc in INCLUDE.findall(path.read_text()):
            folder, _, name = inc.rpartition("/")
            if not folder or inc in SHARED_HEADERS \
                    or not (root / inc).is_file():
                continue
            public = folder + "/" + folder.rsplit("/", 1)[-1] + ".h"
            if inc == public or rel.startswith(folder + "/"):
                continue
            bad.append("%s includes %r, a header private to %s/ (%s)"
                       % (rel, inc, folder,
                          "its public header is " + public
                          if (root / public).is_file()
                          else "it has no public header " + public))
    return bad


def check_sim_symbols(objs):
    """The uses of a symbol of the simulator from outside sim/ and
    driver/, as messages."""
    owner = symbol_owners(objs)
    bad = []
    for rel, (_, used) in sorted(objs.items()):
        if layer(rel) in ("sim", "driver"):
            continue
        for sym in sorted(used):
            where = owner.get(sym)
            if where is not None and layer(where) == "sim":
                bad.append("%s uses %s, defined in %s; the simulator is "
                           "reached only through the driver table"
                           % (rel, sym, where))
    return bad


def source_files(repo):
    """The source files of the repository at repo whose lines are
    counted: those git lists (tracked, and untracked ones not ignored)
    when repo is the top of a git checkout, else those a walk finds."""
    repo = pathlib.Path(repo).resolve()
    paths = None
    try:
        top = subprocess.run(["git", "-C", str(repo), "rev-parse",
                              "--show-toplevel"], capture_output=True,
                             text=True, check=True).stdout.strip()
        if pathlib.Path(top).resolve() == repo:
            out = subprocess.run(["git", "-C", str(repo), "ls-files", "-z",
                                  "--cached", "--others",
                                  "--exclude-standard"],
                                 capture_output=True, text=True,
                                 check=True).stdout
            paths = sorted({repo / f for f in out.split("\0") if f})
    except (OSError, subprocess.CalledProcessError):
        pass
    if paths is None:
        paths = []
        for top, dirs, files in os.walk(repo):
            dirs[:] = sorted(
                d for d in dirs
                if d not in SKIP_DIRS and not d.endswith(".egg-info")
                and (not d.startswith(".") or d in HIDDEN_KEPT)
                and not os.path.exists(os.path.join(top, d, "pyvenv.cfg")))
            paths += [pathlib.Path(top) / f for f in sorted(files)]
    for path in paths:
        if path.is_symlink() or not path.is_file():
            continue
        if path.suffix in SOURCE_SUFFIXES:
            yield path
        elif path.suffix == "":
            with open(path, "rb") as f:
                if f.read(2) == b"#!":
                    yield path


def count_lines(path):
    """The lines of the file at path, as wc -l counts them (a last line
    without a newline counted too)."""
    data = path.read_bytes()
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n")
                                 else 0)


def check_line_counts(repo):
    """The source files of the repository over MAX_LINES lines, as
    messages."""
    bad = []
    repo = pathlib.Path(repo).resolve()
    for path in source_files(repo):
        n = count_lines(path)
        if n > MAX_LINES:
            bad.append("%s: %d lines, over %d"
                       % (path.relative_to(repo).as_posix(), n, MAX_LINES))
    return bad


def head_comment(text):
    """The head comment of a C file: the first /* */ block after the
    SPDX line (or at the top when there is none); None if there is
    none."""
    lines = text.split("\n")
    if lines and lines[0].strip() == SPDX:
        lines = lines[1:]
    rest = "\n".join(lines).lstrip()
    end = rest.find("*/")
    if not rest.startswith("/*") or end < 0:
        return None
    return rest[:end + 2]


def lock_uses(text):
    """{primitive of LOCK_PRIMITIVES: first line} named in the code of
    the C source text, comments and string literals left out."""
    def blank(m):
        word = m.group()
        if word.startswith(("'", '"')):
            return '""'
        return " " + "\n" * word.count("\n")
    code = C_NOISE.sub(blank, text)
    uses = {}
    for m in LOCK_USE.finditer(code):
        uses.setdefault(m.group(1), code.count("\n", 0, m.start()) + 1)
    return uses


def check_lock_comments(root):
    """The .c files under root that take a lock or give up the GIL and
    whose head comment has no paragraph beginning LOCKS_PARAGRAPH, as
    messages."""
    bad = []
    for path in sorted(root.rglob("*.c")):
        text = path.read_text()
        uses = lock_uses(text)
        if not uses:
            continue
        head = head_comment(text)
        if head is not None and any(line.startswith(LOCKS_PARAGRAPH)
                                    for line in head.split("\n")):
            continue
        first = sorted(uses.items(), key=lambda kv: (kv[1], kv[0]))
        bad.append("%s: takes a lock or gives up the GIL (%s%s) and its "
                   "head comment has no paragraph beginning %r"
                   % (path.relative_to(root).as_posix(),
                      ", ".join("%s line %d" % kv for kv in first[:3]),
                      ", +%d more" % (len(first) - 3)
                      if len(first) > 3 else "",
                      LOCKS_PARAGRAPH))
    return bad


def graph_lines(objs):
    """What --graph prints of csrc/: per folder, its nodes and edges,
    then each edge with its count of symbols."""
    out = []
    for folder, (nodes, edges) in sorted(folder_graphs(objs).items()):
        out.append("graph %s: %d nodes, %d edges"
                   % (folder_label(folder), len(nodes), len(edges)))
        for (a, b), syms in sorted(edges.items()):
            out.append("    %s -> %s (%d symbol%s)"
                       % (a, b, len(syms), "" if len(syms) == 1 else "s"))
    return out


# The rules in the order they are reported: (title, what a pass says).
RULES = (
    ("includes that go up", "every include goes down the layers"),
    ("uses of a higher layer's symbols",
     "every use of another layer's symbol goes down"),
    ("cycles between the files of one folder",
     "no cycle between the files of a folder"),
    ("private headers included from another folder",
     "no private header is included from another folder"),
    ("simulator symbols used outside sim/ and driver/",
     "the simulator is reached only through the driver table"),
    ("files over %d lines" % MAX_LINES,
     "no source file is over %d lines" % MAX_LINES),
    ("files that lock or give up the GIL without saying so at the top",
     "every file that locks or gives up the GIL says so at the top"),
    ("import cycles between the modules of the Python package",
     "no import cycle between the Python package's modules"),
)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-temp",
                    help="setup.py's build-temp folder (default: the "
                         "newest build/temp.*)")
    ap.add_argument("--csrc", default=str(ROOT),
                    help="the source tree (default: this checkout's "
                         "csrc/)")
    ap.add_argument("--repo",
                    help="the repository whose files' lines are counted "
                         "and whose cudamem/ package's imports are read "
                         "(default: the folder above --csrc)")
    ap.add_argument("--counts", action="store_true",
                    help="print the uses between layers by direction")
    ap.add_argument("--graph", action="store_true",
                    help="print the graphs read: the file -> file edges "
                         "of each folder of csrc/ and the Python imports")
    args = ap.parse_args(argv)
    root = pathlib.Path(args.csrc)
    repo = pathlib.Path(args.repo) if args.repo else root.resolve().parent
    include_bad = check_includes(root)
    build_temp = args.build_temp or default_build_temp()
    objs = read_objects(root, build_temp) if build_temp else {}
    if not objs:
        for line in include_bad:
            print("check_layers: " + line)
        print("check_layers: no compiled objects of %s found under %s; "
              "build first (python setup.py build_ext --inplace) or pass "
              "--build-temp" % (root, (build_temp or "build/temp.*")
                                + "/csrc"))
        return 2
    sym_bad, counts = check_symbols(objs)
    pkg = repo / "cudamem"
    found = [include_bad, sym_bad, check_cycles(objs),
             check_private_headers(root), check_sim_symbols(objs),
             check_line_counts(repo), check_lock_comments(root),
             check_py_imports.check(pkg, repo)]
    if args.counts:
        for (a, b), n in sorted(counts.items()):
            print("check_layers: %-10s -> %-10s %4d" % (a, b, n))
    if args.graph:
        for line in graph_lines(objs):
            print("check_layers: " + line)
        for line in check_py_imports.graph(pkg, repo):
            print("check_layers: graph python: " + line)
    broken = 0
    for (title, _), bad in zip(RULES, found, strict=True):
        if bad:
            broken += 1
            print("check_layers: == %s: %d ==" % (title, len(bad)))
            for msg in bad:
                print("check_layers: " + msg)
    if broken:
        print("check_layers: %d of %d rules broken (docs/design.md#layers "
              "and the top of tools/check_layers.py say why each rule)"
              % (broken, len(RULES)))
        return 1
    print("check_layers: %d files, %d objects (%s), %s"
          % (sum(1 for _ in root.rglob("*.[ch]")), len(objs), build_temp,
             "; ".join(ok for _, ok in RULES)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
