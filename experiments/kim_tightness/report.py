"""The report of the ``kim_tightness`` stage: loader, ``summary``, ``report_section``, ``claims``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..engine import Claims, load_json
from ..markdown import number as _fmt
from .settings import HEADS, NAME

__all__ = ["claims", "load_heads", "report_section", "summary"]


def load_heads(results_dir: str | Path) -> dict[str, dict[str, Any]]:
    """The saved heads, ``name -> JSON document``, in the order of :data:`HEADS`."""
    paths = {name: Path(results_dir) / NAME / f"head_{name}.json" for name in HEADS}
    return {name: load_json(path) for name, path in paths.items() if path.exists()}


def summary(results_dir: str | Path) -> dict[str, Any]:
    """Per head: the largest N, the lower bounds and ratios there, the fits and any violation."""
    doc: dict[str, Any] = {}
    for name, d in load_heads(results_dir).items():
        r = d["rows"]
        doc[name] = {
            "label": d["label"],
            "n_max": r["n"][-1],
            "lower_inf": r["lower_inf"][-1],
            "ratio_inf": r["ratio_inf"][-1],
            "ratio_inf_min": float(np.nanmin(np.asarray(r["ratio_inf"], dtype=float))),
            "ratio_2_wq2_last": _last_finite(r["ratio_2_wq2"]),
            "fit_lower_inf_over_K_slope_w0": d["fits"]["lower_inf_over_K"]["slope_w0"],
            "fit_lower_2_exponent": d["fits"]["lower_2"]["exponent"],
            "violations": d["violations"],
        }
    return doc


def _last_finite(v: Sequence[Any]) -> float:
    a = np.asarray(v, dtype=float)
    a = a[np.isfinite(a)]
    return float(a[-1]) if a.size else math.nan


def _signed(x: Any) -> str:
    if x is None or not math.isfinite(x):
        return "+ –"
    return f"{'−' if x < 0 else '+'} {abs(x):.3g}"


#: The columns of a head's table after N.
_COLUMNS = (
    "lower_inf",
    "upper_inf",
    "ratio_inf",
    "lower_2",
    "upper_2",
    "ratio_2",
    "upper_2_wq2",
    "ratio_2_wq2",
)


def report_section(results_dir: str | Path, figures_dir: str | Path) -> str:
    """Markdown for ``report.md``: per head, the table bound / lower bound / ratio at every N."""
    heads = load_heads(results_dir)
    figs = Path(figures_dir).name
    lines = ["## Tightness of Kim et al.'s L2-attention bounds in N", ""]
    if not heads:
        return "\n".join(lines + ["No results."]) + "\n"
    lines += [
        "Lower bounds on the global Lipschitz constant of L2 multi-head attention in the ∞-norm "
        "and the 2-norm of the flattened input: the Jacobian norm at an input found by a "
        "multi-start search started from the closed-form construction of docs/theory.md §8a "
        "(any input gives a valid lower bound). Ratio = Kim et al.'s upper bound / measured "
        "lower bound; `p=2` is the bound as recalled (wq_power = 1), `p=2,WQ²` our repaired "
        "form (proved, docs/derivations/invertible.md §2). The ∞-norm bound is "
        "(4 W₀((N−1)/e) + 1/√(D/H)) K with W₀((N−1)/e) ≈ "
        "log N − log log N: the prediction is that the ∞-norm lower bound grows like "
        "log N − log log N with slope 4K against W₀((N−1)/e), so the ∞ ratio tends to a "
        "constant (1 on the scalar head), while the 2-norm ratio may grow.",
        "",
    ]
    for d in heads.values():
        r = d["rows"]
        lines += [
            f"**{d['label']}** (K = {_fmt(d['K_inf'])})",
            "",
            "| N | lower ∞ | upper ∞ | ratio ∞ | lower 2 | upper 2 | ratio 2 | upper 2,WQ² "
            "| ratio 2,WQ² |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for i, N in enumerate(r["n"]):
            lines.append(f"| {N} | " + " | ".join(_fmt(r[k][i]) for k in _COLUMNS) + " |")
        f = d["fits"]
        lines += [
            "",
            f"Fits over N ≥ {f['lower_inf']['n_min']}: ∞-norm lower bound / K ≈ "
            f"{_fmt(f['lower_inf_over_K']['slope_w0'])}·W₀((N−1)/e) "
            f"{_signed(f['lower_inf_over_K'].get('intercept_w0'))} (the bound has slope 4); "
            f"against log N − log log N the slope is {_fmt(f['lower_inf']['slope_lnlnln'])}. "
            f"Ratio ∞ goes from {_fmt(r['ratio_inf'][0])} (N = {r['n'][0]}) to "
            f"{_fmt(r['ratio_inf'][-1])} (N = {r['n'][-1]}), like "
            f"N^{_fmt(f['ratio_inf']['exponent'])}; the 2-norm lower bound grows like "
            f"N^{_fmt(f['lower_2']['exponent'])} and the ratio of the recalled 2-norm bound goes "
            f"from {_fmt(r['ratio_2'][0])} to {_fmt(_last_finite(r['ratio_2']))}, like "
            f"N^{_fmt(f['ratio_2']['exponent'])} (the bound is √N log N).",
            "",
        ]
        if d["violations"]:
            lines += ["**Lower bound above an upper bound (finding):**", ""]
            for v in d["violations"]:
                lines.append(
                    f"- `{v['bound']}` at N = {v['N']}: lower {_fmt(v['lower'])} > "
                    f"upper {_fmt(v['upper'])}"
                )
            lines.append("")
    lines += [f"![Kim tightness]({figs}/fig_kim_tightness.png)", ""]
    return "\n".join(lines) + "\n"


def claims(results_dir: str | Path) -> Claims:
    """No row of the verdict table: the stage checks none of the paper's claims."""
    del results_dir
    return Claims([], [])
