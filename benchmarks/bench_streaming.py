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

``--paths streaming`` measures the streaming path alone (the products at a length where the
stored matrices do not fit, e.g. ``--n 32768``).

``--estimate`` mode (issue 27 §3): each (path, n) runs in a fresh subprocess one *default
certified* call ``meanfield.local_lipschitz(X, params, masked=True, path=PATH)`` (width rule,
``upper_prob <= 1.05 * lower``; it solves in float64 even for float32 inputs) and records its
wall time, peak memory (``ru_maxrss`` over the resident size just before the call), ``value``,
``lower``, ``upper``, ``upper_prob``, ``ratio_prob``, ``n_matvec``, ``stop_rule``,
``converged`` and ``path``.

``--extrapolate EST PROD_SMALL PROD_BIG`` (no measurement): the time of a default certified
streaming call at the length of ``PROD_BIG`` (a ``--paths streaming`` products run) from an
estimate run ``EST`` and a products run ``PROD_SMALL`` at the estimate's length, same dtype;
see :func:`extrapolate`.

Usage::

    .venv/bin/python benchmarks/bench_streaming.py                  # n = 1024, 4096, float64
    .venv/bin/python benchmarks/bench_streaming.py --n 1024 --threads 1 --dtype float32
    .venv/bin/python benchmarks/bench_streaming.py --n 2048 --block 128,512 --json
    .venv/bin/python benchmarks/bench_streaming.py --n 32768 --paths streaming --threads 2
    .venv/bin/python benchmarks/bench_streaming.py --estimate --n 4096 --dtype float32 \\
        --threads 2 --out benchmarks/results/long_context_estimate_n4096_f32.json
