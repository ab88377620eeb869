r"""Attention variants on the streaming path (docs/derivations/streaming_products.md §6).

The heads with variants (QK-norm, head-space biases, a logit scale, soft-capping, sliding
windows, ALiBi, partial rotary) keep on the streaming path the head-space rows of the stored
closed form (docs/derivations/jacobian_products.md §3c): queries
:math:`q_i = s\,\mathcal R_iN_q(Qx_i + b_q)`, keys :math:`k_l = \mathcal R_lN_k(Kx_l + b_k)`
(centred over the tokens unless a head is capped), and the pre-norm rows of the norms for
their Jacobians. :class:`VariantData` holds what a group of such heads adds to the rows; the
tile kernels of :mod:`~meanfield.jacobian.streaming` apply the cap, ALiBi and the window to
each recomputed tile, and multiply the logit tangents by the cap's gate
:math:`g_{il} = \cosh^{-2}(\tilde s_{il}/\kappa)`.

The *magnitude* form (``magnitude=True``) replaces every map by an entrywise bound on the
absolute value of its output for nonnegative inputs: the norm Jacobian
:math:`w\odot(\rho h - \tfrac{\rho^3}{k}\langle u, h\rangle u)` by
:math:`|w|\odot(\bar\rho|h| + \tfrac{\bar\rho^3}{k}\langle\bar u, |h|\rangle\bar u)` and the
rotation by :func:`abs_rotate_some` (docs/rounding.md §11.4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .._spectral import U64, gamma_k
from ..params import AttentionParams, RotaryEmbedding
from .linearization import NormRows, head_space_factors, rotate_some, variant_head_rows

__all__ = [
    "MixedNorm",
    "NormStats",
    "VariantData",
    "abs_rotate_some",
    "magnitude_rows",
    "norm_relative_error",
    "tile_gate",
    "tile_scores",
    "variant_rows",
    "window_mask",
]


@dataclass(frozen=True, eq=False)
class VariantData:
    r"""What the variant heads of one streaming group add to its rows.

    Attributes
    ----------
    ropes : tuple of RotaryEmbedding or None
        Each head's rotary embedding (``None``: no rotation; partial rotary included).
    scale : Tensor, shape (G, 1, 1), or None
        Logit scales (folded into the query rows and their tangents).
    cap : Tensor, shape (G, 1, 1), or None
        Soft-caps :math:`\kappa` (``inf`` for a head without one); ``None`` without caps.
    alibi : Tensor, shape (G, 1, 1), or None
        ALiBi slopes (0 for a head without); ``None`` without ALiBi.
    window : Tensor, shape (G, 1, 1), or None
        Sliding windows in token-index units, as floats (``inf`` for a head without).
    q_norm, k_norm : NormRows or None
        Pre-norm rows, :math:`\rho` and gains of the QK-norms (``None`` without that norm).
    magnitude : bool
        The magnitude form (module docstring): the tangent maps are entrywise bounds.
    q_stats, k_stats : NormStats or None
        In the magnitude form: the computed pre-norm rows, for the rounding analysis.
    """

    ropes: tuple[RotaryEmbedding | None, ...]
    scale: Tensor | None = None
    cap: Tensor | None = None
    alibi: Tensor | None = None
    window: Tensor | None = None
    q_norm: NormRows | MixedNorm | None = None
    k_norm: NormRows | MixedNorm | None = None
    magnitude: bool = False
    q_stats: NormStats | None = None
    k_stats: NormStats | None = None

    @property
    def max_window(self) -> int | None:
        """The largest window when every head has one, else ``None`` (no key block is skipped)."""
        if self.window is None or not bool(torch.isfinite(self.window).all()):
            return None
        return int(self.window.max())

    def _rotate(self, Z: Tensor, index: Tensor, adjoint: bool) -> Tensor:
        if self.magnitude:
            return abs_rotate_some(self.ropes, Z)
        return rotate_some(self.ropes, Z, index, adjoint=adjoint)

    def query_tangent(self, Y: Tensor, index: Tensor) -> Tensor:
        r"""Rows :math:`dq_i = s\,\mathcal R_iJ_{N_q}(u_i)y_i` of head-space rows ``Y = QH``."""
        if self.q_norm is not None:
            Y = _norm_jvp(self.q_norm, Y, self.magnitude)
        Y = self._rotate(Y, index, False)
        return Y if self.scale is None else self.scale * Y

    def key_tangent(self, Y: Tensor, index: Tensor) -> Tensor:
        r"""Rows :math:`dk_l = \mathcal R_lJ_{N_k}(u_l)y_l` of head-space rows ``Y = KH``."""
        if self.k_norm is not None:
            Y = _norm_jvp(self.k_norm, Y, self.magnitude)
        return self._rotate(Y, index, False)

    def query_adjoint(self, Y: Tensor, index: Tensor) -> Tensor:
        r"""The transpose of :meth:`query_tangent` on head-space rows (before :math:`Q^\top`)."""
        if self.scale is not None:
            Y = self.scale * Y
        Y = self._rotate(Y, index, True)
        return Y if self.q_norm is None else _norm_vjp(self.q_norm, Y, self.magnitude)

    def key_adjoint(self, Y: Tensor, index: Tensor) -> Tensor:
        r"""The transpose of :meth:`key_tangent` on head-space rows (before :math:`K^\top`)."""
        Y = self._rotate(Y, index, True)
        return Y if self.k_norm is None else _norm_vjp(self.k_norm, Y, self.magnitude)


@dataclass(frozen=True, eq=False)
class MixedNorm:
    r"""The magnitude of a QK-norm tangent's error from its pre-norm row (docs/rounding.md §11.5).

    :math:`|w|\odot\tfrac{\bar\rho^3}{k}\big(\langle\bar u, y\rangle\tilde u +
    \langle\tilde u, y\rangle\bar u\big)` for nonnegative ``y``: the second term of the norm's
    Jacobian with one of its two pre-norm rows at the chain magnitude ``u`` and the other at the
    computed row's bound ``u2``; no :math:`\rho y` term. Linear and nonnegative; :meth:`vjp` is
    its transpose.
    """

    u: Tensor
    u2: Tensor
    rho: Tensor
    w: Tensor

    def jvp(self, Y: Tensor) -> Tensor:
        """The map on rows ``Y`` (..., G, n, k)."""
        k = self.u.shape[-1]
        c = self.rho.pow(3) / k
        a = (self.u * Y).sum(-1, keepdim=True)
        b = (self.u2 * Y).sum(-1, keepdim=True)
        return self.w * (c * (a * self.u2 + b * self.u))

    def vjp(self, Y: Tensor) -> Tensor:
        """Its transpose."""
        k = self.u.shape[-1]
        c = self.rho.pow(3) / k
        wy = self.w * Y
        a = (self.u2 * wy).sum(-1, keepdim=True)
        b = (self.u * wy).sum(-1, keepdim=True)
        return c * (a * self.u + b * self.u2)


def _norm_jvp(norm: NormRows | MixedNorm, Y: Tensor, magnitude: bool) -> Tensor:
    if isinstance(norm, MixedNorm):
        return norm.jvp(Y)
    if not magnitude:
        return norm.jvp(Y)
    k = norm.u.shape[-1]
    dot = (norm.u * Y).sum(-1, keepdim=True)
    return norm.w * (norm.rho * Y + (norm.rho.pow(3) / k * dot) * norm.u)


def _norm_vjp(norm: NormRows | MixedNorm, Y: Tensor, magnitude: bool) -> Tensor:
    if isinstance(norm, MixedNorm):
        return norm.vjp(Y)
    if not magnitude:
        return norm.vjp(Y)
    k = norm.u.shape[-1]
    wy = norm.w * Y
    dot = (norm.u * wy).sum(-1, keepdim=True)
    return norm.rho * wy + (norm.rho.pow(3) / k * dot) * norm.u


def abs_rotate_some(ropes: tuple[RotaryEmbedding | None, ...], Z: Tensor) -> Tensor:
    r"""Entrywise bound on the rotated rows of nonnegative ``Z`` (..., G, n, k), any positions.

    A rotated coordinate mixes a coordinate with its partner of the other half of the rotary
    width :math:`r`, scaled by :math:`\alpha`: at most :math:`|\alpha|(|z_a| + |z_b|)`; the
    coordinates beyond :math:`r` (partial rotary) and heads without an embedding pass unchanged.
    Linear, nonnegative and its own transpose.
    """
    if all(r is None for r in ropes):
        return Z
    parts = []
    for a, rope in enumerate(ropes):
        z = Z[..., a, :, :]
        if rope is None:
            parts.append(z)
            continue
        r = z.shape[-1] if rope.head_dim is None else rope.rotary_dim
        half = r // 2
        rot = z[..., :r]
        swap = torch.cat([rot[..., half:], rot[..., :half]], dim=-1)
        parts.append(torch.cat([(rot + swap) * abs(float(rope.attention_scaling)), z[..., r:]], -1))
    return torch.stack(parts, dim=-3)


def _stacked(values: list[float], fill: float, like: Tensor) -> Tensor | None:
    """(G, 1, 1) tensor of ``values``, ``None`` when every value is ``fill`` (the field is unused)."""
    if all(v == fill for v in values):
        return None
    return torch.tensor(values, dtype=like.dtype, device=like.device).reshape(-1, 1, 1)


def variant_rows(
    X: Tensor, heads: list[AttentionParams], index: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor, VariantData]:
    r"""Head-space factors and rows of variant heads: ``(Q, K, q, k, data)``.

    ``Q``, ``K`` (G, k, d) are the head-space factors of
    :func:`~meanfield.jacobian.linearization.head_space_factors` (a head given by ``A`` has
    :math:`Q = A^\top`, :math:`K = I`, :math:`b_q = c`); ``q`` are the rotated, normed, scaled
    queries and ``k`` the rotated, normed keys, centred over the tokens unless a head is capped
    (the gate breaks the invariance under a shift of the keys). ``index``: token positions.
    """
    Q, K, q, kr, q_norm, k_norm, ropes, scale = variant_head_rows(X, heads, index)
    cap = _stacked([math.inf if h.softcap is None else h.softcap for h in heads], math.inf, X)
    if cap is None:
        kr = kr - kr.mean(-2, keepdim=True)
    data = VariantData(
        ropes=ropes, scale=scale, cap=cap,
        alibi=_stacked([0.0 if h.alibi_slope is None else h.alibi_slope for h in heads], 0.0, X),
        window=_stacked([math.inf if h.window is None else float(h.window) for h in heads],
                        math.inf, X),
        q_norm=q_norm, k_norm=k_norm,
    )  # fmt: skip
    return Q, K, q, kr, data


def tile_scores(
    data: VariantData, S: Tensor, qi: Tensor, ki: Tensor
) -> tuple[Tensor, Tensor | None]:
    r"""The variant logits of a tile from :math:`\tilde s_{il} = \langle q_i, k_l\rangle`.

    Returns the logits :math:`\kappa\tanh(\tilde s/\kappa) + m(\tau_l - \tau_i)` (the cap only
    for capped heads) and :math:`\tilde s` itself when a head is capped (for the gate), else
    ``None``. ``qi``, ``ki``: the token positions of the tile's queries and keys, as floats
    broadcasting to (..., 1, b_q) and (..., 1, b_k).
    """
    pre = None
    L = S
    if data.cap is not None:
        pre = S
        capped = torch.tanh(S / data.cap) * data.cap
        L = torch.where(torch.isfinite(data.cap), capped, S)
    if data.alibi is not None:
        L = L + data.alibi * (ki.unsqueeze(-2) - qi.unsqueeze(-1))
    return L, pre


def tile_gate(data: VariantData, pre: Tensor) -> Tensor:
    r"""The gate :math:`\cosh^{-2}(\tilde s/\kappa)` of a tile (1 for heads without a cap).

    The form of :func:`~meanfield.jacobian.linearization` (``1 - tanh^2`` would lose its digits
    where the cap saturates).
    """
    assert data.cap is not None
    g = torch.cosh(pre / data.cap).reciprocal().square()
    return torch.where(torch.isfinite(data.cap), g, torch.ones_like(g))


def window_mask(data: VariantData, qi: Tensor, ki: Tensor) -> Tensor | None:
    r"""Keys within each head's window, :math:`|\tau_i - \tau_l| < W` (..., G, b_q, b_k)."""
    if data.window is None:
        return None
    dist = (qi.unsqueeze(-1) - ki.unsqueeze(-2)).abs()
    return dist < data.window


