"""``meanfield reproduce``: run every experiment stage of a preset, draw every figure, write a report.

Layout of ``OUT`` (the ``--out`` directory)::

    OUT/results/<stage>/...   saved results of each stage (JSONL sweeps, npz, JSON)
    OUT/figures/<stem>.pdf    every figure, also as .png
    OUT/report.md             exponent tables beside the paper's, figure links, what agrees
    OUT/reproduce.json        per-stage status, timings, files, the run metadata, and the
                              history of every invocation into OUT with their summed time

The stages are those of :data:`meanfield_cli.registry.STAGES` (the contract is
:class:`experiments.engine.Stage`). Every stage is resumable: rerunning the same command skips
finished work, so a run that was interrupted (or ran out of time) picks up where it stopped. A
stage that fails does not stop the others; its error is in ``reproduce.json`` and the report,
and the command exits non-zero. A figure whose results are missing is reported as ``missing``,
one that fails to draw as ``failed``, and the others are still drawn.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments import verdicts
from experiments.engine import atomic_write_text, run_metadata, write_json

from . import registry
from .options import UsageError, check_device

__all__ = [
    "BUDGET_CPU_SECONDS",
    "PRESET_NAMES",
    "QUICK_BUDGET_CPU_SECONDS",
    "claims_table",
    "draw_all",
    "render_report",
    "reproduce",
    "run_stages",
    "stage_phases",
]

log = logging.getLogger("meanfield.reproduce")

#: The presets of ``meanfield reproduce``. A stage without the preset is left out of its run
#: (:func:`meanfield_cli.registry.select_stages`): ``long`` runs the ``long_context`` stage
#: alone, which ``tiny`` includes and ``quick`` and ``paper`` leave out.
PRESET_NAMES = ("tiny", "quick", "paper", "long")
#: Budget of the quick preset (``make demo``'s promise) in seconds of CPU time, user plus system,
#: after the install: the one number that the report, ``--help`` and the README state. CPU time,
#: not wall time, because other jobs on the cores stretch the wall time but hardly the CPU time;
#: on a quiet 2-core machine 6 min of CPU is about 3-4 min of wall time.
QUICK_BUDGET_CPU_SECONDS = 360.0
#: CPU-time budget of a preset; ``None``: no budget.
BUDGET_CPU_SECONDS: dict[str, float | None] = {
    "tiny": None,
    "quick": QUICK_BUDGET_CPU_SECONDS,
    "paper": None,
    "long": None,
}


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and of its children that have exited, in s."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def draw_all(
    results_dir: str | Path,
    out_dir: str | Path,
    *,
    only: Iterable[str] | None = None,
    progress: Any = None,
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
    progress : CostProgress, optional
        Told of the figures (stage ``figures``) and of each one drawn, with its seconds.

    Returns
    -------
    dict
        Per figure id: ``{"status": "ok" | "missing" | "failed", "files": [...], "error": str}``.
    """
    results_dir, out_dir = Path(results_dir), Path(out_dir)
    status: dict[str, dict[str, Any]] = {}
    figs = list(registry.select_figures(only))
    if progress is not None and figs:
        progress.add("figures", cost=float(len(figs)), points=len(figs))
        progress.start_stage("figures")
    for fig in figs:
        t0 = time.perf_counter()
        entry: dict[str, Any] = {"title": fig.title, "stage": fig.stage.name, "files": []}
        try:
            entry["files"] = [str(p) for p in fig.draw(results_dir, out_dir)]
            entry["status"] = "ok"
        except FileNotFoundError as err:
            entry["status"] = "missing"
            entry["error"] = " ".join(str(err).split())
        except Exception as err:  # noqa: BLE001 - one failing figure must not stop the others
            entry["status"] = "failed"
            entry["error"] = _one_line(err)
            log.warning("figure %s failed: %s", fig.id, entry["error"])
        status[fig.id] = entry
        if progress is not None:
            progress.advance("figures", cost=1.0, seconds=time.perf_counter() - t0)
    return status


def _one_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())}"


def _executor(workers: int | None, scheduler: str | None) -> Any:
    """``None`` (compute in this process, as always) or a Dask executor (docs/cluster.md)."""
    if scheduler is None and (workers is None or int(workers) <= 1):
        return None
    from experiments.engine import make_executor

    try:
        return make_executor(workers, scheduler)
    except ImportError as err:
        raise UsageError(str(err)) from None


