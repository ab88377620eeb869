r"""Power-law fits :math:`y \approx c\,n^{\alpha}` with bootstrap intervals, and the paper's curves.

The paper's real-data figures overlay curves such as :math:`14.3\,n^{0.24}`; every one of them is
typed into the released plotting scripts by hand, none is a regression (docs/experiments.md, D7).
This module fits the exponent instead:

.. math:: \log y_i = \log c + \alpha \log n_i + \varepsilon_i

by ordinary least squares over every measured window, and attaches a percentile bootstrap
interval obtained by resampling the windows *within* each sequence length (the paper's "10
sequences per even n", docs/experiments.md): each bootstrap replicate keeps the design (the set
of n values and the number of windows per n) and redraws, with replacement, which windows of a
given n enter the fit. :data:`PAPER_CURVES` holds the hand-set curves as data, for comparison
only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

__all__ = [
    "PAPER_CURVES",
    "PAPER_OWN_MODELS",
    "PaperCurve",
    "PowerLawFit",
    "fit_power_law",
    "paper_curve",
]


@dataclass(frozen=True)
class PowerLawFit:
    r"""Least-squares power law :math:`y = c\,n^{\alpha}` fitted in log–log coordinates.

    Attributes
    ----------
    alpha : float
        Exponent (slope in log–log).
    c : float
        Prefactor :math:`e^{\text{intercept}}`.
    alpha_ci, c_ci : tuple of float
        Percentile bootstrap interval at level ``ci`` (``(nan, nan)`` when ``n_boot = 0``).
    n_points : int
        Number of (n, y) pairs used.
    r2 : float
        Coefficient of determination of the log–log regression.
    ci : float
        Confidence level of the intervals.
    n_boot : int
        Bootstrap replicates.
    """

    alpha: float
    c: float
    alpha_ci: tuple[float, float]
    c_ci: tuple[float, float]
    n_points: int
    r2: float
    ci: float = 0.95
    n_boot: int = 0

    def __call__(self, n: Any) -> np.ndarray:
        r"""Evaluate :math:`c\,n^{\alpha}`."""
        return self.c * np.asarray(n, dtype=float) ** self.alpha

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-able dictionary (tuples become lists)."""
        return {**asdict(self), "alpha_ci": list(self.alpha_ci), "c_ci": list(self.c_ci)}


