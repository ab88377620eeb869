"""`meanfield.profile` and `meanfield profile`: per-layer brackets, block norms, chain rule.

Oracles: the model's own forward pass (the pure blocks), dense Jacobians assembled by reverse-mode
autograd through the Hugging Face modules themselves and their SVD (block and stack norms), the
dense Jacobian of a naive attention (the attention bracket), numpy SVDs of the stored weights
(Gram norms), and the submultiplicativity of operator norms (chain rule).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from meanfield.models import tiny_config
from meanfield.models.layers import arch_of, layer_modules
from meanfield.profile import ModelProfile, model_blocks, profile_model

from ..hf_float64 import block_io, token_ids
from ..models_fixtures import *  # noqa: F403  (fixtures: bert, bert_decoder, gpt2, llama, ...)
from ..models_fixtures import D64, LLAMA_TOKENS, transformers
from ..profile_cli import *  # noqa: F403  (fixture: tokenizer)
from ..profile_cli import cli, save_checkpoint
from ..tolerances import (
    BRACKET_MARGIN,
    F32_FORWARD,
    F32_VALUE,
    F64_LANCZOS,
    F64_LANCZOS_GAP,
    F64_REDUCTION,
    F64_ROUND_TRIP,
    F64_VS_HF_LAYER,
    GRAM_CERT_DEFAULT,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MODELS = ["bert", "bert_decoder", "gpt2", "llama"]


def _hf_block_fn(model, layer, ids):
    """The HF block ``layer`` as a function of its input, through the model's own forward."""
    mod = layer_modules(model, arch_of(model))[layer]

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
    ids = token_ids(9, seed=0)
    xs, ys, _ = block_io(model, ids)
    blocks = model_blocks(model)
    assert len(blocks) == len(xs) == 2
    # bert/gpt2: the same float64 operations in another order (~1e-14). Llama: HF's RMSNorm
    # casts to float32 and its rotary cos/sin are float32, so ~1e-7 relative differences.
    tol = (
        dict(rtol=F32_FORWARD, atol=F32_FORWARD)
        if name == "llama"
        else dict(rtol=F64_VS_HF_LAYER, atol=F64_VS_HF_LAYER)
    )
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
    ids = token_ids(12, seed=1)
    n = 7
    prof = profile_model(model, ids, n=n, start=2)
    assert isinstance(prof, ModelProfile) and prof.ns == (n,) and prof.layers == (0, 1)
    assert prof.dtype == "float64"
    xs, _, _ = block_io(model, ids[2 : 2 + n])
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
        assert a.value == pytest.approx(att_exact, rel=F64_LANCZOS)
        # per head, through its own output slice
        for h in range(len(blk.attention.params.heads)):
            e = _dense_norm(_naive_attention(blk, head=h), Xa)
            assert a.head_lowers[h] <= e <= a.head_uppers[h]
        assert rec.radius == pytest.approx(float(x.norm(dim=-1).max()), rel=F64_REDUCTION)
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


# ----------------------------------------------------------------------------------------------
# Weights, chain rule, matrix-free path, schema
# ----------------------------------------------------------------------------------------------


def _hf_weights(model, name, layer):
    """The HF weight matrices in (out, in) layout, read independently of meanfield.profile."""
    blk = layer_modules(model, arch_of(model))[layer]
    if name == "gpt2":
        d = blk.attn.c_attn.weight.shape[0]
        q, k, v = blk.attn.c_attn.weight.detach().split(d, dim=1)
        mats = {"q": q, "k": k, "v": v, "o": blk.attn.c_proj.weight, "up": blk.mlp.c_fc.weight}
        mats["down"] = blk.mlp.c_proj.weight
        return {key: w.detach().T for key, w in mats.items()}
    if name == "llama":
        a, m = blk.self_attn, blk.mlp
        mods = {"q": a.q_proj, "k": a.k_proj, "v": a.v_proj, "o": a.o_proj}
        mods.update(gate=m.gate_proj, up=m.up_proj, down=m.down_proj)
    else:
        s = blk.attention.self
        mods = {"q": s.query, "k": s.key, "v": s.value, "o": blk.attention.output.dense}
        mods.update(up=blk.intermediate.dense, down=blk.output.dense)
    return {key: mod.weight.detach() for key, mod in mods.items()}


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
def test_gram_norms_bound_the_exact_svd(name, request):
    model = request.getfixturevalue(name)
    prof = profile_model(model, token_ids(6, seed=0), n=3, heads=False, end_to_end=False)
    for layer, maps in prof.linear:
        ref = _hf_weights(model, name, layer)
        assert sorted(m.name for m in maps) == sorted(ref)
        for m in maps:
            W = ref[m.name].numpy()
            exact = float(np.linalg.svd(W, compute_uv=False)[0])
            assert m.shape == W.shape
            assert m.sigma == pytest.approx(exact, rel=F64_REDUCTION)
            # certified: above the exact norm, and within the Gram/Cholesky rounding margin
            assert exact <= m.upper <= exact * (1 + GRAM_CERT_DEFAULT)


