"""Experiment stage ``attacks``: worst-case measures (figure B) and mass splitting (figure C).

Figure B: for two heads (d = 1 with A = 1, d = 2 with A = diag(1, -0.3); V = I) and a list of
radii, the measure with a few atoms in B_R whose mean-field local constant is largest
(:func:`meanfield.attacks.worst_case_measure`), next to the closed-form two-Dirac bound.
Figure C: the gain G_k of duplicating an atom into k copies before moving them, and finite
W₂-budget attacks (move only, or split then move) with exact W₂ and W∞ on both sides.

:func:`figure_b_results` and :func:`figure_c_results` do the work (``meanfield attack search
--figure-b`` and ``meanfield attack split --figure-c`` call them too); :data:`STAGE` gives them
presets for ``meanfield reproduce``. Results go to ``results_dir/"attacks"``:
``worst_measures.{npz,json}`` and ``mass_splitting.{npz,json}``. In the stage, each point (a
setting and radius of figure B, an input and budget of figure C) is a task with its own record in
``worst_measures_points.jsonl`` / ``mass_splitting_points.jsonl``, so a distributed run queues
them with the other stages' points (docs/cluster.md) and an interrupted run redoes only the
points in flight; each figure's files are written atomically once all its points are done, and a
rerun skips a figure whose files exist with the same configuration.

Modules: :mod:`.settings` (one settings group per figure, ``PRESETS``, ``resolve``),
:mod:`.sweep` (the points and files of both figures, ``execute``), :mod:`.report`
(``summary``, ``report_section``, ``claims``); this door defines ``STAGE`` and ``run``.
"""

from __future__ import annotations

from ..engine import ModuleStage
from .report import claims, report_section, summary
from .settings import (
    NAME,
    PRESETS,
    FigureBSettings,
    FigureCSettings,
    MassSplittingSettings,
    resolve,
)
from .sweep import (
    ATTACK_INPUTS,
    FIG_B_SETTINGS,
    attack_doc,
    attack_inputs,
    execute,
    figure_b_results,
    figure_c_results,
    mass_splitting_point,
    measure_doc,
    worst_measure_point,
)

__all__ = [
    "ATTACK_INPUTS",
    "FIG_B_SETTINGS",
    "NAME",
    "PRESETS",
    "STAGE",
    "FigureBSettings",
    "FigureCSettings",
    "MassSplittingSettings",
    "attack_doc",
    "attack_inputs",
    "claims",
    "execute",
    "figure_b_results",
    "figure_c_results",
    "mass_splitting_point",
    "measure_doc",
    "report_section",
    "resolve",
    "run",
    "summary",
    "worst_measure_point",
]

#: The stage (experiments/engine/_stage.py contract).
STAGE = ModuleStage.from_module(
    __name__, "Worst-case measures and mass splitting", uses_device=False
)
#: Run the figure-B and figure-C sweeps of a preset (:meth:`experiments.engine.ModuleStage.run`).
run = STAGE.run
