"""Attention variants of the parameter types (docs/theory.md §B6).

Oracles: a naive float64 implementation written here with plain loops (no library helper),
invariances (c versus head-space biases, cap -> infinity, window >= n, measures versus
sequences), central finite differences for the torch.func fallback of the Jacobian products,
and the guards of the consumers that do not model a variant.
"""

from __future__ import annotations

import math

import pytest
import torch

import meanfield
from meanfield.attention import attention_weights, head_logits, self_attention
from meanfield.jacobian import dense_jacobian, jvp, linearize, vjp
from meanfield.measures import DiracMeasure
from meanfield.params import AttentionParams, MultiHeadParams, RMSNorm, RotaryEmbedding
from tests.tolerances import (
    BRACKET_MARGIN,
    F32_VS_F64,
    F64_EXACT,
    F64_FINITE_DIFF,
    F64_LANCZOS,
    F64_REWRITTEN_EXP,
    assert_close,
)

F64 = torch.float64


def _rand(*shape: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=F64)


# ------------------------------------------------------------------ naive reference (loops)
def _naive_rms(z: list[float], w: list[float], eps: float) -> list[float]:
    ms = sum(v * v for v in z) / len(z)
    return [w[a] * z[a] / math.sqrt(ms + eps) for a in range(len(z))]


def _naive_rope(z: list[float], p: int, freqs: list[float], scaling: float) -> list[float]:
    """Rotate the first 2 len(freqs) coordinates (rotate_half layout), pass the rest."""
    r = 2 * len(freqs)
    half = r // 2
    out = list(z)
    for a in range(half):
        c, s = math.cos(p * freqs[a]) * scaling, math.sin(p * freqs[a]) * scaling
        x1, x2 = z[a], z[a + half]
        out[a] = x1 * c - x2 * s
        out[a + half] = x2 * c + x1 * s
    return out


def _naive_head(X: torch.Tensor, spec: dict, masked: bool, tau: list[int]) -> torch.Tensor:
    """One head by the formulas of docs/theory.md §B6, in Python floats."""
    Xl = X.tolist()
    Q, K, V = spec["Q"].tolist(), spec["K"].tolist(), spec["V"].tolist()
    n, k = len(Xl), len(Q)

    def proj(M: list, x: list, bias: list | None) -> list[float]:
        z = [sum(M[a][b] * x[b] for b in range(len(x))) for a in range(len(M))]
        return z if bias is None else [z[a] + bias[a] for a in range(len(z))]

    qs, ks = [], []
    for i in range(n):
        q = proj(Q, Xl[i], spec.get("q_bias"))
        kk = proj(K, Xl[i], spec.get("k_bias"))
        if spec.get("q_norm") is not None:
            q = _naive_rms(q, *spec["q_norm"])
        if spec.get("k_norm") is not None:
            kk = _naive_rms(kk, *spec["k_norm"])
        if spec.get("rope") is not None:
            q = _naive_rope(q, tau[i], *spec["rope"])
            kk = _naive_rope(kk, tau[i], *spec["rope"])
        qs.append(q)
        ks.append(kk)
    out = []
    for i in range(n):
        logits = []
        for j in range(n):
            ok = (not masked or tau[j] <= tau[i]) and (
                spec.get("window") is None or abs(tau[i] - tau[j]) < spec["window"]
            )
            if not ok:
                logits.append(None)
                continue
            s = sum(qs[i][a] * ks[j][a] for a in range(k)) * spec.get("scale", 1.0)
            if spec.get("cap") is not None:
                s = spec["cap"] * math.tanh(s / spec["cap"])
            if spec.get("alibi") is not None:
                s += spec["alibi"] * (tau[j] - tau[i])
            logits.append(s)
        mx = max(v for v in logits if v is not None)
        e = [0.0 if v is None else math.exp(v - mx) for v in logits]
        tot = sum(e)
        vx = [proj(V, Xl[j], None) for j in range(n)]
        out.append([sum(e[j] / tot * vx[j][c] for j in range(n)) for c in range(len(V))])
    return torch.tensor(out, dtype=F64)


