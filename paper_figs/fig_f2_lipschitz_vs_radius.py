r"""Figure F2: local Lipschitz constant of attention on real text against the mean radius.

One panel per saved sweep of :mod:`experiments.real_data`, all in one file,
``fig_f2_lipschitz_vs_radius.{pdf,png}``. x: the window's mean radius
:math:`R(X)=(\frac1n\sum_i\|x_i\|^2)^{1/2}` (the RMS token norm the paper plotted;
docs/experiments.md, "Protocols and defects"); y (log): the true :math:`\|Df(X)\|_2` (circles)
and the released code's metric :math:`\sqrt{\|J^\top f\|}` (triangles; not a Lipschitz constant,
defect D1); points coloured by n (``viridis``, as the released radius plots). One legend under
the panels shows the two markers in grey, the colour bar above it the colours.

Where the radius is constant to within 1 % over a sweep (:func:`._style.near_constant`; e.g. the
randomly initialised GPT-2, whose captured inputs are LayerNorm outputs: 27.7094 to 27.7104 in
the quick preset), a raw radius axis would stretch a spread of a few parts per million across
the panel and read as a trend. That panel's x axis is the offset of :math:`R(X)` from its median in per cent of it,
on a fixed ±1 % range, so that the points form one vertical column, and a line under the panel
says "R(X) constant: <median> ± <largest offset> %". Titles name the model actually measured,
the layer and map in words, and the text. Reads saved results only.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

from ._style import (
    LABEL_RELEASED,
    LABEL_VALUE,
    PANEL_TITLE_PT,
    constant_note,
    figure_main,
    log_axes,
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

__all__ = ["RELATIVE_RANGE", "STEM", "draw", "main"]

STEM = "fig_f2_lipschitz_vs_radius"
#: A sweep whose radii span less than this fraction of their median is drawn as offsets from it.
RELATIVE_RANGE = 0.01


def draw(results_dir: Path, out_dir: Path) -> list[Path]:
    """Draw ``fig_f2_lipschitz_vs_radius.{pdf,png}`` (one panel per sweep) into ``out_dir``.

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
    from matplotlib.colors import Normalize
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator

    # The points are coloured by n (colour bar); the legend shows each series' marker in grey.
    proxies = [
        Line2D([], [], ls="none", marker=marker, ms=3.5, color="0.45", label=label)
        for marker, label in (("o", LABEL_VALUE), ("^", LABEL_RELEASED))
    ]
    sweeps = sweeps_or_raise(results_dir)
    n_max = max(float(np.max(s["arrays"]["n"])) for s in sweeps)
    norm = Normalize(0.0, n_max)
    with style():
        fig, axes = panel_grid(len(sweeps), height=2.5)
        sc = None
        for ax, s in zip(axes, sweeps):
            a = s["arrays"]
            R = a["mean_radius"]
            centre = near_constant(R, RELATIVE_RANGE)
            x = R if centre is None else percent_offset(R, centre)
            sc = [
                ax.scatter(
                    x,
                    a[key],
                    c=a["n"],
                    cmap="viridis",
                    norm=norm,
                    s=size,
                    marker=marker,
                    edgecolors="0.15",
                    linewidths=0.25,
                )
                for key, size, marker in (("value", 8, "o"), ("released", 9, "^"))
            ][0]
            ax.set_yscale("log")
            log_axes(ax, x=False)
            if centre is None:
                ax.xaxis.set_major_locator(MaxNLocator(3))
                ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.6g}"))
                ax.set_xlabel("mean radius $R(X)$")
            else:
                edge = 100 * RELATIVE_RANGE
                ax.set_xlim(-edge, edge)
                ax.xaxis.set_major_locator(FixedLocator([-edge, 0.0, edge]))
                ax.xaxis.set_major_formatter(
                    FuncFormatter(lambda v, _: f"{v:+g}".replace("-", "−") if v else "0")
                )
                ax.set_xlabel(f"offset of $R(X)$ from {centre:.4g} (%)")
                panel_note(ax, [(constant_note(R, centre), "0.25")])
            panel_ylabel(ax, "local Lipschitz constant")
            ax.set_title(panel_title(s), fontsize=PANEL_TITLE_PT, loc="left")
        fig.colorbar(
            sc, ax=axes, location="bottom", shrink=0.35, aspect=30, label="sequence length $n$"
        )
        shared_legend(fig, axes, handles=proxies)
        return save(fig, Path(out_dir) / STEM)


#: The command line ``python -m paper_figs.fig_f2_lipschitz_vs_radius --results DIR --out DIR``:
#: :func:`._style.figure_main` with this figure's ``draw``.
main = partial(figure_main, draw, __doc__)


if __name__ == "__main__":
    main()
