"""Mass splitting: the gain of a split measure and its regimes (docs/theory.md §10)."""

from __future__ import annotations

import functools

import sympy as sp

from theory import _symbols as S

from ._core import Derivation, check_equal, make_derivation


@functools.cache
def split_gain() -> Derivation:
    r"""Gain :math:`G_k` derived from the log-weight softmax of the split measure (docs/theory.md §10).

    :math:`\nu = (1 - \frac1k)\delta_y + \frac1k\delta_z`; query :math:`y` sees :math:`z` with logit
    gain
    :math:`s` and query :math:`z` with :math:`2s`. With :math:`\delta = z - y` the outputs move by
    :math:`w_yV\delta` (mass :math:`1 - 1/k`) and :math:`w_zV\delta` (mass :math:`1/k`), and
    :math:`W_2(\mu, \nu)^2 = \|\delta\|^2/k`.

    Returns
    -------
    Derivation
        ``expr`` = :math:`G_k`; ``func(k, s)``; extras ``w_y``, ``w_z``.
    """
    k, s = S.k, S.s
    log_w_y, log_w_z = sp.log(1 - 1 / k), sp.log(1 / k)

    def weight_on_z(gain: sp.Expr) -> sp.Expr:
        # softmax over {y, z} with logits (0 + log(1 - 1/k), gain + log(1/k)).
        num = sp.exp(gain + log_w_z)
        return sp.simplify(num / (sp.exp(log_w_y) + num))

    w_y = weight_on_z(s)
    w_z = weight_on_z(2 * s)
    check_equal(w_y, sp.exp(s) / (k - 1 + sp.exp(s)), "w_y")
    check_equal(w_z, sp.exp(2 * s) / (k - 1 + sp.exp(2 * s)), "w_z")
    ratio_sq = sp.simplify(((1 - 1 / k) * w_y**2 + w_z**2 / k) / (1 / k))
    check_equal(ratio_sq, (k - 1) * w_y**2 + w_z**2, "G_k^2")
    G = sp.sqrt((k - 1) * w_y**2 + w_z**2)
    steps = (
        f"w_y = {w_y}, w_z = {w_z} (softmax with log-weights log(1 - 1/k), log(1/k)).",
        f"Output W2^2 / input W2^2 = {ratio_sq} (times ||V delta||^2 / ||delta||^2).",
    )
    return make_derivation("split gain G_k", G, (k, s), steps, {"w_y": w_y, "w_z": w_z})


@functools.cache
def split_gain_asymptotic() -> Derivation:
    r"""Derive the regimes of the split gain :math:`G_k`.

    :math:`G_k^2 \to k` for fixed :math:`k`, and :math:`G_{1+e^s}/(e^{s/2}/2) \to 1`.

    Returns
    -------
    Derivation
        ``expr`` = :math:`\lim_{s\to\infty} G_{1+e^s}/(e^{s/2}/2)` (= 1); ``func()``; extras
        ``fixed_k_limit`` (:math:`\lim_{s\to\infty}G_k^2 = k`), ``G1`` (:math:`G_1 = 1`).
    """
    k, s = S.k, S.s
    G = split_gain().expr
    fixed_k = sp.limit(G**2, s, sp.oo)
    sat = sp.limit(G.subs(k, 1 + sp.exp(s)) / (sp.exp(s / 2) / 2), s, sp.oo)
    G1 = sp.simplify(G.subs(k, 1))
    if fixed_k != k or sat != 1 or G1 != 1:
        raise RuntimeError(f"split_gain_asymptotic: {fixed_k}, {sat}, {G1}")
    steps = (
        f"G_1 = {G1}.",
        f"lim_(s->oo) G_k^2 = {fixed_k}: G_k ~ sqrt(k) for k << e^s.",
        f"lim_(s->oo) G_(1+e^s) / (e^(s/2)/2) = {sat}: saturation near e^(s/2)/2.",
    )
    return make_derivation(
        "split gain regimes", sat, (), steps, {"fixed_k_limit": fixed_k, "G1": G1}
    )
