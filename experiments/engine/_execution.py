"""Running sweep points in this process or on a Dask cluster, with the driver the only writer.

A *task* (:mod:`experiments.engine._tasks`) is one point of a sweep: a pure, top-level (hence
picklable) function and that point's configuration, a plain mapping. An *executor* runs tasks and
hands back their outcomes as they complete; it never writes a file. The *driver*, :func:`run_jobs`,
gathers the unfinished points of several sweeps into one queue ordered by cost, largest first, so
that no worker idles at the end behind one long point, and appends each record to its sweep's
JSONL file as the outcome arrives, in exactly the format of :meth:`experiments.engine.Sweep.run`.
Resuming, atomic appends and the repair of a torn last record are therefore those of
:class:`~experiments.engine.Sweep`.

Executors:

- :class:`SerialExecutor` runs the tasks one after the other in this process (the default).
- :class:`DaskExecutor` submits them to a Dask cluster: a ``LocalCluster`` of worker processes on
  the loopback interface, without a dashboard (``workers=N``), or a running scheduler
  (``scheduler="tcp://host:8786"``). Dask is the optional extra ``meanfield[dist]``; it is
  imported only here, inside the functions that need it.

A worker that dies loses only its points in flight: Dask runs them again on another worker, up to
``allowed_failures`` times, after which the driver records them as lost and goes on; a rerun of
the same command computes them. A driver that dies loses the points in flight and nothing else.

Each worker process keeps what its tasks load (models, texts) in :func:`worker_cache`, so a model
is loaded once per process, not once per point.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Generator, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ._cost_model import LOADS, ExecutionTimes, import_modules
from ._keys import point_key
from ._results import append_jsonl
from ._tasks import Outcome, SweepJob, Task, default_cost, order_by_cost
from ._threads import MAX_THREADS_ENV, thread_cap, worker_thread_cap

__all__ = [
    "DIST_EXTRA_HINT",
    "DaskExecutor",
    "Executor",
    "PointError",
    "RunSummary",
    "SerialExecutor",
    "calibrate",
    "call_task",
    "clear_worker_cache",
    "forget_worker_cache",
    "make_executor",
    "require_dask",
    "run_jobs",
    "worker_cache",
]

log = logging.getLogger(__name__)

DIST_EXTRA_HINT = "install the optional extra: pip install 'meanfield[dist]'"
#: The thread counts that the BLAS and OpenMP pools of a worker are sized from at its start.
_POOL_THREADS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def _one_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())}"


def call_task(
    fn: Callable[[Mapping[str, Any]], Mapping[str, Any]],
    config: Mapping[str, Any],
    threads: int | None = None,
) -> dict[str, Any]:
    """Run ``fn(config)`` and time it; runs on the worker. Exceptions come back as data.

    ``seconds`` is the task's time, ``load_seconds`` the part of it spent in :func:`loading`.

    With ``threads`` set and torch already loaded, the point runs on that many torch threads.
    Point functions that need a fixed thread count for reproducible results set it themselves
    (as the stages do with ``torch_threads``); local Dask workers start with the driver's
    thread settings.
    """
    torch = sys.modules.get("torch")
    old = None
    if threads is not None and torch is not None:
        cap = thread_cap()
        old = torch.get_num_threads()
        torch.set_num_threads(int(threads) if cap is None else min(int(threads), cap))
    t0, loads = time.perf_counter(), LOADS["seconds"]
    try:
        result = {"status": "ok", "value": dict(fn(dict(config)))}
    except Exception as err:  # noqa: BLE001 - any failure of the point is reported to the driver
        result = {"status": "error", "error": _one_line(err), "traceback": traceback.format_exc()}
    finally:
        if old is not None and torch is not None:  # old was read from torch, so torch is loaded
            torch.set_num_threads(old)
    return {
        **result,
        "seconds": time.perf_counter() - t0,
        "load_seconds": LOADS["seconds"] - loads,
        "worker": f"pid {os.getpid()}",
    }


def _outcome(task: Task, raw: Mapping[str, Any], times: ExecutionTimes) -> Outcome:
    """The outcome of ``task`` from what :func:`call_task` returned, counted in ``times``."""
    outcome = Outcome(task=task, **raw)
    times.add(outcome)
    return outcome


# ---- per-process cache --------------------------------------------------------------------
_CACHE: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
_CACHE_MAX = 4
CACHE_STATS = {"hits": 0, "misses": 0}


def worker_cache(key: Hashable, factory: Callable[[], Any]) -> Any:
    """The object cached under ``key`` in this process, made by ``factory()`` on first use.

    Tasks load models and texts through it (key: the model or text specification), so each
    worker process loads each of them once. The cache keeps the ``4`` most recently used objects.
    """
    if key in _CACHE:
        _CACHE.move_to_end(key)
        CACHE_STATS["hits"] += 1
        return _CACHE[key]
    CACHE_STATS["misses"] += 1
    value = _CACHE[key] = factory()
    while len(_CACHE) > _CACHE_MAX:
        _CACHE.popitem(last=False)
    return value


def forget_worker_cache(key: Hashable) -> None:
    """Drop the object cached under ``key`` in this process, if any."""
    _CACHE.pop(key, None)


def clear_worker_cache() -> None:
    """Empty this process's cache (and its hit/miss counters)."""
    _CACHE.clear()
    CACHE_STATS.update(hits=0, misses=0)