@pytest.mark.parametrize("name", ["bert_decoder", "gpt2", "llama"])
def test_chain_rule_product_bounds_the_end_to_end_norm(name, request, llama_fp64_softmax):
    model = request.getfixturevalue(name)
    n = 6
    prof = profile_model(model, token_ids(n + 1, seed=3), n=n, heads=False)
    (c,) = prof.chains
    e = c.end_to_end
    assert c.layers == (0, 1) and c.bound_kind == "certified" and c.confidence == 1.0
    recs = [prof.record(layer, n) for layer in c.layers]
    assert c.product_value == pytest.approx(
        math.prod(r.block.value for r in recs), rel=F64_REDUCTION
    )
    assert c.product_bound == pytest.approx(
        math.prod(r.block.upper for r in recs), rel=F64_REDUCTION
    )
    # ||D(g o f)|| <= ||Dg|| ||Df||: the certified product above the end-to-end lower end
    assert c.holds and e.lower <= c.product_bound
    assert e.value <= c.product_value * (1 + F64_LANCZOS) and c.slack >= 1 - F64_LANCZOS
    # the end-to-end value: dense reverse-mode Jacobian of the model's own two blocks
    ids = token_ids(n + 1, seed=3)[:n]
    xs, _, _ = block_io(model, ids)
    f0, f1 = _hf_block_fn(model, 0, ids), _hf_block_fn(model, 1, ids)
    exact = _dense_norm(lambda x: f1(f0(x)), xs[0])
    rtol = 1e-5 if name == "llama" else 1e-9
    assert e.value == pytest.approx(exact, rel=rtol)
    assert e.lower <= exact * (1 + rtol) <= e.upper * (1 + 2 * rtol)


def test_matrix_free_path_and_hidden_state_input(gpt2):
    """n d > 1500: Lanczos through autograd products; hidden states given directly."""
    n = 26
    xs, _, _ = block_io(gpt2, token_ids(n, seed=5))
    prof = profile_model(gpt2, xs[0], n=[n, 5], tol=1e-9, heads=False)
    assert prof.ns == (5, n) and prof.settings["input"] == "hidden states"
    rec = prof.record(0, n)
    assert rec.block.method == "lanczos" and rec.block.converged
    exact = _dense_norm(_hf_block_fn(gpt2, 0, token_ids(n, seed=5)), xs[0])
    assert rec.block.value == pytest.approx(exact, rel=F64_LANCZOS_GAP)
    assert rec.block.lower <= exact * (1 + BRACKET_MARGIN)
    assert not math.isfinite(rec.block.upper) and rec.block.upper_prob >= exact
    a = rec.attention
    assert a.lower <= a.value <= a.upper_prob <= a.upper and a.upper_method == "block"
    # n = 5 uses the first 5 rows; for a causal model they are the window of 5 tokens
    exact5 = _dense_norm(_hf_block_fn(gpt2, 0, token_ids(n, seed=5)[:5]), xs[0][:5])
    assert prof.record(0, 5).block.value == pytest.approx(exact5, rel=F64_LANCZOS)
    (c5, c26) = prof.chains
    assert c26.holds and c26.bound_kind == "probabilistic" and 0.99 < c26.confidence < 1
    assert c5.bound_kind == "certified"


def test_float32_follows_the_input(gpt2):
    x = block_io(gpt2, token_ids(6, seed=0))[0][0]
    p64 = profile_model(gpt2, x, n=6, layers=[1], heads=False)
    p32 = profile_model(gpt2, x.float(), n=6, layers=[1], heads=False)
    assert (p64.dtype, p32.dtype) == ("float64", "float32")
    assert p32.record(1, 6).block.value == pytest.approx(
        p64.record(1, 6).block.value, rel=F32_VALUE
    )
    assert p64.chains and p64.chains[0].layers == (1,)


