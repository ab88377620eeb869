"""Real Lambert W: defining identity, agreement with scipy/mpmath/sympy, derivative, domain."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special

from theory.lambert import (
    BRANCH_POINT_TOLERANCE,
    lambertw,
    lambertw_asymptotic,
    lambertw_derivative,
    lambertw_exp,
)

from ..tolerances import (
    F64_FEW_ULPS,
    F64_ONE_SUBNORMAL,
    F64_REWRITTEN,
    F64_REWRITTEN_EXP,
    F64_VS_EXP_COMPOSED,
    F64_VS_MPMATH,
    F64_VS_SCIPY,
    FD_SCALAR,
)

EPS = np.finfo(float).eps
BRANCH = -np.exp(-1.0)


def mp_reference(z: float, branch: int) -> float:
    """W of the exact float z, at 50 digits (the branch point returns -1)."""
    with mpmath.workdps(50):
        zm = mpmath.mpf(z)
        if 1 + mpmath.e * zm <= 0:
            return -1.0
        return float(mpmath.re(mpmath.lambertw(zm, branch)))


def near_branch_grid() -> np.ndarray:
    steps = [np.nextafter(BRANCH, 0.0)]
    for _ in range(5):
        steps.append(np.nextafter(steps[-1], 0.0))
    offsets = 10.0 ** np.arange(-15, -0.5, 0.5)
    return np.concatenate([steps, BRANCH + offsets])


# ---------------------------------------------------------------------------------------------
# the defining identity W(x e^x) = x
# ---------------------------------------------------------------------------------------------


def identity_tolerance(x: float) -> float:
    # Rounding x e^x costs ~2 eps |z|; W amplifies it by |W'(z) z| = |x / (1 + x)|, and by at most
    # sqrt(2 e * 2 eps |z|) ~ 3e-8 at the branch point itself.
    linear = 8 * EPS * abs(x) / max(abs(1 + x), 1e-300)
    return 1e-14 * max(1.0, abs(x)) + min(linear, 1e-7)


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=-1.0, max_value=700.0, allow_nan=False))
def test_identity_branch_0(x):
    z = x * np.exp(x)
    assert abs(lambertw(z, 0) - x) <= identity_tolerance(x)


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=-700.0, max_value=-1.0, allow_nan=False))
def test_identity_branch_minus_1(x):
    z = x * np.exp(x)  # no underflow for x >= -700
    assert abs(lambertw(z, -1) - x) <= identity_tolerance(x)


@pytest.mark.parametrize("branch", [0, -1])
def test_w_exp_w_is_z(branch):
    zs = (
        near_branch_grid()
        if branch == -1
        else np.concatenate([near_branch_grid(), [0.5, 3.0, 1e5]])
    )
    w = lambertw(zs, branch)
    np.testing.assert_allclose(w * np.exp(w), zs, rtol=F64_REWRITTEN)


# ---------------------------------------------------------------------------------------------
# agreement with mpmath, scipy and sympy
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("branch", [0, -1])
def test_matches_mpmath_including_branch_point(branch):
    far = -np.logspace(-300, np.log10(0.36), 40) if branch == -1 else np.logspace(-300, 300, 60)
    zs = np.concatenate([near_branch_grid(), far, [-0.3, -0.1, -0.01]])
    if branch == -1:
        zs = zs[zs < 0]
    ours = lambertw(zs, branch)
    ref = np.array([mp_reference(z, branch) for z in zs])
    np.testing.assert_allclose(ours, ref, rtol=F64_VS_MPMATH, atol=0)


@pytest.mark.parametrize("branch", [0, -1])
def test_matches_scipy_away_from_branch_point(branch):
    zs = np.linspace(BRANCH + 0.01, -1e-3, 50) if branch == -1 else np.logspace(-5, 200, 50)
    np.testing.assert_allclose(
        lambertw(zs, branch), special.lambertw(zs, branch).real, rtol=F64_VS_SCIPY
    )


def test_beats_scipy_near_branch_point():
    # scipy loses about half the digits of W_{-1} here; the branch-point solver does not.
    z = BRANCH + 1e-12
    ref = mp_reference(z, -1)
    assert abs(lambertw(z, -1) - ref) <= 2 * EPS
    assert abs(special.lambertw(z, -1).real - ref) > 1e-10


@pytest.mark.parametrize(("z", "branch"), [(-0.2, 0), (-0.2, -1), (2.5, 0), (1e-9, 0), (-1e-9, -1)])
def test_matches_sympy(z, branch):
    ref = float(sp.N(sp.LambertW(sp.Float(z, 40), branch), 30))
    assert lambertw(z, branch) == pytest.approx(ref, rel=F64_VS_MPMATH)


def test_high_precision_path():
    with mpmath.workdps(60):
        z = mpmath.mpf("2.5")
    w = lambertw("2.5", precision=40)
    assert isinstance(w, mpmath.mpf)
    with mpmath.workdps(45):
        assert abs(w * mpmath.exp(w) - mpmath.mpf("2.5")) < mpmath.mpf(10) ** -38
        assert abs(w - mpmath.lambertw(z)) < mpmath.mpf(10) ** -38
    arr = lambertw(np.array([0.5, -0.2]), precision=30)
    assert arr.dtype == object and arr.shape == (2,)
    assert float(arr[0]) == pytest.approx(lambertw(0.5), rel=F64_VS_MPMATH)
    wm1 = lambertw("-0.1", -1, precision=30)
    assert float(wm1) == pytest.approx(lambertw(-0.1, -1), rel=F64_VS_MPMATH)


def test_high_precision_branch_point_and_errors():
    assert lambertw(-1 / np.e, -1, precision=30) == -1
    with pytest.raises(ValueError, match="below the branch point"):
        lambertw("-0.368", precision=30)
    with pytest.raises(ValueError, match="branch -1"):
        lambertw("0.1", -1, precision=30)


# ---------------------------------------------------------------------------------------------
# branch point, derivative, shapes and domain errors
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("branch", [0, -1])
@pytest.mark.parametrize("z", [-1 / np.e, -np.exp(-1.0), np.nextafter(-1 / np.e, -1.0)])
def test_branch_point_exact(z, branch):
    assert lambertw(z, branch) == -1.0


def test_monotone_across_solver_switch():
    z = np.linspace(BRANCH, BRANCH + 0.1, 20001)
    w0, wm1 = lambertw(z, 0), lambertw(z, -1)
    assert np.all(np.diff(w0) >= 0) and np.all(np.diff(wm1) <= 0)
    assert np.all(w0 >= -1) and np.all(wm1 <= -1)


@pytest.mark.parametrize("branch", [0, -1])
def test_derivative_matches_finite_differences(branch):
    zs = np.array([-0.3, -0.2, -0.05]) if branch == -1 else np.array([-0.3, -0.1, 0.3, 2.0, 50.0])
    h = 1e-6 * np.abs(zs)
    fd = (lambertw(zs + h, branch) - lambertw(zs - h, branch)) / (2 * h)
    np.testing.assert_allclose(lambertw_derivative(zs, branch), fd, rtol=FD_SCALAR)
    w = lambertw(zs, branch)
    np.testing.assert_allclose(
        lambertw_derivative(zs, branch), w / (zs * (1 + w)), rtol=F64_REWRITTEN_EXP
    )


def test_derivative_special_points():
    assert lambertw_derivative(0.0) == 1.0
    assert lambertw_derivative(-1 / np.e) == np.inf
    assert lambertw_derivative(-1 / np.e, -1) == -np.inf


def test_shapes_and_types():
    assert isinstance(lambertw(1.0), np.float64)
    assert lambertw(np.ones((2, 3))).shape == (2, 3)
    assert lambertw(np.array([])).shape == (0,)
    assert lambertw(np.inf) == np.inf
    assert lambertw(0.0) == 0.0


@pytest.mark.parametrize(
    ("z", "branch", "match"),
    [
        (-0.4, 0, "below the branch point"),
        (BRANCH - 1e-14, 0, "below the branch point"),
        (0.0, -1, "branch -1"),
        (0.5, -1, "branch -1"),
        (np.nan, 0, "NaN"),
        (-np.inf, 0, "below the branch point"),
        (-np.inf, -1, "below the branch point"),
        (np.array([1.0, -np.inf]), 0, "below the branch point"),
        (1.0, 1, "branch must be"),
    ],
)
def test_domain_errors(z, branch, match):
    with pytest.raises(ValueError, match=match) as info:
        lambertw(z, branch)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "z", [-5e-324, -1e-320, -1e-315, -2.2250738585072014e-308, -1e-305, -1e-100, -1.1e-100]
)
def test_branch_minus_1_at_subnormal_and_tiny_z(z):
    # scipy gives -inf at -5e-324, NaN at -1e-320 and a relative error of 2e-9 at -1e-315.
    w = lambertw(z, -1)
    assert np.isfinite(w)
    assert w == pytest.approx(mp_reference(z, -1), rel=4 * EPS)


def test_branch_minus_1_known_value_at_smallest_subnormal():
    assert lambertw(-5e-324, -1) == pytest.approx(-751.0615595398791, rel=4 * EPS)


def test_branch_minus_1_continuous_across_tiny_switch():
    # both sides of the switch between scipy and the log-domain Newton solver agree with mpmath
    zs = -np.logspace(-102, -98, 41)
    w = lambertw(zs, -1)
    assert np.all(np.diff(w) > 0)  # W_{-1} decreases in z, and zs decrease
    ref = np.array([mp_reference(z, -1) for z in zs])
    np.testing.assert_allclose(w, ref, rtol=4 * EPS, atol=0)


def test_branch_point_tolerance_is_a_few_ulps():
    # The tolerance on 1 + e z corresponds to a few ulps of 1/e.
    assert BRANCH_POINT_TOLERANCE / np.e < 10 * np.spacing(1 / np.e)


# ---------------------------------------------------------------------------------------------
# exponential argument and asymptotics
# ---------------------------------------------------------------------------------------------


def test_lambertw_exp_matches_mpmath():
    # W_0(e^u) is the Wright omega function; compare at 50 digits wherever the value is a normal
    # float (below u = -708 it is subnormal, where only an absolute error of an ulp makes sense).
    u = np.concatenate(
        [np.linspace(-708, 1, 301), np.linspace(1, 50, 101), np.logspace(2, 300, 50)]
    )
    with mpmath.workdps(50):
        ref = np.array([float(mpmath.lambertw(mpmath.exp(mpmath.mpf(x)))) for x in u])
    np.testing.assert_allclose(lambertw_exp(u), ref, rtol=2 * EPS, atol=0)
    sub = np.array([-740.0, -745.0, -800.0])
    with mpmath.workdps(50):
        ref_sub = np.array([float(mpmath.lambertw(mpmath.exp(mpmath.mpf(x)))) for x in sub])
    np.testing.assert_allclose(lambertw_exp(sub), ref_sub, rtol=0, atol=F64_ONE_SUBNORMAL)
    assert lambertw_exp(-np.inf) == 0.0 and lambertw_exp(np.inf) == np.inf
    with pytest.raises(ValueError, match="NaN"):
        lambertw_exp(np.array([0.0, np.nan]))


def test_lambertw_exp_matches_direct_and_extends_it():
    u = np.linspace(-30, 700, 200)
    np.testing.assert_allclose(lambertw_exp(u), lambertw(np.exp(u)), rtol=F64_VS_EXP_COMPOSED)
    big = np.array([710.0, 1e4, 1e100])
    w = lambertw_exp(big)
    np.testing.assert_allclose(w + np.log(w), big, rtol=F64_FEW_ULPS)


def test_asymptotic_expansion_converges():
    z = np.array([1e10, 1e50, 1e200])
    w = lambertw(z)
    err2 = np.abs(w - lambertw_asymptotic(z))
    err3 = np.abs(w - lambertw_asymptotic(z, terms=3))
    L1, L2 = np.log(z), np.log(np.log(z))
    assert np.all(err3 < err2)
    assert np.all(np.diff(err2) < 0)
    np.testing.assert_allclose(err2, L2 / L1, rtol=0.2)  # error of the two-term form ~ L2/L1
    zm = -np.array([1e-10, 1e-50])
    assert np.all(np.abs(lambertw(zm, -1) - lambertw_asymptotic(zm, -1, terms=3)) < 0.1)


@pytest.mark.parametrize(("z", "branch"), [(2.0, 0), (-0.5, -1), (0.1, -1)])
def test_asymptotic_domain(z, branch):
    with pytest.raises(ValueError):
        lambertw_asymptotic(z, branch)
