"""Causal attention on sequences and masked mean-field attention on position-tagged measures."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from meanfield import AttentionParams, DiracMeasure, attention, attention_map, self_attention

from ..oracles import causal_index, naive_head
from ..tolerances import F64_EXACT, assert_close

D64 = torch.float64


@pytest.fixture
def head(gen):
    return AttentionParams(
        torch.randn(4, 4, generator=gen, dtype=D64), torch.randn(3, 4, generator=gen, dtype=D64)
    )


def test_matches_causal_token_loop(gen, head):
    X = torch.randn(8, 4, generator=gen, dtype=D64)
    ref = naive_head(X.numpy(), head.A.numpy(), head.V.numpy(), allowed=causal_index)
    assert_close(self_attention(X, head, masked=True), torch.from_numpy(ref), **F64_EXACT)


def test_outputs_do_not_depend_on_later_tokens(gen, head):
    X = torch.randn(8, 4, generator=gen, dtype=D64)
    s = 4
    Y = X.clone()
    Y[s + 1 :] = torch.randn(3, 4, generator=gen, dtype=D64) * 10
    out_x, out_y = self_attention(X, head, masked=True), self_attention(Y, head, masked=True)
    assert torch.equal(out_x[: s + 1], out_y[: s + 1])
    assert not torch.allclose(out_x[s + 1 :], out_y[s + 1 :])


def test_jacobian_is_block_lower_triangular(gen, head):
    X = torch.randn(5, 4, generator=gen, dtype=D64)
    J = torch.func.jacrev(lambda Z: self_attention(Z, head, masked=True))(X)  # (n, d_v, n, d)
    for i in range(5):
        for j in range(i + 1, 5):
            assert torch.count_nonzero(J[i, :, j, :]) == 0
    assert torch.count_nonzero(J[4, :, 0, :]) > 0


def test_first_token_attends_only_to_itself(gen, head):
    X = torch.randn(6, 4, generator=gen, dtype=D64)
    assert_close(self_attention(X, head, masked=True)[0], head.V @ X[0], **F64_EXACT)


def test_masked_mean_field_with_shared_positions(gen, head):
    """Atoms at equal positions see each other (t' <= t includes equality), docs/theory.md §4."""
    X = torch.randn(5, 4, generator=gen, dtype=D64)
    t = torch.tensor([0.2, 0.5, 0.5, 0.9, 0.2], dtype=D64)
    a = torch.tensor([0.1, 0.3, 0.2, 0.25, 0.15], dtype=D64)
    mu = DiracMeasure(X, a, positions=t)
    out = attention(mu, head, masked=True)
    ref = naive_head(
        X.numpy(),
        head.A.numpy(),
        head.V.numpy(),
        log_w=np.log(a.numpy()),
        allowed=lambda i, j: t[j] <= t[i],
    )
    assert_close(out.points, torch.from_numpy(ref), **F64_EXACT)
    assert torch.equal(out.positions, t)


def test_split_copies_see_each_other_and_match_doubled_weight(gen, head):
    X = torch.randn(4, 4, generator=gen, dtype=D64)
    mu = DiracMeasure.from_sequence(X, causal=True)
    split = mu.split(1, 3)
    out = attention(split, head, masked=True)
    # same transport map: copies land where the unsplit atom lands, other atoms unchanged
    base = attention(mu, head, masked=True).points
    assert_close(out.points[1:4], base[1].expand(3, -1), **F64_EXACT)
    assert_close(out.points[[0, 4, 5]], base[[0, 2, 3]], **F64_EXACT)


def test_masked_map_at_arbitrary_queries(gen, head):
    X = torch.randn(5, 4, generator=gen, dtype=D64)
    mu = DiracMeasure.from_sequence(X, causal=True)
    q = torch.randn(2, 4, generator=gen, dtype=D64)
    qt = torch.tensor([0.4, 1.0], dtype=D64)
    out = attention_map(mu, head, q, masked=True, query_positions=qt)
    pos = mu.positions.numpy()
    ref = naive_head(
        X.numpy(),
        head.A.numpy(),
        head.V.numpy(),
        queries=q.numpy(),
        allowed=lambda i, j: pos[j] <= qt[i],
    )
    assert_close(out, torch.from_numpy(ref), **F64_EXACT)
    with pytest.raises(ValueError, match="query_positions"):
        attention_map(mu, head, q, masked=True)
