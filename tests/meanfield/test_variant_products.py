"""Closed-form Jacobian products of heads with attention variants (jacobian_products.md §3c).

Oracle: ``torch.func.jvp`` / ``torch.func.vjp`` of the attention map
(:func:`meanfield.attention.attention_points`, the map :func:`meanfield.jacobian.linearize`
linearises) in float64, each variant alone and composed as real families compose them. The
Wasserstein operator :math:`D_a^{1/2}JD_a^{-1/2}` is formed from the autograd products by
scaling the tangent and the output rows. Tolerance: 1e-12 relative to the norm of the
autograd product (two float64 evaluations of the same finite sums, a few hundred ulps).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.func as tfunc

import meanfield
from meanfield.attention import attention_points
from meanfield.jacobian import dense_jacobian, jvp, linearize, vjp
from meanfield.jacobian import products as products_mod
from meanfield.params import AttentionParams, MultiHeadParams, RMSNorm, RotaryEmbedding

from ..tolerances import F32_VALUE, F64_LANCZOS_GAP, F64_REDUCTION

F64 = torch.float64


def _rand(*shape: int, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=F64) * scale


def _freqs(r: int) -> torch.Tensor:
    return 1.0 / (10.0 ** (torch.arange(0, r, 2, dtype=F64) / r))


def _layer(family: str, gen: torch.Generator, d: int = 8, k: int = 4) -> MultiHeadParams:
    """A small layer with the variants of ``family`` (4 query heads, grouped-query keys)."""
    H, H_kv = 4, 2
    W_Q, W_K = _rand(H * k, d, gen=gen, scale=0.8), _rand(H_kv * k, d, gen=gen, scale=0.8)
    W_V, W_O = _rand(H_kv * 3, d, gen=gen), _rand(d, H * 3, gen=gen)
    b_Q, b_K = _rand(H * k, gen=gen), _rand(H_kv * k, gen=gen)
    rope = RotaryEmbedding(_freqs(k))
    norm = RMSNorm(0.5 + torch.rand(k, generator=gen, dtype=F64), 1e-6)
    kw: dict = dict(n_heads=H, n_kv_heads=H_kv)
    if family == "gemma2":  # soft-cap + window + GQA + rotary
        kw.update(rope=rope, softcap=1.5, window=3)
    elif family == "qwen3":  # QK-norm + rotary + GQA (logit scale after the norm)
        kw.update(rope=rope, q_norm=norm, k_norm=RMSNorm(norm.weight.flip(0), 1e-5))
    elif family == "qwen2":  # biases + rotary
        kw.update(rope=rope, b_Q=b_Q, b_K=b_K)
    elif family == "phi3":  # partial rotary (2 of 4 coordinates)
        kw.update(rope=RotaryEmbedding(_freqs(2), head_dim=k))
    elif family == "neox":  # partial rotary with biases
        kw.update(rope=RotaryEmbedding(_freqs(2), 0.9, head_dim=k), b_Q=b_Q, b_K=b_K)
    elif family == "bloom":  # ALiBi, no rotary
        kw.update(alibi_slopes=[0.5, 0.25, 0.125, 0.0625], b_Q=b_Q)
    elif family == "mistral":  # window + rotary
        kw.update(rope=rope, window=3)
    elif family == "modernbert":  # symmetric window (unmasked) + rotary + biases
        kw.update(rope=rope, window=2, b_Q=b_Q, b_K=b_K)
    elif family == "softcap":
        kw.update(softcap=2.0)
    elif family == "qknorm":
        kw.update(q_norm=norm, k_norm=norm)
    elif family == "qknorm_bias_cap":  # everything on the query/key side at once
        kw.update(rope=rope, q_norm=norm, k_norm=norm, b_Q=b_Q, b_K=b_K, softcap=1.0, window=4)
    elif family == "window":
        kw.update(window=2)
    elif family != "alibi":
        raise ValueError(family)
    if family == "alibi":
        kw.update(alibi_slopes=[0.3, -0.2, 0.1, 0.7])
    return MultiHeadParams.from_qkv(W_Q, W_K, W_V, W_O, **kw)


def _autograd(X, params, H, G, *, weighted: bool, **kw):
    """JH and J^T G by torch.func on the attention map (Wasserstein form when ``weighted``)."""

    def fn(Y: torch.Tensor) -> torch.Tensor:
        return attention_points(Y, params, **kw)

    scale = None
    if weighted:
        lw = kw["log_weights"]
        scale = torch.exp(0.5 * (lw - lw.amax(-1, keepdim=True))).unsqueeze(-1)
    Hs = H if scale is None else H / scale
    Gs = G if scale is None else G * scale
    jh = tfunc.jvp(fn, (X,), (Hs,))[1]
    jtg = tfunc.vjp(fn, X)[1](Gs)[0]
    if scale is not None:
        jh, jtg = scale * jh, jtg / scale
    return jh, jtg


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.dtype == b.dtype and a.shape == b.shape
    return float((a - b).norm() / b.norm())


def _check(X, params, *, weighted=False, gen, **kw):
    lin = linearize(X, params, **kw)
    assert lin.rope_rows is not None, "the variant heads must have closed-form rows"
    assert lin.rope_rows.heads == tuple(range(len(params.heads)))
    H = _rand(*X.shape, gen=gen)
    G = _rand(*X.shape[:-1], lin.d_out, gen=gen)
    geometry = "wasserstein" if weighted else "euclidean"
    jh, jtg = jvp(lin, H, geometry=geometry), vjp(lin, G, geometry=geometry)
    ajh, ajtg = _autograd(
        X, params, H, G, weighted=weighted,
        **{k: v for k, v in kw.items() if k != "chunk_size"},
    )  # fmt: skip
    assert _rel(jh, ajh) <= F64_REDUCTION
    assert _rel(jtg, ajtg) <= F64_REDUCTION
    return lin


FAMILIES = [
    "gemma2", "qwen3", "qwen2", "phi3", "neox", "bloom", "mistral", "modernbert", "softcap",
    "qknorm", "qknorm_bias_cap", "window", "alibi",
]  # fmt: skip


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("masked", [False, True])
def test_products_match_autograd(family: str, masked: bool) -> None:
    gen = torch.Generator().manual_seed(1)
    params = _layer(family, gen)
    X = _rand(2, 9, 8, gen=gen, scale=1.5)
    _check(X, params, masked=masked, gen=gen)


@pytest.mark.parametrize("family", ["gemma2", "qwen3", "bloom", "modernbert", "phi3"])
@pytest.mark.parametrize("masked", [False, True])
def test_log_weights_both_geometries(family: str, masked: bool) -> None:
    gen = torch.Generator().manual_seed(2)
    params = _layer(family, gen)
    X = _rand(2, 8, 8, gen=gen)
    lw = torch.log_softmax(_rand(2, 8, gen=gen, scale=2.0), -1)
    for weighted in (False, True):
        lin = _check(X, params, masked=masked, log_weights=lw, weighted=weighted, gen=gen)
        assert lin.rope_rows is not None and lin.rope_rows.P_w is not None


@pytest.mark.parametrize("family", ["gemma2", "bloom", "mistral", "qwen3", "neox"])
def test_token_index_positions_and_blocks(family: str) -> None:
    """Arbitrary token positions (batch-shaped), position-tagged masking and query blocks."""
    gen = torch.Generator().manual_seed(3)
    params = _layer(family, gen)
    B, n = 2, 10
    X = _rand(B, n, 8, gen=gen)
    tau = torch.stack([torch.randperm(n, generator=gen) + 2 for _ in range(B)])
    lin = _check(X, params, masked=True, token_index=tau, gen=gen)
    assert lin.rope_rows is not None and lin.rope_rows.window is None  # no skipping off 0..n-1
    pos = torch.rand(B, n, generator=gen, dtype=F64)
    _check(X, params, masked=True, positions=pos, chunk_size=3, gen=gen)
    _check(X, params, masked=False, token_index=tau[0], chunk_size=4, gen=gen)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("chunk", [None, 2, 3, 5])
def test_window_skips_blocks_exactly(masked: bool, chunk: int | None) -> None:
    """Query blocks visit only the keys within the window, with the same products."""
    gen = torch.Generator().manual_seed(4)
    params = _layer("gemma2", gen)
    n = 11
    X = _rand(n, 8, gen=gen)
    lin = _check(X, params, masked=masked, chunk_size=chunk, gen=gen)
    rr = lin.rope_rows
    assert rr is not None and rr.window == 3
    blocks = list(products_mod.row_blocks(lin, rr))
    full = list(products_mod.key_blocks(lin))
    assert [b[0] for b in blocks] == [b[0] for b in full]
    if chunk is not None:  # blocks far from the window see fewer than n keys
        assert any(ks.stop - ks.start < n for _, ks in blocks)
    # every admissible key of every query lies in its block's key range
    Pm = rr.P
    for sl, ks in blocks:
        outside = torch.ones(n, dtype=torch.bool)
        outside[ks] = False
        assert float(Pm[..., sl, :][..., outside].abs().sum()) == 0.0


def test_a_only_heads_use_the_closed_form() -> None:
    """Heads given by A only (soft-cap, window, ALiBi, c): Q = A^T, K = I, b_q = c."""
    gen = torch.Generator().manual_seed(5)
    d = 5
    heads = (
        AttentionParams(_rand(d, d, gen=gen), _rand(3, d, gen=gen), softcap=2.0),
        AttentionParams(_rand(d, d, gen=gen), _rand(3, d, gen=gen), c=_rand(d, gen=gen), window=3),
        AttentionParams(
            _rand(d, d, gen=gen), _rand(3, d, gen=gen), c=_rand(d, gen=gen), alibi_slope=0.4
        ),
    )
    params = MultiHeadParams(heads, W_O=_rand(4, 9, gen=gen))
    X = _rand(2, 7, d, gen=gen)
    lw = torch.log_softmax(_rand(2, 7, gen=gen), -1)
    for masked in (False, True):
        _check(X, params, masked=masked, gen=gen)
        _check(X, params, masked=masked, log_weights=lw, weighted=True, gen=gen)
    one = heads[1]
    _check(X, one, masked=True, gen=gen)


def test_mixed_heads_in_one_layer() -> None:
    """Plain, plain rotary and variant heads together: each part in closed form."""
    gen = torch.Generator().manual_seed(6)
    d, k = 6, 4
    rope = RotaryEmbedding(_freqs(k))
    mk = lambda **kw: AttentionParams(  # noqa: E731
        None, _rand(3, d, gen=gen), Q=_rand(k, d, gen=gen), K=_rand(k, d, gen=gen), **kw
    )
    norm = RMSNorm(0.5 + torch.rand(k, generator=gen, dtype=F64))
    heads = (
        mk(),
        mk(rope=rope),
        mk(softcap=1.0),
        mk(q_norm=norm, logit_scale=0.7),
        mk(rope=RotaryEmbedding(_freqs(2), head_dim=k), k_norm=norm, window=2),
        mk(q_bias=_rand(k, gen=gen), alibi_slope=0.3),
    )
    params = MultiHeadParams(heads, W_O=_rand(d, 18, gen=gen))
    X = _rand(2, 8, d, gen=gen)
    lw = torch.log_softmax(_rand(2, 8, gen=gen), -1)
    lin = linearize(X, params)
    assert lin.analytic_heads == (0,) and lin.rope_rows is not None
    assert lin.rope_rows.heads == (1, 2, 3, 4, 5) and lin.rope_rows.window is None
    for masked in (False, True):
        H = _rand(*X.shape, gen=gen)
        G = _rand(2, 8, d, gen=gen)
        lin = linearize(X, params, masked=masked, log_weights=lw)
        for geometry, weighted in (("euclidean", False), ("wasserstein", True)):
            ajh, ajtg = _autograd(X, params, H, G, weighted=weighted, masked=masked, log_weights=lw)
            assert _rel(jvp(lin, H, geometry=geometry), ajh) <= F64_REDUCTION
            assert _rel(vjp(lin, G, geometry=geometry), ajtg) <= F64_REDUCTION


def test_adjointness() -> None:
    gen = torch.Generator().manual_seed(7)
    params = _layer("qknorm_bias_cap", gen)
    X = _rand(3, 9, 8, gen=gen)
    lw = torch.log_softmax(_rand(3, 9, gen=gen), -1)
    lin = linearize(X, params, masked=True, log_weights=lw)
    H, G = _rand(3, 9, 8, gen=gen), _rand(3, 9, 8, gen=gen)
    for geometry in ("euclidean", "wasserstein"):
        lhs = (jvp(lin, H, geometry=geometry) * G).sum()
        rhs = (H * vjp(lin, G, geometry=geometry)).sum()
        assert abs(float(lhs - rhs)) <= F64_REDUCTION * float(lhs.abs() + rhs.abs())


# ------------------------------------------------------------------ extreme inputs
@pytest.mark.parametrize("family", ["gemma2", "softcap", "qknorm_bias_cap"])
def test_large_radius_saturates_the_cap(family: str) -> None:
    """Radius-100 inputs: capped logits saturate (gate ~ 0 for most pairs), products still exact."""
    gen = torch.Generator().manual_seed(8)
    params = _layer(family, gen)
    X = _rand(2, 9, 8, gen=gen)
    X = 100.0 * X / X.norm(dim=-1, keepdim=True)
    for masked in (False, True):
        lin = _check(X, params, masked=masked, gen=gen)
        rr = lin.rope_rows
        assert rr is not None and rr.gate is not None
        if family != "qknorm_bias_cap":  # the QK-norm bounds the logits whatever the radius
            assert float((rr.gate < 1e-6).double().mean()) > 0.5


def test_qk_norm_near_zero_pre_norm_rows() -> None:
    """QK-norm at pre-norm rows near 0 (where the norm's Jacobian is ~ eps^-1/2 large)."""
    gen = torch.Generator().manual_seed(9)
    params = _layer("qwen3", gen)
    X = _rand(2, 7, 8, gen=gen) * 1e-4
    X[:, 2] = 1e-9 * X[:, 2]
    lin = _check(X, params, masked=True, gen=gen)
    rr = lin.rope_rows
    assert rr is not None and rr.q_norm is not None
    assert float(rr.q_norm.rho.max()) > 100.0  # the regime where eps dominates


# ------------------------------------------------------------------ no autograd, bit-identity
def test_products_never_call_torch_func(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(10)

    def refuse(*args, **kwargs):
        raise AssertionError("torch.func called for a head with a closed form")

    monkeypatch.setattr(products_mod, "_rope_fn", refuse)
    monkeypatch.setattr(products_mod.tfunc, "jvp", refuse)
    monkeypatch.setattr(products_mod.tfunc, "vjp", refuse)
    for family in FAMILIES:
        params = _layer(family, gen)
        X = _rand(2, 6, 8, gen=gen)
        lin = linearize(X, params, masked=True, log_weights=torch.zeros(2, 6, dtype=F64))
        H, G = _rand(2, 6, 8, gen=gen), _rand(2, 6, 8, gen=gen)
        for geometry in ("euclidean", "wasserstein"):
            assert torch.isfinite(jvp(lin, H, geometry=geometry)).all()
            assert torch.isfinite(vjp(lin, G, geometry=geometry)).all()


def test_fallback_still_agrees_when_rows_are_dropped() -> None:
    """The autograd fallback (rows dropped) and the closed form give the same products."""
    gen = torch.Generator().manual_seed(11)
    params = _layer("gemma2", gen)
    X = _rand(2, 8, 8, gen=gen)
    lin = linearize(X, params, masked=True)
    auto = replace(lin, rope_rows=None)
    H, G = _rand(2, 8, 8, gen=gen), _rand(2, 8, 8, gen=gen)
    assert _rel(jvp(lin, H), jvp(auto, H)) <= F64_REDUCTION
    assert _rel(vjp(lin, G), vjp(auto, G)) <= F64_REDUCTION


def test_float32_close_to_float64() -> None:
    gen = torch.Generator().manual_seed(12)
    params = _layer("qknorm_bias_cap", gen)
    X = _rand(2, 8, 8, gen=gen)
    H, G = _rand(2, 8, 8, gen=gen), _rand(2, 8, 8, gen=gen)
    lin64 = linearize(X, params, masked=True)
    lin32 = linearize(X.float(), params.to(dtype=torch.float32), masked=True)
    j64, j32 = jvp(lin64, H), jvp(lin32, H.float())
    assert j32.dtype == torch.float32
    assert _rel(j32.double(), j64) < F32_VALUE
    assert _rel(vjp(lin32, G.float()).double(), vjp(lin64, G)) < F32_VALUE


# ------------------------------------------------------------------ Lipschitz estimate
@pytest.mark.parametrize("family", ["gemma2", "qwen3", "bloom"])
def test_local_lipschitz_uncertified_runs_on_the_closed_form(
    family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``certify=False`` runs on the closed form and agrees with the dense (jacrev) SVD."""
    gen = torch.Generator().manual_seed(13)
    params = _layer(family, gen)
    X = _rand(7, 8, gen=gen)
    J = dense_jacobian(X, params, masked=True)  # autograd (jacrev) blocks for variant heads
    ref = float(torch.linalg.matrix_norm(J, ord=2))

    def refuse(*args, **kwargs):
        raise AssertionError("torch.func products called")

    monkeypatch.setattr(products_mod, "_rope_fn", refuse)
    est = meanfield.local_lipschitz(
        X, params, masked=True, certify=False, method="lanczos", tol=1e-10
    )
    assert math.isclose(float(est.value), ref, rel_tol=F64_LANCZOS_GAP)


# ------------------------------------------------------------------ Hugging Face adapters
HF_CASES = {
    "qwen3": ("Qwen3Config", "Qwen3Model", dict(head_dim=8), 0),
    # soft-cap 2, query_pre_attn_scalar 12, layer 0 sliding (window 5 < n = 12)
    "gemma2": (
        "Gemma2Config", "Gemma2Model",
        dict(head_dim=8, attn_logit_softcapping=2.0, query_pre_attn_scalar=12, sliding_window=5),
        0,
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(HF_CASES))
def test_hf_layers_closed_form_equals_fallback(case: str) -> None:
    """Tiny random Qwen3 / Gemma-2 layers through ``params_from_hf``: closed form == fallback."""
    transformers = pytest.importorskip("transformers")
    from meanfield.models import params_from_hf

    cfg_name, model_name, extra, layer = HF_CASES[case]
    cfg = getattr(transformers, cfg_name)(
        attn_implementation="eager", hidden_size=32, num_attention_heads=4,
        num_key_value_heads=2, num_hidden_layers=2, intermediate_size=37, vocab_size=100,
        max_position_embeddings=64, pad_token_id=0, bos_token_id=0, eos_token_id=0, **extra,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = getattr(transformers, model_name)(cfg).eval().to(F64)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # non-uniform attention and QK-norm gains away from 1
        for name, p in model.named_parameters():
            if p.ndim == 2 and "embed" not in name:
                p.copy_(torch.randn(p.shape, generator=g, dtype=F64) * 1.5 / math.sqrt(p.shape[1]))
            elif "q_norm" in name or "k_norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g, dtype=F64))
    n = 12
    params = params_from_hf(model, layer, n=n)
    assert all(h.variants for h in params.heads)
    X = _rand(2, n, 32, gen=g)
    lin = linearize(X, params, masked=True)
    assert lin.rope_rows is not None and lin.rope_rows.heads == (0, 1, 2, 3)
    if case == "gemma2":
        assert lin.rope_rows.gate is not None and lin.rope_rows.window == 5
    else:
        assert lin.rope_rows.q_norm is not None and lin.rope_rows.k_norm is not None
    auto = replace(lin, rope_rows=None)  # the torch.func fallback
    H, G = _rand(2, n, 32, gen=g), _rand(2, n, lin.d_out, gen=g)
    assert _rel(jvp(lin, H), jvp(auto, H)) <= F64_REDUCTION
    assert _rel(vjp(lin, G), vjp(auto, G)) <= F64_REDUCTION


def test_closed_form_refusal_names_the_variants_in_head_order(gen):
    """The closed-form refusal lists each distinct variant combination once, in head order, so
    its text is the same in every interpreter (a set made it depend on the string hash seed)."""
    d, k = 6, 4
    heads = [
        AttentionParams(
            None,
            _rand(k, d, gen=gen),
            Q=_rand(k, d, gen=gen),
            K=_rand(k, d, gen=gen),
            rope=RotaryEmbedding(_freqs(k)),
            **variant,
        )
        for variant in (dict(window=3), dict(softcap=2.0), dict(window=2), {})
    ]
    params = MultiHeadParams(tuple(heads), W_O=_rand(d, 4 * k, gen=gen))
    lin = linearize(_rand(5, d, gen=gen), params)
    with pytest.raises(NotImplementedError) as err:
        products_mod.self_jvp(lin, _rand(5, d, gen=gen))
    assert str(err.value) == (
        "self_jvp uses the closed form, which does not apply to heads with a rotary embedding"
        " or a sliding-window mask or soft-capped logits"
    )
