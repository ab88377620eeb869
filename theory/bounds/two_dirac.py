r"""Two unbalanced Diracs and the off-axis two-atom bound (docs/theory.md §5).

:func:`two_dirac_log_g`, :func:`two_dirac_g`, the exact optimum :func:`two_dirac_optimal_mass`,
:func:`two_dirac_lower`, :func:`two_dirac_half`, :func:`two_dirac_asymptote` and
:func:`off_axis_two_atom`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from theory.bounds._common import (
    as_result,
    checked_float,
    checked_norm,
    exp_or_log,
    log1mexp,
    log_expit,
    quiet_log,
)

#: Coefficient of the two-Dirac asymptote, 3*sqrt(3)/16 (docs/theory.md §5).
ASYMPTOTE_COEFF = 3.0 * np.sqrt(3.0) / 16.0


# ---------------------------------------------------------------------------------------------
# two unbalanced Diracs
# ---------------------------------------------------------------------------------------------


def two_dirac_log_g(log_eps: ArrayLike, gamma: ArrayLike, Vu_norm: ArrayLike = 1.0) -> Any:
    r"""Natural log of the two-Dirac function :math:`g(\varepsilon)`, from :math:`\log\varepsilon`.

    See :func:`two_dirac_g`. Taking :math:`\log\varepsilon` lets the light mass go far below the
    smallest float64 (the optimum has :math:`\varepsilon^* \approx e^{-\gamma}/3`).

    Parameters
    ----------
    log_eps : array_like
        :math:`\log\varepsilon < 0`.
    gamma : array_like
        Gap :math:`\gamma \ge 0`.
    Vu_norm : array_like
        :math:`\|Vu\|_2`.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        :math:`\log g(\varepsilon)`.

    Notes
    -----
    docs/theory.md §5; provenance as in :func:`two_dirac_g`.
    """
    le = checked_float(log_eps, "log_eps", allow_inf=True)
    if (le >= 0).any() or (le == -np.inf).any():
        raise ValueError("log_eps must be finite and < 0 (eps in (0, 1))")
    g = checked_float(gamma, "gamma", min_value=0.0)
    Vu = checked_norm(Vu_norm, "Vu_norm")
    log_1m = log1mexp(le)
    a = le + g
    lse = np.logaddexp(a, log_1m)
    log_w = a - lse
    log_v = log_1m - lse
    return as_result(0.5 * (log_1m - le) + log_w + np.log1p(np.exp(log_v) * g) + quiet_log(Vu))


def two_dirac_g(
    eps: ArrayLike, gamma: ArrayLike, Vu_norm: ArrayLike = 1.0, *, log: bool = False
) -> Any:
    r"""Two-Dirac lower bound at light mass :math:`\varepsilon` (docs/theory.md §5).

    For :math:`\mu_\varepsilon = (1 - \varepsilon)\delta_{x_0} + \varepsilon\delta_{x_1}` (heavy
    :math:`x_0`, light :math:`x_1`; positions of docs/theory.md §3) and moving the light atom along
    :math:`u`:

    .. math:: g(\varepsilon) = \sqrt{\tfrac{1 - \varepsilon}{\varepsilon}}\,w\,\big(1 + (1 -
    w)\gamma\big)\|Vu\|_2
              = e^{\gamma/2}\sqrt{w(1 - w)}\,\big(1 + (1 - w)\gamma\big)\|Vu\|_2,\qquad
              w = \frac{\varepsilon e^\gamma}{\varepsilon e^\gamma + 1 - \varepsilon},

    and :math:`\mathrm{Lip}(F\,|\,\mathcal P(B_R)) \ge g(\varepsilon)` for every
    :math:`\varepsilon \in (0, 1)`.

    Parameters
    ----------
    eps : array_like
        Light mass, :math:`0 < \varepsilon < 1` (down to the smallest subnormal; for smaller
        masses use :func:`two_dirac_log_g`).
    gamma : array_like
        Gap :math:`\gamma \ge 0` (:math:`\lambda R^2/4` in case +, :math:`2|\lambda|R^2` in case −).
    Vu_norm : array_like
        :math:`\|Vu\|_2`.
    log : bool
        Return :math:`\log g`.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        :math:`g(\varepsilon)`, computed in the log domain.

    Notes
    -----
    Provenance: the mechanism (a few Diracs with very unbalanced masses) is *stated in the paper
    (abstract)* of v1; the construction is *from the authors' released code*; the formula is
    *derived and checked numerically*.
    """
    e = checked_float(eps, "eps")
    if ((e <= 0) | (e >= 1)).any():
        raise ValueError("eps must lie in the open interval (0, 1)")
    return exp_or_log(np.asarray(two_dirac_log_g(np.log(e), gamma, Vu_norm)), log)


@dataclass(frozen=True)
class TwoDiracOptimum:
    r"""Optimal mass of the two-Dirac construction (docs/theory.md §5).

    Attributes
    ----------
    v : array
        :math:`v^* = 1 - w^*`, root in :math:`(0, 1)` of
        :math:`4\gamma v^2 - (3\gamma - 2)v - 1 = 0`.
    w : array
        :math:`w^*`, the attention the heavy atom pays to the light one.
    eps : array
        :math:`\varepsilon^*` (underflows to 0 for :math:`\gamma \gtrsim 745`; use ``log_eps``).
    log_eps : array
        :math:`\log\varepsilon^* = \log\sigma(\log(w^*/v^*) - \gamma)`.
    """

    v: Any
    w: Any
    eps: Any
    log_eps: Any


def two_dirac_optimal_mass(gamma: ArrayLike) -> TwoDiracOptimum:
    r"""Exact maximiser of :math:`g` over the light mass (docs/theory.md §5).

    Maximising :math:`e^\gamma v(1 - v)(1 + \gamma v)^2` over :math:`v = 1 - w` gives the quadratic
    :math:`4\gamma v^2 - (3\gamma - 2)v - 1 = 0`, whose root in :math:`(0, 1)` is

    .. math:: v^* = \frac{(3\gamma - 2) + \sqrt{9\gamma^2 + 4\gamma + 4}}{8\gamma}
              = \frac{2}{\sqrt{9\gamma^2 + 4\gamma + 4} + 2 - 3\gamma},\qquad
              \varepsilon^* = \frac{(w^*/v^*)e^{-\gamma}}{1 + (w^*/v^*)e^{-\gamma}} .

    Parameters
    ----------
    gamma : array_like
        Gap :math:`\gamma \ge 0` (:math:`\gamma = 0` gives :math:`v^* = 1/2`).

    Returns
    -------
    TwoDiracOptimum
        ``v``, ``w``, ``eps`` and ``log_eps``.

    Notes
    -----
    The first form of :math:`v^*` is used for :math:`3\gamma \ge 2` and the second (no
    cancellation) below. :math:`v^* \to 1/2` as :math:`\gamma \to 0`, :math:`v^* \to 3/4` and
    :math:`\varepsilon^*e^\gamma \to 1/3` as :math:`\gamma \to \infty`. The optimum is algebraic,
    not
    Lambert W. Provenance: *derived and checked numerically* (and symbolically in
    :func:`theory.symbolic.two_dirac_optimal_mass`).
    """
    g = checked_float(gamma, "gamma", min_value=0.0)
    disc = np.sqrt(9.0 * g**2 + 4.0 * g + 4.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        v_big = ((3.0 * g - 2.0) + disc) / (8.0 * g)
    v_small = 2.0 / (disc + 2.0 - 3.0 * g)
    v = np.where(3.0 * g >= 2.0, v_big, v_small)
    w = 1.0 - v
    log_eps = log_expit(np.log(w / v) - g)
    return TwoDiracOptimum(
        v=as_result(v), w=as_result(w), eps=as_result(np.exp(log_eps)), log_eps=as_result(log_eps)
    )


def log_sup_g(g: NDArray[np.float64]) -> NDArray[np.float64]:
    r""":math:`\log\sup_\varepsilon g(\varepsilon)` at :math:`\|Vu\|_2 = 1`, for validated gaps ``g``.

    The log of :func:`two_dirac_lower` without its ``Vu_norm`` factor (docs/theory.md §5); shared
    with :mod:`theory.bounds.mean_field` and :mod:`theory.bounds.inversions`.
    """
    v = np.asarray(two_dirac_optimal_mass(g).v)
    return g / 2.0 + 0.5 * (np.log(v) + np.log1p(-v)) + np.log1p(g * v)


def two_dirac_lower(
    gamma: ArrayLike,
    Vu_norm: ArrayLike = 1.0,
    *,
    eps: ArrayLike | None = None,
    log: bool = False,
) -> Any:
    r"""Two-Dirac lower bound on the mean-field constant, at the optimal mass by default.

    .. math:: \sup_{\varepsilon} g(\varepsilon)
              = e^{\gamma/2}\sqrt{v^*(1 - v^*)}\,(1 + \gamma v^*)\,\|Vu\|_2

    with :math:`v^*` from :func:`two_dirac_optimal_mass`; with ``eps`` given,
    :math:`g(\varepsilon)`.

    Parameters
    ----------
    gamma : array_like
        Gap :math:`\gamma \ge 0`.
    Vu_norm : array_like
        :math:`\|Vu\|_2`.
    eps : array_like, optional
        Light mass in :math:`(0, 1)`; omitted for the exact optimum over the mass.
    log : bool
        Return the logarithm.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        The bound at the optimal mass, or at ``eps`` when given (or its log).

    Notes
    -----
    docs/theory.md §5. :math:`\sup g \sim \frac{3\sqrt3}{16}\,\gamma\,e^{\gamma/2}\|Vu\|`
    (:func:`two_dirac_asymptote`),
    i.e. :math:`\frac{3\sqrt3}{64}\|Vu\|\lambda R^2e^{\lambda R^2/8}` in case +. Provenance:
    *derived and
    checked numerically*; the paper's two-Dirac form ("optimal ε / Lambert W") is *unknown*.
    """
    if eps is not None:
        return two_dirac_g(eps, gamma, Vu_norm, log=log)
    g = checked_float(gamma, "gamma", min_value=0.0)
    Vu = checked_norm(Vu_norm, "Vu_norm")
    return exp_or_log(log_sup_g(g) + quiet_log(Vu), log)


def two_dirac_half(gamma: ArrayLike, Vu_norm: ArrayLike = 1.0, *, log: bool = False) -> Any:
    r"""Two-Dirac bound at :math:`w = 1/2` (:math:`\varepsilon = 1/(1 + e^\gamma)`).

    .. math:: g = \frac{\|Vu\|_2}{2}\Big(1 + \frac\gamma2\Big)e^{\gamma/2},
              \quad\text{case +: }\ \frac{\|Vu\|_2}{2}\Big(1 + \frac{\lambda R^2}{8}\Big)e^{\lambda
              R^2/8}.

    Parameters
    ----------
    gamma : array_like
        Gap :math:`\gamma \ge 0`.
    Vu_norm : array_like
        :math:`\|Vu\|_2`.
    log : bool
        Return the logarithm.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        The bound (a valid lower bound, below :func:`two_dirac_lower`).

    Notes
    -----
    docs/theory.md §5. Provenance: *derived and checked numerically*; that the paper states a form
    like this is a *recollection, unverified*.
    """
    g = checked_float(gamma, "gamma", min_value=0.0)
    Vu = checked_norm(Vu_norm, "Vu_norm")
    return exp_or_log(quiet_log(Vu / 2.0) + np.log1p(g / 2.0) + g / 2.0, log)


def two_dirac_asymptote(gamma: ArrayLike, Vu_norm: ArrayLike = 1.0, *, log: bool = False) -> Any:
    r"""Asymptote of the two-Dirac optimum.

    .. math:: \frac{3\sqrt3}{16}\,\gamma\,e^{\gamma/2}\|Vu\|_2 .

    Parameters
    ----------
    gamma, Vu_norm, log
        As in :func:`two_dirac_half`.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        The asymptote; it is also a valid lower bound for every :math:`\gamma \ge 0`, since
        :math:`g` at :math:`v = 3/4` equals it plus :math:`\frac{\sqrt3}{4}e^{\gamma/2}\|Vu\|`.

    Notes
    -----
    docs/theory.md §5. In case + it is :math:`\frac{3\sqrt3}{64}\|Vu\|\lambda R^2e^{\lambda R^2/8}`;
    with
    :math:`\gamma = 2\|A\|_2R^2` (when :math:`-\|A\|_2` is an eigenvalue) it is
    :math:`\frac{3\sqrt3}{8}\|Vu\|\|A\|_2R^2e^{\|A\|_2R^2}`, the rate of the :math:`c' = 1` upper
    bound.
    Provenance: *derived and checked numerically* (limit also derived symbolically).
    """
    g = checked_float(gamma, "gamma", min_value=0.0)
    Vu = checked_norm(Vu_norm, "Vu_norm")
    return exp_or_log(np.log(ASYMPTOTE_COEFF) + quiet_log(g) + g / 2.0 + quiet_log(Vu), log)


# ---------------------------------------------------------------------------------------------
# off-axis two-atom bound
# ---------------------------------------------------------------------------------------------


def off_axis_two_atom(
    x: ArrayLike,
    y: ArrayLike,
    h: ArrayLike,
    w: ArrayLike,
    A: ArrayLike,
    V: ArrayLike,
    *,
    log: bool = False,
) -> Any:
    r"""General two-atom lower bound (docs/theory.md §5).

    .. math:: \mathrm{Lip}(F\,|\,\mathcal P(B_R)) \ \ge\ e^{\gamma/2}\sqrt{w(1 - w)}\;
              \big\|V\big(h + (1 - w)\,(y^\top Ah)\,(x - y)\big)\big\|_2,\qquad
              \gamma = y^\top A(x - y),

    for a light atom at :math:`x`, a heavy atom at :math:`y` (both in :math:`B_R`), a unit direction
    :math:`h` moving the light atom, and the attention :math:`w \in (0, 1)` that the heavy atom pays
    to
    the light one (reached by the mass :math:`\varepsilon` with
    :math:`\varepsilon/(1 - \varepsilon) = e^{-\gamma}w/(1 - w)`).

    Parameters
    ----------
    x, y : array_like, shape (..., d)
        Light and heavy atoms.
    h : array_like, shape (..., d)
        Direction; normalised to unit length here (must be non-zero).
    w : array_like, shape (...)
        Attention in :math:`(0, 1)`.
    A : array_like, shape (d, d)
        Score matrix.
    V : array_like, shape (d_v, d)
        Value matrix.
    log : bool
        Return the logarithm.

    Returns
    -------
    numpy.float64 or numpy.ndarray, shape (...)
        The bound.

    Notes
    -----
    Derivation: the heavy atom's output :math:`V(wx + (1 - w)y)` moves with velocity
    :math:`wV(h + (1 - w)(y^\top Ah)(x - y))` when the light atom moves along :math:`h`; its mass
    :math:`1 - \varepsilon` against the input cost :math:`\sqrt\varepsilon` gives the factor
    :math:`\sqrt{(1 - \varepsilon)/\varepsilon}\,w = e^{\gamma/2}\sqrt{w(1 - w)}`. On the axis
    (:math:`x = Ru, y = \frac R2u, h = u`) it is :func:`two_dirac_g`. Provenance: *derived and
    checked
    numerically*; not in any source.
    """
    x_ = checked_float(x, "x")
    y_ = checked_float(y, "y")
    h_ = checked_float(h, "h")
    w_ = checked_float(w, "w")
    A_ = checked_float(A, "A")
    V_ = checked_float(V, "V")
    if ((w_ <= 0) | (w_ >= 1)).any():
        raise ValueError("w must lie in the open interval (0, 1)")
    d = A_.shape[-1]
    if A_.shape != (d, d) or V_.ndim != 2 or V_.shape[1] != d:
        raise ValueError(f"need A (d, d) and V (d_v, d), got {A_.shape}, {V_.shape}")
    if x_.shape[-1] != d or y_.shape[-1] != d or h_.shape[-1] != d:
        raise ValueError(f"x, y, h must have last dimension d = {d}")
    h_norm = np.linalg.norm(h_, axis=-1, keepdims=True)
    if (h_norm == 0).any():
        raise ValueError("h must be non-zero")
    h_ = h_ / h_norm
    s = np.einsum("...i,ij,...j->...", y_, A_, x_ - y_)
    yAh = np.einsum("...i,ij,...j->...", y_, A_, h_)
    vec = h_ + ((1.0 - w_) * yAh)[..., None] * (x_ - y_)
    norm = np.linalg.norm(np.einsum("ij,...j->...i", V_, vec), axis=-1)
    log_val = s / 2.0 + 0.5 * (np.log(w_) + np.log1p(-w_)) + quiet_log(norm)
    return exp_or_log(log_val, log)
