r"""Experiment stage ``bounded_logits``: the local Lipschitz constant against the input radius R.

One random causal attention layer of Qwen3-like shape (grouped key/value heads, output
projection, no rotary embedding) in four forms sharing its weights: plain dot-product attention,
QK-norm, soft-capped logits and a sliding window. At each radius R the stage measures
:math:`\|J\|_2` of each form with the certified call of
:func:`meanfield.local_lipschitz` (the value and its certified bracket ``[lower, upper_prob]``,
confidence 1 − δ; every Lanczos estimate on the streaming path, whose rounding analysis covers
the variants)
at two constructions of tied inputs of radius R (:func:`.layer.tied_input`), where the plain form's
constant keeps growing like :math:`R^2` (and, with a query in the null space of a head's query
map, the QK-norm one like :math:`R`), fits the growth exponent over the large radii, and sets each form against its
bound (:mod:`.bounds`). The verdict row asks whether bounded logits stop the large-radius
growth.

Results go to ``results_dir/"bounded_logits"``: one resumable sweep ``points.jsonl`` (one
record per form, radius and input) and ``bounded_logits.json``, the assembled curves. Presets
``tiny`` (tests), ``quick`` (``make demo``, a reduced shape) and ``paper`` (Qwen3-0.6B's
attention shape). docs/experiments.md, "Bounded logits".

Modules: :mod:`.settings` (``BoundedLogitsSettings``, ``PRESETS``, ``resolve``), :mod:`.layer`
(the layer, its forms, the tied input, the exponent fit), :mod:`.bounds` (the bounds drawn),
:mod:`.sweep` (:func:`bl_point`, ``execute``), :mod:`.report` (the loader, ``summary``,
``report_section``, ``claims``); this door defines ``STAGE`` and ``run``.
"""

from __future__ import annotations

from ..engine import ModuleStage
from .bounds import form_bound, plain_bound, variant_bound
from .layer import (
    FAMILIES,
    growth_exponent,
    head_facts,
    largest_logit,
    layer_params,
    layer_weights,
    tied_input,
)
from .report import QUESTION, STOPS, answer, claims, load_results, report_section, summary
from .settings import (
    FORM_LABELS,
    FORMS,
    INPUT_LABELS,
    INPUTS,
    MEASUREMENT,
    MEASUREMENT_VERSION,
    METHODS,
    NAME,
    PRESETS,
    BoundedLogitsSettings,
    LayerShape,
    resolve,
)
from .sweep import RESULTS, SWEEP, assemble, bl_facts, bl_point, execute

__all__ = [
    "FAMILIES",
    "FORMS",
    "FORM_LABELS",
    "INPUTS",
    "INPUT_LABELS",
    "MEASUREMENT",
    "MEASUREMENT_VERSION",
    "METHODS",
    "NAME",
    "PRESETS",
    "QUESTION",
    "RESULTS",
    "STAGE",
    "STOPS",
    "SWEEP",
    "BoundedLogitsSettings",
    "LayerShape",
    "answer",
    "assemble",
    "bl_facts",
    "bl_point",
    "claims",
    "execute",
    "form_bound",
    "growth_exponent",
    "head_facts",
    "largest_logit",
    "layer_params",
    "layer_weights",
    "load_results",
    "plain_bound",
    "report_section",
    "resolve",
    "run",
    "summary",
    "tied_input",
    "variant_bound",
]

#: The stage (experiments/engine/_stage.py contract); CPU only.
STAGE = ModuleStage.from_module(
    __name__, "Bounded logits: the constant against the input radius", uses_device=False
)
#: Run the points of a preset (:meth:`experiments.engine.ModuleStage.run`).
run = STAGE.run
