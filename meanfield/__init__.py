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
"""

from .attention import (
    attention,
    attention_map,
    attention_points,
    attention_weights,
    l2_self_attention,
    self_attention,
)
from .convolution import (
    ConvSpectralResult,
    conv2d_reshaped_upper,
    conv2d_spectral_upper,
    module_spectral_upper,
)
from .distances import (
    SinkhornResult,
    TransportError,
    TransportResult,
    conditional_wasserstein,
    optimal_transport,
    sinkhorn_wasserstein,
    wasserstein,
    wasserstein_inf,
)
from .invertible import (
    FixedPointResult,
    ResidualAttention,
    certified_lipschitz,
    contractive_scale,
    invert_fixed_point,
    l2_lipschitz_upper,
    residual_forward,
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

__all__ = [
    "ConvSpectralResult",
    "AttentionParams",
    "DiracMeasure",
    "L2AttentionParams",
    "LipschitzEstimate",
    "LocalUpperBound",
    "MultiHeadParams",
    "RotaryEmbedding",
    "SinkhornResult",
    "TransportError",
    "TransportResult",
    "attention",
    "attention_map",
    "attention_points",
    "attention_weights",
    "certified_local_upper",
    "conditional_wasserstein",
    "conv2d_reshaped_upper",
    "conv2d_spectral_upper",
    "l2_self_attention",
    "local_lipschitz",
    "local_lipschitz_fn",
    "module_spectral_upper",
    "optimal_transport",
    "released_metric",
    "self_attention",
    "sinkhorn_wasserstein",
    "wasserstein",
    "wasserstein_inf",
    # invertible residual attention (meanfield.invertible)
    "FixedPointResult",
    "ResidualAttention",
    "certified_lipschitz",
    "contractive_scale",
    "invert_fixed_point",
    "l2_lipschitz_upper",
    "residual_forward",
]
