"""Small random Hugging Face models and hooks shared by the tests of meanfield.models.

Imported by tests/meanfield/test_models_*.py (pytest picks up the fixtures imported into a test module):
``from .models_fixtures import *`` brings the fixtures listed in ``__all__``; the helpers and
constants are imported by name where they are used.
"""

from __future__ import annotations

import pytest
import torch

from meanfield.models import tiny_config

from .hf_float64 import patch_softmax64

transformers = pytest.importorskip("transformers")

#: The fixtures (pytest finds them by the argument names of the tests).
__all__ = ["X", "bert", "bert_decoder", "gpt2", "llama", "llama_fp64_softmax"]

D64 = torch.float64
D, H, N = 64, 4, 7
#: The special-token ids of the tests' tiny Llama configs (all 0).
LLAMA_TOKENS = dict(bos_token_id=0, eos_token_id=0, pad_token_id=0)


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


def _build(model_cls, cfg, seed: int, bias_seed: int):
    """A seeded float64 model in eval mode with random biases."""
    m = _seeded(lambda: model_cls(cfg), seed).eval().to(D64)
    _randomize_biases(m, bias_seed)
    return m


def fixture_config(arch: str, **extra):
    """The shared tiny shape: width D, H heads, 2 layers, 100 tokens, 64 positions (eager)."""
    return tiny_config(arch, d=D, heads=H, vocab=100, positions=64, **extra)


def _bert(seed: int, bias_seed: int, **extra):
    cfg = fixture_config("bert", intermediate=96, **extra)
    return _build(transformers.BertModel, cfg, seed, bias_seed)


@pytest.fixture(scope="module")
def bert():
    return _bert(0, 1)


@pytest.fixture(scope="module")
def bert_decoder():
    return _bert(3, 3, is_decoder=True)


@pytest.fixture(scope="module")
def gpt2():
    cfg = fixture_config("gpt2", bos_token_id=0, eos_token_id=0)
    return _build(transformers.GPT2Model, cfg, 1, 2)


@pytest.fixture(scope="module")
def llama():
    cfg = fixture_config("llama", kv_heads=2, intermediate=96, rope_theta=1000.0, **LLAMA_TOKENS)
    return _build(transformers.LlamaForCausalLM, cfg, 2, 4)


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


def run_capturing(model, module, ids) -> dict:
    """Run ``model`` on ``ids``; return the first input ``"x"`` and output ``"y"`` of ``module``."""
    got: dict = {}
    h1 = module.register_forward_pre_hook(store_input(got), with_kwargs=True)
    h2 = module.register_forward_hook(store_output(got))
    try:
        with torch.no_grad():
            model(input_ids=ids)
    finally:
        h1.remove()
        h2.remove()
    return got


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
    patch_softmax64(monkeypatch)
