r"""Figure F3: mean radius of the inputs against sequence length, one panel per input set.

The paper relates its steeper GPT-2 L6 curve (:math:`25.0\,n^{0.51}`) to a correlation between
the radius of the inputs and n (released ``gpt_2/correlation_n_R.pdf``; docs/experiments.md,
"The paper's experiments", F3). This figure plots the mean radius
:math:`R(X)=(\frac1n\sum_i\|x_i\|^2)^{1/2}` of every window (10 points per n, size 2, alpha 0.5,
as released) against n for every saved input set: model, layer, corpus and grid. Sweeps that
differ only in the map differentiated (or the mask) see the same windows, hence the same radii,
and share a panel (:func:`_distinct_inputs`), whose title names the model and layer (not the
map) and every paper configuration its sweeps stand in for; the panel standing in for the
paper's GPT-2 L6 (:data:`TARGET`, the middle SmolLM2 layer) is the one the paper's claim is
about.

Each panel has the fitted drift :math:`R\propto n^{\beta}`, written under the panel with the 95 %
bootstrap interval of :math:`\beta`; red crosses mark the n at which that power law misses the
geometric mean of the radii by more than :data:`MISS_SE` standard errors (:func:`fit_misses`),
i.e. where a power law does not describe the data (the radius levels off while the fit keeps
growing). Where the radius is constant to within 1 % (:func:`._style.near_constant`; e.g. the
LayerNorm outputs of the random GPT-2), the y axis is the offset from the median in per cent
of it, on a fixed ±1 % range, and the panel says so. One legend under the panels explains the
markers. Output: ``fig_f3_radius_vs_n.{pdf,png}``. Reads saved results only.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from experiments.real_data import sweep_fits

from ._style import (
    PALETTE,
    PANEL_TITLE_PT,
    constant_note,
    figure_main,
    fit_label,
    near_constant,
    panel_grid,
    panel_note,
    panel_title,
    panel_ylabel,
    percent_offset,
    save,
    shared_legend,
    style,
    sweeps_or_raise,
)

__all__ = ["MISS_SE", "RELATIVE_RANGE", "STEM", "TARGET", "draw", "fit_misses", "main"]

STEM = "fig_f3_radius_vs_n"
#: The paper configuration whose radius drift the paper's F3 is about.
TARGET = "GPT-2 L6"
#: Radii spanning less than this fraction of their median are drawn as offsets from it.
RELATIVE_RANGE = 0.01


def _input_key(s: dict) -> tuple:
    """Model, layer, corpus and grid: what the windows, hence the radii, depend on."""
    return (s["config"]["model"], s["config"]["layer"], s["corpus"], s["grid"])


def _distinct_inputs(sweeps: Sequence[dict]) -> list[dict]:
    """Keep one sweep per input set, in order of first appearance.

    The radius depends on the model, layer, corpus and grid only, not on the map differentiated
    or the mask (a sweep of the residual block sees the same windows as one of the heads).
    """
    first: dict[tuple, dict] = {}
    for s in sweeps:
        first.setdefault(_input_key(s), s)
    return list(first.values())


#: A power law "misses" at n when its value is more than this many standard errors of the mean
#: of log R(X) over the windows at n away from that mean.
MISS_SE = 3.0


def fit_misses(n: np.ndarray, R: np.ndarray, fit: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where a fitted power law does not describe the radii.

    Parameters
    ----------
    n, R : ndarray
        One entry per window.
    fit : callable
        The fitted curve, ``fit(n)``.

    Returns
    -------
    ns, centre, miss : ndarray
        The distinct n, the geometric mean of R(X) at each, and whether the fit lies more than
        :data:`MISS_SE` standard errors (of the mean of log R over the windows) away from it.
        Where a single window is given the standard error is undefined and nothing is flagged.
    """
    ns = np.unique(n)
    centre = np.empty(ns.size)
    miss = np.zeros(ns.size, dtype=bool)
    for i, v in enumerate(ns):
        logs = np.log(R[n == v])
        centre[i] = float(np.exp(logs.mean()))
        if logs.size > 1:
            se = float(logs.std(ddof=1)) / np.sqrt(logs.size)
            miss[i] = abs(logs.mean() - np.log(float(fit(v)))) > MISS_SE * max(se, 1e-12)
    return ns, centre, miss


