"""The stages of ``meanfield reproduce`` and the figures drawn from their results.

Both lists hold direct references (a stage object, a figure's ``draw`` function), so a type
checker sees the contract of :class:`experiments.engine.Stage` and of every ``draw``. A figure
names the stage whose results it reads by that stage's object, not by a string.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments import (
    adversarial,
    bounded_logits,
    invertible,
    kim_tightness,
    long_context,
    mass_splitting,
    real_data,
    synthetic,
    verify_bounds,
)
from experiments.engine import Stage
from paper_figs import (
    fig_a_lipschitz_vs_R,
    fig_b_worst_measures,
    fig_bounded_logits,
    fig_c_mass_splitting,
    fig_f1_lipschitz_vs_n,
    fig_f2_lipschitz_vs_radius,
    fig_f3_radius_vs_n,
    fig_f4_adversarial,
    fig_f5_sqrt_n,
    fig_f6_mean_field,
    fig_f7_large_radius,
    fig_invertible,
    fig_kim_tightness,
    fig_long_context,
    fig_theory_bounds,
)

from .options import UsageError

__all__ = ["FIGURES", "STAGES", "Figure", "select_figures", "select_stages"]


#: Every stage, in the order ``reproduce`` runs them.
STAGES: tuple[Stage, ...] = (
    real_data.STAGE,
    adversarial.STAGE,
    synthetic.STAGE,
    mass_splitting.STAGE,
    verify_bounds.STAGE,
    invertible.STAGE,
    kim_tightness.STAGE,
    long_context.STAGE,
    bounded_logits.STAGE,
)


def select_stages(only: Iterable[str] | None, *, preset: str | None = None) -> list[Stage]:
    """The stages named in ``only`` (all when ``None``); UsageError on an unknown name.

    With ``preset``, only the stages that have that preset: a stage without it (the
    ``long_context`` stage has no ``quick`` or ``paper`` preset, the others no ``long``) is
    skipped when ``only`` is ``None``, and a UsageError when ``only`` names it.
    """
    if only is None:
        return [s for s in STAGES if preset is None or preset in s.presets]
    wanted = [s.strip() for s in only if s.strip()]
    names = {s.name: s for s in STAGES}
    unknown = [w for w in wanted if w not in names]
    if unknown:
        raise UsageError(f"unknown stage(s) {', '.join(unknown)}; known: {', '.join(names)}")
    lacking = [w for w in wanted if preset is not None and preset not in names[w].presets]
    if lacking:
        raise UsageError(
            f"stage(s) {', '.join(lacking)} have no preset {preset!r} ("
            + "; ".join(f"{w}: {', '.join(names[w].presets)}" for w in lacking)
            + ")"
        )
    return [names[w] for w in wanted]


# ------------------------------------------------------------------------------------ figures
@dataclass(frozen=True)
class Figure:
    """One figure: its id, its ``draw(results, out_dir)``, the stage it reads, and a title."""

    id: str
    draw_fn: Callable[[Path, Path], Any]
    stage: Stage
    title: str
    #: ``draw_fn`` takes the stage's own directory (figures B and C) rather than the results root.
    stage_dir: bool = False

    def draw(self, results_dir: Path, out_dir: Path) -> list[Path]:
        """Draw this figure into ``out_dir``; FileNotFoundError when its results are missing."""
        src = results_dir / self.stage.name if self.stage_dir else results_dir
        if self.stage_dir and not src.is_dir():
            raise FileNotFoundError(
                f"no results in {src}; run `meanfield reproduce --only {self.stage.name}`"
            )
        return [Path(p) for p in self.draw_fn(src, out_dir)]


#: Every figure of ``meanfield figures``; ids as in docs/experiments.md (F1–F7, A–C, T for
#: the theory figure, I for invertible attention, K for the tightness of Kim et al.'s bounds,
#: L for the long contexts, M for the bounded logits).
FIGURES: tuple[Figure, ...] = (
    Figure("F1", fig_f1_lipschitz_vs_n.draw, real_data.STAGE, "real data: Lipschitz constant vs n"),
    Figure(
        "F2",
        fig_f2_lipschitz_vs_radius.draw,
        real_data.STAGE,
        "real data: Lipschitz constant vs mean radius",
    ),
    Figure("F3", fig_f3_radius_vs_n.draw, real_data.STAGE, "real data: mean radius vs n"),
    Figure(
        "F4",
        fig_f4_adversarial.draw,
        adversarial.STAGE,
        "adversarial inputs: Lipschitz constant vs n",
    ),
    Figure("F5", fig_f5_sqrt_n.draw, synthetic.STAGE, "synthetic √n regime"),
    Figure("F6", fig_f6_mean_field.draw, synthetic.STAGE, "mean-field regime"),
    Figure("F7", fig_f7_large_radius.draw, synthetic.STAGE, "large radius"),
    Figure("A", fig_a_lipschitz_vs_R.draw, synthetic.STAGE, "Lipschitz constant vs R (v1 style)"),
    Figure(
        "B",
        fig_b_worst_measures.draw,
        mass_splitting.STAGE,
        "worst-case measures",
        stage_dir=True,
    ),
    Figure("C", fig_c_mass_splitting.draw, mass_splitting.STAGE, "mass splitting", stage_dir=True),
    Figure("T", fig_theory_bounds.draw, verify_bounds.STAGE, "bounds and regimes (theory)"),
    Figure("I", fig_invertible.draw, invertible.STAGE, "invertible residual attention"),
    Figure("K", fig_kim_tightness.draw, kim_tightness.STAGE, "tightness of Kim et al.'s bounds"),
    Figure("L", fig_long_context.draw, long_context.STAGE, "real text at long contexts"),
    Figure(
        "M",
        fig_bounded_logits.draw,
        bounded_logits.STAGE,
        "bounded logits: Lipschitz constant vs R, four forms",
    ),
)


def select_figures(only: Iterable[str] | None) -> list[Figure]:
    """The figures with the ids in ``only`` (all when ``None``); UsageError on an unknown id."""
    if only is None:
        return list(FIGURES)
    wanted = [s.strip() for s in only if s.strip()]
    by_id = {f.id.lower(): f for f in FIGURES}
    unknown = [w for w in wanted if w.lower() not in by_id]
    if unknown:
        raise UsageError(
            f"unknown figure id(s) {', '.join(unknown)}; known: {', '.join(f.id for f in FIGURES)}"
        )
    return [by_id[w.lower()] for w in wanted]
