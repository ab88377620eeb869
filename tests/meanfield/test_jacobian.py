"""Closed-form attention Jacobians against torch.func, finite differences and token loops."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.func import jacrev

from meanfield import AttentionParams, DiracMeasure, MultiHeadParams, attention_points
from meanfield.attention import attention_map
from meanfield.jacobian import (
    block_norm_bounds,
    dense_jacobian,
    jvp,
    linearize,
    self_jacobian_blocks,
    self_jvp,
    self_norm_trace_bound,
    self_vjp,
    vjp,
)
from meanfield.params import RotaryEmbedding

from ..oracles_jacobian import (
    block_formula_loops,
    central_fd_jacobian,
    random_log_weights,
    random_params,
)
from ..tolerances import (
    BRACKET_MARGIN,
    DIFFERS,
    F32_FORWARD,
    F32_VALUE,
    F64_FINITE_DIFF,
    F64_LANCZOS_RITZ,
    F64_LONG_CHAIN,
    F64_REWRITTEN,
    F64_VS_AUTOGRAD,
)

D64 = torch.float64

KINDS = ["single", "concat", "wo"]
KIND_MASK = list(itertools.product(KINDS, [False, True]))


def _fn(params, **kw):
    return lambda Y: attention_points(Y, params, **kw)


def _jacrev(params, X, **kw):
    J = jacrev(_fn(params, **kw))(X)
    n, d = X.shape
    return J.reshape(J.shape[0] * J.shape[1], n * d)


def _check_products(lin, J, H, G, geometry):
    """``jvp`` and ``vjp`` at ``lin`` against the dense Jacobian ``J``; returns both products."""
    B = H.shape[0]
    JH = jvp(lin, H, geometry=geometry)
    JtG = vjp(lin, G, geometry=geometry)
    torch.testing.assert_close(
        JH.reshape(B, -1), (J @ H.reshape(B, -1, 1)).squeeze(-1), **F64_VS_AUTOGRAD
    )
    torch.testing.assert_close(
        JtG.reshape(B, -1), (J.mT @ G.reshape(B, -1, 1)).squeeze(-1), **F64_VS_AUTOGRAD
    )
    return JH, JtG


@pytest.mark.parametrize(
    "kind,masked,weighted", [(k, m, w) for k, m in KIND_MASK for w in (False, True)]
)
def test_dense_matches_jacrev(gen, kind, masked, weighted):
    n, d = 6, 4
    params = random_params(gen, d, kind=kind)
    X = torch.randn(n, d, generator=gen, dtype=D64)
    lw = random_log_weights(gen, (n,)) if weighted else None
    J = dense_jacobian(X, params, log_weights=lw, masked=masked)
    ref = _jacrev(params, X, log_weights=lw, masked=masked)
    assert J.dtype == D64 and J.shape == ref.shape
    torch.testing.assert_close(J, ref, **F64_VS_AUTOGRAD)


@pytest.mark.parametrize("kind,masked", KIND_MASK)
def test_dense_matches_finite_differences(gen, kind, masked):
    n, d = 5, 3
    params = random_params(gen, d, kind=kind)
    X = torch.randn(n, d, generator=gen, dtype=D64)
    lw = random_log_weights(gen, (n,))
    J = dense_jacobian(X, params, log_weights=lw, masked=masked)
    fd = central_fd_jacobian(_fn(params, log_weights=lw, masked=masked), X, h=1e-6)
    torch.testing.assert_close(J, fd, **F64_FINITE_DIFF)


@pytest.mark.parametrize("masked,weighted", list(itertools.product([False, True], [False, True])))
def test_dense_matches_token_loop_formula(gen, masked, weighted):
    """The block formula of docs/theory.md §1 written with loops (independent of the products)."""
    n, d = 5, 3
    head = random_params(gen, d, kind="single")
    X = torch.randn(n, d, generator=gen, dtype=D64)
    lw = random_log_weights(gen, (n,)) if weighted else None
    J = dense_jacobian(X, head, log_weights=lw, masked=masked)
    ref = block_formula_loops(
        X.numpy(),
        head.A.numpy(),
        head.V.numpy(),
        c=head.c.numpy(),
        log_w=None if lw is None else lw.numpy(),
        allowed=(lambda i, j: j <= i) if masked else None,
    )
    torch.testing.assert_close(J, torch.from_numpy(ref), **F64_VS_AUTOGRAD)


def test_query_bias_enters_key_derivative_only(gen):
    """With c: d logit_il/dx_l = A^T x_i + c, d logit_il/dx_i = A x_l (transposition check)."""
    n, d = 4, 3
    head = random_params(gen, d, kind="single")
    X = torch.randn(n, d, generator=gen, dtype=D64)
    J = dense_jacobian(X, head)
    J_wrong = block_formula_loops(X.numpy(), head.A.T.numpy(), head.V.numpy(), c=head.c.numpy())
    assert float((J - torch.from_numpy(J_wrong)).abs().max()) > DIFFERS
    torch.testing.assert_close(J, _jacrev(head, X), **F64_VS_AUTOGRAD)


def test_masked_jacobian_is_block_lower_triangular(gen):
    n, d = 6, 3
    params = random_params(gen, d, kind="wo")
    X = torch.randn(n, d, generator=gen, dtype=D64)
    J = dense_jacobian(X, params, masked=True).reshape(n, params.d_out, n, d)
    for i, j in itertools.product(range(n), range(n)):
        norm = float(J[i, :, j, :].abs().max())
        assert (norm == 0.0) if j > i else (norm > 0.0)


def test_causal_measure_ties_see_each_other(gen):
    n, d = 5, 2
    head = random_params(gen, d, kind="single")
    X = torch.randn(n, d, generator=gen, dtype=D64)
    pos = torch.tensor([0.2, 0.2, 0.6, 0.6, 1.0], dtype=D64)
    J = dense_jacobian(X, head, masked=True, positions=pos).reshape(n, head.d_v, n, d)
    ref = _jacrev(head, X, masked=True, positions=pos).reshape(n, head.d_v, n, d)
    torch.testing.assert_close(J, ref, **F64_VS_AUTOGRAD)
    assert float(J[0, :, 1, :].abs().max()) > 0  # same position: visible
    assert float(J[1, :, 2, :].abs().max()) == 0  # later position: masked


@pytest.mark.parametrize("kind,masked", KIND_MASK)
@pytest.mark.parametrize("geometry", ["euclidean", "wasserstein"])
def test_jvp_vjp_match_dense_and_are_adjoint(gen, kind, masked, geometry):
    B, n, d = 3, 7, 4
    params = random_params(gen, d, kind=kind)
    X = torch.randn(B, n, d, generator=gen, dtype=D64)
    lw = random_log_weights(gen, (B, n))
    J = dense_jacobian(X, params, log_weights=lw, masked=masked, geometry=geometry)
    for chunk in (None, 3):
        lin = linearize(X, params, log_weights=lw, masked=masked, chunk_size=chunk)
        H = torch.randn(B, n, d, generator=gen, dtype=D64)
        G = torch.randn(
            B, n, params.d_out if kind != "single" else params.d_v, generator=gen, dtype=D64
        )
        JH, JtG = _check_products(lin, J, H, G, geometry)
        lhs = (JH * G).sum((-2, -1))
        rhs = (H * JtG).sum((-2, -1))
        assert float(((lhs - rhs).abs() / (lhs.abs() + rhs.abs() + 1)).max()) < F64_LONG_CHAIN


def test_jvp_matches_forward_autograd_tangent(gen):
    """Against torch.func.jvp's tangent output (element [1], not the primal; defect D1 of docs/experiments.md)."""
    n, d = 6, 4
    params = random_params(gen, d, kind="wo")
    X = torch.randn(n, d, generator=gen, dtype=D64)
    H = torch.randn(n, d, generator=gen, dtype=D64)
    primal, tangent = torch.func.jvp(_fn(params), (X,), (H,))
    torch.testing.assert_close(jvp(linearize(X, params), H), tangent, **F64_VS_AUTOGRAD)
    assert float((tangent - primal).abs().max()) > DIFFERS


