r"""Mass splitting: gain of the duplicate-then-move attack and its optimal copy count.

:func:`split_gain`, :func:`split_gain_general` and :func:`optimal_split_k` (docs/theory.md §10).
These are the only implementations: the library, the experiments and the command line call them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from theory.bounds._common import as_result, checked_float, checked_norm, log_expit, quiet_log

# ---------------------------------------------------------------------------------------------
# mass splitting
# ---------------------------------------------------------------------------------------------


def _split_log_g2(k: NDArray[np.float64], s_y: NDArray, s_z: NDArray) -> NDArray[np.float64]:
    """Return log G_k^2 with exponents s_y (query y) and s_z (query z)."""
    log_m = quiet_log(k - 1.0)
    log_wy = log_expit(s_y - log_m)
    log_wz = log_expit(s_z - log_m)
    return np.logaddexp(log_m + 2.0 * log_wy, 2.0 * log_wz)


def split_gain(k: ArrayLike, s: ArrayLike) -> Any:
    r"""Gain :math:`G_k` of the duplicate-then-move attack at a Dirac (docs/theory.md §10).

    .. math:: \frac{W_2(F\mu, F\nu)}{W_2(\mu, \nu)} = \frac{\|V\delta\|}{\|\delta\|}\,G_k,\qquad
              G_k = \sqrt{(k - 1)w_y^2 + w_z^2},\quad w_y = \frac{e^s}{k - 1 + e^s},\quad
              w_z = \frac{e^{2s}}{k - 1 + e^{2s}},

    for :math:`\mu = \delta_y`, :math:`y = \frac R2u`, :math:`k` copies of which one moves to
    :math:`z = Ru`; :math:`s = \lambda R^2/4`, :math:`\lambda = u^\top Au`.

    Parameters
    ----------
    k : array_like
        Number of copies :math:`k \ge 1` (real values allowed for curves).
    s : array_like
        Exponent :math:`s` (any real; :math:`s = \lambda R^2/4 > 0` in the setup).

    Returns
    -------
    numpy.float64 or numpy.ndarray
        :math:`G_k` (:math:`G_1 = 1`; :math:`\approx\sqrt k` for :math:`k \ll e^s`; peak
        :math:`\approx e^{s/2}/2` near :math:`k - 1 = e^s`).

    Notes
    -----
    Computed in the log domain (:math:`w = \sigma(s - \log(k - 1))`). Provenance: the phenomenon is
    *stated in the paper (abstract)* of v1; the closed form is *derived and checked numerically*
    (exact :math:`W_2`); v1's exact theorem is *unknown*.
    """
    k_ = checked_float(k, "k", min_value=1.0)
    s_ = checked_float(s, "s")
    return as_result(np.exp(0.5 * _split_log_g2(k_, s_, 2.0 * s_)))


def split_gain_general(k: ArrayLike, r: ArrayLike, R: ArrayLike, lam: ArrayLike) -> Any:
    r"""Gain :math:`G_k` with the Dirac at :math:`y = ru` and the moved copy at :math:`z = Ru`.

    The exponents become :math:`s_y = \lambda r(R - r)` (query :math:`y`) and
    :math:`s_z = \lambda R(R - r)` (query :math:`z`):
    :math:`G_k = \sqrt{(k - 1)\sigma(s_y - \log(k - 1))^2 + \sigma(s_z - \log(k - 1))^2}`.
    :math:`r = R/2` recovers :func:`split_gain` with :math:`s = \lambda R^2/4`.

    Parameters
    ----------
    k : array_like
        Copies :math:`k \ge 1`.
    r : array_like
        Position of the Dirac along :math:`u`, :math:`|r| \le R`, :math:`r \ne R`.
    R : array_like
        Radius (position of the moved copy).
    lam : array_like
        :math:`\lambda = u^\top Au`.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        :math:`G_k`.

    Notes
    -----
    docs/theory.md §10 ("General position"). Provenance: *derived and checked numerically*.
    """
    k_ = checked_float(k, "k", min_value=1.0)
    r_ = checked_float(r, "r")
    R_ = checked_norm(R, "R")
    lam_ = checked_float(lam, "lam")
    if (np.abs(r_) > R_).any():
        raise ValueError("need |r| <= R (both points in the ball)")
    if (r_ == R_).any():
        raise ValueError("r = R gives a zero displacement")
    return as_result(np.exp(0.5 * _split_log_g2(k_, lam_ * r_ * (R_ - r_), lam_ * R_ * (R_ - r_))))


def optimal_split_k(s: ArrayLike) -> Any:
    r"""Integer number of copies :math:`k \ge 1` maximising :func:`split_gain` (docs/theory.md §10).

    Parameters
    ----------
    s : array_like
        Exponent :math:`s` (real).

    Returns
    -------
    numpy.float64 or numpy.ndarray
        The maximiser as a float: an exact integer while :math:`e^s < 2^{52}`; beyond, the float
        nearest the continuous maximiser (neighbouring integers give gains equal to float
        precision); ``inf`` once :math:`e^s` overflows (:math:`s > 709.78`).

    Notes
    -----
    With :math:`m = k - 1` and :math:`E = e^s`, :math:`G^2(m) = mE^2/(m + E)^2 + E^4/(m + E^2)^2`.

    * For :math:`E \le \sqrt2` (:math:`s \le \frac12\log 2`), :math:`k = 1`: :math:`G^2(0) = 1`
      while for
      :math:`m \ge 1`, :math:`G^2(m) \le E/4 + E^4/(1 + E^2)^2 < 1`.
    * For :math:`E > \sqrt2`, :math:`\partial_mG^2 = 0` iff
      :math:`\chi(m) = \log(E - m) + 3\log(m + E^2) - \log 2 - 2\log E - 3\log(m + E) = 0`;
      :math:`\chi` decreases on :math:`[0, E)` (:math:`E \ge 1`), with
      :math:`\chi(0) = \log(E^2/2) > 0`,
      and :math:`\partial_mG^2 < 0` for :math:`m > E`, so :math:`G^2` is unimodal with a unique
      maximiser
      :math:`m^* = E - \delta`, :math:`\delta \approx 16/E` for large :math:`E`. :math:`\delta` is
      found by
      bisection on :math:`\log\delta` (full relative precision), then the integers next to
      :math:`1 + m^*` are compared.

    Provenance: *derived and checked numerically* (ours; brute force in the tests).
    """
    s_ = checked_float(s, "s")
    s1 = np.atleast_1d(s_).ravel()
    out = np.ones_like(s1)
    act = s1 > 0.5 * np.log(2.0)
    if act.any():
        sa = s1[act]

        def phi(log_d: NDArray[np.float64]) -> NDArray[np.float64]:
            return (
                log_d
                + sa
                + 3.0 * np.log1p(np.exp(-sa) - np.exp(log_d - 2.0 * sa))
                - np.log(2.0)
                - 3.0 * np.log(2.0 - np.exp(log_d - sa))
            )

        lo = -2.0 * sa - 50.0  # phi(lo) < 0
        hi = sa.copy()  # delta = E, i.e. m = 0: phi > 0
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            neg = phi(mid) < 0
            lo = np.where(neg, mid, lo)
            hi = np.where(neg, hi, mid)
        log_d = 0.5 * (lo + hi)
        with np.errstate(over="ignore"):
            k_cont = 1.0 + np.exp(sa) * (-np.expm1(log_d - sa))
        best_k = np.ones_like(sa)
        best_val = _split_log_g2(best_k, sa, 2.0 * sa)
        for cand in (np.floor(k_cont), np.ceil(k_cont)):
            cand = np.maximum(cand, 1.0)
            with np.errstate(invalid="ignore"):
                val = _split_log_g2(cand, sa, 2.0 * sa)
            better = (val > best_val) | np.isinf(cand)
            best_k = np.where(better, cand, best_k)
            best_val = np.where(better, val, best_val)
        out[act] = best_k
    return as_result(out.reshape(s_.shape))
