"""``meanfield bound`` and ``meanfield derive``: closed-form bounds and sympy derivations.

``bound NAME`` evaluates one function of :mod:`theory.bounds` on grids given as numbers,
comma-separated lists or ``start:stop:step`` ranges (broadcast against each other);
``derive NAME`` prints a derivation of :mod:`theory.symbolic` (expression, LaTeX, steps).
"""

from __future__ import annotations

import argparse
import inspect
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["BOUNDS", "add_parsers"]


@dataclass(frozen=True)
class BoundSpec:
    """How one CLI bound maps onto a function of :mod:`theory.bounds`."""

    function: str
    args: tuple[str, ...]  # CLI option names, in the function's positional order
    help: str
    options: tuple[str, ...] = ()  # keyword options forwarded when given


BOUNDS: dict[str, BoundSpec] = {
    "sqrt-n-upper": BoundSpec(
        "sqrt_n_upper",
        ("A_norm", "V_norm", "R", "n"),
        "global √n-regime upper bound on B_R^n (THEORY §6.1)",
        ("form",),
    ),
    "sqrt-n-lower": BoundSpec(
        "sqrt_n_lower", ("gamma", "n", "Vu_norm"), "eigenvector-construction lower bound (§6.3)"
    ),
    "masked-sqrt-n-lower": BoundSpec(
        "masked_sqrt_n_lower",
        ("gamma", "n", "Vu_norm"),
        "masked construction lower bound, saturating in n (§9)",
    ),
    "mean-field-upper": BoundSpec(
        "mean_field_upper",
        ("A_norm", "V_norm", "R"),
        "mean-field (W2) upper bound with exponent c' = --c (§7.1)",
        ("c",),
    ),
    "two-dirac-lower": BoundSpec(
        "two_dirac_lower", ("gamma", "Vu_norm"), "two-Dirac lower bound at the optimal mass (§7.2)"
    ),
    "two-dirac-half": BoundSpec(
        "two_dirac_half", ("gamma", "Vu_norm"), "two-Dirac bound at w = 1/2 (§7.2)"
    ),
    "two-dirac-asymptote": BoundSpec(
        "two_dirac_asymptote",
        ("gamma", "Vu_norm"),
        "asymptote (3√3/16) γ e^{γ/2} ||Vu||, a valid lower bound (§7.2)",
    ),
    "trivial": BoundSpec("trivial_lower", ("V_norm",), "trivial lower bound ||V|| (§5.2)"),
    "kim-softmax": BoundSpec(
        "kim_softmax_lemma", ("N",), "Kim et al.'s softmax lemma W0((N-1)/e) (§10.4)"
    ),
    "gap-for-target": BoundSpec(
        "gap_for_target", ("L",), "gap γ with γ e^{γ/2} = L, i.e. 2 W0(L/2) (§11.4)"
    ),
    "radius-for-target": BoundSpec(
        "radius_for_target",
        ("L", "lam", "Vu_norm"),
        "largest radius R for a target constant L (§11.2)",
        ("form",),
    ),
    "split-gain": BoundSpec(
        "split_gain", ("k", "s"), "gain G_k of the duplicate-then-move attack (§12.2)"
    ),
}

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


def parse_grid(text: str) -> np.ndarray:
    """``"3"``, ``"1,2,5"`` or ``"start:stop:step"`` (stop included when hit) as a float array."""
    text = text.strip()
    try:
        if ":" in text:
            parts = [float(p) for p in text.split(":")]
            if len(parts) != 3 or parts[2] == 0:
                raise ValueError
            start, stop, step = parts
            count = int(np.floor((stop - start) / step + 1e-9)) + 1
            if count < 1:
                raise ValueError
            return start + step * np.arange(count)
        return np.array([float(p) for p in text.split(",")])
    except ValueError:
        raise ValueError(
            f"cannot read {text!r} as a number, a comma-separated list or start:stop:step"
        ) from None


