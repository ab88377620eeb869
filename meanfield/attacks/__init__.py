r"""Adversarial inputs: closed-form constructions, worst-case searches and mass splitting.

Subpackage layout (one concept per module):

* :mod:`~meanfield.attacks.constructions`: :func:`adversarial_sequence` (one token plus
  :math:`n-1` copies), :func:`two_dirac` / :func:`two_dirac_measure` (two unbalanced Diracs at the
  exact optimal mass) and :func:`off_axis_two_atoms` (the general two-atom bound maximised);
* :mod:`~meanfield.attacks.search`: :func:`worst_case_measure` and :func:`worst_case_sequence`,
  multi-start gradient ascent of the exact local constant, started from the constructions;
* :mod:`~meanfield.attacks.splitting`: :func:`split_constant` and :func:`mass_splitting_attack`
  (the closed-form gain :math:`G_k` and its best :math:`k` are :func:`theory.bounds.split_gain`
  and :func:`theory.bounds.optimal_split_k`);
* :mod:`~meanfield.attacks.l2_lower`: lower bounds on the :math:`\infty`- and 2-norm Lipschitz
  constants of L2 attention (Kim et al.): :func:`l2_construction` (closed form),
  :func:`l2_lipschitz_lower` (search), :func:`l2_jacobian_inf_norm`,
  :func:`l2_jacobian_spectral_norm`;
* ``_common`` (private): the multi-start ascent and the options every search takes as
  keywords (``n_restarts``, ``steps``, ``lr``, ``seed``; ``None`` for the search's default).

Notation (docs/theory.md §A1): one head has score matrix :math:`A` (score
:math:`x_i^\top Ax_j`, query :math:`i`, key :math:`j`) and value matrix :math:`V`; :math:`u` is a
unit direction with Rayleigh quotient :math:`\lambda=u^\top Au`; :math:`\gamma` (``gamma``) is the
logit gap of a construction; :math:`\mu=\sum_ia_i\delta_{x_i}` a weighted measure in the ball
:math:`B_R`.

Provenance (docs/theory.md §A7): the eigenvector construction and the two-Dirac positions come
from the authors' released code; every bound and closed form here is derived and checked
numerically (tests/meanfield/test_attacks_*.py); the phenomena (tight √n rate, unbalanced worst measures,
mass splitting) are stated in the abstract of Castin, Ablin & Peyré, "How Smooth Is Attention?",
ICML 2024, arXiv 2312.14820 (v2; v1 for the two-Dirac and mass-splitting material).

API style: the mathematical inputs are positional (a measure first, then the parameters, as in
:func:`mass_splitting_attack`; a construction or a search has no input measure, so the
parameters under attack come first, then the domain :math:`R`, :math:`n`); options are
keyword-only (one way in: ``n_restarts``, ``steps``, ``lr``, ``seed`` as keywords);
``masked=None`` follows the input measure's flag (unmasked when there is none); the number of
atoms is ``n``. The eigenvector ``variant`` defaults differ on purpose:
:func:`adversarial_sequence` reproduces the paper's experiments (``"released"``), while
:func:`two_dirac` and the searches want the largest gap (``"symmetric"``, never smaller).

Tensors in, tensors out: returned points follow the dtype and device of the inputs; every
computation runs in float64; scalar summaries are Python floats. Nothing prints. The searches are
small dense problems; where intra-op threading of tiny tensors is slow,
``torch.set_num_threads(1)`` speeds them up considerably.
"""

from ._common import LOG_MASS_FLOOR
from .constructions import (
    AdversarialSequence,
    OffAxisTwoAtoms,
    TwoDirac,
    adversarial_sequence,
    off_axis_two_atoms,
    two_dirac,
    two_dirac_measure,
)
from .l2_lower import (
    L2Construction,
    L2LowerBound,
    l2_construction,
    l2_construction_value,
    l2_jacobian_inf_norm,
    l2_jacobian_spectral_norm,
    l2_lipschitz_lower,
)
from .search import WorstCaseMeasure, WorstCaseSequence, worst_case_measure, worst_case_sequence
from .splitting import MassSplittingAttack, Perturbation, mass_splitting_attack, split_constant

__all__ = [
    "LOG_MASS_FLOOR",
    "AdversarialSequence",
    "L2Construction",
    "L2LowerBound",
    "MassSplittingAttack",
    "OffAxisTwoAtoms",
    "Perturbation",
    "TwoDirac",
    "WorstCaseMeasure",
    "WorstCaseSequence",
    "adversarial_sequence",
    "l2_construction",
    "l2_construction_value",
    "l2_jacobian_inf_norm",
    "l2_jacobian_spectral_norm",
    "l2_lipschitz_lower",
    "mass_splitting_attack",
    "off_axis_two_atoms",
    "split_constant",
    "two_dirac",
    "two_dirac_measure",
    "worst_case_measure",
    "worst_case_sequence",
]
