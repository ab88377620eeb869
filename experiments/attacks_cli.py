"""The ``meanfield attack`` subcommand: adversarial constructions, worst-case searches, splitting.

``meanfield attack construct``
    The eigenvector construction of THEORY.md §6.3 for a score matrix read from ``.npy``/``.npz``
    (``--A-file``) or drawn at random (``--random-d D --seed S``), with its lower bound and the
    exact local constant; ``--out DIR`` saves the input (``construct.npz``) and the report
    (``construct.json``).
``meanfield attack search``
    Multi-start search of worst-case measures (or sequences, ``--sequence N``) in ``B_R``;
    ``--figure-b`` runs the sweep drawn by ``paper_figs/fig_b_worst_measures.py``.
``meanfield attack split``
    The closed-form gain ``G_k`` of mass splitting and its best ``k`` (``--s``), the finite
    ``W_2``-budget attack (``--budget``); ``--figure-c`` runs the sweep drawn by
    ``paper_figs/fig_c_mass_splitting.py``.

Every handler returns a JSON-serialisable dict (printed by ``--json``) and has a short printer.
Weights are loaded only from ``.npy``/``.npz`` with ``allow_pickle=False``. Bad input raises
``ValueError`` with one line, which ``experiments.cli.main`` reports as ``meanfield: error: ...``.
The library (``meanfield``) never imports this module.
"""

from __future__ import annotations

import argparse
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ._threads import torch_threads
from .results import run_metadata, save_npz, write_json

__all__ = [
    "add_parser",
    "figure_b_results",
    "figure_c_results",
    "load_matrices",
]

log = logging.getLogger("meanfield.attack")

#: The two settings of figure B (EXPERIMENTS.md §2, figure A settings): d = 1 with A = 1 (positive
#: eigenvalue, chains), and d = 2 with A = diag(1, -0.3); V = I in both.
FIG_B_SETTINGS = {
    "d1": ([[1.0]], "d = 1, A = 1, V = 1"),
    "d2": ([[1.0, 0.0], [0.0, -0.3]], "d = 2, A = diag(1, -0.3), V = I"),
}


# --------------------------------------------------------------------------- helpers


def _check_matrix(M: np.ndarray, name: str, source: str) -> np.ndarray:
    if M.dtype.kind not in "fiu":
        raise ValueError(f"{name} in {source} must be a real numeric array, got dtype {M.dtype}")
    M = np.asarray(M, dtype=np.float64)
    if M.ndim != 2:
        raise ValueError(f"{name} in {source} must be a matrix, got shape {M.shape}")
    if not np.isfinite(M).all():
        raise ValueError(f"{name} in {source} contains NaN or infinite values")
    return M


def load_matrices(path: str | Path) -> tuple[np.ndarray, np.ndarray | None]:
    """Read a score matrix ``A`` (and optionally ``V``) from ``.npy`` or ``.npz``, never unpickling.

    A ``.npy`` file holds ``A`` itself; a ``.npz`` file holds an array ``A`` and optionally ``V``.
    ``A`` follows the toolkit's score convention ``x_i^T A x_j`` (query i, key j).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such file: {path}")
    try:
        if path.suffix == ".npy":
            A, V = np.load(path, allow_pickle=False), None
        elif path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                if "A" not in z.files:
                    raise ValueError(
                        f"{path} has no array 'A' (found: {', '.join(z.files) or 'none'})"
                    )
                A = z["A"]
                V = z["V"] if "V" in z.files else None
        else:
            raise ValueError(f"weights must be a .npy or .npz file, got {path.name}")
    except (OSError, EOFError) as err:
        raise ValueError(f"cannot read {path}: {' '.join(str(err).split())}") from err
    except ValueError as err:
        if "allow_pickle" in str(err) or "pickle" in str(err).lower():
            raise ValueError(f"{path} holds pickled objects, which are never loaded") from err
        raise
    A = _check_matrix(A, "A", path.name)
    if A.shape[0] != A.shape[1]:
        raise ValueError(f"A in {path.name} must be square, got shape {A.shape}")
    if V is not None:
        V = _check_matrix(V, "V", path.name)
        if V.shape[1] != A.shape[0]:
            raise ValueError(
                f"V in {path.name} must have {A.shape[0]} columns, got shape {V.shape}"
            )
    return A, V


def _params(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The head from ``--A-file`` or ``--random-d``, and a description of its source."""
    import torch

    from meanfield import AttentionParams

    if getattr(args, "A_file", None):
        A, V = load_matrices(args.A_file)
        source = {"A_file": str(args.A_file), "V": "identity" if V is None else "file"}
        V = np.eye(A.shape[0]) if V is None else V
        return AttentionParams(torch.from_numpy(A), torch.from_numpy(V)), source
    d = getattr(args, "random_d", None)
    if d is None:
        raise ValueError("give the score matrix with --A-file FILE or draw one with --random-d D")
    if d < 1:
        raise ValueError(f"--random-d must be a positive integer, got {d}")
    g = torch.Generator().manual_seed(args.seed)
    A = torch.randn(d, d, generator=g, dtype=torch.float64) / math.sqrt(d)  # non-symmetric
    V = torch.eye(d, dtype=torch.float64)
    return AttentionParams(A, V), {
        "random_d": d,
        "seed": args.seed,
        "A": "N(0, 1/d), non-symmetric",
        "V": "identity",
    }


