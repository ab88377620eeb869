"""The ``synthetic`` stage's run: ``execute`` joins the F5, F7 and mean-field sweeps."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from ..engine import StageRun, Steps, joint_rounds, run_metadata, threaded_rounds, write_json
from .large_radius import run_f7
from .mean_field import run_mean_field
from .settings import SyntheticSettings
from .sqrt_n_regime import run_f5

__all__ = ["execute"]

log = logging.getLogger("experiments.synthetic")


def execute(cfg: SyntheticSettings, out: Path, run: StageRun) -> Steps:
    """The sweeps of F5, F6, F7 and A into ``out``; resumable per point (the stage contract).

    One round holds the F5, F7 and off-axis points, the next the worst-measure searches, which
    start from the off-axis results. Writes the Sweep records and metadata, the assembled
    ``f5``, ``f7``, ``f6`` and ``a`` sub-results, and ``run.json``. The stage's own
    computations run on one thread, as its points do.
    """
    preset, overrides, device = run.preset, run.settings, run.device
    t0 = time.perf_counter()
    parts = [part(cfg, out, device) for part in (run_f5, run_f7, run_mean_field)]
    written = yield from threaded_rounds(joint_rounds(*parts), 1)
    files: list[Path] = [p for part in written for p in part]
    sweeps = [
        out / f"{s}.{e}"
        for s in ("f5_engine", "worst_measures", "off_axis", "f7")
        for e in ("jsonl", "meta.json")
    ]
    files += [p for p in sweeps if p.exists()]
    files.append(
        write_json(
            out / "run.json",
            {
                "preset": preset,
                "overrides": dict(overrides),
                "config": cfg.options(),
                "seconds": time.perf_counter() - t0,
                "metadata": run_metadata(
                    seed=cfg.seed, device=device, dtype="float64", config=cfg.options()
                ),
            },
        )
    )
    log.info("synthetic (%s) done in %.1f s", preset, time.perf_counter() - t0)
    return files
