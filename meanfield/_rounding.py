r"""Rounding-error margins and scale safety for the certified bracket (docs/rounding.md).

The bracket of :func:`meanfield.local_lipschitz` is computed in float64 from a linearisation
whose attention matrices carry the rounding error of the softmax. This module turns that error
into explicit margins:

* :func:`softmax_error` bounds the relative error of the computed :math:`P` and
  :math:`\tilde P` from the magnitude of the logits (docs/rounding.md §2);
* :func:`magnitude_linearization` builds the nonnegative *magnitude operator* :math:`|J|_{\rm
  mag}` that dominates every term of the closed-form products (docs/rounding.md §3), so that
  :math:`|\widehat{Jv} - Jv|\le\eta\,|J|_{\rm mag}|v|` entrywise;
* :func:`lower_margin` and :func:`upper_margin` apply it to the two ends (docs/rounding.md §4);
* :func:`streaming_error_model`, :func:`streaming_magnitude_norm` and
  :func:`streaming_magnitude_vector_norm` are the same model for the streaming products, whose
  attention tiles are recomputed from the row log-normalisers (docs/rounding.md §11);
* :func:`scale_exponent` and :func:`scaled` normalise the operator by a power of two before any
  norm, SVD or Krylov step, so that constants up to float64's maximum come back finite
  (docs/rounding.md §5).

All tensors returned are float64.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import replace

import torch
from torch import Tensor

from ._spectral import U64
from ._spectral import gamma_k as gamma
from ._typing import Params, ProductGeometry
from .attention import admissible_keys, head_logits
from .jacobian import AttentionLinearization, StreamingLinearization, jvp, vjp
from .jacobian.linearization import NormRows, RopeRows, attend, rotate_some
from .jacobian.streaming import HeadGroup, streaming_jvp, streaming_vjp
from .jacobian.streaming_variants import MixedNorm, NormStats, norm_relative_error
from .params import AttentionParams, MultiHeadParams, RotaryEmbedding

__all__ = [
    "ErrorModel",
    "error_model",
    "gamma",
    "lower_from_product",
    "magnitude_linearization",
    "magnitude_norm_upper",
    "magnitude_vector_norm",
    "scale_exponent",
    "scaled",
    "on_magnitude_of",
    "softmax_error",
    "streaming_error_model",
    "streaming_magnitude_norm",
    "streaming_magnitude_vector_norm",
    "streaming_scale_exponent",
]

F64_MAX = torch.finfo(torch.float64).max
#: Largest binary exponent allowed for the scale (keeps 2**e and 2**-e normal numbers).
_MAX_EXP = 1000
#: Extra relative slack on the magnitude model covering second-order terms (docs/rounding.md §3).
_SAFETY = 2.0


def _abs_rope(rope: RotaryEmbedding, Z: Tensor, idx: Tensor) -> Tensor:
    """Entrywise bound on a rotated ``|Z|`` (docs/rounding.md §2.1): alpha (|z| + |rot z|)."""
    half = Z.shape[-1] // 2
    rot = torch.cat([Z[..., half:], Z[..., :half]], dim=-1)
    return (Z + rot) * abs(float(rope.attention_scaling))


@dataclasses.dataclass(frozen=True, eq=False)
class _RotationMagnitude(RotaryEmbedding):
    r"""The entrywise bound of a full rotary embedding, in the place of the embedding.

    :meth:`apply` maps :math:`z\ge0` to :math:`|\alpha|(z + \mathrm{swap}(z))` at every position:
    each rotated coordinate :math:`z_a\cos - z_b\sin` (times :math:`\alpha`) is at most
    :math:`|\alpha|(|z_a| + |z_b|)` in absolute value, for its rotation and for the adjoint one.
    The map is symmetric, so the magnitude operator's products run the rotary closed form
    (:func:`meanfield.jacobian.jvp`) unchanged, with this in the place of the rotation.
    """

    def apply(self, Z: Tensor, positions: Tensor) -> Tensor:
        return _abs_rope(self, Z, positions)


def _rotation_rounding(
    lin: AttentionLinearization | StreamingLinearization, ropes: list[RotaryEmbedding], u: float
) -> float:
    r"""Relative error of one computed rotation, ``4u(2 + max|p\theta|) + 4u`` (0 without one).

    The cosines and sines of angles up to :math:`\max|p\theta|` (``top`` the largest token
    position: of ``lin.token_index``, else ``n - 1``) and the scaling (docs/rounding.md §2.1),
    then the two products and the sum of a rotated coordinate.
    """
    if lin.token_index is not None and lin.token_index.numel():
        top = float(lin.token_index.abs().max())
    else:
        top = float(max(lin.n - 1, 0))
    worst = -1.0
    for rope in ropes:
        ang = top * float(rope.inv_freq.abs().max()) if rope.inv_freq.numel() else 0.0
        worst = max(worst, ang)
    return 0.0 if worst < 0 else 4 * u * (2 + worst) + 4 * u


def softmax_error(lin: AttentionLinearization, unit: float = U64) -> tuple[Tensor, Tensor]:
    r"""Error of the computed attention matrices, split in two parts (docs/rounding.md §2).

    * **Logit part** :math:`\varepsilon_s`. The computed logits satisfy
      :math:`|\hat s_{ij}-s_{ij}|\le\delta_{ij}=\gamma_{k+d+4}\bar s_{ij}` with :math:`\bar s`
      the logits evaluated on absolute values (§2.1); the subtraction of the row maximum adds
      :math:`u|s_{ij}-\max_k s_{ik}|`. The softmax of perturbed logits moves by
      :math:`\delta P_{i\cdot}=P_{i\cdot}\circ(\delta s_{i\cdot}-\langle P_{i\cdot},\delta
      s_{i\cdot}\rangle)` to first order, a perturbation whose rows sum to zero (§2.2);
      :math:`\varepsilon_s = \mathrm{expm1}(2\max_{i,j}\delta_{ij})` bounds it relatively.
    * **Rounding part** :math:`\varepsilon_r`: the final subtraction of the log-sum-exp and the
      exponential, :math:`u(|\log P_{ij}|+4)` with :math:`|\log P_{ij}|\le\sigma_i+\log n`
      (:math:`\sigma_i` the spread of the logits of row :math:`i`), plus the log-weight ratio of
      :math:`\tilde P` (§2.3). These rows do not sum to zero.

    ``unit`` is the unit roundoff of the computation modelled (float64's by default; float32's
    for the operator a float32 solve runs on, docs/rounding.md §11.3); the bound itself is
    evaluated in float64.

    Returns
    -------
    eps_s, eps_r : Tensor, float64, shape ``lin.batch_shape``
    """
    u = unit
    X = lin.X.to(torch.float64)
    n, d = lin.n, lin.d
    batch = lin.batch_shape
    dev = X.device
    aX = X.abs()
    allowed = admissible_keys(lin.masked, n, n, lin.positions, None, dev)
    lw64 = None if lin.log_weights is None else lin.log_weights.to(torch.float64)
    keep = torch.ones(batch + (n, n), dtype=torch.bool, device=dev)
    if allowed is not None:
        keep = keep & allowed
    if lw64 is not None:
        keep = keep & torch.isfinite(lw64).unsqueeze(-2)
    alw = None if lw64 is None else torch.where(torch.isfinite(lw64), lw64.abs(), 0.0)
    lw_logits = None if lw64 is None else torch.where(torch.isfinite(lw64), lw64, 0.0)
    logn = math.log(max(n, 1))
    eps_s = torch.zeros(batch, dtype=torch.float64, device=dev)
    spread = torch.zeros(batch, dtype=torch.float64, device=dev)
    zero = torch.zeros((), dtype=torch.float64, device=dev)
    for head in lin.params.heads:
        head = head if head.A.dtype == torch.float64 else head.to(dtype=torch.float64)
        extra = 0.0
        idx = None
        factors = head.factors
        if factors is None:  # no rotary embedding either (AttentionParams checks it)
            sbar = (aX @ head.A.abs()) @ aX.mT
            kdim = d
        else:
            Q, K = factors
            q, k = aX @ Q.abs().mT, aX @ K.abs().mT
            if head.rope is not None:
                idx = torch.arange(n, device=dev) if lin.token_index is None else lin.token_index
                q, k = _abs_rope(head.rope, q, idx), _abs_rope(head.rope, k, idx)
                ang = float(idx.abs().max()) * float(head.rope.inv_freq.abs().max()) if n else 0.0
                extra = 4 * u * (2 + ang)  # cos/sin of p*theta and the scaling
            sbar = q @ k.mT
            kdim = Q.shape[0]
        if head.c is not None:
            sbar = sbar + (aX @ head.c.abs()).unsqueeze(-2)
        if alw is not None:
            sbar = sbar + alw.unsqueeze(-2)
        sbar = sbar * (1 + gamma(2 * d + 4))  # the magnitude itself is computed with rounding
        logits = head_logits(X, X, head, lw_logits, query_index=idx, key_index=idx)
        hi = torch.where(keep, logits, -math.inf).amax(-1, keepdim=True)
        lo = torch.where(keep, logits, math.inf).amin(-1, keepdim=True)
        row_spread = torch.where(keep.any(-1, keepdim=True), hi - lo, zero).squeeze(-1)
        delta = (gamma(kdim + d + 4, u) + extra) * sbar + u * (hi - logits).abs()
        delta = torch.where(keep, delta, zero)
        bound = 2 * delta.amax((-2, -1)) * (1 + 4 * U64)
        eps_s = torch.maximum(eps_s, torch.expm1(bound) * (1 + 4 * U64))
        spread = torch.maximum(spread, row_spread.amax(-1))
    spread = torch.where(torch.isfinite(spread), spread, math.inf)
    eps_r = u * (spread + logn + 8) * (1 + 4 * U64)
    if alw is not None:
        # logP + half_i - half_j: three roundings of numbers of size <= |log P| + |log a|
        eps_r = eps_r + 3 * u * (spread + logn + alw.amax(-1) + 4)
    eps_s = torch.where(torch.isnan(eps_s) | (eps_s >= 1), math.inf, eps_s)
    eps_r = torch.where(torch.isnan(eps_r) | (eps_r >= 1), math.inf, eps_r)
    return eps_s, eps_r


@dataclasses.dataclass(frozen=True)
class ErrorModel:
    r"""Error factors of the computed products (docs/rounding.md §3).

    Attributes
    ----------
    eta_s, eta_r : Tensor, float64, shape ``batch``
        Coefficients of the centred (logit-sensitivity) and uncentred (rounding) magnitudes:
        :math:`|\widehat{Jv}-Jv|\le\eta\,|J|_{\rm mag}|v|` with :math:`\eta=\eta_s+\eta_r` and
        the magnitude operator of :func:`magnitude_linearization`.
    eps_s : Tensor, float64, shape ``batch``
        Relative logit-driven error of the attention matrices.
    depth : int
        Accumulation length entering :math:`\gamma`.
    """

    eta_s: Tensor
    eta_r: Tensor
    eps_s: Tensor
    depth: int

    @property
    def eta(self) -> Tensor:
        """Total coefficient (``inf`` when no bound is available)."""
        eta = self.eta_s + self.eta_r
        return torch.where(torch.isfinite(eta) & (eta <= 0.25), eta, math.inf)

    @property
    def eps_P(self) -> Tensor:
        """Relative error of the attention matrices, both parts."""
        return self.eps_s + self.eta_r


def error_model(lin: AttentionLinearization, unit: float = U64) -> ErrorModel:
    r"""Coefficients of the error model (docs/rounding.md §3).

    :math:`\eta_s = 2\cdot2\varepsilon_s` and :math:`\eta_r = 2(3\varepsilon_r+\gamma_K)`.

    A perturbation of :math:`P` enters a term of the product at most twice (the coefficient
    and the mean :math:`m_i`); :math:`K = 4(n+d+k+Hd_v+d_{\rm out})+32` covers every inner
    product of the closed form. The outer factor 2 covers second-order terms while
    :math:`\eta\le1/4`; above that the bound is reported as infinite. ``unit``: the unit
    roundoff of the computation modelled (:func:`softmax_error`).
    """
    eps_s, eps_r = softmax_error(lin, unit)
    heads = lin.params.heads
    k = max((h.Q.shape[0] if h.Q is not None else lin.d) for h in heads)
    dv = sum(h.V.shape[0] for h in heads)
    depth = 4 * (lin.n + lin.d + k + dv + lin.d_out) + 32
    eta_s = _SAFETY * 2 * eps_s
    eta_r = _SAFETY * (3 * eps_r + gamma(depth, unit))
    ropes = [h.rope for h in lin.params.heads if h.rope is not None]
    rot = _rotation_rounding(lin, ropes, unit)
    if rot > 0:
        # rotary heads: a monomial of the products has at most two rotated factors, each within
        # rot of its magnitude row, and the magnitude operator dominates the exact monomials to
        # within 1 + 2 gamma_{n+4} (docs/rounding.md §3.1): eta becomes
        # (1 + eta)(1 + rot)^2 (1 + 2 gamma_{n+4}) - 1, both parts scaled alike so that the
        # magnitude operator's weights do not move
        eta = eta_s + eta_r
        grown = ((1 + eta) * (1 + rot) ** 2 * (1 + 2 * gamma(lin.n + 4, unit)) - 1) * (1 + 4 * U64)
        f = grown / eta
        eta_s, eta_r = eta_s * f, eta_r * f
    return ErrorModel(eta_s=eta_s, eta_r=eta_r, eps_s=eps_s, depth=depth)


def on_magnitude_of(model: ErrorModel, base: ErrorModel) -> ErrorModel:
    r"""``model`` expressed on the magnitude operator built with the weights of ``base``.

    The magnitude operator of :func:`magnitude_linearization` weighs the centred and uncentred
    difference factors by ``base``'s :math:`\eta_s, \eta_r`; another model (float32's, for the
    operator a float32 solve runs on, docs/rounding.md §11.3) needs
    :math:`\eta'_s\xi^c + \eta'_r\xi^u\le\rho(\eta_s\xi^c + \eta_r\xi^u)` with
    :math:`\rho = \max(\eta'_s/\eta_s, \eta'_r/\eta_r)` (a zero :math:`\eta_s` needs a zero
    :math:`\eta'_s`, else :math:`\rho = \infty`). Returns ``base`` scaled by :math:`\rho`, so
    its ``eta`` times ``base``'s magnitude norm bounds ``model``'s error.
    """
    rho = model.eta_r / base.eta_r
    pos = base.eta_s > 0
    rs = torch.where(pos, model.eta_s / torch.where(pos, base.eta_s, 1.0), 0.0)
    rs = torch.where(~pos & (model.eta_s > 0), math.inf, rs)
    rho = torch.maximum(rho, rs) * (1 + 4 * U64)
    return ErrorModel(
        eta_s=base.eta_s * rho, eta_r=base.eta_r * rho, eps_s=model.eps_s, depth=model.depth
    )


# --------------------------------------------------------------------------- magnitude operator
def magnitude_linearization(
    lin: AttentionLinearization, model: ErrorModel
) -> AttentionLinearization:
    r"""The linearisation of the magnitude operator :math:`|J|_{\rm mag}` (docs/rounding.md §3).

    Every factor of the closed-form products of :func:`meanfield.jacobian.jvp` and
    :func:`~meanfield.jacobian.vjp` is replaced by an entrywise upper bound on its absolute
    value (``|Q||x_i|``, ``|K|(|x_l|+|x_bar|)``, ``|W|``, ``|V|``, ...). The difference
    :math:`x_l-m_i`, which the products form as :math:`(x_l-\bar x)-(m_i-\bar x)`, gets the
    weighted magnitude :math:`\xi = (\eta_s\xi^c+\eta_r\xi^u)/(\eta_s+\eta_r)`: centred
    (:math:`|x_l-\bar x|+|m_i-\bar x|`) for the logit part, whose row sums vanish, and
    uncentred (:math:`|x_l|+\sum_jP_{ij}|x_j|+2|\bar x|`) for the rounding part. The uncentred
    bound on the mean is linear in the points, so it is formed in head space,
    :math:`P(|X||K_h|^\top)` rather than :math:`|K_h|(P|X|)`: the same numbers at cost
    :math:`O(Hn^2k)` instead of :math:`O(Hn^2d)` (docs/rounding.md §3). The mean term, which the
    products *subtract*, is stored negated, so the same code computes :math:`|J|_{\rm mag}h\ge0`
    for :math:`h\ge0`. Rotary heads get the same rows through the entrywise bound of a rotation
    (:func:`_rope_magnitude_rows`, docs/rounding.md §3.1); their rotations' own rounding is in
    ``model`` (:func:`error_model`).
    """
    X = lin.X
    aX = X.abs()
    es = model.eta_s.to(X)
    er = model.eta_r.to(X)
    tot = es + er
    ok = torch.isfinite(tot) & (tot > 0)
    ws = torch.where(ok, es / torch.where(ok, tot, 1.0), 0.5)[..., None, None, None]
    wr = torch.where(ok, er / torch.where(ok, tot, 1.0), 0.5)[..., None, None, None]
    rope_rows = None if lin.rope_rows is None else _rope_magnitude_rows(lin, lin.rope_rows, ws, wr)
    out = dataclasses.replace(lin, X=aX, W=lin.W.abs(), _m=None, _B=None, rope_rows=rope_rows)
    if not lin.analytic_heads:
        return out
    ab = lin.x_bar.abs()  # (..., 1, d)
    V = lin.V.abs()
    xc = (X - lin.x_bar).abs() * (1 + 2 * U64)  # >= |x_l - x_bar|
    A: Tensor | None = None  # |A_h| of heads without factors
    QK: tuple[Tensor, Tensor] | None = None
    QKV: Tensor | None = None
    if lin.QK is not None:
        Q, K = lin.QK[0].abs(), lin.QK[1].abs()
        QK = (Q, K)
        QKV = torch.cat([Q, K, V], dim=-2).reshape(-1, lin.d)
        Qx = torch.einsum("...nd,hkd->...hnk", aX, Q)
        KV = torch.cat([K, V], dim=-2)  # (H_a, k + d_v, d): the rows the means enter
    else:
        A = lin.A.abs()
        Qx = aX.unsqueeze(-3).expand(lin.batch_shape + (len(lin.analytic_heads), lin.n, lin.d))
        KV = torch.cat([A, V], dim=-2)
    k = KV.shape[-2] - V.shape[-2]

    def rows(Y: Tensor) -> Tensor:  # (..., n, d) or (..., H_a, n, d) -> (..., H_a, n, k + d_v)
        spec = "...hnd" if Y.dim() == X.dim() + 1 else "...nd"
        return torch.einsum(f"{spec},hed->...hne", Y, KV)

    block = lin._causal_block()
    Xr, Xcr, abr = rows(aX), rows(xc), rows(ab)
    if KV.shape[-2] < lin.d:  # head space first: P (|X| |KV|^T), O(H n^2 (k + d_v))
        Mr = attend(lin.P, Xr, block)
    else:  # heads without factors: P |X| in R^d first, O(H n^2 d)
        Mr = rows(attend(lin.P, aX.unsqueeze(-3), block))
    # sums of nonnegative terms (lengths n and d): relative error below gamma_{n+d+4}
    Mr = Mr * (1 + 2 * gamma(lin.n + lin.d + 4))  # >= |KV| sum_j P_ij |x_j| >= |KV||m_i|
    unc = Mr + abr
    # the computed means carry an absolute error gamma_{n+4} sum_j P_ij |x_j|
    cen = rows((lin.m - lin.x_bar.unsqueeze(-3)).abs()) + gamma(lin.n + 4) * unc
    Ms = ws * cen + wr * unc
    KXc = Xr[..., :k] + abr[..., :k]  # uncentred, for the logit gradients A x_l
    VXc = ws * Xcr[..., k:] + wr * (Xr[..., k:] + abr[..., k:])
    C = None if lin.C is None else lin.C.abs()
    # the lazily formed fields m and B follow from X, P, Q, K, C, all nonnegative now;
    # A holds |A_h| for heads without factors (factored heads' products use Q, K only)
    return dataclasses.replace(
        out, _A=A, V=V, QK=QK, QKV=QKV, Qx=Qx, KXc=KXc, KMc=Ms[..., :k], VXc=VXc,
        VMc=-Ms[..., k:], C=C,
    )  # fmt: skip


def _rope_magnitude_rows(
    lin: AttentionLinearization, rr: RopeRows, ws: Tensor, wr: Tensor
) -> RopeRows:
    r"""The rotary heads' rows of the magnitude operator (docs/rounding.md §3.1).

    The rotary products (:func:`meanfield.jacobian.jvp`, docs/derivations/jacobian_products.md
    §3b) are the closed form of the other heads with rotated rows, so their magnitude rows are
    those of :func:`magnitude_linearization` with every rotation replaced by its entrywise bound
    (:class:`_RotationMagnitude`): queries :math:`\alpha(|Q||x_i| + \mathrm{swap})`, keys
    :math:`\bar k_l + \frac1n\sum_j\bar k_j` (the products centre the rotated keys by their
    mean), tangent rows through :math:`|Q|`, :math:`|K|` and the bound, the weighted centred and
    uncentred value rows, and the mean term negated. The stored attention matrices are kept.
    """
    X = lin.X
    aX = X.abs()
    n = lin.n
    ropes = tuple(
        None if r is None else _RotationMagnitude(r.inv_freq, r.attention_scaling) for r in rr.ropes
    )
    Q, K, V = rr.Q.abs(), rr.K.abs(), rr.V.abs()

    def rot(Z: Tensor) -> Tensor:
        return rotate_some(ropes, Z, rr.index)

    q = rot(torch.einsum("...nd,hkd->...hnk", aX, Q))
    k = rot(torch.einsum("...nd,hkd->...hnk", aX, K))
    # computed centring k_l - mean(k): within the magnitudes below to gamma_{n+2}, covered by eta
    kc = k + k.mean(-2, keepdim=True) * (1 + 2 * gamma(n + 4))
    xc = (X - lin.x_bar).abs() * (1 + 2 * U64)  # >= |x_l - x_bar|
    Xv = torch.einsum("...nd,hvd->...hnv", aX, V)
    Xcv = torch.einsum("...nd,hvd->...hnv", xc, V)
    abv = torch.einsum("...nd,hvd->...hnv", lin.x_bar.abs(), V)
    block = lin._causal_block()
    Mv = attend(rr.P, Xv, block) * (1 + 2 * gamma(n + lin.d + 4))  # >= |V| sum_l P_il |x_l|
    unc = Mv + abv
    # |V(m_i - x_bar)| from the computed rows: their error is below gamma_{n+d+4} P |V||x - x_bar|
    cen = rr.VMc.abs() + 2 * gamma(n + lin.d + 4) * attend(rr.P, Xcv, block)
    Ms = ws * cen + wr * unc
    return dataclasses.replace(
        rr, q=q, kc=kc, VXc=ws * Xcv + wr * (Xv + abv), VMc=-Ms, Q=Q, K=K, V=V, ropes=ropes,
    )  # fmt: skip


def magnitude_norm_upper(mlin: AttentionLinearization, geometry: ProductGeometry) -> Tensor:
    r"""Upper bound on :math:`\||J|_{\rm mag}\|_2` (docs/rounding.md §4.2).

    Collatz–Wielandt with the all-ones vector: :math:`\|M\|_2^2\le\max_i(M^\top M\mathbf 1)_i`
    for a nonnegative :math:`M`; two products. Sums of nonnegative numbers are computed with
    relative error below :math:`\gamma_K`, covered by the factor returned.
    """
    ones = mlin.X.new_ones(mlin.batch_shape + (mlin.n, mlin.d))
    w = vjp(mlin, jvp(mlin, ones, geometry=geometry), geometry=geometry)
    bound = w.flatten(-2).amax(-1).clamp_min(0).sqrt()
    return bound * (1 + 2 * gamma(4 * (mlin.n + mlin.d) + 64))


def magnitude_vector_norm(
    mlin: AttentionLinearization, v: Tensor, geometry: ProductGeometry
) -> Tensor:
    r"""Upper bound on :math:`\||J|_{\rm mag}|v|\|_2` for one vector per batch element.

    One product of the magnitude operator with :math:`|v|`: every term is nonnegative, so the
    computed sums carry a relative error below :math:`\gamma_K`, covered by the factor applied
    (docs/rounding.md §4.1).
    """
    shape = mlin.batch_shape + (mlin.n, mlin.d)
    w = jvp(mlin, v.abs().to(torch.float64).reshape(shape), geometry=geometry).flatten(-2)
    return torch.linalg.vector_norm(w, dim=-1) * (1 + 2 * gamma(4 * (mlin.n + mlin.d) + 64))


def lower_from_product(
    s: Tensor,
    v: Tensor,
    mag_norm: Tensor,
    model: ErrorModel,
    n_out: int,
    mag_v: Tensor | None = None,
) -> Tensor:
    r"""Certified lower bound on :math:`\|J\|_2` from ``s`` :math:`=\|\widehat{Jv}\|` (float64).

    .. math:: \|J\|_2\ge\frac{s(1-\gamma_N)-\eta\,m_v(1+\gamma_N)}{\|v\|(1+\gamma_N)}

    (docs/rounding.md §4.1), clamped at 0, where :math:`m_v` bounds
    :math:`\||J|_{\rm mag}|v|\|_2`: ``mag_v`` from :func:`magnitude_vector_norm` when given
    (the entrywise model applied to this vector), else :math:`\||J|_{\rm mag}\|_2\|v\|` with
    ``mag_norm`` from :func:`magnitude_norm_upper`. ``n_out`` is the length of :math:`Jv`.
    """
    nv = torch.linalg.vector_norm(v, dim=-1)
    return lower_from_norm(s, nv, v.shape[-1], mag_norm, model, n_out, mag_v)


def lower_from_norm(
    s: Tensor,
    nv: Tensor,
    n_in: int,
    mag_norm: Tensor,
    model: ErrorModel,
    n_out: int,
    mag_v: Tensor | None = None,
) -> Tensor:
    r""":func:`lower_from_product` from the norm ``nv`` of :math:`v` and its length ``n_in``.

    The solver's width rule predicts the certified lower end with it before a vector is chosen.
    """
    gN = gamma(n_out + n_in + 8)
    m_v = mag_norm * nv if mag_v is None else torch.minimum(mag_v, mag_norm * nv)
    err = model.eta * m_v * (1 + gN)
    low = (s * (1 - gN) - err) / (nv * (1 + gN)) * (1 - 4 * U64)
    low = torch.where(torch.isfinite(low), low, torch.zeros_like(low))
    return low.clamp_min(0.0)


def upper_margin(mag_norm: Tensor, model: ErrorModel, upper: Tensor) -> Tensor:
    r"""Add the evaluation error to a bound certified for the *computed* operator.

    :math:`\|J\|_2\le\|\hat J\|_2+\eta\,\||J|_{\rm mag}\|_2` (docs/rounding.md §4.2), rounded
    up.
    """
    out = (upper + model.eta * mag_norm) * (1 + 4 * U64)
    return torch.where(torch.isnan(out), math.inf, out)


# ------------------------------------------------------------------------------ scale safety
def _log2_absmax(t: Tensor | None) -> float:
    if t is None or t.numel() == 0:
        return 0.0
    m = float(t.detach().abs().amax())
    if m == 0.0:
        return 0.0
    return math.log2(m) if math.isfinite(m) else 1024.0


def scale_exponent(lin: AttentionLinearization, threshold: int = 128) -> int:
    r"""A binary exponent :math:`e` with :math:`2^{-e}\|J\|_2` of order one (docs/rounding.md §5).

    A crude magnitude estimate assembled in the log domain from the largest entries of
    :math:`W_h` and :math:`V_h` (head by head: the layer depends on them through
    :math:`W_hV_h` only, so one head's large :math:`V_h` is not paired with another's large
    :math:`W_h`), :math:`\tilde P`, :math:`A` (or :math:`Q, K`) and :math:`X`; it only has to be
    right within a few hundred binary orders of magnitude. Estimates within
    :math:`2^{\pm\mathrm{threshold}}` give :math:`e = 0` (nothing to protect against).
    """
    heads = lin.params.heads
    pairs = [(lin.W[h], lin.V[a]) for a, h in enumerate(lin.analytic_heads)]
    pairs += [(lin.W[h], heads[h].V) for h in lin.rope_heads]
    log_p = max(0.0, _log2_absmax(lin.P_w)) + math.log2(max(lin.n, 1))
    log_b = _log2_absmax(lin.B) + math.log2(max(lin.d, 1))
    return _exponent(lin, pairs, log_p, log_b, threshold)


def _exponent(
    lin: AttentionLinearization | StreamingLinearization,
    pairs: list[tuple[Tensor, Tensor]],
    log_p: float,
    log_b: float,
    threshold: int,
) -> int:
    r"""The exponent of :func:`scale_exponent` from the magnitudes in the log domain.

    ``pairs`` are the heads' :math:`(W_h, V_h)`, ``log_p`` and ``log_b`` the binary logarithms
    of :math:`\max\tilde P` (times :math:`n`) and of :math:`\max|b_i|`; :math:`\max|x|` is
    read from ``lin.X``.
    """
    logs = [
        _log2_absmax(W) + _log2_absmax(V)
        for W, V in pairs
        if bool(W.detach().abs().amax() > 0) and bool(V.detach().abs().amax() > 0)
    ]  # a head whose W_h or V_h is zero contributes nothing
    log_wv = (max(logs) if logs else 0.0) + math.log2(max(lin.d, 1))
    log_x = _log2_absmax(lin.X) + 1
    geo = max(0.0, log_b + log_x)  # log2 of |b| |x - m|, the softmax term
    e = round(log_wv + log_p + geo)
    if abs(e) <= threshold:  # far from overflow and underflow: leave the operator as it is
        return 0
    return int(max(-_MAX_EXP, min(_MAX_EXP, e)))


def scale_of(N: Tensor) -> int:
    """Binary exponent of the largest finite entry of ``N`` (0 when none)."""
    if N.numel() == 0:
        return 0
    a = N.detach().abs()
    m = float(torch.where(torch.isfinite(a), a, 0.0).amax())
    if m == 0.0:
        return 0
    return int(max(-_MAX_EXP, min(_MAX_EXP, math.frexp(m)[1])))


def scaled(lin: AttentionLinearization, e: int) -> AttentionLinearization:
    """``lin`` with the output maps ``W_h`` multiplied by ``2**-e`` (exact), so ``J -> 2**-e J``."""
    if e == 0:
        return lin
    return dataclasses.replace(lin, W=unscale(lin.W, -e))


def scaled_params(params: Params, e: int) -> Params:
    """Parameters whose layer is ``2**-e`` times the original (``W^O`` or every ``V_h`` scaled).

    Used for the block-norm certificate, which reads the weight norms from the parameters.
    """
    if e == 0:
        return params

    def head(h: AttentionParams) -> AttentionParams:
        return AttentionParams(h.A, unscale(h.V, -e), c=h.c, b=h.b, Q=h.Q, K=h.K, rope=h.rope)

    if isinstance(params, AttentionParams):
        return head(params)
    if params.W_O is not None:
        return MultiHeadParams(params.heads, W_O=unscale(params.W_O, -e), b_O=params.b_O)
    return MultiHeadParams(tuple(head(h) for h in params.heads))


def unscale(x: Tensor, e: int, power: int = 1) -> Tensor:
    """``x * 2**(power * e)`` in float64 (overflow gives ``inf``)."""
    if e == 0:
        return x
    return torch.ldexp(x, torch.tensor(power * e, device=x.device))


# ------------------------------------------------------------------- the streaming products
def _rope_rounding(lin: StreamingLinearization, u: float = U64) -> float:
    """Relative error of one computed rotation of the streaming path's rotary rows."""
    ropes = []
    for g in lin.groups:
        ropes += list(g.ropes or ()) + [r for r in (g.var.ropes if g.var else ()) if r is not None]
    return _rotation_rounding(lin, ropes, u)


