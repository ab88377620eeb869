r"""The harness's run: :func:`verify` (one run) and ``execute`` (a preset, resumable)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..engine import StageRun, Steps, Sweep, run_metadata, write_json
from .checks import BoundSpec, check_instance, registry_specs
from .generation import KINDS, SCHEDULE
from .report import aggregate
from .settings import NAME, VerifyBoundsSettings, checked_count, checked_kinds, kind_names

__all__ = ["HARNESS_VERSION", "execute", "instance_point", "verify"]

log = logging.getLogger("meanfield.verify_bounds")


#: Version of the instance generators and checks; part of the Sweep configuration, so a change
#: here recomputes every instance.
HARNESS_VERSION = 1


def _schedule(n_instances: int, kinds: Sequence[str]) -> list[dict[str, Any]]:
    sched = [k for k in SCHEDULE if k in kinds]
    if not sched:
        raise ValueError(f"no instance kind selected; choose from {', '.join(KINDS)}")
    return [{"index": i, "kind": sched[i % len(sched)]} for i in range(n_instances)]


def instance_point(config: Mapping[str, Any]) -> dict[str, Any]:
    """One instance's record, from ``{seed, index, kind}``: the stage's top-level task.

    Pure and picklable by reference, so that a Dask worker can compute it (docs/cluster.md); it
    checks the registered bounds (:data:`~experiments.verify_bounds.checks.BOUNDS`).
    """
    return check_instance(
        int(config["seed"]), config["index"], config["kind"], registry_specs(None)
    )


def verify(
    n_instances: int = 200,
    seed: int = 0,
    kinds: Sequence[str] | None = None,
    progress: bool = True,
    *,
    extra_bounds: Sequence[BoundSpec] | None = None,
    sweep_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Run the harness on ``n_instances`` instances and return the report.

    Parameters
    ----------
    n_instances : int
        Number of instances (each yields one or more engine brackets).
    seed : int
        Run seed; instance ``i`` is drawn from ``default_rng([seed, i])``.
    kinds : sequence of str, optional
        Subset of :data:`KINDS` (default: all), scheduled by :data:`SCHEDULE`.
    progress : bool
        tqdm progress bar on stderr.
    extra_bounds : sequence of BoundSpec, optional
        Bounds checked in addition to :data:`BOUNDS` (e.g. a deliberately wrong one in the tests).
    sweep_dir : path, optional
        Store one record per instance in ``sweep_dir/instances.jsonl`` through
        :class:`experiments.engine.Sweep` (resumable: finished instances are not recomputed).

    Returns
    -------
    dict
        ``passed`` (no theorem violated), ``n_theorem_violations``, ``violations`` (each with
        the full instance), ``candidates`` (verdict ``survived``/``refuted``, min margin,
        examples), ``known_invalid``, ``bounds`` (per bound: side, status, source, counts,
        tightness ``bound / value`` min/median/max, min margin, worst instance),
        ``instances_by_kind``, ``seconds``.
    """
    kinds = checked_kinds(kinds)
    specs = registry_specs(extra_bounds)
    points = _schedule(checked_count(n_instances), kinds)
    t0 = time.perf_counter()

    def compute(point: Mapping[str, Any]) -> dict[str, Any]:
        return check_instance(seed, point["index"], point["kind"], specs)

    if sweep_dir is not None:
        sweep = _sweep(sweep_dir, seed, specs)
        if extra_bounds:  # bounds given as objects: computed here, by the closure
            records = sweep.run(points, compute, progress=progress, desc="verify-bounds")
        else:  # a top-level task: the driver may send the instances to other processes
            records = sweep.run(
                points,
                task=instance_point,
                context={"seed": int(seed)},
                progress=progress,
                desc="verify-bounds",
            )
    else:
        from tqdm.auto import tqdm

        bar = tqdm(points, desc="verify-bounds", leave=False, disable=None if progress else True)
        records = [compute(p) for p in bar]
    return _report(records, specs, seed, kinds, time.perf_counter() - t0)


def _sweep(sweep_dir: str | Path, seed: int, specs: Sequence[BoundSpec]) -> Sweep:
    """The resumable sweep of the instances: one record per instance."""
    config = {
        "harness_version": HARNESS_VERSION,
        "seed": int(seed),
        "bounds": [s.name for s in specs],
    }
    return Sweep(sweep_dir, "instances", config, seed=int(seed), device="cpu", dtype="float64")


def _report(
    records: Sequence[Mapping[str, Any]],
    specs: Sequence[BoundSpec],
    seed: int,
    kinds: Sequence[str],
    seconds: float,
) -> dict[str, Any]:
    report = aggregate(records, specs, seed=int(seed))
    return {**report, "seed": int(seed), "kinds": list(kinds), "seconds": seconds}


def execute(cfg: VerifyBoundsSettings, out: Path, run: StageRun) -> Steps:
    """Check the bounds on ``cfg``'s instances; write ``out/report.json`` (the stage contract).

    The certified dense brackets run in float64 on the CPU, one instance per point of one
    round. Returns the report and the per-instance records (``instances.jsonl``, resumable).
    """
    seed, kinds = int(cfg.seed), checked_kinds(kind_names(cfg.kinds))
    specs = registry_specs(None)
    points = _schedule(checked_count(cfg.n_instances), kinds)
    t0 = time.perf_counter()
    sweep = _sweep(out, seed, specs)
    yield [sweep.job(points, instance_point, {"seed": seed})]
    report = _report(sweep.collect(points), specs, seed, kinds, time.perf_counter() - t0)
    doc = {
        "kind": NAME,
        "metadata": run_metadata(
            seed=seed,
            device=run.device,
            dtype="float64",
            config={"preset": run.preset, **cfg.options()},
        ),
        **report,
    }
    return [write_json(out / "report.json", doc), out / "instances.jsonl"]
