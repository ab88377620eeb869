"""``meanfield reproduce``: run the experiments of a preset, draw every figure and write report.md.

Run every experiment stage of a preset (resumable: rerun to continue), draw all figures and write
OUT/report.md.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..options import UsageError, add_command, add_common, add_device, check_out_dir

__all__ = ["add_execution", "register"]


def add_execution(p: argparse.ArgumentParser) -> None:
    """Add ``--workers`` and ``--scheduler`` (Dask, the optional extra; docs/cluster.md)."""
    p.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="run the points on N local Dask worker processes (needs the extra "
        "meanfield[dist]; default: serially in this process)",
    )
    p.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="run the points on the Dask cluster whose scheduler is at ADDRESS, "
        "e.g. tcp://node1:8786 (docs/cluster.md)",
    )


def check_execution(args: argparse.Namespace) -> None:
    """Raise UsageError for a bad ``--workers`` / ``--scheduler`` combination."""
    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers must be at least 1, got {args.workers}")
    if args.workers is not None and args.scheduler:
        raise UsageError("give --workers or --scheduler, not both")
    if args.workers is not None or args.scheduler:
        from experiments.engine import require_dask

        require_dask()  # before any progress line or output directory


def handle(args: argparse.Namespace) -> dict[str, Any]:
    """Run the pipeline; a failed stage or figure makes the command exit 2 after the report."""
    from ..pipeline import reproduce

    check_execution(args)
    check_out_dir(args.out, subdirs=("results", "figures"))
    doc = reproduce(
        args.out,
        args.preset,
        device=args.device,
        only=args.only.split(",") if args.only else None,
        figures=not args.no_figures,
        progress=not args.no_progress,
        seed=args.seed,
        workers=args.workers,
        scheduler=args.scheduler,
    )
    failed = [k for k, e in doc["stages"].items() if e["status"] != "ok"]
    failed += [f"figure {k}" for k, e in doc.get("figures", {}).items() if e["status"] == "failed"]
    if failed:
        raise UsageError(
            f"{', '.join(failed)} failed (details in {args.out}/reproduce.json"
            + (f" and {doc['report']}" if "report" in doc else "")
            + "); rerun the same command to resume"
        )
    return doc


def show(doc: dict[str, Any]) -> None:
    """Per-stage status and time, failed figures, the report."""
    runs = doc.get("history") or []
    print(
        f"meanfield reproduce: preset {doc['preset']}, {doc['total_seconds']:.0f} s"
        + (
            f" ({len(runs)} invocations into this directory: "
            f"{doc.get('history_total_seconds', 0.0):.0f} s in all)"
            if len(runs) > 1
            else ""
        )
    )
    for name, e in doc["stages"].items():
        print(f"  {name:<14s} {e['status']:<7s} {e['seconds']:7.1f} s")
    for fid, e in doc.get("figures", {}).items():
        if e["status"] != "ok":
            print(f"  figure {fid:<4s} {e['status']}: {e.get('error', '')}")
    n_ok = sum(e["status"] == "ok" for e in doc.get("figures", {}).values())
    if "figures" in doc:
        print(f"  {n_ok} of {len(doc['figures'])} figures drawn")
    if "report" in doc:
        print(f"  wrote {doc['report']}")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``reproduce``."""
    from ..pipeline import PRESET_NAMES, QUICK_BUDGET_CPU_SECONDS

    p = add_command(sub, __doc__)
    add_common(
        p,
        seed="replaces the seed of every stage whose preset has one (default: keep them)",
        seed_default=None,
        progress=True,
    )
    p.add_argument(
        "--preset",
        choices=PRESET_NAMES,
        default="quick",
        help="quick: every figure in about 3-4 min on a quiet 2-core machine (budget "
        f"{QUICK_BUDGET_CPU_SECONDS / 60:g} min of CPU time); paper: the full grids (about 1.3 h); "
        "long: the long-context stage alone (about 1 h; docs/long_context.md); a stage "
        "without the preset is left out",
    )
    p.add_argument(
        "--out", default="reproduce_out", help="output directory (default reproduce_out)"
    )
    add_device(p)
    p.add_argument("--only", help="comma-separated stages to run")
    p.add_argument("--no-figures", action="store_true", help="run the experiments only")
    add_execution(p)
    p.set_defaults(handler=handle, printer=show)
