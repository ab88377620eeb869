"""The contract every experiment stage follows, and typed presets.

A *stage* is one experiment of ``meanfield reproduce`` (real data, adversarial inputs, the
synthetic sweeps, mass splitting, the bound checks). Each stage module defines

- a frozen dataclass of its settings (a subclass of :class:`StageConfig`), with one instance per
  preset in ``PRESETS`` (``"tiny"``, ``"quick"``, ``"paper"``);
- ``resolve(preset, settings) -> dict``: the preset's settings with the given ones applied and
  checked (starting from :func:`preset_config`);
- ``execute(cfg, out, run) -> list[Path]``: the work, resumable, written under ``out``
  (``run`` is a :class:`StageRun`: preset, settings, device, progress);
- ``summary(results_dir) -> dict`` and ``report_section(results_dir, figures_dir) -> str``;
- ``STAGE = ModuleStage.from_module(__name__, title)``, which bundles the above, satisfies
  :class:`Stage` and gives the module its public ``run = STAGE.run``.

The command line (``meanfield_cli.registry``, the top layer) holds the list of stages by direct
reference, so a type checker sees the whole contract. Settings given on the command line (``meanfield experiment
STAGE --set KEY=VALUE``) are checked against the dataclass fields by :meth:`StageConfig.check`.
docs/architecture.md ("Adding a stage") walks through a new stage.
"""

from __future__ import annotations

import collections.abc as cabc
import copy
import dataclasses
import numbers
import sys
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "ModuleStage",
    "Names",
    "Stage",
    "StageConfig",
    "StageRun",
    "check_setting",
    "preset_config",
]

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
        results_dir: str | Path,
        preset: str = "quick",
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
class StageRun:
    """How one call of a stage runs: what :meth:`ModuleStage.run` hands to the module's ``execute``.

    Attributes
    ----------
    preset : str
        The preset's name.
    settings : Mapping
        The settings given to replace the preset's (already applied by the module's
        ``resolve``; kept for the run's metadata).
    device : str
        Torch device of the stage's computations.
    progress : bool
        Whether to show progress bars.
    """

    preset: str
    settings: Mapping[str, Any]
    device: str = "cpu"
    progress: bool = True


@dataclass(frozen=True)
class ModuleStage:
    """A :class:`Stage` made of a module's functions (the form every stage module uses).

    The module provides ``resolve(preset, settings) -> cfg`` (the preset's settings with the
    given ones applied and checked, as a plain dictionary) and ``execute(cfg, out, run) ->
    files`` (the work, resumable, written under ``out``); :meth:`run` joins them, so the stage
    contract and its parameters are written once, here.
    """

    name: str
    title: str
    presets: Mapping[str, Any]
    resolve_fn: Callable[[str, Mapping[str, Any]], dict[str, Any]]
    execute_fn: Callable[[dict[str, Any], Path, StageRun], list[Path]]
    summary_fn: Callable[[Path], dict[str, Any]]
    report_fn: Callable[[Path, Path], str]
    uses_device: bool = True

    @classmethod
    def from_module(cls, module: str, title: str, *, uses_device: bool = True) -> ModuleStage:
        """The stage of the module named ``module``.

        It reads the module's ``NAME``, ``PRESETS``, ``resolve``, ``execute``, ``summary`` and
        ``report_section``; call it at the end of the module (``from_module(__name__, ...)``).
        """
        m = sys.modules[module]
        return cls(
            m.NAME, title, m.PRESETS, m.resolve, m.execute, m.summary, m.report_section, uses_device
        )

    def run(
        self,
        results_dir: str | Path,
        preset: str = "quick",
        *,
        device: str = "cpu",
        progress: bool = True,
        **settings: Any,
    ) -> list[Path]:
        """Run (or resume) the stage into ``results_dir / name``; return the files written.

        Parameters
        ----------
        results_dir : path
            Root of the results; the stage writes under ``results_dir / name`` only.
        preset : {"tiny", "quick", "paper"}, default "quick"
            ``tiny`` for tests, ``quick`` for ``make demo``, ``paper`` for the paper's grids
            (the module's ``PRESETS``).
        device : str, default "cpu"
            Torch device of the computations. A stage that runs on the CPU only
            (``uses_device`` false) raises ``ValueError`` for another.
        progress : bool, default True
            Progress bars (and log lines when stderr is not a terminal).
        **settings
            Replace the preset's settings (the fields of the stage's settings dataclass);
            an unknown name or a value of the wrong type raises a one-line ``ValueError``.

        Returns
        -------
        list of Path
            The files written, or already complete: a rerun computes nothing finished.
        """
        if not self.uses_device and device != "cpu":
            raise ValueError(f"the {self.name} stage runs on the CPU only, got device={device!r}")
        cfg = self.resolve_fn(preset, settings)
        out = Path(results_dir) / self.name
        out.mkdir(parents=True, exist_ok=True)
        run = StageRun(preset, dict(settings), device, progress)
        return list(self.execute_fn(cfg, out, run))

    def summary(self, results_dir: Path) -> dict[str, Any]:
        """The module's ``summary``."""
        return self.summary_fn(results_dir)

    def report_section(self, results_dir: Path, figures_dir: Path) -> str:
        """The module's ``report_section``."""
        return self.report_fn(results_dir, figures_dir)


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
    :class:`StageConfig` instance (its fields are the known keys, and each
    override is also checked against the field's type) or a plain mapping.

    Raises
    ------
    ValueError
        ``unknown preset ...``, ``unknown <what> ...`` with the known names, or a setting of the
        wrong type (naming the stage and the field).
    """
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
