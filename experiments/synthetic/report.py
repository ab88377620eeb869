"""The ``synthetic`` stage's report: ``summary``, ``report_section`` and ``claims``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..engine import Claim, Claims, load_json, stage_result
from ..markdown import plain, span
from ..verdicts import compare_bound, compare_limit
from .settings import NAME, STEMS

__all__ = ["claims", "report_section", "summary"]


def _load(results_dir: Path, part: str) -> dict[str, Any]:
    return load_json(stage_result(results_dir, NAME, f"{part}.json"))


def summary(results_dir: Path) -> dict[str, Any]:
    """Key numbers of F5, F6, F7 and A, read from the saved results (JSON-able)."""
    out: dict[str, Any] = {p: _load(results_dir, p)["findings"] for p in ("f5", "f6", "f7", "a")}
    run_doc = Path(results_dir) / NAME / "run.json"
    if run_doc.exists():
        r = load_json(run_doc)
        out["preset"] = r["preset"]
        out["seconds"] = r["seconds"]
    return out


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def report_section(results_dir: Path, figures_dir: Path) -> str:
    """Markdown section for ``report.md``: what each figure shows, key numbers, figure links."""
    s = summary(results_dir)
    report_dir = Path(figures_dir).parent

    def link(part: str) -> str:
        stem = STEMS[part]
        rel = os.path.relpath(Path(figures_dir) / f"{stem}.png", report_dir)
        return f"![{stem}]({Path(rel).as_posix()})"

    lines = ["## Synthetic theory sweeps (F5, F6, F7, A)", ""]
    # F5
    lines += [
        "**F5: the √n regime** on the eigenvector construction (docs/theory.md §3; d = 1, "
        "A = −γ/(2R²), V = 1, R = 1, gap exactly γ). Unmasked values are exact (closed-form "
        "reduction of the Jacobian, cross-checked against certified engine brackets); masked "
        "values are certified engine brackets.",
        "",
        "| γ | e^γ | peak n (measured) | peak n (lower-bound formula) | peak value | sup_ε g "
        "| value at n_max / peak | masked at its n_max | masked limit formula "
        "| max value / √n bound | engine check rel. diff |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in s["f5"]["per_gamma"]:
        lines.append(
            f"| {e['gamma']:g} | {_fmt(e['e_gamma'])} | {e['unmasked_peak_n']} | "
            f"{e['peak_n_lower_formula']:.0f} | {_fmt(e['unmasked_peak_value'])} | "
            f"{_fmt(e['sup_g'])} | {_fmt(e['decay_at_n_max'])} | "
            f"{_fmt(e.get('masked_at_n_max', float('nan')))} (n = {e.get('masked_n_max', '–')}) | "
            f"{_fmt(e.get('masked_limit_formula', float('nan')))} | "
            f"{_fmt(e['max_ratio_to_upper_triangle'])} | {e['check_max_rel_diff']:.1e} |"
        )
    per = s["f5"]["per_gamma"]
    t_peak = [e["peak_over_e_gamma"] for e in per]
    ok_low = all(e["min_ratio_to_lower_formula"] >= 1 - 1e-12 for e in per)
    ok_up = all(e["max_ratio_to_upper_triangle"] <= 1 for e in per)
    ok_chk = all(e["check_closed_inside_brackets"] for e in per)
    mono = [e.get("masked_monotone") for e in per if "masked_monotone" in e]
    lines += [
        "",
        f"The exact unmasked constant peaks at n − 1 = {min(t_peak):.2f}–{max(t_peak):.2f} × e^γ "
        f"(the lower-bound formula peaks at t*(γ)e^γ, t* → 3) and then decays (to "
        f"{', '.join(_fmt(e['decay_at_n_max']) for e in per)} of its peak at n_max); it stays "
        f"{'above' if ok_low else 'NOT always above'} the §3 lower-bound formula and "
        f"{'below' if ok_up else 'NOT always below'} the §1 √n bound (triangle form), and the "
        f"closed form {'lies' if ok_chk else 'does NOT always lie'} inside every certified engine "
        f"bracket. Masked values increase with n on the whole grid: "
        f"{'yes' if mono and all(mono) else 'no'} (saturation of docs/theory.md §4, reached only for "
        "n ≫ e^γ; see the limit column).",
        "",
        link("f5"),
        "",
    ]
    # F6
    f6 = s["f6"]
    lines += [
        "**F6: the mean-field regime** (docs/theory.md §5–§6; d = 2, A = diag(1, −0.3), V = I). "
        "sup_ε g against R with the w = ½ form, the asymptote, ‖V‖₂, the upper bounds c′ = 1 "
        "(proved, docs/theory.md §17) and c′ = 2 (our constants, not the paper's), optimized "
        "2–5-atom "
        "measures and the off-axis two-atom bound (§A3).",
        "",
        f"- Optimized measures reach up to {_fmt(f6['max_gain_over_two_dirac'])}× sup_ε g "
        f"(at R = {f6['R_of_max_gain']:g}) and {_fmt(f6['gain_at_largest_R'])}× at the largest "
        f"R; smallest ratio to it: {_fmt(f6['min_ratio_optimized_to_sup_g'])}.",
        f"- Off-axis two atoms (§A3): up to {_fmt(f6['off_axis']['max_gain_over_axis'])}× the "
        f"on-axis optimum (R = {f6['off_axis']['R_of_max_gain']:g}).",
        f"- Upper bound c′ = 1 (proved, docs/theory.md §17): largest optimized/bound ratio {_fmt(f6['max_ratio_to_upper_c1'])} "
        f"({f6['upper_c1_exceeded']} exceedances, {f6['upper_c1_exceeded_certified']} certified); "
        f"c′ = 2: {_fmt(f6['max_ratio_to_upper_c2'])} ({f6['upper_c2_exceeded']} exceedances).",
        "",
        link("f6"),
        "",
    ]
    # F7
    f7 = s["f7"]
    lines += [
        "**F7: large radius** (docs/theory.md §7). ‖Df(RX)‖₂ for random X converges to "
        "‖V‖₂√(max_j N_j), not to √n‖V‖₂; the deviation from the limit stays below our "
        "quantitative bound.",
        "",
        "| map | max_j N_j per input | max rel. error at largest R | deviation bound holds |",
        "|---|---|---|---|",
    ]
    for tag in ("unmasked", "masked"):
        e = f7[tag]
        lines.append(
            f"| {tag} | {', '.join(str(v) for v in e['max_N'])} | "
            f"{e['max_rel_error_at_R_max']:.1e} | {'yes' if e['deviation_bound_holds'] else 'NO'} |"
        )
    lines += ["", link("f7"), ""]
    # A
    lines += [
        "**A: Lipschitz constant against R** (v1 style, docs/theory.md §5–§6): for each setting, the "
        "best optimized measure against sup_ε g and the upper bounds c′ = 1, 2.",
        "",
        "| setting | max gain over sup_ε g (R) | gain at largest R | off-axis / sup_ε g (max) "
        "| off-axis gap / γ* (largest R) "
        "| optimized / c′=1 bound (max) | c′=1 exceeded | optimized / c′=2 bound (max) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    a_json = _load(results_dir, "a")
    big = []
    for key, e in s["a"].items():
        label = a_json["settings"].get(key, key)
        gap_ratio = e["off_axis"].get("gap_over_gamma_star_at_largest_R", float("nan"))
        lines.append(
            f"| {label} | {_fmt(e['max_gain_over_two_dirac'])} ({e['R_of_max_gain']:g}) | "
            f"{_fmt(e['gain_at_largest_R'])} | {_fmt(e['off_axis']['max_gain_over_axis'])} | "
            f"{_fmt(gap_ratio)} | {_fmt(e['max_ratio_to_upper_c1'])} | "
            f"{e['upper_c1_exceeded']} | {_fmt(e['max_ratio_to_upper_c2'])} |"
        )
        if e["max_gain_over_two_dirac"] > 100.0 and e["off_axis"]["max_gain_over_axis"] > 100.0:
            big.append((label, e, gap_ratio))
    lines += [
        "",
        "A gain above 1 means the optimized measures beat the closed-form two-Dirac optimum at "
        "the best on-axis gap γ* (docs/theory.md §5); a ratio above 1 to the c′ = 1 bound would "
        "contradict its proof (docs/theory.md §17).",
    ]
    for label, e, gap_ratio in big:
        lines += [
            "",
            f"*Why the gain reaches {_fmt(e['max_gain_over_two_dirac'])} for {label}.* It is "
            "neither a search artefact nor a violation: the off-axis two-atom closed form "
            "(docs/theory.md §A3) reaches the same value, "
            f"{_fmt(e['off_axis']['max_gain_over_axis'])}× the reference. The reference two-Dirac "
            "optimum puts both atoms on an eigenvector of the symmetric part of A, which is the "
            "best choice only for a symmetric A; this A is far from symmetric, and two atoms off "
            f"those axes see a score gap {_fmt(gap_ratio)}× larger at the largest R. The constant "
            "grows like γ·e^{γ/2} in the gap γ, and γ grows like R², so a gap larger by a fixed "
            "factor gives a gain that grows like exp(c·R²); the reference is a weak lower bound "
            "for a non-symmetric A, and the off-axis and optimized values are the ones to read.",
        ]
    lines += ["", link("a"), ""]
    return "\n".join(lines)


def claims(results_dir: Path) -> Claims:
    """The synthetic rows of the verdict table: the √n, mean-field and large-radius regimes."""
    s = summary(results_dir)
    out = []
    per = s["f5"]["per_gamma"]
    ratios = [e["max_ratio_to_upper_triangle"] for e in per]
    bad = [
        e
        for e in per
        if e["max_ratio_to_upper_triangle"] > 1 or e["min_ratio_to_lower_formula"] < 1 - 1e-12
    ]
    out.append(
        Claim(
            "√n regime: the local constant is O(√n), and the one-token-plus-copies input attains "
            "it up to a constant factor",
            f"the exact constant reaches {span(ratios)} of the proved √n upper bound, and never "
            f"falls below the construction's lower-bound formula (γ = "
            f"{', '.join(format(e['gamma'], 'g') for e in per)})",
            "O(√n), attained",
            compare_bound(len(bad), len(per)),
        )
    )
    f6 = s["f6"]
    exceeded = f6["upper_c1_exceeded_certified"]
    out.append(
        Claim(
            "Mean-field regime: on measures in a ball of radius R the constant is bounded "
            "independently of n, between the two-point lower bound sup_ε g and an upper bound "
            "growing like exp(c′‖A‖₂R²)",
            f"the measures found by search reach {plain(f6['min_ratio_optimized_to_sup_g'])}–"
            f"{plain(f6['max_gain_over_two_dirac'])}× sup_ε g and at most "
            f"{plain(f6['max_ratio_to_upper_c1'])} of the upper bound with c′ = 1 ({exceeded} "
            f"certified exceedances, R = {span(f6['radii'], 'g')})",
            "bounded in n (the paper's c′ was not available to us; c′ = 1 is ours)",
            compare_bound(exceeded, len(f6["radii"])),
        )
    )
    f7 = s["f7"]
    err = max(f7[t]["max_rel_error_at_R_max"] for t in ("unmasked", "masked"))
    holds = all(f7[t]["deviation_bound_holds"] for t in ("unmasked", "masked"))
    out.append(
        Claim(
            "Large radius: as R grows the constant tends to a finite limit, ‖V‖₂√(max_j N_j), not "
            "to √n‖V‖₂",
            f"largest relative error {err:.1e} at the largest R (with and without the causal mask)",
            "a finite limit (the formula is ours: the paper's statement was not available to us)",
            compare_limit(err, bound_holds=holds),
        )
    )
    return Claims(out, [])
