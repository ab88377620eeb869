"""Mass splitting (theory.bounds.splitting; docs/theory.md §10) against an explicit simulation."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from theory import bounds as B

from ..tolerances import ASYMPTOTE, F64_CLOSED_FORM, F64_FEW_ULPS, F64_REDUCTION, F64_REWRITTEN


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
            assert ratio == pytest.approx(vfac * B.split_gain(k, s), rel=F64_REDUCTION)
        assert B.split_gain_general(7, R / 2, R, lam) == pytest.approx(
            B.split_gain(7, s), rel=F64_REWRITTEN
        )


def test_split_gain_regimes():
    assert B.split_gain(1, 5.0) == 1.0
    assert np.all(B.split_gain(1, np.array([-3.0, 0.0, 40.0])) == 1.0)
    k = np.arange(1, 1001)
    np.testing.assert_allclose(B.split_gain(k, 40.0), np.sqrt(k), rtol=F64_CLOSED_FORM)  # k << e^s
    for s in (10.0, 20.0, 40.0):
        kstar = B.optimal_split_k(s)
        peak = B.split_gain(kstar, s)
        assert peak == pytest.approx(np.exp(s / 2) / 2, rel=2 * np.exp(-s / 2) + F64_CLOSED_FORM)
        assert peak >= B.split_gain(np.array([kstar / 2, 2 * kstar]), s).max()
    assert B.split_gain(1e30, 10.0) < 1e-5  # decays for k >> e^s
    assert np.isfinite(B.split_gain(1e300, 700.0))


def test_split_optimal_k_brute_force():
    for s in np.concatenate([np.linspace(-2, 9, 45), [11.0]]):
        ks = np.arange(1, int(3 * np.exp(max(s, 0))) + 10, dtype=float)
        assert B.optimal_split_k(s) == ks[np.argmax(B.split_gain(ks, s))]


def test_split_gain_saturation_and_optimal_k_edges():
    s = 10.0
    assert B.split_gain(1 + math.exp(s), s) == pytest.approx(math.exp(s / 2) / 2, rel=ASYMPTOTE)
    big = B.split_gain(np.array([2.0, 1e300]), 800.0)  # log domain: finite for any s
    assert np.all(np.isfinite(big)) and big[0] == pytest.approx(math.sqrt(2), rel=F64_CLOSED_FORM)
    with pytest.raises(ValueError):
        B.split_gain(0.5, 1.0)
    assert B.optimal_split_k(0.5 * math.log(2) - 1e-9) == 1  # k = 1 for s <= log(2) / 2
    assert B.optimal_split_k(800.0) == math.inf  # e^s overflows


def test_split_gain_w_infinity_has_no_gain():
    # docs/theory.md §16: under W_inf every output moves by at most max(w_y, w_z) ||V delta||.
    s = 5.0
    k = np.arange(1, 200)
    wy = np.exp(s) / (k - 1 + np.exp(s))
    wz = np.exp(2 * s) / (k - 1 + np.exp(2 * s))
    assert np.all(np.maximum(wy, wz) <= 1.0)
    assert np.all(B.split_gain(k, s) >= np.maximum(wy, wz) - F64_FEW_ULPS)


def test_split_optimal_k_is_optimal_to_float_precision_beyond_brute_force():
    """Past brute force (k* up to ~1e15), k* beats its integer neighbours in 60-digit arithmetic.

    The gains of neighbouring integers agree to float precision there, so the reference is the
    exact G_k^2 = m E^2/(m + E)^2 + E^4/(m + E^2)^2 (m = k - 1, E = e^s) evaluated by mpmath.
    """
    mpmath.mp.dps = 60

    def g2(k: float, s: float):
        E, m = mpmath.exp(mpmath.mpf(s)), mpmath.mpf(k) - 1
        return m * E**2 / (m + E) ** 2 + E**4 / (m + E**2) ** 2

    for s in np.linspace(10.0, 34.0, 25):
        k = float(B.optimal_split_k(s))
        assert k == np.round(k) and k < 2.0**52
        best = max(g2(k - 1, s), g2(k + 1, s))
        assert g2(k, s) >= best * (1 - mpmath.mpf(2) ** -52), s
        # and it is the maximiser, not just a point of a flat region: moving k by 1e-5 relative
        # (far beyond float flatness, ~1e-10 relative loss) strictly loses
        delta = math.ceil(1e-5 * k)
        assert g2(k, s) > max(g2(k - delta, s), g2(k + delta, s)), s
