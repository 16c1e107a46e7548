#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Check that calls and includes go down the layers of csrc/.

The layers, lowest first: the simulator (sim/, a backend the driver
table is filled from), driver (with retcheck.c, the debug build's return
check, which any layer calls on what it hands Python), context, memory,
array, features, then module.c at the top; docs/design.md#layers says
what each owns.

Two checks:

- includes: every `#include "..."` of every .c and .h file under csrc/
  names a header of its own layer or a lower one; the simulator includes
  only its own headers and the driver table's, and nothing outside sim/
  includes a sim/ header.
- calls: the compiled objects (`nm` of each .o that setup.py's build left
  under its build-temp folder, for a source that still exists) say which
  global symbols each file defines and which it uses.  A file that uses a
  symbol defined in a higher layer fails, and so do two layers that use
  each other.  A lower layer reaches a higher one only through a table of
  function pointers the higher one fills at module init (cm_ctx_up in
  context/context.h, cm_mem_up in memory/memory.h, cm_array_up in
  array/array.h),
  which nm does not see as a use.

Exits 1 naming each include or use that goes up; 2 when no objects are
found (build first: python setup.py build_ext --inplace).
"""

import argparse
import collections
import glob
import os
import pathlib
import re
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
ROOT = REPO / "csrc"
RANK = {"sim": -1, "driver": 0, "context": 1, "memory": 2, "array": 3,
        "features": 4, "module.c": 5}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
DEFINED = set("TDBRCGSVW")

# Uses of a symbol of a higher layer that are known and accepted, as
# {(file, symbol): why}; file is relative to csrc/ ("memory/memory.c").
# Empty: every call goes down.  An entry is a debt to pay, named here
# rather than hidden, and the check reports it on every run.
ALLOWED_UP = {}


def layer(rel):
    """The layer of a path relative to csrc/ ("memory/limit.c" -> memory)."""
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-temp",
                    help="setup.py's build-temp folder (default: the "
                         "newest build/temp.*)")
    ap.add_argument("--csrc", default=str(ROOT),
                    help="the source tree (default: this checkout's "
                         "csrc/)")
    ap.add_argument("--counts", action="store_true",
                    help="print the uses between layers by direction")
    args = ap.parse_args(argv)
    root = pathlib.Path(args.csrc)
    bad = check_includes(root)
    build_temp = args.build_temp or default_build_temp()
    objs = read_objects(root, build_temp) if build_temp else {}
    if not objs:
        print("check_layers: no compiled objects of %s found under %s; "
              "build first (python setup.py build_ext --inplace) or pass "
              "--build-temp" % (root, (build_temp or "build/temp.*")
                                + "/csrc"))
        return 2
    sym_bad, counts = check_symbols(objs)
    bad += sym_bad
    if args.counts:
        for (a, b), n in sorted(counts.items()):
            print("check_layers: %-10s -> %-10s %4d" % (a, b, n))
    for line in bad:
        print("check_layers: " + line)
    if bad:
        return 1
    print("check_layers: %d files, every include goes down the layers; "
          "%d objects (%s), every use of another layer's symbol goes down"
          % (sum(1 for _ in root.rglob("*.[ch]")), len(objs), build_temp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
