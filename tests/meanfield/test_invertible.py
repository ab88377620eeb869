"""Invertible residual attention: certified scale, fixed-point inversion, the DP failure, stage, CLI.

Oracles: the original input (inversion), Banach's a-posteriori bound, dense autograd Jacobians
and their SVD (certified scale), an independent numpy evaluation of the bound's formula, the
forward map of a found preimage (wrong preimages), and the saved files of a rerun.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy.special import lambertw
from torch.func import jacrev

from experiments import invertible as stage
from experiments.engine import load_json
from meanfield import (
    AttentionParams,
    L2AttentionParams,
    l2_self_attention,
    local_lipschitz_fn,
    self_attention,
)
from meanfield.invertible import (
    ResidualAttention,
    certified_lipschitz,
    check_contraction,
    contractive_scale,
    dot_product_lipschitz_upper,
    dot_product_tie_input,
    invert_fixed_point,
    l2_lipschitz_upper,
    residual_forward,
)
from meanfield_cli.main import main

from ..tolerances import (
    CERTIFIED_MARGIN,
    DIFFERS,
    F32_VALUE,
    F64_CLOSED_FORM,
    F64_LONG_CHAIN,
    F64_REWRITTEN,
    F64_ROUND_TRIP,
    F64_SOLVER,
    F64_TWO_JACOBIANS,
    F64_ZERO,
)

F64 = torch.float64


def l2_params(seed: int, D: int = 4, H: int = 2, *, W_O: bool = True, wq: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    k = D // H
    return L2AttentionParams(
        wq * torch.randn(H, D, k, generator=g, dtype=F64),
        torch.randn(H, D, k, generator=g, dtype=F64),
        torch.randn(D, D, generator=g, dtype=F64) / math.sqrt(D) if W_O else None,
    )


def dense_norm(fn, X: torch.Tensor) -> float:
    """Spectral norm of the autograd Jacobian of ``fn`` at ``X`` (independent of the toolkit)."""
    J = jacrev(lambda z: fn(z.reshape(X.shape)).reshape(-1))(X.reshape(-1))
    return float(torch.linalg.svdvals(J)[0])


def inputs_at(seed: int, n: int, D: int, R: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + seed)
    X = torch.randn(n, D, generator=g, dtype=F64)
    return R * X / torch.linalg.vector_norm(X, dim=-1).max()


# ----------------------------------------------------------------------------- certified bound
@pytest.mark.parametrize(
    ("D", "H", "W_O", "n"), [(4, 2, True, 4), (3, 1, False, 2), (6, 3, True, 7)]
)
def test_l2_bound_is_the_closed_form(D, H, W_O, n):
    p = l2_params(D + n, D, H, W_O=W_O)
    k = D // H
    q = [np.linalg.norm(p.W_Q[h].numpy(), 2) for h in range(H)]
    v = [np.linalg.norm(p.W_V[h].numpy(), 2) for h in range(H)]
    o = np.linalg.norm(p.W_O.numpy(), 2) if W_O else 1.0
    phi = lambertw((n - 1) / math.e).real
    naive = math.sqrt(n / k) * (1 + 4 * phi) * math.sqrt(sum(a**4 * b**2 for a, b in zip(q, v))) * o
    assert l2_lipschitz_upper(p, n) == pytest.approx(naive, rel=F64_LONG_CHAIN)
    assert l2_lipschitz_upper(p, n) >= naive  # the rounding margin only adds


@pytest.mark.parametrize(
    ("D", "H", "W_O", "n", "wq"), [(4, 2, True, 4, 1.0), (3, 1, False, 3, 3.0)]
)
def test_certified_scale_bounds_the_dense_jacobian_everywhere(D, H, W_O, n, wq):
    # The scaled map must have ||Dg(X)|| <= c at every input, whatever its norm (global bound).
    # Independent check: the SVD of the autograd Jacobian; and the toolkit's certified bracket.
    p = l2_params(7, D, H, W_O=W_O, wq=wq)
    c = 0.9
    block = ResidualAttention(p, contractive_scale(p, n, target=c))
    assert certified_lipschitz(block, n).bound == pytest.approx(c, rel=F64_REWRITTEN)
    worst = 0.0
    for seed in range(6):
        for R in (0.1, 1.0, 3.0, 30.0):
            X = inputs_at(seed, n, D, R)
            worst = max(worst, dense_norm(block.residual, X))
            est = local_lipschitz_fn(block.residual, X, method="dense")
            assert float(est.upper) < c
    # Kim's tight configuration of the softmax lemma: one token at 0, the others at squared
    # query distance 1 + W0((n-1)/e) in the first head's space (logit temperature included).
    t_star = 1 + lambertw((n - 1) / math.e).real
    WQ = p.W_Q[0]
    U, S, Vh = torch.linalg.svd(WQ)  # x^T W_Q has norm S[0] * |x| along U[:, 0]
    r = math.sqrt(t_star * math.sqrt(WQ.shape[1])) / float(S[0])
    X = torch.zeros(n, D, dtype=F64)
    X[1:] = r * U[:, 0]
    worst = max(worst, dense_norm(block.residual, X))
    assert worst < c


def test_unscaled_bound_dominates_a_search_for_large_jacobians():
    # Gradient ascent on ||Jv|| over inputs: the largest local constant found stays below the
    # certified bound of the unscaled map (which it would exceed if the bound were wrong).
    p = l2_params(3, 2, 1, wq=2.0)
    n = 3
    bound = l2_lipschitz_upper(p, n)
    g = torch.Generator().manual_seed(0)
    best = 0.0
    for start in range(4):
        X = (0.5 * (start + 1) * torch.randn(n, 2, generator=g, dtype=F64)).requires_grad_()
        opt = torch.optim.Adam([X], lr=0.05)
        for _ in range(60):
            J = jacrev(lambda z: l2_self_attention(z.reshape(n, 2), p).reshape(-1))(X.reshape(-1))
            loss = -torch.linalg.matrix_norm(J, ord=2)
            opt.zero_grad()
            loss.backward()
            opt.step()
        best = max(best, dense_norm(lambda z: l2_self_attention(z, p), X.detach()))
    assert 0 < best < bound


# ----------------------------------------------------------------------------- the inversion
@pytest.mark.parametrize("R", [0.5, 4.0, 50.0])
@pytest.mark.parametrize("target", [0.5, 0.95])
def test_l2_inversion_recovers_the_input(R, target):
    n, D = 5, 4
    p = l2_params(11, D, 2)
    block = ResidualAttention(p, contractive_scale(p, n, target=target))
    c = certified_lipschitz(block, n).bound
    for seed in range(3):
        x_true = inputs_at(seed, n, D, R)
        y = residual_forward(x_true, block)
        res = invert_fixed_point(y, block, max_iter=500, lipschitz=c)
        assert res.converged and res.status == "converged"
        # Banach a posteriori: ||x_k - x*|| <= r_k / (1 - c), plus the evaluation error
        err = float(torch.linalg.vector_norm(res.x - x_true))
        assert err <= (float(res.residuals[-1]) + 2 * res.eta) / (1 - c)
        assert err <= F64_SOLVER * max(1.0, float(torch.linalg.vector_norm(y)))
        # the observed contraction respects the certified constant (Banach's inequality)
        assert res.check is not None and res.check.holds
        assert res.check.n_informative >= 2
        assert res.check.max_ratio <= c
        assert res.rate <= c


def test_contraction_check_detects_a_violation():
    r = torch.tensor([1.0, 0.4, 0.3, 0.1], dtype=F64)
    ok = check_contraction(r, 0.8)
    assert ok.holds and ok.max_ratio == pytest.approx(0.75)
    bad = check_contraction(r, 0.5)
    assert not bad.holds and bad.max_excess == pytest.approx(0.25)
    # a step far below the rounding floor is not informative and gets the slack
    tiny = check_contraction(torch.tensor([1.0, 1e-17, 1e-17], dtype=F64), 0.5, eta=1e-16)
    assert tiny.holds and tiny.n_informative == 1


def test_float32_follows_the_input():
    n, D = 4, 4
    p = l2_params(2, D, 2)
    p32 = L2AttentionParams(p.W_Q.float(), p.W_V.float(), p.W_O.float())
    block = ResidualAttention(p32, contractive_scale(p32, n, target=0.5))
    x_true = inputs_at(0, n, D, 2.0).float()
    res = invert_fixed_point(block(x_true), block)
    assert res.x.dtype == torch.float32 and res.converged
    assert float(torch.linalg.vector_norm(res.x - x_true)) < F32_VALUE


# ----------------------------------------------------------------------------- dot product
def dp_head(seed: int, d: int = 4) -> AttentionParams:
    return stage.random_heads(seed, d=d, heads=2)[1]


def test_tie_input_local_constant_grows_like_r_squared():
    p = dp_head(0)
    n = 4
    prev = 0.0
    for R in (2.0, 4.0, 8.0, 16.0):
        tie = dot_product_tie_input(p, R, n)
        X = tie.X
        assert float(torch.linalg.vector_norm(X, dim=-1).max()) == pytest.approx(R)
        # the query at the origin attends uniformly (all its scores are zero)
        logits = X[0] @ p.A @ X.T
        assert torch.all(logits == 0)
        # its attention covariance is kappa R^2 w w^T
        m = X.mean(0)
        C = (X - m).T @ (X - m) / n
        torch.testing.assert_close(C, tie.kappa * R * R * torch.outer(tie.w, tie.w))
        norm = dense_norm(lambda Z: self_attention(Z, p), X)
        V_norm = float(torch.linalg.matrix_norm(p.V, ord=2))
        assert norm >= abs(tie.growth) - V_norm
        assert norm > prev
        prev = norm
    assert prev >= 0.5 * abs(tie.kappa * 16.0**2 * tie.lam)


def test_dp_ball_bound_is_the_triangle_form_and_holds_on_its_ball():
    p = dp_head(1)
    n, R0 = 4, 1.0
    A_n = float(torch.linalg.matrix_norm(p.A, ord=2))
    V_n = float(torch.linalg.matrix_norm(p.V, ord=2))
    theta = A_n * R0**2
    expected = V_n * (math.sqrt(n) * (1 + theta) + theta)
    got = dot_product_lipschitz_upper(p, n, R0)
    # the bound adds its rounding margin
    assert got == pytest.approx(expected, rel=CERTIFIED_MARGIN) and got >= expected
    block = ResidualAttention(p, contractive_scale(p, n, target=0.5, radius=R0))
    for seed in range(4):
        X = inputs_at(seed, n, 4, R0)
        assert dense_norm(block.residual, X) <= 0.5
    with pytest.raises(ValueError, match="no global Lipschitz bound"):
        certified_lipschitz(block, n)


@pytest.mark.parametrize(("seed", "R"), [(0, 16.0), (1, 8.0), (2, 16.0)])
def test_dp_inversion_fails_at_large_radius(seed, R):
    # Same construction as the stage: c = 0.5 certified on the ball of radius 1 only.
    n = 4
    p = dp_head(seed)
    block = ResidualAttention(p, contractive_scale(p, n, target=0.5, radius=1.0))
    x_true = dot_product_tie_input(p, R, n).X
    y = block(x_true)
    res = invert_fixed_point(y, block, max_iter=400, lipschitz=0.5)
    err = float(torch.linalg.vector_norm(res.x - x_true) / torch.linalg.vector_norm(x_true))
    assert not (res.converged and err < 1e-8)  # x* is not recovered
    if res.converged:
        # (the path to a wrong preimage may contract at every step: the check of the observed
        # ratios watches the path only, not injectivity)
        # a second preimage: x' != x* with x' + g(x') = y (the block is not injective)
        assert err > DIFFERS
        fwd = float(torch.linalg.vector_norm(block(res.x) - y))
        assert fwd <= F64_SOLVER * max(1.0, float(torch.linalg.vector_norm(y)))
    else:
        assert float(res.residuals[-50:].min()) > 1e-6
        assert res.check is not None and not res.check.holds  # observed ratios exceed c


def test_dp_failure_modes_both_occur_in_the_seeds_above():
    outcomes = set()
    for seed, R in ((0, 16.0), (1, 8.0), (2, 16.0)):
        case = stage.invert_case(seed, [R], max_iter=400)
        row = next(r for r in case["rows"] if r["map"] == "DP")
        outcomes.add(row["outcome"])
        assert row["spectral_radius"] > 1  # x* is a repelling fixed point of y - g
    assert outcomes == {"wrong preimage", "no convergence"}


def test_dp_inversion_recovers_inside_the_certified_ball():
    n = 4
    p = dp_head(0)
    block = ResidualAttention(p, contractive_scale(p, n, target=0.5, radius=1.0))
    x_true = dot_product_tie_input(p, 0.5, n).X
    res = invert_fixed_point(block(x_true), block, lipschitz=0.5)
    assert res.converged
    assert float(torch.linalg.vector_norm(res.x - x_true)) < F64_SOLVER


def test_bad_arguments():
    p = dp_head(0)
    with pytest.raises(ValueError, match="equal input and output width"):
        ResidualAttention(AttentionParams(torch.eye(3, dtype=F64), torch.ones(2, 3, dtype=F64)))
    with pytest.raises(ValueError, match="scale"):
        ResidualAttention(p, -1.0)
    with pytest.raises(ValueError, match="target"):
        contractive_scale(p, 4, target=1.0, radius=1.0)
    with pytest.raises(ValueError, match="global"):
        certified_lipschitz(ResidualAttention(l2_params(0)), 4, radius=1.0)
    with pytest.raises(ValueError, match="n must be"):
        dot_product_tie_input(p, 1.0, 1)


# ----------------------------------------------------------------------------- stage and CLI
def test_stage_tiny_schema_and_rerun_computes_nothing(tmp_path):
    files = stage.run(tmp_path, "tiny")
    assert sorted(f.name for f in files) == ["invertible.json", "invertible.npz"]
    data, doc = stage.load(tmp_path)
    cfg = stage.PRESETS["tiny"]
    shape = (len(cfg.seeds), len(cfg.radii))
    for m in stage.MAPS:
        assert data[f"{m}_residuals"].shape == (*shape, cfg.max_iter)
        assert data[f"{m}_outcome"].shape == data[f"{m}_local_lipschitz"].shape == shape
    assert len(doc["rows"]) == 2 * shape[0] * shape[1]
    s = stage.summary(tmp_path)
    assert s["maps"]["L2"]["all_recovered"] and s["maps"]["L2"]["banach_holds"]
    assert s["maps"]["DP"]["failures"] >= 1  # R = 16 in the tiny preset
    before = {f: f.read_bytes() for f in files}
    mtimes = {f: f.stat().st_mtime_ns for f in files}
    again = stage.run(tmp_path, "tiny")
    assert sorted(again) == sorted(files)
    assert {f: f.read_bytes() for f in files} == before
    assert {f: f.stat().st_mtime_ns for f in files} == mtimes
    section = stage.report_section(tmp_path, tmp_path / "figures")
    assert "figures/fig_invertible.png" in section and "| L2 | 16 |" in section
    # a changed setting recomputes
    stage.run(tmp_path, "tiny", radii=[1.0])
    assert load_json(tmp_path / "invertible" / "invertible.json")["metadata"]["config"][
        "radii"
    ] == [1.0]


def test_figure_draws_from_tiny_results_and_reports_missing(tmp_path):
    from meanfield_cli.pipeline import draw_all
    from paper_figs import fig_invertible

    stage.run(tmp_path / "res", "tiny")
    out = fig_invertible.draw(tmp_path / "res", tmp_path / "figs")
    assert {p.suffix for p in out} == {".pdf", ".png"}
    assert all(p.stat().st_size > 0 for p in out)
    status = draw_all(tmp_path / "empty", tmp_path / "figs2", only=["I"])
    assert status["I"]["status"] == "missing"


def test_cli_json_matches_a_direct_call(capsys):
    assert main(["invert", "--radius", "1", "16", "--iters", "120", "--json"]) == 0
    out = capsys.readouterr().out
    doc = json.loads(out)  # exactly one JSON object
    direct = stage.invert_case(0, [1.0, 16.0], max_iter=120)
    assert [r["outcome"] for r in doc["rows"]] == [r["outcome"] for r in direct["rows"]]
    for a, b in zip(doc["rows"], direct["rows"]):
        assert a["local_lipschitz"] == pytest.approx(b["local_lipschitz"], rel=F64_ROUND_TRIP)
        assert a["n_iter"] == b["n_iter"]
    assert doc["rows"][0]["outcome"] == "recovered"  # L2 at R = 1


def test_cli_bad_input_is_one_line(capsys):
    assert main(["invert", "--radius", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "meanfield: error: --radius must be positive numbers, got [0.0]"


def test_jacobian_blocks_and_row_sums_of_the_proof():
    # docs/derivations/invertible.md §2, steps 2-3, at unit temperature (W_Q = k^{1/4} I, V = I,
    # so the L2 map is M(V)_i = sum_j P_ij v_j with P_ij = softmax_j(-|v_i - v_j|^2)): the
    # autograd blocks equal the closed forms, and every block row sum is at most 1 + 4 phi.
    k, n = 3, 5
    eye = torch.eye(k, dtype=F64)
    p = L2AttentionParams((k**0.25 * eye)[None], eye[None])
    phi = lambertw((n - 1) / math.e).real
    g = torch.Generator().manual_seed(5)
    t_star = 1 + phi  # the lemma's equal-cost configuration: |v_i - v_0|^2 = 1 + phi
    tight = torch.zeros(n, k, dtype=F64)
    tight[1:, 0] = math.sqrt(t_star)
    for V in [torch.randn(n, k, generator=g, dtype=F64) * s for s in (0.3, 1.0, 3.0)] + [tight]:
        J = jacrev(lambda z: l2_self_attention(z, p))(V)  # (n, k, n, k)
        P = torch.softmax(-torch.cdist(V, V).square(), dim=-1)
        m = P @ V
        rows = []
        for i in range(n):
            Dv = V - m[i]
            C = (P[i, :, None, None] * Dv[:, :, None] * Dv[:, None, :]).sum(0)
            total = 0.0
            for l in range(n):
                if l == i:
                    block = P[i, i] * eye + 2 * C
                else:
                    block = P[i, l] * (eye + 2 * torch.outer(V[l] - m[i], V[i] - V[l]))
                torch.testing.assert_close(
                    J[i, :, l, :], block, rtol=F64_TWO_JACOBIANS, atol=F64_ZERO
                )
                total += float(torch.linalg.matrix_norm(block, ord=2))
            rows.append(total)
            # the softmax lemma: sum_l P_il |v_i - v_l|^2 <= phi (equality at the tight input)
            S = float((P[i] * (V[i] - V).square().sum(-1)).sum())
            assert S <= phi * (1 + F64_CLOSED_FORM)
        assert max(rows) <= 1 + 4 * phi
    P0 = torch.softmax(-torch.cdist(tight, tight).square(), dim=-1)[0]
    assert float((P0 * tight.square().sum(-1)).sum()) == pytest.approx(phi, rel=F64_CLOSED_FORM)
