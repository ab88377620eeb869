"""Options shared by the commands, written once, and the one-line user error.

A command adds only the options that do something for it: ``--json`` and ``-v`` everywhere,
``--seed`` where something is random, ``--no-progress`` where there are progress bars,
``--device`` where the work can run on a GPU.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "UsageError",
    "add_command",
    "add_common",
    "add_device",
    "check_device",
    "plain_text",
    "print_written",
]


class UsageError(ValueError):
    """An error in what the user asked for, reported as one line with exit status 2."""


def add_common(
    p: argparse.ArgumentParser,
    *,
    seed: str | None = None,
    seed_default: int | None = 0,
    progress: bool = False,
) -> None:
    """Add ``--json`` and ``-v``; ``--seed`` and ``--no-progress`` on request.

    Parameters
    ----------
    p : argparse.ArgumentParser
    seed : str, optional
        Help text of ``--seed``; ``None``: the command takes no seed.
    seed_default : int or None, default 0
        Default of ``--seed``; ``None`` lets the command keep its own seeds.
    progress : bool
        Whether the command shows progress bars (adds ``--no-progress``).
    """
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    if seed is not None:
        p.add_argument("--seed", type=int, default=seed_default, help=seed)
    if progress:
        p.add_argument("--no-progress", action="store_true", help="disable progress bars")
    p.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log to stderr (-vv: also one line per finished point of a sweep)",
    )


def add_device(p: argparse.ArgumentParser) -> None:
    """Add ``--device`` (``cpu`` or ``cuda``)."""
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")


def check_device(device: str) -> None:
    """Raise UsageError unless ``device`` is ``"cpu"`` or an available ``"cuda[:k]"``."""
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise UsageError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"device {device!r} requested but no CUDA device is available")


def plain_text(text: str) -> str:
    """``text`` without reST roles and literals, for help texts written from docstrings.

    ``:mod:`theory.bounds``` becomes ``theory.bounds``.
    """
    return re.sub(r":[a-z]+:`~?([^`]*)`", r"\1", text).replace("``", "")


def add_command(
    sub: argparse._SubParsersAction, doc: str | None, **kwargs: Any
) -> argparse.ArgumentParser:
    """Add the command that a command module's docstring ``doc`` describes.

    The docstring's first line reads ``"``meanfield NAME [ARGS]``: what it does."``: ``NAME``
    is the command, the rest its one-line help; the paragraphs below are its description. So a
    command's help and its module's docstring are one text.
    """
    head, _, body = (doc or "").strip().partition("\n\n")
    m = re.fullmatch(r"``meanfield ([a-z-]+)[^`]*``: (.+?)\.?", " ".join(head.split()))
    if m is None:
        raise ValueError(f"a command docstring starts with '``meanfield NAME``: ...', got {head!r}")
    help_ = plain_text(m.group(2))
    description = plain_text(" ".join(body.split())) or help_[:1].upper() + help_[1:] + "."
    return sub.add_parser(m.group(1), help=help_, description=description, **kwargs)


def print_written(doc: Mapping[str, Any]) -> None:
    """The last lines of a command's text output: ``  wrote PATH`` for each file it wrote."""
    for f in doc.get("files", []):
        print(f"  wrote {f}")
