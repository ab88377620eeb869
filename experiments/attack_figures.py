"""Experiment stage ``attacks``: the sweeps behind figures B (worst-case measures) and C (mass splitting).

The work itself lives in :func:`experiments.attacks_cli.figure_b_results` and
:func:`experiments.attacks_cli.figure_c_results` (also reachable as ``meanfield attack search
--figure-b`` and ``meanfield attack split --figure-c``); this module gives them presets and the
stage interface used by :mod:`experiments.reproduce`. Results go to ``results_dir/"attacks"``:
``worst_measures.{npz,json}`` and ``mass_splitting.{npz,json}``. Each file is written atomically
once its sweep is complete, and a rerun skips a sweep whose files exist with the same
configuration, so an interrupted run redoes at most the sweep in flight.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .results import load_json
from .runner import preset_config

__all__ = ["NAME", "PRESETS", "report_section", "run", "summary"]

NAME = "attacks"

#: Settings per preset. ``figure_b`` and ``figure_c`` are the keyword arguments of
#: :func:`~experiments.attacks_cli.figure_b_results` and
#: :func:`~experiments.attacks_cli.figure_c_results`.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        "figure_b": {"radii": (1.0, 4.0), "n_atoms": 3, "n_restarts": 2, "steps": 25},
        "figure_c": {
            "radii": (2.0, 4.0),
            "k_curve_max": 1000,
            "budgets": (0.1, 0.5),
            "n_restarts": 1,
            "steps": 15,
        },
        "seed": 0,
    },
    "quick": {
        "figure_b": {"radii": (1.0, 2.0, 4.0, 6.0), "n_atoms": 3, "n_restarts": 6, "steps": 150},
        "figure_c": {
            "radii": (2.0, 3.0, 4.0, 5.0),
            "k_curve_max": 100_000,
            "budgets": (0.05, 0.1, 0.2, 0.5, 1.0),
            "n_restarts": 1,
            "steps": 60,
        },
        "seed": 0,
    },
    "paper": {
        "figure_b": {
            "radii": (0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0),
            "n_atoms": 5,
            "n_restarts": 32,
            "steps": 400,
        },
        "figure_c": {
            "radii": (2.0, 3.0, 4.0, 5.0, 6.0),
            "k_curve_max": 1_000_000,
            "budgets": (0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0),
            "n_restarts": 4,
            "steps": 200,
        },
        "seed": 0,
    },
}

_FILES = {"figure_b": "worst_measures", "figure_c": "mass_splitting"}


def _resolve(preset: str, overrides: dict[str, Any]) -> dict[str, Any]:
    config = preset_config(PRESETS, preset, overrides, what=f"{NAME} option(s)")
    for key, value in overrides.items():
        config[key] = {**config[key], **value} if isinstance(config[key], dict) else value
    return config


def _same_config(json_path: Path, config: dict[str, Any]) -> bool:
    """Whether a finished result file was produced with ``config`` (the keys it records)."""
    if not json_path.exists():
        return False
    try:
        recorded = load_json(json_path)["metadata"]["config"] or {}
    except (KeyError, TypeError, ValueError):
        return False
    for key, value in config.items():
        if key in recorded and _norm(recorded[key]) != _norm(value):
            return False
    return True


def _norm(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return [_norm(x) for x in v]
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def run(
    results_dir: str | Path,
    preset: str = "quick",
    *,
    device: str = "cpu",
    progress: bool = True,
    **overrides: Any,
) -> list[Path]:
    """Run the figure-B and figure-C sweeps of ``preset`` into ``results_dir/"attacks"``.

    Parameters
    ----------
    results_dir : path
    preset : {"tiny", "quick", "paper"}
    device : str
        Only ``"cpu"``: these are tiny dense problems, faster on one CPU thread than on a GPU.
    progress : bool
        Unused (the sweeps are short); accepted for the stage interface.
    **overrides
        ``figure_b={...}``, ``figure_c={...}`` (merged into the preset's) or ``seed=``.

    Returns
    -------
    list of Path
    """
    from .attacks_cli import figure_b_results, figure_c_results

    del progress
    if device != "cpu":
        raise ValueError(f"the attacks stage runs on the CPU only, got device={device!r}")
    config = _resolve(preset, overrides)
    out = Path(results_dir) / NAME
    out.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    for key, fn in (("figure_b", figure_b_results), ("figure_c", figure_c_results)):
        stem = out / _FILES[key]
        kwargs = config[key]
        if _same_config(stem.with_suffix(".json"), kwargs) and stem.with_suffix(".npz").exists():
            files += [stem.with_suffix(".npz"), stem.with_suffix(".json")]
            continue
        files += fn(out, seed=config["seed"], **kwargs)
    return files


def summary(results_dir: str | Path) -> dict[str, Any]:
    """Key numbers of the saved sweeps: worst-measure gains over the two-Dirac bound, split ratios."""
    out = Path(results_dir) / NAME
    doc: dict[str, Any] = {}
    wm = out / "worst_measures.json"
    if wm.exists():
        data = load_json(wm)
        settings = {}
        for key, s in data.get("settings", {}).items():
            gains = [
                v / t
                for v, t in zip(s["value"], s["two_dirac_bound"], strict=True)
                if t is not None and t == t and t > 0
            ]
            settings[key] = {
                "label": s["label"],
                "radii": data["radii"],
                "value": s["value"],
                "two_dirac_bound": s["two_dirac_bound"],
                "max_gain_over_two_dirac": max(gains) if gains else None,
            }
        doc["worst_measures"] = settings
    ms = out / "mass_splitting.json"
    if ms.exists():
        data = load_json(ms)
        best: dict[str, Any] = {}
        for name, rows in data.get("attacks", {}).items():
            split = [r["split"]["ratio_w2"] for r in rows]
            move = [r["move"]["ratio_w2"] for r in rows]
            best[name] = {
                "max_split_ratio_w2": max(split),
                "max_move_ratio_w2": max(move),
                "max_split_ratio_winf": max(r["split"]["ratio_winf"] for r in rows),
                "max_move_ratio_winf": max(r["move"]["ratio_winf"] for r in rows),
            }
        doc["mass_splitting"] = best
    return doc


def _fmt(x: Any) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x:.3g}"


def report_section(results_dir: str | Path, figures_dir: str | Path) -> str:
    """Markdown for ``report.md``: figures B and C with their key numbers."""
    s = summary(results_dir)
    figs = Path(figures_dir).name
    lines = ["## Worst-case measures and mass splitting (figures B and C)", ""]
    if "worst_measures" in s:
        lines += [
            "Multi-start search for the measure in B_R with the largest mean-field local "
            "constant (THEORY §7.4), started from the two-Dirac construction among others, so "
            "it never reports less than the closed-form two-Dirac bound.",
            "",
            "| setting | R | searched | two-Dirac bound | gain |",
            "|---|---|---|---|---|",
        ]
        for v in s["worst_measures"].values():
            for R, val, td in zip(v["radii"], v["value"], v["two_dirac_bound"], strict=True):
                gain = val / td if td else None
                lines.append(f"| {v['label']} | {R:g} | {_fmt(val)} | {_fmt(td)} | {_fmt(gain)} |")
        lines += ["", f"![figure B]({figs}/fig_b_worst_measures.png)", ""]
    if "mass_splitting" in s:
        lines += [
            "Best ratio W₂(Fν, Fμ)/W₂(ν, μ) found under a W₂ budget, moving atoms only against "
            "splitting them first (exact W₂ on both sides), and the same perturbations measured in "
            "W∞. At a Dirac the W∞ ratio cannot exceed ‖V‖ (THEORY §12.3), so splitting gains "
            "nothing there; the gain is a W₂ effect.",
            "",
            "| input | move-only (W₂) | split-then-move (W₂) | move-only (W∞) | split-then-move (W∞) |",
            "|---|---|---|---|---|",
        ]
        for name, v in s["mass_splitting"].items():
            lines.append(
                f"| {name} | {_fmt(v['max_move_ratio_w2'])} | {_fmt(v['max_split_ratio_w2'])} "
                f"| {_fmt(v['max_move_ratio_winf'])} | {_fmt(v['max_split_ratio_winf'])} |"
            )
        lines += ["", f"![figure C]({figs}/fig_c_mass_splitting.png)", ""]
    if len(lines) == 2:
        lines.append("No results.")
    return "\n".join(lines) + "\n"
