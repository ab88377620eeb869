r"""Closed-form Jacobians of self-attention and matrix-free Jacobian products (THEORY.md §4).

For one head with score matrix :math:`A`, value matrix :math:`V` and key-logit term :math:`c`
(query bias, THEORY.md §2.2), the logits are
:math:`\ell_{il} = x_i^\top Ax_l + c^\top x_l + \log a_l` (:math:`-\infty` where masked), and
:math:`f(X)_i = Vm_i + b` with :math:`m_i = \sum_lP_{il}x_l`. Since
:math:`\partial\ell_{il}/\partial x_i = Ax_l` and :math:`\partial\ell_{il}/\partial x_l =
A^\top x_i + c =: b_i`, the blocks :math:`J_{ij} = \partial f_i/\partial x_j` (column convention,
:math:`d_{\mathrm{out}}\times d`) are

.. math::
    J_{ij} = P_{ij}\,V\big(I + (x_j - m_i)\,b_i^\top\big) + \delta_{ij}\,VC_iA^\top,\qquad
    C_i = \sum_lP_{il}(x_l-m_i)(x_l-m_i)^\top .

A multi-head layer has :math:`J = \sum_h(I_n\otimes W_h)J^h` with :math:`W_h` column block
:math:`h` of :math:`W^O` (a block selector when the heads are concatenated). Masking only zeroes
:math:`P_{ij}`; weighted atoms only add :math:`\log a_j` to the logits. *(derived and checked
numerically against finite differences and torch.func; THEORY.md §4.1.)*

The **Wasserstein** operator of a weighted measure is :math:`D_a^{1/2}JD_a^{-1/2}` (THEORY.md
§5.2), whose blocks are :math:`\sqrt{a_i/a_j}J_{ij}`: the same formula with
:math:`\tilde P_{ij} = \sqrt{a_i/a_j}\,P_{ij}` in the two interaction terms, while the self term
:math:`VC_iA^\top` is unchanged.

Reference: V. Castin, P. Ablin, G. Peyré, *How Smooth Is Attention?*, ICML 2024 (arXiv
2312.14820 v2). The formulas are THEORY.md reconstructions labelled *derived and checked
numerically*; they are not quoted from the paper.

Products :func:`jvp` and :func:`vjp` never form a block; their matrix-product form is derived in
``docs/derivations/jacobian_products.md``. For heads with factors :math:`A = Q^\top K`
(:math:`Q, K\in\mathbb R^{k\times d}`) every :math:`n\times n` contraction runs in head space
(through :math:`Qx, Kx, Vx`, precomputed by :func:`linearize`), so a product costs
:math:`O(n^2(k + d_v) + nd(2k + d_v))` per head, the order of the forward pass; heads given only
by :math:`A` cost :math:`O(n^2d + nd^2)`. Heads with a rotary embedding (``head.rope``) fall back
to ``torch.func`` products of :func:`~meanfield.attention.attention_points`.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Literal

import torch
import torch.func as tfunc
from torch import Tensor

from ._numerics import as_float_tensor, check_finite, iter_chunks
from ._spectral import rank_one_sigma_max_from_stats, spectral_norm_upper
from .attention import admissible_keys, attention_points, head_logits
from .params import AttentionParams, MultiHeadParams

__all__ = [
    "AttentionLinearization",
    "WeightNorms",
    "block_norm_bounds",
    "dense_jacobian",
    "head_structured_upper",
    "jvp",
    "linearize",
    "self_jacobian_blocks",
    "self_jvp",
    "self_norm_trace_bound",
    "self_vjp",
    "structured_block_norms",
    "vjp",
    "weight_norms",
]

Params = AttentionParams | MultiHeadParams
Geometry = Literal["euclidean", "wasserstein"]


@dataclass(frozen=True, eq=False)
class AttentionLinearization:
    r"""Everything the closed-form Jacobian needs at one input, built once by :func:`linearize`.

    Heads without a rotary embedding ("analytic" heads, :math:`H_a` of them) are stacked along a
    head axis; heads with one are handled by automatic differentiation.

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
        Indices of the heads handled in closed form and by autograd.
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
    _m: Tensor | None = field(default=None, repr=False)
    _B: Tensor | None = field(default=None, repr=False)
    _A: Tensor | None = field(default=None, repr=False)

    @property
    def A(self) -> Tensor:
        """Score matrices of the analytic heads, (H_a, d, d), in the dtype of ``X``."""
        if self._A is None:
            if self.analytic_heads:
                heads = self.params.heads
                A = torch.stack([heads[h].A for h in self.analytic_heads]).to(self.X.dtype)
            else:
                A = self.X.new_zeros(0, self.d, self.d)
            object.__setattr__(self, "_A", A)
        return self._A

    @property
    def m(self) -> Tensor:
        r"""Attention means :math:`m^h_i = \sum_lP^h_{il}x_l`, computed on first use.

        The products never need them (they use :math:`V_h(m^h_i-\bar x)` and
        :math:`K_h(m^h_i-\bar x)`, formed in head space by :func:`linearize`); the explicit
        blocks and the block-norm certificate do, at a cost :math:`O(H_an^2d)`.
        """
        if self._m is None:
            object.__setattr__(
                self, "_m", _attend(self.P, self.X.unsqueeze(-3), self._causal_block())
            )
        return self._m

    @property
    def B(self) -> Tensor:
        r"""Rows :math:`b^h_i = A_h^\top x_i + c_h`, computed on first use."""
        if self._B is None:
            B = _right_A(self.A, self.QK, self.X)
            if self.C is not None:
                B = B + self.C.unsqueeze(-2)
            object.__setattr__(self, "_B", B)
        return self._B

    def _causal_block(self) -> int | None:
        """Query-block size of the products with P when whole upper blocks are zero."""
        if not self.masked or self.positions is not None:
            return None
        return self.chunk_size if self.chunk_size is not None else _PRODUCT_BLOCK

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
def _head_output_matrices(params: Params) -> tuple[Tensor, bool]:
    """Stack the per-head output matrices W_h (H, d_out, d_v) and tell whether heads concatenate."""
    heads = params.heads
    H, d_v = len(heads), heads[0].d_v
    ref = heads[0].A
    if isinstance(params, MultiHeadParams) and params.W_O is not None:
        W = params.W_O.reshape(params.W_O.shape[0], H, d_v).permute(1, 0, 2)
        return W.contiguous(), False
    eye = torch.eye(H * d_v, dtype=ref.dtype, device=ref.device)
    return eye.reshape(H, d_v, H * d_v).permute(0, 2, 1).contiguous(), True


