"""CPU/GPU agreement (runs only where CUDA is present; CI has no GPU)."""

from __future__ import annotations

import pytest
import torch

from meanfield import DiracMeasure, MultiHeadParams, attention, self_attention

pytestmark = pytest.mark.gpu


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
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=tol, atol=tol)
    mu = DiracMeasure.from_sequence(X.cuda(), causal=True)
    out = attention(mu, params.to("cuda"), masked=True)
    assert out.points.device.type == "cuda"
