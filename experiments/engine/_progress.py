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

**Phases.** A pipeline that learns a stage's points only when the stage starts (``meanfield
reproduce`` runs its stages one after the other, then draws the figures) declares its phases up
front, each with its predicted seconds from the cost model (:meth:`CostProgress.plan`), and
brackets each with :meth:`~CostProgress.begin` and :meth:`~CostProgress.end`. The fraction done is
then the predicted seconds of the finished phases plus the done share of the current one, and the
ETA is the predicted seconds left times this run's measured pace (wall seconds per predicted
second, shrunk towards 1 while little is measured): a number from the first line on, the
prediction at first and the measurement soon after. Points found finished (a resumed run) take
their share out of their phase's prediction.

On a terminal it draws one tqdm bar. Elsewhere (a batch job's log) it writes plain lines to the
stream: one when a whole percent more is done *and* at least a minute has passed since the last
line, so a log gets at most one line per percent and at most one per minute, whichever is rarer;
plus one line at the start when phases are planned, one each time a stage finishes, and one at
the end. The clock is injectable for tests.
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
    skipped_cost: float = 0.0
    skipped_points: int = 0
    started: float | None = None
    finished: bool = False
    seconds: float = 0.0
    # the phase the stage's work was declared in (see CostProgress.plan), and the seconds its
    # points were predicted to take by the caller's cost model (0: no prediction)
    phase: str | None = None
    predicted: float = 0.0
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


@dataclass
class _Phase:
    name: str
    predicted: float
    begun: bool = False
    finished: bool = False


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

    #: How many seconds of measurement the prediction of :meth:`plan` weighs, as a share of the
    #: predicted total (clipped to 1 s ... 1 min): the ETA's pace is (elapsed + w) / (done + w).
    PRIOR_SHARE = 0.1

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
        self.phases: dict[str, _Phase] = {}
        self._current: str | None = None  # the phase begun last and not ended
        self.t0 = clock()
        self._computed_cost = 0.0  # finished in this run (the rate's numerator)
        self._computed_seconds = 0.0  # measured seconds of the points finished in this run
        self._last_line_t = self.t0
        self._last_line_pct = 0
        self._bar = None
        self._closed = False
        self._to_come = 0  # stages that will declare their points later (see expect)
        self._label = ""  # what the bar shows in brackets: the stage (sweep) updated last

    # ---- declaring work -------------------------------------------------------------------
    def add(self, stage: str, cost: float, points: int = 1, seconds: float | None = None) -> None:
        """Declare ``points`` points of total ``cost`` in ``stage`` (may be called repeatedly).

        ``seconds``, when known, is what the points are predicted to take (a cost model's
        prediction): until the stage has timings of its own, its points count for that. Work
        declared while a phase is under way (:meth:`begin`) belongs to that phase.
        """
        if cost < 0 or points < 0 or (seconds is not None and seconds < 0):
            raise ValueError("cost, points and seconds must be non-negative")
        st = self.stages.setdefault(stage, _Stage(stage))
        st.cost += float(cost)
        st.points += int(points)
        st.predicted += float(seconds or 0.0)
        if self._current is not None:
            st.phase = self._current
        st.finished = False
        # new work lowers the fraction: percent lines resume from where it now stands
        self._last_line_pct = min(self._last_line_pct, math.floor(100 * self.fraction()))
        self._sync_bar()

    def expect(self, stages: int) -> None:
        """Say that ``stages`` more stages will declare their points later (0: all declared).

        Without phases (:meth:`plan`), a serial pipeline learns a stage's points only when it
        runs; until the last one starts, the fraction and the ETA would speak of the stages so
        far only, so lines give the points done and the stages still to come instead, once per
        ``min_interval``. With phases, this is not needed and is ignored.
        """
        if stages < 0:
            raise ValueError("stages must be non-negative")
        self._to_come = int(stages)

    def plan(self, phases: Mapping[str, float]) -> None:
        """Declare the phases of the run, in order, each with its predicted seconds.

        E.g. the stages of ``meanfield reproduce`` and its figures, predicted by
        :mod:`experiments.engine._cost_model` before any of them runs. Calling it again adds
        phases and updates the prediction of phases not yet begun. From now on the fraction and
        the ETA speak of the phases (see the module's docstring), and a log gets its first line
        at once.
        """
        first = not self.phases
        for name, seconds in phases.items():
            if seconds < 0 or not math.isfinite(seconds):
                raise ValueError(f"predicted seconds of {name!r} must be finite and >= 0")
            ph = self.phases.get(name)
            if ph is None:
                self.phases[name] = _Phase(name, float(seconds))
            elif not ph.begun:
                ph.predicted = float(seconds)
        if first and self.phases:
            self._start_output()
        else:
            self._sync_bar()

    def begin(self, phase: str) -> None:
        """Phase ``phase`` starts now: work declared from here on belongs to it."""
        ph = self.phases.get(phase)
        if ph is None:
            raise KeyError(f"unknown phase {phase!r}; declare it with plan() first")
        ph.begun = True
        self._current = phase
        self._refresh()

    def end(self, phase: str) -> None:
        """Phase ``phase`` is over (done, failed or skipped): it counts as done from now on."""
        ph = self.phases.get(phase)
        if ph is None:
            raise KeyError(f"unknown phase {phase!r}; declare it with plan() first")
        ph.begun = ph.finished = True
        if self._current == phase:
            self._current = None
        self._refresh()

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
        st.skipped_cost += float(cost)
        st.skipped_points += int(points)
        self._after_update(st)

    def advance(
        self, stage: str, cost: float, points: int = 1, seconds: float | None = None
    ) -> None:
        """Record ``points`` points of ``cost`` finished in this run, in ``seconds`` if known.

        ``seconds`` is the points' own measured time (on whatever worker ran them): it
        calibrates the stage's time model (:meth:`calibrate`).
        """
        self.start_stage(stage)
        st = self.stages[stage]
        st.done_cost += float(cost)
        st.done_points += int(points)
        self._computed_cost += float(cost)
        if seconds is not None:
            st.run_seconds += float(seconds)
            st.run_points += int(points)
            st.add_timing(int(points), float(cost), float(seconds))
            self._computed_seconds += float(seconds)
        self._after_update(st)

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
        """Whether some stage has measured or predicted seconds: progress then counts seconds."""
        return any(st.time_model() is not None or st.predicted > 0 for st in self.stages.values())

    def _seconds_per_point(self) -> float | None:
        secs = sum(st.prior_seconds + st.run_seconds for st in self.stages.values())
        pts = sum(st.prior_points + st.run_points for st in self.stages.values())
        if pts <= 0 or secs <= 0:  # no timing: the predictions, if any
            secs = sum(st.predicted for st in self.stages.values() if st.predicted > 0)
            pts = sum(st.points for st in self.stages.values() if st.predicted > 0)
        return secs / pts if pts > 0 and secs > 0 else None

    def _predicted(self, st: _Stage, cost: float, points: int) -> float:
        """Seconds of ``points`` points of ``cost`` in stage ``st`` by its time model.

        A stage without timings of its own counts for its predicted seconds (:meth:`add`), in
        proportion to the cost; one without either is given the mean seconds per point of the
        others.
        """
        model = st.time_model()
        if model is not None:
            return points * model[0] + cost * model[1]
        if st.predicted > 0:
            if st.cost > 0:
                return st.predicted * cost / st.cost
            return st.predicted * points / st.points if st.points else 0.0
        spp = self._seconds_per_point()
        return points * spp if spp is not None else 0.0

    def predicted_seconds(self) -> tuple[float, float]:
        """``(done, total)`` in predicted seconds of one worker (see :meth:`calibrate`)."""
        done = total = 0.0
        for st in self.stages.values():
            done += self._predicted(st, st.done_cost, st.done_points)
            total += self._predicted(st, st.cost, st.points)
        return done, total

    def _phase_share(self, ph: _Phase) -> tuple[float, float]:
        """``(done, total)`` predicted seconds of one phase.

        Its prediction, less the share of its declared work found finished (resumed); done: that
        times the share of the rest finished in this run (0 before it begins, all once ended).
        """
        if not ph.begun:
            return 0.0, ph.predicted
        sts = [st for st in self.stages.values() if st.phase == ph.name]
        parts = [
            (
                self._predicted(st, st.cost, st.points),
                self._predicted(st, st.done_cost, st.done_points),
                self._predicted(st, st.skipped_cost, st.skipped_points),
            )
            for st in sts
        ]
        if not any(t > 0 for t, _, _ in parts):  # nothing timed: in cost
            parts = [(st.cost, st.done_cost, st.skipped_cost) for st in sts]
        total, done, skipped = (sum(part[i] for part in parts) for i in range(3))
        own = ph.predicted * (1.0 - skipped / total) if total > 0 else ph.predicted
        if ph.finished:
            return own, own
        left = total - skipped
        share = (done - skipped) / left if left > 0 else 0.0
        return own * min(1.0, max(0.0, share)), own

    def phase_seconds(self) -> tuple[float, float]:
        """``(done, total)`` predicted seconds over the phases (:meth:`plan`)."""
        done = total = 0.0
        for ph in self.phases.values():
            d, t = self._phase_share(ph)
            done += d
            total += t
        return done, total

    def fraction(self) -> float:
        """Finished share of the work, in [0, 1] (1 when nothing was declared).

        With phases, the share of their predicted seconds; else the share of the predicted
        seconds when stages have timings (:attr:`timed`), else of the total cost.
        """
        done, total = self._done_total()
        return 1.0 if total <= 0 else min(1.0, done / total)

    def _done_total(self) -> tuple[float, float]:
        """``(done, total)``: phase seconds with phases, predicted seconds when timed, else cost."""
        if self.phases:
            return self.phase_seconds()
        if self.timed:
            return self.predicted_seconds()
        return self.done_cost, self.total_cost

    def elapsed(self) -> float:
        """Seconds since this tracker was made."""
        return self.clock() - self.t0

    def pace(self) -> float:
        """Wall seconds per predicted second of the phases, measured so far (1 before that).

        ``(elapsed + w) / (done + w)``: the prediction counts as ``w`` seconds measured at pace
        1 (:attr:`PRIOR_SHARE` of the predicted total), so a run's first seconds (loading,
        imports) do not swing the ETA, and the measurement soon outweighs the prediction.
        """
        done, total = self.phase_seconds()
        w = min(60.0, max(1.0, self.PRIOR_SHARE * total))
        return (max(0.0, self.elapsed()) + w) / (done + w)

    def eta(self) -> float | None:
        """Estimated seconds left.

        With phases: the predicted seconds left times :meth:`pace`, a number from the start.
        Else the remaining cost over this run's measured cost rate (predicted seconds when
        timed, the stages' predictions themselves before any point has its seconds); ``None``
        until something is known.
        """
        if self.phases:
            done, total = self.phase_seconds()
            left = max(0.0, total - done)
            return 0.0 if left == 0.0 else left * self.pace()
        remaining = max(0.0, self.total_cost - self.done_cost)
        if remaining == 0.0:
            return 0.0
        elapsed = self.elapsed()
        if self.timed:
            done, total = self.predicted_seconds()
            if self._computed_seconds <= 0 or elapsed <= 0:
                # no point timed in this run: the prediction itself, if there is one
                if any(st.predicted > 0 for st in self.stages.values()):
                    return max(0.0, total - done)
                return None
            # predicted seconds of one worker left, times the wall seconds per measured point
            # second of this run (about 1/W on W busy workers, more with overheads)
            return max(0.0, total - done) * elapsed / self._computed_seconds
        if self._computed_cost <= 0 or elapsed <= 0:
            return None
        return remaining * elapsed / self._computed_cost

    def _where(self) -> str:
        """``real_data (1/8)``: the phase under way (or the next one), with phases."""
        names = list(self.phases)
        current = self._current
        if current is None:
            current = next((n for n in names if not self.phases[n].finished), None)
        if current is None:
            return ""
        return f"{current} ({names.index(current) + 1}/{len(names)})"

    def status_line(self) -> str:
        """``desc: 37% of time, 120/400 points, elapsed 12m03s, ETA 20m15s`` (``of cost`` untimed).

        With phases: ``desc: 37% of time, real_data (1/8), 120/400 points, elapsed ..., ETA ...``.
        While stages are still to come (:meth:`expect`, no phases): ``desc: 120/400 points of
        the stages so far, 3 stages to come, elapsed 12m03s`` (no share or ETA: the rest is not
        known yet).
        """
        if self._to_come > 0 and not self.phases:
            more = f"{self._to_come} stage{'s' if self._to_come > 1 else ''} to come"
            return (
                f"{self.desc}: {self.done_points}/{self.total_points} points of the stages so far, "
                f"{more}, elapsed {format_seconds(self.elapsed())}"
            )
        pct = math.floor(100 * self.fraction())
        where = f"{self._where()}, " if self.phases and self._where() else ""
        points = (
            f"{self.done_points}/{self.total_points} points, "
            if self.total_points or not self.phases
            else ""
        )
        return (
            f"{self.desc}: {pct}% of {self._unit()}, {where}{points}"
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
            total=max(self.total_cost, 1e-12),
            desc=self.desc,
            file=self.stream,
            bar_format=self._bar_format(""),
            dynamic_ncols=True,
            leave=True,
        )

    @staticmethod
    def _bar_format(text: str) -> str:
        # the text goes into the format itself: tqdm puts ", " before a postfix
        text = text.replace("{", "{{").replace("}", "}}")
        return "{desc}: {percentage:3.0f}%|{bar}| " + text

    def _bar_text(self) -> str:
        eta = format_seconds(self.eta()) if (self._to_come == 0 or self.phases) else "?"
        pts = f"{self.done_points}/{self.total_points} pts, " if self.total_points else ""
        where = self._where() if self.phases else self._label
        return f"{pts}ETA {eta}" + (f" [{where}]" if where else "")

    def _unit(self) -> str:
        return "time" if (self.phases or self.timed) else "cost"

    def _sync_bar(self) -> None:
        """The bar's total, position and text: predicted seconds when timed, else cost."""
        if self._bar is None:
            return
        done, total = self._done_total()
        self._bar.total = max(total, 1e-12)
        self._bar.n = min(done, total)
        self._bar.bar_format = self._bar_format(self._bar_text())
        self._bar.refresh()

    def _start_output(self) -> None:
        """Phases were just planned: the bar, or a first line, at once."""
        if self.tty:
            self._refresh()
            return
        self._last_line_t = self.clock()
        self._last_line_pct = math.floor(100 * self.fraction())
        self._write(self.status_line())

    def _refresh(self, now: float | None = None) -> None:
        """After an update: redraw the bar, or a line if one is due (``now``: the clock's)."""
        if self.tty:
            self._ensure_bar()
            self._sync_bar()
            return
        self._maybe_line(self.clock() if now is None else now)

    def _maybe_line(self, now: float) -> None:
        if now - self._last_line_t < self.min_interval:
            return
        if self._to_come == 0 or self.phases:  # else no meaningful percent: one line per interval
            pct = math.floor(100 * self.fraction())
            if pct <= self._last_line_pct:
                return
            self._last_line_pct = pct
        self._last_line_t = now
        self._write(self.status_line())

    def _after_update(self, st: _Stage) -> None:
        now = self.clock()
        self._label = st.name
        if st.done_points >= st.points and not st.finished:
            st.finished = True
            st.seconds = now - st.started if st.started is not None else 0.0
            resumed = f" ({st.skipped_points} already done)" if st.skipped_points else ""
            self._write(
                f"{self.desc}: stage {st.name} done, {st.points} points{resumed} in "
                f"{format_seconds(st.seconds)}"
            )
        self._refresh(now)

    def close(self) -> None:
        """Write the final line (and close the bar); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._sync_bar()
            self._bar.close()
            self._bar = None
        if not self.stages and not self.phases:  # nothing was declared: nothing to say
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
        keys = ("cost", "points", "done_points", "skipped_points", "seconds")
        return {name: {k: getattr(st, k) for k in keys} for name, st in self.stages.items()}