def _admissible(
    masked: bool, n: int, positions: Tensor | None, device: torch.device
) -> Tensor | None:
    return admissible_keys(masked, n, n, positions, None, device)


def _log_attention(logits: Tensor, allowed: Tensor | None) -> Tensor:
    """Row log-softmax with the empty-row policy of :func:`meanfield._numerics.masked_softmax`."""
    if allowed is not None:
        logits = logits.masked_fill(~allowed, -torch.inf)
    row_max = logits.amax(dim=-1)
    if not bool(torch.isfinite(row_max).all()):
        if bool(torch.isnan(row_max).any()):
            raise ValueError("attention logits contain NaN")
        if bool((row_max == torch.inf).any()):
            raise ValueError(
                "attention logits overflowed to +inf; inputs are too large for this dtype"
            )
        raise ValueError("an attention row has no admissible key (all keys masked or of zero mass)")
    return torch.log_softmax(logits, dim=-1)


#: Query-block size of the products when ``chunk_size=None``: blocks of this size keep the
#: (H, block, n) intermediates in cache and, for causal sequences, skip the zero upper part of P.
_PRODUCT_BLOCK = 64


def _attend(P: Tensor, F: Tensor, block: int | None) -> Tensor:
    """``P @ F`` (..., H, n, r) for ``P`` (..., H, n, n); causal ``block``: skip the zero blocks."""
    n = P.shape[-1]
    if block is None or block >= n:
        return P @ F
    parts = [P[..., sl, : sl.stop] @ F[..., : sl.stop, :] for sl in iter_chunks(n, block)]
    return torch.cat(parts, dim=-2)


