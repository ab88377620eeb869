"""The ``meanfield`` command line.

Each command (one module in :mod:`experiments.app.commands`) returns a JSON-serialisable dict.
``--json`` prints it as one object on stdout; otherwise a short human-readable summary goes to
stdout. Logs and progress go to stderr. An error in what the user asked for (a
:class:`~experiments.app.options.UsageError`, a ``ValueError`` from input validation, a missing
file, a missing optional package) exits with status 2 and one line, ``meanfield: error: ...``;
anything else is a bug and shows its traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence

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

__all__ = ["COMMANDS", "build_parser", "main"]

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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every command."""
    parser = argparse.ArgumentParser(
        prog="meanfield",
        description="Smoothness of self-attention on sequences and measures (Castin, Ablin, "
        "Peyré 2024).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    return parser


def _is_user_error(err: BaseException) -> bool:
    """Whether ``err`` is about the user's input or environment rather than a bug."""
    from experiments.lock import LockHeldError

    if isinstance(err, (ValueError, FileNotFoundError, KeyboardInterrupt, LockHeldError)):
        return True  # LockHeldError: another run writes into the same --out
    # a missing optional package: the library says which extra to install
    return isinstance(err, ImportError) and "pip install" in str(err)


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
        if not _is_user_error(err):
            raise
        msg = " ".join(str(err).split()) or type(err).__name__
        print(f"meanfield: error: {msg}", file=sys.stderr)
        return 2
    try:
        if args.json:
            from experiments.results import _jsonable

            json.dump(_jsonable(result), sys.stdout)
            sys.stdout.write("\n")
        else:
            args.printer(result)
        sys.stdout.flush()
    except BrokenPipeError:  # e.g. piped into `head`
        # keep Python from complaining again when it flushes stdout at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
