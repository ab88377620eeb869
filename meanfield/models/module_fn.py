r"""The model's own attention module as a map ``X -> f(X)``: the general path.

:func:`hf_module_fn` returns the function that runs a layer's attention module of a Hugging Face
model (``layers[b].self_attn`` and the like, found through the family adapters of
:mod:`meanfield.models._families`) on hidden states ``X``, with every other input given
explicitly: the additive attention mask (causal for decoders, with the layer's sliding window),
for rotary families the position embeddings ``(cos, sin)`` of positions ``0, ..., n-1`` from
the model's own ``rotary_emb`` (ModernBERT: the table of the layer's type), and for BLOOM and
ALiBi Falcon the ALiBi tensors the model's forward pass would build. transformers 5.x attention
modules apply no causal mask of their own (the model's forward pass builds it), and their eager
attention functions take the sliding window only from that mask, so both must be passed.

Its Lipschitz constant is meant for :func:`meanfield.lipschitz.local_lipschitz_fn` with
``products="reverse"``: forward-mode derivatives through transformers modules are unreliable
(operations and custom functions without forward-mode rules), and reverse over reverse needs
none. What the bracket then certifies is stated in :func:`hf_module_fn`.
"""

from __future__ import annotations

import copy
import inspect
import math
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from . import _families as _fam
from ._families import base_model
from .layers import check_layer, layer_info

__all__ = ["MODULE_FAMILIES", "hf_module_fn"]

#: Families whose attention module :func:`hf_module_fn` calls: every family of
#: :mod:`meanfield.models` (the keyword inputs passed are checked against the module's
#: ``forward`` signature).
MODULE_FAMILIES: tuple[str, ...] = tuple(_fam.FAMILIES)


def _mask(n: int, causal: bool, window: int | None, dtype: torch.dtype) -> Tensor | None:
    """Additive mask (1, 1, n, n), or ``None`` when every key is admissible.

    0 where key ``j`` is admissible for query ``i``, else the dtype's lowest finite value (as in
    transformers' own masks).
    """
    if not causal and window is None:
        return None
    i = torch.arange(n).unsqueeze(1)
    j = torch.arange(n).unsqueeze(0)
    ok = torch.ones(n, n, dtype=torch.bool)
    if causal:
        ok &= j <= i
    if window is not None:
        ok &= (i - j).abs() < window
    zero = torch.zeros((), dtype=dtype)
    low = torch.full((), torch.finfo(dtype).min, dtype=dtype)
    return torch.where(ok, zero, low).reshape(1, 1, n, n)


