"""Two Diracs and the off-axis two-atom bound (theory.bounds.two_dirac; docs/theory.md §5)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import optimize

from theory import bounds as B

from ..oracles_bounds import (
    mean_field_local,
    random_ball,
    spec,
)
from ..tolerances import (
    ASYMPTOTE,
    ASYMPTOTE_FAR,
    ASYMPTOTE_SLOW,
    F64_CLOSED_FORM,
    F64_FEW_ULPS,
    F64_LARGE_EXPONENT,
    F64_LARGE_RADIUS_REL,
    F64_REDUCTION,
    F64_REWRITTEN_EXP,
    F64_SCALAR_SEARCH,
    F64_ZERO,
)


@pytest.mark.parametrize("R", [0.8, 1.5, 2.5])
def test_two_dirac_optimum_is_a_local_constant_lower_bound(R):
    # A = -a I (case -, gamma = 2 a R^2, the "matching" case): g(eps*) <= L_W(mu_eps*) <= upper.
    a = 0.9
    A = -a * np.eye(2)
    V = np.array([[1.0, 0.3], [0.0, 0.7]])
    u = np.array([1.0, 0.0])
    gamma = 2 * a * R**2
    eps = B.two_dirac_optimal_mass(gamma).eps
    X = np.array([R * u, -R * u])  # heavy at Ru, light at -Ru
    LW = mean_field_local(X, np.array([1 - eps, eps]), A, V)
    g = B.two_dirac_lower(gamma, np.linalg.norm(V @ u))
    assert g <= LW * (1 + F64_LARGE_RADIUS_REL)
    assert LW <= B.mean_field_upper(a, spec(V), R)
    assert B.mean_field_lower(A, V, R) <= B.mean_field_upper(a, spec(V), R)


def test_two_dirac_g_forms_and_stability():
    eps = np.array([0.3, 1e-3, 1e-8])
    gamma = np.array([0.5, 4.0, 15.0])
    w = eps * np.exp(gamma) / (eps * np.exp(gamma) + 1 - eps)
    direct = np.sqrt((1 - eps) / eps) * w * (1 + (1 - w) * gamma)
    second = np.exp(gamma / 2) * np.sqrt(w * (1 - w)) * (1 + (1 - w) * gamma)
    np.testing.assert_allclose(B.two_dirac_g(eps, gamma), direct, rtol=F64_REWRITTEN_EXP)
    np.testing.assert_allclose(direct, second, rtol=F64_CLOSED_FORM)
    tiny = B.two_dirac_g(1e-300, 1000.0)
    assert tiny == pytest.approx(1e150, rel=F64_CLOSED_FORM)  # w -> 1: sqrt((1-eps)/eps)
    assert np.isfinite(B.two_dirac_log_g(-1000.0, 1000.0))
    assert B.two_dirac_log_g(np.log(0.25), 2.0) == pytest.approx(np.log(B.two_dirac_g(0.25, 2.0)))


GAMMAS = np.concatenate([np.logspace(-3, 3, 25), [2 / 3]])


@pytest.mark.parametrize("gamma", GAMMAS)
def test_quadratic_optimum_matches_brute_force(gamma):
    opt = B.two_dirac_optimal_mass(gamma)
    v = opt.v
    assert 4 * gamma * v**2 - (3 * gamma - 2) * v - 1 == pytest.approx(
        0.0, abs=F64_ZERO * (1 + gamma)
    )
    res = optimize.minimize_scalar(
        lambda le: -B.two_dirac_log_g(le, gamma),
        bounds=(-gamma - 60.0, -1e-12),
        method="bounded",
        options={"xatol": 1e-12},
    )
    brute = -res.fun
    log_sup = B.two_dirac_lower(gamma, log=True)
    assert log_sup >= brute - F64_ZERO
    assert np.exp(log_sup - brute) == pytest.approx(1.0, abs=F64_SCALAR_SEARCH)
    assert B.two_dirac_log_g(opt.log_eps, gamma) == pytest.approx(
        log_sup, rel=F64_CLOSED_FORM, abs=F64_ZERO
    )


def test_optimal_mass_limits():
    small = B.two_dirac_optimal_mass(np.array([0.0, 1e-8, 1e-4]))
    np.testing.assert_allclose(small.v, 0.5, atol=ASYMPTOTE_FAR)
    big = B.two_dirac_optimal_mass(np.array([1e3, 1e6, 1e9]))
    np.testing.assert_allclose(big.v, 0.75, atol=ASYMPTOTE)
    np.testing.assert_allclose(np.exp(big.log_eps[0] + 1e3), 1 / 3, rtol=ASYMPTOTE)
    assert big.eps[1] == 0.0 and np.isfinite(big.log_eps[1])  # underflow, log stays exact
    # log_eps + gamma carries the rounding of gamma = 1e9 (ulp 1.2e-7)
    assert np.exp(big.log_eps[2] + 1e9) == pytest.approx(1 / 3, rel=F64_LARGE_EXPONENT)
    g = np.logspace(-3, 3, 200)
    v = B.two_dirac_optimal_mass(g).v
    assert np.all(np.diff(v) > 0) and np.all((v > 0.5) & (v < 0.75))


def test_asymptote_and_half_are_below_sup_g():
    g = np.logspace(-3, np.log10(1000.0), 400)
    sup = B.two_dirac_lower(g, log=True)
    assert np.all(B.two_dirac_asymptote(g, log=True) <= sup)
    assert np.all(B.two_dirac_half(g, log=True) <= sup + F64_FEW_ULPS)
    ratio = np.exp(B.two_dirac_asymptote(g, log=True) - sup)
    assert ratio[-1] == pytest.approx(1.0, abs=ASYMPTOTE_SLOW) and np.all(np.diff(ratio) > 0)
    assert np.isfinite(B.two_dirac_lower(1000.0))  # e^500 ~ 1e217 still fits
    assert B.two_dirac_lower(1500.0) == np.inf  # e^750 overflows; the log form does not
    assert np.isfinite(B.two_dirac_lower(1500.0, log=True))


def test_off_axis_reduces_to_axis():
    R, lam = 1.7, 0.8
    u = np.array([1.0, 0.0])
    A = np.diag([lam, -0.3])
    gamma = lam * R**2 / 4
    for w in (0.2, 0.5, 0.9):
        eps = 1 / (1 + (1 - w) / w * np.exp(gamma))
        val = B.off_axis_two_atom(R * u, R / 2 * u, u, w, A, np.eye(2))
        assert val == pytest.approx(B.two_dirac_g(eps, gamma), rel=F64_REDUCTION)


def test_off_axis_is_a_local_constant_lower_bound(rng):
    d = 2
    for _ in range(40):
        A = rng.normal(size=(d, d))
        V = rng.normal(size=(d, d))
        R = 1.5
        x, y = random_ball(rng, 2, d, R)
        h = rng.normal(size=d)
        w = float(rng.uniform(0.05, 0.95))
        gamma = y @ A @ (x - y)
        log_eps = -np.logaddexp(0.0, np.log((1 - w) / w) + gamma)  # eps/(1-eps) = e^-gamma w/(1-w)
        eps = np.exp(log_eps)
        if eps < 1e-12:
            continue
        LW = mean_field_local(np.array([y, x]), np.array([1 - eps, eps]), A, V)
        assert B.off_axis_two_atom(x, y, h, w, A, V) <= LW * (1 + F64_LARGE_RADIUS_REL)
    xs = random_ball(rng, 5, d, 1.0)
    assert B.off_axis_two_atom(xs, xs[::-1] * 0.5, xs + 1.0, 0.3, A, V).shape == (5,)
