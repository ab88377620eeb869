r"""The certified data-dependent upper bound on the local Lipschitz constant of attention.

:func:`certified_local_upper` evaluates, in float64 with an outward margin, a closed-form bound
from the attention matrix, the per-query covariances and the weights at one input
(:class:`LocalUpperBound`), without forming the Jacobian.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .._theory_import import require_theory
from .._typing import Params
from .._validation import check_flag, reject_variants
from ..params import AttentionParams, MultiHeadParams

#: Relative margin applied to the float64 evaluation of :func:`certified_local_upper`.
_LOCAL_BOUND_MARGIN = 1e-9


@dataclass(frozen=True)
class LocalUpperBound:
    r"""The certified data-dependent bound of :func:`certified_local_upper`.

    Attributes
    ----------
    value : float
        The bound on :math:`\|Df(X)\|_2`: the head-weighted terms summed plus the rounding
        margin of docs/rounding.md §8 (§8.1 for rotary heads), which grows with the logits'
        magnitude.
    T1, T2, T3 : float
        Head-weighted sums :math:`\sum_h\|W_hV_h\|_2\,T_k^h` of the three terms.
    """

    value: float
    T1: float
    T2: float
    T3: float


def _lambda_max_product(KL: Tensor, KR: Tensor) -> Tensor:
    r""":math:`\lambda_{\max}(K^LK^R)` for batches of PSD matrices, via :math:`(K^L)^{1/2}K^R(K^L)^{1/2}`."""
    e, U = torch.linalg.eigh(KL)
    S = (U * e.clamp_min(0.0).sqrt().unsqueeze(-2)) @ U.mT
    M = S @ KR @ S
    return torch.linalg.eigvalsh(0.5 * (M + M.mT))[..., -1].clamp_min(0.0)


def _head_local_terms(
    X: Tensor, head: AttentionParams, masked: bool
) -> tuple[float, float, float, tuple[Tensor, Tensor, Tensor]]:
    r"""(T1, T2, T3) of the certified local bound for one head, float64, V factor excluded.

    The fourth element holds the logits (``-inf`` where masked), :math:`\kappa^2` and
    :math:`\beta^2`, which the rounding margin reads (docs/rounding.md §8).
    """
    n, d = X.shape
    pos = torch.arange(n, device=X.device)
    if head.rope is None:
        A = head.A.to(X)
        c = None if head.c is None else head.c.to(X)
        S = X @ A @ X.mT
        if c is not None:
            S = S + (X @ c).unsqueeze(0)
    else:
        factors = head.factors
        if factors is None:
            raise ValueError("a rotary embedding needs the factors Q and K")
        Q, K = factors[0].to(X), factors[1].to(X)
        q = head.rope.apply(X @ Q.mT, pos)  # (n, k) rotated queries rho_i Q x_i
        k = head.rope.apply(X @ K.mT, pos)  # rotated keys rho_j K x_j
        S = q @ k.mT
    if masked:
        S = S.masked_fill(torch.ones(n, n, dtype=torch.bool, device=X.device).triu(1), -math.inf)
    P = torch.softmax(S, dim=-1)
    sqP = P.sqrt()
    # Differences x_j - m_i in coordinates of an orthonormal basis of the span of the tokens
    # (at most n of them): exact differences without forming (n, n, d) tensors or the
    # cancellation-prone |x_j|^2 - 2 x_j.m_i + |m_i|^2.
    Y = X if n >= d else X @ torch.linalg.qr(X.mT)[0]
    m = P @ Y
    D = Y.unsqueeze(0) - m.unsqueeze(1)  # D[i, j] = x_j - m_i
    kappa2 = (P * D.square().sum(-1)).sum(-1)
    # T1 = ||P||_2: the exact value or the column-sum bound, whichever is smaller
    t1_col = float(P.sum(0).max().sqrt())
    t1 = min(t1_col, float(torch.linalg.matrix_norm(P, ord=2)) * (1 + _LOCAL_BOUND_MARGIN))
    # beta_ij = ||d s_ij / d x_j|| and the Gram matrices of the query gradients d s_ij / d x_i
    if head.rope is None:
        g = X @ A  # rows (A^T x_i)^T
        if c is not None:
            g = g + c
        beta2 = g.square().sum(-1).unsqueeze(-1).expand(n, n)
        a = X @ A.mT  # rows (A x_j)^T, the same for every query
        KR = sqP.unsqueeze(-1) * (a @ a.mT).unsqueeze(0) * sqP.unsqueeze(-2)
    else:
        # d s_ij / d x_j = K^T rho_j^T q~_i and d s_ij / d x_i = Q^T rho_i^T k~_j, where
        # rho_p = alpha Rot(p theta), so rho_p^T = alpha Rot(-p theta): rope.apply at -p.
        neg = -pos
        zq = head.rope.apply(q.unsqueeze(1).expand(n, n, -1), neg.unsqueeze(0).expand(n, n))
        beta2 = ((zq @ (K @ K.mT)) * zq).sum(-1)  # [i, j] = |K^T rho_j^T q~_i|^2
        zk = head.rope.apply(k.unsqueeze(0).expand(n, n, -1), neg.unsqueeze(1).expand(n, n))
        KR = sqP.unsqueeze(-1) * (zk @ (Q @ Q.mT) @ zk.mT) * sqP.unsqueeze(-2)
    t2 = float((P * kappa2.unsqueeze(-1) * beta2).sum(0).max().clamp_min(0.0).sqrt())
    L = sqP.unsqueeze(-1) * D  # L_i rows sqrt(P_ij) (x_j - m_i)
    t3 = float(_lambda_max_product(L @ L.mT, KR).max().sqrt())
    return t1, t2, t3, (S, kappa2, beta2)


def certified_local_upper(
    X: Tensor,
    params: Params,
    *,
    masked: bool = False,
    WV_norms: list[float] | tuple[float, ...] | None = None,
) -> LocalUpperBound:
    r"""Certified data-dependent upper bound on :math:`\|Df(X)\|_2` at one sequence.

    .. math:: \|Df(X)\|_2\le\sum_h\|W_hV_h\|_2\Big(\|P^h\|_2
              +\big(\max_j\textstyle\sum_iP^h_{ij}\kappa_i^2\beta_{ij}^2\big)^{1/2}
              +\max_i\|M^h_i\|_2\Big),

    with :math:`\kappa_i^2=\sum_jP_{ij}\|x_j-m_i\|^2`, :math:`\beta_{ij}=\|\partial_{x_j}s_{ij}\|`
    and :math:`M_i=\sum_jP_{ij}(x_j-m_i)(\partial_{x_i}s_{ij})^\top` for the logits
    :math:`s_{ij}`. Without rotary embedding :math:`\partial_{x_j}s_{ij}=A^\top x_i+c` and
    :math:`\partial_{x_i}s_{ij}=Ax_j`, and this is docs/theory.md §2a (:math:`M_i=C_iA^\top`); with
    rotary heads the same proof holds with the position-dependent gradients (our extension).
    :math:`\|P\|_2` is the smaller of its exact value and :math:`(\max_j\sum_iP_{ij})^{1/2}`;
    :math:`\|M_i\|_2^2=\lambda_{\max}(K^L_iK^R_i)` with the :math:`n\times n` Gram matrices of
    :math:`\sqrt{P_{ij}}(x_j-m_i)` and :math:`\sqrt{P_{ij}}\,\partial_{x_i}s_{ij}`. Holds masked
    or not. :func:`theory.bounds.certified_local_upper` is the independent numpy form (no
    rotary heads), used as the oracle of this one.

    Provenance: *derived and checked numerically* (docs/theory.md §2a; tests compare it with dense
    Jacobians, with biases, masks and rotary heads). Cost: :math:`O(n^3)` per head (one
    :math:`n\times n` eigenproblem per query when :math:`n<d`); meant for the sequence lengths
    of the √n regime, not as a matrix-free certificate.

    Parameters
    ----------
    X : Tensor, shape (n, d)
        One sequence (evaluated in float64).
    params : AttentionParams or MultiHeadParams
        Biases, output projection and rotary embedding included.
    masked : bool, default False
        Causal mask.
    WV_norms : sequence of float, optional
        Precomputed :math:`\|W_hV_h\|_2` (default: one SVD per head).

    Returns
    -------
    LocalUpperBound
    """
    if X.ndim != 2:
        raise ValueError(f"X must have shape (n, d), got {tuple(X.shape)}")
    if X.shape[-1] != params.d:
        raise ValueError(f"X has d = {X.shape[-1]} but the parameters have d = {params.d}")
    if not bool(torch.isfinite(X).all()):
        raise ValueError("X has non-finite entries")
    heads = params.heads  # an AttentionParams is its own single head
    reject_variants(params, "the certified local bound")
    if WV_norms is not None and len(WV_norms) != len(heads):
        raise ValueError(f"WV_norms has {len(WV_norms)} entries for {len(heads)} heads")
    require_theory()  # a user's own theory.py must not stand in for ours
    from theory.rounding import RotaryRows, head_upper  # the one rounding model, lazily

    masked = check_flag(masked, "masked")
    X64 = X.detach().to(torch.float64)
    terms = [0.0, 0.0, 0.0]
    total = 0.0
    with torch.no_grad():
        for h, head in enumerate(heads):
            WV = params.head_output_matrix(h) if isinstance(params, MultiHeadParams) else head.V
            WV = WV.detach().to(torch.float64)
            # a given norm is taken as exact (a 1 x 1 matrix carries it to the margin below)
            w = float(torch.linalg.matrix_norm(WV, ord=2) if WV_norms is None else WV_norms[h])
            h64 = head if head.dtype == torch.float64 else head.to(dtype=torch.float64)
            t1, t2, t3, (S, kappa2, beta2) = _head_local_terms(X64, h64, masked)
            for k, t in enumerate((t1, t2, t3)):
                terms[k] += w * t
            # rounding margin of docs/rounding.md §8 (rotary heads: §8.1): grows with the
            # logits' magnitude
            c = None if h64.c is None else h64.c.cpu().numpy()
            WVm = WV.cpu().numpy() if WV_norms is None else np.array([[w]])
            rotary = None
            if h64.rope is not None and h64.factors is not None:  # factors checked above
                Q, K = h64.factors
                rotary = RotaryRows(
                    Q.cpu().numpy(), K.cpu().numpy(), h64.rope.inv_freq.cpu().numpy(),
                    float(h64.rope.attention_scaling), np.arange(X64.shape[0]),
                )  # fmt: skip
            total += head_upper(
                X64.cpu().numpy(), h64.A.cpu().numpy(), c, S.cpu().numpy(), WVm,
                t1, t2, t3, kappa2.cpu().numpy(), beta2.cpu().numpy(), rotary,
            )  # fmt: skip
    return LocalUpperBound(total, *terms)
