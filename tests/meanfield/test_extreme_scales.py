"""Value and output factors that are extreme on their own but moderate together (docs/rounding.md §5).

A layer depends on ``V_h`` and ``W_h`` only through ``W_h V_h``; with ``V = s I`` and
``W_O = I / s`` at ``s = 1e±160`` the constant is about 1.3, yet the block certificate squared
rows of ``V_h`` (``1e320``) or the Gram matrix of ``W_h`` and returned ``upper = inf`` for
``method="lanczos"``, ``"power"`` and every ``upper="block"`` call. The certificate now runs on
factors rebalanced by exact powers of two, ``2^-k V_h`` and ``2^k W_h``. References: the dense
float64 estimate and the 50-digit oracle of tests/mpmath_oracle.py.
"""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
import torch

from meanfield.jacobian import block_norm_bounds, linearize
from meanfield.lipschitz import local_lipschitz
from meanfield.measures import DiracMeasure
from meanfield.params import AttentionParams, MultiHeadParams, RotaryEmbedding
from tests import mpmath_oracle as oracle
from tests.adversarial_instances import balanced_extremes
from tests.mpmath_oracle import DPS

from ..tolerances import F64_LANCZOS_COARSE, F64_REDUCTION

D64 = torch.float64
X_NP = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.5], [0.3, -0.7]])
A_NP = np.array([[0.5, -0.2], [0.1, 0.3]])
WEIGHTS = np.array([0.1, 0.2, 0.3, 0.4])
#: The block bound's usual distance to the value on small layers (it is 1.23 here).
RATIO = 20.0


def _layer(s: float) -> MultiHeadParams:
    eye = torch.eye(2, dtype=D64)
    return MultiHeadParams((AttentionParams(torch.tensor(A_NP), s * eye),), W_O=eye / s)


def _exact(s: float, weights=None, geometry="euclidean"):
    V, W = (s * torch.eye(2, dtype=D64)).numpy(), (torch.eye(2, dtype=D64) / s).numpy()
    J = oracle.jacobian(X_NP, [(A_NP, V, W)], weights=weights, geometry=geometry)
    return oracle.spectral_norm(J)


def _check(est, dense_value: float, exact, tag: str) -> None:
    lo, val, up = float(est.lower), float(est.value), float(est.upper)
    tag = f"{tag}: lower={lo!r} value={val!r} upper={up!r} dense={dense_value!r}"
    assert math.isfinite(up), tag
    assert lo <= up, tag
    assert up / val <= RATIO, tag
    assert lo <= dense_value <= up, tag
    if exact is not None:
        assert mp.mpf(lo) <= exact <= mp.mpf(up), tag + f" exact={mp.nstr(exact, 20)}"


@pytest.mark.parametrize("upper", ["auto", "block"])
@pytest.mark.parametrize("method", ["lanczos", "power", "auto"])
@pytest.mark.parametrize("s", [1e160, 1e-160])
def test_extreme_value_and_output_factors_keep_a_finite_upper(s, method, upper):
    X = torch.tensor(X_NP)
    p = _layer(s)
    est = local_lipschitz(X, p, method=method, upper=upper)
    dense = local_lipschitz(X, p, method="dense")
    _check(est, float(dense.value), _exact(s), f"s={s:g} {method} upper={upper}")
    # the lower end and the value are those of the same layer at s = 1
    ref = local_lipschitz(X, _layer(1.0), method=method, upper=upper)
    # s*I and I/s round the inputs of the two runs differently, so their iterations may stop a
    # step apart: Lanczos spans the whole space (n d = 8), its value is sigma_max to rounding;
    # power iteration stops on the residual rule (tol 1e-6 on sigma^2), within tol / 2 on sigma
    rtol = 5e-7 if method == "power" else 1e-12
    assert float(est.value) == pytest.approx(float(ref.value), rel=rtol)
    assert float(est.lower) == pytest.approx(float(ref.lower), rel=rtol)
    # the block bound reads the layer only, not the run's vector
    assert float(est.upper) == pytest.approx(float(ref.upper), rel=F64_REDUCTION)


@pytest.mark.parametrize("method", ["lanczos", "power", "auto"])
@pytest.mark.parametrize("s", [1e160, 1e-160])
def test_extreme_factors_on_a_weighted_measure_in_the_wasserstein_geometry(s, method):
    mu = DiracMeasure(torch.tensor(X_NP), torch.tensor(WEIGHTS))
    p = _layer(s)
    est = local_lipschitz(mu, p, geometry="wasserstein", method=method, upper="block")
    dense = local_lipschitz(mu, p, geometry="wasserstein", method="dense")
    exact = _exact(s, weights=WEIGHTS, geometry="wasserstein")
    _check(est, float(dense.value), exact, f"wasserstein s={s:g} {method}")


