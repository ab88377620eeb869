r"""Head-space rows of the linearisation with certified error radii (docs/certificates.md §5.1).

The block certificate (:mod:`~meanfield.jacobian.block_norms`) bounds distances and weighted
spreads of the rows :math:`M(x_l-\bar x)` and of their attention means, for
:math:`M\in\{V_h, R_hV_h, K_h, R'_hK_h, I\}` (:math:`R_h`, :math:`R'_h` the triangular factors
of :math:`W_h^\top W_h` and :math:`Q_hQ_h^\top`). Each family of rows is stored as computed,
with bounds on its distance to the exact rows of the reference operator (the Jacobian formula on
the stored attention matrix), so that the bound holds in floating point.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from .._spectral import U64, gamma_k, spectral_norm_upper
from .._typing import Params
from ..params import HEAD_FIELDS, AttentionParams, MultiHeadParams
from .linearization import (
    AttentionLinearization,
    as_float64,
    attend,
    need,
    project_heads,
    stack_qkv,
)

#: Relative inflation of the head-space bounds for the rounding of their own elementwise
#: arithmetic (a few dozen operations on nonnegative numbers; docs/certificates.md §5.1).
OUT_INFL = 1 + 64 * U64


def subnormal_floor(H: int) -> float:
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
    return M.square().sum((-2, -1)).sqrt() * (1 + gamma_k(M.shape[-1] * M.shape[-2] + 2))


def norm2_upper(M: Tensor | None) -> Tensor:
    """Certified float64 upper bound on ``||M||_2`` from its SVD value (1 for ``M = None``).

    :func:`~meanfield._spectral.spectral_norm_upper` certifies the SVD value (no Gram steps).
    """
    if M is None:
        return torch.ones((), dtype=torch.float64)
    M = M.to(torch.float64)
    return spectral_norm_upper(M, candidate=torch.linalg.matrix_norm(M, ord=2), max_iter=0)


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
        _fro_upper(E) * (1 + U64)
        + gamma_k(F.shape[-2] + 1) * nF.square()
        + gamma_k(R.shape[-2] + 1) * nR.square()
    ) * (1 + 4 * U64)
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


_FACTOR_CACHE: weakref.WeakKeyDictionary[Params, _HeadFactors] = weakref.WeakKeyDictionary()


def _head_factors(lin: AttentionLinearization) -> _HeadFactors:
    cached = _FACTOR_CACHE.get(lin.params)
    if cached is not None:
        return cached
    heads = [lin.params.heads[h] for h in lin.analytic_heads]
    f64 = torch.float64
    V = torch.stack([h.V for h in heads]).to(f64)
    nu_Q = Qf = None
    if lin.QK is not None:
        Q, K = (t.to(f64) for t in lin.QK)
        nu_Q, Qf = _fro_upper(Q), _gram_factor(Q.mT)
    else:
        K = torch.stack([h.A for h in heads]).to(f64)
    c_norm = (
        torch.zeros(len(heads), dtype=f64, device=V.device)
        if lin.C is None
        else lin.C.to(f64).square().sum(-1).sqrt() * (1 + gamma_k(lin.d + 2))
    )
    Wf = None if lin.concat else _gram_factor(lin.W[list(lin.analytic_heads)])
    out = _HeadFactors(nu_V=_fro_upper(V), nu_K=_fro_upper(K), nu_Q=nu_Q, c_norm=c_norm, W=Wf, Q=Qf)
    _FACTOR_CACHE[lin.params] = out
    return out


@dataclass(frozen=True, eq=False)
class Rows:
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


def _rows(
    P: Tensor, sums: _RowSums, z: Tensor, zm: Tensor, eps: Tensor, g: Tensor | None = None
) -> Rows:
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
    infl = 1 + gamma_k(n + 4)
    zn2, zmn2 = z.square().sum(-1), zm.square().sum(-1)
    cols = (zn2, eps, eps.square(), zn2.sqrt())
    sums_P = P @ torch.stack([t.expand(P.shape[:-1]) for t in cols], dim=-1)
    second, P_eps, P_eps2, p_norm = sums_P.unbind(-1)
    if g is None:
        g = gamma_k(n + 2) * p_norm
    eps_m = (g + P_eps) * infl
    zmn = zmn2.sqrt()
    c = 4 * (n + k + 4) * U64
    core = (
        (second - zmn2).clamp_min(0)
        + c * (second + zmn2) * (1 + sums.s)
        + g * (2 * zmn + g)
        + sums.sigma * (zmn + g).square()
    )
    spread = (core.sqrt() + (1 + sums.s + sums.sigma) * P_eps2.sqrt()) * infl
    return Rows(
        z=z, zm=zm, zn2=zn2, zmn2=zmn2, eps=eps, eps_m=eps_m, g=g, p_norm=p_norm * infl,
        spread=spread,
    )  # fmt: skip


def _through(fam: Rows, f: _GramFactor, P: Tensor, sums: _RowSums) -> Rows:
    r"""The family seen through :math:`R_h` (:class:`_GramFactor`): rows :math:`\mathrm{fl}(Rz)`.

    The new rows are within :math:`\gamma_k\nu\|\hat z_l\| + \nu\epsilon_l` of
    :math:`Rz_l`, and the new stored means :math:`\mathrm{fl}(R\hat z_{m,i})` within
    :math:`\gamma_k\nu(\|\hat z_{m,i}\| + \sum_lP_{il}\|\hat z_l\|) + \nu g_i` of the mean
    of the new stored rows (:math:`\nu\ge\|R\|_F\ge\||R|\|_2`).
    """
    R = f.R  # (H, r, k)
    nu = f.nu.unsqueeze(-1)
    gk = gamma_k(fam.z.shape[-1] + 2)
    eps = gk * nu * fam.zn2.sqrt() + nu * fam.eps
    g = (gk * nu * (fam.zmn2.sqrt() + fam.p_norm) + nu * fam.g) * (1 + 4 * U64)
    return _rows(P, sums, fam.z @ R.mT, fam.zm @ R.mT, eps, g)


def float64_rows(lin: AttentionLinearization) -> AttentionLinearization:
    """A float64 linearisation whose head rows were computed in float64.

    A float32 linearisation converted by :func:`as_float64` keeps rows rounded in float32, which
    the float64 error radii of :func:`_rows` would not cover; they are recomputed from the
    (exact) float64 values of ``X`` and the weights, and the attention matrix is kept as stored.
    """
    if lin.X.dtype == torch.float64:
        return lin
    lin = as_float64(lin)
    A = lin.A if lin.QK is None else None
    _, KXc, VXc = project_heads(lin.QK, A, lin.V, lin.QKV, lin.X - lin.x_bar)
    KVMc = attend(lin.P, torch.cat([KXc, VXc], dim=-1), lin._causal_block())
    k = KXc.shape[-1]
    return replace(
        lin, KXc=KXc, VXc=VXc, KMc=KVMc[..., :k], VMc=KVMc[..., k:], Qx=None, _m=None, _B=None
    )


#: Per-head rebalancing of :math:`(V_h, W_h)` applies beyond an imbalance of ``2**(2 * this)``
#: between their largest entries (docs/rounding.md §5); below it the factors are left as stored.
_BALANCE_MIN = 32

_BALANCE_CACHE: weakref.WeakKeyDictionary[Params, tuple[Params, dict[int, int]]] = (
    weakref.WeakKeyDictionary()
)


def _exp_absmax(t: Tensor) -> int | None:
    """Binary exponent ``e`` with ``max |t| in [2**(e-1), 2**e)`` (``None`` if zero or not finite)."""
    m = float(t.detach().abs().amax()) if t.numel() else 0.0
    if m == 0.0 or not math.isfinite(m):
        return None
    return math.frexp(m)[1]


def _exact_ldexp(t: Tensor, k: int) -> Tensor | None:
    """``t * 2**k``, or ``None`` when that product is not exactly representable.

    A scaling by a power of two rounds only where the result leaves the normal range (subnormal
    or overflow); undoing it then does not give ``t`` back, so the round trip is a proof of
    exactness.
    """
    out = torch.ldexp(t, torch.tensor(k, device=t.device))
    back = torch.ldexp(out, torch.tensor(-k, device=t.device))
    return out if bool(torch.isfinite(out).all()) and torch.equal(back, t) else None


def _head_projection(params: MultiHeadParams, h: int) -> Tensor:
    """Column block :math:`W_h` of :math:`W^O` of a layer that has one."""
    W = params.head_projection(h)
    if W is None:
        raise ValueError("the layer has no output projection W_O")
    return W


def _balance_exponents(params: Params) -> dict[int, tuple[int, Tensor, Tensor]]:
    r"""Per head, ``k`` with ``V_h -> 2**-k V_h`` and ``W_h -> 2**k W_h`` exact (docs/rounding.md §5).

    ``k`` brings the largest entries of the two factors to the same binary order; heads within
    ``2**(2 * _BALANCE_MIN)`` of balance, and heads whose scaled factors would not be exact even
    after halving ``k`` down to that threshold, are left out. Returns ``{h: (k, 2**-k V_h,
    2**k W_h)}``.
    """
    out: dict[int, tuple[int, Tensor, Tensor]] = {}
    if not isinstance(params, MultiHeadParams) or params.W_O is None:
        return out
    for h, head in enumerate(params.heads):
        W = _head_projection(params, h)
        eV, eW = _exp_absmax(head.V), _exp_absmax(W)
        if eV is None or eW is None:
            continue
        k = (eV - eW) // 2
        while abs(k) > _BALANCE_MIN:
            V2, W2 = _exact_ldexp(head.V, -k), _exact_ldexp(W, k)
            if V2 is not None and W2 is not None:
                out[h] = (k, V2, W2)
                break
            k = int(k / 2)
    return out


def _balanced_params(params: Params) -> tuple[Params, dict[int, int]]:
    r"""Parameters with every head's :math:`(V_h, W_h)` rebalanced by :func:`_balance_exponents`.

    The layer is unchanged: it depends on the two factors only through :math:`W_hV_h`, which
    the exact power-of-two scalings leave as it is. Returns the parameters (``params`` itself
    when nothing is rebalanced; cached per ``params``, so the weight norms are certified once)
    and the exponent of each rebalanced head.
    """
    cached = _BALANCE_CACHE.get(params)
    if cached is not None:
        return cached
    scal = _balance_exponents(params)
    out: tuple[Params, dict[int, int]]
    if not scal or not isinstance(params, MultiHeadParams):  # only layers with W^O rebalance
        out = (params, {})
    else:
        heads = tuple(
            h if i not in scal else AttentionParams._from_validated(
                **{name: getattr(h, name) for name in HEAD_FIELDS if name != "V"}, V=scal[i][1]
            )
            for i, h in enumerate(params.heads)
        )  # fmt: skip
        blocks = [
            scal[i][2] if i in scal else _head_projection(params, i) for i in range(len(heads))
        ]
        W_O = torch.cat(blocks, dim=-1)
        out = (MultiHeadParams(heads, W_O=W_O, b_O=params.b_O), {i: scal[i][0] for i in scal})
    _BALANCE_CACHE[params] = out
    return out


def rebalanced(lin: AttentionLinearization) -> AttentionLinearization:
    r"""``lin`` on the rebalanced factors of :func:`_balanced_params` (``lin`` when none are).

    The stored attention matrices, points and score factors are kept; :math:`V_h`, :math:`W_h`
    and the value rows :math:`V_h(x_l-\bar x)` and their means are those of the rebalanced
    factors, the rows recomputed from them (their rounding is what :func:`_rows` covers). The
    reference operator (docs/certificates.md §5.1) is unchanged: it depends on the factors only
    through :math:`W_hV_h`.
    """
    if lin.concat:
        return lin
    params, ks = _balanced_params(lin.params)
    if not ks:
        return lin
    W = lin.W.clone()
    for h, k in ks.items():
        Wh = _exact_ldexp(lin.W[h], k)
        if Wh is None:  # lin.W is not the parameters' W^O: keep the factors as they are
            return lin
        W[h] = Wh
    Xc = lin.X - lin.x_bar
    block = lin._causal_block()
    V, VXc, VMc, QKV = lin.V, lin.VXc, lin.VMc, lin.QKV
    if lin.analytic_heads:
        V = torch.stack([params.heads[h].V for h in lin.analytic_heads]).to(lin.V)
        VXc = torch.einsum("...nd,hvd->...hnv", Xc, V)
        VMc = attend(lin.P, VXc, block)
        if lin.QKV is not None and lin.QK is not None:  # both or neither (factored heads)
            QKV = stack_qkv(lin.QK, V)
    rr = lin.rope_rows
    if rr is not None:
        Vr = torch.stack([params.heads[h].V for h in rr.heads]).to(rr.V)
        VXr = torch.einsum("...nd,hvd->...hnv", Xc, Vr)
        rr = replace(rr, V=Vr, VXc=VXr, VMc=attend(rr.P, VXr, block))
    return replace(lin, params=params, W=W, V=V, VXc=VXc, VMc=VMc, QKV=QKV, rope_rows=rr)


@dataclass(frozen=True, eq=False)
class RowFamilies:
    r"""The row families of docs/certificates.md §5.1 (built by :func:`row_families`).

    ``V``: :math:`V_h(x_l-\bar x)`; ``WV``: the same through the factor of :math:`W_h` (``None``
    for concatenated heads); ``K``, ``QK``: :math:`K_h(x_l-\bar x)` and through the factor of
    :math:`Q_h^\top` (self terms; ``QK`` ``None`` without factors); ``I``: :math:`x_l-\bar x`
    itself (ambient terms). A family that was not asked for is ``None``.
    """

    sums: _RowSums
    factors: _HeadFactors
    rho: Tensor  # (..., 1, n): ||x_l - x_bar|| <= rho_l
    V: Rows
    WV: Rows | None = None
    K: Rows | None = None
    QK: Rows | None = None
    I: Rows | None = None


def row_families(lin: AttentionLinearization, *, ambient: bool, self_terms: bool) -> RowFamilies:
    """The row families of docs/certificates.md §5.1 for a float64 ``lin`` (see :func:`_rows`).

    The self terms (``K``, ``QK``) are formed with ``self_terms``, the ambient ones (``I``) with
    ``ambient`` (:class:`RowFamilies`).
    """
    P = lin.P
    d = lin.d
    fac = _head_factors(lin)
    s = P.sum(-1)
    sums = _RowSums(s=s, sigma=(s - 1).abs() + gamma_k(P.shape[-1] + 1) * s)
    Xc = lin.X - lin.x_bar
    # ||x_l - x_bar|| <= rho_l: the stored centred rows are within 2u of the exact ones
    rho = (Xc.square().sum(-1).sqrt() * (1 + gamma_k(d + 4))).unsqueeze(-2)  # (..., 1, n)
    gd = gamma_k(d + 2)
    VXc, VMc = need(lin.VXc, "VXc"), need(lin.VMc, "VMc")
    fam_V = _rows(P, sums, VXc, VMc, gd * fac.nu_V.unsqueeze(-1) * rho)
    fam_WV = fam_K = fam_QK = fam_I = None
    if fac.W is not None:
        fam_WV = _through(fam_V, fac.W, P, sums)
    if self_terms:
        KXc, KMc = need(lin.KXc, "KXc"), need(lin.KMc, "KMc")
        fam_K = _rows(P, sums, KXc, KMc, gd * fac.nu_K.unsqueeze(-1) * rho)
        if fac.Q is not None:
            fam_QK = _through(fam_K, fac.Q, P, sums)
    if ambient:
        Mc = attend(P, Xc.unsqueeze(-3), lin._causal_block())  # (..., H, n, d)
        fam_I = _rows(P, sums, Xc.unsqueeze(-3), Mc, 2 * U64 * rho)
    return RowFamilies(
        sums=sums, factors=fac, rho=rho, V=fam_V, WV=fam_WV, K=fam_K, QK=fam_QK, I=fam_I
    )


def b_norms(lin: AttentionLinearization, fac: _HeadFactors) -> tuple[Tensor, Tensor, Tensor]:
    r"""Upper bounds on :math:`\|b_i\|` for the exact :math:`b_i = A_h^\top x_i + c_h`.

    Returns ``(bn, B_norm, err)`` (..., H, n): the bound, the norm of the stored rows
    :math:`\hat b_i` and the bound on :math:`\|\hat b_i - b_i\|`, which is
    :math:`\gamma_{d+k+2}(2\nu_K\nu_Q\|x_i\| + \|c\|)` with factors
    (:math:`\hat b_i = \mathrm{fl}(K^\top\mathrm{fl}(Qx_i)) + c`) and
    :math:`\gamma_{d+2}(\nu_A\|x_i\| + \|c\|)` without.
    """
    d = lin.d
    B_norm = lin.B.square().sum(-1).sqrt() * (1 + gamma_k(d + 2))
    x_norm = (lin.X.square().sum(-1).sqrt() * (1 + gamma_k(d + 2))).unsqueeze(-2)
    nu_K, c = fac.nu_K.unsqueeze(-1), fac.c_norm.unsqueeze(-1)
    if fac.nu_Q is None or lin.QK is None:  # both or neither (heads without factors)
        err = gamma_k(d + 3) * (nu_K * x_norm + c)
    else:
        k = lin.QK[0].shape[-2]
        err = gamma_k(d + k + 3) * (2 * nu_K * fac.nu_Q.unsqueeze(-1) * x_norm + c)
    return (B_norm + err) * (1 + 4 * U64), B_norm, err


def pair_dist(fam: Rows, sl: slice, kend: int) -> Tensor:
    r"""Upper bounds on :math:`\|z_j - \bar z_i\|` (exact rows and means), (..., H, b, kend).

    For the queries ``sl`` and the keys ``:kend``.

    :math:`\|\hat z_j\|^2 - 2\hat z_j^\top\hat z_{m,i} + \|\hat z_{m,i}\|^2` is computed
    within :math:`2\gamma_{k+2}(\|\hat z_j\|^2 + \|\hat z_{m,i}\|^2)` of the exact squared
    distance of the stored vectors; :math:`4(k+4)u` times the same is added before the root, and
    the radii of the rows and the mean after it.
    """
    c = 1 + 4 * (fam.z.shape[-1] + 4) * U64
    D = fam.zm[..., sl, :] @ fam.z[..., :kend, :].mT
    D.mul_(-2).add_((fam.zmn2[..., sl] * c).unsqueeze(-1))
    D.add_((fam.zn2[..., :kend] * c).unsqueeze(-2))
    D.clamp_min_(0).sqrt_()
    D.add_(fam.eps_m[..., sl].unsqueeze(-1))
    return D.add_(fam.eps[..., :kend].unsqueeze(-2))
