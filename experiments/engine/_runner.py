"""Resumable sweeps: skip finished points, one fsynced line per record; planning a queue.

A sweep appends each finished point as one JSON line to ``<out>/<name>.jsonl``. A point's key is
a hash of the sweep's configuration and the point's parameters (:mod:`experiments.engine._keys`),
so rerunning the same sweep skips every finished point, and changing the configuration starts a
fresh set of keys. A run killed at any moment loses at most the point in flight: a torn last line
is cut off when the sweep is reopened.

Under :func:`planning`, sweeps queue their unfinished points for the driver
(:func:`~experiments.engine.run_jobs`) instead of computing them.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ._execution import SerialExecutor, calibrate, run_jobs
from ._keys import config_hash, point_key
from ._results import append_jsonl, load_json, load_jsonl, run_metadata, write_json
from ._tasks import SweepJob, Task, default_cost

__all__ = [
    "Deferred",
    "Plan",
    "Sweep",
    "planning",
    "queued",
    "remote",
    "reporting",
    "submit_jobs",
]

log = logging.getLogger(__name__)


class Deferred(Exception):
    """Raised by :meth:`Sweep.run` while planning: the sweep's points were queued, not computed.

    The stage stops there; the driver computes the queued points of every stage in one queue,
    then runs the stage again, which finds them finished (docs/cluster.md).
    """


class Plan:
    """The sweeps queued while a stage runs under :func:`planning` (a list of ``SweepJob``).

    ``executor`` is where the queued points will run (``None``: this process); :func:`remote`
    sends its calls there.
    """

    def __init__(self, executor: Any = None) -> None:
        self.jobs: list[Any] = []
        self.executor = executor

    def add(self, job: Any) -> None:
        """Queue ``job`` unless a job of the same sweep file is queued already."""
        if all(j.sweep.path != job.sweep.path for j in self.jobs):
            self.jobs.append(job)


_PLAN: contextvars.ContextVar[Plan | None] = contextvars.ContextVar("meanfield_plan", default=None)
_PROGRESS: contextvars.ContextVar[Any] = contextvars.ContextVar("meanfield_progress", default=None)


@contextlib.contextmanager
def planning(executor: Any = None) -> Iterator[Plan]:
    """Within the block, sweeps with a task function queue their unfinished points.

    :meth:`Sweep.submit` queues and returns; :meth:`Sweep.run` queues and raises
    :class:`Deferred` (its caller needs the records). Sweeps without a task function compute
    their points at once, in this process, as outside the block. ``executor`` (the one that
    will run the queue) also runs the calls of :func:`remote` made in the block.
    """
    plan = Plan(executor)
    token = _PLAN.set(plan)
    try:
        yield plan
    finally:
        _PLAN.reset(token)


def remote(fn: Callable[[Mapping[str, Any]], Mapping[str, Any]], config: Mapping[str, Any]) -> Any:
    """``fn(config)`` where the points run: on the executor of :func:`planning`, else here.

    For what a stage needs to know before it queues its points (a model's layer sizes, the
    labels of its manifest) and would otherwise load in the driver: the call loads it on a
    worker, in that worker's cache, where the points will use it again. ``fn`` is a top-level
    function, like a point's. Raises ``RuntimeError`` when the call fails remotely.
    """
    plan = _PLAN.get()
    executor = plan.executor if plan is not None else None
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


def queued() -> bool:
    """Whether sweeps were queued under :func:`planning` (the stage must then run again)."""
    plan = _PLAN.get()
    return plan is not None and bool(plan.jobs)


@contextlib.contextmanager
def reporting(progress: Any) -> Iterator[None]:
    """Within the block, sweeps computed in this process report to ``progress`` (CostProgress)."""
    token = _PROGRESS.set(progress)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def submit_jobs(jobs: Iterable[Any]) -> None:
    """Have the points of ``jobs`` (``SweepJob``) computed, now or by the driver's queue.

    Under :func:`planning` the jobs with unfinished points are queued (the stage must then raise
    :class:`Deferred` or check :func:`queued`); otherwise they run here, in one serial queue
    (largest cost first, batched jobs grouped), reporting to the tracker of :func:`reporting`.
    A point that raises stops the run with ``experiments.engine.PointError``.
    """
    jobs = list(jobs)
    plan = _PLAN.get()
    if plan is not None:
        for job in jobs:
            if job.sweep.unfinished(job.points):
                plan.add(job)
        return
    run_jobs(jobs, SerialExecutor(), progress=_PROGRESS.get())


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
        if self._stored_digest() != self.digest:  # new file, or a run with another configuration
            write_json(
                self.meta_path,
                {
                    "name": name,
                    "config_hash": self.digest,
                    **run_metadata(seed=seed, device=device, dtype=dtype, config=self.config),
                },
            )

    def _stored_digest(self) -> str | None:
        try:
            return load_json(self.meta_path).get("config_hash")
        except (OSError, ValueError):
            return None

    def records(self) -> list[dict[str, Any]]:
        """Finished records of this configuration."""
        return [r for r in load_jsonl(self.path) if r.get("config_hash") == self.digest]

    def done(self) -> set[str]:
        """Keys of finished points."""
        return {r["key"] for r in self.records()}

    def tasks(
        self,
        points: Iterable[Mapping[str, Any]],
        fn: Callable[[Mapping[str, Any]], Mapping[str, Any]],
        context: Mapping[str, Any] | None = None,
        *,
        cost: Callable[[Mapping[str, Any]], float] | None = None,
        batch_fn: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None,
        batch_key: Callable[[Mapping[str, Any]], Any] | None = None,
    ) -> Any:
        """The points as an ``experiments.engine.SweepJob`` (``fn`` top-level, pure).

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

    def submit(
        self,
        points: Iterable[Mapping[str, Any]],
        fn: Callable[[Mapping[str, Any]], Mapping[str, Any]],
        context: Mapping[str, Any] | None = None,
        *,
        cost: Callable[[Mapping[str, Any]], float] | None = None,
        progress: bool = True,
        desc: str | None = None,
    ) -> None:
        """Have the points computed, now or, under :func:`planning`, by the driver's queue.

        For a sweep whose records the stage reads only later (through :meth:`run` or
        :meth:`records`), so that several sweeps of a stage join one queue.
        """
        points = [dict(p) for p in points]
        plan = _PLAN.get()
        if plan is not None:
            if self.unfinished(points):
                plan.add(self.tasks(points, fn, context, cost=cost))
            return
        self.run(points, task=fn, context=context, cost=cost, progress=progress, desc=desc)

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
        """Compute every unfinished point and append its record; return all records in order.

        ``compute(point)`` returns the measured values of one point; the record stored is
        ``{"key", "config_hash", "point", "seconds", **values}``. Alternatively ``task`` is a
        top-level function of ``{**context, **point}`` (a task the driver may send to another
        process, see :meth:`tasks`): under :func:`planning` the unfinished points are then
        queued and :class:`Deferred` is raised; otherwise they are computed here, one by one.
        ``cost(point)`` (default ``n² · d · windows``) weighs the point in the progress.
        """
        from tqdm.auto import tqdm

        points = [dict(p) for p in points]
        if compute is None:
            if task is None:
                raise TypeError("give compute or task")
            ctx = dict(context or {})

            def compute(p: Mapping[str, Any]) -> Mapping[str, Any]:
                return task({**ctx, **p})

        cost_of = cost or default_cost
        finished = self.records()
        done = {r["key"] for r in finished}
        todo = [p for p in points if point_key(self.digest, p) not in done]
        plan = _PLAN.get()
        if todo and plan is not None and task is not None:
            plan.add(self.tasks(points, task, context, cost=cost))
            raise Deferred(self.name)
        if len(todo) < len(points):
            log.info(
                "%s: %d of %d points already done", self.name, len(points) - len(todo), len(points)
            )
        tracker = _PROGRESS.get() if todo else None
        label = f"{self.out_dir.name}/{self.name}"
        if tracker is not None:
            tracker.add(label, cost=sum(cost_of(p) for p in todo), points=len(todo))
            tracker.start_stage(label)
            calibrate(tracker, label, finished, cost_of)
        # a run's tracker draws the one bar; a sweep on its own draws its own
        own_bar = progress and _PROGRESS.get() is None
        bar = tqdm(todo, desc=desc or self.name, disable=None if own_bar else True, leave=False)
        t_start = time.perf_counter()
        for p in bar:
            t0 = time.perf_counter()
            values = dict(compute(p))
            record = {
                "key": point_key(self.digest, p),
                "config_hash": self.digest,
                "point": p,
                "seconds": time.perf_counter() - t0,
                **values,
            }
            append_jsonl(self.path, record)
            if tracker is not None:
                tracker.advance(label, cost=cost_of(p), seconds=record["seconds"])
            # one line per point for logs (the bar is off when stderr is not a terminal)
            log.debug("%s: %s done in %.1f s", self.name, p, record["seconds"])
        if todo:
            log.info(
                "%s: %d point(s) computed in %.1f s",
                self.name,
                len(todo),
                time.perf_counter() - t_start,
            )
        by_key = {r["key"]: r for r in self.records()}
        return [by_key[point_key(self.digest, p)] for p in points]
