"""The n-token construction: its peak (docs/theory.md §3) and the masked sum (§4)."""

from __future__ import annotations

import functools

import sympy as sp

from theory import _symbols as S

from ._core import Derivation, check_equal, make_derivation, stationary_points


@functools.cache
def construction_peak() -> Derivation:
    r"""Peak over continuous :math:`n` of :math:`\sqrt{n - 1}\,p(1 + (1 - p)\gamma)`.

    With :math:`n - 1 = te^\gamma` the bound is :math:`e^{\gamma/2}\varphi(t)`,
    :math:`\varphi(t) = \frac{\sqrt t}{1 + t}\big(1 + \frac{\gamma t}{1 + t}\big)`, maximised where
    :math:`(1 + \gamma)t^2 - 3\gamma t - 1 = 0`.

    Returns
    -------
    Derivation
        ``expr`` = :math:`t^*(\gamma)`; ``func(gamma)``; extras ``quadratic``, ``n_peak``
        (:math:`1 + t^*e^\gamma`), ``t_limit_inf`` (:math:`= 3`), ``as_two_dirac`` (the quadratic
        after :math:`t = v/(1 - v)`, proportional to the two-Dirac quadratic).

    Notes
    -----
    The peak of the construction is at :math:`n` of order :math:`e^\gamma` (docs/theory.md §3);
    this gives
    :math:`n^* - 1 \to 3e^\gamma`. The substitution :math:`t = v/(1 - v)` maps it to the two-Dirac
    quadratic, so the peak value equals :math:`\sup_\varepsilon g` over continuous :math:`n`.
    """
    t, g = S.t, S.gamma
    phi = sp.sqrt(t) / (1 + t) * (1 + g * t / (1 + t))
    num, roots = stationary_points(sp.expand_log(sp.log(phi), force=True), t)
    quadratic = sp.expand(-num)
    check_equal(quadratic, (1 + g) * t**2 - 3 * g * t - 1, "peak quadratic")
    pos = [r for r in roots if float(r.subs(g, 1)) > 0]
    if len(pos) != 1:
        raise RuntimeError(f"construction_peak: positive roots {pos}")
    t_star = pos[0]
    mapped = sp.factor(sp.together(quadratic.subs(t, S.v / (1 - S.v))))
    two_dirac_quad = 4 * g * S.v**2 - (3 * g - 2) * S.v - 1
    prop = sp.simplify(sp.numer(sp.together(mapped)) / two_dirac_quad)
    if prop.has(S.v):
        raise RuntimeError(f"construction_peak: not proportional to two-Dirac quadratic: {prop}")
    t_inf = sp.limit(t_star, g, sp.oo)
    steps = (
        "Write n - 1 = t e^gamma: sqrt(n-1) p (1 + (1-p) gamma) = e^(gamma/2) phi(t).",
        f"d/dt log phi = 0 gives {quadratic} = 0; positive root t* = {t_star}.",
        f"t* -> {t_inf} as gamma -> oo, so the peak is near n - 1 = {t_inf} e^gamma.",
        f"With t = v/(1 - v) the quadratic is {prop} times the two-Dirac quadratic.",
    )
    return make_derivation(
        "peak of the n-token construction",
        t_star,
        (g,),
        steps,
        {
            "quadratic": quadratic,
            "n_peak": 1 + t_star * sp.exp(g),
            "t_limit_inf": t_inf,
            "as_two_dirac": mapped,
        },
    )


@functools.cache
def masked_limit_decomposition() -> Derivation:
    r"""Partial fractions of :math:`p_i^2(1 + (1 - p_i)\gamma)^2`, :math:`p_i = E/(E + m)`.

    Returns
    -------
    Derivation
        ``expr`` = the partial-fraction form
        :math:`\frac{(1 + \gamma)^2E^2}{(E + m)^2} - \frac{2\gamma(1 + \gamma)E^3}{(E + m)^3}
        + \frac{\gamma^2E^4}{(E + m)^4}`;
        ``func(E, m, gamma)``; extras ``large_E`` (:math:`\lim_{E\to\infty}` of the limit sum over
        :math:`E`, i.e. :math:`1 + \gamma + \gamma^2/3`).

    Notes
    -----
    docs/theory.md §4. Summing over :math:`m \ge 1` gives Hurwitz zeta values
    :math:`\zeta(s, E + 1)`, used by :func:`theory.bounds.masked_sqrt_n_lower` for
    :math:`n = \infty`.
    """
    E = sp.Symbol("E", positive=True)
    m, g = S.m, S.gamma
    p_m = E / (E + m)
    summand = (p_m * (1 + (1 - p_m) * g)) ** 2
    parts = sp.apart(sp.together(summand), m)
    stated = (
        (1 + g) ** 2 * E**2 / (E + m) ** 2
        - 2 * g * (1 + g) * E**3 / (E + m) ** 3
        + g**2 * E**4 / (E + m) ** 4
    )
    check_equal(parts, stated, "masked partial fractions")
    # E^(s-1) zeta(s, E + 1) -> 1/(s - 1) as E -> oo.
    large_E = sp.expand((1 + g) ** 2 - 2 * g * (1 + g) / 2 + g**2 / 3)
    steps = (
        "p_m = E / (E + m), m = i - 1, E = e^gamma.",
        f"sympy.apart: {parts}.",
        "Sum over m >= 1: E^2 zeta(2, E+1)(1+gamma)^2 - 2 gamma (1+gamma) E^3 zeta(3, E+1) "
        "+ gamma^2 E^4 zeta(4, E+1).",
        f"E^(s-1) zeta(s, E+1) -> 1/(s-1), so the limit sum ~ E ({large_E}).",
    )
    return make_derivation(
        "masked construction summand", parts, (E, m, g), steps, {"large_E": large_E}
    )
