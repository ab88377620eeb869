"""``local_lipschitz_fn(products="reverse")``: J v by reverse over reverse, no forward mode.

Oracles: the forward-mode tangent (``torch.func.jvp``) and the assembled ``jacrev`` Jacobian, in
float64. The two product modes compute the same linear map by different rules, so the products
agree to a few float64 roundings of the map's entries (1e-13 relative), and the solvers, run on
the same products from the same start, agree within their residual tolerance.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.func as tfunc

from meanfield import local_lipschitz_fn, self_attention
from meanfield.lipschitz.any_map import _products

from ..oracles_jacobian import random_params
from ..tolerances import BRACKET_MARGIN, F64_LANCZOS, F64_REWRITTEN_EXP

D64 = torch.float64


def _plain_map(gen: torch.Generator):
    W1 = torch.randn(7, 5, generator=gen, dtype=D64)
    W2 = torch.randn(6, 7, generator=gen, dtype=D64)

    def f(X: torch.Tensor) -> torch.Tensor:
        return torch.tanh(X @ W1.T).square() @ W2.T + X.sum(-1, keepdim=True).sin()

    return f, torch.randn(4, 5, generator=gen, dtype=D64)


def _attention_map(gen: torch.Generator):
    params = random_params(gen, 6, kind="wo", d_v=3, H=2, d_out=6)

    def f(X: torch.Tensor) -> torch.Tensor:
        return self_attention(X, params, masked=True)

    return f, torch.randn(5, 6, generator=gen, dtype=D64)


@pytest.mark.parametrize("build", [_plain_map, _attention_map], ids=["plain", "attention"])
def test_reverse_products_equal_forward_products(build):
    gen = torch.Generator().manual_seed(3)
    f, X = build(gen)
    empty = torch.Size([])
    fwd, rfwd = _products(f, X, empty, "forward")
    rev, rrev = _products(f, X, empty, "reverse")
    J = tfunc.jacrev(lambda x: f(x.reshape(X.shape)).reshape(-1))(X.reshape(-1))
    for _ in range(3):
        v = torch.randn(X.numel(), generator=gen, dtype=D64)
        u = torch.randn(J.shape[0], generator=gen, dtype=D64)
        a, b = fwd(v), rev(v)
        scale = float(J.abs().max() * v.abs().sum())
        assert float((a - b).abs().max()) <= F64_REWRITTEN_EXP * scale
        assert float((b - J @ v).abs().max()) <= F64_REWRITTEN_EXP * scale
        assert torch.equal(rfwd(u), rrev(u))  # J^T u: the same pullback in both modes


@pytest.mark.parametrize("method", ["lanczos", "power"])
@pytest.mark.parametrize("build", [_plain_map, _attention_map], ids=["plain", "attention"])
def test_reverse_estimate_equals_forward_estimate(build, method):
    f, X = build(torch.Generator().manual_seed(4))
    tol = 1e-10
    kw = dict(method=method, tol=tol, max_iter=2000)
    a = local_lipschitz_fn(f, X, products="forward", **kw)
    b = local_lipschitz_fn(f, X, products="reverse", **kw)
    exact = float(local_lipschitz_fn(f, X, method="dense").value)
    assert bool(a.converged) and bool(b.converged)
    assert math.isclose(float(a.value), float(b.value), rel_tol=10 * tol)
    assert math.isclose(float(b.value), exact, rel_tol=10 * tol)
    assert float(b.lower) <= exact * (1 + BRACKET_MARGIN)


def test_reverse_on_batched_samples():
    f, X = _attention_map(torch.Generator().manual_seed(5))
    Xb = torch.stack([X, 0.5 * X, -X])
    tol = 1e-10
    est = local_lipschitz_fn(f, Xb, batch_dims=1, method="lanczos", products="reverse", tol=tol)
    for b in range(3):
        one = float(local_lipschitz_fn(f, Xb[b], method="dense").value)
        # a batch of three against one dense SVD: within the residual rule's tolerance (10 tol,
        # as in the forward/reverse comparison above), not bit for bit
        assert math.isclose(float(est.value[b]), one, rel_tol=10 * tol)


class _Softplus(torch.autograd.Function):
    """softplus with a backward rule written in torch ops and no ``jvp``: forward mode fails."""

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.softplus(x)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return g * torch.sigmoid(x)


def test_reverse_runs_where_forward_mode_cannot():
    gen = torch.Generator().manual_seed(6)
    W = torch.randn(6, 5, generator=gen, dtype=D64)
    X = torch.randn(4, 5, generator=gen, dtype=D64)

    def f(x: torch.Tensor) -> torch.Tensor:
        return _Softplus.apply(x @ W.T)

    with pytest.raises(NotImplementedError, match="jvp"):
        local_lipschitz_fn(f, X, method="lanczos")
    est = local_lipschitz_fn(f, X, method="lanczos", products="reverse", tol=1e-10)
    # oracle: the closed-form Jacobian diag(sigmoid(x W^T)) (I kron W), row-major in (token, out)
    s = torch.sigmoid(X @ W.T)
    J = torch.block_diag(*[s[i].unsqueeze(1) * W for i in range(X.shape[0])])
    exact = float(torch.linalg.matrix_norm(J, ord=2))
    assert bool(est.converged)
    assert math.isclose(float(est.value), exact, rel_tol=F64_LANCZOS)
    assert float(est.lower) <= exact * (1 + BRACKET_MARGIN)
    assert est.upper_prob is not None and exact <= float(est.upper_prob)
    dense = local_lipschitz_fn(f, X, method="dense", products="reverse")
    assert float(dense.lower) <= exact <= float(dense.upper)


def test_products_is_checked():
    f, X = _plain_map(torch.Generator().manual_seed(7))
    with pytest.raises(ValueError, match="products must be 'forward' or 'reverse'"):
        local_lipschitz_fn(f, X, products="backward")  # type: ignore[arg-type]
