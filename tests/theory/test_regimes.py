"""Regime classification and thresholds of theory.regimes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from theory import bounds as B
from theory import regimes as Rg

from ..tolerances import F64_CLOSED_FORM, F64_LONG_CHAIN


@pytest.mark.parametrize("form", ["sqrt3", "sharp", "triangle"])
@pytest.mark.parametrize("mf_form", ["sharp", "simple"])
def test_crossover_equalises_the_bounds(form, mf_form):
    R = np.linspace(0.3, 3.0, 12)
    for a, c in ((0.5, 1.0), (1.0, 1.0), (1.0, 2.0)):
        n_star = Rg.crossover_n(a, 2.0, R, c=c, form=form, mf_form=mf_form)
        ok = n_star >= 1
        np.testing.assert_allclose(
            B.sqrt_n_upper(a, 2.0, R[ok], n_star[ok], form=form),
            B.mean_field_upper(a, 2.0, R[ok], c=c, form=mf_form),
            rtol=F64_LONG_CHAIN,
        )
        log_n = Rg.crossover_n(a, 2.0, R, c=c, form=form, mf_form=mf_form, log=True)
        np.testing.assert_allclose(np.exp(log_n), n_star, rtol=F64_CLOSED_FORM)


def test_crossover_growth_rate():
    # docs/theory.md §12: n* ~ e^{2 ||A|| R^2} up to polynomial factors (c' = 1).
    theta = np.array([5.0, 50.0, 500.0])
    log_n = Rg.crossover_n(1.0, 1.0, np.sqrt(theta), log=True)
    assert np.all(np.isfinite(log_n))
    slope = np.diff(log_n) / np.diff(theta)
    np.testing.assert_allclose(slope, 2.0, rtol=0.02)
    assert Rg.crossover_n(1.0, 1.0, np.sqrt(500.0)) == np.inf  # e^1000: use log=True


def test_peak_n_is_the_integer_argmax():
    for gamma in np.linspace(0.0, 9.0, 37):
        n = np.arange(1, int(4 * np.exp(gamma)) + 20)
        assert Rg.peak_n(gamma) == n[np.argmax(B.sqrt_n_lower(gamma, n))]
    big = np.array([20.0, 40.0])
    np.testing.assert_allclose((Rg.peak_n(big) - 1) * np.exp(-big), 3.0, rtol=0.1)
    assert Rg.peak_n(0.0) == 2.0


@settings(max_examples=60, deadline=None)
@given(st.floats(0.05, 3.0), st.floats(0.1, 3.0), st.floats(0.1, 2.5), st.integers(1, 10**6))
def test_classify_is_consistent(a, v, R, n):
    r = Rg.classify(a, v, R, n)
    assert r.regime == ("sqrt-n" if n < r.n_star else "mean-field")
    assert r.upper == min(r.sqrt_n_upper, r.mean_field_upper)
    assert r.lower <= r.upper * (1 + F64_CLOSED_FORM)
    assert r.mean_field_lower <= r.mean_field_upper * (1 + F64_CLOSED_FORM)
    assert r.V_norm <= r.lower
    assert r.regime in r.explain()


def test_classify_flips_at_the_crossover():
    n_star = float(Rg.crossover_n(1.0, 1.0, 1.5))
    below = Rg.classify(1.0, 1.0, 1.5, np.floor(n_star))
    above = Rg.classify(1.0, 1.0, 1.5, np.ceil(n_star))
    assert (below.regime, above.regime) == ("sqrt-n", "mean-field")
    assert below.sqrt_n_upper < below.mean_field_upper
    assert above.sqrt_n_upper >= above.mean_field_upper


def test_classify_large_radius_with_margin(rng):
    X = rng.normal(size=(6, 3))
    A = rng.normal(size=(3, 3))
    for R in (1.0, 30.0):
        XR = R * X
        Rmax = float(np.max(np.linalg.norm(XR, axis=1)))
        gap = B.selection_gap(XR, A)
        r = Rg.classify(float(np.linalg.norm(A, 2)), 1.0, Rmax, 6, margin=gap)
        assert r.deviation == pytest.approx(
            B.large_radius_deviation(gap, 6, np.linalg.norm(A, 2), 1.0, Rmax)
        )
        assert (r.regime == "large-radius") == (r.deviation <= 0.05)
        assert "margin" in r.explain()
    assert r.regime == "large-radius"  # at R = 30 the softmax is a hard max


def test_regime_is_frozen_and_validates():
    r = Rg.classify(1.0, 1.0, 1.0, 10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.regime = "x"
    with pytest.raises(ValueError):
        Rg.classify(-1.0, 1.0, 1.0, 10)
    with pytest.raises(ValueError):
        Rg.classify(1.0, 1.0, 1.0, 0.5)
    with pytest.raises(ValueError):
        Rg.peak_n(-1.0)
    with pytest.raises(ValueError):
        Rg.crossover_n(1.0, 1.0, 1.0, form="nope")


@pytest.mark.parametrize(("L", "c"), [(3.0, 1.0), (10.0, 1.0), (1e4, 1.0), (10.0, 2.0)])
def test_radius_bracket(L, c):
    a, v = 0.8, 1.2
    br = Rg.radius_bracket(L, a, v, c=c)
    assert 0 < br.R_certified <= br.R_violated
    assert B.mean_field_upper(a, v, br.R_certified, c=c) == pytest.approx(L, rel=F64_CLOSED_FORM)
    gamma = 2 * a * br.R_violated**2  # worst case lam = -||A||
    assert B.two_dirac_lower(gamma, v) == pytest.approx(L, rel=F64_CLOSED_FORM)
    assert "undetermined" in br.explain()


def test_radius_bracket_below_trivial_bound():
    br = Rg.radius_bracket(0.5, 1.0, 1.0)
    assert np.isnan(br.R_certified) and br.R_violated == 0.0
    with pytest.raises(ValueError):
        Rg.radius_bracket(-1.0, 1.0, 1.0)
