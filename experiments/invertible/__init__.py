r"""Experiment stage ``invertible``: inverting residual attention blocks by fixed-point iteration.

For random heads (one seed each) and a list of radii :math:`R`, the stage builds the residual
blocks :math:`x\mapsto x+g(x)` of docs/derivations/invertible.md:

* **L2**: Kim's L2 multi-head attention scaled so that its *global* certified Lipschitz bound
  is ``target`` (:func:`meanfield.invertible.contractive_scale`);
* **DP**: one dot-product head scaled the same way with the bound that holds on the ball of
  radius ``ref_radius`` only (dot-product attention has no global bound).

At every radius the input :math:`x^*` is the tie input of the DP head
(:func:`meanfield.invertible.dot_product_tie_input`: a query at the origin attending evenly to
keys at :math:`\pm Rw`, where the local constant of dot-product attention grows like
:math:`R^2`); both blocks map it to :math:`y=x^*+g(x^*)` and
:func:`meanfield.invertible.invert_fixed_point` inverts :math:`y` from :math:`x_0=y`. Each run
records the residual history, the observed contraction against the certified bound, the local
constant and spectral radius of :math:`Dg(x^*)` (dense, exact at these sizes), and an outcome:
``recovered`` (converged to :math:`x^*`), ``wrong preimage`` (converged to an :math:`x\ne x^*`
with :math:`x+g(x)=y`, checked by mapping it forward) or ``no convergence``.

Results go to ``results_dir/"invertible"``: ``invertible.{npz,json}``, written atomically once
the sweep is complete; a rerun with the same configuration computes nothing.

Modules: :mod:`.settings` (``InvertibleSettings``, ``PRESETS``, ``resolve``), :mod:`.sweep`
(the inversions, the sweep, ``execute``), :mod:`.report` (the loader, ``summary``,
``report_section``, ``claims``); this door defines ``STAGE`` and ``run``.
"""

from __future__ import annotations

from ..engine import ModuleStage
from .report import claims, load, report_section, summary
from .settings import NAME, PRESETS, InvertibleSettings, resolve
from .sweep import MAPS, OUTCOMES, execute, invert_case, random_heads

__all__ = [
    "MAPS",
    "NAME",
    "OUTCOMES",
    "PRESETS",
    "STAGE",
    "InvertibleSettings",
    "claims",
    "execute",
    "invert_case",
    "load",
    "random_heads",
    "report_section",
    "resolve",
    "run",
    "summary",
]

#: The stage (experiments/engine/_stage.py contract).
STAGE = ModuleStage.from_module(__name__, "Invertible residual attention", uses_device=False)
#: Run the sweep of a preset (:meth:`experiments.engine.ModuleStage.run`).
run = STAGE.run
