"""Redraw every figure from saved results: ``meanfield figures`` and ``python -m paper_figs.make_all``.

Each figure module reads saved results only. A figure whose results are missing is reported as
``missing`` (with the stage to run) and skipped; a figure that fails to draw is reported as
``failed`` with its one-line error and the others are still drawn.

The registry :data:`FIGURES` maps a short figure id (EXPERIMENTS.md §2: F1–F7, A–C, plus ``T`` for
the theory-only figure) to its module and the experiment stage whose results it reads.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["FIGURES", "Figure", "draw_all", "main"]

log = logging.getLogger("meanfield.figures")


@dataclass(frozen=True)
class Figure:
    """One figure: its id, module, the stage that produces its results, and a title."""

    id: str
    module: str
    stage: str
    title: str
    #: The module's ``draw`` takes the stage's own directory (figures B and C) rather than the
    #: results root.
    stage_dir: bool = False

    def draw(self, results_dir: Path, out_dir: Path) -> list[Path]:
        """Draw this figure into ``out_dir``; FileNotFoundError when its results are missing."""
        mod = importlib.import_module(self.module)
        src = results_dir / self.stage if self.stage_dir else results_dir
        if self.stage_dir and not src.is_dir():
            raise FileNotFoundError(
                f"no results in {src}; run `meanfield reproduce --only {self.stage}`"
            )
        return [Path(p) for p in mod.draw(src, out_dir)]


FIGURES: tuple[Figure, ...] = (
    Figure(
        "F1", "paper_figs.fig_f1_lipschitz_vs_n", "real_data", "real data: Lipschitz constant vs n"
    ),
    Figure(
        "F2",
        "paper_figs.fig_f2_lipschitz_vs_radius",
        "real_data",
        "real data: Lipschitz constant vs mean radius",
    ),
    Figure("F3", "paper_figs.fig_f3_radius_vs_n", "real_data", "real data: mean radius vs n"),
    Figure(
        "F4",
        "paper_figs.fig_f4_adversarial",
        "adversarial",
        "adversarial inputs: Lipschitz constant vs n",
    ),
    Figure("F5", "paper_figs.fig_f5_sqrt_n", "synthetic", "synthetic √n regime"),
    Figure("F6", "paper_figs.fig_f6_mean_field", "synthetic", "mean-field regime"),
    Figure("F7", "paper_figs.fig_f7_large_radius", "synthetic", "large radius"),
    Figure(
        "A", "paper_figs.fig_a_lipschitz_vs_R", "synthetic", "Lipschitz constant vs R (v1 style)"
    ),
    Figure(
        "B", "paper_figs.fig_b_worst_measures", "attacks", "worst-case measures", stage_dir=True
    ),
    Figure("C", "paper_figs.fig_c_mass_splitting", "attacks", "mass splitting", stage_dir=True),
    Figure("T", "paper_figs.fig_theory_bounds", "verify_bounds", "bounds and regimes (theory)"),
)


def _select(only: Iterable[str] | None) -> list[Figure]:
    if only is None:
        return list(FIGURES)
    wanted = [s.strip() for s in only if s.strip()]
    by_id = {f.id.lower(): f for f in FIGURES}
    unknown = [w for w in wanted if w.lower() not in by_id]
    if unknown:
        raise ValueError(
            f"unknown figure id(s) {', '.join(unknown)}; known: {', '.join(f.id for f in FIGURES)}"
        )
    return [by_id[w.lower()] for w in wanted]


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
    for fig in _select(only):
        entry: dict[str, Any] = {"title": fig.title, "stage": fig.stage, "files": []}
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


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: ``python -m paper_figs.make_all --results DIR --out DIR``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default="reproduce_out/results", help="results root")
    p.add_argument("--out", default=None, help="figure directory (default: sibling 'figures')")
    p.add_argument("--only", default=None, help="comma-separated figure ids, e.g. F1,F4,B")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    out = Path(args.out) if args.out else Path(args.results).parent / "figures"
    status = draw_all(args.results, out, only=args.only.split(",") if args.only else None)
    if args.json:
        json.dump(status, sys.stdout, indent=1)
        print()
    else:
        for fid, e in status.items():
            print(f"{fid:>3s} {e['status']:<8s} {e.get('error') or ', '.join(e['files'])}")
    return 0 if any(e["status"] == "ok" for e in status.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
