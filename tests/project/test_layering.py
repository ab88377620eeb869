"""Dependency rules of docs/architecture.md, checked statically and in fresh interpreters.

- The top-level packages form one order, ``theory < meanfield < experiments < paper_figs <
  meanfield_cli``: a package imports only packages below it, and an import inside a function
  counts too (checked on the source, :func:`test_no_package_imports_upward`).
- ``meanfield`` loads neither sympy, matplotlib, ``theory``, ``experiments`` nor ``paper_figs``;
  ``theory`` loads neither torch, matplotlib, ``meanfield``, ``experiments`` nor ``paper_figs``.
- ``meanfield_cli`` (the ``meanfield`` command, the ``reproduce`` pipeline and the registry) is the
  top layer: importing any module of ``experiments`` loads neither ``meanfield_cli`` nor
  ``paper_figs``, and importing ``paper_figs`` or any figure module loads no ``meanfield_cli``.
- The run engine, ``experiments/engine``, is below the stages: its modules import nothing else
  of ``experiments``, and they import each other in one order, without a cycle (lazy imports
  included). Outside it (tests excepted) the engine is imported through its door,
  ``experiments.engine``, never a private ``experiments.engine._x``.
- The library's type aliases are defined once, in ``meanfield/_typing.py``.
- No module imports an underscore name from another module (``from m import _x``, ``m._x``), and
  no module reaches into an underscore module of another top-level package (``theory._m``): a
  package's ``__init__`` is its door. ``theory`` and ``paper_figs`` are held to it; the packages
  of :data:`PRIVATE_IMPORTS_PENDING` may not add any.
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

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
    ``require_theory()``: tests/project/test_packaging.py checks that, and
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
    assert {
        "experiments.real_data",
        "experiments.engine._stage",
        "experiments.engine._results",
    } <= set(mods)
    assert {"experiments.synthetic.mean_field", "experiments.verify_bounds.checks"} <= set(mods)
    assert "meanfield_cli.main" in _modules("meanfield_cli")


#: The run engine: a subpackage of ``experiments`` below the stages, entered through its
#: ``__init__`` (docs/architecture.md, "The run engine").
ENGINE = "experiments.engine"
ENGINE_DIR = ROOT / "experiments" / "engine"
#: Folders whose modules must not import a private engine module (tests/ may, for internals).
OUTSIDE_ENGINE = (*LAYERS, "benchmarks", "examples")


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str, root: Path) -> bool:
    base = root.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _imported_modules(path: Path, root: Path = ROOT) -> dict[str, int]:
    """Full names of the modules ``path`` imports, with a line of each.

    Every ``import`` statement counts, at module level or inside a function, a class or an
    ``if``. A relative import is resolved against the module's package; ``from P import x``
    names ``P.x`` when that is a module or package under ``root``, else ``P``.
    """
    package = _module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    out: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level > len(package):
                names = ["<relative import above the package>"]
            else:
                base = package[: len(package) - node.level + 1] if node.level else []
                parent = ".".join([*base, *([node.module] if node.module else [])])
                names = [
                    f"{parent}.{alias.name}"
                    if _is_module(f"{parent}.{alias.name}", root)
                    else parent
                    for alias in node.names
                ]
        else:
            continue
        for name in names:
            out.setdefault(name, node.lineno)
    return out


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of ``graph`` (node -> the nodes it imports) as a path, or ``[]``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def _engine_graph(root: Path = ROOT, engine: str = ENGINE) -> dict[str, set[str]]:
    """Each module of the engine -> the engine modules it imports (lazy imports included)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(root.joinpath(*engine.split(".")).rglob("*.py")):
        imported = _imported_modules(path, root)
        inside = {m for m in imported if m == engine or m.startswith(engine + ".")}
        graph[_module_name(path, root)] = inside - {_module_name(path, root)}
    return graph


def test_the_engine_imports_no_stage():
    """The engine is below the stages: its modules import nothing of ``experiments`` outside it."""
    bad: dict[str, list[str]] = {}
    paths = sorted(ENGINE_DIR.rglob("*.py"))
    assert len(paths) > 5, "the engine has too few modules: the scan is broken"
    for path in paths:
        out = sorted(
            f"{name} (line {line})"
            for name, line in _imported_modules(path).items()
            if (name == "experiments" or name.startswith("experiments."))
            and not (name == ENGINE or name.startswith(ENGINE + "."))
        )
        if out:
            bad[str(path.relative_to(ROOT))] = out
    assert not bad, f"engine modules that import experiments outside the engine: {bad}"


