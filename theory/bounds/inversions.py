r"""Lambert-W inversions: gap and radius for a target constant (docs/theory.md §9)."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from theory.bounds._common import as_result, checked_choice, checked_float, checked_norm
from theory.bounds.two_dirac import log_sup_g
from theory.lambert import lambertw_exp

# ---------------------------------------------------------------------------------------------
# Lambert W inversions
# ---------------------------------------------------------------------------------------------


def gap_for_target(L: ArrayLike) -> Any:
    r"""Gap with :math:`\gamma e^{\gamma/2} = L`: :math:`\gamma = 2W_0(L/2)` (docs/theory.md §9).

    Parameters
    ----------
    L : array_like
        Target :math:`L \ge 0` (any size; :math:`W_0` is evaluated at :math:`\log(L/2)`).

    Returns
    -------
    numpy.float64 or numpy.ndarray
        :math:`\gamma \ge 0`.

    Notes
    -----
    Provenance: *derived* (checked symbolically by :func:`theory.symbolic.gap_for_target`).
    """
    L_ = checked_float(L, "L", min_value=0.0, allow_inf=True)
    with np.errstate(divide="ignore"):
        return as_result(2.0 * np.asarray(lambertw_exp(np.log(L_ / 2.0))))


def radius_for_target(
    L: ArrayLike,
    lam: ArrayLike,
    Vu_norm: ArrayLike = 1.0,
    *,
    form: Literal["asymptote", "half", "exact"] = "asymptote",
) -> Any:
    r"""Radius beyond which the two-Dirac lower bound exceeds :math:`L` (docs/theory.md §9).

    The gap is :math:`\gamma = \lambda R^2/4` (case +, :math:`\lambda > 0`) or
    :math:`\gamma = 2|\lambda|R^2`
    (case −, :math:`\lambda < 0`), and :math:`R(L)` is the radius at which
    :math:`\gamma = \gamma_L`, with

    * ``"asymptote"``: :math:`\frac{3\sqrt3}{16}\gamma e^{\gamma/2}\|Vu\| = L`, i.e.
      :math:`\gamma_L = 2W_0\big(\frac{8L}{3\sqrt3\|Vu\|}\big)`; in case + this is
      :math:`R(L) = \sqrt{\frac8\lambda W_0\big(\frac{L}{8C}\big)}`,
      :math:`C = \frac{3\sqrt3}{64}\|Vu\|`;
    * ``"half"``: :math:`\frac{\|Vu\|}{2}(1 + x)e^x = L` with :math:`x = \gamma/2`, i.e.
      :math:`x = W_0(2eL/\|Vu\|) - 1` (0 when :math:`2L < \|Vu\|`: the bound exceeds :math:`L` at
      every radius);
    * ``"exact"``: :math:`\sup_\varepsilon g(\gamma) = L` by bisection (0 when
      :math:`L \le \|Vu\|/2`).

    Since :math:`\text{half} \le \sup g` and :math:`\text{asymptote} \le \sup g`, both closed forms
    give radii at
    least the exact one: for :math:`R > R(L)` the mean-field constant exceeds :math:`L`, so no
    guarantee at level :math:`L` is possible there.

    Parameters
    ----------
    L : array_like
        Target constant :math:`L > 0`.
    lam : array_like
        Rayleigh quotient :math:`\lambda = u^\top Au \ne 0`; its sign selects the case.
    Vu_norm : array_like
        :math:`\|Vu\|_2 > 0`.
    form : {"asymptote", "half", "exact"}
        Which form of the lower bound to invert.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        :math:`R(L)`.

    Notes
    -----
    Provenance: *derived* (the Lambert forms are checked by :mod:`theory.symbolic`; the exact form
    numerically). Where the paper uses Lambert W is *unknown*.
    """
    checked_choice(form, "form", ("asymptote", "half", "exact"))
    L_ = checked_float(L, "L", min_value=0.0, strict=True)
    lam_ = checked_float(lam, "lam")
    if (lam_ == 0).any():
        raise ValueError("lam must be non-zero (its sign selects case + or case -)")
    Vu = checked_float(Vu_norm, "Vu_norm", min_value=0.0, strict=True)
    L_, lam_, Vu = np.broadcast_arrays(L_, lam_, Vu)
    if form == "asymptote":
        gamma = 2.0 * np.asarray(lambertw_exp(np.log(8.0 * L_ / (3.0 * np.sqrt(3.0) * Vu))))
    elif form == "half":
        ratio = 2.0 * L_ / Vu
        x = np.asarray(lambertw_exp(1.0 + np.log(np.maximum(ratio, 1.0)))) - 1.0
        gamma = np.where(ratio >= 1.0, 2.0 * np.maximum(x, 0.0), 0.0)
    else:
        gamma = _exact_gap(np.log(L_ / Vu))
    # gamma / R^2 is lam / 4 in case + and 2 |lam| in case -
    return as_result(np.sqrt(gamma / np.where(lam_ > 0, lam_ / 4.0, -2.0 * lam_)))


def _exact_gap(log_target: NDArray[np.float64]) -> NDArray[np.float64]:
    """Solve log sup g(gamma) = log_target (||Vu|| = 1) for gamma >= 0 by bisection."""
    # sup g is increasing in gamma (envelope theorem) and exceeds the asymptote, so the root lies
    # below the asymptote's root.
    hi = 2.0 * np.asarray(lambertw_exp(log_target + np.log(8.0 / (3.0 * np.sqrt(3.0))))) + 1.0
    lo = np.zeros_like(hi)
    active = log_target > np.log(0.5)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        up = log_sup_g(mid) < log_target
        lo = np.where(up, mid, lo)
        hi = np.where(up, hi, mid)
        if (hi - lo <= 1e-15 * np.maximum(hi, 1e-300)).all():
            break
    return np.where(active, 0.5 * (lo + hi), 0.0)


def radius_for_upper(
    L: ArrayLike,
    a: ArrayLike,
    b: ArrayLike,
    c: ArrayLike,
    *,
    form: Literal["exact", "lambert"] = "exact",
) -> Any:
    r"""Largest radius with :math:`a(1 + bR^2)e^{cR^2} \le L` (docs/theory.md §9).

    * ``form="exact"``: the exact radius, in closed form:

      .. math:: R^2 = \frac{1}{c}W_0\Big(\frac{cL}{ab}e^{c/b}\Big) - \frac1b

      (solve :math:`y e^{cy/b} = (L/a)e^{c/b}` for :math:`y = 1 + bR^2`), evaluated through
      :func:`theory.lambert.lambertw_exp` in the log domain and polished by Newton steps on
      :math:`\log(1 + bt) + ct = \log(L/a)`; :math:`c = 0` or :math:`b = 0` use the elementary
      solutions.
    * ``form="lambert"``: the conservative radius :math:`R^2 = W_0\big(\frac{cL}{2ab}\big)/c`,
      valid
      only when it satisfies :math:`R^2 \ge 1/b` (there :math:`1 + bR^2 \le 2bR^2`); NaN elsewhere.

    Parameters
    ----------
    L : array_like
        Target :math:`L > 0`.
    a, b, c : array_like
        Bound parameters, :math:`a > 0`, :math:`b, c \ge 0` (``"lambert"`` needs :math:`b, c > 0`).
        For the
        simple mean-field form, :math:`a = \|V\|_2`, :math:`b = 3\|A\|_2`, :math:`c = c'\|A\|_2`.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        The radius; NaN when :math:`L < a` (the bound exceeds :math:`L` already at :math:`R = 0`),
        ``inf``
        when :math:`b = c = 0 \le L - a`.

    Notes
    -----
    The exact radius needs no bisection (docs/theory.md §9, §13 item 2): the closed form above makes
    it unnecessary (the tests check it against bisection). Provenance: *derived and checked
    numerically*.
    """
    checked_choice(form, "form", ("exact", "lambert"))
    L_ = checked_float(L, "L", min_value=0.0, strict=True)
    a_ = checked_float(a, "a", min_value=0.0, strict=True)
    b_ = checked_norm(b, "b")
    c_ = checked_norm(c, "c")
    L_, a_, b_, c_ = np.broadcast_arrays(L_, a_, b_, c_)
    log_ratio = np.log(L_) - np.log(a_)
    if form == "lambert":
        if ((b_ <= 0) | (c_ <= 0)).any():
            raise ValueError("form='lambert' needs b > 0 and c > 0")
        t = np.asarray(lambertw_exp(np.log(c_) + np.log(L_) - np.log(2.0 * a_ * b_))) / c_
        return as_result(np.where(t * b_ >= 1.0, np.sqrt(t), np.nan))
    out = np.full(L_.shape, np.nan)
    ok = log_ratio >= 0
    out[ok & (b_ == 0) & (c_ == 0)] = np.inf
    only_b = ok & (c_ == 0) & (b_ > 0)
    out[only_b] = np.sqrt(np.expm1(log_ratio[only_b]) / b_[only_b])
    only_c = ok & (b_ == 0) & (c_ > 0)
    out[only_c] = np.sqrt(log_ratio[only_c] / c_[only_c])
    gen = ok & (b_ > 0) & (c_ > 0)
    if gen.any():
        bb, cc, lr = b_[gen], c_[gen], log_ratio[gen]
        u = np.log(cc / bb) + lr + cc / bb
        t = np.maximum(np.asarray(lambertw_exp(u)) / cc - 1.0 / bb, 0.0)
        for _ in range(3):
            F = np.log1p(bb * t) + cc * t - lr
            t = np.maximum(t - F / (bb / (1.0 + bb * t) + cc), 0.0)
        out[gen] = np.sqrt(t)
    return as_result(out)
