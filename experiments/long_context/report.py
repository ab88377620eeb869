"""The report of the ``long_context`` stage: loader, ``summary``, ``report_section``, ``claims``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..engine import Claim, Claims, load_json
from ..markdown import number as _fmt
from ..markdown import plain
from ..verdicts import compare_number
from .settings import MODELS, NAME

__all__ = ["answer", "claims", "load_layers", "report_section", "summary"]

_RESULTS = "long_context.json"

#: The question of the stage's row of the verdict table.
QUESTION = "does the constant plateau on real models, and from which n?"


def load_layers(results_dir: str | Path) -> dict[str, dict[str, Any]]:
    """The measured layers, ``"<model>_L<layer>" -> entry`` (``{}`` when the stage has not run).

    Each entry holds the window records, the per-length medians, the plateau analysis
    (``plateau``), the mean-field bound (``bound``) and the layer's facts (docs/long_context.md).
    """
    path = Path(results_dir) / NAME / _RESULTS
    if not path.exists():
        return {}
    return dict(load_json(path).get("layers") or {})


def _ten(log10: float) -> str:
    """``10^k`` written plainly (``1.2e+03`` below 10^6, ``10^43.2`` above)."""
    if not math.isfinite(log10):
        return "–"
    return f"{10.0**log10:.3g}" if log10 < 6 else f"10^{log10:.1f}"


def answer(entry: Mapping[str, Any]) -> str:
    """The plain-words answer of one layer: the plateau start or "no plateau seen", and its fit."""
    p = entry["plateau"]
    fits = p["fits"]
    lengths = entry["lengths"]
    if not fits:
        return (
            f"too few lengths ({len(lengths)}) for the rule, which needs {p['min_lengths']} "
            "at or beyond its start"
        )
    if p["m"] is None:
        last = fits[-1]
        return (
            f"no plateau seen up to n = {lengths[-1]}: over n ≥ {last['m']} the constant still "
            f"grows like n^{plain(last['exponent'], '.2f')} (95 % interval "
            f"{plain(last['low'], '.2f')} to {plain(last['high'], '.2f')})"
        )
    fit = next(f for f in fits if f["m"] == p["m"])
    return (
        f"plateau from n = {p['m']} (lengths {', '.join(map(str, fit['lengths']))}: exponent "
        f"{plain(fit['exponent'], '.2f')}, 95 % interval {plain(fit['low'], '.2f')} to "
        f"{plain(fit['high'], '.2f')})"
    )


def summary(results_dir: str | Path) -> dict[str, Any]:
    """Per layer: the lengths, the plateau start, the last fit, the largest constant and bound."""
    out: dict[str, Any] = {}
    for key, e in load_layers(results_dir).items():
        fits = e["plateau"]["fits"]
        out[key] = {
            "label": e["label"],
            "lengths": e["lengths"],
            "plateau_m": e["plateau"]["m"],
            "exponent_last": fits[-1]["exponent"] if fits else None,
            "median_value": e["median"]["value"],
            "R": e["bound"]["R"],
            "bound_log10": e["bound"]["log10"],
            "bound_over_measured_log10": e["bound"]["log10_ratio"],
            "answer": answer(e),
        }
    return out


def _limit_note(e: Mapping[str, Any]) -> str:
    spec = MODELS.get(e["model"])
    if spec is not None and spec.positions is not None:
        return f"{spec.positions} positions, a hard limit"
    return "position table extended (random rows beyond 1024)"


def _bound_caveat(e: Mapping[str, Any]) -> str:
    """Why the bound is a reference rather than a theorem for this layer (empty: a theorem)."""
    why = [
        w
        for w, on in (
            ("a causal mask", e["masked"]),
            ("rotary embeddings", e.get("rotary")),
            ("a query bias (key logit term)", e.get("query_bias")),
        )
        if on
    ]
    if not why:
        return ""
    return (
        f"; the theorem covers none of {' and '.join(why)}, so for this layer the formula is a "
        "reference, not a proved bound"
    )


def report_section(results_dir: str | Path, figures_dir: str | Path) -> str:
    """Markdown for ``report.md``: per layer, the medians per length, the fits and the bound."""
    layers = load_layers(results_dir)
    figs = Path(figures_dir).name
    lines = ["## The mean-field regime on real text: long contexts", ""]
    if not layers:
        return "\n".join(lines + ["No results."]) + "\n"
    lines += [
        "The local Lipschitz constant ‖J‖₂ of one attention layer (heads and output "
        "projection) at the hidden states of real text windows, at lengths far beyond the "
        "paper's, to see whether it stops growing with n (the mean-field regime). Every window "
        "is estimated by `meanfield.local_lipschitz` with its certified default call (seeded "
        "random start; `lower` certified, `upper_prob` at confidence 1 − 10⁻⁶ over that start; "
        "the streaming path beyond the memory budget). The plateau rule: the constant has "
        "stopped growing from m on when the least-squares exponent of log ‖J‖₂ against log n "
        "over every window at the lengths ≥ m (at least 3 of them) has a 95 % bootstrap "
        "interval (windows resampled within each length) containing 0; m is the smallest "
        "such length (docs/long_context.md).",
        "",
    ]
    for e in layers.values():
        med = e["median"]
        lines += [
            f"**{e['label']}, layer {e['layer']}** ({'causal' if e['masked'] else 'bidirectional'}"
            f"{', rotary' if e.get('rotary') else ''}; {_limit_note(e)}; "
            f"{e['n_windows']} windows per length)",
            "",
            "| n | median ‖J‖₂ | median lower | median upper_prob | largest R | path |",
            "|---:|---:|---:|---:|---:|---|",
        ]
        paths = e["records"]["path"]
        ns = e["records"]["n"]
        for i, n in enumerate(med["n"]):
            used = sorted({p for p, m in zip(paths, ns, strict=True) if m == n})
            lines.append(
                f"| {n} | {_fmt(med['value'][i])} | {_fmt(med['lower'][i])} | "
                f"{_fmt(med['upper_prob'][i])} | {_fmt(med['R'][i])} | {', '.join(used)} |"
            )
        fits = e["plateau"]["fits"]
        if fits:
            lines += ["", "| from m | lengths | exponent | 95 % interval | contains 0 |"]
            lines.append("|---:|---|---:|---|---|")
            for f in fits:
                lines.append(
                    f"| {f['m']} | {', '.join(map(str, f['lengths']))} | "
                    f"{plain(f['exponent'], '.3f')} | {plain(f['low'], '.3f')} to "
                    f"{plain(f['high'], '.3f')} | {'yes' if f['contains_zero'] else 'no'} |"
                )
        b = e["bound"]
        lines += [
            "",
            f"Answer: {answer(e)}. Mean-field upper bound (c′ = 1, summed over heads with the "
            f"norms of their W_O blocks) at the largest measured radius R = {_fmt(b['R'])}: "
            f"{_ten(b['log10'])}, {_ten(b['log10_ratio'])} times the largest measured constant"
            + _bound_caveat(e)
            + ".",
            "",
        ]
    lines += [f"![long contexts]({figs}/fig_long_context.png)", ""]
    return "\n".join(lines) + "\n"


def claims(results_dir: str | Path) -> Claims:
    """One row per measured layer: does the constant plateau, and from which n.

    The verdict is ``stand-in`` (rule 4 of :mod:`experiments.verdicts`): the paper measured no
    long contexts, and these models are not its own (the random GPT-2's positions beyond 1024
    are ours), so nothing is compared.
    """
    layers = load_layers(results_dir)
    rows = []
    for e in layers.values():
        rows.append(
            Claim(
                f"Mean-field regime on real text ({e['label']} L{e['layer']}, n = "
                f"{e['lengths'][0]}…{e['lengths'][-1]}): {QUESTION}",
                answer(e),
                "n-free bound for bounded R (no long-context measurement)",
                compare_number(None, same_model=False),
            )
        )
    notes = []
    if rows:
        notes.append(
            "*Plateau (long-context rows).* The constant has stopped growing from m on when the "
            "exponent of ‖J‖₂ against n fitted over the lengths ≥ m (at least 3) has a 95 % "
            "bootstrap interval containing 0; m is the smallest such length "
            "(docs/long_context.md). MiniLM stops at 512 tokens, its hard position limit."
        )
    return Claims(rows, notes)
