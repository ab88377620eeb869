r"""Theory figure: the bounds of :mod:`theory.bounds` against :math:`n` and :math:`R`, with regimes.

Panels (all curves computed from closed forms; no experiment needed):

(a) against :math:`n` at :math:`\|A\|_2 = \|V\|_2 = 1`, :math:`R = 1.5`: the three √n upper
    forms (docs/theory.md §1), the eigenvector-construction lower bound (§3) for three gaps, its
    :math:`k`-copy and masked versions (§4), the :math:`n`-free mean-field upper bounds
    (:math:`c' = 1, 2`, §6) and the two-Dirac level (§5); the crossover :math:`n^*`
    (:func:`theory.regimes.crossover_n`) and the peak of the construction
    (:func:`theory.regimes.peak_n`) are marked;
(b) against :math:`R` in the worst case :math:`\lambda = -\|A\|_2` (:math:`\gamma = 2R^2`): the
    mean-field upper candidates, the two-Dirac optimum, its :math:`w = 1/2` form and asymptote, the
    trivial bound :math:`\|V\|_2`, the √n bound at :math:`n = 16` and the range
    :math:`[\|V\|, \sqrt n\|V\|]` of the large-radius limit (§7); the radius bracket of
    :func:`theory.regimes.radius_bracket` for a target :math:`L = 10` is marked;
(c) the regime map in the :math:`(R, n)` plane: :math:`n^*(R)` for :math:`c' = 1, 2` and the
    peak :math:`n` of the construction;
(d) only when ``results_dir/verify_bounds/report.json`` exists: the tightness ratios
    ``bound / certified local constant`` measured by :mod:`experiments.verify_bounds` (min–max
    range and median per bound). Rows are named in words (:data:`BOUND_WORDS`, from the report's
    record keys); colours, explained in the panel's legend: an upper bound that held on every
    instance (green), a bound that failed on at least one (red: refuted candidates and the released
    heuristic), a lower bound that held (blue). Bounds not drawn (a limit, a ratio that is not
    positive) are listed in the legend.

Legends use words, not the code's names; a note under the figure (:data:`GLOSSARY`) defines
:math:`\theta`, :math:`c'`, :math:`n^*`, :math:`\gamma`, :math:`w` and :math:`g`. Every constant
is a reconstruction documented in docs/theory.md (§15 lists the labels); none is the paper's
printed constant. STEM ``fig_theory_bounds``.
"""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path
from typing import Literal

import numpy as np

from experiments.engine import load_json, record_float

from ._style import PALETTE, TWO_COLUMNS, figure_main, save, style

__all__ = ["STEM", "draw", "main"]

STEM = "fig_theory_bounds"

#: Parameters of panels (a) and (b).
A_NORM, V_NORM, R_N_PANEL, N_R_PANEL, L_TARGET = 1.0, 1.0, 1.5, 16, 10.0

#: The legend labels of the three forms of the √n upper bound (docs/theory.md §1).
SQRT_N_FORMS: dict[Literal["sqrt3", "sharp", "triangle"], str] = {
    "sqrt3": r"$\sqrt{n}$ upper bound, constant $\sqrt{3}$",
    "sharp": r"$\sqrt{n}$ upper bound, constant $\sqrt{3}$, sharpened",
    "triangle": r"$\sqrt{n}$ upper bound, triangle inequality",
}


