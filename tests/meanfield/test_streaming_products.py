"""Streaming Jacobian products (meanfield/jacobian/streaming.py) against the stored products,
the dense closed-form Jacobian and autograd, in float64.

docs/derivations/streaming_products.md describes the tiling; the stored path and the dense
Jacobian are themselves checked against ``torch.func`` in tests/meanfield/test_jacobian.py.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from meanfield import AttentionParams, MultiHeadParams
from meanfield.jacobian import (
    dense_jacobian,
    jvp,
    linearize,
    self_jacobian_blocks,
    self_jvp,
    self_vjp,
    vjp,
)
from meanfield.jacobian import streaming as st
from meanfield.jacobian.streaming import (
    default_block_sizes,
    linearize_streaming,
    streaming_jvp,
    streaming_self_jvp,
    streaming_self_vjp,
    streaming_vjp,
)
from meanfield.params import RotaryEmbedding

from ..oracles_jacobian import random_log_weights, random_params
from ..tolerances import F32_VS_F64, F64_LARGE_RADIUS, F64_REDUCTION, assert_close

pytestmark = pytest.mark.usefixtures("one_torch_thread")

D64 = torch.float64
EPS64 = torch.finfo(D64).eps

# Derived tolerance. Each output entry of a product is a sum over the n keys (and over the k or
# d_v coordinates of a head row, and the heads) of products of O(1)-conditioned factors; the
# streaming path reorders these sums (key blocks, centred logits, a recomputed exp(l - lse)
# whose argument carries a few ulps of the logit), so the two results differ by at most
# ~ c * n * eps * (scale of the summands). We bound the summands by the largest entry of the
# reference product times the number of summation layers and take c = 64 (measured ratios are
# below 8 on these problems). The weights and inputs are O(1), so the logits are O(1) and the
# exp() error stays a few ulps relative.
_C = 64


def _tol(ref: torch.Tensor, n: int) -> dict:
    scale = max(1.0, float(ref.abs().max()))
    return dict(rtol=0.0, atol=_C * n * EPS64 * scale)


def _close(actual, expected, n):
    assert_close(actual, expected, **_tol(expected, n))


def _factored(gen, d=7, k=2, H=3, d_out=5, with_wo=True, scale=0.6, n_kv=None):
    """Factored heads A_h = scale Q_h^T K_h with query-bias terms c_h (and grouped K, V)."""
    H_kv = H if n_kv is None else n_kv
    W_Q = torch.randn(H * k, d, generator=gen, dtype=D64)
    W_K, W_V = (torch.randn(H_kv * k, d, generator=gen, dtype=D64) for _ in range(2))
    W_O = torch.randn(d_out, H * k, generator=gen, dtype=D64) if with_wo else None
    b_Q = torch.randn(H * k, generator=gen, dtype=D64)
    b_V = torch.randn(H_kv * k, generator=gen, dtype=D64)
    return MultiHeadParams.from_qkv(
        W_Q, W_K, W_V, W_O, n_heads=H, n_kv_heads=n_kv, b_Q=b_Q, b_V=b_V, scale=scale
    )


def _rotary(gen, d=6, k=4, H=3, shared=True):
    """Three heads, two rotary (own frequencies and scaling unless ``shared``), and W^O."""
    W_Q, W_K, W_V = (torch.randn(H * k, d, generator=gen, dtype=D64) / 2 for _ in range(3))
    W_O = torch.randn(5, H * k, generator=gen, dtype=D64)
    base = MultiHeadParams.from_qkv(W_Q, W_K, W_V, W_O, n_heads=H)
    freqs = 1.0 / (100.0 ** (torch.arange(0, k, 2, dtype=D64) / k))
    ropes = [RotaryEmbedding(freqs), RotaryEmbedding(3 * freqs, 0.8)]
    heads = [
        AttentionParams(h.A, h.V, Q=h.Q, K=h.K, rope=ropes[0 if shared else i]) if i < 2 else h
        for i, h in enumerate(base.heads)
    ]
    return MultiHeadParams(tuple(heads), W_O=W_O)


def _layer(gen, kind, d):
    if kind == "factored":
        return _factored(gen, d=d)
    if kind == "factored_concat":
        return _factored(gen, d=d, with_wo=False)
    if kind == "grouped":
        return _factored(gen, d=d, H=4, n_kv=2)
    return random_params(gen, d, kind=kind)  # A only, with c and b: single / concat / wo


KINDS = ["single", "concat", "wo", "factored", "factored_concat", "grouped"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "masked,geometry", list(itertools.product([False, True], ["euclidean", "wasserstein"]))
)
def test_streaming_matches_stored_and_dense(gen, kind, masked, geometry):
    """Both products, against the stored closed form and the dense Jacobian, several tilings."""
    B, n, d = 2, 24, 5
    params = _layer(gen, kind, d)
    X = torch.randn(B, n, d, generator=gen, dtype=D64)
    lw = random_log_weights(gen, (B, n))
    J = dense_jacobian(X, params, log_weights=lw, masked=masked, geometry=geometry)
    d_out = J.shape[-2] // n
    H = torch.randn(B, n, d, generator=gen, dtype=D64)
    G = torch.randn(B, n, d_out, generator=gen, dtype=D64)
    lin = linearize(X, params, log_weights=lw, masked=masked)
    JH_ref, JtG_ref = jvp(lin, H, geometry=geometry), vjp(lin, G, geometry=geometry)
    JH_dense = (J @ H.reshape(B, -1, 1)).reshape(B, n, d_out)
    JtG_dense = (J.mT @ G.reshape(B, -1, 1)).reshape(B, n, d)
    for block in (None, 1, 5, (4, 7), (24, 24)):
        s = linearize_streaming(X, params, log_weights=lw, masked=masked, block_size=block)
        JH, JtG = streaming_jvp(s, H, geometry=geometry), streaming_vjp(s, G, geometry=geometry)
        _close(JH, JH_ref, n)
        _close(JtG, JtG_ref, n)
        _close(JH, JH_dense, n * d)
        _close(JtG, JtG_dense, n * d)
        assert_close(s.jvp(H, geometry=geometry), JH, rtol=0, atol=0)
        assert_close(s.vjp(G, geometry=geometry), JtG, rtol=0, atol=0)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("geometry", ["euclidean", "wasserstein"])
def test_block_sizes_change_nothing_beyond_rounding(gen, masked, geometry):
    """n = 64 (the largest dense case here): many tilings against one tile."""
    n, d = 64, 6
    params = _factored(gen, d=d, H=4, k=3)
    X = torch.randn(n, d, generator=gen, dtype=D64)
    lw = random_log_weights(gen, (n,))
    H = torch.randn(n, d, generator=gen, dtype=D64)
    G = torch.randn(n, params.d_out, generator=gen, dtype=D64)
    one = linearize_streaming(X, params, log_weights=lw, masked=masked, block_size=n)
    assert len(list(one.tiles())) == 1
    ref_h, ref_g = (
        streaming_jvp(one, H, geometry=geometry),
        streaming_vjp(one, G, geometry=geometry),
    )
    J = dense_jacobian(X, params, log_weights=lw, masked=masked, geometry=geometry)
    _close(ref_h.reshape(-1), J @ H.reshape(-1), n * d)
    _close(ref_g.reshape(-1), J.mT @ G.reshape(-1), n * d)
    for block in (1, 7, 16, (8, 32), (33, 5), None):
        s = linearize_streaming(X, params, log_weights=lw, masked=masked, block_size=block)
        for g0, g1 in zip(one.groups, s.groups, strict=True):
            _close(g1.lse, g0.lse, n)
            _close(g1.vm, g0.vm, n)
        _close(streaming_jvp(s, H, geometry=geometry), ref_h, n)
        _close(streaming_vjp(s, G, geometry=geometry), ref_g, n)


def test_causal_tiles_above_the_diagonal_are_skipped(gen, monkeypatch):
    """Count the tiles whose logits are computed: a causal layer never computes a tile above the
    diagonal, and computes n_b (n_b + 1) / 2 of the n_b^2 tiles per pass."""
    n, d, b = 64, 5, 8
    params = _factored(gen, d=d)
    X = torch.randn(n, d, generator=gen, dtype=D64)
    seen: list[tuple[int, int, int, int]] = []
    original = st._tile_logits_pre

    def counting(lin, g, sl, ks):
        seen.append((sl.start, sl.stop, ks.start, ks.stop))
        return original(lin, g, sl, ks)

    monkeypatch.setattr(st, "_tile_logits_pre", counting)
    nb = n // b
    for masked, expected in ((True, nb * (nb + 1) // 2), (False, nb * nb)):
        s = linearize_streaming(X, params, masked=masked, block_size=b)
        assert len(list(s.tiles())) == expected
        for product, arg in ((streaming_jvp, torch.randn(n, d, generator=gen, dtype=D64)),
                             (streaming_vjp, torch.randn(n, 5, generator=gen, dtype=D64))):  # fmt: skip
            seen.clear()
            product(s, arg)
            assert len(seen) == expected  # one group: one logit tile per tile
            if masked:
                assert all(k0 < q1 and k1 <= q1 for q0, q1, k0, k1 in seen)
    # a key block longer than the query block is cut at the query block's last key
    s = linearize_streaming(X, params, masked=True, block_size=(8, 32))
    assert all(ks.stop <= sl.stop for sl, ks in s.tiles())
    assert sum((sl.stop - sl.start) * (ks.stop - ks.start) for sl, ks in s.tiles()) == sum(
        8 * stop for stop in range(8, n + 1, 8)
    )
    # with positions (ties, any order) every key block is visited
    pos = torch.rand(n, generator=gen, dtype=D64)
    s = linearize_streaming(X, params, masked=True, positions=pos, block_size=b)
    assert len(list(s.tiles())) == nb * nb


@pytest.mark.parametrize("kind", ["wo", "factored", "grouped"])
@pytest.mark.parametrize(
    "masked,geometry", list(itertools.product([False, True], ["euclidean", "wasserstein"]))
)
def test_adjoint_identity(gen, kind, masked, geometry):
    """<J h, g> = <h, J^T g> on the streaming products alone (n = 50, tiles of 8 x 16)."""
    B, n, d = 2, 50, 6
    params = _layer(gen, kind, d)
    X = torch.randn(B, n, d, generator=gen, dtype=D64)
    lw = random_log_weights(gen, (B, n))
    s = linearize_streaming(X, params, log_weights=lw, masked=masked, block_size=(8, 16))
    H = torch.randn(B, n, d, generator=gen, dtype=D64)
    G = torch.randn(B, n, s.d_out, generator=gen, dtype=D64)
    JH, JtG = streaming_jvp(s, H, geometry=geometry), streaming_vjp(s, G, geometry=geometry)
    lhs, rhs = (G * JH).sum(), (JtG * H).sum()
    # two reductions of n d_out (resp. n d) products, each entry accurate to ~ _C n eps scale
    scale = float((G.abs() * JH.abs()).sum() + (JtG.abs() * H.abs()).sum())
    assert abs(float(lhs - rhs)) <= _C * n * EPS64 * scale


@pytest.mark.parametrize(
    "case", ["plain", "masked", "weighted", "positions", "token_index", "own_freqs"]
)
def test_rotary_heads_in_closed_form(gen, case):
    """Rotary heads (rotated head rows) against the stored closed form, itself checked against
    autograd in tests/meanfield/test_jacobian.py, and against torch.func on the attention map."""
    from meanfield import attention_points

    B, n, d = 2, 20, 6
    params = _rotary(gen, d=d, shared=case != "own_freqs")
    X = torch.randn(B, n, d, generator=gen, dtype=D64)
    kw: dict = {"masked": case in ("masked", "positions")}
    geometry = "euclidean"
    if case == "weighted":
        kw["log_weights"] = random_log_weights(gen, (B, n))
        geometry = "wasserstein"
    if case == "positions":
        kw["positions"] = torch.rand(B, n, generator=gen, dtype=D64)
    if case == "token_index":
        kw["token_index"] = torch.stack([torch.randperm(n, generator=gen) + 3 for _ in range(B)])
    lin = linearize(X, params, **kw)
    s = linearize_streaming(X, params, block_size=(6, 8), **kw)
    assert [g.heads for g in s.groups] == [(0, 1), (2,)]  # rotary heads, then the factored one
    H = torch.randn(B, n, d, generator=gen, dtype=D64)
    G = torch.randn(B, n, params.d_out, generator=gen, dtype=D64)
    JH = streaming_jvp(s, H, geometry=geometry)
    JtG = streaming_vjp(s, G, geometry=geometry)
    _close(JH, jvp(lin, H, geometry=geometry), n)
    _close(JtG, vjp(lin, G, geometry=geometry), n)
    if geometry == "euclidean":

        def fn(Y):
            return attention_points(Y, params, **kw)

        _, tangent = torch.func.jvp(fn, (X,), (H,))
        _, pullback = torch.func.vjp(fn, X)
        _close(JH, tangent, n * d)
        _close(JtG, pullback(G)[0], n * d)


def test_mixed_head_kinds_in_one_layer(gen):
    """A plain head, two factored heads of width 2, one of width 3 and a rotary head: one group
    per kind, all against the dense Jacobian."""
    n, d = 16, 6
    fact = _factored(gen, d=d, H=2)
    Q3, K3 = (torch.randn(3, d, generator=gen, dtype=D64) / 2 for _ in range(2))
    Q4, K4 = (torch.randn(4, d, generator=gen, dtype=D64) / 2 for _ in range(2))
    V = fact.heads[0].V
    rope = RotaryEmbedding(1.0 / (100.0 ** (torch.arange(0, 4, 2, dtype=D64) / 4)))
    heads = (
        AttentionParams(fact.heads[1].A, V),
        fact.heads[0],
        AttentionParams(None, V, Q=Q3, K=K3),
        fact.heads[1],
        AttentionParams(None, V, Q=Q4, K=K4, rope=rope),
    )
    W_O = torch.randn(4, 5 * V.shape[0], generator=gen, dtype=D64)
    params = MultiHeadParams(heads, W_O=W_O)
    X = torch.randn(n, d, generator=gen, dtype=D64)
    lw = random_log_weights(gen, (n,))
    s = linearize_streaming(X, params, log_weights=lw, masked=True, block_size=5)
    assert sorted(g.heads for g in s.groups) == [(0,), (1, 3), (2,), (4,)]
    for geometry in ("euclidean", "wasserstein"):
        J = dense_jacobian(X, params, log_weights=lw, masked=True, geometry=geometry)
        H = torch.randn(n, d, generator=gen, dtype=D64)
        G = torch.randn(n, 4, generator=gen, dtype=D64)
        _close(streaming_jvp(s, H, geometry=geometry).reshape(-1), J @ H.reshape(-1), n * d)
        _close(streaming_vjp(s, G, geometry=geometry).reshape(-1), J.mT @ G.reshape(-1), n * d)


def test_nothing_quadratic_is_stored(gen):
    """Every tensor the linearisation keeps has O(n (k + d_v)) entries per head."""
    n, d = 64, 5
    params = _factored(gen, d=d, H=3, k=2)
    X = torch.randn(n, d, generator=gen, dtype=D64)
    lw = random_log_weights(gen, (n,))
    s = linearize_streaming(X, params, masked=True, log_weights=lw)
    assert s.X is X
    for g in s.groups:
        for name in ("q", "kc", "key_term", "vc", "vm", "km", "lse"):
            t = getattr(g, name)
            assert t.numel() <= g.size * n * max(2 * d, 1)
            assert t.shape[-2:] != (n, n)


def test_float32_follows_inputs(gen):
    n, d = 40, 6
    params = _factored(gen, d=d)
    X = torch.randn(n, d, generator=gen, dtype=D64)
    H = torch.randn(n, d, generator=gen, dtype=D64)
    G = torch.randn(n, params.d_out, generator=gen, dtype=D64)
    p32 = params_to(params, torch.float32)
    s32 = linearize_streaming(X.float(), p32, masked=True, block_size=(8, 16))
    s64 = linearize_streaming(X.float().double(), params_to(p32, D64), masked=True)
    assert s32.groups[0].q.dtype == torch.float32
    out = streaming_jvp(s32, H.float())
    assert out.dtype == torch.float32
    ref = streaming_jvp(s64, H)
    scale = float(ref.abs().max())
    torch.testing.assert_close(out.double() / scale, ref / scale, **F32_VS_F64)
    back = streaming_vjp(s32, G.float())
    ref = streaming_vjp(s64, G)
    scale = float(ref.abs().max())
    torch.testing.assert_close(back.double() / scale, ref / scale, **F32_VS_F64)


def params_to(params, dtype):
    heads = tuple(h.to(dtype) for h in params.heads)
    return MultiHeadParams(heads, W_O=None if params.W_O is None else params.W_O.to(dtype))


def test_position_ties_and_errors(gen):
    n, d = 12, 5
    params = _factored(gen, d=d)
    X = torch.randn(n, d, generator=gen, dtype=D64)
    pos = torch.tensor([0.1, 0.1, 0.3, 0.5, 0.5, 0.9, 0.2, 0.2, 0.95, 0.0, 0.6, 0.6], dtype=D64)
    J = dense_jacobian(X, params, masked=True, positions=pos)
    s = linearize_streaming(X, params, masked=True, positions=pos, block_size=(3, 4))
    H = torch.randn(n, d, generator=gen, dtype=D64)
    G = torch.randn(n, params.d_out, generator=gen, dtype=D64)
    _close(streaming_jvp(s, H).reshape(-1), J @ H.reshape(-1), n * d)
    _close(streaming_vjp(s, G).reshape(-1), J.mT @ G.reshape(-1), n * d)
    # zero masses: fine in the Euclidean geometry, refused by the Wasserstein one
    lw = random_log_weights(gen, (n,))
    lw[3] = -torch.inf
    s = linearize_streaming(X, params, log_weights=lw, block_size=4)
    lin = linearize(X, params, log_weights=lw)
    _close(streaming_jvp(s, H), jvp(lin, H), n)
    with pytest.raises(ValueError, match="positive masses"):
        streaming_jvp(s, H, geometry="wasserstein")
    with pytest.raises(ValueError, match="geometry"):
        streaming_vjp(s, G, geometry="split")
    lw = torch.full((n,), -torch.inf, dtype=D64)
    lw[5] = 0.0
    with pytest.raises(ValueError, match="no admissible key"):
        linearize_streaming(X, params, log_weights=lw, masked=True)  # rows 0-4 see no mass
    with pytest.raises(ValueError, match="shape"):
        streaming_jvp(linearize_streaming(X, params), H[:-1])
    with pytest.raises(ValueError, match="block_size"):
        linearize_streaming(X, params, block_size=0)


@pytest.mark.parametrize("kind", ["wo", "factored", "grouped"])
@pytest.mark.parametrize("masked", [False, True])
def test_self_products(gen, kind, masked):
    """Per-atom self-Jacobian products against the stored ones and the explicit blocks S_i."""
    B, n, d = 2, 30, 5
    params = _layer(gen, kind, d)
    X = torch.randn(B, n, d, generator=gen, dtype=D64)
    lw = random_log_weights(gen, (B, n))
    lin = linearize(X, params, log_weights=lw, masked=masked)
    S = self_jacobian_blocks(X, params, log_weights=lw, masked=masked)
    U = torch.randn(B, n, d, generator=gen, dtype=D64)
    G = torch.randn(B, n, S.shape[-2], generator=gen, dtype=D64)
    for block in (None, (4, 9)):
        s = linearize_streaming(X, params, log_weights=lw, masked=masked, block_size=block)
        SU, StG = streaming_self_jvp(s, U), streaming_self_vjp(s, G)
        _close(SU, self_jvp(lin, U), n)
        _close(StG, self_vjp(lin, G), n)
        _close(SU, (S @ U.unsqueeze(-1)).squeeze(-1), n * d)
        _close(StG, (S.mT @ G.unsqueeze(-1)).squeeze(-1), n * d)
        assert_close(s.self_jvp(U), SU, rtol=0, atol=0)
        assert_close(s.self_vjp(G), StG, rtol=0, atol=0)


def test_self_products_refuse_rotary_heads(gen):
    params = _rotary(gen)
    X = torch.randn(8, 6, generator=gen, dtype=D64)
    s = linearize_streaming(X, params)
    with pytest.raises(NotImplementedError, match="rotary embedding"):
        streaming_self_jvp(s, X)
    with pytest.raises(NotImplementedError, match="rotary embedding"):
        streaming_self_vjp(s, torch.zeros(8, 5, dtype=D64))


@pytest.mark.parametrize("masked", [False, True])
def test_radius_100_inputs(gen, masked):
    """Logits of size ~1e4: the log-domain tiles stay finite and agree with the stored path to
    the large-radius tolerance (absolute logit errors ~1e4 eps in both paths)."""
    n, d = 40, 4
    params = random_params(gen, d, kind="wo")
    X = torch.randn(n, d, generator=gen, dtype=D64)
    X = 100 * X / X.norm(dim=-1, keepdim=True)
    H = torch.randn(n, d, generator=gen, dtype=D64)
    lin = linearize(X, params, masked=masked)
    s = linearize_streaming(X, params, masked=masked, block_size=(8, 16))
    ref = vjp(lin, jvp(lin, H))
    out = streaming_vjp(s, streaming_jvp(s, H))
    assert bool(torch.isfinite(out).all())
    scale = float(ref.abs().max())
    assert_close(out / scale, ref / scale, **F64_LARGE_RADIUS)


def test_default_block_sizes_rule():
    assert default_block_sizes(10, 12) == (10, 10)
    b_q, b_k = default_block_sizes(16384, 12)
    assert b_q == 128 and b_k % 64 == 0 and 12 * b_q * b_k <= 2**21
    assert default_block_sizes(16384, 1) == (128, 16384)
    assert default_block_sizes(100000, 4096, batch=8)[1] == 64  # never below 64 keys


@pytest.mark.parametrize(
    ("field", "value"), [("softcap", 5.0), ("window", 3), ("alibi_slope", -0.5)]
)
def test_single_variant_heads_stream_like_the_stored_closed_form(gen, field, value):
    """A variant head streams (docs/derivations/streaming_products.md §6): same products."""
    from meanfield.jacobian import jvp, linearize

    Q, K, V = (torch.randn(2, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    head = AttentionParams(None, V, Q=Q, K=K, **{field: value})
    X = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    H = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    s = linearize_streaming(X, head, block_size=(2, 3))
    ref = jvp(linearize(X, head), H)
    assert float((streaming_jvp(s, H) - ref).norm()) <= F64_REDUCTION * float(ref.norm())
