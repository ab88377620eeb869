"""Vision encoders (ViT, DeiT) in `meanfield lipschitz --model` and `meanfield profile`.

Tiny random checkpoints built from transformers' config classes (no download). Oracles: the
model's own forward pass (``output_hidden_states=True`` and its modules), the dense Jacobian of
the model's own attention module in float64 by reverse-mode autograd and its SVD, and a naive
numpy normalisation of raw pixels.
"""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch

from meanfield.models import image_hidden_states, load_model, pixel_values, reads_images
from meanfield.profile import model_blocks
from tests.profile_cli import cli

from ..tolerances import (
    F32_FORWARD,
    F32_ROUNDING,
    F64_DENSE_ASSEMBLY,
    F64_LANCZOS,
    F64_REDUCTION,
    F64_ROUND_TRIP,
    F64_VS_HF_LAYER,
)

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: 32 x 32 images in 8 x 8 patches: 16 patches; ViT adds CLS (n = 17), DeiT also its
#: distillation token (n = 18).
CONFIG = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    image_size=32,
    patch_size=8,
    initializer_range=0.3,  # weights large enough for a softmax far from uniform
)
N_TOKENS = {"vit": 17, "deit": 18}


def _save(kind: str, path) -> None:
    cfg_cls, model_cls = {
        "vit": (transformers.ViTConfig, transformers.ViTModel),
        "deit": (transformers.DeiTConfig, transformers.DeiTModel),
    }[kind]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        model = model_cls(cfg_cls(**CONFIG)).eval()
        g = torch.Generator().manual_seed(4)
        with torch.no_grad():  # DeiT initialises its distillation token and positions at 0
            for name, p in model.named_parameters():
                if "token" in name or "position" in name or p.ndim == 1:
                    p.add_(0.2 * torch.randn(p.shape, generator=g))
    model.save_pretrained(path, safe_serialization=True)


@pytest.fixture(scope="module", params=["vit", "deit"])
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param) / request.param
    _save(request.param, path)
    return request.param, path


def _images(n: int = 3, seed: int = 0) -> np.ndarray:
    """Float pixel values, channels first (N, 3, 32, 32)."""
    return np.random.default_rng(seed).standard_normal((n, 3, 32, 32)).astype(np.float32)


def _attention_module(model, layer):
    return model.base_model.layers[layer].attention


def _dense_attention_norm(path, layer: int, X: torch.Tensor) -> float:
    """||D attention(X)||_2 of the model's own attention module in float64 (SDPA: no float32 cast)."""
    model = copy.deepcopy(load_model(path).model).double()
    model.set_attn_implementation("sdpa")
    att = _attention_module(model, layer)

    def f(x):
        return att(x[None])[0][0]

    J = torch.autograd.functional.jacobian(f, X.to(torch.float64)).reshape(X.numel(), X.numel())
    return float(torch.linalg.svdvals(J)[0])


# ----------------------------------------------------------------------------------------------
# The capture
# ----------------------------------------------------------------------------------------------


def test_capture_equals_the_models_own_hidden_states(checkpoint):
    kind, path = checkpoint
    model = load_model(path).model
    assert reads_images(model) and not reads_images(load_model("gpt2-random").model)
    px = torch.as_tensor(_images(2))
    with torch.no_grad():
        out = model(pixel_values=px, output_hidden_states=True)
    for layer in (0, 1):
        blk = image_hidden_states(model, layer, px.numpy(), n_images=2, block=True, dtype=None)
        assert blk.n == N_TOKENS[kind] and blk.X.shape == (2, N_TOKENS[kind], 32)
        assert blk.n_prefix == N_TOKENS[kind] - 16
        torch.testing.assert_close(blk.X, out.hidden_states[layer])
        att = image_hidden_states(model, layer, px.numpy(), n_images=2)
        assert att.X.dtype == torch.float64 and att.capture_point.endswith(".attention")
        with torch.no_grad():
            ref = model.base_model.layers[layer].layernorm_before(out.hidden_states[layer])
        torch.testing.assert_close(att.X, ref.to(torch.float64))
    # channels last is the same images; one image (C, H, W) is a batch of one
    last = image_hidden_states(model, 1, px.numpy().transpose(0, 2, 3, 1), n_images=2)
    torch.testing.assert_close(last.X, att.X, rtol=0, atol=0)
    one = image_hidden_states(model, 1, px[1].numpy())
    torch.testing.assert_close(one.X[0], att.X[1])


