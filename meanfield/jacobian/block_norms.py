r"""Certified upper bounds on the Jacobian's operator norm from its block structure.

:func:`weight_norms` (certified float64 norms of the weights), :func:`block_norm_bounds`,
:func:`self_norm_trace_bound`, :func:`head_structured_upper` and :func:`structured_block_norms`:
deterministic certificates that never form the Jacobian.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, replace
from typing import Literal

import torch
from torch import Tensor

from .._numerics import iter_chunks
from .._spectral import rank_one_sigma_max_from_stats, spectral_norm_upper
from ..attention import head_logits
from ..params import AttentionParams, MultiHeadParams
from .linearization import (
    AttentionLinearization,
    _admissible,
    _head_output_matrices,
    _log_attention,
)
from .products import _check_geometry, _interaction, _require_analytic

Params = AttentionParams | MultiHeadParams
Geometry = Literal["euclidean", "wasserstein"]

# ------------------------------------------------------------------------ block-norm bounds
_U64 = torch.finfo(torch.float64).eps / 2


@dataclass(frozen=True, eq=False)
class WeightNorms:
    r"""Certified float64 upper bounds on the operator norms entering the block bounds.

    Attributes
    ----------
    A, V, O : Tensor, shape (H_a,)
        :math:`\|A_h\|_2`, :math:`\|V_h\|_2` and :math:`\|W_hV_h\|_2` for the analytic heads.
    W_O : Tensor, shape () or None
        :math:`\|W^O\|_2` (``None`` when the heads are concatenated).
    """

    A: Tensor
    V: Tensor
    O: Tensor
    W_O: Tensor | None


_NORM_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def weight_norms(params: Params) -> WeightNorms:
    """Certified norms of the weight matrices of the analytic heads (cached per ``params``).

    Each is an SVD value certified by the Cholesky test of
    :func:`meanfield._spectral.certify_upper` (:func:`~meanfield._spectral.spectral_norm_upper`).
    """
    cached = _NORM_CACHE.get(params)
    if cached is not None:
        return cached
    heads = params.heads
    analytic = [h for h, head in enumerate(heads) if getattr(head, "rope", None) is None]
    W, concat = _head_output_matrices(params)
    dev = heads[0].A.device
    if analytic:
        A = torch.stack([heads[h].A for h in analytic]).to(torch.float64)
        V = torch.stack([heads[h].V for h in analytic]).to(torch.float64)
        O = W[analytic].to(torch.float64) @ V

        def upper(M: Tensor) -> Tensor:
            return spectral_norm_upper(M, candidate=torch.linalg.matrix_norm(M, ord=2), max_iter=0)

        nA, nV, nO = upper(A), upper(V), upper(O)
    else:
        nA = nV = nO = torch.zeros(0, dtype=torch.float64, device=dev)
    nW = None
    if not concat:
        W_O = params.W_O.to(torch.float64)
        nW = spectral_norm_upper(W_O, candidate=torch.linalg.matrix_norm(W_O, ord=2), max_iter=0)
    out = WeightNorms(A=nA, V=nV, O=nO, W_O=nW)
    _NORM_CACHE[params] = out
    return out


def _combine_heads(bV: Tensor, bO: Tensor | None, norms: WeightNorms, concat: bool) -> Tensor:
    r"""Bound :math:`\|\sum_hW_hV_hT_h\|` from per-head bounds (head axis -3).

    ``bV`` bounds :math:`\|V_hT_h\|` and ``bO`` bounds :math:`\|W_hV_hT_h\|`. Concatenated heads
    stack vertically: :math:`(\sum_hb_{V,h}^2)^{1/2}`. With :math:`W^O`:
    :math:`\min\big(\sum_hb_{O,h},\ \|W^O\|(\sum_hb_{V,h}^2)^{1/2}\big)`.
    """
    stacked = bV.square().sum(-3).sqrt()
    if concat:
        return stacked
    return torch.minimum(bO.sum(-3), norms.W_O * stacked)


#: Query-block size of :func:`block_norm_bounds` (its (H, block, n) intermediates stay in cache).
_BLOCK_ROWS = 64


@dataclass(frozen=True)
class _Projected:
    """Centred statistics of the keys seen through a matrix M (per head)."""

    dist2: Tensor | None  # (..., H, n, n): ||M (x_j - m_i)||^2, over-estimated (None: not asked)
    var: Tensor  # (..., H, n): sum_l P_il ||M (x_l - m_i)||^2 = tr(M C_i M^T), over-estimated


def _projectors(lin: AttentionLinearization) -> dict:
    """Row maps ``y -> M_h y`` for M in {V, O = W V, A}, as einsums (float64 ``lin``).

    Each takes ``Y`` of shape (..., n, d) (shared by the heads) or (..., H, n, d) (``per_head``)
    and returns (..., H, n, k).
    """
    V, A, QK = lin.V, lin.A, lin.QK
    W = lin.W[list(lin.analytic_heads)]

    def lhs(per_head: bool) -> str:
        return "...hnd" if per_head else "...nd"

    def proj_V(Y: Tensor, per_head: bool) -> Tensor:
        return torch.einsum(f"{lhs(per_head)},hvd->...hnv", Y, V)

    def proj_O(Y: Tensor, per_head: bool) -> Tensor:
        return torch.einsum("...hnv,hov->...hno", proj_V(Y, per_head), W)

    def proj_A(Y: Tensor, per_head: bool) -> Tensor:
        if QK is None:
            return torch.einsum(f"{lhs(per_head)},hed->...hne", Y, A)
        Q, K = QK
        t = torch.einsum(f"{lhs(per_head)},hkd->...hnk", Y, K)
        return torch.einsum("...hnk,hke->...hne", t, Q)

    return {"V": proj_V, "O": proj_O, "A": proj_A}


def _projected(
    project,
    Xc: Tensor,
    Mc: Tensor,
    P: Tensor,
    M_norm: Tensor | None,
    *,
    dist: bool = True,
    Z: Tensor | None = None,
) -> _Projected:
    """Statistics through a projector of :func:`_projectors`, or the identity when ``None``.

    ``Xc`` (..., n, d) and ``Mc`` (..., H, m, d) are centred float64 keys and means, ``P``
    (..., H, m, n) the rows of the attention matrices of those means (``m`` queries, all ``n``
    keys). ``Z``: the keys already projected (they do not depend on the queries). With
    ``dist=False`` only the variances are formed (no (H, m, n) tensors).
    """
    if Z is None:
        Z = Xc.unsqueeze(-3) if project is None else project(Xc, False)  # (..., 1 or H, n, k)
    Zm = Mc if project is None else project(Mc, True)  # (..., H, n, k)
    k = Z.shape[-1] + Xc.shape[-1]
    slack = 4 * (k + 4) * _U64
    zn2 = Z.square().sum(-1).unsqueeze(-2)  # (..., ., 1, n)
    zmn2 = Zm.square().sum(-1, keepdim=True)  # (..., H, n, 1)
    second = (P @ zn2.mT).squeeze(-1)  # sum_l P_il ||z_l||^2
    var_scale = second + zmn2.squeeze(-1)
    if project is not None:  # absolute rounding of the projections themselves
        xn2 = Xc.square().sum(-1).unsqueeze(-2).unsqueeze(-3)
        mn2 = Mc.square().sum(-1, keepdim=True)
        nM2 = M_norm.reshape(-1, 1, 1).square()
        var_scale = var_scale + nM2.squeeze(-1) * ((P @ xn2.mT) + mn2).squeeze(-1)
    var = (second - zmn2.squeeze(-1)).clamp_min(0) + slack * var_scale
    if not dist:
        return _Projected(dist2=None, var=var)
    scale = zn2 + zmn2
    if project is not None:
        scale = scale + nM2 * (xn2 + mn2)
    if project is None:
        cross = torch.einsum("...hik,...jk->...hij", Zm, Xc)
    else:
        cross = torch.einsum("...hik,...hjk->...hij", Zm, Z)
    dist2 = (zn2 - 2 * cross + zmn2).clamp_min(0) + slack * scale
    return _Projected(dist2=dist2, var=var)


def block_norm_bounds(
    lin: AttentionLinearization,
    *,
    geometry: Geometry = "euclidean",
    self_norms: Tensor | None = None,
) -> Tensor:
    r"""Nonnegative :math:`N_{ij}\ge\|J_{ij}\|_2` from the closed form, in :math:`O(Hn^2d)`.

    docs/theory.md §B5 and docs/certificates.md §5 (*standard*; the analytic block bound is derived). For each head and
    :math:`M\in\{V_h, W_hV_h\}`, with :math:`a_{ij} = x_j - m_i` and
    :math:`b_i = A^\top x_i + c`,

    .. math::
        \|M(I + a_{ij}b_i^\top)\|_2\le\min\big(\|M\|_2\,\sigma_{\max}(I + a_{ij}b_i^\top),\
        \|M\|_2 + \|Ma_{ij}\|\,\|b_i\|\big),

    with :math:`\sigma_{\max}` in closed form (:func:`~meanfield._spectral.rank_one_sigma_max`)
    from :math:`a_{ij}^\top b_i` and :math:`\|a_{ij}\|^2`, all obtained by matrix products.
    The block bound is :math:`\tilde P_{ij}` times that, plus :math:`\delta_{ij}` times a bound
    on :math:`\|S_i\|_2`, where :math:`\tilde P_{ij} = \sqrt{a_i/a_j}P_{ij}` in the Wasserstein
    geometry (:math:`P` otherwise). Heads combine by :func:`_combine_heads` (sum of
    :math:`\|W_hV_hT_h\|` bounds, or root-sum-square of :math:`\|V_hT_h\|` bounds when the heads
    are concatenated, or :math:`\|W^O\|` times that). Then :math:`\|J\|_2\le\|N\|_2`.
    Rounding of the inner products is dominated by explicit slack terms; the caller adds a small
    relative margin for the closed form. The pairs are formed in blocks of 64 queries, so the
    intermediates take :math:`O(H\cdot64\cdot n)` memory besides the :math:`n\times n` result.

    Parameters
    ----------
    lin : AttentionLinearization
    geometry : {"euclidean", "wasserstein"}, default "euclidean"
    self_norms : Tensor, shape (..., n), optional
        Upper bounds on :math:`\|S_i\|_2 = \|\sum_hW_hV_hC^h_iA_h^\top\|_2`. Default:
        :func:`self_norm_trace_bound`.

    Returns
    -------
    Tensor, float64, shape (..., n, n)
    """
    _require_analytic(lin, "block_norm_bounds")
    weighted = _check_geometry(lin, geometry)
    lin = _as_float64(lin)
    norms = weight_norms(lin.params)
    P = lin.P
    Pi = _interaction(lin, weighted)
    Xc = lin.X - lin.x_bar  # (..., n, d)
    Mc = lin.m - lin.x_bar.unsqueeze(-3)  # (..., H, n, d)
    B = lin.B
    d = lin.d
    slack = 4 * (d + 4) * _U64
    xn = Xc.square().sum(-1).sqrt().unsqueeze(-2).unsqueeze(-3)  # (..., 1, 1, n): ||x_j - x_bar||
    proj = _projectors(lin)
    kinds = ("V",) if lin.concat else ("V", "O")
    keys = {k: proj[k](Xc, False) for k in kinds}  # the keys through V_h, W_hV_h: (..., H, n, .)
    M_norms = {"V": norms.V, "O": norms.O}
    rows = []
    # query blocks: every quantity below is per pair (i, j), so blocks of queries keep the
    # (H, block, n) intermediates in cache (the products of docs/certificates.md do the same)
    for sl in iter_chunks(lin.n, _BLOCK_ROWS):
        Mb, Bb = Mc[..., sl, :], B[..., sl, :]
        Pb, Pib = P[..., sl, :], Pi[..., sl, :]
        mn = Mb.square().sum(-1, keepdim=True).sqrt()  # (..., H, b, 1)
        bn = (Bb.square().sum(-1, keepdim=True) * (1 + slack)).sqrt()
        t = torch.einsum("...hid,...jd->...hij", Bb, Xc) - (Bb * Mb).sum(-1, keepdim=True)
        t = t + slack * bn * (xn + mn)  # over-estimate <b_i, x_j - m_i>
        ident = _projected(None, Xc, Mb, Pb, None)
        sig = rank_one_sigma_max_from_stats(t, ident.dist2 * bn.square(), d)
        if d == 1:
            sig = sig + slack * (1 + bn * (xn + mn))
        bounds = {}
        for kind in kinds:
            stats = _projected(proj[kind], Xc, Mb, Pb, M_norms[kind], Z=keys[kind])
            nM = M_norms[kind].reshape(-1, 1, 1)
            bounds[kind] = Pib * torch.minimum(nM * sig, nM + stats.dist2.sqrt() * bn)
        rows.append(_combine_heads(bounds["V"], bounds.get("O"), norms, lin.concat))
    off = rows[0] if len(rows) == 1 else torch.cat(rows, dim=-2)
    if self_norms is None:
        self_norms = self_norm_trace_bound(lin)
    return off + torch.diag_embed(self_norms.to(torch.float64))


def _as_float64(lin: AttentionLinearization) -> AttentionLinearization:
    """The same linearization with its tensors in float64 (no recomputation)."""
    if lin.X.dtype == torch.float64:
        return lin

    def f(t: Tensor | None) -> Tensor | None:
        return None if t is None else t.to(torch.float64)

    return replace(
        lin,
        X=f(lin.X),
        P=f(lin.P),
        P_w=f(lin.P_w),
        _m=f(lin._m),
        _B=f(lin._B),
        x_bar=f(lin.x_bar),
        _A=f(lin._A),
        V=f(lin.V),
        W=f(lin.W),
        QK=None if lin.QK is None else (f(lin.QK[0]), f(lin.QK[1])),
        Qx=f(lin.Qx),
        KXc=f(lin.KXc),
        KMc=f(lin.KMc),
        VXc=f(lin.VXc),
        VMc=f(lin.VMc),
        C=f(lin.C),
        QKV=f(lin.QKV),
    )


def self_norm_trace_bound(lin: AttentionLinearization) -> Tensor:
    r"""Cheap upper bounds on :math:`\|S_i\|_2 = \|\sum_hW_hV_hC^h_iA_h^\top\|_2` (cost O(Hn^2d)).

    Per head and :math:`M\in\{V_h, W_hV_h\}`, writing :math:`C = C^h_i`,

    .. math::
        \|MCA^\top\|_2\le\min\Big(\|M\|\|A\|\operatorname{tr}C,\
        \big(\operatorname{tr}(MCM^\top)\operatorname{tr}(ACA^\top)\big)^{1/2}\Big),

    the second from :math:`MCA^\top = (MC^{1/2})(C^{1/2}A^\top)` and
    :math:`\|\cdot\|_2\le\|\cdot\|_F`; each trace is
    :math:`\sum_lP_{il}\|M(x_l-m_i)\|^2` (centred coordinates, rounding slack added). Heads
    combine as in :func:`block_norm_bounds`. Exact per-atom norms need the explicit blocks
    (:func:`self_jacobian_blocks`).

    Returns
    -------
    Tensor, float64, shape (..., n)
    """
    _require_analytic(lin, "self_norm_trace_bound")
    lin = _as_float64(lin)
    norms = weight_norms(lin.params)
    P = lin.P
    Xc = lin.X - lin.x_bar
    Mc = lin.m - lin.x_bar.unsqueeze(-3)
    proj = _projectors(lin)
    tr_C = _projected(None, Xc, Mc, P, None, dist=False).var  # (..., H, n)
    tr_A = _projected(proj["A"], Xc, Mc, P, norms.A, dist=False).var
    nA = norms.A.reshape(-1, 1)

    def per_head(kind: str, M_norm: Tensor) -> Tensor:
        tr_M = _projected(proj[kind], Xc, Mc, P, M_norm, dist=False).var
        return torch.minimum(M_norm.reshape(-1, 1) * nA * tr_C, (tr_M * tr_A).sqrt())

    bV = per_head("V", norms.V).unsqueeze(-1)
    bO = None if lin.concat else per_head("O", norms.O).unsqueeze(-1)
    return _combine_heads(bV, bO, norms, lin.concat).squeeze(-1)


# ------------------------------------------------------------------ per-head structured bound
def _variance(P: Tensor, F: Tensor) -> Tensor:
    r""":math:`\sum_lP_{il}\|f_l - \bar f_i\|^2` (..., H, n) for rows ``F`` (..., H, n, k).

    ``F`` should be centred; the cancellation of the second-moment form is covered by a slack
    :math:`4(k + n + 4)u` times the moments (float64).
    """
    f2 = F.square().sum(-1)  # (..., H, n)
    second = (P @ f2.unsqueeze(-1)).squeeze(-1)
    mean2 = (P @ F).square().sum(-1)
    slack = 4 * (F.shape[-1] + P.shape[-1] + 4) * _U64
    return (second - mean2).clamp_min(0) + slack * (second + mean2)


def _head_features(lin: AttentionLinearization) -> list[dict]:
    """Per head (all heads, rotary included): P, query rows, centred key rows, value spreads."""
    lin = _as_float64(lin)
    params = lin.params
    heads = params.heads
    X = lin.X
    n = lin.n
    out = []
    allowed = _admissible(lin.masked, n, lin.positions, X.device)
    idx = lin.token_index
    if idx is None:
        idx = torch.arange(n, device=X.device)
    for a, h in enumerate(lin.analytic_heads):
        head = heads[h]
        item = {"h": h, "P": lin.P[..., a, :, :], "q": lin.Qx[..., a, :, :]}
        item["k"] = lin.KXc[..., a, :, :]
        item["v"] = lin.VXc[..., a, :, :]
        item["c"] = None if lin.C is None else lin.C[a]
        item["rho"] = 1.0
        if lin.QK is None:
            item["Q"] = None  # the identity
            item["K"] = lin.A[a]
        else:
            item["Q"], item["K"] = lin.QK[0][a], lin.QK[1][a]
        del head
        out.append(item)
    for h in lin.rope_heads:
        head = heads[h]
        head64 = head if head.dtype == torch.float64 else head.to(dtype=torch.float64)
        logP = _log_attention(head_logits(X, X, head64, lin.log_weights), allowed)
        q = head64.rope.apply(X @ head64.Q.mT, idx)
        k = head64.rope.apply(X @ head64.K.mT, idx)
        k = k - k.mean(-2, keepdim=True)  # a constant shift leaves the spreads unchanged
        Xc = X - lin.x_bar
        out.append(
            {
                "h": h,
                "P": logP.exp(),
                "q": q,
                "k": k,
                "v": Xc @ head64.V.mT,
                "c": head64.c,
                "rho": abs(float(head64.rope.attention_scaling)) * (1 + 64 * _U64),
                "Q": head64.Q,
                "K": head64.K,
            }
        )
    return out


def _norm2_upper(M: Tensor | None) -> Tensor:
    if M is None:
        return torch.ones((), dtype=torch.float64)
    M = M.to(torch.float64)
    return spectral_norm_upper(M, candidate=torch.linalg.matrix_norm(M, ord=2), max_iter=0)


_STACK_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _stacked_norms(params: Params, feats: list[dict]) -> dict[str, Tensor]:
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
        head = params.heads[f["h"]]
        d = head.V.shape[-1]
        Vs.append(head.V.to(f64))
        K = f["K"].to(f64)
        if f["c"] is not None:
            K = torch.cat([K, f["c"].to(f64).reshape(1, -1)], dim=0)
        Ks.append(K)
        Qs.append(torch.eye(d, dtype=f64, device=K.device) if f["Q"] is None else f["Q"].to(f64))
    out = {
        "V": _norm2_upper(torch.cat(Vs)),
        "K": _norm2_upper(torch.cat(Ks)),
        "Q": _norm2_upper(torch.cat(Qs)),
        "W": (
            torch.ones((), dtype=f64)
            if not isinstance(params, MultiHeadParams) or params.W_O is None
            else _norm2_upper(params.W_O)
        ),
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
    from .._spectral import collatz_wielandt_bound

    params = lin.params
    feats = _head_features(lin)
    W, _ = _head_output_matrices(params)
    W = W.to(torch.float64)
    stack = _stacked_norms(params, feats)
    terms = {"1": [], "2": [], "3": []}  # per-head factors without the stacked norms
    full = {"1": [], "2": [], "3": []}  # per-head bounds on ||J^h_t|| (W_h excluded)
    w_norms = []
    rho_max = 1.0
    for f in feats:
        head = params.heads[f["h"]]
        P = f["P"]
        rho = f["rho"]
        rho_k = max(rho, 1.0) if f["c"] is not None else rho
        rho_max = max(rho_max, rho_k, rho)
        nV = _norm2_upper(head.V)
        nQ = _norm2_upper(f["Q"])
        nK = _norm2_upper(f["K"])
        if f["c"] is not None:
            nK = (nK.square() + f["c"].to(torch.float64).square().sum()).sqrt()
        p_norm = collatz_wielandt_bound(P, n_steps=8)
        kap2 = _variance(P, f["v"])  # sum_l P_il ||V (x_l - m_i)||^2
        q = f["q"]
        q2 = q.square().sum(-1)
        if f["c"] is not None:
            q = torch.cat([q, q.new_ones(q.shape[:-1] + (1,))], dim=-1)
            q2 = q2 + 1
        trace_form = (P.mT @ (kap2 * q2).unsqueeze(-1)).squeeze(-1)  # (..., n) over l
        sq = torch.linalg.matrix_norm(q, ord=2) * (1 + 8 * q.shape[-2] * _U64)
        weight_form = (kap2.unsqueeze(-1) * P).amax(-2) * sq.square().unsqueeze(-1)
        lam = torch.minimum(trace_form, weight_form).amax(-1) * (1 + 8 * lin.n * _U64)
        s2 = lam.sqrt()
        s3 = (kap2 * _variance(P, f["k"])).sqrt().amax(-1)
        terms["1"].append(p_norm)
        terms["2"].append(s2)
        terms["3"].append(s3)
        full["1"].append(p_norm * nV)
        full["2"].append(s2 * nK * rho_k)
        full["3"].append(s3 * nQ * rho)
        w_norms.append(_norm2_upper(W[f["h"]]))
    wn = torch.stack(w_norms).to(lin.X.device)
    scale = {"1": stack["V"], "2": stack["K"] * rho_max, "3": stack["Q"] * rho_max}
    total = 0
    per_head_total = 0
    for t in ("1", "2", "3"):
        b = torch.stack(full[t], dim=-1)  # (..., H)
        per_head = (b * wn).sum(-1)
        stacked = stack["W"] * torch.stack(terms[t], dim=-1).amax(-1) * scale[t]
        total = total + torch.minimum(per_head, stacked)
        per_head_total = per_head_total + b
    whole = stack["W"] * per_head_total.square().sum(-1).sqrt()
    return torch.minimum(total, whole) * (1 + 16 * len(feats) * _U64)


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
    params = lin.params
    feats = _head_features(lin)
    W, concat = _head_output_matrices(params)
    W = W.to(torch.float64)
    total = 0
    squares = 0
    for f in feats:
        head = params.heads[f["h"]]
        P, v = f["P"], f["v"]
        vbar = P @ v  # V(m_i - x_bar)
        vn2 = v.square().sum(-1).unsqueeze(-2)  # (..., 1, n)
        vb2 = vbar.square().sum(-1, keepdim=True)  # (..., n, 1)
        slack = 4 * (v.shape[-1] + 4) * _U64
        d2 = (vn2 - 2 * vbar @ v.mT + vb2).clamp_min(0) + slack * (vn2 + vb2)
        qn = f["q"].square().sum(-1).sqrt() * (1 + slack)
        nV = _norm2_upper(head.V)
        nK = _norm2_upper(f["K"]) * f["rho"]
        nQ = _norm2_upper(f["Q"]) * f["rho"]
        bn = qn * nK
        if f["c"] is not None:
            bn = bn + f["c"].to(torch.float64).square().sum().sqrt()
        self_h = (_variance(P, v) * _variance(P, f["k"])).sqrt() * nQ
        N_h = P * (nV + d2.sqrt() * bn.unsqueeze(-1)) + torch.diag_embed(self_h)
        total = total + _norm2_upper(W[f["h"]]) * N_h
        squares = squares + N_h.square()
    stacked = squares.sqrt()
    if concat:
        out = stacked
    else:
        out = torch.minimum(total, _norm2_upper(params.W_O) * stacked)
    return out * (1 + 16 * len(feats) * _U64)
