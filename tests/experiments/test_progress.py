"""Cost-weighted progress: fraction, ETA, plain-log cadence, stage lines, terminal bar."""

from __future__ import annotations

import io

import pytest

from experiments.engine import CostProgress
from experiments.engine._progress import format_seconds


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _plain(clock: Clock, **kw) -> tuple[CostProgress, io.StringIO]:
    out = io.StringIO()
    return CostProgress(desc="run", stream=out, tty=False, clock=clock, **kw), out


def test_format_seconds() -> None:
    assert format_seconds(None) == "?"
    assert format_seconds(6.4) == "6s"
    assert format_seconds(245) == "4m05s"
    assert format_seconds(3723) == "1h02m03s"


def test_fraction_and_eta_are_cost_weighted_not_count_weighted() -> None:
    clock = Clock()
    p, _ = _plain(clock)
    # 9 cheap points (cost 1 each) and one expensive point (cost 91): total cost 100.
    p.add("s", cost=9.0, points=9)
    p.add("big", cost=91.0, points=1)
    for _ in range(9):
        clock.t += 1.0
        p.advance("s", cost=1.0)
    # 90% of the points but 9% of the cost in 9 s: the rate is 1 cost/s, 91 cost left.
    assert p.done_points == 9 and p.total_points == 10
    assert p.fraction() == pytest.approx(0.09)
    assert p.eta() == pytest.approx(91.0)
    clock.t += 91.0
    p.advance("big", cost=91.0)
    assert p.fraction() == 1.0 and p.eta() == 0.0


def test_eta_unknown_before_any_work_and_skipped_cost_not_in_rate() -> None:
    clock = Clock()
    p, _ = _plain(clock)
    p.add("s", cost=100.0, points=4)
    assert p.eta() is None
    p.skip("s", cost=50.0, points=2)  # found done by a resumed run: no time spent on it
    assert p.fraction() == pytest.approx(0.5)
    assert p.eta() is None  # still nothing measured in this run
    clock.t += 10.0
    p.advance("s", cost=25.0)
    # rate = 25 cost / 10 s; 25 cost left -> 10 s (counting the skipped 50 would say 3.3 s)
    assert p.eta() == pytest.approx(10.0)


def test_plain_lines_once_per_percent_or_minute_whichever_is_rarer() -> None:
    clock = Clock()
    p, out = _plain(clock)
    p.add("s", cost=1000.0, points=1000)
    # fast: 10 percent in 30 s -> no line before a minute has passed
    for _ in range(100):
        clock.t += 0.3
        p.advance("s", cost=1.0)
    assert out.getvalue() == ""
    # cross the minute: exactly one line
    for _ in range(100):
        clock.t += 0.31
        p.advance("s", cost=1.0)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("run: 1") and "% of cost" in lines[0] and "ETA" in lines[0]
    # slow: one point every 30 s, i.e. a percent every 300 s -> one line per percent
    n_before = len(out.getvalue().splitlines())
    pct_before = int(100 * p.fraction())
    for _ in range(50):  # 5 more percent
        clock.t += 30.0
        p.advance("s", cost=1.0)
    new = out.getvalue().splitlines()[n_before:]
    pcts = [int(line.split(": ")[1].split("%")[0]) for line in new]
    # the 20% reached while lines were a minute apart is reported first, then every percent
    assert pct_before == 20 and pcts == [20, 21, 22, 23, 24, 25]
    # never more than one line per minute nor more than one per percent overall
    assert len(out.getvalue().splitlines()) <= int(100 * p.fraction())


def test_stage_lines_and_final_line() -> None:
    clock = Clock()
    p, out = _plain(clock)
    p.add("a", cost=10.0, points=2)
    p.add("b", cost=10.0, points=1)
    p.skip("a", cost=5.0)
    clock.t += 4.0
    p.start_stage("a")
    clock.t += 3.0
    p.advance("a", cost=5.0)
    text = out.getvalue()
    assert "stage a done, 2 points (1 already done) in 3s" in text
    assert "stage b" not in text
    clock.t += 2.0
    p.advance("b", cost=10.0)
    p.close()
    p.close()  # idempotent
    lines = out.getvalue().splitlines()
    assert "stage b done, 1 points in 0s" in lines[-2]
    assert lines[-1] == "run: finished 3/3 points (100% of cost) in 9s"
    summary = p.stage_summary()
    assert summary["a"]["skipped_points"] == 1 and summary["a"]["seconds"] == 3.0


def test_stages_to_come_give_no_share_and_lines_resume_after_new_work() -> None:
    """A serial pipeline declares each stage's points when it starts: with stages still to come
    a line never claims 100 % or an ETA, and once they are declared, percent lines resume
    (before, the first stage's "100%, ETA 0s" line was the last one of a long run)."""
    clock = Clock()
    p, out = _plain(clock)
    p.expect(2)
    p.add("first", cost=10.0, points=10)
    for _ in range(10):
        clock.t += 30.0
        p.advance("first", cost=1.0)
    lines = [line for line in out.getvalue().splitlines() if "stage first" not in line]
    assert lines, "one line per minute while stages are to come"
    assert all("%" not in line and "ETA" not in line for line in lines)
    assert lines[-1] == "run: 10/10 points of the stages so far, 2 stages to come, elapsed 5m00s"
    assert len(lines) == 5  # 300 s at one line per minute
    p.expect(0)
    p.add("last", cost=90.0, points=90)
    assert p.fraction() == pytest.approx(0.1)
    n_before = len(out.getvalue().splitlines())
    for _ in range(20):
        clock.t += 60.0
        p.advance("last", cost=1.0)
    new = out.getvalue().splitlines()[n_before:]
    pcts = [int(line.split(": ")[1].split("%")[0]) for line in new]
    # one line per new percent (a floor may skip one where the share lands a hair below it)
    assert pcts[0] == 11 and pcts[-1] >= 29 and len(pcts) >= 19
    assert all(a < b for a, b in zip(pcts, pcts[1:])) and all("ETA" in line for line in new)


def test_expect_rejects_negative_counts() -> None:
    p, _ = _plain(Clock())
    with pytest.raises(ValueError, match="non-negative"):
        p.expect(-1)


def test_disabled_writes_nothing() -> None:
    clock = Clock()
    p, out = _plain(clock, enabled=False)
    p.add("a", cost=1.0)
    clock.t += 100
    p.advance("a", cost=1.0)
    p.close()
    assert out.getvalue() == ""


def test_terminal_bar_counts_cost() -> None:
    out = io.StringIO()
    clock = Clock()
    p = CostProgress(desc="run", stream=out, tty=True, clock=clock)
    p.add("a", cost=30.0, points=3)
    p.add("b", cost=70.0, points=1)
    clock.t += 1
    p.advance("b", cost=70.0)
    assert p._bar is not None and p._bar.n == pytest.approx(70.0)
    assert p._bar.total == pytest.approx(100.0)
    p.add("c", cost=100.0)  # work declared later grows the bar
    assert p._bar.total == pytest.approx(200.0)
    p.close()
    text = out.getvalue()
    assert "stage b done" in text and "35%" in text
    assert "finished 1/5 points" in text


def test_invalid_cost() -> None:
    p, _ = _plain(Clock())
    with pytest.raises(ValueError):
        p.add("a", cost=-1.0)
