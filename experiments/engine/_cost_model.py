"""The cost model of a run: what a point is expected to cost, and where a run's time went.

- **Predicting.** :func:`~experiments.engine._tasks.default_cost` (``n² · d · windows``, with the
  task it weighs) orders the queue and feeds the progress; :func:`measured_rate` turns finished
  records into a worker's rate; :func:`predict_wall_time` simulates the largest-first queue on W
  workers.
- **Predicting a run before it starts**, for the progress's first ETA: the seconds of each stage
  of ``meanfield reproduce`` and of its figures (:func:`predict_stage_seconds`,
  :func:`predict_figures_seconds`), and of ``meanfield profile`` from the model's shapes
  (:func:`predict_profile`), all measured on 2 CPU cores.
- **Measuring.** :func:`loading` times what a task spends loading (models, texts, a layer's
  setup) apart from its work; :class:`ExecutionTimes` gathers, per worker, the tasks, their
  seconds and their loads, with the start of the executor and the imports on each worker, into
  the warm-up of the run.

docs/cluster.md, "Cost model", derives the prediction and checks it against measured runs.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._tasks import default_cost

if TYPE_CHECKING:
    from ._tasks import Outcome

__all__ = [
    "FIGURES_SECONDS",
    "LOAD_SECONDS",
    "STAGE_SECONDS",
    "ExecutionTimes",
    "LOADS",
    "ProfilePrediction",
    "import_modules",
    "loading",
    "measured_rate",
    "predict_figures_seconds",
    "predict_profile",
    "predict_stage_seconds",
    "predict_wall_time",
    "profile_step_cost",
]


# ---- prediction ---------------------------------------------------------------------------


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


# ---- predicting a whole run before it starts ----------------------------------------------
#: The ``long`` preset's predicted seconds on 2 quiet CPU cores (the long_context stage alone),
#: from per-product times measured at shorter n: the presets' comment in
#: ``experiments/long_context/settings.py`` says how.
LONG_SECONDS = 3300.0
#: Seconds of each stage of ``meanfield reproduce`` on 2 CPU cores into a fresh output directory,
#: per preset: ``quick`` and ``paper`` from docs/experiments.md ("Run times", fresh clone),
#: ``tiny`` measured on 2026-11-26. They give the progress its first fraction and ETA before a
#: stage has declared its points; the measured pace of the run corrects them as it goes.
#: ``long`` (the long_context stage alone) is a prediction, not a measurement: :data:`LONG_SECONDS`.
STAGE_SECONDS: dict[str, dict[str, float]] = {
    "tiny": {
        "real_data": 25.0,
        "adversarial": 1.0,
        "synthetic": 1.0,
        "attacks": 4.0,
        "verify_bounds": 1.0,
        "invertible": 0.5,
        "kim_tightness": 1.0,
        "long_context": 10.0,
    },
    "quick": {
        "real_data": 138.0,
        "adversarial": 38.0,
        "synthetic": 24.0,
        "attacks": 15.0,
        "verify_bounds": 7.0,
        "invertible": 1.0,
        "kim_tightness": 7.0,
        # measured 2026-11-27, one thread on a loaded machine: 7.4 s of CPU time (the
        # certified bracket of every point)
        "bounded_logits": 8.0,
    },
    "paper": {
        "real_data": 3900.0,
        "adversarial": 132.0,
        "synthetic": 174.0,
        "attacks": 66.0,
        "verify_bounds": 36.0,
        "invertible": 1.0,
        "kim_tightness": 264.0,
    },
    # the long_context stage's prediction (experiments/long_context/settings.py, PRESETS)
    "long": {"long_context": LONG_SECONDS},
}
#: Seconds to draw all :data:`FIGURES_MEASURED` figures of a preset on 2 CPU cores.
FIGURES_SECONDS: dict[str, float] = {"tiny": 15.0, "quick": 30.0, "paper": 36.0}
FIGURES_MEASURED = 13
#: A stage missing from :data:`STAGE_SECONDS` (a new one): this many seconds.
UNKNOWN_STAGE_SECONDS = 10.0
#: A stage that an earlier run into the same directory finished resumes in this share of its
#: time (it loads its inputs and finds its points done), at least :data:`RESUMED_MIN_SECONDS`.
RESUMED_SHARE = 0.05
RESUMED_MIN_SECONDS = 1.0


def predict_stage_seconds(
    stages: Iterable[str], preset: str, *, finished: Iterable[str] = ()
) -> dict[str, float]:
    """Predicted seconds of each stage on 2 CPU cores (:data:`STAGE_SECONDS`), in order.

    ``finished``: stages an earlier run into the same directory finished, which resume.
    """
    table = STAGE_SECONDS.get(preset, {})
    done = set(finished)
    out = {}
    for name in stages:
        s = float(table.get(name, UNKNOWN_STAGE_SECONDS))
        out[name] = max(RESUMED_MIN_SECONDS, RESUMED_SHARE * s) if name in done else s
    return out


def predict_figures_seconds(preset: str, figures: int = FIGURES_MEASURED) -> float:
    """Predicted seconds to draw ``figures`` figures of ``preset`` on 2 CPU cores."""
    per = FIGURES_SECONDS.get(preset, FIGURES_SECONDS["quick"]) / FIGURES_MEASURED
    return per * max(0, int(figures))


#: Seconds to load a built-in model of ``meanfield profile`` (and tokenize the text) on 2 CPU
#: cores, measured on 2026-11-26; SmolLM2 de-quantizes its GGUF weights. A local checkpoint:
#: :data:`LOAD_SECONDS_BASE` plus its weights at :data:`LOAD_BYTES_PER_SECOND`.
LOAD_SECONDS: dict[str, float] = {
    "smollm2": 17.0,
    "minilm": 2.5,
    "gpt2-random": 3.5,
    "bert-random": 3.0,
}
LOAD_SECONDS_BASE = 2.0
LOAD_BYTES_PER_SECOND = 100e6
#: The profile's time model on 2 CPU cores (float64, 24 Lanczos steps), seconds = a + b · cost,
#: with the cost of :func:`profile_step_cost`: one layer (its attention brackets and its block's
#: Jacobian), and one end-to-end run (cost: the layers' costs summed). Fitted on 2026-11-26 on
#: SmolLM2 (``--n 16 32``, all 30 layers: 4 min 34 s and, on a busy machine, 6 min 16 s measured,
#: load included, against 5 min 34 s predicted; a user measured 8 min 42 s), GPT-2 small shapes
#: and a 2-layer Llama with d = 32: within a factor 2.5 per step.
PROFILE_LAYER_SECONDS = (0.1, 5e-8)
PROFILE_END_TO_END_SECONDS = (0.02, 2e-8)
#: Setting up: the blocks in float64 (a + per layer) and the certified norms of each layer's
#: weight matrices (b · d · d_ff per layer).
PROFILE_SETUP_SECONDS = (0.1, 0.02, 2.5e-7)


def profile_step_cost(n: int, d: int, d_ff: int, heads: bool = True) -> float:
    """Cost of one layer of ``meanfield profile`` at window ``n`` (as its progress counts it)."""
    attn = n * n * d * (2 if heads else 1) + n * d * d
    return float(attn + 3 * n * d * d_ff)


@dataclass(frozen=True)
class ProfilePrediction:
    """What :func:`predict_profile` expects a profile to take on 2 CPU cores.

    ``setup``: seconds before the first step; ``steps``: seconds of each step by its label
    (``"n=16 layer 3"``, ``"n=16 end-to-end"``, as :class:`meanfield.profile.ProfileProgress`
    names them), in order.
    """

    setup: float
    steps: dict[str, float]

    @property
    def total(self) -> float:
        """Setup and steps."""
        return self.setup + sum(self.steps.values())


def predict_profile(
    *,
    layers: Sequence[int],
    ns: Sequence[int],
    d: int,
    d_ff: int,
    heads: bool = True,
    end_to_end: bool = True,
    krylov: int = 24,
) -> ProfilePrediction:
    """Predicted seconds of ``meanfield profile`` on 2 CPU cores, from the model's shapes.

    ``layers`` are the profiled layers (all layers from the first to the last are set up);
    ``end_to_end`` only counts for a consecutive range, as in the profile itself.
    """
    layers = sorted(set(int(x) for x in layers))
    ns = sorted(set(int(x) for x in ns))
    span = layers[-1] - layers[0] + 1 if layers else 0
    a0, a1, b = PROFILE_SETUP_SECONDS
    setup = a0 + span * (a1 + b * d * d_ff)
    la, lb = PROFILE_LAYER_SECONDS
    ea, eb = PROFILE_END_TO_END_SECONDS
    e2e = end_to_end and span == len(layers)
    steps: dict[str, float] = {}
    for n in ns:
        c = profile_step_cost(n, d, d_ff, heads)
        for layer in layers:
            steps[f"n={n} layer {layer}"] = la + lb * c
        if e2e:
            steps[f"n={n} end-to-end"] = (ea + eb * c * len(layers)) * krylov / 24
    return ProfilePrediction(setup, steps)


# ---- measurement --------------------------------------------------------------------------
#: Seconds and count of the loads :func:`loading` timed in this process (``call_task`` reads it).
LOADS = {"seconds": 0.0, "count": 0}


@contextlib.contextmanager
def loading() -> Iterator[None]:
    """Time a load (a model, a tokenized text) in this process, as warm-up rather than work.

    The stages wrap their loads in it; :func:`~experiments.engine._execution.call_task` reports
    the seconds a task spent in them (``load_seconds``), so that a run on several workers can
    tell the per-worker warm-up from the work itself (docs/cluster.md, "Cost model").
    """
    t0 = time.perf_counter()
    try:
        yield
    finally:
        LOADS["seconds"] += time.perf_counter() - t0
        LOADS["count"] += 1


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


def import_modules(names: Sequence[str]) -> dict[str, Any]:
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
