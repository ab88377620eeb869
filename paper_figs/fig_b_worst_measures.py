r"""Figure B: atoms of worst-case measures for several radii (d = 1 on a line, d = 2 in the plane).

Reads ``worst_measures.npz`` and ``worst_measures.json`` written by
``meanfield attack search --figure-b`` (:func:`experiments.mass_splitting.figure_b_results`). Every
mass is written beside its atom (:func:`mass_label`: ``0.84``, or ``2e-17`` below 0.01) and is also
the marker colour, on one log scale whose colour bar, beside the first row, is labelled in masses.
In the d = 1 row each measure owns a band around its row line (shaded every other row); atoms
closer than :data:`CLUSTER` are spread above and below the line, each joined to it by a stem at its
exact position. In the d = 2 panels the masses of such atoms are listed together (``a & b``). A
note under the figure (:func:`mass_note`) says how masses are written and why tiny ones matter:
they are optimised as logarithms, so they are exact, and an atom's attention weight is its mass
times :math:`e^{x^\top Ay}`, up to :math:`e^{\|A\|R^2}`. No computation here (docs/theory.md §A4;
docs/experiments.md, "Stages and figures").
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from experiments.engine import load_json, load_npz

from ._style import TWO_COLUMNS, attack_figure_main, attack_paths, save, style

__all__ = ["draw"]

STEM = "fig_b_worst_measures"


#: Atoms closer than this (in x/R) count as one cluster: in the d = 1 row they are drawn above and
#: below their row line, each joined to it by a stem at its exact position; in the d = 2 panels
#: their masses are listed together (the atoms themselves overlap).
CLUSTER = 0.04

#: Half the height (in row units) over which the atoms of one cluster are spread in the d = 1 row;
#: each row owns the band of height 1 around its line.
SPREAD = 0.28


def _clusters(P: np.ndarray) -> list[list[int]]:
    """Indices of the atoms of ``P`` (shape ``(k, d)``, in x/R) grouped by :data:`CLUSTER`.

    Two atoms closer than :data:`CLUSTER` share a cluster (single linkage); clusters come in the
    order of their first atom, their atoms in order of position along the first coordinate.
    """
    k = len(P)
    parent = list(range(k))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for i in range(k):
        for j in range(i + 1, k):
            if np.linalg.norm(P[i] - P[j]) < CLUSTER:
                parent[root(j)] = root(i)
    groups: dict[int, list[int]] = {}
    for i in range(k):
        groups.setdefault(root(i), []).append(i)
    return [sorted(g, key=lambda i: (P[i, 0], i)) for g in groups.values()]


def _stagger(x: np.ndarray) -> np.ndarray:
    """Vertical offsets (in row units, within ±:data:`SPREAD`) that separate clustered atoms."""
    off = np.zeros(x.shape)
    for g in _clusters(np.asarray(x, dtype=float).reshape(-1, 1)):
        if len(g) > 1:
            off[g] = np.linspace(SPREAD, -SPREAD, len(g))
    return off


def mass_label(log_mass: float) -> str:
    """A mass, given by its natural logarithm, in plain notation: ``0.84``, ``4e-4``, ``2e-17``.

    Parameters
    ----------
    log_mass : float
        Natural logarithm of the mass (the masses are stored as logarithms, so masses far below
        the float64 resolution of 1 are exact).

    Returns
    -------
    str
        Two decimals from 0.01 up, else one significant digit times a power of ten, written
        ``"2e-17"`` (no padded exponent, no fractional power of ten).
    """
    log10_mass = log_mass / math.log(10.0)
    if log10_mass >= -2.0:
        return f"{10.0**log10_mass:.2f}"
    return _one_digit(log10_mass)


def _one_digit(log10_v: float) -> str:
    """The number whose log10 is ``log10_v`` to one significant digit: ``"2e-17"``, ``"4e15"``."""
    exponent = math.floor(log10_v)
    digit = round(10.0 ** (log10_v - exponent))
    if digit == 10:  # 9.6e-5 rounds to 1e-4
        digit, exponent = 1, exponent + 1
    return f"{digit}e{exponent}"


def _mass_tick(v: float, _pos: object) -> str:
    """Colour-bar labels: the mass whose log10 is ``v`` (``1``, ``1e-5``, ``1e-10``)."""
    return "1" if round(v) == 0 else f"1e{int(round(v))}"


def _decade_ticks(vmin: float) -> np.ndarray:
    """At most six whole decades from 0 down to ``vmin`` (the colour bar's ticks)."""
    span = max(1, math.floor(-vmin))
    step = next(s for s in (1, 2, 5, 10, 20, 50, 100, 200, 500) if span / s <= 5)
    return -np.arange(0, span + 1, step, dtype=float)


def mass_note(meta: dict, radii: np.ndarray) -> str:
    r"""The note under the figure: how masses are written, and why tiny masses matter.

    Parameters
    ----------
    meta : dict
        ``worst_measures.json``; its ``settings["d1"]["A"]``, when present, gives
        :math:`\|A\|_2` for the size of :math:`e^{\|A\|R^2}` at the largest radius.
    radii : ndarray
        The radii of the figure.

    Returns
    -------
    str
        Two or three lines.
    """
    note = (
        "Masses are written beside the atoms, below 0.01 as 2e-17 (= 2 × $10^{-17}$); in d = 2, "
        f"“a & b” are the masses of atoms\nless than {CLUSTER:g}R apart, drawn over each other. "
        "Masses are optimised as logarithms, so tiny masses are exact, not rounding noise,\n"
        "and they matter: seen from $x$, an atom at $y$ has attention weight ∝ mass × "
        "$\\exp(x^\\top Ay)$"
    )
    A = meta.get("settings", {}).get("d1", {}).get("A")
    if A is None or len(radii) == 0:
        return note + "."
    R = float(np.max(radii))
    theta = float(np.linalg.norm(np.asarray(A, dtype=float), 2)) * R**2
    size = f"{math.exp(theta):.3g}" if theta < math.log(1e4) else _one_digit(theta / math.log(10))
    return note + f", and $\\exp(\\|A\\|R^2)$ = {size} at $R$ = {R:g} in the d = 1 row."


def _atoms(ax, x, y, c, cmap, norm):
    """The atoms of a measure, coloured by log-mass on the shared scale."""
    return ax.scatter(
        x, y, c=c, cmap=cmap, norm=norm, s=30, edgecolors="k", linewidths=0.4, zorder=3
    )


def _d2_mass_labels(ax, P: np.ndarray, log_w: np.ndarray) -> None:
    """The masses of a d = 2 measure beside its atoms, one label per cluster, towards the centre."""
    for g in _clusters(P):
        g = sorted(g, key=lambda i: -log_w[i])
        text = " & ".join(mass_label(log_w[i]) for i in g)  # "a & b": see :func:`mass_note`
        px, py = P[g].mean(axis=0)
        r = math.hypot(px, py)
        ux, uy = (px / r, py / r) if r > 1e-9 else (1.0, 0.0)
        ax.annotate(
            text,
            (px, py),
            xytext=(-7 * ux, -7 * uy),
            textcoords="offset points",
            ha="right" if ux > 0.3 else "left" if ux < -0.3 else "center",
            va="top" if uy > 0.3 else "bottom" if uy < -0.3 else "center",
            fontsize=6.5,
        )


def draw(results_path: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Draw ``fig_b_worst_measures.{pdf,png}`` from a saved results file (or its directory).

    Parameters
    ----------
    results_path : path
        ``worst_measures.npz`` or its directory (``worst_measures.json`` beside it).
    out_dir : path, optional
        Output directory; by default the directory of the results.

    Returns
    -------
    list of Path
        The PDF and PNG files.
    """
    import matplotlib.pyplot as plt
    from matplotlib.colors import Normalize
    from matplotlib.ticker import FixedLocator, FuncFormatter

    npz, out_dir = attack_paths(results_path, "worst_measures.npz", out_dir)
    data = load_npz(npz)
    meta = load_json(npz.with_suffix(".json"))
    radii = data["radii"]
    nR = len(radii)
    lw_all = np.concatenate([data[k].ravel() for k in data if k.endswith("_log_weights")])
    log10 = lw_all / math.log(10.0)
    norm = Normalize(vmin=min(float(log10[np.isfinite(log10)].min()), -1.0), vmax=0.0)
    cmap = "viridis"
    labels = {k: v["label"] for k, v in meta.get("settings", {}).items()}

    with style():
        fig = plt.figure(figsize=(TWO_COLUMNS, 0.8 * TWO_COLUMNS))
        (top,), (bottom,) = fig.subfigures(2, 1, squeeze=False, height_ratios=[1.2, 1.0])
        sc = None
        ax_top = None
        if "d1_points" in data:
            ax = ax_top = top.subplots()
            ax.grid(False, axis="y")
            for r_i, R in enumerate(radii):
                x = data["d1_points"][r_i, :, 0] / R
                lw = data["d1_log_weights"][r_i]
                c = lw / math.log(10.0)
                off = _stagger(x)
                y = r_i + off
                # each row owns the band of height 1 around its line (shaded every other row)
                if r_i % 2 == 0:
                    ax.axhspan(r_i - 0.5, r_i + 0.5, color="0.94", lw=0, zorder=0)
                ax.axhline(r_i, color="0.6", lw=0.6, zorder=1)
                for xi, oi in zip(x, off):
                    if oi != 0.0:  # a clustered atom: a stem to its row line at its position
                        ax.plot([xi, xi], [r_i, r_i + oi], color="0.35", lw=0.6, zorder=2)
                order = np.argsort(-c)  # light atoms drawn on top
                sc = _atoms(ax, x[order], y[order], c[order], cmap, norm)
                for xi, yi, li in zip(x, y, lw):
                    ax.annotate(
                        mass_label(li),
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
            ax.set_ylim(-0.5, nR - 0.5)
            ax.set_xlabel(
                "atom position $x/R$; each row is one measure, its mass beside each atom"
                "\n(atoms closer than "
                f"{CLUSTER:g}R are drawn above and below the row line, stems mark their positions)"
            )
            ax.set_title(f"worst-case measures, {labels.get('d1', 'd = 1')}", loc="left")
        if "d2_points" in data:
            theta = np.linspace(0, 2 * np.pi, 200)
            axes = np.atleast_1d(bottom.subplots(1, max(nR, 1)))
            for r_i, R in enumerate(radii):
                ax = axes[r_i]
                P = data["d2_points"][r_i] / R
                lw = data["d2_log_weights"][r_i]
                c = lw / math.log(10.0)
                order = np.argsort(-c)
                ax.plot(np.cos(theta), np.sin(theta), color="0.6", lw=0.6)
                sc = _atoms(ax, P[order, 0], P[order, 1], c[order], cmap, norm)
                _d2_mass_labels(ax, P, lw)
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
            cb = (top if ax_top is not None else bottom).colorbar(
                sc, ax=host, shrink=0.95, label="atom mass (colour, both rows)"
            )
            vmin = float(norm.vmin if norm.vmin is not None else 0.0)
            cb.ax.yaxis.set_major_locator(FixedLocator(_decade_ticks(vmin).tolist()))
            cb.ax.yaxis.set_major_formatter(FuncFormatter(_mass_tick))
            cb.ax.minorticks_off()
        fig.supxlabel(
            mass_note(meta, radii), fontsize=6.5, x=0.01, ha="left", multialignment="left"
        )
        return save(fig, out_dir / STEM)


if __name__ == "__main__":
    attack_figure_main(draw, __doc__, "worst_measures.npz")
