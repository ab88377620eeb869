"""Upper certificates: probabilistic (Kuczyński–Woźniakowski) and per-head structured bounds."""

from __future__ import annotations

import math

import pytest
import torch

from meanfield import MultiHeadParams
from meanfield._certificates import (
    golub_kahan_certified,
    kw_delta,
    kw_epsilon,
    kw_factor,
    kw_steps,
    kw_union_factor,
    lanczos_polynomial_upper,
    probabilistic_upper,
    start_component_bound,
)
from meanfield._spectral import lanczos_svd
from meanfield.jacobian import (
    dense_jacobian,
    head_structured_upper,
    linearize,
    structured_block_norms,
)
from meanfield.lipschitz import local_lipschitz
from meanfield.params import AttentionParams, RotaryEmbedding

from ..oracles_jacobian import random_params
from ..tolerances import (
    BRACKET_MARGIN,
    BRACKET_ULPS,
    F64_CLOSED_FORM,
    F64_LANCZOS,
    F64_LANCZOS_COARSE,
    F64_REDUCTION,
    F64_REWRITTEN,
)

D64 = torch.float64


def _rope_params(gen, d=6, k=4, H=2, scaling=1.0, W_O=True):
    W_Q, W_K, W_V = (torch.randn(H * k, d, generator=gen, dtype=D64) for _ in range(3))
    base = MultiHeadParams.from_qkv(W_Q, W_K, W_V, n_heads=H)
    rope = RotaryEmbedding(1.0 / (100.0 ** (torch.arange(0, k, 2, dtype=D64) / k)), scaling)
    heads = tuple(AttentionParams(h.A, h.V, Q=h.Q, K=h.K, rope=rope) for h in base.heads)
    W = torch.randn(d, H * k, generator=gen, dtype=D64) / (H * k) ** 0.5 if W_O else None
    return MultiHeadParams(heads, W_O=W)


# ------------------------------------------------------------------------------- closed forms
def test_kw_epsilon_solves_the_failure_bound():
    for N, k, delta in [(100, 10, 0.1), (196608, 35, 1e-6), (10, 2, 0.5)]:
        eps = kw_epsilon(N, k, delta)
        assert 0 < eps < 1
        bound = 1.648 * math.sqrt(N) * math.exp(-math.sqrt(eps) * (2 * k - 1))
        assert bound == pytest.approx(delta, rel=F64_CLOSED_FORM)
    assert kw_epsilon(10**6, 1, 0.1) == math.inf  # one step certifies nothing
    assert kw_epsilon(10**6, 3, 1e-6) == math.inf  # vacuous: epsilon would exceed 1
    assert kw_factor(10**6, 3, 1e-6) == math.inf


def test_kw_steps_is_the_fewest():
    for N, delta, rtol in [(196608, 1e-6, 0.05), (1000, 0.1, 0.2), (786432, 1e-6, 0.05)]:
        k = kw_steps(N, delta, rtol)
        assert kw_union_factor(N, k, delta) <= 1 + rtol
        assert kw_union_factor(N, k - 1, delta) > 1 + rtol


def test_union_over_stopping_steps_spends_delta_once():
    """delta_k = delta / (k (k + 1)) sums to delta over all steps (telescoping), and the union
    factor at step k is the plain factor at delta_k, larger than the plain one at delta."""
    delta = 1e-6
    partial = math.fsum(kw_delta(delta, k) for k in range(1, 100001))
    assert partial == pytest.approx(delta * (1 - 1 / 100001), rel=F64_CLOSED_FORM)
    assert partial <= delta
    for N, k in [(196608, 40), (1000, 12)]:
        assert kw_union_factor(N, k, delta) == kw_factor(N, k, delta / (k * (k + 1)))
        assert kw_union_factor(N, k, delta) > kw_factor(N, k, delta)
    # the run's early stop at k1 is charged delta_k1 (probabilistic_upper on the residual path)
    ritz, k1 = torch.tensor([1.0, 2.0], dtype=D64), torch.tensor([12, 30])
    up = probabilistic_upper(ritz, k1, 1000, delta, 0.0)
    for i in range(2):
        k = int(k1[i])
        assert float(up[i]) == float(ritz[i]) * kw_factor(1000, k, delta / (k * (k + 1)))


