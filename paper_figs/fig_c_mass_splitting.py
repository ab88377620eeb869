"""Figure C: mass splitting (docs/theory.md §10 and §A5; docs/experiments.md, figure C).

Left: the duplicate-then-move gain ``G_k`` against ``k`` (log-log) for several radii
(``s = R^2/4``), with ``sqrt(k)`` and the saturation level ``e^{s/2}/2`` overlaid. Right: best
move-only against best split-then-move ratio ``W_2(F nu, F mu) / W_2(nu, mu)`` (exact ``W_2`` on both
sides) under a ``W_2`` budget, at a Dirac and at a three-atom measure, and the same perturbations
measured with ``W_inf`` (no gain). Reads ``mass_splitting.npz`` written by
``meanfield attack split --figure-c`` (:func:`experiments.mass_splitting.figure_c_results`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from experiments.engine import load_npz

from ._style import PALETTE, TWO_COLUMNS, attack_figure_main, attack_paths, save, style

__all__ = ["draw"]

STEM = "fig_c_mass_splitting"


def draw(results_path: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Draw ``fig_c_mass_splitting.{pdf,png}`` from a saved results file (or its directory)."""
    import matplotlib.pyplot as plt

    npz, out_dir = attack_paths(results_path, "mass_splitting.npz", out_dir)
    data = load_npz(npz)
    k, G, s, radii = data["k"], data["G"], data["s"], data["radii"]
    with style():
        fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(TWO_COLUMNS, 0.42 * TWO_COLUMNS))
        colors = plt.get_cmap("viridis")(np.linspace(0.1, 0.85, len(radii)))
        for i, (R, si) in enumerate(zip(radii, s)):
            ax0.loglog(k, G[i], color=colors[i], label=f"R = {R:g} (s = {si:.3g})")
            ax0.axhline(np.exp(si / 2) / 2, color=colors[i], ls=":", lw=0.8)
            ko = data["k_opt"][i]
            if np.isfinite(ko) and ko <= k.max():
                ax0.plot([ko], [np.interp(ko, k, G[i])], "o", color=colors[i], ms=3)
        ax0.loglog(k, np.sqrt(k), "k--", lw=0.8, label=r"$\sqrt{k}$")
        ax0.plot([], [], "k:", lw=0.8, label=r"$e^{s/2}/2$")
        ax0.set_ylim(0.8, max(2.0, 2 * G.max()))
        ax0.set_xlabel("copies $k$")
        ax0.set_ylabel(r"gain $G_k$")
        ax0.set_title(r"duplicate-then-move at a Dirac ($\lambda = 1$)", loc="left")
        ax0.legend(loc="upper left", fontsize=6.5)

        from matplotlib.lines import Line2D

        b = data["budgets"]
        inputs = {
            "dirac": ("Dirac", PALETTE["unmasked"]),
            "few_atom": ("3 atoms", PALETTE["masked"]),
        }
        for key, (_name, col) in inputs.items():
            if f"{key}_split_w2" not in data:
                continue
            ax1.semilogx(b, data[f"{key}_split_w2"], "o-", color=col, ms=3)
            ax1.semilogx(b, data[f"{key}_move_w2"], "s-", color=col, ms=3, alpha=0.5)
            ax1.semilogx(b, data[f"{key}_split_winf"], "o--", color=col, ms=3, mfc="none")
            ax1.semilogx(b, data[f"{key}_move_winf"], "s--", color=col, ms=3, mfc="none", alpha=0.5)
        ax1.axhline(float(data["V_norm"]), color="0.3", lw=0.8, ls="-.")
        handles = [Line2D([], [], color=c, label=n) for n, c in inputs.values()] + [
            Line2D([], [], color="0.2", marker="o", ms=3, label="split-then-move"),
            Line2D([], [], color="0.2", marker="s", ms=3, alpha=0.5, label="move-only"),
            Line2D([], [], color="0.2", ls="-", label=r"$W_2$ ratio"),
            Line2D([], [], color="0.2", ls="--", label=r"$W_\infty$ ratio"),
            Line2D([], [], color="0.3", ls="-.", label=r"$\|V\|_2$"),
        ]
        ax1.legend(handles=handles, fontsize=6, ncol=2, loc="upper right")
        ax1.set_xlabel(r"$W_2$ budget $\varepsilon$")
        ax1.set_ylabel(r"exact ratio $W(F\nu, F\mu)\,/\,W(\nu, \mu)$")
        ax1.set_title(r"attacks, $A = \mathrm{diag}(1, -0.3)$, $V = I$", loc="left")
        top = max(float(np.nanmax(data[k])) for k in data if k.endswith(("_w2", "_winf")))
        ax1.set_ylim(0, 1.45 * top)
        return save(fig, out_dir / STEM)


if __name__ == "__main__":
    attack_figure_main(draw, __doc__, "mass_splitting.npz")
