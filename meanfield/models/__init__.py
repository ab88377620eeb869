r"""Hugging Face adapters: attention parameters, captured hidden states and offline stand-ins.

Subpackage layout:

* :mod:`~meanfield.models.layers`: architecture detection (BERT-style incl. RoBERTa and ELECTRA,
  DistilBERT, ViT/DeiT, GPT-2, OPT, Llama-style incl. Mistral, Qwen2/3 and Gemma-1/2/3, Phi-3,
  GPT-NeoX, Falcon, ModernBERT, BLOOM), parameter extraction (:func:`params_from_hf`,
  :func:`layer_info`, :func:`released_head_A`) and the pure torch attention maps rebuilt from the
  extracted weights (:func:`hf_attention`, :func:`hf_attention_fn`, :func:`bert_attention_block`),
  sliding windows, query/key biases under rotary, partial rotary, per-head QK-norm, soft-capping
  and ALiBi included; attention features the parameters do not model (QK-norm over all heads,
  Falcon's ALiBi, clip_qkv, length-dependent RoPE, ...) are refused in one line;
* ``meanfield.models._families`` (private): the per-family adapters (where the weights live,
  fused layouts, head grouping, the variants each layer asks for);
* :mod:`~meanfield.models.module_fn`: :func:`hf_module_fn`, the model's own attention module as
  a map of the hidden states (explicit mask and positions), the general path for
  :func:`~meanfield.lipschitz.local_lipschitz_fn` with ``products="reverse"``;
* :mod:`~meanfield.models.capture`: the hidden states entering a layer for windows of a text
  (:func:`hidden_states`, :func:`hidden_states_grid`), or for images of a vision encoder
  (:func:`image_hidden_states`);
* :mod:`~meanfield.models.standins`: the offline stand-in loaders (:func:`load_model`,
  :func:`load_minilm`, :func:`load_smollm2`, :func:`random_gpt2`, :func:`random_bert`) and
  :func:`tiny_config` (small configs for quick runs and tests).

transformers is imported lazily, so ``import meanfield`` works without it; a missing optional
package fails with one line naming the extra to install (``pip install meanfield[hf]``).
Conventions (score convention, weight layouts per architecture): docs/conventions.md.
"""

from .capture import (
    HiddenStates,
    ImageHiddenStates,
    hidden_states,
    hidden_states_grid,
    image_hidden_states,
    pixel_values,
    reads_images,
    synthetic_pixel_values,
)
from .layers import (
    HFAttention,
    LayerInfo,
    bert_attention_block,
    hf_attention,
    hf_attention_fn,
    is_causal,
    layer_info,
    params_from_hf,
    released_head_A,
)
from .module_fn import hf_module_fn
from .standins import (
    BERT_RANDOM_LABEL,
    GPT2_RANDOM_LABEL,
    MINILM_LABEL,
    SMOLLM2_GGUF,
    SMOLLM2_LABEL,
    LoadedModel,
    load_minilm,
    load_model,
    load_smollm2,
    random_bert,
    random_gpt2,
    tiny_config,
)

__all__ = [
    "BERT_RANDOM_LABEL",
    "GPT2_RANDOM_LABEL",
    "MINILM_LABEL",
    "SMOLLM2_GGUF",
    "SMOLLM2_LABEL",
    "HFAttention",
    "HiddenStates",
    "ImageHiddenStates",
    "LayerInfo",
    "LoadedModel",
    "bert_attention_block",
    "hf_attention",
    "hf_attention_fn",
    "hf_module_fn",
    "hidden_states",
    "hidden_states_grid",
    "image_hidden_states",
    "is_causal",
    "layer_info",
    "load_minilm",
    "load_model",
    "load_smollm2",
    "params_from_hf",
    "pixel_values",
    "random_bert",
    "random_gpt2",
    "reads_images",
    "released_head_A",
    "synthetic_pixel_values",
    "tiny_config",
]
