r"""Figure A: the mean-field Lipschitz constant against :math:`R` in the style of v1 (docs/experiments.md, "Stages and figures").

One panel per setting (:math:`d = 1` with :math:`A = \pm1`, :math:`V = 1`; :math:`d = 2` with
:math:`A = \mathrm{diag}(1, -0.3)`, :math:`V = I`; a random Gaussian :math:`A = Q^\top K/\sqrt k`
with :math:`V = I`), log y: the upper bounds :math:`c' = 1` (proved, docs/theory.md §17) and :math:`c' = 2` (docs/theory.md §6,
reconstructed constants, not the paper's), the exact two-Dirac optimum :math:`\sup_\varepsilon g`
at the best gap :math:`\gamma^*` (§5), the :math:`w = 1/2` form, the asymptote, the global lower
bound :math:`\max(\|V\|_2, \sup_\varepsilon g)`, and the values reached by optimized worst measures
with 2, 3 and 5 atoms (§A4). The two-Dirac optimum places both atoms on an eigenvector of the
symmetric part of :math:`A`; for the non-symmetric Gaussian :math:`A` atoms off those axes see a
larger score gap, so the optimized values leave that curve by a factor growing like
:math:`e^{cR^2}` (the report's Table A says by how much).

Reads ``<results>/synthetic/a.npz`` and ``a.json`` written by :func:`experiments.synthetic.run`;
no computation.
"""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import numpy as np

from experiments.engine import load_json, load_npz, stage_result

from ._style import (
    PALETTE,
    TWO_COLUMNS,
    atom_markers,
    figure_main,
    legend_below,
    plot_curves,
    save,
    style,
)

__all__ = ["STEM", "draw", "main"]

STEM = "fig_a_lipschitz_vs_R"


def draw(results_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """Draw ``fig_a_lipschitz_vs_R.{pdf,png}`` into ``out_dir`` from the saved A results."""
    import matplotlib.pyplot as plt

    d = load_npz(stage_result(results_dir, "synthetic", "a.npz"))
    meta = load_json(stage_result(results_dir, "synthetic", "a.json"))
    settings = [str(s) for s in d["settings"]]
    Rc, radii = d["curve_R"], d["radii"]
    ncol = 2 if len(settings) > 1 else 1
    nrow = math.ceil(len(settings) / ncol)
    with style():
        fig, axes = plt.subplots(
            nrow, ncol, figsize=(TWO_COLUMNS, 0.33 * TWO_COLUMNS * nrow + 0.6), squeeze=False
        )
        for ax in axes.ravel()[len(settings) :]:
            ax.set_visible(False)
        for ax, s in zip(axes.ravel(), settings):

            def g(key: str, s: str = s) -> np.ndarray:
                return d[f"{s}__{key}"]

            global_label = r"global lower bound $\max(\|V\|_2, \sup_\varepsilon g)$"
            asymptote = r"asymptote $\frac{3\sqrt{3}}{16}\gamma^* e^{\gamma^*/2}$ (lower bound)"
            plot_curves(
                ax,
                Rc,
                [
                    (g("curve_global_lower"), global_label, dict(color="0.75", lw=3.0)),
                    (
                        g("curve_upper_c1"),
                        r"upper bound $c'=1$ (proved, ours)",
                        dict(color=PALETTE["bound"], ls="-.", lw=1.0),
                    ),
                    (
                        g("curve_upper_c2"),
                        r"upper bound $c'=2$ (ours)",
                        dict(color="#8aa61c", ls=(0, (5, 2, 1, 2, 1, 2)), lw=1.0),
                    ),
                    (
                        g("curve_sup_g"),
                        r"two-Dirac optimum on the eigen-axes, $\gamma^*$ (lower bound)",
                        dict(color="k", lw=1.1),
                    ),
                    (
                        g("curve_half"),
                        r"two Diracs at $w = 1/2$ (lower bound)",
                        dict(color="k", ls="--", lw=0.7),
                    ),
                    (g("curve_asymptote"), asymptote, dict(color="k", ls=":", lw=0.9)),
                ],
            )
            atoms = g("atoms")
            for j, (k, kw) in enumerate(zip(atoms, atom_markers(len(atoms)), strict=True)):
                ax.plot(
                    radii, g("opt_value")[j], label=f"optimized measure, {k} atoms (measured)", **kw
                )
            ax.set_yscale("log")
            ax.set_xlim(Rc.min(), Rc.max())
            sup = g("curve_sup_g")
            lo = min(float(g("curve_trivial").min()), float(sup[sup > 0].min(initial=np.inf)))
            top = max(float(np.nanmax(g("opt_value"))), float(sup.max()))
            ax.set_ylim(lo / 3.0, top * 1e6)  # the upper bounds may leave the axis
            ax.set_title(meta.get("settings", {}).get(s, s), loc="left", fontsize=8)
            ax.set_xlabel("radius $R$")
            ax.set_ylabel("Lipschitz constant")
        legend_below(fig, *axes.ravel()[0].get_legend_handles_labels(), ncol=2, fontsize=6.5)
        return save(fig, Path(out_dir) / STEM)


#: The command line ``python -m paper_figs.fig_a_lipschitz_vs_R --results DIR --out DIR``:
#: :func:`._style.figure_main` with this figure's ``draw``.
main = partial(figure_main, draw, __doc__)


if __name__ == "__main__":
    main()
