"""Named tolerances per (dtype, oracle), each with its justification.

Comparisons check dtype and shape before values (see `assert_close`).
"""

from __future__ import annotations

import torch

# Two float64 implementations of the same finite sum of O(n) terms of size O(1): a few hundred ulps.
F64_EXACT = dict(rtol=1e-12, atol=1e-12)
# float32 against the float64 reference on O(1) inputs: softmax and matmuls lose ~1e-6 relative.
F32_VS_F64 = dict(rtol=2e-5, atol=2e-5)
# float64 radius-100 inputs: logits are ~1e4, so absolute logit errors of ~1e4 * eps propagate.
F64_LARGE_RADIUS = dict(rtol=1e-9, atol=1e-9)
# Central finite differences in float64 with h = 1e-6: truncation O(h^2) plus rounding O(eps / h).
F64_FINITE_DIFF = dict(rtol=1e-6, atol=1e-7)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, **tol: float) -> None:
    """Check dtype, then shape, then values."""
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    torch.testing.assert_close(actual, expected, **tol)
