r"""Benchmark: the local Lipschitz constant of a GPT-2-shaped attention layer (issue 3, item 5).

What is compared, at each sequence length ``n`` and in the same run (see ``benchmarks/README.md``):

``ours``
    :func:`meanfield.local_lipschitz` with ``method="lanczos"`` (Golub–Kahan–Lanczos on
    :math:`J^\top J` with the closed-form products of :mod:`meanfield.jacobian`) and the certified
    block-norm upper bound (``upper="block"``): the full cost of a bracketed estimate.
``ours-nocert``
    The same estimate without the upper certificate (``upper="none"``): the like-for-like
    comparison with the baseline, which has no certificate either.
``power``
    The baseline (a): power iteration on :math:`J^\top J` with ``torch.func.jvp`` (its **tangent**
    output) and ``torch.func.vjp`` of the pure map :func:`meanfield.attention.self_attention`, as
    the authors' released ``loc_lipschitz`` (docs/experiments.md, "Defects of the released
    code") but with defect D1 fixed and a relative stopping rule
    :math:`|\sigma^2_k-\sigma^2_{k-1}|\le10^{-4}\sigma^2_k`, :math:`\sigma^2_k = \|J^\top Ju_k\|` for the unit iterate :math:`u_k` (the released estimate),
    at most 1000 iterations. It is implemented here, independently of our products. The pullback
    of ``vjp`` is built once per input (cheaper than rebuilding it every iteration).
``dense``
    Baseline (b): the Jacobian by ``torch.func.jacrev`` and its largest singular value
    (``torch.linalg.matrix_norm(J, 2)``), where :math:`(nd)^2` float64 entries fit.
``ref``
    A long, high-accuracy Lanczos run (residual tolerance ``--ref-tol``) that serves as the
    reference value where the dense SVD does not fit.
``streaming`` (issue 27)
    The default certified call on the streaming path, ``local_lipschitz(X, params, masked=True,
    path="streaming")``: the attention tiles are recomputed from the head rows, memory
    :math:`O(Hnd)`; the record holds ``lower``, ``upper_prob`` and the path used. It is the only
    method of ours that reaches :math:`n = 65536` (on a GPU).
``streaming-probe``
    Its cost model: one streaming linearisation, one :math:`Jv` and one :math:`J^\top u`.
``arpack`` (``--arpack``, issue 23)
    Baseline (c): ``scipy.sparse.linalg.svds(k=1, solver="arpack")`` on a ``LinearOperator``
    whose products are ``torch.func.jvp`` (tangent) and the ``torch.func.vjp`` pullback of the
    same pure map as ``power``, in the dtype of the input, against the default certified call
    ``local_lipschitz(X, params, masked=True, method="lanczos")``. Its ``tol`` is the loosest of
    :data:`ARPACK_TOLS` whose error against a float64 reference (Lanczos, residual ``1e-10``) is
    at most the default call's; one thread for torch and for BLAS (``OMP/OPENBLAS/MKL_NUM_THREADS``
    in the worker's environment); a cProfile of one default call up to ``--profile-max-n``.

The layer is GPT-2 small's first attention layer at its random initialisation
(:func:`meanfield.models.random_gpt2`, seed ``--seed``; weights :math:`\mathcal N(0, 0.02^2)`,
``c_proj`` :math:`\mathcal N(0, 0.02^2/24)`, zero biases), with its output projection
(``map="heads+WO"``) and the causal mask, as ``GPT2Attention``. Inputs are LayerNorm-ed standard
Gaussian tokens, like the ``ln_1`` outputs that enter GPT-2's attention (token norm
:math:`\sqrt d`).

Each (method, n) runs in a fresh subprocess, so that its peak resident memory can be measured as
the increase of ``ru_maxrss`` over the resident size just before the measured call (on CUDA,
``torch.cuda.max_memory_allocated``). The cost in forward-pass equivalents divides the wall time
by the median time of one evaluation of the same map at the same ``n`` (no autograd).

The real-data workload (docs/experiments.md, "The paper's experiments": 10 sequences for each
even ``n`` from 2 to 98, d = 768) compares one batched :func:`~meanfield.local_lipschitz` call per ``n`` on a (10, n, d)
batch with one-by-one calls of ours and of the baseline.

Usage::

    .venv/bin/python benchmarks/bench_jacobian.py                       # full run, CPU
    .venv/bin/python benchmarks/bench_jacobian.py --quick               # seconds
    .venv/bin/python benchmarks/bench_jacobian.py --n 4096 --no-workload --out benchmarks/results/n4096.json
    .venv/bin/python benchmarks/bench_jacobian.py --device cuda
    .venv/bin/python benchmarks/bench_jacobian.py --device cuda --dtype float32 --no-workload \
        --methods streaming,streaming-probe,power --n 1024,4096,16384,65536 --dense-n ""

The autograd baseline ``power`` and the stored methods (``ours``, ``ours-nocert``, ``ref``,
``probe-ours``) keep every head's :math:`n\times n` matrices; they are skipped, with the reason
recorded, where :func:`stored_bytes` exceeds ``--memory-budget`` (default: half the device's
memory on CUDA, half the machine's on the CPU). The forward-pass time that normalises the cost
is then measured with query chunks.
    .venv/bin/python benchmarks/bench_jacobian.py --arpack --n 256,1024 --threads 1 --repeats 3

Every run writes one JSON document (``--out``) with the run metadata, the machine (CPU model,
threads, load average before and after) and every measurement; ``--json`` also prints it.

This file is over 800 lines on purpose: the benchmark is run as one script and re-executes
itself (``--worker``) in a fresh subprocess per measurement for clean peak-memory readings, so its
baseline, measurement, machine description and reporting stay in one self-contained file.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

D_MODEL = 768
N_HEADS = 12
#: Largest n * d for the dense Jacobian: (n d)^2 float64 entries (0.3 GB at 6144) plus the SVD.
DENSE_MAX_ND = 6144
#: Query-block size passed to the matrix-free products (None: the library's default, query
#: blocks of 64 for causal sequences, which bound the intermediates to O(64 n) per head; the
#: first measurements used 512 above n = 512).
CHUNK = None
#: The environment variables that size the BLAS/OpenMP pools of numpy and scipy (``--arpack``).
BLAS_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


# =============================================================================== worker side
def _rss_bytes() -> int:
    """Current resident set size (Linux ``/proc``; falls back to ``ru_maxrss``)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return _maxrss_bytes()


def _reset_peak_rss() -> bool:
    """Reset the process's peak RSS (``VmHWM``; Linux >= 4.0). Return whether it worked."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _peak_rss_bytes() -> int:
    """Peak RSS since the last reset (``VmHWM``), else ``ru_maxrss`` (peak since start)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return _maxrss_bytes()


def _maxrss_bytes() -> int:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024


def load_layer(path: str | Path, dtype: str, device: str):
    """The layer's :class:`~meanfield.MultiHeadParams` from the weights saved by the parent."""
    import numpy as np
    import torch

    from meanfield.params import MultiHeadParams

    with np.load(path, allow_pickle=False) as z:
        w = {k: torch.from_numpy(z[k]).to(device, getattr(torch, dtype)) for k in z.files}
    W_q, W_k, W_v = w["c_attn_w"].split(D_MODEL, dim=1)
    b_q, b_k, b_v = w["c_attn_b"].split(D_MODEL)
    return MultiHeadParams.from_qkv(
        W_q,
        W_k,
        W_v,
        w["c_proj_w"],
        n_heads=N_HEADS,
        b_Q=b_q,
        b_K=b_k,
        b_V=b_v,
        b_O=w["c_proj_b"],
        layout="conv1d",
        scale=float(w["scale"]),
    )


def make_inputs(n: int, batch: int | None, seed: int, dtype: str, device: str):
    """LayerNorm-ed standard Gaussian tokens, shape (n, d) or (batch, n, d), seeded by (seed, n)."""
    import torch

    g = torch.Generator().manual_seed(1_000_003 * int(seed) + int(n))
    shape = (n, D_MODEL) if batch is None else (batch, n, D_MODEL)
    Z = torch.randn(shape, generator=g, dtype=torch.float64)
    X = torch.nn.functional.layer_norm(Z, (D_MODEL,))
    return X.to(dtype=getattr(torch, dtype), device=device)


