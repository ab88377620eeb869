"""`meanfield reproduce` and `meanfield figures`: orchestration, failure isolation, report, resume.

The orchestration tests run toy stages (a module written into tmp_path) so they are fast; the
end-to-end test on the real stages' ``tiny`` presets is in the slow suite.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from experiments.engine import ModuleStage
from meanfield_cli import pipeline as rp
from meanfield_cli import registry
from meanfield_cli.main import main

TOY = textwrap.dedent(
    '''
    """A toy stage: one JSON file per run, a call counter, optional failure."""
    import json
    from dataclasses import dataclass
    from pathlib import Path
    from typing import ClassVar

    from experiments.engine import Claims, StageConfig

    @dataclass(frozen=True)
    class ToySettings(StageConfig):
        stage: ClassVar[str] = "@NAME@"
        x: int

    PRESETS = {"tiny": ToySettings(1), "quick": ToySettings(2), "paper": ToySettings(3)}
    CALLS = []

    def resolve(preset, settings):
        return PRESETS[preset].options()

    def execute(cfg, out, run):
        CALLS.append((run.preset, run.device))
        if @FAIL@:
            raise RuntimeError("toy stage exploded\\non two lines")
        yield from ()
        p = out / "toy.json"
        p.write_text(json.dumps({"x": cfg["x"]}))
        return [p]

    def claims(results_dir):
        return Claims([], [])

    def summary(results_dir):
        return json.loads((Path(results_dir) / "@NAME@" / "toy.json").read_text())

    def report_section(results_dir, figures_dir):
        return "## @NAME@\\n\\nx = " + str(summary(results_dir)["x"]) + "\\n"
    '''
)

FIG = textwrap.dedent(
    """
    from pathlib import Path

    def draw(results_dir, out_dir):
        src = Path(results_dir) / "@STAGE@" / "toy.json"
        if not src.exists():
            raise FileNotFoundError(f"no results {src}; run the @STAGE@ stage")
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        files = [out / "fig_@STAGE@.png", out / "fig_@STAGE@.pdf"]
        for f in files:
            f.write_text("x")
        return files
    """
)


@pytest.fixture
def toy_stages(tmp_path, monkeypatch):
    pkg = tmp_path / "toypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "good.py").write_text(TOY.replace("@NAME@", "good").replace("@FAIL@", "False"))
    (pkg / "bad.py").write_text(TOY.replace("@NAME@", "bad").replace("@FAIL@", "True"))
    (pkg / "fig_good.py").write_text(FIG.replace("@STAGE@", "good"))
    (pkg / "fig_bad.py").write_text(FIG.replace("@STAGE@", "bad"))
    (pkg / "fig_broken.py").write_text(
        "def draw(results_dir, out_dir):\n    raise KeyError('no')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for mod in [m for m in sys.modules if m.startswith("toypkg")]:
        monkeypatch.delitem(sys.modules, mod)
    import toypkg.bad
    import toypkg.fig_bad
    import toypkg.fig_broken
    import toypkg.fig_good
    import toypkg.good

    def stage(mod, name, title, uses_device=True):
        mod.NAME = name
        return ModuleStage.from_module(mod.__name__, title, uses_device=uses_device)

    good = stage(toypkg.good, "good", "Good stage")
    bad = stage(toypkg.bad, "bad", "Bad", False)
    monkeypatch.setattr(registry, "STAGES", (good, bad))
    monkeypatch.setattr(
        registry,
        "FIGURES",
        (
            registry.Figure("G", toypkg.fig_good.draw, good, "good figure"),
            registry.Figure("X", toypkg.fig_bad.draw, bad, "bad figure"),
            registry.Figure("K", toypkg.fig_broken.draw, good, "broken figure"),
        ),
    )
    return tmp_path


def test_failing_stage_does_not_stop_the_others(toy_stages):
    out = toy_stages / "out"
    doc = rp.reproduce(out, "tiny", progress=False)
    assert doc["stages"]["good"]["status"] == "ok"
    assert doc["stages"]["bad"]["status"] == "failed"
    assert doc["stages"]["bad"]["error"] == "RuntimeError: toy stage exploded on two lines"
    assert doc["figures"]["G"]["status"] == "ok"
    assert doc["figures"]["X"]["status"] == "missing"
    assert doc["figures"]["K"]["status"] == "failed"
    assert "KeyError" in doc["figures"]["K"]["error"]
    saved = json.loads((out / "reproduce.json").read_text())
    assert saved["stages"]["bad"]["status"] == "failed"
    assert saved["metadata"]["config"]["preset"] == "tiny"
    report = (out / "report.md").read_text()
    assert "# Reproduction report: preset `tiny`" in report
    assert "x = 1" in report  # the good stage's section
    assert "**failed**: RuntimeError: toy stage exploded" in report
    assert "[fig_good](figures/fig_good.png)" in report


def test_device_and_preset_are_passed_and_validated(toy_stages):
    import toypkg.bad
    import toypkg.good

    rp.reproduce(toy_stages / "o", "paper", only=["good", "bad"], figures=False, progress=False)
    assert toypkg.good.CALLS == [("paper", "cpu")]
    assert toypkg.bad.CALLS == [("paper", "cpu")]
    assert not (toy_stages / "o" / "report.md").exists()
    with pytest.raises(ValueError, match="unknown preset 'fast'"):
        rp.reproduce(toy_stages / "o", "fast")
    with pytest.raises(ValueError, match="unknown stage"):
        rp.reproduce(toy_stages / "o", "tiny", only=["nope"])
    with pytest.raises(ValueError, match="device must be"):
        rp.reproduce(toy_stages / "o", "tiny", device="tpu")


def test_cli_reproduce_exits_nonzero_with_one_line_on_failure(toy_stages, capsys):
    out = toy_stages / "cli"
    code = main(["reproduce", "--preset", "tiny", "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("meanfield: error: bad, figure K failed")
    assert (out / "report.md").exists()
    argv = ["reproduce", "--preset", "tiny", "--out", str(out), "--only", "good", "--json"]
    code = main(argv + ["--no-progress"])  # progress lines would precede the error
    captured = capsys.readouterr()
    assert code == 2  # figure K still fails: no JSON on stdout, one line on stderr
    assert captured.out == ""
    assert captured.err.strip() == (
        f"meanfield: error: figure K failed (details in {out}/reproduce.json and "
        f"{out}/report.md); rerun the same command to resume"
    )


def test_cli_figures_redraws_and_reports_missing(toy_stages, capsys):
    out = toy_stages / "f"
    rp.reproduce(out, "tiny", only=["good"], figures=False, progress=False)
    code = main(["figures", "--results", str(out / "results"), "--only", "G,X", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    assert doc["figures"]["G"]["status"] == "ok"
    assert doc["figures"]["X"]["status"] == "missing"
    assert (out / "figures" / "fig_good.pdf").exists()
    assert main(["figures", "--results", str(out / "nothing")]) == 2
    assert "no results directory" in capsys.readouterr().err
    assert main(["figures", "--results", str(out / "results"), "--only", "Z"]) == 2
    assert "unknown figure id(s) Z" in capsys.readouterr().err


@pytest.mark.slow
def test_tiny_preset_end_to_end_and_resume(tmp_path):
    out = tmp_path / "rep"
    doc = rp.reproduce(out, "tiny", progress=False)
    assert {k: e["status"] for k, e in doc["stages"].items()} == {
        s.name: "ok" for s in registry.STAGES
    }
    assert {k: e["status"] for k, e in doc["figures"].items()} == {
        f.id: "ok" for f in registry.FIGURES
    }
    for e in doc["figures"].values():
        assert e["files"], e
        for f in e["files"]:
            assert Path(f).stat().st_size > 0, f
    report = (out / "report.md").read_text()
    for fig in registry.FIGURES:
        stems = {p.rsplit("/", 1)[-1] for p in doc["figures"][fig.id]["files"]}
        assert any(f"figures/{s}" in report for s in stems), fig.id
    first = doc["experiments_seconds"]
    again = rp.reproduce(out, "tiny", progress=False, figures=False)
    assert again["experiments_seconds"] < max(0.5 * first, 5.0)
