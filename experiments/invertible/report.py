"""The report of the ``invertible`` stage: the loader, ``summary``, ``report_section``, ``claims``."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from ..engine import Claims, load_json, load_npz, stage_result
from ..markdown import number as _fmt
from .settings import NAME
from .sweep import MAPS

__all__ = ["claims", "load", "report_section", "summary"]


def load(results_dir: str | Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The saved arrays and document; FileNotFoundError naming the stage when missing."""
    arrays = load_npz(stage_result(results_dir, NAME, f"{NAME}.npz"))
    return arrays, load_json(stage_result(results_dir, NAME, f"{NAME}.json"))


def summary(results_dir: str | Path) -> dict[str, Any]:
    """Per map and radius: outcomes over the seeds, worst observed ratio, local constants."""
    try:
        _, doc = load(results_dir)
    except FileNotFoundError:
        return {}
    rows = doc["rows"]
    cfg = doc["metadata"]["config"]
    out: dict[str, Any] = {
        **{k: cfg[k] for k in ("n", "target", "ref_radius")},
        "seeds": len(cfg["seeds"]),
        "maps": {},
    }
    for m in MAPS:
        per_r = []
        for R in cfg["radii"]:
            sel = [r for r in rows if r["map"] == m and r["R"] == float(R)]
            ratios = [r["max_ratio"] for r in sel if r["max_ratio"] == r["max_ratio"]]
            per_r.append(
                {
                    "R": float(R),
                    "outcomes": dict(Counter(r["outcome"] for r in sel)),
                    "max_ratio": max(ratios) if ratios else None,
                    "banach_holds": all(r["banach_holds"] for r in sel),
                    "max_local_lipschitz": max(r["local_lipschitz"] for r in sel),
                    "max_spectral_radius": max(r["spectral_radius"] for r in sel),
                    "max_preimage_error": max(r["preimage_error"] for r in sel),
                }
            )
        mine = [r for r in rows if r["map"] == m]
        out["maps"][m] = {
            "radii": per_r,
            "all_recovered": all(r["outcome"] == "recovered" for r in mine),
            "failures": sum(r["outcome"] != "recovered" for r in mine),
            "runs": len(mine),
            "banach_holds": all(r["banach_holds"] for r in mine),
            "failures_with_rho_le_1": sum(
                r["outcome"] != "recovered" and r["spectral_radius"] <= 1 for r in mine
            ),
            "recovered_with_rho_gt_1": sum(
                r["outcome"] == "recovered" and r["spectral_radius"] > 1 for r in mine
            ),
        }
    return out


def report_section(results_dir: str | Path, figures_dir: str | Path) -> str:
    """Markdown for ``report.md``: outcomes per radius for both blocks, and the figure."""
    s = summary(results_dir)
    figs = Path(figures_dir).name
    lines = ["## Invertible residual attention (Kim et al.)", ""]
    if not s:
        return "\n".join(lines + ["No results."]) + "\n"
    lines += [
        f"Residual blocks x ↦ x + g(x) on n = {s['n']} tokens, g scaled so that its certified "
        f"Lipschitz bound is c = {s['target']:g}: globally for L2 attention (proved, "
        "docs/derivations/invertible.md §2), only on the ball of radius "
        f"{s['ref_radius']:g} for dot-product (DP) attention. Inputs: a query at the origin "
        "attending evenly to keys at ±Rw (§4), where DP attention's local constant grows like "
        f"R². Each block maps x* to y and is inverted from x₀ = y; {s['seeds']} random "
        "head(s) per radius. *Observed* is the largest ratio of successive steps "
        "‖x_{k+1} − x_k‖/‖x_k − x_{k−1}‖, which Banach's argument bounds by c.",
        "",
        "| map | R | recovered | wrong preimage | no convergence | observed ratio ≤ | "
        "max ‖Dg(x*)‖ | max ρ(Dg(x*)) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m, v in s["maps"].items():
        for r in v["radii"]:
            o = r["outcomes"]
            lines.append(
                f"| {m} | {r['R']:g} | {o.get('recovered', 0)} | {o.get('wrong preimage', 0)} "
                f"| {o.get('no convergence', 0)} | {_fmt(r['max_ratio'])} "
                f"| {_fmt(r['max_local_lipschitz'])} | {_fmt(r['max_spectral_radius'])} |"
            )
    l2, dp = s["maps"]["L2"], s["maps"]["DP"]
    lines += [
        "",
        f"L2: {l2['runs'] - l2['failures']}/{l2['runs']} inversions recovered x*; the observed "
        f"ratios respect c in {'every' if l2['banach_holds'] else 'NOT every'} run. "
        f"DP: {dp['failures']}/{dp['runs']} inversions failed (a wrong preimage, checked by "
        "mapping it forward, or no convergence); a DP failure appears once ρ(Dg(x*)) > 1, "
        "outside the ball where its bound holds.",
        "",
        f"![invertible attention]({figs}/fig_invertible.png)",
        "",
    ]
    return "\n".join(lines) + "\n"


def claims(results_dir: str | Path) -> Claims:
    """No row of the verdict table: the stage checks none of the paper's claims."""
    del results_dir
    return Claims([], [])
