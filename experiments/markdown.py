"""Formatting of numbers in the Markdown sections that the stages write into ``report.md``."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["number"]


def number(x: Any, spec: str = ".3g") -> str:
    """``x`` formatted with ``spec``; an en dash for a missing (``None``) or non-finite float."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return format(x, spec)
