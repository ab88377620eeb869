r"""The √n fit and the bounds drawn beside the measured constants of the ``adversarial`` stage.

The global √n bound summed over heads, the released data-dependent heuristic, the per-head facts
they need, and the least-squares constants of :math:`C\sqrt n` and of a free power law.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..fits import fit_power_law

if TYPE_CHECKING:
    from theory.bounds import SqrtNForm


def fit_sqrt_n(n: Sequence[float], y: Sequence[float]) -> float:
    r"""Least-squares constant of :math:`y\approx C\sqrt n` through the origin.

    .. math:: C=\arg\min_C\sum_k(y_k-C\sqrt{n_k})^2=\frac{\sum_ky_k\sqrt{n_k}}{\sum_kn_k}.

    Parameters
    ----------
    n, y : sequence of float
        Lengths (positive) and values, same size, at least one point.

    Returns
    -------
    float
    """
    n_ = np.asarray(n, dtype=float)
    y_ = np.asarray(y, dtype=float)
    if n_.shape != y_.shape or n_.ndim != 1 or n_.size == 0:
        raise ValueError(
            f"n and y must be non-empty 1-d arrays of one size, got {n_.shape}, {y_.shape}"
        )
    if not (np.all(np.isfinite(n_)) and np.all(n_ > 0) and np.all(np.isfinite(y_))):
        raise ValueError("n must be positive and finite, y finite")
    return float(np.sum(y_ * np.sqrt(n_)) / np.sum(n_))


def free_power_law(n: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """``(c, alpha)`` of the least-squares power law (no bootstrap interval)."""
    fit = fit_power_law(n, y, n_boot=0)
    return fit.c, fit.alpha


def layer_head_facts(params: Any) -> list[dict[str, float]]:
    """Per-head norms in float64: ||W_h V_h||, ||V_h||, ||A_h||_eff parts, rotary flag."""
    import torch

    out = []
    for h, head in enumerate(params.heads):
        A = head.A.detach().to(torch.float64)
        WV = params.head_output_matrix(h) if hasattr(params, "head_output_matrix") else head.V
        c = head.c
        facts = {
            "WV_norm": float(torch.linalg.matrix_norm(WV.detach().to(torch.float64), ord=2)),
            "V_norm": float(torch.linalg.matrix_norm(head.V.detach().to(torch.float64), ord=2)),
            "A_norm": float(torch.linalg.matrix_norm(A, ord=2)),
            "c_norm": 0.0 if c is None else float(torch.linalg.vector_norm(c.to(torch.float64))),
            "rope": head.rope is not None,
        }
        if head.rope is not None:
            alpha2 = float(head.rope.attention_scaling) ** 2
            qn = float(torch.linalg.matrix_norm(head.Q.detach().to(torch.float64), ord=2))
            kn = float(torch.linalg.matrix_norm(head.K.detach().to(torch.float64), ord=2))
            facts["QK_norm"] = alpha2 * qn * kn
        out.append(facts)
    return out


def _effective_A_norm(f: Mapping[str, Any], R: float) -> float:
    if f["rope"]:
        return float(f["QK_norm"])
    return float(f["A_norm"]) + float(f["c_norm"]) / R


def global_bound(
    head_facts: Sequence[Mapping[str, Any]], R: float, n: int, *, form: SqrtNForm = "sqrt3"
) -> float:
    r"""Global √n bound of docs/theory.md §1 for a multi-head layer on :math:`B_R^n`.

    .. math:: \sum_h\|W_hV_h\|_2\;B\big(\|A_h\|_{\mathrm{eff}},1,R,n\big)

    with :math:`B` = :func:`theory.bounds.sqrt_n_upper` (``form`` ``"sqrt3"``, ``"sharp"`` or
    ``"triangle"``), :math:`\|A_h\|_{\mathrm{eff}}=\|A_h\|_2+\|c_h\|/R` (query bias; our
    derivation from docs/conventions.md, biases) or :math:`\alpha^2\|Q_h\|_2\|K_h\|_2` for a
    rotary head (the supremum over relative positions; our derivation). Holds masked and unmasked.

    Parameters
    ----------
    head_facts : sequence of mapping
        Per-head ``WV_norm``, ``A_norm``, ``c_norm``, ``rope`` (and ``QK_norm`` for rotary
        heads), as stored in ``<id>.json``.
    R : float
        Radius: every token has norm at most ``R``.
    n : int
    form : {"sqrt3", "sharp", "triangle"}

    Returns
    -------
    float
    """
    from theory.bounds import sqrt_n_upper

    if not R > 0:
        raise ValueError(f"R must be positive, got {R}")
    return float(
        sum(
            f["WV_norm"] * sqrt_n_upper(_effective_A_norm(f, R), 1.0, R, n, form=form)
            for f in head_facts
        )
    )


def released_heuristic(X: Any, params: Any) -> float:
    r"""The released data-dependent quantity of docs/theory.md §2 (**not a valid upper bound**).

    :math:`\sum_h\|V_h\|_2(R_h^2r^2(n+1)+n)^{1/2}` with :math:`r` the diameter of the tokens and
    :math:`R_h=\max_i\|A_{\mathrm{code},h}x_i\|=\max_i\|A_h^\top x_i\|`; without :math:`W^O`, as
    released. Rotary heads use their position-0 score matrix.

    Parameters
    ----------
    X : Tensor, shape (n, d)
    params : MultiHeadParams or AttentionParams

    Returns
    -------
    float
    """
    import torch

    from theory.bounds import released_data_dependent

    X64 = X.detach().to(torch.float64)
    n = X64.shape[0]
    r = float(torch.cdist(X64, X64).max())
    V_norms, R_h = [], []
    for head in params.heads:
        A = head.A.detach().to(X64)
        V_norms.append(float(torch.linalg.matrix_norm(head.V.detach().to(X64), ord=2)))
        R_h.append(float(torch.linalg.vector_norm(X64 @ A, dim=-1).max()))  # rows (A^T x_i)^T
    return float(released_data_dependent(V_norms, R_h, r, n))