def test_wasserstein_blocks_are_rescaled(gen):
    n, d = 5, 3
    params = random_params(gen, d, kind="concat")
    X = torch.randn(n, d, generator=gen, dtype=D64)
    lw = random_log_weights(gen, (n,), spread=8.0)
    J = dense_jacobian(X, params, log_weights=lw).reshape(n, params.d_out, n, d)
    Jw = dense_jacobian(X, params, log_weights=lw, geometry="wasserstein")
    ratio = torch.exp(0.5 * (lw[:, None] - lw[None, :]))
    ref = (J * ratio[:, None, :, None]).reshape(Jw.shape)
    torch.testing.assert_close(Jw, ref, **F64_VS_AUTOGRAD)


def test_wasserstein_rejects_zero_masses(gen):
    n, d = 4, 2
    head = random_params(gen, d, kind="single")
    X = torch.randn(n, d, generator=gen, dtype=D64)
    lw = torch.log(torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=D64))
    lin = linearize(X, head, log_weights=lw)
    jvp(lin, torch.ones(n, d, dtype=D64))  # the Euclidean operator is fine
    with pytest.raises(ValueError, match="positive masses"):
        jvp(lin, torch.ones(n, d, dtype=D64), geometry="wasserstein")


@pytest.mark.parametrize("kind,masked", KIND_MASK)
def test_self_blocks(gen, kind, masked):
    n, d = 5, 3
    params = random_params(gen, d, kind=kind)
    X = torch.randn(2, n, d, generator=gen, dtype=D64)
    lw = random_log_weights(gen, (2, n))
    S = self_jacobian_blocks(X, params, log_weights=lw, masked=masked, chunk_size=2)
    # sum_h W_h V_h C_i^h A_h^T from explicit covariances
    heads = params.heads
    allowed = torch.ones(n, n, dtype=torch.bool).tril() if masked else None
    ref = torch.zeros_like(S)
    for h, head in enumerate(heads):
        W = torch.eye(len(heads) * head.d_v, dtype=D64)[:, h * head.d_v : (h + 1) * head.d_v]
        if isinstance(params, MultiHeadParams) and params.W_O is not None:
            W = params.head_projection(h)
        logits = X @ head.A @ X.mT + (X @ head.c).unsqueeze(-2) + lw.unsqueeze(-2)
        if allowed is not None:
            logits = logits.masked_fill(~allowed, -torch.inf)
        P = torch.softmax(logits, -1)
        m = P @ X
        diff = X.unsqueeze(-3) - m.unsqueeze(-2)  # (B, i, l, d)
        C = torch.einsum("bil,bilp,bilq->bipq", P, diff, diff)
        ref = ref + W @ head.V @ C @ head.A.mT
    torch.testing.assert_close(S, ref, **F64_VS_AUTOGRAD)
    lin = linearize(X, params, log_weights=lw, masked=masked)
    U = torch.randn(2, n, d, generator=gen, dtype=D64)
    G = torch.randn(2, n, S.shape[-2], generator=gen, dtype=D64)
    torch.testing.assert_close(
        self_jvp(lin, U), (S @ U.unsqueeze(-1)).squeeze(-1), **F64_VS_AUTOGRAD
    )
    torch.testing.assert_close(
        self_vjp(lin, G), (S.mT @ G.unsqueeze(-1)).squeeze(-1), **F64_VS_AUTOGRAD
    )


