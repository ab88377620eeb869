"""Dependency rules of docs/architecture.md, checked in fresh interpreters.

- ``meanfield`` loads neither sympy, matplotlib, ``theory``, ``experiments`` nor ``paper_figs``;
  ``theory`` loads neither torch, matplotlib, ``meanfield``, ``experiments`` nor ``paper_figs``.
- ``experiments.app`` (the CLI, the ``reproduce`` pipeline and the registry) is the top layer:
  importing any other module of ``experiments`` loads neither ``experiments.app`` nor
  ``paper_figs``, and importing ``paper_figs`` or any figure module loads no ``experiments.app``.
- The deprecated shims in :data:`SHIMS` re-export the app layer for one release and are the only
  exceptions.
- The library's type aliases are defined once, in ``meanfield/_typing.py``.
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Modules kept for one release so that old imports work; they import the app layer.
SHIMS = {"experiments.cli", "experiments.reproduce", "experiments.__main__", "paper_figs.make_all"}


def loaded_after(statement: str, *, top_level: bool = True) -> set[str]:
    code = f"import sys; {statement}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=ROOT
    )
    names = out.stdout.split()
    return {name.split(".")[0] for name in names} if top_level else set(names)


def _modules(package: str) -> list[str]:
    """Modules and subpackages of ``package``, recursively, except the shims and the app layer."""
    found: list[str] = []

    def walk(path: Path, prefix: str) -> None:
        for m in pkgutil.iter_modules([str(path)]):
            name = f"{prefix}.{m.name}"
            if name in SHIMS or name == "experiments.app":
                continue
            found.append(name)
            if m.ispkg:
                walk(path / m.name, name)

    walk(ROOT / package, package)
    return sorted(found)


@pytest.mark.parametrize(
    ("statement", "forbidden"),
    [
        (
            "import meanfield",
            {"sympy", "matplotlib", "experiments", "paper_figs", "theory", "transformers", "ot"},
        ),
        ("import theory", {"torch", "matplotlib", "meanfield", "experiments", "paper_figs"}),
    ],
)
def test_import_does_not_load(statement, forbidden):
    loaded = loaded_after(statement)
    assert not (loaded & forbidden), f"{statement!r} loaded {sorted(loaded & forbidden)}"


def test_stage_modules_are_found():
    mods = _modules("experiments")
    assert {"experiments.real_data", "experiments.stage", "experiments.results"} <= set(mods)
    assert {"experiments.synthetic.mean_field", "experiments.verify_bounds.checks"} <= set(mods)
    assert "experiments.cli" not in mods


def test_below_the_app_layer_nothing_imports_upward():
    """Every non-app module of experiments, in one fresh interpreter each."""
    bad = {}
    for mod in _modules("experiments"):
        loaded = loaded_after(f"import {mod}", top_level=False)
        up = sorted(n for n in loaded if n == "paper_figs" or n.startswith("experiments.app"))
        up += sorted(n for n in loaded if n.startswith("paper_figs."))
        if up:
            bad[mod] = up[:3]
    assert not bad, f"modules below experiments.app import upward: {bad}"


def test_figures_do_not_import_the_app_layer():
    bad = {}
    for mod in ["paper_figs", *_modules("paper_figs")]:
        loaded = loaded_after(f"import {mod}", top_level=False)
        up = sorted(n for n in loaded if n.startswith("experiments.app"))
        if up:
            bad[mod] = up[:3]
    assert not bad, f"paper_figs modules load the app layer: {bad}"


def test_type_aliases_are_defined_once():
    """Every alias of ``meanfield._typing`` is assigned there and nowhere else in the library."""
    import ast

    from meanfield import _typing

    aliases = set(_typing.__all__)
    home = ROOT / "meanfield" / "_typing.py"
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "meanfield").rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, ast.AnnAssign):
                targets = [node.target]
            for t in targets:
                if isinstance(t, ast.Name) and t.id in aliases:
                    found.setdefault(t.id, []).append(str(path.relative_to(ROOT)))
    assert found, "no alias found at all: the scan is broken"
    again = {a: p for a, p in found.items() if p != [str(home.relative_to(ROOT))]}
    assert not again, f"aliases defined outside meanfield/_typing.py: {again}"
