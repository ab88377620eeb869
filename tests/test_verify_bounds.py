"""Tests of the verification harness (experiments/verify_bounds.py).

The harness checks theory.bounds against the certified engine; these tests check the harness:
that it runs clean on a fast subset, that it does catch a wrong bound (theorem violations fail,
candidate failures are recorded as refutations), that its instances are reproducible, that its
own bound (THEORY.md §6.2, certified data-dependent) is a bound by an engine-free finite
difference check, and the experiment-module contract (presets, resume, schema, CLI).
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pytest

from experiments import verify_bounds as vb
from experiments.results import load_json, load_jsonl
from theory.bounds import certified_local_upper


def _upper_half_trivial(t: vb.Target) -> float | None:
    """Deliberately wrong 'upper bound' ||V_eff||/2 at equal tokens (the exact value is ||V_eff||
    unmasked, and at least that masked)."""
    if t.ctx.get("construction") != "equal_tokens":
        return None
    return 0.5 * t.ctx["V_eff_norm"]


def _lower_twice_construction(t: vb.Target) -> float | None:
    """Deliberately wrong 'lower bound': twice the eigenvector-construction value."""
    if t.ctx.get("construction") != "one_token" or t.ctx["masked"]:
        return None
    from theory import bounds

    return 2.0 * float(bounds.sqrt_n_lower(t.ctx["gamma"], t.ctx["n"], t.ctx["Vu_norm"]))


WRONG_UPPER = vb.BoundSpec("wrong_upper", "upper", "theorem", "test", _upper_half_trivial)
WRONG_LOWER = vb.BoundSpec("wrong_lower", "lower", "theorem", "test", _lower_twice_construction)


@pytest.fixture(scope="module")
def fast_report() -> dict:
    """Two periods of the schedule: every kind at least twice (a few seconds)."""
    return vb.verify(2 * len(vb.SCHEDULE), seed=1, progress=False)


def test_fast_subset_runs_clean(fast_report):
    rep = fast_report
    assert rep["passed"], rep["violations"][:2]
    assert rep["n_theorem_violations"] == 0 and rep["violations"] == []
    assert set(rep["instances_by_kind"]) == set(vb.KINDS)
    core = [
        "sqrt_n_upper[sqrt3]",
        "sqrt_n_upper[triangle]",
        "certified_local",
        "mean_field_upper[c'=2]",
        "trivial_lower",
        "sequence_lower",
        "two_dirac_lower",
        "two_dirac_g",
        "two_dirac_half",
        "two_dirac_asymptote",
        "mean_field_lower",
        "off_axis_two_atom",
        "large_radius[limit+deviation]",
        "kim_softmax_lemma",
    ]
    for name in core:
        b = rep["bounds"][name]
        assert b["n_checked"] > 0, name
        assert b["min_margin"] >= 1.0 - vb.BOUND_RTOL, name
    # tightness is bound / value: >= 1 for upper bounds, <= 1 for lower bounds (certified
    # brackets are within 1e-10 relative of the value here)
    for name, b in rep["bounds"].items():
        if b["n_checked"] == 0 or b["status"] != "theorem":
            continue
        if b["side"] == "upper":
            assert b["tightness"]["min"] >= 1.0 - 1e-9, name
        elif b["side"] == "lower":
            assert b["tightness"]["max"] <= 1.0 + 1e-9, name


def test_harness_catches_a_wrong_theorem():
    rep = vb.verify(
        2 * len(vb.SCHEDULE),
        seed=1,
        kinds=["equal_tokens", "construction"],
        progress=False,
        extra_bounds=[WRONG_UPPER, WRONG_LOWER],
    )
    assert not rep["passed"]
    names = {v["name"] for v in rep["violations"]}
    assert names == {"wrong_upper", "wrong_lower"}
    assert rep["bounds"]["wrong_upper"]["n_violations"] == rep["bounds"]["wrong_upper"]["n_checked"]
    v = next(v for v in rep["violations"] if v["name"] == "wrong_upper")
    inst = v["instance"]
    for key in ("seed", "index", "kind", "d", "n", "R", "masked", "heads", "X"):
        assert key in inst
    assert v["bound"] < v["lower"]
    # the instance is reproducible from (seed, index, kind): same bracket
    t = vb.make_targets(inst["seed"], inst["index"], inst["kind"])[v["target_index"]]
    assert (t.lower, t.value, t.upper) == (v["lower"], v["value"], v["upper"])
    np.testing.assert_array_equal(t.ctx["X"], inst["X"])
    # the genuine bounds on the same instances still hold
    assert rep["bounds"]["trivial_lower"]["n_violations"] == 0
    assert rep["bounds"]["sqrt_n_lower"]["n_violations"] == 0


def test_a_failing_candidate_is_a_finding_not_a_failure():
    wrong = vb.BoundSpec("wrong_candidate", "upper", "candidate", "test", _upper_half_trivial)
    rep = vb.verify(10, seed=2, kinds=["equal_tokens"], progress=False, extra_bounds=[wrong])
    assert rep["passed"]
    c = rep["candidates"]["wrong_candidate"]
    assert c["verdict"] == "refuted" and c["n_refuted"] == c["n_checked"] == 10
    assert c["min_margin"] < 1 and c["examples"]


def test_exponent_probe_is_refuted_by_two_diracs():
    """c' = 1/2 must fail where sup g ~ gamma e^{gamma/2} with gamma = 2||A||R^2 (A = -aI)."""
    rep = vb.verify(30, seed=3, kinds=["two_dirac"], progress=False)
    assert rep["passed"]
    assert rep["candidates"]["mean_field_upper[c'=1/2]"]["verdict"] == "refuted"
    assert rep["candidates"]["mean_field_upper[c'=1]"]["verdict"] == "survived"


