"""The ``long_context`` stage: the plateau rule, the tiny preset, the figure and the presets.

The plateau rule is checked on synthetic curves whose answer is known: ``n^0.5`` never plateaus,
a curve flat from 512 plateaus from 512 (with 2 % noise on every window), and the bootstrap is
seeded (the same seed gives the same intervals, bit for bit). The ``tiny`` preset runs the stage
end to end on a tiny random GPT-2 (both estimation paths), through the contract; a rerun
computes nothing. ``meanfield reproduce --preset long`` selects this stage alone, ``quick``
and ``paper`` leave it out.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from experiments import long_context as lc
from experiments.engine import StageConfig
from experiments.long_context import bootstrap_exponent, fit_exponent, plateau_start

from ..tolerances import F64_EXACT_FIT

LENGTHS = (64, 128, 256, 512, 1024, 2048, 4096)


def _windows(curve, *, windows: int = 3, noise: float = 0.02, seed: int = 7):
    """Every window's constant: ``curve(n)`` times a log-normal noise of ``noise``."""
    rng = np.random.default_rng(seed)
    n = np.repeat(np.asarray(LENGTHS), windows)
    return n, curve(n.astype(float)) * np.exp(noise * rng.standard_normal(n.size))


# ----------------------------------------------------------------------- the plateau rule
def test_a_square_root_never_plateaus():
    for noise_seed in range(20):
        n, y = _windows(np.sqrt, seed=noise_seed)
        p = plateau_start(n, y, n_boot=2000, seed=0)
        assert p.m is None
        assert [f.m for f in p.fits] == [64, 128, 256, 512, 1024]  # at least 3 lengths >= m
        for f in p.fits:
            assert 0.4 < f.exponent < 0.6 and f.low > 0.0
            assert not f.contains_zero


def test_a_curve_flat_from_512_plateaus_from_512():
    # one realisation (noise seed 2) in full; the rule's misses are counted below
    n, y = _windows(lambda v: 3.0 * np.sqrt(np.minimum(v, 512.0)), seed=2)
    p = plateau_start(n, y, n_boot=2000, seed=0)
    assert p.m == 512
    by_m = {f.m: f for f in p.fits}
    assert by_m[256].low > 0.0  # still growing when 256 is included
    assert by_m[512].lengths == [512, 1024, 2048, 4096]
    assert by_m[512].points == 12
    assert by_m[512].low <= 0.0 <= by_m[512].high
    # over 20 noisy realisations: never a plateau where the curve still grows, and 512 in most
    # (a 95 % interval on 3 windows per length misses 0 on a flat stretch now and then: the
    # rule then answers a later m, or none; docs/long_context.md, "Limits")
    starts = []
    for noise_seed in range(20):
        n, y = _windows(lambda v: 3.0 * np.sqrt(np.minimum(v, 512.0)), seed=noise_seed)
        starts.append(plateau_start(n, y, n_boot=2000, seed=0).m)
    assert all(m is None or m >= 512 for m in starts)
    assert starts.count(512) >= 14


def test_an_exact_power_law_has_its_exponent_and_a_point_interval():
    n = np.repeat(np.asarray(LENGTHS), 3)
    y = 2.0 * n.astype(float) ** 0.25
    assert fit_exponent(n, y) == pytest.approx(0.25, abs=F64_EXACT_FIT)
    alpha, low, high = bootstrap_exponent(n, y, n_boot=200, seed=1)
    assert alpha == pytest.approx(0.25, abs=F64_EXACT_FIT)
    assert low == pytest.approx(0.25, abs=F64_EXACT_FIT) and high == pytest.approx(
        0.25, abs=F64_EXACT_FIT
    )


def test_the_bootstrap_is_seeded_and_deterministic():
    n, y = _windows(lambda v: np.sqrt(np.minimum(v, 512.0)), noise=0.1)
    a = plateau_start(n, y, n_boot=500, seed=3).as_dict()
    b = plateau_start(n, y, n_boot=500, seed=3).as_dict()
    c = plateau_start(n, y, n_boot=500, seed=4).as_dict()
    assert a == b
    assert [f["low"] for f in a["fits"]] != [f["low"] for f in c["fits"]]


