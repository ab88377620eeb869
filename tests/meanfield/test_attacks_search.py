"""Worst-case searches: never below the constructions, exact values, engine brackets, options."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from meanfield import AttentionParams, DiracMeasure, MultiHeadParams
from meanfield.attacks import (
    split_constant,
    worst_case_measure,
    worst_case_sequence,
)

from ..oracles_attacks import F64, lw_norm, random_head, seq_norm
from ..tolerances import (
    BALL_PROJECTION,
    BRACKET_MARGIN,
    F64_LANCZOS,
    F64_TWO_JACOBIANS,
    SEARCH_START,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ----------------------------------------------------------------------------- searches
def _check_search(res, points: torch.Tensor, exact: float, R: float) -> None:
    """What every search result keeps: at least its constructions' value, the value the oracle
    gives at its own points (``exact``), and every point inside the ball of radius ``R``."""
    assert res.value >= res.construction_value * (1 - SEARCH_START)
    assert res.value == pytest.approx(exact, rel=F64_LANCZOS)
    assert torch.all(points.norm(dim=-1) <= R * (1 + BALL_PROJECTION))


def test_worst_case_measure_never_below_construction_and_exact(rng):
    A, V = random_head(rng, 2, scale=1.0)
    params = AttentionParams(A, V)
    res = worst_case_measure(params, 2.0, 3, n_restarts=4, steps=60)
    _check_search(res, res.measure.points, lw_norm(res.measure, A, V), 2.0)
    assert res.value >= res.two_dirac_bound * (1 - SEARCH_START)
    assert res.lower <= res.value * (1 + F64_LANCZOS) and res.value <= res.upper * (1 + F64_LANCZOS)
    assert res.history.shape[0] == len(res.labels) == res.restart_values.numel()
    assert float(res.restart_values.max()) == pytest.approx(res.value, rel=F64_LANCZOS)
    # steps=0: the constructions alone
    res0 = worst_case_measure(params, 2.0, 3, n_restarts=1, steps=0)
    assert res0.value >= res0.construction_value * (1 - SEARCH_START)


def test_worst_case_measure_paper_picture():
    # d = 1, A = 1: at R = 6 the maximiser is a few Diracs with masses over many decades
    params = AttentionParams(torch.tensor([[1.0]], dtype=F64), torch.tensor([[1.0]], dtype=F64))
    res = worst_case_measure(params, 6.0, 3, n_restarts=4, steps=80)
    log10 = res.measure.log_weights / math.log(10.0)
    assert float(log10.max() - log10.min()) > 10
    assert res.value > 1.3 * res.two_dirac_bound  # chains beat two atoms by a constant factor
    assert res.value == pytest.approx(lw_norm(res.measure, [[1.0]], [[1.0]]), rel=F64_LANCZOS)


def test_worst_case_measure_masked_sphere_split(rng):
    A, V = random_head(rng, 2)
    params = AttentionParams(A, V)
    m = worst_case_measure(params, 1.5, 3, n_restarts=2, steps=30, masked=True)
    assert m.measure.is_causal
    assert m.value == pytest.approx(lw_norm(m.measure, A, V, masked=True), rel=F64_LANCZOS)
    s = worst_case_measure(params, 1.5, 3, n_restarts=2, steps=30, sphere=True)
    assert torch.allclose(s.measure.points.norm(dim=-1), torch.full((3,), 1.5, dtype=F64))
    sp = worst_case_measure(params, 1.5, 3, n_restarts=2, steps=30, geometry="split")
    assert sp.value >= lw_norm(sp.measure, A, V) * (1 - BRACKET_MARGIN)
    assert sp.value == pytest.approx(
        float(split_constant(sp.measure, params, method="jacrev")), rel=F64_LANCZOS
    )
    with pytest.raises(ValueError):
        worst_case_measure(params, 1.5, 0)


def test_worst_case_sequence(rng):
    A, V = random_head(rng, 2, scale=1.5)
    params = AttentionParams(A, V)
    res = worst_case_sequence(params, 1.5, 5, n_restarts=3, steps=40)
    _check_search(res, res.X, seq_norm(res.X, A, V), 1.5)
    assert res.construction_value >= res.construction_bound * (1 - BRACKET_MARGIN)
    assert res.lower <= res.value * (1 + F64_LANCZOS) <= res.upper * (1 + 2 * F64_LANCZOS)


@pytest.mark.slow
def test_search_improves_on_two_diracs_across_radii():
    params = AttentionParams(torch.tensor([[1.0]], dtype=F64), torch.tensor([[1.0]], dtype=F64))
    for R in (1.0, 2.0, 4.0, 6.0, 8.0):
        res = worst_case_measure(params, R, 3, n_restarts=16, steps=300)
        assert res.value >= res.two_dirac_bound * (1 - SEARCH_START)
        assert res.value == pytest.approx(lw_norm(res.measure, [[1.0]], [[1.0]]), rel=F64_LANCZOS)


# ----------------------------------------------------------------------------- options, API
def _head(rng, d=2):
    A, V = random_head(rng, d, scale=2.0)
    return AttentionParams(A, V)


def test_search_options_are_keywords_with_the_search_defaults(rng):
    params = _head(rng)
    kw = worst_case_measure(params, 1.5, 3, n_restarts=3, steps=12, lr=0.07, seed=5, certify=False)
    again = worst_case_measure(
        params, 1.5, 3, n_restarts=3, steps=12, lr=0.07, seed=5, certify=False
    )
    assert kw.value == again.value and torch.equal(kw.restart_values, again.restart_values)
    # a keyword left out takes the search's default (seed 0, lr 0.05)
    defaults = worst_case_measure(params, 1.5, 3, n_restarts=3, steps=12, certify=False)
    explicit = worst_case_measure(
        params, 1.5, 3, n_restarts=3, steps=12, lr=0.05, seed=0, certify=False
    )
    assert defaults.value == explicit.value
    assert torch.equal(defaults.restart_values, explicit.restart_values)
    # one way in: no options object, one random source (the seed)
    with pytest.raises(TypeError, match="options"):
        worst_case_sequence(params, 1.5, 3, options={"steps": 3})
    with pytest.raises(TypeError, match="generator"):
        worst_case_measure(params, 1.5, 3, generator=torch.Generator().manual_seed(5))
    with pytest.raises(ValueError, match="non-negative"):
        worst_case_measure(params, 1.5, 3, steps=-1)


def test_the_number_of_atoms_is_n(rng):
    params = _head(rng)
    res = worst_case_measure(params, 1.2, n=2, n_restarts=1, steps=5, certify=False)
    assert res.measure.points.shape == (2, 2)
    with pytest.raises(TypeError, match="n_atoms"):  # its unreleased former name is gone
        worst_case_measure(params, 1.2, n_atoms=2)
    with pytest.raises(TypeError, match="'n'"):
        worst_case_measure(params, 1.2)


def test_masked_none_means_unmasked_for_searches(rng):
    params = _head(rng)
    a = worst_case_measure(params, 1.2, 3, n_restarts=2, steps=8, certify=False)
    b = worst_case_measure(params, 1.2, 3, n_restarts=2, steps=8, masked=False, certify=False)
    assert a.value == b.value and not a.measure.is_causal
    s1 = worst_case_sequence(params, 1.2, 3, n_restarts=1, steps=5, certify=False)
    s2 = worst_case_sequence(params, 1.2, 3, n_restarts=1, steps=5, masked=False, certify=False)
    assert s1.value == s2.value


# ----------------------------------------------------------------------------- the engine
@pytest.mark.parametrize("geometry", ["wasserstein", "split"])
@pytest.mark.parametrize("masked", [False, True])
def test_search_objective_equals_the_engine(rng, geometry, masked):
    """The differentiable objective the ascent climbs is the engine's dense local constant."""
    from meanfield import local_lipschitz
    from meanfield.attacks._common import measure_constant

    mh = MultiHeadParams.from_qkv(
        *(torch.tensor(rng.standard_normal((4, 4))) for _ in range(3)), n_heads=2
    )
    X = torch.tensor(rng.standard_normal((3, 4)))
    la = torch.log_softmax(torch.tensor(rng.standard_normal(3)) * 3, 0)
    pos = torch.arange(1, 4, dtype=F64) / 3 if masked else None
    mu = DiracMeasure.from_log_weights(X, la, pos)
    ours = float(
        measure_constant(X[None], la[None], mh, geometry=geometry, masked=masked, positions=pos)[0]
    )
    est = local_lipschitz(mu, mh, geometry=geometry, masked=masked, method="dense")
    assert ours == pytest.approx(float(est.value), rel=F64_TWO_JACOBIANS)
    assert float(est.lower) <= ours * (1 + F64_TWO_JACOBIANS) and ours <= float(est.upper) * (
        1 + F64_TWO_JACOBIANS
    )


