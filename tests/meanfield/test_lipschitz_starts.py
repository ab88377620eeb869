"""The Kronecker start of the matrix-free solvers (meanfield.lipschitz.starts)."""

from __future__ import annotations

import pytest
import torch

from meanfield import DiracMeasure, MultiHeadParams
from meanfield.jacobian import linearize
from meanfield.lipschitz import kronecker_start, local_lipschitz
from meanfield.lipschitz.starts import _mean_attention, _top_right_vector
from meanfield.params import AttentionParams, RotaryEmbedding

from ..tolerances import (
    BRACKET_MARGIN,
    F32_VALUE,
    F64_LANCZOS,
    F64_LANCZOS_COARSE,
    F64_LANCZOS_GAP,
    F64_REDUCTION,
    F64_REWRITTEN,
    F64_ZERO,
)

D64 = torch.float64


def _layer(gen, d, k, H, *, score=1.0, rope=None):
    W_Q, W_K, W_V = (torch.randn(H * k, d, generator=gen, dtype=D64) / d**0.5 for _ in range(3))
    W_O = torch.randn(d, H * k, generator=gen, dtype=D64) / (H * k) ** 0.5
    base = MultiHeadParams.from_qkv(score * W_Q, W_K, W_V, W_O, n_heads=H)
    if rope is None:
        return base
    heads = tuple(AttentionParams(h.A, h.V, Q=h.Q, K=h.K, rope=rope) for h in base.heads)
    return MultiHeadParams(heads, W_O=base.W_O)


@pytest.mark.parametrize("shape", [(40, 40), (30, 50), (3, 20, 20)])
def test_top_right_vector_matches_the_svd_at_small_gaps(gen, shape):
    U = torch.linalg.qr(torch.randn(shape[:-2] + (shape[-2],) * 2, generator=gen, dtype=D64))[0]
    Vm = torch.linalg.qr(torch.randn(shape[:-2] + (shape[-1],) * 2, generator=gen, dtype=D64))[0]
    r = min(shape[-2:])
    s = torch.linspace(1.0, 0.1, r, dtype=D64)
    s[1] = 0.98  # a 2 % gap: power iteration would need hundreds of steps
    M = U[..., :, :r] @ torch.diag_embed(s.expand(shape[:-2] + (r,))) @ Vm[..., :, :r].mT
    v = _top_right_vector(M)
    cos = (v * Vm[..., :, 0]).sum(-1).abs()
    assert bool((cos > 1 - 1e-10).all()), cos
    torch.testing.assert_close(v.norm(dim=-1), torch.ones(shape[:-2], dtype=D64))


def test_value_path_alone_is_exactly_kronecker_and_one_step_finds_it(gen):
    # A = 0: uniform causal attention and no softmax term, so J = P (x) M exactly and
    # ||J|| = ||P|| ||M||; the structured part of the start is the top singular vector
    d, k, H, n = 8, 4, 3, 30
    params = _layer(gen, d, k, H, score=0.0)
    X = torch.randn(n, d, generator=gen, dtype=D64)
    P = torch.tril(torch.ones(n, n, dtype=D64))
    P = P / P.sum(-1, keepdim=True)
    M = params.W_O @ torch.cat([h.V for h in params.heads])
    exact = torch.linalg.matrix_norm(P, 2) * torch.linalg.matrix_norm(M, 2)
    est = local_lipschitz(X, params, masked=True, method="lanczos", tol=1e-10, start="kronecker")
    rand = local_lipschitz(X, params, masked=True, method="lanczos", tol=1e-10)
    torch.testing.assert_close(est.value, exact, rtol=F64_LANCZOS, atol=0)
    torch.testing.assert_close(rand.value, exact, rtol=F64_LANCZOS, atol=0)
    assert int(est.n_matvec) < int(rand.n_matvec)
    lin = linearize(X, params, masked=True)
    x0 = kronecker_start(lin, generator=torch.Generator().manual_seed(0))
    g = torch.randn(x0.shape, generator=torch.Generator().manual_seed(0), dtype=D64)
    s = x0 - g / g.norm()  # the structured part
    v1 = torch.outer(_top_right_vector(P), _top_right_vector(M))
    assert float((s * v1).sum().abs()) > 1 - 1e-9 and abs(float(s.norm()) - 1) < F64_ZERO


@pytest.mark.parametrize("geometry", ["euclidean", "wasserstein"])
@pytest.mark.parametrize("masked", [False, True])
def test_kronecker_start_gives_the_same_value_as_a_random_start(gen, geometry, masked):
    params = _layer(gen, 10, 5, 2, score=3.0)
    X = torch.randn(2, 25, 10, generator=gen, dtype=D64)
    w = torch.softmax(torch.randn(2, 25, generator=gen, dtype=D64), dim=-1)
    pos = torch.sort(torch.rand(2, 25, generator=gen, dtype=D64), dim=-1).values if masked else None
    mu = DiracMeasure(X, w, pos)
    kw = dict(geometry=geometry, method="lanczos", tol=1e-10, max_iter=2000)
    a = local_lipschitz(mu, params, **kw)
    b = local_lipschitz(mu, params, start="kronecker", **kw)
    torch.testing.assert_close(b.value, a.value, rtol=F64_LANCZOS_GAP, atol=0)
    assert bool(b.converged.all())
    # a chosen start forms no Kuczynski-Wozniakowski bound; the bracket still holds
    torch.testing.assert_close(b.upper_prob, b.upper)
    assert bool((b.lower <= a.value * (1 + BRACKET_MARGIN)).all() and (b.upper >= a.value).all())


