"""``meanfield derive NAME``: print a sympy derivation of :mod:`theory.symbolic`.

Print a derivation of :mod:`theory.symbolic`: the expression, its LaTeX and the steps.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..options import UsageError, add_command, add_common

__all__ = ["register"]


def handle(args: argparse.Namespace) -> dict[str, Any]:
    from theory import symbolic

    names = [n for n in symbolic.__all__ if n != "Derivation"]
    key = args.name.replace("-", "_")
    if key not in names:
        raise UsageError(
            f"unknown derivation {args.name!r}; choose from {', '.join(n.replace('_', '-') for n in names)}"
        )
    d = getattr(symbolic, key)()
    return {
        "derivation": args.name,
        "expression": str(d.expr),
        "latex": d.latex,
        "arguments": [str(a) for a in d.args],
        "steps": [str(s) for s in d.steps],
        "latex_only": args.latex,
    }


def show(doc: dict[str, Any]) -> None:
    if doc["latex_only"]:
        print(doc["latex"])
        return
    print(f"{doc['derivation']}({', '.join(doc['arguments'])}) = {doc['expression']}")
    print(f"  LaTeX: {doc['latex']}")
    for i, step in enumerate(doc["steps"], 1):
        print(f"  {i}. {step}")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``derive``."""
    p = add_command(sub, __doc__)
    add_common(p)
    p.add_argument("name", help="derivation name, e.g. kim-softmax-lemma or two-dirac-optimal-mass")
    p.add_argument("--latex", action="store_true", help="print only the LaTeX of the result")
    p.set_defaults(handler=handle, printer=show)
