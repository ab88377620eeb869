"""Symbolic derivations: closed forms as stated, and lambdified results equal to theory.bounds."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import sympy as sp

from theory import _symbols as S
from theory import bounds as B
from theory import regimes
from theory import symbolic as sym
from theory.lambert import lambertw_asymptotic

from ..tolerances import F64_CLOSED_FORM, F64_LONG_CHAIN, F64_SOLVER, F64_ZERO

RTOL = 1e-12


def close(a, b, rtol=RTOL):
    np.testing.assert_allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float), rtol=rtol)


def test_derivation_is_frozen_and_complete():
    d = sym.kim_softmax_lemma()
    assert isinstance(d, sym.Derivation)
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.expr = sp.Integer(0)
    with pytest.raises(TypeError):
        d.extras["x"] = sp.Integer(1)
    assert "W" in d.latex and d.args == (S.N,) and len(d.steps) >= 3


def test_latex_uses_theory_notation():
    assert r"\|A\|_2" in sym.sqrt_n_upper().latex
    assert r"\|Vu\|_2" in sym.two_dirac_asymptotic().latex


# ---------------------------------------------------------------------------------------------
# Kim's lemma
# ---------------------------------------------------------------------------------------------


def test_kim_lemma_comes_out_as_lambert_w():
    d = sym.kim_softmax_lemma()
    W = sp.LambertW((S.N - 1) / sp.E)
    assert sp.simplify(d.expr - W) == 0
    assert sp.simplify(d.extras["t_star"] - (1 + W)) == 0
    assert isinstance(d.expr, sp.LambertW)
    N = np.array([1.0, 2.0, 5.0, 100.0, 1e8])
    close(d.func(N), B.kim_softmax_lemma(N))
    # stationarity (t - 1) e^t = N - 1 at t*
    t = d.lambdify("t_star", (S.N,))(N)
    close((t - 1) * np.exp(t), N - 1)


def test_kim_lemma_mean_field():
    d = sym.kim_softmax_lemma_mean_field()
    q = np.array([1.0, 0.5, 0.1, 1e-6])
    close(d.func(q), B.kim_softmax_lemma_mean_field(q))


# ---------------------------------------------------------------------------------------------
# two Diracs
# ---------------------------------------------------------------------------------------------


def test_two_dirac_g_forms_and_numeric():
    d = sym.two_dirac_g()
    eps = np.array([0.3, 1e-3, 1e-6])
    gamma = np.array([0.5, 4.0, 10.0])
    close(d.func(eps, gamma, 1.7), B.two_dirac_g(eps, gamma, 1.7))
    second = d.lambdify("second_form", (S.eps, S.gamma, S.Vu_norm))
    close(second(eps, gamma, 1.7), B.two_dirac_g(eps, gamma, 1.7))


def test_two_dirac_quadratic_and_optimum():
    d = sym.two_dirac_optimal_mass()
    g, v = S.gamma, S.v
    assert sp.expand(d.extras["quadratic"] - (4 * g * v**2 - (3 * g - 2) * v - 1)) == 0
    assert d.extras["v_limit_0"] == sp.Rational(1, 2)
    assert d.extras["v_limit_inf"] == sp.Rational(3, 4)
    assert d.extras["eps_e_gamma_limit"] == sp.Rational(1, 3)
    gam = np.logspace(-2, 2.5, 40)  # the closed form has 0/0 at gamma = 0 and cancels below 2/3
    close(d.func(gam), B.two_dirac_optimal_mass(gam).v, rtol=F64_SOLVER)
    big = gam[gam >= 1]
    close(d.func(big), B.two_dirac_optimal_mass(big).v)
    sup = d.lambdify("sup_g", (g, S.Vu_norm))
    mid = np.linspace(0.7, 300.0, 50)
    close(sup(mid, 0.8), B.two_dirac_lower(mid, 0.8))
    eps = d.lambdify("eps_star", (g,))
    close(eps(mid), B.two_dirac_optimal_mass(mid).eps)


def test_two_dirac_asymptote():
    d = sym.two_dirac_asymptotic()
    assert d.extras["coefficient"] == 3 * sp.sqrt(3) / 16
    gam = np.logspace(-3, 2.5, 30)
    close(d.func(gam, 1.3), B.two_dirac_asymptote(gam, 1.3))


def test_construction_peak():
    d = sym.construction_peak()
    g, t = S.gamma, S.t
    assert sp.expand(d.extras["quadratic"] - ((1 + g) * t**2 - 3 * g * t - 1)) == 0
    assert d.extras["t_limit_inf"] == 3
    gam = np.linspace(0.0, 14.0, 29)
    n_cont = d.lambdify("n_peak", (g,))(gam)
    n_int = regimes.peak_n(gam)
    assert np.all(np.abs(n_int - n_cont) <= 1.0)
    # the peak of the construction over continuous n equals sup_eps g
    peak = B.sqrt_n_lower(gam, n_cont)
    close(peak, B.two_dirac_lower(gam))


def test_masked_partial_fractions():
    d = sym.masked_limit_decomposition()
    E, m, g = 7.5, np.arange(1.0, 50.0), 2.3
    p = E / (E + m)
    close(d.func(E, m, g), (p * (1 + (1 - p) * g)) ** 2)
    assert sp.expand(d.extras["large_E"] - (1 + S.gamma + S.gamma**2 / 3)) == 0
    gam = 40.0
    approx = np.sqrt(np.exp(gam) * (1 + gam + gam**2 / 3))
    assert B.masked_sqrt_n_lower(gam, np.inf) == pytest.approx(approx, rel=F64_CLOSED_FORM)


# ---------------------------------------------------------------------------------------------
# upper bounds and crossover
# ---------------------------------------------------------------------------------------------

GRID = np.meshgrid([0.3, 1.0, 2.5], [0.5, 2.0], [0.4, 1.0, 1.7], [1.0, 7.0, 1000.0], indexing="ij")


@pytest.mark.parametrize("form", ["sqrt3", "sharp", "triangle"])
def test_sqrt_n_upper_forms(form):
    a, v, R, n = GRID
    close(sym.sqrt_n_upper(form).func(a, v, R, n), B.sqrt_n_upper(a, v, R, n, form=form))
    lim = sym.sqrt_n_asymptotic(form)
    close(lim.func(a, v, R), B.sqrt_n_constant(a, v, R, np.inf, form=form))


@pytest.mark.parametrize("form", ["sharp", "simple"])
def test_mean_field_upper_forms(form):
    a, v, R, _ = GRID
    for c in (1.0, 2.0):
        close(
            sym.mean_field_upper(form).func(a, v, R, c), B.mean_field_upper(a, v, R, c=c, form=form)
        )
    gap = sym.mean_field_upper(form).extras["gap"]
    assert sp.simplify(gap - S.V_norm * S.theta * (sp.exp(S.c * S.theta) - 1)) == 0


@pytest.mark.parametrize("form", ["sqrt3", "sharp", "triangle"])
@pytest.mark.parametrize("mf_form", ["sharp", "simple"])
def test_crossover_closed_forms(form, mf_form):
    d = sym.sqrt_n_mean_field_crossover(form, mf_form)
    assert "closed form" in d.steps[-1]
    a, v, R, _ = GRID
    for c in (1.0, 2.0):
        n_star = d.func(a, v, R, c)
        close(
            n_star,
            regimes.crossover_n(a, v, R, c=c, form=form, mf_form=mf_form),
            rtol=F64_LONG_CHAIN,
        )
        # at n* (when >= 1; else the mean-field bound wins for every n), the two bounds agree
        ok = n_star >= 1
        assert ok.any()
        close(
            B.sqrt_n_upper(a[ok], v[ok], R[ok], n_star[ok], form=form),
            B.mean_field_upper(a[ok], v[ok], R[ok], c=c, form=mf_form),
            rtol=F64_SOLVER,
        )


def test_numeric_fallback_of_the_solver():
    x = sp.Symbol("x", positive=True)
    M = sp.Symbol("M", positive=True)
    expr, func, how = sym._core.solve_or_numeric(sp.cos(x) + x - M, x, (M,), (0.0, 100.0))
    assert expr is None and how == "numeric root"
    roots = func(np.array([2.0, 10.0]))
    np.testing.assert_allclose(np.cos(roots) + roots, [2.0, 10.0], atol=F64_ZERO)


# ---------------------------------------------------------------------------------------------
# Lambert W inversions
# ---------------------------------------------------------------------------------------------


def test_gap_for_target():
    d = sym.gap_for_target()
    assert sp.simplify(d.expr - 2 * sp.LambertW(S.L / 2)) == 0
    L = np.logspace(-3, 250, 30)
    close(d.func(L), B.gap_for_target(L))


def test_radius_for_target():
    d = sym.radius_for_target()
    assert sp.simplify(d.extras["C"] - 3 * sp.sqrt(3) / 64 * S.Vu_norm) == 0
    L = np.logspace(-1, 200, 30)
    for lam, Vu in ((0.3, 1.0), (2.0, 0.4)):
        close(d.func(L, lam, Vu), B.radius_for_target(L, lam, Vu, form="asymptote"))


def test_half_form_inversion():
    d = sym.half_form_inversion()
    Vu = 1.4
    L = np.logspace(np.log10(Vu / 2) + 0.01, 200, 30)  # 2 L / ||Vu|| > 1
    for lam in (0.3, 2.0):
        close(d.func(L, lam, Vu), B.radius_for_target(L, lam, Vu, form="half"), rtol=F64_LONG_CHAIN)


def test_radius_for_upper():
    d = sym.radius_for_upper()
    a, b, c = np.meshgrid([0.5, 1.0, 3.0], [0.2, 3.0], [0.1, 1.0, 2.5], indexing="ij")
    L = 40.0 * a
    close(d.func(L, a, b, c), B.radius_for_upper(L, a, b, c))
    cons = d.lambdify("conservative", (S.L, S.a, S.b, S.c))(L, a, b, c)
    ours = B.radius_for_upper(L, a, b, c, form="lambert")
    valid = np.isfinite(ours)
    assert valid.any()
    close(cons[valid], ours[valid])


def test_lambertw_asymptotics():
    d = sym.lambertw_asymptotic()
    assert d.extras["error_limit"] == 0 and d.extras["next_term_ratio"] == 1
    z = np.logspace(1, 300, 30)
    close(d.func(z), lambertw_asymptotic(z))
    three = d.lambdify("three_term", (S.x,))
    close(three(z), lambertw_asymptotic(z, terms=3))


# ---------------------------------------------------------------------------------------------
# mass splitting
# ---------------------------------------------------------------------------------------------


def test_split_gain():
    d = sym.split_gain()
    k, s = np.meshgrid([1.0, 2.0, 10.0, 1e4], [0.1, 2.0, 8.0], indexing="ij")
    close(d.func(k, s), B.split_gain(k, s))
    asym = sym.split_gain_asymptotic()
    assert asym.expr == 1 and asym.extras["fixed_k_limit"] == S.k and asym.extras["G1"] == 1


def test_asymptotics_mapping():
    table = sym.asymptotics()
    assert set(table) == {"sqrt_n", "two_dirac", "lambertw", "split_gain"}
    assert all(isinstance(v, sym.Derivation) for v in table.values())
    a, v, R, _ = GRID
    close(table["sqrt_n"].func(a, v, R), np.sqrt(3) * v * np.sqrt(4 * (a * R**2) ** 2 + 1))
