r"""Hugging Face layers: architecture detection, parameter extraction and the pure attention maps.

Supported families, detected from the module structure (docs/conventions.md; docs/theory.md §A8;
the per-family adapters live in :mod:`meanfield.models._families`):

- **BERT-style** (``BertModel``, ``RobertaModel``, ``ElectraModel`` and their heads; Post-LN):
  ``encoder.layer[b].attention.self`` holds ``nn.Linear`` query/key/value maps with biases,
  stored (out, in): head ``h`` is *row* block ``h``. ``attention.output.dense`` is :math:`W^O`
  and ``attention.output.LayerNorm`` closes the ``BertAttention`` block.
- **DistilBERT** (Post-LN): ``transformer.layer[b].attention.{q,k,v,out}_lin``; ``sa_layer_norm``
  closes the block.
- **ViT / DeiT** (vision encoders, Pre-LN, CLS token, no mask):
  ``encoder.layer[b].attention.{q,k,v,o}_proj``.
- **GPT-2** (``GPT2Model``, ``GPT2LMHeadModel``; Pre-LN): ``h[b].attn.c_attn`` is a ``Conv1D``
  stored (in, out) = (d, 3d), split along dim 1 into q, k, v; head ``h`` is *column* block ``h``
  (the released code took rows, defect D5 of docs/experiments.md). ``c_proj`` (``Conv1D``) is
  :math:`W^O`.
- **OPT** (causal, biases on q, k, v, no rotary): ``decoder.layers[b].self_attn.{q,k,v,out}_proj``.
- **Llama-style** (Llama, e.g. SmolLM2; Mistral, Qwen2, Qwen3, Gemma, Gemma-2, Gemma-3, ...;
  Pre-RMSNorm): ``layers[b].self_attn.{q,k,v,o}_proj`` (``nn.Linear``), grouped-query attention
  (``n_kv_heads`` < ``n_heads``) and rotary embeddings taken from the model's own
  ``rotary_emb`` (``inv_freq``, ``attention_scaling``, per layer type where it has several).
- **Phi-3** (fused ``qkv_proj``, rotary), **GPT-NeoX** (``query_key_value`` interleaved per head,
  rotary), **Falcon** (fused ``query_key_value``: multi-query, grouped or per head; rotary),
  **ModernBERT** (fused ``Wqkv``, rotary, bidirectional; alternating global and local layers),
  **BLOOM** (fused ``query_key_value`` per head, ALiBi).

The attention variants of these families are modelled (docs/theory.md §B6): sliding windows
(Mistral, Qwen2/3, Gemma-2/3 sliding layers; ModernBERT's symmetric local layers), query/key
biases under rotary (Qwen2, ``attention_bias``, GPT-NeoX, Falcon with ``bias``), partial rotary
(GPT-NeoX/Pythia ``rotary_pct``, Phi-3 ``partial_rotary_factor``), per-head QK-norm (Qwen3,
Gemma-3 with ``1 + w``), logit soft-capping (Gemma-2), ALiBi (BLOOM). What stays unmodelled is
refused in one line naming it (``UnmodelledFeature``, a ``NotImplementedError`` and a
``ValueError``): QK-norm over all heads at once (OLMo-2), Falcon's ALiBi, ``clip_qkv``,
length-dependent RoPE types (``dynamic``, ``longrope``), interleaved rotary layouts,
bidirectional attention in a causal family, other layer types.

Every map is rebuilt from the extracted weights as a pure torch function
(:func:`meanfield.self_attention`), with our own causal mask: transformers 5.x modules do not mask
themselves (docs/experiments.md, "transformers 5.x"), and forward-mode AD through them is
unreliable. transformers is imported lazily; a missing optional package fails with one line
naming the extra to install (``pip install meanfield[hf]``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
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
from ..params import MultiHeadParams
from . import _families as _fam
from ._families import base_model, detached

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

#: Former name of :data:`meanfield._typing.HeadMap`.
_MAPS = ("heads", "heads+WO", "block")


# ----------------------------------------------------------------------------------------------
# Optional imports
# ----------------------------------------------------------------------------------------------


def import_transformers() -> types.ModuleType:
    try:
        return importlib.import_module("transformers")
    except ImportError:
        raise ImportError(
            "meanfield.models needs transformers: pip install meanfield[hf]"
        ) from None


def require_gguf() -> None:
    for mod in ("gguf", "accelerate"):
        if importlib.util.find_spec(mod) is None:
            raise ImportError(f"loading GGUF checkpoints needs {mod}: pip install meanfield[gguf]")


# ----------------------------------------------------------------------------------------------
# Architecture detection and metadata
# ----------------------------------------------------------------------------------------------


def arch_of(model: Any) -> Arch:
    """The family name of ``model`` (``LayerInfo.arch``), detected from its module structure."""
    return _fam.detect(model).name


def layer_modules(model: Any, arch: Arch) -> Any:
    return _fam.FAMILIES[arch].blocks(base_model(model))


def check_layer(model: Any, arch: Arch, layer: int) -> int:
    n_layers = len(layer_modules(model, arch))
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
    if map == "block" and _fam.FAMILIES[arch].block_norm is None:
        raise ValueError(
            "map='block' (residual + LayerNorm, as BertAttention) exists only for Post-LN BERT "
            f"and DistilBERT layers; {arch} is Pre-LN: use 'heads' or 'heads+WO'"
        )


def max_positions(model: Any) -> int | None:
    """The longest sequence the model's positions cover (its config's limit), or ``None``."""
    cfg = model.config
    for name in ("max_position_embeddings", "n_positions"):
        v = getattr(cfg, name, None)
        if v:
            return int(v)
    return None


def is_causal(model: Any) -> bool:
    """Whether the model's own forward pass applies a causal mask.

    Decoders (GPT-2, OPT, Llama-style, Phi-3, GPT-NeoX, Falcon, BLOOM) are causal; encoders
    (DistilBERT, ViT/DeiT, ModernBERT) are not; BERT-style encoders are causal only when built with
    ``is_decoder=True`` (the paper's BERT-"dec"; its released runs nevertheless differentiated
    the module without a mask, defect D3).

    Parameters
    ----------
    model : transformers.PreTrainedModel

    Returns
    -------
    bool
    """
    fam = _fam.detect(model)
    if fam.name == "bert":
        return bool(getattr(model.config, "is_decoder", False))
    return fam.default_causal


@dataclass(frozen=True)
class LayerInfo:
    """Metadata of one attention layer (docs/experiments.md, "Protocols and defects": labels).

    Parameters
    ----------
    arch : str
        Architecture family: ``"bert"`` (BERT, RoBERTa, ELECTRA), ``"distilbert"``, ``"vit"``
        (ViT, DeiT), ``"gpt2"``, ``"opt"``, ``"llama"`` (Llama-style decoders), ``"phi3"``,
        ``"gpt_neox"``, ``"falcon"``, ``"modernbert"`` or ``"bloom"``.
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
        Biases on the query map and on the output projection.
    norm : {"layernorm", "rmsnorm"}
        Normalization whose output enters (Pre-LN) or follows (Post-LN) attention.
    ln_placement : {"post", "pre"}
    capture_point : str
        Module whose input :func:`hidden_states` captures.
    weight_layout : {"linear", "conv1d"}
        Storage of the projection weights (``nn.Linear`` (out, in) or ``Conv1D`` (in, out)).
    window : int or None, default None
        Sliding-window attention: key ``j`` is admissible for query ``i`` when
        ``|i - j| < window`` (``None``: no window); modelled by the heads' ``window``.
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
    window: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """Plain dictionary (JSON-serializable)."""
        return dict(self.__dict__)


