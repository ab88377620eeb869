r"""The random layer of the ``bounded_logits`` stage, its four forms, the tied input, the fit.

The layer (:func:`layer_weights`, :func:`layer_params`) is one causal multi-head attention layer
with grouped key/value heads, Gaussian weights and no rotary embedding; its four forms share the
weights and differ in one option of :meth:`meanfield.MultiHeadParams.from_qkv` each: none
(plain), ``q_norm``/``k_norm`` (QK-norm, with the logit scale as ``logit_scale``), ``softcap``
and ``window``.

The input (:func:`tied_input`, ours) is a worst-case-style construction for the large-radius
growth of sequences (docs/theory.md §1, where :math:`\|T_2\|` grows like
:math:`\|A\|_2R^2`): tokens repeat the pattern :math:`(Rv, -Rv, Ru)`, with :math:`u` the unit
eigenvector of the smallest eigenvalue of :math:`\sum_h(A_h + A_h^\top)/2` (so that a query
:math:`Ru` gives the other copies of itself little weight in most heads) and :math:`v` a seeded
random unit vector orthogonal to :math:`u` and to every :math:`A_h^\top u`. Then every head's
logit of a query :math:`Ru` on the keys :math:`\pm Rv` is exactly 0 at every :math:`R`, for the
plain, capped and windowed forms and also under QK-norm (the normalised vectors stay
orthogonal): the softmax stays split between :math:`Rv` and :math:`-Rv`, which lie
:math:`2R` apart, while the derivative of the plain logit grows like :math:`R`. Unlike the
scaled random inputs of figure F7 (whose constant converges as :math:`R` grows,
docs/theory.md §7), the plain form's constant here keeps growing, like :math:`R^2`. A second
family (``"null_query"``) takes :math:`u` in the null space of the first head's query map: under
QK-norm that head then normalises a zero query, where the RMSNorm's derivative is
:math:`1/\sqrt\varepsilon`, and the QK-norm constant grows linearly in :math:`R` (the rate of
its bound, :func:`theory.bounds.bounded_logits.qk_norm_sqrt_n_upper`).

:func:`growth_exponent`: the least-squares slope of :math:`\log\|J\|_2` against :math:`\log R`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "FAMILIES",
    "growth_exponent",
    "head_facts",
    "layer_params",
    "layer_weights",
    "largest_logit",
    "tied_input",
]


def layer_weights(
    d: int, n_heads: int, n_kv_heads: int, head_dim: int, seed: int
) -> dict[str, Any]:
    """Float64 Gaussian projection weights (``nn.Linear`` layout) from a CPU generator.

    ``W_Q`` (H k, d), ``W_K`` and ``W_V`` (H_kv k, d) with variance ``1/d``; ``W_O`` (d, H k)
    with variance ``1/(H k)``. The global RNG is left untouched.
    """
    import torch

    g = torch.Generator().manual_seed(int(seed))
    f64 = torch.float64
    hk, kvk = n_heads * head_dim, n_kv_heads * head_dim
    return {
        "W_Q": torch.randn(hk, d, generator=g, dtype=f64) / math.sqrt(d),
        "W_K": torch.randn(kvk, d, generator=g, dtype=f64) / math.sqrt(d),
        "W_V": torch.randn(kvk, d, generator=g, dtype=f64) / math.sqrt(d),
        "W_O": torch.randn(d, hk, generator=g, dtype=f64) / math.sqrt(hk),
    }


def layer_params(
    weights: Mapping[str, Any],
    form: str,
    *,
    n_heads: int,
    n_kv_heads: int,
    softcap: float,
    window: int,
    rms_eps: float,
) -> Any:
    """The :class:`meanfield.MultiHeadParams` of one form of the layer (logit scale 1/√k).

    ``"plain"``: no option; ``"qk_norm"``: RMSNorm with weights 1 and ``rms_eps`` on q and k;
    ``"softcap"``: the cap ``softcap``; ``"window"``: the sliding window ``window``. A one-line
    ValueError for another form.
    """
    import torch

    from meanfield import MultiHeadParams
    from meanfield.params import RMSNorm

    k = weights["W_Q"].shape[0] // int(n_heads)
    opts: dict[str, Any]
    if form == "plain":
        opts = {}
    elif form == "qk_norm":
        w = torch.ones(k, dtype=weights["W_Q"].dtype)
        opts = {"q_norm": RMSNorm(w, rms_eps), "k_norm": RMSNorm(w.clone(), rms_eps)}
    elif form == "softcap":
        opts = {"softcap": float(softcap)}
    elif form == "window":
        opts = {"window": int(window)}
    else:
        raise ValueError(f"unknown form {form!r}; known: plain, qk_norm, softcap, window")
    return MultiHeadParams.from_qkv(
        weights["W_Q"],
        weights["W_K"],
        weights["W_V"],
        weights["W_O"],
        n_heads=int(n_heads),
        n_kv_heads=int(n_kv_heads),
        **opts,
    )


def _score_matrices(weights: Mapping[str, Any], n_heads: int, n_kv_heads: int) -> list[Any]:
    """Every query head's score matrix A_h = Q_hᵀ K_g(h) / √k (float64 numpy)."""
    WQ = weights["W_Q"].numpy()
    WK = weights["W_K"].numpy()
    k = WQ.shape[0] // n_heads
    rep = n_heads // n_kv_heads
    return [
        WQ[h * k : (h + 1) * k].T @ WK[(h // rep) * k : (h // rep + 1) * k] / math.sqrt(k)
        for h in range(n_heads)
    ]


#: The input constructions: ``"tied"`` (u over all of R^d) and ``"null_query"`` (u in the null
#: space of the first head's query map).
FAMILIES = ("tied", "null_query")


def tied_input(
    weights: Mapping[str, Any],
    n: int,
    *,
    n_heads: int,
    n_kv_heads: int,
    seed: int,
    family: str = "tied",
) -> Any:
    r"""A tied input of unit radius (module docstring): tokens ``v, -v, u, v, -v, u, ...``.

    ``family="tied"``: :math:`u` minimises :math:`u^\top Su`, :math:`S = \sum_h(A_h +
    A_h^\top)/2`, over the unit sphere; ``"null_query"``: over the unit vectors with
    :math:`Q_0u = 0` (the null space of the first head's query map, so that under QK-norm that
    head normalises a zero query, where the RMSNorm's derivative is :math:`1/\sqrt\varepsilon`).
    :math:`v`: drawn from ``seed``, orthogonal to :math:`u` and to every :math:`A_h^\top u`.
    Returns a float64 tensor (n, d) whose rows have norm 1 (scale it by R). Every head's plain
    logit :math:`u^\top A_hv` is 0 up to rounding. A one-line ValueError for another family.
    """
    import torch

    if family not in FAMILIES:
        raise ValueError(f"unknown input family {family!r}; known: {', '.join(FAMILIES)}")
    A = _score_matrices(weights, n_heads, n_kv_heads)
    S = sum((a + a.T) / 2.0 for a in A)
    if family == "tied":
        N = np.eye(S.shape[0])
    else:
        k = weights["W_Q"].shape[0] // n_heads
        _, _, vt = np.linalg.svd(weights["W_Q"][:k].numpy())
        N = vt[k:].T  # orthonormal basis of the null space of Q_0 (d > k)
    _, vecs = np.linalg.eigh(N.T @ S @ N)
    u = N @ vecs[:, 0]
    u /= np.linalg.norm(u)
    basis, _ = np.linalg.qr(np.stack([u, *(a.T @ u for a in A)], axis=1))
    rng = np.random.default_rng(int(seed))
    v = rng.standard_normal(u.shape[0])
    v -= basis @ (basis.T @ v)
    v -= basis @ (basis.T @ v)  # twice: orthogonal to rounding
    v /= np.linalg.norm(v)
    pattern = (v, -v, u)
    X = np.stack([pattern[t % 3] for t in range(int(n))])
    return torch.as_tensor(X, dtype=torch.float64)


def largest_logit(X: Any, params: Any, *, window: int | None = None) -> float:
    """The largest |logit| over every head and admissible (causal, windowed) query-key pair."""
    import torch

    from meanfield.attention import head_logits

    n = X.shape[-2]
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    keep = j <= i
    if window is not None:
        keep = keep & (i - j < int(window))
    with torch.no_grad():
        return max(
            float(head_logits(X, X, head).abs().masked_fill(~keep, 0.0).max())
            for head in params.heads
        )


def head_facts(weights: Mapping[str, Any], n_heads: int, n_kv_heads: int) -> list[dict[str, float]]:
    """Per query head: spectral norms of A_h (scale 1/√k included), Q_h, K_h, V_h, W_O's block."""
    WQ, WK, WV, WO = (weights[k].numpy() for k in ("W_Q", "W_K", "W_V", "W_O"))
    k = WQ.shape[0] // n_heads
    rep = n_heads // n_kv_heads
    A = _score_matrices(weights, n_heads, n_kv_heads)
    out = []
    for h in range(n_heads):
        g = h // rep
        out.append(
            {
                "A": float(np.linalg.norm(A[h], 2)),
                "Q": float(np.linalg.norm(WQ[h * k : (h + 1) * k], 2)),
                "K": float(np.linalg.norm(WK[g * k : (g + 1) * k], 2)),
                "V": float(np.linalg.norm(WV[g * k : (g + 1) * k], 2)),
                "W": float(np.linalg.norm(WO[:, h * k : (h + 1) * k], 2)),
            }
        )
    return out


def growth_exponent(R: Sequence[float], value: Sequence[float]) -> float:
    """Least-squares slope of log value against log R (NaN with fewer than 2 usable points)."""
    r = np.asarray(R, dtype=float)
    y = np.asarray(value, dtype=float)
    ok = np.isfinite(r) & np.isfinite(y) & (r > 0) & (y > 0)
    if ok.sum() < 2 or np.unique(r[ok]).size < 2:
        return math.nan
    slope, _ = np.polyfit(np.log(r[ok]), np.log(y[ok]), 1)
    return float(slope)