def _panel_n(ax) -> None:
    from theory import bounds, regimes

    n = np.unique(np.round(np.logspace(math.log10(2.0), 5, 400)))
    theta = A_NORM * R_N_PANEL**2
    gamma_w = 2.0 * theta  # worst case lambda = -||A||
    for form, ls in zip(SQRT_N_FORMS, (":", "--", "-")):
        ax.plot(
            n,
            bounds.sqrt_n_upper(A_NORM, V_NORM, R_N_PANEL, n, form=form),
            ls,
            color=PALETTE["bound"],
            label=SQRT_N_FORMS[form],
        )
    for c, ls in ((1.0, "-"), (2.0, "--")):
        ax.axhline(
            float(bounds.mean_field_upper(A_NORM, V_NORM, R_N_PANEL, c=c)),
            ls=ls,
            color=PALETTE["fit"],
            lw=0.9,
            label=f"mean-field upper bound, $c'={c:g}$",
        )
    ax.axhline(
        float(bounds.two_dirac_lower(gamma_w, V_NORM)),
        color=PALETTE["masked"],
        lw=0.8,
        ls="-.",
        label=r"two-Dirac optimum $\mathrm{sup}_\varepsilon\,g$",
    )
    for gamma, alpha in ((1.0, 0.45), (2.5, 0.7), (gamma_w, 1.0)):
        ax.plot(
            n,
            bounds.sqrt_n_lower(gamma, n, V_NORM),
            color=PALETTE["unmasked"],
            alpha=alpha,
            label=rf"eigenvector construction, $\gamma={gamma:g}$",
        )
        pk = float(regimes.peak_n(gamma))
        peak = float(bounds.sqrt_n_lower(gamma, pk, V_NORM))
        ax.plot([pk], [peak], "v", ms=3.5, color=PALETTE["unmasked"], alpha=alpha)
    ax.plot(
        n,
        bounds.sequence_lower(gamma_w, n, V_NORM),
        ":",
        color=PALETTE["unmasked"],
        label=rf"$k$-copy construction, $\gamma={gamma_w:g}$",
    )
    nm = n[(n >= 2) & (n <= 2e4)]
    ax.plot(
        nm,
        bounds.masked_sqrt_n_lower(gamma_w, nm, V_NORM),
        color=PALETTE["released"],
        label=rf"causal (masked) construction, $\gamma={gamma_w:g}$",
    )
    n_star = float(regimes.crossover_n(A_NORM, V_NORM, R_N_PANEL, c=1.0))
    _labelled_vline(ax, n_star, rf"$n^*={n_star:.0f}$", y=0.98, right=True)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(0.3, 1e4)
    ax.set_xlabel("number of tokens $n$")
    ax.set_ylabel("Lipschitz bound")
    ax.set_title(rf"(a) against $n$ ($\|A\|=\|V\|=1$, $R={R_N_PANEL:g}$)", loc="left")


