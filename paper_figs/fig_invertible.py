r"""Figure I: inverting residual attention blocks by fixed-point iteration, L2 against dot product.

Left and middle: the relative residual :math:`\|x_k+g(x_k)-y\|/\max(1,\|y\|)` of the iteration
:math:`x_{k+1}=y-g(x_k)` against :math:`k` (log y), with the certified rate :math:`c^k` on the left, one colour per radius :math:`R` of the input,
for the L2 block (certified contraction, docs/derivations/invertible.md §2–§3) and the
dot-product block (certified only on a ball, §4); every seed's head is drawn, solid when the
inversion recovered :math:`x^*`, dashed for a wrong preimage, dotted without convergence. Right: the local constant :math:`\|Dg(x^*)\|_2` at the input against :math:`R`,
with the certified :math:`c` and the level 1; markers show the outcome of each inversion.

Reads ``<results>/invertible/invertible.{npz,json}`` written by :func:`experiments.invertible.run`;
no computation.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

from experiments.invertible import MAPS, OUTCOMES, load

from ._style import TWO_COLUMNS, figure_main, legend_below, save, style

__all__ = ["STEM", "draw", "main"]

STEM = "fig_invertible"

#: Residuals are floored here on the log axis (a converged run stops at its tolerance).
_FLOOR = 1e-17
_TITLES = {"L2": "L2 attention", "DP": "dot-product attention"}
_MARKERS = {"recovered": "o", "wrong preimage": "x", "no convergence": "s"}
_LINESTYLES = {"recovered": "-", "wrong preimage": "--", "no convergence": ":"}


def draw(results_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """Draw ``fig_invertible.{pdf,png}`` into ``out_dir`` from the saved results."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    d, _ = load(results_dir)
    radii = d["radii"]
    n_seeds = d["seeds"].shape[0]
    c = float(d["target"])
    cmap = plt.get_cmap("viridis")
    norm = LogNorm(vmin=radii.min(), vmax=radii.max() * 1.25) if radii.size > 1 else None

    def color(R: float):
        return cmap(0.4) if norm is None else cmap(norm(R))

    with style():
        fig, axes = plt.subplots(1, 3, figsize=(TWO_COLUMNS, 0.36 * TWO_COLUMNS + 0.5))
        top = 1.0
        for ax, m in zip(axes[:2], MAPS):
            res = d[f"{m}_residuals"] / np.maximum(1.0, d[f"{m}_y_norm"])[..., None]
            top = max(top, float(np.nanmax(res)))
            oc = d[f"{m}_outcome"]
            for s in range(n_seeds):
                for i, R in enumerate(radii):
                    r = res[s, i]
                    r = r[np.isfinite(r)]
                    ax.plot(
                        np.arange(r.size),
                        np.maximum(r, _FLOOR),
                        color=color(R),
                        ls=_LINESTYLES[OUTCOMES[int(oc[s, i])]],
                        lw=0.8,
                        alpha=0.85,
                    )
            ax.axhline(float(d["tol"]), color="k", ls=":", lw=0.8)
            ax.set_yscale("log")
            done = [
                int(np.isfinite(res[s, i]).sum())
                for s in range(n_seeds)
                for i in range(radii.size)
                if OUTCOMES[int(oc[s, i])] != "no convergence"
            ]
            ax.set_xlim(0, max(10, int(1.1 * max(done, default=res.shape[-1]))))
            ax.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))
            ax.set_xlabel("iteration $k$")
            ax.set_title(_TITLES[m], loc="left")
        for ax in axes[:2]:
            ax.set_ylim(_FLOOR / 2, top * 3)
        # the certified rate: r_k <= c^k r_0 (Banach), from the largest first residual of L2
        r0 = np.nanmax((d["L2_residuals"] / np.maximum(1.0, d["L2_y_norm"])[..., None])[..., 0])
        k = np.arange(0, int(axes[0].get_xlim()[1]) + 1)
        axes[0].plot(k, r0 * c**k, color="#2c7d3f", ls="--", lw=0.9)
        axes[0].set_ylabel("$\\|x_k+g(x_k)-y\\|\\,/\\max(1,\\|y\\|)$")
        ax = axes[2]
        for m, col, ls in (("L2", "#1f4e9c", "-"), ("DP", "#c0392b", "-")):
            L = d[f"{m}_local_lipschitz"]
            oc = d[f"{m}_outcome"]
            for s in range(n_seeds):
                ax.plot(radii, L[s], color=col, ls=ls, lw=0.7, alpha=0.6)
                for j, o in enumerate(OUTCOMES):
                    sel = oc[s] == j
                    if sel.any():
                        ax.scatter(
                            radii[sel],
                            L[s][sel],
                            marker=_MARKERS[o],
                            s=10,
                            **(
                                {"c": col}
                                if o == "wrong preimage"
                                else {"facecolors": "none", "edgecolors": col}
                            ),
                            linewidths=0.7,
                            zorder=3,
                        )
        ax.axhline(c, color="#2c7d3f", ls="--", lw=0.9)
        ax.axhline(1.0, color="0.55", ls="-", lw=0.8)
        ax.axvline(float(d["ref_radius"]), color="0.5", ls="-.", lw=0.7)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("radius $R$ of $x^*$")
        ax.set_ylabel("$\\|Dg(x^*)\\|_2$")
        ax.set_title("local constant at $x^*$", loc="left")
        if norm is not None:
            sm = plt.cm.ScalarMappable(norm=norm, cmap=cmap)
            cb = fig.colorbar(sm, ax=axes[:2], location="right", pad=0.01, aspect=30)
            cb.ax.set_title("$R$", fontsize=7.5)
        certified = f"certified $c = {c:g}$ (left: rate $c^k$)"
        handles = [
            Line2D([], [], color="k", ls=":", lw=0.8, label="tolerance"),
            Line2D([], [], color="0.3", ls="--", lw=0.8, label="residual, wrong preimage"),
            Line2D([], [], color="0.3", ls=":", lw=0.8, label="residual, no convergence"),
            Line2D([], [], color="#1f4e9c", lw=1.0, label="L2"),
            Line2D([], [], color="#c0392b", lw=1.0, label="dot product"),
            Line2D([], [], color="#2c7d3f", ls="--", lw=0.9, label=certified),
            Line2D([], [], color="0.55", ls="-", lw=0.8, label="$\\|Dg\\|_2 = 1$"),
            Line2D([], [], color="0.5", ls="-.", lw=0.7, label="radius of the DP certificate"),
        ] + [
            Line2D(
                [],
                [],
                color="0.3",
                marker=_MARKERS[o],
                ls="none",
                markerfacecolor="0.3" if o == "wrong preimage" else "none",
                markersize=4,
                label=o,
            )
            for o in OUTCOMES
        ]
        legend_below(fig, handles=handles, ncol=4, fontsize=7)
        return save(fig, Path(out_dir) / STEM)


#: The command line ``python -m paper_figs.fig_invertible --results DIR --out DIR``:
#: :func:`._style.figure_main` with this figure's ``draw``.
main = partial(figure_main, draw, __doc__)


if __name__ == "__main__":
    main()
