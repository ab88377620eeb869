"""The verdicts of report.md: the printed rules (experiments.verdicts), the rows that follow them,
the definitions under the table, and the released code's bound (docs/theory.md §2)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from experiments import adversarial, real_data, verdicts
from experiments.adversarial import SQRT_N_TOLERANCE, sqrt_n_consistent
from experiments.engine import write_json
from meanfield_cli import pipeline

from ..tolerances import BRACKET_MARGIN, F64_CLOSED_FORM, PRINTED_4_DECIMALS


def _row(config: str, c: float, alpha: float, pc: float = 0.445, pa: float = 0.25) -> dict:
    return {
        "config": config,
        "n_values": [2, 4, 8, 16, 32, 64, 96],
        "fit_released": {"c": c, "alpha": alpha},
        "paper_curve": {"c": pc, "alpha": pa},
    }


# ------------------------------------------------------------------------------ the rules
def test_curve_difference_is_the_largest_gap_on_the_measured_n():
    # 0.450 n^0.241 against 0.445 n^0.25: the ratio (0.45/0.445) n^-0.009 is monotone in n, so
    # the largest gap is at an end of the grid.
    r = _row("gpt2rand-L6", 0.450, 0.241)
    ends = [abs(0.450 / 0.445 * n ** (0.241 - 0.25) - 1.0) for n in (2.0, 96.0)]
    assert real_data.curve_difference(r) == pytest.approx(max(ends), rel=F64_CLOSED_FORM)
    assert real_data.curve_difference(_row("gpt2rand-L6", 0.445, 0.25)) == pytest.approx(0.0)
    assert real_data.curve_difference({**r, "paper_curve": None}) is None


def test_row_verdict_separates_the_papers_model_from_stand_ins():
    assert real_data.row_verdict(_row("gpt2rand-L6", 0.450, 0.241)) == "reproduced"
    # 10 % above the printed curve everywhere: beyond the 5 % rule on the paper's own model
    assert real_data.CURVE_TOLERANCE == verdicts.NUMBER_TOLERANCE == 0.05
    assert real_data.row_verdict(_row("gpt2rand-L6", 1.1 * 0.445, 0.25)) == "not reproduced"
    # the same numbers on another model are a stand-in, whatever the gap
    assert real_data.row_verdict(_row("minilm-L0", 0.445, 0.25)) == "stand-in"


def test_sqrt_n_constant_only_near_one_half():
    assert SQRT_N_TOLERANCE == verdicts.SQRT_N_TOLERANCE
    assert sqrt_n_consistent(0.5) and sqrt_n_consistent(0.5 + 0.9 * SQRT_N_TOLERANCE)
    assert not sqrt_n_consistent(0.27)  # the F4 worst case of the quick preset
    assert not sqrt_n_consistent(None) and not sqrt_n_consistent(math.nan)


def test_number_rule_is_one_tolerance_for_every_number():
    tol = verdicts.NUMBER_TOLERANCE
    gap = verdicts.relative_gap(1.01, 0.92)  # the quick preset's random GPT-2 adversarial row
    assert gap == pytest.approx(0.0978, abs=PRINTED_4_DECIMALS)
    assert verdicts.compare_number(gap, same_model=True) == "not reproduced"
    assert verdicts.compare_number(0.9 * tol, same_model=True) == "reproduced"
    assert verdicts.compare_number(tol, same_model=True) == "reproduced"
    assert verdicts.compare_number(1.01 * tol, same_model=True) == "not reproduced"
    assert verdicts.compare_number(None, same_model=True) == "not reproduced"  # no √n constant
    assert verdicts.compare_number(0.0, same_model=False) == "stand-in"
    assert verdicts.compare_number(0.0, same_model=True, same_quantity=False) == (
        "different quantity"
    )
    assert verdicts.relative_gap(1.0, 0.0) == math.inf
    assert verdicts.relative_gap(math.nan, 1.0) == math.inf


def test_bound_and_limit_rules():
    assert verdicts.compare_bound(0, 600) == "reproduced"
    assert verdicts.compare_bound(1, 600) == "refuted"
    assert verdicts.compare_bound(0, 0) == "not reproduced"  # nothing checked
    assert verdicts.compare_bound(6, 183, released_code=True) == "refuted (released code)"
    assert verdicts.compare_bound(0, 6, released_code=True) == "no counterexample (released code)"
    assert verdicts.compare_limit(5.9e-16) == "reproduced"
    assert verdicts.compare_limit(2 * verdicts.LIMIT_TOLERANCE) == "not reproduced"
    assert verdicts.compare_limit(0.0, bound_holds=False) == "not reproduced"
    every = {
        verdicts.compare_number(g, same_model=m, same_quantity=q)
        for g in (None, 0.0, 1.0)
        for m in (True, False)
        for q in (True, False)
    }
    every |= {verdicts.compare_bound(v, 5, released_code=r) for v in (0, 1) for r in (0, 1)}
    every |= {verdicts.compare_limit(e) for e in (0.0, 1.0)}
    assert every == set(verdicts.VERDICTS) == set(pipeline.VERDICTS)


def test_printed_rules_carry_the_constants_the_code_applies():
    text = "\n".join(verdicts.RULES)
    assert f"within {100 * verdicts.NUMBER_TOLERANCE:g} %" in text
    assert f"within {verdicts.SQRT_N_TOLERANCE:g} of 1/2" in text
    assert "10⁻⁶" in text and verdicts.LIMIT_TOLERANCE == 1e-6
    for v in ("reproduced", "not reproduced", "refuted", "no counterexample"):
        assert f"**{v}**" in text or f"*{v}*" in text
    for v in ("different quantity", "stand-in"):
        assert f"**{v}**" in text


def test_terms_are_found_as_symbols_not_inside_words():
    assert verdicts.terms_used(["γ = 2"]) == ["γ"]
    assert "n" not in verdicts.terms_used(["one token"])
    assert "n" in verdicts.terms_used(["C·√n"])
    assert "c·n^α" in verdicts.terms_used(["grows like n^0.12"])
    assert verdicts.plain_configuration("GPT-2-rand L6") == "randomly initialised GPT-2, layer 6"
    assert verdicts.plain_configuration("BERT-enc L0") == "pretrained BERT encoder, layer 0"


# --------------------------------------------------------------------- the table, row by row
def _verdicts_of(table: str) -> dict[str, str]:
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and not ln.startswith("| claim")]
    return {ln.split(" | ")[0][2:]: ln.rstrip(" |").rsplit("| ", 1)[1].strip("*") for ln in rows}


def _table_part(table: str) -> str:
    return table.split("**Rules.**")[0]


def _adversarial_summary(c_rand: float, alpha_rand: float) -> dict:
    def fit(C: float, alpha: float) -> dict:
        return {"n_points": 5, "C_fit": C, "c": C, "alpha": alpha}

    return {
        "configs": {
            "bert_enc": {
                "paper_model": "BERT-enc (bert-base-uncased)",
                "paper_layer": 0,
                "model": "all-MiniLM-L6-v2 (BERT architecture)",
                "model_key": "minilm",
                "paper_C": 4.39,
                "released": fit(3.9, 0.12),
                "symmetric": fit(11.81, 0.514),
            },
            "gpt2_rand": {
                "paper_model": "GPT-2-rand (GPT2Model(GPT2Config()), seed 320)",
                "paper_layer": 6,
                "model": "GPT-2 small shapes, random init",
                "model_key": "gpt2-random",
                "paper_C": 0.92,
                "released": fit(c_rand, alpha_rand),
                "symmetric": fit(0.50, 0.155),
            },
        }
    }


def test_adversarial_rows_show_both_fits_and_follow_the_rules(monkeypatch, tmp_path):
    monkeypatch.setattr(
        adversarial.report, "summary", lambda _: _adversarial_summary(1.0083, 0.425)
    )
    rows = adversarial.claims(tmp_path).rows
    bert, rand = rows
    # the BERT row carries the √n fit reported in the adversarial section (symmetrised input)
    assert "11.8·√n" in bert.ours and "no √n constant" in bert.ours
    assert bert.verdict == "stand-in" and "all-MiniLM-L6-v2" in bert.ours
    # the paper's C was read off √‖Jᵀf‖, ours is ‖J‖₂: never "reproduced" at a 9.6 % gap
    assert rand.verdict == "different quantity"
    assert "9.6 %" in rand.ours and "√‖Jᵀf‖" in rand.paper
    assert "randomly initialised GPT-2, layer 6" in rand.claim


def _real_row(config: str, c: float, alpha: float, paper: str = "GPT-2-rand L6") -> dict:
    return {
        **_row(config, c, alpha),
        "fit_true": {"alpha": 0.05, "c": 0.4},
        "fit_released": {"c": c, "alpha": alpha, "alpha_ci": [alpha - 0.01, alpha + 0.01]},
        "paper_curve": {"c": 0.445, "alpha": 0.25, "configuration": paper},
        "paper_configuration": paper,
        "alpha_gap": alpha - 0.05,
        "label": "all-MiniLM-L6-v2 L0 [heads+WO]" if "minilm" in config else "GPT-2 L6 [x]",
    }


def test_real_rows_follow_the_number_rule(monkeypatch, tmp_path):
    sweeps = [
        _real_row("gpt2rand-L6", 1.1 * 0.445, 0.25),  # 10 % gap on the paper's own model
        _real_row("minilm-L0", 0.445, 0.25, paper="BERT-enc L0"),
    ]
    monkeypatch.setattr(real_data.report, "summary", lambda _: {"sweeps": sweeps})
    rows = {r.verdict: r for r in real_data.claims(tmp_path).rows}
    assert set(rows) == {"not reproduced", "different quantity", "stand-in"}
    assert "10.0 %" in rows["not reproduced"].ours
    assert "all-MiniLM-L6-v2" in rows["stand-in"].ours
    assert "SmolLM2" not in rows["stand-in"].ours  # only the stand-ins actually measured
    sweeps[0] = _real_row("gpt2rand-L6", 0.450, 0.241)
    assert "reproduced" in {r.verdict for r in real_data.claims(tmp_path).rows}


def _bounds_report(root: Path, n_fail: int) -> None:
    failures = {
        "n_fail": n_fail,
        "n_examined": n_fail,
        "n_key_term_zero": n_fail,
        "worst": {"n": 2, "R": 50.0, "bound": 0.537, "lower": 773.7, "margin": 0.000694},
    }
    write_json(
        root / "verify_bounds" / "report.json",
        {
            "n_instances": 600,
            "n_theorem_violations": 0,
            "bounds": {
                "released_data_dependent": {
                    "n_checked": 183,
                    "n_violations": n_fail,
                    "min_margin": 0.000694 if n_fail else 1.5,
                }
            },
            "known_invalid": {"released_data_dependent": {"failures": failures}},
        },
    )


def test_released_code_row_says_it_is_the_code_and_why(tmp_path):
    (tmp_path / "verify_bounds").mkdir()
    _bounds_report(tmp_path, 6)
    table = pipeline.claims_table(tmp_path)
    v = _verdicts_of(table)
    released = next(k for k in v if k.startswith("The authors' released code, not the paper"))
    assert v[released] == "refuted (released code)"
    assert "not in the paper" in table and "every R_h is 0" in table
    note = table.split("**Note on the released code's bound.**")[1]
    assert "not a convention mismatch" in note and "1/R²" in note
    assert "The paper is not refuted" in note
    assert "- R_h:" in table  # the symbol of the row is defined under the table
    _bounds_report(tmp_path, 0)
    table = pipeline.claims_table(tmp_path)
    assert "no counterexample (released code)" in table and "Note on" not in table


def test_released_failures_find_the_vanishing_key_term(monkeypatch):
    """docs/theory.md §2: A = a e1 e2ᵀ with every token on the e2 axis gives R_h = 0."""
    from experiments.verify_bounds import report as vb_report

    A = np.zeros((2, 2))
    A[0, 1] = 1.7
    X = np.array([[0.0, 50.0], [0.0, -44.0]])
    other = np.array([[1.0, 0.0], [0.0, 1.0]])
    targets = {0: X, 1: other}

    class _T:
        def __init__(self, X):
            self.ctx = {"X": X, "heads": [(A, np.eye(2), None)]}

    monkeypatch.setattr(vb_report, "make_targets", lambda seed, i, kind: [_T(targets[i])])
    fails = [
        {"index": i, "kind": "k", "target_index": 0, "margin": m, "bound": 1.0, "lower": 9.0}
        for i, m in ((1, 0.5), (0, 0.001))
    ]
    got = vb_report.released_failures(0, fails)
    assert got["n_fail"] == got["n_examined"] == 2 and got["n_key_term_zero"] == 1
    assert got["worst"]["key_term_zero"] and got["worst"]["R"] == 50.0


def test_released_quantity_fails_in_either_convention():
    """Not a convention mismatch: with R_h = max ‖A xᵢ‖ instead of ‖Aᵀxᵢ‖, the transposed
    counterexample fails just as the original, and the ratio falls like 1/R²."""
    from theory import bounds as B

    from ..oracles_bounds import jacobian, spec

    A = np.array([[0.0, 1.0], [0.0, 0.0]])
    V = np.eye(2)
    ratios = []
    for R in (3.0, 30.0):
        X = np.array([[0.0, -R], [0.0, R], [0.0, -R], [0.0, R]])
        # the code's R_h = max ‖Mᵀxᵢ‖ on M = A; the swapped R_h = max ‖M xᵢ‖ on M = Aᵀ
        for M, swapped in ((A, False), (A.T, True)):
            R_h = np.max(np.linalg.norm(X @ (M.T if swapped else M), axis=1))  # rows: xᵢᵀ(·)
            assert R_h == 0.0
            released = B.released_data_dependent(1.0, R_h, 2 * R, 4)
            ratios.append(released / spec(jacobian(X, M, V)))
    assert max(ratios) < 0.5
    assert ratios[2] == pytest.approx(ratios[0] / 100, rel=0.05)  # R ×10: ratio ÷100


# ------------------------------------------------------------------ the table on real results
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
    v = _verdicts_of(table)
    # synthetic (√n regime, mean field, large radius) and the bound verification (two rows);
    # no real-data or adversarial rows without their results
    assert len(v) == 5
    assert set(v.values()) <= set(pipeline.VERDICTS)
    assert "Real text" not in table and "Adversarial" not in table
    # the rules are printed under the table, and every symbol of the rows is defined there
    assert "\n".join(verdicts.RULES) in table
    part = _table_part(table)
    for key in verdicts.terms_used([part]):
        assert f"- {key}: {verdicts.TERMS[key]}" in table
    for sym in ("sup_ε g", "c′", "γ", "N_j", "certified bracket"):
        assert sym in part and f"- {sym}:" in table
    # no code names in the rows: the defects, map and corpus keys, registry statuses
    for name in ("D1", "D7", "heads+WO", "kjv", "candidate", "`"):
        assert name not in part, name


def test_every_row_verdict_follows_the_printed_rule(results):
    from experiments import synthetic
    from experiments.engine import load_json

    v = _verdicts_of(pipeline.claims_table(results))
    s = synthetic.summary(results)
    per = s["f5"]["per_gamma"]
    bad = sum(
        e["max_ratio_to_upper_triangle"] > 1 or e["min_ratio_to_lower_formula"] < 1 - BRACKET_MARGIN
        for e in per
    )
    f7 = s["f7"]
    err = max(f7[t]["max_rel_error_at_R_max"] for t in ("unmasked", "masked"))
    rep = load_json(results / "verify_bounds" / "report.json")
    b = rep["bounds"]["released_data_dependent"]
    expected = {
        "√n regime": verdicts.compare_bound(bad, len(per)),
        "Mean-field regime": verdicts.compare_bound(
            s["f6"]["upper_c1_exceeded_certified"], len(s["f6"]["radii"])
        ),
        "Large radius": verdicts.compare_limit(err),
        "The bounds hold": verdicts.compare_bound(rep["n_theorem_violations"], rep["n_instances"]),
        "The authors' released code": verdicts.compare_bound(
            b["n_violations"], b["n_checked"], released_code=True
        ),
    }
    for start, want in expected.items():
        got = [verdict for claim, verdict in v.items() if claim.startswith(start)]
        assert got == [want], start
    # a verdict in bold is a comparison; the two without a comparison are plain
    for ln in pipeline.claims_table(results).splitlines():
        m = re.search(r"\| ([^|]+) \|$", ln)
        if m and ln.startswith("| ") and not ln.startswith("| claim"):
            cell = m.group(1)
            plain = cell.strip("*") in ("different quantity", "stand-in")
            assert cell.startswith("**") != plain, ln


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
        "budget_cpu_seconds": None,
        "stages": {},
    }
    report = pipeline.render_report(out, doc)
    sections = [ln for ln in report.splitlines() if ln.startswith("## ")]
    assert sections[0] == "## Verdict at a glance"
    assert "experiments 1 s, figures 0 s" in report
    for spec in ("THEORY", "EXPERIMENTS", "DESIGN"):  # documents users do not have
        assert f"{spec}.md" not in report
