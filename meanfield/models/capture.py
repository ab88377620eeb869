r"""Hidden states at a layer's capture point, for windows of a tokenized text.

The inputs entering the attention map of a layer are captured by a forward pre-hook (BERT-style:
the layer; every other family: the attention module), the points where the released code
captured them (docs/experiments.md, "Models and texts"); the forward pass stops there. Vision
encoders (ViT/DeiT) read images, not token ids, and are refused here.

**Long windows.** A model's eager attention holds its ``heads x n x n`` scores per layer (GPT-2
at n = 16384: 12 x 16384² float32 scores, 13 GB). ``attention=`` chooses the attention the
forward pass runs with: ``"sdpa"`` is torch's ``scaled_dot_product_attention``, which on the CPU
runs a flash kernel (float32 and float64) that never holds an ``n x n`` matrix; transformers
then builds no ``n x n`` mask either when every token is attended to (``attention_mask = 1``, no
sliding window): a causal model passes ``is_causal=True``, a bidirectional one no mask at all.
``"auto"`` (the default) follows one fixed rule, :data:`EAGER_MAX_N`: see :func:`hidden_states`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from .._typing import Arch
from ..data import cut_windows, encode_text, tokens_needed
from ._families import FAMILIES, base_model
from .layers import (
    arch_of,
    attention_module,
    check_layer,
    layer_info,
    layer_modules,
    max_positions,
)

__all__ = ["EAGER_MAX_N", "CaptureAttention", "HiddenStates", "hidden_states", "hidden_states_grid"]

logger = logging.getLogger(__name__)

#: The attention a capture runs with (:func:`hidden_states`).
CaptureAttention = Literal["eager", "sdpa", "auto"]

#: ``attention="auto"`` switches an eager model to SDPA for windows longer than this: 1024 is
#: GPT-2's own position table and the longest window of the paper's protocol, so every capture
#: that was possible before positions could be extended keeps its eager bits. A fixed number
#: of tokens, never the memory free at the moment, so a result does not depend on the machine.
EAGER_MAX_N = 1024


# ----------------------------------------------------------------------------------------------
# Hidden states at the capture point
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class HiddenStates:
    """Inputs entering one attention layer for consecutive windows of a text.

    Parameters
    ----------
    X : Tensor, shape (n_windows, n, d)
        Captured inputs (docs/experiments.md, "Protocols and defects": capture points).
    token_ids : Tensor of int64, shape (n_windows, n)
    starts : tuple of int
        Offset of each window in the tokenized text.
    next_start : int
        Pointer just past the last window; pass it as ``start`` for the next ``n``.
    n, layer : int
    capture_point : str
    n_text_tokens : int
        Length of the tokenized text.
    attention : str
        The attention implementation the forward pass ran with (``"eager"``, ``"sdpa"``, or a
        model's own other choice).
    """

    X: Tensor
    token_ids: Tensor
    starts: tuple[int, ...]
    next_start: int
    n: int
    layer: int
    capture_point: str
    n_text_tokens: int
    attention: str = "eager"

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
    if FAMILIES[arch].capture_block:
        return layer_modules(model, arch)[layer]
    return attention_module(model, arch, layer)


def model_device(model: Any) -> torch.device:
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
    return module_input(model, _capture_module(model, arch, layer), ids, token_types, layer)


def _own_attention(model: Any) -> str:
    return str(getattr(model.config, "_attn_implementation", None) or "eager")


def _resolve_attention(model: Any, attention: str, n: int) -> str:
    """The implementation a capture of windows of ``n`` tokens runs with (:func:`hidden_states`)."""
    if attention not in ("eager", "sdpa", "auto"):
        raise ValueError(f"attention must be 'eager', 'sdpa' or 'auto', got {attention!r}")
    own = _own_attention(model)
    if attention != "auto":
        return attention
    if own != "eager" or int(n) <= EAGER_MAX_N:
        return own
    if not getattr(model, "_supports_sdpa", False):
        logger.info(
            "%s has no SDPA attention in transformers: the capture of %d tokens runs eager "
            "attention, which holds heads x n x n scores per layer",
            type(model).__name__,
            n,
        )
        return own
    return "sdpa"


@contextlib.contextmanager
def _attention_implementation(model: Any, impl: str) -> Iterator[None]:
    """Run ``model`` with attention ``impl`` inside the block; its own setting is restored after.

    The setting lives in the model's config, shared by its modules: a concurrent forward pass of
    the same model object in another thread would see it too.
    """
    own = _own_attention(model)
    if impl == own:
        yield
        return
    try:
        model.set_attn_implementation(impl)
    except (ValueError, ImportError, AttributeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            f"{type(model).__name__} cannot run attention={impl!r} in this transformers "
            f"({first}); use attention='eager'"
        ) from err
    try:
        if _own_attention(model) != impl:  # transformers declined with a log message only
            raise ValueError(
                f"{type(model).__name__} cannot switch its attention to {impl!r} in this "
                "transformers; use attention='eager'"
            )
        yield
    finally:
        model.set_attn_implementation(own)


def module_input(model: Any, module: Any, ids: Tensor, token_types: bool, layer: int) -> Tensor:
    """The hidden states entering ``module`` (of layer ``layer``) when ``model`` reads ``ids``.

    A pre-hook records them and stops the forward pass there; the model runs in eval mode without
    gradients and is restored to its training mode afterwards.
    """
    base = base_model(model)
    captured: list[Tensor] = []

    def hook(mod: Any, args: tuple, kwargs: dict) -> None:
        x = args[0] if args else kwargs["hidden_states"]
        captured.append(x.detach())
        raise _Captured

    dev = model_device(model)
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
    attention: CaptureAttention = "auto",
) -> HiddenStates:
    """Hidden states entering attention layer ``layer`` for ``n_windows`` windows of ``n`` tokens.

    Windowing of docs/experiments.md ("Protocols and defects") with D6 fixed: the whole text is
    tokenized once (BERT: [CLS] and [SEP] at the two ends of the whole text only); the
    ``n_windows * n`` token ids from ``start`` are cut into consecutive, non-overlapping windows;
    each window goes through the model in eval mode with ``attention_mask = 1`` and positions
    restarting at 0; forward pre-hooks capture the input of ``encoder.layer[b]`` (BERT-style),
    ``h[b].attn`` (GPT-2, the ``ln_1`` output), ``layers[b].self_attn`` (Llama, the
    ``input_layernorm`` output) or the attention module of the other families
    (``LayerInfo.capture_point``). The windows are batched and the forward pass stops at the
    capture point.

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
    attention : {"auto", "eager", "sdpa"}, default "auto"
        The attention of the forward pass up to the capture point; the model's own setting is
        restored afterwards. ``"eager"``: transformers' eager attention, which holds ``heads x
        n x n`` scores per layer (and, for a causal model, an ``n x n`` additive mask in the
        model's dtype). ``"sdpa"``: torch's ``scaled_dot_product_attention``; with every token
        attended to and no sliding window, transformers passes no mask (``is_causal=True`` for a
        causal model) and torch's CPU flash kernel holds no ``n x n`` matrix, so memory grows
        linearly in ``n``. ``"auto"``: the model's own implementation, except that an eager
        model switches to SDPA for windows longer than :data:`EAGER_MAX_N` (1024) tokens, where
        transformers has SDPA for it. The two agree to float32 rounding, not bit for bit
        (tests/test_long_capture.py); every capture of at most 1024 tokens keeps the bits of
        earlier releases.

    Returns
    -------
    HiddenStates
        ``X`` of shape (n_windows, n, d) plus token ids, window starts, the next pointer and the
        attention used.

    Raises
    ------
    ValueError
        When the text is too short (the message gives the tokens needed), ``n`` exceeds the
        model's positions, the model reads images (ViT/DeiT), or ``attention="sdpa"`` is
        asked of a model transformers has no SDPA attention for.
    """
    arch = arch_of(model)
    layer = check_layer(model, arch, layer)
    fam = FAMILIES[arch]
    if fam.reads != "input_ids":
        raise ValueError(
            f"{type(model).__name__} reads {fam.reads}, not token ids: capture the input of "
            f"{fam.module_path.format(b=layer)} with a forward pre-hook instead"
        )
    if isinstance(text, str):
        if tokenizer is None:
            raise ValueError("a tokenizer is needed to tokenize a string")
        ids = torch.tensor(encode_text(tokenizer, text), dtype=torch.long)
    else:
        ids = text if isinstance(text, Tensor) else torch.as_tensor(list(text), dtype=torch.long)
    max_pos = max_positions(model, arch)
    if max_pos is not None and int(n) > max_pos:
        raise ValueError(
            f"n = {n} exceeds the model's {max_pos} positions (a hard limit; only the random "
            "GPT-2 extends its table: random_gpt2(n_positions=...))"
        )
    win = cut_windows(ids, n, n_windows, start=start, stride=stride)
    if token_type_ids not in ("auto", "zeros", "none"):
        raise ValueError(
            f"token_type_ids must be 'auto', 'zeros' or 'none', got {token_type_ids!r}"
        )
    has_types = int(getattr(model.config, "type_vocab_size", 0) or 0) > 0 and arch == "bert"
    token_types = token_type_ids == "zeros" or (token_type_ids == "auto" and has_types)
    if token_types and not fam.token_types:
        raise ValueError(f"{fam.label} models take no token_type_ids")
    bs = win.n_windows if batch_size is None else max(1, int(batch_size))
    impl = _resolve_attention(model, attention, n)
    with _attention_implementation(model, impl):
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
        attention=impl,
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
