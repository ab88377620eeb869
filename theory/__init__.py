r"""Closed-form and symbolic Lipschitz bounds for self-attention (numpy, scipy, sympy; no torch).

Reference: Castin, Ablin & Peyré, *How Smooth Is Attention?*, ICML 2024, arXiv:2312.14820v2
(pinned). Formulas, derivations and provenance labels are written up in ``docs/theory.md`` (labels
in §15).

Notation (as in docs/theory.md; code names in parentheses)
----------------------------------------------------------
A (``A``, ``A_norm`` = :math:`\|A\|_2`)
    Score matrix: the score of query :math:`i` on key :math:`j` is :math:`x_i^\top Ax_j`,
    :math:`A = Q^\top K/\sqrt k`. The released code uses :math:`A^\top` (same norm and spectrum).
V (``V``, ``V_norm`` = :math:`\|V\|_2`, ``Vu_norm`` = :math:`\|Vu\|_2`)
    Value matrix, shape (d_v, d).
mu (``mu``)
    A probability measure on :math:`B_R`; atomic measures :math:`\sum_ja_j\delta_{x_j}` (masses
    :math:`a_j`).
n, N
    Number of tokens (:math:`N` in Kim et al.'s notation, docs/theory.md §8).
d
    Token dimension.
R (``R``)
    Radius of the ball :math:`B_R` (maximum token norm).
gamma (``gamma``)
    Logit gap of a construction: :math:`\lambda R^2/4` (case +) or :math:`2|\lambda|R^2` (case −).
s (``s``)
    Exponent :math:`\lambda R^2/4` of the mass-splitting gain (``split_gain``, ``optimal_split_k``).
lambda (``lam``)
    Rayleigh quotient :math:`u^\top Au` of a unit direction :math:`u`.
p
    Attention that a query pays to the distinguished token of the :math:`n`-token construction,
    :math:`e^\gamma/(e^\gamma + n - 1)`.
eps (``eps``)
    Mass of the light atom of the two-Dirac construction.
w, v
    Attention the heavy atom pays to the light one, and :math:`v = 1 - w`.
N_j
    Number of queries whose arg-max key is :math:`j` (large-radius regime).
theta (``theta``)
    :math:`\|A\|_2R^2`, a shorthand of this package (not the paper's).

Modules
-------
:mod:`theory.bounds`
    One numpy function per result (broadcasting; log domain where :math:`e^{\gamma}` appears).
:mod:`theory.lambert`
    Real Lambert W with domain checks.
:mod:`theory.regimes`
    Regime classification and thresholds.
:mod:`theory.rounding`
    Rounding margin of the certified local bound, shared with :mod:`meanfield` (not re-exported
    here).
:mod:`theory.symbolic`
    Sympy derivations; imported lazily (``theory.symbolic`` loads sympy on first access).
"""

from __future__ import annotations

import importlib
from typing import Any

from theory import bounds, lambert, regimes

#: One way in: the functions are reached through their subpackage (``theory.bounds.split_gain``,
#: ``theory.lambert.lambertw``, ``theory.regimes.classify``), never from the top level.
__all__ = ["bounds", "lambert", "regimes", "symbolic"]


def __getattr__(name: str) -> Any:
    """Import :mod:`theory.symbolic` (and sympy) on first access."""
    if name == "symbolic":
        return importlib.import_module("theory.symbolic")
    raise AttributeError(f"module 'theory' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
