r"""``meanfield verify-bounds``: run the harness from the command line."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from ..results import run_metadata, write_json
from .generation import KINDS
from .report import NAME, _fmt, _table
from .stage import PRESETS, verify

#: First paragraph of the package docstring (the command's description).
DESCRIPTION = (
    "Verification harness: every bound of :mod:`theory.bounds` against the certified engine."
)


def _cmd(args: argparse.Namespace) -> dict[str, Any]:
    kinds = None if not args.kinds else [k.strip() for k in args.kinds.split(",") if k.strip()]
    report = verify(args.instances, args.seed, kinds, not args.no_progress)
    doc = {
        "kind": NAME,
        "metadata": run_metadata(
            seed=args.seed,
            device="cpu",
            dtype="float64",
            config={"n_instances": args.instances, "kinds": kinds},
        ),
        **report,
    }
    if args.out:
        doc["file"] = str(write_json(args.out, doc))
    if not report["passed"]:
        first = report["violations"][0] if report["violations"] else {}
        raise RuntimeError(
            f"{report['n_theorem_violations']} theorem violation(s), first: "
            f"{first.get('name')} on instance {first.get('index')} ({first.get('kind')})"
            + (f"; report written to {args.out}" if args.out else "")
        )
    return doc


def _print(doc: Mapping[str, Any]) -> None:
    print(
        f"verify-bounds: {doc['n_instances']} instances, "
        f"{'PASSED' if doc['passed'] else 'FAILED'} ({doc['seconds']:.1f} s)"
    )
    for line in _table(doc):
        print("  " + line)
    for name, c in doc["candidates"].items():
        print(f"  candidate {name}: {c['verdict']} (min margin {_fmt(c['min_margin'])})")
    if "file" in doc:
        print(f"  wrote {doc['file']}")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``verify-bounds`` to the ``meanfield`` subcommands."""
    p = subparsers.add_parser(
        "verify-bounds",
        help="check every bound of theory.bounds against certified local constants",
        description=DESCRIPTION,
    )
    p.add_argument(
        "--instances",
        type=int,
        default=PRESETS["quick"]["n_instances"],
        help=f"number of instances (default {PRESETS['quick']['n_instances']})",
    )
    p.add_argument("--seed", type=int, default=0, help="run seed (default 0)")
    p.add_argument("--kinds", default=None, help=f"comma-separated subset of: {', '.join(KINDS)}")
    p.add_argument("--out", default=None, help="write the JSON report to this file")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--no-progress", action="store_true", help="disable the progress bar")
    p.add_argument("-v", "--verbose", action="store_true", help="log to stderr")
    p.set_defaults(handler=_cmd, printer=_print)
    return p
