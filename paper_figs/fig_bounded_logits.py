r"""Figure M: the local Lipschitz constant of attention against the input radius, four forms.

One panel per input construction (tied inputs; tied inputs with the query in the null space of
head 0's query map), log axes: :math:`\|J\|_2` of one random causal attention layer at inputs of
radius :math:`R` (the largest value over the inputs of each radius; markers on solid lines),
measured by the certified call of :func:`meanfield.local_lipschitz` (Lanczos on the streaming
path), with its certified
bracket :math:`[\text{lower}, \text{upper\_prob}]` (confidence :math:`1-\delta` over the random
start) as a band in the form's colour (at most 5 % wide where the width rule was met, so often
thinner than the line; the panel notes the widest bracket of each form and the forms whose
certified lower end is 0, which get no band), for plain dot-product attention, QK-norm,
soft-capped logits and a sliding window, each with the upper bound drawn for it (dashed, in its colour; the same in both panels, since a bound holds for every
input of radius :math:`R`; a form without one has no dashed line, and the panel says so). The
fitted growth exponent of each form over the large radii (shaded), fitted to the value, is
written in each panel's title, and the layer's shape in the figure's.

Reads ``<results>/bounded_logits/bounded_logits.json`` written by
:func:`experiments.bounded_logits.run`; no computation.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ._style import (
    PALETTE,
    TWO_COLUMNS,
    confidence_text,
    figure_main,
    legend_below,
    log_axes,
    save,
    style,
)

__all__ = ["COLOURS", "STEM", "draw", "main"]

STEM = "fig_bounded_logits"

#: Each form's colour and marker (its measured curve and its bound share the colour).
COLOURS = {
    "plain": PALETTE["unmasked"],
    "qk_norm": PALETTE["bound"],
    "softcap": PALETTE["released"],
    "window": PALETTE["masked"],
}
_MARKERS = {"plain": "o", "qk_norm": "s", "softcap": "^", "window": "D"}
_NAMES = {"plain": "plain", "qk_norm": "QK-norm", "softcap": "soft-cap", "window": "window"}
_PANELS = {
    "tied": "tied inputs",
    "null_query": "tied inputs, query in the null space of head 0's query map",
}


def _load(results_dir: str | Path) -> dict[str, Any]:
    from experiments.bounded_logits import load_results

    doc = load_results(results_dir)
    if not doc:
        raise FileNotFoundError(
            f"no results in {Path(results_dir) / 'bounded_logits'}: run the 'bounded_logits' "
            "experiment first (meanfield reproduce --only bounded_logits)"
        )
    return doc


def _name(form: str, s: dict[str, Any]) -> str:
    if form == "softcap":
        return f"soft-cap κ = {s['softcap']:g}"
    if form == "window":
        return f"window W = {s['window']}"
    return _NAMES.get(form, form)


def _floats(values: Any) -> np.ndarray:
    """A stored list of floats (``"inf"`` and ``None`` as written by the engine) as an array."""
    from experiments.engine import record_float

    return np.asarray([record_float(v) for v in values], dtype=float)


def _panel(ax: Any, doc: dict[str, Any], family: str) -> tuple[float, float]:
    """One input construction: every form's curve, bracket and bound; returns the values' range.

    The range is that of the values and bounds; the bands are clipped to it by the axes.
    """
    s = doc["settings"]
    lows, highs = [], []
    notes = []
    for form, e in doc["forms"].items():
        c = COLOURS.get(form, "k")
        R = np.asarray(e["R"], dtype=float)
        mine = e["by_input"][family]
        y = np.asarray(mine["value"], dtype=float)
        open_marker = form == "softcap"  # drawn over the plain curve: keep that visible
        ax.plot(
            R,
            y,
            "-",
            marker=_MARKERS.get(form, "o"),
            ms=3.6 if open_marker else 3.0,
            mfc="none" if open_marker else c,
            color=c,
            lw=1.0,
            label=f"{_name(form, s)}: measured",
        )
        lo, hi = _floats(mine["lower"]), _floats(mine["upper_prob"])
        certified = lo > 0
        if certified.any():
            ax.fill_between(
                R, np.where(certified, lo, np.nan), np.where(certified, hi, np.nan),
                color=c, alpha=0.25, lw=0, zorder=1,
            )  # fmt: skip
        note = f"{_NAMES.get(form, form)}: "
        if certified.any():
            note += f"×{float(np.nanmax(hi[certified] / lo[certified])):.3g}"
        if not certified.all():
            k = int((~certified).sum())
            note += (
                "; " if certified.any() else ""
            ) + f"lower end 0 at\n  {k} of {len(R)} radii (no band)"
        notes.append(note)
        lows.append(float(np.nanmin(y)))
        highs.append(float(np.nanmax(y)))
        b = np.asarray([np.nan if v is None else v for v in e["bound"]], dtype=float)
        if np.isfinite(b).any():
            ax.plot(R, b, "--", color=c, lw=1.0, label=f"{_name(form, s)}: upper bound")
            highs.append(float(np.nanmax(b)))
    missing = [_name(f, s) for f, e in doc["forms"].items() if not any(e["bound"])]
    text = "widest certified bracket,\nupper_prob / lower:\n" + "\n".join(notes)
    if missing:
        text += "\nno bound drawn:\n" + ",\n".join(missing)
    ax.annotate(
        text,
        xy=(0.03, 0.97),
        xycoords="axes fraction",
        ha="left",
        va="top",
        fontsize=6,
        bbox={"facecolor": "white", "edgecolor": "0.7", "lw": 0.5, "alpha": 0.9, "pad": 2.0},
        zorder=5,
    )
    return min(lows), max(highs)


def draw(results_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """Draw ``fig_bounded_logits.{pdf,png}`` into ``out_dir`` from the saved results."""
    import matplotlib.pyplot as plt

    doc = _load(results_dir)
    s = doc["settings"]
    L = s["layer"]
    families = list(next(iter(doc["forms"].values()))["by_input"])
    with style():
        fig, axes = plt.subplots(
            1, len(families), figsize=(TWO_COLUMNS, 3.2), sharey=True, squeeze=False
        )
        ranges = [_panel(ax, doc, fam) for ax, fam in zip(axes[0], families, strict=True)]
        R = np.asarray(next(iter(doc["forms"].values()))["R"], dtype=float)
        lo, hi = min(r[0] for r in ranges), max(r[1] for r in ranges)
        for ax, fam in zip(axes[0], families, strict=True):
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlim(R.min() / 1.2, R.max() * 1.2)
            ax.set_ylim(lo / 1.5, hi * 1.5)
            ax.axvspan(float(s["large_R"]), R.max() * 1.2, color="0.92", zorder=0, lw=0)
            log_axes(ax)
            ax.set_xlabel("input radius $R$ (largest token norm)")
            slopes = ", ".join(
                f"{_NAMES.get(f, f)} {e['by_input'][fam]['exponent']:.2f}"
                for f, e in doc["forms"].items()
            )
            ax.set_title(
                f"{_PANELS.get(fam, fam)}\nslopes over the shaded range:\n{slopes}", fontsize=7
            )
        axes[0][0].set_ylabel(
            r"local Lipschitz constant $\|J\|_2$" + "\n(output norm / input norm)"
        )
        from matplotlib.patches import Patch

        handles, labels = axes[0][0].get_legend_handles_labels()
        conf = doc["confidence"]
        handles.append(Patch(facecolor="0.35", alpha=0.35, lw=0))
        labels.append(
            "band: bracket [lower, upper_prob], "
            + ("deterministic" if conf is None else f"confidence {confidence_text(conf)}")
        )
        handles.append(Patch(facecolor="0.92", lw=0))
        labels.append("grey: radii of the fitted slopes")
        legend_below(fig, handles, labels, ncol=3, fontsize=7, handlelength=2.2)
        fig.suptitle(
            f"Random causal attention layer: d = {L['d']}, {L['n_heads']} query heads, "
            f"{L['n_kv_heads']} key/value heads of width {L['head_dim']}, n = {s['n']} tokens.\n"
            "Do bounded logits stop the growth of the local Lipschitz constant in $R$?",
            fontsize=8,
        )
        return save(fig, Path(out_dir) / STEM)


#: The command line ``python -m paper_figs.fig_bounded_logits --results DIR --out DIR``:
#: :func:`._style.figure_main` with this figure's ``draw``.
main = partial(figure_main, draw, __doc__)


if __name__ == "__main__":
    main()
