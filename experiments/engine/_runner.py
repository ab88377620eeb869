"""Resumable sweeps: skip finished points, one fsynced line per record; a stage's rounds.

A sweep appends each finished point as one JSON line to ``<out>/<name>.jsonl``. A point's key is
a hash of the sweep's configuration and the point's parameters (:mod:`experiments.engine._keys`),
so rerunning the same sweep skips every finished point, and changing the configuration starts a
fresh set of keys. A run killed at any moment loses at most the point in flight: a torn last line
is cut off when the sweep is reopened.

A stage hands its sweeps' points to the driver in explicit rounds (:class:`Rounds`): it yields
the jobs (:meth:`Sweep.job`), the driver computes them, here (:func:`drive`) or on Dask workers
with the other stages' rounds, and the stage reads the records back (:meth:`Sweep.collect`).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ._execution import SerialExecutor, run_jobs
from ._keys import config_hash, point_key
from ._progress import CostProgress
from ._results import load_json, load_jsonl, run_metadata, write_json
from ._tasks import SweepJob, Task
from ._threads import torch_threads

__all__ = [
    "Round",
    "Rounds",
    "Steps",
    "Sweep",
    "drive",
    "joint_rounds",
    "remote",
    "reporting",
    "threaded_rounds",
]

log = logging.getLogger(__name__)


T = TypeVar("T")

#: The jobs of one round: what a stage's ``execute`` yields for the driver to compute.
Round = Sequence[SweepJob]

#: A stage's ``execute``: a generator that yields its rounds and returns the files it wrote.
Steps = Generator[Round, None, list[Path]]

_PROGRESS: contextvars.ContextVar[Any] = contextvars.ContextVar("meanfield_progress", default=None)


@contextlib.contextmanager
def reporting(progress: Any) -> Iterator[None]:
    """Within the block, sweeps computed in this process report to ``progress`` (CostProgress)."""
    token = _PROGRESS.set(progress)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


class Rounds:
    """The driver's side of a stage's run: its rounds, one at a time (docs/cluster.md).

    A stage's ``execute`` is a generator (:data:`Steps`). Each ``yield`` hands the driver a
    round, the :class:`~experiments.engine.SweepJob` s whose points the stage needs next; the
    driver computes them (here, or with the rounds of other stages on Dask workers) and resumes
    the stage, which reads the records (:meth:`Sweep.collect`). The generator's return value is
    the list of files the stage wrote.

    >>> rounds = Rounds(steps)
    >>> while rounds.advance():
    ...     run_jobs(rounds.jobs, executor)
    >>> rounds.files
    """

    def __init__(self, steps: Steps) -> None:
        self._steps = steps
        self.jobs: list[SweepJob] = []
        self.files: list[Path] = []

    def advance(self) -> bool:
        """Resume the stage up to its next round with unfinished points.

        Returns ``True`` with that round in :attr:`jobs`, or ``False`` when the stage has
        returned, with its files in :attr:`files`. A round whose points are all finished (a
        rerun) is handed back at once, without the driver. An exception of the stage propagates.
        """
        while True:
            try:
                jobs = self._steps.send(None)  # send(None) is next(), the first time too
            except StopIteration as stop:
                self.jobs, self.files = [], [Path(p) for p in (stop.value or [])]
                return False
            self.jobs = list(jobs)
            if any(job.sweep.unfinished(job.points) for job in self.jobs):
                return True

    def close(self) -> None:
        """Stop the stage where it waits (its ``finally`` blocks run)."""
        self._steps.close()


def joint_rounds(*parts: Generator[Round, None, T]) -> Generator[Round, None, list[T]]:
    """Run the rounds of several parts of a stage side by side; return their return values.

    Round ``k`` of the result joins round ``k`` of every part still running, so the driver
    computes the points of all the parts in one queue (a stage's sweeps run in parallel on Dask
    workers, not one after the other).
    """
    results: list[Any] = [None] * len(parts)
    pending: dict[int, Round] = {}

    def step(i: int) -> None:
        try:
            pending[i] = parts[i].send(None)  # send(None) is next(), the first time too
        except StopIteration as stop:
            results[i] = stop.value
            pending.pop(i, None)

    for i in range(len(parts)):
        step(i)
    while pending:
        yield [job for i in sorted(pending) for job in pending[i]]
        for i in sorted(pending):
            step(i)
    return results


def threaded_rounds(
    steps: Generator[Round, None, T], threads: int | None
) -> Generator[Round, None, T]:
    """``steps`` with each stretch between two rounds run under ``torch_threads(threads)``.

    A stage's own computations (loading, assembling the records) run on ``threads`` threads,
    while the driver computes a round on the points' own counts: no thread setting is held
    across a ``yield``, where a driver on Dask runs the other stages' passes.
    """
    while True:
        with torch_threads(threads):
            try:
                jobs = steps.send(None)  # send(None) is next(), the first time too
            except StopIteration as stop:
                return stop.value
        yield jobs


def drive(steps: Steps, executor: Any = None, *, progress: Any = None) -> list[Path]:
    """Run a stage's rounds in turn on ``executor`` (default: this process); return its files.

    ``progress`` (a :class:`~experiments.engine.CostProgress`) is told each round's points; it
    defaults to the tracker of :func:`reporting`, else a tracker of its own, shown when
    ``progress`` is true. A point that raises stops the run with
    ``experiments.engine.PointError``.
    """
    given = progress if isinstance(progress, CostProgress) else None
    rounds = Rounds(steps)
    with _tracking(given, "points", bool(progress)) as tracker:
        try:
            while rounds.advance():
                run_jobs(rounds.jobs, executor or SerialExecutor(), progress=tracker)
        finally:
            rounds.close()
    return rounds.files


def _tracking(tracker: Any, desc: str, enabled: bool) -> contextlib.AbstractContextManager[Any]:
    """``tracker``, else the one of :func:`reporting`, else a new one, closed at the end."""
    tracker = tracker if tracker is not None else _PROGRESS.get()
    if tracker is not None:
        return contextlib.nullcontext(tracker)
    return CostProgress(desc=desc, enabled=enabled)


def remote(
    fn: Callable[[Mapping[str, Any]], Mapping[str, Any]],
    config: Mapping[str, Any],
    executor: Any = None,
) -> Any:
    """``fn(config)`` where the points run: on ``executor`` (Dask), else here.

    For what a stage needs to know before it yields its round (a model's layer sizes, the labels
    of its manifest) and would otherwise load in the driver: the call loads it on a worker, in
    that worker's cache, where the points will use it again. ``fn`` is a top-level function,
    like a point's. Raises ``RuntimeError`` when the call fails remotely. Stages call it as
    :meth:`StageRun.remote <experiments.engine.StageRun.remote>`.
    """
    if executor is None:
        return fn(dict(config))
    call = getattr(executor, "call", None)
    if call is not None:  # Dask: always the same worker, which keeps what it loads
        outcome = call(fn, config)
    else:
        (outcome,) = list(executor.map_unordered([Task("remote", fn, dict(config), cost=0.0)]))
    if not outcome.ok:
        raise RuntimeError(f"{getattr(fn, '__name__', fn)} failed on a worker: {outcome.error}")
    return outcome.value


def _repair_torn_tail(path: Path) -> None:
    """Cut a partial last line left by a crash, so later appends start on a fresh line."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as fh:
        fh.seek(-1, os.SEEK_END)
        if fh.read(1) == b"\n":
            return
        fh.seek(0)
        cut = fh.read().rfind(b"\n") + 1
        fh.truncate(cut)
    log.warning("removed an unfinished record at the end of %s", path)


