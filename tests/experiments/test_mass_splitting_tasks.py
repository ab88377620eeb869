"""The attacks stage as tasks: its points join the driver's queue, files equal the serial run's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from experiments import mass_splitting
from experiments.engine import Rounds, SerialExecutor, load_jsonl, run_jobs

SMALL = {
    "figure_b": {"radii": [1.0, 4.0], "n_restarts": 1, "steps": 8},
    "figure_c": {"budgets": [0.1, 0.5], "steps": 6},
}


def _files(root: Path) -> dict[str, object]:
    """npz arrays and JSON documents of the stage, without the run metadata's clock and host."""
    out: dict[str, object] = {}
    for stem in ("worst_measures", "mass_splitting"):
        with np.load(root / "attacks" / f"{stem}.npz") as z:
            out[f"{stem}.npz"] = {k: z[k] for k in z.files}
        doc = json.loads((root / "attacks" / f"{stem}.json").read_text())
        doc["metadata"] = doc["metadata"]["config"]
        out[f"{stem}.json"] = doc
    return out


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        if name.endswith(".npz"):
            assert a[name].keys() == b[name].keys()
            for k in a[name]:
                assert a[name][k].dtype == b[name][k].dtype
                np.testing.assert_array_equal(a[name][k], b[name][k], err_msg=f"{name}:{k}")
        else:
            assert a[name] == b[name], name


@pytest.fixture(scope="module")
def serial(run_tiny):
    root, _ = run_tiny(mass_splitting, "serial", **SMALL)
    return root


def test_points_are_one_round_then_assembled(serial, tmp_path):
    rounds = Rounds(mass_splitting.STAGE.start(tmp_path, "tiny", progress=False, **SMALL))
    assert rounds.advance()
    names = sorted(j.sweep.name for j in rounds.jobs)
    assert names == ["mass_splitting_points", "worst_measures_points"]
    assert sum(len(j.points) for j in rounds.jobs) == 4 + 4  # 2 settings x 2 radii, 2 x 2 budgets
    assert not (tmp_path / "attacks" / "worst_measures.npz").exists()
    summary = run_jobs(rounds.jobs, SerialExecutor())
    assert summary.computed == 8
    assert not rounds.advance()  # resumed: assembles
    files = rounds.files
    assert {p.name for p in files} >= {"worst_measures.npz", "mass_splitting_points.jsonl"}
    _same(_files(serial), _files(tmp_path))  # bit for bit, as the serial run


def test_a_lost_point_is_the_only_one_computed_again(serial, tmp_path, monkeypatch):
    import shutil

    shutil.copytree(serial / "attacks", tmp_path / "attacks")
    for stem in ("worst_measures", "mass_splitting"):  # as if killed before assembling
        (tmp_path / "attacks" / f"{stem}.npz").unlink()
    path = tmp_path / "attacks" / "mass_splitting_points.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lost = json.loads(lines[2])["point"]
    path.write_text("".join(lines[:2] + lines[3:]))
    calls = []
    real = mass_splitting.mass_splitting_point

    def counting(cfg):
        calls.append((cfg["input"], cfg["budget"]))
        return real(cfg)

    def boom(cfg):
        raise AssertionError("a finished point was computed again")

    monkeypatch.setattr(mass_splitting.sweep, "mass_splitting_point", counting)
    monkeypatch.setattr(mass_splitting.sweep, "worst_measure_point", boom)
    mass_splitting.run(tmp_path, "tiny", progress=False, **SMALL)
    assert calls == [(lost["input"], lost["budget"])]
    assert len(load_jsonl(path)) == 4
    _same(_files(serial), _files(tmp_path))
