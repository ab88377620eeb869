"""Hugging Face families: the extracted map equals the model's own attention, or a one-line refusal.

Every supported family is built from its transformers config class at a tiny size (nothing is
downloaded), with random weights large enough for non-uniform attention and nonzero biases. A
full forward pass with eager attention captures, by hooks, the input of the layer's attention
module, the input of its output projection (the ``"heads"`` map) and the output of the output
projection (the ``"heads+WO"`` map); :func:`hf_attention` evaluated on the captured input must
reproduce both, with the model's own causal flag.

Tolerances (relative: max abs error / max abs reference):

- float32 models: 1e-6 (measured at most ~6e-7).
- float64 models: 1e-12, with the two float32 steps of transformers patched out: eager attention
  takes its softmax in float32 for most families (``softmax(..., dtype=float32)``), and rotary
  embeddings compute cos/sin from float32 angles (ModernBERT also rotates q and k in float32).
  Unpatched, float64 models agree only at float32
  level (~1e-7), which ``test_float64_unpatched_is_float32_level`` checks.
"""

from __future__ import annotations

import math
import sys
from functools import partial

import pytest
import torch

from meanfield import local_lipschitz, self_attention

transformers = pytest.importorskip("transformers")

from meanfield.models import (  # noqa: E402
    hf_attention,
    hf_attention_fn,
    hidden_states,
    is_causal,
    layer_info,
    params_from_hf,
)

D32, D64 = torch.float32, torch.float64
N = 12
SHAPE = dict(
    hidden_size=32,
    num_attention_heads=4,
    num_hidden_layers=2,
    intermediate_size=37,
    vocab_size=100,
    max_position_embeddings=64,
)
TOKENS = dict(pad_token_id=0, bos_token_id=0, eos_token_id=0)
VISION = dict(
    hidden_size=32,
    num_attention_heads=4,
    num_hidden_layers=2,
    intermediate_size=37,
    image_size=16,
    patch_size=4,
)
FALCON = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, vocab_size=100, **TOKENS)


