"""Settings of the ``kim_tightness`` stage: heads, settings dataclass, presets, ``resolve``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from ..engine import Names, StageConfig, preset_settings

__all__ = ["HEADS", "NAME", "PRESETS", "KimTightnessSettings", "resolve"]

NAME = "kim_tightness"

#: The heads: name -> (D, H, seed, description). Seed ``None``: every weight equal to 1 (the
#: scalar head on which the ∞-norm construction is exact). Otherwise W^Q, W^V, W^O have
#: independent N(0, 1/D) entries drawn from ``numpy.random.default_rng(seed)``.
HEADS: Mapping[str, tuple[int, int, int | None, str]] = {
    "scalar": (1, 1, None, "D = H = 1, W^Q = W^V = W^O = 1"),
    "d4h1": (4, 1, 4, "D = 4, H = 1, random N(0, 1/D) weights (seed 4)"),
    "d8h2": (8, 2, 8, "D = 8, H = 2, random N(0, 1/D) weights (seed 8)"),
}


@dataclass(frozen=True)
class KimTightnessSettings(StageConfig):
    """Settings of the ``kim_tightness`` stage.

    ``heads`` are keys of :data:`HEADS`; ``n_values`` the sequence lengths; ``p2_max_n`` the
    largest N for the 2-norm search (larger N are skipped there, every Jacobian product costing
    O(N^2)); ``n_restarts`` and ``steps`` (∞-norm) and ``p2_restarts`` and ``p2_steps`` (2-norm)
    the search options of :func:`meanfield.attacks.l2_lipschitz_lower`.
    """

    stage: ClassVar[str] = "kim_tightness"

    heads: Names
    n_values: tuple[int, ...]
    p2_max_n: int
    n_restarts: int
    steps: int
    p2_restarts: int
    p2_steps: int
    seed: int


_PAPER_N = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)

_TINY = KimTightnessSettings(
    heads=("scalar", "d4h1"),
    n_values=(2, 3, 5),
    p2_max_n=5,
    n_restarts=1,
    steps=5,
    p2_restarts=0,
    p2_steps=3,
    seed=0,
)
_QUICK = replace(
    _TINY,
    heads=("scalar", "d4h1", "d8h2"),
    n_values=(2, 3, 4, 8, 16, 32, 64),
    p2_max_n=32,
    n_restarts=4,
    steps=100,
    p2_steps=10,
)
#: Each preset is written as what it changes in the one before it.
PRESETS: Mapping[str, KimTightnessSettings] = {
    "tiny": _TINY,
    "quick": _QUICK,
    "paper": replace(
        _QUICK,
        n_values=_PAPER_N,
        p2_max_n=1024,
        n_restarts=16,
        steps=600,
        p2_restarts=1,
        p2_steps=40,
    ),
}


def resolve(preset: str, overrides: Mapping[str, Any]) -> KimTightnessSettings:
    """The settings of ``preset`` with ``overrides`` applied and checked (the stage contract)."""
    return preset_settings(PRESETS, preset, overrides)
