r"""Verification harness: every bound of :mod:`theory.bounds` against the certified engine.

For random instances and adversarial constructions (dimensions :math:`d \in \{1, \dots, 4\}`,
:math:`n` up to 14 tokens, radii from 0.3 to 100, masked and unmasked, one head or several heads
with or without :math:`W^O`, uniform sequences and weighted measures) the harness computes the
certified bracket ``lower <= exact <= upper`` of the relevant local constant with
:func:`meanfield.lipschitz.local_lipschitz` (``method="dense"``, float64; Gram iteration
certified by Cholesky, docs/theory.md §16) and checks

* every **upper** bound: ``bound >= lower`` (the engine's certified lower end), and
* every **lower** bound, evaluated at the very input it is a lower bound for (the eigenvector
  construction at that sequence, :math:`g(\varepsilon)` at that two-Dirac measure, the off-axis
  value at that two-atom measure, ...): ``bound <= upper`` (the certified upper end),

both up to :data:`BOUND_RTOL`, the float64 evaluation error of the closed forms. Kim et al.'s L2
bounds are checked against :func:`meanfield.lipschitz.local_lipschitz_fn` on
:func:`meanfield.attention.l2_self_attention` (2-norm) and against the exact
:math:`\infty`-norm of the dense Jacobian.

The bounds checked, with their side and *status*, are the verified records of
:mod:`theory.bounds.registry` (:data:`BOUNDS`, see docs/theory.md §15):

``theorem``
    A result with a complete derivation (provenance *standard*, *derived*, *derived and checked
    numerically*). A failure is a **violation**: it is listed with the full instance (seed,
    index, kind, d, n, R, masked, matrices, input) and the CLI exits non-zero.
``candidate``
    A reconstruction whose constant is not known to be right (*recollection, unverified* or an
    unproved repair), or a deliberate probe. A failure **refutes** the candidate: it is recorded
    as a finding with its examples, never as a harness failure.
``heuristic``
    A quantity known not to be a bound (the released data-dependent quantity, docs/theory.md
    §2); its failures are counted for information.
``reported``
    A limit, not an inequality (the large-radius limit, docs/theory.md §7): only the ratio is
    recorded.

For every bound the report gives the number of checks, the violations, the tightness ratio
``bound / engine value`` (min, median, max) and the worst instance (smallest margin
``bound / lower`` for an upper bound, ``upper / bound`` for a lower bound).

Instances are reproducible: instance ``index`` of a run with seed ``seed`` is drawn from
``numpy.random.default_rng([seed, index])`` (see :func:`make_targets`).

Modules: :mod:`~experiments.verify_bounds.generation` (instance generators),
:mod:`~experiments.verify_bounds.checks` (evaluators and the certified-bracket rules, on the
engine adapter of :mod:`~experiments.verify_bounds._engine`),
:mod:`~experiments.verify_bounds.report` (aggregation, JSON and markdown, ``summary``,
``report_section``, ``claims``), :mod:`~experiments.verify_bounds.settings` (the settings,
``PRESETS``, ``resolve``), :mod:`~experiments.verify_bounds.sweep` (:func:`verify` and
``execute``); this door defines ``STAGE`` and ``run``. The names below keep the
stage interface (``PRESETS``, ``run``, ``summary``, ``report_section``); the command line
(``meanfield verify-bounds``) is :mod:`meanfield_cli.commands.verify_bounds`.

Provenance: the harness is ours; the bounds are those of :mod:`theory.bounds` (their docstrings
carry the provenance labels of docs/theory.md §15).
"""

from __future__ import annotations

from ..engine import ModuleStage
from ._engine import Target
from .checks import BOUND_RTOL, BOUNDS, BoundSpec
from .checks import EVALUATORS as EVALUATORS
from .checks import THETA_BUCKETS as THETA_BUCKETS
from .checks import check_instance as check_instance
from .generation import KIND_WEIGHTS as KIND_WEIGHTS
from .generation import KINDS, make_targets
from .generation import RADII as RADII
from .generation import SCHEDULE as SCHEDULE
from .report import aggregate as aggregate
from .report import claims, report_section, summary
from .settings import NAME as NAME
from .settings import PRESETS, VerifyBoundsSettings, resolve
from .sweep import HARNESS_VERSION as HARNESS_VERSION
from .sweep import execute, verify

__all__ = [
    "BOUNDS",
    "BOUND_RTOL",
    "KINDS",
    "PRESETS",
    "STAGE",
    "BoundSpec",
    "Target",
    "VerifyBoundsSettings",
    "execute",
    "make_targets",
    "claims",
    "report_section",
    "resolve",
    "run",
    "summary",
    "verify",
]

#: The stage (experiments/engine/_stage.py contract).
STAGE = ModuleStage.from_module(__name__, "Bounds checked against the engine", uses_device=False)
#: Run the harness for a preset (:meth:`experiments.engine.ModuleStage.run`).
run = STAGE.run
