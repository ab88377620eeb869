"""``meanfield reproduce``: run every experiment stage of a preset, draw every figure, write a report.

Layout of ``OUT`` (the ``--out`` directory)::

    OUT/results/<stage>/...   saved results of each stage (JSONL sweeps, npz, JSON)
    OUT/figures/<stem>.pdf    every figure, also as .png
    OUT/report.md             exponent tables beside the paper's, figure links, what agrees
    OUT/reproduce.json        per-stage status, timings, files, and the run metadata

The stages are those of :data:`experiments.app.registry.STAGES` (the contract is
:class:`experiments.stage.Stage`). Every stage is resumable: rerunning the same command skips
finished work, so a run that was interrupted (or ran out of time) picks up where it stopped. A
stage that fails does not stop the others; its error is in ``reproduce.json`` and the report,
and the command exits non-zero. A figure whose results are missing is reported as ``missing``,
one that fails to draw as ``failed``, and the others are still drawn.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from experiments.results import atomic_write_text, run_metadata, write_json

from . import registry
from .options import UsageError, check_device

__all__ = ["BUDGET_SECONDS", "PRESET_NAMES", "draw_all", "render_report", "reproduce"]

log = logging.getLogger("meanfield.reproduce")

PRESET_NAMES = ("tiny", "quick", "paper")
#: Wall-clock budget of a preset on 2 CPU cores (the quick preset's promise); ``None``: no budget.
BUDGET_SECONDS: dict[str, float | None] = {"tiny": None, "quick": 600.0, "paper": None}


def draw_all(
    results_dir: str | Path, out_dir: str | Path, *, only: Iterable[str] | None = None
) -> dict[str, dict[str, Any]]:
    """Draw every figure whose results exist.

    Parameters
    ----------
    results_dir : path
        The results root (``OUT/results`` of ``meanfield reproduce``).
    out_dir : path
        Where ``<stem>.pdf`` and ``<stem>.png`` go.
    only : iterable of str, optional
        Figure ids (``F1``, ``B``, ...); default all.

    Returns
    -------
    dict
        Per figure id: ``{"status": "ok" | "missing" | "failed", "files": [...], "error": str}``.
    """
    results_dir, out_dir = Path(results_dir), Path(out_dir)
    status: dict[str, dict[str, Any]] = {}
    for fig in registry.select_figures(only):
        entry: dict[str, Any] = {"title": fig.title, "stage": fig.stage.name, "files": []}
        try:
            entry["files"] = [str(p) for p in fig.draw(results_dir, out_dir)]
            entry["status"] = "ok"
        except FileNotFoundError as err:
            entry["status"] = "missing"
            entry["error"] = " ".join(str(err).split())
        except Exception as err:  # noqa: BLE001 - one failing figure must not stop the others
            entry["status"] = "failed"
            entry["error"] = f"{type(err).__name__}: {' '.join(str(err).split())}"
            log.warning("figure %s failed: %s", fig.id, entry["error"])
        status[fig.id] = entry
    return status


def _one_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())}"


def reproduce(
    out: str | Path,
    preset: str = "quick",
    *,
    device: str = "cpu",
    only: Iterable[str] | None = None,
    figures: bool = True,
    progress: bool = True,
    seed: int | None = None,
) -> dict[str, Any]:
    """Run the stages of ``preset`` into ``out/results``, draw figures, write ``out/report.md``.

    Parameters
    ----------
    out : path
        Output directory (created).
    preset : {"tiny", "quick", "paper"}
        ``quick`` draws every figure within about ten minutes on 2 CPU cores; ``paper`` runs the
        paper's full grids (hours); ``tiny`` is the smoke test.
    device : str
        ``"cpu"`` or ``"cuda"`` (stages that only solve tiny dense problems always use the CPU).
    only : iterable of str, optional
        Stage names to run (default all); figures and the report still cover every stage with
        results on disk.
    figures : bool
        Draw the figures and write the report (default True).
    progress : bool
        Progress bars on stderr.
    seed : int, optional
        Replaces the preset's seed in every stage that has one (the adversarial stage's seeds
        are the paper's own); ``None`` keeps the presets' seeds.

    Returns
    -------
    dict
        The document written to ``out/reproduce.json``.
    """
    if preset not in PRESET_NAMES:
        raise UsageError(f"unknown preset {preset!r}; choose from {', '.join(PRESET_NAMES)}")
    check_device(device)
    stages = registry.select_stages(only)
    if not progress:
        _quiet_loaders()
    out = Path(out)
    results_dir, figures_dir = out / "results", out / "figures"
    results_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    status: dict[str, dict[str, Any]] = {}
    for stage in stages:
        t0 = time.perf_counter()
        log.info("stage %s (%s preset)", stage.name, preset)
        entry: dict[str, Any] = {"title": stage.title}
        try:
            seeded = seed is not None and "seed" in stage.presets[preset].options()
            files = stage.run(
                results_dir,
                preset,
                device=device,
                progress=progress,
                **({"seed": int(seed)} if seeded else {}),
            )
            entry.update(status="ok", files=[str(p) for p in files])
        except KeyboardInterrupt:
            raise
        except Exception as err:  # noqa: BLE001 - one failing stage must not stop the others
            entry.update(status="failed", error=_one_line(err), files=[])
            log.error("stage %s failed: %s", stage.name, entry["error"])
        entry["seconds"] = time.perf_counter() - t0
        status[stage.name] = entry
    doc: dict[str, Any] = {
        "kind": "reproduce",
        "preset": preset,
        "device": device,
        "stages": status,
        "experiments_seconds": time.perf_counter() - t_start,
    }
    if figures:
        t0 = time.perf_counter()
        doc["figures"] = draw_all(results_dir, figures_dir)
        doc["figures_seconds"] = time.perf_counter() - t0
    doc["total_seconds"] = time.perf_counter() - t_start
    doc["budget_seconds"] = BUDGET_SECONDS[preset]
    doc["metadata"] = run_metadata(
        device=device, config={"preset": preset, "only": only, "seed": seed}
    )
    if figures:
        report = out / "report.md"
        atomic_write_text(report, render_report(out, doc))
        doc["report"] = str(report)
    write_json(out / "reproduce.json", doc)
    return doc


def _quiet_loaders() -> None:
    """Silence the model loaders' own progress bars (weights, GGUF de-quantization)."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_progress_bar()


