r"""Figure F5: the √n regime on the eigenvector construction (docs/theory.md §1, §3 and §4).

One panel per gap :math:`\gamma` (head :math:`d = 1`, :math:`A = -\gamma/(2R^2)`, :math:`V = 1`):
:math:`\|Df(X)\|_2` against :math:`n` (log–log) for the construction of docs/theory.md §3, unmasked
(exact, closed form at every integer :math:`n`, with certified engine brackets at a few :math:`n`)
and masked (certified engine brackets). Overlays: the lower-bound formulas of §3 and §4, the best
:math:`k`-copy input (a lower bound on :math:`\mathrm{Lip}(f\,|\,B_R^n)`), the √n upper bounds of
§1, the mean-field level :math:`\sup_\varepsilon g` and the :math:`c' = 1` bound (proved, §17) (§5–§6),
and :math:`n - 1 = e^\gamma`. It shows the √n rise, the peak at :math:`n` of order
:math:`e^\gamma`, and decay (unmasked) against saturation (masked).

Reads ``<results>/synthetic/f5.npz`` written by :func:`experiments.synthetic.run`; no computation.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

from experiments.engine import load_npz, stage_result

from ._style import PALETTE, TWO_COLUMNS, figure_main, legend_below, plot_curves, save, style

__all__ = ["STEM", "draw", "main"]

STEM = "fig_f5_sqrt_n"


def draw(results_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """Draw ``fig_f5_sqrt_n.{pdf,png}`` into ``out_dir`` from the saved F5 results."""
    import matplotlib.pyplot as plt

    d = load_npz(stage_result(results_dir, "synthetic", "f5.npz"))
    gammas = d["gammas"]
    with style():
        fig, axes = plt.subplots(
            1, len(gammas), figsize=(TWO_COLUMNS, 0.40 * TWO_COLUMNS + 0.45), squeeze=False
        )
        for gi, g in enumerate(gammas):
            ax = axes[0, gi]
            n_all, n = d["n_all"], d["n_grid"]
            ax.plot(
                n_all,
                d["closed_all"][gi],
                color=PALETTE["unmasked"],
                lw=1.2,
                label="unmasked: exact $\\|Df(X)\\|_2$ (closed form)",
            )
            ax.plot(
                d["check_n"],
                d["check_value"][gi],
                "s",
                mfc="none",
                mec=PALETTE["unmasked"],
                ms=5,
                mew=0.8,
                label="unmasked: certified engine bracket",
            )
            if d["masked_n"].size:
                mv, lo, up = d["masked_value"][gi], d["masked_lower"][gi], d["masked_upper"][gi]
                ax.errorbar(
                    d["masked_n"],
                    mv,
                    yerr=[mv - lo, up - mv],
                    fmt="o-",
                    ms=2.5,
                    lw=0.9,
                    color=PALETTE["masked"],
                    label="masked: certified engine bracket",
                )
            plot_curves(
                ax,
                n,
                [
                    (
                        d["lower_formula"][gi],
                        "lower bound formula (construction)",
                        dict(fmt="--", color=PALETTE["unmasked"], lw=0.8),
                    ),
                    (
                        d["masked_lower_formula"][gi],
                        "masked lower bound formula",
                        dict(fmt=":", color=PALETTE["masked"], lw=1.0),
                    ),
                    (
                        d["k_copy_lower"][gi],
                        "best $k$-copy input (lower bound on sup over $B_R^n$)",
                        dict(fmt="-.", color="0.45", lw=0.8),
                    ),
                    (
                        d["upper_triangle"][gi],
                        "√n upper bound (triangle form)",
                        dict(color=PALETTE["bound"], lw=1.0),
                    ),
                    (
                        d["upper_sqrt3"][gi],
                        "√n upper bound ($\\sqrt{3}$ form)",
                        dict(fmt="--", color=PALETTE["bound"], lw=0.7, alpha=0.7),
                    ),
                ],
            )
            for key, color, ls, label in (
                ("sup_g", "k", "--", "mean-field lower bound $\\sup_\\varepsilon g$"),
                ("mf_upper_c1", "k", "-.", "mean-field upper bound $c'=1$ (proved)"),
                (
                    "masked_limit",
                    PALETTE["masked"],
                    (0, (1, 3)),
                    "masked lower bound, limit $n\\to\\infty$",
                ),
            ):
                ax.axhline(d[key][gi], color=color, ls=ls, lw=0.7, label=label)
            ax.axvline(1 + np.exp(g), color="0.6", ls=":", lw=0.8, label="$n - 1 = e^{\\gamma}$")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlim(n_all.min(), n_all.max())
            ax.set_title(f"$\\gamma = {g:g}$  ($\\|A\\|_2R^2 = {g / 2:g}$)")
            ax.set_xlabel("sequence length $n$")
            if gi == 0:
                ax.set_ylabel("local Lipschitz constant $\\|Df(X)\\|_2$")
        legend_below(fig, *axes[0, 0].get_legend_handles_labels(), ncol=3, fontsize=6.5)
        fig.suptitle(
            "√n regime: construction of docs/theory.md §3, $d = 1$, $A = -\\gamma/(2R^2)$, "
            "$V = 1$, $R = 1$",
            fontsize=8.5,
        )
        return save(fig, Path(out_dir) / STEM)


#: The command line ``python -m paper_figs.fig_f5_sqrt_n --results DIR --out DIR``:
#: :func:`._style.figure_main` with this figure's ``draw``.
main = partial(figure_main, draw, __doc__)


if __name__ == "__main__":
    main()
