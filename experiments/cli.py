"""The ``meanfield`` command line.

Each subcommand returns a JSON-serialisable dict. ``--json`` prints it as one object on stdout;
otherwise a short human-readable summary goes to stdout. Logs and progress go to stderr. Errors
exit non-zero with one line, ``meanfield: error: ...``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["build_parser", "main", "parse_setting"]

log = logging.getLogger("meanfield")

Handler = Callable[[argparse.Namespace], dict[str, Any]]


class CLIError(Exception):
    """An error reported to the user as one line."""


# --------------------------------------------------------------------------- subcommands
def _cmd_demo(args: argparse.Namespace) -> dict[str, Any]:
    from . import demo

    config = demo.DemoConfig(seed=args.seed, n=args.n, R=args.R, dtype=args.dtype, out=args.out)
    doc = demo.run(config)
    files = [str(p) for p in (f"{args.out}/demo.npz", f"{args.out}/demo.json")]
    if not args.no_plot:
        from paper_figs import fig_demo  # lazy: the library layer never imports matplotlib

        files += [str(p) for p in fig_demo.draw(args.out)]
    doc["files"] = files
    return doc


def _print_demo(doc: dict[str, Any]) -> None:
    print("meanfield demo: one attention head in d = 2 on a weighted measure")
    for key, value in doc["distances"].items():
        print(f"  {key:<20s} {value:.6f}")
    for key, est in doc["local_lipschitz"].items():
        geometry = "W_c, masked" if key == "Fm" else "W_2"
        print(
            f"  local Lip of {key:<3s} at mu ({geometry}): {est['value']:.6f} "
            f"(certified bracket [{est['lower']:.6f}, {est['upper']:.6f}])"
        )
    for f in doc["files"]:
        print(f"  wrote {f}")


def _cmd_reproduce(args: argparse.Namespace) -> dict[str, Any]:
    from .reproduce import reproduce

    only = args.only.split(",") if args.only else None
    doc = reproduce(
        args.out,
        args.preset,
        device=args.device,
        only=only,
        figures=not args.no_figures,
        progress=not args.no_progress,
        seed=args.seed,
    )
    failed = [k for k, e in doc["stages"].items() if e["status"] != "ok"]
    failed += [f"figure {k}" for k, e in doc.get("figures", {}).items() if e["status"] == "failed"]
    if failed:
        raise CLIError(
            f"{', '.join(failed)} failed (details in {args.out}/reproduce.json"
            + (f" and {doc['report']}" if "report" in doc else "")
            + "); rerun the same command to resume"
        )
    return doc


def _print_reproduce(doc: dict[str, Any]) -> None:
    print(f"meanfield reproduce: preset {doc['preset']}, {doc['total_seconds']:.0f} s")
    for name, e in doc["stages"].items():
        print(f"  {name:<14s} {e['status']:<7s} {e['seconds']:7.1f} s")
    for fid, e in doc.get("figures", {}).items():
        if e["status"] != "ok":
            print(f"  figure {fid:<4s} {e['status']}: {e.get('error', '')}")
    n_ok = sum(e["status"] == "ok" for e in doc.get("figures", {}).values())
    if "figures" in doc:
        print(f"  {n_ok} of {len(doc['figures'])} figures drawn")
    if "report" in doc:
        print(f"  wrote {doc['report']}")


def _cmd_figures(args: argparse.Namespace) -> dict[str, Any]:
    from paper_figs.make_all import draw_all

    results = Path(args.results)
    if not results.is_dir():
        raise FileNotFoundError(
            f"no results directory {results}; run `meanfield reproduce --out DIR` first"
        )
    out = Path(args.out) if args.out else results.parent / "figures"
    status = draw_all(results, out, only=args.only.split(",") if args.only else None)
    if not any(e["status"] == "ok" for e in status.values()):
        raise CLIError(f"no figure could be drawn from {results}")
    return {"kind": "figures", "results": str(results), "out": str(out), "figures": status}


def parse_setting(text: str) -> tuple[str, Any]:
    """Parse ``KEY=VALUE`` of ``meanfield experiment --set``.

    The value is JSON when it parses (numbers, ``null``, ``true``, ``[2, 4, 8]``,
    ``{"a": 1}``), a list when it has commas (``minilm-L0,gpt2rand-L6``; a trailing comma makes
    a list of one), else a string.
    """
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key.isidentifier():
        raise CLIError(f"--set takes KEY=VALUE, got {text!r}")

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


def _cmd_experiment(args: argparse.Namespace) -> dict[str, Any]:
    import time

    from .reproduce import STAGES, check_device

    stages = {s.name: s for s in STAGES}
    if args.stage not in stages:
        raise CLIError(f"unknown stage {args.stage!r}; known: {', '.join(stages)}")
    stage = stages[args.stage]
    mod = stage.load()
    if args.preset not in mod.PRESETS:
        raise CLIError(f"unknown preset {args.preset!r}; choose from {', '.join(mod.PRESETS)}")
    overrides = dict(parse_setting(s) for s in args.set)
    if args.seed is not None:
        overrides.setdefault("seed", args.seed)
    doc: dict[str, Any] = {
        "kind": "experiment",
        "stage": stage.name,
        "title": stage.title,
        "preset": args.preset,
        "options": {**mod.PRESETS[args.preset], **overrides},
        "overrides": overrides,
    }
    if args.list_options:
        return doc
    check_device(args.device)
    results = Path(args.out)
    t0 = time.perf_counter()
    files = mod.run(
        results,
        args.preset,
        device=args.device if stage.uses_device else "cpu",
        progress=not args.no_progress,
        **overrides,
    )
    doc.update(
        results=str(results / stage.name),
        seconds=time.perf_counter() - t0,
        files=[str(p) for p in files],
        summary=mod.summary(results),
    )
    return doc


def _print_experiment(doc: dict[str, Any]) -> None:
    head = f"meanfield experiment {doc['stage']} ({doc['title']}), preset {doc['preset']}"
    if "seconds" not in doc:
        print(f"{head}: options (change with --set KEY=VALUE)")
        for key, value in doc["options"].items():
            print(f"  {key} = {json.dumps(value)}")
        return
    print(f"{head}: {doc['seconds']:.1f} s, {len(doc['files'])} files in {doc['results']}")
    print("  --json prints the summary; `meanfield figures --results DIR` draws the figures")


def _print_figures(doc: dict[str, Any]) -> None:
    for fid, e in doc["figures"].items():
        what = ", ".join(f for f in e["files"] if f.endswith(".pdf")) or e.get("error", "")
        print(f"  {fid:<3s} {e['status']:<8s} {what}")


# --------------------------------------------------------------------------- parser
def _common(p: argparse.ArgumentParser, seed_help: str = "random seed (default 0)") -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--seed", type=int, default=0, help=seed_help)
    p.add_argument("--no-progress", action="store_true", help="disable progress bars")
    p.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log to stderr (-vv: also one line per finished point of a sweep)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="meanfield",
        description="Smoothness of self-attention on sequences and measures (Castin, Ablin, Peyré 2024).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "demo", help="random 2-d attention on a weighted measure: W2 distances and a picture"
    )
    _common(p)
    p.add_argument("--out", default="demo_out", help="output directory (default demo_out)")
    p.add_argument("--n", type=int, default=12, help="number of atoms (default 12)")
    p.add_argument("--R", type=float, default=2.0, help="radius of the ball holding the atoms")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    p.add_argument("--no-plot", action="store_true", help="skip the figure")
    p.set_defaults(handler=_cmd_demo, printer=_print_demo)

    p = sub.add_parser(
        "reproduce",
        help="run the experiments of a preset, draw every figure and write report.md",
        description="Run every experiment stage of a preset (resumable: rerun to continue), "
        "draw all figures and write OUT/report.md.",
    )
    _common(p, "replaces the seed of every stage whose preset has one (default: keep them)")
    p.add_argument(
        "--preset",
        choices=("tiny", "quick", "paper"),
        default="quick",
        help="quick: every figure in about 10 min on 2 CPU cores; paper: full grids (hours)",
    )
    p.add_argument(
        "--out", default="reproduce_out", help="output directory (default reproduce_out)"
    )
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--only", default=None, help="comma-separated stages to run")
    p.add_argument("--no-figures", action="store_true", help="run the experiments only")
    p.set_defaults(handler=_cmd_reproduce, printer=_print_reproduce, seed=None)

    p = sub.add_parser(
        "experiment",
        help="run one experiment stage (resumable), with preset options changed by --set",
        description="Run one stage of `meanfield reproduce` into OUT/<stage> (resumable: rerun "
        "to continue). Options of the preset are replaced with --set KEY=VALUE, e.g. "
        "--set configs=minilm-L0,gpt2rand-L6 --set n_grid=[2,4,8] --set long_grid=null.",
    )
    _common(p, "the same as --set seed=SEED (default: the preset's)")
    p.add_argument("stage", help="real_data, adversarial, synthetic, attacks or verify_bounds")
    p.add_argument("--preset", default="quick", help="tiny, quick (default) or paper")
    p.add_argument(
        "--out",
        default="reproduce_out/results",
        help="results root (default reproduce_out/results, where `meanfield figures` looks)",
    )
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="replace a preset option (JSON value, comma list or string); repeatable",
    )
    p.add_argument(
        "--list",
        dest="list_options",
        action="store_true",
        help="print the preset's options and exit",
    )
    p.set_defaults(handler=_cmd_experiment, printer=_print_experiment, seed=None)

    p = sub.add_parser("figures", help="redraw every figure from saved results")
    _common(p)
    p.add_argument(
        "--results",
        default="reproduce_out/results",
        help="results root (default reproduce_out/results)",
    )
    p.add_argument("--out", default=None, help="figure directory (default: next to the results)")
    p.add_argument("--only", default=None, help="comma-separated figure ids, e.g. F1,F4,B")
    p.set_defaults(handler=_cmd_figures, printer=_print_figures)

    from . import theory_cli

    theory_cli.add_parsers(sub, _common)

    from . import attacks_cli, lipschitz_cli, verify_bounds

    lipschitz_cli.add_parser(sub)
    attacks_cli.add_parser(sub)
    verify_bounds.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``meanfield`` console script."""
    # OpenMP threads that busy-wait make dense LAPACK calls 10-30x slower as soon as another
    # process competes for the cores (measured: a 1536 x 1536 float64 SVD, 33 s against 1.1 s on
    # 2 shared cores). Passive waiting costs nothing measurable here; set before torch loads.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "no_progress", False) and "tqdm" not in sys.modules:
        # Also silences third-party bars (e.g. GGUF de-quantization), which take no flag;
        # tqdm reads this variable when it is first imported, which happens in the handlers.
        os.environ.setdefault("TQDM_DISABLE", "1")
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if args.verbose >= 2:
        for name in ("experiments", "meanfield"):
            logging.getLogger(name).setLevel(logging.DEBUG)
    logging.getLogger("fontTools").setLevel(logging.ERROR)  # font subsetting chatter on PDF save
    try:
        result = args.handler(args)
    except (CLIError, ValueError, TypeError, FileNotFoundError, ImportError, RuntimeError) as err:
        msg = " ".join(str(err).split()) or type(err).__name__
        print(f"meanfield: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("meanfield: interrupted", file=sys.stderr)
        return 130
    if args.json:
        from .results import _jsonable

        try:
            json.dump(_jsonable(result), sys.stdout)
            sys.stdout.write("\n")
            sys.stdout.flush()
        except BrokenPipeError:  # e.g. piped into `head`
            return 0
    else:
        args.printer(result)
    return 0
