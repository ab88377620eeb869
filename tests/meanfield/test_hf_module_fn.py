"""``hf_module_fn``: the model's own attention module, with explicit mask and positions.

Tiny random models from transformers' config classes (nothing is downloaded; the cases and the
builders are those of tests/meanfield/test_hf_families.py). Oracles:

- the model's own forward pass: hooks capture the input of the attention module and the output
  of its output projection, and the module function on that input must reproduce it (so the
  mask, window, positions and ALiBi tensors built here are those the model builds);
- the extracted map ``hf_attention(model, layer)``, rebuilt from the weights by meanfield's own
  code: equal to 1e-12 in float64 with transformers' float32 steps patched out
  (``tests.hf_float64.patch_float32_steps``; measured ~1e-15 in tests/meanfield/test_hf_families.py), and to
  1e-6 in float32 (a few float32 roundings, as in that file);
- ``local_lipschitz`` on the extracted map: its certified bracket must overlap the bracket of
  ``local_lipschitz_fn`` on the module function (reverse products), and the values agree within
  the solver tolerance;
- Falcon's ALiBi, which the extracted map refuses: at 4 heads and n = 12 the model's bfloat16
  rounding is exact (slopes 2^-2h, products below 256), and adding the bias to the scores
  before the logit scale and again, divided by sqrt(k), in the mask is the plain ALiBi map with
  slopes 2 m_h / sqrt(k); that map, built by meanfield from the weights, must equal the module
  to 1e-12 in float64 (the ALiBi branch takes its softmax in the model's dtype: no patch).
"""

from __future__ import annotations

import dataclasses
import math
import sys

import pytest
import torch

from meanfield import MultiHeadParams, local_lipschitz, local_lipschitz_fn, self_attention

transformers = pytest.importorskip("transformers")

from meanfield.models import (  # noqa: E402
    hf_attention,
    hf_module_fn,
    module_fn,
    params_from_hf,
)
from meanfield.models.module_fn import MODULE_FAMILIES  # noqa: E402
from tests.hf_float64 import patch_float32_steps  # noqa: E402

from ..tolerances import (  # noqa: E402
    DIFFERS,
    F32_ROUNDING,
    F64_LONG_CHAIN,
    F64_REDUCTION,
    F64_REWRITTEN,
)
from .test_hf_families import (  # noqa: E402
    CASES,
    D32,
    D64,
    FALCON,
    SHAPE,
    TOKENS,
    WINDOWED,
    build,
    capture,
    case_model,
    model_inputs,
    rel_err,
    run_case,
)

SUPPORTED = [c for c, v in CASES.items() if v[6][0] in MODULE_FAMILIES]
#: The cases the issue names, for the (slower) Lipschitz comparison.
LIPSCHITZ = [
    "gpt2", "llama", "qwen3", "gemma2_sliding", "mistral", "bert", "bert_decoder",
    "falcon_multi_query", "bloom", "modernbert_local",
]  # fmt: skip


def test_every_issue_case_is_supported():
    assert set(LIPSCHITZ) <= set(SUPPORTED)
    assert set(WINDOWED) <= set(SUPPORTED)
    # every family the extracted map knows (Falcon's four layouts, BLOOM, ModernBERT included)
    assert set(SUPPORTED) == set(CASES)


@pytest.mark.parametrize("case", SUPPORTED)
def test_module_fn_equals_forward_pass_and_extracted_map_float32(case):
    model, layer, got = run_case(case, D32)
    X = got["x"]
    f = hf_module_fn(model, layer, X.shape[-2])
    with torch.no_grad():
        Y = f(X)
        Z = hf_attention(model, layer, n=X.shape[-2])(X)
    # the same module, the same inputs as in the forward pass: the same operations
    assert rel_err(Y, got["heads+WO"]) <= F32_ROUNDING
    assert rel_err(Y, Z) <= F32_ROUNDING


@pytest.mark.parametrize("case", SUPPORTED)
def test_module_fn_equals_extracted_map_float64(case, monkeypatch):
    patch_float32_steps(case_model(case, D64), monkeypatch)
    model, layer, got = run_case(case, D64)
    X = got["x"]
    f = hf_module_fn(model, layer, X.shape[-2])
    with torch.no_grad():
        Y = f(X)
        Z = hf_attention(model, layer, n=X.shape[-2])(X)
    assert Y.dtype == D64 and Y.shape == X.shape
    assert rel_err(Y, got["heads+WO"]) <= F64_REDUCTION
    assert rel_err(Y, Z) <= F64_REDUCTION
    # one sample without the batch dimension: the same map
    with torch.no_grad():
        assert rel_err(f(X[1]), Y[1]) <= F64_REWRITTEN


