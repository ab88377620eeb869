r"""``meanfield invert``: invert residual attention blocks by fixed-point iteration.

For one random L2 layer and one random dot-product head (``--seed``), both scaled so that their
certified Lipschitz bound is ``--target`` (globally for L2, on the ball of radius
``--ref-radius`` for dot product; docs/derivations/invertible.md), the command maps the tie
input of radius ``R`` through each block and inverts the result from :math:`x_0=y` by the
iteration :math:`x_{k+1}=y-g(x_k)`, for every ``--radius``. Each row reports the outcome
(recovered, wrong preimage, no convergence), the iterations, the observed contraction ratio
against the certified bound, the local constant and spectral radius of :math:`Dg(x^*)` and the
distance of the found preimage to :math:`x^*`. The work is
:func:`experiments.invertible.invert_case`, the same as the ``invertible`` stage.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from ..options import UsageError, add_common

__all__ = ["handle", "register", "show"]


def handle(args: argparse.Namespace) -> dict[str, Any]:
    """Run the inversions; a JSON-serialisable dict."""
    from experiments.invertible import invert_case

    radii = [float(r) for r in args.radius]
    if not all(math.isfinite(r) and r > 0 for r in radii):
        raise UsageError(f"--radius must be positive numbers, got {args.radius}")
    for option, count in (("--n", args.n), ("--iters", args.iters)):
        if count < 2:
            raise UsageError(f"{option} must be at least 2, got {count}")
    if args.d < 1 or args.heads < 1 or args.d % args.heads:
        raise UsageError(f"--heads must divide --d, got d = {args.d}, heads = {args.heads}")
    if not 0 < args.target < 1:
        raise UsageError(f"--target must lie in (0, 1), got {args.target}")
    for option, value in (("--ref-radius", args.ref_radius), ("--tol", args.tol)):
        if not (math.isfinite(value) and value > 0):
            raise UsageError(f"{option} must be a positive number, got {value}")
    # the block's settings, passed to invert_case and echoed in the result
    block = {k: getattr(args, k) for k in ("d", "heads", "n", "target", "ref_radius")}
    case = invert_case(args.seed, radii, **block, max_iter=args.iters, tol=args.tol)
    return {
        "kind": "invert",
        "seed": args.seed,
        **block,
        "iters": args.iters,
        "tol": args.tol,
        "scale": case["scale"],
        "certified": case["certified"],
        "rows": case["rows"],
        "residuals": {
            m: [[float(x) for x in row if x == x] for row in arr]
            for m, arr in case["residuals"].items()
        },
    }


def show(doc: dict[str, Any]) -> None:
    """Human-readable table of ``meanfield invert``."""
    print(
        f"fixed-point inversion of x + g(x), n = {doc['n']}, d = {doc['d']}, seed {doc['seed']}; "
        f"certified c = {doc['target']:g} (L2: global; DP: for R <= {doc['ref_radius']:g})"
    )
    print(
        f"  {'map':<3} {'R':>6} {'outcome':<15} {'iters':>5} {'observed':>9} {'|Dg(x*)|':>9} "
        f"{'rho':>8} {'|x-x*|/|x*|':>11}"
    )
    for r in doc["rows"]:
        ratio = r["max_ratio"]
        ratio_s = "–" if ratio is None or ratio != ratio else f"{ratio:.3g}"
        print(
            f"  {r['map']:<3} {r['R']:>6g} {r['outcome']:<15} {r['n_iter']:>5} {ratio_s:>9} "
            f"{r['local_lipschitz']:>9.3g} {r['spectral_radius']:>8.3g} "
            f"{r['preimage_error']:>11.2e}"
        )
    print("  (observed: largest ratio of successive steps, bounded by c where the bound holds)")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``invert``."""
    p = sub.add_parser(
        "invert",
        help="invert residual attention blocks x + g(x) by fixed-point iteration (L2 vs DP)",
        description=(
            "Scale L2 attention by its global certified Lipschitz bound and dot-product "
            "attention by its bound on a ball, so that both certify c < 1, and invert x + g(x) "
            "by fixed-point iteration at inputs of growing radius."
        ),
    )
    add_common(p, seed="seed of the random heads (default 0)")
    p.add_argument(
        "--radius",
        type=float,
        nargs="+",
        default=[1.0, 4.0, 16.0],
        help="radii of the inputs (default 1 4 16)",
    )
    p.add_argument("--n", type=int, default=4, help="number of tokens (default 4)")
    p.add_argument("--iters", type=int, default=300, help="largest number of iterations (300)")
    p.add_argument("--d", type=int, default=4, help="token width (default 4)")
    p.add_argument("--heads", type=int, default=2, help="heads of the L2 layer (default 2)")
    p.add_argument(
        "--target", type=float, default=0.5, help="certified Lipschitz constant c (default 0.5)"
    )
    p.add_argument(
        "--ref-radius",
        type=float,
        default=1.0,
        help="radius of the ball on which the dot-product bound holds (default 1)",
    )
    p.add_argument(
        "--tol", type=float, default=1e-12, help="relative residual tolerance (default 1e-12)"
    )
    p.set_defaults(handler=handle, printer=show)
