"""Step-by-step numerical check of the proof of the c' = 1 mean-field upper bound
(docs/theory.md §17).

For every instance the proof's objects are rebuilt in numpy from the definitions (attention law
``P``, means ``m_i``, covariances ``C_i``, self blocks ``S_i = C_i A^T``, kernel blocks
``M_ij = I + (x_j - m_i)(A^T x_i)^T``), the decomposition ``D^{1/2} J D^{-1/2} = (I x V)(S + K~)``
is checked against the engine's dense exact constant (``meanfield.local_lipschitz``, geometry
"wasserstein", method "dense"), and then every inequality of the proof is evaluated on its own,
so that a wrong step fails here even when the final bound happens to hold.

The only slack is ``RTOL = 1e-12`` (relative) for rounding between two sides of an inequality
computed in different orders; it is not a tolerance on the mathematics.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from meanfield import AttentionParams, DiracMeasure, local_lipschitz
from meanfield.attacks import two_dirac_measure, worst_case_measure
from theory import bounds as B

from ..tolerances import (
    ASYMPTOTE,
    ASYMPTOTE_NEGLIGIBLE,
    BRACKET_MARGIN,
    BRUTE_FORCE_MAX,
    EXACT_ZERO_FLOOR,
    F64_DENSE_ASSEMBLY,
    F64_FEW_ULPS,
    F64_LANCZOS,
    F64_REWRITTEN,
    F64_REWRITTEN_EXP,
)

RTOL = 1e-12


def _le(a, b):
    """``a <= b`` up to float64 rounding of quantities of size ``|b|``."""
    return a <= b + RTOL * abs(b) + EXACT_ZERO_FLOOR


def _spec(M):
    return float(np.linalg.norm(M, 2))


def _engine(X, log_a, A, V, geometry="wasserstein", positions=None):
    """The engine's dense exact constant (float64) at the measure sum_j a_j delta_{x_j}."""
    mu = DiracMeasure.from_log_weights(
        torch.as_tensor(X, dtype=torch.float64),
        torch.as_tensor(log_a, dtype=torch.float64),
        positions=None if positions is None else torch.as_tensor(positions, dtype=torch.float64),
    )
    params = AttentionParams(A=torch.as_tensor(A), V=torch.as_tensor(V))
    est = local_lipschitz(mu, params, geometry=geometry, method="dense")
    return float(est.lower), float(est.value), float(est.upper)


def _proof_objects(X, log_a, A, V, masked=False):
    """All quantities of the proof (docs/theory.md §17), from the definitions only."""
    n, d = X.shape
    log_a = log_a - np.logaddexp.reduce(log_a)
    S = X @ A @ X.T  # scores x_i^T A x_j
    logits = S + log_a[None, :]
    if masked:  # positions t_j = j / n: query i sees keys j <= i
        logits = np.where(np.tril(np.ones((n, n), dtype=bool)), logits, -np.inf)
    log_Z = np.logaddexp.reduce(logits, axis=1)
    log_P = logits - log_Z[:, None]
    P = np.exp(log_P)
    m = P @ X
    C = np.stack([((X - m[i]).T * P[i]) @ (X - m[i]) for i in range(n)])
    q = X @ A  # rows (A^T x_i)^T
    # weighted scalar factor sqrt(a_i / a_j) P_ij, computed in the log domain
    log_w = 0.5 * log_a[:, None] - 0.5 * log_a[None, :] + log_P
    w = np.exp(log_w)
    Kt = np.zeros((n * d, n * d))
    Mn = np.zeros((n, n))
    Kn = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            M = np.eye(d) + np.outer(X[j] - m[i], q[i])
            Mn[i, j] = _spec(M)
            blk = w[i, j] * M
            Kt[i * d : (i + 1) * d, j * d : (j + 1) * d] = blk
            Kn[i, j] = _spec(blk)
    Sblk = np.zeros((n * d, n * d))
    for i in range(n):
        Sblk[i * d : (i + 1) * d, i * d : (i + 1) * d] = C[i] @ A.T
    full = np.kron(np.eye(n), V) @ (Sblk + Kt)
    return {
        "a": np.exp(log_a), "log_a": log_a, "P": P, "log_P": log_P, "m": m, "C": C, "q": q,
        "Mn": Mn, "Kt": Kt, "Kn": Kn, "Sblk": Sblk, "full": full, "w": w, "scores": S,
    }  # fmt: skip