@pytest.mark.parametrize("s", [1e160, 1e-160])
def test_auto_resolving_to_lanczos_keeps_a_finite_upper(s):
    """n * d > 1500: "auto" runs Lanczos with the block certificate (upper="auto")."""
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(760, 2, generator=gen, dtype=D64)
    p = _layer(s)
    est = local_lipschitz(X, p)
    assert est.method == "lanczos" and est.upper_method == "block"
    dense = local_lipschitz(X, p, method="dense")
    _check(est, float(dense.value), None, f"n=760 s={s:g}")


def test_extreme_factors_of_a_rotary_head_keep_a_finite_upper():
    """The structured bounds of rotary heads read the same factors."""
    X = torch.tensor(X_NP)
    Q = torch.tensor([[0.5, -0.2], [0.1, 0.3]], dtype=D64)
    K = torch.tensor([[1.0, 0.2], [-0.3, 0.7]], dtype=D64)
    eye = torch.eye(2, dtype=D64)
    rope = RotaryEmbedding(torch.tensor([0.3], dtype=D64))
    for s in (1e160, 1e-160):
        p = MultiHeadParams(
            (AttentionParams(None, s * eye, Q=Q, K=K, rope=rope), AttentionParams(None, eye, Q=Q, K=K)),
            W_O=torch.cat([eye / s, eye], dim=1),
        )  # fmt: skip
        heads = [
            ((Q.numpy(), K.numpy()), (s * eye).numpy(), (eye / s).numpy(), None, ([0.3], 1.0, None)),
            ((Q.numpy(), K.numpy()), eye.numpy(), eye.numpy()),
        ]  # fmt: skip
        exact = oracle.spectral_norm(oracle.jacobian(X_NP, heads))
        dense = local_lipschitz(X, p, method="dense")
        for method in ("lanczos", "power"):
            est = local_lipschitz(X, p, method=method)
            _check(est, float(dense.value), exact, f"rotary s={s:g} {method}")


# ------------------------------------------------------------------ the rebalancing itself
def test_rebalancing_is_exact_and_leaves_moderate_layers_alone():
    from meanfield.jacobian.head_rows import _balance_exponents, _balanced_params

    p = _layer(1e160)
    scal = _balance_exponents(p)
    ((k, V2, W2),) = scal.values()
    assert k > 0
    assert torch.equal(torch.ldexp(V2, torch.tensor(k)), p.heads[0].V)
    assert torch.equal(torch.ldexp(W2, torch.tensor(-k)), p.W_O)
    assert torch.equal(W2 @ V2, p.W_O @ p.heads[0].V)  # the product, and so the layer, as stored
    # factors within 2**64 of balance are used as stored (bit-identical bounds as before)
    moderate = MultiHeadParams(
        (AttentionParams(torch.tensor(A_NP), 1e9 * torch.eye(2, dtype=D64)),),
        W_O=torch.eye(2, dtype=D64) * 1e-9,
    )
    assert _balanced_params(moderate)[0] is moderate
    # concatenated heads have no W_h to trade against
    concat = MultiHeadParams(
        (AttentionParams(torch.tensor(A_NP), 1e160 * torch.eye(2, dtype=D64)),)
    )
    assert _balanced_params(concat)[0] is concat


def test_inexact_rebalancing_is_refused_and_the_bracket_still_holds():
    """A V entry that the scaling would push below the normal range: no scaling is exact enough
    (the bound may stay infinite), and the bracket holds against the 50-digit reference."""
    from meanfield.jacobian.head_rows import _balance_exponents

    V = torch.tensor([[1e160, 1e-300], [0.0, 2e160]], dtype=D64)
    W = torch.tensor([[1e-160, 0.0], [3e-161, 1e-160]], dtype=D64)
    p = MultiHeadParams((AttentionParams(torch.tensor(A_NP), V),), W_O=W)
    for k, V2, W2 in _balance_exponents(p).values():
        assert torch.equal(torch.ldexp(V2, torch.tensor(k)), V)
        assert torch.equal(torch.ldexp(W2, torch.tensor(-k)), W)
    exact = oracle.spectral_norm(oracle.jacobian(X_NP, [(A_NP, V.numpy(), W.numpy())]))
    for method in ("lanczos", "power"):
        est = local_lipschitz(torch.tensor(X_NP), p, method=method)
        lo, up = float(est.lower), float(est.upper)
        assert lo <= up and mp.mpf(lo) <= exact <= mp.mpf(up), (method, lo, up)


