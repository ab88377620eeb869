"""The computation of the ``bounded_logits`` stage: one point per (form, radius, input).

Each point (:func:`bl_point`) scales one input of one construction (:func:`.layer.tied_input`)
to radius R and measures the local Lipschitz constant of one form of the random layer there
with the certified call of :func:`meanfield.local_lipschitz` (``certify=True``, ``method`` of
the settings, ``"auto"``: the library's choice). Every Lanczos estimate runs on the streaming
path (:func:`_path`), whose rounding analysis covers QK-norm, caps and windows; only the plain
form's dense SVD with its Gram certificate (n·d <= 1500) runs on the stored path
(docs/rounding.md §11.4). Lanczos stops on the width rule,
``upper_prob <= 1.05 lower``, or, where the rounding margins alone are wider, on the residual
rule. The point records the bracket ``lower``, ``upper_prob`` (at confidence 1 − δ over the
random start), ``upper`` (inf where no deterministic end is formed), ``value``, the path, the
stopping rule and the products. One resumable :class:`~experiments.engine.Sweep`,
``points.jsonl``, whose configuration holds :data:`.settings.MEASUREMENT_VERSION`;
``bounded_logits.json`` assembles the curves, the brackets, the growth exponents over the large
radii (fitted to ``value``) and the bounds (:mod:`.bounds`).
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from meanfield.lipschitz import DENSE_AUTO_MAX

from ..engine import (
    StageRun,
    Steps,
    Sweep,
    forget_worker_cache,
    load_json,
    record_float,
    run_metadata,
    torch_threads,
    worker_cache,
    write_json,
)
from .bounds import form_bound
from .layer import (
    growth_exponent,
    head_facts,
    largest_logit,
    layer_params,
    layer_weights,
    tied_input,
)
from .settings import MEASUREMENT, MEASUREMENT_VERSION, NAME, BoundedLogitsSettings

__all__ = ["RESULTS", "SWEEP", "assemble", "bl_facts", "bl_point", "execute"]

log = logging.getLogger("experiments.bounded_logits")

#: The stage's result document and its sweep's stem, under ``results_dir / "bounded_logits"``.
RESULTS = "bounded_logits.json"
SWEEP = "points"

#: The settings a point's context and the sweep's configuration hold.
_RECORDED = (
    "layer",
    "n",
    "softcap",
    "window",
    "rms_eps",
    "seed",
    "method",
)


class _Workspace:
    """The layer's weights, its forms and the unit tied inputs of one run, built lazily."""

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        shape = cfg["layer"]
        self.shape = shape
        self.cfg = cfg
        self.weights = layer_weights(
            shape["d"], shape["n_heads"], shape["n_kv_heads"], shape["head_dim"], cfg["seed"]
        )
        self.forms: dict[str, Any] = {}
        self.inputs: dict[tuple[str, int], Any] = {}

    def params(self, form: str) -> Any:
        if form not in self.forms:
            self.forms[form] = layer_params(
                self.weights,
                form,
                n_heads=self.shape["n_heads"],
                n_kv_heads=self.shape["n_kv_heads"],
                softcap=self.cfg["softcap"],
                window=self.cfg["window"],
                rms_eps=self.cfg["rms_eps"],
            )
        return self.forms[form]

    def unit_input(self, family: str, index: int) -> Any:
        key = (family, int(index))
        if key not in self.inputs:
            self.inputs[key] = tied_input(
                self.weights,
                self.cfg["n"],
                n_heads=self.shape["n_heads"],
                n_kv_heads=self.shape["n_kv_heads"],
                seed=1000 * int(self.cfg["seed"]) + int(index),
                family=family,
            )
        return self.inputs[key]


def _cache_key(run: str) -> tuple[str, str]:
    return (NAME, run)


def _workspace(cfg: Mapping[str, Any]) -> _Workspace:
    return worker_cache(_cache_key(cfg["run"]), lambda: _Workspace(cfg))


def _path(form: str, method: str, X: Any) -> Literal["stored", "streaming"]:
    """The path of a point: the streaming one, except for the plain form's dense SVD.

    Every Krylov estimate runs on the streaming products, so that the four forms share one
    rounding analysis (docs/rounding.md §11), whose split magnitude operator (§11.5) keeps the
    plain form's bracket within the width at logits of 10⁴ (R = 1000 on the ``paper`` layer),
    where the stored path's model of §3 gives ``lower = 0``. The plain form's dense SVD with its
    Gram certificate (``method="dense"``, or ``"auto"`` at ``n·d <=`` :data:`DENSE_AUTO_MAX`)
    exists on the stored path only.
    """
    n, d = X.shape[-2], X.shape[-1]
    dense = method == "dense" or (method == "auto" and n * d <= DENSE_AUTO_MAX)
    return "stored" if form == "plain" and dense else "streaming"