def test_synthetic_images_are_seeded_gaussian_pixels(checkpoint):
    _, path = checkpoint
    model = load_model(path).model
    a = image_hidden_states(model, 1, seed=5, n_images=2)
    b = image_hidden_states(model, 1, seed=5, n_images=2)
    c = image_hidden_states(model, 1, seed=6, n_images=2)
    assert a.images == "synthetic images, seed 5" and a.indices == (0, 1)
    assert torch.equal(a.X, b.X) and not torch.allclose(a.X, c.X)
    gen = torch.Generator().manual_seed(5)
    px = torch.randn(2, 3, 32, 32, generator=gen)
    torch.testing.assert_close(image_hidden_states(model, 1, px.numpy(), n_images=2).X, a.X)


def test_uint8_pixels_are_normalised_with_the_given_mean_and_std(checkpoint):
    _, path = checkpoint
    model = load_model(path).model
    raw = np.random.default_rng(1).integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)
    mean, std = [0.4, 0.5, 0.6], [0.2, 0.25, 0.3]
    got = pixel_values(raw, model, image_mean=mean, image_std=std)
    naive = np.empty((2, 3, 32, 32))
    for c in range(3):
        naive[:, c] = (raw[..., c] / 255.0 - mean[c]) / std[c]
    np.testing.assert_allclose(got.numpy(), naive, rtol=F32_ROUNDING, atol=F32_ROUNDING)
    with pytest.raises(ValueError, match="uint8 images are raw pixels"):
        pixel_values(raw, model)


@pytest.mark.parametrize(
    "shape",
    [(3, 16, 16), (2, 4, 32, 32), (32, 32), (2, 32, 32, 1), (1, 1, 3, 32, 32)],
)
def test_bad_image_shapes_name_the_expected_shape(checkpoint, shape):
    _, path = checkpoint
    model = load_model(path).model
    with pytest.raises(ValueError, match=r"expected shape \(N, 3, 32, 32\), \(N, 32, 32, 3\)"):
        pixel_values(np.zeros(shape, dtype=np.float32), model)


# ----------------------------------------------------------------------------------------------
# meanfield lipschitz --model
# ----------------------------------------------------------------------------------------------


def test_lipschitz_on_synthetic_images_brackets_the_dense_norm(checkpoint, capsys):
    kind, path = checkpoint
    rc, out, err = cli(["lipschitz", "--model", path, "--layer", 1, "--seed", 2, "--json"], capsys)
    assert rc == 0, err
    doc = json.loads(out)
    src = doc["source"]
    assert src["images"] == "synthetic images, seed 2" and src["image_indices"] == [0]
    assert doc["n"] == N_TOKENS[kind] and doc["d"] == 32 and doc["masked"] is False
    (row,) = doc["inputs"]
    X = image_hidden_states(load_model(path).model, 1, seed=2).X[0]
    assert row["max_radius"] == pytest.approx(float(X.norm(dim=-1).max()), rel=F64_ROUND_TRIP)
    exact = _dense_attention_norm(path, 1, X)
    assert math.isfinite(row["lower"]) and math.isfinite(row["upper_prob"])
    assert row["lower"] <= exact * (1 + F64_DENSE_ASSEMBLY) and exact <= row["upper"] * (
        1 + F64_DENSE_ASSEMBLY
    )
    assert row["value"] == pytest.approx(exact, rel=F64_LANCZOS)
    # the text output names the images and n
    rc, out, _ = cli(["lipschitz", "--model", path, "--layer", 1, "--seed", 2], capsys)
    assert rc == 0
    assert "synthetic images, seed 2 (image 0)" in out and f"n = {N_TOKENS[kind]}" in out


