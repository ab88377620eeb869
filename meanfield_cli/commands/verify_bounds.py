"""``meanfield verify-bounds``: check every closed-form bound against certified local constants.

The check itself is the stage :mod:`experiments.verify_bounds` (:func:`~experiments.verify_bounds.verify`);
this module is its command line: the options, ``--out`` checked before the run, the JSON report,
and a theorem violation reported as a failed check (one line, exit status 2) rather than as a bug.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from ..options import CommandFailed, check_out_file

__all__ = ["register"]


def _cmd(args: argparse.Namespace) -> dict[str, Any]:
    from experiments.engine import run_metadata, write_json
    from experiments.verify_bounds import NAME, verify

    if args.out:
        check_out_file(args.out)
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
    if not report["passed"]:  # the harness's verdict: a failed check, not a bug
        first = report["violations"][0] if report["violations"] else {}
        raise CommandFailed(
            f"{report['n_theorem_violations']} theorem violation(s), first: "
            f"{first.get('name')} on instance {first.get('index')} ({first.get('kind')})"
            + (f"; report written to {args.out}" if args.out else "")
        )
    return doc


def _print(doc: Mapping[str, Any]) -> None:
    from experiments.verify_bounds.report import text_lines

    print(
        f"verify-bounds: {doc['n_instances']} instances, "
        f"{'PASSED' if doc['passed'] else 'FAILED'} ({doc['seconds']:.1f} s)"
    )
    for line in text_lines(doc):
        print("  " + line)
    if "file" in doc:
        print(f"  wrote {doc['file']}")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``verify-bounds``."""
    from experiments.verify_bounds import KINDS, PRESETS

    p = sub.add_parser(
        "verify-bounds",
        help="check every bound of theory.bounds against certified local constants",
        description="Verification harness: every bound of theory.bounds against the certified "
        "engine.",
    )
    p.add_argument(
        "--instances",
        type=int,
        default=PRESETS["quick"].n_instances,
        help=f"number of instances (default {PRESETS['quick'].n_instances})",
    )
    p.add_argument("--seed", type=int, default=0, help="run seed (default 0)")
    p.add_argument("--kinds", help=f"comma-separated subset of: {', '.join(KINDS)}")
    p.add_argument("--out", help="write the JSON report to this file")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--no-progress", action="store_true", help="disable the progress bar")
    p.add_argument("-v", "--verbose", action="store_true", help="log to stderr")
    p.set_defaults(handler=_cmd, printer=_print)
