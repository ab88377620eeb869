"""Long-context capture: SDPA captures equal eager ones; gpt2-random beyond 1024 positions."""

from __future__ import annotations

import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

from meanfield.models import hidden_states, load_model, random_gpt2, tiny_config  # noqa: E402
from meanfield.models.capture import EAGER_MAX_N  # noqa: E402
from meanfield.models.standins import GPT2_POSITIONS, position_extension_seed  # noqa: E402

F32 = torch.float32
#: float32 unit roundoff.
U32 = 2.0**-24
#: Heads and width of the tiny models (head_dim 16).
D, H = 64, 4
HEAD_DIM = D // H
#: Standard deviations of a statistical check: a false alarm has probability ~2e-9.
Z = 6.0


def capture_tol(n: int, head_dim: int, attn_layers: int) -> float:
    """Relative bound on the difference of an eager and an SDPA capture in float32.

    The two implementations compute the same sums in different orders. A k-term float32 sum errs
    by at most gamma_k ~ k u times the sum of its absolute terms (Higham, "Accuracy and Stability
    of Numerical Algorithms", §4.2), so two orders differ by at most 2 k u of that. Per attention
    layer: the logits are head_dim-term dot products, the softmax normaliser is an n-term sum
    and the output an n-term average with weights summing to 1 (so relative to max |v|); that is
    (head_dim + 2 n) u twice over, i.e. 2 (head_dim + 2 n) u. A second factor 2 covers the
    rounding of exp and the propagation of the difference through the block's MLP and the
    capture point's LayerNorm (which divides by a standard deviation of the activations' own
    scale). The layers before the capture point add up: the residual stream carries each
    layer's difference on.
    """
    return 4.0 * attn_layers * (head_dim + 2 * n) * U32


def assert_capture_close(a: torch.Tensor, b: torch.Tensor, tol: float) -> None:
    """``|a - b| <= tol * max|b|`` elementwise (activations are O(max|b|) after LayerNorm)."""
    assert a.shape == b.shape and a.dtype == b.dtype
    scale = float(b.abs().max())
    torch.testing.assert_close(a, b, rtol=tol, atol=tol * scale)


def _seeded_model(cls, cfg, seed: int):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return cls(cfg).eval()


# initializer_range 0.2 (GPT-2's is 0.02) makes the logits O(1): attention is far from uniform,
# so a wrong mask or a wrong key order changes the captures by O(1), not by rounding
@pytest.fixture(scope="module")
def gpt2_f32():
    cfg = tiny_config("gpt2", d=D, heads=H, layers=3, vocab=100, positions=2048,
                      bos_token_id=0, eos_token_id=0, initializer_range=0.2)  # fmt: skip
    return _seeded_model(transformers.GPT2Model, cfg, 0)


@pytest.fixture(scope="module")
def llama_f32():
    cfg = tiny_config("llama", d=D, heads=H, kv_heads=2, layers=3, vocab=100, positions=128,
                      intermediate=96, rope_theta=1000.0, bos_token_id=0, eos_token_id=0,
                      pad_token_id=0, initializer_range=0.2)  # fmt: skip
    return _seeded_model(transformers.LlamaForCausalLM, cfg, 1)


@pytest.fixture(scope="module")
def bert_f32():
    cfg = tiny_config("bert", d=D, heads=H, layers=3, vocab=100, positions=128,
                      intermediate=96, initializer_range=0.2)  # fmt: skip
    return _seeded_model(transformers.BertModel, cfg, 2)


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 100, (n,), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------------------
# SDPA capture
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gpt2_f32", "llama_f32", "bert_f32"])
@pytest.mark.parametrize("layer", [1, 2])
def test_sdpa_capture_equals_eager_to_float32_rounding(request, name, layer):
    model = request.getfixturevalue(name)
    ids = _ids(200)
    kw = dict(n_windows=2, start=3, dtype=None)
    eager = hidden_states(model, None, ids, layer, 64, attention="eager", **kw)
    sdpa = hidden_states(model, None, ids, layer, 64, attention="sdpa", **kw)
    assert (eager.attention, sdpa.attention) == ("eager", "sdpa")
    assert eager.X.dtype == F32 and sdpa.X.shape == (2, 64, D)
    assert model.config._attn_implementation == "eager"  # restored
    assert_capture_close(sdpa.X, eager.X, capture_tol(64, HEAD_DIM, attn_layers=layer))
    # the bound is not vacuous: a window shifted by one token differs by O(1)
    shifted = hidden_states(model, None, ids, layer, 64, n_windows=2, start=4, dtype=None)
    assert float((shifted.X - eager.X).abs().max()) > 1e3 * capture_tol(64, HEAD_DIM, layer)


