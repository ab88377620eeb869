"""Tests of meanfield.distances against independent oracles (LP, permutations, quantiles)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from meanfield.distances import (
    SinkhornResult,
    TransportError,
    TransportResult,
    conditional_wasserstein,
    optimal_transport,
    sinkhorn_wasserstein,
    wasserstein,
    wasserstein_inf,
)
from meanfield.measures import DiracMeasure

from ..tolerances import (
    F32_FORWARD,
    F32_VALUE,
    F64_LONG_CHAIN,
    F64_REDUCTION,
    F64_REWRITTEN,
    F64_REWRITTEN_EXP,
    F64_SOLVER,
    F64_TINY_DIFFERENCE,
    F64_ZERO,
    FD_REL,
    LP_HIGHS,
    SINKHORN_BIAS,
    SINKHORN_MARGINAL,
    SINKHORN_SLACK,
)

F64 = torch.float64

# ------------------------------------------------------------------------------- oracles


def cost_matrix(x: np.ndarray, y: np.ndarray, p: float) -> np.ndarray:
    return np.linalg.norm(x[:, None, :] - y[None, :, :], axis=-1) ** p


def lp_cost(x, a, y, b, p, *, allowed=None) -> float:
    """min <pi, M> over the transport polytope, by HiGHS (allowed: optional boolean support)."""
    M = cost_matrix(x, y, p)
    n, m = M.shape
    A_rows = np.kron(np.eye(n), np.ones((1, m)))
    A_cols = np.kron(np.ones((1, n)), np.eye(m))
    bounds = [(0, None)] * (n * m)
    if allowed is not None:
        bounds = [(0, None) if ok else (0, 0) for ok in allowed.ravel()]
    res = linprog(
        M.ravel(),
        A_eq=np.vstack([A_rows, A_cols]),
        b_eq=np.concatenate([a, b]),
        bounds=bounds,
        method="highs",
        options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10},
    )
    assert res.status == 0, res.message
    return float(res.fun)


def perm_w2_squared(X: np.ndarray, Y: np.ndarray) -> float:
    n = len(X)
    return min(float(np.square(X - Y[list(s)]).sum()) / n for s in itertools.permutations(range(n)))


def perm_winf(X: np.ndarray, Y: np.ndarray) -> float:
    n = len(X)
    return min(
        float(np.linalg.norm(X - Y[list(s)], axis=-1).max())
        for s in itertools.permutations(range(n))
    )


def lp_winf(x, a, y, b) -> float:
    """Linear scan over sorted distances with an LP feasibility test (HiGHS), positive masses."""
    x, y, a, b = x[a > 0], y[b > 0], a[a > 0], b[b > 0]
    D = cost_matrix(x, y, 1)
    n, m = D.shape
    for t in np.unique(D):
        allowed = D <= t
        A_rows = np.kron(np.eye(n), np.ones((1, m)))
        A_cols = np.kron(np.ones((1, n)), np.eye(m))
        res = linprog(
            (~allowed).ravel().astype(float),
            A_eq=np.vstack([A_rows, A_cols]),
            b_eq=np.concatenate([a, b]),
            bounds=(0, None),
            method="highs",
        )
        if res.status == 0 and res.fun <= 1e-9:
            return float(t)
    raise AssertionError("unreachable: the largest distance is always feasible")


def quantile_wp(x: np.ndarray, a: np.ndarray, y: np.ndarray, b: np.ndarray, p: float) -> float:
    """1-D closed form: W_p^p = int_0^1 |F^{-1}(u) - G^{-1}(u)|^p du (piecewise constant)."""
    ix, iy = np.argsort(x), np.argsort(y)
    x, a, y, b = x[ix], a[ix], y[iy], b[iy]
    Fa, Fb = np.cumsum(a), np.cumsum(b)
    breaks = np.unique(np.clip(np.concatenate([[0.0], Fa, Fb, [1.0]]), 0, 1))
    total = 0.0
    for lo, hi in zip(breaks[:-1], breaks[1:], strict=True):
        u = 0.5 * (lo + hi)
        qx = x[min(np.searchsorted(Fa, u), len(x) - 1)]
        qy = y[min(np.searchsorted(Fb, u), len(y) - 1)]
        total += (hi - lo) * abs(qx - qy) ** p
    return total


def random_measure(rng: np.random.Generator, n: int, d: int, *, uniform: bool = False):
    x = rng.normal(size=(n, d))
    a = np.full(n, 1.0 / n) if uniform else rng.dirichlet(np.ones(n))
    return x, a


def to_measure(x: np.ndarray, a: np.ndarray, positions=None) -> DiracMeasure:
    pos = None if positions is None else torch.as_tensor(positions, dtype=F64)
    return DiracMeasure(
        torch.as_tensor(x, dtype=F64), torch.as_tensor(a, dtype=F64), pos, normalize=True
    )


def entropy(a: np.ndarray) -> float:
    a = a[a > 0]
    return float(-(a * np.log(a)).sum())


# ------------------------------------------------------------------------------- exact W_p


@pytest.mark.parametrize("p", [1, 2, 3])
def test_wp_against_lp_weighted(p):
    rng = np.random.default_rng(10 + p)
    for _ in range(15):
        n, m, d = rng.integers(1, 7), rng.integers(1, 7), rng.integers(1, 4)
        x, a = random_measure(rng, n, d)
        y, b = random_measure(rng, m, d)
        got = float(wasserstein(to_measure(x, a), to_measure(y, b), p=p)) ** p
        assert got == pytest.approx(lp_cost(x, a, y, b, p), abs=LP_HIGHS)


def test_w2_against_permutations_uniform():
    rng = np.random.default_rng(1)
    for n in range(1, 7):
        X, Y = rng.normal(size=(n, 3)), rng.normal(size=(n, 3))
        res = optimal_transport(DiracMeasure(torch.as_tensor(X)), DiracMeasure(torch.as_tensor(Y)))
        assert res.method == ("trivial" if n == 1 else "assignment")
        assert float(res.distance) ** 2 == pytest.approx(perm_w2_squared(X, Y), abs=F64_REDUCTION)


def test_assignment_path_equals_network_simplex_path():
    ot = pytest.importorskip("ot")
    rng = np.random.default_rng(2)
    for n in (2, 5, 9):
        X, Y = rng.normal(size=(n, 4)), rng.normal(size=(n, 4))
        mu, nu = DiracMeasure(torch.as_tensor(X)), DiracMeasure(torch.as_tensor(Y))
        fast = optimal_transport(mu, nu)
        # the same measure, split so that it is no longer uniform: forces ot.emd
        slow = optimal_transport(mu.split(0, 3), nu)
        assert fast.method == "assignment" and slow.method == "network_simplex"
        assert float(fast.distance) == pytest.approx(float(slow.distance), abs=F64_REDUCTION)
        M = cost_matrix(X, Y, 2)
        direct = ot.emd2(np.full(n, 1 / n), np.full(n, 1 / n), M)
        assert float(fast.distance) ** 2 == pytest.approx(direct, abs=F64_REDUCTION)


def test_plan_is_an_optimal_coupling():
    rng = np.random.default_rng(3)
    x, a = random_measure(rng, 5, 2)
    y, b = random_measure(rng, 4, 2)
    res = optimal_transport(to_measure(x, a), to_measure(y, b), p=2)
    assert isinstance(res, TransportResult) and res.converged and res.p == 2.0
    plan = res.plan.numpy()
    assert res.plan.shape == (5, 4) and res.plan.dtype == F64
    assert (plan >= 0).all()
    np.testing.assert_allclose(plan.sum(1), a, atol=F64_REWRITTEN)
    np.testing.assert_allclose(plan.sum(0), b, atol=F64_REWRITTEN)
    assert (plan * cost_matrix(x, y, 2)).sum() == pytest.approx(
        float(res.distance) ** 2, abs=F64_REWRITTEN_EXP
    )
    with pytest.raises(AttributeError):
        res.p = 3.0  # frozen


@pytest.mark.parametrize("p", [1, 2, 3.5])
def test_one_dimensional_quantile_closed_form(p):
    rng = np.random.default_rng(4)
    for _ in range(10):
        n, m = rng.integers(1, 8), rng.integers(1, 8)
        x, a = random_measure(rng, n, 1)
        y, b = random_measure(rng, m, 1)
        got = float(wasserstein(to_measure(x, a), to_measure(y, b), p=p)) ** p
        assert got == pytest.approx(quantile_wp(x[:, 0], a, y[:, 0], b, p), abs=F64_REDUCTION)


def test_symmetry_identity_triangle():
    rng = np.random.default_rng(5)
    for _ in range(10):
        mus = [to_measure(*random_measure(rng, int(rng.integers(1, 6)), 2)) for _ in range(3)]
        for p in (1, 2):
            d01 = float(wasserstein(mus[0], mus[1], p=p))
            d10 = float(wasserstein(mus[1], mus[0], p=p))
            d12 = float(wasserstein(mus[1], mus[2], p=p))
            d02 = float(wasserstein(mus[0], mus[2], p=p))
            assert d01 == pytest.approx(d10, abs=F64_REDUCTION)
            assert d02 <= d01 + d12 + F64_REDUCTION
            assert float(wasserstein(mus[0], mus[0], p=p)) == 0.0


@pytest.mark.parametrize("p", [1, 2, 3])
def test_translation(p):
    rng = np.random.default_rng(6)
    x, a = random_measure(rng, 5, 3)
    c = np.array([0.3, -1.2, 2.0])
    got = wasserstein(to_measure(x, a), to_measure(x + c, a), p=p)
    assert float(got) == pytest.approx(np.linalg.norm(c), rel=F64_REDUCTION)


def test_duplicate_atom_is_the_same_measure():
    rng = np.random.default_rng(7)
    x, a = random_measure(rng, 4, 3)
    mu = to_measure(x, a)
    for i, k in [(0, 2), (2, 3), (3, 5)]:
        split = mu.split(i, k)
        # W_2 = sqrt(cost): the cost is good to a float64 sum, the distance to its square root
        assert float(wasserstein(split, mu)) ** 2 == pytest.approx(0.0, abs=F64_REDUCTION)
        assert float(wasserstein_inf(split, mu)) == 0.0
        assert float(wasserstein(split.merge(), mu)) ** 2 == pytest.approx(0.0, abs=F64_REDUCTION)
    # duplicating every atom of a uniform cloud leaves the measure unchanged
    X = torch.as_tensor(x)
    assert float(wasserstein(DiracMeasure(torch.cat([X, X])), DiracMeasure(X))) == 0.0


def test_zero_mass_atoms_are_ignored():
    x = np.array([[0.0, 0.0], [1.0, 0.0], [50.0, 50.0]])
    a = np.array([0.5, 0.5, 0.0])
    y = np.array([[0.0, 1.0], [1.0, 1.0]])
    b = np.array([0.5, 0.5])
    mu, nu = to_measure(x, a), to_measure(y, b)
    assert float(wasserstein(mu, nu)) == pytest.approx(1.0, abs=F64_REDUCTION)
    assert float(wasserstein_inf(mu, nu)) == pytest.approx(1.0, abs=F64_REDUCTION)


def test_mass_splitting_closed_forms():
    # docs/theory.md §10 and §A5: moving mass 1/k by delta costs |delta|/sqrt(k) in W2, |delta| in W_inf
    y, z = np.array([[1.0, 0.0]]), np.array([[3.0, 0.0]])
    for k in (1, 2, 5, 10, 10**6, 10**10):
        mu = to_measure(y, np.ones(1))
        nu = to_measure(np.vstack([y, z]), np.array([1 - 1 / k, 1 / k]))
        assert float(wasserstein(mu, nu)) == pytest.approx(2.0 / math.sqrt(k), rel=F64_REWRITTEN)
        assert float(wasserstein_inf(mu, nu)) == pytest.approx(2.0, rel=F64_REWRITTEN)


def test_winf_sees_a_tiny_mass_imbalance():
    # every atom has a partner at distance 0, yet a mass 2*delta must travel 10
    x = np.array([[0.0], [10.0]])
    for delta in (1e-3, 1e-6, 1e-10):
        mu = to_measure(x, np.array([0.5 + delta, 0.5 - delta]))
        nu = to_measure(x, np.array([0.5 - delta, 0.5 + delta]))
        assert float(wasserstein_inf(mu, nu)) == 10.0
        assert float(wasserstein(mu, nu)) == pytest.approx(
            10 * math.sqrt(2 * delta), rel=F64_TINY_DIFFERENCE
        )
    same = to_measure(x, np.array([0.5, 0.5]))
    assert float(wasserstein_inf(same, same.split(0, 3))) == 0.0


def test_dtype_and_gradient():
    rng = np.random.default_rng(8)
    x, a = random_measure(rng, 4, 3)
    y, b = random_measure(rng, 5, 3)
    mu32 = to_measure(x, a).to(torch.float32)
    w32 = wasserstein(mu32, to_measure(y, b))
    assert w32.dtype == torch.float32 and w32.shape == ()
    assert float(w32) == pytest.approx(
        float(wasserstein(to_measure(x, a), to_measure(y, b))), rel=F32_FORWARD
    )
    assert optimal_transport(mu32, to_measure(y, b)).plan.dtype == torch.float32

    Y, B = torch.as_tensor(y), torch.as_tensor(b)
    A = torch.as_tensor(a)
    for p in (1, 2):

        def fn(X, p=p):
            return wasserstein(DiracMeasure(X, A), DiracMeasure(Y, B), p=p)

        X = torch.as_tensor(x).clone().requires_grad_(True)
        assert torch.autograd.gradcheck(fn, (X,), eps=1e-6, atol=FD_REL)
    Z = torch.as_tensor(x).clone().requires_grad_(True)
    (g,) = torch.autograd.grad(wasserstein(DiracMeasure(Z, A), DiracMeasure(Z.detach(), A)), Z)
    assert torch.isfinite(g).all()  # no NaN at distance 0


def test_solver_failure_raise_and_warn():
    rng = np.random.default_rng(9)
    x, a = random_measure(rng, 30, 2)
    y, b = random_measure(rng, 30, 2)
    mu, nu = to_measure(x, a), to_measure(y, b)
    with pytest.raises(TransportError, match=r"max_iter=1 .*numItermax"):
        wasserstein(mu, nu, max_iter=1)
    with pytest.warns(UserWarning, match="stopped before optimality"):
        res = optimal_transport(mu, nu, max_iter=1, on_failure="warn")
    assert not res.converged
    plan = res.plan.numpy()
    np.testing.assert_allclose(plan.sum(1), a, atol=F64_ZERO)
    np.testing.assert_allclose(plan.sum(0), b, atol=F64_ZERO)
    assert float(res.distance) >= float(wasserstein(mu, nu)) - F64_REDUCTION


def test_validation_errors():
    mu = DiracMeasure(torch.randn(3, 2, dtype=F64))
    with pytest.raises(ValueError, match="dimension mismatch"):
        wasserstein(mu, DiracMeasure(torch.randn(3, 3, dtype=F64)))
    batched = DiracMeasure(torch.randn(2, 3, 2, dtype=F64))
    for fn in (wasserstein, wasserstein_inf, conditional_wasserstein):
        with pytest.raises(ValueError, match="unbatched"):
            fn(batched, mu)
    with pytest.raises(ValueError, match="unbatched"):
        sinkhorn_wasserstein(mu, batched, eps=0.1)
    with pytest.raises(ValueError, match="p must be >= 1"):
        wasserstein(mu, mu, p=0.5)
    with pytest.raises(ValueError, match="wasserstein_inf"):
        wasserstein(mu, mu, p=math.inf)
    with pytest.raises(TypeError, match="DiracMeasure"):
        wasserstein(mu.points, mu)
    with pytest.raises(ValueError, match="on_failure"):
        wasserstein(mu, mu, on_failure="ignore")
    with pytest.raises(ValueError, match="max_iter"):
        wasserstein(mu, mu, max_iter=0)
    with pytest.raises(ValueError, match="max_iter"):
        wasserstein_inf(mu, mu, max_iter=0)
    for kwargs, msg in [
        ({"eps": 0.0}, "eps"),
        ({"eps": math.nan}, "eps"),
        ({"eps": 0.1, "max_iter": 0}, "max_iter"),
        ({"eps": 0.1, "tol": 0.0}, "tol"),
        ({"eps": 0.1, "scaling": 1.5}, "scaling"),
        ({"eps": 0.1, "p": 0.5}, "p must be"),
    ]:
        with pytest.raises(ValueError, match=msg):
            sinkhorn_wasserstein(mu, mu, **kwargs)
    # causal and non-causal may be mixed in the plain distance: positions are ignored
    causal = DiracMeasure.from_sequence(mu.points, causal=True)
    assert float(wasserstein(causal, mu)) == 0.0
    # every message is one line
    with pytest.raises(ValueError) as info:
        wasserstein(mu, batched)
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------------------- W_inf


def test_winf_against_permutations():
    rng = np.random.default_rng(11)
    for n in range(1, 7):
        X, Y = rng.normal(size=(n, 2)), rng.normal(size=(n, 2))
        mu, nu = DiracMeasure(torch.as_tensor(X)), DiracMeasure(torch.as_tensor(Y))
        got = float(wasserstein_inf(mu, nu))
        assert got == pytest.approx(perm_winf(X, Y), abs=F64_REDUCTION)


def test_winf_weighted_against_lp_scan():
    rng = np.random.default_rng(12)
    for _ in range(12):
        n, m = rng.integers(1, 6), rng.integers(1, 6)
        x, a = random_measure(rng, n, 2)
        y, b = random_measure(rng, m, 2)
        got = float(wasserstein_inf(to_measure(x, a), to_measure(y, b)))
        assert got == pytest.approx(lp_winf(x, a, y, b), abs=F64_REDUCTION)


def test_winf_dominates_w2_dominates_w1_and_translation():
    rng = np.random.default_rng(13)
    for _ in range(10):
        mu = to_measure(*random_measure(rng, int(rng.integers(1, 7)), 3))
        nu = to_measure(*random_measure(rng, int(rng.integers(1, 7)), 3))
        w1, w2 = float(wasserstein(mu, nu, p=1)), float(wasserstein(mu, nu, p=2))
        winf = float(wasserstein_inf(mu, nu))
        assert winf >= w2 - F64_REDUCTION and w2 >= w1 - F64_REDUCTION
    x, a = random_measure(rng, 5, 3)
    c = np.array([1.0, 2.0, -2.0])
    assert float(wasserstein_inf(to_measure(x, a), to_measure(x + c, a))) == pytest.approx(3.0)
    assert float(wasserstein_inf(to_measure(x, a), to_measure(x, a))) == 0.0


# ------------------------------------------------------------------------------- hypothesis

coords = st.floats(-5, 5, allow_nan=False, width=64)


@st.composite
def measures(draw, d: int):
    n = draw(st.integers(1, 5))
    x = np.array(draw(st.lists(st.lists(coords, min_size=d, max_size=d), min_size=n, max_size=n)))
    w = np.array(draw(st.lists(st.floats(0.05, 1.0), min_size=n, max_size=n)))
    return x, w / w.sum()


@settings(max_examples=25, deadline=None)
@given(measures(2), measures(2), st.sampled_from([1, 2]))
def test_property_matches_lp(m1, m2, p):
    (x, a), (y, b) = m1, m2
    got = float(wasserstein(to_measure(x, a), to_measure(y, b), p=p)) ** p
    scale = 1 + float(cost_matrix(x, y, p).max())
    assert got == pytest.approx(lp_cost(x, a, y, b, p), abs=LP_HIGHS * scale)


@settings(max_examples=25, deadline=None)
@given(measures(2), measures(2), st.randoms(use_true_random=False))
def test_property_permutation_invariance_and_order(m1, m2, rnd):
    (x, a), (y, b) = m1, m2
    mu, nu = to_measure(x, a), to_measure(y, b)
    perm = list(range(len(a)))
    rnd.shuffle(perm)
    mu_perm = to_measure(x[perm], a[perm])
    # The network simplex's plan carries rounding of the masses (an off-support entry of ~1e-17
    # is common), so the transport cost c = W_p^p is good to a float64 sum of products of size
    # max cost; W_2 = sqrt(c) is then only good to sqrt(tol) near 0 (3.7e-9 seen for mu = nu).
    # Compare costs, which are linear in the plan.
    tol = F64_REDUCTION * (1 + float(cost_matrix(x, y, 2).max()))
    c2 = float(wasserstein(mu, nu)) ** 2
    assert float(wasserstein(mu_perm, nu)) ** 2 == pytest.approx(c2, abs=tol)
    winf = float(wasserstein_inf(mu, nu))
    assert float(wasserstein_inf(mu_perm, nu)) == pytest.approx(winf, abs=F64_REDUCTION)
    # W_inf >= W_2 >= W_1, squared: each side's own error enters before the square
    w1 = float(wasserstein(mu, nu, p=1))
    assert winf**2 >= c2 - tol
    assert c2 >= max(w1 - tol, 0.0) ** 2 - tol


# ------------------------------------------------------------------------------- conditional


def test_conditional_equals_sequence_distance_exactly():
    rng = np.random.default_rng(20)
    for n in (1, 2, 7, 40):
        X, Y = torch.as_tensor(rng.normal(size=(n, 3))), torch.as_tensor(rng.normal(size=(n, 3)))
        mu = DiracMeasure.from_sequence(X, causal=True)
        nu = DiracMeasure.from_sequence(Y, causal=True)
        got = conditional_wasserstein(mu, nu)
        assert got.dtype == F64 and got.shape == ()
        expected = float(torch.linalg.norm(X - Y) / math.sqrt(n))
        assert float(got) == pytest.approx(expected, rel=F64_REWRITTEN)
    # float32 measure against float64 measure: positions i/n agree up to the float32 rounding
    X32 = X.to(torch.float32)
    got32 = conditional_wasserstein(DiracMeasure.from_sequence(X32, causal=True), nu)
    assert got32.dtype == torch.float32
    assert float(got32) == pytest.approx(expected, rel=F32_FORWARD)


def grouped_causal_pair(rng: np.random.Generator):
    """Two causal measures with the same position law and several atoms per position."""
    positions = np.array([0.25, 0.5, 1.0])
    rho = rng.dirichlet(np.ones(3))
    parts = []
    for _ in range(2):
        xs, ws, ts = [], [], []
        for t, r in zip(positions, rho, strict=True):
            k = int(rng.integers(1, 4))
            xs.append(rng.normal(size=(k, 2)))
            ws.append(r * rng.dirichlet(np.ones(k)))
            ts.append(np.full(k, t))
        parts.append((np.vstack(xs), np.concatenate(ws), np.concatenate(ts)))
    return parts


def test_conditional_and_winf_gradients():
    rng = np.random.default_rng(22)
    X = torch.as_tensor(rng.normal(size=(6, 3))).requires_grad_(True)
    Y = torch.as_tensor(rng.normal(size=(6, 3)))
    wc = conditional_wasserstein(
        DiracMeasure.from_sequence(X, causal=True), DiracMeasure.from_sequence(Y, causal=True)
    )
    (g,) = torch.autograd.grad(wc, X)
    D = (X - Y).detach()
    torch.testing.assert_close(g, D / (math.sqrt(6) * torch.linalg.norm(D)))
    z = torch.tensor([[3.0, 4.0]], dtype=F64, requires_grad=True)
    nu = DiracMeasure(torch.tensor([[0.0, 0.0], [0.0, 1.0]], dtype=F64))
    (gz,) = torch.autograd.grad(wasserstein_inf(DiracMeasure(z), nu), z)
    torch.testing.assert_close(gz, torch.tensor([[0.6, 0.8]], dtype=F64))


def test_conditional_against_restricted_lp_and_plain_w2():
    rng = np.random.default_rng(21)
    for _ in range(10):
        (x, a, s), (y, b, r) = grouped_causal_pair(rng)
        mu, nu = to_measure(x, a, s), to_measure(y, b, r)
        wc = float(conditional_wasserstein(mu, nu))
        allowed = s[:, None] == r[None, :]
        assert wc**2 == pytest.approx(lp_cost(x, a, y, b, 2, allowed=allowed), abs=LP_HIGHS)
        assert wc >= float(wasserstein(mu, nu)) - F64_REDUCTION
        # splitting an atom keeps its position and the measure: same distance
        assert float(conditional_wasserstein(mu.split(1, 3), nu)) == pytest.approx(
            wc, abs=F64_REDUCTION
        )
        assert float(conditional_wasserstein(mu, mu)) == 0.0


def test_conditional_errors():
    X = torch.randn(4, 2, dtype=F64)
    causal4 = DiracMeasure.from_sequence(X, causal=True)
    causal3 = DiracMeasure.from_sequence(X[:3], causal=True)
    with pytest.raises(ValueError, match="position marginals differ"):
        conditional_wasserstein(causal4, causal3)
    with pytest.raises(ValueError, match="needs causal measures"):
        conditional_wasserstein(causal4, DiracMeasure(X))
    with pytest.raises(ValueError, match="needs causal measures"):
        conditional_wasserstein(DiracMeasure(X), DiracMeasure(X))
    # same positions, different masses per position
    w = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=F64)
    with pytest.raises(ValueError, match="position marginals differ"):
        conditional_wasserstein(causal4, DiracMeasure(X, w, causal4.positions))
    with pytest.raises(ValueError, match="position_atol"):
        conditional_wasserstein(causal4, causal4, position_atol=-1.0)


def test_conditional_position_tolerance():
    X = torch.randn(3, 2, dtype=F64)
    t = torch.tensor([0.2, 0.5, 1.0], dtype=F64)
    mu = DiracMeasure(X, positions=t)
    nu = DiracMeasure(X.flip(0), positions=t + torch.tensor([1e-9, 0, 0], dtype=F64))
    with pytest.raises(ValueError, match="position marginals differ"):
        conditional_wasserstein(mu, nu)  # default: equality up to rounding
    got = conditional_wasserstein(mu, nu, position_atol=1e-6)
    assert float(got) == pytest.approx(float(torch.linalg.norm(X - X.flip(0)) / math.sqrt(3)))


# ------------------------------------------------------------------------------- Sinkhorn


def test_sinkhorn_bias_bounds():
    rng = np.random.default_rng(30)
    for _ in range(5):
        n, m = int(rng.integers(2, 7)), int(rng.integers(2, 7))
        x, a = random_measure(rng, n, 2)
        y, b = random_measure(rng, m, 2)
        mu, nu = to_measure(x, a), to_measure(y, b)
        w22 = float(wasserstein(mu, nu)) ** 2
        tol = 1e-12  # Sinkhorn's stopping rule on the marginal error, checked below
        for eps in (1.0, 0.1, 0.02):
            res = sinkhorn_wasserstein(mu, nu, eps=eps, tol=tol, max_iter=20_000)
            assert isinstance(res, SinkhornResult) and res.converged and res.eps == eps
            cost = float(res.cost)
            assert cost >= w22 - F64_SOLVER
            assert cost - w22 <= eps * min(entropy(a), entropy(b)) + F64_SOLVER
            assert cost - w22 <= eps * math.log(min(n, m)) + F64_SOLVER
            obj = float(res.objective)
            assert w22 - F64_SOLVER <= obj <= w22 + eps * min(entropy(a), entropy(b)) + F64_SOLVER
            assert float(res.distance) == pytest.approx(math.sqrt(cost), rel=F64_REWRITTEN)
            plan = res.plan.numpy()
            np.testing.assert_allclose(plan.sum(1), a, atol=SINKHORN_MARGINAL)
            np.testing.assert_allclose(plan.sum(0), b, atol=SINKHORN_MARGINAL)
            assert res.marginal_error <= tol


def test_sinkhorn_converges_to_exact():
    rng = np.random.default_rng(31)
    x, a = random_measure(rng, 5, 2)
    y, b = random_measure(rng, 6, 2)
    mu, nu = to_measure(x, a), to_measure(y, b)
    w22 = float(wasserstein(mu, nu)) ** 2
    gaps = []
    for eps in (1.0, 0.1, 0.01, 1e-3):
        res = sinkhorn_wasserstein(mu, nu, eps=eps, max_iter=50_000, scaling=0.7)
        assert res.converged
        gaps.append(abs(float(res.cost) - w22))
    assert gaps == sorted(gaps, reverse=True)
    assert gaps[-1] <= 1e-3 * math.log(5) + SINKHORN_SLACK
    for p in (1, 3):  # other exponents, against the exact W_p^p
        wp = float(wasserstein(mu, nu, p=p)) ** p
        res = sinkhorn_wasserstein(mu, nu, eps=1e-3, p=p, max_iter=50_000, scaling=0.7)
        assert wp - SINKHORN_SLACK <= float(res.cost) <= wp + 1e-3 * math.log(5) + SINKHORN_SLACK


def test_sinkhorn_large_radius_small_eps_is_finite():
    rng = np.random.default_rng(32)
    X = rng.normal(size=(8, 3))
    Y = rng.normal(size=(6, 3))
    X = 100 * X / np.linalg.norm(X, axis=1, keepdims=True)
    Y = 100 * Y / np.linalg.norm(Y, axis=1, keepdims=True)
    mu, nu = DiracMeasure(torch.as_tensor(X)), DiracMeasure(torch.as_tensor(Y))
    w22 = float(wasserstein(mu, nu)) ** 2
    for dtype in (F64, torch.float32):
        for scaling in (None, 0.8):
            res = sinkhorn_wasserstein(
                mu.to(dtype), nu.to(dtype), eps=1e-3, max_iter=300, scaling=scaling
            )
            assert res.cost.dtype == dtype
            assert torch.isfinite(res.cost) and torch.isfinite(res.plan).all()
            assert math.isfinite(res.marginal_error)
    # plain iterations need ~ max M / eps = 4e7 sweeps here; epsilon-scaling gets there. Marginal
    # errors below ~ (max M / eps) * 1e-16 ~ 4e-9 are out of reach in float64.
    res = sinkhorn_wasserstein(mu, nu, eps=1e-3, max_iter=5000, scaling=0.95, tol=1e-7)
    assert res.converged
    slack = res.marginal_error * 4e4  # a marginal error delta moves the cost by <= delta max M
    assert w22 - slack <= float(res.cost) <= w22 + 1e-3 * math.log(6) + slack


def test_sinkhorn_float32_and_options():
    rng = np.random.default_rng(33)
    x, a = random_measure(rng, 5, 3)
    y, b = random_measure(rng, 4, 3)
    mu, nu = to_measure(x, a), to_measure(y, b)
    ref = sinkhorn_wasserstein(mu, nu, eps=0.1)
    # float32 reaches marginal errors of ~1e-7 * max M / eps (max M / eps ~ 200 here)
    tol32 = 1e-4  # Sinkhorn's stopping rule on the marginal error, checked below
    res32 = sinkhorn_wasserstein(mu.to(torch.float32), nu.to(torch.float32), eps=0.1, tol=tol32)
    assert res32.cost.dtype == torch.float32 and res32.plan.dtype == torch.float32
    assert res32.converged and res32.marginal_error <= tol32
    assert float(res32.cost) == pytest.approx(float(ref.cost), rel=F32_VALUE)
    assert sinkhorn_wasserstein(mu, nu, eps=0.1, return_plan=False).plan is None
    short = sinkhorn_wasserstein(mu, nu, eps=0.01, max_iter=1)
    assert short.n_iter == 1 and not short.converged and short.marginal_error > 1e-9


def test_sinkhorn_debiased():
    rng = np.random.default_rng(34)
    x, a = random_measure(rng, 5, 2)
    y, b = random_measure(rng, 4, 2)
    mu, nu = to_measure(x, a), to_measure(y, b)
    same = sinkhorn_wasserstein(mu, mu, eps=0.5, debiased=True, tol=1e-12)
    assert float(same.divergence) == pytest.approx(0.0, abs=F64_SOLVER)
    assert float(same.objective) > 0.01  # the biased objective does not vanish at mu = nu
    plain = sinkhorn_wasserstein(mu, nu, eps=0.5)
    assert plain.divergence is None
    deb = sinkhorn_wasserstein(mu, nu, eps=0.5, debiased=True)
    assert float(deb.cost) == pytest.approx(float(plain.cost), rel=F64_REDUCTION)  # cost unchanged
    assert float(deb.distance) == pytest.approx(math.sqrt(max(float(deb.divergence), 0.0)))
    w22 = float(wasserstein(mu, nu)) ** 2
    small = sinkhorn_wasserstein(mu, nu, eps=1e-3, debiased=True, max_iter=50_000, scaling=0.7)
    assert float(small.divergence) == pytest.approx(w22, abs=SINKHORN_BIAS)


def naive_sinkhorn(a, b, C, eps, iters=20_000):
    """Plain (non-log) Sinkhorn in float64 numpy, an independent oracle for moderate eps."""
    K = np.exp(-C / eps)
    u, v = np.ones_like(a), np.ones_like(b)
    for _ in range(iters):
        u = a / (K @ v)
        v = b / (K.T @ u)
    return u[:, None] * K * v[None, :]


@pytest.mark.parametrize("zero_mass", [False, True])
def test_sinkhorn_matches_naive_iteration_and_its_objective(zero_mass):
    rng = np.random.default_rng(35)
    x, a = random_measure(rng, 6, 2)
    y, b = random_measure(rng, 5, 2)
    if zero_mass:  # zero masses are absent atoms: potentials there are arbitrary, never NaN
        a[0], b[-1] = 0.0, 0.0
        a, b = a / a.sum(), b / b.sum()
    mu, nu = to_measure(x, a), to_measure(y, b)
    eps = 0.3
    res = sinkhorn_wasserstein(mu, nu, eps=eps, tol=1e-13, max_iter=20_000)
    assert res.converged
    C = cost_matrix(x, y, 2)
    ref = naive_sinkhorn(a, b, C, eps)
    plan = res.plan.numpy()
    np.testing.assert_allclose(plan, ref, rtol=0, atol=F64_REDUCTION)
    assert float(res.cost) == pytest.approx(float((ref * C).sum()), abs=F64_REDUCTION)
    # objective = <pi, C> + eps KL(pi | a x b), evaluated directly on the returned plan
    ab = np.outer(a, b)
    pos = plan > 0
    kl = float((plan[pos] * np.log(plan[pos] / ab[pos])).sum() - plan.sum() + ab.sum())
    assert float(res.objective) == pytest.approx(
        float((plan * C).sum()) + eps * kl, abs=F64_LONG_CHAIN
    )
    assert math.isfinite(float(res.objective))