def test_golub_kahan_certified_charges_delta_k_at_its_stopping_step(monkeypatch):
    """The KW bound at the step where the run stops is charged delta_k = (delta/2)/(k(k+1)).

    The gap-aware polynomial bound is switched off (it decides the stop on every spectrum we
    tried, and it needs no union: its one event covers every step), so the KW bound alone
    decides. Recomputed from an independent Golub-Kahan loop (``_gk``): the bound is the Ritz
    value times the factor at delta_k, the run stops at the first step where that is within the
    width, and with delta/2 alone (no union) it would have stopped earlier."""
    import meanfield._certificates as cert

    monkeypatch.setattr(
        cert, "lanczos_polynomial_upper", lambda a, b, s, N, d: torch.full_like(s[..., 0], math.inf)
    )
    N, delta, rtol = 400, 1e-3, 0.3
    s = torch.linspace(0, 1, N, dtype=D64)
    x0 = torch.randn(1, N, generator=torch.Generator().manual_seed(5), dtype=D64)
    res, up, k1 = cert.golub_kahan_certified(
        lambda v: v * s, lambda u: u * s, x0, delta=delta, rtol=rtol, margin=0.0, tol=1e-6,
        max_iter=300, krylov_dim=8, require_residual=False,
    )  # fmt: skip
    k = int(k1)
    assert k == kw_steps(N, delta / 2, rtol)
    _, _, S = _gk(s, x0, k)
    torch.testing.assert_close(
        up, S[:, 0] * kw_factor(N, k, delta / 2 / (k * (k + 1))), rtol=F64_LANCZOS, atol=0
    )
    assert kw_factor(N, k - 1, delta / 2) <= 1 + rtol  # no union: one step fewer would do
    assert float(up) >= 1.0  # and it holds (norm 1)


# ------------------------------------------------------------------------------- calibration
@pytest.mark.parametrize("spectrum", ["uniform", "sqrt", "cluster"])
@pytest.mark.parametrize("k", [4, 6])
def test_probabilistic_bound_is_calibrated(spectrum, k):
    """A short run with delta = 0.1 must hold in at least 90 % of random starts.

    J = diag(s) has known norm 1. The spectra put many singular values just below the top one,
    where a short Krylov run is slowest, so the Ritz value is well below 1; only the certificate
    factor can bring the bound above it. Each start is an independent seed.
    """
    N, delta, trials = 400, 0.1, 300
    g = torch.Generator().manual_seed(7)
    if spectrum == "uniform":
        s = torch.linspace(0, 1, N, dtype=D64)
    elif spectrum == "sqrt":
        s = torch.linspace(0, 1, N, dtype=D64).sqrt()
    else:
        s = torch.cat([torch.ones(1, dtype=D64), 1 - torch.rand(N - 1, generator=g) ** 3 * 0.5])
        s = s.to(D64)
    x0 = torch.randn(trials, N, generator=g, dtype=D64)
    res = lanczos_svd(lambda v: v * s, lambda u: u * s, x0, tol=0.0, max_iter=k, krylov_dim=k)
    ritz = res.history[-1]
    k1 = torch.full((trials,), k, dtype=torch.int64)
    up = probabilistic_upper(ritz, k1, N, delta, 0.0)
    held = float((up >= 1.0).double().mean())
    assert held >= 1 - delta, held
    # the test has power: without the factor the estimate fails in most starts
    assert float((ritz < 1.0 - 1e-3).double().mean()) > 0.9


def _gk(s, x0, k):
    """k plain Golub-Kahan steps on diag(s) (independent of the library's loop)."""
    v = x0 / x0.norm(dim=-1, keepdim=True)
    Vs, Us, al, be = [v], [], [], []
    p = v * s
    a = p.norm(dim=-1)
    u = p / a[:, None]
    al.append(a)
    Us.append(u)
    for j in range(k):
        r = u * s - a[:, None] * Vs[-1]
        B = torch.stack(Vs, 1)
        for _ in range(2):
            r = r - ((B @ r[:, :, None]).squeeze(-1)[:, None, :] @ B).squeeze(1)
        b = r.norm(dim=-1)
        be.append(b)
        if j == k - 1:
            break
        v = r / b[:, None]
        Vs.append(v)
        p = v * s - b[:, None] * u
        B = torch.stack(Us, 1)
        for _ in range(2):
            p = p - ((B @ p[:, :, None]).squeeze(-1)[:, None, :] @ B).squeeze(1)
        a = p.norm(dim=-1)
        u = p / a[:, None]
        al.append(a)
        Us.append(u)
    A, B = torch.stack(al, -1), torch.stack(be, -1)
    S = torch.linalg.svdvals(torch.diag_embed(A) + torch.diag_embed(B[:, :-1], offset=1))
    return A, B, S


