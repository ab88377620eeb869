"""Symbolic derivations (sympy) of the closed forms used by :mod:`theory.bounds`.

Each derivation starts from the defining expression of docs/theory.md (a bound, a stationarity
condition, an equation to invert), lets sympy do the algebra (differentiate, solve, simplify,
take limits), and checks the result against the closed form stated in docs/theory.md, raising
``RuntimeError`` if they differ. Nothing downstream of the starting expression is typed in.

Every public function returns a frozen :class:`Derivation` holding the expression, its LaTeX, a
numpy callable (``sympy.lambdify`` with ``modules=["scipy", "numpy"]``, so ``LambertW`` maps to
:func:`scipy.special.lambertw`; the real part is returned), the argument symbols, the steps, and
named intermediate expressions. Results are cached: each derivation runs once per process.

Provenance of the derived results: *derived and checked numerically* (docs/theory.md §15); the tests
compare every callable with :mod:`theory.bounds` to 1e-12 relative.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

import numpy as np
import sympy as sp

from theory import _symbols as S

__all__ = [
    "Derivation",
    "asymptotics",
    "construction_peak",
    "gap_for_target",
    "half_form_inversion",
    "kim_softmax_lemma",
    "kim_softmax_lemma_mean_field",
    "lambertw_asymptotic",
    "masked_limit_decomposition",
    "mean_field_upper",
    "radius_for_target",
    "radius_for_upper",
    "split_gain",
    "split_gain_asymptotic",
    "sqrt_n_asymptotic",
    "sqrt_n_mean_field_crossover",
    "sqrt_n_upper",
    "two_dirac_asymptotic",
    "two_dirac_g",
    "two_dirac_optimal_mass",
]


@dataclass(frozen=True)
class Derivation:
    """Result of a symbolic derivation.

    Attributes
    ----------
    name : str
        What was derived.
    expr : sympy.Expr
        The derived closed form.
    latex : str
        LaTeX of ``expr`` in the notation of docs/theory.md.
    func : callable
        Numeric version of ``expr`` (numpy/scipy, broadcasting, real part), taking ``args``.
    args : tuple of sympy.Symbol
        Argument order of ``func``.
    steps : tuple of str
        The derivation, one step per entry.
    extras : Mapping[str, sympy.Expr]
        Named intermediate or companion expressions (read-only).
    """

    name: str
    expr: sp.Expr
    latex: str
    func: Callable[..., Any]
    args: tuple[sp.Symbol, ...]
    steps: tuple[str, ...]
    extras: Mapping[str, sp.Expr] = field(default_factory=lambda: MappingProxyType({}))

    def lambdify(self, name: str, args: Sequence[sp.Symbol]) -> Callable[..., Any]:
        """Numeric callable of ``extras[name]`` with the given argument symbols.

        Parameters
        ----------
        name : str
            Key of :attr:`extras`.
        args : sequence of sympy.Symbol
            Argument order.

        Returns
        -------
        callable
            numpy/scipy function returning the real part.
        """
        return _numeric(self.extras[name], tuple(args))


def _numeric(expr: sp.Expr, args: tuple[sp.Symbol, ...]) -> Callable[..., Any]:
    raw = sp.lambdify(args, expr, modules=["scipy", "numpy"])

    def func(*values: Any) -> Any:
        return np.real(raw(*values))

    return func


def _latex(expr: sp.Expr) -> str:
    return sp.latex(expr, symbol_names=S.LATEX_NAMES)


def _make(
    name: str,
    expr: sp.Expr,
    args: Sequence[sp.Symbol],
    steps: Sequence[str],
    extras: Mapping[str, sp.Expr] | None = None,
) -> Derivation:
    return Derivation(
        name=name,
        expr=expr,
        latex=_latex(expr),
        func=_numeric(expr, tuple(args)),
        args=tuple(args),
        steps=tuple(steps),
        extras=MappingProxyType(dict(extras or {})),
    )


def _check_equal(derived: sp.Expr, stated: sp.Expr, what: str) -> None:
    """Raise if the derived expression differs from the stated closed form."""
    diff = sp.simplify(derived - stated)
    if diff != 0:
        raise RuntimeError(f"{what}: derived {derived} differs from stated {stated}")


def _exp_lambertw(expr: sp.Expr) -> sp.Expr:
    """Rewrite ``exp(c*W(z) + r)`` as ``exp(r) * (z / W(z))**c`` (from ``W e^W = z``)."""

    def has_w_term(e: sp.Basic) -> bool:
        return isinstance(e, sp.exp) and e.has(sp.LambertW)

    def repl(e: sp.exp) -> sp.Expr:
        arg = sp.expand(e.args[0])
        for term in sp.Add.make_args(arg):
            coeff, rest = term.as_coeff_Mul()
            if isinstance(rest, sp.LambertW) and len(rest.args) == 1 and coeff.is_Integer:
                z = rest.args[0]
                return sp.exp(arg - term) * (z / rest) ** coeff
        return e

    return expr.replace(has_w_term, repl)


def _stationary_points(expr: sp.Expr, var: sp.Symbol) -> tuple[sp.Expr, list[sp.Expr]]:
    """Numerator of d expr / d var (factored) and its solutions."""
    num = sp.factor(sp.numer(sp.together(sp.diff(expr, var))))
    return num, sp.solve(num, var)


def _solve_or_numeric(
    equation: sp.Expr, var: sp.Symbol, params: Sequence[sp.Symbol], bracket: tuple[float, float]
) -> tuple[sp.Expr | None, Callable[..., Any], str]:
    """Solve ``equation = 0`` for ``var``: closed form if sympy finds one, numeric root otherwise.

    Returns ``(expr or None, callable of params, "closed form" | "numeric root")``. The numeric
    path uses :func:`scipy.optimize.brentq` on ``bracket`` element by element.
    """
    try:
        sols = sp.solve(equation, var)
    except NotImplementedError:
        sols = []
    real_sols = [sol for sol in sols if sol.is_real is not False]
    if len(real_sols) == 1:
        return real_sols[0], _numeric(real_sols[0], tuple(params)), "closed form"
    from scipy.optimize import brentq

    f = sp.lambdify((var, *params), equation, modules=["scipy", "numpy"])

    def root(*values: Any) -> Any:
        arrays = np.broadcast_arrays(*[np.asarray(v, dtype=float) for v in values])
        shape = arrays[0].shape if arrays else ()
        out = np.empty(shape)
        for idx in np.ndindex(shape):
            vals = [arr[idx] for arr in arrays]

            def residual(z: float, vals: list[Any] = vals) -> float:
                return float(np.real(f(z, *vals)))

            out[idx] = brentq(residual, *bracket, xtol=1e-14)
        return out[()]

    return None, root, "numeric root"


# ---------------------------------------------------------------------------------------------
# Kim's softmax-variance lemma (docs/theory.md §8)
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# two Diracs (docs/theory.md §5)
# ---------------------------------------------------------------------------------------------


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
        eps_check = sp.Rational(1, 7)
        val = sp.N((first / second).subs({S.eps: eps_check, S.gamma: 3}), 30)
        if abs(val - 1) > sp.Float(1e-25):
            raise RuntimeError(f"two_dirac_g: forms disagree ({ratio})")
    steps = (
        "w = eps e^gamma / (eps e^gamma + 1 - eps) is the attention of the heavy atom.",
        "w / (1 - w) = eps e^gamma / (1 - eps), hence (1 - eps) / eps = e^gamma (1 - w) / w.",
        "So sqrt((1 - eps) / eps) w = e^(gamma/2) sqrt(w (1 - w)) (checked by sympy).",
    )
    return _make(
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
    num, roots = _stationary_points(log_obj, v)
    poly = sp.Poly(sp.expand(num), v)
    lead = poly.LC()
    quadratic = sp.expand(num * sp.sign(lead.subs(g, 1)))
    _check_equal(quadratic, 4 * g * v**2 - (3 * g - 2) * v - 1, "two-Dirac quadratic")
    inside = [
        r
        for r in roots
        if all(0 < float(r.subs(g, gv)) < 1 for gv in (sp.Rational(1, 10), 1, 10, 1000))
    ]
    if len(inside) != 1:
        raise RuntimeError(f"two_dirac_optimal_mass: roots in (0, 1): {inside}")
    v_star = inside[0]
    stated = ((3 * g - 2) + sp.sqrt(9 * g**2 + 4 * g + 4)) / (8 * g)
    _check_equal(v_star, stated, "v*")
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
    return _make(
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
    opt = two_dirac_optimal_mass()
    sup_g = opt.extras["sup_g"]
    coeff = sp.limit(sup_g / (g * sp.exp(g / 2) * S.Vu_norm), g, sp.oo)
    _check_equal(coeff, 3 * sp.sqrt(3) / 16, "two-Dirac asymptote coefficient")
    asym = coeff * g * sp.exp(g / 2) * S.Vu_norm
    at_3_4 = sp.exp(g / 2) * sp.sqrt(S.v * (1 - S.v)) * (1 + g * S.v) * S.Vu_norm
    excess = sp.simplify(at_3_4.subs(S.v, sp.Rational(3, 4)) - asym)
    _check_equal(excess, sp.sqrt(3) / 4 * sp.exp(g / 2) * S.Vu_norm, "excess at v = 3/4")
    steps = (
        f"lim_(gamma->oo) sup g / (gamma e^(gamma/2) ||Vu||) = {coeff}.",
        f"g at v = 3/4 minus the asymptote = {excess} > 0, so the asymptote is a lower bound.",
    )
    return _make(
        "two-Dirac asymptote",
        asym,
        (g, S.Vu_norm),
        steps,
        {"coefficient": coeff, "excess_at_three_quarters": excess},
    )


# ---------------------------------------------------------------------------------------------
# peak of the n-token construction (docs/theory.md §3)
# ---------------------------------------------------------------------------------------------


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
    num, roots = _stationary_points(sp.expand_log(sp.log(phi), force=True), t)
    quadratic = sp.expand(-num)
    _check_equal(quadratic, (1 + g) * t**2 - 3 * g * t - 1, "peak quadratic")
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
    return _make(
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


# ---------------------------------------------------------------------------------------------
# masked construction: partial fractions of the summand (docs/theory.md §4)
# ---------------------------------------------------------------------------------------------


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
    _check_equal(parts, stated, "masked partial fractions")
    # E^(s-1) zeta(s, E + 1) -> 1/(s - 1) as E -> oo.
    large_E = sp.expand((1 + g) ** 2 - 2 * g * (1 + g) / 2 + g**2 / 3)
    steps = (
        "p_m = E / (E + m), m = i - 1, E = e^gamma.",
        f"sympy.apart: {parts}.",
        "Sum over m >= 1: E^2 zeta(2, E+1)(1+gamma)^2 - 2 gamma (1+gamma) E^3 zeta(3, E+1) "
        "+ gamma^2 E^4 zeta(4, E+1).",
        f"E^(s-1) zeta(s, E+1) -> 1/(s-1), so the limit sum ~ E ({large_E}).",
    )
    return _make("masked construction summand", parts, (E, m, g), steps, {"large_E": large_E})


# ---------------------------------------------------------------------------------------------
# upper bounds assembled from per-term bounds (docs/theory.md §1, §6, §12)
# ---------------------------------------------------------------------------------------------


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
    _check_equal(bound, stated, f"sqrt_n_upper[{form}]")
    expr = stated.subs(th, S.A_norm * S.R**2)
    steps = (
        f"Per-term bounds (theta = ||A|| R^2): ||T1|| <= {T1}, ||T2|| <= {T2}, ||T3|| <= {T3}.",
        "Combine by "
        + ("the triangle inequality" if form == "triangle" else "(a+b+c)^2 <= 3(a^2+b^2+c^2)")
        + f": {sp.simplify(bound)}.",
    )
    return _make(
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
    _check_equal(gap, S.V_norm * th * (sp.exp(c * th) - 1), "mean-field simple - sharp")
    chosen = sharp if form == "sharp" else simple
    expr = chosen.subs(th, S.A_norm * S.R**2)
    steps = (
        "Self term ||V C_x A^T|| <= ||V|| theta; interaction kernel <= 1 + 2 theta; "
        "Cauchy-Schwarz with d pi_x / d mu <= e^(2 theta) gives e^(c theta), c = c' = 1.",
        f"Sharp form {sharp}; simple form {simple}; simple - sharp = {gap} >= 0.",
    )
    return _make(
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
    expr, num_func, how = _solve_or_numeric(equation, S.n, (S.theta, S.V_norm, S.c), (1.0, 1e300))
    steps = (f"Solve {sq} = {mf} for n.", f"Result by {how}: {expr}.")
    if expr is None:
        func = num_func
        expr_out = sp.Symbol("n_star")
    else:
        expr_out = sp.simplify(expr.subs(S.theta, S.A_norm * S.R**2))
        func = None
    d = _make(
        f"sqrt(n) / mean-field crossover ({form}, {mf_form})",
        expr_out,
        (S.A_norm, S.V_norm, S.R, S.c),
        steps,
        {"equation": equation},
    )
    if func is not None:

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
    return _make(
        f"large-n constant ({form})",
        lim,
        (S.A_norm, S.V_norm, S.R),
        steps,
        {"series": series},
    )


# ---------------------------------------------------------------------------------------------
# Lambert W inversions (docs/theory.md §9)
# ---------------------------------------------------------------------------------------------


@functools.cache
def gap_for_target() -> Derivation:
    r"""Solve :math:`\gamma e^{\gamma/2} = L`: :math:`\gamma = 2W_0(L/2)` (docs/theory.md §9).

    Returns
    -------
    Derivation
        ``expr``; ``func(L)``.
    """
    sols = sp.solve(S.gamma * sp.exp(S.gamma / 2) - S.L, S.gamma)
    if len(sols) != 1:
        raise RuntimeError(f"gap_for_target: {sols}")
    _check_equal(sols[0], 2 * sp.LambertW(S.L / 2), "gap_for_target")
    return _make(
        "gap for a target value",
        sols[0],
        (S.L,),
        (f"sympy.solve(gamma e^(gamma/2) = L): gamma = {sols[0]}.",),
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
    _check_equal(C_val, 3 * sp.sqrt(3) / 64 * S.Vu_norm, "C of the asymptote")
    generic = S.C * S.lam * S.R**2 * sp.exp(S.lam * S.R**2 / 8)
    in_x = sp.simplify(generic.subs(S.R, sp.sqrt(8 * S.x / S.lam)))
    _check_equal(in_x, 8 * S.C * S.x * sp.exp(S.x), "8 C x e^x")
    sols = sp.solve(in_x - S.L, S.x)
    if len(sols) != 1:
        raise RuntimeError(f"radius_for_target: {sols}")
    x_sol = sols[0]
    _check_equal(x_sol, sp.LambertW(S.L / (8 * S.C)), "x = W(L/(8C))")
    R_expr = sp.sqrt(8 * x_sol / S.lam).subs(S.C, C_val)
    steps = (
        f"Asymptote with gamma = lambda R^2 / 4: C lambda R^2 e^(lambda R^2/8), C = {C_val}.",
        f"With x = lambda R^2 / 8 the equation is {in_x} = L.",
        f"sympy.solve: x = {x_sol}; R = sqrt(8 x / lambda).",
    )
    return _make(
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
    sols = sp.solve(in_x - S.L, S.x)
    if len(sols) != 1:
        raise RuntimeError(f"half_form_inversion: {sols}")
    x_sol = sols[0]
    _check_equal(x_sol, sp.LambertW(2 * sp.E * S.L / S.Vu_norm) - 1, "half-form x")
    R_expr = sp.sqrt(8 * x_sol / S.lam)
    steps = (
        f"w = 1/2 form with x = gamma / 2: {in_x} = L.",
        f"sympy.solve: x = {x_sol} (needs 2 L / ||Vu|| >= 1 for x >= 0).",
        "Case +: gamma = lambda R^2 / 4 = 2 x, so R = sqrt(8 x / lambda).",
    )
    return _make(
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
    sols = sp.solve(S.a * (1 + S.b * t) * sp.exp(S.c * t) - S.L, t)
    if len(sols) != 1:
        raise RuntimeError(f"radius_for_upper: {sols}")
    stated = sp.LambertW(S.c * S.L * sp.exp(S.c / S.b) / (S.a * S.b)) / S.c - 1 / S.b
    _check_equal(sols[0], stated, "exact radius")
    cons = sp.solve(2 * S.a * S.b * t * sp.exp(S.c * t) - S.L, t)
    if len(cons) != 1:
        raise RuntimeError(f"radius_for_upper (conservative): {cons}")
    _check_equal(cons[0], sp.LambertW(S.c * S.L / (2 * S.a * S.b)) / S.c, "conservative radius")
    steps = (
        f"sympy.solve(a (1 + b t) e^(c t) = L, t): t = {sols[0]} (t = R^2).",
        f"For t >= 1/b, 1 + b t <= 2 b t; solving 2 a b t e^(c t) = L gives t = {cons[0]}.",
    )
    return _make(
        "radius for an upper-bound form",
        sp.sqrt(sols[0]),
        (S.L, S.a, S.b, S.c),
        steps,
        {"conservative": sp.sqrt(cons[0])},
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
    return _make(
        "Lambert W asymptotics",
        expr,
        (z,),
        steps,
        {"error_limit": err_lim, "next_term_ratio": next_ratio, "three_term": three},
    )


# ---------------------------------------------------------------------------------------------
# mass splitting (docs/theory.md §10)
# ---------------------------------------------------------------------------------------------


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
    _check_equal(w_y, sp.exp(s) / (k - 1 + sp.exp(s)), "w_y")
    _check_equal(w_z, sp.exp(2 * s) / (k - 1 + sp.exp(2 * s)), "w_z")
    ratio_sq = sp.simplify(((1 - 1 / k) * w_y**2 + w_z**2 / k) / (1 / k))
    _check_equal(ratio_sq, (k - 1) * w_y**2 + w_z**2, "G_k^2")
    G = sp.sqrt((k - 1) * w_y**2 + w_z**2)
    steps = (
        f"w_y = {w_y}, w_z = {w_z} (softmax with log-weights log(1 - 1/k), log(1/k)).",
        f"Output W2^2 / input W2^2 = {ratio_sq} (times ||V delta||^2 / ||delta||^2).",
    )
    return _make("split gain G_k", G, (k, s), steps, {"w_y": w_y, "w_z": w_z})


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
    return _make("split gain regimes", sat, (), steps, {"fixed_k_limit": fixed_k, "G1": G1})


def asymptotics() -> Mapping[str, Derivation]:
    """All asymptotic derivations, by name.

    Returns
    -------
    Mapping[str, Derivation]
        ``"sqrt_n"`` (:func:`sqrt_n_asymptotic`, form "sqrt3"), ``"two_dirac"``
        (:func:`two_dirac_asymptotic`), ``"lambertw"`` (:func:`lambertw_asymptotic`),
        ``"split_gain"`` (:func:`split_gain_asymptotic`).
    """
    return MappingProxyType(
        {
            "sqrt_n": sqrt_n_asymptotic("sqrt3"),
            "two_dirac": two_dirac_asymptotic(),
            "lambertw": lambertw_asymptotic(),
            "split_gain": split_gain_asymptotic(),
        }
    )
