r"""Figure F5: the √n regime (docs/theory.md §3, §4).

The eigenvector construction (one token at :math:`-Ru`,
:math:`n-1` copies at :math:`Ru`, released variant) for the head :math:`d = 1`,
:math:`A = -\gamma/(2R^2)`, :math:`V = 1`, whose gap is exactly :math:`\gamma` (case −, and
:math:`\|A\|_2R^2 = \gamma/2`: the "matching" case of §5). Unmasked, :math:`\|Df(X)\|_2` is
evaluated in closed form at **every** integer :math:`n` by :func:`construction_norm` (an exact
reduction of the Jacobian by the symmetry between copies, derived below) and cross-checked against
the certified brackets of :func:`meanfield.local_lipschitz` at a few :math:`n`. Masked, the map has
no such symmetry and every point is an engine bracket (dense SVD with a Gram certificate up to
:math:`nd = 1500`, Lanczos with the block-norm certificate above). Overlays (``theory.bounds``): the
lower-bound formulas :func:`~theory.bounds.sqrt_n_lower` and
:func:`~theory.bounds.masked_sqrt_n_lower`, the best :math:`k`-copy input
:func:`~theory.bounds.sequence_lower`, the √n upper bounds :func:`~theory.bounds.sqrt_n_upper`
(``"triangle"`` and ``"sqrt3"``), and the mean-field level: :math:`\sup_\varepsilon g`
(:func:`~theory.bounds.mean_field_lower`) and the :math:`c' = 1` upper bound (proved, docs/theory.md §17)
(:func:`~theory.bounds.mean_field_upper`).

Closed-form reduction of the construction (*derived and checked numerically*; ours). Let
:math:`X = (a, b, \dots, b)` with :math:`m = n - 1` copies, :math:`\delta = a - b`,
:math:`\pi` the attention of query :math:`a` to itself and :math:`p` that of a copy to :math:`a`.
With the blocks :math:`J_{ij} = V[P_{ij}(I + (x_j - m_i)(A^\top x_i)^\top) + \delta_{ij}C_iA^\top]`
of docs/theory.md §1, the Jacobian commutes with permutations of the copies, so it splits into the
span of :math:`(h_1, h_2/\sqrt m, \dots, h_2/\sqrt m)` and the perturbations of the copies with
zero sum. On the first it is the :math:`2d_v \times 2d` matrix

.. math::
    M = \begin{pmatrix}
    V[\pi I + \pi(1-\pi)\,\delta\,(A^\top a + A\delta)^\top] &
    \frac{1-\pi}{\sqrt m}V[I - \pi\,\delta\,(A^\top a)^\top] \\
    \sqrt m\,p\,V[I + (1-p)\,\delta\,(A^\top b)^\top] &
    V[(1-p)(I - p\,\delta\,(A^\top b)^\top) + p(1-p)\,\delta\,(A\delta)^\top]
    \end{pmatrix},

and on the second (present for :math:`n \ge 3`) it is :math:`I_{n-2}\otimes VC_bA^\top` with
:math:`C_b = p(1-p)\delta\delta^\top`, of norm :math:`p(1-p)\|V\delta\|\|A\delta\|`. Hence
:math:`\|Df(X)\|_2 = \max(\|M\|_2,\ p(1-p)\|V\delta\|\|A\delta\|)` at a cost independent of
:math:`n`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from scipy import special

from theory import bounds, regimes

from ..engine import Round, Sweep, torch_threads
from .settings import (
    F5_TOL,
    STEMS,
    SyntheticSettings,
    head_params64,
    int_grid,
    part_metadata,
    save_part,
    spectral_norm_np,
)


# ============================================================================ closed form (F5)
def construction_norm(A: Any, V: Any, a: Any, b: Any, n: Any) -> np.ndarray:
    r"""Exact :math:`\|Df(X)\|_2` for :math:`X = (a, b, \dots, b)`, unmasked, at any :math:`n`.

    .. math:: \|Df(X)\|_2 = \max\big(\|M\|_2,\ p(1-p)\,\|V\delta\|\,\|A\delta\|\big),
              \qquad \delta = a - b,

    with the :math:`2d_v\times 2d` matrix :math:`M` of the module docstring (the Jacobian on the
    span of perturbations that move all copies together), :math:`\pi = \sigma(a^\top A\delta -
    \log(n-1))` the attention of token :math:`a` to itself and :math:`p = \sigma(b^\top A\delta -
    \log(n-1))` that of a copy to :math:`a`; the second term (perturbations of the copies with zero
    sum) is present for :math:`n \ge 3`. At :math:`n = 1` the value is :math:`\|V\|_2`.

    Parameters
    ----------
    A : array_like, shape (d, d)
        Score matrix (score :math:`x_i^\top Ax_j`, query :math:`i`, key :math:`j`).
    V : array_like, shape (d_v, d)
        Value matrix.
    a, b : array_like, shape (d,)
        The distinguished token and the common value of the :math:`n - 1` copies (any vectors,
        not only the construction of docs/theory.md §3).
    n : array_like of int
        Sequence lengths, :math:`n \ge 1`.

    Returns
    -------
    numpy.ndarray
        :math:`\|Df(X)\|_2` for every :math:`n` (shape of ``n``), in float64.

    Notes
    -----
    Provenance: *derived and checked numerically* (ours): the reduction uses only the block
    formula of docs/theory.md §1 and the invariance of :math:`J` under permutations of identical
    copies; tests compare it with an independent loop implementation of the blocks and with the
    certified brackets of :func:`meanfield.local_lipschitz`.
    """
    A_ = np.asarray(A, dtype=np.float64)
    V_ = np.asarray(V, dtype=np.float64)
    a_ = np.asarray(a, dtype=np.float64).reshape(-1)
    b_ = np.asarray(b, dtype=np.float64).reshape(-1)
    d = a_.size
    if A_.shape != (d, d) or V_.ndim != 2 or V_.shape[1] != d or b_.size != d:
        raise ValueError(f"need A (d, d), V (d_v, d), a and b (d,), got {A_.shape}, {V_.shape}")
    n_ = np.asarray(n)
    if not np.issubdtype(n_.dtype, np.integer):
        if (n_ != np.round(n_)).any():
            raise ValueError("n must be integers")
        n_ = n_.astype(np.int64)
    if (n_ < 1).any():
        raise ValueError("n must be >= 1")
    shape = n_.shape
    m = n_.reshape(-1).astype(np.float64) - 1.0
    with np.errstate(divide="ignore"):
        log_m = np.log(m)  # -inf at n = 1
    delta = a_ - b_
    ua, ub, Ad = A_.T @ a_, A_.T @ b_, A_ @ delta
    t_a = float(a_ @ A_ @ delta) - log_m  # logit of pi (self-attention of token a)
    t_b = float(b_ @ A_ @ delta) - log_m  # logit of p (copies' attention to a)
    pi, pi_c = special.expit(t_a), special.expit(-t_a)
    p, p_c = special.expit(t_b), special.expit(-t_b)
    sm = np.sqrt(m)
    with np.errstate(divide="ignore", invalid="ignore"):
        c12 = np.where(m > 0, pi_c / np.where(m > 0, sm, 1.0), 0.0)
    eye = np.eye(d)
    o_a, o_b, o_d = (np.outer(delta, u) for u in (ua, ub, Ad))
    s = (slice(None), None, None)
    B11 = pi[s] * eye + (pi * pi_c)[s] * (o_a + o_d)
    B12 = c12[s] * (eye - pi[s] * o_a)
    B21 = (sm * p)[s] * (eye + p_c[s] * o_b)
    B22 = p_c[s] * (eye - p[s] * o_b) + (p * p_c)[s] * o_d
    M = np.block([[V_ @ B11, V_ @ B12], [V_ @ B21, V_ @ B22]])
    sig = np.linalg.svd(M, compute_uv=False)[:, 0]
    comp = p * p_c * np.linalg.norm(V_ @ delta) * np.linalg.norm(Ad)
    comp = np.where(m >= 2, comp, 0.0)
    return np.maximum(sig, comp).reshape(shape)


# ============================================================================ F5
def _f5_head(gamma: float, R: float) -> tuple[np.ndarray, np.ndarray]:
    """The F5 head: d = 1, A = -gamma/(2R^2), V = 1 (case -, gap exactly gamma)."""
    return np.array([[-gamma / (2.0 * R * R)]]), np.eye(1)


def _f5_point(point: Mapping[str, Any], device: str) -> dict[str, Any]:
    """Engine bracket of ||Df(X)||_2 at one construction input (masked or not)."""
    from meanfield import local_lipschitz
    from meanfield.attacks import adversarial_sequence

    A, V = _f5_head(point["gamma"], point["R"])
    params = head_params64(A, V, device)
    seq = adversarial_sequence(params, point["R"], int(point["n"]), variant="released")
    est = local_lipschitz(seq.X, params, masked=bool(point["masked"]), tol=F5_TOL)
    return {
        **{k: float(getattr(est, k)) for k in ("value", "lower", "upper")},
        "method": est.method,
        "upper_method": est.upper_method,
        "converged": bool(est.converged),
        "gamma_construction": seq.gamma,
        "case": seq.case,
        "a": seq.X[0].cpu().numpy(),
        "b": seq.X[min(1, seq.n - 1)].cpu().numpy(),
    }


def f5_task(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """One F5 point as a top-level task (point and ``device``), on one torch thread."""
    with torch_threads(1):
        return _f5_point(cfg, cfg["device"])


def run_f5(cfg: SyntheticSettings, out: Path, device: str) -> Generator[Round, None, list[Path]]:
    """The F5 sweep (one round), then its arrays and findings."""
    R = float(cfg.f5.R)
    gammas = np.asarray(cfg.f5.gammas, dtype=np.float64)
    n_max = int(cfg.f5.n_max)
    n_grid = int_grid(2, n_max, cfg.f5.n_points)
    n_all = np.arange(2, n_max + 1, dtype=np.int64)
    m_grid = n_grid[n_grid <= int(cfg.f5.masked_n_max)]
    c_grid = np.asarray(sorted(set(int(c) for c in cfg.f5.check_n)), dtype=np.int64)
    sweep = Sweep(
        out,
        "f5_engine",
        {"R": R, "head": "d = 1, A = -gamma/(2 R^2), V = 1", "variant": "released", "tol": F5_TOL},
        seed=cfg.seed,
        device=device,
        dtype="float64",
    )
    points = [
        {"gamma": float(g), "R": R, "n": int(n), "masked": True} for g in gammas for n in m_grid
    ] + [{"gamma": float(g), "R": R, "n": int(n), "masked": False} for g in gammas for n in c_grid]
    yield [sweep.job(points, f5_task, {"device": device})]
    recs = sweep.collect(points)
    by = {(r["point"]["gamma"], r["point"]["n"], r["point"]["masked"]): r for r in recs}

    G = len(gammas)
    arrays: dict[str, Any] = {
        "gammas": gammas,
        "n_grid": n_grid,
        "n_all": n_all,
        "masked_n": m_grid,
        "check_n": c_grid,
        "R": np.float64(R),
    }
    out_arr: dict[str, list[np.ndarray]] = defaultdict(list)  # a row per gamma, keys as appended
    eng = {
        k: np.full((G, len(m_grid)), np.nan)
        for k in ("masked_value", "masked_lower", "masked_upper")
    }
    chk = {
        k: np.full((G, len(c_grid)), np.nan)
        for k in ("check_value", "check_lower", "check_upper", "check_closed")
    }
    scal = {
        k: np.zeros(G)
        for k in ("sup_g", "mf_upper_c1", "masked_limit", "peak_n_formula", "A_norm", "V_norm")
    }
    for gi, g in enumerate(gammas):
        A, V = _f5_head(float(g), R)
        a_norm, v_norm = spectral_norm_np(A), spectral_norm_np(V)
        # construction positions: the same as the engine's (released variant, case -)
        rec0 = by[(float(g), int(c_grid[0]), False)]
        a, b = np.asarray(rec0["a"], dtype=np.float64), np.asarray(rec0["b"], dtype=np.float64)
        out_arr["closed_all"].append(construction_norm(A, V, a, b, n_all))
        out_arr["closed_grid"].append(construction_norm(A, V, a, b, n_grid))
        out_arr["lower_formula"].append(bounds.sqrt_n_lower(g, n_grid, 1.0))
        out_arr["masked_lower_formula"].append(bounds.masked_sqrt_n_lower(g, n_grid, 1.0))
        out_arr["k_copy_lower"].append(bounds.sequence_lower(g, n_grid, 1.0))
        out_arr["upper_triangle"].append(
            bounds.sqrt_n_upper(a_norm, v_norm, R, n_grid, form="triangle")
        )
        out_arr["upper_sqrt3"].append(bounds.sqrt_n_upper(a_norm, v_norm, R, n_grid, form="sqrt3"))
        scal["sup_g"][gi] = bounds.mean_field_lower(A, V, R)
        scal["mf_upper_c1"][gi] = bounds.mean_field_upper(a_norm, v_norm, R, c=1.0)
        scal["masked_limit"][gi] = bounds.masked_sqrt_n_lower(g, np.inf, 1.0)
        scal["peak_n_formula"][gi] = regimes.peak_n(g)
        scal["A_norm"][gi], scal["V_norm"][gi] = a_norm, v_norm
        for j, n in enumerate(m_grid):
            r = by[(float(g), int(n), True)]
            for f in ("value", "lower", "upper"):
                eng[f"masked_{f}"][gi, j] = r[f]
        for j, n in enumerate(c_grid):
            r = by[(float(g), int(n), False)]
            for f in ("value", "lower", "upper"):
                chk[f"check_{f}"][gi, j] = r[f]
            chk["check_closed"][gi, j] = construction_norm(A, V, r["a"], r["b"], int(n))
    arrays.update({k: np.stack(v) for k, v in out_arr.items()})
    arrays.update({**eng, **chk, **scal})
    findings = _f5_findings(arrays)
    doc = {
        "kind": "synthetic/f5",
        "figure": STEMS["f5"],
        "head": "d = 1, A = -gamma/(2 R^2), V = 1 (released construction, case -: x_1 = -R u, "
        "copies at R u, gap exactly gamma)",
        "provenance": {
            "construction": "authors' released code (docs/theory.md §3)",
            "closed_form": "derived and checked numerically (ours; experiments.synthetic)",
            "lower_formula": "docs/theory.md §3, derived and checked numerically",
            "masked_lower_formula": "docs/theory.md §4, derived and checked numerically",
            "k_copy_lower": "theory.bounds.sequence_lower, ours",
            "upper_triangle": "docs/theory.md §1 triangle form (ours)",
            "upper_sqrt3": "docs/theory.md §1 sqrt3 form (recollection, unverified, of the paper's)",
            "mf_upper_c1": "docs/theory.md §6 and §17: c' = 1, proved (ours; not the paper's constant)",
        },
        "findings": findings,
    }
    return save_part(out, "f5", arrays, doc, part_metadata(cfg, device, "f5"))


def _f5_findings(d: Mapping[str, np.ndarray]) -> dict[str, Any]:
    per = []
    for gi, g in enumerate(d["gammas"]):
        closed = d["closed_all"][gi]
        k = int(np.argmax(closed))
        n_peak = int(d["n_all"][k])
        peak = float(closed[k])
        grid_ratio = d["closed_grid"][gi] / d["lower_formula"][gi]
        mv = d["masked_value"][gi]
        rel_check = np.abs(d["check_closed"][gi] - d["check_value"][gi]) / d["check_value"][gi]
        inside = bool(
            np.all(d["check_lower"][gi] <= d["check_closed"][gi] * (1 + 1e-12))
            and np.all(d["check_closed"][gi] <= d["check_upper"][gi] * (1 + 1e-12))
        )
        entry = {
            "gamma": float(g),
            "e_gamma": float(math.exp(g)),
            "unmasked_peak_n": n_peak,
            "unmasked_peak_value": peak,
            "peak_n_lower_formula": float(d["peak_n_formula"][gi]),
            "peak_over_e_gamma": float((n_peak - 1) / math.exp(g)),
            "sup_g": float(d["sup_g"][gi]),
            "peak_over_sup_g": peak / float(d["sup_g"][gi]),
            "mf_upper_c1": float(d["mf_upper_c1"][gi]),
            "unmasked_at_n_max": float(closed[-1]),
            "decay_at_n_max": float(closed[-1] / peak),
            "min_ratio_to_lower_formula": float(grid_ratio.min()),
            "max_ratio_to_upper_triangle": float(
                (d["closed_grid"][gi] / d["upper_triangle"][gi]).max()
            ),
            "max_ratio_to_mf_upper_c1": float(closed.max() / d["mf_upper_c1"][gi]),
            "check_max_rel_diff": float(rel_check.max()),
            "check_closed_inside_brackets": inside,
        }
        if mv.size:
            entry.update(
                masked_n_max=int(d["masked_n"][-1]),
                masked_at_n_max=float(mv[-1]),
                masked_limit_formula=float(d["masked_limit"][gi]),
                masked_monotone=bool(np.all(np.diff(mv) >= -1e-9 * mv[1:])),
                masked_min_ratio_to_formula=float(
                    (mv / d["masked_lower_formula"][gi][: mv.size]).min()
                ),
                masked_max_bracket_ratio=float(
                    (d["masked_upper"][gi] / d["masked_lower"][gi]).max()
                ),
            )
        per.append(entry)
    return {"per_gamma": per}
