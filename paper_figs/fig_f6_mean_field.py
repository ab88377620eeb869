r"""Figure F6: the mean-field constant against the radius (docs/experiments.md, "Stages and figures"; docs/theory.md §5–§6).

Head :math:`d = 2`, :math:`A = \mathrm{diag}(1, -0.3)`, :math:`V = I`. Left (log y):
:math:`\sup_\varepsilon g` of the two unbalanced Diracs (§5) at the best gap, the :math:`w = 1/2`
form, the asymptote :math:`\frac{3\sqrt3}{16}\gamma e^{\gamma/2}`, the trivial :math:`\|V\|_2`, the
upper bounds :math:`c' = 1` (proved, §17) and :math:`c' = 2` (§6; our constants, not the paper's), the
values reached by the multi-start search over 2–5 weighted atoms (§A4) and the maximised off-axis
two-atom bound (§A3). The radius axis is logarithmic, like the measured radii. The left axis is
clipped to the data (the upper bounds grow like :math:`e^{cR^2}` and leave it; a note says where).
The markers of the 2–5-atom searches are dodged sideways (:func:`dodge_step`), since their values
nearly coincide: dotted vertical lines mark the radii actually measured (the off-axis × sit on
them) and a note under the legend (:func:`dodge_note`) says so. Right: the same values divided by
:math:`\sup_\varepsilon g`.

Reads ``<results>/synthetic/f6.npz`` written by :func:`experiments.synthetic.run`; no computation.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

from experiments.engine import load_npz, stage_result

from ._style import PALETTE, TWO_COLUMNS, atom_markers, figure_main, legend_below, save, style

__all__ = ["STEM", "draw", "main"]

STEM = "fig_f6_mean_field"

#: Largest sideways offset between the markers of successive atom counts, in :math:`\ln R` (the
#: radius axis is logarithmic); :func:`dodge_step` shrinks it where the measured radii are closer.
DODGE = 0.09


def dodge_step(radii: np.ndarray, n_series: int) -> float:
    r"""Offset in :math:`\ln R` between the markers of successive atom counts at one radius.

    Parameters
    ----------
    radii : ndarray
        The measured radii, increasing.
    n_series : int
        Number of marker series dodged around each radius.

    Returns
    -------
    float
        :data:`DODGE`, or less where needed so that the markers of one radius stay within 70 % of
        the gap to the next radius on each side: groups of neighbouring radii never interleave.
    """
    gaps = np.diff(np.log(np.asarray(radii, dtype=float)))
    if n_series < 2 or gaps.size == 0:
        return DODGE
    return float(min(DODGE, 0.7 * float(gaps.min()) / n_series))


def dodge_note(radii: np.ndarray) -> str:
    """The note under the legend that says where the measured markers really are.

    Parameters
    ----------
    radii : ndarray
        The radii at which the measures were optimized (``f6.npz["radii"]``).

    Returns
    -------
    str
        Two lines: the radii (listed up to six, else their number and range; drawn as dotted
        vertical lines, with the x markers on them) and that the 2–5-atom markers are offset
        sideways (:func:`dodge_step`).
    """
    if len(radii) <= 6:
        where = "$R$ = " + ", ".join(f"{r:.3g}" for r in radii) + " only"
    else:
        where = f"{len(radii)} radii from {min(radii):.3g} to {max(radii):.3g} only"
    return (
        f"measured at {where} (dotted vertical lines; the × markers sit on them);\n"
        "the markers of 2–5 atoms at one $R$ are offset sideways around its line for legibility"
    )


def _tick(v: float, _pos: object) -> str:
    """Plain tick labels (0.2, 5, 100) up to 10^4, powers of ten beyond."""
    if 1e-3 <= v < 1e4:
        return f"{v:g}"
    return f"$10^{{{int(round(np.log10(v)))}}}$"


def draw(results_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """Draw ``fig_f6_mean_field.{pdf,png}`` into ``out_dir`` from the saved F6 results."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    d = load_npz(stage_result(results_dir, "synthetic", "f6.npz"))
    Rc, radii, atoms = d["curve_R"], d["radii"], d["atoms"]
    sup_c, sup_r = d["curve_sup_g"], d["at_radii_sup_g"]
    with style():
        fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(TWO_COLUMNS, 0.45 * TWO_COLUMNS + 0.5))
        curves = [
            (
                "curve_sup_g",
                "k",
                "-",
                1.3,
                r"two-Dirac optimum $\mathrm{sup}_\varepsilon\,g$ (lower bound)",
            ),
            ("curve_half", "k", "--", 0.8, r"two Diracs at $w = 1/2$ (lower bound)"),
            (
                "curve_asymptote",
                "k",
                ":",
                0.9,
                r"asymptote $\frac{3\sqrt{3}}{16}\gamma e^{\gamma/2}$ (lower bound)",
            ),
            ("curve_trivial", "0.5", "-", 0.8, r"trivial lower bound $\|V\|_2$"),
            ("curve_upper_c1", PALETTE["bound"], "-.", 1.0, r"upper bound $c'=1$ (proved, ours)"),
            (
                "curve_upper_c2",
                "#8aa61c",
                (0, (5, 2, 1, 2, 1, 2)),
                1.0,
                r"upper bound $c'=2$ (ours)",
            ),
        ]
        for key, c, ls, lw, label in curves:
            ax0.plot(Rc, d[key], color=c, ls=ls, lw=lw, label=label)
            ax1.plot(Rc, d[key] / sup_c, color=c, ls=ls, lw=lw)
        # the 2–5-atom values nearly coincide: dodge them sideways (by a factor, the radius axis
        # is logarithmic) so that each marker shows; a note under the legend says so
        dodge = dodge_step(radii, len(atoms)) * (np.arange(len(atoms)) - (len(atoms) - 1) / 2.0)
        for i, (k, kw) in enumerate(zip(atoms, atom_markers(len(atoms)), strict=True)):
            x = radii * np.exp(dodge[i])
            ax0.plot(x, d["opt_value"][i], label=f"optimized measure, {k} atoms (measured)", **kw)
            ax1.plot(x, d["opt_value"][i] / sup_r, **kw)
        kw = dict(ls="none", marker="x", ms=4.5, color=PALETTE["masked"], mew=0.9)
        ax0.plot(
            radii, d["off_axis_value"], label="off-axis two atoms, maximised (lower bound)", **kw
        )
        ax1.plot(radii, d["off_axis_value"] / sup_r, **kw)
        for ax in (ax0, ax1):
            # the measured radii, where the x markers sit and around which the others are dodged
            for r in radii:
                ax.axvline(r, color="0.55", lw=0.6, ls=":", zorder=0)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("radius $R$")
            pad = np.exp(float(np.abs(dodge).max()) + 0.03)
            ax.set_xlim(Rc.min() / pad, Rc.max() * pad)
            ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(FuncFormatter(_tick))
            ax.xaxis.set_minor_formatter(NullFormatter())
        measured = np.concatenate(
            [d["opt_value"].ravel() / np.tile(sup_r, len(atoms)), d["off_axis_value"] / sup_r]
        )
        low = min(float(d["curve_trivial"].min()), float(np.nanmin(d["opt_value"])))
        top = max(float(np.nanmax(d["opt_value"])), float(sup_c.max()))
        # clipped to the data: the upper bounds grow like exp(c R^2) and would squash
        # the measured values (a note on the panel says where they leave it)
        ax0.set_ylim(low / 3.0, 100.0 * top)
        ax1.set_ylim(0.2, max(3.0, 3.0 * float(np.nanmax(measured))))  # zoom: bounds leave it
        for ax in (ax0, ax1):
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0), numticks=12))
            ax.yaxis.set_major_formatter(FuncFormatter(_tick))
            ax.yaxis.set_minor_formatter(NullFormatter())
        ax0.yaxis.set_major_locator(LogLocator(base=10, numticks=6))
        leaves = [
            f"$c'={c}$ at $R\\approx{float(Rc[np.argmax(d[key] > 100.0 * top)]):.2g}$"
            for c, key in (("1", "curve_upper_c1"), ("2", "curve_upper_c2"))
            if np.any(d[key] > 100.0 * top)
        ]
        if leaves:
            ax0.text(
                0.03,
                0.97,
                "bounds leave the axis:\n" + ", ".join(leaves),
                transform=ax0.transAxes,
                va="top",
                fontsize=6.5,
            )
        ax0.set_ylabel(r"$\mathrm{Lip}_{W_2}(F\,|\,\mathcal{P}(B_R))$ and bounds")
        ax1.set_ylabel(r"ratio to $\mathrm{sup}_\varepsilon\,g$")
        ax0.set_title("values", loc="left")
        ax1.set_title(r"relative to the two-Dirac optimum (zoom)", loc="left")
        legend_below(
            fig,
            *ax0.get_legend_handles_labels(),
            ncol=2,
            fontsize=6.5,
            title=dodge_note(radii),
            title_fontsize=6.5,
        )
        fig.suptitle(
            r"mean-field regime: $d = 2$, $A = \mathrm{diag}(1, -0.3)$, $V = I$", fontsize=8.5
        )
        return save(fig, Path(out_dir) / STEM)


#: The command line ``python -m paper_figs.fig_f6_mean_field --results DIR --out DIR``:
#: :func:`._style.figure_main` with this figure's ``draw``.
main = partial(figure_main, draw, __doc__)


if __name__ == "__main__":
    main()
