r"""Jacobian products of attention in memory linear in :math:`n` (flash-attention pattern).

:func:`linearize_streaming` keeps, per head, only the head rows of the closed form of
docs/derivations/jacobian_products.md §3a (queries :math:`q_i = Qx_i`, centred keys
:math:`K(x_l-\bar x)`, centred values :math:`V(x_l-\bar x)` and the attention means
:math:`V(m_i-\bar x)`) and each row's log-normaliser :math:`\lambda_i = \log\sum_l e^{\ell_{il}}`.
It never holds an :math:`n\times n` matrix: :func:`streaming_jvp` and :func:`streaming_vjp`
recompute the attention one (query block, key block) tile at a time,
:math:`P_{il} = \exp(\ell_{il} - \lambda_i)` from the rows, and accumulate the same sums as
:func:`meanfield.jacobian.jvp` / :func:`meanfield.jacobian.vjp`. Peak extra memory is
:math:`O(H b_qb_k + Hn(k + d_v))` instead of :math:`O(Hn^2)`; causal sequences skip the key
blocks above the diagonal. Derivation, memory accounting and what the rounding analysis needs:
docs/derivations/streaming_products.md.

Heads are processed in groups of one kind (factored of one width, given by :math:`A` only, or
rotary of one width), so a layer that mixes them keeps the head-space cost for each group.
Rotary heads use the rotated rows of docs/derivations/jacobian_products.md §3b.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Literal

import torch
from torch import Tensor

from .._numerics import check_row_max, iter_chunks
from .._typing import Params
from .._typing import ProductGeometry as Geometry
from .._validation import check_aux, check_index, check_points, params_dtype_device
from ..params import AttentionParams, MultiHeadParams, RotaryEmbedding
from .linearization import (
    check_rows,
    head_output_matrices,
    head_space_factors,
    require_factors,
    require_rope,
    rotate_rows,
)
from .streaming_variants import (
    VariantData,
    magnitude_rows,
    tile_gate,
    tile_scores,
    variant_rows,
    window_mask,
)

__all__ = [
    "HeadGroup",
    "StreamingLinearization",
    "abs_rotate",
    "default_block_sizes",
    "linearize_streaming",
    "streaming_jvp",
    "streaming_magnitude",
    "streaming_self_jvp",
    "streaming_self_vjp",
    "streaming_vjp",
]

#: Query-block size of the default tiling.
_QUERY_BLOCK = 128
#: Elements of one (batch x heads x b_q x b_k) tile temporary under the default tiling (a fixed
#: rule: 2**21 elements, 16 MiB in float64; a product holds about six such temporaries).
_TILE_ELEMENTS = 2**21
#: Key blocks of the default tiling are multiples of this size.
_KEY_ALIGN = 64

#: The kinds of head groups: rotary, factored (``Q``, ``K``) and given by ``A`` only.
_Kind = Literal["rope", "factored", "plain", "variant"]


def default_block_sizes(n: int, heads: int, batch: int = 1) -> tuple[int, int]:
    """The default tiling ``(b_q, b_k)`` for ``n`` tokens and ``heads x batch`` tiles.

    A fixed rule (never the memory free at the moment): queries in blocks of 128 and keys in the
    largest multiple of 64 (at least 64) such that one ``batch x heads x b_q x b_k`` tile has at
    most ``2**21`` elements.
    """
    b_q = min(n, _QUERY_BLOCK)
    b_k = _TILE_ELEMENTS // max(1, heads * batch * b_q)
    b_k = max(_KEY_ALIGN, b_k // _KEY_ALIGN * _KEY_ALIGN)
    return b_q, min(n, b_k)


@dataclass(frozen=True, eq=False)
class HeadGroup:
    r"""Rows of the heads of one kind, stacked along a head axis of size ``G``.

    ``Q`` is ``None`` for heads given only by :math:`A` (the identity stands for :math:`Q` and
    :math:`A` for :math:`K`, width :math:`k = d`); ``ropes`` is ``None`` for non-rotary heads.
    """

    heads: tuple[int, ...]
    Q: Tensor | None  # (G, k, d)
    K: Tensor  # (G, k, d)
    V: Tensor  # (G, d_v, d)
    C: Tensor | None  # (G, d): key-logit terms c_h
    W: Tensor  # (G, d_out, d_v)
    ropes: tuple[RotaryEmbedding, ...] | None
    q: Tensor  # (..., G, n, k): (rotated) queries
    kc: Tensor  # (..., G, n, k): (rotated) keys, centred over the tokens
    key_term: Tensor | None  # (..., G or 1, n): c_h^T x_l + log a_l
    vc: Tensor  # (..., G, n, d_v): V(x_l - x_bar)
    vm: Tensor  # (..., G, n, d_v): V(m_i - x_bar)
    km: Tensor  # (..., G, n, k): sum_l P_il kc_l, i.e. K(m_i - x_bar) for non-rotary heads
    lse: Tensor  # (..., G, n): log-normaliser of each row
    # the rows (q, kc) of the logits where they differ from the product rows (the magnitude
    # operator of streaming_magnitude keeps the attention and replaces the rows by bounds)
    logit_rows: tuple[Tensor, Tensor] | None = None
    # tangent rows of rotary heads by the entrywise bound abs_rotate instead of the rotation
    abs_rope: bool = False
    # heads with attention variants (QK-norm, biases, scale, cap, window, ALiBi, partial rotary;
    # streaming_variants.py): their rotations, norms, caps, ALiBi slopes and windows
    var: VariantData | None = None

    @property
    def size(self) -> int:
        """Number of heads in the group."""
        return len(self.heads)

    @property
    def logit_q(self) -> Tensor:
        """The (rotated) queries of the logits."""
        return self.q if self.logit_rows is None else self.logit_rows[0]

    @property
    def logit_kc(self) -> Tensor:
        """The (rotated) centred keys of the logits."""
        return self.kc if self.logit_rows is None else self.logit_rows[1]


@dataclass(frozen=True, eq=False)
class StreamingLinearization:
    r"""The linearisation of an attention layer without its attention matrices.

    Built by :func:`linearize_streaming`. Holds per head :math:`O(n(k + d_v))` numbers: the rows
    of :class:`HeadGroup` and the log-normalisers; the products recompute the attention tiles.

    Attributes
    ----------
    X : Tensor, shape (..., n, d)
    x_bar : Tensor, shape (..., 1, d)
        The centre the rows are formed around (the computed mean of the tokens).
    groups : tuple of HeadGroup
        Heads of one kind each (factored of one width, plain, rotary of one width).
    log_weights, positions, token_index : Tensor or None
    masked : bool
    block_size : tuple of int
        Query and key block sizes ``(b_q, b_k)`` of the tiles.
    d_out : int
    """

    X: Tensor
    x_bar: Tensor
    groups: tuple[HeadGroup, ...]
    params: Params
    log_weights: Tensor | None
    positions: Tensor | None
    token_index: Tensor | None
    masked: bool
    block_size: tuple[int, int]
    d_out: int

    @property
    def n(self) -> int:
        """Number of tokens."""
        return self.X.shape[-2]

    @property
    def d(self) -> int:
        """Input dimension."""
        return self.X.shape[-1]

    @property
    def batch_shape(self) -> torch.Size:
        """Leading (batch) dimensions of ``X``."""
        return self.X.shape[:-2]

    @property
    def weighted(self) -> bool:
        """Whether finite log-weights give a distinct Wasserstein operator."""
        lw = self.log_weights
        return lw is not None and bool(torch.isfinite(lw).all())

    @property
    def rope_heads(self) -> tuple[int, ...]:
        """Indices of the heads with a rotary embedding."""
        return tuple(sorted(h for g in self.groups if g.ropes is not None for h in g.heads))

    @property
    def key_blocks(self) -> int:
        """The largest number of key blocks a query block visits."""
        b_k = self.block_size[1]
        return -(-self.n // b_k) if self.n else 0

    def tile_logits(self, group: HeadGroup, sl: slice, ks: slice) -> Tensor:
        """The logits of one tile of ``group`` (:func:`_tile_logits`), ``-inf`` where masked."""
        return _tile_logits(self, group, sl, ks)

    def tile_attention(
        self, group: HeadGroup, sl: slice, ks: slice, half: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        r"""The tiles of :math:`P` and :math:`\tilde P` of ``group`` (``half`` = ½ log a)."""
        return _tile_attention(self, group, sl, ks, half)

    def scaled(self, e: int) -> StreamingLinearization:
        """The linearisation with every output map ``W_h`` times ``2**-e`` (exact): ``J -> 2**-e J``."""
        if e == 0:
            return self
        groups = tuple(
            replace(g, W=torch.ldexp(g.W, torch.tensor(-e, device=g.W.device))) for g in self.groups
        )
        return replace(self, groups=groups)

    def tiles(self, group: HeadGroup | None = None) -> Iterator[tuple[slice, slice]]:
        """The (query block, key block) tiles a pass over ``group`` computes, in order.

        Causal sequences (``masked`` without ``positions``) stop each query block at its last
        key: key blocks above the diagonal are skipped and the block that crosses it is cut at
        the query block's end. Otherwise every key block of every query block. A group whose
        heads all have a sliding window (token positions ``0, ..., n-1``) also skips the keys
        outside the largest window.
        """
        b_q, b_k = self.block_size
        causal = self.masked and self.positions is None
        window = None
        if group is not None and group.var is not None and self.token_index is None:
            window = group.var.max_window
        for sl in iter_chunks(self.n, b_q):
            end = sl.stop if causal else self.n
            start = 0
            if window is not None:
                start = max(0, sl.start - window + 1)
                if not self.masked:
                    end = min(self.n, sl.stop - 1 + window)
            for first in range(start, end, b_k):
                yield sl, slice(first, min(first + b_k, end))

    def tile_positions(self, sl: slice, ks: slice) -> tuple[Tensor, Tensor]:
        """Token positions (floats, shapes (..., 1, b_q) and (..., 1, b_k)) of a tile's rows."""
        idx = self.token_index
        if idx is None:
            idx = torch.arange(self.n, device=self.X.device)
        idx = idx.to(self.X.dtype).unsqueeze(-2)
        return idx[..., sl], idx[..., ks]

    def tile_scores(self, group: HeadGroup, sl: slice, ks: slice) -> tuple[Tensor, Tensor | None]:
        """The logits of a tile and, for capped heads, their values before the cap."""
        return _tile_logits_pre(self, group, sl, ks)

    def jvp(self, H: Tensor, *, geometry: Geometry = "euclidean") -> Tensor:
        """:func:`streaming_jvp` at this linearisation."""
        return streaming_jvp(self, H, geometry=geometry)

    def vjp(self, G: Tensor, *, geometry: Geometry = "euclidean") -> Tensor:
        """:func:`streaming_vjp` at this linearisation."""
        return streaming_vjp(self, G, geometry=geometry)

    def self_jvp(self, U: Tensor) -> Tensor:
        """:func:`streaming_self_jvp` at this linearisation."""
        return streaming_self_jvp(self, U)

    def self_vjp(self, G: Tensor) -> Tensor:
        """:func:`streaming_self_vjp` at this linearisation."""
        return streaming_self_vjp(self, G)


