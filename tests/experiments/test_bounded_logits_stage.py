"""The ``bounded_logits`` stage: settings, the tied input, the tiny preset, the figure, resuming.

Oracles: the tied input's logits are checked against the weights' own slices (numpy); every
certified bracket of the tiny preset (the plain form's dense SVD with its Gram certificate, the
variants' streaming Lanczos) against the spectral norm of the Jacobian of an independent naive
implementation of the four forms in float64 torch, differentiated by autograd; the plain bound against the
triangle formula written out here; the exponent fit against exact power laws.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time

import numpy as np
import pytest
import torch

from experiments import bounded_logits as bl
from experiments.engine import StageConfig, record_float

from ..tolerances import (
    BRACKET_MARGIN,
    F64_CLOSED_FORM,
    F64_EXACT_FIT,
    F64_FEW_ULPS,
    F64_LARGE_RADIUS_REL,
    F64_REDUCTION,
    F64_REWRITTEN,
    F64_REWRITTEN_EXP,
    F64_TWO_JACOBIANS,
)


# ----------------------------------------------------------------------- settings
def test_settings_are_typed_and_checked():
    cfg = bl.resolve("quick", {"forms": "plain", "layer.d": 128})
    assert isinstance(cfg, bl.BoundedLogitsSettings) and isinstance(cfg.layer, StageConfig)
    assert cfg.forms == ("plain",) and cfg.layer.d == 128
    assert bl.resolve("paper", {}).layer.options() == {
        "d": 1024,
        "n_heads": 16,
        "n_kv_heads": 8,
        "head_dim": 128,
    }
    for bad, msg in [
        ({"forms": ["plain", "alibi"]}, "unknown form"),
        ({"inputs": ["random"]}, "unknown input"),
        ({"layer.head_dim": 32}, "null_query needs layer.d"),
        ({"layer.n_kv_heads": 3}, "multiple of layer.n_kv_heads"),
        ({"radii": [10.0, 5.0]}, "strictly increasing"),
        ({"large_R": 1000.0}, "at least 2 radii"),
        ({"n": 2}, "n must be >= 3"),
        ({"method": "power"}, "method must be one of"),
        ({"softcap": 0.0}, "softcap must be > 0"),
        ({"n": "small"}, "bounded_logits: setting n must be an integer"),
        ({"method": "dense"}, "method dense needs forms plain alone"),
        ({"layer.d": 3}, "must exceed layer.n_heads"),
    ]:
        with pytest.raises(ValueError, match=msg):
            bl.resolve("tiny", bad)
    assert bl.resolve("tiny", {"method": "dense", "forms": "plain"}).method == "dense"
    with pytest.raises(ValueError, match="unknown preset 'long'"):
        bl.resolve("long", {})


def test_growth_exponent_of_exact_power_laws():
    R = [10.0, 20.0, 50.0, 100.0]
    assert bl.growth_exponent(R, [3.0 * r**2 for r in R]) == pytest.approx(2.0, abs=F64_EXACT_FIT)
    assert bl.growth_exponent(R, [7.0] * 4) == pytest.approx(0.0, abs=F64_EXACT_FIT)
    assert math.isnan(bl.growth_exponent([10.0], [1.0]))
    assert math.isnan(bl.growth_exponent([10.0, 20.0], [1.0, float("nan")]))


# ----------------------------------------------------------------------- the tied input
@pytest.mark.parametrize("family", ["tied", "null_query"])
@pytest.mark.parametrize(("d", "H", "H_kv", "k"), [(32, 2, 1, 16), (48, 4, 2, 8)])
def test_tied_input_ties_every_head_at_logit_zero(d, H, H_kv, k, family):
    w = bl.layer_weights(d, H, H_kv, k, seed=3)
    X = bl.tied_input(w, 7, n_heads=H, n_kv_heads=H_kv, seed=5, family=family).numpy()
    assert np.allclose(np.linalg.norm(X, axis=1), 1.0, atol=F64_REWRITTEN)
    u, v = X[2], X[0]
    assert np.allclose(X[1], -v) and np.allclose(X[5], u) and np.allclose(X[6], v)
    WQ, WK = w["W_Q"].numpy(), w["W_K"].numpy()
    for h in range(H):
        g = h // (H // H_kv)
        q = WQ[h * k : (h + 1) * k] @ u
        key = WK[g * k : (g + 1) * k] @ v
        assert abs(q @ key) <= F64_REWRITTEN_EXP * np.linalg.norm(
            WQ[h * k : (h + 1) * k], 2
        ) * np.linalg.norm(key)
    if family == "null_query":
        assert np.linalg.norm(WQ[:k] @ u) < F64_REWRITTEN_EXP * np.linalg.norm(WQ[:k], 2)
    with pytest.raises(ValueError, match="unknown input family"):
        bl.tied_input(w, 7, n_heads=H, n_kv_heads=H_kv, seed=5, family="random")
    # under QK-norm and the cap the logit of the query u on the keys ±v stays 0 at any radius
    from meanfield.attention import head_logits

    Xt = 1e3 * torch.as_tensor(X)
    for form in ("qk_norm", "softcap"):
        p = bl.layer_params(w, form, n_heads=H, n_kv_heads=H_kv, softcap=5.0, window=4,
                            rms_eps=1e-6)  # fmt: skip
        for head in p.heads:
            logits = head_logits(Xt, Xt, head)
            assert float(logits[2, :2].abs().max()) < F64_LARGE_RADIUS_REL


# ----------------------------------------------------------------------- the tiny preset
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("bounded_logits")
    t0 = time.process_time()
    files = bl.run(root, "tiny", progress=False)
    return root, files, time.process_time() - t0


def _naive_layer(X, w, form, cfg):
    """The layer written out: GQA heads, QK-norm / cap / window, causal, W_O (float64)."""
    L = cfg.layer
    k, rep = L.head_dim, L.n_heads // L.n_kv_heads
    n = X.shape[0]
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    allowed = j <= i
    if form == "window":
        allowed = allowed & (i - j < cfg.window)
    outs = []
    for h in range(L.n_heads):
        g = h // rep
        q = X @ w["W_Q"][h * k : (h + 1) * k].T
        key = X @ w["W_K"][g * k : (g + 1) * k].T
        val = X @ w["W_V"][g * k : (g + 1) * k].T
        if form == "qk_norm":
            q = q / torch.sqrt(q.square().mean(-1, keepdim=True) + cfg.rms_eps)
            key = key / torch.sqrt(key.square().mean(-1, keepdim=True) + cfg.rms_eps)
        s = q @ key.T / math.sqrt(k)
        if form == "softcap":
            s = cfg.softcap * torch.tanh(s / cfg.softcap)
        P = torch.softmax(s.masked_fill(~allowed, -math.inf), dim=-1)
        outs.append(P @ val)
    return torch.cat(outs, dim=-1) @ w["W_O"].T


def test_tiny_preset_runs_and_matches_an_autograd_oracle(tiny):
    root, files, cpu = tiny
    assert cpu < 20.0
    out = root / "bounded_logits"
    assert [p.name for p in files] == ["bounded_logits.json", "points.jsonl", "points.meta.json"]
    cfg = bl.resolve("tiny", {})
    records = [json.loads(line) for line in (out / "points.jsonl").read_text().splitlines()]
    assert len(records) == len(bl.FORMS) * len(bl.INPUTS) * len(cfg.radii) * cfg.n_inputs
    L = cfg.layer
    w = bl.layer_weights(L.d, L.n_heads, L.n_kv_heads, L.head_dim, cfg.seed)
    unit = {
        fam: bl.tied_input(w, cfg.n, n_heads=L.n_heads, n_kv_heads=L.n_kv_heads, seed=0, family=fam)
        for fam in bl.INPUTS
    }
    # the SVD's rounding: the float64 spectral norm of the assembled Jacobian is within a few
    # units of 1e-16 relative of the exact one (n d = 288), so 1e-12 relative covers it
    rel = BRACKET_MARGIN
    for r in records:
        assert set(r["point"]) == {"form", "R", "family", "input"}
        assert r["converged"]
        assert r["R_measured"] == pytest.approx(r["point"]["R"], rel=F64_REWRITTEN)
        X = r["point"]["R"] * unit[r["point"]["family"]]
        J = torch.autograd.functional.jacobian(
            lambda Z, f=r["point"]["form"]: _naive_layer(Z, w, f, cfg), X
        ).reshape(X.numel(), X.numel())
        exact = float(torch.linalg.matrix_norm(J, 2))
        lower, upper_prob = record_float(r["lower"]), record_float(r["upper_prob"])
        assert lower <= exact * (1 + rel), r["point"]
        assert exact <= upper_prob * (1 + rel), r["point"]
        assert exact <= record_float(r["upper"]) * (1 + rel), r["point"]
        assert r["confidence"] is None or r["confidence"] == pytest.approx(
            1 - 1e-6, abs=F64_FEW_ULPS
        )
        if r["point"]["form"] == "plain":  # the stored path: the dense SVD, Gram certificate
            assert (r["method"], r["path"], r["stop_rule"]) == ("dense", "stored", "dense")
            assert r["value"] == pytest.approx(exact, rel=F64_TWO_JACOBIANS), r["point"]
            assert record_float(r["upper"]) == upper_prob
        else:  # the variants: the streaming path's certified Lanczos
            assert (r["method"], r["path"]) == ("lanczos", "streaming"), r["point"]
            assert r["stop_rule"] == "width" and r["n_matvec"] > 0
            assert record_float(r["upper"]) == math.inf
            if r["width_reachable"]:
                assert upper_prob <= 1.05 * lower * (1 + F64_FEW_ULPS), r["point"]
    if "softcap" in bl.FORMS:
        capped = [r for r in records if r["point"]["form"] == "softcap"]
        assert max(r["largest_logit"] for r in capped) <= cfg.softcap * (1 + F64_CLOSED_FORM)


def test_tiny_results_bounds_report_and_verdict(tiny):
    root, _, _ = tiny
    doc = bl.load_results(root)
    forms = doc["forms"]
    assert list(forms) == list(bl.FORMS)
    # the plain constant grows like R² at both constructions; QK-norm is flat at the tied
    # inputs and grows linearly at a query in the null space of a head's query map
    assert 1.8 < forms["plain"]["exponent"] < 2.2
    assert abs(forms["qk_norm"]["by_input"]["tied"]["exponent"]) < 0.05
    assert 0.9 < forms["qk_norm"]["by_input"]["null_query"]["exponent"] < 1.1
    assert forms["qk_norm"]["exponent"] == forms["qk_norm"]["by_input"]["null_query"]["exponent"]
    # the plain bound: the triangle form of docs/theory.md §1 summed over heads, above the data
    heads = doc["facts"]["heads"]
    n = doc["settings"]["n"]
    cfg = bl.resolve("tiny", {})
    L = cfg.layer
    w = bl.layer_weights(L.d, L.n_heads, L.n_kv_heads, L.head_dim, cfg.seed)
    p = bl.layer_params(w, "plain", n_heads=L.n_heads, n_kv_heads=L.n_kv_heads, softcap=1.0,
                        window=1, rms_eps=0.0)  # fmt: skip
    for h, head in enumerate(p.heads):
        assert heads[h]["A"] == pytest.approx(
            float(torch.linalg.matrix_norm(head.A, 2)), rel=F64_REDUCTION
        )
        assert heads[h]["V"] == pytest.approx(
            float(torch.linalg.matrix_norm(head.V, 2)), rel=F64_REDUCTION
        )
        W_h = p.head_projection(h)
        assert heads[h]["W"] == pytest.approx(
            float(torch.linalg.matrix_norm(W_h, 2)), rel=F64_REDUCTION
        )
    for R, b, y in zip(forms["plain"]["R"], forms["plain"]["bound"], forms["plain"]["value"],
                       strict=True):  # fmt: skip
        by_hand = sum(
            h["W"] * h["V"] * (math.sqrt(n) * (1 + h["A"] * R**2) + h["A"] * R**2) for h in heads
        )
        assert b == pytest.approx(by_hand, rel=F64_CLOSED_FORM)
        assert y <= b
    assert forms["plain"]["below_bound"]
    # summary, report section and the verdict row
    s = bl.summary(root)
    assert s["answer"] == bl.answer(doc) and "QK-norm R^" in s["answer"]
    section = bl.report_section(root, root / "figures")
    assert "fig_bounded_logits.png" in section and "certify=False" not in section
    assert "certified bracket [lower, upper_prob], confidence 1 − δ" in section
    assert "fitted to the value" in section
    assert "| 100 |" in section
    rows, notes = bl.claims(root)
    (row,) = rows
    assert bl.QUESTION in row.claim
    assert row.ours == bl.answer(doc) and row.verdict == "stand-in"
    assert notes and "least-squares" in notes[0]


def test_claims_are_empty_without_results(tmp_path):
    assert bl.claims(tmp_path) == ([], [])
    assert bl.summary(tmp_path) == {}
    assert "No results" in bl.report_section(tmp_path, tmp_path / "figures")


def test_rerun_computes_nothing_and_a_lost_point_is_recomputed(tiny, tmp_path):
    import shutil

    root, files, _ = tiny
    work = tmp_path / "copy"
    shutil.copytree(root, work)
    jsonl = work / "bounded_logits" / "points.jsonl"
    before = jsonl.read_bytes()
    t0 = time.perf_counter()
    again = bl.run(work, "tiny", progress=False)
    assert time.perf_counter() - t0 < 5.0
    assert [p.name for p in again] == [p.name for p in files]
    assert jsonl.read_bytes() == before  # nothing recomputed
    lines = before.decode().splitlines()
    jsonl.write_text("\n".join(lines[:-1]) + "\n")  # one point lost
    bl.run(work, "tiny", progress=False)
    after = jsonl.read_text().splitlines()
    assert after[:-1] == lines[:-1]
    lost, redone = json.loads(lines[-1]), json.loads(after[-1])
    assert redone["point"] == lost["point"] and redone["value"] == lost["value"]
    # a longer grid keeps the points already measured
    more = bl.run(work, "tiny", progress=False, radii=[1.0, 10.0, 30.0, 100.0, 300.0])
    assert more and jsonl.read_text().splitlines()[: len(after)] == after
    assert len(bl.load_results(work)["forms"]["plain"]["R"]) == 5


# ----------------------------------------------------------------------- figure and registry
def test_the_figure_draws_and_reads_at_print_size(tiny, tmp_path, monkeypatch):
    from paper_figs import fig_bounded_logits
    from tests.figures.test_figure_text import check_drawn_figures

    root, _, _ = tiny
    paths = fig_bounded_logits.draw(root, tmp_path / "figs")
    assert {p.suffix for p in paths} == {".pdf", ".png"}
    assert all(p.stat().st_size > 0 for p in paths)
    checked = check_drawn_figures(
        fig_bounded_logits.draw, fig_bounded_logits, root, tmp_path / "check", monkeypatch
    )
    assert checked == 1
    with pytest.raises(FileNotFoundError, match="bounded_logits"):
        fig_bounded_logits.draw(tmp_path / "empty", tmp_path / "figs")


def test_the_stage_runs_in_quick_and_paper_and_has_figure_m():
    from meanfield_cli import registry

    for preset in ("tiny", "quick", "paper"):
        assert "bounded_logits" in [s.name for s in registry.select_stages(None, preset=preset)]
    (fig,) = [f for f in registry.FIGURES if f.stage is bl.STAGE]
    assert fig.id == "M"
    assert not bl.STAGE.uses_device
    with pytest.raises(ValueError, match="CPU only"):
        bl.STAGE.start("/tmp", "tiny", device="cuda")


def test_the_report_flags_points_that_stopped_at_the_iteration_cap(tiny, tmp_path):
    from experiments.engine import load_json, write_json

    root, _, _ = tiny
    doc = load_json(root / "bounded_logits" / "bounded_logits.json")
    assert "All 32 points met the stopping rule." in bl.report_section(root, root / "figures")
    doc["forms"]["window"]["n_unconverged"] = 2
    write_json(tmp_path / "bounded_logits" / "bounded_logits.json", doc)
    section = bl.report_section(tmp_path, tmp_path / "figures")
    assert "**2 of 32 points stopped at the iteration cap** (2 of sliding window)" in section


def test_a_change_of_measurement_recomputes_and_an_older_document_is_refused(tiny, tmp_path):
    import shutil

    from experiments.engine import load_json, write_json

    root, _, _ = tiny
    meta = load_json(root / "bounded_logits" / "points.meta.json")
    assert meta["config"]["measurement_version"] == bl.MEASUREMENT_VERSION == 3
    # a document of the certify=False measurement (no version field) is refused in one line
    work = tmp_path / "old"
    shutil.copytree(root, work)
    path = work / "bounded_logits" / "bounded_logits.json"
    doc = load_json(path)
    del doc["measurement_version"]
    write_json(path, doc)
    with pytest.raises(ValueError, match=r"measurement version 1 \(1: certify=False") as err:
        bl.load_results(work)
    assert "\n" not in str(err.value)
    doc["measurement_version"] = 2  # the plain form's Lanczos on the stored path
    write_json(path, doc)
    with pytest.raises(ValueError, match=r"measurement version 2 .*2: the plain form"):
        bl.load_results(work)
    # records of another measurement (another sweep configuration) are not reused
    jsonl = work / "bounded_logits" / "points.jsonl"
    old = [json.loads(line) for line in jsonl.read_text().splitlines()]
    for r in old:
        r["config_hash"] = "0" * len(r["config_hash"])
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in old))
    bl.run(work, "tiny", progress=False, forms=["window"], radii=[10.0, 100.0])
    assert bl.load_results(work)["measurement_version"] == bl.MEASUREMENT_VERSION
    fresh = [json.loads(line) for line in jsonl.read_text().splitlines()][len(old) :]
    assert len(fresh) == 2 * len(bl.INPUTS) and all("upper_prob" in r for r in fresh)


def test_plain_krylov_points_stream_and_stay_tight_at_large_logits(tmp_path):
    """Version 3: the plain form's Lanczos runs on the streaming path (one rounding analysis for
    the four forms), whose bracket stays within the width at logits where the stored path's
    model of docs/rounding.md §3 leaves ``lower = 0`` (R = 1000 on this layer)."""
    from meanfield import local_lipschitz

    bl.run(
        tmp_path, "tiny", progress=False, forms=["plain"], radii=[100.0, 1000.0], method="lanczos"
    )
    jsonl = tmp_path / "bounded_logits" / "points.jsonl"
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    big = [r for r in records if r["point"]["R"] == 1000.0]
    assert big and all(r["path"] == "streaming" and r["method"] == "lanczos" for r in records)
    assert all(r["lower"] > 0 and r["ratio_prob"] <= 1.05 * (1 + BRACKET_MARGIN) for r in big)
    # the same call on the stored path: the bracket the stage left behind
    from experiments.bounded_logits.sweep import _Workspace

    cfg = bl.resolve("tiny", {})
    ctx = {k: getattr(cfg, k) for k in ("seed", "softcap", "window", "rms_eps", "n")}
    ctx["layer"] = dataclasses.asdict(cfg.layer)
    ws = _Workspace(ctx)
    X = 1000.0 * ws.unit_input(big[0]["point"]["family"], big[0]["point"]["input"])
    stored = local_lipschitz(X, ws.params("plain"), masked=True, method="lanczos", path="stored")
    assert float(stored.lower) < big[0]["lower"]