def attention_module(model: Any, arch: Arch, layer: int) -> Any:
    return _fam.FAMILIES[arch].attention(layer_modules(model, arch)[layer])


_LEGACY_CAPTURE = {
    "bert": "input of encoder.layer[{b}]",
    "gpt2": "input of h[{b}].attn (output of h[{b}].ln_1)",
    "llama": "input of layers[{b}].self_attn (output of layers[{b}].input_layernorm)",
}


def _module_names(fam: _fam.Family, blk: Any, map: str) -> str:
    attn = fam.attention(blk)
    cls = type(attn).__name__
    if fam.name == "bert":
        out_cls = type(blk.attention.output).__name__
        return {
            "heads": cls,
            "heads+WO": f"{cls} + {out_cls}.dense",
            "block": type(blk.attention).__name__,
        }[map]
    out_name = fam.out_path.rsplit(".", 1)[-1]
    if map == "block":
        return f"{cls} + residual + {type(blk).__name__}.sa_layer_norm"
    return {"heads": f"{cls} without {out_name}", "heads+WO": cls}[map]


def _extract(
    model: Any, layer: int, map: str, dtype: torch.dtype | None
) -> tuple[_fam.Family, _fam.LayerSpec, LayerInfo]:
    """Family, extracted weights and metadata of one layer (variants recorded, not yet refused)."""
    fam = _fam.detect(model)
    layer = check_layer(model, fam.name, layer)
    _check_map(fam.name, map)
    cfg = model.config
    blocks = fam.blocks(base_model(model))
    blk = blocks[layer]
    spec = fam.extract(model, blk, layer, dtype)
    capture = _LEGACY_CAPTURE.get(fam.name, "input of " + fam.module_path)
    info = LayerInfo(
        arch=fam.name,
        model_type=str(getattr(cfg, "model_type", fam.name)),
        name_or_path=str(getattr(cfg, "_name_or_path", "") or ""),
        layer=layer,
        n_layers=len(blocks),
        map=map,
        module=_module_names(fam, blk, map),
        causal=is_causal(model),
        d=spec.d,
        n_heads=spec.n_heads,
        n_kv_heads=spec.n_kv_heads,
        head_dim=spec.head_dim,
        scale=float(spec.scale),
        has_rope=spec.rope is not None,
        qkv_bias=spec.b_Q is not None,
        out_bias=spec.b_O is not None,
        norm=fam.norm,
        ln_placement=fam.ln_placement,
        capture_point=capture.format(b=layer),
        weight_layout=spec.layout,
        window=spec.window,
    )
    return fam, spec, info