# ------------------------------------------------------------------------------ tile kernels
def _block_mask(lin: StreamingLinearization, sl: slice, ks: slice) -> Tensor | None:
    """Admissible keys of a tile, (..., 1, b_q, b_k) or (b_q, b_k); ``None`` if all are."""
    if not lin.masked:
        return None
    if lin.positions is None:
        if ks.stop - 1 <= sl.start:  # every key precedes every query of the block
            return None
        qi = torch.arange(sl.start, sl.stop, device=lin.X.device)
        ki = torch.arange(ks.start, ks.stop, device=lin.X.device)
        return ki.unsqueeze(0) <= qi.unsqueeze(1)
    pos = lin.positions
    return (pos[..., None, ks] <= pos[..., sl, None]).unsqueeze(-3)


def _tile_logits(lin: StreamingLinearization, g: HeadGroup, sl: slice, ks: slice) -> Tensor:
    r"""Logits :math:`\ell_{il}` of one tile, (..., G, b_q, b_k), ``-inf`` where masked.

    Up to a constant per row (which the stored log-normaliser absorbs):
    :math:`\langle q_i, k_l - \bar k\rangle + c^\top x_l + \log a_l`; for variant heads the cap
    and ALiBi apply to :math:`\langle q_i, k_l\rangle` first, and the window joins the mask.
    """
    return _tile_logits_pre(lin, g, sl, ks)[0]


