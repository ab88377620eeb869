r"""Experiment stage ``invertible``: inverting residual attention blocks by fixed-point iteration.

For random heads (one seed each) and a list of radii :math:`R`, the stage builds the residual
blocks :math:`x\mapsto x+g(x)` of docs/derivations/invertible.md:

* **L2**: Kim's L2 multi-head attention scaled so that its *global* certified Lipschitz bound
  is ``target`` (:func:`meanfield.invertible.contractive_scale`);
* **DP**: one dot-product head scaled the same way with the bound that holds on the ball of
  radius ``ref_radius`` only (dot-product attention has no global bound).

At every radius the input :math:`x^*` is the tie input of the DP head
(:func:`meanfield.invertible.dot_product_tie_input`: a query at the origin attending evenly to
keys at :math:`\pm Rw`, where the local constant of dot-product attention grows like
:math:`R^2`); both blocks map it to :math:`y=x^*+g(x^*)` and
:func:`meanfield.invertible.invert_fixed_point` inverts :math:`y` from :math:`x_0=y`. Each run
records the residual history, the observed contraction against the certified bound, the local
constant and spectral radius of :math:`Dg(x^*)` (dense, exact at these sizes), and an outcome:
``recovered`` (converged to :math:`x^*`), ``wrong preimage`` (converged to an :math:`x\ne x^*`
with :math:`x+g(x)=y`, checked by mapping it forward) or ``no convergence``.

Results go to ``results_dir/"invertible"``: ``invertible.{npz,json}``, written atomically once
the sweep is complete; a rerun with the same configuration computes nothing.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from .engine import (
    Claims,
    ModuleStage,
    StageConfig,
    StageRun,
    Steps,
    finished_config,
    load_json,
    load_npz,
    preset_config,
    run_metadata,
    save_npz,
    stage_result,
    torch_threads,
    write_json,
)
from .markdown import number as _fmt

__all__ = [
    "MAPS",
    "NAME",
    "OUTCOMES",
    "PRESETS",
    "STAGE",
    "InvertibleSettings",
    "execute",
    "invert_case",
    "load",
    "random_heads",
    "report_section",
    "resolve",
    "run",
    "summary",
]

log = logging.getLogger("meanfield.invertible")

NAME = "invertible"
MAPS = ("L2", "DP")
#: Outcomes of one inversion; ``<map>_outcome`` in the npz holds their index.
OUTCOMES = ("recovered", "wrong preimage", "no convergence")
#: A converged iterate farther than this (relative) from x* is a wrong preimage.
WRONG_PREIMAGE_RTOL = 1e-8
#: Forward check of a found preimage: ||x + g(x) - y|| <= this times max(1, ||y||).
FORWARD_RTOL = 1e-10


@dataclass(frozen=True)
class InvertibleSettings(StageConfig):
    """Settings of the ``invertible`` stage.

    ``d``: token width; ``heads``: heads of the L2 layer (dividing ``d``); ``n``: tokens;
    ``target``: the certified constant c of both blocks; ``ref_radius``: the ball on which the DP
    block's bound holds; ``radii``: the radii of the inputs; ``seeds``: one pair of random heads
    per seed; ``max_iter``, ``tol``: the fixed-point iteration.
    """

    stage: ClassVar[str] = "invertible"

    d: int
    heads: int
    n: int
    target: float
    ref_radius: float
    radii: tuple[float, ...]
    seeds: tuple[int, ...]
    max_iter: int
    tol: float


_COMMON = {"d": 4, "heads": 2, "n": 4, "target": 0.5, "ref_radius": 1.0, "tol": 1e-12}

PRESETS: Mapping[str, InvertibleSettings] = {
    "tiny": InvertibleSettings(**_COMMON, radii=(1.0, 16.0), seeds=(0,), max_iter=100),
    "quick": InvertibleSettings(
        **_COMMON, radii=(0.5, 1.0, 2.0, 4.0, 8.0, 16.0), seeds=(0, 1, 2), max_iter=300
    ),
    "paper": InvertibleSettings(
        **_COMMON,
        radii=(0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0),
        seeds=tuple(range(8)),
        max_iter=1000,
    ),
}


# ------------------------------------------------------------------------------ the work
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
            y_norm = max(1.0, float(torch.linalg.vector_norm(y)))
            fwd = float(torch.linalg.vector_norm(block(res.x) - y)) / y_norm
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
                    "y_norm": float(torch.linalg.vector_norm(y)),
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


def _sweep(config: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    radii = [float(r) for r in config["radii"]]
    keys = ("d", "heads", "n", "target", "ref_radius", "max_iter", "tol")
    kw = {k: config[k] for k in keys}
    all_rows: list[dict[str, Any]] = []
    res = {m: [] for m in MAPS}
    scales: dict[str, list[float]] = {m: [] for m in MAPS}
    with torch_threads(1):
        for seed in config["seeds"]:
            case = invert_case(int(seed), radii, **kw)
            all_rows += case["rows"]
            for m in MAPS:
                res[m].append(case["residuals"][m])
                scales[m].append(case["scale"][m])
    arrays: dict[str, np.ndarray] = {
        "radii": np.asarray(radii, dtype=np.float64),
        "seeds": np.asarray(config["seeds"], dtype=np.int64),
    }
    for m in MAPS:
        arrays[f"{m}_residuals"] = np.stack(res[m])  # (seeds, radii, max_iter)
        arrays[f"{m}_scale"] = np.asarray(scales[m])
        fields = ("local_lipschitz", "spectral_radius", "preimage_error", "rate", "max_ratio")
        for f in (*fields, "y_norm"):
            vals = [r[f] for r in all_rows if r["map"] == m]
            arrays[f"{m}_{f}"] = np.asarray(vals, dtype=np.float64).reshape(
                len(config["seeds"]), len(radii)
            )
        codes = [OUTCOMES.index(r["outcome"]) for r in all_rows if r["map"] == m]
        arrays[f"{m}_outcome"] = np.asarray(codes, dtype=np.int64).reshape(
            len(config["seeds"]), len(radii)
        )
    arrays["target"] = np.float64(config["target"])
    arrays["ref_radius"] = np.float64(config["ref_radius"])
    arrays["tol"] = np.float64(config["tol"])
    return arrays, {"rows": all_rows}


# ----------------------------------------------------------------------------- the stage
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


def resolve(preset: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of ``preset`` with ``overrides`` applied and checked (the stage contract)."""
    config = preset_config(PRESETS, preset, overrides, what=f"{NAME} option(s)")
    config.update({k: list(v) if isinstance(v, tuple) else v for k, v in overrides.items()})
    if not (0 < float(config["target"]) < 1):
        raise ValueError(f"{NAME}: target must lie in (0, 1), got {config['target']}")
    if int(config["max_iter"]) < 2:
        raise ValueError(f"{NAME}: max_iter must be at least 2, got {config['max_iter']}")
    return config


