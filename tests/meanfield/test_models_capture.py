"""Hidden states captured at a layer's input equal the model's own hidden states."""

# ruff: noqa: F811  (pytest fixtures imported from tests/models_fixtures.py are arguments)
from __future__ import annotations

import itertools

import pytest
import torch

from ..tolerances import DIFFERS, F64_EXACT, assert_close

transformers = pytest.importorskip("transformers")

from meanfield.models import (  # noqa: E402
    hf_attention_fn,
    hidden_states,
    hidden_states_grid,
)

from ..models_fixtures import *  # noqa: E402, F403  (the fixtures, used by name)
from ..models_fixtures import (  # noqa: E402
    D64,
    D,
)

# ----------------------------------------------------------------------------------------------
# Hidden states
# ----------------------------------------------------------------------------------------------


def _reference_capture(model, arch, layer, ids):
    with torch.no_grad():
        hs = model(input_ids=ids, output_hidden_states=True).hidden_states[layer]
        base = model.base_model
        if arch == "gpt2":
            return base.h[layer].ln_1(hs)
        if arch == "llama":
            return base.layers[layer].input_layernorm(hs)
        return hs


@pytest.mark.parametrize(("name", "layer"), [("bert", 1), ("gpt2", 1), ("llama", 1), ("bert", 0)])
def test_hidden_states_match_output_hidden_states(request, name, layer, gen):
    model = request.getfixturevalue(name)
    ids = torch.randint(0, 100, (400,), generator=gen)
    hs = hidden_states(model, None, ids, layer, 12, n_windows=4, start=7)
    assert hs.X.shape == (4, 12, D) and hs.X.dtype == D64
    assert hs.starts == (7, 19, 31, 43) and hs.next_start == 55
    for i, s in enumerate(hs.starts):
        assert torch.equal(hs.token_ids[i], ids[s : s + 12])
    ref = _reference_capture(model, name, layer, hs.token_ids)
    assert_close(hs.X, ref.to(D64), **F64_EXACT)
    chunked = hidden_states(model, None, ids, layer, 12, n_windows=4, start=7, batch_size=3)
    assert_close(chunked.X, hs.X, **F64_EXACT)


def test_hidden_states_grid_never_overlaps(gpt2, gen):
    ids = torch.randint(0, 100, (1000,), generator=gen)
    grid = hidden_states_grid(gpt2, None, ids, 0, [2, 4, 6], n_windows=10, dtype=None)
    spans = [(s, s + hs.n) for hs in grid for s in hs.starts]
    assert spans == sorted(spans)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    assert grid[-1].next_start == 10 * (2 + 4 + 6)
    assert grid[0].X.dtype == D64  # the model's own dtype here
    # captured states are ordinary tensors: they can be differentiated through our map
    out, vjp = torch.func.vjp(hf_attention_fn(gpt2, 0), grid[1].X)
    assert vjp(torch.ones_like(out))[0].shape == grid[1].X.shape


def test_hidden_states_errors_and_mode(gpt2, gen):
    ids = torch.randint(0, 100, (50,), generator=gen)
    with pytest.raises(ValueError, match="need 60 tokens"):
        hidden_states(gpt2, None, ids, 0, 6, n_windows=10)
    with pytest.raises(ValueError, match="positions"):
        hidden_states(gpt2, None, torch.zeros(1000, dtype=torch.long), 0, 65, n_windows=1)
    gpt2.train()
    try:
        a = hidden_states(gpt2, None, ids, 1, 5, n_windows=2)
        b = hidden_states(gpt2, None, ids, 1, 5, n_windows=2)
        assert gpt2.training  # mode restored
        assert_close(a.X, b.X, **F64_EXACT)  # but dropout was off
    finally:
        gpt2.eval()


def test_gpt2_released_token_type_ids_add_token_zero_embedding(gpt2, gen):
    ids = torch.randint(0, 100, (40,), generator=gen)
    auto = hidden_states(gpt2, None, ids, 0, 5, n_windows=2)
    released = hidden_states(gpt2, None, ids, 0, 5, n_windows=2, token_type_ids="zeros")
    assert (auto.X - released.X).abs().max() > DIFFERS
    with torch.no_grad():
        emb = gpt2.wte(auto.token_ids) + gpt2.wpe(torch.arange(5)) + gpt2.wte.weight[0]
        ref = gpt2.h[0].ln_1(emb)
    assert_close(released.X, ref, **F64_EXACT)