def _tile_logits_pre(
    lin: StreamingLinearization, g: HeadGroup, sl: slice, ks: slice
) -> tuple[Tensor, Tensor | None]:
    """:func:`_tile_logits` and the scores before the cap (``None`` without a capped head)."""
    L = g.logit_q[..., sl, :] @ g.logit_kc[..., ks, :].mT
    pre = None
    win = None
    if g.var is not None:
        qi, ki = lin.tile_positions(sl, ks)
        L, pre = tile_scores(g.var, L, qi, ki)
        win = window_mask(g.var, qi, ki)
    if g.key_term is not None:
        L = L + g.key_term[..., None, ks]
    mask = _block_mask(lin, sl, ks)
    if win is not None:
        mask = win if mask is None else mask & win
    if mask is not None:
        L = L.masked_fill(~mask, -torch.inf)
    return L, pre


def _tile_attention(
    lin: StreamingLinearization, g: HeadGroup, sl: slice, ks: slice, half: Tensor | None
) -> tuple[Tensor, Tensor]:
    r"""The tile of :math:`P` and of :math:`\tilde P = \sqrt{a_i/a_l}P` (``half`` = ½ log a)."""
    P, Pi, _ = _tile_attention_gate(lin, g, sl, ks, half)
    return P, Pi


def _tile_attention_gate(
    lin: StreamingLinearization, g: HeadGroup, sl: slice, ks: slice, half: Tensor | None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """:func:`_tile_attention` and the gate of capped heads (``None`` without a cap)."""
    L, pre = _tile_logits_pre(lin, g, sl, ks)
    L = L - g.lse[..., sl, None]
    P = L.exp()
    gate = None if pre is None or g.var is None else tile_gate(g.var, pre)
    if half is None:
        return P, P, gate
    return P, (L + (half[..., sl, None] - half[..., None, ks])).exp(), gate


def _log_normalisers(lin: StreamingLinearization, g: HeadGroup) -> Tensor:
    """Row log-sum-exp of the logits, one pass over the tiles (online maximum and sum)."""
    shape = g.logit_q.shape[:-1]
    M = g.logit_q.new_full(shape, -torch.inf)
    S = g.logit_q.new_zeros(shape)
    for sl, ks in lin.tiles(g):
        L = _tile_logits(lin, g, sl, ks)
        m_old = M[..., sl]
        m_new = torch.maximum(m_old, L.amax(-1))  # NaN propagates
        safe = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
        S[..., sl] = S[..., sl] * (m_old - safe).exp() + (L - safe.unsqueeze(-1)).exp().sum(-1)
        M[..., sl] = m_new
    check_row_max(M)
    return M + S.log()


def _attention_means(lin: StreamingLinearization, g: HeadGroup) -> tuple[Tensor, Tensor]:
    r""":math:`\sum_lP_{il}V(x_l - \bar x)` and :math:`\sum_lP_{il}\kappa_l`, recomputing the tiles."""
    rows = torch.cat([g.vc, g.kc], dim=-1)
    out = torch.zeros_like(rows)
    for sl, ks in lin.tiles(g):
        P, _ = _tile_attention(lin, g, sl, ks, None)
        out[..., sl, :] += P @ rows[..., ks, :]
    d_v = g.vc.shape[-1]
    return out[..., :d_v], out[..., d_v:]


# ------------------------------------------------------------------------------ construction
def _group_key(head: AttentionParams) -> tuple[_Kind, int]:
    """The kind of a head and its width ``k`` (``d`` for heads given by ``A`` only)."""
    if head.variants:
        return ("variant", head_space_factors(head, head.d)[0].shape[0])
    if head.rope is not None:
        return ("rope", require_factors(head)[0].shape[0])
    if head.Q is not None:
        return ("factored", head.Q.shape[0])
    return ("plain", head.d)


def _tangent_rows(
    lin: StreamingLinearization, g: HeadGroup, Y: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Head rows ``(Q y_i, K y_l, V y_l)`` of tangents ``Y`` (..., n, d), rotated for rotary heads."""
    if g.var is not None and g.Q is not None:  # variant heads: norms, rotation, scale
        idx = _rope_index(lin.X, lin.token_index)
        qY = g.var.query_tangent(torch.einsum("...nd,gkd->...gnk", Y, g.Q), idx)
        kY = g.var.key_tangent(torch.einsum("...nd,gkd->...gnk", Y, g.K), idx)
        return qY, kY, torch.einsum("...nd,gvd->...gnv", Y, g.V)
    if g.Q is None:
        qY = Y.unsqueeze(-3).expand(Y.shape[:-2] + (g.size,) + Y.shape[-2:])
    else:
        qY = torch.einsum("...nd,gkd->...gnk", Y, g.Q)
    kY = torch.einsum("...nd,gkd->...gnk", Y, g.K)
    vY = torch.einsum("...nd,gvd->...gnv", Y, g.V)
    if g.ropes is not None and g.abs_rope:
        qY, kY = abs_rotate(g.ropes, qY), abs_rotate(g.ropes, kY)
    elif g.ropes is not None:
        idx = _rope_index(lin.X, lin.token_index)
        qY, kY = rotate_rows(g.ropes, qY, idx), rotate_rows(g.ropes, kY, idx)
    return qY, kY, vY


def abs_rotate(ropes: tuple[RotaryEmbedding, ...], Z: Tensor) -> Tensor:
    r"""Entrywise bound on the rotated rows of nonnegative ``Z`` (..., G, n, k), any positions.

    A rotated coordinate is :math:`\alpha(z_a\cos - z_b\sin)` or :math:`\alpha(z_a\cos +
    z_b\sin)` with :math:`b` the same coordinate of the other half, so its absolute value is at
    most :math:`|\alpha|(|z_a| + |z_b|)`: ``|alpha| (Z + swap(Z))``, with ``swap`` exchanging the
    halves. The map is linear, nonnegative and symmetric (its own transpose).
    """
    half = Z.shape[-1] // 2
    alpha = torch.tensor(
        [abs(float(r.attention_scaling)) for r in ropes], dtype=Z.dtype, device=Z.device
    )
    swap = torch.cat([Z[..., half:], Z[..., :half]], dim=-1)
    return (Z + swap) * alpha[:, None, None]


def _rope_index(X: Tensor, token_index: Tensor | None) -> Tensor:
    n = X.shape[-2]
    idx = torch.arange(n, device=X.device) if token_index is None else token_index.to(X.device)
    return idx.unsqueeze(-2) if idx.ndim > 1 else idx


def linearize_streaming(
    X: Tensor,
    params: Params,
    *,
    log_weights: Tensor | None = None,
    masked: bool = False,
    positions: Tensor | None = None,
    token_index: Tensor | None = None,
    block_size: int | tuple[int, int] | None = None,
) -> StreamingLinearization:
    r"""Head rows and row log-normalisers for the streaming Jacobian products at ``X``.

    The arguments are those of :func:`meanfield.jacobian.linearize` (``block_size`` in place of
    ``chunk_size``). Two passes over the tiles (log-normalisers, then attention means), each the
    cost of a forward pass; memory :math:`O(Hn(k + d_v))` plus one tile.

    Parameters
    ----------
    X : Tensor, shape (..., n, d)
    params : AttentionParams or MultiHeadParams
    log_weights : Tensor, shape (..., n), optional
    masked : bool, default False
    positions : Tensor, shape (..., n), optional
    token_index : Tensor, shape (..., n) or (n,), optional
        Integer token positions of the rotary heads (default ``0, ..., n-1``).
    block_size : int or (int, int), optional
        Query and key block sizes of the tiles (one int: both). Default
        :func:`default_block_sizes` (a fixed rule of ``n``, the heads and the batch).

    Returns
    -------
    StreamingLinearization
    """
    dtype, device = params_dtype_device(
        params, (AttentionParams, MultiHeadParams), "linearize_streaming"
    )
    heads = params.heads
    d = heads[0].d
    X = check_points(X, "X", d, dtype, device)
    n = X.shape[-2]
    log_weights = check_aux(log_weights, "log_weights", X, n, finite=False)
    positions = check_aux(positions, "positions", X, n)
    token_index = check_index(token_index, "token_index", X, n)
    masked = bool(masked)
    # weights or positions with a batch of their own: the rows carry the broadcast batch
    aux = [t.shape[:-1] for t in (log_weights, positions) if t is not None]
    batch_shape = torch.broadcast_shapes(X.shape[:-2], *aux)
    if batch_shape != X.shape[:-2]:
        X = X.expand(batch_shape + X.shape[-2:])
    kinds: dict[tuple[_Kind, int], list[int]] = {}
    for h, head in enumerate(heads):
        kinds.setdefault(_group_key(head), []).append(h)
    if block_size is None:
        batch = 1
        for s in X.shape[:-2]:
            batch *= s
        block = default_block_sizes(n, max(len(v) for v in kinds.values()), batch)
    else:
        sizes = (block_size, block_size) if isinstance(block_size, int) else tuple(block_size)
        if len(sizes) != 2 or any(int(b) != b or b < 1 for b in sizes):
            raise ValueError(f"block_size must be a positive int or a pair, got {block_size!r}")
        block = (int(sizes[0]), int(sizes[1]))
    W_all, _ = head_output_matrices(params)
    d_out = W_all.shape[-2]
    x_bar = X.mean(-2, keepdim=True)
    Xc = X - x_bar
    lin = StreamingLinearization(
        X=X, x_bar=x_bar, groups=(), params=params, log_weights=log_weights, positions=positions,
        token_index=token_index, masked=masked, block_size=block, d_out=d_out,
    )  # fmt: skip
    groups = []
    for (kind, _), idx in kinds.items():
        hs = [heads[h] for h in idx]
        V = torch.stack([h.V for h in hs])
        Q: Tensor | None = None
        if kind == "variant":  # streaming_variants.py (the head-space rows of §3c)
            Q, K, q, kc, var = variant_rows(X, hs, _rope_index(X, token_index))
            key_term = None if log_weights is None else log_weights.unsqueeze(-2)
            vc = torch.einsum("...nd,gvd->...gnv", Xc, V)
            g = HeadGroup(
                heads=tuple(idx), Q=Q, K=K, V=V, C=None, W=W_all[idx], ropes=None, q=q, kc=kc,
                key_term=key_term, vc=vc, vm=vc, km=kc, lse=q.new_zeros(q.shape[:-1]), var=var,
            )  # fmt: skip
            g = replace(g, lse=_log_normalisers(lin, g))
            vm, km = _attention_means(lin, g)
            groups.append(replace(g, vm=vm, km=km))
            continue
        if kind == "plain":
            K = torch.stack([h.A for h in hs])
            q = X.unsqueeze(-3).expand(X.shape[:-2] + (len(idx), n, d))
        else:
            factors = [require_factors(h) for h in hs]
            Q = torch.stack([Qh for Qh, _ in factors])
            K = torch.stack([Kh for _, Kh in factors])
            q = torch.einsum("...nd,gkd->...gnk", X, Q)
        ropes = tuple(require_rope(h) for h in hs) if kind == "rope" else None
        if ropes is None:
            kc = torch.einsum("...nd,gkd->...gnk", Xc, K)
        else:
            ridx = _rope_index(X, token_index)
            q = rotate_rows(ropes, q, ridx)
            k = rotate_rows(ropes, torch.einsum("...nd,gkd->...gnk", X, K), ridx)
            kc = k - k.mean(-2, keepdim=True)
        cs = [h.c for h in hs]
        C = None
        key_term = None
        if any(c is not None for c in cs):
            C = torch.stack([X.new_zeros(d) if c is None else c for c in cs])
            key_term = (X @ C.mT).mT  # (..., G, n)
        if log_weights is not None:
            lw = log_weights.unsqueeze(-2)
            key_term = lw if key_term is None else key_term + lw
        vc = torch.einsum("...nd,gvd->...gnv", Xc, V)
        g = HeadGroup(
            heads=tuple(idx), Q=Q, K=K, V=V, C=C, W=W_all[idx], ropes=ropes, q=q, kc=kc,
            key_term=key_term, vc=vc, vm=vc, km=kc, lse=q.new_zeros(q.shape[:-1]),
        )  # fmt: skip
        lse = _log_normalisers(lin, g)
        g = replace(g, lse=lse)
        vm, km = _attention_means(lin, g)
        g = replace(g, vm=vm, km=km)
        groups.append(g)
    object.__setattr__(lin, "groups", tuple(groups))
    return lin


def streaming_magnitude(lin: StreamingLinearization) -> StreamingLinearization:
    r"""The magnitude operator :math:`M` of the streaming products (docs/rounding.md §11).

    The same tiles and the same attention as ``lin`` (the logits still come from its rows), with
    every other factor of the products replaced by an entrywise bound on its absolute value:
    :math:`|W_h|`, :math:`|V_h|`, :math:`|Q_h|`, :math:`|K_h|` (:math:`|A_h|` for heads given by
    :math:`A`), :math:`|c_h|`; the rows :math:`|Q||x_i|`, :math:`|K||x_l-\bar x|`,
    :math:`|V||x_l-\bar x|`; the subtracted mean term :math:`V(m_i-\bar x)` replaced by
    :math:`-\sum_lP_{il}|V||x_l-\bar x|` (stored negated, so the product code adds it); rotary
    rows by :func:`abs_rotate`. :func:`streaming_jvp` and :func:`streaming_vjp` of the result
    are :math:`M|h|` and :math:`M^\top|g|`, nonnegative, every monomial of the computed
    products bounded by the matching monomial of :math:`M`.

    Parameters
    ----------
    lin : StreamingLinearization

    Returns
    -------
    StreamingLinearization
    """
    aX = lin.X.abs()
    aXc = (lin.X - lin.x_bar).abs()
    groups = []
    for g in lin.groups:
        if g.var is not None:  # variant heads: streaming_variants.magnitude_rows
            groups.append(_variant_magnitude(lin, g, aXc))
            continue
        if g.Q is None:  # the identity for Q and |A| for K
            aq = aX.unsqueeze(-3).expand(g.q.shape)
            Q = None
        else:
            Q = g.Q.abs()
            aq = torch.einsum("...nd,gkd->...gnk", aX, Q)
        K, V = g.K.abs(), g.V.abs()
        if g.ropes is None:
            akc = torch.einsum("...nd,gkd->...gnk", aXc, K)
        else:
            aq = abs_rotate(g.ropes, aq)
            ak = abs_rotate(g.ropes, torch.einsum("...nd,gkd->...gnk", aX, K))
            akc = ak + ak.mean(-2, keepdim=True)  # |k_l - mean k| <= |k_l| + mean |k|
        avc = torch.einsum("...nd,gvd->...gnv", aXc, V)
        base = replace(g, logit_rows=(g.logit_q, g.logit_kc))
        avm = torch.zeros_like(avc)
        for sl, ks in lin.tiles(g):
            P, _ = _tile_attention(lin, base, sl, ks, None)
            avm[..., sl, :] += P @ avc[..., ks, :]
        groups.append(
            replace(
                base,
                Q=Q,
                K=K,
                V=V,
                C=None if g.C is None else g.C.abs(),
                W=g.W.abs(),
                q=aq,
                kc=akc,
                vc=avc,
                vm=-avm,
                km=akc,
                abs_rope=g.ropes is not None,
            )  # fmt: skip
        )
    return replace(lin, groups=tuple(groups))


def _variant_magnitude(lin: StreamingLinearization, g: HeadGroup, aXc: Tensor) -> HeadGroup:
    """The magnitude group of a group of variant heads (docs/rounding.md §11.4)."""
    assert g.var is not None and g.Q is not None
    heads = [lin.params.heads[h] for h in g.heads]
    Q, K, V = g.Q.abs(), g.K.abs(), g.V.abs()
    centred = g.var.cap is None
    aq, akc, var = magnitude_rows(g.var, heads, lin.X, Q, K, centred)
    avc = torch.einsum("...nd,gvd->...gnv", aXc, V)
    base = replace(g, logit_rows=(g.logit_q, g.logit_kc))
    avm = torch.zeros_like(avc)
    for sl, ks in lin.tiles(g):
        P, _ = _tile_attention(lin, base, sl, ks, None)
        avm[..., sl, :] += P @ avc[..., ks, :]
    return replace(
        base, Q=Q, K=K, V=V, W=g.W.abs(), q=aq, kc=akc, vc=avc, vm=-avm, km=akc, var=var,
    )  # fmt: skip


# ---------------------------------------------------------------------------------- products
def _weights(lin: StreamingLinearization, geometry: str) -> Tensor | None:
    """½ log a (..., 1, n) when the Wasserstein scaling applies, else ``None``."""
    if geometry == "euclidean":
        return None
    if geometry != "wasserstein":
        raise ValueError(f"geometry must be 'euclidean' or 'wasserstein', got {geometry!r}")
    if lin.log_weights is None:
        return None
    if not lin.weighted:
        raise ValueError("the Wasserstein operator needs positive masses; drop zero-mass atoms")
    return 0.5 * (lin.log_weights - lin.log_weights.amax(-1, keepdim=True)).unsqueeze(-2)


def streaming_jvp(
    lin: StreamingLinearization, H: Tensor, *, geometry: Geometry = "euclidean"
) -> Tensor:
    r"""Jacobian-vector product :math:`JH`, recomputing the attention tile by tile.

    The same sums as :func:`meanfield.jacobian.jvp` (docs/derivations/jacobian_products.md
    §2–§3a): per head,
    :math:`(JH)_i = W\big(\sum_l\tilde P_{il}Vh_l + \sum_lT_{il}V(x_l-\bar x)
    - (\sum_lT_{il})V(m_i-\bar x)\big)` with :math:`T = \tilde P\circ S + P\circ R`, each sum
    over :math:`l` accumulated over the key blocks of a query block.

    Parameters
    ----------
    lin : StreamingLinearization
    H : Tensor, shape (..., n, d)
    geometry : {"euclidean", "wasserstein"}, default "euclidean"

    Returns
    -------
    Tensor, shape (..., n, d_out)
    """
    half = _weights(lin, geometry)
    H = check_rows(H, lin.X, lin.d, "H")
    out: Tensor | None = None
    for g in lin.groups:
        qH, kH, vH = _tangent_rows(lin, g, H)
        cH = None if g.C is None else (H @ g.C.mT).mT  # (..., G, n): <c, h_l>
        if half is None:  # T = P o (S + R), S + R one product of width 2k
            left = torch.cat([g.q, qH], dim=-1)
            right = torch.cat([kH, g.kc], dim=-1)
        vals = torch.zeros_like(g.vm)
        tsum = g.vm.new_zeros(g.vm.shape[:-1] + (1,))
        for sl, ks in lin.tiles(g):
            P, Pi, gate = _tile_attention_gate(lin, g, sl, ks, half)
            if half is None:
                S = left[..., sl, :] @ right[..., ks, :].mT
            else:
                S = g.q[..., sl, :] @ kH[..., ks, :].mT
            if cH is not None:
                S = S + cH[..., None, ks]
            if half is None:
                T = P * S if gate is None else P * gate * S
            elif gate is None:
                T = Pi * S + P * (qH[..., sl, :] @ g.kc[..., ks, :].mT)
            else:
                T = gate * (Pi * S + P * (qH[..., sl, :] @ g.kc[..., ks, :].mT))
            vals[..., sl, :] += Pi @ vH[..., ks, :] + T @ g.vc[..., ks, :]
            tsum[..., sl, :] += T.sum(-1, keepdim=True)
        vals = vals - tsum * g.vm
        part = torch.einsum("...gnv,gov->...no", vals, g.W)
        out = part if out is None else out + part
    return _nonempty(out)


def streaming_vjp(
    lin: StreamingLinearization, G: Tensor, *, geometry: Geometry = "euclidean"
) -> Tensor:
    r"""Vector-Jacobian product :math:`J^\top G`, recomputing the attention tile by tile.

    The same sums as :func:`meanfield.jacobian.vjp`: with :math:`\gamma_i = W^\top g_i` and
    :math:`Z_{il} = \langle\gamma_i, V(x_l-\bar x)\rangle - \langle\gamma_i, V(m_i-\bar x)\rangle`,
    the key-side sums :math:`\sum_i\tilde P_{il}\gamma_i`, :math:`\sum_i\tilde P_{il}Z_{il}q_i`,
    :math:`\sum_i\tilde P_{il}Z_{il}` and the query-side sum
    :math:`\sum_lP_{il}Z_{il}K(x_l-\bar x)` are accumulated tile by tile, then mapped back to
    :math:`\mathbb R^d` by :math:`V^\top`, :math:`K^\top`, :math:`c` and :math:`Q^\top` (rotated
    back first for rotary heads).

    Parameters
    ----------
    lin : StreamingLinearization
    G : Tensor, shape (..., n, d_out)
    geometry : {"euclidean", "wasserstein"}, default "euclidean"

    Returns
    -------
    Tensor, shape (..., n, d)
    """
    half = _weights(lin, geometry)
    G = check_rows(G, lin.X, lin.d_out, "G")
    out: Tensor | None = None
    for g in lin.groups:
        gv = torch.einsum("...no,gov->...gnv", G, g.W)
        gm = (gv * g.vm).sum(-1, keepdim=True)  # <gamma_i, V(m_i - x_bar)>
        acc_v = torch.zeros_like(g.vc)
        acc_k = torch.zeros_like(g.kc)
        acc_q = torch.zeros_like(g.kc)
        C = g.C
        acc_c = None if C is None else g.vc.new_zeros(g.vc.shape[:-1])
        for sl, ks in lin.tiles(g):
            P, Pi, gate = _tile_attention_gate(lin, g, sl, ks, half)
            gi = gv[..., sl, :]
            Z = gi @ g.vc[..., ks, :].mT - gm[..., sl, :]
            acc_v[..., ks, :] += Pi.mT @ gi
            if gate is not None:  # the cap's gate multiplies every logit tangent
                Z = Z * gate
            PiZ = Pi * Z
            acc_k[..., ks, :] += PiZ.mT @ g.q[..., sl, :]
            if acc_c is not None:
                acc_c[..., ks] += PiZ.sum(-2)
            PZ = PiZ if half is None else P * Z
            acc_q[..., sl, :] += PZ @ g.kc[..., ks, :]
        if g.var is not None:  # variant heads: scale, rotation and norms transposed
            idx = _rope_index(lin.X, lin.token_index)
            acc_q, acc_k = g.var.query_adjoint(acc_q, idx), g.var.key_adjoint(acc_k, idx)
        elif g.ropes is not None and g.abs_rope:  # abs_rotate is its own transpose
            acc_q, acc_k = abs_rotate(g.ropes, acc_q), abs_rotate(g.ropes, acc_k)
        elif g.ropes is not None:
            idx = _rope_index(lin.X, lin.token_index)
            acc_q = rotate_rows(g.ropes, acc_q, idx, adjoint=True)
            acc_k = rotate_rows(g.ropes, acc_k, idx, adjoint=True)
        if g.Q is None:
            part = acc_q.sum(-3)
        else:
            part = torch.einsum("...gnk,gkd->...nd", acc_q, g.Q)
        part = part + torch.einsum("...gnk,gkd->...nd", acc_k, g.K)
        part = part + torch.einsum("...gnv,gvd->...nd", acc_v, g.V)
        if acc_c is not None and C is not None:  # both or neither
            part = part + acc_c.mT @ C
        out = part if out is None else out + part
    return _nonempty(out)


def _nonempty(out: Tensor | None) -> Tensor:
    """The sum over the head groups (a one-line error for a layer without heads)."""
    if out is None:
        raise ValueError("the streaming linearization has no head groups")
    return out


def _require_no_rotary(lin: StreamingLinearization, what: str) -> None:
    if any(g.var is not None for g in lin.groups):
        raise NotImplementedError(
            f"{what} uses the closed form of plain heads, which does not model attention variants"
        )
    if any(g.ropes is not None for g in lin.groups):
        raise NotImplementedError(
            f"{what} uses the closed form, which does not apply to heads with a rotary embedding"
        )


def _cov_apply(
    lin: StreamingLinearization, g: HeadGroup, w: Tensor, Fx: Tensor, Fm: Tensor, Gx: Tensor,
    Gm: Tensor,
) -> Tensor:  # fmt: skip
    r"""Rows :math:`\sum_lP_{il}\langle w_i, F_l - F^m_i\rangle(G_l - G^m_i)`, tile by tile."""
    acc = torch.zeros_like(Gm)
    tsum = Gm.new_zeros(Gm.shape[:-1] + (1,))
    wm = (w * Fm).sum(-1, keepdim=True)
    for sl, ks in lin.tiles(g):
        P, _ = _tile_attention(lin, g, sl, ks, None)
        PZ = P * (w[..., sl, :] @ Fx[..., ks, :].mT - wm[..., sl, :])
        acc[..., sl, :] += PZ @ Gx[..., ks, :]
        tsum[..., sl, :] += PZ.sum(-1, keepdim=True)
    return acc - tsum * Gm


def streaming_self_jvp(lin: StreamingLinearization, U: Tensor) -> Tensor:
    r"""Per-atom self-Jacobian products :math:`u_i\mapsto S_iu_i`, recomputing the tiles.

    As :func:`meanfield.jacobian.self_jvp` (the split geometry's self-map).

    :math:`V_hC^h_iA_h^\top u_i = \sum_lP_{il}\langle K(x_l - m_i), Qu_i\rangle V(x_l - m_i)`;
    rotary heads are refused, as in the stored path.

    Parameters
    ----------
    lin : StreamingLinearization
    U : Tensor, shape (..., n, d)

    Returns
    -------
    Tensor, shape (..., n, d_out)
    """
    _require_no_rotary(lin, "streaming_self_jvp")
    U = check_rows(U, lin.X, lin.d, "U")
    out: Tensor | None = None
    for g in lin.groups:
        qU = _tangent_rows(lin, g, U)[0]
        vals = _cov_apply(lin, g, qU, g.kc, g.km, g.vc, g.vm)
        part = torch.einsum("...gnv,gov->...no", vals, g.W)
        out = part if out is None else out + part
    return _nonempty(out)


def streaming_self_vjp(lin: StreamingLinearization, G: Tensor) -> Tensor:
    r"""Per-atom adjoint products :math:`g_i\mapsto S_i^\top g_i`, recomputing the tiles.

    As :func:`meanfield.jacobian.self_vjp`.

    Parameters
    ----------
    lin : StreamingLinearization
    G : Tensor, shape (..., n, d_out)

    Returns
    -------
    Tensor, shape (..., n, d)
    """
    _require_no_rotary(lin, "streaming_self_vjp")
    G = check_rows(G, lin.X, lin.d_out, "G")
    out: Tensor | None = None
    for g in lin.groups:
        gv = torch.einsum("...no,gov->...gnv", G, g.W)
        rows = _cov_apply(lin, g, gv, g.vc, g.vm, g.kc, g.km)
        if g.Q is None:
            part = rows.sum(-3)
        else:
            part = torch.einsum("...gnk,gkd->...nd", rows, g.Q)
        out = part if out is None else out + part
    return _nonempty(out)
