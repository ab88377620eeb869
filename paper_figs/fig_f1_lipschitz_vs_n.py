r"""Figure F1: local Lipschitz constant of attention on real text against sequence length n.

One panel per saved sweep of :mod:`experiments.real_data` (configuration × corpus × grid), all
in one file, ``fig_f1_lipschitz_vs_n.{pdf,png}`` (at most three panels per row, log–log axes),
and the same panels on linear axes in ``fig_f1_lipschitz_vs_n_linear.{pdf,png}`` (docs/experiments.md
lists both; the released plots were linear); 10 windows per n (the paper's protocol,
docs/experiments.md, "Protocols and defects"). Each panel shows

- the true local constant :math:`\|Df(X)\|_2` (dark blue circles, one per window of text), with
  its certified bracket ``[lower, upper]`` as grey whiskers where the upper end is finite (rotary
  heads and the "block" map have none; on the linear axes, whiskers reaching far above the data
  are clipped at the frame);
- the released code's metric :math:`\sqrt{\|J(X)^\top f(X)\|}` (triangles; not a Lipschitz
  constant: defect D1 of docs/experiments.md), orange triangles; the window's mean radius is
  figure F2's x axis and F3's y axis, so it is not colour-coded here;
- a dotted vertical line at the model's training length where the grid goes beyond it
  (all-MiniLM-L6-v2 was fine-tuned on at most 128 tokens, :data:`experiments.real_data.TRAINING_LENGTH`);
- the least-squares fits :math:`c\,n^{\alpha}` with their 95 % bootstrap intervals
  (:func:`experiments.fits.fit_power_law`), and the paper's printed curve for the configuration
  the stand-in replaces, dashed and labelled as hand-set (D7). An exponent interval that is
  narrower than 0.01 is printed with more digits, so that it never reads ``[0.09, 0.09]``.

Legends name the model actually measured (docs/experiments.md, "Models and texts"). Reads saved results only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from experiments.fits import PAPER_CURVES, fit_power_law
from experiments.real_data import CORPUS_STANDS_IN, TRAINING_LENGTH, load_sweeps

from ._style import PALETTE, TWO_COLUMNS, figure_main, save, style

__all__ = ["STEM", "draw", "main"]

STEM = "fig_f1_lipschitz_vs_n"
STEM_LINEAR = "fig_f1_lipschitz_vs_n_linear"


def sweeps_or_raise(results_dir: Path) -> list[dict[str, Any]]:
    """Saved real-data sweeps, or FileNotFoundError naming the experiment to run."""
    sweeps = load_sweeps(Path(results_dir))
    if not sweeps:
        raise FileNotFoundError(
            f"no finished real-data records in {Path(results_dir) / 'real_data'}; run "
            "`meanfield reproduce --only real_data` first"
        )
    return sweeps


def panel_grid(n_panels: int, *, width: float = TWO_COLUMNS, height: float = 2.3):
    """A figure with ``n_panels`` axes on a grid of at most 3 columns (unused axes removed)."""
    import matplotlib.pyplot as plt

    ncols = min(3, n_panels)
    nrows = math.ceil(n_panels / ncols)
    w = width if ncols > 1 else 3.2
    fig, axes = plt.subplots(nrows, ncols, figsize=(w, height * nrows + 0.4), squeeze=False)
    flat = list(axes.ravel())
    for ax in flat[n_panels:]:
        ax.remove()
    return fig, flat[:n_panels]


def panel_title(s: Mapping[str, Any]) -> str:
    """Stand-in label, corpus and the paper configuration it replaces."""
    corpus = s["corpus"] if s["corpus"] in CORPUS_STANDS_IN else Path(s["corpus"]).name
    paper = s.get("paper_configuration")
    stands = CORPUS_STANDS_IN.get(s["corpus"])
    tail = f"\n→ paper: {paper}" + (f", {stands}" if stands else "") if paper else ""
    grid = "" if s.get("grid", "short") == "short" else f", {s['grid']} grid"
    return f"{s['model_short']}\n{s['map_desc']}, {corpus}{grid}{tail}"


def paper_curve_for(s: Mapping[str, Any]):
    """The paper's hand-set curve for the configuration a sweep stands in for, if any."""
    stands = CORPUS_STANDS_IN.get(s["corpus"])
    if not s.get("paper_configuration") or not stands:
        return None
    return PAPER_CURVES.get(f"{s['paper_configuration']} {stands}")


def _fit_label(name: str, fit) -> str:
    lo, hi = fit.alpha_ci
    digits = 2
    while digits < 4 and f"{lo:.{digits}f}" == f"{hi:.{digits}f}":
        digits += 1  # a narrow interval must not print as [0.09, 0.09]
    a, lo_s, hi_s = (f"{x + 0.0:.{digits}f}" for x in (fit.alpha, lo, hi))
    return rf"{name}: ${fit.c:.3g}\,n^{{{a}}}$, $\alpha\in[{lo_s},{hi_s}]$"


def _fit(n: np.ndarray, y: np.ndarray):
    ok = np.isfinite(y) & (y > 0)
    try:
        return fit_power_law(n[ok], y[ok], n_boot=1000, seed=0)
    except ValueError:  # fewer than two distinct n
        return None


