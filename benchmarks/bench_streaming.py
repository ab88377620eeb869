r"""Benchmark: stored against streaming Jacobian products of a GPT-2-shaped attention layer.

Compares, at each sequence length ``n`` and in the same run, the same dtype and the same number
of threads:

``stored``
    :func:`meanfield.jacobian.linearize` (keeps the :math:`H` attention matrices :math:`P^h`,
    :math:`n\times n` each) and one :func:`~meanfield.jacobian.jvp` and one
    :func:`~meanfield.jacobian.vjp`.
``streaming``
    :func:`meanfield.jacobian.streaming.linearize_streaming` (keeps the head rows and the row
    log-normalisers, :math:`O(Hn(k + d_v))`) and one ``streaming_jvp`` and one ``streaming_vjp``,
    which recompute the attention tile by tile (docs/derivations/streaming_products.md).

The layer: :math:`d = 768`, 12 heads of width :math:`k = 64`, causal, with output projection,
built directly with :meth:`~meanfield.MultiHeadParams.from_qkv` from random weights
:math:`W_Q, W_K, W_V\sim\mathcal N(0, 0.02^2)`, :math:`W^O\sim\mathcal N(0, 0.02^2/24)` (GPT-2's
initialisation, ``c_proj`` scaled by :math:`1/\sqrt{2\cdot12}`), logit scale :math:`1/\sqrt k`,
no biases. Inputs are LayerNorm-ed standard Gaussian tokens (norm :math:`\sqrt d`, like GPT-2's
``ln_1`` outputs); tangents and cotangents are standard Gaussian.

Each (path, n) runs in a fresh subprocess. Its peak memory is the increase of ``ru_maxrss`` over
the resident size (``/proc/self/statm``) just before ``linearize`` (the layer and the inputs are
built before), so it covers the linearisation and both products; ``stored MB`` is the size of
the tensors the linearisation object keeps. Times are the median of ``--repeats`` calls (the
first call included when ``--repeats 1``).

Usage::

    .venv/bin/python benchmarks/bench_streaming.py                  # n = 1024, 4096, float64
    .venv/bin/python benchmarks/bench_streaming.py --n 1024 --threads 1 --dtype float32
    .venv/bin/python benchmarks/bench_streaming.py --n 2048 --block 128,512 --json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

D, H, K = 768, 12, 64


def _rss_kb() -> int:
    with open("/proc/self/statm") as fh:
        pages = int(fh.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") // 1024


def _tensor_bytes(obj, seen=None) -> int:
    """Bytes of the distinct tensor storages reachable from the fields of ``obj``."""
    import dataclasses

    import torch

    seen = set() if seen is None else seen
    total = 0
    values = (
        [getattr(obj, f.name) for f in dataclasses.fields(obj)]
        if dataclasses.is_dataclass(obj)
        else list(obj)
    )
    for v in values:
        if isinstance(v, torch.Tensor):
            key = v.untyped_storage().data_ptr()
            if key not in seen:
                seen.add(key)
                total += v.untyped_storage().nbytes()
        elif isinstance(v, tuple | list) or (
            dataclasses.is_dataclass(v) and not isinstance(v, type) and hasattr(v, "lse")
        ):
            total += _tensor_bytes(v, seen)
    return total


def _layer(dtype, seed: int):
    import torch

    from meanfield import MultiHeadParams

    gen = torch.Generator().manual_seed(seed)
    W_Q, W_K, W_V = (0.02 * torch.randn(H * K, D, generator=gen, dtype=dtype) for _ in range(3))
    W_O = 0.02 / (2 * H) ** 0.5 * torch.randn(D, H * K, generator=gen, dtype=dtype)
    return MultiHeadParams.from_qkv(W_Q, W_K, W_V, W_O, n_heads=H), gen


def worker(path: str, n: int, dtype_name: str, threads: int, repeats: int, block, seed: int):
    import torch

    from meanfield.jacobian import jvp, linearize, vjp
    from meanfield.jacobian.streaming import linearize_streaming, streaming_jvp, streaming_vjp

    torch.set_num_threads(threads)
    dtype = getattr(torch, dtype_name)
    params, gen = _layer(dtype, seed)
    X = torch.nn.functional.layer_norm(torch.randn(n, D, generator=gen, dtype=dtype), (D,))
    Hv = torch.randn(n, D, generator=gen, dtype=dtype)
    G = torch.randn(n, D, generator=gen, dtype=dtype)
    before = _rss_kb()
    t0 = time.perf_counter()
    if path == "stored":
        lin = linearize(X, params, masked=True)
        fj, fv = jvp, vjp
    else:
        lin = linearize_streaming(X, params, masked=True, block_size=block)
        fj, fv = streaming_jvp, streaming_vjp
    t_lin = time.perf_counter() - t0
    times_j, times_v = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out_j = fj(lin, Hv)
        times_j.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        out_v = fv(lin, G)
        times_v.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    return {
        "path": path,
        "n": n,
        "dtype": dtype_name,
        "threads": threads,
        "block": list(lin.block_size) if path == "streaming" else None,
        "linearize_s": t_lin,
        "jvp_s": statistics.median(times_j),
        "vjp_s": statistics.median(times_v),
        "peak_mb": peak / 1024,
        "stored_mb": _tensor_bytes(lin) / 2**20,
        "jvp_norm": float(out_j.double().norm()),
        "vjp_norm": float(out_v.double().norm()),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", default="1024,4096", help="comma-separated sequence lengths")
    ap.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--block", default=None, help="b_q,b_k of the streaming tiles (default rule)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="also print the rows as JSON")
    ap.add_argument("--out", default=None, help="write the rows to this JSON file")
    ap.add_argument("--worker", nargs=2, metavar=("PATH", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    block = None if args.block is None else tuple(int(b) for b in args.block.split(","))
    if args.worker:
        row = worker(
            args.worker[0], int(args.worker[1]), args.dtype, args.threads, args.repeats, block,
            args.seed,
        )  # fmt: skip
        print(json.dumps(row))
        return 0
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    rows = []
    for n in (int(s) for s in args.n.split(",")):
        for path in ("stored", "streaming"):
            cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", path, str(n),
                   "--dtype", args.dtype, "--threads", str(args.threads),
                   "--repeats", str(args.repeats), "--seed", str(args.seed)]  # fmt: skip
            if block is not None:
                cmd += ["--block", args.block]
            res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
            if res.returncode != 0:
                print(res.stderr, file=sys.stderr)
                return res.returncode
            rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
    cols = ("linearize_s", "jvp_s", "vjp_s", "peak_mb", "stored_mb")
    print(f"d={D} H={H} k={K} causal, dtype={args.dtype}, threads={args.threads}")
    head = f"{'n':>6} {'path':>10} {'block':>10} " + " ".join(f"{c:>12}" for c in cols)
    print(head)
    for r in rows:
        blk = "-" if r["block"] is None else "x".join(map(str, r["block"]))
        print(f"{r['n']:>6} {r['path']:>10} {blk:>10} " + " ".join(f"{r[c]:>12.4g}" for c in cols))
        if r["path"] == "streaming":
            ref = next(s for s in rows if s["n"] == r["n"] and s["path"] == "stored")
            ratio = " ".join(f"{r[c] / ref[c] if ref[c] else float('nan'):>12.3g}" for c in cols)
            print(f"{r['n']:>6} {'ratio':>10} {'str/sto':>10} " + ratio)
            rel = max(
                abs(r[f"{p}_norm"] - ref[f"{p}_norm"]) / ref[f"{p}_norm"] for p in ("jvp", "vjp")
            )
            print(f"{'':>6} {'':>10} {'':>10} relative difference of the product norms: {rel:.2e}")
    if args.json:
        print(json.dumps(rows, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
