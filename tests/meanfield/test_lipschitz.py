"""Local Lipschitz estimates against exact dense SVDs; certified brackets; invariances."""

from __future__ import annotations

import itertools

import pytest
import torch

from meanfield import DiracMeasure, MultiHeadParams, attention_points
from meanfield.jacobian import dense_jacobian, self_jacobian_blocks
from meanfield.lipschitz import (
    LipschitzEstimate,
    local_lipschitz,
    local_lipschitz_fn,
    released_metric,
)
from meanfield.params import AttentionParams, RotaryEmbedding

from ..certified_records import Guarantees, compare_records, estimate_record
from ..oracles_jacobian import random_log_weights, random_params
from ..tolerances import (
    BRACKET_MARGIN,
    BRACKET_ULPS,
    CERTIFIED_INFLATION,
    DIFFERS,
    F32_FORWARD,
    F32_VALUE,
    F64_LANCZOS,
    F64_LANCZOS_COARSE,
    F64_REDUCTION,
    F64_REWRITTEN,
    GRAM_CERT,
)

D64 = torch.float64

KINDS = ["single", "concat", "wo"]


def _exact(X, params, *, lw=None, masked=False, positions=None, geometry="euclidean"):
    """Exact constant from dense matrices and SVDs (float64)."""
    op = "euclidean" if geometry == "euclidean" else "wasserstein"
    J = dense_jacobian(X, params, log_weights=lw, masked=masked, positions=positions, geometry=op)
    val = torch.linalg.matrix_norm(J, 2)
    if geometry == "split":
        S = self_jacobian_blocks(X, params, log_weights=lw, masked=masked, positions=positions)
        val = torch.maximum(val, torch.linalg.matrix_norm(S, 2).amax(-1))
    return val


def _exact_mu(mu: DiracMeasure, params, masked: bool, geometry: str) -> torch.Tensor:
    """:func:`_exact` at a measure."""
    return _exact(
        mu.points,
        params,
        lw=mu.log_weights,
        masked=masked,
        positions=mu.positions,
        geometry=geometry,
    )


def _check_bracket(est: LipschitzEstimate, exact: torch.Tensor) -> None:
    assert bool((est.lower <= exact * (1 + BRACKET_ULPS)).all()), (est.lower, exact)
    assert bool((est.upper >= exact * (1 - BRACKET_ULPS)).all()), (est.upper, exact)


def _measure(gen, B, n, d, *, causal=False, spread=3.0):
    X = torch.randn(B, n, d, generator=gen, dtype=D64)
    w = torch.exp(random_log_weights(gen, (B, n), spread=spread))
    pos = None
    if causal:
        pos = torch.sort(torch.rand(B, n, generator=gen, dtype=D64), dim=-1).values
    return DiracMeasure(X, w, pos, normalize=True)


CASES = list(itertools.product(KINDS, ["euclidean", "wasserstein", "split"], [False, True]))


@pytest.mark.parametrize("kind,geometry,masked", CASES)
def test_lanczos_matches_exact_svd(gen, kind, geometry, masked):
    B, n, d = 3, 9, 4
    params = random_params(gen, d, kind=kind, scale=1.5)
    mu = _measure(gen, B, n, d, causal=masked)
    exact = _exact_mu(mu, params, masked, geometry)
    est = local_lipschitz(mu, params, geometry=geometry, method="lanczos")
    assert est.value.shape == (B,) and est.value.dtype == D64
    assert est.method == "lanczos" and est.geometry == geometry and est.upper_method == "block"
    assert bool(est.converged.all())
    torch.testing.assert_close(est.value, exact, rtol=F64_LANCZOS_COARSE, atol=0)
    _check_bracket(est, exact)
    dense = local_lipschitz(mu, params, geometry=geometry, method="dense")
    torch.testing.assert_close(dense.value, exact, rtol=F64_REDUCTION, atol=0)
    _check_bracket(dense, exact)


