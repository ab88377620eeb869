r"""The linearisation of an attention layer at a point cloud: what the Jacobian products reuse.

:func:`linearize` computes once the attention matrix, the barycentres, the per-query covariances
and the head-space projections of one layer at one input; :class:`AttentionLinearization` holds
them. The products (:mod:`meanfield.jacobian.products`) and the block-norm certificates
(:mod:`meanfield.jacobian.block_norms`) read from it. The formulas are described in the package
docstring (:mod:`meanfield.jacobian`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import cast, overload

import torch
from torch import Tensor

from .._numerics import admissible_logits, iter_chunks
from .._typing import Params
from .._validation import check_aux, check_index, check_points, params_dtype_device
from ..attention import admissible_keys, head_logits, head_mask
from ..params import AttentionParams, MultiHeadParams, RotaryEmbedding


def require_factors(head: AttentionParams) -> tuple[Tensor, Tensor]:
    """The factors ``(Q, K)`` of a head that must have them (rotary heads do)."""
    factors = head.factors
    if factors is None:
        raise ValueError("the head has no factors Q and K")
    return factors


def require_rope(head: AttentionParams) -> RotaryEmbedding:
    """The rotary embedding of a head that must have one."""
    if head.rope is None:
        raise ValueError("the head has no rotary embedding")
    return head.rope


def need(t: Tensor | None, name: str) -> Tensor:
    """A field of a linearisation that the caller needs: a one-line error when it is absent."""
    if t is None:
        raise ValueError(f"the linearization has no {name} (no analytic heads, or not formed)")
    return t


@dataclass(frozen=True, eq=False)
class AttentionLinearization:
    r"""Everything the closed-form Jacobian needs at one input, built once by :func:`linearize`.

    Heads without a rotary embedding or another variant ("analytic" heads, :math:`H_a` of them)
    are stacked along a head axis; the others have their own head-space rows (:class:`RopeRows`,
    docs/derivations/jacobian_products.md §3b-§3c), or go through automatic differentiation when
    their head widths differ.

    Attributes
    ----------
    X : Tensor, shape (..., n, d)
        The input points.
    P : Tensor, shape (..., H_a, n, n)
        Attention matrices :math:`P^h` (row-stochastic, zero where masked).
    P_w : Tensor, shape (..., H_a, n, n) or None
        :math:`\tilde P^h_{ij} = \sqrt{a_i/a_j}\,P^h_{ij}` (computed in the log domain) when
        log-weights were given and all finite; ``None`` otherwise.
    m : Tensor, shape (..., H_a, n, d)
        Attention means :math:`m^h_i = \sum_lP^h_{il}x_l` (a property, computed on first use).
    B : Tensor, shape (..., H_a, n, d)
        Rows :math:`b^h_i = A_h^\top x_i + c_h` (a property, computed on first use).
    x_bar : Tensor, shape (..., 1, d)
        Token mean, used to centre coordinates before the :math:`x_l - m_i` products.
    A : Tensor, shape (H_a, d, d)
        Score matrices :math:`A_h` (a property, stacked on first use: the products of factored
        heads only use the factors).
    V : Tensor, shape (H_a, d_v, d)
    W : Tensor, shape (H, d_out, d_v)
        Output matrices :math:`W_h` of *all* heads (column blocks of :math:`W^O`, or block
        selectors when the heads are concatenated).
    concat : bool
        Whether the heads are concatenated (no :math:`W^O`).
    QK : tuple of Tensor, shapes (H_a, k, d), or None
        Stacked factors :math:`A_h = Q_h^\top K_h` when every analytic head has them (products
        with :math:`A_h` then cost :math:`O(ndk)` instead of :math:`O(nd^2)`).
    params : AttentionParams or MultiHeadParams
    analytic_heads, rope_heads : tuple of int
        Indices of the plain heads, and of the heads with a rotary embedding or another variant
        (closed form on ``rope_rows``, or autograd when ``rope_rows`` is ``None``).
    log_weights, positions, token_index : Tensor or None
    masked : bool
    chunk_size : int or None
        Query-block size of the products.
    Qx : Tensor, shape (..., H_a, n, k)
        Head-space queries :math:`q^h_i = Q_hx_i`, with :math:`b^h_i = K_h^\top q^h_i + c_h`.
        Without factors (``QK is None``) the identity stands for :math:`Q_h` and :math:`A_h` for
        :math:`K_h` (:math:`k = d`, ``Qx`` is ``X`` broadcast over the heads).
    KXc, KMc : Tensor, shape (..., H_a, n, k)
        :math:`K_h(x_l - \bar x)` and :math:`K_h(m^h_i - \bar x)` (:math:`A_h` in place of
        :math:`K_h` without factors).
    VXc, VMc : Tensor, shape (..., H_a, n, d_v)
        :math:`V_h(x_l - \bar x)` and :math:`V_h(m^h_i - \bar x)`.
    C : Tensor, shape (H_a, d), or None
        Key-logit terms :math:`c_h` (``None`` when no analytic head has one).
    QKV : Tensor, shape (H_a (2k + d_v), d), or None
        Rows :math:`[Q_h; K_h; V_h]` stacked head after head (factored heads only), so that the
        three head-space projections of a tangent are one matrix product.
    rope_rows : RopeRows or None
        Head-space rows of the rotary and variant heads, for their products in closed form
        (``None`` when there are none, or when their widths differ and the products go through
        autograd).
    """

    X: Tensor
    P: Tensor
    P_w: Tensor | None
    x_bar: Tensor
    V: Tensor
    W: Tensor
    concat: bool
    QK: tuple[Tensor, Tensor] | None
    params: Params
    analytic_heads: tuple[int, ...]
    rope_heads: tuple[int, ...]
    log_weights: Tensor | None
    positions: Tensor | None
    token_index: Tensor | None
    masked: bool
    chunk_size: int | None
    Qx: Tensor | None = None
    KXc: Tensor | None = None
    KMc: Tensor | None = None
    VXc: Tensor | None = None
    VMc: Tensor | None = None
    C: Tensor | None = None
    QKV: Tensor | None = None
    rope_rows: RopeRows | None = None
    _m: Tensor | None = field(default=None, repr=False)
    _B: Tensor | None = field(default=None, repr=False)
    _A: Tensor | None = field(default=None, repr=False)

    @property
    def A(self) -> Tensor:
        """Score matrices of the analytic heads, (H_a, d, d), in the dtype of ``X``."""
        A = self._A
        if A is None:
            if self.analytic_heads:
                heads = self.params.heads
                A = torch.stack([heads[h].A for h in self.analytic_heads]).to(self.X.dtype)
            else:
                A = self.X.new_zeros(0, self.d, self.d)
            object.__setattr__(self, "_A", A)
        return A

    @property
    def m(self) -> Tensor:
        r"""Attention means :math:`m^h_i = \sum_lP^h_{il}x_l`, computed on first use.

        The products never need them (they use :math:`V_h(m^h_i-\bar x)` and
        :math:`K_h(m^h_i-\bar x)`, formed in head space by :func:`linearize`); the explicit
        blocks and the block-norm certificate do, at a cost :math:`O(H_an^2d)`.
        """
        m = self._m
        if m is None:
            m = attend(self.P, self.X.unsqueeze(-3), self._causal_block())
            object.__setattr__(self, "_m", m)
        return m

    @property
    def B(self) -> Tensor:
        r"""Rows :math:`b^h_i = A_h^\top x_i + c_h`, computed on first use."""
        B = self._B
        if B is None:
            if self.QK is None:
                B = torch.einsum("...nd,hde->...hne", self.X, self.A)
            else:
                Qx = torch.einsum("...nd,hkd->...hnk", self.X, self.QK[0])
                B = torch.einsum("...hnk,hke->...hne", Qx, self.QK[1])
            if self.C is not None:
                B = B + self.C.unsqueeze(-2)
            object.__setattr__(self, "_B", B)
        return B

    def _causal_block(self) -> int | None:
        """Query-block size of the products with P when whole upper blocks are zero."""
        if not self.masked or self.positions is not None:
            return None
        return self.chunk_size if self.chunk_size is not None else PRODUCT_BLOCK

    @property
    def n(self) -> int:
        """Number of tokens (atoms)."""
        return self.X.shape[-2]

    @property
    def d(self) -> int:
        """Input dimension."""
        return self.X.shape[-1]

    @property
    def d_out(self) -> int:
        """Output dimension."""
        return self.W.shape[-2]

    @property
    def batch_shape(self) -> torch.Size:
        """Leading (batch) dimensions of ``X``."""
        return self.X.shape[:-2]

    @property
    def weighted(self) -> bool:
        """Whether non-uniform weights give a distinct Wasserstein operator."""
        return self.P_w is not None


# ----------------------------------------------------------------------------- construction
def head_output_matrices(params: Params) -> tuple[Tensor, bool]:
    """Stack the per-head output matrices W_h (H, d_out, d_v) and tell whether heads concatenate."""
    heads = params.heads
    H, d_v = len(heads), heads[0].d_v
    if isinstance(params, MultiHeadParams) and params.W_O is not None:
        W = params.W_O.reshape(params.W_O.shape[0], H, d_v).permute(1, 0, 2)
        return W.contiguous(), False
    eye = torch.eye(H * d_v, dtype=heads[0].dtype, device=heads[0].device)
    return eye.reshape(H, d_v, H * d_v).permute(0, 2, 1).contiguous(), True


def log_attention(logits: Tensor, allowed: Tensor | None) -> Tensor:
    """Row log-softmax with the empty-row policy of :func:`meanfield._numerics.masked_softmax`."""
    return torch.log_softmax(admissible_logits(logits, allowed), dim=-1)


def attention_pair(logP: Tensor, log_weights: Tensor | None) -> tuple[Tensor, Tensor | None]:
    r"""Attention matrices ``exp(logP)`` and their Wasserstein form :math:`\tilde P` (or ``None``).

    :math:`\tilde P_{ij} = \sqrt{a_i/a_j}\,P_{ij}` is formed in the log domain, when log-weights
    are given and all finite.
    """
    P_w = None
    if log_weights is not None and bool(torch.isfinite(log_weights).all()):
        half = 0.5 * log_weights.unsqueeze(-2)  # (..., 1, n)
        P_w = (logP + (half.mT - half).unsqueeze(-3)).exp()
    return logP.exp(), P_w


#: Query-block size of the products when ``chunk_size=None``: blocks of this size keep the
#: (H, block, n) intermediates in cache and, for causal sequences, skip the zero upper part of P.
PRODUCT_BLOCK = 64


def attend(P: Tensor, F: Tensor, block: int | None) -> Tensor:
    """``P @ F`` (..., H, n, r) for ``P`` (..., H, n, n); causal ``block``: skip the zero blocks."""
    n = P.shape[-1]
    if block is None or block >= n:
        return P @ F
    parts = [P[..., sl, : sl.stop] @ F[..., : sl.stop, :] for sl in iter_chunks(n, block)]
    return torch.cat(parts, dim=-2)


def query_rows(QK: tuple[Tensor, Tensor] | None, H: int, Y: Tensor) -> Tensor:
    """Per-head rows ``Q_h y`` (..., H, n, k) of ``Y`` (..., n, d): ``y`` itself without factors."""
    if QK is None:
        return Y.unsqueeze(-3).expand(Y.shape[:-2] + (H,) + Y.shape[-2:])
    return torch.einsum("...nd,hkd->...hnk", Y, QK[0])


def stack_qkv(QK: tuple[Tensor, Tensor], V: Tensor) -> Tensor:
    """The rows ``[Q_h; K_h; V_h]`` stacked head after head, (H_a (2k + d_v), d)."""
    return torch.cat([QK[0], QK[1], V], dim=-2).reshape(-1, V.shape[-1])


def project_heads(
    QK: tuple[Tensor, Tensor] | None, A: Tensor | None, V: Tensor, QKV: Tensor | None, Y: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Head-space rows ``(Q_h y, K_h y, V_h y)`` of ``Y`` (..., n, d), each (..., H_a, n, .).

    Without factors the identity stands for ``Q_h`` and ``A_h`` for ``K_h`` (the first output is
    then ``Y`` broadcast over the heads). With them, one product with the stacked ``QKV``
    (``A`` is then not used and may be ``None``).
    """
    if QKV is not None:
        if QK is None:
            raise ValueError("the stacked rows QKV need the factors QK")
        H_a, k = QK[0].shape[0], QK[0].shape[1]
        Z = (Y @ QKV.mT).unflatten(-1, (H_a, -1)).movedim(-2, -3)  # (..., H_a, n, 2k + d_v)
        return Z[..., :k], Z[..., k : 2 * k], Z[..., 2 * k :]
    if A is None:
        raise ValueError("project_heads needs the score matrices A without the stacked QKV")
    qY = Y.unsqueeze(-3).expand(Y.shape[:-2] + (A.shape[0],) + Y.shape[-2:])
    return qY, torch.einsum("...nd,hed->...hne", Y, A), torch.einsum("...nd,hvd->...hnv", Y, V)


