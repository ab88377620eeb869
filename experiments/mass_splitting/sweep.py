"""The computation of the ``attacks`` stage: the points of figures B and C, their files, ``execute``."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

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
from .settings import MassSplittingSettings

__all__ = [
    "ATTACK_INPUTS",
    "FIG_B_SETTINGS",
    "attack_doc",
    "attack_inputs",
    "execute",
    "figure_b_results",
    "figure_c_results",
    "mass_splitting_point",
    "measure_doc",
    "worst_measure_point",
]

log = logging.getLogger("meanfield.attack")

#: The two settings of figure B (docs/experiments.md, figure A settings): d = 1 with A = 1 (positive
#: eigenvalue, chains), and d = 2 with A = diag(1, -0.3); V = I in both.
FIG_B_SETTINGS = {
    "d1": ([[1.0]], "d = 1, A = 1, V = 1"),
    "d2": ([[1.0, 0.0], [0.0, -0.3]], "d = 2, A = diag(1, -0.3), V = I"),
}


def measure_doc(mu: Any) -> dict[str, Any]:
    """Atoms and log10 masses of a measure, as JSON lists."""
    return {
        "points": mu.points.tolist(),
        "log10_weights": (mu.log_weights / math.log(10.0)).tolist(),
    }


def worst_measure_point(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """One point of figure B: the worst measure of setting ``cfg["setting"]`` at radius ``R``.

    A top-level task (docs/cluster.md): ``cfg`` holds ``setting``, ``R``, ``n_atoms``,
    ``n_restarts``, ``steps``, ``seed`` and optionally ``progress``; one torch thread.
    """
    import torch

    from meanfield import AttentionParams
    from meanfield.attacks import worst_case_measure

    key, R = cfg["setting"], cfg["R"]
    with torch_threads(1):
        A = torch.tensor(FIG_B_SETTINGS[key][0], dtype=torch.float64)
        params = AttentionParams(A, torch.eye(A.shape[0], dtype=torch.float64))
        res = worst_case_measure(
            params,
            R,
            cfg["n_atoms"],
            n_restarts=cfg["n_restarts"],
            steps=cfg["steps"],
            seed=cfg["seed"],
            progress=cfg.get("progress", False),
        )
    log.info("%s R=%g: %.6g (two-Dirac %.6g)", key, R, res.value, res.two_dirac_bound)
    return {
        "points": res.measure.points.numpy(),
        "log_weights": res.measure.log_weights.numpy(),
        "value": res.value,
        "two_dirac_bound": res.two_dirac_bound,
        "construction_value": res.construction_value,
    }


def _num(x: Any) -> Any:
    """A value as a sweep record stores it (:func:`experiments.engine.jsonable`), back as floats.

    ``None`` is NaN and ``"inf"``/``"-inf"`` are infinities; lists are converted element-wise.
    """
    if isinstance(x, (list, tuple)):
        return [_num(v) for v in x]
    return record_float(x) if x is None or isinstance(x, str) else x


#: The per-radius values of a figure-B point, with the name of their ``.npz`` array.
_B_FIELDS = {"value": "value", "two_dirac_bound": "two_dirac", "construction_value": "construction"}


def _write_b(
    out: Path,
    config: Mapping[str, Any],
    rows: Mapping[tuple[str, float], Mapping[str, Any]],
    seed: int,
) -> list[Path]:
    """Figure B's files from its points, ``rows[(setting, R)]``."""
    radii, n_atoms = config["radii"], config["n_atoms"]
    arrays: dict[str, np.ndarray] = {"radii": np.asarray(radii, dtype=np.float64)}
    summary: dict[str, Any] = {"radii": list(radii), "n_atoms": n_atoms, "settings": {}}
    for key, (A_list, label) in FIG_B_SETTINGS.items():
        got = [rows[(key, R)] for R in radii]
        for f in ("points", "log_weights"):
            arrays[f"{key}_{f}"] = np.stack([np.asarray(_num(r[f]), dtype=np.float64) for r in got])
        entry: dict[str, Any] = {"label": label, "A": A_list}
        for field, name in _B_FIELDS.items():
            entry[field] = [_num(r[field]) for r in got]
            arrays[f"{key}_{name}"] = np.asarray(entry[field])
        summary["settings"][key] = entry
    doc = {
        "kind": "worst_measures",
        **summary,
        "metadata": run_metadata(seed=seed, device="cpu", dtype="float64", config=dict(config)),
    }
    return [
        save_npz(out / "worst_measures.npz", **arrays),
        write_json(out / "worst_measures.json", doc),
    ]