def test_too_few_lengths_give_no_fit_and_bad_points_are_left_out():
    p = plateau_start([8, 8, 16, 16], [1.0, 1.0, 1.1, 1.2], min_lengths=3)
    assert p.m is None and p.fits == []
    n = np.repeat([8, 16, 32], 2)
    y = np.array([1.0, np.nan, 1.0, -1.0, 1.0, 1.0])
    (fit,) = plateau_start(n, y, n_boot=100).fits
    assert fit.points == 4 and fit.exponent == pytest.approx(0.0, abs=F64_EXACT_FIT)
    with pytest.raises(ValueError, match="same length"):
        fit_exponent([1, 2], [1.0])


# ----------------------------------------------------------------------- settings
def test_settings_are_typed_and_checked():
    cfg = lc.resolve("long", {"smollm2.lengths": [512, 1024], "models": "smollm2"})
    assert isinstance(cfg, lc.LongContextSettings)
    assert cfg.models == ("smollm2",) and cfg.smollm2.lengths == (512, 1024)
    assert isinstance(cfg.smollm2, StageConfig)
    with pytest.raises(ValueError, match="exceeds the model's 512 positions"):
        lc.resolve("long", {"minilm.lengths": [256, 1024]})
    with pytest.raises(ValueError, match="exceeds the model's 8192 positions"):
        lc.resolve("long", {"smollm2.lengths": [4096, 16384]})
    with pytest.raises(ValueError, match="strictly increasing"):
        lc.resolve("tiny", {"gpt2_tiny.lengths": [16, 8]})
    with pytest.raises(ValueError, match="unknown model"):
        lc.resolve("tiny", {"models": ["bert"]})
    with pytest.raises(ValueError, match="unknown preset 'quick'"):
        lc.resolve("quick", {})
    assert lc.window_starts((4, 8), 3) == {4: [0, 4, 8], 8: [12, 20, 28]}
    # the random GPT-2 is extended, so any length is allowed there
    assert lc.resolve("long", {"gpt2.lengths": [8192, 16384]}).gpt2.lengths == (8192, 16384)


# ----------------------------------------------------------------------- the tiny preset
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("long_context")
    t0 = time.process_time()
    files = lc.run(root, "tiny", progress=False)
    return root, files, time.process_time() - t0


def test_tiny_preset_runs_resumes_and_reports(tiny):
    root, files, cpu = tiny
    assert cpu < 20.0
    out = root / "long_context"
    assert files[0] == out / "long_context.json"
    assert {p.name for p in files} == {
        "long_context.json",
        "gpt2_tiny_L1.jsonl",
        "gpt2_tiny_L1.meta.json",
    }
    records = [json.loads(line) for line in (out / "gpt2_tiny_L1.jsonl").read_text().splitlines()]
    assert len(records) == 4 * 3  # every (length, window) of the preset
    for r in records:
        assert set(r["point"]) == {"n", "window", "start"}
        for key in ("value", "lower", "upper_prob", "R", "n_matvec", "seconds_estimate", "path"):
            assert key in r, key
        assert r["lower"] <= r["value"] <= r["upper_prob"]
        assert r["confidence"] == pytest.approx(1 - 1e-6)
        assert r["start_vector"] == "random"
        assert r["R"] > 0
    paths = {(r["point"]["n"], r["path"]) for r in records}
    assert ("64", "streaming") in {(str(n), p) for n, p in paths}  # beyond the memory budget
    assert ("32", "stored") in {(str(n), p) for n, p in paths}
    starts = sorted(r["point"]["start"] for r in records)
    assert starts == sorted(set(starts))  # no two windows start at the same token
    entry = lc.load_layers(root)["gpt2_tiny_L1"]
    assert entry["lengths"] == [8, 16, 32, 64]
    assert entry["plateau"]["n_boot"] == 2000 and entry["plateau"]["fits"]
    assert np.isfinite(entry["bound"]["log10"])
    assert entry["bound"]["R"] == pytest.approx(max(r["R"] for r in records))
    # a rerun computes nothing and loads no model
    before = {p: p.read_bytes() for p in out.glob("*.jsonl")}
    t0 = time.perf_counter()
    again = lc.run(root, "tiny", progress=False)
    assert time.perf_counter() - t0 < 5.0
    assert [p.name for p in again] == [p.name for p in files]
    assert {p: p.read_bytes() for p in out.glob("*.jsonl")} == before
    # summary, report section and the verdict row
    s = lc.summary(root)["gpt2_tiny_L1"]
    assert s["lengths"] == [8, 16, 32, 64] and s["answer"]
    section = lc.report_section(root, root / "figures")
    assert "long contexts" in section and "fig_long_context.png" in section
    rows, notes = lc.claims(root)
    (row,) = rows
    assert "does the constant plateau" in row.claim
    assert row.verdict == "stand-in" and row.ours == lc.answer(entry)
    assert notes and "bootstrap" in notes[0]


