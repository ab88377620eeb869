"""Closed-form constructions against exact Jacobians: eigenvector sequence, two Diracs, off-axis.

Oracles are independent of meanfield.attacks (tests/oracles_attacks.py): closed-form Jacobian
blocks in numpy, formulas recomputed inline; theory.bounds is a second reference where present.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from meanfield import AttentionParams, MultiHeadParams, attention
from meanfield.attacks import (
    adversarial_sequence,
    off_axis_two_atoms,
    two_dirac,
    two_dirac_measure,
)

from ..oracles_attacks import F64, jacobian_oracle, lw_norm, random_head, seq_norm, slope, sup_g
from ..tolerances import (
    BALL_PROJECTION,
    BRACKET_MARGIN,
    BRACKET_MARGIN_LOOSE,
    EXACT_ZERO_FLOOR,
    F64_CLOSED_FORM,
    F64_LANCZOS,
    F64_LARGE_RADIUS_REL,
    F64_NONSYM_EIG,
    F64_NONSYM_EIG_VECTOR,
    F64_REDUCTION,
    F64_REWRITTEN,
    F64_SOLVER,
    F64_TINY_MASS,
    F64_ZERO,
    SEARCH_START,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


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
            J.reshape(8, 12).numpy(), jacobian_oracle(X, A, V, lw, masked), atol=F64_REDUCTION
        )


# ---------------------------------------------- eigenvector construction (docs/theory.md §3)
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
        assert con.lower_bound <= exact * (1 + BRACKET_MARGIN)
        # the formula, recomputed from the returned gap and direction
        p = math.exp(con.gamma) / (math.exp(con.gamma) + n - 1)
        Vu = float(torch.linalg.vector_norm(V @ con.u))
        expect = math.sqrt(n - 1) * p * (1 + (1 - p) * con.gamma) * Vu
        assert math.isclose(
            con.lower_bound, expect, rel_tol=F64_CLOSED_FORM, abs_tol=EXACT_ZERO_FLOOR
        )
        assert math.isclose(con.p, p, rel_tol=F64_CLOSED_FORM)
        # every copy sees token 1 with exactly the gap gamma
        x1, y = con.X[0].double(), con.X[1].double()
        assert math.isclose(
            float(y @ A @ (x1 - y)), con.gamma, rel_tol=F64_NONSYM_EIG, abs_tol=F64_ZERO
        )
        assert float(con.X.norm(dim=-1).max()) == pytest.approx(R, rel=F64_REDUCTION)


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
            assert auto.gamma == pytest.approx(max(gaps.values()), rel=F64_REDUCTION)
            assert auto.case == max(gaps, key=gaps.get)


def test_minus8_rule_threshold():
    # eigenvalues 8 and -1 (non-symmetric): 8 > -8 * (-1) is false, so case '-' (gaps 2R^2 each)
    Q = torch.tensor([[1.0, 0.4], [0.2, 1.0]], dtype=F64)
    for lam_max, expect in ((8.0 - 1e-6, "-"), (8.0 + 1e-6, "+")):
        A = Q @ torch.diag(torch.tensor([lam_max, -1.0], dtype=F64)) @ torch.linalg.inv(Q)
        con = adversarial_sequence(A, 1.0, 3, variant="released")
        assert con.case == expect
        assert con.lam == pytest.approx(
            lam_max if expect == "+" else -1.0, rel=F64_NONSYM_EIG_VECTOR
        )


def test_symmetric_gap_at_least_released(rng):
    for _ in range(30):
        A, _ = random_head(rng, 4, scale=1.0)
        try:
            rel = adversarial_sequence(A, 2.0, 5, variant="released")
        except ValueError:
            continue
        sym = adversarial_sequence(A, 2.0, 5, variant="symmetric")
        assert sym.gamma >= rel.gamma * (1 - F64_CLOSED_FORM)


def test_released_variant_uses_real_eigenvectors():
    # a rotation block (complex pair) plus one real eigenvalue -2
    A = torch.tensor([[0.0, -3.0, 0.0], [3.0, 0.0, 0.0], [0.5, 0.2, -2.0]], dtype=F64)
    con = adversarial_sequence(A, 1.0, 3, variant="released", eigvecs="score")
    assert con.case == "-" and con.lam == pytest.approx(-2.0)
    assert torch.allclose(A @ con.u, -2.0 * con.u, atol=F64_ZERO)
    code = adversarial_sequence(A, 1.0, 3, variant="released", eigvecs="code")
    assert torch.allclose(A.mT @ code.u, -2.0 * code.u, atol=F64_ZERO)  # A_code = A^T (released)
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
        assert con.lower_bound <= un[-1] * (1 + BRACKET_MARGIN)
    assert un[1] > un[2] > un[3]
    assert all(
        f <= m * (1 + BRACKET_MARGIN) for f, m in zip(formula, ma)
    )  # masked lower bound, docs/theory.md §4
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
        assert torch.allclose(
            con.X.norm(dim=-1), torch.full((int(n),), R, dtype=F64), rtol=F64_REDUCTION
        )
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
        lo <= t * (1 + BRACKET_MARGIN_LOOSE) and t <= f * (1 + BRACKET_MARGIN)
        for lo, t, f in zip(lows, tangent, full)
    )
    assert slope(ns - 1, tangent) == pytest.approx(0.5, abs=0.1)
    # the sphere gap dominates case '-' (already on the sphere)
    minus = adversarial_sequence(A, R, 3, variant="symmetric", case="-")
    assert con.gamma >= minus.gamma * (1 - F64_NONSYM_EIG_VECTOR)


# ---------------------------------------------- two Diracs, off-axis (docs/theory.md §5, §A3)
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
        assert td.g == pytest.approx(g_ref, rel=F64_SOLVER)
        if bounds is not None:
            assert td.g == pytest.approx(
                float(bounds.two_dirac_lower(td.gamma, Vu)), rel=F64_SOLVER
            )
        LW = lw_norm(mu, A, V)
        assert LW >= g_ref * (1 - BRACKET_MARGIN)
        # on the axis, the heavy atom's row applied to the light atom moved along u is exactly g
        lw = mu.log_weights.numpy()
        J = jacobian_oracle(mu.points, A, V, lw)
        blk = math.exp(0.5 * (lw[0] - lw[1])) * J[0:2, 2:4] @ td.u.numpy()
        assert np.linalg.norm(blk) == pytest.approx(td.g, rel=F64_TINY_MASS)
        # the mass is optimal: g at neighbouring masses is smaller
        for f in (0.8, 1.25):
            other = two_dirac(A, R, V=V, log_eps=td.log_eps + math.log(f))
            assert other.g <= td.g * (1 + F64_CLOSED_FORM)


def test_two_dirac_log_masses_survive_underflow():
    A = torch.tensor([[-1.0]], dtype=F64)
    R = math.sqrt(500.0)  # gamma = 2 R^2 = 1000
    td = two_dirac(A, R)
    assert td.gamma == pytest.approx(1000.0)
    lw = td.measure.log_weights
    assert torch.isfinite(lw).all()
    # eps* e^gamma -> 1/3: log eps* = log(w/v) - gamma (up to e^-gamma)
    v = (3 * 1000 - 2 + math.sqrt(9e6 + 4e3 + 4)) / 8000
    assert float(lw[1]) == pytest.approx(math.log((1 - v) / v) - 1000.0, rel=F64_REWRITTEN)
    assert float(td.measure.weights[1]) == 0.0  # below float64: only the log-mass survives
    # the attention of the heavy atom to the light one is w* (log-domain attention)
    Y = attention(td.measure, AttentionParams(A, torch.ones(1, 1, dtype=F64))).points
    w = float(
        (Y[0, 0] - td.measure.points[0, 0]) / (td.measure.points[1, 0] - td.measure.points[0, 0])
    )
    assert w == pytest.approx(1 - v, rel=F64_LARGE_RADIUS_REL)
    # a given tiny mass is kept exactly
    mu = two_dirac_measure(A, 2.0, eps=1e-300)
    assert float(mu.log_weights[1]) == pytest.approx(math.log(1e-300), rel=F64_REWRITTEN)
    assert float(mu.weights[1]) == pytest.approx(1e-300, rel=F64_CLOSED_FORM)


def test_off_axis_bound_beats_axis_and_is_a_lower_bound(rng):
    A = torch.tensor([[1.0, 0.7], [-0.2, -0.4]], dtype=F64)
    V = torch.tensor([[1.0, 0.3], [0.0, 0.8]], dtype=F64)
    res = off_axis_two_atoms(AttentionParams(A, V), 2.0, n_restarts=8, steps=200)
    assert res.value >= res.axis_value * (1 - SEARCH_START)
    assert (
        float(res.x.norm()) <= 2.0 + BALL_PROJECTION
        and float(res.y.norm()) <= 2.0 + BALL_PROJECTION
    )
    # the formula, recomputed from the returned point
    h, x, y, w = res.h, res.x, res.y, res.w
    vec = V @ (h + (1 - w) * float(y @ A @ h) * (x - y))
    val = math.exp(res.gamma / 2) * math.sqrt(w * (1 - w)) * float(vec.norm())
    assert val == pytest.approx(res.value, rel=F64_LANCZOS)
    assert lw_norm(res.measure, A, V) >= res.value * (1 - F64_LANCZOS)
    with pytest.raises(ValueError, match="single-head"):
        off_axis_two_atoms(MultiHeadParams((AttentionParams(A, V),) * 2), 1.0)


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


def test_off_axis_options_are_keywords_with_its_defaults(rng):
    A, V = random_head(rng, 2, scale=2.0)
    params = AttentionParams(A, V)
    a = off_axis_two_atoms(params, 1.5, n_restarts=3, steps=15)
    b = off_axis_two_atoms(params, 1.5, n_restarts=3, steps=15, lr=0.05, seed=0)
    assert a.value == b.value and torch.equal(a.history, b.history)
    with pytest.raises(TypeError, match="options"):
        off_axis_two_atoms(params, 1.5, options={"steps": 3})
