"""Large-radius limit and its deviation bound (theory.bounds.large_radius; docs/theory.md §7)."""

from __future__ import annotations

import numpy as np
import pytest

from theory import bounds as B

from ..oracles_bounds import (
    jacobian,
    random_ball,
    spec,
)
from ..tolerances import F64_LARGE_RADIUS_REL, F64_ZERO


def test_large_radius_counts_and_limit_forms():
    lim = B.large_radius_limit([[1, 2, 0], [3, 0, 0]], [1.0, 2.0])
    np.testing.assert_allclose(lim, [np.sqrt(2), 2 * np.sqrt(3)])
    assert B.large_radius_limit([0, 0, 1, 2], 1.5, kind="argmax") == pytest.approx(1.5 * np.sqrt(2))
    with pytest.raises(ValueError):
        B.large_radius_limit([0, 4], 1.0, kind="argmax")
    with pytest.raises(ValueError):
        B.large_radius_limit([-1, 2], 1.0)


@pytest.mark.parametrize("masked", [False, True])
def test_local_constant_converges_to_hard_max_limit(rng, masked):
    d, n = 3, 6
    A = rng.normal(size=(d, d))
    V = rng.normal(size=(2, d))
    X = random_ball(rng, n, d, 1.0)
    counts = B.large_radius_counts(X, A, masked=masked)
    limit = B.large_radius_limit(counts, spec(V))
    devs = []
    for R in (1.0, 3.0, 10.0, 30.0):
        XR = R * X
        local = spec(jacobian(XR, A, V, masked=masked))
        gap = B.selection_gap(XR, A, masked=masked)
        dev = B.large_radius_deviation(gap, n, spec(A), spec(V), np.max(np.linalg.norm(XR, axis=1)))
        assert abs(local - limit) <= dev * (1 + F64_LARGE_RADIUS_REL) + F64_ZERO
        devs.append(abs(local - limit))
    assert devs[-1] < 1e-8
    assert limit <= np.sqrt(n) * spec(V)