# name: (config class, model class, config kwargs, layer, attention module, output projection,
#        expected (arch, causal, n_heads, n_kv_heads, has_rope))
CASES = {
    "bert": (
        "BertConfig", "BertModel", dict(SHAPE), 1,
        "encoder.layer.{b}.attention.self", "encoder.layer.{b}.attention.output.dense",
        ("bert", False, 4, 4, False),
    ),
    "bert_decoder": (
        "BertConfig", "BertModel", dict(SHAPE, is_decoder=True), 1,
        "encoder.layer.{b}.attention.self", "encoder.layer.{b}.attention.output.dense",
        ("bert", True, 4, 4, False),
    ),
    "roberta": (
        "RobertaConfig", "RobertaModel", dict(SHAPE, pad_token_id=1, max_position_embeddings=80),
        1, "encoder.layer.{b}.attention.self", "encoder.layer.{b}.attention.output.dense",
        ("bert", False, 4, 4, False),
    ),
    "electra": (
        "ElectraConfig", "ElectraModel", dict(SHAPE, embedding_size=16), 1,
        "encoder.layer.{b}.attention.self", "encoder.layer.{b}.attention.output.dense",
        ("bert", False, 4, 4, False),
    ),
    "distilbert": (
        "DistilBertConfig", "DistilBertModel",
        dict(dim=32, n_heads=4, n_layers=2, hidden_dim=37, vocab_size=100,
             max_position_embeddings=64, pad_token_id=0),
        1, "transformer.layer.{b}.attention", "transformer.layer.{b}.attention.out_lin",
        ("distilbert", False, 4, 4, False),
    ),
    "vit": (
        "ViTConfig", "ViTModel", dict(VISION), 1, "layers.{b}.attention",
        "layers.{b}.attention.o_proj", ("vit", False, 4, 4, False),
    ),
    "deit": (
        "DeiTConfig", "DeiTModel", dict(VISION), 1, "layers.{b}.attention",
        "layers.{b}.attention.o_proj", ("vit", False, 4, 4, False),
    ),
    "gpt2": (
        "GPT2Config", "GPT2Model",
        dict(n_embd=32, n_head=4, n_layer=2, vocab_size=100, n_positions=64, bos_token_id=0,
             eos_token_id=0),
        1, "h.{b}.attn", "h.{b}.attn.c_proj", ("gpt2", True, 4, 4, False),
    ),
    "opt": (
        "OPTConfig", "OPTModel",
        dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, ffn_dim=37,
             vocab_size=100, max_position_embeddings=64, word_embed_proj_dim=32, **TOKENS),
        1, "decoder.layers.{b}.self_attn", "decoder.layers.{b}.self_attn.out_proj",
        ("opt", True, 4, 4, False),
    ),
    "llama": (
        "LlamaConfig", "LlamaModel", dict(SHAPE, num_key_value_heads=2, **TOKENS), 1,
        "layers.{b}.self_attn", "layers.{b}.self_attn.o_proj", ("llama", True, 4, 2, True),
    ),
    "mistral": (
        "MistralConfig", "MistralModel",
        dict(SHAPE, num_key_value_heads=2, sliding_window=16, **TOKENS), 1,
        "layers.{b}.self_attn", "layers.{b}.self_attn.o_proj", ("llama", True, 4, 2, True),
    ),
    "gemma": (
        "GemmaConfig", "GemmaModel", dict(SHAPE, num_key_value_heads=2, head_dim=8, **TOKENS), 1,
        "layers.{b}.self_attn", "layers.{b}.self_attn.o_proj", ("llama", True, 4, 2, True),
    ),
    # Gemma-2 without soft-cap, a window longer than n and query_pre_attn_scalar != head_dim
    "gemma2": (
        "Gemma2Config", "Gemma2Model",
        dict(SHAPE, num_key_value_heads=2, head_dim=8, attn_logit_softcapping=None,
             query_pre_attn_scalar=12, sliding_window=32, **TOKENS),
        1, "layers.{b}.self_attn", "layers.{b}.self_attn.o_proj", ("llama", True, 4, 2, True),
    ),
    "phi3": (
        "Phi3Config", "Phi3Model", dict(SHAPE, num_key_value_heads=2, **TOKENS), 1,
        "layers.{b}.self_attn", "layers.{b}.self_attn.o_proj", ("phi3", True, 4, 2, True),
    ),
    "gpt_neox": (
        "GPTNeoXConfig", "GPTNeoXModel",
        dict(SHAPE, rotary_pct=1.0, attention_bias=False, **TOKENS), 1,
        "layers.{b}.attention", "layers.{b}.attention.dense", ("gpt_neox", True, 4, 4, True),
    ),
    "falcon_multi_query": (
        "FalconConfig", "FalconModel", dict(FALCON), 1, "h.{b}.self_attention",
        "h.{b}.self_attention.dense", ("falcon", True, 4, 1, True),
    ),
    "falcon_per_head": (
        "FalconConfig", "FalconModel", dict(FALCON, multi_query=False), 1,
        "h.{b}.self_attention", "h.{b}.self_attention.dense", ("falcon", True, 4, 4, True),
    ),
    "falcon_grouped": (
        "FalconConfig", "FalconModel",
        dict(FALCON, new_decoder_architecture=True, num_kv_heads=2), 1,
        "h.{b}.self_attention", "h.{b}.self_attention.dense", ("falcon", True, 4, 2, True),
    ),
    # ModernBERT: layer 0 is global; layers 1 and 2 are local (window: |i - j| <= 8)
    "modernbert_global": (
        "ModernBertConfig", "ModernBertModel",
        dict(SHAPE, num_hidden_layers=3, local_attention=16, cls_token_id=0, sep_token_id=0,
             **TOKENS),
        0, "layers.{b}.attn", "layers.{b}.attn.Wo", ("modernbert", False, 4, 4, True),
    ),
    "modernbert_local": (
        "ModernBertConfig", "ModernBertModel",
        dict(SHAPE, num_hidden_layers=3, local_attention=16, cls_token_id=0, sep_token_id=0,
             **TOKENS),
        1, "layers.{b}.attn", "layers.{b}.attn.Wo", ("modernbert", False, 4, 4, True),
    ),
}  # fmt: skip
#: Sequence length per case (ModernBERT's local layer sees |i - j| <= 8: exact for n <= 9).
LENGTH = {"modernbert_local": 9}
ROTARY = [c for c, v in CASES.items() if v[6][4]]


# ----------------------------------------------------------------------------------------------
# Models and capture
# ----------------------------------------------------------------------------------------------


