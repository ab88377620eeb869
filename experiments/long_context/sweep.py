"""The computation of the ``long_context`` stage: one point per window, the facts, ``execute``.

Each point (:func:`long_point`) is one window of ``n`` tokens of one model's layer: the hidden
states entering the layer are captured (:func:`meanfield.models.hidden_states`, whose
``attention="auto"`` runs SDPA beyond 1024 tokens, so no ``n x n`` scores are held) and the
local Lipschitz constant of the layer's attention map (heads and output projection) is
estimated there by :func:`meanfield.local_lipschitz` with its default certified call: seeded
random start, width rule, ``path="auto"`` (streaming beyond ``memory_budget``). One resumable
:class:`~experiments.engine.Sweep` per (model, layer), ``<model>_L<layer>.jsonl``.
"""

from __future__ import annotations

import functools
import logging
import math
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..engine import (
    StageRun,
    Steps,
    Sweep,
    forget_worker_cache,
    loading,
    run_metadata,
    torch_threads,
    worker_cache,
    write_json,
)
from .plateau import plateau_start
from .settings import MODELS, NAME, LongContextSettings, LongModel, model_plans, window_starts

__all__ = [
    "RESULTS",
    "assemble",
    "execute",
    "layer_bound",
    "long_facts",
    "long_point",
    "tiny_gpt2",
]

log = logging.getLogger("experiments.long_context")

#: The stage's result document, under ``results_dir / "long_context"``.
RESULTS = "long_context.json"

#: What a point records of its estimate (the ``LipschitzEstimate`` fields).
_ESTIMATE = ("value", "lower", "upper", "upper_prob", "converged", "n_matvec", "n_iter", "residual")


class _Workspace:
    """Models, tokenized corpora and attention maps of one run, built once per process, lazily."""

    def __init__(self, seed: int, dtype: Any, device: str) -> None:
        self.seed, self.dtype, self.device = seed, dtype, device
        self.models: dict[tuple[str, int], Any] = {}
        self.ids: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        self.maps: dict[tuple[str, int, int], Any] = {}

    def model(self, spec: LongModel, positions: int) -> Any:
        """The model ``spec`` with at least ``positions`` positions (random GPT-2: extended)."""
        from meanfield.models import load_model

        key = (spec.id, int(positions))
        if key not in self.models:
            t0 = time.perf_counter()
            need = int(positions) if spec.positions is None else None
            with loading():
                if spec.key == "tiny-gpt2":
                    lm = tiny_gpt2(self.seed, int(positions))
                else:
                    lm = load_model(spec.key, seed=self.seed, n_positions=need)
            self.models[key] = lm
            log.info("loaded %s in %.1f s", spec.id, time.perf_counter() - t0)
        return self.models[key]

    def token_ids(self, spec: LongModel, positions: int, corpus: str, need: int) -> Any:
        """The corpus's token ids for ``spec``'s tokenizer, at least ``need`` of them."""
        from experiments.corpora import corpus_token_ids

        key = (spec.id, corpus, int(need))
        if key not in self.ids:
            lm = self.model(spec, positions)
            if lm.tokenizer is None:
                raise ValueError(f"{lm.label} has no tokenizer offline; the stage needs one")
            with loading():
                ids, corp = corpus_token_ids(corpus, lm.tokenizer, min_tokens=int(need))
            if ids.numel() < need:
                raise ValueError(
                    f"corpus {corpus!r} has {ids.numel()} tokens for {spec.id}, the run needs "
                    f"{need}"
                )
            self.ids[key] = (ids, corp)
        return self.ids[key]

    def attention(self, spec: LongModel, positions: int, layer: int) -> Any:
        """The attention map (heads and output projection) of ``layer``, on the run's device."""
        from meanfield.models import hf_attention

        key = (spec.id, int(positions), int(layer))
        if key not in self.maps:
            lm = self.model(spec, positions)
            with loading():
                att = hf_attention(lm.model, int(layer), map="heads+WO", dtype=self.dtype)
            self.maps[key] = att.to(self.device)
        return self.maps[key]


def tiny_gpt2(seed: int, positions: int) -> Any:
    """A two-layer GPT-2 of width 64 and 4 heads, seeded random init, MiniLM's tokenizer.

    The model of the ``tiny`` preset (``"tiny-gpt2"``): the vocabulary is WordPiece's 30522 ids
    and the position table has ``max(128, positions)`` rows. The global RNG is left untouched.
    """
    import torch
    import transformers

    from meanfield.models import LoadedModel, tiny_config
    from meanfield.models.standins import minilm_dir

    cfg = tiny_config("gpt2", d=64, heads=4, vocab=30522, positions=max(128, int(positions)))
    with torch.random.fork_rng():
        torch.manual_seed(int(seed))
        model = transformers.GPT2Model(cfg).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(minilm_dir()), local_files_only=True)
    return LoadedModel(
        model,
        tok,
        MODELS["gpt2_tiny"].label,
        {"model": "tiny GPT-2", "seed": int(seed), "tokenizer": "all-MiniLM-L6-v2 WordPiece"},
    )