def test_self_block_is_derivative_of_gamma_in_the_query(gen):
    """J_mu(x) = V C_x A^T = d Gamma_mu(x)/dx (docs/theory.md §16), at the atoms of a weighted measure."""
    n, d = 4, 3
    head = random_params(gen, d, kind="single", biases=False)
    X = torch.randn(n, d, generator=gen, dtype=D64)
    w = torch.softmax(torch.randn(n, generator=gen, dtype=D64), -1)
    mu = DiracMeasure(X, w)
    S = self_jacobian_blocks(X, head, log_weights=mu.log_weights)
    for i in range(n):
        Ji = jacrev(lambda q: attention_map(mu, head, q.unsqueeze(0))[0])(X[i])
        torch.testing.assert_close(S[i], Ji, **F64_VS_AUTOGRAD)


def test_sanity_check_d1(gen):
    """d = 1, V = 1, A = a: at a token x_i = 0, df_i/dx_i = 1/N + a Var_unif(x) (docs/theory.md §1)."""
    a = 0.7
    X = torch.tensor([[0.0], [1.0], [-2.0], [0.5]], dtype=D64)
    head = AttentionParams(torch.tensor([[a]], dtype=D64), torch.tensor([[1.0]], dtype=D64))
    J = dense_jacobian(X, head)
    expected = 1 / 4 + a * float(X.var(unbiased=False))
    assert abs(float(J[0, 0]) - expected) < F64_REWRITTEN


def _rope_params(gen, d=6, k=4, H=2):
    W_Q, W_K, W_V = (torch.randn(H * k, d, generator=gen, dtype=D64) for _ in range(3))
    W_O = torch.randn(5, H * k, generator=gen, dtype=D64)
    base = MultiHeadParams.from_qkv(W_Q, W_K, W_V, W_O, n_heads=H)
    rope = RotaryEmbedding(1.0 / (100.0 ** (torch.arange(0, k, 2, dtype=D64) / k)))
    heads = tuple(
        AttentionParams(h.A, h.V, Q=h.Q, K=h.K, rope=rope) if i == 0 else h
        for i, h in enumerate(base.heads)
    )
    return MultiHeadParams(heads, W_O=W_O)


@pytest.mark.parametrize("masked", [False, True])
def test_rotary_heads_fall_back_to_autograd(gen, masked):
    n, d = 5, 6
    params = _rope_params(gen, d=d)
    X = torch.randn(2, n, d, generator=gen, dtype=D64)
    lin = linearize(X, params, masked=masked)
    assert lin.rope_heads == (0,) and lin.analytic_heads == (1,)
    J = dense_jacobian(X, params, masked=masked)
    for b in range(2):
        torch.testing.assert_close(J[b], _jacrev(params, X[b], masked=masked), **F64_VS_AUTOGRAD)
    H = torch.randn(2, n, d, generator=gen, dtype=D64)
    G = torch.randn(2, n, params.d_out, generator=gen, dtype=D64)
    torch.testing.assert_close(
        jvp(lin, H).reshape(2, -1), (J @ H.reshape(2, -1, 1)).squeeze(-1), **F64_VS_AUTOGRAD
    )
    torch.testing.assert_close(
        vjp(lin, G).reshape(2, -1), (J.mT @ G.reshape(2, -1, 1)).squeeze(-1), **F64_VS_AUTOGRAD
    )
    with pytest.raises(NotImplementedError):
        block_norm_bounds(lin)


