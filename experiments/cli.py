"""Deprecated: the command line moved to :mod:`experiments.app.main`.

``from experiments.cli import main`` keeps working for one release, with a DeprecationWarning.
This module is the one place below the application layer allowed to import it (a shim, listed
in tests/test_layering.py); nothing in the project imports it.
"""

from __future__ import annotations

import warnings

from .app.commands.experiment import parse_setting
from .app.main import build_parser, main
from .app.options import UsageError as CLIError

__all__ = ["CLIError", "build_parser", "main", "parse_setting"]

warnings.warn(
    "experiments.cli is deprecated; use experiments.app.main (the `meanfield` command)",
    DeprecationWarning,
    stacklevel=2,
)