def _check_proof(X, log_a, A, V, *, R=None, engine=True):
    """Evaluate every inequality of the proof at one instance; return a few ratios."""
    n, d = X.shape
    R = float(np.max(np.linalg.norm(X, axis=1))) if R is None else float(R)
    a_n, v_n = _spec(A), _spec(V)
    theta = a_n * R**2
    o = _proof_objects(X, log_a, A, V)
    a, P, m, C, q = o["a"], o["P"], o["m"], o["C"], o["q"]
    sa = np.exp(0.5 * o["log_a"])

    # Step 0: the decomposition is the weighted Jacobian the engine measures
    L_proof = _spec(o["full"])
    if engine:
        lo, val, up = _engine(X, log_a, A, V)
        assert abs(L_proof - val) <= F64_DENSE_ASSEMBLY * val, (L_proof, val)
        assert lo <= val <= up
    # Step 1: self term, ||C_i A^T|| <= ||A|| ||C_i|| <= ||A|| R^2
    for i in range(n):
        cn = _spec(C[i])
        assert _le(_spec(C[i] @ A.T), a_n * cn)
        second = _spec((X.T * P[i]) @ X)  # C_i <= E[x x^T] in the Loewner order
        assert _le(cn, second)
        assert _le(second, R**2)
    S_norm = _spec(o["Sblk"])
    assert _le(S_norm, theta)
    # Step 2: kernel blocks, ||M_ij|| <= 1 + ||x_j - m_i|| ||A^T x_i|| <= 1 + 2 theta
    dist = np.linalg.norm(X[None, :, :] - m[:, None, :], axis=2)  # ||x_j - m_i||
    qn = np.linalg.norm(q, axis=1)
    kern = 1.0 + dist * qn[:, None]
    assert np.all(_le(o["Mn"], kern))
    assert np.all(_le(kern, 1 + 2 * theta))
    # Step 3: a block matrix is at most the matrix of its block norms
    Kt_norm = _spec(o["Kt"])
    Kn_norm = _spec(o["Kn"])
    assert _le(Kt_norm, Kn_norm)
    # Step 4: Schur test with the weights sqrt(a)
    rows = (o["Kn"] @ sa) / sa
    cols = (sa @ o["Kn"]) / sa
    assert _le(Kn_norm, float(np.sqrt(rows.max() * cols.max())))
    # Step 5: rows, sum_j P_ij = 1, sum_j P_ij ||x_j - m_i|| <= sqrt(tr C_i) <= R
    np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=F64_REWRITTEN_EXP)
    mean_dist = np.sum(P * dist, axis=1)
    trC = np.trace(C, axis1=1, axis2=2)
    assert np.all(_le(mean_dist, np.sqrt(trC)))
    assert np.all(_le(trC, R**2))
    row_bound = 1.0 + qn * mean_dist
    assert np.all(_le(rows, row_bound))
    assert np.all(_le(row_bound, 1.0 + theta))
    # Step 6: columns, P_ij / a_j = e^{x_i^T A x_j} / Z_i <= e^{2 theta}; sum_i a_i P_ij / a_j
    log_ratio = o["log_P"] - o["log_a"][None, :]
    assert np.all(_le(log_ratio, 2 * theta))
    col_mass = (a @ np.exp(log_ratio - 2 * theta)) * np.exp(2 * theta)
    assert np.all(_le(col_mass, np.exp(2 * theta)))
    assert np.all(_le(cols, (1 + 2 * theta) * col_mass))
    # Step 7: assemble
    schur = np.sqrt((1 + theta) * (1 + 2 * theta)) * np.exp(theta)
    assert _le(Kt_norm, schur)
    assert _le(L_proof, v_n * (S_norm + Kt_norm))
    refined = float(B.mean_field_upper(a_n, v_n, R, c=1.0, form="refined"))
    sharp = float(B.mean_field_upper(a_n, v_n, R, c=1.0))
    assert _le(v_n * (theta + schur), refined)
    assert _le(refined, sharp)
    assert _le(L_proof, refined)
    if engine:
        _, split, _ = _engine(X, log_a, A, V, geometry="split")
        assert _le(split, refined)
    return {
        "L": L_proof, "theta": theta, "col": float(cols.max()), "row": float(rows.max()),
        "refined": refined, "Kt": Kt_norm,
    }  # fmt: skip