def test_the_engine_modules_import_no_cycle():
    """The modules of the engine form an order: no cycle, even through an import in a function.

    A private module never imports the door (``experiments.engine``), which imports them all.
    """
    graph = _engine_graph()
    assert f"{ENGINE}._execution" in graph[f"{ENGINE}._runner"], "the scan is broken"
    assert not _cycle(graph), f"engine modules import each other in a circle: {_cycle(graph)}"


def test_private_engine_modules_are_imported_inside_the_engine_only():
    """Outside ``experiments/engine`` (tests/ excepted) the engine is imported through its door."""
    bad: dict[str, list[str]] = {}
    for folder in OUTSIDE_ENGINE:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if ENGINE_DIR in path.parents:
                continue
            private = sorted(
                f"{name} (line {line})"
                for name, line in _imported_modules(path).items()
                if name.startswith(ENGINE + "._")
            )
            if private:
                bad[str(path.relative_to(ROOT))] = private
    assert not bad, f"modules that import a private module of the engine: {bad}"


def test_the_engine_scan_resolves_relative_and_lazy_imports(tmp_path):
    """The resolver follows relative imports inside functions; the cycle finder finds a circle."""
    eng = tmp_path / "pkg" / "eng"
    eng.mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "stage.py").write_text("")
    (eng / "__init__.py").write_text("from ._a import f\n")
    (eng / "_a.py").write_text("def f():\n    from ._b import g\n")
    (eng / "_b.py").write_text("from . import _a\ndef g():\n    from ..stage import x\n")
    assert set(_imported_modules(eng / "_b.py", tmp_path)) == {"pkg.eng._a", "pkg.stage"}
    graph = _engine_graph(tmp_path, "pkg.eng")
    assert graph == {
        "pkg.eng": {"pkg.eng._a"},
        "pkg.eng._a": {"pkg.eng._b"},
        "pkg.eng._b": {"pkg.eng._a"},
    }
    assert _cycle(graph) == ["pkg.eng._a", "pkg.eng._b", "pkg.eng._a"]
    (eng / "_b.py").write_text("import pkg.eng\n")
    assert _cycle(_engine_graph(tmp_path, "pkg.eng")) == [
        "pkg.eng",
        "pkg.eng._a",
        "pkg.eng._b",
        "pkg.eng",
    ]


#: Packages not yet held to :func:`test_no_private_name_is_imported_from_another_module`, with
#: the number of private imports each had when the check came in (2026-11-26): the count may only
#: fall. Delete a package's entry once it has none, and the check holds it like ``theory``.
PRIVATE_IMPORTS_PENDING: dict[str, int] = {}


