"""The ``meanfield attack`` subcommand: adversarial constructions, worst-case searches, splitting.

``meanfield attack construct``
    The eigenvector construction (docs/theory.md §3) for a score matrix
    read from ``.npy``/``.npz``
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
``ValueError`` with one line, which ``meanfield_cli.main`` reports as
``meanfield: error: ...``. The sweeps of figures B and C are :mod:`experiments.mass_splitting`'s.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from experiments.engine import load_json, save_npz, torch_threads
from experiments.inputs import load_matrices, random_layer
from experiments.mass_splitting import (
    attack_doc,
    attack_inputs,
    figure_b_results,
    figure_c_results,
    measure_doc,
)

from ..options import add_common, check_out_dir, print_written, write_record

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["register"]


# --------------------------------------------------------------------------- helpers


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
    params, desc = random_layer(d, 1, args.seed, torch.float64, "cpu")
    return params, {"random_d": d, "seed": args.seed, "A": desc["A"], "V": desc["V"]}


def _positives(text: str, name: str) -> list[float]:
    try:
        vals = [float(t) for t in text.split(",") if t.strip()]
    except ValueError as err:
        raise ValueError(f"{name} must be a comma-separated list of numbers, got {text!r}") from err
    if not vals:
        raise ValueError(f"{name} is empty")
    return [_positive(v, name) for v in vals]


def _positive(value: float, name: str) -> float:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number, got {value}")
    return value


def _sweep(args: argparse.Namespace, kind: str, run: Any, **settings: Any) -> dict[str, Any]:
    """A figure's sweep ``run(out, **settings)`` into ``--out``: its saved summary, as ``kind``."""
    files = run(Path(args.out or "attack_out"), **settings)
    saved = load_json(files[1])
    saved["kind"] = kind
    saved["files"] = [str(f) for f in files]
    return saved


# --------------------------------------------------------------------------- construct
def cmd_construct(args: argparse.Namespace) -> dict[str, Any]:
    """``attack construct``: the eigenvector construction and its exact local constant."""
    from meanfield import local_lipschitz
    from meanfield.attacks import adversarial_sequence

    _positive(args.R, "--R")
    if args.n < 1:
        raise ValueError(f"--n must be a positive integer, got {args.n}")
    if args.out:
        check_out_dir(args.out)
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
        # ||Df(X)||_2 with its bracket, by the dense method
        exact = local_lipschitz(con.X, params, masked=args.masked, method="dense")
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
        "exact": {
            "value": float(exact.value),
            "lower": float(exact.lower),
            "upper": float(exact.upper),
            "method": f"local_lipschitz ({exact.method}, {exact.upper_method})",
        },
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
    print_written(doc)


# --------------------------------------------------------------------------- search
def cmd_search(args: argparse.Namespace) -> dict[str, Any]:
    """``attack search``: worst-case measure (or sequence) search, or the figure-B sweep."""
    from meanfield.attacks import (
        WorstCaseMeasure,
        WorstCaseSequence,
        worst_case_measure,
        worst_case_sequence,
    )

    progress = not args.no_progress and args.verbose
    if args.out or args.figure_b:
        check_out_dir(args.out or "attack_out", "--out" if args.out else "output directory")
    if args.figure_b:
        return _sweep(
            args,
            "attack search --figure-b",
            figure_b_results,
            radii=_positives(args.radii, "--radii"),
            n_atoms=args.atoms,
            n_restarts=args.restarts,
            steps=args.steps,
            seed=args.seed,
            progress=progress,
        )
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
    search = {
        "n_restarts": args.restarts,
        "steps": args.steps,
        "lr": args.lr,
        "masked": args.masked,
        "sphere": args.sphere,
        "seed": args.seed,
        "progress": progress,
    }
    res: WorstCaseSequence | WorstCaseMeasure
    found: dict[str, Any]
    arrays: dict[str, Tensor | None]
    with torch_threads(1):
        if args.sequence:
            res = seq = worst_case_sequence(params, args.R, args.sequence, **search)
            doc.update(target="sequence", n=args.sequence)
            found = {"construction_bound": seq.construction_bound, "X": seq.X.tolist()}
            arrays = {"X": seq.X}
        else:
            res = wc = worst_case_measure(
                params, args.R, args.atoms, geometry=args.geometry, **search
            )
            doc.update(target="measure", n_atoms=args.atoms, geometry=wc.geometry)
            found = {"two_dirac_bound": wc.two_dirac_bound, "measure": measure_doc(wc.measure)}
            arrays = {
                "points": wc.measure.points,
                "log_weights": wc.measure.log_weights,
                "positions": wc.measure.positions,
            }
        for key in ("value", "lower", "upper", "bracket", "construction_value"):
            doc[key] = getattr(res, key)
        doc.update(found)
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
    print_written(doc)


