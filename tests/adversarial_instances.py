"""Building blocks of the adversarial instances of tests/test_rigour.py and test_block_rounding.py.

Plain numpy arrays drawn from the caller's generator in a fixed order, so an instance stays a
deterministic function of its seed.
"""

from __future__ import annotations

import math

import numpy as np


def near_ties(rng: np.random.Generator, n: int, d: int, far: tuple, close: tuple) -> np.ndarray:
    """``n`` nearly equal tokens far from the origin, where ``x_j - m_i`` cancels.

    A centre of norm ~``10**u`` (``u`` uniform in ``far``) plus offsets smaller by ~``10**-v``
    relative (``v`` uniform in ``close``).
    """
    base = rng.standard_normal(d) * 10 ** rng.uniform(*far)
    return base + rng.standard_normal((n, d)) * 10 ** -rng.uniform(*close) * np.abs(base).max()


def spread_masses(rng: np.random.Generator, n: int, decades: float) -> np.ndarray:
    """``n`` masses on the simplex spread over up to ``decades`` decades below the largest."""
    logw = -rng.uniform(0, decades, size=n) * math.log(10)
    logw[rng.integers(n)] = 0.0
    w = np.exp(logw)
    return w / w.sum()
