"""Settings of the ``bounded_logits`` stage: the forms, the layer shape, presets, ``resolve``.

The ``quick`` preset (``make demo``) takes about 8 s of CPU time on one thread; the ``paper``
preset runs the full Qwen3-0.6B attention shape (docs/experiments.md, "Bounded logits").
:data:`MEASUREMENT_VERSION` names what a point measures; it is part of the sweep's configuration
and of the result document, so a change of measurement recomputes every point and an older
document is refused by the loader.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from ..engine import Names, StageConfig, preset_settings

__all__ = [
    "FORMS",
    "FORM_LABELS",
    "INPUTS",
    "INPUT_LABELS",
    "MEASUREMENT",
    "MEASUREMENT_VERSION",
    "METHODS",
    "NAME",
    "PRESETS",
    "BoundedLogitsSettings",
    "LayerShape",
    "resolve",
]

NAME = "bounded_logits"

#: The four forms of the layer, in the order of the figure and the report.
FORMS = ("plain", "qk_norm", "softcap", "window")

#: Each form in words (legends, report).
FORM_LABELS: Mapping[str, str] = {
    "plain": "plain dot-product attention",
    "qk_norm": "QK-norm (RMSNorm on q and k)",
    "softcap": "soft-capped logits",
    "window": "sliding window",
}

#: The input constructions (:func:`experiments.bounded_logits.layer.tied_input`), in words.
INPUT_LABELS: Mapping[str, str] = {
    "tied": "tied inputs",
    "null_query": "tied inputs, query in the null space of head 0's Q",
}
INPUTS = tuple(INPUT_LABELS)

#: Methods of :func:`meanfield.local_lipschitz` the stage accepts (``"auto"``: the library's
#: choice, the dense SVD of the assembled Jacobian for the plain form when n·d <= 1500, Lanczos
#: otherwise; ``"dense"`` only with the plain form alone, since the certified bracket of the
#: variants runs on the streaming products, which have no dense method).
METHODS = ("auto", "dense", "lanczos")

#: What a point measures, version 3: the certified call of :func:`meanfield.local_lipschitz`
#: (``certify=True``, the width rule ``upper_prob <= 1.05 lower`` where it applies,
#: ``delta = 1e-6``) on the streaming path for every Krylov estimate, the plain form's included
#: (the stored path only for its dense SVD). Version 2 ran the plain form's Lanczos on the stored
#: path, whose rounding model left ``lower = 0`` at R >= 500 on the ``paper`` layer; version 1
#: (records without this field) measured ``certify=False`` on the residual rule, without a
#: bracket.
MEASUREMENT_VERSION = 3
#: The measurement in words (the loader's refusal of an older result document).
MEASUREMENT = (
    "the certified bracket [lower, upper_prob] of local_lipschitz(certify=True), Krylov "
    "estimates on the streaming path"
)


@dataclass(frozen=True)
class LayerShape(StageConfig):
    """The shape of the random layer: width ``d``, query and key/value heads, head width."""

    stage: ClassVar[str] = "bounded_logits"

    d: int
    n_heads: int
    n_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class BoundedLogitsSettings(StageConfig):
    """Settings of the ``bounded_logits`` stage.

    ``forms`` are names of :data:`FORMS`. ``layer`` is the random layer's shape (``--set
    layer.d=512``); its weights are Gaussian with variance ``1/d`` (``W_Q``, ``W_K``, ``W_V``)
    and ``1/(n_heads * head_dim)`` (``W_O``), drawn from ``seed``, shared by the four forms;
    logit scale ``1/sqrt(head_dim)``; no rotary embedding. The QK-norm form has RMSNorm
    weights 1 and epsilon ``rms_eps`` on q and k (Qwen3's initialisation); the capped form
    caps the scaled logits at ``softcap`` (kappa); the windowed form keeps the ``window`` keys
    tau_i - W < tau_j <= tau_i. Every form is causal.

    At each radius of ``radii``, ``n_inputs`` inputs of ``n`` tokens of norm R of each
    construction of ``inputs`` (names of :data:`INPUTS`,
    :func:`experiments.bounded_logits.layer.tied_input`) are measured with
    :func:`meanfield.local_lipschitz` (``method``; the certified call, Lanczos on the streaming path: the bracket
    ``[lower, upper_prob]`` at confidence 1 - 1e-6, stopping when it is within a factor 1.05).
    Growth exponents are fitted over the radii ``>= large_R``. ``threads``: torch threads of
    each point (``None``: the driver's count).
    """

    stage: ClassVar[str] = "bounded_logits"

    forms: Names
    inputs: Names
    layer: LayerShape
    n: int
    radii: tuple[float, ...]
    n_inputs: int
    softcap: float
    window: int
    rms_eps: float
    large_R: float
    seed: int
    method: str
    threads: int | None


_TINY = BoundedLogitsSettings(
    forms=FORMS,
    inputs=INPUTS,
    layer=LayerShape(d=32, n_heads=2, n_kv_heads=1, head_dim=16),
    n=9,
    radii=(1.0, 10.0, 30.0, 100.0),
    n_inputs=1,
    softcap=50.0,
    window=4,
    rms_eps=1e-6,
    large_R=10.0,
    seed=0,
    method="auto",
    threads=1,
)
#: Presets, each written as what it changes in the one before it.
#:
#: ``tiny`` (tests): d = 32, 2 query heads sharing 1 key/value head of width 16, n = 9 tokens
#: (n·d = 288: the dense SVD for the plain form), 4 radii; both input constructions in every preset.
#:
#: ``quick`` (``make demo``): a reduced Qwen3 shape, d = 256, 4 query heads, 2 key/value heads,
#: head width 64, n = 24 tokens, 8 radii from 1 to 200, one input of each construction per
#: radius; Lanczos. About 8 s of CPU time on one thread (docs/experiments.md, "Bounded logits").
#:
#: ``paper``: Qwen3-0.6B's attention shape, d = 1024, 16 query heads, 8 key/value heads, head
#: width 128, n = 48 tokens, 11 radii from 1 to 1000, 3 inputs of each construction per radius.
PRESETS: Mapping[str, BoundedLogitsSettings] = {
    "tiny": _TINY,
    "quick": replace(
        _TINY,
        layer=LayerShape(d=256, n_heads=4, n_kv_heads=2, head_dim=64),
        n=24,
        radii=(1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0),
        large_R=20.0,
    ),
    "paper": replace(
        _TINY,
        layer=LayerShape(d=1024, n_heads=16, n_kv_heads=8, head_dim=128),
        n=48,
        radii=(1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 300.0, 500.0, 1000.0),
        n_inputs=3,
        large_R=20.0,
        threads=None,
    ),
}


def _names(noun: str, value: str | Sequence[str], known: Sequence[str]) -> tuple[str, ...]:
    """A selection (one name or several) as a tuple; one-line error for unknown or repeated names."""
    names = (value,) if isinstance(value, str) else tuple(value)
    unknown = [f for f in names if f not in known]
    if unknown:
        raise ValueError(f"unknown {noun}(s) {', '.join(unknown)}; known: {', '.join(known)}")
    if not names or len(set(names)) != len(names):
        raise ValueError(f"{noun}s must name distinct {noun}s of {', '.join(known)}, got {names}")
    return names


def resolve(preset: str, overrides: Mapping[str, Any]) -> BoundedLogitsSettings:
    """The settings of ``preset`` with ``overrides`` applied and checked (the stage contract).

    Raises a one-line ``ValueError`` for an unknown form or input, a layer shape that does not split
    into heads, radii that are not strictly increasing positive numbers, fewer than 2 radii at
    or beyond ``large_R``, ``n < 3``, or a bad ``n_inputs``, ``softcap``, ``window``,
    ``rms_eps``, ``method`` (``"dense"`` with a form other than plain) or ``threads``.
    """
    cfg = preset_settings(PRESETS, preset, overrides)
    forms = _names("form", cfg.forms, FORMS)
    inputs = _names("input", cfg.inputs, INPUTS)
    shape = cfg.layer
    if min(shape.d, shape.n_heads, shape.n_kv_heads, shape.head_dim) < 1:
        raise ValueError(f"layer sizes must be >= 1, got {shape.options()}")
    if shape.n_heads % shape.n_kv_heads:
        raise ValueError(
            f"layer.n_heads ({shape.n_heads}) must be a multiple of layer.n_kv_heads "
            f"({shape.n_kv_heads})"
        )
    if shape.d < shape.n_heads + 2:
        raise ValueError(
            f"layer.d ({shape.d}) must exceed layer.n_heads + 1: the tied input needs a direction "
            "orthogonal to every head's query-key vector"
        )
    if "null_query" in inputs and shape.d <= shape.head_dim:
        raise ValueError(
            f"inputs null_query needs layer.d ({shape.d}) > layer.head_dim ({shape.head_dim}): "
            "a query map with a null space"
        )
    radii = [float(r) for r in cfg.radii]
    if not radii or min(radii) <= 0 or sorted(set(radii)) != radii:
        raise ValueError(f"radii must be strictly increasing positive numbers, got {radii}")
    if sum(r >= cfg.large_R for r in radii) < 2:
        raise ValueError(f"at least 2 radii must be >= large_R = {cfg.large_R}, got {radii}")
    if cfg.n < 3:
        raise ValueError(f"n must be >= 3 (the tied input repeats 3 tokens), got {cfg.n}")
    if cfg.n_inputs < 1:
        raise ValueError(f"n_inputs must be >= 1, got {cfg.n_inputs}")
    if not cfg.softcap > 0:
        raise ValueError(f"softcap must be > 0, got {cfg.softcap}")
    if cfg.window < 1:
        raise ValueError(f"window must be >= 1, got {cfg.window}")
    if not cfg.rms_eps >= 0:
        raise ValueError(f"rms_eps must be >= 0, got {cfg.rms_eps}")
    if cfg.method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {cfg.method!r}")
    variants = [f for f in forms if f != "plain"]
    if cfg.method == "dense" and variants:
        raise ValueError(
            f"method dense needs forms plain alone: the certified bracket of {', '.join(variants)} "
            "runs on the streaming products, which have no dense method (use auto or lanczos)"
        )
    if cfg.threads is not None and cfg.threads < 1:
        raise ValueError(f"threads must be >= 1 or null, got {cfg.threads}")
    return replace(cfg, forms=forms, inputs=inputs, radii=tuple(radii))