def test_schema_layers_and_progress(llama):
    events = []
    prof = profile_model(
        llama,
        token_ids(10, seed=0),
        n=[4, 8],
        layers=[1, 0, 1],
        progress=events.append,
        label="tiny",
    )
    assert prof.layers == (0, 1) and prof.model == "tiny"
    assert [e.step for e in events] == list(range(7))  # 0 (plan), 2 n x 2 layers, 2 chains
    assert all(e.total == 6 for e in events)
    assert sum(e.cost for e in events) == pytest.approx(events[0].total_cost)
    doc = json.loads(json.dumps(prof.to_dict()))
    assert doc["kind"] == "profile" and doc["ns"] == [4, 8] and doc["layers"] == [0, 1]
    assert {"model", "arch", "n_layers", "d", "n_heads", "causal", "dtype", "device"} <= set(doc)
    assert len(doc["records"]) == 4 and len(doc["chains"]) == 2
    r = doc["records"][0]
    assert set(r) == {"layer", "n", "radius", "attention_radius", "attention", "block"}
    assert len(r["attention"]["head_values"]) == 4
    assert {"value", "lower", "upper", "upper_prob", "confidence", "method"} <= set(r["block"])
    assert [m["name"] for m in doc["linear"][0]["maps"]] == [
        "q",
        "k",
        "v",
        "o",
        "gate",
        "up",
        "down",
    ]
    assert {"product_value", "product_bound", "end_to_end", "holds", "slack"} <= set(
        doc["chains"][0]
    )
    # one layer: the chain is that block itself
    (c,) = profile_model(llama, token_ids(4, seed=0), n=4, layers=[1], heads=False).chains
    assert c.product_value == pytest.approx(c.end_to_end.value, rel=F64_LANCZOS)
    with pytest.raises(ValueError, match="out of range"):
        profile_model(llama, token_ids(4, seed=0), n=4, layers=[2])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(n=11), "larger than the input"),
        (dict(n=4, start=8), "larger than the input"),
        (dict(n=0), "positive"),
        (dict(n=4, tol=0.0), "tol"),
    ],
)
def test_bad_input(gpt2, kwargs, message):
    with pytest.raises(ValueError, match=message):
        profile_model(gpt2, token_ids(10, seed=0), **kwargs)


def test_n_beyond_positions(gpt2):
    with pytest.raises(ValueError, match="64 positions"):
        profile_model(gpt2, token_ids(80, seed=0), n=70)


def test_layers_that_are_not_consecutive_have_no_chain():
    cfg = tiny_config("gpt2", d=16, heads=2, layers=3, vocab=100, positions=16)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.GPT2Model(cfg).eval()
    prof = profile_model(model, token_ids(5, seed=0), n=5, layers=[2, 0], heads=False)
    assert prof.layers == (0, 2) and prof.chains == () and prof.dtype == "float64"
    assert not prof.settings["end_to_end"]
    # the input of layer 2 is block 1 applied to the input of layer 0 (the skipped block runs)
    xs, _, _ = block_io(model, token_ids(5, seed=0))
    assert prof.record(2, 5).radius == pytest.approx(
        float(xs[2].norm(dim=-1).max()), rel=F32_FORWARD
    )


_SMALL = {"hidden_size": 16, "num_attention_heads": 2, "num_hidden_layers": 1, "vocab_size": 64}


@pytest.mark.parametrize(
    ("config", "extra"),
    [
        # Llama's layout (its attention is read), but the block scales its residual branches
        ("GraniteConfig", {"intermediate_size": 32, "residual_multiplier": 0.5}),
        # OLMo: its attention is read (meanfield.models, Llama's layout), its block is not
        ("OlmoConfig", {"intermediate_size": 32}),
    ],
)
def test_blocks_of_other_families_are_refused_in_one_line(config, extra):
    cfg = getattr(transformers, config)(**_SMALL, **extra)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.AutoModel.from_config(cfg, attn_implementation="eager").eval()
    name = type(model).__name__
    with pytest.raises(NotImplementedError, match=f"block of {name} .* is not modelled") as err:
        profile_model(model, token_ids(5, seed=0), n=5, heads=False)
    assert "\n" not in str(err.value)
    assert isinstance(err.value, ValueError)  # a user's error for the command, not a bug