def _right_A(
    A: Tensor, QK: tuple[Tensor, Tensor] | None, Y: Tensor, *, per_head: bool = False
) -> Tensor:
    """Rows ``y^T A_h`` for every head: ``Y`` (..., n, d), or (..., H, n, d) when ``per_head``."""
    lhs = "...hnd" if per_head else "...nd"
    if QK is None:
        return torch.einsum(f"{lhs},hde->...hne", Y, A)
    Q, K = QK
    return torch.einsum("...hnk,hke->...hne", torch.einsum(f"{lhs},hkd->...hnk", Y, Q), K)


def _head_rows(
    QK: tuple[Tensor, Tensor] | None, A: Tensor, V: Tensor, QKV: Tensor | None, Y: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Head-space rows ``(Q_h y, K_h y, V_h y)`` of ``Y`` (..., n, d), each (..., H_a, n, .).

    Without factors the identity stands for ``Q_h`` and ``A_h`` for ``K_h`` (the first output is
    then ``Y`` broadcast over the heads). With them, one product with the stacked ``QKV``.
    """
    if QKV is not None:
        H_a, k = QK[0].shape[0], QK[0].shape[1]
        Z = (Y @ QKV.mT).unflatten(-1, (H_a, -1)).movedim(-2, -3)  # (..., H_a, n, 2k + d_v)
        return Z[..., :k], Z[..., k : 2 * k], Z[..., 2 * k :]
    qY = Y.unsqueeze(-3).expand(Y.shape[:-2] + (A.shape[0],) + Y.shape[-2:])
    return qY, torch.einsum("...nd,hed->...hne", Y, A), torch.einsum("...nd,hvd->...hnv", Y, V)


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
        Positions of a position-tagged measure (THEORY.md §3.3).
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
    heads = params.heads
    d = heads[0].d
    X = as_float_tensor(X, "X")
    if X.ndim < 2 or X.shape[-1] != d:
        raise ValueError(f"X must have shape (..., n, {d}), got {tuple(X.shape)}")
    check_finite(X, "X")
    if X.dtype != params.dtype:
        raise ValueError(f"X has dtype {X.dtype} but the parameters have {params.dtype}")
    n = X.shape[-2]
    if log_weights is not None:
        log_weights = as_float_tensor(log_weights, "log_weights", like=X)
        if log_weights.shape[-1] != n:
            raise ValueError(
                f"log_weights must have shape (..., {n}), got {tuple(log_weights.shape)}"
            )
    if positions is not None:
        positions = as_float_tensor(positions, "positions", like=X)
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size}")
    analytic = tuple(h for h, head in enumerate(heads) if getattr(head, "rope", None) is None)
    rope = tuple(h for h, head in enumerate(heads) if getattr(head, "rope", None) is not None)
    allowed = _admissible(masked, n, positions, X.device)
    W, concat = _head_output_matrices(params)
    batch = X.shape[:-2]
    x_bar = X.mean(-2, keepdim=True)
    A = None  # stacked on first use (AttentionLinearization.A); only unfactored heads need it
    if analytic:
        V = torch.stack([heads[h].V for h in analytic])
        logP = torch.stack(
            [_log_attention(head_logits(X, X, heads[h], log_weights), allowed) for h in analytic],
            dim=-3,
        )
        P = logP.exp()
        QK = None
        if (
            all(heads[h].Q is not None for h in analytic)
            and len({tuple(heads[h].Q.shape) for h in analytic}) == 1
        ):
            QK = (
                torch.stack([heads[h].Q for h in analytic]),
                torch.stack([heads[h].K for h in analytic]),
            )
        cs = [heads[h].c for h in analytic]
        C = None
        if any(c is not None for c in cs):
            zero = X.new_zeros(d)
            C = torch.stack([zero if c is None else c for c in cs])
        # head-space features (factors Q_h, K_h of width k; A_h and the identity without them)
        Xc = X - x_bar
        QKV = None
        if QK is not None:
            QKV = torch.cat([QK[0], QK[1], V], dim=-2).reshape(-1, d)
        else:
            A = torch.stack([heads[h].A for h in analytic])
        _, KXc, VXc = _head_rows(QK, A, V, QKV, Xc)
        if QK is None:
            Qx = X.unsqueeze(-3).expand(batch + (len(analytic), n, d))
        else:
            Qx = torch.einsum("...nd,hkd->...hnk", X, QK[0])
        # K_h(m_i - x_bar) and V_h(m_i - x_bar) in head space: rows of P sum to one, so they are
        # P K_h(X - x_bar) and P V_h(X - x_bar); the means m_i themselves are formed lazily
        block = None if (not masked or positions is not None) else (chunk_size or _PRODUCT_BLOCK)
        KVMc = _attend(P, torch.cat([KXc, VXc], dim=-1), block)
        KMc, VMc = KVMc[..., : KXc.shape[-1]], KVMc[..., KXc.shape[-1] :]
        P_w = None
        if log_weights is not None and bool(torch.isfinite(log_weights).all()):
            half = 0.5 * log_weights.unsqueeze(-2)  # (..., 1, n)
            P_w = (logP + (half.mT - half).unsqueeze(-3)).exp()
    else:
        QK = C = QKV = Qx = KXc = KMc = VXc = VMc = None
        V = X.new_zeros(0, heads[0].d_v, d)
        P = X.new_zeros(batch + (0, n, n))
        P_w = None
        if log_weights is not None and bool(torch.isfinite(log_weights).all()):
            P_w = P
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
    )


# ----------------------------------------------------------------------------------- products
def _check_geometry(lin: AttentionLinearization, geometry: str) -> bool:
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


def _interaction(lin: AttentionLinearization, weighted: bool) -> Tensor:
    return lin.P_w if (weighted and lin.P_w is not None) else lin.P


def _rope_fn(lin: AttentionLinearization, h: int):
    head = lin.params.heads[h]
    W_h = lin.W[h]

    def fn(Y: Tensor) -> Tensor:
        out = attention_points(
            Y,
            head,
            log_weights=lin.log_weights,
            masked=lin.masked,
            positions=lin.positions,
            token_index=lin.token_index,
        )
        return out @ W_h.mT

    return fn


def _sqrt_weights(lin: AttentionLinearization) -> Tensor:
    lw = lin.log_weights
    return torch.exp(0.5 * (lw - lw.amax(-1, keepdim=True))).unsqueeze(-1)


def _check_shape(T: Tensor, lin: AttentionLinearization, last: int, name: str) -> Tensor:
    expected = lin.batch_shape + (lin.n, last)
    if T.shape != expected:
        raise ValueError(f"{name} must have shape {tuple(expected)}, got {tuple(T.shape)}")
    return T.to(lin.X.dtype)


def _combine(lin: AttentionLinearization, vals: Tensor, heads: tuple[int, ...]) -> Tensor:
    """Map per-head values (..., H_a, n, d_v) to outputs (..., n, d_out) with the W_h."""
    return torch.einsum("...hnv,hov->...no", vals, lin.W[list(heads)])


def _key_blocks(lin: AttentionLinearization) -> Iterator[tuple[slice, slice]]:
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
    block = lin._causal_block()
    if block is None:
        size = lin.chunk_size if lin.chunk_size is not None else _PRODUCT_BLOCK
        for sl in iter_chunks(lin.n, size):
            yield sl, slice(0, lin.n)
        return
    for sl in iter_chunks(lin.n, block):
        yield sl, slice(0, sl.stop)


def _output_rows(lin: AttentionLinearization, G: Tensor) -> Tensor:
    """Per-head rows ``W_h^T g_i`` for outputs ``G`` (..., n, d_out) -> (..., H_a, n, d_v)."""
    return torch.einsum("...no,hov->...hnv", G, lin.W[list(lin.analytic_heads)])


def _query_rows(lin: AttentionLinearization, Y: Tensor) -> Tensor:
    """Per-head rows ``Q_h y`` (``y`` itself, broadcast over the heads, without factors)."""
    if lin.QK is None:
        return Y.unsqueeze(-3).expand(Y.shape[:-2] + (len(lin.analytic_heads),) + Y.shape[-2:])
    return torch.einsum("...nd,hkd->...hnk", Y, lin.QK[0])


def _head_rows_adjoint(
    lin: AttentionLinearization, Yq: Tensor, Yk: Tensor | None = None, Yv: Tensor | None = None
) -> Tensor:
    r"""Rows :math:`\sum_h(Q_h^\top y^q_h + K_h^\top y^k_h + V_h^\top y^v_h)` -> (..., n, d).

    The adjoint of :func:`_head_rows` (``None`` terms are zero); without factors the identity
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
    weighted = _check_geometry(lin, geometry)
    H = _check_shape(H, lin, lin.d, "H")
    out = None
    if lin.analytic_heads:
        Pi_all = _interaction(lin, weighted)
        A = None if lin.QKV is not None else lin.A  # factored heads: the factors only
        qH, kH, vH = _head_rows(lin.QK, A, lin.V, lin.QKV, H)  # Q h_l, K h_l, V h_l
        cH = None if lin.C is None else (H @ lin.C.mT).mT.unsqueeze(-2)  # (..., H_a, 1, n)
        # Euclidean geometry (Pi = P): T = P o (S + R) with S + R one product of width 2k
        merged = Pi_all is lin.P
        if merged:
            left = torch.cat([lin.Qx, qH], dim=-1)
            right = torch.cat([kH, lin.KXc], dim=-1)
        parts = []
        for sl, ks in _key_blocks(lin):
            P = lin.P[..., sl, ks]
            Pi = Pi_all[..., sl, ks]
            if merged:
                S = left[..., sl, :] @ right[..., ks, :].mT  # S + R
            else:
                S = lin.Qx[..., sl, :] @ kH[..., ks, :].mT  # <b_i, h_l> = <Q x_i, K h_l>
            if cH is not None:
                S = S + cH[..., ks]  # + <c, h_l>
            if merged:
                T = P * S
            else:
                R = qH[..., sl, :] @ lin.KXc[..., ks, :].mT  # <A(x_l - x_bar), h_i>
                T = Pi * S + P * R
            vals = Pi @ vH[..., ks, :] + T @ lin.VXc[..., ks, :]  # V(Pi h + T (x - x_bar))
            parts.append(vals - T.sum(-1, keepdim=True) * lin.VMc[..., sl, :])
        vals = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-2)
        out = _combine(lin, vals, lin.analytic_heads)
    if lin.rope_heads:
        scale = _sqrt_weights(lin) if weighted else None
        Hs = H if scale is None else H / scale
        for h in lin.rope_heads:
            tangent = tfunc.jvp(_rope_fn(lin, h), (lin.X,), (Hs,))[1]
            tangent = tangent if scale is None else scale * tangent
            out = tangent if out is None else out + tangent
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
    weighted = _check_geometry(lin, geometry)
    G = _check_shape(G, lin, lin.d_out, "G")
    out = None
    if lin.analytic_heads:
        Pi_all = _interaction(lin, weighted)
        gv = _output_rows(lin, G)  # (..., H_a, n, d_v): W_h^T g_i
        acc_v = G.new_zeros(lin.VXc.shape)  # sum_i Pi_il W_h^T g_i
        acc_k = G.new_zeros(lin.Qx.shape)  # sum_i Pi_il Z_il Q x_i
        acc_c = None if lin.C is None else G.new_zeros(lin.VXc.shape[:-1])  # sum_i Pi_il Z_il
        rows = []
        for sl, ks in _key_blocks(lin):
            P = lin.P[..., sl, ks]
            Pi = Pi_all[..., sl, ks]
            g = gv[..., sl, :]
            Z = g @ lin.VXc[..., ks, :].mT  # <g~_i, x_l - m_i>
            Z = Z - (g * lin.VMc[..., sl, :]).sum(-1, keepdim=True)
            PiZ = Pi * Z
            acc_v[..., ks, :] += Pi.mT @ g
            acc_k[..., ks, :] += PiZ.mT @ lin.Qx[..., sl, :]
            if acc_c is not None:
                acc_c[..., ks] += PiZ.sum(-2)
            PZ = PiZ if Pi_all is lin.P else P * Z  # Euclidean geometry: Pi = P
            rows.append(PZ @ lin.KXc[..., ks, :])  # K sum_l P_il Z_il (x_l - x_bar)
        acc_q = rows[0] if len(rows) == 1 else torch.cat(rows, dim=-2)
        out = _head_rows_adjoint(lin, acc_q, acc_k, acc_v)
        if acc_c is not None:
            out = out + acc_c.mT @ lin.C
    if lin.rope_heads:
        scale = _sqrt_weights(lin) if weighted else None
        Gs = G if scale is None else G * scale
        for h in lin.rope_heads:
            _, pullback = tfunc.vjp(_rope_fn(lin, h), lin.X)
            cot = pullback(Gs)[0]
            cot = cot if scale is None else cot / scale
            out = cot if out is None else out + cot
    return out


