"""Data-dependent bounds at one sequence (theory.bounds.local; docs/theory.md §2)."""

from __future__ import annotations

import numpy as np
import pytest

from theory import bounds as B

from ..oracles_bounds import (
    jacobian,
    spec,
)
from ..tolerances import F64_REWRITTEN


def test_released_quantity_formula_and_counterexample():
    val = B.released_data_dependent([1.0, 2.0], [0.5, 0.1], 2.0, 10)
    expect = 1.0 * np.sqrt(0.25 * 4 * 11 + 10) + 2.0 * np.sqrt(0.01 * 4 * 11 + 10)
    assert val == pytest.approx(expect, rel=F64_REWRITTEN)
    # docs/theory.md §2: A = e1 e2^T, tokens on the e2 axis: R_h = max ||A^T x_i|| = 0.
    A = np.array([[0.0, 1.0], [0.0, 0.0]])
    V = np.eye(2)
    X = np.array([[0.0, -3.0], [0.0, 3.0], [0.0, -3.0], [0.0, 3.0]])
    R_h = np.max(np.linalg.norm(X @ A, axis=1))  # rows x_i^T A = (A^T x_i)^T
    assert R_h == 0.0
    released = B.released_data_dependent(1.0, R_h, 6.0, 4)
    actual = spec(jacobian(X, A, V))
    assert actual > 2 * released  # not a valid upper bound
    assert actual <= B.sqrt_n_upper(spec(A), 1.0, 3.0, 4, form="triangle")