# --------------------------------------------------------------------------- split
def cmd_split(args: argparse.Namespace) -> dict[str, Any]:
    """``attack split``: G_k table and best k, the budget attack, or the figure-C sweep."""
    from meanfield.attacks import mass_splitting_attack
    from theory.bounds import optimal_split_k, split_gain

    if args.k_max < 2:
        raise ValueError(f"--k-max must be >= 2, got {args.k_max}")
    if args.out or args.figure_c:
        check_out_dir(args.out or "attack_out", "--out" if args.out else "output directory")
    if args.figure_c:
        return _sweep(
            args,
            "attack split --figure-c",
            figure_c_results,
            radii=_positives(args.radii, "--radii"),
            budgets=_positives(args.budgets, "--budgets"),
            R_attack=args.R,
            k_max=args.k_max,
            n_restarts=args.restarts,
            steps=args.steps,
            seed=args.seed,
        )
    doc: dict[str, Any] = {"kind": "attack split"}
    if args.s is not None:
        if not math.isfinite(args.s):
            raise ValueError(f"--s must be finite, got {args.s}")
        ks = np.arange(1, args.k_max + 1, dtype=np.float64)
        doc["s"] = args.s
        doc["G_k"] = {int(k): float(g) for k, g in zip(ks, np.atleast_1d(split_gain(ks, args.s)))}
        k_opt = float(optimal_split_k(args.s))
        if math.isfinite(k_opt) and args.s < 40.0 and math.exp(args.s) < 2.0**52:
            k_opt = int(k_opt)  # exact below 2^52: shown as an integer
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
            A = params.A.to(torch.float64)
            if not torch.linalg.eigvalsh(0.5 * (A + A.mT))[-1] > 0:
                raise ValueError(
                    "the split attack starts from a Dirac at (R/2) u with u^T A u > 0; "
                    "this A has no positive direction"
                )
            con = adversarial_sequence(params, args.R, 2, variant="symmetric", case="+")
            mu = DiracMeasure(con.X[1:2].to(torch.float64))
        else:
            params, inputs = attack_inputs(args.R)
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
        doc["attack"] = {"source": source, "R": args.R, "input": measure_doc(mu), **attack_doc(res)}
    if args.s is None and args.budget is None:
        raise ValueError("give --s S (closed-form gain), --budget EPS (attack) or --figure-c")
    if args.out:
        _save_outputs(args, doc, "split")
    return doc


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
    print_written(doc)


# --------------------------------------------------------------------------- parser
def _save_outputs(args: argparse.Namespace, doc: dict[str, Any], stem: str, **arrays: Any) -> None:
    """Write ``<out>/<stem>.npz`` (if arrays) and ``<out>/<stem>.json`` with run metadata.

    The written paths are listed in ``doc["files"]``.
    """
    out = Path(args.out)
    files = [save_npz(out / f"{stem}.npz", **arrays)] if arrays else []
    files.append(write_record(out / f"{stem}.json", doc, args))
    doc["files"] = [str(f) for f in files]


_SEED_CONSTRUCT = "seed of --random-d and of the sphere variant's directions (default 0)"
_SEED_SEARCH = "seed of --random-d and of the random starts (default 0)"


