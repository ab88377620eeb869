"""The two-Dirac mean-field optimum: its gain, optimal mass and asymptote (docs/theory.md §5)."""

from __future__ import annotations

import functools

import sympy as sp

from theory import _symbols as S

from ._core import Derivation, check_equal, make_derivation, stationary_points


@functools.cache
def two_dirac_g() -> Derivation:
    r"""Check that the two forms of :math:`g(\varepsilon)` agree.

    :math:`\sqrt{(1 - \varepsilon)/\varepsilon}\,w = e^{\gamma/2}\sqrt{w(1 - w)}`.

    Returns
    -------
    Derivation
        ``expr`` = :math:`g(\varepsilon)`; ``func(eps, gamma, Vu_norm)``; extras ``w`` and
        ``second_form``.

    Notes
    -----
    docs/theory.md §5: :math:`w = \varepsilon e^\gamma/(\varepsilon e^\gamma + 1 - \varepsilon)`.
    """
    w_eps = S.eps * sp.exp(S.gamma) / (S.eps * sp.exp(S.gamma) + 1 - S.eps)
    first = sp.sqrt((1 - S.eps) / S.eps) * w_eps * (1 + (1 - w_eps) * S.gamma) * S.Vu_norm
    second = (
        sp.exp(S.gamma / 2) * sp.sqrt(w_eps * (1 - w_eps)) * (1 + (1 - w_eps) * S.gamma) * S.Vu_norm
    )
    # Compare squares (both sides positive for 0 < eps < 1).
    ratio = sp.simplify(sp.powsimp(sp.expand((first / second) ** 2), force=True))
    if ratio != 1:
        val = sp.N((first / second).subs({S.eps: sp.Rational(1, 7), S.gamma: 3}), 30)
        if abs(val - 1) > sp.Float(1e-25):
            raise RuntimeError(f"two_dirac_g: forms disagree ({ratio})")
    steps = (
        "w = eps e^gamma / (eps e^gamma + 1 - eps) is the attention of the heavy atom.",
        "w / (1 - w) = eps e^gamma / (1 - eps), hence (1 - eps) / eps = e^gamma (1 - w) / w.",
        "So sqrt((1 - eps) / eps) w = e^(gamma/2) sqrt(w (1 - w)) (checked by sympy).",
    )
    return make_derivation(
        "two-Dirac function g(eps)",
        first,
        (S.eps, S.gamma, S.Vu_norm),
        steps,
        {"w": w_eps, "second_form": second},
    )


