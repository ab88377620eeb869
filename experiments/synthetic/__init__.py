r"""Synthetic theory sweeps behind figures F5, F6, F7 and A (docs/experiments.md).

Everything here is a controlled single head with small :math:`d`; no model, no text. One module
per experiment: :mod:`.sqrt_n_regime` (F5), :mod:`.mean_field` (F6 and A, with the off-axis
and worst-measure searches they share), :mod:`.large_radius` (F7); :mod:`.settings` holds the
presets, the heads and ``resolve``, :mod:`.sweep` ``execute`` (the three parts' rounds joined),
:mod:`.report` ``summary``, ``report_section`` and ``claims``; this door defines ``STAGE`` and
``run``.

Results go to ``results_dir / "synthetic"``: resumable :class:`~experiments.engine.Sweep` files
(``f5_engine``, ``worst_measures``, ``off_axis``, ``f7``: one JSON line per point) and one
assembled sub-result per figure, ``f5``, ``f6``, ``f7`` and ``a`` (``.npz`` arrays + ``.json``
with the key numbers and run metadata). Figures: ``paper_figs/fig_f5_sqrt_n.py``,
``fig_f6_mean_field.py``, ``fig_f7_large_radius.py``, ``fig_a_lipschitz_vs_R.py``.
"""

from __future__ import annotations

from ..engine import ModuleStage
from .report import claims, report_section, summary
from .settings import MF_SETTINGS, NAME, PRESETS, SyntheticSettings, mf_setting, resolve
from .sqrt_n_regime import construction_norm
from .sweep import execute

__all__ = [
    "MF_SETTINGS",
    "NAME",
    "PRESETS",
    "STAGE",
    "SyntheticSettings",
    "claims",
    "construction_norm",
    "execute",
    "mf_setting",
    "report_section",
    "resolve",
    "run",
    "summary",
]

#: The stage (experiments/engine/_stage.py contract).
STAGE = ModuleStage.from_module(__name__, "Synthetic theory sweeps")
#: Run the synthetic sweeps of a preset (:meth:`experiments.engine.ModuleStage.run`).
run = STAGE.run
