"""The ``meanfield`` command line.

Each command (one module in :mod:`meanfield_cli.commands`) returns a JSON-serialisable dict.
``--json`` prints it as one object on stdout; otherwise a short human-readable summary goes to
stdout. Logs and progress go to stderr.

Every error ends the command with one line on stderr, ``meanfield: error: ...``, and exit status
2: an error in what the user asked for (a :class:`~meanfield_cli.options.UsageError`, a
``ValueError`` from input validation, a missing file, an operating-system error such as a full
disk, a missing optional package, an output directory locked by another run) says what is wrong;
a failed check or figure (:class:`~meanfield_cli.options.CommandFailed`) says what failed;
anything else is a bug, and its line says so: ``internal error (TypeError: ...); rerun with
--traceback for the full trace``. ``--traceback`` (before or after the command) shows the full
trace instead. An interrupt (Ctrl-C) exits with status 130.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from .commands import (
    attack,
    bound,
    demo,
    derive,
    experiment,
    figures,
    invert,
    lipschitz,
    profile,
    reproduce,
    verify_bounds,
)
from .options import CommandFailed, add_traceback

__all__ = ["COMMANDS", "build_parser", "main", "version"]

#: The commands, in the order ``meanfield --help`` lists them.
COMMANDS = (
    demo,
    reproduce,
    experiment,
    figures,
    bound,
    derive,
    lipschitz,
    attack,
    verify_bounds,
    invert,
    profile,
)


def version() -> str:
    """The version of ``meanfield``, read from its source without importing torch."""
    import importlib.util

    spec = importlib.util.find_spec("meanfield")
    if spec is not None and spec.origin:
        m = re.search(r'^__version__ = "([^"]+)"', Path(spec.origin).read_text(), re.M)
        if m:
            return m.group(1)
    from importlib.metadata import version as dist_version

    return dist_version("meanfield")


def _subparsers(p: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every parser below ``p`` (commands and their subcommands)."""
    out = []
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                out += [child, *_subparsers(child)]
    return out


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every command."""
    parser = argparse.ArgumentParser(
        prog="meanfield",
        description="Smoothness of self-attention on sequences and measures (Castin, Ablin, "
        "Peyré 2024).",
    )
    parser.add_argument(
        "--version", action="version", version=f"meanfield {version()}", help="print the version"
    )
    parser.add_argument(
        "--traceback",
        action="store_true",
        help="on an error, show the full Python traceback instead of one line (for debugging)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    for child in _subparsers(parser):  # also after the command, where add_common did not add it
        add_traceback(child)
    return parser


def _is_user_error(err: BaseException) -> bool:
    """Whether ``err`` is about the user's input or environment rather than a bug."""
    from experiments.engine import LockHeldError

    if isinstance(err, (ValueError, OSError, KeyboardInterrupt, LockHeldError, CommandFailed)):
        # OSError: a missing file, a full disk, a permission; LockHeldError: another run writes
        # into the same --out; CommandFailed: a failed check or figure, named in the message
        return True
    # a missing optional package: the library says which extra to install
    return isinstance(err, ImportError) and "pip install" in str(err)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def error_line(err: BaseException) -> str:
    """The one line that reports ``err`` (without the ``meanfield: error:`` prefix)."""
    if _is_user_error(err):
        if isinstance(err, OSError) and err.strerror and err.filename is not None:
            return _one_line(f"{err.filename}: {err.strerror}")
        return _one_line(str(err)) or type(err).__name__
    what = type(err).__name__ + (f": {_one_line(str(err))}" if str(err).strip() else "")
    return f"internal error ({what}); rerun with --traceback for the full trace"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``meanfield`` console script."""
    # OpenMP threads that busy-wait make dense LAPACK calls 10-30x slower as soon as another
    # process competes for the cores (measured: a 1536 x 1536 float64 SVD, 33 s against 1.1 s on
    # 2 shared cores). Passive waiting costs nothing measurable here; set before torch loads.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "no_progress", False) and "tqdm" not in sys.modules:
        # Also silences third-party bars (e.g. GGUF de-quantization), which take no flag;
        # tqdm reads this variable when it is first imported, which happens in the handlers.
        os.environ.setdefault("TQDM_DISABLE", "1")
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if args.verbose >= 2:
        for name in ("experiments", "meanfield"):
            logging.getLogger(name).setLevel(logging.DEBUG)
    logging.getLogger("fontTools").setLevel(logging.ERROR)  # font subsetting chatter on PDF save
    try:
        result = args.handler(args)
    except KeyboardInterrupt:
        print("meanfield: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        if getattr(args, "traceback", False):
            raise
        print(f"meanfield: error: {error_line(err)}", file=sys.stderr)
        return 2
    try:
        if args.json:
            from experiments.engine import jsonable

            json.dump(jsonable(result), sys.stdout)
            sys.stdout.write("\n")
        else:
            args.printer(result)
        sys.stdout.flush()
    except BrokenPipeError:  # e.g. piped into `head`
        # keep Python from complaining again when it flushes stdout at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except Exception as err:  # a bug in a printer: the same one line as in a handler
        if getattr(args, "traceback", False):
            raise
        print(f"meanfield: error: {error_line(err)}", file=sys.stderr)
        return 2
    return 0
