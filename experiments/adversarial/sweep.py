"""The sweeps of the ``adversarial`` stage (``run``).

The models (offline stand-ins and tiny random ones), one resumable sweep per configuration over
(n, variant), the worst-case search on a synthetic head, and the CSV export.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..engine import (
    StageRun,
    Steps,
    Sweep,
    SweepJob,
    forget_worker_cache,
    load_json,
    loading,
    torch_threads,
    worker_cache,
    write_csv,
    write_json,
)
from .bounds import global_bound, layer_head_facts, released_heuristic
from .report import load_results
from .settings import (
    CONFIGS,
    NAME,
    TINY_MODEL_KEYS,
    AdvConfig,
    AdversarialSettings,
    config_settings,
)


def _tiny_model(key: str, seed: int) -> Any:
    """Tiny random GPT-2 / BERT (d = 32, 4 heads, 2 layers) for the tests' preset."""
    import torch
    import transformers as tr

    from meanfield.models import LoadedModel, layer_info, tiny_config

    cls: type[tr.PreTrainedModel]
    if key == "gpt2-random-tiny":
        cfg = tiny_config("gpt2", d=32, heads=4)
        cls, label = tr.GPT2Model, "GPT-2 architecture, tiny random config (d = 32, 4 heads)"
    else:
        cfg = tiny_config("bert", d=32, heads=4, intermediate=64)
        cls, label = tr.BertModel, "BERT architecture, tiny random config (d = 32, 4 heads)"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        model = cls(cfg)
    model.eval()
    info = layer_info(model, 0)
    prov = {
        "model": f"{cls.__name__}(tiny config)",
        "source": "transformers config",
        "pretrained": False,
        "seed": int(seed),
        "quantization": None,
        "architecture": info.arch,
        "d": info.d,
        "n_heads": info.n_heads,
        "n_layers": info.n_layers,
        "transformers_version": tr.__version__,
    }
    return LoadedModel(model, None, label, prov)


def load_model_cached(key: str, seed: int) -> Any:
    """The model of ``key`` (a tiny random model of the tests, a stand-in or a checkpoint)."""
    from meanfield.models import load_model

    if key in TINY_MODEL_KEYS:
        return _tiny_model(key, seed)
    return load_model(key, seed=seed)


#: Model keys of the offline stand-ins and the tests' tiny models (not a user checkpoint).
_STANDINS = ("minilm", "smollm2", "gpt2-random", "bert-random", *TINY_MODEL_KEYS)


def _f(x: Any) -> float | None:
    """Finite float or None (JSON)."""
    v = float(x)
    return v if math.isfinite(v) else None


class _Workspace:
    """Models and per-configuration heads of one run of the stage, in one process."""

    def __init__(self) -> None:
        self.models: dict[tuple[str, int], Any] = {}
        self.heads: dict[tuple[str, str], dict[str, Any]] = {}

    def model(self, key: str, seed: int) -> Any:
        if (key, seed) not in self.models:
            with loading():
                self.models[(key, seed)] = load_model_cached(key, seed)
        return self.models[(key, seed)]

    def head(self, c: AdvConfig, settings: Mapping[str, Any], device: str) -> dict[str, Any]:
        """The loaded model, the layer's parameters, their facts and the constructions memo."""
        import torch

        from meanfield.models import hf_attention

        if (c.id, device) not in self.heads:
            loaded = self.model(settings["model"], c.seed)
            with loading():  # the layer's setup: once per process, like the model's load
                att = hf_attention(
                    loaded.model, settings["layer"], map=settings["map"], dtype=torch.float64
                ).to(device)
                params = att.params
                if not 0 <= settings["head"] < params.n_heads:
                    raise ValueError(
                        f"{c.id}: head {settings['head']} out of range ({params.n_heads} heads)"
                    )
                facts = layer_head_facts(params)
            self.heads[(c.id, device)] = {
                "loaded": loaded,
                "att": att,
                "params": params,
                "facts": facts,
                "rope": any(f["rope"] for f in facts),
                "constructions": {},
            }
        return self.heads[(c.id, device)]


