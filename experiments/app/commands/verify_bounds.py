"""``meanfield verify-bounds``: check every closed-form bound against certified local constants.

The command's parser and handler live with the check itself (:mod:`experiments.verify_bounds`,
``add_parser``); this module registers them, checks ``--out`` before the run, and reports a
theorem violation as a failed check (one line, exit status 2) rather than as a bug.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..options import CommandFailed, check_out_file, plain_text

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``verify-bounds``."""
    from experiments import verify_bounds

    p = verify_bounds.add_parser(sub)
    # its description is a docstring paragraph: show it without the reST markup
    p.description = plain_text(p.description or "")
    run = p.get_default("handler")

    def handle(args: argparse.Namespace) -> dict[str, Any]:
        if args.out:
            check_out_file(args.out)
        try:
            return run(args)
        except RuntimeError as err:  # the harness's verdict: a theorem violation
            if "violation" not in str(err):
                raise
            raise CommandFailed(str(err)) from err

    p.set_defaults(handler=handle)
