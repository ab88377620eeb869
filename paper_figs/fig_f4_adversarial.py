r"""Figure F4: adversarial inputs, local Lipschitz constant against the sequence length.

One panel per adversarial configuration of docs/experiments.md ("The paper's experiments")
found in ``results_dir / "adversarial"`` (written by :mod:`experiments.adversarial`), log–log
axes so that :math:`C\sqrt n` is a line of slope ½:

* red points: :math:`\|Df(X)\|_2` of the whole multi-head map at the construction of
  docs/theory.md §3 (released variant, −8 rule), with the certified bracket as error bars where
  its upper end is finite; open red squares: the symmetric-part variant;
* dark blue: the least-squares fit :math:`C\sqrt n` ("Cn^{1/2}") of the released series where its
  free log–log exponent is within 0.1 of ½
  (:func:`experiments.adversarial.sqrt_n_consistent`); elsewhere the free power law
  :math:`cn^{\alpha}`, dotted, and no √n constant;
* dashed grey: the paper's printed :math:`C\sqrt n` (a hand-set curve for the paper's model,
  defect D7);
* green: the global √n bound (docs/theory.md §1, triangle form, summed over heads with
  :math:`\|W_hV_h\|`) and the certified local bound (docs/theory.md §2a) at the released
  construction;
* orange dotted: the released data-dependent quantity, labelled as a heuristic (it is not a
  bound as written, docs/theory.md §2).

A last panel shows the worst-case search on a small synthetic head when it was run (purple
diamonds; grey open triangles: the best construction it started from). The shared legend takes
the empty panel when there is one. Panel titles name the model actually used. Reads saved
results only.
"""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import numpy as np

from experiments.engine import record_float

from ._style import (
    PALETTE,
    TWO_COLUMNS,
    figure_main,
    legend_below,
    legend_entries,
    plot_curves,
    save,
    style,
)

__all__ = ["STEM", "draw", "main"]

STEM = "fig_f4_adversarial"

_SHORT = {
    "minilm": "all-MiniLM-L6-v2",
    "smollm2": "SmolLM2-135M (RoPE)",
    "gpt2-random": "random GPT-2 small",
    "bert-random": "random BERT-base",
    "gpt2-random-tiny": "tiny random GPT-2",
    "bert-random-tiny": "tiny random BERT",
}


def _column(records: list[dict], key: str) -> np.ndarray:
    return np.array([record_float(r.get(key)) for r in records], dtype=float)


def _log_axes(ax) -> None:
    """Log-log axes with plain tick labels on x (sequence lengths are small integers)."""
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("Sequence length")
    ax.set_ylabel("Lipschitz constant")


#: Colour of the worst-case search's values (distinct from the constructions' red).
WORST = "#6a3d9a"


def _fit_curve(ax, n: np.ndarray, y: np.ndarray, grid: np.ndarray) -> str:
    """Draw the C·√n fit where the free exponent is near 1/2, else the free power law.

    Returns the text of the panel's fit box.
    """
    from experiments.adversarial import fit_sqrt_n, sqrt_n_consistent

    alpha = c = math.nan
    if np.unique(n).size >= 2 and np.all(y > 0):
        alpha, logc = np.polyfit(np.log(n), np.log(y), 1)
        c = math.exp(logc)
    if sqrt_n_consistent(alpha):
        C = fit_sqrt_n(n.tolist(), y.tolist())
        ax.plot(grid, C * np.sqrt(grid), color=PALETTE["fit"], lw=0.9, label=SQRT_FIT_LABEL)
        return f"fit C = {C:.3g} (free exponent {alpha:.2f})"
    if math.isfinite(alpha):
        ax.plot(grid, c * grid**alpha, ":", color=PALETTE["fit"], lw=1.1, label=FREE_FIT_LABEL)
        return f"grows like $n^{{{alpha:.2f}}}$: no √n fit"
    return "too few points for a fit"


SQRT_FIT_LABEL = r"$Cn^{1/2}$ (least-squares fit)"
FREE_FIT_LABEL = r"$cn^{\alpha}$ (free fit, where $\alpha$ is far from 1/2)"


