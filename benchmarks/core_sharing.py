r"""How fast one single-threaded point runs when W copies run at once on this machine.

The parallel efficiency of ``--workers W`` on one machine cannot exceed the rate of W
single-threaded processes running together against the rate of one running alone: when the
cores share caches, memory bandwidth or a physical core (virtual CPUs), each copy slows down. This
script measures that ceiling with the work of a typical point (a certified local Lipschitz
bracket of a GPT-2-shaped layer, float64, one torch thread, ``--reps`` times per process): once
with one process, then with ``W`` processes started together. It prints the seconds per
repetition alone and together and their ratio, the *sharing factor*; the efficiency ceiling is
its inverse (docs/cluster.md, "Cost model").

Usage::

    .venv/bin/python benchmarks/core_sharing.py --workers 2 --reps 20 [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _work(reps: int, n: int, d: int, heads: int) -> float:
    """Seconds per repetition of one bracket on one thread, after one warm-up call."""
    import torch

    sys.path.insert(0, str(ROOT))
    from meanfield import MultiHeadParams, local_lipschitz

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    f64 = torch.float64

    def w() -> torch.Tensor:
        return torch.randn(d, d, generator=g, dtype=f64) / d**0.5

    params = MultiHeadParams.from_qkv(w(), w(), w(), w(), n_heads=heads)
    X = torch.randn(n, d, generator=g, dtype=f64)
    local_lipschitz(X, params, masked=True, method="lanczos", tol=1e-4, seed=0)
    t0 = time.perf_counter()
    for _ in range(reps):
        local_lipschitz(X, params, masked=True, method="lanczos", tol=1e-4, seed=0)
    return (time.perf_counter() - t0) / reps


def _run(copies: int, args: argparse.Namespace) -> list[float]:
    """Start ``copies`` processes together; each one's seconds per repetition."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    cmd = [sys.executable, __file__, "--child"]
    for name in ("reps", "n", "d", "heads"):
        cmd += [f"--{name}", str(getattr(args, name))]
    procs = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) for _ in range(copies)
    ]
    return [float(p.communicate()[0].strip().splitlines()[-1]) for p in procs]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2, help="alone/together pairs, alternated")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(_work(args.reps, args.n, args.d, args.heads))
        return 0
    alone, together = [], []
    for _ in range(args.rounds):
        alone += _run(1, args)
        together += _run(args.workers, args)
    a, t = min(alone), min(together)
    doc = {
        "workers": args.workers,
        "point": {"n": args.n, "d": args.d, "heads": args.heads, "reps": args.reps},
        "seconds_alone": alone,
        "seconds_together": together,
        "sharing_factor": t / a,
        "efficiency_ceiling": a / t,
        "cpu_count": os.cpu_count(),
    }
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print(
            f"one process: {a * 1e3:.1f} ms per point; {args.workers} at once: {t * 1e3:.1f} ms "
            f"(fastest of each); sharing factor {t / a:.2f}, efficiency ceiling {a / t:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
