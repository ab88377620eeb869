r"""Bounded logits: soft-capping, QK-norm and sliding windows (docs/derivations/bounded_logits.md).

With logit soft-capping (:math:`s = \kappa\tanh(\tilde s/\kappa)`, :math:`\tilde s = x_i^\top Ax_j`)
or QK-norm (:math:`s = \sigma\,q_i^\top k_j` with RMS-normalised :math:`q_i, k_j`) the logit
*values* are bounded by a constant :math:`B` on every ball, but their *derivatives* are not
bounded by a constant: the soft-capped logit has gradient :math:`\|A\|R` where
:math:`\tilde s = 0`, the QK-normed one :math:`\sim\|K\|/\sqrt\varepsilon` where
:math:`Kx \approx 0`. One head, :math:`f(X)_i = \sum_jP_{ij}Vx_j`, tokens in :math:`B_R`:

.. math:: \|Df(X)\|_2 \le \|V\|_2\big(t_1 + R\,G_k\,t_2 + R\,G_q\big),

where :math:`G_q, G_k` bound the gradients of a logit in its query and key, :math:`R` bounds the
spread of the values about their attention mean, and :math:`t_1, t_2` bound the column sums of
the attention matrix, which depend on the logits only through their spread :math:`2B`
(:func:`bounded_logits_upper`). This is where :math:`B` replaces the :math:`\|A\|_2R^2` of the
plain bounds (the mass ratio :math:`e^{2\theta}` becomes :math:`e^{2B}`, so :math:`\sqrt n`
saturates at :math:`e^B`), while :math:`R` still enters through :math:`G_q, G_k` and the value
spread. Neither variant is globally Lipschitz: :func:`softcap_two_token_lower` grows like
:math:`R^2`, :func:`qk_norm_two_token_lower` like :math:`R/\sqrt\varepsilon`, the rates of the
upper bounds.

Geometries: ``*_sqrt_n_upper`` bound :math:`\mathrm{Lip}(f\,|\,B_R^n)` (the quantity of
:func:`theory.bounds.sqrt_n_upper`), ``*_mean_field_upper`` bound
:math:`\mathrm{Lip}_{W_2}(F\,|\,\mathcal P(B_R))` (that of
:func:`theory.bounds.mean_field_upper`), :func:`bounded_logits_local_upper` bounds
:math:`\|Df(X)\|_2` at one sequence (that of :func:`theory.bounds.certified_local_upper`). Every
function is one head without :math:`W^O`; combine heads with
:func:`theory.bounds.multihead_upper`. Provenance of every function: *derived and checked
numerically* (ours; not in the paper).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from theory.bounds._common import (
    as_result,
    checked_count,
    checked_float,
    checked_norm,
)

__all__ = [
    "bounded_logits_local_upper",
    "bounded_logits_upper",
    "qk_norm_logit_bound",
    "qk_norm_mean_field_upper",
    "qk_norm_sqrt_n_upper",
    "qk_norm_two_token_lower",
    "softcap_logit_bound",
    "softcap_mean_field_upper",
    "softcap_sqrt_n_upper",
    "softcap_two_token_lower",
    "window_sqrt_n_upper",
]

# ---------------------------------------------------------------------------------------------
# the column-sum factors t1, t2 (the only place where the logit bound enters)
# ---------------------------------------------------------------------------------------------


def _checked_window(window: ArrayLike | None) -> NDArray[np.float64] | None:
    if window is None:
        return None
    return checked_count(window, "window", allow_inf=True)


def _column_factors(
    n: NDArray[np.float64],
    spread: NDArray[np.float64],
    masked: bool,
    window: NDArray[np.float64] | None,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    r"""``(t1, t2)`` with :math:`\|P\|_2\le t_1` and the :math:`T_2` factor :math:`t_2`.

    ``spread`` is :math:`\Delta\ge\max_{j,l}(s_{ij}-s_{il})` over admissible keys. A row with
    :math:`m` keys has :math:`P_{ij}\le\pi(m)=1/(1+(m-1)e^{-\Delta})`; ``c`` bounds the column
    sums :math:`\sum_iP_{ij}`; :math:`t_1=t_2=\sqrt c`, except for causal attention without a
    window, where Hardy's inequality also gives :math:`t_1\le2e^\Delta`, :math:`t_2\le4e^\Delta`.
    """
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        e_neg = np.exp(-spread)

        def causal_sum(m: NDArray[np.float64]) -> NDArray[np.float64]:
            # sum_{i=1}^m pi(i) <= 1 + int_0^{m-1} dt / (1 + t e^-D) = 1 + (m-1) log1p(x) / x
            x = (m - 1.0) * e_neg
            ratio = np.where(x > 0, np.log1p(x) / np.where(x > 0, x, 1.0), 1.0)
            out = np.where(np.isinf(m), np.inf, 1.0 + (m - 1.0) * ratio)
            return np.minimum(out, m)

        if window is None:
            if masked:
                c = causal_sum(n)
                hardy = 2.0 * np.exp(spread)
                root = np.sqrt(c)
                return np.minimum(root, hardy), np.minimum(root, 2.0 * hardy)
            inv_n = 1.0 / n
            c = 1.0 / (inv_n + (1.0 - inv_n) * e_neg)
            c = np.minimum(c, n)
        else:
            m = np.minimum(n, window)  # keys of a full row (causal: exactly; symmetric: at least)
            if masked:
                c = causal_sum(m)
            else:
                queries = np.minimum(n, 2.0 * window - 1.0)
                pi_m = 1.0 / (1.0 + np.where(m > 1, (m - 1.0) * e_neg, 0.0))
                # queries = m = inf only when n = W = inf: then c = lim n pi(n) = e^Delta
                c = np.where(np.isinf(queries), np.exp(spread), queries * pi_m)
    root = np.sqrt(c)
    return root, root


def bounded_logits_upper(
    V_norm: ArrayLike,
    R: ArrayLike,
    n: ArrayLike,
    logit_bound: ArrayLike,
    grad_query: ArrayLike,
    grad_key: ArrayLike,
    *,
    masked: bool = False,
    window: ArrayLike | None = None,
) -> Any:
    r"""Upper bound on :math:`\mathrm{Lip}(f\,|\,B_R^n)` for any logit map with bounded values.

    .. math:: \mathrm{Lip}(f\,|\,B_R^n) \le \|V\|_2\big(t_1 + R\,G_k\,t_2 + R\,G_q\big),

    for a head :math:`f(X)_i = \sum_jP_{ij}Vx_j`, :math:`P_{ij} = \mathrm{softmax}_j\,s(x_i, x_j)`,
    whenever, for all :math:`x, y\in B_R`: :math:`|s(x, y)|\le B` (``logit_bound``),
    :math:`\|\nabla_xs\|\le G_q` (``grad_query``) and :math:`\|\nabla_ys\|\le G_k`
    (``grad_key``). With :math:`\Delta = 2B` (the largest logit spread in a row) and
    :math:`\pi(m) = 1/(1 + (m - 1)e^{-\Delta})` (the largest weight in a row of :math:`m` keys):

    * unmasked: :math:`t_1 = t_2 = \sqrt c`, :math:`c = n\,\pi(n) = n/(1+(n-1)e^{-\Delta})
      \le\min(n, e^{\Delta})`;
    * causal (``masked``): :math:`c = \min(n, 1 + (n-1)\log(1+x)/x)`, :math:`x = (n-1)e^{-\Delta}`
      (:math:`\approx e^\Delta\log n`), :math:`t_1 = \min(\sqrt c, 2e^\Delta)`,
      :math:`t_2 = \min(\sqrt c, 4e^\Delta)` (Hardy's inequality);
    * sliding window :math:`W` (``window``), causal: the causal :math:`c` with :math:`n` replaced by
      :math:`\min(n, W)`; symmetric: :math:`c = \min(n, 2W - 1)\,\pi(\min(n, W))`.

    Parameters
    ----------
    V_norm : array_like
        :math:`\|V\|_2 \ge 0`.
    R : array_like
        Radius of the ball, :math:`R \ge 0`.
    n : array_like
        Number of tokens, :math:`n \ge 1`, integer-valued; ``inf`` gives the supremum over
        :math:`n` (finite whenever :math:`B` is; causal: through Hardy's inequality).
    logit_bound : array_like
        :math:`B \ge 0` with :math:`|s|\le B` on :math:`B_R\times B_R` (``inf`` allowed: then only
        :math:`n` bounds the column sums).
    grad_query, grad_key : array_like
        :math:`G_q, G_k \ge 0`.
    masked : bool, default False
        Causal attention.
    window : array_like, optional
        Sliding window :math:`W\ge1` (token-index units, as ``AttentionParams.window``).

    Returns
    -------
    numpy.float64 or numpy.ndarray
        The bound.

    Notes
    -----
    docs/derivations/bounded_logits.md §2. Proof: :math:`Df(X)[H]_i = V(T_1 + T_2 + T_3)_i`,
    :math:`T_1 = \sum_jP_{ij}h_j`, :math:`T_2 = \sum_jP_{ij}(x_j - m_i)\langle\nabla_ys_{ij},
    h_j\rangle`, :math:`T_3 = \sum_jP_{ij}(x_j - m_i)\langle\nabla_xs_{ij}, h_i\rangle`; Jensen
    and the column sums give :math:`\|T_1\|\le t_1\|H\|`; Cauchy–Schwarz with the attention
    variance :math:`\sum_jP_{ij}\|x_j-m_i\|^2\le R^2` gives :math:`\|T_2\|\le RG_kt_2\|H\|` and
    :math:`\|T_3\|\le RG_q\|H\|`. With plain logits (:math:`B = \theta`,
    :math:`G_q = G_k = \|A\|R`) and :math:`c\le n` it is the triangle form of
    :func:`theory.bounds.sqrt_n_upper`. Provenance: *derived and checked numerically* (ours).
    """
    V = checked_norm(V_norm, "V_norm")
    R_ = checked_norm(R, "R")
    n_ = checked_count(n, "n", allow_inf=True)
    B = checked_float(logit_bound, "logit_bound", min_value=0.0, allow_inf=True)
    Gq = checked_norm(grad_query, "grad_query")
    Gk = checked_norm(grad_key, "grad_key")
    W = _checked_window(window)
    t1, t2 = _column_factors(n_, 2.0 * B, bool(masked), W)
    with np.errstate(invalid="ignore"):
        # 0 * inf (R = 0 with an infinite factor) is 0: T2 vanishes when all values coincide
        t2_term = np.where((R_ * Gk) == 0, 0.0, R_ * Gk * t2)
    return as_result(V * (t1 + t2_term + R_ * Gq))


# ---------------------------------------------------------------------------------------------
# soft-capping
# ---------------------------------------------------------------------------------------------


def _checked_kappa(kappa: ArrayLike) -> NDArray[np.float64]:
    return checked_float(kappa, "kappa", min_value=0.0, strict=True, allow_inf=True)


def softcap_logit_bound(A_norm: ArrayLike, R: ArrayLike, kappa: ArrayLike) -> Any:
    r"""Bound :math:`B = \kappa\tanh(\|A\|_2R^2/\kappa)` on the soft-capped logits on :math:`B_R`.

    Parameters
    ----------
    A_norm : array_like
        :math:`\|A\|_2` of the (scaled) score matrix, :math:`\tilde s = x_i^\top Ax_j`.
    R : array_like
        Radius.
    kappa : array_like
        Cap :math:`\kappa > 0` (``inf``: no cap, :math:`B = \theta`).

    Returns
    -------
    numpy.float64 or numpy.ndarray
        :math:`B \le \min(\kappa, \theta)`; exact when :math:`A` has a positive eigenvalue of
        modulus :math:`\|A\|_2` (take :math:`x_i = x_j = Ru`).

    Notes
    -----
    docs/derivations/bounded_logits.md §1. :math:`|\tilde s|\le\theta` and :math:`\tanh` is
    increasing. Provenance: *derived and checked numerically*.
    """
    a = checked_norm(A_norm, "A_norm")
    R_ = checked_norm(R, "R")
    k = _checked_kappa(kappa)
    theta = a * R_**2
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(np.isinf(k), theta, k * np.tanh(theta / k))
    return as_result(out)


def softcap_sqrt_n_upper(
    A_norm: ArrayLike,
    V_norm: ArrayLike,
    R: ArrayLike,
    n: ArrayLike,
    kappa: ArrayLike,
    *,
    masked: bool = False,
    window: ArrayLike | None = None,
) -> Any:
    r"""Upper bound on :math:`\mathrm{Lip}(f\,|\,B_R^n)` for a soft-capped head.

    .. math:: \|V\|_2\big(t_1 + \theta\,t_2 + \theta\big),\quad\text{i.e. }
              \|V\|_2\big(\sqrt c\,(1 + \theta) + \theta\big)\ \text{(unmasked)},

    with :math:`\theta = \|A\|_2R^2` and the column-sum bound :math:`c` of
    :func:`bounded_logits_upper` at the logit bound :math:`B = \kappa\tanh(\theta/\kappa)`:
    unmasked :math:`c = n/(1 + (n-1)e^{-2B}) \le \min(n, e^{2\kappa})`.

    Parameters
    ----------
    A_norm, V_norm : array_like
        :math:`\|A\|_2` (score :math:`\tilde s = x_i^\top Ax_j`, any logit scale folded into
        :math:`A`) and :math:`\|V\|_2`.
    R : array_like
        Radius, :math:`\|x_i\|\le R`.
    n : array_like
        Number of tokens (``inf``: the supremum over :math:`n`).
    kappa : array_like
        Cap :math:`\kappa > 0` (``inf``: plain logits).
    masked : bool, default False
        Causal attention.
    window : array_like, optional
        Sliding window :math:`W`.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        The bound; for fixed :math:`\kappa` it grows like :math:`R^2` (no exponential), and it is
        bounded in :math:`n`.

    Notes
    -----
    docs/derivations/bounded_logits.md §3. The cap's gate :math:`\mathrm{sech}^2(\tilde s/\kappa)`
    is 1 where :math:`\tilde s = 0`, so :math:`G_q = G_k = \|A\|_2R` as for plain logits; only the
    column sums improve. The :math:`R^2` growth is attained
    (:func:`softcap_two_token_lower`). Provenance: *derived and checked numerically* (ours).
    """
    a = checked_norm(A_norm, "A_norm")
    R_ = checked_norm(R, "R")
    B = softcap_logit_bound(a, R_, kappa)
    G = a * R_
    return bounded_logits_upper(V_norm, R_, n, B, G, G, masked=masked, window=window)


def softcap_mean_field_upper(
    A_norm: ArrayLike, V_norm: ArrayLike, R: ArrayLike, kappa: ArrayLike
) -> Any:
    r"""Upper bound on :math:`\mathrm{Lip}_{W_2}(F\,|\,\mathcal P(B_R))` for a soft-capped head.

    .. math:: \|V\|_2\big(e^{B}(1 + \theta) + \theta\big),\qquad B = \kappa\tanh(\theta/\kappa)
              \le\kappa,\quad\theta = \|A\|_2R^2 .

    Parameters
    ----------
    A_norm, V_norm, R : array_like
        As in :func:`softcap_sqrt_n_upper`.
    kappa : array_like
        Cap :math:`\kappa > 0` (``inf``: plain logits, giving
        :math:`\|V\|(e^\theta(1+\theta)+\theta)`, below ``mean_field_upper(form="refined")``).

    Returns
    -------
    numpy.float64 or numpy.ndarray
        The bound (also the unmasked :func:`softcap_sqrt_n_upper` at ``n = inf``).

    Notes
    -----
    docs/derivations/bounded_logits.md §4: the mass ratio :math:`P_{ij}/a_j\le e^{2B}` replaces
    the :math:`e^{2\theta}` of docs/theory.md §17 step 6; Jensen and Cauchy–Schwarz in
    :math:`L^2(\mu)` then give the factor :math:`e^{B}` on :math:`T_1, T_2`; step 8 of §17
    (local to global, splitting) carries over. Provenance: *derived and checked numerically*.
    """
    return softcap_sqrt_n_upper(A_norm, V_norm, R, np.inf, kappa)


def softcap_two_token_lower(
    a: ArrayLike, R: ArrayLike, kappa: ArrayLike, V_norm: ArrayLike = 1.0
) -> Any:
    r"""Exact :math:`\|Df(X)\|_2` of a soft-capped head at the two-token counterexample.

    :math:`d = 1`, :math:`A = a > 0`, :math:`V = \|V\|`, :math:`X = (0, R)`. With
    :math:`\theta = aR^2`, :math:`c = \kappa\tanh(\theta/\kappa)`, :math:`p = 1/(1+e^{c})`,
    :math:`q = 1 - p` and :math:`g = \mathrm{sech}^2(\theta/\kappa)`, the Jacobian is

    .. math:: J = \|V\|\begin{pmatrix}\tfrac12 + \tfrac\theta4 & \tfrac12\\
              p - pq\theta & q + 2pqg\theta\end{pmatrix},

    and :math:`\sigma_{\max}(J) = \|V\|\big((F + (F^2 - 4D^2)^{1/2})/2\big)^{1/2}` with
    :math:`F = \|J\|_F^2`, :math:`D = \det J`.

    Parameters
    ----------
    a : array_like
        Score :math:`a > 0`.
    R : array_like
        Radius :math:`R \ge 0` (the tokens are :math:`0` and :math:`R`, so :math:`X\in B_R^2`).
    kappa : array_like
        Cap :math:`\kappa > 0`.
    V_norm : array_like, default 1
        :math:`|V|`.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        :math:`\|Df(X)\|_2\le\mathrm{Lip}(f\,|\,B_R^2)`; as :math:`R\to\infty` it equals
        :math:`\theta\,(1/16 + p_\infty^2q_\infty^2)^{1/2} + O(1)` with
        :math:`p_\infty = 1/(1+e^\kappa)`: growth :math:`R^2`, so a soft-capped head is not
        globally Lipschitz, and the :math:`R^2` of :func:`softcap_sqrt_n_upper` is the exact rate.

    Notes
    -----
    docs/derivations/bounded_logits.md §5. The query at 0 scores both keys 0 whatever
    :math:`R`, so its weights stay :math:`(1/2, 1/2)` while the derivative of its logit on the key
    :math:`R` is :math:`aR` (the gate is 1 at :math:`\tilde s = 0`): the self term
    :math:`\frac12\cdot\frac R2\cdot aR`. Derived by sympy in
    :func:`theory.symbolic.softcap_two_token`. Provenance: *derived and checked numerically*.
    """
    a_ = checked_float(a, "a", min_value=0.0, strict=True)
    R_ = checked_norm(R, "R")
    k = checked_float(kappa, "kappa", min_value=0.0, strict=True)
    Vn = checked_norm(V_norm, "V_norm")
    theta = a_ * R_**2
    c = k * np.tanh(theta / k)
    p = 1.0 / (1.0 + np.exp(c))
    q = 1.0 - p
    g = _sech2(theta / k)
    J = (
        0.5 + theta / 4.0,
        np.full_like(theta, 0.5),
        p - p * q * theta,
        q + 2.0 * p * q * g * theta,
    )
    return as_result(Vn * _sigma_max_2x2(*J))


def _sech2(t: Any) -> Any:
    r""":math:`\mathrm{sech}^2 t = 4e^{-2|t|}/(1+e^{-2|t|})^2`, without overflow."""
    e = np.exp(-2.0 * np.abs(t))
    return 4.0 * e / (1.0 + e) ** 2


def _sigma_max_2x2(
    j11: NDArray[np.float64], j12: Any, j21: NDArray[np.float64], j22: NDArray[np.float64]
) -> NDArray[np.float64]:
    F = j11**2 + j12**2 + j21**2 + j22**2
    D = j11 * j22 - j12 * j21
    disc = np.sqrt(np.maximum((F - 2.0 * D) * (F + 2.0 * D), 0.0))
    return np.asarray(np.sqrt((F + disc) / 2.0))


# ---------------------------------------------------------------------------------------------
# QK-norm
# ---------------------------------------------------------------------------------------------


def _qk_inputs(
    Q_norm: ArrayLike,
    K_norm: ArrayLike,
    R: ArrayLike,
    eps: ArrayLike,
    k: ArrayLike,
    scale: ArrayLike,
    weight_max: ArrayLike,
) -> tuple[NDArray[np.float64], ...]:
    Qn = checked_norm(Q_norm, "Q_norm")
    Kn = checked_norm(K_norm, "K_norm")
    R_ = checked_norm(R, "R")
    e = checked_float(eps, "eps", min_value=0.0, strict=True)
    k_ = checked_count(k, "k")
    sig = np.abs(checked_float(scale, "scale"))
    w = checked_norm(weight_max, "weight_max")
    return Qn, Kn, R_, e, k_, sig, w


def _nu(t: NDArray[np.float64], eps: NDArray[np.float64], k: NDArray[np.float64]) -> Any:
    r""":math:`\nu(t) = t/\sqrt{t^2/k+\varepsilon}`: the largest :math:`\|z/r(z)\|` for :math:`\|z\|\le t`."""
    return t / np.sqrt(t**2 / k + eps)


def _qk_constants(
    Q_norm: ArrayLike,
    K_norm: ArrayLike,
    R: ArrayLike,
    eps: ArrayLike,
    k: ArrayLike,
    scale: ArrayLike,
    weight_max: ArrayLike,
) -> tuple[Any, Any, Any, NDArray[np.float64]]:
    """``(B, G_q, G_k, R)`` of a QK-normed head on the ball of radius ``R``."""
    Qn, Kn, R_, e, k_, sig, w = _qk_inputs(Q_norm, K_norm, R, eps, k, scale, weight_max)
    nu_q, nu_k = _nu(Qn * R_, e, k_), _nu(Kn * R_, e, k_)
    B = sig * w * nu_q * nu_k
    Gq = sig * w * Qn * nu_k / np.sqrt(e)
    Gk = sig * w * Kn * nu_q / np.sqrt(e)
    return B, Gq, Gk, R_


def qk_norm_logit_bound(
    Q_norm: ArrayLike,
    K_norm: ArrayLike,
    R: ArrayLike,
    eps: ArrayLike,
    k: ArrayLike,
    *,
    scale: ArrayLike = 1.0,
    weight_max: ArrayLike = 1.0,
) -> Any:
    r"""Bound :math:`B` on QK-normed logits on :math:`B_R`.

    .. math:: |s_{ij}|\le B = |\sigma|\,\omega\,\nu(\|Q\|_2R)\,\nu(\|K\|_2R),\qquad
              \nu(t) = \frac{t}{\sqrt{t^2/k+\varepsilon}} < \sqrt k,

    for :math:`s_{ij} = \sigma\,(w_q\odot u_i/r(u_i))^\top(w_k\odot v_j/r(v_j))`,
    :math:`u_i = Qx_i`, :math:`v_j = Kx_j`, :math:`r(z) = (\|z\|^2/k+\varepsilon)^{1/2}`,
    :math:`\omega = \max_a|w_{q,a}w_{k,a}|`. So :math:`B < |\sigma|\,\omega\,k` at every radius.

    Parameters
    ----------
    Q_norm, K_norm : array_like
        :math:`\|Q\|_2, \|K\|_2` of the head's (k, d) factors, without the logit scale.
    R : array_like
        Radius.
    eps : array_like
        RMSNorm :math:`\varepsilon > 0`.
    k : array_like
        Head width (the RMS is over :math:`k` coordinates).
    scale : array_like, default 1
        Logit scale :math:`\sigma` (``logit_scale``; usually :math:`1/\sqrt k`).
    weight_max : array_like, default 1
        :math:`\omega = \max_a|w_{q,a}w_{k,a}|` (1 for unit RMSNorm weights).

    Returns
    -------
    numpy.float64 or numpy.ndarray

    Notes
    -----
    docs/derivations/bounded_logits.md §1. Provenance: *derived and checked numerically*.
    """
    B, _, _, _ = _qk_constants(Q_norm, K_norm, R, eps, k, scale, weight_max)
    return as_result(B)


def qk_norm_sqrt_n_upper(
    Q_norm: ArrayLike,
    K_norm: ArrayLike,
    V_norm: ArrayLike,
    R: ArrayLike,
    n: ArrayLike,
    eps: ArrayLike,
    k: ArrayLike,
    *,
    scale: ArrayLike = 1.0,
    weight_max: ArrayLike = 1.0,
    masked: bool = False,
    window: ArrayLike | None = None,
) -> Any:
    r"""Upper bound on :math:`\mathrm{Lip}(f\,|\,B_R^n)` for a head with QK-norm on queries and keys.

    :func:`bounded_logits_upper` with :math:`B` of :func:`qk_norm_logit_bound` and

    .. math:: G_q = \frac{|\sigma|\,\omega\,\|Q\|_2\,\nu(\|K\|_2R)}{\sqrt\varepsilon},\qquad
              G_k = \frac{|\sigma|\,\omega\,\|K\|_2\,\nu(\|Q\|_2R)}{\sqrt\varepsilon};

    unmasked: :math:`\|V\|_2\big(\sqrt c\,(1 + RG_k) + RG_q\big)`, :math:`c = n/(1+(n-1)e^{-2B})`.

    Parameters
    ----------
    Q_norm, K_norm, V_norm : array_like
        Spectral norms of the factors :math:`Q, K` (k, d) and of :math:`V`.
    R : array_like
        Radius.
    n : array_like
        Number of tokens (``inf``: the supremum over :math:`n`).
    eps, k : array_like
        RMSNorm :math:`\varepsilon > 0` and head width :math:`k`.
    scale, weight_max : array_like
        As in :func:`qk_norm_logit_bound`.
    masked : bool, default False
        Causal attention.
    window : array_like, optional
        Sliding window :math:`W`.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        The bound; it grows **linearly** in :math:`R`, with slope
        :math:`\to\|V\|\,|\sigma|\,\omega\sqrt k(\sqrt c\,\|K\| + \|Q\|)/\sqrt\varepsilon`.

    Notes
    -----
    docs/derivations/bounded_logits.md §3. The normalisation :math:`N(z) = z/r(z)` has
    :math:`DN(z) = (I - zz^\top/(kr^2))/r`, of norm :math:`1/r(z)\le1/\sqrt\varepsilon`, attained at
    :math:`z = 0`: a query (key) with :math:`Qx\approx0` (:math:`Kx\approx0`) has a logit gradient
    of order :math:`1/\sqrt\varepsilon` while the values it averages can be :math:`R` apart. The
    linear rate and the :math:`1/\sqrt\varepsilon` are attained
    (:func:`qk_norm_two_token_lower`). Only queries and keys both normalised, without head-space
    biases; a rotary embedding after the norm changes nothing (it is orthogonal). Provenance:
    *derived and checked numerically* (ours).
    """
    B, Gq, Gk, R_ = _qk_constants(Q_norm, K_norm, R, eps, k, scale, weight_max)
    return bounded_logits_upper(V_norm, R_, n, B, Gq, Gk, masked=masked, window=window)


def qk_norm_mean_field_upper(
    Q_norm: ArrayLike,
    K_norm: ArrayLike,
    V_norm: ArrayLike,
    R: ArrayLike,
    eps: ArrayLike,
    k: ArrayLike,
    *,
    scale: ArrayLike = 1.0,
    weight_max: ArrayLike = 1.0,
) -> Any:
    r"""Upper bound on :math:`\mathrm{Lip}_{W_2}(F\,|\,\mathcal P(B_R))` for a QK-normed head.

    .. math:: \|V\|_2\big(e^{B}(1 + RG_k) + RG_q\big),

    :math:`B, G_q, G_k` as in :func:`qk_norm_sqrt_n_upper`; at most
    :math:`\|V\|(e^{|\sigma|\omega k}(1 + RG_k) + RG_q)` at every radius.

    Parameters
    ----------
    Q_norm, K_norm, V_norm, R, eps, k, scale, weight_max
        As in :func:`qk_norm_sqrt_n_upper`.

    Returns
    -------
    numpy.float64 or numpy.ndarray

    Notes
    -----
    docs/derivations/bounded_logits.md §4 (the proof of :func:`softcap_mean_field_upper` with
    these constants). Provenance: *derived and checked numerically*.
    """
    return qk_norm_sqrt_n_upper(
        Q_norm, K_norm, V_norm, R, np.inf, eps, k, scale=scale, weight_max=weight_max
    )


def qk_norm_two_token_lower(
    Q_norm: ArrayLike,
    K_norm: ArrayLike,
    R: ArrayLike,
    eps: ArrayLike,
    *,
    scale: ArrayLike = 1.0,
    V_norm: ArrayLike = 1.0,
) -> Any:
    r"""Exact :math:`\|Df(X)\|_2` of a QK-normed head at the two-token counterexample.

    :math:`d = k = 1`, :math:`Q = \|Q\|`, :math:`K = \|K\|`, RMSNorm weights 1, :math:`V = \|V\|`,
    :math:`X = (0, R)`. With :math:`N(t) = t/\sqrt{t^2+\varepsilon}`,
    :math:`N'(t) = \varepsilon/(t^2+\varepsilon)^{3/2}`, :math:`c = \sigma N(QR)N(KR)`,
    :math:`p = 1/(1+e^c)`, :math:`q = 1-p`:

    .. math:: J = \|V\|\begin{pmatrix}\tfrac12 + \tfrac R4\,\alpha & \tfrac12\\
              p - pqR\,\beta & q + pqR\,\delta\end{pmatrix},\quad
              \alpha = \frac{\sigma QN(KR)}{\sqrt\varepsilon},\
              \beta = \frac{\sigma KN(QR)}{\sqrt\varepsilon},\
              \delta = \sigma\big(QN'(QR)N(KR) + KN(QR)N'(KR)\big).

    Parameters
    ----------
    Q_norm, K_norm : array_like
        :math:`Q, K > 0` (scalars: :math:`d = k = 1`).
    R : array_like
        Radius :math:`R\ge0` (tokens :math:`0` and :math:`R`).
    eps : array_like
        :math:`\varepsilon > 0`.
    scale : array_like, default 1
        Logit scale :math:`\sigma` (times the product of the RMSNorm weights, if not 1).
    V_norm : array_like, default 1
        :math:`|V|`.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        :math:`\|Df(X)\|_2\le\mathrm{Lip}(f\,|\,B_R^2)`; as :math:`R\to\infty` it is
        :math:`\frac{|\sigma|R}{\sqrt\varepsilon}(Q^2/16 + p_\infty^2q_\infty^2K^2)^{1/2} + O(1)`,
        :math:`p_\infty = 1/(1+e^{\sigma})`: linear growth with slope
        :math:`\propto1/\sqrt\varepsilon`, so QK-norm is not globally Lipschitz and the rate of
        :func:`qk_norm_sqrt_n_upper` is exact.

    Notes
    -----
    docs/derivations/bounded_logits.md §5. The query at 0 has :math:`u = 0`, where the norm's
    derivative is :math:`1/\sqrt\varepsilon`; its logits are 0, so it averages the two values
    :math:`R` apart with weights :math:`1/2`. Derived by sympy in
    :func:`theory.symbolic.qk_norm_two_token`. Provenance: *derived and checked numerically*.
    """
    Qn = checked_float(Q_norm, "Q_norm", min_value=0.0, strict=True)
    Kn = checked_float(K_norm, "K_norm", min_value=0.0, strict=True)
    R_ = checked_norm(R, "R")
    e = checked_float(eps, "eps", min_value=0.0, strict=True)
    sig = checked_float(scale, "scale")
    Vn = checked_norm(V_norm, "V_norm")

    def N(t: Any) -> Any:
        return t / np.sqrt(t**2 + e)

    def dN(t: Any) -> Any:
        return e / (t**2 + e) ** 1.5

    c = sig * N(Qn * R_) * N(Kn * R_)
    p = 1.0 / (1.0 + np.exp(c))
    q = 1.0 - p
    alpha = sig * Qn * N(Kn * R_) / np.sqrt(e)
    beta = sig * Kn * N(Qn * R_) / np.sqrt(e)
    delta = sig * (Qn * dN(Qn * R_) * N(Kn * R_) + Kn * N(Qn * R_) * dN(Kn * R_))
    j11 = 0.5 + R_ * alpha / 4.0
    j21 = p - p * q * R_ * beta
    j22 = q + p * q * R_ * delta
    return as_result(Vn * _sigma_max_2x2(j11, np.full_like(j11, 0.5), j21, j22))


# ---------------------------------------------------------------------------------------------
# sliding window, plain logits
# ---------------------------------------------------------------------------------------------


def window_sqrt_n_upper(
    A_norm: ArrayLike,
    V_norm: ArrayLike,
    R: ArrayLike,
    n: ArrayLike,
    window: ArrayLike,
    *,
    masked: bool = False,
) -> Any:
    r"""The √n-regime bound with :math:`n` replaced by the window: sliding-window attention.

    .. math:: \mathrm{Lip}(f\,|\,B_R^n)\le\|V\|_2\big(\sqrt{c}\,(1 + \theta) + \theta\big),
              \qquad c = \begin{cases}\min(n, W) & \text{causal window (``masked``)},\\
              \min(n, 2W - 1) & \text{symmetric window},\end{cases}

    :math:`\theta = \|A\|_2R^2`: the triangle form of :func:`theory.bounds.sqrt_n_upper` with
    :math:`n` replaced by the largest number of queries that see one key.

    Parameters
    ----------
    A_norm, V_norm, R : array_like
        :math:`\|A\|_2`, :math:`\|V\|_2`, radius.
    n : array_like
        Number of tokens (``inf`` allowed: the bound no longer depends on :math:`n\ge2W-1`).
    window : array_like
        Window :math:`W\ge1` (``AttentionParams.window``: key :math:`j` is admissible for query
        :math:`i` when :math:`|i-j|<W`, and :math:`j\le i` if masked).
    masked : bool, default False
        Causal window (Mistral, Gemma ``sliding_window``); otherwise symmetric (ModernBERT).

    Returns
    -------
    numpy.float64 or numpy.ndarray

    Notes
    -----
    docs/derivations/bounded_logits.md §6. Only :math:`\|T_1\|` and :math:`\|T_2\|` depend on
    :math:`n`, through the column sums :math:`\sum_iP_{ij}\le\#\{i: j\text{ admissible for }i\}`;
    rows still sum to 1 and the attention variance is still :math:`\le R^2`. The logits are not
    bounded, so the factor :math:`\theta` stays and the bound grows like :math:`R^2`, not
    exponentially; dropping the logit refinement of :func:`bounded_logits_upper` (which would
    replace :math:`c` by :math:`\min(c, c\,\pi)`) keeps the formula. Provenance: *derived and
    checked numerically* (ours).
    """
    a = checked_norm(A_norm, "A_norm")
    V = checked_norm(V_norm, "V_norm")
    R_ = checked_norm(R, "R")
    n_ = checked_count(n, "n", allow_inf=True)
    W = checked_count(window, "window", allow_inf=True)
    theta = a * R_**2
    c = np.minimum(n_, W) if masked else np.minimum(n_, 2.0 * W - 1.0)
    return as_result(V * (np.sqrt(c) * (1.0 + theta) + theta))


# ---------------------------------------------------------------------------------------------
# local bound at one sequence
# ---------------------------------------------------------------------------------------------


def bounded_logits_local_upper(
    X: ArrayLike,
    V: ArrayLike,
    A: ArrayLike | None = None,
    *,
    Q: ArrayLike | None = None,
    K: ArrayLike | None = None,
    softcap: float | None = None,
    scale: float = 1.0,
    q_weight: ArrayLike | None = None,
    k_weight: ArrayLike | None = None,
    eps: float | None = None,
    masked: bool = False,
    window: int | None = None,
) -> float:
    r"""Data-dependent bound on :math:`\|Df(X)\|_2` at one sequence, for bounded-logit heads.

    .. math:: \|Df(X)\|_2\le\|V\|_2\Big(\|P\|_2
              + \big(\max_j\textstyle\sum_iP_{ij}\,\mathrm{tr}C_i\,\|\nabla_ys_{ij}\|^2\big)^{1/2}
              + \max_i\big\|\textstyle\sum_jP_{ij}(x_j - m_i)\nabla_xs_{ij}^\top\big\|_2\Big),

    with the head's attention matrix :math:`P` (causal, windowed), :math:`m_i = \sum_jP_{ij}x_j`,
    :math:`C_i` the attention covariance, and the exact logit gradients of the variant.

    Parameters
    ----------
    X : array_like, shape (n, d)
        One sequence.
    V : array_like, shape (d_v, d)
        Value matrix.
    A : array_like, shape (d, d), optional
        Score matrix (plain or capped logits :math:`x_i^\top Ax_j`; scale folded in).
    Q, K : array_like, shape (k, d), optional
        Factors for QK-norm: logits :math:`\sigma\,(w_q\odot N(Qx_i))^\top(w_k\odot N(Kx_j))`
        (give ``eps``); without ``eps`` they define :math:`A = \sigma Q^\top K`.
    softcap : float, optional
        Cap :math:`\kappa > 0` on the (scaled) logit.
    scale : float, default 1
        Logit scale :math:`\sigma` (with ``Q, K``).
    q_weight, k_weight : array_like, shape (k,), optional
        RMSNorm weights (default ones).
    eps : float, optional
        RMSNorm :math:`\varepsilon > 0`: its presence selects QK-norm on queries and keys.
    masked : bool, default False
        Causal mask.
    window : int, optional
        Sliding window :math:`W \ge 1`.

    Returns
    -------
    float
        The bound (float64 evaluation; no rounding margin).

    Notes
    -----
    docs/derivations/bounded_logits.md §2: the three terms bound :math:`T_1, T_2, T_3` exactly as
    in :func:`bounded_logits_upper`, with the data in place of their suprema over the ball. For
    plain logits it is the formula of :func:`theory.bounds.certified_local_upper` without that
    function's rounding margin. Provenance: *derived and checked numerically*.
    """
    X_ = np.asarray(X, dtype=np.float64)
    if X_.ndim != 2 or X_.shape[0] < 1:
        raise ValueError(f"X must have shape (n, d) with n >= 1, got {X_.shape}")
    if not np.all(np.isfinite(X_)):
        raise ValueError("X has non-finite entries")
    n, d = X_.shape
    V_ = np.asarray(V, dtype=np.float64)
    if V_.ndim != 2 or V_.shape[1] != d:
        raise ValueError(f"V must have shape (d_v, {d}), got {V_.shape}")
    if softcap is not None and not (softcap > 0):
        raise ValueError(f"softcap must be > 0, got {softcap!r}")
    if window is not None and (int(window) != window or window < 1):
        raise ValueError(f"window must be an integer >= 1, got {window!r}")
    qk_norm = eps is not None
    if qk_norm:
        if Q is None or K is None or A is not None:
            raise ValueError("QK-norm (eps given) needs Q and K and no A")
        if not (float(eps) > 0):  # type: ignore[arg-type]
            raise ValueError(f"eps must be > 0, got {eps!r}")
    elif q_weight is not None or k_weight is not None:
        raise ValueError("q_weight/k_weight need eps (QK-norm on queries and keys)")
    if not qk_norm:
        if A is None:
            if Q is None or K is None:
                raise ValueError("give A, or Q and K")
            A = scale * np.asarray(Q, dtype=np.float64).T @ np.asarray(K, dtype=np.float64)
        elif Q is not None or K is not None:
            raise ValueError("give A or (Q, K), not both")
        A_ = np.asarray(A, dtype=np.float64)
        if A_.shape != (d, d):
            raise ValueError(f"A must have shape ({d}, {d}), got {A_.shape}")
        S = X_ @ A_ @ X_.T
        gq = np.broadcast_to((X_ @ A_.T)[None, :, :], (n, n, d))  # grad_x s(x_i, x_j) = A x_j
        gk = np.broadcast_to((X_ @ A_)[:, None, :], (n, n, d))  # grad_y s(x_i, x_j) = A^T x_i
    else:
        Q_ = np.asarray(Q, dtype=np.float64)
        K_ = np.asarray(K, dtype=np.float64)
        if Q_.ndim != 2 or Q_.shape[1] != d or K_.shape != Q_.shape:
            raise ValueError(
                f"Q and K must have the same shape (k, {d}), got {Q_.shape}, {K_.shape}"
            )
        kk = Q_.shape[0]
        wq = np.ones(kk) if q_weight is None else np.asarray(q_weight, dtype=np.float64)
        wk = np.ones(kk) if k_weight is None else np.asarray(k_weight, dtype=np.float64)
        if wq.shape != (kk,) or wk.shape != (kk,):
            raise ValueError(f"q_weight and k_weight must have shape ({kk},)")
        e = float(eps)  # type: ignore[arg-type]
        U, Vk = X_ @ Q_.T, X_ @ K_.T
        ru = np.sqrt(np.sum(U**2, axis=1) / kk + e)
        rv = np.sqrt(np.sum(Vk**2, axis=1) / kk + e)
        Nu, Nv = U / ru[:, None], Vk / rv[:, None]
        S = scale * (Nu * wq * wk) @ Nv.T

        def dnorm_t(Z: Any, r: Any, G: Any) -> Any:
            # DN(z)^T g = (g - z (z.g)/(k r^2)) / r for every pair: Z (n, k), G (n, n, k)
            return G / r[:, None, None] - Z[:, None, :] * (
                np.einsum("ik,ijk->ij", Z, G)[:, :, None] / (kk * r[:, None, None] ** 3)
            )

        Gu = np.broadcast_to((scale * wq * wk * Nv)[None, :, :], (n, n, kk))  # d s / d u_i
        gq = dnorm_t(U, ru, Gu) @ Q_
        Gv = np.broadcast_to((scale * wq * wk * Nu)[:, None, :], (n, n, kk))  # d s / d v_j
        gk = np.swapaxes(dnorm_t(Vk, rv, np.swapaxes(Gv, 0, 1)), 0, 1) @ K_
    if softcap is not None:
        gate = _sech2(S / softcap)
        S = softcap * np.tanh(S / softcap)
        gq = gq * gate[:, :, None]
        gk = gk * gate[:, :, None]
    idx = np.arange(n)
    keep = np.ones((n, n), dtype=bool)
    if masked:
        keep &= idx[None, :] <= idx[:, None]
    if window is not None:
        keep &= np.abs(idx[:, None] - idx[None, :]) < int(window)
    S = np.where(keep, S, -np.inf)
    E = np.exp(S - S.max(axis=1, keepdims=True))
    P = E / E.sum(axis=1, keepdims=True)
    Dm = X_[None, :, :] - (P @ X_)[:, None, :]  # (i, j, :) = x_j - m_i
    var = np.einsum("ij,ijk,ijk->i", P, Dm, Dm)
    t1 = float(np.linalg.norm(P, 2))
    t2 = math.sqrt(max(float(np.max(np.einsum("ij,i,ij->j", P, var, np.sum(gk**2, axis=2)))), 0.0))
    T3 = np.einsum("ij,ijk,ijl->ikl", P, Dm, gq)
    t3 = float(np.max(np.linalg.norm(T3, ord=2, axis=(1, 2))))
    return float(np.linalg.norm(V_, 2)) * (t1 + t2 + t3)