def _ols(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Slope and intercept of y on x along the last axis (vectorized over leading axes)."""
    xm = x.mean(-1, keepdims=True)
    ym = y.mean(-1, keepdims=True)
    dx = x - xm
    slope = (dx * (y - ym)).sum(-1) / (dx * dx).sum(-1)
    intercept = ym[..., 0] - slope * xm[..., 0]
    return slope, intercept


def fit_power_law(
    n: Any,
    y: Any,
    *,
    groups: Any = None,
    n_boot: int = 2000,
    seed: int = 0,
    ci: float = 0.95,
) -> PowerLawFit:
    r"""Fit :math:`y = c\,n^{\alpha}` by least squares in log–log, with a stratified bootstrap.

    Parameters
    ----------
    n : array_like, shape (N,)
        Sequence lengths (positive), one entry per observation (repeat ``n`` for each window).
    y : array_like, shape (N,)
        Positive finite values (a local Lipschitz constant, the released metric, a radius).
    groups : array_like, shape (N,), optional
        Resampling strata: the bootstrap redraws observations with replacement *within* each
        group. Default: one group per distinct ``n`` (the windows of one sequence length). When
        every group holds a single observation the bootstrap resamples the (n, y) pairs
        globally instead (an ordinary pairs bootstrap), since within-group resampling would be
        degenerate.
    n_boot : int, default 2000
        Bootstrap replicates; ``0`` skips the bootstrap (intervals are ``(nan, nan)``).
        Replicates whose resampled design has a single distinct ``n`` (only possible in the
        pairs bootstrap) are discarded.
    seed : int, default 0
        Seed of the bootstrap (:func:`numpy.random.default_rng`).
    ci : float, default 0.95
        Level of the percentile intervals.

    Returns
    -------
    PowerLawFit

    Raises
    ------
    ValueError
        On mismatched shapes, non-positive or non-finite values, fewer than two distinct ``n``,
        ``ci`` outside (0, 1) or a negative ``n_boot``.
    """
    n_arr = np.asarray(n, dtype=float).ravel()
    y_arr = np.asarray(y, dtype=float).ravel()
    if n_arr.shape != y_arr.shape:
        raise ValueError(f"n and y must have the same length, got {n_arr.size} and {y_arr.size}")
    if not (np.all(np.isfinite(n_arr)) and np.all(n_arr > 0)):
        raise ValueError("n must be positive and finite")
    if not (np.all(np.isfinite(y_arr)) and np.all(y_arr > 0)):
        raise ValueError("y must be positive and finite (a power law is fitted to log y)")
    if np.unique(n_arr).size < 2:
        raise ValueError("a power-law fit needs at least two distinct values of n")
    if not 0.0 < float(ci) < 1.0:
        raise ValueError(f"ci must be in (0, 1), got {ci}")
    n_boot = int(n_boot)
    if n_boot < 0:
        raise ValueError(f"n_boot must be >= 0, got {n_boot}")
    g_arr = n_arr if groups is None else np.asarray(groups).ravel()
    if g_arr.shape != n_arr.shape:
        raise ValueError(f"groups must have length {n_arr.size}, got {g_arr.size}")

    x, ly = np.log(n_arr), np.log(y_arr)
    slope, intercept = _ols(x, ly)
    resid = ly - (intercept + slope * x)
    sst = float(((ly - ly.mean()) ** 2).sum())
    r2 = 1.0 - float((resid**2).sum()) / sst if sst > 0 else 1.0

    alpha_ci = c_ci = (float("nan"), float("nan"))
    if n_boot > 0:
        rng = np.random.default_rng(seed)
        _, inverse = np.unique(g_arr, return_inverse=True)
        members = [np.flatnonzero(inverse == k) for k in range(inverse.max() + 1)]
        if all(m.size == 1 for m in members):
            idx = rng.integers(0, n_arr.size, size=(n_boot, n_arr.size))
        else:
            idx = np.concatenate(
                [m[rng.integers(0, m.size, size=(n_boot, m.size))] for m in members], axis=1
            )
        xb, yb = x[idx], ly[idx]
        keep = np.ptp(xb, axis=1) > 0
        sb, ib = _ols(xb[keep], yb[keep])
        q = [50 * (1 - ci), 50 * (1 + ci)]
        lo, hi = np.percentile(sb, q)
        clo, chi = np.exp(np.percentile(ib, q))
        alpha_ci, c_ci = (float(lo), float(hi)), (float(clo), float(chi))
    return PowerLawFit(
        alpha=float(slope),
        c=float(np.exp(intercept)),
        alpha_ci=alpha_ci,
        c_ci=c_ci,
        n_points=int(n_arr.size),
        r2=r2,
        ci=float(ci),
        n_boot=n_boot,
    )


@dataclass(frozen=True)
class PaperCurve:
    r"""A curve :math:`c\,n^{\alpha}` printed in the paper's figures, **hand-set** (D7).

    Attributes
    ----------
    configuration : str
        The paper's configuration (docs/experiments.md ids), e.g. ``"BERT-enc L0"``.
    corpus : str
        ``"Alice"``, ``"AG NEWS"`` or ``"adversarial"``.
    c, alpha : float
        The printed constant and exponent, typed into the released plotting scripts.
    label : str
        The legend the paper used, where known.
    note : str
        Caveats (filters, what the y-axis measured).
    """

    configuration: str
    corpus: str
    c: float
    alpha: float
    label: str = ""
    note: str = ""

    @property
    def key(self) -> str:
        """``"<configuration> <corpus>"``, the key in :data:`PAPER_CURVES`."""
        return f"{self.configuration} {self.corpus}"

    def __call__(self, n: Any) -> np.ndarray:
        r"""Evaluate :math:`c\,n^{\alpha}`."""
        return self.c * np.asarray(n, dtype=float) ** self.alpha

    def as_dict(self) -> dict[str, Any]:
        """Plain dictionary, with ``source`` saying these are hand-set curves."""
        return {**asdict(self), "key": self.key, "source": "paper, hand-set in the plots (D7)"}


_Y = "y-axis is the released metric sqrt(||J^T f||), not ||J||_2 (D1)"
_RANDOM_GPT2 = f"points <= 0.1 dropped; dropout on (D4); {_Y}"
_RADIUS_DRIFT = f"related by the paper to a radius drift with n (F3), unverified; {_Y}"
_CURVES = (
    PaperCurve("BERT-enc L0", "Alice", 14.3, 0.24, "cn^{1/4}", _Y),
    PaperCurve("BERT-dec L6", "Alice", 6.44, 0.25, "cn^{1/4}", f"map not masked (D3); {_Y}"),
    PaperCurve("GPT-2 L0", "Alice", 35.3, 0.26, "", _Y),
    PaperCurve("GPT-2 L6", "Alice", 25.0, 0.51, "", _RADIUS_DRIFT),
    PaperCurve("GPT-2-rand L6", "Alice", 0.445, 0.25, "", _RANDOM_GPT2),
    PaperCurve("GPT-2-rand L6", "AG NEWS", 0.445, 0.25, "", _RANDOM_GPT2),
    PaperCurve("BERT-enc L0", "adversarial", 4.39, 0.5, "Cn^{1/2}", "head 0, R = 15.5"),
    PaperCurve("BERT-dec L6", "adversarial", 5.73, 0.5, "Cn^{1/2}", "head 7, R = 21.5"),
    PaperCurve("GPT-2-rand L6", "adversarial", 0.92, 0.5, "Cn^{1/2}", "head 0, R = 100"),
    PaperCurve("GPT-2 L0", "adversarial", 46.9, 0.5, "Cn^{1/2}", "head slicing wrong (D5), R = 10"),
)

#: The curves printed in the paper's figures (docs/experiments.md), keyed by
#: ``"<configuration> <corpus>"``. **Hand-set constants typed into the released plotting
#: scripts, not regressions (D7)**; the real-data ones are curves through the released metric
#: (D1). For comparison only, never as reference values.
PAPER_CURVES: Mapping[str, PaperCurve] = MappingProxyType({c.key: c for c in _CURVES})


#: Model keys that are the paper's own model (same architecture and initialisation recipe,
#: another seed), not a stand-in: their rows can reproduce the paper's numbers.
PAPER_OWN_MODELS: Mapping[str, str] = MappingProxyType({"gpt2-random": "GPT-2-rand"})


def paper_curve(configuration: str, corpus: str) -> PaperCurve | None:
    """The paper's printed curve for a configuration and corpus, or ``None`` when it printed none.

    Parameters
    ----------
    configuration : str
        E.g. ``"GPT-2 L6"``.
    corpus : str
        ``"Alice"``, ``"AG NEWS"`` or ``"adversarial"``.
    """
    return PAPER_CURVES.get(f"{configuration} {corpus}")
