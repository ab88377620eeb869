"""``meanfield figures``: redraw every figure from saved results.

Redraw every figure from the results of `meanfield reproduce` or `meanfield experiment`. A figure
whose results are missing is listed as missing; a figure that fails to draw (damaged results)
makes the command exit with status 2, naming it and its file, after the others are drawn.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from ..options import CommandFailed, UsageError, add_command, add_common, check_out_dir

__all__ = ["register"]


def handle(args: argparse.Namespace) -> dict[str, Any]:
    """Draw the figures whose results exist under ``--results``."""
    from ..pipeline import draw_all

    results = Path(args.results)
    if not results.is_dir():
        raise UsageError(
            f"no results directory {results}; run `meanfield reproduce --out DIR` first"
        )
    out = Path(args.out) if args.out else results.parent / "figures"
    check_out_dir(out, "--out" if args.out else "figure directory")
    # the error line names every failed figure; its warning would say it twice (-v keeps it)
    log = logging.getLogger("meanfield.reproduce")
    level = log.level
    if not args.verbose:
        log.setLevel(logging.ERROR)
    try:
        status = draw_all(results, out, only=args.only.split(",") if args.only else None)
    finally:
        log.setLevel(level)
    failed = {fid: e for fid, e in status.items() if e["status"] == "failed"}
    if failed:
        drawn = sum(e["status"] == "ok" for e in status.values())
        details = "; ".join(f"{fid}: {e.get('error', '')}" for fid, e in failed.items())
        raise CommandFailed(
            f"{len(failed)} figure(s) failed ({', '.join(failed)}; {drawn} drawn into {out}): "
            f"{details}"
        )
    if not any(e["status"] == "ok" for e in status.values()):
        raise UsageError(f"no figure could be drawn from {results}")
    return {"kind": "figures", "results": str(results), "out": str(out), "figures": status}


def show(doc: dict[str, Any]) -> None:
    """One line per figure: id, status, PDF or the error."""
    for fid, e in doc["figures"].items():
        what = ", ".join(f for f in e["files"] if f.endswith(".pdf")) or e.get("error", "")
        print(f"  {fid:<3s} {e['status']:<8s} {what}")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``figures``."""
    p = add_command(sub, __doc__)
    add_common(p)
    p.add_argument(
        "--results",
        default="reproduce_out/results",
        help="results root (default reproduce_out/results)",
    )
    p.add_argument("--out", help="figure directory (default: next to the results)")
    p.add_argument("--only", help="comma-separated figure ids, e.g. F1,F4,B")
    p.set_defaults(handler=handle, printer=show)
