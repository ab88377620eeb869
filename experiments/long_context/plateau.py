r"""The plateau rule of the ``long_context`` stage: the n from which the constant stops growing.

For the lengths :math:`n_1 < \dots < n_K` with several windows each, the fitted exponent
:math:`\alpha_m` over the lengths :math:`\ge m` is the least-squares slope of
:math:`\log L` against :math:`\log n` on **every window point** at those lengths (with the same
number of windows at each length this is the slope through the per-length means of
:math:`\log L`; the windows, not their medians, carry the spread the bootstrap resamples). Its
95 % interval is the percentile interval of ``n_boot`` bootstrap slopes, each from the windows
resampled with replacement **within each length** (the lengths are the design, the windows the
noise), with a generator seeded by ``seed`` afresh for every :math:`m`, so that each interval is
reproducible on its own.

The constant **has stopped growing from m on** when that interval contains 0; the plateau start
is the smallest such :math:`m` with at least ``min_lengths`` lengths :math:`\ge m`, or ``None``
("no plateau seen"). docs/long_context.md states the rule and its limits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = ["ExponentFit", "Plateau", "bootstrap_exponent", "fit_exponent", "plateau_start"]


@dataclass(frozen=True)
class ExponentFit:
    """The fitted exponent over the lengths ``>= m``, with its bootstrap interval.

    Attributes
    ----------
    m : int
        The smallest length of the fit.
    lengths : list of int
        The lengths used (each with its windows).
    points : int
        Window points in the fit.
    exponent : float
        Least-squares slope of log constant against log n.
    low, high : float
        The percentile bootstrap interval at ``level``.
    level : float
        Its confidence level (0.95).
    contains_zero : bool
        ``low <= 0 <= high``: the constant has stopped growing from ``m`` on.
    """

    m: int
    lengths: list[int]
    points: int
    exponent: float
    low: float
    high: float
    level: float
    contains_zero: bool

    def as_dict(self) -> dict[str, Any]:
        """Plain dictionary (JSON)."""
        return asdict(self)


@dataclass(frozen=True)
class Plateau:
    """The plateau rule's answer: its start ``m`` (``None``: no plateau seen) and every fit."""

    m: int | None
    fits: list[ExponentFit]
    n_boot: int
    seed: int
    min_lengths: int

    def as_dict(self) -> dict[str, Any]:
        """Plain dictionary (JSON)."""
        return {
            "m": self.m,
            "fits": [f.as_dict() for f in self.fits],
            "n_boot": self.n_boot,
            "seed": self.seed,
            "min_lengths": self.min_lengths,
        }


def _clean(n: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
    """The points with a finite positive constant, as float arrays (``n`` as integers)."""
    n_ = np.asarray(n, dtype=np.int64).ravel()
    y_ = np.asarray(y, dtype=float).ravel()
    if n_.shape != y_.shape:
        raise ValueError(f"n and y must have the same length, got {n_.size} and {y_.size}")
    keep = np.isfinite(y_) & (y_ > 0)
    return n_[keep], y_[keep]


def _slopes(x: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """Least-squares slopes of each row of ``Y`` against the common abscissae ``x``."""
    xc = x - x.mean()
    return ((Y - Y.mean(axis=-1, keepdims=True)) @ xc) / float(xc @ xc)


def fit_exponent(n: Sequence[int] | np.ndarray, y: Sequence[float] | np.ndarray) -> float:
    """Least-squares slope of ``log y`` against ``log n`` over every point (NaN: < 2 lengths)."""
    n_, y_ = _clean(n, y)
    if np.unique(n_).size < 2:
        return float("nan")
    return float(_slopes(np.log(n_.astype(float)), np.log(y_)[None, :])[0])


def bootstrap_exponent(
    n: Sequence[int] | np.ndarray,
    y: Sequence[float] | np.ndarray,
    *,
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float, float]:
    """The exponent of :func:`fit_exponent` and its percentile bootstrap interval.

    Each resample draws, at every length, as many windows as it has, with replacement from its
    own windows; the generator is ``numpy.random.default_rng(seed)``.

    Returns
    -------
    exponent, low, high : float
        NaN when fewer than two lengths have a finite positive constant.
    """
    n_, y_ = _clean(n, y)
    if np.unique(n_).size < 2:
        return float("nan"), float("nan"), float("nan")
    order = np.argsort(n_, kind="stable")
    n_, y_ = n_[order], np.log(y_[order])
    x = np.log(n_.astype(float))
    rng = np.random.default_rng(seed)
    idx = np.empty((int(n_boot), n_.size), dtype=np.int64)
    for length in np.unique(n_):
        (where,) = np.nonzero(n_ == length)
        idx[:, where] = rng.choice(where, size=(int(n_boot), where.size), replace=True)
    boot = _slopes(x, y_[idx])
    tail = 100.0 * (1.0 - level) / 2.0
    low, high = np.percentile(boot, [tail, 100.0 - tail])
    return float(_slopes(x, y_[None, :])[0]), float(low), float(high)


def plateau_start(
    n: Sequence[int] | np.ndarray,
    y: Sequence[float] | np.ndarray,
    *,
    min_lengths: int = 3,
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> Plateau:
    """The smallest length ``m`` from which the constant has stopped growing (module docstring).

    Parameters
    ----------
    n, y : array_like
        One point per window: its length and its constant (non-finite or non-positive
        constants are left out).
    min_lengths : int, default 3
        Lengths a fit needs at or beyond ``m``.
    n_boot, seed, level
        The bootstrap (:func:`bootstrap_exponent`).

    Returns
    -------
    Plateau
        ``m`` (``None``: no plateau seen) and the fit of every candidate ``m``, smallest first.
    """
    n_, y_ = _clean(n, y)
    lengths = [int(v) for v in np.unique(n_)]
    fits = []
    for i, m in enumerate(lengths):
        used = lengths[i:]
        if len(used) < int(min_lengths):
            break
        keep = n_ >= m
        alpha, low, high = bootstrap_exponent(
            n_[keep], y_[keep], n_boot=n_boot, seed=seed, level=level
        )
        fits.append(
            ExponentFit(
                m=m,
                lengths=used,
                points=int(keep.sum()),
                exponent=alpha,
                low=low,
                high=high,
                level=level,
                contains_zero=bool(low <= 0.0 <= high),
            )
        )
    start = next((f.m for f in fits if f.contains_zero), None)
    return Plateau(start, fits, int(n_boot), int(seed), int(min_lengths))
