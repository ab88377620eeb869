"""``hf_module_fn``: the model's own attention module, with explicit mask and positions.

Tiny random models from transformers' config classes (nothing is downloaded; the cases and the
builders are those of tests/test_hf_families.py). Oracles:

- the model's own forward pass: hooks capture the input of the attention module and the output
  of its output projection, and the module function on that input must reproduce it (so the
  mask, window and positions built here are those the model builds);
- the extracted map ``hf_attention(model, layer)``, rebuilt from the weights by meanfield's own
  code: equal to 1e-12 in float64 with transformers' float32 steps patched out (the
  ``float64_everywhere`` fixture of tests/test_hf_families.py; measured ~1e-15 there), and to
  1e-6 in float32 (a few float32 roundings, as in that file);
- ``local_lipschitz`` on the extracted map: its certified bracket must overlap the bracket of
  ``local_lipschitz_fn`` on the module function (reverse products), and the values agree within
  the solver tolerance.
"""

from __future__ import annotations

import math

import pytest
import torch

from meanfield import local_lipschitz, local_lipschitz_fn

transformers = pytest.importorskip("transformers")

from meanfield.models import (  # noqa: E402
    hf_attention,
    hf_module_fn,
    module_fn,
    params_from_hf,
)
from meanfield.models.module_fn import MODULE_FAMILIES  # noqa: E402

from .test_hf_families import (  # noqa: E402
    CASES,
    D32,
    D64,
    SHAPE,
    TOKENS,
    WINDOWED,
    build,
    capture,
    case_model,
    float64_everywhere,  # noqa: F401  (fixture)
    model_inputs,
    rel_err,
    run_case,
)

SUPPORTED = [c for c, v in CASES.items() if v[6][0] in MODULE_FAMILIES]
#: The cases the issue names, for the (slower) Lipschitz comparison.
LIPSCHITZ = ["gpt2", "llama", "qwen3", "gemma2_sliding", "mistral", "bert", "bert_decoder"]


def test_every_issue_case_is_supported():
    assert set(LIPSCHITZ) <= set(SUPPORTED)
    assert set(WINDOWED) & set(SUPPORTED) == {"mistral", "qwen2", "gemma2_sliding",
                                               "gemma3_sliding"}  # fmt: skip


@pytest.mark.parametrize("case", SUPPORTED)
def test_module_fn_equals_forward_pass_and_extracted_map_float32(case):
    model, layer, got = run_case(case, D32)
    X = got["x"]
    f = hf_module_fn(model, layer, X.shape[-2])
    with torch.no_grad():
        Y = f(X)
        Z = hf_attention(model, layer, n=X.shape[-2])(X)
    # the same module, the same inputs as in the forward pass: the same operations
    assert rel_err(Y, got["heads+WO"]) <= 1e-6
    assert rel_err(Y, Z) <= 1e-6


@pytest.mark.parametrize("case", SUPPORTED)
def test_module_fn_equals_extracted_map_float64(case, float64_everywhere):  # noqa: F811
    float64_everywhere(case_model(case, D64))
    model, layer, got = run_case(case, D64)
    X = got["x"]
    f = hf_module_fn(model, layer, X.shape[-2])
    with torch.no_grad():
        Y = f(X)
        Z = hf_attention(model, layer, n=X.shape[-2])(X)
    assert Y.dtype == D64 and Y.shape == X.shape
    assert rel_err(Y, got["heads+WO"]) <= 1e-12
    assert rel_err(Y, Z) <= 1e-12
    # one sample without the batch dimension: the same map
    with torch.no_grad():
        assert rel_err(f(X[1]), Y[1]) <= 1e-14


@pytest.mark.parametrize("case", LIPSCHITZ)
def test_module_bracket_overlaps_extracted_bracket(case, float64_everywhere):  # noqa: F811
    float64_everywhere(case_model(case, D64))
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
    assert math.isclose(float(dense.value), exact, rel_tol=1e-11)


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
        assert rel_err(f(got["x"]), got["heads+WO"]) <= 1e-6
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
        assert rel_err(Y, hf_attention(model, layer, dtype=D64)(X)) <= 1e-6


@pytest.mark.parametrize("case", ["mistral", "gemma2_sliding"])
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
    assert rel_err(windowed, got["heads+WO"]) <= 1e-6
    assert rel_err(no_window_mask, windowed) > 1e-3


def test_refusals_are_one_line():
    model = case_model("gpt2", D32)
    for call, match in (
        (lambda: hf_module_fn(case_model("falcon_per_head", D32), 1, 12), "does not call Falcon"),
        (lambda: hf_module_fn(model, 1, 0), "n must be a positive integer"),
        (lambda: hf_module_fn(model, 2, 12), "layer must be an integer"),
        (lambda: hf_module_fn(model, 1, 12)(torch.zeros(1, 5, 32)), "built for n = 12"),
    ):
        with pytest.raises((ValueError, NotImplementedError), match=match) as e:
            call()
        assert "\n" not in str(e.value)
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