def test_capture_before_any_attention_is_identical(gpt2_f32):
    ids = _ids(200)
    a = hidden_states(gpt2_f32, None, ids, 0, 64, n_windows=2, attention="eager")
    b = hidden_states(gpt2_f32, None, ids, 0, 64, n_windows=2, attention="sdpa")
    assert torch.equal(a.X, b.X)


@pytest.mark.parametrize(("name", "causal"), [("gpt2_f32", True), ("llama_f32", True),
                                              ("bert_f32", False)])  # fmt: skip
def test_sdpa_capture_builds_no_n_by_n_mask(request, monkeypatch, name, causal):
    """transformers passes no mask to SDPA (``is_causal`` instead): torch's flash path."""
    model = request.getfixturevalue(name)
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kw):
        calls.append((attn_mask, is_causal))
        return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    hidden_states(model, None, _ids(200), 2, 64, n_windows=2, attention="sdpa")
    assert len(calls) == 2  # the two attention layers before the capture point
    assert all(mask is None and flag is causal for mask, flag in calls)


def test_auto_rule_is_a_fixed_number_of_tokens(gpt2_f32):
    n_long = EAGER_MAX_N + 76
    ids = _ids(2 * n_long)
    short = hidden_states(gpt2_f32, None, ids, 2, EAGER_MAX_N, n_windows=1, dtype=None)
    ref = hidden_states(gpt2_f32, None, ids, 2, EAGER_MAX_N, n_windows=1, attention="eager",
                        dtype=None)  # fmt: skip
    assert short.attention == "eager" and torch.equal(short.X, ref.X)  # earlier bits kept
    long = hidden_states(gpt2_f32, None, ids, 2, n_long, n_windows=1, dtype=None)
    assert long.attention == "sdpa"
    ref = hidden_states(gpt2_f32, None, ids, 2, n_long, n_windows=1, attention="eager",
                        dtype=None)  # fmt: skip
    assert_capture_close(long.X, ref.X, capture_tol(n_long, HEAD_DIM, attn_layers=2))
    assert gpt2_f32.config._attn_implementation == "eager"


def test_auto_keeps_a_model_s_own_non_eager_attention(gpt2_f32):
    gpt2_f32.set_attn_implementation("sdpa")
    try:
        hs = hidden_states(gpt2_f32, None, _ids(200), 1, 16, n_windows=1)
        assert hs.attention == "sdpa" and gpt2_f32.config._attn_implementation == "sdpa"
    finally:
        gpt2_f32.set_attn_implementation("eager")


def test_model_without_sdpa(gpt2_f32, monkeypatch):
    monkeypatch.setattr(type(gpt2_f32), "_supports_sdpa", False)
    ids = _ids(2 * 1100)
    with pytest.raises(ValueError, match="cannot run attention='sdpa'") as info:
        hidden_states(gpt2_f32, None, ids, 1, 16, n_windows=1, attention="sdpa")
    assert "\n" not in str(info.value)
    assert gpt2_f32.config._attn_implementation == "eager"
    # auto stays eager on a model that has no SDPA, long windows included
    assert hidden_states(gpt2_f32, None, ids, 1, 1100, n_windows=1).attention == "eager"


def test_bad_attention_is_a_one_line_error(gpt2_f32):
    with pytest.raises(ValueError, match="attention must be 'eager', 'sdpa' or 'auto'"):
        hidden_states(gpt2_f32, None, _ids(200), 1, 16, n_windows=1, attention="flash")


# ----------------------------------------------------------------------------------------------
# gpt2-random beyond 1024 positions
# ----------------------------------------------------------------------------------------------

N_POS = 1500


