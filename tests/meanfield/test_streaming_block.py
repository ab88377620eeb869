"""The deterministic upper end of the streaming path (docs/certificates.md §5.4).

:func:`streaming_structured_upper` is the per-head three-term bound of §5.2 with every statistic
of the attention recomputed from tiles and bounded for the exact attention. Checked here: it
bounds the exact norm (dense float64 SVD) on plain, causal, rotary, weighted and batched
layers; it is never below the stored bound it streams (the same formula, fewer
Collatz–Wielandt steps, spreads about the stored means); its value does not depend on the
tiling beyond rounding; and the certified call carries it as ``upper``. The 50-digit checks are
in tests/meanfield/test_rigour_streaming.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from meanfield import AttentionParams, MultiHeadParams, RotaryEmbedding, local_lipschitz
from meanfield import _rounding as rnd
from meanfield.jacobian import (
    dense_jacobian,
    head_structured_upper,
    linearize,
    linearize_streaming,
)
from meanfield.jacobian.streaming import streaming_magnitude
from meanfield.jacobian.streaming_bounds import streaming_structured_upper

from ..tolerances import BRACKET_MARGIN, F64_TWO_JACOBIANS

D64 = torch.float64


def _layer(gen, *, d=10, H=3, k=4, rope=False, W_O=True):
    heads = []
    inv = 1.0 / (50.0 ** (torch.arange(0, k, 2, dtype=D64) / k))
    for _ in range(H):
        Q = torch.randn(k, d, generator=gen, dtype=D64) / 3
        K = torch.randn(k, d, generator=gen, dtype=D64) / 3
        V = torch.randn(5, d, generator=gen, dtype=D64) / 3
        kw = {"rope": RotaryEmbedding(inv, attention_scaling=1.2)} if rope else {}
        c = None if rope else torch.randn(d, generator=gen, dtype=D64) / 4
        heads.append(AttentionParams(None, V, Q=Q, K=K, c=c, **kw))
    W = torch.randn(7, 5 * H, generator=gen, dtype=D64) / 4 if W_O else None
    return MultiHeadParams(tuple(heads), W_O=W)


def _bound(X, params, **kw):
    block = kw.pop("block_size", None)
    slin = linearize_streaming(X, params, block_size=block, **kw)
    eps = rnd.streaming_error_model(streaming_magnitude(slin)).eps_s
    return streaming_structured_upper(slin, eps)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(5)


CASES = [
    dict(),
    dict(masked=True),
    dict(rope=True),
    dict(rope=True, masked=True),
    dict(weights=True),
    dict(W_O=False),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(c) or "plain")
def test_bounds_the_exact_norm_and_the_stored_bound(gen, case):
    case = dict(case)
    masked = case.pop("masked", False)
    weights = case.pop("weights", False)
    params = _layer(gen, **case)
    n = 30
    X = torch.randn(n, 10, generator=gen, dtype=D64) * 2
    lw = torch.randn(n, generator=gen, dtype=D64).log_softmax(-1) if weights else None
    bound = _bound(X, params, masked=masked, log_weights=lw, block_size=(8, 16))
    J = dense_jacobian(X, params, masked=masked, log_weights=lw).reshape(-1, n * 10)
    exact = torch.linalg.matrix_norm(J, ord=2)
    # the bound's own slack is far above the SVD's rounding (a few ulps of the largest value)
    assert float(bound) >= float(exact) * (1 + BRACKET_MARGIN)
    stored = head_structured_upper(linearize(X, params, masked=masked, log_weights=lw))
    assert float(bound) >= float(stored) * (1 - F64_TWO_JACOBIANS)


def _reorder_rtol(n: int, d: int, k: int) -> float:
    """How far two evaluations of the bound in another order (tiles, batch) may be apart.

    Every statistic is a sum of nonnegative computed terms along chains of length at most
    K = 4(n + d + k) + 64, so each is within gamma_K of the exact sum of its terms, whatever the
    order; the bound multiplies at most 16 of them (with a square root, maxima and minima, which
    do not increase relative differences): 2 * 16 gamma_K between two evaluations.
    """
    return 32 * rnd.gamma(4 * (n + d + k) + 64)


def test_tiling_changes_only_rounding(gen):
    params = _layer(gen, rope=True)
    X = torch.randn(41, 10, generator=gen, dtype=D64)
    a = _bound(X, params, masked=True, block_size=(8, 8))
    b = _bound(X, params, masked=True, block_size=(41, 41))
    assert abs(float(a) - float(b)) <= _reorder_rtol(41, 10, 4) * float(a)


def test_batched_rows_match_one_at_a_time(gen):
    params = _layer(gen)
    X = torch.randn(2, 25, 10, generator=gen, dtype=D64)
    both = _bound(X, params, masked=True)
    one = torch.stack([_bound(X[i], params, masked=True) for i in range(2)])
    assert torch.allclose(both, one, rtol=_reorder_rtol(25, 10, 4), atol=0)


def test_infinite_error_model_gives_infinity(gen):
    params = _layer(gen)
    X = torch.randn(12, 10, generator=gen, dtype=D64)
    slin = linearize_streaming(X, params)
    assert math.isinf(float(streaming_structured_upper(slin, torch.tensor(math.inf, dtype=D64))))


def test_certified_streaming_call_carries_the_block_end(gen):
    params = _layer(gen, rope=True)
    X = torch.randn(60, 10, generator=gen, dtype=D64)
    est = local_lipschitz(X, params, masked=True, path="streaming", upper="block")
    assert est.path == "streaming" and math.isfinite(float(est.upper))
    assert float(est.lower) <= float(est.upper_prob) <= float(est.upper)
    stored = local_lipschitz(X, params, masked=True, path="stored", upper="block")
    # both upper ends bound the same norm: each is at least the other's lower end
    assert float(est.upper) >= float(stored.lower) and float(stored.upper) >= float(est.lower)
    # the default call on the streaming path keeps upper="none" (cost: docs/certificates.md §5.4)
    assert math.isinf(float(local_lipschitz(X, params, masked=True, path="streaming").upper))


def test_wasserstein_with_weights_is_infinite(gen):
    params = _layer(gen)
    X = torch.randn(12, 10, generator=gen, dtype=D64)
    lw = torch.randn(12, generator=gen, dtype=D64).log_softmax(-1)
    from meanfield import DiracMeasure

    mu = DiracMeasure(X, lw.exp())
    est = local_lipschitz(mu, params, geometry="wasserstein", path="streaming", upper="block")
    assert math.isinf(float(est.upper))
