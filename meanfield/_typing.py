"""Type aliases shared by the library: one definition of every alias.

The aliases only document what a function accepts; nothing is checked at run time. Shapes are
stated in the docstrings (``points`` (n, d), ``weights`` (n,), ``A`` (d, d), ``V`` (d_v, d)).

========================  ====================================================================
alias                     meaning
========================  ====================================================================
``Params``                one head (:class:`AttentionParams`) or a multi-head layer
``Geometry``              metric on the inputs of the local constant: ``"euclidean"`` (sequences),
                          ``"wasserstein"`` (measures, fixed masses), ``"split"`` (measures, atoms
                          may split), see docs/theory.md
``MeasureGeometry``       the two geometries on measures, the ones a search over measures accepts
``Method``                dense SVD or a matrix-free iteration for the top singular value
``UpperMethod``           how the certified upper end of a bracket is obtained
``Variant``               eigenvector construction: the authors' released rule or the symmetric part
``Case``                  sign of the Rayleigh quotient a construction uses
``Arch``                  architecture family recognised by :mod:`meanfield.models`
``HeadMap``               which linear map of a layer :mod:`meanfield.models` extracts
========================  ====================================================================

The modules ``lipschitz``, ``jacobian`` and ``attention`` still define their own copies of
``Params``/``Geometry``/``Method``; they are the same types and will import these.
"""

from __future__ import annotations

from typing import Literal

from .params import AttentionParams, MultiHeadParams

__all__ = [
    "Arch",
    "Case",
    "Geometry",
    "HeadMap",
    "MeasureGeometry",
    "Method",
    "Params",
    "UpperMethod",
    "Variant",
]

Params = AttentionParams | MultiHeadParams
Geometry = Literal["euclidean", "wasserstein", "split"]
MeasureGeometry = Literal["wasserstein", "split"]
Method = Literal["auto", "dense", "lanczos", "power"]
UpperMethod = Literal["auto", "gram", "block", "none"]
Variant = Literal["released", "symmetric"]
Case = Literal["auto", "+", "-"]
Arch = Literal["bert", "gpt2", "llama"]
HeadMap = Literal["heads", "heads+WO", "block"]
