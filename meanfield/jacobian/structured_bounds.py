r"""Deterministic bounds from the per-head structure, for any heads (rotary included).

:func:`head_structured_upper` (the three-term split of each head's Jacobian, docs/certificates.md
§5.2) and :func:`structured_block_norms` (block norms with key-dependent logit gradients, §5.3):
the certificates of layers whose heads rotate queries and keys by position.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .._spectral import U64, collatz_wielandt_bound
from .._typing import Params
from ..attention import admissible_keys, head_logits
from ..params import MultiHeadParams
from .head_rows import norm2_upper, rebalanced
from .linearization import (
    AttentionLinearization,
    as_float64,
    head_output_matrices,
    log_attention,
    need,
    require_factors,
    require_rope,
)


def _variance(P: Tensor, F: Tensor) -> Tensor:
    r""":math:`\sum_lP_{il}\|f_l - \bar f_i\|^2` (..., H, n) for rows ``F`` (..., H, n, k).

    ``F`` should be centred; the cancellation of the second-moment form is covered by a slack
    :math:`4(k + n + 4)u` times the moments (float64).
    """
    f2 = F.square().sum(-1)  # (..., H, n)
    second = (P @ f2.unsqueeze(-1)).squeeze(-1)
    mean2 = (P @ F).square().sum(-1)
    slack = 4 * (F.shape[-1] + P.shape[-1] + 4) * U64
    return (second - mean2).clamp_min(0) + slack * (second + mean2)


@dataclass(frozen=True, eq=False)
class _HeadFeatures:
    """One head's rows for the structured bounds (float64; analytic or rotary head)."""

    h: int  # index of the head in the layer
    P: Tensor  # (..., n, n) attention matrix
    q: Tensor  # (..., n, k) query rows (rotated for rotary heads)
    k: Tensor  # (..., n, k) key rows, centred (rotated for rotary heads)
    v: Tensor  # (..., n, d_v) rows V(x_l - x_bar)
    c: Tensor | None  # (d,) key-logit term
    rho: float  # bound on the scaling of the rotation (1 without)
    Q: Tensor | None  # (k, d) query factor (None: the identity)
    K: Tensor  # (k, d) key factor (A_h without factors)


def _head_features(lin: AttentionLinearization) -> list[_HeadFeatures]:
    """Per head (all heads, rotary included): P, query rows, centred key rows, value spreads."""
    lin = as_float64(lin)
    heads = lin.params.heads
    X = lin.X
    n = lin.n
    out = []
    allowed = admissible_keys(lin.masked, n, n, lin.positions, None, X.device)
    idx = torch.arange(n, device=X.device) if lin.token_index is None else lin.token_index
    if lin.analytic_heads:
        Qx, KXc, VXc = need(lin.Qx, "Qx"), need(lin.KXc, "KXc"), need(lin.VXc, "VXc")
    for a, h in enumerate(lin.analytic_heads):
        # the identity for Q without factors
        Q, K = (None, lin.A[a]) if lin.QK is None else (lin.QK[0][a], lin.QK[1][a])
        out.append(
            _HeadFeatures(
                h=h, P=lin.P[..., a, :, :], q=Qx[..., a, :, :], k=KXc[..., a, :, :],
                v=VXc[..., a, :, :], c=None if lin.C is None else lin.C[a], rho=1.0, Q=Q, K=K,
            )
        )  # fmt: skip
    for h in lin.rope_heads:
        head = heads[h]
        if head.variants:
            raise ValueError(
                f"the structured Jacobian bound does not model {', '.join(head.variants)} yet"
            )
        head64 = head if head.dtype == torch.float64 else head.to(dtype=torch.float64)
        rope = require_rope(head64)
        Q64, K64 = require_factors(head64)
        rr = lin.rope_rows
        if rr is not None:  # formed by linearize (rotated at the token positions)
            r = rr.heads.index(h)
            P, q, k, v = (t[..., r, :, :] for t in (rr.P, rr.q, rr.kc, rr.VXc))
        else:
            logits = head_logits(X, X, head64, lin.log_weights, query_index=idx, key_index=idx)
            P = log_attention(logits, allowed).exp()
            q = rope.apply(X @ Q64.mT, idx)
            k = rope.apply(X @ K64.mT, idx)
            k = k - k.mean(-2, keepdim=True)  # a constant shift leaves the spreads unchanged
            v = (X - lin.x_bar) @ head64.V.mT
        out.append(
            _HeadFeatures(
                h=h, P=P, q=q, k=k, v=v, c=head64.c,
                rho=abs(float(rope.attention_scaling)) * (1 + 64 * U64), Q=Q64, K=K64,
            )
        )  # fmt: skip
    return out


