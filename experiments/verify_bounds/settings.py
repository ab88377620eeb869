"""Settings of the ``verify_bounds`` stage: the settings dataclass, the presets and ``resolve``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ..engine import Names, StageConfig, preset_settings
from .generation import KINDS

__all__ = [
    "NAME",
    "PRESETS",
    "VerifyBoundsSettings",
    "checked_count",
    "checked_kinds",
    "kind_names",
    "resolve",
]

NAME = "verify_bounds"


@dataclass(frozen=True)
class VerifyBoundsSettings(StageConfig):
    """Settings of the ``verify_bounds`` stage: how many instances, their seed and kinds."""

    stage: ClassVar[str] = NAME

    n_instances: int
    seed: int
    kinds: Names = tuple(KINDS)


PRESETS: dict[str, VerifyBoundsSettings] = {
    "tiny": VerifyBoundsSettings(n_instances=30, seed=0),
    "quick": VerifyBoundsSettings(n_instances=600, seed=0),
    "paper": VerifyBoundsSettings(n_instances=5000, seed=0),
}


def resolve(preset: str, overrides: Mapping[str, Any]) -> VerifyBoundsSettings:
    """The settings of ``preset`` with ``overrides`` applied and checked (the stage contract).

    The presets hold 30, 600 and 5000 instances; ``n_instances``, ``seed`` or ``kinds`` replace
    the preset's entries.
    """
    cfg = preset_settings(PRESETS, preset, overrides)
    checked_count(cfg.n_instances)
    checked_kinds(kind_names(cfg.kinds))
    return cfg


def checked_count(n_instances: int) -> int:
    """``n_instances`` as an int; a one-line ValueError below 1."""
    n = int(n_instances)
    if n < 1:
        raise ValueError(f"n_instances must be >= 1, got {n}")
    return n


def checked_kinds(kinds: Sequence[str] | None) -> tuple[str, ...]:
    """The instance kinds (``None``: all of :data:`KINDS`); a one-line ValueError for an unknown one."""
    kinds = tuple(KINDS if kinds is None else kinds)
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"unknown kind(s) {', '.join(bad)}; choose from {', '.join(KINDS)}")
    return kinds


def kind_names(kinds: Names) -> tuple[str, ...]:
    """A ``kinds`` setting as a tuple of names (one name given alone stands for itself)."""
    return (kinds,) if isinstance(kinds, str) else tuple(kinds)
