r"""Hugging Face layers: architecture detection, parameter extraction and the pure attention maps.

Three architecture families are supported (docs/conventions.md; docs/theory.md §A8):

- **BERT** (``BertModel``, ``BertFor*``; Post-LN): ``encoder.layer[b].attention.self`` holds
  ``nn.Linear`` query/key/value maps with biases, stored (out, in): head ``h`` is *row* block
  ``h``. ``attention.output.dense`` is :math:`W^O` and ``attention.output.LayerNorm`` closes the
  ``BertAttention`` block.
- **GPT-2** (``GPT2Model``, ``GPT2LMHeadModel``; Pre-LN): ``h[b].attn.c_attn`` is a ``Conv1D``
  stored (in, out) = (d, 3d), split along dim 1 into q, k, v; head ``h`` is *column* block ``h``
  (the released code took rows, defect D5 of docs/experiments.md). ``c_proj`` (``Conv1D``) is
  :math:`W^O`.
- **Llama-style** (``LlamaModel``, ``LlamaForCausalLM``, e.g. SmolLM2; Pre-RMSNorm):
  ``layers[b].self_attn.{q,k,v,o}_proj`` (``nn.Linear``), grouped-query attention
  (``n_kv_heads`` < ``n_heads``) and rotary embeddings taken from the model's own
  ``rotary_emb`` (``inv_freq``, ``attention_scaling``).

Every map is rebuilt from the extracted weights as a pure torch function
(:func:`meanfield.self_attention`), with our own causal mask: transformers 5.x modules do not mask
themselves (docs/experiments.md, "transformers 5.x"), and forward-mode AD through them is
unreliable. transformers is imported lazily; a missing optional package fails with one line
naming the extra to install (``pip install meanfield[hf]``).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import math
import operator
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from .._typing import Arch, HeadMap
from ..attention import self_attention
from ..params import MultiHeadParams, RotaryEmbedding

__all__ = [
    "HFAttention",
    "LayerInfo",
    "bert_attention_block",
    "hf_attention",
    "hf_attention_fn",
    "is_causal",
    "layer_info",
    "params_from_hf",
    "released_head_A",
]

logger = logging.getLogger(__name__)

#: Former name of :data:`meanfield._typing.HeadMap`.
_MAPS = ("heads", "heads+WO", "block")


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


def _max_positions(model: Any, arch: Arch) -> int | None:
    cfg = model.config
    for name in ("max_position_embeddings", "n_positions"):
        v = getattr(cfg, name, None)
        if v:
            return int(v)
    return None


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
    """Metadata of one attention layer (docs/experiments.md, "Protocols and defects": labels).

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


def layer_info(model: Any, layer: int, *, map: HeadMap = "heads+WO") -> LayerInfo:
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
    model: Any, layer: int, *, map: HeadMap = "heads+WO", dtype: torch.dtype | None = None
) -> MultiHeadParams:
    r""":class:`MultiHeadParams` of one attention layer, in the toolkit's score convention.

    Head :math:`h` has :math:`A_h = s\,Q_h^\top K_h` (:math:`s` the layer's logit scale,
    :math:`1/\sqrt k`), :math:`V_h`, the key-logit term :math:`c_h = s\,K_h^\top b_{Q,h}` of the
    query bias and the value bias (docs/theory.md §A8), sliced per architecture:

    - BERT: ``query/key/value`` ``nn.Linear`` (out, in), head = row block.
    - GPT-2: ``c_attn`` ``Conv1D`` (in, out) split along dim 1 into q, k, v; head = **column** block
      (:math:`Q_h = W_q[:, \mathrm{cols}_h]^\top`), docs/conventions.md §3, defect D5 of
      docs/experiments.md.
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

    Residual plus LayerNorm around the multi-head map (docs/theory.md §A8; the map of the released
    ``bert_encoder`` and ``bert_decoder`` folders, defect D2 of docs/experiments.md), in eval mode
    (no dropout).

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
    model: Any, layer: int, *, map: HeadMap = "heads+WO", dtype: torch.dtype | None = None
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
    map: HeadMap = "heads+WO",
    dtype: torch.dtype | None = None,
    masked: bool | None = None,
) -> Callable[[Tensor], Tensor]:
    """Build a pure function ``X -> f(X)`` of one layer, for ``local_lipschitz_fn``.

    Parameters
    ----------
    model, layer, map, dtype
        As in :func:`hf_attention`.
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
