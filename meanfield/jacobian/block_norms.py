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
from .._spectral import _gamma, rank_one_sigma_max_from_stats, spectral_norm_upper
from ..attention import head_logits
from ..params import AttentionParams, MultiHeadParams
from .linearization import (
    AttentionLinearization,
    _admissible,
    _attend,
    _head_output_matrices,
    _head_rows,
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
    # squares below 2**-1074 underflow: the term inside the root covers their loss
    stacked = bV.square().sum(-3).add_(bV.shape[-3] * 2.0**-1072).sqrt_()
    if concat:
        return stacked
    return torch.minimum(bO.sum(-3), norms.W_O * stacked)


#: Query-block size of :func:`block_norm_bounds` (its (H, block, n) intermediates stay in cache).
_BLOCK_ROWS = 64
#: Relative inflation of the head-space bounds for the rounding of their own elementwise
#: arithmetic (a few dozen operations on nonnegative numbers; docs/certificates.md §5.1).
_OUT_INFL = 1 + 64 * _U64


def _subnormal_floor(H: int) -> float:
    """Absolute term covering results in the subnormal range (docs/certificates.md §5.1).

    There rounding is absolute, at most ``2**-1075`` per operation: a few operations per head.
    """
    return 2.0**-1074 * 16 * (H + 1)


def _fro_upper(M: Tensor) -> Tensor:
    r"""Upper bounds on :math:`\|M\|_F` over the last two axes.

    They bound :math:`\|M\|_2` and :math:`\||M|\|_2` (the norm of the entrywise absolute value),
    which the rounding terms need.
    """
    M = M.to(torch.float64)
    return M.square().sum((-2, -1)).sqrt() * (1 + _gamma(M.shape[-1] * M.shape[-2] + 2))


@dataclass(frozen=True, eq=False)
class _GramFactor:
    r"""Square-root factor of a Gram matrix with a certified defect (per head).

    For every ``y``: :math:`\|F_hy\|^2\le\|R_hy\|^2 + e_h\|y\|^2`, so norms through the
    tall ``F_h`` (``p`` rows) are computed through the small ``R_h`` (at most ``k`` rows).
    """

    R: Tensor  # (H, r, k)
    nu: Tensor  # (H,) upper bounds on ||R_h||_F
    e: Tensor  # (H,) upper bounds on ||F_h^T F_h - R_h^T R_h||_2


def _gram_factor(F: Tensor) -> _GramFactor:
    r""":math:`R_h` from the QR factorisation of ``F`` (H, p, k) and a certified :math:`e_h`.

    The computed :math:`\hat E = \mathrm{fl}(F^\top F) - \mathrm{fl}(R^\top R)` differs from the
    exact defect by at most :math:`\gamma_p|F|^\top|F| + \gamma_r|R|^\top|R| + u|\hat E|`
    entrywise, and :math:`\||F|^\top|F|\|_F\le\|F\|_F^2`; the spectral norm is bounded by the
    Frobenius norm.
    """
    F = F.to(torch.float64)
    R = torch.linalg.qr(F, mode="r").R
    E = F.mT @ F - R.mT @ R
    nF, nR = _fro_upper(F), _fro_upper(R)
    e = (
        _fro_upper(E) * (1 + _U64)
        + _gamma(F.shape[-2] + 1) * nF.square()
        + _gamma(R.shape[-2] + 1) * nR.square()
    ) * (1 + 4 * _U64)
    return _GramFactor(R=R, nu=nR, e=e)


@dataclass(frozen=True, eq=False)
class _HeadFactors:
    """Weight-side quantities of the head-space block bound (analytic heads, cached per params)."""

    nu_V: Tensor  # (H,) ||V_h||_F
    nu_K: Tensor  # (H,) ||K_h||_F (||A_h||_F without factors)
    nu_Q: Tensor | None  # (H,) ||Q_h||_F (None: no factors, the identity stands for Q_h)
    c_norm: Tensor  # (H,) ||c_h|| (zero without key-logit terms)
    W: _GramFactor | None  # factors of W_h (None: concatenated heads, no W^O)
    Q: _GramFactor | None  # factors of Q_h^T (None: no factors)


_FACTOR_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _head_factors(lin: AttentionLinearization) -> _HeadFactors:
    cached = _FACTOR_CACHE.get(lin.params)
    if cached is not None:
        return cached
    heads = [lin.params.heads[h] for h in lin.analytic_heads]
    f64 = torch.float64
    V = torch.stack([h.V for h in heads]).to(f64)
    if lin.QK is not None:
        Q, K = (t.to(f64) for t in lin.QK)
        nu_Q, Qf = _fro_upper(Q), _gram_factor(Q.mT)
    else:
        K = torch.stack([h.A for h in heads]).to(f64)
        nu_Q = Qf = None
    c_norm = (
        torch.zeros(len(heads), dtype=f64, device=V.device)
        if lin.C is None
        else lin.C.to(f64).square().sum(-1).sqrt() * (1 + _gamma(lin.d + 2))
    )
    Wf = None if lin.concat else _gram_factor(lin.W[list(lin.analytic_heads)])
    out = _HeadFactors(nu_V=_fro_upper(V), nu_K=_fro_upper(K), nu_Q=nu_Q, c_norm=c_norm, W=Wf, Q=Qf)
    _FACTOR_CACHE[lin.params] = out
    return out


@dataclass(frozen=True, eq=False)
class _Rows:
    r"""One family of rows :math:`z_l = M(x_l-\bar x)` and means, as stored, with error radii.

    The reference operator of docs/certificates.md §5.1 uses the exact rows :math:`z_l` and the
    exact means :math:`\bar z_i = \sum_lP_{il}z_l` of the stored attention matrix ``P``.
    """

    z: Tensor  # (..., H or 1, n, k) stored rows
    zm: Tensor  # (..., H, n, k) stored means
    zn2: Tensor  # (..., H or 1, n) ||z_l||^2 as computed
    zmn2: Tensor  # (..., H, n)
    eps: Tensor  # (..., H or 1, n): ||z_l - exact row|| <= eps_l
    eps_m: Tensor  # (..., H, n): ||zm_i - exact mean|| <= eps_m_i
    g: Tensor  # (..., H, n): ||zm_i - sum_l P_il (stored z_l)|| <= g_i
    p_norm: Tensor  # (..., H, n): sum_l P_il ||stored z_l||, over-estimated
    spread: Tensor  # (..., H, n): (sum_l P_il ||exact z_l - exact mean_i||^2)^(1/2) <= spread_i


@dataclass(frozen=True)
class _RowSums:
    """Sums of each row of ``P`` (exact sum within ``sigma`` of 1)."""

    s: Tensor  # (..., H, n) computed row sums
    sigma: Tensor  # (..., H, n) >= |1 - exact row sum|


def _row_sums(P: Tensor) -> _RowSums:
    s = P.sum(-1)
    n = P.shape[-1]
    return _RowSums(s=s, sigma=(s - 1).abs() + _gamma(n + 1) * s)


def _rows(
    P: Tensor, sums: _RowSums, z: Tensor, zm: Tensor, eps: Tensor, g: Tensor | None = None
) -> _Rows:
    r"""Error radii and spread of stored rows ``z`` and means ``zm``.

    ``eps`` bounds the distance of each stored row to its exact value and ``g`` that of each
    stored mean to :math:`\sum_lP_{il}\hat z_l` over the *stored* rows (default: the means
    were computed as ``P @ z``, so :math:`g_i = \gamma_{n}\sum_lP_{il}\|\hat z_l\|`). The
    spread is bounded through the seminorm
    :math:`T(w) = (\sum_lP_{il}\|w_l - \sum_{l'}P_{il'}w_{l'}\|^2)^{1/2}`:
    :math:`T(z)\le T(\hat z) + T(\hat z - z)`, with
    :math:`T(\hat z)^2 = \sum_lP_{il}\|\hat z_l\|^2 - (2-s_i)\|\bar{\hat z}_i\|^2` and
    :math:`T(\delta)\le(1+s_i)(\sum_lP_{il}\|\delta_l\|^2)^{1/2}` (docs/certificates.md §5.1).
    """
    n, k = P.shape[-1], z.shape[-1]
    infl = 1 + _gamma(n + 4)
    zn2, zmn2 = z.square().sum(-1), zm.square().sum(-1)
    cols = (zn2, eps, eps.square(), zn2.sqrt())
    sums_P = P @ torch.stack([t.expand(P.shape[:-1]) for t in cols], dim=-1)
    second, P_eps, P_eps2, p_norm = sums_P.unbind(-1)
    if g is None:
        g = _gamma(n + 2) * p_norm
    eps_m = (g + P_eps) * infl
    zmn = zmn2.sqrt()
    c = 4 * (n + k + 4) * _U64
    core = (
        (second - zmn2).clamp_min(0)
        + c * (second + zmn2) * (1 + sums.s)
        + g * (2 * zmn + g)
        + sums.sigma * (zmn + g).square()
    )
    spread = (core.sqrt() + (1 + sums.s + sums.sigma) * P_eps2.sqrt()) * infl
    return _Rows(
        z=z, zm=zm, zn2=zn2, zmn2=zmn2, eps=eps, eps_m=eps_m, g=g, p_norm=p_norm * infl,
        spread=spread,
    )  # fmt: skip


def _through(fam: _Rows, f: _GramFactor, P: Tensor, sums: _RowSums) -> _Rows:
    r"""The family seen through :math:`R_h` (:class:`_GramFactor`): rows :math:`\mathrm{fl}(Rz)`.

    The new rows are within :math:`\gamma_k\nu\|\hat z_l\| + \nu\epsilon_l` of
    :math:`Rz_l`, and the new stored means :math:`\mathrm{fl}(R\hat z_{m,i})` within
    :math:`\gamma_k\nu(\|\hat z_{m,i}\| + \sum_lP_{il}\|\hat z_l\|) + \nu g_i` of the mean
    of the new stored rows (:math:`\nu\ge\|R\|_F\ge\||R|\|_2`).
    """
    R = f.R  # (H, r, k)
    nu = f.nu.unsqueeze(-1)
    gk = _gamma(fam.z.shape[-1] + 2)
    eps = gk * nu * fam.zn2.sqrt() + nu * fam.eps
    g = (gk * nu * (fam.zmn2.sqrt() + fam.p_norm) + nu * fam.g) * (1 + 4 * _U64)
    return _rows(P, sums, fam.z @ R.mT, fam.zm @ R.mT, eps, g)


def _float64_rows(lin: AttentionLinearization) -> AttentionLinearization:
    """A float64 linearisation whose head rows were computed in float64.

    A float32 linearisation converted by :func:`_as_float64` keeps rows rounded in float32, which
    the float64 error radii of :func:`_rows` would not cover; they are recomputed from the
    (exact) float64 values of ``X`` and the weights, and the attention matrix is kept as stored.
    """
    if lin.X.dtype == torch.float64:
        return lin
    lin = _as_float64(lin)
    Xc = lin.X - lin.x_bar
    A = lin.A if lin.QK is None else None
    _, KXc, VXc = _head_rows(lin.QK, A, lin.V, lin.QKV, Xc)
    KVMc = _attend(lin.P, torch.cat([KXc, VXc], dim=-1), lin._causal_block())
    k = KXc.shape[-1]
    return replace(
        lin, KXc=KXc, VXc=VXc, KMc=KVMc[..., :k], VMc=KVMc[..., k:], Qx=None, _m=None, _B=None
    )


def _ambient_default(lin: AttentionLinearization) -> bool:
    """Whether the terms that need inner products in R^d are worth their cost: d <= 2 d_v."""
    return lin.d <= 2 * lin.V.shape[-2]


def _families(lin: AttentionLinearization, *, ambient: bool, self_terms: bool) -> dict:
    r"""The row families of docs/certificates.md §5.1 for a float64 ``lin`` (see :func:`_rows`).

    ``"V"``: :math:`V_h(x_l-\bar x)`; ``"WV"``: the same through the factor of :math:`W_h`;
    ``"K"``, ``"QK"``: :math:`K_h(x_l-\bar x)` and through the factor of :math:`Q_h^\top` (self
    terms); ``"I"``: :math:`x_l-\bar x` itself (ambient terms).
    """
    P = lin.P
    d = lin.d
    fac = _head_factors(lin)
    sums = _row_sums(P)
    Xc = lin.X - lin.x_bar
    # ||x_l - x_bar|| <= rho_l: the stored centred rows are within 2u of the exact ones
    rho = (Xc.square().sum(-1).sqrt() * (1 + _gamma(d + 4))).unsqueeze(-2)  # (..., 1, n)
    gd = _gamma(d + 2)
    out = {"sums": sums, "factors": fac, "rho": rho}
    out["V"] = _rows(P, sums, lin.VXc, lin.VMc, gd * fac.nu_V.unsqueeze(-1) * rho)
    if fac.W is not None:
        out["WV"] = _through(out["V"], fac.W, P, sums)
    if self_terms:
        out["K"] = _rows(P, sums, lin.KXc, lin.KMc, gd * fac.nu_K.unsqueeze(-1) * rho)
        if fac.Q is not None:
            out["QK"] = _through(out["K"], fac.Q, P, sums)
    if ambient:
        Mc = _attend(P, Xc.unsqueeze(-3), lin._causal_block())  # (..., H, n, d)
        out["I"] = _rows(P, sums, Xc.unsqueeze(-3), Mc, 2 * _U64 * rho)
    return out


def _b_norms(lin: AttentionLinearization, fac: _HeadFactors) -> tuple[Tensor, Tensor, Tensor]:
    r"""Upper bounds on :math:`\|b_i\|` for the exact :math:`b_i = A_h^\top x_i + c_h`.

    Returns ``(bn, B_norm, err)`` (..., H, n): the bound, the norm of the stored rows
    :math:`\hat b_i` and the bound on :math:`\|\hat b_i - b_i\|`, which is
    :math:`\gamma_{d+k+2}(2\nu_K\nu_Q\|x_i\| + \|c\|)` with factors
    (:math:`\hat b_i = \mathrm{fl}(K^\top\mathrm{fl}(Qx_i)) + c`) and
    :math:`\gamma_{d+2}(\nu_A\|x_i\| + \|c\|)` without.
    """
    d = lin.d
    B_norm = lin.B.square().sum(-1).sqrt() * (1 + _gamma(d + 2))
    x_norm = (lin.X.square().sum(-1).sqrt() * (1 + _gamma(d + 2))).unsqueeze(-2)
    nu_K, c = fac.nu_K.unsqueeze(-1), fac.c_norm.unsqueeze(-1)
    if fac.nu_Q is None:
        err = _gamma(d + 3) * (nu_K * x_norm + c)
    else:
        k = lin.QK[0].shape[-2]
        err = _gamma(d + k + 3) * (2 * nu_K * fac.nu_Q.unsqueeze(-1) * x_norm + c)
    return (B_norm + err) * (1 + 4 * _U64), B_norm, err


def _pair_dist(fam: _Rows, sl: slice, kend: int) -> Tensor:
    r"""Upper bounds on :math:`\|z_j - \bar z_i\|` (exact rows and means), (..., H, b, kend).

    For the queries ``sl`` and the keys ``:kend``.

    :math:`\|\hat z_j\|^2 - 2\hat z_j^\top\hat z_{m,i} + \|\hat z_{m,i}\|^2` is computed
    within :math:`2\gamma_{k+2}(\|\hat z_j\|^2 + \|\hat z_{m,i}\|^2)` of the exact squared
    distance of the stored vectors; :math:`4(k+4)u` times the same is added before the root, and
    the radii of the rows and the mean after it.
    """
    c = 1 + 4 * (fam.z.shape[-1] + 4) * _U64
    D = fam.zm[..., sl, :] @ fam.z[..., :kend, :].mT
    D.mul_(-2).add_((fam.zmn2[..., sl] * c).unsqueeze(-1))
    D.add_((fam.zn2[..., :kend] * c).unsqueeze(-2))
    D.clamp_min_(0).sqrt_()
    D.add_(fam.eps_m[..., sl].unsqueeze(-1))
    return D.add_(fam.eps[..., :kend].unsqueeze(-2))


def _rank_one_sigma(
    lin: AttentionLinearization, fam: _Rows, bnorms: tuple, sl: slice, kend: int
) -> Tensor:
    r"""Upper bounds on :math:`\sigma_{\max}(I + a_{ij}b_i^\top)` (exact :math:`a, b`).

    From over-estimates of :math:`\|a_{ij}\|\|b_i\|` and of :math:`t = a_{ij}^\top b_i`.

    :math:`|\hat t - t|\le\|\hat b_i\|\big(\gamma_{d+1}(\|\hat x_j\| + \|\hat m_i\|) +
    \epsilon_j + \epsilon_{m,i}\big) + \|\hat b_i - b_i\|\,\|a_{ij}\|` (centred rows).
    """
    bn, B_norm, err = (t[..., sl].unsqueeze(-1) for t in bnorms)
    Bb = lin.B[..., sl, :]
    Xc = fam.z[..., :kend, :]
    Mb = fam.zm[..., sl, :]
    dist = _pair_dist(fam, sl, kend)
    t = Bb @ Xc.mT - (Bb * Mb).sum(-1, keepdim=True)
    xn = fam.zn2[..., :kend].sqrt().unsqueeze(-2)
    mn = fam.zmn2[..., sl].sqrt().unsqueeze(-1)
    gd = _gamma(lin.d + 2)
    t_err = B_norm * (gd * (xn + mn) + fam.eps[..., :kend].unsqueeze(-2))
    t_err = (t_err + B_norm * fam.eps_m[..., sl].unsqueeze(-1) + err * dist) * (1 + 8 * _U64)
    if lin.d == 1:
        return ((1 + t).abs() + t_err) * (1 + 4 * _U64)
    return rank_one_sigma_max_from_stats(t + t_err, (dist * bn).square(), lin.d) * (1 + 8 * _U64)


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
    queries, and a causal layer skips the keys after each block.

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
    _require_analytic(lin, "block_norm_bounds")
    weighted = _check_geometry(lin, geometry)
    lin = _float64_rows(lin)
    norms = weight_norms(lin.params)
    use_ambient = _ambient_default(lin) if ambient is None else bool(ambient)
    fams = _families(lin, ambient=use_ambient, self_terms=self_norms is None)
    fac = fams["factors"]
    Pi = _interaction(lin, weighted)
    n = lin.n
    bnorms = _b_norms(lin, fac)
    bn = bnorms[0]
    causal = lin.masked and lin.positions is None
    nV, nO = norms.V.reshape(-1, 1, 1), norms.O.reshape(-1, 1, 1)
    rows = []
    for sl in iter_chunks(n, _BLOCK_ROWS):
        kend = sl.stop if causal else n
        Pib = Pi[..., sl, :kend]
        bnb = bn[..., sl].unsqueeze(-1)
        dV = _pair_dist(fams["V"], sl, kend)
        bO = None
        if fac.W is not None:
            dO = _pair_dist(fams["WV"], sl, kend).square_()
            dO.addcmul_(dV.square(), fac.W.e.reshape(-1, 1, 1)).sqrt_()
            bO = dO.mul_(bnb).add_(nO).mul_(Pib)
        bV = dV.mul_(bnb).add_(nV).mul_(Pib)
        if use_ambient:
            sig = _rank_one_sigma(lin, fams["I"], bnorms, sl, kend).mul_(Pib)
            bV = torch.minimum(bV, nV * sig)
            bO = None if bO is None else torch.minimum(bO, nO * sig)
        block = _combine_heads(bV, bO, norms, lin.concat).add_(_subnormal_floor(bV.shape[-3]))
        rows.append(torch.nn.functional.pad(block, (0, n - kend)))
    off = (rows[0] if len(rows) == 1 else torch.cat(rows, dim=-2)) * _OUT_INFL
    if self_norms is None:
        self_norms = _self_norms(lin, fams, norms, use_ambient)
    return off + torch.diag_embed(self_norms.to(torch.float64))


def _self_norms(lin: AttentionLinearization, fams: dict, norms: WeightNorms, ambient: bool):
    fac = fams["factors"]
    T_V = fams["V"].spread
    T_A = fams["K"].spread
    if fac.Q is not None:
        T_A = (fams["QK"].spread.square() + fac.Q.e.unsqueeze(-1) * T_A.square()).sqrt()
    bV = T_V * T_A
    bO = None
    if fac.W is not None:
        T_O = (fams["WV"].spread.square() + fac.W.e.unsqueeze(-1) * T_V.square()).sqrt()
        bO = T_O * T_A
    if ambient:
        tr_C = fams["I"].spread.square()
        nA = norms.A.reshape(-1, 1)
        bV = torch.minimum(bV, norms.V.reshape(-1, 1) * nA * tr_C)
        if bO is not None:
            bO = torch.minimum(bO, norms.O.reshape(-1, 1) * nA * tr_C)
    bO = None if bO is None else bO.unsqueeze(-1)
    out = _combine_heads(bV.unsqueeze(-1), bO, norms, lin.concat).squeeze(-1)
    return out * _OUT_INFL + _subnormal_floor(bV.shape[-2])


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
    _require_analytic(lin, "self_norm_trace_bound")
    lin = _float64_rows(lin)
    use_ambient = _ambient_default(lin) if ambient is None else bool(ambient)
    fams = _families(lin, ambient=use_ambient, self_terms=True)
    return _self_norms(lin, fams, weight_norms(lin.params), use_ambient)


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


_HEAD_NORM_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _per_head_norms(params: Params, feats: list[dict]) -> dict[int, dict[str, Tensor]]:
    """Certified norms of each head's ``V``, ``Q``, ``K`` and ``W_h`` (cached per ``params``).

    The structured bounds need them on every call; one SVD each, computed once per layer.
    """
    cached = _HEAD_NORM_CACHE.get(params)
    if cached is not None and all(f["h"] in cached for f in feats):
        return cached
    W, _ = _head_output_matrices(params)
    out = {
        f["h"]: {
            "V": _norm2_upper(params.heads[f["h"]].V),
            "Q": _norm2_upper(f["Q"]),
            "K": _norm2_upper(f["K"]),
            "W": _norm2_upper(W[f["h"]]),
        }
        for f in feats
    }
    _HEAD_NORM_CACHE[params] = out
    return out


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
    stack = _stacked_norms(params, feats)
    terms = {"1": [], "2": [], "3": []}  # per-head factors without the stacked norms
    full = {"1": [], "2": [], "3": []}  # per-head bounds on ||J^h_t|| (W_h excluded)
    w_norms = []
    rho_max = 1.0
    hn = _per_head_norms(params, feats)
    for f in feats:
        P = f["P"]
        rho = f["rho"]
        rho_k = max(rho, 1.0) if f["c"] is not None else rho
        rho_max = max(rho_max, rho_k, rho)
        nV, nQ, nK = (hn[f["h"]][key] for key in ("V", "Q", "K"))
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
        w_norms.append(hn[f["h"]]["W"])
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
    _, concat = _head_output_matrices(params)
    total = 0
    squares = 0
    hn = _per_head_norms(params, feats)
    for f in feats:
        P, v = f["P"], f["v"]
        vbar = P @ v  # V(m_i - x_bar)
        vn2 = v.square().sum(-1).unsqueeze(-2)  # (..., 1, n)
        vb2 = vbar.square().sum(-1, keepdim=True)  # (..., n, 1)
        slack = 4 * (v.shape[-1] + 4) * _U64
        d2 = (vn2 - 2 * vbar @ v.mT + vb2).clamp_min(0) + slack * (vn2 + vb2)
        qn = f["q"].square().sum(-1).sqrt() * (1 + slack)
        nV = hn[f["h"]]["V"]
        nK = hn[f["h"]]["K"] * f["rho"]
        nQ = hn[f["h"]]["Q"] * f["rho"]
        bn = qn * nK
        if f["c"] is not None:
            bn = bn + f["c"].to(torch.float64).square().sum().sqrt()
        self_h = (_variance(P, v) * _variance(P, f["k"])).sqrt() * nQ
        N_h = P * (nV + d2.sqrt() * bn.unsqueeze(-1)) + torch.diag_embed(self_h)
        total = total + hn[f["h"]]["W"] * N_h
        squares = squares + N_h.square()
    stacked = squares.sqrt()
    if concat:
        out = stacked
    else:
        out = torch.minimum(total, _norm2_upper(params.W_O) * stacked)
    return out * (1 + 16 * len(feats) * _U64)
