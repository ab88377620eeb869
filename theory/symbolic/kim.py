"""Kim's softmax-variance lemma, on sequences and on measures (docs/theory.md §8)."""

from __future__ import annotations

import functools

import sympy as sp

from theory import _symbols as S

from ._core import Derivation, check_equal, exp_lambertw, make_derivation, stationary_points


def _lambert_maximum(
    what: str,
    name: str,
    g: sp.Expr,
    arg: sp.Symbol,
    W: sp.Expr,
    steps: tuple[str, ...],
    *,
    t_star: sp.Expr | None = None,
) -> Derivation:
    """Maximise ``g`` over the cost ``S.t``: one stationary point, maximum ``W`` (a Lambert W).

    ``g(t*)`` is simplified with ``exp(W(z)) = z / W(z)`` and checked against ``W`` (and the
    stationary point against ``t_star`` when given). ``steps`` are format strings over ``num``
    (the factored numerator of ``g'``), ``t_star`` and ``g_star``; ``what`` names the derivation
    in errors. The result has ``func(arg)`` and extras ``g``, ``stationarity``, ``t_star``.
    """
    num, sols = stationary_points(g, S.t)
    if len(sols) != 1:
        raise RuntimeError(f"{what}: expected one stationary point, got {sols}")
    t_found = sols[0]
    g_star = sp.simplify(exp_lambertw(sp.expand(g.subs(S.t, t_found))))
    if t_star is not None:
        check_equal(t_found, t_star, f"{what} t*")
    check_equal(g_star, W, f"{what} g*")
    return make_derivation(
        name,
        g_star,
        (arg,),
        tuple(step.format(num=num, t_star=t_found, g_star=g_star) for step in steps),
        {"g": g, "stationarity": num, "t_star": t_found},
    )


@functools.cache
def kim_softmax_lemma() -> Derivation:
    r"""Derive Kim's softmax-variance lemma (docs/theory.md §8).

    The maximum of :math:`g(t) = \frac{(N - 1)t}{e^t + N - 1}` is
    :math:`W_0\big(\frac{N - 1}{e}\big)`.

    Returns
    -------
    Derivation
        ``expr`` = :math:`g(t^*)` after simplification; ``func(N)``; extras ``g``,
        ``stationarity`` (numerator of :math:`g'`) and ``t_star`` (:math:`1 + W_0((N - 1)/e)`).

    Notes
    -----
    docs/theory.md §8. The reduction to equal costs of the :math:`N - 1` other tokens (Lagrange:
    every interior cost satisfies :math:`t_j = 1 + \sum_l p_lt_l`) is argued, not computed; the
    tests check the bound by brute force.
    """
    M = S.N - 1
    W = sp.LambertW((S.N - 1) * sp.exp(-1))
    return _lambert_maximum(
        "kim_softmax_lemma",
        "Kim softmax-variance lemma",
        M * S.t / (sp.exp(S.t) + M),
        S.N,
        W,
        (
            "At the maximiser the N - 1 other costs are equal (Lagrange), so maximise "
            "g(t) = (N - 1) t / (e^t + N - 1).",
            "Numerator of g'(t): {num} = 0, i.e. (t - 1) e^t = N - 1.",
            "sympy.solve: t* = {t_star}.",
            "Substituting and using exp(W(z)) = z / W(z): g(t*) = {g_star}.",
        ),
        t_star=1 + W,
    )


@functools.cache
def kim_softmax_lemma_mean_field() -> Derivation:
    r"""Derive the mean-field form of Kim's lemma.

    The maximum of :math:`\frac{(1 - q)te^{-t}}{q + (1 - q)e^{-t}}` is
    :math:`W_0\big(\frac{1 - q}{qe}\big)`.

    Returns
    -------
    Derivation
        ``expr``; ``func(q)``; extras ``g``, ``stationarity``, ``t_star``.

    Notes
    -----
    docs/theory.md §8 (mean-field form): an atom of mass :math:`q` at cost 0, the rest at cost
    :math:`t`.
    """
    return _lambert_maximum(
        "kim_softmax_lemma_mean_field",
        "Kim lemma, mean-field form",
        (1 - S.q) * S.t * sp.exp(-S.t) / (S.q + (1 - S.q) * sp.exp(-S.t)),
        S.q,
        sp.LambertW((1 - S.q) / (S.q * sp.E)),
        (
            "Maximise the attention-weighted cost with mass q at cost 0 and 1 - q at cost t.",
            "Numerator of the derivative: {num}.",
            "sympy.solve: t* = {t_star}.",
            "g(t*) = {g_star}.",
        ),
    )