@dataclasses.dataclass(frozen=True)
class _VariantTerms:
    r"""What one tile pass reads from a group of variant heads (docs/rounding.md §11.4).

    Maxima over the admissible entries (batch shape): ``S`` of the logit magnitudes
    :math:`\bar q_i\cdot\bar k_l` (magnitude rows), ``pre`` of :math:`|\tilde s_{il}|` before the
    cap, ``logit`` of the final :math:`|\ell_{il}|`, ``alibi`` of :math:`|m(\tau_l - \tau_i)|`;
    the row ``spread`` and ``big`` as for the other heads; ``k`` the head-space width, ``cap``
    the smallest cap (``inf`` without), ``cap_max`` the largest (``inf`` when a head has none),
    the norms' :class:`NormStats`.
    """

    S: Tensor
    pre: Tensor
    logit: Tensor
    alibi: Tensor
    spread: Tensor
    big: Tensor
    k: int
    cap: float
    cap_max: float
    q_stats: NormStats | None
    k_stats: NormStats | None

    def rel(self, u: float, d: int) -> Tensor:
        """Bound on the relative error of the computed RMS factors (0 without norms)."""
        out = torch.zeros_like(self.S)
        for st in (self.q_stats, self.k_stats):
            if st is not None:
                out = torch.maximum(out, norm_relative_error(st, d, u))
        return out

    def rho_v(self, u: float, d: int) -> Tensor:
        r""":math:`\rho_v`: rows and tangent rows within :math:`\rho_v` times their magnitude rows."""
        rel = self.rel(u, d)
        gd = gamma(d + 1, u)
        row = (gd + rel + 3 * u) * (1 + rel) * (1 + 4 * u)
        tan = (1 + rel) ** 3 * (1 + gamma(self.k, u) + 2 * gd) * (1 + gd) * (1 + 6 * u) - 1
        return ((1 + torch.maximum(row, tan)) * (1 + u) - 1) * (1 + 4 * U64)

    def pre_delta(self, u: float, d: int, rot: float) -> Tensor:
        r"""Bound on :math:`|\hat{\tilde s}_{il} - \tilde s_{il}|` (two rows, one inner product)."""
        coef = (1 + self.rho_v(u, d)).square() * (1 + rot) ** 2 * (1 + gamma(self.k + 4, u)) - 1
        return coef * self.S * (1 + 2 * gamma(self.k + d + 4))

    def delta(self, u: float, d: int, rot: float) -> Tensor:
        r"""Bound on :math:`|\hat\ell_{il} - \ell_{il}|`.

        The cap is 1-Lipschitz and bounded: a capped logit moves by at most :math:`2\kappa`
        (the largest cap of the group, used only when every head is capped); its division, tanh
        and product, ALiBi's product and the additions add :math:`8u` of the magnitudes.
        """
        extra = 8 * u * (self.pre + self.logit + self.alibi)
        pre = self.pre_delta(u, d, rot)
        if math.isfinite(self.cap_max):  # a capped logit moves by at most 2 kappa
            pre = torch.clamp_max(pre, 2 * self.cap_max * (1 + 4 * U64))
        return (pre + extra) * (1 + 4 * U64)

    def gate_error(self, u: float, d: int, rot: float) -> Tensor:
        r"""The gate's relative error :math:`\varepsilon_g` (0 without a cap).

        :math:`|\log\hat g - \log g|\le2|\delta\tilde s|/\kappa` (:math:`|(\log\cosh)'|\le1`)
        plus the division, ``cosh`` (4 ulp assumed), reciprocal and square.
        """
        if not math.isfinite(self.cap):
            return torch.zeros_like(self.S)
        t = 2 * (self.pre_delta(u, d, rot) + u * self.pre) / self.cap + 12 * u
        return torch.expm1(t * (1 + 4 * U64)) * (1 + 4 * U64)