def _source(p: argparse.ArgumentParser, *, required: bool) -> None:
    g = p.add_mutually_exclusive_group(required=required)
    g.add_argument(
        "--A-file",
        metavar="FILE",
        help="score matrix A (.npy), or arrays A and optional V (.npz); never unpickled",
    )
    g.add_argument(
        "--random-d",
        type=int,
        metavar="D",
        help="draw a random non-symmetric A (d x d, entries N(0, 1/d)) with V = I, from --seed",
    )


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``attack`` and its subcommands ``construct``, ``search``, ``split``."""
    p = sub.add_parser(
        "attack",
        help="adversarial inputs: constructions, worst-case searches, mass splitting",
        description="Adversarial inputs of attention: the eigenvector construction (construct), "
        "a multi-start search of worst-case measures or sequences (search), and mass splitting "
        "(split). `meanfield attack ATTACK --help` describes each.",
    )
    cmds = p.add_subparsers(dest="attack_command", required=True, metavar="ATTACK")

    c = cmds.add_parser(
        "construct",
        help="eigenvector construction (one token plus n-1 copies)",
        description="The eigenvector construction of docs/theory.md §3: one token plus n-1 "
        "copies along an eigenvector u of the score matrix A, for A read from a file (--A-file) "
        "or drawn at random (--random-d). Prints the logit gap, the construction's lower bound "
        "and the exact local constant ||Df(X)||_2 with its certified bracket; --out DIR saves "
        "the input (construct.npz) and the report (construct.json).",
    )
    add_common(c, seed=_SEED_CONSTRUCT)
    _source(c, required=True)
    c.add_argument("--R", type=float, required=True, help="radius (norm of the largest token)")
    c.add_argument("--n", type=int, required=True, help="number of tokens")
    c.add_argument(
        "--variant",
        choices=("released", "symmetric"),
        default="released",
        help="released: real eigenpairs of A, as the released code; symmetric: extreme "
        "eigenpairs of (A + A^T)/2, which always exist (default released)",
    )
    c.add_argument(
        "--case",
        choices=("auto", "+", "-"),
        default="auto",
        help="+: x_1 = Ru and n-1 copies of (R/2)u along the top eigenvector; -: x_1 = -Ru "
        "and copies of Ru along the bottom one (default auto: the larger gap)",
    )
    c.add_argument("--sphere", action="store_true", help="all tokens on the sphere of radius R")
    c.add_argument("--masked", action="store_true", help="measure the causal map's constant")
    c.add_argument("--out", help="directory for construct.npz and construct.json")
    c.set_defaults(handler=cmd_construct, printer=print_construct)

    s = cmds.add_parser(
        "search",
        help="multi-start search of worst-case measures or sequences",
        description="Multi-start gradient search (Adam) of the measure of --atoms atoms (or, with "
        "--sequence N, the sequence of N tokens) in the ball of radius --R with the largest local "
        "Lipschitz constant, for A from --A-file or --random-d; "
        "prints the best value with its certified bracket against the eigenvector construction "
        "and the two-Dirac bound. --figure-b runs the sweep of figure B instead.",
    )
    add_common(s, seed=_SEED_SEARCH, progress=True)
    _source(s, required=False)
    s.add_argument("--R", type=float, default=2.0, help="radius of the ball (default 2)")
    s.add_argument("--atoms", type=int, default=3, help="number of atoms (default 3)")
    s.add_argument(
        "--sequence",
        type=int,
        metavar="N",
        help="search sequences of N tokens (Euclidean constant) instead of measures",
    )
    s.add_argument("--restarts", type=int, default=16, help="random starts (default 16)")
    s.add_argument("--steps", type=int, default=300, help="Adam steps (default 300)")
    s.add_argument("--lr", type=float, default=0.05, help="step size (default 0.05)")
    s.add_argument(
        "--geometry",
        choices=("wasserstein", "split"),
        default="wasserstein",
        help="constant maximised: wasserstein (the W2 constant) or split (L_split, which also "
        "counts the gain of splitting an atom; default wasserstein)",
    )
    s.add_argument("--masked", action="store_true", help="search the causal map's constant")
    s.add_argument(
        "--sphere", action="store_true", help="keep every atom on the sphere of radius R"
    )
    s.add_argument(
        "--figure-b",
        action="store_true",
        help="run the sweep of figure B (d = 1 and d = 2 settings) into --out",
    )
    s.add_argument(
        "--radii", default="1,2,4,6", help="radii of the figure-B sweep (default 1,2,4,6)"
    )
    s.add_argument("--out", help="output directory")
    s.set_defaults(handler=cmd_search, printer=print_search)

    t = cmds.add_parser(
        "split",
        help="mass splitting: closed-form gain and W2-budget attacks",
        description="Mass splitting (docs/theory.md §10): the closed-form gain G_k of splitting "
        "a Dirac into k copies at logit gain --s and its best k; with --budget EPS, the attacks "
        "of W2 budget EPS on a Dirac (move only, split then move, insert a token) with their "
        "exact ratios. --figure-c runs the sweep of figure C instead.",
    )
    add_common(t, seed=_SEED_SEARCH)
    _source(t, required=False)
    t.add_argument("--s", type=float, help="exponent s = lambda R^2 / 4 of G_k")
    t.add_argument("--k-max", type=int, default=6, help="largest k (default 6)")
    t.add_argument("--budget", type=float, help="W2 budget of the attack")
    t.add_argument("--R", type=float, default=4.0, help="radius of the ball (default 4)")
    t.add_argument("--restarts", type=int, default=3, help="starts per attack (default 3)")
    t.add_argument("--steps", type=int, default=150, help="Adam steps per start (default 150)")
    t.add_argument("--figure-c", action="store_true", help="run the sweep of figure C into --out")
    t.add_argument("--radii", default="2,3,4,5", help="radii of the G_k curves (default 2,3,4,5)")
    t.add_argument(
        "--budgets", default="0.05,0.1,0.2,0.5,1", help="budgets of the figure-C attacks"
    )
    t.add_argument("--out", help="output directory")
    t.set_defaults(handler=cmd_split, printer=print_split)
    return p
