"""The cost model of a run: what a point is expected to cost, and where a run's time went.

- **Predicting.** :func:`default_cost` (``n² · d · windows``) orders the queue and feeds the
  progress; :func:`measured_rate` turns finished records into a worker's rate;
  :func:`predict_wall_time` simulates the largest-first queue on W workers.
- **Measuring.** :func:`loading` times what a task spends loading (models, texts, a layer's
  setup) apart from its work; :class:`ExecutionTimes` gathers, per worker, the tasks, their
  seconds and their loads, with the start of the executor and the imports on each worker, into
  the warm-up of the run.

docs/cluster.md, "Cost model", derives the prediction and checks it against measured runs.
:mod:`experiments.execution` re-exports these names.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .execution import Outcome

__all__ = [
    "ExecutionTimes",
    "default_cost",
    "loading",
    "measured_rate",
    "predict_wall_time",
]


# ---- prediction ---------------------------------------------------------------------------
def default_cost(config: Mapping[str, Any]) -> float:
    """Default cost of one point: ``n² · d · windows`` from its configuration (missing keys: 1).

    Only the order of the costs matters for the queue; for the ETA, the cost should be roughly
    proportional to the time a point takes (docs/cluster.md, "Cost model").
    """

    def num(key: str) -> float:
        v = config.get(key, 1)
        try:
            return float(v)
        except (TypeError, ValueError):
            return 1.0

    return num("n") ** 2 * num("d") * num("windows")


def measured_rate(
    records: Iterable[Mapping[str, Any]],
    cost: Callable[[Mapping[str, Any]], float] = default_cost,
) -> float:
    """Cost per second of one worker, from finished records: ``Σ cost(point) / Σ seconds``.

    ``records`` are sweep records (``{"point", "seconds", ...}``), e.g. of a serial run.
    """
    total_cost = total_s = 0.0
    for r in records:
        total_cost += float(cost(r["point"]))
        total_s += float(r["seconds"])
    if total_s <= 0:
        raise ValueError("no measured time in these records")
    return total_cost / total_s


def predict_wall_time(
    costs: Iterable[float], workers: int, rate: float, *, warmup: float = 0.0
) -> dict[str, float]:
    """Wall time of a cost-ordered queue on ``workers`` identical workers (docs/cluster.md).

    Simulates the queue: points largest first, each to the first worker that is free, a point of
    cost ``c`` taking ``c / rate`` seconds. Returns ``wall`` (``warmup`` + the time the last
    worker finishes), ``work`` (``Σ cost / (workers · rate)``, perfect sharing), ``tail``
    (``wall - warmup - work``, the idle time at the end) and ``efficiency`` (warm-up excluded).
    """
    import heapq

    if workers < 1 or rate <= 0:
        raise ValueError("workers must be >= 1 and rate > 0")
    times = sorted((float(c) / rate for c in costs), reverse=True)
    free = [0.0] * int(workers)
    for t in times:
        heapq.heapreplace(free, free[0] + t)
    makespan = max(free)
    work = sum(times) / workers
    return {
        "wall": warmup + makespan,
        "work": work,
        "tail": makespan - work,
        "efficiency": work / makespan if makespan > 0 else 1.0,
    }


# ---- measurement --------------------------------------------------------------------------
_LOADS = {"seconds": 0.0, "count": 0}


@contextlib.contextmanager
def loading() -> Iterator[None]:
    """Time a load (a model, a tokenized text) in this process, as warm-up rather than work.

    The stages wrap their loads in it; :func:`call_task` reports the seconds a task spent in
    them (``load_seconds``), so that a run on several workers can tell the per-worker warm-up
    from the work itself (docs/cluster.md, "Cost model").
    """
    t0 = time.perf_counter()
    try:
        yield
    finally:
        _LOADS["seconds"] += time.perf_counter() - t0
        _LOADS["count"] += 1


@dataclass
class ExecutionTimes:
    """Where the time of a run on an executor went: the warm-up apart from the work.

    ``start_seconds``: starting the executor (a local cluster and its client, or the connection
    to a scheduler). ``import_seconds``: per worker, importing the task functions' modules (torch
    among them) before the first task. ``workers`` (``per_worker`` in :meth:`as_dict`): per
    worker, its ``tasks``, their ``seconds`` and the part of those spent loading models, texts
    and a layer's setup (``load_seconds``, see :func:`loading`). The warm-up of the run is taken as the start, the slowest worker's imports
    and the mean worker's loads (they overlap across workers); docs/cluster.md, "Cost model".
    """

    start_seconds: float = 0.0
    import_seconds: dict[str, float] = field(default_factory=dict)
    workers: dict[str, dict[str, float]] = field(default_factory=dict)

    def add(self, outcome: Outcome) -> None:
        """Count one outcome against its worker."""
        w = self.workers.setdefault(
            outcome.worker or "unknown", {"tasks": 0, "seconds": 0.0, "load_seconds": 0.0}
        )
        w["tasks"] += 1
        w["seconds"] += outcome.seconds
        w["load_seconds"] += outcome.load_seconds

    def warmup_seconds(self) -> float:
        """Start + the slowest worker's imports + the mean worker's loads."""
        loads = [w["load_seconds"] for w in self.workers.values()]
        imports = max(self.import_seconds.values(), default=0.0)
        return self.start_seconds + imports + (sum(loads) / len(loads) if loads else 0.0)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (``reproduce.json``'s ``execution``)."""
        return {
            "start_seconds": self.start_seconds,
            "import_seconds": dict(self.import_seconds),
            "per_worker": {k: dict(v) for k, v in self.workers.items()},
            "warmup_seconds": self.warmup_seconds(),
            "task_seconds": sum(w["seconds"] for w in self.workers.values()),
            "load_seconds": sum(w["load_seconds"] for w in self.workers.values()),
        }


def _import_modules(names: Sequence[str]) -> dict[str, Any]:
    """Import ``names`` in this (worker) process; its pid and the seconds it took.

    A module that cannot be imported by name (a function sent by value) is skipped: the task
    brings it along.
    """
    import importlib

    t0 = time.perf_counter()
    for name in names:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    return {"pid": os.getpid(), "seconds": time.perf_counter() - t0}