def _cache_key(run: str, seed: int, dtype: str, device: str) -> tuple[Any, ...]:
    return (NAME, run, int(seed), dtype, device)


def _workspace(run: str, seed: int, dtype: str, device: str) -> _Workspace:
    """The workspace of the run ``run`` in this process (shared by the driver and its tasks)."""
    import torch

    return worker_cache(
        _cache_key(run, seed, dtype, device),
        lambda: _Workspace(int(seed), getattr(torch, dtype), device),
    )


def _context_workspace(cfg: Mapping[str, Any]) -> tuple[_Workspace, LongModel]:
    ws = _workspace(cfg["run"], cfg["seed"], cfg["dtype"], cfg["device"])
    return ws, MODELS[cfg["model"]]


def long_point(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """One window of one length on one layer: the stage's top-level task (docs/cluster.md).

    ``cfg`` holds the point (``n``, ``window``, ``start``) and the sweep's context: ``model``
    (an id of :data:`MODELS`), ``layer``, ``corpus``, ``need`` (tokens the run needs),
    ``positions`` (the longest length of the model), ``seed``, ``dtype``, ``memory_budget``,
    ``max_iter``, ``device``, ``threads`` and ``run`` (names the workspace of this process).

    Returns the estimate (``value``, the certified ``lower``, ``upper`` (``inf`` on the
    streaming path), ``upper_prob`` with its ``confidence``), the ``path``, ``method`` and
    ``stop_rule`` of the call, its counts, the radius ``R`` (largest token norm) and the RMS token norm, the
    capture's attention implementation, and the seconds of the capture and of the estimate.
    """
    from meanfield.lipschitz import local_lipschitz
    from meanfield.models import hidden_states

    with torch_threads(cfg["threads"]):
        ws, spec = _context_workspace(cfg)
        lm = ws.model(spec, cfg["positions"])
        ids, _ = ws.token_ids(spec, cfg["positions"], cfg["corpus"], cfg["need"])
        att = ws.attention(spec, cfg["positions"], cfg["layer"])
        n = int(cfg["n"])
        t0 = time.perf_counter()
        hs = hidden_states(
            lm.model,
            lm.tokenizer,
            ids,
            int(cfg["layer"]),
            n,
            n_windows=1,
            start=int(cfg["start"]),
            dtype=ws.dtype,
            device=ws.device,
            attention="auto",
        )
        t_hidden = time.perf_counter() - t0
        t0 = time.perf_counter()
        est = local_lipschitz(
            hs.X[0],
            att.params,
            masked=spec.masked,
            seed=int(cfg["seed"]),
            max_iter=cfg["max_iter"],
            path="auto",
            memory_budget=int(cfg["memory_budget"]),
        )
        t_est = time.perf_counter() - t0
    rec: dict[str, Any] = {}
    for k in _ESTIMATE:
        v = getattr(est, k)
        if v is None and k == "upper_prob":  # no probabilistic end: the deterministic one
            v = est.upper
        rec[k] = v.item() if hasattr(v, "item") else v
    rec.update(
        confidence=est.confidence,
        path=est.path,
        method=est.method,
        stop_rule=getattr(est, "stop_rule", None),
        start_vector="random",
        R=float(hs.max_radius()[0]),
        mean_radius=float(hs.mean_radius()[0]),
        attention=hs.attention,
        seconds_hidden=t_hidden,
        seconds_estimate=t_est,
    )
    log.info(
        "%s L%s n=%d window %s: %.6g [%.6g, %.6g] (%s, %d products, %.1f s)",
        spec.id,
        cfg["layer"],
        n,
        cfg["window"],
        rec["value"],
        rec["lower"],
        rec["upper_prob"],
        rec["path"],
        rec["n_matvec"],
        t_est,
    )
    return rec


def long_facts(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """What the results say of a model's layer: labels, provenance, and its heads' norms.

    ``cfg`` is a point's context (:func:`long_point`). Per head: the spectral norms of the
    score matrix (for a rotary head ``||Q|| ||K||``, which bounds the score matrix at every
    relative position), of the value matrix, and of the head's column block of ``W_O``: what
    :func:`layer_bound` needs.
    """
    import torch

    with torch_threads(cfg["threads"]):
        ws, spec = _context_workspace(cfg)
        lm = ws.model(spec, cfg["positions"])
        _, corp = ws.token_ids(spec, cfg["positions"], cfg["corpus"], cfg["need"])
        att = ws.attention(spec, cfg["positions"], cfg["layer"])
        params = att.params
        heads = []
        d_v = params.heads[0].d_v
        for h, head in enumerate(params.heads):
            if head.rope is not None and head.Q is not None and head.K is not None:
                a = float(torch.linalg.matrix_norm(head.Q, 2) * torch.linalg.matrix_norm(head.K, 2))
                a_how = "||Q|| ||K|| (rotary)"
            else:
                a = float(torch.linalg.matrix_norm(head.A, 2))
                a_how = "||A||"
            w = (
                1.0
                if params.W_O is None
                else float(torch.linalg.matrix_norm(params.W_O[:, h * d_v : (h + 1) * d_v], 2))
            )
            heads.append(
                {"A": a, "V": float(torch.linalg.matrix_norm(head.V, 2)), "W": w, "A_is": a_how}
            )
        return {
            "model_label": lm.label,
            "provenance": {k: str(v) for k, v in dict(lm.provenance).items()},
            "corpus_label": corp.label,
            "corpus_source": corp.source,
            "layer_info": att.info.as_dict(),
            "rotary": any(h.rope is not None for h in params.heads),
            # a query bias adds the key logit term c (docs/conventions.md §1), outside the bound
            "query_bias": any(h.c is not None for h in params.heads),
            "heads": heads,
        }


def layer_bound(heads: list[Mapping[str, float]], R: float) -> dict[str, Any]:
    r"""The mean-field upper bound of a layer at radius ``R``, as :math:`\log_{10}`.

    :math:`\sum_h \|W_h\|_2\,\mathrm{MF}(\|A_h\|_2, \|V_h\|_2, R)` with ``MF`` =
    :func:`theory.bounds.mean_field_upper` at :math:`c' = 1` (``form="sharp"``), the multi-head
    sum of docs/theory.md §1, evaluated in logs (the bound overflows a float at the radii of
    trained models). A theorem for unmasked heads with scores xᵢᵀAxⱼ alone; for causal heads,
    rotary heads or heads with a query bias it is the same formula, a reference rather than a
    bound (docs/long_context.md).
    """
    from theory.bounds import mean_field_upper

    logs = [
        math.log(h["W"]) + float(mean_field_upper(h["A"], h["V"], R, c=1.0, log=True))
        for h in heads
        if h["W"] > 0
    ]
    total = float(np.logaddexp.reduce(np.asarray(logs))) if logs else -math.inf
    return {"R": float(R), "log10": total / math.log(10.0), "c": 1.0, "form": "sharp"}


def _point_cost(point: Mapping[str, Any], *, d: int) -> float:
    """Products of n x n attention tiles times the width: the relative cost of a window."""
    n = float(point["n"])
    return n * n * d + n * d * d


def _stem(spec: LongModel, layer: int) -> str:
    return f"{spec.id}_L{int(layer)}"


def assemble(
    spec: LongModel,
    layer: int,
    records: Sequence[Mapping[str, Any]],
    facts: Mapping[str, Any],
    cfg: LongContextSettings,
) -> dict[str, Any]:
    """One layer's entry of the result document from its records (one per window)."""
    keys = (
        "n",
        "window",
        "start",
        "value",
        "lower",
        "upper",
        "upper_prob",
        "R",
        "mean_radius",
        "n_matvec",
        "n_iter",
        "converged",
        "path",
        "method",
        "stop_rule",
        "attention",
        "seconds_estimate",
        "seconds_hidden",
    )
    rows: dict[str, list[Any]] = {k: [] for k in keys}
    for r in records:
        for k in keys:
            rows[k].append(r["point"][k] if k in ("n", "window", "start") else r.get(k))
    n = np.asarray(rows["n"], dtype=np.int64)
    value = np.asarray(rows["value"], dtype=float)
    lengths = sorted({int(v) for v in n})
    med = {
        "n": lengths,
        "value": [float(np.median(value[n == m])) for m in lengths],
        "lower": [float(np.median(np.asarray(rows["lower"], float)[n == m])) for m in lengths],
        "upper_prob": [
            float(np.median(np.asarray(rows["upper_prob"], float)[n == m])) for m in lengths
        ],
        "R": [float(np.max(np.asarray(rows["R"], float)[n == m])) for m in lengths],
    }
    plateau = plateau_start(
        n, value, min_lengths=cfg.min_lengths, n_boot=cfg.n_boot, seed=cfg.boot_seed
    )
    R = float(np.max(np.asarray(rows["R"], dtype=float)))
    bound = layer_bound(list(facts["heads"]), R)
    top = float(np.nanmax(value))
    bound["log10_ratio"] = bound["log10"] - math.log10(top) if top > 0 else math.nan
    return {
        "model": spec.id,
        "label": spec.label,
        "model_label": facts.get("model_label") or spec.label,
        "layer": int(layer),
        "masked": spec.masked,
        "positions": spec.positions,
        "rotary": bool(facts.get("rotary")),
        "query_bias": bool(facts.get("query_bias")),
        "lengths": lengths,
        "n_windows": cfg.n_windows,
        "records": rows,
        "median": med,
        "plateau": plateau.as_dict(),
        "bound": bound,
        "facts": dict(facts),
        "seconds": float(sum(r.get("seconds") or 0.0 for r in records)),
    }


def _previous_layers(path: Path) -> dict[str, Any]:
    """The layers of an earlier result document (``{}`` when there is none or it is unreadable)."""
    from ..engine import load_json

    if not path.exists():
        return {}
    try:
        return dict(load_json(path).get("layers") or {})
    except (OSError, ValueError) as err:
        log.warning("cannot read %s (%s): the layers' facts are computed again", path, err)
        return {}


_RECORDED = ("corpus", "seed", "dtype", "memory_budget", "max_iter")


def execute(cfg: LongContextSettings, out: Path, run: StageRun) -> Steps:
    """The windows of every model, layer and length of ``cfg`` into ``out`` (the stage contract).

    One sweep per (model, layer), ``<model>_L<layer>.jsonl``, one point per window, resumable
    point by point; all sweeps form one round (queued with the other stages' rounds in a
    distributed run). The sweep's configuration holds the corpus, seed, dtype, memory budget
    and iteration cap; a point holds its length, window index and start, so that a longer grid
    keeps the windows already measured. Writes ``long_context.json`` (:func:`assemble` per
    layer) and returns it with the sweep files.
    """
    import torch

    device = run.device
    opts = cfg.options()
    threads = torch.get_num_threads() if cfg.threads is None else int(cfg.threads)
    run_id = uuid.uuid4().hex
    previous = _previous_layers(out / RESULTS)
    try:
        plan = []
        jobs = []
        for spec, mplan in model_plans(cfg):
            lengths = tuple(int(v) for v in mplan.lengths)
            starts = window_starts(lengths, cfg.n_windows)
            need = cfg.n_windows * sum(lengths)
            for layer in mplan.layers:
                context = {
                    "model": spec.id,
                    "layer": int(layer),
                    "need": need,
                    "positions": lengths[-1],
                    **{k: opts[k] for k in _RECORDED},
                    "device": device,
                    "threads": threads,
                    "run": run_id,
                }
                sweep = Sweep(
                    out,
                    _stem(spec, layer),
                    {
                        "kind": "long_context_points",
                        "model": spec.id,
                        "key": spec.key,
                        "layer": int(layer),
                        "masked": spec.masked,
                        **{k: opts[k] for k in _RECORDED},
                    },
                    seed=cfg.seed,
                    device=device,
                    dtype=cfg.dtype,
                )
                points = [
                    {"n": n, "window": w, "start": s}
                    for n in lengths
                    for w, s in enumerate(starts[n])
                ]
                kept = previous.get(_stem(spec, layer), {})
                if kept.get("config_hash") == sweep.digest and "facts" in kept:
                    facts = kept["facts"]  # a rerun loads no model to say what it said before
                else:
                    facts = run.remote(long_facts, context)
                cost = functools.partial(_point_cost, d=int(facts["layer_info"]["d"]))
                jobs.append(sweep.job(points, long_point, context, cost=cost))
                plan.append((spec, int(layer), sweep, points, facts))
        yield jobs  # one round: every window of every layer
        doc: dict[str, Any] = {"kind": NAME, "layers": {}}
        files: list[Path] = []
        for spec, layer, sweep, points, facts in plan:
            entry = assemble(spec, layer, sweep.collect(points), facts, cfg)
            doc["layers"][_stem(spec, layer)] = {"config_hash": sweep.digest, **entry}
            files += [sweep.path, sweep.meta_path]
        doc["metadata"] = run_metadata(
            seed=cfg.seed, device=device, dtype=cfg.dtype, config={"preset": run.preset, **opts}
        )
        files.insert(0, write_json(out / RESULTS, doc))
        return files
    finally:
        forget_worker_cache(_cache_key(run_id, cfg.seed, cfg.dtype, device))
