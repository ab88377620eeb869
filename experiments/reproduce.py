"""Deprecated: the ``reproduce`` pipeline moved to :mod:`experiments.app.pipeline`.

``from experiments.reproduce import reproduce`` keeps working for one release, with a
DeprecationWarning. This module is a shim listed in tests/test_layering.py; nothing in the
project imports it.
"""

from __future__ import annotations

import warnings

from .app.options import check_device
from .app.pipeline import BUDGET_CPU_SECONDS, PRESET_NAMES, render_report, reproduce
from .app.registry import STAGES

__all__ = [
    "BUDGET_CPU_SECONDS",
    "PRESET_NAMES",
    "STAGES",
    "check_device",
    "render_report",
    "reproduce",
]

warnings.warn(
    "experiments.reproduce is deprecated; use experiments.app.pipeline",
    DeprecationWarning,
    stacklevel=2,
)