def _variant_tiles(mlin: StreamingLinearization, g: HeadGroup) -> _VariantTerms:
    """One pass over the tiles of a group of variant heads of the magnitude linearisation."""
    var = g.var
    assert var is not None
    batch = mlin.batch_shape
    z = mlin.X.new_zeros(batch, dtype=torch.float64)
    S_max, pre_max, L_max, A_max = z.clone(), z.clone(), z.clone(), z.clone()
    shape = g.q.shape[:-1]
    hi = mlin.X.new_full(shape, -math.inf, dtype=torch.float64)
    lo = mlin.X.new_full(shape, math.inf, dtype=torch.float64)
    nb = len(batch)

    def top(t: Tensor, keep: Tensor) -> Tensor:
        return torch.where(keep, t, 0.0).flatten(nb).amax(-1)

    for sl, ks in mlin.tiles(g):
        L, pre = mlin.tile_scores(g, sl, ks)
        keep = L > -math.inf
        S = g.q[..., sl, :] @ g.kc[..., ks, :].mT
        raw = g.logit_q[..., sl, :] @ g.logit_kc[..., ks, :].mT if pre is None else pre
        S_max = torch.maximum(S_max, top(S, keep))
        pre_max = torch.maximum(pre_max, top(raw.abs(), keep))
        L_max = torch.maximum(L_max, top(L.abs(), keep))
        if var.alibi is not None:
            qi, ki = mlin.tile_positions(sl, ks)
            A = var.alibi.abs() * (ki.unsqueeze(-2) - qi.unsqueeze(-1)).abs()
            A_max = torch.maximum(A_max, top(A.expand(L.shape), keep))
        hi[..., sl] = torch.maximum(hi[..., sl], L.amax(-1))
        lo[..., sl] = torch.minimum(lo[..., sl], torch.where(keep, L, math.inf).amin(-1))
    row = torch.where(torch.isfinite(hi) & torch.isfinite(lo), hi - lo, 0.0)
    cap = math.inf if var.cap is None else float(var.cap.amin())
    cap_max = math.inf if var.cap is None else float(var.cap.amax())
    return _VariantTerms(
        S=S_max, pre=pre_max, logit=L_max, alibi=A_max, spread=row.flatten(nb).amax(-1),
        big=L_max, k=g.q.shape[-1], cap=cap, cap_max=cap_max, q_stats=var.q_stats,
        k_stats=var.k_stats,
    )  # fmt: skip


