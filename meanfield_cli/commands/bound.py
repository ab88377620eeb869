"""``meanfield bound NAME``: evaluate a closed-form bound of :mod:`theory.bounds` on grids.

Grids are numbers, comma-separated lists or ``start:stop:step`` ranges, broadcast against each
other (one axis per option given). The § marks of the help are those in the headings of
docs/theory.md.
"""

from __future__ import annotations

import argparse
import inspect
import logging
import math
from typing import Any

import numpy as np

from theory.bounds.registry import Bound, cli_bounds

from ..options import UsageError, add_common, plain_math

__all__ = ["BOUNDS", "MAX_GRID_POINTS", "BoundSpec", "parse_grid", "register"]

log = logging.getLogger("meanfield.bound")


# The table of bounds is the registry of theory.bounds (one record per bound, read here, by
# verify-bounds and by docs/theory.md §15); each record has ``function``, ``args``, ``help`` and
# ``options`` as this command uses them.
BoundSpec = Bound
BOUNDS: dict[str, Bound] = cli_bounds()

_OPTION_HELP = {
    "A_norm": "||A||_2",
    "V_norm": "||V||_2",
    "Vu_norm": "||Vu|| (default 1)",
    "R": "radius",
    "n": "number of tokens",
    "N": "number of tokens (Kim et al.)",
    "gamma": "logit gap γ",
    "L": "target Lipschitz constant",
    "lam": "Rayleigh quotient λ = u^T A u (sign picks the case)",
    "k": "number of copies",
    "s": "logit gain s = λR²/4",
}


#: The largest grid ``meanfield bound`` evaluates: the grids, the values and their JSON take
#: about 100 bytes a point (1 GB here), and a table of more lines is not read anyway.
MAX_GRID_POINTS = 10_000_000


def _too_large(what: str, count: float) -> UsageError:
    size = f"{int(count):,}" if math.isfinite(count) and count < 1e18 else f"{count:.3g}"
    return UsageError(
        f"{what} has {size} points; at most {MAX_GRID_POINTS:,} fit in memory "
        "(about 100 bytes each): use a larger step or fewer values"
    )


def parse_grid(text: str, option: str | None = None) -> np.ndarray:
    """``"3"``, ``"1,2,5"``, ``"start:stop"`` (step 1) or ``"start:stop:step"`` as a float array.

    The stop is included when the steps hit it. A range of more than :data:`MAX_GRID_POINTS`
    points is refused before any memory is taken (``option`` names it in the message).
    """
    text = text.strip()
    if ":" in text:
        try:
            parts = [float(p) for p in text.split(":")]
        except ValueError:
            parts = []
        if len(parts) not in (2, 3):
            raise UsageError(f"cannot read {text!r} as a range start:stop or start:stop:step")
        start, stop, step = parts if len(parts) == 3 else (*parts, 1.0)
        if step == 0:
            raise UsageError(f"the range {text!r} has step 0")
        if not all(np.isfinite(parts)):
            raise UsageError(f"the range {text!r} must have finite start, stop and step")
        with np.errstate(over="ignore"):
            span = np.floor((stop - start) / step + 1e-9) + 1
        if not np.isfinite(span) or span > MAX_GRID_POINTS:
            raise _too_large(f"{option + ' ' if option else ''}{text}", span)
        count = int(span)
        if count < 1:
            direction = "down" if step < 0 else "up"
            raise UsageError(
                f"the range {text!r} is empty: a step of {step:g} goes {direction} from "
                f"{start:g} and never reaches {stop:g}"
            )
        return start + step * np.arange(count)
    try:
        return np.array([float(p) for p in text.split(",")])
    except ValueError:
        raise UsageError(
            f"cannot read {text!r} as a number, a comma-separated list or start:stop:step"
        ) from None


def handle(args: argparse.Namespace) -> dict[str, Any]:
    """Evaluate the bound on the outer product of the given grids."""
    from theory import bounds

    spec = BOUNDS[args.name]
    fn = getattr(bounds, spec.function)
    values: dict[str, np.ndarray] = {}
    # the grids are the function's leading parameters, in order (theory.bounds.registry)
    for name, param in zip(spec.args, inspect.signature(fn).parameters.values()):
        flag = f"--{name.replace('_', '-')}"
        raw = getattr(args, name)
        if raw is not None:
            values[name] = parse_grid(raw, flag)
        elif param.default is inspect.Parameter.empty:
            raise UsageError(f"bound {args.name!r} needs {flag}")
    # one axis per given grid: the output is the outer product over the given options
    total = math.prod(len(v) for v in values.values())
    if total > MAX_GRID_POINTS:
        sizes = " x ".join(f"{len(v)} ({'--' + k.replace('_', '-')})" for k, v in values.items())
        raise _too_large(f"the grid {sizes}", total)
    grids = np.meshgrid(*values.values(), indexing="ij") if values else []
    kwargs = {o: getattr(args, o) for o in spec.options if getattr(args, o) is not None}
    with np.errstate(over="ignore"):
        result = np.asarray(fn(*grids, **kwargs), dtype=float)
    overflow = np.isposinf(result)
    if overflow.any():
        log.warning(
            "%s overflows float64 (> 1.8e308) at %d of %d grid points; those values are inf",
            args.name,
            int(overflow.sum()),
            overflow.size,
        )
    return {
        "bound": args.name,
        "function": f"theory.bounds.{spec.function}",
        "summary": plain_math((inspect.getdoc(fn) or "").split("\n")[0]),
        "inputs": {k: v.tolist() for k, v in values.items()},
        "options": kwargs,
        "value": result.tolist(),
        "overflow": int(overflow.sum()),
    }


def show(doc: dict[str, Any]) -> None:
    """A table of the grid points and values; overflowed values are marked."""
    print(f"{doc['bound']}  ({doc['function']}): {doc['summary']}")
    names = list(doc["inputs"])
    grids = np.meshgrid(*(np.asarray(doc["inputs"][k]) for k in names), indexing="ij")
    value = np.asarray(doc["value"], dtype=float)
    print("  " + "  ".join(f"{k:>12s}" for k in names) + f"  {'value':>14s}")
    if doc.get("overflow"):
        print(
            f"  (overflow: the bound exceeds the largest float64, 1.8e308, at {doc['overflow']} "
            "point(s))"
        )
    for idx in np.ndindex(value.shape):
        cols = "  ".join(f"{g[idx]:12.6g}" for g in grids)
        v = value[idx]
        shown = f"{'overflow':>14s}" if np.isposinf(v) else f"{v:14.8g}"
        print(f"  {cols}  {shown}")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``bound``."""
    lines = "\n".join(f"  {name:<22s} {plain_math(spec.help)}" for name, spec in BOUNDS.items())
    p = sub.add_parser(
        "bound",
        help="evaluate a closed-form bound of theory.bounds on grids of n, R, ...",
        description=f"Bounds (§: the section marks in the headings of docs/theory.md):\n{lines}\n\n"
        "Grids: a number, a list 1,2,5 or a range start:stop[:step].",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common(p)
    p.add_argument(
        "name", choices=sorted(BOUNDS), metavar="NAME", help="bound name (see the list above)"
    )
    for opt in sorted({a for spec in BOUNDS.values() for a in spec.args}):
        p.add_argument(f"--{opt.replace('_', '-')}", dest=opt, help=_OPTION_HELP.get(opt, opt))
    p.add_argument("--form", help="variant of the bound (see its docstring)")
    p.add_argument("--c", type=float, help="exponent coefficient c' of the mean-field bound")
    p.set_defaults(handler=handle, printer=show)
