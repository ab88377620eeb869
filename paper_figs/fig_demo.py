"""Demo figure: atoms before and after masked and unmasked attention (marker area ~ mass)."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from experiments.engine import load_json, load_npz

from ._style import PALETTE, TWO_COLUMNS, save, style

__all__ = ["draw"]


def draw(results_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Draw ``demo.pdf``/``demo.png`` from ``demo.npz`` and ``demo.json`` in ``results_dir``."""
    import matplotlib.pyplot as plt

    results_dir = Path(results_dir)
    out_dir = results_dir if out_dir is None else Path(out_dir)
    data = load_npz(results_dir / "demo.npz")
    doc = load_json(results_dir / "demo.json")
    dist = doc["distances"]
    lip = doc.get("local_lipschitz", {})
    X, a = data["points"], data["weights"]
    sizes = 120.0 * a / a.max()  # marker areas proportional to mass, the largest atom at 120 pt^2
    with style():
        fig, axes = plt.subplots(1, 2, figsize=(TWO_COLUMNS, 0.5 * TWO_COLUMNS + 0.3))
        every = np.concatenate([X, data["unmasked"], data["masked"]])
        lo, hi = every.min(0), every.max(0)
        center, half = (lo + hi) / 2, 0.55 * float((hi - lo).max())
        panels = [
            ("unmasked", r"$F(\mu)$, unmasked", dist["W2(mu, F(mu))"], lip.get("F")),
            (
                "masked",
                r"$F^m(\mu)$, masked (labels: causal order)",
                dist["W2(mu, Fm(mu))"],
                lip.get("Fm"),
            ),
        ]
        for ax, (key, title, w2, est) in zip(axes, panels):
            Y = data[key]
            for x, y in zip(X, Y):
                ax.annotate(
                    "", xy=y, xytext=x, arrowprops=dict(arrowstyle="->", lw=0.5, color="0.6")
                )
            ax.scatter(
                X[:, 0],
                X[:, 1],
                s=sizes,
                c=PALETTE["input"],
                alpha=0.6,
                label=r"input $\mu$",
                zorder=3,
            )
            ax.scatter(
                Y[:, 0], Y[:, 1], s=sizes, c=PALETTE[key], alpha=0.85, label="output", zorder=4
            )
            if key == "masked" and "positions" in data:
                # causal rank of each input atom: it attends to atoms of rank <= its own
                ranks = np.argsort(np.argsort(data["positions"], kind="stable"), kind="stable") + 1
                for x, r in zip(X, ranks):
                    ax.annotate(
                        str(r),
                        x,
                        xytext=(3, 3),
                        textcoords="offset points",
                        fontsize=6,
                        color="0.3",
                    )
            local = "" if est is None else f", local Lip = {est['value']:.3f}"
            ax.set_title(f"{title}\n$W_2$(input, output) = {w2:.3f}{local}")
            ax.set_xlim(center[0] - half, center[0] + half)
            ax.set_ylim(center[1] - half, center[1] + half)
            ax.set_aspect("equal", adjustable="box")
            ax.set_xlabel("$x_1$")
        axes[0].set_ylabel("$x_2$")
        axes[0].legend(loc="best", markerscale=0.5)
        fig.suptitle(
            f"One attention head in $d=2$; marker area $\\propto$ mass ($\\|A\\|_2$ = {dist['A_norm']:.2f})",
            fontsize=9,
        )
        return save(fig, out_dir / "demo")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("results_dir", nargs="?", default="meanfield_demo")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    for p in draw(args.results_dir, args.out):
        print(p)