def _require_analytic(lin: AttentionLinearization, what: str) -> None:
    if lin.rope_heads:
        raise NotImplementedError(
            f"{what} uses the closed form, which does not apply to heads with a rotary embedding"
        )


def self_jvp(lin: AttentionLinearization, U: Tensor) -> Tensor:
    r"""Per-atom self-Jacobian products :math:`u_i\mapsto S_iu_i`, all atoms at once.

    :math:`S_i = \sum_hW_hV_hC^h_iA_h^\top` is the self-Jacobian :math:`J_\mu(x_i)` of
    THEORY.md §4.2 (multi-head form of §5.3). With :math:`A = Q^\top K`,
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
    _require_analytic(lin, "self_jvp")
    U = _check_shape(U, lin, lin.d, "U")
    vals = _cov_apply(lin, _query_rows(lin, U), lin.KXc, lin.KMc, lin.VXc, lin.VMc)
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
    _require_analytic(lin, "self_vjp")
    G = _check_shape(G, lin, lin.d_out, "G")
    rows = _cov_apply(lin, _output_rows(lin, G), lin.VXc, lin.VMc, lin.KXc, lin.KMc)
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
    for sl, ks in _key_blocks(lin):
        w = Wv[..., sl, :]
        Z = w @ Fx[..., ks, :].mT - (w * Fm[..., sl, :]).sum(-1, keepdim=True)
        PZ = lin.P[..., sl, ks] * Z
        parts.append(PZ @ Gx[..., ks, :] - PZ.sum(-1, keepdim=True) * Gm[..., sl, :])
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-2)


# ------------------------------------------------------------------------------ explicit blocks
def _self_blocks(lin: AttentionLinearization, sl: slice) -> Tensor:
    """Explicit S_i (..., |sl|, d_out, d) for the atoms in ``sl``."""
    Xc = lin.X.unsqueeze(-3) - lin.x_bar.unsqueeze(-3)
    Mc = lin.m[..., sl, :] - lin.x_bar.unsqueeze(-3)
    Wa = lin.W[list(lin.analytic_heads)]
    O = Wa @ lin.V  # (H_a, d_out, d): W_h V_h
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

    These are the :math:`J_\mu(x_i) = VC_{x_i}A^\top` of THEORY.md §4.2 entering the split
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
    _require_analytic(lin, "self_jacobian_blocks")
    parts = [_self_blocks(lin, sl) for sl in iter_chunks(lin.n, chunk_size)]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-3)


def _dense_analytic(lin: AttentionLinearization, weighted: bool) -> Tensor:
    """Blocks (..., n, d_out, n, d) of the analytic heads."""
    Pi = _interaction(lin, weighted)
    Xh = lin.X.unsqueeze(-3)
    Wa = lin.W[list(lin.analytic_heads)]
    O = Wa @ lin.V  # (H_a, d_out, d)
    OX = Xh @ O.mT  # (..., H_a, n, d_out)   O x_j
    OM = lin.m @ O.mT  # (..., H_a, n, d_out)   O m_i
    Oa = OX.unsqueeze(-3) - OM.unsqueeze(-2)  # (..., H_a, i, j, d_out)  O (x_j - m_i)
    J = torch.einsum("...hij,hab->...iajb", Pi, O)
    J = J + torch.einsum("...hij,...hija,...hib->...iajb", Pi, Oa, lin.B)
    n = lin.n
    S = _self_blocks(lin, slice(0, n))  # (..., n, d_out, d)
    idx = torch.arange(n, device=J.device)
    # advanced indices separated by a slice put the atom axis first: (n, ..., d_out, d)
    J[..., idx, :, idx, :] += S.movedim(-3, 0)
    return J


def _dense_rope(lin: AttentionLinearization, h: int) -> Tensor:
    """Blocks (..., n, d_out, n, d) of a rotary head via torch.func.jacrev, sample by sample."""
    head = lin.params.heads[h]
    W_h = lin.W[h]
    batch = lin.batch_shape
    n, d = lin.n, lin.d

    def per_sample(t: Tensor | None) -> Tensor | None:
        return None if t is None else t.expand(batch + (n,)).reshape(-1, n)

    Xf = lin.X.reshape(-1, n, d)
    lw, pos = per_sample(lin.log_weights), per_sample(lin.positions)
    blocks = []
    for k in range(Xf.shape[0]):
        lw_k = None if lw is None else lw[k]
        pos_k = None if pos is None else pos[k]

        def fn(Y: Tensor, lw_k: Tensor | None = lw_k, pos_k: Tensor | None = pos_k) -> Tensor:
            out = attention_points(
                Y,
                head,
                log_weights=lw_k,
                masked=lin.masked,
                positions=pos_k,
                token_index=lin.token_index,
            )
            return out @ W_h.mT

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
    (``vec`` stacks tokens row-major, THEORY.md §1.1); in the Wasserstein geometry the blocks are
    :math:`\sqrt{a_i/a_j}J_{ij}`. Rotary heads use ``torch.func.jacrev``.

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
    return _dense_from_lin(lin, geometry)


def _dense_from_lin(lin: AttentionLinearization, geometry: str) -> Tensor:
    weighted = _check_geometry(lin, geometry)
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
    project, Xc: Tensor, Mc: Tensor, P: Tensor, M_norm: Tensor | None, *, dist: bool = True
) -> _Projected:
    """Statistics through a projector of :func:`_projectors`, or the identity when ``None``.

    ``Xc`` (..., n, d) and ``Mc`` (..., H, n, d) are centred float64 keys and means. With
    ``dist=False`` only the variances are formed (no (H, n, n) tensors).
    """
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

    THEORY.md §13.3 (*standard*; the analytic block bound is derived). For each head and
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
    relative margin for the closed form.

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
    mn = Mc.square().sum(-1, keepdim=True).sqrt()  # (..., H, n, 1)
    bn = (B.square().sum(-1, keepdim=True) * (1 + slack)).sqrt()
    t = torch.einsum("...hid,...jd->...hij", B, Xc) - (B * Mc).sum(-1, keepdim=True)
    t = t + slack * bn * (xn + mn)  # over-estimate <b_i, x_j - m_i>
    ident = _projected(None, Xc, Mc, P, None)
    sig = rank_one_sigma_max_from_stats(t, ident.dist2 * bn.square(), d)
    if d == 1:
        sig = sig + slack * (1 + bn * (xn + mn))
    proj = _projectors(lin)

    def off_bound(kind: str, M_norm: Tensor) -> Tensor:
        stats = _projected(proj[kind], Xc, Mc, P, M_norm)
        nM = M_norm.reshape(-1, 1, 1)
        return Pi * torch.minimum(nM * sig, nM + stats.dist2.sqrt() * bn)

    bV = off_bound("V", norms.V)
    bO = None if lin.concat else off_bound("O", norms.O)
    off = _combine_heads(bV, bO, norms, lin.concat)
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
    from ._spectral import collatz_wielandt_bound

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
