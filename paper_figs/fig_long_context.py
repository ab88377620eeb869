r"""Figure L: the local Lipschitz constant of real attention layers against n, at long contexts.

One panel per measured layer (model and layer): every window's estimate of :math:`\|J\|_2`
(dots) with its certified bracket from ``lower`` to ``upper_prob`` as error bars, the median
over the windows of each length (line), the plateau start :math:`m` of the stage's rule
(dashed vertical line; "no plateau seen" otherwise) and the mean-field upper bound at the
largest measured radius (a horizontal line when it lies within three decades of the data,
otherwise its value written at the top of the panel, the bound being many orders of magnitude
above). Log axes.

Reads ``<results>/long_context/long_context.json`` written by :func:`experiments.long_context.run`;
no computation.
"""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ._style import PALETTE, figure_main, log_axes, panel_grid, save, shared_legend, style

__all__ = ["STEM", "draw", "main"]

STEM = "fig_long_context"
#: The bound is drawn as a line when it is at most this many decades above the data.
_BOUND_DECADES = 3.0


def _load(results_dir: str | Path) -> dict[str, dict[str, Any]]:
    from experiments.long_context import load_layers

    layers = load_layers(results_dir)
    if not layers:
        raise FileNotFoundError(
            f"no results in {Path(results_dir) / 'long_context'}: run the 'long_context' "
            "experiment first (meanfield reproduce --preset long)"
        )
    return layers


def _panel(ax: Any, e: dict[str, Any]) -> None:
    r = e["records"]
    n = np.asarray(r["n"], dtype=float)
    value = np.asarray(r["value"], dtype=float)
    lower = np.asarray(r["lower"], dtype=float)
    upper = np.asarray(r["upper_prob"], dtype=float)
    colour = PALETTE["masked"] if e["masked"] else PALETTE["unmasked"]
    what = "causal" if e["masked"] else "bidirectional"
    below = np.clip(value - lower, 0.0, None)
    above = np.where(np.isfinite(upper), np.clip(upper - value, 0.0, None), 0.0)
    ax.errorbar(
        n,
        value,
        yerr=[below, above],
        fmt="o",
        ms=2.6,
        color=colour,
        alpha=0.65,
        elinewidth=0.8,
        capsize=1.5,
        label=rf"one window, {what}: $\|J\|_2$, bracket lower to upper_prob",
    )
    med = e["median"]
    ax.plot(
        med["n"], med["value"], "-", color=colour, lw=1.2, label=f"median over the windows, {what}"
    )
    top = float(np.nanmax(upper[np.isfinite(upper)])) if np.isfinite(upper).any() else 0.0
    top = max(top, float(np.nanmax(value)))
    low = float(np.nanmin(lower[lower > 0])) if (lower > 0).any() else float(np.nanmin(value))
    b = e["bound"]["log10"]
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(min(med["n"]) / 1.3, max(med["n"]) * 1.3)
    if math.isfinite(b) and b - math.log10(top) <= _BOUND_DECADES:
        ax.axhline(
            10.0**b,
            color=PALETTE["bound"],
            lw=1.2,
            label=r"mean-field bound ($c'=1$) at the largest $R$",
        )
        ax.set_ylim(low / 1.5, max(top, 10.0**b) * 1.5)
    else:
        ax.set_ylim(low / 1.5, top * 2.5)
        note = ax.annotate(
            f"mean-field bound at R = {e['bound']['R']:.3g}:\n"
            + (f"$10^{{{b:.1f}}}$ (off scale)" if math.isfinite(b) else "–"),
            xy=(0.03, 0.97),
            xycoords="axes fraction",
            ha="left",
            va="top",
            fontsize=6.5,
            color=PALETTE["bound"],
        )
        note.set_in_layout(False)  # a note inside the panel must not shrink it
    m = e["plateau"]["m"]
    if m is not None:
        ax.axvline(m, color="k", ls="--", lw=0.9, label="plateau start $m$")
        text = f"plateau from $n = {m}$"
    elif e["plateau"]["fits"]:
        text = "no plateau seen"
    else:
        text = f"too few lengths for the rule ({e['plateau']['min_lengths']} needed)"
    ax.annotate(
        text, xy=(0.98, 0.03), xycoords="axes fraction", ha="right", va="bottom", fontsize=7
    ).set_in_layout(False)
    log_axes(ax)
    ax.set_xlabel("tokens per window $n$")
    ax.set_title(f"{e['label']}\nlayer {e['layer']} ({what})", fontsize=7.5)


def draw(results_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """Draw ``fig_long_context.{pdf,png}`` into ``out_dir`` from the saved results."""
    layers = _load(results_dir)
    with style():
        fig, axes = panel_grid(len(layers), height=2.4)
        for ax, e in zip(axes, layers.values(), strict=True):
            _panel(ax, e)
        axes[0].set_ylabel(r"local Lipschitz constant $\|J\|_2$")
        shared_legend(fig, axes)
        fig.suptitle("Attention at long contexts:\ndoes $\\|J\\|_2$ plateau in $n$?", fontsize=8.5)
        return save(fig, Path(out_dir) / STEM)


#: The command line ``python -m paper_figs.fig_long_context --results DIR --out DIR``:
#: :func:`._style.figure_main` with this figure's ``draw``.
main = partial(figure_main, draw, __doc__)


if __name__ == "__main__":
    main()
