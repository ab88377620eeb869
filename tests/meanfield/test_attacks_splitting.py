"""Mass splitting: G_k against exact W_2 of the attack, the split constant, the finite attack."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from meanfield import AttentionParams, DiracMeasure, attention
from meanfield.attacks import mass_splitting_attack, split_constant
from meanfield.distances import wasserstein, wasserstein_inf
from theory.bounds import split_gain

from ..oracles_attacks import F64, lw_norm, random_head
from ..tolerances import (
    ATTACK_BUDGET,
    BALL_PROJECTION,
    BRACKET_MARGIN,
    F64_CLOSED_FORM,
    F64_LANCZOS,
    F64_REDUCTION,
    F64_RERUN,
    F64_SMALL_DIFFERENCE,
    F64_SOLVER,
    F64_TWO_JACOBIANS,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ---------------------------------------------- splitting (docs/theory.md §10, §A5)
@pytest.mark.parametrize("k,R", [(1, 2.0), (2, 2.0), (5, 3.0), (20, 3.0), (60, 4.0), (400, 4.0)])
def test_split_gain_equals_exact_w2_ratio_of_the_attack(k, R):
    A = torch.tensor([[0.9, 0.5], [-0.3, 0.4]], dtype=F64)
    V = torch.tensor([[1.0, 0.2], [0.3, 0.7]], dtype=F64)
    u = torch.tensor([0.6, 0.8], dtype=F64)
    lam = float(u @ A @ u)
    y, z = 0.5 * R * u, R * u
    mu = DiracMeasure(y.unsqueeze(0))
    nu = DiracMeasure(torch.stack([y, z]), torch.tensor([1 - 1 / k, 1 / k], dtype=F64))
    params = AttentionParams(A, V)
    ratio = float(wasserstein(attention(nu, params), attention(mu, params))) / float(
        wasserstein(nu, mu)
    )
    d = z - y
    expect = float((V @ d).norm() / d.norm()) * float(split_gain(k, lam * R * R / 4))
    assert ratio == pytest.approx(expect, rel=F64_TWO_JACOBIANS)


def test_split_constant(rng):
    A, V = random_head(rng, 2)
    params = AttentionParams(A, V)
    mu = DiracMeasure(torch.tensor([[0.4, -0.7]], dtype=F64))
    assert float(split_constant(mu, params, method="jacrev")) == pytest.approx(
        float(torch.linalg.matrix_norm(V, ord=2)), rel=F64_REDUCTION
    )
    X = torch.tensor(rng.standard_normal((3, 2)))
    mu3 = DiracMeasure(X, torch.tensor([0.6, 0.3, 0.1], dtype=F64))
    ls = float(split_constant(mu3, params, method="jacrev"))
    # max(L_W, max_i ||V C_i A^T||) from the oracle
    lw = mu3.log_weights.numpy()
    L = X.numpy() @ A.numpy() @ X.numpy().T + lw
    P = np.exp(L - L.max(1, keepdims=True))
    P /= P.sum(1, keepdims=True)
    selfs = []
    for i in range(3):
        m = P[i] @ X.numpy()
        C = sum(P[i, j] * np.outer(X[j].numpy() - m, X[j].numpy() - m) for j in range(3))
        selfs.append(np.linalg.norm(V.numpy() @ C @ A.numpy().T, 2))
    assert ls == pytest.approx(max(lw_norm(mu3, A, V), max(selfs)), rel=F64_TWO_JACOBIANS)
    try:
        import meanfield.lipschitz  # noqa: F401
    except ImportError:
        return
    assert float(split_constant(mu3, params, method="engine")) == pytest.approx(ls, rel=F64_LANCZOS)


def _recompute(pert, mu, params):
    Fmu, Fnu = attention(mu, params), attention(pert.nu, params)
    w2 = float(wasserstein(Fnu, Fmu)) / float(wasserstein(pert.nu, mu))
    wi = float(wasserstein_inf(Fnu, Fmu)) / float(wasserstein_inf(pert.nu, mu))
    return w2, wi


def test_mass_splitting_attack_at_a_dirac():
    A = torch.tensor([[1.0, 0.2], [-0.1, -0.3]], dtype=F64)
    V = torch.tensor([[1.0, 0.3], [0.1, 0.9]], dtype=F64)
    params = AttentionParams(A, V)
    R = 4.0
    u = torch.tensor([1.0, 0.0], dtype=F64)
    mu = DiracMeasure((0.5 * R * u).unsqueeze(0))
    res = mass_splitting_attack(
        mu, params, 0.3, R=R, k_max=3, n_restarts=2, steps=40, insert_steps=20
    )
    V_norm = float(torch.linalg.matrix_norm(V, ord=2))
    perts = [res.move, res.split, res.insert, *res.split_by_k]
    for q in perts:
        w2, wi = _recompute(q, mu, params)
        assert q.ratio_w2 == pytest.approx(w2, rel=F64_RERUN)
        assert q.ratio_winf == pytest.approx(wi, rel=F64_RERUN)
        assert q.input_w2 <= q.cost_bound * (1 + F64_SMALL_DIFFERENCE)
        assert q.ratio_winf <= V_norm * (1 + F64_SMALL_DIFFERENCE)  # docs/theory.md §A5, at a Dirac
        assert torch.all(q.nu.points.norm(dim=-1) <= R * (1 + BALL_PROJECTION))
    # moving the whole Dirac: exactly ||V delta|| / ||delta|| <= ||V||
    delta = res.move.nu.points[0] - mu.points[0]
    assert res.move.ratio_w2 == pytest.approx(
        float((V @ delta).norm() / delta.norm()), rel=F64_SMALL_DIFFERENCE
    )
    assert res.split.ratio_w2 > 1.5 * res.move.ratio_w2 and res.gain > 1.5
    assert res.gain_winf < 1.5
    assert res.split.input_w2 == pytest.approx(0.3, rel=ATTACK_BUDGET)
    # inserting a token into a Dirac: the docs/theory.md §A6 plan is exact (one source atom)
    assert res.insert.input_w2 == pytest.approx(res.insert.cost_bound, rel=F64_SOLVER)
    assert math.isnan(res.duplicate[0].ratio_w2)  # duplicating the only atom changes nothing


def test_winf_ratio_at_a_dirac_is_at_most_V_norm(rng):
    # docs/theory.md §A5: for mu = delta_y and any nu, W_inf(F nu, F mu) <= ||V|| W_inf(nu, mu)
    for _ in range(20):
        A, V = random_head(rng, 2, scale=3.0)
        params = AttentionParams(A, V)
        y = torch.tensor(rng.standard_normal(2))
        mu = DiracMeasure(y.unsqueeze(0))
        Z = torch.tensor(rng.standard_normal((3, 2))) * 2
        nu = DiracMeasure(Z, torch.softmax(torch.tensor(rng.standard_normal(3) * 5), 0))
        ratio = float(wasserstein_inf(attention(nu, params), attention(mu, params))) / float(
            wasserstein_inf(nu, mu)
        )
        assert ratio <= float(torch.linalg.matrix_norm(V, ord=2)) * (1 + BRACKET_MARGIN)


def test_mass_splitting_attack_few_atoms_and_token_costs(rng):
    A, V = random_head(rng, 2)
    params = AttentionParams(A, V)
    X = torch.tensor([[1.0, 0.0], [-0.5, 0.5]], dtype=F64)
    mu = DiracMeasure(X)  # two uniform tokens
    res = mass_splitting_attack(
        mu, params, 0.2, R=1.5, k_max=2, atoms=[0], n_restarts=1, steps=20, insert_steps=10
    )
    for q in (res.move, res.split, res.insert, *res.duplicate):
        w2, wi = _recompute(q, mu, params)
        assert q.ratio_w2 == pytest.approx(w2, rel=F64_RERUN)
        assert q.ratio_winf == pytest.approx(wi, rel=F64_RERUN)
        assert q.input_w2 <= q.cost_bound * (1 + F64_SOLVER)
    # duplicating token i of n = 2 tokens: W2^2 = sum_j ||x_j - x_i||^2 / (n (n + 1)) exactly
    for i, q in enumerate(res.duplicate):
        bound = math.sqrt(float((X - X[i]).square().sum()) / 6)
        assert q.cost_bound == pytest.approx(bound, rel=F64_CLOSED_FORM)
        assert q.input_w2 == pytest.approx(bound, rel=F64_SOLVER)
        assert q.nu.n == 3 and float(q.nu.weights[-1]) == pytest.approx(1 / 3)


def test_token_plan_is_only_an_upper_bound():
    # docs/theory.md §A6 plan vs exact W2 (docs/derivations/mass_splitting.md counterexamples)
    X = torch.tensor([[0.0], [1.0], [2.0]], dtype=F64)
    mu = DiracMeasure(X)
    dup = DiracMeasure(torch.cat([X, X[:1]]), torch.tensor([0.25, 0.25, 0.25, 0.25], dtype=F64))
    assert float(wasserstein(mu, dup)) ** 2 == pytest.approx(0.25, rel=F64_SOLVER)  # plan: 5/12
    mu2 = DiracMeasure(X[:2])
    ins = DiracMeasure(X, torch.full((3,), 1 / 3, dtype=F64))
    assert float(wasserstein(mu2, ins)) ** 2 == pytest.approx(0.5, rel=F64_SOLVER)  # plan: 5/6


def test_attack_input_validation(rng):
    A, V = random_head(rng, 2)
    params = AttentionParams(A, V)
    mu = DiracMeasure(torch.zeros(1, 2, dtype=F64))
    with pytest.raises(ValueError, match="pass the radius"):
        mass_splitting_attack(mu, params, 0.1)
    with pytest.raises(ValueError, match="budget"):
        mass_splitting_attack(DiracMeasure(torch.ones(1, 2, dtype=F64)), params, -1.0)
    with pytest.raises(ValueError, match="unmasked"):
        mass_splitting_attack(
            DiracMeasure.from_sequence(torch.ones(2, 2, dtype=F64), causal=True), params, 0.1, R=2.0
        )


# ----------------------------------------------------------------------------- layering
def test_meanfield_attacks_does_not_import_theory():
    import subprocess
    import sys

    code = "import sys, meanfield.attacks; assert 'theory' not in sys.modules, 'theory imported'"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_import_meanfield_stays_light():
    import subprocess
    import sys

    code = (
        "import sys, meanfield, meanfield.attacks, meanfield.models, meanfield.data; "
        "bad = [m for m in ('theory', 'sympy', 'matplotlib', 'experiments', 'transformers') "
        "if m in sys.modules]; assert not bad, bad"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