def streaming_error_model(mlin: StreamingLinearization, unit: float = U64) -> ErrorModel:
    r"""Error model of the streaming products, from their magnitude operator (docs/rounding.md §11).

    ``mlin`` is :func:`~meanfield.jacobian.streaming.streaming_magnitude` of the float64
    streaming linearisation. One pass over the tiles reads, per row, the largest and smallest
    admissible logit and the largest logit magnitude :math:`\bar s_{il}` (the logit evaluated on
    absolute values). From them: the entrywise relative error :math:`\varepsilon` of every
    recomputed :math:`P_{il}` and :math:`\tilde P_{il}` (logits, online log-normaliser, final
    exponential: §11.1), and the coefficient :math:`\eta` of
    :math:`|\widehat{Jv} - Jv|\le\eta\,\hat M|v|` for the computed magnitude operator
    :math:`\hat M` (§11.2). Returned as an :class:`ErrorModel` with ``eta_s = 0`` and
    ``eta_r = eta`` (``eps_s`` holds :math:`\varepsilon`). ``unit``: the unit roundoff of the
    products modelled (float64's, or float32's for a float32 solve's operator, §11.3); the
    magnitude operator itself is always the float64 one.
    """
    X = mlin.X.to(torch.float64)
    n, d = mlin.n, mlin.d
    batch = mlin.batch_shape
    dev = X.device
    aX = X.abs()
    lw64 = None if mlin.log_weights is None else mlin.log_weights.to(torch.float64)
    alw = None if lw64 is None else torch.where(torch.isfinite(lw64), lw64.abs(), 0.0)
    rot = _rope_rounding(mlin, unit)
    rot64 = _rope_rounding(mlin)
    k_top = max(g.q.shape[-1] for g in mlin.groups)
    delta = torch.zeros(batch, dtype=torch.float64, device=dev)
    spread = torch.zeros(batch, dtype=torch.float64, device=dev)
    big = torch.zeros(batch, dtype=torch.float64, device=dev)
    variants: list[_VariantTerms] = []
    for g in mlin.groups:
        k = g.q.shape[-1]
        if g.var is not None:  # heads with variants: §11.4
            vt = _variant_tiles(mlin, g)
            variants.append(vt)
            spread = torch.maximum(spread, vt.spread)
            big = torch.maximum(big, vt.big)
            continue
        akey = None if g.C is None else (aX @ g.C.mT.to(torch.float64)).mT  # (..., G, n)
        if alw is not None:
            akey = alw.unsqueeze(-2) if akey is None else akey + alw.unsqueeze(-2)
        shape = g.q.shape[:-1]
        hi = X.new_full(shape, -math.inf)
        lo = X.new_full(shape, math.inf)
        top = X.new_zeros(shape)
        sbar = X.new_zeros(shape)
        for sl, ks in mlin.tiles():
            L = mlin.tile_logits(g, sl, ks).to(torch.float64)
            keep = L > -math.inf
            S = g.q[..., sl, :].to(torch.float64) @ g.kc[..., ks, :].to(torch.float64).mT
            if akey is not None:
                S = S + akey[..., None, ks]
            hi[..., sl] = torch.maximum(hi[..., sl], L.amax(-1))
            lo[..., sl] = torch.minimum(lo[..., sl], torch.where(keep, L, math.inf).amin(-1))
            top[..., sl] = torch.maximum(top[..., sl], torch.where(keep, L.abs(), 0.0).amax(-1))
            sbar[..., sl] = torch.maximum(sbar[..., sl], torch.where(keep, S, 0.0).amax(-1))
        # |l_hat - l| <= gamma_{k+2d+6} sbar (+ the two rotations), sbar itself rounded
        coef = (gamma(k + 2 * d + 6) + 2 * rot64) * (1 + 2 * gamma(k + d + 4))
        delta = torch.maximum(delta, coef * sbar.flatten(len(batch)).amax(-1))
        row = torch.where(torch.isfinite(hi) & torch.isfinite(lo), hi - lo, 0.0)
        spread = torch.maximum(spread, row.flatten(len(batch)).amax(-1))
        big = torch.maximum(big, top.flatten(len(batch)).amax(-1))
    logn = math.log(max(n, 1))
    key_blocks = mlin.key_blocks
    scale = 1.0 if unit == U64 else unit / U64  # sbar's coefficient, at the unit modelled

    def relative(u: float, coef_scale: float) -> Tensor:
        """The entrywise relative error of the recomputed P at unit roundoff u (§11.1)."""
        # the online log-sum-exp: terms and rescalings (telescoping, <= spread), sums, log, add
        rho = 2 * u * spread + gamma(n + 6 * key_blocks + 8, u)
        r = rho / (1 - rho) + u * (big + 3 * logn + 4)
        worst = delta * coef_scale
        for vt in variants:  # the variant heads' logits (§11.4)
            worst = torch.maximum(worst, vt.delta(u, d, rot64 if u == U64 else rot))
        t = 2 * worst + r + u * (spread + logn + r + 4) + 2 * u
        if alw is not None:  # P~ = exp(log P + half_i - half_l): three more roundings
            t = t + 3 * u * (spread + logn + alw.amax(-1) + 4)
        eps = torch.expm1(t * (1 + 4 * U64)) * (1 + 4 * U64)
        return torch.where(torch.isfinite(eps) & (eps < 0.5), eps, math.inf)

    eps64 = relative(U64, 1.0)
    # gamma_j(u) <= (u / u64) gamma_j(u64) (1 + 2 j u) for the logit coefficient at another unit
    eps = eps64 if unit == U64 else relative(unit, scale * (1 + 2 * (k_top + 2 * d + 6) * unit))
    heads = mlin.params.heads
    dv = sum(h.V.shape[0] for h in heads)
    depth = 4 * (n + d + k_top + dv + mlin.d_out) + 32
    gK, gK64 = gamma(depth, unit), gamma(depth)
    one = 1 + eps
    # variant heads: their rows' and tangents' errors relative to the magnitude rows, and the
    # cap's gate (computed ĝ within eps_g; the magnitude operator uses the float64 ĝ), §11.4
    rows = torch.zeros_like(eps)
    gate = torch.zeros_like(eps)
    gate64 = torch.zeros_like(eps)
    for vt in variants:
        rows = torch.maximum(rows, vt.rho_v(unit, d))
        gate = torch.maximum(gate, vt.gate_error(unit, d, rot))
        gate64 = torch.maximum(gate64, vt.gate_error(U64, d, rot64))
    eta = (
        (one.square() * (1 + rot) ** 2 * (1 + rows).square() * (1 + gate) * (1 + gK) - 1)
        * (1 + 16 * gK64)
        / ((1 - eps64).square() * (1 - gate64))
    )
    eta = torch.where(torch.isfinite(eps) & torch.isfinite(eps64), eta * (1 + 8 * U64), math.inf)
    return ErrorModel(eta_s=torch.zeros_like(eta), eta_r=eta, eps_s=eps, depth=depth)


