"""The released estimator's metric sqrt(||J^T f||): homogeneous in f, not shift-invariant."""

from __future__ import annotations

import pytest
import torch

from meanfield import AttentionParams, released_metric
from meanfield.attention import self_attention

from ..tolerances import DIFFERS, F64_REWRITTEN, F64_REWRITTEN_EXP

D64 = torch.float64


def _head(gen: torch.Generator, d: int = 3) -> AttentionParams:
    return AttentionParams(
        torch.randn(d, d, generator=gen, dtype=D64), torch.randn(d, d, generator=gen, dtype=D64)
    )


@pytest.mark.parametrize("c", [3.0, -0.25, 1e-3, 40.0])
def test_scaling_f_by_c_scales_the_metric_by_abs_c(gen, c):
    params = _head(gen)
    X = torch.randn(5, 3, generator=gen, dtype=D64)
    base = released_metric(lambda Y: self_attention(Y, params), X)
    scaled = released_metric(lambda Y: c * self_attention(Y, params), X)
    torch.testing.assert_close(scaled, abs(c) * base, rtol=F64_REWRITTEN_EXP, atol=0)


def test_adding_a_constant_to_f_changes_the_metric_but_not_the_jacobian(gen):
    params = _head(gen)
    X = torch.randn(5, 3, generator=gen, dtype=D64)
    shift = torch.randn(3, generator=gen, dtype=D64)

    def f(Y):
        return self_attention(Y, params)

    def g(Y):
        return self_attention(Y, params) + shift

    J_f = torch.autograd.functional.jacobian(f, X)
    J_g = torch.autograd.functional.jacobian(g, X)
    torch.testing.assert_close(J_g, J_f, rtol=F64_REWRITTEN, atol=F64_REWRITTEN)  # same derivative
    m_f, m_g = float(released_metric(f, X)), float(released_metric(g, X))
    assert abs(m_g - m_f) > DIFFERS * max(m_f, m_g)  # yet a different "constant"
    # and it vanishes where f does, whatever the derivative
    zero = float(released_metric(lambda Y: f(Y) - f(X).detach(), X))
    assert zero == 0.0
