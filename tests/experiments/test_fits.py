"""Power-law fits: exact recovery, an independent least-squares oracle, bootstrap coverage, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from experiments.fits import PAPER_CURVES, PowerLawFit, fit_power_law, paper_curve

from ..tolerances import F64_EXACT_FIT, F64_LSTSQ

GRID = np.repeat(np.arange(2, 100, 2), 10).astype(float)  # the paper's 49 n x 10 windows


@pytest.mark.parametrize(("c", "alpha"), [(14.3, 0.24), (0.445, 0.25), (3.0, -0.7), (2.0, 0.0)])
def test_noiseless_power_law_is_recovered_exactly(c, alpha):
    fit = fit_power_law(GRID, c * GRID**alpha, n_boot=200)
    assert fit.alpha == pytest.approx(alpha, abs=F64_EXACT_FIT)
    assert fit.c == pytest.approx(c, rel=F64_EXACT_FIT)
    assert fit.r2 == pytest.approx(1.0, abs=F64_EXACT_FIT)
    # every bootstrap replicate is the same exact fit
    assert fit.alpha_ci == pytest.approx((alpha, alpha), abs=F64_EXACT_FIT)
    assert fit.c_ci == pytest.approx((c, c), rel=F64_EXACT_FIT)
    assert fit.n_points == GRID.size
    np.testing.assert_allclose(fit(np.array([7.0])), c * 7.0**alpha, rtol=F64_EXACT_FIT)


def test_matches_numpy_polyfit(rng):
    y = 2.5 * GRID**0.3 * np.exp(0.2 * rng.standard_normal(GRID.size))
    fit = fit_power_law(GRID, y, n_boot=0)
    slope, intercept = np.polyfit(np.log(GRID), np.log(y), 1)
    assert fit.alpha == pytest.approx(slope, rel=F64_LSTSQ)
    assert fit.c == pytest.approx(np.exp(intercept), rel=F64_LSTSQ)
    resid = np.log(y) - np.polyval([slope, intercept], np.log(GRID))
    r2 = 1 - resid.var() / np.log(y).var()
    assert fit.r2 == pytest.approx(r2, rel=F64_LSTSQ)
    assert np.isnan(fit.alpha_ci).all() and fit.n_boot == 0


def test_bootstrap_interval_covers_the_truth_at_about_the_nominal_rate():
    """200 synthetic data sets with lognormal noise: the 95 % interval should cover ~95 %.

    Within-n resampling slightly underestimates the variance (factor (m-1)/m with m = 10), so
    the expected coverage is about 93 %; a binomial standard error of 1.8 % makes [0.86, 0.99]
    a lenient but real check (a CI that ignored the noise, or was centred on a biased slope,
    would fail it).
    """
    gen = np.random.default_rng(7)
    n = np.repeat(np.arange(2, 100, 8), 10).astype(float)
    alpha, c, hits, widths = 0.25, 0.445, 0, []
    n_rep = 200
    for rep in range(n_rep):
        y = c * n**alpha * np.exp(0.3 * gen.standard_normal(n.size))
        fit = fit_power_law(n, y, n_boot=400, seed=rep)
        lo, hi = fit.alpha_ci
        hits += lo <= alpha <= hi
        widths.append(hi - lo)
    coverage = hits / n_rep
    assert 0.86 <= coverage <= 0.99, coverage
    # width close to 2 * 1.96 * the analytic standard error of the OLS slope
    x = np.log(n)
    se = 0.3 / np.sqrt(((x - x.mean()) ** 2).sum())
    assert np.median(widths) == pytest.approx(2 * 1.96 * se, rel=0.15)


def test_groups_control_the_resampling(rng):
    n = np.repeat([2.0, 4.0, 8.0, 16.0], 5)
    y = n**0.5 * np.exp(0.1 * rng.standard_normal(n.size))
    by_n = fit_power_law(n, y, n_boot=300, seed=1)
    explicit = fit_power_law(n, y, groups=n.astype(int), n_boot=300, seed=1)
    assert by_n.alpha_ci == explicit.alpha_ci
    # one observation per n: the stratified bootstrap would be degenerate, pairs are resampled
    single = fit_power_law(n[::5], y[::5], n_boot=300, seed=1)
    assert single.alpha_ci[0] < single.alpha < single.alpha_ci[1]


def test_as_dict_is_json_able():
    fit = fit_power_law([2, 4, 8], [1.0, 2.0, 4.0], n_boot=50)
    d = fit.as_dict()
    assert isinstance(fit, PowerLawFit)
    assert json.loads(json.dumps(d))["alpha"] == pytest.approx(1.0)
    assert d["alpha_ci"] == pytest.approx([1.0, 1.0])


@pytest.mark.parametrize(
    ("n", "y", "kw", "match"),
    [
        ([2, 4], [1.0, 0.0], {}, "positive and finite"),
        ([2, 4], [1.0, -1.0], {}, "positive and finite"),
        ([2, 4], [1.0, np.inf], {}, "positive and finite"),
        ([2, 4], [1.0, np.nan], {}, "positive and finite"),
        ([2, 0], [1.0, 1.0], {}, "n must be positive"),
        ([2, 2, 2], [1.0, 2.0, 3.0], {}, "two distinct"),
        ([2, 4], [1.0], {}, "same length"),
        ([2, 4], [1.0, 2.0], {"ci": 1.0}, "ci must be in"),
        ([2, 4], [1.0, 2.0], {"n_boot": -1}, "n_boot"),
        ([2, 4], [1.0, 2.0], {"groups": [1]}, "groups must have length"),
    ],
)
def test_bad_input_is_a_one_line_value_error(n, y, kw, match):
    with pytest.raises(ValueError, match=match):
        fit_power_law(n, y, **kw)


def test_paper_curves_are_the_printed_hand_set_values():
    # the paper's figure labels, typed in by the authors (D7 of docs/experiments.md)
    assert paper_curve("BERT-enc L0", "Alice").c == 14.3
    assert paper_curve("BERT-enc L0", "Alice").alpha == 0.24
    assert paper_curve("GPT-2 L6", "Alice")(4.0) == pytest.approx(25.0 * 4.0**0.51)
    assert paper_curve("GPT-2-rand L6", "AG NEWS").alpha == 0.25
    assert paper_curve("BERT-enc L6", "Alice") is None  # the paper printed no curve there
    assert {PAPER_CURVES[k].alpha for k in PAPER_CURVES if k.endswith("adversarial")} == {0.5}
    assert all("hand-set" in c.as_dict()["source"] for c in PAPER_CURVES.values())
