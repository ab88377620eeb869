"""`meanfield.profile` on DistilBERT, OPT, Phi-3, GPT-NeoX, Falcon, BLOOM and ModernBERT blocks.

Oracles: the model's own layer in a forward pass (hooks capture what enters and leaves each
layer, and what enters its attention module) on tiny random models built from transformers'
config classes (nothing is downloaded), in float64 with transformers' float32 steps replaced by
the same formulas in float64 by ``tests.hf_float64`` (the eager softmax's ``dtype=float32``, the
rotary tables computed from float32 angles, ModernBERT's float32 rotation of q and k, Phi-3's
RMSNorm cast to float32), so that the rebuilt block must agree to rounding: 1e-12 relative to the largest entry. Every
weight is random (std 1.5/sqrt(fan-in): non-uniform attention), and so is every bias, norm gain
and norm shift, so that a norm, bias or residual read in the wrong place is off by O(1).

Each residual form of each family is a case of its own (Post-LN and Pre-LN OPT, parallel and
sequential GPT-NeoX, Falcon's shared norm, two norms and sequential block, BLOOM with and without
``apply_residual_connection_post_layernorm``, ModernBERT's identity norm on layer 0 and its local
layers); the settings the blocks do not model are flipped in the config and must be refused in
one line; and ``meanfield profile`` runs on saved checkpoints of three of the families.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from meanfield.models._families import UnmodelledFeature
from meanfield.models.layers import arch_of, attention_module, layer_modules
from meanfield.profile import model_blocks, profile_model
from tests.hf_float64 import block_io, patch_float32_steps, rel_error, seeded_model, token_ids
from tests.profile_cli import *  # noqa: F403  (fixture: tokenizer)
from tests.profile_cli import assert_profile_brackets, cli, profile_checkpoint, save_checkpoint

from ..tolerances import BRACKET_MARGIN, DIFFERS, F64_REDUCTION

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_torch_thread")

D64 = torch.float64
N = 12  # > ModernBERT's local window (|i - j| <= 4) and the length of every other structure
TOKENS = dict(pad_token_id=0, bos_token_id=0, eos_token_id=0)
SHAPE = dict(
    hidden_size=32,
    num_attention_heads=4,
    num_hidden_layers=2,
    intermediate_size=37,
    max_position_embeddings=64,
)
FALCON = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, ffn_hidden_size=37)
MODERNBERT = dict(
    SHAPE, num_hidden_layers=3, local_attention=8, attention_bias=True, cls_token_id=0,
    sep_token_id=0, **TOKENS,
)  # fmt: skip

# case: (config class, model class, config kwargs, expected form of the blocks: post_ln,
#        parallel, residual_from_norm, shared norm)
CASES = {
    "distilbert": (
        "DistilBertConfig", "DistilBertModel",
        dict(dim=32, n_heads=4, n_layers=2, hidden_dim=37, max_position_embeddings=64,
             pad_token_id=0),
        (True, False, False, False),
    ),
    "opt": (
        "OPTConfig", "OPTModel",
        dict(SHAPE, ffn_dim=37, word_embed_proj_dim=32, **TOKENS), (False, False, False, False),
    ),
    # Post-LN OPT (350m), norms without gain or shift, no biases
    "opt_post_ln": (
        "OPTConfig", "OPTModel",
        dict(SHAPE, ffn_dim=37, word_embed_proj_dim=32, do_layer_norm_before=False,
             layer_norm_elementwise_affine=False, enable_bias=False, **TOKENS),
        (True, False, False, False),
    ),
    # fused qkv_proj and gate_up_proj, grouped-query heads, partial rotary
    "phi3": (
        "Phi3Config", "Phi3Model",
        dict(SHAPE, num_key_value_heads=2, partial_rotary_factor=0.5, **TOKENS),
        (False, False, False, False),
    ),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXModel", dict(SHAPE, **TOKENS), (False, True, False, False)),
    "gpt_neox_sequential": (
        "GPTNeoXConfig", "GPTNeoXModel", dict(SHAPE, use_parallel_residual=False, **TOKENS),
        (False, False, False, False),
    ),
    # Falcon-7B's layout: multi-query, parallel attention with one shared norm
    "falcon": ("FalconConfig", "FalconModel", dict(FALCON, **TOKENS), (False, True, False, True)),
    # Falcon-40B's: grouped heads, ln_attn and ln_mlp; with biases
    "falcon_new": (
        "FalconConfig", "FalconModel",
        dict(FALCON, new_decoder_architecture=True, num_kv_heads=2, bias=True, **TOKENS),
        (False, True, False, False),
    ),
    "falcon_new_one_norm": (
        "FalconConfig", "FalconModel",
        dict(FALCON, new_decoder_architecture=True, num_kv_heads=2, num_ln_in_parallel_attn=1,
             **TOKENS),
        (False, True, False, True),
    ),
    "falcon_sequential": (
        "FalconConfig", "FalconModel",
        dict(FALCON, parallel_attn=False, multi_query=False, bias=True, **TOKENS),
        (False, False, False, False),
    ),
    "bloom": (
        "BloomConfig", "BloomModel", dict(hidden_size=32, n_head=4, n_layer=2),
        (False, False, False, False),
    ),
    "bloom_residual_post_ln": (
        "BloomConfig", "BloomModel",
        dict(hidden_size=32, n_head=4, n_layer=2, apply_residual_connection_post_layernorm=True),
        (False, False, True, False),
    ),
    # layer 0 global with no first norm, layers 1 and 2 local; norms without shift
    "modernbert": ("ModernBertConfig", "ModernBertModel", dict(MODERNBERT), (False,) * 4),
    "modernbert_biases": (
        "ModernBertConfig", "ModernBertModel", dict(MODERNBERT, norm_bias=True, mlp_bias=True),
        (False,) * 4,
    ),
}  # fmt: skip


def _model(case: str, vocab: int = 100, dtype: torch.dtype = D64):
    """A tiny model of ``case`` with random weights, norm gains, biases and shifts."""
    config, model_cls, kw, _ = CASES[case]
    cfg = getattr(transformers, config)(**kw, vocab_size=vocab, attn_implementation="eager")
    return seeded_model(cfg, getattr(transformers, model_cls), norm_centre=1.0).to(dtype)


# ----------------------------------------------------------------------------------------------
# The block map against the model's own layer
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES))
def test_blocks_equal_the_model_layers(case, monkeypatch):
    model = _model(case)
    patch_float32_steps(model, monkeypatch)
    xs, ys, xa = block_io(model, token_ids(N, seed=2))
    blocks = model_blocks(model)
    assert [b.layer for b in blocks] == list(range(len(xs)))
    post_ln, parallel, from_norm, shared = CASES[case][3]
    for b in blocks:
        assert (b.post_ln, b.parallel, b.residual_from_norm) == (post_ln, parallel, from_norm)
        assert (b.norm2 is b.norm1) == shared
        with torch.no_grad():
            y = b(xs[b.layer])
            x_att = b.attention_input(xs[b.layer])
        # the same float64 operations, some in another order: rounding only
        assert rel_error(y, ys[b.layer]) <= F64_REDUCTION
        # what the profile brackets is what enters the model's attention module
        assert rel_error(x_att, xa[b.layer]) <= F64_REDUCTION
    with torch.no_grad():  # chaining the blocks gives the next layer's input
        assert rel_error(blocks[0](xs[0]), xs[1]) <= F64_REDUCTION
    if case.startswith("modernbert"):  # no first norm on layer 0: the attention reads x itself
        assert blocks[0].norm1 is None and blocks[1].norm1 is not None
        assert torch.equal(xa[0], xs[0])
        assert blocks[1].attention.params.heads[0].variants  # the local window acts at N


@pytest.mark.parametrize("case", ["opt", "gpt_neox", "falcon", "falcon_new", "bloom", "modernbert"])
def test_a_misread_form_shows(case, monkeypatch):
    """The checks above can fail: the block with its residual form flipped is off by O(1)."""
    model = _model(case)
    patch_float32_steps(model, monkeypatch)
    xs, ys, _ = block_io(model, token_ids(N, seed=2))
    b = model_blocks(model, [1])[0]
    flip = {
        "opt": dict(post_ln=True),
        "gpt_neox": dict(parallel=False),
        "falcon": dict(parallel=False),
        "falcon_new": dict(norm2=b.norm1),
        "bloom": dict(residual_from_norm=True),
        "modernbert": dict(norm1=None),
    }[case]
    with torch.no_grad():
        assert rel_error(dataclasses.replace(b, **flip)(xs[1]), ys[1]) > DIFFERS


@pytest.mark.parametrize(
    "case", ["phi3", "gpt_neox", "falcon", "falcon_new", "bloom", "modernbert"]
)
def test_fused_projections_are_split(case):
    """q, k, v (and gate, up) are the fused weight's rows, each once, in the heads' shapes."""
    model = _model(case)
    b = model_blocks(model, [0])[0]
    info = b.attention.info
    blk = layer_modules(model, arch_of(model))[0]
    H, Hkv, k, d = info.n_heads, info.n_kv_heads, info.head_dim, info.d
    lin = b.linears
    assert {n: tuple(W.shape) for n, (W, _) in lin.items() if n in "qkvo"} == {
        "q": (H * k, d), "k": (Hkv * k, d), "v": (Hkv * k, d), "o": (d, H * k),
    }  # fmt: skip
    fused = attention_module(model, arch_of(model), 0)
    qkv = next(
        getattr(fused, n) for n in ("qkv_proj", "query_key_value", "Wqkv") if hasattr(fused, n)
    )

    def rows(*Ws):
        return sorted(map(tuple, torch.cat(Ws).tolist()))

    assert rows(lin["q"][0], lin["k"][0], lin["v"][0]) == rows(qkv.weight.detach())
    d_ff = lin["up"][0].shape[0]
    assert lin["down"][0].shape == (d, d_ff)
    if "gate" in lin:  # [gate; up] in this order: the MLP test above tells the halves apart
        gate_up = blk.mlp.gate_up_proj if case == "phi3" else blk.mlp.Wi
        assert torch.equal(torch.cat([lin["gate"][0], lin["up"][0]]), gate_up.weight.detach())


@pytest.mark.parametrize("case", ["falcon", "bloom_residual_post_ln", "modernbert"])
def test_profile_brackets_hold(case, monkeypatch):
    """The profile's numbers against dense oracles: each block's and each attention sublayer's
    Jacobian norm (reverse-mode autograd, float64 SVD) lies in the recorded bracket, at the
    attention input the block gives (after the first norm; ModernBERT's layer 0: none)."""
    model = _model(case)
    patch_float32_steps(model, monkeypatch)
    ids = token_ids(N, seed=2)
    prof = profile_model(model, ids, n=N, heads=False)
    xs, _, _ = block_io(model, ids)
    assert_profile_brackets(prof, model, xs, N)
    assert prof.chains and all(c.holds for c in prof.chains)


# ----------------------------------------------------------------------------------------------
# Settings that are not modelled: one line naming them
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case, setting, words",
    [
        (
            "bloom",
            dict(pretraining_tp=2, slow_but_exact=True),
            "slow_but_exact with pretraining_tp=2",
        ),
        # transformers' layer has ln_attn/ln_mlp here but its forward reads input_layernorm
        ("falcon", dict(num_ln_in_parallel_attn=2), "num_ln_in_parallel_attn=2"),
        # new_decoder_architecture needs parallel_attn (its forward has no sequential branch)
        ("falcon_new", dict(parallel_attn=False), "parallel_attn=False"),
        ("falcon_new_one_norm", dict(num_ln_in_parallel_attn=3), "num_ln_in_parallel_attn=3"),
        ("opt", dict(activation_function="gelu_fast"), "activation 'gelu_fast'"),
        ("distilbert", dict(activation="quick_gelu"), "activation 'quick_gelu'"),
    ],
)
def test_unmodelled_settings_are_refused_in_one_line(case, setting, words):
    cfg_kw = dict(CASES[case][2])
    cfg_kw.update(setting)
    config, model_cls = CASES[case][:2]
    cfg = getattr(transformers, config)(**cfg_kw, vocab_size=100, attn_implementation="eager")
    model = seeded_model(cfg, getattr(transformers, model_cls))
    with pytest.raises(UnmodelledFeature, match=words) as err:
        model_blocks(model)
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------------------------
# The command on checkpoint directories
# ----------------------------------------------------------------------------------------------