def figure_b_results(
    out_dir: str | Path,
    *,
    radii: Sequence[float] = (1.0, 2.0, 4.0, 6.0),
    n_atoms: int = 3,
    n_restarts: int = 16,
    steps: int = 300,
    seed: int = 0,
    progress: bool = False,
) -> list[Path]:
    """Run the worst-case-measure sweep of figure B and write ``worst_measures.{npz,json}``.

    For the two settings of :data:`FIG_B_SETTINGS` and every radius, the best measure with
    ``n_atoms`` atoms (:func:`meanfield.attacks.worst_case_measure`), its value, the closed-form
    two-Dirac bound and the best construction value.
    """
    cfg = {"n_atoms": n_atoms, "n_restarts": n_restarts, "steps": steps, "seed": seed}
    rows = {
        (key, R): worst_measure_point({**cfg, "setting": key, "R": R, "progress": progress})
        for key in FIG_B_SETTINGS
        for R in radii
    }
    config = {"radii": list(radii), "n_atoms": n_atoms, "n_restarts": n_restarts, "steps": steps}
    return _write_b(Path(out_dir), config, rows, seed)


def attack_inputs(R: float) -> tuple[Any, dict[str, Any]]:
    """Figure C's head (d = 2, A = diag(1, -0.3), V = I) and its two input measures."""
    import torch

    from meanfield import AttentionParams, DiracMeasure

    A = torch.tensor([[1.0, 0.0], [0.0, -0.3]], dtype=torch.float64)
    params = AttentionParams(A, torch.eye(2, dtype=torch.float64))
    u = torch.tensor([1.0, 0.0], dtype=torch.float64)
    w = torch.tensor([0.0, 1.0], dtype=torch.float64)
    dirac = DiracMeasure((0.5 * R * u).unsqueeze(0))
    few = DiracMeasure(
        torch.stack([0.5 * R * u, -0.5 * R * u, 0.5 * R * w]),
        torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64),
    )
    return params, {"dirac": dirac, "few-atom": few}


def attack_doc(res: Any) -> dict[str, Any]:
    """A mass-splitting attack result as a JSON-able dict (every perturbation tried)."""

    def pert(q: Any) -> dict[str, Any]:
        return {
            "kind": q.kind,
            "k": q.k,
            "atom": q.atom,
            "input_w2": q.input_w2,
            "output_w2": q.output_w2,
            "ratio_w2": q.ratio_w2,
            "input_winf": q.input_winf,
            "output_winf": q.output_winf,
            "ratio_winf": q.ratio_winf,
            "cost_bound": q.cost_bound,
            "nu": measure_doc(q.nu),
        }

    return {
        "budget": res.budget,
        "move": pert(res.move),
        "split": pert(res.split),
        "split_by_k": [pert(q) for q in res.split_by_k],
        "duplicate": [pert(q) for q in res.duplicate],
        "insert": pert(res.insert),
        "gain": res.gain,
        "gain_winf": res.gain_winf,
    }


