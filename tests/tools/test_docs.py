# SPDX-License-Identifier: MIT
"""The users' documents: docs/api.md lists every public name (its index
against ``cudamem.__all__``, both ways), its links land, and no user
document cites what a user cannot look up (numbered runs, calls,
sessions or issues of the project's own work)."""

import ast
import re

import pytest

import cudamem
from helpers import ROOT

API = ROOT / "docs" / "api.md"
USER_DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]


def api_text():
    return API.read_text(encoding="utf-8")


def index_entries(text):
    """{name: anchor} of the index section ("Every public name")."""
    m = re.search(r'<a id="index"></a>\n## .*?\n(.*?)\n---\n', text,
                  re.DOTALL)
    assert m, "docs/api.md has no index section"
    got = {}
    for line in m.group(1).splitlines():
        e = re.fullmatch(r"- `([A-Za-z_][A-Za-z0-9_]*)`: \[[^\]]+\]"
                         r"\(#([a-z0-9-]+)\)", line)
        if line.startswith("- "):
            assert e, "an index line not of the form - `name`: [..](#..): "\
                      "%r" % line
            assert e.group(1) not in got, "listed twice: %s" % e.group(1)
            got[e.group(1)] = e.group(2)
    return got


def section(text, anchor):
    """The text from <a id=anchor> to the next level-2 heading."""
    start = text.index('<a id="%s"></a>' % anchor)
    end = text.find("\n## ", text.index("\n", start) + 1)
    return text[start:end if end >= 0 else len(text)]


def test_index_is_all_both_ways():
    listed = set(index_entries(api_text()))
    public = set(cudamem.__all__)
    assert not public - listed, "in __all__, not in docs/api.md's index: " \
        "%s" % sorted(public - listed)
    assert not listed - public, "in docs/api.md's index, not in __all__: " \
        "%s" % sorted(listed - public)


def test_each_indexed_name_is_documented_in_its_section():
    text = api_text()
    for name, anchor in index_entries(text).items():
        assert '<a id="%s"></a>' % anchor in text, (name, anchor)
        body = section(text, anchor)
        assert re.search(r"`%s\b" % re.escape(name), body), \
            "%s is indexed under #%s, which does not name it" % (name,
                                                                  anchor)


def test_internal_links_of_api_md_land():
    text = api_text()
    anchors = set(re.findall(r'<a id="([^"]+)"></a>', text))
    for target in set(re.findall(r"\]\(#([^)]+)\)", text)):
        assert target in anchors, "link to a missing anchor: #%s" % target


def test_seeing_the_memory_names_are_documented():
    body = section(api_text(), "seeing-the-memory")
    for name in ("memory_history", "memory_snapshot", "dump_snapshot"):
        assert "`%s(" % name in body, name


# What a user cannot look up: "run 12", "call 3", "session 25",
# "issue 40", "#40".  Dates and commit shas are fine.
NUMBERED = re.compile(
    r"\b(?:runs?|calls?|sessions?|issues?)\s+\d{1,5}\b"
    r"|(?<![\w&/])#\d+\b", re.IGNORECASE)


@pytest.mark.parametrize("path", USER_DOCS, ids=lambda p: p.name)
def test_no_numbered_runs_or_issues(path):
    bad = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(),
                             1):
        for m in NUMBERED.finditer(line):
            bad.append("%s:%d: %s" % (path.name, i, m.group(0)))
    assert not bad, "\n".join(bad)


def test_no_internal_log_among_the_users_docs():
    names = {p.name for p in (ROOT / "docs").iterdir()}
    assert "gpu-session.md" not in names
    for path in USER_DOCS:
        assert "gpu-session" not in path.read_text(encoding="utf-8"), path


def test_changelog_has_one_unreleased_section():
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    heads = re.findall(r"^## \[?([^\]\n]+)\]?(.*)$", text, re.MULTILINE)
    unreleased = [h for h in heads
                  if "unreleased" in (h[0] + h[1]).lower()]
    assert len(unreleased) == 1, heads


def test_quick_subset_files_exist():
    # QUICK of tests/conftest.py, read from its source.
    tree = ast.parse((ROOT / "tests" / "conftest.py").read_text())
    quick = None
    for node in tree.body:
        if (isinstance(node, ast.Assign)
                and getattr(node.targets[0], "id", None) == "QUICK"):
            quick = [c.value for c in node.value.args[0].elts]
    assert quick, "tests/conftest.py has no QUICK"
    for rel in quick:
        assert (ROOT / "tests" / rel).is_file(), rel
    layers = {rel.split("/")[0] for rel in quick}
    assert {"array", "memory", "runtime", "compat", "robustness",
            "tools"} <= layers, layers