# ------------------------------------------------------------------------------------ report
def _fmt_seconds(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


def render_report(out: Path, doc: dict[str, Any]) -> str:
    """The Markdown report: status, every stage's section, the figure index, provenance."""
    results_dir, figures_dir = out / "results", out / "figures"
    meta = doc["metadata"]
    preset = doc["preset"]
    budget = doc.get("budget_seconds")
    total = doc["total_seconds"]
    lines = [
        f"# Reproduction report: preset `{preset}`",
        "",
        f"Castin, Ablin and Peyré, *How Smooth Is Attention?* (ICML 2024), regenerated by "
        f"`meanfield reproduce --preset {preset}` on {meta['created']} "
        f"(commit `{(meta.get('git_commit') or 'unknown')[:12]}`, device {meta.get('device')}, "
        f"torch {meta['versions'].get('torch')}, transformers "
        f"{meta['versions'].get('transformers', 'not installed')}).",
        "",
        f"Time of this invocation {_fmt_seconds(total)}"
        + (
            f" against a budget of {_fmt_seconds(budget)} "
            f"({'within' if total <= budget else 'over'} budget)"
            if budget
            else ""
        )
        + "; a resumed run counts only the work it did itself (per-stage times below, per-point "
        "times in the results).",
        "",
        "Models and texts are the offline stand-ins of docs/experiments.md unless a stage says "
        "otherwise; legends name the model actually used. Constants marked *reconstructed* or "
        "*candidate* are our derivations, not the paper's printed values; the paper's curves are "
        "hand-set in its plotting scripts (defect D7) and are shown for comparison only.",
        "",
        "## Stages",
        "",
        "| stage | status | time | files |",
        "|---|---|---|---|",
    ]
    for name, e in doc["stages"].items():
        state = e["status"] if e["status"] == "ok" else f"**{e['status']}**: {e.get('error', '')}"
        lines.append(f"| {name} | {state} | {_fmt_seconds(e['seconds'])} | {len(e['files'])} |")
    figs = doc.get("figures", {})
    if figs:
        lines += ["", "## Figures", "", "| id | figure | status |", "|---|---|---|"]
        for fid, e in figs.items():
            pngs = [Path(f) for f in e["files"] if f.endswith(".png")]
            links = ", ".join(f"[{p.stem}]({figures_dir.name}/{p.name})" for p in pngs)
            state = e["status"] if e["status"] == "ok" else f"{e['status']}: {e.get('error', '')}"
            lines.append(f"| {fid} | {e['title']}: {links or '–'} | {state} |")
    lines.append("")
    for stage in registry.STAGES:
        if not (results_dir / stage.name).exists():
            continue
        try:
            section = stage.report_section(results_dir, figures_dir)
        except Exception as err:  # noqa: BLE001 - a broken section must not lose the report
            section = f"## {stage.title}\n\nSection unavailable ({_one_line(err)}).\n"
        lines += [section.rstrip(), ""]
    return "\n".join(lines).rstrip() + "\n"