@dataclass(frozen=True, eq=False)
class NormRows:
    r"""Pre-norm rows of a QK-norm at the linearisation point, for its Jacobian in closed form.

    The RMS norm :math:`N(u) = w\odot u\,\rho(u)`, :math:`\rho(u) = (\tfrac1k\|u\|^2 +
    \varepsilon)^{-1/2}`, has the Jacobian
    :math:`J_N(u)h = w\odot(\rho h - \tfrac{\rho^3}{k}\langle u, h\rangle u)` (symmetric up to
    the gain: :math:`J_N(u)^\top g = \rho\,(w\odot g) - \tfrac{\rho^3}{k}\langle u, w\odot g
    \rangle u`). Heads of the stack without a norm are stored as ``u = 0``, ``rho = 1``,
    ``w = 1``, for which both products return their argument exactly.

    Attributes
    ----------
    u : Tensor, shape (..., H_r, n, k)
        Pre-norm rows :math:`u_i = Qx_i + b_q` (or :math:`Kx_i + b_k`).
    rho : Tensor, shape (..., H_r, n, 1)
        :math:`\rho(u_i)`.
    w : Tensor, shape (H_r, 1, k)
        Gains of the norms.
    """

    u: Tensor
    rho: Tensor
    w: Tensor

    def jvp(self, Y: Tensor) -> Tensor:
        r"""Rows :math:`J_N(u_i)y_i` for tangent rows ``Y`` (..., H_r, n, k)."""
        k = self.u.shape[-1]
        dot = (self.u * Y).sum(-1, keepdim=True)
        return self.w * (self.rho * Y - (self.rho.pow(3) / k * dot) * self.u)

    def vjp(self, Y: Tensor) -> Tensor:
        r"""Rows :math:`J_N(u_i)^\top y_i` for cotangent rows ``Y`` (..., H_r, n, k)."""
        k = self.u.shape[-1]
        wy = self.w * Y
        dot = (self.u * wy).sum(-1, keepdim=True)
        return self.rho * wy - (self.rho.pow(3) / k * dot) * self.u