def _exact_norm(X: Any, params: Any, *, masked: bool) -> dict[str, Any]:
    """||Df(X)||_2 with its bracket (meanfield.lipschitz, or a dense jacrev SVD as fallback)."""
    try:
        from meanfield.lipschitz import local_lipschitz
    except ImportError:
        import torch
        from torch.func import jacrev

        from meanfield import attention_points

        J = jacrev(lambda Y: attention_points(Y, params, masked=masked))(X)
        v = float(torch.linalg.matrix_norm(J.reshape(X.numel(), -1), ord=2))
        return {"value": v, "lower": v, "upper": v, "method": "dense SVD"}
    est = local_lipschitz(X, params, masked=masked, method="dense")
    return {
        "value": float(est.value),
        "lower": float(est.lower),
        "upper": float(est.upper),
        "method": f"local_lipschitz ({est.method}, {est.upper_method})",
    }


def _floats(text: str, name: str) -> list[float]:
    try:
        vals = [float(t) for t in text.split(",") if t.strip()]
    except ValueError as err:
        raise ValueError(f"{name} must be a comma-separated list of numbers, got {text!r}") from err
    if not vals:
        raise ValueError(f"{name} is empty")
    return vals


def _positive(value: float, name: str) -> float:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number, got {value}")
    return value


def _measure_doc(mu: Any) -> dict[str, Any]:
    return {
        "points": mu.points.tolist(),
        "log10_weights": (mu.log_weights / math.log(10.0)).tolist(),
    }


# --------------------------------------------------------------------------- construct
def cmd_construct(args: argparse.Namespace) -> dict[str, Any]:
    """``attack construct``: the eigenvector construction and its exact local constant."""
    from meanfield.attacks import adversarial_sequence

    _positive(args.R, "--R")
    if args.n < 1:
        raise ValueError(f"--n must be a positive integer, got {args.n}")
    params, source = _params(args)
    with torch_threads(1):
        con = adversarial_sequence(
            params,
            args.R,
            args.n,
            variant=args.variant,
            case=args.case,
            sphere=args.sphere,
            seed=args.seed,
        )
        exact = _exact_norm(con.X, params, masked=args.masked)
    doc: dict[str, Any] = {
        "kind": "attack construct",
        "source": source,
        "d": params.d,
        "R": args.R,
        "n": args.n,
        "variant": con.variant,
        "case": con.case,
        "masked": args.masked,
        "gamma": con.gamma,
        "lam": con.lam,
        "p": con.p,
        "u": con.u.tolist(),
        "lower_bound": con.lower_bound,
        "lower_bound_formula": (
            "sqrt(n-1) p ||V M P_T||_2 (sphere variant)"
            if args.sphere
            else "sqrt(n-1) p (1 + (1-p) gamma) ||V u||_2"
        ),
        "exact": exact,
    }
    if args.out:
        _save_outputs(
            args,
            doc,
            "construct",
            X=con.X,
            A=params.A,
            V=params.V,
            u=con.u,
            direction=con.direction,
        )
    return doc


