"""The stage contract (experiments/stage.py), typed presets, and the registry of the app layer."""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from experiments import (
    adversarial,
    bounded_logits,
    invertible,
    kim_tightness,
    long_context,
    mass_splitting,
    real_data,
    synthetic,
    verify_bounds,
)
from experiments.engine import Names, Stage, StageConfig, preset_settings


@dataclass(frozen=True)
class Toy(StageConfig):
    stage: ClassVar[str] = "toy"

    grid: tuple[int, ...]
    tol: float
    names: Names
    table: dict[str, Any] | None
    limit: int | None = None


TOY = Toy(grid=(2, 4), tol=1e-6, names=("a",), table=None)


def test_options_are_plain_and_deep_copies():
    opts = TOY.options()
    assert opts == {"grid": [2, 4], "tol": 1e-6, "names": ["a"], "table": None, "limit": None}
    opts["grid"].append(8)
    assert TOY.grid == (2, 4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        TOY.tol = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"grid": [2, "x"]}, r"toy: setting grid must be tuple\[int, \.\.\.\], got \[2, 'x'\]"),
        ({"grid": 3}, "toy: setting grid must be"),
        ({"tol": "small"}, "toy: setting tol must be a number, got 'small' "),
        ({"tol": True}, "toy: setting tol must be a number"),
        ({"limit": 2.5}, "toy: setting limit must be"),
        ({"names": 3}, "toy: setting names must be"),
        ({"table": [1]}, "toy: setting table must be"),
        ({"bogus": 1}, "unknown toy option"),
    ],
)
def test_check_names_the_stage_and_the_field(settings, message):
    with pytest.raises(ValueError, match=message):
        TOY.check(settings)


def test_check_accepts_what_the_command_line_parses():
    # ints where floats are expected, lists for tuples, a single name, null for optional fields
    TOY.check({"tol": 1, "grid": [2, 4, 8], "names": "b", "table": {"k": 1}, "limit": None})
    new = TOY.replace(grid=[3, 5], limit=4)
    assert new.grid == (3, 5) and new.limit == 4 and TOY.grid == (2, 4)


def test_preset_settings_applies_typed_overrides():
    cfg = preset_settings({"quick": TOY}, "quick", {"tol": 1e-3})
    assert cfg == TOY.replace(tol=1e-3) and TOY.tol != 1e-3  # the preset itself is unchanged
    with pytest.raises(ValueError, match="unknown preset 'paper'; choose from quick"):
        preset_settings({"quick": TOY}, "paper", {})
    with pytest.raises(ValueError, match="nope"):
        preset_settings({"quick": TOY}, "quick", {"nope": 1})
    with pytest.raises(ValueError, match="toy: setting tol must be a number"):
        preset_settings({"quick": TOY}, "quick", {"tol": "x"})


@pytest.mark.parametrize(
    "module",
    [
        real_data,
        adversarial,
        synthetic,
        mass_splitting,
        verify_bounds,
        invertible,
        kim_tightness,
        long_context,
        bounded_logits,
    ],
)
def test_every_stage_module_follows_the_contract(module):
    stage = module.STAGE
    assert isinstance(stage, Stage)
    assert stage.name == module.NAME
    # the long-context stage runs only under its own preset (and tiny, for the tests)
    want = {"tiny", "long"} if module is long_context else {"tiny", "quick", "paper"}
    assert set(stage.presets) == want
    kinds = {type(p) for p in stage.presets.values()}
    assert len(kinds) == 1
    kind = kinds.pop()
    assert issubclass(kind, StageConfig)
    for name, preset in stage.presets.items():
        # every preset passes its own type check, field by field
        preset.check(preset.options())
        # resolve returns the typed settings, not a plain dictionary
        assert isinstance(module.resolve(name, {}), kind)
    # one shape: a package with its settings, its computation and its report
    for part in ("settings", "sweep", "report"):
        assert importlib.import_module(f"{module.__name__}.{part}")


def test_registry_joins_figures_to_registered_stages():
    from meanfield_cli import registry

    names = [s.name for s in registry.STAGES]
    assert names == [
        "real_data",
        "adversarial",
        "synthetic",
        "attacks",
        "verify_bounds",
        "invertible",
        "kim_tightness",
        "long_context",
        "bounded_logits",
    ]
    assert all(isinstance(s, Stage) for s in registry.STAGES)
    for fig in registry.FIGURES:
        assert any(fig.stage is s for s in registry.STAGES), fig.id
        assert callable(fig.draw_fn)
    ids = [f.id for f in registry.FIGURES]
    assert len(ids) == len(set(ids)) == 15
    from experiments import verify_bounds

    vb = verify_bounds.STAGE.presets["quick"]
    assert vb.options()["n_instances"] == 600
    with pytest.raises(ValueError, match="verify_bounds: setting n_instances must be an integer"):
        vb.check({"n_instances": "many"})


def test_attacks_stage_logs_and_rebuilds_an_unreadable_npz(tmp_path, caplog):
    import numpy as np

    from experiments.engine import run_metadata, save_npz, write_json

    stem = tmp_path / "worst_measures"
    config = {"radii": [1.0, 2.0], "n_atoms": 3}
    write_json(stem.with_suffix(".json"), {"metadata": run_metadata(config=config)})
    save_npz(stem.with_suffix(".npz"), radii=np.array([1.0, 2.0]))
    assert mass_splitting.sweep._same_config(stem.with_suffix(".json"), config)
    assert not mass_splitting.sweep._same_config(
        stem.with_suffix(".json"), {**config, "n_atoms": 4}
    )
    assert not caplog.records
    stem.with_suffix(".npz").write_bytes(b"PK\x03\x04 not a zip archive")
    assert not mass_splitting.sweep._same_config(stem.with_suffix(".json"), config)
    assert "unreadable result" in caplog.text and "computing it again" in caplog.text
