"""Resumable sweeps: stable point keys, skip finished points, one fsynced line per record.

A sweep appends each finished point as one JSON line to ``<out>/<name>.jsonl``. A point's key is
a hash of the sweep's configuration and the point's parameters, so rerunning the same sweep skips
every finished point, and changing the configuration starts a fresh set of keys. A run killed at
any moment loses at most the point in flight: a torn last line is cut off when the sweep is
reopened.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from .results import _jsonable, append_jsonl, load_json, load_jsonl, run_metadata, write_json

__all__ = ["Sweep", "config_hash", "point_key", "preset_config"]

log = logging.getLogger(__name__)


def _canonical(obj: Any) -> str:
    return json.dumps(_jsonable(obj), sort_keys=True, separators=(",", ":"))


def config_hash(config: Mapping[str, Any]) -> str:
    """Short stable hash of a configuration (canonical JSON, SHA-256)."""
    return hashlib.sha256(_canonical(config).encode()).hexdigest()[:16]


def point_key(config_digest: str, point: Mapping[str, Any]) -> str:
    """Stable key of one sweep point under a configuration."""
    return hashlib.sha256((config_digest + _canonical(point)).encode()).hexdigest()[:20]


def preset_config(
    presets: Mapping[str, Any],
    preset: str,
    overrides: Mapping[str, Any],
    *,
    what: str = "override(s)",
) -> dict[str, Any]:
    """A deep copy of ``presets[preset]``, after checking the preset name and the override keys.

    Every experiment stage resolves its settings this way; the caller then applies the overrides
    (plain replacement or its own merge) and its own validation. A preset is either a
    :class:`~experiments.stage.StageConfig` instance (its fields are the known keys, and each
    override is also checked against the field's type) or a plain mapping.

    Raises
    ------
    ValueError
        ``unknown preset ...``, ``unknown <what> ...`` with the known names, or a setting of the
        wrong type (naming the stage and the field).
    """
    from .stage import StageConfig

    if preset not in presets:
        raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(presets)}")
    entry = presets[preset]
    if isinstance(entry, StageConfig):
        cfg = entry.options()
    else:
        cfg = copy.deepcopy(dict(entry))
    unknown = sorted(set(overrides) - set(cfg))
    if unknown:
        raise ValueError(f"unknown {what} {', '.join(unknown)}; known: {', '.join(cfg)}")
    if isinstance(entry, StageConfig):
        entry.check(overrides)
    return cfg


def _repair_torn_tail(path: Path) -> None:
    """Cut a partial last line left by a crash, so later appends start on a fresh line."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as fh:
        fh.seek(-1, os.SEEK_END)
        if fh.read(1) == b"\n":
            return
        fh.seek(0)
        cut = fh.read().rfind(b"\n") + 1
        fh.truncate(cut)
    log.warning("removed an unfinished record at the end of %s", path)


class Sweep:
    """A resumable sweep writing one record per point.

    Parameters
    ----------
    out_dir : path
        Directory for ``<name>.jsonl`` (records) and ``<name>.meta.json`` (metadata of the latest
        configuration run; records of earlier configurations stay in the JSONL file, each
        tagged with its ``config_hash``).
    name : str
        Sweep name (file stem).
    config : mapping
        The resolved configuration; it is hashed into every point key and written to the metadata.
    seed, device, dtype : optional
        Recorded in the metadata.
    """

    def __init__(
        self,
        out_dir: str | os.PathLike,
        name: str,
        config: Mapping[str, Any],
        *,
        seed: int | None = None,
        device: str | None = None,
        dtype: str | None = None,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.name = name
        self.config = dict(config)
        self.digest = config_hash(self.config)
        self.path = self.out_dir / f"{name}.jsonl"
        self.meta_path = self.out_dir / f"{name}.meta.json"
        self.out_dir.mkdir(parents=True, exist_ok=True)
        _repair_torn_tail(self.path)
        if self._stored_digest() != self.digest:  # new file, or a run with another configuration
            write_json(
                self.meta_path,
                {
                    "name": name,
                    "config_hash": self.digest,
                    **run_metadata(seed=seed, device=device, dtype=dtype, config=self.config),
                },
            )

    def _stored_digest(self) -> str | None:
        try:
            return load_json(self.meta_path).get("config_hash")
        except (OSError, ValueError):
            return None

    def records(self) -> list[dict[str, Any]]:
        """Finished records of this configuration."""
        return [r for r in load_jsonl(self.path) if r.get("config_hash") == self.digest]

    def done(self) -> set[str]:
        """Keys of finished points."""
        return {r["key"] for r in self.records()}

    def run(
        self,
        points: Iterable[Mapping[str, Any]],
        compute: Callable[[Mapping[str, Any]], Mapping[str, Any]],
        *,
        progress: bool = True,
        desc: str | None = None,
    ) -> list[dict[str, Any]]:
        """Compute every unfinished point and append its record; return all records in order.

        ``compute(point)`` returns the measured values of one point; the record stored is
        ``{"key", "config_hash", "point", "seconds", **values}``.
        """
        from tqdm.auto import tqdm

        points = [dict(p) for p in points]
        done = self.done()
        todo = [p for p in points if point_key(self.digest, p) not in done]
        if len(todo) < len(points):
            log.info(
                "%s: %d of %d points already done", self.name, len(points) - len(todo), len(points)
            )
        bar = tqdm(todo, desc=desc or self.name, disable=None if progress else True, leave=False)
        t_start = time.perf_counter()
        for p in bar:
            t0 = time.perf_counter()
            values = dict(compute(p))
            record = {
                "key": point_key(self.digest, p),
                "config_hash": self.digest,
                "point": p,
                "seconds": time.perf_counter() - t0,
                **values,
            }
            append_jsonl(self.path, record)
            # one line per point for logs (the bar is off when stderr is not a terminal)
            log.debug("%s: %s done in %.1f s", self.name, p, record["seconds"])
        if todo:
            log.info(
                "%s: %d point(s) computed in %.1f s",
                self.name,
                len(todo),
                time.perf_counter() - t_start,
            )
        by_key = {r["key"]: r for r in self.records()}
        return [by_key[point_key(self.digest, p)] for p in points]