# ------------------------------------------------------------------- the magnitude operator
@dataclass(frozen=True, eq=False)
class NormStats:
    r"""The computed pre-norm rows of one side's QK-norms, for the rounding analysis.

    docs/rounding.md §11.4. ``u``: the computed rows :math:`\hat u_i = \mathrm{fl}(Qx_i + b)`;
    ``ubar``: their magnitudes :math:`|Q||x_i| + |b|` (rounded up: at least :math:`|u_i|` and
    :math:`|\hat u_i|`); ``R``: the computed :math:`\mathrm{fl}(\tfrac1k\|\hat u_i\|^2 +
    \varepsilon)`; ``has``: the heads with a norm on this side (G,).
    """

    u: Tensor
    ubar: Tensor
    R: Tensor
    has: Tensor


def norm_relative_error(stats: NormStats, d: int, unit: float) -> Tensor:
    r"""Bound :math:`\rho_{\rm rel}` on :math:`|\rho/\hat\rho - 1|` over the rows (batch shape).

    With :math:`e = \gamma_{k+2}R + \tfrac1k\sum_j\gamma_{d+1}\bar u_j(2|\hat u_j| +
    3\gamma_{d+1}\bar u_j)\ge|R - r^2|` (:math:`r^2` the exact :math:`\tfrac1k\|u\|^2 +
    \varepsilon`) and the two roundings of ``rsqrt``:
    :math:`\rho_{\rm rel} = \sqrt{R/(R - e)}\,(1 + 4u) - 1`, ``inf`` where :math:`e\ge R/2`.
    ``unit``: the unit roundoff of the computation modelled (docs/rounding.md §11.3).
    """
    k = stats.u.shape[-1]
    gd = gamma_k(d + 1, unit)
    e = gamma_k(k + 2, unit) * stats.R + (
        gd * stats.ubar * (2 * stats.u.abs() + 3 * gd * stats.ubar)
    ).mean(-1, keepdim=True)
    e = e * (1 + gamma_k(k + 4))
    rel = torch.sqrt(stats.R / (stats.R - e)) * (1 + 4 * unit) - 1
    rel = torch.where(e < 0.5 * stats.R, rel, math.inf)
    rel = torch.where(stats.has.reshape(-1, 1, 1), rel, 0.0)
    return rel.flatten(-3).amax(-1) * (1 + 4 * U64)


