"""Batched tasks of the driver: several points of several sweeps in one task, one record each."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from experiments.engine import (
    CostProgress,
    PointError,
    SerialExecutor,
    Sweep,
    drive,
    run_jobs,
)


def toy_point(config):
    """Deterministic float64 values of one point (depends on the sweep's scale and the n)."""
    rng = np.random.default_rng(config["n"])
    x = config["scale"] * rng.standard_normal((config["n"], 3))
    return {"value": float(np.linalg.norm(x)), "n_seen": config["n"]}


def toy_batch(config):
    """The points of a batch, each as ``toy_point`` computes it, plus the batch size."""
    members = config["members"]
    assert len({m["n"] for m in members}) == 1  # grouped by n
    return {"members": [{**toy_point(m), "size": len(members)} for m in members]}


def bad_batch(config):
    raise ValueError("boom")


def short_batch(config):
    return {"members": [toy_point(m) for m in config["members"][:-1]]}


class Recording(SerialExecutor):
    """A serial executor that keeps the tasks it was given."""

    def map_unordered(self, tasks):
        self.tasks = list(tasks)
        return super().map_unordered(tasks)


def _jobs(root: Path, fn=toy_batch, scales=(1.0, 2.0), points=(2, 3, 4)):
    jobs = []
    for s in scales:
        sweep = Sweep(root, f"s{s:g}", {"scale": s})
        pts = [{"n": n} for n in points]
        jobs.append(
            sweep.job(
                pts,
                toy_point,
                {"scale": s},
                cost=lambda p: float(p["n"]) ** 2,
                batch_fn=fn,
                batch_key=lambda c: c["n"],
            )
        )
    return jobs


def test_one_task_per_group_one_record_per_point(tmp_path: Path) -> None:
    ex = Recording()
    tracker = CostProgress(enabled=False)
    summary = run_jobs(_jobs(tmp_path / "b"), ex, progress=tracker)
    assert summary.computed == 6
    assert [t.config["members"][0]["n"] for t in ex.tasks] == [2, 3, 4]
    assert [len(t.config["members"]) for t in ex.tasks] == [2, 2, 2]
    assert [t.effective_cost for t in ex.tasks] == [8.0, 18.0, 32.0]  # sum of the members
    assert tracker.done_cost == tracker.total_cost == 2 * (4 + 9 + 16)
    # the same sweeps without batching: same keys, same values
    plain = _jobs(tmp_path / "p")
    for j in plain:
        j.batch_fn = j.batch_key = None
    run_jobs(plain, SerialExecutor())
    for jb, jp in zip(_jobs(tmp_path / "b"), plain):
        rb = {r["key"]: r for r in jb.sweep.records()}
        rp = {r["key"]: r for r in jp.sweep.records()}
        assert rb.keys() == rp.keys() and len(rb) == 3
        for k, r in rp.items():
            assert rb[k]["point"] == r["point"] and rb[k]["value"] == r["value"]
            assert rb[k]["size"] == 2 and "size" not in r
            assert rb[k]["seconds"] >= 0


def test_resume_batches_only_the_unfinished_points(tmp_path: Path) -> None:
    run_jobs(_jobs(tmp_path, scales=(1.0,)), SerialExecutor())  # the first sweep done
    ex = Recording()
    summary = run_jobs(_jobs(tmp_path), ex)
    assert summary.skipped == 3 and summary.computed == 3
    assert [len(t.config["members"]) for t in ex.tasks] == [1, 1, 1]
    second = {r["point"]["n"]: r for r in _jobs(tmp_path)[1].sweep.records()}
    assert sorted(second) == [2, 3, 4] and all(r["size"] == 1 for r in second.values())


def test_batch_errors_name_the_points_and_write_nothing(tmp_path: Path) -> None:
    with pytest.raises(PointError, match="2 points from .*boom"):
        run_jobs(_jobs(tmp_path / "e", fn=bad_batch), SerialExecutor())
    summary = run_jobs(_jobs(tmp_path / "r", fn=bad_batch), SerialExecutor(), on_error="record")
    assert len(summary.errors) == 3 and summary.computed == 0
    assert all(not j.sweep.records() for j in _jobs(tmp_path / "r", fn=bad_batch))
    with pytest.raises(RuntimeError, match="1 results for 2 points"):
        run_jobs(_jobs(tmp_path / "s", fn=short_batch), SerialExecutor())


def test_half_given_batch_is_an_error(tmp_path: Path) -> None:
    (job,) = _jobs(tmp_path, scales=(1.0,))
    job.batch_key = None
    with pytest.raises(ValueError, match="both batch_fn and batch_key"):
        run_jobs([job], SerialExecutor())


def test_a_stage_round_is_computed_by_its_driver_then_collected(tmp_path: Path) -> None:
    jobs = _jobs(tmp_path)
    seen = []

    def steps():
        yield jobs
        seen.append([len(j.sweep.collect(j.points)) for j in jobs])
        yield jobs  # all done: handed back without computing anything
        return [j.sweep.path for j in jobs]

    files = drive(steps(), SerialExecutor())
    assert seen == [[3, 3]]
    assert files == [j.sweep.path for j in jobs]
    assert [len(j.sweep.records()) for j in jobs] == [3, 3]


def test_collect_names_the_sweep_when_a_point_has_no_record(tmp_path: Path) -> None:
    (job,) = _jobs(tmp_path, scales=(1.0,))
    with pytest.raises(RuntimeError, match=r"s/?.*s1: 3 of 3 point\(s\) have no record"):
        job.sweep.collect(job.points)
