r"""Figure F7: large radius (docs/theory.md §7).

:math:`\|Df(RX)\|_2` on a log grid of :math:`R` for a few
random :math:`X` (rows scaled so that :math:`\max_i\|x_i\| = 1`), masked and unmasked, against the
limit :math:`\|V\|_2\sqrt{\max_jN_j}` (:func:`~theory.bounds.large_radius_limit`), the reference
:math:`\sqrt n\|V\|_2`, and our quantitative deviation bound
:func:`~theory.bounds.large_radius_deviation`.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from theory import bounds

from ..engine import Round, Sweep, torch_threads
from .settings import (
    STEMS,
    SyntheticSettings,
    head_params64,
    part_metadata,
    save_part,
    spectral_norm_np,
)


# ============================================================================ F7
def _f7_problem(cfg: SyntheticSettings) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    r"""Random head and inputs of F7.

    :math:`A = Q^\top K/\sqrt d` and :math:`V` with Gaussian entries over :math:`\sqrt d`; rows of
    :math:`X` Gaussian, scaled so that :math:`\max_i\|x_i\| = 1`; inputs with a near-tied arg max
    (logit margin below 1e-3, masked or not) are redrawn.
    """
    import torch

    n, d, seed = cfg.f7.n, cfg.f7.d, cfg.seed
    g = torch.Generator().manual_seed(7_000 + seed)
    Q = torch.randn(d, d, generator=g, dtype=torch.float64)
    K = torch.randn(d, d, generator=g, dtype=torch.float64)
    A = (Q.T @ K / math.sqrt(d)).numpy()
    V = (torch.randn(d, d, generator=g, dtype=torch.float64) / math.sqrt(d)).numpy()
    X: list[np.ndarray] = []
    while len(X) < cfg.f7.inputs:
        x = torch.randn(n, d, generator=g, dtype=torch.float64).numpy()
        x = x / np.linalg.norm(x, axis=1).max()
        if min(bounds.selection_gap(x, A), bounds.selection_gap(x, A, masked=True)) > 1e-3:
            X.append(x)
    return A, V, X


def _f7_point(point: Mapping[str, Any], A, V, X, R: np.ndarray, device: str) -> dict[str, Any]:
    """Dense certified ||Df(RX)||_2 for every R of the grid (one batched call)."""
    import torch

    from meanfield import local_lipschitz

    x = torch.as_tensor(X[int(point["input"])], dtype=torch.float64, device=device)
    Rt = torch.as_tensor(R, dtype=torch.float64, device=device)
    est = local_lipschitz(
        Rt[:, None, None] * x,
        head_params64(A, V, device),
        masked=bool(point["masked"]),
        method="dense",
    )
    return {k: getattr(est, k).cpu().numpy() for k in ("value", "lower", "upper")}


def f7_task(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """One F7 point as a top-level task (point, ``A``, ``V``, ``X``, ``R``, ``device``)."""
    with torch_threads(1):
        return _f7_point(cfg, cfg["A"], cfg["V"], cfg["X"], cfg["R"], cfg["device"])


def _settled_radius(R: np.ndarray, rel_err: np.ndarray, tol: float) -> float:
    """Smallest grid radius from which the relative error stays below ``tol`` (nan if never)."""
    tail_ok = np.flip(np.cumprod(np.flip(rel_err <= tol))).astype(bool)
    return float(R[int(np.argmax(tail_ok))]) if tail_ok.any() else float("nan")


def run_f7(cfg: SyntheticSettings, out: Path, device: str) -> Generator[Round, None, list[Path]]:
    """The F7 sweep (one round), then its arrays and findings."""
    A, V, X = _f7_problem(cfg)
    R = np.geomspace(cfg.f7.R_min, cfg.f7.R_max, cfg.f7.R_points)
    sweep = Sweep(
        out, "f7", {"A": A, "V": V, "X": X, "R": R}, seed=cfg.seed, device=device, dtype="float64"
    )
    pts = [{"input": k, "masked": m} for m in (False, True) for k in range(len(X))]
    context = {"A": A, "V": V, "X": X, "R": R, "device": device}
    yield [sweep.job(pts, f7_task, context)]
    recs = sweep.collect(pts)
    by = {(r["point"]["input"], r["point"]["masked"]): r for r in recs}
    n = cfg.f7.n
    a_norm, v_norm = spectral_norm_np(A), spectral_norm_np(V)
    arrays: dict[str, Any] = {
        "R": R,
        "A": A,
        "V": V,
        "X": np.stack(X),
        "n": np.int64(n),
        "A_norm": np.float64(a_norm),
        "V_norm": np.float64(v_norm),
        "sqrt_n_ref": np.float64(math.sqrt(n) * v_norm),
    }
    find: dict[str, Any] = {}
    for m, tag in ((False, "unmasked"), (True, "masked")):
        vals, low, up = (
            np.stack([np.asarray(by[(k, m)][f]) for k in range(len(X))])
            for f in ("value", "lower", "upper")
        )
        counts = np.stack([bounds.large_radius_counts(x, A, masked=m) for x in X])
        limit = np.asarray(bounds.large_radius_limit(counts, v_norm))
        gaps = np.asarray([bounds.selection_gap(x, A, masked=m) for x in X])
        dev = np.stack(
            [bounds.large_radius_deviation(R**2 * gp, n, a_norm, v_norm, R) for gp in gaps]
        )
        err = np.abs(vals - limit[:, None])
        arrays.update(
            {
                f"{tag}_value": vals,
                f"{tag}_lower": low,
                f"{tag}_upper": up,
                f"{tag}_counts": counts,
                f"{tag}_limit": limit,
                f"{tag}_gap": gaps,
                f"{tag}_deviation_bound": dev,
            }
        )
        find[tag] = {
            "max_N": counts.max(axis=1).tolist(),
            "limit": limit.tolist(),
            "value_at_R_max": vals[:, -1].tolist(),
            "max_rel_error_at_R_max": float((err[:, -1] / limit).max()),
            "deviation_bound_holds": bool(np.all(err <= dev * (1 + 1e-9) + 1e-12)),
            "max_value_over_R": vals.max(axis=1).tolist(),
            "R_within_1pct": [_settled_radius(R, err[k] / limit[k], 1e-2) for k in range(len(X))],
        }
    doc = {
        "kind": "synthetic/f7",
        "figure": STEMS["f7"],
        "head": f"d = {cfg.f7.d}, A = QᵀK/√d, V Gaussian/√d, seed {7000 + cfg.seed}",
        "inputs": f"{len(X)} Gaussian X with n = {n}, rows scaled to max norm 1",
        "provenance": {
            "limit": "docs/theory.md §7, derived and checked numerically",
            "deviation_bound": "theory.bounds.large_radius_deviation (ours)",
        },
        "findings": find,
    }
    return save_part(out, "f7", arrays, doc, part_metadata(cfg, device, "f7"))
