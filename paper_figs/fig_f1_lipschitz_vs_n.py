r"""Figure F1: local Lipschitz constant of attention on real text against sequence length n.

One panel per saved sweep of :mod:`experiments.real_data` (configuration × corpus × grid), all
in one file, ``fig_f1_lipschitz_vs_n.{pdf,png}`` (at most three panels per row, log–log axes),
and the same panels on linear axes in ``fig_f1_lipschitz_vs_n_linear.{pdf,png}`` (the released
plots were linear); 10 windows per n (the paper's protocol, docs/experiments.md, "Protocols and
defects"). Panel titles name the model actually measured, the layer and the differentiated map
in words, the text and the paper configuration it stands in for. Each panel shows

- the true local constant :math:`\|Df(X)\|_2` (dark blue circles, one per window of text), with
  its bracket ``[lower, upper_prob]`` as grey whiskers: ``lower`` is certified, and
  ``exact <= upper_prob`` holds with probability at least the sweep's ``confidence`` (e.g.
  :math:`1-10^{-6}`) over the seeded random start of the Lanczos iteration; the legend states the
  smallest confidence of the figure. Records written before ``upper_prob`` existed have no
  confidence: their certified bracket ``[lower, upper]`` is drawn in a darker grey and labelled
  "certified bracket". Windows whose upper end is infinite get no whisker and are counted under
  the panel; on the linear axes, whiskers reaching far above the data are cut at the frame and
  the largest ratio upper end / value is written under the panel;
- the released code's metric :math:`\sqrt{\|J(X)^\top f(X)\|}` (orange triangles; not a Lipschitz
  constant: defect D1 of docs/experiments.md); the window's mean radius is figure F2's x axis and
  F3's y axis, so it is not colour-coded here;
- a dotted vertical line at the model's training length where the grid goes beyond it
  (all-MiniLM-L6-v2 was fine-tuned on at most 128 tokens,
  :data:`experiments.real_data.TRAINING_LENGTH`);
- the least-squares fits :math:`c\,n^{\alpha}` (:func:`experiments.fits.fit_power_law`), and the
  paper's printed curve for the configuration the stand-in replaces (dashed; drawn by hand in
  the paper, not fitted: defect D7).

What the panels share is explained by one legend under the figure; what differs, the fitted
:math:`c\,n^{\alpha}` with the 95 % bootstrap interval of :math:`\alpha` and the paper's curve, is
written under each panel in the colour of its curve. An exponent interval that is narrower than
0.01 is printed with more digits, so that it never reads ``[0.09, 0.09]``. Reads saved results
only.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from experiments.fits import PAPER_CURVES
from experiments.real_data import CORPUS_STANDS_IN, TRAINING_LENGTH, sweep_fits

from ._style import (
    LABEL_RELEASED,
    LABEL_VALUE,
    PALETTE,
    PANEL_TITLE_PT,
    confidence_text,
    figure_main,
    fit_label,
    legend_entries,
    log_axes,
    panel_grid,
    panel_note,
    panel_title,
    panel_ylabel,
    save,
    shared_legend,
    style,
    sweeps_or_raise,
)

__all__ = ["STEM", "draw", "main"]

STEM = "fig_f1_lipschitz_vs_n"
STEM_LINEAR = "fig_f1_lipschitz_vs_n_linear"


def paper_curve_for(s: Mapping[str, Any]):
    """The paper's hand-set curve for the configuration a sweep stands in for, if any."""
    stands = CORPUS_STANDS_IN.get(s["corpus"])
    if not s.get("paper_configuration") or not stands:
        return None
    return PAPER_CURVES.get(f"{s['paper_configuration']} {stands}")


def bracket_label(confidence: float | None) -> str:
    r"""Legend label of the bracket of :math:`\|J\|_2` drawn for sweeps of this ``confidence``.

    ``None`` (records without a probabilistic end): the certified bracket ``[lower, upper]``;
    otherwise ``[lower, upper_prob]``, which holds with probability at least ``confidence``.
    """
    if confidence is None:
        return r"certified bracket of $\|J\|_2$"
    return rf"bracket of $\|J\|_2$ (holds with probability ≥ {confidence_text(confidence)})"


#: Legend labels of the fits and of the paper's curve (the points' labels are shared with F2:
#: ``_style.LABEL_VALUE``, ``_style.LABEL_RELEASED``).
LABEL_FIT_VALUE = (
    r"fit $c\,n^{\alpha}$ to $\|J\|_2$ (under each panel, with the 95 % interval of $\alpha$)"
)
LABEL_FIT_RELEASED = r"fit $c\,n^{\alpha}$ to the released metric"
LABEL_PAPER = "paper's curve (drawn by hand, not fitted)"


def _legend_rank(label: str) -> int:
    """Place in the shared legend (two columns: the true constant's entries, then the others)."""
    firsts = (
        LABEL_VALUE,
        "bracket of",
        "certified bracket",
        LABEL_FIT_VALUE,
        LABEL_RELEASED,
        LABEL_FIT_RELEASED,
        LABEL_PAPER,
    )
    return next((i for i, f in enumerate(firsts) if label.startswith(f)), len(firsts))


