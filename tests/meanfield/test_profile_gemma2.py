"""`meanfield.profile` on Gemma blocks, and `meanfield profile` on Gemma-2 and Qwen3 checkpoints.

Oracles: the model's own decoder layer in a forward pass (hooks capture what enters and leaves
each layer), in float64 with transformers' float32 steps (Gemma RMSNorm's cast, the eager
softmax's ``dtype=float32``, the rotary tables) replaced by the same formulas in float64
(``tests.hf_float64``), so the rebuilt block must agree to rounding; and the command's own
``profile.json`` for the end-to-end runs (every bracket finite, the chain rule holding).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from meanfield.profile import model_blocks, profile_model
from tests.hf_float64 import block_io, patch_float32_steps, rel_error, seeded_model, token_ids
from tests.profile_cli import *  # noqa: F403  (fixture: tokenizer)
from tests.profile_cli import assert_profile_brackets, cli, profile_checkpoint, save_checkpoint

from ..tolerances import BRACKET_MARGIN, F64_REDUCTION

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_torch_thread")

D64 = torch.float64
N = 12  # > the sliding window 5: the window masks keys on the sliding layers
TOKENS = dict(pad_token_id=0, bos_token_id=0, eos_token_id=0)
SHAPE = dict(
    hidden_size=32,
    num_attention_heads=4,
    num_hidden_layers=2,
    num_key_value_heads=2,
    head_dim=8,
    intermediate_size=37,
    max_position_embeddings=64,
    **TOKENS,
)
# the cases of tests/meanfield/test_hf_families.py: Gemma-2 with an active soft-cap 2, query_pre_attn_scalar
# 12 != head_dim and layer 0 sliding (window 5), layer 1 global; Gemma-3 with QK-norm (1 + w) and
# per-layer-type rotary; Gemma-1 (Llama's block with Gemma's RMSNorm)
CONFIGS = {
    "gemma2": (
        "Gemma2Config",
        dict(attn_logit_softcapping=2.0, query_pre_attn_scalar=12, sliding_window=5),
    ),
    "gemma3": (
        "Gemma3TextConfig",
        dict(
            query_pre_attn_scalar=12,
            sliding_window=5,
            layer_types=["sliding_attention", "full_attention"],
        ),
    ),
    "gemma": ("GemmaConfig", {}),
}


def _model(case: str, vocab: int = 100, dtype: torch.dtype = D64):
    """A tiny model of ``case`` with random weights; Gemma's norms ``1 + w`` with random ``w``."""
    config, extra = CONFIGS[case]
    cfg = getattr(transformers, config)(
        **SHAPE, **extra, vocab_size=vocab, attn_implementation="eager"
    )
    return seeded_model(cfg, norm_centre=0.0).to(dtype)


# ----------------------------------------------------------------------------------------------
# The block map against the model's own decoder layer
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(CONFIGS))
def test_gemma_blocks_equal_the_model_layers(case, monkeypatch):
    model = _model(case)
    patch_float32_steps(model, monkeypatch)
    xs, ys, _ = block_io(model, token_ids(N, seed=2))
    blocks = model_blocks(model)
    assert [b.layer for b in blocks] == [0, 1]
    for b in blocks:  # layer 0 sliding, layer 1 global (Gemma-2/3)
        assert (b.post_attention_norm is not None) == (case != "gemma")
        with torch.no_grad():
            y = b(xs[b.layer])
        # the same float64 operations in another order: rounding only
        assert rel_error(y, ys[b.layer]) <= F64_REDUCTION
    with torch.no_grad():  # chaining the blocks gives the next layer's input
        assert rel_error(blocks[0](xs[0]), xs[1]) <= F64_REDUCTION
    if case == "gemma2":
        # the window acts at this length: the sliding layer's attention is not the global one
        win = model.config.sliding_window
        assert N > win and blocks[0].attention.params.heads[0].variants


def test_gemma2_block_in_float32_with_transformers_own_steps():
    """Unpatched transformers in float32 (its norms and softmax in float32, as ours): the
    rebuilt float32 block agrees to float32 rounding (measured 2.7 and 1.7 units of float32's
    eps relative to the largest entry; a wrong norm or residual is off by O(1))."""
    model = _model("gemma2", dtype=torch.float32)
    xs, ys, _ = block_io(model, token_ids(N, seed=2))
    eps = torch.finfo(torch.float32).eps
    for b in model_blocks(model, dtype=torch.float32):
        with torch.no_grad():
            assert rel_error(b(xs[b.layer]), ys[b.layer]) <= 16 * eps


