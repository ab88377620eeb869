"""Progress in predicted seconds: each stage's cost converted by its own measured time model."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from experiments.engine import CostProgress, SerialExecutor, Sweep, SweepJob, run_jobs


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _plain(clock: Clock) -> tuple[CostProgress, io.StringIO]:
    out = io.StringIO()
    return CostProgress(desc="run", stream=out, tty=False, clock=clock, min_interval=0), out


def test_stages_in_different_cost_units_are_compared_in_seconds() -> None:
    clock = Clock()
    p, out = _plain(clock)
    p.add("model", cost=2e6, points=2)  # n² d units: 1e6 a point, 1 s each
    p.add("engine", cost=10.0, points=10)  # 1 a point, 1 s each
    clock.t += 2.0
    p.advance("model", cost=1e6, seconds=1.0)
    p.advance("engine", cost=1.0, seconds=1.0)
    assert p.timed
    # by cost, half would be done and 2 s left; in seconds, 2 of 12 are done and 10 s left
    assert p.predicted_seconds() == pytest.approx((2.0, 12.0))
    assert p.fraction() == pytest.approx(2 / 12)
    assert p.eta() == pytest.approx(10.0)
    assert "16% of time" in out.getvalue()


def test_eta_divides_by_the_parallelism_measured_in_this_run() -> None:
    clock = Clock()
    p, _ = _plain(clock)
    p.add("s", cost=8.0, points=8)
    clock.t += 1.0  # two workers: two points of 1 s each finished in 1 s of wall time
    p.advance("s", cost=1.0, seconds=1.0)
    p.advance("s", cost=1.0, seconds=1.0)
    assert p.eta() == pytest.approx(3.0)  # 6 s of work left on 2 workers


def test_records_calibrate_before_any_point_and_untimed_stages_use_the_mean() -> None:
    clock = Clock()
    p, _ = _plain(clock)
    p.add("a", cost=100.0, points=4)
    p.calibrate("a", cost=50.0, seconds=10.0, points=2)  # 0.2 s per cost from earlier records
    p.skip("a", cost=50.0, points=2)
    p.add("b", cost=3.0, points=3)  # no timings: the mean of the others, 5 s a point
    assert p.predicted_seconds() == pytest.approx((10.0, 20.0 + 15.0))
    assert p.eta() is None  # nothing measured in this run: no wall rate yet
    clock.t += 4.0
    p.advance("a", cost=25.0, seconds=4.0)  # 14 s for 75 cost now: 14/75 s per cost
    done, total = p.predicted_seconds()
    spp = 14.0 / 3  # seconds per point of the timed stages, for b
    assert done == pytest.approx(75 * 14 / 75)
    assert total == pytest.approx(100 * 14 / 75 + 3 * spp)
    assert p.eta() == pytest.approx((total - done) * 4.0 / 4.0)


def test_without_seconds_it_counts_cost_as_before() -> None:
    clock = Clock()
    p, out = _plain(clock)
    p.add("s", cost=10.0, points=2)
    clock.t += 5.0
    p.advance("s", cost=4.0)
    assert not p.timed and p.fraction() == pytest.approx(0.4)
    assert p.eta() == pytest.approx(7.5)
    assert "of cost" in out.getvalue()


def slow_point(config):
    return {"v": config["n"]}


def test_run_jobs_feeds_point_seconds_and_earlier_records(tmp_path: Path) -> None:
    def jobs():
        a = Sweep(tmp_path, "a", {"k": "a"})
        b = Sweep(tmp_path, "b", {"k": "b"})
        return [
            SweepJob(a, [{"n": n} for n in range(4)], slow_point, cost=lambda p: 1e6),
            SweepJob(b, [{"n": n} for n in range(2)], slow_point, cost=lambda p: 1.0),
        ]

    first = CostProgress(enabled=False)
    run_jobs(jobs(), SerialExecutor(), progress=first)
    assert first.timed  # the points came back with their seconds
    assert {k: st.run_points for k, st in first.stages.items()} == {"a": 4, "b": 2}
    recorded = {s.sweep.name: sum(r["seconds"] for r in s.sweep.records()) for s in jobs()}
    second = CostProgress(enabled=False)
    summary = run_jobs(jobs(), SerialExecutor(), progress=second)  # all done: priors only
    assert summary.skipped == 6 and summary.computed == 0
    for name, st in second.stages.items():
        assert st.prior_points == (4 if name == "a" else 2)
        assert st.prior_seconds == pytest.approx(recorded[name])
        assert st.prior_cost == (4e6 if name == "a" else 2.0)


def test_time_model_separates_the_fixed_part_of_a_point_from_its_cost() -> None:
    # a sweep over n with cost n^2 whose points also take a fixed 1.5 s (loading, set-up): the
    # seconds per unit of cost of its cheapest points would predict the costliest ones hundreds
    # of times too long (the early "ETA 51m" of a 3-minute demo)
    clock = Clock()
    p, _ = _plain(clock)
    ns = [2, 4, 8, 16, 32, 64, 96]

    def secs(n: int) -> float:
        return 1.5 + 1e-3 * n * n

    p.add("s", cost=float(sum(n * n for n in ns)), points=len(ns))
    truth = sum(secs(n) for n in ns)
    clock.t += secs(2)
    p.advance("s", cost=4.0, seconds=secs(2))
    # one timing cannot separate the parts: seconds per point
    assert p.predicted_seconds() == pytest.approx((secs(2), len(ns) * secs(2)))
    clock.t += secs(4)
    p.advance("s", cost=16.0, seconds=secs(4))
    done, total = p.predicted_seconds()
    assert done == pytest.approx(secs(2) + secs(4)) and total == pytest.approx(truth)
    assert p.eta() == pytest.approx(truth - secs(2) - secs(4))
    # the ratio model it replaces: 2.5 s per unit of cost... would predict ~4 hours here
    ratio = (secs(2) + secs(4)) / 20.0
    assert ratio * sum(n * n for n in ns) > 20 * truth


def test_time_model_never_goes_negative() -> None:
    clock = Clock()
    p, _ = _plain(clock)
    p.add("s", cost=30.0, points=3)
    p.advance("s", cost=10.0, seconds=2.0)
    p.advance("s", cost=5.0, seconds=3.0)  # cheaper but slower: no cost part, 2.5 s a point
    assert p.stages["s"].time_model() == pytest.approx((2.5, 0.0))
    q, _ = _plain(clock)
    q.add("s", cost=30.0, points=3)
    q.advance("s", cost=10.0, seconds=0.5)
    q.advance("s", cost=100.0, seconds=10.0, points=2)  # faster than proportional: cost only
    a, b = q.stages["s"].time_model()
    assert a == 0.0 and b == pytest.approx((10 * 0.5 + 100 * 10) / (10**2 + 100**2))
