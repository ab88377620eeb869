"""``meanfield experiment STAGE``: run one experiment stage (resumable), with preset options changed by --set.

Run one stage of `meanfield reproduce` into OUT/<stage> (resumable: rerun to continue). Options
of the preset are replaced with --set KEY=VALUE, e.g. --set configs=minilm-L0,gpt2rand-L6
--set n_grid=[2,4,8] --set long_grid=null. The run locks the directory that `meanfield reproduce`
locks: OUT's parent when OUT is named results (reproduce --out DIR writes DIR/results), else OUT,
so that an experiment and a reproduce run never write into the same results at once.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from ..options import (
    UsageError,
    add_command,
    add_common,
    add_device,
    check_device,
    check_out_dir,
)
from .lipschitz import check_model_name
from .reproduce import add_execution, check_execution

__all__ = ["STAGE_NAMES", "lock_dir", "parse_setting", "register"]

#: The stages, as ``--help`` lists them (the registry, which imports every stage, is loaded only
#: when the command runs; a test checks that the two agree).
STAGE_NAMES = (
    "real_data",
    "adversarial",
    "synthetic",
    "attacks",
    "verify_bounds",
    "invertible",
    "kim_tightness",
    "long_context",
    "bounded_logits",
)


def lock_dir(results: Path) -> Path:
    """The directory whose lock covers a run into the results root ``results``.

    ``meanfield reproduce --out DIR`` locks ``DIR`` and writes ``DIR/results``; an experiment into
    ``DIR/results`` takes the same lock, so the two never append to the same records at once.
    """
    return results.parent if results.name == "results" else results


def _check_models(overrides: dict[str, Any]) -> None:
    """A path in ``--set models=`` must be a checkpoint directory, before anything loads."""
    models = overrides.get("models")
    if models is None:
        return
    for name in [models] if isinstance(models, str) else list(models):
        if not isinstance(name, str) or not name:
            raise UsageError(f"--set models= takes model names or directories, got {name!r}")
        check_model_name(name, "--set models=")


def parse_setting(text: str) -> tuple[str, Any]:
    """Parse ``KEY=VALUE`` of ``meanfield experiment --set``.

    ``KEY`` names a setting of the stage, dotted within a group of settings (``f5.R``).

    The value is JSON when it parses (numbers, ``null``, ``true``, ``[2, 4, 8]``,
    ``{"a": 1}``), a list when it has commas (``minilm-L0,gpt2rand-L6``; a trailing comma makes
    a list of one), else a string.
    """
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not all(part.isidentifier() for part in key.split(".")):
        raise UsageError(f"--set takes KEY=VALUE (KEY dotted within a group: f5.R=2), got {text!r}")

    def one(v: str) -> Any:
        try:
            return json.loads(v)
        except json.JSONDecodeError:
            return v.strip()

    raw = raw.strip()
    try:
        return key, json.loads(raw)
    except json.JSONDecodeError:
        pass
    if "," in raw:
        return key, [one(v) for v in raw.split(",") if v.strip()]
    return key, raw


def handle(args: argparse.Namespace) -> dict[str, Any]:
    """List the settings (``--list``) or run the stage into ``--out``."""
    from experiments.engine import exclusive_run

    from ..pipeline import run_stages
    from ..registry import STAGES

    stages = {s.name: s for s in STAGES}
    if args.stage not in stages:
        raise UsageError(f"unknown stage {args.stage!r}; known: {', '.join(stages)}")
    stage = stages[args.stage]
    if args.preset not in stage.presets:
        raise UsageError(f"unknown preset {args.preset!r}; choose from {', '.join(stage.presets)}")
    preset = stage.presets[args.preset]
    overrides = dict(parse_setting(s) for s in args.set)
    if args.seed is not None:
        overrides.setdefault("seed", args.seed)
    preset.check(overrides)
    _check_models(overrides)
    doc: dict[str, Any] = {
        "kind": "experiment",
        "stage": stage.name,
        "title": stage.title,
        "preset": args.preset,
        "options": preset.replace(**overrides).options(),
        "overrides": overrides,
    }
    if args.list_options:
        return doc
    check_device(args.device)
    check_execution(args)
    results = check_out_dir(args.out, subdirs=(stage.name,))
    t0 = time.perf_counter()
    times: dict[str, Any] = {}
    with exclusive_run(lock_dir(results)):
        status = run_stages(
            [stage],
            results,
            args.preset,
            device=args.device,
            progress=not args.no_progress,
            settings={stage.name: overrides},
            workers=args.workers,
            scheduler=args.scheduler,
            catch=False,
            times=times,
        )
    doc.update(
        results=str(results / stage.name),
        seconds=time.perf_counter() - t0,
        files=[str(p) for p in status[stage.name]["files"]],
        summary=stage.summary(results),
    )
    if times:
        doc["execution"] = times
    return doc


def show(doc: dict[str, Any]) -> None:
    """The settings (``--list``), or time and files of the run."""
    head = f"meanfield experiment {doc['stage']} ({doc['title']}), preset {doc['preset']}"
    if "seconds" not in doc:
        print(f"{head}: options (change with --set KEY=VALUE)")
        for key, value in doc["options"].items():
            print(f"  {key} = {json.dumps(value)}")
        return
    print(f"{head}: {doc['seconds']:.1f} s, {len(doc['files'])} files in {doc['results']}")
    print("  --json prints the summary; `meanfield figures --results DIR` draws the figures")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``experiment``."""
    p = add_command(sub, __doc__)
    add_common(
        p,
        seed="the same as --set seed=SEED (default: the preset's)",
        seed_default=None,
        progress=True,
    )
    p.add_argument("stage", help=f"{', '.join(STAGE_NAMES[:-1])} or {STAGE_NAMES[-1]}")
    p.add_argument(
        "--preset",
        default="quick",
        help="tiny, quick (default) or paper; long_context has tiny and long only",
    )
    p.add_argument(
        "--out",
        default="reproduce_out/results",
        help="results root (default reproduce_out/results, where `meanfield figures` looks)",
    )
    add_device(p)
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="replace a preset option, dotted within a group (f5.R=2); the value is JSON, a "
        "comma list or a string; repeatable",
    )
    p.add_argument(
        "--list",
        dest="list_options",
        action="store_true",
        help="print the preset's options and exit",
    )
    add_execution(p)
    p.set_defaults(handler=handle, printer=show)