def bl_point(cfg: Mapping[str, Any]) -> dict[str, Any]:
    r"""One form at one radius on one input: the stage's top-level task (docs/cluster.md).

    ``cfg`` holds the point (``form``, ``R``, input ``family`` and ``input`` index) and the sweep's context (the settings
    of ``_RECORDED``, ``threads`` and ``run``, which names the workspace of this process).

    Returns the certified bracket ``lower`` <= :math:`\|J\|_2` <= ``upper_prob`` (the latter
    at confidence ``confidence`` = 1 − δ over the random start; for the dense method it equals
    ``upper``), ``upper`` (deterministic; inf where none is formed, as on the streaming path),
    ``value`` (the top singular value for the dense method, the final Ritz value for Lanczos),
    ``ratio_prob`` (``upper_prob / lower``; inf where ``lower`` is 0), ``method``, ``path``,
    ``stop_rule``, ``width_reachable``, ``converged``, the residual and the relative residual,
    the products, the input's radius ``R_measured`` (largest token norm), the form's largest
    |logit| over the admissible pairs, and the seconds.
    """
    from meanfield import local_lipschitz

    with torch_threads(cfg["threads"]):
        ws = _workspace(cfg)
        form = str(cfg["form"])
        params = ws.params(form)
        X = float(cfg["R"]) * ws.unit_input(str(cfg["family"]), int(cfg["input"]))
        t0 = time.perf_counter()
        est = local_lipschitz(
            X,
            params,
            masked=True,
            method=cfg["method"],
            seed=int(cfg["seed"]),
            certify=True,
            path=_path(form, str(cfg["method"]), X),
        )
        seconds = time.perf_counter() - t0
        value = float(est.value)
        lower = float(est.lower)
        upper_prob = float(est.upper if est.upper_prob is None else est.upper_prob)
        residual = float(est.residual)
        reachable = est.width_reachable
        logit = largest_logit(X, params, window=int(cfg["window"]) if form == "window" else None)
        rec = {
            "value": value,
            "lower": lower,
            "upper_prob": upper_prob,
            "upper": float(est.upper),
            "ratio_prob": upper_prob / lower if lower > 0 else math.inf,
            "confidence": est.confidence,
            "method": est.method,
            "path": est.path,
            "stop_rule": est.stop_rule,
            "width": est.width,
            "width_reachable": None if reachable is None else bool(reachable),
            "converged": bool(est.converged),
            "residual": residual,
            "rel_residual": residual / value**2 if value > 0 else math.nan,
            "n_matvec": int(est.n_matvec),
            "n_iter": int(est.n_iter),
            "R_measured": float(X.norm(dim=-1).max()),
            "largest_logit": logit,
            "seconds_estimate": seconds,
        }
    log.info(
        "%s R=%g %s input %s: %.6g in [%.6g, %.6g] (%s, %s, %d products, %.2f s)",
        form,
        float(cfg["R"]),
        cfg["family"],
        cfg["input"],
        value,
        lower,
        upper_prob,
        rec["method"],
        rec["stop_rule"],
        rec["n_matvec"],
        seconds,
    )
    return rec


