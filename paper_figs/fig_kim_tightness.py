r"""Figure K: measured lower bounds on the Lipschitz constants of L2 attention against Kim et al.

Top row (:math:`\infty`-norm), one panel per head: the measured lower bound on
:math:`\mathrm{Lip}_\infty` against :math:`N` (log :math:`x`), the closed-form construction of
docs/theory.md §8a, Kim et al.'s upper bound, and the predicted growth
:math:`a(\log N-\log\log N)` with :math:`a` chosen so that it meets the lower bound at the largest
:math:`N` (said so in the legend). Bottom row (2-norm): the measured lower bound on
:math:`\mathrm{Lip}_2` against the 2-norm bound as recalled (``wq_power = 1``) and our repaired
form (``wq_power = 2``, proved in docs/derivations/invertible.md §2).

Reads ``<results>/kim_tightness/head_<name>.json`` written by :func:`experiments.kim_tightness.run`;
no computation.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

from ._style import PALETTE, TWO_COLUMNS, figure_main, legend_below, legend_entries, save, style

__all__ = ["STEM", "draw", "main"]

STEM = "fig_kim_tightness"
#: Kim et al.'s bound, drawn alike in both rows (one legend entry).
_KIM_BOUND = dict(color=PALETTE["bound"], lw=1.2, label="Kim et al. bound (as recalled)")


def _load(results_dir: str | Path) -> dict[str, dict]:
    from experiments.kim_tightness import load_heads

    heads = load_heads(results_dir)
    if not heads:
        raise FileNotFoundError(
            f"no results in {Path(results_dir) / 'kim_tightness'}: run the 'kim_tightness' "
            "experiment first"
        )
    return heads


def _minor_label(v: float, _pos: object) -> str:
    """Label the minor ticks 2 and 5 of each decade only."""
    if v <= 0:
        return ""
    m = v / 10 ** np.floor(np.log10(v))
    return f"{v:g}" if np.isclose(m, 2) or np.isclose(m, 5) else ""


def draw(results_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """Draw ``fig_kim_tightness.{pdf,png}`` into ``out_dir`` from the saved results."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    heads = _load(results_dir)
    H = len(heads)
    with style():
        fig, axes = plt.subplots(2, H, figsize=(TWO_COLUMNS, 4.6), squeeze=False, sharex="col")
        for j, d in enumerate(heads.values()):
            r = {k: np.asarray(v, dtype=float) for k, v in d["rows"].items()}
            n = r["n"]
            ax = axes[0, j]
            ax.plot(n, r["upper_inf"], **_KIM_BOUND)
            ax.plot(
                n,
                r["construction_inf"],
                ls="--",
                color="0.45",
                lw=0.8,
                label="closed-form construction",
            )
            ax.plot(
                n,
                r["lower_inf"],
                "o-",
                ms=2.8,
                color=PALETTE["unmasked"],
                lw=1.0,
                label=r"measured $\infty$-norm lower bound (search)",
            )
            grow = np.log(n) - np.log(np.log(n))
            a = r["lower_inf"][-1] / grow[-1]
            ng = np.geomspace(max(n.min(), 3.0), n.max(), 200)
            ax.plot(
                ng,
                a * (np.log(ng) - np.log(np.log(ng))),
                ls=":",
                color="k",
                lw=1.0,
                label=r"$a(\log N-\log\log N)$, $a$ matched at the largest $N$",
            )
            ax.set_xscale("log")
            ax.set_yscale("log")
            kind = "unit weights" if d["head"] == "scalar" else "random weights"
            ax.set_title(f"$D = {d['D']}$, $H = {d['H']}$, {kind}", fontsize=7.5)
            if j == 0:
                ax.set_ylabel(r"$\infty$-norm: $\mathrm{Lip}_\infty$ bounds")
            ax = axes[1, j]
            ax.plot(n, r["upper_2"], **_KIM_BOUND)
            if not np.allclose(r["upper_2"], r["upper_2_wq2"]):
                ax.plot(
                    n,
                    r["upper_2_wq2"],
                    ls="--",
                    color=PALETTE["bound"],
                    lw=0.9,
                    label=r"2-norm bound with $\|W^Q\|_2^2$ (ours, proved)",
                )
            keep = np.isfinite(r["lower_2"])
            ax.plot(
                n[keep],
                r["lower_2"][keep],
                "s-",
                ms=2.6,
                color=PALETTE["masked"],
                lw=1.0,
                label="measured 2-norm lower bound (search)",
            )
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("sequence length $N$")
            ticks = [t for t in (2, 8, 32, 128, 512) if n.min() <= t <= n.max()]
            ax.set_xticks(ticks, [str(t) for t in ticks])
            ax.xaxis.set_minor_formatter(NullFormatter())
            if j == 0:
                ax.set_ylabel(r"2-norm: $\mathrm{Lip}_2$ bounds")
        for ax in axes.flat:
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(FuncFormatter(_minor_label))
        # one entry per label, the last column's first
        legend_below(fig, *legend_entries([*axes[:, -1], *axes[:, 0]]), ncol=3, fontsize=6.5)
        fig.suptitle(
            "L2 attention: measured lower bounds vs Kim et al.'s upper bounds "
            "(docs/theory.md §8, §8a)",
            fontsize=8.5,
        )
        return save(fig, Path(out_dir) / STEM)


#: The command line ``python -m paper_figs.fig_kim_tightness --results DIR --out DIR``:
#: :func:`._style.figure_main` with this figure's ``draw``.
main = partial(figure_main, draw, __doc__)


if __name__ == "__main__":
    main()
