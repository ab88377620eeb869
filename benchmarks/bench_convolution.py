r"""Benchmark: Gram-iteration bounds for convolutional layers against the exact value and power
iteration (issue 14, item 3), at the sizes of Delattre et al. (ICML 2023): 64 channels, 3x3
kernels, 32x32 inputs.

For each random kernel (He initialisation, N(0, 2 / (c_in k^2)); one seed per row), in one
process and in this order:

``svd-circ``
    The exact circular norm: one SVD per frequency block (:math:`\max_\omega\|\hat K(\omega)\|_2`),
    blocks included. The reference for the circular rows.
``gram-circ-T``
    :func:`meanfield.convolution.conv2d_spectral_upper` (``padding="circular"``, ``n_iter=T``):
    certified upper bound; the time is split into the frequency blocks and Gram iteration
    (``gram``) and the Cholesky certificate (``cert``).
``lanczos-zeros``
    Golub–Kahan–Lanczos (:func:`meanfield._spectral.lanczos_svd`, residual tolerance 1e-10, at
    most ``--lanczos-iter`` steps) on the zero-padded layer (``F.conv2d(x, K, padding=1)`` and
    its adjoint ``conv_transpose2d``): a lower bound, and the reference for the zero-padded rows
    (the true norm lies between it and ``gram-zeros``; ``converged`` and the relative residual
    ``||J^T J v - s^2 v|| / s^2`` say how close it is).
``power-zeros-N``
    Plain power iteration on the same operator, exactly N iterations (two products each), from a
    Gaussian start: the baseline; a lower bound.
``gram-zeros-T``
    ``conv2d_spectral_upper(..., padding="zeros", n_iter=T)``: certified upper bound through the
    circular layer on the enlarged 33x33 grid.
``reshaped``
    :func:`meanfield.convolution.conv2d_reshaped_upper`: the input-size-free bound
    :math:`\sqrt{k_hk_w}\min_r\|R_r(K)\|_2` over four reshapes of the kernel (Singla and Feizi,
    2021), each norm certified by Gram iteration; compared with the zero-padded reference.

Ratios are ``value / reference`` and times are also given relative to ``svd-circ`` of the same
kernel, measured in the same process. Timings are the best of ``--repeat`` runs, one CPU thread
unless ``--threads`` says otherwise.

Usage::

    .venv/bin/python benchmarks/bench_convolution.py --seeds 0 1 2 --out benchmarks/results/convolution_cpu.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from meanfield._spectral import lanczos_svd, power_iteration  # noqa: E402
from meanfield.convolution import (  # noqa: E402
    conv2d_frequency_blocks,
    conv2d_operator,
    conv2d_reshaped_upper,
    conv2d_spectral_upper,
)


def _best(fn, repeat, dev):
    """``fn()`` and the best wall time of ``repeat`` calls, each timed up to a device sync."""
    best, out = math.inf, None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        _sync(dev)
        best = min(best, time.perf_counter() - t0)
    return out, best


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def _one_kernel(K, seed, args, dev, dtype) -> list[dict]:
    from meanfield.convolution import gram_iteration_complex

    n = args.size
    rows = []

    def add_row(name, value, reference, seconds, **extra):
        """Append one output row; ``reference=None`` marks the reference itself (ratio 1)."""
        ratio = 1.0 if reference is None else value / reference
        rows.append(dict(seed=seed, name=name, value=value, ratio=ratio, time=seconds, **extra))

    def svd_circ():
        blocks, _ = conv2d_frequency_blocks(K, n)
        return float(torch.linalg.matrix_norm(blocks, ord=2).max())

    exact_circ, t_svd = _best(svd_circ, args.repeat, dev)
    add_row("svd-circ", exact_circ, None, t_svd)

    for T in args.n_iter:

        def gram_only(T=T):
            blocks, _ = conv2d_frequency_blocks(K, n)
            work = blocks if dtype == torch.float64 else blocks.to(torch.complex64)
            return float(gram_iteration_complex(work, T).max())

        _, t_gram = _best(gram_only, args.repeat, dev)
        full = partial(conv2d_spectral_upper, K, n, padding="circular", n_iter=T)
        r, t_full = _best(full, args.repeat, dev)
        add_row(
            f"gram-circ-{T}",
            float(r.upper),
            exact_circ,
            t_full,
            time_gram=t_gram,
            time_cert=t_full - t_gram,
            certified=r.certified,
        )

    mv, rmv, n_in, _ = conv2d_operator(K, n, padding="zeros")
    g = torch.Generator().manual_seed(1000 + seed)
    x0 = torch.randn(n_in, generator=g, dtype=torch.float64).to(device=dev, dtype=dtype)

    lanczos = partial(
        lanczos_svd, mv, rmv, x0, tol=1e-10, max_iter=args.lanczos_iter, krylov_dim=64
    )
    ref, t_lan = _best(lanczos, 1, dev)
    ref_val = float(ref.sigma)
    add_row(
        "lanczos-zeros",
        ref_val,
        None,
        t_lan,
        n_matvec=int(ref.n_matvec),
        converged=bool(ref.converged),
        residual_rel=float(ref.residual) / ref_val**2,
    )
    for N in args.power_iters:
        power = partial(power_iteration, mv, rmv, x0, tol=0.0, max_iter=N)
        p, t_pow = _best(power, 1, dev)
        add_row(f"power-zeros-{N}", float(p.sigma), ref_val, t_pow)
    for T in args.n_iter:
        fullz = partial(conv2d_spectral_upper, K, n, padding="zeros", n_iter=T)
        r, t_z = _best(fullz, args.repeat, dev)
        add_row(
            f"gram-zeros-{T}",
            float(r.upper),
            ref_val,
            t_z,
            certified=r.certified,
            grid=list(r.grid),
        )

    reshaped, t_r = _best(partial(conv2d_reshaped_upper, K), args.repeat, dev)
    add_row("reshaped", float(reshaped), ref_val, t_r)
    for row in rows:
        row["time_vs_svd"] = row["time"] / t_svd
        print(
            f"seed {seed} {row['name']:>16s} value {row['value']:.10f} "
            f"ratio-1 {row['ratio'] - 1:+.2e} time {row['time']:.3f}s "
            f"({row['time_vs_svd']:.2f} x svd)",
            flush=True,
        )
    return rows


def run(args) -> list[dict]:
    dev = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    c, k = args.channels, args.kernel
    rows = []
    for seed in args.seeds:
        g = torch.Generator().manual_seed(seed)
        K = torch.randn(c, c, k, k, generator=g, dtype=torch.float64) * math.sqrt(2 / (c * k * k))
        rows += _one_kernel(K.to(device=dev, dtype=dtype), seed, args, dev, dtype)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--channels", type=int, default=64)
    ap.add_argument("--kernel", type=int, default=3)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--n-iter", type=int, nargs="+", default=[4, 6, 8])
    ap.add_argument("--power-iters", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--lanczos-iter", type=int, default=3000)
    ap.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = run(args)
    options = ("channels", "kernel", "size", "dtype", "device", "threads")
    meta = {
        **{k: getattr(args, k) for k in options},
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
    }
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))


if __name__ == "__main__":
    main()