def test_certify_propagates_errors_other_than_unsupported(rng, monkeypatch):
    """A bug in the engine is an error, not a warning with a silently weaker bracket."""
    from meanfield.attacks import _common

    params = _head(rng)

    def broken(*args, **kwargs):
        raise AttributeError("simulated bug")

    monkeypatch.setattr(_common, "local_lipschitz", broken)
    with pytest.raises(AttributeError, match="simulated bug"):
        worst_case_measure(params, 1.2, 2, n_restarts=1, steps=3)

    def unsupported(*args, **kwargs):
        raise NotImplementedError("not for rotary heads")

    monkeypatch.setattr(_common, "local_lipschitz", unsupported)
    with pytest.warns(UserWarning, match="rotary"):
        res = worst_case_measure(params, 1.2, 2, n_restarts=1, steps=3)
    assert res.bracket == "dense SVD" and res.lower == res.value == res.upper


@pytest.mark.parametrize("masked", [False, True])
def test_sequence_objective_equals_the_engine(rng, masked):
    from meanfield import local_lipschitz
    from meanfield.attacks._common import sequence_constant

    mh = MultiHeadParams.from_qkv(
        *(torch.tensor(rng.standard_normal((3, 3))) for _ in range(3)), n_heads=1
    )
    X = torch.tensor(rng.standard_normal((4, 3)))
    ours = float(sequence_constant(X[None], mh, masked=masked)[0])
    est = local_lipschitz(X, mh, masked=masked, method="dense")
    assert ours == pytest.approx(float(est.value), rel=F64_TWO_JACOBIANS)


@pytest.mark.parametrize("lr", [0.0, -0.05, math.nan, math.inf])
def test_a_step_size_that_is_not_positive_is_refused_in_one_line(lr):
    """``lr = 0`` used to run the searches without moving (and the L2 search silently took its
    default instead); a step size must be a positive number, checked when the options are made."""
    A, V = random_head(np.random.default_rng(0), 2)
    params = AttentionParams(A, V)
    for call in (
        lambda: worst_case_measure(params, 1.0, 3, n_restarts=0, steps=1, lr=lr),
        lambda: worst_case_sequence(params, 1.0, 3, n_restarts=0, steps=1, lr=lr),
    ):
        with pytest.raises(ValueError, match="lr must be a positive number") as err:
            call()
        assert "\n" not in str(err.value)