# ----------------------------------------------------------------------------------------------
# The command
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory, tokenizer):
    """A 2-layer Llama-style checkpoint directory with the MiniLM WordPiece tokenizer."""
    path = tmp_path_factory.mktemp("ckpt") / "tiny-llama"
    cfg = tiny_config(
        "llama",
        d=32,
        heads=4,
        kv_heads=2,
        intermediate=48,
        vocab=30522,
        positions=40,
        **LLAMA_TOKENS,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        model = transformers.LlamaModel(cfg).eval()  # bare: AutoModel loads it without a report
    return save_checkpoint(path, model, tokenizer)


def test_cli_json_smoke(tiny_checkpoint, tmp_path, capsys):
    from experiments.engine import load_json
    from meanfield.models import load_model

    text = tmp_path / "text.txt"
    text.write_text("In the beginning God created the heaven and the earth. " * 8)
    out = tmp_path / "out"
    argv = ["profile", str(tiny_checkpoint), "--text", str(text), "--n", "8", "4"]
    argv += ["--start", "1", "--out", str(out), "--json", "--no-progress"]
    rc, stdout, _ = cli(argv, capsys)
    assert rc == 0
    doc = json.loads(stdout)
    assert doc["kind"] == "profile" and doc["model"] == "tiny-llama" and doc["arch"] == "llama"
    assert doc["ns"] == [4, 8] and doc["layers"] == [0, 1] and doc["dtype"] == "float64"
    assert [Path(f).name for f in doc["files"]] == ["profile.json", "profile.pdf", "profile.png"]
    saved = load_json(out / "profile.json")
    assert saved["records"] == doc["records"] and "metadata" in saved
    # the same numbers as a direct library call on the same window
    lm = load_model(tiny_checkpoint)
    ids = torch.tensor(lm.tokenizer(text.read_text())["input_ids"])
    prof = profile_model(lm.model, ids, n=[4, 8], start=1)
    for r in doc["records"]:
        ref = prof.record(r["layer"], r["n"])
        assert r["block"]["value"] == pytest.approx(ref.block.value, rel=F64_ROUND_TRIP)
        assert r["attention"]["upper"] == pytest.approx(ref.attention.upper, rel=F64_ROUND_TRIP)
    assert all(c["holds"] for c in doc["chains"])
    # the human-readable printer
    rc, stdout, _ = cli([a for a in argv if a != "--json"] + ["--no-figure"], capsys)
    assert rc == 0 and "chain rule, layers 0-1" in stdout and "holds" in stdout


def test_figure_reads_at_print_size(tiny_checkpoint, tmp_path, capsys):
    import matplotlib.pyplot as plt

    from paper_figs import fig_profile

    from ..figures.test_figure_text import legend_problems, small_texts

    out = tmp_path / "out"
    argv = ["profile", str(tiny_checkpoint), "--text", "pydoc", "--n", "6", "12"]
    rc, _, _ = cli(argv + ["--out", str(out), "--no-figure", "--no-progress"], capsys)
    assert rc == 0
    captured = {}
    orig = fig_profile.save

    def keep(fig, stem, **kw):
        captured["fig"] = fig
        assert not small_texts(fig) and not legend_problems(fig)
        return orig(fig, stem, **kw)

    fig_profile.save = keep
    try:
        files = fig_profile.draw(out)
    finally:
        fig_profile.save = orig
    assert {p.suffix for p in files} == {".pdf", ".png"}
    plt.close("all")


@pytest.mark.parametrize(
    "args, message",
    [
        (["./no-such-dir"], "no such directory"),
        (["definitely-not-a-model"], "cannot load"),
        (["TINY", "--text", "SHORT", "--n", "30"], "larger than the input"),
        (["TINY", "--text", "pydoc", "--n", "50"], "exceeds the model's 40 positions"),
        (["TINY", "--text", "pydoc", "--n", "4", "--layers", "0-x"], "--layers"),
        (["TINY", "--text", "pydoc", "--n", "4", "--layers", "5"], "out of range"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(args, message, tiny_checkpoint, tmp_path, capsys):
    short = tmp_path / "short.txt"
    short.write_text("a few words only")
    args = [
        str(tiny_checkpoint) if a == "TINY" else str(short) if a == "SHORT" else a for a in args
    ]
    rc, stdout, stderr = cli(["profile", *args, "--out", str(tmp_path), "--no-progress"], capsys)
    assert rc == 2 and stdout == ""
    # transformers' own weight-loading bar may precede (pytest imported tqdm before main ran)
    lines = [x for x in stderr.strip().splitlines() if not x.startswith("Loading weights")]
    assert len(lines) == 1 and lines[0].startswith("meanfield: error:") and message in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["short.txt"]  # nothing written


# ----------------------------------------------------------------------------------------------
# Saving and loading a profile
# ----------------------------------------------------------------------------------------------


def _assert_same(a, b, where="profile"):
    """Same types all the way down (tuples stay tuples, ints ints) and floats bit for bit."""
    import dataclasses
    import struct

    assert type(a) is type(b), (where, a, b)
    if dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            _assert_same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, float):
        assert struct.pack("<d", a) == struct.pack("<d", b), (where, a, b)
    else:
        assert a == b, (where, a, b)


def _with_special_floats(prof: ModelProfile) -> ModelProfile:
    """The profile with an infinite, a NaN and a negative-zero float in its nested records."""
    import dataclasses

    rec = prof.records[0]
    block = dataclasses.replace(rec.block, upper=math.inf, upper_prob=math.nan, lower=-0.0)
    records = (dataclasses.replace(rec, block=block), *prof.records[1:])
    return dataclasses.replace(prof, records=records, seconds=-math.inf)


@pytest.fixture(scope="module")
def two_profiles(gpt2):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # module scope: set up before the one_torch_thread fixture
    try:
        full = profile_model(gpt2, token_ids(8, seed=0), n=[3, 5], krylov=4)  # heads and chain rule
        g = torch.Generator().manual_seed(3)
        hidden = torch.randn(4, gpt2.config.n_embd, generator=g, dtype=torch.float32)
        bare = profile_model(gpt2, hidden, n=4, layers=[1], heads=False, end_to_end=False)
    finally:
        torch.set_num_threads(threads)
    return full, bare


def test_profile_save_load_round_trip(two_profiles, tmp_path):
    full, bare = two_profiles
    assert full.chains and full.records[0].attention.head_values is not None
    assert not bare.chains and bare.records[0].attention.head_values is None
    assert bare.settings["start"] is None and bare.dtype == "float32"
    for i, prof in enumerate((full, bare, _with_special_floats(full))):
        path = prof.save(tmp_path / f"p{i}.json")
        back = ModelProfile.load(path)
        _assert_same(prof, back)
        json.loads(path.read_text(), parse_constant=pytest.fail)  # strict JSON (no NaN tokens)
        _assert_same(prof, ModelProfile.from_json(prof.to_json()))
        _assert_same(prof, ModelProfile.from_dict(prof.to_dict()))


def test_profile_load_reads_the_cli_record(two_profiles, tmp_path):
    from experiments.engine import write_json

    prof = _with_special_floats(two_profiles[0])
    # what `meanfield profile` writes: to_dict plus run metadata, non-finite floats as strings
    path = write_json(tmp_path / "profile.json", {**prof.to_dict(), "metadata": {"seed": 0}})
    back = ModelProfile.load(path)
    assert math.isnan(back.records[0].block.upper_prob)
    _assert_same(prof, back)


def test_profile_load_refuses_other_files_in_one_line(two_profiles, tmp_path):
    good = two_profiles[1].to_dict()
    bad_field = {**good, "records": [{**good["records"][0], "n": "four"}]}
    files = {
        "binary.bin": b"\x89PNG\r\n\x1a\n\x00\xff",
        "notjson.json": b"{not json",
        "list.json": b"[1, 2]",
        "other.json": json.dumps({"kind": "demo"}).encode(),
        "missing.json": json.dumps({"kind": "profile", "model": "m"}).encode(),
        "badfield.json": json.dumps(bad_field).encode(),
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError, match="is not a saved ModelProfile") as err:
            ModelProfile.load(tmp_path / name)
        assert "\n" not in str(err.value), name
    with pytest.raises(ValueError, match=r"profile\.records\[0\]\.n: expected int"):
        ModelProfile.load(tmp_path / "badfield.json")
    with pytest.raises(ValueError, match="missing field 'arch'"):
        ModelProfile.load(tmp_path / "missing.json")
