"""The leaf types of a run: a task, its outcome, a sweep's job, and the default cost of a point.

A *task* is one point of a sweep: a pure, top-level (hence picklable) function and that point's
configuration, a plain mapping. An executor (:mod:`experiments.engine._execution`) runs tasks and
hands back one :class:`Outcome` each; the driver builds the tasks from the :class:`SweepJob` of
each sweep (:meth:`Sweep.tasks <experiments.engine.Sweep.tasks>`). :func:`default_cost` weighs a
point when its sweep gives no cost of its own (docs/cluster.md, "Cost model").
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Outcome", "SweepJob", "Task", "default_cost", "order_by_cost"]


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


@dataclass(frozen=True)
class Task:
    """One point to compute.

    Attributes
    ----------
    key : str
        Unique within a run (the driver uses ``<sweep name>/<point key>``).
    fn : callable
        ``fn(config) -> mapping`` of measured values: a top-level function (it is pickled by
        reference when sent to a worker), pure (it writes no file; the driver does).
    config : mapping
        This point's configuration, everything ``fn`` needs (plain, picklable values).
    cost : float, optional
        Overrides :func:`default_cost` of ``config``.
    group : str
        Name of the sweep or stage, for progress.
    """

    key: str
    fn: Callable[[Mapping[str, Any]], Mapping[str, Any]]
    config: Mapping[str, Any]
    cost: float | None = None
    group: str = ""

    @property
    def effective_cost(self) -> float:
        """``cost`` when given, else :func:`default_cost` of the configuration."""
        return float(self.cost) if self.cost is not None else default_cost(self.config)


def order_by_cost(tasks: Iterable[Task]) -> list[Task]:
    """Tasks by decreasing cost; equal costs keep their given order."""
    return sorted(tasks, key=lambda t: -t.effective_cost)  # a stable sort


@dataclass(frozen=True)
class Outcome:
    """What came back for one task.

    ``status`` is ``"ok"`` (``value`` holds the measured values), ``"error"`` (the function raised;
    ``error`` is one line, ``traceback`` the full text) or ``"lost"`` (its worker died too often,
    or the cluster went away: computing it again may well succeed).
    """

    task: Task
    status: str
    value: dict[str, Any] | None = None
    seconds: float = 0.0
    load_seconds: float = 0.0
    error: str | None = None
    traceback: str | None = None
    worker: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the point was computed."""
        return self.status == "ok"


@dataclass
class SweepJob:
    """The points of one sweep, and the task function computing one of them.

    ``sweep`` is an :class:`experiments.engine.Sweep` (its file, configuration hash and finished
    points); ``fn(point)`` returns the measured values of one point, as ``compute`` does for
    :meth:`Sweep.run <experiments.engine.Sweep.run>`, but must be a top-level function;
    ``cost(point)`` overrides :func:`default_cost`.

    ``context`` holds the sweep-level settings the function needs besides the point (a seed, a
    model name, tolerances): the task's configuration is ``{**context, **point}``, while the
    record, and the point's key, keep the point alone, as :meth:`Sweep.run` does. Point and
    context must not share a key.

    ``batch_fn`` and ``batch_key`` (both or neither) compute several points in one task: the
    driver puts the unfinished points of all the jobs with the same ``batch_fn`` whose task
    configurations have equal ``batch_key(config)`` into one task, whose configuration is
    ``{"members": [config, ...]}``; ``batch_fn`` (top-level, pure) returns ``{"members":
    [values, ...]}`` in the same order, and each member still gets its own record, keyed by its
    own point, so resuming works as for single points (docs/cluster.md, "Batched points").
    """

    sweep: Any
    points: Sequence[Mapping[str, Any]]
    fn: Callable[[Mapping[str, Any]], Mapping[str, Any]]
    cost: Callable[[Mapping[str, Any]], float] | None = None
    context: Mapping[str, Any] = field(default_factory=dict)
    batch_fn: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None
    batch_key: Callable[[Mapping[str, Any]], Hashable] | None = None
