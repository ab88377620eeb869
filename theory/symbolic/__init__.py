"""Symbolic derivations (sympy) of the closed forms used by :mod:`theory.bounds`.

Each derivation starts from the defining expression of docs/theory.md (a bound, a stationarity
condition, an equation to invert), lets sympy do the algebra (differentiate, solve, simplify,
take limits), and checks the result against the closed form stated in docs/theory.md, raising
``RuntimeError`` if they differ. Nothing downstream of the starting expression is typed in.

Every public function returns a frozen :class:`Derivation` holding the expression, its LaTeX, a
numpy callable (``sympy.lambdify`` with ``modules=["scipy", "numpy"]``, so ``LambertW`` maps to
:func:`scipy.special.lambertw`; the real part is returned), the argument symbols, the steps, and
named intermediate expressions. Results are cached: each derivation runs once per process.

Provenance of the derived results: *derived and checked numerically* (docs/theory.md §15); the tests
compare every callable with :mod:`theory.bounds` to 1e-12 relative.

One module per family of derivations: :mod:`.kim` (Kim's softmax-variance lemma),
:mod:`.two_dirac` (the two-Dirac mean-field optimum), :mod:`.construction` (the peak of the
n-token construction and the masked sum), :mod:`.upper_bounds` (the √n and mean-field upper bounds
and their crossover), :mod:`.inversions` (the Lambert W inversions), :mod:`.splitting` (mass
splitting) and :mod:`.bounded_logits` (soft-capping and QK-norm: the two-token counterexamples, the
RMS normalisation, the column sums); :mod:`._core` holds :class:`Derivation` and the shared sympy
helpers.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from ._core import Derivation
from .bounded_logits import column_sums, qk_norm_two_token, rms_normalisation, softcap_two_token
from .construction import construction_peak, masked_limit_decomposition
from .inversions import (
    gap_for_target,
    half_form_inversion,
    lambertw_asymptotic,
    radius_for_target,
    radius_for_upper,
)
from .kim import kim_softmax_lemma, kim_softmax_lemma_mean_field
from .splitting import split_gain, split_gain_asymptotic
from .two_dirac import two_dirac_asymptotic, two_dirac_g, two_dirac_optimal_mass
from .upper_bounds import (
    mean_field_upper,
    sqrt_n_asymptotic,
    sqrt_n_mean_field_crossover,
    sqrt_n_upper,
)

__all__ = [
    "Derivation",
    "asymptotics",
    "column_sums",
    "construction_peak",
    "gap_for_target",
    "half_form_inversion",
    "kim_softmax_lemma",
    "kim_softmax_lemma_mean_field",
    "lambertw_asymptotic",
    "masked_limit_decomposition",
    "mean_field_upper",
    "qk_norm_two_token",
    "radius_for_target",
    "radius_for_upper",
    "rms_normalisation",
    "softcap_two_token",
    "split_gain",
    "split_gain_asymptotic",
    "sqrt_n_asymptotic",
    "sqrt_n_mean_field_crossover",
    "sqrt_n_upper",
    "two_dirac_asymptotic",
    "two_dirac_g",
    "two_dirac_optimal_mass",
]


def asymptotics() -> Mapping[str, Derivation]:
    """All asymptotic derivations, by name.

    Returns
    -------
    Mapping[str, Derivation]
        ``"sqrt_n"`` (:func:`sqrt_n_asymptotic`, form "sqrt3"), ``"two_dirac"``
        (:func:`two_dirac_asymptotic`), ``"lambertw"`` (:func:`lambertw_asymptotic`),
        ``"split_gain"`` (:func:`split_gain_asymptotic`).
    """
    return MappingProxyType(
        {
            "sqrt_n": sqrt_n_asymptotic("sqrt3"),
            "two_dirac": two_dirac_asymptotic(),
            "lambertw": lambertw_asymptotic(),
            "split_gain": split_gain_asymptotic(),
        }
    )