def test_lipschitz_on_a_npy_file(checkpoint, tmp_path, capsys):
    kind, path = checkpoint
    imgs = _images(3, seed=7)
    first, last = tmp_path / "first.npy", tmp_path / "last.npy"
    np.save(first, imgs)
    np.save(last, imgs.transpose(0, 2, 3, 1))
    argv = ["lipschitz", "--model", path, "--layer", 1, "--image-index", 1, "--windows", 2]
    rc, out, err = cli([*argv, "--images", first, "--json"], capsys)
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["source"]["images"] == "first.npy" and doc["source"]["image_indices"] == [1, 2]
    assert doc["n"] == N_TOKENS[kind] and len(doc["inputs"]) == 2
    model = load_model(path).model
    for row, i in zip(doc["inputs"], (1, 2), strict=True):
        X = image_hidden_states(model, 1, imgs[i]).X[0]
        exact = _dense_attention_norm(path, 1, X)
        assert (
            row["lower"]
            <= exact * (1 + F64_DENSE_ASSEMBLY)
            <= row["upper"] * (1 + 2 * F64_DENSE_ASSEMBLY)
        )
    rc, out, _ = cli([*argv, "--images", last, "--json"], capsys)
    assert rc == 0
    assert [r["value"] for r in json.loads(out)["inputs"]] == [r["value"] for r in doc["inputs"]]


def test_lipschitz_reads_uint8_with_the_checkpoints_processor(checkpoint, tmp_path, capsys):
    kind, path = checkpoint
    raw = np.random.default_rng(2).integers(0, 256, (1, 3, 32, 32), dtype=np.uint8)
    np.save(tmp_path / "raw.npy", raw)
    argv = ["lipschitz", "--model", path, "--layer", 1, "--images", tmp_path / "raw.npy"]
    rc, _, err = cli([*argv, "--json"], capsys)
    assert rc == 2 and "uint8 images are raw pixels" in err and err.count("\n") == 1
    mean, std = [0.5, 0.4, 0.3], [0.2, 0.3, 0.25]
    ckpt = tmp_path / "with-processor"
    _save(kind, ckpt)
    (ckpt / "preprocessor_config.json").write_text(
        json.dumps({"image_mean": mean, "image_std": std})
    )
    rc, out, err = cli(["lipschitz", "--model", ckpt, "--layer", 1, "--json",
                        "--images", tmp_path / "raw.npy"], capsys)  # fmt: skip
    assert rc == 0, err
    norm = (raw / 255.0 - np.array(mean)[:, None, None]) / np.array(std)[:, None, None]
    np.save(tmp_path / "norm.npy", norm.astype(np.float32))
    rc, out2, _ = cli(["lipschitz", "--model", ckpt, "--layer", 1, "--json",
                       "--images", tmp_path / "norm.npy"], capsys)  # fmt: skip
    assert rc == 0
    a, b = json.loads(out)["inputs"][0], json.loads(out2)["inputs"][0]
    assert a["value"] == pytest.approx(b["value"], rel=F32_FORWARD)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--n", "8"], "--n: .* is a vision encoder and reads images, not text"),
        (["--corpus", "kjv"], "--corpus: .* is a vision encoder"),
        (["--start", "0"], "--start: .* is a vision encoder"),
        (["--image-index", "1"], "--image-index applies to --images"),
        (["--images", "BAD"], r"expected shape \(N, 3, 32, 32\), \(N, 32, 32, 3\), "),
        (["--images", "BAD", "--image-index", "5"], "--image-index 5: .* holds 2 image"),
        (["--images", "INT"], "expected float pixel values .* or uint8 raw pixels"),
    ],
)
def test_lipschitz_errors_are_one_line(checkpoint, tmp_path, capsys, extra, message):
    _, path = checkpoint
    if "BAD" in extra:
        bad = np.zeros((2, 3, 16, 16) if "--image-index" not in extra else (2, 3, 32, 32))
        np.save(tmp_path / "bad.npy", bad.astype(np.float32))
        extra = [str(tmp_path / "bad.npy") if a == "BAD" else a for a in extra]
    if "INT" in extra:
        np.save(tmp_path / "int.npy", np.zeros((1, 3, 32, 32), dtype=np.int32))
        extra = [str(tmp_path / "int.npy") if a == "INT" else a for a in extra]
    rc, _, err = cli(["lipschitz", "--model", path, "--layer", 1, *extra], capsys)
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("meanfield: error:")
    import re

    assert re.search(message, err), err