#: Background of the labels placed beside a vertical line, so that no curve runs through them.
_LABEL_BOX = {"boxstyle": "square,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.85}


def _labelled_vline(ax, x: float, text: str, *, y: float, right: bool) -> None:
    """A dashed vertical line at ``x`` with ``text`` beside it, on its right or left side.

    ``y`` is the label's height as a fraction of the axes: in the upper half the label hangs
    from it, in the lower half it stands on it.
    """
    ax.axvline(x, color="0.4", lw=0.7, ls="--")
    ax.annotate(
        text,
        (x, y),
        xycoords=("data", "axes fraction"),
        xytext=(2 if right else -2, 0),
        textcoords="offset points",
        fontsize=6.5,
        ha="left" if right else "right",
        va="top" if y > 0.5 else "bottom",
        bbox=_LABEL_BOX,
    )


def _radius_for_n(n: float, c: float) -> float:
    """Radius at which the crossover n*(R) equals n (bisection on the increasing n*)."""
    from theory import regimes

    lo, hi = 1e-3, 10.0
    log_n = math.log(n)
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if float(regimes.crossover_n(A_NORM, V_NORM, mid, c=c, log=True)) < log_n:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _panel_R(ax) -> None:
    from theory import bounds, regimes

    R = np.logspace(-1.3, math.log10(3.0), 300)
    gamma = 2.0 * A_NORM * R**2
    for c, ls in ((1.0, "-"), (2.0, "--")):
        ax.plot(
            R,
            bounds.mean_field_upper(A_NORM, V_NORM, R, c=c),
            ls,
            color=PALETTE["fit"],
            label=f"mean-field upper bound, $c'={c:g}$",
        )
    for two_dirac, ls, label in (
        (bounds.two_dirac_lower, "-", r"two-Dirac optimum $\mathrm{sup}_\varepsilon\,g$"),
        (bounds.two_dirac_half, "--", r"two Diracs at $w=1/2$"),
        (
            bounds.two_dirac_asymptote,
            ":",
            r"two-Dirac asymptote $\frac{3\sqrt{3}}{16}\gamma e^{\gamma/2}$",
        ),
    ):
        ax.plot(R, two_dirac(gamma, V_NORM), ls, color=PALETTE["masked"], label=label)
    ax.plot(
        R,
        np.full_like(R, float(bounds.trivial_lower(V_NORM))),
        color=PALETTE["input"],
        label=r"trivial lower bound $\|V\|$",
    )
    ax.plot(
        R,
        bounds.sqrt_n_upper(A_NORM, V_NORM, R, N_R_PANEL, form="triangle"),
        color=PALETTE["bound"],
        label=SQRT_N_FORMS["triangle"] + f", $n={N_R_PANEL}$",
    )
    ax.fill_between(
        R,
        V_NORM,
        math.sqrt(N_R_PANEL) * V_NORM,
        color=PALETTE["released"],
        alpha=0.15,
        lw=0,
        label=rf"large-$R$ limit, between $\|V\|$ and $\sqrt{{n}}\|V\|$, $n={N_R_PANEL}$",
    )
    r_star = _radius_for_n(N_R_PANEL, 1.0)
    _labelled_vline(ax, r_star, rf"$n^*(R)={N_R_PANEL}$", y=0.02, right=False)
    br = regimes.radius_bracket(L_TARGET, A_NORM, V_NORM, c=1.0)
    ax.axhline(L_TARGET, color="0.6", lw=0.5)
    for r, mk in ((br.R_certified, "o"), (br.R_violated, "x")):
        ax.plot([r], [L_TARGET], mk, color="k", ms=4, mfc="none")
    ax.annotate(
        rf"$L={L_TARGET:g}$: certified for $R\leq{br.R_certified:.2f}$ (o),"
        "\n"
        rf"impossible for $R\geq{br.R_violated:.2f}$ (x)",
        (0.03, 0.97),
        xycoords="axes fraction",
        fontsize=6.5,
        va="top",
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("radius $R$")
    ax.set_title(r"(b) against $R$ ($\lambda=-\|A\|$, $\gamma=2R^2$)", loc="left")


def _panel_regimes(ax) -> None:
    from theory import regimes

    R = np.linspace(0.15, 3.0, 200)
    log10_n = {
        c: np.asarray(regimes.crossover_n(A_NORM, V_NORM, R, c=c, log=True)) / math.log(10)
        for c in (1.0, 2.0)
    }
    for c, ls in ((1.0, "-"), (2.0, "--")):
        ax.plot(R, log10_n[c], ls, color=PALETTE["fit"], label=f"crossover $n^*$, $c'={c:g}$")
    gamma = 2.0 * A_NORM * R**2
    t_star = (3 * gamma + np.sqrt(9 * gamma**2 + 4 * gamma + 4)) / (2 * (1 + gamma))
    ax.plot(
        R,
        np.log10(1.0 + t_star * np.exp(gamma)),
        color=PALETTE["unmasked"],
        label=r"peak of the construction, $1+t^*e^\gamma$",
    )
    n1 = log10_n[1.0]
    top = max(float(n1.max()), 1.0) * 1.05
    ax.fill_between(R, 0, np.clip(n1, 0, None), color=PALETTE["bound"], alpha=0.12, lw=0)
    ax.fill_between(R, np.clip(n1, 0, None), top, color=PALETTE["fit"], alpha=0.08, lw=0)
    ax.text(
        0.97,
        0.05,
        r"$\sqrt{n}$ bound" "\nsmaller",
        transform=ax.transAxes,
        fontsize=6.5,
        ha="right",
    )
    ax.text(0.03, 0.85, "mean-field\nbound smaller", transform=ax.transAxes, fontsize=6.5)
    ax.set_ylim(0, top)
    ax.set_xlabel("radius $R$")
    ax.set_ylabel(r"$\log_{10} n$")
    ax.set_title(r"(c) regimes ($\|A\|=\|V\|=1$)", loc="left")


#: Range of the tightness axis; ranges beyond it end in an arrowhead.
X_MIN, X_MAX = 1e-6, 1e12
_ARROW_ROOM = 2.5

#: Words for the names of the bounds in the verification report (the record keys of
#: :func:`theory.bounds.registry.verified`, read by :mod:`experiments.verify_bounds`): the tick
#: labels of panel (d). "causal" is masked attention; "recalled" a constant recalled, not read in a
#: source (docs/theory.md §15). A name without an entry is shown as it is.
BOUND_WORDS = {
    **{f"sqrt_n_upper[{form}]": words for form, words in SQRT_N_FORMS.items()},
    "multihead_upper[l2,triangle]": r"multi-head $\sqrt{n}$ upper bound ($\ell_2$ over heads)",
    "certified_local": "certified data-dependent upper bound",
    "released_data_dependent": "released code's data-dependent value",
    "released_data_dependent+max_Ax": r"released value, repaired (adds $\mathrm{max}_i\|Ax_i\|$)",
    "mean_field_upper[c'=2]": "mean-field upper bound, $c'=2$",
    "mean_field_upper[c'=1]": "mean-field upper bound, $c'=1$",
    "mean_field_upper[c'=1/2]": "mean-field upper bound, $c'=1/2$ (probe)",
    "mean_field_upper[c'=2,masked]": "mean-field upper bound, $c'=2$, causal",
    "mean_field_upper[c'=1,masked]": "mean-field upper bound, $c'=1$, causal",
    "mean_field_upper[c'=1,masked,Hardy]": "mean-field upper bound, $c'=1$, causal, Hardy factor 2",
    "trivial_lower": r"trivial lower bound $\|V\|$",
    "sqrt_n_lower": "eigenvector construction",
    "masked_sqrt_n_lower": "eigenvector construction, causal",
    "sequence_lower": "$k$-copy construction",
    "two_dirac_lower": r"two-Dirac optimum $\mathrm{sup}_\varepsilon\,g$",
    "two_dirac_g": r"two Diracs at a random mass $\varepsilon$",
    "two_dirac_half": "two Diracs at $w=1/2$",
    "two_dirac_asymptote": "two-Dirac asymptote",
    "mean_field_lower": r"mean-field lower bound $\max(\|V\|,\mathrm{sup}_\varepsilon\,g)$",
    "off_axis_two_atom": "off-axis two atoms",
    "large_radius[limit+deviation]": "large-$R$ limit + deviation bound",
    "large_radius[limit-deviation]": "large-$R$ limit − deviation bound",
    "large_radius_limit": "large-$R$ limit",
    "kim_l2_upper[p=2]": "Kim et al., L2 attention, 2-norm (recalled)",
    "kim_l2_upper[p=2,WQ^2]": r"Kim et al., 2-norm with $\|W^Q\|^2$ (ours)",
    "kim_l2_upper[p=inf]": r"Kim et al., L2 attention, $\infty$-norm (recalled)",
    "kim_softmax_lemma": "Kim et al., softmax lemma",
}

#: What the colours of panel (d) mean (:func:`tightness_colour`), in legend order.
TIGHTNESS_COLOURS = {
    "holds": (PALETTE["bound"], "upper bound, holds on every instance"),
    "fails": (PALETTE["masked"], "bound that fails on some instance"),
    "lower": (PALETTE["unmasked"], "lower bound, holds on every instance"),
}


def bound_words(name: str) -> str:
    """The words of panel (d) for the bound ``name`` of the verification report.

    Parameters
    ----------
    name : str
        A record key of the report (``report["bounds"]``), e.g. ``"sqrt_n_upper[sqrt3]"``.

    Returns
    -------
    str
        Its entry in :data:`BOUND_WORDS`, or ``name`` itself when it has none.
    """
    return BOUND_WORDS.get(name, name)


def tightness_colour(record: dict) -> str:
    """The key of :data:`TIGHTNESS_COLOURS` for one bound record of the verification report.

    Parameters
    ----------
    record : dict
        ``report["bounds"][name]``, with its ``side`` and ``n_violations``.

    Returns
    -------
    str
        ``"fails"`` when the bound failed on at least one instance, whatever its status (a
        refuted candidate, the released heuristic, a violated theorem); otherwise ``"holds"``
        for an upper bound and ``"lower"`` for a lower bound.
    """
    if (record.get("n_violations") or 0) > 0:
        return "fails"
    return "holds" if record["side"] == "upper" else "lower"


def tightness_rows(report: dict) -> tuple[list[tuple], list[str]]:
    """The rows of panel (d) and the bounds left out of it, in report order.

    Parameters
    ----------
    report : dict
        The verification report (``verify_bounds/report.json``).

    Returns
    -------
    rows : list of tuple
        ``(words, min, median, max, colour key)`` of every bound drawn.
    left_out : list of str
        ``"words (reason)"`` of every bound not drawn: a limit (not a bound) or a median that is
        not a positive number (a ratio on a log axis needs one).
    """
    rows, left_out = [], []
    for name, b in report["bounds"].items():
        t = b["tightness"]
        lo, med, hi = (record_float(t[k]) for k in ("min", "median", "max"))
        if b["side"] == "limit":
            left_out.append(f"{bound_words(name)} (a limit, not a bound)")
            continue
        if not np.isfinite(med) or med <= 0:
            reason = "below 0 on most instances" if med <= 0 else "no finite median"
            left_out.append(f"{bound_words(name)} ({reason})")
            continue
        rows.append((bound_words(name), lo, med, hi, tightness_colour(b)))
    return rows, left_out


def _panel_tightness(ax, report: dict) -> None:
    from matplotlib.lines import Line2D

    rows, left_out = tightness_rows(report)
    y = np.arange(len(rows))
    for yi, (_, lo, med, hi, key) in zip(y, rows):
        color = TIGHTNESS_COLOURS[key][0]
        lo_c = min(max(lo, X_MIN), X_MAX) if np.isfinite(lo) else X_MIN
        hi_c = max(min(hi, X_MAX), X_MIN) if np.isfinite(hi) else X_MAX
        # a range that leaves the axis stops short of the frame and ends in an arrowhead
        lo_d = lo_c * _ARROW_ROOM if lo_c <= X_MIN else lo_c
        hi_d = hi_c / _ARROW_ROOM if hi_c >= X_MAX else hi_c
        ax.plot([lo_d, hi_d], [yi, yi], color=color, lw=1.6, alpha=0.6, solid_capstyle="butt")
        if hi_c >= X_MAX:
            ax.plot([hi_d], [yi], ">", color=color, ms=3, alpha=0.9, clip_on=False)
        if lo_c <= X_MIN:
            ax.plot([lo_d], [yi], "<", color=color, ms=3, alpha=0.9, clip_on=False)
        ax.plot([min(max(med, X_MIN), X_MAX)], [yi], "o", color=color, ms=2.5)
    ax.axvline(1.0, color="k", lw=0.6)
    ax.set_xscale("log")
    ax.set_xlim(X_MIN, X_MAX)
    ax.set_xticks(np.logspace(np.log10(X_MIN), np.log10(X_MAX), 7))
    ax.set_yticks(y, [r[0] for r in rows], fontsize=6.5)
    ax.invert_yaxis()
    ax.set_xlabel("bound / certified local Lipschitz\nconstant of the instance")
    ax.set_title(f"(d) tightness over {report['n_instances']} instances", loc="left")
    handles = [
        Line2D([], [], color=c, lw=1.6, alpha=0.6, label=words)
        for c, words in TIGHTNESS_COLOURS.values()
    ] + [
        Line2D([], [], ls="none", marker="o", ms=2.5, color="k", label="median over instances"),
        Line2D(
            [], [], ls="none", marker=">", ms=3, color="k", label="range goes on (e.g. max = ∞)"
        ),
    ]
    title = "bar: min–max over instances; 1: the bound is attained"
    if left_out:
        title += "\nnot shown:" + "".join(f"\n  {words}" for words in left_out)
    ax.legend(
        handles=handles,
        title=title,
        title_fontsize=6.5,
        fontsize=6.5,
        loc="upper right",
        bbox_to_anchor=(1.0, -0.14),
        frameon=False,
        handlelength=2.0,
    )


#: Definitions of the symbols of panels (a)–(c), in a note under the figure.
GLOSSARY = (
    r"$\theta=\|A\|R^2$; $c'$: constant of the exponent $e^{c'\theta}$ of the mean-field upper "
    r"bound; $n^*$: the $n$ at which the $\sqrt{n}$ and mean-field upper bounds are equal;"
    "\n"
    r"$\gamma$: logit gap of the construction ($2\|A\|R^2$ in the worst case); ▼: its peak "
    r"over $n$, at $n-1=t^*e^\gamma$, $t^*\in[1,3)$; $w$: attention weight on the light Dirac;"
    "\n"
    r"$g(\varepsilon)$: value of two Diracs with light mass $\varepsilon$, "
    r"$\mathrm{sup}_\varepsilon\,g$ its maximum. Constants are ours (docs/theory.md), not the "
    "paper's."
)


def draw(results_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """Draw ``fig_theory_bounds.{pdf,png}`` into ``out_dir``.

    Parameters
    ----------
    results_dir : path
        Results root; ``results_dir/verify_bounds/report.json`` adds the tightness panel when it
        exists (the figure is otherwise theory-only and needs no results).
    out_dir : path
        Output directory.

    Returns
    -------
    list of Path
        The PDF and PNG files.
    """
    import matplotlib.pyplot as plt

    report_path = Path(results_dir) / "verify_bounds" / "report.json"
    report = load_json(report_path) if report_path.exists() else None
    with style():
        if report is None:
            fig, (ax_n, ax_R, ax_reg) = plt.subplots(1, 3, figsize=(TWO_COLUMNS, 0.8 * TWO_COLUMNS))
        else:
            # (d) needs the width of its worded rows: the bottom row has its own width ratios
            fig = plt.figure(figsize=(TWO_COLUMNS, 1.5 * TWO_COLUMNS))
            (top,), (bottom,) = fig.subfigures(2, 1, squeeze=False, height_ratios=[1.0, 1.3])
            ax_n, ax_R = top.subplots(1, 2)
            ax_reg, ax_t = bottom.subplots(1, 2, width_ratios=[1.0, 1.4])
            _panel_tightness(ax_t, report)
        _panel_n(ax_n)
        _panel_R(ax_R)
        _panel_regimes(ax_reg)
        for ax in (ax_n, ax_R, ax_reg):
            ax.legend(
                fontsize=6.5,
                loc="upper center",
                bbox_to_anchor=(0.5, -0.2),
                frameon=False,
                handlelength=2.0,
            )
        fig.supxlabel(GLOSSARY, fontsize=6.5, x=0.01, ha="left", multialignment="left")
        return save(fig, Path(out_dir) / STEM)


#: The command line ``python -m paper_figs.fig_theory_bounds --results DIR --out DIR``:
#: :func:`._style.figure_main` with this figure's ``draw``.
main = partial(figure_main, draw, __doc__)


if __name__ == "__main__":
    main()