def _rotary_layer(gen, d=6, k=4, H=3, shared=True):
    """Three heads, two of them rotary (with their own frequencies and scaling unless
    ``shared``), and an output projection."""
    W_Q, W_K, W_V = (torch.randn(H * k, d, generator=gen, dtype=D64) for _ in range(3))
    W_O = torch.randn(5, H * k, generator=gen, dtype=D64)
    base = MultiHeadParams.from_qkv(W_Q, W_K, W_V, W_O, n_heads=H)
    freqs = 1.0 / (100.0 ** (torch.arange(0, k, 2, dtype=D64) / k))
    ropes = [RotaryEmbedding(freqs), RotaryEmbedding(3 * freqs, 0.8)]
    heads = []
    for i, h in enumerate(base.heads):
        if i < 2:
            heads.append(
                AttentionParams(h.A, h.V, Q=h.Q, K=h.K, rope=ropes[i if not shared else 0])
            )
        else:
            heads.append(h)
    return MultiHeadParams(tuple(heads), W_O=W_O)


@pytest.mark.parametrize(
    "case", ["plain", "masked", "weighted", "positions", "token_index", "own_freqs", "chunks"]
)
def test_rotary_products_in_closed_form_match_autograd(gen, case):
    """The closed-form products of rotary heads (docs/derivations/jacobian_products.md §3b)
    against autograd through the attention map (the same linearisation without its rotary rows)."""
    from dataclasses import replace

    B, n, d = 2, 7, 6
    params = _rotary_layer(gen, d=d, shared=case != "own_freqs")
    X = torch.randn(B, n, d, generator=gen, dtype=D64)
    kw: dict = {"masked": case in ("masked", "positions", "chunks")}
    geometry = "euclidean"
    if case == "weighted":
        kw["log_weights"] = random_log_weights(gen, (B, n), spread=3.0)
        geometry = "wasserstein"
    if case == "positions":
        kw["positions"] = torch.rand(B, n, generator=gen, dtype=D64)
    if case == "token_index":
        kw["token_index"] = torch.stack([torch.randperm(n, generator=gen) + 3 for _ in range(B)])
    if case == "chunks":
        kw["chunk_size"] = 3
    lin = linearize(X, params, **kw)
    assert lin.rope_rows is not None and lin.rope_rows.heads == (0, 1)
    auto = replace(lin, rope_rows=None)  # the autograd path
    H = torch.randn(B, n, d, generator=gen, dtype=D64)
    G = torch.randn(B, n, params.d_out, generator=gen, dtype=D64)
    torch.testing.assert_close(
        jvp(lin, H, geometry=geometry), jvp(auto, H, geometry=geometry), **F64_VS_AUTOGRAD
    )
    torch.testing.assert_close(
        vjp(lin, G, geometry=geometry), vjp(auto, G, geometry=geometry), **F64_VS_AUTOGRAD
    )
    # adjoint identity <G, J H> = <J^T G, H> on the closed form alone
    lhs = (G * jvp(lin, H, geometry=geometry)).sum()
    rhs = (vjp(lin, G, geometry=geometry) * H).sum()
    assert abs(float(lhs - rhs)) <= F64_LONG_CHAIN * float(lhs.abs() + rhs.abs())


def test_magnitude_operator_covers_rotary_heads(gen):
    """The rounding model's magnitude operator (docs/rounding.md §3.1) keeps the rotary heads, with
    every rotation replaced by its entrywise bound: on a mixed layer its products are nonnegative,
    at least those of the analytic heads alone, and dominate the products themselves
    (|J h| <= (1 + eta) M|h| entrywise, the rotary heads included), in both geometries' forms."""
    from dataclasses import replace

    from meanfield._rounding import error_model, magnitude_linearization

    params = _rotary_layer(gen)
    X = 3 * torch.randn(7, 6, generator=gen, dtype=D64)
    lin = linearize(X, params, masked=True, token_index=torch.arange(7) * 40)
    assert lin.rope_heads and lin.analytic_heads and lin.rope_rows is not None
    model = error_model(lin)
    mixed = magnitude_linearization(lin, model)
    alone = magnitude_linearization(replace(lin, rope_heads=(), rope_rows=None), model)
    eta = float(model.eta)
    for _ in range(4):
        H = torch.randn(7, 6, generator=gen, dtype=D64)
        G = torch.randn(7, 5, generator=gen, dtype=D64)
        out, out_t = jvp(mixed, H.abs()), vjp(mixed, G.abs())
        assert bool((out >= jvp(alone, H.abs())).all()) and bool((out_t >= 0).all())
        assert bool((jvp(lin, H).abs() <= (1 + eta) * out).all())
        assert bool((vjp(lin, G).abs() <= (1 + eta) * out_t).all())
    # the rotary rows add something: the operator of the analytic heads alone does not dominate
    ones = torch.ones(7, 6, dtype=D64)
    assert bool((jvp(mixed, ones) > jvp(alone, ones)).any())


def test_rotary_products_in_float32(gen):
    params = _rotary_layer(gen)
    X = torch.randn(5, 6, generator=gen, dtype=D64)
    lin32 = linearize(X.float(), params.to(torch.float32), masked=True)
    lin64 = linearize(X.float().double(), params.to(torch.float32).to(D64), masked=True)
    H = torch.randn(5, 6, generator=gen, dtype=D64)
    out32 = jvp(lin32, H.float())
    assert out32.dtype == torch.float32
    torch.testing.assert_close(out32.double(), jvp(lin64, H), rtol=F32_VALUE, atol=F32_FORWARD)


