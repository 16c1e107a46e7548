#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Write (or check) the file map of docs/design.md from the sources.

The map is generated, so that it cannot go stale: one row per folder of
csrc/ (sub-rooms such as memory/pool/vmm/ get rows of their own), and
for each .c and .h file the first sentence of its head comment (the
comment after the SPDX line), without the "folder/file.c:" it starts
with.  A file's line count is not written: `wc -l` says it.

    python3 tools/file_map.py          # rewrite the map in docs/design.md
    python3 tools/file_map.py --check  # exit 1 if the map is not current

The map sits between the lines "<!-- file map: begin -->" and
"<!-- file map: end -->" of docs/design.md.
"""

import argparse
import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
BEGIN = "<!-- file map: begin (tools/file_map.py writes it) -->"
END = "<!-- file map: end -->"
HEAD = re.compile(r"/\*(.*?)\*/", re.S)


def first_sentence(path):
    """The first sentence of the head comment of a C file, or ""."""
    text = path.read_text()
    blocks = HEAD.findall(text)
    for body in blocks:
        if "SPDX-License-Identifier" in body:
            continue
        lines = [re.sub(r"^\s*\*\s?", "", ln) for ln in body.splitlines()]
        # Sentences end with a full stop and two spaces (house style),
        # or a full stop at the end of a line.
        flat = ""
        for ln in (ln.strip() for ln in lines):
            if not ln:
                if flat:
                    break       # the first paragraph only
                continue
            flat += ln + ("  " if ln.endswith(".") else " ")
        flat = flat.strip()
        # Drop the "folder/file.c:" or "file.c:" the comment starts with.
        flat = re.sub(r"^[\w./]+\.[ch]:\s*", "", flat)
        sentence = flat.split(".  ", 1)[0].rstrip(".") + "."
        return sentence.replace("|", "\\|")
    return ""


def folders(csrc):
    """Every folder under csrc/ that holds a .c or .h file, csrc/ first."""
    found = sorted({p.parent for p in csrc.rglob("*.[ch]")},
                   key=lambda d: d.relative_to(csrc).as_posix())
    return found


def render(repo=REPO):
    """The map, as Markdown."""
    csrc = repo / "csrc"
    rows = ["| folder | files: what each owns (its head comment's first "
            "sentence) |", "|---|---|"]
    for d in folders(csrc):
        rel = d.relative_to(csrc).as_posix()
        name = "`csrc/`" if rel == "." else "`%s/`" % rel
        files = sorted(list(d.glob("*.c")) + list(d.glob("*.h")),
                       key=lambda p: (p.suffix != ".c", p.name))
        cells = ["`%s` %s" % (p.name, first_sentence(p)) for p in files]
        rows.append("| %s | %s |" % (name, "<br>".join(cells)))
    return "\n".join(rows) + "\n"


def splice(doc, table):
    """doc with the text between the markers replaced by table."""
    try:
        a = doc.index(BEGIN) + len(BEGIN)
        b = doc.index(END, a)
    except ValueError:
        raise SystemExit("file_map: docs/design.md has no %r ... %r markers"
                         % (BEGIN, END)) from None
    return doc[:a] + "\n" + table + doc[b:]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="exit 1 if docs/design.md's map is not current")
    ap.add_argument("--repo", default=str(REPO),
                    help="the repository (default: this checkout)")
    args = ap.parse_args(argv)
    repo = pathlib.Path(args.repo)
    design = repo / "docs" / "design.md"
    doc = design.read_text()
    new = splice(doc, render(repo))
    if args.check:
        if new != doc:
            print("file_map: docs/design.md's file map is not current; run "
                  "python3 tools/file_map.py")
            return 1
        print("file_map: docs/design.md's file map is current")
        return 0
    if new != doc:
        design.write_text(new)
        print("file_map: docs/design.md's file map rewritten")
    else:
        print("file_map: docs/design.md's file map is current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
