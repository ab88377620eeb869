"""Lambert W inversions of the bounds: gap and radius for a target constant (docs/theory.md §9)."""

from __future__ import annotations

import functools

import sympy as sp

from theory import _symbols as S

from ._core import Derivation, check_equal, make_derivation, unique_solution
from .two_dirac import two_dirac_asymptotic


@functools.cache
def gap_for_target() -> Derivation:
    r"""Solve :math:`\gamma e^{\gamma/2} = L`: :math:`\gamma = 2W_0(L/2)` (docs/theory.md §9).

    Returns
    -------
    Derivation
        ``expr``; ``func(L)``.
    """
    gamma = unique_solution(S.gamma * sp.exp(S.gamma / 2) - S.L, S.gamma, "gap_for_target")
    check_equal(gamma, 2 * sp.LambertW(S.L / 2), "gap_for_target")
    return make_derivation(
        "gap for a target value",
        gamma,
        (S.L,),
        (f"sympy.solve(gamma e^(gamma/2) = L): gamma = {gamma}.",),
    )


@functools.cache
def radius_for_target() -> Derivation:
    r"""Radius at which the two-Dirac asymptote (case +) reaches :math:`L` (docs/theory.md §9).

    Starting from :math:`\frac{3\sqrt3}{16}\gamma e^{\gamma/2}\|Vu\|` with
    :math:`\gamma = \lambda R^2/4`,
    sympy finds :math:`C\lambda R^2e^{\lambda R^2/8}` with :math:`C = \frac{3\sqrt3}{64}\|Vu\|`,
    then with
    :math:`x = \lambda R^2/8` solves :math:`8Cxe^x = L`.

    Returns
    -------
    Derivation
        ``expr`` = :math:`R(L) = \sqrt{\frac8\lambda W_0\big(\frac{L}{8C}\big)}` with :math:`C`
        substituted;
        ``func(L, lam, Vu_norm)``; extras ``C``, ``x`` (:math:`W_0(L/(8C))` with symbolic
        :math:`C`).
    """
    asym = two_dirac_asymptotic().expr
    in_R = asym.subs(S.gamma, S.lam * S.R**2 / 4)
    C_val = sp.simplify(in_R / (S.lam * S.R**2 * sp.exp(S.lam * S.R**2 / 8)))
    check_equal(C_val, 3 * sp.sqrt(3) / 64 * S.Vu_norm, "C of the asymptote")
    generic = S.C * S.lam * S.R**2 * sp.exp(S.lam * S.R**2 / 8)
    in_x = sp.simplify(generic.subs(S.R, sp.sqrt(8 * S.x / S.lam)))
    check_equal(in_x, 8 * S.C * S.x * sp.exp(S.x), "8 C x e^x")
    x_sol = unique_solution(in_x - S.L, S.x, "radius_for_target")
    check_equal(x_sol, sp.LambertW(S.L / (8 * S.C)), "x = W(L/(8C))")
    R_expr = sp.sqrt(8 * x_sol / S.lam).subs(S.C, C_val)
    steps = (
        f"Asymptote with gamma = lambda R^2 / 4: C lambda R^2 e^(lambda R^2/8), C = {C_val}.",
        f"With x = lambda R^2 / 8 the equation is {in_x} = L.",
        f"sympy.solve: x = {x_sol}; R = sqrt(8 x / lambda).",
    )
    return make_derivation(
        "radius for a target constant (asymptote, case +)",
        R_expr,
        (S.L, S.lam, S.Vu_norm),
        steps,
        {"C": C_val, "x": x_sol},
    )


@functools.cache
def half_form_inversion() -> Derivation:
    r"""Invert the :math:`w = 1/2` form: :math:`\frac{\|Vu\|}{2}(1 + x)e^x = L` (docs/theory.md §9).

    Returns
    -------
    Derivation
        ``expr`` = :math:`R(L)` in case + (:math:`x = \lambda R^2/8`); ``func(L, lam, Vu_norm)``;
        extras
        ``x`` (:math:`W_0(2eL/\|Vu\|) - 1`), valid when :math:`2L/\|Vu\| \ge 1`.
    """
    half = S.Vu_norm / 2 * (1 + S.gamma / 2) * sp.exp(S.gamma / 2)
    in_x = sp.expand(half.subs(S.gamma, 2 * S.x))
    x_sol = unique_solution(in_x - S.L, S.x, "half_form_inversion")
    check_equal(x_sol, sp.LambertW(2 * sp.E * S.L / S.Vu_norm) - 1, "half-form x")
    R_expr = sp.sqrt(8 * x_sol / S.lam)
    steps = (
        f"w = 1/2 form with x = gamma / 2: {in_x} = L.",
        f"sympy.solve: x = {x_sol} (needs 2 L / ||Vu|| >= 1 for x >= 0).",
        "Case +: gamma = lambda R^2 / 4 = 2 x, so R = sqrt(8 x / lambda).",
    )
    return make_derivation(
        "radius for a target constant (w = 1/2 form, case +)",
        R_expr,
        (S.L, S.lam, S.Vu_norm),
        steps,
        {"x": x_sol},
    )


