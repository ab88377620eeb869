"""Settings of the ``adversarial`` stage.

The configurations of the paper's table, the presets and their resolution into per-configuration
settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from ..engine import StageConfig, preset_settings

NAME = "adversarial"
#: The paper's grid ``range(2, 100, 5)`` (docs/experiments.md).
PAPER_N_GRID: tuple[int, ...] = tuple(range(2, 100, 5))
VARIANTS = ("released", "symmetric")


@dataclass(frozen=True)
class AdvConfig:
    r"""One row of the paper's adversarial table (docs/experiments.md) and its stand-in.

    Attributes
    ----------
    id : str
        Short identifier (file stem of the results).
    paper_model : str
        The paper's model, as in docs/experiments.md
    paper_layer, head : int
        The paper's layer and the head whose score matrix builds the construction.
    R : float
        The paper's radius (norm of token 1).
    seed : int
        The paper's seed; here the seed of the random model (``gpt2_rand``) and of the random start
        of the Lanczos solver.
    map : {"heads", "heads+WO"}
        Differentiated map (docs/experiments.md "adversarial" rows).
    masked : bool
        Explicit causal mask.
    standin, standin_layer : str, int
        Offline stand-in (a :func:`meanfield.models.load_model` key) and its layer.
    paper_C : float
        The constant of the paper's printed curve :math:`C\sqrt n` (hand-set, defect D7).
    paper_file : str
        The released figure file.
    remark : str
        What differs from the paper's run.
    """

    id: str
    paper_model: str
    paper_layer: int
    head: int
    R: float
    seed: int
    map: str
    masked: bool
    standin: str
    standin_layer: int
    paper_C: float
    paper_file: str
    remark: str


CONFIGS: dict[str, AdvConfig] = {
    c.id: c
    for c in (
        AdvConfig(
            "bert_enc",
            "BERT-enc (bert-base-uncased)",
            0,
            0,
            15.5,
            457,
            "heads",
            False,
            "minilm",
            0,
            4.39,
            "bert_0_adversarial_data.pdf",
            "BertSelfAttention map (no W_O), unmasked, as released (D2)",
        ),
        AdvConfig(
            "bert_dec",
            'BERT-"dec" (bert-base-uncased, is_decoder)',
            6,
            7,
            21.5,
            457,
            "heads",
            True,
            "minilm",
            3,
            5.73,
            "bert_1_adversarial_data.pdf",
            "explicit causal mask: a genuinely masked run, unlike the released one (D3); "
            "stand-in layer 3 plays the middle layer",
        ),
        AdvConfig(
            "gpt2_rand",
            "GPT-2-rand (GPT2Model(GPT2Config()), seed 320)",
            6,
            0,
            100.0,
            320,
            "heads+WO",
            True,
            "gpt2-random",
            6,
            0.92,
            "gpt_random_adversarial_data.pdf",
            "the paper's own architecture and seed, eval mode, explicit causal mask; heads "
            "sliced correctly (D5 does not apply to the random run's shapes but is fixed anyway)",
        ),
        AdvConfig(
            "gpt2",
            "GPT-2 (gpt2, pretrained)",
            0,
            0,
            10.0,
            320,
            "heads+WO",
            True,
            "smollm2",
            0,
            46.9,
            "gpt_pretrained_adversarial_data.pdf",
            "head sliced correctly (the released A was not a head, D5); with SmolLM2 the "
            "construction ignores RoPE, so its gap is approximate for this map",
        ),
    )
}

_WORST_CASE_DEFAULT = {
    "d": 2,
    "R": 3.0,
    "A_norm": 1.0,
    "seed": 0,
    "n_grid": [2, 4, 8, 16, 32],
    "n_restarts": 4,
    "steps": 150,
    "lr": 0.05,
}


@dataclass(frozen=True)
class AdversarialSettings(StageConfig):
    """Settings of the ``adversarial`` stage (see :func:`run` for their meaning)."""

    stage: ClassVar[str] = "adversarial"

    configs: tuple[str, ...]
    models: Mapping[str, str]
    layers: Mapping[str, int]
    heads: Mapping[str, int]
    radii: Mapping[str, float]
    n_grid: tuple[int, ...]
    variants: tuple[str, ...]
    worst_case: Mapping[str, Any] | None
    tol: float
    max_iter: int | None
    torch_threads: int | None


_TINY = AdversarialSettings(
    configs=("gpt2_rand", "bert_enc"),
    models={"gpt2_rand": "gpt2-random-tiny", "bert_enc": "bert-random-tiny"},
    layers={"gpt2_rand": 1, "bert_enc": 0},
    heads={},
    radii={},
    n_grid=(2, 5, 12),
    variants=tuple(VARIANTS),
    worst_case={**_WORST_CASE_DEFAULT, "n_grid": [2, 4], "n_restarts": 1, "steps": 20},
    tol=1e-6,
    max_iter=None,
    torch_threads=1,
)
_QUICK = replace(
    _TINY,
    models={},
    layers={},
    n_grid=(2, 12, 27, 52, 97),
    worst_case={**_WORST_CASE_DEFAULT, "n_grid": [2, 4, 8, 16], "n_restarts": 2, "steps": 60},
)
#: Presets. Measured wall times (2 cores shared with other jobs, load average 5-6, so inflated):
#: tiny about 4 s; quick 49 s (25 s CPU) including the model loads; paper 2 min 29 s (2 min 4 s
#: CPU) for the four configurations (160 points, SmolLM2 load included) and the worst-case search.
#: Each preset is written as what it changes in the one before it.
PRESETS: Mapping[str, AdversarialSettings] = {
    # tests: tiny random GPT-2 and BERT configs (d = 32), seconds
    "tiny": _TINY,
    # the paper's random GPT-2 and the MiniLM stand-in of BERT-enc on five lengths
    "quick": _QUICK,
    # the four configurations on the paper's grid, and the worst-case search
    "paper": replace(
        _QUICK,
        configs=tuple(CONFIGS),
        n_grid=tuple(PAPER_N_GRID),
        worst_case=dict(_WORST_CASE_DEFAULT),
    ),
}

TINY_MODEL_KEYS = ("gpt2-random-tiny", "bert-random-tiny")


def resolve(preset: str, overrides: Mapping[str, Any]) -> AdversarialSettings:
    """The settings of ``preset`` with ``overrides`` applied and checked (the stage contract).

    ``n_grid`` comes back sorted without repeats, and ``worst_case`` (unless None) as a plain
    mapping with the defaults of the settings it leaves out.
    """
    cfg = preset_settings(PRESETS, preset, overrides)
    configs = list(cfg.configs)
    bad = [c for c in configs if c not in CONFIGS]
    if bad or not configs:
        raise ValueError(
            f"configs must be a non-empty subset of {', '.join(CONFIGS)}, got {configs}"
        )
    for key in ("models", "layers", "heads", "radii"):  # the per-configuration settings
        extra = sorted(set(getattr(cfg, key)) - set(CONFIGS))
        if extra:
            raise ValueError(f"{key} names unknown configuration(s) {', '.join(extra)}")
    grid = [int(n) for n in cfg.n_grid]
    if not grid or min(grid) < 2:
        raise ValueError(
            f"n_grid must be a non-empty list of integers >= 2, got {list(cfg.n_grid)}"
        )
    variants = list(cfg.variants)
    if not variants or any(v not in VARIANTS for v in variants):
        raise ValueError(f"variants must be a non-empty subset of {VARIANTS}, got {variants}")
    wc = None
    if cfg.worst_case is not None:
        # the plain JSON shape (lists), as hashed into the worst-case sweep's key
        wc = {**_WORST_CASE_DEFAULT, **cfg.options()["worst_case"]}
        extra = sorted(set(wc) - set(_WORST_CASE_DEFAULT))
        if extra:
            raise ValueError(f"unknown worst_case key(s) {', '.join(extra)}")
    return replace(cfg, n_grid=tuple(sorted(set(grid))), worst_case=wc)


def config_settings(c: AdvConfig, cfg: AdversarialSettings) -> dict[str, Any]:
    """Everything that determines the records of one configuration (hashed into point keys)."""
    model = cfg.models.get(c.id, c.standin)
    # the pretrained stand-ins are shallower than the paper's models (MiniLM 6 layers; SmolLM2's
    # layer 0 is the paper's layer 0); random and real models have the paper's depth
    if model in TINY_MODEL_KEYS:
        default_layer = 0
    elif model in ("minilm", "smollm2"):
        default_layer = c.standin_layer
    else:
        default_layer = c.paper_layer
    return {
        "config": c.id,
        "model": model,
        "layer": int(cfg.layers.get(c.id, default_layer)),
        "head": int(cfg.heads.get(c.id, c.head)),
        "R": float(cfg.radii.get(c.id, c.R)),
        "seed": c.seed,
        "map": c.map,
        "masked": c.masked,
        "n_grid": list(cfg.n_grid),
        "variants": list(cfg.variants),
        "tol": cfg.tol,
        "max_iter": cfg.max_iter,
        "estimator": "meanfield.lipschitz.local_lipschitz (float64)",
    }
