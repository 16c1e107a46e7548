# SPDX-License-Identifier: MIT
"""docs/design.md's file map is generated from the sources
(tools/file_map.py): it must be current, and it must name every C file."""

import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "file_map.py"


def test_the_file_map_is_current():
    r = subprocess.run([sys.executable, str(TOOL), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_file_map_names_every_c_file_and_no_other():
    doc = (REPO / "docs" / "design.md").read_text()
    a = doc.index("<!-- file map: begin")
    b = doc.index("<!-- file map: end -->")
    table = doc[a:b]
    for path in sorted((REPO / "csrc").rglob("*.[ch]")):
        folder = path.parent.relative_to(REPO / "csrc").as_posix()
        row = "| `csrc/` |" if folder == "." else "| `%s/` |" % folder
        line = next((ln for ln in table.splitlines() if ln.startswith(row)),
                    None)
        assert line is not None, "no row for %s" % folder
        assert "`%s` " % path.name in line, "%s missing from the map" % path


def test_a_stale_map_is_refused(tmp_path):
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    (repo / "csrc" / "x").mkdir(parents=True)
    (repo / "csrc" / "x" / "a.c").write_text(
        "/* SPDX-License-Identifier: MIT */\n/*\n * x/a.c: the first thing."
        "  More.\n */\n")
    (repo / "docs" / "design.md").write_text(
        "# d\n\n<!-- file map: begin (tools/file_map.py writes it) -->\n"
        "<!-- file map: end -->\n")
    check = [sys.executable, str(TOOL), "--check", "--repo", str(repo)]
    assert subprocess.run(check, capture_output=True).returncode == 1
    subprocess.run([sys.executable, str(TOOL), "--repo", str(repo)],
                   check=True, capture_output=True)
    assert subprocess.run(check, capture_output=True).returncode == 0
    doc = (repo / "docs" / "design.md").read_text()
    assert "`a.c` the first thing." in doc
