"""Settings of the ``synthetic`` stage.

The presets, the mean-field heads and the small helpers shared by its experiments.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..engine import StageConfig, preset_config, run_metadata, save_npz, write_json

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
class SyntheticSettings(StageConfig):
    """Settings of the ``synthetic`` stage.

    The prefix names the figure a setting serves: ``f5_``, ``f7_``, ``mf_`` (F6 and A), ``a_``,
    ``f6_``; the others are shared.
    """

    stage: ClassVar[str] = "synthetic"

    seed: int
    f5_gammas: tuple[float, ...]
    f5_R: float
    f5_n_max: int
    f5_n_points: int
    f5_masked_n_max: int
    f5_check_n: tuple[int, ...]
    f7_n: int
    f7_d: int
    f7_inputs: int
    f7_R_min: float
    f7_R_max: float
    f7_R_points: int
    mf_radii: tuple[float, ...]
    mf_settings: tuple[str, ...]
    a_atoms: tuple[int, ...]
    f6_atoms: tuple[int, ...]
    restarts: int
    steps: int
    off_axis_restarts: int
    off_axis_steps: int
    curve_points: int


_TINY = SyntheticSettings(
    seed=0,
    f5_gammas=(2.0,),
    f5_R=1.0,
    f5_n_max=40,
    f5_n_points=6,
    f5_masked_n_max=40,
    f5_check_n=(3, 17),
    f7_n=8,
    f7_d=2,
    f7_inputs=2,
    f7_R_min=0.1,
    f7_R_max=1000.0,
    f7_R_points=9,
    mf_radii=(1.0, 4.0),
    mf_settings=("d1_neg", "d2"),
    a_atoms=(2, 3),
    f6_atoms=(2, 3),
    restarts=1,
    steps=12,
    off_axis_restarts=1,
    off_axis_steps=20,
    curve_points=60,
)
_QUICK = replace(
    _TINY,
    f5_gammas=(2.0, 4.0, 6.0),
    f5_n_max=2048,
    f5_n_points=20,
    f5_masked_n_max=1024,
    f5_check_n=(4, 32, 256),
    f7_n=12,
    f7_d=3,
    f7_inputs=4,
    f7_R_points=33,
    mf_radii=(0.5, 1.06, 2.24, 4.73, 10.0),
    mf_settings=("d1_pos", "d1_neg", "d2", "gauss"),
    a_atoms=(2, 3, 5),
    f6_atoms=(2, 3, 4, 5),
    restarts=4,
    steps=100,
    off_axis_restarts=4,
    off_axis_steps=150,
    curve_points=200,
)
#: Each preset is written as what it changes in the one before it.
PRESETS: Mapping[str, SyntheticSettings] = {
    "tiny": _TINY,
    "quick": _QUICK,
    "paper": replace(
        _QUICK,
        f5_n_max=4096,
        f5_n_points=40,
        f5_masked_n_max=4096,
        f5_check_n=(4, 16, 64, 256, 1024),
        f7_inputs=6,
        f7_R_points=81,
        mf_radii=tuple(float(r) for r in np.round(np.geomspace(0.5, 10.0, 16), 4)),
        restarts=16,
        steps=400,
        off_axis_restarts=16,
        off_axis_steps=400,
        curve_points=400,
    ),
}

#: Learning rate of the worst-measure and off-axis searches (library default).
_LR = 0.05
#: Relative residual tolerance of the Lanczos solver for the masked F5 points.
_F5_TOL = 1e-8


# ============================================================================ helpers


def resolve(preset: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of ``preset`` with ``overrides`` applied and checked (the stage contract)."""
    cfg = preset_config(PRESETS, preset, overrides, what=f"{NAME} option(s)")
    for k, v in overrides.items():
        cfg[k] = list(v) if isinstance(v, (tuple, list, np.ndarray)) else v
    bad = sorted(set(cfg["mf_settings"]) - set(MF_SETTINGS))
    if bad:
        raise ValueError(f"unknown mf_settings {bad}; choose from {sorted(MF_SETTINGS)}")
    if F6_SETTING not in cfg["mf_settings"]:
        raise ValueError(f"mf_settings must include {F6_SETTING!r} (the setting of figure F6)")
    if min(cfg["mf_radii"]) <= 0 or min(cfg["f5_gammas"]) <= 0 or cfg["f5_R"] <= 0:
        raise ValueError("radii and gaps must be positive")
    if cfg["f5_n_max"] < 2 or not cfg["f5_check_n"] or min(cfg["f5_check_n"]) < 2:
        raise ValueError("F5 needs n >= 2")
    if min(cfg["a_atoms"] + cfg["f6_atoms"]) < 2:
        raise ValueError("worst-measure searches need at least 2 atoms")
    if not 0 < cfg["f7_R_min"] < cfg["f7_R_max"]:
        raise ValueError("need 0 < f7_R_min < f7_R_max")
    return cfg


def _int_grid(lo: int, hi: int, k: int) -> np.ndarray:
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


def _params(A: np.ndarray, V: np.ndarray, device: str):
    import torch

    from meanfield import AttentionParams

    t = {"dtype": torch.float64, "device": device}
    return AttentionParams(torch.as_tensor(A, **t), torch.as_tensor(V, **t))


def _spec(A: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(A, dtype=np.float64), 2))


def _subset(cfg: Mapping[str, Any], *prefixes: str) -> dict[str, Any]:
    return {k: v for k, v in cfg.items() if k == "seed" or any(k.startswith(p) for p in prefixes)}


def part_metadata(cfg: Mapping[str, Any], device: str, *prefixes: str) -> dict[str, Any]:
    """Run metadata of one part (F5, F6, F7, A): the seed and the preset entries it reads."""
    entries = _subset(cfg, *prefixes)
    return run_metadata(
        seed=int(cfg["seed"]), device=device, dtype="float64", config={"preset_entries": entries}
    )


def save_part(
    out: Path, part: str, arrays: Mapping[str, Any], doc: Mapping[str, Any], meta: Mapping[str, Any]
) -> list[Path]:
    """Write ``out/<part>.npz`` and ``out/<part>.json`` (``doc`` with the run metadata ``meta``)."""
    json_doc = {**doc, "metadata": meta}
    return [save_npz(out / f"{part}.npz", **arrays), write_json(out / f"{part}.json", json_doc)]