# ---- executors ----------------------------------------------------------------------------
class Executor(Protocol):
    """Runs tasks and yields their outcomes as they complete (in any order)."""

    workers: int
    times: ExecutionTimes

    def map_unordered(self, tasks: Sequence[Task]) -> Generator[Outcome, None, None]:
        """Run ``tasks`` (largest cost first) and yield one :class:`Outcome` per task."""

    def close(self) -> None:
        """Release the executor's resources."""


class SerialExecutor:
    """Runs tasks one by one in this process, largest cost first."""

    workers = 1

    def __init__(self, *, threads: int | None = None) -> None:
        self.threads = threads
        self.submitted: list[str] = []
        self.times = ExecutionTimes()

    def map_unordered(self, tasks: Sequence[Task]) -> Generator[Outcome, None, None]:
        """Run each task in turn and yield its outcome."""
        ordered = order_by_cost(tasks)
        self.submitted = [t.key for t in ordered]
        for task in ordered:
            yield _outcome(task, call_task(task.fn, task.config, self.threads), self.times)

    def close(self) -> None:
        """Nothing to release."""

    def __enter__(self) -> SerialExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return "SerialExecutor()"


def require_dask() -> None:
    """Raise a one-line ``ImportError`` naming the extra when Dask is not installed."""
    try:
        import dask  # noqa: F401
        import distributed  # noqa: F401
    except ImportError as err:
        raise ImportError(
            f"--workers and --scheduler run on Dask, which is not installed ({err.name} is "
            f"missing); {DIST_EXTRA_HINT}"
        ) from None