#: Methods that keep every head's n x n matrices (the stored linearisation, autograd, dense).
STORED_METHODS = ("ours", "ours-nocert", "ref", "probe-ours", "power", "power-acc", "probe-power")


def stored_bytes(n: int, dtype: str) -> int:
    """Working set of a method that stores the attention: about 6 ``(H, n, n)`` arrays.

    The stored linearisation keeps the weights ``P`` and a few tiles of the same size per product
    (docs/long_context.md); autograd keeps the logits, ``P`` and their cotangents. Six arrays of
    the compute dtype is the rule used to skip a method before it runs out of memory; the peak
    actually reached is measured and recorded.
    """
    itemsize = 4 if dtype == "float32" else 8
    return 6 * N_HEADS * n * n * itemsize


def forward_chunk(n: int, dtype: str, budget: int) -> int | None:
    """Query-chunk size of the timed forward pass: ``None`` (unchunked) where it fits ``budget``."""
    itemsize = 4 if dtype == "float32" else 8
    if 3 * N_HEADS * n * n * itemsize <= budget:
        return None
    return max(64, int(budget // (3 * N_HEADS * n * itemsize)))


def default_memory_budget(device: str) -> int:
    """Half the device's memory (CUDA) or half the machine's (CPU), in bytes."""
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_properties(device).total_memory // 2
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _progress(message: str) -> None:
    """A progress line on stderr, flushed at once (the result goes to stdout)."""
    print(message, file=sys.stderr, flush=True)


def _timed(device: str, fn, *args, **kwargs) -> tuple[float, Any]:
    """Seconds of ``fn(*args, **kwargs)`` between two device syncs, and its result."""
    _sync(device)
    t0 = time.perf_counter()
    res = fn(*args, **kwargs)
    _sync(device)
    return time.perf_counter() - t0, res


def _rounds(dtypes: list[str], repeats: int, methods):
    """The alternated, rotated rounds of the side-by-side and ARPACK modes.

    Each of ``repeats`` rounds visits the dtypes (their order alternating between rounds) and runs
    the ``(name, fn)`` pairs of ``methods`` for each (their order rotating by one per round);
    ``fn(dt)`` returns ``(seconds, result)``. Yields ``(round, dtype, row)``, ``row`` mapping each
    name to its result with ``"seconds"`` set.
    """
    for r in range(max(1, repeats)):
        for dt in dtypes if r % 2 == 0 else dtypes[::-1]:
            k = r % len(methods)
            row: dict[str, Any] = {}
            for name, fn in methods[k:] + methods[:k]:
                sec, res = fn(dt)
                res["seconds"] = sec
                row[name] = res
            yield r, dt, row


def power_baseline(
    f, X, *, tol: float = 1e-4, max_iter: int = 1000, seed: int = 0, time_cap: float | None = None
) -> dict[str, Any]:
    r"""Baseline (a): power iteration on :math:`J^\top J` with ``torch.func`` products.

    :math:`w_k = J^\top(Ju_k)` with :math:`Ju_k` the tangent output of ``torch.func.jvp`` and the
    pullback of ``torch.func.vjp``; :math:`\sigma^2_k = \|w_k\|` (unit :math:`u_k`); stop when
    :math:`|\sigma^2_k-\sigma^2_{k-1}|\le\mathrm{tol}\,\sigma^2_k` or after ``max_iter`` iterations
    or when ``time_cap`` seconds have elapsed; :math:`u_{k+1} = w_k/\|w_k\|`.

    Returns
    -------
    dict
        ``value`` (:math:`\sigma_k`), ``n_iter``, ``n_products`` (two per iteration),
        ``converged``, ``stopped_by_time_cap``, ``history`` (:math:`\sigma_k` per iteration).
    """
    import torch
    import torch.func as tfunc

    g = torch.Generator().manual_seed(int(seed))
    u = torch.randn(X.shape, generator=g, dtype=torch.float64).to(X)
    u = u / torch.linalg.vector_norm(u)
    _, pullback = tfunc.vjp(f, X)
    prev = None
    hist: list[float] = []
    converged = capped = False
    t0 = time.perf_counter()
    for _ in range(max_iter):
        Ju = tfunc.jvp(f, (X,), (u,))[1]  # the tangent (defect D1: the released code took [0])
        w = pullback(Ju)[0]
        s2 = float(torch.linalg.vector_norm(w))
        hist.append(math.sqrt(s2))
        if prev is not None and abs(s2 - prev) <= tol * s2:
            converged = True
            break
        if time_cap is not None and time.perf_counter() - t0 > time_cap:
            capped = True
            break
        prev = s2
        u = w / s2
    return {
        "value": hist[-1],
        "n_iter": len(hist),
        "n_products": 2 * len(hist),
        "converged": converged,
        "stopped_by_time_cap": capped,
        "history": hist,
    }


def _forward_time(f, X, device: str, repeats: int = 7) -> float:
    """Shortest wall time of one evaluation of ``f`` at ``X`` (no autograd), after a warm-up.

    The minimum over repeats is the least sensitive statistic to other processes' load.
    """
    import torch

    with torch.no_grad():
        f(X)
        return min(_timed(device, f, X)[0] for _ in range(repeats))


def _estimate_doc(est) -> dict[str, Any]:
    """The fields of one estimate (not a batch) as plain numbers."""
    return {
        "value": est.value.double().item(),
        "lower": est.lower.double().item(),
        "upper": est.upper.double().item(),
        "converged": est.converged.item(),
        "n_products": est.n_matvec.item(),
        "n_iter": est.n_iter.item(),
        "residual_rel": (est.residual.double() / est.value.double().square()).item(),
        "upper_prob": None if est.upper_prob is None else est.upper_prob.double().item(),
        "path": est.path,
    }


def _probe(lin, jvp, vjp, spec, n, dt, dev, t0) -> dict[str, Any]:
    """Seconds of the linearisation ``lin`` (made since ``t0``) and of one ``jvp`` and ``vjp``."""
    _sync(dev)
    out: dict[str, Any] = {"linearize_seconds": time.perf_counter() - t0}
    V = make_inputs(n, None, spec["seed"] + 1, dt, dev)
    out["jvp_seconds"], U = _timed(dev, jvp, lin, V)
    out["vjp_seconds"], _ = _timed(dev, vjp, lin, U)
    return {**out, "value": math.nan, "n_products": 2}


def _measure(spec, method, params, X, f, dev, dt, n, *, measure_memory):
    """One timed call of ``method``; peak memory over the call when ``measure_memory``."""
    import torch
    import torch.func as tfunc

    from meanfield.lipschitz import local_lipschitz

    if dev.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base_mem = torch.cuda.memory_allocated()
    reset = _reset_peak_rss()
    rss0 = _rss_bytes()
    t0 = time.perf_counter()
    out: dict[str, Any] = {"method": method, "n": n}
    if method in ("ours", "ours-nocert", "ref"):
        est = local_lipschitz(
            X,
            params,
            masked=True,
            method="lanczos",
            tol=spec["ref_tol"] if method == "ref" else spec["tol"],
            max_iter=spec.get("max_iter", 300) if method != "ref" else 2000,
            krylov_dim=spec.get("krylov_dim", 32) if method != "ref" else 64,
            upper="block" if method == "ours" else "none",
            chunk_size=CHUNK,
            seed=spec["seed"],
        )
        out.update(_estimate_doc(est))
    elif method == "streaming":
        est = local_lipschitz(X, params, masked=True, path="streaming", seed=spec["seed"])
        out.update(_estimate_doc(est))
    elif method == "streaming-probe":
        from meanfield.jacobian import linearize_streaming, streaming_jvp, streaming_vjp

        lin = linearize_streaming(X, params, masked=True)
        out.update(_probe(lin, streaming_jvp, streaming_vjp, spec, n, dt, dev, t0))
    elif method in ("power", "power-acc", "probe-power"):
        # probe-power: the cost of one baseline iteration (one jvp and one vjp through autograd)
        res = power_baseline(
            f,
            X,
            tol=spec["power_acc_tol"] if method == "power-acc" else spec["power_tol"],
            max_iter=1 if method == "probe-power" else 1000,
            seed=spec["seed"],
            time_cap=None if method == "probe-power" else spec.get("time_cap"),
        )
        out.update(res)
        if method == "probe-power":
            out["value"] = math.nan
    elif method == "dense":
        Xf = X.reshape(-1)

        def flat(v):
            return f(v.reshape(X.shape)).reshape(-1)

        J = tfunc.jacrev(flat)(Xf)
        value = torch.linalg.matrix_norm(J.double(), ord=2)
        out.update(value=float(value), n_products=0, converged=True, jacobian_shape=list(J.shape))
        del J
    elif method == "probe-ours":
        # cost model of ours at large n: one linearization plus one J and one J^T product
        from meanfield.jacobian import jvp, linearize, vjp

        lin = linearize(X, params, masked=True, chunk_size=CHUNK)
        out.update(_probe(lin, jvp, vjp, spec, n, dt, dev, t0))
    else:
        raise ValueError(f"unknown method {method!r}")
    _sync(dev)
    out["seconds"] = time.perf_counter() - t0
    if not measure_memory:
        return out
    if dev.startswith("cuda"):
        out["peak_mem_bytes"] = torch.cuda.max_memory_allocated() - base_mem
        out["peak_mem_kind"] = "torch.cuda.max_memory_allocated - allocated before"
    else:
        peak = _peak_rss_bytes()
        out["peak_mem_bytes"] = max(0, peak - rss0)
        out["peak_mem_kind"] = (
            "VmHWM (reset before the call) - RSS before the call"
            if reset
            else "ru_maxrss - RSS before the call (fresh process; an upper bound)"
        )
    return out


def _run_single(spec: dict[str, Any]) -> dict[str, Any]:
    """One (method, n) measurement; called in a fresh subprocess."""
    import torch

    from meanfield.attention import self_attention
    from meanfield.lipschitz import local_lipschitz

    torch.set_num_threads(spec["threads"])
    dev, dt, n, method = spec["device"], spec["dtype"], spec["n"], spec["method"]
    params = load_layer(spec["layer"], dt, dev)
    X = make_inputs(n, None, spec["seed"], dt, dev)
    f = functools.partial(self_attention, params=params, masked=True)
    # warm-up on a tiny input (kernel selection, lazy imports) outside the measurement
    # (for "ours" this includes the one-off, cached certification of the weight norms)
    Xw = make_inputs(4, None, spec["seed"], dt, dev)
    t_setup = time.perf_counter()
    if method.startswith("streaming"):
        local_lipschitz(Xw, params, masked=True, path="streaming")
    else:
        up = "block" if method == "ours" else "none"
        local_lipschitz(Xw, params, masked=True, method="lanczos", tol=1e-2, upper=up)
        power_baseline(f, Xw, max_iter=3)
    t_setup = time.perf_counter() - t_setup
    repeats = max(1, int(spec.get("repeats", 1)))
    runs = [
        _measure(spec, method, params, X, f, dev, dt, n, measure_memory=r == 0)
        for r in range(repeats)
    ]
    out = runs[0]
    times = [r["seconds"] for r in runs]
    out.update(seconds_all=times, seconds=min(times), setup_seconds=t_setup)
    fwd_chunk = forward_chunk(n, dt, spec["memory_budget"])
    out["forward_chunk"] = fwd_chunk
    out["forward_seconds"] = _forward_time(functools.partial(f, chunk_size=fwd_chunk), X, dev)
    out["forward_equivalents"] = out["seconds"] / out["forward_seconds"]
    if dev.startswith("cuda"):
        out["cuda_max_memory_allocated_bytes"] = torch.cuda.max_memory_allocated()
    return out


def _run_workload(spec: dict[str, Any]) -> dict[str, Any]:
    """The real-data workload for one method; called in a fresh subprocess."""
    import torch

    from meanfield.attention import self_attention
    from meanfield.lipschitz import local_lipschitz

    torch.set_num_threads(spec["threads"])
    dev, dt, method = spec["device"], spec["dtype"], spec["method"]
    params = load_layer(spec["layer"], dt, dev)
    B = spec["sequences"]
    inputs = {n: make_inputs(n, B, spec["seed"], dt, dev) for n in spec["ns"]}
    f = functools.partial(self_attention, params=params, masked=True)
    kw = dict(
        masked=True, method="lanczos", tol=spec["tol"], upper=spec["upper"], seed=spec["seed"]
    )
    local_lipschitz(inputs[spec["ns"][0]], params, **kw)  # warm-up
    per_n, values, products = [], [], []
    cap = spec.get("time_cap")
    t_start = time.perf_counter()
    for n in spec["ns"]:
        X = inputs[n]
        t = time.perf_counter()
        if method == "ours-batched":
            est = local_lipschitz(X, params, **kw)
            vals, prods = est.value.double().tolist(), est.n_matvec.tolist()
        elif method == "ours-single":
            ests = [local_lipschitz(X[b], params, **kw) for b in range(B)]
            vals = [float(e.value) for e in ests]
            prods = [int(e.n_matvec) for e in ests]
        elif method == "power-single":
            res = [
                power_baseline(f, X[b], tol=spec["power_tol"], seed=spec["seed"]) for b in range(B)
            ]
            vals = [r["value"] for r in res]
            prods = [r["n_products"] for r in res]
        else:
            raise ValueError(f"unknown workload method {method!r}")
        _sync(dev)
        per_n.append(time.perf_counter() - t)
        values.append(vals)
        products.append(prods)
        if cap is not None and time.perf_counter() - t_start > cap:
            break
    return {
        "method": method,
        "ns": spec["ns"][: len(per_n)],
        "complete": len(per_n) == len(spec["ns"]),
        "seconds_per_n": per_n,
        "seconds": sum(per_n),
        "values": values,
        "n_products": products,
    }


def _layer_inputs_and_reference(spec: dict[str, Any]):
    """The layer, inputs and maps of each dtype, and the float64 reference run (one thread count).

    Shared by the side-by-side and ARPACK modes: ``(dtypes, params, X, fns, reference)``, with
    ``reference`` the value, relative residual, products and seconds of a float64 Lanczos run to
    residual ``spec["ref_tol"]``.
    """
    import torch

    from meanfield.attention import self_attention
    from meanfield.lipschitz import local_lipschitz

    torch.set_num_threads(spec["threads"])
    dev, n = spec["device"], spec["n"]
    dtypes = spec.get("dtypes", ["float32", "float64"])
    params = {dt: load_layer(spec["layer"], dt, dev) for dt in dtypes}
    X64 = make_inputs(n, None, spec["seed"], "float64", dev)
    X = {dt: X64.to(getattr(torch, dt)) for dt in dtypes}
    fns = {dt: functools.partial(self_attention, params=params[dt], masked=True) for dt in dtypes}
    p64 = params.get("float64") or load_layer(spec["layer"], "float64", dev)
    t = time.perf_counter()
    ref = local_lipschitz(
        X64,
        p64,
        masked=True,
        method="lanczos",
        tol=spec["ref_tol"],
        max_iter=2000,
        krylov_dim=64,
        upper="none",
        delta=None,
    )
    reference = {
        "value": float(ref.value),
        "residual_rel": float(ref.residual / ref.value**2),
        "n_products": int(ref.n_matvec),
        "seconds": time.perf_counter() - t,
    }
    return dtypes, params, X, fns, reference


def _run_side_by_side(spec: dict[str, Any]) -> dict[str, Any]:
    """Ours against the baseline at one n, float32 and float64, alternated and repeated.

    One process: the layer and the inputs in both dtypes (the float32 input is the rounded
    float64 one), a float64 reference (long Lanczos run), the forward time of each dtype, then
    ``repeats`` rounds; each round times, for each dtype, ``ours`` (``local_lipschitz``,
    ``upper="none"``, default ``delta`` so its ``upper_prob`` comes along), ``estimate`` (the
    same call with ``certify=False``: the estimate alone, like the baseline), ``estimate_kron``
    (the estimate alone from ``start="kronecker"``) and the baseline, the order of the dtypes
    alternating and that of the four methods rotating between rounds.
    The ratio of each round is baseline time / ours time of the same dtype in that round, so a
    load change between rounds cancels out; the median and the minimum over rounds are
    reported.
    """
    import statistics

    from meanfield.lipschitz import local_lipschitz

    dev, n = spec["device"], spec["n"]
    dtypes, params, X, fns, reference = _layer_inputs_and_reference(spec)
    ref_value = reference["value"]
    out: dict[str, Any] = {"kind": "side-by-side", "n": n, "reference": reference}

    def ours(dt, certify=True, start=None):
        sec, est = _timed(
            dev,
            local_lipschitz,
            X[dt],
            params[dt],
            masked=True,
            method="lanczos",
            tol=spec["tol"],
            max_iter=spec.get("max_iter", 300),
            upper="none",
            seed=spec["seed"],
            certify=certify,
            start=start,
        )
        return sec, {
            "value": float(est.value),
            "lower": float(est.lower),
            "upper_prob": None if est.upper_prob is None else float(est.upper_prob),
            "n_products": int(est.n_matvec),
            "converged": bool(est.converged),
        }

    def base(dt):
        sec, res = _timed(
            dev,
            power_baseline,
            fns[dt],
            X[dt],
            tol=spec["power_tol"],
            seed=spec["seed"],
            time_cap=spec.get("time_cap"),
        )
        res.pop("history")
        return sec, res

    for dt in dtypes:  # warm-up (kernel selection, cached weight norms) on a short input
        local_lipschitz(X[dt][:8], params[dt], masked=True, method="lanczos", tol=1e-2)
        power_baseline(fns[dt], X[dt][:8], max_iter=3)
    per: dict[str, Any] = {
        dt: {"forward_seconds": _forward_time(fns[dt], X[dt], dev), "rounds": []} for dt in dtypes
    }
    # ours with its certified lower end, the estimate alone (certify=False) from the
    # random and from the Kronecker start, the baseline; the order rotates by round
    methods = [
        ("ours", ours),
        ("estimate", functools.partial(ours, certify=False)),
        ("estimate_kron", functools.partial(ours, certify=False, start="kronecker")),
        ("power", base),
    ]
    # each estimate's key in a round's row for the baseline's time over its own
    ratio_keys = {m: "ratio" if m == "ours" else f"ratio_{m}" for m, _ in methods if m != "power"}
    for r, dt, row in _rounds(dtypes, int(spec.get("repeats", 3)), methods):
        for res in row.values():
            res["rel_error"] = (res["value"] - ref_value) / ref_value
        for name, key in ratio_keys.items():
            row[key] = row["power"]["seconds"] / row[name]["seconds"]
        per[dt]["rounds"].append(row)
        _progress(
            f"  n={n} {dt} round {r}: ours {row['ours']['seconds']:.3f} s "
            f"({row['ours']['n_products']} products, err {row['ours']['rel_error']:.1e}), "
            f"estimate alone {row['estimate']['seconds']:.3f} s, from the Kronecker start "
            f"{row['estimate_kron']['seconds']:.3f} s ({row['estimate_kron']['n_products']} "
            f"products, err {row['estimate_kron']['rel_error']:.1e}), "
            f"power {row['power']['seconds']:.3f} s ({row['power']['n_products']} products, "
            f"err {row['power']['rel_error']:.1e}), ratios {row['ratio']:.2f}, "
            f"{row['ratio_estimate']:.2f}, {row['ratio_estimate_kron']:.2f}",
        )
    for dt in dtypes:
        rounds, fw, doc = per[dt]["rounds"], per[dt]["forward_seconds"], per[dt]
        t = {m: min(row[m]["seconds"] for row in rounds) for m, _ in methods}
        for m, key in ratio_keys.items():  # ours' keys have no prefix
            prefix = "" if m == "ours" else f"{m}_"
            ratios = [row[key] for row in rounds]
            doc[f"{prefix}ratio_median"] = statistics.median(ratios)
            doc[f"{prefix}ratio_min"] = min(ratios)
        doc["ratio_of_minima"] = t["power"] / t["ours"]
        for m, _ in methods:
            doc[f"{m}_seconds_min"] = t[m]
            doc[f"{m}_forward_equivalents"] = t[m] / fw
            if m != "estimate":  # the estimate from the random start: its times only
                doc[f"{m}_products"] = sorted({row[m]["n_products"] for row in rounds})
                doc[f"{m}_max_abs_rel_error"] = max(abs(row[m]["rel_error"]) for row in rounds)
    out["dtypes"] = per
    return out


#: Tolerances tried for the ARPACK baseline, loosest first (issue 23).
ARPACK_TOLS = (1e-1, 3e-2, 1e-2, 3e-3, 1e-3, 3e-4, 1e-4, 3e-5, 1e-5, 3e-6, 1e-6, 1e-7, 1e-8)
#: Functions whose cumulative time the profile of one default call reports (issue 23).
PROFILED = tuple(
    "local_lipschitz linearize to_float64 relinearize solve certify_solution error_model "
    "magnitude_linearization magnitude_norm_upper magnitude_vector_norm golub_kahan_certified "
    "lanczos_polynomial_upper probabilistic_upper width_rule float64_residual_ok block_upper "
    "block_norm_bounds jvp vjp".split()
)


def arpack_baseline(
    f, X, *, tol: float, seed: int = 0, vectors: bool | str = False, maxiter: int | None = None
) -> dict[str, Any]:
    r"""Baseline (c): ``scipy.sparse.linalg.svds(k=1, solver="arpack")`` on ``torch.func`` products.

    A :class:`~scipy.sparse.linalg.LinearOperator` of shape :math:`(n d_{out}, n d)` whose
    ``matvec`` is the tangent output of ``torch.func.jvp`` and whose ``rmatvec`` is the pullback
    of ``torch.func.vjp`` (built once per input, as for ``power``), numpy <-> torch in the dtype
    of ``X``. ``svds`` runs ARPACK (``eigsh``, tolerance ``tol**2``) on :math:`J^\top J`, then one
    more :math:`J` product for :math:`\sigma`. The start ``v0`` is the seeded Gaussian vector of
    ``power``. ``vectors``: ``return_singular_vectors`` (``False`` or ``"vh"``).
    """
    import numpy as np
    import scipy.sparse.linalg as sla
    import torch
    import torch.func as tfunc

    shape = X.shape
    N = X.numel()
    count = {"jvp": 0, "vjp": 0}
    _, pullback = tfunc.vjp(f, X)

    def matvec(x):
        count["jvp"] += 1
        u = torch.from_numpy(np.ascontiguousarray(x, dtype=np_dt).reshape(shape)).to(X.device)
        return tfunc.jvp(f, (X,), (u,))[1].reshape(-1).cpu().numpy()

    def rmatvec(y):
        count["vjp"] += 1
        g = torch.from_numpy(np.ascontiguousarray(y, dtype=np_dt).reshape(f_shape)).to(X.device)
        return pullback(g)[0].reshape(-1).cpu().numpy()

    np_dt = np.float32 if X.dtype == torch.float32 else np.float64
    f_shape = shape  # self_attention maps (n, d) to (n, d)
    g = torch.Generator().manual_seed(int(seed))
    v0 = torch.randn(shape, generator=g, dtype=torch.float64).reshape(-1).numpy().astype(np_dt)
    op = sla.LinearOperator((N, N), matvec=matvec, rmatvec=rmatvec, dtype=np_dt)
    converged = True
    try:
        out = sla.svds(
            op,
            k=1,
            tol=tol,
            solver="arpack",
            v0=v0,
            return_singular_vectors=vectors,
            maxiter=maxiter,
        )
        s = out if vectors is False else out[1]
        value = float(np.max(s))
    except sla.ArpackNoConvergence as err:  # the Ritz value so far
        converged = False
        value = float(math.sqrt(max(err.eigenvalues))) if len(err.eigenvalues) else float("nan")
    return {
        "value": value,
        "n_jvp": count["jvp"],
        "n_vjp": count["vjp"],
        "n_products": count["jvp"] + count["vjp"],
        "converged": converged,
    }


def _profile_default(call) -> dict[str, Any]:
    """cProfile of one call: cumulative seconds and calls of :data:`PROFILED` (meanfield only),
    and, for ``jvp``/``vjp``, the split by calling function."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.runcall(call)
    total = time.perf_counter() - t
    st = pstats.Stats(prof).stats  # {(file, line, name): (cc, nc, tt, ct, callers)}
    funcs: dict[str, Any] = {}
    for (file, _line, name), (_cc, nc, _tt, ct, callers) in st.items():
        if "meanfield" not in file or name not in PROFILED:
            continue
        key = f"{Path(file).parent.name}/{Path(file).name}:{name}"
        doc = {"cumulative_s": ct, "calls": nc}
        if name in ("jvp", "vjp"):
            doc["by_caller"] = {
                f"{Path(cf).name}:{cn}": {"cumulative_s": c[3], "calls": c[1]}
                for (cf, _cl, cn), c in callers.items()
            }
        funcs[key] = doc
    return {"seconds_profiled": total, "functions": funcs}


def _run_arpack(spec: dict[str, Any]) -> dict[str, Any]:
    """Issue 23: the default certified call against ARPACK on ``torch.func`` products, at one n.

    One process, one thread: a float64 reference (Lanczos, residual ``ref_tol``); per dtype the
    default call ``local_lipschitz(X, params, masked=True, method="lanczos")``, a sweep of
    ARPACK's ``tol`` (loosest first, until its error is at most the default call's), then
    ``repeats`` rounds timing the default call and ARPACK at the chosen ``tol`` with
    ``return_singular_vectors=False`` and ``"vh"`` (the order rotating); and, up to
    ``profile_max_n``, a cProfile of one default call.
    """
    import statistics

    import torch

    from meanfield.lipschitz import local_lipschitz

    dev, n, seed = spec["device"], spec["n"], spec["seed"]
    dtypes, params, X, fns, reference = _layer_inputs_and_reference(spec)
    ref_value = reference["value"]
    out: dict[str, Any] = {
        "kind": "arpack",
        "n": n,
        "threads": {
            "torch": torch.get_num_threads(),
            **{k: os.environ.get(k) for k in BLAS_THREAD_VARS},
        },
        "reference": {"tol": spec["ref_tol"], **reference},
    }

    def rel(v: float) -> float:
        return abs(v - ref_value) / ref_value

    def ours(dt):
        sec, est = _timed(dev, local_lipschitz, X[dt], params[dt], masked=True, method="lanczos")
        return sec, {
            "value": float(est.value),
            "lower": float(est.lower),
            "upper": float(est.upper),
            "upper_prob": float(est.upper_prob),
            "ratio_prob": float(est.upper_prob / est.lower),
            "stop_rule": str(est.stop_rule),
            "n_products": int(est.n_matvec),
            "converged": bool(est.converged),
            "rel_error": rel(float(est.value)),
            "lower_rel_error": rel(float(est.lower)),
        }

    def arp(dt, tol, vectors=False):
        sec, res = _timed(
            dev,
            arpack_baseline,
            fns[dt],
            X[dt],
            tol=tol,
            seed=seed,
            vectors=vectors,
            maxiter=spec.get("arpack_maxiter"),
        )
        res.update(seconds=sec, rel_error=rel(res["value"]), tol=tol, vectors=vectors)
        return sec, res

    for dt in dtypes:  # warm-up on a short input (kernel selection, cached weight norms)
        local_lipschitz(X[dt][:8], params[dt], masked=True, method="lanczos")
        arpack_baseline(fns[dt], X[dt][:8], tol=1e-2, seed=seed)
    per: dict[str, Any] = {}
    for dt in dtypes:
        sec, first = ours(dt)
        first["seconds"] = sec
        target = first["rel_error"]
        sweep, chosen = [], None
        for tol in spec.get("arpack_tols", ARPACK_TOLS):
            _, res = arp(dt, tol)
            sweep.append(res)
            _progress(
                f"  n={n} {dt} arpack tol {tol:g}: {res['seconds']:.3f} s, {res['n_products']} "
                f"products, err {res['rel_error']:.1e} (default call: {target:.1e})",
            )
            if res["converged"] and res["rel_error"] <= target:
                chosen = tol
                break
            # ARPACK's floor (the rounding of its own dtype): three tighter tols gain < 10 %
            best = min(x["rel_error"] for x in sweep[:-3]) if len(sweep) > 3 else None
            if best is not None and min(x["rel_error"] for x in sweep[-3:]) > 0.9 * best:
                break
        per[dt] = {
            "default_first": first,
            "arpack_sweep": sweep,
            "arpack_tol": chosen,
            "arpack_reached": chosen is not None,
            "rounds": [],
        }
        if chosen is None:  # not reached: the loosest tol of its most accurate runs
            per[dt]["arpack_tol"] = min(sweep, key=lambda r: r["rel_error"])["tol"]
        per[dt]["arpack_sweep_run"] = next(x for x in sweep if x["tol"] == per[dt]["arpack_tol"])
    methods = [
        ("default", ours),
        ("arpack", lambda dt: arp(dt, per[dt]["arpack_tol"])),
        ("arpack_vh", lambda dt: arp(dt, per[dt]["arpack_tol"], vectors="vh")),
    ]
    for r, dt, row in _rounds(dtypes, int(spec.get("repeats", 3)), methods):
        tol = per[dt]["arpack_tol"]
        row["ratio"] = row["arpack"]["seconds"] / row["default"]["seconds"]
        per[dt]["rounds"].append(row)
        _progress(
            f"  n={n} {dt} round {r}: default {row['default']['seconds']:.3f} s "
            f"({row['default']['n_products']} products, err {row['default']['rel_error']:.1e}, "
            f"upper_prob/lower {row['default']['ratio_prob']:.3f}), arpack tol {tol:g} "
            f"{row['arpack']['seconds']:.3f} s ({row['arpack']['n_products']} products, err "
            f"{row['arpack']['rel_error']:.1e}), vh {row['arpack_vh']['seconds']:.3f} s, "
            f"ratio {row['ratio']:.2f}",
        )
    for dt in dtypes:
        rounds = per[dt]["rounds"]
        # minima over the rounds and the first runs (the first default call, the sweep's run)
        t_def = min(
            [row["default"]["seconds"] for row in rounds] + [per[dt]["default_first"]["seconds"]]
        )
        t_arp = min(
            [row["arpack"]["seconds"] for row in rounds] + [per[dt]["arpack_sweep_run"]["seconds"]]
        )
        t_vh = min(row["arpack_vh"]["seconds"] for row in rounds)
        ratios = [row["ratio"] for row in rounds]
        d0, a0 = rounds[0]["default"], rounds[0]["arpack"]
        per[dt].update(
            forward_seconds=_forward_time(fns[dt], X[dt], dev),
            default_seconds_min=t_def,
            default_products=d0["n_products"],
            default_rel_error=d0["rel_error"],
            default_ratio_prob=d0["ratio_prob"],
            default_stop_rule=d0["stop_rule"],
            arpack_seconds_min=t_arp,
            arpack_vh_seconds_min=t_vh,
            arpack_products=a0["n_products"],
            arpack_rel_error=a0["rel_error"],
            ratio_median=statistics.median(ratios),
            ratio_min=min(ratios),
            ratio_of_minima=min(t_arp, t_vh) / t_def,
        )
        if n <= spec.get("profile_max_n", 256):
            per[dt]["profile"] = _profile_default(lambda _dt=dt: ours(_dt))
            per[dt]["profile"]["seconds_unprofiled_min"] = t_def
    out["dtypes"] = per
    return out


def _worker(spec_json: str) -> None:
    spec = json.loads(spec_json)
    kinds = {"workload": _run_workload, "side-by-side": _run_side_by_side, "arpack": _run_arpack}
    doc = kinds.get(spec.get("kind"), _run_single)(spec)
    sys.stdout.write("@@RESULT " + json.dumps(doc) + "\n")
    sys.stdout.flush()


# =============================================================================== parent side
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _machine(device: str, threads: int) -> dict[str, Any]:
    import torch

    return {
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": threads,
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "memory_total_gb": round(
            os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1
        ),
        "cuda": torch.cuda.get_device_name() if device.startswith("cuda") else None,
    }


def save_layer(path: Path, seed: int) -> dict[str, Any]:
    """Save layer 0 of ``random_gpt2(seed)`` as plain arrays; check it against ``params_from_hf``."""
    import numpy as np
    import torch

    from meanfield.models import params_from_hf, random_gpt2

    model = random_gpt2(seed).model
    attn = model.h[0].attn
    arrays = {
        "c_attn_w": attn.c_attn.weight.detach().double().numpy(),
        "c_attn_b": attn.c_attn.bias.detach().double().numpy(),
        "c_proj_w": attn.c_proj.weight.detach().double().numpy(),
        "c_proj_b": attn.c_proj.bias.detach().double().numpy(),
        "scale": np.float64(1.0 / math.sqrt(D_MODEL // N_HEADS)),
    }
    np.savez(path, **arrays)
    ours = load_layer(path, "float64", "cpu")
    ref = params_from_hf(model, 0, map="heads+WO", dtype=torch.float64)
    X = make_inputs(5, None, 0, "float64", "cpu")
    from meanfield.attention import self_attention

    err = float(
        (self_attention(X, ours, masked=True) - self_attention(X, ref, masked=True)).abs().max()
    )
    if err > 1e-12:
        raise RuntimeError(f"saved layer differs from params_from_hf by {err}")
    return {
        "source": "meanfield.models.random_gpt2(seed).model.h[0].attn (GPT-2 small, random init)",
        "seed": seed,
        "d": D_MODEL,
        "n_heads": N_HEADS,
        "map": "heads+WO",
        "masked": True,
        "weight_std": {k: float(v.std()) for k, v in arrays.items() if k.endswith("_w")},
    }


def run_job(
    spec: dict[str, Any], timeout: float | None = None, *, stream_stderr: bool = False
) -> dict[str, Any]:
    """Run one job in a fresh interpreter and parse its result line.

    With ``spec["blas_threads"]`` the BLAS/OpenMP pools of numpy and scipy (ARPACK's
    ``eigsh``) are limited through ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS`` and
    ``MKL_NUM_THREADS`` in the subprocess's environment. ``stream_stderr``: the job's progress
    lines go to this process's stderr as they come.
    """
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
    env = None
    if spec.get("blas_threads"):
        env = dict(os.environ)
        for k in BLAS_THREAD_VARS:
            env[k] = str(spec["blas_threads"])
    try:
        proc = subprocess.run(
            cmd,
            stdout=subprocess.PIPE,
            stderr=None if stream_stderr else subprocess.PIPE,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return {"method": spec.get("method"), "n": spec.get("n"), "error": f"timeout {timeout}s"}
    for line in proc.stdout.splitlines():
        if line.startswith("@@RESULT "):
            return json.loads(line[len("@@RESULT ") :])
    tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-3:]
    return {"method": spec.get("method"), "n": spec.get("n"), "error": " | ".join(tail)}


def _ints(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError as err:
        raise SystemExit(
            f"bench_jacobian: error: expected comma-separated integers, got {text!r}"
        ) from err


def _bracket(
    r: dict[str, Any], ref: dict[str, Any] | None, up: str, ratio: str, holds: str
) -> None:
    """``r[ratio]``: ``r[up]`` over ``r["lower"]``; ``r[holds]``: whether they enclose ``ref``."""
    r[ratio] = r[up] / r["lower"]
    if ref is not None:
        r[holds] = r["lower"] <= ref["value"] * (1 + 1e-12) and ref["value"] <= r[up]


def summarise(doc: dict[str, Any]) -> None:
    """Attach references, relative errors, speed-ups and target checks to ``doc`` in place."""
    rows = doc["results"]
    for n in sorted({r["n"] for r in rows}):
        at = {r["method"]: r for r in rows if r["n"] == n and "error" not in r}
        ref = at.get("dense") or at.get("ref")
        ref_kind = "dense" if "dense" in at else ("ref" if "ref" in at else None)
        for r in rows:
            if r["n"] != n or "error" in r:
                continue
            if ref is not None and r is not ref:
                r["reference"] = ref_kind
                r["rel_error"] = abs(r["value"] - ref["value"]) / ref["value"]
            if r.get("upper_prob") is not None and r.get("lower"):
                _bracket(r, ref, "upper_prob", "ratio_upper_prob_lower", "prob_bracket_holds")
            if "upper" in r and "lower" in r and math.isfinite(r["upper"]):
                _bracket(r, ref, "upper", "ratio_upper_lower", "bracket_holds")
        pa = at.get("power-acc")
        if pa is not None and ref is not None:
            target = doc["config"]["target"]
            errs = [abs(h - ref["value"]) / ref["value"] for h in pa["history"]]
            k = next((i + 1 for i, e in enumerate(errs) if e <= target), None)
            per_iter = pa["seconds"] / pa["n_iter"]
            pa["iterations_to_target"] = k
            pa["seconds_to_target"] = None if k is None else k * per_iter
            pa["note"] = (
                "iterations until the error first reaches the target, read from the history "
                "against the reference (an oracle stopping rule, optimistic for power); seconds "
                "= iterations x measured seconds per iteration"
            )
            if k is not None and "ours-nocert" in at:
                doc.setdefault("speedups_equal_accuracy", []).append(
                    {
                        "n": n,
                        "target": target,
                        "power_seconds_to_target": k * per_iter,
                        "power_products_to_target": 2 * k,
                        "ours_nocert_seconds": at["ours-nocert"]["seconds"],
                        "ours_nocert_products": at["ours-nocert"]["n_products"],
                        "speedup": k * per_iter / at["ours-nocert"]["seconds"],
                    }
                )
        if "power" in at and "streaming" in at:
            doc.setdefault("speedups_streaming", []).append(
                {
                    "n": n,
                    "power_seconds": at["power"]["seconds"],
                    "streaming_seconds": at["streaming"]["seconds"],
                    "speedup": at["power"]["seconds"] / at["streaming"]["seconds"],
                    "note": "streaming is the default certified call (lower and upper_prob); "
                    "power has no certificate",
                }
            )
        if "power" in at and "ours-nocert" in at:
            p, o = at["power"], at["ours-nocert"]
            sp = {"n": n, "speedup_nocert": p["seconds"] / o["seconds"]}
            if "ours" in at:
                sp["speedup_with_certificate"] = p["seconds"] / at["ours"]["seconds"]
            sp["product_ratio"] = p["n_products"] / o["n_products"]
            if p.get("stopped_by_time_cap"):
                sp["note"] = "power stopped at the time cap: speed-ups are lower bounds"
            doc.setdefault("speedups", []).append(sp)


def print_side_by_side(res: dict[str, Any]) -> None:
    """One line per dtype of a side-by-side job."""
    ref = res["reference"]["value"]
    for dt, r in res["dtypes"].items():
        print(
            f"n={res['n']} {dt}: ours {r['ours_seconds_min']:.3f} s, products {r['ours_products']}, "
            f"{r['ours_forward_equivalents']:.1f} fwd-eq, err {r['ours_max_abs_rel_error']:.1e} | "
            f"power {r['power_seconds_min']:.3f} s, products {r['power_products']}, "
            f"err {r['power_max_abs_rel_error']:.1e} | ratio median {r['ratio_median']:.2f} "
            f"(min {r['ratio_min']:.2f}, of minima {r['ratio_of_minima']:.2f}); ref {ref:.8f}"
        )
        print(
            f"n={res['n']} {dt}: estimate alone (certify=False) {r['estimate_seconds_min']:.3f} s, "
            f"{r['estimate_forward_equivalents']:.1f} fwd-eq | ratio median "
            f"{r['estimate_ratio_median']:.2f} (min {r['estimate_ratio_min']:.2f})"
        )
        print(
            f"n={res['n']} {dt}: estimate alone from the Kronecker start "
            f"{r['estimate_kron_seconds_min']:.3f} s, products {r['estimate_kron_products']}, "
            f"{r['estimate_kron_forward_equivalents']:.1f} fwd-eq, "
            f"err {r['estimate_kron_max_abs_rel_error']:.1e} | ratio median "
            f"{r['estimate_kron_ratio_median']:.2f} (min {r['estimate_kron_ratio_min']:.2f})"
        )


def print_arpack(res: dict[str, Any]) -> None:
    """Issue 23: one line per dtype, then the profile of the default call where it was run."""
    print(f"n={res['n']}: reference {res['reference']['value']:.10f}")
    for dt, r in res["dtypes"].items():
        reached = "" if r["arpack_reached"] else " (NOT reached: its most accurate tol)"
        print(
            f"n={res['n']} {dt}: default {r['default_seconds_min']:.3f} s, "
            f"{r['default_products']} products, err {r['default_rel_error']:.1e}, "
            f"upper_prob/lower {r['default_ratio_prob']:.3f} ({r['default_stop_rule']}) | "
            f"arpack tol {r['arpack_tol']:g}{reached}: {r['arpack_seconds_min']:.3f} s "
            f"(vh {r['arpack_vh_seconds_min']:.3f} s), {r['arpack_products']} products, "
            f"err {r['arpack_rel_error']:.1e} | ratio median {r['ratio_median']:.2f} "
            f"(min {r['ratio_min']:.2f}, of minima {r['ratio_of_minima']:.2f}); "
            f"forward {r['forward_seconds'] * 1e3:.1f} ms"
        )
        prof = r.get("profile")
        if prof:
            print(
                f"  profile of one default call ({prof['seconds_profiled']:.3f} s profiled, "
                f"{prof['seconds_unprofiled_min']:.3f} s unprofiled), cumulative:"
            )
            for k, v in sorted(prof["functions"].items(), key=lambda kv: -kv[1]["cumulative_s"]):
                print(f"    {k:<50} {v['cumulative_s']:8.3f} s  {v['calls']:>4} calls")
                for c, cv in sorted(
                    v.get("by_caller", {}).items(), key=lambda kv: -kv[1]["cumulative_s"]
                ):
                    print(f"      from {c:<44} {cv['cumulative_s']:8.3f} s  {cv['calls']:>4} calls")


def print_table(doc: dict[str, Any]) -> None:
    """Human-readable table of the run."""
    print(
        f"# {doc['machine']['cpu_model']}, {doc['machine']['torch_threads']} threads, "
        f"{doc['config']['dtype']}, device {doc['config']['device']}"
    )
    print(
        f"{'n':>5} {'method':<12} {'seconds':>9} {'fwd-eq':>8} {'products':>8} {'peak mem':>10} "
        f"{'value':>12} {'rel err':>9} {'upper/lower':>11}"
    )
    for r in doc["results"]:
        if "error" in r:
            print(f"{r['n']:>5} {r['method']:<12} error: {r['error']}")
            continue
        err = r.get("rel_error")
        mem = "-" if r.get("peak_mem_bytes") is None else f"{r['peak_mem_bytes'] / 2**20:.0f} MiB"
        ratio = r.get("ratio_upper_lower") or r.get("ratio_upper_prob_lower")
        cap = " (cap)" if r.get("stopped_by_time_cap") else ""
        if "upper_prob" in r and r.get("ratio_upper_lower") is None and ratio is not None:
            cap += " (upper_prob)"
        if "jvp_seconds" in r:
            cap += (
                f" linearise {r['linearize_seconds']:.2f} s, Jv {r['jvp_seconds']:.2f} s, "
                f"J^T u {r['vjp_seconds']:.2f} s"
            )
        print(
            f"{r['n']:>5} {r['method']:<12} {r['seconds']:>9.2f} {r['forward_equivalents']:>8.0f} "
            f"{r['n_products']:>8} {mem:>10} {r['value']:>12.8f} "
            f"{'-' if err is None else f'{err:.1e}':>9} {'-' if ratio is None else f'{ratio:.2f}':>11}{cap}"
        )
    for s in doc.get("skipped", []):
        print(f"{s['n']:>5} {s['method']:<12} skipped: {s['reason']}")
    for s in doc.get("speedups_equal_accuracy", []):
        print(
            f"n = {s['n']}: at equal accuracy {s['target']:g}, power needs "
            f"{s['power_products_to_target']} products / {s['power_seconds_to_target']:.2f} s, "
            f"ours {s['ours_nocert_products']} / {s['ours_nocert_seconds']:.2f} s: "
            f"{s['speedup']:.2f}x"
        )
    for s in doc.get("speedups_streaming", []):
        print(
            f"n = {s['n']}: power / streaming (certified) = {s['speedup']:.2f}x "
            f"({s['power_seconds']:.2f} s / {s['streaming_seconds']:.2f} s)"
        )
    for s in doc.get("speedups", []):
        print(
            f"n = {s['n']}: power / ours = {s['speedup_nocert']:.2f}x (no certificate), "
            f"{s.get('speedup_with_certificate', float('nan')):.2f}x (with), "
            f"products {s['product_ratio']:.2f}x {s.get('note', '')}"
        )
    w = doc.get("workload")
    if w:
        for m, r in w["methods"].items():
            extra = ""
            if not r.get("complete"):
                extrapolated = r.get("extrapolated_seconds", float("nan"))
                extra = f" (partial: {len(r['ns'])} lengths; extrapolated {extrapolated:.0f} s)"
            print(f"workload {m:<14} {r.get('seconds', float('nan')):>9.2f} s{extra}")
        for k, v in w.get("speedups", {}).items():
            print(f"workload speed-up {k}: {v:.2f}x")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--n", default="64,256,1024,4096", help="sequence lengths (default 64,256,1024,4096)"
    )
    p.add_argument(
        "--dense-n", default="8", help="extra small lengths where the dense SVD fits (default 8)"
    )
    p.add_argument("--methods", default="ours,ours-nocert,power,power-acc,dense,ref")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--tol",
        type=float,
        default=3e-3,
        help="residual tolerance of ours (default 3e-3: relative accuracy <= 1e-4, "
        "verified against the reference in every run)",
    )
    p.add_argument("--power-tol", type=float, default=1e-4)
    p.add_argument(
        "--power-acc-tol",
        type=float,
        default=1e-8,
        help="relative-change rule of 'power-acc', the baseline run on until it is accurate: "
        "its history gives the iterations it needs to reach --target accuracy",
    )
    p.add_argument("--target", type=float, default=1e-4, help="relative accuracy (default 1e-4)")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats (the minimum is reported)")
    p.add_argument("--repeat-max-n", type=int, default=256, help="repeat only up to this n")
    p.add_argument(
        "--ref-tol",
        type=float,
        default=None,
        help="residual tolerance of the reference run (default 1e-6; 1e-10 with --arpack)",
    )
    p.add_argument("--ref-max-n", type=int, default=1024, help="largest n with a reference run")
    p.add_argument(
        "--cert-max-n",
        type=int,
        default=1024,
        help="largest n with the block certificate (memory O(H n^2) float64 arrays)",
    )
    p.add_argument(
        "--time-cap",
        type=float,
        default=600.0,
        help="wall-time cap of the power baseline per run (seconds)",
    )
    p.add_argument(
        "--memory-budget",
        type=float,
        default=None,
        help="GB: skip the methods that store the attention where 6 (H, n, n) arrays exceed it "
        "(default: half the device's memory)",
    )
    p.add_argument(
        "--job-timeout",
        type=float,
        default=None,
        help="wall-time limit of each job's subprocess in seconds (default: none); a job past "
        "it is recorded as an error and the run goes on",
    )
    p.add_argument("--workload", dest="workload", action="store_true", default=True)
    p.add_argument("--no-workload", dest="workload", action="store_false")
    p.add_argument("--workload-sequences", type=int, default=10)
    p.add_argument(
        "--workload-ns",
        default="2-98",
        help="even lengths lo-hi (default 2-98), or a comma-separated list",
    )
    p.add_argument(
        "--workload-cap",
        type=float,
        default=900.0,
        help="time cap of each one-by-one workload method (then extrapolated)",
    )
    p.add_argument(
        "--side-by-side",
        action="store_true",
        help="only ours against the baseline, float32 and float64 alternated in one process per n, "
        "--repeats rounds at every n, against a float64 reference (issue 11)",
    )
    p.add_argument(
        "--arpack",
        action="store_true",
        help="only the default certified call against ARPACK (scipy svds) on torch.func products, "
        "float32 and float64 in one process per n, against a float64 reference (issue 23)",
    )
    p.add_argument(
        "--arpack-maxiter",
        type=int,
        default=None,
        help="maxiter of eigsh in --arpack (default: scipy's)",
    )
    p.add_argument(
        "--profile-max-n",
        type=int,
        default=256,
        help="--arpack: cProfile one default call per dtype up to this n (default 256)",
    )
    p.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke test")
    p.add_argument(
        "--out", default=None, help="JSON output (default benchmarks/results/<stamp>.json)"
    )
    p.add_argument("--json", action="store_true", help="print the JSON document on stdout")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker is not None:
        _worker(args.worker)
        return 0

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from experiments.engine import run_metadata, write_json

    if args.ref_tol is None:
        args.ref_tol = 1e-10 if args.arpack else 1e-6
    threads = args.threads or os.cpu_count() or 1
    if args.quick:
        ns, dense_ns = [16, 32], [4]
        wl_list, wl_seq = [2, 4, 6, 8], 2
    else:
        ns, dense_ns = _ints(args.n), _ints(args.dense_n)
        if "," in args.workload_ns:
            wl_list = _ints(args.workload_ns)
        else:
            lo, _, hi = args.workload_ns.partition("-")
            wl_list = list(range(int(lo), int(hi or lo) + 1, 2))
        wl_seq = args.workload_sequences
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"bench_jacobian-{stamp}.json")
    tmp = Path(tempfile.mkdtemp(prefix="bench_jacobian-"))
    layer_path = tmp / "layer.npz"
    layer = save_layer(layer_path, args.seed)
    # every job's spec: the saved layer, where it runs, and the seed and tolerances as given
    solver = ("seed", "tol", "power_tol", "power_acc_tol", "ref_tol")
    budget = (
        default_memory_budget(args.device)
        if args.memory_budget is None
        else int(args.memory_budget * 2**30)
    )
    common = dict(
        layer=str(layer_path),
        dtype=args.dtype,
        device=args.device,
        threads=threads,
        memory_budget=budget,
        **{k: getattr(args, k) for k in solver},
    )
    doc: dict[str, Any] = {
        "kind": "bench_jacobian",
        "machine": _machine(args.device, threads),
        "layer": layer,
        "inputs": "LayerNorm(N(0, I_768)) tokens, seeded by (seed, n)",
        "config": {
            **{k: v for k, v in vars(args).items() if k != "worker"},
            "ns": ns,
            "dense_ns": dense_ns,
            "chunk_size": CHUNK,
        },
        "results": [],
        "skipped": [],
    }
    doc["metadata"] = run_metadata(
        seed=args.seed, device=args.device, dtype=args.dtype, config=doc["config"]
    )

    def save() -> None:
        doc["machine"]["load_average_end"] = os.getloadavg()
        write_json(out, doc)

    if args.arpack or args.side_by_side:  # one job per n, its document under doc[key]
        kind = "arpack" if args.arpack else "side-by-side"
        key = kind.replace("-", "_")
        doc[key] = []
        for n in ns:
            spec = {**common, "kind": kind, "n": n}
            if args.arpack:
                spec.update(
                    repeats=args.repeats if n <= args.repeat_max_n else 1,
                    blas_threads=threads,
                    arpack_maxiter=args.arpack_maxiter,
                    profile_max_n=args.profile_max_n,
                )
            else:
                spec.update(repeats=args.repeats, time_cap=args.time_cap)
            res = run_job(spec, stream_stderr=args.arpack)
            doc[key].append(res)
            save()
            if "error" in res:
                print(f"n={res.get('n')}: error {res['error']}")
            else:
                (print_arpack if args.arpack else print_side_by_side)(res)
        save()
        print(f"wrote {out}")
        return 0

    for n in sorted(set(ns) | set(dense_ns)):
        for method in methods:
            reason = None
            if method == "dense" and n * D_MODEL > DENSE_MAX_ND:
                reason = (
                    f"J has (n d)^2 = {(n * D_MODEL) ** 2:.2e} entries "
                    f"({(n * D_MODEL) ** 2 * 8 / 2**30:.0f} GiB in float64) and its SVD costs "
                    f"~(n d)^3 = {(n * D_MODEL) ** 3:.1e} flops; limit n d <= {DENSE_MAX_ND}"
                )
            elif method in STORED_METHODS and stored_bytes(n, args.dtype) > budget:
                reason = (
                    f"stores every head's n x n matrices: about {stored_bytes(n, args.dtype) / 2**30:.0f}"
                    f" GiB against a budget of {budget / 2**30:.0f} GiB (--memory-budget)"
                )
            elif method == "ref" and (n * D_MODEL <= DENSE_MAX_ND and "dense" in methods):
                continue
            elif method == "ref" and n > args.ref_max_n:
                reason = (
                    f"no high-accuracy reference above n = {args.ref_max_n} (time); the accuracy "
                    "of ours is then bounded by its own residual"
                )
            elif method == "ours" and n > args.cert_max_n:
                reason = (
                    f"block certificate not run above n = {args.cert_max_n}: it holds several "
                    f"float64 (H, n, n) arrays ({N_HEADS * n * n * 8 / 2**30:.1f} GiB each)"
                )
            if reason is not None:
                doc["skipped"].append({"n": n, "method": method, "reason": reason})
                continue
            reps = (
                args.repeats if (n <= args.repeat_max_n and method not in ("dense", "ref")) else 1
            )
            spec = {**common, "method": method, "n": n, "time_cap": args.time_cap, "repeats": reps}
            t = time.perf_counter()
            res = run_job(spec, args.job_timeout)
            res["load_average_after"] = os.getloadavg()
            _progress(
                f"[{time.strftime('%H:%M:%S')}] n={n} {method}: "
                f"{res.get('seconds', float('nan')):.2f} s (job {time.perf_counter() - t:.0f} s) "
                f"value={res.get('value')} {res.get('error', '')}",
            )
            doc["results"].append(res)
            save()
    summarise(doc)
    save()

    if args.workload:
        wl: dict[str, Any] = {
            "ns": wl_list,
            "sequences": wl_seq,
            "d": D_MODEL,
            "tol": args.tol,
            "upper": "none",
            "methods": {},
        }
        for method in ("ours-batched", "ours-single", "power-single"):
            spec = {
                **common,
                "kind": "workload",
                "method": method,
                "ns": wl_list,
                "sequences": wl_seq,
                "upper": "none",
                "time_cap": None if method == "ours-batched" else args.workload_cap,
            }
            res = run_job(spec)
            if "error" not in res and not res["complete"]:
                # one-by-one cost grows with n: extrapolate with the measured cost per n^2-weight
                done = res["ns"]
                rest = [n for n in wl_list if n not in done]
                base = wl["methods"].get("ours-batched")
                if base is not None and base.get("complete"):
                    per = dict(zip(base["ns"], base["seconds_per_n"]))
                    scale = res["seconds"] / sum(per[n] for n in done)
                    res["extrapolated_seconds"] = res["seconds"] + scale * sum(per[n] for n in rest)
                    res["extrapolation"] = (
                        "remaining lengths scaled by the batched run's per-n "
                        "times, calibrated on the completed lengths"
                    )
            _progress(
                f"[{time.strftime('%H:%M:%S')}] workload {method}: {res.get('seconds')} s "
                f"{res.get('error', '')}",
            )
            wl["methods"][method] = res
            doc["workload"] = wl
            save()
        ms = wl["methods"]

        def total(m: str) -> float | None:
            r = ms.get(m, {})
            if "error" in r:
                return None
            return r["seconds"] if r.get("complete") else r.get("extrapolated_seconds")

        sp = {}
        for a, b in (
            ("power-single", "ours-batched"),
            ("ours-single", "ours-batched"),
            ("power-single", "ours-single"),
        ):
            if total(a) and total(b):
                sp[f"{a} / {b}"] = total(a) / total(b)
        vals = {m: ms[m]["values"] for m in ms if "error" not in ms[m]}
        # each one-by-one run against the batched one, over the lengths it completed
        for m, key in (
            ("power-single", "max_rel_diff_power_vs_ours"),
            ("ours-single", "max_rel_diff_single_vs_batched"),
        ):
            if "ours-batched" in vals and m in vals:
                k = len(vals[m])
                diffs = [
                    abs(a - c) / c
                    for ra, rc in zip(vals[m][:k], vals["ours-batched"][:k])
                    for a, c in zip(ra, rc)
                ]
                wl[key] = max(diffs)
        wl["speedups"] = sp
    save()
    if args.json:
        json.dump(json.loads(out.read_text()), sys.stdout)
        sys.stdout.write("\n")
    else:
        print_table(doc)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
