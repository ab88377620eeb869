"""Extracted-weight attention equals the HF modules (eager, our own mask): BERT, GPT-2, Llama.

Small random-init configurations compared at float64 precision with nonzero biases; nothing is
downloaded (HF_HUB_OFFLINE=1).
"""

# ruff: noqa: F811  (pytest fixtures imported from tests/models_fixtures.py are arguments)
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from meanfield import self_attention

from ..tolerances import DIFFERS, F32_VS_F64, F64_EXACT, FD_ABS, FD_REL, assert_close

transformers = pytest.importorskip("transformers")

from meanfield.models import (  # noqa: E402
    HFAttention,
    bert_attention_block,
    hf_attention,
    hf_attention_fn,
    is_causal,
    layer_info,
    params_from_hf,
    released_head_A,
)

from ..models_fixtures import *  # noqa: E402, F403  (the fixtures, used by name)
from ..models_fixtures import (  # noqa: E402
    D64,
    LLAMA_TOKENS,
    D,
    H,
    N,
    causal_additive,
    fixture_config,
    rope_f64,
    run_capturing,
    store_input,
)

# ----------------------------------------------------------------------------------------------
# Import hygiene
# ----------------------------------------------------------------------------------------------


def test_import_is_lazy_and_missing_transformers_fails_in_one_line():
    code = (
        "import sys; import meanfield, meanfield.models, meanfield.data; "
        "assert 'transformers' not in sys.modules; sys.modules['transformers'] = None; "
        "from meanfield.models import random_bert\n"
        "try:\n    random_bert(0)\nexcept ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1 and "pip install meanfield[hf]" in lines[0]


# ----------------------------------------------------------------------------------------------
# BERT
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layer", [0, 1])
def test_bert_heads_equal_bert_self_attention(bert, X, layer):
    params = params_from_hf(bert, layer, map="heads")
    assert params.W_O is None and params.n_heads == H
    assert all(h.c is not None and h.b is not None for h in params.heads)
    with torch.no_grad():
        ref = bert.encoder.layer[layer].attention.self(X)[0]
    assert_close(self_attention(X, params), ref, **F64_EXACT)


@pytest.mark.parametrize("layer", [0, 1])
def test_bert_heads_wo_equal_self_output_dense(bert, X, layer):
    att = bert.encoder.layer[layer].attention
    with torch.no_grad():
        ref = att.output.dense(att.self(X)[0])  # BertSelfOutput before dropout/residual/LN
    params = params_from_hf(bert, layer, map="heads+WO")
    assert params.b_O is not None
    assert_close(self_attention(X, params), ref, **F64_EXACT)


def test_bert_block_equals_bert_attention(bert, X):
    with torch.no_grad():
        ref = bert.encoder.layer[1].attention(X)[0]
    f = hf_attention(bert, 1, map="block")
    assert isinstance(f, HFAttention) and not f.causal
    assert_close(f(X), ref, **F64_EXACT)
    ln = bert.encoder.layer[1].attention.output.LayerNorm
    direct = bert_attention_block(X, f.params, ln.weight.detach(), ln.bias.detach(), ln.eps)
    assert_close(direct, ref, **F64_EXACT)


def test_bert_decoder_is_causal_and_masked_map_matches(bert_decoder, X):
    assert is_causal(bert_decoder)
    f = hf_attention(bert_decoder, 1, map="heads")
    assert f.causal
    with torch.no_grad():
        sa = bert_decoder.encoder.layer[1].attention.self
        ref_masked = sa(X, attention_mask=causal_additive(N))[0]
        ref_unmasked = sa(X)[0]  # D3: the module does not mask itself
    assert_close(f(X), ref_masked, **F64_EXACT)
    assert_close(f(X, masked=False), ref_unmasked, **F64_EXACT)
    assert (ref_masked - ref_unmasked).abs().max() > DIFFERS


def test_bert_full_forward_capture_matches_module_output(bert_decoder, gen):
    """Inside the model's own forward (its own causal mask), our map reproduces the module."""
    ids = torch.randint(0, 100, (2, 9), generator=gen)
    got = run_capturing(bert_decoder, bert_decoder.encoder.layer[1].attention, ids)
    f = hf_attention(bert_decoder, 1, map="block")
    assert_close(f(got["x"]), got["y"], **F64_EXACT)


# ----------------------------------------------------------------------------------------------
# GPT-2
# ----------------------------------------------------------------------------------------------


def test_gpt2_heads_wo_equal_gpt2_attention_with_causal_mask(gpt2, X):
    params = params_from_hf(gpt2, 1)
    assert params.W_O is not None and params.b_O is not None
    assert all(h.c is not None and h.b is not None for h in params.heads)
    assert is_causal(gpt2) and layer_info(gpt2, 1).weight_layout == "conv1d"
    attn = gpt2.h[1].attn
    with torch.no_grad():
        ref = attn(X, attention_mask=causal_additive(N))[0]
        unmasked = attn(X)[0]
    assert_close(self_attention(X, params, masked=True), ref, **F64_EXACT)
    # transformers 5.x trap: the module alone is not causal; our unmasked map equals it.
    assert_close(self_attention(X, params, masked=False), unmasked, **F64_EXACT)
    assert (ref - unmasked).abs().max() > DIFFERS


def test_gpt2_heads_equal_c_proj_input(gpt2, X):
    attn = gpt2.h[0].attn
    got = {}
    hook = attn.c_proj.register_forward_pre_hook(store_input(got), with_kwargs=True)
    try:
        with torch.no_grad():
            attn(X, attention_mask=causal_additive(N))
    finally:
        hook.remove()
    f = hf_attention(gpt2, 0, map="heads")
    assert f.params.W_O is None
    assert_close(f(X), got["x"], **F64_EXACT)


def test_gpt2_full_forward_capture_matches_module_output(gpt2, gen):
    ids = torch.randint(0, 100, (2, 11), generator=gen)
    got = run_capturing(gpt2, gpt2.h[1].attn, ids)
    assert_close(hf_attention_fn(gpt2, 1)(got["x"]), got["y"], **F64_EXACT)


def test_gpt2_heads_are_column_blocks(gpt2, X):
    """Per-head logits of HF (columns of c_attn) equal ours up to row constants."""
    attn = gpt2.h[1].attn
    params = params_from_hf(gpt2, 1, map="heads")
    k = D // H
    with torch.no_grad():
        q, key, _ = attn.c_attn(X).split(D, dim=-1)
    for h, head in enumerate(params.heads):
        cols = slice(h * k, (h + 1) * k)
        hf = q[..., cols] @ key[..., cols].mT * attn.scaling
        ours = X @ head.A @ X.mT + (X @ head.c)[..., None, :]
        diff = hf - ours
        assert_close(diff, diff[..., :1].expand_as(diff).clone(), **F64_EXACT)


def test_released_gpt2_row_slicing_differs_d5(gpt2):
    """D5: rows of the Conv1D (in, out) weight select input dims, not head h."""
    ours = params_from_hf(gpt2, 1, map="heads").heads[0].A
    rel = released_head_A(gpt2, 1, 0, score="query_key")
    assert rel.shape == ours.shape
    assert torch.linalg.matrix_norm(rel - ours) > 0.5 * torch.linalg.matrix_norm(ours)
    # the released A_code is the transpose, in the key-query convention
    assert_close(released_head_A(gpt2, 1, 0), rel.mT, **F64_EXACT)


def test_released_bert_slicing_is_correct(bert):
    for h in range(H):
        ours = params_from_hf(bert, 0, map="heads").heads[h].A
        assert_close(released_head_A(bert, 0, h, score="query_key"), ours, **F64_EXACT)


def test_block_map_is_bert_only(gpt2, llama):
    for m in (gpt2, llama):
        with pytest.raises(ValueError, match="Post-LN BERT"):
            params_from_hf(m, 0, map="block")


# ----------------------------------------------------------------------------------------------
# Llama (GQA + RoPE)
# ----------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("llama_fp64_softmax")
@pytest.mark.parametrize("map_", ["heads+WO", "heads"])
def test_llama_equals_llama_attention(llama, X, map_):
    info = layer_info(llama, 1, map=map_)
    assert info.has_rope and info.causal and (info.n_heads, info.n_kv_heads) == (4, 2)
    params = params_from_hf(llama, 1, map=map_)
    assert all(h.rope is not None for h in params.heads)
    assert torch.equal(params.heads[0].K, params.heads[1].K)  # GQA: heads 0, 1 share K, V
    assert not torch.equal(params.heads[1].K, params.heads[2].K)
    attn = llama.model.layers[1].self_attn
    got = {}
    hook = attn.o_proj.register_forward_pre_hook(store_input(got), with_kwargs=True)
    try:
        with torch.no_grad():
            out = attn(X, position_embeddings=rope_f64(llama, N), attention_mask=causal_additive(N))
    finally:
        hook.remove()
    ref = out[0] if map_ == "heads+WO" else got["x"]
    assert_close(self_attention(X, params, masked=True), ref, **F64_EXACT)


def test_llama_stock_eager_agrees_to_float32_precision(llama, X):
    """Unpatched HF: softmax in fp32 and cos/sin from fp32 angles, so fp32-level agreement."""
    attn = llama.model.layers[0].self_attn
    pos = torch.arange(N)[None]
    with torch.no_grad():
        ref = attn(
            X,
            position_embeddings=llama.model.rotary_emb(X, pos),
            attention_mask=causal_additive(N),
        )[0]
    assert_close(hf_attention(llama, 0)(X), ref, **F32_VS_F64)


def test_llama_full_forward_capture_matches_module_output(llama, gen):
    ids = torch.randint(0, 100, (2, 10), generator=gen)
    got = run_capturing(llama, llama.model.layers[1].self_attn, ids)
    assert_close(hf_attention(llama, 1)(got["x"]), got["y"], **F32_VS_F64)


def test_llama_qk_biases_are_head_biases_under_rotary():
    cfg = fixture_config("llama", kv_heads=1, layers=1, attention_bias=True, **LLAMA_TOKENS)
    model = transformers.LlamaModel(cfg)
    head = params_from_hf(model, 0).heads[0]
    assert head.rope is not None and head.c is None
    k = head.Q.shape[0]
    scale = model.layers[0].self_attn.scaling
    b_q = model.layers[0].self_attn.q_proj.bias.detach()[:k].to(head.q_bias)
    torch.testing.assert_close(head.q_bias, scale * b_q, rtol=0, atol=0)


def test_attention_fn_supports_forward_mode_ad(llama, gpt2, X):
    for m in (llama, gpt2):
        f = hf_attention_fn(m, 0)
        T = torch.ones_like(X[0])
        _, jvp = torch.func.jvp(f, (X[0],), (T,))
        h = 1e-6
        fd = (f(X[0] + h * T) - f(X[0] - h * T)) / (2 * h)
        torch.testing.assert_close(jvp, fd, rtol=FD_REL, atol=FD_ABS)


def test_params_are_copies_and_dtype(bert):
    p32 = params_from_hf(bert, 0, dtype=torch.float32)
    assert p32.dtype == torch.float32
    p = params_from_hf(bert, 0)
    assert p.dtype == D64
    before = p.heads[0].V.clone()
    with torch.no_grad():
        bert.encoder.layer[0].attention.self.value.weight.add_(0.0)
    assert p.heads[0].V.data_ptr() != bert.encoder.layer[0].attention.self.value.weight.data_ptr()
    assert torch.equal(before, p.heads[0].V)


def test_layer_and_map_validation(bert):
    with pytest.raises(ValueError, match="layer must be"):
        params_from_hf(bert, 2)
    with pytest.raises(ValueError, match="map must be"):
        params_from_hf(bert, 0, map="WO")