def _workspace(run: str) -> _Workspace:
    """The workspace of the run ``run`` in this process (shared by the driver and its tasks)."""
    return worker_cache(("adversarial", run), _Workspace)


def adv_point(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """One point (``n``, ``variant``) of a model configuration: the stage's top-level task.

    The context holds ``config`` (an :class:`AdvConfig`), ``settings``, ``device``, ``threads``
    (the torch threads of the serial run, so that every process computes the same floats) and
    ``run`` (names the per-process workspace that loads each model once).
    """
    with torch_threads(cfg["threads"]):
        ws = _workspace(cfg["run"])
        head = ws.head(cfg["config"], cfg["settings"], cfg["device"])
        return _adv_compute(cfg, head)


def adv_facts(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """What ``<id>.json`` says of a configuration's model and head (``cfg``: a point's context).

    Loads them into the run's workspace of the process it runs in, where the points find them.
    """
    with torch_threads(cfg["threads"]):
        head = _workspace(cfg["run"]).head(cfg["config"], cfg["settings"], cfg["device"])
        loaded, att = head["loaded"], head["att"]
        return {
            "label": loaded.label,
            "provenance": dict(loaded.provenance),
            "layer_info": att.info.as_dict(),
            "head_facts": head["facts"],
            "construction_exact": not head["rope"],
        }


def _adv_compute(point: Mapping[str, Any], head: Mapping[str, Any]) -> dict[str, Any]:
    """The record of one point (with its context, as :func:`adv_point` gets it) on ``head``."""
    import torch

    from meanfield.attacks import adversarial_sequence
    from meanfield.lipschitz import certified_local_upper, local_lipschitz

    c, settings, device = point["config"], point["settings"], point["device"]
    loaded, params, facts, rope = head["loaded"], head["params"], head["facts"], head["rope"]
    constructions = head["constructions"]
    R = settings["R"]
    n, variant = int(point["n"]), point["variant"]
    if variant not in constructions:  # the longest sequence, once per variant and process
        try:
            constructions[variant] = adversarial_sequence(
                params.heads[settings["head"]].A, R, max(settings["n_grid"]), variant=variant
            )
        except ValueError as err:  # released variant: no real eigenvalue
            constructions[variant] = err
    rec: dict[str, Any] = {
        "config": c.id,
        "n": n,
        "variant": variant,
        "model": loaded.label,
        "model_key": settings["model"],
        **{k: settings[k] for k in ("layer", "head", "R", "map", "masked")},
        "seed": c.seed,
        "rope": rope,
        "construction_exact": not rope,
    }
    seq = constructions[variant]
    if isinstance(seq, Exception):
        return {**rec, "status": "skipped", "reason": str(seq)}
    X = seq.X[:n].to(device)
    norms = torch.linalg.vector_norm(X, dim=-1)
    if float(norms.max()) > R * (1 + 1e-12):
        raise RuntimeError("the construction left the ball of radius R")
    est = local_lipschitz(
        X,
        params,
        masked=settings["masked"],
        tol=settings["tol"],
        max_iter=settings["max_iter"],
        seed=c.seed,
    )
    loc = certified_local_upper(
        X, params, masked=settings["masked"], WV_norms=[f["WV_norm"] for f in facts]
    )
    g3 = global_bound(facts, R, n, form="sqrt3")
    gt = global_bound(facts, R, n, form="triangle")
    lower = float(est.lower)
    p = 1.0 / (1.0 + math.exp(min(math.log(n - 1) - seq.gamma, 700.0)))
    return {
        **rec,
        "status": "ok",
        "case": seq.case,
        "lam": seq.lam,
        "gamma": seq.gamma,
        "p": p,
        "value": float(est.value),
        "lower": lower,
        "upper": _f(est.upper),
        "method": est.method,
        "upper_method": est.upper_method,
        "converged": bool(est.converged),
        "n_iter": int(est.n_iter),
        "residual": float(est.residual),
        "global_bound": g3,
        "global_bound_triangle": gt,
        "local_bound": loc.value,
        "local_terms": {"T1": loc.T1, "T2": loc.T2, "T3": loc.T3},
        "released_heuristic": released_heuristic(X, params),
        "max_token_norm": float(norms.max()),
        "rms_radius": float(norms.square().mean().sqrt()),
        "bounds_hold": bool(lower <= gt <= g3 and lower <= loc.value),
    }


def _config_job(
    out: Path,
    c: AdvConfig,
    settings: dict[str, Any],
    *,
    run: StageRun,
    run_id: str,
    threads: int,
) -> tuple[SweepJob | None, list[Path]]:
    """The round's job of configuration ``c`` (``None`` when finished) and its files."""
    sweep = Sweep(out, c.id, settings, seed=c.seed, device=run.device, dtype="float64")
    points = [{"n": n, "variant": v} for n in settings["n_grid"] for v in settings["variants"]]
    info_path = out / f"{c.id}.json"
    files = [sweep.path, sweep.meta_path, info_path]
    if not sweep.unfinished(points) and info_path.exists():
        if load_json(info_path).get("config_hash") == sweep.digest:
            return None, files

    context = {
        "config": c,
        "settings": settings,
        "device": run.device,
        "threads": threads,
        "run": run_id,
    }
    # loaded where the points run: the driver of a distributed run loads no model
    facts = run.remote(adv_facts, context)
    write_json(
        info_path,
        {
            "config": asdict(c),
            "config_hash": sweep.digest,
            "settings": settings,
            **facts,
            "standin": settings["model"] in _STANDINS,
        },
    )
    d = int(facts["layer_info"]["d"])
    return sweep.job(points, adv_point, context, cost=lambda p: float(p["n"]) ** 2 * d), files


def _synthetic_head(wc: Mapping[str, Any]) -> tuple[Any, float, float]:
    """Single head of the worst-case search: non-symmetric A with ||A||_2 = A_norm, V = I.

    Returns the head and the spectral norms of its A and V as computed (float64).
    """
    import torch

    from meanfield import AttentionParams

    g = torch.Generator().manual_seed(int(wc["seed"]))
    d = int(wc["d"])
    A = torch.randn(d, d, generator=g, dtype=torch.float64)
    A = float(wc["A_norm"]) * A / torch.linalg.matrix_norm(A, ord=2)
    head = AttentionParams(A, torch.eye(d, dtype=torch.float64))
    A_norm = float(torch.linalg.matrix_norm(head.A, ord=2))
    return head, A_norm, float(torch.linalg.matrix_norm(head.V, ord=2))


def worst_case_point(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """One ``n`` of the worst-case sequence search: a top-level task (context: wc, threads)."""
    import torch

    from meanfield.attacks import adversarial_sequence, worst_case_sequence
    from theory.bounds import sqrt_n_lower, sqrt_n_upper

    wc = cfg["wc"]
    with torch_threads(cfg["threads"]):
        head, A_norm, V_norm = _synthetic_head(wc)
        R = float(wc["R"])
        n = int(cfg["n"])
        res = worst_case_sequence(
            head,
            R,
            n,
            n_restarts=int(wc["n_restarts"]),
            steps=int(wc["steps"]),
            lr=float(wc["lr"]),
            seed=int(wc["seed"]),
        )
        seq = adversarial_sequence(head, R, n, variant="symmetric")
        Vu = float(torch.linalg.vector_norm(head.V @ seq.u))
        triangle = float(sqrt_n_upper(A_norm, V_norm, R, n, form="triangle"))
        return {
            "n": n,
            "value": res.value,
            "lower": res.lower,
            "upper": _f(res.upper),
            "bracket": res.bracket,
            "construction_value": res.construction_value,
            "construction_formula": float(sqrt_n_lower(seq.gamma, n, Vu)),
            "gamma": seq.gamma,
            "global_bound": float(sqrt_n_upper(A_norm, V_norm, R, n)),
            "global_bound_triangle": triangle,
            "bounds_hold": bool(res.lower <= triangle),
        }


def _worst_case_job(
    out: Path, wc: Mapping[str, Any], *, threads: int
) -> tuple[SweepJob, list[Path]]:
    """The round's job of the worst-case search, and its files (``worst_case.json`` written)."""
    settings = {"kind": "worst_case_sequence", **dict(wc)}
    sweep = Sweep(out, "worst_case", settings, seed=int(wc["seed"]), device="cpu", dtype="float64")
    head, A_norm, V_norm = _synthetic_head(wc)
    job = sweep.job(
        [{"n": int(n)} for n in sorted(set(wc["n_grid"]))],
        worst_case_point,
        {"wc": dict(wc), "threads": threads},
        cost=lambda p: float(p["n"]) ** 2 * int(wc["d"]),
    )
    info = out / "worst_case.json"
    write_json(
        info,
        {
            "config_hash": sweep.digest,
            "settings": settings,
            "A": head.A,
            "A_norm": A_norm,
            "V_norm": V_norm,
            "label": f"synthetic head, d = {wc['d']}, ||A||_2 = {A_norm:g}, V = I",
        },
    )
    return job, [sweep.path, sweep.meta_path, info]


def execute(cfg: AdversarialSettings, out: Path, run: StageRun) -> Steps:
    """The adversarial sweeps of ``cfg`` into ``out`` (the contract of experiments.engine.Stage).

    ``tiny``: tiny random models (tests). ``quick``: random GPT-2 L6 and MiniLM L0 on
    n ∈ {2, 12, 27, 52, 97} plus a small worst-case search. ``paper``: the four configurations on
    ``range(2, 100, 5)`` and the worst-case search. The settings (:class:`AdversarialSettings`)
    are ``configs``, ``models`` ({id: model key or checkpoint path}), ``layers``, ``heads``,
    ``radii`` ({id: value}), ``n_grid``, ``variants``, ``worst_case`` (mapping, or None to
    skip), ``tol``, ``max_iter`` and ``torch_threads``. Also writes ``run.json`` and the CSV
    export.
    """
    import torch

    files: list[Path] = []
    jobs: list[SweepJob] = []
    run_id = uuid.uuid4().hex
    try:
        with torch_threads(cfg.torch_threads):
            threads = torch.get_num_threads()  # every point runs on as many (see adv_point)
            for cid in cfg.configs:
                c = CONFIGS[cid]
                job, written = _config_job(
                    out, c, config_settings(c, cfg), run=run, run_id=run_id, threads=threads
                )
                jobs += [job] if job is not None else []
                files += written
            if cfg.worst_case is not None:
                job, written = _worst_case_job(out, cfg.worst_case, threads=threads)
                jobs.append(job)
                files += written
        yield jobs  # one round: every configuration's points and the worst-case search
    finally:
        forget_worker_cache(("adversarial", run_id))
    run_doc = {
        "preset": run.preset,
        "configs": list(cfg.configs),
        "worst_case": cfg.worst_case is not None,
    }
    return [*files, write_json(out / "run.json", run_doc), *export_csv(out.parent)]


def export_csv(results_dir: Path) -> list[Path]:
    """Write ``adversarial/records.csv`` from the saved records.

    One row per (configuration, n, variant) and per point of the worst-case search, with every
    scalar field of the records (lists and mappings, such as the per-term bounds, stay in the
    JSONL files; metadata in ``<id>.json`` and ``.meta.json``).

    Returns
    -------
    list of Path
        The file, or nothing when there are no results.
    """
    try:
        res = load_results(results_dir)
    except FileNotFoundError:
        return []
    groups = [(cid, entry["records"]) for cid, entry in res["configs"].items()]
    if res["worst_case"] is not None:
        groups.append(("worst_case", res["worst_case"]["records"]))
    rows = []
    for cid, recs in groups:
        for r in sorted(recs, key=lambda r: (r["n"], str(r.get("variant", "")))):
            scalars = {
                k: v
                for k, v in r.items()
                if k not in ("key", "config_hash")
                and (v is None or isinstance(v, (str, int, float)))
            }
            rows.append({"config": cid, **scalars})
    if not rows:
        return []
    return [write_csv(Path(results_dir) / NAME / "records.csv", rows)]