def test_start_component_bound():
    # the density bound: P(|b_1| < t) <= delta, checked against the exact Beta law by sampling
    N, delta = 50, 0.2
    t = start_component_bound(N, delta)
    g = torch.Generator().manual_seed(11)
    b = torch.randn(20000, N, generator=g, dtype=D64)
    frac = float((b[:, 0].abs() / b.norm(dim=-1) < t).double().mean())
    assert frac <= delta
    assert frac > 0.9 * delta  # and it is nearly sharp


def test_polynomial_bound_is_calibrated():
    """Short runs, delta = 0.1: the gap-aware bound must hold in at least 90 % of 2000 starts.

    A well separated top value (others below 0.5) makes the bound nearly sharp: it fails only
    when the start has almost no component along the top vector, which happens with
    probability close to delta, so this test could fail.
    """
    N, delta, trials = 400, 0.1, 2000
    g = torch.Generator().manual_seed(7)
    s = torch.cat([torch.ones(1, dtype=D64), 0.5 * torch.rand(N - 1, generator=g, dtype=D64)])
    x0 = torch.randn(trials, N, generator=g, dtype=D64)
    A, B, S = _gk(s, x0, 3)
    up = lanczos_polynomial_upper(A, B, S, N, delta)
    failed = float((up < 1.0).double().mean())
    assert failed <= delta, failed
    assert failed > 0.02  # sharp: close to delta, not vacuous
    # on a slow spectrum it is still valid and tighter than the worst-case bound
    s2 = torch.linspace(0, 1, N, dtype=D64)
    A, B, S = _gk(s2, x0[:300], 6)
    up = lanczos_polynomial_upper(A, B, S, N, delta)
    assert bool((up >= 1.0).all())
    kw = probabilistic_upper(S[:, 0], torch.full((300,), 6), N, delta, 0.0)
    assert float(up.median()) < float(kw.median())


def _certified_on_diagonal(s, x0, **kw):
    """``golub_kahan_certified`` on diag(s), no margin, residual tolerance 1e-6."""
    return golub_kahan_certified(lambda v: v * s, lambda u: u * s, x0, margin=0.0, tol=1e-6, **kw)


def test_golub_kahan_certified_stops_when_tight():
    g = torch.Generator().manual_seed(3)
    s = torch.cat([torch.tensor([2.0], dtype=D64), torch.rand(299, generator=g, dtype=D64)])
    x0 = torch.randn(2, 300, generator=g, dtype=D64)
    res, up, k1 = _certified_on_diagonal(s, x0, delta=1e-6, rtol=0.01, max_iter=300, krylov_dim=8)
    assert bool(res.converged.all())
    torch.testing.assert_close(
        res.sigma, torch.full((2,), 2.0, dtype=D64), rtol=F64_LANCZOS_COARSE, atol=0
    )
    assert bool((up >= 2.0).all()) and bool((up <= 2.0 * 1.01).all())
    assert bool((k1 < kw_steps(300, 0.5e-6, 0.01)).all())  # the gap made it cheaper than KW


# ------------------------------------------------------------------ certificates vs dense SVD
@pytest.mark.parametrize("kind", ["single", "concat", "wo"])
@pytest.mark.parametrize("masked", [False, True])
def test_certificates_bound_the_dense_norm(gen, kind, masked):
    params = random_params(gen, 5, kind=kind, H=3, d_v=3, d_out=5, scale=1.5)
    X = torch.randn(3, 9, 5, generator=gen, dtype=D64)
    exact = torch.linalg.matrix_norm(dense_jacobian(X, params, masked=masked), 2)
    est = local_lipschitz(X, params, masked=masked, method="lanczos", prob_rtol=0.05)
    torch.testing.assert_close(est.value, exact, rtol=F64_LANCZOS_COARSE, atol=0)
    assert bool((est.lower <= exact * (1 + BRACKET_ULPS)).all())
    assert bool((est.upper_prob >= exact).all())
    assert bool((est.upper_prob <= est.upper).all())
    assert bool((est.upper_prob <= 1.05 * est.lower).all())
    assert est.confidence == pytest.approx(1 - 1e-6)
    hs = head_structured_upper(linearize(X, params, masked=masked))
    assert bool((hs >= exact).all()), (hs, exact)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("scaling", [1.0, 0.7])
