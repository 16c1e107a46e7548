#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Check that data flows down the layers of csrc/: no file includes the
header of a layer above its own.

The layers, lowest first: driver, context, memory, array, features,
then module.c and retcheck.c (the debug build's return check) at the top; cm.h (at the
top of csrc/) is seen by every layer and may include only the driver's
headers.  The simulator (csrc/sim/) is a
backend of the driver table: it includes the driver's headers and its
own, nothing else, and no other layer includes it.  Reads the
`#include "..."` lines of every .c and .h file under csrc/; exits 1
naming each include that goes up (or into the simulator).
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent / "csrc"
RANK = {"driver": 0, "cm.h": 0, "context": 1, "memory": 2, "array": 3,
        "features": 4, "module.c": 5, "retcheck.c": 5}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer(rel):
    """The layer of a path relative to csrc/ ("memory/pool.c" -> memory)."""
    return rel.split("/", 1)[0]


def main():
    bad = []
    for path in sorted(ROOT.rglob("*.[ch]")):
        rel = path.relative_to(ROOT).as_posix()
        own = layer(rel)
        for inc in INCLUDE.findall(path.read_text()):
            target = layer(inc)
            if target not in RANK and target != "sim":
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
            elif own == "cm.h" and target not in ("driver",):
                bad.append("cm.h: includes %r; it may include only "
                           "driver/ headers" % inc)
            elif RANK[target] > RANK[own]:
                bad.append("%s (%s) includes %r of the higher layer %s"
                           % (rel, own, inc, target))
    for line in bad:
        print("check_layers: " + line)
    if bad:
        return 1
    print("check_layers: %d files, every include goes down the layers"
          % sum(1 for _ in ROOT.rglob("*.[ch]")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
