"""`meanfield lipschitz`: each mode against direct calls and independent dense oracles."""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pytest
import torch
from torch.func import jacrev

from experiments import inputs
from experiments.engine import load_json
from meanfield import AttentionParams, MultiHeadParams, local_lipschitz
from meanfield_cli.commands import lipschitz as lipschitz_cli

from ..tolerances import (
    F64_LANCZOS,
    F64_LANCZOS_GAP,
    F64_REDUCTION,
    F64_ROUND_TRIP,
    F64_TWO_JACOBIANS,
)


def parse(*argv: str) -> argparse.Namespace:
    """Parse ``meanfield lipschitz ARGV`` with a parser holding only this subcommand."""
    parser = argparse.ArgumentParser(prog="meanfield")
    sub = parser.add_subparsers(dest="command", required=True)
    lipschitz_cli.register(sub)
    return parser.parse_args(["lipschitz", *argv])


def run(*argv: str) -> dict:
    args = parse(*argv)
    doc = args.handler(args)
    json.dumps(doc)  # JSON-serialisable as returned
    return doc


def dense_norm(fn, X: torch.Tensor) -> float:
    """Spectral norm of the autograd Jacobian of ``fn`` at ``X`` (independent oracle)."""
    J = jacrev(fn)(X).reshape(-1, X.numel())
    return float(torch.linalg.matrix_norm(J, ord=2))


def naive_layer(X, A, V, W_O, c, masked):
    """Multi-head attention written out from the score convention x_i^T A_h x_j + c_h^T x_j."""
    n = X.shape[0]
    outs = []
    for h in range(A.shape[0]):
        logits = X @ A[h] @ X.T + (X @ c[h])[None, :]
        if masked:
            logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
        outs.append(torch.softmax(logits, dim=-1) @ X @ V[h].T)
    return torch.cat(outs, dim=-1) @ W_O.T


def test_random_mode_matches_direct_call_and_dense_oracle():
    doc = run(
        "--random-d",
        "3",
        "--heads",
        "2",
        "--n",
        "5",
        "--R",
        "2.5",
        "--seed",
        "4",
        "--masked",
        "--method",
        "lanczos",
        "--tol",
        "1e-10",
    )
    assert doc["mode"] == "random" and doc["masked"] is True and (doc["n"], doc["d"]) == (5, 3)
    (row,) = doc["inputs"]
    params, _ = inputs.random_layer(3, 2, 4, torch.float64, "cpu")
    X = torch.from_numpy(inputs.random_tokens(5, 3, 2.5, 4))
    assert math.isclose(float(X.norm(dim=-1).max()), 2.5, rel_tol=F64_REDUCTION)
    assert math.isclose(row["max_radius"], 2.5, rel_tol=F64_REDUCTION)
    est = local_lipschitz(X, params, masked=True, method="lanczos", tol=1e-10, seed=4)
    assert row["value"] == float(est.value) and row["upper"] == float(est.upper)
    assert row["n_matvec"] == int(est.n_matvec) and row["converged"]
    # independent oracle: dense autograd Jacobian of the naive layer
    A = torch.stack([h.A for h in params.heads])
    V = torch.stack([h.V for h in params.heads])
    exact = dense_norm(
        lambda Y: naive_layer(Y, A, V, params.W_O, torch.zeros(2, 3, dtype=torch.float64), True), X
    )
    assert row["value"] == pytest.approx(exact, rel=F64_LANCZOS_GAP)
    assert row["lower"] <= exact <= row["upper"]
    assert row["ratio"] == pytest.approx(row["upper"] / row["lower"])


def test_input_file_mode_uses_the_score_convention(tmp_path, rng):
    B, n, d, H, dv = 2, 4, 3, 2, 2
    A = rng.standard_normal((H, d, d))
    V = rng.standard_normal((H, dv, d))
    W_O = rng.standard_normal((d, H * dv))
    c = rng.standard_normal((H, d))
    X = rng.standard_normal((B, n, d))
    np.save(tmp_path / "X.npy", X)
    np.savez(tmp_path / "P.npz", A=A, V=V, W_O=W_O, c=c)
    out = tmp_path / "res.json"
    doc = run(
        "--input",
        str(tmp_path / "X.npy"),
        "--params",
        str(tmp_path / "P.npz"),
        "--unmasked",
        "--released",
        "--out",
        str(out),
    )
    assert doc["mode"] == "input" and len(doc["inputs"]) == B and not doc["masked"]
    t = torch.from_numpy
    params = MultiHeadParams(
        tuple(AttentionParams(t(A[h]), t(V[h]), c=t(c[h])) for h in range(H)), W_O=t(W_O)
    )
    for b, row in enumerate(doc["inputs"]):
        Xb = t(X[b])
        est = local_lipschitz(Xb, params, masked=False)
        assert row["value"] == float(est.value) and row["lower"] == float(est.lower)

        def fn(Y):
            return naive_layer(Y, t(A), t(V), t(W_O), t(c), False)

        assert row["value"] == pytest.approx(dense_norm(fn, Xb), rel=F64_TWO_JACOBIANS)
        # released quantity sqrt(||J^T f(X)||), from the dense Jacobian
        J = jacrev(fn)(Xb).reshape(n * d, n * d)
        rel = float(torch.linalg.vector_norm(J.T @ fn(Xb).reshape(-1)).sqrt())
        assert row["released_metric"] == pytest.approx(rel, rel=F64_TWO_JACOBIANS)
    saved = load_json(out)
    assert saved["inputs"] == doc["inputs"] and saved["metadata"]["seed"] == 0
    assert doc["files"] == [str(out)]