_HEAD_NORM_CACHE: weakref.WeakKeyDictionary[Params, dict[int, dict[str, Tensor]]] = (
    weakref.WeakKeyDictionary()
)


def _per_head_norms(
    params: Params, feats: Sequence[_HeadFeatures | HeadTerms]
) -> dict[int, dict[str, Tensor]]:
    """Certified norms of each head's ``V``, ``Q``, ``K`` and ``W_h`` (cached per ``params``).

    The structured bounds need them on every call; one SVD each, computed once per layer.
    """
    cached = _HEAD_NORM_CACHE.get(params)
    if cached is not None and all(f.h in cached for f in feats):
        return cached
    W, _ = head_output_matrices(params)
    out = {
        f.h: {
            "V": norm2_upper(params.heads[f.h].V),
            "Q": norm2_upper(f.Q),
            "K": norm2_upper(f.K),
            "W": norm2_upper(W[f.h]),
        }
        for f in feats
    }
    _HEAD_NORM_CACHE[params] = out
    return out


_STACK_CACHE: weakref.WeakKeyDictionary[Params, dict[str, Tensor]] = weakref.WeakKeyDictionary()


def _stacked_norms(params: Params, feats: Sequence[_HeadFeatures | HeadTerms]) -> dict[str, Tensor]:
    r"""Certified norms of the head matrices stacked over heads (cached per ``params``).

    ``V``: :math:`[V_1; \dots; V_H]`; ``K``: :math:`[\hat K_1; \dots; \hat K_H]` (with the key-logit
    rows :math:`c_h^\top`); ``Q``: :math:`[Q_1; \dots; Q_H]` (the identity for heads without
    factors); ``W``: :math:`\|W^O\|` (1 for concatenated heads).
    """
    cached = _STACK_CACHE.get(params)
    if cached is not None:
        return cached
    f64 = torch.float64
    Vs, Ks, Qs = [], [], []
    for f in feats:
        head = params.heads[f.h]
        d = head.V.shape[-1]
        Vs.append(head.V.to(f64))
        K = f.K.to(f64)
        if f.c is not None:
            K = torch.cat([K, f.c.to(f64).reshape(1, -1)], dim=0)
        Ks.append(K)
        Qs.append(torch.eye(d, dtype=f64, device=K.device) if f.Q is None else f.Q.to(f64))
    out = {
        "V": norm2_upper(torch.cat(Vs)),
        "K": norm2_upper(torch.cat(Ks)),
        "Q": norm2_upper(torch.cat(Qs)),
        "W": norm2_upper(params.W_O if isinstance(params, MultiHeadParams) else None),
    }
    _STACK_CACHE[params] = out
    return out