def figure_c_results(
    out_dir: str | Path,
    *,
    radii: Sequence[float] = (2.0, 3.0, 4.0, 5.0),
    k_curve_max: int = 100_000,
    budgets: Sequence[float] = (0.05, 0.1, 0.2, 0.5, 1.0),
    R_attack: float = 4.0,
    k_max: int = 4,
    n_restarts: int = 2,
    steps: int = 100,
    seed: int = 0,
) -> list[Path]:
    """Run the mass-splitting sweep of figure C and write ``mass_splitting.{npz,json}``.

    Left panel data: ``G_k`` (:func:`theory.bounds.split_gain`) on a log grid of ``k`` for
    ``s = R^2/4`` (``lambda = 1``) and every radius, with the best integer ``k``. Right panel
    data: move-only and split-then-move ratios (exact ``W_2`` and ``W_inf``) against the budget,
    at a Dirac ``delta_{R u / 2}`` and at a three-atom measure, for the head
    ``A = diag(1, -0.3)``, ``V = I`` in ``B_R``, ``R = R_attack``.
    """
    cfg = {"R_attack": R_attack, "k_max": k_max, "n_restarts": n_restarts, "steps": steps}
    rows = {
        (name, b): mass_splitting_point({**cfg, "seed": seed, "input": name, "budget": b})
        for name in ATTACK_INPUTS
        for b in budgets
    }
    config = {"radii": list(radii), "budgets": list(budgets), **cfg}
    return _write_c(Path(out_dir), config, rows, seed, k_curve_max)


#: The input measures of figure C's attacks (:func:`attack_inputs`).
ATTACK_INPUTS = ("dirac", "few-atom")