def bl_facts(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The layer's per-head norms (:func:`.layer.head_facts`) and its logit scale."""
    shape = cfg["layer"]
    with torch_threads(cfg["threads"]):
        ws = _workspace(cfg)
        heads = head_facts(ws.weights, shape["n_heads"], shape["n_kv_heads"])
    return {"heads": heads, "logit_scale": 1.0 / math.sqrt(shape["head_dim"])}


def _point_cost(point: Mapping[str, Any]) -> float:
    """Relative cost of a point: the variants take autograd products, about 3x a plain one."""
    return 1.0 if point["form"] == "plain" else 3.0


def _largest(records: Sequence[Mapping[str, Any]], field: str, R: float) -> float:
    """The largest ``field`` over the records at radius ``R`` (NaN: none)."""
    got = [record_float(r[field]) for r in records if float(r["point"]["R"]) == R]
    return max(got) if got else math.nan


def assemble(
    records: Sequence[Mapping[str, Any]],
    facts: Mapping[str, Any],
    cfg: BoundedLogitsSettings,
) -> dict[str, Any]:
    """The result document's ``forms``: per form the curves, brackets, exponent and bound.

    At each radius the curve is the largest ``value`` over the inputs, and its bracket
    ``[lower, upper_prob]`` the largest ends over them (it holds for the largest exact constant,
    at confidence ``1 − k δ`` over ``k`` inputs). The exponents are fitted to ``value``.
    """
    opts = cfg.options()
    radii = [float(r) for r in cfg.radii]
    forms: dict[str, Any] = {}
    for form in cfg.forms:
        mine = [r for r in records if r["point"]["form"] == form]
        values = [[r["value"] for r in mine if float(r["point"]["R"]) == R] for R in radii]
        top = [_largest(mine, "value", R) for R in radii]
        by_family = {}
        for fam in cfg.inputs:
            ours = [r for r in mine if r["point"]["family"] == fam]
            best = [_largest(ours, "value", R) for R in radii]
            by_family[fam] = {
                "value": best,
                "lower": [_largest(ours, "lower", R) for R in radii],
                "upper_prob": [_largest(ours, "upper_prob", R) for R in radii],
                "exponent": growth_exponent(
                    [R for R in radii if R >= cfg.large_R],
                    [v for R, v in zip(radii, best, strict=True) if R >= cfg.large_R],
                ),
            }
        logits = [_largest(mine, "largest_logit", R) for R in radii]
        large = [i for i, R in enumerate(radii) if R >= cfg.large_R]
        bounds = [form_bound(form, facts["heads"], R, opts) for R in radii]
        ratios = [record_float(r["ratio_prob"]) for r in mine]
        forms[form] = {
            "R": radii,
            "values": values,
            "value": top,
            "lower": [_largest(mine, "lower", R) for R in radii],
            "upper_prob": [_largest(mine, "upper_prob", R) for R in radii],
            "by_input": by_family,
            "largest_logit": logits,
            "exponent": growth_exponent([radii[i] for i in large], [top[i] for i in large]),
            "exponent_of": "value",
            "large_R": [radii[i] for i in large],
            "methods": sorted({str(r["method"]) for r in mine}),
            "paths": sorted({str(r["path"]) for r in mine}),
            "stop_rules": sorted({str(r["stop_rule"]) for r in mine}),
            "ratio_prob_max": max(ratios, default=math.nan),
            "n_wide": sum(not q <= 1.05 for q in ratios),
            "n_vacuous": sum(not record_float(r["lower"]) > 0 for r in mine),
            "n_unreachable": sum(r["width_reachable"] is False for r in mine),
            "converged": all(bool(r["converged"]) for r in mine),
            "n_unconverged": sum(not r["converged"] for r in mine),
            "rel_residual_max": max((float(r["rel_residual"]) for r in mine), default=math.nan),
            "n_matvec": int(sum(int(r["n_matvec"]) for r in mine)),
            "bound": [b["value"] for b in bounds],
            "bound_label": next((b["label"] for b in bounds if b["value"] is not None), ""),
            "bound_source": next((b["source"] for b in bounds if b["value"] is not None), None),
            "below_bound": all(
                b["value"] is None or t <= b["value"]
                for t, b in zip(top, bounds, strict=True)
                if math.isfinite(t)
            ),
            "seconds": float(sum(float(r.get("seconds") or 0.0) for r in mine)),
        }
    return forms


def _previous_facts(path: Path, digest: str) -> dict[str, Any] | None:
    """The facts of an earlier result document of the same configuration (``None``: none)."""
    if not path.exists():
        return None
    try:
        doc = load_json(path)
    except (OSError, ValueError) as err:
        log.warning("cannot read %s (%s): the layer's facts are computed again", path, err)
        return None
    return doc.get("facts") if doc.get("config_hash") == digest else None


def execute(cfg: BoundedLogitsSettings, out: Path, run: StageRun) -> Steps:
    """Every (form, radius, input) point of ``cfg`` into ``out`` (the stage contract).

    One sweep, ``points.jsonl``, resumable point by point; one round. The sweep's configuration
    holds the measurement's version, the layer, n, cap, window, epsilon, seed and method (a new
    measurement recomputes every point); a point holds its form,
    radius, input construction and index, so a longer grid keeps the points already measured. Writes
    ``bounded_logits.json`` and returns it with the sweep files.
    """
    import torch

    opts = cfg.options()
    threads = torch.get_num_threads() if cfg.threads is None else int(cfg.threads)
    run_id = uuid.uuid4().hex
    recorded = {k: opts[k] for k in _RECORDED}
    context = {**recorded, "threads": threads, "run": run_id}
    try:
        sweep = Sweep(
            out,
            SWEEP,
            {
                "kind": "bounded_logits_points",
                "measurement_version": MEASUREMENT_VERSION,
                **recorded,
            },
            seed=cfg.seed,
            device="cpu",
            dtype="float64",
        )
        points = [
            {"form": f, "R": float(R), "family": fam, "input": i}
            for f in cfg.forms
            for fam in cfg.inputs
            for R in cfg.radii
            for i in range(cfg.n_inputs)
        ]
        facts = _previous_facts(out / RESULTS, sweep.digest) or run.remote(bl_facts, context)
        yield [sweep.job(points, bl_point, context, cost=_point_cost)]
        records = sweep.collect(points)
        doc: dict[str, Any] = {
            "kind": NAME,
            "measurement_version": MEASUREMENT_VERSION,
            "measurement": MEASUREMENT,
            "config_hash": sweep.digest,
            "settings": opts,
            "facts": facts,
            "forms": assemble(records, facts, cfg),
            # the confidence of every probabilistic end (None: every end deterministic)
            "confidence": min(
                (float(r["confidence"]) for r in records if r["confidence"] is not None),
                default=None,
            ),
            "seconds": float(sum(float(r.get("seconds") or 0.0) for r in records)),
        }
        doc["metadata"] = run_metadata(
            seed=cfg.seed, device="cpu", dtype="float64", config={"preset": run.preset, **opts}
        )
        return [write_json(out / RESULTS, doc), sweep.path, sweep.meta_path]
    finally:
        forget_worker_cache(_cache_key(run_id))
