r"""Experiment stage ``kim_tightness``: the tightness in N of Kim et al.'s L2-attention bounds.

For a few fixed heads of L2 multi-head attention (:func:`meanfield.attention.l2_self_attention`)
and a logarithmic grid of sequence lengths N, the stage measures lower bounds on the global
Lipschitz constants in the :math:`\infty`-norm and the 2-norm of the flattened input (the local
Jacobian norm at inputs found by :func:`meanfield.attacks.l2_lipschitz_lower`, started from the
closed-form construction of docs/theory.md §8a) and sets them against
:func:`theory.bounds.kim_l2_upper` (p = ∞; p = 2 with ``wq_power`` 1 and 2). It records the
ratio upper / lower, its growth with N, and a fit of the ∞-norm lower bound against the predicted
growth :math:`\log N-\log\log N` (more precisely :math:`W_0((N - 1)/e)`).

Results go to ``results_dir/"kim_tightness"``: one ``head_<name>.{npz,json}`` per head, written
atomically once complete; a rerun skips a head whose files exist with the same configuration.
Each (head, N) is a point of the sweep ``head_<name>_points.jsonl`` (:func:`kim_point`), queued
with the other stages' points in a distributed run and resumed point by point.
docs/experiments.md, "Tightness of Kim et al.'s bounds".

Modules: :mod:`.settings` (the heads, ``KimTightnessSettings``, ``PRESETS``, ``resolve``),
:mod:`.sweep` (:func:`kim_point`, :func:`head_results`, ``execute``), :mod:`.report` (the
loader, ``summary``, ``report_section``, ``claims``); this door defines ``STAGE`` and ``run``.
"""

from __future__ import annotations

from ..engine import ModuleStage
from .report import claims, load_heads, report_section, summary
from .settings import HEADS, NAME, PRESETS, KimTightnessSettings, resolve
from .sweep import execute, fit_growth, head_params, head_results, kim_point

__all__ = [
    "HEADS",
    "NAME",
    "PRESETS",
    "STAGE",
    "KimTightnessSettings",
    "claims",
    "execute",
    "fit_growth",
    "head_params",
    "head_results",
    "kim_point",
    "load_heads",
    "report_section",
    "resolve",
    "run",
    "summary",
]

#: The stage (experiments/engine/_stage.py contract).
STAGE = ModuleStage.from_module(
    __name__, "Tightness of Kim et al.'s L2-attention bounds", uses_device=False
)
#: Run the heads of a preset (:meth:`experiments.engine.ModuleStage.run`).
run = STAGE.run