def test_gemma2_profile_brackets_hold(monkeypatch):
    """The profile's numbers on Gemma-2 against dense oracles: the block's Jacobian through the
    model's own layer (float64 steps), the attention bracket containing its dense norm."""
    model = _model("gemma2")
    patch_float32_steps(model, monkeypatch)
    ids = token_ids(N, seed=2)
    prof = profile_model(model, ids, n=N, heads=False, end_to_end=False)
    xs, _, _ = block_io(model, ids)
    assert_profile_brackets(prof, model, xs, N, chain_bound=False)


# ----------------------------------------------------------------------------------------------
# The command on checkpoint directories
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["gemma2", "qwen3"])
def test_cli_profiles_a_saved_checkpoint(family, tokenizer, tmp_path, capsys):
    vocab = tokenizer.vocab_size  # 30522: the ids of the text index the embedding
    if family == "qwen3":
        cfg = transformers.Qwen3Config(**SHAPE, vocab_size=vocab, attn_implementation="eager")
        model = seeded_model(cfg, transformers.Qwen3Model)
    else:
        model = _model("gemma2", vocab=vocab)
    doc, stdout = profile_checkpoint(model, tokenizer, tmp_path, f"tiny-{family}", 8, capsys)
    assert doc["kind"] == "profile" and doc["layers"] == [0, 1] and doc["ns"] == [8]
    assert len(doc["records"]) == 2
    for r in doc["records"]:
        a, b = r["attention"], r["block"]
        assert all(isinstance(v, float) and 0 < v < math.inf for v in (a["lower"], b["lower"]))
        # variant attention (QK-norm; soft-cap, window, scale): the streaming path, no
        # deterministic end; its probabilistic end is finite and above the lower end
        assert a["upper"] == "inf" and a["upper_method"] == "none"
        assert isinstance(a["upper_prob"], float) and a["lower"] <= a["upper_prob"] < math.inf
    assert all(c["holds"] for c in doc["chains"])
    # the table shows that end, marked, and says what the mark means
    for r in doc["records"]:
        assert f"{r['attention']['upper_prob']:.4g}*]" in stdout
    assert "* upper_prob:" in stdout and "inf]" not in stdout


@pytest.mark.parametrize("family", ["gemma2", "gemma3", "qwen3"])
def test_cli_lipschitz_reads_a_saved_checkpoint(family, tokenizer, tmp_path, capsys):
    """`meanfield lipschitz --model DIR` on saved Gemma-2 (soft-cap, window), Gemma-3 (QK-norm,
    window) and Qwen3 (QK-norm) checkpoints: the certified bracket on the streaming path, within
    the default width, at the input of the layer's own attention module."""
    vocab = tokenizer.vocab_size
    if family == "qwen3":
        cfg = transformers.Qwen3Config(**SHAPE, vocab_size=vocab, attn_implementation="eager")
        model = seeded_model(cfg, transformers.Qwen3Model)
    else:
        model = _model(family, vocab=vocab)
    ckpt = save_checkpoint(tmp_path / f"tiny-{family}", model, tokenizer)
    text = tmp_path / "text.txt"
    text.write_text("In the beginning God created the heaven and the earth. " * 4)
    argv = ["lipschitz", "--model", ckpt, "--layer", 0, "--n", N, "--corpus", text, "--json"]
    rc, out, err = cli(argv + ["--windows", 1], capsys)
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["mode"] == "model" and doc["n"] == N
    (row,) = doc["inputs"]
    assert row["certified"] and row["path"] == "streaming"  # the variants' certified path
    assert 0 < row["lower"] <= row["value"] <= row["upper_prob"]
    assert row["upper_prob"] <= 1.05 * row["lower"] * (1 + BRACKET_MARGIN)  # the default width


def test_cli_refuses_an_unmodelled_block_in_one_line(tokenizer, tmp_path, capsys):
    # Granite: a Llama-style layout (its attention is read) whose block scales the residual
    # branches (residual_multiplier): not a modelled block
    cfg = transformers.GraniteConfig(
        **{k: v for k, v in SHAPE.items() if k != "head_dim"},
        vocab_size=tokenizer.vocab_size,
        residual_multiplier=0.5,
    )
    model = seeded_model(cfg, transformers.GraniteModel)
    ckpt = save_checkpoint(tmp_path / "tiny-granite", model, tokenizer)
    out = tmp_path / "out"
    argv = ["profile", str(ckpt), "--text", "pydoc", "--n", "4", "--out", str(out)]
    rc, stdout, stderr = cli(argv + ["--no-progress"], capsys)
    assert rc == 2 and stdout == ""
    lines = [x for x in stderr.strip().splitlines() if not x.startswith("Loading weights")]
    assert len(lines) == 1 and lines[0].startswith("meanfield: error:")
    assert "GraniteModel (model_type 'granite') is not modelled" in lines[0]
    assert "internal error" not in lines[0]