def magnitude_rows(
    data: VariantData,
    heads: list[AttentionParams],
    X: Tensor,
    aQ: Tensor,
    aK: Tensor,
    centred: bool,
) -> tuple[Tensor, Tensor, VariantData]:
    r"""Magnitude rows :math:`\bar q`, :math:`\bar k` and the magnitude :class:`VariantData`.

    Pre-norm magnitudes :math:`\bar u = |Q||x| + |b|`; with a norm,
    :math:`\bar q = |w|\bar\rho\,\bar u\,(1 + 2u)` with :math:`\bar\rho = \hat\rho(1 +
    \rho_{\rm rel})` (at least the exact :math:`|q|` and the computed :math:`|\hat q|`), then
    :func:`abs_rotate_some` and :math:`|s|`; centred keys get :math:`\bar k_l + \mathrm{mean}\,\bar k`.
    The magnitude data carries :class:`NormStats` and the norms' magnitude rows
    :math:`(\bar u, \bar\rho, |w|)` for the tangent maps. ``aQ``, ``aK``: :math:`|Q|`, :math:`|K|`.
    """
    d = X.shape[-1]
    aX = X.abs()
    infl = 1 + gamma_k(d + 2)
    factors = [head_space_factors(h, d) for h in heads]

    def side(
        A: Tensor, i: int, norm: NormRows | None, has: list[bool]
    ) -> tuple[Tensor, NormStats | None, NormRows | None]:
        ubar = torch.einsum("...nd,gkd->...gnk", aX, A)
        bs = [f[i] for f in factors]
        if any(b is not None for b in bs):
            zero = X.new_zeros(A.shape[-2])
            ubar = ubar + torch.stack([zero if b is None else b.abs().to(X) for b in bs]).unsqueeze(
                -2
            )
        ubar = ubar * infl
        if norm is None:
            return ubar, None, None
        mask = torch.tensor(has, device=X.device)
        eps = torch.tensor(
            [
                0.0 if nm is None else nm.eps
                for nm in (h.q_norm if i == 2 else h.k_norm for h in heads)
            ],
            dtype=X.dtype,
            device=X.device,
        ).reshape(-1, 1, 1)
        R = norm.u.square().mean(-1, keepdim=True) + eps
        stats = NormStats(u=norm.u, ubar=ubar, R=R, has=mask)
        rel = norm_relative_error(stats, d, U64)
        rho = norm.rho * (1 + rel)[..., None, None, None] * (1 + 2 * U64)
        rows = norm.w.abs() * rho * ubar * (1 + 2 * U64)
        rows = torch.where(mask.reshape(-1, 1, 1), rows, ubar)
        mag = NormRows(u=torch.where(mask.reshape(-1, 1, 1), ubar, 0.0), rho=rho, w=norm.w.abs())
        return rows, stats, mag

    has_q = [h.q_norm is not None for h in heads]
    has_k = [h.k_norm is not None for h in heads]
    assert not isinstance(data.q_norm, MixedNorm) and not isinstance(data.k_norm, MixedNorm)
    aq, q_stats, q_mag = side(aQ, 2, data.q_norm, has_q)
    ak, k_stats, k_mag = side(aK, 3, data.k_norm, has_k)
    aq, ak = abs_rotate_some(data.ropes, aq), abs_rotate_some(data.ropes, ak)
    scale = None if data.scale is None else data.scale.abs()
    if scale is not None:
        aq = scale * aq * (1 + 2 * U64)
    if centred:
        ak = ak + ak.mean(-2, keepdim=True)  # |k_l - mean k| <= |k_l| + mean |k|
    mag = VariantData(
        ropes=data.ropes, scale=scale, cap=data.cap, alibi=data.alibi, window=data.window,
        q_norm=q_mag, k_norm=k_mag, magnitude=True, q_stats=q_stats, k_stats=k_stats,
    )  # fmt: skip
    return aq, ak, mag
