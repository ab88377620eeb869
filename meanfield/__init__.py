r"""meanfield: the smoothness of self-attention, on sequences and on measures.

Notation (docs/theory.md §A1; code names follow it):

====================  ===========================================================================
symbol (code)         meaning
====================  ===========================================================================
``A`` (d, d)          score matrix, :math:`\mathrm{score}(x_i, x_j) = x_i^\top A x_j` (query i, key j)
``V`` (d_v, d)        value matrix; one head maps :math:`f(X)_i = \sum_j P_{ij} V x_j`
``P``                 row-stochastic attention matrix (``P^m`` when causal)
``mu``                weighted Dirac measure :math:`\sum_j a_j\delta_{x_j}` (:class:`DiracMeasure`)
``a``                 masses (weights) of the atoms, on the simplex
``Gamma_mu``          transport map :math:`\Gamma_\mu(x)=\sum_j\mathrm{softmax}_j(x^\top Ax_j+\log a_j)Vx_j`
``F``                 mean-field attention :math:`F(\mu) = (\Gamma_\mu)_\#\mu`
``W_2``               2-Wasserstein distance; ``W_c`` its position-preserving (conditional) version
``R``                 radius of the ball containing the tokens (maximum token norm)
``n``, ``d``          number of tokens (atoms), model width
``H``, ``k``          number of heads, head width
====================  ===========================================================================

Tensors in, tensors out; dtype and device follow the inputs; float64 is the reference precision.

The top level holds the paper's objects and maps: measures, attention parameters, attention on
sequences and on measures, Wasserstein distances and the local Lipschitz constant. The rest is
reached through its subpackage: :mod:`meanfield.jacobian` (products and certified block norms),
:mod:`meanfield.lipschitz` (the estimator's options and certificates), :mod:`meanfield.attacks`
(worst-case inputs and mass splitting), :mod:`meanfield.models` (Hugging Face layers),
:mod:`meanfield.profile` (a model layer by layer), :mod:`meanfield.distances` (Sinkhorn),
:mod:`meanfield.invertible` (invertible residual attention) and :mod:`meanfield.convolution`
(spectral norms of convolutions).
"""

import logging

from .attention import (
    attention,
    attention_map,
    attention_points,
    attention_weights,
    l2_self_attention,
    self_attention,
)
from .distances import (
    TransportError,
    TransportResult,
    conditional_wasserstein,
    optimal_transport,
    wasserstein,
    wasserstein_inf,
)
from .lipschitz import (
    LipschitzEstimate,
    LocalUpperBound,
    certified_local_upper,
    local_lipschitz,
    local_lipschitz_fn,
    released_metric,
)
from .measures import DiracMeasure
from .params import AttentionParams, L2AttentionParams, MultiHeadParams, RotaryEmbedding

__version__ = "0.1.0"

# a library prints nothing unless the application configures logging (meanfield.lipschitz's
# progress lines, docs/experiments.md)
logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "AttentionParams",
    "DiracMeasure",
    "L2AttentionParams",
    "LipschitzEstimate",
    "LocalUpperBound",
    "MultiHeadParams",
    "RotaryEmbedding",
    "TransportError",
    "TransportResult",
    "attention",
    "attention_map",
    "attention_points",
    "attention_weights",
    "certified_local_upper",
    "conditional_wasserstein",
    "l2_self_attention",
    "local_lipschitz",
    "local_lipschitz_fn",
    "optimal_transport",
    "released_metric",
    "self_attention",
    "wasserstein",
    "wasserstein_inf",
]
