"""Float64 Hugging Face models without transformers' float32 steps, and hooks on their blocks.

A transformers model cast to float64 still takes some steps in float32, each a rounding of
about ``eps_32 ~ 6e-8`` relative to its result:

- eager attention takes its softmax as ``softmax(scores, dim=-1, dtype=torch.float32)`` and
  casts the probabilities back (most families);
- the RMSNorms normalise in float32: the Llama form (Llama, Mistral, Qwen2, Qwen3 and its
  QK-norms, Phi-3) casts ``x`` to float32, multiplies by ``rsqrt(mean(x^2) + eps)``, casts back
  and multiplies by ``w``; the Gemma form (Gemma, Gemma-2, Gemma-3 and its QK-norms) computes
  ``x.float() * rsqrt(...) * (1 + w.float())`` and casts back;
- the rotary embedding computes its angles ``position * inv_freq`` and their cos/sin in float32
  (with a ``{layer_type}_`` prefix on the tables of the models with one table per layer type:
  Gemma-3, ModernBERT), then casts the tables to the model's dtype;
- ModernBERT rotates q and k in float32 (``q.float() * cos + rotate_half(q.float()) * sin``).

The maps meanfield rebuilds from the weights compute every step in float64, so against the
unpatched model they agree only at float32 level (~1e-7). :func:`patch_float32_steps` replaces
each of those steps by the same formula in float64 (the same operations on the same float64
inputs, the weights and ``inv_freq`` read as the model holds them), so that what is left is
float64 rounding in a different order, a few ``eps_64 ~ 1e-16`` amplified by the conditioning
of O(1) logits: measured at most ~1.3e-15, and the tests compare to 1e-12 relative to the
largest entry. Inputs of other dtypes (float32 models) take transformers' own steps.

:func:`block_io` captures, by hooks, what enters and leaves each block of a model, and what
enters each block's attention module, in one forward pass: the oracle the rebuilt blocks are
compared with. :func:`seeded_model`, :func:`randomize`, :func:`token_ids` and :func:`rel_error`
build the small random models, their inputs and the comparison the profile tests share.
"""

from __future__ import annotations

import math
import sys

import pytest
import torch

from meanfield.models.layers import arch_of, attention_module, layer_modules

D64 = torch.float64


def patch_softmax64(monkeypatch: pytest.MonkeyPatch) -> None:
    """``torch.nn.functional.softmax`` in the input's dtype for float64 inputs.

    Eager attention calls ``softmax(scores, dim=-1, dtype=torch.float32)``: for float64 scores
    the ``dtype`` is dropped, so the probabilities are computed in float64; inputs of other
    dtypes keep the ``dtype`` asked for.
    """
    softmax = torch.nn.functional.softmax

    def softmax64(input, dim=None, _stacklevel=3, dtype=None):
        return softmax(input, dim=dim, dtype=None if input.dtype == D64 else dtype)

    monkeypatch.setattr(torch.nn.functional, "softmax", softmax64)