def test_dense_size_guard(gen):
    head = random_params(gen, 8, kind="single")
    X = torch.randn(20, 8, generator=gen, dtype=D64)
    with pytest.raises(ValueError, match="max_size"):
        dense_jacobian(X, head, max_size=100)
    assert dense_jacobian(X, head, max_size=100, force=True).shape == (20 * 3, 20 * 8)


def test_products_finite_at_radius_100(gen):
    n, d = 6, 4
    params = random_params(gen, d, kind="wo")
    X = torch.randn(n, d, generator=gen, dtype=D64)
    X = 100 * X / X.norm(dim=-1, keepdim=True)
    lin = linearize(X, params)
    out = vjp(lin, jvp(lin, torch.randn(n, d, generator=gen, dtype=D64)))
    assert bool(torch.isfinite(out).all())


@pytest.mark.parametrize("kind,masked", KIND_MASK)
@pytest.mark.parametrize("geometry", ["euclidean", "wasserstein"])
def test_block_norm_bounds_dominate_blocks(gen, kind, masked, geometry):
    B, n, d = 8, 5, 3
    params = random_params(gen, d, kind=kind, scale=2.0)
    X = 2 * torch.randn(B, n, d, generator=gen, dtype=D64)
    lw = random_log_weights(gen, (B, n), spread=4.0)
    lin = linearize(X, params, log_weights=lw, masked=masked)
    N = block_norm_bounds(lin, geometry=geometry)
    J = dense_jacobian(X, params, log_weights=lw, masked=masked, geometry=geometry)
    blocks = J.reshape(B, n, -1, n, d).permute(0, 1, 3, 2, 4)
    exact = torch.linalg.matrix_norm(blocks, ord=2)
    assert bool((N >= exact * (1 - BRACKET_MARGIN)).all())
    S = self_jacobian_blocks(X, params, log_weights=lw, masked=masked)
    exact_self = torch.linalg.matrix_norm(S, 2)
    assert bool((self_norm_trace_bound(lin) >= exact_self * (1 - BRACKET_MARGIN)).all())


@pytest.mark.parametrize("w_scale", [0.1, 10.0])
def test_block_norm_bounds_with_output_projection_scale(gen, w_scale):
    """||W^O|| far from 1 exposes a missing or misplaced projection norm in the head combination."""
    B, n, d = 8, 5, 3
    base = random_params(gen, d, kind="wo", scale=2.0)
    params = MultiHeadParams(base.heads, W_O=w_scale * base.W_O)
    X = 2 * torch.randn(B, n, d, generator=gen, dtype=D64)
    lin = linearize(X, params)
    N = block_norm_bounds(lin)
    J = dense_jacobian(X, params)
    exact = torch.linalg.matrix_norm(J.reshape(B, n, -1, n, d).permute(0, 1, 3, 2, 4), ord=2)
    assert bool((N >= exact * (1 - BRACKET_MARGIN)).all())
    # tight enough to mean something: within a factor 20 of the exact block norms on average
    assert float(N.sum() / exact.sum()) < 20


def test_factored_heads_with_query_bias(gen):
    """Heads built by from_qkv carry A = Q^T K (products through the factors) and c from b_Q."""
    d, k, H, n = 6, 2, 3, 5
    W_Q, W_K, W_V = (torch.randn(H * k, d, generator=gen, dtype=D64) for _ in range(3))
    W_O = torch.randn(4, H * k, generator=gen, dtype=D64)
    b = {name: torch.randn(H * k, generator=gen, dtype=D64) for name in ("b_Q", "b_K", "b_V")}
    params = MultiHeadParams.from_qkv(W_Q, W_K, W_V, W_O, n_heads=H, **b)
    X = torch.randn(2, n, d, generator=gen, dtype=D64)
    lin = linearize(X, params, masked=True)
    assert lin.QK is not None
    J = dense_jacobian(X, params, masked=True)
    for s in range(2):
        torch.testing.assert_close(J[s], _jacrev(params, X[s], masked=True), **F64_VS_AUTOGRAD)
    H_ = torch.randn(2, n, d, generator=gen, dtype=D64)
    G = torch.randn(2, n, 4, generator=gen, dtype=D64)
    torch.testing.assert_close(
        jvp(lin, H_).reshape(2, -1), (J @ H_.reshape(2, -1, 1)).squeeze(-1), **F64_VS_AUTOGRAD
    )
    torch.testing.assert_close(
        vjp(lin, G).reshape(2, -1), (J.mT @ G.reshape(2, -1, 1)).squeeze(-1), **F64_VS_AUTOGRAD
    )
    S = self_jacobian_blocks(X, params, masked=True)
    U = torch.randn(2, n, d, generator=gen, dtype=D64)
    torch.testing.assert_close(
        self_jvp(lin, U), (S @ U.unsqueeze(-1)).squeeze(-1), **F64_VS_AUTOGRAD
    )
    N = block_norm_bounds(lin)
    exact = torch.linalg.matrix_norm(J.reshape(2, n, 4, n, d).permute(0, 1, 3, 2, 4), ord=2)
    assert bool((N >= exact * (1 - BRACKET_MARGIN)).all())