def print_construct(doc: dict[str, Any]) -> None:
    """Human-readable summary of ``attack construct``."""
    print(
        f"eigenvector construction ({doc['variant']}, case {doc['case']}), n = {doc['n']}, R = {doc['R']}"
    )
    print(
        f"  gap gamma        {doc['gamma']:.6g}   (lambda = {doc['lam']:.6g}, p = {doc['p']:.6g})"
    )
    if doc["lower_bound"] is not None:
        print(f"  lower bound      {doc['lower_bound']:.6g}")
    e = doc["exact"]
    print(
        f"  ||Df(X)||_2      {e['value']:.6g}   in [{e['lower']:.6g}, {e['upper']:.6g}] ({e['method']})"
    )
    for f in doc.get("files", []):
        print(f"  wrote {f}")


# --------------------------------------------------------------------------- search
def _worst_measures_sweep(
    radii: Sequence[float],
    *,
    n_atoms: int,
    n_restarts: int,
    steps: int,
    seed: int,
    progress: bool = False,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    import torch

    from meanfield import AttentionParams
    from meanfield.attacks import worst_case_measure

    arrays: dict[str, np.ndarray] = {"radii": np.asarray(radii, dtype=np.float64)}
    summary: dict[str, Any] = {"radii": list(radii), "n_atoms": n_atoms, "settings": {}}
    for key, (A_list, label) in FIG_B_SETTINGS.items():
        A = torch.tensor(A_list, dtype=torch.float64)
        params = AttentionParams(A, torch.eye(A.shape[0], dtype=torch.float64))
        pts, lws, vals, tds, cons = [], [], [], [], []
        for R in radii:
            res = worst_case_measure(
                params, R, n_atoms, n_restarts=n_restarts, steps=steps, seed=seed, progress=progress
            )
            log.info("%s R=%g: %.6g (two-Dirac %.6g)", key, R, res.value, res.two_dirac_bound)
            pts.append(res.measure.points.numpy())
            lws.append(res.measure.log_weights.numpy())
            vals.append(res.value)
            tds.append(np.nan if res.two_dirac_bound is None else res.two_dirac_bound)
            cons.append(res.construction_value)
        arrays[f"{key}_points"] = np.stack(pts)
        arrays[f"{key}_log_weights"] = np.stack(lws)
        arrays[f"{key}_value"] = np.asarray(vals)
        arrays[f"{key}_two_dirac"] = np.asarray(tds)
        arrays[f"{key}_construction"] = np.asarray(cons)
        summary["settings"][key] = {
            "label": label,
            "A": A_list,
            "value": vals,
            "two_dirac_bound": tds,
            "construction_value": cons,
        }
    return arrays, summary


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
    out = Path(out_dir)
    with torch_threads(1):
        arrays, summary = _worst_measures_sweep(
            radii,
            n_atoms=n_atoms,
            n_restarts=n_restarts,
            steps=steps,
            seed=seed,
            progress=progress,
        )
    config = {"radii": list(radii), "n_atoms": n_atoms, "n_restarts": n_restarts, "steps": steps}
    doc = {
        "kind": "worst_measures",
        **summary,
        "metadata": run_metadata(seed=seed, device="cpu", dtype="float64", config=config),
    }
    return [
        save_npz(out / "worst_measures.npz", **arrays),
        write_json(out / "worst_measures.json", doc),
    ]


def cmd_search(args: argparse.Namespace) -> dict[str, Any]:
    """``attack search``: worst-case measure (or sequence) search, or the figure-B sweep."""
    from meanfield.attacks import worst_case_measure, worst_case_sequence

    progress = not args.no_progress and args.verbose
    if args.figure_b:
        radii = [_positive(r, "--radii") for r in _floats(args.radii, "--radii")]
        out = Path(args.out or "attack_out")
        files = figure_b_results(
            out,
            radii=radii,
            n_atoms=args.atoms,
            n_restarts=args.restarts,
            steps=args.steps,
            seed=args.seed,
            progress=progress,
        )
        from .results import load_json

        doc = load_json(files[1])
        doc["kind"] = "attack search --figure-b"
        doc["files"] = [str(f) for f in files]
        return doc
    _positive(args.R, "--R")
    if args.atoms < 1:
        raise ValueError(f"--atoms must be a positive integer, got {args.atoms}")
    params, source = _params(args)
    doc: dict[str, Any] = {
        "kind": "attack search",
        "source": source,
        "d": params.d,
        "R": args.R,
        "masked": args.masked,
        "sphere": args.sphere,
    }
    with torch_threads(1):
        if args.sequence:
            res = worst_case_sequence(
                params,
                args.R,
                args.sequence,
                n_restarts=args.restarts,
                steps=args.steps,
                lr=args.lr,
                masked=args.masked,
                sphere=args.sphere,
                seed=args.seed,
                progress=progress,
            )
            doc.update(
                target="sequence",
                n=args.sequence,
                value=res.value,
                lower=res.lower,
                upper=res.upper,
                bracket=res.bracket,
                construction_value=res.construction_value,
                construction_bound=res.construction_bound,
                X=res.X.tolist(),
            )
            arrays = {"X": res.X}
        else:
            res = worst_case_measure(
                params,
                args.R,
                args.atoms,
                n_restarts=args.restarts,
                steps=args.steps,
                lr=args.lr,
                masked=args.masked,
                sphere=args.sphere,
                geometry=args.geometry,
                seed=args.seed,
                progress=progress,
            )
            doc.update(
                target="measure",
                n_atoms=args.atoms,
                geometry=res.geometry,
                value=res.value,
                lower=res.lower,
                upper=res.upper,
                bracket=res.bracket,
                construction_value=res.construction_value,
                two_dirac_bound=res.two_dirac_bound,
                measure=_measure_doc(res.measure),
            )
            arrays = {
                "points": res.measure.points,
                "log_weights": res.measure.log_weights,
                "positions": res.measure.positions,
            }
        doc["restarts"] = [
            {"start": lab, "value": float(v)} for lab, v in zip(res.labels, res.restart_values)
        ]
    if args.out:
        _save_outputs(
            args,
            doc,
            "search",
            A=params.A,
            V=params.V,
            history=res.history,
            history_steps=res.history_steps,
            **arrays,
        )
    return doc


def print_search(doc: dict[str, Any]) -> None:
    """Human-readable summary of ``attack search``."""
    if doc["kind"].endswith("--figure-b"):
        print(f"worst-case measures with {doc['n_atoms']} atoms for R in {doc['radii']}")
        for s in doc["settings"].values():
            vals = ", ".join(f"{v:.4g}" for v in s["value"])
            tds = ", ".join(f"{v:.4g}" for v in s["two_dirac_bound"])
            print(f"  {s['label']}: search {vals}; two-Dirac bound {tds}")
    else:
        what = (
            f"sequence of n = {doc.get('n')}"
            if doc["target"] == "sequence"
            else (f"measure with {doc['n_atoms']} atoms ({doc['geometry']})")
        )
        print(f"worst-case {what} in B_R, R = {doc['R']}")
        print(
            f"  best value       {doc['value']:.6g}   in [{doc['lower']:.6g}, {doc['upper']:.6g}] ({doc['bracket']})"
        )
        print(f"  construction     {doc['construction_value']:.6g}")
        if doc.get("two_dirac_bound") is not None:
            print(f"  two-Dirac bound  {doc['two_dirac_bound']:.6g}")
        if "measure" in doc:
            for x, lw in zip(doc["measure"]["points"], doc["measure"]["log10_weights"]):
                print(f"    atom {np.round(x, 4).tolist()}  log10 mass {lw:.3f}")
    for f in doc.get("files", []):
        print(f"  wrote {f}")


# --------------------------------------------------------------------------- split
def _attack_inputs(R: float) -> tuple[Any, dict[str, Any]]:
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


def _attack_doc(res: Any) -> dict[str, Any]:
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
            "nu": _measure_doc(q.nu),
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

    Left panel data: ``G_k`` (:func:`meanfield.attacks.split_gain`) on a log grid of ``k`` for
    ``s = R^2/4`` (``lambda = 1``) and every radius, with the best integer ``k``. Right panel
    data: move-only and split-then-move ratios (exact ``W_2`` and ``W_inf``) against the budget,
    at a Dirac ``delta_{R u / 2}`` and at a three-atom measure, for the head
    ``A = diag(1, -0.3)``, ``V = I`` in ``B_R``, ``R = R_attack``.
    """
    from meanfield.attacks import mass_splitting_attack, optimal_split_k, split_gain

    out = Path(out_dir)
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
    params, inputs = _attack_inputs(R_attack)
    attacks: dict[str, Any] = {}
    with torch_threads(1):
        for name, mu in inputs.items():
            rows = {f: [] for f in ("move_w2", "split_w2", "move_winf", "split_winf", "split_k")}
            attacks[name] = []
            for b in budgets:
                res = mass_splitting_attack(
                    mu,
                    params,
                    b,
                    R=R_attack,
                    k_max=k_max,
                    n_restarts=n_restarts,
                    steps=steps,
                    seed=seed,
                )
                rows["move_w2"].append(res.move.ratio_w2)
                rows["split_w2"].append(res.split.ratio_w2)
                rows["move_winf"].append(res.move.ratio_winf)
                rows["split_winf"].append(res.split.ratio_winf)
                rows["split_k"].append(res.split.k)
                attacks[name].append(_attack_doc(res))
            key = name.replace("-", "_")
            for f, vals in rows.items():
                arrays[f"{key}_{f}"] = np.asarray(vals, dtype=np.float64)
    arrays["V_norm"] = np.float64(float(params.V_norm()))
    config = {
        "radii": list(radii),
        "budgets": list(budgets),
        "R_attack": R_attack,
        "k_max": k_max,
        "n_restarts": n_restarts,
        "steps": steps,
    }
    doc = {
        "kind": "mass_splitting",
        "head": "d = 2, A = diag(1, -0.3), V = I",
        "inputs": {
            "dirac": "delta at (R/2) e1",
            "few-atom": "0.6 delta_{(R/2) e1} + 0.3 delta_{-(R/2) e1} + 0.1 delta_{(R/2) e2}",
        },
        "attacks": attacks,
        "metadata": run_metadata(seed=seed, device="cpu", dtype="float64", config=config),
    }
    return [
        save_npz(out / "mass_splitting.npz", **arrays),
        write_json(out / "mass_splitting.json", doc),
    ]


def cmd_split(args: argparse.Namespace) -> dict[str, Any]:
    """``attack split``: G_k table and best k, the budget attack, or the figure-C sweep."""
    from meanfield.attacks import mass_splitting_attack, optimal_split_k, split_gain

    if args.k_max < 2:
        raise ValueError(f"--k-max must be >= 2, got {args.k_max}")
    if args.figure_c:
        out = Path(args.out or "attack_out")
        radii = [_positive(r, "--radii") for r in _floats(args.radii, "--radii")]
        budgets = [_positive(b, "--budgets") for b in _floats(args.budgets, "--budgets")]
        files = figure_c_results(
            out,
            radii=radii,
            budgets=budgets,
            R_attack=args.R,
            k_max=args.k_max,
            n_restarts=args.restarts,
            steps=args.steps,
            seed=args.seed,
        )
        from .results import load_json

        doc = load_json(files[1])
        doc["kind"] = "attack split --figure-c"
        doc["files"] = [str(f) for f in files]
        return doc
    doc: dict[str, Any] = {"kind": "attack split"}
    if args.s is not None:
        if not math.isfinite(args.s):
            raise ValueError(f"--s must be finite, got {args.s}")
        ks = np.arange(1, args.k_max + 1, dtype=np.float64)
        doc["s"] = args.s
        doc["G_k"] = {int(k): float(g) for k, g in zip(ks, np.atleast_1d(split_gain(ks, args.s)))}
        k_opt = optimal_split_k(args.s)
        doc["k_opt"] = k_opt
        doc["G_opt"] = float(split_gain(float(k_opt), args.s)) if math.isfinite(k_opt) else None
        doc["sqrt_k"] = {int(k): math.sqrt(k) for k in ks}
        doc["saturation"] = math.exp(args.s / 2) / 2 if args.s < 1400 else math.inf
    if args.budget is not None:
        _positive(args.budget, "--budget")
        _positive(args.R, "--R")
        if args.A_file or args.random_d is not None:
            import torch

            from meanfield import DiracMeasure
            from meanfield.attacks import adversarial_sequence

            params, source = _params(args)
            con = (
                adversarial_sequence(params, args.R, 2, variant="symmetric", case="+")
                if _has_positive(params)
                else None
            )
            if con is None:
                raise ValueError(
                    "the split attack starts from a Dirac at (R/2) u with u^T A u > 0; "
                    "this A has no positive direction"
                )
            mu = DiracMeasure(con.X[1:2].to(torch.float64))
        else:
            params, inputs = _attack_inputs(args.R)
            mu, source = inputs["dirac"], {"head": "d = 2, A = diag(1, -0.3), V = I"}
        with torch_threads(1):
            res = mass_splitting_attack(
                mu,
                params,
                args.budget,
                R=args.R,
                k_max=args.k_max,
                n_restarts=args.restarts,
                steps=args.steps,
                seed=args.seed,
            )
        doc["attack"] = {
            "source": source,
            "R": args.R,
            "input": _measure_doc(mu),
            **_attack_doc(res),
        }
    if args.s is None and args.budget is None:
        raise ValueError("give --s S (closed-form gain), --budget EPS (attack) or --figure-c")
    if args.out:
        _save_outputs(args, doc, "split")
    return doc


def _has_positive(params: Any) -> bool:
    import torch

    A = params.A.to(torch.float64)
    return bool(torch.linalg.eigvalsh(0.5 * (A + A.mT))[-1] > 0)


def print_split(doc: dict[str, Any]) -> None:
    """Human-readable summary of ``attack split``."""
    if doc["kind"].endswith("--figure-c"):
        print("mass splitting: G_k curves and budget attacks written")
    if "G_k" in doc:
        print(
            f"duplicate-then-move gain at s = {doc['s']}: best k = {doc['k_opt']}, "
            f"G = {doc['G_opt']:.6g} (saturation e^(s/2)/2 = {doc['saturation']:.6g})"
        )
        for k, g in doc["G_k"].items():
            print(f"  k = {k:<4d} G_k = {g:.6g}   sqrt(k) = {math.sqrt(int(k)):.6g}")
    if "attack" in doc:
        a = doc["attack"]
        print(f"W2 budget {a['budget']}: exact ratios W2(F nu, F mu) / W2(nu, mu)")
        print(
            f"  move-only        {a['move']['ratio_w2']:.6g}   (W_inf {a['move']['ratio_winf']:.6g})"
        )
        print(
            f"  split-then-move  {a['split']['ratio_w2']:.6g}   (W_inf {a['split']['ratio_winf']:.6g}, k = {a['split']['k']})"
        )
        print(f"  insert a token   {a['insert']['ratio_w2']:.6g}")
    for f in doc.get("files", []):
        print(f"  wrote {f}")


# --------------------------------------------------------------------------- parser
def _save_outputs(args: argparse.Namespace, doc: dict[str, Any], stem: str, **arrays: Any) -> None:
    """Write ``<out>/<stem>.npz`` (if arrays) and ``<out>/<stem>.json`` with run metadata.

    The written paths are listed in ``doc["files"]``.
    """
    out = Path(args.out)
    files = [save_npz(out / f"{stem}.npz", **arrays)] if arrays else []
    metadata = run_metadata(seed=args.seed, device="cpu", dtype="float64", config=_config(args))
    files.append(write_json(out / f"{stem}.json", {**doc, "metadata": metadata}))
    doc["files"] = [str(f) for f in files]


def _config(args: argparse.Namespace) -> dict[str, Any]:
    return {k: v for k, v in vars(args).items() if k not in ("handler", "printer")}


def _common(p: argparse.ArgumentParser) -> None:
    """The flags every ``meanfield`` subcommand accepts (as in ``experiments.cli``)."""
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--no-progress", action="store_true", help="disable progress bars")
    p.add_argument("-v", "--verbose", action="store_true", help="log to stderr")


def _source(p: argparse.ArgumentParser, *, required: bool) -> None:
    g = p.add_mutually_exclusive_group(required=required)
    g.add_argument(
        "--A-file",
        dest="A_file",
        metavar="FILE",
        help="score matrix A (.npy), or arrays A and optional V (.npz); never unpickled",
    )
    g.add_argument(
        "--random-d",
        dest="random_d",
        type=int,
        metavar="D",
        help="draw a random non-symmetric A (d x d, entries N(0, 1/d)) with V = I, from --seed",
    )


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``attack`` and its sub-subcommands ``construct``, ``search``, ``split``."""
    p = subparsers.add_parser(
        "attack", help="adversarial inputs: constructions, worst-case searches, mass splitting"
    )
    sub = p.add_subparsers(dest="attack_command", required=True, metavar="ATTACK")

    c = sub.add_parser("construct", help="eigenvector construction (one token plus n-1 copies)")
    _common(c)
    _source(c, required=True)
    c.add_argument("--R", type=float, required=True, help="radius (norm of the largest token)")
    c.add_argument("--n", type=int, required=True, help="number of tokens")
    c.add_argument("--variant", choices=("released", "symmetric"), default="released")
    c.add_argument("--case", choices=("auto", "+", "-"), default="auto")
    c.add_argument("--sphere", action="store_true", help="all tokens on the sphere of radius R")
    c.add_argument("--masked", action="store_true", help="measure the causal map's constant")
    c.add_argument("--out", default=None, help="directory for construct.npz and construct.json")
    c.set_defaults(handler=cmd_construct, printer=print_construct)

    s = sub.add_parser("search", help="multi-start search of worst-case measures or sequences")
    _common(s)
    _source(s, required=False)
    s.add_argument("--R", type=float, default=2.0, help="radius of the ball (default 2)")
    s.add_argument("--atoms", type=int, default=3, help="number of atoms (default 3)")
    s.add_argument(
        "--sequence",
        type=int,
        default=None,
        metavar="N",
        help="search sequences of N tokens (Euclidean constant) instead of measures",
    )
    s.add_argument("--restarts", type=int, default=16, help="random starts (default 16)")
    s.add_argument("--steps", type=int, default=300, help="Adam steps (default 300)")
    s.add_argument("--lr", type=float, default=0.05, help="step size (default 0.05)")
    s.add_argument("--geometry", choices=("wasserstein", "split"), default="wasserstein")
    s.add_argument("--masked", action="store_true")
    s.add_argument("--sphere", action="store_true")
    s.add_argument(
        "--figure-b",
        action="store_true",
        help="run the sweep of figure B (d = 1 and d = 2 settings) into --out",
    )
    s.add_argument(
        "--radii", default="1,2,4,6", help="radii of the figure-B sweep (default 1,2,4,6)"
    )
    s.add_argument("--out", default=None, help="output directory")
    s.set_defaults(handler=cmd_search, printer=print_search)

    t = sub.add_parser("split", help="mass splitting: closed-form gain and W2-budget attacks")
    _common(t)
    _source(t, required=False)
    t.add_argument("--s", type=float, default=None, help="exponent s = lambda R^2 / 4 of G_k")
    t.add_argument("--k-max", dest="k_max", type=int, default=6, help="largest k (default 6)")
    t.add_argument("--budget", type=float, default=None, help="W2 budget of the attack")
    t.add_argument("--R", type=float, default=4.0, help="radius of the ball (default 4)")
    t.add_argument("--restarts", type=int, default=3, help="starts per attack (default 3)")
    t.add_argument("--steps", type=int, default=150, help="Adam steps per start (default 150)")
    t.add_argument("--figure-c", action="store_true", help="run the sweep of figure C into --out")
    t.add_argument("--radii", default="2,3,4,5", help="radii of the G_k curves (default 2,3,4,5)")
    t.add_argument(
        "--budgets", default="0.05,0.1,0.2,0.5,1", help="budgets of the figure-C attacks"
    )
    t.add_argument("--out", default=None, help="output directory")
    t.set_defaults(handler=cmd_split, printer=print_split)
    return p