def head_structured_upper(lin: AttentionLinearization) -> Tensor:
    r"""Deterministic upper bound on :math:`\|J\|_2` from the per-head structure (Euclidean).

    Each head's Jacobian splits as :math:`J^h = J^h_1 + J^h_2 + J^h_3` (docs/certificates.md §5.2):
    the mixing term :math:`P^h\otimes V_h` with :math:`\|J^h_1\|\le\|P^h\|_2\|V_h\|_2`
    (:math:`\|P^h\|_2` by a Collatz–Wielandt bound), the key-logit term
    :math:`(J^h_2H)_i = \sum_lP_{il}\langle\hat q_i, \hat K_lh_l\rangle V(x_l-m_i)` bounded by
    Cauchy–Schwarz in :math:`l` and then by the largest column weight, and the self term
    :math:`(J^h_3H)_i = V\sum_lP_{il}(x_l-m_i)(\tilde k_l-\bar k_i)^\top\tilde Q_ih_i` bounded by
    the two spreads. Each of the three multi-head terms is bounded twice, per head
    (:math:`\sum_h\|W_h\|\,\cdot`) and through the stacked head matrices
    (:math:`\|W^O\|\max_h(\cdot)\,\|[M_1;\dots;M_H]\|`, which sees that the heads share the
    input and output spaces); the smaller is kept. Rotary heads enter through their rotated
    queries and keys (rotations scaled by ``attention_scaling``), so this bound covers them.
    Cost :math:`O(Hn^2k)`, the order of one product. The caller adds its evaluation margin.

    Returns
    -------
    Tensor, float64, shape lin.batch_shape
    """
    lin = rebalanced(lin)  # V_h, W_h of extreme but balanced product (docs/rounding.md §5)
    terms = []
    for f in _head_features(lin):
        P = f.P
        p_norm = collatz_wielandt_bound(P, n_steps=8)
        kap2 = _variance(P, f.v)  # sum_l P_il ||V (x_l - m_i)||^2
        q = f.q
        q2 = q.square().sum(-1)
        if f.c is not None:
            q = torch.cat([q, q.new_ones(q.shape[:-1] + (1,))], dim=-1)
            q2 = q2 + 1
        trace_form = (P.mT @ (kap2 * q2).unsqueeze(-1)).squeeze(-1)  # (..., n) over l
        sq = torch.linalg.matrix_norm(q, ord=2) * (1 + 8 * q.shape[-2] * U64)
        weight_form = (kap2.unsqueeze(-1) * P).amax(-2) * sq.square().unsqueeze(-1)
        lam = torch.minimum(trace_form, weight_form).amax(-1) * (1 + 8 * lin.n * U64)
        s3 = (kap2 * _variance(P, f.k)).sqrt().amax(-1)
        terms.append(
            HeadTerms(h=f.h, c=f.c, rho=f.rho, Q=f.Q, K=f.K, p_norm=p_norm, s2=lam.sqrt(), s3=s3)
        )
    return combine_head_terms(lin.params, terms, lin.X.device)


@dataclass(frozen=True, eq=False)
class HeadTerms:
    r"""One head's three bounds of docs/certificates.md §5.2, before its weight norms.

    ``p_norm`` bounds :math:`\|P^h\|_2`, ``s2`` the key-logit term and ``s3`` the self term
    without :math:`\|K_h\|`, :math:`\|Q_h\|` and :math:`\|W_h\|` (float64, batch shape).
    ``h``, ``c``, ``rho``, ``Q`` and ``K`` are the head's index, key-logit term, rotary scaling
    bound and factors (``Q`` ``None``: the identity; ``K`` is :math:`A_h` without factors).
    :func:`head_structured_upper` forms them from the stored attention matrices, and
    :func:`~meanfield.jacobian.streaming_bounds.streaming_structured_upper` from tiles.
    """

    h: int
    c: Tensor | None
    rho: float
    Q: Tensor | None
    K: Tensor
    p_norm: Tensor
    s2: Tensor
    s3: Tensor


def combine_head_terms(params: Params, terms: list[HeadTerms], device: torch.device) -> Tensor:
    r"""The bound on :math:`\|J\|_2` from every head's :class:`HeadTerms` (docs/certificates.md §5.2).

    Each of the three multi-head terms is bounded per head (:math:`\sum_h\|W_h\|\,\cdot`) and
    through the stacked head matrices (:math:`\|W^O\|\max_h(\cdot)\,\|[M_1;\dots;M_H]\|`); the
    smaller is kept, and the sum of the three is compared with the root-sum-square over heads.
    """
    stack = _stacked_norms(params, terms)
    full: dict[str, list[Tensor]] = {"1": [], "2": [], "3": []}  # bounds on ||J^h_t|| (no W_h)
    w_norms = []
    rho_max = 1.0
    hn = _per_head_norms(params, terms)
    for f in terms:
        rho = f.rho
        rho_k = max(rho, 1.0) if f.c is not None else rho
        rho_max = max(rho_max, rho_k, rho)
        nV, nQ, nK = (hn[f.h][key] for key in ("V", "Q", "K"))
        if f.c is not None:
            nK = (nK.square() + f.c.to(torch.float64).square().sum()).sqrt()
        full["1"].append(f.p_norm * nV)
        full["2"].append(f.s2 * nK * rho_k)
        full["3"].append(f.s3 * nQ * rho)
        w_norms.append(hn[f.h]["W"])
    parts = {"1": [f.p_norm for f in terms], "2": [f.s2 for f in terms], "3": [f.s3 for f in terms]}
    wn = torch.stack(w_norms).to(device)
    scale = {"1": stack["V"], "2": stack["K"] * rho_max, "3": stack["Q"] * rho_max}
    # zero tensors where the sums started from the integer 0: the same additions, bit for bit
    total = per_head_total = torch.zeros((), dtype=torch.float64)
    for t in ("1", "2", "3"):
        b = torch.stack(full[t], dim=-1)  # (..., H)
        per_head = (b * wn).sum(-1)
        stacked = stack["W"] * torch.stack(parts[t], dim=-1).amax(-1) * scale[t]
        total = total + torch.minimum(per_head, stacked)
        per_head_total = per_head_total + b
    whole = stack["W"] * per_head_total.square().sum(-1).sqrt()
    return torch.minimum(total, whole) * (1 + 16 * len(terms) * U64)


