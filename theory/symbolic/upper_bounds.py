"""The √n and mean-field upper bounds assembled from per-term bounds, and their crossover.

See docs/theory.md §1 (√n regime), §6 (mean-field upper bound) and §12 (regimes).
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import numpy as np
import sympy as sp

from theory import _symbols as S

from ._core import Derivation, check_equal, make_derivation, solve_or_numeric


@functools.cache
def sqrt_n_upper(form: Literal["sqrt3", "sharp", "triangle"] = "sqrt3") -> Derivation:
    r"""Assemble the √n upper bound from the per-term bounds of docs/theory.md §1.

    Parameters
    ----------
    form : {"sqrt3", "sharp", "triangle"}
        :math:`\|T_2\| \le 2\sqrt n\theta` ("sqrt3") or :math:`\sqrt n\theta` ("sharp", "triangle");
        combined by :math:`(a + b + c)^2 \le 3(a^2 + b^2 + c^2)` or by the triangle inequality.

    Returns
    -------
    Derivation
        ``expr``; ``func(A_norm, V_norm, R, n)``; extras ``T1``, ``T2``, ``T3``, ``theta_form``.
    """
    if form not in ("sqrt3", "sharp", "triangle"):
        raise ValueError(f"form must be 'sqrt3', 'sharp' or 'triangle', got {form!r}")
    n, th = S.n, S.theta
    T1 = sp.sqrt(n)
    T2 = (2 if form == "sqrt3" else 1) * sp.sqrt(n) * th
    T3 = th
    if form == "triangle":
        bound = S.V_norm * (T1 + T2 + T3)
    else:
        bound = S.V_norm * sp.sqrt(3 * (T1**2 + T2**2 + T3**2))
    stated = {
        "sqrt3": sp.sqrt(3) * S.V_norm * sp.sqrt(th**2 * (4 * n + 1) + n),
        "sharp": sp.sqrt(3) * S.V_norm * sp.sqrt(th**2 * (n + 1) + n),
        "triangle": S.V_norm * (sp.sqrt(n) * (1 + th) + th),
    }[form]
    check_equal(bound, stated, f"sqrt_n_upper[{form}]")
    expr = stated.subs(th, S.A_norm * S.R**2)
    steps = (
        f"Per-term bounds (theta = ||A|| R^2): ||T1|| <= {T1}, ||T2|| <= {T2}, ||T3|| <= {T3}.",
        "Combine by "
        + ("the triangle inequality" if form == "triangle" else "(a+b+c)^2 <= 3(a^2+b^2+c^2)")
        + f": {sp.simplify(bound)}.",
    )
    return make_derivation(
        f"sqrt(n) upper bound ({form})",
        expr,
        (S.A_norm, S.V_norm, S.R, n),
        steps,
        {"T1": T1, "T2": T2, "T3": T3, "theta_form": stated},
    )


@functools.cache
def mean_field_upper(form: Literal["sharp", "simple"] = "sharp") -> Derivation:
    r"""Assemble the mean-field upper bound of docs/theory.md §6 with exponent coefficient :math:`c`.

    Parameters
    ----------
    form : {"sharp", "simple"}
        Self term plus interaction term, or the simplified :math:`(1 + 3\theta)e^{c\theta}`.

    Returns
    -------
    Derivation
        ``expr``; ``func(A_norm, V_norm, R, c)``; extras ``gap`` (simple minus sharp, shown to be
        :math:`\|V\|\theta(e^{c\theta} - 1) \ge 0`).
    """
    if form not in ("sharp", "simple"):
        raise ValueError(f"form must be 'sharp' or 'simple', got {form!r}")
    th, c = S.theta, S.c
    self_term = th
    kernel = 1 + 2 * th
    density = sp.exp(c * th)  # (sup d pi_x / d mu)^(1/2) with c = 1
    sharp = S.V_norm * (self_term + kernel * density)
    simple = S.V_norm * (1 + 3 * th) * sp.exp(c * th)
    gap = sp.factor(sp.simplify(simple - sharp))
    check_equal(gap, S.V_norm * th * (sp.exp(c * th) - 1), "mean-field simple - sharp")
    chosen = sharp if form == "sharp" else simple
    expr = chosen.subs(th, S.A_norm * S.R**2)
    steps = (
        "Self term ||V C_x A^T|| <= ||V|| theta; interaction kernel <= 1 + 2 theta; "
        "Cauchy-Schwarz with d pi_x / d mu <= e^(2 theta) gives e^(c theta), c = c' = 1.",
        f"Sharp form {sharp}; simple form {simple}; simple - sharp = {gap} >= 0.",
    )
    return make_derivation(
        f"mean-field upper bound ({form})",
        expr,
        (S.A_norm, S.V_norm, S.R, c),
        steps,
        {"gap": gap, "theta_form": chosen},
    )


@functools.cache
def sqrt_n_mean_field_crossover(
    form: Literal["sqrt3", "sharp", "triangle"] = "triangle",
    mf_form: Literal["sharp", "simple"] = "sharp",
) -> Derivation:
    r"""Crossover :math:`n^*` where the √n upper bound equals the mean-field upper bound.

    Parameters
    ----------
    form : {"sqrt3", "sharp", "triangle"}
        Form of the √n bound.
    mf_form : {"sharp", "simple"}
        Form of the mean-field bound.

    Returns
    -------
    Derivation
        ``expr`` = :math:`n^*(\|A\|, \|V\|, R, c)`; ``func(A_norm, V_norm, R, c)``; extras
        ``equation``. ``steps[-1]`` says whether sympy found a closed form (it does for every
        form: the bounds are algebraic in :math:`n`) or a numeric root was used.

    Notes
    -----
    Roughly :math:`n^* \sim e^{2\|A\|R^2}` up to polynomial factors (docs/theory.md §12); the
    closed forms here make that precise for each pair of bounds.
    """
    sq = sqrt_n_upper(form).extras["theta_form"]
    mf = mean_field_upper(mf_form).extras["theta_form"]
    equation = sq - mf
    expr, num_func, how = solve_or_numeric(equation, S.n, (S.theta, S.V_norm, S.c), (1.0, 1e300))
    steps = (f"Solve {sq} = {mf} for n.", f"Result by {how}: {expr}.")
    expr_out = (
        sp.Symbol("n_star") if expr is None else sp.simplify(expr.subs(S.theta, S.A_norm * S.R**2))
    )
    d = make_derivation(
        f"sqrt(n) / mean-field crossover ({form}, {mf_form})",
        expr_out,
        (S.A_norm, S.V_norm, S.R, S.c),
        steps,
        {"equation": equation},
    )
    if expr is None:

        def wrapped(A_norm: Any, V_norm: Any, R: Any, c: Any) -> Any:
            return num_func(np.asarray(A_norm) * np.asarray(R) ** 2, V_norm, c)

        d = Derivation(d.name, d.expr, d.latex, wrapped, d.args, d.steps, d.extras)
    return d


@functools.cache
def sqrt_n_asymptotic(form: Literal["sqrt3", "sharp", "triangle"] = "sqrt3") -> Derivation:
    r"""Large-:math:`n` behaviour of the √n bound: :math:`\lim_{n\to\infty}\text{bound}/\sqrt n`.

    Parameters
    ----------
    form : {"sqrt3", "sharp", "triangle"}
        Which √n bound.

    Returns
    -------
    Derivation
        ``expr`` = the limit constant; ``func(A_norm, V_norm, R)``; extras ``series``
        (expansion of bound / √n in :math:`1/n`, two terms).
    """
    bound = sqrt_n_upper(form).expr
    ratio = bound / sp.sqrt(S.n)
    lim = sp.simplify(sp.limit(ratio, S.n, sp.oo))
    u = sp.Symbol("u", positive=True)  # u = 1/n
    series = sp.series(sp.simplify(ratio.subs(S.n, 1 / u)), u, 0, 2).removeO()
    steps = (f"lim_(n->oo) bound / sqrt(n) = {lim}.", f"Expansion in u = 1/n: {series}.")
    return make_derivation(
        f"large-n constant ({form})", lim, (S.A_norm, S.V_norm, S.R), steps, {"series": series}
    )
