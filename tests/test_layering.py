"""Dependency rules of docs/architecture.md, checked statically and in fresh interpreters.

- The top-level packages form one order, ``theory < meanfield < experiments < paper_figs <
  meanfield_cli``: a package imports only packages below it, and an import inside a function
  counts too (checked on the source, :func:`test_no_package_imports_upward`).
- ``meanfield`` loads neither sympy, matplotlib, ``theory``, ``experiments`` nor ``paper_figs``;
  ``theory`` loads neither torch, matplotlib, ``meanfield``, ``experiments`` nor ``paper_figs``.
- ``meanfield_cli`` (the ``meanfield`` command, the ``reproduce`` pipeline and the registry) is the
  top layer: importing any module of ``experiments`` loads neither ``meanfield_cli`` nor
  ``paper_figs``, and importing ``paper_figs`` or any figure module loads no ``meanfield_cli``.
- The library's type aliases are defined once, in ``meanfield/_typing.py``.
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: The top-level packages from the bottom up: each may import only those before it.
LAYERS = ("theory", "meanfield", "experiments", "paper_figs", "meanfield_cli")


def loaded_after(statement: str, *, top_level: bool = True) -> set[str]:
    code = f"import sys; {statement}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=ROOT
    )
    names = out.stdout.split()
    return {name.split(".")[0] for name in names} if top_level else set(names)


def _modules(package: str) -> list[str]:
    """Modules and subpackages of ``package``, recursively."""
    found: list[str] = []

    def walk(path: Path, prefix: str) -> None:
        for m in pkgutil.iter_modules([str(path)]):
            name = f"{prefix}.{m.name}"
            found.append(name)
            if m.ispkg:
                walk(path / m.name, name)

    walk(ROOT / package, package)
    return sorted(found)


def _imported_packages(path: Path, package_dir: Path) -> dict[str, int]:
    """Top-level packages that ``path`` (a module under ``package_dir``) imports, with a line of each.

    Every ``import`` statement counts, at module level or inside a function, a class or an
    ``if``; a relative import stays inside the package unless it climbs above it.
    """
    package = package_dir.name
    depth = len(path.relative_to(package_dir).parts)  # 1 for a module at the package's top
    out: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                names = [node.module or ""]
            elif node.level > depth:
                names = ["<relative import above the package>"]
            else:
                names = [package]
        else:
            continue
        for name in names:
            out.setdefault(name.split(".")[0], node.lineno)
    return out


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


def test_no_package_imports_upward():
    """Every ``.py`` file of each layer, parsed: it imports no layer above its own.

    ``meanfield`` imports ``theory`` (below it) only inside the functions that need it, after
    ``require_theory()``: tests/test_packaging.py checks that, and
    :func:`test_import_does_not_load` that ``import meanfield`` loads no ``theory``.
    """
    bad: dict[str, list[str]] = {}
    scanned = dict.fromkeys(LAYERS, 0)
    for rank, package in enumerate(LAYERS):
        above = set(LAYERS[rank + 1 :]) | {"<relative import above the package>"}
        for path in sorted((ROOT / package).rglob("*.py")):
            scanned[package] += 1
            up = sorted(
                f"{name} (line {line})"
                for name, line in _imported_packages(path, ROOT / package).items()
                if name in above
            )
            if up:
                bad[str(path.relative_to(ROOT))] = up
    assert all(scanned.values()), f"a layer has no module: the scan is broken ({scanned})"
    assert not bad, f"modules that import a layer above their own: {bad}"


def test_the_scan_sees_imports_inside_functions(tmp_path):
    """The static scan finds a lazy import, a relative one and one that climbs out."""
    mod = tmp_path / "pkg" / "sub" / "m.py"
    mod.parent.mkdir(parents=True)
    mod.write_text(
        "from . import x\n"
        "def f():\n"
        "    import paper_figs.fig_demo\n"
        "    from meanfield_cli.main import main\n"
        "    from ... import y\n"
    )
    found = _imported_packages(mod, tmp_path / "pkg")
    assert set(found) == {
        "pkg",
        "paper_figs",
        "meanfield_cli",
        "<relative import above the package>",
    }


def test_every_top_level_package_is_a_layer():
    """A new top-level package gets a place in :data:`LAYERS` (and in docs/architecture.md)."""
    tops = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert tops == set(LAYERS)


def test_stage_modules_are_found():
    mods = _modules("experiments")
    assert {"experiments.real_data", "experiments.stage", "experiments.results"} <= set(mods)
    assert {"experiments.synthetic.mean_field", "experiments.verify_bounds.checks"} <= set(mods)
    assert "meanfield_cli.main" in _modules("meanfield_cli")


def test_below_the_command_line_nothing_imports_upward():
    """Every module of experiments, in one fresh interpreter each."""
    bad = {}
    for mod in ["experiments", *_modules("experiments")]:
        loaded = loaded_after(f"import {mod}", top_level=False)
        up = sorted(n for n in loaded if n.split(".")[0] in ("paper_figs", "meanfield_cli"))
        if up:
            bad[mod] = up[:3]
    assert not bad, f"modules of experiments load paper_figs or meanfield_cli: {bad}"


def test_figures_do_not_import_the_command_line():
    bad = {}
    for mod in ["paper_figs", *_modules("paper_figs")]:
        loaded = loaded_after(f"import {mod}", top_level=False)
        up = sorted(n for n in loaded if n.split(".")[0] == "meanfield_cli")
        if up:
            bad[mod] = up[:3]
    assert not bad, f"paper_figs modules load meanfield_cli: {bad}"


def test_type_aliases_are_defined_once():
    """Every alias of ``meanfield._typing`` is assigned there and nowhere else in the library."""
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