def test_rotary_heads_enter_the_mean_attention(gen):
    d, k, H, n = 8, 4, 2, 12
    rope = RotaryEmbedding(1.0 / (100.0 ** (torch.arange(0, k, 2, dtype=D64) / k)))
    params = _layer(gen, d, k, H, score=2.0, rope=rope)
    X = torch.randn(n, d, generator=gen, dtype=D64)
    lin = linearize(X, params, masked=True)
    # independent: each head's causal softmax of its rotated logits, averaged
    idx = torch.arange(n)
    mean = torch.zeros(n, n, dtype=D64)
    for h in params.heads:
        q = h.rope.apply(X @ h.Q.mT, idx)
        kk = h.rope.apply(X @ h.K.mT, idx)
        logits = (q @ kk.mT).masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -torch.inf)
        mean += torch.softmax(logits, dim=-1) / H
    torch.testing.assert_close(
        _mean_attention(lin, False), mean, rtol=F64_REDUCTION, atol=F64_REWRITTEN
    )
    a = local_lipschitz(X, params, masked=True, method="lanczos", tol=1e-10)
    b = local_lipschitz(X, params, masked=True, method="lanczos", tol=1e-10, start="kronecker")
    torch.testing.assert_close(b.value, a.value, rtol=F64_LANCZOS_GAP, atol=0)


def test_kronecker_start_float32_seeded_and_checked(gen):
    params = _layer(gen, 6, 3, 2).to(dtype=torch.float32)
    X = torch.randn(3, 9, 6, generator=gen, dtype=D64).float()
    lin = linearize(X, params)
    a = kronecker_start(lin, generator=torch.Generator().manual_seed(5))
    b = kronecker_start(lin, generator=torch.Generator().manual_seed(5))
    assert a.shape == X.shape and a.dtype == torch.float32 and torch.equal(a, b)
    est = local_lipschitz(X, params, method="lanczos", tol=1e-4, start="kronecker", certify=False)
    ref = local_lipschitz(X.double(), params.to(dtype=D64), method="lanczos", tol=1e-10)
    torch.testing.assert_close(est.value.double(), ref.value, rtol=F32_VALUE, atol=0)
    with pytest.raises(ValueError, match="'kronecker'"):
        local_lipschitz(X, params, method="lanczos", start="warm")
    with pytest.raises(ValueError, match="prob_rtol"):
        local_lipschitz(X, params, method="lanczos", start="kronecker", prob_rtol=0.05)
    with pytest.raises(ValueError, match="geometry"):
        kronecker_start(lin, geometry="split")


@pytest.mark.parametrize("method", ["lanczos", "power"])
def test_kronecker_start_at_the_extremes_of_float64(method):
    # constants beyond sqrt(float64 max) and a mass of 1e-298 (tests/meanfield/test_rigour.py): the start
    # is formed on normalised matrices, and the bracket holds as from the random start
    x = (685 / 2) ** 0.5
    w = torch.tensor([1 - 1e-298, 1e-298], dtype=D64)
    mu = DiracMeasure(torch.tensor([[x], [-x]], dtype=D64), w)
    p = AttentionParams(torch.tensor([[-1.0]], dtype=D64), torch.tensor([[2000.0]], dtype=D64))
    kw = dict(geometry="wasserstein", method=method, max_iter=3000)
    a = local_lipschitz(mu, p, **kw)
    b = local_lipschitz(mu, p, start="kronecker", **kw)
    assert bool(torch.isfinite(b.value)) and bool(b.converged)
    torch.testing.assert_close(b.value, a.value, rtol=F64_LANCZOS_COARSE, atol=0)
    assert float(b.lower) <= float(a.upper) and float(a.lower) <= float(b.upper)
    X = torch.tensor([[0.3, -0.2], [1.1, 0.4], [-0.7, 0.9]], dtype=D64)
    A = torch.tensor([[0.5, -0.3], [0.2, 0.8]], dtype=D64)
    for scale in (1e300, 1e-300):
        V = torch.tensor([[1.0, 2.0], [-0.5, 3.0]], dtype=D64) * scale
        a = local_lipschitz(X, AttentionParams(A, V), method=method, tol=1e-10, max_iter=3000)
        b = local_lipschitz(
            X, AttentionParams(A, V), method=method, tol=1e-10, max_iter=3000, start="kronecker"
        )
        assert bool(torch.isfinite(b.value)) and float(b.value) > 0
        torch.testing.assert_close(b.value, a.value, rtol=F64_LANCZOS_GAP, atol=0)


def test_top_right_vector_of_a_non_finite_or_zero_matrix_is_zero():
    M = torch.tensor([[[1.0, torch.inf], [0.0, 1.0]], [[0.0, 0.0], [0.0, 0.0]]], dtype=D64)
    v = _top_right_vector(M)
    assert torch.equal(v, torch.zeros(2, 2, dtype=D64))
    big = torch.tensor([[1e300, 2e300], [3e300, -1e300]], dtype=D64)
    ref = torch.linalg.svd(big / 1e300)[2][0]
    assert abs(float((_top_right_vector(big) * ref).sum())) > 1 - 1e-12