def layer_info(model: Any, layer: int, *, map: HeadMap = "heads+WO") -> LayerInfo:
    """Metadata of attention layer ``layer``: causal flag, architecture, heads, RoPE, capture point.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A model of a supported family (bare or with a head; see the module docstring).
    layer : int
    map : {"heads", "heads+WO", "block"}, default "heads+WO"

    Returns
    -------
    LayerInfo
    """
    return _extract(model, layer, map, None)[2]


# ----------------------------------------------------------------------------------------------
# Parameters
# ----------------------------------------------------------------------------------------------


def _check_n(n: int | None) -> None:
    """Validate the optional sequence length (accepted for compatibility; windows are modelled)."""
    if n is not None and (isinstance(n, bool) or int(n) != n or int(n) < 1):
        raise ValueError(f"n must be a positive integer, got {n!r}")


def _build_params(
    model: Any, layer: int, map: str, dtype: torch.dtype | None, n: int | None
) -> tuple[MultiHeadParams, LayerInfo, _fam.Family]:
    fam, spec, info = _extract(model, layer, map, dtype)
    where = f"{type(model).__name__} layer {info.layer}"
    _fam.refuse_unmodelled(spec, where)
    _check_n(n)
    with_out = map != "heads"
    # Enabling a variant: add its name to _families.MODELLED_VARIANTS and pass
    # spec.variants[name] (or the LayerSpec field holding it) to MultiHeadParams.from_qkv here.
    softcap = spec.variants.get("softcap")
    # A window at least as long as every input the model takes masks nothing: the plain map
    # (which the certificates model) is then the same map.
    window = spec.window
    max_pos = max_positions(model)
    if window is not None and max_pos is not None and max_pos <= window:
        window = None
    params = MultiHeadParams.from_qkv(
        spec.W_Q,
        spec.W_K,
        spec.W_V,
        spec.W_O if with_out else None,
        n_heads=spec.n_heads,
        n_kv_heads=spec.n_kv_heads,
        b_Q=spec.b_Q,
        b_K=spec.b_K,
        b_V=spec.b_V,
        b_O=spec.b_O if with_out else None,
        layout=spec.layout,
        scale=spec.scale,
        rope=spec.rope,
        q_norm=spec.q_norm,
        k_norm=spec.k_norm,
        softcap=None if softcap is None else float(softcap),
        window=window,
        alibi_slopes=spec.alibi_slopes,
    )
    return params, info, fam