@dataclass(frozen=True, eq=False)
class RopeRows:
    r"""Head-space rows of the rotary and variant heads at the linearisation point.

    For rotary heads the logits are :math:`s_{il} = \langle\tilde q_i, \tilde k_l\rangle +
    \log a_l` with :math:`\tilde q_i = \mathcal R_i Q x_i` and
    :math:`\tilde k_l = \mathcal R_l K x_l` (:math:`\mathcal R_p` the rotation at token
    position :math:`p`, times the embedding's ``attention_scaling``). Their products have the
    closed form of the other heads with rotated rows (docs/derivations/jacobian_products.md §3b).

    Heads with variants (docs/derivations/jacobian_products.md §3c) have
    :math:`q_i = s\,\mathcal R_i N_q(Qx_i + b_q)`, :math:`k_l = \mathcal R_l N_k(Kx_l + b_k)`
    (QK-norms :math:`N`, logit scale :math:`s` folded into the queries, rotation optional, partial
    rotary included), logits :math:`\kappa\tanh(\langle q_i, k_l\rangle/\kappa)` plus ALiBi and
    log-masses, and the window in the mask: the logit tangent is
    :math:`g_{il}(\langle dq_i, k_l\rangle + \langle q_i, dk_l\rangle)` with the gate
    :math:`g_{il} = 1 - \tanh^2(\langle q_i, k_l\rangle/\kappa)`; ALiBi, the window and the
    masses enter :math:`P` only. Heads given by ``A`` only use :math:`Q = A^\top`, :math:`K = I`
    and :math:`b_q = c` (exact); a factored head with a key-logit term :math:`c` gets one more
    head coordinate (:func:`head_space_factors`). The fields of the variants are ``None`` when
    no head of the stack has them, and plain rotary heads then run the operations of §3b
    unchanged. *(our derivation, checked numerically against torch.func.)*

    Attributes
    ----------
    heads : tuple of int
        The heads, in order.
    P, P_w : Tensor, shape (..., H_r, n, n)
        Attention matrices, and their Wasserstein-weighted form (or ``None``).
    q : Tensor, shape (..., H_r, n, k)
        Rotated queries :math:`\tilde q_i` (times the logit scale when a head has one).
    kc : Tensor, shape (..., H_r, n, k)
        Rotated keys minus their mean over the keys (a shift constant in :math:`l` leaves the
        products unchanged, since :math:`\sum_lP_{il}(x_l - m_i) = 0`); the keys themselves when
        ``gate`` is set (the gate breaks that invariance).
    VXc, VMc : Tensor, shape (..., H_r, n, d_v)
        :math:`V_h(x_l-\bar x)` and :math:`V_h(m_i-\bar x)`.
    Q, K, V : Tensor, shapes (H_r, k, d), (H_r, k, d), (H_r, d_v, d)
    index : Tensor, shape (n,) or (..., 1, n)
        Token positions of the rotation, shaped to broadcast over the heads.
    ropes : tuple of RotaryEmbedding or None
        Each head's embedding (one rotation for all when they are equal; ``None``: no rotation).
    gate : Tensor, shape (..., H_r, n, n), or None
        Soft-cap gate :math:`g_{il}` (1 for heads without a cap); ``None`` without caps.
    scale : Tensor, shape (H_r, 1, 1), or None
        Logit scales :math:`s` (1 for heads without one); ``None`` when no head has one.
    q_norm, k_norm : NormRows or None
        The QK-norms' pre-norm rows; ``None`` when no head has that norm.
    window : int or None
        When every head has a sliding window and the token positions are ``0, ..., n-1``: the
        largest window, so that a query block only visits the keys within it.
    """

    heads: tuple[int, ...]
    P: Tensor
    P_w: Tensor | None
    q: Tensor
    kc: Tensor
    VXc: Tensor
    VMc: Tensor
    Q: Tensor
    K: Tensor
    V: Tensor
    index: Tensor
    ropes: tuple[RotaryEmbedding | None, ...]
    gate: Tensor | None = None
    scale: Tensor | None = None
    q_norm: NormRows | None = None
    k_norm: NormRows | None = None
    window: int | None = None

    def rotate(self, Z: Tensor, *, adjoint: bool = False) -> Tensor:
        """Rotate head rows ``Z`` (..., H_r, n, k) at the token positions (or by the adjoint).

        Heads without an embedding keep their rows.
        """
        return rotate_some(self.ropes, Z, self.index, adjoint=adjoint)

    def query_tangent(self, H: Tensor) -> Tensor:
        r"""Rows :math:`dq_i = s\,\mathcal R_iJ_{N_q}(u_i)Qh_i` of tangent rows ``H`` (..., n, d)."""
        Y = torch.einsum("...nd,hkd->...hnk", H, self.Q)
        if self.q_norm is not None:
            Y = self.q_norm.jvp(Y)
        Y = self.rotate(Y)
        return Y if self.scale is None else self.scale * Y

    def key_tangent(self, H: Tensor) -> Tensor:
        r"""Rows :math:`dk_l = \mathcal R_lJ_{N_k}(u_l)Kh_l` of tangent rows ``H`` (..., n, d)."""
        Y = torch.einsum("...nd,hkd->...hnk", H, self.K)
        if self.k_norm is not None:
            Y = self.k_norm.jvp(Y)
        return self.rotate(Y)

    def query_adjoint(self, Y: Tensor) -> Tensor:
        """The adjoint of :meth:`query_tangent`, summed over the heads: (..., H_r, n, k) -> (..., n, d)."""
        if self.scale is not None:
            Y = self.scale * Y
        Y = self.rotate(Y, adjoint=True)
        if self.q_norm is not None:
            Y = self.q_norm.vjp(Y)
        return torch.einsum("...hnk,hkd->...nd", Y, self.Q)

    def key_adjoint(self, Y: Tensor) -> Tensor:
        """The adjoint of :meth:`key_tangent`, summed over the heads: (..., H_r, n, k) -> (..., n, d)."""
        Y = self.rotate(Y, adjoint=True)
        if self.k_norm is not None:
            Y = self.k_norm.vjp(Y)
        return torch.einsum("...hnk,hkd->...nd", Y, self.K)


