"""`meanfield.profile` and `meanfield profile`: per-layer brackets, block norms, chain rule.

Oracles: the model's own forward pass (the pure blocks), dense Jacobians assembled by reverse-mode
autograd through the Hugging Face modules themselves and their SVD (block and stack norms), the
dense Jacobian of a naive attention (the attention bracket), numpy SVDs of the stored weights
(Gram norms), and the submultiplicativity of operator norms (chain rule).
"""

from __future__ import annotations

import math

import pytest
import torch

from meanfield.profile import ModelProfile, model_blocks, profile_model

from .models_fixtures import *  # noqa: F403  (fixtures: bert, bert_decoder, gpt2, llama, ...)
from .models_fixtures import D64

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MODELS = ["bert", "bert_decoder", "gpt2", "llama"]


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 100, (n,), generator=g)


def _layer_modules(model):
    base = model.base_model
    for name in ("layers", "h"):
        if hasattr(base, name):
            return getattr(base, name)
    return base.encoder.layer


def _hf_io(model, ids):
    """Inputs and outputs of every HF block on one window (hooks on the blocks)."""
    xs, ys = {}, {}
    handles = []
    for i, mod in enumerate(_layer_modules(model)):

        def pre(m, args, kwargs, i=i):
            xs[i] = (args[0] if args else kwargs["hidden_states"])[0].detach()

        def post(m, args, kwargs, out, i=i):
            y = out[0] if isinstance(out, tuple) else out
            ys[i] = (y[0] if y.ndim == 3 else y).detach()

        handles.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(mod.register_forward_hook(post, with_kwargs=True))
    try:
        with torch.no_grad():
            model(input_ids=ids[None], attention_mask=torch.ones_like(ids[None]))
    finally:
        for h in handles:
            h.remove()
    return xs, ys


def _hf_block_fn(model, layer, ids):
    """The HF block ``layer`` as a function of its input, through the model's own forward."""
    mod = _layer_modules(model)[layer]

    class Stop(Exception):
        pass

    def f(x):
        got = {}

        def pre(m, args, kwargs):
            if args:
                return (x[None], *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": x[None]}

        def post(m, args, kwargs, out):
            got["y"] = out[0] if isinstance(out, tuple) else out
            raise Stop

        h1 = mod.register_forward_pre_hook(pre, with_kwargs=True)
        h2 = mod.register_forward_hook(post, with_kwargs=True)
        try:
            model(input_ids=ids[None], attention_mask=torch.ones_like(ids[None]))
        except Stop:
            pass
        finally:
            h1.remove()
            h2.remove()
        y = got["y"]
        return y[0] if y.ndim == 3 else y

    return f


def _dense_norm(fn, X) -> float:
    """Largest singular value of the reverse-mode dense Jacobian (float64 SVD)."""
    J = torch.autograd.functional.jacobian(fn, X).reshape(-1, X.numel())
    return float(torch.linalg.svdvals(J.to(torch.float64))[0])


# ----------------------------------------------------------------------------------------------
# The pure blocks
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_pure_blocks_reproduce_the_model_forward(name, request, llama_fp64_softmax):
    model = request.getfixturevalue(name)
    ids = _ids(9)
    xs, ys = _hf_io(model, ids)
    blocks = model_blocks(model)
    assert len(blocks) == len(xs) == 2
    # bert/gpt2: the same float64 operations in another order (~1e-14). Llama: HF's RMSNorm
    # casts to float32 and its rotary cos/sin are float32, so ~1e-7 relative differences.
    tol = dict(rtol=1e-5, atol=1e-5) if name == "llama" else dict(rtol=1e-10, atol=1e-10)
    for b in blocks:
        torch.testing.assert_close(b(xs[b.layer]), ys[b.layer], **tol)
    # chaining the pure blocks reproduces the next block's input
    torch.testing.assert_close(blocks[0](xs[0]), xs[1], **tol)


# ----------------------------------------------------------------------------------------------
# Per-layer numbers against dense oracles
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_profile_against_dense_oracles(name, request, llama_fp64_softmax):
    model = request.getfixturevalue(name)
    ids = _ids(12, seed=1)
    n = 7
    prof = profile_model(model, ids, n=n, start=2)
    assert isinstance(prof, ModelProfile) and prof.ns == (n,) and prof.layers == (0, 1)
    assert prof.dtype == "float64"
    xs, _ = _hf_io(model, ids[2 : 2 + n])
    blocks = model_blocks(model)
    rtol = 1e-5 if name == "llama" else 1e-9
    x = xs[0]
    for blk in blocks:
        rec = prof.record(blk.layer, n)
        # the block: dense reverse-mode Jacobian of the HF module itself
        exact = _dense_norm(_hf_block_fn(model, blk.layer, ids[2 : 2 + n]), x)
        assert rec.block.value == pytest.approx(exact, rel=rtol)
        assert rec.block.method == "dense" and rec.block.lower <= rec.block.upper
        assert rec.block.lower <= exact * (1 + rtol) and exact <= rec.block.upper * (1 + rtol)
        # the attention sublayer: a naive multi-head attention's dense Jacobian
        Xa = blk.attention_input(x)
        a = rec.attention
        att_exact = _dense_norm(_naive_attention(blk), Xa)
        assert a.lower <= att_exact <= a.upper
        assert a.value == pytest.approx(att_exact, rel=1e-9)
        # per head, through its own output slice
        for h in range(len(blk.attention.params.heads)):
            e = _dense_norm(_naive_attention(blk, head=h), Xa)
            assert a.head_lowers[h] <= e <= a.head_uppers[h]
        assert rec.radius == pytest.approx(float(x.norm(dim=-1).max()), rel=1e-12)
        x = blk(x)


def _naive_attention(blk, head=None):
    """Multi-head attention written out from the weights (softmax of scaled q.k, causal mask)."""
    W = blk.linears
    info = blk.attention.info
    H, Hkv, k = info.n_heads, info.n_kv_heads, info.head_dim
    rope = blk.attention.params.heads[0].rope

    def f(X):
        n = X.shape[0]
        q = (X @ W["q"][0].T + (0 if W["q"][1] is None else W["q"][1])).reshape(n, H, k)
        kk = (X @ W["k"][0].T + (0 if W["k"][1] is None else W["k"][1])).reshape(n, Hkv, k)
        v = (X @ W["v"][0].T + (0 if W["v"][1] is None else W["v"][1])).reshape(n, Hkv, k)
        if rope is not None:
            q, kk = _rotate(q, rope), _rotate(kk, rope)
        outs = []
        for h in range(H):
            g = h // (H // Hkv)
            s = q[:, h] @ kk[:, g].T * info.scale
            if blk.causal:
                s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
            o = torch.softmax(s, -1) @ v[:, g]
            outs.append(o if head is None or h == head else torch.zeros_like(o))
        y = torch.cat(outs, -1) @ W["o"][0].T
        return y

    return f


def _rotate(z, rope):
    """HF's rotate-half rotary embedding at positions 0..n-1, in float64."""
    n = z.shape[0]
    ang = torch.arange(n, dtype=D64)[:, None] * rope.inv_freq.to(D64)
    emb = torch.cat([ang, ang], -1)[:, None, :]
    cos, sin = emb.cos() * rope.attention_scaling, emb.sin() * rope.attention_scaling
    half = z.shape[-1] // 2
    rot = torch.cat([-z[..., half:], z[..., :half]], -1)
    return z * cos + rot * sin