def streaming_magnitude_split(
    lin: StreamingLinearization,
    mlin: StreamingLinearization,
    models: list[tuple[float, ErrorModel]],
) -> StreamingLinearization:
    r"""The composite magnitude operator of docs/rounding.md §11.5, for the norms of the margins.

    ``lin`` is the float64 streaming linearisation, ``mlin`` its :func:`streaming_magnitude` and
    ``models`` the error models ``(unit, model)`` the margins use with it. Each group of plain,
    factored or rotary heads becomes four groups whose products add up: one with the computed
    rows' magnitudes :math:`\tilde f = |\hat f| + \rho_f\bar f` (at least the exact and the
    computed row), and for each kind of row :math:`f\in\{q, k, v\}` one with that row's
    magnitude :math:`\bar f` (the chains of :math:`|Q||x|`, as in ``mlin``) and its output maps
    scaled by :math:`c_f = \max_u\rho_f(u)(1 + 16\gamma_K)/((1-\varepsilon)^2\eta_u)`. Then
    :math:`|\widehat{Jh} - Jh|\le\eta_u M|h|` for each unit modelled, with :math:`M` the sum,
    which is typically hundreds of times smaller than ``mlin`` where :math:`|Q||x|\gg|Qx|`.
    Groups of variant heads keep ``mlin``'s group (§11.4).
    """
    d = lin.d

    def rho(unit: float, factored: bool) -> dict[str, float]:
        """The rows' errors relative to their magnitude rows (computation and rotation)."""
        rot = _rope_rounding(lin, unit)
        return {
            "q": gamma(d + 2, unit) + 2 * rot if factored else 0.0,
            "k": gamma(d + 3, unit) + 2 * rot + 2 * unit,
            "v": gamma(d + 3, unit),
        }

    out = []
    for g, mg in zip(lin.groups, mlin.groups):
        if g.var is not None:
            tight, loose, coef = _variant_split(lin, g, mg, mlin, models)
        else:
            coef = {"q": 0.0, "k": 0.0, "v": 0.0}
            for unit, scale in _model_scales(models, mlin, gated=False):
                for key, r in rho(unit, g.Q is not None).items():
                    coef[key] = max(coef[key], r * scale)
            rho64 = rho(U64, g.Q is not None)
            tight = _tight_group(lin, g, mg, rho64["q"], rho64["k"], rho64["v"])
            loose = [
                ("q", replace(tight, q=mg.q)),
                ("k", replace(tight, kc=mg.kc, km=mg.km)),
                ("v", replace(tight, vc=mg.vc, vm=mg.vm)),
            ]
        out.append(tight)
        for key, group in loose:
            c = coef[key]
            if c > 0:
                out.append(replace(group, W=group.W * (c * (1 + 4 * U64))))
    return replace(mlin, groups=tuple(out))


