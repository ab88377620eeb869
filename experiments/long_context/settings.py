"""Settings of the ``long_context`` stage: the models, the settings dataclass, presets, ``resolve``.

The ``long`` preset (the real run, ``meanfield reproduce --preset long``) is predicted to take
about 55 minutes on 2 quiet CPU cores (at most about 90); :data:`PRESETS` says how its time was
predicted. The stage has no
``quick`` or ``paper`` preset, so ``make demo`` and ``meanfield reproduce --preset paper`` leave
it out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from ..engine import Names, StageConfig, preset_settings

__all__ = [
    "MODELS",
    "NAME",
    "PRESETS",
    "LongContextSettings",
    "LongModel",
    "ModelPlan",
    "model_plans",
    "resolve",
    "window_starts",
]

NAME = "long_context"


@dataclass(frozen=True)
class LongModel:
    """One model of the stage: how it is loaded, its mask and its position limit.

    Attributes
    ----------
    id : str
        The model's name in the settings (``models=``) and in file names.
    key : str
        The name :func:`meanfield.models.load_model` knows, or ``"tiny-gpt2"``: a two-layer
        GPT-2 of width 64 (:func:`meanfield.models.tiny_config`, seeded random init) with the
        MiniLM WordPiece tokenizer, for the ``tiny`` preset and the tests.
    masked : bool
        Causal attention.
    positions : int or None
        Position limit of the trained model, a hard limit (a learned table has no rows beyond
        it, a rotary model was trained up to it); ``None``: the random GPT-2, whose table is
        extended to the longest length asked for (``load_model(..., n_positions=...)``).
    label : str
        Name in the report and the figure.
    """

    id: str
    key: str
    masked: bool
    positions: int | None
    label: str = ""


#: The models, by id. SmolLM2 and MiniLM are the offline stand-ins of docs/experiments.md;
#: ``gpt2`` is the paper's random GPT-2 (seed 0) with its position table extended beyond 1024;
#: ``gpt2_tiny`` a two-layer GPT-2 of width 64, for the ``tiny`` preset and the tests.
MODELS: Mapping[str, LongModel] = {
    "smollm2": LongModel("smollm2", "smollm2", True, 8192, label="SmolLM2-135M"),
    "minilm": LongModel("minilm", "minilm", False, 512, label="all-MiniLM-L6-v2"),
    "gpt2": LongModel("gpt2", "gpt2-random", True, None, label="GPT-2 small shapes, random init"),
    "gpt2_tiny": LongModel(
        "gpt2_tiny", "tiny-gpt2", True, None, label="tiny GPT-2 (d = 64, 4 heads), random init"
    ),
}


@dataclass(frozen=True)
class ModelPlan(StageConfig):
    """What is measured on one model: its ``layers`` and the window ``lengths`` (tokens)."""

    stage: ClassVar[str] = "long_context"

    layers: tuple[int, ...]
    lengths: tuple[int, ...]


@dataclass(frozen=True)
class LongContextSettings(StageConfig):
    """Settings of the ``long_context`` stage.

    ``models`` are ids of :data:`MODELS`, run in that order; each has its group of settings,
    ``<id>.layers`` and ``<id>.lengths`` (``--set smollm2.lengths=512,1024``). Every length gets
    ``n_windows`` windows of the corpus (``"kjv"``, ``"pydoc"`` or a text file), consecutive
    and non-overlapping, one running pointer per model over its lengths in increasing order.
    ``seed`` seeds the random start of every estimate (so ``upper_prob`` holds at confidence
    1 - 1e-6 over that draw) and the random GPT-2. ``dtype`` is the dtype of the captured
    hidden states and of the estimate. ``memory_budget`` (bytes) is passed to
    :func:`meanfield.local_lipschitz`: beyond it ``path="auto"`` streams the products in memory
    linear in n. ``max_iter`` caps the Lanczos steps (``None``: the library's 300). ``threads``:
    torch threads of each point (``None``: the driver's count). The plateau rule uses
    ``n_boot`` bootstrap resamples seeded with ``boot_seed`` and needs ``min_lengths`` lengths
    at or beyond its start (docs/long_context.md).
    """

    stage: ClassVar[str] = "long_context"

    models: Names
    smollm2: ModelPlan
    minilm: ModelPlan
    gpt2: ModelPlan
    gpt2_tiny: ModelPlan
    corpus: str
    n_windows: int
    seed: int
    dtype: str
    memory_budget: int
    max_iter: int | None
    threads: int | None
    n_boot: int
    boot_seed: int
    min_lengths: int


_TINY = LongContextSettings(
    models=("gpt2_tiny",),
    # the real models' plans, which the tiny preset does not run: those of ``long``
    smollm2=ModelPlan(layers=(15,), lengths=(512, 1024, 2048, 4096, 8192)),
    minilm=ModelPlan(layers=(0, 3), lengths=(64, 128, 256, 512)),
    gpt2=ModelPlan(layers=(6,), lengths=(512, 1024, 2048, 4096, 8192)),
    gpt2_tiny=ModelPlan(layers=(1,), lengths=(8, 16, 32, 64)),
    corpus="kjv",
    n_windows=3,
    seed=0,
    dtype="float64",
    # 128 KiB: the tiny GPT-2's 4 heads store their matrices up to n = 32 (64 KiB) and stream at
    # n = 64 (256 KiB), so the tiny run goes through both paths
    memory_budget=2**17,
    max_iter=None,
    threads=1,
    n_boot=2000,
    boot_seed=0,
    min_lengths=3,
)
#: Presets. ``tiny`` (tests; about 10 s of CPU time): the tiny GPT-2 at n = 8…64.
#:
#: ``long`` (the real run, ``meanfield reproduce --preset long``): SmolLM2 layer 15 (the middle
#: of 30) at n = 512, 1024, 2048, 4096, 8192 (its trained limit); MiniLM layers 0 and 3 at
#: n = 64, 128, 256, 512 (512 is MiniLM's hard limit: its learned position table has 512 rows);
#: the random GPT-2's layer 6 at n = 512, 1024, 2048, 4096, 8192 (its position table extended
#: beyond 1024); 3 windows per length, float64, the library's memory budget (2**30 bytes: the
#: stored path up to n = 2048, streaming at 4096 and 8192).
#:
#: Predicted time: about 5300 s of CPU time, about 55 min of wall time on 2 quiet CPU cores (at
#: most about 90 min if the two torch threads did not share the work at all). How: CPU times of
#: the default certified call measured on 2026-11-26 on one window each (2 torch threads; the
#: machine was busy, so CPU time rather than wall time): SmolLM2 L15 at n = 4096, 16 products,
#: 134 s (capture 13 s), and at 8192 a 10-product check (``max_iter=4``) took 217 s for the whole
#: command (load, capture, setup, products, certification); the random GPT-2 L6 at n = 1024,
#: 48 products, 84 s, and 10-product checks at 2048 (37 s stored, 29 s streaming) and 4096
#: (76 s) for the whole command. With the cost of a product growing like n² from 2048 on, about
#: 24 products at SmolLM2's 8192 and 50 for every GPT-2 window, a window takes: SmolLM2 10-40 s
#: up to 2048, 150 s at 4096, 320 s at 8192; GPT-2 20-90 s up to 2048, 200 s at 4096, 790 s at
#: 8192; MiniLM under 10 s. Three windows each: SmolLM2 about 1600 s, GPT-2 about 3500 s
#: (8192: 2400 s), MiniLM about 200 s. GPT-2 at 16384 would add about 9500 s: left out
#: (``--set gpt2.lengths=...`` adds it). docs/long_context.md, "The long preset". Each preset is
#: written as what it changes in the one before it.
PRESETS: Mapping[str, LongContextSettings] = {
    "tiny": _TINY,
    "long": replace(
        _TINY,
        models=("smollm2", "minilm", "gpt2"),
        memory_budget=2**30,
        threads=None,
    ),
}


def resolve(preset: str, overrides: Mapping[str, Any]) -> LongContextSettings:
    """The settings of ``preset`` with ``overrides`` applied and checked (the stage contract).

    Raises a one-line ``ValueError`` for an unknown model, a length beyond a model's position
    limit, lengths that are not strictly increasing positive integers, a layer below 0, or a bad
    ``n_windows``, ``dtype``, ``memory_budget``, ``threads``, ``n_boot`` or ``min_lengths``.
    """
    cfg = preset_settings(PRESETS, preset, overrides)
    models = (cfg.models,) if isinstance(cfg.models, str) else tuple(cfg.models)
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise ValueError(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    if not models:
        raise ValueError("models is empty: name at least one of " + ", ".join(MODELS))
    for m in models:
        plan: ModelPlan = getattr(cfg, m)
        lengths = [int(v) for v in plan.lengths]
        if not lengths or min(lengths) < 2 or sorted(set(lengths)) != lengths:
            raise ValueError(
                f"{m}.lengths must be strictly increasing integers >= 2, got {list(plan.lengths)}"
            )
        limit = MODELS[m].positions
        if limit is not None and lengths[-1] > limit:
            raise ValueError(
                f"{m}.lengths: n = {lengths[-1]} exceeds the model's {limit} positions "
                "(a hard limit)"
            )
        if not plan.layers or min(plan.layers) < 0:
            raise ValueError(f"{m}.layers must be a non-empty list of layers >= 0")
    if cfg.n_windows < 1:
        raise ValueError(f"n_windows must be >= 1, got {cfg.n_windows}")
    if cfg.dtype not in ("float32", "float64"):
        raise ValueError(f"dtype must be 'float32' or 'float64', got {cfg.dtype!r}")
    if cfg.memory_budget < 0:
        raise ValueError(f"memory_budget must be >= 0 bytes, got {cfg.memory_budget}")
    if cfg.threads is not None and cfg.threads < 1:
        raise ValueError(f"threads must be >= 1 or null, got {cfg.threads}")
    if cfg.max_iter is not None and cfg.max_iter < 1:
        raise ValueError(f"max_iter must be >= 1 or null, got {cfg.max_iter}")
    if cfg.n_boot < 100:
        raise ValueError(f"n_boot must be >= 100, got {cfg.n_boot}")
    if cfg.min_lengths < 2:
        raise ValueError(f"min_lengths must be >= 2, got {cfg.min_lengths}")
    return replace(cfg, models=models)


def model_plans(cfg: LongContextSettings) -> list[tuple[LongModel, ModelPlan]]:
    """The models of ``cfg`` with their plans, in the order of ``cfg.models``."""
    names = (cfg.models,) if isinstance(cfg.models, str) else tuple(cfg.models)
    return [(MODELS[m], getattr(cfg, m)) for m in names]


def window_starts(lengths: tuple[int, ...], n_windows: int) -> dict[int, list[int]]:
    """The start of each window of each length: one running pointer over the lengths, in order.

    Windows of one length are consecutive; the next length starts where they end, so no two
    windows of a model overlap. Returns ``{n: [start of window 0, 1, ...]}``.
    """
    out, p = {}, 0
    for n in lengths:
        out[int(n)] = [p + w * int(n) for w in range(n_windows)]
        p += n_windows * int(n)
    return out
