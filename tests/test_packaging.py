"""Packaging metadata: one version number, type markers shipped, citation and licence present."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import meanfield

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_version_has_one_source():
    proj = _pyproject()
    assert "version" not in proj["project"]
    assert "version" in proj["project"]["dynamic"]
    assert proj["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "meanfield.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+(\S*)", meanfield.__version__)


def test_type_markers_are_package_data():
    data = _pyproject()["tool"]["setuptools"]["package-data"]
    for pkg in ("meanfield", "theory"):
        assert (ROOT / pkg / "py.typed").is_file()
        assert "py.typed" in data[pkg]


def test_licence_matches_the_declared_one():
    assert _pyproject()["project"]["license"] == {"text": "MIT"}
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")


def test_citation_cites_toolkit_and_paper():
    yaml = pytest.importorskip("yaml")  # PyYAML comes with the hf extra (transformers)
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software"
    assert str(cff["version"]) == meanfield.__version__
    (paper,) = cff["references"]
    assert paper["title"] == "How Smooth Is Attention?"
    assert [a["family-names"] for a in paper["authors"]] == ["Castin", "Ablin", "Peyré"]
    assert paper["year"] == 2024
    assert any("2312.14820" in i["value"] for i in paper["identifiers"])


def test_changelog_has_an_unreleased_section():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in text


def test_hypothesis_profiles():
    import os

    from hypothesis import settings

    ci = settings.get_profile("ci")
    assert ci.derandomize is True and ci.database is None and ci.deadline is None
    assert settings.get_profile("dev").derandomize is False
    on_ci = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
    expected = os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if on_ci else "dev")
    assert settings.default.derandomize is settings.get_profile(expected).derandomize