class Sweep:
    """A resumable sweep writing one record per point.

    Parameters
    ----------
    out_dir : path
        Directory for ``<name>.jsonl`` (records) and ``<name>.meta.json`` (metadata of the latest
        configuration run; records of earlier configurations stay in the JSONL file, each
        tagged with its ``config_hash``).
    name : str
        Sweep name (file stem).
    config : mapping
        The resolved configuration; it is hashed into every point key and written to the metadata.
    seed, device, dtype : optional
        Recorded in the metadata.
    """

    def __init__(
        self,
        out_dir: str | os.PathLike,
        name: str,
        config: Mapping[str, Any],
        *,
        seed: int | None = None,
        device: str | None = None,
        dtype: str | None = None,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.name = name
        self.config = dict(config)
        self.digest = config_hash(self.config)
        self.path = self.out_dir / f"{name}.jsonl"
        self.meta_path = self.out_dir / f"{name}.meta.json"
        self.out_dir.mkdir(parents=True, exist_ok=True)
        _repair_torn_tail(self.path)
        try:
            stored = load_json(self.meta_path).get("config_hash")
        except (OSError, ValueError):
            stored = None
        if stored != self.digest:  # new file, or a run with another configuration
            meta = run_metadata(seed=seed, device=device, dtype=dtype, config=self.config)
            write_json(self.meta_path, {"name": name, "config_hash": self.digest, **meta})

    def records(self) -> list[dict[str, Any]]:
        """Finished records of this configuration."""
        return [r for r in load_jsonl(self.path) if r.get("config_hash") == self.digest]

    def done(self) -> set[str]:
        """Keys of finished points."""
        return {r["key"] for r in self.records()}

    def job(
        self,
        points: Iterable[Mapping[str, Any]],
        fn: Callable[[Mapping[str, Any]], Mapping[str, Any]],
        context: Mapping[str, Any] | None = None,
        *,
        cost: Callable[[Mapping[str, Any]], float] | None = None,
        batch_fn: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None,
        batch_key: Callable[[Mapping[str, Any]], Any] | None = None,
    ) -> SweepJob:
        """The points as an ``experiments.engine.SweepJob``, for a stage's round (``fn`` top-level, pure).

        ``fn({**context, **point})`` computes one point; the record and the key keep the point
        alone. The job's unfinished points are those whose key is not in :meth:`done`.
        ``batch_fn`` and ``batch_key`` let the driver compute several points in one task
        (:class:`~experiments.engine.SweepJob`).
        """
        return SweepJob(
            self, [dict(p) for p in points], fn, cost, dict(context or {}), batch_fn, batch_key
        )

    def unfinished(self, points: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The points without a record of this configuration."""
        done = self.done()
        return [dict(p) for p in points if point_key(self.digest, p) not in done]

    def collect(self, points: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The records of ``points``, in their order, after the driver computed their round.

        Raises ``RuntimeError`` naming the sweep when a point has no record (its round was not
        run, or the point failed).
        """
        by_key = {r["key"]: r for r in self.records()}
        keys = [point_key(self.digest, p) for p in points]
        missing = [k for k in keys if k not in by_key]
        if missing:
            raise RuntimeError(
                f"{self.out_dir.name}/{self.name}: {len(missing)} of {len(keys)} point(s) have "
                "no record; rerun to compute them"
            )
        return [by_key[k] for k in keys]

    def run(
        self,
        points: Iterable[Mapping[str, Any]],
        compute: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None,
        *,
        task: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None,
        context: Mapping[str, Any] | None = None,
        cost: Callable[[Mapping[str, Any]], float] | None = None,
        progress: bool = True,
        desc: str | None = None,
    ) -> list[dict[str, Any]]:
        """Compute every unfinished point here, append its record; return all records in order.

        ``compute(point)`` returns the measured values of one point; the record stored is
        ``{"key", "config_hash", "point", "seconds", **values}``. Alternatively ``task`` is a
        top-level function of ``{**context, **point}``. ``cost(point)`` (default
        ``n² · d · windows``) weighs the point in the progress. The points run through the
        driver's :func:`~experiments.engine.run_jobs` in this process (the one writer of
        records), so a sweep run on its own and one run by a stage write the same records. A
        stage does not call this: it yields :meth:`job` to its driver, which may run the points
        elsewhere.
        """
        points = [dict(p) for p in points]
        if compute is None:
            if task is None:
                raise TypeError("give compute or task")
            fn, ctx = task, dict(context or {})
        else:
            fn, ctx = compute, {}
        # a run's tracker draws the one bar; a sweep on its own draws its own
        with _tracking(None, desc or self.name, bool(progress)) as tracker:
            run_jobs([SweepJob(self, points, fn, cost, ctx)], SerialExecutor(), progress=tracker)
        return self.collect(points)
