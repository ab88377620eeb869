r"""Hidden states at a layer's capture point, for windows of a tokenized text.

The inputs entering the attention map of a layer are captured by a forward pre-hook (BERT-style:
the layer; every other family: the attention module), the points where the released code
captured them (docs/experiments.md, "Models and texts"); the forward pass stops there. Vision
encoders (ViT/DeiT) read images, not token ids: :func:`image_hidden_states` captures their
inputs for images given as pixel values (:func:`pixel_values`) or for seeded synthetic ones
(:func:`synthetic_pixel_values`); :func:`hidden_states` refuses them.

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
from .layers import arch_of, attention_module, check_layer, layer_info, layer_modules, max_positions

__all__ = [
    "EAGER_MAX_N",
    "CaptureAttention",
    "HiddenStates",
    "ImageHiddenStates",
    "hidden_states",
    "hidden_states_grid",
    "image_hidden_states",
    "pixel_values",
    "reads_images",
    "synthetic_pixel_values",
]

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


def _capture_module(model: Any, arch: Arch, layer: int, block: bool = False) -> Any:
    if block or FAMILIES[arch].capture_block:
        return layer_modules(model, arch)[layer]
    return attention_module(model, arch, layer)


def model_device(model: Any) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


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
    ids = ids.to(model_device(model))
    kwargs: dict[str, Any] = {"attention_mask": torch.ones_like(ids), "use_cache": False}
    if token_types:
        kwargs["token_type_ids"] = torch.zeros_like(ids)
    return _input_of(model, module, layer, input_ids=ids, **kwargs)


def _input_of(model: Any, module: Any, layer: int, **inputs: Any) -> Tensor:
    """The hidden states entering ``module`` when the base model reads ``inputs`` (stopped there)."""
    base = base_model(model)
    captured: list[Tensor] = []

    def hook(mod: Any, args: tuple, kwargs: dict) -> None:
        x = args[0] if args else kwargs["hidden_states"]
        captured.append(x.detach())
        raise _Captured

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    was_training = base.training
    try:
        base.eval()
        with torch.no_grad(), contextlib.suppress(_Captured):
            base(**inputs)
    finally:
        handle.remove()
        base.train(was_training)
    if not captured:
        raise RuntimeError(f"the forward pass never reached layer {layer}")
    return captured[0]


def _token_ids(tokenizer: Any, text: str | Sequence[int] | Tensor) -> Tensor:
    """The token ids of ``text`` (tokenized when a string), as a Tensor."""
    if isinstance(text, str):
        if tokenizer is None:
            raise ValueError("a tokenizer is needed to tokenize a string")
        return torch.tensor(encode_text(tokenizer, text), dtype=torch.long)
    return text if isinstance(text, Tensor) else torch.as_tensor(list(text), dtype=torch.long)


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
        (tests/meanfield/test_long_capture.py); every capture of at most 1024 tokens keeps the bits of
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
            f"{type(model).__name__} reads {fam.reads}, not token ids: use "
            "meanfield.models.image_hidden_states (images or synthetic images)"
        )
    ids = _token_ids(tokenizer, text)
    max_pos = max_positions(model)
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
        module = _capture_module(model, arch, layer)
        parts = [
            module_input(model, module, win.token_ids[i : i + bs], token_types, layer)
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
    ids = _token_ids(tokenizer, text)
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
# Vision encoders: the hidden states for images
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ImageHiddenStates:
    """Inputs entering one attention layer of a vision encoder (ViT/DeiT) for some images.

    Parameters
    ----------
    X : Tensor, shape (n_images, n, d)
        Captured inputs: the patch embeddings plus the model's prefix tokens (CLS; DeiT also
        its distillation token) with position embeddings, through the layers before ``layer``
        and, at a Pre-LN layer's attention, its first LayerNorm.
    n : int
        Tokens per image: ``prefix + (H / patch) * (W / patch)``.
    n_prefix : int
        Tokens before the patches (1 for ViT, 2 for DeiT).
    layer : int
    capture_point : str
    images : str
        Which images: ``"synthetic images, seed S"`` or the file name.
    indices : tuple of int
        Index of each image (in the file, or among the synthetic draws).
    attention : str
        The attention implementation of the forward pass.
    """

    X: Tensor
    n: int
    n_prefix: int
    layer: int
    capture_point: str
    images: str
    indices: tuple[int, ...]
    attention: str = "eager"

    @property
    def n_images(self) -> int:
        """Number of images."""
        return len(self.indices)


def _pair(v: Any) -> tuple[int, int]:
    if isinstance(v, Iterable) and not isinstance(v, (str, bytes)):
        a, b = (int(x) for x in v)
        return a, b
    return int(v), int(v)


def image_geometry(model: Any) -> tuple[int, int, int, int, int]:
    """``(channels, height, width, patch_h, patch_w)`` a vision encoder's config asks for."""
    cfg = model.config
    h, w = _pair(cfg.image_size)
    ph, pw = _pair(cfg.patch_size)
    return int(getattr(cfg, "num_channels", 3)), h, w, ph, pw


