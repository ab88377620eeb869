"""The computation of the ``invertible`` stage: the inversions of one seed, the sweep, ``execute``."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..engine import (
    StageRun,
    Steps,
    finished_config,
    run_metadata,
    save_npz,
    torch_threads,
    write_json,
)
from .settings import NAME, InvertibleSettings

__all__ = [
    "FORWARD_RTOL",
    "MAPS",
    "OUTCOMES",
    "WRONG_PREIMAGE_RTOL",
    "execute",
    "invert_case",
    "random_heads",
]

log = logging.getLogger("meanfield.invertible")

MAPS = ("L2", "DP")
#: Outcomes of one inversion; ``<map>_outcome`` in the npz holds their index.
OUTCOMES = ("recovered", "wrong preimage", "no convergence")
#: A converged iterate farther than this (relative) from x* is a wrong preimage.
WRONG_PREIMAGE_RTOL = 1e-8
#: Forward check of a found preimage: ||x + g(x) - y|| <= this times max(1, ||y||).
FORWARD_RTOL = 1e-10


def random_heads(seed: int, *, d: int, heads: int) -> tuple[Any, Any]:
    r"""An L2 layer and a dot-product head drawn from ``seed`` (float64, CPU).

    L2: :math:`W^{Q,h}, W^{V,h}` of shape (d, d/H) with :math:`\mathcal N(0,1)` entries and
    :math:`W^O` (d, d) with :math:`\mathcal N(0,1/d)` entries. Dot product: :math:`A` and
    :math:`V` with :math:`\mathcal N(0,1/d)` entries (non-symmetric).
    """
    import torch

    from meanfield import AttentionParams, L2AttentionParams

    if d < 1 or heads < 1 or d % heads:
        raise ValueError(f"need positive d and heads with heads dividing d, got {d}, {heads}")
    g = torch.Generator().manual_seed(int(seed))
    k = d // heads
    f64 = torch.float64
    l2 = L2AttentionParams(
        torch.randn(heads, d, k, generator=g, dtype=f64),
        torch.randn(heads, d, k, generator=g, dtype=f64),
        torch.randn(d, d, generator=g, dtype=f64) / math.sqrt(d),
    )
    dp = AttentionParams(
        torch.randn(d, d, generator=g, dtype=f64) / math.sqrt(d),
        torch.randn(d, d, generator=g, dtype=f64) / math.sqrt(d),
    )
    return l2, dp


def _outcome(converged: bool, err: float, fwd: float) -> str:
    if converged and err <= WRONG_PREIMAGE_RTOL:
        return "recovered"
    if converged and fwd <= FORWARD_RTOL:
        return "wrong preimage"
    return "no convergence"


def invert_case(
    seed: int,
    radii: Sequence[float],
    *,
    d: int = 4,
    heads: int = 2,
    n: int = 4,
    target: float = 0.5,
    ref_radius: float = 1.0,
    max_iter: int = 300,
    tol: float = 1e-12,
) -> dict[str, Any]:
    """Both blocks of one seed at every radius: residual histories and a row per (map, radius).

    Returns a dict with ``rows`` (JSON-able, one per map and radius), ``residuals`` (map ->
    array (len(radii), max_iter), NaN-padded) and the scales and certified bounds.
    """
    import torch

    from meanfield.invertible import (
        ResidualAttention,
        certified_lipschitz,
        contractive_scale,
        dot_product_lipschitz_upper,
        dot_product_tie_input,
        invert_fixed_point,
    )

    l2, dp = random_heads(seed, d=d, heads=heads)
    blocks = {
        "L2": ResidualAttention(l2, contractive_scale(l2, n, target=target)),
        "DP": ResidualAttention(dp, contractive_scale(dp, n, target=target, radius=ref_radius)),
    }
    c_l2 = certified_lipschitz(blocks["L2"], n).bound
    c_dp = certified_lipschitz(blocks["DP"], n, radius=ref_radius).bound
    residuals = {m: np.full((len(radii), max_iter), np.nan) for m in MAPS}
    rows: list[dict[str, Any]] = []
    for i, R in enumerate(radii):
        tie = dot_product_tie_input(dp, R, n)
        xs = tie.X
        for m in MAPS:
            block = blocks[m]
            c = c_l2 if m == "L2" else c_dp
            y = block(xs)
            res = invert_fixed_point(y, block, max_iter=max_iter, tol=tol, lipschitz=c)
            residuals[m][i, : res.n_iter] = res.residuals.numpy()
            err = float(torch.linalg.vector_norm(res.x - xs) / torch.linalg.vector_norm(xs))
            y_norm = float(torch.linalg.vector_norm(y))
            fwd = float(torch.linalg.vector_norm(block(res.x) - y)) / max(1.0, y_norm)
            J = torch.func.jacrev(
                lambda z, b=block, shape=xs.shape: b.residual(z.reshape(shape)).reshape(-1)
            )(xs.reshape(-1))
            local = float(torch.linalg.matrix_norm(J, ord=2))
            rho = float(torch.linalg.eigvals(J).abs().max())
            ball_bound = (
                c
                if m == "L2"
                else block.scale * dot_product_lipschitz_upper(dp, n, max(R, ref_radius))
            )
            check = res.check
            assert check is not None
            rows.append(
                {
                    "seed": int(seed),
                    "map": m,
                    "R": float(R),
                    "status": res.status,
                    "n_iter": res.n_iter,
                    "outcome": _outcome(res.converged, err, fwd),
                    "preimage_error": err,
                    "forward_residual": fwd,
                    "y_norm": y_norm,
                    "rate": res.rate,
                    "max_ratio": check.max_ratio,
                    "banach_holds": check.holds,
                    "n_informative": check.n_informative,
                    "certified": c,
                    "bound_on_ball_R": ball_bound,
                    "local_lipschitz": local,
                    "spectral_radius": rho,
                    "tie_growth": block.scale * tie.growth if m == "DP" else None,
                }
            )
            log.info(
                "seed %d %s R=%g: %s after %d (rate %.3g, |Dg| %.3g, error %.2g)",
                seed,
                m,
                R,
                rows[-1]["outcome"],
                res.n_iter,
                res.rate,
                local,
                err,
            )
    return {
        "rows": rows,
        "residuals": residuals,
        "scale": {m: blocks[m].scale for m in MAPS},
        "certified": {"L2": c_l2, "DP": c_dp},
    }


def _sweep(cfg: InvertibleSettings) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    radii = [float(r) for r in cfg.radii]
    with torch_threads(1):
        cases = [
            invert_case(
                int(seed),
                radii,
                d=cfg.d,
                heads=cfg.heads,
                n=cfg.n,
                target=cfg.target,
                ref_radius=cfg.ref_radius,
                max_iter=cfg.max_iter,
                tol=cfg.tol,
            )
            for seed in cfg.seeds
        ]
    all_rows = [row for case in cases for row in case["rows"]]
    arrays: dict[str, np.ndarray] = {
        "radii": np.asarray(radii, dtype=np.float64),
        "seeds": np.asarray(cfg.seeds, dtype=np.int64),
    }
    shape = (len(cfg.seeds), len(radii))
    for m in MAPS:
        residuals = [c["residuals"][m] for c in cases]
        arrays[f"{m}_residuals"] = np.stack(residuals)  # (seeds, radii, max_iter)
        arrays[f"{m}_scale"] = np.asarray([c["scale"][m] for c in cases])
        fields = ("local_lipschitz", "spectral_radius", "preimage_error", "rate", "max_ratio")
        for f in (*fields, "y_norm"):
            vals = [r[f] for r in all_rows if r["map"] == m]
            arrays[f"{m}_{f}"] = np.asarray(vals, dtype=np.float64).reshape(shape)
        codes = [OUTCOMES.index(r["outcome"]) for r in all_rows if r["map"] == m]
        arrays[f"{m}_outcome"] = np.asarray(codes, dtype=np.int64).reshape(shape)
    for key in ("target", "ref_radius", "tol"):
        arrays[key] = np.float64(getattr(cfg, key))
    return arrays, {"rows": all_rows}


def _same_config(json_path: Path, config: dict[str, Any]) -> bool:
    """Whether the finished result was produced with exactly ``config`` (see ``finished_config``)."""
    recorded = finished_config(json_path)
    return recorded is not None and _norm(recorded) == _norm(config)


def _norm(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _norm(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_norm(x) for x in v]
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def execute(cfg: InvertibleSettings, out: Path, run: StageRun) -> Steps:
    """The sweep of ``cfg`` into ``out`` (the stage contract; CPU only, a few seconds).

    The problems have a few dozen unknowns, so the stage computes them itself and hands the
    driver no round; a result already computed with the same settings is kept.
    """
    del run  # CPU only, no progress bar (the sweep takes seconds)
    yield from ()  # no round: a generator like every stage's execute
    stem = out / NAME
    config = cfg.options()
    if _same_config(stem.with_suffix(".json"), config):
        return [stem.with_suffix(".npz"), stem.with_suffix(".json")]
    arrays, doc = _sweep(cfg)
    doc = {
        "kind": NAME,
        **doc,
        "metadata": run_metadata(seed=None, device="cpu", dtype="float64", config=config),
    }
    return [
        save_npz(stem.with_suffix(".npz"), **arrays),
        write_json(stem.with_suffix(".json"), doc),
    ]