def test_image_options_are_refused_for_text_models(capsys, tmp_path):
    np.save(tmp_path / "x.npy", _images(1))
    rc, _, err = cli(["lipschitz", "--model", "gpt2-random", "--n", 4,
                      "--images", tmp_path / "x.npy"], capsys)  # fmt: skip
    assert rc == 2 and "gpt2-random reads token ids" in err and err.count("\n") == 1


# ----------------------------------------------------------------------------------------------
# meanfield profile
# ----------------------------------------------------------------------------------------------


def test_vit_blocks_reproduce_the_models_forward(checkpoint):
    _, path = checkpoint
    model = copy.deepcopy(load_model(path).model).double()
    model.set_attn_implementation("sdpa")  # eager attention takes its softmax in float32
    px = torch.as_tensor(_images(2), dtype=torch.float64)
    with torch.no_grad():
        hs = model(pixel_values=px, output_hidden_states=True).hidden_states
    blocks = model_blocks(model)
    assert [b.arch for b in blocks] == ["vit", "vit"] and not blocks[0].causal
    for b in blocks:
        torch.testing.assert_close(
            b(hs[b.layer]), hs[b.layer + 1], rtol=F64_VS_HF_LAYER, atol=F64_VS_HF_LAYER
        )
        Xa = b.attention_input(hs[b.layer])
        with torch.no_grad():
            ref = model.base_model.layers[b.layer].layernorm_before(hs[b.layer])
        torch.testing.assert_close(Xa, ref, rtol=F64_REDUCTION, atol=F64_REDUCTION)


def test_profile_runs_end_to_end(checkpoint, tmp_path, capsys):
    kind, path = checkpoint
    out = tmp_path / "out"
    argv = ["profile", path, "--out", out, "--no-progress", "--no-figure", "--json"]
    rc, stdout, err = cli(argv, capsys)
    assert rc == 0, err
    doc = json.loads(stdout)
    assert doc["arch"] == "vit" and doc["ns"] == [N_TOKENS[kind]] and doc["layers"] == [0, 1]
    assert doc["images"] == "synthetic images, seed 0" and doc["image_indices"] == [0]
    assert doc["n_prefix"] == N_TOKENS[kind] - 16 and doc["text"] is None
    assert all(c["holds"] for c in doc["chains"])
    # the attention brackets against the dense norm of the model's own attention at the
    # profile's inputs: layer 0's input captured, then carried by the float64 pure blocks
    model = load_model(path).model
    x = image_hidden_states(model, 0, block=True).X[0]
    for blk in model_blocks(model):
        with torch.no_grad():
            Xa = blk.attention_input(x)
            x = blk(x)
        exact = _dense_attention_norm(path, blk.layer, Xa)
        (rec,) = [r for r in doc["records"] if r["layer"] == blk.layer]
        att = rec["attention"]
        assert (
            att["lower"]
            <= exact * (1 + F64_DENSE_ASSEMBLY)
            <= att["upper"] * (1 + 2 * F64_DENSE_ASSEMBLY)
        )
    # a .npy image; the printer names it and n
    np.save(tmp_path / "im.npy", _images(2, seed=9))
    argv = ["profile", path, "--out", out, "--no-progress", "--no-figure", "--layers", "1",
            "--images", tmp_path / "im.npy", "--image-index", 1]  # fmt: skip
    rc, stdout, err = cli(argv, capsys)
    assert rc == 0, err
    assert f"im.npy (image 1; n = {N_TOKENS[kind] - 16} prefix token(s) + patches" in stdout
    # text options are one-line errors
    rc, _, err = cli(["profile", path, "--out", out, "--n", "8"], capsys)
    assert rc == 2 and "--n: " in err and "vision encoder" in err