class DaskExecutor:
    """Runs tasks on a Dask cluster; the driver process stays the only writer.

    Parameters
    ----------
    workers : int, optional
        Start a ``LocalCluster`` of this many worker processes, one task at a time each, listening on
        127.0.0.1 only and without a dashboard.
    scheduler : str, optional
        Address of a running scheduler (``tcp://host:8786``) to connect to instead.
    threads : int or None
        Torch threads per task when torch is loaded (default ``None``: leave it to the task).
    allowed_failures : int
        How many times a point may be in flight on a worker that dies before it is given up
        (``LocalCluster`` only; a running scheduler has its own setting). Default 3, Dask's own.
    env : mapping, optional
        Environment of the local workers, on top of this process's own (whose thread settings
        they keep, so that they compute the same floats) and passive OpenMP waiting.
    max_threads : int, None or "auto"
        Most torch threads a point may use on a local worker. ``"auto"`` (default):
        ``os.cpu_count() // workers`` (at least 1), so that the workers do not oversubscribe the
        cores, unless ``OMP_NUM_THREADS`` is set in this process, which is then respected (no
        cap: every point keeps the thread count of the serial run). ``None``: no cap.
    """

    def __init__(
        self,
        workers: int | None = None,
        scheduler: str | None = None,
        *,
        threads: int | None = None,
        allowed_failures: int = 3,
        env: Mapping[str, str] | None = None,
        max_threads: int | str | None = "auto",
    ) -> None:
        require_dask()
        import dask
        from distributed import Client, LocalCluster

        if (workers is None) == (scheduler is None):
            raise ValueError("give exactly one of workers and scheduler")
        t_start = time.perf_counter()
        self.times = ExecutionTimes()
        self._imported: set[str] = set()
        self.threads = threads
        self.cluster = None
        self.submitted: list[str] = []
        self.max_threads: int | None = None
        if scheduler is not None:
            self.client = Client(scheduler)
        else:
            assert workers is not None  # exactly one of workers and scheduler (checked above)
            if int(workers) < 1:
                raise ValueError(f"workers must be at least 1, got {workers}")
            if not log.isEnabledFor(logging.INFO):  # quiet unless asked (-v)
                for name in ("distributed", "dask"):
                    logging.getLogger(name).setLevel(logging.WARNING)
            # The workers inherit this process's thread settings (OMP_NUM_THREADS, ...): the
            # BLAS libraries read them at start, beyond torch.set_num_threads, and a point
            # computed under other settings may differ in the last bits. Each point sets its
            # own torch thread count (the serial run's), so equal settings give equal floats.
            worker_env = {
                "DASK_LOGGING__DISTRIBUTED": "warning",
                "OMP_WAIT_POLICY": "PASSIVE",
                **(dict(env) if env else {}),
            }
            # Dask's nanny sets OMP/MKL/OPENBLAS_NUM_THREADS=1 before it spawns a worker; the
            # BLAS and OpenMP pools are sized from them at start, and a point whose torch thread
            # count is then raised to the serial run's still differs from it in the last bits.
            # Spawn the workers with this process's own values (unset stays unset).
            spawn_env = dict(dask.config.get("distributed.nanny.pre-spawn-environ", {}) or {})
            # Dask also sets MALLOC_TRIM_THRESHOLD_=65536, so that glibc returns freed memory to
            # the system at once; the points allocate and free large tensors in every Jacobian
            # product, and each new allocation then faults its pages in again: a 2-worker run
            # spent 41 % of its CPU time in the kernel (docs/cluster.md, "Cost model").
            # The same rule as the threads: the workers get the driver's own setting.
            for key in (*_POOL_THREADS, "MALLOC_TRIM_THRESHOLD_"):
                if key in os.environ:
                    spawn_env[key] = os.environ[key]
                else:
                    spawn_env.pop(key, None)
            # workers x threads <= cores: each worker's thread pools are sized to its share
            cap = worker_thread_cap(int(workers)) if max_threads == "auto" else max_threads
            if cap is not None:
                self.max_threads = int(cap)
                worker_env[MAX_THREADS_ENV] = str(self.max_threads)
                spawn_env.update(dict.fromkeys(_POOL_THREADS, str(self.max_threads)))
            with dask.config.set(
                {
                    "distributed.scheduler.allowed-failures": int(allowed_failures),
                    "distributed.nanny.pre-spawn-environ": spawn_env,
                }
            ):
                self.cluster = LocalCluster(
                    n_workers=int(workers),
                    threads_per_worker=1,
                    processes=True,
                    host="127.0.0.1",
                    dashboard_address=None,
                    # health and metrics only, on a free loopback port (not 8787, maybe taken)
                    scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
                    env=worker_env,
                )
            try:
                self.client = Client(self.cluster)
            except BaseException:
                self.cluster.close()
                raise
        self.times.start_seconds = time.perf_counter() - t_start

    @property
    def workers(self) -> int:
        """Number of workers connected now (at least 1, for cost estimates)."""
        return max(1, len(self.client.scheduler_info()["workers"]))

    def map_unordered(self, tasks: Sequence[Task]) -> Generator[Outcome, None, None]:
        """Submit every task (largest cost first, highest priority first) and yield outcomes."""
        from distributed import as_completed

        ordered = order_by_cost(tasks)
        self.submitted = [t.key for t in ordered]
        self._import_on_workers(t.fn for t in ordered)
        run = uuid.uuid4().hex[:8]
        futures = {}
        for rank, task in enumerate(ordered):
            fut = self.client.submit(
                call_task,
                task.fn,
                task.config,
                self.threads,
                key=f"point-{run}-{rank}",
                priority=len(ordered) - rank,
                pure=False,
            )
            futures[fut.key] = (fut, task)
        try:
            for fut in as_completed([f for f, _ in futures.values()]):
                yield self._result(fut, futures.pop(fut.key)[1])
        finally:
            if futures:  # the driver stopped early: do not leave work running for nobody
                self.client.cancel([f for f, _ in futures.values()])

    def _import_on_workers(self, fns: Iterable[Callable[..., Any]]) -> None:
        """Import the modules of ``fns`` (not imported yet) on every worker, timed: warm-up."""
        names = sorted({f.__module__ for f in fns} - self._imported)
        if not names:
            return
        try:
            done = self.client.run(import_modules, ["torch", *names])
        except Exception as err:  # noqa: BLE001 - the tasks import them anyway; only timing lost
            log.warning("could not time the imports on the workers: %s", _one_line(err))
            return
        self._imported.update(names)
        seconds = self.times.import_seconds
        for info in done.values():
            key = f"pid {info['pid']}"
            seconds[key] = seconds.get(key, 0.0) + float(info["seconds"])

    def call(
        self, fn: Callable[[Mapping[str, Any]], Mapping[str, Any]], config: Mapping[str, Any]
    ) -> Outcome:
        """Run one task now, preferably on the same worker every time, and return its outcome.

        For the calls a stage makes before it queues its points (``experiments.engine.remote``):
        kept on one worker (another if it is gone), they load each model once, as the driver
        would have, instead of once on each worker they happen to land on.
        """
        names = sorted(self.client.scheduler_info()["workers"])
        where = {"workers": names[:1], "allow_other_workers": True} if names else {}
        fut = self.client.submit(call_task, fn, dict(config), self.threads, pure=False, **where)
        return self._result(fut, Task("remote", fn, dict(config), cost=0.0))

    def _result(self, fut: Any, task: Task) -> Outcome:
        """The outcome of ``task`` from its finished future ``fut``, which is then released.

        ``"lost"`` when the future failed rather than the task (its worker died, the cluster
        went away); the task's own failure comes back as data (:func:`call_task`).
        """
        try:
            raw = fut.result()
        except Exception as err:  # noqa: BLE001 - KilledWorker, lost connection, ...
            return Outcome(task=task, status="lost", error=_one_line(err))
        finally:
            fut.release()
        return _outcome(task, raw, self.times)

    def close(self) -> None:
        """Close the client and, when this executor started it, the local cluster."""
        self.client.close()
        if self.cluster is not None:
            # a worker slow to exit is killed: expected on a busy machine, not worth a warning
            nanny = logging.getLogger("distributed.nanny")
            level = nanny.level
            nanny.setLevel(logging.ERROR)
            try:
                self.cluster.close()
            finally:
                nanny.setLevel(level)
            self.cluster = None

    def __enter__(self) -> DaskExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where: str | None
        if self.cluster is not None:
            where = "LocalCluster"
        else:
            scheduler = self.client.scheduler
            assert scheduler is not None, "a connected client has its scheduler's address"
            where = scheduler.address
        cap = f", max_threads={self.max_threads}" if self.max_threads is not None else ""
        return f"DaskExecutor({where}, workers={self.workers}{cap})"


