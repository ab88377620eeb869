r"""Closed-form Lipschitz bounds for self-attention, one function per result of docs/theory.md.

Reference: V. Castin, P. Ablin, G. Peyré, *How Smooth Is Attention?*, ICML 2024,
arXiv:2312.14820 **v2** (June 2024), pinned; v1 (December 2023) for the two-Dirac and
mass-splitting material. The body of the paper was not available when these bounds were written,
so every docstring carries one of the provenance labels of docs/theory.md §15:

* *stated in the paper (abstract)*,
* *from the authors' released code* (vcastin/how-smooth-is-attention),
* *derived and checked numerically*,
* *recollection, unverified*,
* *unknown*,
* *standard*.

A derived or recollected constant is never presented as the paper's.

One module per regime:

========================================  ==========================================  ============
module                                    functions                                   docs/theory.md
========================================  ==========================================  ============
:mod:`theory.bounds.sqrt_n`               √n upper bounds, eigenvector construction   §1, §3, §4
:mod:`theory.bounds.local`                data-dependent bounds at one sequence       §2
:mod:`theory.bounds.two_dirac`            two unbalanced Diracs, off-axis two atoms   §5
:mod:`theory.bounds.mean_field`           mean-field upper bound, global lower bounds §5, §6, §16
:mod:`theory.bounds.large_radius`         hard-max limit and its deviation            §7
:mod:`theory.bounds.kim`                  Kim et al.'s lemma and L2 bounds            §8
:mod:`theory.bounds.inversions`           Lambert-W gap and radius inversions         §9
:mod:`theory.bounds.splitting`            mass-splitting gain and optimal copies      §10
:mod:`theory.bounds.bounded_logits`       soft-capping, QK-norm, sliding windows      §18
:mod:`theory.bounds.registry`             one record per bound (side, status, ...)    §15
========================================  ==========================================  ============

Every public name is re-exported here, so ``from theory.bounds import sqrt_n_upper`` works.

Conventions
-----------
Scores are :math:`x_i^\top A x_j` (query :math:`i`, key :math:`j`). Norms of matrices are spectral
norms: ``A_norm`` is :math:`\|A\|_2`, ``V_norm`` is :math:`\|V\|_2`, ``Vu_norm`` is
:math:`\|Vu\|_2` for a unit direction :math:`u`. ``R`` is the radius of the ball :math:`B_R`
(maximum token norm). ``gamma`` is the logit gap of a construction; ``s`` is the exponent
:math:`\lambda R^2/4` of the mass-splitting gain (``split_gain``, ``optimal_split_k``). All
functions accept numpy arrays and broadcast; scalar inputs give numpy scalars. Quantities containing :math:`e^{\gamma}` or :math:`e^{c\|A\|R^2}` are computed in the log
domain, and the functions that can overflow take ``log=True`` to return the natural logarithm of
the bound instead (same type and shape).
"""

from __future__ import annotations

from theory.bounds import registry as registry
from theory.bounds.bounded_logits import (
    bounded_logits_local_upper,
    bounded_logits_upper,
    qk_norm_logit_bound,
    qk_norm_mean_field_upper,
    qk_norm_sqrt_n_upper,
    qk_norm_two_token_lower,
    softcap_logit_bound,
    softcap_mean_field_upper,
    softcap_sqrt_n_upper,
    softcap_two_token_lower,
    window_sqrt_n_upper,
)
from theory.bounds.inversions import gap_for_target, radius_for_target, radius_for_upper
from theory.bounds.kim import (
    kim_l2_norms,
    kim_l2_upper,
    kim_softmax_lemma,
    kim_softmax_lemma_mean_field,
)
from theory.bounds.large_radius import (
    large_radius_counts,
    large_radius_deviation,
    large_radius_limit,
    selection_gap,
)
from theory.bounds.local import certified_local_upper, released_data_dependent
from theory.bounds.mean_field import (
    mean_field_lower,
    mean_field_upper,
    mean_field_upper_cells,
    score_gap_constant,
    trivial_lower,
)
from theory.bounds.splitting import optimal_split_k, split_gain, split_gain_general
from theory.bounds.sqrt_n import (
    ConstructionGap,
    RayleighExtremes,
    construction_gap,
    masked_sqrt_n_lower,
    multihead_upper,
    rayleigh_extremes,
    sequence_lower,
    sqrt_n_constant,
    sqrt_n_lower,
    sqrt_n_upper,
)
from theory.bounds.sqrt_n import SqrtNForm as SqrtNForm
from theory.bounds.two_dirac import ASYMPTOTE_COEFF as ASYMPTOTE_COEFF
from theory.bounds.two_dirac import (
    TwoDiracOptimum,
    off_axis_two_atom,
    two_dirac_asymptote,
    two_dirac_g,
    two_dirac_half,
    two_dirac_log_g,
    two_dirac_lower,
    two_dirac_optimal_mass,
)

__all__ = [
    "ConstructionGap",
    "RayleighExtremes",
    "TwoDiracOptimum",
    "bounded_logits_local_upper",
    "bounded_logits_upper",
    "certified_local_upper",
    "construction_gap",
    "gap_for_target",
    "kim_l2_norms",
    "kim_l2_upper",
    "kim_softmax_lemma",
    "kim_softmax_lemma_mean_field",
    "large_radius_counts",
    "large_radius_deviation",
    "large_radius_limit",
    "masked_sqrt_n_lower",
    "mean_field_lower",
    "mean_field_upper",
    "mean_field_upper_cells",
    "multihead_upper",
    "off_axis_two_atom",
    "radius_for_target",
    "radius_for_upper",
    "rayleigh_extremes",
    "released_data_dependent",
    "score_gap_constant",
    "selection_gap",
    "sequence_lower",
    "softcap_logit_bound",
    "softcap_mean_field_upper",
    "softcap_sqrt_n_upper",
    "softcap_two_token_lower",
    "split_gain",
    "split_gain_general",
    "optimal_split_k",
    "qk_norm_logit_bound",
    "qk_norm_mean_field_upper",
    "qk_norm_sqrt_n_upper",
    "qk_norm_two_token_lower",
    "sqrt_n_constant",
    "sqrt_n_lower",
    "sqrt_n_upper",
    "trivial_lower",
    "two_dirac_asymptote",
    "two_dirac_g",
    "two_dirac_half",
    "two_dirac_log_g",
    "two_dirac_lower",
    "two_dirac_optimal_mass",
    "window_sqrt_n_upper",
]
