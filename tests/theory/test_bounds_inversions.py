"""Lambert-W inversions (theory.bounds.inversions; docs/theory.md §9)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize

from theory import bounds as B
from theory.lambert import lambertw

from ..tolerances import F64_CLOSED_FORM, F64_FEW_ULPS, F64_REWRITTEN, F64_REWRITTEN_EXP, F64_SOLVER


def test_gap_for_target_inverts():
    L = np.array([0.0, 1e-3, 1.0, 50.0, 1e300])
    g = B.gap_for_target(L)
    assert g[0] == 0.0
    np.testing.assert_allclose(
        np.log(g[1:]) + g[1:] / 2, np.log(L[1:]), rtol=F64_REWRITTEN, atol=F64_FEW_ULPS
    )


@pytest.mark.parametrize("lam", [0.7, -0.4])
def test_radius_for_target_inverts_each_form(lam):
    L = np.array([1.0, 10.0, 1e3, 1e8])
    Vu = 1.3
    per_R2 = lam / 4 if lam > 0 else -2 * lam
    R_a = B.radius_for_target(L, lam, Vu, form="asymptote")
    R_h = B.radius_for_target(L, lam, Vu, form="half")
    R_e = B.radius_for_target(L, lam, Vu, form="exact")
    np.testing.assert_allclose(B.two_dirac_asymptote(per_R2 * R_a**2, Vu), L, rtol=F64_CLOSED_FORM)
    np.testing.assert_allclose(B.two_dirac_half(per_R2 * R_h**2, Vu), L, rtol=F64_CLOSED_FORM)
    np.testing.assert_allclose(B.two_dirac_lower(per_R2 * R_e**2, Vu), L, rtol=F64_CLOSED_FORM)
    assert np.all(R_e <= R_a) and np.all(R_e <= R_h)
    assert B.radius_for_target(0.5, lam, Vu, form="exact") == 0.0
    assert B.radius_for_target(0.5, lam, Vu, form="half") == 0.0
    if lam > 0:  # docs/theory.md §9 closed form, C = 3 sqrt(3)/64 ||Vu||
        C = 3 * np.sqrt(3) / 64 * Vu
        np.testing.assert_allclose(
            R_a, np.sqrt(8 / lam * lambertw(L / (8 * C))), rtol=F64_REWRITTEN_EXP
        )


def bisect_radius(L, a, b, c):
    f = lambda t: np.log(a) + np.log1p(b * t) + c * t - np.log(L)  # noqa: E731
    hi = 1.0
    while f(hi) < 0:
        hi *= 2
    return np.sqrt(optimize.brentq(f, 0.0, hi, xtol=1e-300, rtol=4 * np.finfo(float).eps))


@settings(max_examples=100, deadline=None)
@given(st.floats(0.1, 10), st.floats(0.01, 10), st.floats(0.01, 10), st.floats(1.0001, 1e50))
def test_radius_for_upper_matches_bisection(a, b, c, ratio):
    L = a * ratio
    exact = B.radius_for_upper(L, a, b, c)
    assert exact == pytest.approx(bisect_radius(L, a, b, c), rel=F64_SOLVER)
    cons = B.radius_for_upper(L, a, b, c, form="lambert")
    if np.isfinite(cons):
        assert cons**2 * b >= 1 - F64_CLOSED_FORM and cons <= exact * (1 + F64_CLOSED_FORM)


def test_radius_for_upper_special_cases():
    assert np.isnan(B.radius_for_upper(0.5, 1.0, 3.0, 1.0))
    assert B.radius_for_upper(1.0, 1.0, 3.0, 1.0) == 0.0
    assert B.radius_for_upper(10.0, 1.0, 3.0, 0.0) == pytest.approx(np.sqrt(3.0))
    assert B.radius_for_upper(10.0, 1.0, 0.0, 2.0) == pytest.approx(np.sqrt(np.log(10) / 2))
    assert B.radius_for_upper(10.0, 1.0, 0.0, 0.0) == np.inf
    assert np.isnan(B.radius_for_upper(1.5, 1.0, 3.0, 1.0, form="lambert"))  # R^2 < 1/b there
    # simple mean-field form: a = ||V||, b = 3 ||A||, c = c' ||A||
    R = B.radius_for_upper(50.0, 1.2, 3 * 0.8, 0.8)
    assert B.mean_field_upper(0.8, 1.2, R, form="simple") == pytest.approx(
        50.0, rel=F64_CLOSED_FORM
    )
