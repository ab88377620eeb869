"""``meanfield demo``: random 2-d attention on a weighted measure: W2 distances and a picture.

Draw a random attention head in d = 2 and a measure of N atoms in the ball of radius R with uneven
masses; print the W2 distances between the measure and its images (masked and unmasked), the
local Lipschitz constants with certified brackets, and write demo.npz, demo.json and a picture to
--out (default meanfield_demo/, apart from the demo_out/ where `make demo` writes the quick
reproduction of the paper).
"""

from __future__ import annotations

import argparse
from typing import Any

from ..options import add_command, add_common, check_out_dir, print_written

__all__ = ["register"]


def handle(args: argparse.Namespace) -> dict[str, Any]:
    """Run the demo (:mod:`experiments.demo`) and draw its figure unless ``--no-plot``."""
    from experiments import demo

    config = demo.DemoConfig(seed=args.seed, n=args.n, R=args.R, dtype=args.dtype, out=args.out)
    check_out_dir(args.out)
    doc = demo.run(config)
    files = [f"{args.out}/demo.npz", f"{args.out}/demo.json"]
    if not args.no_plot:
        from paper_figs import fig_demo

        files += [str(p) for p in fig_demo.draw(args.out)]
    doc["files"] = files
    return doc


def show(doc: dict[str, Any]) -> None:
    """Distances, local constants with their brackets, files written."""
    print("meanfield demo: one attention head in d = 2 on a weighted measure")
    for key, value in doc["distances"].items():
        print(f"  {key:<20s} {value:.6f}")
    for key, est in doc["local_lipschitz"].items():
        geometry = "W_c, masked" if key == "Fm" else "W_2"
        print(
            f"  local Lip of {key:<3s} at mu ({geometry}): {est['value']:.6f} "
            f"(certified bracket [{est['lower']:.6f}, {est['upper']:.6f}])"
        )
    print_written(doc)


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``demo``."""
    p = add_command(sub, __doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_common(p, seed="seed of the head and the measure")
    p.add_argument(
        "--out",
        default="meanfield_demo",
        help="output directory (`make demo`'s quick reproduction writes demo_out instead)",
    )
    p.add_argument("--n", type=int, default=12, help="number of atoms")
    p.add_argument("--R", type=float, default=2.0, help="radius of the ball holding the atoms")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float64", help="precision")
    p.add_argument("--no-plot", action="store_true", help="skip the figure")
    p.set_defaults(handler=handle, printer=show)
