r"""Whole-model profile: per-layer smoothness of a Hugging Face transformer (docs/profile.md).

:func:`profile_model` walks the blocks of a transformer (BERT-style, DistilBERT, GPT-2, OPT,
Llama-style, Gemma-1/2/3, Phi-3, GPT-NeoX, Falcon, BLOOM, ModernBERT, ViT/DeiT: the blocks
:func:`model_blocks` models) on one window of tokens (or on given hidden states) and reports,
for each layer and each window length ``n``:

* the **attention sublayer**'s local Lipschitz constant :math:`\|Df(X)\|_2` with its certified
  bracket (:func:`meanfield.local_lipschitz`), at the hidden state entering the attention
  (after the block's first norm for Pre-LN models), and optionally one bracket per head (head
  :math:`h` through its own slice of the output projection);
* the **whole block**'s Jacobian norm :math:`\|D\,\mathrm{block}_\ell(x_\ell)\|_2` (attention,
  MLP, norms and residuals), matrix-free through autograd
  (:func:`meanfield.local_lipschitz_fn`);
* the **linear maps** of the block (Q, K, V, O, MLP up/gate/down): their exact spectral norms
  and Gram-iteration upper bounds certified by a Cholesky test (independent of the input);
* the **chain rule** across the profiled layers:
  :math:`\|D(\mathrm{block}_L\circ\dots\circ\mathrm{block}_1)(x_1)\|\le\prod_\ell
  \|D\,\mathrm{block}_\ell(x_\ell)\|`, the product of the per-block upper ends against the
  measured end-to-end constant.

Every block is rebuilt as a pure torch function from the model's weights, cast to the profile's
dtype (float64 by default: the reference), with the toolkit's attention
(:func:`meanfield.self_attention`) and the model's own causal mask; the tests check it against
the model's own forward pass. The library draws no figure; the ``meanfield profile`` command
writes the JSON record and the heatmaps.

The package: :mod:`~meanfield.profile.blocks` (the pure blocks), :mod:`~meanfield.profile.records`
(the results) and :mod:`~meanfield.profile.walk` (:func:`profile_model`, which walks the layers);
this module is the package's door.
"""

from __future__ import annotations

from .blocks import TransformerBlock, model_blocks
from .records import (
    AttentionRecord,
    BlockRecord,
    ChainRecord,
    LayerRecord,
    LinearNorm,
    ModelProfile,
    ProfileProgress,
)
from .walk import profile_model

__all__ = [
    "AttentionRecord",
    "BlockRecord",
    "ChainRecord",
    "LayerRecord",
    "LinearNorm",
    "ModelProfile",
    "ProfileProgress",
    "TransformerBlock",
    "model_blocks",
    "profile_model",
]
