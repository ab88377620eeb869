"""DiracMeasure: validation, constructors, split/merge, push-forward, batching."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings

from meanfield import DiracMeasure

from ..strategies import weighted_measure_data
from ..tolerances import F64_FEW_ULPS, F64_REDUCTION, F64_ZERO


def test_default_weights_are_uniform_in_points_dtype():
    X = torch.randn(5, 3, dtype=torch.float64)
    mu = DiracMeasure(X)
    assert mu.weights.dtype == torch.float64
    assert torch.equal(mu.weights, torch.full((5,), 0.2, dtype=torch.float64))
    assert (mu.n, mu.d, mu.positions) == (5, 3, None)


def test_integer_points_become_floating():
    mu = DiracMeasure([[0, 1], [2, 3]])
    assert mu.points.is_floating_point()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(points=torch.randn(3)), "points must have shape"),
        (dict(points=torch.randn(0, 2)), "at least one atom"),
        (dict(points=torch.tensor([[1.0, float("nan")]])), "points contains NaN"),
        (dict(points=torch.tensor([[1.0, float("inf")]])), "points contains infinite"),
        (dict(points=torch.randn(3, 2), weights=torch.ones(4) / 4), "weights must have shape"),
        (dict(points=torch.randn(2, 2), weights=torch.tensor([1.2, -0.2])), "non-negative"),
        (
            dict(points=torch.randn(2, 2), weights=torch.tensor([0.5, float("nan")])),
            "weights contains NaN",
        ),
        (dict(points=torch.randn(2, 2), weights=torch.tensor([0.5, 0.6])), "sum to 1"),
        (
            dict(points=torch.randn(2, 2), positions=torch.tensor([0.5])),
            "positions must have shape",
        ),
        (dict(points=torch.randn(2, 2), positions=torch.tensor([0.5, 1.5])), r"\[0, 1\]"),
        (dict(points=torch.randn(2, 2), positions=torch.tensor([-0.1, 0.5])), r"\[0, 1\]"),
    ],
)
def test_validation_errors_are_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as info:
        DiracMeasure(**kwargs)
    assert "\n" not in str(info.value)


def test_normalize_rescales_instead_of_rejecting():
    mu = DiracMeasure(
        torch.randn(3, 2, dtype=torch.float64), torch.tensor([1.0, 2.0, 1.0]), normalize=True
    )
    assert torch.allclose(mu.weights, torch.tensor([0.25, 0.5, 0.25], dtype=torch.float64))
    with pytest.raises(ValueError, match="sum to zero"):
        DiracMeasure(torch.randn(2, 2), torch.zeros(2), normalize=True)


def test_measure_is_frozen():
    mu = DiracMeasure(torch.randn(2, 2))
    with pytest.raises(AttributeError):
        mu.points = torch.zeros(2, 2)  # type: ignore[misc]


def test_from_sequence_causal_positions():
    X = torch.randn(2, 4, 3)
    mu = DiracMeasure.from_sequence(X, causal=True)
    assert mu.batch_shape == (2,)
    assert torch.allclose(mu.positions[1], torch.tensor([0.25, 0.5, 0.75, 1.0]))
    assert DiracMeasure.from_sequence(X).positions is None


@given(weighted_measure_data())
@settings(max_examples=30, deadline=None)
def test_split_then_merge_is_identity(data):
    X, a = data
    mu = DiracMeasure(X, a)
    i = int(torch.argmax(a))
    s = mu.split(i, 3)
    assert s.n == mu.n + 2
    assert math.isclose(float(s.weights.sum()), 1.0, rel_tol=0, abs_tol=F64_ZERO)
    # the copies are coincident and carry a third of the mass each
    assert torch.equal(s.points[i], s.points[i + 2])
    torch.testing.assert_close(s.weights[i : i + 3], a[i].expand(3) / 3)
    m = s.merge()
    assert m.n == mu.merge().n
    torch.testing.assert_close(m.weights.sort().values, mu.merge().weights.sort().values)


def test_split_with_fractions_and_positions():
    mu = DiracMeasure.from_sequence(torch.randn(3, 2, dtype=torch.float64), causal=True)
    s = mu.split(-1, 2, fractions=torch.tensor([0.25, 0.75]))
    assert torch.allclose(
        s.weights, torch.tensor([1 / 3, 1 / 3, 1 / 12, 1 / 4], dtype=torch.float64)
    )
    assert torch.equal(s.positions[-2:], mu.positions[-1].expand(2))
    with pytest.raises(ValueError, match="sum to 1"):
        mu.split(0, 2, fractions=torch.tensor([0.5, 0.6]))
    with pytest.raises(IndexError):
        mu.split(3, 2)
    with pytest.raises(ValueError, match="positive integer"):
        mu.split(0, 0)


def test_merge_sums_duplicates_in_order_of_first_occurrence():
    X = torch.tensor([[0.0, 1.0], [2.0, 0.0], [0.0, 1.0], [2.0, 1e-9]], dtype=torch.float64)
    mu = DiracMeasure(X, torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64))
    m = mu.merge()
    assert m.n == 3
    assert torch.allclose(m.weights, torch.tensor([0.4, 0.2, 0.4], dtype=torch.float64))
    assert mu.merge(atol=1e-6).n == 2


def test_merge_keeps_distinct_positions_apart():
    X = torch.zeros(2, 1)
    mu = DiracMeasure(X, positions=torch.tensor([0.5, 1.0]))
    assert mu.merge().n == 2


def test_push_forward_radius_and_mean():
    X = torch.tensor([[3.0, 4.0], [0.0, 1.0]], dtype=torch.float64)
    mu = DiracMeasure(X, torch.tensor([0.25, 0.75], dtype=torch.float64))
    assert float(mu.radius()) == 5.0
    assert math.isclose(float(mu.rms_radius()), math.sqrt(0.25 * 25 + 0.75), rel_tol=F64_FEW_ULPS)
    assert torch.allclose(mu.mean(), torch.tensor([0.75, 1.75], dtype=torch.float64))
    nu = mu.push_forward(lambda P: 2 * P)
    assert torch.equal(nu.points, 2 * X) and torch.equal(nu.weights, mu.weights)


def test_radius_ignores_zero_mass_atoms():
    mu = DiracMeasure(torch.tensor([[10.0], [1.0]]), torch.tensor([0.0, 1.0]))
    assert float(mu.radius()) == 1.0


def test_batched_measure_indexing():
    mu = DiracMeasure(torch.randn(4, 3, 2), torch.full((4, 3), 1 / 3))
    assert mu[1].batch_shape == () and mu[1:3].batch_shape == (2,)
    with pytest.raises(ValueError, match="single measure"):
        mu.split(0, 2)


def test_dtype_conversion():
    mu = DiracMeasure(torch.randn(3, 2, dtype=torch.float64), causal_positions := None)
    m32 = mu.to(torch.float32)
    assert m32.points.dtype == m32.weights.dtype == torch.float32
    assert causal_positions is None


def test_from_log_weights_keeps_masses_below_the_float_range():
    X = torch.tensor([[0.0], [1.0], [2.0]], dtype=torch.float64)
    log_a = torch.tensor([0.0, -800.0, -1000.0], dtype=torch.float64)  # e^-800 underflows to 0
    mu = DiracMeasure.from_log_weights(X, log_a)
    assert mu.weights[1] == 0 and mu.weights[2] == 0
    torch.testing.assert_close(
        mu.log_weights, log_a - torch.logsumexp(log_a, 0), rtol=0, atol=F64_REDUCTION
    )
    with pytest.raises(ValueError, match="NaN"):
        DiracMeasure.from_log_weights(X, torch.tensor([0.0, float("nan"), 0.0]))
