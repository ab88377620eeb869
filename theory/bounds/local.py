r"""Data-dependent local bounds at one sequence (docs/theory.md §2).

:func:`released_data_dependent` is the quantity of the authors' released code (not a bound);
:func:`certified_local_upper` is the certified replacement (docs/theory.md §2a).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from theory.bounds._common import as_result, checked_float, checked_norm
from theory.rounding import head_upper  # rounding margin, docs/rounding.md §8

# ---------------------------------------------------------------------------------------------
# the released data-dependent quantity
# ---------------------------------------------------------------------------------------------


def released_data_dependent(V_norms: ArrayLike, R_h: ArrayLike, r: ArrayLike, n: ArrayLike) -> Any:
    r"""Evaluate the released data-dependent quantity (**not a valid upper bound**).

    .. math:: \sum_h \|V_h\|_2\,\big(R_h^2\,r^2\,(n + 1) + n\big)^{1/2},\qquad
              r = \max_{i,j}\|x_i - x_j\|,\quad R_h = \max_i\|A_{\mathrm{code},h}\,x_i\| .

    Parameters
    ----------
    V_norms : array_like, shape (..., H)
        :math:`\|V_h\|_2` per head, heads on the last axis (a scalar is one head).
    R_h : array_like, shape (..., H)
        :math:`\max_i\|A_{\mathrm{code},h}x_i\|` per head, with
        :math:`A_{\mathrm{code}} = A^\top` (docs/conventions.md §1).
    r : array_like, shape (...)
        Diameter of the token set.
    n : array_like, shape (...)
        Number of tokens.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        The quantity, summed over the head axis: shape (...).

    Notes
    -----
    docs/theory.md §2. Provenance: *from the authors' released code*
    (vcastin/how-smooth-is-attention), which computes it for the adversarial inputs only and never
    plots it. It is the three-term bound with :math:`\|x_j - m_i\| \le r`, without the √3 and
    without :math:`W^O`.

    **Caveat** (*derived and checked numerically*): as written it is not an upper bound, because
    :math:`R_h` controls :math:`\|A^\top x_i\|` but the self term :math:`T_3 = C_iA^\top h_i`
    involves :math:`A`. Counterexample: :math:`d = 2`, :math:`A = e_1e_2^\top`, tokens on the
    :math:`e_2` axis give :math:`R_h = 0` while :math:`T_3` grows with the spread. Label it as the
    released heuristic wherever it is shown.
    """
    V = np.atleast_1d(checked_norm(V_norms, "V_norms"))
    Rh = np.atleast_1d(checked_norm(R_h, "R_h"))
    r_ = checked_norm(r, "r")[..., None]
    n_ = checked_float(n, "n", min_value=1.0)[..., None]
    return as_result(np.sum(V * np.sqrt(Rh**2 * r_**2 * (n_ + 1.0) + n_), axis=-1))


def certified_local_upper(
    X: ArrayLike, heads: Sequence[Sequence[Any]], *, masked: bool = False
) -> float:
    r"""Certified data-dependent bound on :math:`\|Df(X)\|_2` at one sequence (docs/theory.md §2).

    .. math:: \|Df(X)\|_2 \le \sum_h\|W_hV_h\|_2\Big(\|P^h\|_2
              + \big(\max_j\textstyle\sum_iP^h_{ij}\kappa_i^2\beta_i^2\big)^{1/2}
              + \max_i\|C^h_iA_h^\top\|_2\Big),

    :math:`\kappa_i^2=\operatorname{tr}C_i`, :math:`\beta_i=\|A_h^\top x_i+c_h\|`, with
    :math:`P^h` the attention matrix (causal when ``masked``), :math:`m_i=\sum_jP_{ij}x_j` and
    :math:`C_i=\sum_jP_{ij}(x_j-m_i)(x_j-m_i)^\top`.

    Parameters
    ----------
    X : array_like, shape (n, d)
        One sequence (query ``i``, key ``j``; score :math:`x_i^\top Ax_j+c^\top x_j`).
    heads : sequence of tuples ``(A, V)``, ``(A, V, W)`` or ``(A, V, W, c)``
        ``A`` (d, d), ``V`` (d_v, d), ``W`` the column block of :math:`W^O` of the head
        (``None``: identity) and ``c`` the key-side bias of the score (``None``: none).
    masked : bool, default False
        Causal mask (the bound holds unchanged).

    Returns
    -------
    float

    Notes
    -----
    docs/theory.md §2. Provenance: *derived and checked numerically* (docs/theory.md §2): never
    below the certified dense constant in ``meanfield verify-bounds``, exact for constant scores and
    for equal tokens. Proof: :math:`Df(X)[H] = V(T_1+T_2+T_3)` (docs/theory.md §1);
    :math:`\|T_1\|\le\|P\|_2\|H\|`; Cauchy–Schwarz with the attention variance bounds
    :math:`T_2`; :math:`\|C_iA^\top h_i\|` bounds :math:`T_3`. Substituting
    :math:`\kappa_i\le R`, :math:`\beta_i\le\|A\|R`, :math:`\|C_i\|\le R^2` and column sums
    :math:`\le n` gives the triangle form of docs/theory.md §1. This is a plain numpy evaluation of
    the formula; :func:`meanfield.certified_local_upper` is the torch version for model layers
    (rotary heads included) and is tested against this one.
    """
    X_ = np.asarray(X, dtype=np.float64)
    if X_.ndim != 2 or X_.shape[0] < 1:
        raise ValueError(f"X must have shape (n, d) with n >= 1, got {X_.shape}")
    if not np.all(np.isfinite(X_)):
        raise ValueError("X has non-finite entries")
    if len(heads) == 0:
        raise ValueError("heads is empty")
    n, d = X_.shape
    total = 0.0
    for h, head in enumerate(heads):
        if not 2 <= len(head) <= 4:
            raise ValueError(f"head {h} must be (A, V), (A, V, W) or (A, V, W, c)")
        A, V, W, c = (*head, None, None)[:4]
        A = np.asarray(A, dtype=np.float64)
        V = np.asarray(V, dtype=np.float64)
        if A.shape != (d, d) or V.ndim != 2 or V.shape[1] != d:
            raise ValueError(
                f"head {h}: A must be ({d}, {d}) and V (d_v, {d}), got {A.shape} and {V.shape}"
            )
        S = X_ @ A @ X_.T
        g = X_ @ A  # rows (A^T x_i)^T, the key gradients of the scores
        if c is not None:
            c = np.asarray(c, dtype=np.float64).reshape(d)
            S = S + (X_ @ c)[None, :]
            g = g + c
        if masked:
            S = np.where(np.tril(np.ones((n, n), dtype=bool)), S, -np.inf)
        E = np.exp(S - S.max(axis=1, keepdims=True))
        P = E / E.sum(axis=1, keepdims=True)
        D = X_[None, :, :] - (P @ X_)[:, None, :]  # (i, j, :) = x_j - m_i
        C = np.einsum("ij,ijk,ijl->ikl", P, D, D)
        kappa2 = np.einsum("ikk->i", C)
        beta2 = np.sum(g**2, axis=1)
        t1 = float(np.linalg.norm(P, 2))
        t2 = math.sqrt(max(float(np.max(P.T @ (kappa2 * beta2))), 0.0))
        t3 = float(np.max(np.linalg.norm(C @ A.T, ord=2, axis=(1, 2))))
        WV = V if W is None else np.asarray(W, dtype=np.float64) @ V
        total += head_upper(X_, A, c, S, WV, t1, t2, t3, kappa2, beta2)
    return total
