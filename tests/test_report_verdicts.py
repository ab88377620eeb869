"""The verdicts of report.md: curve gaps against closed forms, and the opening claims table."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from experiments import real_data
from experiments.adversarial import SQRT_N_TOLERANCE, sqrt_n_consistent
from experiments.app import pipeline


def _row(config: str, c: float, alpha: float, pc: float = 0.445, pa: float = 0.25) -> dict:
    return {
        "config": config,
        "n_values": [2, 4, 8, 16, 32, 64, 96],
        "fit_released": {"c": c, "alpha": alpha},
        "paper_curve": {"c": pc, "alpha": pa},
    }


def test_curve_difference_is_the_largest_gap_on_the_measured_n():
    # 0.450 n^0.241 against 0.445 n^0.25: the ratio (0.45/0.445) n^-0.009 is monotone in n, so
    # the largest gap is at an end of the grid.
    r = _row("gpt2rand-L6", 0.450, 0.241)
    ends = [abs(0.450 / 0.445 * n ** (0.241 - 0.25) - 1.0) for n in (2.0, 96.0)]
    assert real_data.curve_difference(r) == pytest.approx(max(ends), rel=1e-12)
    assert real_data.curve_difference(_row("gpt2rand-L6", 0.445, 0.25)) == pytest.approx(0.0)
    assert real_data.curve_difference({**r, "paper_curve": None}) is None


def test_row_verdict_separates_the_papers_model_from_stand_ins():
    assert real_data.row_verdict(_row("gpt2rand-L6", 0.450, 0.241)) == "reproduced"
    # 10 % above the printed curve everywhere: beyond CURVE_TOLERANCE on the paper's own model
    assert real_data.CURVE_TOLERANCE < 0.1
    assert real_data.row_verdict(_row("gpt2rand-L6", 1.1 * 0.445, 0.25)) == "refuted"
    # the same numbers on another model are a stand-in, whatever the gap
    assert real_data.row_verdict(_row("minilm-L0", 0.445, 0.25)) == "stand-in"


def test_sqrt_n_constant_only_near_one_half():
    assert sqrt_n_consistent(0.5) and sqrt_n_consistent(0.5 + 0.9 * SQRT_N_TOLERANCE)
    assert not sqrt_n_consistent(0.27)  # the F4 worst case of the quick preset
    assert not sqrt_n_consistent(None) and not sqrt_n_consistent(math.nan)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    from experiments import synthetic
    from experiments import verify_bounds as vb

    root = tmp_path_factory.mktemp("verdicts")
    synthetic.run(root, "tiny", progress=False)
    vb.run(root, "tiny", progress=False, n_instances=12)
    return root


def test_claims_table_rows_and_verdicts(results):
    table = pipeline.claims_table(results)
    lines = table.splitlines()
    assert lines[0] == "## Verdict at a glance"
    rows = [ln for ln in lines if ln.startswith("| ") and not ln.startswith("| claim")]
    # synthetic (√n regime, mean field, large radius) and the bound verification (two rows);
    # no real-data or adversarial rows without their results
    assert len(rows) == 5
    verdicts = [ln.rstrip(" |").rsplit("| ", 1)[1].strip("*") for ln in rows]
    assert set(verdicts) <= set(pipeline.VERDICTS)
    assert "Real text" not in table and "Adversarial" not in table


def test_report_opens_with_the_verdict_table(results, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "results").symlink_to(results, target_is_directory=True)
    doc = {
        "preset": "tiny",
        "metadata": {"created": "now", "versions": {"torch": "x"}, "device": "cpu"},
        "total_seconds": 1.0,
        "experiments_seconds": 0.8,
        "figures_seconds": 0.2,
        "budget_seconds": None,
        "stages": {},
    }
    report = pipeline.render_report(out, doc)
    sections = [ln for ln in report.splitlines() if ln.startswith("## ")]
    assert sections[0] == "## Verdict at a glance"
    assert "experiments 1 s, figures 0 s" in report
    for spec in ("THEORY", "EXPERIMENTS", "DESIGN"):  # documents users do not have
        assert f"{spec}.md" not in report
