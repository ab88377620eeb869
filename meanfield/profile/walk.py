r"""Walking a model's layers: :func:`profile_model` (docs/profile.md).

The package door is :mod:`meanfield.profile`; this module measures each layer's attention bracket,
block norm and linear norms and chains them, with the pure blocks of :mod:`~meanfield.profile.blocks`
and the results of :mod:`~meanfield.profile.records`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from .._spectral import spectral_norm_upper
from .._typing import Arch
from ..lipschitz import local_lipschitz, local_lipschitz_fn
from ..models.capture import model_device, module_input
from ..models.layers import HFAttention, arch_of, layer_info, layer_modules, max_positions
from ..params import MultiHeadParams
from .blocks import TransformerBlock, check_layers, model_blocks
from .records import (
    AttentionRecord,
    BlockRecord,
    ChainRecord,
    LayerRecord,
    LinearNorm,
    ModelProfile,
    ProfileProgress,
)

__all__ = ["profile_model"]


# ----------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------


def _check_ns(n: int | Sequence[int]) -> tuple[int, ...]:
    ns = (n,) if isinstance(n, int) else tuple(n)
    if not ns:
        raise ValueError("n is empty")
    for v in ns:
        if isinstance(v, bool) or int(v) != v or int(v) < 1:
            raise ValueError(f"n must be positive integers, got {v!r}")
    return tuple(sorted({int(v) for v in ns}))


def _block_input(model: Any, arch: Arch, layer: int, ids: Tensor) -> Tensor:
    """Hidden states entering block ``layer`` for one window of token ids (model's precision)."""
    token_types = arch == "bert" and int(getattr(model.config, "type_vocab_size", 0) or 0) > 0
    module = layer_modules(model, arch)[layer]
    return module_input(model, module, ids.reshape(1, -1), token_types, layer)[0]


# ----------------------------------------------------------------------------------------------
# Estimates
# ----------------------------------------------------------------------------------------------


def _f(x: Tensor) -> float:
    return float(x.detach().to(torch.float64).cpu())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


#: Width ``upper_prob / lower <= 1 + _WIDTH`` the attention runs also stop on (the default of
#: :func:`meanfield.local_lipschitz`'s width rule).
_WIDTH = 0.05


def _attention(
    X: Tensor, att: HFAttention, *, heads: bool, tol: float, seed: int, delta: float
) -> AttentionRecord:
    t0 = time.perf_counter()
    # the width rule beside the residual one: a Lanczos run also stops only once its certified
    # bracket [lower, upper_prob] is within 1 + _WIDTH, so that upper_prob is finite where no
    # deterministic upper end is formed (the streaming path: QK-norm, soft-cap, windows, long
    # windows); a residual stop alone can come after too few steps for it (docs/profile.md §3)
    kw: dict[str, Any] = dict(masked=att.causal, tol=tol, seed=seed, delta=delta, prob_rtol=_WIDTH)
    est = local_lipschitz(X, att.params, **kw)
    hv = hl = hu = None
    if heads:
        p = att.params
        ests = [
            local_lipschitz(X, MultiHeadParams((p.heads[h],), W_O=p.head_projection(h)), **kw)
            for h in range(p.n_heads)
        ]
        hv = tuple(_f(e.value) for e in ests)
        hl = tuple(_f(e.lower) for e in ests)
        hu = tuple(_f(e.upper) for e in ests)
    _sync(X.device)
    return AttentionRecord(
        value=_f(est.value),
        lower=_f(est.lower),
        upper=_f(est.upper),
        upper_method=est.upper_method,
        upper_prob=_f(est.upper_prob) if est.upper_prob is not None else _f(est.upper),
        converged=bool(est.converged),
        n_matvec=int(est.n_matvec),
        seconds=time.perf_counter() - t0,
        head_values=hv,
        head_lowers=hl,
        head_uppers=hu,
    )


def _jacobian(
    fn: Callable[[Tensor], Tensor], X: Tensor, *, tol: float, seed: int, delta: float, krylov: int
) -> BlockRecord:
    t0 = time.perf_counter()
    # A fixed number of Lanczos steps (one cycle; tol = 0 never stops early, except at an exact
    # breakdown) rather than stopping at ``tol``: the probabilistic upper end depends on the
    # size of the Krylov space only, and needs ~16-32 steps to be finite and tight even when a
    # large spectral gap makes the estimate converge in a few (docs/profile.md §3); ``tol``
    # then only judges convergence.
    est = local_lipschitz_fn(
        fn, X, tol=0.0, max_iter=krylov, krylov_dim=krylov, seed=seed, delta=delta
    )
    _sync(X.device)
    upper = _f(est.upper)
    prob = _f(est.upper_prob) if est.upper_prob is not None else math.inf
    value = _f(est.value)
    converged = bool(torch.isfinite(est.residual)) and _f(est.residual) <= tol * value**2
    return BlockRecord(
        value=value,
        lower=_f(est.lower),
        upper=upper,
        upper_prob=min(prob, upper),
        confidence=1.0 if math.isfinite(upper) or est.confidence is None else est.confidence,
        method=est.method,
        converged=converged if est.method != "dense" else bool(est.converged),
        n_matvec=int(est.n_matvec),
        seconds=time.perf_counter() - t0,
    )


def _linear_norms(block: TransformerBlock) -> tuple[LinearNorm, ...]:
    out = []
    for name, (W, _) in block.linears.items():
        W64 = W.to(torch.float64)
        Ws = W64 if W64.shape[0] >= W64.shape[1] else W64.mT
        # the top eigenvalue of the smaller Gram matrix: sigma_1 to ~1e-15 relative, cheaper
        # than an SVD; the certificate below does not depend on its accuracy
        sigma = torch.linalg.eigvalsh(Ws.mT @ Ws)[-1].clamp_min(0).sqrt()
        # Cholesky test of s^2 I - W^T W at sigma inflated by the rounding margin (Gram
        # iteration only as the fallback): certified, and tight to ~1e-10
        upper = spectral_norm_upper(W64, candidate=sigma, max_iter=0)
        out.append(LinearNorm(name, (int(W.shape[0]), int(W.shape[1])), _f(sigma), _f(upper)))
    return tuple(out)


def _chain(
    n: int, layers: tuple[int, ...], recs: list[LayerRecord], e2e: BlockRecord
) -> ChainRecord:
    log_value = sum(math.log(r.block.value) if r.block.value > 0 else -math.inf for r in recs)
    log_bound = sum(math.log(r.block.bound) if r.block.bound > 0 else -math.inf for r in recs)
    prob = any(not math.isfinite(r.block.upper) for r in recs)
    fail = sum(1.0 - r.block.confidence for r in recs)
    product_value = math.exp(log_value) if log_value < 709 else math.inf
    product_bound = math.exp(log_bound) if log_bound < 709 else math.inf
    slack = product_value / e2e.value if e2e.value > 0 else math.inf
    return ChainRecord(
        n=n,
        layers=layers,
        product_value=product_value,
        product_bound=product_bound,
        bound_kind="probabilistic" if prob else "certified",
        confidence=max(0.0, 1.0 - fail),
        end_to_end=e2e,
        holds=bool(e2e.lower <= product_bound),
        slack=slack,
    )


def _cost(n: int, d: int, d_ff: int, heads: bool) -> float:
    attn = n * n * d * (2 if heads else 1) + n * d * d
    return float(attn + 3 * n * d * d_ff)


# ----------------------------------------------------------------------------------------------
# The profile
# ----------------------------------------------------------------------------------------------


def profile_model(
    model: Any,
    tokens_or_hidden: Tensor | Sequence[int],
    *,
    n: int | Sequence[int],
    layers: Iterable[int] | None = None,
    heads: bool = True,
    end_to_end: bool = True,
    start: int = 0,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    tol: float = 1e-4,
    delta: float = 1e-6,
    krylov: int = 24,
    seed: int = 0,
    label: str | None = None,
    progress: bool | Callable[[ProfileProgress], None] = False,
) -> ModelProfile:
    r"""Profile every layer of a transformer: attention bracket, block norm, weights, chain rule.

    For each window length ``n`` the hidden states :math:`x_{\ell_0}` entering the first
    profiled layer are taken from the model's forward pass on the window (or from
    ``tokens_or_hidden`` directly), then pushed through the pure blocks
    (:func:`model_blocks`), :math:`x_{\ell+1}=\mathrm{block}_\ell(x_\ell)`, in ``dtype``; at each
    layer the attention sublayer, the block and, once, the weight matrices are measured
    (module docstring; docs/profile.md explains each number and what is certified).

    Parameters
    ----------
    model : transformers.PreTrainedModel
        Of a family :func:`model_blocks` models (e.g. from :func:`meanfield.models.load_model`;
        the modelled blocks are listed in docs/profile.md §2).
    tokens_or_hidden : Tensor or sequence of int
        Token ids, shape (N,): each ``n`` uses the window ``ids[start : start + n]`` with
        positions restarting at 0. Or hidden states entering the first profiled layer, float
        shape (N, d): each ``n`` uses the first ``n`` rows (``start`` is ignored).
    n : int or sequence of int
        Window lengths (each at most the model's positions and the input's length).
    layers : iterable of int, optional
        Layers to profile (default all). The layers between two profiled ones still run (to
        carry the hidden states), unmeasured. The chain rule needs consecutive layers;
        otherwise ``chains`` is empty.
    heads : bool, default True
        Also bracket each head (for a layer x head heatmap); costs about as much again.
    end_to_end : bool, default True
        Measure the stack's Jacobian norm and the chain rule.
    start : int, default 0
        Token offset of the window.
    dtype : torch.dtype, optional
        Precision of the blocks and every estimate: float hidden states keep their own; token
        ids default to float64 (the reference).
    device : torch.device or str, optional
        Default: the hidden states' device, else the model's.
    tol : float, default 1e-4
        Residual tolerance: the attention's Lanczos runs stop there (:func:`local_lipschitz`);
        the block and end-to-end runs take ``krylov`` steps and ``converged`` says whether
        their residual meets it. Brackets do not depend on it being met.
    delta : float, default 1e-6
        Failure probability of each Lanczos ``upper_prob``.
    krylov : int, default 24
        Lanczos steps (two autograd products each) of every matrix-free block and end-to-end
        run. The probabilistic upper end of a run needs enough of them: for ``n d`` = 73 728
        (SmolLM2 at n = 128) and ``delta = 1e-6`` its factor over the estimate is infinite
        below 12 steps, 1.3 at 16, 1.10 at 24 and 1.05 at 32.
    seed : int, default 0
        Seed of the solvers' start vectors.
    label : str, optional
        Model label for the record (default ``config._name_or_path`` or the class name).
    progress : bool or callable, default False
        ``True``: a tqdm bar on stderr; a callable receives a :class:`ProfileProgress` once
        before the first step (``step = 0``, ``cost = 0``) and after each step.

    Returns
    -------
    ModelProfile

    Raises
    ------
    ValueError
        When ``n`` exceeds the input's length or the model's positions, or for bad ``layers``.
    NotImplementedError
        For blocks or MLP activations that are not modelled, in one line naming them (an
        ``UnmodelledFeature``, also a ``ValueError``), and for attention features that
        :func:`meanfield.models.hf_attention` does not model.
    """
    t_start = time.perf_counter()
    arch = arch_of(model)
    n_layers = len(layer_modules(model, arch))
    idx = check_layers(layers, n_layers)
    ns = _check_ns(n)
    if not (math.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be a positive number, got {tol}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if isinstance(krylov, bool) or int(krylov) != krylov or krylov < 2:
        raise ValueError(f"krylov must be an integer >= 2, got {krylov!r}")
    krylov = int(krylov)
    info = layer_info(model, idx[0], map="heads+WO")
    src = tokens_or_hidden
    if not isinstance(src, Tensor):
        src = torch.as_tensor(list(src), dtype=torch.long)
    hidden = src.is_floating_point()
    if hidden:
        if src.ndim != 2 or src.shape[-1] != info.d:
            raise ValueError(f"hidden states must have shape (N, {info.d}), got {tuple(src.shape)}")
        dt = dtype if dtype is not None else src.dtype
        dev = torch.device(device) if device is not None else src.device
        length = int(src.shape[0])
        what = f"the hidden states have {length} tokens"
    else:
        if src.ndim != 1:
            raise ValueError(f"token ids must have shape (N,), got {tuple(src.shape)}")
        if start < 0:
            raise ValueError(f"start must be >= 0, got {start}")
        dt = dtype if dtype is not None else torch.float64
        dev = torch.device(device) if device is not None else model_device(model)
        length = int(src.numel()) - int(start)
        what = f"the text has {length} tokens from token {start}"
    max_pos = max_positions(model)
    for v in ns:
        if max_pos is not None and v > max_pos and not hidden:
            raise ValueError(f"n = {v} exceeds the model's {max_pos} positions")
        if v > length:
            raise ValueError(f"n = {v} is larger than the input: {what}")
    span = tuple(range(idx[0], idx[-1] + 1))
    blocks = model_blocks(model, span, dtype=dt, device=dev)  # skipped layers still run
    run_e2e = bool(end_to_end) and idx == span  # the chain rule needs consecutive layers

    d_ff = blocks[0].linears["up"][0].shape[0]
    costs = [_cost(v, info.d, d_ff, heads) for v in ns]
    plan = [(f"n={v} layer {layer}", c) for v, c in zip(ns, costs) for layer in idx]
    if run_e2e:
        plan += [(f"n={v} end-to-end", c * len(idx)) for v, c in zip(ns, costs)]
    total_cost = sum(c for _, c in plan)
    bar = None
    callback = progress if callable(progress) else None
    if progress is True:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(plan), desc="profile", leave=False)
    step = 0

    def tick(label_: str, cost: float) -> None:
        nonlocal step
        step += 1
        if bar is not None:
            bar.set_postfix_str(label_, refresh=False)
            bar.update(1)
        if callback is not None:
            callback(ProfileProgress(step, len(plan), label_, cost, total_cost))

    if callback is not None:  # announce the plan before the first (long) step
        callback(ProfileProgress(0, len(plan), "start", 0.0, total_cost))
    linear = tuple((b.layer, _linear_norms(b)) for b in blocks if b.layer in idx)
    records: list[LayerRecord] = []
    chains: list[ChainRecord] = []
    try:
        for v, c in zip(ns, costs):
            if hidden:
                x = src[:v].to(device=dev, dtype=dt)
            else:
                window = src[int(start) : int(start) + v]
                x = _block_input(model, arch, idx[0], window).to(device=dev, dtype=dt)
            x_first = x
            recs_n: list[LayerRecord] = []
            for blk in blocks:
                if blk.layer not in idx:
                    with torch.no_grad():
                        x = blk(x)
                    continue
                with torch.no_grad():
                    Xa = blk.attention_input(x)
                att = _attention(Xa, blk.attention, heads=heads, tol=tol, seed=seed, delta=delta)
                jac = _jacobian(blk, x, tol=tol, seed=seed, delta=delta, krylov=krylov)
                rec = LayerRecord(
                    layer=blk.layer,
                    n=v,
                    radius=_f(x.norm(dim=-1).amax()),
                    attention_radius=_f(Xa.norm(dim=-1).amax()),
                    attention=att,
                    block=jac,
                )
                recs_n.append(rec)
                with torch.no_grad():
                    x = blk(x)
                if not bool(torch.isfinite(x).all()):
                    raise FloatingPointError(
                        f"hidden states leaving layer {blk.layer} are not finite in {dt}"
                    )
                tick(f"n={v} layer {blk.layer}", c)
            records.extend(recs_n)
            if run_e2e:

                def stack(y: Tensor) -> Tensor:
                    for b in blocks:
                        y = b(y)
                    return y

                e2e = _jacobian(stack, x_first, tol=tol, seed=seed, delta=delta, krylov=krylov)
                chains.append(_chain(v, idx, recs_n, e2e))
                tick(f"n={v} end-to-end", c * len(idx))
    finally:
        if bar is not None:
            bar.close()
    return ModelProfile(
        model=label or str(getattr(model.config, "_name_or_path", "") or type(model).__name__),
        arch=arch,
        n_layers=n_layers,
        d=info.d,
        n_heads=info.n_heads,
        causal=info.causal,
        layers=idx,
        ns=ns,
        dtype=str(dt).replace("torch.", ""),
        device=str(dev),
        records=tuple(records),
        linear=linear,
        chains=tuple(chains),
        settings={
            "tol": float(tol),
            "delta": float(delta),
            "krylov": krylov,
            "seed": int(seed),
            "heads": bool(heads),
            "start": None if hidden else int(start),
            "input": "hidden states" if hidden else "token ids",
            "end_to_end": run_e2e,
        },
        seconds=time.perf_counter() - t_start,
    )
