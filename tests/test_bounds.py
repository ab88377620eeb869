"""Closed-form bounds of theory.bounds against independent numpy oracles, limits and brute force.

The oracles here are written from THEORY.md directly and share no code with theory/: a naive
log-weighted softmax attention, the closed-form Jacobian blocks of §4.1 (checked against central
finite differences), the mean-field local constant of §5.2, Kim et al.'s L2 attention, and an
explicit simulation of the duplicate-then-move attack of §12.2.
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize

from theory import bounds as B
from theory.lambert import lambertw

# ---------------------------------------------------------------------------------------------
# numpy oracles
# ---------------------------------------------------------------------------------------------


def softmax_rows(logits: np.ndarray) -> np.ndarray:
    m = logits.max(axis=1, keepdims=True)
    e = np.exp(logits - m)
    return e / e.sum(axis=1, keepdims=True)


def attention_weights(X, A, log_a=None, masked=False):
    logits = X @ A @ X.T
    if log_a is not None:
        logits = logits + log_a[None, :]
    if masked:
        logits = np.where(np.tril(np.ones_like(logits, dtype=bool)), logits, -np.inf)
    return softmax_rows(logits)


def attention(X, A, V, log_a=None, masked=False):
    return attention_weights(X, A, log_a, masked) @ X @ V.T


def jacobian(X, A, V, log_a=None, masked=False):
    """Closed-form Jacobian (THEORY §4.1), shape (n*d_v, n*d), blocks J_ij = d f_i / d x_j."""
    n, d = X.shape
    dv = V.shape[0]
    P = attention_weights(X, A, log_a, masked)
    m = P @ X
    J = np.zeros((n * dv, n * d))
    for i in range(n):
        D = X - m[i]
        C = (P[i][:, None] * D).T @ D
        b = A.T @ X[i]
        for j in range(n):
            blk = P[i, j] * V @ (np.eye(d) + np.outer(D[j], b))
            if i == j:
                blk = blk + V @ C @ A.T
            J[i * dv : (i + 1) * dv, j * d : (j + 1) * d] = blk
    return J


def fd_jacobian(fun, X, h=1e-6):
    x0 = X.ravel()
    cols = []
    for k in range(x0.size):
        e = np.zeros_like(x0)
        e[k] = h
        diff = fun((x0 + e).reshape(X.shape)) - fun((x0 - e).reshape(X.shape))
        cols.append(diff.ravel() / (2 * h))
    return np.stack(cols, axis=1)


def spec(M):
    return np.linalg.norm(M, 2)


def mean_field_local(X, a, A, V):
    """L_W of THEORY §5.2: ||D_a^{1/2} J D_a^{-1/2}||_2 with the weighted Jacobian."""
    n, d = X.shape
    dv = V.shape[0]
    J = jacobian(X, A, V, log_a=np.log(a))
    scale = np.sqrt(np.repeat(a, dv))[:, None] / np.sqrt(np.repeat(a, d))[None, :]
    return spec(J * scale)


def random_ball(rng, n, d, R):
    Z = rng.normal(size=(n, d))
    r = R * rng.uniform(0.2, 1.0, size=(n, 1)) ** (1 / d)
    return Z / np.linalg.norm(Z, axis=1, keepdims=True) * r


def construction(u, R, n, case):
    if case == "+":
        X = np.tile(R / 2 * u, (n, 1))
        X[0] = R * u
    else:
        X = np.tile(R * u, (n, 1))
        X[0] = -R * u
    return X


# ---------------------------------------------------------------------------------------------
# the oracles themselves
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("masked", [False, True])
def test_oracle_jacobian_matches_finite_differences(rng, masked):
    n, d, dv = 4, 3, 2
    X = random_ball(rng, n, d, 1.5)
    A = rng.normal(size=(d, d))
    V = rng.normal(size=(dv, d))
    log_a = np.log(rng.dirichlet(np.ones(n)))
    J = jacobian(X, A, V, log_a, masked)
    fd = fd_jacobian(lambda Y: attention(Y, A, V, log_a, masked), X)
    np.testing.assert_allclose(J, fd, atol=1e-8)


# ---------------------------------------------------------------------------------------------
# §6.1 sqrt(n) upper bounds
# ---------------------------------------------------------------------------------------------

norms = st.floats(min_value=0.0, max_value=5.0)


@settings(max_examples=200, deadline=None)
@given(norms, norms, st.floats(0.0, 4.0), st.integers(1, 10**6))
def test_sqrt_n_forms_are_ordered(a, v, R, n):
    tri = B.sqrt_n_upper(a, v, R, n, form="triangle")
    sharp = B.sqrt_n_upper(a, v, R, n, sharp=True)
    loose = B.sqrt_n_upper(a, v, R, n)
    assert tri <= sharp * (1 + 1e-12) and sharp <= loose * (1 + 1e-12)
    for form in ("sqrt3", "sharp", "triangle"):
        C = B.sqrt_n_constant(a, v, R, n, form=form)
        assert C * np.sqrt(n) == pytest.approx(B.sqrt_n_upper(a, v, R, n, form=form), rel=1e-12)
        assert B.sqrt_n_constant(a, v, R, form=form) >= C * (1 - 1e-12)  # n = 1 is uniform


@pytest.mark.parametrize("masked", [False, True])
def test_sqrt_n_upper_dominates_local_constants(rng, masked):
    d, dv = 3, 2
    for trial in range(30):
        n = int(rng.integers(1, 9))
        R = float(rng.uniform(0.3, 2.5))
        A = rng.normal(size=(d, d))
        V = rng.normal(size=(dv, d))
        X = random_ball(rng, n, d, R)
        local = spec(jacobian(X, A, V, masked=masked))
        tri = B.sqrt_n_upper(spec(A), spec(V), R, n, form="triangle")
        assert local <= tri * (1 + 1e-10), (trial, local, tri)


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
        assert np.linalg.norm(rows) == pytest.approx(expect, rel=1e-12)
        exact = spec(J)
        assert expect <= exact * (1 + 1e-12)
        for form in ("sqrt3", "sharp", "triangle"):
            assert exact <= B.sqrt_n_upper(spec(A), spec(V), R, n, form=form) * (1 + 1e-12)


def test_sqrt_n_lower_large_gamma_and_limits():
    assert B.sqrt_n_lower(1000.0, 1e6) == pytest.approx(np.sqrt(1e6 - 1), rel=1e-12)
    assert B.sqrt_n_lower(3.0, 1) == 0.0
    n = np.arange(2, 400)
    vals = B.sqrt_n_lower(2.0, n)
    p = np.exp(2.0) / (np.exp(2.0) + n - 1)
    np.testing.assert_allclose(vals, np.sqrt(n - 1) * p * (1 + (1 - p) * 2.0), rtol=1e-13)
    # while n - 1 <= e^gamma, p >= 1/2 and the bound is >= sqrt(n - 1) / 2
    gamma = 6.0
    n = np.arange(2, int(np.exp(gamma)) + 2)
    assert np.all(B.sqrt_n_lower(gamma, n) >= 0.5 * np.sqrt(n - 1) * (1 - 1e-12))


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
        assert vals[-1] == pytest.approx(B.two_dirac_g(k / n, gamma, Vu), rel=1e-11)
    assert B.sequence_lower(gamma, n, Vu) == pytest.approx(max(vals), rel=1e-12)


def test_sequence_lower_saturates_at_sup_g():
    for gamma in (0.5, 3.0, 8.0):
        n = np.array([2, 10, 100, 10**4, 10**7])
        seq = B.sequence_lower(gamma, n)
        sup = B.two_dirac_lower(gamma)
        assert np.all(np.diff(seq) >= -1e-12) and np.all(seq <= sup * (1 + 1e-12))
        assert np.all(seq >= B.sqrt_n_lower(gamma, n) * (1 - 1e-12))
        assert seq[-1] == pytest.approx(sup, rel=1e-5)
        brute = max(B.two_dirac_g(k / 100, gamma) for k in range(1, 100))
        assert B.sequence_lower(gamma, 100) == pytest.approx(brute, rel=1e-13)


# ---------------------------------------------------------------------------------------------
# §9 masked construction
# ---------------------------------------------------------------------------------------------


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
        assert np.linalg.norm(rows) == pytest.approx(expect, rel=1e-12)


@pytest.mark.parametrize("gamma", [0.0, 1.0, 4.0, 9.0])
def test_masked_lower_increases_and_converges(gamma):
    n = np.unique(np.logspace(0, 6, 60).astype(int))
    vals = B.masked_sqrt_n_lower(gamma, n)
    assert np.all(np.diff(vals) > 0)
    limit = B.masked_sqrt_n_lower(gamma, np.inf)
    # tail of the squared sum after n terms <= (1 + gamma)^2 e^{2 gamma} / (n - 1)
    tail = (1 + gamma) ** 2 * np.exp(2 * gamma) / (n[-1] - 1)
    assert vals[-1] <= limit <= np.sqrt(vals[-1] ** 2 + tail) * (1 + 1e-12)
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
    assert B.masked_sqrt_n_lower(gamma, np.inf) == pytest.approx(float(ref), rel=1e-10)


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
    assert B.masked_sqrt_n_lower(gamma, np.inf) == pytest.approx(float(ref), rel=1e-12)


# ---------------------------------------------------------------------------------------------
# §6.3 gap rules
# ---------------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.floats(-5, 5), st.floats(-5, 5), st.floats(0.1, 3))
def test_construction_gap_rules_agree(l1, l2, R):
    lmax, lmin = max(l1, l2), min(l1, l2)
    rel = B.construction_gap(lmax, lmin, R, rule="released")
    best = B.construction_gap(lmax, lmin, R, rule="best")
    assert rel.gamma == pytest.approx(best.gamma, rel=1e-14, abs=1e-300)
    assert best.gamma >= 0
    assert best.gamma == pytest.approx(max(lmax * R**2 / 4, -2 * lmin * R**2), rel=1e-14)
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
        assert u @ A @ u == pytest.approx(lam, rel=1e-12)
    lam_all = np.linalg.eigvals(A)
    real = lam_all[np.abs(lam_all.imag) < 1e-12].real
    if real.size:
        rel = B.rayleigh_extremes(A, variant="released")
        assert rel.lam_max == pytest.approx(real.max(), rel=1e-10)
        assert sym.lam_max >= rel.lam_max - 1e-12 and sym.lam_min <= rel.lam_min + 1e-12
    with pytest.raises(ValueError, match="no real eigenvalue"):
        B.rayleigh_extremes(np.array([[0.0, -1.0], [1.0, 0.0]]), variant="released")


# ---------------------------------------------------------------------------------------------
# §6.2 released quantity
# ---------------------------------------------------------------------------------------------


def test_released_quantity_formula_and_counterexample():
    val = B.released_data_dependent([1.0, 2.0], [0.5, 0.1], 2.0, 10)
    expect = 1.0 * np.sqrt(0.25 * 4 * 11 + 10) + 2.0 * np.sqrt(0.01 * 4 * 11 + 10)
    assert val == pytest.approx(expect, rel=1e-14)
    # THEORY §6.2: A = e1 e2^T, tokens on the e2 axis: R_h = max ||A^T x_i|| = 0.
    A = np.array([[0.0, 1.0], [0.0, 0.0]])
    V = np.eye(2)
    X = np.array([[0.0, -3.0], [0.0, 3.0], [0.0, -3.0], [0.0, 3.0]])
    R_h = np.max(np.linalg.norm(X @ A, axis=1))  # rows x_i^T A = (A^T x_i)^T
    assert R_h == 0.0
    released = B.released_data_dependent(1.0, R_h, 6.0, 4)
    actual = spec(jacobian(X, A, V))
    assert actual > 2 * released  # not a valid upper bound
    assert actual <= B.sqrt_n_upper(spec(A), 1.0, 3.0, 4, form="triangle")


# ---------------------------------------------------------------------------------------------
# §7 mean-field bounds against the local W2 constant
# ---------------------------------------------------------------------------------------------


def test_mean_field_upper_forms_and_log():
    R = np.linspace(0, 3, 31)
    sharp = B.mean_field_upper(0.7, 1.3, R)
    simple = B.mean_field_upper(0.7, 1.3, R, form="simple")
    assert np.all(sharp <= simple * (1 + 1e-14))
    np.testing.assert_allclose(np.log(sharp), B.mean_field_upper(0.7, 1.3, R, log=True), rtol=1e-14)
    assert np.all(B.mean_field_upper(0.7, 1.3, R, c=2.0) >= sharp)
    assert np.isfinite(B.mean_field_upper(1.0, 1.0, 100.0, log=True))
    theta = 0.7 * R**2
    np.testing.assert_allclose(sharp, 1.3 * (theta + (1 + 2 * theta) * np.exp(theta)), rtol=1e-14)


def test_mean_field_upper_dominates_local_w2_constants(rng):
    d = 2
    worst = 0.0
    for trial in range(60):
        n = int(rng.integers(2, 5))
        R = float(rng.uniform(0.5, 2.5))
        A = rng.normal(size=(d, d))
        V = rng.normal(size=(d, d))
        X = random_ball(rng, n, d, R)
        a = np.exp(rng.uniform(-12, 0, size=n))
        a /= a.sum()
        LW = mean_field_local(X, a, A, V)
        up = B.mean_field_upper(spec(A), spec(V), R, c=1.0)
        worst = max(worst, LW / up)
        assert LW <= up, (trial, LW, up)
    assert worst > 0.0


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
    assert g <= LW * (1 + 1e-9)
    assert LW <= B.mean_field_upper(a, spec(V), R)
    assert B.mean_field_lower(A, V, R) <= B.mean_field_upper(a, spec(V), R)


def test_two_dirac_g_forms_and_stability():
    eps = np.array([0.3, 1e-3, 1e-8])
    gamma = np.array([0.5, 4.0, 15.0])
    w = eps * np.exp(gamma) / (eps * np.exp(gamma) + 1 - eps)
    direct = np.sqrt((1 - eps) / eps) * w * (1 + (1 - w) * gamma)
    second = np.exp(gamma / 2) * np.sqrt(w * (1 - w)) * (1 + (1 - w) * gamma)
    np.testing.assert_allclose(B.two_dirac_g(eps, gamma), direct, rtol=1e-13)
    np.testing.assert_allclose(direct, second, rtol=1e-12)
    tiny = B.two_dirac_g(1e-300, 1000.0)
    assert tiny == pytest.approx(1e150, rel=1e-12)  # w -> 1: sqrt((1-eps)/eps)
    assert np.isfinite(B.two_dirac_log_g(-1000.0, 1000.0))
    assert B.two_dirac_log_g(np.log(0.25), 2.0) == pytest.approx(np.log(B.two_dirac_g(0.25, 2.0)))


GAMMAS = np.concatenate([np.logspace(-3, 3, 25), [2 / 3]])


@pytest.mark.parametrize("gamma", GAMMAS)
def test_quadratic_optimum_matches_brute_force(gamma):
    opt = B.two_dirac_optimal_mass(gamma)
    v = opt.v
    assert 4 * gamma * v**2 - (3 * gamma - 2) * v - 1 == pytest.approx(0.0, abs=1e-12 * (1 + gamma))
    res = optimize.minimize_scalar(
        lambda le: -B.two_dirac_log_g(le, gamma),
        bounds=(-gamma - 60.0, -1e-12),
        method="bounded",
        options={"xatol": 1e-12},
    )
    brute = -res.fun
    log_sup = B.two_dirac_lower(gamma, log=True)
    assert log_sup >= brute - 1e-12
    assert np.exp(log_sup - brute) == pytest.approx(1.0, abs=1e-9)
    assert B.two_dirac_log_g(opt.log_eps, gamma) == pytest.approx(log_sup, rel=1e-12, abs=1e-12)


def test_optimal_mass_limits():
    small = B.two_dirac_optimal_mass(np.array([0.0, 1e-8, 1e-4]))
    np.testing.assert_allclose(small.v, 0.5, atol=1e-4)
    big = B.two_dirac_optimal_mass(np.array([1e3, 1e6, 1e9]))
    np.testing.assert_allclose(big.v, 0.75, atol=1e-3)
    np.testing.assert_allclose(np.exp(big.log_eps[0] + 1e3), 1 / 3, rtol=1e-3)
    assert big.eps[1] == 0.0 and np.isfinite(big.log_eps[1])  # underflow, log stays exact
    # log_eps + gamma carries the rounding of gamma = 1e9 (ulp 1.2e-7)
    assert np.exp(big.log_eps[2] + 1e9) == pytest.approx(1 / 3, rel=1e-6)
    g = np.logspace(-3, 3, 200)
    v = B.two_dirac_optimal_mass(g).v
    assert np.all(np.diff(v) > 0) and np.all((v > 0.5) & (v < 0.75))


def test_asymptote_and_half_are_below_sup_g():
    g = np.logspace(-3, np.log10(1000.0), 400)
    sup = B.two_dirac_lower(g, log=True)
    assert np.all(B.two_dirac_asymptote(g, log=True) <= sup)
    assert np.all(B.two_dirac_half(g, log=True) <= sup + 1e-15)
    ratio = np.exp(B.two_dirac_asymptote(g, log=True) - sup)
    assert ratio[-1] == pytest.approx(1.0, abs=2e-3) and np.all(np.diff(ratio) > 0)
    assert np.isfinite(B.two_dirac_lower(1000.0))  # e^500 ~ 1e217 still fits
    assert B.two_dirac_lower(1500.0) == np.inf  # e^750 overflows; the log form does not
    assert np.isfinite(B.two_dirac_lower(1500.0, log=True))


# ---------------------------------------------------------------------------------------------
# §7.3 off-axis bound
# ---------------------------------------------------------------------------------------------


def test_off_axis_reduces_to_axis():
    R, lam = 1.7, 0.8
    u = np.array([1.0, 0.0])
    A = np.diag([lam, -0.3])
    gamma = lam * R**2 / 4
    for w in (0.2, 0.5, 0.9):
        eps = 1 / (1 + (1 - w) / w * np.exp(gamma))
        val = B.off_axis_two_atom(R * u, R / 2 * u, u, w, A, np.eye(2))
        assert val == pytest.approx(B.two_dirac_g(eps, gamma), rel=1e-12)


def test_off_axis_is_a_local_constant_lower_bound(rng):
    d = 2
    for _ in range(40):
        A = rng.normal(size=(d, d))
        V = rng.normal(size=(d, d))
        R = 1.5
        x, y = random_ball(rng, 2, d, R)
        h = rng.normal(size=d)
        w = float(rng.uniform(0.05, 0.95))
        s = y @ A @ (x - y)
        log_eps = -np.logaddexp(0.0, np.log((1 - w) / w) + s)  # eps/(1-eps) = e^{-s} w/(1-w)
        eps = np.exp(log_eps)
        if eps < 1e-12:
            continue
        LW = mean_field_local(np.array([y, x]), np.array([1 - eps, eps]), A, V)
        assert B.off_axis_two_atom(x, y, h, w, A, V) <= LW * (1 + 1e-9)
    xs = random_ball(rng, 5, d, 1.0)
    assert B.off_axis_two_atom(xs, xs[::-1] * 0.5, xs + 1.0, 0.3, A, V).shape == (5,)


def test_mean_field_lower_forms(rng):
    R = np.array([0.1, 1.0, 3.0])
    lo = B.mean_field_lower((1.0, -0.3), 1.0, R)
    assert np.all(lo >= 1.0)
    assert lo[0] == 1.0  # small radius: the trivial bound wins
    expect = max(1.0, B.two_dirac_lower(9 / 4), B.two_dirac_lower(2 * 0.3 * 9))
    assert lo[2] == pytest.approx(expect, rel=1e-14)
    A = rng.normal(size=(3, 3))
    V = rng.normal(size=(2, 3))
    sym = B.mean_field_lower(A, V, R)
    assert np.all(sym <= B.mean_field_upper(spec(A), spec(V), R))
    assert np.all(sym >= spec(V) * (1 - 1e-14))


# ---------------------------------------------------------------------------------------------
# §8 large radius
# ---------------------------------------------------------------------------------------------


def test_large_radius_counts_and_limit_forms():
    lim = B.large_radius_limit([[1, 2, 0], [3, 0, 0]], [1.0, 2.0])
    np.testing.assert_allclose(lim, [np.sqrt(2), 2 * np.sqrt(3)])
    assert B.large_radius_limit([0, 0, 1, 2], 1.5, kind="argmax") == pytest.approx(1.5 * np.sqrt(2))
    with pytest.raises(ValueError):
        B.large_radius_limit([0, 4], 1.0, kind="argmax")
    with pytest.raises(ValueError):
        B.large_radius_limit([-1, 2], 1.0)


@pytest.mark.parametrize("masked", [False, True])
def test_local_constant_converges_to_hard_max_limit(rng, masked):
    d, n = 3, 6
    A = rng.normal(size=(d, d))
    V = rng.normal(size=(2, d))
    X = random_ball(rng, n, d, 1.0)
    counts = B.large_radius_counts(X, A, masked=masked)
    limit = B.large_radius_limit(counts, spec(V))
    devs = []
    for R in (1.0, 3.0, 10.0, 30.0):
        XR = R * X
        local = spec(jacobian(XR, A, V, masked=masked))
        gap = B.selection_gap(XR, A, masked=masked)
        dev = B.large_radius_deviation(gap, n, spec(A), spec(V), np.max(np.linalg.norm(XR, axis=1)))
        assert abs(local - limit) <= dev * (1 + 1e-9) + 1e-12
        devs.append(abs(local - limit))
    assert devs[-1] < 1e-8
    assert limit <= np.sqrt(n) * spec(V)


# ---------------------------------------------------------------------------------------------
# §10 Kim et al.
# ---------------------------------------------------------------------------------------------


def test_kim_lemma_brute_force(rng):
    for N in (2, 3, 10, 100):
        bound = B.kim_softmax_lemma(N)
        t = np.abs(rng.standard_cauchy(size=(20000, N))) * rng.uniform(0, 5, size=(20000, 1))
        t[:, 0] = 0.0
        p = softmax_rows(-t)
        assert np.max(np.sum(p * t, axis=1)) <= bound * (1 + 1e-12)
        t_star = 1 + bound
        tt = np.full(N, t_star)
        tt[0] = 0.0
        pp = softmax_rows(-tt[None, :])[0]
        assert np.sum(pp * tt) == pytest.approx(bound, rel=1e-12)
        assert (t_star - 1) * np.exp(t_star) == pytest.approx(N - 1, rel=1e-12)
        res = optimize.minimize_scalar(
            lambda s, N=N: -(N - 1) * s / (np.exp(s) + N - 1),
            bounds=(0, 50),
            method="bounded",
            options={"xatol": 1e-12},
        )
        assert -res.fun == pytest.approx(bound, rel=1e-10)


def test_kim_lemma_mean_field_and_variants():
    N = np.array([1.0, 2.0, 10.0, 1e6])
    np.testing.assert_allclose(
        B.kim_softmax_lemma_mean_field(1 / N), B.kim_softmax_lemma(N), rtol=1e-13, atol=1e-300
    )
    assert np.all(B.kim_softmax_lemma(N, variant="N") >= B.kim_softmax_lemma(N))
    np.testing.assert_allclose(B.kim_softmax_lemma(N, variant="N"), lambertw(N / np.e), rtol=1e-15)
    assert B.kim_softmax_lemma(1) == 0.0
    big = B.kim_softmax_lemma(1e12)
    assert big == pytest.approx(np.log(1e12) - np.log(np.log(1e12)) - 1, abs=0.3)  # O(log N)


def kim_l2_attention(X, WQ, WV, WO):
    H, D, dh = WQ.shape
    heads = []
    for h in range(H):
        Y = X @ WQ[h]
        sq = ((Y[:, None, :] - Y[None, :, :]) ** 2).sum(-1)
        P = softmax_rows(-sq / np.sqrt(dh))
        A_h = WQ[h] @ WQ[h].T / np.sqrt(dh)
        heads.append(P @ X @ A_h @ WV[h])
    return np.concatenate(heads, axis=1) @ WO


@pytest.mark.parametrize(("N", "D", "H"), [(3, 4, 2), (5, 4, 1), (4, 6, 3)])
def test_kim_bounds_dominate_jacobians(rng, N, D, H):
    for _ in range(6):
        WQ = rng.normal(size=(H, D, D // H)) * rng.uniform(0.3, 1.5)
        WV = rng.normal(size=(H, D, D // H))
        WO = rng.normal(size=(D, D))
        X = rng.normal(size=(N, D)) * rng.uniform(0.5, 3.0)
        J = fd_jacobian(lambda Z, WQ=WQ, WV=WV, WO=WO: kim_l2_attention(Z, WQ, WV, WO), X, h=1e-5)
        two = B.kim_l2_upper(N, D=D, H=H, **B.kim_l2_norms(WQ, WV, WO), p=2)
        inf = B.kim_l2_upper(N, D=D, H=H, **B.kim_l2_norms(WQ, WV, WO, p="inf"), p="inf")
        assert spec(J) <= two
        assert np.abs(J).sum(axis=1).max() <= inf
        assert B.kim_l2_upper(N, D=D, H=H, **B.kim_l2_norms(WQ, WV, WO), variant="N") >= two


def test_kim_l2_upper_formula():
    val = B.kim_l2_upper(10, D=8, H=2, WQ_norms=[1.0, 2.0], WV_norms=[3.0, 1.0], WO_norm=1.5)
    w = float(lambertw(9 / np.e))
    expect = np.sqrt(10) / 2 * (4 * w + 1) * np.sqrt(9 + 4) * 1.5
    assert val == pytest.approx(expect, rel=1e-14)
    norms = {"WQ_norms": [1.0, 2.0], "WV_norms": [3.0, 1.0], "WO_norm": 1.5}
    val = B.kim_l2_upper(10, D=8, H=2, **norms, p="inf")
    assert val == pytest.approx((4 * w + 0.5) * 1.5 * 2.0 * 3.0, rel=1e-14)
    with pytest.raises(ValueError):
        B.kim_l2_upper(10, D=8, H=3, WQ_norms=[1, 1, 1], WV_norms=[1, 1, 1], WO_norm=1)
    sq = B.kim_l2_upper(
        10, D=8, H=2, WQ_norms=[1.0, 2.0], WV_norms=[3.0, 1.0], WO_norm=1.5, wq_power=2
    )
    assert sq == pytest.approx(np.sqrt(10) / 2 * (4 * w + 1) * np.sqrt(9 + 16) * 1.5, rel=1e-14)


def test_kim_recalled_p2_form_fails_for_large_query_weights():
    """Counterexample of the verification harness: the recalled p=2 form is linear in ||W^Q||."""
    N, D, H = 2, 1, 1
    WQ, WV, WO = np.full((1, 1, 1), 2.32), np.ones((1, 1, 1)), np.ones((1, 1))
    X = np.array([[-0.005], [0.72]])
    J = fd_jacobian(lambda Z: kim_l2_attention(Z, WQ, WV, WO), X, h=1e-6)
    norms = B.kim_l2_norms(WQ, WV, WO)
    assert spec(J) > B.kim_l2_upper(N, D=D, H=H, **norms)
    assert spec(J) <= B.kim_l2_upper(N, D=D, H=H, **norms, wq_power=2)


# ---------------------------------------------------------------------------------------------
# §2.3 multi-head combination
# ---------------------------------------------------------------------------------------------


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
    assert spec(J) <= B.multihead_upper(local, W_norms=[spec(W) for W in Ws]) * (1 + 1e-12)
    assert spec(J) <= B.multihead_upper(local, WO_norm=spec(WO), rule="l2") * (1 + 1e-12)
    assert B.multihead_upper(local) == pytest.approx(local.sum())
    with pytest.raises(ValueError):
        B.multihead_upper(local, rule="l2")
    assert B.multihead_upper([1.0, np.inf]) == np.inf  # an overflowed head bound propagates
    with pytest.raises(ValueError, match="head_bounds"):
        B.multihead_upper([1.0, np.nan])


# ---------------------------------------------------------------------------------------------
# §11 inversions
# ---------------------------------------------------------------------------------------------


def test_gap_for_target_inverts():
    L = np.array([0.0, 1e-3, 1.0, 50.0, 1e300])
    g = B.gap_for_target(L)
    assert g[0] == 0.0
    np.testing.assert_allclose(np.log(g[1:]) + g[1:] / 2, np.log(L[1:]), rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("lam", [0.7, -0.4])
def test_radius_for_target_inverts_each_form(lam):
    L = np.array([1.0, 10.0, 1e3, 1e8])
    Vu = 1.3
    per_R2 = lam / 4 if lam > 0 else -2 * lam
    R_a = B.radius_for_target(L, lam, Vu, form="asymptote")
    R_h = B.radius_for_target(L, lam, Vu, form="half")
    R_e = B.radius_for_target(L, lam, Vu, form="exact")
    np.testing.assert_allclose(B.two_dirac_asymptote(per_R2 * R_a**2, Vu), L, rtol=1e-12)
    np.testing.assert_allclose(B.two_dirac_half(per_R2 * R_h**2, Vu), L, rtol=1e-12)
    np.testing.assert_allclose(B.two_dirac_lower(per_R2 * R_e**2, Vu), L, rtol=1e-12)
    assert np.all(R_e <= R_a) and np.all(R_e <= R_h)
    assert B.radius_for_target(0.5, lam, Vu, form="exact") == 0.0
    assert B.radius_for_target(0.5, lam, Vu, form="half") == 0.0
    if lam > 0:  # THEORY §11.2 closed form, C = 3 sqrt(3)/64 ||Vu||
        C = 3 * np.sqrt(3) / 64 * Vu
        np.testing.assert_allclose(R_a, np.sqrt(8 / lam * lambertw(L / (8 * C))), rtol=1e-13)


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
    assert exact == pytest.approx(bisect_radius(L, a, b, c), rel=1e-10)
    cons = B.radius_for_upper(L, a, b, c, form="lambert")
    if np.isfinite(cons):
        assert cons**2 * b >= 1 - 1e-12 and cons <= exact * (1 + 1e-12)


def test_radius_for_upper_special_cases():
    assert np.isnan(B.radius_for_upper(0.5, 1.0, 3.0, 1.0))
    assert B.radius_for_upper(1.0, 1.0, 3.0, 1.0) == 0.0
    assert B.radius_for_upper(10.0, 1.0, 3.0, 0.0) == pytest.approx(np.sqrt(3.0))
    assert B.radius_for_upper(10.0, 1.0, 0.0, 2.0) == pytest.approx(np.sqrt(np.log(10) / 2))
    assert B.radius_for_upper(10.0, 1.0, 0.0, 0.0) == np.inf
    assert np.isnan(B.radius_for_upper(1.5, 1.0, 3.0, 1.0, form="lambert"))  # R^2 < 1/b there
    # simple mean-field form: a = ||V||, b = 3 ||A||, c = c' ||A||
    R = B.radius_for_upper(50.0, 1.2, 3 * 0.8, 0.8)
    assert B.mean_field_upper(0.8, 1.2, R, form="simple") == pytest.approx(50.0, rel=1e-12)


# ---------------------------------------------------------------------------------------------
# §12 mass splitting
# ---------------------------------------------------------------------------------------------


def simulate_split(A, V, u, R, k):
    """Exact W2 ratio of the duplicate-then-move attack, from explicit log-weight softmaxes."""
    y, z = R / 2 * u, R * u
    atoms = np.array([y, z])
    with np.errstate(divide="ignore"):  # k = 1: the stay-behind copy has mass 0
        log_a = np.log([1 - 1 / k, 1 / k])
    out = []
    for q in (y, z):
        logits = atoms @ A.T @ q + log_a  # q^T A x_j + log a_j
        w = np.exp(logits - logits.max())
        w /= w.sum()
        out.append(V @ (w @ atoms))
    Fy = V @ y  # F(mu) is the Dirac at V y
    out_w2 = np.sqrt((1 - 1 / k) * np.sum((out[0] - Fy) ** 2) + np.sum((out[1] - Fy) ** 2) / k)
    in_w2 = np.linalg.norm(z - y) / np.sqrt(k)
    return out_w2 / in_w2, np.linalg.norm(V @ (z - y)) / np.linalg.norm(z - y)


def test_split_gain_matches_simulation(rng):
    d = 3
    for _ in range(10):
        A = rng.normal(size=(d, d))
        V = rng.normal(size=(2, d))
        ext = B.rayleigh_extremes(A)
        u, lam = ext.u_max, ext.lam_max
        R = float(rng.uniform(0.5, 3.0))
        s = lam * R**2 / 4
        for k in (1, 2, 7, 50, 1000):
            ratio, vfac = simulate_split(A, V, u, R, k)
            assert ratio == pytest.approx(vfac * B.split_gain(k, s), rel=1e-12)
        assert B.split_gain_general(7, R / 2, R, lam) == pytest.approx(
            B.split_gain(7, s), rel=1e-14
        )


def test_split_gain_regimes():
    assert B.split_gain(1, 5.0) == 1.0
    assert np.all(B.split_gain(1, np.array([-3.0, 0.0, 40.0])) == 1.0)
    k = np.arange(1, 1001)
    np.testing.assert_allclose(B.split_gain(k, 40.0), np.sqrt(k), rtol=1e-12)  # k << e^s
    for s in (10.0, 20.0, 40.0):
        kstar = B.split_optimal_k(s)
        peak = B.split_gain(kstar, s)
        assert peak == pytest.approx(np.exp(s / 2) / 2, rel=2 * np.exp(-s / 2) + 1e-12)
        assert peak >= B.split_gain(np.array([kstar / 2, 2 * kstar]), s).max()
    assert B.split_gain(1e30, 10.0) < 1e-5  # decays for k >> e^s
    assert np.isfinite(B.split_gain(1e300, 700.0))


def test_split_optimal_k_brute_force():
    for s in np.concatenate([np.linspace(-2, 9, 45), [11.0]]):
        ks = np.arange(1, int(3 * np.exp(max(s, 0))) + 10, dtype=float)
        assert B.split_optimal_k(s) == ks[np.argmax(B.split_gain(ks, s))]


def test_split_gain_w_infinity_has_no_gain():
    # THEORY §12.3: under W_inf every output moves by at most max(w_y, w_z) ||V delta||.
    s = 5.0
    k = np.arange(1, 200)
    wy = np.exp(s) / (k - 1 + np.exp(s))
    wz = np.exp(2 * s) / (k - 1 + np.exp(2 * s))
    assert np.all(np.maximum(wy, wz) <= 1.0)
    assert np.all(B.split_gain(k, s) >= np.maximum(wy, wz) - 1e-15)


# ---------------------------------------------------------------------------------------------
# validation and broadcasting
# ---------------------------------------------------------------------------------------------

BAD_CALLS = [
    (B.sqrt_n_upper, (-1.0, 1.0, 1.0, 2)),
    (B.sqrt_n_upper, (1.0, 1.0, 1.0, 0.5)),
    (B.sqrt_n_upper, (1.0, np.nan, 1.0, 2)),
    (B.sqrt_n_lower, (-0.1, 5)),
    (B.sqrt_n_lower, (1.0, 0)),
    (B.sequence_lower, (1.0, 2.5)),
    (B.masked_sqrt_n_lower, (1.0, 2.5)),
    (B.mean_field_upper, (1.0, -1.0, 1.0)),
    (B.two_dirac_g, (0.0, 1.0)),
    (B.two_dirac_g, (1.0, 1.0)),
    (B.two_dirac_log_g, (0.0, 1.0)),
    (B.two_dirac_lower, (-1.0,)),
    (B.two_dirac_optimal_mass, (np.inf,)),
    (B.kim_softmax_lemma, (0.5,)),
    (B.kim_softmax_lemma_mean_field, (0.0,)),
    (B.radius_for_target, (1.0, 0.0)),
    (B.radius_for_target, (-1.0, 1.0)),
    (B.split_gain, (0.5, 1.0)),
    (B.split_gain_general, (2, 3.0, 2.0, 1.0)),
    (B.large_radius_limit, ([1.5], 1.0)),
    (B.released_data_dependent, (1.0, 1.0, 1.0, 0)),
]


@pytest.mark.parametrize(("fn", "args"), BAD_CALLS, ids=lambda x: getattr(x, "__name__", ""))
def test_one_line_value_errors(fn, args):
    with pytest.raises(ValueError) as info:
        fn(*args)
    assert "\n" not in str(info.value)


def test_keyword_validation():
    with pytest.raises(ValueError, match="conflicts"):
        B.sqrt_n_upper(1, 1, 1, 2, sharp=True, form="triangle")
    with pytest.raises(ValueError, match="form"):
        B.mean_field_upper(1, 1, 1, form="nope")
    with pytest.raises(ValueError, match="rule"):
        B.construction_gap(1, 0, 1, rule="nope")


def test_broadcasting_and_scalars():
    a = np.array([[0.5], [1.0], [2.0]])
    R = np.array([0.5, 1.0, 1.5, 2.0])
    assert B.sqrt_n_upper(a, 1.0, R, 10).shape == (3, 4)
    assert B.mean_field_upper(a, 1.0, R).shape == (3, 4)
    assert B.two_dirac_lower(a * R).shape == (3, 4)
    assert B.sqrt_n_lower(a, R[None, :] * 10 + 1).shape == (3, 4)
    assert B.masked_sqrt_n_lower(a, np.array([1, 5, 9, 20])).shape == (3, 4)
    assert B.split_gain(np.array([1, 2, 3])[:, None], R).shape == (3, 4)
    assert B.radius_for_target(a * 10, R).shape == (3, 4)
    assert isinstance(B.sqrt_n_upper(1.0, 1.0, 1.0, 2), np.floating)
    assert isinstance(B.two_dirac_lower(1.0), np.floating)


@pytest.mark.slow
def test_mean_field_upper_dominates_optimized_measures(rng):
    # Multi-start Nelder-Mead over 3 weighted atoms in B_R (positions R tanh|z| z/|z|, free
    # log-masses, THEORY §7.4): the optimized local W2 constant never exceeds the c' = 1 bound.
    d, n = 2, 3
    for _ in range(6):
        A = rng.normal(size=(d, d))
        V = rng.normal(size=(d, d))
        R = float(rng.uniform(0.3, 2.0))
        up = B.mean_field_upper(spec(A), spec(V), R)

        def neg_ratio(z, A=A, V=V, R=R, up=up):
            P = z[: n * d].reshape(n, d)
            nr = np.linalg.norm(P, axis=1, keepdims=True) + 1e-12
            X = R * np.tanh(nr) * P / nr
            la = z[n * d :]
            a = np.exp(la - la.max())
            a /= a.sum()
            if a.min() < 1e-300:
                return 0.0
            return -mean_field_local(X, a, A, V) / up

        for _ in range(3):
            z0 = np.concatenate([rng.normal(size=n * d), rng.uniform(-15, 0, size=n)])
            res = optimize.minimize(neg_ratio, z0, method="Nelder-Mead", options={"maxiter": 2000})
            assert -res.fun <= 1.0