def _paper_configurations(s: dict, sweeps: Sequence[dict]) -> list[str]:
    """The paper configurations of every sweep that sees the same windows as ``s``."""
    same = [o.get("paper_configuration") for o in sweeps if _input_key(o) == _input_key(s)]
    return list(dict.fromkeys(c for c in same if c))


LABEL_POINTS = "mean radius $R(X)$, one window of text"
LABEL_FIT = r"fit $c\,n^{\beta}$ (under each panel, with the 95 % interval of $\beta$)"
LABEL_MISS = f"geometric mean of $R(X)$ at n, missed by the fit (> {MISS_SE:g} s.e.)"


def _draw_panel(ax, s: dict, papers: Sequence[str]) -> None:
    a = s["arrays"]
    n, R = a["n"].astype(float), a["mean_radius"]
    centre = near_constant(R, RELATIVE_RANGE)

    def y(v):
        return v if centre is None else percent_offset(v, centre)

    ax.scatter(n, y(R), s=2, alpha=0.5, color=PALETTE["unmasked"], label=LABEL_POINTS)
    notes: list[tuple[str, Any]] = []
    fit = sweep_fits(s)["mean_radius"]  # computed once, shared with the report
    if fit is not None:
        grid = np.linspace(n.min(), n.max(), 100)
        ax.plot(grid, y(fit(grid)), color=PALETTE["fit"], lw=0.9, label=LABEL_FIT)
        notes.append((fit_label("$R$", fit, symbol=r"\beta"), PALETTE["fit"]))
        ns, centres, miss = fit_misses(n, R, fit)
        if miss.any():
            ax.scatter(
                ns[miss],
                y(centres[miss]),
                s=22,
                marker="x",
                color=PALETTE["masked"],
                linewidths=0.9,
                zorder=5,
                label=LABEL_MISS,
            )
            notes.append((f"fit misses {int(miss.sum())} of {ns.size} n (×)", PALETTE["masked"]))
    ax.set_xlabel("sequence length $n$")
    if centre is None:
        panel_ylabel(ax, "mean radius $R(X)$")
    else:
        ax.set_ylim(-100 * RELATIVE_RANGE, 100 * RELATIVE_RANGE)
        ax.set_ylabel(f"$R(X)/{centre:.4g}-1$ (%)")
        notes.append((constant_note(R, centre), "0.25"))
    ax.set_title(panel_title(s, with_map=False, papers=papers), fontsize=PANEL_TITLE_PT, loc="left")
    panel_note(ax, notes)


def draw(results_dir: Path, out_dir: Path) -> list[Path]:
    """Draw ``fig_f3_radius_vs_n.{pdf,png}`` (one panel per input set) into ``out_dir``.

    Parameters
    ----------
    results_dir : Path
        The results root holding ``real_data/`` (see :func:`._style.sweeps_or_raise`).
    out_dir : Path

    Returns
    -------
    list of Path
        The PDF and the PNG.
    """
    sweeps = sweeps_or_raise(results_dir)
    chosen = _distinct_inputs(sweeps)
    with style():
        fig, axes = panel_grid(len(chosen), height=2.3)
        for ax, s in zip(axes, chosen):
            _draw_panel(ax, s, _paper_configurations(s, sweeps))
        shared_legend(fig, axes)
        return save(fig, Path(out_dir) / STEM)


#: The command line ``python -m paper_figs.fig_f3_radius_vs_n --results DIR --out DIR``:
#: :func:`._style.figure_main` with this figure's ``draw``.
main = partial(figure_main, draw, __doc__)


if __name__ == "__main__":
    main()
