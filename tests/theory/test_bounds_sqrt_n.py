"""√n regime (theory.bounds.sqrt_n): upper bounds, the eigenvector construction, its
masked version, gap rules and the multi-head rules, against numpy oracles (docs/theory.md §1, §3,
§4).
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from theory import bounds as B

from ..oracles_bounds import (
    attention,
    construction,
    fd_jacobian,
    jacobian,
    random_ball,
    random_instance,
    spec,
)
from ..tolerances import (
    ASYMPTOTE_CONVERGED,
    BRACKET_MARGIN,
    BRACKET_MARGIN_LOOSE,
    EXACT_ZERO_FLOOR,
    F64_CLOSED_FORM,
    F64_LONG_CHAIN,
    F64_NONSYM_EIG,
    F64_REDUCTION,
    F64_REWRITTEN,
    F64_REWRITTEN_EXP,
    F64_SOLVER,
    F64_ZERO,
    FD_SCALAR,
)


@pytest.mark.parametrize("masked", [False, True])
def test_oracle_jacobian_matches_finite_differences(rng, masked):
    n, d, dv = 4, 3, 2
    X = random_ball(rng, n, d, 1.5)
    A = rng.normal(size=(d, d))
    V = rng.normal(size=(dv, d))
    log_a = np.log(rng.dirichlet(np.ones(n)))
    J = jacobian(X, A, V, log_a, masked)
    fd = fd_jacobian(lambda Y: attention(Y, A, V, log_a, masked), X)
    np.testing.assert_allclose(J, fd, atol=FD_SCALAR)


norms = st.floats(min_value=0.0, max_value=5.0)


@settings(max_examples=200, deadline=None)
@given(norms, norms, st.floats(0.0, 4.0), st.integers(1, 10**6))
def test_sqrt_n_forms_are_ordered(a, v, R, n):
    tri = B.sqrt_n_upper(a, v, R, n, form="triangle")
    sharp = B.sqrt_n_upper(a, v, R, n, sharp=True)
    loose = B.sqrt_n_upper(a, v, R, n)
    assert tri <= sharp * (1 + F64_CLOSED_FORM) and sharp <= loose * (1 + F64_CLOSED_FORM)
    for form in ("sqrt3", "sharp", "triangle"):
        C = B.sqrt_n_constant(a, v, R, n, form=form)
        assert C * np.sqrt(n) == pytest.approx(
            B.sqrt_n_upper(a, v, R, n, form=form), rel=F64_CLOSED_FORM
        )
        assert B.sqrt_n_constant(a, v, R, form=form) >= C * (
            1 - F64_CLOSED_FORM
        )  # n = 1 is uniform


@pytest.mark.parametrize("masked", [False, True])
def test_sqrt_n_upper_dominates_local_constants(rng, masked):
    d, dv = 3, 2
    for trial in range(30):
        n, R, A, V, X = random_instance(rng, (1, 9), (0.3, 2.5), d, dv)
        local = spec(jacobian(X, A, V, masked=masked))
        tri = B.sqrt_n_upper(spec(A), spec(V), R, n, form="triangle")
        assert local <= tri * (1 + BRACKET_MARGIN_LOOSE), (trial, local, tri)


@pytest.mark.parametrize("case", ["+", "-"])
def test_sqrt_n_lower_is_exact_on_the_construction(rng, case):
    d, dv, R = 3, 2, 1.3
    A = rng.normal(size=(d, d))  # non-symmetric
    V = rng.normal(size=(dv, d))
    ext = B.rayleigh_extremes(A)
    u, lam = (ext.u_max, ext.lam_max) if case == "+" else (ext.u_min, ext.lam_min)
    gamma = lam * R**2 / 4 if case == "+" else -2 * lam * R**2
    for n in (2, 5, 17, 60):
        X = construction(u, R, n, case)
        J = jacobian(X, A, V)
        H = np.zeros(n * d)
        H[:d] = u
        rows = (J @ H).reshape(n, dv)[1:]
        expect = B.sqrt_n_lower(gamma, n, np.linalg.norm(V @ u))
        assert np.linalg.norm(rows) == pytest.approx(expect, rel=F64_REDUCTION)
        exact = spec(J)
        assert expect <= exact * (1 + BRACKET_MARGIN)
        for form in ("sqrt3", "sharp", "triangle"):
            assert exact <= B.sqrt_n_upper(spec(A), spec(V), R, n, form=form) * (1 + BRACKET_MARGIN)


def test_sqrt_n_lower_large_gamma_and_limits():
    assert B.sqrt_n_lower(1000.0, 1e6) == pytest.approx(np.sqrt(1e6 - 1), rel=F64_CLOSED_FORM)
    assert B.sqrt_n_lower(3.0, 1) == 0.0
    n = np.arange(2, 400)
    vals = B.sqrt_n_lower(2.0, n)
    p = np.exp(2.0) / (np.exp(2.0) + n - 1)
    np.testing.assert_allclose(
        vals, np.sqrt(n - 1) * p * (1 + (1 - p) * 2.0), rtol=F64_REWRITTEN_EXP
    )
    # while n - 1 <= e^gamma, p >= 1/2 and the bound is >= sqrt(n - 1) / 2
    gamma = 6.0
    n = np.arange(2, int(np.exp(gamma)) + 2)
    assert np.all(B.sqrt_n_lower(gamma, n) >= 0.5 * np.sqrt(n - 1) * (1 - F64_CLOSED_FORM))


@pytest.mark.parametrize("case", ["+", "-"])
def test_sequence_lower_k_copies(rng, case):
    d, dv, R = 2, 2, 1.2
    A = rng.normal(size=(d, d))
    V = rng.normal(size=(dv, d))
    ext = B.rayleigh_extremes(A)
    u, lam = (ext.u_max, ext.lam_max) if case == "+" else (ext.u_min, ext.lam_min)
    gamma = lam * R**2 / 4 if case == "+" else -2 * lam * R**2
    Vu = np.linalg.norm(V @ u)
    n = 9
    light, heavy = (R * u, R / 2 * u) if case == "+" else (-R * u, R * u)
    vals = []
    for k in range(1, n):
        X = np.array([light] * k + [heavy] * (n - k))
        J = jacobian(X, A, V)
        H = np.zeros((n, d))
        H[:k] = u / np.sqrt(k)
        rows = (J @ H.ravel()).reshape(n, dv)[k:]
        vals.append(np.linalg.norm(rows))
        assert vals[-1] == pytest.approx(B.two_dirac_g(k / n, gamma, Vu), rel=F64_LONG_CHAIN)
    assert B.sequence_lower(gamma, n, Vu) == pytest.approx(max(vals), rel=F64_REDUCTION)


def test_sequence_lower_saturates_at_sup_g():
    for gamma in (0.5, 3.0, 8.0):
        n = np.array([2, 10, 100, 10**4, 10**7])
        seq = B.sequence_lower(gamma, n)
        sup = B.two_dirac_lower(gamma)
        assert np.all(np.diff(seq) >= -F64_ZERO) and np.all(seq <= sup * (1 + F64_CLOSED_FORM))
        assert np.all(seq >= B.sqrt_n_lower(gamma, n) * (1 - F64_CLOSED_FORM))
        assert seq[-1] == pytest.approx(sup, rel=ASYMPTOTE_CONVERGED)
        brute = max(B.two_dirac_g(k / 100, gamma) for k in range(1, 100))
        assert B.sequence_lower(gamma, 100) == pytest.approx(brute, rel=F64_REWRITTEN_EXP)


def test_masked_lower_matches_causal_jacobian(rng):
    d, dv, R = 2, 2, 1.4
    A = rng.normal(size=(d, d))
    V = rng.normal(size=(dv, d))
    ext = B.rayleigh_extremes(A)
    u, gamma = ext.u_max, ext.lam_max * R**2 / 4
    for n in (2, 4, 11):
        X = construction(u, R, n, "+")
        J = jacobian(X, A, V, masked=True)
        H = np.zeros(n * d)
        H[:d] = u
        rows = (J @ H).reshape(n, dv)[1:]
        expect = B.masked_sqrt_n_lower(gamma, n, np.linalg.norm(V @ u))
        assert np.linalg.norm(rows) == pytest.approx(expect, rel=F64_REDUCTION)


@pytest.mark.parametrize("gamma", [0.0, 1.0, 4.0, 9.0])
def test_masked_lower_increases_and_converges(gamma):
    n = np.unique(np.logspace(0, 6, 60).astype(int))
    vals = B.masked_sqrt_n_lower(gamma, n)
    assert np.all(np.diff(vals) > 0)
    limit = B.masked_sqrt_n_lower(gamma, np.inf)
    # tail of the squared sum after n terms <= (1 + gamma)^2 e^{2 gamma} / (n - 1)
    tail = (1 + gamma) ** 2 * np.exp(2 * gamma) / (n[-1] - 1)
    assert vals[-1] <= limit <= np.sqrt(vals[-1] ** 2 + tail) * (1 + F64_CLOSED_FORM)
    # Saturation versus decay: past n ~ e^gamma the unmasked construction loses the effect.
    # (For small n the masked value can be the smaller one: f(p) = p(1 + (1 - p) gamma) decreases
    # in p for p > (1 + gamma) / (2 gamma), and masked rows see fewer copies.)
    far = n >= 10 * np.exp(gamma)
    assert np.all(vals[far] > B.sqrt_n_lower(gamma, n[far]))


@pytest.mark.parametrize("gamma", [0.5, 3.0])
def test_masked_limit_against_direct_mpmath_sum(gamma):
    with mpmath.workdps(30):
        E = mpmath.e**gamma

        def term(m):
            p = E / (E + m)
            return (p * (1 + (1 - p) * gamma)) ** 2

        ref = mpmath.sqrt(mpmath.nsum(term, [1, mpmath.inf]))
    assert B.masked_sqrt_n_lower(gamma, np.inf) == pytest.approx(float(ref), rel=F64_SOLVER)


@pytest.mark.parametrize("gamma", [0.5, 3.0, 12.0, 29.9, 30.1, 45.0, 300.0])
def test_masked_limit_against_mpmath_hurwitz(gamma):
    # Independent high-precision evaluation of the partial-fraction form (checked symbolically in
    # test_symbolic); exercises the float cancellation and the Euler-Maclaurin branch (gamma > 30).
    with mpmath.workdps(60):
        g = mpmath.mpf(gamma)
        E = mpmath.e**g
        S = (
            (1 + g) ** 2 * E**2 * mpmath.zeta(2, E + 1)
            - 2 * g * (1 + g) * E**3 * mpmath.zeta(3, E + 1)
            + g**2 * E**4 * mpmath.zeta(4, E + 1)
        )
        ref = mpmath.sqrt(S)
    assert B.masked_sqrt_n_lower(gamma, np.inf) == pytest.approx(float(ref), rel=F64_CLOSED_FORM)


@settings(max_examples=200, deadline=None)
@given(st.floats(-5, 5), st.floats(-5, 5), st.floats(0.1, 3))
def test_construction_gap_rules_agree(l1, l2, R):
    lmax, lmin = max(l1, l2), min(l1, l2)
    rel = B.construction_gap(lmax, lmin, R, rule="released")
    best = B.construction_gap(lmax, lmin, R, rule="best")
    assert rel.gamma == pytest.approx(best.gamma, rel=F64_REWRITTEN, abs=EXACT_ZERO_FLOOR)
    assert best.gamma >= 0
    assert best.gamma == pytest.approx(max(lmax * R**2 / 4, -2 * lmin * R**2), rel=F64_REWRITTEN)
    if lmax * R**2 / 4 != -2 * lmin * R**2:  # the rules differ only on ties (after rounding)
        assert rel.case == best.case


def test_construction_gap_cases():
    out = B.construction_gap([8.0, 1.0, 9.0], [-1.0, -1.0, -1.0], 2.0)
    assert list(out.case) == ["-", "-", "+"]
    np.testing.assert_allclose(out.gamma, [8.0, 8.0, 9.0])
    with pytest.raises(ValueError):
        B.construction_gap(-1.0, 1.0, 1.0)


def test_rayleigh_extremes_variants(rng):
    A = rng.normal(size=(4, 4))
    sym = B.rayleigh_extremes(A)
    for u, lam in ((sym.u_max, sym.lam_max), (sym.u_min, sym.lam_min)):
        assert u @ A @ u == pytest.approx(lam, rel=F64_REDUCTION)
    lam_all = np.linalg.eigvals(A)
    real = lam_all[np.abs(lam_all.imag) < F64_ZERO].real
    if real.size:
        rel = B.rayleigh_extremes(A, variant="released")
        assert rel.lam_max == pytest.approx(real.max(), rel=F64_NONSYM_EIG)
        assert sym.lam_max >= rel.lam_max - F64_ZERO and sym.lam_min <= rel.lam_min + F64_ZERO
    with pytest.raises(ValueError, match="no real eigenvalue"):
        B.rayleigh_extremes(np.array([[0.0, -1.0], [1.0, 0.0]]), variant="released")


def test_multihead_rules_bound_the_multihead_jacobian(rng):
    n, d, H, dv = 4, 3, 3, 2
    X = random_ball(rng, n, d, 1.5)
    As = rng.normal(size=(H, d, d))
    Vs = rng.normal(size=(H, dv, d))
    WO = rng.normal(size=(d, H * dv))
    Js = [jacobian(X, As[h], Vs[h]) for h in range(H)]
    Ws = [WO[:, h * dv : (h + 1) * dv] for h in range(H)]
    J = sum(np.kron(np.eye(n), Ws[h]) @ Js[h] for h in range(H))
    local = np.array([spec(Jh) for Jh in Js])
    assert spec(J) <= B.multihead_upper(local, W_norms=[spec(W) for W in Ws]) * (1 + BRACKET_MARGIN)
    assert spec(J) <= B.multihead_upper(local, WO_norm=spec(WO), rule="l2") * (1 + BRACKET_MARGIN)
    assert B.multihead_upper(local) == pytest.approx(local.sum())
    with pytest.raises(ValueError):
        B.multihead_upper(local, rule="l2")
    assert B.multihead_upper([1.0, np.inf]) == np.inf  # an overflowed head bound propagates
    with pytest.raises(ValueError, match="head_bounds"):
        B.multihead_upper([1.0, np.nan])
