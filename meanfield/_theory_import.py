"""The companion package ``theory``, imported from inside ``meanfield`` with a check.

``theory`` (numpy bounds, no torch) is installed beside ``meanfield`` as a top-level package, and
the library imports it lazily, inside the few functions that need it. A top-level name can be
shadowed: a ``theory.py`` or ``theory/`` in the working directory (or the script's directory, or
on ``PYTHONPATH``) comes first on ``sys.path``, so ``from theory.bounds import ...`` would find the
user's module and fail with an obscure ``'theory' is not a package``, or worse, succeed with
something else. :func:`require_theory` checks that ``import theory`` resolves to the package
installed beside ``meanfield`` and otherwise raises :class:`ImportError` in one line, naming the
shadowing file. It cannot load ours under the same name instead: that would take the name
``theory`` from the user's own module (and ``theory`` imports itself by absolute name).

Call :func:`require_theory` right before the lazy ``from theory... import ...``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["THEORY_HOME", "require_theory"]

#: Where this installation's ``theory`` package lives: beside ``meanfield/`` (site-packages, an
#: editable install or a source checkout alike).
THEORY_HOME = Path(__file__).resolve().parent.parent / "theory"

_verified: ModuleType | None = None  # the ``theory`` module already found to be ours


def _is_ours(origin: str | None) -> bool:
    if not origin:
        return False  # a namespace package (a bare ``theory/`` directory): ours has __init__.py
    try:
        return Path(origin).resolve() == (THEORY_HOME / "__init__.py").resolve()
    except OSError:
        return False


def _where(origin: str | None, locations: Any) -> str:
    if origin:
        return origin
    found = list(locations or [])
    return str(found[0]) if found else "an unknown location"


def require_theory() -> None:
    """Import ``theory``, making sure it is the package installed beside ``meanfield``.

    Raises
    ------
    ImportError
        When ``import theory`` finds another module (the message names it and says how to fix
        it), or finds none at all. A layout without ``theory/`` beside ``meanfield/`` (a
        repackaged install) is trusted as it is.
    """
    global _verified
    mod = sys.modules.get("theory")
    if mod is not None and mod is _verified:
        return
    if mod is not None:
        origin = getattr(mod, "__file__", None)
        where = _where(origin, getattr(mod, "__path__", None))
    else:
        try:
            spec = importlib.util.find_spec("theory")
        except (ImportError, ValueError) as err:
            raise ImportError(f"cannot locate the package 'theory': {err}", name="theory") from err
        if spec is None:
            raise ImportError(
                "meanfield needs its companion package 'theory', installed with it, which is "
                "missing: reinstall meanfield",
                name="theory",
            )
        origin = spec.origin if spec.has_location else None
        where = _where(origin, spec.submodule_search_locations)
    if not _is_ours(origin) and THEORY_HOME.is_dir():
        raise ImportError(
            f"meanfield needs its own package 'theory' ({THEORY_HOME}), but 'import theory' "
            f"finds {where}, which shadows it: rename or move that module (a theory.py or "
            "theory/ in the working directory, the script's directory or on PYTHONPATH comes "
            "before installed packages; README, 'Installing with pip')",
            name="theory",
            path=where,
        )
    _verified = mod if mod is not None else importlib.import_module("theory")
