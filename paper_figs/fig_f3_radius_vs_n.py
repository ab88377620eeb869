r"""Figure F3: mean radius of the inputs against sequence length, for the GPT-2 L6 stand-in.

The paper relates its steeper GPT-2 L6 curve (:math:`25.0\,n^{0.51}`) to a correlation between
the radius of the inputs and n (released ``gpt_2/correlation_n_R.pdf``; docs/experiments.md,
"The paper's experiments", F3).
This figure plots the mean radius :math:`R(X)=(\frac1n\sum_i\|x_i\|^2)^{1/2}` of every window
(10 points per n, size 2, alpha 0.5, as released) against n for the sweeps standing in for
GPT-2 L6 (the middle SmolLM2 layer), one panel per corpus, with the fitted drift
:math:`R\propto n^{\beta}` (95 % bootstrap interval); red crosses mark the n at which that power
law misses the geometric mean of the radii by more than :data:`MISS_SE` standard errors
(:func:`fit_misses`), i.e. where a power law does not describe the data (the radius levels off
while the fit keeps growing). When no such sweep was run (e.g. the tiny
preset), every saved input set (model, layer, corpus, grid; maps of the same layer share their
inputs) is drawn instead and the titles say so. Output:
``fig_f3_radius_vs_n.{pdf,png}``. Reads saved results only.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from experiments.fits import fit_power_law

from ._style import PALETTE, figure_main, save, style
from .fig_f1_lipschitz_vs_n import (
    panel_grid,
    panel_legend,
    panel_title,
    panel_ylabel,
    sweeps_or_raise,
)

__all__ = ["STEM", "TARGET", "draw", "main"]

STEM = "fig_f3_radius_vs_n"
#: The paper configuration whose stand-in this figure shows.
TARGET = "GPT-2 L6"


def _distinct_inputs(sweeps: Sequence[dict]) -> list[dict]:
    """Keep one sweep per input set.

    The radius depends on the model, layer, corpus and grid only, not on the map differentiated
    (a "block" sweep sees the same windows as "heads+WO").
    """
    seen, out = set(), []
    for s in sweeps:
        key = (s["config"]["model"], s["config"]["layer"], s["corpus"], s["grid"])
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out


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


def draw(results_dir: Path, out_dir: Path) -> list[Path]:
    """Draw ``fig_f3_radius_vs_n.{pdf,png}`` into ``out_dir``; return the two paths.

    The results are read from ``results_dir/real_data/`` (see :func:`sweeps_or_raise`).
    """
    sweeps = sweeps_or_raise(results_dir)
    chosen = [s for s in sweeps if s.get("paper_configuration") == TARGET]
    fallback = not chosen
    if fallback:
        chosen = sweeps
    chosen = _distinct_inputs(chosen)
    with style():
        fig, axes = panel_grid(len(chosen), height=2.0)
        for ax, s in zip(axes, chosen):
            a = s["arrays"]
            n, R = a["n"].astype(float), a["mean_radius"]
            ax.scatter(n, R, s=2, alpha=0.5, color=PALETTE["unmasked"], label="mean radius R(X)")
            try:
                fit = fit_power_law(n, R, n_boot=1000, seed=0)
            except ValueError:
                fit = None
            if fit is not None:
                grid = np.linspace(n.min(), n.max(), 100)
                lo, hi = fit.alpha_ci
                ax.plot(
                    grid,
                    fit(grid),
                    color=PALETTE["fit"],
                    lw=0.9,
                    label=rf"fit $R\propto n^{{{fit.alpha:.3f}}}$, $\beta\in[{lo:.3f},{hi:.3f}]$",
                )
                ns, med, miss = fit_misses(n, R, fit)
                if miss.any():
                    ax.scatter(
                        ns[miss],
                        med[miss],
                        s=22,
                        marker="x",
                        color=PALETTE["masked"],
                        linewidths=0.9,
                        zorder=5,
                        label=f"mean at n, missed by the power law (> {MISS_SE:g} s.e.)",
                    )
            ax.set_xlabel("sequence length $n$")
            panel_ylabel(ax, "mean radius $R(X)$")
            title = panel_title(s)
            if fallback:
                title += f"\n(no {TARGET} stand-in in these results)"
            ax.set_title(title, fontsize=6.5, loc="left")
            panel_legend(ax)
        return save(fig, Path(out_dir) / STEM)


#: The command line ``python -m paper_figs.fig_f3_radius_vs_n --results DIR --out DIR``:
#: :func:`._style.figure_main` with this figure's ``draw``.
main = partial(figure_main, draw, __doc__)


if __name__ == "__main__":
    main()