def make_executor(
    workers: int | None = None, scheduler: str | None = None, **kwargs: Any
) -> SerialExecutor | DaskExecutor:
    """The executor for ``--workers N`` / ``--scheduler ADDRESS``.

    Serial when neither is given or ``workers`` is at most 1; otherwise Dask (a one-line
    ``ImportError`` naming the ``dist`` extra when Dask is not installed).
    """
    if scheduler:
        if workers not in (None, 0):
            raise ValueError("give --workers or --scheduler, not both")
        return DaskExecutor(scheduler=scheduler, **kwargs)
    if workers is None or int(workers) <= 1:
        return SerialExecutor(threads=kwargs.get("threads"))
    return DaskExecutor(workers=int(workers), **kwargs)


# ---- the driver ---------------------------------------------------------------------------


class PointError(RuntimeError):
    """A point's function raised; earlier records are kept, a rerun resumes."""


@dataclass
class RunSummary:
    """What :func:`run_jobs` did."""

    computed: int = 0
    skipped: int = 0
    lost: list[Outcome] = field(default_factory=list)
    errors: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0


def run_jobs(
    jobs: Sequence[SweepJob],
    executor: Executor | None = None,
    *,
    progress: Any = None,
    on_error: str = "raise",
) -> RunSummary:
    """Compute every unfinished point of ``jobs`` on ``executor``; the only writer of records.

    The unfinished points of all jobs form one queue, largest cost first. Each outcome is
    appended to its sweep's JSONL file as it arrives, as ``{"key", "config_hash", "point",
    "seconds", **values}`` (the record of :meth:`Sweep.run <experiments.engine.Sweep.run>`;
    ``seconds`` is the time of the point's function on its worker).

    Parameters
    ----------
    jobs : sequence of SweepJob
        Distinct sweeps (progress names them ``<directory>/<name>`` when two share a name).
    executor : Executor, optional
        Default :class:`SerialExecutor`.
    progress : CostProgress, optional
        Told each job's cost, the points found finished, and each point computed.
    on_error : {"raise", "record"}
        When a point's function raises: stop with :class:`PointError` (the default, as a serial
        sweep does), or record it in the summary and go on. Lost points (dead workers) are always
        recorded and skipped; the next run computes them.

    Returns
    -------
    RunSummary
    """
    if on_error not in ("raise", "record"):
        raise ValueError(f"on_error must be 'raise' or 'record', got {on_error!r}")
    paths = [str(job.sweep.path) for job in jobs]
    if len(set(paths)) != len(paths):
        raise ValueError(f"sweeps must be distinct, got {paths}")
    names = [job.sweep.name for job in jobs]
    stage_too = len(set(names)) != len(names)  # the same name in two stages: tell them apart
    executor = executor if executor is not None else SerialExecutor()
    summary = RunSummary()
    t_start = time.perf_counter()
    tasks: list[Task] = []
    where: dict[str, list[_Member]] = {}
    groups: dict[Hashable, list[_Member]] = {}
    for job in jobs:
        if (job.batch_fn is None) != (job.batch_key is None):
            raise ValueError(f"{job.sweep.name}: give both batch_fn and batch_key, or neither")
        sweep = job.sweep
        label = f"{sweep.out_dir.name}/{sweep.name}" if stage_too else sweep.name
        records = sweep.records()
        done = {r["key"] for r in records}
        points = [dict(p) for p in job.points]
        costs = [float(job.cost(p)) if job.cost else default_cost(p) for p in points]
        if progress is not None:
            progress.add(label, cost=sum(costs), points=len(points))
            progress.start_stage(label)
            calibrate(progress, label, records, job.cost or default_cost)
        seen: set[str] = set()
        for p, c in zip(points, costs):
            pkey = point_key(sweep.digest, p)
            if pkey in done or pkey in seen:
                summary.skipped += pkey in done
                if progress is not None:
                    progress.skip(label, cost=c)
                continue
            seen.add(pkey)
            shared = set(p) & set(job.context)
            if shared:
                raise ValueError(
                    f"{sweep.name}: point and context share the key(s) {', '.join(sorted(shared))}"
                )
            tkey = f"{label}/{pkey}"
            config = {**job.context, **p}
            member = _Member(job, p, pkey, config, c, label)
            if job.batch_fn is not None and job.batch_key is not None:  # both or neither (above)
                gkey = (job.batch_fn, job.batch_key(config))
                if gkey not in groups:  # the group's task takes the place of its first point
                    groups[gkey] = []
                    tasks.append(Task(key=f"batch:{tkey}", fn=job.batch_fn, config={}, group=label))
                    where[f"batch:{tkey}"] = groups[gkey]
                groups[gkey].append(member)
                continue
            where[tkey] = [member]
            tasks.append(Task(key=tkey, fn=job.fn, config=config, cost=c, group=label))
    for i, task in enumerate(tasks):  # fill in the batched tasks: all their members, their cost
        if task.key.startswith("batch:"):
            members = where[task.key]
            config = {"members": [m.config for m in members]}
            tasks[i] = replace(task, config=config, cost=sum(m.cost for m in members))
    if summary.skipped:
        log.info("%d point(s) already done", summary.skipped)
    with contextlib.closing(executor.map_unordered(tasks)) as outcomes:
        for outcome in outcomes:
            _take(outcome, where[outcome.task.key], summary, progress, on_error)
    summary.seconds = time.perf_counter() - t_start
    return summary