def structured_block_norms(lin: AttentionLinearization) -> Tensor:
    r"""Nonnegative :math:`N_{ij}\ge\|J_{ij}\|_2` for any heads, rotary ones included (Euclidean).

    Per head, :math:`J^h_{ij} = P_{ij}V(I + (x_j-m_i)\,b_{ij}^\top) + \delta_{ij}S^h_i` with
    :math:`b_{ij} = \partial_{x_j}s_{ij}` (:math:`\hat K_j^\top\hat q_i`; rotated by the key's
    position for rotary heads), so
    :math:`\|J^h_{ij}\|\le P_{ij}\big(\|V\| + \|V(x_j-m_i)\|(\rho\|K\|\|q_i\| + \|c\|)\big)
    + \delta_{ij}\|S^h_i\|`, with :math:`\|S^h_i\|` bounded as the self term of
    :func:`head_structured_upper`. Heads combine blockwise as
    :math:`\min(\sum_h\|W_h\|N^h_{ij},\ \|W^O\|(\sum_h(N^h_{ij})^2)^{1/2})`. Cost
    :math:`O(Hn^2k)`; then :math:`\|J\|_2\le\|N\|_2` (Collatz–Wielandt). For heads without
    rotary embedding :func:`block_norm_bounds` is sharper (closed-form rank-one norms).

    Returns
    -------
    Tensor, float64, shape (..., n, n)
    """
    lin = rebalanced(lin)  # as in head_structured_upper
    params = lin.params
    feats = _head_features(lin)
    W_O = params.W_O if isinstance(params, MultiHeadParams) else None
    # zero tensors where the sums started from the integer 0: the same additions, bit for bit
    total = squares = torch.zeros((), dtype=torch.float64)
    hn = _per_head_norms(params, feats)
    for f in feats:
        P, v = f.P, f.v
        vbar = P @ v  # V(m_i - x_bar)
        vn2 = v.square().sum(-1).unsqueeze(-2)  # (..., 1, n)
        vb2 = vbar.square().sum(-1, keepdim=True)  # (..., n, 1)
        slack = 4 * (v.shape[-1] + 4) * U64
        d2 = (vn2 - 2 * vbar @ v.mT + vb2).clamp_min(0) + slack * (vn2 + vb2)
        qn = f.q.square().sum(-1).sqrt() * (1 + slack)
        nV, nK, nQ = hn[f.h]["V"], hn[f.h]["K"] * f.rho, hn[f.h]["Q"] * f.rho
        bn = qn * nK
        if f.c is not None:
            bn = bn + f.c.to(torch.float64).square().sum().sqrt()
        self_h = (_variance(P, v) * _variance(P, f.k)).sqrt() * nQ
        N_h = P * (nV + d2.sqrt() * bn.unsqueeze(-1)) + torch.diag_embed(self_h)
        total = total + hn[f.h]["W"] * N_h
        squares = squares + N_h.square()
    stacked = squares.sqrt()
    # W_O is None: concatenated heads
    out = stacked if W_O is None else torch.minimum(total, norm2_upper(W_O) * stacked)
    return out * (1 + 16 * len(feats) * U64)
