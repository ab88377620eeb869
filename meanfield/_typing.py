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
``ProductGeometry``       the two geometries of the Jacobian products and block norms
                          (:mod:`meanfield.jacobian`); ``"split"`` is built from them
``AnyParams``             ``Params`` or an L2 layer (:class:`L2AttentionParams`)
``Method``                dense SVD or a matrix-free iteration for the top singular value
``UpperMethod``           how the certified upper end of a bracket is obtained
``Variant``               eigenvector construction: the authors' released rule or the symmetric part
``Case``                  sign of the Rayleigh quotient a construction uses
``Arch``                  architecture family recognised by :mod:`meanfield.models`
``HeadMap``               which linear map of a layer :mod:`meanfield.models` extracts
========================  ====================================================================

"""

from __future__ import annotations

from typing import Literal

from .params import AttentionParams, L2AttentionParams, MultiHeadParams

__all__ = [
    "AnyParams",
    "Arch",
    "Case",
    "Geometry",
    "HeadMap",
    "MeasureGeometry",
    "Method",
    "Params",
    "ProductGeometry",
    "UpperMethod",
    "Variant",
]

Params = AttentionParams | MultiHeadParams
AnyParams = AttentionParams | MultiHeadParams | L2AttentionParams
Geometry = Literal["euclidean", "wasserstein", "split"]
MeasureGeometry = Literal["wasserstein", "split"]
ProductGeometry = Literal["euclidean", "wasserstein"]
Method = Literal["auto", "dense", "lanczos", "power"]
UpperMethod = Literal["auto", "gram", "block", "none"]
Variant = Literal["released", "symmetric"]
Case = Literal["auto", "+", "-"]
Arch = Literal[
    "bert",
    "distilbert",
    "vit",
    "gpt2",
    "opt",
    "llama",
    "phi3",
    "gpt_neox",
    "falcon",
    "modernbert",
    "bloom",
]
HeadMap = Literal["heads", "heads+WO", "block"]
