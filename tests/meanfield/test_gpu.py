"""CPU/GPU agreement (runs only where CUDA is present; CI has no GPU).

The two devices are not the same computation (other kernels, other reduction orders), so the
outputs are compared to a bound on the rounding of one evaluation of the layer (each device is
within it of the exact value, so the two within twice it), derived as in docs/rounding.md §2-§3
for the output instead of the Jacobian products: ``_rounding_bound``.
"""

from __future__ import annotations

import math

import pytest
import torch

from meanfield import DiracMeasure, MultiHeadParams, attention, self_attention

pytestmark = pytest.mark.gpu


def gamma_k(k: int, u: float) -> float:
    return k * u / (1 - k * u)


def _rounding_bound(X: torch.Tensor, params: MultiHeadParams, masked: bool, u: float):
    """Entrywise bound on ``|fl(f(X)) - f(X)|`` for one evaluation in unit roundoff ``u``.

    First order, with the factor 2 of docs/rounding.md §3 for the higher-order terms (valid while
    the relative coefficient stays below 1/4, asserted). Per head, on the stored numbers (read in
    float64): the logits ``(X Qᵀ)(X Kᵀ)ᵀ + X c`` carry an absolute error at most ``gamma_{d+k+2}``
    times their magnitude ``s̄`` (the same expression on absolute values); the softmax then moves
    relatively by at most ``expm1(2 max s̄ gamma)`` (§2.2), plus ``u (spread + log n + 8) +
    gamma_n`` for the subtraction of the row maximum, the exponentials (a few ulps on any device)
    and the normalising sum (§2.3). The products ``P (X Vᵀ)`` and ``Z W_Oᵀ`` add ``gamma_d``,
    ``gamma_n`` and ``gamma_{H k_v}``; all are relative to the magnitude of the output, the layer
    evaluated on absolute values ``sum_h |W_O,h| (P_h |X| |V_h|ᵀ)`` (plus the biases).
    """
    X = X.double()
    n, d = X.shape[-2], X.shape[-1]
    aX = X.abs()
    allowed = torch.ones(n, n, dtype=torch.bool).tril() if masked else None
    coef = torch.zeros(X.shape[:-2], dtype=torch.float64)
    mags = []
    for h in params.heads:
        Q, K, V = (t.double() for t in (h.Q, h.K, h.V))
        k = Q.shape[0]
        logits = (X @ Q.mT) @ (X @ K.mT).mT
        sbar = (aX @ Q.abs().mT) @ (aX @ K.abs().mT).mT
        if h.c is not None:
            logits = logits + (X @ h.c.double()).unsqueeze(-2)
            sbar = sbar + (aX @ h.c.double().abs()).unsqueeze(-2)
        if allowed is not None:
            logits = logits.masked_fill(~allowed, -math.inf)
            sbar = sbar.masked_fill(~allowed, 0.0)
        P = torch.softmax(logits, dim=-1)
        finite = torch.where(torch.isinf(logits), logits.amax(-1, keepdim=True), logits)
        spread = (finite.amax(-1) - finite.amin(-1)).amax(-1)
        delta = gamma_k(d + k + 2, u) * sbar.flatten(-2).amax(-1)
        eps = torch.expm1(2 * delta) + u * (spread + math.log(n) + 8) + gamma_k(n, u)
        coef = torch.maximum(coef, eps + gamma_k(d, u) + gamma_k(n, u))
        mag = P @ (aX @ V.abs().mT)
        mags.append(mag if h.b is None else mag + h.b.double().abs())
    Z = torch.cat(mags, dim=-1)
    W_O = params.W_O.double()
    coef = coef + gamma_k(W_O.shape[-1], u) + 2 * u
    mag = Z @ W_O.abs().mT
    if params.b_O is not None:
        mag = mag + params.b_O.double().abs()
    assert bool((coef < 0.25).all()), "first-order bound needs a coefficient below 1/4"
    return 2 * coef[..., None, None] * mag


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_attention_agrees_across_devices(masked, dtype):
    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator().manual_seed(0)
    W = [torch.randn(4 * 8, 16, generator=g, dtype=dtype) for _ in range(3)]
    params = MultiHeadParams.from_qkv(*W, torch.randn(16, 32, generator=g, dtype=dtype), n_heads=4)
    X = torch.randn(3, 33, 16, generator=g, dtype=dtype)
    cpu = self_attention(X, params, masked=masked)
    gpu = self_attention(X.cuda(), params.to("cuda"), masked=masked, chunk_size=8)
    assert gpu.device.type == "cuda" and gpu.dtype == dtype
    # each device within the bound of the exact output (the float32 inputs read exactly)
    bound = 2 * _rounding_bound(X, params, masked, torch.finfo(dtype).eps / 2)
    diff = (gpu.cpu().double() - cpu.double()).abs()
    assert bool((diff <= bound).all()), float((diff / bound).max())
    mu = DiracMeasure.from_sequence(X.cuda(), causal=True)
    out = attention(mu, params.to("cuda"), masked=True)
    assert out.points.device.type == "cuda"
