r"""The large-radius regime: hard-max limit and its quantitative deviation (docs/theory.md §7)."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from theory.bounds._common import (
    as_result,
    checked_choice,
    checked_float,
    checked_norm,
    norm_theta,
    quiet_log,
)

# ---------------------------------------------------------------------------------------------
# the large-radius regime
# ---------------------------------------------------------------------------------------------


def large_radius_limit(
    counts: ArrayLike, V_norm: ArrayLike, *, kind: Literal["counts", "argmax"] = "counts"
) -> Any:
    r"""Limit :math:`\lim_{R\to\infty}\|Df(RX)\|_2 = \|V\|_2\,(\max_j N_j)^{1/2}`.

    See docs/theory.md §7.

    Parameters
    ----------
    counts : array_like of int, shape (..., m)
        ``kind="counts"``: the counts :math:`N_j = \#\{i : j^*(i) = j\}` on the last axis (any
        length; zeros allowed). ``kind="argmax"``: the arg-max keys :math:`j^*(i)` of the
        :math:`n` queries on the last axis (integers in :math:`[0, n)`); the counts are formed here.
    V_norm : array_like, shape (...)
        :math:`\|V\|_2` (broadcast against the leading shape).
    kind : {"counts", "argmax"}
        Meaning of ``counts``.

    Returns
    -------
    numpy.float64 or numpy.ndarray, shape (...)
        :math:`\|V\|_2\sqrt{\max_jN_j}` (at most :math:`\sqrt n\,\|V\|_2`).

    Notes
    -----
    Holds for every :math:`X` whose queries have a unique arg-max key, i.e. Lebesgue-almost every
    :math:`X` when :math:`A \ne 0`; masked: arg max over :math:`j \le i`. See
    :func:`large_radius_counts` and :func:`large_radius_deviation`. Provenance: a separate
    large-radius regime is *stated in the paper (abstract)* (published summary); the proposition is
    *derived and checked numerically*; whether the paper states a limit or a threshold is *unknown*.
    """
    checked_choice(kind, "kind", ("counts", "argmax"))
    c = np.atleast_1d(np.asarray(counts))
    if not np.issubdtype(c.dtype, np.integer):
        cf = checked_float(c, "counts")
        if (cf != np.round(cf)).any():
            raise ValueError("counts must be integers")
        c = cf.astype(np.int64)
    if (c < 0).any():
        raise ValueError("counts must be non-negative")
    if kind == "argmax":
        n = c.shape[-1]
        if (c >= n).any():
            raise ValueError(f"arg-max indices must lie in [0, {n})")
        flat = c.reshape(-1, n)
        offsets = (np.arange(flat.shape[0]) * n)[:, None]
        c = np.bincount((flat + offsets).ravel(), minlength=flat.size).reshape(c.shape)
    V = checked_norm(V_norm, "V_norm")
    return as_result(V * np.sqrt(c.max(axis=-1)))


def _scores(X: ArrayLike, A: ArrayLike, masked: bool) -> NDArray[np.float64]:
    X_ = checked_float(X, "X")
    A_ = checked_float(A, "A")
    if X_.ndim != 2 or A_.shape != (X_.shape[1], X_.shape[1]):
        raise ValueError(f"need X (n, d) and A (d, d), got {X_.shape}, {A_.shape}")
    S = X_ @ A_ @ X_.T
    if masked:
        S = np.where(np.tril(np.ones(S.shape, dtype=bool)), S, -np.inf)
    return S


def large_radius_counts(X: ArrayLike, A: ArrayLike, *, masked: bool = False) -> NDArray[np.int64]:
    r"""Count the queries of each arg-max key (docs/theory.md §7).

    :math:`N_j = \#\{i : j^*(i) = j\}`.

    Parameters
    ----------
    X : array_like, shape (n, d)
        Tokens (rows); only the direction of :math:`RX` matters for the limit.
    A : array_like, shape (d, d)
        Score matrix (score :math:`x_i^\top Ax_j`).
    masked : bool
        Causal: arg max over :math:`j \le i`.

    Returns
    -------
    numpy.ndarray of int, shape (n,)
        :math:`N_j`. Ties are broken towards the smallest index; check :func:`selection_gap` > 0.

    Notes
    -----
    Provenance: *derived and checked numerically* (docs/theory.md §7).
    """
    S = _scores(X, A, masked)
    j_star = np.argmax(S, axis=1)
    return np.bincount(j_star, minlength=S.shape[0]).astype(np.int64)


def selection_gap(X: ArrayLike, A: ArrayLike, *, masked: bool = False) -> float:
    r"""Smallest logit margin :math:`\min_i\big(\max_j x_i^\top Ax_j - \text{second largest}\big)`.

    Parameters
    ----------
    X : array_like, shape (n, d)
        Tokens at their actual scale (the margin of :math:`RX` is :math:`R^2` times that of
        :math:`X`).
    A : array_like, shape (d, d)
        Score matrix.
    masked : bool
        Causal rows (a row with a single key has margin ``inf``).

    Returns
    -------
    float
        The margin (0 when some query has tied arg-max keys).

    Notes
    -----
    Used by :func:`large_radius_deviation`. Provenance: *derived* (definition).
    """
    S = _scores(X, A, masked)
    if S.shape[0] < 2:
        return float("inf")
    top2 = -np.sort(-S, axis=1)[:, :2]
    with np.errstate(invalid="ignore"):
        gaps = top2[:, 0] - top2[:, 1]
    gaps = np.where(np.isinf(top2[:, 1]), np.inf, gaps)
    return float(gaps.min())


def large_radius_deviation(
    gap: ArrayLike, n: ArrayLike, A_norm: ArrayLike, V_norm: ArrayLike, R: ArrayLike
) -> Any:
    r"""Distance between :math:`\|Df(X)\|_2` and its hard-max limit (ours; docs/theory.md §7).

    With :math:`\eta = \min(1, (n - 1)e^{-\Delta})`, where :math:`\Delta` is the smallest logit
    margin
    of :math:`X` (:func:`selection_gap`) and :math:`S` the selection matrix of the arg-max keys,

    .. math:: \Big|\,\|Df(X)\|_2 - \|V\|_2\sqrt{\max_jN_j}\,\Big| \ \le\ \|V\|_2\big(2\sqrt n\,\eta
              + 2\|A\|_2R^2\sqrt{n\eta} + 4\|A\|_2R^2\eta\big).

    Parameters
    ----------
    gap : array_like
        Margin :math:`\Delta \ge 0` (``inf`` allowed).
    n : array_like
        Number of tokens.
    A_norm, V_norm : array_like
        :math:`\|A\|_2`, :math:`\|V\|_2`.
    R : array_like
        Maximum token norm of :math:`X`.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        The deviation bound; it vanishes exponentially as :math:`\Delta \propto R^2 \to \infty`.

    Notes
    -----
    Proof: :math:`1 - P_{ij^*} \le (n - 1)e^{-\Delta} `, so :math:`P - S` has row sums
    :math:`\le 2\eta` and column sums :math:`\le 2n\eta`, giving
    :math:`\|P - S\|_2 \le 2\sqrt n\,\eta`; the attention variance is at most
    :math:`\sum_jP_{ij}\|x_j - x_{j^*}\|^2 \le 4R^2\eta`, which bounds :math:`T_2` (Cauchy–Schwarz
    as in
    docs/theory.md §1) and :math:`\|C_i\|_2 \le 4R^2\eta` bounds :math:`T_3`; finally
    :math:`|\|Df\| - \|S \otimes V\|| \le \|Df - S\otimes V\|`. Also valid masked. Provenance:
    *derived
    and checked numerically* (ours; it quantifies "large radius", which the statement of the limit
    leaves open).
    """
    D = checked_float(gap, "gap", min_value=0.0, allow_inf=True)
    n_ = checked_float(n, "n", min_value=1.0)
    V, theta = norm_theta(A_norm, V_norm, R)
    eta = np.exp(np.minimum(quiet_log(n_ - 1.0) - D, 0.0))
    return as_result(
        V * (2.0 * np.sqrt(n_) * eta + 2.0 * theta * np.sqrt(n_ * eta) + 4.0 * theta * eta)
    )