def _randomize(model: torch.nn.Module) -> None:
    """Weights of std ~1.5/sqrt(fan-in) (non-uniform attention) and nonzero biases."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            low = name.lower()
            if p.ndim == 2 and not any(s in low for s in ("embed", "wte", "wpe", "patch")):
                p.copy_(torch.randn(p.shape, generator=g) * 1.5 / math.sqrt(p.shape[1]))
            elif p.ndim == 1 and not any(s in low for s in ("norm", "ln_")):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))


def build(config: str, model: str, dtype: torch.dtype = D32, **kwargs):
    """A seeded tiny model with eager attention, in eval mode."""
    cfg = getattr(transformers, config)(attn_implementation="eager", **kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        m = getattr(transformers, model)(cfg)
    _randomize(m)
    return m.eval().to(dtype)


_MODELS: dict = {}


def case_model(case: str, dtype: torch.dtype):
    key = (case, dtype)
    if key not in _MODELS:
        cfg_cls, model_cls, kw = CASES[case][:3]
        _MODELS[key] = build(cfg_cls, model_cls, dtype, **kw)
    return _MODELS[key]


def model_inputs(model, n: int, dtype: torch.dtype, seed: int = 2) -> dict:
    g = torch.Generator().manual_seed(seed)
    if "pixel_values" in model.main_input_name:
        size = model.config.image_size
        return {"pixel_values": torch.randn(2, 3, size, size, generator=g, dtype=dtype)}
    return {"input_ids": torch.randint(2, 100, (2, n), generator=g)}


def capture(model, attn_path: str, out_path: str, inputs: dict) -> dict:
    """Input of the attention module (x), input (heads) and output (y) of the output projection."""
    base = model.base_model
    attn, out = base.get_submodule(attn_path), base.get_submodule(out_path)
    got: dict = {}

    def pre_attn(module, args, kwargs):
        got.setdefault("x", args[0] if args else kwargs["hidden_states"])

    def pre_out(module, args):
        got.setdefault("heads", args[0])

    def post_out(module, args, output):
        got.setdefault("heads+WO", output)

    hooks = [
        attn.register_forward_pre_hook(pre_attn, with_kwargs=True),
        out.register_forward_pre_hook(pre_out),
        out.register_forward_hook(post_out),
    ]
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for h in hooks:
            h.remove()
    return got


def run_case(case: str, dtype: torch.dtype, n: int | None = None) -> tuple:
    model = case_model(case, dtype)
    _, _, _, layer, attn_path, out_path, _ = CASES[case]
    n = LENGTH.get(case, N) if n is None else n
    got = capture(
        model, attn_path.format(b=layer), out_path.format(b=layer), model_inputs(model, n, dtype)
    )
    return model, layer, got


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    return float((a - b).abs().max() / b.abs().max())


# ----------------------------------------------------------------------------------------------
# float64 without transformers' float32 steps
# ----------------------------------------------------------------------------------------------


@pytest.fixture
def float64_everywhere(monkeypatch):
    """Softmax in the input's dtype for float64 inputs, and float64 cos/sin for rotary models."""
    softmax = torch.nn.functional.softmax

    def softmax64(input, dim=None, _stacklevel=3, dtype=None):
        if input.dtype == D64:
            dtype = None
        return softmax(input, dim=dim, dtype=dtype)

    monkeypatch.setattr(torch.nn.functional, "softmax", softmax64)

    def patch_rotary(model) -> None:
        rot = getattr(model.base_model, "rotary_emb", None)
        if rot is None:
            return

        def forward(x, position_ids, layer_type=None):
            pre = f"{layer_type}_" if layer_type else ""
            inv = getattr(rot, pre + "inv_freq").to(D64)
            scale = getattr(rot, pre + "attention_scaling")
            ang = position_ids[..., None].to(D64) * inv
            emb = torch.cat([ang, ang], dim=-1)
            return (emb.cos() * scale).to(x.dtype), (emb.sin() * scale).to(x.dtype)

        monkeypatch.setattr(rot, "forward", forward)
        # ModernBERT also rotates q and k in float32 (q.float() * cos + ...)
        module = sys.modules[type(model).__module__]
        if "modernbert" in module.__name__:
            from transformers.models.llama import modeling_llama

            monkeypatch.setattr(module, "apply_rotary_pos_emb", modeling_llama.apply_rotary_pos_emb)

    return patch_rotary


