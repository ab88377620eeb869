r"""Figure F2: local Lipschitz constant of attention on real text against the mean radius.

One panel per saved sweep of :mod:`experiments.real_data`, all in one file,
``fig_f2_lipschitz_vs_radius.{pdf,png}``. x: the window's mean radius
:math:`R(X)=(\frac1n\sum_i\|x_i\|^2)^{1/2}` (the RMS token norm the paper plotted; docs/experiments.md,
"Protocols and defects"); y (log): the true :math:`\|Df(X)\|_2` (circles) and the released metric
:math:`\sqrt{\|J^\top f\|}` (triangles, D1); points coloured by n (``viridis``, as the released
radius plots; the legend shows the markers in grey, the colour bar the colours). Legends name the model actually measured. Reads saved results only.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

from ._style import figure_main, save, style
from .fig_f1_lipschitz_vs_n import (
    log_axes,
    panel_grid,
    panel_legend,
    panel_title,
    panel_ylabel,
    sweeps_or_raise,
)

__all__ = ["STEM", "draw", "main"]

STEM = "fig_f2_lipschitz_vs_radius"


def draw(results_dir: Path, out_dir: Path) -> list[Path]:
    """Draw ``fig_f2_lipschitz_vs_radius.{pdf,png}`` (one panel per sweep) into ``out_dir``; return the two paths.

    The results are read from ``results_dir/real_data/`` (see :func:`sweeps_or_raise`).
    """
    from matplotlib.colors import Normalize
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    # The points are coloured by n (colour bar); the legend shows each series' marker in grey.
    proxies = [
        Line2D([], [], ls="none", marker="o", ms=3.5, color="0.45", label=r"$\|J\|_2$ (true)"),
        Line2D(
            [],
            [],
            ls="none",
            marker="^",
            ms=3.5,
            color="0.45",
            label=r"released $\sqrt{\|J^\top f\|}$ (D1)",
        ),
    ]
    sweeps = sweeps_or_raise(results_dir)
    n_max = max(float(np.max(s["arrays"]["n"])) for s in sweeps)
    norm = Normalize(0.0, n_max)
    with style():
        fig, axes = panel_grid(len(sweeps))
        sc = None
        for ax, s in zip(axes, sweeps):
            a = s["arrays"]
            R = a["mean_radius"]
            sc = [
                ax.scatter(
                    R,
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
            ax.xaxis.set_major_locator(MaxNLocator(3))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.6g}"))
            ax.set_xlabel("mean radius $R(X)$")
            panel_ylabel(ax, "local Lipschitz constant")
            ax.set_title(panel_title(s), fontsize=6.5, loc="left")
            panel_legend(ax, handles=proxies)
        fig.colorbar(sc, ax=axes, shrink=0.5, label="sequence length $n$")
        return save(fig, Path(out_dir) / STEM)


#: The command line ``python -m paper_figs.fig_f2_lipschitz_vs_radius --results DIR --out DIR``:
#: :func:`._style.figure_main` with this figure's ``draw``.
main = partial(figure_main, draw, __doc__)


if __name__ == "__main__":
    main()
