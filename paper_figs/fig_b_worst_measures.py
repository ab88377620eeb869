"""Figure B: atoms of worst-case measures for several radii (d = 1 on a line, d = 2 in the plane).

Reads ``worst_measures.npz`` and ``worst_measures.json`` written by
``meanfield attack search --figure-b`` (:func:`experiments.mass_splitting.figure_b_results`); marker
colour is log10 of the mass, so masses spread over many decades show as a colour range; in the
d = 1 row every mass is also written beside its atom, and atoms closer than :data:`CLUSTER` are
staggered vertically so that none hides another. One colour bar, beside the first row. No
computation here (docs/theory.md §A4; docs/experiments.md, "Stages and figures").
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from experiments.results import load_json, load_npz

from ._style import TWO_COLUMNS, attack_figure_main, save, style

__all__ = ["draw"]

STEM = "fig_b_worst_measures"


def _paths(results_path: str | Path) -> tuple[Path, Path]:
    p = Path(results_path)
    if p.is_dir():
        p = p / "worst_measures.npz"
    return p.with_suffix(".npz"), p.with_suffix(".json")


#: Atoms of one row closer than this (in x/R) are staggered vertically so that each shows.
CLUSTER = 0.04


def _stagger(x: np.ndarray) -> np.ndarray:
    """Vertical offsets (in row units) that separate atoms closer than :data:`CLUSTER`."""
    off = np.zeros(x.shape)
    order = np.argsort(x)
    groups: list[list[int]] = []
    for i in order:
        if groups and x[i] - x[groups[-1][-1]] < CLUSTER:
            groups[-1].append(int(i))
        else:
            groups.append([int(i)])
    for g in groups:
        if len(g) > 1:
            off[g] = np.linspace(-0.3, 0.3, len(g))
    return off


def _mass_label(log10_mass: float) -> str:
    """A mass written as a power of ten when small, as a decimal otherwise."""
    if log10_mass > -2:
        return f"{10.0**log10_mass:.2f}"
    return f"$10^{{{log10_mass:.1f}}}$"


def _atoms(ax, x, y, c, cmap, norm):
    """The atoms of a measure, coloured by log-mass on the shared scale."""
    return ax.scatter(
        x, y, c=c, cmap=cmap, norm=norm, s=30, edgecolors="k", linewidths=0.4, zorder=3
    )


def draw(results_path: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Draw ``fig_b_worst_measures.{pdf,png}`` from a saved results file (or its directory)."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import Normalize

    npz, js = _paths(results_path)
    data = load_npz(npz)
    meta = load_json(js)
    out_dir = npz.parent if out_dir is None else Path(out_dir)
    radii = data["radii"]
    nR = len(radii)
    lw_all = np.concatenate([data[k].ravel() for k in data if k.endswith("_log_weights")])
    log10 = lw_all / math.log(10.0)
    norm = Normalize(vmin=min(float(log10[np.isfinite(log10)].min()), -1.0), vmax=0.0)
    cmap = "viridis"
    labels = {k: v["label"] for k, v in meta.get("settings", {}).items()}

    with style():
        fig = plt.figure(figsize=(TWO_COLUMNS, 0.72 * TWO_COLUMNS))
        top, bottom = fig.subfigures(2, 1, height_ratios=[1.15, 1.0])
        sc = None
        ax_top = None
        if "d1_points" in data:
            ax = ax_top = top.subplots()
            for r_i, R in enumerate(radii):
                x = data["d1_points"][r_i, :, 0] / R
                c = data["d1_log_weights"][r_i] / math.log(10.0)
                y = r_i + _stagger(x)
                order = np.argsort(-c)  # light atoms drawn on top
                ax.axhline(r_i, color="0.85", lw=0.6, zorder=0)
                sc = _atoms(ax, x[order], y[order], c[order], cmap, norm)
                for xi, yi, ci in zip(x, y, c):
                    ax.annotate(
                        _mass_label(ci),
                        (xi, yi),
                        xytext=(-5, 0) if xi > 0 else (5, 0),  # inward, clear of the ticks
                        textcoords="offset points",
                        ha="right" if xi > 0 else "left",
                        va="center",
                        fontsize=6.5,
                    )
                val = data["d1_value"][r_i]
                td = data["d1_two_dirac"][r_i]
                ax.annotate(
                    f"$L$ = {val:.3g}\n(two-Dirac {td:.3g})",
                    (1.03, r_i),
                    xycoords=("axes fraction", "data"),
                    va="center",
                    fontsize=6.5,
                    annotation_clip=False,
                )
            ax.set_yticks(range(nR), [f"R = {R:g}" for R in radii])
            ax.set_xlim(-1.08, 1.08)
            ax.set_ylim(-0.6, nR - 0.4)
            ax.set_xlabel("atom position $x/R$ (masses written beside the atoms)")
            ax.set_title(f"worst-case measures, {labels.get('d1', 'd = 1')}", loc="left")
        if "d2_points" in data:
            theta = np.linspace(0, 2 * np.pi, 200)
            axes = np.atleast_1d(bottom.subplots(1, max(nR, 1)))
            for r_i, R in enumerate(radii):
                ax = axes[r_i]
                P = data["d2_points"][r_i] / R
                c = data["d2_log_weights"][r_i] / math.log(10.0)
                order = np.argsort(-c)
                ax.plot(np.cos(theta), np.sin(theta), color="0.6", lw=0.6)
                sc = _atoms(ax, P[order, 0], P[order, 1], c[order], cmap, norm)
                ax.set_aspect("equal", adjustable="box")
                ax.set_xlim(-1.15, 1.15)
                ax.set_ylim(-1.15, 1.15)
                ax.set_xticks([-1, 0, 1])
                ax.set_yticks([-1, 0, 1])
                ax.set_title(f"R = {R:g}, $L$ = {data['d2_value'][r_i]:.3g}", fontsize=7.5)
                ax.set_xlabel("$x_1/R$")
                if r_i == 0:
                    ax.set_ylabel("$x_2/R$")
            bottom.suptitle(
                f"worst-case measures, {labels.get('d2', 'd = 2')}", x=0.01, ha="left", fontsize=9
            )
        if sc is not None:
            # one colour scale for both rows, drawn beside the first row only
            host = ax_top if ax_top is not None else bottom.axes
            (top if ax_top is not None else bottom).colorbar(
                sc, ax=host, shrink=0.95, label=r"$\log_{10}$ mass (both rows)"
            )
        return save(fig, out_dir / STEM)


if __name__ == "__main__":
    attack_figure_main(draw, __doc__, "worst_measures.npz")