def test_float32_linearization_bounds_in_float64(gen):
    params = random_params(gen, 3, kind="wo")
    p32 = MultiHeadParams(
        tuple(AttentionParams(h.A.float(), h.V.float(), c=h.c.float()) for h in params.heads),
        W_O=params.W_O.float(),
    )
    X = torch.randn(4, 5, 3, generator=gen, dtype=D64).float()
    lin = linearize(X, p32)
    N = block_norm_bounds(lin)
    assert N.dtype == D64
    J = dense_jacobian(X.double(), p32.to(D64)).reshape(4, 5, -1, 5, 3).permute(0, 1, 3, 2, 4)
    # the float32 P differs from the float64 one by ~1e-7 relative; bounds carry no such margin
    assert bool((N >= torch.linalg.matrix_norm(J, ord=2) * (1 - F32_FORWARD)).all())


# ------------------------------------------------------------------ head-space products (issue 3)
def _factored_params(gen, d=7, k=2, H=3, d_out=5, with_wo=True, scale=0.6):
    """A layer with factored heads A_h = scale Q_h^T K_h and query-bias terms c_h (k < d)."""
    W_Q, W_K, W_V = (torch.randn(H * k, d, generator=gen, dtype=D64) for _ in range(3))
    W_O = torch.randn(d_out, H * k, generator=gen, dtype=D64) if with_wo else None
    b_Q = torch.randn(H * k, generator=gen, dtype=D64)
    return MultiHeadParams.from_qkv(W_Q, W_K, W_V, W_O, n_heads=H, b_Q=b_Q, scale=scale)


def _unfactored(params):
    """The same layer with the factors dropped: every product then runs on A_h in R^d."""
    heads = tuple(AttentionParams(h.A, h.V, c=h.c, b=h.b) for h in params.heads)
    return MultiHeadParams(heads, W_O=params.W_O)


@pytest.mark.parametrize("with_wo,masked", list(itertools.product([True, False], [False, True])))
@pytest.mark.parametrize("geometry", ["euclidean", "wasserstein"])
def test_head_space_products_match_dense_and_unfactored(gen, with_wo, masked, geometry):
    """Factored heads (products in R^k) against the dense closed form and the d-space path."""
    B, n, d = 2, 6, 7
    params = _factored_params(gen, d=d, with_wo=with_wo)
    plain = _unfactored(params)
    X = torch.randn(B, n, d, generator=gen, dtype=D64)
    lw = random_log_weights(gen, (B, n))
    J = dense_jacobian(X, params, log_weights=lw, masked=masked, geometry=geometry)
    d_out = J.shape[-2] // n
    S = self_jacobian_blocks(X, params, log_weights=lw, masked=masked)
    H = torch.randn(B, n, d, generator=gen, dtype=D64)
    G = torch.randn(B, n, d_out, generator=gen, dtype=D64)
    U = torch.randn(B, n, d, generator=gen, dtype=D64)
    for chunk in (None, 4):
        lin = linearize(X, params, log_weights=lw, masked=masked, chunk_size=chunk)
        ref = linearize(X, plain, log_weights=lw, masked=masked, chunk_size=chunk)
        assert lin.QKV is not None and lin.Qx.shape[-1] == 2  # head width k, not d
        assert ref.QKV is None and ref.Qx.shape[-1] == d
        JH, JtG = _check_products(lin, J, H, G, geometry)
        torch.testing.assert_close(JH, jvp(ref, H, geometry=geometry), **F64_VS_AUTOGRAD)
        torch.testing.assert_close(JtG, vjp(ref, G, geometry=geometry), **F64_VS_AUTOGRAD)
        SU = self_jvp(lin, U)
        StG = self_vjp(lin, G)
        torch.testing.assert_close(SU, (S @ U.unsqueeze(-1)).squeeze(-1), **F64_VS_AUTOGRAD)
        torch.testing.assert_close(StG, (S.mT @ G.unsqueeze(-1)).squeeze(-1), **F64_VS_AUTOGRAD)
        torch.testing.assert_close(SU, self_jvp(ref, U), **F64_VS_AUTOGRAD)
        torch.testing.assert_close(StG, self_vjp(ref, G), **F64_VS_AUTOGRAD)


def test_head_space_jvp_matches_forward_autograd_large_offset(gen):
    """Hidden states with a large common component: the centred head-space features keep the
    products accurate (against torch.func.jvp / vjp of the forward pass)."""
    n, d = 8, 7
    params = _factored_params(gen, d=d)
    X = torch.randn(n, d, generator=gen, dtype=D64) + 30.0 * torch.randn(
        d, generator=gen, dtype=D64
    )
    X = X / 12.0  # keep the logits O(1) while the offset dominates the token spread
    H = torch.randn(n, d, generator=gen, dtype=D64)
    G = torch.randn(n, params.d_out, generator=gen, dtype=D64)
    lin = linearize(X, params, masked=True)
    _, tangent = torch.func.jvp(_fn(params, masked=True), (X,), (H,))
    _, pullback = torch.func.vjp(_fn(params, masked=True), X)
    torch.testing.assert_close(jvp(lin, H), tangent, **F64_VS_AUTOGRAD)
    torch.testing.assert_close(vjp(lin, G), pullback(G)[0], **F64_VS_AUTOGRAD)