def run_stages(
    stages: Sequence[Any],
    results_dir: str | Path,
    preset: str,
    *,
    device: str = "cpu",
    progress: bool = True,
    settings: Mapping[str, Mapping[str, Any]] | None = None,
    workers: int | None = None,
    scheduler: str | None = None,
    catch: bool = True,
    times: dict[str, Any] | None = None,
    tracker: Any = None,
) -> dict[str, dict[str, Any]]:
    """Run ``stages`` into ``results_dir``; return each stage's status, files and seconds.

    Without ``workers`` (or with one) and without ``scheduler``, the stages run one after the
    other in this process, each driving its own rounds (:func:`experiments.engine.drive`).
    Otherwise the points run on Dask (``workers`` local worker processes, or the running
    scheduler at ``scheduler``) in rounds: every stage runs to its next round
    (:class:`experiments.engine.Rounds`), the rounds of all stages form one queue, largest
    cost first, whose records this process alone appends, and each stage then resumes and reads
    them. Records are identical to a serial run's (docs/cluster.md).

    ``settings`` maps a stage name to its settings (``--set``). With ``catch`` (the pipeline),
    a failing stage is recorded and the others go on; without, its exception propagates.
    One cost-weighted progress tracker covers the run (a bar on a terminal, else a log line per
    percent or per minute, whichever is rarer): ``tracker`` (a
    :class:`~experiments.engine.CostProgress` whose phases the caller planned with
    :func:`stage_phases` and which the caller closes), else one of its own. Its fraction and
    ETA come from the cost model's predicted seconds of each stage from the start, then from
    the pace measured in the run.

    ``times``, when given and the points run on Dask, is filled with where the time went: the
    executor's :class:`~experiments.engine.ExecutionTimes` (start, imports, per-worker task
    and load seconds, the warm-up), the number of ``rounds`` and ``queue_seconds``, the time
    spent running the queues (the rest is the stages' own passes in this process).
    """
    from experiments.engine import CostProgress, Rounds, drive, reporting, run_jobs

    settings = settings or {}
    results_dir = Path(results_dir)
    executor = _executor(workers, scheduler)
    own = tracker is None
    if own:
        tracker = CostProgress(desc="meanfield", enabled=progress)
        tracker.plan(stage_phases(stages, preset, workers=workers, scheduler=scheduler))
    status: dict[str, dict[str, Any]] = {}
    t_first: dict[str, float] = {}

    def start(stage: Any, on: Any) -> Any:
        """The stage's run as rounds, whose points run on ``on`` (None: this process)."""
        t_first.setdefault(stage.name, time.perf_counter())  # the stage's clock starts here
        return stage.start(
            results_dir,
            preset,
            device=device if stage.uses_device else "cpu",  # a CPU-only stage ignores --device
            progress=progress,
            executor=on,
            **dict(settings.get(stage.name, {})),
        )

    def finish(stage: Any, files: list[Path] | None, err: BaseException | str | None) -> None:
        entry: dict[str, Any] = {"title": stage.title}
        if err is None:
            entry.update(status="ok", files=[str(p) for p in files or []])
        else:
            msg = err if isinstance(err, str) else _one_line(err)
            entry.update(status="failed", error=msg, files=[])
            log.error("stage %s failed: %s", stage.name, msg)
        entry["seconds"] = time.perf_counter() - t_first.get(stage.name, time.perf_counter())
        status[stage.name] = entry

    try:
        with reporting(tracker):
            if executor is None:
                for stage in stages:
                    log.info("stage %s (%s preset)", stage.name, preset)
                    # a serial run learns each stage's points when it starts: until then the
                    # stage counts for its predicted seconds (the phases of stage_phases)
                    phase = stage.name if stage.name in tracker.phases else None
                    if phase is not None:
                        tracker.begin(phase)
                    try:
                        files = drive(start(stage, None), progress=tracker)
                    except Exception as err:  # noqa: BLE001 - one failing stage must not stop the others
                        if not catch:
                            raise
                        finish(stage, None, err)
                    else:
                        finish(stage, files, None)
                    if phase is not None:
                        tracker.end(phase)
                return status
            if "experiments" in tracker.phases:
                tracker.begin("experiments")
            log.info("running the points on %r", executor)
            rounds: dict[str, Rounds] = {}
            waiting: list[Any] = []

            def advance(stage: Any, steps: Rounds | None = None) -> None:
                """Run ``stage`` to its next round (started when ``steps`` is None)."""
                try:
                    if steps is None:
                        steps = rounds[stage.name] = Rounds(start(stage, executor))
                    more = steps.advance()
                except Exception as err:  # noqa: BLE001 - as above
                    if not catch:
                        raise
                    finish(stage, None, err)
                    return
                if more:
                    waiting.append(stage)
                else:
                    finish(stage, steps.files, None)

            for stage in stages:
                log.info("stage %s (%s preset)", stage.name, preset)
                advance(stage)
            queue_seconds, n_rounds = 0.0, 0
            while waiting:
                current, waiting = waiting, []
                jobs = [j for stage in current for j in rounds[stage.name].jobs]
                summary = run_jobs(jobs, executor, progress=tracker, on_error="record")
                queue_seconds += summary.seconds
                n_rounds += 1
                for stage in current:
                    steps = rounds[stage.name]
                    left = sum(len(j.sweep.unfinished(j.points)) for j in steps.jobs)
                    if not left:
                        advance(stage, steps)
                        continue
                    steps.close()
                    names = {j.sweep.name for j in steps.jobs}
                    bad = [
                        o
                        for o in summary.errors + summary.lost
                        if o.task.group.rsplit("/", 1)[-1] in names
                    ]
                    why = f"; first: {bad[0].error}" if bad else ""
                    msg = f"{left} point(s) failed or lost{why}"
                    if not catch:
                        raise RuntimeError(f"{stage.name}: {msg}; rerun to resume")
                    finish(stage, None, msg)
            if times is not None:
                times.update(executor.times.as_dict(), rounds=n_rounds, queue_seconds=queue_seconds)
            if "experiments" in tracker.phases:
                tracker.end("experiments")
            return {s.name: status[s.name] for s in stages if s.name in status}
    finally:
        if own:
            tracker.close()
        if executor is not None:
            executor.close()


