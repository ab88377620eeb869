"""The computation of the ``kim_tightness`` stage: the points, a head's results, ``execute``."""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..engine import (
    StageRun,
    Steps,
    Sweep,
    finished_config,
    record_float,
    run_metadata,
    save_npz,
    torch_threads,
    write_json,
)
from .settings import HEADS, KimTightnessSettings

__all__ = ["execute", "fit_growth", "head_params", "head_results", "kim_point"]

log = logging.getLogger("meanfield.kim_tightness")


def head_params(name: str) -> tuple[Any, dict[str, np.ndarray]]:
    """The :class:`meanfield.L2AttentionParams` of head ``name`` and its weights as arrays."""
    import torch

    from meanfield.params import L2AttentionParams

    if name not in HEADS:
        raise ValueError(f"unknown head {name!r}; known: {', '.join(HEADS)}")
    D, H, seed, _ = HEADS[name]
    k = D // H
    if seed is None:
        WQ, WV, WO = np.ones((H, D, k)), np.ones((H, D, k)), np.ones((D, D))
    else:
        rng = np.random.default_rng(seed)
        WQ = rng.standard_normal((H, D, k)) / math.sqrt(D)
        WV = rng.standard_normal((H, D, k)) / math.sqrt(D)
        WO = rng.standard_normal((D, D)) / math.sqrt(D)
    params = L2AttentionParams(*(torch.tensor(W, dtype=torch.float64) for W in (WQ, WV, WO)))
    return params, {"WQ": WQ, "WV": WV, "WO": WO}


