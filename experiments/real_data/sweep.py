"""The estimation sweep of the ``real_data`` stage (``run``).

Windows of n tokens with one running pointer per grid, the hidden states captured at the input of
one attention layer, and the certified bracket, released metric and radii of the layer's map at
each window, one resumable :class:`~experiments.engine.Sweep` per (configuration, corpus, grid).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..engine import (
    StageRun,
    Steps,
    Sweep,
    forget_worker_cache,
    load_json,
    loading,
    torch_threads,
    worker_cache,
    write_json,
)
from .report import export_csv
from .settings import (
    CONFIGS,
    CORPUS_STANDS_IN,
    MANIFEST,
    NAME,
    RealConfig,
    RealDataSettings,
    load_model_cached,
    sweep_name,
    user_config_list,
    window_starts,
)

log = logging.getLogger("experiments.real_data")


class _Workspace:
    """Models, tokenized corpora and attention maps, each built once per process, lazily."""

    def __init__(self, seed: int, dtype: Any, device: str) -> None:
        self.seed, self.dtype, self.device = seed, dtype, device
        self.models: dict[str, Any] = {}
        self.ids: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        self.maps: dict[str, Any] = {}
        self.need: dict[tuple[str, str], int] = {}

    def require(self, key: str, corpus: str, tokens: int) -> None:
        """Ask for at least ``tokens`` tokens of ``corpus`` for model ``key`` (the most asked wins)."""
        self.need[(key, corpus)] = max(self.need.get((key, corpus), 0), int(tokens))

    def model(self, key: str) -> Any:
        if key not in self.models:
            t0 = time.perf_counter()
            with loading():
                self.models[key] = load_model_cached(key, self.seed)
            log.info("loaded %s in %.1f s", key, time.perf_counter() - t0)
        return self.models[key]

    def token_ids(self, key: str, corpus: str) -> tuple[Any, Any]:
        from experiments.corpora import corpus_token_ids

        need = self.need.get((key, corpus), 0)
        if (key, corpus, need) not in self.ids:
            lm = self.model(key)
            if lm.tokenizer is None:
                from meanfield.models.standins import no_tokenizer_message

                raise ValueError(no_tokenizer_message(lm.label))
            with loading():
                ids, corp = corpus_token_ids(corpus, lm.tokenizer, min_tokens=need)
            if ids.numel() < need:
                raise ValueError(
                    f"corpus {corpus!r} has {ids.numel()} tokens for {key}, the grid needs {need}"
                )
            self.ids[(key, corpus, need)] = (ids, corp)
        return self.ids[(key, corpus, need)]

    def attention(self, config: RealConfig) -> Any:
        from meanfield.models import hf_attention

        if config.id not in self.maps:
            lm = self.model(config.model)
            with loading():
                att = hf_attention(lm.model, config.layer, map=config.map, dtype=self.dtype)
                self.maps[config.id] = att.to(self.device)
        return self.maps[config.id]


def _workspace(run: str, seed: int, dtype: str, device: str) -> _Workspace:
    """The workspace of the run ``run`` in this process (shared by the driver and its tasks)."""
    import torch

    return worker_cache(
        ("real_data", run, int(seed), dtype, device),
        lambda: _Workspace(int(seed), getattr(torch, dtype), device),
    )


def real_point(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """One point of a real-data sweep: the stage's top-level task (docs/cluster.md).

    ``cfg`` holds the point (``n``, ``start``) and the sweep's context: ``config`` (a
    :class:`RealConfig`), ``corpus``, ``opts`` (the resolved settings), ``need`` (tokens of the
    corpus the run needs for that model), ``device``, ``threads`` (torch threads of the point)
    and ``run`` (names the workspace: the models, texts and maps this process loaded for the run).

    The point runs on ``threads`` torch threads, the count the serial run uses (the preset's
    ``threads``, or the driver's own count when that is ``None``), so that a Dask worker, started
    with one thread, computes the same floats as the serial run.
    """
    config, corpus, opts = cfg["config"], cfg["corpus"], cfg["opts"]
    with torch_threads(cfg["threads"]):
        ws = _workspace(cfg["run"], opts["seed"], opts["dtype"], cfg["device"])
        ws.require(config.model, corpus, cfg["need"])
        return _estimate(ws, cfg)


def real_facts(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """What the manifest says of a sweep's model, corpus and layer (``cfg``: a point's context).

    Loads them into the run's workspace of the process it runs in, where the points find them.
    """
    config, corpus, opts = cfg["config"], cfg["corpus"], cfg["opts"]
    with torch_threads(cfg["threads"]):
        ws = _workspace(cfg["run"], opts["seed"], opts["dtype"], cfg["device"])
        ws.require(config.model, corpus, cfg["need"])
        lm = ws.model(config.model)
        _, corp = ws.token_ids(config.model, corpus)
        return dict(
            model_label=lm.label,
            provenance=dict(lm.provenance),
            corpus_label=corp.label,
            corpus_source=corp.source,
            corpus_parts=list(corp.parts),
            layer_info=ws.attention(config).info.as_dict(),
        )


def user_configs(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``{"configs": [...]}``: the configurations of the user checkpoints ``cfg["models"]``."""
    ws = _workspace(cfg["run"], cfg["seed"], cfg["dtype"], cfg["device"])
    return {"configs": user_config_list(cfg["models"], cfg["layers"], ws.models)}