def test_mixed_factored_and_plain_heads_fall_back(gen):
    """One head without factors (or of another width) sends every head down the d-space path."""
    n, d = 5, 7
    fact = _factored_params(gen, d=d, H=2)
    Q3, K3 = (torch.randn(3, d, generator=gen, dtype=D64) / 2 for _ in range(2))
    other = AttentionParams(None, fact.heads[1].V, Q=Q3, K=K3)  # factored, width 3 != 2
    plain = AttentionParams(fact.heads[1].A, fact.heads[1].V)  # no factors, no c
    X = torch.randn(n, d, generator=gen, dtype=D64)
    lw = random_log_weights(gen, (n,))
    for heads in ((fact.heads[0], plain), (fact.heads[0], other)):
        W_O = torch.randn(4, 2 * heads[0].d_v, generator=gen, dtype=D64)
        params = MultiHeadParams(heads, W_O=W_O)
        lin = linearize(X, params, log_weights=lw, masked=True)
        assert lin.QK is None and lin.QKV is None
        J = dense_jacobian(X, params, log_weights=lw, masked=True)
        torch.testing.assert_close(
            J, _jacrev(params, X, log_weights=lw, masked=True), **F64_VS_AUTOGRAD
        )
        H = torch.randn(n, d, generator=gen, dtype=D64)
        G = torch.randn(n, 4, generator=gen, dtype=D64)
        torch.testing.assert_close(jvp(lin, H).reshape(-1), J @ H.reshape(-1), **F64_VS_AUTOGRAD)
        torch.testing.assert_close(vjp(lin, G).reshape(-1), J.mT @ G.reshape(-1), **F64_VS_AUTOGRAD)