# ----------------------------------------------------------------------------------------------
# Supported families: the map equals the model's attention
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES))
def test_family_is_detected_with_its_layout(case):
    model = case_model(case, D32)
    layer, expected = CASES[case][3], CASES[case][6]
    info = layer_info(model, layer)
    got = (info.arch, info.causal, info.n_heads, info.n_kv_heads, info.has_rope)
    assert got == expected
    assert is_causal(model) == expected[1]
    assert info.capture_point.startswith("input of ")


@pytest.mark.parametrize("map_", ["heads", "heads+WO"])
@pytest.mark.parametrize("case", list(CASES))
def test_map_equals_model_attention_float32(case, map_):
    model, layer, got = run_case(case, D32)
    X = got["x"]
    att = hf_attention(model, layer, map=map_, n=X.shape[-2])
    with torch.no_grad():
        Y = att(X)
    assert rel_err(Y, got[map_]) <= 1e-6
    # the same through the public pure map and the parameters
    params = params_from_hf(model, layer, map=map_, n=X.shape[-2])
    with torch.no_grad():
        assert torch.equal(self_attention(X, params, masked=att.causal), Y)


@pytest.mark.parametrize("map_", ["heads", "heads+WO"])
@pytest.mark.parametrize("case", list(CASES))
def test_map_equals_model_attention_float64(case, map_, float64_everywhere):
    float64_everywhere(case_model(case, D64))
    model, layer, got = run_case(case, D64)
    X = got["x"]
    with torch.no_grad():
        Y = hf_attention(model, layer, map=map_, n=X.shape[-2])(X)
    assert rel_err(Y, got[map_]) <= 1e-12


@pytest.mark.parametrize("case", ["llama", "opt", "vit", "modernbert_global"])
def test_float64_unpatched_is_float32_level(case):
    """Stock eager attention: float32 softmax and float32 cos/sin in a float64 model."""
    model, layer, got = run_case(case, D64)
    with torch.no_grad():
        Y = hf_attention(model, layer, n=got["x"].shape[-2])(got["x"])
    assert rel_err(Y, got["heads+WO"]) <= 1e-6


def test_distilbert_block_equals_sa_layer_norm():
    model = case_model("distilbert", D64)
    blk = model.transformer.layer[1]
    got: dict = {}

    def pre(module, args, kwargs):
        got.setdefault("x", args[0] if args else kwargs["hidden_states"])

    def post(module, args, output):
        got.setdefault("y", output)

    h1 = blk.register_forward_pre_hook(pre, with_kwargs=True)
    h2 = blk.sa_layer_norm.register_forward_hook(post)
    try:
        with torch.no_grad():
            model(**model_inputs(model, N, D64))
    finally:
        h1.remove()
        h2.remove()
    att = hf_attention(model, 1, map="block")
    assert att.info.module.endswith("sa_layer_norm")
    with torch.no_grad():
        assert rel_err(att(got["x"]), got["y"]) <= 1e-12


def test_fused_layouts_slice_heads():
    """GPT-NeoX interleaves [q_h; k_h; v_h] per head; Falcon-40B groups [q_1..q_r; k_g; v_g]."""
    neox = case_model("gpt_neox", D64)
    W = neox.base_model.layers[0].attention.query_key_value.weight
    p = params_from_hf(neox, 0, map="heads")
    k = 8
    assert torch.equal(p.heads[1].V, W[1 * 3 * k + 2 * k : 1 * 3 * k + 3 * k])
    falcon = case_model("falcon_grouped", D64)
    W = falcon.base_model.h[0].self_attention.query_key_value.weight
    p = params_from_hf(falcon, 0, map="heads")
    # 2 groups of (2 queries, 1 key, 1 value); head 3 is group 1, its value is row block 7
    assert torch.equal(p.heads[3].V, W[7 * k : 8 * k])
    assert torch.equal(p.heads[2].V, p.heads[3].V)