def _random_instance(rng, d, n, R, *, spread=None):
    X = rng.normal(size=(n, d))
    r = R * rng.uniform(0.0, 1.0, size=(n, 1)) ** (1 / d)
    r[rng.integers(n)] = R  # one atom on the sphere
    X = X / np.linalg.norm(X, axis=1, keepdims=True) * r
    A = rng.normal(size=(d, d)) * rng.uniform(0.2, 2.0)
    V = rng.normal(size=(int(rng.integers(1, d + 2)), d))
    theta = _spec(A) * R**2
    spread = 2 * theta + 5 if spread is None else spread
    log_a = rng.uniform(-spread, 0.0, size=n)
    return X, log_a, A, V


@pytest.mark.parametrize("d", [1, 2, 3, 4])
def test_proof_steps_random_measures(d):
    """Random measures, tiny masses (down to e^{-2 theta - 5}), radius up to 5."""
    rng = np.random.default_rng([17, d])
    worst = 0.0
    for _ in range(25):
        n = int(rng.integers(2, 7))
        R = float(rng.uniform(0.1, 5.0))
        X, log_a, A, V = _random_instance(rng, d, n, R)
        out = _check_proof(X, log_a, A, V)
        worst = max(worst, out["L"] / out["refined"])
    assert 0.0 < worst <= 1.0


def test_proof_steps_duplicated_atoms():
    """Coincident atoms (a split Dirac): the proof never uses distinct points."""
    rng = np.random.default_rng(5)
    for _ in range(10):
        X, log_a, A, V = _random_instance(rng, 2, 3, float(rng.uniform(0.5, 4.0)))
        X = np.concatenate([X, X[:2]])
        log_a = np.concatenate([log_a, log_a[:2] + np.log(rng.uniform(0.01, 1.0, size=2))])
        _check_proof(X, log_a, A, V)


@pytest.mark.parametrize("sign", [-1.0, 1.0])
@pytest.mark.parametrize("d", [1, 3])
def test_proof_steps_two_dirac_optima(sign, d):
    """The optimal two-Dirac measures (both cases; masses down to e^{-50}), R = 1..5."""
    for R in (1.0, 2.5, 5.0):
        A = sign * np.eye(d)
        mu = two_dirac_measure(torch.as_tensor(A), R)
        X = mu.points.numpy()
        log_a = mu.log_weights.numpy()
        out = _check_proof(X, log_a, A, np.eye(d))
        if sign < 0 and R >= 2.5:
            # the column step is sharp in the exponent: the light atom's column is ~e^{2 theta}
            assert out["col"] >= 0.1 * np.exp(2 * out["theta"])


def test_exponent_is_attained():
    """At A = -I the exact constant grows like theta e^theta: c' = 1 cannot be lowered."""
    asym = (
        3 * np.sqrt(3) / 8
    )  # two-Dirac asymptote (3 sqrt 3 / 16) gamma e^{gamma / 2}, gamma = 2 theta
    for R in (2.0, 3.0, 4.0, 5.0):
        mu = two_dirac_measure(torch.eye(2, dtype=torch.float64) * -1.0, R)
        _, val, _ = _engine(mu.points.numpy(), mu.log_weights.numpy(), -np.eye(2), np.eye(2))
        theta = R**2
        # sandwich: (3 sqrt 3 / 8) theta e^theta <= L <= theta + sqrt((1+theta)(1+2theta)) e^theta
        assert asym * theta * np.exp(theta) <= val
        assert val <= B.mean_field_upper(1.0, 1.0, R, form="refined")
        # so any exponent c' < 1 fails from some radius on; c' = 1/2 already at R = 3
        if R >= 3.0:
            assert val > B.mean_field_upper(1.0, 1.0, R, c=0.5)
        if R == 5.0:
            assert val / (theta * np.exp(theta)) < 1.05 * asym