def rotate_rows(
    ropes: tuple[RotaryEmbedding, ...], Z: Tensor, index: Tensor, *, adjoint: bool = False
) -> Tensor:
    """Rows ``Z`` (..., H_r, n, k) rotated by each head's embedding at the positions ``index``.

    The adjoint of a rotation is the rotation by the opposite angles (with the same scaling).
    """
    return rotate_some(ropes, Z, index, adjoint=adjoint)


def rotate_some(
    ropes: tuple[RotaryEmbedding | None, ...], Z: Tensor, index: Tensor, *, adjoint: bool = False
) -> Tensor:
    """:func:`rotate_rows` where some heads may have no embedding (``None``: rows kept).

    Heads whose embeddings are all equal are rotated at once.
    """
    if all(r is None for r in ropes):
        return Z
    idx = -index if adjoint else index
    first = ropes[0]
    if first is not None and all(
        r is not None
        and r.attention_scaling == first.attention_scaling
        and torch.equal(r.inv_freq, first.inv_freq)
        for r in ropes[1:]
    ):
        return first.apply(Z, idx)
    per_head = idx.squeeze(-2) if idx.ndim > 1 else idx
    return torch.stack(
        [Z[..., a, :, :] if r is None else r.apply(Z[..., a, :, :], per_head)
         for a, r in enumerate(ropes)],
        dim=-3,
    )  # fmt: skip