def _is_private(name: str) -> bool:
    """An underscore name: ``_x`` or ``__x``, but not a dunder such as ``__version__``."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_imports(path: Path, root: Path = ROOT) -> list[str]:
    """The private names and modules that ``path`` takes from another module, one line each.

    Two kinds count, at module level or inside a function:

    * **a private name** of another module: ``from M import _x`` (``as`` another name or the same
      one, a re-export counts too) or ``M._x`` with ``M`` a module bound by an ``import``, where
      ``_x`` is not a module;
    * **a private module of another top-level package**: ``import p._m``, ``from p._m import x``,
      ``from p import _m`` or ``p._m`` outside ``p``'s top-level package. Inside it, a private
      module is one of the package's own (``from theory import _symbols`` in ``theory.symbolic``).

    Only the modules of this tree count (``argparse._SubParsersAction`` does not). Dunder names
    (``__version__``, ``__all__``) are public.
    """
    me = _module_name(path, root)
    package = me.split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    out: list[str] = []

    def private_module(name: str, line: int, how: str) -> None:
        parts = name.split(".")
        if (
            parts[0] != package[0]
            and any(_is_private(p) for p in parts[1:])
            and _is_module(parts[0], root)
        ):
            out.append(f"line {line}: {how} (private module of {parts[0]})")

    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    modules: dict[str, str] = {}  # a local name -> the module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                private_module(alias.name, node.lineno, f"import {alias.name}")
                if not _is_module(alias.name, root):
                    continue  # not a module of this tree: the standard library, a dependency
                if alias.asname:
                    modules[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    modules[top] = top
        elif isinstance(node, ast.ImportFrom):
            if node.level > len(package):
                continue  # climbs out of the tree: test_no_package_imports_upward reports it
            base = package[: len(package) - node.level + 1] if node.level else []
            parent = ".".join([*base, *([node.module] if node.module else [])])
            shown = "." * node.level + (node.module or "")
            private_module(parent, node.lineno, f"from {shown} import ...")
            for alias in node.names:
                full = f"{parent}.{alias.name}"
                if _is_module(full, root):
                    modules[alias.asname or alias.name] = full
                    private_module(full, node.lineno, f"from {shown} import {alias.name}")
                elif _is_private(alias.name) and _is_module(parent, root):
                    out.append(f"line {node.lineno}: from {shown} import {alias.name}")

    def resolve(expr: ast.expr) -> str | None:
        """The module that ``expr`` (a name or a chain of attributes) stands for, if any."""
        if isinstance(expr, ast.Name):
            return modules.get(expr.id)
        if isinstance(expr, ast.Attribute) and (mod := resolve(expr.value)) is not None:
            full = f"{mod}.{expr.attr}"
            return full if _is_module(full, root) else None
        return None

    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not _is_private(node.attr):
            continue
        mod = resolve(node.value)
        if mod is None or mod == me:
            continue
        full = f"{mod}.{node.attr}"
        if _is_module(full, root):
            private_module(full, node.lineno, full)
        else:
            out.append(f"line {node.lineno}: {full}")
    return sorted(set(out), key=lambda s: (int(s.split()[1].rstrip(":")), s))


def _private_imports_of(package: str, root: Path = ROOT) -> dict[str, list[str]]:
    """Each module of ``package`` with a private import -> what :func:`_private_imports` finds."""
    found: dict[str, list[str]] = {}
    for path in sorted((root / package).rglob("*.py")):
        if hits := _private_imports(path, root):
            found[str(path.relative_to(root))] = hits
    return found


def test_no_private_name_is_imported_from_another_module():
    """A name used across modules has no underscore: a package's ``__init__`` is its door.

    An underscore name (``_x``) is private to its module, and an underscore module (``_m``) to
    its top-level package: a module of another package goes through a public module or a door.
    The packages of :data:`PRIVATE_IMPORTS_PENDING` are not held to it yet; their counts only
    fall.
    """
    assert set(PRIVATE_IMPORTS_PENDING) < set(LAYERS), "a pending package is not a layer"
    bad: dict[str, list[str]] = {}
    grew: dict[str, str] = {}
    for package in LAYERS:
        found = _private_imports_of(package)
        if package not in PRIVATE_IMPORTS_PENDING:
            bad.update(found)
        elif (count := sum(map(len, found.values()))) > PRIVATE_IMPORTS_PENDING[package]:
            grew[package] = f"{count} > {PRIVATE_IMPORTS_PENDING[package]}"
    assert not bad, f"private names or modules imported from another module: {bad}"
    assert not grew, f"pending packages with more private imports than recorded: {grew}"


def test_the_private_import_scan_sees_names_modules_and_attributes(tmp_path):
    """Names, re-exports, attribute use and private modules of another package are found."""
    for pkg in ("pkg", "pkg/sub", "low"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    for mod in ("pkg/_priv.py", "pkg/sub/_core.py", "pkg/sub/public.py", "low/_inner.py"):
        (tmp_path / mod).write_text("")
    mod = tmp_path / "pkg" / "sub" / "m.py"
    mod.write_text(
        "from __future__ import annotations\n"
        "from ._core import helper, _hidden\n"
        "from pkg import _priv, __version__\n"
        "from . import _core as C, public\n"
        "import low._inner\n"
        "import pkg.sub.public as P\n"
        "import argparse\n"
        "from os import _exit\n"
        "def f():\n"
        "    from .public import _x as _x\n"
        "    return C._y, C.ok, P._z, low._inner.y, _priv.ok, _priv._w, argparse._Action\n"
    )
    assert _private_imports(mod, tmp_path) == [
        "line 2: from ._core import _hidden",
        "line 5: import low._inner (private module of low)",
        "line 10: from .public import _x",
        "line 11: low._inner (private module of low)",
        "line 11: pkg._priv._w",
        "line 11: pkg.sub._core._y",
        "line 11: pkg.sub.public._z",
    ]
    below = tmp_path / "low" / "m.py"
    below.write_text("from . import _inner\nfrom low._inner import x\nimport low._inner as I\n")
    assert _private_imports(below, tmp_path) == []


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