@functools.cache
def two_dirac_optimal_mass() -> Derivation:
    r"""Exact optimum over the mass: the quadratic :math:`4\gamma v^2 - (3\gamma - 2)v - 1 = 0`.

    Returns
    -------
    Derivation
        ``expr`` = :math:`v^*`; ``func(gamma)``; extras ``objective``, ``quadratic``, ``roots``,
        ``w_star``, ``eps_star``, ``sup_g`` (args gamma, Vu_norm), ``v_limit_0``, ``v_limit_inf``,
        ``eps_e_gamma_limit``.

    Notes
    -----
    docs/theory.md §5: maximise :math:`\log(e^\gamma v(1 - v)(1 + \gamma v)^2)`; the root in
    :math:`(0, 1)` is picked by evaluating both roots at several :math:`\gamma`.
    """
    v, g = S.v, S.gamma
    objective = sp.exp(g) * v * (1 - v) * (1 + g * v) ** 2
    log_obj = sp.expand_log(sp.log(objective), force=True)
    num, roots = stationary_points(log_obj, v)
    lead = sp.Poly(sp.expand(num), v).LC()
    quadratic = sp.expand(num * sp.sign(lead.subs(g, 1)))
    check_equal(quadratic, 4 * g * v**2 - (3 * g - 2) * v - 1, "two-Dirac quadratic")
    gammas = (sp.Rational(1, 10), 1, 10, 1000)
    inside = [r for r in roots if all(0 < float(r.subs(g, gv)) < 1 for gv in gammas)]
    if len(inside) != 1:
        raise RuntimeError(f"two_dirac_optimal_mass: roots in (0, 1): {inside}")
    v_star = inside[0]
    stated = ((3 * g - 2) + sp.sqrt(9 * g**2 + 4 * g + 4)) / (8 * g)
    check_equal(v_star, stated, "v*")
    w_star = 1 - v_star
    ratio = w_star / v_star * sp.exp(-g)
    eps_star = ratio / (1 + ratio)
    sup_g = sp.exp(g / 2) * sp.sqrt(v_star * (1 - v_star)) * (1 + g * v_star) * S.Vu_norm
    v0 = sp.limit(v_star, g, 0, "+")
    vinf = sp.limit(v_star, g, sp.oo)
    eps_lim = sp.limit(eps_star * sp.exp(g), g, sp.oo)
    if (v0, vinf, eps_lim) != (sp.Rational(1, 2), sp.Rational(3, 4), sp.Rational(1, 3)):
        raise RuntimeError(f"two_dirac_optimal_mass: limits {v0}, {vinf}, {eps_lim}")
    steps = (
        "Maximise e^gamma v (1 - v) (1 + gamma v)^2 over v = 1 - w in (0, 1).",
        f"Numerator of d/dv log(.): {num} = 0, i.e. {quadratic} = 0.",
        f"Roots: {roots}; the one in (0, 1): v* = {v_star}.",
        "w/(1-w) = eps e^gamma/(1-eps) gives eps* = (w*/v*) e^-gamma / (1 + (w*/v*) e^-gamma).",
        f"Limits: v* -> {v0} (gamma -> 0), v* -> {vinf} and eps* e^gamma -> {eps_lim} "
        "(gamma -> oo).",
    )
    return make_derivation(
        "two-Dirac optimal mass",
        v_star,
        (g,),
        steps,
        {
            "objective": objective,
            "quadratic": quadratic,
            "roots": sp.Tuple(*roots),
            "w_star": w_star,
            "eps_star": eps_star,
            "sup_g": sup_g,
            "v_limit_0": v0,
            "v_limit_inf": vinf,
            "eps_e_gamma_limit": eps_lim,
        },
    )


@functools.cache
def two_dirac_asymptotic() -> Derivation:
    r"""Derive the large-:math:`\gamma` asymptote of the two-Dirac optimum.

    :math:`\sup_\varepsilon g \sim \frac{3\sqrt3}{16}\gamma e^{\gamma/2}\|Vu\|`.

    Returns
    -------
    Derivation
        ``expr`` = the asymptote; ``func(gamma, Vu_norm)``; extras ``coefficient``
        (:math:`\lim \sup g/(\gamma e^{\gamma/2}\|Vu\|)`), ``excess_at_three_quarters``
        (:math:`g(v = 3/4)` minus the asymptote).

    Notes
    -----
    docs/theory.md §5. The excess is :math:`\frac{\sqrt3}{4}e^{\gamma/2}\|Vu\| > 0`, so the asymptote
    is
    a lower bound for every :math:`\gamma`.
    """
    g = S.gamma
    sup_g = two_dirac_optimal_mass().extras["sup_g"]
    coeff = sp.limit(sup_g / (g * sp.exp(g / 2) * S.Vu_norm), g, sp.oo)
    check_equal(coeff, 3 * sp.sqrt(3) / 16, "two-Dirac asymptote coefficient")
    asym = coeff * g * sp.exp(g / 2) * S.Vu_norm
    at_3_4 = sp.exp(g / 2) * sp.sqrt(S.v * (1 - S.v)) * (1 + g * S.v) * S.Vu_norm
    excess = sp.simplify(at_3_4.subs(S.v, sp.Rational(3, 4)) - asym)
    check_equal(excess, sp.sqrt(3) / 4 * sp.exp(g / 2) * S.Vu_norm, "excess at v = 3/4")
    steps = (
        f"lim_(gamma->oo) sup g / (gamma e^(gamma/2) ||Vu||) = {coeff}.",
        f"g at v = 3/4 minus the asymptote = {excess} > 0, so the asymptote is a lower bound.",
    )
    return make_derivation(
        "two-Dirac asymptote",
        asym,
        (g, S.Vu_norm),
        steps,
        {"coefficient": coeff, "excess_at_three_quarters": excess},
    )
