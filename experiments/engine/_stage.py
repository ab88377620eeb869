"""The contract every experiment stage follows, and typed presets.

A *stage* is one experiment of ``meanfield reproduce`` (real data, adversarial inputs, the
synthetic sweeps, mass splitting, the bound checks). Each stage module defines

- a frozen dataclass of its settings (a subclass of :class:`StageConfig`), with one instance per
  preset in ``PRESETS`` (``"tiny"``, ``"quick"``, ``"paper"``);
- ``resolve(preset, settings) -> StageConfig``: the preset's settings with the given ones applied
  and checked, typed (starting from :func:`preset_settings`);
- ``execute(cfg, out, run)``: the work, resumable, written under ``out`` (``run`` is a
  :class:`StageRun`: preset, settings, device, progress, and where the points run). It is a
  generator (``experiments.engine.Steps``): each ``yield`` hands the driver a round of sweep
  jobs, whose records the stage reads after the driver resumes it; it returns the files written;
- ``summary(results_dir) -> dict`` and ``report_section(results_dir, figures_dir) -> str``;
- ``claims(results_dir) -> Claims``: the stage's rows of the report's verdict table, and the
  notes under it;
- ``STAGE = ModuleStage.from_module(__name__, title)``, which bundles the above (the
  :class:`Stage` of the pipeline) and gives the module its public ``run = STAGE.run``.

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
from typing import Any, ClassVar, NamedTuple, TypeVar

import numpy as np

from ._runner import Steps, drive, remote

__all__ = [
    "Claim",
    "Claims",
    "ModuleStage",
    "Names",
    "Stage",
    "StageConfig",
    "StageRun",
    "preset_settings",
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


_TYPE_NAMES = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true/false"}


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    if isinstance(tp, type):
        return _TYPE_NAMES.get(tp.__name__, tp.__name__)
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
    if tp is int or tp is float:  # numbers, not booleans (bool and str: a type, below)
        kind = numbers.Integral if tp is int else numbers.Real
        return isinstance(value, kind) and not isinstance(value, (bool, np.bool_))
    if origin in (tuple, list, typing.Sequence, cabc.Sequence):
        if not _is_sequence(value):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:  # fixed length
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


_Config = TypeVar("_Config", bound="StageConfig")


@dataclass(frozen=True)
class StageConfig:
    """Base of the per-stage settings dataclasses (frozen; one instance per preset).

    Subclasses name their stage in ``stage`` (a class variable) and declare every setting as a
    typed field. Sequences are tuples and tables are mappings, so a preset cannot be changed by
    accident. A field may itself be a :class:`StageConfig` (a group of settings, read as
    ``cfg.f5.R``); its settings are named with dots (``f5.R``) wherever a setting is given by
    name: :meth:`check`, :meth:`replace`, ``meanfield experiment --set f5.R=2``.
    :meth:`options` returns the plain JSON shape (lists and dicts) that result metadata use.
    """

    stage: ClassVar[str] = "stage"

    @classmethod
    def field_types(cls) -> dict[str, Any]:
        """Setting name to its annotation (a group's settings under dotted names)."""
        hints = typing.get_type_hints(cls)
        out: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            if _is_group(tp):
                out.update({f"{f.name}.{k}": v for k, v in tp.field_types().items()})
            else:
                out[f.name] = tp
        return out

    def options(self) -> dict[str, Any]:
        """The settings as a plain dictionary (lists, dicts, a group as a dict; a deep copy)."""
        return {
            f.name: (v.options() if isinstance(v, StageConfig) else _plain(v))
            for f in dataclasses.fields(self)
            for v in [getattr(self, f.name)]
        }

    @classmethod
    def _split(cls, settings: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, dict]]:
        """Settings of this level, and those of each group (``"f5.R"`` -> ``{"f5": {"R"}}``)."""
        groups = {k for k, tp in typing.get_type_hints(cls).items() if _is_group(tp)}
        own: dict[str, Any] = {}
        nested: dict[str, dict[str, Any]] = {}
        for key, value in settings.items():
            head, dot, rest = key.partition(".")
            if head in groups and (dot or isinstance(value, Mapping)):
                nested.setdefault(head, {}).update({rest: value} if dot else dict(value))
            else:
                own[key] = value
        return own, nested

    @classmethod
    def check(cls, settings: Mapping[str, Any], *, within: tuple[str, str] | None = None) -> None:
        """Raise a one-line ValueError for an unknown setting or a value of the wrong type.

        ``within`` (the stage's name and the group's dotted prefix) is how a stage's settings
        check the settings of one of their groups, so that messages name the full setting.
        """
        stage, prefix = within or (cls.stage, "")
        hints = typing.get_type_hints(cls)
        own, nested = cls._split(settings)
        unknown = sorted(set(own) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            known = ", ".join(prefix + k for k in cls.field_types())
            raise ValueError(
                f"unknown {stage} option(s) {', '.join(prefix + k for k in unknown)}; "
                f"known: {known}"
            )
        for key, value in own.items():
            if not _matches(value, hints[key]):
                raise ValueError(
                    f"{stage}: setting {prefix}{key} must be {_type_name(hints[key])}, "
                    f"got {value!r} ({type(value).__name__})"
                )
        for group, entries in nested.items():
            hints[group].check(entries, within=(stage, f"{prefix}{group}."))

    def replace(self: _Config, **settings: Any) -> _Config:
        """A copy with ``settings`` replaced (checked by :meth:`check`; lists become tuples).

        A group's settings are given by dotted names (``**{"f5.R": 2.0}``) or as a mapping
        (``f5={"R": 2.0}``), and replace only the settings they name.
        """
        self.check(settings)
        own, nested = self._split(settings)
        frozen: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in own.items()}
        for group, entries in nested.items():
            frozen[group] = getattr(self, group).replace(**entries)
        return dataclasses.replace(self, **frozen)