def stage_phases(
    stages: Sequence[Any],
    preset: str,
    *,
    finished: Iterable[str] = (),
    workers: int | None = None,
    scheduler: str | None = None,
) -> dict[str, float]:
    """The progress phases of :func:`run_stages` with their predicted seconds on 2 CPU cores.

    Serially, one phase per stage (:func:`experiments.engine.predict_stage_seconds`;
    ``finished``: stages an earlier run into the same directory finished, which resume). On Dask
    the stages' points share one queue: one phase ``experiments``, the stages' seconds shared by
    the local workers (by one for a scheduler's, whose number is not known in advance).
    """
    from experiments.engine import predict_stage_seconds

    seconds = predict_stage_seconds([s.name for s in stages], preset, finished=finished)
    if scheduler is None and (workers is None or int(workers) <= 1):
        return seconds
    share = int(workers) if scheduler is None and workers else 1
    return {"experiments": sum(seconds.values()) / share}


def _previous_doc(out: Path) -> dict[str, Any] | None:
    """The ``reproduce.json`` an earlier run left in ``out``, or ``None``."""
    from experiments.engine import load_json

    path = out / "reproduce.json"
    if not path.exists():
        return None
    try:
        doc = load_json(path)
    except (OSError, ValueError) as err:
        log.warning("cannot read %s (%s): its run times are not in the history", path, err)
        return None
    return doc if isinstance(doc, dict) else None


