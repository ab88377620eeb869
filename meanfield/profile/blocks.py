r"""A Hugging Face transformer block as a pure torch function of its input (docs/profile.md).

:func:`model_blocks` rebuilds the blocks of every family :mod:`meanfield.models` reads (BERT-style,
DistilBERT, ViT/DeiT, GPT-2, OPT, Llama-style and Gemma-1/2/3, Phi-3, GPT-NeoX, Falcon, BLOOM,
ModernBERT) from its weights, cast to a chosen dtype: attention through the toolkit's
:func:`meanfield.self_attention` with the model's own causal mask and attention variants, the MLP,
the norms and the residual connections. A block setting that is not modelled is a one-line
``UnmodelledFeature``. The tests check each block against the model's own forward pass.
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
from ..models._families import FAMILIES, UnmodelledFeature
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
    ``GemmaRMSNorm``: the normalised ``x`` times ``1.0 + weight``, in that order). ``w is None``:
    a LayerNorm without gain or shift (OPT's ``layer_norm_elementwise_affine=False``).
    """

    w: Tensor | None
    b: Tensor | None
    eps: float
    rms: bool
    unit_offset: bool = False

    def __call__(self, x: Tensor) -> Tensor:
        if self.rms:
            assert self.w is not None  # _norm reads the gain of every RMSNorm
            w = 1.0 + self.w if self.unit_offset else self.w
            return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.eps) * w
        return F.layer_norm(x, (x.shape[-1],), self.w, self.b, self.eps)


def _copy(t: Tensor, dtype: torch.dtype, device: Any) -> Tensor:
    return t.detach().to(device=device, dtype=dtype).clone()


def _copy_opt(t: Tensor | None, dtype: torch.dtype, device: Any) -> Tensor | None:
    return None if t is None else _copy(t, dtype, device)


def _lin(module: Any, dtype: torch.dtype, device: Any, *, conv1d: bool = False) -> _Linear:
    W = module.weight.mT if conv1d else module.weight  # Conv1D stores (in, out)
    return _Linear(_copy(W, dtype, device), _copy_opt(module.bias, dtype, device))