def test_rotary_heads_certified(gen, masked, scaling):
    params = _rope_params(gen, scaling=scaling)
    X = torch.randn(2, 8, 6, generator=gen, dtype=D64)
    exact = torch.linalg.matrix_norm(dense_jacobian(X, params, masked=masked), 2)
    est = local_lipschitz(X, params, masked=masked, method="lanczos", prob_rtol=0.05)
    torch.testing.assert_close(est.value, exact, rtol=F64_LANCZOS_COARSE, atol=0)
    assert bool(torch.isfinite(est.upper).all())
    assert bool((est.upper >= exact).all()), (est.upper, exact)
    assert bool((est.upper_prob >= exact).all())
    assert bool((est.upper_prob <= 1.05 * est.lower).all())


def test_structured_bound_with_key_bias_and_concat(gen):
    params = random_params(gen, 4, kind="concat", H=2, d_v=4, biases=True, scale=2.0)
    X = 2 * torch.randn(4, 10, 4, generator=gen, dtype=D64)
    for masked in (False, True):
        exact = torch.linalg.matrix_norm(dense_jacobian(X, params, masked=masked), 2)
        hs = head_structured_upper(linearize(X, params, masked=masked))
        assert bool((hs >= exact).all())


def test_default_costs_nothing_and_is_seedable(gen):
    """On the residual rule the probabilistic bound reuses the run (no extra product)."""
    params = random_params(gen, 6, kind="wo", H=2, d_v=3, d_out=6)
    X = torch.randn(20, 6, generator=gen, dtype=D64)
    plain = local_lipschitz(X, params, method="lanczos", delta=None)
    est = local_lipschitz(X, params, method="lanczos", tol=1e-6)
    assert plain.upper_prob is None and plain.confidence is None
    assert plain.stop_rule == est.stop_rule == "residual"
    assert int(est.n_matvec) == int(plain.n_matvec)
    assert float(est.upper_prob) >= float(est.lower)
    a = local_lipschitz(X, params, method="lanczos", seed=5)
    b = local_lipschitz(X, params, method="lanczos", seed=5)
    assert float(a.upper_prob) == float(b.upper_prob)  # the seed is the one random source
    with pytest.raises(TypeError, match="generator"):
        local_lipschitz(X, params, method="lanczos", generator=torch.Generator().manual_seed(5))
    dense = local_lipschitz(X, params, method="dense")
    assert float(dense.upper_prob) == float(dense.upper)


def test_float32_probabilistic_bound(gen):
    params = random_params(gen, 6, kind="wo", H=2, d_v=3, d_out=6)
    X = torch.randn(16, 6, generator=gen, dtype=D64)
    exact = torch.linalg.matrix_norm(dense_jacobian(X, params), 2)
    p32 = params.to(dtype=torch.float32)
    est = local_lipschitz(X.float(), p32, method="lanczos", tol=1e-4, prob_rtol=0.05)
    assert est.upper_prob.dtype == torch.float32
    assert float(est.upper_prob) >= float(exact)


@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_structured_block_norms_bound_every_block(gen, rope, masked):
    """N_ij >= ||J_ij||_2 for every block of the dense Jacobian (rotary or not, key bias)."""
    if rope:
        params = _rope_params(gen, scaling=0.8)
    else:
        params = random_params(gen, 6, kind="wo", H=2, d_v=3, d_out=5, biases=True, scale=1.5)
    n, d = 7, 6
    X = torch.randn(2, n, d, generator=gen, dtype=D64)
    J = dense_jacobian(X, params, masked=masked)
    d_out = J.shape[-2] // n
    blocks = J.reshape(2, n, d_out, n, d).permute(0, 1, 3, 2, 4)
    exact = torch.linalg.matrix_norm(blocks, 2)  # (2, n, n)
    N = structured_block_norms(linearize(X, params, masked=masked))
    assert bool((N >= exact * (1 - F64_REWRITTEN)).all()), float((exact / N).max())


