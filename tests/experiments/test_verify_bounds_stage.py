"""Stage entry and command of the verification harness (stage.py, report.py and the command,
meanfield_cli/commands/verify_bounds.py).

Input checks, the experiment-module contract (presets, resume, schema, report section) and
``meanfield verify-bounds``, including its non-zero exit on a violated theorem.
"""

from __future__ import annotations

import argparse
import json

import pytest

from experiments import verify_bounds as vb
from experiments.engine import load_json, load_jsonl

from ..wrong_bounds import WRONG_UPPER


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
def tiny_results(run_tiny):
    return run_tiny(vb, "results")


def test_run_tiny_schema(tiny_results):
    root, files = tiny_results
    assert all(p.exists() and p.stat().st_size > 0 for p in files)
    doc = load_json(root / "verify_bounds" / "report.json")
    assert doc["kind"] == "verify_bounds"
    assert doc["metadata"]["config"]["preset"] == "tiny"
    assert doc["metadata"]["dtype"] == "float64" and doc["metadata"]["seed"] == 0
    assert doc["n_instances"] == vb.PRESETS["tiny"].n_instances
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

    monkeypatch.setattr(vb.sweep, "check_instance", boom)
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
    from meanfield_cli.commands import verify_bounds

    parser = argparse.ArgumentParser(prog="meanfield")
    verify_bounds.register(parser.add_subparsers(dest="command"))
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
    monkeypatch.setattr(vb.checks, "BOUNDS", vb.BOUNDS + (WRONG_UPPER,))
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
