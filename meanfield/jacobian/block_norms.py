r"""Certified upper bounds on the Jacobian's operator norm from its block structure.

:func:`weight_norms` (certified float64 norms of the weights), :func:`block_norm_bounds` and
:func:`self_norm_trace_bound`: deterministic certificates for heads without rotary embedding that
never form the Jacobian. They work on head-space rows with certified error radii
(:mod:`~meanfield.jacobian.head_rows`); the bounds for any heads, rotary ones included, are in
:mod:`~meanfield.jacobian.structured_bounds`.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch import Tensor

from .._spectral import U64, gamma_k, rank_one_sigma_max_from_stats
from .._typing import Params
from .._typing import ProductGeometry as Geometry
from ..params import MultiHeadParams
from .head_rows import (
    OUT_INFL,
    RowFamilies,
    Rows,
    b_norms,
    float64_rows,
    norm2_upper,
    pair_dist,
    rebalanced,
    row_families,
    subnormal_floor,
)
from .linearization import AttentionLinearization, head_output_matrices
from .products import check_geometry, interaction, key_blocks, require_analytic


# ------------------------------------------------------------------------ block-norm bounds
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


_NORM_CACHE: weakref.WeakKeyDictionary[Params, WeightNorms] = weakref.WeakKeyDictionary()


def weight_norms(params: Params) -> WeightNorms:
    """Certified norms of the weight matrices of the analytic heads (cached per ``params``).

    Each is an SVD value certified by the Cholesky test of
    :func:`meanfield._spectral.certify_upper` (:func:`~meanfield._spectral.spectral_norm_upper`).
    """
    cached = _NORM_CACHE.get(params)
    if cached is not None:
        return cached
    heads = params.heads
    for head in heads:
        if getattr(head, "variants", ()):
            raise ValueError(f"the block certificate does not model {', '.join(head.variants)} yet")
    analytic = [h for h, head in enumerate(heads) if getattr(head, "rope", None) is None]
    W, _ = head_output_matrices(params)
    if analytic:
        A = torch.stack([heads[h].A for h in analytic]).to(torch.float64)
        V = torch.stack([heads[h].V for h in analytic]).to(torch.float64)
        O = W[analytic].to(torch.float64) @ V
        nA, nV, nO = norm2_upper(A), norm2_upper(V), norm2_upper(O)
    else:
        nA = nV = nO = torch.zeros(0, dtype=torch.float64, device=heads[0].device)
    W_O = params.W_O if isinstance(params, MultiHeadParams) else None  # None: concatenated heads
    out = WeightNorms(A=nA, V=nV, O=nO, W_O=None if W_O is None else norm2_upper(W_O))
    _NORM_CACHE[params] = out
    return out


def _combine_heads(bV: Tensor, bO: Tensor | None, norms: WeightNorms, concat: bool) -> Tensor:
    r"""Bound :math:`\|\sum_hW_hV_hT_h\|` from per-head bounds (head axis -3).

    ``bV`` bounds :math:`\|V_hT_h\|` and ``bO`` bounds :math:`\|W_hV_hT_h\|`. Concatenated heads
    stack vertically: :math:`(\sum_hb_{V,h}^2)^{1/2}`. With :math:`W^O`:
    :math:`\min\big(\sum_hb_{O,h},\ \|W^O\|(\sum_hb_{V,h}^2)^{1/2}\big)`.
    """
    # squares below 2**-1074 underflow: the term inside the root covers their loss
    stacked = bV.square().sum(-3).add_(bV.shape[-3] * 2.0**-1072).sqrt_()
    if concat:
        return stacked
    if bO is None or norms.W_O is None:
        raise ValueError("heads combined through W^O need the bounds bO and the norm of W^O")
    return torch.minimum(bO.sum(-3), norms.W_O * stacked)


def _ambient_default(lin: AttentionLinearization) -> bool:
    """Whether the terms that need inner products in R^d are worth their cost: d <= 2 d_v."""
    return lin.d <= 2 * lin.V.shape[-2]


def _rank_one_sigma(
    lin: AttentionLinearization,
    fam: Rows,
    bnorms: tuple[Tensor, Tensor, Tensor],
    sl: slice,
    kend: int,
) -> Tensor:
    r"""Upper bounds on :math:`\sigma_{\max}(I + a_{ij}b_i^\top)` (exact :math:`a, b`).

    From over-estimates of :math:`\|a_{ij}\|\|b_i\|` and of :math:`t = a_{ij}^\top b_i`.

    :math:`|\hat t - t|\le\|\hat b_i\|\big(\gamma_{d+1}(\|\hat x_j\| + \|\hat m_i\|) +
    \epsilon_j + \epsilon_{m,i}\big) + \|\hat b_i - b_i\|\,\|a_{ij}\|` (centred rows).
    """
    bn, B_norm, err = (t[..., sl].unsqueeze(-1) for t in bnorms)
    Bb = lin.B[..., sl, :]
    dist = pair_dist(fam, sl, kend)
    t = Bb @ fam.z[..., :kend, :].mT - (Bb * fam.zm[..., sl, :]).sum(-1, keepdim=True)
    xn = fam.zn2[..., :kend].sqrt().unsqueeze(-2)
    mn = fam.zmn2[..., sl].sqrt().unsqueeze(-1)
    gd = gamma_k(lin.d + 2)
    t_err = B_norm * (gd * (xn + mn) + fam.eps[..., :kend].unsqueeze(-2))
    t_err = (t_err + B_norm * fam.eps_m[..., sl].unsqueeze(-1) + err * dist) * (1 + 8 * U64)
    if lin.d == 1:
        return ((1 + t).abs() + t_err) * (1 + 4 * U64)
    return rank_one_sigma_max_from_stats(t + t_err, (dist * bn).square(), lin.d) * (1 + 8 * U64)


def block_norm_bounds(
    lin: AttentionLinearization,
    *,
    geometry: Geometry = "euclidean",
    self_norms: Tensor | None = None,
    ambient: bool | None = None,
) -> Tensor:
    r"""Nonnegative :math:`N_{ij}\ge\|J_{ij}\|_2` from the closed form, in :math:`O(Hn^2k)`.

    docs/theory.md §B5 and docs/certificates.md §5.1 (*standard*; the analytic block bound and
    its rounding analysis are derived there). For each head and :math:`M\in\{V_h, W_hV_h\}`,
    with :math:`a_{ij} = x_j - m_i` and :math:`b_i = A_h^\top x_i + c_h`,

    .. math::
        \|M(I + a_{ij}b_i^\top)\|_2\le\|M\|_2 + \|Ma_{ij}\|\,\|b_i\|,

    where :math:`\|V_ha_{ij}\|` is a distance between head-space rows and
    :math:`\|W_hV_ha_{ij}\|` one through the small triangular factor of
    :math:`W_h^\top W_h`, so no product runs in :math:`\mathbb R^d`. With ``ambient``, the
    rank-one closed form :math:`\|M\|_2\,\sigma_{\max}(I + a_{ij}b_i^\top)`
    (:func:`~meanfield._spectral.rank_one_sigma_max_from_stats`, from
    :math:`a_{ij}^\top b_i` and :math:`\|a_{ij}\|`, :math:`O(Hn^2d)`) is also formed and the
    smaller kept. The block bound is :math:`\tilde P_{ij}` times that, plus :math:`\delta_{ij}`
    times a bound on :math:`\|S_i\|_2`, where :math:`\tilde P_{ij} = \sqrt{a_i/a_j}P_{ij}` in
    the Wasserstein geometry (:math:`P` otherwise). Heads combine by :func:`_combine_heads` (sum
    of :math:`\|W_hV_hT_h\|` bounds, or root-sum-square of :math:`\|V_hT_h\|` bounds when the
    heads are concatenated, or :math:`\|W^O\|` times that). Then :math:`\|J\|_2\le\|N\|_2`.

    The bound holds for the Jacobian formula evaluated on the stored attention matrix ``P`` in
    exact arithmetic: every rounding of the head-space rows, of the means and of the bound's own
    arithmetic is covered (docs/certificates.md §5.1); the distance of that operator to the
    exact Jacobian is the caller's (docs/rounding.md §4.2). Pairs are formed in blocks of 64
    queries (``chunk_size``), and a causal layer skips the keys after each block.

    Parameters
    ----------
    lin : AttentionLinearization
    geometry : {"euclidean", "wasserstein"}, default "euclidean"
    self_norms : Tensor, shape (..., n), optional
        Upper bounds on :math:`\|S_i\|_2 = \|\sum_hW_hV_hC^h_iA_h^\top\|_2`. Default:
        :func:`self_norm_trace_bound`.
    ambient : bool, optional
        Also form the terms that need inner products in :math:`\mathbb R^d` (the rank-one
        closed form here, the trace of :math:`C_i` in :func:`self_norm_trace_bound`). Default:
        when :math:`d\le2d_v`; on layers with :math:`d\gg d_v` they cost several times the
        rest and tightened no bound we measured (docs/certificates.md §5.1).

    Returns
    -------
    Tensor, float64, shape (..., n, n)
    """
    require_analytic(lin, "block_norm_bounds")
    weighted = check_geometry(lin, geometry)
    lin = rebalanced(float64_rows(lin))  # V_h, W_h of extreme but balanced product: §5
    norms = weight_norms(lin.params)
    use_ambient = _ambient_default(lin) if ambient is None else bool(ambient)
    fams = row_families(lin, ambient=use_ambient, self_terms=self_norms is None)
    fac = fams.factors
    Pi = interaction(lin, weighted)
    n = lin.n
    bnorms = b_norms(lin, fac)
    bn = bnorms[0]
    nV, nO = norms.V.reshape(-1, 1, 1), norms.O.reshape(-1, 1, 1)
    rows = []
    for sl, keys in key_blocks(lin):  # the query blocks of the products, and the keys they see
        kend = keys.stop
        Pib = Pi[..., sl, :kend]
        bnb = bn[..., sl].unsqueeze(-1)
        dV = pair_dist(fams.V, sl, kend)
        bO = None
        if fac.W is not None and fams.WV is not None:  # both or neither (concatenated heads)
            dO = pair_dist(fams.WV, sl, kend).square_()
            dO.addcmul_(dV.square(), fac.W.e.reshape(-1, 1, 1)).sqrt_()
            bO = dO.mul_(bnb).add_(nO).mul_(Pib)
        bV = dV.mul_(bnb).add_(nV).mul_(Pib)
        if fams.I is not None:  # formed when use_ambient
            sig = _rank_one_sigma(lin, fams.I, bnorms, sl, kend).mul_(Pib)
            bV = torch.minimum(bV, nV * sig)
            bO = None if bO is None else torch.minimum(bO, nO * sig)
        block = _combine_heads(bV, bO, norms, lin.concat).add_(subnormal_floor(bV.shape[-3]))
        rows.append(torch.nn.functional.pad(block, (0, n - kend)))
    off = (rows[0] if len(rows) == 1 else torch.cat(rows, dim=-2)) * OUT_INFL
    if self_norms is None:
        self_norms = _self_norms(lin, fams, norms)
    return off + torch.diag_embed(self_norms.to(torch.float64))


def _self_norms(lin: AttentionLinearization, fams: RowFamilies, norms: WeightNorms) -> Tensor:
    r"""Bounds on :math:`\|S_i\|_2` from the self-term families (and the ambient ones if formed)."""
    fac = fams.factors
    if fams.K is None:
        raise ValueError("the self-term bound needs the row family K (self_terms=True)")
    T_V = fams.V.spread
    T_A = fams.K.spread
    if fac.Q is not None and fams.QK is not None:  # both or neither (heads without factors)
        T_A = (fams.QK.spread.square() + fac.Q.e.unsqueeze(-1) * T_A.square()).sqrt()
    bV = T_V * T_A
    bO = None
    if fac.W is not None and fams.WV is not None:  # both or neither (concatenated heads)
        T_O = (fams.WV.spread.square() + fac.W.e.unsqueeze(-1) * T_V.square()).sqrt()
        bO = T_O * T_A
    if fams.I is not None:  # the ambient terms
        tr_C = fams.I.spread.square()
        nA = norms.A.reshape(-1, 1)
        bV = torch.minimum(bV, norms.V.reshape(-1, 1) * nA * tr_C)
        if bO is not None:
            bO = torch.minimum(bO, norms.O.reshape(-1, 1) * nA * tr_C)
    bO = None if bO is None else bO.unsqueeze(-1)
    out = _combine_heads(bV.unsqueeze(-1), bO, norms, lin.concat).squeeze(-1)
    return out * OUT_INFL + subnormal_floor(bV.shape[-2])


def self_norm_trace_bound(lin: AttentionLinearization, *, ambient: bool | None = None) -> Tensor:
    r"""Upper bounds on :math:`\|S_i\|_2 = \|\sum_hW_hV_hC^h_iA_h^\top\|_2`, in :math:`O(Hn^2k)`.

    Per head and :math:`M\in\{V_h, W_hV_h\}`, writing :math:`C = C^h_i`, from
    :math:`MCA^\top = (MC^{1/2})(C^{1/2}A^\top)` and :math:`\|\cdot\|_2\le\|\cdot\|_F`,

    .. math::
        \|MCA^\top\|_2\le\big(\operatorname{tr}(MCM^\top)\operatorname{tr}(ACA^\top)\big)^{1/2},

    each trace :math:`\sum_lP_{il}\|M(x_l-m_i)\|^2` a weighted spread of head-space rows (for
    :math:`A_h = Q_h^\top K_h`, rows :math:`K_hx_l` through the factor of :math:`Q_hQ_h^\top`),
    with every rounding covered (docs/certificates.md §5.1). With ``ambient`` (default
    :math:`d\le2d_v`), also :math:`\|M\|\|A\|\operatorname{tr}C`, and the smaller is kept.
    Heads combine as in :func:`block_norm_bounds`. Exact per-atom norms need the explicit
    blocks (:func:`self_jacobian_blocks`).

    Returns
    -------
    Tensor, float64, shape (..., n)
    """
    require_analytic(lin, "self_norm_trace_bound")
    lin = rebalanced(float64_rows(lin))
    use_ambient = _ambient_default(lin) if ambient is None else bool(ambient)
    fams = row_families(lin, ambient=use_ambient, self_terms=True)
    return _self_norms(lin, fams, weight_norms(lin.params))
