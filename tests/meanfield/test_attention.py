"""Attention on sequences and measures against independent oracles and invariances."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as Fn
from hypothesis import given, settings
from hypothesis import strategies as st

from meanfield import (
    AttentionParams,
    DiracMeasure,
    L2AttentionParams,
    MultiHeadParams,
    attention,
    attention_map,
    attention_points,
    attention_weights,
    l2_self_attention,
    self_attention,
)
from meanfield.jacobian import linearize
from meanfield.lipschitz import local_lipschitz

from ..oracles import causal_index, naive_head
from ..strategies import head_data, weighted_measure_data
from ..tolerances import (
    F32_VS_F64,
    F64_CLOSED_FORM,
    F64_EXACT,
    F64_FEW_ULPS,
    F64_LARGE_RADIUS,
    assert_close,
)

D64 = torch.float64


def random_layer(gen, d=6, k=3, H=2, d_out=5, biases=True, dtype=D64):
    def r(*shape):
        return torch.randn(*shape, generator=gen, dtype=dtype)

    W_Q, W_K, W_V, W_O = r(H * k, d), r(H * k, d), r(H * k, d), r(d_out, H * k)
    b = dict(b_Q=r(H * k), b_K=r(H * k), b_V=r(H * k), b_O=r(d_out)) if biases else {}
    return (W_Q, W_K, W_V, W_O, b), MultiHeadParams.from_qkv(W_Q, W_K, W_V, W_O, n_heads=H, **b)


def oracle_from_weights(X, W_Q, W_K, W_V, W_O, b, H, *, causal):
    """Token-loop multi-head attention straight from the projection weights."""
    X = X.numpy()
    k = W_Q.shape[0] // H
    n = X.shape[0]
    heads_out = []
    for h in range(H):
        rows = slice(h * k, (h + 1) * k)
        q = X @ W_Q[rows].numpy().T + (b["b_Q"][rows].numpy() if b else 0)
        kk = X @ W_K[rows].numpy().T + (b["b_K"][rows].numpy() if b else 0)
        v = X @ W_V[rows].numpy().T + (b["b_V"][rows].numpy() if b else 0)
        out = np.zeros((n, k))
        for i in range(n):
            js = [j for j in range(n) if not causal or j <= i]
            s = np.array([q[i] @ kk[j] / np.sqrt(k) for j in js])
            w = np.exp(s - s.max())
            w /= w.sum()
            out[i] = sum(wj * v[j] for wj, j in zip(w, js))
        heads_out.append(out)
    Y = np.concatenate(heads_out, axis=1) @ W_O.numpy().T
    return torch.from_numpy(Y + (b["b_O"].numpy() if b else 0))


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("biases", [False, True])
def test_multihead_matches_token_loop_oracle(gen, masked, biases):
    (W_Q, W_K, W_V, W_O, b), params = random_layer(gen, biases=biases)
    X = torch.randn(7, 6, generator=gen, dtype=D64)
    expected = oracle_from_weights(X, W_Q, W_K, W_V, W_O, b, 2, causal=masked)
    assert_close(self_attention(X, params, masked=masked), expected, **F64_EXACT)


@pytest.mark.parametrize("masked", [False, True])
def test_matches_scaled_dot_product_attention(gen, masked):
    H, k, d, n = 3, 4, 8, 9
    W_Q, W_K, W_V = (torch.randn(H * k, d, generator=gen, dtype=D64) for _ in range(3))
    params = MultiHeadParams.from_qkv(W_Q, W_K, W_V, n_heads=H)
    X = torch.randn(2, n, d, generator=gen, dtype=D64)

    def split(W):
        return (X @ W.T).view(2, n, H, k).transpose(1, 2)

    ref = Fn.scaled_dot_product_attention(split(W_Q), split(W_K), split(W_V), is_causal=masked)
    ref = ref.transpose(1, 2).reshape(2, n, H * k)
    assert_close(self_attention(X, params, masked=masked), ref, **F64_EXACT)


def test_single_head_with_bias_terms_matches_naive(gen):
    d = 4
    A, V = torch.randn(d, d, generator=gen, dtype=D64), torch.randn(3, d, generator=gen, dtype=D64)
    c, b = torch.randn(d, generator=gen, dtype=D64), torch.randn(3, generator=gen, dtype=D64)
    X = torch.randn(6, d, generator=gen, dtype=D64)
    ref = naive_head(X.numpy(), A.numpy(), V.numpy(), c=c.numpy(), b=b.numpy())
    assert_close(
        self_attention(X, AttentionParams(A, V, c=c, b=b)), torch.from_numpy(ref), **F64_EXACT
    )


def test_score_convention_switch_transposes(gen):
    A = torch.randn(3, 3, generator=gen, dtype=D64)
    V = torch.eye(3, dtype=D64)
    X = torch.randn(5, 3, generator=gen, dtype=D64)
    released = AttentionParams(A, V, score="key_query")
    assert torch.equal(released.A, A.T)
    ref = naive_head(X.numpy(), A.T.numpy(), V.numpy())
    assert_close(self_attention(X, released), torch.from_numpy(ref), **F64_EXACT)
    assert not torch.allclose(self_attention(X, released), self_attention(X, AttentionParams(A, V)))


def test_from_qkv_conv1d_layout_equals_linear(gen):
    (W_Q, W_K, W_V, W_O, b), params = random_layer(gen)
    conv = MultiHeadParams.from_qkv(W_Q.T, W_K.T, W_V.T, W_O.T, n_heads=2, layout="conv1d", **b)
    X = torch.randn(5, 6, generator=gen, dtype=D64)
    assert_close(self_attention(X, conv), self_attention(X, params), **F64_EXACT)


def test_grouped_query_heads_share_keys_and_values(gen):
    d, k = 6, 2
    W_Q = torch.randn(4 * k, d, generator=gen, dtype=D64)
    W_K, W_V = (torch.randn(2 * k, d, generator=gen, dtype=D64) for _ in range(2))
    params = MultiHeadParams.from_qkv(W_Q, W_K, W_V, n_heads=4, n_kv_heads=2)
    for h in range(4):
        g = h // 2
        assert torch.equal(params.heads[h].V, W_V[g * k : (g + 1) * k])
        torch.testing.assert_close(
            params.heads[h].A, W_Q[h * k : (h + 1) * k].T @ W_K[g * k : (g + 1) * k] / k**0.5
        )


@given(weighted_measure_data(), st.data())
@settings(max_examples=40, deadline=None)
def test_weighted_measure_attention_matches_naive(data, draw):
    X, a = data
    A, V = draw.draw(head_data(X.shape[1]))
    mu = DiracMeasure(X, a)
    out = attention(mu, AttentionParams(A, V))
    ref = naive_head(X.numpy(), A.numpy(), V.numpy(), log_w=np.log(a.numpy()))
    assert_close(out.points, torch.from_numpy(ref), **F64_EXACT)
    assert torch.equal(out.weights, mu.weights)


@given(weighted_measure_data(max_n=6), st.data())
@settings(max_examples=40, deadline=None)
def test_duplicated_atom_equals_doubled_weight(data, draw):
    X, a = data
    A, V = draw.draw(head_data(X.shape[1]))
    params = AttentionParams(A, V)
    mu = DiracMeasure(X, a)
    i = draw.draw(st.integers(0, mu.n - 1))
    k = draw.draw(st.integers(2, 4))
    split = mu.split(i, k)
    # Gamma_mu is the same map: compare at arbitrary queries and at the atoms.
    gen = torch.Generator().manual_seed(draw.draw(st.integers(0, 2**31 - 1)))
    queries = torch.randn(3, X.shape[1], generator=gen, dtype=D64)
    assert_close(
        attention_map(split, params, queries), attention_map(mu, params, queries), **F64_EXACT
    )
    # Atom by atom: the k copies of atom i map to the image of atom i, the others to theirs.
    idx = torch.repeat_interleave(
        torch.arange(mu.n), torch.tensor([k if j == i else 1 for j in range(mu.n)])
    )
    out, ref = attention(split, params), attention(mu, params)
    assert_close(out.points, ref.points[idx], **F64_EXACT)
    # The images of the copies are computed, not copied: they may differ in the last bits (a
    # matrix product may round the same row differently at another row index), so an exact merge
    # can keep k groups. A merge tolerance of a few hundred ulps of the scale recovers F(mu),
    # merged at the same tolerance: two distinct atoms may have images closer than that (a tiny
    # mass barely moves the attention), and then both sides merge them alike.
    rtol = 256 * torch.finfo(D64).eps
    merged, expected = out.merge(rtol=rtol), ref.merge(rtol=rtol)
    assert merged.n == expected.n
    assert_close(merged.points, expected.points, **F64_EXACT)
    assert_close(merged.weights, expected.weights, **F64_EXACT)


def test_duplicated_atom_reported_example():
    """The example of issue 13: copies whose images differ in the last ulp still merge."""
    X = torch.tensor([[2.7383], [-1.8199], [2.1885], [1.6309], [-2.8052]], dtype=D64)
    a = torch.tensor([2.1961e-01, 5.5938e-12, 7.6385e-01, 1.4113e-11, 1.6542e-02], dtype=D64)
    mu = DiracMeasure(X, a, normalize=True)
    params = AttentionParams(
        torch.tensor([[0.1257]], dtype=D64),
        torch.tensor([[-0.1321], [0.6404], [0.1049]], dtype=D64),
    )
    out = attention(mu.split(1, 4), params)
    merged = out.merge(rtol=256 * torch.finfo(D64).eps)
    assert merged.n == 5
    assert_close(merged.points, attention(mu, params).points, **F64_EXACT)
    assert_close(merged.weights, mu.weights, **F64_EXACT)


def test_merge_tolerance_is_relative_to_scale():
    X = torch.tensor([[1e6], [1e6 + 1e-7], [0.0]], dtype=D64)
    mu = DiracMeasure(X)
    assert mu.merge().n == 3
    assert mu.merge(rtol=1e-12).n == 2  # 1e-7 <= 1e-12 * 1e6
    assert mu.merge(rtol=1e-14).n == 3
    assert mu.merge(atol=2e-7).n == 2
    assert mu.merge(atol=5e-8).n == 3
    with pytest.raises(ValueError, match="rtol must be non-negative"):
        mu.merge(rtol=-1.0)


@pytest.mark.parametrize("masked", [False, True])
def test_consistency_with_empirical_measure(gen, masked):
    """F(m(X)) = m(f(X)) (docs/theory.md §A1), and the masked analogue on position-tagged measures."""
    _, params = random_layer(gen)
    X = torch.randn(3, 8, 6, generator=gen, dtype=D64)
    mu = DiracMeasure.from_sequence(X, causal=masked)
    out = attention(mu, params, masked=masked)
    assert_close(out.points, self_attention(X, params, masked=masked), **F64_EXACT)
    assert torch.equal(out.weights, mu.weights)


def test_permutation_equivariance(gen):
    _, params = random_layer(gen)
    X = torch.randn(9, 6, generator=gen, dtype=D64)
    perm = torch.randperm(9, generator=gen)
    assert_close(self_attention(X[perm], params), self_attention(X, params)[perm], **F64_EXACT)


def test_masked_is_not_permutation_equivariant(gen):
    _, params = random_layer(gen)
    X = torch.randn(6, 6, generator=gen, dtype=D64)
    perm = torch.tensor([5, 4, 3, 2, 1, 0])
    assert not torch.allclose(
        self_attention(X[perm], params, masked=True), self_attention(X, params, masked=True)[perm]
    )


@pytest.mark.parametrize("masked", [False, True])
def test_chunked_equals_unchunked(gen, masked):
    _, params = random_layer(gen)
    X = torch.randn(2, 11, 6, generator=gen, dtype=D64)
    full = self_attention(X, params, masked=masked)
    for chunk in (1, 3, 4, 11, 50):
        assert_close(self_attention(X, params, masked=masked, chunk_size=chunk), full, **F64_EXACT)
    with pytest.raises(ValueError, match="chunk_size"):
        self_attention(X, params, chunk_size=0)


def test_batch_dimensions_broadcast(gen):
    _, params = random_layer(gen)
    X = torch.randn(2, 3, 5, 6, generator=gen, dtype=D64)
    out = self_attention(X, params)
    assert out.shape == (2, 3, 5, 5)
    assert_close(out[1, 2], self_attention(X[1, 2], params), **F64_EXACT)


@pytest.mark.parametrize("masked", [False, True])
def test_radius_100_is_finite_and_accurate(gen, masked):
    A = torch.randn(4, 4, generator=gen, dtype=D64)
    V = torch.randn(4, 4, generator=gen, dtype=D64)
    X = torch.randn(6, 4, generator=gen, dtype=D64)
    X = 100 * X / X.norm(dim=-1, keepdim=True)
    out = self_attention(X, AttentionParams(A, V), masked=masked)
    assert torch.isfinite(out).all()
    ref = naive_head(X.numpy(), A.numpy(), V.numpy(), allowed=causal_index if masked else None)
    assert_close(out, torch.from_numpy(ref), **F64_LARGE_RADIUS)
    out32 = self_attention(X.float(), AttentionParams(A.float(), V.float()), masked=masked)
    assert out32.dtype == torch.float32 and torch.isfinite(out32).all()


def test_float32_follows_inputs_and_matches_reference(gen):
    _, params = random_layer(gen)
    X = torch.randn(7, 6, generator=gen, dtype=D64)
    out32 = self_attention(X.float(), params.to(torch.float32))
    assert out32.dtype == torch.float32
    assert_close(out32.double(), self_attention(X, params), **F32_VS_F64)


def test_tiny_masses_capture_attention_without_underflow():
    """A mass of 1e-300 at a logit advantage of 700 still receives a share (log-domain weights)."""
    X = torch.tensor([[0.0], [1.0]], dtype=D64)
    mu = DiracMeasure(X, torch.tensor([1 - 1e-300, 1e-300], dtype=D64))
    A = torch.tensor([[700.0]], dtype=D64)
    V = torch.eye(1, dtype=D64)
    g = attention_map(mu, AttentionParams(A, V), torch.tensor([[1.0]], dtype=D64))
    expected = 1 / (1 + np.exp(np.log(1 - 1e-300) - (700 + np.log(1e-300))))
    assert abs(float(g) - expected) < F64_CLOSED_FORM


def test_attention_weights_are_row_stochastic(gen):
    _, params = random_layer(gen)
    X = torch.randn(5, 6, generator=gen, dtype=D64)
    P = attention_weights(X, params, masked=True)
    assert P.shape == (2, 5, 5)
    assert_close(P.sum(-1), torch.ones(2, 5, dtype=D64), **F64_EXACT)
    assert torch.equal(P.triu(1), torch.zeros_like(P))


def test_input_errors_are_clear(gen):
    _, params = random_layer(gen)
    with pytest.raises(ValueError, match="expect d = 6"):
        self_attention(torch.randn(4, 5, dtype=D64), params)
    with pytest.raises(ValueError, match=r"shape \(\.\.\., n, d\)"):
        self_attention(torch.randn(6, dtype=D64), params)
    with pytest.raises(ValueError, match="NaN"):
        self_attention(torch.full((2, 6), float("nan"), dtype=D64), params)
    with pytest.raises(ValueError, match="position-tagged"):
        attention(DiracMeasure(torch.randn(3, 6, dtype=D64)), params, masked=True)
    with pytest.raises(ValueError, match="square"):
        AttentionParams(torch.randn(2, 3), torch.randn(2, 2))
    with pytest.raises(ValueError, match="V must have shape"):
        AttentionParams(torch.randn(3, 3), torch.randn(2, 2))
    with pytest.raises(ValueError, match="W_O must have"):
        MultiHeadParams(params.heads, W_O=torch.randn(5, 7, dtype=D64))
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        MultiHeadParams.from_qkv(
            torch.randn(6, 4), torch.randn(6, 4), torch.randn(6, 4), n_heads=3, n_kv_heads=2
        )


def test_zero_mass_row_raises():
    mu = DiracMeasure(
        torch.randn(2, 2), torch.tensor([0.0, 1.0]), positions=torch.tensor([0.0, 1.0])
    )
    with pytest.raises(ValueError, match="no admissible key"):
        attention(mu, AttentionParams(torch.eye(2), torch.eye(2)), masked=True)


def l2_naive(X, W_Q, W_V, W_O):
    """Kim et al.'s L2 attention, token by token (row convention)."""
    X = X.numpy()
    H, D, m = W_Q.shape
    outs = []
    for h in range(H):
        WQ = W_Q[h].numpy()
        A_h = WQ @ WQ.T / np.sqrt(m)
        rows = []
        for i in range(X.shape[0]):
            s = np.array(
                [-np.sum(((X[i] - X[j]) @ WQ) ** 2) / np.sqrt(m) for j in range(X.shape[0])]
            )
            w = np.exp(s - s.max())
            w /= w.sum()
            rows.append(sum(w[j] * X[j] for j in range(X.shape[0])) @ A_h @ W_V[h].numpy())
        outs.append(np.stack(rows))
    return torch.from_numpy(np.concatenate(outs, axis=1) @ W_O.numpy())


