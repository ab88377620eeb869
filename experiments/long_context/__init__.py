r"""Experiment stage ``long_context``: the mean-field regime on real text, at long n.

For real attention layers (SmolLM2-135M up to its 8192 positions, all-MiniLM-L6-v2 up to its
512, the random GPT-2 with its position table extended), the stage captures the hidden states
entering the layer on windows of real text of n tokens and estimates the local Lipschitz
constant of the layer's attention map there (:func:`meanfield.local_lipschitz`, certified
default call, streaming beyond a memory budget), several windows per length, to see whether the
constant stops growing with n: the plateau rule of :mod:`.plateau` (a bootstrap interval of the
fitted exponent over the lengths ``>= m`` containing 0). Each layer is set against the
mean-field upper bound of :func:`theory.bounds.mean_field_upper` at the measured radius.

Results go to ``results_dir/"long_context"``: one resumable sweep per (model, layer),
``<model>_L<layer>.jsonl``, one record per window, and ``long_context.json``, the assembled
layers. The stage has presets ``tiny`` and ``long`` only: ``meanfield reproduce --preset long``
runs it alone, and the ``quick`` and ``paper`` presets leave it out. docs/long_context.md.

Modules: :mod:`.settings` (the models, ``LongContextSettings``, ``PRESETS``, ``resolve``),
:mod:`.plateau` (the plateau rule), :mod:`.sweep` (:func:`long_point`, :func:`long_facts`,
``execute``), :mod:`.report` (the loader, ``summary``, ``report_section``, ``claims``); this
door defines ``STAGE`` and ``run``.
"""

from __future__ import annotations

from ..engine import ModuleStage
from .plateau import ExponentFit, Plateau, bootstrap_exponent, fit_exponent, plateau_start
from .report import answer, claims, load_layers, report_section, summary
from .settings import (
    MODELS,
    NAME,
    PRESETS,
    LongContextSettings,
    LongModel,
    ModelPlan,
    resolve,
    window_starts,
)
from .sweep import RESULTS, execute, layer_bound, long_facts, long_point

__all__ = [
    "MODELS",
    "NAME",
    "PRESETS",
    "RESULTS",
    "STAGE",
    "ExponentFit",
    "LongContextSettings",
    "LongModel",
    "ModelPlan",
    "Plateau",
    "answer",
    "bootstrap_exponent",
    "claims",
    "execute",
    "fit_exponent",
    "layer_bound",
    "load_layers",
    "long_facts",
    "long_point",
    "plateau_start",
    "report_section",
    "resolve",
    "run",
    "summary",
    "window_starts",
]

#: The stage (experiments/engine/_stage.py contract).
STAGE = ModuleStage.from_module(__name__, "The mean-field regime on real text: long contexts")
#: Run the windows of a preset (:meth:`experiments.engine.ModuleStage.run`).
run = STAGE.run