def test_proof_steps_searched_worst_measures():
    """Measures returned by the worst-case search (small, cheap searches)."""
    rng = np.random.default_rng(23)
    for d, R in ((1, 3.0), (2, 2.0)):
        A = torch.as_tensor(rng.normal(size=(d, d)))
        V = torch.as_tensor(rng.normal(size=(d, d)))
        res = worst_case_measure(
            AttentionParams(A=A, V=V), R, 3, n_restarts=2, steps=60, seed=0, certify=False
        )
        X = res.measure.points.numpy()
        out = _check_proof(X, res.measure.log_weights.numpy(), A.numpy(), V.numpy(), R=R)
        assert out["L"] == pytest.approx(res.value, rel=F64_LANCZOS)


def test_refined_form_values():
    """The refined form: ||V|| (theta + sqrt((1 + theta)(1 + 2 theta)) e^{c theta})."""
    R = np.linspace(0.0, 4.0, 17)
    theta = 0.6 * R**2
    ref = B.mean_field_upper(0.6, 1.7, R, form="refined")
    expect = 1.7 * (theta + np.sqrt((1 + theta) * (1 + 2 * theta)) * np.exp(theta))
    np.testing.assert_allclose(ref, expect, rtol=F64_REWRITTEN_EXP)
    np.testing.assert_allclose(
        np.log(ref),
        B.mean_field_upper(0.6, 1.7, R, form="refined", log=True),
        rtol=F64_REWRITTEN_EXP,
    )
    sharp = B.mean_field_upper(0.6, 1.7, R)
    assert np.all(ref <= sharp)
    assert np.all(ref[1:] < sharp[1:])  # strictly sharper for theta > 0
    # ratio sharp / refined -> sqrt(2) as theta grows
    big = B.mean_field_upper(1.0, 1.0, 30.0, log=True) - B.mean_field_upper(
        1.0, 1.0, 30.0, form="refined", log=True
    )
    assert big == pytest.approx(0.5 * np.log(2.0), abs=ASYMPTOTE)


def test_masked_steps_and_hardy_bound():
    """Masked (causal, positions j / n): the column step fails, the Hardy route of §17 holds."""
    rng = np.random.default_rng(31)
    s = np.sqrt(2.0) - 1.0
    for _ in range(30):
        d = int(rng.integers(1, 4))
        n = int(rng.integers(2, 9))
        R = float(rng.uniform(0.05, 3.0))
        X, log_a, A, V = _random_instance(rng, d, n, R)
        R = float(np.max(np.linalg.norm(X, axis=1)))
        theta, v_n = _spec(A) * R**2, _spec(V)
        o = _proof_objects(X, log_a, A, V, masked=True)
        a = o["a"]
        _, val, _ = _engine(X, log_a, A, V, positions=np.arange(n) / n)
        assert abs(_spec(o["full"]) - val) <= F64_DENSE_ASSEMBLY * val
        cum = np.cumsum(a)  # A_i, mass of the keys a query at position i sees
        # P_ij / a_j <= e^{2 theta} / A_i, hence N_ij <= (1 + 2 theta) e^{2 theta} H_ij
        log_ratio = o["log_P"] - o["log_a"][None, :]
        assert np.all(_le(log_ratio + np.log(cum)[:, None], 2 * theta))
        H = np.tril(np.sqrt(np.outer(a, a)) / cum[:, None])
        assert np.all(_le(o["Kn"], (1 + 2 * theta) * np.exp(2 * theta) * H))
        # Schur test for H with weights sqrt(a_j) A_j^{-s}: rows <= 1/(1-s), columns <= 1 + 1/s
        p = np.sqrt(a) * cum**-s
        assert np.all(_le((H @ p) / p, 1 / (1 - s)))
        assert np.all(_le((p @ H) / p, 1 + 1 / s))
        assert _le(_spec(H), 1 + np.sqrt(2.0))
        bound = v_n * (theta + (1 + np.sqrt(2.0)) * (1 + 2 * theta) * np.exp(2 * theta))
        assert _le(val, bound)
    # the sqrt(a) column sums of the unmasked proof are unbounded: uniform masses at theta -> 0,
    # the column sum of the first atom is the harmonic number H_n
    n = 12
    X = np.full((n, 1), 1e-4)
    o = _proof_objects(X, np.full(n, -np.log(n)), np.eye(1), np.eye(1), masked=True)
    sa = np.exp(0.5 * o["log_a"])
    col0 = float((sa @ o["Kn"])[0] / sa[0])
    assert col0 == pytest.approx(sum(1 / k for k in range(1, n + 1)), rel=ASYMPTOTE_NEGLIGIBLE)
    assert col0 > 3.0