def _cmd_bound(args: argparse.Namespace) -> dict[str, Any]:
    from theory import bounds

    spec = BOUNDS[args.name]
    fn = getattr(bounds, spec.function)
    sig = inspect.signature(fn)
    values: dict[str, np.ndarray] = {}
    for name in spec.args:
        raw = getattr(args, name)
        if raw is None:
            param = list(sig.parameters.values())[spec.args.index(name)]
            if param.default is inspect.Parameter.empty:
                raise ValueError(f"bound {args.name!r} needs --{name.replace('_', '-')}")
            continue
        values[name] = parse_grid(raw)
    # one axis per given grid: the output is the outer product over the given options
    names = list(values)
    grids = np.meshgrid(*(values[k] for k in names), indexing="ij") if names else []
    kwargs = {o: getattr(args, o) for o in spec.options if getattr(args, o) is not None}
    result = np.asarray(fn(*grids, **kwargs), dtype=float)
    doc = inspect.getdoc(fn) or ""
    return {
        "bound": args.name,
        "function": f"theory.bounds.{spec.function}",
        "summary": doc.splitlines()[0] if doc else "",
        "inputs": {k: values[k].tolist() for k in names},
        "options": kwargs,
        "value": result.tolist(),
    }


def _print_bound(doc: dict[str, Any]) -> None:
    print(f"{doc['bound']}  ({doc['function']}): {doc['summary']}")
    names = list(doc["inputs"])
    grids = np.meshgrid(*(np.asarray(doc["inputs"][k]) for k in names), indexing="ij")
    value = np.asarray(doc["value"], dtype=float)
    print("  " + "  ".join(f"{k:>12s}" for k in names) + f"  {'value':>14s}")
    for idx in np.ndindex(value.shape):
        cols = "  ".join(f"{g[idx]:12.6g}" for g in grids)
        print(f"  {cols}  {value[idx]:14.8g}")


def _cmd_derive(args: argparse.Namespace) -> dict[str, Any]:
    from theory import symbolic

    names = [n for n in symbolic.__all__ if n != "Derivation"]
    key = args.name.replace("-", "_")
    if key not in names:
        raise ValueError(
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


def _print_derive(doc: dict[str, Any]) -> None:
    if doc["latex_only"]:
        print(doc["latex"])
        return
    print(f"{doc['derivation']}({', '.join(doc['arguments'])}) = {doc['expression']}")
    print(f"  LaTeX: {doc['latex']}")
    for i, step in enumerate(doc["steps"], 1):
        print(f"  {i}. {step}")


def add_parsers(sub: argparse._SubParsersAction, common: Any) -> None:
    """Register ``bound`` and ``derive`` on the ``meanfield`` subparsers."""
    lines = "\n".join(f"  {name:<22s} {spec.help}" for name, spec in BOUNDS.items())
    p = sub.add_parser(
        "bound",
        help="evaluate a closed-form bound of theory.bounds on grids of n, R, ...",
        description=f"Bounds:\n{lines}\n\nGrids: a number, a list 1,2,5 or a range start:stop:step.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common(p)
    p.add_argument(
        "name", choices=sorted(BOUNDS), metavar="NAME", help="bound name (see the list above)"
    )
    for opt in sorted({a for spec in BOUNDS.values() for a in spec.args}):
        p.add_argument(
            f"--{opt.replace('_', '-')}", dest=opt, default=None, help=_OPTION_HELP.get(opt, opt)
        )
    p.add_argument("--form", default=None, help="variant of the bound (see its docstring)")
    p.add_argument(
        "--c", type=float, default=None, help="exponent coefficient c' of the mean-field bound"
    )
    p.set_defaults(handler=_cmd_bound, printer=_print_bound)

    p = sub.add_parser("derive", help="print a sympy derivation of theory.symbolic")
    common(p)
    p.add_argument("name", help="derivation name, e.g. kim-softmax-lemma or two-dirac-optimal-mass")
    p.add_argument("--latex", action="store_true", help="print only the LaTeX of the result")
    p.set_defaults(handler=_cmd_derive, printer=_print_derive)