def _norm(
    module: Any, dtype: torch.dtype, device: Any, *, rms: bool, unit_offset: bool = False
) -> _Norm:
    eps: Any = getattr(module, "variance_epsilon", None)
    if eps is None:
        eps = getattr(module, "eps", 1e-5)
    if rms and getattr(module, "weight", None) is None:
        raise UnmodelledFeature(
            f"an RMSNorm without a gain ({type(module).__name__}) is not modelled"
        )
    return _Norm(
        _copy_opt(getattr(module, "weight", None), dtype, device),
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

    - BERT and DistilBERT, OPT with ``do_layer_norm_before=False`` (Post-LN):
      :math:`a = \mathrm{LN}_1(x + \mathrm{MHSA}(x))`,
      :math:`y = \mathrm{LN}_2(a + W_{\mathrm{down}}\,\phi(W_{\mathrm{up}}a))`;
    - GPT-2, ViT/DeiT, OPT, sequential GPT-NeoX and Falcon (Pre-LN):
      :math:`h = x + \mathrm{MHSA}(\mathrm{LN}_1 x)`,
      :math:`y = h + W_{\mathrm{down}}\,\phi(W_{\mathrm{up}}\mathrm{LN}_2 h)` (ViT/DeiT:
      ``layernorm_before``, ``layernorm_after``, ``mlp.fc1``, ``mlp.fc2``);
    - BLOOM: the Pre-LN block; with ``apply_residual_connection_post_layernorm`` each residual
      branch starts from the normalised input instead,
      :math:`z = \mathrm{LN}_1 x`, :math:`h = z + \mathrm{MHSA}(z)`, :math:`u = \mathrm{LN}_2 h`,
      :math:`y = u + W_{\mathrm{down}}\,\phi(W_{\mathrm{up}}u)`;
    - parallel GPT-NeoX (``use_parallel_residual``) and Falcon (``parallel_attn`` or
      ``new_decoder_architecture``): :math:`y = x + \mathrm{MHSA}(\mathrm{LN}_1 x) +
      W_{\mathrm{down}}\,\phi(W_{\mathrm{up}}\mathrm{LN}_2 x)`, with one shared norm
      (:math:`\mathrm{LN}_2 = \mathrm{LN}_1`) unless Falcon's ``new_decoder_architecture`` has
      ``num_ln_in_parallel_attn = 2`` (``ln_attn``, ``ln_mlp``);
    - Llama-style and Phi-3 (Pre-RMSNorm, gated MLP): :math:`h = x + \mathrm{MHSA}(\mathrm{N}_1 x)`,
      :math:`y = h + \mathrm{MLP}(\mathrm{N}_2 h)`, with
      :math:`\mathrm{MLP}(z) = W_{\mathrm{down}}(\phi(W_{\mathrm{gate}}z)\odot
      W_{\mathrm{up}}z)` (Phi-3: ``gate_up_proj`` is :math:`[W_{\mathrm{gate}}; W_{\mathrm{up}}]`);
      Gemma-1 is this block with Gemma's RMSNorm
      (:math:`\hat x\,(1 + w)`, :math:`\hat x = x/\sqrt{\mathrm{mean}(x^2)+\epsilon}`);
    - ModernBERT: the Pre-LN block with LayerNorms without shift (``norm_bias=False``), no first
      norm on layer 0 (``attn_norm`` is the identity there) and the gated MLP above, where ``Wi``
      is :math:`[W_{\mathrm{gate}}; W_{\mathrm{up}}]` (transformers' ``input`` half is the
      activated one, its ``gate`` half our :math:`W_{\mathrm{up}}`);
    - Gemma-2 and Gemma-3 (Gemma RMSNorms before and after each sublayer, gated MLP):
      :math:`h = x + \mathrm{N}^{\mathrm{post}}_1(\mathrm{MHSA}(\mathrm{N}_1 x))`,
      :math:`y = h + \mathrm{N}^{\mathrm{post}}_2(\mathrm{MLP}(\mathrm{N}_2 h))`;

    with :math:`\mathrm{MHSA}` the attention with its output projection and biases
    (:func:`meanfield.self_attention`; causal when the model is, with the layer's own window,
    logit soft-cap, QK-norm, ALiBi, rotary and scale as :func:`meanfield.models.hf_attention`
    reads them) and biases on every affine map that has one. Gemma's embedding scale
    (:math:`\sqrt d`) and final logit soft-cap, and the norms before the first block or after
    the last (BLOOM's ``word_embeddings_layernorm``, ModernBERT's embedding norm, final norms)
    lie outside the blocks.

    Attributes
    ----------
    layer : int
    arch : str
        The family (:attr:`meanfield.models.LayerInfo.arch`): ``"bert"``, ``"distilbert"``,
        ``"gpt2"``, ``"vit"``, ``"opt"``, ``"llama"``, ``"phi3"``, ``"gpt_neox"``, ``"falcon"``,
        ``"bloom"`` or ``"modernbert"``.
    attention : HFAttention
        The attention sublayer (map ``"heads+WO"``).
    norm1, norm2 : _Norm or None
        The norms of the attention's and the MLP's inputs (Post-LN: of the residual sums);
        ``norm1`` is ``None`` where the attention reads the block's input unnormalised
        (ModernBERT's layer 0). One object for Falcon's shared norm.
    linears : dict of str to (W, b)
        The block's affine maps, ``W`` in (out, in) layout: ``q``, ``k``, ``v``, ``o``, ``up``,
        ``down`` and (gated MLPs: Llama-style, Gemma, Phi-3, ModernBERT) ``gate``; fused
        projections are split into these.
    post_attention_norm, post_mlp_norm : _Norm or None
        The norms of the attention's and the MLP's outputs (Gemma-2 and Gemma-3:
        ``post_attention_layernorm`` and ``post_feedforward_layernorm``); ``None`` elsewhere.
    post_ln : bool
        Post-LN (the norms act on the residual sums).
    parallel : bool
        Parallel residual: attention and MLP both read the block's input.
    residual_from_norm : bool
        The residual branches start from the norms' outputs (BLOOM's
        ``apply_residual_connection_post_layernorm``).
    """

    layer: int
    arch: str
    attention: HFAttention
    norm1: _Norm | None
    norm2: _Norm
    mlp: dict[str, _Linear]
    act: Callable[[Tensor], Tensor]
    linears: dict[str, tuple[Tensor, Tensor | None]] = field(default_factory=dict)
    post_attention_norm: _Norm | None = None
    post_mlp_norm: _Norm | None = None
    post_ln: bool = False
    parallel: bool = False
    residual_from_norm: bool = False

    @property
    def causal(self) -> bool:
        """Whether the attention is masked (the model's own mask)."""
        return self.attention.causal

    def attention_input(self, x: Tensor) -> Tensor:
        """The input of the attention sublayer: ``x`` (Post-LN, no first norm) or ``norm1(x)``."""
        return x if self.post_ln or self.norm1 is None else self.norm1(x)

    def _mlp(self, z: Tensor) -> Tensor:
        if "gate" in self.mlp:
            return self.mlp["down"](self.act(self.mlp["gate"](z)) * self.mlp["up"](z))
        return self.mlp["down"](self.act(self.mlp["up"](z)))

    def __call__(self, x: Tensor) -> Tensor:
        """The hidden states leaving the block."""
        if self.post_ln:
            assert self.norm1 is not None  # every Post-LN block has both norms
            a = self.norm1(x + self.attention(x))
            return self.norm2(a + self._mlp(a))
        z = self.attention_input(x)
        a = self.attention(z)
        if self.parallel:
            zm = z if self.norm2 is self.norm1 else self.norm2(x)
            return x + (self._mlp(zm) + a)  # transformers' order: (mlp + attention) + x
        if self.post_attention_norm is not None:
            a = self.post_attention_norm(a)
        h = (z if self.residual_from_norm else x) + a
        u = self.norm2(h)
        m = self._mlp(u)
        if self.post_mlp_norm is not None:
            m = self.post_mlp_norm(m)
        return (u if self.residual_from_norm else h) + m


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
#: The families whose blocks :func:`_block` models (for ``llama`` and ``vit`` only the model
#: types above).
_ARCHS = frozenset(
    {"bert", "distilbert", "gpt2", "vit", "opt", "llama", "phi3", "gpt_neox", "falcon", "bloom"}
    | {"modernbert"}
)


def _bloom_gelu(x: Tensor) -> Tensor:
    """BLOOM's MLP activation, transformers' ``bloom_gelu_forward`` term by term.

    A tanh approximation of GELU with ``sqrt(2/pi)`` rounded to 0.79788456 (not
    :func:`torch.nn.functional.gelu`'s constant). Autograd differentiates this formula exactly;
    transformers' own backward (``bloom_gelu_back``) is a further approximation, not used here.
    """
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


def _split_rows(lin: _Linear, parts: int) -> tuple[_Linear, ...]:
    """``lin`` cut into ``parts`` equal blocks of output rows (a fused ``[A; B; ...]`` map)."""
    bs: tuple[Tensor | None, ...] = (None,) * parts if lin.b is None else lin.b.chunk(parts)
    return tuple(_Linear(W, b) for W, b in zip(lin.W.chunk(parts, dim=0), bs))


def _attention_linears(
    model: Any, arch: Arch, blk: Any, layer: int, dtype: torch.dtype, device: Any
) -> dict[str, _Linear]:
    """``q``, ``k``, ``v``, ``o`` of the layer as the family's adapter splits them (fused too)."""
    spec = FAMILIES[arch].extract(model, blk, layer, dtype)
    if spec.layout != "linear" or spec.W_O is None:  # pragma: no cover  (conv1d: GPT-2 only)
        raise UnmodelledFeature(f"the attention weights of {arch} are not in the nn.Linear layout")

    return {
        key: _Linear(_copy(W, dtype, device), _copy_opt(b, dtype, device))
        for key, W, b in zip(
            "qkvo",
            (spec.W_Q, spec.W_K, spec.W_V, spec.W_O),
            (spec.b_Q, spec.b_K, spec.b_V, spec.b_O),
        )
    }


def _falcon_norms(model: Any, blk: Any, ln: Callable[[Any], _Norm]) -> tuple[_Norm, _Norm, bool]:
    """Falcon's norms and residual form, as ``FalconDecoderLayer.forward`` chooses them.

    ``new_decoder_architecture`` with ``num_ln_in_parallel_attn == 2``: ``ln_attn`` and
    ``ln_mlp``, parallel; with one norm, or ``parallel_attn`` in the old architecture:
    ``input_layernorm`` shared by both branches, parallel; otherwise sequential with
    ``input_layernorm`` and ``post_attention_layernorm``.
    """
    cfg = model.config
    new = bool(cfg.new_decoder_architecture)
    par = bool(cfg.parallel_attn)
    n_ln = cfg.num_ln_in_parallel_attn
    if not ((par and n_ln in (1, 2)) if new else not (par and n_ln == 2)):
        raise UnmodelledFeature(
            f"Falcon with new_decoder_architecture={cfg.new_decoder_architecture}, parallel_attn="
            f"{cfg.parallel_attn} and num_ln_in_parallel_attn={n_ln} is not modelled (the "
            "layer's modules do not match its forward pass)"
        )
    if new and n_ln == 2:
        return ln(blk.ln_attn), ln(blk.ln_mlp), True
    n1 = ln(blk.input_layernorm)
    if new or par:
        return n1, n1, True
    return n1, ln(blk.post_attention_layernorm), False


def _block(model: Any, arch: Arch, layer: int, dtype: torch.dtype, device: Any) -> TransformerBlock:
    cfg = model.config
    model_type = str(getattr(cfg, "model_type", arch))
    if (
        arch not in _ARCHS
        or (arch == "llama" and model_type not in _MODELLED)
        or (arch == "vit" and model_type not in _VIT_BLOCKS)
    ):
        raise UnmodelledFeature(
            f"the transformer block of {type(model).__name__} (model_type {model_type!r}) is not "
            "modelled by meanfield.profile: it models BERT-style, DistilBERT, GPT-2, OPT, "
            f"Llama-style, Gemma ({', '.join(sorted(_MODELLED))}), Phi-3, GPT-NeoX, Falcon, "
            "BLOOM, ModernBERT and ViT/DeiT blocks; the attention alone is "
            "meanfield.models.hf_attention"
        )
    blk = layer_modules(model, arch)[layer]
    if arch == "bloom" and int(cfg.pretraining_tp) > 1 and bool(cfg.slow_but_exact):
        raise UnmodelledFeature(
            f"BLOOM's slow_but_exact with pretraining_tp={cfg.pretraining_tp} is not modelled "
            "(transformers then drops the biases of the attention's and the MLP's output maps)"
        )
    att = hf_attention(model, layer, map="heads+WO", dtype=dtype).to(device=device)
    post1: _Norm | None = None  # the norms of the sublayers' outputs (Gemma-2/3)
    post2: _Norm | None = None
    n1: _Norm | None
    form: dict[str, bool] = {}

    def L(module: Any, conv1d: bool = False) -> _Linear:
        return _lin(module, dtype, device, conv1d=conv1d)

    def ln(module: Any) -> _Norm:
        return _norm(module, dtype, device, rms=False)

    def rms(module: Any, unit_offset: bool = False) -> _Norm:
        return _norm(module, dtype, device, rms=True, unit_offset=unit_offset)

    def up_down(up: Any, down: Any, conv1d: bool = False) -> dict[str, _Linear]:
        return {"up": L(up, conv1d), "down": L(down, conv1d)}

    if arch != "gpt2":  # GPT-2's Conv1D c_attn is split in its branch below
        lin = _attention_linears(model, arch, blk, layer, dtype, device)
    if arch == "bert":
        mlp = up_down(blk.intermediate.dense, blk.output.dense)
        n1, n2 = ln(blk.attention.output.LayerNorm), ln(blk.output.LayerNorm)
        act = _activation(str(cfg.hidden_act))
        form["post_ln"] = True
    elif arch == "gpt2":
        q, k, v = _split_rows(L(blk.attn.c_attn, conv1d=True), 3)  # c_attn = [q; k; v]
        lin = {"q": q, "k": k, "v": v, "o": L(blk.attn.c_proj, conv1d=True)}
        mlp = up_down(blk.mlp.c_fc, blk.mlp.c_proj, conv1d=True)
        n1, n2 = ln(blk.ln_1), ln(blk.ln_2)
        act = _activation(str(cfg.activation_function))
    elif arch == "vit":
        mlp = up_down(blk.mlp.fc1, blk.mlp.fc2)
        n1, n2 = ln(blk.layernorm_before), ln(blk.layernorm_after)
        act = _activation(str(cfg.hidden_act))
    elif arch == "llama":
        gemma = model_type in _GEMMA_BLOCKS or model_type in _SANDWICH_BLOCKS
        sandwich = model_type in _SANDWICH_BLOCKS
        m = blk.mlp
        mlp = {"gate": L(m.gate_proj), **up_down(m.up_proj, m.down_proj)}
        n1 = rms(blk.input_layernorm, unit_offset=gemma)
        if sandwich:
            post1 = rms(blk.post_attention_layernorm, unit_offset=True)
            n2 = rms(blk.pre_feedforward_layernorm, unit_offset=True)
            post2 = rms(blk.post_feedforward_layernorm, unit_offset=True)
            act = _activation(str(cfg.hidden_activation))
        else:
            n2 = rms(blk.post_attention_layernorm, unit_offset=gemma)
            act = _activation(str(getattr(cfg, "hidden_act", "silu")))
    else:
        if arch == "distilbert":  # Post-LN, BERT's block
            mlp = up_down(blk.ffn.lin1, blk.ffn.lin2)
            n1, n2 = ln(blk.sa_layer_norm), ln(blk.output_layer_norm)
            act = _activation(str(cfg.activation))
            form["post_ln"] = True
        elif arch == "opt":  # Pre-LN, or Post-LN without do_layer_norm_before
            mlp = up_down(blk.fc1, blk.fc2)
            n1, n2 = ln(blk.self_attn_layer_norm), ln(blk.final_layer_norm)
            act = _activation(str(cfg.activation_function))
            form["post_ln"] = not bool(blk.do_layer_norm_before)
        elif arch == "phi3":  # Llama's block, fused gate_up_proj = [gate; up]
            gate, up = _split_rows(L(blk.mlp.gate_up_proj), 2)
            mlp = {"gate": gate, "up": up, "down": L(blk.mlp.down_proj)}
            n1, n2 = rms(blk.input_layernorm), rms(blk.post_attention_layernorm)
            act = _activation(str(cfg.hidden_act))
        elif arch == "modernbert":  # Pre-LN, no first norm on layer 0, GeGLU Wi = [input; gate]
            gate, up = _split_rows(L(blk.mlp.Wi), 2)
            mlp = {"gate": gate, "up": up, "down": L(blk.mlp.Wo)}
            identity = isinstance(blk.attn_norm, torch.nn.Identity)
            n1 = None if identity else ln(blk.attn_norm)
            n2 = ln(blk.mlp_norm)
            act = _activation(str(cfg.hidden_activation))
        else:  # gpt_neox, falcon, bloom: dense_h_to_4h, dense_4h_to_h
            mlp = up_down(blk.mlp.dense_h_to_4h, blk.mlp.dense_4h_to_h)
            if arch == "falcon":
                n1, n2, form["parallel"] = _falcon_norms(model, blk, ln)
                act = _activation(str(cfg.activation))
            else:
                n1, n2 = ln(blk.input_layernorm), ln(blk.post_attention_layernorm)
                if arch == "gpt_neox":
                    act = _activation(str(cfg.hidden_act))
                    form["parallel"] = bool(blk.use_parallel_residual)
                else:
                    act = _bloom_gelu
                    form["residual_from_norm"] = bool(blk.apply_residual_connection_post_layernorm)
    linears = {k: (v.W, v.b) for k, v in {**lin, **mlp}.items()}
    return TransformerBlock(layer, arch, att, n1, n2, mlp, act, linears, post1, post2, **form)


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
        A model of a family :mod:`meanfield.models` reads (bare or with a head): BERT-style,
        DistilBERT, ViT/DeiT, GPT-2, OPT, Llama-style (``llama``, ``mistral``, ``qwen2``,
        ``qwen3``), Gemma-1/2/3, Phi-3, GPT-NeoX, Falcon, BLOOM or ModernBERT.
    layers : iterable of int, optional
        Default all.
    dtype : torch.dtype, default torch.float64
    device : torch.device or str, optional
        Default the model's.

    Returns
    -------
    tuple of TransformerBlock

    Raises
    ------
    NotImplementedError
        An ``UnmodelledFeature`` (also a ``ValueError``), in one line naming it, for a block of
        another family or model type, a block setting that is not modelled (BLOOM's
        ``slow_but_exact`` with ``pretraining_tp > 1``; a Falcon layer whose modules do not match
        its forward pass), an unknown MLP activation, or an attention feature that
        :func:`meanfield.models.hf_attention` does not model.
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