def _model_scales(
    models: list[tuple[float, ErrorModel]], mlin: StreamingLinearization, *, gated: bool
) -> Iterator[tuple[float, float]]:
    r"""``(unit, scale)`` of each rounding model in force (some finite :math:`\eta`), §11.5.

    The scale :math:`(1 + 16\gamma)/((1 - \epsilon_s)^2\min\eta)` turns a row's relative error
    into its coefficient in the split magnitude operator; ``gated`` multiplies it by 4/3, the bound
    on the variant heads' gate :math:`1/(1 - \epsilon_g)` wherever the model is in force
    (:math:`\eta \le 1/4`).
    """
    for unit, model in models:
        finite = model.eta[torch.isfinite(model.eta)]
        if finite.numel() == 0:
            continue
        eps = float(model.eps_s[torch.isfinite(model.eps_s)].amax())
        num = 1 + 16 * _streaming_gamma(mlin)
        if gated:
            num = num * 4 / 3
        yield unit, num / ((1 - eps) ** 2 * float(finite.amin()))


def _tight_group(
    lin: StreamingLinearization, g: HeadGroup, mg: HeadGroup, rq: float, rk: float, rv: float
) -> HeadGroup:
    r"""``mg`` with the computed rows' magnitudes :math:`|\hat f| + \rho_f\bar f` (§11.5).

    ``rq``, ``rk``, ``rv`` are the float64 rows' errors :math:`\rho_f` of the queries, keys and
    values of ``g``; the mean term, :math:`P` times the value rows over the tiles, is stored
    negated as in ``mg``.
    """
    uk = g.kc.abs() + rk * mg.kc
    uv = g.vc.abs() + rv * mg.vc
    avm = torch.zeros_like(uv)
    for sl, ks in lin.tiles(g):
        P, _ = lin.tile_attention(g, sl, ks)
        avm[..., sl, :] += P @ uv[..., ks, :]
    return replace(mg, q=g.q.abs() + rq * mg.q, kc=uk, km=uk, vc=uv, vm=-avm)


