"""One progress tracker for a whole run, weighted by the cost of each point.

Points of a sweep differ in cost by orders of magnitude (the cost of one point grows like
``n² · d`` times its number of windows), so a count of finished points says little about the time
left. :class:`CostProgress` counts cost instead, and, as soon as points come with their measured
seconds, predicted seconds: each stage (sweep) converts its costs with its own seconds per unit of
cost, measured on its finished records (:meth:`CostProgress.calibrate`) and on the points of this
run, so stages whose costs are in different units compare. The fraction done is the finished
share of the predicted seconds (of the cost, before any timing), and the estimated time left is
the predicted seconds left times the wall seconds per measured point-second of this run (the
remaining cost over this run's cost rate, before any timing). Points found already finished when
a run resumes count as done but not towards the rate, so a resumed run does not promise too much.

On a terminal it draws one tqdm bar. Elsewhere (a batch job's log) it writes plain lines to the
stream: one when a whole percent more is done *and* at least a minute has passed since the last
line, so a log gets at most one line per percent and at most one per minute, whichever is rarer;
plus one line each time a stage finishes, and one at the end. The clock is injectable for tests.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TextIO

__all__ = ["CostProgress", "format_seconds"]


def format_seconds(s: float | None) -> str:
    """``1h02m03s``, ``4m05s`` or ``6s`` (``?`` when unknown)."""
    if s is None or not math.isfinite(s):
        return "?"
    s = max(0, round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    if h:
        return f"{h}h{m:02d}m{sec:02d}s"
    if m:
        return f"{m}m{sec:02d}s"
    return f"{sec}s"


@dataclass
class _Stage:
    name: str
    cost: float = 0.0
    points: int = 0
    done_cost: float = 0.0
    done_points: int = 0
    skipped_points: int = 0
    started: float | None = None
    finished: bool = False
    seconds: float = field(default=0.0)
    # the stage's own time model: measured seconds against cost, from records finished before
    # this run (prior) and from the points computed in it (run)
    prior_cost: float = 0.0
    prior_seconds: float = 0.0
    prior_points: int = 0
    run_seconds: float = 0.0
    run_points: int = 0
    # sums over the timings (points p, cost c, seconds t) for the affine model below
    sums: list[float] = field(default_factory=lambda: [0.0] * 7)  # p, t, pp, cc, pc, pt, ct

    def add_timing(self, points: int, cost: float, seconds: float) -> None:
        if points <= 0 or seconds <= 0:
            return
        p, c, t = float(points), float(cost), float(seconds)
        for i, v in enumerate((p, t, p * p, c * c, p * c, p * t, c * t)):
            self.sums[i] += v

    def time_model(self) -> tuple[float, float] | None:
        """``(a, b)`` with seconds ~ a per point + b per unit of cost, or ``None`` (no timing).

        Least squares over the timings with ``a, b >= 0``. A point has a fixed part (loading a
        window, setting up a solver) that a cost such as n²·d leaves out: seconds per unit of
        cost, read off the cheapest points of a sweep, would predict its costliest ones many
        times too long. Timings that cannot separate the two parts (one timing, or the same cost
        per point in all) give seconds per point.
        """
        p, t, pp, cc, pc, pt, ct = self.sums
        if p <= 0 or t <= 0:
            return None
        spp = t / p
        det = pp * cc - pc * pc
        if cc <= 0 or det <= 1e-9 * pp * cc:  # one timing, or proportional costs
            return spp, 0.0
        a = (pt * cc - ct * pc) / det
        b = (ct * pp - pt * pc) / det
        if a < 0:
            return 0.0, ct / cc
        if b < 0:
            return pt / pp, 0.0
        return a, b


class CostProgress:
    """Progress over several stages, weighted by cost or predicted seconds, with an ETA.

    Parameters
    ----------
    desc : str
        Name shown at the start of every line.
    stream : text stream, optional
        Where lines and the bar go (default ``sys.stderr``).
    tty : bool, optional
        Draw a tqdm bar (``True``) or write plain lines (``False``); default: whether ``stream``
        is a terminal.
    clock : callable, optional
        Monotonic seconds (default :func:`time.monotonic`); tests pass a fake clock.
    min_interval : float
        Seconds between two plain percent lines at least (default 60).
    enabled : bool
        ``False`` prints nothing (the counters still work).

    Examples
    --------
    >>> p = CostProgress(stream=io.StringIO(), tty=False)  # doctest: +SKIP
    >>> p.add("sweep_a", cost=100.0, points=10)  # doctest: +SKIP
    >>> p.advance("sweep_a", cost=10.0)  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        desc: str = "progress",
        stream: TextIO | None = None,
        tty: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        min_interval: float = 60.0,
        enabled: bool = True,
    ) -> None:
        self.desc = desc
        self.stream = stream if stream is not None else sys.stderr
        if tty is None:
            isatty = getattr(self.stream, "isatty", None)
            tty = bool(isatty()) if callable(isatty) else False
        self.tty = tty
        self.clock = clock
        self.min_interval = float(min_interval)
        self.enabled = enabled
        self.stages: dict[str, _Stage] = {}
        self.t0 = clock()
        self._computed_cost = 0.0  # finished in this run (the rate's numerator)
        self._computed_seconds = 0.0  # measured seconds of the points finished in this run
        self._skipped_cost = 0.0
        self._last_line_t = self.t0
        self._last_line_pct = 0
        self._bar = None
        self._closed = False
        self._to_come = 0  # stages that will declare their points later (see expect)

    # ---- declaring work -------------------------------------------------------------------
    def add(self, stage: str, cost: float, points: int = 1) -> None:
        """Declare ``points`` points of total ``cost`` in ``stage`` (may be called repeatedly)."""
        if cost < 0 or points < 0:
            raise ValueError("cost and points must be non-negative")
        st = self.stages.setdefault(stage, _Stage(stage))
        st.cost += float(cost)
        st.points += int(points)
        st.finished = False
        # new work lowers the fraction: percent lines resume from where it now stands
        self._last_line_pct = min(self._last_line_pct, math.floor(100 * self.fraction()))
        self._sync_bar()

    def expect(self, stages: int) -> None:
        """Say that ``stages`` more stages will declare their points later (0: all declared).

        A serial pipeline learns a stage's points only when it runs; until the last one starts,
        the fraction and the ETA would speak of the stages so far only, so lines give the points
        done and the stages still to come instead, once per ``min_interval``.
        """
        if stages < 0:
            raise ValueError("stages must be non-negative")
        self._to_come = int(stages)

    def calibrate(self, stage: str, cost: float, seconds: float, points: int = 1) -> None:
        """Tell the stage's time model about points finished before: their cost and seconds.

        E.g. the records of a sweep found on disk (each carries its point's ``seconds``). With
        such timings, or points advanced with their ``seconds``, progress and ETA are counted in
        predicted seconds, each stage's points and cost converted by its own time model
        (:meth:`_Stage.time_model`: a fixed part per point plus a part per unit of cost).
        """
        st = self.stages.setdefault(stage, _Stage(stage))
        st.prior_cost += float(cost)
        st.prior_seconds += float(seconds)
        st.prior_points += int(points)
        st.add_timing(int(points), float(cost), float(seconds))

    def skip(self, stage: str, cost: float, points: int = 1) -> None:
        """Mark declared points as found finished (resumed): done, but not part of the rate."""
        st = self.stages[stage]
        st.done_cost += float(cost)
        st.done_points += int(points)
        st.skipped_points += int(points)
        self._skipped_cost += float(cost)
        self._after_update(st, float(cost))

    def advance(
        self, stage: str, cost: float, points: int = 1, seconds: float | None = None
    ) -> None:
        """Record ``points`` points of ``cost`` finished in this run, in ``seconds`` if known.

        ``seconds`` is the points' own measured time (on whatever worker ran them): it
        calibrates the stage's time model (:meth:`calibrate`).
        """
        st = self.stages[stage]
        if st.started is None:
            st.started = self.clock()
        st.done_cost += float(cost)
        st.done_points += int(points)
        self._computed_cost += float(cost)
        if seconds is not None:
            st.run_seconds += float(seconds)
            st.run_points += int(points)
            st.add_timing(int(points), float(cost), float(seconds))
            self._computed_seconds += float(seconds)
        self._after_update(st, float(cost))

    def start_stage(self, stage: str) -> None:
        """Note that work on ``stage`` begins now (for its elapsed time; optional)."""
        st = self.stages[stage]
        if st.started is None:
            st.started = self.clock()

    # ---- reading it ----------------------------------------------------------------------
    @property
    def total_cost(self) -> float:
        """Total declared cost."""
        return sum(st.cost for st in self.stages.values())

    @property
    def done_cost(self) -> float:
        """Cost finished, including skipped points."""
        return sum(st.done_cost for st in self.stages.values())

    @property
    def total_points(self) -> int:
        """Number of declared points."""
        return sum(st.points for st in self.stages.values())

    @property
    def done_points(self) -> int:
        """Number of finished points, including skipped ones."""
        return sum(st.done_points for st in self.stages.values())

    @property
    def timed(self) -> bool:
        """Whether some stage has measured seconds: progress then counts predicted seconds."""
        return any(st.time_model() is not None for st in self.stages.values())

    def _seconds_per_point(self) -> float | None:
        secs = sum(st.prior_seconds + st.run_seconds for st in self.stages.values())
        pts = sum(st.prior_points + st.run_points for st in self.stages.values())
        return secs / pts if pts > 0 and secs > 0 else None

    def _predicted(self, st: _Stage, cost: float, points: int) -> float:
        """Seconds of ``points`` points of ``cost`` in stage ``st`` by its time model.

        A stage without timings of its own is given the mean seconds per point of the others.
        """
        model = st.time_model()
        if model is not None:
            return points * model[0] + cost * model[1]
        spp = self._seconds_per_point()
        return points * spp if spp is not None else 0.0

    def predicted_seconds(self) -> tuple[float, float]:
        """``(done, total)`` in predicted seconds of one worker (see :meth:`calibrate`)."""
        done = total = 0.0
        for st in self.stages.values():
            done += self._predicted(st, st.done_cost, st.done_points)
            total += self._predicted(st, st.cost, st.points)
        return done, total

    def fraction(self) -> float:
        """Finished share of the work, in [0, 1] (1 when nothing was declared).

        The share of the predicted seconds when stages have timings (:attr:`timed`), else
        of the total cost.
        """
        if self.timed:
            done, total = self.predicted_seconds()
        else:
            done, total = self.done_cost, self.total_cost
        return 1.0 if total <= 0 else min(1.0, done / total)

    def elapsed(self) -> float:
        """Seconds since this tracker was made."""
        return self.clock() - self.t0

    def eta(self) -> float | None:
        """Estimated seconds left: remaining cost over this run's measured cost rate.

        ``None`` until some cost has been computed in this run.
        """
        remaining = max(0.0, self.total_cost - self.done_cost)
        if remaining == 0.0:
            return 0.0
        elapsed = self.elapsed()
        if self.timed:
            # predicted seconds of one worker left, times the wall seconds per measured point
            # second of this run (about 1/W on W busy workers, more with overheads)
            if self._computed_seconds <= 0 or elapsed <= 0:
                return None
            done, total = self.predicted_seconds()
            return max(0.0, total - done) * elapsed / self._computed_seconds
        if self._computed_cost <= 0 or elapsed <= 0:
            return None
        return remaining * elapsed / self._computed_cost

    def status_line(self) -> str:
        """``desc: 37% of time, 120/400 points, elapsed 12m03s, ETA 20m15s`` (``of cost`` untimed).

        While stages are still to come (:meth:`expect`): ``desc: 120/400 points of the stages so
        far, 3 stages to come, elapsed 12m03s`` (no share or ETA: the rest is not known yet).
        """
        if self._to_come > 0:
            more = f"{self._to_come} stage{'s' if self._to_come > 1 else ''} to come"
            return (
                f"{self.desc}: {self.done_points}/{self.total_points} points of the stages so far, "
                f"{more}, elapsed {format_seconds(self.elapsed())}"
            )
        pct = math.floor(100 * self.fraction())
        return (
            f"{self.desc}: {pct}% of {self._unit()}, {self.done_points}/{self.total_points} points, "
            f"elapsed {format_seconds(self.elapsed())}, ETA {format_seconds(self.eta())}"
        )

    # ---- output --------------------------------------------------------------------------
    def _write(self, line: str) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            self.stream.write(line + "\n")
            self.stream.flush()

    def _ensure_bar(self) -> None:
        if self._bar is not None or not (self.enabled and self.tty):
            return
        from tqdm.auto import tqdm

        self._bar = tqdm(
            total=self.total_cost,
            desc=self.desc,
            file=self.stream,
            bar_format="{desc}: {percentage:3.0f}%|{bar}| {postfix}",
            dynamic_ncols=True,
            leave=True,
        )

    def _unit(self) -> str:
        return "time" if self.timed else "cost"

    def _sync_bar(self) -> None:
        """The bar's total and position: predicted seconds when timed, else cost."""
        if self._bar is None:
            return
        if self.timed:
            done, total = self.predicted_seconds()
        else:
            done, total = self.done_cost, self.total_cost
        self._bar.total = total
        self._bar.n = min(done, total)
        self._bar.refresh()

    def _after_update(self, st: _Stage, cost: float) -> None:
        now = self.clock()
        if st.done_points >= st.points and not st.finished:
            st.finished = True
            st.seconds = now - st.started if st.started is not None else 0.0
            resumed = f" ({st.skipped_points} already done)" if st.skipped_points else ""
            self._write(
                f"{self.desc}: stage {st.name} done, {st.points} points{resumed} in "
                f"{format_seconds(st.seconds)}"
            )
        if self.tty:
            self._ensure_bar()
            if self._bar is not None:
                self._sync_bar()
                eta = format_seconds(self.eta()) if self._to_come == 0 else "?"
                self._bar.set_postfix_str(
                    f"{self.done_points}/{self.total_points} pts, ETA {eta} [{st.name}]",
                    refresh=True,
                )
            return
        if self._to_come > 0:  # no meaningful percent yet: one line per interval
            if now - self._last_line_t >= self.min_interval:
                self._last_line_t = now
                self._write(self.status_line())
            return
        pct = math.floor(100 * self.fraction())
        if pct > self._last_line_pct and now - self._last_line_t >= self.min_interval:
            self._last_line_pct = pct
            self._last_line_t = now
            self._write(self.status_line())

    def close(self) -> None:
        """Write the final line (and close the bar); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if not self.stages:  # nothing was declared: nothing to say
            return
        self._write(
            f"{self.desc}: finished {self.done_points}/{self.total_points} points "
            f"({math.floor(100 * self.fraction())}% of {self._unit()}) in "
            f"{format_seconds(self.elapsed())}"
        )

    def __enter__(self) -> CostProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stage_summary(self) -> Mapping[str, Mapping[str, float]]:
        """Per stage: cost, points, done points and seconds (for reports)."""
        return {
            name: {
                "cost": st.cost,
                "points": st.points,
                "done_points": st.done_points,
                "skipped_points": st.skipped_points,
                "seconds": st.seconds,
            }
            for name, st in self.stages.items()
        }