def test_claims_are_empty_without_results(tmp_path):
    assert lc.claims(tmp_path) == ([], [])
    assert lc.summary(tmp_path) == {}
    assert "No results" in lc.report_section(tmp_path, tmp_path / "figures")


def test_the_figure_draws_and_reads_at_print_size(tiny, tmp_path, monkeypatch):
    from paper_figs import fig_long_context
    from tests.figures.test_figure_text import check_drawn_figures

    root, _, _ = tiny
    paths = fig_long_context.draw(root, tmp_path / "figs")
    assert {p.suffix for p in paths} == {".pdf", ".png"}
    assert all(p.stat().st_size > 0 for p in paths)
    assert (
        check_drawn_figures(
            fig_long_context.draw, fig_long_context, root, tmp_path / "check", monkeypatch
        )
        == 1
    )
    with pytest.raises(FileNotFoundError, match="long_context"):
        fig_long_context.draw(tmp_path / "empty", tmp_path / "figs")


def test_the_figure_marks_a_plateau_and_an_off_scale_bound(tiny, tmp_path):
    from experiments.engine import load_json, write_json
    from paper_figs import fig_long_context

    root, _, _ = tiny
    doc = load_json(root / "long_context" / "long_context.json")
    (entry,) = doc["layers"].values()
    entry["plateau"]["m"] = 16
    entry["bound"]["log10"] = 40.0
    write_json(tmp_path / "long_context" / "long_context.json", doc)
    assert fig_long_context.draw(tmp_path, tmp_path / "figs")


# ----------------------------------------------------------------------- presets
def test_long_preset_selects_only_this_stage_and_quick_leaves_it_out():
    from meanfield_cli import pipeline, registry

    assert "long" in pipeline.PRESET_NAMES and pipeline.BUDGET_CPU_SECONDS["long"] is None
    assert [s.name for s in registry.select_stages(None, preset="long")] == ["long_context"]
    for preset in ("quick", "paper"):
        names = [s.name for s in registry.select_stages(None, preset=preset)]
        assert "long_context" not in names
        assert names == [s.name for s in registry.STAGES if s.name != "long_context"]
    assert "long_context" in [s.name for s in registry.select_stages(None, preset="tiny")]
    with pytest.raises(ValueError, match="have no preset 'quick'"):
        registry.select_stages(["long_context"], preset="quick")
    assert set(lc.PRESETS) == {"tiny", "long"}


def test_reproduce_long_runs_only_this_stage(tmp_path, monkeypatch):
    """``meanfield reproduce --preset long`` with the stage's run replaced by a recorder."""
    from meanfield_cli import pipeline, registry

    ran = []

    def fake(stages, results_dir, preset, **kw):
        ran.append(([s.name for s in stages], preset))
        return {}

    monkeypatch.setattr(pipeline, "run_stages", fake)
    pipeline.reproduce(tmp_path / "o", "long", figures=False, progress=False)
    pipeline.reproduce(tmp_path / "q", "quick", figures=False, progress=False)
    assert ran[0] == (["long_context"], "long")
    assert ran[1] == ([s.name for s in registry.STAGES if s.name != "long_context"], "quick")
