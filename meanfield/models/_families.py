r"""Per-family adapters of :mod:`meanfield.models.layers` (private).

Each supported family is one :class:`Family`: how to find its blocks and attention module,
where its query/key/value/output weights live (separate or fused, and the fused layout), how
many query and key/value heads it has, its logit scale, rotary embedding and causal flag. The
extraction returns a :class:`LayerSpec`: the weights in the ``nn.Linear`` layout (or GPT-2's
``Conv1D``) plus the *variants* the layer asks for beyond the plain map (sliding window, QK-norm,
logit soft-cap, ALiBi, partial rotary, query/key biases under rotary, ...).

A variant that :class:`~meanfield.params.AttentionParams` does not model is refused in one line
naming what is missing (:class:`UnmodelledFeature`, both a ``NotImplementedError`` and a
``ValueError``); there is no warning beside a different number and no silent drop. Enabling a
variant once the parameters carry it is one local change: add its name to
:data:`MODELLED_VARIANTS` and pass its value on in ``layers._build_params``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Literal, overload

import torch
from torch import Tensor

from .._typing import Arch
from ..params import RMSNorm, RotaryEmbedding

#: Families, in the words of the error for an unsupported model.
SUPPORTED = (
    "BERT-style encoders (BERT, RoBERTa, ELECTRA), DistilBERT, ViT/DeiT, GPT-2, OPT, "
    "Llama-style decoders (Llama, Mistral, Qwen2, Qwen3, Gemma, Gemma-2, Gemma-3, Phi-3, ...), "
    "GPT-NeoX, Falcon, ModernBERT, BLOOM"
)

#: Variants the extracted parameters model; ``layers._build_params`` passes their values on
#: (``sliding_window``: ``LayerSpec.window``; ``partial_rotary``: ``LayerSpec.rope``).
MODELLED_VARIANTS: frozenset[str] = frozenset(
    {"sliding_window", "softcap", "qk_norm", "alibi", "partial_rotary", "qk_bias_rotary"}
)

#: rope_type values whose frequencies do not depend on the sequence length (the model's own
#: ``inv_freq`` and ``attention_scaling`` then give the embedding exactly).
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


class UnmodelledFeature(NotImplementedError, ValueError):
    """A feature of the model's attention that the toolkit's parameters do not model."""


def base_model(model: Any) -> Any:
    return getattr(model, "base_model", model)


@overload
def detached(x: Tensor, dtype: torch.dtype | None) -> Tensor: ...
@overload
def detached(x: None, dtype: torch.dtype | None) -> None: ...
@overload
def detached(x: Tensor | None, dtype: torch.dtype | None) -> Tensor | None: ...
def detached(x: Tensor | None, dtype: torch.dtype | None) -> Tensor | None:
    """Detached copy (never aliasing the model's parameters), optionally cast."""
    if x is None:
        return None
    y = x.detach()
    return (y.to(dtype) if dtype is not None else y).clone()


@dataclass
class LayerSpec:
    """The extracted weights of one layer and the variants it asks for.

    ``W_Q, W_K, W_V`` are (H k, d), (H_kv k, d), (H_kv k, d) in the ``nn.Linear`` layout (or
    their transposes for ``layout="conv1d"``); ``W_O`` is (d, H k) (transposed for conv1d).
    ``variants`` maps a variant name to what the layer asks for; ``window`` is the sliding window
    :math:`W` (key ``j`` admissible for query ``i`` when :math:`|i - j| < W`; ``None``: no
    window); ``q_norm``/``k_norm`` the per-head QK-norm and ``alibi_slopes`` one ALiBi slope per
    query head (in the scale of the logits); the soft-cap is ``variants["softcap"]``.
    """

    W_Q: Tensor
    W_K: Tensor
    W_V: Tensor
    W_O: Tensor | None
    b_Q: Tensor | None
    b_K: Tensor | None
    b_V: Tensor | None
    b_O: Tensor | None
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d: int
    scale: float
    layout: Literal["linear", "conv1d"] = "linear"
    rope: RotaryEmbedding | None = None
    window: int | None = None
    variants: dict[str, Any] = field(default_factory=dict)
    q_norm: RMSNorm | None = None
    k_norm: RMSNorm | None = None
    alibi_slopes: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Family:
    """How one architecture family stores its attention (docs/conventions.md §3).

    ``name`` is the ``arch`` of :class:`~meanfield.models.LayerInfo`; ``blocks(base)`` the list of
    blocks; ``attention(block)`` the module whose input is the attention map's input;
    ``out(block)`` the output projection (its input is the ``"heads"`` map, its output the
    ``"heads+WO"`` map); ``extract(model, block, layer, dtype)`` the :class:`LayerSpec`.
    """

    name: Arch
    label: str
    blocks: Callable[[Any], Any]
    attention: Callable[[Any], Any]
    out: Callable[[Any], Any]
    extract: Callable[[Any, Any, int, torch.dtype | None], LayerSpec]
    rotary: bool
    norm: str
    ln_placement: str
    weight_layout: str
    default_causal: bool
    module_path: str
    out_path: str
    capture_block: bool = False
    block_norm: Callable[[Any], Any] | None = None
    token_types: bool = False
    reads: str = "input_ids"


# ----------------------------------------------------------------------------------------------
# Variants asked for by a layer (config fields and modules)
# ----------------------------------------------------------------------------------------------


def _get(cfg: Any, name: str, default: Any = None) -> Any:
    return getattr(cfg, name, default)


def _rope_parameters(cfg: Any, layer_type: str | None) -> dict:
    rp = _get(cfg, "rope_parameters") or {}
    if layer_type is not None and isinstance(rp.get(layer_type), dict):
        rp = rp[layer_type]
    return dict(rp) if isinstance(rp, dict) else {}


def _layer_type(cfg: Any, layer: int) -> str | None:
    types_ = _get(cfg, "layer_types")
    if not types_:
        return None
    lt = str(types_[layer])
    if lt not in ("full_attention", "sliding_attention"):
        raise UnmodelledFeature(
            f"layer {layer} is a {lt!r} layer (config.layer_types): only full and sliding-window "
            "attention layers are modelled"
        )
    return lt


def _window(model: Any, attn: Any, layer: int, variants: dict[str, Any]) -> int | None:
    r"""The layer's sliding window :math:`W` (``None``: no window), recorded in ``variants``.

    Key ``j`` is admissible for query ``i`` when :math:`|i - j| < W` (``AttentionParams.window``).

    Causal windows (``masking_utils.sliding_window_overlay``) let query ``i`` see keys
    ``j > i - w``: :math:`W = w`, the config's ``sliding_window``. Attention modules that carry
    their own ``sliding_window`` (Gemma-2/3, Qwen2/3, ModernBERT, whose bidirectional window sees
    ``|i - j| <= local_attention // 2`` and stores that plus one) give :math:`W` directly.
    """
    cfg = model.config
    lt = _layer_type(cfg, layer)
    if hasattr(attn, "sliding_window"):
        w = attn.sliding_window
    elif lt == "full_attention" or _get(cfg, "use_sliding_window", True) is False:
        w = None
    else:
        w = _get(cfg, "sliding_window")
    if w is None:
        return None
    variants["sliding_window"] = int(w)
    return int(w)


def _config_variants(model: Any, attn: Any, layer: int) -> dict[str, Any]:
    """Attention-relevant config fields and modules beyond the plain map, common to all families."""
    cfg = model.config
    v: dict[str, Any] = {}
    cap = _get(attn, "attn_logit_softcapping", _get(cfg, "attn_logit_softcapping"))
    if cap is not None:
        v["softcap"] = float(cap)
    for attr in ("q_norm", "k_norm", "q_layernorm", "k_layernorm"):
        if _get(attn, attr) is not None:
            v["qk_norm"] = attr
            break
    if _get(cfg, "qk_layernorm") or _get(cfg, "use_qk_norm"):
        v.setdefault("qk_norm", "qk_layernorm" if _get(cfg, "qk_layernorm") else "use_qk_norm")
    if _get(cfg, "clip_qkv") is not None:
        v["clip_qkv"] = float(cfg.clip_qkv)
    if _get(cfg, "alibi") or _get(cfg, "use_alibi"):
        v["alibi_config"] = "alibi" if _get(cfg, "alibi") else "use_alibi"
    if _get(cfg, "attention_chunk_size"):
        v["chunked"] = int(cfg.attention_chunk_size)
    if _get(cfg, "use_bidirectional_attention"):
        v["bidirectional"] = True
    qpas = _get(cfg, "query_pre_attn_scalar")
    scaling = _get(attn, "scaling")
    if qpas is not None and (scaling is None or not math.isclose(float(scaling), qpas**-0.5)):
        v["query_pre_attn_scalar"] = qpas
    return v


#: The one-line message of each variant (formatted with the variant's value as ``v``).
MESSAGES: dict[str, str] = {
    "softcap": "attention logit soft-capping (attn_logit_softcapping={v}) is not modelled",
    "qk_norm": "QK-norm ({v} normalizes queries/keys) is not modelled",
    "clip_qkv": "clipping of q/k/v (clip_qkv={v}) is not modelled",
    "alibi": "ALiBi position biases are not modelled",
    "alibi_config": "ALiBi position biases (config.{v}) are not modelled for this family",
    "falcon_alibi": "Falcon's ALiBi is not modelled: transformers builds it in bfloat16 and adds "
    "it twice (in the mask and in the scores)",
    "qk_norm_all_heads": "QK-norm over all heads at once ({v}) is not modelled: it couples the "
    "heads (OLMo-2); per-head RMS norms (Qwen3, Gemma-3) are",
    "qk_norm_type": "QK-norm {v} is not an RMS norm of the head's width and is not modelled",
    "sliding_window": "sliding-window attention (window {v}) is not modelled",
    "chunked": "chunked attention (attention_chunk_size={v}) is not modelled",
    "bidirectional": "bidirectional attention in a causal family (use_bidirectional_attention) "
    "is not modelled",
    "query_pre_attn_scalar": "query_pre_attn_scalar={v} differs from the module's logit scale",
    "partial_rotary": "partial rotary embedding ({v}) is not modelled",
    "qk_bias_rotary": "rotary attention with query/key biases is not modelled (the rotation "
    "depends on the position, so the key bias does not cancel)",
    "rotary_layout": "the rotary embedding of {v} is not in the rotate_half layout (e.g. "
    "interleaved pairs) and is not modelled",
    "rope_type": "rope_type {v!r} is not modelled (supported: "
    + ", ".join(STATIC_ROPE_TYPES)
    + "; dynamic and longrope change their frequencies with the sequence length)",
}


def refuse_unmodelled(spec: LayerSpec, where: str) -> None:
    """Raise :class:`UnmodelledFeature` for the first variant not in :data:`MODELLED_VARIANTS`."""
    for name, value in spec.variants.items():
        # QK-norm is modelled only where the adapter extracted the per-head norms
        if name not in MODELLED_VARIANTS or (name == "qk_norm" and spec.q_norm is None):
            raise UnmodelledFeature(f"{where}: " + MESSAGES[name].format(v=value))


# ----------------------------------------------------------------------------------------------
# Rotary embeddings
# ----------------------------------------------------------------------------------------------


def _rope(
    model: Any, layer: int, head_dim: int, dtype: torch.dtype | None, variants: dict[str, Any]
) -> RotaryEmbedding:
    """The model's own rotary embedding of layer ``layer``; records unmodelled rope variants."""
    cfg = model.config
    rot = base_model(model).rotary_emb
    lt = _layer_type(cfg, layer)
    if lt is not None and hasattr(rot, f"{lt}_inv_freq"):  # per-layer-type rope (ModernBERT)
        inv_freq = getattr(rot, f"{lt}_inv_freq")
        scaling = getattr(rot, f"{lt}_attention_scaling", 1.0)
        rope_type = getattr(rot, "rope_type", {}).get(lt, "default")
    else:
        inv_freq = rot.inv_freq
        scaling = getattr(rot, "attention_scaling", 1.0)
        rope_type = getattr(rot, "rope_type", "default")
    if rope_type not in STATIC_ROPE_TYPES:
        variants["rope_type"] = rope_type
    rot_dim = 2 * inv_freq.numel()
    if rot_dim != head_dim:
        factor = _rope_parameters(cfg, lt).get("partial_rotary_factor")
        variants["partial_rotary"] = f"{rot_dim} of {head_dim} dims" + (
            f", partial_rotary_factor={factor}" if factor is not None else ""
        )
    inv_freq = inv_freq.detach()
    inv_freq = inv_freq.to(dtype) if dtype is not None else inv_freq
    return RotaryEmbedding(inv_freq.clone(), float(scaling), head_dim=head_dim)


def _qk_norms(
    attn: Any, head_dim: int, dtype: torch.dtype | None, variants: dict[str, Any]
) -> tuple[RMSNorm | None, RMSNorm | None]:
    """The per-head QK-norm of ``attn`` as :class:`RMSNorm` (Gemma's ``1 + weight`` included).

    Each norm module is run on a probe and compared with ``RMSNorm(w)`` and ``RMSNorm(1 + w)``:
    a norm over all heads at once (OLMo-2, width ``H k``) or of another kind (LayerNorm) is
    recorded as a refused variant instead of the modelled ``qk_norm``.
    """
    if "qk_norm" not in variants:
        return None, None
    names = ("q_layernorm", "k_layernorm") if _get(attn, "q_layernorm") else ("q_norm", "k_norm")
    mods = tuple(_get(attn, n) for n in names)
    out: list[RMSNorm] = []
    for name, mod in zip(names, mods):
        w = _get(mod, "weight")
        eps = _get(mod, "variance_epsilon", _get(mod, "eps"))
        if not isinstance(w, Tensor) or w.ndim != 1 or eps is None:
            variants["qk_norm_type"] = f"{name} ({type(mod).__name__})"
            break
        if w.numel() != head_dim:
            variants["qk_norm_all_heads"] = f"{name} of width {w.numel()}, heads of {head_dim}"
            break
        norm = _rms_form(mod, w, float(eps))
        if norm is None:
            variants["qk_norm_type"] = f"{name} ({type(mod).__name__})"
            break
        out.append(norm)
    if len(out) != 2:
        del variants["qk_norm"]
        return None, None
    variants["qk_norm"] = type(mods[0]).__name__
    qn, kn = out
    return RMSNorm(detached(qn.weight, dtype), qn.eps), RMSNorm(detached(kn.weight, dtype), kn.eps)


def _rms_form(mod: Any, w: Tensor, eps: float) -> RMSNorm | None:
    """``RMSNorm(w, eps)`` or ``RMSNorm(1 + w, eps)``, whichever ``mod`` computes (else None)."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(3, w.numel(), generator=g, dtype=torch.float64)
    w64 = w.detach().to(device="cpu", dtype=torch.float64)
    try:
        with torch.no_grad():
            got = mod(z.to(device=w.device, dtype=w.dtype)).to("cpu", torch.float64)
    except Exception:  # noqa: BLE001  (an unknown module is an unknown norm)
        return None
    for weight in (w64, 1.0 + w64):
        ours = RMSNorm(weight, eps).apply(z)
        if got.shape == ours.shape and bool(torch.allclose(got, ours, rtol=1e-5, atol=1e-5)):
            return RMSNorm(weight.to(device=w.device, dtype=w.dtype), eps)  # the model's dtype
    return None


def _rotate_half_layout(model: Any, attn: Any, layer: int, rope: RotaryEmbedding) -> bool:
    """Whether the model's own rotation is the ``rotate_half`` layout of :class:`RotaryEmbedding`.

    The model's ``rotary_emb`` and its modeling module's ``apply_rotary_pos_emb`` are run on a
    probe of five positions: families that interleave the pairs (Cohere, GPT-J style) or
    rotate otherwise fail it and are refused instead of silently mis-rotated.
    """
    fn = getattr(sys.modules.get(type(attn).__module__), "apply_rotary_pos_emb", None)
    rot = base_model(model).rotary_emb
    if fn is None:
        return False
    device = rope.inv_freq.device
    pos = torch.arange(5, device=device)[None]
    g = torch.Generator().manual_seed(0)
    z = torch.randn(1, 1, 5, rope.k, generator=g, dtype=torch.float64).to(device)
    lt = _layer_type(model.config, layer)
    try:
        with torch.no_grad():
            if lt is not None and hasattr(rot, f"{lt}_inv_freq"):
                cos, sin = rot(z, pos, lt)
            else:
                cos, sin = rot(z, pos)
            got = fn(z, z, cos, sin)[0].to(torch.float64)
            ours = rope.apply(z, pos[0]).to(torch.float64)
    except Exception:  # noqa: BLE001  (an unknown signature is an unknown layout)
        return False
    return got.shape == ours.shape and bool(torch.allclose(got, ours, rtol=1e-5, atol=1e-5))


def _rotary_spec(
    model: Any, attn: Any, layer: int, dtype: torch.dtype | None, **w: Any
) -> LayerSpec:
    """A :class:`LayerSpec` of a rotary family from weights in the ``nn.Linear`` layout."""
    variants = _config_variants(model, attn, layer)
    rope = _rope(model, layer, w["head_dim"], dtype, variants)
    if not _rotate_half_layout(model, attn, layer, rope):
        variants["rotary_layout"] = type(attn).__module__.rsplit(".", 1)[-1]
    if w["b_Q"] is not None or w["b_K"] is not None:
        variants["qk_bias_rotary"] = True
    q_norm, k_norm = _qk_norms(attn, w["head_dim"], dtype, variants)
    window = _window(model, attn, layer, variants)
    return LayerSpec(**w, rope=rope, window=window, variants=variants, q_norm=q_norm, k_norm=k_norm)


def _bias(lin: Any) -> Tensor | None:
    return getattr(lin, "bias", None)


# ----------------------------------------------------------------------------------------------
# Extraction per family
# ----------------------------------------------------------------------------------------------


def _separate(
    attn: Any, qkvo: tuple, dtype: torch.dtype | None, H: int, k: int, Hkv: int | None = None
) -> dict[str, Any]:
    """Weights of separate q, k, v, o projections (the modules ``qkvo``) of ``attn``.

    ``H`` query heads (``Hkv`` key/value heads, default ``H``) of width ``k``; the logit scale is
    the module's ``scaling`` (default ``k ** -0.5``).
    """
    w = {f"W_{x}": detached(m.weight, dtype) for x, m in zip("QKVO", qkvo)}
    b = {f"b_{x}": detached(_bias(m), dtype) for x, m in zip("QKVO", qkvo)}
    return dict(
        **w, **b, d=int(qkvo[0].in_features), n_heads=H, n_kv_heads=H if Hkv is None else Hkv,
        head_dim=k, scale=float(getattr(attn, "scaling", k**-0.5)),
    )  # fmt: skip


def _bert(model: Any, blk: Any, layer: int, dtype: torch.dtype | None) -> LayerSpec:
    a = blk.attention.self
    qkvo = (a.query, a.key, a.value, blk.attention.output.dense)
    w = _separate(a, qkvo, dtype, int(a.num_attention_heads), int(a.attention_head_size))
    return LayerSpec(**w, variants=_config_variants(model, a, layer))


def _distilbert(model: Any, blk: Any, layer: int, dtype: torch.dtype | None) -> LayerSpec:
    a = blk.attention
    qkvo = (a.q_lin, a.k_lin, a.v_lin, a.out_lin)
    w = _separate(a, qkvo, dtype, int(a.n_heads), int(a.attention_head_size))
    return LayerSpec(**w, variants=_config_variants(model, a, layer))


def _vit(model: Any, blk: Any, layer: int, dtype: torch.dtype | None) -> LayerSpec:
    a = blk.attention
    qkvo = (a.q_proj, a.k_proj, a.v_proj, a.o_proj)
    w = _separate(a, qkvo, dtype, int(a.num_attention_heads), int(a.head_dim))
    return LayerSpec(**w, variants=_config_variants(model, a, layer))


def _opt(model: Any, blk: Any, layer: int, dtype: torch.dtype | None) -> LayerSpec:
    a = blk.self_attn
    qkvo = (a.q_proj, a.k_proj, a.v_proj, a.out_proj)
    w = _separate(a, qkvo, dtype, int(a.num_heads), int(a.head_dim))
    variants = _config_variants(model, a, layer)
    window = _window(model, a, layer, variants)
    return LayerSpec(**w, window=window, variants=variants)


def _gpt2(model: Any, blk: Any, layer: int, dtype: torch.dtype | None) -> LayerSpec:
    a = blk.attn
    d, H, k = int(a.embed_dim), int(a.num_heads), int(a.head_dim)
    W = detached(a.c_attn.weight, dtype)  # Conv1D: (in, out) = (d, 3d)
    b = detached(a.c_attn.bias, dtype)
    W_q, W_k, W_v = W.split(d, dim=1)
    b_q, b_k, b_v = (None, None, None) if b is None else b.split(d)
    return LayerSpec(
        W_q, W_k, W_v, detached(a.c_proj.weight, dtype), b_q, b_k, b_v, detached(a.c_proj.bias, dtype),
        n_heads=H, n_kv_heads=H, head_dim=k, d=d, scale=_gpt2_scale(a, k), layout="conv1d",
        variants=_config_variants(model, a, layer),
    )  # fmt: skip


def _gpt2_scale(attn: Any, head_dim: int) -> float:
    if hasattr(attn, "scaling"):
        return float(attn.scaling)
    s = head_dim**-0.5 if getattr(attn, "scale_attn_weights", True) else 1.0
    if getattr(attn, "scale_attn_by_inverse_layer_idx", False):
        s /= float(attn.layer_idx + 1)
    return s


def _llama(model: Any, blk: Any, layer: int, dtype: torch.dtype | None) -> LayerSpec:
    a = blk.self_attn
    cfg = model.config
    H = int(cfg.num_attention_heads)
    Hkv = int(getattr(cfg, "num_key_value_heads", None) or H)
    w = _separate(a, (a.q_proj, a.k_proj, a.v_proj, a.o_proj), dtype, H, int(a.head_dim), Hkv)
    return _rotary_spec(model, a, layer, dtype, **w)


def _fused(
    qkv: Any,
    o: Any,
    dtype: torch.dtype | None,
    split: Callable[[Tensor], tuple[Tensor, Tensor, Tensor]],
    **h: Any,
) -> dict[str, Any]:
    """Weights of a fused q/k/v projection, split by ``split`` along the output dimension."""
    W = detached(qkv.weight, dtype)
    b = detached(_bias(qkv), dtype)
    W_Q, W_K, W_V = split(W)
    b_Q, b_K, b_V = (None, None, None) if b is None else split(b)
    return dict(
        W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=detached(o.weight, dtype),
        b_Q=b_Q, b_K=b_K, b_V=b_V, b_O=detached(_bias(o), dtype), d=int(W.shape[-1]), **h,
    )  # fmt: skip


def _split_blocks(sizes: tuple[int, int, int]) -> Callable[[Tensor], tuple[Tensor, Tensor, Tensor]]:
    """Contiguous [q; k; v] blocks of the given sizes (Phi-3, ModernBERT)."""

    def split(W: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = W.split(sizes, dim=0)
        return q.contiguous(), k.contiguous(), v.contiguous()

    return split


def _split_grouped(
    n_groups: int, per_group: int, k: int
) -> Callable[[Tensor], tuple[Tensor, Tensor, Tensor]]:
    """Per-group interleaving ``[q_1..q_r, k, v]`` (GPT-NeoX and Falcon with r = 1; Falcon-40B)."""

    def split(W: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        G = W.reshape(n_groups, per_group + 2, k, *W.shape[1:])
        q = G[:, :per_group].reshape(n_groups * per_group * k, *W.shape[1:])
        kk = G[:, per_group].reshape(n_groups * k, *W.shape[1:])
        v = G[:, per_group + 1].reshape(n_groups * k, *W.shape[1:])
        return q.contiguous(), kk.contiguous(), v.contiguous()

    return split


def _phi3(model: Any, blk: Any, layer: int, dtype: torch.dtype | None) -> LayerSpec:
    a = blk.self_attn
    cfg = model.config
    H, Hkv, k = int(cfg.num_attention_heads), int(a.num_key_value_heads), int(a.head_dim)
    w = _fused(
        a.qkv_proj, a.o_proj, dtype, _split_blocks((H * k, Hkv * k, Hkv * k)),
        n_heads=H, n_kv_heads=Hkv, head_dim=k, scale=float(a.scaling),
    )  # fmt: skip
    return _rotary_spec(model, a, layer, dtype, **w)


def _gpt_neox(model: Any, blk: Any, layer: int, dtype: torch.dtype | None) -> LayerSpec:
    a = blk.attention
    H, k = int(model.config.num_attention_heads), int(a.head_size)
    w = _fused(
        a.query_key_value, a.dense, dtype, _split_grouped(H, 1, k),
        n_heads=H, n_kv_heads=H, head_dim=k, scale=float(a.scaling),
    )  # fmt: skip
    return _rotary_spec(model, a, layer, dtype, **w)


def _falcon(model: Any, blk: Any, layer: int, dtype: torch.dtype | None) -> LayerSpec:
    a = blk.self_attention
    H, k = int(a.num_heads), int(a.head_dim)
    if a.new_decoder_architecture:  # [q_1..q_r, k, v] per key/value group
        Hkv = int(a.num_kv_heads)
        split = _split_grouped(Hkv, H // Hkv, k)
    elif a.multi_query:  # [q (H k); k (k); v (k)]
        Hkv = 1
        split = _split_blocks((H * k, k, k))
    else:  # [q_h, k_h, v_h] per head
        Hkv = H
        split = _split_grouped(H, 1, k)
    w = _fused(
        a.query_key_value, a.dense, dtype, split,
        n_heads=H, n_kv_heads=Hkv, head_dim=k, scale=float(a.inv_norm_factor),
    )  # fmt: skip
    if getattr(model.config, "alibi", False):
        variants = _config_variants(model, a, layer)
        variants.pop("alibi_config", None)
        return LayerSpec(**w, variants={**variants, "falcon_alibi": True})
    return _rotary_spec(model, a, layer, dtype, **w)


def _modernbert(model: Any, blk: Any, layer: int, dtype: torch.dtype | None) -> LayerSpec:
    a = blk.attn
    H, k = int(model.config.num_attention_heads), int(a.head_dim)
    w = _fused(
        a.Wqkv, a.Wo, dtype, _split_blocks((H * k, H * k, H * k)),
        n_heads=H, n_kv_heads=H, head_dim=k, scale=k**-0.5,
    )  # fmt: skip
    return _rotary_spec(model, a, layer, dtype, **w)


def _bloom(model: Any, blk: Any, layer: int, dtype: torch.dtype | None) -> LayerSpec:
    """BLOOM: fused ``query_key_value`` per head ``[q_h; k_h; v_h]``, ALiBi, no rotary.

    The logit is ``alibi + inv_norm_factor * q.k`` (``baddbmm`` with ``beta = 1``): the slopes
    enter unscaled. They are the model's own (``build_alibi_tensor`` at key position 1, float32).
    """
    a = blk.self_attention
    H, k = int(a.num_heads), int(a.head_dim)
    w = _fused(
        a.query_key_value, a.dense, dtype, _split_grouped(H, 1, k),
        n_heads=H, n_kv_heads=H, head_dim=k, scale=float(a.inv_norm_factor),
    )  # fmt: skip
    if float(getattr(a, "beta", 1.0)) != 1.0:
        raise UnmodelledFeature(f"{type(model).__name__}: ALiBi with beta={a.beta} is not modelled")
    mask = torch.ones(1, 2, dtype=torch.long)
    alibi = base_model(model).build_alibi_tensor(mask, H, torch.float32)  # (H, 1, 2): m_h * [0, 1]
    slopes = tuple(float(m) for m in alibi.reshape(H, 2)[:, 1].tolist())
    variants = _config_variants(model, a, layer)
    variants["alibi"] = "BLOOM"
    return LayerSpec(**w, variants=variants, alibi_slopes=slopes)


# ----------------------------------------------------------------------------------------------
# The families and their structural detection
# ----------------------------------------------------------------------------------------------


def _family(
    name: Arch,
    label: str,
    blocks: str,
    attention: str,
    out: str,
    extract: Callable[[Any, Any, int, torch.dtype | None], LayerSpec],
    *,
    rotary: bool,
    causal: bool,
    norm: str = "layernorm",
    ln_placement: str = "pre",
    weight_layout: str = "linear",
    block_norm: str | None = None,
    **kw: Any,
) -> Family:
    """A :class:`Family` with modules at attribute paths (``out``, ``block_norm``: in a block)."""
    at = f"{blocks}[{{b}}]."
    return Family(
        name, label, attrgetter(blocks), attrgetter(attention), attrgetter(out), extract,
        rotary=rotary, norm=norm, ln_placement=ln_placement, weight_layout=weight_layout,
        default_causal=causal, module_path=at + attention, out_path=at + out,
        block_norm=None if block_norm is None else attrgetter(block_norm), **kw,
    )  # fmt: skip


FAMILIES: dict[str, Family] = {f.name: f for f in (
    _family("bert", "BERT-style encoder", "encoder.layer", "attention.self",
            "attention.output.dense", _bert, rotary=False, causal=False, ln_placement="post",
            capture_block=True, block_norm="attention.output.LayerNorm", token_types=True),
    _family("distilbert", "DistilBERT", "transformer.layer", "attention", "attention.out_lin",
            _distilbert, rotary=False, causal=False, ln_placement="post",
            block_norm="sa_layer_norm"),
    _family("vit", "ViT/DeiT vision encoder", "layers", "attention", "attention.o_proj", _vit,
            rotary=False, causal=False, reads="pixel_values"),
    _family("gpt2", "GPT-2", "h", "attn", "attn.c_proj", _gpt2, rotary=False, causal=True,
            weight_layout="conv1d", token_types=True),
    _family("opt", "OPT", "decoder.layers", "self_attn", "self_attn.out_proj", _opt,
            rotary=False, causal=True),
    _family("llama", "Llama-style decoder", "layers", "self_attn", "self_attn.o_proj", _llama,
            rotary=True, causal=True, norm="rmsnorm"),
    _family("phi3", "Phi-3", "layers", "self_attn", "self_attn.o_proj", _phi3, rotary=True,
            causal=True, norm="rmsnorm"),
    _family("gpt_neox", "GPT-NeoX", "layers", "attention", "attention.dense", _gpt_neox,
            rotary=True, causal=True),
    _family("falcon", "Falcon", "h", "self_attention", "self_attention.dense", _falcon,
            rotary=True, causal=True),
    _family("modernbert", "ModernBERT", "layers", "attn", "attn.Wo", _modernbert, rotary=True,
            causal=False),
    _family("bloom", "BLOOM", "h", "self_attention", "self_attention.dense", _bloom,
            rotary=False, causal=True),
)}  # fmt: skip


def _block0(base: Any) -> Any:
    for path in (
        ("encoder", "layer"),
        ("transformer", "layer"),
        ("decoder", "layers"),
        ("h",),
        ("layers",),
    ):
        obj = base
        for p in path:
            obj = getattr(obj, p, None)
            if obj is None:
                break
        if obj is not None:
            try:
                return obj[0]
            except (TypeError, IndexError, KeyError):
                continue
    return None


def detect(model: Any) -> Family:
    """The :class:`Family` of ``model``, from its module structure."""
    base = base_model(model)
    blk = _block0(base)
    name = None if blk is None else _detect_block(base, blk)
    if name is not None:
        return FAMILIES[name]
    raise NotImplementedError(
        f"unsupported model {type(model).__name__}: meanfield.models handles {SUPPORTED}"
    )


def _detect_block(base: Any, blk: Any) -> str | None:
    att = getattr(blk, "attention", None)
    if att is not None and hasattr(getattr(att, "self", None), "query"):
        return "bert"
    if att is not None and hasattr(att, "q_lin"):
        return "distilbert"
    if att is not None and hasattr(att, "query_key_value") and hasattr(att, "rotary_ndims"):
        return "gpt_neox"
    if att is not None and hasattr(att, "q_proj") and hasattr(att, "o_proj"):
        return None if hasattr(base, "rotary_emb") else "vit"
    attn = getattr(blk, "attn", None)
    if attn is not None and hasattr(attn, "c_attn"):
        return "gpt2"
    if attn is not None and hasattr(attn, "Wqkv") and hasattr(base, "rotary_emb"):
        return "modernbert"
    sa = getattr(blk, "self_attention", None)
    if sa is not None and hasattr(sa, "query_key_value"):
        return "falcon" if hasattr(sa, "new_decoder_architecture") else "bloom"
    sa = getattr(blk, "self_attn", None)
    if sa is not None and hasattr(sa, "qkv_proj") and hasattr(base, "rotary_emb"):
        return "phi3"
    if sa is not None and hasattr(sa, "q_proj"):
        if hasattr(sa, "o_proj") and hasattr(base, "rotary_emb"):
            return "llama"
        if hasattr(sa, "out_proj") and not hasattr(base, "rotary_emb"):
            return "opt"
    return None
