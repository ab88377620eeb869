"""Formatting of numbers in the Markdown sections that the stages write into ``report.md``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["number", "plain", "span"]


def number(x: Any, spec: str = ".3g") -> str:
    """``x`` formatted with ``spec``; an en dash for a missing (``None``) or non-finite float."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return format(x, spec)


def plain(x: float, spec: str = ".3g") -> str:
    """``x`` formatted with ``spec``, without the sign of a zero (``0.00``, never ``-0.00``)."""
    out = format(float(x), spec)
    return out[1:] if out.startswith("-") and float(out) == 0 else out


def span(values: Sequence[float], spec: str = ".2f") -> str:
    """``0.14`` for one distinct value, ``0.05–0.30`` for several (:func:`plain` each)."""
    lo, hi = plain(min(values), spec), plain(max(values), spec)
    return lo if lo == hi else f"{lo}–{hi}"
