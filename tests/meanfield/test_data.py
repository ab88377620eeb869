"""Running-pointer, non-overlapping windowing of token ids (docs/experiments.md)."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from meanfield import data

# ----------------------------------------------------------------------------------------------
# Windows
# ----------------------------------------------------------------------------------------------


def test_windows_running_pointer_no_overlap():
    ids = torch.arange(1000)
    ws = data.windows(ids, [2, 4, 6], n_windows=10, start=3)
    assert [w.n for w in ws] == [2, 4, 6]
    assert ws[0].starts[0] == 3 and ws[1].starts[0] == ws[0].next_start == 23
    spans = [(s, s + w.n) for w in ws for s in w.starts]
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))  # consecutive, disjoint
    assert ws[-1].next_start == 3 + data.tokens_needed([2, 4, 6])
    for w in ws:
        assert w.token_ids.shape == (10, w.n) and w.token_ids.dtype == torch.long
        for row, s in zip(w.token_ids, w.starts, strict=True):
            assert torch.equal(row, ids[s : s + w.n])


def test_windows_too_short_says_how_many_tokens():
    with pytest.raises(ValueError, match=r"need 120 tokens.*has 100"):
        data.windows(list(range(100)), [2, 4, 6], n_windows=10)
    with pytest.raises(ValueError, match=r"need 2460 tokens"):
        data.windows(torch.arange(500), range(2, 100, 2)[:15], n_windows=10, start=60)


def test_cut_windows_stride_and_shapes():
    w = data.cut_windows(torch.arange(100)[None], 5, 3, start=10, stride=7)
    assert w.starts == (10, 17, 24) and w.next_start == 29 and w.n_windows == 3
    with pytest.raises(ValueError, match="overlap"):
        data.cut_windows(torch.arange(100), 5, 3, stride=4)
    with pytest.raises(TypeError):
        data.cut_windows(torch.arange(100.0), 5, 3)


@settings(max_examples=50, deadline=None)
@given(
    grid=st.lists(st.integers(1, 20), min_size=1, max_size=6),
    n_windows=st.integers(1, 5),
    start=st.integers(0, 10),
)
def test_windows_tile_the_text_in_order(grid, n_windows, start):
    need = start + data.tokens_needed(grid, n_windows)
    ids = torch.arange(need + 3)
    ws = data.windows(ids, grid, n_windows, start=start)
    flat = torch.cat([w.token_ids.reshape(-1) for w in ws])
    assert torch.equal(flat, ids[start:need])
    with pytest.raises(ValueError, match=f"need {need} tokens"):
        data.windows(ids[: need - 1], grid, n_windows, start=start)