def _is_group(tp: Any) -> bool:
    """Whether the annotation ``tp`` is a group of settings (a :class:`StageConfig`)."""
    return isinstance(tp, type) and issubclass(tp, StageConfig)


class Claim(NamedTuple):
    """One row of the report's verdict table: a claim, our number, the paper's, a verdict.

    The verdict is one of ``experiments.verdicts.VERDICTS``, given by one of its rules.
    """

    claim: str
    ours: str
    paper: str
    verdict: str


class Claims(NamedTuple):
    """What a stage states for the verdict table: its rows, and the notes printed under it."""

    rows: list[Claim]
    notes: list[str]


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
    executor : Executor, optional
        Where the driver runs the points (``None``: this process); :meth:`remote` calls run there.
    """

    preset: str
    settings: Mapping[str, Any]
    device: str = "cpu"
    progress: bool = True
    executor: Any = None

    def remote(
        self, fn: Callable[[Mapping[str, Any]], Mapping[str, Any]], config: Mapping[str, Any]
    ) -> Any:
        """``fn(config)`` where the points run (``experiments.engine.remote``)."""
        return remote(fn, config, self.executor)


@dataclass(frozen=True)
class ModuleStage:
    """A :class:`Stage` made of a module's functions (the form every stage module uses).

    The module provides ``resolve(preset, settings) -> cfg`` (the preset's settings with the
    given ones applied and checked, as the stage's typed :class:`StageConfig`) and
    ``execute(cfg, out, run)`` (the work as rounds, resumable, written under ``out``);
    :meth:`start` and :meth:`run` join them, so the stage contract and its parameters are
    written once, here.
    """

    name: str
    title: str
    presets: Mapping[str, StageConfig]
    resolve_fn: Callable[[str, Mapping[str, Any]], Any]
    execute_fn: Callable[[Any, Path, StageRun], Steps]
    # the module's own summary, report_section and claims functions, called as methods
    summary: Callable[[Path], dict[str, Any]]
    report_section: Callable[[Path, Path], str]
    claims: Callable[[Path], Claims]
    uses_device: bool = True

    @classmethod
    def from_module(cls, module: str, title: str, *, uses_device: bool = True) -> ModuleStage:
        """The stage of the module named ``module``.

        It reads the module's ``NAME``, ``PRESETS``, ``resolve``, ``execute``, ``summary``,
        ``report_section`` and ``claims``; call it at the end of the module
        (``from_module(__name__, ...)``).
        """
        m = sys.modules[module]
        functions = m.resolve, m.execute, m.summary, m.report_section, m.claims  # fields' order
        return cls(m.NAME, title, m.PRESETS, *functions, uses_device=uses_device)

    def start(
        self,
        results_dir: str | Path,
        preset: str = "quick",
        *,
        device: str = "cpu",
        progress: bool = True,
        executor: Any = None,
        **settings: Any,
    ) -> Steps:
        """The stage's run as rounds, for a driver (:class:`experiments.engine.Rounds`).

        The arguments are those of :meth:`run`; ``executor`` is where the driver will run the
        points (``None``: this process). The settings are resolved and checked here, before the
        first round, so a bad setting fails at once.
        """
        if not self.uses_device and device != "cpu":
            raise ValueError(f"the {self.name} stage runs on the CPU only, got device={device!r}")
        cfg = self.resolve_fn(preset, settings)
        out = Path(results_dir) / self.name
        out.mkdir(parents=True, exist_ok=True)
        run = StageRun(preset, dict(settings), device, progress, executor)
        return self.execute_fn(cfg, out, run)

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
        steps = self.start(results_dir, preset, device=device, progress=progress, **settings)
        return drive(steps, progress=bool(progress))


#: A stage of the pipeline: every stage is a :class:`ModuleStage` made of its module's functions
#: (one shape, so the contract's signatures are written once, on :class:`ModuleStage`).
Stage = ModuleStage


def preset_settings(
    presets: Mapping[str, StageConfig], preset: str, overrides: Mapping[str, Any]
) -> Any:
    """``presets[preset]`` with ``overrides`` replaced, typed (:meth:`StageConfig.replace`).

    Raises a one-line ValueError for an unknown preset, an unknown setting or a value of the
    wrong type (naming the stage and the setting, dotted within a group).
    """
    if preset not in presets:
        raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(presets)}")
    return presets[preset].replace(**overrides)