def test_power_and_lanczos_agree(gen):
    params = random_params(gen, 4, kind="wo")
    X = torch.randn(4, 8, 4, generator=gen, dtype=D64)
    lz = local_lipschitz(X, params, method="lanczos", tol=1e-10)
    pw = local_lipschitz(X, params, method="power", tol=1e-9, max_iter=20000)
    assert bool(pw.converged.all())
    torch.testing.assert_close(pw.value, lz.value, rtol=F64_LANCZOS_COARSE, atol=0)
    assert bool((pw.lower <= lz.value * (1 + BRACKET_ULPS)).all())


def _bracket_ratios(gen, method: str, n_instances: int = 50):
    ratios = []
    for k in range(n_instances // 5):
        kind = KINDS[k % 3]
        masked = k % 2 == 1
        geometry = ["euclidean", "wasserstein", "split"][k % 3]
        d = 2 + k % 3
        params = random_params(gen, d, kind=kind, scale=1.0 + k % 4)
        mu = _measure(gen, 5, 6, d, causal=masked, spread=1.0 + k % 5)
        exact = _exact_mu(mu, params, masked, geometry)
        est = local_lipschitz(mu, params, geometry=geometry, method=method)
        _check_bracket(est, exact)
        ratios.append(est.upper / est.lower)
    return torch.cat(ratios)


def test_bracket_dense_gram_50_instances(gen):
    """Dense method, Gram/Cholesky certificate: measured median upper/lower = 1 + 4e-13."""
    ratios = _bracket_ratios(gen, "dense")
    assert ratios.numel() == 50
    assert float(ratios.max()) < 1 + GRAM_CERT


def test_bracket_block_norm_50_instances(gen):
    """Lanczos + block-norm/Collatz–Wielandt certificate: measured median upper/lower 1.28.

    (n = 6, d in 2..4, ||A|| up to ~4, masses spanning up to 5 e-folds; min 1.003, max 2.43.)
    """
    ratios = _bracket_ratios(gen, "lanczos")
    assert ratios.numel() == 50
    assert float(ratios.median()) < 2.0


def test_local_lipschitz_fn_on_attention_points_equals_local_lipschitz(gen):
    params = random_params(gen, 4, kind="wo")
    X = torch.randn(3, 7, 4, generator=gen, dtype=D64)
    for masked in (False, True):

        def fn(Y, masked=masked):
            return attention_points(Y, params, masked=masked)

        ref = local_lipschitz(X, params, masked=masked, method="dense")
        for method in ("dense", "lanczos"):
            est = local_lipschitz_fn(fn, X, batch_dims=1, method=method)
            torch.testing.assert_close(est.value, ref.value, rtol=F64_LANCZOS_COARSE, atol=0)
            _check_bracket(est, ref.value)
        free = local_lipschitz_fn(fn, X, batch_dims=1, method="lanczos")
        assert bool(torch.isinf(free.upper).all())
        # tol=None (local_lipschitz's default spelling) is the residual rule at 1e-6, the same run
        default = local_lipschitz_fn(fn, X, batch_dims=1, method="lanczos", tol=None)
        explicit = local_lipschitz_fn(fn, X, batch_dims=1, method="lanczos", tol=1e-6)
        assert torch.equal(default.value, explicit.value)
        assert torch.equal(default.n_matvec, explicit.n_matvec)


def test_released_metric_is_sqrt_norm_of_Jt_f_not_the_spectral_norm(gen):
    params = random_params(gen, 3, kind="wo")
    X = torch.randn(6, 3, generator=gen, dtype=D64) + 2.0  # shared mean direction

    def fn(Y):
        return attention_points(Y, params)

    J = dense_jacobian(X, params)
    f = fn(X).reshape(-1)
    expected = (J.mT @ f).norm().sqrt()
    got = released_metric(fn, X)
    torch.testing.assert_close(got, expected, rtol=F64_REDUCTION, atol=0)
    true = torch.linalg.matrix_norm(J, 2)
    assert abs(float(got) - float(true)) > DIFFERS * float(true)
    batched = released_metric(fn, torch.stack([X, 2 * X]), batch_dims=1)
    assert batched.shape == (2,)
    torch.testing.assert_close(batched[0], expected, rtol=F64_REDUCTION, atol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_wasserstein_with_uniform_weights_equals_euclidean(gen, kind):
    params = random_params(gen, 3, kind=kind)
    X = torch.randn(2, 7, 3, generator=gen, dtype=D64)
    mu = DiracMeasure(X)
    e = local_lipschitz(X, params, method="lanczos")
    w = local_lipschitz(mu, params, geometry="wasserstein", method="lanczos")
    torch.testing.assert_close(w.value, e.value, rtol=F64_LANCZOS_COARSE, atol=0)
    w_explicit = DiracMeasure(X, torch.full((2, 7), 1 / 7, dtype=D64))
    wd = local_lipschitz(w_explicit, params, geometry="wasserstein", method="dense")
    ed = local_lipschitz(X, params, method="dense")
    torch.testing.assert_close(wd.value, ed.value, rtol=F64_REDUCTION, atol=0)


@pytest.mark.parametrize("geometry", ["euclidean", "wasserstein", "split"])
def test_permutation_invariance(gen, geometry):
    params = random_params(gen, 3, kind="concat")
    mu = _measure(gen, 1, 7, 3)
    perm = torch.randperm(7, generator=gen)
    mu_p = DiracMeasure(mu.points[:, perm], mu.weights[:, perm])
    a = local_lipschitz(mu, params, geometry=geometry, method="dense")
    b = local_lipschitz(mu_p, params, geometry=geometry, method="dense")
    torch.testing.assert_close(a.value, b.value, rtol=F64_REDUCTION, atol=0)


def test_split_dominates_wasserstein(gen):
    params = random_params(gen, 3, kind="wo", scale=2.0)
    mu = _measure(gen, 6, 5, 3, spread=6.0)
    w = local_lipschitz(mu, params, geometry="wasserstein", method="dense")
    s = local_lipschitz(mu, params, geometry="split", method="dense")
    assert bool((s.value >= w.value).all())
    assert s.self_value is not None and w.self_value is None
    torch.testing.assert_close(
        s.value, torch.maximum(w.value, s.self_value), rtol=F64_REWRITTEN, atol=0
    )


def test_batched_equals_per_sample(gen):
    params = random_params(gen, 4, kind="wo")
    X = torch.randn(4, 8, 4, generator=gen, dtype=D64)
    batched = local_lipschitz(X, params, method="lanczos")
    for b in range(4):
        single = local_lipschitz(X[b], params, method="lanczos")
        assert single.value.shape == ()
        # a batch of 4 and one input are not the same computation (batched products, a solver
        # stopping when its last member does): overlapping brackets, and values within the
        # stopping rule's tolerance (the default residual tol, 1e-6) plus the rounding margins
        compare_records(
            estimate_record(batched, b), estimate_record(single), Guarantees(tol=1e-6), f"[{b}]"
        )
        # Collatz–Wielandt stops once every batch member is within 1e-10 of its Rayleigh bound
        torch.testing.assert_close(batched.upper[b], single.upper, rtol=F64_LANCZOS, atol=0)


def test_float32_within_looser_tolerance(gen):
    params64 = random_params(gen, 4, kind="wo")
    params32 = MultiHeadParams(
        tuple(
            AttentionParams(h.A.float(), h.V.float(), c=h.c.float(), b=h.b.float())
            for h in params64.heads
        ),
        W_O=params64.W_O.float(),
        b_O=params64.b_O.float(),
    )
    X32 = torch.randn(3, 9, 4, generator=gen, dtype=D64).float()
    exact = _exact(X32.double(), params32.to(D64))
    for method in ("dense", "lanczos"):
        est = local_lipschitz(X32, params32, method=method, tol=1e-4)
        assert est.value.dtype == torch.float32 and est.lower.dtype == torch.float32
        torch.testing.assert_close(est.value.double(), exact, rtol=F32_VALUE, atol=0)
        assert bool((est.lower.double() <= exact).all())
        assert bool((est.upper.double() >= exact).all())


def test_causal_measure_equals_masked_sequence(gen):
    params = random_params(gen, 3, kind="single")
    X = torch.randn(2, 6, 3, generator=gen, dtype=D64)
    mu = DiracMeasure.from_sequence(X, causal=True)
    seq = local_lipschitz(X, params, masked=True, method="dense")
    meas = local_lipschitz(mu, params, geometry="wasserstein", method="dense")
    torch.testing.assert_close(meas.value, seq.value, rtol=F64_REDUCTION, atol=0)
    unmasked = local_lipschitz(mu, params, masked=False, method="dense")
    assert float((unmasked.value - seq.value).abs().max()) > 1e-6
    with pytest.raises(ValueError, match="position-tagged"):
        local_lipschitz(DiracMeasure(X), params, masked=True)


def test_auto_method_and_options(gen):
    params = random_params(gen, 16, kind="single")
    small = torch.randn(5, 16, generator=gen, dtype=D64)
    large = torch.randn(100, 16, generator=gen, dtype=D64)
    assert local_lipschitz(small, params).method == "dense"
    est = local_lipschitz(large, params, tol=1e-8)
    assert est.method == "lanczos" and est.upper_method == "block"
    assert est.vector.shape == (100, 16) and est.history is not None
    with pytest.raises(ValueError, match="method='dense'"):
        local_lipschitz(large, params, upper="gram")
    none = local_lipschitz(small, params, upper="none")
    assert bool(torch.isinf(none.upper))
    block = local_lipschitz(small, params, method="dense", upper="block")
    assert block.upper_method == "block" and float(block.upper) >= float(block.value)
    bad = local_lipschitz(large, params, max_iter=2, tol=1e-12)
    assert not bool(bad.converged)
    assert float(bad.lower) <= float(est.value) * (1 + BRACKET_ULPS)


def test_large_radius_is_stable(gen):
    params = random_params(gen, 4, kind="wo")
    X = torch.randn(2, 8, 4, generator=gen, dtype=D64)
    X = 100 * X / X.norm(dim=-1, keepdim=True)
    est = local_lipschitz(X, params, method="lanczos")
    exact = _exact(X, params)
    assert bool(torch.isfinite(est.value).all())
    torch.testing.assert_close(est.value, exact, rtol=F64_LANCZOS_COARSE, atol=0)
    _check_bracket(est, exact)


def test_rotary_heads(gen):
    d, k, H = 6, 4, 2
    W_Q, W_K, W_V = (torch.randn(H * k, d, generator=gen, dtype=D64) for _ in range(3))
    base = MultiHeadParams.from_qkv(W_Q, W_K, W_V, n_heads=H)
    rope = RotaryEmbedding(1.0 / (100.0 ** (torch.arange(0, k, 2, dtype=D64) / k)))
    params = MultiHeadParams(
        tuple(AttentionParams(h.A, h.V, Q=h.Q, K=h.K, rope=rope) for h in base.heads)
    )
    X = torch.randn(2, 7, d, generator=gen, dtype=D64)
    dense = local_lipschitz(X, params, masked=True, method="dense")
    lz = local_lipschitz(X, params, masked=True, method="lanczos")
    torch.testing.assert_close(lz.value, dense.value, rtol=F64_LANCZOS_COARSE, atol=0)
    # rotary heads are certified matrix-free by the per-head structured bound
    assert bool(torch.isfinite(lz.upper).all()) and bool(torch.isfinite(dense.upper).all())
    assert bool((lz.upper >= dense.value).all())
    with pytest.raises(NotImplementedError):
        local_lipschitz(X, params, geometry="split")


def test_rotary_heads_of_two_widths(gen):
    """The stored path's rounding model needs the rotary heads' rows stacked (one width): heads of
    two widths are a one-line error there when certified, and the streaming path certifies them,
    its bracket holding the dense value."""
    d = 6
    heads = []
    for k in (2, 4):
        Q, K, V = (torch.randn(k, d, generator=gen, dtype=D64) for _ in range(3))
        rope = RotaryEmbedding(1.0 / (100.0 ** (torch.arange(0, k, 2, dtype=D64) / k)))
        heads.append(AttentionParams(None, V[:2], Q=Q, K=K, rope=rope))
    params = MultiHeadParams(tuple(heads))
    X = torch.randn(7, d, generator=gen, dtype=D64)
    with pytest.raises(ValueError, match="rotary heads of one width"):
        local_lipschitz(X, params, masked=True, method="dense", path="stored")
    plain = local_lipschitz(X, params, masked=True, method="dense", path="stored", certify=False)
    streamed = local_lipschitz(X, params, masked=True, path="streaming")
    assert bool(streamed.lower <= plain.value <= streamed.upper_prob)


@pytest.mark.slow
def test_lanczos_matches_exact_svd_larger(gen):
    params = random_params(gen, 12, kind="wo", H=4, d_v=6, d_out=12, scale=2.0)
    mu = _measure(gen, 2, 120, 12, spread=4.0)
    exact = _exact(mu.points, params, lw=mu.log_weights, geometry="wasserstein")
    for geometry in ("wasserstein", "split"):
        est = local_lipschitz(mu, params, geometry=geometry, method="lanczos", chunk_size=50)
        ex = (
            exact
            if geometry == "wasserstein"
            else _exact(mu.points, params, lw=mu.log_weights, geometry="split")
        )
        torch.testing.assert_close(est.value, ex, rtol=F64_LANCZOS_COARSE, atol=0)
        _check_bracket(est, ex)


# ----------------------------------------------------------------------------------------------
# certified data-dependent bound (docs/theory.md §2a): torch version against the numpy one
# ----------------------------------------------------------------------------------------------
def _numpy_heads(params):
    if isinstance(params, AttentionParams):
        params = MultiHeadParams((params,))
    out = []
    for h, head in enumerate(params.heads):
        W = params.head_projection(h)
        out.append(
            (
                head.A.numpy(),
                head.V.numpy(),
                None if W is None else W.numpy(),
                None if head.c is None else head.c.numpy(),
            )
        )
    return out


@pytest.mark.parametrize("kind", ["single", "concat", "wo"])
@pytest.mark.parametrize("masked", [False, True])
def test_certified_local_upper_matches_numpy_and_dominates_dense(gen, kind, masked):
    from meanfield import certified_local_upper
    from theory.bounds import certified_local_upper as reference

    for d, n in ((2, 5), (4, 3), (3, 7)):  # n > d and n < d (projected differences)
        params = random_params(gen, d, kind=kind, scale=1.5)
        X = 2.0 * torch.randn(n, d, generator=gen, dtype=D64)
        got = certified_local_upper(X, params, masked=masked)
        ref = reference(X.numpy(), _numpy_heads(params), masked=masked)
        # equal up to the torch form's relative 1e-9 on its computed ||P|| (both carry one margin)
        assert ref * (1 - BRACKET_MARGIN) <= got.value <= ref * (1 + 2.5 * CERTIFIED_INFLATION)
        # the rounding margin (docs/rounding.md §8) is positive and, at moderate logits, small
        raw = got.T1 + got.T2 + got.T3
        assert raw < got.value <= raw * (1 + CERTIFIED_INFLATION)
        J = dense_jacobian(X, params, masked=masked).reshape(-1, n * d)
        assert float(torch.linalg.matrix_norm(J, ord=2)) <= got.value
        # float32 inputs give the same float64 evaluation
        p32 = params.to(dtype=torch.float32)
        low = certified_local_upper(X.float(), p32, masked=masked).value
        assert low == pytest.approx(got.value, rel=F32_FORWARD)


def test_certified_local_upper_rejects_bad_input(gen):
    from meanfield import certified_local_upper
    from theory.bounds import certified_local_upper as reference

    params = random_params(gen, 3, kind="wo")
    X = torch.randn(4, 3, generator=gen, dtype=D64)
    with pytest.raises(ValueError, match=r"shape \(n, d\)"):
        certified_local_upper(X[None], params)
    with pytest.raises(ValueError, match="d = 2"):
        certified_local_upper(X[:, :2], params)
    with pytest.raises(ValueError, match="non-finite"):
        certified_local_upper(X.clone().fill_(float("nan")), params)
    with pytest.raises(ValueError, match="WV_norms has 1 entries for 3 heads"):
        certified_local_upper(X, params, WV_norms=[1.0])
    heads = _numpy_heads(params)
    with pytest.raises(ValueError, match=r"A must be \(3, 3\)"):
        reference(X.numpy(), [(heads[0][0][:2], heads[0][1])])
    with pytest.raises(ValueError, match="non-finite"):
        reference(X.numpy() * float("inf"), heads)
    with pytest.raises(ValueError, match="heads is empty"):
        reference(X.numpy(), [])


# ------------------------------------------------------------------ the estimate alone (certify)
def _factored(gen, d, k, H, dtype=D64):
    W_Q, W_K, W_V = (torch.randn(H * k, d, generator=gen, dtype=D64) / d**0.5 for _ in range(3))
    W_O = torch.randn(d, H * k, generator=gen, dtype=D64) / (H * k) ** 0.5
    params = MultiHeadParams.from_qkv(W_Q, W_K, W_V, W_O, n_heads=H)
    return params if dtype == D64 else params.to(dtype=dtype)


@pytest.mark.parametrize("dtype", [D64, torch.float32])
@pytest.mark.parametrize("method", ["lanczos", "power"])
@pytest.mark.parametrize("masked", [False, True])
def test_certify_false_is_the_same_estimate_without_a_bracket(gen, dtype, method, masked):
    params = _factored(gen, 12, 4, 3, dtype)
    X = torch.randn(2, 40, 12, generator=gen, dtype=D64).to(dtype)
    tol = 1e-6 if dtype == D64 else 1e-4
    kw = dict(masked=masked, method=method, tol=tol, max_iter=3000, upper="none")
    full = local_lipschitz(X, params, **kw)
    fast = local_lipschitz(X, params, certify=False, **kw)
    # the same iteration: same number of products, same vector and value (in float32 the
    # solver's power-of-two scale is read from float32 magnitudes instead of float64 ones,
    # which can only move the result by rounding)
    assert torch.equal(fast.n_matvec, full.n_matvec) and torch.equal(fast.converged, full.converged)
    rtol = F64_REDUCTION if dtype == D64 else F32_FORWARD
    torch.testing.assert_close(fast.value, full.value, rtol=rtol, atol=0)
    assert fast.value.dtype == dtype and fast.lower.dtype == dtype
    # the trivial bracket, never a false one
    assert bool((fast.lower == 0).all()) and bool(torch.isinf(fast.upper).all())
    assert fast.upper_prob is None and fast.confidence is None and fast.upper_method == "none"
    exact = _exact(X.double(), params.to(dtype=D64), masked=masked)
    torch.testing.assert_close(fast.value.double(), exact, rtol=F32_VALUE, atol=0)


@pytest.mark.parametrize("geometry", ["euclidean", "wasserstein", "split"])
def test_certify_false_on_measures_dense_and_split(gen, geometry):
    params = random_params(gen, 4, kind="wo")
    mu = _measure(gen, 2, 9, 4, causal=True)
    exact = _exact_mu(mu, params, True, geometry)
    for method in ("dense", "lanczos"):
        full = local_lipschitz(mu, params, geometry=geometry, method=method)
        fast = local_lipschitz(mu, params, geometry=geometry, method=method, certify=False)
        torch.testing.assert_close(fast.value, full.value, rtol=F64_REDUCTION, atol=0)
        torch.testing.assert_close(fast.value, exact, rtol=F64_LANCZOS_COARSE, atol=0)
        assert bool((fast.lower == 0).all()) and bool(torch.isinf(fast.upper).all())
        assert fast.upper_prob is None


def test_certify_false_float32_outside_the_float32_scale_goes_through_float64(gen):
    # ||J|| ~ 2**110: the float32 solver's power-of-two scale would leave float32's range, so the
    # estimate runs on the float64 linearisation, as the certified call does
    params = _factored(gen, 8, 4, 2, torch.float32)
    big = 2.0**55
    params = MultiHeadParams.from_qkv(
        torch.cat([h.Q for h in params.heads]),
        torch.cat([h.K for h in params.heads]),
        torch.cat([h.V for h in params.heads]) * big,
        params.W_O * big,
        n_heads=2,
    )
    X = torch.randn(20, 8, generator=gen, dtype=D64).float()
    full = local_lipschitz(X, params, method="lanczos", tol=1e-4, upper="none")
    fast = local_lipschitz(X, params, method="lanczos", tol=1e-4, certify=False)
    assert bool(torch.isfinite(fast.value)) and float(fast.value) > 2.0**100
    torch.testing.assert_close(fast.value, full.value, rtol=F64_LANCZOS_COARSE, atol=0)


def test_certify_false_rejects_certificates(gen):
    params = random_params(gen, 4, kind="wo")
    X = torch.randn(30, 4, generator=gen, dtype=D64)
    with pytest.raises(ValueError, match="needs certify=True"):
        local_lipschitz(X, params, method="lanczos", upper="block", certify=False)
    with pytest.raises(ValueError, match="needs certify=True"):
        local_lipschitz(X, params, method="lanczos", prob_rtol=0.05, certify=False)
    with pytest.raises(ValueError, match="needs certify=True"):
        local_lipschitz(X, params, method="dense", upper="gram", certify=False)


# ----------------------------------------------------------------------------------------------
# Saving and loading an estimate
# ----------------------------------------------------------------------------------------------


def _same_bits(a, b) -> bool:
    """Same type, dtype, shape and bits (NaN payloads and the sign of zero included)."""
    if not isinstance(a, torch.Tensor):
        return type(a) is type(b) and (a == b or (a != a and b != b))
    if not isinstance(b, torch.Tensor) or (a.dtype, a.shape) != (b.dtype, b.shape):
        return False
    if a.is_floating_point():
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        a, b = a.contiguous().view(bits), b.contiguous().view(bits)
    return a.device == b.device and torch.equal(a, b)


def _assert_round_trip(est: LipschitzEstimate, path) -> LipschitzEstimate:
    import dataclasses

    assert est.save(path) == path
    back = LipschitzEstimate.load(path)
    for f in dataclasses.fields(LipschitzEstimate):
        a, b = getattr(est, f.name), getattr(back, f.name)
        assert (a is None) == (b is None), f.name
        assert a is None or _same_bits(a, b), (f.name, a, b)
    return back


ROUND_TRIPS = {
    # name: (dtype, batched, input, keyword arguments)
    "lanczos-width-f64-batched": (D64, True, "X", dict(method="lanczos")),
    "lanczos-width-f32": (torch.float32, False, "X", dict(method="lanczos")),
    "lanczos-residual-f32-batched": (torch.float32, True, "X", dict(method="lanczos", tol=1e-4)),
    "dense-f64": (D64, False, "X", dict(method="dense")),
    "split-measure-f64-batched": (D64, True, "mu", dict(geometry="split")),
    "uncertified-f32": (torch.float32, False, "X", dict(certify=False)),
    "no-delta-power-f64": (D64, False, "X", dict(method="power", delta=None)),
}


@pytest.mark.parametrize("case", list(ROUND_TRIPS))
def test_estimate_save_load_round_trip_is_bit_exact(case, tmp_path):
    dtype, batched, kind, kw = ROUND_TRIPS[case]
    g = torch.Generator().manual_seed(7)
    params = random_params(g, 5, kind="wo").to(dtype=dtype)
    shape = (2, 40, 5) if batched else (40, 5)
    X = torch.randn(*shape, generator=g, dtype=D64).to(dtype)
    inp = X
    if kind == "mu":
        inp = DiracMeasure.from_log_weights(X, random_log_weights(g, shape[:-1]).to(dtype))
    est = local_lipschitz(inp, params, **kw)
    assert est.value.dtype == dtype and est.value.shape == shape[:-2]
    back = _assert_round_trip(est, tmp_path / "est.safetensors")
    assert back.method == est.method and back.stop_rule == est.stop_rule
    assert torch.equal(back.ratio, est.ratio)


def test_estimate_round_trip_keeps_special_values_and_fields(tmp_path):
    import dataclasses

    g = torch.Generator().manual_seed(8)
    est = local_lipschitz(torch.randn(6, 3, generator=g, dtype=D64), random_params(g, 3))
    odd = dataclasses.replace(
        est,
        value=torch.tensor(-0.0, dtype=D64),
        upper=torch.tensor(float("inf"), dtype=D64),
        residual=torch.tensor(float("nan"), dtype=D64),
        n_iter=torch.tensor([[0, 2**62]]),  # int64, 2-d
        converged=torch.tensor([True, False]),
        history=torch.empty(0, dtype=torch.float16),  # any dtype, empty
        self_value=torch.tensor([1.5], dtype=torch.bfloat16),
        vector=torch.randn(3, 4, generator=g, dtype=D64).mT,  # not contiguous
        confidence=1 - 1e-6,
        width=1.05,
    )
    _assert_round_trip(odd, tmp_path / "odd.safetensors")
    # a standard safetensors file: its tensors are those of the estimate
    from safetensors.torch import load_file

    raw = load_file(tmp_path / "odd.safetensors")
    assert _same_bits(raw["value"], odd.value) and "confidence" not in raw


def test_estimate_load_refuses_other_files_in_one_line(tmp_path):
    import safetensors.torch

    est = local_lipschitz(torch.eye(3, dtype=D64), random_params(torch.Generator(), 3))
    good = est.save(tmp_path / "good.safetensors")
    (tmp_path / "text.json").write_text('{"kind": "profile"}')
    (tmp_path / "empty").write_bytes(b"")
    safetensors.torch.save_file({"w": torch.ones(2)}, tmp_path / "weights.safetensors")
    header = {"format": "meanfield.LipschitzEstimate", "format_version": "1"}
    safetensors.torch.save_file(
        {"value": torch.ones(())},
        tmp_path / "tampered.safetensors",
        metadata={**header, "fields": '{"method": "dense"}'},
    )
    safetensors.torch.save_file(
        {"value": torch.ones(()), "method": torch.ones(())},
        tmp_path / "wrong-type.safetensors",
        metadata={**header, "fields": "{}"},
    )
    for name in ("text.json", "empty", "weights.safetensors", "tampered.safetensors"):
        with pytest.raises(ValueError, match="is not a LipschitzEstimate") as err:
            LipschitzEstimate.load(tmp_path / name)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="unexpected field 'method'"):
        LipschitzEstimate.load(tmp_path / "wrong-type.safetensors")
    with pytest.raises(FileNotFoundError):
        LipschitzEstimate.load(tmp_path / "missing.safetensors")
    assert LipschitzEstimate.load(good).method == est.method


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"max_iter": 0}, "max_iter must be a positive integer"),
        ({"krylov_dim": 0}, "krylov_dim must be a positive integer"),
        ({"krylov_dim": 2.5}, "krylov_dim must be a positive integer"),
        ({"delta": 2.0}, r"delta must be in \(0, 1\)"),
        ({"delta": 0.0}, r"delta must be in \(0, 1\)"),
    ],
)
def test_iteration_and_confidence_options_are_checked(gen, kw, match):
    params = random_params(gen, 4, kind="wo")
    X = torch.randn(5, 4, generator=gen, dtype=D64)
    with pytest.raises(ValueError, match=match):
        local_lipschitz(X, params, method="lanczos", **kw)


def test_prob_rtol_none_stops_on_the_residual_rule(gen):
    """prob_rtol=None is the residual rule (docstring), "auto" the width rule."""
    params = random_params(gen, 8, kind="wo")
    X = torch.randn(200, 8, generator=gen, dtype=D64)
    assert local_lipschitz(X, params, prob_rtol=None).stop_rule == "residual"
    assert local_lipschitz(X, params).stop_rule == "width"
