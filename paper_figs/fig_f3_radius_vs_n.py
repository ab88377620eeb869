r"""Figure F3: mean radius of the inputs against sequence length, for the GPT-2 L6 stand-in.

The paper relates its steeper GPT-2 L6 curve (:math:`25.0\,n^{0.51}`) to a correlation between
the radius of the inputs and n (released ``gpt_2/correlation_n_R.pdf``, docs/experiments.md, "The paper's experiments", F3).
This figure plots the mean radius :math:`R(X)=(\frac1n\sum_i\|x_i\|^2)^{1/2}` of every window
(10 points per n, size 2, alpha 0.5, as released) against n for the sweeps standing in for
GPT-2 L6 (the middle SmolLM2 layer), one panel per corpus, with the fitted drift
:math:`R\propto n^{\beta}` (95 % bootstrap interval). When no such sweep was run (e.g. the tiny
preset), every saved input set (model, layer, corpus, grid; maps of the same layer share their
inputs) is drawn instead and the titles say so. Output:
``fig_f3_radius_vs_n.{pdf,png}``. Reads saved results only.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

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


def draw(results_dir: Path, out_dir: Path) -> list[Path]:
    """Draw ``fig_f3_radius_vs_n.{pdf,png}`` from saved results.

    Parameters
    ----------
    results_dir : Path
        The results root holding ``real_data/``.
    out_dir : Path

    Returns
    -------
    list of Path
        The PDF and PNG.
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
            ax.set_xlabel("sequence length $n$")
            panel_ylabel(ax, "mean radius $R(X)$")
            title = panel_title(s)
            if fallback:
                title += f"\n(no {TARGET} stand-in in these results)"
            ax.set_title(title, fontsize=6.5, loc="left")
            panel_legend(ax)
        return save(fig, Path(out_dir) / STEM)


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: ``python -m paper_figs.fig_f3_radius_vs_n --results DIR --out DIR``."""
    figure_main(draw, __doc__, argv)


if __name__ == "__main__":
    main()
