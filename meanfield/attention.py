r"""Self-attention on sequences and mean-field attention on measures, in the log domain.

For one head with score matrix :math:`A`, value matrix :math:`V` (docs/theory.md §B1–§B2):

.. math::
    \Gamma_\mu(x) = \sum_j \mathrm{softmax}_j\big(x^\top A x_j + c^\top x_j + \log a_j\big)\,(Vx_j + b),
    \qquad F(\mu) = (\Gamma_\mu)_\#\mu,\qquad f(X)_i = \Gamma_{\mathrm m(X)}(x_i).

Masked (causal) attention restricts query :math:`i` to keys :math:`j\le i` on sequences and to keys
at positions :math:`t_j\le t_i` on position-tagged measures (docs/theory.md §B1–§B2). Logits are
formed as scores plus log-weights and normalised by ``logsumexp``; masked keys get ``-inf``.
Raw scores are never exponentiated, so inputs of radius 100 give finite outputs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ._numerics import causal_mask, iter_chunks, masked_softmax
from ._typing import Params
from ._validation import (
    check_aux,
    check_flag,
    check_index,
    check_measure,
    check_points,
    params_dtype_device,
)
from .measures import DiracMeasure
from .params import AttentionParams, L2AttentionParams, MultiHeadParams

__all__ = [
    "attention",
    "attention_map",
    "attention_points",
    "attention_weights",
    "l2_self_attention",
    "self_attention",
]


def _points_and_params(
    X: object, params: Params | L2AttentionParams, what: str, *, l2: bool = False
) -> tuple[Tensor, torch.dtype, torch.device]:
    """Check ``params`` and the points ``X`` by the input rule of docs/conventions.md §8."""
    allowed: tuple[type, ...] = (L2AttentionParams,) if l2 else (AttentionParams, MultiHeadParams)
    dtype, device = params_dtype_device(params, allowed, what)
    d = params.D if isinstance(params, L2AttentionParams) else params.d
    return check_points(X, "X", d, dtype, device), dtype, device


def _measure_kwargs(mu: DiracMeasure, params: Params, masked: bool, what: str) -> dict[str, Any]:
    """Check ``params`` and ``mu`` by docs/conventions.md §8, and ``masked`` against ``mu``.

    Masked mean-field attention needs a position-tagged measure. Returns the keyword arguments
    of :func:`attention_points` that ``mu`` and ``masked`` give.
    """
    dtype, device = params_dtype_device(params, (AttentionParams, MultiHeadParams), what)
    check_measure(mu, dtype, device, params.d, what)
    if check_flag(masked, "masked") and mu.positions is None:
        raise ValueError("masked mean-field attention needs a position-tagged (causal) measure")
    return {"log_weights": mu.log_weights, "masked": masked, "positions": mu.positions}


def head_logits(
    Xq: Tensor,
    Xk: Tensor,
    head: AttentionParams,
    log_weights: Tensor | None = None,
    *,
    query_index: Tensor | None = None,
    key_index: Tensor | None = None,
) -> Tensor:
    r"""Logits :math:`x_i^\top A x_j + c^\top x_j + \log a_j`, shape (..., n_q, n_k).

    Uses the factorisation :math:`A = Q^\top K` when the head carries one. A head with a rotary
    embedding rotates :math:`Qx_i` and :math:`Kx_j` at the integer token indices ``query_index``
    and ``key_index`` (default ``0, 1, ...``). A head with variants (QK-norm, head-space biases,
    soft-capping, ALiBi) follows the order of :class:`~meanfield.params.AttentionParams`; the
    sliding window is a mask (:func:`head_mask`), not a logit.
    """
    factors = head.factors
    if factors is not None:
        Q, K = factors
        q, k = Xq @ Q.mT, Xk @ K.mT
        if head.q_bias is not None:
            q = q + head.q_bias
        if head.k_bias is not None:
            k = k + head.k_bias
        if head.q_norm is not None:
            q = head.q_norm.apply(q)
        if head.k_norm is not None:
            k = head.k_norm.apply(k)
        if head.rope is not None:
            q = head.rope.apply(q, _default_index(query_index, Xq.shape[-2], Xq.device))
            k = head.rope.apply(k, _default_index(key_index, Xk.shape[-2], Xk.device))
        logits = q @ k.mT
        if head.logit_scale is not None:
            logits = logits * head.logit_scale
    else:
        logits = (Xq @ head.A) @ Xk.mT
    if head.c is not None:
        logits = logits + (Xk @ head.c).unsqueeze(-2)
    if head.softcap is not None:
        logits = torch.tanh(logits / head.softcap) * head.softcap
    if head.alibi_slope is not None:
        qi = _default_index(query_index, Xq.shape[-2], Xq.device).to(logits.dtype)
        ki = _default_index(key_index, Xk.shape[-2], Xk.device).to(logits.dtype)
        logits = logits + head.alibi_slope * (ki.unsqueeze(-2) - qi.unsqueeze(-1))
    if log_weights is not None:
        logits = logits + log_weights.unsqueeze(-2)
    return logits


def _default_index(index: Tensor | None, n: int, device: torch.device) -> Tensor:
    return torch.arange(n, device=device) if index is None else index


def head_mask(
    head: AttentionParams,
    allowed: Tensor | None,
    query_index: Tensor | None,
    key_index: Tensor | None,
    n_q: int,
    n_k: int,
    device: torch.device,
) -> Tensor | None:
    r"""``allowed`` intersected with the head's sliding window :math:`|\tau_i - \tau_j| < W`.

    Returns ``allowed`` itself for a head without a window (docs/theory.md §B6).
    """
    if head.window is None:
        return allowed
    qi = _default_index(query_index, n_q, device)
    ki = _default_index(key_index, n_k, device)
    win = (qi.unsqueeze(-1) - ki.unsqueeze(-2)).abs() < head.window
    return win if allowed is None else allowed & win


def needs_token_index(params: Params) -> bool:
    """Whether some head uses token indices (rotary embedding, sliding window or ALiBi)."""
    return any(
        h.rope is not None or h.window is not None or h.alibi_slope is not None
        for h in params.heads
    )


def admissible_keys(
    masked: bool,
    n_q: int,
    n_k: int,
    positions: Tensor | None,
    query_positions: Tensor | None,
    device: torch.device,
) -> Tensor | None:
    """Boolean admissibility mask (..., n_q, n_k), or ``None`` when unmasked.

    Sequences (no ``positions``): query ``i`` sees keys ``j <= i``. Position-tagged measures:
    key ``j`` is admissible when ``positions[j] <= query_positions[i]`` (docs/theory.md §B2).
    """
    if not check_flag(masked, "masked"):
        return None
    if positions is None:
        if query_positions is not None:
            raise ValueError("query_positions were given but the keys have no positions")
        if n_q != n_k:
            raise ValueError(
                "masked attention at arbitrary queries needs positions for keys and queries"
            )
        return torch.ones(n_q, n_k, dtype=torch.bool, device=device).tril()
    if query_positions is None:
        if n_q != n_k:
            raise ValueError("masked attention at arbitrary queries needs query_positions")
        query_positions = positions
    return causal_mask(query_positions, positions)


def attention_points(
    X: Tensor,
    params: Params,
    *,
    log_weights: Tensor | None = None,
    masked: bool = False,
    positions: Tensor | None = None,
    queries: Tensor | None = None,
    query_positions: Tensor | None = None,
    token_index: Tensor | None = None,
    query_token_index: Tensor | None = None,
    chunk_size: int | None = None,
) -> Tensor:
    r"""The differentiable kernel behind every attention map: plain tensors in, tensor out.

    Returns :math:`\Gamma_\mu(q)` for the atoms ``X`` with log-masses ``log_weights`` at the
    query points ``queries`` (default: the atoms themselves), for one head or a multi-head layer.

    Parameters
    ----------
    X : Tensor, shape (..., n, d)
        Keys (atoms).
    params : AttentionParams or MultiHeadParams
    log_weights : Tensor, shape (..., n), optional
        :math:`\log a_j`; uniform weights when omitted (they cancel in the softmax).
    masked : bool, default False
        Causal attention. Without ``positions`` query ``i`` sees keys ``j <= i`` (sequences);
        with ``positions`` it sees keys with ``positions[j] <= query_positions[i]``.
    positions : Tensor, shape (..., n), optional
        Positions of the keys (position-tagged measures).
    queries : Tensor, shape (..., m, d), optional
        Query points; default ``X``.
    query_positions : Tensor, shape (..., m), optional
        Positions of the queries; default ``positions``.
    token_index : Tensor, shape (..., n) or (n,), optional
        Integer token positions of the keys for rotary embeddings, sliding windows and ALiBi
        (default ``0, ..., n-1``; on measures too, docs/theory.md §B6).
    query_token_index : Tensor, shape (..., m) or (m,), optional
        Integer token positions of the queries (default ``token_index`` when the queries are the
        atoms).
    chunk_size : int, optional
        Process queries in blocks of this size, so at most ``chunk_size x n`` logits are held per
        head; the result equals the unchunked one.

    Returns
    -------
    Tensor, shape (..., m, d_out)
    """
    X, dtype, device = _points_and_params(X, params, "attention_points")
    n = X.shape[-2]
    Xq = X if queries is None else check_points(queries, "queries", params.d, dtype, device)
    m = Xq.shape[-2]
    log_weights = check_aux(log_weights, "log_weights", X, n, finite=False)
    positions = check_aux(positions, "positions", X, n)
    query_positions = check_aux(query_positions, "query_positions", Xq, m)
    token_index = check_index(token_index, "token_index", X, n)
    query_token_index = check_index(query_token_index, "query_token_index", Xq, m)
    Xk_vals = [X @ h.V.mT for h in params.heads]  # V x_j once per head, shape (..., n, d_v)
    allowed = admissible_keys(masked, m, n, positions, query_positions, X.device)
    if needs_token_index(params):
        token_index = _default_index(token_index, n, X.device)
        if query_token_index is None:
            if queries is not None:
                raise ValueError(
                    "rotary, windowed or ALiBi attention at arbitrary queries needs "
                    "query_token_index"
                )
            query_token_index = token_index

    def block(sl: slice) -> Tensor:
        q = Xq[..., sl, :]
        mask = None if allowed is None else allowed[..., sl, :]
        q_index = None if query_token_index is None else query_token_index[..., sl]
        outs = []
        for h, vals in zip(params.heads, Xk_vals):
            logits = head_logits(q, X, h, log_weights, query_index=q_index, key_index=token_index)
            P = masked_softmax(
                logits, head_mask(h, mask, q_index, token_index, q.shape[-2], n, X.device)
            )
            out = P @ vals
            outs.append(out if h.b is None else out + h.b)
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
        if isinstance(params, MultiHeadParams) and params.W_O is not None:
            out = out @ params.W_O.mT
            if params.b_O is not None:
                out = out + params.b_O
        return out

    parts = [block(sl) for sl in iter_chunks(m, chunk_size)]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-2)


def self_attention(
    X: Tensor, params: Params, *, masked: bool = False, chunk_size: int | None = None
) -> Tensor:
    r"""The sequence map :math:`f(X)` (or the causal :math:`f^m(X)`), docs/theory.md §B1.

    .. math:: f(X)_i = \sum_j P_{ij}Vx_j,\qquad
              P_{ij} = \frac{\exp(x_i^\top Ax_j)}{\sum_l\exp(x_i^\top Ax_l)}\quad(l\le i\text{ if masked}),

    with biases and the output projection of ``params`` when present.

    Parameters
    ----------
    X : Tensor, shape (..., n, d)
        Tokens, one per row; leading dimensions are a batch.
    params : AttentionParams or MultiHeadParams
    masked : bool, default False
        Causal mask: token ``i`` attends to tokens ``j <= i``.
    chunk_size : int, optional
        Query block size (see :func:`attention_points`).

    Returns
    -------
    Tensor, shape (..., n, d_out)
    """
    return attention_points(X, params, masked=masked, chunk_size=chunk_size)


def attention(
    mu: DiracMeasure, params: Params, *, masked: bool = False, chunk_size: int | None = None
) -> DiracMeasure:
    r"""The mean-field map :math:`F(\mu) = (\Gamma_\mu)_\#\mu` (docs/theory.md §B2).

    Output atoms keep their masses and positions. With ``masked=True`` the measure must be
    position-tagged, and the atom at position :math:`t` attends to the atoms at positions
    :math:`t' \le t` (masked mean-field attention :math:`F^m`).

    Parameters
    ----------
    mu : DiracMeasure
        Input measure, possibly batched.
    params : AttentionParams or MultiHeadParams
    masked : bool, default False
    chunk_size : int, optional
        Query block size (see :func:`attention_points`).

    Returns
    -------
    DiracMeasure
        :math:`F(\mu)`, with the same weights and positions as ``mu``.
    """
    kwargs = _measure_kwargs(mu, params, masked, "attention")
    Y = attention_points(mu.points, params, chunk_size=chunk_size, **kwargs)
    return DiracMeasure(Y, mu.weights, mu.positions)


def attention_map(
    mu: DiracMeasure,
    params: Params,
    queries: Tensor | None = None,
    *,
    masked: bool = False,
    query_positions: Tensor | None = None,
    chunk_size: int | None = None,
) -> Tensor:
    r"""The transport map :math:`\Gamma_\mu` evaluated at arbitrary query points.

    Parameters
    ----------
    mu : DiracMeasure
    params : AttentionParams or MultiHeadParams
    queries : Tensor, shape (..., m, d), optional
        Query points :math:`x`; default the atoms of ``mu``.
    masked : bool, default False
        Masked mean-field kernel :math:`\Gamma^m_\mu(t, x)`; needs ``mu.positions`` and, for
        arbitrary queries, ``query_positions``.
    query_positions : Tensor, shape (..., m), optional
    chunk_size : int, optional

    Returns
    -------
    Tensor, shape (..., m, d_out)
    """
    kwargs = _measure_kwargs(mu, params, masked, "attention_map")
    return attention_points(
        mu.points,
        params,
        queries=queries,
        query_positions=query_positions,
        chunk_size=chunk_size,
        **kwargs,
    )


def attention_weights(
    X: Tensor,
    params: Params,
    *,
    log_weights: Tensor | None = None,
    masked: bool = False,
    positions: Tensor | None = None,
    token_index: Tensor | None = None,
) -> Tensor:
    r"""Attention matrices :math:`P` (row-stochastic), one per head.

    Returns
    -------
    Tensor
        Shape (..., n, n) for an :class:`AttentionParams`, (..., H, n, n) for a
        :class:`MultiHeadParams`.
    """
    X, _, _ = _points_and_params(X, params, "attention_weights")
    n = X.shape[-2]
    log_weights = check_aux(log_weights, "log_weights", X, n, finite=False)
    positions = check_aux(positions, "positions", X, n)
    token_index = check_index(token_index, "token_index", X, n)
    allowed = admissible_keys(masked, n, n, positions, None, X.device)
    Ps = [
        masked_softmax(
            head_logits(X, X, h, log_weights, query_index=token_index, key_index=token_index),
            head_mask(h, allowed, token_index, token_index, n, n, X.device),
        )
        for h in params.heads
    ]
    return Ps[0] if isinstance(params, AttentionParams) else torch.stack(Ps, dim=-3)


def l2_self_attention(
    X: Tensor,
    params: L2AttentionParams,
    *,
    log_weights: Tensor | None = None,
    masked: bool = False,
) -> Tensor:
    r"""L2 multi-head self-attention of Kim et al. (2021), docs/theory.md §B4 (row convention).

    .. math::
        \text{logit}^h_{ij} = -\frac{\|(x_i-x_j)^\top W^{Q,h}\|^2}{\sqrt{D/H}} + \log a_j,\qquad
        F(X) = \big[P^1XA_1W^{V,1},\dots,P^HXA_HW^{V,H}\big]W^O .

    Parameters
    ----------
    X : Tensor, shape (..., n, D)
    params : L2AttentionParams
    log_weights : Tensor, shape (..., n), optional
        Log-masses of weighted atoms (uniform when omitted).
    masked : bool, default False
        Causal variant (not in Kim et al.; provided for comparison).

    Returns
    -------
    Tensor, shape (..., n, D_out)
    """
    X, _, _ = _points_and_params(X, params, "l2_self_attention", l2=True)
    log_weights = check_aux(log_weights, "log_weights", X, X.shape[-2], finite=False)
    s = params.scale()
    allowed = admissible_keys(masked, X.shape[-2], X.shape[-2], None, None, X.device)
    outs = []
    for h in range(params.n_heads):
        WQ = params.W_Q[h]  # (D, D/H)
        Z = X @ WQ  # (..., n, D/H)
        # ||z_i - z_j||^2 from differences (no cancellation; the diagonal is exactly 0).
        dist2 = (Z.unsqueeze(-2) - Z.unsqueeze(-3)).square().sum(-1)
        logits = -dist2 / s
        if log_weights is not None:
            logits = logits + log_weights.unsqueeze(-2)
        P = masked_softmax(logits, allowed)
        A_h = WQ @ WQ.mT / s  # (D, D)
        outs.append(P @ (X @ A_h) @ params.W_V[h])
    out = torch.cat(outs, dim=-1)
    return out if params.W_O is None else out @ params.W_O