#: Whisker colours: the probabilistic bracket, and the certified one (records without it).
BRACKET_COLOURS = {True: "0.62", False: "0.35"}


def _draw_panel(ax, s: dict[str, Any], *, log: bool = True, confidence: float | None) -> None:
    """One sweep; ``confidence``: the smallest confidence of the figure's probabilistic brackets."""
    a = s["arrays"]
    n = a["n"].astype(float)
    val, low, rel = a["value"], a["lower"], a["released"]
    prob = s.get("confidence") is not None
    up = a["upper_prob"]  # equals the certified end when the records have no probabilistic one
    fin = np.isfinite(up)
    if fin.any():
        ax.errorbar(
            n[fin],
            val[fin],
            yerr=[val[fin] - low[fin], up[fin] - val[fin]],
            fmt="none",
            ecolor=BRACKET_COLOURS[prob],
            elinewidth=0.6,
            capsize=0,
            zorder=1,
            label=bracket_label(confidence if prob else None),
        )
    for y, size, marker, colour, label in (
        (val, 9, "o", PALETTE["fit"], LABEL_VALUE),
        (rel, 10, "^", PALETTE["released"], LABEL_RELEASED),
    ):
        ax.scatter(
            n,
            y,
            s=size,
            marker=marker,
            facecolors=colour,
            edgecolors="none",
            alpha=0.75,
            zorder=3,
            label=label,
        )
    grid = np.geomspace(n.min(), n.max(), 100) if log else np.linspace(n.min(), n.max(), 100)
    notes: list[tuple[str, Any]] = []
    fits = sweep_fits(s)  # computed once, shared with the report
    for key, name, label, color in (
        ("value", r"$\|J\|_2$", LABEL_FIT_VALUE, PALETTE["fit"]),
        ("released", "released", LABEL_FIT_RELEASED, PALETTE["released"]),
    ):
        fit = fits[key]
        if fit is not None:
            ax.plot(grid, fit(grid), color=color, lw=0.9, zorder=4, label=label)
            notes.append((fit_label(name, fit), color))
    curve = paper_curve_for(s)
    if curve is not None:
        ax.plot(grid, curve(grid), color="k", lw=0.8, ls="--", zorder=4, label=LABEL_PAPER)
        notes.append((rf"paper: ${curve.c:g}\,n^{{{curve.alpha:g}}}$", "k"))
    train_len = TRAINING_LENGTH.get(s["config"]["model"])
    if train_len is not None and n.max() > train_len:
        ax.axvline(
            train_len,
            color="0.35",
            lw=0.7,
            ls=":",
            zorder=2,
            label=f"length the model was trained on ({train_len} tokens)",
        )
    if log:
        ax.set_xscale("log")
        ax.set_yscale("log")
        log_axes(ax)
    else:
        # the data set the scale; bracket ends far above it are clipped at the frame
        shown = [val, rel] + ([curve(grid)] if curve is not None else [])
        top = max(float(np.nanmax(v[np.isfinite(v)])) for v in shown if np.isfinite(v).any())
        ax.set_ylim(0.0, 1.25 * top)
        clipped = fin & (up > 1.25 * top)
        if clipped.any():
            k = float(np.max(up[clipped] / val[clipped]))
            notes.append((rf"upper ends cut off, up to {k:.2g}× $\|J\|_2$", "0.4"))
    missing = int((~fin).sum())
    if missing:
        notes.append((f"{missing} of {fin.size} windows: no upper end", "0.4"))
    ax.set_xlabel("sequence length $n$")
    panel_ylabel(ax, "local Lipschitz constant")
    ax.set_title(panel_title(s), fontsize=PANEL_TITLE_PT, loc="left")
    panel_note(ax, notes)


def draw(results_dir: Path, out_dir: Path) -> list[Path]:
    """Draw ``fig_f1_lipschitz_vs_n`` (log–log) and ``..._linear`` (one panel per sweep).

    Parameters
    ----------
    results_dir : Path
        The results root holding ``real_data/``.
    out_dir : Path

    Returns
    -------
    list of Path
        The PDF and PNG of each version.
    """
    sweeps = sweeps_or_raise(results_dir)
    levels = [s["confidence"] for s in sweeps if s.get("confidence") is not None]
    confidence = min(levels) if levels else None  # the weakest guarantee among the sweeps
    written: list[Path] = []
    for stem, log in ((STEM, True), (STEM_LINEAR, False)):
        with style():
            fig, axes = panel_grid(len(sweeps), height=2.6)
            for ax, s in zip(axes, sweeps):
                _draw_panel(ax, s, log=log, confidence=confidence)
            handles, labels = legend_entries(axes)
            order = sorted(range(len(labels)), key=lambda i: _legend_rank(labels[i]))
            shared_legend(fig, axes, handles=[handles[i] for i in order])
            written += save(fig, Path(out_dir) / stem)
    return written


#: The command line ``python -m paper_figs.fig_f1_lipschitz_vs_n --results DIR --out DIR``:
#: :func:`._style.figure_main` with this figure's ``draw``.
main = partial(figure_main, draw, __doc__)


if __name__ == "__main__":
    main()