def test_l2_attention_matches_naive(gen):
    H, D = 2, 4
    W_Q = torch.randn(H, D, D // H, generator=gen, dtype=D64)
    W_V = torch.randn(H, D, D // H, generator=gen, dtype=D64)
    W_O = torch.randn(D, D, generator=gen, dtype=D64)
    X = torch.randn(5, D, generator=gen, dtype=D64)
    out = l2_self_attention(X, L2AttentionParams(W_Q, W_V, W_O))
    assert_close(out, l2_naive(X, W_Q, W_V, W_O), **F64_EXACT)
    # each token pays the largest attention to itself (its own logit, 0, is maximal)
    Z = X @ W_Q[0]
    logits = -torch.cdist(Z, Z).square()
    assert torch.equal(logits.argmax(-1), torch.arange(5))


def test_factored_params_change_dtype_both_ways(gen):
    _, params = random_layer(gen)
    p32 = params.to(torch.float32)
    p64 = p32.to(torch.float64)
    assert p64.heads[0].A.dtype == torch.float64
    torch.testing.assert_close(
        p64.heads[0].A, p64.heads[0].Q.T @ p64.heads[0].K, rtol=0, atol=F64_FEW_ULPS
    )


# ---------------------------------------------------------------------------------------------
# the input rule (docs/conventions.md §8): promote what has no float dtype, reject mismatches
# ---------------------------------------------------------------------------------------------
def _seq_fns():
    """(name, call(X, params)) for every public function on sequences."""
    return [
        ("self_attention", lambda X, p: self_attention(X, p)),
        ("self_attention_masked", lambda X, p: self_attention(X, p, masked=True)),
        ("attention_points", lambda X, p: attention_points(X, p)),
        ("attention_weights", lambda X, p: attention_weights(X, p)),
        ("linearize", lambda X, p: linearize(X, p).P),
        ("local_lipschitz", lambda X, p: local_lipschitz(X, p).value),
    ]


def _head(dtype=D64, d=2):
    g = torch.Generator().manual_seed(7)
    return AttentionParams(
        torch.randn(d, d, generator=g, dtype=dtype), torch.randn(3, d, generator=g, dtype=dtype)
    )


def _one_line_error(exc_type, match, fn, *args, **kwargs):
    with pytest.raises(exc_type, match=match) as info:
        fn(*args, **kwargs)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("name", "fn"), _seq_fns())
@pytest.mark.parametrize(("x_dtype", "p_dtype"), [(torch.float32, D64), (D64, torch.float32)])
def test_mixed_float_dtypes_are_a_one_line_error(name, fn, x_dtype, p_dtype):
    X = torch.randn(4, 2, dtype=x_dtype, generator=torch.Generator().manual_seed(392))
    _one_line_error(ValueError, "dtype .* but the parameters have", fn, X, _head(p_dtype))


@pytest.mark.parametrize(("name", "fn"), _seq_fns())
@pytest.mark.parametrize("p_dtype", [torch.float32, D64])
def test_integer_tensors_and_lists_take_the_parameters_dtype(name, fn, p_dtype):
    params = _head(p_dtype)
    ints = [[1, 0], [0, 2], [-1, 1]]
    ref = fn(torch.tensor(ints, dtype=p_dtype), params)
    for X in (torch.tensor(ints), torch.tensor(ints, dtype=torch.int32), ints, np.array(ints)):
        out = fn(X, params)
        assert out.dtype == p_dtype
        assert_close(out, ref, rtol=0, atol=0)  # the same floats, the same computation
    floats = [[0.5, -1.25], [2.0, 0.0]]
    assert_close(
        fn(floats, params), fn(torch.tensor(floats, dtype=p_dtype), params), rtol=0, atol=0
    )
    # a float numpy array keeps its dtype, so it must match the parameters
    other = np.float32 if p_dtype == D64 else np.float64
    _one_line_error(ValueError, "dtype", fn, np.array(floats, dtype=other), params)


@pytest.mark.parametrize(("name", "fn"), _seq_fns())
@pytest.mark.parametrize(
    ("X", "exc", "match"),
    [
        (torch.zeros(0, 2, dtype=D64), ValueError, r"empty \(n = 0"),
        (torch.zeros(3, 0, 2, dtype=D64), ValueError, r"empty \(n = 0"),
        ([], ValueError, r"shape \(\.\.\., n, d\)"),
        (torch.tensor([[0.0, float("nan")]], dtype=D64), ValueError, "NaN"),
        (torch.tensor([[0.0, float("inf")]], dtype=D64), ValueError, "infinite"),
        (torch.zeros(2, dtype=D64), ValueError, r"shape \(\.\.\., n, d\)"),
        (torch.zeros(4, 3, dtype=D64), ValueError, "dimension 3 but the parameters expect d = 2"),
        (torch.zeros(4, 2, dtype=torch.complex128), TypeError, "real"),
        ("tokens", TypeError, "list of real numbers"),
        ([[1.0, 2.0], [3.0]], TypeError, "list of real numbers"),
    ],
)
def test_bad_points_are_one_line_errors(name, fn, X, exc, match):
    _one_line_error(exc, match, fn, X, _head())


@pytest.mark.parametrize(("name", "fn"), _seq_fns())
def test_wrong_params_class_is_a_type_error(name, fn):
    _one_line_error(TypeError, "params must be AttentionParams or MultiHeadParams", fn, [[1.0]], {})


def test_auxiliary_inputs_follow_the_points():
    params = _head()
    X = torch.randn(4, 2, dtype=D64, generator=torch.Generator().manual_seed(442))
    lw32 = torch.log(torch.tensor([0.1, 0.2, 0.3, 0.4]))  # float32: cast to the points' dtype
    lw64 = lw32.to(D64)
    assert_close(
        attention_points(X, params, log_weights=lw32),
        attention_points(X, params, log_weights=lw64),
        rtol=0,
        atol=0,
    )
    assert_close(
        attention_points(X, params, log_weights=lw64.tolist()),
        attention_points(X, params, log_weights=lw64),
        rtol=0,
        atol=0,
    )
    _one_line_error(
        ValueError,
        r"log_weights must have shape \(\.\.\., 4\)",
        attention_points,
        X,
        params,
        log_weights=torch.zeros(3, dtype=D64),
    )
    _one_line_error(
        ValueError,
        "does not broadcast",
        attention_points,
        torch.randn(2, 4, 2, dtype=D64, generator=torch.Generator().manual_seed(469)),
        params,
        log_weights=torch.zeros(3, 4, dtype=D64),
    )
    _one_line_error(
        ValueError,
        r"positions must have shape \(\.\.\., 4\)",
        attention_points,
        X,
        params,
        masked=True,
        positions=[0.5, 1.0],
    )
    _one_line_error(
        ValueError,
        "positions contains NaN",
        attention_points,
        X,
        params,
        masked=True,
        positions=[0.5, float("nan"), 1.0, 1.0],
    )
    _one_line_error(
        TypeError,
        "token_index must hold integers",
        attention_weights,
        X,
        params,
        token_index=torch.zeros(4, dtype=D64),
    )


def test_measure_inputs_must_match_the_parameters():
    params = _head()
    mu32 = DiracMeasure(torch.randn(3, 2, generator=torch.Generator().manual_seed(503)))
    for fn in (attention, attention_map):
        _one_line_error(ValueError, "mu has dtype torch.float32", fn, mu32, params)
        _one_line_error(TypeError, "mu must be a DiracMeasure", fn, torch.zeros(3, 2), params)
        _one_line_error(
            ValueError, "mu has dimension 3", fn, DiracMeasure(torch.zeros(2, 3, dtype=D64)), params
        )
    mu = DiracMeasure(torch.randn(3, 2, dtype=D64, generator=torch.Generator().manual_seed(510)))
    # queries follow the rule of points: lists are promoted, float32 is rejected
    assert_close(
        attention_map(mu, params, [[1, 2]]),
        attention_map(mu, params, torch.tensor([[1.0, 2.0]], dtype=D64)),
        rtol=0,
        atol=0,
    )
    _one_line_error(ValueError, "queries has dtype", attention_map, mu, params, torch.zeros(1, 2))


def test_l2_self_attention_follows_the_same_rule():
    g = torch.Generator().manual_seed(3)
    p = L2AttentionParams(
        torch.randn(2, 4, 2, generator=g, dtype=D64), torch.randn(2, 4, 3, generator=g, dtype=D64)
    )
    ints = [[1, 0, 0, 2], [0, 1, -1, 0]]
    assert_close(
        l2_self_attention(ints, p),
        l2_self_attention(torch.tensor(ints, dtype=D64), p),
        rtol=0,
        atol=0,
    )
    _one_line_error(ValueError, "dtype", l2_self_attention, torch.zeros(2, 4), p)
    _one_line_error(ValueError, "empty", l2_self_attention, torch.zeros(0, 4, dtype=D64), p)
    _one_line_error(ValueError, "expect d = 4", l2_self_attention, torch.zeros(2, 3, dtype=D64), p)
    _one_line_error(TypeError, "params must be L2AttentionParams", l2_self_attention, ints, _head())


def test_empty_parameter_matrices_are_rejected():
    _one_line_error(ValueError, "A is empty", AttentionParams, torch.zeros(0, 0), torch.zeros(2, 0))
    _one_line_error(ValueError, "V is empty", AttentionParams, torch.zeros(2, 2), torch.zeros(0, 2))


def test_linearize_follows_the_input_rule_for_auxiliary_inputs():
    params = _head()
    X = torch.randn(4, 2, dtype=D64, generator=torch.Generator().manual_seed(481))
    lw32 = torch.log(torch.tensor([0.1, 0.2, 0.3, 0.4]))
    assert_close(
        linearize(X, params, log_weights=lw32).P,
        linearize(X, params, log_weights=lw32.to(D64)).P,
        rtol=0,
        atol=0,
    )
    bad = [
        (ValueError, r"log_weights must have shape \(\.\.\., 4\)", dict(log_weights=[0.0] * 3)),
        (ValueError, r"positions must have shape \(\.\.\., 4\)", dict(positions=torch.zeros(5))),
        (TypeError, "token_index must hold integers", dict(token_index=torch.zeros(4))),
    ]
    for exc, match, kw in bad:
        _one_line_error(exc, match, linearize, X, params, **kw)


def test_local_lipschitz_checks_a_measure_against_the_parameters():
    params = _head()
    mu = DiracMeasure(torch.randn(3, 2, generator=torch.Generator().manual_seed(503)))
    _one_line_error(ValueError, "local_lipschitz: mu has dtype", local_lipschitz, mu, params)
    mu3 = DiracMeasure(torch.zeros(3, 3, dtype=D64))
    _one_line_error(
        ValueError,
        "mu has dimension 3 but the parameters expect d = 2",
        local_lipschitz,
        mu3,
        params,
    )