def execute(config: dict[str, Any], out: Path, run: StageRun) -> Steps:
    """The sweep of ``config`` into ``out`` (the stage contract; CPU only, a few seconds).

    The problems have a few dozen unknowns, so the stage computes them itself and hands the
    driver no round; a result already computed with the same settings is kept.
    """
    del run  # CPU only, no progress bar (the sweep takes seconds)
    yield from ()  # no round: a generator like every stage's execute
    stem = out / NAME
    if _same_config(stem.with_suffix(".json"), config):
        return [stem.with_suffix(".npz"), stem.with_suffix(".json")]
    arrays, doc = _sweep(config)
    doc = {
        "kind": NAME,
        **doc,
        "metadata": run_metadata(seed=None, device="cpu", dtype="float64", config=config),
    }
    return [
        save_npz(stem.with_suffix(".npz"), **arrays),
        write_json(stem.with_suffix(".json"), doc),
    ]


def load(results_dir: str | Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The saved arrays and document; FileNotFoundError naming the stage when missing."""
    arrays = load_npz(stage_result(results_dir, NAME, f"{NAME}.npz"))
    return arrays, load_json(stage_result(results_dir, NAME, f"{NAME}.json"))


def summary(results_dir: str | Path) -> dict[str, Any]:
    """Per map and radius: outcomes over the seeds, worst observed ratio, local constants."""
    try:
        _, doc = load(results_dir)
    except FileNotFoundError:
        return {}
    rows = doc["rows"]
    cfg = doc["metadata"]["config"]
    out: dict[str, Any] = {
        "n": cfg["n"],
        "target": cfg["target"],
        "ref_radius": cfg["ref_radius"],
        "seeds": len(cfg["seeds"]),
        "maps": {},
    }
    for m in MAPS:
        per_r = []
        for R in cfg["radii"]:
            sel = [r for r in rows if r["map"] == m and r["R"] == float(R)]
            counts: dict[str, int] = {}
            for r in sel:
                counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
            ratios = [r["max_ratio"] for r in sel if r["max_ratio"] == r["max_ratio"]]
            per_r.append(
                {
                    "R": float(R),
                    "outcomes": counts,
                    "max_ratio": max(ratios) if ratios else None,
                    "banach_holds": all(r["banach_holds"] for r in sel),
                    "max_local_lipschitz": max(r["local_lipschitz"] for r in sel),
                    "max_spectral_radius": max(r["spectral_radius"] for r in sel),
                    "max_preimage_error": max(r["preimage_error"] for r in sel),
                }
            )
        mine = [r for r in rows if r["map"] == m]
        out["maps"][m] = {
            "radii": per_r,
            "all_recovered": all(r["outcome"] == "recovered" for r in mine),
            "failures": sum(r["outcome"] != "recovered" for r in mine),
            "runs": len(mine),
            "banach_holds": all(r["banach_holds"] for r in mine),
            "failures_with_rho_le_1": sum(
                r["outcome"] != "recovered" and r["spectral_radius"] <= 1 for r in mine
            ),
            "recovered_with_rho_gt_1": sum(
                r["outcome"] == "recovered" and r["spectral_radius"] > 1 for r in mine
            ),
        }
    return out


def report_section(results_dir: str | Path, figures_dir: str | Path) -> str:
    """Markdown for ``report.md``: outcomes per radius for both blocks, and the figure."""
    s = summary(results_dir)
    figs = Path(figures_dir).name
    lines = ["## Invertible residual attention (Kim et al.)", ""]
    if not s:
        return "\n".join(lines + ["No results."]) + "\n"
    lines += [
        f"Residual blocks x ↦ x + g(x) on n = {s['n']} tokens, g scaled so that its certified "
        f"Lipschitz bound is c = {s['target']:g}: globally for L2 attention (proved, "
        "docs/derivations/invertible.md §2), only on the ball of radius "
        f"{s['ref_radius']:g} for dot-product (DP) attention. Inputs: a query at the origin "
        "attending evenly to keys at ±Rw (§4), where DP attention's local constant grows like "
        f"R². Each block maps x* to y and is inverted from x₀ = y; {s['seeds']} random "
        "head(s) per radius. *Observed* is the largest ratio of successive steps "
        "‖x_{k+1} − x_k‖/‖x_k − x_{k−1}‖, which Banach's argument bounds by c.",
        "",
        "| map | R | recovered | wrong preimage | no convergence | observed ratio ≤ | "
        "max ‖Dg(x*)‖ | max ρ(Dg(x*)) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m, v in s["maps"].items():
        for r in v["radii"]:
            o = r["outcomes"]
            lines.append(
                f"| {m} | {r['R']:g} | {o.get('recovered', 0)} | {o.get('wrong preimage', 0)} "
                f"| {o.get('no convergence', 0)} | {_fmt(r['max_ratio'])} "
                f"| {_fmt(r['max_local_lipschitz'])} | {_fmt(r['max_spectral_radius'])} |"
            )
    l2, dp = s["maps"]["L2"], s["maps"]["DP"]
    lines += [
        "",
        f"L2: {l2['runs'] - l2['failures']}/{l2['runs']} inversions recovered x*; the observed "
        f"ratios respect c in {'every' if l2['banach_holds'] else 'NOT every'} run. "
        f"DP: {dp['failures']}/{dp['runs']} inversions failed (a wrong preimage, checked by "
        "mapping it forward, or no convergence); a DP failure appears once ρ(Dg(x*)) > 1, "
        "outside the ball where its bound holds.",
        "",
        f"![invertible attention]({figs}/fig_invertible.png)",
        "",
    ]
    return "\n".join(lines) + "\n"


def claims(results_dir: str | Path) -> Claims:
    """No row of the verdict table: the stage checks none of the paper's claims."""
    del results_dir
    return Claims([], [])


#: The stage (experiments/engine/_stage.py contract).
STAGE = ModuleStage.from_module(__name__, "Invertible residual attention", uses_device=False)
#: Run the sweep of a preset (:meth:`experiments.engine.ModuleStage.run`).
run = STAGE.run