def _uppers(n: np.ndarray, D: int, H: int, W: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from theory.bounds import kim_l2_norms, kim_l2_upper

    ninf = kim_l2_norms(**W, p="inf")
    n2 = kim_l2_norms(**W, p=2)

    def upper(
        norms: Mapping[str, Any], p: Literal[2, "inf"], wq_power: Literal[1, 2] = 1
    ) -> np.ndarray:
        bound = kim_l2_upper(n, D=D, H=H, **norms, p=p, wq_power=wq_power)
        return np.asarray(bound, dtype=float)

    return {
        "upper_inf": upper(ninf, "inf"),
        "upper_2": upper(n2, 2),
        "upper_2_wq2": upper(n2, 2, wq_power=2),
        # the weight factor of the ∞-norm bound: upper_inf = (4 W0((N-1)/e) + 1/sqrt(k)) K_inf
        "K_inf": np.float64(ninf["WO_norm"] * ninf["WQ_norms"].max() * ninf["WV_norms"].max()),
    }


def fit_growth(n: Any, y: Any, *, n_min: int = 8) -> dict[str, float]:
    r"""Least-squares fits of ``y`` over ``n >= n_min``.

    ``slope_lnlnln``: :math:`y\approx a(\log N-\log\log N)+b`; ``slope_w0``:
    :math:`y\approx a\,W_0((N - 1)/e)+b` (the form inside Kim et al.'s ∞-norm bound);
    ``exponent``: :math:`y\approx cN^{\alpha}` (log–log). NaN when fewer than 3 points.
    """
    from theory.lambert import lambertw

    n = np.asarray(n, dtype=float)
    y = np.asarray(y, dtype=float)
    keep = (n >= n_min) & np.isfinite(y) & (y > 0)
    out = {"slope_lnlnln": math.nan, "slope_w0": math.nan, "exponent": math.nan, "n_min": n_min}
    if keep.sum() < 3:
        return out
    n, y = n[keep], y[keep]
    x1 = np.log(n) - np.log(np.log(n))
    x2 = np.asarray(lambertw((n - 1) / math.e), dtype=float)
    out["slope_lnlnln"], out["intercept_lnlnln"] = (float(v) for v in np.polyfit(x1, y, 1))
    out["slope_w0"], out["intercept_w0"] = (float(v) for v in np.polyfit(x2, y, 1))
    out["exponent"] = float(np.polyfit(np.log(n), np.log(y), 1)[0])
    return out


_ROWS = (
    "lower_inf",
    "construction_inf",
    "construction_inf_symmetric",
    "construction_inf_common",
    "lower_2",
    "construction_2",
)
#: Each of Kim et al.'s bounds and the measured lower bound it is set against.
_BOUNDS = (("upper_inf", "lower_inf"), ("upper_2", "lower_2"), ("upper_2_wq2", "lower_2"))


def kim_point(cfg: Mapping[str, Any]) -> dict[str, float]:
    """One N of one head: the row of ``head_<name>``, the stage's top-level task (docs/cluster.md).

    ``cfg`` holds ``head`` and ``N`` (the point) and the search settings ``p2_max_n``,
    ``n_restarts``, ``steps``, ``p2_restarts``, ``p2_steps`` and ``seed``; one torch thread. NaN
    where a quantity is not measured (the 2-norm above ``p2_max_n``, the symmetric layout at
    N < 3).
    """
    from meanfield.attacks import l2_construction, l2_lipschitz_lower

    name, N, seed = cfg["head"], int(cfg["N"]), int(cfg["seed"])
    params, _ = head_params(name)
    with torch_threads(1):
        res = l2_lipschitz_lower(
            params, N, p="inf", n_restarts=cfg["n_restarts"], steps=cfg["steps"], seed=seed
        )
        row = {
            "lower_inf": res.value,
            "construction_inf": res.construction_value,
            "construction_inf_symmetric": (
                l2_construction(params, N, layout="symmetric").value if N >= 3 else math.nan
            ),
            "construction_inf_common": l2_construction(params, N, layout="common").value,
            "lower_2": math.nan,
            "construction_2": math.nan,
        }
        if N <= cfg["p2_max_n"]:
            r2 = l2_lipschitz_lower(
                params, N, p=2, n_restarts=cfg["p2_restarts"], steps=cfg["p2_steps"], seed=seed
            )
            row.update(lower_2=r2.value, construction_2=r2.construction_value)
    log.info("%s N=%d: inf %.6g, 2 %.6g", name, N, row["lower_inf"], row["lower_2"])
    return row


def _point_context(name: str, seed: int, **search: int) -> dict[str, Any]:
    """What every point of head ``name`` shares: the head, the search settings and the seed."""
    return {"head": name, **search, "seed": seed}


def _point_cost(point: Mapping[str, Any], context: Mapping[str, Any]) -> float:
    """Search steps times N (the ∞-norm search), plus N² per step of the 2-norm search."""
    N = float(point["N"])
    cost = (context["n_restarts"] + 1) * context["steps"] * N
    if N <= context["p2_max_n"]:
        cost += (context["p2_restarts"] + 1) * context["p2_steps"] * N * N
    return cost


def head_results(
    out_dir: str | Path,
    name: str,
    *,
    n_values: Sequence[int],
    p2_max_n: int,
    n_restarts: int,
    steps: int,
    p2_restarts: int,
    p2_steps: int,
    seed: int,
    rows: Mapping[int, Mapping[str, Any]] | None = None,
) -> list[Path]:
    """Measure head ``name`` on every N and write ``head_<name>.{npz,json}``.

    ``rows`` maps N to the values :func:`kim_point` returned (the records of the stage's
    queued points); the N missing from it are computed here.
    """
    search = {
        "p2_max_n": p2_max_n,
        "n_restarts": n_restarts,
        "steps": steps,
        "p2_restarts": p2_restarts,
        "p2_steps": p2_steps,
    }
    context = _point_context(name, seed, **search)
    rows = dict(rows or {})
    for N in n_values:
        if int(N) not in rows:
            rows[int(N)] = kim_point({**context, "N": int(N)})
    _, W = head_params(name)
    D, H, _, label = HEADS[name]
    n = np.asarray(n_values, dtype=np.int64)
    arrays: dict[str, Any] = {
        "n": n,
        **{k: np.asarray([record_float(rows[int(N)][k]) for N in n_values]) for k in _ROWS},
    }
    arrays.update(_uppers(n.astype(float), D, H, W))
    for key, low in _BOUNDS:
        arrays[f"ratio_{key[6:]}"] = arrays[key] / arrays[low]
    fits = {
        "lower_inf": fit_growth(n, arrays["lower_inf"]),
        "lower_inf_over_K": fit_growth(n, arrays["lower_inf"] / arrays["K_inf"]),
        "lower_2": fit_growth(n, arrays["lower_2"]),
        **{f"ratio_{k}": fit_growth(n, arrays[f"ratio_{k}"]) for k in ("inf", "2", "2_wq2")},
    }
    violations = [
        {"bound": key, "N": int(N), "upper": float(u), "lower": float(lo)}
        for key, low in _BOUNDS
        for N, u, lo in zip(n, arrays[key], arrays[low], strict=True)
        if np.isfinite(lo) and lo > u
    ]
    config = {"n_values": [int(v) for v in n_values], **search}
    doc = {
        "kind": "kim_tightness",
        "head": name,
        "label": label,
        "D": D,
        "H": H,
        "weights": {k: v.tolist() for k, v in W.items()},
        "rows": {k: np.asarray(v).tolist() for k, v in arrays.items() if k != "K_inf"},
        "K_inf": float(arrays["K_inf"]),
        "fits": fits,
        "violations": violations,
        "metadata": run_metadata(seed=seed, device="cpu", dtype="float64", config=config),
    }
    out = Path(out_dir)
    return [
        save_npz(out / f"head_{name}.npz", **arrays),
        write_json(out / f"head_{name}.json", doc),
    ]


def _same_config(json_path: Path, config: Mapping[str, Any]) -> bool:
    """Whether a finished head (``.json`` and ``.npz``) was produced with ``config``."""
    recorded = finished_config(json_path)
    return recorded is not None and all(recorded.get(k) == v for k, v in config.items())


def execute(cfg: KimTightnessSettings, out: Path, run: StageRun) -> Steps:
    """The heads of ``cfg`` into ``out`` (the stage contract; CPU only).

    Each (head, N) is a point of the sweep ``head_<name>_points``, all in one round (with the
    other stages' rounds in a distributed run, docs/cluster.md), resumable point by point; a
    head is written once all its points are done, and a head already written with the same
    settings is kept.
    """
    del run  # CPU only; the driver draws the progress
    seed = int(cfg.seed)
    heads = (cfg.heads,) if isinstance(cfg.heads, str) else tuple(cfg.heads)
    n_values = [int(v) for v in cfg.n_values]
    search = {
        k: int(getattr(cfg, k))
        for k in ("p2_max_n", "n_restarts", "steps", "p2_restarts", "p2_steps")
    }
    kwargs = {"n_values": n_values, **search}  # what a finished head records as its settings
    files: list[Path] = []
    todo = []
    for name in heads:
        stem = out / f"head_{name}"
        if _same_config(stem.with_suffix(".json"), kwargs):
            files += [stem.with_suffix(".npz"), stem.with_suffix(".json")]
            points_files = (
                out / f"head_{name}_points.jsonl",
                out / f"head_{name}_points.meta.json",
            )
            files += [p for p in points_files if p.exists()]
            continue
        context = _point_context(name, seed, **search)
        config = {"kind": "kim_tightness_points", **context}
        sweep = Sweep(out, f"head_{name}_points", config, seed=seed, device="cpu", dtype="float64")
        points = [{"N": N} for N in n_values]
        cost = functools.partial(_point_cost, context=context)
        todo.append((name, sweep, points, sweep.job(points, kim_point, context, cost=cost)))
    yield [job for *_, job in todo]  # one round: every head's points
    for name, sweep, points, _ in todo:
        recs = sweep.collect(points)
        rows = {int(r["point"]["N"]): r for r in recs}
        files += head_results(out, name, seed=seed, rows=rows, n_values=n_values, **search)
        files += [sweep.path, sweep.meta_path]
    return files
