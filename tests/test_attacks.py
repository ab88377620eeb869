"""Adversarial inputs: constructions against exact Jacobians, searches, mass splitting, CLI, figures.

Oracles are independent of meanfield.attacks: the closed-form Jacobian blocks of THEORY.md §4.1 in
numpy (weighted, masked), exact W_2 from meanfield.distances on measures built here, and the
formulas of THEORY.md recomputed inline (theory.bounds is used as a second reference when present).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from meanfield import AttentionParams, DiracMeasure, MultiHeadParams, attention
from meanfield.attacks import (
    adversarial_sequence,
    mass_splitting_attack,
    off_axis_two_atoms,
    optimal_split_k,
    split_constant,
    split_gain,
    two_dirac,
    two_dirac_measure,
    worst_case_measure,
    worst_case_sequence,
)
from meanfield.distances import wasserstein, wasserstein_inf

F64 = torch.float64


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny dense problems: one intra-op thread is much faster (restored afterwards)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ----------------------------------------------------------------------------- oracles
def jacobian_oracle(X, A, V, log_w=None, masked=False):
    """Dense Jacobian (n d_v, n d) from the closed-form blocks of THEORY.md §4.1 (numpy).

    d f_i / d x_j = P_ij V (I + (x_j - m_i)(A^T x_i)^T) + delta_ij V C_i A^T, logits + log a_j.
    """
    X, A, V = (np.asarray(t, dtype=np.float64) for t in (X, A, V))
    n, d = X.shape
    dv = V.shape[0]
    lw = np.zeros(n) if log_w is None else np.asarray(log_w, dtype=np.float64)
    L = X @ A @ X.T + lw[None, :]
    if masked:
        L = np.where(np.tril(np.ones((n, n), bool)), L, -np.inf)
    L = L - L.max(1, keepdims=True)
    P = np.exp(L)
    P /= P.sum(1, keepdims=True)
    J = np.zeros((n * dv, n * d))
    for i in range(n):
        m = P[i] @ X
        C = sum(P[i, l] * np.outer(X[l] - m, X[l] - m) for l in range(n))
        b = A.T @ X[i]
        for j in range(n):
            blk = P[i, j] * V @ (np.eye(d) + np.outer(X[j] - m, b))
            if i == j:
                blk = blk + V @ C @ A.T
            J[i * dv : (i + 1) * dv, j * d : (j + 1) * d] = blk
    return J


def seq_norm(X, A, V, masked=False):
    return np.linalg.norm(jacobian_oracle(X, A, V, masked=masked), 2)


def lw_norm(mu, A, V, masked=False):
    """L_W(mu) = ||D_a^{1/2} J D_a^{-1/2}||_2 from the oracle (THEORY.md §5.2)."""
    lw = mu.log_weights.double().numpy()
    J = jacobian_oracle(mu.points.double(), A, V, lw, masked=masked)
    d, dv = mu.d, np.asarray(V).shape[0]
    so, si = np.repeat(0.5 * lw, dv), np.repeat(0.5 * lw, d)
    return np.linalg.norm(np.exp(so[:, None] - si[None, :]) * J, 2)


def test_jacobian_oracle_matches_jacrev(rng):
    from torch.func import jacrev

    from meanfield import attention_points

    A, V = random_head(rng, 3)
    V = V[:2]  # d_v != d
    X = torch.tensor(rng.standard_normal((4, 3)))
    lw = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=F64))
    for masked in (False, True):
        J = jacrev(
            lambda Y, m=masked: attention_points(Y, AttentionParams(A, V), log_weights=lw, masked=m)
        )(X)
        np.testing.assert_allclose(
            J.reshape(8, 12).numpy(), jacobian_oracle(X, A, V, lw, masked), atol=1e-12
        )


def random_head(rng, d, scale=1.0):
    A = torch.tensor(rng.standard_normal((d, d)) * scale / math.sqrt(d))
    V = torch.tensor(rng.standard_normal((d, d)))
    return A, V


def sup_g(gamma, Vu=1.0):
    """THEORY.md §7.2 optimum, recomputed from the quadratic."""
    if gamma == 0:
        v = 0.5
    else:
        v = ((3 * gamma - 2) + math.sqrt(9 * gamma**2 + 4 * gamma + 4)) / (8 * gamma)
    return math.exp(gamma / 2) * math.sqrt(v * (1 - v)) * (1 + gamma * v) * Vu


def slope(x, y):
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


# ----------------------------------------------------------------------------- §6.3 construction
@pytest.mark.parametrize(
    "variant,case",
    [("released", "auto"), ("symmetric", "+"), ("symmetric", "-"), ("symmetric", "auto")],
)
@pytest.mark.parametrize("n", [2, 5, 17])
def test_construction_bound_below_exact_norm(rng, variant, case, n):
    for trial in range(4):
        A, V = random_head(rng, 3, scale=1.5)
        R = [0.7, 1.5, 2.5, 3.0][trial]
        try:
            con = adversarial_sequence(A, R, n, variant=variant, case=case, V=V)
        except ValueError:
            continue  # e.g. no real eigenvalue of the right sign
        exact = seq_norm(con.X, A, V)
        assert con.lower_bound <= exact * (1 + 1e-12)
        # the formula, recomputed from the returned gap and direction
        p = math.exp(con.gamma) / (math.exp(con.gamma) + n - 1)
        Vu = float(torch.linalg.vector_norm(V @ con.u))
        expect = math.sqrt(n - 1) * p * (1 + (1 - p) * con.gamma) * Vu
        assert math.isclose(con.lower_bound, expect, rel_tol=1e-12, abs_tol=1e-300)
        assert math.isclose(con.p, p, rel_tol=1e-12)
        # every copy sees token 1 with exactly the gap gamma
        x1, y = con.X[0].double(), con.X[1].double()
        assert math.isclose(float(y @ A @ (x1 - y)), con.gamma, rel_tol=1e-10, abs_tol=1e-12)
        assert float(con.X.norm(dim=-1).max()) == pytest.approx(R, rel=1e-12)


def test_construction_matches_theory_bounds(rng):
    bounds = pytest.importorskip("theory.bounds")
    A, V = random_head(rng, 4)
    for n in (2, 9, 40):
        con = adversarial_sequence(A, 2.0, n, variant="symmetric", V=V)
        ref = bounds.sqrt_n_lower(con.gamma, n, float(torch.linalg.vector_norm(V @ con.u)))
        assert math.isclose(con.lower_bound, float(ref), rel_tol=1e-10)


def test_minus8_rule_picks_the_larger_gap(rng):
    for _ in range(20):
        A, _ = random_head(rng, 3, scale=2.0)
        for variant in ("released", "symmetric"):
            try:
                auto = adversarial_sequence(A, 1.3, 4, variant=variant)
            except ValueError:
                continue
            gaps = {}
            for c in ("+", "-"):
                try:
                    gaps[c] = adversarial_sequence(A, 1.3, 4, variant=variant, case=c).gamma
                except ValueError:
                    pass
            assert auto.gamma == pytest.approx(max(gaps.values()), rel=1e-12)
            assert auto.case == max(gaps, key=gaps.get)


def test_minus8_rule_threshold():
    # eigenvalues 8 and -1 (non-symmetric): 8 > -8 * (-1) is false, so case '-' (gaps 2R^2 each)
    Q = torch.tensor([[1.0, 0.4], [0.2, 1.0]], dtype=F64)
    for lam_max, expect in ((8.0 - 1e-6, "-"), (8.0 + 1e-6, "+")):
        A = Q @ torch.diag(torch.tensor([lam_max, -1.0], dtype=F64)) @ torch.linalg.inv(Q)
        con = adversarial_sequence(A, 1.0, 3, variant="released")
        assert con.case == expect
        assert con.lam == pytest.approx(lam_max if expect == "+" else -1.0, rel=1e-9)


def test_symmetric_gap_at_least_released(rng):
    for _ in range(30):
        A, _ = random_head(rng, 4, scale=1.0)
        try:
            rel = adversarial_sequence(A, 2.0, 5, variant="released")
        except ValueError:
            continue
        sym = adversarial_sequence(A, 2.0, 5, variant="symmetric")
        assert sym.gamma >= rel.gamma * (1 - 1e-12)


def test_released_variant_uses_real_eigenvectors():
    # a rotation block (complex pair) plus one real eigenvalue -2
    A = torch.tensor([[0.0, -3.0, 0.0], [3.0, 0.0, 0.0], [0.5, 0.2, -2.0]], dtype=F64)
    con = adversarial_sequence(A, 1.0, 3, variant="released", eigvecs="score")
    assert con.case == "-" and con.lam == pytest.approx(-2.0)
    assert torch.allclose(A @ con.u, -2.0 * con.u, atol=1e-12)
    code = adversarial_sequence(A, 1.0, 3, variant="released", eigvecs="code")
    assert torch.allclose(A.mT @ code.u, -2.0 * code.u, atol=1e-12)  # A_code = A^T (released)
    assert code.gamma == pytest.approx(con.gamma)
    with pytest.raises(ValueError, match="no real eigenvalue"):
        adversarial_sequence(torch.tensor([[0.0, -1.0], [1.0, 0.0]], dtype=F64), 1.0, 3)
    # the symmetric variant always exists
    assert (
        adversarial_sequence(
            torch.tensor([[0.0, -1.0], [1.0, 0.0]], dtype=F64), 1.0, 3, variant="symmetric"
        ).gamma
        >= 0
    )


def test_construction_inputs_and_errors(rng):
    A, V = random_head(rng, 3)
    con = adversarial_sequence(A.float(), 2.0, 4, variant="symmetric")
    assert con.X.dtype == torch.float32 and con.X.shape == (4, 3)
    assert con.lower_bound is None  # no value map given
    # multi-head: construction from the chosen head, no single-head bound
    h0, h1 = AttentionParams(A, V), AttentionParams(-A.mT, V)
    mh = MultiHeadParams((h0, h1))
    c1 = adversarial_sequence(mh, 2.0, 4, variant="symmetric", head=1)
    c1_ref = adversarial_sequence(-A.mT, 2.0, 4, variant="symmetric")
    assert torch.equal(c1.X, c1_ref.X) and c1.lower_bound is None
    c_single = adversarial_sequence(h0, 2.0, 4, variant="symmetric")
    assert c_single.lower_bound is not None
    for bad in (dict(n=0), dict(R=-1.0), dict(case="x"), dict(variant="nope")):
        kw = dict(R=2.0, n=3) | bad
        with pytest.raises(ValueError):
            adversarial_sequence(A, kw.pop("R"), kw.pop("n"), **kw)
    with pytest.raises(ValueError, match="d >= 2"):
        adversarial_sequence(torch.ones(1, 1, dtype=F64), 1.0, 3, sphere=True)


def test_sqrt_n_growth_then_decay_and_masked_saturation():
    # d = 1, A = -1 (case -): gamma = 2 R^2
    A, V = torch.tensor([[-1.0]], dtype=F64), torch.tensor([[1.0]], dtype=F64)
    R = math.sqrt(5.0)  # gamma = 10, e^gamma ~ 2.2e4
    ns = np.array([3, 5, 9, 17, 33, 65])
    vals = [seq_norm(adversarial_sequence(A, R, int(n), V=V).X, A, V) for n in ns]
    assert slope(ns - 1, vals) == pytest.approx(0.5, abs=0.05)
    # small gap: e^gamma ~ 7.4, the unmasked constant decays past the peak, the masked one saturates
    R = 1.0
    ns = [8, 40, 120, 240]
    un, ma, formula = [], [], []
    for n in ns:
        con = adversarial_sequence(A, R, n, V=V)
        un.append(seq_norm(con.X, A, V))
        ma.append(seq_norm(con.X, A, V, masked=True))
        p = [math.exp(con.gamma) / (math.exp(con.gamma) + i - 1) for i in range(2, n + 1)]
        formula.append(math.sqrt(sum(q**2 * (1 + (1 - q) * con.gamma) ** 2 for q in p)))
        assert con.lower_bound <= un[-1] * (1 + 1e-12)
    assert un[1] > un[2] > un[3]
    assert all(f <= m * (1 + 1e-12) for f, m in zip(formula, ma))  # §9 lower bound
    assert ma[3] >= ma[2] * (1 - 1e-9) and ma[3] > un[3]
    # the formula increases to a finite limit (p_i ~ e^gamma / i): n = 240 is already near it
    g = con.gamma
    q = math.exp(g) / (math.exp(g) + np.arange(1, 10**6))
    limit = math.sqrt(float(np.sum(q**2 * (1 + (1 - q) * g) ** 2)))
    assert formula[2] < formula[3] < limit and formula[3] > 0.9 * limit


def test_sphere_construction_grows_like_sqrt_n(rng):
    A, V = random_head(rng, 3, scale=1.0)
    R = 2.5
    ns = np.array([3, 5, 9, 17, 33])
    full, tangent, lows = [], [], []
    for n in ns:
        con = adversarial_sequence(A, R, int(n), sphere=True, V=V)
        assert torch.allclose(con.X.norm(dim=-1), torch.full((int(n),), R, dtype=F64), rtol=1e-12)
        J = jacobian_oracle(con.X, A, V)
        # restrict every token's perturbation to the tangent space of its sphere
        P = np.zeros((J.shape[1], J.shape[1]))
        for i, x in enumerate(con.X.numpy()):
            a = x / np.linalg.norm(x)
            P[3 * i : 3 * i + 3, 3 * i : 3 * i + 3] = np.eye(3) - np.outer(a, a)
        full.append(np.linalg.norm(J, 2))
        tangent.append(np.linalg.norm(J @ P, 2))
        lows.append(con.lower_bound)
    assert con.gamma > 2 * math.log(ns[-1])  # n << e^gamma on this grid
    assert all(
        lo <= t * (1 + 1e-10) and t <= f * (1 + 1e-12) for lo, t, f in zip(lows, tangent, full)
    )
    assert slope(ns - 1, tangent) == pytest.approx(0.5, abs=0.1)
    # the sphere gap dominates case '-' (already on the sphere)
    minus = adversarial_sequence(A, R, 3, variant="symmetric", case="-")
    assert con.gamma >= minus.gamma * (1 - 1e-9)


# ----------------------------------------------------------------------------- §7.2, §7.3
def test_two_dirac_exact_constant_and_formula(rng):
    bounds = None
    try:
        import theory.bounds as bounds
    except ImportError:
        pass
    for trial in range(6):
        A, V = random_head(rng, 2, scale=1.0)
        R = [0.8, 1.5, 2.0, 2.5, 3.0, 3.5][trial]
        td = two_dirac(A, R, V=V)
        mu = td.measure
        assert mu.n == 2 and td.g is not None
        Vu = float(torch.linalg.vector_norm(V @ td.u))
        g_ref = sup_g(td.gamma, Vu)
        assert td.g == pytest.approx(g_ref, rel=1e-10)
        if bounds is not None:
            assert td.g == pytest.approx(float(bounds.two_dirac_lower(td.gamma, Vu)), rel=1e-10)
        LW = lw_norm(mu, A, V)
        assert LW >= g_ref * (1 - 1e-12)
        # on the axis, the heavy atom's row applied to the light atom moved along u is exactly g
        lw = mu.log_weights.numpy()
        J = jacobian_oracle(mu.points, A, V, lw)
        blk = math.exp(0.5 * (lw[0] - lw[1])) * J[0:2, 2:4] @ td.u.numpy()
        assert np.linalg.norm(blk) == pytest.approx(td.g, rel=1e-8)
        # the mass is optimal: g at neighbouring masses is smaller
        for f in (0.8, 1.25):
            other = two_dirac(A, R, V=V, log_eps=td.log_eps + math.log(f))
            assert other.g <= td.g * (1 + 1e-12)


def test_two_dirac_log_masses_survive_underflow():
    A = torch.tensor([[-1.0]], dtype=F64)
    R = math.sqrt(500.0)  # gamma = 2 R^2 = 1000
    td = two_dirac(A, R)
    assert td.gamma == pytest.approx(1000.0)
    lw = td.measure.log_weights
    assert torch.isfinite(lw).all()
    # eps* e^gamma -> 1/3: log eps* = log(w/v) - gamma (up to e^-gamma)
    v = (3 * 1000 - 2 + math.sqrt(9e6 + 4e3 + 4)) / 8000
    assert float(lw[1]) == pytest.approx(math.log((1 - v) / v) - 1000.0, rel=1e-14)
    assert float(td.measure.weights[1]) == 0.0  # below float64: only the log-mass survives
    # the attention of the heavy atom to the light one is w* (log-domain attention)
    Y = attention(td.measure, AttentionParams(A, torch.ones(1, 1, dtype=F64))).points
    w = float(
        (Y[0, 0] - td.measure.points[0, 0]) / (td.measure.points[1, 0] - td.measure.points[0, 0])
    )
    assert w == pytest.approx(1 - v, rel=1e-9)
    # a given tiny mass is kept exactly
    mu = two_dirac_measure(A, 2.0, eps=1e-300)
    assert float(mu.log_weights[1]) == pytest.approx(math.log(1e-300), rel=1e-14)
    assert float(mu.weights[1]) == pytest.approx(1e-300, rel=1e-12)


def test_off_axis_bound_beats_axis_and_is_a_lower_bound(rng):
    A = torch.tensor([[1.0, 0.7], [-0.2, -0.4]], dtype=F64)
    V = torch.tensor([[1.0, 0.3], [0.0, 0.8]], dtype=F64)
    res = off_axis_two_atoms(AttentionParams(A, V), 2.0, n_restarts=8, steps=200)
    assert res.value >= res.axis_value * (1 - 1e-12)
    assert float(res.x.norm()) <= 2.0 + 1e-12 and float(res.y.norm()) <= 2.0 + 1e-12
    # the formula, recomputed from the returned point
    h, x, y, w = res.h, res.x, res.y, res.w
    vec = V @ (h + (1 - w) * float(y @ A @ h) * (x - y))
    val = math.exp(res.s / 2) * math.sqrt(w * (1 - w)) * float(vec.norm())
    assert val == pytest.approx(res.value, rel=1e-9)
    assert lw_norm(res.measure, A, V) >= res.value * (1 - 1e-9)
    with pytest.raises(ValueError, match="single-head"):
        off_axis_two_atoms(MultiHeadParams((AttentionParams(A, V),) * 2), 1.0)


# ----------------------------------------------------------------------------- searches
def test_worst_case_measure_never_below_construction_and_exact(rng):
    A, V = random_head(rng, 2, scale=1.0)
    params = AttentionParams(A, V)
    res = worst_case_measure(params, 2.0, 3, n_restarts=4, steps=60)
    assert res.value >= res.construction_value * (1 - 1e-12)
    assert res.value >= res.two_dirac_bound * (1 - 1e-12)
    assert res.value == pytest.approx(lw_norm(res.measure, A, V), rel=1e-9)
    assert res.lower <= res.value * (1 + 1e-9) and res.value <= res.upper * (1 + 1e-9)
    assert torch.all(res.measure.points.norm(dim=-1) <= 2.0 * (1 + 1e-12))
    assert res.history.shape[0] == len(res.labels) == res.restart_values.numel()
    assert float(res.restart_values.max()) == pytest.approx(res.value, rel=1e-9)
    # steps=0: the constructions alone
    res0 = worst_case_measure(params, 2.0, 3, n_restarts=1, steps=0)
    assert res0.value >= res0.construction_value * (1 - 1e-12)


def test_worst_case_measure_paper_picture():
    # d = 1, A = 1: at R = 6 the maximiser is a few Diracs with masses over many decades
    params = AttentionParams(torch.tensor([[1.0]], dtype=F64), torch.tensor([[1.0]], dtype=F64))
    res = worst_case_measure(params, 6.0, 3, n_restarts=4, steps=80)
    log10 = res.measure.log_weights / math.log(10.0)
    assert float(log10.max() - log10.min()) > 10
    assert res.value > 1.3 * res.two_dirac_bound  # chains beat two atoms by a constant factor
    assert res.value == pytest.approx(lw_norm(res.measure, [[1.0]], [[1.0]]), rel=1e-9)


def test_worst_case_measure_masked_sphere_split(rng):
    A, V = random_head(rng, 2)
    params = AttentionParams(A, V)
    m = worst_case_measure(params, 1.5, 3, n_restarts=2, steps=30, masked=True)
    assert m.measure.is_causal
    assert m.value == pytest.approx(lw_norm(m.measure, A, V, masked=True), rel=1e-9)
    s = worst_case_measure(params, 1.5, 3, n_restarts=2, steps=30, sphere=True)
    assert torch.allclose(s.measure.points.norm(dim=-1), torch.full((3,), 1.5, dtype=F64))
    sp = worst_case_measure(params, 1.5, 3, n_restarts=2, steps=30, geometry="split")
    assert sp.value >= lw_norm(sp.measure, A, V) * (1 - 1e-12)
    assert sp.value == pytest.approx(
        float(split_constant(sp.measure, params, method="jacrev")), rel=1e-9
    )
    with pytest.raises(ValueError):
        worst_case_measure(params, 1.5, 0)


def test_worst_case_sequence(rng):
    A, V = random_head(rng, 2, scale=1.5)
    params = AttentionParams(A, V)
    res = worst_case_sequence(params, 1.5, 5, n_restarts=3, steps=40)
    assert res.value >= res.construction_value * (1 - 1e-12)
    assert res.construction_value >= res.construction_bound * (1 - 1e-12)
    assert res.value == pytest.approx(seq_norm(res.X, A, V), rel=1e-9)
    assert torch.all(res.X.norm(dim=-1) <= 1.5 * (1 + 1e-12))
    assert res.lower <= res.value * (1 + 1e-9) <= res.upper * (1 + 2e-9)


# ----------------------------------------------------------------------------- §12 splitting
def test_split_gain_closed_form_properties():
    assert float(split_gain(1, 3.0)) == 1.0
    k = np.arange(1, 101)
    G = split_gain(k, 30.0)
    np.testing.assert_allclose(G, np.sqrt(k), rtol=1e-8)
    s = 10.0
    E = math.exp(s)
    assert float(split_gain(1 + E, s)) == pytest.approx(math.exp(s / 2) / 2, rel=1e-3)
    # torch and numpy agree; dtype follows a tensor input; large s is finite
    t = split_gain(torch.tensor([1.0, 7.0, 1e6], dtype=F64), torch.tensor(4.0, dtype=F64))
    assert t.dtype == F64
    np.testing.assert_allclose(t.numpy(), split_gain(np.array([1.0, 7.0, 1e6]), 4.0), rtol=1e-14)
    big = split_gain(np.array([2.0, 1e300]), 800.0)
    assert np.all(np.isfinite(big)) and big[0] == pytest.approx(math.sqrt(2), rel=1e-12)
    with pytest.raises(ValueError):
        split_gain(0.5, 1.0)
    bounds = pytest.importorskip("theory.bounds")
    kk = np.array([1, 2, 3, 10, 55, 1000])
    for s in (0.3, 2.0, 4.0, 9.0):
        np.testing.assert_allclose(split_gain(kk, s), bounds.split_gain(kk, s), rtol=1e-12)


@pytest.mark.parametrize("k,R", [(1, 2.0), (2, 2.0), (5, 3.0), (20, 3.0), (60, 4.0), (400, 4.0)])
def test_split_gain_equals_exact_w2_ratio_of_the_attack(k, R):
    A = torch.tensor([[0.9, 0.5], [-0.3, 0.4]], dtype=F64)
    V = torch.tensor([[1.0, 0.2], [0.3, 0.7]], dtype=F64)
    u = torch.tensor([0.6, 0.8], dtype=F64)
    lam = float(u @ A @ u)
    y, z = 0.5 * R * u, R * u
    mu = DiracMeasure(y.unsqueeze(0))
    nu = DiracMeasure(torch.stack([y, z]), torch.tensor([1 - 1 / k, 1 / k], dtype=F64))
    params = AttentionParams(A, V)
    ratio = float(wasserstein(attention(nu, params), attention(mu, params))) / float(
        wasserstein(nu, mu)
    )
    d = z - y
    expect = float((V @ d).norm() / d.norm()) * float(split_gain(k, lam * R * R / 4))
    assert ratio == pytest.approx(expect, rel=1e-10)


def test_optimal_split_k_brute_force():
    for s in (0.1, 0.3, 0.4, 1.0, 2.0, 3.3, 5.0, 7.0):
        ks = np.arange(1, int(3 * math.exp(s)) + 10)
        assert optimal_split_k(s) == int(ks[np.argmax(split_gain(ks, s))])
    assert optimal_split_k(0.5 * math.log(2) - 1e-9) == 1
    assert isinstance(optimal_split_k(40.0), float) and optimal_split_k(800.0) == math.inf


def test_split_constant(rng):
    A, V = random_head(rng, 2)
    params = AttentionParams(A, V)
    mu = DiracMeasure(torch.tensor([[0.4, -0.7]], dtype=F64))
    assert float(split_constant(mu, params, method="jacrev")) == pytest.approx(
        float(torch.linalg.matrix_norm(V, ord=2)), rel=1e-12
    )
    X = torch.tensor(rng.standard_normal((3, 2)))
    mu3 = DiracMeasure(X, torch.tensor([0.6, 0.3, 0.1], dtype=F64))
    ls = float(split_constant(mu3, params, method="jacrev"))
    # max(L_W, max_i ||V C_i A^T||) from the oracle
    lw = mu3.log_weights.numpy()
    L = X.numpy() @ A.numpy() @ X.numpy().T + lw
    P = np.exp(L - L.max(1, keepdims=True))
    P /= P.sum(1, keepdims=True)
    selfs = []
    for i in range(3):
        m = P[i] @ X.numpy()
        C = sum(P[i, j] * np.outer(X[j].numpy() - m, X[j].numpy() - m) for j in range(3))
        selfs.append(np.linalg.norm(V.numpy() @ C @ A.numpy().T, 2))
    assert ls == pytest.approx(max(lw_norm(mu3, A, V), max(selfs)), rel=1e-10)
    try:
        import meanfield.lipschitz  # noqa: F401
    except ImportError:
        return
    assert float(split_constant(mu3, params, method="engine")) == pytest.approx(ls, rel=1e-9)


def _recompute(pert, mu, params):
    Fmu, Fnu = attention(mu, params), attention(pert.nu, params)
    w2 = float(wasserstein(Fnu, Fmu)) / float(wasserstein(pert.nu, mu))
    wi = float(wasserstein_inf(Fnu, Fmu)) / float(wasserstein_inf(pert.nu, mu))
    return w2, wi


def test_mass_splitting_attack_at_a_dirac():
    A = torch.tensor([[1.0, 0.2], [-0.1, -0.3]], dtype=F64)
    V = torch.tensor([[1.0, 0.3], [0.1, 0.9]], dtype=F64)
    params = AttentionParams(A, V)
    R = 4.0
    u = torch.tensor([1.0, 0.0], dtype=F64)
    mu = DiracMeasure((0.5 * R * u).unsqueeze(0))
    res = mass_splitting_attack(
        mu, params, 0.3, R=R, k_max=3, n_restarts=2, steps=40, insert_steps=20
    )
    V_norm = float(torch.linalg.matrix_norm(V, ord=2))
    perts = [res.move, res.split, res.insert, *res.split_by_k]
    for q in perts:
        w2, wi = _recompute(q, mu, params)
        assert q.ratio_w2 == pytest.approx(w2, rel=1e-10)
        assert q.ratio_winf == pytest.approx(wi, rel=1e-10)
        assert q.input_w2 <= q.cost_bound * (1 + 1e-9)
        assert q.ratio_winf <= V_norm * (1 + 1e-9)  # §12.3 at a Dirac
        assert torch.all(q.nu.points.norm(dim=-1) <= R * (1 + 1e-12))
    # moving the whole Dirac: exactly ||V delta|| / ||delta|| <= ||V||
    delta = res.move.nu.points[0] - mu.points[0]
    assert res.move.ratio_w2 == pytest.approx(float((V @ delta).norm() / delta.norm()), rel=1e-9)
    assert res.split.ratio_w2 > 1.5 * res.move.ratio_w2 and res.gain > 1.5
    assert res.gain_winf < 1.5
    assert res.split.input_w2 == pytest.approx(0.3, rel=1e-3)
    # inserting a token into a Dirac: the §3.2 plan is exact (one source atom)
    assert res.insert.input_w2 == pytest.approx(res.insert.cost_bound, rel=1e-10)
    assert math.isnan(res.duplicate[0].ratio_w2)  # duplicating the only atom changes nothing


def test_winf_ratio_at_a_dirac_is_at_most_V_norm(rng):
    # THEORY.md §12.3: for mu = delta_y and any nu, W_inf(F nu, F mu) <= ||V|| W_inf(nu, mu)
    for _ in range(20):
        A, V = random_head(rng, 2, scale=3.0)
        params = AttentionParams(A, V)
        y = torch.tensor(rng.standard_normal(2))
        mu = DiracMeasure(y.unsqueeze(0))
        Z = torch.tensor(rng.standard_normal((3, 2))) * 2
        nu = DiracMeasure(Z, torch.softmax(torch.tensor(rng.standard_normal(3) * 5), 0))
        ratio = float(wasserstein_inf(attention(nu, params), attention(mu, params))) / float(
            wasserstein_inf(nu, mu)
        )
        assert ratio <= float(torch.linalg.matrix_norm(V, ord=2)) * (1 + 1e-12)


def test_mass_splitting_attack_few_atoms_and_token_costs(rng):
    A, V = random_head(rng, 2)
    params = AttentionParams(A, V)
    X = torch.tensor([[1.0, 0.0], [-0.5, 0.5]], dtype=F64)
    mu = DiracMeasure(X)  # two uniform tokens
    res = mass_splitting_attack(
        mu, params, 0.2, R=1.5, k_max=2, atoms=[0], n_restarts=1, steps=20, insert_steps=10
    )
    for q in (res.move, res.split, res.insert, *res.duplicate):
        w2, wi = _recompute(q, mu, params)
        assert q.ratio_w2 == pytest.approx(w2, rel=1e-10)
        assert q.ratio_winf == pytest.approx(wi, rel=1e-10)
        assert q.input_w2 <= q.cost_bound * (1 + 1e-10)
    # duplicating token i of n = 2 tokens: W2^2 = sum_j ||x_j - x_i||^2 / (n (n + 1)) exactly
    for i, q in enumerate(res.duplicate):
        bound = math.sqrt(float((X - X[i]).square().sum()) / 6)
        assert q.cost_bound == pytest.approx(bound, rel=1e-12)
        assert q.input_w2 == pytest.approx(bound, rel=1e-10)
        assert q.nu.n == 3 and float(q.nu.weights[-1]) == pytest.approx(1 / 3)


def test_token_plan_is_only_an_upper_bound():
    # THEORY.md §3.2 plan vs exact W2 (docs/derivations/mass_splitting.md counterexamples)
    X = torch.tensor([[0.0], [1.0], [2.0]], dtype=F64)
    mu = DiracMeasure(X)
    dup = DiracMeasure(torch.cat([X, X[:1]]), torch.tensor([0.25, 0.25, 0.25, 0.25], dtype=F64))
    assert float(wasserstein(mu, dup)) ** 2 == pytest.approx(0.25, rel=1e-10)  # plan: 5/12
    mu2 = DiracMeasure(X[:2])
    ins = DiracMeasure(X, torch.full((3,), 1 / 3, dtype=F64))
    assert float(wasserstein(mu2, ins)) ** 2 == pytest.approx(0.5, rel=1e-10)  # plan: 5/6


def test_attack_input_validation(rng):
    A, V = random_head(rng, 2)
    params = AttentionParams(A, V)
    mu = DiracMeasure(torch.zeros(1, 2, dtype=F64))
    with pytest.raises(ValueError, match="pass the radius"):
        mass_splitting_attack(mu, params, 0.1)
    with pytest.raises(ValueError, match="budget"):
        mass_splitting_attack(DiracMeasure(torch.ones(1, 2, dtype=F64)), params, -1.0)
    with pytest.raises(ValueError, match="unmasked"):
        mass_splitting_attack(
            DiracMeasure.from_sequence(torch.ones(2, 2, dtype=F64), causal=True), params, 0.1, R=2.0
        )


# ----------------------------------------------------------------------------- layering
def test_meanfield_attacks_does_not_import_theory():
    import subprocess
    import sys

    code = "import sys, meanfield.attacks; assert 'theory' not in sys.modules, 'theory imported'"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


# ----------------------------------------------------------------------------- CLI
def _main(argv):
    """The `meanfield` command (experiments.app.main)."""
    from experiments.app.main import main

    return main(argv)


def test_cli_construct_json_and_files(tmp_path, capsys):
    out = tmp_path / "c"
    assert (
        _main(
            [
                "attack",
                "construct",
                "--random-d",
                "3",
                "--seed",
                "2",
                "--R",
                "2",
                "--n",
                "6",
                "--variant",
                "symmetric",
                "--json",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "attack construct" and doc["n"] == 6
    assert doc["lower_bound"] <= doc["exact"]["value"] * (1 + 1e-12)
    from experiments.results import load_json, load_npz

    data = load_npz(out / "construct.npz")
    assert data["X"].shape == (6, 3)
    assert seq_norm(data["X"], data["A"], data["V"]) == pytest.approx(
        doc["exact"]["value"], rel=1e-9
    )
    assert load_json(out / "construct.json")["gamma"] == doc["gamma"]


def test_cli_construct_from_files_and_errors(tmp_path, capsys):
    A = np.array([[0.5, 1.0], [-0.3, -1.2]])
    np.save(tmp_path / "A.npy", A)
    np.savez(tmp_path / "AV.npz", A=A, V=2 * np.eye(2))
    assert (
        _main(
            [
                "attack",
                "construct",
                "--A-file",
                str(tmp_path / "A.npy"),
                "--R",
                "1.5",
                "--n",
                "4",
                "--json",
            ]
        )
        == 0
    )
    d1 = json.loads(capsys.readouterr().out)
    assert (
        _main(
            [
                "attack",
                "construct",
                "--A-file",
                str(tmp_path / "AV.npz"),
                "--R",
                "1.5",
                "--n",
                "4",
                "--json",
            ]
        )
        == 0
    )
    d2 = json.loads(capsys.readouterr().out)
    assert d2["lower_bound"] == pytest.approx(2 * d1["lower_bound"], rel=1e-12)  # V = 2I
    np.save(tmp_path / "obj.npy", np.array([{"A": 1}], dtype=object), allow_pickle=True)
    np.save(tmp_path / "rect.npy", np.ones((2, 3)))
    np.savez(tmp_path / "noA.npz", B=A)
    (tmp_path / "A.txt").write_text("1")
    for f, msg in (
        ("obj.npy", "pickle"),
        ("rect.npy", "square"),
        ("noA.npz", "no array 'A'"),
        ("A.txt", ".npy or .npz"),
        ("missing.npy", "no such file"),
    ):
        assert (
            _main(["attack", "construct", "--A-file", str(tmp_path / f), "--R", "1", "--n", "3"])
            == 2
        )
        err = capsys.readouterr().err.strip()
        assert err.startswith("meanfield: error:") and msg in err and "\n" not in err
    assert _main(["attack", "construct", "--random-d", "2", "--R", "-1", "--n", "3"]) == 2
    assert "R" in capsys.readouterr().err


def test_cli_search_and_split(tmp_path, capsys):
    assert (
        _main(
            [
                "attack",
                "search",
                "--random-d",
                "2",
                "--R",
                "1.5",
                "--atoms",
                "2",
                "--restarts",
                "1",
                "--steps",
                "10",
                "--json",
                "--out",
                str(tmp_path / "s"),
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["value"] >= doc["construction_value"] * (1 - 1e-12)
    assert (tmp_path / "s" / "search.npz").exists() and (tmp_path / "s" / "search.json").exists()
    assert (
        _main(
            [
                "attack",
                "search",
                "--random-d",
                "2",
                "--R",
                "1.5",
                "--sequence",
                "4",
                "--restarts",
                "1",
                "--steps",
                "5",
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["target"] == "sequence"
    assert _main(["attack", "split", "--s", "3", "--k-max", "30", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["k_opt"] == optimal_split_k(3.0) and doc["G_k"]["1"] == 1.0
    assert (
        _main(
            [
                "attack",
                "split",
                "--budget",
                "0.3",
                "--k-max",
                "2",
                "--restarts",
                "1",
                "--steps",
                "10",
                "--json",
            ]
        )
        == 0
    )
    a = json.loads(capsys.readouterr().out)["attack"]
    assert a["split"]["ratio_w2"] >= a["move"]["ratio_w2"]
    assert _main(["attack", "split"]) == 2
    assert "give --s" in capsys.readouterr().err


# ----------------------------------------------------------------------------- figures
def _tiny_results(tmp_path):
    from experiments.results import save_npz, write_json

    radii = np.array([1.0, 3.0])
    save_npz(
        tmp_path / "worst_measures.npz",
        radii=radii,
        d1_points=np.array([[[-1.0], [0.9], [1.0]], [[-3.0], [1.5], [3.0]]]),
        d1_log_weights=np.log(np.array([[0.9, 0.09, 0.01], [1 - 2e-9, 1e-9, 1e-9]])),
        d1_value=np.array([2.0, 30.0]),
        d1_two_dirac=np.array([0.6, 12.0]),
        d2_points=np.array(
            [[[-1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], [[0.0, 3.0], [2.0, -2.0], [0.0, -3.0]]]
        ),
        d2_log_weights=np.log(np.array([[0.5, 0.4, 0.1], [1 - 2e-6, 1e-6, 1e-6]])),
        d2_value=np.array([2.0, 300.0]),
    )
    write_json(
        tmp_path / "worst_measures.json",
        {"settings": {"d1": {"label": "d = 1"}, "d2": {"label": "d = 2"}}},
    )
    k = np.unique(np.round(np.logspace(0, 3, 30)))
    s = np.array([1.0, 4.0])
    save_npz(
        tmp_path / "mass_splitting.npz",
        k=k,
        radii=np.array([2.0, 4.0]),
        s=s,
        G=np.stack([split_gain(k, si) for si in s]),
        k_opt=np.array([2.0, 56.0]),
        budgets=np.array([0.1, 0.5]),
        dirac_move_w2=np.array([1.0, 1.0]),
        dirac_split_w2=np.array([2.5, 3.0]),
        dirac_move_winf=np.array([1.0, 1.0]),
        dirac_split_winf=np.array([0.9, 1.0]),
        V_norm=np.float64(1.0),
    )


def test_figures_render_from_tiny_results(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from paper_figs import fig_b_worst_measures, fig_c_mass_splitting

    _tiny_results(tmp_path)
    out = tmp_path / "out"
    for mod, arg in (
        (fig_b_worst_measures, tmp_path),
        (fig_c_mass_splitting, tmp_path / "mass_splitting.npz"),
    ):
        files = mod.draw(arg, out)
        assert {f.suffix for f in files} == {".pdf", ".png"}
        assert all(f.stat().st_size > 0 for f in files)


def test_figure_b_from_cli_results(tmp_path, capsys):
    assert (
        _main(
            [
                "attack",
                "search",
                "--figure-b",
                "--radii",
                "1,2",
                "--atoms",
                "2",
                "--restarts",
                "1",
                "--steps",
                "5",
                "--out",
                str(tmp_path),
                "--json",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["settings"]) == {"d1", "d2"}
    from paper_figs import fig_b_worst_measures

    assert all(p.exists() for p in fig_b_worst_measures.draw(tmp_path / "worst_measures.npz"))


@pytest.mark.slow
def test_figure_c_from_results_function(tmp_path):
    from experiments.mass_splitting import figure_c_results
    from paper_figs import fig_c_mass_splitting

    files = figure_c_results(
        tmp_path,
        radii=(2.0, 4.0),
        budgets=(0.1, 0.5),
        k_max=2,
        n_restarts=1,
        steps=10,
        k_curve_max=1000,
    )
    assert all(f.exists() for f in files)
    assert all(p.exists() for p in fig_c_mass_splitting.draw(tmp_path))


# ----------------------------------------------------------------------------- slow
@pytest.mark.slow
def test_search_improves_on_two_diracs_across_radii():
    params = AttentionParams(torch.tensor([[1.0]], dtype=F64), torch.tensor([[1.0]], dtype=F64))
    for R in (1.0, 2.0, 4.0, 6.0, 8.0):
        res = worst_case_measure(params, R, 3, n_restarts=16, steps=300)
        assert res.value >= res.two_dirac_bound * (1 - 1e-12)
        assert res.value == pytest.approx(lw_norm(res.measure, [[1.0]], [[1.0]]), rel=1e-9)


def test_sqrt_n_slope_random_heads(rng):
    tested = 0
    for _ in range(3):
        A, V = random_head(rng, 3, scale=2.0)
        con0 = adversarial_sequence(A, 2.0, 2, variant="symmetric", V=V)
        ns = np.array([3, 5, 9, 17, 33, 65])
        ns = ns[ns - 1 < math.exp(con0.gamma) / 20]
        if len(ns) < 4:
            continue
        vals = [
            seq_norm(adversarial_sequence(A, 2.0, int(n), variant="symmetric", V=V).X, A, V)
            for n in ns
        ]
        assert slope(ns - 1, vals) == pytest.approx(0.5, abs=0.08)
        tested += 1
    assert tested >= 2
