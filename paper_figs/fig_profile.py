r"""Whole-model profile figure: heatmaps of the block norm (layer x n) and of the heads.

Drawn from the ``profile.json`` that ``meanfield profile`` writes (docs/profile.md):

* left: :math:`\log_{10}\|D\,\mathrm{block}_\ell(x_\ell)\|_2`, layer by window length;
* middle (when the heads were profiled): :math:`\log_{10}` of each head's local constant through
  its slice of the output projection, layer by head, at the largest window;
* right: per layer at the largest window, the block norm, the attention sublayer's estimate and
  its certified upper end (the probabilistic ``upper_prob``, dotted, where the streaming path
  forms no deterministic one), on a log scale; the title gives the chain-rule product against the
  end-to-end constant.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.ticker import MaxNLocator

from experiments.engine import load_json, record_float

from ._style import PALETTE, TWO_COLUMNS, figure_main, plot_curves, save, style

__all__ = ["draw"]


def _grid(doc: dict, key: str) -> np.ndarray:
    """(layers, ns) array of ``record[key]["value"]``."""
    layers, ns = doc["layers"], doc["ns"]
    out = np.full((len(layers), len(ns)), np.nan)
    for r in doc["records"]:
        out[layers.index(r["layer"]), ns.index(r["n"])] = record_float(r[key]["value"])
    return out


def _heatmap(fig, ax, data: np.ndarray, xlabels: list, layers: list, xlabel: str, cbar: str):
    im = ax.imshow(
        np.log10(data), aspect="auto", origin="lower", cmap="viridis", interpolation="nearest"
    )
    ax.set_xticks(range(len(xlabels)), [str(v) for v in xlabels])
    step = max(1, math.ceil(len(layers) / 10))
    ticks = list(range(0, len(layers), step))
    ax.set_yticks(ticks, [str(layers[i]) for i in ticks])
    ax.set_xlabel(xlabel)
    ax.set_ylabel("layer")
    ax.grid(False)
    fig.colorbar(im, ax=ax, shrink=0.9).set_label(cbar)


def draw(results_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Draw ``profile.pdf``/``profile.png`` from ``profile.json`` in ``results_dir``."""
    import matplotlib.pyplot as plt

    results_dir = Path(results_dir)
    out_dir = results_dir if out_dir is None else Path(out_dir)
    doc = load_json(results_dir / "profile.json")
    layers, ns = list(doc["layers"]), list(doc["ns"])
    n_max = max(ns)
    last = sorted((r for r in doc["records"] if r["n"] == n_max), key=lambda r: r["layer"])
    heads = last[0]["attention"].get("head_values") is not None
    with style():
        widths = [1.0 + 0.15 * len(ns), 1.5, 2.5] if heads else [1.0 + 0.15 * len(ns), 2.5]
        fig, axes = plt.subplots(
            1, len(widths), figsize=(TWO_COLUMNS, 2.9), gridspec_kw={"width_ratios": widths}
        )
        _heatmap(
            fig,
            axes[0],
            _grid(doc, "block"),
            ns,
            layers,
            "window length n",
            r"$\log_{10}\|D\,\mathrm{block}_\ell\|_2$",
        )
        axes[0].set_title("whole block")
        if heads:
            H = np.array([[record_float(v) for v in r["attention"]["head_values"]] for r in last])
            _heatmap(
                fig,
                axes[1],
                H,
                list(range(H.shape[1])),
                layers,
                "head",
                r"$\log_{10}$ head constant",
            )
            step = max(1, math.ceil(H.shape[1] / 8))
            ticks = list(range(0, H.shape[1], step))
            axes[1].set_xticks(ticks, [str(h) for h in ticks])
            axes[1].set_title(f"attention heads, n = {n_max}")
        ax = axes[-1]
        x = [r["layer"] for r in last]
        curves: list[tuple[list[float], str, dict[str, Any]]] = [
            (
                [record_float(r["block"]["value"]) for r in last],
                "block",
                dict(fmt="o-", ms=2.5, color=PALETTE["fit"]),
            ),
            (
                [record_float(r["attention"]["value"]) for r in last],
                "attention",
                dict(fmt="s-", ms=2.5, color=PALETTE["masked"]),
            ),
        ]
        # the deterministic upper end where it is finite; on the streaming path (attention
        # variants, long windows) there is none, and the certified probabilistic end is drawn,
        # dotted and named as such
        det = [record_float(r["attention"]["upper"]) for r in last]
        prob = [record_float(r["attention"].get("upper_prob", math.inf)) for r in last]
        if any(math.isfinite(v) for v in det):
            curves.append(
                (det, "attention upper (certified)", dict(fmt="--", color=PALETTE["bound"]))
            )
        if not all(math.isfinite(v) for v in det) and any(math.isfinite(v) for v in prob):
            curves.append(
                (
                    [p if not math.isfinite(u) else math.nan for u, p in zip(det, prob)],
                    "upper_prob (conf. 1 − δ)",
                    dict(fmt=":", color=PALETTE["bound"]),
                )
            )
        ax.set_yscale("log")
        plot_curves(ax, x, curves)
        finite = [v for y, _, _ in curves for v in y if math.isfinite(v) and v > 0]
        if finite:  # room below the curves for the legend
            ax.set_ylim(min(finite) / 60, max(finite) * 2)
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("local Lipschitz constant")
        ax.legend(loc="lower right", frameon=False)
        chain = [c for c in doc.get("chains", []) if c["n"] == n_max]
        title = f"per layer, n = {n_max}"
        if chain:
            c = chain[0]
            title += (
                f"\nproduct of blocks {record_float(c['product_value']):.3g}, "
                f"end-to-end {record_float(c['end_to_end']['value']):.3g}"
            )
        ax.set_title(title)
        fig.suptitle(f"{doc['model']}", fontsize=8.5)
        return save(fig, out_dir / "profile")


def main() -> None:
    """``python -m paper_figs.fig_profile --results DIR --out DIR``."""
    figure_main(draw, __doc__)


if __name__ == "__main__":
    main()
