"""The streaming path on a GPU (runs only where CUDA is present; CI has no GPU).

The products on CUDA are another computation than on the CPU (other kernels, other reduction
orders), so they are compared with what the rounding model guarantees for *any* evaluation in the
working precision (docs/rounding.md §11.3, §11.4): the CUDA product in unit roundoff ``u`` lies
within ``eta_u M|h|`` of the exact product, the CPU float64 product within ``eta_64 M|h|``, so the
two within the sum. The certified call on CUDA must hold its bracket around the exact constant
(the dense SVD of the float64 Jacobian) and keep the inputs' device and dtype.
"""

from __future__ import annotations

import math

import pytest
import torch

import meanfield
from meanfield import _rounding as rnd
from meanfield.jacobian import dense_jacobian
from meanfield.jacobian.streaming import (
    linearize_streaming,
    streaming_jvp,
    streaming_magnitude,
    streaming_vjp,
)
from tests.meanfield.test_streaming_products import _factored, _rotary
from tests.meanfield.test_variant_products import _layer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU"),
]

F64 = torch.float64
UNIT = {torch.float32: 2.0**-24, torch.float64: 2.0**-53}


def _case(kind: str, seed: int):
    gen = torch.Generator().manual_seed(seed)
    if kind == "factored":
        params = _factored(gen, d=8)
    elif kind == "rotary":
        params = _rotary(gen, d=8)
    else:
        params = _layer(kind, gen)
    X = 1.5 * torch.randn(37, 8, generator=gen, dtype=F64)
    return params, X


def check_products_across_devices(kind: str, dtype: torch.dtype, masked: bool, device: str):
    """``|J_dev h - J_cpu64 h| <= (eta_u + eta_64) M|h|`` entrywise, for ``J`` and ``J^T``.

    The case is rounded to ``dtype`` first, so that both devices see the same numbers.
    """
    params, X = _case(kind, 3)
    params = params.to(dtype=dtype).to(dtype=F64)
    X = X.to(dtype).to(F64)
    slin64 = linearize_streaming(X, params, masked=masked, block_size=(8, 8))
    mlin = streaming_magnitude(slin64)
    eta64 = float(rnd.streaming_error_model(mlin).eta)
    eta = float(rnd.streaming_error_model(mlin, UNIT[dtype]).eta)
    assert math.isfinite(eta) and eta <= 0.25  # the model is in force
    slin = linearize_streaming(
        X.to(device=device, dtype=dtype),
        params.to(device=device, dtype=dtype),
        masked=masked,
        block_size=(8, 8),
    )
    gen = torch.Generator().manual_seed(11)
    H = torch.randn(X.shape, generator=gen, dtype=F64).to(dtype).to(F64)
    G = torch.randn(X.shape[0], slin64.d_out, generator=gen, dtype=F64).to(dtype).to(F64)
    out = streaming_jvp(slin, H.to(device=device, dtype=dtype))
    assert out.device.type == torch.device(device).type and out.dtype == dtype
    diff = (out.cpu().to(F64) - streaming_jvp(slin64, H)).abs()
    assert bool((diff <= (eta + eta64) * streaming_jvp(mlin, H.abs())).all())
    back = streaming_vjp(slin, G.to(device=device, dtype=dtype))
    diff = (back.cpu().to(F64) - streaming_vjp(slin64, G)).abs()
    assert bool((diff <= (eta + eta64) * streaming_vjp(mlin, G.abs())).all())


def check_certified_call(kind: str, dtype: torch.dtype, masked: bool, device: str):
    """The default streamed call on ``device`` brackets the exact constant, on that device."""
    params, X = _case(kind, 5)
    est = meanfield.local_lipschitz(
        X.to(device=device, dtype=dtype),
        params.to(device=device, dtype=dtype),
        masked=masked,
        path="streaming",
    )
    assert est.path == "streaming"
    assert est.value.device.type == torch.device(device).type and est.value.dtype == dtype
    # the exact constant of the numbers the call saw (rounded to dtype), to float64 accuracy
    X64 = X.to(dtype).to(F64)
    p64 = params.to(dtype=dtype).to(dtype=F64)
    n, d = X64.shape
    J = dense_jacobian(X64, p64, masked=masked).reshape(-1, n * d)
    exact = float(torch.linalg.matrix_norm(J, ord=2))
    # the CPU float64 SVD is backward stable: its top singular value is within about N u of
    # the exact one, relatively (N = n d columns); the device's bracket must hold around it
    svd = J.shape[-1] * 2.0**-53
    assert float(est.lower) <= exact * (1 + svd)
    assert exact * (1 - svd) <= float(est.upper_prob)


KINDS = ["factored", "rotary", "gemma2", "qwen3", "alibi"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("masked", [False, True])
def test_streaming_products_agree_across_devices(kind, dtype, masked):
    check_products_across_devices(kind, dtype, masked, "cuda")


@pytest.mark.parametrize("kind", ["factored", "rotary", "gemma2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_streaming_certified_call_on_cuda(kind, dtype):
    check_certified_call(kind, dtype, True, "cuda")
