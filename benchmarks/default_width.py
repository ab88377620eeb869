r"""What the default call of ``local_lipschitz`` gives: the width of its certified bracket.

For each layer, length ``n`` and dtype, three calls on the same input, in one process and one
thread:

``default``
    ``local_lipschitz(X, params, masked=..., method="lanczos")`` with nothing else: it stops on
    the width rule (``upper_prob <= 1.05 * lower``).
``width+tol``
    ``prob_rtol=0.05, tol=1e-6``: the width and the residual rule together.
``residual``
    ``tol=1e-6``: the residual rule alone (the default before the width rule), with the
    probabilistic bound read off its run.

Each row gives ``upper_prob / lower``, the products, ``converged``, the stopping rule and the
wall time. Layers: random GPT-2 layer 6, MiniLM layer 3 and SmolLM2 layer 15 (the offline
stand-ins), on LayerNorm-ed standard Gaussian tokens (seed 1), the causal mask where the model
has one. The table is in ``benchmarks/README.md``.

Usage::

    .venv/bin/python benchmarks/default_width.py [--n 256 1024] [--dtype float64 float32]
        [--models gpt2 minilm smollm2] [--json] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

LAYERS = {"gpt2": ("gpt2-random", 6), "minilm": ("minilm", 3), "smollm2": ("smollm2", 15)}
CALLS = {
    "default": {},
    "width+tol": {"prob_rtol": 0.05, "tol": 1e-6},
    "residual": {"tol": 1e-6},
}


def run(models: list[str], ns: list[int], dtypes: list[str]) -> list[dict]:
    """One row per (model, n, dtype, call)."""
    import torch

    from meanfield.lipschitz import local_lipschitz
    from meanfield.models import hf_attention, load_model

    torch.set_num_threads(1)
    rows = []
    for key in models:
        name, layer = LAYERS[key]
        lm = load_model(name, seed=0)
        for dtype_name in dtypes:
            dtype = getattr(torch, dtype_name)
            att = hf_attention(lm.model, layer, dtype=dtype)
            p, masked = att.params, bool(att.info.causal)
            g = torch.Generator().manual_seed(1)
            for n in ns:
                X = torch.randn(n, p.d, generator=g, dtype=torch.float64)
                X = torch.nn.functional.layer_norm(X, (p.d,)).to(dtype)
                local_lipschitz(X[:8], p, masked=masked, method="lanczos")  # warm the caches
                for call, kw in CALLS.items():
                    t0 = time.perf_counter()
                    est = local_lipschitz(X, p, masked=masked, method="lanczos", **kw)
                    seconds = time.perf_counter() - t0
                    row = {
                        "model": key,
                        "layer": layer,
                        "n": n,
                        "dtype": dtype_name,
                        "call": call,
                        "value": float(est.value),
                        "ratio_prob": float(est.upper_prob / est.lower),
                        "ratio_block": float(est.upper / est.lower),
                        "n_matvec": int(est.n_matvec),
                        "converged": bool(est.converged),
                        "stop_rule": est.stop_rule,
                        "seconds": seconds,
                    }
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict]) -> str:
    """A markdown table, one line per (model, n, dtype)."""
    lines = [
        "| layer | n | dtype | default: up_prob/low | products | residual 1e-6: up_prob/low | products |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    by = {(r["model"], r["n"], r["dtype"], r["call"]): r for r in rows}
    for m, n, dt, call in by:
        if call != "default":
            continue
        d, r = by[(m, n, dt, "default")], by[(m, n, dt, "residual")]
        lines.append(
            f"| {m} L{d['layer']} | {n} | {dt} | {d['ratio_prob']:.3f} | {d['n_matvec']} | "
            f"{r['ratio_prob']:.3f} | {r['n_matvec']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--dtype", nargs="+", choices=("float64", "float32"), default=["float64"])
    p.add_argument("--models", nargs="+", choices=tuple(LAYERS), default=list(LAYERS))
    p.add_argument("--json", action="store_true", help="print the rows as JSON on stdout")
    p.add_argument("--out", default=None, help="write the rows to this JSON file")
    args = p.parse_args(argv)
    rows = run(args.models, args.n, args.dtype)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    print(json.dumps(rows) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