# a Post-LN encoder, a parallel-residual rotary decoder, and ModernBERT (identity norm on layer 0,
# GeGLU, a local layer whose window acts at n = 10)
@pytest.mark.parametrize("case", ["distilbert", "falcon", "modernbert"])
def test_cli_profiles_a_saved_checkpoint(case, tokenizer, tmp_path, capsys):
    model = _model(case, vocab=tokenizer.vocab_size, dtype=torch.float32)
    doc, _ = profile_checkpoint(model, tokenizer, tmp_path, f"tiny-{case}", 10, capsys)
    n_layers = len(layer_modules(model, arch_of(model)))
    assert doc["layers"] == list(range(n_layers)) and doc["ns"] == [10]
    assert len(doc["records"]) == n_layers
    for r in doc["records"]:
        a, b = r["attention"], r["block"]
        assert all(isinstance(v, float) and 0 < v < math.inf for v in (a["lower"], b["lower"]))
        ends = [a["upper_prob"], b["upper_prob"]] + ([] if a["upper"] == "inf" else [a["upper"]])
        assert all(isinstance(v, float) and math.isfinite(v) for v in ends)
        assert a["lower"] <= a["upper_prob"] and b["lower"] <= b["upper_prob"]
    assert len(doc["chains"]) == 1 and all(c["holds"] for c in doc["chains"])
    names = {"q", "k", "v", "o", "up", "down"} | ({"gate"} if case == "modernbert" else set())
    for entry in doc["linear"]:  # every linear map of every layer, certified
        assert {m["name"] for m in entry["maps"]} == names
        assert all(0 < m["sigma"] <= m["upper"] < math.inf for m in entry["maps"])


