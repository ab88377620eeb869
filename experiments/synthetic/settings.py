"""Settings of the ``synthetic`` stage.

The presets, the mean-field heads and the small helpers shared by its experiments.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..engine import StageConfig, preset_settings, run_metadata, save_npz, write_json

NAME = "synthetic"

#: Figure stems drawn from these results.
STEMS = {
    "f5": "fig_f5_sqrt_n",
    "f6": "fig_f6_mean_field",
    "f7": "fig_f7_large_radius",
    "a": "fig_a_lipschitz_vs_R",
}

#: Settings of figure A (docs/experiments.md); "d2" is also the setting of figure F6.
MF_SETTINGS: dict[str, str] = {
    "d1_pos": "d = 1, A = 1, V = 1",
    "d1_neg": "d = 1, A = -1, V = 1",
    "d2": "d = 2, A = diag(1, -0.3), V = I",
    "gauss": "d = 3, A = QᵀK/√k (Gaussian, k = 3, seed {seed}), V = I",
}
F6_SETTING = "d2"


@dataclass(frozen=True)
class SqrtNSettings(StageConfig):
    """Figure F5, the √n regime: the gaps γ, the radius and the n grids."""

    stage: ClassVar[str] = "synthetic"

    gammas: tuple[float, ...]
    R: float
    n_max: int
    n_points: int
    masked_n_max: int
    check_n: tuple[int, ...]


@dataclass(frozen=True)
class LargeRadiusSettings(StageConfig):
    """Figure F7, the large-radius limit: the inputs and the radius grid."""

    stage: ClassVar[str] = "synthetic"

    n: int
    d: int
    inputs: int
    R_min: float
    R_max: float
    R_points: int


@dataclass(frozen=True)
class MeanFieldSettings(StageConfig):
    """Figures F6 and A, the mean-field regime: the radii, settings and worst-measure searches."""

    stage: ClassVar[str] = "synthetic"

    radii: tuple[float, ...]
    settings: tuple[str, ...]
    a_atoms: tuple[int, ...]
    f6_atoms: tuple[int, ...]
    restarts: int
    steps: int
    off_axis_restarts: int
    off_axis_steps: int
    curve_points: int


@dataclass(frozen=True)
class SyntheticSettings(StageConfig):
    """Settings of the ``synthetic`` stage: the seed, and one group per part (``cfg.f5.R``)."""

    stage: ClassVar[str] = "synthetic"

    seed: int
    f5: SqrtNSettings
    f7: LargeRadiusSettings
    mf: MeanFieldSettings


_TINY = SyntheticSettings(
    seed=0,
    f5=SqrtNSettings(gammas=(2.0,), R=1.0, n_max=40, n_points=6, masked_n_max=40, check_n=(3, 17)),
    f7=LargeRadiusSettings(n=8, d=2, inputs=2, R_min=0.1, R_max=1000.0, R_points=9),
    mf=MeanFieldSettings(
        radii=(1.0, 4.0),
        settings=("d1_neg", "d2"),
        a_atoms=(2, 3),
        f6_atoms=(2, 3),
        restarts=1,
        steps=12,
        off_axis_restarts=1,
        off_axis_steps=20,
        curve_points=60,
    ),
)
_QUICK = _TINY.replace(
    **{
        "f5.gammas": (2.0, 4.0, 6.0),
        "f5.n_max": 2048,
        "f5.n_points": 20,
        "f5.masked_n_max": 1024,
        "f5.check_n": (4, 32, 256),
        "f7.n": 12,
        "f7.d": 3,
        "f7.inputs": 4,
        "f7.R_points": 33,
        "mf.radii": (0.5, 1.06, 2.24, 4.73, 10.0),
        "mf.settings": ("d1_pos", "d1_neg", "d2", "gauss"),
        "mf.a_atoms": (2, 3, 5),
        "mf.f6_atoms": (2, 3, 4, 5),
        "mf.restarts": 4,
        "mf.steps": 100,
        "mf.off_axis_restarts": 4,
        "mf.off_axis_steps": 150,
        "mf.curve_points": 200,
    }
)
#: Each preset is written as what it changes in the one before it.
PRESETS: Mapping[str, SyntheticSettings] = {
    "tiny": _TINY,
    "quick": _QUICK,
    "paper": _QUICK.replace(
        **{
            "f5.n_max": 4096,
            "f5.n_points": 40,
            "f5.masked_n_max": 4096,
            "f5.check_n": (4, 16, 64, 256, 1024),
            "f7.inputs": 6,
            "f7.R_points": 81,
            "mf.radii": tuple(float(r) for r in np.round(np.geomspace(0.5, 10.0, 16), 4)),
            "mf.restarts": 16,
            "mf.steps": 400,
            "mf.off_axis_restarts": 16,
            "mf.off_axis_steps": 400,
            "mf.curve_points": 400,
        }
    ),
}

#: Learning rate of the worst-measure and off-axis searches (library default).
LR = 0.05
#: Relative residual tolerance of the Lanczos solver for the masked F5 points.
F5_TOL = 1e-8


# ============================================================================ helpers


def resolve(preset: str, overrides: Mapping[str, Any]) -> SyntheticSettings:
    """The settings of ``preset`` with ``overrides`` applied and checked (the stage contract).

    Overrides name a group's settings with dots (``{"f5.R": 2.0}``).
    """
    cfg = preset_settings(PRESETS, preset, overrides)
    bad = sorted(set(cfg.mf.settings) - set(MF_SETTINGS))
    if bad:
        raise ValueError(f"unknown mf.settings {bad}; choose from {sorted(MF_SETTINGS)}")
    if F6_SETTING not in cfg.mf.settings:
        raise ValueError(f"mf.settings must include {F6_SETTING!r} (the setting of figure F6)")
    if min(cfg.mf.radii) <= 0 or min(cfg.f5.gammas) <= 0 or cfg.f5.R <= 0:
        raise ValueError("radii and gaps must be positive")
    if cfg.f5.n_max < 2 or not cfg.f5.check_n or min(cfg.f5.check_n) < 2:
        raise ValueError("F5 needs n >= 2")
    if min(cfg.mf.a_atoms + cfg.mf.f6_atoms) < 2:
        raise ValueError("worst-measure searches need at least 2 atoms")
    if not 0 < cfg.f7.R_min < cfg.f7.R_max:
        raise ValueError("need 0 < f7.R_min < f7.R_max")
    return cfg


def int_grid(lo: int, hi: int, k: int) -> np.ndarray:
    """Unique integers of a geometric grid from ``lo`` to ``hi`` (both included)."""
    return np.unique(np.round(np.geomspace(lo, hi, max(int(k), 2))).astype(np.int64))


def mf_setting(name: str, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    r"""Score and value matrices :math:`(A, V)` of a mean-field setting of :data:`MF_SETTINGS`.

    ``"gauss"``: :math:`A = Q^\top K/\sqrt k` with :math:`Q, K` standard Gaussian
    :math:`k\times d` (:math:`k = d = 3`) drawn by ``torch.Generator().manual_seed(seed)``, and
    :math:`V = I` (our reading of docs/experiments.md "a random Gaussian :math:`A/\sqrt k`").
    """
    if name == "d1_pos":
        return np.array([[1.0]]), np.eye(1)
    if name == "d1_neg":
        return np.array([[-1.0]]), np.eye(1)
    if name == "d2":
        return np.diag([1.0, -0.3]), np.eye(2)
    if name == "gauss":
        import torch

        g = torch.Generator().manual_seed(int(seed))
        k = d = 3
        Q = torch.randn(k, d, generator=g, dtype=torch.float64)
        K = torch.randn(k, d, generator=g, dtype=torch.float64)
        return (Q.T @ K / math.sqrt(k)).numpy(), np.eye(d)
    raise ValueError(f"unknown setting {name!r}; choose from {sorted(MF_SETTINGS)}")


def head_params64(A: np.ndarray, V: np.ndarray, device: str):
    """One float64 head with score matrix ``A`` and value matrix ``V`` on ``device``."""
    import torch

    from meanfield import AttentionParams

    return AttentionParams(
        torch.as_tensor(A, dtype=torch.float64, device=device),
        torch.as_tensor(V, dtype=torch.float64, device=device),
    )


def spectral_norm_np(A: np.ndarray) -> float:
    """Spectral norm of a numpy matrix (float64 SVD)."""
    return float(np.linalg.norm(np.asarray(A, dtype=np.float64), 2))


def part_metadata(cfg: SyntheticSettings, device: str, part: str) -> dict[str, Any]:
    """Run metadata of one part (``"f5"``, ``"f7"``, ``"mf"``): the seed and the part's settings."""
    entries = {"seed": cfg.seed, part: getattr(cfg, part).options()}
    return run_metadata(
        seed=cfg.seed, device=device, dtype="float64", config={"preset_entries": entries}
    )


def save_part(
    out: Path, part: str, arrays: Mapping[str, Any], doc: Mapping[str, Any], meta: Mapping[str, Any]
) -> list[Path]:
    """Write ``out/<part>.npz`` and ``out/<part>.json`` (``doc`` with the run metadata ``meta``)."""
    json_doc = {**doc, "metadata": meta}
    return [save_npz(out / f"{part}.npz", **arrays), write_json(out / f"{part}.json", json_doc)]