def _variant_split(
    lin: StreamingLinearization,
    g: HeadGroup,
    mg: HeadGroup,
    mlin: StreamingLinearization,
    models: list[tuple[float, ErrorModel]],
) -> tuple[HeadGroup, list[tuple[str, HeadGroup]], dict[str, float]]:
    r"""The groups of :func:`streaming_magnitude_split` for a group of variant heads (§11.5).

    The rows as for the other heads with :math:`\rho_v` of §11.4; the QK-norms' tangent maps at
    the computed pre-norm rows' bound :math:`\tilde u = |\hat u| + \gamma_{d+1}\bar u` in the
    first group, and for each norm one group with its :class:`MixedNorm` (the pre-norm row's own
    error, :math:`\gamma_{d+1}`), so that a query or key whose pre-norm row cancels no longer
    carries :math:`\bar\rho^3\bar u\bar u^\top` at the chain magnitude. Returned as the first
    group, the others with the key of their coefficient, and the coefficients.
    """
    var = mg.var
    assert var is not None
    d = lin.d
    terms = _VariantTerms(
        S=torch.zeros(lin.batch_shape, dtype=torch.float64, device=lin.X.device),
        pre=torch.zeros(()), logit=torch.zeros(()), alibi=torch.zeros(()), spread=torch.zeros(()),
        big=torch.zeros(()), k=g.q.shape[-1], cap=math.inf, cap_max=math.inf,
        q_stats=var.q_stats, k_stats=var.k_stats,
    )  # fmt: skip

    def rows_rho(unit: float) -> float:
        return float(terms.rho_v(unit, d).amax())

    coef = {"row": 0.0, "v": 0.0, "norm": 0.0}
    for unit, scale in _model_scales(models, mlin, gated=True):
        rel = float(terms.rel(unit, d).amax())
        coef["row"] = max(coef["row"], rows_rho(unit) * scale)
        coef["v"] = max(coef["v"], gamma(d + 3, unit) * scale)
        coef["norm"] = max(coef["norm"], gamma(d + 1, unit) * (1 + rel) ** 3 * scale)
    rho64 = rows_rho(U64)

    def tight_norm(
        norm: NormRows | MixedNorm | None, stats: NormStats | None
    ) -> tuple[NormRows | None, MixedNorm | None]:
        if norm is None or stats is None or isinstance(norm, MixedNorm):
            return None, None
        has = stats.has.reshape(-1, 1, 1)
        ut = torch.where(has, (stats.u.abs() + gamma(d + 1) * stats.ubar) * (1 + 2 * U64), 0.0)
        mixed = MixedNorm(u=norm.u, u2=ut, rho=norm.rho, w=norm.w)
        return NormRows(u=ut, rho=norm.rho, w=norm.w), mixed

    tq, mq = tight_norm(var.q_norm, var.q_stats)
    tk, mk = tight_norm(var.k_norm, var.k_stats)
    tvar = replace(
        var,
        q_norm=var.q_norm if tq is None else tq,
        k_norm=var.k_norm if tk is None else tk,
    )
    tight = replace(_tight_group(lin, g, mg, rho64, rho64, gamma(d + 3)), var=tvar)
    loose = [
        ("row", replace(tight, q=mg.q)),
        ("row", replace(tight, kc=mg.kc, km=mg.km)),
        ("v", replace(tight, vc=mg.vc, vm=mg.vm)),
    ]
    if mq is not None:
        loose.append(("norm", replace(tight, var=replace(tvar, q_norm=mq))))
    if mk is not None:
        loose.append(("norm", replace(tight, var=replace(tvar, k_norm=mk))))
    return tight, loose, coef