@pytest.mark.parametrize("masked", [False, True])
def test_structured_bounds_at_token_positions(gen, masked):
    """Rotary heads at token positions other than 0..n-1 with gaps (a shift alone leaves rotary
    logits unchanged): the structured bounds hold, and the rows linearize forms for the products
    give the same bounds as the ones the bounds form themselves without them (which once
    attended at positions 0..n-1)."""
    from dataclasses import replace

    params = _rope_params(gen, scaling=0.8)
    n, d = 7, 6
    X = torch.randn(2, n, d, generator=gen, dtype=D64)
    idx = 3 * torch.arange(n) + 40  # gaps: rotary logits depend on the differences
    J = dense_jacobian(X, params, masked=masked, token_index=idx)
    blocks = J.reshape(2, n, -1, n, d).permute(0, 1, 3, 2, 4)
    exact = torch.linalg.matrix_norm(blocks, 2)
    lin = linearize(X, params, masked=masked, token_index=idx)
    N = structured_block_norms(lin)
    assert bool((N >= exact * (1 - F64_REWRITTEN)).all()), float((exact / N).max())
    whole = torch.linalg.matrix_norm(J, 2)
    assert bool((head_structured_upper(lin) >= whole * (1 - F64_REWRITTEN)).all())
    bare = replace(lin, rope_rows=None)
    torch.testing.assert_close(structured_block_norms(bare), N, rtol=F64_REDUCTION, atol=0)
    torch.testing.assert_close(
        head_structured_upper(bare), head_structured_upper(lin), rtol=F64_REDUCTION, atol=0
    )


def test_degenerate_operators():
    # zero operator: the polynomial bound certifies 0; a one-step run has no KW certificate
    x0 = torch.randn(1, 10, generator=torch.Generator().manual_seed(0), dtype=D64)
    res, up, _ = _certified_on_diagonal(0, x0, delta=1e-3, rtol=0.05, max_iter=5, krylov_dim=4)
    assert float(res.sigma) == 0.0 and float(up) == 0.0
    assert math.isinf(
        float(probabilistic_upper(torch.zeros(1), torch.ones(1, dtype=torch.int64), 10, 0.1, 0))
    )


@pytest.mark.parametrize("geometry", ["wasserstein", "split"])
def test_weighted_measures(gen, geometry):
    from meanfield import DiracMeasure

    from ..oracles_jacobian import random_log_weights
    from .test_lipschitz import _exact

    params = random_params(gen, 4, kind="wo", H=2, d_v=3, d_out=4, scale=1.5)
    X = torch.randn(2, 12, 4, generator=gen, dtype=D64)
    w = torch.exp(random_log_weights(gen, (2, 12), spread=3.0))
    mu = DiracMeasure(X, w)
    exact = _exact(X, params, lw=mu.log_weights, geometry=geometry)
    est = local_lipschitz(mu, params, geometry=geometry, method="lanczos", prob_rtol=0.05)
    torch.testing.assert_close(est.value, exact, rtol=F64_LANCZOS_COARSE, atol=0)
    assert bool((est.upper_prob >= exact).all())
    assert bool((est.upper_prob <= est.upper).all())


def test_local_lipschitz_fn_probabilistic_bound(gen):
    from meanfield.lipschitz import local_lipschitz_fn

    M = torch.randn(30, 20, generator=gen, dtype=D64)

    def fn(x):
        return torch.tanh(x @ M.T)

    x = torch.randn(20, generator=gen, dtype=D64)
    exact = torch.linalg.matrix_norm(torch.func.jacrev(fn)(x), 2)
    est = local_lipschitz_fn(fn, x, method="lanczos", max_iter=12, krylov_dim=12, tol=0.0)
    assert float(est.upper_prob) >= float(exact) >= float(est.lower) * (1 - BRACKET_MARGIN)
    dense = local_lipschitz_fn(fn, x, method="dense")
    assert float(dense.upper_prob) == float(dense.upper)


# ------------------------------------------------------------------------------- stopping rules
def test_default_call_stops_on_the_certified_width(gen):
    """The default matrix-free call stops once upper_prob <= 1.05 lower, and the bracket holds."""
    params = random_params(gen, 6, kind="wo", H=3, d_v=3, d_out=6, scale=1.5)
    X = torch.randn(3, 40, 6, generator=gen, dtype=D64)
    exact = torch.linalg.matrix_norm(dense_jacobian(X, params, masked=True), 2)
    est = local_lipschitz(X, params, masked=True, method="lanczos")
    assert est.stop_rule == "width" and est.width == pytest.approx(1.05)
    assert bool(est.width_reachable.all()) and bool(est.converged.all())
    assert bool((est.upper_prob <= 1.05 * est.lower).all())
    assert bool((est.lower <= exact).all()) and bool((est.upper_prob >= exact).all())
    # it does not ask for more than the width: the residual rule at 1e-6 takes more products
    res = local_lipschitz(X, params, masked=True, method="lanczos", tol=1e-6)
    assert res.stop_rule == "residual" and res.width is None
    assert bool((est.n_matvec <= res.n_matvec).all())
    # a requested width is honoured too
    tight = local_lipschitz(X, params, masked=True, method="lanczos", prob_rtol=0.01)
    assert tight.width == pytest.approx(1.01)
    assert bool((tight.upper_prob <= 1.01 * tight.lower).all()) and bool(tight.converged.all())


