"""Kim et al.'s lemma and L2-attention bounds (theory.bounds.kim; docs/theory.md §8)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import optimize

from theory import bounds as B
from theory.lambert import lambertw

from ..oracles_bounds import (
    fd_jacobian,
    softmax_rows,
    spec,
)
from ..tolerances import (
    BRACKET_MARGIN,
    EXACT_ZERO_FLOOR,
    F64_CLOSED_FORM,
    F64_FEW_ULPS,
    F64_REDUCTION,
    F64_REWRITTEN,
    F64_REWRITTEN_EXP,
    F64_SOLVER,
)


def test_kim_lemma_brute_force(rng):
    for N in (2, 3, 10, 100):
        bound = B.kim_softmax_lemma(N)
        t = np.abs(rng.standard_cauchy(size=(20000, N))) * rng.uniform(0, 5, size=(20000, 1))
        t[:, 0] = 0.0
        p = softmax_rows(-t)
        assert np.max(np.sum(p * t, axis=1)) <= bound * (1 + BRACKET_MARGIN)
        t_star = 1 + bound
        tt = np.full(N, t_star)
        tt[0] = 0.0
        pp = softmax_rows(-tt[None, :])[0]
        assert np.sum(pp * tt) == pytest.approx(bound, rel=F64_REDUCTION)
        assert (t_star - 1) * np.exp(t_star) == pytest.approx(N - 1, rel=F64_CLOSED_FORM)
        res = optimize.minimize_scalar(
            lambda s, N=N: -(N - 1) * s / (np.exp(s) + N - 1),
            bounds=(0, 50),
            method="bounded",
            options={"xatol": 1e-12},
        )
        assert -res.fun == pytest.approx(bound, rel=F64_SOLVER)


def test_kim_lemma_mean_field_and_variants():
    N = np.array([1.0, 2.0, 10.0, 1e6])
    np.testing.assert_allclose(
        B.kim_softmax_lemma_mean_field(1 / N),
        B.kim_softmax_lemma(N),
        rtol=F64_REWRITTEN_EXP,
        atol=EXACT_ZERO_FLOOR,
    )
    assert np.all(B.kim_softmax_lemma(N, variant="N") >= B.kim_softmax_lemma(N))
    np.testing.assert_allclose(
        B.kim_softmax_lemma(N, variant="N"), lambertw(N / np.e), rtol=F64_FEW_ULPS
    )
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
    assert val == pytest.approx(expect, rel=F64_REWRITTEN)
    norms = {"WQ_norms": [1.0, 2.0], "WV_norms": [3.0, 1.0], "WO_norm": 1.5}
    val = B.kim_l2_upper(10, D=8, H=2, **norms, p="inf")
    assert val == pytest.approx((4 * w + 0.5) * 1.5 * 2.0 * 3.0, rel=F64_REWRITTEN)
    with pytest.raises(ValueError):
        B.kim_l2_upper(10, D=8, H=3, WQ_norms=[1, 1, 1], WV_norms=[1, 1, 1], WO_norm=1)
    sq = B.kim_l2_upper(
        10, D=8, H=2, WQ_norms=[1.0, 2.0], WV_norms=[3.0, 1.0], WO_norm=1.5, wq_power=2
    )
    assert sq == pytest.approx(
        np.sqrt(10) / 2 * (4 * w + 1) * np.sqrt(9 + 16) * 1.5, rel=F64_REWRITTEN
    )


def test_kim_recalled_p2_form_fails_for_large_query_weights():
    """Counterexample of the verification harness: the recalled p=2 form is linear in ||W^Q||."""
    N, D, H = 2, 1, 1
    WQ, WV, WO = np.full((1, 1, 1), 2.32), np.ones((1, 1, 1)), np.ones((1, 1))
    X = np.array([[-0.005], [0.72]])
    J = fd_jacobian(lambda Z: kim_l2_attention(Z, WQ, WV, WO), X, h=1e-6)
    norms = B.kim_l2_norms(WQ, WV, WO)
    assert spec(J) > B.kim_l2_upper(N, D=D, H=H, **norms)
    assert spec(J) <= B.kim_l2_upper(N, D=D, H=H, **norms, wq_power=2)
