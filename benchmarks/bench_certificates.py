r"""Benchmark: tightness and cost of the upper certificates on real layers (issue 11, part 2).

For each layer and sequence length ``n`` (one window of real hidden states from the ``pydoc``
corpus, captured at the input of the attention layer), in one process and in this order:

``estimate``
    :func:`meanfield.local_lipschitz` with ``method="lanczos"``, ``upper="none"``: the estimate
    alone; its own ``upper_prob`` comes with it at no cost (``delta``).
``prob``
    The same with ``prob_rtol`` (default 0.05): the first Lanczos cycle is run long enough for
    ``upper_prob <= 1.05 * Ritz value`` at confidence ``1 - delta``.
``block``
    The deterministic block-norm certificate alone (:func:`meanfield.jacobian.block_norm_bounds`
    and its Collatz–Wielandt bound), timed on its own.
``head``
    The deterministic per-head certificate (:func:`meanfield.jacobian.head_structured_upper`),
    timed on its own.
``sblock``
    The structured block norms (:func:`meanfield.jacobian.structured_block_norms`, rotary heads
    included) with their Collatz–Wielandt bound; for rotary layers ``upper`` is the smaller of
    ``head`` and ``sblock``.

Every ratio is ``bound / lower`` with the ``lower`` of the ``prob`` run (the most accurate), and
every cost is a wall time divided by the time of the ``estimate``, measured in the same process.
Weight norms (one SVD per weight matrix, cached per layer) are computed before the timings.
The layers are random GPT-2 (seed 0) layer 6, all-MiniLM-L6-v2 layer 3 (no mask) and
SmolLM2-135M layer 15 (rotary heads, causal), all offline stand-ins.

Usage::

    .venv/bin/python benchmarks/bench_certificates.py --n 64 256 --models gpt2 minilm smollm2
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

LAYERS = {"gpt2": ("gpt2-random", 6), "minilm": ("minilm", 3), "smollm2": ("smollm2", 15)}


def _inputs(key: str, ns: list[int], dtype):
    from experiments.corpora import corpus_token_ids
    from meanfield.models import hf_attention, hidden_states, load_model

    name, layer = LAYERS[key]
    lm = load_model(name, seed=0)
    att = hf_attention(lm.model, layer, dtype=dtype)
    ids, _ = corpus_token_ids("pydoc", lm.tokenizer, min_tokens=max(ns) + 2)
    max_pos = getattr(lm.model.config, "max_position_embeddings", None) or max(ns)
    Xs = {}
    for n in ns:
        if n > max_pos:  # MiniLM: 512 positions; that n is skipped
            print(f"{key}: n = {n} exceeds the model's {max_pos} positions, skipped", flush=True)
            continue
        hs = hidden_states(lm.model, lm.tokenizer, ids, layer, n, n_windows=1, dtype=dtype)
        Xs[n] = hs.X[0]
    return att, Xs


def _timed(fn, *args, **kwargs):
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


def run(models, ns, dtype_name, delta, prob_rtol, tol):
    import torch

    from meanfield._spectral import collatz_wielandt_bound
    from meanfield.jacobian import (
        block_norm_bounds,
        head_structured_upper,
        linearize,
        structured_block_norms,
    )
    from meanfield.lipschitz import local_lipschitz

    dtype = torch.float64 if dtype_name == "float64" else torch.float32
    rows = []
    for key in models:
        att, Xs = _inputs(key, ns, dtype)
        masked = bool(att.info.causal)
        p = att.params
        # warm caches (weight norms, float64 copies) outside the timings
        X8 = Xs[min(Xs)][:8]
        local_lipschitz(X8, p, masked=masked, method="lanczos", upper="block")
        head_structured_upper(linearize(X8, p, masked=masked))
        structured_block_norms(linearize(X8, p, masked=masked))
        if not any(getattr(h, "rope", None) is not None for h in p.heads):
            block_norm_bounds(linearize(X8, p, masked=masked))  # the factors of this dtype's copy
        for n in sorted(Xs):
            X = Xs[n]
            kw = dict(masked=masked, method="lanczos", tol=tol, delta=delta)
            est, t_est = _timed(local_lipschitz, X, p, upper="none", **kw)
            pr, t_prob = _timed(local_lipschitz, X, p, upper="none", prob_rtol=prob_rtol, **kw)
            lower = max(float(est.lower), float(pr.lower))
            row = {
                "model": key,
                "n": n,
                "dtype": dtype_name,
                "lower": lower,
                "value": float(pr.value),
                "t_estimate": t_est,
                "matvec_estimate": int(est.n_matvec),
                "ratio_prob_free": float(est.upper_prob) / lower,
                "ratio_prob": float(pr.upper_prob) / lower,
                "cost_prob": t_prob / t_est,
                "matvec_prob": int(pr.n_matvec),
            }
            lin = linearize(X, p, masked=masked)
            if not lin.rope_heads:
                N, t_b = _timed(block_norm_bounds, lin)
                b, t_cw = _timed(collatz_wielandt_bound, N)
                row.update(ratio_block=float(b) / lower, cost_block=(t_b + t_cw) / t_est)
            h, t_h = _timed(head_structured_upper, lin)
            row.update(ratio_head=float(h) / lower, cost_head=t_h / t_est)
            Ns, t_s = _timed(structured_block_norms, lin)
            sb, t_cw = _timed(collatz_wielandt_bound, Ns)
            row.update(ratio_sblock=float(sb) / lower, cost_sblock=(t_s + t_cw) / t_est)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=list(LAYERS))
    ap.add_argument("--n", nargs="+", type=int, default=[64, 256])
    ap.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--prob-rtol", type=float, default=0.05)
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(a.threads)
    rows = run(a.models, a.n, a.dtype, a.delta, a.prob_rtol, a.tol)
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(
            json.dumps({"args": vars(a) | {"out": str(a.out)}, "rows": rows}, indent=1)
        )
    for r in rows:
        print(
            f"{r['model']:8s} n={r['n']:5d} prob-free {r['ratio_prob_free']:.3f} "
            f"prob {r['ratio_prob']:.3f} ({r['cost_prob']:.2f}x) "
            f"block {r.get('ratio_block', math.inf):.2f} ({r.get('cost_block', math.nan):.2f}x) "
            f"head {r['ratio_head']:.2f} ({r['cost_head']:.2f}x) "
            f"sblock {r['ratio_sblock']:.2f} ({r['cost_sblock']:.2f}x)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
