r"""Lower bounds on the Lipschitz constants of L2 multi-head attention (Kim et al., 2021).

The global Lipschitz constant of :math:`F=` :func:`meanfield.attention.l2_self_attention` in a norm
:math:`\|\cdot\|_p` on the flattened input :math:`\mathbb R^{N\times D}` is the supremum over inputs
of the induced norm of the Jacobian, so the local norm at *any* input is a valid lower bound and a
search over inputs tightens it (docs/theory.md §8a):

* :math:`p=\infty`: :math:`\|DF(X)\|_\infty` is the largest absolute row sum of the
  :math:`(ND_{\rm out})\times(ND)` Jacobian, i.e. the largest :math:`\ell^1` norm of the gradient
  of one output coordinate :math:`F_{ib}` (:func:`l2_jacobian_inf_norm`, by vector–Jacobian
  products, never building the Jacobian);
* :math:`p=2`: the spectral norm (:func:`l2_jacobian_spectral_norm`, matrix-free above 1500
  input entries).

:func:`l2_construction` is the closed-form starting point: the query at the origin and the other
tokens at :math:`\pm c\,u` (``layout="symmetric"``, the weighted mean of the keys stays at the
query) or all at :math:`c\,u` (``layout="common"``). For one head of width one it gives
:math:`\|DF\|_\infty = |W^QW^QW^VW^O|\,(1 + 4W_0((N - 1)e^{-3/2}))` for odd :math:`N`, which grows
like :math:`4(\log N-\log\log N)` as Kim et al.'s upper bound does (docs/theory.md §8a).
:func:`l2_lipschitz_lower` improves it by a multi-start gradient ascent of the local norm.

Every computation runs in float64; returned points follow the dtype and device of the weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from ..attention import l2_self_attention
from ..params import L2AttentionParams
from ._common import SearchOptions, ascend_restarts, resolve_options

__all__ = [
    "L2Construction",
    "L2LowerBound",
    "l2_construction",
    "l2_construction_value",
    "l2_jacobian_inf_norm",
    "l2_jacobian_spectral_norm",
    "l2_lipschitz_lower",
]

Layout = Literal["symmetric", "common"]
PNorm = Literal[2, "inf"]

#: Number of points of the grid on :math:`\log c` searched by :func:`l2_construction`.
_C_GRID = 384
#: Input entries up to which :func:`l2_jacobian_spectral_norm` builds the Jacobian ...
_DENSE_MAX = 1500
#: ... provided entries x N^2 x head width stays below this (the memory of the vectorised jacrev).
_DENSE_WORK = 2e7


def _check_p(p: object) -> PNorm:
    if p == "inf" or p == math.inf:
        return "inf"
    if p == 2:
        return 2
    raise ValueError(f"p must be 2 or 'inf', got {p!r}")


def params_float64(params: L2AttentionParams) -> L2AttentionParams:
    if not isinstance(params, L2AttentionParams):
        raise TypeError(f"params must be L2AttentionParams, got {type(params).__name__}")
    W_O = None if params.W_O is None else params.W_O.detach().to(torch.float64)
    return L2AttentionParams(
        params.W_Q.detach().to(torch.float64), params.W_V.detach().to(torch.float64), W_O
    )


def _head_maps(params: L2AttentionParams) -> tuple[Tensor, Tensor]:
    r"""Per head :math:`A_h` (H, D, D) and :math:`B_h = W^{V,h}W^O_h` (H, D, D_out), float64."""
    p = params_float64(params)
    H, D, k = p.W_Q.shape
    A = p.W_Q @ p.W_Q.mT / math.sqrt(k)
    dv = p.W_V.shape[2]
    WO = torch.eye(H * dv, dtype=torch.float64, device=p.W_Q.device) if p.W_O is None else p.W_O
    B = p.W_V @ WO.reshape(H, dv, -1)
    return A, B


def _check_points(X: Tensor, params: L2AttentionParams) -> Tensor:
    if not isinstance(X, Tensor) or X.ndim != 2 or X.shape[1] != params.D or X.shape[0] < 1:
        shape = tuple(X.shape) if isinstance(X, Tensor) else type(X).__name__
        raise ValueError(f"X must be a tensor of shape (N, {params.D}), got {shape}")
    return X.detach().to(torch.float64)


# =============================================================================================
# local norms
# =============================================================================================
def _row_grads(X64: Tensor, p64: L2AttentionParams, coords: Tensor) -> Tensor:
    """Gradients of the output coordinates ``coords`` (K, 2: row i, column b), shape (K, N, D)."""
    Xg = X64.clone().requires_grad_(True)
    F = l2_self_attention(Xg, p64)
    out = []
    N, k = X64.shape[0], p64.W_Q.shape[2]
    for chunk in coords.split(max(1, min(256, int(_DENSE_WORK // (N * N * k))))):
        G = torch.zeros(chunk.shape[0], *F.shape, dtype=F.dtype, device=F.device)
        G[torch.arange(chunk.shape[0]), chunk[:, 0], chunk[:, 1]] = 1.0
        (g,) = torch.autograd.grad(F, Xg, G, retain_graph=True, is_grads_batched=True)
        out.append(g)
    return torch.cat(out)


def l2_jacobian_inf_norm(
    X: Tensor, params: L2AttentionParams, *, rows: list[int] | None = None
) -> tuple[float, tuple[int, int]]:
    r""":math:`\|DF(X)\|_\infty`, the largest absolute row sum of the flattened Jacobian.

    Parameters
    ----------
    X : Tensor, shape (N, D)
    params : L2AttentionParams
    rows : list of int, optional
        Only the output tokens ``rows`` (all by default). Any subset gives a lower bound on the
        full norm; by permutation equivariance the row of a token in a symmetric construction is
        that of any token in the same position.

    Returns
    -------
    (float, (int, int))
        The norm and the output coordinate :math:`(i, b)` attaining it.

    Notes
    -----
    One vector–Jacobian product per output coordinate (batched), :math:`O(ND_{\rm out})` of them
    for all rows; the Jacobian itself is never stored.
    """
    p64 = params_float64(params)
    X64 = _check_points(X, p64)
    N = X64.shape[0]
    d_out = int(l2_self_attention(X64[:1], p64).shape[-1])
    idx = torch.arange(N) if rows is None else torch.as_tensor(rows, dtype=torch.long)
    coords = torch.cartesian_prod(idx, torch.arange(d_out)).reshape(-1, 2)
    sums = _row_grads(X64, p64, coords).abs().sum((-1, -2))
    k = int(sums.argmax())
    return float(sums[k]), (int(coords[k, 0]), int(coords[k, 1]))


def l2_jacobian_spectral_norm(X: Tensor, params: L2AttentionParams, *, tol: float = 1e-9) -> float:
    r"""A lower bound on :math:`\|DF(X)\|_2` that is exact up to ``tol`` (relative).

    Dense SVD of the Jacobian up to 1500 input entries (and :math:`ND\cdot N^2k\le2\cdot10^7`,
    the memory of the vectorised ``jacrev``), Lanczos on Jacobian–vector products
    (:func:`meanfield.lipschitz.local_lipschitz_fn`) above. Either way the value is the norm
    :math:`\|DF(X)v\|` of an explicit unit vector (dense) or a Ritz value (Lanczos), never above the
    true norm in exact arithmetic, so it is a valid lower bound on the Lipschitz constant.
    """
    from ..lipschitz import local_lipschitz_fn

    p64 = params_float64(params)
    X64 = _check_points(X, p64)
    N, k = X64.shape[0], p64.W_Q.shape[2]
    # jacrev vectorises one pullback per input entry over (N, N, k) intermediates
    dense = X64.numel() <= _DENSE_MAX and X64.numel() * N * N * k <= _DENSE_WORK
    est = local_lipschitz_fn(
        lambda Y: l2_self_attention(Y, p64),
        X64,
        method="dense" if dense else "lanczos",
        tol=tol,
        upper="none",
        delta=None,
    )
    return float(est.lower)


# =============================================================================================
# the closed-form construction
# =============================================================================================
@dataclass(frozen=True)
class L2Construction:
    r"""The construction of :func:`l2_construction`.

    Attributes
    ----------
    X : Tensor, shape (N, D)
        Token 0 (the query) and ``n_zero - 1`` copies at the origin; the others at
        :math:`\pm c\,u` (``"symmetric"``, half on each side) or at :math:`c\,u` (``"common"``),
        then ``n_parked`` far out.
    value : float
        :math:`\ell^1` norm of the gradient of :math:`F_{0b}`, from the closed form
        (:func:`l2_construction_value`); a lower bound on :math:`\|DF(X)\|_\infty`.
    layout : str
    c : float
    u : Tensor, shape (D,)
    b : int
        Output coordinate of the row.
    n_zero : int
        Tokens at the origin, the query included.
    n_parked : int
        Tokens parked far out along :math:`u` (symmetric layout with an even ``N``: cost at
        least 800 in every head, so their attention weight for the query is exactly 0 in float64).
    costs : Tensor, shape (H,)
        :math:`t_h = c^2u^\top A_hu`, the cost of a far token for the query in head :math:`h`.
    """

    X: Tensor
    value: float
    layout: str
    c: float
    u: Tensor
    b: int
    n_zero: int
    n_parked: int
    costs: Tensor


#: Cost :math:`t` of the parked token (symmetric layout, even N): e^-800 underflows to 0 in
#: float64, so the parked token carries no attention of the query and drops out of its row.
_PARK_COST = 800.0


def _split(N: int, layout: Layout, lam: Tensor) -> tuple[int, int, int]:
    r"""(tokens at the origin, tokens at +-cu or cu, parked tokens) for ``layout``.

    The symmetric layout needs an even number of tokens away from the origin. With an odd
    number, one token is parked far out along ``u`` (cost >= 800 in every head) when every head
    sees ``u`` (``lam`` = the :math:`u^\top A_hu`, all positive); otherwise it joins the origin.
    """
    if layout == "common" or (N - 1) % 2 == 0:
        return 1, N - 1, 0
    if bool((lam > 1e-12 * lam.abs().max()).all()):
        return 1, N - 2, 1
    return 2, N - 2, 0


def l2_construction_value(
    params: L2AttentionParams,
    N: int,
    c: Tensor | float,
    u: Tensor,
    b: int,
    *,
    layout: Layout = "symmetric",
) -> Tensor:
    r"""Closed-form :math:`\ell^1` norm of the gradient of :math:`F_{0b}` at the construction.

    With :math:`n_0` tokens at the origin (the query among them), :math:`n_1` at
    :math:`\pm cu` or :math:`cu` (:math:`n_0 + n_1 = N`, or :math:`N - 1` when a token is
    parked, which then has no weight in the query's row), per head :math:`t_h = c^2u^\top A_hu`, the zero-cost mass
    :math:`q_h = n_0/(n_0 + n_1e^{-t_h})`, :math:`\alpha_h = A_hB_he_b` and :math:`\kappa_h = 1`
    (symmetric) or :math:`q_h` (common):

    .. math::
        \Big\|\sum_h \tfrac{q_h}{n_0}\alpha_h + 2\kappa_hc^2(1-q_h)(\alpha_h\!\cdot u)A_hu\Big\|_1
        + (n_0 - 1)\Big\|\sum_h\tfrac{q_h}{n_0}\alpha_h\Big\|_1
        + \Big\|\sum_h(1-q_h)\big(\alpha_h - 2\kappa_hc^2(\alpha_h\!\cdot u)A_hu\big)\Big\|_1

    (docs/theory.md §8a). ``c`` may be a tensor of scales (the result has its shape).
    """
    A, B = _head_maps(params)
    u = u.detach().to(torch.float64)
    u = u / torch.linalg.vector_norm(u)
    n0, n1, _ = _split(int(N), layout, A @ u @ u)
    c_shape = torch.as_tensor(c).shape
    c = torch.as_tensor(c, dtype=torch.float64).reshape(-1, 1, 1)  # (C, 1, 1)
    Au = A @ u  # (H, D)
    lam = Au @ u  # (H,)
    alpha = (A @ B[:, :, b : b + 1]).squeeze(-1)  # (H, D)
    t = c.squeeze(-1) ** 2 * lam  # (C, H)
    # n0 / (n0 + n1 e^-t)
    q = torch.sigmoid(t + math.log(n0 / n1)) if n1 else torch.ones_like(t)
    kappa = torch.ones_like(q) if layout == "symmetric" else q
    au = alpha @ u  # (H,)
    coef = 2 * kappa * c.squeeze(-1) ** 2 * au  # (C, H)
    corr = coef.unsqueeze(-1) * Au  # (C, H, D)
    qa = (q / n0).unsqueeze(-1) * alpha  # (C, H, D)
    own = (qa + (1 - q).unsqueeze(-1) * corr).sum(1).abs().sum(-1)
    zeros = (n0 - 1) * qa.sum(1).abs().sum(-1)
    far = ((1 - q).unsqueeze(-1) * (alpha - corr)).sum(1).abs().sum(-1)
    return (own + zeros + far).reshape(c_shape)


def l2_construction(
    params: L2AttentionParams, N: int, *, layout: Layout = "symmetric"
) -> L2Construction:
    r"""Best closed-form construction of the given ``layout`` for :math:`\|DF\|_\infty`.

    The direction :math:`u` runs over the eigenvectors of every :math:`A_h` and the coordinate
    axes, the output coordinate :math:`b` over all of them, and the scale :math:`c` over a
    logarithmic grid (:math:`t = c^2\max_hu^\top A_hu` from :math:`10^{-3}` to
    :math:`4(\log N + 5)`) refined by a finer grid around the best point. For ``N = 2`` the
    symmetric layout has no token away from the origin; use ``"common"``.

    Parameters
    ----------
    params : L2AttentionParams
    N : int
        Number of tokens, :math:`N\ge2`.
    layout : {"symmetric", "common"}

    Returns
    -------
    L2Construction
    """
    if layout not in ("symmetric", "common"):
        raise ValueError(f"layout must be 'symmetric' or 'common', got {layout!r}")
    N = int(N)
    if N < 2:
        raise ValueError(f"need N >= 2 tokens, got {N}")
    A, B = _head_maps(params)
    H, D, _ = A.shape
    d_out = B.shape[2]
    eigvecs = [torch.linalg.eigh(A[h])[1].mT for h in range(H)]
    U = torch.cat([torch.eye(D, dtype=torch.float64, device=A.device), *eigvecs])
    best: tuple[float, float, int, int] = (-math.inf, 1.0, 0, 0)
    logN = math.log(N)
    for iu, u in enumerate(U):
        lam = float((A @ u @ u).abs().max())
        if lam <= 0:
            continue
        t_grid = torch.logspace(-3, math.log10(4 * (logN + 5)), _C_GRID, dtype=torch.float64)
        c_grid = torch.sqrt(t_grid / lam)
        for b in range(d_out):
            vals = l2_construction_value(params, N, c_grid, u, b, layout=layout)
            k = int(vals.argmax())
            lo, hi = c_grid[max(k - 1, 0)], c_grid[min(k + 1, _C_GRID - 1)]
            fine = torch.linspace(float(lo), float(hi), 65, dtype=torch.float64)
            fv = l2_construction_value(params, N, fine, u, b, layout=layout)
            j = int(fv.argmax())
            if float(fv[j]) > best[0]:
                best = (float(fv[j]), float(fine[j]), iu, b)
    value, c, iu, b = best
    u = U[iu]
    lam_u = A @ u @ u
    n0, n1, parked = _split(N, layout, lam_u)
    X = torch.zeros(N, D, dtype=torch.float64, device=u.device)
    if layout == "common":
        X[n0:] = c * u
    else:
        X[n0 : n0 + n1 // 2] = c * u
        X[n0 + n1 // 2 : n0 + n1] = -c * u
    if parked:
        X[n0 + n1 :] = math.sqrt(_PARK_COST / float(lam_u.min())) * u
    return L2Construction(
        X=X.to(params.W_Q),
        value=value,
        layout=layout,
        c=c,
        u=u.to(params.W_Q),
        b=b,
        n_zero=n0,
        n_parked=parked,
        costs=(c**2 * lam_u).to(params.W_Q),
    )


# =============================================================================================
# the search
# =============================================================================================
@dataclass(frozen=True)
class L2LowerBound:
    r"""Result of :func:`l2_lipschitz_lower`.

    Attributes
    ----------
    value : float
        The lower bound: :math:`\|DF(X)\|_p` at the returned input, recomputed after the search
        (:func:`l2_jacobian_inf_norm` over the query row, or :func:`l2_jacobian_spectral_norm`).
    X : Tensor, shape (N, D)
        The input attaining it (token 0 is the query row for :math:`p=\infty`).
    p : 2 or "inf"
    construction_value : float
        Best value of the closed-form constructions at the start (same norm).
    search_value : float
        Best value seen by the ascent (differentiable surrogate; for :math:`p=2` an inexact power
        iteration, so it may differ slightly from ``value``).
    n_starts : int
    """

    value: float
    X: Tensor
    p: PNorm
    construction_value: float
    search_value: float
    n_starts: int


#: Objective evaluations without a step before the 2-norm ascent (power iterations only).
_WARMUP = 5

_DEFAULTS = SearchOptions(n_restarts=2, steps=150, lr=0.03, seed=0)


def _search_maps(p64: L2AttentionParams) -> tuple[Tensor, Tensor, float]:
    r"""Per head :math:`W^{Q,h}` (H, D, k), :math:`A_hB_h` (H, D, D_out) and :math:`\sqrt k`."""
    A, B = _head_maps(p64)
    return p64.W_Q, A @ B, math.sqrt(p64.W_Q.shape[2])


def _fast_attention(Z: Tensor, maps: tuple[Tensor, Tensor, float]) -> Tensor:
    r"""L2 attention of a batch (S, N, D) by Gram matrices, for the search only.

    :math:`\|z_i - z_j\|^2 = |z_i|^2 + |z_j|^2 - 2z_i\cdot z_j` (clamped at 0) costs no
    (N, N, k) tensor; its cancellation only affects the search, whose result is re-evaluated by
    :func:`meanfield.attention.l2_self_attention`. Equal to it to rounding (tests).
    """
    WQ, AB, s = maps
    out = torch.zeros(Z.shape[:-1] + AB.shape[-1:], dtype=Z.dtype, device=Z.device)
    for h in range(WQ.shape[0]):
        Y = Z @ WQ[h]
        sq = Y.square().sum(-1)
        d2 = (sq.unsqueeze(-1) + sq.unsqueeze(-2) - 2 * Y @ Y.mT).clamp_min(0.0)
        out = out + torch.softmax(-d2 / s, dim=-1) @ (Z @ AB[h])
    return out


def _query_row(Z: Tensor, maps: tuple[Tensor, Tensor, float]) -> Tensor:
    r"""Output row of token 0, :math:`F_0(X)` for a batch (S, N, D): O(N) per sample."""
    WQ, AB, s = maps
    out = torch.zeros(Z.shape[:-2] + AB.shape[-1:], dtype=Z.dtype, device=Z.device)
    for h in range(WQ.shape[0]):
        Y = Z @ WQ[h]
        d2 = (Y - Y[..., :1, :]).square().sum(-1)  # (S, N)
        P = torch.softmax(-d2 / s, dim=-1)
        out = out + (P.unsqueeze(-2) @ (Z @ AB[h])).squeeze(-2)
    return out  # (S, D_out)


def _inf_objective(maps: tuple[Tensor, Tensor, float]):
    def obj(Z: Tensor) -> Tensor:
        F0 = _query_row(Z, maps)  # (S, d_out)
        vals = []
        for b in range(F0.shape[-1]):
            (g,) = torch.autograd.grad(F0[:, b].sum(), Z, create_graph=True)
            vals.append(g.abs().sum((-1, -2)))
        return torch.stack(vals).amax(0)

    return obj


def _unit(x: Tensor) -> Tensor:
    return x / torch.linalg.vector_norm(x, dim=(-1, -2), keepdim=True).clamp_min(1e-300)


def _spectral_objective(
    maps: tuple[Tensor, Tensor, float], shape: torch.Size, gen: torch.Generator, iters: int
):
    r"""Surrogate :math:`\langle w, DF(X)v\rangle` of the spectral norm, for a batch of inputs.

    Warm-started power iteration on reverse-mode products only: with :math:`g = DF^\top w`
    built with ``create_graph`` (:math:`w` = the previous left vector), :math:`DF\,v` is the
    gradient of :math:`\langle g, v\rangle` in :math:`w` (no forward-mode pass), and the value
    :math:`\langle g, v\rangle` is differentiable in :math:`X`.
    """
    state = {
        "u": _unit(torch.randn(shape, generator=gen, dtype=torch.float64)),
        "v": _unit(torch.randn(shape, generator=gen, dtype=torch.float64)),
    }

    def obj(Z: Tensor) -> Tensor:
        F = _fast_attention(Z, maps)
        w = state["u"].to(Z.device).requires_grad_(True)
        (g,) = torch.autograd.grad(F, Z, w, create_graph=True)
        v = state["v"].to(Z.device)
        u = state["u"]
        for _ in range(iters):
            (Jv,) = torch.autograd.grad(g, w, v, retain_graph=True)
            u = _unit(Jv)
            (JTu,) = torch.autograd.grad(F, Z, u, retain_graph=True)
            v = _unit(JTu)
        state["u"], state["v"] = u.detach(), v.detach()
        return (g * v).sum((-1, -2)).abs()

    return obj


def l2_lipschitz_lower(
    params: L2AttentionParams,
    N: int,
    *,
    p: PNorm = "inf",
    seed: int | None = None,
    n_restarts: int | None = None,
    steps: int | None = None,
    lr: float | None = None,
    power_iters: int = 2,
) -> L2LowerBound:
    r"""Lower bound on :math:`\mathrm{Lip}_p(F)` of L2 attention with ``N`` tokens, by search.

    Multi-start Adam ascent of the local norm :math:`\|DF(X)\|_p` over inputs :math:`X`
    (unconstrained: Kim et al.'s constants are global). Starts: both constructions of
    :func:`l2_construction` (the symmetric one only for ``N >= 3``) and ``n_restarts`` random
    Gaussian inputs at the construction's scale. For :math:`p=\infty` the objective is the largest
    :math:`\ell^1` norm of the gradient of one output coordinate of token 0 (exact; by
    permutation equivariance no generality is lost); for :math:`p=2` it is
    :math:`u^\top DF(X)v` with :math:`(u, v)` from ``power_iters`` warm-started power steps per
    Adam step, matrix-free.

    Parameters
    ----------
    params : L2AttentionParams
    N : int
        Number of tokens, :math:`N\ge2`.
    p : {"inf", 2}
    seed, n_restarts, steps, lr
        Search options (defaults 2 restarts, 150 steps, lr 0.03 relative to the construction's
        scale, seed 0).
    power_iters : int
        Power steps per ascent step (``p=2``).

    Returns
    -------
    L2LowerBound
        ``value`` is recomputed at the best input and is a valid lower bound, never below
        ``construction_value`` (the starts are kept if nothing improves).
    """
    p = _check_p(p)
    N = int(N)
    if N < 2:
        raise ValueError(f"need N >= 2 tokens, got {N}")
    opts, gen = resolve_options(_DEFAULTS, "l2_lipschitz_lower", n_restarts, steps, lr, seed)
    p64 = params_float64(params)
    cons = [l2_construction(p64, N, layout="common")]
    if N >= 3:
        cons.append(l2_construction(p64, N, layout="symmetric"))
    scale = max(cs.c for cs in cons)
    starts = [cs.X.to(torch.float64) for cs in cons]
    for _ in range(opts.n_restarts):
        starts.append(scale * torch.randn(N, p64.D, generator=gen, dtype=torch.float64))
    Z0 = torch.stack(starts).to(p64.W_Q.device)
    maps = _search_maps(p64)
    if p == "inf":
        cons_value = max(cs.value for cs in cons)
        objective = _inf_objective(maps)
    else:
        cons_vals = [l2_jacobian_spectral_norm(cs.X, p64) for cs in cons]
        cons_value = max(cons_vals)
        objective = _spectral_objective(maps, Z0.shape, gen, power_iters)
        Z = Z0.clone().requires_grad_(True)
        for _ in range(_WARMUP):  # converge the power iteration at the starts first
            objective(Z)

    lr = opts.lr * scale
    # log_objective=True: the ascent maximises the norm itself, not its logarithm
    best, (best_Z,), _, _ = ascend_restarts(objective, [Z0], [lr], opts.steps, log_objective=True)
    k = int(best.argmax())
    X = best_Z[k]
    if p == "inf":
        value = l2_jacobian_inf_norm(X, p64, rows=[0])[0]
    else:
        value = l2_jacobian_spectral_norm(X, p64)
        j = max(range(len(cons)), key=lambda i: cons_vals[i])
        if cons_vals[j] > value:  # an unconverged surrogate may pick a worse start
            value, X = cons_vals[j], cons[j].X.to(X)
    return L2LowerBound(
        value=float(value),
        X=X.to(params.W_Q),
        p=p,
        construction_value=float(cons_value),
        search_value=float(best[k]),
        n_starts=int(Z0.shape[0]),
    )