def test_block_bounds_of_rebalanced_factors_hold_on_the_stored_attention():
    """Block by block, against the Jacobian formula on the stored P in 50 digits
    (tests/meanfield/test_block_rounding.py), on two factored heads with extreme factors."""
    from tests.meanfield.test_block_rounding import reference_blocks

    for seed in range(4):
        rng = np.random.default_rng(seed)
        n, d = int(rng.integers(2, 6)), int(rng.integers(2, 4))
        X = rng.standard_normal((n, d)) * 10 ** rng.uniform(0, 1)
        heads, blocks = [], []
        for _ in range(2):
            k = int(rng.integers(1, d + 1))
            V, W = balanced_extremes(rng, rng.standard_normal((d, d)), rng.standard_normal((d, d)))
            heads.append((rng.standard_normal((k, d)), rng.standard_normal((k, d)) / d, V))
            blocks.append(W)
        inst = dict(X=X, heads=heads, W_O=np.concatenate(blocks, axis=1), c=None, weights=None,
                    masked=bool(rng.integers(2)), geometry="euclidean")  # fmt: skip
        t = lambda a: torch.tensor(a, dtype=D64)  # noqa: E731
        params = MultiHeadParams(
            tuple(AttentionParams(None, t(V), Q=t(Q), K=t(K)) for Q, K, V in heads),
            W_O=t(inst["W_O"]),
        )
        lin = linearize(t(X), params, masked=inst["masked"])
        with mp.workdps(DPS):
            ref = reference_blocks(inst, lin)
            for ambient in (False, True):
                N = block_norm_bounds(lin, ambient=ambient).numpy()
                assert np.isfinite(N).all(), f"seed={seed} ambient={ambient}"
                for i, row in enumerate(ref):
                    for j, exact in enumerate(row):
                        assert mp.mpf(float(N[i, j])) >= exact, (seed, ambient, i, j)


@pytest.mark.parametrize("seed", range(6))
def test_bracket_holds_against_mpmath_on_heads_with_extreme_factors(seed):
    """The rigour suite's two-factored-head instances (tests/meanfield/test_rigour.py) with each head's
    V_h and W_h scaled apart by up to 1e±300 (tests/adversarial_instances.py)."""
    from tests.meanfield.test_rigour import check_instance, make_instance

    inst = make_instance(seed * 9 + 7, kind="heads")
    rng = np.random.default_rng(seed)
    d = inst["X"].shape[1]
    V, W = list(inst["V"]), inst["W_O"].copy()
    for h in range(2):
        V[h], W[:, h * d : (h + 1) * d] = balanced_extremes(rng, V[h], W[:, h * d : (h + 1) * d])
    inst = dict(inst, V=V, W_O=W)
    check_instance(inst)
    est = local_lipschitz(*_inputs(inst), method="lanczos", upper="block")
    assert math.isfinite(float(est.upper)) and float(est.upper) / float(est.value) <= RATIO


def _inputs(inst):
    from tests.meanfield.test_rigour import _torch_inputs

    x, params, _ = _torch_inputs(inst)
    return x, params


def test_block_bound_ratio_is_the_same_on_a_grid_of_factor_scales():
    """V ~ 10^a, W ~ 10^b, |a|, |b|, |a + b| <= 300: the same certified bracket up to 10^(a+b)."""
    X = torch.tensor(X_NP)
    V0 = torch.tensor([[1.0, 0.3], [-0.4, 0.8]], dtype=D64)
    W0 = torch.tensor([[0.7, -0.1], [0.2, 1.1]], dtype=D64)
    ratios = []
    for a in (-300, -150, 0, 150, 300):
        for b in (-300, -150, 0, 150, 300):
            if abs(a + b) > 300:
                continue
            p = MultiHeadParams(
                (AttentionParams(torch.tensor(A_NP), V0 * 10.0**a),), W_O=W0 * 10.0**b
            )
            est = local_lipschitz(X, p, method="power", upper="block")
            exact = oracle.spectral_norm(
                oracle.jacobian(X_NP, [(A_NP, p.heads[0].V.numpy(), p.W_O.numpy())])
            )
            lo, up = float(est.lower), float(est.upper)
            assert mp.mpf(lo) <= exact <= mp.mpf(up), (a, b, lo, up)
            ratios.append(up / float(est.value))
    assert max(ratios) <= RATIO and max(ratios) / min(ratios) < 1 + F64_LANCZOS_COARSE, ratios