def _history_of(doc: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The invocations recorded in an earlier ``reproduce.json``, oldest first.

    A file written before the history existed is one invocation: its own time.
    """
    if not doc:
        return []
    if isinstance(doc.get("history"), list):
        return [dict(e) for e in doc["history"] if isinstance(e, Mapping)]
    if "total_seconds" not in doc:
        return []
    return [_history_entry(doc, started=(doc.get("metadata") or {}).get("created"))]


def _history_entry(doc: Mapping[str, Any], *, started: str | None) -> dict[str, Any]:
    """One finished invocation of the history.

    When, what, how long, each stage's status and seconds; its status is ``"finished"``.
    """
    entry: dict[str, Any] = {
        "started": started,
        "preset": doc.get("preset"),
        "only": (doc.get("metadata") or {}).get("config", {}).get("only"),
        "total_seconds": float(doc.get("total_seconds", 0.0)),
    }
    for key in ("cpu_seconds", "experiments_seconds", "figures_seconds"):
        if key in doc:
            entry[key] = float(doc[key])
    entry["stages"] = {
        name: {"status": e.get("status"), "seconds": e.get("seconds")}
        for name, e in (doc.get("stages") or {}).items()
    }
    entry["status"] = "finished"
    return entry


def _with_history(doc: dict[str, Any], history: list[dict[str, Any]]) -> dict[str, Any]:
    doc["history"] = history
    doc["history_total_seconds"] = sum(float(e.get("total_seconds") or 0.0) for e in history)
    doc["history_cpu_seconds"] = sum(float(e.get("cpu_seconds") or 0.0) for e in history)
    return doc


def _finished_stages(doc: Mapping[str, Any] | None, preset: str) -> list[str]:
    """Stages that the run of ``doc`` finished with the same preset (they will resume)."""
    if not doc or doc.get("preset") != preset:
        return []
    return [k for k, e in (doc.get("stages") or {}).items() if e.get("status") == "ok"]


def reproduce(
    out: str | Path,
    preset: str = "quick",
    *,
    device: str = "cpu",
    only: Iterable[str] | None = None,
    figures: bool = True,
    progress: bool = True,
    seed: int | None = None,
    workers: int | None = None,
    scheduler: str | None = None,
) -> dict[str, Any]:
    """Run the stages of ``preset`` into ``out/results``, draw figures, write ``out/report.md``.

    Parameters
    ----------
    out : path
        Output directory (created). It is locked for the run: a second run into the same
        directory fails at once, naming the first; a lock left by a killed run is taken over.
    preset : {"tiny", "quick", "paper", "long"}
        ``quick`` draws every figure in a few minutes on 2 CPU cores (its budget is
        :data:`QUICK_BUDGET_CPU_SECONDS` of CPU time); ``paper`` runs the paper's full grids (hours); ``tiny``
        is the smoke test; ``long`` runs the ``long_context`` stage alone (about 1 h). Only the
        stages that have the preset run (:func:`meanfield_cli.registry.select_stages`).
    device : str
        ``"cpu"`` or ``"cuda"`` (stages that only solve tiny dense problems always use the CPU).
    only : iterable of str, optional
        Stage names to run (default all that have the preset; naming one without it is a
        UsageError); figures and the report still cover every stage with results on disk.
    figures : bool
        Draw the figures of the stages that have the preset, and write the report (default
        True).
    progress : bool
        Progress on stderr, stages and figures: one bar on a terminal, else plain log lines (a
        first one at once, then at most one per percent and per minute), with an ETA predicted
        by the engine's cost model (:func:`experiments.engine.predict_stage_seconds`) from the
        start and corrected by the measured pace.
    seed : int, optional
        Replaces the preset's seed in every stage that has one (the adversarial stage's seeds
        are the paper's own); ``None`` keeps the presets' seeds.
    workers, scheduler : optional
        Run the points on Dask: ``workers`` local worker processes, or the running scheduler at
        the address ``scheduler`` (the optional extra ``meanfield[dist]``; docs/cluster.md).
        The records are identical to a serial run's.

    Returns
    -------
    dict
        The document written to ``out/reproduce.json``. Its ``history`` lists every invocation
        into ``out``, oldest first (this one last; one interrupted is recorded too), and
        ``history_total_seconds`` sums their times: a rerun resumes, so the results took them all.
    """
    import datetime

    from experiments.engine import CostProgress, exclusive_run

    if preset not in PRESET_NAMES:
        raise UsageError(f"unknown preset {preset!r}; choose from {', '.join(PRESET_NAMES)}")
    check_device(device)
    stages = registry.select_stages(only, preset=preset)
    # the figures of the stages that have the preset (quick and paper: all but L; long: L)
    figure_ids = [f.id for f in registry.FIGURES if preset in f.stage.presets]
    out = Path(out)
    results_dir, figures_dir = out / "results", out / "figures"
    with exclusive_run(out):
        results_dir.mkdir(parents=True, exist_ok=True)
        t_start = time.perf_counter()
        cpu_start = cpu_seconds()
        started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        previous = _previous_doc(out)
        history = _history_of(previous)
        settings = {}
        for stage in stages:
            if seed is not None and "seed" in stage.presets[preset].options():
                settings[stage.name] = {"seed": int(seed)}
        times: dict[str, Any] = {}
        tracker = CostProgress(desc="meanfield", enabled=progress)
        phases = stage_phases(
            stages,
            preset,
            finished=_finished_stages(previous, preset),
            workers=workers,
            scheduler=scheduler,
        )
        if figures:
            from experiments.engine import predict_figures_seconds

            phases["figures"] = predict_figures_seconds(preset, len(figure_ids))
        try:
            tracker.plan(phases)
            status = run_stages(
                stages,
                results_dir,
                preset,
                device=device,
                progress=progress,
                settings=settings,
                workers=workers,
                scheduler=scheduler,
                times=times,
                tracker=tracker,
            )
            doc: dict[str, Any] = {
                "kind": "reproduce",
                "preset": preset,
                "device": device,
                "stages": status,
                "experiments_seconds": time.perf_counter() - t_start,
            }
            if workers is not None or scheduler is not None:
                doc["execution"] = {"workers": workers, "scheduler": scheduler, **times}
            if figures:
                t0 = time.perf_counter()
                tracker.begin("figures")
                doc["figures"] = draw_all(
                    results_dir, figures_dir, only=figure_ids, progress=tracker
                )
                tracker.end("figures")
                doc["figures_seconds"] = time.perf_counter() - t0
        except BaseException:
            # interrupted (Ctrl-C, SIGTERM, a bug): keep its time in the history of the directory
            entry = {
                "started": started,
                "preset": preset,
                "only": list(only) if only else None,
                "total_seconds": time.perf_counter() - t_start,
                "cpu_seconds": cpu_seconds() - cpu_start,
                "status": "interrupted",
            }
            kept = _with_history(
                dict(previous or {"kind": "reproduce", "preset": preset}), history + [entry]
            )
            try:
                write_json(out / "reproduce.json", kept)
            except OSError as err:
                log.warning("could not record the interrupted run's time: %s", err)
            raise
        finally:
            tracker.close()
        doc["total_seconds"] = time.perf_counter() - t_start
        doc["cpu_seconds"] = cpu_seconds() - cpu_start
        doc["budget_cpu_seconds"] = BUDGET_CPU_SECONDS[preset]
        doc["metadata"] = run_metadata(
            device=device, config={"preset": preset, "only": only, "seed": seed}
        )
        _with_history(doc, history + [_history_entry(doc, started=started)])
        if figures:
            report = out / "report.md"
            atomic_write_text(report, render_report(out, doc))
            doc["report"] = str(report)
        write_json(out / "reproduce.json", doc)
    return doc


# ------------------------------------------------------------------------------------ report
#: Verdicts of the claims table, in the words of the report (the rules: experiments.verdicts).
VERDICTS = verdicts.VERDICTS

#: The verdicts printed in bold: those of an actual comparison.
_COMPARED = frozenset(v for v in VERDICTS if v not in ("different quantity", "stand-in"))


def claims_table(results_dir: Path) -> str:
    """The opening table of the report: each claim, our number, the paper's, a verdict.

    Under it: the rules of :mod:`experiments.verdicts` (one per kind of comparison, applied to
    every row), a one-line definition of each symbol or name the rows use, and notes. A stage
    whose results are missing or unreadable contributes no row.
    """
    rows: list[verdicts.Claim] = []
    notes: list[str] = []
    for stage in registry.STAGES:
        try:
            got = stage.claims(results_dir)
        except (FileNotFoundError, KeyError, ValueError, TypeError) as err:
            log.info("claims table: the %s stage's rows skipped (%s)", stage.name, _one_line(err))
            continue
        rows += got.rows
        notes += got.notes
    if not rows:
        return ""
    lines = [
        "## Verdict at a glance",
        "",
        "| claim of the paper | our number | the paper's | verdict |",
        "|---|---|---|---|",
    ]
    for row in rows:
        shown = f"**{row.verdict}**" if row.verdict in _COMPARED else row.verdict
        lines.append(f"| {row.claim} | {row.ours} | {row.paper} | {shown} |")
    used = verdicts.terms_used([" ".join(r[:3]) for r in rows] + notes)
    lines += ["", *verdicts.RULES, ""]
    if used:
        lines.append("**Symbols and names.**")
        lines += [f"- {key}: {verdicts.TERMS[key]}" for key in used]
        lines.append("")
    for note in notes:
        lines += [note, ""]
    lines += ["The details follow, stage by stage.", ""]
    return "\n".join(lines)


def _fmt_seconds(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


def _run_time_lines(doc: Mapping[str, Any]) -> list[str]:
    """The report's run times: this invocation's wall and CPU time, then every invocation."""
    budget = doc.get("budget_cpu_seconds")
    total, cpu = doc["total_seconds"], doc.get("cpu_seconds")
    lines = [
        f"This invocation took {_fmt_seconds(total)} of wall time"
        + (
            f" (experiments {_fmt_seconds(doc['experiments_seconds'])}, figures "
            f"{_fmt_seconds(doc['figures_seconds'])})"
            if "experiments_seconds" in doc and "figures_seconds" in doc
            else ""
        )
        + (f" and {_fmt_seconds(cpu)} of CPU time (user + system)" if cpu is not None else "")
        + (
            f", against the preset's budget of {_fmt_seconds(budget)} of CPU time "
            f"({'within' if cpu <= budget else 'over'} budget)"
            if budget and cpu is not None
            else ""
        )
        + ". Other jobs on the cores stretch the wall time, hardly the CPU time. A resumed run "
        "counts only the work it did itself (per-stage times below, per-point times in the "
        'results). Run times measured on 2 CPU cores are in docs/experiments.md ("Run times").',
        "",
    ]
    history = doc.get("history") or []
    if not history:
        return lines
    n = len(history)
    lines += [
        f"Every invocation into this directory, oldest first: {n} in all, "
        f"{_fmt_seconds(doc.get('history_total_seconds', 0.0))} of wall time and "
        f"{_fmt_seconds(doc.get('history_cpu_seconds', 0.0))} of CPU time together (a rerun "
        "resumes where the one before stopped, so the results took them all).",
        "",
        "| # | started (UTC) | preset | wall time | CPU time | status |",
        "|---|---|---|---|---|---|",
    ]
    for i, e in enumerate(history, 1):
        when = str(e.get("started") or "unknown").replace("T", " ")[:16]
        what = str(e.get("preset") or "?") + (
            f" (only {', '.join(e['only'])})" if e.get("only") else ""
        )
        state = str(e.get("status") or "finished") + (" (this one)" if i == n else "")
        cpu_s = _fmt_seconds(float(e["cpu_seconds"])) if "cpu_seconds" in e else "not recorded"
        lines.append(
            f"| {i} | {when} | {what} | {_fmt_seconds(float(e.get('total_seconds') or 0))} "
            f"| {cpu_s} | {state} |"
        )
    return lines + [""]


def render_report(out: Path, doc: dict[str, Any]) -> str:
    """The Markdown report: status, every stage's section, the figure index, provenance."""
    results_dir, figures_dir = out / "results", out / "figures"
    meta = doc["metadata"]
    preset = doc["preset"]
    lines = [
        f"# Reproduction report: preset `{preset}`",
        "",
        f"Castin, Ablin and Peyré, *How Smooth Is Attention?* (ICML 2024), regenerated by "
        f"`meanfield reproduce --preset {preset}` on {meta['created']} "
        f"(commit `{(meta.get('git_commit') or 'unknown')[:12]}`, device {meta.get('device')}, "
        f"torch {meta['versions'].get('torch')}, transformers "
        f"{meta['versions'].get('transformers', 'not installed')}).",
        "",
        claims_table(results_dir),
        "## How this run was made",
        "",
        *_run_time_lines(doc),
        "Models and texts are the offline stand-ins of docs/experiments.md unless a stage says "
        "otherwise; legends name the model actually used. The paper's curves were typed into "
        "its plotting scripts, not fitted (defect D7 of the authors' released code; D1–D7 are "
        "listed in docs/experiments.md), and are shown for comparison only. A bound marked "
        "*candidate* is ours, tested here but not proved; none is the paper's printed value.",
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
