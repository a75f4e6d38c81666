"""The bug catalogue lives in the project: ``docs/bugs.md`` holds every class an ``ImplementationInfo.bug``
names and the one legend of the marks and detectability classes, ``dpverify list`` points into it, and no
project file refers to a path outside the repository."""

import fnmatch
import json
import re
import subprocess
from pathlib import Path

import pytest

from dpverify.cli import main
from dpverify.contract import BUG_CLASSES, DETECTABILITY_CLASSES, ImplementationInfo
from dpverify.registry import registered_implementations

ROOT = Path(__file__).resolve().parents[1]
CATALOGUE = (ROOT / "docs" / "bugs.md").read_text()
#: Each class's section of the catalogue, by its number: from its anchor to the next one.
SECTIONS = {
    int(number): text
    for number, text in re.findall(r'<a id="bug-(\d+)"></a>\n(.*?)(?=<a id="bug-|\n## )', CATALOGUE, re.S)
}


def _bundled(section: str) -> list[str]:
    """The names and name patterns a section's ``Bundled:`` item lists."""
    item = re.search(r"^- Bundled: (.*?)(?=^- |\Z)", section, re.S | re.M)
    return re.findall(r"`([\w*-]+)`", item.group(1)) if item else []


def test_every_class_has_its_anchor_and_heading_and_no_other():
    assert sorted(SECTIONS) == list(BUG_CLASSES)
    for number, text in SECTIONS.items():
        assert text.startswith(f"### {number}. "), f"bug-{number}'s anchor is not above its heading"
        assert re.search(r"^- Detectability: D[1-4]", text, re.M), f"class {number} states no detectability"
        assert re.search(r"^- Reports: ", text, re.M), f"class {number} names no public report"


def test_the_legend_defines_each_detectability_class_and_mark_once():
    legend = CATALOGUE[CATALOGUE.index('<a id="legend"></a>') : CATALOGUE.index("## The classes")]
    for name in (*DETECTABILITY_CLASSES, "!", "~", "K"):
        assert len(re.findall(rf"^\| `{re.escape(name)}` \|", legend, re.M)) == 1, name


def test_every_registered_bug_points_into_the_catalogue_and_is_listed_under_its_class():
    with_bug = [impl.info for impl in registered_implementations() if impl.info.bug is not None]
    assert with_bug, "no registered implementation names a bug class"
    for info in with_bug:
        page, anchor = info.bug_reference.split("#")
        assert (ROOT / page).resolve() == ROOT / "docs" / "bugs.md" and f'<a id="{anchor}"></a>' in CATALOGUE
        listed = _bundled(SECTIONS[info.bug])
        assert any(fnmatch.fnmatchcase(info.name, name) for name in listed), f"{info.name} not under class {info.bug}"


def test_every_name_the_catalogue_lists_is_registered_with_that_class():
    infos = {impl.info.name: impl.info for impl in registered_implementations()}
    for number, section in SECTIONS.items():
        for name in _bundled(section):
            matched = [info for registered, info in infos.items() if fnmatch.fnmatchcase(registered, name)]
            assert matched, f"class {number} lists {name}, which names no registered implementation"
            for info in matched:
                assert info.bug == number or (info.bug is None and info.expected == "known-issue"), (number, info.name)


def test_a_bug_outside_the_catalogue_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"bug must be the number of a class in docs/bugs.md \(1–16\), got 17"):
        ImplementationInfo(name="x", library="numpy", expected="violation", breaks="a rule", bug=17, detectability="D2")


def test_dpverify_list_points_each_variant_into_the_catalogue(capsys):
    assert main(["list", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["opacus-no-noise"]["bug"] == 1 and rows["opacus-no-noise"]["bug_reference"] == "docs/bugs.md#bug-1"
    assert rows["reference-dpsgd"]["bug_reference"] is None
    assert main(["list"]) == 0
    header, *lines = capsys.readouterr().out.splitlines()
    assert "bug class" in header
    assert any(line.startswith("opacus-shuffled-batches ") and "docs/bugs.md#bug-9" in line for line in lines)


def test_no_project_file_refers_to_a_path_outside_the_repository():
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: no list of the project's files")
    # Written in pieces so that this file does not match itself.
    outside = re.compile("|".join([r"\.\./" + "shared", r"(?<![\w./-])" + "shar" + "ed/", r"bugs\.md" + " rows?\\b"]))
    found = []
    for name in listed.stdout.split("\0"):
        path = ROOT / name
        if name and path.is_file():
            text = path.read_bytes().decode("utf-8", errors="ignore")
            found += [f"{name}: {match.group(0)!r}" for match in outside.finditer(text)]
    assert not found, f"project files that refer outside the repository: {found[:20]}"
