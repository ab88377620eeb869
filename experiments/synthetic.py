r"""Synthetic theory sweeps behind figures F5, F6, F7 and A (docs/experiments.md).

Everything here is a controlled single head with small :math:`d`; no model, no text.

**F5, the √n regime** (docs/theory.md §6.3, §9). The eigenvector construction (one token at :math:`-Ru`,
:math:`n-1` copies at :math:`Ru`, released variant) for the head :math:`d = 1`,
:math:`A = -\gamma/(2R^2)`, :math:`V = 1`, whose gap is exactly :math:`\gamma` (case −, and
:math:`\|A\|_2R^2 = \gamma/2`: the "matching" case of §7.2). Unmasked, :math:`\|Df(X)\|_2` is
evaluated in closed form at **every** integer :math:`n` by :func:`construction_norm` (an exact
reduction of the Jacobian by the symmetry between copies, derived below) and cross-checked against
the certified brackets of :func:`meanfield.local_lipschitz` at a few :math:`n`. Masked, the map has
no such symmetry and every point is an engine bracket (dense SVD with a Gram certificate up to
:math:`nd = 1500`, Lanczos with the block-norm certificate above). Overlays (``theory.bounds``): the
lower-bound formulas :func:`~theory.bounds.sqrt_n_lower` and
:func:`~theory.bounds.masked_sqrt_n_lower`, the best :math:`k`-copy input
:func:`~theory.bounds.sequence_lower`, the √n upper bounds :func:`~theory.bounds.sqrt_n_upper`
(``"triangle"`` and ``"sqrt3"``), and the mean-field level: :math:`\sup_\varepsilon g`
(:func:`~theory.bounds.mean_field_lower`) and the :math:`c' = 1` candidate
(:func:`~theory.bounds.mean_field_upper`).

**F6 and A, the mean-field regime** (docs/theory.md §7). :math:`\sup_\varepsilon g` (§7.2) against
:math:`R` with the :math:`w = 1/2` form, the asymptote :math:`\frac{3\sqrt3}{16}\gamma e^{\gamma/2}`,
the trivial :math:`\|V\|_2`, the **candidate** upper bounds :math:`c' = 1, 2` (§7.1; reconstructed
constants, not the paper's), and the values reached by
:func:`meanfield.attacks.worst_case_measure` (multi-start ascent of the exact :math:`W_2` local
constant over 2–5 weighted atoms, started from the two-Dirac optimum) plus, for F6, the
maximised off-axis two-atom bound of §7.3 (:func:`meanfield.attacks.off_axis_two_atoms`).
Settings (:data:`MF_SETTINGS`): :math:`d = 1` with :math:`A = \pm1`, :math:`V = 1`; :math:`d = 2`
with :math:`A = \mathrm{diag}(1, -0.3)`, :math:`V = I` (the F6 setting); a random
:math:`A = Q^\top K/\sqrt k` with Gaussian :math:`Q, K\in\mathbb R^{k\times d}`, :math:`k = d = 3`,
:math:`V = I`.

**F7, large radius** (docs/theory.md §8). :math:`\|Df(RX)\|_2` on a log grid of :math:`R` for a few
random :math:`X` (rows scaled so that :math:`\max_i\|x_i\| = 1`), masked and unmasked, against the
limit :math:`\|V\|_2\sqrt{\max_jN_j}` (:func:`~theory.bounds.large_radius_limit`), the reference
:math:`\sqrt n\|V\|_2`, and our quantitative deviation bound
:func:`~theory.bounds.large_radius_deviation`.

Closed-form reduction of the construction (*derived and checked numerically*; ours). Let
:math:`X = (a, b, \dots, b)` with :math:`m = n - 1` copies, :math:`\delta = a - b`,
:math:`\pi` the attention of query :math:`a` to itself and :math:`p` that of a copy to :math:`a`.
With the blocks :math:`J_{ij} = V[P_{ij}(I + (x_j - m_i)(A^\top x_i)^\top) + \delta_{ij}C_iA^\top]`
of docs/theory.md §4.1, the Jacobian commutes with permutations of the copies, so it splits into the
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

Results go to ``results_dir / "synthetic"``: resumable :class:`~experiments.runner.Sweep` files
(``f5_engine``, ``worst_measures``, ``off_axis``, ``f7``: one JSON line per point) and one
assembled sub-result per figure, ``f5``, ``f6``, ``f7`` and ``a`` (``.npz`` arrays + ``.json``
with the key numbers and run metadata). Figures: ``paper_figs/fig_f5_sqrt_n.py``,
``fig_f6_mean_field.py``, ``fig_f7_large_radius.py``, ``fig_a_lipschitz_vs_R.py``.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from scipy import special

from theory import bounds, regimes

from ._threads import torch_threads
from .results import load_json, run_metadata, save_npz, write_json
from .runner import Sweep, preset_config
from .stage import ModuleStage, StageConfig

__all__ = [
    "MF_SETTINGS",
    "NAME",
    "PRESETS",
    "STAGE",
    "SyntheticSettings",
    "construction_norm",
    "mf_setting",
    "report_section",
    "run",
    "summary",
]

log = logging.getLogger(__name__)

NAME = "synthetic"

#: Figure stems drawn from these results.
STEMS = {
    "f5": "fig_f5_sqrt_n",
    "f6": "fig_f6_mean_field",
    "f7": "fig_f7_large_radius",
    "a": "fig_a_lipschitz_vs_R",
}

#: Settings of figure A (docs/experiments.md); "d2" is also the setting of figure F6.
MF_SETTINGS: dict[str, str] = {
    "d1_pos": "d = 1, A = 1, V = 1",
    "d1_neg": "d = 1, A = -1, V = 1",
    "d2": "d = 2, A = diag(1, -0.3), V = I",
    "gauss": "d = 3, A = QᵀK/√k (Gaussian, k = 3, seed {seed}), V = I",
}
F6_SETTING = "d2"


@dataclass(frozen=True)
class SyntheticSettings(StageConfig):
    """Settings of the ``synthetic`` stage.

    The prefix names the figure a setting serves: ``f5_``, ``f7_``, ``mf_`` (F6 and A), ``a_``,
    ``f6_``; the others are shared.
    """

    stage: ClassVar[str] = "synthetic"

    seed: int
    f5_gammas: tuple[float, ...]
    f5_R: float
    f5_n_max: int
    f5_n_points: int
    f5_masked_n_max: int
    f5_check_n: tuple[int, ...]
    f7_n: int
    f7_d: int
    f7_inputs: int
    f7_R_min: float
    f7_R_max: float
    f7_R_points: int
    mf_radii: tuple[float, ...]
    mf_settings: tuple[str, ...]
    a_atoms: tuple[int, ...]
    f6_atoms: tuple[int, ...]
    restarts: int
    steps: int
    off_axis_restarts: int
    off_axis_steps: int
    curve_points: int


PRESETS: Mapping[str, SyntheticSettings] = {
    "tiny": SyntheticSettings(
        seed=0,
        f5_gammas=(2.0,),
        f5_R=1.0,
        f5_n_max=40,
        f5_n_points=6,
        f5_masked_n_max=40,
        f5_check_n=(3, 17),
        f7_n=8,
        f7_d=2,
        f7_inputs=2,
        f7_R_min=0.1,
        f7_R_max=1000.0,
        f7_R_points=9,
        mf_radii=(1.0, 4.0),
        mf_settings=("d1_neg", "d2"),
        a_atoms=(2, 3),
        f6_atoms=(2, 3),
        restarts=1,
        steps=12,
        off_axis_restarts=1,
        off_axis_steps=20,
        curve_points=60,
    ),
    "quick": SyntheticSettings(
        seed=0,
        f5_gammas=(2.0, 4.0, 6.0),
        f5_R=1.0,
        f5_n_max=2048,
        f5_n_points=20,
        f5_masked_n_max=1024,
        f5_check_n=(4, 32, 256),
        f7_n=12,
        f7_d=3,
        f7_inputs=4,
        f7_R_min=0.1,
        f7_R_max=1000.0,
        f7_R_points=33,
        mf_radii=(0.5, 1.06, 2.24, 4.73, 10.0),
        mf_settings=("d1_pos", "d1_neg", "d2", "gauss"),
        a_atoms=(2, 3, 5),
        f6_atoms=(2, 3, 4, 5),
        restarts=4,
        steps=100,
        off_axis_restarts=4,
        off_axis_steps=150,
        curve_points=200,
    ),
    "paper": SyntheticSettings(
        seed=0,
        f5_gammas=(2.0, 4.0, 6.0),
        f5_R=1.0,
        f5_n_max=4096,
        f5_n_points=40,
        f5_masked_n_max=4096,
        f5_check_n=(4, 16, 64, 256, 1024),
        f7_n=12,
        f7_d=3,
        f7_inputs=6,
        f7_R_min=0.1,
        f7_R_max=1000.0,
        f7_R_points=81,
        mf_radii=tuple(float(r) for r in np.round(np.geomspace(0.5, 10.0, 16), 4)),
        mf_settings=("d1_pos", "d1_neg", "d2", "gauss"),
        a_atoms=(2, 3, 5),
        f6_atoms=(2, 3, 4, 5),
        restarts=16,
        steps=400,
        off_axis_restarts=16,
        off_axis_steps=400,
        curve_points=400,
    ),
}

#: Learning rate of the worst-measure and off-axis searches (library default).
_LR = 0.05
#: Relative residual tolerance of the Lanczos solver for the masked F5 points.
_F5_TOL = 1e-8


# ============================================================================ helpers


def _resolve(preset: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
    cfg = preset_config(PRESETS, preset, overrides, what=f"{NAME} option(s)")
    for k, v in overrides.items():
        cfg[k] = list(v) if isinstance(v, (tuple, list, np.ndarray)) else v
    bad = sorted(set(cfg["mf_settings"]) - set(MF_SETTINGS))
    if bad:
        raise ValueError(f"unknown mf_settings {bad}; choose from {sorted(MF_SETTINGS)}")
    if F6_SETTING not in cfg["mf_settings"]:
        raise ValueError(f"mf_settings must include {F6_SETTING!r} (the setting of figure F6)")
    if min(cfg["mf_radii"]) <= 0 or min(cfg["f5_gammas"]) <= 0 or cfg["f5_R"] <= 0:
        raise ValueError("radii and gaps must be positive")
    if cfg["f5_n_max"] < 2 or not cfg["f5_check_n"] or min(cfg["f5_check_n"]) < 2:
        raise ValueError("F5 needs n >= 2")
    if min(cfg["a_atoms"] + cfg["f6_atoms"]) < 2:
        raise ValueError("worst-measure searches need at least 2 atoms")
    if not 0 < cfg["f7_R_min"] < cfg["f7_R_max"]:
        raise ValueError("need 0 < f7_R_min < f7_R_max")
    return cfg


def _int_grid(lo: int, hi: int, k: int) -> np.ndarray:
    """Unique integers of a geometric grid from ``lo`` to ``hi`` (both included)."""
    return np.unique(np.round(np.geomspace(lo, hi, max(int(k), 2))).astype(np.int64))


def mf_setting(name: str, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    r"""Score and value matrices :math:`(A, V)` of a mean-field setting of :data:`MF_SETTINGS`.

    ``"gauss"``: :math:`A = Q^\top K/\sqrt k` with :math:`Q, K` standard Gaussian
    :math:`k\times d` (:math:`k = d = 3`) drawn by ``torch.Generator().manual_seed(seed)``, and
    :math:`V = I` (our reading of docs/experiments.md "a random Gaussian :math:`A/\sqrt k`").
    """
    if name == "d1_pos":
        return np.array([[1.0]]), np.eye(1)
    if name == "d1_neg":
        return np.array([[-1.0]]), np.eye(1)
    if name == "d2":
        return np.diag([1.0, -0.3]), np.eye(2)
    if name == "gauss":
        import torch

        g = torch.Generator().manual_seed(int(seed))
        k = d = 3
        Q = torch.randn(k, d, generator=g, dtype=torch.float64)
        K = torch.randn(k, d, generator=g, dtype=torch.float64)
        return (Q.T @ K / math.sqrt(k)).numpy(), np.eye(d)
    raise ValueError(f"unknown setting {name!r}; choose from {sorted(MF_SETTINGS)}")


def _params(A: np.ndarray, V: np.ndarray, device: str):
    import torch

    from meanfield import AttentionParams

    t = {"dtype": torch.float64, "device": device}
    return AttentionParams(torch.as_tensor(A, **t), torch.as_tensor(V, **t))


def _spec(A: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(A, dtype=np.float64), 2))


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
        not only the construction of docs/theory.md §6.3).
    n : array_like of int
        Sequence lengths, :math:`n \ge 1`.

    Returns
    -------
    numpy.ndarray
        :math:`\|Df(X)\|_2` for every :math:`n` (shape of ``n``), in float64.

    Notes
    -----
    Provenance: *derived and checked numerically* (ours): the reduction uses only the block
    formula of docs/theory.md §4.1 and the invariance of :math:`J` under permutations of identical
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
    o_a = np.outer(delta, ua)
    o_b = np.outer(delta, ub)
    o_d = np.outer(delta, Ad)
    s = (slice(None), None, None)
    B11 = pi[s] * eye + (pi * pi_c)[s] * (o_a + o_d)
    B12 = c12[s] * (eye - pi[s] * o_a)
    B21 = (sm * p)[s] * (eye + p_c[s] * o_b)
    B22 = p_c[s] * (eye - p[s] * o_b) + (p * p_c)[s] * o_d
    top = np.concatenate([V_ @ B11, V_ @ B12], axis=2)
    bottom = np.concatenate([V_ @ B21, V_ @ B22], axis=2)
    M = np.concatenate([top, bottom], axis=1)
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
    params = _params(A, V, device)
    seq = adversarial_sequence(params, point["R"], int(point["n"]), variant="released")
    est = local_lipschitz(seq.X, params, masked=bool(point["masked"]), tol=_F5_TOL)
    return {
        "value": float(est.value),
        "lower": float(est.lower),
        "upper": float(est.upper),
        "method": est.method,
        "upper_method": est.upper_method,
        "converged": bool(est.converged),
        "gamma_construction": seq.gamma,
        "case": seq.case,
        "a": seq.X[0].cpu().numpy(),
        "b": seq.X[min(1, seq.n - 1)].cpu().numpy(),
    }


def _run_f5(cfg: dict[str, Any], out: Path, device: str, progress: bool) -> list[Path]:
    R = float(cfg["f5_R"])
    gammas = np.asarray(cfg["f5_gammas"], dtype=np.float64)
    n_max = int(cfg["f5_n_max"])
    n_grid = _int_grid(2, n_max, cfg["f5_n_points"])
    n_all = np.arange(2, n_max + 1, dtype=np.int64)
    m_grid = n_grid[n_grid <= int(cfg["f5_masked_n_max"])]
    c_grid = np.asarray(sorted(set(int(c) for c in cfg["f5_check_n"])), dtype=np.int64)
    sweep = Sweep(
        out,
        "f5_engine",
        {"R": R, "head": "d = 1, A = -gamma/(2 R^2), V = 1", "variant": "released", "tol": _F5_TOL},
        seed=int(cfg["seed"]),
        device=device,
        dtype="float64",
    )
    points = [
        {"gamma": float(g), "R": R, "n": int(n), "masked": True} for g in gammas for n in m_grid
    ] + [{"gamma": float(g), "R": R, "n": int(n), "masked": False} for g in gammas for n in c_grid]
    recs = sweep.run(points, lambda p: _f5_point(p, device), progress=progress, desc="F5 engine")
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
    keys = (
        "closed_all",
        "closed_grid",
        "lower_formula",
        "masked_lower_formula",
        "k_copy_lower",
        "upper_triangle",
        "upper_sqrt3",
    )
    out_arr = {k: [] for k in keys}
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
        a_norm, v_norm = _spec(A), _spec(V)
        # construction positions: the same as the engine's (released variant, case -)
        a, b = -R * np.ones(1), R * np.ones(1)
        rec0 = by.get((float(g), int(c_grid[0]), False))
        if rec0 is not None:
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
            eng["masked_value"][gi, j] = r["value"]
            eng["masked_lower"][gi, j] = r["lower"]
            eng["masked_upper"][gi, j] = r["upper"]
        for j, n in enumerate(c_grid):
            r = by[(float(g), int(n), False)]
            chk["check_value"][gi, j] = r["value"]
            chk["check_lower"][gi, j] = r["lower"]
            chk["check_upper"][gi, j] = r["upper"]
            chk["check_closed"][gi, j] = construction_norm(A, V, r["a"], r["b"], int(n))
    arrays.update({k: np.stack(v) for k, v in out_arr.items()})
    arrays.update(eng)
    arrays.update(chk)
    arrays.update(scal)
    findings = _f5_findings(arrays)
    doc = {
        "kind": "synthetic/f5",
        "figure": STEMS["f5"],
        "head": "d = 1, A = -gamma/(2 R^2), V = 1 (released construction, case -: x_1 = -R u, "
        "copies at R u, gap exactly gamma)",
        "provenance": {
            "construction": "authors' released code (docs/theory.md §6.3)",
            "closed_form": "derived and checked numerically (ours; experiments.synthetic)",
            "lower_formula": "docs/theory.md §6.3, derived and checked numerically",
            "masked_lower_formula": "docs/theory.md §9, derived and checked numerically",
            "k_copy_lower": "theory.bounds.sequence_lower, ours",
            "upper_triangle": "docs/theory.md §6.1 triangle form (ours)",
            "upper_sqrt3": "docs/theory.md §6.1 sqrt3 form (recollection, unverified, of the paper's)",
            "mf_upper_c1": "docs/theory.md §7.1 candidate c' = 1 (derived; not the paper's constant)",
        },
        "findings": findings,
        "metadata": run_metadata(
            seed=int(cfg["seed"]),
            device=device,
            dtype="float64",
            config={"preset_entries": _subset(cfg, "f5_")},
        ),
    }
    return [save_npz(out / "f5.npz", **arrays), write_json(out / "f5.json", doc)]


def _f5_findings(d: Mapping[str, np.ndarray]) -> dict[str, Any]:
    per = []
    for gi, g in enumerate(d["gammas"]):
        closed = d["closed_all"][gi]
        n_all = d["n_all"]
        k = int(np.argmax(closed))
        n_peak = int(n_all[k])
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


# ============================================================================ F6 and A
def _catalog(seed: int) -> dict[str, dict[str, Any]]:
    out = {}
    for name in MF_SETTINGS:
        A, V = mf_setting(name, seed=seed)
        out[name] = {"A": A, "V": V}
    return out


def _padded_measure(points: np.ndarray, log_weights: np.ndarray, n_atoms: int, device: str):
    """The given measure written with ``n_atoms`` atoms.

    The lightest atom is split into coincident copies (log-shares 0, -3 log 10, -6 log 10, ...),
    as in the library's own construction starts; the measure is unchanged.
    """
    import torch

    from meanfield import DiracMeasure

    order = np.argsort(log_weights)
    pts, lw = np.asarray(points, dtype=np.float64)[order], np.asarray(log_weights)[order]
    extra = n_atoms - len(lw)
    if extra < 0:
        raise ValueError(f"cannot pad {len(lw)} atoms down to {n_atoms}")
    if extra:
        shares = -3.0 * math.log(10.0) * np.arange(extra + 1)
        shares = shares - special.logsumexp(shares)
        pts = np.concatenate([np.repeat(pts[:1], extra + 1, axis=0), pts[1:]])
        lw = np.concatenate([lw[0] + shares, lw[1:]])
    t = {"dtype": torch.float64, "device": device}
    return DiracMeasure.from_log_weights(torch.as_tensor(pts, **t), torch.as_tensor(lw, **t))


def _worst_point(
    point: Mapping[str, Any], cfg: Mapping[str, Any], off_axis: Mapping[str, Any], device: str
) -> dict[str, Any]:
    """One multi-start worst-measure search (docs/theory.md §7.4).

    Starts: the library's constructions (two Diracs at the exact optimal mass, balanced atom,
    three-atom chain), ``restarts`` random measures, and the maximised off-axis two-atom measure
    of §7.3 at the same radius (``off_axis``), padded to ``n_atoms`` atoms.
    """
    from meanfield.attacks import worst_case_measure

    A, V = mf_setting(point["setting"], seed=int(cfg["seed"]))
    init = _padded_measure(
        off_axis["measure_points"], off_axis["measure_log_weights"], int(point["n_atoms"]), device
    )
    res = worst_case_measure(
        _params(A, V, device),
        float(point["R"]),
        int(point["n_atoms"]),
        n_restarts=int(cfg["restarts"]),
        steps=int(cfg["steps"]),
        lr=_LR,
        seed=int(cfg["seed"]),
        init=init,
    )
    k = int(np.nanargmax(res.restart_values.cpu().numpy()))
    return {
        "value": res.value,
        "lower": res.lower,
        "upper": res.upper,
        "bracket": res.bracket,
        "construction_value": res.construction_value,
        "two_dirac_bound": res.two_dirac_bound,
        "best_start": res.labels[k],
        "points": res.measure.points.cpu().numpy(),
        "log_weights": res.measure.log_weights.cpu().numpy(),
    }


def _off_axis_point(point: Mapping[str, Any], cfg: Mapping[str, Any], device: str) -> dict:
    """Maximised off-axis two-atom bound (docs/theory.md §7.3) for one setting and radius."""
    from meanfield.attacks import off_axis_two_atoms

    A, V = mf_setting(point["setting"], seed=int(cfg["seed"]))
    res = off_axis_two_atoms(
        _params(A, V, device),
        float(point["R"]),
        n_restarts=int(cfg["off_axis_restarts"]),
        steps=int(cfg["off_axis_steps"]),
        lr=_LR,
        seed=int(cfg["seed"]),
    )
    return {
        "value": res.value,
        "log_value": res.log_value,
        "axis_value": res.axis_value,
        "x": res.x.cpu().numpy(),
        "y": res.y.cpu().numpy(),
        "h": res.h.cpu().numpy(),
        "w": res.w,
        "s": res.s,
        "measure_points": res.measure.points.cpu().numpy(),
        "measure_log_weights": res.measure.log_weights.cpu().numpy(),
    }


def _mf_curves(A: np.ndarray, V: np.ndarray, R: np.ndarray) -> dict[str, np.ndarray]:
    r"""Closed-form mean-field curves of docs/theory.md §7.1–§7.2 on a radius grid.

    The two-Dirac curves use, at each R, the case (+ or −) whose :math:`\sup_\varepsilon g\,\|Vu\|`
    is larger (best gap, errata of docs/theory.md §13.1).
    """
    ext = bounds.rayleigh_extremes(A, variant="symmetric")
    R = np.asarray(R, dtype=np.float64)
    cases = []
    if ext.lam_max > 0:
        cases.append((ext.lam_max * R**2 / 4.0, float(np.linalg.norm(V @ ext.u_max))))
    if ext.lam_min < 0:
        cases.append((-2.0 * ext.lam_min * R**2, float(np.linalg.norm(V @ ext.u_min))))
    a_norm, v_norm = _spec(A), _spec(V)
    if cases:
        sup = np.stack([bounds.two_dirac_lower(g, vu) for g, vu in cases])
        best = np.argmax(sup, axis=0)
        pick = lambda arr: np.take_along_axis(arr, best[None], 0)[0]  # noqa: E731
        gam = pick(np.stack([g for g, _ in cases]))
        sup_g = pick(sup)
        half = pick(np.stack([bounds.two_dirac_half(g, vu) for g, vu in cases]))
        asym = pick(np.stack([bounds.two_dirac_asymptote(g, vu) for g, vu in cases]))
    else:  # A = 0: no gap
        gam = sup_g = half = asym = np.zeros_like(R)
    return {
        "gamma_star": gam,
        "sup_g": sup_g,
        "half": half,
        "asymptote": asym,
        "trivial": np.full_like(R, v_norm),
        "global_lower": np.maximum(v_norm, sup_g),
        "upper_c1": bounds.mean_field_upper(a_norm, v_norm, R, c=1.0),
        "upper_c2": bounds.mean_field_upper(a_norm, v_norm, R, c=2.0),
    }


def _run_mean_field(cfg: dict[str, Any], out: Path, device: str, progress: bool) -> list[Path]:
    seed = int(cfg["seed"])
    radii = np.asarray(sorted(float(r) for r in cfg["mf_radii"]), dtype=np.float64)
    catalog = _catalog(seed)
    off_cfg = {
        "restarts": int(cfg["off_axis_restarts"]),
        "steps": int(cfg["off_axis_steps"]),
        "lr": _LR,
        "seed": seed,
        "catalog": catalog,
    }
    off = Sweep(out, "off_axis", off_cfg, seed=seed, device=device, dtype="float64")
    orecs = off.run(
        [{"setting": s, "R": float(R)} for s in cfg["mf_settings"] for R in radii],
        lambda p: _off_axis_point(p, cfg, device),
        progress=progress,
        desc="off-axis",
    )
    oa = {(r["point"]["setting"], r["point"]["R"]): r for r in orecs}
    sweep = Sweep(
        out,
        "worst_measures",
        {
            "restarts": int(cfg["restarts"]),
            "steps": int(cfg["steps"]),
            "lr": _LR,
            "seed": seed,
            "catalog": catalog,
            "init": {"off_axis": off_cfg},
        },
        seed=seed,
        device=device,
        dtype="float64",
    )
    a_atoms = sorted(set(int(k) for k in cfg["a_atoms"]))
    f6_atoms = sorted(set(int(k) for k in cfg["f6_atoms"]))
    pts = []
    for s in cfg["mf_settings"]:
        atoms = sorted(set(a_atoms) | (set(f6_atoms) if s == F6_SETTING else set()))
        pts += [{"setting": s, "R": float(R), "n_atoms": k} for R in radii for k in atoms]
    recs = sweep.run(
        pts,
        lambda p: _worst_point(p, cfg, oa[(p["setting"], p["R"])], device),
        progress=progress,
        desc="worst measures",
    )
    wc = {(r["point"]["setting"], r["point"]["R"], r["point"]["n_atoms"]): r for r in recs}
    curve_R = np.geomspace(min(radii.min(), 0.5), max(radii.max(), 10.0), int(cfg["curve_points"]))

    def block(setting: str, atoms: Sequence[int]) -> dict[str, np.ndarray]:
        A, V = catalog[setting]["A"], catalog[setting]["V"]
        arr: dict[str, np.ndarray] = {"A": A, "V": V, "atoms": np.asarray(atoms, dtype=np.int64)}
        for k, v in _mf_curves(A, V, curve_R).items():
            arr[f"curve_{k}"] = v
        for k, v in _mf_curves(A, V, radii).items():
            arr[f"at_radii_{k}"] = v
        for key in ("value", "lower", "upper", "construction_value"):
            arr[f"opt_{key}"] = np.asarray(
                [[wc[(setting, float(R), k)][key] for R in radii] for k in atoms], dtype=np.float64
            )
        arr["off_axis_value"] = np.asarray(
            [oa[(setting, float(R))]["value"] for R in radii], dtype=np.float64
        )
        arr["off_axis_axis_value"] = np.asarray(
            [oa[(setting, float(R))]["axis_value"] for R in radii], dtype=np.float64
        )
        arr["off_axis_x"] = np.stack([np.asarray(oa[(setting, float(R))]["x"]) for R in radii])
        arr["off_axis_y"] = np.stack([np.asarray(oa[(setting, float(R))]["y"]) for R in radii])
        arr["off_axis_w"] = np.asarray([oa[(setting, float(R))]["w"] for R in radii])
        arr["off_axis_s"] = np.asarray([oa[(setting, float(R))]["s"] for R in radii])
        arr["opt_two_dirac_bound"] = np.asarray(
            [
                [
                    np.nan
                    if wc[(setting, float(R), k)]["two_dirac_bound"] is None
                    else wc[(setting, float(R), k)]["two_dirac_bound"]
                    for R in radii
                ]
                for k in atoms
            ],
            dtype=np.float64,
        )
        return arr

    files: list[Path] = []
    # ---- F6: setting d2, atoms f6_atoms, off-axis
    f6 = {"radii": radii, "curve_R": curve_R, **block(F6_SETTING, f6_atoms)}
    f6_find = _mf_findings(f6, radii)
    meta = run_metadata(
        seed=seed,
        device=device,
        dtype="float64",
        config={
            "preset_entries": _subset(
                cfg, "mf_", "restarts", "steps", "off_axis_", "a_atoms", "f6_atoms", "curve_points"
            )
        },
    )
    files.append(save_npz(out / "f6.npz", **f6))
    files.append(
        write_json(
            out / "f6.json",
            {
                "kind": "synthetic/f6",
                "figure": STEMS["f6"],
                "setting": MF_SETTINGS[F6_SETTING],
                "provenance": _MF_PROVENANCE,
                "findings": f6_find,
                "metadata": meta,
            },
        )
    )
    # ---- A: every setting, atoms a_atoms
    a_arr: dict[str, Any] = {
        "radii": radii,
        "curve_R": curve_R,
        "settings": np.asarray(cfg["mf_settings"], dtype=str),
    }
    a_find = {}
    labels = {}
    for s in cfg["mf_settings"]:
        blk = block(s, a_atoms)
        a_arr.update({f"{s}__{k}": v for k, v in blk.items()})
        a_find[s] = _mf_findings(blk, radii)
        labels[s] = MF_SETTINGS[s].format(seed=seed)
    files.append(save_npz(out / "a.npz", **a_arr))
    files.append(
        write_json(
            out / "a.json",
            {
                "kind": "synthetic/a",
                "figure": STEMS["a"],
                "settings": labels,
                "provenance": _MF_PROVENANCE,
                "findings": a_find,
                "metadata": meta,
            },
        )
    )
    return files


_MF_PROVENANCE = {
    "sup_g": "docs/theory.md §7.2 two-Dirac optimum at the best gap, derived and checked numerically",
    "half": "docs/theory.md §7.2 w = 1/2 form (that the paper states such a form: recollection, "
    "unverified)",
    "asymptote": "docs/theory.md §7.2 (3√3/16) γ e^{γ/2}, derived",
    "upper_c1": "docs/theory.md §7.1 sharp form, c' = 1: candidate (derived, reconstructed; NOT the "
    "paper's constant)",
    "upper_c2": "docs/theory.md §7.1 sharp form, c' = 2: candidate (derived, naive route)",
    "optimized": "meanfield.attacks.worst_case_measure: exact W2 local constant (docs/theory.md §5.2) "
    "maximised by multi-start Adam; certified bracket by local_lipschitz",
    "off_axis": "docs/theory.md §7.3 maximised (ours; not in any source)",
}


def _mf_findings(arr: Mapping[str, np.ndarray], radii: np.ndarray) -> dict[str, Any]:
    atoms = [int(k) for k in arr["atoms"]]
    val, low = arr["opt_value"], arr["opt_lower"]
    sup = arr["at_radii_sup_g"]
    best = val.max(axis=0)
    kbest = np.asarray(atoms)[val.argmax(axis=0)]
    gain = best / sup
    glob = arr["at_radii_global_lower"]
    find: dict[str, Any] = {
        "radii": radii.tolist(),
        "best_optimized": best.tolist(),
        "best_atoms": kbest.tolist(),
        "sup_g": sup.tolist(),
        "min_ratio_optimized_to_sup_g": float((val / sup).min()),
        "max_gain_over_two_dirac": float(gain.max()),
        "R_of_max_gain": float(radii[int(gain.argmax())]),
        "gain_at_largest_R": float(gain[-1]),
        "ratio_to_global_lower_at_smallest_R": float(best[0] / glob[0]),
        "per_atoms_at_largest_R": {str(k): float(val[i, -1]) for i, k in enumerate(atoms)},
    }
    oa = arr["off_axis_value"] / sup
    find["off_axis"] = {
        "values": arr["off_axis_value"].tolist(),
        "max_gain_over_axis": float(oa.max()),
        "R_of_max_gain": float(radii[int(oa.argmax())]),
        "max_ratio_to_best_optimized": float(np.max(arr["off_axis_value"] / best)),
        "gap_over_gamma_star_at_largest_R": float(
            arr["off_axis_s"][-1] / arr["at_radii_gamma_star"][-1]
        )
        if arr["at_radii_gamma_star"][-1] > 0
        else float("nan"),
    }
    for c in ("c1", "c2"):
        up = arr[f"at_radii_upper_{c}"]
        ratio = val / up
        i, j = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
        find[f"max_ratio_to_upper_{c}"] = float(ratio.max())
        find[f"argmax_ratio_to_upper_{c}"] = {"R": float(radii[j]), "n_atoms": atoms[i]}
        find[f"upper_{c}_exceeded"] = int((val > up).sum())
        find[f"upper_{c}_exceeded_certified"] = int((low > up).sum())
    return find


def _subset(cfg: Mapping[str, Any], *prefixes: str) -> dict[str, Any]:
    return {k: v for k, v in cfg.items() if k == "seed" or any(k.startswith(p) for p in prefixes)}


# ============================================================================ F7
def _f7_problem(cfg: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    r"""Random head and inputs of F7.

    :math:`A = Q^\top K/\sqrt d` and :math:`V` with Gaussian entries over :math:`\sqrt d`; rows of
    :math:`X` Gaussian, scaled so that :math:`\max_i\|x_i\| = 1`; inputs with a near-tied arg max
    (logit margin below 1e-3, masked or not) are redrawn.
    """
    import torch

    n, d, seed = int(cfg["f7_n"]), int(cfg["f7_d"]), int(cfg["seed"])
    g = torch.Generator().manual_seed(7_000 + seed)
    Q = torch.randn(d, d, generator=g, dtype=torch.float64)
    K = torch.randn(d, d, generator=g, dtype=torch.float64)
    A = (Q.T @ K / math.sqrt(d)).numpy()
    V = (torch.randn(d, d, generator=g, dtype=torch.float64) / math.sqrt(d)).numpy()
    X = []
    while len(X) < int(cfg["f7_inputs"]):
        x = torch.randn(n, d, generator=g, dtype=torch.float64).numpy()
        x = x / np.linalg.norm(x, axis=1).max()
        if min(bounds.selection_gap(x, A), bounds.selection_gap(x, A, masked=True)) > 1e-3:
            X.append(x)
    return A, V, X


def _f7_point(point: Mapping[str, Any], A, V, X, R: np.ndarray, device: str) -> dict[str, Any]:
    """Dense certified ||Df(RX)||_2 for every R of the grid (one batched call)."""
    import torch

    from meanfield import local_lipschitz

    x = torch.as_tensor(X[int(point["input"])], dtype=torch.float64, device=device)
    Rt = torch.as_tensor(R, dtype=torch.float64, device=device)
    est = local_lipschitz(
        Rt[:, None, None] * x, _params(A, V, device), masked=bool(point["masked"]), method="dense"
    )
    return {
        "value": est.value.cpu().numpy(),
        "lower": est.lower.cpu().numpy(),
        "upper": est.upper.cpu().numpy(),
    }


def _settled_radius(R: np.ndarray, rel_err: np.ndarray, tol: float) -> float:
    """Smallest grid radius from which the relative error stays below ``tol`` (nan if never)."""
    tail_ok = np.flip(np.cumprod(np.flip(rel_err <= tol))).astype(bool)
    return float(R[int(np.argmax(tail_ok))]) if tail_ok.any() else float("nan")


def _run_f7(cfg: dict[str, Any], out: Path, device: str, progress: bool) -> list[Path]:
    A, V, X = _f7_problem(cfg)
    R = np.geomspace(float(cfg["f7_R_min"]), float(cfg["f7_R_max"]), int(cfg["f7_R_points"]))
    sweep = Sweep(
        out,
        "f7",
        {"A": A, "V": V, "X": X, "R": R},
        seed=int(cfg["seed"]),
        device=device,
        dtype="float64",
    )
    pts = [{"input": k, "masked": m} for m in (False, True) for k in range(len(X))]
    recs = sweep.run(pts, lambda p: _f7_point(p, A, V, X, R, device), progress=progress, desc="F7")
    by = {(r["point"]["input"], r["point"]["masked"]): r for r in recs}
    n = int(cfg["f7_n"])
    a_norm, v_norm = _spec(A), _spec(V)
    arrays: dict[str, Any] = {
        "R": R,
        "A": A,
        "V": V,
        "X": np.stack(X),
        "n": np.int64(n),
        "A_norm": np.float64(a_norm),
        "V_norm": np.float64(v_norm),
        "sqrt_n_ref": np.float64(math.sqrt(n) * v_norm),
    }
    find: dict[str, Any] = {}
    for m, tag in ((False, "unmasked"), (True, "masked")):
        vals = np.stack([np.asarray(by[(k, m)]["value"]) for k in range(len(X))])
        low = np.stack([np.asarray(by[(k, m)]["lower"]) for k in range(len(X))])
        up = np.stack([np.asarray(by[(k, m)]["upper"]) for k in range(len(X))])
        counts = np.stack([bounds.large_radius_counts(x, A, masked=m) for x in X])
        limit = np.asarray(bounds.large_radius_limit(counts, v_norm))
        gaps = np.asarray([bounds.selection_gap(x, A, masked=m) for x in X])
        dev = np.stack(
            [bounds.large_radius_deviation(R**2 * gp, n, a_norm, v_norm, R) for gp in gaps]
        )
        err = np.abs(vals - limit[:, None])
        arrays.update(
            {
                f"{tag}_value": vals,
                f"{tag}_lower": low,
                f"{tag}_upper": up,
                f"{tag}_counts": counts,
                f"{tag}_limit": limit,
                f"{tag}_gap": gaps,
                f"{tag}_deviation_bound": dev,
            }
        )
        find[tag] = {
            "max_N": counts.max(axis=1).tolist(),
            "limit": limit.tolist(),
            "value_at_R_max": vals[:, -1].tolist(),
            "max_rel_error_at_R_max": float((err[:, -1] / limit).max()),
            "deviation_bound_holds": bool(np.all(err <= dev * (1 + 1e-9) + 1e-12)),
            "max_value_over_R": vals.max(axis=1).tolist(),
            "R_within_1pct": [_settled_radius(R, err[k] / limit[k], 1e-2) for k in range(len(X))],
        }
    doc = {
        "kind": "synthetic/f7",
        "figure": STEMS["f7"],
        "head": f"d = {cfg['f7_d']}, A = QᵀK/√d, V Gaussian/√d, seed {7000 + int(cfg['seed'])}",
        "inputs": f"{len(X)} Gaussian X with n = {n}, rows scaled to max norm 1",
        "provenance": {
            "limit": "docs/theory.md §8, derived and checked numerically",
            "deviation_bound": "theory.bounds.large_radius_deviation (ours)",
        },
        "findings": find,
        "metadata": run_metadata(
            seed=int(cfg["seed"]),
            device=device,
            dtype="float64",
            config={"preset_entries": _subset(cfg, "f7_")},
        ),
    }
    return [save_npz(out / "f7.npz", **arrays), write_json(out / "f7.json", doc)]


# ============================================================================ contract
def run(
    results_dir: Path,
    preset: str = "quick",
    *,
    device: str = "cpu",
    progress: bool = True,
    **overrides: Any,
) -> list[Path]:
    """Run the synthetic sweeps of F5, F6, F7 and A and write them under ``results_dir/synthetic``.

    Parameters
    ----------
    results_dir : path
        Root results directory.
    preset : {"tiny", "quick", "paper"}
        Grids and optimiser budgets (:data:`PRESETS`).
    device : str
        Torch device of the engine and the searches (``"cpu"`` or ``"cuda"``).
    progress : bool
        Progress bars (tqdm, via :class:`~experiments.runner.Sweep`).
    **overrides
        Replace preset entries (unknown keys raise ``ValueError``).

    Returns
    -------
    list of Path
        Files written (Sweep records and metadata, and the assembled ``f5``, ``f6``, ``f7`` and
        ``a`` sub-results). Per-point work is resumable: a rerun recomputes nothing finished.
    """
    cfg = _resolve(preset, overrides)
    out = Path(results_dir) / NAME
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    files: list[Path] = []
    timings = {}
    with torch_threads(1):
        for key, fn in (("f5", _run_f5), ("f7", _run_f7), ("mean_field", _run_mean_field)):
            t = time.perf_counter()
            files += fn(cfg, out, device, progress)
            timings[key] = time.perf_counter() - t
    sweeps = [
        out / f"{s}.{e}"
        for s in ("f5_engine", "worst_measures", "off_axis", "f7")
        for e in ("jsonl", "meta.json")
    ]
    files += [p for p in sweeps if p.exists()]
    files.append(
        write_json(
            out / "run.json",
            {
                "preset": preset,
                "overrides": dict(overrides),
                "config": cfg,
                "seconds": time.perf_counter() - t0,
                "seconds_by_part": timings,
                "metadata": run_metadata(
                    seed=int(cfg["seed"]), device=device, dtype="float64", config=cfg
                ),
            },
        )
    )
    log.info("synthetic (%s) done in %.1f s", preset, time.perf_counter() - t0)
    return files


def _load(results_dir: Path, part: str) -> dict[str, Any]:
    p = Path(results_dir) / NAME / f"{part}.json"
    if not p.exists():
        raise FileNotFoundError(f"{p} not found: run the 'synthetic' experiment first")
    return load_json(p)


def summary(results_dir: Path) -> dict[str, Any]:
    """Key numbers of F5, F6, F7 and A, read from the saved results (JSON-able)."""
    out: dict[str, Any] = {}
    for part in ("f5", "f6", "f7", "a"):
        out[part] = _load(results_dir, part)["findings"]
    run_doc = Path(results_dir) / NAME / "run.json"
    if run_doc.exists():
        r = load_json(run_doc)
        out["preset"] = r["preset"]
        out["seconds"] = r["seconds"]
    return out


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def report_section(results_dir: Path, figures_dir: Path) -> str:
    """Markdown section for ``report.md``: what each figure shows, key numbers, figure links."""
    s = summary(results_dir)
    report_dir = Path(figures_dir).parent

    def link(part: str) -> str:
        stem = STEMS[part]
        rel = os.path.relpath(Path(figures_dir) / f"{stem}.png", report_dir)
        return f"![{stem}]({Path(rel).as_posix()})"

    lines = ["## Synthetic theory sweeps (F5, F6, F7, A)", ""]
    # F5
    lines += [
        "**F5: the √n regime** on the eigenvector construction (docs/theory.md §3; d = 1, "
        "A = −γ/(2R²), V = 1, R = 1, gap exactly γ). Unmasked values are exact (closed-form "
        "reduction of the Jacobian, cross-checked against certified engine brackets); masked "
        "values are certified engine brackets.",
        "",
        "| γ | e^γ | peak n (measured) | peak n (lower-bound formula) | peak value | sup_ε g "
        "| value at n_max / peak | masked at its n_max | masked limit formula "
        "| max value / √n bound | engine check rel. diff |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in s["f5"]["per_gamma"]:
        lines.append(
            f"| {e['gamma']:g} | {_fmt(e['e_gamma'])} | {e['unmasked_peak_n']} | "
            f"{e['peak_n_lower_formula']:.0f} | {_fmt(e['unmasked_peak_value'])} | "
            f"{_fmt(e['sup_g'])} | {_fmt(e['decay_at_n_max'])} | "
            f"{_fmt(e.get('masked_at_n_max', float('nan')))} (n = {e.get('masked_n_max', '–')}) | "
            f"{_fmt(e.get('masked_limit_formula', float('nan')))} | "
            f"{_fmt(e['max_ratio_to_upper_triangle'])} | {e['check_max_rel_diff']:.1e} |"
        )
    per = s["f5"]["per_gamma"]
    t_peak = [e["peak_over_e_gamma"] for e in per]
    ok_low = all(e["min_ratio_to_lower_formula"] >= 1 - 1e-12 for e in per)
    ok_up = all(e["max_ratio_to_upper_triangle"] <= 1 for e in per)
    ok_chk = all(e["check_closed_inside_brackets"] for e in per)
    mono = [e.get("masked_monotone") for e in per if "masked_monotone" in e]
    lines += [
        "",
        f"The exact unmasked constant peaks at n − 1 = {min(t_peak):.2f}–{max(t_peak):.2f} × e^γ "
        f"(the lower-bound formula peaks at t*(γ)e^γ, t* → 3) and then decays (to "
        f"{', '.join(_fmt(e['decay_at_n_max']) for e in per)} of its peak at n_max); it stays "
        f"{'above' if ok_low else 'NOT always above'} the §3 lower-bound formula and "
        f"{'below' if ok_up else 'NOT always below'} the §1 √n bound (triangle form), and the "
        f"closed form {'lies' if ok_chk else 'does NOT always lie'} inside every certified engine "
        f"bracket. Masked values increase with n on the whole grid: "
        f"{'yes' if mono and all(mono) else 'no'} (saturation of docs/theory.md §4, reached only for "
        "n ≫ e^γ; see the limit column).",
        "",
        link("f5"),
        "",
    ]
    # F6
    f6 = s["f6"]
    lines += [
        "**F6: the mean-field regime** (docs/theory.md §5–§6; d = 2, A = diag(1, −0.3), V = I). "
        "sup_ε g against R with the w = ½ form, the asymptote, ‖V‖₂, the *candidate* upper "
        "bounds c′ = 1, 2 (reconstructed constants, not the paper's), optimized 2–5-atom "
        "measures and the off-axis two-atom bound (§A3).",
        "",
        f"- Optimized measures reach up to {_fmt(f6['max_gain_over_two_dirac'])}× sup_ε g "
        f"(at R = {f6['R_of_max_gain']:g}) and {_fmt(f6['gain_at_largest_R'])}× at the largest "
        f"R; smallest ratio to it: {_fmt(f6['min_ratio_optimized_to_sup_g'])}.",
        f"- Off-axis two atoms (§A3): up to {_fmt(f6['off_axis']['max_gain_over_axis'])}× the "
        f"on-axis optimum (R = {f6['off_axis']['R_of_max_gain']:g}).",
        f"- Candidate c′ = 1: largest optimized/bound ratio {_fmt(f6['max_ratio_to_upper_c1'])} "
        f"({f6['upper_c1_exceeded']} exceedances, {f6['upper_c1_exceeded_certified']} certified); "
        f"c′ = 2: {_fmt(f6['max_ratio_to_upper_c2'])} ({f6['upper_c2_exceeded']} exceedances).",
        "",
        link("f6"),
        "",
    ]
    # F7
    f7 = s["f7"]
    lines += [
        "**F7: large radius** (docs/theory.md §7). ‖Df(RX)‖₂ for random X converges to "
        "‖V‖₂√(max_j N_j), not to √n‖V‖₂; the deviation from the limit stays below our "
        "quantitative bound.",
        "",
        "| map | max_j N_j per input | max rel. error at largest R | deviation bound holds |",
        "|---|---|---|---|",
    ]
    for tag in ("unmasked", "masked"):
        e = f7[tag]
        lines.append(
            f"| {tag} | {', '.join(str(v) for v in e['max_N'])} | "
            f"{e['max_rel_error_at_R_max']:.1e} | {'yes' if e['deviation_bound_holds'] else 'NO'} |"
        )
    lines += ["", link("f7"), ""]
    # A
    lines += [
        "**A: Lipschitz constant against R** (v1 style, docs/theory.md §5–§6): for each setting, the "
        "best optimized measure against sup_ε g and the candidate upper bounds.",
        "",
        "| setting | max gain over sup_ε g (R) | gain at largest R | off-axis / sup_ε g (max) "
        "| off-axis gap / γ* (largest R) "
        "| optimized / c′=1 bound (max) | c′=1 exceeded | optimized / c′=2 bound (max) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    a_json = _load(results_dir, "a")
    big = []
    for key, e in s["a"].items():
        label = a_json["settings"].get(key, key)
        gap_ratio = e["off_axis"].get("gap_over_gamma_star_at_largest_R", float("nan"))
        lines.append(
            f"| {label} | {_fmt(e['max_gain_over_two_dirac'])} ({e['R_of_max_gain']:g}) | "
            f"{_fmt(e['gain_at_largest_R'])} | {_fmt(e['off_axis']['max_gain_over_axis'])} | "
            f"{_fmt(gap_ratio)} | {_fmt(e['max_ratio_to_upper_c1'])} | "
            f"{e['upper_c1_exceeded']} | {_fmt(e['max_ratio_to_upper_c2'])} |"
        )
        if e["max_gain_over_two_dirac"] > 100.0 and e["off_axis"]["max_gain_over_axis"] > 100.0:
            big.append((label, e, gap_ratio))
    lines += [
        "",
        "A gain above 1 means the optimized measures beat the closed-form two-Dirac optimum at "
        "the best on-axis gap γ* (docs/theory.md §5); a ratio above 1 to a c′ bound would mean "
        "that reconstructed candidate is violated.",
    ]
    for label, e, gap_ratio in big:
        lines += [
            "",
            f"*Why the gain reaches {_fmt(e['max_gain_over_two_dirac'])} for {label}.* It is "
            "neither a search artefact nor a violation: the off-axis two-atom closed form "
            "(docs/theory.md §A3) reaches the same value, "
            f"{_fmt(e['off_axis']['max_gain_over_axis'])}× the reference. The reference two-Dirac "
            "optimum puts both atoms on an eigenvector of the symmetric part of A, which is the "
            "best choice only for a symmetric A; this A is far from symmetric, and two atoms off "
            f"those axes see a score gap {_fmt(gap_ratio)}× larger at the largest R. The constant "
            "grows like γ·e^{γ/2} in the gap γ, and γ grows like R², so a gap larger by a fixed "
            "factor gives a gain that grows like exp(c·R²); the reference is a weak lower bound "
            "for a non-symmetric A, and the off-axis and optimized values are the ones to read.",
        ]
    lines += [
        "",
        link("a"),
        "",
    ]
    return "\n".join(lines)


#: The stage (experiments/stage.py contract).
STAGE = ModuleStage(
    name=NAME,
    title="Synthetic theory sweeps",
    presets=PRESETS,
    run_fn=run,
    summary_fn=summary,
    report_fn=report_section,
)
