r"""The deterministic upper certificate of the streaming path (docs/certificates.md §5.4).

:func:`streaming_structured_upper` forms the per-head three-term bound of
:func:`~meanfield.jacobian.head_structured_upper` (docs/certificates.md §5.2) from a
:class:`~meanfield.jacobian.StreamingLinearization`, recomputing the attention one tile at a
time, so it holds no :math:`n\times n` matrix. Every statistic of :math:`P` it needs is a sum or a
maximum of nonnegative terms over one index; the recomputed tiles :math:`\hat P` are within a
relative :math:`\varepsilon` of the exact attention entry by entry (docs/rounding.md §11.1), so
each statistic is bounded for the *exact* :math:`P` by dividing by :math:`1-\varepsilon`, and
the weighted spreads are measured around the stored means, which only enlarges them (a weighted
spread is smallest around the weighted mean). Rotary heads are covered, as in §5.2.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._spectral import gamma_k
from .streaming import HeadGroup, StreamingLinearization
from .structured_bounds import HeadTerms, combine_head_terms

__all__ = ["CW_STEPS", "streaming_structured_upper"]

U64 = torch.finfo(torch.float64).eps / 2

#: Collatz–Wielandt steps for :math:`\|P^h\|_2` after the all-ones vector (two passes over the
#: tiles each).
CW_STEPS = 2


def _sq_dist(A: Tensor, B: Tensor) -> Tensor:
    r"""Upper bounds on :math:`\|a_i - b_l\|^2` for the computed rows ``A`` (..., p, k), ``B`` (..., q, k).

    :math:`\|a\|^2 - 2a^\top b + \|b\|^2` is computed within :math:`2\gamma_{k+2}(\|a\|^2 +
    \|b\|^2)` of the exact value; :math:`4(k + 4)u` times the same is added.
    """
    a2 = A.square().sum(-1)
    b2 = B.square().sum(-1)
    slack = 4 * (A.shape[-1] + 4) * U64
    D = A @ B.mT
    D.mul_(-2).add_((a2 * (1 + slack)).unsqueeze(-1)).add_((b2 * (1 + slack)).unsqueeze(-2))
    return D.clamp_min_(0)


def _row_spreads(lin: StreamingLinearization, g: HeadGroup) -> tuple[Tensor, Tensor]:
    r"""Per row, :math:`\sum_l\hat P_{il}\|v_l - \hat v^m_i\|^2` and the same for the keys.

    For a group with a capped head the keys are not centred (the gate breaks the invariance):
    the second moment :math:`\sum_l\hat P_{il}\|k_l\|^2` instead.
    """
    kap = g.vc.new_zeros(g.vc.shape[:-1])
    var_k = g.kc.new_zeros(g.kc.shape[:-1])
    raw = g.var is not None and g.var.cap is not None
    k2 = g.kc.square().sum(-1) * (1 + gamma_k(g.kc.shape[-1] + 2)) if raw else None
    for sl, ks in lin.tiles(g):
        P, _ = lin.tile_attention(g, sl, ks)
        kap[..., sl] += (P * _sq_dist(g.vm[..., sl, :], g.vc[..., ks, :])).sum(-1)
        if k2 is not None:
            var_k[..., sl] += (P @ k2[..., ks, None]).squeeze(-1)
        else:
            var_k[..., sl] += (P * _sq_dist(g.km[..., sl, :], g.kc[..., ks, :])).sum(-1)
    return kap, var_k


def _norm_factors(g: HeadGroup) -> tuple[Tensor | None, Tensor | None]:
    r"""Per head and row, bounds on the norms of the QK-norms' Jacobians (``None`` without).

    :math:`\|w\odot(\rho I - \tfrac{\rho^3}{k}uu^\top)\|_2\le\rho\max|w|`, since
    :math:`\rho^2\|u\|^2/k\le1`; the logit scale joins the queries' factor. (..., G, n).
    """
    var = g.var
    if var is None:
        return None, None
    out: list[Tensor | None] = []
    for norm, scale in ((var.q_norm, var.scale), (var.k_norm, None)):
        f = None
        if norm is not None:
            f = norm.rho.squeeze(-1) * norm.w.abs().amax(-1) * (1 + 8 * U64)
        if scale is not None:
            s = scale.abs().reshape(-1, 1)
            f = s.expand(g.q.shape[-3:-1]) if f is None else f * s
        out.append(f)
    return out[0], out[1]


def _row_pass(lin: StreamingLinearization, g: HeadGroup, x: Tensor) -> Tensor:
    r""":math:`\hat Px` for nonnegative ``x`` (..., G, n), tile by tile."""
    y = x.new_zeros(x.shape)
    for sl, ks in lin.tiles(g):
        P, _ = lin.tile_attention(g, sl, ks)
        y[..., sl] += (P @ x[..., ks, None]).squeeze(-1)
    return y


def _column_pass(
    lin: StreamingLinearization, g: HeadGroup, y: Tensor, w: Tensor | None = None
) -> tuple[Tensor, Tensor | None]:
    r""":math:`\hat P^\top y` and, with ``w``, :math:`\max_i w_i\hat P_{il}` (..., G, n)."""
    z = y.new_zeros(y.shape)
    top = None if w is None else y.new_zeros(y.shape)
    for sl, ks in lin.tiles(g):
        P, _ = lin.tile_attention(g, sl, ks)
        z[..., ks] += (P.mT @ y[..., sl, None]).squeeze(-1)
        if top is not None and w is not None:  # both or neither
            top[..., ks] = torch.maximum(top[..., ks], (P * w[..., sl, None]).amax(-2))
    return z, top


def streaming_structured_upper(
    lin: StreamingLinearization, eps: Tensor, *, cw_steps: int = CW_STEPS
) -> Tensor:
    r"""Deterministic upper bound on :math:`\|J\|_2` (Euclidean) from tiles, any heads.

    The bound of :func:`~meanfield.jacobian.head_structured_upper` (docs/certificates.md §5.2,
    §5.4) with its statistics of :math:`P^h` recomputed tile by tile, each bounded for the exact
    attention through the entrywise model :math:`\hat P_{il} = P_{il}(1 + \theta_{il})`,
    :math:`|\theta_{il}|\le\varepsilon` (docs/rounding.md §11.1):

    * :math:`\|P^h\|_2` by Collatz–Wielandt: the all-ones vector gives the largest column sum
      (the exact rows sum to one), then ``cw_steps`` steps :math:`x\leftarrow P^\top Px`;
    * the value and key spreads :math:`\sum_lP_{il}\|v_l - m_i\|^2` around the stored means
      (no smaller around the exact mean);
    * the column forms :math:`\sum_iP_{il}\kappa_i\|q_i\|^2` and :math:`\max_i\kappa_iP_{il}`.

    Each sum of nonnegative computed terms is divided by :math:`(1-\varepsilon)(1-\gamma)`.
    The bound holds for the Jacobian formula on the stored head rows with the exact attention;
    the caller adds the rounding of the rows (``Margins.upper``, docs/rounding.md §11.2). Cost
    :math:`3 + 2\,` ``cw_steps`` passes over the tiles (each about half a product) and memory
    :math:`O(Hn)` beside one tile.

    Parameters
    ----------
    lin : StreamingLinearization
        A float64 linearisation.
    eps : Tensor, float64, shape lin.batch_shape
        Entrywise relative error of the recomputed attention (``ErrorModel.eps_s`` of
        :func:`~meanfield._rounding.streaming_error_model`); ``inf`` gives ``inf``.
    cw_steps : int, default :data:`CW_STEPS`

    Returns
    -------
    Tensor, float64, shape lin.batch_shape
    """
    if lin.X.dtype != torch.float64:
        raise ValueError("streaming_structured_upper needs a float64 linearisation")
    n = lin.n
    eps = eps.to(torch.float64)
    ok = torch.isfinite(eps) & (eps < 0.5)
    eps = torch.where(ok, eps, 0.0)
    # a sum of nonnegative computed terms (tile sums, then the partial sums across tiles) is at
    # least (1 - gamma) times the exact sum of the computed terms; the entries of P^ are at least
    # (1 - eps) times the exact ones
    gam = gamma_k(n + lin.d + 8)
    infl = ((1 + 2 * U64) / ((1 - eps) * (1 - gam)))[..., None, None]  # (..., 1, 1)
    params = lin.params
    terms: list[HeadTerms] = []
    for g in lin.groups:
        kap, var_k = _row_spreads(lin, g)
        kap = kap * infl
        var_k = var_k * infl
        q = g.q
        q2 = q.square().sum(-1) * (1 + gamma_k(q.shape[-1] + 2))
        with_c = [params.heads[h].c is not None for h in g.heads]
        if any(with_c):  # the key-logit term: the query rows gain a coordinate 1 (§5.2)
            q = torch.cat([q, q.new_ones(q.shape[:-1] + (1,))], dim=-1)
            q2 = q2 + 1
        sq = torch.linalg.matrix_norm(q, ord=2) * (1 + 8 * n * U64)  # (..., G)
        # columns: P^T 1 (the all-ones step of Collatz-Wielandt), the trace and weight forms
        cols, top = _column_pass(lin, g, torch.ones_like(kap), kap)
        trace, _ = _column_pass(lin, g, kap * q2)
        assert top is not None
        cols, top, trace = cols * infl, top * infl, trace * infl
        weight = top * sq.square().unsqueeze(-1)
        fq, fk = _norm_factors(g)  # variant heads: the norms' Jacobians (and the scale), §5.4
        form = torch.minimum(trace, weight)
        if fk is not None:  # the key tangent of column l carries its own norm factor
            form = form * fk.square()
        lam = form.amax(-1) * (1 + 8 * n * U64)
        s2 = lam.sqrt() * (1 + 2 * U64)
        self_i = (kap * var_k).sqrt()
        if fq is not None:
            self_i = self_i * fq
        s3 = self_i.amax(-1) * (1 + 2 * U64)
        p2 = cols.amax(-1)  # ||P||^2 <= max_l (P^T P 1)_l = max_l (P^T 1)_l
        x = cols
        for _ in range(int(cw_steps)):
            x = x.clamp_min(x.amax(-1, keepdim=True) * 2.0**-200)
            y = _row_pass(lin, g, x) * infl
            z, _ = _column_pass(lin, g, y)
            ratio = (z * infl / x).amax(-1) * (1 + 2 * U64)
            p2 = torch.minimum(p2, ratio)
            x = z
        p_norm = p2.sqrt() * (1 + 2 * U64)
        for a, h in enumerate(g.heads):
            rope = None if g.ropes is None else g.ropes[a]
            if g.var is not None:
                rope = g.var.ropes[a]
            rho = 1.0 if rope is None else abs(float(rope.attention_scaling)) * (1 + 64 * U64)
            if rope is not None and rope.head_dim is not None:  # partial: the rest passes as is
                rho = max(rho, 1.0)
            c = params.heads[h].c
            terms.append(
                HeadTerms(
                    h=h, c=None if c is None else c.to(torch.float64), rho=rho,
                    Q=None if g.Q is None else g.Q[a], K=g.K[a], p_norm=p_norm[..., a],
                    s2=s2[..., a], s3=s3[..., a],
                )
            )  # fmt: skip
    bound = combine_head_terms(params, terms, lin.X.device)
    return torch.where(ok, bound, math.inf)