def mass_splitting_point(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """One point of figure C: the attack on input ``cfg["input"]`` under W₂ budget ``budget``.

    A top-level task (docs/cluster.md): ``cfg`` holds ``input``, ``budget``, ``R_attack``,
    ``k_max``, ``n_restarts``, ``steps`` and ``seed``; one torch thread.
    """
    from meanfield.attacks import mass_splitting_attack

    params, inputs = attack_inputs(cfg["R_attack"])
    with torch_threads(1):
        res = mass_splitting_attack(
            inputs[cfg["input"]],
            params,
            cfg["budget"],
            R=cfg["R_attack"],
            k_max=cfg["k_max"],
            n_restarts=cfg["n_restarts"],
            steps=cfg["steps"],
            seed=cfg["seed"],
        )
    return {"attack": attack_doc(res)}


def _write_c(
    out: Path,
    config: Mapping[str, Any],
    rows: Mapping[tuple[str, float], Mapping[str, Any]],
    seed: int,
    k_curve_max: int,
) -> list[Path]:
    """Figure C's files from its points, ``rows[(input, budget)]``."""
    from theory.bounds import optimal_split_k, split_gain

    radii, budgets = config["radii"], config["budgets"]
    ks = np.unique(np.round(np.logspace(0, math.log10(k_curve_max), 240))).astype(np.float64)
    s = np.asarray(radii, dtype=np.float64) ** 2 / 4.0
    G = np.stack([split_gain(ks, si) for si in s])
    arrays: dict[str, Any] = {
        "k": ks,
        "radii": np.asarray(radii, dtype=np.float64),
        "s": s,
        "G": G,
        "k_opt": np.asarray([float(optimal_split_k(si)) for si in s]),
        "budgets": np.asarray(budgets, dtype=np.float64),
    }
    params, _ = attack_inputs(config["R_attack"])
    attacks: dict[str, Any] = {}
    for name in ATTACK_INPUTS:
        docs = [rows[(name, b)]["attack"] for b in budgets]
        attacks[name] = docs
        key = name.replace("-", "_")
        for f, (part, field) in {
            "move_w2": ("move", "ratio_w2"),
            "split_w2": ("split", "ratio_w2"),
            "move_winf": ("move", "ratio_winf"),
            "split_winf": ("split", "ratio_winf"),
            "split_k": ("split", "k"),
        }.items():
            vals = [_num(d[part][field]) for d in docs]
            arrays[f"{key}_{f}"] = np.asarray(vals, dtype=np.float64)
    arrays["V_norm"] = np.float64(float(params.V_norm()))
    doc = {
        "kind": "mass_splitting",
        "head": "d = 2, A = diag(1, -0.3), V = I",
        "inputs": {
            "dirac": "delta at (R/2) e1",
            "few-atom": "0.6 delta_{(R/2) e1} + 0.3 delta_{-(R/2) e1} + 0.1 delta_{(R/2) e2}",
        },
        "attacks": attacks,
        "metadata": run_metadata(seed=seed, device="cpu", dtype="float64", config=dict(config)),
    }
    return [
        save_npz(out / "mass_splitting.npz", **arrays),
        write_json(out / "mass_splitting.json", doc),
    ]


# ----------------------------------------------------------------------------- the stage
_FILES = {"figure_b": "worst_measures", "figure_c": "mass_splitting"}


def _same_config(json_path: Path, config: dict[str, Any]) -> bool:
    """Whether a finished result (``.json`` and ``.npz``) was produced with ``config``.

    A file that cannot be read is logged and computed again; a setting the result did not record
    does not count against it.
    """
    recorded = finished_config(json_path)
    return recorded is not None and all(
        _norm(recorded[key]) == _norm(value) for key, value in config.items() if key in recorded
    )


def _norm(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return [_norm(x) for x in v]
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def execute(cfg: MassSplittingSettings, out: Path, run: StageRun) -> Steps:
    """The figure-B and figure-C sweeps of ``cfg`` into ``out`` (the stage contract).

    Tiny dense problems, faster on one CPU thread than on a GPU (the stage runs on the CPU only);
    the settings are the groups ``figure_b`` and ``figure_c`` and ``seed``. A sub-result already
    computed with the same settings is kept. One round holds the points of both figures: one
    per (setting, radius) or (input, budget).
    """
    del run  # CPU only; the driver draws the progress
    seed = int(cfg.seed)
    files: list[Path] = []
    todo = []
    for key, name in _FILES.items():
        stem = out / name
        kwargs = getattr(cfg, key).options()
        if _same_config(stem.with_suffix(".json"), kwargs):
            files += [stem.with_suffix(".npz"), stem.with_suffix(".json")]
            continue
        sweep, points, task, context = _sweep(out, key, kwargs, seed)
        work = float(context["n_restarts"] * context["steps"])  # optimizer steps of a point

        def _cost(point: Mapping[str, Any], work: float = work) -> float:
            return work

        todo.append((key, kwargs, sweep, points, sweep.job(points, task, context, cost=_cost)))
    yield [job for *_, job in todo]
    for key, kwargs, sweep, points, _ in todo:
        recs = sweep.collect(points)
        if key == "figure_b":
            rows = {(r["point"]["setting"], r["point"]["R"]): r for r in recs}
            files += _write_b(out, kwargs, rows, seed)  # every setting of figure B is recorded
        else:
            rows = {(r["point"]["input"], r["point"]["budget"]): r for r in recs}
            keys = ("radii", "budgets", "R_attack", "k_max", "n_restarts", "steps")
            meta = {k: kwargs[k] for k in keys}
            files += _write_c(out, meta, rows, seed, kwargs["k_curve_max"])
        files += [sweep.path, sweep.meta_path]
    return files


def _sweep(out: Path, key: str, settings: Mapping[str, Any], seed: int) -> tuple[Any, ...]:
    """The sweep of figure ``key`` (its ``settings`` group): its points, task function and context."""
    if key == "figure_b":
        shared: tuple[str, ...] = ("n_atoms", "n_restarts", "steps")
        points = [{"setting": s, "R": float(R)} for s in FIG_B_SETTINGS for R in settings["radii"]]
        task = worst_measure_point
    else:
        shared = ("R_attack", "k_max", "n_restarts", "steps")
        budgets = settings["budgets"]
        points = [{"input": i, "budget": float(b)} for i in ATTACK_INPUTS for b in budgets]
        task = mass_splitting_point
    context = {**{k: settings[k] for k in shared}, "seed": seed}
    config = {"kind": _FILES[key], **context}
    sweep = Sweep(out, f"{_FILES[key]}_points", config, seed=seed, device="cpu", dtype="float64")
    return sweep, points, task, context