"""

from __future__ import annotations

import argparse
import json
import math
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


def _block_bound(path: str, lin):
    """The deterministic upper bound of the path (seconds, value), as the certified call forms it."""
    import torch

    from meanfield import _rounding as rnd
    from meanfield.jacobian.streaming import streaming_magnitude
    from meanfield.lipschitz._certify import block_upper, streaming_block_upper
    from meanfield.lipschitz._operators import to_float64

    t0 = time.perf_counter()
    lin64 = to_float64(lin)
    if path == "stored":
        bound = block_upper(lin64, "euclidean", None)
    else:
        eps = rnd.streaming_error_model(streaming_magnitude(lin64)).eps_s
        bound = streaming_block_upper(lin64, eps, "euclidean")
    return time.perf_counter() - t0, float(bound.to(torch.float64))


def worker(
    path: str, n: int, dtype_name: str, threads: int, repeats: int, block, seed: int,
    bound: bool = False,
):  # fmt: skip
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
    block_s = block_upper = None
    if bound:
        block_s, block_upper = _block_bound(path, lin)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    return {
        "path": path,
        "n": n,
        "block_bound_s": block_s,
        "block_upper": block_upper,
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


def _inputs(n: int, dtype_name: str, seed: int):
    import torch

    dtype = getattr(torch, dtype_name)
    params, gen = _layer(dtype, seed)
    X = torch.nn.functional.layer_norm(torch.randn(n, D, generator=gen, dtype=dtype), (D,))
    return params, X, gen


def estimate_worker(path: str, n: int, dtype_name: str, threads: int, seed: int):
    """One default certified ``local_lipschitz`` call on the layer at ``n`` LayerNorm-ed tokens."""
    import torch

    import meanfield

    torch.set_num_threads(threads)
    params, X, _ = _inputs(n, dtype_name, seed)
    before = _rss_kb()
    t0 = time.perf_counter()
    est = meanfield.local_lipschitz(X, params, masked=True, path=path)
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before

    def num(t):
        return None if t is None else float(t)

    return {
        "mode": "estimate",
        "path_asked": path,
        "path": est.path,
        "n": n,
        "dtype": dtype_name,
        "threads": threads,
        "seed": seed,
        "wall_s": wall,
        "peak_mb": peak / 1024,
        "value": num(est.value),
        "lower": num(est.lower),
        "upper": num(est.upper),
        "upper_prob": num(est.upper_prob),
        "ratio_prob": num(est.ratio_prob),
        "n_matvec": int(est.n_matvec),
        "stop_rule": est.stop_rule,
        "converged": bool(est.converged),
        "width_reachable": None if est.width_reachable is None else bool(est.width_reachable),
    }


def _check_estimate(row) -> list[str]:
    """What looks wrong in an estimate row (a bracket that does not hold, a false convergence)."""
    bad = []
    if row["path"] != row["path_asked"]:
        bad.append(f"path {row['path']!r} returned for path={row['path_asked']!r}")
    up = row["upper_prob"]
    if up is not None and row["lower"] > up:
        bad.append(f"lower {row['lower']!r} > upper_prob {up!r}")
    if not row["lower"] <= row["value"] <= min(row["upper"], up if up is not None else math.inf):
        bad.append("value outside [lower, min(upper, upper_prob)]")
    rp = row["ratio_prob"]
    if row["converged"] and row["stop_rule"] == "width" and (rp is None or rp > 1.05 * (1 + 1e-12)):
        bad.append(f"converged on the width rule with ratio_prob {rp!r} > 1.05")
    return bad


def extrapolate(est: dict, small: dict, big: dict, n_target: int | None = None) -> dict:
    r"""Time of a default certified streaming call at a longer length, from shorter measurements.

    ``est`` is an estimate row at length :math:`n_0` (``--estimate``), ``small`` a streaming
    products row at :math:`n_0` and ``big`` one at :math:`n_1` (``--paths streaming``), all in
    the dtype the solve runs in (float64). With :math:`t_p = (t_{Jv} + t_{J^\top u})/2` and
    :math:`t_{\rm lin}` the linearisation:

    * extra passes of the call beyond its Krylov products, in products:
      :math:`c = (T_{\rm est} - t_{\rm lin}(n_0) - m\,t_p(n_0)) / t_p(n_0)`, :math:`m` its
      ``n_matvec`` (the magnitude products of the certificate, the logit-statistics pass, the
      solve's own overhead);
    * at :math:`n_1`: :math:`T = t_{\rm lin}(n_1) + (m + c)\,t_p(n_1)`, the same :math:`m`;
    * at ``n_target`` (between the two): :math:`t_p` and :math:`t_{\rm lin}` interpolated as
      power laws of :math:`n` through the two measurements.

    An extrapolation, not a measurement: it assumes the number of products does not grow with
    :math:`n` and that the machine's load is the same.
    """
    n0, n1 = small["n"], big["n"]
    if est["n"] != n0 or small["path"] != "streaming" or big["path"] != "streaming":
        raise ValueError("need an estimate and a streaming products row at its n, and a longer one")
    tp0 = (small["jvp_s"] + small["vjp_s"]) / 2
    tp1 = (big["jvp_s"] + big["vjp_s"]) / 2
    m = est["n_matvec"]
    c = (est["wall_s"] - small["linearize_s"] - m * tp0) / tp0
    out = {
        "mode": "extrapolation",
        "n0": n0,
        "n1": n1,
        "n_matvec": m,
        "product_s_n0": tp0,
        "linearize_s_n0": small["linearize_s"],
        "estimate_s_n0": est["wall_s"],
        "extra_passes": c,
        "product_s_n1": tp1,
        "linearize_s_n1": big["linearize_s"],
        "estimate_s_n1": big["linearize_s"] + (m + c) * tp1,
    }
    if n_target is not None:
        a_p = math.log(tp1 / tp0) / math.log(n1 / n0)
        a_l = math.log(big["linearize_s"] / small["linearize_s"]) / math.log(n1 / n0)
        r = n_target / n0
        tp, tl = tp0 * r**a_p, small["linearize_s"] * r**a_l
        out.update(
            n_target=n_target,
            exponent_product=a_p,
            exponent_linearize=a_l,
            product_s_target=tp,
            linearize_s_target=tl,
            estimate_s_target=tl + (m + c) * tp,
        )
    return out


def _run_worker(cmd, env):
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if res.returncode != 0:
        print(res.stderr, file=sys.stderr)
        return None, res.returncode
    return json.loads(res.stdout.strip().splitlines()[-1]), 0


def _print_estimates(rows, dtype, threads) -> None:
    print(f"d={D} H={H} k={K} causal, default certified call, dtype={dtype}, threads={threads}")
    cols = ("wall_s", "peak_mb", "value", "lower", "upper_prob", "ratio_prob")
    head = f"{'n':>6} {'path':>10} " + " ".join(f"{c:>11}" for c in cols)
    print(head + f" {'n_matvec':>8} {'stop':>8} {'conv':>5}")
    for r in rows:
        vals = " ".join(f"{r[c]:>11.6g}" if r[c] is not None else f"{'-':>11}" for c in cols)
        print(
            f"{r['n']:>6} {r['path']:>10} {vals} {r['n_matvec']:>8} {r['stop_rule']:>8} "
            f"{r['converged']!s:>5}"
        )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", default="1024,4096", help="comma-separated sequence lengths")
    ap.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--block", default=None, help="b_q,b_k of the streaming tiles (default rule)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--bound",
        action="store_true",
        help="also time the path's deterministic upper bound (the block certificate: analytic "
        "block norms on the stored path, the streamed structured bound on the streaming one)",
    )
    ap.add_argument("--json", action="store_true", help="also print the rows as JSON")
    ap.add_argument("--out", default=None, help="write the rows to this JSON file")
    ap.add_argument(
        "--paths", default="stored,streaming", help="comma-separated paths (stored, streaming)"
    )
    ap.add_argument(
        "--estimate",
        action="store_true",
        help="time one default certified local_lipschitz call per (path, n) instead of products",
    )
    ap.add_argument(
        "--extrapolate",
        nargs=3,
        metavar=("EST", "PROD_SMALL", "PROD_BIG"),
        help="extrapolate a streaming estimate's time from saved JSON rows (no measurement)",
    )
    ap.add_argument("--target-n", type=int, default=None, help="also interpolate to this n")
    ap.add_argument("--worker", nargs=2, metavar=("PATH", "N"), help=argparse.SUPPRESS)
    ap.add_argument("--estimate-worker", nargs=2, metavar=("PATH", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    block = None if args.block is None else tuple(int(b) for b in args.block.split(","))
    paths = tuple(args.paths.split(","))
    if args.extrapolate:
        est, small, big = (json.loads(Path(f).read_text()) for f in args.extrapolate)
        est = next(r for r in est if r["path"] == "streaming")
        small = next(r for r in small if r["path"] == "streaming" and r["n"] == est["n"])
        big = max((r for r in big if r["path"] == "streaming"), key=lambda r: r["n"])
        out = extrapolate(est, small, big, args.target_n)
        print(json.dumps(out, indent=1))
        if args.out:
            Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
        return 0
    if args.estimate_worker:
        row = estimate_worker(
            args.estimate_worker[0], int(args.estimate_worker[1]), args.dtype, args.threads,
            args.seed,
        )  # fmt: skip
        print(json.dumps(row))
        return 0
    if args.worker:
        row = worker(
            args.worker[0], int(args.worker[1]), args.dtype, args.threads, args.repeats, block,
            args.seed, args.bound,
        )  # fmt: skip
        print(json.dumps(row))
        return 0
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    rows = []
    if args.estimate:
        status = 0
        for n in (int(s) for s in args.n.split(",")):
            for path in paths:
                cmd = [sys.executable, str(Path(__file__).resolve()), "--estimate-worker", path,
                       str(n), "--dtype", args.dtype, "--threads", str(args.threads),
                       "--seed", str(args.seed)]  # fmt: skip
                row, rc = _run_worker(cmd, env)
                if row is None:
                    return rc
                row["problems"] = _check_estimate(row)
                rows.append(row)
                if row["problems"]:
                    print(f"n={n} path={path}: " + "; ".join(row["problems"]), file=sys.stderr)
                    status = 2
                if args.out:  # after each row, so that a stopped run keeps what it measured
                    Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
                if status:
                    break
            if status:
                break
        _print_estimates(rows, args.dtype, args.threads)
        if args.json:
            print(json.dumps(rows, indent=1))
        return status
    for n in (int(s) for s in args.n.split(",")):
        for path in paths:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", path, str(n),
                   "--dtype", args.dtype, "--threads", str(args.threads),
                   "--repeats", str(args.repeats), "--seed", str(args.seed)]  # fmt: skip
            if block is not None:
                cmd += ["--block", args.block]
            if args.bound:
                cmd += ["--bound"]
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
        if r.get("block_bound_s") is not None:
            per = r["block_bound_s"] / (r["jvp_s"] + r["vjp_s"]) * 2
            print(
                f"{'':>6} {'':>10} {'':>10} deterministic upper {r['block_upper']:.6g} in "
                f"{r['block_bound_s']:.3g} s ({per:.2g} products)"
            )
        if r["path"] == "streaming":
            ref = next((s for s in rows if s["n"] == r["n"] and s["path"] == "stored"), None)
            if ref is None:
                continue
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
