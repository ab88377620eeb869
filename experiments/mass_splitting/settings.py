"""Settings of the ``attacks`` stage: one group per figure, the presets and ``resolve``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ..engine import StageConfig, preset_settings

__all__ = [
    "NAME",
    "PRESETS",
    "FigureBSettings",
    "FigureCSettings",
    "MassSplittingSettings",
    "resolve",
]

NAME = "attacks"


@dataclass(frozen=True)
class FigureBSettings(StageConfig):
    """Figure B, the worst-case measures: the keyword arguments of :func:`figure_b_results`."""

    stage: ClassVar[str] = "attacks"

    radii: tuple[float, ...]
    n_atoms: int
    n_restarts: int
    steps: int


@dataclass(frozen=True)
class FigureCSettings(StageConfig):
    """Figure C, mass splitting: the keyword arguments of :func:`figure_c_results`.

    ``R_attack`` and ``k_max`` keep the defaults of :func:`figure_c_results` unless set.
    """

    stage: ClassVar[str] = "attacks"

    radii: tuple[float, ...]
    k_curve_max: int
    budgets: tuple[float, ...]
    n_restarts: int
    steps: int
    R_attack: float = 4.0
    k_max: int = 4


@dataclass(frozen=True)
class MassSplittingSettings(StageConfig):
    """Settings of the ``attacks`` stage: one group per figure (``cfg.figure_b.radii``) and the seed.

    A group's settings are set with dots (``--set figure_b.steps=50``) or as a mapping
    (``--set figure_b={...}``), which replaces only the settings it names.
    """

    stage: ClassVar[str] = "attacks"

    figure_b: FigureBSettings
    figure_c: FigureCSettings
    seed: int


PRESETS: Mapping[str, MassSplittingSettings] = {
    "tiny": MassSplittingSettings(
        figure_b=FigureBSettings(radii=(1.0, 4.0), n_atoms=3, n_restarts=2, steps=25),
        figure_c=FigureCSettings(
            radii=(2.0, 4.0), k_curve_max=1000, budgets=(0.1, 0.5), n_restarts=1, steps=15
        ),
        seed=0,
    ),
    "quick": MassSplittingSettings(
        figure_b=FigureBSettings(radii=(1.0, 2.0, 4.0, 6.0), n_atoms=3, n_restarts=6, steps=150),
        figure_c=FigureCSettings(
            radii=(2.0, 3.0, 4.0, 5.0),
            k_curve_max=100_000,
            budgets=(0.05, 0.1, 0.2, 0.5, 1.0),
            n_restarts=1,
            steps=60,
        ),
        seed=0,
    ),
    "paper": MassSplittingSettings(
        figure_b=FigureBSettings(
            radii=(0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0), n_atoms=5, n_restarts=32, steps=400
        ),
        figure_c=FigureCSettings(
            radii=(2.0, 3.0, 4.0, 5.0, 6.0),
            k_curve_max=1_000_000,
            budgets=(0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0),
            n_restarts=4,
            steps=200,
        ),
        seed=0,
    ),
}


def resolve(preset: str, overrides: Mapping[str, Any]) -> MassSplittingSettings:
    """The settings of ``preset`` with ``overrides`` merged and checked (the stage contract)."""
    return preset_settings(PRESETS, preset, overrides)