def _panel(ax, entry: dict) -> None:
    info, recs = entry["info"], entry["records"]
    settings, conf = info["settings"], info["config"]
    ok = [r for r in recs if r.get("status") == "ok"]
    rel = sorted((r for r in ok if r["variant"] == "released"), key=lambda r: r["n"])
    sym = sorted((r for r in ok if r["variant"] == "symmetric"), key=lambda r: r["n"])
    all_n = np.array(sorted({r["n"] for r in ok}), dtype=float)
    if all_n.size == 0:
        ax.text(0.5, 0.5, "no finished record", transform=ax.transAxes, ha="center")
        return
    grid = np.geomspace(all_n.min(), all_n.max(), 200)

    main = rel if rel else sym
    n, y = _column(main, "n"), _column(main, "value")
    lo, up = _column(main, "lower"), _column(main, "upper")
    fin = np.isfinite(up)
    yerr = np.vstack([np.clip(y - lo, 0, None), np.where(fin, np.clip(up - y, 0, None), 0.0)])
    name = "released construction" if rel else "symmetric construction"
    ax.errorbar(
        n,
        y,
        yerr=yerr,
        fmt="o",
        ms=3,
        color="red",
        ecolor="red",
        elinewidth=0.6,
        capsize=1.5,
        label=rf"$\|Df(X)\|_2$, {name}",
        zorder=3,
    )
    if rel and sym:
        ax.plot(
            _column(sym, "n"),
            _column(sym, "value"),
            "s",
            ms=3,
            mfc="none",
            mec=PALETTE["masked"],
            mew=0.7,
            label="symmetric-part construction",
            zorder=3,
        )
    text = _fit_curve(ax, n, y, grid)
    ax.plot(
        grid,
        conf["paper_C"] * np.sqrt(grid),
        "--",
        color="0.45",
        lw=0.9,
        label=r"paper's hand-set $C\sqrt{n}$ (for the paper's model)",
    )
    _fit_text(ax, f"{text}\npaper C = {conf['paper_C']:g}")
    plot_curves(
        ax,
        n,
        [
            _global_bound(main),
            (
                _column(main, "local_bound"),
                "certified local bound",
                dict(fmt="-.", color=PALETTE["bound"], lw=0.9),
            ),
            (
                _column(main, "released_heuristic"),
                "released quantity: heuristic (not a bound)",
                dict(fmt=":", color=PALETTE["released"], lw=1.0),
            ),
        ],
    )
    _log_axes(ax)
    short = _SHORT.get(settings["model"], info["label"])
    mask = "causal" if settings["masked"] else "unmasked"
    approx = "; construction approx. (RoPE)" if not info.get("construction_exact", True) else ""
    ax.set_title(
        f"{conf['paper_model'].split(' (')[0]} L{conf['paper_layer']} → {short}\n"
        f"L{settings['layer']} head {settings['head']}, R = {settings['R']:g}, "
        f"{settings['map']}, {mask}{approx}",
        fontsize=7,
    )


def _fit_text(ax, text: str) -> None:
    """The fitted law, written in the top-left corner of a panel."""
    ax.text(0.03, 0.97, text, transform=ax.transAxes, va="top", fontsize=6.5, color=PALETTE["fit"])


def _global_bound(rows) -> tuple:
    """The global square-root bound as a curve of :func:`plot_curves`."""
    style = dict(fmt="-", color=PALETTE["bound"], lw=0.9)
    return _column(rows, "global_bound_triangle"), r"global $\sqrt{n}$ bound", style


def _worst_panel(ax, entry: dict) -> None:
    recs = entry["records"]
    n, y = _column(recs, "n"), _column(recs, "value")
    grid = np.geomspace(n.min(), n.max(), 200)
    ax.plot(n, y, "D", ms=3, color=WORST, label=r"worst case found, $\|Df(X)\|_2$")
    ax.plot(
        n,
        _column(recs, "construction_value"),
        "^",
        ms=3.5,
        mfc="none",
        mec=PALETTE["input"],
        mew=0.7,
        label="best construction start",
    )
    _fit_text(ax, _fit_curve(ax, n, y, grid))
    plot_curves(ax, n, [_global_bound(recs)])
    _log_axes(ax)
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    ax.set_xticks(n, [str(int(v)) for v in n])
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    R = entry["info"]["settings"]["R"]
    ax.set_title(f"worst-case search: {entry['info']['label']}, R = {R:g}", fontsize=7)


def draw(results_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """Draw ``fig_f4_adversarial.{pdf,png}`` from ``results_dir / "adversarial"``.

    Raises
    ------
    FileNotFoundError
        When the adversarial experiment has not been run.
    """
    import matplotlib.pyplot as plt

    from experiments.adversarial import load_results

    data = load_results(Path(results_dir))
    panels = [(_panel, e) for e in data["configs"].values()]
    if data["worst_case"] is not None and data["worst_case"]["records"]:
        panels.append((_worst_panel, data["worst_case"]))
    ncols = 2 if len(panels) > 1 else 1
    nrows = math.ceil(len(panels) / ncols)
    with style():
        fig, axes = plt.subplots(
            nrows,
            ncols,
            figsize=(TWO_COLUMNS, 2.45 * nrows + (0.3 if len(panels) % ncols else 0.9)),
            squeeze=False,
        )
        for ax, (draw_panel, entry) in zip(axes.flat, panels):
            draw_panel(ax, entry)
        spare = list(axes.flat)[len(panels) :]
        for ax in spare:
            ax.axis("off")
        # one shared legend: the union of the panels' series, in order of appearance; in the
        # empty panel when there is one, under the panels otherwise
        entries = legend_entries(axes.flat[: len(panels)])
        if spare:
            spare[0].legend(*entries, loc="center", ncol=1, frameon=False)
        else:
            legend_below(fig, *entries, ncol=2)
        return save(fig, Path(out_dir) / STEM)


#: The command line ``python -m paper_figs.fig_f4_adversarial --results DIR --out DIR``:
#: :func:`._style.figure_main` with this figure's ``draw``.
main = partial(figure_main, draw, __doc__)


if __name__ == "__main__":
    main()
