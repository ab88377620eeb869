r"""The mean-field regime: the :math:`n`-independent upper bound and the global lower bounds.

:func:`mean_field_upper` (docs/theory.md §6, §17), :func:`mean_field_upper_cells` and
:func:`score_gap_constant` (docs/theory.md §17), :func:`trivial_lower` (docs/theory.md §16) and
:func:`mean_field_lower`, the best of the two two-Dirac cases (docs/theory.md §5).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike

from theory.bounds._common import (
    as_result,
    checked_choice,
    checked_float,
    checked_norm,
    exp_or_log,
    norm_theta,
    quiet_log,
)
from theory.bounds.sqrt_n import rayleigh_extremes
from theory.bounds.two_dirac import log_sup_g

# ---------------------------------------------------------------------------------------------
# mean-field upper bound
# ---------------------------------------------------------------------------------------------


def mean_field_upper(
    A_norm: ArrayLike,
    V_norm: ArrayLike,
    R: ArrayLike,
    *,
    c: float = 1.0,
    form: Literal["sharp", "simple", "refined"] = "sharp",
    log: bool = False,
) -> Any:
    r"""Upper bound on the mean-field constant :math:`\mathrm{Lip}_{W_2}(F\,|\,\mathcal P(B_R))`.

    With :math:`\theta = \|A\|_2R^2` and the exponent coefficient :math:`c = c'`:

    * ``form="sharp"``: :math:`\|V\|_2\big(\theta + (1 + 2\theta)\,e^{c\theta}\big)`;
    * ``form="simple"``: :math:`\|V\|_2\,(1 + 3\theta)\,e^{c\theta}` (larger);
    * ``form="refined"``: :math:`\|V\|_2\big(\theta + \sqrt{(1+\theta)(1+2\theta)}\,
      e^{c\theta}\big)` (smaller; about :math:`\sqrt2` below ``"sharp"`` for large
      :math:`\theta`).

    For :math:`c \ge 1` all three are theorems: they bound the local :math:`W_2` constant at every
    measure on :math:`B_R` (split atoms included) and hence
    :math:`\mathrm{Lip}_{W_2}(F\,|\,\mathcal P(B_R))` (docs/theory.md §17). The exponent
    :math:`c = 1` cannot be lowered (two Diracs with :math:`A = -aI`, docs/theory.md §5).

    Parameters
    ----------
    A_norm, V_norm, R : array_like
        :math:`\|A\|_2`, :math:`\|V\|_2`, radius.
    c : float
        Exponent coefficient :math:`c' \ge 0`. ``c = 1`` is proved (docs/theory.md §17); ``c = 2``
        is the older Kantorovich–Rubinstein route, weaker. Values below 1 are probes, not bounds.
        Record which value was used wherever the bound is shown.
    form : {"sharp", "simple", "refined"}
        Which form.
    log : bool
        Return the natural logarithm of the bound (no overflow for large :math:`\theta`).

    Returns
    -------
    numpy.float64 or numpy.ndarray
        The bound (or its log).

    Notes
    -----
    docs/theory.md §6 and §17. Proof for :math:`c' = 1` (§17): the weighted Jacobian
    :math:`D_a^{1/2}JD_a^{-1/2}` is :math:`(I\otimes V)(S + \tilde K)`; the block-diagonal self
    term has :math:`\|C_iA^\top\| \le \theta`; the kernel blocks
    :math:`\sqrt{a_i/a_j}P_{ij}(I + (x_j - m_i)(A^\top x_i)^\top)` pass a Schur test with the
    weights :math:`\sqrt{a_j}`, rows :math:`\le 1 + \theta` (``"refined"``; :math:`1 + 2\theta`
    for ``"sharp"``) and columns :math:`\le (1 + 2\theta)e^{2\theta}`. Each step is evaluated
    numerically in tests/theory/test_mean_field_proof.py.
    Provenance: an :math:`n`-free upper bound with a matching lower bound is *stated in the paper
    (abstract)*; the printed form :math:`\|V\|(1 + c\|A\|R^2)e^{c'\|A\|R^2}` is a *recollection,
    unverified*, and the paper's :math:`c, c'` are *unknown*. The forms here are *derived and
    checked numerically* (proved, :math:`c' \ge 1`: ``"simple"`` is that printed form with
    :math:`c = 3`, :math:`c' = 1`); they are not presented as the paper's constants.
    """
    checked_choice(form, "form", ("sharp", "simple", "refined"))
    V, theta = norm_theta(A_norm, V_norm, R)
    c_ = checked_float(c, "c", min_value=0.0)
    if form == "sharp":
        log_val = quiet_log(V) + np.logaddexp(quiet_log(theta), np.log1p(2.0 * theta) + c_ * theta)
    elif form == "refined":
        log_schur = 0.5 * (np.log1p(theta) + np.log1p(2.0 * theta)) + c_ * theta
        log_val = quiet_log(V) + np.logaddexp(quiet_log(theta), log_schur)
    else:
        log_val = quiet_log(V) + np.log1p(3.0 * theta) + c_ * theta
    return exp_or_log(log_val, log)


# ---------------------------------------------------------------------------------------------
# mean-field upper bound with the score-gap exponent
# ---------------------------------------------------------------------------------------------


def score_gap_constant(A: ArrayLike) -> np.float64:
    r"""Certified upper bound :math:`\bar\kappa(A)` on :math:`\max_{\|x\|,\|y\|\le1}x^\top A(y - x)`.

    The largest logit advantage a query can give another point over itself, at unit radius; on
    :math:`B_R` it scales as :math:`R^2\bar\kappa`. With the symmetric part
    :math:`A_s = A_{s+} - A_{s-}` (positive and negative parts) and the skew part :math:`A_k`,
    the minimum of two bounds (docs/theory.md §17, step 9):

    * :math:`\|A_{s+}\|/4 + 2\|A_{s-}\| + \|A_k\|`;
    * :math:`\max_{t\in[0,1]}\big(\|A\|t - \lambda_{\min}(A_s)t^2\big)`.

    Parameters
    ----------
    A : array_like, shape (d, d)
        Score matrix.

    Returns
    -------
    numpy.float64
        :math:`\bar\kappa(A) \in [0, 2\|A\|_2]`; :math:`\|A\|/4` for :math:`A = aI`, :math:`a > 0`,
        and :math:`2a` for :math:`A = -aI`, both exact.

    Notes
    -----
    Provenance: *derived and checked numerically* (docs/theory.md §17).
    """
    A_ = checked_float(A, "A")
    if A_.ndim != 2 or A_.shape[0] != A_.shape[1]:
        raise ValueError(f"A must be a square matrix, got shape {A_.shape}")
    lam = np.linalg.eigvalsh(0.5 * (A_ + A_.T))
    plus = max(float(lam[-1]), 0.0)
    minus = max(-float(lam[0]), 0.0)
    k1 = plus / 4.0 + 2.0 * minus + float(np.linalg.norm(0.5 * (A_ - A_.T), 2))
    a = float(np.linalg.norm(A_, 2))
    lmin = float(lam[0])
    # max over t in [0, 1] of a t - lmin t^2 (concave when lmin > 0)
    k2 = a * a / (4.0 * lmin) if lmin > 0.0 and a < 2.0 * lmin else a - lmin
    return np.float64(min(k1, k2, 2.0 * a))


def mean_field_upper_cells(A: ArrayLike, V: ArrayLike, R: ArrayLike, *, log: bool = False) -> Any:
    r"""Mean-field upper bound with the exponent :math:`\bar\kappa R^2/2` (docs/theory.md §17).

    .. math::

        \|V\|_2\Big(\theta + \sqrt{(1+\theta)(1+2\theta)\,
        \min\big(e^{2\theta},\ \min_{k\ge1}k^d e^{\bar\kappa R^2 + 2\sqrt d\,\theta/k}\big)}\Big),

    :math:`\theta = \|A\|_2R^2`, :math:`\bar\kappa` = :func:`score_gap_constant`. It is never
    above ``mean_field_upper(..., form="refined")``; for :math:`A = aI` it grows like
    :math:`\mathrm{poly}(\theta)\,e^{\theta/8}`, the exponent of the two-Dirac lower bound.

    Parameters
    ----------
    A : array_like, shape (d, d)
        Score matrix.
    V : array_like, shape (d_v, d)
        Value matrix.
    R, log
        As in :func:`mean_field_upper`.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        The bound (or its log), broadcast over ``R``.

    Notes
    -----
    The column sums of the Schur test of docs/theory.md §17 are bounded cell by cell on a grid of
    :math:`k^d` cubes (``k`` chosen near its optimum :math:`2\theta/\sqrt d`; every ``k`` gives a
    valid bound). The polynomial factor grows with the dimension :math:`d`, so the bound beats
    the :math:`e^{\theta}` forms only for :math:`\theta` large against :math:`d\log\theta`.
    Provenance: *derived and checked numerically* (ours).
    """
    A_ = checked_float(A, "A")
    V_ = checked_float(V, "V")
    if V_.ndim != 2 or V_.shape[1] != A_.shape[-1]:
        raise ValueError(f"V must have shape (d_v, d) with d = {A_.shape[-1]}")
    d = A_.shape[0]
    kap = score_gap_constant(A_)
    a = np.linalg.norm(A_, 2)
    R_ = checked_norm(R, "R")
    theta = a * R_**2
    c = 2.0 * np.sqrt(d) * theta
    k_opt = c / d
    # every k gives a valid bound: take the better of the two integers around the optimum
    k_lo, k_hi = np.maximum(np.floor(k_opt), 1.0), np.maximum(np.ceil(k_opt), 1.0)
    best = np.minimum(
        d * np.log(k_lo) + kap * R_**2 + c / k_lo, d * np.log(k_hi) + kap * R_**2 + c / k_hi
    )
    log_col = np.minimum(2.0 * theta, best)
    log_k = 0.5 * (np.log1p(theta) + np.log1p(2.0 * theta) + log_col)
    log_V = quiet_log(np.asarray(np.linalg.norm(V_, 2)))
    return exp_or_log(log_V + np.logaddexp(quiet_log(np.asarray(theta)), log_k), log)


# ---------------------------------------------------------------------------------------------
# global lower bound, trivial bound
# ---------------------------------------------------------------------------------------------


def trivial_lower(V_norm: ArrayLike) -> Any:
    r"""Trivial lower bound :math:`\|V\|_2` (docs/theory.md §16).

    :math:`F(\delta_x) = \delta_{Vx}`, so :math:`\mathrm{Lip}(F\,|\,\mathcal P(B_R)) \ge \|V\|_2`;
    the
    same holds for :math:`f` on :math:`B_R^n` (move :math:`n` equal tokens together).

    Parameters
    ----------
    V_norm : array_like
        :math:`\|V\|_2 \ge 0`.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        ``V_norm`` (validated).

    Notes
    -----
    Provenance: *derived* (docs/theory.md §16), elementary.
    """
    return as_result(checked_norm(V_norm, "V_norm"))


def mean_field_lower(
    A: Any,
    V: Any,
    R: ArrayLike,
    *,
    Vu_norm: Any = None,
    variant: Literal["symmetric", "released"] = "symmetric",
    log: bool = False,
) -> Any:
    r"""Global lower bound :math:`\max(\|V\|_2,\ \sup_\varepsilon g)` on the mean-field constant.

    Both cases of docs/theory.md §5 are evaluated and the larger is kept:
    :math:`\max\big(\|V\|_2,\ \sup g(\lambda_+R^2/4)\,\|Vu_+\|,\
    \sup g(2|\lambda_-|R^2)\,\|Vu_-\|\big)`, where case + needs :math:`\lambda_+ >
    0` and case − needs :math:`\lambda_- < 0`.

    Parameters
    ----------
    A : array_like of shape (d, d), or tuple (lam_plus, lam_minus)
        Score matrix, or the extreme values :math:`\lambda_\pm` of :math:`u^\top Au` (array_like,
        broadcast).
    V : array_like
        With a matrix ``A``: the value matrix, shape (d_v, d). With a tuple: :math:`\|V\|_2`.
    R : array_like
        Radius (broadcast).
    Vu_norm : array_like or tuple, optional
        Tuple form only: :math:`\|Vu\|_2` for both cases, or a pair ``(Vu_plus, Vu_minus)``. When
        omitted it is taken equal to :math:`\|V\|_2`, which is exact when :math:`V` is a multiple of
        an
        isometry (e.g. :math:`V = I`) and otherwise **not** a valid lower bound.
    variant : {"symmetric", "released"}
        Matrix form only: directions from :func:`rayleigh_extremes`.
    log : bool
        Return the logarithm.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        The bound.

    Notes
    -----
    docs/theory.md §5 ("Global lower bound", "Best gap"). For small :math:`\gamma` the trivial bound
    wins. Provenance: *derived and checked numerically*.
    """
    R_ = checked_norm(R, "R")
    if isinstance(A, tuple):
        if len(A) != 2:
            raise ValueError("A as a tuple must be (lam_plus, lam_minus)")
        lam_p = checked_float(A[0], "lam_plus")
        lam_m = checked_float(A[1], "lam_minus")
        V_norm = checked_norm(V, "V_norm")
        if Vu_norm is None:
            vu_p = vu_m = V_norm
        elif isinstance(Vu_norm, tuple):
            vu_p, vu_m = (checked_norm(t, "Vu_norm") for t in Vu_norm)
        else:
            vu_p = vu_m = checked_norm(Vu_norm, "Vu_norm")
    else:
        if Vu_norm is not None:
            raise ValueError("Vu_norm is computed from the matrices; give it only with a tuple A")
        A_ = checked_float(A, "A")
        V_ = checked_float(V, "V")
        if V_.ndim != 2 or V_.shape[1] != A_.shape[-1]:
            raise ValueError(f"V must have shape (d_v, d) with d = {A_.shape[-1]}")
        ext = rayleigh_extremes(A_, variant=variant)
        lam_p, lam_m = np.float64(ext.lam_max), np.float64(ext.lam_min)
        # numpy.linalg.norm returns a numpy.float64 scalar, kept as a 0-d array as above.
        vu_p = np.asarray(np.linalg.norm(V_ @ ext.u_max), dtype=np.float64)
        vu_m = np.asarray(np.linalg.norm(V_ @ ext.u_min), dtype=np.float64)
        V_norm = np.asarray(np.linalg.norm(V_, 2), dtype=np.float64)
    g_p = np.maximum(lam_p, 0.0) * R_**2 / 4.0
    g_m = np.maximum(-lam_m, 0.0) * 2.0 * R_**2
    log_val = np.maximum.reduce(
        np.broadcast_arrays(
            quiet_log(V_norm),
            log_sup_g(g_p) + quiet_log(vu_p),
            log_sup_g(g_m) + quiet_log(vu_m),
        )
    )
    return exp_or_log(log_val, log)
