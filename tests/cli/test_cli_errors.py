"""Every error of the `meanfield` command line is one line and exit status 2, never a traceback.

Each case is a bad input that once ended in a raw Python traceback, a silent kill or a silent
success; each runs the command in-process on tiny inputs and checks the one line, the status and
that nothing was written. ``--traceback`` shows the full trace instead.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

from meanfield_cli.main import main


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run ``meanfield ARGV``; assert exit 2 and one ``meanfield: error:`` line; return it."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("meanfield: error: ")
    assert "allow_pickle" not in err and "pickle.load" not in err
    return lines[0]


def files_in(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file())


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    """Tiny input files: tokens, a layer, an empty array, damaged archives, a plain file."""
    d = tmp_path / "in"
    d.mkdir()
    np.save(d / "X.npy", np.zeros((3, 2)))
    np.save(d / "empty.npy", np.zeros((0, 3)))
    np.savez(d / "P.npz", A=np.eye(3))
    (d / "corrupt.npz").write_bytes(b"PK\x03\x04" + b"\x00garbage" * 8)  # a zip that is not
    (d / "junk.npz").write_bytes(b"not an array file at all\n" * 4)  # numpy would say "pickle"
    (d / "file.txt").write_text("a file, not a directory\n")
    (d / "adir").mkdir()
    return d


def _unwritable_dir(tmp_path: Path) -> Path | None:
    """A directory in which no file can be created (``None`` when there is none to be had)."""

    def writable(d: Path) -> bool:
        try:
            with tempfile.TemporaryFile(dir=d):
                return True
        except OSError:
            return False

    d = tmp_path / "readonly"
    d.mkdir()
    d.chmod(0o500)
    if not writable(d):
        return d
    # root ignores the mode bits; sysfs refuses new files even to root
    return Path("/sys") if Path("/sys").is_dir() and not writable(Path("/sys")) else None


# ----------------------------------------------------------------------------- the cases
CASES = {
    # meanfield lipschitz on an empty (0, 3) array: was RuntimeError from torch's reshape
    "lipschitz-empty-input": (
        ["lipschitz", "--input", "{in}/empty.npy", "--params", "{in}/P.npz"],
        "X in empty.npy is empty (shape (0, 3))",
    ),
    # a corrupt .npz given to --params: was a 30-line zipfile.BadZipFile
    "lipschitz-corrupt-params": (
        ["lipschitz", "--input", "{in}/X.npy", "--params", "{in}/corrupt.npz"],
        "cannot read {in}/corrupt.npz: the file is damaged",
    ),
    # ... and to attack construct --A-file
    "attack-corrupt-A-file": (
        ["attack", "construct", "--A-file", "{in}/corrupt.npz", "--R", "1", "--n", "3"],
        "cannot read {in}/corrupt.npz: the file is damaged",
    ),
    "attack-junk-A-file": (
        ["attack", "construct", "--A-file", "{in}/junk.npz", "--R", "1", "--n", "3"],
        "cannot read {in}/junk.npz: it is not an .npy or .npz file",
    ),
    # --out naming an existing directory: was IsADirectoryError after the whole computation
    "lipschitz-out-is-a-directory": (
        ["lipschitz", "--random-d", "2", "--n", "3", "--out", "{in}/adir"],
        "--out {in}/adir: is a directory; give a file name",
    ),
    # --out naming an existing file where a directory goes: was FileExistsError
    "reproduce-out-is-a-file": (
        ["reproduce", "--preset", "tiny", "--out", "{in}/X.npy"],
        "--out {in}/X.npy: exists and is not a directory",
    ),
    "demo-out-is-a-file": (
        ["demo", "--no-plot", "--out", "{in}/X.npy"],
        "--out {in}/X.npy: exists and is not a directory",
    ),
    "attack-out-is-a-file": (
        ["attack", "construct", "--random-d", "2", "--R", "1", "--n", "3", "--out", "{in}/X.npy"],
        "--out {in}/X.npy: exists and is not a directory",
    ),
    "lipschitz-out-below-a-file": (
        ["lipschitz", "--random-d", "2", "--n", "3", "--out", "{in}/file.txt/r.json"],
        "--out {in}/file.txt/r.json: {in}/file.txt is not a directory",
    ),
    "profile-out-below-a-file": (
        ["profile", "gpt2-random", "--n", "2", "--out", "{in}/file.txt/profile"],
        "--out {in}/file.txt/profile: {in}/file.txt is not a directory",
    ),
    # the README's own override: a path was looked up as a hub name (73-line chained trace)
    "experiment-models-path": (
        ["experiment", "real_data", "--preset", "tiny", "--out", "{tmp}/results"]
        + ["--set", "models=/nonexistent,", "--set", "configs=[]"],
        "--set models=/nonexistent: no such directory; built-in models:",
    ),
    # a grid that cannot fit in memory: was killed by the system (exit 137), no message
    "bound-grid-too-large": (
        ["bound", "sqrt-n-upper", "--n", "1:1e9:1", "--A-norm", "1", "--V-norm", "1", "--R", "1"],
        "--n 1:1e9:1 has 1,000,000,000 points; at most 10,000,000 fit in memory",
    ),
    "bound-outer-product-too-large": (
        ["bound", "sqrt-n-upper", "--n", "1:1e4", "--R", "1:1e4", "--A-norm", "1", "--V-norm", "1"],
        "has 100,000,000 points; at most 10,000,000 fit in memory",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_and_exit_2(case, inputs, tmp_path, capsys):
    argv, message = CASES[case]
    fill = {"{in}": str(inputs), "{tmp}": str(tmp_path)}

    def sub(text: str) -> str:
        for key, value in fill.items():
            text = text.replace(key, value)
        return text

    before = files_in(tmp_path)
    line = one_line_error(capsys, [sub(a) for a in argv])
    assert sub(message) in line
    assert files_in(tmp_path) == before  # nothing written, nothing left behind
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["profile", "gpt2-random", "--n", "2", "--out", "{ro}/profile"],
        ["lipschitz", "--random-d", "2", "--n", "3", "--out", "{ro}/r.json"],
        ["demo", "--no-plot", "--out", "{ro}/demo"],
    ],
    ids=["profile", "lipschitz", "demo"],
)
def test_unwritable_out_is_refused_before_computing(argv, tmp_path, capsys, monkeypatch):
    ro = _unwritable_dir(tmp_path)
    if ro is None:
        pytest.skip("no directory here refuses new files")
    # profile would load a model first: make sure the check comes before any of it
    import meanfield.models

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before --out was checked")

    monkeypatch.setattr(meanfield.models, "random_gpt2", no_load)
    monkeypatch.setattr(meanfield.models, "load_model", no_load)
    try:
        line = one_line_error(capsys, [a.replace("{ro}", str(ro)) for a in argv])
    finally:
        if ro != Path("/sys"):
            ro.chmod(0o700)
    assert f"cannot write in {ro}" in line


def test_figures_on_damaged_results_name_the_file_and_exit_2(tmp_path, capsys, monkeypatch):
    """Two figures fail to draw, one draws: the command exits 2, naming both files."""
    from meanfield_cli import registry

    stage = tmp_path / "results" / "attacks"
    stage.mkdir(parents=True)
    (stage / "worst_measures.npz").write_bytes(b"not an archive\n" * 4)
    (stage / "worst_measures.json").write_text("{}\n")
    (stage / "mass_splitting.npz").write_bytes(b"PK\x03\x04" + b"\x00" * 40)

    def fine(results, out):
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "ok.pdf").write_bytes(b"%PDF")
        return [Path(out) / "ok.pdf"]

    ok = registry.Figure("OK", fine, registry.FIGURES[0].stage, "a figure that draws")
    monkeypatch.setattr(registry, "FIGURES", (*registry.FIGURES, ok))
    argv = ["figures", "--results", str(tmp_path / "results"), "--out", str(tmp_path / "figs")]
    line = one_line_error(capsys, [*argv, "--only", "B,C,OK"])
    assert "2 figure(s) failed (B, C; 1 drawn into" in line
    assert f"cannot read {stage / 'worst_measures.npz'}: it is not an .npy or .npz file" in line
    assert f"cannot read {stage / 'mass_splitting.npz'}: the file is damaged" in line
    assert (tmp_path / "figs" / "ok.pdf").exists()  # the others are still drawn


def test_load_npz_names_the_file_and_never_suggests_pickle(tmp_path):
    from experiments.engine import load_npz

    bad = tmp_path / "r.npz"
    bad.write_bytes(b"garbage, not a zip\n")
    with pytest.raises(ValueError, match="cannot read .*r.npz: it is not an .npy or .npz") as info:
        load_npz(bad)
    assert "pickle" not in str(info.value)
    with pytest.raises(FileNotFoundError):  # missing stays missing (figures list it as such)
        load_npz(tmp_path / "none.npz")


def test_experiment_takes_the_lock_of_the_reproduce_run(tmp_path, capsys):
    """`experiment --out X/results` while `reproduce --out X` runs: refused, nothing written."""
    from experiments.engine._lock import OutDirLock

    out = tmp_path / "X"
    with OutDirLock(out, command="meanfield reproduce --out X", heartbeat=None):
        argv = ["experiment", "verify_bounds", "--preset", "tiny", "--set", "n_instances=1"]
        line = one_line_error(capsys, [*argv, "--out", str(out / "results"), "--no-progress"])
    assert f"{out} is in use by" in line and "meanfield reproduce --out X" in line
    assert not (out / "results").exists()


def test_internal_error_is_one_line_naming_traceback(monkeypatch, capsys):
    from meanfield_cli.commands import derive

    def broken(args):
        raise RuntimeError("cannot reshape tensor of 0 elements")

    monkeypatch.setattr(derive, "handle", broken)
    line = one_line_error(capsys, ["derive", "kim-softmax-lemma"])
    assert line == (
        "meanfield: error: internal error (RuntimeError: cannot reshape tensor of 0 elements); "
        "rerun with --traceback for the full trace"
    )


@pytest.mark.parametrize("where", ["before", "after"])
def test_traceback_flag_reraises(where, monkeypatch, capsys):
    from meanfield_cli.commands import derive

    def broken(args):
        raise RuntimeError("an internal bug")

    monkeypatch.setattr(derive, "handle", broken)
    argv = ["derive", "kim-softmax-lemma"]
    argv = ["--traceback", *argv] if where == "before" else [*argv, "--traceback"]
    with pytest.raises(RuntimeError, match="an internal bug"):
        main(argv)
    # a user error re-raises too, with its own type
    with pytest.raises(ValueError, match="has 1,000,000,001 points"):
        main(["--traceback", "bound", "trivial", "--V-norm", "0:1e9:1"])


def test_version(capsys):
    import meanfield

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"meanfield {meanfield.__version__}"


def test_keyboard_interrupt_exits_130(monkeypatch, capsys):
    from meanfield_cli.commands import derive

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(derive, "handle", interrupted)
    assert main(["derive", "kim-softmax-lemma"]) == 130
    assert capsys.readouterr().err.strip() == "meanfield: interrupted"


# ----------------------------------------------------------------------------- help texts
def _parsers():
    from meanfield_cli.main import _subparsers, build_parser

    return _subparsers(build_parser())


def test_every_option_and_command_has_help():
    import argparse

    missing = [
        f"{p.prog} {a.option_strings or a.dest}"
        for p in _parsers()
        for a in p._actions
        if not isinstance(a, argparse._SubParsersAction) and not a.help
    ]
    assert missing == []
    assert [p.prog for p in _parsers() if not p.description] == []


def test_bound_help_and_output_have_no_latex(capsys, cli_json):
    import argparse

    from meanfield_cli.commands.bound import register

    sub = argparse.ArgumentParser(prog="meanfield").add_subparsers()
    register(sub)
    text = sub.choices["bound"].format_help()
    assert "\\" not in text and "{" not in text and ":math:" not in text
    doc = cli_json(
        "bound", "sqrt-n-upper", "--n", "3", "--A-norm", "1", "--V-norm", "1", "--R", "1"
    )
    assert doc["summary"] == "Global upper bound on Lip(f | B_R^n) in the √n regime."


def test_experiment_help_lists_every_stage():
    from meanfield_cli.commands.experiment import STAGE_NAMES
    from meanfield_cli.registry import STAGES

    assert STAGE_NAMES == tuple(s.name for s in STAGES)
    (experiment,) = [p for p in _parsers() if p.prog == "meanfield experiment"]
    assert "invertible" in experiment.format_help()


# ----------------------------------------------------------------------- library input rule
@pytest.mark.parametrize("other", ["torch", "numpy"])
def test_params_of_mixed_float_dtypes_are_a_one_line_error(other):
    import torch

    from meanfield import AttentionParams, MultiHeadParams

    A32 = torch.eye(2, dtype=torch.float32)
    V64 = torch.eye(2, dtype=torch.float64) if other == "torch" else np.eye(2)
    with pytest.raises(ValueError, match="V has dtype torch.float64 but A has torch.float32") as e:
        AttentionParams(A32, V64)
    assert "\n" not in str(e.value)
    head = AttentionParams(A32, torch.eye(2, dtype=torch.float32))
    with pytest.raises(ValueError, match="W_O has dtype torch.float64"):
        MultiHeadParams((head,), W_O=V64)
    # inputs without a floating dtype of their own still take the leading matrix's
    assert AttentionParams(A32, [[1, 0], [0, 1]]).V.dtype == torch.float32
    assert AttentionParams(A32, torch.eye(2, dtype=torch.int64)).V.dtype == torch.float32
    assert head.to(torch.float64).V.dtype == torch.float64


def test_check_flag():
    from meanfield._validation import check_flag

    assert check_flag(True, "masked") is True and check_flag(np.bool_(False), "masked") is False
    with pytest.raises(TypeError, match="masked must be True or False, got 'yes'"):
        check_flag("yes", "masked")


@pytest.mark.parametrize("flag", ["yes", 1, None])
def test_masked_must_be_a_bool_everywhere(flag):
    """``masked="yes"`` was read as True: every map and estimator now refuses it in one line."""
    import torch

    from meanfield import AttentionParams, DiracMeasure, attention, self_attention
    from meanfield.lipschitz import certified_local_upper, local_lipschitz

    g = torch.Generator().manual_seed(0)
    p = AttentionParams(*(torch.randn(3, 3, generator=g, dtype=torch.float64) for _ in range(2)))
    X = torch.randn(5, 3, generator=g, dtype=torch.float64)
    calls = [
        lambda: self_attention(X, p, masked=flag),
        lambda: attention(DiracMeasure(X), p, masked=flag),
        lambda: certified_local_upper(X, p, masked=flag),
    ]
    if flag is not None:  # None means "the input's own mask" for the estimator
        calls.append(lambda: local_lipschitz(X, p, masked=flag))
    for call in calls:
        with pytest.raises(TypeError, match=f"masked must be True or False, got {flag!r}"):
            call()


def test_out_checks_create_nothing(tmp_path):
    from meanfield_cli.options import UsageError, check_out_dir, check_out_file

    assert check_out_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert check_out_file(tmp_path / "c" / "r.json") == tmp_path / "c" / "r.json"
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "results").write_text("")
    with pytest.raises(UsageError, match="results exists and is not a directory"):
        check_out_dir(tmp_path / "d", subdirs=("results",))
    assert os.listdir(tmp_path / "d") == ["results"]
