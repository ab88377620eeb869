r"""Closed-form Jacobians of self-attention and matrix-free Jacobian products.

Derivation of the products: docs/derivations/jacobian_products.md.

For one head with score matrix :math:`A`, value matrix :math:`V` and key-logit term :math:`c`
(query bias, docs/conventions.md §1), the logits are
:math:`\ell_{il} = x_i^\top Ax_l + c^\top x_l + \log a_l` (:math:`-\infty` where masked), and
:math:`f(X)_i = Vm_i + b` with :math:`m_i = \sum_lP_{il}x_l`. Since
:math:`\partial\ell_{il}/\partial x_i = Ax_l` and :math:`\partial\ell_{il}/\partial x_l =
A^\top x_i + c =: b_i`, the blocks :math:`J_{ij} = \partial f_i/\partial x_j` (column convention,
:math:`d_{\mathrm{out}}\times d`) are

.. math::
    J_{ij} = P_{ij}\,V\big(I + (x_j - m_i)\,b_i^\top\big) + \delta_{ij}\,VC_iA^\top,\qquad
    C_i = \sum_lP_{il}(x_l-m_i)(x_l-m_i)^\top .

A multi-head layer has :math:`J = \sum_h(I_n\otimes W_h)J^h` with :math:`W_h` column block
:math:`h` of :math:`W^O` (a block selector when the heads are concatenated). Masking only zeroes
:math:`P_{ij}`; weighted atoms only add :math:`\log a_j` to the logits. *(derived and checked
numerically against finite differences and torch.func; docs/derivations/jacobian_products.md.)*

The **Wasserstein** operator of a weighted measure is :math:`D_a^{1/2}JD_a^{-1/2}` (docs/theory.md
§16), whose blocks are :math:`\sqrt{a_i/a_j}J_{ij}`: the same formula with
:math:`\tilde P_{ij} = \sqrt{a_i/a_j}\,P_{ij}` in the two interaction terms, while the self term
:math:`VC_iA^\top` is unchanged.

Reference: V. Castin, P. Ablin, G. Peyré, *How Smooth Is Attention?*, ICML 2024 (arXiv
2312.14820 v2). The formulas are our reconstructions labelled *derived and checked
numerically*; they are not quoted from the paper.

Products :func:`jvp` and :func:`vjp` never form a block; their matrix-product form is derived in
``docs/derivations/jacobian_products.md``. For heads with factors :math:`A = Q^\top K`
(:math:`Q, K\in\mathbb R^{k\times d}`) every :math:`n\times n` contraction runs in head space
(through :math:`Qx, Kx, Vx`, precomputed by :func:`linearize`), so a product costs
:math:`O(n^2(k + d_v) + nd(2k + d_v))` per head, the order of the forward pass; heads given only
by :math:`A` cost :math:`O(n^2d + nd^2)`. Heads with a rotary embedding or another attention
variant (QK-norm, biases, logit scale, soft-cap, window, ALiBi, partial rotary) have closed forms
on rotated and normed head rows (docs/derivations/jacobian_products.md §3b–§3c); only a layer
whose variant heads differ in width falls back to ``torch.func`` products of
:func:`~meanfield.attention.attention_points`.

The package is split along those concepts: :mod:`~meanfield.jacobian.linearization`
(:class:`AttentionLinearization`, :func:`linearize`), :mod:`~meanfield.jacobian.products`
(:func:`jvp`, :func:`vjp`, the self-map products, :func:`dense_jacobian`) and
:mod:`~meanfield.jacobian.block_norms` (the certified block-norm bounds, on the certified head-space
rows of :mod:`~meanfield.jacobian.head_rows`) and :mod:`~meanfield.jacobian.structured_bounds`
(the bounds for any heads, rotary included), and :mod:`~meanfield.jacobian.streaming` (the same
products in memory linear in :math:`n`: head rows and row log-normalisers kept, the attention
recomputed tile by tile, docs/derivations/streaming_products.md; the variants in
:mod:`~meanfield.jacobian.streaming_variants`, the deterministic bound from tiles in
:mod:`~meanfield.jacobian.streaming_bounds`). The public names are importable
from ``meanfield.jacobian``; the helpers its modules share are public names of those modules.
"""

from .block_norms import WeightNorms, block_norm_bounds, self_norm_trace_bound, weight_norms
from .linearization import AttentionLinearization, RopeRows, linearize
from .products import dense_jacobian, jvp, self_jacobian_blocks, self_jvp, self_vjp, vjp
from .streaming import (
    StreamingLinearization,
    linearize_streaming,
    streaming_jvp,
    streaming_self_jvp,
    streaming_self_vjp,
    streaming_vjp,
)
from .streaming_bounds import streaming_structured_upper
from .structured_bounds import head_structured_upper, structured_block_norms

__all__ = [
    "AttentionLinearization",
    "RopeRows",
    "StreamingLinearization",
    "WeightNorms",
    "block_norm_bounds",
    "dense_jacobian",
    "head_structured_upper",
    "jvp",
    "linearize",
    "linearize_streaming",
    "self_jacobian_blocks",
    "self_jvp",
    "self_norm_trace_bound",
    "self_vjp",
    "streaming_jvp",
    "streaming_self_jvp",
    "streaming_self_vjp",
    "streaming_structured_upper",
    "streaming_vjp",
    "structured_block_norms",
    "vjp",
    "weight_norms",
]