def _streaming_gamma(mlin: StreamingLinearization) -> float:
    heads = mlin.params.heads
    k = max(g.q.shape[-1] for g in mlin.groups)
    dv = sum(h.V.shape[0] for h in heads)
    return gamma(4 * (mlin.n + mlin.d + k + dv + mlin.d_out) + 64)


def streaming_magnitude_norm(mlin: StreamingLinearization, geometry: ProductGeometry) -> Tensor:
    r"""Upper bound on :math:`\|\hat M\|_2` of the streaming magnitude operator (§11.2).

    Collatz–Wielandt with the all-ones vector, as :func:`magnitude_norm_upper`: two products.
    """
    ones = mlin.X.new_ones(mlin.batch_shape + (mlin.n, mlin.d), dtype=torch.float64)
    w = streaming_vjp(mlin, streaming_jvp(mlin, ones, geometry=geometry), geometry=geometry)
    bound = w.flatten(-2).amax(-1).clamp_min(0).sqrt()
    return bound * (1 + 2 * _streaming_gamma(mlin))


def streaming_magnitude_vector_norm(
    mlin: StreamingLinearization, v: Tensor, geometry: ProductGeometry
) -> Tensor:
    r"""Upper bound on :math:`\|\hat M|v|\|_2` for one flattened vector per batch element."""
    shape = mlin.batch_shape + (mlin.n, mlin.d)
    w = streaming_jvp(mlin, v.abs().to(torch.float64).reshape(shape), geometry=geometry)
    return torch.linalg.vector_norm(w.flatten(-2), dim=-1) * (1 + 2 * _streaming_gamma(mlin))


def streaming_scale_exponent(lin: StreamingLinearization, threshold: int = 128) -> int:
    r""":func:`scale_exponent` for the streaming linearisation (docs/rounding.md §5, §11).

    The same crude magnitude, read from the rows: :math:`\max|W_h|\max|V_h|` per head,
    :math:`\max\tilde P_{il}` (one pass over the tiles when the measure is weighted, else
    :math:`P\le1`), :math:`\max|x|` and :math:`|b_i|\le k\max|q_i|\max|K| + \max|c|d`.
    """
    n, d = lin.n, lin.d
    log_b = 0.0
    for g in lin.groups:
        k = g.q.shape[-1]
        lb = _log2_absmax(g.q) + _log2_absmax(g.K) + math.log2(max(k, 1))
        if g.C is not None:
            lb = max(lb, _log2_absmax(g.C) + math.log2(max(d, 1)))
        log_b = max(log_b, lb)
    log_p = math.log2(max(n, 1))
    lw = lin.log_weights
    if lw is not None and bool(torch.isfinite(lw).all()):
        half = 0.5 * (lw - lw.amax(-1, keepdim=True)).unsqueeze(-2)
        top = 0.0
        for g in lin.groups:
            for sl, ks in lin.tiles():
                _, Pw = lin.tile_attention(g, sl, ks, half)
                top = max(top, float(Pw.detach().amax()))
        log_p += max(0.0, math.log2(top) if 0 < top < math.inf else 1024.0 * (top > 0))
    pairs = [(g.W[a], g.V[a]) for g in lin.groups for a in range(g.size)]
    return _exponent(lin, pairs, log_p, log_b, threshold)
