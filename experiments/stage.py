"""The contract every experiment stage follows, and typed presets.

A *stage* is one experiment of ``meanfield reproduce`` (real data, adversarial inputs, the
synthetic sweeps, mass splitting, the bound checks). Each stage module defines

- a frozen dataclass of its settings (a subclass of :class:`StageConfig`), with one instance per
  preset in ``PRESETS`` (``"tiny"``, ``"quick"``, ``"paper"``);
- ``run(results_dir, preset, *, device, progress, **settings) -> list[Path]``, resumable;
- ``summary(results_dir) -> dict`` and ``report_section(results_dir, figures_dir) -> str``;
- ``STAGE``, a :class:`ModuleStage` that bundles the above and satisfies :class:`Stage`.

The application layer (``experiments.app``) holds the list of stages by direct reference, so a
type checker sees the whole contract. Settings given on the command line (``meanfield experiment
STAGE --set KEY=VALUE``) are checked against the dataclass fields by :meth:`StageConfig.check`.
docs/architecture.md ("Adding a stage") walks through a new stage.
"""

from __future__ import annotations

import collections.abc as cabc
import copy
import dataclasses
import numbers
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

__all__ = ["ModuleStage", "Names", "Stage", "StageConfig", "check_setting"]

#: A setting that takes one name or a list of names.
Names = tuple[str, ...] | str


def _plain(value: Any) -> Any:
    """Tuples to lists and mappings to dicts, recursively (the JSON shape of a setting)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return copy.deepcopy(value)


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    if isinstance(tp, type):
        return {
            "int": "an integer",
            "float": "a number",
            "str": "a string",
            "bool": "true/false",
        }.get(tp.__name__, tp.__name__)
    return str(tp).replace("typing.", "").replace("collections.abc.", "")


def _is_sequence(value: Any) -> bool:
    """Lists, tuples, ranges and 1-d arrays stand for a tuple setting (not strings)."""
    if isinstance(value, np.ndarray):
        return value.ndim == 1
    return isinstance(value, (list, tuple, range))


def _matches(value: Any, tp: Any) -> bool:
    """Whether a JSON-like ``value`` fits the annotation ``tp`` (lists stand for tuples)."""
    if tp is Any:
        return True
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in args)
    if tp is type(None) or tp is None:
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))
    if tp is float:
        return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
    if tp is str:
        return isinstance(value, str)
    if origin in (tuple, list, typing.Sequence, cabc.Sequence):
        if not _is_sequence(value):
            return False
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            return all(_matches(v, args[0]) for v in value)
        if origin is tuple and args:
            return len(value) == len(args) and all(_matches(v, a) for v, a in zip(value, args))
        return all(_matches(v, args[0]) for v in value) if args else True
    if origin in (dict, typing.Mapping, cabc.Mapping):
        if not isinstance(value, Mapping):
            return False
        if len(args) == 2:
            return all(_matches(k, args[0]) and _matches(v, args[1]) for k, v in value.items())
        return True
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True


def check_setting(stage: str, field: str, value: Any, tp: Any) -> None:
    """Raise a one-line ValueError naming ``stage`` and ``field`` unless ``value`` fits ``tp``."""
    if not _matches(value, tp):
        raise ValueError(
            f"{stage}: setting {field} must be {_type_name(tp)}, got {value!r} "
            f"({type(value).__name__})"
        )


@dataclass(frozen=True)
class StageConfig:
    """Base of the per-stage settings dataclasses (frozen; one instance per preset).

    Subclasses name their stage in ``stage`` (a class variable) and declare every setting as a
    typed field. Sequences are tuples and tables are mappings, so a preset cannot be changed by
    accident; :meth:`options` returns the plain JSON shape (lists and dicts) that the stage's
    code and its result metadata use.
    """

    stage: ClassVar[str] = "stage"

    @classmethod
    def field_types(cls) -> dict[str, Any]:
        """Setting name to its annotation."""
        hints = typing.get_type_hints(cls)
        return {f.name: hints[f.name] for f in dataclasses.fields(cls)}

    def options(self) -> dict[str, Any]:
        """The settings as a plain dictionary (lists, dicts; a deep copy)."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def check(cls, settings: Mapping[str, Any]) -> None:
        """Raise a one-line ValueError for an unknown setting or a value of the wrong type."""
        types_ = cls.field_types()
        unknown = sorted(set(settings) - set(types_))
        if unknown:
            raise ValueError(
                f"unknown {cls.stage} option(s) {', '.join(unknown)}; known: {', '.join(types_)}"
            )
        for key, value in settings.items():
            check_setting(cls.stage, key, value, types_[key])

    def replace(self, **settings: Any) -> StageConfig:
        """A copy with ``settings`` replaced (checked by :meth:`check`; lists become tuples)."""
        self.check(settings)
        frozen = {k: tuple(v) if isinstance(v, list) else v for k, v in settings.items()}
        return dataclasses.replace(self, **frozen)


@runtime_checkable
class Stage(Protocol):
    """What the ``reproduce`` pipeline and ``meanfield experiment`` need from a stage."""

    name: str
    title: str
    uses_device: bool
    presets: Mapping[str, StageConfig]

    def run(
        self,
        results_dir: Path,
        preset: str,
        *,
        device: str = "cpu",
        progress: bool = True,
        **settings: Any,
    ) -> list[Path]:
        """Run (or resume) the stage into ``results_dir / name``; return the files written."""
        ...

    def summary(self, results_dir: Path) -> dict[str, Any]:
        """A JSON-able summary of the saved results."""
        ...

    def report_section(self, results_dir: Path, figures_dir: Path) -> str:
        """The stage's Markdown section of ``report.md``."""
        ...


@dataclass(frozen=True)
class ModuleStage:
    """A :class:`Stage` made of a module's functions (the form every stage module uses)."""

    name: str
    title: str
    presets: Mapping[str, Any]
    run_fn: Callable[..., list[Path]]
    summary_fn: Callable[[Path], dict[str, Any]]
    report_fn: Callable[[Path, Path], str]
    uses_device: bool = True

    def run(
        self,
        results_dir: Path,
        preset: str,
        *,
        device: str = "cpu",
        progress: bool = True,
        **settings: Any,
    ) -> list[Path]:
        """Call the module's ``run``.

        The device is forced to the CPU when the stage has no use for another.
        """
        return list(
            self.run_fn(
                results_dir,
                preset,
                device=device if self.uses_device else "cpu",
                progress=progress,
                **settings,
            )
        )

    def summary(self, results_dir: Path) -> dict[str, Any]:
        """The module's ``summary``."""
        return self.summary_fn(results_dir)

    def report_section(self, results_dir: Path, figures_dir: Path) -> str:
        """The module's ``report_section``."""
        return self.report_fn(results_dir, figures_dir)