# ----------------------------------------------------------------------------------------------
# Sliding windows: exact up to the window, refused beyond it
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("case", "window"), [("mistral", 16), ("modernbert_local", 9)])
def test_window_boundary(case, window):
    model, layer, got = run_case(case, D64, n=window)
    assert layer_info(model, layer).window == window
    att = hf_attention(model, layer, n=window)
    with torch.no_grad():
        assert rel_err(att(got["x"]), got["heads+WO"]) <= 1e-6
    # one token more: the model's window masks, the full map would differ
    model, layer, got = run_case(case, D64, n=window + 1)
    params = params_from_hf(model, layer, n=window)
    with torch.no_grad():
        full = self_attention(got["x"], params, masked=att.causal)
    assert rel_err(full, got["heads+WO"]) > 1e-3
    for call in (
        partial(hf_attention, model, layer, n=window + 1),
        partial(params_from_hf, model, layer, n=window + 1),
        partial(att, got["x"]),
    ):
        with pytest.raises(
            ValueError, match=f"sliding-window attention \\(window {window}\\)"
        ) as e:
            call()
        assert isinstance(e.value, NotImplementedError) and "\n" not in str(e.value)


def test_window_without_n_is_conservative():
    cfg = dict(SHAPE, num_key_value_heads=2, **TOKENS)
    short = build("MistralConfig", "MistralModel", sliding_window=16, **cfg)
    with pytest.raises(ValueError, match=r"window 16.*n not given and the model takes 64"):
        params_from_hf(short, 0)
    # a window covering every position changes nothing
    wide = build("MistralConfig", "MistralModel", sliding_window=64, **cfg)
    assert hf_attention(wide, 0).max_n == 64
    default = build("MistralConfig", "MistralModel", **cfg)  # sliding_window = 4096
    assert params_from_hf(default, 0).n_heads == 4


# ----------------------------------------------------------------------------------------------
# Refused features: one line naming what is missing
# ----------------------------------------------------------------------------------------------