def params_from_hf(
    model: Any,
    layer: int,
    *,
    map: HeadMap = "heads+WO",
    dtype: torch.dtype | None = None,
    n: int | None = None,
) -> MultiHeadParams:
    r""":class:`MultiHeadParams` of one attention layer, in the toolkit's score convention.

    Head :math:`h` has :math:`A_h = s\,Q_h^\top K_h` (:math:`s` the layer's logit scale,
    :math:`1/\sqrt k` unless the module says otherwise), :math:`V_h`, the key-logit term
    :math:`c_h = s\,K_h^\top b_{Q,h}` of the query bias and the value bias (docs/theory.md §A8),
    sliced per family (docs/conventions.md §3):

    - BERT-style, DistilBERT, ViT/DeiT, OPT, Llama-style: separate ``nn.Linear`` (out, in)
      projections, head = row block (grouped-query attention for Llama-style).
    - GPT-2: ``c_attn`` ``Conv1D`` (in, out) split along dim 1 into q, k, v; head = **column** block
      (:math:`Q_h = W_q[:, \mathrm{cols}_h]^\top`), defect D5 of docs/experiments.md.
    - Fused ``nn.Linear`` projections: Phi-3 ``qkv_proj`` and ModernBERT ``Wqkv`` as contiguous
      ``[q; k; v]``; GPT-NeoX ``query_key_value`` interleaved per head ``[q_h; k_h; v_h]``;
      Falcon ``query_key_value`` multi-query ``[q; k; v]``, per key/value group
      ``[q_1..q_r; k_g; v_g]`` (``new_decoder_architecture``) or per head.
    - BLOOM ``query_key_value`` per head ``[q_h; k_h; v_h]``, with the model's ALiBi slopes.
    - Rotary families use the model's own ``rotary_emb`` (``inv_freq``, ``attention_scaling``;
      partial rotary as ``RotaryEmbedding(head_dim=k)``); the variants of docs/theory.md §B6
      (windows, head-space biases under rotary, QK-norm, soft-cap, ALiBi) are head fields.

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
    n : int, optional
        The sequence length the parameters will be used at; checked (a positive integer) and
        otherwise unused: sliding windows are modelled at every length.

    Returns
    -------
    MultiHeadParams
        Biases included; the tensors are detached copies of the model's weights on its device.

    Raises
    ------
    NotImplementedError
        For unsupported architectures (the message names the supported families), and, as
        ``UnmodelledFeature`` (also a ``ValueError``), for every attention feature the
        parameters do not model, in one line naming it: QK-norm over all heads (OLMo-2),
        Falcon's ALiBi, ``clip_qkv``, length-dependent RoPE types, interleaved rotary layouts,
        other layer types.
    """
    return _build_params(model, layer, map, dtype, n)[0]


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
    arch = arch_of(model)
    if arch not in ("bert", "gpt2"):
        raise NotImplementedError("the released code handles BERT and GPT-2 only")
    info = layer_info(model, layer, map="heads")  # checks the layer
    if not 0 <= head < info.n_heads:
        raise ValueError(f"head must be in [0, {info.n_heads}), got {head}")
    attn = attention_module(model, arch, info.layer)
    k = info.head_dim
    rows = slice(head * k, (head + 1) * k)
    if arch == "bert":
        Wq, Wk = detached(attn.query.weight, dtype), detached(attn.key.weight, dtype)
    else:
        Wq, Wk, _ = detached(attn.c_attn.weight, dtype).split(info.d, dim=1)
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
            if self.ln_weight is None or self.ln_eps is None:
                raise ValueError("map 'block' needs the block's LayerNorm (ln_weight and ln_eps)")
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
    model: Any,
    layer: int,
    *,
    map: HeadMap = "heads+WO",
    dtype: torch.dtype | None = None,
    n: int | None = None,
) -> HFAttention:
    """Parameters, metadata and (for ``"block"``) LayerNorm of one layer, as a callable map.

    Parameters
    ----------
    model : transformers.PreTrainedModel
    layer : int
    map : {"heads", "heads+WO", "block"}, default "heads+WO"
    dtype : torch.dtype, optional
        Cast of the weights; default the model's dtype.
    n : int, optional
        Sequence length (checked, otherwise unused; see :func:`params_from_hf`).

    Returns
    -------
    HFAttention
    """
    params, info, fam = _build_params(model, layer, map, dtype, n)
    if map != "block":
        return HFAttention(params, info)
    if fam.block_norm is None:  # _check_map refused map="block" already
        raise ValueError(f"map='block' does not exist for {fam.label} layers")
    ln = fam.block_norm(fam.blocks(base_model(model))[info.layer])
    return HFAttention(
        params,
        info,
        detached(ln.weight, dtype),
        detached(ln.bias, dtype),
        float(ln.eps),
    )


def hf_attention_fn(
    model: Any,
    layer: int,
    *,
    map: HeadMap = "heads+WO",
    dtype: torch.dtype | None = None,
    masked: bool | None = None,
    n: int | None = None,
) -> Callable[[Tensor], Tensor]:
    """Build a pure function ``X -> f(X)`` of one layer, for ``local_lipschitz_fn``.

    Parameters
    ----------
    model, layer, map, dtype, n
        As in :func:`hf_attention`.
    masked : bool, optional
        Causal mask; default :func:`is_causal` of the model.

    Returns
    -------
    callable
        Differentiable in ``X`` (shape (..., n, d)); holds no reference to the model.
    """
    att = hf_attention(model, layer, map=map, dtype=dtype, n=n)
    return functools.partial(att, masked=masked)