def test_instances_are_reproducible():
    a = vb.make_targets(7, 11, "two_dirac")
    b = vb.make_targets(7, 11, "two_dirac")
    assert [(t.label, t.lower, t.upper) for t in a] == [(t.label, t.lower, t.upper) for t in b]
    c = vb.make_targets(8, 11, "two_dirac")
    assert [t.upper for t in a] != [t.upper for t in c]


def _naive_attention(X: np.ndarray, heads, masked: bool) -> np.ndarray:
    """Independent numpy attention: sum_h W_h V_h sum_j P_ij x_j (column convention)."""
    n = X.shape[0]
    out = 0.0
    for A, V, W in heads:
        S = X @ A @ X.T
        if masked:
            S = np.where(np.tril(np.ones((n, n), bool)), S, -np.inf)
        P = np.exp(S - S.max(1, keepdims=True))
        P /= P.sum(1, keepdims=True)
        WV = V if W is None else W @ V
        out = out + P @ X @ WV.T
    return out


@pytest.mark.parametrize("masked", [False, True])
def test_certified_local_bound_dominates_finite_differences(rng, masked):
    for _ in range(6):
        d, n = int(rng.integers(1, 4)), int(rng.integers(2, 6))
        H = int(rng.integers(1, 3))
        WO = rng.standard_normal((d, H * d)) if H > 1 else None
        heads = [
            (
                rng.standard_normal((d, d)),
                rng.standard_normal((d, d)),
                None if WO is None else WO[:, h * d : (h + 1) * d],
            )
            for h in range(H)
        ]
        X = 1.5 * rng.standard_normal((n, d))
        x0, h = X.ravel(), 1e-6
        J = np.stack(
            [
                (
                    _naive_attention((x0 + h * e).reshape(n, d), heads, masked)
                    - _naive_attention((x0 - h * e).reshape(n, d), heads, masked)
                ).ravel()
                / (2 * h)
                for e in np.eye(n * d)
            ],
            axis=1,
        )
        exact = np.linalg.norm(J, 2)
        assert certified_local_upper(X, heads, masked=masked) >= exact * (1 - 1e-6)


def test_certified_local_bound_closed_form_at_equal_tokens(rng):
    """Equal tokens: P has norm 1 (uniform rows), C_i = 0, so the bound is ||V|| exactly.

    The returned value adds the rounding margin of docs/rounding.md §8 (a few 1e-13 here).
    """
    A, V = rng.standard_normal((3, 3)), rng.standard_normal((2, 3))
    X = np.repeat(rng.standard_normal((1, 3)), 5, 0)
    got = certified_local_upper(X, [(A, V, None)])
    assert np.linalg.norm(V, 2) <= got <= np.linalg.norm(V, 2) * (1 + 1e-12)


def test_construction_gap_from_the_input_matches_the_attack(rng):
    """The harness computes gamma from X itself; meanfield.attacks computes it from eigenpairs."""
    import torch

    from meanfield.attacks import adversarial_sequence

    for _ in range(5):
        d = int(rng.integers(1, 4))
        A, V = rng.standard_normal((d, d)), rng.standard_normal((d, d))
        con = adversarial_sequence(
            torch.from_numpy(A), 1.7, 5, variant="symmetric", V=torch.from_numpy(V)
        )
        X = con.X.numpy()
        ctx = vb._construction_ctx(X, X[0], X[1], A, V)
        assert ctx["gamma"] == pytest.approx(con.gamma, rel=1e-12, abs=1e-12)
        assert ctx["Vu_norm"] == pytest.approx(np.linalg.norm(V @ con.u.numpy()), rel=1e-12)


def test_bad_input_raises():
    with pytest.raises(ValueError, match="n_instances"):
        vb.verify(0, progress=False)
    with pytest.raises(ValueError, match="unknown kind"):
        vb.verify(3, kinds=["nope"], progress=False)
    with pytest.raises(ValueError, match="unique"):
        vb.verify(3, progress=False, extra_bounds=[vb.BOUNDS[0]])
    with pytest.raises(ValueError, match="unknown kind"):
        vb.make_targets(0, 0, "nope")