@functools.cache
def radius_for_upper() -> Derivation:
    r"""Exact and conservative radii for :math:`a(1 + bR^2)e^{cR^2} = L` (docs/theory.md §9).

    Returns
    -------
    Derivation
        ``expr`` = exact :math:`R` (sympy's closed form
        :math:`R^2 = W_0\big(\frac{cL}{ab}e^{c/b}\big)/c - 1/b`); ``func(L, a, b, c)``; extras
        ``conservative`` (:math:`\sqrt{W_0(cL/(2ab))/c}`, valid when :math:`R^2 \ge 1/b`).
    """
    t = S.y  # t = R^2
    exact = unique_solution(S.a * (1 + S.b * t) * sp.exp(S.c * t) - S.L, t, "radius_for_upper")
    stated = sp.LambertW(S.c * S.L * sp.exp(S.c / S.b) / (S.a * S.b)) / S.c - 1 / S.b
    check_equal(exact, stated, "exact radius")
    cons = unique_solution(
        2 * S.a * S.b * t * sp.exp(S.c * t) - S.L, t, "radius_for_upper (conservative)"
    )
    check_equal(cons, sp.LambertW(S.c * S.L / (2 * S.a * S.b)) / S.c, "conservative radius")
    steps = (
        f"sympy.solve(a (1 + b t) e^(c t) = L, t): t = {exact} (t = R^2).",
        f"For t >= 1/b, 1 + b t <= 2 b t; solving 2 a b t e^(c t) = L gives t = {cons}.",
    )
    return make_derivation(
        "radius for an upper-bound form",
        sp.sqrt(exact),
        (S.L, S.a, S.b, S.c),
        steps,
        {"conservative": sp.sqrt(cons)},
    )


@functools.cache
def lambertw_asymptotic() -> Derivation:
    r"""Derive the asymptotics of :math:`W_0` at infinity.

    :math:`W_0(z) = \log z - \log\log z + \frac{\log\log z}{\log z} + \dots` as
    :math:`z \to \infty`.

    Parametrise :math:`z = we^w` (so :math:`W_0(z) = w`); sympy computes
    :math:`\lim_{w\to\infty}(\log z - \log\log z - w) = 0` and
    :math:`\lim (w - (\log z - \log\log z)) / (\log\log z/\log z) = 1`.

    Returns
    -------
    Derivation
        ``expr`` = :math:`\log z - \log\log z` (in the symbol ``x`` standing for :math:`z`);
        ``func(z)``; extras ``error_limit`` (0), ``next_term_ratio`` (1), ``three_term``.
    """
    w = S.w
    z_of_w = w * sp.exp(w)
    two = sp.log(z_of_w) - sp.log(sp.log(z_of_w))
    err_lim = sp.limit(two - w, w, sp.oo)
    next_ratio = sp.limit((w - two) / (sp.log(sp.log(z_of_w)) / sp.log(z_of_w)), w, sp.oo)
    if err_lim != 0 or next_ratio != 1:
        raise RuntimeError(f"lambertw_asymptotic: limits {err_lim}, {next_ratio}")
    z = S.x
    expr = sp.log(z) - sp.log(sp.log(z))
    three = expr + sp.log(sp.log(z)) / sp.log(z)
    steps = (
        "Put z = w e^w, so W0(z) = w.",
        f"lim_(w->oo) (log z - log log z - w) = {err_lim}.",
        f"lim (W0(z) - log z + log log z) / (log log z / log z) = {next_ratio}.",
    )
    return make_derivation(
        "Lambert W asymptotics",
        expr,
        (z,),
        steps,
        {"error_limit": err_lim, "next_term_ratio": next_ratio, "three_term": three},
    )