def patch_float32_steps(model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> None:
    """Replace transformers' float32 steps in ``model`` by the same formulas in float64.

    Parameters
    ----------
    model
        A transformers model (any family; the steps it does not take are left alone).
    monkeypatch
        The test's ``monkeypatch``: every patch is undone when the test ends.

    Notes
    -----
    Patches ``torch.nn.functional.softmax`` (:func:`patch_softmax64`), the ``forward`` of every
    module whose class name ends with ``RMSNorm`` (the Gemma form ``(1 + w)`` where the class
    name holds ``Gemma``, the Llama form ``w`` otherwise), the ``forward`` of
    ``model.base_model.rotary_emb`` where there is one, and ModernBERT's
    ``apply_rotary_pos_emb`` (by Llama's, which rotates in the input's dtype). See the module
    docstring for the steps and why.
    """
    patch_softmax64(monkeypatch)
    for mod in model.modules():
        cls = type(mod).__name__
        if cls.endswith("RMSNorm"):  # the QK-norms of Qwen3 and Gemma-3 included
            eps = mod.variance_epsilon if hasattr(mod, "variance_epsilon") else mod.eps
            gemma = "Gemma" in cls

            def norm(x, mod=mod, eps=eps, gemma=gemma):
                w = 1.0 + mod.weight if gemma else mod.weight
                return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

            monkeypatch.setattr(mod, "forward", norm)
    rot = getattr(model.base_model, "rotary_emb", None)
    if rot is None:
        return

    def rotary(x, position_ids, layer_type=None):
        pre = f"{layer_type}_" if layer_type else ""
        inv = getattr(rot, pre + "inv_freq").to(D64)
        scale = getattr(rot, pre + "attention_scaling")
        ang = position_ids[..., None].to(D64) * inv
        emb = torch.cat([ang, ang], dim=-1)
        return (emb.cos() * scale).to(x.dtype), (emb.sin() * scale).to(x.dtype)

    monkeypatch.setattr(rot, "forward", rotary)
    module = sys.modules[type(model).__module__]
    if "modernbert" in module.__name__:  # rotates q and k in float32
        from transformers.models.llama import modeling_llama

        monkeypatch.setattr(module, "apply_rotary_pos_emb", modeling_llama.apply_rotary_pos_emb)


def block_io(model: torch.nn.Module, ids: torch.Tensor) -> tuple[dict, dict, dict]:
    """What enters and leaves every block of ``model``, and what enters its attention module.

    Parameters
    ----------
    model
        A transformers model of a family meanfield knows (the blocks and their attention
        modules are found by the family adapter: ``layer_modules``, ``attention_module``).
    ids
        One window of token ids, shape ``(n,)``; the model runs on it with a full attention
        mask and without gradients.

    Returns
    -------
    xs, ys, xa
        Dictionaries from the layer index to the ``(n, d)`` input of the block, its output
        and the input of its attention module (batch dimension dropped).
    """
    arch = arch_of(model)
    xs: dict = {}
    ys: dict = {}
    xa: dict = {}
    handles = []
    for i, mod in enumerate(layer_modules(model, arch)):

        def pre(m, args, kwargs, i=i, into=xs):
            into[i] = (args[0] if args else kwargs["hidden_states"])[0].detach()

        def post(m, args, kwargs, out, i=i):
            y = out[0] if isinstance(out, tuple) else out
            ys[i] = (y[0] if y.ndim == 3 else y).detach()

        def pre_att(m, args, kwargs, i=i):
            pre(m, args, kwargs, i=i, into=xa)

        att = attention_module(model, arch, i)
        handles.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(mod.register_forward_hook(post, with_kwargs=True))
        handles.append(att.register_forward_pre_hook(pre_att, with_kwargs=True))
    try:
        with torch.no_grad():
            model(input_ids=ids[None], attention_mask=torch.ones_like(ids[None]))
    finally:
        for h in handles:
            h.remove()
    return xs, ys, xa


def seeded_model(config, model_cls=None, norm_centre: float | None = None) -> torch.nn.Module:
    """A transformers model from ``config``, initialised under ``manual_seed(0)``, in eval mode.

    Parameters
    ----------
    config
        A transformers config object.
    model_cls
        The model class; ``None``: ``transformers.AutoModel.from_config``. The global RNG is
        left as it was (``fork_rng``).
    norm_centre
        ``None``: the initialisation is kept. A number: the weights are then drawn again by
        :func:`randomize`, the norm gains centred at ``norm_centre``.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        if model_cls is None:
            import transformers

            model = transformers.AutoModel.from_config(config)
        else:
            model = model_cls(config)
    if norm_centre is not None:
        randomize(model, norm_centre=norm_centre)
    return model.eval()


def randomize(model: torch.nn.Module, seed: int = 1, norm_centre: float = 1.0) -> None:
    """Draw weights of std 1.5/sqrt(fan-in), norm gains around ``norm_centre``, biases around 0.

    Parameters
    ----------
    model
        Randomized in place; the embeddings (``embed``, ``wte``, ``wpe`` in the
        name) keep their initialisation.
    seed
        Seed of the generator drawn from, parameter by parameter in ``named_parameters`` order.
    norm_centre
        Where the 1-D ``weight`` parameters (the norm gains) are centred: 1 for a gain ``w``;
        0 for Gemma's norms, whose gain is ``1 + w`` (they start at ``w = 0``). Random gains make
        each norm of a block distinct, so that one read in the place of another shows. The
        other 1-D parameters (biases, shifts) are centred on 0.
    """
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            low = name.lower()
            if p.ndim == 2 and not any(s in low for s in ("embed", "wte", "wpe")):
                p.copy_(torch.randn(p.shape, generator=g) * 1.5 / math.sqrt(p.shape[1]))
            elif p.ndim == 1 and name.endswith("weight"):  # the 1-D weights are norm gains
                p.copy_(norm_centre + 0.3 * torch.randn(p.shape, generator=g))
            elif p.ndim == 1:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))


def token_ids(n: int, seed: int) -> torch.Tensor:
    """``n`` token ids drawn uniformly from 1..99 by a generator seeded with ``seed``."""
    return torch.randint(1, 100, (n,), generator=torch.Generator().manual_seed(seed))


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """``max |a - b| / max |b|``; ``a`` and ``b`` must have the same shape and dtype."""
    assert a.shape == b.shape and a.dtype == b.dtype
    return float((a - b).abs().max() / b.abs().max())