def normalized_radius(R: np.ndarray) -> np.ndarray:
    """Mean radius rescaled to [0, 1] within a panel (min–max; 0.5 when constant)."""
    lo, hi = float(np.nanmin(R)), float(np.nanmax(R))
    if not hi > lo * (1 + 1e-9):
        return np.full(R.shape, 0.5)
    return (R - lo) / (hi - lo)


def log_axes(ax, *, x: bool = True) -> None:
    """Log axes with plain-number labels at 1, 2, 5 × 10^k (no minor labels).

    An x axis spanning more than 1.8 decades (the long grid, n up to 492), or a y axis spanning
    more than 1.2, is labelled at 1, 3 × 10^k instead, and one spanning more than 2.5 decades at
    10^k only, so that the labels of a short or narrow panel do not run into each other.
    """
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    for axis, on in ((ax.xaxis, x), (ax.yaxis, True)):
        if not on:
            continue
        lo, hi = ax.get_xlim() if axis is ax.xaxis else ax.get_ylim()
        decades = math.log10(hi / lo) if lo > 0 else 0.0
        subs: tuple[float, ...] = (1.0, 2.0, 5.0)
        if decades > (1.8 if axis is ax.xaxis else 1.2):
            subs = (1.0, 3.0)
        if decades > 2.5:
            subs = (1.0,)
        axis.set_major_locator(LogLocator(base=10, subs=subs))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())


def panel_legend(ax, handles: Sequence[Any] | None = None) -> None:
    """A compact legend below the panel (keeps the data visible).

    ``handles`` (optional) replaces the labelled artists of the axes, e.g. neutral proxies for
    series coloured by a colour map (the colour bar explains the colour, the legend the marker).

    Anchored a fixed number of points below the axes, under the tick labels and the x label,
    so that it clears them whatever height the layout gives the panel.
    """
    from matplotlib.transforms import offset_copy

    kwargs = {} if handles is None else {"handles": list(handles)}
    ax.legend(
        **kwargs,
        fontsize=6,
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        bbox_transform=offset_copy(ax.transAxes, fig=ax.figure, y=-31, units="points"),
        ncol=1,
        frameon=False,
        handlelength=1.6,
        borderaxespad=0.0,
    )


def panel_ylabel(ax, text: str) -> None:
    """The y label, on the first column of a panel grid only (titles need the room)."""
    spec = ax.get_subplotspec()
    if spec is None or spec.is_first_col():
        ax.set_ylabel(text)


def _draw_panel(ax, s: Mapping[str, Any], *, log: bool = True) -> None:
    a = s["arrays"]
    n = a["n"].astype(float)
    val, low, up, rel = a["value"], a["lower"], a["upper"], a["released"]
    fin = np.isfinite(up)
    if fin.any():
        ax.errorbar(
            n[fin],
            val[fin],
            yerr=[val[fin] - low[fin], up[fin] - val[fin]],
            fmt="none",
            ecolor="0.6",
            elinewidth=0.5,
            capsize=0,
            zorder=1,
            label="certified bracket of $\\|J\\|_2$",
        )
    for y, size, marker, colour, label in (
        (val, 9, "o", PALETTE["fit"], r"$\|J\|_2$ (true, one window)"),
        (rel, 10, "^", PALETTE["released"], r"released $\sqrt{\|J^\top f\|}$ (D1)"),
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
    for y, name, color in (
        (val, r"$\|J\|_2$ fit", PALETTE["fit"]),
        (rel, "released fit", PALETTE["released"]),
    ):
        fit = _fit(n, y)
        if fit is not None:
            ax.plot(grid, fit(grid), color=color, lw=0.9, zorder=4, label=_fit_label(name, fit))
    curve = paper_curve_for(s)
    if curve is not None:
        ax.plot(
            grid,
            curve(grid),
            color="k",
            lw=0.8,
            ls="--",
            zorder=4,
            label=rf"paper (hand-set, D7): ${curve.c:g}\,n^{{{curve.alpha:g}}}$",
        )
    train_len = TRAINING_LENGTH.get(s["config"]["model"])
    if train_len is not None and n.max() > train_len:
        ax.axvline(
            train_len,
            color="0.35",
            lw=0.7,
            ls=":",
            zorder=2,
            label=f"training length ({train_len} tokens)",
        )
    if log:
        ax.set_xscale("log")
        ax.set_yscale("log")
        log_axes(ax)
    else:
        # the data set the scale; certified upper ends far above it are clipped at the frame
        shown = [val, rel] + ([curve(grid)] if curve is not None else [])
        top = max(float(np.nanmax(v[np.isfinite(v)])) for v in shown if np.isfinite(v).any())
        ax.set_ylim(0.0, 1.25 * top)
    ax.set_xlabel("sequence length $n$")
    panel_ylabel(ax, "local Lipschitz constant")
    ax.set_title(panel_title(s), fontsize=6.5, loc="left")
    panel_legend(ax)


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
    written: list[Path] = []
    for stem, log in ((STEM, True), (STEM_LINEAR, False)):
        with style():
            fig, axes = panel_grid(len(sweeps))
            for ax, s in zip(axes, sweeps):
                _draw_panel(ax, s, log=log)
            written += save(fig, Path(out_dir) / stem)
    return written


#: The command line ``python -m paper_figs.fig_f1_lipschitz_vs_n --results DIR --out DIR``:
#: :func:`._style.figure_main` with this figure's ``draw``.
main = partial(figure_main, draw, __doc__)


if __name__ == "__main__":
    main()