@pytest.mark.parametrize(
    "kw",
    [
        dict(tol=1e-8),
        dict(start="kronecker"),
        dict(certify=False),
        dict(method="power"),
        dict(delta=None),
        dict(method="dense"),
    ],
    ids=["tol", "start", "nocert", "power", "nodelta", "dense"],
)
def test_calls_without_a_width_stop_on_the_residual_rule(gen, kw):
    """Calls that form no upper_prob, or give tol, keep the residual rule and do not raise."""
    params = random_params(gen, 5, kind="wo", H=2, d_v=3, d_out=5)
    X = torch.randn(30, 5, generator=gen, dtype=D64)
    kw = {"method": "lanczos", **kw}
    est = local_lipschitz(X, params, **kw)
    assert est.stop_rule == ("dense" if kw["method"] == "dense" else "residual")
    assert est.width is None and est.width_reachable is None
    exact = torch.linalg.matrix_norm(dense_jacobian(X, params), 2)
    assert float(est.lower) <= float(exact) <= float(est.upper)


def test_unreachable_width_falls_back_to_the_residual_rule(gen):
    """A width inside the rounding margins is reported unreachable; the call then stops on the
    residual rule (well before max_iter) instead of chasing the width. The width rule solves in
    float64 (float32 inputs included), whose Krylov margin alone is 64 (n + d) u ~ 2e-13: a
    width of 1e-14 is inside it."""
    params = random_params(gen, 6, kind="wo", H=2, d_v=3, d_out=6).to(dtype=torch.float32)
    X = torch.randn(40, 6, generator=gen)
    est = local_lipschitz(X, params, method="lanczos", prob_rtol=1e-14, max_iter=300)
    assert est.width == pytest.approx(1 + 1e-14)
    assert est.stop_rule == "residual"
    assert est.width_reachable is not None and not bool(est.width_reachable)
    assert int(est.n_iter) < 300
    exact = torch.linalg.matrix_norm(dense_jacobian(X.double(), params.to(dtype=D64)), 2)
    assert float(est.lower) <= float(exact) <= float(est.upper_prob)


def test_bad_stopping_options_are_one_line_errors(gen):
    params = random_params(gen, 4, kind="single")
    X = torch.randn(10, 4, generator=gen, dtype=D64)
    for kw, match in [
        (dict(tol=-1.0), "tol must be a positive number"),
        (dict(tol=math.nan), "tol must be a positive number"),
        (dict(prob_rtol=0.0), "prob_rtol must be"),
        (dict(prob_rtol="tight"), "prob_rtol must be"),
    ]:
        with pytest.raises(ValueError, match=match):
            local_lipschitz(X, params, method="lanczos", **kw)


def test_unreachable_width_still_tightens_the_krylov_bound():
    """Where the rounding margins make the width unreachable at the Ritz value, the run does not
    stop at the first step whose residual holds: it goes on until the Krylov bound itself is
    within the width, so that upper_prob is as tight as the margins allow."""
    from meanfield._certificates import golub_kahan_certified

    gen = torch.Generator().manual_seed(3)
    diag = torch.linspace(0.1, 1.0, 400, dtype=D64)
    diag[-1] = 3.0  # a well separated top value: the residual holds after a few steps

    def op(v: torch.Tensor) -> torch.Tensor:
        return v * diag

    x0 = torch.randn(400, generator=gen, dtype=D64)

    def never(sigma, bound=None):
        return torch.zeros(sigma.shape, dtype=torch.bool)

    res, upper, _ = golub_kahan_certified(
        op, op, x0, delta=1e-6, rtol=0.05, margin=1e-12, tol=1e-6, max_iter=300,
        krylov_dim=8, accept=never, reachable=never,
    )  # fmt: skip
    assert bool(res.converged)
    assert float(upper) <= 1.05 * float(res.sigma) * (1 + BRACKET_MARGIN)
    assert float(res.sigma) <= 3.0 * (1 + BRACKET_MARGIN) <= float(upper)
