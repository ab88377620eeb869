r"""A Hugging Face transformer block as a pure torch function of its input (docs/profile.md).

:func:`model_blocks` rebuilds the blocks of a BERT, GPT-2, Llama-style or Gemma model (Gemma-1,
Gemma-2, Gemma-3 text) or of a ViT/DeiT vision encoder from its weights, cast to a chosen dtype: attention through the toolkit's
:func:`meanfield.self_attention` with the model's own causal mask, the MLP, the norms and the
residual connections. The tests check each block against the model's own forward pass.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .._typing import Arch
from ..models._families import UnmodelledFeature
from ..models.capture import model_device
from ..models.layers import HFAttention, arch_of, hf_attention, layer_modules

__all__ = ["TransformerBlock", "model_blocks"]


def _activation(name: str) -> Callable[[Tensor], Tensor]:
    """The MLP activation of ``config.hidden_act`` / ``activation_function``, as a pure function."""
    table: dict[str, Callable[[Tensor], Tensor]] = {
        "gelu": F.gelu,
        "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
        "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
        "relu": F.relu,
        "silu": F.silu,
        "swish": F.silu,
    }
    if name not in table:
        raise UnmodelledFeature(
            f"MLP activation {name!r} is not supported (supported: {', '.join(sorted(table))})"
        )
    return table[name]


@dataclass(frozen=True, eq=False)
class _Linear:
    """An affine map stored as ``W`` (out, in) and an optional bias."""

    W: Tensor
    b: Tensor | None

    def __call__(self, x: Tensor) -> Tensor:
        return F.linear(x, self.W, self.b)


@dataclass(frozen=True, eq=False)
class _Norm:
    """LayerNorm (with shift) or RMSNorm (``b is None`` and ``rms``).

    ``unit_offset``: Gemma's RMSNorm, which stores ``w`` and scales by ``1 + w`` (transformers'
    ``GemmaRMSNorm``: the normalised ``x`` times ``1.0 + weight``, in that order).
    """

    w: Tensor
    b: Tensor | None
    eps: float
    rms: bool
    unit_offset: bool = False

    def __call__(self, x: Tensor) -> Tensor:
        if self.rms:
            w = 1.0 + self.w if self.unit_offset else self.w
            return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.eps) * w
        return F.layer_norm(x, (x.shape[-1],), self.w, self.b, self.eps)


def _copy(t: Tensor, dtype: torch.dtype, device: Any) -> Tensor:
    return t.detach().to(device=device, dtype=dtype).clone()


def _copy_opt(t: Tensor | None, dtype: torch.dtype, device: Any) -> Tensor | None:
    return None if t is None else _copy(t, dtype, device)


def _lin(module: Any, dtype: torch.dtype, device: Any, *, conv1d: bool = False) -> _Linear:
    W = module.weight.detach()
    W = W.mT if conv1d else W  # Conv1D stores (in, out)
    return _Linear(_copy(W, dtype, device), _copy_opt(module.bias, dtype, device))


def _norm(
    module: Any, dtype: torch.dtype, device: Any, *, rms: bool, unit_offset: bool = False
) -> _Norm:
    eps: Any = getattr(module, "variance_epsilon", None)
    if eps is None:
        eps = getattr(module, "eps", 1e-5)
    return _Norm(
        _copy(module.weight, dtype, device),
        None if rms else _copy_opt(getattr(module, "bias", None), dtype, device),
        float(eps),
        rms,
        unit_offset,
    )


@dataclass(frozen=True, eq=False)
class TransformerBlock:
    r"""One transformer block of a Hugging Face model as a pure, differentiable torch map.

    Calling it maps the hidden states entering the block, shape (..., n, d), to those leaving
    it, in eval mode (no dropout), rotary positions ``0, ..., n-1``:

    - BERT (Post-LN): :math:`a = \mathrm{LN}_1(x + \mathrm{MHSA}(x))`,
      :math:`y = \mathrm{LN}_2(a + W_{\mathrm{down}}\,\phi(W_{\mathrm{up}}a))`;
    - GPT-2 and ViT/DeiT (Pre-LN): :math:`h = x + \mathrm{MHSA}(\mathrm{LN}_1 x)`,
      :math:`y = h + W_{\mathrm{down}}\,\phi(W_{\mathrm{up}}\mathrm{LN}_2 h)` (ViT/DeiT:
      ``layernorm_before``, ``layernorm_after``, ``mlp.fc1``, ``mlp.fc2``);
    - Llama-style (Pre-RMSNorm, gated MLP): :math:`h = x + \mathrm{MHSA}(\mathrm{N}_1 x)`,
      :math:`y = h + \mathrm{MLP}(\mathrm{N}_2 h)`, with
      :math:`\mathrm{MLP}(z) = W_{\mathrm{down}}(\phi(W_{\mathrm{gate}}z)\odot
      W_{\mathrm{up}}z)`; Gemma-1 is this block with Gemma's RMSNorm
      (:math:`\hat x\,(1 + w)`, :math:`\hat x = x/\sqrt{\mathrm{mean}(x^2)+\epsilon}`);
    - Gemma-2 and Gemma-3 (Gemma RMSNorms before and after each sublayer, gated MLP):
      :math:`h = x + \mathrm{N}^{\mathrm{post}}_1(\mathrm{MHSA}(\mathrm{N}_1 x))`,
      :math:`y = h + \mathrm{N}^{\mathrm{post}}_2(\mathrm{MLP}(\mathrm{N}_2 h))`;

    with :math:`\mathrm{MHSA}` the attention with its output projection and biases
    (:func:`meanfield.self_attention`; causal when the model is, with the layer's own window,
    logit soft-cap, QK-norm and scale as :func:`meanfield.models.hf_attention` reads them) and
    biases on every affine map that has one. Gemma's embedding scale
    (:math:`\sqrt d`) and final logit soft-cap lie outside the blocks.

    Attributes
    ----------
    layer : int
    arch : {"bert", "gpt2", "llama", "vit"}
    attention : HFAttention
        The attention sublayer (map ``"heads+WO"``).
    linears : dict of str to (W, b)
        The block's affine maps, ``W`` in (out, in) layout: ``q``, ``k``, ``v``, ``o``, ``up``,
        ``down`` and (Llama, Gemma) ``gate``.
    post_attention_norm, post_mlp_norm : _Norm or None
        The norms of the attention's and the MLP's outputs (Gemma-2 and Gemma-3:
        ``post_attention_layernorm`` and ``post_feedforward_layernorm``); ``None`` elsewhere.
    """

    layer: int
    arch: str
    attention: HFAttention
    norm1: _Norm
    norm2: _Norm
    mlp: dict[str, _Linear]
    act: Callable[[Tensor], Tensor]
    linears: dict[str, tuple[Tensor, Tensor | None]] = field(default_factory=dict)
    post_attention_norm: _Norm | None = None
    post_mlp_norm: _Norm | None = None

    @property
    def causal(self) -> bool:
        """Whether the attention is masked (the model's own mask)."""
        return self.attention.causal

    def attention_input(self, x: Tensor) -> Tensor:
        """The input of the attention sublayer: ``x`` (Post-LN) or the first norm of ``x``."""
        return x if self.arch == "bert" else self.norm1(x)

    def _mlp(self, z: Tensor) -> Tensor:
        if "gate" in self.mlp:
            return self.mlp["down"](self.act(self.mlp["gate"](z)) * self.mlp["up"](z))
        return self.mlp["down"](self.act(self.mlp["up"](z)))

    def __call__(self, x: Tensor) -> Tensor:
        """The hidden states leaving the block."""
        if self.arch == "bert":
            a = self.norm1(x + self.attention(x))
            return self.norm2(a + self._mlp(a))
        a = self.attention(self.norm1(x))
        if self.post_attention_norm is not None:
            a = self.post_attention_norm(a)
        h = x + a
        m = self._mlp(self.norm2(h))
        if self.post_mlp_norm is not None:
            m = self.post_mlp_norm(m)
        return h + m


#: The ``model_type`` s whose blocks the Llama branch of :func:`_block` models: pre-RMSNorm
#: (``x·w/rms``), a SiLU-gated MLP.
_LLAMA_BLOCKS = frozenset({"llama", "mistral", "qwen2", "qwen3"})
#: Gemma-1: Llama's block with Gemma's RMSNorm (``1 + w``) and its MLP activation.
_GEMMA_BLOCKS = frozenset({"gemma"})
#: Gemma-2 and Gemma-3 (text): Gemma RMSNorms before and after each sublayer (``input``,
#: ``post_attention``, ``pre_feedforward``, ``post_feedforward``), the MLP activation in
#: ``hidden_activation``. Gemma-3's multimodal wrapper and Gemma-3n (AltUp, LAuReL) are not these.
_SANDWICH_BLOCKS = frozenset({"gemma2", "gemma3_text"})
_MODELLED = _LLAMA_BLOCKS | _GEMMA_BLOCKS | _SANDWICH_BLOCKS
#: The vision encoders of the ``vit`` family whose blocks are GPT-2's Pre-LN block with
#: ``layernorm_before`` / ``layernorm_after`` and an ``fc1`` / ``fc2`` MLP, no layer scale.
_VIT_BLOCKS = frozenset({"vit", "deit"})


def _block(model: Any, arch: Arch, layer: int, dtype: torch.dtype, device: Any) -> TransformerBlock:
    cfg = model.config
    model_type = str(getattr(cfg, "model_type", arch))
    if (
        arch not in ("bert", "gpt2", "llama", "vit")
        or (arch == "llama" and model_type not in _MODELLED)
        or (arch == "vit" and model_type not in _VIT_BLOCKS)
    ):
        raise UnmodelledFeature(
            f"the transformer block of {type(model).__name__} (model_type {model_type!r}) is not "
            "modelled by meanfield.profile: it models BERT-style, GPT-2, Llama-style, Gemma "
            f"({', '.join(sorted(_MODELLED))}) and ViT/DeiT blocks; the attention alone is "
            "meanfield.models.hf_attention"
        )
    blk = layer_modules(model, arch)[layer]
    att = hf_attention(model, layer, map="heads+WO", dtype=dtype).to(device=device)
    post1: _Norm | None = None  # the norms of the sublayers' outputs (Gemma-2/3)
    post2: _Norm | None = None
    if arch == "bert":
        s = blk.attention.self
        lin = {
            "q": _lin(s.query, dtype, device),
            "k": _lin(s.key, dtype, device),
            "v": _lin(s.value, dtype, device),
            "o": _lin(blk.attention.output.dense, dtype, device),
        }
        mlp = {
            "up": _lin(blk.intermediate.dense, dtype, device),
            "down": _lin(blk.output.dense, dtype, device),
        }
        n1 = _norm(blk.attention.output.LayerNorm, dtype, device, rms=False)
        n2 = _norm(blk.output.LayerNorm, dtype, device, rms=False)
        act = _activation(str(cfg.hidden_act))
    elif arch == "gpt2":
        d = att.info.d
        c = _lin(blk.attn.c_attn, dtype, device, conv1d=True)  # (3d, d)
        Wq, Wk, Wv = c.W.split(d, dim=0)
        bq, bk, bv = (None, None, None) if c.b is None else c.b.split(d)
        lin = {
            "q": _Linear(Wq, bq),
            "k": _Linear(Wk, bk),
            "v": _Linear(Wv, bv),
            "o": _lin(blk.attn.c_proj, dtype, device, conv1d=True),
        }
        mlp = {
            "up": _lin(blk.mlp.c_fc, dtype, device, conv1d=True),
            "down": _lin(blk.mlp.c_proj, dtype, device, conv1d=True),
        }
        n1 = _norm(blk.ln_1, dtype, device, rms=False)
        n2 = _norm(blk.ln_2, dtype, device, rms=False)
        act = _activation(str(cfg.activation_function))
    elif arch == "vit":
        a = blk.attention
        lin = {
            "q": _lin(a.q_proj, dtype, device),
            "k": _lin(a.k_proj, dtype, device),
            "v": _lin(a.v_proj, dtype, device),
            "o": _lin(a.o_proj, dtype, device),
        }
        mlp = {
            "up": _lin(blk.mlp.fc1, dtype, device),
            "down": _lin(blk.mlp.fc2, dtype, device),
        }
        n1 = _norm(blk.layernorm_before, dtype, device, rms=False)
        n2 = _norm(blk.layernorm_after, dtype, device, rms=False)
        act = _activation(str(cfg.hidden_act))
    else:
        gemma = model_type in _GEMMA_BLOCKS or model_type in _SANDWICH_BLOCKS
        sandwich = model_type in _SANDWICH_BLOCKS
        a = blk.self_attn
        lin = {
            "q": _lin(a.q_proj, dtype, device),
            "k": _lin(a.k_proj, dtype, device),
            "v": _lin(a.v_proj, dtype, device),
            "o": _lin(a.o_proj, dtype, device),
        }
        m = blk.mlp
        mlp = {
            "gate": _lin(m.gate_proj, dtype, device),
            "up": _lin(m.up_proj, dtype, device),
            "down": _lin(m.down_proj, dtype, device),
        }
        n1 = _norm(blk.input_layernorm, dtype, device, rms=True, unit_offset=gemma)
        if sandwich:
            post1 = _norm(blk.post_attention_layernorm, dtype, device, rms=True, unit_offset=True)
            n2 = _norm(blk.pre_feedforward_layernorm, dtype, device, rms=True, unit_offset=True)
            post2 = _norm(blk.post_feedforward_layernorm, dtype, device, rms=True, unit_offset=True)
            act = _activation(str(cfg.hidden_activation))
        else:
            n2 = _norm(blk.post_attention_layernorm, dtype, device, rms=True, unit_offset=gemma)
            act = _activation(str(getattr(cfg, "hidden_act", "silu")))
    linears = {k: (v.W, v.b) for k, v in {**lin, **mlp}.items()}
    return TransformerBlock(layer, arch, att, n1, n2, mlp, act, linears, post1, post2)


def model_blocks(
    model: Any,
    layers: Iterable[int] | None = None,
    *,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> tuple[TransformerBlock, ...]:
    """The model's blocks as pure torch maps (:class:`TransformerBlock`), weights copied.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        BERT, GPT-2, Llama-style, Gemma-1/2/3 or ViT/DeiT (bare or with a head).
    layers : iterable of int, optional
        Default all.
    dtype : torch.dtype, default torch.float64
    device : torch.device or str, optional
        Default the model's.

    Returns
    -------
    tuple of TransformerBlock
    """
    arch = arch_of(model)
    n_layers = len(layer_modules(model, arch))
    idx = check_layers(layers, n_layers)
    dev = device if device is not None else model_device(model)
    return tuple(_block(model, arch, layer, dtype, dev) for layer in idx)


def check_layers(layers: Iterable[int] | None, n_layers: int) -> tuple[int, ...]:
    if layers is None:
        return tuple(range(n_layers))
    out = []
    for layer in layers:
        try:
            i = operator.index(layer)
        except TypeError:
            i = None
        if isinstance(layer, bool) or i is None:
            raise ValueError(f"layers must be integers in [0, {n_layers}), got {layer!r}")
        if not 0 <= i < n_layers:
            raise ValueError(f"layer {i} is out of range: the model has layers 0 to {n_layers - 1}")
        out.append(i)
    if not out:
        raise ValueError("layers is empty")
    return tuple(sorted(set(out)))
