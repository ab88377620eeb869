r"""Kim, Papamakarios & Mnih (ICML 2021): softmax lemma and L2-attention bounds.

See docs/theory.md §8.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from theory.bounds._common import as_result, checked_choice, checked_float, checked_norm
from theory.lambert import lambertw, lambertw_exp

# ---------------------------------------------------------------------------------------------
# Kim, Papamakarios & Mnih (ICML 2021)
# ---------------------------------------------------------------------------------------------


def _phi_inv(N: NDArray[np.float64], variant: str) -> NDArray[np.float64]:
    """phi^{-1}(N - 1) = W0((N - 1)/e) (variant "N-1") or phi^{-1}(N) = W0(N/e) (variant "N")."""
    m = N - 1.0 if variant == "N-1" else N
    return np.asarray(lambertw(m / np.e))


def kim_softmax_lemma(N: ArrayLike, *, variant: Literal["N-1", "N"] = "N-1") -> Any:
    r"""Softmax-variance bound of docs/theory.md §8.

    :math:`\sum_j \mathrm{softmax}(-t)_j\,t_j \le W_0\big(\frac{N - 1}{e}\big)`.

    For costs :math:`t \in \mathbb R_{\ge 0}^N` with :math:`t_{\mathrm{self}} = 0` (docs/theory.md
    §8).

    Parameters
    ----------
    N : array_like
        Number of tokens :math:`N \ge 1`.
    variant : {"N-1", "N"}
        ``"N-1"``: :math:`W_0((N - 1)/e) = \phi^{-1}(N - 1)`; ``"N"``: :math:`W_0(N/e)`, the larger
        value computed by two public implementations.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        The bound, attained when the :math:`N - 1` other costs equal
        :math:`t^* = 1 + W_0((N - 1)/e)`.

    Notes
    -----
    At the maximiser the other costs are equal; :math:`g(t) = (N - 1)t/(e^t + N - 1)` is stationary
    where :math:`(t - 1)e^t = N - 1`, and there :math:`g = t - 1`. Derived symbolically in
    :func:`theory.symbolic.kim_softmax_lemma`. Provenance: *derived and checked numerically,
    symbolically and by brute force*; it is the lemma behind Kim et al.'s :math:`\phi^{-1}` term.
    """
    checked_choice(variant, "variant", ("N-1", "N"))
    N_ = checked_float(N, "N", min_value=1.0, allow_inf=True)
    return as_result(_phi_inv(N_, variant))


def kim_softmax_lemma_mean_field(q: ArrayLike) -> Any:
    r"""Mean-field form of the softmax-variance lemma: :math:`W_0\big(\frac{1 - q}{q\,e}\big)`.

    An atom of mass :math:`q` at zero cost and the remaining mass :math:`1 - q` at costs
    :math:`\ge 0`
    (docs/theory.md §8). :math:`q = 1/N` recovers :func:`kim_softmax_lemma`.

    Parameters
    ----------
    q : array_like
        Mass of the zero-cost atom, :math:`0 < q \le 1`.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        The bound (unbounded as :math:`q \to 0`).

    Notes
    -----
    Provenance: *derived and checked numerically*.
    """
    q_ = checked_float(q, "q")
    if ((q_ <= 0) | (q_ > 1)).any():
        raise ValueError("q must lie in (0, 1]")
    with np.errstate(divide="ignore"):
        return as_result(lambertw_exp(np.log1p(-q_) - np.log(q_) - 1.0))


def kim_l2_norms(
    WQ: ArrayLike, WV: ArrayLike, WO: ArrayLike, *, p: Literal[2, "inf"] = 2
) -> dict[str, NDArray[np.float64]]:
    r"""Weight norms entering :func:`kim_l2_upper`, computed from the weights.

    Parameters
    ----------
    WQ : array_like, shape (H, D, D/H)
        Tied query/key weights :math:`W^{Q,h}` (row-vector convention).
    WV : array_like, shape (H, D, D/H)
        Value weights :math:`W^{V,h}`.
    WO : array_like, shape (D, D)
        Output projection :math:`W^O`.
    p : {2, "inf"}
        Which norm.

    Returns
    -------
    dict
        ``WQ_norms`` (shape (H,)), ``WV_norms`` (shape (H,)), ``WO_norm`` (scalar).
        ``p=2``: :math:`\|W^{Q,h}\|_2`, :math:`\|W^{V,h}\|_2`, :math:`\|W^O\|_2`.
        ``p="inf"``: :math:`\|W^{Q,h}\|_\infty\|W^{Q,h\top}\|_\infty`,
        :math:`\|W^{V,h\top}\|_\infty`,
        :math:`\|W^{O\top}\|_\infty` (:math:`\|M\|_\infty` = largest absolute row sum).

    Notes
    -----
    docs/theory.md §8. Provenance: *standard* (operator norms).
    """
    if p not in (2, "inf"):
        raise ValueError(f"p must be 2 or 'inf', got {p!r}")
    Q = checked_float(WQ, "WQ")
    Vw = checked_float(WV, "WV")
    O_ = checked_float(WO, "WO")
    if Q.ndim != 3 or Vw.ndim != 3 or O_.ndim != 2:
        raise ValueError("need WQ and WV of shape (H, D, D/H) and WO of shape (D, D)")

    def inf_norm(M: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.abs(M).sum(axis=-1).max(axis=-1)

    if p == 2:
        return {
            "WQ_norms": np.linalg.norm(Q, 2, axis=(-2, -1)),
            "WV_norms": np.linalg.norm(Vw, 2, axis=(-2, -1)),
            "WO_norm": np.float64(np.linalg.norm(O_, 2)),
        }
    return {
        "WQ_norms": inf_norm(Q) * inf_norm(np.swapaxes(Q, -1, -2)),
        "WV_norms": inf_norm(np.swapaxes(Vw, -1, -2)),
        "WO_norm": np.float64(inf_norm(O_.T)),
    }


def kim_l2_upper(
    N: ArrayLike,
    *,
    D: int,
    H: int,
    WQ_norms: ArrayLike,
    WV_norms: ArrayLike,
    WO_norm: ArrayLike,
    p: Literal[2, "inf"] = 2,
    variant: Literal["N-1", "N"] = "N-1",
    wq_power: Literal[1, 2] = 1,
) -> Any:
    r"""Kim et al.'s Lipschitz bounds for L2 multi-head attention (docs/theory.md §8).

    With :math:`\phi^{-1}(N - 1) = W_0((N - 1)/e)`:

    .. math:: \mathrm{Lip}_\infty(F) \le \Big(4\phi^{-1}(N - 1) + \frac{1}{\sqrt{D/H}}\Big)
              \|W^{O\top}\|_\infty\max_h\|W^{Q,h}\|_\infty\|W^{Q,h\top}\|_\infty\max_h\|W^{V,h\top}\|_\infty,

    .. math:: \mathrm{Lip}_2(F) \le \frac{\sqrt N}{\sqrt{D/H}}\big(4\phi^{-1}(N - 1) + 1\big)
              \Big(\sum_h\|W^{Q,h}\|_2^2\|W^{V,h}\|_2^2\Big)^{1/2}\|W^O\|_2 .

    Parameters
    ----------
    N : array_like
        Number of tokens :math:`N \ge 1` (broadcast).
    D, H : int
        Width and number of heads (:math:`H` divides :math:`D`).
    WQ_norms, WV_norms : array_like, shape (H,)
        Per-head norms as returned by :func:`kim_l2_norms` for the same ``p`` (for ``p="inf"``,
        ``WQ_norms`` holds the products :math:`\|W^{Q,h}\|_\infty\|W^{Q,h\top}\|_\infty`).
    WO_norm : array_like
        :math:`\|W^O\|_2` (``p=2``) or :math:`\|W^{O\top}\|_\infty` (``p="inf"``).
    p : {2, "inf"}
        Which bound.
    variant : {"N-1", "N"}
        :math:`W_0((N - 1)/e)` (default) or :math:`W_0(N/e)` as in two public implementations
        (larger, so still valid).
    wq_power : {1, 2}, default 1
        ``p=2`` only: the power of :math:`\|W^{Q,h}\|_2` inside the sum. ``1`` is the form as
        recalled in docs/theory.md §8, **refuted** by our verification harness for large
        :math:`W^Q` (see Warnings); ``2`` is our repaired form
        :math:`(\sum_h\|W^{Q,h}\|_2^4\|W^{V,h}\|_2^2)^{1/2}`, a global Lipschitz bound in the
        Frobenius norm, **proved** in docs/derivations/invertible.md §2 (ours).

    Returns
    -------
    numpy.float64 or numpy.ndarray
        The bound: :math:`O(\log N)` for ``p="inf"``, :math:`O(\sqrt N\log N)` for ``p=2``.

    Notes
    -----
    Provenance: Kim, Papamakarios & Mnih, *The Lipschitz Constant of Self-Attention*, ICML 2021,
    Theorem 3.2 as *recollection, unverified*; the structure matches independent public
    implementations. The :math:`\phi^{-1}` term rests on :func:`kim_softmax_lemma` (*derived and
    checked numerically*). Whether the paper prints :math:`(N - 1)/e` or :math:`N/e` is unverified.

    Warnings
    --------
    With the L2 attention of docs/theory.md §8 (:func:`meanfield.l2_self_attention`), the ``p=2``
    form as recalled is **not a valid bound**: the map is quadratic in :math:`W^Q` (through the
    logits and :math:`A_h = W^QW^{Q\top}/\sqrt{D/H}`), so at equal tokens
    :math:`\|DF\| = \|A_hW^{V,h}W^O\|` grows like :math:`\|W^Q\|^2` while the recalled bound
    grows like :math:`\|W^Q\|`. Counterexample found by ``meanfield verify-bounds``: :math:`N = 2`,
    :math:`D = H = 1`, :math:`W^Q = 2.32` (docs/theory.md §14). Either the recollection of the
    theorem or of the definition is wrong; use ``wq_power=2``, which is proved
    (docs/derivations/invertible.md §2). The ``p="inf"`` form is already quadratic in :math:`W^Q` and survived.
    """
    if p not in (2, "inf"):
        raise ValueError(f"p must be 2 or 'inf', got {p!r}")
    checked_choice(variant, "variant", ("N-1", "N"))
    if int(H) < 1 or int(D) < 1 or int(D) % int(H) != 0:
        raise ValueError(f"need positive integers D, H with H dividing D, got D={D!r}, H={H!r}")
    N_ = checked_float(N, "N", min_value=1.0)
    q = np.atleast_1d(checked_norm(WQ_norms, "WQ_norms"))
    v = np.atleast_1d(checked_norm(WV_norms, "WV_norms"))
    if q.shape[-1] != H or v.shape[-1] != H:
        raise ValueError(f"WQ_norms and WV_norms need one entry per head (H = {H})")
    o = checked_norm(WO_norm, "WO_norm")
    head_dim = D / H
    lam = _phi_inv(N_, variant)
    if wq_power not in (1, 2):
        raise ValueError(f"wq_power must be 1 or 2, got {wq_power!r}")
    if p == 2:
        qv = np.sqrt(np.sum(q ** (2 * wq_power) * v**2, axis=-1))
        return as_result(np.sqrt(N_ / head_dim) * (4.0 * lam + 1.0) * qv * o)
    return as_result((4.0 * lam + 1.0 / np.sqrt(head_dim)) * o * q.max(axis=-1) * v.max(axis=-1))