@pytest.mark.parametrize("case", LIPSCHITZ)
def test_module_bracket_overlaps_extracted_bracket(case, monkeypatch):
    patch_float32_steps(case_model(case, D64), monkeypatch)
    model, layer, got = run_case(case, D64, n=8)
    X = got["x"][0]
    causal = CASES[case][6][1]
    f = hf_module_fn(model, layer, X.shape[-2])
    params = params_from_hf(model, layer, n=X.shape[-2])
    ours = local_lipschitz(X, params, masked=causal)
    tol = 1e-10
    free = local_lipschitz_fn(f, X, method="lanczos", products="reverse", tol=tol)
    dense = local_lipschitz_fn(f, X, method="dense")
    ours_up = float(ours.upper_prob if ours.upper_prob is not None else ours.upper)
    # certified brackets overlap (dense Gram on the module; the extracted map's own certificate)
    assert float(dense.lower) <= ours_up and float(ours.lower) <= float(dense.upper)
    assert float(free.lower) <= float(dense.upper)
    assert free.upper_prob is not None and float(dense.lower) <= float(free.upper_prob)
    # values: the same Jacobian within the solver tolerance
    assert bool(free.converged)
    assert math.isclose(float(free.value), float(dense.value), rel_tol=10 * tol)
    exact = float(local_lipschitz(X, params, masked=causal, method="dense", certify=False).value)
    assert math.isclose(float(dense.value), exact, rel_tol=F64_LONG_CHAIN)


def test_an_unmodelled_feature_runs_through_the_module():
    """OLMo-2's QK-norm over all heads is refused by the extracted map; the module runs it."""
    kw = dict(SHAPE, num_key_value_heads=2, **TOKENS)
    model = build("Olmo2Config", "Olmo2Model", D32, **kw)
    with pytest.raises(ValueError, match="QK-norm over all heads"):
        hf_attention(model, 1)
    got = capture(
        model, "layers.1.self_attn", "layers.1.self_attn.o_proj", model_inputs(model, 12, D32)
    )
    f = hf_module_fn(model, 1, 12)
    with torch.no_grad():
        assert rel_err(f(got["x"]), got["heads+WO"]) <= F32_ROUNDING
    est = local_lipschitz_fn(f, got["x"][0], method="lanczos", products="reverse", tol=1e-5)
    assert bool(est.converged) and float(est.value) > 0


def test_dtype_runs_a_cast_copy():
    model, layer, got = run_case("llama", D32)
    f = hf_module_fn(model, layer, 12, dtype=D64)
    X = got["x"].to(D64)
    with torch.no_grad():
        Y = f(X)
    assert Y.dtype == D64
    assert all(p.dtype == D32 for p in model.parameters())  # the model is unchanged
    # float32 softmax inside the module: float32-level agreement with the float64 extracted map
    with torch.no_grad():
        assert rel_err(Y, hf_attention(model, layer, dtype=D64)(X)) <= F32_ROUNDING


@pytest.mark.parametrize("case", ["mistral", "gemma2_sliding", "modernbert_local"])
def test_window_reaches_eager_attention_only_through_the_mask(case, monkeypatch):
    """The module is handed its window (config, ``sliding_window`` kwarg), but eager attention
    applies it only through the mask: a mask built without it changes the output."""
    model, layer, got = run_case(case, D64)
    assert hf_attention(model, layer).info.window == WINDOWED[case]
    with torch.no_grad():
        windowed = hf_module_fn(model, layer, 12)(got["x"])
        mask = module_fn._mask
        monkeypatch.setattr(module_fn, "_mask", lambda n, c, w, dt: mask(n, c, None, dt))
        no_window_mask = hf_module_fn(model, layer, 12)(got["x"])
    assert rel_err(windowed, got["heads+WO"]) <= F32_ROUNDING
    assert rel_err(no_window_mask, windowed) > DIFFERS


def test_modernbert_local_layer_takes_its_own_rotary_table():
    """ModernBERT's local and global layers rotate with different bases (10^4 and 1.6 10^5): the
    forward-pass test of the local layer (window 5 < n) can tell the tables apart."""
    model, layer, got = run_case("modernbert_local", D64)
    assert model.config.layer_types[layer] == "sliding_attention"
    rot = model.base_model.rotary_emb
    pos = torch.arange(12)[None]
    z = torch.zeros((), dtype=D64)
    local, glob = rot(z, pos, "sliding_attention"), rot(z, pos, "full_attention")
    assert (local[0] - glob[0]).abs().max() > 0.1
    with torch.no_grad():
        assert rel_err(hf_module_fn(model, layer, 12)(got["x"]), got["heads+WO"]) <= F32_ROUNDING


FALCON_ALIBI = dict(FALCON, alibi=True)


def falcon_alibi(dtype):
    model = build("FalconConfig", "FalconModel", dtype, **FALCON_ALIBI)
    inputs = model_inputs(model, 12, dtype)
    return model, capture(model, "h.1.self_attention", "h.1.self_attention.dense", inputs)