REFUSED = {
    "gemma2_softcap": (
        "Gemma2Config", "Gemma2Model", dict(SHAPE, head_dim=8, **TOKENS),
        r"soft-capping \(attn_logit_softcapping=50.0\)",
    ),
    "gemma2_bidirectional": (
        "Gemma2Config", "Gemma2Model",
        dict(SHAPE, head_dim=8, attn_logit_softcapping=None, use_bidirectional_attention=True,
             **TOKENS),
        "bidirectional attention",
    ),
    "qwen2_qk_bias": ("Qwen2Config", "Qwen2Model", dict(SHAPE, **TOKENS), "query/key biases"),
    "qwen2_window": (
        "Qwen2Config", "Qwen2Model",
        dict(SHAPE, use_sliding_window=True, sliding_window=8, max_window_layers=0, **TOKENS),
        "query/key biases",  # the first missing feature is named
    ),
    "qwen3_qk_norm": ("Qwen3Config", "Qwen3Model", dict(SHAPE, head_dim=8, **TOKENS), "QK-norm"),
    "olmo2_qk_norm": ("Olmo2Config", "Olmo2Model", dict(SHAPE, **TOKENS), "QK-norm"),
    "olmo_clip_qkv": ("OlmoConfig", "OlmoModel", dict(SHAPE, clip_qkv=1.0, **TOKENS), "clip_qkv"),
    "bloom_alibi": (
        "BloomConfig", "BloomModel", dict(hidden_size=32, n_head=4, n_layer=2, vocab_size=100),
        "ALiBi",
    ),
    "falcon_alibi": ("FalconConfig", "FalconModel", dict(FALCON, alibi=True), "ALiBi"),
    "neox_partial_rotary": (
        "GPTNeoXConfig", "GPTNeoXModel", dict(SHAPE, attention_bias=False, **TOKENS),
        r"partial rotary embedding \(2 of 8 dims, partial_rotary_factor=0.25\)",
    ),
    "neox_qk_bias": (
        "GPTNeoXConfig", "GPTNeoXModel", dict(SHAPE, rotary_pct=1.0, **TOKENS), "query/key biases",
    ),
    "falcon_qk_bias": ("FalconConfig", "FalconModel", dict(FALCON, bias=True), "query/key biases"),
    "phi3_partial_rotary": (
        "Phi3Config", "Phi3Model", dict(SHAPE, partial_rotary_factor=0.5, **TOKENS),
        "partial rotary embedding",
    ),
    "llama_dynamic_rope": (
        "LlamaConfig", "LlamaModel",
        dict(SHAPE, rope_scaling={"rope_type": "dynamic", "factor": 2.0}, **TOKENS),
        "rope_type 'dynamic'",
    ),
    "llama_qk_bias": (
        "LlamaConfig", "LlamaModel", dict(SHAPE, attention_bias=True, **TOKENS), "query/key biases",
    ),
    "modernbert_qk_bias": (
        "ModernBertConfig", "ModernBertModel",
        dict(SHAPE, attention_bias=True, cls_token_id=0, sep_token_id=0, **TOKENS),
        "query/key biases",
    ),
    "cohere_interleaved_rotary": (
        "CohereConfig", "CohereModel", dict(SHAPE, **TOKENS), "not in the rotate_half layout",
    ),
    "mistral_window": (
        "MistralConfig", "MistralModel", dict(SHAPE, sliding_window=8, **TOKENS),
        r"sliding-window attention \(window 8\)",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(REFUSED))
def test_unmodelled_feature_is_a_one_line_error(case):
    cfg_cls, model_cls, kw, message = REFUSED[case]
    model = build(cfg_cls, model_cls, **kw)
    for call in (
        partial(params_from_hf, model, 0, n=N),
        partial(hf_attention, model, 0, n=N),
        partial(hf_attention_fn, model, 0, n=N),
    ):
        with pytest.raises(NotImplementedError, match=message) as e:
            call()
        assert isinstance(e.value, ValueError)
        assert "\n" not in str(e.value)


def test_gemma2_default_layers_name_softcap_before_window():
    model = build("Gemma2Config", "Gemma2Model", **dict(SHAPE, head_dim=8, **TOKENS))
    assert layer_info(model, 0).window == 4096  # layer 0 is a sliding layer
    with pytest.raises(ValueError, match="soft-capping"):
        params_from_hf(model, 1, n=N)


def test_unsupported_model_names_the_supported_families():
    cfg = transformers.T5Config(
        d_model=32, d_kv=8, num_heads=4, num_layers=1, d_ff=37, vocab_size=100
    )
    model = transformers.T5EncoderModel(cfg)
    with pytest.raises(NotImplementedError, match="unsupported model T5EncoderModel") as e:
        layer_info(model, 0)
    msg = str(e.value)
    assert "\n" not in msg
    for family in ("BERT", "DistilBERT", "ViT", "GPT-2", "OPT", "Llama", "GPT-NeoX", "Falcon"):
        assert family in msg


# ----------------------------------------------------------------------------------------------
# Capture and Lipschitz constants
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case", ["distilbert", "opt", "phi3", "falcon_grouped", "modernbert_global"]
)
def test_hidden_states_capture_the_attention_input(case):
    model, layer, got = run_case(case, D64)
    ids = model_inputs(model, N, D64)["input_ids"][:1].reshape(-1)
    hs = hidden_states(model, None, ids, layer, N, n_windows=1, dtype=D64)
    assert torch.equal(hs.X[0], got["x"][0])


def test_hidden_states_refuses_vision_and_token_types():
    with pytest.raises(ValueError, match="reads pixel_values"):
        hidden_states(case_model("vit", D32), None, torch.arange(20), 0, 4, n_windows=1)
    with pytest.raises(ValueError, match="OPT models take no token_type_ids"):
        hidden_states(
            case_model("opt", D32), None, torch.arange(20), 0, 4, n_windows=1,
            token_type_ids="zeros",
        )  # fmt: skip


def test_dense_and_matrix_free_lipschitz_agree():
    model, layer, got = run_case("phi3", D64, n=6)
    X = got["x"][0]
    params = params_from_hf(model, layer, n=6)
    dense = local_lipschitz(X, params, masked=True, method="dense")
    free = local_lipschitz(X, params, masked=True, method="lanczos", tol=1e-10)
    assert float(dense.value) > 0
    assert math.isclose(float(dense.value), float(free.value), rel_tol=1e-8)


def test_other_layer_types_are_refused():
    kw = dict(SHAPE, layer_types=["full_attention", "chunked_attention"], **TOKENS)
    model = build("Qwen2Config", "Qwen2Model", **kw)
    with pytest.raises(ValueError, match="layer 1 is a 'chunked_attention' layer") as e:
        params_from_hf(model, 1, n=N)
    assert isinstance(e.value, NotImplementedError) and "\n" not in str(e.value)
