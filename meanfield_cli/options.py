"""Options shared by the commands, written once, the one-line errors and the output checks.

A command adds only the options that do something for it: ``--json``, ``-v`` and ``--traceback``
everywhere, ``--seed`` where something is random, ``--no-progress`` where there are progress
bars, ``--device`` where the work can run on a GPU. A command that writes files checks its output
paths with :func:`check_out_dir` or :func:`check_out_file` before it computes anything.
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "CommandFailed",
    "UsageError",
    "add_command",
    "add_common",
    "add_device",
    "add_traceback",
    "check_device",
    "check_out_dir",
    "check_out_file",
    "plain_math",
    "plain_text",
    "print_written",
    "write_record",
]


class UsageError(ValueError):
    """An error in what the user asked for, reported as one line with exit status 2."""


class CommandFailed(RuntimeError):
    """The command ran, but what it checked or drew failed (one line, exit status 2, no trace).

    A failed figure, stage or bound check is a result, not a bug: the line says what failed and
    where the details are.
    """


def add_traceback(p: argparse.ArgumentParser) -> None:
    """Add ``--traceback``: show the full Python trace of an error instead of one line.

    It may be given before the command (``meanfield --traceback CMD``) or after it: the
    subcommands' copy has no default, so it never resets the global one.
    """
    if "--traceback" in p._option_string_actions:
        return
    p.add_argument(
        "--traceback",
        action="store_true",
        default=argparse.SUPPRESS,
        help="on an error, show the full Python traceback instead of one line (for debugging)",
    )


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
    add_traceback(p)


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


def _nearest_existing(path: Path) -> Path:
    """``path`` itself if it exists, else its closest existing ancestor."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(".")


def _check_can_write_in(anchor: Path, option: str, given: str) -> None:
    """UsageError unless a file can be created in the existing directory ``anchor``."""
    if not anchor.is_dir():
        raise UsageError(f"{option} {given}: {anchor} is not a directory")
    try:  # a real probe: os.access is wrong for root, read-only mounts and ACLs
        with tempfile.TemporaryFile(dir=anchor, prefix=".meanfield-probe-"):
            pass
    except OSError as err:
        raise UsageError(
            f"{option} {given}: cannot write in {anchor} ({err.strerror or err})"
        ) from None


def check_out_dir(
    path: str | os.PathLike, option: str = "--out", *, subdirs: tuple[str, ...] = ()
) -> Path:
    """Check, before any work, that ``path`` is or can become a writable directory.

    ``path`` must not be an existing file, and the directory itself (or, when it does not exist
    yet, its closest existing ancestor) must accept a new file. ``subdirs`` (e.g. ``results``)
    must not be existing files either. Nothing is created. Raises :class:`UsageError`, one line.
    """
    given = os.fspath(path)
    p = Path(given).expanduser()
    if p.exists() and not p.is_dir():
        raise UsageError(f"{option} {given}: exists and is not a directory")
    for sub in subdirs:
        q = p / sub
        if q.exists() and not q.is_dir():
            raise UsageError(f"{option} {given}: {q} exists and is not a directory")
    _check_can_write_in(_nearest_existing(p), option, given)
    return p


def check_out_file(path: str | os.PathLike, option: str = "--out") -> Path:
    """Check, before any work, that the file ``path`` can be written (created or replaced).

    ``path`` must not be a directory, and its directory (or that directory's closest existing
    ancestor) must accept a new file (results are written to a temporary sibling and renamed).
    Nothing is created. Raises :class:`UsageError`, one line.
    """
    given = os.fspath(path)
    p = Path(given).expanduser()
    if p.is_dir():
        raise UsageError(
            f"{option} {given}: is a directory; give a file name, e.g. {p / 'result.json'}"
        )
    if not p.name:
        raise UsageError(f"{option} {given!r}: give a file name")
    _check_can_write_in(_nearest_existing(p.parent), option, given)
    return p


def plain_text(text: str) -> str:
    """``text`` without reST roles and literals, for help texts written from docstrings.

    ``:mod:`theory.bounds``` becomes ``theory.bounds``.
    """
    return re.sub(r":[a-z]+:`~?([^`]*)`", r"\1", text).replace("``", "")


#: LaTeX commands and what a terminal shows for them (see :func:`plain_math`).
_LATEX_SYMBOLS = {
    "gamma": "γ",
    "lambda": "λ",
    "varepsilon": "ε",
    "epsilon": "ε",
    "mu": "μ",
    "nu": "ν",
    "sigma": "σ",
    "delta": "δ",
    "alpha": "α",
    "beta": "β",
    "theta": "θ",
    "infty": "∞",
    "le": "≤",
    "leq": "≤",
    "ge": "≥",
    "geq": "≥",
    "cdot": "·",
    "times": "×",
    "sqrt": "√",
    "in": "∈",
    "to": "→",
    # a font command without braces (``\\mathcal P``) keeps only its argument
    "mathcal": "",
    "mathrm": "",
    "mathbb": "",
}


def plain_math(text: str) -> str:
    r"""``text`` (a docstring line) as a terminal shows it: reST roles and LaTeX removed.

    ``:math:`\mathrm{Lip}(f\,|\,B_R^n)``` becomes ``Lip(f | B_R^n)``, ``\|V\|_2`` becomes
    ``||V||_2``, ``e^{\gamma/2}`` becomes ``e^(γ/2)``.
    """
    text = plain_text(text)
    text = re.sub(r"\\(?:math(?:rm|it|bf|cal|bb)|operatorname|text)\{([^{}]*)\}", r"\1", text)
    text = text.replace("\\|", "||").replace("\\,", " ").replace("\\;", " ").replace("\\!", "")
    text = re.sub(r"\\([A-Za-z]+)", lambda m: _LATEX_SYMBOLS.get(m.group(1), m.group(1)), text)
    # exponents and subscripts of more than one character keep their grouping as parentheses
    text = re.sub(r"([\^_])\{([^{}]*)\}", lambda m: m.group(1) + _group(m.group(2)), text)
    text = text.replace("{", "").replace("}", "")
    return re.sub(r" {2,}", " ", text)


def _group(inner: str) -> str:
    return inner if len(inner) == 1 or inner.isalnum() else f"({inner})"


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


def write_record(path: str | os.PathLike, doc: Mapping[str, Any], args: argparse.Namespace) -> Path:
    """Write ``doc`` to the JSON file ``path`` with the run metadata (the options in ``args``).

    The metadata's device and dtype are ``--device`` and ``--dtype``, else ``cpu`` and
    ``float64`` (a command without them computes in float64 on the CPU).
    """
    from experiments.engine import run_metadata, write_json

    config = {k: v for k, v in vars(args).items() if k not in ("handler", "printer")}
    device, dtype = getattr(args, "device", "cpu"), getattr(args, "dtype", "float64")
    meta = run_metadata(seed=args.seed, device=device, dtype=dtype, config=config)
    return write_json(path, {**doc, "metadata": meta})