def _variant_head(gen: torch.Generator, d: int = 6, k: int = 6, rotary: int = 4, **over):
    """A head with every variant (partial rotary of width ``rotary``) and its naive spec."""
    Q, K, V = _rand(k, d, gen=gen), _rand(k, d, gen=gen), _rand(3, d, gen=gen)
    freqs = [1.0 / 10.0 ** (2 * a / rotary) for a in range(rotary // 2)]
    wq, wk = (
        0.5 + torch.rand(k, generator=gen, dtype=F64),
        0.5 + torch.rand(k, generator=gen, dtype=F64),
    )
    bq, bk = _rand(k, gen=gen), _rand(k, gen=gen)
    fields = dict(
        q_bias=bq,
        k_bias=bk,
        q_norm=RMSNorm(wq, 1e-6),
        k_norm=RMSNorm(wk, 1e-5),
        logit_scale=0.4,
        softcap=2.5,
        window=3,
        alibi_slope=0.3,
        rope=RotaryEmbedding(torch.tensor(freqs, dtype=F64), 1.1, head_dim=k),
    )
    spec = dict(
        Q=Q,
        K=K,
        V=V,
        q_bias=bq.tolist(),
        k_bias=bk.tolist(),
        q_norm=(wq.tolist(), 1e-6),
        k_norm=(wk.tolist(), 1e-5),
        scale=0.4,
        cap=2.5,
        window=3,
        alibi=0.3,
        rope=(freqs, 1.1),
    )
    for name, (field, value) in over.items():
        fields[name] = field
        spec_key = {
            "softcap": "cap",
            "alibi_slope": "alibi",
            "logit_scale": "scale",
        }.get(name, name)
        if value is None:
            spec.pop(spec_key, None)
        else:
            spec[spec_key] = value
    return AttentionParams(None, V, Q=Q, K=K, **fields), spec


@pytest.mark.parametrize("masked", [False, True])
def test_composed_head_matches_naive(masked: bool) -> None:
    gen = torch.Generator().manual_seed(1)
    head, spec = _variant_head(gen)
    X = _rand(7, 6, gen=gen)
    ref = _naive_head(X, spec, masked, list(range(7)))
    assert_close(self_attention(X, head, masked=masked), ref, **F64_EXACT)
    # token indices with gaps drive rotary, window and ALiBi alike
    tau = [0, 1, 3, 4, 8, 9, 10]
    got = meanfield.attention_points(X, head, masked=masked, token_index=torch.tensor(tau))
    assert_close(got, _naive_head(X, spec, masked, tau), **F64_EXACT)


def test_gemma2_like_layer_grouped_query() -> None:
    """Soft-capped, windowed, grouped-query, rotary heads (Gemma-2 local layer) in one layer."""
    gen = torch.Generator().manual_seed(2)
    d, k, n = 8, 4, 9
    W_Q, W_K, W_V = _rand(4 * k, d, gen=gen), _rand(2 * k, d, gen=gen), _rand(2 * 3, d, gen=gen)
    freqs = [1.0, 0.1]
    rope = RotaryEmbedding(torch.tensor(freqs, dtype=F64))
    heads, specs = [], []
    for h in range(4):
        g = h // 2
        Qh, Kh, Vh = (
            0.3 * W_Q[h * k : (h + 1) * k],
            W_K[g * k : (g + 1) * k],
            W_V[g * 3 : g * 3 + 3],
        )
        heads.append(AttentionParams(None, Vh, Q=Qh, K=Kh, rope=rope, softcap=1.5, window=4))
        specs.append(dict(Q=Qh, K=Kh, V=Vh, rope=(freqs, 1.0), cap=1.5, window=4))
    W_O = _rand(5, 12, gen=gen)
    layer = MultiHeadParams(tuple(heads), W_O=W_O)
    X = _rand(n, d, gen=gen)
    ref = torch.cat([_naive_head(X, s, True, list(range(n))) for s in specs], dim=-1) @ W_O.mT
    assert_close(self_attention(X, layer, masked=True), ref, **F64_EXACT)
    assert_close(
        self_attention(X, layer, masked=True, chunk_size=4), ref, **F64_EXACT
    )  # chunked queries see the same window


def test_head_biases_equal_c_without_rope_or_norm() -> None:
    gen = torch.Generator().manual_seed(3)
    Q, K, V = _rand(4, 5, gen=gen), _rand(4, 5, gen=gen), _rand(2, 5, gen=gen)
    bq, bk = _rand(4, gen=gen), _rand(4, gen=gen)
    X = _rand(6, 5, gen=gen)
    with_biases = AttentionParams(None, V, Q=Q, K=K, q_bias=bq, k_bias=bk)
    with_c = AttentionParams(None, V, Q=Q, K=K, c=K.mT @ bq)
    for masked in (False, True):
        assert_close(
            self_attention(X, with_biases, masked=masked),
            self_attention(X, with_c, masked=masked),
            **F64_EXACT,
        )


def test_large_cap_and_window_recover_plain_map() -> None:
    gen = torch.Generator().manual_seed(4)
    Q, K, V = _rand(4, 5, gen=gen), _rand(4, 5, gen=gen), _rand(2, 5, gen=gen)
    X = _rand(6, 5, gen=gen)
    plain = AttentionParams(None, V, Q=Q, K=K)
    # cap tanh(s / cap) = s - s^3 / (3 cap^2) + ...: with |s| < 1e2 and cap = 1e10 the change
    # is below 1e-15, inside F64_EXACT
    capped = AttentionParams(None, V, Q=Q, K=K, softcap=1e10)
    wide = AttentionParams(None, V, Q=Q, K=K, window=6)
    for masked in (False, True):
        ref = self_attention(X, plain, masked=masked)
        assert_close(self_attention(X, capped, masked=masked), ref, **F64_EXACT)
        assert torch.equal(self_attention(X, wide, masked=masked), ref)
    # a window of one token: every query sees itself only
    one = AttentionParams(None, V, Q=Q, K=K, window=1)
    assert_close(self_attention(X, one), X @ V.mT, **F64_EXACT)


def test_window_conventions_of_transformers() -> None:
    """Mistral/Gemma: ``kv > q - W`` (W keys); ModernBERT: ``|q - kv| <= local_attention // 2``."""
    gen = torch.Generator().manual_seed(5)
    A, V = _rand(3, 3, gen=gen), _rand(2, 3, gen=gen)
    n, W = 8, 3
    X = _rand(n, 3, gen=gen)
    P = attention_weights(X, AttentionParams(A, V, window=W), masked=True)
    q, kv = torch.arange(n).unsqueeze(-1), torch.arange(n).unsqueeze(0)
    assert torch.equal(P > 0, (kv > q - W) & (kv <= q))
    local_attention = 4  # ModernBERT: window = local_attention // 2 + 1
    P = attention_weights(X, AttentionParams(A, V, window=local_attention // 2 + 1))
    assert torch.equal(P > 0, (q - kv).abs() <= local_attention // 2)


def test_alibi_is_bloom_up_to_row_constants() -> None:
    """BLOOM adds ``slope * j``; ours adds ``slope * (j - i)``: the same causal softmax."""
    gen = torch.Generator().manual_seed(6)
    A, V = _rand(3, 3, gen=gen), _rand(2, 3, gen=gen)
    X = _rand(6, 3, gen=gen)
    slope = 0.25
    logits = X @ A @ X.mT + slope * torch.arange(6, dtype=F64)
    logits = logits.masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), -math.inf)
    ref = torch.softmax(logits, -1) @ (X @ V.mT)
    got = self_attention(X, AttentionParams(A, V, alibi_slope=slope), masked=True)
    assert_close(got, ref, **F64_EXACT)


def test_measures_match_sequences_in_token_units() -> None:
    """Uniform weights, positions t_i = i / (n - 1), token indices i: F^m(m(X)) = f^m(X)."""
    gen = torch.Generator().manual_seed(7)
    head, _ = _variant_head(gen)
    n = 7
    X = _rand(n, 6, gen=gen)
    mu = DiracMeasure(X, torch.full((n,), 1.0 / n, dtype=F64), torch.arange(n, dtype=F64) / (n - 1))
    out = meanfield.attention(mu, head, masked=True)
    assert_close(out.points, self_attention(X, head, masked=True), **F64_EXACT)
    # attention_map at the atoms, as queries with their token indices
    got = meanfield.attention_points(
        X,
        head,
        log_weights=mu.log_weights,
        masked=True,
        positions=mu.positions,
        queries=X[2:5],
        query_positions=mu.positions[2:5],
        query_token_index=torch.arange(2, 5),
    )
    assert_close(got, out.points[2:5], **F64_EXACT)


def test_qk_norm_bounds_logits_independently_of_scale() -> None:
    gen = torch.Generator().manual_seed(8)
    head, _ = _variant_head(gen, softcap=(None, None), alibi_slope=(None, None))
    bound = (
        head.logit_scale
        * head.q_norm.weight.abs().max()
        * head.k_norm.weight.abs().max()
        * head.Q.shape[0]
        * head.rope.attention_scaling**2
    )
    for radius in (1.0, 1e3, 1e6):
        X = radius * _rand(5, 6, gen=gen)
        logits = head_logits(X, X, head)
        assert float(logits.abs().max()) <= float(bound) * (1 + BRACKET_MARGIN)
        assert bool(torch.isfinite(self_attention(X, head)).all())


def test_dtype_device_and_to() -> None:
    gen = torch.Generator().manual_seed(9)
    head, _ = _variant_head(gen)
    h32 = head.to(torch.float32)
    assert h32.q_norm.weight.dtype == torch.float32 and h32.q_bias.dtype == torch.float32
    assert h32.rope.head_dim == head.rope.head_dim and h32.window == head.window
    assert h32.variants == head.variants
    X = _rand(6, 6, gen=gen)
    ref = self_attention(X, head, masked=True)
    got = self_attention(X.float(), h32, masked=True)
    assert_close(got, ref.float(), **F32_VS_F64)
    plain = head.without_biases()
    assert plain.q_bias is None and plain.k_bias is None and plain.q_norm is not None


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        (dict(softcap=-1.0), "softcap"),
        (dict(softcap=0.0), "softcap"),
        (dict(window=0), "window"),
        (dict(window=2.5), "window"),
        (dict(alibi_slope=math.inf), "alibi_slope"),
        (dict(logit_scale=-2.0), "logit_scale"),
        (dict(q_bias=torch.zeros(3, dtype=F64)), "q_bias"),
        (dict(k_bias=torch.zeros(5, dtype=F64)), "k_bias"),
        (dict(q_norm=RMSNorm(torch.ones(3, dtype=F64))), "q_norm"),
        (dict(k_norm=torch.ones(4, dtype=F64)), "k_norm"),
        (dict(q_bias=torch.zeros(4, dtype=F64), c=torch.zeros(5, dtype=F64)), "q_bias"),
        (dict(softcap=2.0, c=torch.zeros(5, dtype=F64)), "softcap"),
    ],
)
def test_validation_names_the_field(fields: dict, name: str) -> None:
    Q, K, V = torch.ones(4, 5, dtype=F64), torch.ones(4, 5, dtype=F64), torch.ones(2, 5, dtype=F64)
    with pytest.raises(ValueError, match=name):
        AttentionParams(None, V, Q=Q, K=K, **fields)


def test_validation_of_rotary_and_norm() -> None:
    with pytest.raises(ValueError, match="head_dim"):
        RotaryEmbedding(torch.ones(3, dtype=F64), head_dim=4)
    with pytest.raises(ValueError, match="eps"):
        RMSNorm(torch.ones(3, dtype=F64), eps=-1.0)
    V = torch.ones(2, 5, dtype=F64)
    with pytest.raises(ValueError, match="q_bias, k_bias"):
        AttentionParams(
            None,
            V,
            Q=torch.ones(4, 5, dtype=F64),
            K=torch.ones(4, 5, dtype=F64),
            c=torch.zeros(5, dtype=F64),
            rope=RotaryEmbedding(torch.ones(2, dtype=F64)),
        )
    with pytest.raises(ValueError, match="q_norm"):
        AttentionParams(torch.eye(5, dtype=F64), V, q_norm=RMSNorm(torch.ones(5, dtype=F64)))


def test_plain_rope_unchanged_and_full_head_dim_is_plain() -> None:
    inv = torch.tensor([1.0, 0.1], dtype=F64)
    assert RotaryEmbedding(inv, head_dim=4).head_dim is None  # full rotary: the plain embedding
    gen = torch.Generator().manual_seed(10)
    Z = _rand(5, 4, gen=gen)
    pos = torch.arange(5)
    assert torch.equal(
        RotaryEmbedding(inv, head_dim=4).apply(Z, pos), RotaryEmbedding(inv).apply(Z, pos)
    )
    Zp = _rand(5, 6, gen=gen)
    got = RotaryEmbedding(inv, head_dim=6).apply(Zp, pos)
    assert torch.equal(got[..., 4:], Zp[..., 4:])
    assert torch.equal(got[..., :4], RotaryEmbedding(inv).apply(Zp[..., :4], pos))


# ------------------------------------------------------------------ Jacobian fallback
def _central_jacobian(fn, X: torch.Tensor, h: float = 1e-6) -> torch.Tensor:
    n, d = X.shape
    cols = []
    for a in range(n * d):
        E = torch.zeros(n * d, dtype=F64)
        E[a] = h
        E = E.reshape(n, d)
        cols.append(((fn(X + E) - fn(X - E)) / (2 * h)).reshape(-1))
    return torch.stack(cols, dim=-1)


@pytest.mark.parametrize("masked", [False, True])
def test_fallback_jacobian_matches_finite_differences(masked: bool) -> None:
    gen = torch.Generator().manual_seed(11)
    head, _ = _variant_head(gen)
    plain = AttentionParams(
        None, _rand(3, 6, gen=gen), Q=_rand(6, 6, gen=gen), K=_rand(6, 6, gen=gen)
    )
    layer = MultiHeadParams((head, plain), W_O=_rand(4, 6, gen=gen))
    X = _rand(5, 6, gen=gen)
    fd = _central_jacobian(lambda Y: self_attention(Y, layer, masked=masked), X)
    J = dense_jacobian(X, layer, masked=masked)
    assert_close(J, fd, **F64_FINITE_DIFF)
    H, G = _rand(5, 6, gen=gen), _rand(5, 4, gen=gen)
    lin = linearize(X, layer, masked=masked)
    assert_close(jvp(lin, H).reshape(-1), J @ H.reshape(-1), **F64_EXACT)
    assert_close(vjp(lin, G).reshape(-1), J.mT @ G.reshape(-1), **F64_EXACT)


def test_local_lipschitz_on_a_variant_head_is_the_dense_norm() -> None:
    gen = torch.Generator().manual_seed(12)
    head, _ = _variant_head(gen)
    X = _rand(5, 6, gen=gen)
    est = meanfield.local_lipschitz(X, head, masked=True, certify=False)
    J = dense_jacobian(X, head, masked=True)
    assert_close(est.value, torch.linalg.matrix_norm(J, ord=2), **F64_EXACT)
    # the certified bracket of variant heads is the streaming path's (docs/rounding.md §11.4)
    cert = meanfield.local_lipschitz(X, head, masked=True)
    exact = float(torch.linalg.matrix_norm(J, ord=2))
    assert cert.path == "streaming"
    # the dense SVD's own rounding (a few ulps) is far below the bracket's margins
    assert float(cert.lower) <= exact * (1 + F64_REWRITTEN_EXP)
    assert exact * (1 - F64_REWRITTEN_EXP) <= float(cert.upper_prob)
    with pytest.raises(ValueError, match="stored path's certified bracket does not model QK-norm"):
        meanfield.local_lipschitz(X, head, masked=True, path="stored")
    big = _rand(40, 6, gen=gen)  # matrix-free products (power iteration) on the fallback
    est = meanfield.local_lipschitz(big, head, masked=True, certify=False, method="power")
    J = dense_jacobian(big, head, masked=True)
    assert float(est.value) <= float(torch.linalg.matrix_norm(J, ord=2)) * (1 + F64_LANCZOS)


# ------------------------------------------------------------------ guards
def test_consumers_that_do_not_model_variants_raise() -> None:
    from meanfield.jacobian.block_norms import weight_norms
    from meanfield.lipschitz.local_bound import certified_local_upper

    gen = torch.Generator().manual_seed(13)
    A, V = _rand(4, 4, gen=gen), _rand(2, 4, gen=gen)
    head = AttentionParams(A, V, softcap=3.0)
    X = _rand(5, 4, gen=gen)
    with pytest.raises(ValueError, match="soft-capped logits"):
        head.A_norm()
    with pytest.raises(ValueError, match="block certificate does not model soft-capped"):
        weight_norms(head)
    with pytest.raises(ValueError, match="soft-capped logits"):
        certified_local_upper(X, head)
    from meanfield.attacks._common import single_head_matrices

    with pytest.raises(ValueError, match="a sliding-window mask"):
        single_head_matrices(AttentionParams(A, V, window=2), "the bound")
    from meanfield.jacobian.products import self_jvp

    lin = linearize(X, AttentionParams(A, V, alibi_slope=0.5))
    with pytest.raises(NotImplementedError, match="ALiBi biases"):
        self_jvp(lin, _rand(5, 4, gen=gen))
    with pytest.raises(NotImplementedError, match="attention variant"):
        meanfield.local_lipschitz(
            X, AttentionParams(A, V, window=2), geometry="split", certify=False
        )
    with pytest.raises(ValueError, match="runs on the streaming products"):
        meanfield.local_lipschitz(X, AttentionParams(A, V, window=2), geometry="split")


# ------------------------------------------------------------------ transformers' eager attention
def _hf_layer(family: str):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    common = dict(
        hidden_size=16,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=32,
        num_hidden_layers=1,
        vocab_size=32,
        attention_bias=False,
    )
    if family == "qwen3":
        from transformers.models.qwen3 import modeling_qwen3 as mod

        config = transformers.Qwen3Config(**common, rms_norm_eps=1e-6)
        config._attn_implementation = "eager"
        layer = mod.Qwen3Attention(config, layer_idx=0).to(F64)
        rotary = mod.Qwen3RotaryEmbedding(config).to(F64)
        with torch.no_grad():
            layer.q_norm.weight.uniform_(0.5, 1.5)
            layer.k_norm.weight.uniform_(0.5, 1.5)
    else:
        from transformers.models.gemma2 import modeling_gemma2 as mod

        config = transformers.Gemma2Config(
            **common, attn_logit_softcapping=1.5, query_pre_attn_scalar=8
        )
        config._attn_implementation = "eager"
        layer = mod.Gemma2Attention(config, layer_idx=0).to(F64)
        rotary = mod.Gemma2RotaryEmbedding(config).to(F64)
    layer.eval()
    return config, layer, rotary


@pytest.mark.parametrize("family", ["qwen3", "gemma2"])
def test_matches_transformers_eager_attention(family: str) -> None:
    config, layer, rotary = _hf_layer(family)
    n, k, H, H_kv = 6, 8, 4, 2
    X = torch.randn(1, n, 16, dtype=F64, generator=torch.Generator().manual_seed(14)) * 3
    pos = torch.arange(n).unsqueeze(0)
    cos_sin = rotary(X, pos)
    mask = torch.full((n, n), -math.inf, dtype=F64).triu(1)[None, None]
    with torch.no_grad():
        ref = layer(X, position_embeddings=cos_sin, attention_mask=mask)[0][0]
    rope = RotaryEmbedding(rotary.inv_freq.to(F64), float(rotary.attention_scaling))
    W_Q, W_K, W_V = layer.q_proj.weight, layer.k_proj.weight, layer.v_proj.weight
    heads = []
    for h in range(H):
        g = h // (H // H_kv)
        Qh, Kh, Vh = W_Q[h * k : (h + 1) * k], W_K[g * k : (g + 1) * k], W_V[g * k : (g + 1) * k]
        if family == "qwen3":
            eps = config.rms_norm_eps
            extra = dict(
                q_norm=RMSNorm(layer.q_norm.weight.detach(), eps),
                k_norm=RMSNorm(layer.k_norm.weight.detach(), eps),
                logit_scale=k**-0.5,
            )
        else:
            Qh = Qh * config.query_pre_attn_scalar**-0.5
            extra = dict(softcap=config.attn_logit_softcapping)
        heads.append(
            AttentionParams(None, Vh.detach(), Q=Qh.detach(), K=Kh.detach(), rope=rope, **extra)
        )
    params = MultiHeadParams(tuple(heads), W_O=layer.o_proj.weight.detach())
    got = self_attention(X[0], params, masked=True)
    # transformers computes the rotary cos/sin (and Qwen3RMSNorm) in float32 whatever the input
    # dtype: the reference is float32-accurate only
    assert_close(got, ref, **F32_VS_F64)


def test_from_qkv_with_variants_matches_hand_built_heads() -> None:
    gen = torch.Generator().manual_seed(15)
    d, k, H, H_kv = 6, 4, 4, 2
    W_Q, W_K, W_V = (
        _rand(H * k, d, gen=gen),
        _rand(H_kv * k, d, gen=gen),
        _rand(H_kv * 3, d, gen=gen),
    )
    b_Q, b_K = _rand(H * k, gen=gen), _rand(H_kv * k, gen=gen)
    rope = RotaryEmbedding(torch.tensor([1.0], dtype=F64), head_dim=k)  # partial rotary
    norm = RMSNorm(0.5 + torch.rand(k, generator=gen, dtype=F64))
    X = _rand(7, d, gen=gen)
    s = k**-0.5
    for opts in (dict(), dict(q_norm=norm, k_norm=norm, softcap=3.0, window=3)):
        layer = MultiHeadParams.from_qkv(
            W_Q, W_K, W_V, n_heads=H, n_kv_heads=H_kv, b_Q=b_Q, b_K=b_K, rope=rope,
            alibi_slopes=[0.1, 0.2, 0.3, 0.4], **opts,
        )  # fmt: skip
        normed = "q_norm" in opts
        heads = []
        for h in range(H):
            g = h // 2
            Qh, qb = W_Q[h * k : (h + 1) * k], b_Q[h * k : (h + 1) * k]
            if not normed:
                Qh, qb = s * Qh, s * qb
            heads.append(
                AttentionParams(
                    None, W_V[g * 3 : g * 3 + 3], Q=Qh, K=W_K[g * k : (g + 1) * k], rope=rope,
                    q_bias=qb, k_bias=b_K[g * k : (g + 1) * k], alibi_slope=[0.1, 0.2, 0.3, 0.4][h],
                    logit_scale=s if normed else None, **opts,
                )
            )  # fmt: skip
        ref = self_attention(X, MultiHeadParams(tuple(heads)), masked=True)
        assert torch.equal(self_attention(X, layer, masked=True), ref)