def test_single_head_file_with_default_identity_values(tmp_path, rng):
    A = rng.standard_normal((3, 3))
    X = rng.standard_normal((5, 3))
    np.save(tmp_path / "X.npy", X)
    np.savez(tmp_path / "P.npz", A=A)
    doc = run(
        "--input",
        str(tmp_path / "X.npy"),
        "--params",
        str(tmp_path / "P.npz"),
        "--masked",
        "--geometry",
        "split",
    )
    est = local_lipschitz(
        torch.from_numpy(X),
        AttentionParams(torch.from_numpy(A), torch.eye(3, dtype=torch.float64)),
        masked=True,
        geometry="split",
    )
    assert doc["inputs"][0]["value"] == float(est.value)
    assert doc["source"]["V"] == "identity"


def test_printer(capsys):
    doc = run("--random-d", "2", "--n", "3", "--released")
    lipschitz_cli.show(doc)
    text = capsys.readouterr().out
    assert f"{doc['inputs'][0]['value']:.6g}" in text and "released" in text


def test_no_certify_prints_the_estimate_alone(capsys):
    argv = ("--random-d", "4", "--heads", "2", "--n", "30", "--method", "lanczos", "--tol", "1e-8")
    full = run(*argv)
    fast = run(*argv, "--no-certify")
    (r_full,), (r_fast,) = full["inputs"], fast["inputs"]
    assert r_fast["value"] == pytest.approx(r_full["value"], rel=F64_ROUND_TRIP)
    assert r_full["certified"] and not r_fast["certified"]
    assert r_fast["lower"] == 0 and math.isinf(r_fast["upper"])
    lipschitz_cli.show(fast)
    text = capsys.readouterr().out
    assert "(not certified)" in text and f"{r_fast['value']:.6g}" in text


def test_kronecker_start_option_matches_the_direct_call():
    argv = ("--random-d", "6", "--heads", "3", "--n", "40", "--masked", "--method", "lanczos")
    doc = run(*argv, "--tol", "1e-9", "--kronecker-start", "--seed", "2")
    assert doc["start"] == "kronecker"
    (row,) = doc["inputs"]
    params, _ = inputs.random_layer(6, 3, 2, torch.float64, "cpu")
    X = torch.from_numpy(inputs.random_tokens(40, 6, 1.0, 2))
    est = local_lipschitz(
        X, params, masked=True, method="lanczos", tol=1e-9, seed=2, start="kronecker"
    )
    assert row["value"] == float(est.value) and row["n_matvec"] == int(est.n_matvec)
    rand = run(*argv, "--tol", "1e-9", "--seed", "2")["inputs"][0]
    assert row["value"] == pytest.approx(rand["value"], rel=F64_LANCZOS_GAP)


@pytest.mark.parametrize(
    ("setup", "argv", "message"),
    [
        (None, ("--random-d", "3", "--n", "4", "--R", "-1"), "--R must be a positive number"),
        (None, ("--random-d", "0", "--n", "4"), "--random-d must be a positive integer"),
        (None, ("--random-d", "3"), "--n must be a positive integer"),
        (None, ("--random-d", "3", "--n", "4", "--tol", "0"), "--tol must be a positive number"),
        ("files", ("--input", "{d}/X.npy"), "--input needs the layer"),
        ("files", ("--input", "{d}/X.npy", "--params", "{d}/bad.npz"), "holds pickled objects"),
        ("files", ("--input", "{d}/X.npy", "--params", "{d}/P4.npz"), "the layer expects 4"),
        ("files", ("--input", "{d}/X.npy", "--params", "{d}/noA.npz"), "has no array 'A'"),
    ],
)
def test_bad_input_is_a_one_line_value_error(tmp_path, setup, argv, message):
    if setup == "files":
        np.save(tmp_path / "X.npy", np.zeros((4, 3)))
        np.savez(tmp_path / "bad.npz", A=np.array([{"x": 1}], dtype=object))
        np.savez(tmp_path / "P4.npz", A=np.eye(4))
        np.savez(tmp_path / "noA.npz", V=np.eye(3))
    args = parse(*(a.format(d=tmp_path) for a in argv))
    with pytest.raises(ValueError, match=message) as info:
        args.handler(args)
    assert "\n" not in str(info.value)


def test_missing_file_is_reported(tmp_path):
    args = parse("--input", str(tmp_path / "none.npy"), "--params", str(tmp_path / "none.npz"))
    with pytest.raises(FileNotFoundError, match="no such file"):
        args.handler(args)


@pytest.mark.slow
def test_model_mode_gpt2_random_matches_direct_pipeline():
    from experiments.corpora import corpus_token_ids
    from meanfield.models import hidden_states, params_from_hf, random_gpt2

    doc = run(
        "--model",
        "gpt2-random",
        "--n-layer",
        "1",
        "--layer",
        "0",
        "--n",
        "6",
        "--windows",
        "2",
        "--corpus",
        "pydoc",
        "--released",
    )
    assert doc["mode"] == "model" and doc["masked"] is True  # GPT-2 is causal
    assert [r["index"] for r in doc["inputs"]] == [0, 1]
    loaded = random_gpt2(0, n_layer=1)
    ids, _ = corpus_token_ids("pydoc", loaded.tokenizer)
    hs = hidden_states(loaded.model, None, ids, 0, 6, n_windows=2)
    params = params_from_hf(loaded.model, 0, map="heads+WO", dtype=torch.float64)
    for b, row in enumerate(doc["inputs"]):
        est = local_lipschitz(hs.X[b], params, masked=True)
        assert row["value"] == pytest.approx(float(est.value), rel=F64_LANCZOS)
        assert row["lower"] <= row["value"] <= row["upper"]