@pytest.fixture(scope="module")
def gpt2_pair():
    return random_gpt2(0, n_layer=2), random_gpt2(0, n_layer=2, n_positions=N_POS)


def test_extension_keeps_every_weight_of_the_unextended_model(gpt2_pair):
    short, long = gpt2_pair
    assert long.model.wpe.weight.shape == (N_POS, 768)
    assert long.model.config.n_positions == N_POS and long.provenance["max_positions"] == N_POS
    assert torch.equal(long.model.wpe.weight[:GPT2_POSITIONS], short.model.wpe.weight)
    a, b = dict(short.model.named_parameters()), dict(long.model.named_parameters())
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a if k != "wpe.weight")
    assert long.label == short.label + f", {N_POS} positions"
    assert str(position_extension_seed(0)) in long.provenance["positions"]
    assert short.model.config.n_positions == GPT2_POSITIONS and "positions" not in short.provenance


def test_extension_rows_are_drawn_from_the_model_s_init(gpt2_pair):
    short, long = gpt2_pair
    rows = long.model.wpe.weight[GPT2_POSITIONS:].detach().double().flatten()
    N = rows.numel()  # 476 x 768 = 365568 draws
    sigma = short.model.config.initializer_range  # 0.02
    # N s^2 / sigma^2 (mean known, 0) is chi-square with N degrees of freedom: mean N, sd
    # sqrt(2N); Z standard deviations of that is |s^2 / sigma^2 - 1| <= Z sqrt(2 / N)
    ratio = float(rows.square().mean()) / sigma**2
    assert abs(ratio - 1.0) <= Z * math.sqrt(2.0 / N), ratio
    # the sample mean is N(0, sigma^2 / N)
    assert abs(float(rows.mean())) <= Z * sigma / math.sqrt(N)
    # a stream of its own: uncorrelated with the token embeddings the model's seed drew first
    wte = long.model.wte.weight[: N_POS - GPT2_POSITIONS].detach().double().flatten()
    corr = float(torch.corrcoef(torch.stack([rows, wte]))[0, 1])
    assert abs(corr) <= Z / math.sqrt(N)


def test_extension_rows_do_not_depend_on_the_table_length():
    a = random_gpt2(0, n_layer=1, n_positions=N_POS).model.wpe.weight
    b = random_gpt2(0, n_layer=1, n_positions=2 * GPT2_POSITIONS + 100).model.wpe.weight
    c = random_gpt2(1, n_layer=1, n_positions=N_POS).model.wpe.weight
    assert torch.equal(a, b[:N_POS])
    assert not torch.equal(a[GPT2_POSITIONS:], c[GPT2_POSITIONS:])
    with pytest.raises(ValueError, match="at least GPT-2's own 1024"):
        random_gpt2(0, n_layer=1, n_positions=512)


def test_capture_at_1500_tokens(gpt2_pair):
    model = gpt2_pair[1].model
    ids = _ids(N_POS + 10) * 250  # ids below 25000, as the WordPiece stand-in gives
    hs = hidden_states(model, None, ids, 1, N_POS, n_windows=1, dtype=None)
    assert hs.attention == "sdpa" and hs.X.shape == (1, N_POS, 768)
    assert bool(torch.isfinite(hs.X).all())
    eager = hidden_states(model, None, ids, 1, N_POS, n_windows=1, dtype=None, attention="eager")
    assert_capture_close(hs.X, eager.X, capture_tol(N_POS, 64, attn_layers=1))
    with pytest.raises(ValueError, match="exceeds the model's 1500 positions"):
        hidden_states(model, None, _ids(2000), 1, N_POS + 1, n_windows=1)


def test_load_model_extends_gpt2_random_only():
    lm = load_model("gpt2-random", n_positions=N_POS)
    assert lm.model.wpe.weight.shape[0] == N_POS and lm.model.config.n_layer == 12
    assert load_model("gpt2-random", n_positions=1000).model.wpe.weight.shape[0] == 1024
    with pytest.raises(ValueError, match="exceeds the 512 positions of BERT-base shapes") as info:
        load_model("bert-random", n_positions=513)
    assert "hard limit" in str(info.value) and "\n" not in str(info.value)
