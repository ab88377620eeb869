"""Stable keys: the hash of a sweep's configuration and the key of one point under it.

A record's ``config_hash`` is :func:`config_hash` of the sweep's configuration and its ``key``
is :func:`point_key` of that hash and the point, both over canonical JSON (sorted keys, the
values of :func:`~experiments.engine.jsonable`), so the same configuration and point
give the same key in every process and every run.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from ._results import jsonable

__all__ = ["config_hash", "point_key"]


def _canonical(obj: Any) -> str:
    return json.dumps(jsonable(obj), sort_keys=True, separators=(",", ":"))


def config_hash(config: Mapping[str, Any]) -> str:
    """Short stable hash of a configuration (canonical JSON, SHA-256)."""
    return hashlib.sha256(_canonical(config).encode()).hexdigest()[:16]


def point_key(config_digest: str, point: Mapping[str, Any]) -> str:
    """Stable key of one sweep point under a configuration."""
    return hashlib.sha256((config_digest + _canonical(point)).encode()).hexdigest()[:20]