@pytest.mark.parametrize("factored", [False, True])
def test_chunked_products_with_position_ties(gen, factored):
    """Tied positions let query 0 see key 1: chunked products must not truncate keys causally."""
    n, d = 6, 7
    params = _factored_params(gen, d=d) if factored else random_params(gen, d, kind="wo")
    X = torch.randn(n, d, generator=gen, dtype=D64)
    pos = torch.tensor([0.1, 0.1, 0.3, 0.5, 0.5, 0.9], dtype=D64)
    J = dense_jacobian(X, params, masked=True, positions=pos)
    lin = linearize(X, params, masked=True, positions=pos, chunk_size=1)
    H = torch.randn(n, d, generator=gen, dtype=D64)
    G = torch.randn(n, J.shape[0] // n, generator=gen, dtype=D64)
    torch.testing.assert_close(jvp(lin, H).reshape(-1), J @ H.reshape(-1), **F64_VS_AUTOGRAD)
    torch.testing.assert_close(vjp(lin, G).reshape(-1), J.mT @ G.reshape(-1), **F64_VS_AUTOGRAD)
    S = self_jacobian_blocks(X, params, masked=True, positions=pos)
    U = torch.randn(n, d, generator=gen, dtype=D64)
    torch.testing.assert_close(
        self_jvp(lin, U), (S @ U.unsqueeze(-1)).squeeze(-1), **F64_VS_AUTOGRAD
    )
    torch.testing.assert_close(
        self_vjp(lin, G), (S.mT @ G.unsqueeze(-1)).squeeze(-1), **F64_VS_AUTOGRAD
    )


# ------------------------------------------------------------- lazy linearisation, causal blocks
@pytest.mark.parametrize("factored", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_lazy_means_and_rows_match_their_definitions(gen, factored, masked):
    """m_i = sum_l P_il x_l and b_i = A^T x_i + c, formed on first use, and the head-space means
    K(m_i - x_bar), V(m_i - x_bar) that linearize forms from P K(X - x_bar), P V(X - x_bar)."""
    B, n, d = 2, 9, 7
    params = _factored_params(gen, d=d, with_wo=True)
    if not factored:
        params = _unfactored(params)
    X = torch.randn(B, n, d, generator=gen, dtype=D64) + 3.0
    lin = linearize(X, params, masked=masked)
    assert lin._m is None and lin._B is None  # nothing formed yet
    assert (lin._A is None) == factored  # factored heads: A_h only on demand
    A = torch.stack([h.A for h in params.heads])
    V = torch.stack([h.V for h in params.heads])
    c = torch.stack([h.c for h in params.heads])
    m = torch.einsum("bhij,bjd->bhid", lin.P, X)  # naive, one token at a time in spirit
    for i in range(n):  # loop oracle for the means
        ref_i = (lin.P[:, :, i, :, None] * X[:, None]).sum(-2)
        torch.testing.assert_close(m[:, :, i], ref_i, **F64_VS_AUTOGRAD)
    torch.testing.assert_close(lin.m, m, **F64_VS_AUTOGRAD)
    torch.testing.assert_close(
        lin.B, torch.einsum("bnd,hde->bhne", X, A) + c[:, None], **F64_VS_AUTOGRAD
    )
    Mc = m - X.mean(-2, keepdim=True)[:, None]
    torch.testing.assert_close(lin.VMc, torch.einsum("bhnd,hvd->bhnv", Mc, V), **F64_VS_AUTOGRAD)
    if factored:
        K = torch.stack([h.K for h in params.heads])
        torch.testing.assert_close(
            lin.KMc, torch.einsum("bhnd,hkd->bhnk", Mc, K), **F64_VS_AUTOGRAD
        )
    else:
        torch.testing.assert_close(
            lin.KMc, torch.einsum("bhnd,hed->bhne", Mc, A), **F64_VS_AUTOGRAD
        )
    torch.testing.assert_close(lin.A, torch.stack([h.A for h in params.heads]), rtol=0, atol=0)
    assert lin.m is lin.m and lin.B is lin.B  # cached


@pytest.mark.parametrize("factored", [False, True])
@pytest.mark.parametrize("masked", [True, False])
def test_default_blocks_match_dense_and_one_block(gen, factored, masked):
    """Products default to query blocks of 64 (three blocks at n = 150, the last one short;
    causal blocks stop at their last key): against the dense closed form (itself checked
    against jacrev above) and one block."""
    n, d = 150, 4
    params = _factored_params(gen, d=d, with_wo=True)
    if not factored:
        params = _unfactored(params)
    X = torch.randn(n, d, generator=gen, dtype=D64)
    lin = linearize(X, params, masked=masked)
    one = linearize(X, params, masked=masked, chunk_size=n)
    from meanfield.jacobian.products import key_blocks

    assert [(sl.start, sl.stop, ks.stop) for sl, ks in key_blocks(lin)] == [
        (0, 64, 64 if masked else n),
        (64, 128, 128 if masked else n),
        (128, 150, 150),
    ]
    assert len(list(key_blocks(one))) == 1
    J = dense_jacobian(X, params, masked=masked)
    H = torch.randn(n, d, generator=gen, dtype=D64)
    G = torch.randn(n, J.shape[0] // n, generator=gen, dtype=D64)
    JH, JtG = jvp(lin, H), vjp(lin, G)
    U = torch.randn(n, d, generator=gen, dtype=D64)
    torch.testing.assert_close(self_jvp(lin, U), self_jvp(one, U), **F64_VS_AUTOGRAD)
    torch.testing.assert_close(self_vjp(lin, G), self_vjp(one, G), **F64_VS_AUTOGRAD)
    torch.testing.assert_close(JH.reshape(-1), J @ H.reshape(-1), **F64_VS_AUTOGRAD)
    torch.testing.assert_close(JtG.reshape(-1), J.mT @ G.reshape(-1), **F64_VS_AUTOGRAD)
    torch.testing.assert_close(JH, jvp(one, H), **F64_VS_AUTOGRAD)
    torch.testing.assert_close(JtG, vjp(one, G), **F64_VS_AUTOGRAD)
    torch.testing.assert_close(lin.m, one.m, **F64_VS_AUTOGRAD)


# ------------------------------------------------------------------ warm start of the estimate
def test_warm_start_of_local_lipschitz(gen):
    """``start`` replaces the random start: from the exact top vector the run stops at once with
    the dense value; from the previous prefix's vector it needs fewer products than cold; the
    bracket is unchanged and no probabilistic bound is formed from a chosen start."""
    from meanfield.lipschitz import local_lipschitz

    n, d = 24, 6
    params = _factored_params(gen, d=d, with_wo=True)
    X = torch.randn(n, d, generator=gen, dtype=D64)
    dense = local_lipschitz(X, params, masked=True, method="dense")
    kw = dict(masked=True, method="lanczos", tol=1e-8)
    cold = local_lipschitz(X, params, **kw)
    hot = local_lipschitz(X, params, start=dense.vector, **kw)
    assert bool(hot.converged) and int(hot.n_matvec) <= 4 < int(cold.n_matvec)
    for est in (cold, hot):
        assert abs(float(est.value) - float(dense.value)) <= F64_LANCZOS_RITZ * float(dense.value)
        assert float(est.lower) <= float(dense.value) <= float(est.upper)
    assert float(hot.upper_prob) == float(hot.upper)  # deterministic bound only
    assert float(cold.upper_prob) < float(cold.upper)  # Kuczynski-Wozniakowski from the seed
    # prefix sweep: the previous length's vector, zero-padded
    short = local_lipschitz(X[:20], params, **kw)
    pad = torch.zeros_like(X)
    pad[:20] = short.vector
    warm = local_lipschitz(X, params, start=pad, **kw)
    assert int(warm.n_matvec) < int(cold.n_matvec)
    assert abs(float(warm.value) - float(dense.value)) <= F64_LANCZOS_RITZ * float(dense.value)
    with pytest.raises(ValueError, match="shape"):
        local_lipschitz(X, params, start=pad[:20], **kw)
    with pytest.raises(ValueError, match="prob_rtol"):
        local_lipschitz(X, params, start=pad, prob_rtol=0.05, **kw)
