"""Hypothesis strategies for measures, parameters and sequences inside a ball."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st


@st.composite
def seeds(draw) -> int:
    return draw(st.integers(min_value=0, max_value=2**31 - 1))


@st.composite
def weighted_measure_data(draw, *, max_n: int = 7, max_d: int = 4, radius: float = 3.0):
    """(points (n, d), weights (n,) on the simplex, d) in float64, points in B_radius."""
    n = draw(st.integers(1, max_n))
    d = draw(st.integers(1, max_d))
    rng = np.random.default_rng(draw(seeds()))
    X = rng.standard_normal((n, d))
    X *= (
        radius
        * rng.uniform(0, 1, (n, 1))
        / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-12)
    )
    # log-uniform masses over many decades, as worst-case measures have
    log_a = rng.uniform(-30, 0, n)
    a = np.exp(log_a - log_a.max())
    a /= a.sum()
    return torch.from_numpy(X), torch.from_numpy(a)


@st.composite
def head_data(draw, d: int, *, scale: float = 1.0):
    """A non-symmetric score matrix A (d, d) and a value matrix V (d_v, d), float64."""
    rng = np.random.default_rng(draw(seeds()))
    d_v = draw(st.integers(1, 4))
    A = scale * rng.standard_normal((d, d)) / np.sqrt(d)
    V = rng.standard_normal((d_v, d)) / np.sqrt(d)
    return torch.from_numpy(A), torch.from_numpy(V)
