r"""The Kronecker start against the random one: products of an estimate on four layers.

For each layer and length ``n``: the cosine between the structured part of
:func:`meanfield.lipschitz.kronecker_start` and the top right singular vector of the Jacobian
(from a Lanczos run to residual 1e-10), and the products and relative errors of
``local_lipschitz(..., method="lanczos", certify=False, seed=0)`` from the random start and
from ``start="kronecker"``, at residual tolerances 1e-2 and 1e-4 (float64, one thread). Layers:
the random GPT-2 layer of ``bench_jacobian.py`` on LayerNorm-ed Gaussian tokens, and the three
layers of ``bench_certificates.py`` on one window of the ``pydoc`` corpus (offline stand-ins).
The table is docs/certificates.md §6.

Usage::

    .venv/bin/python benchmarks/kronecker_start.py [--n 64 256 1024] [--json] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

TOLS = (1e-2, 1e-4)


def measure(label: str, X, params, masked: bool) -> dict:
    """One row: the cosine, and products and errors from both starts at each tolerance."""
    import torch

    from meanfield.jacobian import linearize
    from meanfield.lipschitz import kronecker_start, local_lipschitz

    n = X.shape[-2]
    ref = local_lipschitz(
        X, params, masked=masked, method="lanczos", tol=1e-10, upper="none", delta=None,
        krylov_dim=64, max_iter=3000,
    )  # fmt: skip
    value = float(ref.value)
    x0 = kronecker_start(
        linearize(X, params, masked=masked), generator=torch.Generator().manual_seed(0)
    )
    g = torch.randn(x0.shape, generator=torch.Generator().manual_seed(0), dtype=x0.dtype)
    s = x0 - g / g.norm()  # the structured part
    v1 = ref.vector.reshape(s.shape)
    row = {
        "layer": label,
        "n": n,
        "value": value,
        "cos": abs(float((s * v1).sum() / (s.norm() * v1.norm()))),
    }
    for tol in TOLS:
        for name, start in (("random", None), ("kronecker", "kronecker")):
            est = local_lipschitz(
                X, params, masked=masked, method="lanczos", tol=tol, upper="none", seed=0,
                start=start, certify=False,
            )  # fmt: skip
            row[f"{name}_products_tol{tol:g}"] = int(est.n_matvec)
            row[f"{name}_error_tol{tol:g}"] = abs(float(est.value) - value) / value
    return row


def main(argv=None) -> int:
    import bench_certificates as bc
    import bench_jacobian as bj
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--json", action="store_true", help="print the rows as one JSON document")
    ap.add_argument("--out", default=None, metavar="FILE.json", help="also write them here")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        layer = Path(tmp) / "layer.npz"
        bj.save_layer(layer, 0)
        params = bj.load_layer(layer, "float64", "cpu")
        for n in args.n:
            X = bj.make_inputs(n, None, 0, "float64", "cpu")
            rows.append(measure("random GPT-2 L0, Gaussian tokens", X, params, True))
    names = {"gpt2": "random GPT-2 L6", "minilm": "MiniLM L3", "smollm2": "SmolLM2 L15"}
    for key, label in names.items():
        att, Xs = bc._inputs(key, args.n, torch.float64)
        for n in sorted(Xs):
            rows.append(measure(label, Xs[n], att.params, bool(att.info.causal)))
    doc = {"kind": "kronecker_start", "tols": list(TOLS), "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    if args.json:
        print(json.dumps(doc))
    else:
        for r in rows:
            cells = [f"{r['layer']:<34}", f"n={r['n']:<5}", f"cos {r['cos']:.3f}"]
            for tol in TOLS:
                a, b = r[f"random_products_tol{tol:g}"], r[f"kronecker_products_tol{tol:g}"]
                ea, eb = r[f"random_error_tol{tol:g}"], r[f"kronecker_error_tol{tol:g}"]
                cells.append(f"tol {tol:g}: {a} -> {b} products (errors {ea:.0e}, {eb:.0e})")
            print("  ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
