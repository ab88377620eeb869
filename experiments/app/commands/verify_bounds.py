"""``meanfield verify-bounds``: check every closed-form bound against certified local constants.

The command's parser and handler live with the check itself (:mod:`experiments.verify_bounds`,
``add_parser``); this module only registers them.
"""

from __future__ import annotations

import argparse

from ..options import plain_text

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``verify-bounds``."""
    from experiments import verify_bounds

    p = verify_bounds.add_parser(sub)
    # its description is a docstring paragraph: show it without the reST markup
    p.description = plain_text(p.description or "")