def pixel_values(
    images: Any,
    model: Any,
    *,
    image_mean: Sequence[float] | None = None,
    image_std: Sequence[float] | None = None,
    name: str = "images",
) -> Tensor:
    r"""Images as the ``pixel_values`` (N, C, H, W) a vision encoder reads.

    Parameters
    ----------
    images : array-like
        Shape (N, C, H, W) or (N, H, W, C), or one image (C, H, W) or (H, W, C), with C, H and
        W those of the model's config (``num_channels``, ``image_size``). Floating-point values
        are taken as **pixel values already normalised** the way the model's image processor
        gives them (resized, rescaled and normalised); they are used as they are. ``uint8``
        values are **raw pixels** in [0, 255]: each is rescaled by 1/255 and normalised,
        :math:`(x/255 - \mu_c)/\sigma_c`, with ``image_mean`` and ``image_std``, which must
        then be given (a checkpoint's ``preprocessor_config.json`` has them).
    model : transformers.PreTrainedModel
        A ViT/DeiT encoder (bare or with a head).
    image_mean, image_std : sequence of float, optional
        Per-channel mean and standard deviation, for ``uint8`` input only.
    name : str, default "images"
        How a one-line error names the input.

    Returns
    -------
    Tensor, shape (N, C, H, W), float32

    Raises
    ------
    ValueError
        For any other shape, channel count or size (one line naming the expected shapes), an
        integer dtype other than ``uint8``, non-finite values, or ``uint8`` images without a
        mean and standard deviation.
    """
    import numpy as np

    arr = np.asarray(images)
    c, h, w, _, _ = image_geometry(model)
    shape = tuple(int(s) for s in arr.shape)
    if arr.ndim == 3:
        arr = arr[None]
    if arr.ndim != 4 or arr.shape[0] < 1 or tuple(arr.shape[1:]) not in ((c, h, w), (h, w, c)):
        expected = f"(N, {c}, {h}, {w}), (N, {h}, {w}, {c}), ({c}, {h}, {w}) or ({h}, {w}, {c})"
        raise ValueError(f"{name}: expected shape {expected}, got {shape}")
    if tuple(arr.shape[1:]) != (c, h, w):
        arr = arr.transpose(0, 3, 1, 2)
    if arr.dtype == np.uint8:
        if image_mean is None or image_std is None:
            raise ValueError(
                f"{name}: uint8 images are raw pixels and need the image processor's image_mean "
                "and image_std (a preprocessor_config.json beside the checkpoint); or give "
                "float pixel values already normalised"
            )
        mean = np.asarray(image_mean, dtype=np.float64).reshape(1, -1, 1, 1)
        std = np.asarray(image_std, dtype=np.float64).reshape(1, -1, 1, 1)
        if mean.size not in (1, c) or std.size not in (1, c) or not (std > 0).all():
            raise ValueError(
                f"{name}: image_mean and image_std need 1 or {c} values (std > 0), got "
                f"{mean.size} and {std.size}"
            )
        out = (arr.astype(np.float64) / 255.0 - mean) / std
    elif np.issubdtype(arr.dtype, np.floating):
        out = arr.astype(np.float64)
    else:
        raise ValueError(
            f"{name}: expected float pixel values (normalised) or uint8 raw pixels, got dtype "
            f"{arr.dtype}"
        )
    if not np.isfinite(out).all():
        raise ValueError(f"{name}: the pixel values are not all finite")
    return torch.as_tensor(np.ascontiguousarray(out), dtype=torch.float32)


def synthetic_pixel_values(model: Any, n_images: int = 1, *, seed: int = 0) -> Tensor:
    """``n_images`` synthetic images: i.i.d. standard Gaussian pixel values, seeded.

    Drawn by a CPU ``torch.Generator`` seeded with ``seed``, shape (n_images, C, H, W) of the
    model's config, float32: values of the scale of normalised pixels (mean 0, variance 1 per
    channel), with no image structure.
    """
    if int(n_images) < 1:
        raise ValueError(f"n_images must be a positive integer, got {n_images}")
    c, h, w, _, _ = image_geometry(model)
    gen = torch.Generator().manual_seed(int(seed))
    return torch.randn(int(n_images), c, h, w, generator=gen, dtype=torch.float32)


