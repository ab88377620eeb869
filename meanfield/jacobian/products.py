r"""Matrix-free Jacobian products of attention at a linearisation, and the dense Jacobian.

:func:`jvp`, :func:`vjp` (Euclidean or Wasserstein operator), the self-map products
:func:`self_jvp` / :func:`self_vjp`, the per-query self blocks and :func:`dense_jacobian` (small
cases and tests). The product form is derived in ``docs/derivations/jacobian_products.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
import torch.func as tfunc
from torch import Tensor

from .._numerics import as_float_tensor, iter_chunks
from .._typing import Params
from .._typing import ProductGeometry as Geometry
from ..attention import attention_points
from .linearization import (
    PRODUCT_BLOCK,
    AttentionLinearization,
    RopeRows,
    check_rows,
    linearize,
    need,
    project_heads,
    query_rows,
)


# ----------------------------------------------------------------------------------- products
def check_geometry(lin: AttentionLinearization, geometry: str) -> bool:
    """Return whether the Wasserstein scaling applies."""
    if geometry == "euclidean":
        return False
    if geometry != "wasserstein":
        raise ValueError(f"geometry must be 'euclidean' or 'wasserstein', got {geometry!r}")
    if lin.log_weights is None:
        return False
    if lin.P_w is None:
        raise ValueError("the Wasserstein operator needs positive masses; drop zero-mass atoms")
    return True


def interaction(lin: AttentionLinearization, weighted: bool) -> Tensor:
    """The attention matrix of the interaction terms: ``P``, or the mass-weighted ``P_w``."""
    return lin.P_w if (weighted and lin.P_w is not None) else lin.P


def _rope_fn(
    lin: AttentionLinearization, h: int, log_weights: Tensor | None, positions: Tensor | None
) -> Callable[[Tensor], Tensor]:
    """The map ``Y -> W_h f_h(Y)`` of head ``h`` for torch.func, with these weights and positions."""
    head = lin.params.heads[h]
    W_h = lin.W[h]

    def fn(Y: Tensor) -> Tensor:
        out = attention_points(
            Y,
            head,
            log_weights=log_weights,
            masked=lin.masked,
            positions=positions,
            token_index=lin.token_index,
        )
        return out @ W_h.mT

    return fn


def _sqrt_weights(lin: AttentionLinearization) -> Tensor:
    lw = lin.log_weights
    if lw is None:
        raise ValueError("the Wasserstein scaling needs log_weights")
    return torch.exp(0.5 * (lw - lw.amax(-1, keepdim=True))).unsqueeze(-1)


def _combine(lin: AttentionLinearization, vals: Tensor, heads: tuple[int, ...]) -> Tensor:
    """Map per-head values (..., H_a, n, d_v) to outputs (..., n, d_out) with the W_h."""
    return torch.einsum("...hnv,hov->...no", vals, lin.W[list(heads)])


def key_blocks(lin: AttentionLinearization) -> Iterator[tuple[slice, slice]]:
    r"""Query blocks ``sl`` with the keys ``ks`` they can see.

    Causal sequences (``masked`` without ``positions``): query ``i`` sees keys ``j <= i``, so the
    block ending at ``sl.stop`` needs keys ``[0, sl.stop)`` only (the others have
    :math:`P_{ij} = 0` exactly): with query blocks of size :math:`b` this skips the all-zero
    upper blocks, a fraction :math:`(1 - b/n)/2` of the :math:`n\times n` work. Their size is
    ``chunk_size``, or 64 queries when it is ``None`` (small blocks also keep the
    :math:`H\times b\times n` intermediates in cache: at :math:`n = 1024` a product is about
    twice as fast as with one block). Otherwise every key, in blocks of ``chunk_size`` or 64
    (1.5 times faster than one block at :math:`n = 1024`, the same at :math:`n = 256`).
    """
    causal = lin._causal_block() is not None
    size = lin.chunk_size if lin.chunk_size is not None else PRODUCT_BLOCK
    for sl in iter_chunks(lin.n, size):
        yield sl, slice(0, sl.stop if causal else lin.n)


def _output_rows(lin: AttentionLinearization, G: Tensor, heads: tuple[int, ...]) -> Tensor:
    """Per-head rows ``W_h^T g_i`` for outputs ``G`` (..., n, d_out) -> (..., H, n, d_v)."""
    return torch.einsum("...no,hov->...hnv", G, lin.W[list(heads)])


def _head_rows_adjoint(
    lin: AttentionLinearization, Yq: Tensor, Yk: Tensor | None = None, Yv: Tensor | None = None
) -> Tensor:
    r"""Rows :math:`\sum_h(Q_h^\top y^q_h + K_h^\top y^k_h + V_h^\top y^v_h)` -> (..., n, d).

    The adjoint of :func:`project_heads` (``None`` terms are zero); without factors the identity
    stands for :math:`Q_h` and :math:`A_h` for :math:`K_h`.
    """
    if lin.QKV is not None and Yk is not None and Yv is not None:
        Z = torch.cat([Yq, Yk, Yv], dim=-1)  # (..., H_a, n, 2k + d_v), rows of QKV per head
        return Z.movedim(-3, -2).flatten(-2) @ lin.QKV
    if lin.QK is None:
        out = Yq.sum(-3)
        if Yk is not None:
            out = out + torch.einsum("...hne,hed->...nd", Yk, lin.A)
    else:
        out = torch.einsum("...hnk,hkd->...nd", Yq, lin.QK[0])
        if Yk is not None:
            out = out + torch.einsum("...hnk,hkd->...nd", Yk, lin.QK[1])
    if Yv is not None:
        out = out + torch.einsum("...hnv,hvd->...nd", Yv, lin.V)
    return out


def jvp(lin: AttentionLinearization, H: Tensor, *, geometry: Geometry = "euclidean") -> Tensor:
    r"""Jacobian-vector product :math:`JH` from the closed form, without forming :math:`J`.

    With :math:`S_{il} = \langle b_i, h_l\rangle` and :math:`R_{il} = \langle Ax_l, h_i\rangle`
    (matrix products :math:`BH^\top` and :math:`HAX^\top`),

    .. math::
        (JH)_i = V\Big(\sum_j\tilde P_{ij}h_j + \sum_l\big(\tilde P_{il}S_{il} + P_{il}R_{il}\big)
                 (x_l - m_i)\Big),

    summed over heads through :math:`W_h`; :math:`\tilde P = P` except in the Wasserstein
    geometry.

    Every :math:`n\times n` contraction runs in head space *(our derivation;
    docs/derivations/jacobian_products.md §2 in factored form)*: with :math:`A = Q^\top K`
    (:math:`Q, K\in\mathbb R^{k\times d}`),
    :math:`S_{il} = \langle Qx_i, Kh_l\rangle + \langle c, h_l\rangle`,
    :math:`R_{il} = \langle Qh_i, K(x_l - \bar x)\rangle` and
    :math:`V\sum_lT_{il}(x_l - m_i) = \sum_lT_{il}V(x_l-\bar x) - (\sum_lT_{il})V(m_i-\bar x)`,
    with :math:`Kx, Vx, Vm` precomputed by :func:`linearize`. Cost per head
    :math:`O(n^2(k + d_v) + nd(2k + d_v))`, plus :math:`O(nd_vd_{\mathrm{out}})` for the output
    map; heads without factors use :math:`Q = I`, :math:`K = A` (:math:`k = d`,
    :math:`O(n^2d + nd^2)`).

    Parameters
    ----------
    lin : AttentionLinearization
    H : Tensor, shape (..., n, d)
        Tangent, same shape as ``lin.X``.
    geometry : {"euclidean", "wasserstein"}, default "euclidean"
        ``"wasserstein"`` applies :math:`D_a^{1/2}JD_a^{-1/2}` (identical for uniform weights).

    Returns
    -------
    Tensor, shape (..., n, d_out)
    """
    weighted = check_geometry(lin, geometry)
    H = check_rows(H, lin.X, lin.d, "H")
    out: Tensor | None = None
    if lin.analytic_heads:
        Qx, KXc = need(lin.Qx, "Qx"), need(lin.KXc, "KXc")
        VXc, VMc = need(lin.VXc, "VXc"), need(lin.VMc, "VMc")
        Pi_all = interaction(lin, weighted)
        A = None if lin.QKV is not None else lin.A  # factored heads: the factors only
        qH, kH, vH = project_heads(lin.QK, A, lin.V, lin.QKV, H)  # Q h_l, K h_l, V h_l
        cH = None if lin.C is None else (H @ lin.C.mT).mT.unsqueeze(-2)  # (..., H_a, 1, n)
        # Euclidean geometry (Pi = P): T = P o (S + R) with S + R one product of width 2k
        merged = Pi_all is lin.P
        if merged:
            left = torch.cat([Qx, qH], dim=-1)
            right = torch.cat([kH, KXc], dim=-1)
        parts = []
        for sl, ks in key_blocks(lin):
            P = lin.P[..., sl, ks]
            Pi = Pi_all[..., sl, ks]
            if merged:
                S = left[..., sl, :] @ right[..., ks, :].mT  # S + R
            else:
                S = Qx[..., sl, :] @ kH[..., ks, :].mT  # <b_i, h_l> = <Q x_i, K h_l>
            if cH is not None:
                S = S + cH[..., ks]  # + <c, h_l>
            if merged:
                T = P * S
            else:
                R = qH[..., sl, :] @ KXc[..., ks, :].mT  # <A(x_l - x_bar), h_i>
                T = Pi * S + P * R
            vals = Pi @ vH[..., ks, :] + T @ VXc[..., ks, :]  # V(Pi h + T (x - x_bar))
            parts.append(vals - T.sum(-1, keepdim=True) * VMc[..., sl, :])
        out = _combine(lin, torch.cat(parts, dim=-2), lin.analytic_heads)
    if lin.rope_rows is not None:
        tangent = _rope_jvp(lin, lin.rope_rows, H, weighted)
        out = tangent if out is None else out + tangent
    elif lin.rope_heads:
        scale = _sqrt_weights(lin) if weighted else None
        Hs = H if scale is None else H / scale
        for h in lin.rope_heads:
            fn = _rope_fn(lin, h, lin.log_weights, lin.positions)
            tangent = tfunc.jvp(fn, (lin.X,), (Hs,))[1]
            tangent = tangent if scale is None else scale * tangent
            out = tangent if out is None else out + tangent
    assert out is not None  # every layer has a head (MultiHeadParams checks it)
    return out


def vjp(lin: AttentionLinearization, G: Tensor, *, geometry: Geometry = "euclidean") -> Tensor:
    r"""Vector-Jacobian product :math:`J^\top G` from the closed form, without forming :math:`J`.

    With :math:`\tilde g_i = V^\top W_h^\top g_i` and
    :math:`Z_{il} = \langle\tilde g_i, x_l - m_i\rangle`,

    .. math::
        (J^\top G)_l = \sum_i\tilde P_{il}\tilde g_i + \sum_i\tilde P_{il}Z_{il}\,b_i
                       + A\sum_jP_{lj}Z_{lj}\,x_j ,

    summed over heads; the last term is :math:`AC_l\tilde g_l`.

    In head space *(our derivation)*, with :math:`\gamma_i = W_h^\top g_i\in\mathbb R^{d_v}`,
    :math:`A = Q^\top K` and :math:`b_i = K^\top Qx_i + c`:
    :math:`Z_{il} = \langle\gamma_i, V(x_l-\bar x)\rangle - \langle\gamma_i, V(m_i-\bar x)\rangle`,
    the first two terms are :math:`V^\top\sum_i\tilde P_{il}\gamma_i +
    K^\top\sum_i\tilde P_{il}Z_{il}Qx_i + c\sum_i\tilde P_{il}Z_{il}` and the last is
    :math:`Q^\top\sum_jP_{lj}Z_{lj}K(x_j-\bar x)` (centring is free: :math:`\sum_jP_{lj}Z_{lj}
    = 0`). The maps back to :math:`\mathbb R^d` are one product with the stacked
    :math:`[Q_h; K_h; V_h]`. Cost as :func:`jvp`.

    Parameters
    ----------
    lin : AttentionLinearization
    G : Tensor, shape (..., n, d_out)
    geometry : {"euclidean", "wasserstein"}, default "euclidean"

    Returns
    -------
    Tensor, shape (..., n, d)
    """
    weighted = check_geometry(lin, geometry)
    G = check_rows(G, lin.X, lin.d_out, "G")
    out: Tensor | None = None
    if lin.analytic_heads:
        Qx, KXc = need(lin.Qx, "Qx"), need(lin.KXc, "KXc")
        VXc, VMc = need(lin.VXc, "VXc"), need(lin.VMc, "VMc")
        C = lin.C
        Pi_all = interaction(lin, weighted)
        gv = _output_rows(lin, G, lin.analytic_heads)  # (..., H_a, n, d_v): W_h^T g_i
        acc_v = G.new_zeros(VXc.shape)  # sum_i Pi_il W_h^T g_i
        acc_k = G.new_zeros(Qx.shape)  # sum_i Pi_il Z_il Q x_i
        acc_c = None if C is None else G.new_zeros(VXc.shape[:-1])  # sum_i Pi_il Z_il
        rows = []
        for sl, ks in key_blocks(lin):
            P = lin.P[..., sl, ks]
            Pi = Pi_all[..., sl, ks]
            g = gv[..., sl, :]
            Z = g @ VXc[..., ks, :].mT  # <g~_i, x_l - m_i>
            Z = Z - (g * VMc[..., sl, :]).sum(-1, keepdim=True)
            PiZ = Pi * Z
            acc_v[..., ks, :] += Pi.mT @ g
            acc_k[..., ks, :] += PiZ.mT @ Qx[..., sl, :]
            if acc_c is not None:
                acc_c[..., ks] += PiZ.sum(-2)
            PZ = PiZ if Pi_all is lin.P else P * Z  # Euclidean geometry: Pi = P
            rows.append(PZ @ KXc[..., ks, :])  # K sum_l P_il Z_il (x_l - x_bar)
        out = _head_rows_adjoint(lin, torch.cat(rows, dim=-2), acc_k, acc_v)
        if acc_c is not None and C is not None:  # both or neither
            out = out + acc_c.mT @ C
    if lin.rope_rows is not None:
        cot = _rope_vjp(lin, lin.rope_rows, G, weighted)
        out = cot if out is None else out + cot
    elif lin.rope_heads:
        scale = _sqrt_weights(lin) if weighted else None
        Gs = G if scale is None else G * scale
        for h in lin.rope_heads:
            pullback = tfunc.vjp(_rope_fn(lin, h, lin.log_weights, lin.positions), lin.X)[1]
            cot = pullback(Gs)[0]
            cot = cot if scale is None else cot / scale
            out = cot if out is None else out + cot
    assert out is not None  # every layer has a head (MultiHeadParams checks it)
    return out


def row_blocks(lin: AttentionLinearization, rr: RopeRows) -> Iterator[tuple[slice, slice]]:
    r"""Query blocks ``sl`` with the keys ``ks`` the heads of ``rr`` can see.

    :func:`key_blocks`, except when every head has a sliding window :math:`W` on the token
    positions ``0, ..., n-1`` (``rr.window``): a query block ``[a, b)`` then sees the keys
    ``(a - W, b - 1 + W)`` only (``(a - W, b)`` causal); :math:`P` is exactly zero outside them.
    """
    W = rr.window
    if W is None:
        yield from key_blocks(lin)
        return
    causal = lin._causal_block() is not None
    size = lin.chunk_size if lin.chunk_size is not None else PRODUCT_BLOCK
    n = lin.n
    for sl in iter_chunks(n, size):
        stop = sl.stop if causal else min(n, sl.stop + W - 1)
        yield sl, slice(max(0, sl.start - W + 1), stop)


def _rope_jvp(lin: AttentionLinearization, rr: RopeRows, H: Tensor, weighted: bool) -> Tensor:
    r"""The rotary and variant heads' part of :func:`jvp` in closed form.

    As for the other heads with rotated rows (docs/derivations/jacobian_products.md §3b):
    :math:`S_{il} = \langle\tilde q_i, \mathcal R_lKh_l\rangle`, :math:`R_{il} =
    \langle\mathcal R_iQh_i, \tilde k_l\rangle` (rotary heads carry no key-logit term). Heads
    with variants (§3c) use the tangent rows :math:`dq_i`, :math:`dk_l` through the QK-norms and
    the logit scale, and multiply :math:`T` by the soft-cap gate. ``rr`` are the rows
    ``lin.rope_rows``.
    """
    Pi_all = rr.P_w if (weighted and rr.P_w is not None) else rr.P
    qH = rr.query_tangent(H)
    kH = rr.key_tangent(H)
    vH = torch.einsum("...nd,hvd->...hnv", H, rr.V)
    gate = rr.gate
    parts = []
    for sl, ks in row_blocks(lin, rr):
        P, Pi = rr.P[..., sl, ks], Pi_all[..., sl, ks]
        S = rr.q[..., sl, :] @ kH[..., ks, :].mT
        T = Pi * S + P * (qH[..., sl, :] @ rr.kc[..., ks, :].mT)
        if gate is not None:
            T = T * gate[..., sl, ks]
        vals = Pi @ vH[..., ks, :] + T @ rr.VXc[..., ks, :]
        parts.append(vals - T.sum(-1, keepdim=True) * rr.VMc[..., sl, :])
    vals = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-2)
    return _combine(lin, vals, rr.heads)


def _rope_vjp(lin: AttentionLinearization, rr: RopeRows, G: Tensor, weighted: bool) -> Tensor:
    r"""The rotary and variant heads' part of :func:`vjp` in closed form: the adjoint of :func:`_rope_jvp`.

    The rotation's adjoint is the rotation by the opposite angles (times the same scaling); the
    QK-norms' Jacobians are applied transposed, and the gate multiplies :math:`Z` in the two
    logit terms (not the value term). ``rr`` are the rows ``lin.rope_rows``.
    """
    Pi_all = rr.P_w if (weighted and rr.P_w is not None) else rr.P
    gv = _output_rows(lin, G, rr.heads)
    acc_v = G.new_zeros(rr.VXc.shape)
    acc_k = G.new_zeros(rr.q.shape)
    gate = rr.gate
    rows = []
    for sl, ks in row_blocks(lin, rr):
        P, Pi = rr.P[..., sl, ks], Pi_all[..., sl, ks]
        g = gv[..., sl, :]
        Z = g @ rr.VXc[..., ks, :].mT - (g * rr.VMc[..., sl, :]).sum(-1, keepdim=True)
        if gate is not None:
            Z = Z * gate[..., sl, ks]
        PiZ = Pi * Z
        acc_v[..., ks, :] += Pi.mT @ g
        acc_k[..., ks, :] += PiZ.mT @ rr.q[..., sl, :]
        rows.append((P * Z) @ rr.kc[..., ks, :])
    acc_q = rows[0] if len(rows) == 1 else torch.cat(rows, dim=-2)
    out = rr.query_adjoint(acc_q)
    out = out + rr.key_adjoint(acc_k)
    return out + torch.einsum("...hnv,hvd->...nd", acc_v, rr.V)


def require_analytic(lin: AttentionLinearization, what: str) -> None:
    """Raise a one-line error when ``what`` needs the closed form and a head has none."""
    if lin.rope_heads:
        raise NotImplementedError(
            f"{what} uses the closed form, which does not apply to heads with a rotary embedding"
            + "".join(
                f" or {', '.join(v)}"
                for v in dict.fromkeys(lin.params.heads[h].variants for h in lin.rope_heads)
                if v
            )
        )


def self_jvp(lin: AttentionLinearization, U: Tensor) -> Tensor:
    r"""Per-atom self-Jacobian products :math:`u_i\mapsto S_iu_i`, all atoms at once.

    :math:`S_i = \sum_hW_hV_hC^h_iA_h^\top` is the self-Jacobian :math:`J_\mu(x_i)` of
    docs/theory.md §16 (multi-head form of §A5). With :math:`A = Q^\top K`,
    :math:`VC_iA^\top u_i = \sum_lP_{il}\langle K(x_l-m_i), Qu_i\rangle V(x_l-m_i)`: one
    :math:`n\times n` product per head in head space, cost
    :math:`O(H(n^2(k + d_v) + ndk))` (:math:`k = d`, :math:`Q = I`, :math:`K = A` without
    factors).

    Parameters
    ----------
    lin : AttentionLinearization
    U : Tensor, shape (..., n, d)
        One vector per atom.

    Returns
    -------
    Tensor, shape (..., n, d_out)
    """
    require_analytic(lin, "self_jvp")
    U = check_rows(U, lin.X, lin.d, "U")
    KXc, KMc = need(lin.KXc, "KXc"), need(lin.KMc, "KMc")
    VXc, VMc = need(lin.VXc, "VXc"), need(lin.VMc, "VMc")
    vals = _cov_apply(lin, query_rows(lin.QK, len(lin.analytic_heads), U), KXc, KMc, VXc, VMc)
    return _combine(lin, vals, lin.analytic_heads)


def self_vjp(lin: AttentionLinearization, G: Tensor) -> Tensor:
    r"""Per-atom adjoint products :math:`g_i\mapsto S_i^\top g_i`, all atoms at once.

    :math:`S_i^\top g_i = \sum_hA_hC^h_iV_h^\top W_h^\top g_i = \sum_hQ_h^\top\sum_lP_{il}
    \langle V_h(x_l-m_i), W_h^\top g_i\rangle K_h(x_l-m_i)`, cost as :func:`self_jvp`.

    Parameters
    ----------
    lin : AttentionLinearization
    G : Tensor, shape (..., n, d_out)

    Returns
    -------
    Tensor, shape (..., n, d)
    """
    require_analytic(lin, "self_vjp")
    G = check_rows(G, lin.X, lin.d_out, "G")
    KXc, KMc = need(lin.KXc, "KXc"), need(lin.KMc, "KMc")
    VXc, VMc = need(lin.VXc, "VXc"), need(lin.VMc, "VMc")
    rows = _cov_apply(lin, _output_rows(lin, G, lin.analytic_heads), VXc, VMc, KXc, KMc)
    return _head_rows_adjoint(lin, rows)


def _cov_apply(
    lin: AttentionLinearization, Wv: Tensor, Fx: Tensor, Fm: Tensor, Gx: Tensor, Gm: Tensor
) -> Tensor:
    r"""Rows :math:`\sum_lP_{il}\langle w_i, F(x_l - m_i)\rangle\,G(x_l - m_i)` per head.

    ``Wv`` (..., H_a, n, p) holds the :math:`w_i`; ``Fx``, ``Fm`` (..., H_a, n, p) and ``Gx``,
    ``Gm`` (..., H_a, n, r) the centred projections :math:`F(x_l-\bar x)`, :math:`F(m_i-\bar x)`
    (likewise for :math:`G`). Returns (..., H_a, n, r): :math:`GC_iF^\top w_i`.
    """
    parts = []
    for sl, ks in key_blocks(lin):
        w = Wv[..., sl, :]
        Z = w @ Fx[..., ks, :].mT - (w * Fm[..., sl, :]).sum(-1, keepdim=True)
        PZ = lin.P[..., sl, ks] * Z
        parts.append(PZ @ Gx[..., ks, :] - PZ.sum(-1, keepdim=True) * Gm[..., sl, :])
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-2)


# ------------------------------------------------------------------------------ explicit blocks
def self_blocks(lin: AttentionLinearization, sl: slice) -> Tensor:
    """Explicit S_i (..., |sl|, d_out, d) for the atoms in ``sl``."""
    Xc = lin.X.unsqueeze(-3) - lin.x_bar.unsqueeze(-3)
    Mc = lin.m[..., sl, :] - lin.x_bar.unsqueeze(-3)
    O = lin.W[list(lin.analytic_heads)] @ lin.V  # (H_a, d_out, d): W_h V_h
    OX = Xc @ O.mT  # (..., H_a, n, d_out)
    AX = Xc @ lin.A.mT  # rows A (x_l - x_bar)
    P = lin.P[..., sl, :]
    second = torch.einsum("...hil,...hla,...hlb->...iab", P, OX, AX)
    first = torch.einsum("...hia,...hib->...iab", Mc @ O.mT, Mc @ lin.A.mT)
    return second - first


def self_jacobian_blocks(
    X: Tensor,
    params: Params,
    *,
    log_weights: Tensor | None = None,
    masked: bool = False,
    positions: Tensor | None = None,
    chunk_size: int | None = None,
) -> Tensor:
    r"""Self-Jacobians :math:`S_i = \sum_hW_hV_hC^h_iA_h^\top`, one (d_out, d) block per atom.

    These are the :math:`J_\mu(x_i) = VC_{x_i}A^\top` of docs/theory.md §16 entering the split
    constant of §5.3 (multi-head: :math:`\|\sum_hW_hV_hC^h_iA_h^\top\|_2`). *(derived and checked
    numerically.)* Memory :math:`O(nd_{\mathrm{out}}d)`.

    Parameters
    ----------
    X : Tensor, shape (..., n, d)
    params : AttentionParams or MultiHeadParams
    log_weights, masked, positions, chunk_size
        As in :func:`linearize`.

    Returns
    -------
    Tensor, shape (..., n, d_out, d)
    """
    lin = linearize(
        X,
        params,
        log_weights=log_weights,
        masked=masked,
        positions=positions,
        chunk_size=chunk_size,
    )
    require_analytic(lin, "self_jacobian_blocks")
    return torch.cat([self_blocks(lin, sl) for sl in iter_chunks(lin.n, chunk_size)], dim=-3)


def _dense_analytic(lin: AttentionLinearization, weighted: bool) -> Tensor:
    """Blocks (..., n, d_out, n, d) of the analytic heads."""
    Pi = interaction(lin, weighted)
    Xh = lin.X.unsqueeze(-3)
    O = lin.W[list(lin.analytic_heads)] @ lin.V  # (H_a, d_out, d)
    OX = Xh @ O.mT  # (..., H_a, n, d_out)   O x_j
    OM = lin.m @ O.mT  # (..., H_a, n, d_out)   O m_i
    Oa = OX.unsqueeze(-3) - OM.unsqueeze(-2)  # (..., H_a, i, j, d_out)  O (x_j - m_i)
    J = torch.einsum("...hij,hab->...iajb", Pi, O)
    J = J + torch.einsum("...hij,...hija,...hib->...iajb", Pi, Oa, lin.B)
    S = self_blocks(lin, slice(0, lin.n))  # (..., n, d_out, d)
    idx = torch.arange(lin.n, device=J.device)
    # advanced indices separated by a slice put the atom axis first: (n, ..., d_out, d)
    J[..., idx, :, idx, :] += S.movedim(-3, 0)
    return J


def _dense_rope(lin: AttentionLinearization, h: int) -> Tensor:
    """Blocks (..., n, d_out, n, d) of a rotary or variant head via torch.func.jacrev, per sample."""
    batch = lin.batch_shape
    n, d = lin.n, lin.d

    def per_sample(t: Tensor | None) -> Tensor | None:
        return None if t is None else t.expand(batch + (n,)).reshape(-1, n)

    Xf = lin.X.reshape(-1, n, d)
    lw, pos = per_sample(lin.log_weights), per_sample(lin.positions)
    blocks = []
    for k in range(Xf.shape[0]):
        fn = _rope_fn(lin, h, None if lw is None else lw[k], None if pos is None else pos[k])
        blocks.append(tfunc.jacrev(fn)(Xf[k]))
    return torch.stack(blocks).reshape(batch + (n, lin.d_out, n, d))


def dense_jacobian(
    X: Tensor,
    params: Params,
    *,
    log_weights: Tensor | None = None,
    masked: bool = False,
    positions: Tensor | None = None,
    token_index: Tensor | None = None,
    geometry: Geometry = "euclidean",
    max_size: int = 4096,
    force: bool = False,
) -> Tensor:
    r"""Assemble the full :math:`(nd_{\mathrm{out}})\times(nd)` Jacobian from the closed form.

    Row block :math:`i`, column block :math:`j` is :math:`J_{ij} = \partial f_i/\partial x_j`
    (``vec`` stacks tokens row-major, docs/conventions.md §2); in the Wasserstein geometry the blocks are
    :math:`\sqrt{a_i/a_j}J_{ij}`. Rotary and variant heads use ``torch.func.jacrev``.

    Parameters
    ----------
    X : Tensor, shape (..., n, d)
    params : AttentionParams or MultiHeadParams
    log_weights, masked, positions, token_index
        As in :func:`linearize`.
    geometry : {"euclidean", "wasserstein"}, default "euclidean"
    max_size : int, default 4096
        Largest ``n * d`` assembled without ``force``.
    force : bool, default False
        Assemble even when ``n * d > max_size``.

    Returns
    -------
    Tensor, shape (..., n * d_out, n * d)

    Raises
    ------
    ValueError
        When ``n * d > max_size`` and ``force`` is false.
    """
    X = as_float_tensor(X, "X")
    if X.ndim >= 2 and X.shape[-2] * X.shape[-1] > max_size and not force:
        raise ValueError(
            f"n * d = {X.shape[-2] * X.shape[-1]} exceeds max_size = {max_size}; "
            "use the matrix-free jvp/vjp or pass force=True"
        )
    lin = linearize(
        X,
        params,
        log_weights=log_weights,
        masked=masked,
        positions=positions,
        token_index=token_index,
    )
    return dense_from_linearization(lin, geometry)


def dense_from_linearization(lin: AttentionLinearization, geometry: str) -> Tensor:
    """The dense Jacobian (..., n d_out, n d) of a linearisation, in ``geometry``."""
    weighted = check_geometry(lin, geometry)
    n, d, d_out = lin.n, lin.d, lin.d_out
    J = lin.X.new_zeros(lin.batch_shape + (n, d_out, n, d))
    if lin.analytic_heads:
        J = J + _dense_analytic(lin, weighted)
    if lin.rope_heads:
        Jr = sum(_dense_rope(lin, h) for h in lin.rope_heads)
        if weighted:
            s = _sqrt_weights(lin).squeeze(-1)  # (..., n)
            ratio = s[..., :, None] / s[..., None, :]
            Jr = Jr * ratio[..., :, None, :, None]
        J = J + Jr
    return J.reshape(lin.batch_shape + (n * d_out, n * d))
