"""The streaming path of ``local_lipschitz``: its rounding model, the choice of path, and its
agreement with the stored path (docs/rounding.md §11).

Oracles: the 50-digit Jacobian of tests/mpmath_oracle.py (the error model must bound the
computed product's distance to it entrywise), the stored path (products within the sum of the
two paths' derived error bounds, estimates within each other's brackets), and the adjoint
identity of the magnitude operator.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from meanfield import _rounding as rnd
from meanfield.jacobian import (
    linearize,
    linearize_streaming,
    streaming_jvp,
    streaming_vjp,
)
from meanfield.jacobian.streaming import streaming_magnitude
from meanfield.lipschitz import local_lipschitz, stored_bytes
from meanfield.lipschitz._operators import parse_input
from tests.meanfield.test_rigour import _torch_inputs, exact_jacobian, make_instance
from tests.streaming_margins import assert_entrywise_bound, assert_products_agree, width_tolerance
from tests.tolerances import BRACKET_MARGIN, BRACKET_ULPS, EXACT_ZERO_FLOOR, F64_LANCZOS_COARSE

D64 = torch.float64


def _streaming_at(x, params, masked, token_index=None):
    X, lw, pos, is_masked = parse_input(x, masked, params)
    p64 = params.to(dtype=D64)
    lw64 = None if lw is None else lw.to(D64)
    pos64 = None if pos is None else pos.to(D64)
    slin = linearize_streaming(
        X.to(D64), p64, log_weights=lw64, masked=is_masked, positions=pos64,
        token_index=token_index,
    )  # fmt: skip
    return slin, (X.to(D64), p64, lw64, pos64, is_masked)


def _token_index(inst):
    if inst["kind"] != "rotary":
        return None
    pos = next((r[2] for _, r in inst["A"] if r is not None), None)
    return None if pos is None else torch.as_tensor(np.asarray(pos))


def _check_entrywise(seed: int, split: bool) -> None:
    """|fl(J h) - J h| <= eta * (M |h|) entrywise against the 50-digit J, for M the magnitude
    operator of §11.2 or (``split``) the composite of §11.5."""
    inst = make_instance(seed)
    if inst["dtype"] == "float32":  # the model is of the float64 computation
        return
    x, params, weights = _torch_inputs(inst)
    slin, _ = _streaming_at(x, params, inst["masked"], _token_index(inst))
    geometry = inst["geometry"]
    mlin = streaming_magnitude(slin)
    model = rnd.streaming_error_model(mlin)
    eta = float(model.eta)
    assert math.isfinite(eta) and eta <= 0.25  # the model is in force
    if split:
        mlin = rnd.streaming_magnitude_split(slin, mlin, [(rnd.U64, model)])
    J = exact_jacobian(inst, weights)
    assert_entrywise_bound(slin, mlin, eta, J, seed, geometry, (inst["kind"], seed, split))


@pytest.mark.parametrize("seed", range(40))
def test_error_model_bounds_the_product_against_50_digits(seed):
    """|fl(J h) - J h| <= eta * (M |h|) entrywise, J at 50 digits (docs/rounding.md §11.2)."""
    _check_entrywise(seed, split=False)


@pytest.mark.parametrize("seed", range(40))
def test_split_magnitude_bounds_the_product_against_50_digits(seed):
    """The same with the composite operator of docs/rounding.md §11.5 (computed rows'
    magnitudes plus each kind of row's error on its chain magnitudes) in place of M."""
    _check_entrywise(seed, split=True)


@pytest.mark.parametrize("seed", range(8))
def test_magnitude_operator_is_nonnegative_and_its_own_adjoint(seed, gen):
    inst = make_instance(seed, "heads")
    x, params, _ = _torch_inputs(inst)
    slin, _ = _streaming_at(x, params, inst["masked"])
    mlin = streaming_magnitude(slin)
    geometry = inst["geometry"]
    h = torch.rand(slin.n, slin.d, generator=gen, dtype=D64)
    g = torch.rand(slin.n, slin.d_out, generator=gen, dtype=D64)
    Mh = streaming_jvp(mlin, h, geometry=geometry)
    Mtg = streaming_vjp(mlin, g, geometry=geometry)
    assert bool((Mh >= 0).all()) and bool((Mtg >= 0).all())
    # both sides are sums of nonnegative terms: equal within their own rounding, 2 gamma_K
    lhs, rhs = float((Mh * g).sum()), float((h * Mtg).sum())
    assert abs(lhs - rhs) <= 2 * rnd.gamma(4 * (slin.n * slin.d + 64)) * max(lhs, rhs)
    # M dominates the product: |J h| <= (1 + eta) M |h|
    Jh = streaming_jvp(slin, h, geometry=geometry)
    eta = float(rnd.streaming_error_model(mlin).eta)
    assert bool((Jh.abs() <= (1 + eta) * Mh * (1 + BRACKET_ULPS) + EXACT_ZERO_FLOOR).all())


# ----------------------------------------------------------------------- the two paths agree
def _layer(gen, d=12, k=4, H=3, rope=False):
    from meanfield.params import AttentionParams, MultiHeadParams, RotaryEmbedding

    heads = []
    for _ in range(H):
        Q, K = (torch.randn(k, d, generator=gen, dtype=D64) / d**0.5 for _ in range(2))
        V = torch.randn(k, d, generator=gen, dtype=D64) / d**0.5
        emb = None
        if rope:
            emb = RotaryEmbedding(1.0 / 100.0 ** (torch.arange(0, k, 2, dtype=D64) / k))
        heads.append(AttentionParams(None, V, Q=Q, K=K, rope=emb))
    W = torch.randn(d, H * k, generator=gen, dtype=D64) / (H * k) ** 0.5
    return MultiHeadParams(tuple(heads), W_O=W)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("radius", [1.0, 30.0])
def test_products_agree_within_the_two_derived_bounds(gen, masked, radius):
    """|stored - streaming| <= eta_stored |J|_mag|h| + eta_streaming M|h|, entrywise."""
    params = _layer(gen)
    n = 64
    X = radius * torch.randn(n, 12, generator=gen, dtype=D64)
    lin = linearize(X, params, masked=masked)
    slin = linearize_streaming(X, params, masked=masked, block_size=(16, 24))
    H = torch.randn(n, 12, generator=gen, dtype=D64)
    G = torch.randn(n, 12, generator=gen, dtype=D64)
    assert_products_agree(lin, slin, H, G)


def _overlap(a, b):
    """The two certified brackets [lower, upper_prob] intersect (both hold the exact value)."""
    return bool(a.lower <= b.upper_prob) and bool(b.lower <= a.upper_prob)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_estimates_overlap_and_widths_differ_by_the_margins(gen, masked, dtype):
    params = _layer(gen, rope=False).to(dtype=dtype)
    X = (2 * torch.randn(160, 12, generator=gen, dtype=D64)).to(dtype)  # n d > 1500: lanczos
    stored = local_lipschitz(X, params, masked=masked, path="stored")
    streamed = local_lipschitz(X, params, masked=masked, path="streaming", chunk_size=32)
    assert (stored.path, streamed.path) == ("stored", "streaming")
    assert _overlap(stored, streamed)
    assert streamed.stop_rule == "width" and bool(streamed.converged)
    assert math.isinf(float(streamed.upper)) and streamed.upper_method == "none"
    # the same Krylov steps from the same seed (in float64 for either dtype): the ends differ
    # by their rounding margins, and by the rounding of the ends to the input's dtype
    low = float(streamed.lower)
    tol = width_tolerance(X.double(), params.to(dtype=D64), low, masked=masked)
    tol += 8 * torch.finfo(dtype).eps
    rs, rt = float(stored.ratio_prob), float(streamed.ratio_prob)
    assert abs(rt - rs) <= tol * rs


def test_rotary_layer_streams_with_a_certified_bracket(gen):
    params = _layer(gen, rope=True)
    X = torch.randn(80, 12, generator=gen, dtype=D64)
    stored = local_lipschitz(X, params, masked=True, path="stored")
    streamed = local_lipschitz(X, params, masked=True, path="streaming")
    assert _overlap(stored, streamed)
    assert float(streamed.ratio_prob) <= 1.05 * (1 + BRACKET_MARGIN)


# ------------------------------------------------------------------------- choosing the path
def test_auto_path_follows_the_fixed_memory_rule(gen):
    params = _layer(gen)
    X = torch.randn(40, 12, generator=gen, dtype=D64)
    need = stored_bytes(40, 3, 1, D64, certify=True, weighted=False)
    assert need == 2 * 3 * 40 * 40 * 8
    small = local_lipschitz(X, params, memory_budget=need - 1, method="lanczos")
    big = local_lipschitz(X, params, memory_budget=need, method="lanczos")
    assert (small.path, big.path) == ("streaming", "stored")
    # what only the stored path has keeps it under "auto", whatever the budget
    assert local_lipschitz(X, params, memory_budget=1, method="dense").path == "stored"
    assert local_lipschitz(X, params, memory_budget=1, upper="gram", method="dense").path == (
        "stored"
    )
    # the block certificate has a streaming form (docs/certificates.md §5.4): it streams too
    assert local_lipschitz(X, params, memory_budget=1, upper="block").path == "streaming"
    # float32 certified calls count the float64 copies
    assert stored_bytes(40, 3, 2, torch.float32, certify=True, weighted=True) == (
        2 * 2 * 3 * 40 * 40 * (4 + 8) * 2
    )


@pytest.mark.parametrize("radius", [100.0, 300.0])
def test_auto_path_streams_where_the_stored_margins_miss_the_width(gen, radius):
    """At large logits the stored rounding margins are the wider (docs/rounding.md §11.1): where
    they make the width unreachable, "auto" runs the streaming call too and keeps the narrower
    bracket, with the block end the stored call had. R = 100: only the streaming bracket reaches
    1.05; R = 300: neither does, and the stored lower end is 0."""
    params = _layer(gen)
    X = radius * torch.randn(160, 12, generator=gen, dtype=D64)
    stored = local_lipschitz(X, params, masked=True, path="stored")
    assert stored.width_reachable is not None and not bool(stored.width_reachable)  # premise
    auto = local_lipschitz(X, params, masked=True)
    streamed = local_lipschitz(X, params, masked=True, path="streaming", upper="block")
    assert auto.path == "streaming" and auto.upper_method == "block"
    for name in ("value", "lower", "upper", "upper_prob", "n_iter", "width_reachable"):
        assert torch.equal(getattr(auto, name), getattr(streamed, name)), name  # the same call
    assert float(auto.ratio_prob) < float(stored.ratio_prob)
    assert _overlap(stored, auto) and float(auto.lower) <= float(stored.upper)
    if radius == 100.0:
        assert bool(auto.width_reachable) and float(auto.ratio_prob) <= 1.05 * (1 + BRACKET_MARGIN)
    # where the stored bracket reaches the width, "auto" is the stored call, unchanged
    small = X / radius
    kept = local_lipschitz(small, params, masked=True)
    again = local_lipschitz(small, params, masked=True, path="stored")
    assert kept.path == "stored" and bool(kept.width_reachable)
    assert torch.equal(kept.lower, again.lower) and torch.equal(kept.upper_prob, again.upper_prob)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(method="dense"), "method='dense'"),
        (dict(upper="gram"), "upper='gram'"),
        (dict(geometry="split"), "geometry='split'"),
        (dict(start="kronecker"), "start='kronecker'"),
        (dict(path="flash"), "path must be"),
        (dict(memory_budget=0), "memory_budget"),
    ],
)
def test_streaming_refusals_are_one_line(gen, kwargs, match):
    params = _layer(gen)
    X = torch.randn(10, 12, generator=gen, dtype=D64)
    kw = {"path": "streaming", **kwargs}
    with pytest.raises(ValueError, match=match) as err:
        local_lipschitz(X, params, **kw)
    assert "\n" not in str(err.value)


def test_uncertified_streaming_estimate(gen):
    params = _layer(gen)
    X = torch.randn(50, 12, generator=gen, dtype=D64)
    est = local_lipschitz(X, params, path="streaming", certify=False)
    ref = local_lipschitz(X, params, path="stored", certify=False)
    assert est.path == "streaming" and est.upper_prob is None
    # both converged on the residual rule (tol 1e-6): each within that of sigma_1
    assert abs(float(est.value) - float(ref.value)) <= 2 * F64_LANCZOS_COARSE * float(ref.value)
