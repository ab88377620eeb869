"""The code and the docs cite only documents in the repository, and only sections that exist.

- No source or documentation file names a document outside the repository (the design notes the
  project was written from are not shipped).
- Every reference of the form ``docs/<page>.md §<mark>`` points at a heading of that page whose
  number is ``<mark>`` (``§5``, ``§2a``, ``§A3``, ``§4.2``); the other marks of a list such as
  ``docs/theory.md §B1, §B2`` or ``§2–§4`` are checked against the same page.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DIRS = (
    "meanfield", "theory", "experiments", "paper_figs", "meanfield_cli", "benchmarks", "tests",
    "docs",
)  # fmt: skip
TOP_FILES = ("README.md", "CHANGELOG.md", "Makefile", "pyproject.toml")

#: Documents that are not in the repository (spelled here in lower case so that a search of the
#: tree for their names does not find this file).
OUTSIDE = tuple(
    f"{name.upper()}.md" for name in ("theory", "experiments", "design", "api", "ecosystem")
)

#: Files whose references are being rewritten on other branches; remove once merged.
PENDING: tuple[str, ...] = ()

#: Marks that stand for "a section number" in prose (docs/theory.md explains its own numbering).
PLACEHOLDERS = {"N"}

_MARK = r"[A-Z]?\d*[a-z]?(?:\.\d+)?"
_REF = re.compile(
    r"docs/(?P<page>[\w/]+\.md)\)?[`\"]?\s*,?\s*"
    r"(?P<marks>§\s*" + _MARK + r"(?:\s*(?:,|–|-|and|or|;)\s*§\s*" + _MARK + r")*)"
)
_HEADING = re.compile(r"^#+\s+(?P<mark>" + _MARK + r")\.?\s")


def _files() -> list[Path]:
    out = [ROOT / name for name in TOP_FILES if (ROOT / name).exists()]
    for d in DIRS:
        out += sorted(p for p in (ROOT / d).rglob("*") if p.suffix in (".py", ".md"))
    return [p for p in out if "__pycache__" not in p.parts]


def _pending(path: Path) -> bool:
    rel = path.relative_to(ROOT).as_posix()
    return any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in PENDING)


def _headings(page: Path) -> set[str]:
    marks: set[str] = set()
    in_code = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
            continue
        m = None if in_code else _HEADING.match(line)
        if m and m.group("mark"):
            marks.add(m.group("mark"))
    return marks


def test_reference_pattern_reads_lists_and_ranges():
    text = "see docs/theory.md §B1, §B2 and docs/rounding.md §4.2; docs/theory.md §2–§4 (x)"
    found = [
        (m.group("page"), re.findall(r"§\s*(" + _MARK + ")", m.group("marks")))
        for m in _REF.finditer(text)
    ]
    assert found == [
        ("theory.md", ["B1", "B2"]),
        ("rounding.md", ["4.2"]),
        ("theory.md", ["2", "4"]),
    ]
    assert {"1", "2a", "A3", "5.1"} <= {
        _HEADING.match(h).group("mark")  # type: ignore[union-attr]
        for h in ("## 1. The √n regime", "### 2a. Certified", "### A3. Off-axis", "### 5.1 Block")
    }


def test_no_reference_outside_the_repository():
    offenders = []
    for path in _files():
        if _pending(path) or path == Path(__file__).resolve():
            continue
        text = path.read_text(encoding="utf-8")
        for lineno, line in enumerate(text.splitlines(), 1):
            if any(name in line for name in OUTSIDE):
                offenders.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()}")
    assert not offenders, "references to documents not in the repository:\n" + "\n".join(offenders)


@pytest.mark.parametrize("page", sorted(p.name for p in (ROOT / "docs").glob("*.md")))
def test_cited_sections_exist(page):
    marks = _headings(ROOT / "docs" / page)
    missing = []
    for path in _files():
        if _pending(path):
            continue
        text = path.read_text(encoding="utf-8")
        for m in _REF.finditer(text):
            if m.group("page") != page:
                continue
            for mark in re.findall(r"§\s*(" + _MARK + ")", m.group("marks")):
                if mark and mark not in marks and mark not in PLACEHOLDERS:
                    lineno = text.count("\n", 0, m.start()) + 1
                    missing.append(f"{path.relative_to(ROOT)}:{lineno}: docs/{page} §{mark}")
    assert not missing, f"sections not found in docs/{page}:\n" + "\n".join(missing)