# ---------------------------------------------------------------------------------------------
# step 9: the score-gap exponent (columns bounded cell by cell)
# ---------------------------------------------------------------------------------------------


def _max_score_gap(A, rng, n_samples=4000):
    """Brute-force lower estimate of max_{|x|,|y|<=1} x^T A (y - x): samples plus local polish."""
    from scipy import optimize

    d = A.shape[0]

    def neg(z):
        x, y = z[:d], z[d:]
        x = x / max(1.0, np.linalg.norm(x))
        y = y / max(1.0, np.linalg.norm(y))
        return -(x @ A @ (y - x))

    Z = rng.normal(size=(n_samples, 2 * d))
    Z[:, :d] *= rng.uniform(0, 1, size=(n_samples, 1)) / np.linalg.norm(Z[:, :d], axis=1)[:, None]
    Z[:, d:] /= np.linalg.norm(Z[:, d:], axis=1)[:, None]
    vals = np.array([-neg(z) for z in Z])
    best = float(vals.max())
    for z in Z[np.argsort(vals)[-5:]]:
        best = max(best, -float(optimize.minimize(neg, z, method="Nelder-Mead").fun))
    return best


def test_score_gap_constant_is_an_upper_bound_and_exact_for_semidefinite():
    rng = np.random.default_rng(41)
    for a in (0.3, 1.0, 2.5):
        for d in (1, 3):
            assert B.score_gap_constant(a * np.eye(d)) == pytest.approx(a / 4, rel=F64_REWRITTEN)
            assert B.score_gap_constant(-a * np.eye(d)) == pytest.approx(2 * a, rel=F64_REWRITTEN)
    for trial in range(12):
        d = int(rng.integers(1, 4))
        M = rng.normal(size=(d, d))
        kind = trial % 3
        A = M @ M.T if kind == 0 else (-(M @ M.T) if kind == 1 else M)
        kb = float(B.score_gap_constant(A))
        brute = _max_score_gap(A, rng)
        assert brute <= kb * (1 + BRACKET_MARGIN), (A, brute, kb)
        assert kb <= 2 * _spec(A) * (1 + F64_FEW_ULPS)
        if kind in (0, 1):  # semidefinite: the certified constant is attained
            assert brute >= kb * (1 - BRUTE_FORCE_MAX), (A, brute, kb)


def _cells(X, R, k):
    """Index of the half-open grid cube (side 2R/k, k^d cubes tiling [-R, R]^d) of every atom."""
    idx = np.clip(np.floor((X + R) / (2 * R / k)).astype(int), 0, k - 1)
    return [tuple(r) for r in idx]