def calibrate(
    progress: Any,
    label: str,
    records: Iterable[Mapping[str, Any]],
    cost: Callable[[Mapping[str, Any]], float],
) -> None:
    """Tell ``progress`` the cost and seconds of each finished record of a sweep (its time model).

    One timing per record, so that the model can tell the fixed part of a point from the part
    that grows with its cost.
    """
    for r in records:
        try:
            c, t = float(cost(r["point"])), float(r["seconds"])
        except (KeyError, TypeError, ValueError):
            continue
        if t > 0:
            progress.calibrate(label, cost=c, seconds=t, points=1)


@dataclass(frozen=True)
class _Member:
    """One unfinished point in the driver's queue: its job, point, key, task config and cost."""

    job: SweepJob
    point: dict[str, Any]
    pkey: str
    config: dict[str, Any]
    cost: float
    label: str


def _take(
    outcome: Outcome,
    members: Sequence[_Member],
    summary: RunSummary,
    progress: Any,
    on_error: str,
) -> None:
    """Append the records of one outcome, one per point it computed (or note its failure).

    A batched task's time is shared among its points in proportion to their costs.
    """
    batched = outcome.task.key.startswith("batch:")
    if outcome.ok:
        assert outcome.value is not None, "an outcome with status 'ok' carries its value"
        values = outcome.value["members"] if batched else [outcome.value]
        if len(values) != len(members):
            raise RuntimeError(
                f"{outcome.task.key}: {len(values)} results for {len(members)} points"
            )
        total = sum(m.cost for m in members)
        for m, v in zip(members, values):
            share = m.cost / total if total > 0 else 1.0 / len(members)
            record = {
                "key": m.pkey,
                "config_hash": m.job.sweep.digest,
                "point": m.point,
                "seconds": outcome.seconds * share if batched else outcome.seconds,
                **v,
            }
            append_jsonl(m.job.sweep.path, record)
            summary.computed += 1
            # one line per point for logs (a bar is off when stderr is not a terminal)
            log.debug("%s: %s done in %.1f s", m.label, m.point, record["seconds"])
            if progress is not None:
                progress.advance(m.label, cost=m.cost, seconds=record["seconds"])
        return
    if outcome.status == "error":
        if on_error == "raise":
            m = members[0]
            which = (
                f"point {m.point}" if len(members) == 1 else f"{len(members)} points from {m.point}"
            )
            raise PointError(f"{m.job.sweep.name}: {which} failed: {outcome.error}")
        summary.errors.append(outcome)
    else:
        summary.lost.append(outcome)
    for m in members:
        log.warning("%s: point %s %s: %s", m.job.sweep.name, m.point, outcome.status, outcome.error)