@pytest.mark.parametrize("case", ["bloom", "falcon_alibi"])
def test_alibi_reaches_the_module(case, monkeypatch):
    """The ALiBi tensors built here (BLOOM: ``alibi``; Falcon: ``alibi`` and the mask) reproduce
    the forward pass, and they matter: with zero slopes the output changes."""
    if case == "bloom":
        model, layer, got = run_case("bloom", D32)
        owner, name = model.base_model, "build_alibi_tensor"
    else:
        (model, got), layer = falcon_alibi(D32), 1
        owner, name = sys.modules[type(model).__module__], "build_alibi_tensor"
    f = hf_module_fn(model, layer, 12)
    with torch.no_grad():
        Y = f(got["x"])
    assert rel_err(Y, got["heads+WO"]) <= F32_ROUNDING
    build_alibi = getattr(owner, name)
    monkeypatch.setattr(owner, name, lambda mask, heads, dt: 0 * build_alibi(mask, heads, dt))
    with torch.no_grad():
        no_alibi = hf_module_fn(model, layer, 12)(got["x"])
    assert rel_err(no_alibi, Y) > DIFFERS


def test_falcon_alibi_is_alibi_with_doubled_slopes():
    """Falcon's ALiBi, refused by the extracted map, runs through the module; in the exact case
    (module docstring) it is the ALiBi map with slopes 2 m_h / sqrt(k), m_h = 2^(-2h)."""
    model, got = falcon_alibi(D64)
    with pytest.raises(ValueError, match="Falcon's ALiBi is not modelled"):
        hf_attention(model, 1)
    X = got["x"]
    f = hf_module_fn(model, 1, 12)
    with torch.no_grad():
        Y = f(X)
    assert rel_err(Y, got["heads+WO"]) <= F64_REDUCTION
    # the same weights in a rotary Falcon, whose extracted heads are rebuilt without rotary
    twin = build("FalconConfig", "FalconModel", D64, **FALCON)
    twin.load_state_dict(model.state_dict())
    p = params_from_hf(twin, 1, n=12)
    k, heads = 8, len(p.heads)
    slopes = [2 * 2.0 ** (-2 * (h + 1)) / math.sqrt(k) for h in range(heads)]
    alibi = MultiHeadParams(
        tuple(dataclasses.replace(h, rope=None, alibi_slope=m) for h, m in zip(p.heads, slopes)),
        p.W_O,
        p.b_O,
    )
    single = MultiHeadParams(
        tuple(dataclasses.replace(h, alibi_slope=m / 2) for h, m in zip(alibi.heads, slopes)),
        p.W_O,
        p.b_O,
    )
    with torch.no_grad():
        assert rel_err(Y, self_attention(X, alibi, masked=True)) <= F64_REDUCTION
        assert rel_err(Y, self_attention(X, single, masked=True)) > DIFFERS  # added twice
    # the module's dense bracket contains the doubled-slope map's dense constant
    X0 = X[0]
    dense = local_lipschitz_fn(f, X0, method="dense")
    exact = float(local_lipschitz(X0, alibi, masked=True, method="dense", certify=False).value)
    assert float(dense.lower) <= exact * (1 + F64_LONG_CHAIN) and exact <= float(dense.upper) * (
        1 + F64_LONG_CHAIN
    )
    assert math.isclose(float(dense.value), exact, rel_tol=F64_LONG_CHAIN)


def test_refusals_are_one_line(monkeypatch):
    model = case_model("gpt2", D32)
    t5 = transformers.T5EncoderModel(
        transformers.T5Config(
            d_model=32, d_kv=8, num_heads=4, num_layers=1, d_ff=37, vocab_size=100
        )
    )
    for call, match in (
        (lambda: hf_module_fn(t5, 0, 12), "unsupported model T5EncoderModel"),
        (lambda: hf_module_fn(model, 1, 0), "n must be a positive integer"),
        (lambda: hf_module_fn(model, 2, 12), "layer must be an integer"),
        (lambda: hf_module_fn(model, 1, 12)(torch.zeros(1, 5, 32)), "built for n = 12"),
    ):
        with pytest.raises((ValueError, NotImplementedError), match=match) as e:
            call()
        assert "\n" not in str(e.value)
    # a family outside MODULE_FAMILIES (none is today), and a module whose forward lacks an input
    fewer = tuple(f for f in MODULE_FAMILIES if f != "falcon")
    monkeypatch.setattr(module_fn, "MODULE_FAMILIES", fewer)
    with pytest.raises(NotImplementedError, match="does not call Falcon") as e:
        hf_module_fn(case_model("falcon_per_head", D32), 1, 12)
    assert "\n" not in str(e.value)
    bloom = case_model("bloom", D32)
    attn_cls = type(bloom.base_model.h[1].self_attention)
    monkeypatch.setattr(attn_cls, "forward", lambda self, hidden_states, attention_mask=None: None)
    with pytest.raises(NotImplementedError, match="forward takes no residual, alibi input") as e:
        hf_module_fn(bloom, 1, 12)
    assert "\n" not in str(e.value)
    monkeypatch.undo()
    sdpa = transformers.GPT2Model(
        transformers.GPT2Config(n_embd=32, n_head=4, n_layer=2, attn_implementation="sdpa")
    ).eval()
    with pytest.raises(ValueError, match="needs eager attention"):
        hf_module_fn(sdpa, 0, 12)
    model.train()
    try:
        with pytest.raises(ValueError, match="training mode"):
            hf_module_fn(model, 0, 12)
    finally:
        model.eval()