def _check_cells(X, log_a, A, V, R):
    n, d = X.shape
    theta = _spec(A) * R**2
    kap = float(B.score_gap_constant(A))
    o = _proof_objects(X, log_a, A, V)
    a, S = o["a"], o["scores"]
    log_Z = np.logaddexp.reduce(S + o["log_a"][None, :], axis=1)
    # advantage of key j over the query itself: x_i^T A (x_j - x_i) <= kappa R^2
    adv = S - np.diag(S)[:, None]
    assert np.all(_le(adv, kap * R**2))
    sa = np.exp(0.5 * o["log_a"])
    cols = (sa @ o["Kn"]) / sa
    for k in sorted({1, 2, max(1, int(2 * theta / np.sqrt(d))), max(1, int(theta))}):
        cell = _cells(X, R, k)
        slack = 2 * np.sqrt(d) * theta / k
        col_sum = np.zeros(n)
        for c in set(cell):
            members = np.array([i for i in range(n) if cell[i] == c])
            mass = a[members].sum()
            # Z_i >= mu(Q) e^{s_ii - 2 sqrt(d) theta / k} for every atom i of the cell Q
            assert np.all(_le(np.log(mass) + np.diag(S)[members] - slack, log_Z[members]))
            # the cell's share of every column is at most e^{kappa R^2 + 2 sqrt(d) theta / k}
            share = np.exp(np.log(a[members])[:, None] + S[members] - log_Z[members][:, None])
            share = share.sum(axis=0)
            assert np.all(_le(share, np.exp(kap * R**2 + slack)))
            col_sum += share
        assert len(set(cell)) <= k**d
        assert np.all(_le(cols, (1 + 2 * theta) * col_sum))
        assert np.all(_le(col_sum, k**d * np.exp(kap * R**2 + slack)))
    L = _spec(o["full"])
    bound = float(B.mean_field_upper_cells(A, V, R))
    assert _le(L, bound)
    assert _le(bound, float(B.mean_field_upper(_spec(A), _spec(V), R, form="refined")))
    return L, bound


@pytest.mark.parametrize("d", [1, 2, 3])
def test_cells_steps_random_measures(d):
    rng = np.random.default_rng([43, d])
    for trial in range(15):
        n = int(rng.integers(2, 7))
        R = float(rng.uniform(0.2, 5.0))
        X, log_a, A, V = _random_instance(rng, d, n, R)
        if trial % 2 == 0:  # positive semidefinite scores, where the exponent drops to theta / 8
            A = A @ A.T / max(_spec(A), 1e-12)
        R = float(np.max(np.linalg.norm(X, axis=1)))
        _check_cells(X, log_a, A, V, R)


def test_cells_bound_at_searched_worst_measures_positive_definite():
    """A = +I: the searched worst measures sit within a polynomial factor of the cells bound."""
    for R in (2.0, 3.5, 5.0):
        A = torch.eye(1, dtype=torch.float64)
        res = worst_case_measure(
            AttentionParams(A=A, V=A), R, 3, n_restarts=2, steps=100, seed=0, certify=False
        )
        X = res.measure.points.numpy()
        L, bound = _check_cells(X, res.measure.log_weights.numpy(), np.eye(1), np.eye(1), R)
        assert L == pytest.approx(res.value, rel=F64_LANCZOS)
        # the e^theta forms are exponentially looser than the cells bound here
        refined = float(B.mean_field_upper(1.0, 1.0, R, form="refined"))
        if R == 5.0:
            assert refined / bound > 1e6
            assert bound / L < 1e3


def test_cells_bound_exponent():
    """log(bound) / R^2 -> kappa / 2: 1/8 for A = I, 1 (no gain) for A = -I."""
    R = np.array([10.0, 30.0, 100.0])
    up = B.mean_field_upper_cells(np.eye(2), np.eye(2), R, log=True) / R**2
    assert np.all(np.diff(up) < 0) and up[-1] < 0.125 + 0.01 and up[-1] > 0.125
    up_neg = B.mean_field_upper_cells(-np.eye(2), np.eye(2), R, log=True)
    np.testing.assert_allclose(
        up_neg, B.mean_field_upper(1.0, 1.0, R, form="refined", log=True), rtol=F64_REWRITTEN
    )
