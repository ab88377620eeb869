"""Adversarial sweeps (experiments.adversarial) and figure F4, on the tiny preset.

Oracles are independent of the code under test: dense Jacobians by ``torch.func.jacrev`` of
:func:`meanfield.attention.self_attention` and an SVD in float64, the construction rebuilt from
docs/theory.md §3 by hand, and the closed form of the least-squares constant.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from experiments import adversarial as adv
from experiments.engine import load_jsonl
from meanfield import certified_local_upper

from ..tolerances import (
    BRACKET_MARGIN,
    F64_CLOSED_FORM,
    F64_EXACT_FIT,
    F64_LANCZOS_GAP,
    F64_NONSYM_EIG_VECTOR,
    F64_REDUCTION,
    F64_REWRITTEN,
    F64_ZERO,
)

F64 = torch.float64


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny(run_tiny):
    """The tiny preset run once into a temporary results root."""
    pytest.importorskip("transformers")
    return run_tiny(adv, "adv")


def _dense_norm(X: torch.Tensor, params, masked: bool) -> float:
    from meanfield.attention import self_attention

    def f(z):
        return self_attention(z.reshape(X.shape), params, masked=masked).reshape(-1)

    J = torch.func.jacrev(f)(X.reshape(-1).to(F64))
    return float(torch.linalg.svdvals(J)[0])


def _params(root, cid):
    import transformers  # noqa: F401

    from meanfield.models import hf_attention

    info = json.loads((root / "adversarial" / f"{cid}.json").read_text())
    model = adv.sweep.load_model_cached(info["settings"]["model"], info["settings"]["seed"]).model
    att = hf_attention(model, info["settings"]["layer"], map=info["settings"]["map"], dtype=F64)
    return info, att.params


# ----------------------------------------------------------------------------------------------
# run, schema, resume
# ----------------------------------------------------------------------------------------------
def test_tiny_writes_schema(tiny):
    root, files = tiny
    out = root / "adversarial"
    assert all(p.exists() for p in files)
    preset = adv.PRESETS["tiny"].options()
    for cid in preset["configs"]:
        info = json.loads((out / f"{cid}.json").read_text())
        assert info["settings"]["model"] == preset["models"][cid]
        assert len(info["head_facts"]) == 4
        recs = [
            r for r in load_jsonl(out / f"{cid}.jsonl") if r["config_hash"] == info["config_hash"]
        ]
        assert len(recs) == len(preset["n_grid"]) * len(preset["variants"])
        assert {(r["n"], r["variant"]) for r in recs} == {
            (n, v) for n in preset["n_grid"] for v in preset["variants"]
        }
        for r in recs:
            assert r["status"] == "ok"
            for key in (
                "value",
                "lower",
                "global_bound",
                "global_bound_triangle",
                "local_bound",
                "released_heuristic",
                "gamma",
                "p",
                "R",
                "seed",
                "map",
                "masked",
                "model",
                "case",
                "converged",
                "seconds",
            ):
                assert key in r, key
            assert r["map"] == adv.CONFIGS[cid].map and r["masked"] == adv.CONFIGS[cid].masked
            assert r["max_token_norm"] == pytest.approx(r["R"], rel=F64_REDUCTION)
            assert r["lower"] <= r["value"] * (1 + BRACKET_MARGIN)
    wc = load_jsonl(out / "worst_case.jsonl")
    assert sorted(r["n"] for r in wc) == preset["worst_case"]["n_grid"]


def test_lower_end_below_global_and_local_bounds(tiny):
    root, _ = tiny
    for cid in adv.PRESETS["tiny"].options()["configs"]:
        for r in load_jsonl(root / "adversarial" / f"{cid}.jsonl"):
            assert r["lower"] <= r["global_bound_triangle"] <= r["global_bound"]
            assert r["lower"] <= r["local_bound"]
            assert r["bounds_hold"]
    for r in load_jsonl(root / "adversarial" / "worst_case.jsonl"):
        assert r["lower"] <= r["global_bound_triangle"]


def test_resume_computes_nothing(tiny, monkeypatch):
    root, _ = tiny
    before = {p.name: p.read_bytes() for p in (root / "adversarial").glob("*.jsonl")}

    def boom(*a, **k):  # any model load or point computation would call these
        raise AssertionError("a finished point was recomputed")

    monkeypatch.setattr(adv.sweep, "load_model_cached", boom)
    monkeypatch.setattr("meanfield.attacks.worst_case_sequence", boom)
    adv.run(root, "tiny", progress=False)
    after = {p.name: p.read_bytes() for p in (root / "adversarial").glob("*.jsonl")}
    assert after == before


def test_bracket_contains_dense_value_and_construction(tiny):
    root, _ = tiny
    cid = "gpt2_rand"
    info, params = _params(root, cid)
    recs = load_jsonl(root / "adversarial" / f"{cid}.jsonl")
    r = max((r for r in recs if r["variant"] == "released"), key=lambda r: r["n"])
    n, R = r["n"], r["R"]
    # the construction of docs/theory.md §3, rebuilt by hand from the head's A (released rule)
    A = params.heads[info["settings"]["head"]].A
    evals, evecs = torch.linalg.eig(A.mT)
    real = evals.imag.abs() <= 1e-9 * max(1.0, float(evals.abs().max()))
    lam = evals.real[real]
    vec = evecs[:, real].real
    lmax, lmin = lam.max(), lam.min()

    def unit(v):  # unit vector, largest-magnitude entry positive (biases make the sign matter)
        v = v / v.norm()
        return v if v[v.abs().argmax()] >= 0 else -v

    if lmax > -8 * lmin:
        u = unit(vec[:, lam.argmax()])
        X = torch.cat([R * u[None], 0.5 * R * u[None].expand(n - 1, -1)])
        gamma = float(u @ A @ u) * R * R / 4
    else:
        u = unit(vec[:, lam.argmin()])
        X = torch.cat([-R * u[None], R * u[None].expand(n - 1, -1)])
        gamma = -2 * float(u @ A @ u) * R * R
    assert r["gamma"] == pytest.approx(gamma, rel=F64_NONSYM_EIG_VECTOR)
    exact = _dense_norm(X, params, r["masked"])
    assert r["lower"] <= exact * (1 + BRACKET_MARGIN)
    assert exact <= r["upper"] * (1 + BRACKET_MARGIN)
    assert r["value"] == pytest.approx(exact, rel=F64_LANCZOS_GAP)


def test_csv_export_has_one_row_per_record(tiny):
    import csv

    root, files = tiny
    path = root / "adversarial" / "records.csv"
    assert path in files
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    res = adv.load_results(root)
    expected = sum(len(e["records"]) for e in res["configs"].values())
    expected += len(res["worst_case"]["records"]) if res["worst_case"] else 0
    assert len(rows) == expected
    for cid, entry in res["configs"].items():
        by_key = {(r["n"], r["variant"]): r for r in entry["records"]}
        mine = [row for row in rows if row["config"] == cid]
        assert len(mine) == len(by_key)
        for row in mine:
            rec = by_key[(int(row["n"]), row["variant"])]
            assert float(row["value"]) == rec["value"] and float(row["lower"]) == rec["lower"]
            assert float(row["local_bound"]) == rec["local_bound"]
    assert "local_terms" not in rows[0] and "key" not in rows[0]


# ----------------------------------------------------------------------------------------------
# bounds against dense Jacobians (biases, masks, rotary heads)
# ----------------------------------------------------------------------------------------------
def _random_inputs(gen, n, d, R):
    X = torch.randn(n, d, generator=gen, dtype=F64)
    return R * X / X.norm(dim=-1, keepdim=True) * torch.rand(n, 1, generator=gen, dtype=F64)


@pytest.mark.parametrize("kind", ["bert_heads", "bert_WO", "llama"])
@pytest.mark.parametrize("masked", [False, True])
def test_certified_and_global_bounds_dominate_dense_norm(kind, masked, gen):
    tr = pytest.importorskip("transformers")
    from meanfield.models import hf_attention

    torch.manual_seed(3)
    common = dict(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        vocab_size=32,
        attn_implementation="eager",
    )
    if kind == "llama":
        cfg = tr.LlamaConfig(num_attention_heads=4, num_key_value_heads=2, **common)
        model = tr.LlamaModel(cfg).eval()
    else:
        cfg = tr.BertConfig(num_attention_heads=2, **common)
        model = tr.BertModel(cfg).eval()
    with torch.no_grad():  # large random weights and biases: far from the init's near-zero A
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    params = hf_attention(
        model, 0, map="heads" if kind == "bert_heads" else "heads+WO", dtype=F64
    ).params
    facts = adv.bounds.layer_head_facts(params)
    for n, R in ((3, 0.7), (6, 2.0), (9, 4.0)):
        X = _random_inputs(gen, n, 16, R)
        exact = _dense_norm(X, params, masked)
        loc = certified_local_upper(X, params, masked=masked).value
        assert exact <= loc
        assert exact <= adv.global_bound(facts, R, n, form="triangle")
        assert adv.global_bound(facts, R, n, form="triangle") <= adv.global_bound(facts, R, n)


def test_certified_bound_is_exact_for_constant_scores():
    """A = 0: P is uniform, Df(X)[H] = P H V^T, so the bound ||P||_2 ||V||_2 = ||V||_2 is exact."""
    from meanfield import AttentionParams

    g = torch.Generator().manual_seed(0)
    V = torch.randn(3, 3, generator=g, dtype=F64)
    head = AttentionParams(torch.zeros(3, 3, dtype=F64), V)
    X = torch.randn(5, 3, generator=g, dtype=F64)
    out = certified_local_upper(X, head)
    assert out.T2 == pytest.approx(0.0, abs=F64_ZERO) and out.T3 == pytest.approx(0.0, abs=F64_ZERO)
    assert out.value == pytest.approx(_dense_norm(X, head, False), rel=F64_LANCZOS_GAP)


def test_released_heuristic_is_not_a_bound():
    """The counterexample of docs/theory.md §2: A = e1 e2^T, tokens on the e2 axis, R_h = 0."""
    from meanfield import AttentionParams

    A = torch.tensor([[0.0, 1.0], [0.0, 0.0]], dtype=F64)
    head = AttentionParams(A, torch.eye(2, dtype=F64))
    X = torch.tensor([[0.0, -3.0], [0.0, 1.0], [0.0, 3.0]], dtype=F64)
    heuristic = adv.released_heuristic(X, head)
    assert heuristic == pytest.approx(
        math.sqrt(3), rel=F64_CLOSED_FORM
    )  # ||V|| sqrt(n) since R_h = 0
    exact = _dense_norm(X, head, False)
    assert exact > heuristic
    assert exact <= certified_local_upper(X, head).value


# ----------------------------------------------------------------------------------------------
# fits, summary, report, figure
# ----------------------------------------------------------------------------------------------
def test_fit_sqrt_n_is_exact_on_synthetic_data():
    n = np.array([2, 7, 12, 47, 97])
    assert adv.fit_sqrt_n(n, 2.7 * np.sqrt(n)) == pytest.approx(2.7, rel=F64_REWRITTEN)
    c, alpha = adv.bounds.free_power_law(n, 0.3 * n**0.37)
    assert (c, alpha) == (
        pytest.approx(0.3, rel=F64_EXACT_FIT),
        pytest.approx(0.37, rel=F64_EXACT_FIT),
    )
    # least squares through the origin, not a mean of ratios: closed form on two points
    assert adv.fit_sqrt_n([1, 4], [1.0, 1.0]) == pytest.approx((1 + 2) / (1 + 4))
    with pytest.raises(ValueError):
        adv.fit_sqrt_n([0, 4], [1.0, 1.0])


def test_summary_and_report(tiny):
    root, _ = tiny
    s = adv.summary(root)
    json.dumps(s)
    assert set(s["configs"]) == set(adv.PRESETS["tiny"].options()["configs"])
    for cid, row in s["configs"].items():
        recs = [
            r
            for r in load_jsonl(root / "adversarial" / f"{cid}.jsonl")
            if r["variant"] == "released"
        ]
        n = np.array([r["n"] for r in recs], float)
        y = np.array([r["value"] for r in recs])
        assert row["released"]["C_fit"] == pytest.approx(np.sum(y * np.sqrt(n)) / np.sum(n))
        assert row["paper_C"] == adv.CONFIGS[cid].paper_C
        assert row["bounds_hold"] is True
    md = adv.report_section(root, root / "figures")
    assert "figures/fig_f4_adversarial.png" in md and "| paper configuration |" in md


def test_bad_overrides():
    with pytest.raises(ValueError, match="unknown adversarial option"):
        adv.run("unused", "tiny", bogus=1)
    with pytest.raises(ValueError, match="configs"):
        adv.run("unused", "tiny", configs=["nope"])
    with pytest.raises(ValueError, match="n_grid"):
        adv.run("unused", "tiny", n_grid=[1, 5])
    with pytest.raises(ValueError, match="unknown preset"):
        adv.run("unused", "huge")


def test_figure_renders(tiny, tmp_path):
    from paper_figs import fig_f4_adversarial as f4

    paths = f4.draw(tiny[0], tmp_path)
    assert {p.suffix for p in paths} == {".pdf", ".png"}
    assert all(p.stat().st_size > 0 for p in paths)
    with pytest.raises(FileNotFoundError, match="adversarial"):
        f4.draw(tmp_path / "empty", tmp_path)