def module_input_pixels(model: Any, module: Any, pixels: Tensor, layer: int) -> Tensor:
    """The hidden states entering ``module`` (of layer ``layer``) when ``model`` reads images.

    As :func:`module_input` for ``pixel_values`` of shape (N, C, H, W): no mask (a vision
    encoder attends to every token), eval mode, the forward pass stopped at the module.
    """
    return _input_of(model, module, layer, pixel_values=pixels.to(model_device(model)))


def reads_images(model: Any) -> bool:
    """Whether ``model`` is a vision encoder (ViT/DeiT) that reads ``pixel_values``, not token ids."""
    return FAMILIES[arch_of(model)].reads == "pixel_values"


def image_hidden_states(
    model: Any,
    layer: int,
    images: Any = None,
    *,
    n_images: int = 1,
    index: int = 0,
    seed: int = 0,
    label: str | None = None,
    block: bool = False,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = torch.float64,
) -> ImageHiddenStates:
    """Hidden states entering attention layer ``layer`` of a ViT/DeiT encoder for images.

    The images become patch embeddings (one token per ``patch x patch`` square, row by row)
    after the model's prefix tokens (CLS; DeiT: CLS and distillation), plus position
    embeddings: ``n = prefix + (H / patch) * (W / patch)`` tokens, attended to without a mask.
    A forward pre-hook captures the input of ``layers[b].attention`` (after the layer's
    ``layernorm_before``; ``block=True``: of ``layers[b]`` itself, before it) and stops the
    forward pass there.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A ViT/DeiT encoder; eval mode during the call, its mode restored after.
    layer : int
    images : array-like or Tensor, optional
        Images as :func:`pixel_values` takes them (float: normalised pixel values), or ``None``
        for synthetic images (:func:`synthetic_pixel_values` with ``seed``).
    n_images : int, default 1
        Images to use: ``images[index : index + n_images]``, or that many synthetic ones.
    index : int, default 0
        First image of ``images`` (ignored for synthetic images).
    seed : int, default 0
        Seed of the synthetic images.
    label : str, optional
        How ``images`` is named in :attr:`ImageHiddenStates.images` (e.g. its file name).
    block : bool, default False
        Capture the input of the whole layer (the residual stream) instead of its attention.
    device : torch.device or str, optional
        Device of ``X``; default the model's.
    dtype : torch.dtype or None, default torch.float64
        dtype of ``X`` (``None``: the model's).

    Returns
    -------
    ImageHiddenStates

    Raises
    ------
    ValueError
        For a model that reads token ids, a bad layer, bad images (:func:`pixel_values`) or an
        index range beyond them.
    """
    arch = arch_of(model)
    if FAMILIES[arch].reads != "pixel_values":
        raise ValueError(
            f"{type(model).__name__} reads token ids, not images: use hidden_states with a text"
        )
    layer = check_layer(model, arch, layer)
    if isinstance(n_images, bool) or int(n_images) < 1:
        raise ValueError(f"n_images must be a positive integer, got {n_images!r}")
    if images is None:
        pixels = synthetic_pixel_values(model, n_images, seed=seed)
        what = f"synthetic images, seed {int(seed)}"
        indices = tuple(range(int(n_images)))
    else:
        name = label or "images"
        if isinstance(images, Tensor):
            images = images.detach().cpu().numpy()
        pixels = pixel_values(images, model, name=name)
        total = int(pixels.shape[0])
        if int(index) < 0 or int(index) + int(n_images) > total:
            raise ValueError(
                f"{name} holds {total} image(s): index {index} + {n_images} image(s) is beyond it"
            )
        pixels = pixels[int(index) : int(index) + int(n_images)]
        what = name
        indices = tuple(range(int(index), int(index) + int(n_images)))
    X = module_input_pixels(model, _capture_module(model, arch, layer, block), pixels, layer)
    X = X.to(device=device if device is not None else X.device, dtype=dtype or X.dtype)
    _, h, w, ph, pw = image_geometry(model)
    n = int(X.shape[1])
    capture = (
        f"input of {FAMILIES[arch].module_path.format(b=layer).rsplit('.', 1)[0]}"
        if block
        else layer_info(model, layer, map="heads").capture_point
    )
    return ImageHiddenStates(
        X=X,
        n=n,
        n_prefix=n - (h // ph) * (w // pw),
        layer=layer,
        capture_point=capture,
        images=what,
        indices=indices,
        attention=_own_attention(model),
    )
