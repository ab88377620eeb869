r"""The mean-field regime: the :math:`n`-independent upper bound and the global lower bounds.

:func:`mean_field_upper` (docs/theory.md §6), :func:`trivial_lower` (docs/theory.md §16) and
:func:`mean_field_lower`, the best of the two two-Dirac cases (docs/theory.md §5).
"""

from __future__ import annotations

from typing import Any, Literal, cast

import numpy as np
from numpy.typing import ArrayLike, NDArray

from theory.bounds._common import (
    _choice,
    _exp_or_log,
    _float,
    _log,
    _norm,
    _ret,
)
from theory.bounds.sqrt_n import rayleigh_extremes
from theory.bounds.two_dirac import _log_sup_g

# ---------------------------------------------------------------------------------------------
# mean-field upper bound
# ---------------------------------------------------------------------------------------------


def mean_field_upper(
    A_norm: ArrayLike,
    V_norm: ArrayLike,
    R: ArrayLike,
    *,
    c: float = 1.0,
    form: Literal["sharp", "simple"] = "sharp",
    log: bool = False,
) -> Any:
    r"""Upper bound on the mean-field constant :math:`\mathrm{Lip}_{W_2}(F\,|\,\mathcal P(B_R))`.

    With :math:`\theta = \|A\|_2R^2` and the exponent coefficient :math:`c = c'`:

    * ``form="sharp"``: :math:`\|V\|_2\big(\theta + (1 + 2\theta)\,e^{c\theta}\big)`;
    * ``form="simple"``: :math:`\|V\|_2\,(1 + 3\theta)\,e^{c\theta}` (larger).

    Parameters
    ----------
    A_norm, V_norm, R : array_like
        :math:`\|A\|_2`, :math:`\|V\|_2`, radius.
    c : float
        Exponent coefficient :math:`c' \ge 0`. ``c = 1`` is our derivation along :math:`W_2`
        geodesics; ``c = 2`` the naive Kantorovich–Rubinstein route (proved for :math:`W_1`, hence
        :math:`W_2`). Record which value was used wherever the bound is shown.
    form : {"sharp", "simple"}
        Which form.
    log : bool
        Return the natural logarithm of the bound (no overflow for large :math:`\theta`).

    Returns
    -------
    numpy.float64 or numpy.ndarray
        The bound (or its log).

    Notes
    -----
    docs/theory.md §6. Derivation for :math:`c' = 1`: along a :math:`W_2` geodesic, output particles
    move
    with :math:`L_\mu h` (docs/theory.md §16); the self term is at most :math:`\|V\|\theta`, the
    interaction kernel
    :math:`\|I + (y - m_x)(A^\top x)^\top\| \le 1 + 2\theta`, and
    :math:`d\pi_x/d\mu \le e^{2\theta}` with Cauchy–Schwarz gives :math:`e^{\theta}`.
    Provenance: an :math:`n`-free upper bound with a matching lower bound is *stated in the paper
    (abstract)*; the printed form :math:`\|V\|(1 + c\|A\|R^2)e^{c'\|A\|R^2}` is a *recollection,
    unverified*, and :math:`c, c'` are *unknown*. The forms here are *derived and checked
    numerically* (:math:`c' = 1`) or *derived* (:math:`c' = 2`); they are not the paper's constants.
    """
    _choice(form, "form", ("sharp", "simple"))
    a = _norm(A_norm, "A_norm")
    V = _norm(V_norm, "V_norm")
    R_ = _norm(R, "R")
    c_ = _float(c, "c", min_value=0.0)
    theta = a * R_**2
    if form == "sharp":
        log_val = _log(V) + np.logaddexp(_log(theta), np.log1p(2.0 * theta) + c_ * theta)
    else:
        log_val = _log(V) + np.log1p(3.0 * theta) + c_ * theta
    return _exp_or_log(log_val, log)


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
    return _ret(_norm(V_norm, "V_norm"))


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
    R_ = _norm(R, "R")
    if isinstance(A, tuple):
        if len(A) != 2:
            raise ValueError("A as a tuple must be (lam_plus, lam_minus)")
        lam_p = _float(A[0], "lam_plus")
        lam_m = _float(A[1], "lam_minus")
        V_norm = _norm(V, "V_norm")
        if Vu_norm is None:
            vu_p = vu_m = V_norm
        elif isinstance(Vu_norm, tuple):
            vu_p, vu_m = (_norm(t, "Vu_norm") for t in Vu_norm)
        else:
            vu_p = vu_m = _norm(Vu_norm, "Vu_norm")
    else:
        if Vu_norm is not None:
            raise ValueError("Vu_norm is computed from the matrices; give it only with a tuple A")
        A_ = _float(A, "A")
        V_ = _float(V, "V")
        if V_.ndim != 2 or V_.shape[1] != A_.shape[-1]:
            raise ValueError(f"V must have shape (d_v, d) with d = {A_.shape[-1]}")
        ext = rayleigh_extremes(A_, variant=variant)
        lam_p, lam_m = np.float64(ext.lam_max), np.float64(ext.lam_min)
        # numpy.linalg.norm returns a numpy.float64 scalar; cast for the type checker only.
        vu_p = cast(NDArray[np.float64], np.linalg.norm(V_ @ ext.u_max))
        vu_m = cast(NDArray[np.float64], np.linalg.norm(V_ @ ext.u_min))
        V_norm = cast(NDArray[np.float64], np.linalg.norm(V_, 2))
    g_p = np.maximum(lam_p, 0.0) * R_**2 / 4.0
    g_m = np.maximum(-lam_m, 0.0) * 2.0 * R_**2
    log_val = np.maximum.reduce(
        np.broadcast_arrays(
            _log(V_norm),
            _log_sup_g(g_p) + _log(vu_p),
            _log_sup_g(g_m) + _log(vu_m),
        )
    )
    return _exp_or_log(log_val, log)