# ------------------------------------------------------------------ experiment contract
@pytest.fixture(scope="module")
def tiny_results(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    files = vb.run(root, "tiny", progress=False)
    return root, files


def test_run_tiny_schema(tiny_results):
    root, files = tiny_results
    assert all(p.exists() and p.stat().st_size > 0 for p in files)
    doc = load_json(root / "verify_bounds" / "report.json")
    assert doc["kind"] == "verify_bounds"
    assert doc["metadata"]["config"]["preset"] == "tiny"
    assert doc["metadata"]["dtype"] == "float64" and doc["metadata"]["seed"] == 0
    assert doc["n_instances"] == vb.PRESETS["tiny"]["n_instances"]
    assert doc["passed"] is True
    for name, b in doc["bounds"].items():
        assert {
            "side",
            "status",
            "source",
            "n_checked",
            "n_violations",
            "tightness",
            "min_margin",
            "by_theta",
            "worst",
        } <= set(b), name
        assert set(b["tightness"]) == {"min", "median", "max"}
    for c in doc["candidates"].values():
        assert c["verdict"] in ("survived", "refuted", "untested")
    s = vb.summary(root)
    json.dumps(s)
    assert s["passed"] is True and s["n_instances"] == doc["n_instances"]
    md = vb.report_section(root, root / "figures")
    assert md.startswith("## Verification") and "| `sqrt_n_upper[sqrt3]` |" in md


def test_run_resumes_without_recomputing(tiny_results, monkeypatch):
    root, _ = tiny_results
    n_records = len(load_jsonl(root / "verify_bounds" / "instances.jsonl"))

    def boom(*args, **kwargs):
        raise AssertionError("a finished instance was recomputed")

    monkeypatch.setattr(vb, "check_instance", boom)
    vb.run(root, "tiny", progress=False)
    assert len(load_jsonl(root / "verify_bounds" / "instances.jsonl")) == n_records


def test_run_rejects_bad_options(tmp_path):
    with pytest.raises(ValueError, match="unknown verify_bounds option"):
        vb.run(tmp_path, "tiny", progress=False, n_points=3)
    with pytest.raises(ValueError, match="unknown preset"):
        vb.run(tmp_path, "huge", progress=False)
    with pytest.raises(ValueError, match="CPU"):
        vb.run(tmp_path, "tiny", progress=False, device="cuda")
    with pytest.raises(FileNotFoundError, match="verify_bounds"):
        vb.summary(tmp_path)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="meanfield")
    vb.add_parser(parser.add_subparsers(dest="command"))
    return parser


def test_cli_writes_report(tmp_path, capsys):
    out = tmp_path / "rep.json"
    args = _parser().parse_args(
        [
            "verify-bounds",
            "--instances",
            "6",
            "--seed",
            "4",
            "--out",
            str(out),
            "--no-progress",
            "--kinds",
            "random_sequence,two_dirac",
        ]
    )
    doc = args.handler(args)
    assert doc["passed"] and out.exists()
    assert load_json(out)["n_instances"] == 6
    assert set(load_json(out)["instances_by_kind"]) == {"random_sequence", "two_dirac"}
    args.printer(doc)
    assert "PASSED" in capsys.readouterr().out


def test_cli_fails_loudly_on_a_violation(tmp_path, monkeypatch):
    monkeypatch.setattr(vb, "BOUNDS", vb.BOUNDS + (WRONG_UPPER,))
    out = tmp_path / "rep.json"
    args = _parser().parse_args(
        [
            "verify-bounds",
            "--instances",
            "3",
            "--kinds",
            "equal_tokens",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    with pytest.raises(RuntimeError, match="theorem violation"):
        args.handler(args)
    rep = load_json(out)  # the report with the full instances is written before failing
    assert rep["passed"] is False and rep["violations"][0]["instance"]["heads"]


# ------------------------------------------------------------------ slow: thousands of instances
@pytest.mark.slow
def test_thousands_of_instances_run_clean():
    rep = vb.verify(3000, seed=0, progress=False)
    assert rep["passed"], [(v["name"], v["index"], v["kind"]) for v in rep["violations"][:5]]
    assert rep["n_instances"] == 3000
    assert sum(b["n_checked"] for b in rep["bounds"].values()) > 20000
    assert rep["candidates"]["mean_field_upper[c'=1/2]"]["verdict"] == "refuted"
    # the THEORY.md §6.2 counterexample family is generated: the released quantity fails
    assert rep["known_invalid"]["released_data_dependent"]["n_fail"] > 0
    assert math.isfinite(rep["bounds"]["certified_local"]["tightness"]["median"])
