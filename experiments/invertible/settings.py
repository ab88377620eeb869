"""Settings of the ``invertible`` stage: the settings dataclass, the presets and ``resolve``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from ..engine import StageConfig, preset_settings

__all__ = ["NAME", "PRESETS", "InvertibleSettings", "resolve"]

NAME = "invertible"


@dataclass(frozen=True)
class InvertibleSettings(StageConfig):
    """Settings of the ``invertible`` stage.

    ``d``: token width; ``heads``: heads of the L2 layer (dividing ``d``); ``n``: tokens;
    ``target``: the certified constant c of both blocks; ``ref_radius``: the ball on which the DP
    block's bound holds; ``radii``: the radii of the inputs; ``seeds``: one pair of random heads
    per seed; ``max_iter``, ``tol``: the fixed-point iteration.
    """

    stage: ClassVar[str] = "invertible"

    d: int
    heads: int
    n: int
    target: float
    ref_radius: float
    radii: tuple[float, ...]
    seeds: tuple[int, ...]
    max_iter: int
    tol: float


_TINY = InvertibleSettings(
    d=4,
    heads=2,
    n=4,
    target=0.5,
    ref_radius=1.0,
    radii=(1.0, 16.0),
    seeds=(0,),
    max_iter=100,
    tol=1e-12,
)
_QUICK = replace(_TINY, radii=(0.5, 1.0, 2.0, 4.0, 8.0, 16.0), seeds=(0, 1, 2), max_iter=300)
#: Each preset is written as what it changes in the one before it.
PRESETS: Mapping[str, InvertibleSettings] = {
    "tiny": _TINY,
    "quick": _QUICK,
    "paper": replace(
        _QUICK,
        radii=(0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0),
        seeds=tuple(range(8)),
        max_iter=1000,
    ),
}


def resolve(preset: str, overrides: Mapping[str, Any]) -> InvertibleSettings:
    """The settings of ``preset`` with ``overrides`` applied and checked (the stage contract)."""
    cfg = preset_settings(PRESETS, preset, overrides)
    if not (0 < float(cfg.target) < 1):
        raise ValueError(f"{NAME}: target must lie in (0, 1), got {cfg.target}")
    if int(cfg.max_iter) < 2:
        raise ValueError(f"{NAME}: max_iter must be at least 2, got {cfg.max_iter}")
    return cfg