def check_rows(T: Tensor, X: Tensor, last: int, name: str) -> Tensor:
    """``T`` checked to have the rows of ``X`` (shape ``X.shape[:-1] + (last,)``), in its dtype.

    The tangents and cotangents of the Jacobian products, stored and streaming alike; another
    shape is a one-line ``ValueError`` naming ``name``.
    """
    expected = X.shape[:-1] + (last,)
    if T.shape != expected:
        raise ValueError(f"{name} must have shape {tuple(expected)}, got {tuple(T.shape)}")
    return T.to(X.dtype)


def _fallback_head(head: object) -> bool:
    """Whether a head leaves the closed form: a rotary embedding or any variant."""
    return getattr(head, "rope", None) is not None or bool(getattr(head, "variants", ()))


def head_space_factors(
    head: AttentionParams, d: int
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    r"""``(Q, K, b_q, b_k)`` of a head in the head space of its products.

    A head given by ``A`` only has :math:`Q = A^\top`, :math:`K = I` and :math:`b_q = c`:
    :math:`\langle A^\top x_i + c, x_l\rangle = x_i^\top Ax_l + c^\top x_l`. A factored head
    with a key-logit term :math:`c` (no rotation, norm or cap: the parameters exclude them) gets
    one more coordinate, :math:`q_i = (Qx_i, 1/s)` and :math:`k_l = (Kx_l, c^\top x_l)`, so
    that :math:`s\langle q_i, k_l\rangle = s\langle Qx_i, Kx_l\rangle + c^\top x_l` (exact
    up to the rounding of :math:`s\cdot(1/s)`).
    """
    factors = head.factors
    if factors is None:
        A = head.A
        return A.mT, torch.eye(d, dtype=A.dtype, device=A.device), head.c, None
    Q, K = factors
    if head.c is None:
        return Q, K, head.q_bias, head.k_bias
    s = 1.0 if head.logit_scale is None else head.logit_scale
    Q = torch.cat([Q, Q.new_zeros(1, d)])
    K = torch.cat([K, head.c.unsqueeze(0).to(K)])
    bq = Q.new_zeros(Q.shape[0])
    bq[-1] = 1.0 / s
    return Q, K, bq, None


def norm_rows(U: Tensor, norms: list, dtype: torch.dtype) -> tuple[Tensor, NormRows | None]:
    """Normalised rows of the pre-norm rows ``U`` (..., H_r, n, k) and their :class:`NormRows`.

    ``norms`` holds each head's RMSNorm or ``None``; ``None`` for all: ``(U, None)``.
    """
    if all(nm is None for nm in norms):
        return U, None
    k = U.shape[-1]
    rows, us, rhos, ws = [], [], [], []
    for a, nm in enumerate(norms):
        u = U[..., a, :, :]
        if nm is None:
            rows.append(u)
            us.append(torch.zeros_like(u))
            rhos.append(torch.ones_like(u[..., :1]))
            ws.append(torch.ones(k, dtype=dtype, device=U.device))
        else:
            rows.append(nm.apply(u))
            us.append(u)
            rhos.append(torch.rsqrt(u.square().mean(-1, keepdim=True) + nm.eps))
            ws.append(nm.weight.to(dtype))
    norm = NormRows(
        u=torch.stack(us, dim=-3), rho=torch.stack(rhos, dim=-3),
        w=torch.stack(ws).unsqueeze(-2),
    )  # fmt: skip
    return torch.stack(rows, dim=-3), norm


def variant_head_rows(
    X: Tensor, heads: list[AttentionParams], index: Tensor
) -> tuple[
    Tensor,
    Tensor,
    Tensor,
    Tensor,
    NormRows | None,
    NormRows | None,
    tuple[RotaryEmbedding | None, ...],
    Tensor | None,
]:
    r"""Head-space factors and rows of heads with variants (§3c), shared by both paths.

    Returns ``(Q, K, q, k, q_norm, k_norm, ropes, scale)``: the factors of
    :func:`head_space_factors` stacked (G, k, d); the queries
    :math:`q_i = s\,\mathcal R_iN_q(Qx_i + b_q)` and keys :math:`k_l = \mathcal R_lN_k(Kx_l + b_k)`
    (..., G, n, k), not centred; the norms' :class:`NormRows`; each head's rotary embedding; the
    logit scales (G, 1, 1) or ``None`` when no head has one. ``index``: token positions shaped
    to broadcast over the heads.
    """
    d = X.shape[-1]
    dtype = X.dtype
    factors = [head_space_factors(h, d) for h in heads]
    Q = torch.stack([f[0] for f in factors]).to(dtype)
    K = torch.stack([f[1] for f in factors]).to(dtype)
    k = Q.shape[-2]

    def biases(i: int) -> Tensor | None:
        bs = [f[i] for f in factors]
        if all(b is None for b in bs):
            return None
        zero = X.new_zeros(k)
        return torch.stack([zero if b is None else b.to(dtype) for b in bs]).unsqueeze(-2)

    Uq = torch.einsum("...nd,hkd->...hnk", X, Q)
    Uk = torch.einsum("...nd,hkd->...hnk", X, K)
    bq, bk = biases(2), biases(3)
    Uq = Uq if bq is None else Uq + bq
    Uk = Uk if bk is None else Uk + bk
    q, q_norm = norm_rows(Uq, [h.q_norm for h in heads], dtype)
    kr, k_norm = norm_rows(Uk, [h.k_norm for h in heads], dtype)
    ropes = tuple(h.rope for h in heads)
    scale = None
    if any(h.logit_scale is not None for h in heads):
        s = [1.0 if h.logit_scale is None else h.logit_scale for h in heads]
        scale = torch.tensor(s, dtype=dtype, device=X.device).reshape(-1, 1, 1)
    q, kr = rotate_some(ropes, q, index), rotate_some(ropes, kr, index)
    if scale is not None:
        q = scale * q
    return Q, K, q, kr, q_norm, k_norm, ropes, scale


def _rope_rows(
    X: Tensor,
    params: Params,
    heads_idx: tuple[int, ...],
    log_weights: Tensor | None,
    allowed: Tensor | None,
    token_index: Tensor | None,
    x_bar: Tensor,
    block: int | None,
) -> RopeRows | None:
    """The :class:`RopeRows` of the rotary and variant heads ``heads_idx``.

    Plain rotary heads run the operations of docs/derivations/jacobian_products.md §3b (the
    variant fields stay ``None``), heads with variants those of §3c. ``None`` when the heads'
    head-space widths or value widths differ (the products then go through autograd).
    """
    heads = [params.heads[h] for h in heads_idx]
    n, d = X.shape[-2], X.shape[-1]
    factors = [head_space_factors(h, d) for h in heads]
    if len({(tuple(f[0].shape), h.d_v) for f, h in zip(factors, heads)}) != 1:
        return None
    idx = torch.arange(n, device=X.device) if token_index is None else token_index
    idx = idx.to(X.device)
    logP = torch.stack(
        [
            log_attention(
                head_logits(X, X, h, log_weights, query_index=idx, key_index=idx),
                head_mask(h, allowed, idx, idx, n, n, X.device),
            )
            for h in heads
        ],
        dim=-3,
    )
    P, P_w = attention_pair(logP, log_weights)
    dtype = X.dtype
    V = torch.stack([h.V for h in heads])
    index = idx.unsqueeze(-2) if idx.ndim > 1 else idx
    Q, K, q, kr, q_norm, k_norm, ropes, scale = variant_head_rows(X, heads, index)
    gate = None
    if any(h.softcap is not None for h in heads):
        caps = [math.inf if h.softcap is None else h.softcap for h in heads]
        cap = torch.tensor(caps, dtype=dtype, device=X.device).reshape(-1, 1, 1)
        # g = 1 - tanh^2(s/cap) = cosh^-2(s/cap), accurate where the cap saturates (0 beyond)
        gate = torch.cosh((q @ kr.mT) / cap).reciprocal().square()
    else:
        kr = kr - kr.mean(-2, keepdim=True)  # without a gate the products are shift-invariant
    window = None
    if token_index is None and all(h.window is not None for h in heads):
        window = max(cast(int, h.window) for h in heads)
    VXc = torch.einsum("...nd,hvd->...hnv", X - x_bar, V)
    return RopeRows(
        heads=heads_idx, P=P, P_w=P_w, q=q, kc=kr, VXc=VXc, VMc=attend(P, VXc, block), Q=Q,
        K=K, V=V, index=index, ropes=ropes, gate=gate, scale=scale, q_norm=q_norm,
        k_norm=k_norm, window=window,
    )  # fmt: skip


def linearize(
    X: Tensor,
    params: Params,
    *,
    log_weights: Tensor | None = None,
    masked: bool = False,
    positions: Tensor | None = None,
    token_index: Tensor | None = None,
    chunk_size: int | None = None,
) -> AttentionLinearization:
    r"""Precompute :math:`P^h`, :math:`m^h_i`, :math:`b^h_i` for the closed-form Jacobian at ``X``.

    Cost :math:`O(H(n^2k + ndk))` with head width :math:`k` (:math:`k = d` for heads without
    factors), memory :math:`O(Hn^2 + Hnk)`; the attention means :math:`m^h_i` and the rows
    :math:`b^h_i`, which only the explicit blocks and the certificates need, are formed on first
    use (:attr:`AttentionLinearization.m`, :attr:`AttentionLinearization.B`).

    Parameters
    ----------
    X : Tensor, shape (..., n, d)
        Points; leading dimensions are a batch.
    params : AttentionParams or MultiHeadParams
    log_weights : Tensor, shape (..., n), optional
        Log-masses :math:`\log a_j` (uniform when omitted).
    masked : bool, default False
        Causal attention: keys ``j <= i``, or keys with ``positions[j] <= positions[i]``.
    positions : Tensor, shape (..., n), optional
        Positions of a position-tagged measure (docs/theory.md §B2).
    token_index : Tensor, shape (..., n) or (n,), optional
        Integer token positions for rotary heads (default ``0, ..., n-1``).
    chunk_size : int, optional
        Query-block size used by the products (bounds intermediates to ``chunk x n`` per head).
        Default: blocks of 64 queries, which keep the intermediates in cache; for causal
        sequences they also skip the all-zero upper part of :math:`P`.

    Returns
    -------
    AttentionLinearization
    """
    # the input rule of the attention functions (docs/conventions.md §8)
    dtype, device = params_dtype_device(params, (AttentionParams, MultiHeadParams), "linearize")
    heads = params.heads
    d = heads[0].d
    X = check_points(X, "X", d, dtype, device)
    n = X.shape[-2]
    log_weights = check_aux(log_weights, "log_weights", X, n, finite=False)
    positions = check_aux(positions, "positions", X, n)
    token_index = check_index(token_index, "token_index", X, n)
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size}")
    # Heads with a rotary embedding or another variant (QK-norm, soft-cap, window, ALiBi, ...)
    # get head-space rows of their own (RopeRows, docs/derivations/jacobian_products.md §3b-§3c);
    # the stacked closed form below covers the plain bilinear heads.
    analytic = tuple(h for h, head in enumerate(heads) if not _fallback_head(head))
    rope = tuple(h for h, head in enumerate(heads) if _fallback_head(head))
    allowed = admissible_keys(masked, n, n, positions, None, X.device)
    W, concat = head_output_matrices(params)
    x_bar = X.mean(-2, keepdim=True)
    # causal sequences: products with P skip its zero upper blocks (as in _causal_block)
    block = None if (not masked or positions is not None) else (chunk_size or PRODUCT_BLOCK)
    A = None  # stacked on first use (AttentionLinearization.A); only unfactored heads need it
    QK: tuple[Tensor, Tensor] | None = None
    C = QKV = Qx = KXc = KMc = VXc = VMc = None
    if analytic:
        V = torch.stack([heads[h].V for h in analytic])
        logP = torch.stack(
            [log_attention(head_logits(X, X, heads[h], log_weights), allowed) for h in analytic],
            dim=-3,
        )
        P, P_w = attention_pair(logP, log_weights)
        pairs = [f for f in (heads[h].factors for h in analytic) if f is not None]
        if len(pairs) == len(analytic) and len({tuple(Qh.shape) for Qh, _ in pairs}) == 1:
            QK = (torch.stack([Qh for Qh, _ in pairs]), torch.stack([Kh for _, Kh in pairs]))
        cs = [heads[h].c for h in analytic]
        if any(c is not None for c in cs):
            C = torch.stack([X.new_zeros(d) if c is None else c for c in cs])
        # head-space features (factors Q_h, K_h of width k; A_h and the identity without them)
        if QK is not None:
            QKV = stack_qkv(QK, V)
        else:
            A = torch.stack([heads[h].A for h in analytic])
        _, KXc, VXc = project_heads(QK, A, V, QKV, X - x_bar)
        Qx = query_rows(QK, len(analytic), X)
        # K_h(m_i - x_bar) and V_h(m_i - x_bar) in head space: rows of P sum to one, so they are
        # P K_h(X - x_bar) and P V_h(X - x_bar); the means m_i themselves are formed lazily
        KVMc = attend(P, torch.cat([KXc, VXc], dim=-1), block)
        KMc, VMc = KVMc[..., : KXc.shape[-1]], KVMc[..., KXc.shape[-1] :]
    else:
        V = X.new_zeros(0, heads[0].d_v, d)
        P = X.new_zeros(X.shape[:-2] + (0, n, n))
        P_w = P if log_weights is not None and bool(torch.isfinite(log_weights).all()) else None
    rope_rows = None
    if rope:  # rotary and variant heads (§3b-§3c)
        rope_rows = _rope_rows(X, params, rope, log_weights, allowed, token_index, x_bar, block)
    return AttentionLinearization(
        X=X,
        P=P,
        P_w=P_w,
        x_bar=x_bar,
        _A=A,
        V=V,
        W=W,
        concat=concat,
        QK=QK,
        params=params,
        analytic_heads=analytic,
        rope_heads=rope,
        log_weights=log_weights,
        positions=positions,
        token_index=token_index,
        masked=masked,
        chunk_size=chunk_size,
        Qx=Qx,
        KXc=KXc,
        KMc=KMc,
        VXc=VXc,
        VMc=VMc,
        C=C,
        QKV=QKV,
        rope_rows=rope_rows,
    )