def _alibi_inputs(
    model: Any,
    family: str,
    attn: Any,
    n: int,
    kwargs: dict[str, Any],
    dtype: torch.dtype,
    device: torch.device,
) -> Callable[[int], dict[str, Any]]:
    """The inputs of BLOOM's and Falcon's attention modules beyond mask and rotary positions.

    Returns ``batch -> {name: tensor}`` for the inputs whose shape depends on the batch size
    (their ALiBi tensors are ``(batch * heads, 1, n)``), and sets the batch-independent ones in
    ``kwargs``. BLOOM: ``alibi`` from the model's ``build_alibi_tensor`` (all tokens present:
    slope times key position, in ``dtype``) and ``residual = 0`` (the module returns
    ``dense(...) + residual``). Falcon: ``alibi = None`` for rotary models (the module's switch to
    rotary); for ALiBi models the tensor of its modeling module's ``build_alibi_tensor`` (slopes
    rounded to bfloat16) and the mask as ``FalconModel.forward`` builds it, ALiBi over
    ``sqrt(head_dim)`` at admissible keys (the module adds it a second time to the scores).
    """
    if family == "bloom":
        build = base_model(model).build_alibi_tensor
        heads = int(attn.num_heads)
        kwargs["residual"] = torch.zeros((), dtype=dtype, device=device)

        def bloom(batch: int) -> dict[str, Any]:
            ones = torch.ones(batch, n, dtype=torch.long, device=device)
            return {"alibi": build(ones, heads, dtype)}

        return bloom
    if family == "falcon" and getattr(model.config, "alibi", False):
        build = sys.modules[type(attn).__module__].build_alibi_tensor
        heads = int(attn.num_heads)
        root = math.sqrt(model.config.hidden_size // heads)
        causal = kwargs.pop("attention_mask")
        low = torch.finfo(dtype).min

        def falcon_alibi(batch: int) -> dict[str, Any]:
            ones = torch.ones(batch, n, dtype=torch.long, device=device)
            alibi = build(ones, heads, dtype)
            bias = alibi.reshape(batch, heads, 1, n) / root
            return {"alibi": alibi, "attention_mask": bias.masked_fill(causal < -1, low)}

        return falcon_alibi
    if family == "falcon":
        kwargs["alibi"] = None
    return lambda batch: {}


def _check_signature(attn: Any, names: list[str]) -> None:
    """One-line refusal when the module's ``forward`` has no parameter of one of ``names``."""
    params = inspect.signature(type(attn).forward).parameters
    missing = [name for name in names if name not in params]
    if missing:
        raise NotImplementedError(
            f"{type(attn).__name__}.forward takes no {', '.join(missing)} input (another "
            "transformers version?): hf_module_fn cannot pass it"
        )


def hf_module_fn(
    model: Any, layer: int, n: int, *, dtype: torch.dtype | None = None
) -> Callable[[Tensor], Tensor]:
    r"""The model's own attention module of layer ``layer`` as a function of the hidden states.

    ``f(X)`` calls the module with ``hidden_states = X`` (shape ``(..., n, d)``, leading
    dimensions flattened into the batch), an explicit additive mask (causal when
    :func:`~meanfield.models.is_causal`; key ``j`` also excluded when :math:`|i - j| \ge W` for a
    layer with sliding window :math:`W`, ``LayerInfo.window``) and, for rotary families, the
    ``(cos, sin)`` of positions ``0, ..., n-1`` computed by the model's ``rotary_emb`` (with the
    layer's type where it has several: ModernBERT's local layers, window
    ``local_attention // 2 + 1``, rotate with their own base). The output is that of the output
    projection (``o_proj``, ``c_proj``, ``dense``, ``Wo``, ...): the ``map="heads+WO"`` convention
    of :func:`~meanfield.models.hf_attention`. For BERT-style layers, whose ``BertSelfAttention``
    stops before it, the model's ``attention.output.dense`` is applied to the module's output
    (no residual, no LayerNorm).

    Families with inputs of their own:

    - **BLOOM** (``BloomAttention``): ``alibi`` from the model's ``build_alibi_tensor`` with every
      token present (slope :math:`m_h` times key position, shape ``(batch * heads, 1, n)``, in
      the module's dtype, as the forward pass builds it), the causal additive mask, and
      ``residual = 0``: the module returns ``dense(heads) + residual``, so with a zero residual
      ``f(X)`` is the attention output through ``dense`` with its bias, the heads+WO map. (With
      ``slow_but_exact`` and ``pretraining_tp > 1`` the module applies ``dense`` in slices and
      without its bias; ``f`` is then that, as the model computes it.)
    - **Falcon**, rotary (``alibi=None`` selects the module's rotary branch) or ALiBi. ALiBi
      Falcon is refused by the extracted map (transformers rounds the ALiBi tensor to bfloat16
      and adds it twice); here it runs as the model runs it: ``alibi`` from the modeling module's
      ``build_alibi_tensor`` and the mask as ``FalconModel.forward`` builds it, ALiBi divided by
      :math:`\sqrt k` at admissible keys, the dtype's lowest value elsewhere.
    - **ModernBERT**: bidirectional; local layers get the symmetric window in the mask.

    **What it guarantees.** It runs the model's real code, so every feature of the layer is
    included whether or not the extracted parameters model it (no ``UnmodelledFeature``
    refusal is needed for those). :func:`~meanfield.lipschitz.local_lipschitz_fn` on it (use
    ``products="reverse"``) then brackets :math:`\|Df(X)\|_2` for the Jacobian *as autograd
    computes it* on the module, with that function's certificates (dense: Gram iteration with
    a Cholesky test; Lanczos: the probabilistic ``upper_prob``). **What it does not.** No
    rounding analysis of the module's own arithmetic (unlike :func:`~meanfield.local_lipschitz`
    on the extracted map, docs/rounding.md): the bracket is not a floating-point certificate for
    the exact map, and transformers computes some steps in float32 even in a float64 model
    (the eager softmax of most families, rotary angles, QK-norms), so a float64 run is only as
    exact as those steps. Nor does it certify that the inputs here are those of the model's own
    forward pass: it assumes the mask and positions above (no padding, no cache, positions from
    0), and dropout off (a model in training mode is refused).

    Parameters
    ----------
    model : transformers.PreTrainedModel
        Of a family in :data:`MODULE_FAMILIES`, loaded with ``attn_implementation="eager"``.
    layer : int
    n : int
        Sequence length (the mask and the positions are built for it).
    dtype : torch.dtype, optional
        Run a copy of the module (and output projection, rotary module) cast to ``dtype``; the
        model is not changed. Default: the model's own modules, in their dtype.

    Returns
    -------
    callable
        ``X -> f(X)``, shape ``(..., n, d) -> (..., n, d)``; holds references to the modules.

    Raises
    ------
    NotImplementedError
        For a model of no family, a family outside :data:`MODULE_FAMILIES` (none today), or a
        module whose ``forward`` takes no input of a name passed here (another transformers
        version), in one line.
    ValueError
        A model not using eager attention or in training mode, or ``n`` not a positive integer.
    """
    fam = _fam.detect(model)
    if fam.name not in MODULE_FAMILIES:
        raise NotImplementedError(
            f"hf_module_fn does not call {fam.label} attention modules (supported: "
            f"{', '.join(MODULE_FAMILIES)}): use hf_attention_fn"
        )
    layer = check_layer(model, fam.name, layer)
    if isinstance(n, bool) or int(n) != n or int(n) < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    n = int(n)
    base = base_model(model)
    blk = fam.blocks(base)[layer]
    attn, out = fam.attention(blk), fam.out(blk)
    impl = getattr(getattr(attn, "config", model.config), "_attn_implementation", None)
    if impl != "eager":
        raise ValueError(
            f"hf_module_fn needs eager attention, the model uses {impl!r}: load it with "
            "attn_implementation='eager' (or call model.set_attn_implementation('eager'))"
        )
    if attn.training or out.training:
        raise ValueError("the model is in training mode (dropout is random): call model.eval()")
    info = layer_info(model, layer)
    out_inside = any(m is out for m in attn.modules())
    rot = getattr(base, "rotary_emb", None) if fam.rotary else None
    if dtype is not None:
        attn = copy.deepcopy(attn).to(dtype)
        out = attn if out_inside else copy.deepcopy(out).to(dtype)
        rot = None if rot is None else copy.deepcopy(rot).to(dtype)
    p = next(attn.parameters())
    mdtype, device = p.dtype, p.device
    mask = _mask(n, info.causal, info.window, mdtype)
    kwargs: dict[str, Any] = {"attention_mask": None if mask is None else mask.to(device)}
    if fam.rotary:
        if rot is None:
            raise ValueError(f"{type(model).__name__} has no rotary_emb module")
        pos = torch.arange(n, device=device).unsqueeze(0)
        rkw: dict[str, Any] = {}
        layer_types = getattr(model.config, "layer_types", None)
        # the class's own signature: an instance's forward may be patched (tests)
        if layer_types and "layer_type" in inspect.signature(type(rot).forward).parameters:
            rkw["layer_type"] = layer_types[layer]
        with torch.no_grad():
            cos, sin = rot(torch.zeros((), dtype=mdtype, device=device), pos, **rkw)
        kwargs["position_embeddings"] = (cos.detach(), sin.detach())
    per_batch = _alibi_inputs(model, fam.name, attn, n, kwargs, mdtype, device)
    _check_signature(attn, [*kwargs, *per_batch(1)])

    def f(X: Tensor) -> Tensor:
        if X.shape[-2] != n:
            raise ValueError(f"X has {X.shape[-2]} tokens, the function was built for n = {n}")
        lead = X.shape[:-2]
        X3 = X.reshape(-1, n, X.shape[-1])
        Y = attn(hidden_states=X3, **kwargs, **per_batch(X3.shape[0]))[0]
        if not out_inside:
            Y = out(Y)
        return Y.reshape(lead + Y.shape[-2:])

    return f
