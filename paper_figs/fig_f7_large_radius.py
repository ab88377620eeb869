r"""Figure F7: the large-radius regime (docs/theory.md §7).

For a few random inputs :math:`X` (rows scaled to :math:`\max_i\|x_i\| = 1`) and one random head,
:math:`\|Df(RX)\|_2` against :math:`R` (log x), unmasked and masked: each curve converges to its
horizontal line :math:`\|V\|_2\sqrt{\max_jN_j}` (docs/theory.md §7; :math:`N_j` counts the queries whose
arg-max key is :math:`j`), below the reference :math:`\sqrt n\,\|V\|_2`. Right: the relative
distance to the limit with our deviation bound (``theory.bounds.large_radius_deviation``) dashed.

Reads ``<results>/synthetic/f7.npz`` written by :func:`experiments.synthetic.run`; no computation.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

from experiments.engine import load_npz, stage_result

from ._style import TWO_COLUMNS, figure_main, legend_below, save, style

__all__ = ["STEM", "draw", "main"]

STEM = "fig_f7_large_radius"

#: Relative errors are floored here on the log axis (float64 round-off of the dense SVD).
_FLOOR = 1e-16


def draw(results_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """Draw ``fig_f7_large_radius.{pdf,png}`` into ``out_dir`` from the saved F7 results."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    d = load_npz(stage_result(results_dir, "synthetic", "f7.npz"))
    R = d["R"]
    n_in = d["unmasked_value"].shape[0]
    colors = plt.get_cmap("tab10")(np.arange(n_in) % 10)
    n = int(d["n"])
    with style():
        fig, axes = plt.subplots(1, 3, figsize=(TWO_COLUMNS, 0.36 * TWO_COLUMNS + 0.45))
        for ax, tag in zip(axes, ("unmasked", "masked")):
            for k in range(n_in):
                ax.plot(R, d[f"{tag}_value"][k], color=colors[k], lw=1.0)
                ax.axhline(d[f"{tag}_limit"][k], color=colors[k], ls="--", lw=0.7)
            ax.axhline(d["sqrt_n_ref"], color="k", ls=":", lw=0.9)
            ax.set_xlabel("radius $R$ ($\\max_i\\|Rx_i\\| = R$)")
            ax.set_title(tag, loc="left")
        axes[0].set_ylabel("$\\|Df(RX)\\|_2$ (certified, dense)")
        ax = axes[2]
        for tag, ls in (("unmasked", "-"), ("masked", "-.")):
            lim = d[f"{tag}_limit"][:, None]
            err = np.abs(d[f"{tag}_value"] - lim) / lim
            dev = d[f"{tag}_deviation_bound"] / lim
            for k in range(n_in):
                ax.plot(R, np.maximum(err[k], _FLOOR), color=colors[k], ls=ls, lw=0.9)
                if tag == "unmasked":
                    ax.plot(R, np.maximum(dev[k], _FLOOR), color=colors[k], ls=":", lw=0.8)
        for panel in axes:
            panel.set_xscale("log")
            panel.set_yscale("log")
            panel.set_xlim(R.min(), R.max())
        ax.set_ylim(_FLOOR / 2, 1e3)  # the deviation bound is loose at small R
        ax.set_xlabel("radius $R$")
        ax.set_ylabel("relative distance to the limit")
        ax.set_title("convergence", loc="left")
        reference = f"reference $\\sqrt{{n}}\\,\\|V\\|_2$ ($n = {n}$)"
        handles = [
            Line2D(
                [], [], color="0.3", lw=1.0, label="measured $\\|Df(RX)\\|_2$, one colour per $X$"
            ),
            Line2D(
                [], [], color="0.3", ls="--", lw=0.7, label="limit $\\|V\\|_2\\sqrt{\\max_j N_j}$ "
            ),
            Line2D([], [], color="k", ls=":", lw=0.9, label=reference),
            Line2D([], [], color="0.3", ls="-.", lw=0.9, label="masked, relative distance"),
            Line2D(
                [], [], color="0.3", ls=":", lw=0.8, label="deviation bound (ours; unmasked inputs)"
            ),
        ]
        legend_below(fig, handles=handles, ncol=3, fontsize=6.5)
        return save(fig, Path(out_dir) / STEM)


#: The command line ``python -m paper_figs.fig_f7_large_radius --results DIR --out DIR``:
#: :func:`._style.figure_main` with this figure's ``draw``.
main = partial(figure_main, draw, __doc__)


if __name__ == "__main__":
    main()
