"""Mean-field bounds (theory.bounds.mean_field) against the local W2 constant (docs/theory.md
§5, §6, §16).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import optimize

from theory import bounds as B

from ..oracles_bounds import (
    mean_field_local,
    random_instance,
    spec,
)
from ..tolerances import F64_REWRITTEN


def test_mean_field_upper_forms_and_log():
    R = np.linspace(0, 3, 31)
    sharp = B.mean_field_upper(0.7, 1.3, R)
    simple = B.mean_field_upper(0.7, 1.3, R, form="simple")
    assert np.all(sharp <= simple * (1 + F64_REWRITTEN))
    np.testing.assert_allclose(
        np.log(sharp), B.mean_field_upper(0.7, 1.3, R, log=True), rtol=F64_REWRITTEN
    )
    assert np.all(B.mean_field_upper(0.7, 1.3, R, c=2.0) >= sharp)
    assert np.isfinite(B.mean_field_upper(1.0, 1.0, 100.0, log=True))
    theta = 0.7 * R**2
    np.testing.assert_allclose(
        sharp, 1.3 * (theta + (1 + 2 * theta) * np.exp(theta)), rtol=F64_REWRITTEN
    )


def test_mean_field_upper_dominates_local_w2_constants(rng):
    d = 2
    worst = 0.0
    for trial in range(60):
        n, R, A, V, X = random_instance(rng, (2, 5), (0.5, 2.5), d, d)
        a = np.exp(rng.uniform(-12, 0, size=n))
        a /= a.sum()
        LW = mean_field_local(X, a, A, V)
        up = B.mean_field_upper(spec(A), spec(V), R, c=1.0)
        worst = max(worst, LW / up)
        assert LW <= up, (trial, LW, up)
    assert worst > 0.0


def test_mean_field_lower_forms(rng):
    R = np.array([0.1, 1.0, 3.0])
    lo = B.mean_field_lower((1.0, -0.3), 1.0, R)
    assert np.all(lo >= 1.0)
    assert lo[0] == 1.0  # small radius: the trivial bound wins
    expect = max(1.0, B.two_dirac_lower(9 / 4), B.two_dirac_lower(2 * 0.3 * 9))
    assert lo[2] == pytest.approx(expect, rel=F64_REWRITTEN)
    A = rng.normal(size=(3, 3))
    V = rng.normal(size=(2, 3))
    sym = B.mean_field_lower(A, V, R)
    assert np.all(sym <= B.mean_field_upper(spec(A), spec(V), R))
    assert np.all(sym >= spec(V) * (1 - F64_REWRITTEN))


@pytest.mark.slow
def test_mean_field_upper_dominates_optimized_measures(rng):
    # Multi-start Nelder-Mead over 3 weighted atoms in B_R (positions R tanh|z| z/|z|, free
    # log-masses, docs/theory.md §16): the optimized local W2 constant never exceeds the c' = 1 bound.
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