@pytest.mark.parametrize(
    "case", ["distilbert", "opt", "phi3", "gpt_neox", "falcon", "bloom", "modernbert"]
)
def test_cli_lipschitz_reads_a_saved_checkpoint(case, tokenizer, tmp_path, capsys):
    """`meanfield lipschitz --model DIR` on a saved checkpoint of each family: a certified bracket
    around the value at the input of the layer's own attention module (the map itself is checked
    against the model in tests/meanfield/test_hf_families.py)."""
    model = _model(case, vocab=tokenizer.vocab_size, dtype=torch.float32)
    ckpt = save_checkpoint(tmp_path / f"tiny-{case}", model, tokenizer)
    text = tmp_path / "text.txt"
    text.write_text("In the beginning God created the heaven and the earth. " * 4)
    argv = ["lipschitz", "--model", ckpt, "--layer", 1, "--n", 10, "--corpus", text, "--json"]
    rc, out, err = cli(argv + ["--windows", 1], capsys)
    assert rc == 0, err
    doc = json.loads(out)
    module = type(attention_module(model, arch_of(model), 1)).__name__
    assert doc["mode"] == "model" and doc["source"]["module"] == module and doc["n"] == 10
    (row,) = doc["inputs"]
    assert row["certified"] and 0 < row["lower"] <= row["value"] <= row["upper_prob"]
    assert row["upper_prob"] <= 1.05 * row["lower"] * (1 + BRACKET_MARGIN)  # the default width