@overload
def _f64(t: Tensor) -> Tensor: ...
@overload
def _f64(t: None) -> None: ...
def _f64(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.to(torch.float64)


def _rope_float64(rr: RopeRows) -> RopeRows:
    """The same rotary rows with their tensors in float64 (indices and embeddings as they are)."""

    def norm(nr: NormRows | None) -> NormRows | None:
        return None if nr is None else NormRows(u=_f64(nr.u), rho=_f64(nr.rho), w=_f64(nr.w))

    return replace(
        rr, P=_f64(rr.P), P_w=_f64(rr.P_w), q=_f64(rr.q), kc=_f64(rr.kc), VXc=_f64(rr.VXc),
        VMc=_f64(rr.VMc), Q=_f64(rr.Q), K=_f64(rr.K), V=_f64(rr.V), gate=_f64(rr.gate),
        scale=_f64(rr.scale), q_norm=norm(rr.q_norm), k_norm=norm(rr.k_norm),
    )  # fmt: skip


def as_float64(lin: AttentionLinearization) -> AttentionLinearization:
    """The same linearization with its tensors in float64 (no recomputation).

    Converted: the points, attention matrices, means, head rows and weight matrices; the
    log-weights, positions, token indices and flags are kept as they are.
    """
    if lin.X.dtype == torch.float64:
        return lin
    rr = lin.rope_rows
    return replace(
        lin, X=_f64(lin.X), P=_f64(lin.P), P_w=_f64(lin.P_w), _m=_f64(lin._m), _B=_f64(lin._B),
        x_bar=_f64(lin.x_bar), _A=_f64(lin._A), V=_f64(lin.V), W=_f64(lin.W), Qx=_f64(lin.Qx),
        KXc=_f64(lin.KXc), KMc=_f64(lin.KMc), VXc=_f64(lin.VXc), VMc=_f64(lin.VMc),
        C=_f64(lin.C), QKV=_f64(lin.QKV),
        QK=None if lin.QK is None else (_f64(lin.QK[0]), _f64(lin.QK[1])),
        rope_rows=None if rr is None else _rope_float64(rr),
    )  # fmt: skip
