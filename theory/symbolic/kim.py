"""Kim's softmax-variance lemma, on sequences and on measures (docs/theory.md §8)."""

from __future__ import annotations

import functools

import sympy as sp

from theory import _symbols as S

from ._core import Derivation, _check_equal, _exp_lambertw, _make, _stationary_points


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
    g = M * S.t / (sp.exp(S.t) + M)
    num, sols = _stationary_points(g, S.t)
    if len(sols) != 1:
        raise RuntimeError(f"kim_softmax_lemma: expected one stationary point, got {sols}")
    t_star = sols[0]
    g_star = sp.simplify(_exp_lambertw(sp.expand(g.subs(S.t, t_star))))
    W = sp.LambertW((S.N - 1) * sp.exp(-1))
    _check_equal(t_star, 1 + W, "kim_softmax_lemma t*")
    _check_equal(g_star, W, "kim_softmax_lemma g*")
    steps = (
        "At the maximiser the N - 1 other costs are equal (Lagrange), so maximise "
        "g(t) = (N - 1) t / (e^t + N - 1).",
        f"Numerator of g'(t): {num} = 0, i.e. (t - 1) e^t = N - 1.",
        f"sympy.solve: t* = {t_star}.",
        f"Substituting and using exp(W(z)) = z / W(z): g(t*) = {g_star}.",
    )
    return _make(
        "Kim softmax-variance lemma",
        g_star,
        (S.N,),
        steps,
        {"g": g, "stationarity": num, "t_star": t_star},
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
    g = (1 - S.q) * S.t * sp.exp(-S.t) / (S.q + (1 - S.q) * sp.exp(-S.t))
    num, sols = _stationary_points(g, S.t)
    if len(sols) != 1:
        raise RuntimeError(f"kim_softmax_lemma_mean_field: expected one solution, got {sols}")
    t_star = sols[0]
    g_star = sp.simplify(_exp_lambertw(sp.expand(g.subs(S.t, t_star))))
    W = sp.LambertW((1 - S.q) / (S.q * sp.E))
    _check_equal(g_star, W, "kim_softmax_lemma_mean_field g*")
    steps = (
        "Maximise the attention-weighted cost with mass q at cost 0 and 1 - q at cost t.",
        f"Numerator of the derivative: {num}.",
        f"sympy.solve: t* = {t_star}.",
        f"g(t*) = {g_star}.",
    )
    return _make(
        "Kim lemma, mean-field form",
        g_star,
        (S.q,),
        steps,
        {"g": g, "stationarity": num, "t_star": t_star},
    )
