"""Deprecated: the figure registry moved to :mod:`experiments.app.registry`.

``python -m paper_figs.make_all`` and ``from paper_figs.make_all import draw_all`` keep working
for one release, with a DeprecationWarning; use ``meanfield figures`` instead. This module is a
shim listed in tests/test_layering.py (the only module of ``paper_figs`` that reaches the
application layer); nothing in the project imports it.
"""

from __future__ import annotations

import warnings

from experiments.app.pipeline import draw_all
from experiments.app.registry import FIGURES, Figure

__all__ = ["FIGURES", "Figure", "draw_all", "main"]

warnings.warn(
    "paper_figs.make_all is deprecated; use `meanfield figures` or experiments.app.pipeline",
    DeprecationWarning,
    stacklevel=2,
)


def main(argv: list[str] | None = None) -> int:
    """``python -m paper_figs.make_all --results DIR --out DIR``: ``meanfield figures``."""
    from experiments.app.main import main as meanfield

    return meanfield(["figures", *(argv if argv is not None else __import__("sys").argv[1:])])


if __name__ == "__main__":
    raise SystemExit(main())
