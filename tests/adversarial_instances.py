"""Building blocks of the adversarial instances of tests/meanfield/test_rigour.py and test_block_rounding.py.

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


def balanced_extremes(
    rng: np.random.Generator, V: np.ndarray, W: np.ndarray, decades: tuple = (100, 300)
) -> tuple[np.ndarray, np.ndarray]:
    """``V * 10**t`` and ``W * 10**-t`` with ``|t|`` uniform in ``decades`` and a random sign.

    Each factor alone is extreme (up to ``1e±300``) while the product ``W V``, which is all the
    layer depends on, stays moderate: the block certificate must not square either factor
    (docs/rounding.md §5).
    """
    t = rng.uniform(*decades) * (1.0 if rng.integers(2) else -1.0)
    return V * 10.0**t, W * 10.0**-t