def real_points(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Several points of one configuration and one n, in one estimator call (``batch_windows``).

    ``cfg["members"]`` holds task configurations of :func:`real_point` that share the
    configuration, the n, the settings and the run (one per sweep: corpus and grid). The windows of
    all of them are stacked into one batch and bracketed in one call, whatever ``batch_tokens``;
    the result is ``{"members": [record values, ...]}``, one per member, in its order, each as
    :func:`real_point` would return it, plus ``batch_windows: True`` and the number of points
    batched (``points_per_call``). The values agree with the one-point path to within the
    estimator's tolerance, not bit for bit: the batch runs with other starting vectors.
    """
    import torch

    members = list(cfg["members"])
    first = members[0]
    config, opts = first["config"], first["opts"]
    shared = (config, first["n"], first["run"], first["device"])
    if any((m["config"], m["n"], m["run"], m["device"]) != shared for m in members[1:]):
        raise ValueError("real_points: members of one batch must share configuration and n")
    with torch_threads(first["threads"]):
        ws = _workspace(first["run"], opts["seed"], opts["dtype"], first["device"])
        windows = []
        for m in members:
            ws.require(config.model, m["corpus"], m["need"])
            windows.append(_windows(ws, m))
        X = torch.cat([hs.X for hs, _ in windows])
        br = _bracket(config, ws.attention(config), X, opts, per_call=X.shape[0])
        out, i = [], 0
        for m, (hs, t_hidden) in zip(members, windows):
            k = hs.X.shape[0]
            rec = _values(m, hs, t_hidden, br, slice(i, i + k))
            rec.update(batch_windows=True, points_per_call=len(members))
            out.append(rec)
            i += k
    return {"members": out}


def _estimate(ws: _Workspace, point: Mapping[str, Any]) -> dict[str, Any]:
    """One record: every window of one n, in calls of at most ``batch_tokens // n`` windows."""
    config, opts = point["config"], point["opts"]
    hs, t_hidden = _windows(ws, point)
    per_call = max(1, int(opts["batch_tokens"]) // int(point["n"]))
    br = _bracket(config, ws.attention(config), hs.X, opts, per_call=per_call)
    return _values(point, hs, t_hidden, br, slice(None))


def _windows(ws: _Workspace, point: Mapping[str, Any]) -> tuple[Any, float]:
    """The hidden states of the point's windows (at the layer's input), and their time."""
    from meanfield.models import hidden_states

    config = point["config"]
    lm = ws.model(config.model)
    ids, _ = ws.token_ids(config.model, point["corpus"])
    ws.attention(config)
    t0 = time.perf_counter()
    hs = hidden_states(
        lm.model,
        lm.tokenizer,
        ids,
        config.layer,
        int(point["n"]),
        n_windows=point["opts"]["n_windows"],
        start=int(point["start"]),
        dtype=ws.dtype,
        device=ws.device,
    )
    return hs, time.perf_counter() - t0


#: Per window: the estimate, its certified bracket ``[lower, upper]`` (deterministic), the
#: probabilistic upper end ``upper_prob`` (``exact <= upper_prob <= upper`` with probability
#: ``confidence`` over the seeded random start; a call that forms none records ``upper`` and
#: ``confidence`` null) and the iteration's counts.
_FIELDS = ("value", "lower", "upper", "upper_prob", "converged", "n_matvec", "n_iter", "residual")


def _bracket(
    config: RealConfig, att: Any, X: Any, opts: Mapping[str, Any], *, per_call: int
) -> dict[str, Any]:
    """Bracket, estimate and released metric of every window of ``X``, ``per_call`` at a time."""
    import torch

    from meanfield.lipschitz import local_lipschitz, local_lipschitz_fn, released_metric

    def f(Y):
        return att(Y, masked=config.masked)

    kw = dict(method=opts["method"], tol=opts["tol"], max_iter=opts["max_iter"], seed=opts["seed"])
    parts: dict[str, list] = {k: [] for k in (*_FIELDS, "released")}
    t_est = t_rel = 0.0
    methods = set()
    confidence: set[float | None] = set()
    for i in range(0, X.shape[0], per_call):
        Xc = X[i : i + per_call]
        ta = time.perf_counter()
        if config.map == "block":
            est = local_lipschitz_fn(f, Xc, batch_dims=1, **kw)
        else:
            est = local_lipschitz(Xc, att.params, masked=config.masked, **kw)
        tb = time.perf_counter()
        rel = released_metric(f, Xc, batch_dims=1)
        t_rel += time.perf_counter() - tb
        t_est += tb - ta
        methods.add((est.method, est.upper_method))
        confidence.add(est.confidence)
        for k in _FIELDS:
            v = getattr(est, k)
            # no probabilistic end (a delta=None override): the deterministic one, confidence null
            parts[k].append((est.upper if v is None else v).detach().cpu())
        parts["released"].append(rel.detach().cpu())
    ((method, upper_method),) = methods
    (conf,) = confidence
    return {
        "confidence": conf,
        "cat": {k: torch.cat(v) for k, v in parts.items()},
        "method": method,
        "upper_method": upper_method,
        "seconds_estimate": t_est,
        "seconds_released": t_rel,
        "windows_per_call": per_call,
    }


def _values(
    point: Mapping[str, Any], hs: Any, t_hidden: float, br: Mapping[str, Any], rows: slice
) -> dict[str, Any]:
    """The record of one point from its windows and its rows of the bracket ``br``."""
    config, opts = point["config"], point["opts"]

    def lst(t):
        return t.detach().cpu().tolist()

    return {
        "n": int(point["n"]),
        "n_windows": hs.n_windows,
        "starts": list(hs.starts),
        "next_start": hs.next_start,
        **{k: lst(v[rows]) for k, v in br["cat"].items()},
        "method": br["method"],
        "upper_method": br["upper_method"],
        "confidence": br["confidence"],
        "mean_radius": lst(hs.mean_radius()),
        "max_radius": lst(hs.max_radius()),
        "seconds_hidden": t_hidden,
        "seconds_estimate": br["seconds_estimate"],
        "seconds_released": br["seconds_released"],
        "windows_per_call": br["windows_per_call"],
        "seed": opts["seed"],
        "dtype": opts["dtype"],
        "map": config.map,
        "masked": config.masked,
        "layer": config.layer,
        "capture_point": hs.capture_point,
    }


_RECORDED = ("n_windows", "method", "tol", "max_iter", "seed", "dtype", "batch_tokens")


def execute(cfg: RealDataSettings, out: Path, run: StageRun) -> Steps:
    """The real-data sweeps of ``cfg`` into ``out`` (the contract of experiments.engine.Stage).

    The settings (:class:`RealDataSettings`): ``configs`` (ids of :data:`CONFIGS`), ``corpora``
    (``"kjv"``, ``"pydoc"`` or text-file paths), ``n_grid``, ``long_grid`` (``None`` disables),
    ``long_corpora`` (the corpora that get the long grid; ``None``: all of them), ``n_windows``,
    ``method``, ``tol``, ``max_iter``, ``seed``, ``dtype``, ``threads`` (torch threads during
    the run; ``None`` leaves the setting), ``batch_tokens`` (windows are estimated in batched
    calls of at most ``max(1, batch_tokens // n)`` windows, which bounds memory on the long
    grid), ``batch_windows`` (``True``: the windows of every sweep of the run with the same
    configuration and n, all corpora and grids, go into one estimator call, whatever
    ``batch_tokens``; ``None``, the presets' value: ``True`` on a CUDA device, ``False``
    elsewhere; not part of the sweep's hash, see docs/cluster.md), ``models`` (local checkpoint
    directories or cached hub names, measured at ``layers``, default 0 and the middle layer,
    with the model's own causal flag; BERT checkpoints also get the "block" map; pass
    ``configs=[]`` to run only them) and ``layers``. The hidden states and the estimator live on
    ``run.device`` (the forward passes run where the model is, on the CPU). Returns the sweep
    files (``.jsonl`` and ``.meta.json``) and the manifest.
    """
    import torch

    preset, device = run.preset, run.device
    # the settings as the points read them (real_point's "opts"), in their plain JSON shape
    opts = cfg.options()
    recorded = {k: opts[k] for k in _RECORDED}
    # what every point runs on (see real_point): the preset's count, else this process's
    threads = torch.get_num_threads() if cfg.threads is None else int(cfg.threads)
    run_id = uuid.uuid4().hex
    try:
        ws = _workspace(run_id, cfg.seed, cfg.dtype, device)
        where = {"seed": cfg.seed, "dtype": cfg.dtype, "device": device}
        configs = [CONFIGS[c] for c in cfg.configs]
        if cfg.models:
            configs += run.remote(
                user_configs,
                {"models": opts["models"], "layers": opts["layers"], "run": run_id, **where},
            )["configs"]
        plan = []
        for config in configs:
            for corpus in cfg.corpora:
                grids = [("short", list(cfg.n_grid))]
                long_ok = cfg.long_corpora is None or corpus in cfg.long_corpora
                if config.long and cfg.long_grid is not None and long_ok:
                    grids.append(("long", list(cfg.long_grid)))
                for gname, grid in grids:
                    plan.append((config, corpus, gname, grid))
                    ws.require(config.model, corpus, cfg.n_windows * sum(grid))
        batch = cfg.batch_windows
        if batch is None:  # batched on a GPU; one point per call on the CPU (docs/cluster.md)
            batch = str(device).startswith("cuda")
        jobs: list[Any] = []
        manifest_path = out / MANIFEST
        manifest = load_json(manifest_path) if manifest_path.exists() else {"sweeps": {}}
        files: list[Path] = []
        for config, corpus, gname, grid in plan:
            name = sweep_name(config, corpus, gname)
            sweep_cfg = {
                "experiment": NAME,
                "config": config.as_dict(),
                "corpus": corpus,
                "grid": gname,
                "n_grid": grid,
                **recorded,
            }
            sweep = Sweep(out, name, sweep_cfg, seed=cfg.seed, device=device, dtype=cfg.dtype)
            points = [
                {"n": n, "start": s} for n, s in zip(grid, window_starts(grid, cfg.n_windows))
            ]
            entry = dict(manifest["sweeps"].get(name, {}))
            if entry.get("config_hash") != sweep.digest:
                entry = {}
            entry.update(
                name=name,
                config_hash=sweep.digest,
                config=config.as_dict(),
                corpus=corpus,
                corpus_stands_in_for=CORPUS_STANDS_IN.get(corpus),
                grid=gname,
                n_grid=grid,
                n_windows=cfg.n_windows,
                preset=preset,
                options=dict(recorded),
                paper_configuration=config.paper,
                records=f"{name}.jsonl",
            )
            manifest["sweeps"][name] = entry
            write_json(manifest_path, manifest)
            if sweep.unfinished(points):
                context = {
                    "config": config,
                    "corpus": corpus,
                    "opts": opts,
                    "need": ws.need[(config.model, corpus)],
                    "device": device,
                    "threads": threads,
                    "run": run_id,
                }
                # loaded where the points run: the driver of a distributed run loads no model
                entry.update(run.remote(real_facts, context))
                write_json(manifest_path, manifest)

                d = entry["layer_info"]["d"]

                def cost(p: Mapping[str, Any], d: int = d, windows: int = cfg.n_windows) -> float:
                    return float(p["n"]) ** 2 * d * windows

                # batched: one call per (configuration, n) across the sweeps of this run
                job = sweep.job(
                    points,
                    real_point,
                    context,
                    cost=cost,
                    batch_fn=real_points if batch else None,
                    batch_key=_batch_key if batch else None,
                )
                jobs.append(job)
            files += [sweep.path, sweep.meta_path]
        yield jobs  # one round: every sweep's points
        return [*files, manifest_path, *export_csv(out.parent)]
    finally:
        forget_worker_cache(("real_data", run_id, int(cfg.seed), cfg.dtype, device))


def _batch_key(cfg: Mapping[str, Any]) -> tuple[Any, ...]:
    """Points computed in one call: same configuration, n, run, device and threads."""
    return (cfg["config"].id, int(cfg["n"]), cfg["run"], cfg["device"], cfg["threads"])
